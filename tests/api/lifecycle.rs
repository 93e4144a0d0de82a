//! A machine's lifecycle: cordon, drain and delete, for organisation admins only.

use astraeus::domain::role::Role;
use reqwest::Method;
use serde_json::Value;

use crate::helpers::*;

async fn join(app: &TestApp, name: &str, cpu_cores: u32) -> String {
    app.join_machine(name, cpu_cores).await
}

/// A run of `replicas` one-core workers that mounts nothing.
fn run(name: &str, replicas: u32) -> Value {
    let mut run = recipe_run();
    run["metadata"]["name"] = json!(name);
    run["spec"]["replicas"] = json!(replicas);
    run["spec"]["task_template"]["datavolume_refs"] = json!([]);
    run
}

/// What the machine's agent says of a worker, as the agent would say it: the status code.
async fn report(app: &TestApp, credential: &str, worker: &Value, state: &str) -> u16 {
    let uid = worker["metadata"]["uid"].as_str().unwrap();
    let url = format!("{}/agent/v1/workers/{uid}/status", app.address);
    let body = json!({"state": state, "exit_code": null});
    app.client.post(url).bearer_auth(credential).json(&body).send().await.unwrap().status().as_u16()
}

async fn assignments(app: &TestApp, credential: &str) -> (u16, Value) {
    let url = format!("{}/agent/v1/assignments?version=0&wait_seconds=0", app.address);
    let resp = app.client.get(url).bearer_auth(credential).send().await.unwrap();
    (resp.status().as_u16(), resp.json().await.unwrap_or_default())
}

async fn worker(app: &TestApp, name: &str) -> Value {
    app.get(&format!("/workers/{name}")).await.json()
}

