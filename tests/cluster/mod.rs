//! An in-process cluster over the test's own database, as dev mode wires one: API servers on
//! port 0 with their control loops (one or more replicas over the same database), and agents
//! with their data locations in temporary folders, running workers in the real bwrap sandbox.
//! One helper per endpoint the tests call, and bounded polling.

#![allow(dead_code)]

use std::future::Future;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use astraeus::api::AppState;
use astraeus::auth::{Keys, issue, machine::new_join_token};
use astraeus::domain::role::Role;
use astraeus::settings::{ControllerArgs, MachineArgs};
use astraeus::{agent, server, store};
use chrono::{DateTime, Utc};
use reqwest::StatusCode;
use serde_json::Value;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use tempfile::TempDir;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use serde_json::json;

#[path = "../images/mod.rs"]
pub mod images;

/// How the in-process agents run containers: podman and runc from PATH, docker.io sent to the
/// tests' own registry (tests/images), a short stop grace.
pub fn runtime() -> agent::podman::Config {
    agent::podman::Config {
        podman: "/usr/bin/podman".into(),
        runc: "/usr/sbin/runc".into(),
        registries_conf: Some(images::images().registries_conf.clone()),
        storage_conf: None,
        capabilities: vec![],
        gpu_kind: "nvidia.com/gpu".into(),
        stop_grace: Duration::from_secs(2),
        image_keep_free_bytes: 0,
    }
}

/// How long any wait may take before the test fails: generous, the machine is shared.
pub const PATIENCE: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(100);
/// The refill interval the tests run with (the product's default is 600 s).
pub const REFILL_AFTER_SECONDS: u64 = 2;
/// 8 GiB, the memory of every machine here.
pub const MACHINE_MEMORY: u64 = 8 << 30;

/// Polls `check` every 100 ms until it gives `Ok`, for at most `PATIENCE`. `Err` carries what
/// was last seen, for the failure message.
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

/// A temporary folder the sandboxed workers can traverse.
pub fn open_tempdir() -> TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
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

/// A client of one replica's user API (`/api/v1`), with an admin and org-admin token of
/// workspace `default`.
#[derive(Clone)]
pub struct Api {
    pub base: String,
    pub token: String,
    http: reqwest::Client,
}

impl Api {
    async fn send(&self, method: reqwest::Method, path: &str, body: Option<&Value>) -> Reply {
        let mut req =
            self.http.request(method, format!("{}/api/v1{path}", self.base)).bearer_auth(&self.token);
        if let Some(b) = body {
            req = req.json(b);
        }
        let resp = req.send().await.unwrap_or_else(|e| panic!("{path}: the server does not answer: {e}"));
        let status = resp.status();
        Reply { status, text: resp.text().await.unwrap() }
    }

    pub async fn get(&self, path: &str) -> Reply {
        self.send(reqwest::Method::GET, path, None).await
    }

    pub async fn post(&self, path: &str, body: &Value) -> Reply {
        self.send(reqwest::Method::POST, path, Some(body)).await
    }

    pub async fn put(&self, path: &str, body: &Value) -> Reply {
        self.send(reqwest::Method::PUT, path, Some(body)).await
    }

    pub async fn delete(&self, path: &str) -> Reply {
        self.send(reqwest::Method::DELETE, path, None).await
    }

    // One helper per endpoint.

    pub async fn create_drive(&self, body: &Value) -> Value {
        self.post("/drives", body).await.expect(StatusCode::CREATED)
    }

    pub async fn drive(&self, name: &str) -> Value {
        self.get(&format!("/drives/{name}")).await.expect(StatusCode::OK)
    }

    pub async fn create_run(&self, body: &Value) -> Value {
        self.post("/runs", body).await.expect(StatusCode::CREATED)
    }

    pub async fn run(&self, name: &str) -> Value {
        self.get(&format!("/runs/{name}")).await.expect(StatusCode::OK)
    }

    /// `GET /runs`: runs not yet ended, or all of them.
    pub async fn runs(&self, all: bool) -> Vec<Value> {
        let list = self.get(&format!("/runs?all={all}")).await.expect(StatusCode::OK);
        list["items"].as_array().cloned().unwrap_or_default()
    }

