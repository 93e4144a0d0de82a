//! `astraeus sim export`: a server's history as a trace the simulator replays.

use astraeus::sim::export::{Options, export};
use astraeus::sim::trace::{Drive, Machine, Trace};
use chrono::{DateTime, Utc};

use crate::helpers::*;

/// The recipe's run named `name`, with `replicas` workers of `gpus` GPUs each.
fn run(name: &str, replicas: u32, gpus: u32) -> serde_json::Value {
    let mut run = recipe_run();
    run["metadata"]["name"] = json!(name);
    run["spec"]["replicas"] = json!(replicas);
    run["spec"]["task_template"]["requested_resources"]["gpus"] = json!(gpus);
    run
}

/// Sets when a run was made and when each of its workers started and ended, in seconds after
/// `noon` (`None`: it never did).
async fn history(
    app: &TestApp,
    noon: DateTime<Utc>,
    run: &str,
    created: i64,
    workers: &[(Option<i64>, Option<i64>)],
) {
    let at = |s: Option<i64>| s.map(|s| noon + chrono::Duration::seconds(s));
    sqlx::query("UPDATE runs SET created_at = $2 WHERE name = $1")
        .bind(run)
        .bind(noon + chrono::Duration::seconds(created))
        .execute(&app.db)
        .await
        .unwrap();
    for (i, (started, finished)) in workers.iter().enumerate() {
        sqlx::query(
            "UPDATE workers SET started_at = $3, finished_at = $4
             WHERE run_id = (SELECT id FROM runs WHERE name = $1) AND index = $2",
        )
        .bind(run)
        .bind(i as i32)
        .bind(at(*started))
        .bind(at(*finished))
        .execute(&app.db)
        .await
        .unwrap();
    }
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_servers_history_becomes_a_trace_of_its_machines_drives_and_runs(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    app.join_machine("gpu-01", 32).await;
    sqlx::query("UPDATE machines SET gpus = 8, data_path = '/data', data_limit_bytes = 4000000000000")
        .execute(&app.db)
        .await
        .unwrap();
    app.join_machine("gpu-02", 32).await;
    assert_eq!(app.create_drive(&recipe_drive()).await.status, 201);
    for (name, replicas, gpus) in [("train", 2, 4), ("eval", 1, 1), ("queued", 1, 8)] {
        let reply = app.create_run(&run(name, replicas, gpus)).await;
        assert_eq!(reply.status, 201, "{}", reply.text);
    }
    let noon = Utc::now() - chrono::Duration::days(1);
    // train: made a day ago, its workers ran 100 s and (still running) from 20 s on.
    history(&app, noon, "train", 0, &[(Some(10), Some(110)), (Some(20), None)]).await;
    // eval: made a minute later, ran 30 s.
    history(&app, noon, "eval", 60, &[(Some(70), Some(100))]).await;
    // queued: never started, so nothing says how long it runs.
    history(&app, noon, "queued", 90, &[(None, None)]).await;

    let options =
        Options { cluster: "main".into(), fill_bytes_per_second: 1.5e9, origin_bytes_per_second: 2e10 };
    let (trace, left_out) = export(&app.db, &options).await.unwrap();
    assert_eq!(left_out, 1);
    assert_eq!(
        trace.machines,
        [
            Machine {
                name: "gpu-01".into(),
                gpus: 8,
                cpu_millis: 32_000,
                memory_bytes: 1 << 40,
                data_limit_bytes: 4_000_000_000_000,
                fill_bytes_per_second: 1.5e9
            },
            // No data location confirmed: no room for copies.
            Machine {
                name: "gpu-02".into(),
                gpus: 0,
                cpu_millis: 32_000,
                memory_bytes: 1 << 40,
                data_limit_bytes: 0,
                fill_bytes_per_second: 1.5e9
            },
        ]
    );
    assert_eq!(
        trace.drives,
        [Drive { name: "default.food101".into(), size_bytes: 6_000_000_000, evictable: true }]
    );
    let runs: Vec<(&str, f64, u32, i64)> =
        trace.runs.iter().map(|r| (r.name.as_str(), r.arrival_s, r.workers, r.gpus)).collect();
    assert_eq!(runs, [("default.train", 0.0, 2, 4), ("default.eval", 60.0, 1, 1)]);
    let train = &trace.runs[0];
    assert_eq!(train.drives, ["default.food101"]);
    assert_eq!((train.cpu_millis, train.memory_bytes), (1000, 268_435_456));
    assert_eq!(train.duration_of(0), 100.0);
    // The worker still running has run for a day less 20 s, and a little more.
    assert!((86_380.0..86_400.0 + 600.0).contains(&train.duration_of(1)), "{}", train.duration_of(1));
    assert_eq!(trace.runs[1].durations_s, Some(vec![30.0]));

    // What was exported is read back as written, and plays out.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("history.jsonl");
    trace.write(&path).unwrap();
    assert_eq!(Trace::read(&path).unwrap(), trace);
    let figures =
        astraeus::sim::engine::simulate(&trace, &astraeus::scheduler::policy::Policy::PRODUCT).unwrap();
    assert_eq!(figures.workers, 3);
}
