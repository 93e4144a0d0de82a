//! Costs one workspace could impose on the others or on the organisation: who may read the
//! organisation's metrics and revoke its admins' tokens.

use astraeus::domain::role::Role;
use futures::StreamExt;
use reqwest::Method;

use crate::helpers::*;

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn metrics_on_the_api_need_an_organisation_admin_token(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let scrape = |token: Option<String>| {
        let mut req = app.client.get(format!("{}/metrics", app.address));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        async move { req.send().await.unwrap() }
    };
    let workspace_admin = app.token_for("team-a", Role::Admin, false).await;
    let refused = scrape(Some(workspace_admin)).await;
    assert_eq!(refused.status(), 403);
    let body: serde_json::Value = refused.json().await.unwrap();
    assert!(body["error"]["message"].as_str().unwrap().contains("organisation admin"), "{body}");
    assert_eq!(scrape(None).await.status(), 401);
    let org_admin = app.token_for("team-a", Role::Admin, true).await;
    let scraped = scrape(Some(org_admin)).await;
    assert_eq!(scraped.status(), 200);
    assert!(scraped.text().await.unwrap().contains("astraeus_db_pool_connections"));
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_workspace_admin_cannot_revoke_an_organisation_admins_token(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let org_admin = app.token_for("default", Role::Admin, true).await;
    let workspace_admin = app.token_for("default", Role::Admin, false).await;
    let org_id = claims_of(&org_admin)["jti"].as_str().unwrap().to_owned();
    let path = format!("/tokens/{org_id}");

    let refused = app.request(Method::DELETE, &path, Some(&workspace_admin), None).await;
    assert_eq!(refused.status, 403, "{}", refused.text);
    assert!(refused.message().contains("organisation admin"), "{}", refused.text);
    // The organisation admin's token still works: nothing was half-revoked.
    assert_eq!(app.request(Method::GET, "/drives", Some(&org_admin), None).await.status, 200);
    let listed = app.request(Method::GET, "/tokens", Some(&org_admin), None).await.json();
    let row = listed["items"].as_array().unwrap().iter().find(|t| t["id"] == org_id.as_str()).unwrap();
    assert!(row["revoked_at"].is_null(), "{row}");

    // An organisation admin may revoke it, and a workspace admin may still revoke its peers.
    let peer = app.token_for("default", Role::Editor, false).await;
    let peer_id = claims_of(&peer)["jti"].as_str().unwrap().to_owned();
    let revoked =
        app.request(Method::DELETE, &format!("/tokens/{peer_id}"), Some(&workspace_admin), None).await;
    assert_eq!(revoked.status, 200, "{}", revoked.text);
    let revoked = app.request(Method::DELETE, &path, Some(&org_admin), None).await;
    assert_eq!(revoked.status, 200, "{}", revoked.text);
    assert_eq!(app.request(Method::GET, "/drives", Some(&org_admin), None).await.status, 401);
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_list_limit_out_of_range_names_the_limit_field(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let reply = app.get("/runs?limit=1001").await;
    assert_eq!(reply.status, 400, "{}", reply.text);
    assert_eq!(reply.fields(), [("limit".to_owned(), "must be between 1 and 1000".to_owned())]);
}

/// A run of `replicas` one-core workers that mount nothing, each carrying `arg_bytes` of args.
pub fn heavy_run(name: &str, replicas: u32, arg_bytes: usize) -> serde_json::Value {
    let mut run = recipe_run();
    run["metadata"]["name"] = json!(name);
    run["spec"]["replicas"] = json!(replicas);
    run["spec"]["task_template"]["datavolume_refs"] = json!([]);
    // In arguments of at most 100 KiB, each within the limit of one argument.
    let args: Vec<String> = (0..arg_bytes.div_ceil(102_400))
        .map(|i| "x".repeat((arg_bytes - i * 102_400).min(102_400)))
        .collect();
    run["spec"]["task_template"]["args"] = json!(args);
    run
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_machine_with_many_large_workers_gets_them_in_bounded_answers_and_misses_none(db: sqlx::PgPool) {
    use astraeus::api::agent::ANSWER_BYTES;
    let app = spawn_app(db).await;
    let credential = app.join_machine("gpu-01", 40).await;
    // 30 workers × 200 KiB = 6 MB of assignments, more than one answer may carry.
    let reply = app.create_run(&heavy_run("big", 30, 200 * 1024)).await;
    assert_eq!(reply.status, 201, "{}", reply.text);
    assert_eq!(astraeus::scheduler::tick(&app.db).await.unwrap(), 30);

    let (mut names, mut parts, mut after) = (Vec::new(), 0, None::<String>);
    loop {
        let query = match &after {
            None => "version=0".to_owned(),
            Some(a) => format!("after={a}"),
        };
        let resp = app
            .client
            .get(format!("{}/agent/v1/assignments?{query}", app.address))
            .bearer_auth(&credential)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let body = resp.bytes().await.unwrap();
        assert!(body.len() <= ANSWER_BYTES + 4096, "an answer of {} bytes", body.len());
        let answer: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let workers = answer["workers"].as_array().unwrap();
        assert!(!workers.is_empty());
        names.extend(workers.iter().map(|w| w["name"].as_str().unwrap().to_owned()));
        parts += 1;
        match answer["next"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => break,
        }
    }
    assert!(parts >= 2, "{parts} parts");
    let mut want: Vec<String> = (0..30).map(|i| format!("big-{i}")).collect();
    want.sort();
    names.sort();
    assert_eq!(names, want, "every worker once");

    // The agent's client puts the parts together.
    let mut client = astraeus::agent::client::Client::new(&app.address).unwrap();
    client.resume(&credential);
    let whole = client.assignments(0, false, 0).await.unwrap().expect("an answer");
    assert_eq!(whole.workers.len(), 30);
    assert!(whole.next.is_none());
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_run_past_its_byte_budget_is_refused_naming_the_field(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    // 300 KiB of args in one worker; 1000 workers of 20 KiB each.
    let reply = app.create_run(&heavy_run("fat", 1, 300 * 1024)).await;
    assert_eq!(reply.status, 422, "{}", reply.text);
    assert_eq!(reply.fields()[0].0, "spec.task_template.args", "{}", reply.text);
    let reply = app.create_run(&heavy_run("wide", 1000, 20 * 1024)).await;
    assert_eq!(reply.status, 422, "{}", reply.text);
    assert_eq!(reply.fields()[0].0, "spec.replicas", "{}", reply.text);
    assert_eq!(app.get("/runs").await.json()["items"], json!([]), "nothing half-written");
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_flood_of_joins_and_probes_from_one_address_is_limited_and_users_are_still_served(
    db: sqlx::PgPool,
) {
    // One a second, bursts of two: the third request at once waits.
    let app = spawn_app_with(db, |s| s.with_address_rate_limit(1)).await;
    let probe = || app.client.get(format!("{}/readyz", app.address)).send();
    assert_eq!(probe().await.unwrap().status(), 200);
    assert_eq!(probe().await.unwrap().status(), 200);
    let limited = probe().await.unwrap();
    assert_eq!(limited.status(), 429);
    assert!(limited.headers().get("retry-after").is_some());
    let body: serde_json::Value = limited.json().await.unwrap();
    assert!(body["error"]["message"].as_str().unwrap().contains("from this address"), "{body}");
    let join = app
        .client
        .post(format!("{}/agent/v1/join", app.address))
        .json(&json!({"join_token": "guess", "name": "gpu-01", "capacity": {"cpu_cores": 1, "memory_bytes": 1, "gpus": 0}}))
        .send()
        .await
        .unwrap();
    assert_eq!(join.status(), 429, "a guessed join token is not even looked up");
    assert_eq!(app.client.get(format!("{}/healthz", app.address)).send().await.unwrap().status(), 429);
    // The user API is limited per token, not by this address's flood.
    assert_eq!(app.get("/runs").await.status, 200);
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_heartbeat_body_past_its_cap_is_refused_before_it_is_read_whole(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let credential = app.join_machine("gpu-01", 1).await;
    // 33 chunks of 1 MiB, then a body that never ends: only a refusal made before the end
    // can answer.
    let chunks = futures::stream::iter((0..33).map(|_| Ok::<_, std::io::Error>(vec![b' '; 1 << 20])))
        .chain(futures::stream::pending());
    let resp = app
        .client
        .post(format!("{}/agent/v1/heartbeat", app.address))
        .bearer_auth(&credential)
        .header("content-type", "application/json")
        .body(reqwest::Body::wrap_stream(chunks))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 413);
}
