use crate::drives::assert_refused;
use crate::helpers::*;

const VALUE: &str = "s3cr3t-value";

fn hf_secret() -> serde_json::Value {
    json!({"metadata": {"name": "hf"}, "data": {"HF_TOKEN": VALUE}})
}

async fn create_secret(app: &TestApp, body: &serde_json::Value) -> Reply {
    app.post("/secrets", body).await
}

async fn secret_count(app: &TestApp) -> i64 {
    sqlx::query_scalar("select count(*) from secrets").fetch_one(&app.db).await.unwrap()
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_secret_shows_its_keys_but_never_its_values(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let reply = create_secret(&app, &hf_secret()).await;
    assert_eq!(reply.status, 201, "{}", reply.text);
    assert_eq!(reply.json()["metadata"]["name"], "hf");
    assert_eq!(reply.json()["metadata"]["namespace"], "default");
    assert_eq!(reply.json()["keys"], json!(["HF_TOKEN"]));
    assert!(!reply.text.contains(VALUE), "create: {}", reply.text);

    let reply = app.get("/secrets/hf").await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    assert_eq!(reply.json()["keys"], json!(["HF_TOKEN"]));
    assert!(!reply.text.contains(VALUE), "get: {}", reply.text);

    let reply = app.get("/secrets").await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    assert_eq!(reply.json()["items"][0]["keys"], json!(["HF_TOKEN"]));
    assert!(!reply.text.contains(VALUE), "list: {}", reply.text);
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_secret_value_is_not_stored_in_clear(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    assert_eq!(create_secret(&app, &hf_secret()).await.status, 201);

    let sealed: Vec<u8> = sqlx::query_scalar("select sealed from secrets").fetch_one(&app.db).await.unwrap();
    assert!(!sealed.is_empty());
    assert!(!sealed.windows(VALUE.len()).any(|w| w == VALUE.as_bytes()), "the sealed bytes hold the value");

    let rows: Vec<String> =
        sqlx::query_scalar("select s::text from secrets s").fetch_all(&app.db).await.unwrap();
    assert_eq!(rows.len(), 1);
    assert!(rows[0].contains("HF_TOKEN"), "{}", rows[0]);
    assert!(!rows[0].contains(VALUE), "{}", rows[0]);
    let hex: String = VALUE.bytes().map(|b| format!("{b:02x}")).collect();
    assert!(!rows[0].contains(&hex), "the row holds the value in hex: {}", rows[0]);
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn secret_keys_must_be_variable_names(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let body = json!({"metadata": {"name": "hf"}, "data": {"1BAD": VALUE}});
    let reply = create_secret(&app, &body).await;
    assert_refused(&reply, 422, "data.1BAD", "is not a variable name");
    assert!(!reply.text.contains(VALUE), "{}", reply.text);

    let body = json!({"metadata": {"name": "hf"}, "data": {"HF-TOKEN": VALUE}});
    assert_refused(&create_secret(&app, &body).await, 422, "data.HF-TOKEN", "is not a variable name");

    let body = json!({"metadata": {"name": "hf"}, "data": {"HF_TOKEN": "a\u{0}b"}});
    assert_refused(&create_secret(&app, &body).await, 422, "data.HF_TOKEN", "without NUL");
    assert_eq!(secret_count(&app).await, 0);
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_secret_needs_at_least_one_key(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let reply = create_secret(&app, &json!({"metadata": {"name": "hf"}, "data": {}})).await;
    assert_refused(&reply, 422, "data", "must hold between 1 and 256 keys");
    let reply = create_secret(&app, &json!({"metadata": {"name": "hf"}})).await;
    assert_refused(&reply, 422, "data", "is required");
    let reply = create_secret(&app, &json!({"metadata": {"name": "Hf"}, "data": {"HF_TOKEN": VALUE}})).await;
    assert_refused(&reply, 422, "metadata.name", "not a DNS label");
    let body = json!({"metadata": {"name": "hf"}, "data": {"HF_TOKEN": VALUE}, "colour": "red"});
    assert_refused(&create_secret(&app, &body).await, 400, "colour", "unknown field");
    assert_eq!(secret_count(&app).await, 0);
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_secret_name_can_be_used_once(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    assert_eq!(create_secret(&app, &hf_secret()).await.status, 201);
    let reply = create_secret(&app, &hf_secret()).await;
    assert_eq!(reply.status, 409, "{}", reply.text);
    assert_eq!(reply.json()["error"]["code"], "conflict");
    assert!(reply.message().contains("secret hf already exists"), "{}", reply.text);
    assert!(!reply.text.contains(VALUE), "{}", reply.text);
    assert_eq!(secret_count(&app).await, 1);
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_deleted_secret_is_gone(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    assert_eq!(create_secret(&app, &hf_secret()).await.status, 201);
    let reply = app.delete("/secrets/hf").await;
    assert_eq!(reply.status, 204, "{}", reply.text);
    let reply = app.get("/secrets/hf").await;
    assert_eq!(reply.status, 404, "{}", reply.text);
    assert!(reply.message().contains("secret hf not found"), "{}", reply.text);
    let reply = app.delete("/secrets/hf").await;
    assert_eq!(reply.status, 404, "{}", reply.text);
    assert_eq!(secret_count(&app).await, 0);
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_run_can_reference_a_secret(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    assert_eq!(app.create_drive(&recipe_drive()).await.status, 201);
    assert_eq!(create_secret(&app, &hf_secret()).await.status, 201);
    let mut run = recipe_run();
    run["spec"]["task_template"]["secret_refs"] = json!([{"name": "hf"}]);
    let reply = app.create_run(&run).await;
    assert_eq!(reply.status, 201, "{}", reply.text);
    assert_eq!(reply.json()["spec"]["task_template"]["secret_refs"], json!([{"name": "hf"}]));
    assert!(!reply.text.contains(VALUE), "{}", reply.text);
    let reply = app.get_run("inspect-food101").await;
    assert!(!reply.text.contains(VALUE), "{}", reply.text);
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_secret_in_use_cannot_be_deleted(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    assert_eq!(app.create_drive(&recipe_drive()).await.status, 201);
    assert_eq!(create_secret(&app, &hf_secret()).await.status, 201);
    let mut run = recipe_run();
    run["spec"]["task_template"]["secret_refs"] = json!([{"name": "hf"}]);
    assert_eq!(app.create_run(&run).await.status, 201);
    let reply = app.delete("/secrets/hf").await;
    assert_eq!(reply.status, 409, "{}", reply.text);
    assert_eq!(reply.message(), "secret hf is used by run inspect-food101: delete it first");
    // Once the run has ended the secret may go.
    sqlx::query("update runs set state = 'Completed'").execute(&app.db).await.unwrap();
    assert_eq!(app.delete("/secrets/hf").await.status, 204);
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_fill_must_name_secrets_that_exist_and_keeps_them(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let mut drive = recipe_drive();
    drive["spec"]["fill"]["template"]["secret_refs"] = json!([{"name": "hf"}]);
    let reply = app.create_drive(&drive).await;
    assert_refused(&reply, 422, "spec.fill.template.secret_refs[0].name", "secret hf does not exist");
    assert_eq!(create_secret(&app, &hf_secret()).await.status, 201);
    assert_eq!(app.create_drive(&drive).await.status, 201);
    let reply = app.delete("/secrets/hf").await;
    assert_eq!(reply.status, 409, "{}", reply.text);
    assert_eq!(reply.message(), "secret hf is used by drive food101: delete it first");
}

/// `pg_dump` from PATH, or from the newest server install.
fn pg_dump() -> std::path::PathBuf {
    let installed = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok().map(|e| e.path().join("bin/pg_dump")))
        .filter(|p| p.exists())
        .max();
    installed.unwrap_or_else(|| "pg_dump".into())
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_database_dump_holds_no_token_and_no_secret_value(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    assert_eq!(create_secret(&app, &hf_secret()).await.status, 201);
    let admin = app.token_for("default", astraeus::domain::role::Role::Admin, false).await;
    let minted = app
        .request(
            reqwest::Method::POST,
            "/tokens",
            Some(&admin),
            Some(&json!({"name": "ci", "role": "viewer"})),
        )
        .await;
    assert_eq!(minted.status, 201, "{}", minted.text);
    let viewer = minted.json()["token"].as_str().unwrap().to_owned();

    let options = app.db.connect_options();
    let base = std::env::var("DATABASE_URL").expect("DATABASE_URL is set for database tests");
    let mut url = reqwest::Url::parse(&base).unwrap();
    url.set_path(options.get_database().unwrap());
    let dump = std::process::Command::new(pg_dump())
        .args(["--no-owner", "--inserts", "--dbname", url.as_str()])
        .output()
        .expect("pg_dump runs");
    assert!(dump.status.success(), "{}", String::from_utf8_lossy(&dump.stderr));
    let text = String::from_utf8_lossy(&dump.stdout);
    assert!(text.contains("INSERT INTO public.secrets"), "the dump has the secrets table's rows");
    for (what, needle) in
        [("secret value", VALUE), ("editor token", app.token.as_str()), ("viewer token", viewer.as_str())]
    {
        assert!(!text.contains(needle), "the dump holds the {what}");
    }
    // Not even a token's signature part alone.
    let signature = viewer.rsplit('.').next().unwrap();
    assert!(!text.contains(signature));
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_secret_a_run_pulls_its_image_with_cannot_be_deleted(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    assert_eq!(app.create_drive(&recipe_drive()).await.status, 201);
    let registry = json!({"metadata": {"name": "registry"}, "data": {"AUTH_JSON": "{\"auths\": {}}"}});
    assert_eq!(create_secret(&app, &registry).await.status, 201);
    let mut run = recipe_run();
    run["spec"]["task_template"]["image_pull_secret"] = json!("registry");
    assert_eq!(app.create_run(&run).await.status, 201);
    let reply = app.delete("/secrets/registry").await;
    assert_eq!(reply.status, 409, "{}", reply.text);
    assert_eq!(reply.message(), "secret registry is used by run inspect-food101: delete it first");
}
