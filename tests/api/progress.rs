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
    let body = json!({
        "data_location": {"total_bytes": 100 * GB, "used_bytes": bytes, "free_bytes": 100 * GB - bytes},
        "copies": [copy],
    });
    let reply = app
        .client
        .post(format!("{}/agent/v1/heartbeat", app.address))
        .bearer_auth(credential)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status().as_u16(), 200);
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
    let created = app.create_drive(&recipe_drive()).await;
    assert_eq!(created.status, 201, "{}", created.text);
    let drive: Uuid = created.json()["metadata"]["uid"].as_str().unwrap().parse().unwrap();
    let machine: Uuid =
        sqlx::query_scalar("SELECT id FROM machines WHERE name = 'gpu-01'").fetch_one(&app.db).await.unwrap();
    // The copy a worker placed on gpu-01 would make.
    astraeus::store::copies::ensure_for(&app.db, drive, machine).await.unwrap();
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
