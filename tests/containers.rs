//! Workers as containers, tried as a tenant with an editor token would: the real server, agent
//! and podman, images from the tests' own registry. Each test is an attack or a limit that must
//! hold.

mod common;

use std::os::unix::fs::PermissionsExt;

use common::*;
use reqwest::StatusCode;
use serde_json::Value;
use sqlx::PgPool;
use tempfile::TempDir;

/// A folder granted to the workspace and drive `tools` over it, mounted at /tools read-only.
async fn host_drive(api: &Api) -> TempDir {
    let host = open_tempdir();
    api.grant_host_paths(&[host.path()]).await;
    api.create_drive(&json!({
        "metadata": {"name": "tools"},
        "spec": {"sources": [{
            "node_scope": "shared", "path": host.path(), "mount_path": "/tools", "mode": "ReadOnly"
        }]}
    }))
    .await;
    host
}

async fn events(api: &Api, object: &str) -> Vec<Value> {
    let reply = api.get(&format!("/events?object={object}")).await.expect(StatusCode::OK);
    reply["items"].as_array().cloned().unwrap_or_default()
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_worker_sees_its_image_and_drives_and_nothing_of_the_host(pool: PgPool) {
    let cluster = Cluster::start(&pool).await;
    let api = &cluster.api;
    let host = host_drive(api).await;
    // What a fill could leave in a copy: programs named like the host's tools, each of which
    // would leave a mark on the host if the host ever ran it.
    let mark = host.path().join("ran-on-the-host");
    let bin = host.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    for tool in ["podman", "runc", "bwrap", "conmon", "sh"] {
        let fake = bin.join(tool);
        std::fs::write(&fake, format!("#!/bin/sh\ntouch {}\nexec /bin/{tool} \"$@\"\n", mark.display()))
            .unwrap();
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let script = "for p in /usr/bin/podman /usr/lib/postgresql /root/.cargo /etc/postgresql /etc/shadow; do \
                  [ -e $p ] && echo visible $p; done; grep Cap /proc/self/status; cat /proc/self/uid_map; echo done";
    let mut run = sh_run("look", script);
    run["spec"]["task_template"]["env"] = json!({"PATH": "/tools/bin:/bin", "LD_PRELOAD": "/tools/bin/sh"});
    run["spec"]["task_template"]["datavolume_refs"] = json!([{"name": "tools"}]);
    api.create_run(&run).await;

    let run = api.wait_run_ended("look").await;
    let logs = api.logs("look-0").await;
    assert_eq!(run["status"]["state"], "Completed", "{run}\n{logs}");
    assert!(!mark.exists(), "a program of the worker's ran on the host");
    assert!(!logs.contains("visible"), "{logs}");
    assert!(logs.contains("CapEff:\t0000000000000000"), "capabilities kept: {logs}");
    // Root inside is 2^31 + 65536 × n outside: not the host's root.
    let map: Vec<&str> =
        logs.lines().find(|l| l.trim().starts_with('0')).unwrap().split_whitespace().collect();
    assert_eq!(map[0], "0");
    assert!(map[1].parse::<u64>().unwrap() >= 1 << 31, "{logs}");
    assert!(logs.ends_with("done\n"), "{logs}");
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_worker_cannot_reach_the_hosts_loopback_services(pool: PgPool) {
    let cluster = Cluster::start(&pool).await;
    let api = &cluster.api;
    // The API itself listens on the host's 127.0.0.1; 10.0.2.2 is the user-mode network's way
    // to the host, which is closed.
    let port = reqwest::Url::parse(&api.base).unwrap().port().unwrap();
    let script = format!(
        "for a in 127.0.0.1 10.0.2.2; do if echo | nc -w 2 $a {port}; then echo reached $a; \
         else echo closed $a; fi; done"
    );
    api.create_run(&sh_run("probe", &script)).await;

    let run = api.wait_run_ended("probe").await;
    let logs = api.logs("probe-0").await;
    assert_eq!(run["status"]["state"], "Completed", "{run}\n{logs}");
    assert!(logs.contains("closed 127.0.0.1") && logs.contains("closed 10.0.2.2"), "{logs}");
    assert!(!logs.contains("reached"), "{logs}");
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_worker_over_its_memory_is_killed_and_says_so(pool: PgPool) {
    let cluster = Cluster::start(&pool).await;
    let api = &cluster.api;
    let mut run = sh_run("hog", "echo start; x=$(head -c 200000000 /dev/zero | tr '\\0' a); echo ${#x}");
    run["spec"]["task_template"]["requested_resources"]["memory_bytes"] = json!(67108864);
    api.create_run(&run).await;

    let run = api.wait_run_ended("hog").await;
    assert_eq!(run["status"]["state"], "Failed", "{run}");
    let worker = api.worker("hog-0").await;
    assert_eq!(worker["status"]["reason"], "OOMKilled: used more than its 64 MiB", "{worker}");
    assert_eq!(api.logs("hog-0").await, "start\n");
    // Nothing of its container is left: no cgroup in any hierarchy.
    let uid = worker["metadata"]["uid"].as_str().unwrap().to_owned();
    eventually("the worker's cgroups are gone", || async {
        let left: Vec<_> = std::fs::read_dir("/sys/fs/cgroup")
            .unwrap()
            .flatten()
            .map(|h| h.path().join("astraeus").join(&uid))
            .chain([std::path::Path::new("/sys/fs/cgroup/astraeus").join(&uid)])
            .filter(|p| p.exists())
            .collect();
        if left.is_empty() { Ok(()) } else { Err(format!("{left:?}")) }
    })
    .await;
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn an_image_that_cannot_be_pulled_fails_its_worker_with_podmans_reason(pool: PgPool) {
    let cluster = Cluster::start(&pool).await;
    let api = &cluster.api;
    // Nothing listens on port 9 of loopback: every pull is refused at once.
    let image = "127.0.0.1:9/nope:1";
    let mut run = sh_run("nope", "true");
    run["spec"]["task_template"]["image"] = json!(image);
    api.create_run(&run).await;

    let pulling = eventually("the worker says it pulls", || async move {
        let w = api.worker("nope-0").await;
        let reason = w["status"]["reason"].as_str().unwrap_or_default().to_owned();
        if reason.starts_with("Pulling image") { Ok(reason) } else { Err(w["status"].to_string()) }
    })
    .await;
    assert_eq!(pulling, format!("Pulling image {image}"));
    assert_eq!(api.worker("nope-0").await["status"]["state"], "Preparing");
    let run = api.wait_run_ended("nope").await;
    assert_eq!(run["status"]["state"], "Failed", "{run}");
    let reason = api.worker("nope-0").await["status"]["reason"].as_str().unwrap().to_owned();
    assert!(reason.starts_with(&format!("cannot pull image {image}: ")), "{reason}");
    assert!(reason.contains("connection refused"), "{reason}");
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_malformed_image_is_refused_naming_the_field(pool: PgPool) {
    let cluster = Cluster::server_only(&pool).await;
    let mut run = sh_run("bad", "true");
    run["spec"]["task_template"]["image"] = json!("Busybox:1.36");
    let reply = cluster.api.post("/runs", &run).await;
    assert_eq!(reply.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", reply.text);
    let body = reply.json();
    assert_eq!(body["error"]["fields"][0]["path"], "spec.task_template.image", "{body}");
    assert!(cluster.api.runs(true).await.is_empty());
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn secrets_reach_the_container_but_no_command_line(pool: PgPool) {
    let cluster = Cluster::start(&pool).await;
    let api = &cluster.api;
    let value = "s3cr3t-2f9d41c7";
    api.create_secret(
        &json!({"metadata": {"name": "hf"}, "data": {"HF_TOKEN": value, "PEM": "line1\nline2"}}),
    )
    .await;
    let mut run =
        sh_run("secretive", "echo token of ${#HF_TOKEN} characters; echo \"$PEM\" | wc -l; sleep 3.313");
    run["spec"]["task_template"]["secret_refs"] = json!([{"name": "hf"}]);
    api.create_run(&run).await;
    api.wait_worker("secretive-0", "Running").await;
    eventually("the worker runs", || async {
        if process_running("sleep 3.313") { Ok(()) } else { Err("no".into()) }
    })
    .await;
    let leaked: Vec<String> = command_lines().into_iter().filter(|c| c.contains(value)).collect();
    assert!(leaked.is_empty(), "{leaked:?}");
    let env_files = cluster.agents[0].data.path().join(".agent/env");
    let left: Vec<_> = std::fs::read_dir(&env_files).map(|d| d.flatten().collect()).unwrap_or_default();
    assert!(left.is_empty(), "environment files left: {left:?}");

    let run = api.wait_run_ended("secretive").await;
    let logs = api.logs("secretive-0").await;
    assert_eq!(run["status"]["state"], "Completed", "{run}\n{logs}");
    assert_eq!(logs, format!("token of {} characters\n2\n", value.len()));
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn an_image_pull_secret_reaches_the_pull_only_and_leaves_no_file(pool: PgPool) {
    use base64::Engine;
    let registry = &common::images::images().registry;
    // The tests' registry speaks plain HTTP: pulled by its own name, it must be marked insecure.
    let conf_dir = open_tempdir();
    let conf = conf_dir.path().join("registries.conf");
    let mut text = std::fs::read_to_string(registries_conf()).unwrap();
    text.push_str(&format!("\n[[registry]]\nlocation = \"{registry}\"\ninsecure = true\n"));
    std::fs::write(&conf, text).unwrap();
    let mut cluster = Cluster::server_only(&pool).await;
    cluster.agent_args = vec!["--registries-conf".into(), conf.display().to_string()];
    cluster.add_agent("gpu-01").await;
    let api = &cluster.api;

    // The registry asks for no credentials and takes any.
    let credential = base64::engine::general_purpose::STANDARD.encode("puller:pw-8c1e5b77d2");
    let auth_json = json!({"auths": {registry.as_str(): {"auth": credential}}}).to_string();
    api.create_secret(&json!({"metadata": {"name": "registry"}, "data": {"AUTH_JSON": auth_json}})).await;
    // The host's podman storage is the agent's: without the image there, the agent pulls it.
    let image = format!("{registry}/library/busybox:1.36");
    let remove_image = || {
        let _ = std::process::Command::new("/usr/bin/podman")
            .args(["rmi", "--force", "--ignore", &image])
            .stdout(std::process::Stdio::null())
            .status();
    };
    remove_image();
    let mut run = sh_run("private", "echo AUTH_JSON=${AUTH_JSON:-unset}");
    run["spec"]["task_template"]["image"] = json!(image);
    run["spec"]["task_template"]["image_pull_secret"] = json!("registry");
    api.create_run(&run).await;

    let run = api.wait_run_ended("private").await;
    let logs = api.logs("private-0").await;
    assert_eq!(run["status"]["state"], "Completed", "{run}\n{logs}");
    // The secret's keys are not the worker's variables: it is not among its secret_refs.
    assert_eq!(logs, "AUTH_JSON=unset\n");
    let auth_dir = cluster.agents[0].data.path().join(".agent/auth");
    let mode = std::fs::metadata(&auth_dir).expect("the auth folder was made").permissions().mode();
    assert_eq!(mode & 0o777, 0o700, "{mode:o}");
    let left: Vec<_> = std::fs::read_dir(&auth_dir).unwrap().flatten().map(|e| e.path()).collect();
    assert!(left.is_empty(), "auth files left: {left:?}");
    let agent_log = cluster.agents[0].proc.log_text();
    for secret in [credential.as_str(), "pw-8c1e5b77d2"] {
        assert!(!agent_log.contains(secret), "the agent logged the credential");
        assert!(!logs.contains(secret), "the worker saw the credential");
    }
    remove_image();
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn gpus_reach_workers_through_cdi_one_worker_each(pool: PgPool) {
    // A stand-in device: its container edits set a variable the worker prints.
    let kind = format!("astraeus-test-{}.example/gpu", std::process::id());
    let spec_dir = std::path::Path::new("/var/run/cdi");
    std::fs::create_dir_all(spec_dir).unwrap();
    let spec_file = spec_dir.join(format!("astraeus-test-{}.json", std::process::id()));
    let devices: Vec<Value> = (0..2)
        .map(|i| json!({"name": i.to_string(), "containerEdits": {"env": [format!("STAND_IN_GPU={i}")]}}))
        .collect();
    std::fs::write(&spec_file, json!({"cdiVersion": "0.5.0", "kind": kind, "devices": devices}).to_string())
        .unwrap();
    struct Remove(std::path::PathBuf);
    impl Drop for Remove {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    let _spec = Remove(spec_file);

    let mut cluster = Cluster::server_only(&pool).await;
    cluster.agent_args = ["--gpus", "2", "--gpu-kind", &kind].map(String::from).to_vec();
    cluster.add_agent("gpu-01").await;
    let api = &cluster.api;
    let mut run = sh_run("pair", "echo gpu=$STAND_IN_GPU; sleep 2.5");
    run["spec"]["replicas"] = json!(2);
    run["spec"]["task_template"]["requested_resources"]["gpus"] = json!(1);
    api.create_run(&run).await;

    let run = api.wait_run_ended("pair").await;
    assert_eq!(run["status"]["state"], "Completed", "{run}");
    let mut seen = vec![api.logs("pair-0").await, api.logs("pair-1").await];
    seen.sort();
    assert_eq!(seen, ["gpu=0\n", "gpu=1\n"]);
    let said: Vec<String> = events(api, "worker/pair-0")
        .await
        .iter()
        .filter(|e| e["reason"] == "GPUs")
        .map(|e| e["message"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(said[0].contains(&format!("through CDI devices {kind}=")), "{said:?}");
}

#[test]
fn a_sub_path_swapped_for_a_symlink_after_its_check_still_binds_what_was_checked() {
    use astraeus::agent::mounts;
    let drive = open_tempdir();
    let state = open_tempdir();
    std::fs::create_dir_all(drive.path().join("train/shards")).unwrap();
    std::fs::write(drive.path().join("train/shards/0.parquet"), "checked").unwrap();
    let resolved = mounts::open_sub_path(drive.path(), "train/shards").unwrap();
    // A worker with the drive read-write swaps a folder on the way for a link to the host's root.
    std::fs::rename(drive.path().join("train"), drive.path().join("moved")).unwrap();
    std::os::unix::fs::symlink("/", drive.path().join("train")).unwrap();
    std::fs::create_dir_all(drive.path().join("moved/shards")).unwrap();

    let worker = mounts::worker_dir(state.path(), uuid::Uuid::now_v7());
    let bound = mounts::stage(&worker, 0, &resolved).unwrap();
    let seen = std::fs::read_dir(&bound).unwrap().flatten().map(|e| e.file_name()).collect::<Vec<_>>();
    mounts::unstage(&worker);
    assert_eq!(seen, ["0.parquet"]);
    assert!(!worker.exists(), "the bind and its folder are gone");
    assert_eq!(std::fs::read_to_string(drive.path().join("moved/shards/0.parquet")).unwrap(), "checked");
}

/// The machine's images as its API shows them: `(name, digest, bytes)`.
async fn machine_images(api: &Api) -> Vec<(String, String, u64)> {
    let machine = api.machine("gpu-01").await;
    machine["images"]
        .as_array()
        .unwrap_or_else(|| panic!("no images in {machine}"))
        .iter()
        .map(|i| {
            (
                i["name"].as_str().unwrap().into(),
                i["digest"].as_str().unwrap().into(),
                i["bytes"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_machine_lists_its_images_and_removes_unused_ones_when_its_disk_is_short(pool: PgPool) {
    // A storage of the agent's own, so that removing images touches no other test's; and a
    // disk that is always short (keep more free bytes than any disk has).
    let store = open_tempdir();
    let storage_conf = store.path().join("storage.conf");
    let conf = format!(
        "[storage]\ndriver = \"vfs\"\ngraphroot = \"{0}/graph\"\nrunroot = \"{0}/run\"\n",
        store.path().display()
    );
    std::fs::write(&storage_conf, conf).unwrap();
    let mut cluster = Cluster::server_only(&pool).await;
    cluster.agent_args = vec!["--image-keep-free-bytes".into(), u64::MAX.to_string()];
    cluster.agent_args.extend(["--storage-conf".into(), storage_conf.display().to_string()]);
    cluster.add_agent("gpu-01").await;
    let api = &cluster.api;
    api.create_run(&sh_run("busy", "sleep 4.404")).await;
    api.wait_worker("busy-0", "Running").await;

    // In use, the image stays however short the disk is.
    let listed = eventually("the machine lists the image its worker runs", || async {
        let images = machine_images(api).await;
        if images.is_empty() { Err("no image yet".into()) } else { Ok(images) }
    })
    .await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    let (name, digest, bytes) = &listed[0];
    assert_eq!(name, "docker.io/library/busybox:1.36");
    assert!(digest.starts_with("sha256:") && *bytes > 0, "{listed:?}");

    let run = api.wait_run_ended("busy").await;
    assert_eq!(run["status"]["state"], "Completed", "{run}");
    eventually("the unused image is removed and the machine says so", || async {
        let images = machine_images(api).await;
        if images.is_empty() { Ok(()) } else { Err(format!("{images:?}")) }
    })
    .await;
    let log = cluster.agents[0].proc.log_text();
    assert!(log.contains("removed an unused image"), "{log}");
}

/// Grants `path` to workspace default on cluster main with `mode`, replacing its other grants.
async fn grant(api: &Api, path: &std::path::Path, mode: &str) {
    let body = json!({"paths": [{"path": path, "mode": mode}]});
    api.put("/workspaces/default/clusters/main/host-paths", &body).await.expect(StatusCode::OK);
}

/// Drive `name` over the host folder `path`, mounted at `mount_path` with `mode`.
async fn drive_at(api: &Api, name: &str, path: &std::path::Path, mount_path: &str, mode: &str) {
    api.create_drive(&json!({
        "metadata": {"name": name},
        "spec": {"sources": [{"node_scope": "shared", "path": path, "mount_path": mount_path, "mode": mode}]}
    }))
    .await;
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_drive_through_a_symlink_under_its_grant_fails_its_worker_and_reads_nothing(pool: PgPool) {
    let cluster = Cluster::start(&pool).await;
    let api = &cluster.api;
    // Whoever can write in the granted folder plants a link to the host's root there.
    let granted = open_tempdir();
    std::os::unix::fs::symlink("/", granted.path().join("esc")).unwrap();
    grant(api, granted.path(), "ReadOnly").await;
    drive_at(api, "escape", &granted.path().join("esc/etc"), "/data", "ReadOnly").await;
    let mut run = sh_run("peek", "cat /data/shadow /data/hostname; echo done");
    run["spec"]["task_template"]["datavolume_refs"] = json!([{"name": "escape"}]);
    api.create_run(&run).await;

    let run = api.wait_run_ended("peek").await;
    let worker = api.worker("peek-0").await;
    let logs = api.logs("peek-0").await;
    assert_eq!(run["status"]["state"], "Failed", "{run}");
    let reason = worker["status"]["reason"].as_str().unwrap();
    assert!(reason.contains("\"esc\" is a symbolic link"), "{reason}");
    // The container never ran: nothing of the host's /etc reached its output.
    assert!(!logs.contains("root:") && !logs.contains("done"), "{logs}");
    let hostname = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
    assert!(hostname.trim().is_empty() || !logs.contains(hostname.trim()), "{logs}");
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_run_writes_to_a_host_path_only_once_its_grant_is_read_write(pool: PgPool) {
    let cluster = Cluster::start(&pool).await;
    let api = &cluster.api;
    let granted = open_tempdir();
    // Writable by the workspace's container ids, so that only the grant's mode decides.
    std::fs::set_permissions(granted.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    grant(api, granted.path(), "ReadOnly").await;
    drive_at(api, "out", granted.path(), "/out", "ReadOnly").await;
    let mut run = sh_run("write", "echo written > /out/result");
    run["spec"]["task_template"]["datavolume_refs"] = json!([{"name": "out", "mode": "ReadWrite"}]);

    let refused = api.post("/runs", &run).await;
    assert_eq!(refused.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", refused.text);
    assert!(refused.text.contains("spec.task_template.datavolume_refs[0].mode"), "{}", refused.text);
    assert!(refused.text.contains("granted ReadOnly"), "{}", refused.text);
    assert_eq!(api.get("/runs/write").await.status, StatusCode::NOT_FOUND, "nothing half-written");

    grant(api, granted.path(), "ReadWrite").await;
    api.create_run(&run).await;
    let ended = api.wait_run_ended("write").await;
    assert_eq!(ended["status"]["state"], "Completed", "{ended}\n{}", api.logs("write-0").await);
    assert_eq!(std::fs::read_to_string(granted.path().join("result")).unwrap(), "written\n");
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_worker_whose_grant_was_narrowed_since_its_run_fails_and_never_starts(pool: PgPool) {
    let cluster = Cluster::start(&pool).await;
    let api = &cluster.api;
    let granted = open_tempdir();
    std::fs::set_permissions(granted.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    grant(api, granted.path(), "ReadWrite").await;
    drive_at(api, "out", granted.path(), "/out", "ReadWrite").await;
    // The only machine takes no new workers, so the run's worker waits while the grant changes.
    api.post("/machines/gpu-01/cordon", &json!({})).await.expect(StatusCode::OK);
    let mut run = sh_run("late", "touch /out/started");
    run["spec"]["task_template"]["datavolume_refs"] = json!([{"name": "out"}]);
    api.create_run(&run).await;
    api.wait_worker("late-0", "Pending").await;

    let elsewhere = open_tempdir();
    grant(api, elsewhere.path(), "ReadWrite").await;
    let worker = api.wait_worker("late-0", "Failed").await;
    api.post("/machines/gpu-01/uncordon", &json!({})).await.expect(StatusCode::OK);

    let expected = format!(
        "drive default.out mounts {}, which is no longer under a host path granted to workspace default \
         on cluster main",
        granted.path().display()
    );
    assert_eq!(worker["status"]["reason"], expected.as_str(), "{worker}");
    assert_eq!(api.wait_run_ended("late").await["status"]["state"], "Failed");
    let kinds: Vec<Value> = events(api, "worker/late-0").await.iter().map(|e| e["reason"].clone()).collect();
    assert!(kinds.contains(&json!("HostPathNotGranted")), "{kinds:?}");
    assert!(!kinds.contains(&json!("Scheduled")), "{kinds:?}");
    assert!(worker["status"]["machine"].is_null(), "{worker}");
    assert!(!granted.path().join("started").exists(), "the worker ran");
}
