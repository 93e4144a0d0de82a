//! Keys: tokens name the key that signed them and outlive a rotation; sealed secrets are bound
//! to their row, opened after a rotation and resealed with the newest key; a secret that does
//! not open fails only the workers that use it.

use astraeus::auth::Keys;
use astraeus::controllers::reseal;
use astraeus::domain::role::Role;
use chacha20poly1305::ChaCha20Poly1305;
use chacha20poly1305::aead::{Aead, AeadCore, KeyInit, OsRng};
use ed25519_dalek::SigningKey;
use ed25519_dalek::pkcs8::DecodePrivateKey;
use reqwest::Method;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::helpers::*;

/// The machine's assignments, as its agent reads them.
async fn assignments(app: &TestApp, credential: &str) -> Reply {
    let url = format!("{}/agent/v1/assignments", app.address);
    let resp = app.client.get(url).bearer_auth(credential).send().await.unwrap();
    let status = resp.status();
    Reply { status, text: resp.text().await.unwrap() }
}

/// Each assigned worker's name with its environment.
fn envs(reply: &Reply) -> Vec<(String, Value)> {
    assert_eq!(reply.status, 200, "{}", reply.text);
    let workers = reply.json()["workers"].as_array().unwrap().clone();
    workers.into_iter().map(|w| (w["name"].as_str().unwrap().to_owned(), w["env"].clone())).collect()
}

/// A one-core run that mounts nothing and sets the variables of `secrets`.
fn run_with(name: &str, secrets: &[&str]) -> Value {
    let mut run = recipe_run();
    run["metadata"]["name"] = json!(name);
    run["spec"]["task_template"]["datavolume_refs"] = json!([]);
    run["spec"]["task_template"]["secret_refs"] =
        secrets.iter().map(|s| json!({"name": s})).collect::<Vec<_>>().into();
    run
}

async fn create(app: &TestApp, token: &str, path: &str, body: &Value) {
    let reply = app.request(Method::POST, path, Some(token), Some(body)).await;
    assert_eq!(reply.status, 201, "{}", reply.text);
}

async fn secret(app: &TestApp, token: &str, name: &str, var: &str, value: &str) {
    create(app, token, "/secrets", &json!({"metadata": {"name": name}, "data": {var: value}})).await;
}

/// The server's key file after `astraeus admin keygen --rotate`.
fn rotated(pem: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("signing-key.pem");
    std::fs::write(&path, pem).unwrap();
    Keys::rotate_file(&path).unwrap();
    std::fs::read_to_string(&path).unwrap()
}

/// A secret's stored key id and sealed bytes.
async fn stored(app: &TestApp, workspace: &str, name: &str) -> (Option<String>, Vec<u8>) {
    sqlx::query_as(
        "SELECT s.key_id, s.sealed FROM secrets s JOIN workspaces w ON w.id = s.workspace_id
         WHERE w.name = $1 AND s.name = $2",
    )
    .bind(workspace)
    .bind(name)
    .fetch_one(&app.db)
    .await
    .unwrap()
}

async fn overwrite(app: &TestApp, workspace: &str, name: &str, key_id: Option<&str>, sealed: &[u8]) {
    let done = sqlx::query(
        "UPDATE secrets s SET key_id = $3, sealed = $4 FROM workspaces w
         WHERE w.id = s.workspace_id AND w.name = $1 AND s.name = $2",
    )
    .bind(workspace)
    .bind(name)
    .bind(key_id)
    .bind(sealed)
    .execute(&app.db)
    .await
    .unwrap();
    assert_eq!(done.rows_affected(), 1);
}

/// `plain` as the server sealed it before key ids: ChaCha20-Poly1305 without associated data,
/// under SHA-256 of a label and the key's secret.
fn legacy_seal(pem: &str, plain: &[u8]) -> Vec<u8> {
    let seed = SigningKey::from_pkcs8_pem(pem).unwrap().to_bytes();
    let key: [u8; 32] =
        Sha256::new().chain_update(b"astraeus secret sealing key v1").chain_update(seed).finalize().into();
    let cipher = ChaCha20Poly1305::new((&key).into());
    let nonce = ChaCha20Poly1305::generate_nonce(&mut OsRng);
    let mut out = nonce.to_vec();
    out.extend(cipher.encrypt(&nonce, plain).unwrap());
    out
}

fn kid(token: &str) -> String {
    jsonwebtoken::decode_header(token).unwrap().kid.expect("a kid")
}

