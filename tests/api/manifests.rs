//! The digest of each whole copy's manifest, as its agent reports it in heartbeats.

use serde_json::{Value, json};
use uuid::Uuid;

use crate::helpers::*;

/// A heartbeat of the machine reporting its copy of food101 (made for `drive`) with `manifest`.
async fn beat(app: &TestApp, credential: &str, drive: Uuid, complete: bool, manifest: Option<&str>) -> Reply {
    let mut copy = json!({
        "drive": "default.food101", "drive_id": drive, "bytes": 1000, "complete": complete, "last_used_at": null,
    });
    if let Some(m) = manifest {
        copy["manifest"] = json!(m);
    }
    app.heartbeat(credential, 1_000_000, 1000, vec![copy], json!({})).await
}

/// The copy's manifest as the drive and the machine show it; they must agree.
async fn shown(app: &TestApp) -> Value {
    let drive = app.get_drive("food101").await.json();
    let machine = app.get("/machines/gpu-01").await.json();
    let on_machine = machine["copies"][0].get("manifest").cloned().unwrap_or(Value::Null);
    assert_eq!(
        drive["copies"][0].get("manifest").cloned().unwrap_or(Value::Null),
        on_machine,
        "{drive}\n{machine}"
    );
    on_machine
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_whole_copys_manifest_digest_is_kept_and_shown_and_goes_when_the_copy_is_not_whole(
    db: sqlx::PgPool,
) {
    let app = spawn_app(db).await;
    let credential = app.join_machine("gpu-01", 1).await;
    let (drive, _) = app.recipe_drive_with_copy_on("gpu-01").await;
    let (a, b) = ("a".repeat(64), "b".repeat(64));

    // Not whole: a digest is not kept.
    assert_eq!(beat(&app, &credential, drive, false, Some(&a)).await.status, 200);
    assert_eq!(shown(&app).await, Value::Null);
    // Whole, first without a manifest, then with one.
    assert_eq!(beat(&app, &credential, drive, true, None).await.status, 200);
    assert_eq!(shown(&app).await, Value::Null);
    assert_eq!(beat(&app, &credential, drive, true, Some(&a)).await.status, 200);
    assert_eq!(shown(&app).await, json!(a));
    // The same report again, then another digest: a changed digest is no unchanged heartbeat.
    assert_eq!(beat(&app, &credential, drive, true, Some(&a)).await.status, 200);
    assert_eq!(beat(&app, &credential, drive, true, Some(&b)).await.status, 200);
    assert_eq!(shown(&app).await, json!(b));
    // The marker gone: the copy fills again, and its manifest goes.
    assert_eq!(beat(&app, &credential, drive, false, Some(&b)).await.status, 200);
    assert_eq!(shown(&app).await, Value::Null);
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_manifest_digest_that_is_not_64_hex_digits_is_refused_naming_the_copy(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let credential = app.join_machine("gpu-01", 1).await;
    let created = app.create_drive(&recipe_drive()).await;
    let drive: Uuid = created.json()["metadata"]["uid"].as_str().unwrap().parse().unwrap();
    for bad in ["A".repeat(64), "a".repeat(63), "x".repeat(64), format!("{}'; --", "a".repeat(60))] {
        let reply = beat(&app, &credential, drive, true, Some(&bad)).await;
        assert_eq!(reply.status, 422, "{bad}: {}", reply.text);
        assert!(reply.text.contains("copies[0].manifest"), "{}", reply.text);
    }
}

/// A heartbeat of the machine reporting its copy of food101 as not whole, having lost `lost`.
async fn lost_beat(app: &TestApp, credential: &str, drive: Uuid, lost: Value) -> Reply {
    let copy = json!({
        "drive": "default.food101", "drive_id": drive, "bytes": 900, "complete": false, "last_used_at": null,
        "lost": lost,
    });
    app.heartbeat(credential, 1_000_000, 900, vec![copy], json!({})).await
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_whole_copy_that_lost_files_fills_again_says_which_and_the_drive_hears_of_it_once(
    db: sqlx::PgPool,
) {
    let app = spawn_app(db).await;
    let credential = app.join_machine("gpu-01", 1).await;
    let (drive, _) = app.recipe_drive_with_copy_on("gpu-01").await;
    assert_eq!(beat(&app, &credential, drive, true, Some(&"a".repeat(64))).await.status, 200);

    let named: Vec<String> = (0..20).map(|i| format!("food101/data/train-{i:05}.parquet")).collect();
    let lost = json!({"count": 25, "named": named});
    for _ in 0..2 {
        assert_eq!(lost_beat(&app, &credential, drive, lost.clone()).await.status, 200);
    }
    let copy = app.get_drive("food101").await.json()["copies"][0].clone();
    assert_eq!((&copy["state"], &copy["lost_files"]), (&json!("Filling"), &lost), "{copy}");
    assert_eq!(app.get("/machines/gpu-01").await.json()["copies"][0]["lost_files"], lost);
    let events = app.get("/events?object=drive/food101").await.json();
    let told: Vec<&Value> =
        events["items"].as_array().unwrap().iter().filter(|e| e["reason"] == "FilesLost").collect();
    assert_eq!(told.len(), 1, "{events}");
    assert_eq!(
        told[0]["message"],
        "the copy on gpu-01 lost 25 files since it was filled (food101/data/train-00000.parquet, \
         food101/data/train-00001.parquet, food101/data/train-00002.parquet and 22 more): it is no longer \
         whole, and is filled again when next needed"
    );
    assert_eq!(told[0]["type"], "Warning", "{}", told[0]);

    // While it is filled again its agent says nothing of what it lost; once whole, it is gone.
    let filling = json!({"drive": "default.food101", "drive_id": drive, "bytes": 100, "complete": false, "last_used_at": null});
    assert_eq!(app.heartbeat(&credential, 1_000_000, 100, vec![filling], json!({})).await.status, 200);
    assert_eq!(app.get_drive("food101").await.json()["copies"][0]["lost_files"], lost);
    assert_eq!(beat(&app, &credential, drive, true, None).await.status, 200);
    let copy = app.get_drive("food101").await.json()["copies"][0].clone();
    assert_eq!((&copy["state"], copy.get("lost_files")), (&json!("Complete"), None), "{copy}");
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn lost_files_past_their_bounds_are_refused_naming_the_field(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let credential = app.join_machine("gpu-01", 1).await;
    let (drive, _) = app.recipe_drive_with_copy_on("gpu-01").await;
    let many: Vec<String> = (0..21).map(|i| i.to_string()).collect();
    for (lost, field) in [
        (json!({"count": 21, "named": many}), "copies[0].lost.named"),
        (json!({"count": 0, "named": ["a"]}), "copies[0].lost.count"),
        (json!({"count": 1, "named": ["/etc/shadow"]}), "copies[0].lost.named[0]"),
        (json!({"count": 1, "named": ["x".repeat(4097)]}), "copies[0].lost.named[0]"),
    ] {
        let reply = lost_beat(&app, &credential, drive, lost).await;
        assert_eq!(reply.status, 422, "{}", reply.text);
        assert_eq!(reply.fields()[0].0, field, "{}", reply.text);
    }
    let copy = app.get_drive("food101").await.json()["copies"][0].clone();
    assert_eq!(copy.get("lost_files"), None, "nothing half-written: {copy}");
}
