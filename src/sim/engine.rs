//! The simulation's clock: events (arrivals, workers ending, fills writing their last byte) in
//! time order, and a scheduling pass at each step of the grid in which something changed that
//! could let a Pending worker start.

use std::collections::HashMap;
use std::time::Instant;

use super::apply;
use super::fills::Ms;
use super::metrics::{Figures, Work};
use super::snapshot::{self, Shortcuts, Views};
use super::trace::Trace;
use super::world::{World, index};
use crate::scheduler::plan::{Plan, plan};
use crate::scheduler::policy::Policy;

/// Scheduling passes run on this grid, as the product's scheduler runs some time after what
/// woke it.
pub const STEP: Ms = 10_000;

/// Replays `trace` under `policy` until every worker has ended or nothing more can change.
pub fn simulate(trace: &Trace, policy: &Policy) -> anyhow::Result<Figures> {
    let started = Instant::now();
    let mut world = World::new(trace);
    let mut views = Views::new(&world, Shortcuts::for_policy(policy));
    let mut work = Work::default();
    let mut next_run = 0;
    let mut now: Ms = 0;
    // A pass placed a full batch: more may fit at the next step even if nothing else happens.
    let mut more = false;
    // When a worker that waits for a warm machine stops waiting: a pass is due then.
    let mut wake: Option<Ms> = None;
    loop {
        let arrival = world.runs.get(next_run).map(|r| r.arrival);
        let next = [arrival, world.next_end().map(|e| e.0), world.fills.next_done().map(|f| f.0), wake]
            .into_iter()
            .flatten()
            .min();
        let step = match (next, more) {
            (_, true) => now + STEP,
            (Some(t), false) => (t + STEP - 1).div_euclid(STEP) * STEP,
            (None, false) => break,
        };
        // Only what frees resources or brings work lets a Pending worker start: a copy made
        // whole starts the workers bound to it, which the fill controller does, not a pass.
        let mut changed = more || wake.is_some_and(|t| t <= step);
        if changed {
            wake = None;
        }
        // Every event up to the step, in time order; at one instant, ends, then fills, then arrivals.
        loop {
            let end = world.next_end().filter(|e| e.0 <= step);
            let fill = world.fills.next_done().filter(|f| f.0 <= step);
            let arrival = world.runs.get(next_run).map(|r| r.arrival).filter(|t| *t <= step);
            match (end, fill, arrival) {
                (Some((t, w)), f, a) if f.is_none_or(|f| t <= f.0) && a.is_none_or(|a| t <= a) => {
                    world.pop_end();
                    world.end(w, t);
                    changed = true;
                }
                (_, Some((t, i)), a) if a.is_none_or(|a| t <= a) => {
                    world.fills.advance(t);
                    let (m, d) = world.fills.finish(i);
                    apply::filled(&mut world, m, d, t)?;
                }
                (_, _, Some(_)) => {
                    world.arrive(next_run);
                    next_run += 1;
                    changed = true;
                }
                (None, None, None) => break,
                _ => unreachable!("the arms above take every event found"),
            }
        }
        now = step;
        world.fills.advance(now);
        work.steps += 1;
        more = false;
        if changed && !world.pending.is_empty() {
            let batch = views.batch(&world);
            if batch.workers.is_empty() {
                continue;
            }
            // A pass stages only for workers that fit nowhere: one whose every worker is placed
            // stages nothing, and is planned with the shortcuts first.
            let mut whole = batch.waiting > 0;
            views.show(&world, &batch.workers, whole);
            let mut plan = plan_with_room(&world, &mut views, now, policy, &mut work);
            // Only a worker that fits nowhere may have its drives filled ahead.
            let fit_nowhere = plan.unplaced.iter().any(|u| !plan.warm_waits.contains(&u.worker));
            if policy.decisions.stage_in && !whole && fit_nowhere {
                whole = true;
                views.show(&world, &batch.workers, whole);
                plan = plan_with_room(&world, &mut views, now, policy, &mut work);
            }
            work.whole += u64::from(whole);
            apply::pass(&mut world, &plan, now)?;
            work.passes += 1;
            if let Some(at) = plan.wake_at {
                let at = snapshot::instant(at).max(now + 1);
                wake = Some(wake.map_or(at, |w| w.min(at)));
            }
            more = batch.workers.len() == snapshot::BATCH && !plan.binds.is_empty();
        }
    }
    Ok(Figures::of(&world, work, now, started.elapsed()))
}

