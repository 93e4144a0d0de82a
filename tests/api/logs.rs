//! Logs cost bounded bytes: a cap per worker and a quota per workspace, enforced where the lines
//! are stored, so a worker printing without end cannot fill Postgres for everyone.

use astraeus::domain::log_budget::Limits;
use astraeus::domain::role::Role;
use reqwest::Method;
use serde_json::Value;

use crate::helpers::*;

/// A run of `replicas` one-core workers that mounts nothing.
fn run(name: &str, replicas: u32) -> Value {
    let mut run = recipe_run();
    run["metadata"]["name"] = json!(name);
    run["spec"]["replicas"] = json!(replicas);
    run["spec"]["task_template"]["datavolume_refs"] = json!([]);
    run
}

/// Creates the run as `token`'s workspace and places its workers.
async fn placed(app: &TestApp, token: &str, name: &str, replicas: u32) {
    let made = app.request(Method::POST, "/runs", Some(token), Some(&run(name, replicas))).await;
    assert_eq!(made.status, 201, "{}", made.text);
    assert_eq!(astraeus::scheduler::tick(&app.db).await.unwrap(), replicas as usize);
}

async fn worker(app: &TestApp, token: &str, name: &str) -> Value {
    let reply = app.request(Method::GET, &format!("/workers/{name}"), Some(token), None).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    reply.json()
}

async fn log(app: &TestApp, token: &str, name: &str) -> String {
    let reply = app.request(Method::GET, &format!("/workers/{name}/logs"), Some(token), None).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    reply.text
}

/// Uploads `lines` lines of `x`s, each 100 bytes with its newline, as the machine's agent would;
/// the agent's answer.
async fn upload(app: &TestApp, credential: &str, uid: &str, lines: usize) -> Value {
    let body = json!({"lines": vec![json!({"stream": "stdout", "line": "x".repeat(99)}); lines]});
    let url = format!("{}/agent/v1/workers/{uid}/logs", app.address);
    let resp = app.client.post(url).bearer_auth(credential).json(&body).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    resp.json().await.unwrap()
}

fn uid(worker: &Value) -> String {
    worker["metadata"]["uid"].as_str().unwrap().to_owned()
}