    pub async fn delete_run(&self, name: &str) {
        let reply = self.delete(&format!("/runs/{name}")).await;
        assert_eq!(reply.status, StatusCode::NO_CONTENT, "DELETE /runs/{name}: {}", reply.text);
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

    pub async fn machine(&self, name: &str) -> Value {
        self.get(&format!("/machines/{name}")).await.expect(StatusCode::OK)
    }

    /// The events about `object` (`drive/NAME`, `worker/NAME`) with `reason`, oldest first.
    pub async fn events_with(&self, object: &str, reason: &str) -> Vec<Value> {
        let events = self.get(&format!("/events?object={object}")).await.expect(StatusCode::OK);
        events["items"].as_array().unwrap().iter().filter(|e| e["reason"] == reason).cloned().collect()
    }

    /// Machines → machine → Data location → Confirm, with an optional limit.
    pub async fn confirm_data_location(&self, machine: &str, path: &Path, limit_bytes: Option<i64>) -> Value {
        let body = json!({"path": path, "limit_bytes": limit_bytes});
        self.post(&format!("/machines/{machine}/data-location"), &body).await.expect(StatusCode::OK)
    }

    /// Grants workspace `default` these host paths on cluster `main`.
    pub async fn grant_host_paths(&self, paths: &[&Path]) {
        let body = json!({"paths": paths});
        self.put("/workspaces/default/clusters/main/host-paths", &body).await.expect(StatusCode::OK);
    }

    /// Waits until the run is in `state` and returns it.
    pub async fn wait_run(&self, name: &str, state: &str) -> Value {
        eventually(&format!("run {name} is {state}"), || async move {
            let reply = self.get(&format!("/runs/{name}")).await;
            if reply.status != StatusCode::OK {
                return Err(reply.text);
            }
            let run = reply.json();
            if run["status"]["state"] == state { Ok(run) } else { Err(run["status"].to_string()) }
        })
        .await
    }

    /// Waits until the run has ended, and checks that it completed.
    pub async fn wait_completed(&self, name: &str) -> Value {
        let run = eventually(&format!("run {name} ends"), || async move {
            let reply = self.get(&format!("/runs/{name}")).await;
            if reply.status != StatusCode::OK {
                return Err(reply.text);
            }
            let run = reply.json();
            match run["status"]["state"].as_str() {
                Some("Completed" | "Failed") => Ok(run),
                _ => Err(run["status"].to_string()),
            }
        })
        .await;
        assert_eq!(run["status"]["state"], "Completed", "{name}: {}", run["status"]);
        run
    }

    /// Waits until the worker is in `state` and returns it.
    pub async fn wait_worker(&self, name: &str, state: &str) -> Value {
        eventually(&format!("worker {name} is {state}"), || async move {
            let reply = self.get(&format!("/workers/{name}")).await;
            if reply.status != StatusCode::OK {
                return Err(reply.text);
            }
            let worker = reply.json();
            if worker["status"]["state"] == state { Ok(worker) } else { Err(worker["status"].to_string()) }
        })
        .await
    }

    /// Waits until the worker's reason is exactly `reason` and returns the worker.
    pub async fn wait_reason(&self, name: &str, reason: &str) -> Value {
        eventually(&format!("worker {name} says {reason:?}"), || async move {
            let reply = self.get(&format!("/workers/{name}")).await;
            if reply.status != StatusCode::OK {
                return Err(reply.text);
            }
            let worker = reply.json();
            if worker["status"]["reason"] == reason { Ok(worker) } else { Err(worker["status"].to_string()) }
        })
        .await
    }
}

/// One API server and its control loops over its own connection pool: a replica.
struct Replica {
    base: String,
    pool: PgPool,
    tasks: Vec<JoinHandle<()>>,
}

/// An agent running in this process.
pub struct Machine {
    pub name: String,
    /// The data location it proposed (and the tests confirm).
    pub data: TempDir,
    config: agent::Config,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl Drop for Machine {
    /// An agent dropped with its test leaves its containers: they go before their folders.
    fn drop(&mut self) {
        self.stop.cancel();
        self.task.abort();
        images::remove_machine_leftovers(self.data.path());
    }
}

impl Machine {
    /// `<data location>/drives/<folder>`: where the agent keeps a copy.
    pub fn copy_dir(&self, folder: &str) -> PathBuf {
        self.data.path().join("drives").join(folder)
    }

    /// The credential the agent keeps, as it calls the agent API with it.
    pub fn credential(&self) -> String {
        let kept = std::fs::read_to_string(self.data.path().join(".agent/credential")).unwrap();
        serde_json::from_str::<Value>(&kept).unwrap()["credential"].as_str().unwrap().to_owned()
    }

