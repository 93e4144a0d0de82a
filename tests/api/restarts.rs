//! `restart_policy: OnFailure`: a worker that fails while it runs starts again on its machine
//! after a backoff, up to its run's limit, played here as its machine's agent would.

use astraeus::controllers::restart;
use chrono::{Duration, Utc};
use serde_json::Value;

use crate::helpers::*;

/// A run of one one-core worker that mounts nothing, restarted on failure up to `limit` times.
fn run(name: &str, policy: &str, limit: Option<u32>) -> Value {
    let mut run = recipe_run();
    run["metadata"]["name"] = json!(name);
    run["spec"]["task_template"]["datavolume_refs"] = json!([]);
    run["spec"]["task_template"]["restart_policy"] = json!(policy);
    if let Some(limit) = limit {
        run["spec"]["task_template"]["restart_limit"] = json!(limit);
    }
    run
}

/// What the machine's agent says of the worker: the status code.
async fn report(app: &TestApp, credential: &str, worker: &str, state: &str, code: Option<i32>) -> u16 {
    let uid = app.get(&format!("/workers/{worker}")).await.json()["metadata"]["uid"].clone();
    let url = format!("{}/agent/v1/workers/{}/status", app.address, uid.as_str().unwrap());
    let reason = code.map(|c| format!("exited with code {c}")).unwrap_or_default();
    let body = json!({"state": state, "exit_code": code, "reason": reason});
    app.client.post(url).bearer_auth(credential).json(&body).send().await.unwrap().status().as_u16()
}

/// The names of the workers the machine's agent is told to run, and their states.
async fn assigned(app: &TestApp, credential: &str) -> Vec<(String, String)> {
    let url = format!("{}/agent/v1/assignments?version=0&wait_seconds=0", app.address);
    let answer: Value =
        app.client.get(url).bearer_auth(credential).send().await.unwrap().json().await.unwrap();
    let workers = answer["workers"].as_array().unwrap();
    workers
        .iter()
        .map(|w| (w["name"].as_str().unwrap().into(), w["state"].as_str().unwrap().into()))
        .collect()
}

async fn status(app: &TestApp, worker: &str) -> Value {
    app.get(&format!("/workers/{worker}")).await.json()["status"].clone()
}

async fn run_status(app: &TestApp, run: &str) -> (String, String) {
    let run = app.get_run(run).await.json();
    (run["status"]["state"].as_str().unwrap().into(), run["status"]["reason"].as_str().unwrap().into())
}

