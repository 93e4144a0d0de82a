use crate::helpers::*;

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn the_recipe_drive_is_created_as_written(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let reply = app.create_drive(&recipe_drive()).await;
    assert_eq!(reply.status, 201, "{}", reply.text);
    let drive = reply.json();
    assert_eq!(drive["metadata"]["name"], "food101");
    assert_eq!(drive["metadata"]["namespace"], "default");
    assert_eq!(drive["status"]["full_name"], "default.food101");
    assert_eq!(drive["copies"], json!([]));
    assert_eq!(drive["used_by"], json!([]));
    assert_eq!(app.get_drive("food101").await.json()["spec"], drive["spec"]);
}