    /// Stops the agent as a crash would leave it: its files stay, its server is gone.
    pub async fn kill(&mut self) {
        self.stop.cancel();
        self.task.abort();
        if !self.task.is_finished() {
            let _ = (&mut self.task).await;
        }
    }

    /// Stops the agent and starts it again on the same data location, as a restart does.
    pub async fn restart(&mut self, parent: &CancellationToken) {
        self.kill().await;
        self.stop = parent.child_token();
        self.task = spawn_agent(&self.name, self.config.clone(), self.stop.clone());
    }

    /// Lets a gated fill finish (`GATED_MARKER`), once its container has made its copy.
    pub async fn open_gate(&self, folder: &str) {
        let copy = self.copy_dir(folder);
        eventually(&format!("the fill of {folder} has begun"), || async {
            if copy.is_dir() { Ok(()) } else { Err("no copy yet".into()) }
        })
        .await;
        std::fs::write(copy.join("gate"), "").unwrap();
    }
}

pub struct Cluster {
    /// The test's own pool, for looking at the database directly.
    pub db: PgPool,
    /// The user API of the first replica, the one agents talk to.
    pub api: Api,
    pub machines: Vec<Machine>,
    replicas: Vec<Replica>,
    keys: Arc<Keys>,
    token: String,
    join_token: String,
    stop: CancellationToken,
}

impl Cluster {
    /// One replica, no machines yet.
    pub async fn start(pool: &PgPool) -> Cluster {
        Cluster::with_replicas(pool, 1).await
    }

    /// `n` replicas over the same database, each with its own pool, notifications and loops,
    /// heartbeat grace 30 s and refill interval `REFILL_AFTER_SECONDS`.
    pub async fn with_replicas(pool: &PgPool, n: usize) -> Cluster {
        init_tracing();
        let keys = Arc::new(Keys::from_pem(&Keys::generate_pem().unwrap()).unwrap());
        let workspace = store::workspaces::ensure(pool, "default").await.unwrap();
        let request = issue::Request {
            workspace: &workspace,
            name: "test",
            role: Role::Admin,
            org_admin: true,
            ttl: chrono::Duration::hours(2),
        };
        let (_, token) = issue::issue(pool, &keys, &request).await.unwrap();
        let (join_token, hash) = new_join_token();
        store::join_tokens::insert(pool, "main", &hash, Utc::now() + chrono::Duration::hours(2), 100)
            .await
            .unwrap();
        let stop = CancellationToken::new();
        let controllers =
            ControllerArgs { heartbeat_grace_seconds: 30, refill_after_seconds: REFILL_AFTER_SECONDS };
        let mut replicas = Vec::new();
        for _ in 0..n {
            let options = pool.connect_options().as_ref().clone();
            let own = PgPoolOptions::new()
                .max_connections(8)
                .acquire_timeout(Duration::from_secs(30))
                .connect_with(options)
                .await
                .unwrap();
            let app = AppState::new(own.clone(), keys.clone());
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let base = format!("http://{}", listener.local_addr().unwrap());
            let mut tasks: Vec<JoinHandle<()>> = Vec::new();
            let mut loops = server::start_loops(&app, &controllers, &stop);
            tasks.push(tokio::spawn(async move { while loops.join_next().await.is_some() {} }));
            let listen_stop = stop.clone();
            tasks.push(tokio::spawn(async move {
                server::listen(listener, app, listen_stop).await.unwrap();
            }));
            replicas.push(Replica { base, pool: own, tasks });
        }
        let api = Api { base: replicas[0].base.clone(), token: token.clone(), http: http() };
        Cluster { db: pool.clone(), api, machines: vec![], replicas, keys, token, join_token, stop }
    }

    /// The user API of replica `i`.
    pub fn api_of(&self, i: usize) -> Api {
        Api { base: self.replicas[i].base.clone(), token: self.token.clone(), http: http() }
    }

    /// Starts an agent for machine `name` (2 cores, 8 GiB, a heartbeat a second) talking to the
    /// first replica, and waits until it has joined. Its data location is not confirmed.
    pub async fn add_machine(&mut self, name: &str) -> &Machine {
        self.add_machine_with(name, 2.0, MACHINE_MEMORY).await
    }

    pub async fn add_machine_with(&mut self, name: &str, cpus: f64, memory: u64) -> &Machine {
        self.add_machine_configured(name, cpus, memory, agent::PeerConfig::default()).await
    }

    /// A machine that joined with a confirmed data location and serves its copies to peers on
    /// a port of 127.0.0.1, once the server knows the port.
    pub async fn add_peer_machine(&mut self, name: &str) -> &Machine {
        self.add_peer_machine_with(name, agent::PeerConfig::default()).await
    }

