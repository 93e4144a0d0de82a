//! Placement: copies spread over the machines first (made the product's way, by fills), then
//! runs totalling W workers that mount the drives, timed from the first run's submission until
//! no worker is Pending; and the share of workers that landed where their drive already was.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{Value, json};

use super::fleet::{Fleet, SEED_PREFIX};
use super::http::{Api, Metrics, wait_for};

/// The bench's drives: `d-000` …
pub fn drive_name(i: usize) -> String {
    format!("d-{i:03}")
}

/// A placed drive whose fill template asks for a core and a GiB, mounted at `/data/<name>`.
pub fn drive_body(name: &str) -> Value {
    json!({
        "metadata": {"name": name},
        "spec": {
            "sources": [{"node_scope": "placed", "path": "", "mount_path": format!("/data/{name}"), "mode": "ReadOnly"}],
            "size_hint_bytes": super::fleet::COPY_BYTES,
            "evictable": false,
            "fill": {"template": {
                "image": "busybox:1.36", "command": "true",
                "requested_resources": {"cpu_cores": 1, "memory_bytes": 1u64 << 30}
            }}
        }
    })
}

/// A run of `replicas` workers, each asking for a core and a GiB, mounting `drives`, and pinned to
/// `machine` when one is given.
pub fn run_body(name: &str, replicas: usize, drives: &[String], machine: Option<&str>) -> Value {
    let selection = match machine {
        Some(m) => json!({"mode": "Exact", "names": [m]}),
        None => json!({"mode": "Any"}),
    };
    let refs: Vec<Value> = drives.iter().map(|d| json!({"name": d})).collect();
    json!({
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "task_template": {
                "image": "busybox:1.36", "command": "sleep", "args": ["3600"],
                "requested_resources": {"cpu_cores": 1, "memory_bytes": 1u64 << 30, "node_selection": selection},
                "datavolume_refs": refs
            }
        }
    })
}

/// The drives machine `i` holds: `copies` consecutive ones, so each drive is on an equal share.
pub fn seeded_drives(i: usize, copies: usize, drives: usize) -> Vec<String> {
    (0..copies.min(drives)).map(|k| drive_name((i * copies + k) % drives)).collect()
}

/// POSTs many bodies to one path, `parallel` at a time.
pub async fn post_all(api: &Api, path: &str, bodies: Vec<Value>, parallel: usize) -> anyhow::Result<()> {
    let results: Vec<anyhow::Result<Value>> = futures::stream::iter(bodies)
        .map(|b| async move { api.post(path, &b).await })
        .buffer_unordered(parallel)
        .collect()
        .await;
    results.into_iter().collect::<anyhow::Result<Vec<_>>>().map(drop)
}

/// Live workers (not yet ended), from the gauges.
fn live(m: &Metrics) -> u64 {
    ["Pending", "Preparing", "Running"].iter().map(|s| m.count("workers", s)).sum()
}

/// Gives the machines in `range` their copies: a seed run pinned to each machine mounts its drives,
/// the scheduler places it, the fill controller starts a fill per copy, and the machine
/// completes the fills. Returns when every copy is complete and every seed and fill has ended.
pub async fn seed(
    api: &Api,
    fleet: &Arc<Fleet>,
    range: std::ops::Range<usize>,
    copies: usize,
    drives: usize,
    limit: Duration,
) -> anyhow::Result<()> {
    let machines = fleet.machines();
    let bodies: Vec<Value> = machines[range.clone()]
        .iter()
        .map(|m| {
            run_body(
                &format!("{SEED_PREFIX}{}", m.name),
                1,
                &seeded_drives(m.index, copies, drives),
                Some(&m.name),
            )
        })
        .collect();
    post_all(api, "/runs", bodies, 16).await?;
    let want = (range.end * copies.min(drives)) as u64;
    wait_for(api, "seeding copies", limit, Duration::from_millis(500), |m| {
        let complete = m.count("copies", "Complete");
        (
            complete >= want && live(m) == 0,
            format!("{complete}/{want} copies complete, {} workers live", live(m)),
        )
    })
    .await
    .map(drop)
    .or_else(|e| {
        // Slow, not broken: go on with the copies there are (the warm share will show it).
        eprintln!("  warning: {e:#}; going on");
        Ok(())
    })
}

/// Which machines hold a complete copy of each drive, as `GET /drives` says.
pub async fn held_copies(api: &Api) -> anyhow::Result<HashMap<String, HashSet<String>>> {
    let list = api.get("/drives?limit=1000").await?;
    let mut held = HashMap::new();
    for d in list["items"].as_array().into_iter().flatten() {
        let name = d["metadata"]["name"].as_str().unwrap_or_default().to_owned();
        let mut machines = HashSet::new();
        // A list of drives only counts copies: each drive's are read a page at a time.
        let mut path = format!("/drives/{name}/copies?limit=1000");
        loop {
            let page = api.get(&path).await?;
            machines.extend(
                page["items"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|c| c["complete"].as_bool() == Some(true))
                    .filter_map(|c| c["node"].as_str().map(str::to_owned)),
            );
            match page["next"].as_str() {
                Some(next) => path = format!("/drives/{name}/copies?limit=1000&cursor={next}"),
                None => break,
            }
        }
        held.insert(name, machines);
    }
    Ok(held)
}

