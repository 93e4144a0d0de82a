//! What the scheduler's planner is shown each step: the world's machines as its shell would read
//! them, and a bounded batch of Pending workers. The machine views live from step to step and
//! only what changed is written into them.

use std::collections::{BTreeSet, HashMap};

use chrono::{DateTime, Duration, TimeZone, Utc};
use uuid::Uuid;

use super::fills::Ms;
use super::world::{CLUSTER, Machine, Shape, World, id};
use crate::scheduler::plan::{STAGE_BUDGET, STAGE_PER_RUN, STAGE_RUNS, Snapshot};
use crate::scheduler::policy::{Policy, Scoring};
use crate::scheduler::snapshot::{ByDrive, CopyState, CopyView, MachineView};
use crate::store::workers::PendingRow;

/// Pending workers shown to one pass at most, as the product's scheduler claims at most 4096.
pub const BATCH: usize = 4096;

/// The simulation's clock as the planner reads it: the trace starts at this instant.
pub fn time(t: Ms) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 1, 5, 0, 0, 0).unwrap() + Duration::milliseconds(t)
}

/// The simulated instant of `at`: [`time`]'s inverse.
pub fn instant(at: DateTime<Utc>) -> Ms {
    (at - time(0)).num_milliseconds()
}

fn fits(m: &Machine, (gpus, cpu, memory): Shape) -> bool {
    m.gpus_free >= gpus && m.cpu_free >= cpu && m.memory_free >= memory
}

/// How many workers of `shape` the machines' free resources hold at most.
fn slots(machines: &[Machine], (gpus, cpu, memory): Shape) -> usize {
    let per = |free: i64, asked: i64| if asked <= 0 { usize::MAX } else { (free.max(0) / asked) as usize };
    machines
        .iter()
        .map(|m| per(m.gpus_free, gpus).min(per(m.cpu_free, cpu)).min(per(m.memory_free, memory)))
        .fold(0usize, usize::saturating_add)
}

/// What a pass may be spared of the world without changing what the policy decides.
///
/// A machine that no worker of the batch fits by resources may be shown not ready: the planner
/// turns it down at once, as its resource filters would, without writing out why. Its copies
/// may be left out too, sparing the warm-machine ranking from weighing machines it then turns
/// down; only ImageLocality's spread (every machine holding a drive counts) looks at them. Under
/// a policy that waits for warm machines, one holding a batch's drive whole is shown ready, with
/// its copies: a worker may wait for it.
/// Stage-in weighs busy machines for the runs that fit nowhere: a pass that may stage is shown
/// everything (see [`Views::show`]).
#[derive(Debug, Clone, Copy)]
pub struct Shortcuts {
    pub unfit_copies: bool,
    /// Show the machines holding a batch's drive whole, busy or not: wait-for-warm weighs them.
    pub busy_holders: bool,
    /// Show, besides the workers that may fit, those of the first queued runs that fit nowhere:
    /// stage-in weighs them.
    pub waiting: bool,
}

impl Shortcuts {
    pub fn for_policy(p: &Policy) -> Shortcuts {
        Shortcuts {
            unfit_copies: p.scoring == Scoring::ImageLocality,
            busy_holders: p.decisions.wait_for_warm,
            waiting: p.decisions.stage_in,
        }
    }
}

/// The workers a pass is shown, and how many of them were added only for stage-in to weigh.
pub struct Batch {
    pub workers: Vec<usize>,
    pub waiting: usize,
}

pub struct Views {
    pub snapshot: Snapshot,
    /// Machines whose views hold copies shown to the last pass.
    shown: BTreeSet<usize>,
    shortcuts: Shortcuts,
}

impl Views {
    pub fn new(world: &World, shortcuts: Shortcuts) -> Views {
        let machines = world
            .machines
            .iter()
            .enumerate()
            .map(|(i, m)| MachineView {
                id: m.id,
                name: m.name.clone(),
                cluster: CLUSTER.into(),
                ready: true,
                cordoned: false,
                transports: Vec::new(),
                cpu_total: m.cpu_millis,
                memory_total: m.memory_bytes,
                cpu_free: m.cpu_free,
                memory_free: m.memory_free,
                gpus_total: m.gpus,
                gpus_free: m.gpus_free,
                data_free: Some(m.data_free()),
                reclaimable: m.reclaimable,
                held: m.copies.len() as i64,
                freed: 0,
                images: Vec::new(),
                copies: ByDrive::default(),
                filled: ByDrive::default(),
                // The product learns it from the first fill; the simulation knows it.
                fill_rate: Some(world.fills.bandwidth(i) as i64),
            })
            .collect();
        Views { snapshot: Snapshot { machines, ..Snapshot::default() }, shown: BTreeSet::new(), shortcuts }
    }

