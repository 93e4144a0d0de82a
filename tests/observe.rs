//! Events, watch streams and metrics on an in-process cluster.

mod cluster;

use std::collections::BTreeMap;
use std::time::Duration;

use cluster::{Cluster, eventually, food101, run_mounting};
use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::Value;
use sqlx::PgPool;
use tokio::sync::mpsc;

/// Starts `GET {path}` as a stream and forwards each JSON line it sends.
async fn watch(api: &cluster::Api, path: &str) -> mpsc::UnboundedReceiver<Value> {
    let resp = reqwest::Client::new()
        .get(format!("{}/api/v1{path}", api.base))
        .bearer_auth(&api.token)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["content-type"], "application/x-ndjson");
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut body = resp.bytes_stream();
        let mut buf = Vec::new();
        while let Some(Ok(chunk)) = body.next().await {
            buf.extend_from_slice(&chunk);
            while let Some(end) = buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = buf.drain(..=end).collect();
                if tx.send(serde_json::from_slice(&line).unwrap()).is_err() {
                    return;
                }
            }
        }
    });
    rx
}

/// Reads events until one satisfies `done`, for at most a minute; returns all read.
async fn read_until(rx: &mut mpsc::UnboundedReceiver<Value>, done: impl Fn(&Value) -> bool) -> Vec<Value> {
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let event = tokio::time::timeout_at(deadline, rx.recv())
            .await
            .unwrap_or_else(|_| panic!("the watch never sent what was awaited; it sent {seen:#?}"))
            .expect("the stream stays open");
        let stop = done(&event);
        seen.push(event);
        if stop {
            return seen;
        }
    }
}

fn version(e: &Value) -> i64 {
    e["object"]["metadata"]["resource_version"].as_str().unwrap().parse().unwrap()
}

fn is(e: &Value, kind: &str, name: &str) -> bool {
    e["type"] == kind && e["object"]["metadata"]["name"] == name
}

