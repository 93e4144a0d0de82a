//! The scheduler: places Pending workers on machines. Filters, scores and selection are pure
//! (this folder's other files); this shell reads a snapshot, binds in one transaction, and
//! leaves each unplaced worker a reason.

pub mod evict;
pub mod filter;
pub mod score;
pub mod select;
pub mod snapshot;

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::controllers::fill;
use crate::domain::machine::MachineState;
use crate::domain::run::WorkerState;
use crate::hub::{self, Hub};
use crate::store::{
    self,
    workers::{Bind, Charge, ClaimCursor, PendingRow, PendingRun},
};
use snapshot::{CopyState, CopyView, DriveNeed, MachineView, Request};

/// Workers claimed per transaction. Unless its runs all name their machines, each pass reads
/// every machine and its copies' totals first, so larger batches spread that over more
/// placements.
const BATCH: i64 = 4096;
/// The safety net when no notification arrives.
const RESYNC: Duration = Duration::from_secs(5);

/// Places work and keeps fills going whenever something may have changed, until `stop`.
/// Placing a worker may need a fill, and a fill's worker needs placing: both run in one loop.
pub async fn run(db: PgPool, hub: Arc<Hub>, refill_after: Duration, stop: CancellationToken) {
    loop {
        let mut wait = RESYNC;
        loop {
            let placed = tick(&db).await.unwrap_or_else(|e| {
                tracing::warn!(error = %e, "scheduling pass failed");
                0
            });
            let changed = match fill::tick(&db, refill_after).await {
                Ok((changed, next)) => {
                    wait = next.map_or(wait, |n| n.min(wait));
                    changed
                }
                Err(e) => {
                    tracing::warn!(error = %e, "fill pass failed");
                    0
                }
            };
            if placed == 0 && changed == 0 {
                break;
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = hub.schedule.notified() => {}
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// Places what it can, batch after batch; returns how many workers it bound. Each batch is
/// claimed after the last, so workers that fit nowhere hold up none behind them; those the tick
/// passed are claimed again by the next.
pub async fn tick(db: &PgPool) -> anyhow::Result<usize> {
    let mut bound = 0;
    let mut after = None;
    loop {
        let (placed, claimed, next) = pass(db, after).await?;
        bound += placed;
        // Fills' workers are claimed first whatever the cursor: a batch of them that fit
        // nowhere would come back every pass.
        if claimed < BATCH as usize || (placed == 0 && next == after) {
            return Ok(bound);
        }
        after = next;
    }
}

async fn pass(
    db: &PgPool,
    after: Option<ClaimCursor>,
) -> anyhow::Result<(usize, usize, Option<ClaimCursor>)> {
    let started = std::time::Instant::now();
    let mut tx = db.begin().await?;
    let (pending, runs, next) = store::workers::claim_pending(&mut tx, BATCH, after).await?;
    if pending.is_empty() {
        return Ok((0, 0, next));
    }
    let requests: HashMap<Uuid, Request> = runs.values().map(|r| (r.id, request(r))).collect();
    let scope = scope(requests.values());
    let drives: BTreeSet<Uuid> = requests.values().flat_map(|r| r.placed().map(|d| d.id)).collect();
    let drives: Vec<Uuid> = drives.into_iter().collect();
    let mut machines = load_machines(&mut tx, scope.as_deref(), &drives).await?;
    // The machines not read, should a worker fit none of those that were.
    let mut others: Option<Vec<MachineView>> = None;
    // Copies made whole during the pass are not: the index stays true for the whole pass.
    let index = select::warm_index(&machines);
    // A run's workers ask for the same: their warm machines are ranked once.
    let mut warm: HashMap<Uuid, select::Warm> =
        requests.iter().map(|(id, r)| (*id, select::warm_for(&machines, &index, r))).collect();
    // A fill is pinned to its machine, where the workers waiting for it lend it their share.
    let fills: HashMap<Uuid, (Uuid, Uuid)> = runs
        .values()
        .filter_map(|r| {
            let drive = r.fill_drive_id?;
            let m = machines.iter().find(|m| requests[&r.id].selects(&m.name))?;
            Some((r.id, (m.id, drive)))
        })
        .collect();
    let lent =
        store::workers::waiting_charges(&mut *tx, &fills.values().copied().collect::<Vec<_>>()).await?;
    // Grants are checked again at every placement: one narrowed since a run was made holds
    // for its next worker.
    let mounting_host: Vec<(Uuid, String)> = pending
        .iter()
        .filter_map(|w| requests.get(&w.run_id).map(|r| (w, r)))
        .filter(|(_, r)| r.drives.iter().any(|d| d.host_path.is_some()))
        .map(|(w, r)| (w.workspace_id, r.cluster.clone()))
        .collect();
    let grants = store::grants::of_many(&mut *tx, &mounting_host).await?;
    let mut ungranted: Vec<(&PendingRow, String)> = Vec::new();
    // Decided one by one against the in-memory machines, written together at the end.
    let mut binds: Vec<Bind> = Vec::new();
    // Each copy once, however many of the pass's workers mount it there.
    let mut used: BTreeSet<(Uuid, Uuid)> = BTreeSet::new();
    // The copies the pass's workers mount, whole or not: none of them is evicted for another.
    let mut held: BTreeSet<(Uuid, Uuid)> = BTreeSet::new();
    let mut decided: HashMap<Uuid, (&PendingRow, String, BTreeMap<String, String>)> = HashMap::new();
    // Runs whose workers' reasons change: each says why its first worker waits.
    let mut reasons_changed: Vec<Uuid> = Vec::new();
    for w in &pending {
        // A run deleted since its workers were claimed has none left to place.
        let Some(request) = requests.get(&w.run_id) else {
            continue;
        };
        let granted = grants.get(&(w.workspace_id, request.cluster.clone())).map_or(&[][..], Vec::as_slice);
        if let Some(why) = filter::ungranted(request, granted) {
            ungranted.push((w, why));
            continue;
        }
        let mut request = Cow::Borrowed(request);
        if let Some(lent) = fills.get(&w.run_id).and_then(|pair| lent.get(pair)) {
            let r = request.to_mut();
            r.cpu_millis = (r.cpu_millis - lent.cpu_millis).max(0);
            r.memory_bytes = (r.memory_bytes - lent.memory_bytes).max(0);
            r.gpus = (r.gpus - lent.gpus).max(0);
        }
        // A fill's worker asks for less than its run: its machines are ranked for what it asks.
        let mut lent_warm;
        let warm = match &request {
            Cow::Borrowed(_) => warm.entry(w.run_id).or_default(),
            Cow::Owned(r) => {
                lent_warm = select::warm_for(&machines, &index, r);
                &mut lent_warm
            }
        };
        let choice = match select::select(&machines, &request, warm) {
            Ok(c) => c,
            Err(why) => {
                let why = match scope {
                    None => why,
                    Some(_) => match why_none(&mut tx, &machines, &mut others, &request).await? {
                        Some(why) => why,
                        // One has joined since the pass read its machines: the next pass sees it.
                        None => continue,
                    },
                };
                if w.reason != why {
                    store::workers::set_pending_reason(&mut *tx, w.id, &why).await?;
                    event(&mut tx, w, true, "FailedScheduling", &why).await?;
                    reasons_changed.push(w.run_id);
                }
                continue;
            }
        };
        let i = choice.index;
        let transports = transports(&request.drives, &machines[i], &machines);
        let explained = match choice.runner_up {
            Some((r, s)) => {
                format!(
                    "placed on {} ({}); runner-up {} ({s})",
                    machines[i].name, choice.score, machines[r].name
                )
            }
            None => format!("placed on {} ({}); no other machine fits", machines[i].name, choice.score),
        };
        let m = &mut machines[i];
        let lacking: Vec<&DriveNeed> =
            request.placed().filter(|d| m.copy_state(d.id) != Some(CopyState::Complete)).collect();
        let (released, reason) = match lacking.first() {
            None => (true, format!("Starting on {}", m.name)),
            Some(d) => (false, format!("Waiting for drive {} to be filled on {}", d.full, m.name)),
        };
        let charge =
            Charge { cpu_millis: request.cpu_millis, memory_bytes: request.memory_bytes, gpus: request.gpus };
        // Copies before the machine rows: every transaction locks copies, then workers, then
        // machines, so none waits on another in a circle. Should the bind lose a race with
        // another replica, the fill controller drops the copies nobody waits for.
        held.extend(request.placed().map(|d| (m.id, d.id)));
        make_room(&mut tx, m, &lacking, &held).await?;
        if released {
            used.extend(request.placed().map(|d| (m.id, d.id)));
        }
        m.take(charge.cpu_millis, charge.memory_bytes, charge.gpus);
        binds.push(Bind { worker: w.id, machine: m.id, charge, released, reason, fill: request.fill });
        decided.insert(w.id, (w, explained, transports));
    }
    let (used_machines, used_drives): (Vec<Uuid>, Vec<Uuid>) = used.into_iter().unzip();
    store::copies::touch_used_pairs(&mut *tx, &used_machines, &used_drives).await?;
    let bound = store::workers::bind_all(&mut tx, &binds).await?;
    let mut events = Vec::with_capacity(bound.len());
    for id in &bound {
        let (w, explained, transports) = &decided[id];
        events.push(store::events::New {
            workspace: Some(w.workspace_id),
            object_kind: "worker",
            object_name: &w.name,
            warning: false,
            reason: "Scheduled",
            message: explained,
            source: "scheduler",
        });
        let waited = (chrono::Utc::now() - w.created_at).to_std().unwrap_or_default();
        metrics::histogram!("astraeus_placement_latency_seconds").record(waited.as_secs_f64());
        if !transports.is_empty() {
            store::workers::set_transports(&mut *tx, w.id, transports).await?;
        }
    }
    store::events::record_all(&mut *tx, &events).await?;
    // The machines' agents were woken by the bind itself (the `machines_woken` trigger, see store::rules).
    tx.commit().await?;
    for (w, why) in ungranted {
        fail_ungranted(db, w, &why).await?;
    }
    reasons_changed.extend(bound.iter().map(|id| decided[id].0.run_id));
    store::workers::refresh_runs(db, &mut reasons_changed).await?;
    let placed = bound.len();
    metrics::counter!("astraeus_placements_total").increment(placed as u64);
    metrics::histogram!("astraeus_scheduler_pass_seconds").record(started.elapsed().as_secs_f64());
    Ok((placed, pending.len(), next))
}

/// Fails a Pending worker whose host path is no longer granted, in a transaction of its own:
/// runs, then workers, the order every transaction locks in.
async fn fail_ungranted(db: &PgPool, w: &PendingRow, why: &str) -> anyhow::Result<()> {
    let mut tx = db.begin().await?;
    let Some(run) = store::workers::lock_run_of(&mut tx, w.id).await? else { return Ok(()) };
    let failed = store::workers::finish(&mut tx, w.id, None, WorkerState::Failed, why, None).await?;
    if failed.is_some() {
        store::workers::refresh_run(&mut tx, run).await?;
        event(&mut tx, w, true, "HostPathNotGranted", why).await?;
        hub::worker_changed(&mut *tx, w.id).await?;
    }
    tx.commit().await?;
    Ok(())
}

/// What each worker of the run asks for.
fn request(run: &PendingRun) -> Request {
    let task = &run.spec.0.task_template;
    Request {
        cluster: run.spec.0.cluster.to_string(),
        cpu_millis: task.requested_resources.cpu_cores.millis().into(),
        memory_bytes: task.requested_resources.memory_bytes as i64,
        gpus: task.requested_resources.gpus.into(),
        selection: task.requested_resources.node_selection.clone(),
        drives: run.drives.0.clone(),
        fill: run.fill_drive_id.is_some(),
    }
}

async fn event(
    tx: &mut sqlx::PgConnection,
    w: &PendingRow,
    warning: bool,
    reason: &str,
    message: &str,
) -> sqlx::Result<()> {
    let e = store::events::New {
        workspace: Some(w.workspace_id),
        object_kind: "worker",
        object_name: &w.name,
        warning,
        reason,
        message,
        source: "scheduler",
    };
    store::events::record(&mut *tx, &e).await
}

/// Creates the copies a bound worker lacks, evicting unused copies first when room is short;
/// `held` are the (machine, drive) pairs the pass's workers mount. Their fills are started by
/// the fill controller.
async fn make_room(
    tx: &mut sqlx::PgConnection,
    m: &mut MachineView,
    lacking: &[&DriveNeed],
    held: &BTreeSet<(Uuid, Uuid)>,
) -> anyhow::Result<()> {
    let missing: Vec<&&DriveNeed> = lacking.iter().filter(|d| m.copy_state(d.id).is_none()).collect();
    for d in missing {
        let free = m.data_free.unwrap_or(0);
        if free < d.size_hint {
            evict_for(tx, m, d, d.size_hint - free, held).await?;
        }
        store::copies::ensure(&mut *tx, d.id, m.id, d.size_hint, d.evictable).await?;
        m.data_free = Some(m.data_free.unwrap_or(0) - d.size_hint);
        m.copies.insert(d.id, CopyState::Filling);
    }
    Ok(())
}

/// Evicts copies on `m` to free `need` bytes for `d`. The machine's copies are read only now:
/// most passes evict nothing, and every copy of every machine is 100,000 rows at 10,000
/// machines.
async fn evict_for(
    tx: &mut sqlx::PgConnection,
    m: &mut MachineView,
    d: &DriveNeed,
    need: i64,
    held: &BTreeSet<(Uuid, Uuid)>,
) -> anyhow::Result<()> {
    let copies: HashMap<Uuid, CopyView> = store::copies::on_machine_for_eviction(&mut *tx, m.id)
        .await?
        .into_iter()
        // Postgres does not know yet of the pass's own binds.
        .map(|c| (c.drive_id, evict::view(&c, held.contains(&(m.id, c.drive_id)))))
        .collect();
    let gone = evict::plan(&copies, need);
    if gone.is_empty() {
        return Ok(());
    }
    tracing::info!(machine = %m.name, copies = gone.len(), drive = %d.full, "evicting copies to make room");
    store::copies::evict(&mut *tx, m.id, &gone).await?;
    metrics::counter!("astraeus_copies_evicted_total").increment(gone.len() as u64);
    let why = format!("copy on {} evicted to make room for drive {}", m.name, d.full);
    for id in &gone {
        store::events::record_for_drive(&mut *tx, *id, false, "Evicted", &why, "scheduler").await?;
    }
    for id in gone {
        let bytes = copies[&id].bytes;
        m.copies.insert(id, CopyState::Evicting);
        m.data_free = Some(m.data_free.unwrap_or(0) + bytes);
        m.reclaimable -= bytes;
    }
    Ok(())
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

/// The machines a pass reads when every run names its machines (a fill, a run pinned to one
/// machine): those, and the machines their drives are kept on, for [`transports`]. `None` when
/// any may go anywhere.
fn scope<'a>(requests: impl IntoIterator<Item = &'a Request>) -> Option<Vec<&'a str>> {
    let names = requests.into_iter().try_fold(BTreeSet::new(), |mut names, r| {
        names.extend(r.named()?);
        names.extend(r.drives.iter().filter_map(|d| d.node.as_deref()));
        Some(names)
    })?;
    Some(names.into_iter().collect())
}

/// Machines with their free resources, data-location room and copies of `drives`, in the
/// scheduler's order: every one, or only those `scope` names. Every other machine would be
/// turned down by name before its copies were looked at.
async fn load_machines(
    tx: &mut sqlx::PgConnection,
    scope: Option<&[&str]>,
    drives: &[Uuid],
) -> anyhow::Result<Vec<MachineView>> {
    let read = store::machines::for_placement(&mut *tx, scope).await?;
    let only: Option<Vec<Uuid>> = scope.map(|_| read.iter().map(|m| m.id).collect());
    let totals = store::copies::totals_for_placement(&mut *tx, only.as_deref()).await?;
    let mut copies: HashMap<Uuid, HashMap<Uuid, CopyState>> = HashMap::new();
    if !drives.is_empty() {
        for (drive, machine, state) in
            store::copies::states_for_placement(&mut *tx, drives, only.as_deref()).await?
        {
            copies.entry(machine).or_default().insert(drive, state);
        }
    }
    let mut machines = views(read, totals, copies);
    machines.sort_unstable_by(snapshot::placement_order);
    Ok(machines)
}

/// Why `r` fits no machine, when the pass read only the machines its runs name (`read`, in the
/// scheduler's order): the reason counts every machine turned down, so the others are read
/// too, once a pass, without their copies, and kept in the same order. `None` when one of them
/// fits after all.
async fn why_none(
    tx: &mut sqlx::PgConnection,
    read: &[MachineView],
    others: &mut Option<Vec<MachineView>>,
    r: &Request,
) -> anyhow::Result<Option<String>> {
    if others.is_none() {
        let known: BTreeSet<Uuid> = read.iter().map(|m| m.id).collect();
        let mut rest = store::machines::for_placement(&mut *tx, None).await?;
        rest.retain(|m| !known.contains(&m.id));
        // Each is turned down by name before its copies or room are weighed.
        let mut rest = views(rest, Vec::new(), HashMap::new());
        rest.sort_unstable_by(snapshot::placement_order);
        *others = Some(rest);
    }
    Ok(select::why_none(read, others.as_deref().unwrap_or_default(), r))
}

fn views(
    machines: Vec<store::machines::PlacementMachine>,
    totals: Vec<store::copies::PlacementTotals>,
    mut copies: HashMap<Uuid, HashMap<Uuid, CopyState>>,
) -> Vec<MachineView> {
    let mut totals: HashMap<Uuid, store::copies::PlacementTotals> =
        totals.into_iter().map(|t| (t.machine_id, t)).collect();
    machines
        .into_iter()
        .map(|m| {
            let (bytes, promised, reclaimable) =
                totals.remove(&m.id).map_or((0, 0, 0), |t| (t.bytes, t.promised, t.reclaimable));
            let data_free = m
                .confirmed
                .then(|| snapshot::data_free(m.data_free_bytes, m.data_limit_bytes, bytes, promised));
            MachineView {
                id: m.id,
                name: m.name,
                cluster: m.cluster,
                ready: m.state == MachineState::Ready,
                cordoned: m.cordoned,
                transports: m.transports,
                cpu_total: m.cpu_millis.into(),
                memory_total: m.memory_bytes,
                cpu_free: i64::from(m.cpu_millis - m.cpu_alloc),
                memory_free: m.memory_bytes - m.memory_alloc,
                gpus_free: i64::from(m.gpus - m.gpus_alloc),
                data_free,
                reclaimable,
                copies: copies.remove(&m.id).unwrap_or_default(),
            }
        })
        .collect()
}
