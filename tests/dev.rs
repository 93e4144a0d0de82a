//! End to end: `astraeus dev` with its own private Postgres (DATABASE_URL unset), two local
//! agents, a clean stop on Ctrl-C, and state that survives a restart unless `--fresh`.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use common::*;

/// `astraeus dev` on a free port over `state`, its output in `log`.
fn start_dev(state: &Path, log: PathBuf, fresh: bool) -> Proc {
    let mut cmd = Command::new(bin());
    cmd.arg("dev")
        .args(["--listen", &format!("127.0.0.1:{}", free_port())])
        .arg("--state-dir")
        .arg(state)
        .args(["--machines", "2", "--heartbeat-interval-seconds", "1"])
        .env("CONTAINERS_REGISTRIES_CONF", registries_conf())
        .env_remove("DATABASE_URL")
        .env_remove("ASTRAEUS_LISTEN");
    if fresh {
        cmd.arg("--fresh");
    }
    Proc::spawn("astraeus dev", &mut cmd, log)
}

/// Stops the private Postgres in `data` if it still runs when dropped (immediate shutdown), so
/// a failing test leaves no server behind.
struct PostgresGuard {
    data: PathBuf,
}

impl PostgresGuard {
    fn postmaster_pid(&self) -> Option<String> {
        let pid_file = std::fs::read_to_string(self.data.join("postmaster.pid"))
            .or_else(|_| std::fs::read_to_string(elsewhere(&self.data)?.join("data/postmaster.pid")))
            .ok()?;
        pid_file.lines().next().map(|l| l.trim().to_owned())
    }
}

impl Drop for PostgresGuard {
    fn drop(&mut self) {
        if let Some(pid) = self.postmaster_pid() {
            let _ = Command::new("kill").args(["-QUIT", &pid]).status();
        }
    }
}

/// The folder dev mode's private Postgres lives in when the `postgres` user cannot reach the
/// state dir (`<state>/postgres/elsewhere` names it), given its `data` folder in the state dir.
fn elsewhere(data: &Path) -> std::io::Result<PathBuf> {
    let named = std::fs::read_to_string(data.with_file_name("elsewhere"))?;
    Ok(PathBuf::from(named.trim()))
}

/// The variables of the `export API=… ASTRAEUS_API=… ASTRAEUS_TOKEN=…` line, once all are there.
fn parse_env(text: &str) -> Option<HashMap<String, String>> {
    let line = text.lines().find_map(|l| l.strip_prefix("export "))?;
    let vars: HashMap<String, String> = line
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    ["API", "ASTRAEUS_API", "ASTRAEUS_TOKEN"].iter().all(|k| vars.contains_key(*k)).then_some(vars)
}

/// Waits for `<state>/env` and reads its variables; fails early if dev mode exits.
async fn read_env(dev: &mut Proc, state: &Path) -> HashMap<String, String> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let text = std::fs::read_to_string(state.join("env")).unwrap_or_default();
        if let Some(vars) = parse_env(&text) {
            return vars;
        }
        if let Some(status) = dev.try_wait() {
            panic!("astraeus dev exited ({status}) before writing its env:\n{}", dev.log_tail(40));
        }
        assert!(Instant::now() < deadline, "no {}/env within 30 s:\n{}", state.display(), dev.log_tail(40));
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// A client for the API that `env` names.
fn api_of(env: &HashMap<String, String>) -> Api {
    assert_eq!(env["API"], env["ASTRAEUS_API"]);
    let base = env["API"].strip_suffix("/api/v1").expect("API ends in /api/v1");
    Api::new(base, &env["ASTRAEUS_TOKEN"])
}

/// Ctrl-C, then: exit status 0 within 30 s, and no process of the state dir left (the private
/// Postgres runs with `-D <state>/postgres/data`).
async fn interrupt(mut dev: Proc, state: &Path) {
    dev.signal("INT");
    let status = dev.wait_exit().await;
    assert!(status.success(), "astraeus dev exited with {status}:\n{}", dev.log_tail(40));
    let state = state.to_str().unwrap();
    let left: Vec<String> = command_lines().into_iter().filter(|c| c.contains(state)).collect();
    assert!(left.is_empty(), "still running after astraeus dev stopped: {left:?}");
    assert!(!Path::new(state).join("postgres/data/postmaster.pid").exists());
}

async fn run_names(api: &Api) -> Vec<String> {
    api.runs(true).await.iter().map(|r| r["metadata"]["name"].as_str().unwrap().to_owned()).collect()
}