/// Plans the pass, showing the copies of each machine that turns out to need room: a plan that
/// makes copies past a machine's room without having been shown its copies is made again with
/// them. Eviction is the only thing the copies decide, so the passes agree on every choice up
/// to the first eviction, and the last has seen the copies of every machine that evicts.
fn plan_with_room(world: &World, views: &mut Views, now: Ms, policy: &Policy, work: &mut Work) -> Plan {
    loop {
        let p = plan(&views.snapshot, snapshot::time(now), policy);
        let mut made: HashMap<usize, i64> = HashMap::new();
        for c in &p.copies {
            *made.entry(index(c.machine)).or_default() += c.size_hint;
        }
        let short: Vec<usize> = made
            .into_iter()
            .filter(|(m, bytes)| {
                let machine = &world.machines[*m];
                *bytes > machine.data_free()
                    && machine.reclaimable > 0
                    && !views.snapshot.evictable.contains_key(&machine.id)
            })
            .map(|(m, _)| m)
            .collect();
        if short.is_empty() {
            return p;
        }
        for m in short {
            views.show_evictable(world, m);
        }
        work.replans += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::policy::Decisions;
    use crate::sim::POLICIES;
    use crate::sim::generate::{Params, generate};
    use crate::sim::trace::{Drive, Machine, Run};

    const GB: f64 = 1e9;

    /// Equal but for rounding: shares are sums of hours.
    fn close(got: f64, want: f64) {
        assert!((got - want).abs() <= 1e-9 * want.abs().max(1.0), "{got} != {want}");
    }

    /// Two machines of 8 GPUs that fill at 1 GB/s, one drive of 100 GB, three runs of one
    /// 8-GPU worker: at 0 s (100 s), 300 s (100 s) and 305 s (50 s).
    fn by_hand() -> Trace {
        let machine = |name: &str| Machine {
            name: name.into(),
            gpus: 8,
            cpu_millis: 96_000,
            memory_bytes: 1 << 40,
            data_limit_bytes: 1_000_000_000_000,
            fill_bytes_per_second: GB,
        };
        let run = |name: &str, at: f64, duration: f64| Run {
            name: name.into(),
            arrival_s: at,
            workers: 1,
            gpus: 8,
            cpu_millis: 80_000,
            memory_bytes: 1 << 39,
            duration_s: duration,
            durations_s: None,
            drives: vec!["d".into()],
        };
        let drive = Drive { name: "d".into(), size_bytes: 100_000_000_000, evictable: true };
        Trace::new(
            10.0 * GB,
            serde_json::Value::Null,
            vec![machine("m-1"), machine("m-2")],
            vec![drive],
            vec![run("a", 0.0, 100.0), run("b", 300.0, 100.0), run("c", 305.0, 50.0)],
        )
        .unwrap()
    }

    #[test]
    fn a_hand_made_trace_gives_the_figures_worked_out_by_hand() {
        // a: placed on m-1 at 0 s (both empty, the first wins the tie); its copy fills in
        //    100 GB / 1 GB/s = 100 s, so it prepares 100 s, runs 100-200 s.
        // b: arrives at 300 s, a pass at 300 s places it on m-1, whose copy is whole: warm,
        //    runs 300-400 s.
        // c: arrives at 305 s, the pass at 310 s finds m-1 full: filling m-2 would take 100 s,
        //    so c waits for m-1 until 405 s. b ends at 400 s, and the pass then places c on
        //    m-1, warm: it runs 400-450 s. The last step is at 450 s.
        let f = simulate(&by_hand(), &Policy::PRODUCT).unwrap();
        assert_eq!((f.workers, f.workers_placed, f.workers_never_placed), (3, 3, 0));
        // Warm: b and c of 3. Reused (d had started at 100 s before they were placed): b and c.
        close(f.warm_start_share, 2.0 / 3.0);
        assert_eq!((f.workers_reused, f.warm_start_share_reused), (2, 1.0));
        // Preparing 8 GPUs x 100 s (a) = 800 GPU-s; run 8 x (100 + 100 + 50) = 2,000.
        close(f.preparing_gpu_hour_share, 0.4);
        // One fill of 100 GB, the bound: a, b and c never run at once.
        assert_eq!((f.fills, f.bytes_filled, f.bytes_lower_bound, f.bytes_mounted), (1, 100e9, 100e9, 100e9));
        assert_eq!(f.bytes_filled_ratio, 1.0);
        // Waits 0, 0, 100 s: p50 is the 2nd, p99 the 3rd.
        assert_eq!((f.preparing_p50_s, f.preparing_p99_s), (0.0, 100.0));
        // To start: a 100 s, b 0 s, c 400 - 305 = 95 s; mean 195 / 3.
        close(f.mean_time_to_start_s, 195.0 / 3.0);
        assert_eq!((f.runs_started, f.evictions), (3, 0));
        assert_eq!(f.simulated_hours, 450.0 / 3600.0);
        // Busy while runs arrive (0-305 s): a 0-200 s, b 300-305 s; c was bound at 400 s.
        // 8 x (200 + 5) GPU-s of 16 GPUs x 305 s.
        close(f.gpu_busy_share, 1_640.0 / 4_880.0);
        // Without waiting, c fills m-2 at 310 s: 100 s more, it runs 410-460 s; two fills of
        // 100 GB against the bound of one.
        let cold =
            Policy { decisions: Decisions { wait_for_warm: false, ..Decisions::ALL }, ..Policy::PRODUCT };
        let f = simulate(&by_hand(), &cold).unwrap();
        assert_eq!((f.fills, f.bytes_filled_ratio, f.warm_start_share_reused), (2, 2.0, 0.5));
        close(f.mean_time_to_start_s, 205.0 / 3.0);
    }

    #[test]
    fn workers_that_run_at_once_on_a_drive_raise_the_bound_by_a_copy_for_each_machine_they_need() {
        // a and b (8 GPUs each) arrive together: no machine holds both, so two copies of d are
        // filled by any placement of that schedule; c (at 300 s) runs alone.
        let mut trace = by_hand();
        trace.runs[1].arrival_s = 0.0;
        let f = simulate(&trace, &Policy::PRODUCT).unwrap();
        assert_eq!((f.fills, f.bytes_filled, f.bytes_lower_bound, f.bytes_mounted), (2, 200e9, 200e9, 100e9));
        assert_eq!(f.bytes_filled_ratio, 1.0);
    }

    #[test]
    fn a_small_generated_trace_plays_out_under_every_policy_the_same_way_twice() {
        let params = Params { machines: 12, runs: 300, hours: 6.0, drives: 40, ..Params::default() };
        let trace = generate(&params).unwrap();
        let workers: u32 = trace.runs.iter().map(|r| r.workers).sum();
        for (name, make) in POLICIES {
            let f = simulate(&trace, &make(params.seed)).unwrap();
            assert_eq!(f.workers, workers as usize, "{name}");
            let shares = [f.warm_start_share, f.warm_start_share_reused, f.gpu_busy_share];
            assert!(shares.iter().all(|s| (0.0..=1.0).contains(s)), "{name}: {f:?}");
            assert!(f.preparing_gpu_hour_share >= 0.0 && f.preparing_gpu_hour_share.is_finite(), "{name}");
            // Every drive mounted was filled at least once: the bound is one.
            assert!(f.bytes_filled_ratio >= 1.0, "{name}: {f:?}");
            assert!(f.preparing_p50_s <= f.preparing_p99_s, "{name}");
            assert!(f.mean_time_to_start_s >= 0.0 && f.sim_seconds >= 0.0, "{name}");
            assert!(f.workers_placed + f.workers_never_placed == f.workers, "{name}");
            let again = simulate(&trace, &make(params.seed)).unwrap();
            assert_eq!(Figures { sim_seconds: 0.0, ..again }, Figures { sim_seconds: 0.0, ..f }, "{name}");
        }
    }
}
