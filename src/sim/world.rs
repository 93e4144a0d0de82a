//! The simulated cluster: machines with their resources and copies, runs and their workers,
//! fills under way. Changed only through the few methods here, which keep each machine's room
//! and reclaimable bytes as the product's totals would read them.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, HashMap, HashSet};

use uuid::Uuid;

use super::fills::{Fills, Ms};
use super::trace::Trace;
use crate::domain::drive::{NodeScope, Transport};
use crate::domain::task::NodeSelection;
use crate::scheduler::snapshot::{CopyState, DriveNeed, Request};
use crate::store::workers::Charge;

/// The one cluster every machine is in.
pub const CLUSTER: &str = "main";

#[derive(Debug, Clone)]
pub struct Machine {
    pub id: Uuid,
    pub name: String,
    pub gpus: i64,
    pub cpu_millis: i64,
    pub memory_bytes: i64,
    pub gpus_free: i64,
    pub cpu_free: i64,
    pub memory_free: i64,
    pub data_limit: i64,
    /// What its copies take, being filled or whole: each is promised its whole size at once.
    pub data_used: i64,
    /// What evicting its whole, evictable copies that no live worker mounts would free.
    pub reclaimable: i64,
    pub copies: HashMap<usize, Copy>,
    /// Workers bound here that wait for copies to be whole.
    pub preparing: Vec<usize>,
}

impl Machine {
    pub fn data_free(&self) -> i64 {
        self.data_limit - self.data_used
    }
}

#[derive(Debug, Clone)]
pub struct Copy {
    pub state: CopyState,
    pub bytes: i64,
    pub evictable: bool,
    /// Live workers (Preparing or Running) bound here that mount it.
    pub users: u32,
    /// Set when a worker starts on it at bind and when a worker that mounted it ends, as the
    /// product reads it for eviction.
    pub last_used: Option<Ms>,
}

impl Copy {
    fn reclaimable(&self) -> bool {
        self.evictable && self.state == CopyState::Complete && self.users == 0
    }
}

#[derive(Debug, Clone)]
pub struct Drive {
    pub id: Uuid,
    pub size: i64,
    pub evictable: bool,
    /// When a worker mounting it first started: from then on its data was in the cluster.
    pub first_started: Option<Ms>,
}

#[derive(Debug, Clone)]
pub struct Run {
    pub id: Uuid,
    pub arrival: Ms,
    pub request: Request,
    pub drives: Vec<usize>,
    pub durations: Vec<Ms>,
    /// Its first worker's index; its workers are numbered on from it when it arrives.
    pub first_worker: Option<usize>,
    pub started: u32,
    /// When its last worker started.
    pub all_started: Option<Ms>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Pending,
    Preparing,
    Running,
    Ended,
}

#[derive(Debug, Clone)]
pub struct Worker {
    pub run: usize,
    pub index: usize,
    pub state: State,
    pub machine: usize,
    pub charge: Charge,
    pub bound: Ms,
    pub started: Ms,
    /// Bound where every drive it mounts was already whole.
    pub warm: bool,
    /// Every drive it mounts had been in the cluster before it was bound (see [`Drive::first_started`]).
    pub reused: bool,
}

pub struct World {
    pub machines: Vec<Machine>,
    pub drives: Vec<Drive>,
    pub runs: Vec<Run>,
    pub workers: Vec<Worker>,
    /// For each drive, the machines holding a copy of it in any state.
    pub holders: Vec<BTreeSet<usize>>,
    /// Pending workers by index, which is their arrival order.
    pub pending: BTreeSet<usize>,
    pub fills: Fills,
    /// When each Running worker ends.
    ends: BinaryHeap<Reverse<(Ms, usize)>>,
    /// Pending workers by what they ask for.
    pub pending_shapes: HashMap<Shape, usize>,
    /// For each drive, the Pending workers that mount it.
    pub queued: Vec<usize>,
    /// Copies filled ahead for queued runs, still being filled.
    pub staged: BTreeSet<(usize, usize)>,
    pub evictions: u64,
    pub fills_started: u64,
    /// The (machine, drive) pairs a fill ever started on.
    pub filled_on: HashSet<(usize, usize)>,
    /// Bytes of fills on a machine that had held a copy of the drive before: refills after an
    /// eviction.
    pub bytes_refilled: f64,
    /// Copies filled ahead for queued runs, in all.
    pub staged_total: u64,
    /// Workers bound where a drive was not whole, whose drives were all whole on some other
    /// machine then: that machine had no room for them.
    pub cold_beside_warm: u64,
}