    /// A peer machine (see [`Cluster::add_peer_machine`]) with `peers`' limits, TLS and trust.
    pub async fn add_peer_machine_with(&mut self, name: &str, peers: agent::PeerConfig) -> &Machine {
        let peers = agent::PeerConfig { listen: Some("127.0.0.1:0".parse().unwrap()), ..peers };
        self.add_machine_configured(name, 2.0, MACHINE_MEMORY, peers).await;
        self.confirm(name, None).await;
        let db = &self.db;
        eventually(&format!("machine {name} reports its data port"), || async move {
            let address: Option<String> =
                sqlx::query_scalar("SELECT data_address FROM machines WHERE name = $1")
                    .bind(name)
                    .fetch_one(db)
                    .await
                    .unwrap();
            address.ok_or_else(|| "no data port yet".to_owned())
        })
        .await;
        self.machine(name)
    }

    async fn add_machine_configured(
        &mut self,
        name: &str,
        cpus: f64,
        memory: u64,
        peers: agent::PeerConfig,
    ) -> &Machine {
        let data = open_tempdir();
        let args = MachineArgs {
            cpus: Some(cpus),
            memory: Some(memory),
            gpus: 0,
            labels: vec![],
            pool: "default".into(),
            transports: vec![],
            heartbeat_interval_seconds: 1,
            data_reserve_bytes: 0,
        };
        let config = agent::Config {
            server: self.replicas[0].base.clone(),
            join: agent::host::join_request(name, &self.join_token, data.path(), &args).unwrap(),
            data_location: data.path().to_path_buf(),
            heartbeat_interval: Duration::from_secs(1),
            data_reserve_bytes: 0,
            runtime: runtime(),
            peers,
        };
        let stop = self.stop.child_token();
        let task = spawn_agent(name, config.clone(), stop.clone());
        let db = &self.db;
        eventually(&format!("machine {name} joins"), || async move {
            match store::machines::by_name(db, None, name).await.unwrap().is_empty() {
                false => Ok(()),
                true => Err("not registered".into()),
            }
        })
        .await;
        self.machines.push(Machine { name: name.to_owned(), data, config, stop, task });
        self.machines.last().unwrap()
    }

    /// A machine that joined, with a confirmed data location (no limit).
    pub async fn add_ready_machine(&mut self, name: &str) -> &Machine {
        self.add_machine(name).await;
        self.confirm(name, None).await;
        self.machine(name)
    }

    pub fn machine(&self, name: &str) -> &Machine {
        self.machines.iter().find(|m| m.name == name).unwrap_or_else(|| panic!("no machine {name}"))
    }

    /// Restarts the agent of `name` (see [`Machine::restart`]).
    pub async fn restart(&mut self, name: &str) {
        let parent = self.stop.clone();
        let m =
            self.machines.iter_mut().find(|m| m.name == name).unwrap_or_else(|| panic!("no machine {name}"));
        m.restart(&parent).await;
    }

    /// Stops the agent of `name` as a crash would (see [`Machine::kill`]).
    pub async fn kill(&mut self, name: &str) {
        let m =
            self.machines.iter_mut().find(|m| m.name == name).unwrap_or_else(|| panic!("no machine {name}"));
        m.kill().await;
    }

    /// Confirms the data location the machine proposed, with `limit_bytes`. Work may be placed
    /// there at once, before the agent's next heartbeat.
    pub async fn confirm(&self, name: &str, limit_bytes: Option<i64>) {
        self.api.confirm_data_location(name, self.machine(name).data.path(), limit_bytes).await;
    }

    /// Waits until the machine has sent `n` heartbeats after now.
    pub async fn await_heartbeats(&self, name: &str, n: usize) {
        let db = &self.db;
        let mut after: DateTime<Utc> = sqlx::query_scalar("SELECT now()").fetch_one(db).await.unwrap();
        for _ in 0..n {
            after = eventually(&format!("{name} heartbeats"), || async move {
                let m = store::machines::by_name(db, None, name).await.unwrap().remove(0);
                if m.last_heartbeat_at > after {
                    Ok(m.last_heartbeat_at)
                } else {
                    Err(m.last_heartbeat_at.to_string())
                }
            })
            .await;
        }
    }

    /// How many fill runs exist.
    pub async fn fill_runs(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM runs WHERE fill_drive_id IS NOT NULL")
            .fetch_one(&self.db)
            .await
            .unwrap()
    }