#[tokio::test]
async fn dev_mode_runs_work_on_two_machines_stops_cleanly_and_keeps_its_state_until_fresh() {
    let root = open_tempdir();
    let state = std::fs::canonicalize(root.path()).unwrap().join("state");
    let logs = open_tempdir();
    let _postgres = PostgresGuard { data: state.join("postgres/data") };

    // First start: a private Postgres, two machines with confirmed data locations.
    let mut dev = start_dev(&state, logs.path().join("dev-1.log"), false);
    let api = api_of(&read_env(&mut dev, &state).await);
    // Dev mode confirms each data location once its machine has joined.
    for name in ["gpu-01", "gpu-02"] {
        let api = &api;
        eventually(&format!("{name} is Ready with a confirmed data location"), || async move {
            let machine = api.machines().await.into_iter().find(|m| m["metadata"]["name"] == name);
            let status = machine.map(|m| m["status"].clone()).unwrap_or_default();
            let confirmed = status["data_location"]["confirmed"] == true;
            if status["state"] == "Ready" && confirmed { Ok(()) } else { Err(status.to_string()) }
        })
        .await;
    }
    api.create_run(&sh_run("hello-dev", "echo from-dev")).await;
    let run = api.wait_run_ended("hello-dev").await;
    assert_eq!(run["status"]["state"], "Completed", "{run}");
    assert_eq!(api.logs("hello-dev-0").await, "from-dev\n");
    interrupt(dev, &state).await;

    // Again over the same state dir: the run is still there.
    std::fs::remove_file(state.join("env")).unwrap();
    let mut dev = start_dev(&state, logs.path().join("dev-2.log"), false);
    let api = api_of(&read_env(&mut dev, &state).await);
    assert!(run_names(&api).await.contains(&"hello-dev".to_owned()));
    assert_eq!(api.run("hello-dev").await["status"]["state"], "Completed");
    interrupt(dev, &state).await;

    // With --fresh it starts empty. Ctrl-C while it is still starting (its machines joining)
    // stops it just as cleanly.
    std::fs::remove_file(state.join("env")).unwrap();
    let mut dev = start_dev(&state, logs.path().join("dev-3.log"), true);
    let api = api_of(&read_env(&mut dev, &state).await);
    assert_eq!(run_names(&api).await, Vec::<String>::new());
    interrupt(dev, &state).await;
}

/// As root, with the state dir under a folder only root may enter (a clone under /root): the
/// `postgres` user cannot reach it, so the private Postgres lives in a folder of its own, found
/// again on the next start and removed by `--fresh`.
#[tokio::test]
async fn dev_mode_runs_with_its_state_where_the_postgres_user_cannot_enter() {
    use std::os::unix::fs::PermissionsExt;
    let root = tempfile::tempdir().unwrap();
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let state = std::fs::canonicalize(root.path()).unwrap().join("state");
    let logs = open_tempdir();
    let _postgres = PostgresGuard { data: state.join("postgres/data") };

    let mut dev = start_dev(&state, logs.path().join("dev-1.log"), false);
    let api = api_of(&read_env(&mut dev, &state).await);
    api.create_run(&sh_run("private-state", "echo kept")).await;
    assert_eq!(api.wait_run_ended("private-state").await["status"]["state"], "Completed");
    let home = elsewhere(&state.join("postgres/data"));
    // Only root runs Postgres as another user; anyone else keeps it in the state dir.
    let root_user = rustix::process::geteuid().is_root();
    assert_eq!(home.is_ok(), root_user, "{home:?}");
    interrupt(dev, &state).await;

    std::fs::remove_file(state.join("env")).unwrap();
    let mut dev = start_dev(&state, logs.path().join("dev-2.log"), true);
    let api = api_of(&read_env(&mut dev, &state).await);
    assert_eq!(run_names(&api).await, Vec::<String>::new());
    if let Ok(old) = home {
        assert!(!old.exists(), "--fresh removes {}", old.display());
    }
    interrupt(dev, &state).await;
    if let Ok(home) = elsewhere(&state.join("postgres/data")) {
        let left: Vec<String> =
            command_lines().into_iter().filter(|c| c.contains(home.to_str().unwrap())).collect();
        assert!(left.is_empty(), "still running after astraeus dev stopped: {left:?}");
        let _ = std::fs::remove_dir_all(home);
    }
}