fn worker_state(e: &Value) -> Option<&str> {
    e["object"]["status"]["workers"][0]["status"]["state"].as_str()
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_watch_sees_a_run_added_then_modified_through_each_state_in_order(pool: PgPool) {
    let mut cluster = Cluster::start(&pool).await;
    cluster.add_ready_machine("gpu-01").await;
    let api = cluster.api.clone();
    let mut events = watch(&api, "/runs?watch=true").await;
    api.create_drive(&food101()).await;
    api.create_run(&run_mounting("inspect", "ls /data/food101/data", &["food101"], 1.0)).await;
    let seen = read_until(&mut events, |e| {
        is(e, "MODIFIED", "inspect") && e["object"]["status"]["state"] == "Completed"
    })
    .await;
    let versions: Vec<i64> = seen.iter().map(version).collect();
    assert!(versions.windows(2).all(|w| w[0] < w[1]), "versions not strictly increasing: {versions:?}");
    let inspect: Vec<&Value> = seen.iter().filter(|e| e["object"]["metadata"]["name"] == "inspect").collect();
    assert!(is(inspect[0], "ADDED", "inspect"), "{:#?}", inspect[0]);
    let mut states: Vec<&str> = inspect.iter().filter_map(|e| worker_state(e)).collect();
    states.dedup();
    let wanted = ["Pending", "Preparing", "Running", "Completed"];
    let mut it = states.iter();
    assert!(wanted.iter().all(|w| it.any(|s| s == w)), "worker states seen: {states:?}");
    cluster.stop().await;
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_watch_resumed_from_its_last_version_misses_nothing_and_repeats_nothing(pool: PgPool) {
    let mut cluster = Cluster::start(&pool).await;
    cluster.add_ready_machine("gpu-01").await;
    let api = cluster.api.clone();
    let listed = api.get("/runs").await.expect(StatusCode::OK);
    let from: i64 = listed["resource_version"].as_str().unwrap().parse().unwrap();
    let mut first = watch(&api, &format!("/runs?watch=true&resource_version={from}")).await;
    api.create_run(&run_mounting("one", "true", &[], 0.5)).await;
    let seen = read_until(&mut first, |e| is(e, "ADDED", "one")).await;
    let last = version(seen.last().unwrap());
    drop(first);

    api.create_run(&run_mounting("two", "true", &[], 0.5)).await;
    api.wait_completed("one").await;
    assert_eq!(api.delete("/runs/one").await.status, StatusCode::NO_CONTENT);
    let mut resumed = watch(&api, &format!("/runs?watch=true&resource_version={last}")).await;
    let after =
        read_until(&mut resumed, |e| e["type"] == "DELETED" && e["object"]["metadata"]["name"] == "one")
            .await;
    let versions: Vec<i64> = after.iter().map(version).collect();
    assert!(versions.iter().all(|v| *v > last), "repeated an event at or before {last}: {versions:?}");
    assert!(versions.windows(2).all(|w| w[0] < w[1]), "{versions:?}");
    assert!(after.iter().any(|e| is(e, "ADDED", "two")), "missed run two: {after:#?}");
    // Every change recorded after `last` reached the stream, none twice; changes to a run
    // deleted since are folded into its DELETED.
    let recorded: Vec<i64> = sqlx::query_scalar(
        "SELECT version FROM changes c WHERE kind = 'runs' AND version > $1 AND version <= $2
           AND (type = 'DELETED' OR EXISTS (SELECT 1 FROM runs r WHERE r.name = c.name))
         ORDER BY version",
    )
    .bind(last)
    .bind(versions.last().unwrap())
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(versions, recorded);
    cluster.stop().await;
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_watch_from_a_compacted_version_answers_410(pool: PgPool) {
    let cluster = Cluster::start(&pool).await;
    let api = cluster.api.clone();
    api.create_run(&run_mounting("one", "true", &[], 0.5)).await;
    astraeus::store::changes::compact(&pool, Duration::ZERO).await.unwrap();
    let reply = api.get("/runs?watch=true&resource_version=1").await;
    assert_eq!(reply.status, StatusCode::GONE, "{}", reply.text);
    assert_eq!(reply.json()["error"]["code"], "gone");
    assert!(reply.json()["error"]["message"].as_str().unwrap().contains("list again"));
    cluster.stop().await;
}

/// The changes recorded after `version`, as (kind, name, type), oldest first.
async fn changes_after(pool: &PgPool, version: i64) -> Vec<(String, String, String)> {
    sqlx::query_as("SELECT kind, name, type FROM changes WHERE version > $1 ORDER BY version")
        .bind(version)
        .fetch_all(pool)
        .await
        .unwrap()
}

async fn latest(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT COALESCE(max(version), 0) FROM changes").fetch_one(pool).await.unwrap()
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn one_statement_over_many_workers_records_each_worker_and_their_run_once(pool: PgPool) {
    let cluster = Cluster::start(&pool).await;
    let api = cluster.api.clone();
    let mut big = run_mounting("wide", "true", &[], 64.0);
    big["spec"]["replicas"] = serde_json::json!(3);
    api.create_run(&big).await;
    // No control loop may change the workers from here on.
    cluster.stop().await;
    let names = |c: &[(String, String, String)], kind: &str| -> Vec<String> {
        let mut n: Vec<String> =
            c.iter().filter(|(k, _, _)| k == kind).map(|(_, n, t)| format!("{n} {t}")).collect();
        n.sort();
        n
    };

    let before = latest(&pool).await;
    sqlx::query("UPDATE workers SET reason = 'held for the test' WHERE name LIKE 'wide-%'")
        .execute(&pool)
        .await
        .unwrap();
    let seen = changes_after(&pool, before).await;
    assert_eq!(
        names(&seen, "workers"),
        ["wide-0 MODIFIED", "wide-1 MODIFIED", "wide-2 MODIFIED"],
        "{seen:?}"
    );
    assert_eq!(names(&seen, "runs"), ["wide MODIFIED"], "{seen:?}");

    // Nothing a person sees changed: the same reason again, or the log counters.
    let before = latest(&pool).await;
    sqlx::query("UPDATE workers SET reason = 'held for the test' WHERE name LIKE 'wide-%'")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("UPDATE workers SET log_lines = log_lines + 10 WHERE name LIKE 'wide-%'")
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(changes_after(&pool, before).await, vec![]);

    let before = latest(&pool).await;
    sqlx::query("DELETE FROM workers WHERE name IN ('wide-1', 'wide-2')").execute(&pool).await.unwrap();
    let seen = changes_after(&pool, before).await;
    assert_eq!(names(&seen, "workers"), ["wide-1 DELETED", "wide-2 DELETED"], "{seen:?}");
    assert_eq!(names(&seen, "runs"), ["wide MODIFIED"], "{seen:?}");
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn one_statement_over_many_machines_records_each_charged_machine_and_no_heartbeat(pool: PgPool) {
    let mut cluster = Cluster::start(&pool).await;
    for name in ["gpu-01", "gpu-02", "gpu-03"] {
        cluster.add_ready_machine(name).await;
    }
    // No control loop or agent may change the machines from here on.
    cluster.stop().await;

    let before = latest(&pool).await;
    sqlx::query("UPDATE machines SET cpu_alloc = cpu_alloc + 1000 WHERE name IN ('gpu-01', 'gpu-03')")
        .execute(&pool)
        .await
        .unwrap();
    let mut seen = changes_after(&pool, before).await;
    seen.sort();
    let modified = |name: &str| ("machines".to_owned(), name.to_owned(), "MODIFIED".to_owned());
    assert_eq!(seen, [modified("gpu-01"), modified("gpu-03")]);

    // A heartbeat's liveness and usage, or a charge given back unchanged, are no change to see.
    let before = latest(&pool).await;
    sqlx::query("UPDATE machines SET last_heartbeat_at = now(), data_free_bytes = data_free_bytes + 1")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("UPDATE machines SET cpu_alloc = cpu_alloc WHERE name = 'gpu-02'")
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(changes_after(&pool, before).await, vec![]);

    let before = latest(&pool).await;
    sqlx::query("UPDATE machines SET state = 'NotReady' WHERE name = 'gpu-02'").execute(&pool).await.unwrap();
    assert_eq!(changes_after(&pool, before).await, [modified("gpu-02")]);
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_heartbeat_batch_skips_a_machine_held_elsewhere_and_writes_it_with_the_next(pool: PgPool) {
    let mut cluster = Cluster::start(&pool).await;
    cluster.add_ready_machine("gpu-01").await;
    cluster.add_ready_machine("gpu-02").await;
    // Only this test's batches write liveness from here on.
    cluster.stop().await;
    let id = |name: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, uuid::Uuid>("SELECT id FROM machines WHERE name = $1")
                .bind(name)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    let (held, free) = (id("gpu-01").await, id("gpu-02").await);
    let used = |machine: uuid::Uuid| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>("SELECT data_used_bytes FROM machines WHERE id = $1")
                .bind(machine)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    let beats = astraeus::beats::Beats::default();
    let usage = astraeus::store::machines::Usage {
        total_bytes: 1000,
        used_bytes: 123,
        free_bytes: 877,
        reserve_bytes: 0,
    };
    beats.record(held, &usage);
    beats.record(free, &usage);

    let mut other = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM machines WHERE id = $1 FOR UPDATE")
        .bind(held)
        .execute(&mut *other)
        .await
        .unwrap();
    let written = tokio::time::timeout(Duration::from_secs(10), beats.flush(&pool))
        .await
        .expect("the batch does not wait for the held row")
        .unwrap();
    assert_eq!(written, 1);
    assert_eq!(used(free).await, 123);
    assert_ne!(used(held).await, 123);

    other.commit().await.unwrap();
    assert_eq!(beats.flush(&pool).await.unwrap(), 1, "the skipped machine is written with the next batch");
    assert_eq!(used(held).await, 123);
    assert_eq!(beats.flush(&pool).await.unwrap(), 0);
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn an_unchanged_heartbeat_does_not_wait_for_a_pass_holding_its_machine(pool: PgPool) {
    let mut cluster = Cluster::start(&pool).await;
    cluster.add_ready_machine("gpu-01").await;
    cluster.stop().await;
    let machine: uuid::Uuid =
        sqlx::query_scalar("SELECT id FROM machines WHERE name = 'gpu-01'").fetch_one(&pool).await.unwrap();
    let used = || async {
        sqlx::query_scalar::<_, i64>("SELECT data_used_bytes FROM machines WHERE id = $1")
            .bind(machine)
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    let usage = astraeus::store::machines::Usage {
        total_bytes: 1000,
        used_bytes: 123,
        free_bytes: 877,
        reserve_bytes: 0,
    };
    let beat = |usage: astraeus::store::machines::Usage| {
        let pool = pool.clone();
        async move {
            let none = astraeus::store::copies::Reported::default();
            astraeus::store::machines::beat_if_unchanged(&pool, machine, &usage, &none).await.unwrap()
        }
    };

    // A placement pass charging the machine holds its row, as `bind_all` locks it, until it commits.
    let mut pass = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM machines WHERE id = $1 FOR NO KEY UPDATE")
        .bind(machine)
        .execute(&mut *pass)
        .await
        .unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(10), beat(usage))
        .await
        .expect("the heartbeat does not wait for the pass");
    let answer = answer.expect("nothing differs: the heartbeat is answered");
    assert!(answer.data_path.is_some(), "the machine's data location is in the answer");
    assert!(!answer.written, "the held row is left to the next batch");
    assert_ne!(used().await, 123);

    pass.commit().await.unwrap();
    let answer = beat(usage).await.expect("nothing differs");
    assert!(answer.written, "a free row is written at once");
    assert_eq!(used().await, 123);

    // A copy the server does not know of is no unchanged heartbeat, held row or not.
    let unknown = astraeus::store::copies::Reported {
        folders: vec!["default.food101".to_owned()],
        ids: vec![None],
        bytes: vec![1],
        complete: vec![true],
        measured: vec![true],
        lost: vec![None],
        manifests: vec![None],
    };
    let other = astraeus::store::machines::beat_if_unchanged(&pool, machine, &usage, &unknown);
    assert!(other.await.unwrap().is_none());
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn heartbeats_do_not_wait_for_a_transaction_that_only_made_something_on_the_machine(pool: PgPool) {
    let mut cluster = Cluster::start(&pool).await;
    cluster.add_ready_machine("gpu-01").await;
    cluster.api.create_drive(&food101()).await;
    cluster.stop().await;
    let machine: uuid::Uuid =
        sqlx::query_scalar("SELECT id FROM machines WHERE name = 'gpu-01'").fetch_one(&pool).await.unwrap();
    // A copy, a fill run or a bound worker made on the machine holds its row's foreign-key lock
    // (KEY SHARE) until its transaction commits: a placement pass or a fill controller's round.
    let mut other = pool.begin().await.unwrap();
    sqlx::query(
        "INSERT INTO copies (id, drive_id, machine_id, size_hint, evictable)
         SELECT $1, id, $2, 0, true FROM drives WHERE name = 'food101'",
    )
    .bind(uuid::Uuid::now_v7())
    .bind(machine)
    .execute(&mut *other)
    .await
    .unwrap();

    let usage = astraeus::store::machines::Usage {
        total_bytes: 1000,
        used_bytes: 123,
        free_bytes: 877,
        reserve_bytes: 0,
    };
    let wait = Duration::from_secs(10);
    let beat = tokio::time::timeout(wait, astraeus::store::machines::heartbeat(&pool, machine, &usage))
        .await
        .expect("a heartbeat does not wait for the copy's transaction")
        .unwrap();
    assert_eq!(beat.map(|b| b.machine.data_used_bytes), Some(123));
    let beats = astraeus::beats::Beats::default();
    beats.record(machine, &astraeus::store::machines::Usage { used_bytes: 456, ..usage });
    let written = tokio::time::timeout(wait, beats.flush(&pool)).await.unwrap().unwrap();
    assert_eq!(written, 1, "the batch writes the machine instead of skipping it");
    other.rollback().await.unwrap();
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn an_unschedulable_worker_carries_the_summarised_reasons_as_an_event(pool: PgPool) {
    let mut cluster = Cluster::start(&pool).await;
    cluster.add_ready_machine("gpu-01").await;
    cluster.add_ready_machine("gpu-02").await;
    let api = cluster.api.clone();
    api.create_run(&run_mounting("big", "true", &[], 4.0)).await;
    // Each machine has 2 cores: neither fits 4.
    let why = "0/2 machines are available: 2 Insufficient cpu (2 of 4 cores free)";
    api.wait_reason("big-0", why).await;
    let events = eventually("the FailedScheduling event", || async {
        let list = api.get("/events?object=run/big").await.expect(StatusCode::OK);
        let items = list["items"].as_array().unwrap().clone();
        let found = items.iter().any(|e| {
            e["object_name"] == "big-0"
                && e["type"] == "Warning"
                && e["reason"] == "FailedScheduling"
                && e["message"] == why
        });
        if found { Ok(items) } else { Err(format!("{items:#?}")) }
    })
    .await;
    assert!(events.iter().all(|e| e["count"].as_i64().unwrap() >= 1));
    let bad = api.get("/events?object=nothing").await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{}", bad.text);
    cluster.stop().await;
}

/// The value of `series` (a full line prefix, labels included) in a Prometheus text page.
fn sample(page: &str, series: &str) -> f64 {
    page.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

type Counts = BTreeMap<(String, String), i64>;

/// Workers, copies and runs by state as the gauges count them, and as counting every row does.
async fn state_counts(pool: &PgPool) -> (Counts, Counts) {
    let gauged = astraeus::store::counts(pool)
        .await
        .unwrap()
        .into_iter()
        .filter(|(kind, _, _)| kind != "machines")
        .map(|(kind, state, n)| ((kind, state), n))
        .collect();
    let counted: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT 'workers', state, count(*) FROM workers GROUP BY state
         UNION ALL SELECT 'copies', state, count(*) FROM copies GROUP BY state
         UNION ALL SELECT 'runs', state, count(*) FROM runs GROUP BY state",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    (gauged, counted.into_iter().map(|(kind, state, n)| ((kind, state), n)).collect())
}

fn count(counts: &Counts, kind: &str, state: &str) -> Option<i64> {
    counts.get(&(kind.to_owned(), state.to_owned())).copied()
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn the_state_gauges_follow_workers_copies_and_runs_added_moved_and_deleted(pool: PgPool) {
    let mut cluster = Cluster::start(&pool).await;
    cluster.add_ready_machine("gpu-01").await;
    let api = cluster.api.clone();
    api.create_drive(&food101()).await;
    api.create_run(&run_mounting("done", "true", &["food101"], 0.5)).await;
    api.wait_completed("done").await;
    // The machine has 2 cores: this one stays Pending.
    api.create_run(&run_mounting("big", "true", &[], 4.0)).await;
    api.wait_reason("big-0", "Insufficient cpu (2 of 4 cores free)").await;
    let (gauged, counted) = state_counts(&pool).await;
    assert_eq!(gauged, counted);
    assert_eq!(count(&counted, "workers", "Pending"), Some(1), "{counted:?}");
    // The run's worker and the fill's.
    assert_eq!(count(&counted, "workers", "Completed"), Some(2), "{counted:?}");
    assert_eq!(count(&counted, "copies", "Complete"), Some(1), "{counted:?}");
    assert_eq!(count(&counted, "runs", "Pending"), Some(1), "{counted:?}");

    api.delete_run("done").await;
    assert_eq!(api.delete("/drives/food101").await.status, StatusCode::NO_CONTENT);
    eventually("the copy is gone", || async {
        let (_, counted) = state_counts(&pool).await;
        if count(&counted, "copies", "Complete").is_some() { Err(format!("{counted:?}")) } else { Ok(()) }
    })
    .await;
    let (gauged, counted) = state_counts(&pool).await;
    assert_eq!(gauged, counted);
    assert!(count(&counted, "workers", "Completed") < Some(2), "the run's worker is gone: {counted:?}");

    // Folds running together keep every sum, and leave one row a state.
    let compact = || astraeus::store::compact_state_counts(&pool);
    let (a, b, c) = tokio::join!(compact(), compact(), compact());
    a.unwrap();
    b.unwrap();
    c.unwrap();
    let (gauged, counted) = state_counts(&pool).await;
    assert_eq!(gauged, counted);
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM state_counts").fetch_one(&pool).await.unwrap();
    assert_eq!(rows, counted.len() as i64);
    cluster.stop().await;
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn metrics_expose_the_named_series_and_move_when_a_run_completes(pool: PgPool) {
    let mut cluster = Cluster::start(&pool).await;
    cluster.add_ready_machine("gpu-01").await;
    let api = cluster.api.clone();
    let scrape = || async {
        let resp = reqwest::Client::new()
            .get(format!("{}/metrics", api.base))
            .bearer_auth(&api.token)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        resp.text().await.unwrap()
    };
    let before = scrape().await;
    api.create_run(&run_mounting("counted", "true", &[], 0.5)).await;
    api.wait_completed("counted").await;
    let after = scrape().await;
    for series in [
        "astraeus_http_requests_total",
        "astraeus_http_request_duration_seconds",
        "astraeus_placements_total",
        "astraeus_placement_latency_seconds",
        "astraeus_scheduler_pass_seconds",
        "astraeus_heartbeats_total",
        "astraeus_workers{",
        "astraeus_machines{",
        "astraeus_db_pool_connections",
    ] {
        assert!(after.contains(series), "no {series} in:\n{after}");
    }
    let completed = "astraeus_workers{state=\"Completed\"}";
    assert_eq!(sample(&before, completed), 0.0);
    assert_eq!(sample(&after, completed), 1.0);
    assert!(sample(&after, "astraeus_placements_total") >= 1.0);
    assert_eq!(sample(&after, "astraeus_machines{state=\"Ready\"}"), 1.0);

    // Metrics need a token.
    let resp = reqwest::Client::new().get(format!("{}/metrics", api.base)).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    cluster.stop().await;
}
