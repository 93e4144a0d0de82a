//! Placement quality, read off the world once the trace has played out (docs/placement.md says
//! what each figure means).

use std::collections::BTreeSet;
use std::time::Duration;

use serde::Serialize;

use super::fills::Ms;
use super::world::{State, World};

/// Counts of what the loop did, for the report.
#[derive(Debug, Clone, Copy, Default)]
pub struct Work {
    pub steps: u64,
    pub passes: u64,
    /// Passes planned again with more machines' copies for eviction.
    pub replans: u64,
    /// Passes shown every machine whole, for stage-in.
    pub whole: u64,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Figures {
    /// Of the workers placed, those placed where every drive they mount was whole.
    pub warm_start_share: f64,
    /// The same, of the workers whose every drive had been in the cluster before they were placed.
    pub warm_start_share_reused: f64,
    /// GPU-hours held by workers in Preparing, over GPU-hours run.
    pub preparing_gpu_hour_share: f64,
    /// Bytes written by fills, over the fewest any placement of the same schedule could write
    /// ([`schedule_bound`]).
    pub bytes_filled_ratio: f64,
    pub preparing_p50_s: f64,
    pub preparing_p99_s: f64,
    /// From a run's arrival until its last worker started, over the runs all of whose workers started.
    pub mean_time_to_start_s: f64,
    pub evictions: u64,
    /// Wall-clock seconds the simulation took.
    pub sim_seconds: f64,
    pub workers: usize,
    pub workers_placed: usize,
    pub workers_reused: usize,
    /// Of the reused workers placed cold, those whose drives were all whole on another machine
    /// then, which had not the resources free: the rest had no whole copy anywhere.
    pub cold_beside_warm: u64,
    /// Workers never placed: no machine could ever take them.
    pub workers_never_placed: usize,
    pub runs_started: usize,
    pub bytes_filled: f64,
    /// Of `bytes_filled`, those of fills on a machine that had held a copy of the drive before
    /// (refills after an eviction); the rest made a drive's first copy on a machine.
    pub bytes_refilled: f64,
    pub bytes_lower_bound: f64,
    /// The sizes of the drives any worker mounted: each was filled at least once, whatever the
    /// policy and its schedule.
    pub bytes_mounted: f64,
    pub fills: u64,
    /// Of `fills`, those of copies filled ahead for queued runs (stage-in).
    pub staged: u64,
    /// GPU-hours held by workers (Preparing or Running) while the runs arrive, over the GPU-hours
    /// the machines offer then: how busy the cluster was.
    pub gpu_busy_share: f64,
    /// Simulated hours until the last worker ended.
    pub simulated_hours: f64,
    pub steps: u64,
    pub passes: u64,
    pub replans: u64,
    /// Passes shown every machine as it is, for stage-in to weigh.
    pub whole_passes: u64,
}

impl Figures {
    pub fn of(world: &World, work: Work, end: Ms, took: Duration) -> Figures {
        let placed: Vec<_> = world.workers.iter().filter(|w| w.state != State::Pending).collect();
        let reused: Vec<_> = placed.iter().filter(|w| w.reused).collect();
        let share = |part: usize, whole: usize| if whole == 0 { 0.0 } else { part as f64 / whole as f64 };
        let hours = |ms: Ms| ms as f64 / 3_600_000.0;
        // A worker still Preparing at the end (a fill that can never end does not exist here,
        // but a trace may leave one) counts its wait until then.
        let waited = |w: &&super::world::Worker| match w.state {
            State::Preparing => end - w.bound,
            _ => w.started - w.bound,
        };
        let mut waits: Vec<Ms> = placed.iter().map(waited).collect();
        waits.sort_unstable();
        let gpus = |w: &&super::world::Worker| w.charge.gpus as f64;
        let preparing: f64 = placed.iter().map(|w| gpus(w) * hours(waited(w))).sum();
        let run: f64 = placed
            .iter()
            .filter(|w| matches!(w.state, State::Running | State::Ended))
            .map(|w| gpus(w) * hours(world.runs[w.run].durations[w.index]))
            .sum();
        let mounted: BTreeSet<usize> =
            placed.iter().flat_map(|w| world.runs[w.run].drives.iter().copied()).collect();
        let mounted: f64 = mounted.iter().map(|d| world.drives[*d].size as f64).sum();
        let bound = schedule_bound(world);
        let started: Vec<Ms> = world.runs.iter().filter_map(|r| Some(r.all_started? - r.arrival)).collect();
        let total_gpus: i64 = world.machines.iter().map(|m| m.gpus).sum();
        let span = world.runs.last().map_or(0, |r| r.arrival);
        let held: f64 = placed
            .iter()
            .map(|w| {
                let until = match w.state {
                    State::Preparing => end,
                    _ => w.started + world.runs[w.run].durations[w.index],
                };
                gpus(w) * hours(until.min(span) - w.bound.min(span))
            })
            .sum();
        let offered = total_gpus as f64 * hours(span);
        Figures {
            warm_start_share: share(placed.iter().filter(|w| w.warm).count(), placed.len()),
            warm_start_share_reused: share(reused.iter().filter(|w| w.warm).count(), reused.len()),
            preparing_gpu_hour_share: if run == 0.0 { 0.0 } else { preparing / run },
            bytes_filled_ratio: if bound == 0.0 { 0.0 } else { world.fills.written / bound },
            preparing_p50_s: percentile(&waits, 0.50),
            preparing_p99_s: percentile(&waits, 0.99),
            mean_time_to_start_s: if started.is_empty() {
                0.0
            } else {
                started.iter().sum::<Ms>() as f64 / started.len() as f64 / 1000.0
            },
            evictions: world.evictions,
            sim_seconds: took.as_secs_f64(),
            workers: world.workers.len(),
            workers_placed: placed.len(),
            workers_reused: reused.len(),
            cold_beside_warm: world.cold_beside_warm,
            workers_never_placed: world.workers.len() - placed.len(),
            runs_started: started.len(),
            bytes_filled: world.fills.written,
            bytes_refilled: world.bytes_refilled,
            bytes_lower_bound: bound,
            bytes_mounted: mounted,
            fills: world.fills_started,
            staged: world.staged_total,
            gpu_busy_share: if offered == 0.0 { 0.0 } else { held / offered },
            simulated_hours: hours(end),
            steps: work.steps,
            passes: work.passes,
            replans: work.replans,
            whole_passes: work.whole,
        }
    }
}

/// The fewest bytes any placement of the world's schedule (each worker's start and end as they
/// were) could have filled: a worker runs on a whole copy of each drive it mounts, and a machine
/// holds at most the largest machine's GPUs, cores and memory, so while workers mounting a
/// drive run, at least as many machines hold a whole copy of it as those figures need; each
/// such copy was filled once at least.
pub fn schedule_bound(world: &World) -> f64 {
    let most = |f: fn(&super::world::Machine) -> i64| world.machines.iter().map(f).max().unwrap_or(1).max(1);
    let size = (most(|m| m.gpus), most(|m| m.cpu_millis), most(|m| m.memory_bytes));
    // Per drive: (when, +1 starts or -1 ends, the worker's charge), ends first at the same instant.
    let mut changes: Vec<Vec<(Ms, i8, usize)>> = vec![Vec::new(); world.drives.len()];
    for (i, w) in world.workers.iter().enumerate() {
        if !matches!(w.state, State::Running | State::Ended) {
            continue;
        }
        let end = w.started + world.runs[w.run].durations[w.index];
        for &d in &world.runs[w.run].drives {
            changes[d].push((w.started, 1, i));
            changes[d].push((end, -1, i));
        }
    }
    let mut bytes = 0.0;
    for (d, mut list) in changes.into_iter().enumerate() {
        list.sort_unstable();
        let (mut held, mut most_machines) = ((0i64, 0i64, 0i64, 0i64), 0i64);
        for (_, sign, i) in list {
            let c = &world.workers[i].charge;
            let s = i64::from(sign);
            held = (held.0 + s, held.1 + s * c.gpus, held.2 + s * c.cpu_millis, held.3 + s * c.memory_bytes);
            let up = |n: i64, per: i64| (n.max(0) as u64).div_ceil(per as u64) as i64;
            let machines = [up(held.1, size.0), up(held.2, size.1), up(held.3, size.2)]
                .into_iter()
                .max()
                .unwrap_or(0)
                .max(i64::from(held.0 > 0));
            most_machines = most_machines.max(machines);
        }
        bytes += most_machines as f64 * world.drives[d].size as f64;
    }
    bytes
}

/// The nearest-rank percentile of sorted `values`, in seconds.
fn percentile(values: &[Ms], p: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let rank = ((p * values.len() as f64).ceil() as usize).clamp(1, values.len());
    values[rank - 1] as f64 / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        // 10 values: p50 is the 5th, p99 the 10th (ceil(9.9) = 10).
        let v: Vec<Ms> = (1..=10).map(|s| s * 1000).collect();
        assert_eq!(percentile(&v, 0.5), 5.0);
        assert_eq!(percentile(&v, 0.99), 10.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
    }
}
