//! Copy-complete to start: a probe run pinned to a machine that lacks its drive waits there
//! (Preparing) while the drive's fill runs; the machine marks the copy complete and reports it in
//! a heartbeat. The sample runs from just before that heartbeat is sent to the moment the
//! machine's long-poll answer brings the probe's worker.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::fleet::{Fleet, PROBE_PREFIX};
use super::http::{Api, Lat};
use super::placement::{drive_name, held_copies, post_all, run_body};

/// Probes submitted together.
const WAVE: usize = 50;

pub struct CopyStart {
    pub samples: usize,
    pub lat: Lat,
    /// Probes whose worker never arrived within a wave's time.
    pub missing: usize,
}

pub async fn measure(
    api: &Api,
    fleet: &Arc<Fleet>,
    samples: usize,
    drives: usize,
) -> anyhow::Result<CopyStart> {
    let machines = fleet.machines();
    let held = held_copies(api).await?;
    let mut chosen: HashSet<(usize, usize)> = HashSet::new();
    let mut probes: Vec<(String, String, String)> = Vec::new();
    // Spread over the machines; each probe gets a drive its machine does not hold yet.
    let stride = (machines.len() / samples.max(1)).max(1);
    'outer: for i in 0..samples * 4 {
        if probes.len() == samples {
            break;
        }
        let m = &machines[(i * stride + i / machines.len()) % machines.len()];
        for k in 0..drives {
            let d = (m.index * 7 + k) % drives;
            let name = drive_name(d);
            if held.get(&name).is_some_and(|h| h.contains(&m.name)) || !chosen.insert((m.index, d)) {
                continue;
            }
            probes.push((format!("{PROBE_PREFIX}{}", probes.len()), name, m.name.clone()));
            continue 'outer;
        }
    }
    fleet.probe_samples.lock().expect("not poisoned").clear();
    let mut missing = 0;
    let mut expected = 0;
    for wave in probes.chunks(WAVE) {
        let bodies: Vec<Value> = wave
            .iter()
            .map(|(run, drive, machine)| run_body(run, 1, std::slice::from_ref(drive), Some(machine)))
            .collect();
        expected += wave.len();
        post_all(api, "/runs", bodies, WAVE).await?;
        let start = Instant::now();
        loop {
            let got = fleet.probe_samples.lock().expect("not poisoned").len();
            if got >= expected {
                break;
            }
            if start.elapsed() > Duration::from_secs(60) {
                missing += expected - got;
                expected = got;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let mut lat = Lat::default();
    for d in fleet.probe_samples.lock().expect("not poisoned").iter() {
        lat.record(*d);
    }
    Ok(CopyStart { samples: lat.len() as usize, lat, missing })
}
