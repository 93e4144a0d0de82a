//! End to end: the real `astraeus serve` and `astraeus agent` binaries over a fresh database per
//! test, workers run as podman containers of busybox from the tests' own registry.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use astraeus::agent::client::Client;
use astraeus::domain::Name;
use astraeus::domain::quantity::CpuCores;
use astraeus::protocol::{Capacity, JoinRequest, JoinResponse};
use common::*;
use reqwest::{Method, StatusCode};
use serde_json::Value;
use sqlx::PgPool;
use tempfile::TempDir;

/// Grants the workspace a host folder and creates drive `shared-data` over `<folder>/ds`
/// (`node_scope: shared`, mounted at /data, ReadOnly), holding `file`. Returns the folder.
async fn shared_drive(api: &Api) -> TempDir {
    let host = open_tempdir();
    let ds = host.path().join("ds");
    std::fs::create_dir(&ds).unwrap();
    // Workers run as their workspace's own host user ids: a folder they may write to is one
    // that those ids (or everyone) may write to.
    std::fs::set_permissions(&ds, std::fs::Permissions::from_mode(0o777)).unwrap();
    std::fs::write(ds.join("file"), "shard-0 of shared-data\n").unwrap();
    api.grant_host_paths(&[host.path()]).await;
    api.create_drive(&json!({
        "metadata": {"name": "shared-data"},
        "spec": {"sources": [{
            "node_scope": "shared", "path": ds, "mount_path": "/data", "mode": "ReadOnly"
        }]}
    }))
    .await;
    host
}

/// A run of `sh -c script` that mounts drives as `refs` says.
fn run_mounting(name: &str, script: &str, refs: Value) -> Value {
    let mut run = sh_run(name, script);
    run["spec"]["task_template"]["datavolume_refs"] = refs;
    run
}

/// Waits until the worker runs and its process (found by a command line unique to the test)
/// is up on the host.
async fn wait_running(api: &Api, worker: &str, needle: &str) -> Value {
    let running = api.wait_worker(worker, "Running").await;
    eventually(&format!("a process `{needle}` runs"), || async move {
        if process_running(needle) { Ok(()) } else { Err("no such process".into()) }
    })
    .await;
    running
}

