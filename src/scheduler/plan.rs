//! One scheduling pass's decisions, as a pure function of what the pass read: which Pending
//! worker goes where, which copies are made and evicted for it, and why the others wait. The
//! shell ([`super`]) reads a [`Snapshot`] and applies the [`Plan`] in one transaction; the
//! simulator drives the same function.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::evict;
use super::filter;
use super::policy::{self, Policy};
use super::score;
use super::select::{self, Choice};
use super::snapshot::{CopyState, CopyView, DriveNeed, MachineView, Request};
use crate::domain::grant::Grant;
use crate::domain::quantity::human_seconds;
use crate::store::workers::{Bind, Charge, PendingRow};

/// What a pass decides over.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// The pass's Pending workers, in the order they are placed.
    pub workers: Vec<PendingRow>,
    /// What each worker of a run asks for, by run.
    pub requests: HashMap<Uuid, Request>,
    /// The drive each fill run fills, by run.
    pub fill_drives: HashMap<Uuid, Uuid>,
    /// In [`super::snapshot::placement_order`]: every machine, or when `scoped` only those the
    /// pass's runs name.
    pub machines: Vec<MachineView>,
    /// When `scoped`, the machines not in `machines`, without their copies, in the same order;
    /// `None` until a worker fits none of `machines` ([`Plan::needs_others`]).
    pub others: Option<Vec<MachineView>>,
    pub scoped: bool,
    /// What the workers waiting on a fill's machine for its drive lend it, by (machine, drive).
    pub lent: HashMap<(Uuid, Uuid), Charge>,
    /// The host paths granted to each (workspace, cluster) whose workers mount host paths.
    pub grants: HashMap<(Uuid, String), Vec<Grant>>,
    /// The copies of each machine that may have to evict to make room, by machine and drive.
    pub evictable: HashMap<Uuid, HashMap<Uuid, CopyView>>,
    /// The drives Pending workers mount, these and others: read when a machine may evict.
    pub queued: BTreeSet<Uuid>,
    /// Copies being filled ahead for queued runs now, against [`STAGE_BUDGET`].
    pub staging: usize,
}

/// Copies filled ahead for queued runs at once, in a cluster: each holds a fill's cores and a
/// share of the origin's bandwidth that placed workers wait for.
pub const STAGE_BUDGET: usize = 16;
/// Machines a queued run's drives are filled ahead on, at most.
pub const STAGE_PER_RUN: usize = 8;
/// Queued runs weighed for stage-in in a pass, the first in the queue: each is a scan of the
/// machines.
pub const STAGE_RUNS: usize = 16;

/// A copy to make, for a bound worker that lacks it; the fill controller fills it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewCopy {
    pub machine: Uuid,
    pub drive: Uuid,
    pub size_hint: i64,
    pub evictable: bool,
}

/// Copies evicted on one machine to make room for a drive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Eviction {
    pub machine: Uuid,
    pub drives: Vec<Uuid>,
    /// The event each evicted drive gets.
    pub why: String,
}

/// A copy filled ahead for a queued run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Staged {
    pub run: Uuid,
    pub copy: NewCopy,
}

/// A worker left Pending with a new reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unplaced {
    pub worker: Uuid,
    pub reason: String,
}

/// How a bound worker was placed, for its `Scheduled` event and its drives' transports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub explained: String,
    pub transports: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default)]
pub struct Plan {
    /// Placements, decided one by one against the machines as the earlier ones left them.
    pub binds: Vec<Bind>,
    /// By worker, for each bind.
    pub placed: HashMap<Uuid, Placement>,
    /// Copies to make, after `evictions` on the same machine.
    pub copies: Vec<NewCopy>,
    pub evictions: Vec<Eviction>,
    /// (machine, drive): copies a worker starts on now, each once.
    pub used: Vec<(Uuid, Uuid)>,
    /// Workers that fit nowhere and whose reason changed (each gets a `FailedScheduling` event).
    pub unplaced: Vec<Unplaced>,
    /// Workers whose host path is no longer granted: they fail.
    pub ungranted: Vec<Unplaced>,
    /// Copies filled ahead for queued runs, on machines none of the pass's workers went to.
    pub staged: Vec<Staged>,
    /// A worker fit none of a scoped snapshot's machines and its reason needs the others: read
    /// them into [`Snapshot::others`] and plan again.
    pub needs_others: bool,
    /// Workers that fit somewhere but wait for a machine that holds their drives whole.
    pub warm_waits: BTreeSet<Uuid>,
    /// The soonest one of `warm_waits` stops waiting: a pass is due then, whatever else happens.
    pub wake_at: Option<DateTime<Utc>>,
}