/// Bytes the workspace is charged, and the bytes its workers' lines hold in fact.
async fn charged_and_held(app: &TestApp, workspace: &str) -> (i64, i64) {
    sqlx::query_as(
        "SELECT ws.log_bytes, (SELECT COALESCE(sum(octet_length(l.line) + 1), 0)::bigint
             FROM worker_logs l JOIN workers w ON w.id = l.worker_id WHERE w.workspace_id = ws.id)
         FROM workspaces ws WHERE ws.name = $1",
    )
    .bind(workspace)
    .fetch_one(&app.db)
    .await
    .unwrap()
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_worker_printing_past_its_cap_keeps_exactly_the_cap_and_one_line_saying_the_rest_was_cut(
    db: sqlx::PgPool,
) {
    let limits = Limits { per_worker: 1000, per_workspace: 0 };
    let app = spawn_app_with(db, |s| s.with_log_limits(limits)).await;
    let credential = app.join_machine("gpu-01", 4).await;
    placed(&app, &app.token, "chatty", 1).await;
    let uid = uid(&worker(&app, &app.token, "chatty-0").await);

    // 20 uploads of 100 bytes at once, as two replicas might take them: 10 fit the cap.
    let answers = futures::future::join_all((0..20).map(|_| upload(&app, &credential, &uid, 1))).await;
    // Then more, long after the cap: all accepted, so the agent retries none of them.
    let late = upload(&app, &credential, &uid, 5).await;
    for answer in answers.iter().chain([&late]) {
        assert_eq!(answer["accepted"], true, "{answer}");
    }

    let text = log(&app, &app.token, "chatty-0").await;
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 11, "{text}");
    assert!(lines[..10].iter().all(|l| *l == "x".repeat(99)), "{text}");
    let note = "[astraeus] output past 1000 B was not kept: this worker's logs are full (status.log_dropped counts the lines dropped)";
    assert_eq!(lines[10], note);
    assert_eq!(text.len(), 1000 + note.len() + 1, "exactly the cap, and the one line");

    let status = &worker(&app, &app.token, "chatty-0").await["status"];
    assert_eq!(status["log_dropped"], 10 + 5, "{status}");
    assert_eq!(status["log_bytes"], text.len(), "{status}");
    assert_eq!(charged_and_held(&app, "default").await, (text.len() as i64, text.len() as i64));
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_workspace_past_its_quota_has_new_lines_dropped_while_another_workspace_is_stored(
    db: sqlx::PgPool,
) {
    let limits = Limits { per_worker: 0, per_workspace: 1000 };
    let app = spawn_app_with(db, |s| s.with_log_limits(limits)).await;
    let credential = app.join_machine("gpu-01", 8).await;
    let other = app.token_for("other", Role::Editor, false).await;
    placed(&app, &app.token, "chatty", 2).await;
    placed(&app, &other, "calm", 1).await;
    let first = uid(&worker(&app, &app.token, "chatty-0").await);
    let second = uid(&worker(&app, &app.token, "chatty-1").await);
    let calm = uid(&worker(&app, &other, "calm-0").await);

    // 12 lines of 100 bytes against a quota of 1000: 10 kept.
    assert_eq!(upload(&app, &credential, &first, 12).await["accepted"], true);
    assert_eq!(upload(&app, &credential, &second, 3).await["accepted"], true);
    assert_eq!(upload(&app, &credential, &calm, 3).await["accepted"], true);

    let quota = "[astraeus] output is not kept while workspace default holds its quota of 1000 B of logs: delete runs to make room (status.log_dropped counts the lines dropped)";
    let text = log(&app, &app.token, "chatty-0").await;
    assert_eq!(text.lines().filter(|l| l.starts_with('x')).count(), 10, "{text}");
    assert_eq!(text.lines().last(), Some(quota));
    assert_eq!(log(&app, &app.token, "chatty-1").await, format!("{quota}\n"), "nothing of its own kept");
    assert_eq!(worker(&app, &app.token, "chatty-0").await["status"]["log_dropped"], 2);
    assert_eq!(worker(&app, &app.token, "chatty-1").await["status"]["log_dropped"], 3);

    let calm_text = log(&app, &other, "calm-0").await;
    assert_eq!(calm_text, format!("{}\n", "x".repeat(99)).repeat(3), "another workspace is stored");
    assert_eq!(worker(&app, &other, "calm-0").await["status"]["log_dropped"], 0);
    let (charged, held) = charged_and_held(&app, "default").await;
    assert_eq!(charged, held);
    assert_eq!(charged_and_held(&app, "other").await, (300, 300));
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn deleting_a_run_gives_its_workspace_the_bytes_of_its_logs_back(db: sqlx::PgPool) {
    let limits = Limits { per_worker: 0, per_workspace: 1000 };
    let app = spawn_app_with(db, |s| s.with_log_limits(limits)).await;
    let credential = app.join_machine("gpu-01", 8).await;
    placed(&app, &app.token, "chatty", 1).await;
    placed(&app, &app.token, "quiet", 1).await;
    let chatty = uid(&worker(&app, &app.token, "chatty-0").await);
    let quiet = uid(&worker(&app, &app.token, "quiet-0").await);
    upload(&app, &credential, &chatty, 10).await;
    upload(&app, &credential, &quiet, 1).await;
    assert_eq!(log(&app, &app.token, "quiet-0").await.lines().filter(|l| l.starts_with('x')).count(), 0);

    let deleted = app.delete("/runs/chatty").await;
    assert!(deleted.status.is_success(), "{}", deleted.text);
    let (charged, held) = charged_and_held(&app, "default").await;
    assert_eq!(charged, held, "the deleted run's bytes are given back");

    upload(&app, &credential, &quiet, 1).await;
    let text = log(&app, &app.token, "quiet-0").await;
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(lines[0].starts_with("[astraeus] output is not kept while workspace default"));
    assert_eq!(lines[1], "x".repeat(99), "a new line is stored once there is room");
    assert_eq!(charged_and_held(&app, "default").await, (text.len() as i64, text.len() as i64));
}
