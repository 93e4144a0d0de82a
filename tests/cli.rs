//! The `astra` CLI against `astraeus dev` over a fresh database: the recipe's `astra astraeus …`
//! lines print what the recipe shows, JSON goes to jq unchanged, and failures exit non-zero with
//! the API's own message.

#[path = "images/mod.rs"]
mod images;

use std::collections::HashMap;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sqlx::PgPool;
use tempfile::TempDir;

/// How long any wait in these tests may take before it fails.
const PATIENCE: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(200);

/// The recipe's header, byte for byte.
const HEADER: &str = "NAME                          CLUSTER       STATE       REASON";

/// `astraeus dev` with one machine over the test's database; stopped (Ctrl-C, then SIGKILL) on drop.
struct Dev {
    child: Child,
    /// The state dir (the machine's data location is inside) and the CLI's config home.
    dir: TempDir,
    log: PathBuf,
    env: HashMap<String, String>,
}

impl Dev {
    async fn start(pool: &PgPool) -> Dev {
        let dir = tempfile::tempdir().unwrap();
        // Workers and Postgres run as other users: they must be able to traverse it.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let log = dir.path().join("dev.log");
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_astraeus"))
            .args(["dev", "--listen", "127.0.0.1:0", "--machines", "1", "--heartbeat-interval-seconds", "1"])
            .arg("--state-dir")
            .arg(dir.path().join("state"))
            .env("DATABASE_URL", database_url(pool))
            .env("CONTAINERS_REGISTRIES_CONF", &images::images().registries_conf)
            .env_remove("ASTRAEUS_LISTEN")
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("astraeus dev starts");
        let mut dev = Dev { child, dir, log, env: HashMap::new() };
        dev.env = dev.read_env().await;
        // Dev mode confirms the machine's data location once it has joined.
        dev.eventually("gpu-01 is Ready with a confirmed data location", |dev| {
            let m = dev.json(&["astraeus", "get", "machine", "gpu-01", "-o", "json"]).ok()?;
            let ready = m["status"]["state"] == "Ready" && m["status"]["data_location"]["confirmed"] == true;
            ready.then_some(())
        })
        .await;
        dev
    }