async fn act(app: &TestApp, token: &str, path: &str, body: Option<&Value>) -> Reply {
    app.request(Method::POST, path, Some(token), Some(body.unwrap_or(&json!({})))).await
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_cordoned_machine_takes_no_new_workers_until_it_is_made_eligible_again(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let admin = app.token_for("default", Role::Admin, true).await;
    let workspace_admin = app.token_for("default", Role::Admin, false).await;
    join(&app, "gpu-01", 4).await;

    let refused = act(&app, &workspace_admin, "/machines/gpu-01/cordon", None).await;
    assert_eq!(refused.status, 403, "{}", refused.text);
    let cordoned = act(&app, &admin, "/machines/gpu-01/cordon", None).await;
    assert_eq!(cordoned.status, 200, "{}", cordoned.text);
    assert_eq!(cordoned.json()["status"]["cordoned"], true);

    assert_eq!(app.create_run(&run("late", 1)).await.status, 201);
    assert_eq!(astraeus::scheduler::tick(&app.db).await.unwrap(), 0);
    let waiting = worker(&app, "late-0").await;
    assert_eq!(waiting["status"]["state"], "Pending");
    assert_eq!(waiting["status"]["reason"], "cordoned", "{waiting}");

    let eligible = act(&app, &admin, "/machines/gpu-01/uncordon", None).await;
    assert_eq!(eligible.status, 200, "{}", eligible.text);
    assert_eq!(eligible.json()["status"]["cordoned"], false);
    assert_eq!(astraeus::scheduler::tick(&app.db).await.unwrap(), 1);
    assert_eq!(worker(&app, "late-0").await["status"]["machine"], "gpu-01");
    let events = app.get("/events?object=machine/gpu-01").await.json();
    let reasons: Vec<&str> =
        events["items"].as_array().unwrap().iter().map(|e| e["reason"].as_str().unwrap()).collect();
    assert!(reasons.contains(&"Cordoned") && reasons.contains(&"Uncordoned"), "{events}");
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_drain_places_waiting_workers_elsewhere_and_fails_running_ones_at_its_deadline(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let admin = app.token_for("default", Role::Admin, true).await;
    let gpu01 = join(&app, "gpu-01", 2).await;
    assert_eq!(app.create_run(&run("job", 2)).await.status, 201);
    assert_eq!(astraeus::scheduler::tick(&app.db).await.unwrap(), 2);
    // One started, the other still waits to (its image is being pulled, say).
    assert_eq!(report(&app, &gpu01, &worker(&app, "job-0").await, "Running").await, 200);
    join(&app, "gpu-02", 2).await;

    let refused =
        act(&app, &admin, "/machines/gpu-01/drain", Some(&json!({"deadline_seconds": 604801}))).await;
    assert_eq!(refused.status, 422, "{}", refused.text);
    assert_eq!(refused.json()["error"]["fields"][0]["path"], "deadline_seconds");
    let draining = act(&app, &admin, "/machines/gpu-01/drain", Some(&json!({"deadline_seconds": 0}))).await;
    assert_eq!(draining.status, 200, "{}", draining.text);
    assert_eq!(draining.json()["status"]["cordoned"], true);
    assert!(draining.json()["status"]["drain_deadline"].is_string(), "{}", draining.text);

    // The waiting worker is placed again, on the other machine, and never back on gpu-01.
    let moved = worker(&app, "job-1").await;
    assert_eq!(moved["status"]["state"], "Pending", "{moved}");
    assert_eq!(moved["status"]["reason"], "machine gpu-01 is draining: placing again elsewhere");
    let (_, left) = assignments(&app, &gpu01).await;
    let uids: Vec<&str> =
        left["workers"].as_array().unwrap().iter().map(|w| w["name"].as_str().unwrap()).collect();
    assert_eq!(uids, ["job-0"], "{left}");
    assert_eq!(astraeus::scheduler::tick(&app.db).await.unwrap(), 1);
    assert_eq!(worker(&app, "job-1").await["status"]["machine"], "gpu-02");

    // Past the deadline, what still runs fails with a reason that says so; the drain ends.
    assert_eq!(astraeus::controllers::drain::tick(&app.db).await.unwrap(), 1);
    let failed = worker(&app, "job-0").await;
    assert_eq!(failed["status"]["state"], "Failed");
    let reason = failed["status"]["reason"].as_str().unwrap();
    assert!(reason.starts_with("machine gpu-01 was drained by an organisation admin"), "{reason}");
    let machine = app.get("/machines/gpu-01").await.json();
    assert_eq!(
        (&machine["status"]["cordoned"], &machine["status"]["drain_deadline"]),
        (&json!(true), &Value::Null)
    );
    assert_eq!(machine["status"]["allocated"]["cpu_cores"], 0.0, "{machine}");
    assert_eq!(astraeus::controllers::drain::tick(&app.db).await.unwrap(), 0);
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_deleted_machine_loses_its_credential_at_once_and_its_workers_fail_saying_why(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let admin = app.token_for("default", Role::Admin, true).await;
    let workspace_admin = app.token_for("default", Role::Admin, false).await;
    let credential = join(&app, "gpu-01", 2).await;
    assert_eq!(app.create_run(&run("job", 1)).await.status, 201);
    assert_eq!(astraeus::scheduler::tick(&app.db).await.unwrap(), 1);
    assert_eq!(report(&app, &credential, &worker(&app, "job-0").await, "Running").await, 200);
    // The credential is checked and remembered as good before the deletion.
    assert_eq!(assignments(&app, &credential).await.0, 200);

    let refused = app.request(Method::DELETE, "/machines/gpu-01", Some(&workspace_admin), None).await;
    assert_eq!(refused.status, 403, "{}", refused.text);
    let deleted = app.request(Method::DELETE, "/machines/gpu-01", Some(&admin), None).await;
    assert_eq!(deleted.status, 204, "{}", deleted.text);

    let (status, answer) = assignments(&app, &credential).await;
    assert_eq!(status, 401, "{answer}");
    assert!(answer["error"]["message"].as_str().unwrap().contains("machine gpu-01 was deleted"), "{answer}");
    let failed = worker(&app, "job-0").await;
    assert_eq!(failed["status"]["state"], "Failed");
    assert_eq!(failed["status"]["reason"], "machine gpu-01 was deleted by an organisation admin");
    assert_eq!(app.get("/runs/job").await.json()["status"]["state"], "Failed");
    assert_eq!(app.get("/machines/gpu-01").await.status, 404);
    // The name is free for the machine to join again, with a new join token.
    join(&app, "gpu-01", 2).await;
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_machine_filling_a_copy_can_be_deleted_and_its_fill_run_goes_with_it(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let admin = app.token_for("default", Role::Admin, true).await;
    join(&app, "gpu-01", 8).await;
    assert_eq!(app.create_drive(&recipe_drive()).await.status, 201);
    let confirm = json!({"path": "/var/lib/astraeus"});
    let confirmed = act(&app, &admin, "/machines/gpu-01/data-location", Some(&confirm)).await;
    assert_eq!(confirmed.status, 200, "{}", confirmed.text);
    let room = "UPDATE machines SET data_total_bytes = 1e12, data_free_bytes = 1e12";
    sqlx::query(room).execute(&app.db).await.unwrap();
    assert_eq!(app.create_run(&recipe_run()).await.status, 201);
    assert_eq!(astraeus::scheduler::tick(&app.db).await.unwrap(), 1);
    astraeus::controllers::fill::tick(&app.db, std::time::Duration::from_secs(600)).await.unwrap();
    assert_eq!(astraeus::scheduler::tick(&app.db).await.unwrap(), 1, "the fill's worker is placed there too");
    assert_eq!(worker(&app, "fill-food101-gpu-01-0").await["status"]["machine"], "gpu-01");

    let deleted = app.request(Method::DELETE, "/machines/gpu-01", Some(&admin), None).await;
    assert_eq!(deleted.status, 204, "{}", deleted.text);
    assert_eq!(app.get_run("fill-food101-gpu-01").await.status, 404);
    let reader = worker(&app, "inspect-food101-0").await;
    assert_eq!(reader["status"]["reason"], "machine gpu-01 was deleted by an organisation admin", "{reader}");
    assert_eq!(app.get_drive("food101").await.json()["copies"], json!([]));
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn machine_names_are_looked_up_within_their_cluster(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let admin = app.token_for("default", Role::Admin, true).await;
    join(&app, "gpu-01", 2).await;
    astraeus::store::clusters::insert(&app.db, "west").await.unwrap();
    let minted =
        app.request(Method::POST, "/clusters/west/join-tokens", Some(&admin), Some(&json!({}))).await;
    assert_eq!(minted.status, 201, "{}", minted.text);
    let body = json!({
        "join_token": minted.json()["token"],
        "name": "gpu-01",
        "capacity": {"cpu_cores": 8, "memory_bytes": 1u64 << 40, "gpus": 0},
    });
    let joined = app.client.post(format!("{}/agent/v1/join", app.address)).json(&body).send().await.unwrap();
    assert_eq!(joined.status(), 200);

    let ambiguous = app.get("/machines/gpu-01").await;
    assert_eq!(ambiguous.status, 409, "{}", ambiguous.text);
    assert!(ambiguous.message().contains("main, west"), "{}", ambiguous.text);
    let west = app.get("/machines/gpu-01?cluster=west").await.json();
    assert_eq!(
        (&west["spec"]["cluster"], &west["spec"]["capacity"]["cpu_cores"]),
        (&json!("west"), &json!(8.0))
    );
    // Cordoning one leaves the other as it was.
    let cordoned = act(&app, &admin, "/machines/gpu-01/cordon?cluster=west", None).await;
    assert_eq!(cordoned.status, 200, "{}", cordoned.text);
    assert_eq!(app.get("/machines/gpu-01?cluster=main").await.json()["status"]["cordoned"], false);
    assert_eq!(app.get("/machines/gpu-01?cluster=east").await.status, 404);
}
