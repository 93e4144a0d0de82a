//! Placement and fills on an in-process cluster: where workers go, what fills their copies, how
//! copies are evicted, and what a worker that cannot be placed says.

mod cluster;

use std::collections::BTreeSet;
use std::time::Duration;

use cluster::{
    Api, BLOB_FILL, Cluster, FOOD101_FILL, REFILL_AFTER_SECONDS, eventually, food101, json, open_tempdir,
    pinned, placed_drive, run_mounting,
};
use reqwest::StatusCode;
use sqlx::PgPool;

const WAITING_ON_GPU01: &str = "Waiting for drive default.food101 to be filled on gpu-01";

/// Waits in a fill until the test creates `/drive/gate` in the copy, then writes the marker.
const GATED_MARKER: &str = "i=0; while [ ! -e /drive/gate ]; do i=$((i+1)); [ $i -lt 1200 ] || exit 3; sleep 0.1; done; \
    rm /drive/gate; touch /drive/.astralyx-filled";

/// `sleep 300`, pinned to `machine`, holding `cpu_cores` and mounting nothing.
fn busy(name: &str, machine: &str, cpu_cores: f64) -> serde_json::Value {
    pinned(run_mounting(name, "sleep 300", &[], cpu_cores), machine)
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn when_the_machine_with_the_copy_has_no_room_the_run_goes_to_another_that_gets_its_own_fill(
    pool: PgPool,
) {
    let mut cluster = Cluster::start(&pool).await;
    cluster.add_ready_machine("gpu-01").await;
    cluster.add_ready_machine("gpu-02").await;
    let api = cluster.api.clone();
    api.create_drive(&food101()).await;
    api.create_run(&pinned(run_mounting("first", "ls /data/food101/data", &["food101"], 1.0), "gpu-01"))
        .await;
    api.wait_completed("first").await;
    api.wait_completed("fill-food101-gpu-01").await;

    // gpu-01 holds the only copy, but a run takes both its cores.
    api.create_run(&busy("hog", "gpu-01", 2.0)).await;
    api.wait_worker("hog-0", "Running").await;

    // It waits for gpu-01, as long as filling its copy elsewhere would take (6 GB at the
    // 100 MB/s of a machine never measured: a minute); then it goes to gpu-02, which fills one.
    api.create_run(&run_mounting("second", "ls /data/food101/data", &["food101"], 1.0)).await;
    let waiting = "Waiting for gpu-01, which holds its drives whole, to have room: at most 1 min, then a \
                   machine that fills them";
    api.wait_reason("second-0", waiting).await;
    sqlx::query("UPDATE workers SET created_at = created_at - interval '1 minute' WHERE name = 'second-0'")
        .execute(&pool)
        .await
        .unwrap();
    api.wait_completed("second").await;
    assert_eq!(api.worker("second-0").await["status"]["machine"], "gpu-02");
    let fill = api.wait_completed("fill-food101-gpu-02").await;
    assert_eq!(
        fill["spec"]["task_template"]["requested_resources"]["node_selection"]["names"],
        json!(["gpu-02"])
    );
    assert_eq!(cluster.fill_runs().await, 2);
    let drive = api.drive("food101").await;
    let copies: Vec<_> = drive["copies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["node"].clone(), c["complete"].clone()))
        .collect();
    assert_eq!(copies, [(json!("gpu-01"), json!(true)), (json!("gpu-02"), json!(true))], "{drive}");
    // A page at a time, in the order the machines joined; `next` is the last one's uid.
    let page = api.get("/drives/food101/copies?limit=1").await.expect(StatusCode::OK);
    assert_eq!(page["items"][0]["node"], "gpu-01", "{page}");
    assert_eq!(page["next"], api.machine("gpu-01").await["metadata"]["uid"], "{page}");
    let rest = format!("/drives/food101/copies?limit=1&cursor={}", page["next"].as_str().unwrap());
    let page = api.get(&rest).await.expect(StatusCode::OK);
    assert_eq!(page["items"][0]["node"], "gpu-02", "{page}");
    assert_eq!(page.get("next"), None, "{page}");
    // A list of drives counts them; a machine lists its own.
    let listed = api.get("/drives").await.expect(StatusCode::OK);
    assert_eq!(listed["items"][0]["status"]["copies"], json!({"complete": 2, "filling": 0, "failed": 0}));
    assert_eq!(listed["items"][0]["copies"], json!([]));
    let machine = api.machine("gpu-02").await;
    let copies = machine["copies"].as_array().unwrap();
    assert_eq!(copies.len(), 1, "{machine}");
    assert_eq!((&copies[0]["drive"], &copies[0]["complete"]), (&json!("food101"), &json!(true)));
    let folder = copies[0]["folder"].as_str().unwrap();
    assert!(folder.ends_with("/drives/default.food101"), "{folder}");

    api.delete_run("hog").await;
    cluster.stop().await;
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn placement_prefers_the_machine_with_a_complete_copy(pool: PgPool) {
    let mut cluster = Cluster::start(&pool).await;
    cluster.add_ready_machine("gpu-01").await;
    cluster.add_ready_machine("gpu-02").await;
    let api = cluster.api.clone();
    api.create_drive(&food101()).await;
    api.create_run(&pinned(run_mounting("warm-up", "true", &["food101"], 1.0), "gpu-02")).await;
    api.wait_completed("warm-up").await;

    // Both machines are free; the copy is on gpu-02.
    for name in ["r1", "r2", "r3"] {
        api.create_run(&run_mounting(name, "ls /data/food101/data", &["food101"], 1.0)).await;
        api.wait_completed(name).await;
        assert_eq!(api.worker(&format!("{name}-0")).await["status"]["machine"], "gpu-02", "{name}");
    }
    // Still when gpu-02 is the busier machine: the copy outweighs free cores.
    api.create_run(&busy("hog", "gpu-02", 1.0)).await;
    api.wait_worker("hog-0", "Running").await;
    api.create_run(&run_mounting("r4", "true", &["food101"], 1.0)).await;
    api.wait_completed("r4").await;
    assert_eq!(api.worker("r4-0").await["status"]["machine"], "gpu-02");
    assert_eq!(cluster.fill_runs().await, 1);
    assert_eq!(cluster.worker_names("fill-food101-gpu-02").await, ["fill-food101-gpu-02-0"]);

    api.delete_run("hog").await;
    cluster.stop().await;
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_fill_that_writes_no_marker_runs_again_after_the_refill_interval(pool: PgPool) {
    let mut cluster = Cluster::start(&pool).await;
    cluster.add_ready_machine("gpu-01").await;
    let api = cluster.api.clone();
    // The first attempt leaves /drive/attempt and no marker; the second finds it and, once the
    // test opens the gate, writes the marker.
    let fill = format!("if [ -e /drive/attempt ]; then {GATED_MARKER}; else touch /drive/attempt; fi");
    api.create_drive(&placed_drive("food101", 1_000_000, true, &fill, 1.0)).await;
    api.create_run(&run_mounting("reader", "ls -a /data", &["food101"], 1.0)).await;

    api.wait_worker("fill-food101-gpu-01-0", "Completed").await;
    let first = api.run("fill-food101-gpu-01").await;
    let worker = api.worker("reader-0").await;
    assert_eq!(worker["status"]["state"], "Preparing", "{worker}");
    assert_eq!(worker["status"]["reason"], WAITING_ON_GPU01);

    // After the interval the same fill run fills again, as its next worker.
    api.wait_worker("fill-food101-gpu-01-1", "Running").await;
    let again = api.run("fill-food101-gpu-01").await;
    assert_eq!(again["metadata"]["uid"], first["metadata"]["uid"]);
    assert_eq!(again["status"]["state"], "Running", "{again}");
    assert_eq!(
        cluster.worker_names("fill-food101-gpu-01").await,
        ["fill-food101-gpu-01-0", "fill-food101-gpu-01-1"]
    );
    assert_eq!(cluster.fill_runs().await, 1);
    let worker = api.worker("reader-0").await;
    assert_eq!(worker["status"]["state"], "Preparing", "{worker}");
    assert_eq!(worker["status"]["reason"], WAITING_ON_GPU01);

    cluster.machine("gpu-01").open_gate("default.food101").await;
    api.wait_completed("reader").await;
    assert!(api.logs("reader-0").await.lines().any(|l| l == ".astralyx-filled"));
    let fill = api.wait_completed("fill-food101-gpu-01").await;
    assert_eq!(fill["status"]["reason"], "All workers completed");
    assert_eq!(cluster.worker_names("fill-food101-gpu-01").await.len(), 2);
    cluster.stop().await;
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_whole_copy_whose_folder_is_gone_is_filled_again_for_the_next_reader(pool: PgPool) {
    let mut cluster = Cluster::start(&pool).await;
    cluster.add_ready_machine("gpu-01").await;
    let api = cluster.api.clone();
    api.create_drive(&food101()).await;
    api.create_run(&run_mounting("reader", "ls -a /data", &["food101"], 1.0)).await;
    api.wait_completed("reader").await;
    let drive = api.drive("food101").await;
    assert_eq!(drive["copies"][0]["complete"], true, "{drive}");

    // Someone deletes the copy on the machine: the agent's next heartbeat no longer reports it.
    std::fs::remove_dir_all(cluster.machine("gpu-01").copy_dir("default.food101")).unwrap();
    eventually("the copy is no longer whole", || async {
        let drive = api.drive("food101").await;
        let copy = &drive["copies"][0];
        if copy["complete"] == false && copy["state"] == "Filling" { Ok(()) } else { Err(drive.to_string()) }
    })
    .await;

    // The next reader waits for it to be filled again, by the same fill run's next worker.
    api.create_run(&run_mounting("reader-again", "ls -a /data", &["food101"], 1.0)).await;
    api.wait_completed("reader-again").await;
    assert!(api.logs("reader-again-0").await.lines().any(|l| l == ".astralyx-filled"));
    assert_eq!(
        cluster.worker_names("fill-food101-gpu-01").await,
        ["fill-food101-gpu-01-0", "fill-food101-gpu-01-1"]
    );
    cluster.stop().await;
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_whole_copy_that_loses_a_file_says_which_and_is_filled_again_for_the_next_reader(pool: PgPool) {
    let mut cluster = Cluster::start(&pool).await;
    cluster.add_ready_machine("gpu-01").await;
    let api = cluster.api.clone();
    api.create_drive(&food101()).await;
    api.create_run(&run_mounting("reader", "true", &["food101"], 1.0)).await;
    api.wait_completed("reader").await;
    eventually("the copy has its manifest", || async {
        let copy = api.drive("food101").await["copies"][0].clone();
        if copy["manifest"].is_string() { Ok(()) } else { Err(copy.to_string()) }
    })
    .await;

    // One of its three files goes, beneath the agent: the copy is whole no more, and says which.
    let gone = "food101/data/train-00001-of-00008.parquet";
    std::fs::remove_file(cluster.machine("gpu-01").copy_dir("default.food101").join(gone)).unwrap();
    let copy = eventually("the copy says what it lost", || async {
        let copy = api.drive("food101").await["copies"][0].clone();
        if copy["state"] == "Filling" { Ok(copy) } else { Err(copy.to_string()) }
    })
    .await;
    assert_eq!(copy["lost_files"], json!({"count": 1, "named": [gone]}), "{copy}");
    let lost = api.events_with("drive/food101", "FilesLost").await;
    assert_eq!(lost.len(), 1, "{lost:?}");

    // The next reader waits for the fill to write it again, and reads all three.
    api.create_run(&run_mounting("reader-again", "ls /data/food101/data", &["food101"], 1.0)).await;
    api.wait_completed("reader-again").await;
    assert_eq!(api.logs("reader-again-0").await.lines().filter(|l| l.ends_with(".parquet")).count(), 3);
    assert_eq!(
        cluster.worker_names("fill-food101-gpu-01").await,
        ["fill-food101-gpu-01-0", "fill-food101-gpu-01-1"]
    );
    let copy = api.drive("food101").await["copies"][0].clone();
    assert_eq!((&copy["state"], copy.get("lost_files")), (&json!("Complete"), None), "{copy}");
    cluster.stop().await;
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_failed_fill_stays_failed_until_its_run_is_deleted_then_it_is_made_again(pool: PgPool) {
    let mut cluster = Cluster::start(&pool).await;
    cluster.add_ready_machine("gpu-01").await;
    let api = cluster.api.clone();
    let fill = format!(
        "if [ -e /drive/attempt ]; then {GATED_MARKER}; \
         else touch /drive/attempt; echo 'download failed: 503 from the mirror' >&2; exit 1; fi"
    );
    api.create_drive(&placed_drive("food101", 1_000_000, true, &fill, 1.0)).await;
    api.create_run(&run_mounting("reader", "true", &["food101"], 1.0)).await;

    let failed = api.wait_run("fill-food101-gpu-01", "Failed").await;
    assert_eq!(failed["status"]["reason"], "worker fill-food101-gpu-01-0 failed: exited with code 1");
    let failed_reason = format!(
        "{WAITING_ON_GPU01}: its fill failed, read its logs: astra astraeus logs fill-food101-gpu-01-0"
    );
    api.wait_reason("reader-0", &failed_reason).await;
    assert!(api.logs("fill-food101-gpu-01-0").await.contains("download failed: 503 from the mirror"));

    // It stays failed: nothing fills again, however long the refill interval passes.
    tokio::time::sleep(Duration::from_secs(2 * REFILL_AFTER_SECONDS + 1)).await;
    let still = api.run("fill-food101-gpu-01").await;
    assert_eq!(still["status"]["state"], "Failed", "{still}");
    assert_eq!(still["metadata"]["uid"], failed["metadata"]["uid"]);
    assert_eq!(cluster.worker_names("fill-food101-gpu-01").await, ["fill-food101-gpu-01-0"]);
    let worker = api.worker("reader-0").await;
    assert_eq!(
        (&worker["status"]["state"], &worker["status"]["reason"]),
        (&json!("Preparing"), &json!(failed_reason))
    );
    assert_eq!(api.drive("food101").await["copies"][0]["state"], "Failed");

    // Deleting the fill run makes it again, and the worker's reason no longer speaks of a failure.
    api.delete_run("fill-food101-gpu-01").await;
    let remade = api.wait_run("fill-food101-gpu-01", "Running").await;
    assert_ne!(remade["metadata"]["uid"], failed["metadata"]["uid"]);
    assert_eq!(cluster.worker_names("fill-food101-gpu-01").await, ["fill-food101-gpu-01-0"]);
    api.wait_reason("reader-0", WAITING_ON_GPU01).await;
    assert_eq!(api.worker("reader-0").await["status"]["state"], "Preparing");

    cluster.machine("gpu-01").open_gate("default.food101").await;
    api.wait_completed("reader").await;
    api.wait_completed("fill-food101-gpu-01").await;
    assert_eq!(cluster.fill_runs().await, 1);
    cluster.stop().await;
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn fifty_runs_at_once_through_two_replicas_get_one_fill_and_never_overcommit_the_machine(pool: PgPool) {
    const RUNS: usize = 50;
    let mut cluster = Cluster::with_replicas(&pool, 2).await;
    cluster.add_ready_machine("gpu-01").await;
    let (a, b) = (cluster.api.clone(), cluster.api_of(1));
    // The fill asks for the machine's two cores: it starts on what the waiting workers lend it.
    a.create_drive(&placed_drive("food101", 6_000_000_000, true, FOOD101_FILL, 2.0)).await;

    // Each worker checks that it sees a whole copy.
    let script = "test -e /data/.astralyx-filled && ls /data/food101/data";
    let submitted = futures::future::join_all((0..RUNS).map(|i| {
        let api = if i % 2 == 0 { a.clone() } else { b.clone() };
        async move { api.post("/runs", &run_mounting(&format!("r{i}"), script, &["food101"], 0.1)).await }
    }))
    .await;
    for reply in submitted {
        assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.text);
    }

    let db = &cluster.db;
    eventually("all runs complete", || async move {
        let sound: bool = sqlx::query_scalar(
            "SELECT bool_and(cpu_alloc <= cpu_millis AND memory_alloc <= memory_bytes) FROM machines",
        )
        .fetch_one(db)
        .await
        .unwrap();
        assert!(sound, "a machine is over-committed");
        let fills: i64 = sqlx::query_scalar("SELECT count(*) FROM runs WHERE fill_drive_id IS NOT NULL")
            .fetch_one(db)
            .await
            .unwrap();
        assert!(fills <= 1, "{fills} fill runs");
        let states: Vec<(String, String)> =
            sqlx::query_as("SELECT state, reason FROM runs WHERE fill_drive_id IS NULL")
                .fetch_all(db)
                .await
                .unwrap();
        let failed: Vec<_> = states.iter().filter(|(s, _)| s == "Failed").collect();
        assert!(failed.is_empty(), "{failed:?}");
        let done = states.iter().filter(|(s, _)| s == "Completed").count();
        if done == RUNS { Ok(()) } else { Err(format!("{done} of {RUNS} completed")) }
    })
    .await;

    assert_eq!(cluster.fill_runs().await, 1);
    assert_eq!(cluster.worker_names("fill-food101-gpu-01").await, ["fill-food101-gpu-01-0"]);
    let events = a.get("/events?object=drive/food101").await.expect(StatusCode::OK);
    let started: Vec<&serde_json::Value> =
        events["items"].as_array().unwrap().iter().filter(|e| e["reason"] == "FillStarted").collect();
    assert_eq!(started.len(), 1, "{events}");
    assert_eq!(started[0]["message"], "fill run fill-food101-gpu-01 started on gpu-01");
    assert_eq!(started[0]["count"], 1);
    let machines: Vec<Option<String>> = sqlx::query_scalar(
        "SELECT DISTINCT m.name FROM workers w LEFT JOIN machines m ON m.id = w.machine_id",
    )
    .fetch_all(db)
    .await
    .unwrap();
    assert_eq!(machines, [Some("gpu-01".to_owned())]);
    let machine = a.machine("gpu-01").await;
    assert_eq!(machine["status"]["allocated"], json!({"cpu_cores": 0.0, "memory_bytes": 0, "gpus": 0}));
    cluster.stop().await;
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn room_for_a_new_copy_comes_from_the_least_recently_used_evictable_copy_nobody_uses(pool: PgPool) {
    // Every copy here is exactly 100 kB (one file; the marker is empty) and hints 100 kB.
    const COPY: i64 = 100_000;
    let mut cluster = Cluster::start(&pool).await;
    cluster.add_machine("gpu-01").await;
    // Room for four copies and half of a fifth: 450 kB.
    cluster.confirm("gpu-01", Some(4 * COPY + COPY / 2)).await;
    let api = cluster.api.clone();
    for (name, evictable) in [("cold", false), ("held", true), ("a", true), ("b", true), ("d", true)] {
        api.create_drive(&placed_drive(name, COPY as u64, evictable, BLOB_FILL, 0.5)).await;
    }
    let use_once = |run: &str, drive: &str| run_mounting(run, "cat /data/blob > /dev/null", &[drive], 0.1);

    // Used in this order, so by last use: cold (not evictable) < held (in use) < a < b.
    // b is filled before a, and used again after it.
    api.create_run(&use_once("use-cold", "cold")).await;
    api.wait_completed("use-cold").await;
    api.create_run(&run_mounting("hold", "sleep 300", &["held"], 0.1)).await;
    api.wait_worker("hold-0", "Running").await;
    for run in ["use-b", "use-a", "use-b-again"] {
        let drive = if run == "use-a" { "a" } else { "b" };
        api.create_run(&use_once(run, drive)).await;
        api.wait_completed(run).await;
    }
    let used = |drive: &'static str| {
        let api = api.clone();
        async move {
            let drive = api.drive(drive).await;
            let at =
                drive["copies"][0]["last_used_at"].as_str().unwrap_or_else(|| panic!("{drive}")).to_owned();
            chrono::DateTime::parse_from_rfc3339(&at).unwrap()
        }
    };
    let (cold, held, a, b) = (used("cold").await, used("held").await, used("a").await, used("b").await);
    assert!(cold < held && held < a && a < b, "{cold} {held} {a} {b}");

    // d needs 100 kB; 450 - 4 × 100 = 50 kB are free. Evictable, whole and unused: a and b,
    // 200 kB, so d fits. Evicting a (least recently used) frees 100 kB >= the 50 kB short; b stays.
    api.create_run(&use_once("use-d", "d")).await;
    api.wait_completed("use-d").await;
    let gpu01 = cluster.machine("gpu-01");
    eventually("the evicted copy's folder is deleted", || async {
        let dir = gpu01.copy_dir("default.a");
        if dir.exists() { Err(format!("{} still exists", dir.display())) } else { Ok(()) }
    })
    .await;
    for kept in ["cold", "held", "b", "d"] {
        assert!(gpu01.copy_dir(&format!("default.{kept}")).join(".astralyx-filled").exists(), "{kept}");
        let drive = api.drive(kept).await;
        assert_eq!(drive["copies"][0]["complete"], true, "{drive}");
    }
    eventually("the evicted copy is no longer listed", || async {
        let drive = api.drive("a").await;
        if drive["copies"] == json!([]) { Ok(()) } else { Err(drive["copies"].to_string()) }
    })
    .await;
    let db = &cluster.db;
    eventually("the evicted copy's row goes once the agent reports it gone", || async move {
        let drives: Vec<String> = sqlx::query_scalar(
            "SELECT d.name FROM copies c JOIN drives d ON d.id = c.drive_id ORDER BY d.name",
        )
        .fetch_all(db)
        .await
        .unwrap();
        if drives == ["b", "cold", "d", "held"] { Ok(()) } else { Err(format!("{drives:?}")) }
    })
    .await;

    // a is filled again when needed, by its fill run's next worker. 50 kB are free again; of
    // b and d, b was used less recently, so b makes room this time.
    api.create_run(&use_once("use-a-again", "a")).await;
    api.wait_completed("use-a-again").await;
    assert_eq!(cluster.worker_names("fill-a-gpu-01").await, ["fill-a-gpu-01-0", "fill-a-gpu-01-1"]);
    eventually("the next least recently used copy's folder is deleted", || async {
        let dir = gpu01.copy_dir("default.b");
        if dir.exists() { Err(format!("{} still exists", dir.display())) } else { Ok(()) }
    })
    .await;
    for kept in ["cold", "held", "d", "a"] {
        assert!(gpu01.copy_dir(&format!("default.{kept}")).join(".astralyx-filled").exists(), "{kept}");
    }

    api.delete_run("hold").await;
    cluster.stop().await;
}

/// gpu-01 with room for two copies of 100 kB and half of a third (250 kB), and three drives of
/// 100 kB: `first` and `other`, whole there and used in that order (so `first` is the least
/// recently used), and `new`, not there yet.
async fn two_copies_used_in_turn(pool: &PgPool, first: &str) -> Cluster {
    const COPY: i64 = 100_000;
    let mut cluster = Cluster::start(pool).await;
    cluster.add_machine("gpu-01").await;
    cluster.confirm("gpu-01", Some(2 * COPY + COPY / 2)).await;
    let api = cluster.api.clone();
    for name in [first, "other", "new"] {
        api.create_drive(&placed_drive(name, COPY as u64, true, BLOB_FILL, 0.5)).await;
    }
    for drive in [first, "other"] {
        let run = format!("use-{drive}");
        api.create_run(&run_mounting(&run, "cat /data/blob > /dev/null", &[drive], 0.1)).await;
        api.wait_completed(&run).await;
    }
    cluster
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn room_for_a_workers_new_copy_never_comes_from_a_copy_it_mounts_too(pool: PgPool) {
    // The worker is Pending when room is made, so Postgres knows of no live worker mounting
    // its drives: the copy it also mounts must be kept however long ago it was last used.
    let cluster = two_copies_used_in_turn(&pool, "mine").await;
    let api = cluster.api.clone();

    // new needs 100 kB, 50 kB are free: other goes, although mine was used longer ago.
    api.create_run(&run_mounting("both", "true", &["mine", "new"], 0.1)).await;
    api.wait_completed("both").await;
    let gpu01 = cluster.machine("gpu-01");
    eventually("the evicted copy's folder is deleted", || async {
        let dir = gpu01.copy_dir("default.other");
        if dir.exists() { Err(format!("{} still exists", dir.display())) } else { Ok(()) }
    })
    .await;
    for kept in ["mine", "new"] {
        assert!(gpu01.copy_dir(&format!("default.{kept}")).join(".astralyx-filled").exists(), "{kept}");
    }
    assert_eq!(cluster.worker_names("fill-mine-gpu-01").await, ["fill-mine-gpu-01-0"]);
    cluster.stop().await;
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn room_for_a_new_copy_keeps_the_copy_a_queued_worker_mounts(pool: PgPool) {
    let cluster = two_copies_used_in_turn(&pool, "queued").await;
    let api = cluster.api.clone();
    // A worker that mounts queued waits for more cores than the machine has.
    api.create_run(&run_mounting("later", "true", &["queued"], 64.0)).await;
    eventually("the big worker waits", || async {
        let w = api.worker("later-0").await;
        let why = w["status"]["reason"].as_str().unwrap_or_default().to_owned();
        if why.starts_with("Insufficient cpu") { Ok(()) } else { Err(w.to_string()) }
    })
    .await;

    // new needs 100 kB, 50 kB are free: other goes, although queued was used longer ago.
    api.create_run(&run_mounting("use-new", "true", &["new"], 0.1)).await;
    api.wait_completed("use-new").await;
    let gpu01 = cluster.machine("gpu-01");
    eventually("the evicted copy's folder is deleted", || async {
        let dir = gpu01.copy_dir("default.other");
        if dir.exists() { Err(format!("{} still exists", dir.display())) } else { Ok(()) }
    })
    .await;
    for kept in ["queued", "new"] {
        assert!(gpu01.copy_dir(&format!("default.{kept}")).join(".astralyx-filled").exists(), "{kept}");
    }
    // The eviction is told on the drive and on the machine.
    for object in ["drive/other", "machine/gpu-01"] {
        let evicted = api.events_with(object, "Evicted").await;
        assert_eq!(evicted.len(), 1, "{object}: {evicted:?}");
    }
    api.delete_run("later").await;
    cluster.stop().await;
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_run_that_waits_for_cores_has_its_drive_filled_ahead_and_starts_warm_when_they_free(pool: PgPool) {
    const COPY: u64 = 100_000;
    let mut cluster = Cluster::start(&pool).await;
    cluster.add_ready_machine("gpu-01").await;
    cluster.add_ready_machine("gpu-02").await;
    let api = cluster.api.clone();
    api.create_drive(&placed_drive("set", COPY, true, BLOB_FILL, 0.25)).await;
    // Each machine has 2 cores: 1.5 taken on each leaves room for the fill, not for the run.
    for m in ["gpu-01", "gpu-02"] {
        let hog = format!("hog-{m}");
        api.create_run(&busy(&hog, m, 1.5)).await;
        api.wait_worker(&format!("{hog}-0"), "Running").await;
    }
    api.create_run(&run_mounting("train", "cat /data/blob > /dev/null", &["set"], 1.0)).await;

    // Both machines miss half a core; gpu-01 comes first. Its copy is filled while the run waits.
    api.wait_completed("fill-set-gpu-01").await;
    // The copy is whole once the agent's next heartbeat reports its marker.
    eventually("the copy filled ahead is whole, on gpu-01 alone", || async {
        let drive = api.drive("set").await;
        let copies: Vec<_> = drive["copies"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| (c["node"].clone(), c["complete"].clone()))
            .collect();
        if copies == [(json!("gpu-01"), json!(true))] { Ok(()) } else { Err(drive.to_string()) }
    })
    .await;
    let staged = api.events_with("drive/set", "StagedIn").await;
    assert_eq!(staged.len(), 1, "{staged:?}");
    assert_eq!(staged[0]["message"], "copy on gpu-01 filled ahead for a queued run that waits for resources");
    assert_eq!(api.worker("train-0").await["status"]["state"], "Pending");

    // Cores free on gpu-01: the run starts there on the whole copy, with no fill of its own.
    api.delete_run("hog-gpu-01").await;
    api.wait_completed("train").await;
    let worker = api.worker("train-0").await;
    assert_eq!(worker["status"]["machine"], "gpu-01", "{worker}");
    assert_eq!(cluster.fill_runs().await, 1);
    api.delete_run("hog-gpu-02").await;
    cluster.stop().await;
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_run_pinned_to_a_machine_weighs_its_copies_room_and_use_there(pool: PgPool) {
    // A pass whose runs all name their machines reads only those machines' copies: the named
    // machine's must still count, with which of them are in use.
    const COPY: i64 = 100_000;
    let mut cluster = Cluster::start(&pool).await;
    cluster.add_machine("gpu-01").await;
    cluster.add_machine("gpu-02").await;
    // Room for two copies and half of a third: 250 kB.
    cluster.confirm("gpu-01", Some(2 * COPY + COPY / 2)).await;
    let api = cluster.api.clone();
    for (name, evictable) in [("kept", false), ("held", true), ("extra", true)] {
        api.create_drive(&placed_drive(name, COPY as u64, evictable, BLOB_FILL, 0.5)).await;
    }
    let on_gpu01 =
        |run: &str, script: &str, drive: &str| pinned(run_mounting(run, script, &[drive], 0.1), "gpu-01");
    api.create_run(&on_gpu01("use-kept", "true", "kept")).await;
    api.wait_completed("use-kept").await;
    api.create_run(&on_gpu01("hold", "sleep 300", "held")).await;
    api.wait_worker("hold-0", "Running").await;

    // 50 kB free; kept may not be evicted and held is in use, so extra does not fit.
    api.create_run(&on_gpu01("use-extra", "cat /data/blob > /dev/null", "extra")).await;
    let worker = api
        .wait_reason(
            "use-extra-0",
            "0/2 machines are available: 1 drive extra needs 100.0 kB at this machine's data location, \
             50.0 kB free, 1 not among the run's node_selection names",
        )
        .await;
    assert_eq!(worker["status"]["state"], "Pending");

    // Once nothing uses held, it makes room.
    api.delete_run("hold").await;
    api.wait_completed("use-extra").await;
    let gpu01 = cluster.machine("gpu-01");
    eventually("the evicted copy's folder is deleted", || async {
        let dir = gpu01.copy_dir("default.held");
        if dir.exists() { Err(format!("{} still exists", dir.display())) } else { Ok(()) }
    })
    .await;
    for kept in ["kept", "extra"] {
        assert!(gpu01.copy_dir(&format!("default.{kept}")).join(".astralyx-filled").exists(), "{kept}");
    }
    assert_eq!(api.worker("use-extra-0").await["status"]["machine"], "gpu-01");
    cluster.stop().await;
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_worker_that_cannot_be_placed_says_why_until_the_cause_is_gone(pool: PgPool) {
    let mut cluster = Cluster::start(&pool).await;
    cluster.add_machine("gpu-01").await;
    let api = cluster.api.clone();
    let data = cluster.machine("gpu-01").data.path().to_owned();
    api.create_drive(&food101()).await;
    api.create_run(&run_mounting("inspect", "ls /data/food101/data", &["food101"], 1.0)).await;

    let worker = api.wait_reason("inspect-0", "Choose where to keep data on gpu-01").await;
    assert_eq!(worker["status"]["state"], "Pending");
    // The run says why, as the recipe's troubleshooting row reads (it is told just after its
    // worker).
    eventually("the run says why it waits", || async {
        let run = api.run("inspect").await;
        let reason = &run["status"]["reason"];
        if reason == "Choose where to keep data on gpu-01" { Ok(()) } else { Err(reason.to_string()) }
    })
    .await;

    api.confirm_data_location("gpu-01", &data, Some(2_100_000_000)).await;
    let worker = api
        .wait_reason("inspect-0", "drive food101 needs 6.0 GB at this machine's data location, 2.1 GB free")
        .await;
    assert_eq!(worker["status"]["state"], "Pending");

    // Lifting the limit places it at once, and the copy is filled there.
    api.confirm_data_location("gpu-01", &data, None).await;
    api.wait_completed("inspect").await;
    assert_eq!(api.worker("inspect-0").await["status"]["machine"], "gpu-01");
    api.wait_completed("fill-food101-gpu-01").await;
    cluster.stop().await;
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn confirming_a_data_location_places_the_waiting_worker_and_fills_its_copy_there(pool: PgPool) {
    let mut cluster = Cluster::start(&pool).await;
    cluster.add_machine("gpu-01").await;
    let api = cluster.api.clone();
    api.create_drive(&food101()).await;
    api.create_run(&run_mounting("inspect", "ls /data/food101/data", &["food101"], 1.0)).await;
    api.wait_reason("inspect-0", "Choose where to keep data on gpu-01").await;

    // The first confirmation, with work already waiting for it.
    api.confirm_data_location("gpu-01", cluster.machine("gpu-01").data.path(), None).await;
    let fill = api.wait_completed("fill-food101-gpu-01").await;
    assert_eq!(fill["status"]["reason"], "All workers completed");
    api.wait_completed("inspect").await;
    cluster.stop().await;
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn with_several_machines_the_reason_sums_up_why_each_was_rejected(pool: PgPool) {
    let mut cluster = Cluster::start(&pool).await;
    cluster.add_machine("gpu-01").await;
    cluster.add_machine("gpu-02").await;
    cluster.confirm("gpu-02", Some(2_100_000_000)).await;
    let api = cluster.api.clone();
    api.create_drive(&food101()).await;
    api.create_run(&run_mounting("inspect", "ls /data/food101/data", &["food101"], 1.0)).await;
    api.wait_reason(
        "inspect-0",
        "0/2 machines are available: 1 Choose where to keep data on gpu-01, \
         1 drive food101 needs 6.0 GB at this machine's data location, 2.1 GB free",
    )
    .await;

    cluster.confirm("gpu-01", None).await;
    api.wait_completed("inspect").await;
    assert_eq!(api.worker("inspect-0").await["status"]["machine"], "gpu-01");
    cluster.stop().await;
}

/// Drive `imagenet`, `node_scope: shared`: a granted host folder (kept as long as the returned
/// guard) holding `README`, reached the same way on every machine.
async fn shared_imagenet(api: &Api) -> tempfile::TempDir {
    let lustre = open_tempdir();
    std::fs::write(lustre.path().join("README"), "on every machine\n").unwrap();
    api.grant_host_paths(&[lustre.path()]).await;
    api.create_drive(&json!({
        "metadata": {"name": "imagenet"},
        "spec": {"sources": [{"node_scope": "shared", "path": lustre.path(), "mount_path": "/data", "mode": "ReadOnly"}]}
    }))
    .await;
    lustre
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_shared_drive_needs_no_fill_and_no_data_location(pool: PgPool) {
    let mut cluster = Cluster::start(&pool).await;
    cluster.add_machine("gpu-01").await;
    let api = cluster.api.clone();
    let _lustre = shared_imagenet(&api).await;

    api.create_run(&run_mounting("read", "cat /data/README", &["imagenet"], 1.0)).await;
    api.wait_completed("read").await;
    assert_eq!(api.logs("read-0").await, "on every machine\n");
    assert_eq!(cluster.fill_runs().await, 0);
    assert_eq!(api.drive("imagenet").await["copies"], json!([]));
    assert_eq!(api.machine("gpu-01").await["status"]["data_location"]["confirmed"], false);
    cluster.stop().await;
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_worker_waiting_for_a_placed_drive_waits_for_no_shared_drive_it_also_mounts(pool: PgPool) {
    let mut cluster = Cluster::start(&pool).await;
    cluster.add_machine("gpu-01").await;
    cluster.confirm("gpu-01", None).await;
    let api = cluster.api.clone();
    let _lustre = shared_imagenet(&api).await;
    let fill = format!("echo kept > /drive/labels.txt; {GATED_MARKER}");
    api.create_drive(&placed_drive("labels", 1_000, true, &fill, 0.5)).await;

    let both = run_mounting("both", "cat /data/labels.txt /data2/README", &["labels", "imagenet"], 0.5);
    api.create_run(&both).await;
    api.wait_reason("both-0", "Waiting for drive default.labels to be filled on gpu-01").await;
    // What the fill controller reads: the worker waits for its placed drive only.
    let mut conn = cluster.db.acquire().await.unwrap();
    let waiting = astraeus::store::fills::waiting(&mut conn).await.unwrap();
    drop(conn);
    let labels = api.drive("labels").await;
    assert_eq!(waiting.len(), 1, "{waiting:?}");
    assert_eq!(
        waiting[0].drive.to_string(),
        labels["metadata"]["uid"].as_str().unwrap_or_default(),
        "{labels}"
    );
    assert_eq!(api.drive("imagenet").await["copies"], json!([]));

    cluster.machine("gpu-01").open_gate("default.labels").await;
    api.wait_completed("both").await;
    assert_eq!(api.logs("both-0").await, "kept\non every machine\n");
    assert_eq!(cluster.fill_runs().await, 1);
    cluster.stop().await;
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_drive_on_one_machine_with_transport_local_sends_every_run_to_that_machine(pool: PgPool) {
    let mut cluster = Cluster::start(&pool).await;
    cluster.add_machine("gpu-01").await;
    cluster.add_machine("gpu-02").await;
    let api = cluster.api.clone();
    let datasets = open_tempdir();
    std::fs::write(datasets.path().join("labels.txt"), "apple_pie\n").unwrap();
    api.grant_host_paths(&[datasets.path()]).await;
    api.create_drive(&json!({
        "metadata": {"name": "food101-gpu02"},
        "spec": {
            "sources": [{"node": "gpu-02", "path": datasets.path(), "mount_path": "/data", "mode": "ReadOnly"}],
            "transport": "Local"
        }
    }))
    .await;

    let names = ["l1", "l2", "l3", "l4"];
    for name in names {
        api.create_run(&run_mounting(name, "cat /data/labels.txt", &["food101-gpu02"], 0.5)).await;
    }
    let mut machines = BTreeSet::new();
    for name in names {
        api.wait_completed(name).await;
        assert_eq!(api.logs(&format!("{name}-0")).await, "apple_pie\n");
        machines
            .insert(api.worker(&format!("{name}-0")).await["status"]["machine"].as_str().unwrap().to_owned());
    }
    assert_eq!(machines, BTreeSet::from(["gpu-02".to_owned()]));
    assert_eq!(cluster.fill_runs().await, 0);

    // A run that may only use gpu-01 cannot have it.
    api.create_run(&pinned(run_mounting("elsewhere", "true", &["food101-gpu02"], 0.5), "gpu-01")).await;
    let worker = api
        .wait_reason(
            "elsewhere-0",
            "0/2 machines are available: 1 drive food101-gpu02 is reached only on gpu-02 (transport Local), \
             1 not among the run's node_selection names",
        )
        .await;
    assert_eq!(worker["status"]["state"], "Pending");
    cluster.stop().await;
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_fill_run_named_past_63_characters_can_be_read_and_deleted(pool: PgPool) {
    let mut cluster = Cluster::start(&pool).await;
    let machine = "gpu-with-a-rather-long-name-in-rack-07";
    let drive = "imagenet-21k-winter-release-shards";
    cluster.add_ready_machine(machine).await;
    let api = cluster.api.clone();
    api.create_drive(&placed_drive(drive, 1_000_000, true, "exit 1", 1.0)).await;
    api.create_run(&run_mounting("reader", "true", &[drive], 1.0)).await;

    let fill = format!("fill-{drive}-{machine}");
    assert!(fill.len() > 63);
    let failed = api.wait_run(&fill, "Failed").await;
    assert_eq!(failed["metadata"]["name"], fill.as_str());
    api.delete_run(&fill).await;
    let remade = api.wait_run(&fill, "Failed").await;
    assert_ne!(remade["metadata"]["uid"], failed["metadata"]["uid"]);
    cluster.stop().await;
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_fill_that_never_writes_its_marker_fails_its_copy_after_three_fills(pool: PgPool) {
    let mut cluster = Cluster::start(&pool).await;
    cluster.add_ready_machine("gpu-01").await;
    let api = cluster.api.clone();
    api.create_drive(&placed_drive("food101", 1_000_000, true, "true", 1.0)).await;
    api.create_run(&run_mounting("reader", "ls -a /data", &["food101"], 1.0)).await;

    let reason = format!(
        "{WAITING_ON_GPU01}: its fill completed 3 times without writing .astralyx-filled; read its logs: \
         astra astraeus logs fill-food101-gpu-01-2"
    );
    eventually("the reader says why it still waits", || async {
        let worker = api.worker("reader-0").await;
        if worker["status"]["reason"] == reason.as_str() { Ok(()) } else { Err(worker.to_string()) }
    })
    .await;
    let drive = api.drive("food101").await;
    assert_eq!(drive["copies"][0]["state"], "Failed", "{drive}");
    // Three fills, and no fourth: the copy waits for its fill run to be deleted.
    assert_eq!(cluster.worker_names("fill-food101-gpu-01").await.len(), 3);
    cluster.stop().await;
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_data_location_over_its_limit_evicts_its_least_recently_used_copy(pool: PgPool) {
    const COPY: i64 = 100_000;
    let mut cluster = Cluster::start(&pool).await;
    cluster.add_machine("gpu-01").await;
    cluster.confirm("gpu-01", Some(3 * COPY)).await;
    let api = cluster.api.clone();
    for name in ["older", "newer"] {
        api.create_drive(&placed_drive(name, COPY as u64, true, BLOB_FILL, 0.5)).await;
        let run = format!("use-{name}");
        api.create_run(&run_mounting(&run, "cat /data/blob > /dev/null", &[name], 0.1)).await;
        api.wait_completed(&run).await;
    }
    // An organisation admin narrows the location to 150 kB: 50 kB over, so the copy used least
    // recently goes, and only it.
    cluster.confirm("gpu-01", Some(COPY + COPY / 2)).await;
    let gpu01 = cluster.machine("gpu-01");
    eventually("the least recently used copy's folder is deleted", || async {
        let dir = gpu01.copy_dir("default.older");
        if dir.exists() { Err(format!("{} still exists", dir.display())) } else { Ok(()) }
    })
    .await;
    assert!(gpu01.copy_dir("default.newer").join(".astralyx-filled").exists());
    assert_eq!(api.drive("newer").await["copies"][0]["complete"], true);
    let why = "its data location held 50.0 kB over its limit of 150.0 kB";
    let events = api.get("/events?object=drive/older").await.expect(StatusCode::OK);
    let evicted = events["items"].as_array().unwrap().iter().find(|e| e["reason"] == "Evicted");
    assert_eq!(
        evicted.map(|e| e["message"].clone()),
        Some(json!(format!("copy on gpu-01 evicted: {why}"))),
        "{events}"
    );
    let events = api.get("/events?object=machine/gpu-01").await.expect(StatusCode::OK);
    let evicted = events["items"].as_array().unwrap().iter().find(|e| e["reason"] == "Evicted");
    assert_eq!(
        evicted.map(|e| e["message"].clone()),
        Some(json!(format!("1 copies evicted: {why}"))),
        "{events}"
    );
    cluster.stop().await;
}