/// The longest a worker waits for a machine that holds its drives whole.
pub const MAX_WARM_WAIT: i64 = 30 * 60;

/// Decides the pass: each worker in turn, against the machines as the earlier workers left them.
pub fn plan(s: &Snapshot, now: DateTime<Utc>, policy: &Policy) -> Plan {
    let mut machines = s.machines.clone();
    if !policy.decisions.images {
        machines.iter_mut().for_each(|m| m.images.clear());
    }
    if !policy.decisions.spare_holders {
        machines.iter_mut().for_each(|m| m.held = 0);
    }
    if !policy.decisions.expected_start {
        machines.iter_mut().for_each(|m| {
            m.filled.clear();
            m.fill_rate = None;
        });
    }
    let mut evictable = s.evictable.clone();
    let mut out = Plan::default();
    // Copies made whole during the pass are not: the index stays true for the whole pass.
    let index = select::warm_index(&machines);
    let spread = policy::spread(&index, machines.len());
    // A run's workers ask for the same: their warm machines are ranked once.
    let mut warm: HashMap<Uuid, select::Warm> =
        s.requests.iter().map(|(id, r)| (*id, select::warm_for(&machines, &index, r))).collect();
    // A fill is pinned to its machine, where the workers waiting for it lend it their share.
    let fills: HashMap<Uuid, (Uuid, Uuid)> = s
        .fill_drives
        .iter()
        .filter_map(|(run, drive)| {
            let r = s.requests.get(run)?;
            let m = machines.iter().find(|m| r.selects(&m.name))?;
            Some((*run, (m.id, *drive)))
        })
        .collect();
    // The copies the pass's workers mount, whole or not: none of them is evicted for another.
    let mut held: BTreeSet<(Uuid, Uuid)> = BTreeSet::new();
    let mut used: BTreeSet<(Uuid, Uuid)> = BTreeSet::new();
    // Runs with workers that fit nowhere, in the queue's order, with how many.
    let mut waiting: Vec<(Uuid, usize)> = Vec::new();
    // The last run whose worker fit nowhere, and why, until a worker is bound: resources and
    // room only shrink in a pass, so its next worker fits nowhere for the same reason.
    let mut nowhere: Option<(Uuid, String)> = None;
    for w in &s.workers {
        // A run deleted since its workers were claimed has none left to place.
        let Some(request) = s.requests.get(&w.run_id) else {
            continue;
        };
        let granted = s.grants.get(&(w.workspace_id, request.cluster.clone())).map_or(&[][..], Vec::as_slice);
        if let Some(why) = filter::ungranted(request, granted) {
            out.ungranted.push(Unplaced { worker: w.id, reason: why });
            continue;
        }
        let mut request = Cow::Borrowed(request);
        if let Some(lent) = fills.get(&w.run_id).and_then(|pair| s.lent.get(pair)) {
            let r = request.to_mut();
            r.cpu_millis = (r.cpu_millis - lent.cpu_millis).max(0);
            r.memory_bytes = (r.memory_bytes - lent.memory_bytes).max(0);
            r.gpus = (r.gpus - lent.gpus).max(0);
        }
        let chosen = match (policy.scoring, &nowhere) {
            // The run's worker before this one fit nowhere, and nothing was bound since.
            (_, Some((run, why))) if *run == w.run_id => Err(why.clone()),
            (policy::Scoring::Astraeus, _) => {
                // A fill's worker asks for less than its run: its machines are ranked for what it asks.
                let mut lent_warm;
                let warm = match &request {
                    Cow::Borrowed(_) => warm.entry(w.run_id).or_default(),
                    Cow::Owned(r) => {
                        lent_warm = select::warm_for(&machines, &index, r);
                        &mut lent_warm
                    }
                };
                select::select(&machines, &request, warm)
            }
            (other, _) => policy::select(other, &machines, &request, w.id, &spread),
        };
        let choice = match chosen {
            Ok(c) => c,
            Err(why) => {
                nowhere = Some((w.run_id, why.clone()));
                let why = match (s.scoped, &s.others) {
                    (false, _) => why,
                    (true, None) => {
                        out.needs_others = true;
                        return out;
                    }
                    // One has joined since the pass read its machines: the next pass sees it.
                    (true, Some(others)) => match select::why_none(&machines, others, &request) {
                        Some(why) => why,
                        None => continue,
                    },
                };
                if w.reason != why {
                    out.unplaced.push(Unplaced { worker: w.id, reason: why });
                }
                match waiting.last_mut() {
                    Some((run, n)) if *run == w.run_id => *n += 1,
                    _ => waiting.push((w.run_id, 1)),
                }
                continue;
            }
        };
        if policy.decisions.wait_for_warm
            && let Some((holder, until)) = warm_wait(&machines, &index, &request, choice.index, w.created_at)
            && now < until
        {
            let why = format!(
                "Waiting for {}, {}, to have room: at most {}, then a machine that fills them",
                holder.name,
                holder.holds(),
                human_seconds((until - w.created_at).num_seconds())
            );
            if w.reason != why {
                out.unplaced.push(Unplaced { worker: w.id, reason: why });
            }
            out.warm_waits.insert(w.id);
            out.wake_at = Some(out.wake_at.map_or(until, |t| t.min(until)));
            continue;
        }
        let Choice { index: i, .. } = choice;
        let placement = Placement {
            explained: explain(&machines, &choice),
            transports: transports(&request.drives, &machines[i], &machines),
        };
        nowhere = None;
        let m = &mut machines[i];
        let lacking: Vec<&DriveNeed> =
            request.placed().filter(|d| m.copy_state(d.id) != Some(CopyState::Complete)).collect();
        let (released, reason) = match lacking.first() {
            None => (true, format!("Starting on {}", m.name)),
            Some(d) => (false, format!("Waiting for drive {} to be filled on {}", d.full, m.name)),
        };
        held.extend(request.placed().map(|d| (m.id, d.id)));
        let room = Room { held: &held, queued: &s.queued, policy, now };
        make_room(m, &lacking, &room, evictable.entry(m.id).or_default(), &mut out);
        if released {
            used.extend(request.placed().map(|d| (m.id, d.id)));
        }
        let charge =
            Charge { cpu_millis: request.cpu_millis, memory_bytes: request.memory_bytes, gpus: request.gpus };
        m.take(charge.cpu_millis, charge.memory_bytes, charge.gpus);
        out.binds.push(Bind { worker: w.id, machine: m.id, charge, released, reason, fill: request.fill });
        out.placed.insert(w.id, placement);
    }
    out.used = used.into_iter().collect();
    if policy.decisions.stage_in && !s.scoped {
        stage_in(s, &mut machines, &waiting, &mut out);
    }
    out
}