    /// Waits for `<state>/env` and reads its variables; fails early if dev mode exits.
    async fn read_env(&mut self) -> HashMap<String, String> {
        let path = self.dir.path().join("state/env");
        let deadline = Instant::now() + PATIENCE;
        loop {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            if let Some(line) = text.lines().find_map(|l| l.strip_prefix("export ")) {
                let vars: HashMap<String, String> = line
                    .split_whitespace()
                    .filter_map(|kv| kv.split_once('='))
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .collect();
                if vars.contains_key("ASTRAEUS_API") && vars.contains_key("ASTRAEUS_TOKEN") {
                    return vars;
                }
            }
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("astraeus dev exited ({status}):\n{}", self.log_text());
            }
            assert!(
                Instant::now() < deadline,
                "no {} within {PATIENCE:?}:\n{}",
                path.display(),
                self.log_text()
            );
            tokio::time::sleep(POLL).await;
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Calls `check` every 200 ms until it gives `Some`, for at most a minute.
    async fn eventually<T>(&self, what: &str, mut check: impl FnMut(&Dev) -> Option<T>) -> T {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(v) = check(self) {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: not within {PATIENCE:?}; dev log:\n{}",
                self.log_text()
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// `astra ARGS` with the dev env, a private config home, and `stdin` as its input.
    fn astra_with(&self, args: &[&str], stdin: &str, env: &[(&str, &str)]) -> Output {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_astra"));
        cmd.args(args)
            .env("ASTRAEUS_API", &self.env["ASTRAEUS_API"])
            .env("ASTRAEUS_TOKEN", &self.env["ASTRAEUS_TOKEN"])
            .env("XDG_CONFIG_HOME", self.dir.path().join("config"))
            .env("NO_COLOR", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            if v.is_empty() {
                cmd.env_remove(k)
            } else {
                cmd.env(k, v)
            };
        }
        let mut child = cmd.spawn().expect("astra starts");
        child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
        child.wait_with_output().unwrap()
    }

    fn astra(&self, args: &[&str]) -> Output {
        self.astra_with(args, "", &[])
    }

    /// `astra ARGS`, which must succeed; its stdout.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.astra(args);
        assert!(out.status.success(), "astra {args:?} failed ({}): {}", out.status, stderr(&out));
        String::from_utf8(out.stdout).unwrap()
    }

    fn json(&self, args: &[&str]) -> Result<Value, String> {
        let out = self.astra(args);
        if !out.status.success() {
            return Err(stderr(&out));
        }
        serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())
    }

    /// A shell pipeline, as the recipe writes it, with `astra` on the PATH.
    fn sh(&self, script: &str) -> Output {
        let bin = Path::new(env!("CARGO_BIN_EXE_astra")).parent().unwrap();
        let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
        Command::new("sh")
            .args(["-c", script])
            .env("PATH", path)
            .env("ASTRAEUS_API", &self.env["ASTRAEUS_API"])
            .env("ASTRAEUS_TOKEN", &self.env["ASTRAEUS_TOKEN"])
            .env("XDG_CONFIG_HOME", self.dir.path().join("config"))
            .output()
            .unwrap()
    }

    /// Waits until `astra astraeus runs ARGS` shows exactly these rows (name, state, reason).
    async fn wait_runs(&self, args: &[&str], rows: &[(&str, &str, &str)]) -> String {
        let mut full = vec!["astraeus", "runs"];
        full.extend_from_slice(args);
        let want: Vec<String> =
            rows.iter().map(|(n, s, r)| format!("{n:<30}{:<14}{s:<12}{r}", "main")).collect();
        self.eventually(&format!("astra {full:?} shows {want:#?}"), |dev| {
            let text = dev.ok(&full);
            let got: Vec<&str> = text.lines().skip(1).collect();
            (got == want).then_some(text)
        })
        .await
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        let _ = Command::new("kill").arg("-INT").arg(self.child.id().to_string()).status();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The URL of the test's database on the server that `DATABASE_URL` names.
fn database_url(pool: &PgPool) -> String {
    let base = std::env::var("DATABASE_URL").expect("DATABASE_URL is set (. scripts/postgres.sh)");
    let database = pool.connect_options().get_database().expect("a test database").to_owned();
    let mut url = reqwest::Url::parse(&base).expect("DATABASE_URL is a URL");
    url.set_path(&format!("/{database}"));
    url.to_string()
}

/// The recipe's drive with a local fill that waits for `go` in its copy before writing the marker,
/// so the test sees the fill Running and the run that needs it Pending.
fn gated_drive() -> Value {
    let script = "set -e; mkdir -p /drive/food101/data; echo x > /drive/food101/data/a.parquet; \
                  echo /drive/food101; for i in $(seq 1 600); do [ -e /drive/go ] && break; sleep 0.1; done; \
                  touch /drive/.astralyx-filled";
    json!({
        "metadata": {"name": "food101", "labels": {"dataset": "food101"}},
        "spec": {
            "sources": [{"node_scope": "placed", "path": "", "mount_path": "/data", "mode": "ReadOnly"}],
            "size_hint_bytes": 1000000,
            "evictable": true,
            "fill": {"template": {
                "image": "busybox:1.36", "command": "sh", "args": ["-c", script],
                "requested_resources": {"cpu_cores": 1, "memory_bytes": 268435456u64}
            }}
        }
    })
}

fn example(name: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("examples").join(name)).unwrap()
}

#[sqlx::test(migrations = false)]
async fn the_recipes_runs_logs_and_delete_lines_print_what_the_recipe_shows(pool: PgPool) {
    let dev = Dev::start(&pool).await;
    let drive = serde_json::to_string(&gated_drive()).unwrap();
    assert_eq!(dev.astra_with(&["astraeus", "apply", "-f", "-"], &drive, &[]).status.code(), Some(0));
    let applied = dev.ok(&["astraeus", "apply", "-f", "examples/inspect.json"]);
    assert_eq!(applied, "run inspect-food101 created\n");

    // Step 3: the fill Running above the run that waits for it.
    let runs = dev
        .wait_runs(
            &[],
            &[
                ("fill-food101-gpu-01", "Running", "1 of 1 workers running"),
                ("inspect-food101", "Pending", "Waiting for workers to start"),
            ],
        )
        .await;
    assert_eq!(runs.lines().next(), Some(HEADER));
    // The agent ships a worker's output every so often: the line comes, a moment later.
    dev.eventually("the fill's logs end with /drive/food101", |dev| {
        let tail = dev.sh("astra astraeus logs fill-food101-gpu-01-0 | tail -n 3");
        assert!(tail.status.success(), "{}", stderr(&tail));
        let text = String::from_utf8_lossy(&tail.stdout).into_owned();
        (text.lines().last() == Some("/drive/food101")).then_some(())
    })
    .await;
    let worker = dev.json(&["astraeus", "get", "worker", "inspect-food101-0", "-o", "json"]).unwrap();
    assert_eq!(worker["status"]["reason"], "Waiting for drive default.food101 to be filled on gpu-01");

    // The fill writes its marker; the run starts and ends.
    let folder = dev.json(&["astraeus", "get", "drive", "food101", "--json"]).unwrap()["copies"][0]["folder"]
        .as_str()
        .expect("a copy on gpu-01")
        .to_owned();
    std::fs::write(Path::new(&folder).join("go"), "").unwrap();
    let waited = dev.ok(&[
        "astraeus",
        "wait",
        "run",
        "inspect-food101",
        "--for",
        "state=Completed",
        "--timeout",
        "60s",
    ]);
    assert_eq!(waited, "run inspect-food101 is Completed\n");
    let logs = dev.ok(&["astraeus", "logs", "inspect-food101-0"]);
    let lines: Vec<&str> = logs.lines().collect();
    assert!(lines[0].ends_with("/data/food101"), "{logs}");
    assert!(lines.contains(&"a.parquet"), "{logs}");
    // busybox's own words: the run's image, pulled through the test registry's docker.io mirror.
    // busybox's own words on stderr, then the script's on stdout: each stream keeps its order,
    // the two may interleave (conmon reads them from two pipes).
    let mut last = lines[lines.len() - 2..].to_vec();
    last.sort();
    assert_eq!(last, ["read-only, as asked", "touch: /data/should-fail: Read-only file system"], "{logs}");
    // The machine lists the image it pulled for the run.
    let machine = dev.ok(&["astraeus", "describe", "machine", "gpu-01"]);
    let images = machine.split("Images:").nth(1).unwrap_or_default();
    assert!(images.contains("docker.io/library/busybox:1.36"), "{machine}");

    // Step 4: the same run under another name, then every run, most recently changed first.
    let again = example("inspect.json").replace("\"inspect-food101\"", "\"inspect-food101-2\"");
    let out = dev.astra_with(&["astraeus", "apply", "-f", "-"], &again, &[]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "run inspect-food101-2 created\n");
    dev.ok(&["astraeus", "wait", "run", "inspect-food101-2", "--for", "state=Completed", "--timeout", "60s"]);
    let all = dev
        .wait_runs(
            &["--all"],
            &[
                ("inspect-food101-2", "Completed", "All workers completed"),
                ("inspect-food101", "Completed", "All workers completed"),
                ("fill-food101-gpu-01", "Completed", "All workers completed"),
            ],
        )
        .await;
    assert_eq!(all.lines().next(), Some(HEADER));
    assert_eq!(dev.ok(&["astraeus", "runs"]), format!("{HEADER}\n"));

    // JSON is the API's object, for jq; apply leaves what exists alone.
    let name = dev.sh("astra astraeus get run inspect-food101 -o json | jq -r .metadata.name");
    assert_eq!(String::from_utf8_lossy(&name.stdout), "inspect-food101\n", "{}", stderr(&name));
    let again = dev.ok(&["astraeus", "apply", "-f", "examples/inspect.json"]);
    assert_eq!(again, "run inspect-food101 unchanged (exists)\n");
    let described = dev.ok(&["astraeus", "describe", "drive", "food101"]);
    assert!(described.contains("gpu-01") && described.contains("Complete"), "{described}");
    let drives = dev.ok(&["astraeus", "drives"]);
    assert!(drives.contains("1 complete"), "{drives}");
    let described = dev.ok(&["astraeus", "describe", "machine", "gpu-01"]);
    let copy = described.lines().find(|l| l.trim_start().starts_with("food101")).unwrap_or_default();
    assert!(copy.contains("Complete"), "{described}");
    assert!(described.contains("Workers:\n  <none>\n"), "nothing runs there now: {described}");
    let transfers = described.lines().find(|l| l.starts_with("Peer transfers")).unwrap_or_default();
    assert!(transfers.ends_with("no limit set"), "{described}");
    // An organisation admin bounds its peer transfers: a limit left out stays as it was.
    fn limit<'a>(args: &[&'a str]) -> Vec<&'a str> {
        [&["astraeus", "limit-transfers", "gpu-01"], args].concat()
    }
    let set = dev.ok(&limit(&["--upload-bytes-per-second", "100000000"]));
    assert_eq!(set.trim(), "gpu-01 sends 100.0 MB/s, receives no limit");
    let set = dev.ok(&limit(&["--download-bytes-per-second", "2500000000"]));
    assert_eq!(set.trim(), "gpu-01 sends 100.0 MB/s, receives 2.5 GB/s");
    let refused = dev.astra(&limit(&["--download-bytes-per-second", "5"]));
    assert!(!refused.status.success(), "below the floor");
    assert!(stderr(&refused).contains("download_bytes_per_second"), "{}", stderr(&refused));
    let described = dev.ok(&["astraeus", "describe", "machine", "gpu-01"]);
    let transfers = described.lines().find(|l| l.starts_with("Peer transfers")).unwrap_or_default();
    assert!(transfers.ends_with("sends 100.0 MB/s, receives 2.5 GB/s"), "{described}");
    let set = dev.ok(&limit(&["--upload-bytes-per-second", "none", "--download-bytes-per-second", "none"]));
    assert_eq!(set.trim(), "gpu-01 no limit set");
    // A drive holds its first 100 users; describe lists the rest too. These 101 ask for more
    // GPUs than gpu-01 has, so they stay Pending.
    let queue = dev.sh("jq '.metadata.name = \"queue\" | .spec.replicas = 101 \
             | .spec.task_template.requested_resources.gpus = 64' examples/inspect.json \
         | astra astraeus apply -f -");
    assert!(queue.status.success(), "{}", stderr(&queue));
    let described = dev.ok(&["astraeus", "describe", "drive", "food101"]);
    assert!(described.contains("queue-0 ") && described.contains("queue-100 "), "{described}");
    // So does a run its first 100 workers.
    let described = dev.ok(&["astraeus", "describe", "run", "queue"]);
    assert!(described.contains("queue-99 ") && described.contains("queue-100 "), "{described}");
    let listed = dev.ok(&["astraeus", "workers", "queue", "-o", "name"]);
    assert_eq!(listed.lines().count(), 101, "{listed}");
    assert_eq!(dev.ok(&["astraeus", "delete", "queue"]), "queue deleted\n");
    let described = dev.ok(&["astraeus", "describe", "run", "inspect-food101"]);
    assert!(described.contains("inspect-food101-0") && described.contains("Events:"), "{described}");

    // Step 6: clean up.
    assert_eq!(dev.ok(&["astraeus", "delete", "inspect-food101"]), "inspect-food101 deleted\n");
    assert_eq!(dev.ok(&["astraeus", "delete", "inspect-food101-2"]), "inspect-food101-2 deleted\n");
    let names = dev.ok(&["astraeus", "runs", "--all", "-o", "name"]);
    assert_eq!(names, "run/fill-food101-gpu-01\n");
}

