//! The fault suite: replicas killed and paused, Postgres's sessions cut and Postgres crashed,
//! deletions racing fills, each ending with the invariants checked in SQL.
//!
//! Quick sizes by default (CI); `ASTRAEUS_FAULTS=long` runs the long form (scripts/reliability).
//! Each test writes its figures to artifacts/reliability/<test>.json.

mod harness;
mod invariants;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use astraeus::bench::placement::{drive_body, run_body};
use futures::StreamExt;
use harness::{Cluster, long, size};
use reqwest::{Method, StatusCode};
use rustix::process::Signal;
use serde_json::{Value, json};

/// Creates `bodies` at `path` through `users`, `parallel` at a time, spread evenly over `over`
/// (at once when zero); the names made.
async fn create_all(
    users: Arc<harness::Users>,
    path: &'static str,
    bodies: Vec<Value>,
    parallel: usize,
    over: Duration,
) -> Vec<String> {
    let gap = over / bodies.len().max(1) as u32;
    let t0 = tokio::time::Instant::now();
    futures::stream::iter(bodies.into_iter().enumerate())
        .map(|(i, b)| {
            let users = users.clone();
            async move {
                tokio::time::sleep_until(t0 + gap * i as u32).await;
                users.create(path, &b).await.unwrap_or_else(|e| panic!("{e:#}"));
                b["metadata"]["name"].as_str().unwrap().to_owned()
            }
        })
        .buffer_unordered(parallel)
        .collect()
        .await
}

fn drive_name(i: usize) -> String {
    format!("d-{i:03}")
}

/// Drives `d-000` … of `n`, each filled where it is needed.
async fn create_drives(c: &Cluster, n: usize) {
    create_all(
        c.users.clone(),
        "/drives",
        (0..n).map(|d| drive_body(&drive_name(d))).collect(),
        4,
        Duration::ZERO,
    )
    .await;
}

/// Runs `job-00000` … of 10 workers each, `workers` in all, mounting the `drives` in turn; the
/// simulated machines leave them running.
fn jobs(workers: usize, drives: usize) -> Vec<Value> {
    (0..workers / 10).map(|i| run_body(&format!("job-{i:05}"), 10, &[drive_name(i % drives)], None)).collect()
}

/// Checks the invariants, fails on any violation, and writes the test's figures.
async fn finish(c: &Cluster, submitted: &[String], faults: u64, started: Instant, mut figures: Value) {
    let verdict = invariants::check(&c.db, &c.fleet, submitted).await.expect("the checks ran");
    let o = figures.as_object_mut().expect("figures are an object");
    o.insert("test".into(), json!(c.name));
    o.insert("size".into(), json!(if long() { "long" } else { "quick" }));
    o.insert("faults_injected".into(), json!(faults));
    o.insert("requests_sent".into(), json!(c.users.sent.load(Ordering::Relaxed)));
    o.insert("runs_submitted".into(), json!(submitted.len()));
    o.insert("invariants_checked".into(), json!(verdict.checked));
    o.insert("violations".into(), json!(verdict.violations.len()));
    o.insert("seconds".into(), json!((started.elapsed().as_secs_f64() * 10.0).round() / 10.0));
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("artifacts/reliability");
    std::fs::create_dir_all(&dir).expect("artifacts/reliability");
    let text = serde_json::to_string_pretty(&figures).expect("json");
    std::fs::write(dir.join(format!("{}.json", c.name)), &text).expect("figures written");
    eprintln!("{text}");
    assert!(verdict.violations.is_empty(), "invariants violated:\n{}", verdict.violations.join("\n"));
}

/// Three replicas, every drive needing a fill on every machine at once: exactly one fill run
/// per drive and machine, however the replicas interleave.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicas_make_exactly_one_fill_per_copy() {
    let started = Instant::now();
    let (drives, machines) = (size(20, 200), size(10, 50));
    let c = Cluster::start("one_fill_per_copy", 3, machines, drives as u32 + 8).await.expect("cluster");
    create_drives(&c, drives).await;
    // A seed run per drive and machine, pinned there: each needs that copy filled.
    let mut bodies = Vec::new();
    for d in 0..drives {
        for m in c.fleet.machines() {
            let name = format!("seed-{}-{}", drive_name(d), m.name);
            bodies.push(run_body(&name, 1, &[drive_name(d)], Some(&m.name)));
        }
    }
    let submitted = create_all(c.users.clone(), "/runs", bodies, 16, Duration::ZERO).await;
    let took = c.settle(Duration::from_secs(size(300, 1800))).await.expect("every seed placed and started");
    let fills: i64 = sqlx::query_scalar("SELECT count(*) FROM runs WHERE fill_drive_id IS NOT NULL")
        .fetch_one(&c.db)
        .await
        .unwrap();
    assert_eq!(fills as usize, drives * machines, "one fill run per drive and machine");
    let figures = json!({"replicas": 3, "drives": drives, "machines": machines, "fill_runs": fills,
        "settled_seconds": took.as_secs_f64()});
    finish(&c, &submitted, 0, started, figures).await;
}