/// Fills the drives of runs that wait for resources ahead, on the machines they will most
/// likely get once resources free up: those that would take a worker were they empty, short of
/// the fewest GPUs, then cores, for it. Only into free room (no copy is evicted for a run that
/// may start elsewhere), and only as many machines as the run has waiting workers, less those
/// that hold its drives already.
fn stage_in(s: &Snapshot, machines: &mut [MachineView], waiting: &[(Uuid, usize)], out: &mut Plan) {
    let mut budget = STAGE_BUDGET.saturating_sub(s.staging);
    let mut seen = BTreeSet::new();
    for &(run, workers) in waiting.iter().filter(|(run, _)| seen.insert(*run)).take(STAGE_RUNS) {
        let Some(r) = s.requests.get(&run) else { continue };
        if budget == 0 {
            return;
        }
        if r.fill || r.placed().next().is_none() {
            continue;
        }
        let holds = |m: &MachineView| {
            r.placed().all(|d| matches!(m.copy_state(d.id), Some(CopyState::Complete | CopyState::Filling)))
        };
        let eligible: Vec<usize> =
            (0..machines.len()).filter(|&i| filter::fits_when_free(&machines[i], r)).collect();
        let want = workers.min(STAGE_PER_RUN);
        let have = eligible.iter().filter(|&&i| holds(&machines[i])).count();
        let mut room: Vec<usize> = eligible
            .into_iter()
            .filter(|&i| {
                let m = &machines[i];
                let lacking: i64 =
                    r.placed().filter(|d| m.copy_state(d.id).is_none()).map(|d| d.size_hint).sum();
                !holds(m) && m.data_free.is_some_and(|free| free >= lacking)
            })
            .collect();
        room.sort_by_key(|&i| {
            let m = &machines[i];
            ((r.gpus - m.gpus_free).max(0), (r.cpu_millis - m.cpu_free).max(0), i)
        });
        for i in room.into_iter().take(want.saturating_sub(have)) {
            let m = &mut machines[i];
            let lacking: Vec<&DriveNeed> = r.placed().filter(|d| m.copy_state(d.id).is_none()).collect();
            for d in lacking {
                if budget == 0 {
                    return;
                }
                budget -= 1;
                let copy =
                    NewCopy { machine: m.id, drive: d.id, size_hint: d.size_hint, evictable: d.evictable };
                out.staged.push(Staged { run, copy });
                m.data_free = Some(m.data_free.unwrap_or(0) - d.size_hint);
                m.copies.insert(d.id, CopyState::Filling);
            }
        }
    }
}