async fn drives_with(app: &TestApp, token: &str) -> Reply {
    app.request(Method::GET, "/drives", Some(token), None).await
}

async fn secret_changes(app: &TestApp) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM changes WHERE kind = 'secrets'")
        .fetch_one(&app.db)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn tokens_signed_before_a_rotation_still_verify_and_new_ones_name_the_new_key(db: sqlx::PgPool) {
    let old = spawn_app(db.clone()).await;
    let credential = old.join_machine("gpu-01", 1).await;
    let new = spawn_app_with_keys(db, &rotated(&old.signing_pem), |state| state).await;
    let (old_id, new_id) = (&old.keys.newest().id, &new.keys.newest().id);
    assert_ne!(old_id, new_id);
    assert_eq!(new.keys.oldest().id, *old_id, "the old key is kept, first");

    assert_eq!(kid(&old.token), *old_id);
    assert_eq!(drives_with(&new, &old.token).await.status, 200, "a user token of the old key");
    assert_eq!(assignments(&new, &credential).await.status, 200, "a machine credential of the old key");

    let token = new.token_for("default", Role::Editor, false).await;
    assert_eq!(kid(&token), *new_id);
    assert_eq!(drives_with(&new, &token).await.status, 200);
    let credential = new.join_machine("gpu-02", 1).await;
    assert_eq!(kid(&credential), *new_id);
    assert_eq!(assignments(&new, &credential).await.status, 200);
    // A server that does not hold the new key yet refuses what it signed.
    let refused = drives_with(&old, &token).await;
    assert_eq!(refused.status, 401, "{}", refused.text);
    assert!(refused.message().contains("signed with an unknown key"), "{}", refused.text);
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn secrets_sealed_before_a_rotation_open_and_are_resealed_with_the_new_key(db: sqlx::PgPool) {
    let old = spawn_app(db.clone()).await;
    secret(&old, &old.token, "hf", "HF_TOKEN", "sealed-with-the-old-key").await;
    // A value as the server stored it before key ids existed.
    secret(&old, &old.token, "legacy", "LEGACY", "placeholder").await;
    let plain = serde_json::to_vec(&json!({"LEGACY": "sealed-before-key-ids"})).unwrap();
    overwrite(&old, "default", "legacy", None, &legacy_seal(&old.signing_pem, &plain)).await;

    let new = spawn_app_with_keys(db, &rotated(&old.signing_pem), |state| state).await;
    let credential = new.join_machine("gpu-01", 1).await;
    create(&new, &new.token, "/runs", &run_with("uses", &["hf", "legacy"])).await;
    assert_eq!(astraeus::scheduler::tick(&new.db).await.unwrap(), 1);
    let expected = json!({"HF_TOKEN": "sealed-with-the-old-key", "LEGACY": "sealed-before-key-ids"});
    assert_eq!(envs(&assignments(&new, &credential).await), [("uses-0".to_owned(), expected.clone())]);

    let changes = secret_changes(&new).await;
    let pass = reseal::tick(&new.db, &new.keys).await.unwrap();
    assert_eq!(pass, reseal::Pass { resealed: 2, unopened: 0 });
    for name in ["hf", "legacy"] {
        let (key_id, _) = stored(&new, "default", name).await;
        assert_eq!(key_id.as_ref(), Some(&new.keys.newest().id), "{name}");
    }
    assert_eq!(secret_changes(&new).await, changes, "a watch of secrets sees no change");
    assert_eq!(envs(&assignments(&new, &credential).await), [("uses-0".to_owned(), expected)]);
    assert_eq!(reseal::tick(&new.db, &new.keys).await.unwrap(), reseal::Pass::default(), "nothing left");

    // A replica still on the old file cannot open them, and leaves them as they are.
    let before = stored(&new, "default", "hf").await;
    assert_eq!(reseal::tick(&old.db, &old.keys).await.unwrap(), reseal::Pass { resealed: 0, unopened: 2 });
    assert_eq!(stored(&new, "default", "hf").await, before);
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_sealed_value_moved_to_another_row_does_not_open_and_fails_only_its_worker(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let credential = app.join_machine("gpu-01", 4).await;
    let theirs = app.token_for("theirs", Role::Editor, false).await;
    secret(&app, &app.token, "hf", "HF_TOKEN", "the-other-workspaces-value").await;
    secret(&app, &theirs, "hf", "HF_TOKEN", "their-own-value").await;
    secret(&app, &theirs, "first", "FIRST", "first-value").await;
    secret(&app, &theirs, "second", "SECOND", "second-value").await;
    secret(&app, &theirs, "good", "GOOD", "good-value").await;
    // Another workspace's value in their row of the same name; another secret's value under a
    // new name.
    let (key_id, sealed) = stored(&app, "default", "hf").await;
    overwrite(&app, "theirs", "hf", key_id.as_deref(), &sealed).await;
    let (key_id, sealed) = stored(&app, "theirs", "first").await;
    overwrite(&app, "theirs", "second", key_id.as_deref(), &sealed).await;

    for (run, secret) in [("moved", "hf"), ("renamed", "second"), ("fine", "good")] {
        create(&app, &theirs, "/runs", &run_with(run, &[secret])).await;
    }
    assert_eq!(astraeus::scheduler::tick(&app.db).await.unwrap(), 3);
    let reply = assignments(&app, &credential).await;
    assert_eq!(envs(&reply), [("fine-0".to_owned(), json!({"GOOD": "good-value"}))]);
    for value in ["the-other-workspaces-value", "first-value", "their-own-value"] {
        assert!(!reply.text.contains(value), "{}", reply.text);
    }

    for (worker, secret) in [("moved-0", "hf"), ("renamed-0", "second")] {
        let w = app.request(Method::GET, &format!("/workers/{worker}"), Some(&theirs), None).await.json();
        assert_eq!(w["status"]["state"], "Failed", "{w}");
        let why = format!("secret {secret} cannot be opened: it was altered or belongs to another secret");
        assert_eq!(w["status"]["reason"], why.as_str(), "{w}");
    }
    let run = app.request(Method::GET, "/runs/moved", Some(&theirs), None).await.json();
    assert_eq!(run["status"]["state"], "Failed", "{run}");
    let fine = app.request(Method::GET, "/workers/fine-0", Some(&theirs), None).await.json();
    assert_eq!(fine["status"]["state"], "Preparing", "{fine}");
    // The owner's own value still opens where it belongs.
    create(&app, &app.token, "/runs", &run_with("own", &["hf"])).await;
    assert_eq!(astraeus::scheduler::tick(&app.db).await.unwrap(), 1);
    let env = envs(&assignments(&app, &credential).await);
    assert!(
        env.contains(&("own-0".to_owned(), json!({"HF_TOKEN": "the-other-workspaces-value"}))),
        "{env:?}"
    );
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_tampered_secret_fails_only_the_workers_using_it(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let credential = app.join_machine("gpu-01", 4).await;
    secret(&app, &app.token, "tampered", "TOKEN", "s3cr3t").await;
    secret(&app, &app.token, "registry", "AUTH_JSON", r#"{"auths":{}}"#).await;
    secret(&app, &app.token, "good", "GOOD", "good-value").await;
    for name in ["tampered", "registry"] {
        let (key_id, mut sealed) = stored(&app, "default", name).await;
        *sealed.last_mut().unwrap() ^= 1;
        overwrite(&app, "default", name, key_id.as_deref(), &sealed).await;
    }
    create(&app, &app.token, "/runs", &run_with("bad", &["tampered", "good"])).await;
    let mut pulls = run_with("pulls", &[]);
    pulls["spec"]["task_template"]["image_pull_secret"] = json!("registry");
    create(&app, &app.token, "/runs", &pulls).await;
    create(&app, &app.token, "/runs", &run_with("second", &["good"])).await;
    assert_eq!(astraeus::scheduler::tick(&app.db).await.unwrap(), 3);

    let reply = assignments(&app, &credential).await;
    assert_eq!(envs(&reply), [("second-0".to_owned(), json!({"GOOD": "good-value"}))]);
    for (worker, secret) in [("bad-0", "tampered"), ("pulls-0", "registry")] {
        let w = app.get(&format!("/workers/{worker}")).await.json();
        assert_eq!(w["status"]["state"], "Failed", "{w}");
        let why = format!("secret {secret} cannot be opened: it was altered or belongs to another secret");
        assert_eq!(w["status"]["reason"], why.as_str(), "{w}");
    }
    // Failed workers give their machine's room back and stay out of later answers.
    let cpu: i32 = sqlx::query_scalar("SELECT cpu_alloc FROM machines WHERE name = 'gpu-01'")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(cpu, 1000, "one core, second-0's");
    assert_eq!(envs(&assignments(&app, &credential).await).len(), 1);
}