    /// The Pending workers a pass is shown, in their order: for each shape of request, no more
    /// than the free resources could take of it (the rest would fit nowhere in this pass), and
    /// no more than [`BATCH`] in all; with `waiting`, also up to [`STAGE_PER_RUN`] more workers
    /// of each of the first [`STAGE_RUNS`] runs that have more. Workers left out are shown to a
    /// later pass.
    pub fn batch(&self, world: &World) -> Batch {
        let mut room: HashMap<Shape, usize> =
            world.pending_shapes.iter().map(|(s, n)| (*s, slots(&world.machines, *s).min(*n))).collect();
        let mut wanted: usize = room.values().sum::<usize>().min(BATCH);
        // Stage-in weighs the runs that wait only while it has budget left.
        let staging = self.shortcuts.waiting && world.staged.len() < STAGE_BUDGET;
        let mut runs_waiting = if staging { STAGE_RUNS } else { 0 };
        // The run whose workers left out are being shown, and how many of them so far.
        let mut extra: Option<(usize, usize)> = None;
        let mut batch = Batch { workers: Vec::new(), waiting: 0 };
        for &w in &world.pending {
            if batch.workers.len() == BATCH || (wanted == 0 && runs_waiting == 0 && extra.is_none()) {
                break;
            }
            let left = room.get_mut(&world.shape(w)).expect("every pending shape is counted");
            if *left > 0 && wanted > 0 {
                *left -= 1;
                wanted -= 1;
                batch.workers.push(w);
                continue;
            }
            let run = world.workers[w].run;
            match &mut extra {
                Some((r, n)) if *r == run => {
                    if *n < STAGE_PER_RUN {
                        *n += 1;
                        batch.workers.push(w);
                        batch.waiting += 1;
                    }
                }
                _ if runs_waiting > 0 => {
                    runs_waiting -= 1;
                    extra = Some((run, 1));
                    batch.workers.push(w);
                    batch.waiting += 1;
                }
                _ => extra = None,
            }
        }
        batch
    }

    /// Shows the world as it is now and the batch's workers; `whole` shows every machine as
    /// ready and with its copies, which a pass that may stage needs (see [`Shortcuts`]).
    pub fn show(&mut self, world: &World, batch: &[usize], whole: bool) {
        let s = &mut self.snapshot;
        let mut shapes: Vec<Shape> = batch.iter().map(|w| world.shape(*w)).collect();
        shapes.sort_unstable();
        shapes.dedup();
        for (v, m) in s.machines.iter_mut().zip(&world.machines) {
            v.cpu_free = m.cpu_free;
            v.memory_free = m.memory_free;
            v.gpus_free = m.gpus_free;
            v.data_free = Some(m.data_free());
            v.reclaimable = m.reclaimable;
            v.held = m.copies.len() as i64;
            v.ready = whole || shapes.iter().any(|sh| fits(m, *sh));
        }
        // Copies only of the drives the batch mounts, as the shell reads them.
        for m in std::mem::take(&mut self.shown) {
            s.machines[m].copies.clear();
            s.machines[m].filled.clear();
        }
        let mut runs: Vec<usize> = batch.iter().map(|w| world.workers[*w].run).collect();
        runs.dedup();
        let drives: BTreeSet<usize> =
            runs.iter().flat_map(|r| world.runs[*r].drives.iter().copied()).collect();
        let remaining = world.fills.remaining_of(&drives);
        for &d in drives.iter().filter(|_| self.shortcuts.busy_holders) {
            for &m in &world.holders[d] {
                if world.machines[m].copies[&d].state == CopyState::Complete {
                    s.machines[m].ready = true;
                }
            }
        }
        for d in drives {
            for &m in &world.holders[d] {
                if !(whole || self.shortcuts.unfit_copies || s.machines[m].ready) {
                    continue;
                }
                let state = world.machines[m].copies[&d].state;
                s.machines[m].copies.insert(id(d), state);
                if let Some(left) = remaining.get(&(m, d)) {
                    s.machines[m].filled.insert(id(d), world.drives[d].size - *left as i64);
                }
                self.shown.insert(m);
            }
        }
        s.workers = batch
            .iter()
            .map(|&w| {
                let worker = &world.workers[w];
                let run = &world.runs[worker.run];
                PendingRow {
                    id: id(w),
                    run_id: run.id,
                    workspace_id: Uuid::nil(),
                    name: String::new(),
                    reason: String::new(),
                    created_at: time(run.arrival),
                }
            })
            .collect();
        s.requests = runs.iter().map(|r| (world.runs[*r].id, world.runs[*r].request.clone())).collect();
        s.evictable.clear();
        s.queued.clear();
        s.staging = world.staged.len();
    }

    /// Adds `machine`'s copies as eviction weighs them.
    pub fn show_evictable(&mut self, world: &World, machine: usize) {
        let copies = world.machines[machine]
            .copies
            .iter()
            .map(|(d, c)| {
                let view = CopyView {
                    state: c.state,
                    bytes: c.bytes,
                    size_hint: c.bytes,
                    evictable: c.evictable,
                    in_use: c.users > 0,
                    last_used_at: c.last_used.map(time),
                };
                (id(*d), view)
            })
            .collect();
        // Read, as the shell reads them, only once some machine may evict.
        if self.snapshot.evictable.is_empty() {
            self.snapshot.queued =
                world.queued.iter().enumerate().filter(|(_, n)| **n > 0).map(|(d, _)| id(d)).collect();
        }
        self.snapshot.evictable.insert(id(machine), copies);
    }
}
