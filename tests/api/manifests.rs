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
