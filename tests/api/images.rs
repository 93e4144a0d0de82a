//! Images count in placement: a machine whose agent reports the worker's image is preferred
//! when the data weighs the same, and the placement event says so.

use serde_json::Value;

use crate::helpers::*;

async fn report_images(app: &TestApp, credential: &str, images: Value) {
    let reply = app
        .client
        .post(format!("{}/agent/v1/heartbeat", app.address))
        .bearer_auth(credential)
        .json(
            &json!({"data_location": {"total_bytes": 0, "used_bytes": 0, "free_bytes": 0}, "images": images}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status().as_u16(), 200);
}

fn run(name: &str, image: &str) -> Value {
    let mut run = recipe_run();
    run["metadata"]["name"] = json!(name);
    run["spec"]["task_template"]["datavolume_refs"] = json!([]);
    run["spec"]["task_template"]["image"] = json!(image);
    run
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_machine_that_holds_the_image_wins_when_the_data_weighs_the_same(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    app.join_machine("gpu-01", 4).await;
    let gpu02 = app.join_machine("gpu-02", 4).await;
    let digest = format!("sha256:{}", "a".repeat(64));
    let held = json!([{"name": "docker.io/library/busybox:1.36", "digest": digest, "bytes": 1_000_000}]);
    report_images(&app, &gpu02, held).await;

    // Both machines are alike but for the image: without it the first, gpu-01, would win.
    assert_eq!(app.create_run(&run("pinned-tag", "busybox:1.36")).await.status, 201);
    assert_eq!(app.create_run(&run("other", "alpine:3.20")).await.status, 201);
    assert_eq!(astraeus::scheduler::tick(&app.db).await.unwrap(), 2);
    let (pinned, message) = app.placed("pinned-tag-0").await;
    assert_eq!(pinned, "gpu-02");
    assert_eq!(app.placed("other-0").await.0, "gpu-01");
    assert!(message.starts_with("placed on gpu-02 (complete copies 0, filling 0, image held,"), "{message}");
    assert!(message.contains("runner-up gpu-01 (complete copies 0, filling 0, image to pull,"), "{message}");
}