/// What a worker asks of a machine: GPUs, cpu millis, memory bytes.
pub type Shape = (i64, i64, i64);

/// Seconds to the simulation's milliseconds.
pub fn ms(seconds: f64) -> Ms {
    (seconds * 1000.0).round() as Ms
}

/// Ids are numbered, not random: a run is the same whatever the machine it runs on.
pub fn id(n: usize) -> Uuid {
    Uuid::from_u128(n as u128 + 1)
}

pub fn index(id: Uuid) -> usize {
    (id.as_u128() - 1) as usize
}

impl World {
    /// The trace's cluster, empty: no copies, no workers. Machines are kept in the scheduler's
    /// order (by name), so a machine's index is its place in every snapshot.
    pub fn new(trace: &Trace) -> World {
        let mut machines: Vec<&super::trace::Machine> = trace.machines.iter().collect();
        machines.sort_by(|a, b| a.name.cmp(&b.name));
        let fills = Fills::new(
            trace.origin_bytes_per_second,
            machines.iter().map(|m| m.fill_bytes_per_second).collect(),
        );
        let machines = machines
            .into_iter()
            .enumerate()
            .map(|(i, m)| Machine {
                id: id(i),
                name: m.name.clone(),
                gpus: m.gpus,
                cpu_millis: m.cpu_millis,
                memory_bytes: m.memory_bytes,
                gpus_free: m.gpus,
                cpu_free: m.cpu_millis,
                memory_free: m.memory_bytes,
                data_limit: m.data_limit_bytes,
                data_used: 0,
                reclaimable: 0,
                copies: HashMap::new(),
                preparing: Vec::new(),
            })
            .collect();
        let by_name: HashMap<&str, usize> =
            trace.drives.iter().enumerate().map(|(i, d)| (d.name.as_str(), i)).collect();
        let needs: Vec<DriveNeed> = trace
            .drives
            .iter()
            .enumerate()
            .map(|(i, d)| DriveNeed {
                id: id(i),
                name: d.name.clone(),
                full: format!("sim.{}", d.name),
                scope: Some(NodeScope::Placed),
                node: None,
                transport: Transport::Auto,
                size_hint: d.size_bytes,
                evictable: d.evictable,
                host_path: None,
            })
            .collect();
        let runs = trace
            .runs
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let drives: Vec<usize> = r.drives.iter().map(|d| by_name[d.as_str()]).collect();
                Run {
                    id: id(i),
                    arrival: ms(r.arrival_s),
                    request: Request {
                        cluster: CLUSTER.into(),
                        cpu_millis: r.cpu_millis,
                        memory_bytes: r.memory_bytes,
                        gpus: r.gpus,
                        selection: NodeSelection::default(),
                        drives: drives.iter().map(|d| needs[*d].clone()).collect(),
                        fill: false,
                        image: None,
                    },
                    drives,
                    durations: (0..r.workers as usize).map(|w| ms(r.duration_of(w))).collect(),
                    first_worker: None,
                    started: 0,
                    all_started: None,
                }
            })
            .collect();
        let drives = trace
            .drives
            .iter()
            .enumerate()
            .map(|(i, d)| Drive {
                id: id(i),
                size: d.size_bytes,
                evictable: d.evictable,
                first_started: None,
            })
            .collect();
        World {
            machines,
            drives,
            runs,
            workers: Vec::new(),
            holders: vec![BTreeSet::new(); trace.drives.len()],
            pending: BTreeSet::new(),
            fills,
            ends: BinaryHeap::new(),
            pending_shapes: HashMap::new(),
            queued: vec![0; trace.drives.len()],
            staged: BTreeSet::new(),
            evictions: 0,
            fills_started: 0,
            filled_on: HashSet::new(),
            bytes_refilled: 0.0,
            staged_total: 0,
            cold_beside_warm: 0,
        }
    }

    /// A run's workers become Pending.
    pub fn arrive(&mut self, run: usize) {
        let first = self.workers.len();
        let r = &mut self.runs[run];
        r.first_worker = Some(first);
        *self
            .pending_shapes
            .entry((r.request.gpus, r.request.cpu_millis, r.request.memory_bytes))
            .or_default() += r.durations.len();
        for d in &r.drives {
            self.queued[*d] += r.durations.len();
        }
        for index in 0..r.durations.len() {
            self.pending.insert(first + index);
            self.workers.push(Worker {
                run,
                index,
                state: State::Pending,
                machine: 0,
                charge: Charge::default(),
                bound: 0,
                started: 0,
                warm: false,
                reused: false,
            });
        }
    }

    /// The next Running worker to end, and when.
    pub fn next_end(&self) -> Option<(Ms, usize)> {
        self.ends.peek().map(|Reverse(e)| *e)
    }

    pub fn pop_end(&mut self) {
        self.ends.pop();
    }

    /// Binds a Pending worker to `machine`, taking `charge`; the copies of its drives must be
    /// there (whole or being filled). It starts at once when `released`.
    /// Whether some machine holds a whole copy of every drive `run` mounts.
    fn warm_anywhere(&self, run: usize) -> bool {
        let drives = &self.runs[run].drives;
        let Some(first) = drives.first() else { return true };
        self.holders[*first].iter().any(|m| {
            let copies = &self.machines[*m].copies;
            drives.iter().all(|d| copies.get(d).is_some_and(|c| c.state == CopyState::Complete))
        })
    }

    pub fn bind(
        &mut self,
        worker: usize,
        machine: usize,
        charge: Charge,
        released: bool,
        now: Ms,
    ) -> anyhow::Result<()> {
        let w = &self.workers[worker];
        anyhow::ensure!(w.state == State::Pending, "worker {worker} bound twice");
        let run = w.run;
        let m = &mut self.machines[machine];
        m.gpus_free -= charge.gpus;
        m.cpu_free -= charge.cpu_millis;
        m.memory_free -= charge.memory_bytes;
        anyhow::ensure!(
            m.gpus_free >= 0 && m.cpu_free >= 0 && m.memory_free >= 0,
            "machine {} over-committed by worker {worker}",
            m.name
        );
        let mut whole = true;
        for d in &self.runs[run].drives {
            // A copy the same pass evicted is made again once gone (see `ensure_copy`).
            let Some(c) = m.copies.get_mut(d) else {
                whole = false;
                continue;
            };
            if c.reclaimable() {
                m.reclaimable -= c.bytes;
            }
            c.users += 1;
            whole &= c.state == CopyState::Complete;
        }
        anyhow::ensure!(whole == released, "worker {worker} released {released} with copies whole {whole}");
        let reused =
            self.runs[run].drives.iter().all(|d| self.drives[*d].first_started.is_some_and(|t| t <= now));
        if reused && !released && self.warm_anywhere(run) {
            self.cold_beside_warm += 1;
        }
        let w = &mut self.workers[worker];
        w.state = State::Preparing;
        w.machine = machine;
        w.charge = charge;
        w.bound = now;
        w.warm = released;
        w.reused = reused;
        self.pending.remove(&worker);
        let shape = self.shape(worker);
        let left = self.pending_shapes.get_mut(&shape).expect("a pending worker's shape is counted");
        *left -= 1;
        if *left == 0 {
            self.pending_shapes.remove(&shape);
        }
        for d in &self.runs[run].drives {
            self.queued[*d] -= 1;
        }
        if released {
            self.start(worker, now);
        } else {
            self.machines[machine].preparing.push(worker);
        }
        Ok(())
    }

    /// A bound worker starts running.
    pub fn start(&mut self, worker: usize, now: Ms) {
        let w = &mut self.workers[worker];
        w.state = State::Running;
        w.started = now;
        let run = &mut self.runs[w.run];
        self.ends.push(Reverse((now + run.durations[w.index], worker)));
        run.started += 1;
        if run.started as usize == run.durations.len() {
            run.all_started = Some(now);
        }
        for d in &run.drives {
            self.drives[*d].first_started.get_or_insert(now);
        }
    }

    /// A Running worker ends: its resources are freed and its copies were last used now.
    pub fn end(&mut self, worker: usize, now: Ms) {
        let w = &mut self.workers[worker];
        w.state = State::Ended;
        let m = &mut self.machines[w.machine];
        m.gpus_free += w.charge.gpus;
        m.cpu_free += w.charge.cpu_millis;
        m.memory_free += w.charge.memory_bytes;
        for d in &self.runs[w.run].drives {
            let c = m.copies.get_mut(d).expect("a live worker's copy is kept");
            c.users -= 1;
            c.last_used = c.last_used.max(Some(now));
            if c.reclaimable() {
                m.reclaimable += c.bytes;
            }
        }
    }

    /// Makes a copy to be filled: its whole size is taken from the machine's room at once.
    pub fn add_copy(&mut self, machine: usize, drive: usize) -> anyhow::Result<()> {
        let m = &mut self.machines[machine];
        let d = &self.drives[drive];
        let copy = Copy {
            state: CopyState::Filling,
            bytes: d.size,
            evictable: d.evictable,
            users: 0,
            last_used: None,
        };
        anyhow::ensure!(
            m.copies.insert(drive, copy).is_none(),
            "a second copy of drive {drive} on {}",
            m.name
        );
        m.data_used += d.size;
        self.holders[drive].insert(machine);
        Ok(())
    }

    /// Makes again a copy that workers bound here wait for: one the pass that bound them evicted
    /// (the product binds to a copy being evicted, and its fill controller makes the copy again
    /// once the agent has removed it, without weighing room).
    pub fn ensure_copy(&mut self, machine: usize, drive: usize) -> anyhow::Result<()> {
        self.add_copy(machine, drive)?;
        let users = self.machines[machine]
            .preparing
            .iter()
            .filter(|w| self.runs[self.workers[**w].run].drives.contains(&drive))
            .count();
        self.machines[machine].copies.get_mut(&drive).expect("just made").users = users as u32;
        Ok(())
    }

    /// The copy's last byte is written.
    pub fn complete(&mut self, machine: usize, drive: usize) {
        let m = &mut self.machines[machine];
        let c = m.copies.get_mut(&drive).expect("a copy being filled is kept");
        c.state = CopyState::Complete;
        if c.reclaimable() {
            m.reclaimable += c.bytes;
        }
    }

    /// Removes copies; only whole, evictable copies no live worker mounts may go.
    pub fn evict(&mut self, machine: usize, drive: usize) -> anyhow::Result<()> {
        let m = &mut self.machines[machine];
        let Some(c) = m.copies.get(&drive) else {
            anyhow::bail!("evicting drive {drive} from {}, which holds no copy of it", m.name);
        };
        anyhow::ensure!(
            c.reclaimable(),
            "evicting a copy of drive {drive} on {} that may not go: {c:?}",
            m.name
        );
        m.reclaimable -= c.bytes;
        m.data_used -= c.bytes;
        m.copies.remove(&drive);
        self.holders[drive].remove(&machine);
        self.evictions += 1;
        Ok(())
    }

    /// A worker that starts now uses its copy now.
    pub fn touch(&mut self, machine: usize, drive: usize, now: Ms) {
        if let Some(c) = self.machines[machine].copies.get_mut(&drive) {
            c.last_used = c.last_used.max(Some(now));
        }
    }

    /// Starts the workers on `machine` whose copies are all whole now.
    pub fn release(&mut self, machine: usize, now: Ms) {
        let waiting = std::mem::take(&mut self.machines[machine].preparing);
        let mut still = Vec::new();
        for w in waiting {
            let m = &self.machines[machine];
            let whole = self.runs[self.workers[w].run]
                .drives
                .iter()
                .all(|d| m.copies.get(d).is_some_and(|c| c.state == CopyState::Complete));
            if whole { self.start(w, now) } else { still.push(w) }
        }
        self.machines[machine].preparing = still;
    }

    pub fn shape(&self, worker: usize) -> Shape {
        let r = &self.runs[self.workers[worker].run].request;
        (r.gpus, r.cpu_millis, r.memory_bytes)
    }
}