async fn wait_gone(needle: &str) {
    eventually(&format!("no process `{needle}` is left"), || async move {
        let found: Vec<String> = command_lines().into_iter().filter(|c| c.contains(needle)).collect();
        if found.is_empty() { Ok(()) } else { Err(format!("{found:?}")) }
    })
    .await;
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn an_echo_run_completes_on_the_agent_and_its_logs_hold_the_output(pool: PgPool) {
    let cluster = Cluster::start(&pool).await;
    let api = &cluster.api;
    api.create_run(&sh_run("hello", "echo hello")).await;

    let run = api.wait_run_ended("hello").await;
    assert_eq!(run["status"]["state"], "Completed", "{run}");
    assert_eq!(run["status"]["reason"], "All workers completed");
    let worker = api.worker("hello-0").await;
    assert_eq!(worker["status"]["state"], "Completed", "{worker}");
    assert_eq!(worker["status"]["machine"], "gpu-01");
    assert_eq!(worker["status"]["exit_code"], 0);
    assert_eq!(api.logs("hello-0").await, "hello\n");
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_command_that_exits_3_fails_its_run_with_the_exit_code(pool: PgPool) {
    let cluster = Cluster::start(&pool).await;
    let api = &cluster.api;
    api.create_run(&sh_run("three", "exit 3")).await;

    let run = api.wait_run_ended("three").await;
    assert_eq!(run["status"]["state"], "Failed", "{run}");
    assert_eq!(run["status"]["reason"], "worker three-0 failed: exited with code 3");
    let worker = api.worker("three-0").await;
    assert_eq!(worker["status"]["state"], "Failed");
    assert!(worker["status"]["reason"].as_str().unwrap().contains("exited with code 3"), "{worker}");
    assert_eq!(worker["status"]["exit_code"], 3);
    assert_eq!(worker["status"]["machine"], "gpu-01");
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_worker_past_its_time_limit_fails_with_a_reason_naming_the_limit(pool: PgPool) {
    let cluster = Cluster::start(&pool).await;
    let api = &cluster.api;
    let mut run = sh_run("slow", "sleep 30.201");
    run["spec"]["task_template"]["time_limit_seconds"] = json!(2);
    api.create_run(&run).await;

    let run = api.wait_run_ended("slow").await;
    assert_eq!(run["status"]["state"], "Failed", "{run}");
    assert!(run["status"]["reason"].as_str().unwrap().contains("time limit"), "{run}");
    let worker = api.worker("slow-0").await;
    assert_eq!(worker["status"]["reason"], "exceeded its time limit of 2s");
    assert_eq!(worker["status"]["exit_code"], Value::Null);
    wait_gone("sleep 30.201").await;
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_drive_mounted_read_only_refuses_writes_and_read_write_lets_them_land_on_the_host(pool: PgPool) {
    let cluster = Cluster::start(&pool).await;
    let api = &cluster.api;
    let host = shared_drive(api).await;
    let ds = host.path().join("ds");

    let script = "cat /data/file && touch /data/should-fail || echo 'read-only, as asked'";
    api.create_run(&run_mounting("look", script, json!([{"name": "shared-data"}]))).await;
    let run = api.wait_run_ended("look").await;
    assert_eq!(run["status"]["state"], "Completed", "{run}");
    let logs = api.logs("look-0").await;
    assert!(logs.contains("shard-0 of shared-data"), "{logs}");
    assert!(logs.contains("Read-only file system"), "{logs}");
    assert!(logs.contains("read-only, as asked"), "{logs}");
    assert!(!ds.join("should-fail").exists());

    let refs = json!([{"name": "shared-data", "mode": "ReadWrite"}]);
    api.create_run(&run_mounting("write", "echo written-by-worker > /data/from-worker", refs)).await;
    let run = api.wait_run_ended("write").await;
    assert_eq!(run["status"]["state"], "Completed", "{run}; logs: {}", api.logs("write-0").await);
    assert_eq!(std::fs::read_to_string(ds.join("from-worker")).unwrap(), "written-by-worker\n");
}

/// The server keeps the drives that assignments name in memory; a drive deleted and made again
/// under the same name is read anew, so the next worker mounts the new drive's folder.
#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_drive_made_again_under_its_name_is_what_the_next_worker_mounts(pool: PgPool) {
    let cluster = Cluster::start(&pool).await;
    let api = &cluster.api;
    let host = open_tempdir();
    for folder in ["old", "new"] {
        std::fs::create_dir(host.path().join(folder)).unwrap();
        std::fs::write(host.path().join(folder).join("file"), format!("the {folder} folder\n")).unwrap();
    }
    api.grant_host_paths(&[host.path()]).await;
    let drive = |folder: &str| {
        json!({
            "metadata": {"name": "shared-data"},
            "spec": {"sources": [{
                "node_scope": "shared", "path": host.path().join(folder), "mount_path": "/data",
                "mode": "ReadOnly"
            }]}
        })
    };
    let refs = json!([{"name": "shared-data"}]);

    api.create_drive(&drive("old")).await;
    api.create_run(&run_mounting("before", "cat /data/file", refs.clone())).await;
    assert_eq!(api.wait_run_ended("before").await["status"]["state"], "Completed");
    assert!(api.logs("before-0").await.contains("the old folder"));

    let deleted = api.delete("/drives/shared-data").await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT, "{}", deleted.text);
    api.create_drive(&drive("new")).await;
    api.create_run(&run_mounting("after", "cat /data/file", refs)).await;
    let run = api.wait_run_ended("after").await;
    let logs = api.logs("after-0").await;
    assert_eq!(run["status"]["state"], "Completed", "{run}; logs: {logs}");
    assert!(logs.contains("the new folder"), "the worker mounted the deleted drive's folder: {logs}");
}

/// A run is Failed as soon as one worker fails, while another may still run: that worker still
/// uses the drive it mounts, which lists it and refuses to be deleted under it.
#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_worker_still_running_in_a_failed_run_keeps_its_drive_in_use(pool: PgPool) {
    let cluster = Cluster::start(&pool).await;
    let api = &cluster.api;
    let _host = shared_drive(api).await;
    // Whichever worker makes the folder first fails at once; the other keeps running.
    let script = "if mkdir /data/first; then exit 3; fi; sleep 30.307";
    let mut run = run_mounting("pair", script, json!([{"name": "shared-data", "mode": "ReadWrite"}]));
    run["spec"]["replicas"] = json!(2);
    api.create_run(&run).await;

    let run = api.wait_run_ended("pair").await;
    assert_eq!(run["status"]["state"], "Failed", "{run}");
    let running = if api.worker("pair-0").await["status"]["state"] == "Failed" { "pair-1" } else { "pair-0" };
    wait_running(api, running, "sleep 30.307").await;

    let drive = api.get("/drives/shared-data").await.expect(StatusCode::OK);
    let used_by = drive["used_by"].as_array().cloned().unwrap_or_default();
    assert_eq!(used_by.len(), 1, "{drive}");
    assert_eq!(used_by[0]["name"], running, "{drive}");
    assert_eq!(used_by[0]["run"], "pair");
    assert_eq!(used_by[0]["state"], "Running");
    let refused = api.delete("/drives/shared-data").await;
    assert_eq!(refused.status, StatusCode::CONFLICT, "{}", refused.text);
    assert!(refused.text.contains(&format!("worker {running}")), "{}", refused.text);

    api.delete_run("pair").await;
    wait_gone("sleep 30.307").await;
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_sub_path_through_a_symlink_out_of_the_drive_is_refused_before_the_worker_runs(pool: PgPool) {
    let cluster = Cluster::start(&pool).await;
    let api = &cluster.api;
    let host = shared_drive(api).await;
    std::os::unix::fs::symlink("/etc", host.path().join("ds/escape")).unwrap();

    let refs = json!([{"name": "shared-data", "sub_path": "escape", "mount_path": "/x"}]);
    api.create_run(&run_mounting("sneaky", "echo the-worker-ran; cat /x/hostname", refs)).await;
    let run = api.wait_run_ended("sneaky").await;
    assert_eq!(run["status"]["state"], "Failed", "{run}");
    let worker = api.worker("sneaky-0").await;
    let reason = worker["status"]["reason"].as_str().unwrap();
    assert!(reason.contains("symbolic link"), "{worker}");
    assert!(run["status"]["reason"].as_str().unwrap().contains("symbolic link"), "{run}");
    // It never started: no start time, no output.
    assert_eq!(worker["status"]["started_at"], Value::Null, "{worker}");
    assert_eq!(api.logs("sneaky-0").await, "");
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_secret_reaches_the_worker_as_environment_and_nowhere_else(pool: PgPool) {
    const VALUE: &str = "s3cr3t-value-123";
    let cluster = Cluster::start(&pool).await;
    let api = &cluster.api;
    let mut seen = Vec::new();
    let created =
        api.post("/secrets", &json!({"metadata": {"name": "hf"}, "data": {"HF_TOKEN": VALUE}})).await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.text);
    seen.push(created);
    // The script compares against the value in two quoted halves, so the value itself is not
    // part of the run's spec (which responses do show).
    let script = "test \"$HF_TOKEN\" = 's3cr3t-''value-123' && echo secret-ok";
    let mut run = sh_run("uses-secret", script);
    run["spec"]["task_template"]["secret_refs"] = json!([{"name": "hf"}]);
    let submitted = api.post("/runs", &run).await;
    assert_eq!(submitted.status, StatusCode::CREATED, "{}", submitted.text);
    seen.push(submitted);

    let run = api.wait_run_ended("uses-secret").await;
    assert_eq!(run["status"]["state"], "Completed", "{run}");
    let logs = api.logs("uses-secret-0").await;
    assert_eq!(logs, "secret-ok\n");

    for path in [
        "/runs/uses-secret",
        "/runs?all=true",
        "/runs/uses-secret/workers",
        "/workers/uses-secret-0",
        "/workers/uses-secret-0/logs",
        "/secrets/hf",
        "/secrets",
    ] {
        let reply = api.get(path).await;
        assert_eq!(reply.status, StatusCode::OK, "{path}: {}", reply.text);
        seen.push(reply);
    }
    assert_eq!(seen[seen.len() - 2].json()["keys"], json!(["HF_TOKEN"]), "GET /secrets/hf shows the keys");
    for reply in &seen {
        assert!(!reply.text.contains(VALUE), "a response holds the secret: {}", reply.text);
    }
    // The children log at debug level (the server's SQL statements included), and still not
    // the value.
    assert!(cluster.server.log_text().contains("DEBUG"), "the server logs at debug level");
    assert!(cluster.agents[0].proc.log_text().contains("uses-secret-0"), "the agent logs the worker");
    for proc in std::iter::once(&cluster.server).chain([&cluster.agents[0].proc]) {
        let log = proc.log_text();
        let leaks: Vec<&str> = log.lines().filter(|l| l.contains(VALUE)).collect();
        assert!(leaks.is_empty(), "{}'s log holds the secret: {leaks:?}", proc.name);
    }
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_machine_credential_opens_only_its_own_machines_agent_api(pool: PgPool) {
    let cluster = Cluster::start(&pool).await;
    let api = &cluster.api;
    let mut run = sh_run("busy", "sleep 300.701");
    run["spec"]["task_template"]["requested_resources"]["node_selection"] =
        json!({"mode": "Exact", "names": ["gpu-01"]});
    api.create_run(&run).await;
    let before = wait_running(api, "busy-0", "sleep 300.701").await;
    let uid = before["metadata"]["uid"].as_str().unwrap().to_owned();

    // Machine gpu-02 joins by hand, as an agent would.
    let join = join_request("gpu-02", api.join_token().await);
    let joined =
        api.raw(Method::POST, "/agent/v1/join", None, Some(&serde_json::to_value(&join).unwrap())).await;
    assert_eq!(joined.status, StatusCode::OK, "{}", joined.text);
    let joined: JoinResponse = serde_json::from_str(&joined.text).unwrap();
    assert_eq!(joined.machine, "gpu-02");
    let credential = joined.credential.as_str();

    // It opens no user API.
    let drives = api.raw(Method::GET, "/api/v1/drives", Some(credential), None).await;
    assert_eq!(drives.status, StatusCode::UNAUTHORIZED, "{}", drives.text);

    // It cannot speak for another machine's worker.
    for state in ["Completed", "Failed", "Running"] {
        let report = json!({"state": state, "exit_code": 0, "reason": "forged"});
        let path = format!("/agent/v1/workers/{uid}/status");
        let answer = api.raw(Method::POST, &path, Some(credential), Some(&report)).await;
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.text);
        assert_eq!(answer.json(), json!({"accepted": false}), "{state}");
    }
    let logs = json!({"lines": [{"stream": "stdout", "line": "forged line"}]});
    let path = format!("/agent/v1/workers/{uid}/logs");
    let answer = api.raw(Method::POST, &path, Some(credential), Some(&logs)).await;
    assert_eq!(answer.json(), json!({"accepted": false}));
    let after = api.worker("busy-0").await;
    assert_eq!(after["status"], before["status"]);
    assert_eq!(api.run("busy").await["status"]["state"], "Running");
    assert!(!api.logs("busy-0").await.contains("forged"));

    // Its own agent API answers it; a user token does not open the agent API.
    let own = api.raw(Method::GET, "/agent/v1/assignments", Some(credential), None).await;
    assert_eq!(own.status, StatusCode::OK, "{}", own.text);
    assert_eq!(own.json()["workers"], json!([]));
    let user = api.raw(Method::GET, "/agent/v1/assignments", Some(&api.token), None).await;
    assert_eq!(user.status, StatusCode::UNAUTHORIZED, "{}", user.text);

    api.delete_run("busy").await;
    wait_gone("sleep 300.701").await;
}

/// What an agent on a 1-core machine `name` sends to join.
fn join_request(name: &str, join_token: String) -> JoinRequest {
    JoinRequest {
        join_token,
        name: Name::parse(name).unwrap(),
        pool: Name::parse("default").unwrap(),
        labels: Default::default(),
        transports: vec![],
        capacity: Capacity { cpu_cores: CpuCores::try_from(1.0).unwrap(), memory_bytes: 1 << 30, gpus: 0 },
        data_location: None,
    }
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn an_agent_holding_the_latest_assignments_hears_not_modified_until_they_change(pool: PgPool) {
    let cluster = Cluster::start(&pool).await;
    let api = &cluster.api;
    let mut agent = Client::new(&api.base).unwrap();
    let joined = agent.join(&join_request("gpu-02", api.join_token().await)).await.unwrap();

    let first = agent.assignments(0, false, 0).await.unwrap().expect("the whole answer when none is held");
    assert!(first.workers.is_empty());
    assert_eq!(first.data_location, None);
    // Held and unchanged: not modified, at once and after waiting for a change that does not come.
    assert!(agent.assignments(first.version, true, 0).await.unwrap().is_none());
    assert!(agent.assignments(first.version, true, 1).await.unwrap().is_none());
    // Not held: the whole answer again, however current the version.
    let again = agent.assignments(first.version, false, 0).await.unwrap().expect("the whole answer");
    assert_eq!(again.version, first.version);

    // The tag travels as an HTTP entity tag.
    let url = format!("{}/agent/v1/assignments?version={}", api.base, first.version);
    let tag = format!("\"{}\"", first.version);
    let get = |held: Option<&str>| {
        let mut request = api.client.get(&url).bearer_auth(&joined.credential);
        if let Some(tag) = held {
            request = request.header("if-none-match", tag);
        }
        request.send()
    };
    let not_modified = get(Some(&tag)).await.unwrap();
    assert_eq!(not_modified.status(), StatusCode::NOT_MODIFIED);
    assert_eq!(not_modified.headers()["etag"], tag.as_str());
    assert!(not_modified.bytes().await.unwrap().is_empty());
    let other = get(Some("\"0\"")).await.unwrap();
    assert_eq!(other.status(), StatusCode::OK);
    assert_eq!(other.headers()["etag"], tag.as_str());

    // A change answers a held version with the whole answer, holding the change.
    api.confirm_data_location("gpu-02", "/srv/astraeus").await;
    let changed =
        agent.assignments(first.version, true, 0).await.unwrap().expect("the answer after a change");
    assert!(changed.version > first.version);
    assert_eq!(changed.data_location.as_deref(), Some("/srv/astraeus"));
    assert_eq!(get(Some(&tag)).await.unwrap().status(), StatusCode::OK);
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_waiting_long_poll_is_answered_when_its_version_moves_not_when_its_wait_ends(pool: PgPool) {
    let cluster = Cluster::start(&pool).await;
    let api = &cluster.api;
    let mut agent = Client::new(&api.base).unwrap();
    agent.join(&join_request("gpu-02", api.join_token().await)).await.unwrap();
    let first = agent.assignments(0, false, 0).await.unwrap().expect("the whole answer");

    // Each poll waits up to 30 s; the change comes a moment after it starts.
    let poll = |agent: Client, version: i64| {
        tokio::spawn(async move {
            let started = std::time::Instant::now();
            let answer = agent.assignments(version, true, 30).await.unwrap();
            (answer, started.elapsed())
        })
    };
    let waiting = poll(agent.clone(), first.version);
    tokio::time::sleep(Duration::from_millis(500)).await;
    api.confirm_data_location("gpu-02", "/srv/astraeus").await;
    let (answer, waited) = waiting.await.unwrap();
    let moved = answer.expect("the answer after the data location was confirmed");
    assert_eq!(moved.data_location.as_deref(), Some("/srv/astraeus"));
    assert!(moved.version > first.version);
    assert!(waited < Duration::from_secs(20), "answered only when its wait ended, after {waited:?}");

    // The version heard with that wake-up is held: the next poll waits, and is answered when
    // the version moves again (here, by a bump with nothing else changed).
    let waiting = poll(agent.clone(), moved.version);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!waiting.is_finished(), "a poll holding the latest version waits");
    let machine = astraeus::store::machines::by_name(&pool, None, "gpu-02").await.unwrap().remove(0);
    astraeus::store::machines::touch_assignments(&pool, &[machine.id]).await.unwrap();
    let (answer, waited) = waiting.await.unwrap();
    let again = answer.expect("the answer after the bump");
    assert!(again.version > moved.version);
    assert!(waited < Duration::from_secs(20), "answered only when its wait ended, after {waited:?}");
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_killed_agent_makes_its_machine_not_ready_and_fails_its_worker(pool: PgPool) {
    let mut cluster = Cluster::start(&pool).await;
    cluster.api.create_run(&sh_run("orphan", "sleep 300.801")).await;
    wait_running(&cluster.api, "orphan-0", "sleep 300.801").await;

    cluster.agent("gpu-01").proc.kill();

    let api = &cluster.api;
    let machine = api.wait_machine("gpu-01", "NotReady").await;
    assert_eq!(machine["status"]["allocated"]["cpu_cores"], 0.0, "{machine}");
    let worker = api.wait_worker("orphan-0", "Failed").await;
    let reason = worker["status"]["reason"].as_str().unwrap();
    assert!(reason.contains("gpu-01"), "{worker}");
    let run = api.run("orphan").await;
    assert_eq!(run["status"]["state"], "Failed", "{run}");
    assert!(run["status"]["reason"].as_str().unwrap().contains("gpu-01"), "{run}");
    // The container outlives its agent (a restarted agent could follow it again), until the
    // agent comes back and finds its worker ended.
    assert!(process_running("sleep 300.801"));
    // It comes back with the credential it keeps, though every join token is revoked.
    let credential = cluster.agents[0].data.path().join(".agent/credential");
    assert_eq!(std::fs::metadata(&credential).unwrap().permissions().mode() & 0o777, 0o600);
    let tokens = api.get("/clusters/main/join-tokens").await.expect(StatusCode::OK);
    for t in tokens["items"].as_array().unwrap() {
        api.delete(&format!("/clusters/main/join-tokens/{}", t["id"].as_str().unwrap())).await;
    }
    cluster.restart_agent("gpu-01");
    wait_gone("sleep 300.801").await;
    cluster.api.wait_machine("gpu-01", "Ready").await;
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn deleting_a_running_run_stops_its_worker_and_frees_the_machine(pool: PgPool) {
    let cluster = Cluster::start(&pool).await;
    let api = &cluster.api;
    api.create_run(&sh_run("doomed", "sleep 300.777")).await;
    wait_running(api, "doomed-0", "sleep 300.777").await;
    assert_eq!(api.machine("gpu-01").await["status"]["allocated"]["cpu_cores"], 1.0);

    api.delete_run("doomed").await;

    wait_gone("sleep 300.777").await;
    eventually("gpu-01 has no cpu allocated", || async move {
        let machine = api.machine("gpu-01").await;
        let allocated = &machine["status"]["allocated"];
        if allocated["cpu_cores"] == 0.0 && allocated["memory_bytes"] == 0 {
            Ok(())
        } else {
            Err(allocated.to_string())
        }
    })
    .await;
    assert_eq!(api.get("/runs/doomed").await.status, StatusCode::NOT_FOUND);
    assert_eq!(api.machine("gpu-01").await["status"]["state"], "Ready");
}

/// A drive `name`, placed, filled by `sh -c fill`.
fn placed_drive(name: &str, fill: &str) -> Value {
    json!({
        "metadata": {"name": name},
        "spec": {
            "sources": [{"node_scope": "placed", "path": "", "mount_path": "/data", "mode": "ReadOnly"}],
            "size_hint_bytes": 1000,
            "fill": {"template": {"image": "busybox:1.36", "command": "sh", "args": ["-c", fill],
                "requested_resources": {"cpu_cores": 1, "memory_bytes": 268435456}}}
        }
    })
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_drive_deleted_and_created_again_never_reads_the_old_drives_copy(pool: PgPool) {
    // Grace enough for the agent to be away while the drive is made again.
    let mut cluster = Cluster::server_with_grace(&pool, 60).await;
    cluster.add_agent("gpu-01").await;
    let old = "echo old > /drive/old; touch /drive/.astralyx-filled";
    cluster.api.create_drive(&placed_drive("food101", old)).await;
    let refs = json!([{"name": "food101"}]);
    cluster.api.create_run(&run_mounting("reader", "ls /data", refs.clone())).await;
    cluster.api.wait_run_ended("reader").await;
    assert!(cluster.api.logs("reader-0").await.lines().any(|l| l == "old"));
    let copy = cluster.agent("gpu-01").data.path().join("drives/default.food101");
    assert!(copy.join(".astralyx-filled").exists());

    // The agent is away, so no heartbeat removes the old folder before the drive is back: it
    // comes back to find the whole old copy, marker and all, under the new drive's name.
    cluster.agent("gpu-01").proc.kill();
    let deleted = cluster.api.delete("/drives/food101").await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT, "{}", deleted.text);
    let new = "while [ ! -e /drive/gate ]; do sleep 0.517; done; echo new > /drive/new; \
               touch /drive/.astralyx-filled";
    cluster.api.create_drive(&placed_drive("food101", new)).await;
    cluster.api.create_run(&run_mounting("reader-again", "ls /data", refs)).await;
    cluster.restart_agent("gpu-01");

    // The new fill runs in a folder of its own: the old one is gone, and the reader waits.
    let api = &cluster.api;
    eventually("the new fill is made", || async move {
        let fill = api.get("/workers/fill-food101-gpu-01-0").await;
        if fill.status == StatusCode::OK { Ok(()) } else { Err(fill.text) }
    })
    .await;
    wait_running(api, "fill-food101-gpu-01-0", "sleep 0.517").await;
    assert!(!copy.join("old").exists() && !copy.join(".astralyx-filled").exists());
    let drive = api.get("/drives/food101").await.expect(StatusCode::OK);
    assert_eq!(drive["copies"][0]["complete"], false, "{drive}");
    assert_eq!(api.worker("reader-again-0").await["status"]["state"], "Preparing");

    std::fs::write(copy.join("gate"), "").unwrap();
    let ended = api.wait_run_ended("reader-again").await;
    assert_eq!(ended["status"]["state"], "Completed", "{ended}");
    let seen = api.logs("reader-again-0").await;
    assert!(seen.lines().any(|l| l == "new"), "{seen}");
    assert!(!seen.lines().any(|l| l == "old"), "{seen}");
    wait_gone("sleep 0.517").await;
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn an_agent_killed_mid_fill_follows_the_fill_again_and_the_copy_is_complete_only_with_its_marker(
    pool: PgPool,
) {
    // Grace enough for the agent to come back before its machine is declared lost.
    let mut cluster = Cluster::server_with_grace(&pool, 60).await;
    cluster.add_agent("gpu-01").await;
    // The fill leaves a part behind and waits for the test's gate, then says so and marks.
    let fill = "mkdir -p /drive/ds; touch /drive/ds/attempt-1; \
                while [ ! -e /drive/gate ]; do sleep 0.903; done; touch /drive/ds/attempt-2; \
                echo through the gate; touch /drive/.astralyx-filled";
    cluster
        .api
        .create_drive(&json!({
            "metadata": {"name": "slow"},
            "spec": {
                "sources": [{"node_scope": "placed", "path": "", "mount_path": "/data", "mode": "ReadOnly"}],
                "size_hint_bytes": 1000,
                "fill": {"template": {"image": "busybox:1.36", "command": "sh", "args": ["-c", fill],
                    "requested_resources": {"cpu_cores": 1, "memory_bytes": 268435456}}}
            }
        }))
        .await;
    cluster.api.create_run(&run_mounting("reader", "ls /data/ds", json!([{"name": "slow"}]))).await;
    // The fill controller makes the fill run once the reader is placed. The shell's own command
    // line holds the sleep too, so wait for the part it leaves, not for a process.
    let data = cluster.agent("gpu-01").data.path().join("drives/default.slow");
    let part = data.join("ds/attempt-1");
    eventually("the first attempt leaves its part", || async {
        if part.exists() { Ok(()) } else { Err("not yet".into()) }
    })
    .await;

    cluster.agent("gpu-01").proc.kill();
    // The fill's container goes on without its agent.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(process_running("sleep 0.903"));
    assert!(part.exists() && !data.join(".astralyx-filled").exists());
    let drive = cluster.api.get("/drives/slow").await.expect(StatusCode::OK);
    assert_eq!(drive["copies"][0]["complete"], false, "{drive}");
    assert_eq!(cluster.api.worker("reader-0").await["status"]["state"], "Preparing");

    cluster.restart_agent("gpu-01");
    // The restarted agent follows the same container: what it prints from now on is shipped.
    tokio::time::sleep(Duration::from_secs(3)).await;
    std::fs::write(data.join("gate"), "").unwrap();
    let api = &cluster.api;
    eventually("the reader completes after the fill ran again", || async move {
        let (reader, fill) = (api.worker("reader-0").await, api.worker("fill-slow-gpu-01-0").await);
        if reader["status"]["state"] == "Completed" { Ok(()) } else { Err(format!("{reader}\n{fill}")) }
    })
    .await;
    assert!(cluster.api.logs("reader-0").await.contains("attempt-2"));
    let drive = cluster.api.get("/drives/slow").await.expect(StatusCode::OK);
    assert_eq!(drive["copies"][0]["complete"], true, "{drive}");
    let fill = cluster.api.run("fill-slow-gpu-01").await;
    assert_eq!(fill["status"]["state"], "Completed", "{fill}");
    assert!(cluster.api.logs("fill-slow-gpu-01-0").await.contains("through the gate"));
    wait_gone("sleep 0.903").await;
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn an_agent_keeps_copies_only_beneath_its_own_data_location(pool: PgPool) {
    let cluster = Cluster::start(&pool).await;
    let api = &cluster.api;
    // The server (an organisation admin, or a server that lies) points the machine at the
    // host's /etc: the agent refuses, and its copies stay where they were.
    api.confirm_data_location("gpu-01", "/etc").await;
    let agent = &cluster.agents[0];
    eventually("the agent refuses the location", || async {
        let log = agent.proc.log_text();
        if log.contains("refusing the data location the server confirmed") {
            Ok(())
        } else {
            Err("not yet".into())
        }
    })
    .await;
    assert!(!std::path::Path::new("/etc/drives").exists());
    // Its own folder again is taken at once.
    let own = agent.data.path().to_str().unwrap().to_owned();
    api.confirm_data_location("gpu-01", &own).await;
    api.create_run(&sh_run("after", "echo fine")).await;
    assert_eq!(api.wait_run_ended("after").await["status"]["state"], "Completed");
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_deleted_machines_agent_stops_its_workers_and_comes_back_only_with_a_join_token(pool: PgPool) {
    let mut cluster = Cluster::start(&pool).await;
    let api = cluster.api.clone();
    api.create_run(&sh_run("busy", "sleep 300.703")).await;
    wait_running(&api, "busy-0", "sleep 300.703").await;

    assert_eq!(api.delete("/machines/gpu-01").await.status, StatusCode::NO_CONTENT);
    let failed = api.wait_run_ended("busy").await;
    assert_eq!(failed["status"]["state"], "Failed", "{failed}");
    let worker = api.worker("busy-0").await;
    assert_eq!(worker["status"]["reason"], "machine gpu-01 was deleted by an organisation admin");
    // Its agent is refused, stops the container and exits, saying why.
    wait_gone("sleep 300.703").await;
    let agent = cluster.agent("gpu-01");
    let status = agent.proc.wait_exit().await;
    assert!(!status.success());
    assert!(
        agent.proc.log_text().contains("machine gpu-01 was deleted from the cluster"),
        "{}",
        agent.proc.log_tail(20)
    );

    // Started again with a join token (as the harness starts it), it joins anew under its name.
    cluster.restart_agent("gpu-01");
    let back = api.wait_machine("gpu-01", "Ready").await;
    assert_eq!(back["status"]["data_location"]["confirmed"], false, "a new machine: {back}");
}

/// The recipe's S3 variation: a fill gets its template's `env` and the variables of its
/// `secret_refs`; no answer of the API and no log holds the secret's value.
#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_fill_gets_its_env_and_secrets_and_nothing_shows_the_secrets_value(pool: PgPool) {
    const VALUE: &str = "aws-s3cr3t-456";
    let cluster = Cluster::start(&pool).await;
    let api = &cluster.api;
    let mut seen = Vec::new();
    let body = json!({"metadata": {"name": "s3"}, "data": {"AWS_SECRET_ACCESS_KEY": VALUE}});
    let created = api.post("/secrets", &body).await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.text);
    seen.push(created);
    // The value is compared in two quoted halves, so the drive's spec does not hold it.
    let fill = "set -e; echo \"home=$HF_HOME\"; test \"$AWS_SECRET_ACCESS_KEY\" = 'aws-s3''cr3t-456'; \
                echo secret-ok; mkdir -p /drive/ds; echo from-s3 > /drive/ds/file; touch /drive/.astralyx-filled";
    let drive = json!({
        "metadata": {"name": "from-s3"},
        "spec": {
            "sources": [{"node_scope": "placed", "path": "", "mount_path": "/data", "mode": "ReadOnly"}],
            "size_hint_bytes": 1_000_000,
            "fill": {"template": {
                "image": "busybox:1.36", "command": "sh", "args": ["-c", fill],
                "env": {"HF_HOME": "/tmp/hf"},
                "secret_refs": [{"name": "s3"}],
                "requested_resources": {"cpu_cores": 1, "memory_bytes": 268435456}
            }}
        }
    });
    let made = api.post("/drives", &drive).await;
    assert_eq!(made.status, StatusCode::CREATED, "{}", made.text);
    seen.push(made);
    api.create_run(&run_mounting("reader", "cat /data/ds/file", json!([{"name": "from-s3"}]))).await;

    let reader = api.wait_run_ended("reader").await;
    assert_eq!(reader["status"]["state"], "Completed", "{reader}");
    assert_eq!(api.logs("reader-0").await, "from-s3\n");
    assert_eq!(api.logs("fill-from-s3-gpu-01-0").await, "home=/tmp/hf\nsecret-ok\n");
    for path in [
        "/drives/from-s3",
        "/drives",
        "/runs/fill-from-s3-gpu-01",
        "/runs?all=true",
        "/workers/fill-from-s3-gpu-01-0",
        "/workers/fill-from-s3-gpu-01-0/logs",
        "/secrets/s3",
    ] {
        let reply = api.get(path).await;
        assert_eq!(reply.status, StatusCode::OK, "{path}: {}", reply.text);
        seen.push(reply);
    }
    for reply in &seen {
        assert!(!reply.text.contains(VALUE), "a response holds the secret: {}", reply.text);
    }
    for proc in std::iter::once(&cluster.server).chain([&cluster.agents[0].proc]) {
        let leaks: Vec<String> =
            proc.log_text().lines().filter(|l| l.contains(VALUE)).map(str::to_owned).collect();
        assert!(leaks.is_empty(), "{}'s log holds the secret: {leaks:?}", proc.name);
    }
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn an_on_failure_worker_runs_again_in_a_new_container_on_its_machine_until_it_succeeds(pool: PgPool) {
    let cluster = Cluster::start(&pool).await;
    let api = &cluster.api;
    let host = shared_drive(api).await;
    // Each life counts itself in the drive; the first two fail, the third succeeds.
    let script = "n=$(($(cat /data/lives 2>/dev/null || echo 0) + 1)); echo $n > /data/lives; \
                  echo life $n; test $n -ge 3";
    let mut run = run_mounting("again", script, json!([{"name": "shared-data", "mode": "ReadWrite"}]));
    run["spec"]["task_template"]["restart_policy"] = json!("OnFailure");
    run["spec"]["task_template"]["restart_limit"] = json!(2);
    api.create_run(&run).await;

    let reason = "worker again-0 restarting (1 of 2) after: exited with code 1";
    eventually("the run says its worker restarts", || async {
        let run = api.run("again").await;
        if run["status"]["reason"] == reason { Ok(()) } else { Err(run["status"].to_string()) }
    })
    .await;
    // Each backoff is waited for in turn: 10 s, then 20 s.
    eventually("the worker restarts a second time", || async {
        let worker = api.worker("again-0").await;
        if worker["status"]["restarts"] == 2 { Ok(()) } else { Err(worker["status"].to_string()) }
    })
    .await;
    let run = api.wait_run_ended("again").await;
    assert_eq!(run["status"]["state"], "Completed", "{run}");
    let worker = api.worker("again-0").await;
    assert_eq!(
        (&worker["status"]["restarts"], &worker["status"]["exit_code"], &worker["status"]["machine"]),
        (&json!(2), &json!(0), &json!("gpu-01")),
        "{worker}"
    );
    assert_eq!(std::fs::read_to_string(host.path().join("ds/lives")).unwrap(), "3\n");
    assert_eq!(api.logs("again-0").await, "life 1\nlife 2\nlife 3\n");
    let events = api.get("/events?object=worker/again-0").await.expect(StatusCode::OK);
    let restarts = events["items"].as_array().unwrap().iter().filter(|e| e["reason"] == "Restarting").count();
    assert_eq!(restarts, 2, "{events}");
}

#[tokio::test]
async fn an_agent_whose_data_port_is_taken_stops_at_once_saying_so() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let data = open_tempdir();
    // No server: the port is bound before the agent joins.
    let out = std::process::Command::new(bin())
        .args(["agent", "--server", "http://127.0.0.1:9", "--join-token", "astj_x", "--name", "gpu-01"])
        .arg("--data-location")
        .arg(data.path())
        .args(["--cpus", "1", "--memory", "1073741824", "--data-listen", &addr])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&format!("cannot listen for peers on {addr} (--data-listen)")), "{stderr}");
}

#[tokio::test]
async fn an_agent_whose_data_port_certificate_cannot_be_used_stops_at_once_naming_the_flag() {
    let data = open_tempdir();
    let (cert, key) = (data.path().join("data.crt"), data.path().join("data.key"));
    std::fs::write(&cert, "").unwrap();
    std::fs::write(&key, "").unwrap();
    let agent = |tls: &[&std::ffi::OsStr]| {
        std::process::Command::new(bin())
            .args(["agent", "--server", "http://127.0.0.1:9", "--join-token", "astj_x", "--name", "gpu-01"])
            .arg("--data-location")
            .arg(data.path())
            .args(["--cpus", "1", "--memory", "1073741824", "--data-listen", "127.0.0.1:0"])
            .args(tls)
            .env_remove("ASTRAEUS_DATA_TLS_CERT")
            .env_remove("ASTRAEUS_DATA_TLS_KEY")
            .output()
            .unwrap()
    };
    let empty =
        agent(&["--data-tls-cert".as_ref(), cert.as_os_str(), "--data-tls-key".as_ref(), key.as_os_str()]);
    assert!(!empty.status.success());
    let stderr = String::from_utf8_lossy(&empty.stderr);
    let why = format!("--data-tls-cert {}: holds no PEM certificate", cert.display());
    assert!(stderr.contains(&why), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");

    let alone = agent(&["--data-tls-cert".as_ref(), cert.as_os_str()]);
    assert!(!alone.status.success());
    let stderr = String::from_utf8_lossy(&alone.stderr);
    assert!(stderr.contains("--data-tls-key"), "{stderr}");
}