#[derive(Debug, Clone, Default)]
pub struct Placement {
    pub machines: usize,
    pub workers: usize,
    pub runs: usize,
    /// From the first POST to the scrape that found no Pending worker.
    pub seconds: f64,
    /// How long submitting the runs took (placement overlaps it).
    pub submit_seconds: f64,
    pub per_s: f64,
    /// Workers on a machine that held a complete copy of their drive when the runs were submitted.
    pub warm_share: f64,
    /// Scheduler passes during the phase and their mean duration.
    pub passes: u64,
    pub pass_mean_ms: f64,
    /// Fill runs the cold placements started.
    pub fills: u64,
    /// Server CPU seconds used during the phase.
    pub server_cpu_s: f64,
    /// Resolution of the end time (the last scrape interval).
    pub resolution_ms: f64,
    /// Workers still Pending when the bench stopped waiting (0 when all were bound).
    pub unbound: usize,
}

/// The workload's run names and sizes: at least one run per drive, at most 1,000 replicas a run.
pub fn workload(tag: &str, workers: usize, drives: usize) -> Vec<(String, usize, String)> {
    let runs = drives.max(workers.div_ceil(1000)).min(workers.max(1));
    (0..runs)
        .map(|j| {
            let replicas = workers / runs + usize::from(j < workers % runs);
            (format!("{tag}-{j:04}"), replicas, drive_name(j % drives))
        })
        .collect()
}

/// Submits the workload and times it until every worker is bound.
pub async fn measure(
    api: &Api,
    machines: usize,
    tag: &str,
    workers: usize,
    drives: usize,
    limit: Duration,
    server_cpu: impl Fn() -> f64,
) -> anyhow::Result<(Placement, Vec<String>)> {
    let runs = workload(tag, workers, drives);
    let held = held_copies(api).await?;
    let before = api.metrics().await?;
    let bodies: Vec<Value> =
        runs.iter().map(|(name, n, drive)| run_body(name, *n, std::slice::from_ref(drive), None)).collect();
    let cpu0 = server_cpu();
    let start = Instant::now();
    post_all(api, "/runs", bodies, 8).await?;
    let submit = start.elapsed();
    let mut every = Duration::from_millis(20);
    let mut unbound = 0usize;
    let after = loop {
        let m = api.metrics().await?;
        if m.count("workers", "Pending") == 0 {
            break m;
        }
        if start.elapsed() > limit {
            // Slow, not broken: the figure becomes the workers bound within the limit.
            let pending = m.count("workers", "Pending") as usize;
            eprintln!(
                "  warning: {pending} workers still Pending after {} s; counting those bound",
                limit.as_secs()
            );
            unbound = pending.min(workers);
            break m;
        }
        // About a hundred scrapes whatever the length: each one counts every worker in Postgres.
        every = (start.elapsed() / 100).clamp(Duration::from_millis(20), Duration::from_millis(500));
        tokio::time::sleep(every).await;
    };
    let seconds = start.elapsed().as_secs_f64();
    let server_cpu_s = server_cpu() - cpu0;
    let passes = (after.get("astraeus_scheduler_pass_seconds_count")
        - before.get("astraeus_scheduler_pass_seconds_count")) as u64;
    let pass_sum =
        after.get("astraeus_scheduler_pass_seconds_sum") - before.get("astraeus_scheduler_pass_seconds_sum");
    let runs_total = |m: &Metrics| -> u64 {
        ["Pending", "Running", "Completed", "Failed"].iter().map(|s| m.count("runs", s)).sum()
    };
    let fills = runs_total(&after);
    let fills_before = runs_total(&before);
    let fills = fills.saturating_sub(fills_before + runs.len() as u64);

    let mut warm = 0usize;
    let mut placed = 0usize;
    let names: Vec<String> = runs.iter().map(|r| r.0.clone()).collect();
    for (name, _, drive) in &runs {
        let holders = held.get(drive);
        for w in api.items(&format!("/runs/{name}/workers")).await? {
            if let Some(machine) = w["status"]["machine"].as_str() {
                placed += 1;
                if holders.is_some_and(|h| h.contains(machine)) {
                    warm += 1;
                }
            }
        }
    }
    if placed < workers {
        eprintln!("  warning: {placed} of {workers} workers have a machine");
    }
    Ok((
        Placement {
            machines,
            workers,
            runs: runs.len(),
            seconds,
            submit_seconds: submit.as_secs_f64(),
            per_s: (workers - unbound) as f64 / seconds,
            unbound,
            warm_share: if placed == 0 { 0.0 } else { warm as f64 / placed as f64 },
            passes,
            pass_mean_ms: if passes == 0 { 0.0 } else { pass_sum / passes as f64 * 1000.0 },
            fills,
            server_cpu_s,
            resolution_ms: every.as_secs_f64() * 1000.0,
        },
        names,
    ))
}

/// Deletes runs one after another. A delete that fails (the server answers 500 when Postgres
/// picks it as a deadlock victim) is tried again, up to five times; returns how many were retried.
pub async fn delete_runs(api: &Api, names: &[String]) -> anyhow::Result<usize> {
    let mut retried = 0;
    for n in names {
        let mut tries = 0;
        loop {
            match api.delete(&format!("/runs/{n}")).await {
                Ok(()) => break,
                Err(e) if tries >= 5 => return Err(e),
                Err(_) => {
                    tries += 1;
                    retried += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
    Ok(retried)
}