    /// The names of a run's workers, in index order.
    pub async fn worker_names(&self, run: &str) -> Vec<String> {
        sqlx::query_scalar(
            "SELECT w.name FROM workers w JOIN runs r ON r.id = w.run_id WHERE r.name = $1 ORDER BY w.index",
        )
        .bind(run)
        .fetch_all(&self.db)
        .await
        .unwrap()
    }

    /// Stops agents, loops and servers, then closes the replicas' pools, so the test's database
    /// can be dropped.
    pub async fn stop(mut self) {
        self.stop.cancel();
        for mut m in self.machines.drain(..) {
            m.stop.cancel();
            // A killed agent's task has ended already, and may not be awaited again.
            if !m.task.is_finished() {
                let _ = tokio::time::timeout(Duration::from_secs(10), &mut m.task).await;
            }
        }
        for r in self.replicas.drain(..) {
            for t in r.tasks {
                t.abort();
                let _ = t.await;
            }
            r.pool.close().await;
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop.cancel();
        for r in &self.replicas {
            for t in &r.tasks {
                t.abort();
            }
        }
    }
}

/// Runs the agent `name` until `stop`; an agent that stops on an error fails the test.
fn spawn_agent(name: &str, config: agent::Config, stop: CancellationToken) -> JoinHandle<()> {
    let name = name.to_owned();
    tokio::spawn(async move {
        if let Err(e) = agent::run(config, stop).await {
            panic!("agent {name} stopped: {e:#}");
        }
    })
}

fn http() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_secs(30)).build().unwrap()
}

/// Logs to the test's output with `RUST_LOG=astraeus=debug cargo test …`; quiet otherwise.
fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("off"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_test_writer().try_init();
}

/// A fill that writes the Food-101 layout (three small parquet files of 100 kB under
/// food101/data), prints where, and writes the marker last.
pub const FOOD101_FILL: &str = "set -e; mkdir -p /drive/food101/data; \
    for i in 0 1 2; do head -c 100000 /dev/urandom > /drive/food101/data/train-0000$i-of-00008.parquet; done; \
    echo /drive/food101; touch /drive/.astralyx-filled";

/// A fill that writes one blob of 100 kB, then the marker (which is empty).
pub const BLOB_FILL: &str =
    "set -e; head -c 100000 /dev/urandom > /drive/blob; touch /drive/.astralyx-filled";

/// A drive kept on each machine (`node_scope: placed`, mounted read-only at /data), filled by
/// `sh -c fill` with `cpu_cores` and 256 MiB.
pub fn placed_drive(name: &str, size_hint_bytes: u64, evictable: bool, fill: &str, cpu_cores: f64) -> Value {
    json!({
        "metadata": {"name": name},
        "spec": {
            "sources": [{"node_scope": "placed", "path": "", "mount_path": "/data", "mode": "ReadOnly"}],
            "size_hint_bytes": size_hint_bytes,
            "evictable": evictable,
            "fill": {"template": {
                "image": "busybox:1.36",
                "command": "sh",
                "args": ["-c", fill],
                "requested_resources": {"cpu_cores": cpu_cores, "memory_bytes": 268435456u64}
            }}
        }
    })
}

/// The recipe's food101 drive with the local fill: 6 GB size hint, evictable.
pub fn food101() -> Value {
    placed_drive("food101", 6_000_000_000, true, FOOD101_FILL, 1.0)
}

/// A run of one worker that runs `sh -c script` with `cpu_cores` and 64 MiB, mounting `drives`
/// (names) at /data, /data2, … read-only.
pub fn run_mounting(name: &str, script: &str, drives: &[&str], cpu_cores: f64) -> Value {
    let refs: Vec<Value> = drives
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let at = if i == 0 { "/data".to_owned() } else { format!("/data{}", i + 1) };
            json!({"name": d, "mount_path": at, "mode": "ReadOnly"})
        })
        .collect();
    json!({
        "metadata": {"name": name},
        "spec": {"task_template": {
            "image": "busybox:1.36",
            "command": "sh",
            "args": ["-c", script],
            "requested_resources": {"cpu_cores": cpu_cores, "memory_bytes": 67108864u64},
            "datavolume_refs": refs
        }}
    })
}

/// Pins a run to one machine.
pub fn pinned(mut run: Value, machine: &str) -> Value {
    run["spec"]["task_template"]["requested_resources"]["node_selection"] =
        json!({"mode": "Exact", "names": [machine]});
    run
}