#[sqlx::test(migrations = false)]
async fn failures_print_the_apis_message_and_exit_non_zero(pool: PgPool) {
    let dev = Dev::start(&pool).await;

    // A wrong token: the API's 401 message, exit 1, and no Rust in sight.
    let out = dev.astra_with(&["astraeus", "runs"], "", &[("ASTRAEUS_TOKEN", "not-a-token")]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.starts_with("error: the token is not valid"), "{err}");
    assert!(!err.contains("panicked") && !err.contains("Api {"), "{err}");

    // A missing object names itself; a usage error exits 2.
    let out = dev.astra(&["astraeus", "get", "run", "nope"]);
    assert_eq!((out.status.code(), stderr(&out)), (Some(1), "error: run nope not found\n".into()));
    assert_eq!(
        dev.astra(&["astraeus", "wait", "run", "x", "--for", "state=Sleeping"]).status.code(),
        Some(2)
    );
    assert_eq!(dev.astra(&["astraeus", "frobnicate"]).status.code(), Some(2));

    // A run that fits nowhere stays Pending: waiting for it to complete times out.
    let big = json!({"metadata": {"name": "too-big"}, "spec": {"task_template": {
        "image": "busybox:1.36", "command": "true",
        "requested_resources": {"cpu_cores": 4000, "memory_bytes": 268435456u64}}}});
    dev.astra_with(&["astraeus", "apply", "-f", "-"], &big.to_string(), &[]);
    let out =
        dev.astra(&["astraeus", "wait", "run", "too-big", "--for", "state=Completed", "--timeout", "2s"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).starts_with("error: timed out after 2s waiting for run too-big to be Completed"),
        "{}",
        stderr(&out)
    );

    // A run that fails is not the state asked for.
    let fails = json!({"metadata": {"name": "fails"}, "spec": {"task_template": {
        "image": "busybox:1.36", "command": "sh", "args": ["-c", "exit 3"],
        "requested_resources": {"cpu_cores": 1, "memory_bytes": 268435456u64}}}});
    dev.astra_with(&["astraeus", "apply", "-f", "-"], &fails.to_string(), &[]);
    let out =
        dev.astra(&["astraeus", "wait", "run", "fails", "--for", "state=Completed", "--timeout", "60s"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).starts_with("error: run fails ended Failed"), "{}", stderr(&out));
}

