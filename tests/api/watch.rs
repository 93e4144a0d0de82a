//! Watch streams: capped per token and per replica, ended when their token is revoked, and fed
//! by one read of the changes per replica.

use std::time::Duration;

use astraeus::domain::role::Role;
use futures::StreamExt;
use futures::stream::BoxStream;
use reqwest::{Method, Response};
use serde_json::Value;
use tokio::task::JoinHandle;

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

/// Starts the replica's notification listener and its feed of changes, as `serve` does, and
/// waits until notifications are heard. The feed reads only when woken.
async fn start_feed(app: &TestApp) -> Vec<JoinHandle<()>> {
    let state = &app.state;
    let listener = tokio::spawn(state.hub.clone().listen(app.db.clone()));
    let stop = tokio_util::sync::CancellationToken::new();
    let never = Duration::from_secs(24 * 3600);
    let feed = tokio::spawn(state.feed.clone().run(app.db.clone(), state.hub.clone(), never, stop.clone()));
    while !state.hub.listening() || state.feed.reads() == 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    vec![listener, feed]
}

/// The events of an ndjson stream, one at a time.
struct Events {
    body: BoxStream<'static, reqwest::Result<axum::body::Bytes>>,
    buf: Vec<u8>,
}

impl Events {
    fn of(resp: Response) -> Events {
        assert_eq!(resp.status(), 200);
        Events { body: resp.bytes_stream().boxed(), buf: Vec::new() }
    }

    /// The next event; a stream that sends nothing for a minute fails the test.
    async fn next(&mut self) -> Value {
        loop {
            if let Some(end) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=end).collect();
                return serde_json::from_slice(&line).unwrap();
            }
            let chunk = tokio::time::timeout(Duration::from_secs(60), self.body.next())
                .await
                .expect("an event within a minute")
                .expect("the stream stays open")
                .unwrap();
            self.buf.extend_from_slice(&chunk);
        }
    }
}

fn run_named(name: &str) -> Value {
    let mut run = recipe_run();
    run["metadata"]["name"] = json!(name);
    run["spec"]["task_template"]["datavolume_refs"] = json!([]);
    run
}

fn added(event: &Value) -> (&str, &str) {
    (event["type"].as_str().unwrap(), event["object"]["metadata"]["name"].as_str().unwrap())
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_change_reaches_fifty_watchers_with_one_read_of_the_changes_and_one_of_the_object(
    db: sqlx::PgPool,
) {
    let app = spawn_app_with(db, |s| s.with_stream_caps(0, 0)).await;
    let tasks = start_feed(&app).await;
    let feed = app.state.feed.clone();
    let other = app.token_for("other", Role::Editor, false).await;
    let mut ours = Vec::new();
    for _ in 0..50 {
        ours.push(Events::of(open_watch(&app, &app.token).await));
    }
    let mut theirs = Events::of(open_watch(&app, &other).await);
    let (reads, renders) = (feed.reads(), feed.renders());

    assert_eq!(app.create_run(&run_named("one")).await.status, 201);
    for events in &mut ours {
        assert_eq!(added(&events.next().await), ("ADDED", "one"));
    }
    // Creating a run wakes the feed twice at most (the run's change and its worker's); with a
    // read per stream it would be 50 or more.
    let read = feed.reads() - reads;
    assert!((1..=2).contains(&read), "{read} reads of the changes for one new run");
    assert_eq!(feed.renders() - renders, 1, "the run was read once for all 50 streams");
    assert_eq!(feed.catch_ups(), 0, "no stream read the changes itself");

    // The other workspace's stream was not sent `one`: its first event is its own run, and
    // ours are not sent that one.
    let created = app.request(Method::POST, "/runs", Some(&other), Some(&run_named("theirs"))).await;
    assert_eq!(created.status, 201, "{}", created.text);
    assert_eq!(added(&theirs.next().await), ("ADDED", "theirs"));
    assert_eq!(app.create_run(&run_named("two")).await.status, 201);
    for events in &mut ours {
        assert_eq!(added(&events.next().await), ("ADDED", "two"));
    }
    for task in tasks {
        task.abort();
    }
}
