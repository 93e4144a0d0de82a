//! The simulation's clock: events (arrivals, workers ending, fills writing their last byte) in
//! time order, and a scheduling pass at each step of the grid in which something changed that
//! could let a Pending worker start.

use std::collections::HashMap;
use std::time::Instant;

use super::apply;
use super::fills::Ms;
use super::metrics::Figures;
use super::snapshot::{self, Shortcuts, Views};
use super::trace::Trace;
use super::world::{World, index};
use crate::scheduler::plan::{Plan, plan};
use crate::scheduler::policy::Policy;

/// Scheduling passes run on this grid, as the product's scheduler runs some time after what
/// woke it.
pub const STEP: Ms = 10_000;

/// Counts of what the loop did, for the report.
#[derive(Debug, Clone, Copy, Default)]
pub struct Work {
    pub steps: u64,
    pub passes: u64,
    /// Passes planned again with more machines' copies for eviction.
    pub replans: u64,
}

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
    loop {
        let arrival = world.runs.get(next_run).map(|r| r.arrival);
        let next = [arrival, world.next_end().map(|e| e.0), world.fills.next_done().map(|f| f.0)]
            .into_iter()
            .flatten()
            .min();
        let step = match (next, more) {
            (_, true) => now + STEP,
            (Some(t), false) => (t + STEP - 1).div_euclid(STEP) * STEP,
            (None, false) => break,
        };
        let mut changed = more;
        // Every event up to the step, in time order; at one instant, ends, then fills, then arrivals.
        loop {
            let end = world.next_end().filter(|e| e.0 <= step);
            let fill = world.fills.next_done().filter(|f| f.0 <= step);
            let arrival = world.runs.get(next_run).map(|r| r.arrival).filter(|t| *t <= step);
            match (end, fill, arrival) {
                (Some((t, w)), f, a) if f.is_none_or(|f| t <= f.0) && a.is_none_or(|a| t <= a) => {
                    world.pop_end();
                    world.end(w, t);
                }
                (_, Some((t, i)), a) if a.is_none_or(|a| t <= a) => {
                    world.fills.advance(t);
                    let (m, d) = world.fills.finish(i);
                    apply::filled(&mut world, m, d, t)?;
                }
                (_, _, Some(_)) => {
                    world.arrive(next_run);
                    next_run += 1;
                }
                (None, None, None) => break,
                _ => unreachable!("the arms above take every event found"),
            }
            changed = true;
        }
        now = step;
        world.fills.advance(now);
        work.steps += 1;
        more = false;
        if changed && !world.pending.is_empty() {
            let batch = views.batch(&world);
            if batch.is_empty() {
                continue;
            }
            views.show(&world, &batch);
            let plan = plan_with_room(&world, &mut views, now, policy, &mut work);
            apply::pass(&mut world, &plan, now)?;
            work.passes += 1;
            more = batch.len() == snapshot::BATCH && !plan.binds.is_empty();
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