#[sqlx::test(migrations = false)]
async fn a_stored_login_is_private_and_the_environment_wins_over_it(pool: PgPool) {
    let dev = Dev::start(&pool).await;
    let token = dev.env["ASTRAEUS_TOKEN"].clone();
    let unset = [("ASTRAEUS_TOKEN", "")];

    let out = dev.astra_with(&["auth", "login", "--with-token"], &format!("{token}\n"), &unset);
    assert!(out.status.success(), "{}", stderr(&out));
    let file = dev.dir.path().join("config/astra/config.json");
    assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);

    // The stored token works, and status never prints it.
    let out = dev.astra_with(&["astraeus", "runs"], "", &unset);
    assert_eq!(String::from_utf8_lossy(&out.stdout), format!("{HEADER}\n"), "{}", stderr(&out));
    let status = dev.astra_with(&["auth", "status"], "", &unset);
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(status.status.success() && text.contains("default") && text.contains("admin"), "{text}");
    assert!(!text.contains(&token));

    // ASTRAEUS_TOKEN wins over the stored login.
    let out = dev.astra_with(&["astraeus", "runs"], "", &[("ASTRAEUS_TOKEN", "wrong")]);
    assert_eq!(out.status.code(), Some(1));

    let completion = dev.ok(&["completion", "bash"]);
    assert!(completion.contains("astra"), "{completion}");
}