/// For a worker whose chosen machine (`chosen`) lacks some of its drives whole: a machine that
/// could take it once free and whose data could be whole sooner, holding them all whole or
/// more of them (the soonest, then the first in the machines' order), what it holds whole, and
/// until when the worker may wait for it: as long as that saves ([`score::ready_in`] on each),
/// counted from when the worker was made, at most [`MAX_WARM_WAIT`].
fn warm_wait(
    machines: &[MachineView],
    index: &HashMap<Uuid, Vec<usize>>,
    r: &Request,
    chosen: usize,
    created_at: DateTime<Utc>,
) -> Option<(Holder, DateTime<Utc>)> {
    let whole = |m: &MachineView, d: &DriveNeed| m.copy_state(d.id) == Some(CopyState::Complete);
    let there = score::ready_in(&machines[chosen], r);
    if r.fill || there == 0 {
        return None;
    }
    let most = score::to_fill(&machines[chosen], r);
    let mut holders: Vec<usize> = r.placed().filter_map(|d| index.get(&d.id)).flatten().copied().collect();
    holders.sort_unstable();
    holders.dedup();
    let mut best: Option<(i64, usize)> = None;
    for i in holders {
        let m = &machines[i];
        let sooner = score::ready_in(m, r);
        if sooner >= best.map_or(there, |(s, _)| s)
            || score::to_fill(m, r) > most
            || !filter::fits_when_free(m, r)
        {
            continue;
        }
        best = Some((sooner, i));
        if sooner == 0 {
            break;
        }
    }
    let (sooner, i) = best?;
    let m = &machines[i];
    let held = r.placed().filter(|d| whole(m, d)).map(|d| d.full.clone()).collect();
    let all = r.placed().all(|d| whole(m, d));
    let wait = (there - sooner).min(MAX_WARM_WAIT);
    Some((Holder { name: m.name.clone(), held, all }, created_at + chrono::Duration::seconds(wait)))
}

/// The machine a worker waits for, and the drives it holds whole (`all`: every one it mounts).
struct Holder {
    name: String,
    held: Vec<String>,
    all: bool,
}

impl Holder {
    /// `which holds its drives whole` or `which holds drive ws.b whole`.
    fn holds(&self) -> String {
        match self.held.as_slice() {
            _ if self.all => "which holds its drives whole".into(),
            [one] => format!("which holds drive {one} whole"),
            many => format!("which holds drives {} whole", many.join(", ")),
        }
    }
}

fn explain(machines: &[MachineView], c: &Choice) -> String {
    let m = &machines[c.index];
    match c.runner_up {
        Some((r, s)) => format!("placed on {} ({}); runner-up {} ({s})", m.name, c.score, machines[r].name),
        None => format!("placed on {} ({}); no other machine fits", m.name, c.score),
    }
}

/// What eviction weighs besides a machine's copies.
struct Room<'a> {
    /// The (machine, drive) pairs the pass's workers mount.
    held: &'a BTreeSet<(Uuid, Uuid)>,
    queued: &'a BTreeSet<Uuid>,
    policy: &'a Policy,
    now: DateTime<Utc>,
}

/// Makes the copies a bound worker lacks on `m`, evicting unused copies first when room is
/// short; `copies` are the machine's copies as eviction weighs them.
fn make_room(
    m: &mut MachineView,
    lacking: &[&DriveNeed],
    room: &Room,
    copies: &mut HashMap<Uuid, CopyView>,
    out: &mut Plan,
) {
    let missing: Vec<&&DriveNeed> = lacking.iter().filter(|d| m.copy_state(d.id).is_none()).collect();
    for d in missing {
        let free = m.data_free.unwrap_or(0);
        if free < d.size_hint {
            evict_for(m, d, d.size_hint - free, room, copies, out);
        }
        out.copies.push(NewCopy {
            machine: m.id,
            drive: d.id,
            size_hint: d.size_hint,
            evictable: d.evictable,
        });
        m.data_free = Some(m.data_free.unwrap_or(0) - d.size_hint);
        m.copies.insert(d.id, CopyState::Filling);
    }
}