/// Replicas killed with SIGKILL every few seconds while workers are placed: every run submitted
/// is placed once, on a machine with room.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_replicas_while_placing() {
    let started = Instant::now();
    let (machines, workers, drives) = (size(8, 50), size(1_000, 10_000), 6);
    let window = Duration::from_secs(size(15, 60));
    let cores = (2 * workers / machines) as u32 + 8;
    let mut c = Cluster::start("kill_9_replicas", 3, machines, cores).await.expect("cluster");
    create_drives(&c, drives).await;
    let bodies = jobs(workers, drives);
    // Runs arrive throughout the kills, so that every kill lands while workers are placed.
    let submit = tokio::spawn(create_all(c.users.clone(), "/runs", bodies, 64, window));
    let mut kills = 0;
    let until = Instant::now() + window;
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_secs(3)).await;
        let i = kills as usize % c.replicas.len();
        c.kill(i).await;
        kills += 1;
        tokio::time::sleep(Duration::from_secs(1)).await;
        c.restart(i).await.expect("the killed replica starts again");
    }
    let submitted = submit.await.expect("every run submitted");
    let took = c.settle(Duration::from_secs(size(300, 1800))).await.expect("every worker placed");
    let figures = json!({"replicas": 3, "machines": machines, "workers": workers, "kills": kills,
        "settled_after_kills_seconds": took.as_secs_f64()});
    finish(&c, &submitted, kills, started, figures).await;
}

