//! Copy-complete to start: a probe run pinned to a machine that lacks its drive waits there
//! (Preparing) while the drive's fill runs; the machine marks the copy complete and reports it in
//! a heartbeat. The sample runs from just before that heartbeat is sent to the moment the
//! machine's long-poll answer brings the probe's worker.
//!
//! Probes are offered one after another at [`RATE`], as fills of different sizes end at
//! different times, so a sample is one completion's latency; then [`BURST`] at once, for what a
//! queue of completions in the same instant costs the last of them.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::fleet::{Fleet, PROBE_PREFIX};
use super::http::{Api, Lat};
use super::placement::{drive_name, held_copies, post_all, run_body};

/// Probes submitted per second in the measured series.
pub const RATE: f64 = 50.0;
/// Probes submitted together afterwards.
pub const BURST: usize = 50;
/// How long the bench waits for a series' last probe.
const PATIENCE: Duration = Duration::from_secs(60);

pub struct CopyStart {
    pub samples: usize,
    pub lat: Lat,
    /// Probes whose worker never arrived within the wait.
    pub missing: usize,
    /// The same, for [`BURST`] probes submitted at once.
    pub burst: Lat,
    pub burst_missing: usize,
}

pub async fn measure(
    api: &Api,
    fleet: &Arc<Fleet>,
    samples: usize,
    drives: usize,
) -> anyhow::Result<CopyStart> {
    fleet.probe_samples.lock().expect("not poisoned").clear();
    let mut probes = choose(api, fleet, samples + BURST, drives).await?.into_iter();
    let series: Vec<Value> = probes.by_ref().take(samples).collect();
    let burst: Vec<Value> = probes.collect();

    let n = series.len();
    let every = Duration::from_secs_f64(1.0 / RATE);
    let mut sent = tokio::task::JoinSet::new();
    let mut tick = tokio::time::interval(every);
    for body in series {
        tick.tick().await;
        let api = api.clone();
        sent.spawn(async move { api.post("/runs", &body).await.map(drop) });
    }
    while let Some(r) = sent.join_next().await {
        r??;
    }
    let (lat, missing) = collect(fleet, n).await;

    let n = burst.len();
    post_all(api, "/runs", burst, BURST).await?;
    let (burst, burst_missing) = collect(fleet, n).await;
    Ok(CopyStart { samples: lat.len() as usize, lat, missing, burst, burst_missing })
}

/// Up to `n` probe runs, spread over the machines, each with a drive its machine does not hold.
async fn choose(api: &Api, fleet: &Arc<Fleet>, n: usize, drives: usize) -> anyhow::Result<Vec<Value>> {
    let machines = fleet.machines();
    let held = held_copies(api).await?;
    let mut chosen: HashSet<(usize, usize)> = HashSet::new();
    let mut probes = Vec::new();
    let stride = (machines.len() / n.max(1)).max(1);
    'outer: for i in 0..n * 4 {
        if probes.len() == n {
            break;
        }
        let m = &machines[(i * stride + i / machines.len()) % machines.len()];
        for k in 0..drives {
            let d = (m.index * 7 + k) % drives;
            let name = drive_name(d);
            if held.get(&name).is_some_and(|h| h.contains(&m.name)) || !chosen.insert((m.index, d)) {
                continue;
            }
            let run = format!("{PROBE_PREFIX}{}", probes.len());
            probes.push(run_body(&run, 1, std::slice::from_ref(&name), Some(&m.name)));
            continue 'outer;
        }
    }
    Ok(probes)
}

/// Waits for `n` samples and takes them; those that did not come count as missing.
async fn collect(fleet: &Fleet, n: usize) -> (Lat, usize) {
    let start = Instant::now();
    loop {
        let got = fleet.probe_samples.lock().expect("not poisoned").len();
        if got >= n || start.elapsed() > PATIENCE {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut lat = Lat::default();
    let taken = std::mem::take(&mut *fleet.probe_samples.lock().expect("not poisoned"));
    for d in &taken {
        lat.record(*d);
    }
    (lat, n.saturating_sub(taken.len()))
}
