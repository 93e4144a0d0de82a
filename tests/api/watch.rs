//! Watch streams: capped per token and per replica, and ended when their token is revoked.

use astraeus::domain::role::Role;
use futures::StreamExt;
use reqwest::{Method, Response};

use crate::helpers::*;

async fn open_watch(app: &TestApp, token: &str) -> Response {
    app.client.get(format!("{}/runs?watch=true", app.api)).bearer_auth(token).send().await.unwrap()
}

async fn assert_refused(resp: Response, says: &str) {
    assert_eq!(resp.status(), 429);
    assert!(resp.headers().get("retry-after").is_some(), "{:?}", resp.headers());
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "too_many_requests", "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains(says), "{body}");
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_token_cannot_hold_more_streams_than_its_cap_and_another_token_is_served(db: sqlx::PgPool) {
    let app = spawn_app_with(db, |s| s.with_stream_caps(3, 100)).await;
    let mut held = Vec::new();
    for _ in 0..3 {
        let resp = open_watch(&app, &app.token).await;
        assert_eq!(resp.status(), 200);
        held.push(resp);
    }
    assert_refused(open_watch(&app, &app.token).await, "this token holds 3 streams").await;
    let other = app.token_for("other", Role::Viewer, false).await;
    assert_eq!(open_watch(&app, &other).await.status(), 200);
    // A page is no stream: the token still lists.
    assert_eq!(app.get("/runs").await.status, 200);
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_replica_holds_at_most_its_cap_of_streams_whoever_asks(db: sqlx::PgPool) {
    let app = spawn_app_with(db, |s| s.with_stream_caps(0, 4)).await;
    let mut held = Vec::new();
    for i in 0..4 {
        let token = app.token_for(&format!("team-{i}"), Role::Viewer, false).await;
        let resp = open_watch(&app, &token).await;
        assert_eq!(resp.status(), 200);
        held.push(resp);
    }
    let late = app.token_for("late", Role::Viewer, false).await;
    assert_refused(open_watch(&app, &late).await, "this server holds 4 streams").await;
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_revoked_tokens_streams_end_and_its_place_is_given_back(db: sqlx::PgPool) {
    let app = spawn_app_with(db, |s| s.with_stream_caps(1, 100)).await;
    let admin = app.token_for("default", Role::Admin, false).await;
    let created = app
        .request(Method::POST, "/tokens", Some(&admin), Some(&json!({"name": "ci", "role": "viewer"})))
        .await;
    let (id, token) = (created.json()["id"].clone(), created.json()["token"].clone());
    let token = token.as_str().unwrap();
    let resp = open_watch(&app, token).await;
    assert_eq!(resp.status(), 200);
    let mut body = resp.bytes_stream();

    let revoked =
        app.request(Method::DELETE, &format!("/tokens/{}", id.as_str().unwrap()), Some(&admin), None).await;
    assert_eq!(revoked.status, 200, "{}", revoked.text);
    // The stream ends (well before its first bookmark, 30 s on) instead of staying open.
    let ended = tokio::time::timeout(std::time::Duration::from_secs(25), async {
        while let Some(chunk) = body.next().await {
            if chunk.is_err() {
                break;
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the revoked token's stream stayed open");
    // Another token's stream is untouched by the revocation.
    let other = app.token_for("default", Role::Viewer, false).await;
    assert_eq!(open_watch(&app, &other).await.status(), 200);
}