async fn cpu_allocated(app: &TestApp, machine: &str) -> f64 {
    app.get(&format!("/machines/{machine}")).await.json()["status"]["allocated"]["cpu_cores"]
        .as_f64()
        .unwrap()
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_failed_worker_starts_again_on_its_machine_after_its_backoff_until_its_limit(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let gpu01 = app.join_machine("gpu-01", 2).await;
    assert_eq!(app.create_run(&run("job", "OnFailure", Some(2))).await.status, 201);
    assert_eq!(astraeus::scheduler::tick(&app.db).await.unwrap(), 1);
    let preparing = || vec![("job-0".to_owned(), "Preparing".to_owned())];
    assert_eq!(assigned(&app, &gpu01).await, preparing());
    assert_eq!(report(&app, &gpu01, "job-0", "Running", None).await, 200);

    // It fails: it waits on its machine, which keeps its core, and its agent is not told to
    // run it until its backoff (10 s) has passed.
    assert_eq!(report(&app, &gpu01, "job-0", "Failed", Some(1)).await, 200);
    let waiting = status(&app, "job-0").await;
    assert_eq!(
        (&waiting["state"], &waiting["restarts"], &waiting["machine"], &waiting["exit_code"]),
        (&json!("Preparing"), &json!(1), &json!("gpu-01"), &json!(1)),
        "{waiting}"
    );
    assert_eq!(waiting["reason"], "restarting (1 of 2) after: exited with code 1");
    let reason = "worker job-0 restarting (1 of 2) after: exited with code 1";
    assert_eq!(run_status(&app, "job").await, ("Running".into(), reason.into()));
    assert_eq!(cpu_allocated(&app, "gpu-01").await, 1.0);
    assert_eq!(assigned(&app, &gpu01).await, []);
    // The same failure heard twice (its report retried) counts once.
    assert_eq!(report(&app, &gpu01, "job-0", "Failed", Some(1)).await, 200);
    assert_eq!(status(&app, "job-0").await["restarts"], 1);
    assert_eq!(status(&app, "job-0").await["state"], "Preparing");

    let now = Utc::now();
    assert_eq!(restart::tick(&app.db, now + Duration::seconds(5)).await.unwrap(), 0);
    assert_eq!(assigned(&app, &gpu01).await, []);
    assert_eq!(restart::tick(&app.db, now + Duration::seconds(11)).await.unwrap(), 1);
    assert_eq!(assigned(&app, &gpu01).await, preparing());
    assert_eq!(report(&app, &gpu01, "job-0", "Running", None).await, 200);
    let again = status(&app, "job-0").await;
    assert_eq!((&again["state"], &again["restarts"]), (&json!("Running"), &json!(1)), "{again}");
    assert_eq!(run_status(&app, "job").await, ("Running".into(), "1 of 1 workers running".into()));

    // The second backoff is twice the first.
    assert_eq!(report(&app, &gpu01, "job-0", "Failed", Some(1)).await, 200);
    assert_eq!(status(&app, "job-0").await["reason"], "restarting (2 of 2) after: exited with code 1");
    let now = Utc::now();
    assert_eq!(restart::tick(&app.db, now + Duration::seconds(15)).await.unwrap(), 0);
    assert_eq!(restart::tick(&app.db, now + Duration::seconds(21)).await.unwrap(), 1);
    assert_eq!(report(&app, &gpu01, "job-0", "Running", None).await, 200);

    // Its limit used up, it fails for good, and gives its core back.
    assert_eq!(report(&app, &gpu01, "job-0", "Failed", Some(3)).await, 200);
    let failed = status(&app, "job-0").await;
    assert_eq!((&failed["state"], &failed["restarts"]), (&json!("Failed"), &json!(2)), "{failed}");
    assert_eq!(failed["reason"], "exited with code 3 (after 2 restarts)");
    let reason = "worker job-0 failed: exited with code 3 (after 2 restarts)";
    assert_eq!(run_status(&app, "job").await, ("Failed".into(), reason.into()));
    assert_eq!(cpu_allocated(&app, "gpu-01").await, 0.0);
    assert_eq!(assigned(&app, &gpu01).await, []);
    assert_eq!(restart::tick(&app.db, Utc::now() + Duration::hours(1)).await.unwrap(), 0);

    let events = app.get("/events?object=worker/job-0").await.json();
    let restarts: Vec<&str> = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["reason"] == "Restarting")
        .map(|e| e["message"].as_str().unwrap())
        .collect();
    assert_eq!(restarts.len(), 2, "{events}");
    assert!(
        restarts.contains(&"restarting (2 of 2) after: exited with code 1; starts again in 20s"),
        "{events}"
    );
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn failures_before_a_worker_starts_and_runs_without_on_failure_end_at_once(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let gpu01 = app.join_machine("gpu-01", 2).await;
    assert_eq!(app.create_run(&run("early", "OnFailure", None)).await.status, 201);
    assert_eq!(app.create_run(&run("never", "Never", None)).await.status, 201);
    assert_eq!(astraeus::scheduler::tick(&app.db).await.unwrap(), 2);

    // An image that does not pull, a mount refused: it would fail the same way again.
    assert_eq!(report(&app, &gpu01, "early-0", "Failed", None).await, 200);
    let early = status(&app, "early-0").await;
    assert_eq!((&early["state"], &early["restarts"]), (&json!("Failed"), &json!(0)), "{early}");

    assert_eq!(report(&app, &gpu01, "never-0", "Running", None).await, 200);
    assert_eq!(report(&app, &gpu01, "never-0", "Failed", Some(1)).await, 200);
    let never = status(&app, "never-0").await;
    assert_eq!(
        (&never["state"], &never["reason"]),
        (&json!("Failed"), &json!("exited with code 1")),
        "{never}"
    );
    assert_eq!(cpu_allocated(&app, "gpu-01").await, 0.0);
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_restart_limit_past_its_cap_or_without_on_failure_is_refused_naming_it(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    for (body, message) in [
        (run("many", "OnFailure", Some(101)), "must be at most 100"),
        (run("never", "Never", Some(2)), "is only used with restart_policy OnFailure"),
    ] {
        let refused = app.create_run(&body).await;
        assert_eq!(refused.status, 422, "{}", refused.text);
        let field = &refused.json()["error"]["fields"][0];
        assert_eq!(field["path"], "spec.task_template.restart_limit", "{}", refused.text);
        assert_eq!(field["message"], message, "{}", refused.text);
    }
    assert_eq!(app.get("/runs").await.json()["items"], json!([]));
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_worker_waiting_to_restart_fails_for_good_when_its_machine_is_deleted(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let admin = app.token_for("default", astraeus::domain::role::Role::Admin, true).await;
    let gpu01 = app.join_machine("gpu-01", 2).await;
    assert_eq!(app.create_run(&run("job", "OnFailure", None)).await.status, 201);
    assert_eq!(astraeus::scheduler::tick(&app.db).await.unwrap(), 1);
    assert_eq!(report(&app, &gpu01, "job-0", "Running", None).await, 200);
    assert_eq!(report(&app, &gpu01, "job-0", "Failed", Some(1)).await, 200);
    assert_eq!(status(&app, "job-0").await["state"], "Preparing");

    let deleted = app.request(reqwest::Method::DELETE, "/machines/gpu-01", Some(&admin), None).await;
    assert_eq!(deleted.status, 204, "{}", deleted.text);
    let failed = status(&app, "job-0").await;
    assert_eq!((&failed["state"], &failed["restarts"]), (&json!("Failed"), &json!(1)), "{failed}");
    assert!(failed["reason"].as_str().unwrap().contains("machine gpu-01 was deleted"), "{failed}");
    assert_eq!(run_status(&app, "job").await.0, "Failed");
    // Nothing is left to start again, nor waits in the restart controller's index.
    let waiting: i64 = sqlx::query_scalar("SELECT count(*) FROM workers WHERE restart_at IS NOT NULL")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(waiting, 0);
    assert_eq!(restart::tick(&app.db, Utc::now() + Duration::hours(1)).await.unwrap(), 0);
}
