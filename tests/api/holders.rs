//! A worker that needs a fill wherever it goes spares the machines holding copies: their data
//! is kept for the workers that mount it, counted in Postgres over every drive.

use crate::helpers::*;

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_worker_that_fills_either_way_goes_where_fewer_copies_are_held(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    app.join_with_room("gpu-01", 4).await;
    app.join_with_room("gpu-02", 4).await;
    // gpu-01 holds a copy of another drive; gpu-02 holds none, and has 400 GB less room.
    let mut other = recipe_drive();
    other["metadata"]["name"] = json!("imagenet");
    app.drive_with_copy_on(&other, "gpu-01").await;
    sqlx::query("UPDATE machines SET data_free_bytes = 6e11 WHERE name = 'gpu-02'")
        .execute(&app.db)
        .await
        .unwrap();
    assert_eq!(app.create_drive(&recipe_drive()).await.status, 201);

    // food101 is on neither machine. By room alone gpu-01 (994 GB free) beats gpu-02 (600 GB);
    // its copy weighs 500 GB of room, so gpu-02 wins.
    assert_eq!(app.create_run(&recipe_run()).await.status, 201);
    assert_eq!(astraeus::scheduler::tick(&app.db).await.unwrap(), 1);
    let (machine, message) = app.placed("inspect-food101-0").await;
    assert_eq!(machine, "gpu-02", "{message}");
    assert!(message.contains("data room 600.0 GB, copies held 0,"), "{message}");
    assert!(message.contains("runner-up gpu-01 (6.0 GB to fill,"), "{message}");
    assert!(message.contains("data room 994.0 GB, copies held 1,"), "{message}");
}
