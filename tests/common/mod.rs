//! End-to-end harness: the real `astraeus` binary as child processes (server, agents, dev mode),
//! each killed when its guard drops, and one helper per endpoint the tests call.

#![allow(dead_code)]

use std::fs::File;
use std::future::Future;
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::Value;
use sqlx::PgPool;
use tempfile::TempDir;

pub use serde_json::json;

#[path = "../images/mod.rs"]
pub mod images;

/// The registries file that sends docker.io to the tests' own registry (tests/images).
pub fn registries_conf() -> &'static Path {
    &images::images().registries_conf
}

/// How long any wait in these tests may take before it fails.
pub const PATIENCE: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(100);
/// Verbose enough that a secret printed anywhere in the children's logs would show.
const CHILD_LOG_FILTER: &str = "debug,hyper=info,hyper_util=info,h2=info,reqwest=info,tower=info";

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_astraeus")
}

/// A port that was free a moment ago on 127.0.0.1.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A temporary folder that other users (postgres, a worker) can traverse.
pub fn open_tempdir() -> TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

/// Polls `check` every 100 ms until it gives `Ok`, for at most 30 s. `Err` carries what was
/// last seen, for the failure message.
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + PATIENCE;
    loop {
        match check().await {
            Ok(value) => return value,
            Err(seen) if Instant::now() >= deadline => {
                panic!("{what}: not within {}s; last seen: {seen}", PATIENCE.as_secs())
            }
            Err(_) => tokio::time::sleep(POLL).await,
        }
    }
}

/// The command lines of the host's processes, arguments joined by spaces.
pub fn command_lines() -> Vec<String> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return vec![] };
    entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().bytes().all(|b| b.is_ascii_digit()))
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .filter(|c| !c.is_empty())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " ").trim_end().to_owned())
        .collect()
}

/// Whether any process on the host has `needle` in its command line.
pub fn process_running(needle: &str) -> bool {
    command_lines().iter().any(|c| c.contains(needle))
}

/// A child process, killed (and reaped) when dropped, its stdout and stderr in `log`.
pub struct Proc {
    pub name: String,
    child: Child,
    pub log: PathBuf,
    exited: Option<ExitStatus>,
}

