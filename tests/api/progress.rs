//! The progress of a copy being filled, measured from the machine's heartbeats.

use serde_json::{Value, json};
use uuid::Uuid;

use crate::helpers::*;

const GB: u64 = 1_000_000_000;

/// A heartbeat of `gpu-01` reporting its copy of food101 (made for `drive`) holding `bytes`, as
/// its agent sends it.
async fn beat(app: &TestApp, credential: &str, drive: Uuid, bytes: u64, complete: bool) {
    let copy = json!({
        "drive": "default.food101", "drive_id": drive, "bytes": bytes, "complete": complete, "last_used_at": null,
    });
    let reply = app.heartbeat(credential, 100 * GB, bytes, vec![copy], json!({})).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
}

/// The progress of the copy as the drive and the machine show it; they must agree.
async fn progress(app: &TestApp) -> Value {
    let drive = app.get_drive("food101").await.json();
    let machine = app.get("/machines/gpu-01").await.json();
    let on_machine = &machine["copies"][0]["progress"];
    assert_eq!(&drive["copies"][0]["progress"], on_machine, "{drive}\n{machine}");
    on_machine.clone()
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_filling_copy_shows_its_rate_and_time_left_after_two_heartbeats(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let credential = app.join_machine("gpu-01", 1).await;
    let (drive, _) = app.recipe_drive_with_copy_on("gpu-01").await;
    assert_eq!(progress(&app).await, json!({"bytes": 0, "size_hint_bytes": 6 * GB, "percent": 0.0}));

    // 1 GB of 6 GB = 16.7%; one observation gives no rate.
    beat(&app, &credential, drive, GB, false).await;
    assert_eq!(progress(&app).await, json!({"bytes": GB, "size_hint_bytes": 6 * GB, "percent": 16.7}));

    // The next heartbeat, 20 s later: the first observation is moved 20 s back rather than
    // waited for.
    sqlx::query("UPDATE copies SET bytes_at = bytes_at - interval '20 seconds'")
        .execute(&app.db)
        .await
        .unwrap();
    beat(&app, &credential, drive, 3 * GB, false).await;
    let (sample, span): (i64, f64) = sqlx::query_as(
        "SELECT progress_bytes, extract(epoch FROM bytes_at - progress_at)::float8 FROM copies",
    )
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(sample, GB as i64, "the rate is measured against the first heartbeat");
    assert!(span >= 20.0, "{span}");
    // Pin the span to exactly 20 s so the figures are exact: (3 GB - 1 GB) / 20 s = 100 MB/s,
    // and (6 GB - 3 GB) / 100 MB/s = 30 s left, counting down from the heartbeat.
    sqlx::query("UPDATE copies SET bytes_at = now(), progress_at = now() - interval '20 seconds'")
        .execute(&app.db)
        .await
        .unwrap();
    let p = progress(&app).await;
    assert_eq!(p["percent"], 50.0, "{p}");
    assert_eq!(p["bytes_per_second"], 100_000_000, "{p}");
    let eta = p["eta_seconds"].as_u64().unwrap();
    assert!((25..=30).contains(&eta), "{p}");

    // A heartbeat that repeats the report changes nothing.
    beat(&app, &credential, drive, 3 * GB, false).await;
    assert_eq!(progress(&app).await["bytes_per_second"], 100_000_000);

    // Whole: no progress any more.
    beat(&app, &credential, drive, 6 * GB, true).await;
    let drive = app.get_drive("food101").await.json();
    assert_eq!(drive["copies"][0]["state"], "Complete", "{drive}");
    assert_eq!(drive["copies"][0].get("progress"), None, "{drive}");
    let machine = app.get("/machines/gpu-01").await.json();
    assert_eq!(machine["copies"][0].get("progress"), None, "{machine}");
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_worker_goes_where_its_copy_being_filled_will_be_whole_soonest(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let gpu01 = app.join_with_room("gpu-01", 4).await;
    let gpu02 = app.join_with_room("gpu-02", 4).await;
    let created = app.create_drive(&recipe_drive()).await;
    let drive: Uuid = created.json()["metadata"]["uid"].as_str().unwrap().parse().unwrap();
    for machine in ["gpu-01", "gpu-02"] {
        let id: Uuid = sqlx::query_scalar("SELECT id FROM machines WHERE name = $1")
            .bind(machine)
            .fetch_one(&app.db)
            .await
            .unwrap();
        astraeus::store::copies::ensure_for(&app.db, drive, id).await.unwrap();
    }
    // Both copies of 6 GB are being filled at 10 MB/s: gpu-01 has 5 GB left, 500 s (9 min in
    // steps of a minute), gpu-02 1 GB, 100 s (2 min). Without the estimate gpu-01, first by
    // name, would win.
    beat(&app, &gpu01, drive, GB, false).await;
    beat(&app, &gpu02, drive, 5 * GB, false).await;
    sqlx::query("UPDATE copies SET fill_rate = 10000000").execute(&app.db).await.unwrap();

    assert_eq!(app.create_run(&recipe_run()).await.status, 201);
    assert_eq!(astraeus::scheduler::tick(&app.db).await.unwrap(), 1);
    let (machine, message) = app.placed("inspect-food101-0").await;
    assert_eq!(machine, "gpu-02", "{message}");
    assert!(
        message.contains("placed on gpu-02 (complete copies 0, filling 1, data ready in 2 min,"),
        "{message}"
    );
    assert!(
        message.contains("runner-up gpu-01 (complete copies 0, filling 1, data ready in 9 min,"),
        "{message}"
    );
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_copys_fill_rate_is_kept_from_its_heartbeats_once_it_is_whole(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let credential = app.join_machine("gpu-01", 1).await;
    let (drive, _) = app.recipe_drive_with_copy_on("gpu-01").await;
    let rate = async || -> Option<i64> {
        sqlx::query_scalar("SELECT fill_rate FROM copies").fetch_one(&app.db).await.unwrap()
    };

    // 1 GB, then 3 GB: the first observation becomes the sample; no rate yet.
    beat(&app, &credential, drive, GB, false).await;
    beat(&app, &credential, drive, 3 * GB, false).await;
    assert_eq!(rate().await, None);
    // The sample (1 GB) 60 s old, the last change (3 GB) 40 s old: the next new bytes take a new
    // sample and measure (3 GB - 1 GB) / 20 s = 100 MB/s.
    sqlx::query("UPDATE copies SET progress_at = now() - interval '60 seconds', bytes_at = now() - interval '40 seconds'")
        .execute(&app.db)
        .await
        .unwrap();
    beat(&app, &credential, drive, 4 * GB, false).await;
    assert_eq!(rate().await, Some(100_000_000));
    // The sample just taken is 3 GB, 40 s before 4 GB was reported: with the last bytes the
    // copy is whole and measured once more, (4 GB - 3 GB) / 40 s = 25 MB/s.
    sqlx::query("UPDATE copies SET progress_at = bytes_at - interval '40 seconds'")
        .execute(&app.db)
        .await
        .unwrap();
    beat(&app, &credential, drive, 6 * GB, true).await;
    assert_eq!(rate().await, Some(25_000_000));
    // Whole, the rate stays, for placement to weigh the machine's next fill.
    beat(&app, &credential, drive, 6 * GB, true).await;
    assert_eq!(rate().await, Some(25_000_000));
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_copy_just_made_whole_keeps_its_size_hints_room_until_it_is_measured_whole(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let credential = app.join_with_room("gpu-01", 4).await;
    sqlx::query("UPDATE machines SET data_limit_bytes = 10e9").execute(&app.db).await.unwrap();
    let (food101, _) = app.recipe_drive_with_copy_on("gpu-01").await;
    // Kept, so that room comes from nowhere else.
    sqlx::query("UPDATE copies SET evictable = false").execute(&app.db).await.unwrap();
    let mut other = recipe_drive();
    other["metadata"]["name"] = json!("food102");
    assert_eq!(app.create_drive(&other).await.status, 201);
    let mut run = recipe_run();
    run["metadata"]["name"] = json!("inspect-food102");
    run["spec"]["task_template"]["datavolume_refs"][0]["name"] = json!("food102");
    assert_eq!(app.create_run(&run).await.status, 201);
    let whole = async |bytes: u64, measured: bool| {
        let copy = json!({
            "drive": "default.food101", "drive_id": food101, "bytes": bytes, "complete": true,
            "measured": measured, "last_used_at": null,
        });
        let reply = app.heartbeat(&credential, 100 * GB, bytes, vec![copy], json!({})).await;
        assert_eq!(reply.status, 200, "{}", reply.text);
        astraeus::scheduler::tick(&app.db).await.unwrap();
        app.get("/workers/inspect-food102-0").await.json()
    };

    // The marker is there, but the copy's last walk began before it and found 1 GB: the copy
    // counts its 6 GB hint, so 10 GB - 6 GB leaves 4 GB, not the 9 GB its bytes would.
    let worker = whole(GB, false).await;
    assert_eq!(worker["status"]["state"], "Pending", "{worker}");
    let reason = worker["status"]["reason"].as_str().unwrap();
    assert!(reason.contains("needs 6.0 GB at this machine's data location, 4.0 GB free"), "{reason}");

    // Measured whole at 3 GB, below its hint: 7 GB free, and the worker is placed.
    let worker = whole(3 * GB, true).await;
    assert_eq!(worker["status"]["machine"], "gpu-01", "{worker}");
}
