//! The cap on user-API requests in progress: past it, 503 `overloaded` with Retry-After at once;
//! the agent API is not capped; a request that ends gives its place back.

use std::time::Duration;

use reqwest::StatusCode;

use crate::helpers::*;

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn past_the_cap_a_request_gets_503_at_once_and_the_agent_api_still_answers(db: sqlx::PgPool) {
    let app = spawn_app(db.clone()).await;
    assert_eq!(app.create_drive(&recipe_drive()).await.status, 201);
    assert_eq!(app.create_run(&recipe_run()).await.status, 201);
    // A second server over the same database that takes one user-API request at a time.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let state = astraeus::api::AppState::new(db.clone(), app.keys.clone()).with_max_in_flight(1);
    tokio::spawn(async move { axum::serve(listener, astraeus::api::router(state)).await.unwrap() });

    // Hold the run's row, so that deleting it waits inside the server, holding the one place.
    let mut holder = db.begin().await.unwrap();
    sqlx::query("SELECT id FROM runs WHERE name = 'inspect-food101' FOR UPDATE")
        .execute(&mut *holder)
        .await
        .unwrap();
    let deleting = tokio::spawn({
        let (client, url, token) =
            (app.client.clone(), format!("{base}/api/v1/runs/inspect-food101"), app.token.clone());
        async move { client.delete(url).bearer_auth(token).send().await.unwrap().status() }
    });
    let mut waits = 0;
    while !delete_is_waiting_for_the_lock(&db).await {
        waits += 1;
        assert!(waits < 500, "the delete never reached the locked row");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let resp = app.client.get(format!("{base}/api/v1/drives")).bearer_auth(&app.token).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(resp.headers()["retry-after"], "1");
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "overloaded");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("limit of 1 requests in progress"), "{message}");

    // The agent API is not capped: a bad credential is refused as such, not as overload.
    let resp =
        app.client.post(format!("{base}/agent/v1/heartbeat")).json(&serde_json::json!({})).send().await;
    assert_eq!(resp.unwrap().status(), StatusCode::UNAUTHORIZED);

    holder.rollback().await.unwrap();
    assert_eq!(deleting.await.unwrap(), StatusCode::NO_CONTENT);
    let resp = app.client.get(format!("{base}/api/v1/drives")).bearer_auth(&app.token).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK, "the ended request gave its place back");
}

/// Whether the delete's wait for the run's row shows in `pg_stat_activity`.
async fn delete_is_waiting_for_the_lock(db: &sqlx::PgPool) -> bool {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_stat_activity
                        WHERE datname = current_database() AND wait_event_type = 'Lock'
                          AND query LIKE '%FROM runs WHERE workspace_id%FOR UPDATE%')",
    )
    .fetch_one(db)
    .await
    .unwrap()
}
