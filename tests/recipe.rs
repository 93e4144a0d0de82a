//! The drives recipe (spec/drives-recipe.md), end to end, on an in-process cluster of one
//! 2-core machine like dev mode's: the real API, control loops, agent and podman, with images
//! from the tests' own registry. Only the fill's download is replaced by a local command that
//! writes the same layout, in busybox (the download needs Python and the network).

mod cluster;

use cluster::{Cluster, json};
use reqwest::StatusCode;
use serde_json::Value;
use sqlx::PgPool;

/// The recipe's fill, downloading nothing: Food-101's layout in four 100 kB parquet files, then
/// it waits for the test to open a gate (so the test can watch the fill run), prints where the
/// data is and writes the marker last.
const FILL: &str = "set -e; mkdir -p /drive/food101/data; \
    for f in train-00000-of-00008 train-00001-of-00008 train-00002-of-00008 validation-00000-of-00003; do \
    head -c 100000 /dev/urandom > /drive/food101/data/$f.parquet; done; \
    i=0; while [ ! -e /drive/gate ]; do i=$((i+1)); [ $i -lt 1200 ]; sleep 0.1; done; rm /drive/gate; \
    echo /drive/food101; touch /drive/.astralyx-filled";

/// What the fill writes: four files of 100 kB.
const FILLED_BYTES: u64 = 400_000;

/// examples/drive.json, with the local fill instead of the download.
fn drive_json() -> Value {
    let mut drive: Value = serde_json::from_str(include_str!("../examples/drive.json")).unwrap();
    let template = &mut drive["spec"]["fill"]["template"];
    // The recipe's fill resources: 2 cores and 4 GiB, on a 2-core machine.
    assert_eq!(template["requested_resources"], json!({"cpu_cores": 2, "memory_bytes": 4294967296u64}));
    template["args"] = json!(["-c", FILL]);
    template["image"] = json!("busybox:1.36");
    drive
}

/// examples/inspect.json, as written.
fn inspect_json() -> Value {
    serde_json::from_str(include_str!("../examples/inspect.json")).unwrap()
}

/// `(name, state, reason)` of each listed run, in the list's order.
fn summary(runs: &[Value]) -> Vec<(String, String, String)> {
    runs.iter()
        .map(|r| {
            let s = |v: &Value| v.as_str().unwrap_or_default().to_owned();
            (s(&r["metadata"]["name"]), s(&r["status"]["state"]), s(&r["status"]["reason"]))
        })
        .collect()
}

/// Most recently changed first, as the CLI lists runs.
fn by_last_change(mut runs: Vec<Value>) -> Vec<Value> {
    let at = |r: &Value| {
        let t = r["status"]["updated_at"].as_str().unwrap_or_default();
        chrono::DateTime::parse_from_rfc3339(t).unwrap_or_else(|e| panic!("updated_at {t:?}: {e}"))
    };
    runs.sort_by_key(|r| std::cmp::Reverse(at(r)));
    runs
}