/// Evicts copies on `m` to free `need` bytes for `d`.
fn evict_for(
    m: &mut MachineView,
    d: &DriveNeed,
    need: i64,
    room: &Room,
    copies: &mut HashMap<Uuid, CopyView>,
    out: &mut Plan,
) {
    // The store does not know yet of the pass's own binds.
    for (drive, c) in copies.iter_mut() {
        c.in_use |= room.held.contains(&(m.id, *drive));
    }
    let decisions = room.policy.decisions;
    let none = BTreeSet::new();
    let queued = if decisions.queue_eviction { room.queued } else { &none };
    let gone = evict::plan_weighing(copies, need, queued, decisions.refill_cost.then_some(room.now));
    if gone.is_empty() {
        return;
    }
    for id in &gone {
        let c = copies.get_mut(id).expect("eviction chooses among the copies given");
        c.state = CopyState::Evicting;
        m.copies.insert(*id, CopyState::Evicting);
        m.data_free = Some(m.data_free.unwrap_or(0) + c.bytes);
        m.freed += c.bytes;
        m.reclaimable -= c.bytes;
    }
    let why = format!("copy on {} evicted to make room for drive {}", m.name, d.full);
    out.evictions.push(Eviction { machine: m.id, drives: gone, why });
}

/// How a worker on `m` reaches each drive kept on one machine: on that machine directly,
/// elsewhere over RDMA when both machines have it, otherwise NFS.
fn transports(drives: &[DriveNeed], m: &MachineView, all: &[MachineView]) -> BTreeMap<String, String> {
    drives
        .iter()
        .filter_map(|d| {
            let node = d.node.as_deref()?;
            let rdma =
                |name: &str| all.iter().any(|x| x.name == name && x.transports.iter().any(|t| t == "rdma"));
            let how = if node == m.name {
                "local"
            } else if rdma(node) && m.transports.iter().any(|t| t == "rdma") {
                "rdma"
            } else {
                "nfs"
            };
            Some((d.full.clone(), how.to_owned()))
        })
        .collect()
}

