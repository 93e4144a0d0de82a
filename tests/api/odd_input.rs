//! Odd input in paths and query strings: names no object can have, bytes that are not UTF-8,
//! regular-expression characters. Each is a 4xx with the error body, never a 500.

use astraeus::domain::role::Role;
use reqwest::Method;

use crate::helpers::*;

/// `(status, error.code)` of a reply, for one-line assertions.
fn answer(reply: &Reply) -> (u16, String) {
    let code = reply.json()["error"]["code"].as_str().unwrap_or_default().to_owned();
    (reply.status.as_u16(), code)
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_worker_named_with_a_nul_byte_is_not_found(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    for path in ["/workers/a%00b", "/workers/a%00b/logs", "/workers/Inspect-0", "/workers/a%20b-0/logs"] {
        let reply = app.get(path).await;
        assert_eq!(answer(&reply), (404, "not_found".into()), "{path}: {}", reply.text);
        assert!(reply.message().starts_with("worker "), "{path}: {}", reply.message());
    }
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn deleting_a_secret_named_with_a_nul_byte_is_not_found(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let reply = app.delete("/secrets/a%00b").await;
    assert_eq!(answer(&reply), (404, "not_found".into()), "{}", reply.text);
    assert_eq!(reply.message(), "secret a\0b not found");
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_workspace_or_cluster_named_with_a_nul_byte_is_not_found(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let org = app.token_for("default", Role::Admin, true).await;
    let id = uuid::Uuid::now_v7();
    let cases = [
        (
            Method::GET,
            "/workspaces/a%00b/clusters/main/host-paths".to_owned(),
            None,
            "workspace a\0b not found",
        ),
        (Method::GET, "/workspaces/default/clusters/a%00b/host-paths".into(), None, "cluster a\0b not found"),
        (
            Method::PUT,
            "/workspaces/default/clusters/a%00b/host-paths".into(),
            Some(json!({"paths": ["/data"]})),
            "cluster a\0b not found",
        ),
        (Method::GET, "/clusters/a%00b/join-tokens".into(), None, "cluster a\0b not found"),
        (Method::POST, "/clusters/a%00b/join-tokens".into(), Some(json!({})), "cluster a\0b not found"),
        (Method::DELETE, format!("/clusters/a%00b/join-tokens/{id}"), None, "not found"),
    ];
    for (method, path, body, message) in cases {
        let reply = app.request(method.clone(), &path, Some(&org), body.as_ref()).await;
        assert_eq!(answer(&reply), (404, "not_found".into()), "{method} {path}: {}", reply.text);
        assert!(reply.message().ends_with(message), "{method} {path}: {}", reply.message());
    }
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn an_events_object_no_object_can_be_named_is_a_bad_request_naming_object(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    // `(` once reached the database as part of a regular expression.
    for object in ["run/(", "run/a%5B", "run/a.*", "worker/a%00b", "drive/", "run/Food"] {
        let reply = app.get(&format!("/events?object={object}")).await;
        assert_eq!(answer(&reply), (400, "bad_request".into()), "{object}: {}", reply.text);
        let fields = reply.fields();
        assert_eq!(fields.len(), 1, "{object}: {}", reply.text);
        assert_eq!(fields[0].0, "object", "{object}: {}", reply.text);
        assert!(fields[0].1.contains("KIND/NAME"), "{object}: {}", fields[0].1);
    }
    let reply = app.get("/events?object=run/inspect-food101&limit=0").await;
    assert_eq!(answer(&reply), (400, "bad_request".into()), "{}", reply.text);
    assert_eq!(reply.fields()[0].0, "limit", "{}", reply.text);
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_run_name_is_not_a_pattern_for_its_workers_events(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let ws = astraeus::store::workspaces::ensure(&app.db, "default").await.unwrap();
    for worker in ["ab-0", "a-0", "a-x"] {
        let event = astraeus::store::events::New {
            workspace: Some(ws.id),
            object_kind: "worker",
            object_name: worker,
            warning: false,
            reason: "Scheduled",
            message: "placed",
            source: "scheduler",
        };
        astraeus::store::events::record(&app.db, &event).await.unwrap();
    }
    let reply = app.get("/events?object=run/a").await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    let names: Vec<_> =
        reply.json()["items"].as_array().unwrap().iter().map(|e| e["object_name"].clone()).collect();
    assert_eq!(names, [json!("a-0")], "only run a's own workers: {}", reply.text);
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_path_parameter_that_is_not_utf8_is_a_bad_request_in_the_error_body(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let cases = [
        (Method::GET, "/drives/%FF"),
        (Method::GET, "/runs/%C3/workers"),
        (Method::GET, "/workers/%FF/logs"),
        (Method::DELETE, "/tokens/%FF"),
    ];
    for (method, path) in cases {
        let url = format!("{}{path}", app.api);
        let resp = app.client.request(method, url).bearer_auth(&app.token).send().await.unwrap();
        let content_type = resp.headers()["content-type"].to_str().unwrap().to_owned();
        let reply = Reply { status: resp.status(), text: resp.text().await.unwrap() };
        assert_eq!(answer(&reply), (400, "bad_request".into()), "{path}: {}", reply.text);
        assert!(content_type.starts_with("application/json"), "{path}: {content_type}");
        let fields = reply.fields();
        assert_eq!(fields.len(), 1, "{path}: {}", reply.text);
        assert!(["name", "id"].contains(&fields[0].0.as_str()), "{path}: {}", reply.text);
        assert!(fields[0].1.contains("UTF-8"), "{path}: {}", reply.text);
    }
}