fn row(name: &str, state: &str, reason: &str) -> (String, String, String) {
    (name.into(), state.into(), reason.into())
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn the_drives_recipe_holds_end_to_end_on_one_machine(pool: PgPool) {
    let mut cluster = Cluster::start(&pool).await;
    cluster.add_ready_machine("gpu-01").await;
    let api = cluster.api.clone();
    let data = cluster.machine("gpu-01").data.path().to_owned();
    let copy = cluster.machine("gpu-01").copy_dir("default.food101");

    // 1. Create the drive.
    let created = api.create_drive(&drive_json()).await;
    assert_eq!(created["metadata"]["name"], "food101");

    // 2. Use it from a run.
    let created = api.create_run(&inspect_json()).await;
    assert_eq!(created["metadata"]["name"], "inspect-food101");

    // 3. Watch the fill: it runs on gpu-01 although the inspect worker holds one of its two
    // cores, because the waiting worker lends it its share.
    api.wait_run("fill-food101-gpu-01", "Running").await;
    let worker = api.worker("inspect-food101-0").await;
    assert_eq!(worker["status"]["state"], "Preparing", "{worker}");
    assert_eq!(worker["status"]["reason"], "Waiting for drive default.food101 to be filled on gpu-01");
    assert_eq!(worker["status"]["machine"], "gpu-01");
    let runs = api.runs(false).await;
    assert_eq!(summary(&runs), summary(&by_last_change(runs.clone())), "both orders agree here");
    assert_eq!(
        summary(&runs),
        [
            row("fill-food101-gpu-01", "Running", "1 of 1 workers running"),
            row("inspect-food101", "Pending", "Waiting for workers to start"),
        ]
    );
    let fill = api.run("fill-food101-gpu-01").await;
    assert_eq!(
        fill["spec"]["task_template"]["requested_resources"]["node_selection"]["names"],
        json!(["gpu-01"])
    );
    let machine = api.machine("gpu-01").await;
    let allocated = &machine["status"]["allocated"];
    assert_eq!(allocated["cpu_cores"], 2.0, "{machine}");
    assert_eq!(allocated["memory_bytes"], 4294967296u64, "{machine}");
    // Used by lists the workers that mount it; its copy is being filled.
    let drive = api.drive("food101").await;
    assert_eq!(
        drive["used_by"],
        json!([{"name": "inspect-food101-0", "run": "inspect-food101", "state": "Preparing", "machine": "gpu-01"}])
    );
    assert_eq!(drive["copies"][0]["state"], "Filling", "{drive}");
    assert_eq!(drive["copies"][0]["complete"], false, "{drive}");

    std::fs::write(copy.join("gate"), "").unwrap();
    api.wait_completed("inspect-food101").await;
    let fill_logs = api.logs("fill-food101-gpu-01-0").await;
    assert_eq!(fill_logs.lines().last(), Some("/drive/food101"), "{fill_logs}");
    let logs = api.logs("inspect-food101-0").await;
    let du = logs.lines().next().unwrap_or_default();
    assert!(du.ends_with("\t/data/food101") && du.len() > "\t/data/food101".len(), "{logs}");
    for file in [
        "train-00000-of-00008.parquet",
        "train-00001-of-00008.parquet",
        "train-00002-of-00008.parquet",
        "validation-00000-of-00003.parquet",
    ] {
        assert!(logs.lines().any(|l| l == file), "{file} not listed: {logs}");
    }
    // busybox's own words, from the recipe's image (stderr and stdout may interleave).
    let mut last: Vec<&str> = logs.lines().rev().take(2).collect();
    last.sort();
    assert_eq!(last, ["read-only, as asked", "touch: /data/should-fail: Read-only file system"], "{logs}");
    assert!(!copy.join("should-fail").exists());

    // 4. Placement follows the data: the copy is listed whole, with its folder.
    let drive = api.drive("food101").await;
    let copies = drive["copies"].as_array().unwrap();
    assert_eq!(copies.len(), 1, "{drive}");
    assert_eq!(copies[0]["node"], "gpu-01");
    assert_eq!(copies[0]["complete"], true);
    assert_eq!(copies[0]["state"], "Complete");
    assert_eq!(copies[0]["bytes"], FILLED_BYTES);
    assert_eq!(copies[0]["folder"], format!("{}/drives/default.food101", data.display()));
    assert!(copies[0]["last_used_at"].is_string(), "{drive}");
    assert_eq!(drive["used_by"], json!([]));

    // The same run under another name goes to gpu-01 and starts without a fill.
    let mut again = inspect_json();
    again["metadata"]["name"] = json!("inspect-food101-2");
    assert_eq!(api.create_run(&again).await["metadata"]["name"], "inspect-food101-2");
    api.wait_completed("inspect-food101-2").await;
    assert_eq!(api.worker("inspect-food101-2-0").await["status"]["machine"], "gpu-01");
    assert!(api.logs("inspect-food101-2-0").await.contains("read-only, as asked"));
    assert_eq!(cluster.fill_runs().await, 1);
    assert_eq!(cluster.worker_names("fill-food101-gpu-01").await, ["fill-food101-gpu-01-0"]);
    // `astra astraeus runs --all` lists the most recently changed first. The newest run is on
    // top; which of the other two changed last is a matter of milliseconds (the inspect worker
    // starts once the marker is reported, while the fill reports its own end), so not checked.
    let mut all = summary(&by_last_change(api.runs(true).await));
    assert_eq!(all[0], row("inspect-food101-2", "Completed", "All workers completed"));
    all.sort();
    assert_eq!(
        all,
        [
            row("fill-food101-gpu-01", "Completed", "All workers completed"),
            row("inspect-food101", "Completed", "All workers completed"),
            row("inspect-food101-2", "Completed", "All workers completed"),
        ]
    );
    assert!(api.runs(false).await.is_empty());

    // 5. With sub_path a run mounts one folder of the drive.
    let parquet = json!({
        "metadata": {"name": "parquet"},
        "spec": {"task_template": {
            "image": "busybox:1.36", "command": "sh", "args": ["-c", "ls /parquet"],
            "requested_resources": {"cpu_cores": 1, "memory_bytes": 268435456u64},
            "datavolume_refs": [{"name": "food101", "sub_path": "food101/data", "mount_path": "/parquet"}]
        }}
    });
    api.create_run(&parquet).await;
    api.wait_completed("parquet").await;
    assert_eq!(
        api.logs("parquet-0").await,
        "train-00000-of-00008.parquet\ntrain-00001-of-00008.parquet\ntrain-00002-of-00008.parquet\n\
         validation-00000-of-00003.parquet\n"
    );

    // A drive cannot be deleted while a live worker uses it.
    let mut hold = inspect_json();
    hold["metadata"]["name"] = json!("hold");
    hold["spec"]["task_template"]["args"] = json!(["-c", "sleep 300"]);
    api.create_run(&hold).await;
    api.wait_worker("hold-0", "Running").await;
    let drive = api.drive("food101").await;
    assert_eq!(
        drive["used_by"],
        json!([{"name": "hold-0", "run": "hold", "state": "Running", "machine": "gpu-01"}])
    );
    let refused = api.delete("/drives/food101").await;
    assert_eq!(refused.status, StatusCode::CONFLICT, "{}", refused.text);
    let message = refused.json()["error"]["message"].as_str().unwrap_or_default().to_owned();
    assert!(message.contains("hold-0"), "{message}");
    assert!(copy.join(".astralyx-filled").exists());
    api.delete_run("hold").await;

    // 6. Clean up: the runs, then the drive, its copy on the machine and its fill run.
    for run in ["inspect-food101", "inspect-food101-2", "parquet"] {
        api.delete_run(run).await;
    }
    let deleted = api.delete("/drives/food101").await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT, "{}", deleted.text);
    assert_eq!(api.get("/drives/food101").await.status, StatusCode::NOT_FOUND);
    assert_eq!(api.get("/runs/fill-food101-gpu-01").await.status, StatusCode::NOT_FOUND);
    assert_eq!(cluster.fill_runs().await, 0);
    cluster::eventually("the copy's folder is deleted", || async {
        if copy.exists() { Err(format!("{} still exists", copy.display())) } else { Ok(()) }
    })
    .await;
    assert!(api.runs(true).await.is_empty());

    cluster.stop().await;
}