/// A replica stopped (SIGSTOP) in the middle of a transaction, past Postgres's idle-in-transaction
/// limit: Postgres ends its sessions, the other replica places and fills new work meanwhile,
/// and once resumed its late writes change no placement.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_paused_replica_is_fenced() {
    let started = Instant::now();
    let (machines, workers, drives) = (6, size(400, 4000), 4);
    let c = Cluster::start("paused_replica", 2, machines, (2 * workers / machines) as u32 + 8)
        .await
        .expect("cluster");
    create_drives(&c, drives).await;
    let bodies = jobs(workers, drives);
    let submit = tokio::spawn(create_all(c.users.clone(), "/runs", bodies, 1, Duration::ZERO));

    // Stop replica 0 when it is inside a transaction (it holds locks).
    let paused = c.replica(0);
    let catch_limit = Instant::now() + Duration::from_secs(60);
    let held = loop {
        paused.signal(Signal::STOP);
        let open = c.open_transactions(0).await.unwrap();
        if open > 0 {
            break open;
        }
        paused.signal(Signal::CONT);
        assert!(Instant::now() < catch_limit, "replica 0 was never caught inside a transaction");
        tokio::time::sleep(Duration::from_millis(15)).await;
    };
    let paused_at = Instant::now();

    // Postgres ends the paused replica's transactions...
    while c.open_transactions(0).await.unwrap() > 0 {
        assert!(
            paused_at.elapsed() < Duration::from_secs(30),
            "the paused replica still holds a transaction"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let fenced_after = paused_at.elapsed();
    // ...and the other replica places and fills new work meanwhile.
    let via_other = |method: Method, path: String, body: Option<Value>| {
        let users = c.users.clone();
        async move {
            loop {
                match users.once(1, method.clone(), &path, body.as_ref()).await {
                    Ok((s, v)) if s != StatusCode::SERVICE_UNAVAILABLE => return (s, v),
                    _ => tokio::time::sleep(Duration::from_millis(200)).await,
                }
            }
        }
    };
    let (s, v) = via_other(Method::POST, "/drives".into(), Some(drive_body("fresh"))).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let target = c.fleet.machines()[0].name.clone();
    let (s, v) = via_other(
        Method::POST,
        "/runs".into(),
        Some(run_body("seed-after-pause", 1, &["fresh".into()], Some(&target))),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let mut fill_made = None;
    let took_over = loop {
        if fill_made.is_none() {
            let made: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM runs WHERE fill_drive_id IS NOT NULL AND name LIKE 'fill-fresh-%'",
            )
            .fetch_one(&c.db)
            .await
            .unwrap();
            fill_made = (made > 0).then(|| paused_at.elapsed());
        }
        let (_, w) = via_other(Method::GET, "/workers/seed-after-pause-0".into(), None).await;
        if w["status"]["state"] == "Completed" {
            break paused_at.elapsed();
        }
        assert!(paused_at.elapsed() < Duration::from_secs(120), "the other replica did not take over: {w}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };

    let before = c.placements().await;
    paused.signal(Signal::CONT);
    let resumed = Instant::now();
    loop {
        if let Ok((StatusCode::OK, _)) = c.users.once(0, Method::GET, "/runs?limit=1", None).await {
            break;
        }
        assert!(resumed.elapsed() < Duration::from_secs(30), "the resumed replica does not serve again");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let answered_after = resumed.elapsed();
    let mut submitted = submit.await.expect("every run submitted");
    submitted.push("seed-after-pause".into());
    c.settle(Duration::from_secs(size(300, 1800))).await.expect("every worker placed");
    let after = c.placements().await;
    let moved: Vec<_> = before.iter().filter(|(w, m)| after.get(w).is_some_and(|now| now != *m)).collect();
    assert!(moved.is_empty(), "placements changed after the paused replica resumed: {moved:?}");
    let figures = json!({"replicas": 2, "workers": workers, "open_transactions_when_paused": held,
        "fenced_after_ms": fenced_after.as_millis(), "fill_run_made_by_the_other_replica_after_ms": fill_made.map(|d| d.as_millis()),
        "seed_completed_via_the_other_replica_after_ms": took_over.as_millis(),
        "resumed_replica_answered_after_ms": answered_after.as_millis(), "placements_checked": before.len()});
    finish(&c, &submitted, 1, started, figures).await;
}

/// Postgres cuts the server's sessions every two seconds, then crashes and restarts: users get
/// answers (a 503 with the JSON error body at worst, never a 500 or a hang), the service is back
/// within 10 s of Postgres, and nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn database_faults() {
    let started = Instant::now();
    let c = Cluster::start("database_faults", 2, 6, 64).await.expect("cluster");
    create_drives(&c, 4).await;
    let stop = Arc::new(AtomicBool::new(false));
    let answers = Arc::new(std::sync::Mutex::new(HashMap::<String, u64>::new()));
    let violations = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let made = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let next = Arc::new(AtomicU64::new(0));
    let mut load = tokio::task::JoinSet::new();
    for task in 0..4usize {
        let (users, stop, answers, violations, made, next) =
            (c.users.clone(), stop.clone(), answers.clone(), violations.clone(), made.clone(), next.clone());
        load.spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let i = next.fetch_add(1, Ordering::Relaxed);
                // Seeds complete at once, so the long form never runs out of room.
                let name = format!("seed-{i:05}");
                let (method, path, body) = match i % 3 {
                    0 => (
                        Method::POST,
                        "/runs".to_owned(),
                        Some(run_body(&name, 1, &[drive_name(i as usize % 4)], None)),
                    ),
                    1 => (Method::GET, "/runs?limit=5".to_owned(), None),
                    _ => (Method::GET, "/drives/d-000".to_owned(), None),
                };
                let sent = Instant::now();
                let outcome = users.once(task, method.clone(), &path, body.as_ref()).await;
                let key = match &outcome {
                    Ok((s, v)) if *s == StatusCode::SERVICE_UNAVAILABLE => {
                        if v["error"]["code"] != "unavailable" {
                            violations
                                .lock()
                                .unwrap()
                                .push(format!("{method} {path}: 503 without its error body: {v}"));
                        }
                        "503".to_owned()
                    }
                    Ok((s, v)) if s.is_server_error() => {
                        violations.lock().unwrap().push(format!("{method} {path}: {s}: {v}"));
                        s.as_u16().to_string()
                    }
                    Ok((s, v)) => {
                        if *s == StatusCode::CREATED {
                            made.lock().unwrap().push(name);
                        } else if !s.is_success() {
                            violations.lock().unwrap().push(format!("{method} {path}: {s}: {v}"));
                        }
                        s.as_u16().to_string()
                    }
                    Err(e) if e.is_timeout() => {
                        violations
                            .lock()
                            .unwrap()
                            .push(format!("{method} {path}: no answer in {:?}", sent.elapsed()));
                        "timeout".to_owned()
                    }
                    // The replica is up throughout: a refused or reset connection is a defect too.
                    Err(e) => {
                        violations.lock().unwrap().push(format!("{method} {path}: {e}"));
                        "transport".to_owned()
                    }
                };
                *answers.lock().unwrap().entry(key).or_default() += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
    }

    let mut terminated = 0i64;
    let mut cuts = 0;
    let until = Instant::now() + Duration::from_secs(size(10, 60));
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
             WHERE application_name LIKE 'astraeus %'",
        )
        .fetch_one(&c.db)
        .await
        .unwrap();
        terminated += n;
        cuts += 1;
    }
    let pg = &c.pg;
    tokio::task::block_in_place(|| pg.restart_immediate()).expect("Postgres restarts");
    let back = Instant::now();
    let mut resumed_ms = Vec::new();
    for i in 0..c.replicas.len() {
        loop {
            if let Ok((StatusCode::OK, _)) = c.users.once(i, Method::GET, "/runs?limit=1", None).await {
                resumed_ms.push(back.elapsed().as_millis());
                break;
            }
            assert!(
                back.elapsed() < Duration::from_secs(10),
                "replica {i} did not serve within 10 s of Postgres"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    while load.join_next().await.is_some() {}
    let submitted = made.lock().unwrap().clone();
    c.settle(Duration::from_secs(size(120, 600))).await.expect("every worker placed");
    let violations = violations.lock().unwrap().clone();
    let answers = answers.lock().unwrap().clone();
    assert!(
        violations.is_empty(),
        "{} bad answers, e.g. {:?}; all answers {answers:?}",
        violations.len(),
        &violations[..violations.len().min(5)]
    );
    let figures = json!({"replicas": 2, "session_cuts": cuts, "sessions_terminated": terminated,
        "postgres_restarts": 1, "answers": answers, "service_resumed_after_restart_ms": resumed_ms});
    finish(&c, &submitted, cuts + 1, started, figures).await;
}

/// Run deletion racing its drive's fill, and drive deletion racing a new run that mounts the
/// drive: no worker lives on a deleted drive, and no copy is left behind on any machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deletions_race_fills_and_runs() {
    let started = Instant::now();
    let rounds = size(30, 200);
    let c = Cluster::start("deletion_races", 2, 4, 64).await.expect("cluster");
    let machines: Vec<String> = c.fleet.machines().iter().map(|m| m.name.clone()).collect();
    let mut outcomes: HashMap<String, u64> = HashMap::new();
    let mut kept = Vec::new();
    for i in 0..rounds {
        // A run whose copy is being filled, deleted while the fill completes.
        let (drive, run) = (format!("ra-{i:03}"), format!("job-ra-{i:03}"));
        c.users.create("/drives", &drive_body(&drive)).await.unwrap();
        c.users
            .create(
                "/runs",
                &run_body(&run, 1, std::slice::from_ref(&drive), Some(&machines[i % machines.len()])),
            )
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis((i % 5) as u64 * 15)).await;
        let (s, v) = c.users.call(Method::DELETE, &format!("/runs/{run}"), None).await.unwrap();
        assert_eq!(s, StatusCode::NO_CONTENT, "{v}");

        // A new run mounting a drive while the drive is deleted.
        let (drive, run) = (format!("rb-{i:03}"), format!("job-rb-{i:03}"));
        c.users.create("/drives", &drive_body(&drive)).await.unwrap();
        let body = run_body(&run, 1, std::slice::from_ref(&drive), Some(&machines[i % machines.len()]));
        let drive_path = format!("/drives/{drive}");
        let (made, deleted) = tokio::join!(
            c.users.call(Method::POST, "/runs", Some(&body)),
            c.users.call(Method::DELETE, &drive_path, None)
        );
        let (made, deleted) = (made.unwrap().0, deleted.unwrap().0);
        *outcomes.entry(format!("run {} / drive delete {}", made.as_u16(), deleted.as_u16())).or_default() +=
            1;
        assert!(
            !(made == StatusCode::CREATED && deleted == StatusCode::NO_CONTENT),
            "run {run} was created and drive {drive} deleted under it"
        );
        if made == StatusCode::CREATED {
            kept.push((run, drive));
        }
    }
    c.settle(Duration::from_secs(size(120, 600))).await.expect("every worker placed");
    let submitted: Vec<String> = kept.iter().map(|(r, _)| r.clone()).collect();
    // The invariants while the survivors run, then everything deleted and the disks checked.
    let verdict = invariants::check(&c.db, &c.fleet, &submitted).await.unwrap();
    assert!(verdict.violations.is_empty(), "{:?}", verdict.violations);
    for (run, drive) in &kept {
        c.users.call(Method::DELETE, &format!("/runs/{run}"), None).await.unwrap();
        let (s, v) = c.users.call(Method::DELETE, &format!("/drives/{drive}"), None).await.unwrap();
        assert_eq!(s, StatusCode::NO_CONTENT, "{v}");
    }
    for i in 0..rounds {
        let (s, v) = c.users.call(Method::DELETE, &format!("/drives/ra-{i:03}"), None).await.unwrap();
        assert!(s == StatusCode::NO_CONTENT || s == StatusCode::NOT_FOUND, "{s}: {v}");
    }
    let cleared = Instant::now();
    loop {
        let left: Vec<String> = c.fleet.machines().iter().flat_map(|m| m.folders()).collect();
        let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM copies").fetch_one(&c.db).await.unwrap();
        if left.is_empty() && rows == 0 {
            break;
        }
        assert!(
            cleared.elapsed() < Duration::from_secs(30),
            "copies left behind: {rows} rows, folders {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let figures = json!({"rounds": rounds, "race_outcomes": outcomes, "runs_deleted": rounds,
        "drives_deleted": 2 * rounds, "copies_left": 0});
    finish(&c, &[], 2 * rounds as u64, started, figures).await;
}

/// A token revoked through one replica is refused by another that had just accepted it: the
/// revocation reaches every replica's credential cache on commit, well before the cache's own
/// 10 s expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_token_revoked_on_one_replica_is_refused_by_the_others() {
    let started = Instant::now();
    let c = Cluster::start("revocation", 2, 1, 8).await.expect("cluster");
    let (s, made) = c
        .users
        .once(0, Method::POST, "/tokens", Some(&json!({"name": "ci", "role": "viewer"})))
        .await
        .unwrap();
    assert_eq!(s, StatusCode::CREATED, "{made}");
    let viewer =
        astraeus::bench::http::Api::new(c.http.clone(), &c.replica(1).base, made["token"].as_str().unwrap());
    viewer.get("/runs").await.expect("the new token works on the other replica");
    let (s, v) = c
        .users
        .once(0, Method::DELETE, &format!("/tokens/{}", made["id"].as_str().unwrap()), None)
        .await
        .unwrap();
    assert_eq!(s, StatusCode::OK, "{v}");
    let revoked = Instant::now();
    loop {
        if viewer.status(Method::GET, "/runs", None).await.unwrap() == StatusCode::UNAUTHORIZED {
            break;
        }
        assert!(
            revoked.elapsed() < Duration::from_secs(5),
            "the other replica still accepts the revoked token"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let figures =
        json!({"replicas": 2, "refused_by_the_other_replica_after_ms": revoked.elapsed().as_millis()});
    finish(&c, &[], 0, started, figures).await;
}

/// Joins a machine of 2 cores through the server at `base` with these fields besides the join
/// token and capacity; returns its `Authorization` header.
async fn join_by_hand(c: &Cluster, base: &str, fields: Value) -> String {
    let (_, join) = c
        .users
        .call(Method::POST, "/clusters/main/join-tokens", Some(&json!({"ttl_seconds": 600})))
        .await
        .unwrap();
    let mut body = json!({"join_token": join["token"], "capacity": {"cpu_cores": 2, "memory_bytes": 1u64 << 32, "gpus": 0}});
    body.as_object_mut().unwrap().extend(fields.as_object().unwrap().clone());
    let joined: Value =
        c.http.post(format!("{base}/agent/v1/join")).json(&body).send().await.unwrap().json().await.unwrap();
    format!("Bearer {}", joined["credential"].as_str().unwrap())
}

/// One heartbeat reporting these copies and a 1 TiB empty data location: its status and answer.
async fn heartbeat_by_hand(c: &Cluster, base: &str, auth: &str, copies: Vec<Value>) -> (StatusCode, Value) {
    let body = json!({"data_location": {"total_bytes": 1u64 << 40, "used_bytes": 0, "free_bytes": 1u64 << 40}, "copies": copies});
    let r =
        c.http.post(format!("{base}/agent/v1/heartbeat")).header("authorization", auth).json(&body).send();
    let r = r.await.unwrap();
    (r.status(), r.json::<Value>().await.unwrap())
}

/// A heartbeat reporting 100,000 copies (none of them known) is answered, each named for
/// deletion, without holding the server's memory; one more copy is refused by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_heartbeat_of_100000_copies_is_answered_in_bounded_time_and_memory() {
    let started = Instant::now();
    let c = Cluster::start("big_heartbeat", 1, 0, 8).await.expect("cluster");
    let base = c.replica(0).base.clone();
    let auth = join_by_hand(&c, &base, json!({"name": "big"})).await;
    // One heartbeat reporting `copies` complete copies of drives nobody made; its status and answer.
    let beat = |copies: usize| {
        let copies: Vec<Value> = (0..copies)
            .map(|i| json!({"drive": format!("default.dataset-{i:06}"), "bytes": 1, "complete": true}))
            .collect();
        heartbeat_by_hand(&c, &base, &auth, copies)
    };
    let rss_before = c.replica(0).rss_mib();
    let sent = Instant::now();
    let (status, answer) = beat(100_000).await;
    assert_eq!(status, StatusCode::OK);
    let took = sent.elapsed();
    assert_eq!(
        answer["delete_copies"].as_array().unwrap().len(),
        100_000,
        "every unknown folder is named for deletion"
    );
    let peak_growth = c.replica(0).peak_rss_mib() - rss_before;
    assert!(peak_growth < 512.0, "the server grew by {peak_growth:.0} MiB for one heartbeat");

    let (status, refused) = beat(100_001).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(refused["error"]["fields"][0]["path"], "copies", "{refused}");
    let figures = json!({"copies": 100_000, "answered_after_ms": took.as_millis(),
        "server_peak_rss_growth_mib": peak_growth.round(), "copies_100001": 422});
    finish(&c, &[], 0, started, figures).await;
}

/// A heartbeat that changes nothing is answered from the replica's memory; a change the server
/// makes to its side of the answer through another replica (here the data location's limit)
/// reaches that replica's next answer at once, not after the memory's 30 s expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_heartbeat_answered_from_memory_sees_a_change_made_on_another_replica() {
    let started = Instant::now();
    let c = Cluster::start("remembered_heartbeat", 2, 0, 8).await.expect("cluster");
    let base = c.replica(0).base.clone();
    let auth = join_by_hand(&c, &base, json!({"name": "solo", "data_location": "/data/solo"})).await;
    let users = &c.users;
    let confirm = |limit: Option<i64>| {
        let body = json!({"path": "/data/solo", "limit_bytes": limit});
        async move {
            let (s, v) =
                users.once(1, Method::POST, "/machines/solo/data-location", Some(&body)).await.unwrap();
            assert_eq!(s, StatusCode::OK, "{v}");
        }
    };
    let beat = || async {
        let (status, answer) = heartbeat_by_hand(&c, &base, &auth, vec![]).await;
        assert_eq!(status, StatusCode::OK);
        answer
    };
    confirm(None).await;
    // The first is checked in Postgres and remembered; the second is answered from memory.
    for _ in 0..2 {
        let answer = beat().await;
        assert_eq!(answer["data_location"], "/data/solo", "{answer}");
        assert_eq!(answer["data_limit_bytes"], Value::Null, "{answer}");
    }
    confirm(Some(5_000_000)).await;
    let changed = Instant::now();
    loop {
        let answer = beat().await;
        if answer["data_limit_bytes"] == 5_000_000 {
            break;
        }
        assert!(
            changed.elapsed() < Duration::from_secs(5),
            "replica 0 still answers from memory what replica 1 changed: {answer}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let figures = json!({"replicas": 2, "seen_by_the_other_replica_after_ms": changed.elapsed().as_millis()});
    finish(&c, &[], 0, started, figures).await;
}