impl Proc {
    pub fn spawn(name: &str, cmd: &mut Command, log: PathBuf) -> Proc {
        let out = File::create(&log).unwrap();
        let err = out.try_clone().unwrap();
        let child = cmd
            .env("RUST_LOG", CHILD_LOG_FILTER)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        Proc { name: name.to_owned(), child, log, exited: None }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends a signal by name (`INT`, `KILL`) with kill(1).
    pub fn signal(&self, signal: &str) {
        let status =
            Command::new("kill").arg(format!("-{signal}")).arg(self.pid().to_string()).status().unwrap();
        assert!(status.success(), "kill -{signal} {} ({}) failed", self.pid(), self.name);
    }

    /// The exit status, once the process has ended.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        if self.exited.is_none() {
            self.exited = self.child.try_wait().unwrap();
        }
        self.exited
    }

    /// Waits up to 30 s for the process to end.
    pub async fn wait_exit(&mut self) -> ExitStatus {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(status) = self.try_wait() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "{} did not exit within {}s; its log ends:\n{}",
                self.name,
                PATIENCE.as_secs(),
                self.log_tail(40)
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// SIGKILL, then reap: nothing of it is left afterwards.
    pub fn kill(&mut self) {
        if self.try_wait().is_none() {
            let _ = self.child.kill();
            self.exited = self.child.wait().ok();
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last `n` lines of the log without its debug lines: for failure messages.
    pub fn log_tail(&self, n: usize) -> String {
        let text = self.log_text();
        let lines: Vec<&str> = text.lines().filter(|l| !l.contains("DEBUG")).collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A response, read whole.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub text: String,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.text)
            .unwrap_or_else(|e| panic!("not JSON ({e}), status {}: {}", self.status, self.text))
    }

    /// The JSON body, after checking the status.
    pub fn expect(&self, status: StatusCode) -> Value {
        assert_eq!(self.status, status, "{}", self.text);
        self.json()
    }
}

/// An HTTP client of one server: `base` is `http://127.0.0.1:PORT`.
#[derive(Clone)]
pub struct Api {
    pub base: String,
    pub token: String,
    pub client: reqwest::Client,
}

impl Api {
    pub fn new(base: &str, token: &str) -> Api {
        let client = reqwest::Client::builder().timeout(Duration::from_secs(20)).build().unwrap();
        Api { base: base.trim_end_matches('/').to_owned(), token: token.to_owned(), client }
    }

    /// Any request to `path` under the server's root (`/api/v1/…`, `/agent/v1/…`, `/readyz`).
    /// `token: None` sends no Authorization header.
    pub async fn raw(&self, method: Method, path: &str, token: Option<&str>, body: Option<&Value>) -> Reply {
        let mut req = self.client.request(method, format!("{}{path}", self.base));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        let resp = req.send().await.unwrap_or_else(|e| panic!("{path}: the server does not answer: {e}"));
        let status = resp.status();
        Reply { status, text: resp.text().await.unwrap() }
    }

    /// A user-API request (`path` is below `/api/v1`) with this client's token.
    pub async fn request(&self, method: Method, path: &str, body: Option<&Value>) -> Reply {
        self.raw(method, &format!("/api/v1{path}"), Some(&self.token), body).await
    }

    pub async fn get(&self, path: &str) -> Reply {
        self.request(Method::GET, path, None).await
    }

    pub async fn post(&self, path: &str, body: &Value) -> Reply {
        self.request(Method::POST, path, Some(body)).await
    }

    pub async fn put(&self, path: &str, body: &Value) -> Reply {
        self.request(Method::PUT, path, Some(body)).await
    }

    pub async fn delete(&self, path: &str) -> Reply {
        self.request(Method::DELETE, path, None).await
    }

    /// Whether the server answers `/readyz` with 200; false while it is not listening yet.
    pub async fn ready(&self) -> bool {
        let resp = self.client.get(format!("{}/readyz", self.base)).send().await;
        resp.is_ok_and(|r| r.status().is_success())
    }

    // One helper per endpoint.

    pub async fn machines(&self) -> Vec<Value> {
        let list = self.get("/machines").await.expect(StatusCode::OK);
        list["items"].as_array().cloned().unwrap_or_default()
    }

    pub async fn machine(&self, name: &str) -> Value {
        self.get(&format!("/machines/{name}")).await.expect(StatusCode::OK)
    }

    pub async fn confirm_data_location(&self, machine: &str, path: &str) -> Value {
        let body = json!({ "path": path });
        self.post(&format!("/machines/{machine}/data-location"), &body).await.expect(StatusCode::OK)
    }

    /// A new join token for cluster `main`.
    pub async fn join_token(&self) -> String {
        let created =
            self.post("/clusters/main/join-tokens", &json!({"uses": 100})).await.expect(StatusCode::CREATED);
        created["token"].as_str().expect("a join token").to_owned()
    }

    pub async fn grant_host_paths(&self, paths: &[&Path]) {
        let body = json!({ "paths": paths.iter().map(|p| json!({"path": p, "mode": "ReadWrite"})).collect::<Vec<_>>() });
        self.put("/workspaces/default/clusters/main/host-paths", &body).await.expect(StatusCode::OK);
    }

    pub async fn create_drive(&self, body: &Value) -> Value {
        self.post("/drives", body).await.expect(StatusCode::CREATED)
    }

    pub async fn create_secret(&self, body: &Value) -> Value {
        self.post("/secrets", body).await.expect(StatusCode::CREATED)
    }

    pub async fn create_run(&self, body: &Value) -> Value {
        self.post("/runs", body).await.expect(StatusCode::CREATED)
    }

    pub async fn run(&self, name: &str) -> Value {
        self.get(&format!("/runs/{name}")).await.expect(StatusCode::OK)
    }

    pub async fn runs(&self, all: bool) -> Vec<Value> {
        let list = self.get(&format!("/runs?all={all}")).await.expect(StatusCode::OK);
        list["items"].as_array().cloned().unwrap_or_default()
    }

    pub async fn delete_run(&self, name: &str) {
        let reply = self.delete(&format!("/runs/{name}")).await;
        assert_eq!(reply.status, StatusCode::NO_CONTENT, "{}", reply.text);
    }

    pub async fn worker(&self, name: &str) -> Value {
        self.get(&format!("/workers/{name}")).await.expect(StatusCode::OK)
    }

    /// A worker's output so far.
    pub async fn logs(&self, worker: &str) -> String {
        let reply = self.get(&format!("/workers/{worker}/logs")).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
        reply.text
    }

    /// Waits until the run is Completed or Failed and returns it.
    pub async fn wait_run_ended(&self, name: &str) -> Value {
        eventually(&format!("run {name} ends"), || async move {
            let run = self.run(name).await;
            match run["status"]["state"].as_str() {
                Some("Completed" | "Failed") => Ok(run),
                _ => Err(run["status"].to_string()),
            }
        })
        .await
    }

    /// Waits until the worker is in `state` and returns it.
    pub async fn wait_worker(&self, name: &str, state: &str) -> Value {
        eventually(&format!("worker {name} is {state}"), || async move {
            let worker = self.worker(name).await;
            if worker["status"]["state"] == state { Ok(worker) } else { Err(worker["status"].to_string()) }
        })
        .await
    }

    /// Waits until `machine` is listed in `state`, and returns it.
    pub async fn wait_machine(&self, machine: &str, state: &str) -> Value {
        eventually(&format!("machine {machine} is {state}"), || async move {
            let found = self.machines().await.into_iter().find(|m| m["metadata"]["name"] == machine);
            match found {
                Some(m) if m["status"]["state"] == state => Ok(m),
                Some(m) => Err(m["status"].to_string()),
                None => Err("not listed".into()),
            }
        })
        .await
    }
}

/// A run of one worker that runs `sh -c script` with 1 core and 256 MiB.
pub fn sh_run(name: &str, script: &str) -> Value {
    json!({
        "metadata": {"name": name},
        "spec": {"task_template": {
            "image": "busybox:1.36",
            "command": "sh",
            "args": ["-c", script],
            "requested_resources": {"cpu_cores": 1, "memory_bytes": 268435456u64}
        }}
    })
}

/// The URL of the database `pool` is connected to (a `#[sqlx::test]` database), on the server
/// that `DATABASE_URL` names.
pub fn database_url(pool: &PgPool) -> String {
    let base = std::env::var("DATABASE_URL").expect("DATABASE_URL is set (. scripts/postgres.sh)");
    let database = pool.connect_options().get_database().expect("a test database").to_owned();
    let mut url = reqwest::Url::parse(&base).expect("DATABASE_URL is a URL");
    url.set_path(&format!("/{database}"));
    url.to_string()
}

/// `astraeus admin …`, which must succeed; returns its stdout.
pub fn admin(args: &[&str]) -> String {
    let out = Command::new(bin()).arg("admin").args(args).env_remove("DATABASE_URL").output().unwrap();
    assert!(out.status.success(), "astraeus admin {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// A server over its own database, with agents joined to it.
pub struct Cluster {
    /// Agents first: they stop before the server they talk to.
    pub agents: Vec<Agent>,
    pub server: Proc,
    pub api: Api,
    pub database_url: String,
    /// The signing key and the children's logs.
    pub dir: TempDir,
    join_token: String,
    /// More flags for the agents started from now on (`--gpus 2`, `--gpu-kind …`).
    pub agent_args: Vec<String>,
}

impl Drop for Cluster {
    /// When a test fails, the end of each child's log (without debug lines) says what happened.
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let procs = std::iter::once(&self.server).chain(self.agents.iter().map(|a| &a.proc));
        for proc in procs {
            eprintln!("--- the last lines of {}'s log:\n{}", proc.name, proc.log_tail(40));
        }
    }
}

pub struct Agent {
    pub name: String,
    pub proc: Proc,
    /// The data location it proposed.
    pub data: TempDir,
}

impl Drop for Agent {
    /// A killed agent leaves its containers running (a restarted one follows them again): the
    /// test removes them, and the binds of their drives, before their folders go.
    fn drop(&mut self) {
        self.proc.kill();
        images::remove_machine_leftovers(self.data.path());
    }
}

impl Cluster {
    /// `astraeus serve` over the test's database with a 3 s heartbeat grace, an org-admin token,
    /// and agent gpu-01 joined with its data location confirmed.
    pub async fn start(pool: &PgPool) -> Cluster {
        let mut cluster = Cluster::server_only(pool).await;
        cluster.add_agent("gpu-01").await;
        cluster
    }

    pub async fn server_only(pool: &PgPool) -> Cluster {
        Cluster::server_with_grace(pool, 3).await
    }

    /// The server alone, declaring a machine lost after `grace` seconds without a heartbeat.
    pub async fn server_with_grace(pool: &PgPool, grace: u32) -> Cluster {
        let dir = open_tempdir();
        let database_url = database_url(pool);
        let key = dir.path().join("signing-key.pem");
        let key_arg = key.to_str().unwrap();
        admin(&["keygen", "--out", key_arg]);
        let (server, base) = start_server(&dir, &database_url, &key, grace).await;
        let token = admin(&[
            "token",
            "--workspace",
            "default",
            "--role",
            "admin",
            "--org-admin",
            "--database-url",
            &database_url,
            "--signing-key-file",
            key_arg,
        ]);
        let api = Api::new(&base, &token);
        let join_token = api.join_token().await;
        Cluster { agents: vec![], server, api, database_url, dir, join_token, agent_args: vec![] }
    }

    /// Starts `astraeus agent --name name` (2 cores, 4 GiB, a heartbeat a second), waits for it
    /// to join and confirms the data location it proposes.
    pub async fn add_agent(&mut self, name: &str) {
        let data = open_tempdir();
        let proc = self.spawn_agent(name, data.path(), 0);
        let expected = data.path().to_owned();
        self.agents.push(Agent { name: name.to_owned(), proc, data });
        let machine = self.api.wait_machine(name, "Ready").await;
        let proposed = machine["status"]["data_location"]["proposed"].as_str().expect("a proposed path");
        assert_eq!(Path::new(proposed), expected);
        let confirmed = self.api.confirm_data_location(name, proposed).await;
        assert_eq!(confirmed["status"]["data_location"]["confirmed"], true);
    }

    fn spawn_agent(&self, name: &str, data: &Path, life: usize) -> Proc {
        let mut cmd = Command::new(bin());
        cmd.arg("agent")
            .args(["--server", &self.api.base, "--join-token", &self.join_token, "--name", name])
            .arg("--data-location")
            .arg(data)
            .args(["--cpus", "2", "--memory", "4294967296", "--heartbeat-interval-seconds", "1"])
            .args(&self.agent_args)
            .env("CONTAINERS_REGISTRIES_CONF", registries_conf())
            .env_remove("DATABASE_URL");
        let log = self.dir.path().join(format!("{name}-{life}.log"));
        Proc::spawn(&format!("agent {name}"), &mut cmd, log)
    }

    /// Starts agent `name` again (after it was killed) over the same data location.
    pub fn restart_agent(&mut self, name: &str) {
        let life = (1..).find(|i| !self.dir.path().join(format!("{name}-{i}.log")).exists()).unwrap();
        let data = self.agent(name).data.path().to_owned();
        let proc = self.spawn_agent(name, &data, life);
        self.agent(name).proc = proc;
    }

    pub fn agent(&mut self, name: &str) -> &mut Agent {
        self.agents.iter_mut().find(|a| a.name == name).expect("an agent of that name")
    }
}

/// Starts `astraeus serve` on a free port and waits until it is ready. Another process may take
/// the port between our check and the server's bind: then it tries another.
async fn start_server(dir: &TempDir, database_url: &str, key: &Path, grace: u32) -> (Proc, String) {
    for attempt in 0..3 {
        let port = free_port();
        let base = format!("http://127.0.0.1:{port}");
        let mut cmd = Command::new(bin());
        cmd.arg("serve")
            .args(["--listen", &format!("127.0.0.1:{port}"), "--database-url", database_url])
            .arg("--signing-key-file")
            .arg(key)
            .args(["--heartbeat-grace-seconds", &grace.to_string(), "--database-max-connections", "8"])
            .env_remove("DATABASE_URL");
        let log = dir.path().join(format!("server-{attempt}.log"));
        let mut server = Proc::spawn("server", &mut cmd, log);
        let api = Api::new(&base, "");
        let deadline = Instant::now() + PATIENCE;
        while Instant::now() < deadline && server.try_wait().is_none() && !api.ready().await {
            tokio::time::sleep(POLL).await;
        }
        if api.ready().await {
            return (server, base);
        }
        let log = server.log_text();
        assert!(log.contains("cannot listen"), "the server did not become ready:\n{}", server.log_tail(40));
    }
    panic!("no free port for the server after 3 tries");
}