/// The machines that may have to evict during the pass: those with something to evict whose
/// room is short of every placed drive of the pass at once (each copy is made once a machine, so
/// no other runs short). Only their copies are read for the snapshot.
pub fn may_evict(machines: &[MachineView], requests: &HashMap<Uuid, Request>) -> Vec<Uuid> {
    let mut sizes: HashMap<Uuid, i64> = HashMap::new();
    for d in requests.values().flat_map(Request::placed) {
        sizes.insert(d.id, d.size_hint);
    }
    let need: i64 = sizes.values().sum();
    machines
        .iter()
        .filter(|m| m.reclaimable > 0 && m.data_free.is_some_and(|free| free < need))
        .map(|m| m.id)
        .collect()
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;
    use crate::domain::Name;
    use crate::domain::task::{NodeSelection, SelectionMode};
    use crate::scheduler::policy::Decisions;
    use crate::scheduler::snapshot::ByDrive;

    const GB: i64 = 1_000_000_000;

    fn id(n: u128) -> Uuid {
        Uuid::from_u128(n)
    }

    fn machine(n: u128, gpus: i64, data_free: Option<i64>) -> MachineView {
        MachineView {
            id: id(100 + n),
            name: format!("gpu-0{n}"),
            cluster: "main".into(),
            ready: true,
            cordoned: false,
            transports: vec![],
            cpu_total: 8000,
            memory_total: 64 * GB,
            cpu_free: 8000,
            memory_free: 64 * GB,
            gpus_total: gpus,
            gpus_free: gpus,
            data_free,
            reclaimable: 0,
            held: 0,
            freed: 0,
            images: vec![],
            copies: ByDrive::default(),
            filled: ByDrive::default(),
            fill_rate: None,
        }
    }

    fn drive(n: u128, size_hint: i64) -> DriveNeed {
        DriveNeed {
            host_path: None,
            id: id(n),
            name: format!("d{n}"),
            full: format!("default.d{n}"),
            scope: Some(crate::domain::drive::NodeScope::Placed),
            node: None,
            transport: crate::domain::drive::Transport::Auto,
            size_hint,
            evictable: true,
        }
    }

    fn request(gpus: i64, drives: Vec<DriveNeed>) -> Request {
        Request {
            cluster: "main".into(),
            cpu_millis: 1000,
            memory_bytes: GB,
            gpus,
            selection: NodeSelection::default(),
            drives,
            fill: false,
            image: None,
        }
    }

    fn worker(n: u128, run: u128) -> PendingRow {
        PendingRow {
            id: id(1000 + n),
            run_id: id(500 + run),
            workspace_id: id(9),
            name: format!("w{n}"),
            reason: String::new(),
            created_at: Utc.with_ymd_and_hms(2026, 12, 1, 0, 0, 0).unwrap(),
        }
    }

    fn snapshot(
        machines: Vec<MachineView>,
        runs: Vec<(u128, Request)>,
        workers: Vec<PendingRow>,
    ) -> Snapshot {
        Snapshot {
            workers,
            requests: runs.into_iter().map(|(n, r)| (id(500 + n), r)).collect(),
            machines,
            ..Snapshot::default()
        }
    }

    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 12, 7, 0, 0, 0).unwrap()
    }

    #[test]
    fn a_worker_waits_for_a_full_machine_holding_its_data_whole_as_long_as_a_fill_elsewhere_takes() {
        let mut warm = machine(1, 8, Some(1000 * GB));
        warm.copies.insert(id(1), CopyState::Complete);
        warm.gpus_free = 0;
        let cold = machine(2, 8, Some(1000 * GB));
        let mut w = worker(1, 1);
        w.created_at = now() - chrono::Duration::minutes(10);
        let s = snapshot(vec![warm, cold], vec![(1, request(4, vec![drive(1, 150 * GB)]))], vec![w.clone()]);

        // 150 GB at the 100 MB/s of a machine never measured: 1,500 s, 25 min from its making.
        let until = w.created_at + chrono::Duration::seconds(1500);
        let p = plan(&s, now(), &Policy::default());
        assert!(p.binds.is_empty(), "{:?}", p.binds);
        let why = "Waiting for gpu-01, which holds its drives whole, to have room: at most 25 min, then a \
                   machine that fills them";
        assert_eq!(p.unplaced, [Unplaced { worker: w.id, reason: why.into() }]);
        assert_eq!(p.wake_at, Some(until));
        assert!(p.staged.is_empty(), "nothing is filled ahead for a worker that waits for its data");

        // Then it goes where it fits, cold; so at once without the decision, or when the holder
        // could never take it.
        let cold_now = |s: &Snapshot, at, policy: &Policy| {
            let p = plan(s, at, policy);
            p.binds.iter().map(|b| (b.machine, b.released)).collect::<Vec<_>>()
        };
        assert_eq!(cold_now(&s, until, &Policy::default()), [(id(102), false)]);
        let never =
            Policy { decisions: Decisions { wait_for_warm: false, ..Decisions::ALL }, ..Policy::default() };
        assert_eq!(cold_now(&s, now(), &never), [(id(102), false)]);
        let mut small = s.clone();
        small.machines[0].gpus_total = 2;
        assert_eq!(cold_now(&small, now(), &Policy::default()), [(id(102), false)]);
    }

    #[test]
    fn of_two_drives_the_machine_holding_the_larger_wins_and_is_waited_for_when_full() {
        // gpu-01 holds the 5 TB drive whole, gpu-02 the 10 GB one; the run mounts both.
        let mut large = machine(1, 8, Some(1000 * GB));
        large.copies.insert(id(1), CopyState::Complete);
        let mut small = machine(2, 8, Some(10_000 * GB));
        small.copies.insert(id(2), CopyState::Complete);
        let mut w = worker(1, 1);
        w.created_at = now() - chrono::Duration::minutes(1);
        let r = request(8, vec![drive(1, 5000 * GB), drive(2, 10 * GB)]);
        let s = snapshot(vec![large, small], vec![(1, r)], vec![w.clone()]);
        let p = plan(&s, now(), &Policy::default());
        assert_eq!(
            p.binds.iter().map(|b| b.machine).collect::<Vec<_>>(),
            [id(101)],
            "10 GB to fill, not 5 TB"
        );
        assert!(
            p.placed[&w.id].explained.contains("runner-up gpu-02 (5.0 TB to fill, complete copies 1"),
            "{}",
            p.placed[&w.id].explained
        );

        // Full, it is waited for: 10 GB at 100 MB/s is 100 s (2 min in steps), 5 TB is 50,000 s,
        // so the wait is capped at 30 min.
        let mut busy = s.clone();
        busy.machines[0].gpus_free = 0;
        let p = plan(&busy, now(), &Policy::default());
        assert!(p.binds.is_empty(), "{:?}", p.binds);
        let why = "Waiting for gpu-01, which holds drive default.d1 whole, to have room: at most 30 min, \
                   then a machine that fills them";
        assert_eq!(p.unplaced, [Unplaced { worker: w.id, reason: why.into() }]);
        assert_eq!(p.wake_at, Some(w.created_at + chrono::Duration::seconds(MAX_WARM_WAIT)));
        let later = plan(&busy, w.created_at + chrono::Duration::seconds(MAX_WARM_WAIT), &Policy::default());
        assert_eq!(
            later.binds.iter().map(|b| (b.machine, b.released)).collect::<Vec<_>>(),
            [(id(102), false)]
        );
    }

    #[test]
    fn a_runs_workers_after_one_that_fits_nowhere_get_its_reason_until_one_is_bound() {
        let s = snapshot(
            vec![machine(1, 2, Some(1000 * GB))],
            vec![(1, request(4, vec![])), (2, request(1, vec![]))],
            vec![worker(1, 1), worker(2, 1), worker(3, 2), worker(4, 1)],
        );
        let p = plan(&s, now(), &Policy::default());
        let why = "Insufficient gpus (2 of 4 free)";
        let reasons: Vec<(Uuid, &str)> = p.unplaced.iter().map(|u| (u.worker, u.reason.as_str())).collect();
        // The fourth worker comes after a bind, and its reason is worked out again: 1 of 4 free.
        assert_eq!(
            reasons,
            [(id(1001), why), (id(1002), why), (id(1004), "Insufficient gpus (1 of 4 free)")]
        );
        assert_eq!(p.binds.iter().map(|b| b.worker).collect::<Vec<_>>(), [id(1003)]);
    }

    #[test]
    fn a_runs_workers_go_where_the_data_is_whole_and_the_rest_wait_for_a_fill() {
        let mut warm = machine(1, 8, Some(1000 * GB));
        warm.copies.insert(id(1), CopyState::Complete);
        let cold = machine(2, 8, Some(1000 * GB));
        // Three workers of 4 GPUs: two fit on the warm machine, the third goes cold.
        let s = snapshot(
            vec![warm, cold],
            vec![(1, request(4, vec![drive(1, 150 * GB)]))],
            (1..=3).map(|n| worker(n, 1)).collect(),
        );
        let p = plan(&s, now(), &Policy::default());
        let on: Vec<(Uuid, bool, &str)> =
            p.binds.iter().map(|b| (b.machine, b.released, b.reason.as_str())).collect();
        assert_eq!(
            on,
            [
                (id(101), true, "Starting on gpu-01"),
                (id(101), true, "Starting on gpu-01"),
                (id(102), false, "Waiting for drive default.d1 to be filled on gpu-02"),
            ]
        );
        assert_eq!(
            p.copies,
            [NewCopy { machine: id(102), drive: id(1), size_hint: 150 * GB, evictable: true }]
        );
        assert_eq!(p.used, [(id(101), id(1))]);
        assert!(p.placed[&id(1001)].explained.starts_with("placed on gpu-01 (complete copies 1"));
        assert!(p.unplaced.is_empty() && p.evictions.is_empty() && !p.needs_others);
    }

    #[test]
    fn a_worker_that_fits_nowhere_gets_a_reason_once() {
        let s = snapshot(vec![machine(1, 2, None)], vec![(1, request(4, vec![]))], vec![worker(1, 1)]);
        let p = plan(&s, now(), &Policy::default());
        let why = "Insufficient gpus (2 of 4 free)";
        assert_eq!(p.unplaced, [Unplaced { worker: id(1001), reason: why.into() }]);
        // The same reason again changes nothing.
        let mut s = s;
        s.workers[0].reason = why.into();
        assert!(plan(&s, now(), &Policy::default()).unplaced.is_empty());
    }

    #[test]
    fn room_is_made_by_evicting_the_least_recently_used_copy_not_one_the_pass_mounts() {
        let mut m = machine(1, 8, Some(100 * GB));
        let day = |d| Some(Utc.with_ymd_and_hms(2026, 11, d, 0, 0, 0).unwrap());
        let whole = |bytes, last_used_at| CopyView {
            state: CopyState::Complete,
            bytes,
            size_hint: bytes,
            evictable: true,
            in_use: false,
            last_used_at,
        };
        // d2 is mounted by the pass's first worker; d3 is the oldest unused; d4 newer.
        let copies = HashMap::from([
            (id(2), whole(60 * GB, day(1))),
            (id(3), whole(80 * GB, day(2))),
            (id(4), whole(80 * GB, day(20))),
        ]);
        m.reclaimable = 220 * GB;
        m.copies = copies.iter().map(|(d, c)| (*d, c.state)).collect();
        let mut s = snapshot(
            vec![m],
            vec![(1, request(1, vec![drive(2, 60 * GB)])), (2, request(1, vec![drive(1, 150 * GB)]))],
            vec![worker(1, 1), worker(2, 2)],
        );
        assert_eq!(may_evict(&s.machines, &s.requests), [id(101)], "100 GB free < 60 + 150 GB");
        s.evictable.insert(id(101), copies);
        let p = plan(&s, now(), &Policy::default());
        // 150 GB - 100 GB free = 50 GB to free: d3 (day 2) goes, not d2 (day 1, mounted now).
        assert_eq!(
            p.evictions,
            [Eviction {
                machine: id(101),
                drives: vec![id(3)],
                why: "copy on gpu-01 evicted to make room for drive default.d1".into()
            }]
        );
        assert_eq!(p.copies.len(), 1);
        assert_eq!(p.binds.len(), 2);
    }

    #[test]
    fn a_scoped_pass_asks_for_the_other_machines_before_it_gives_a_reason() {
        let mut r = request(4, vec![]);
        r.selection =
            NodeSelection { mode: SelectionMode::Exact, names: vec![Name::parse("gpu-01").unwrap()] };
        let mut s = snapshot(vec![machine(1, 2, None)], vec![(1, r)], vec![worker(1, 1)]);
        s.scoped = true;
        let p = plan(&s, now(), &Policy::default());
        assert!(p.needs_others && p.binds.is_empty() && p.unplaced.is_empty());
        s.others = Some(vec![machine(2, 8, None)]);
        let p = plan(&s, now(), &Policy::default());
        assert!(!p.needs_others);
        let why = "0/2 machines are available: 1 Insufficient gpus (2 of 4 free), 1 not among the run's node_selection names";
        assert_eq!(p.unplaced, [Unplaced { worker: id(1001), reason: why.into() }]);
    }

    #[test]
    fn a_fill_asks_only_what_its_waiting_workers_do_not_lend_it() {
        let mut fill = request(0, vec![]);
        fill.cpu_millis = 2000;
        fill.fill = true;
        fill.selection =
            NodeSelection { mode: SelectionMode::Exact, names: vec![Name::parse("gpu-01").unwrap()] };
        let mut m = machine(1, 8, None);
        m.cpu_free = 500;
        let mut s = snapshot(vec![m], vec![(1, fill)], vec![worker(1, 1)]);
        s.fill_drives.insert(id(501), id(7));
        s.lent.insert((id(101), id(7)), Charge { cpu_millis: 1500, memory_bytes: GB, gpus: 0 });
        let p = plan(&s, now(), &Policy::default());
        // 2000 asked - 1500 lent = 500, which is what the machine has free.
        assert_eq!(p.binds.len(), 1);
        assert_eq!(
            (p.binds[0].charge.cpu_millis, p.binds[0].charge.memory_bytes, p.binds[0].fill),
            (500, 0, true)
        );
    }

    #[test]
    fn a_host_path_no_longer_granted_fails_its_worker() {
        let mut d = drive(1, 0);
        d.scope = None;
        d.host_path = Some("/data/imagenet".into());
        let s = snapshot(vec![machine(1, 8, None)], vec![(1, request(0, vec![d]))], vec![worker(1, 1)]);
        let p = plan(&s, now(), &Policy::default());
        assert_eq!(p.ungranted.len(), 1);
        assert!(
            p.ungranted[0].reason.contains("no longer under a host path granted"),
            "{}",
            p.ungranted[0].reason
        );
        assert!(p.binds.is_empty());
    }

    #[test]
    fn a_run_waiting_for_gpus_has_its_drive_filled_ahead_where_the_fewest_are_missing() {
        let all = Policy { decisions: Decisions::ALL, ..Policy::default() };
        let busy = |n, free| MachineView { gpus_total: 8, ..machine(n, free, Some(1000 * GB)) };
        // Needs 8 GPUs: gpu-01 has 0 free, gpu-02 4, gpu-03 6 but no room for 150 GB.
        let mut full = busy(3, 6);
        full.data_free = Some(100 * GB);
        let s = snapshot(
            vec![busy(1, 0), busy(2, 4), full],
            vec![(1, request(8, vec![drive(1, 150 * GB)]))],
            vec![worker(1, 1)],
        );
        let p = plan(&s, now(), &all);
        assert!(p.binds.is_empty());
        let copy = NewCopy { machine: id(102), drive: id(1), size_hint: 150 * GB, evictable: true };
        assert_eq!(p.staged, [Staged { run: id(501), copy }]);
        // With the copy filling there, nothing more is.
        let mut s = s;
        s.machines[1].copies.insert(id(1), CopyState::Filling);
        assert!(plan(&s, now(), &all).staged.is_empty());
        // Two waiting workers want two machines: gpu-01 now, as gpu-03 has no room; none when
        // the budget is spent.
        s.workers.push(worker(2, 1));
        assert_eq!(
            plan(&s, now(), &all).staged.iter().map(|x| x.copy.machine).collect::<Vec<_>>(),
            [id(101)]
        );
        s.staging = STAGE_BUDGET;
        assert!(plan(&s, now(), &all).staged.is_empty());
    }
}
