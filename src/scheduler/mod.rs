//! The scheduler: places Pending workers on machines. The decisions are a pure function,
//! [`plan::plan`], of a snapshot (this folder's other files); this shell reads the snapshot,
//! applies the plan in one transaction, and leaves each unplaced worker a reason.

pub mod evict;
pub mod filter;
pub mod plan;
pub mod policy;
pub mod score;
pub mod select;
pub mod snapshot;

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::controllers::fill;
use crate::domain::image::ImageRef;
use crate::domain::machine::MachineState;
use crate::domain::run::WorkerState;
use crate::hub::{self, Hub};
use crate::store::{
    self,
    workers::{ClaimCursor, PendingRow, PendingRun},
};
use plan::{Plan, Snapshot};
use policy::Policy;
use snapshot::{ByDrive, CopyState, CopyView, MachineView, Request};

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
    let mut snapshot = read(&mut tx, pending, runs).await?;
    let now = chrono::Utc::now();
    let mut plan = plan::plan(&snapshot, now, &Policy::PRODUCT);
    if plan.needs_others {
        snapshot.others = Some(others(&mut tx, &snapshot.machines).await?);
        plan = plan::plan(&snapshot, now, &Policy::PRODUCT);
    }
    let claimed = snapshot.workers.len();
    let placed = apply(db, tx, &snapshot, plan).await?;
    metrics::counter!("astraeus_placements_total").increment(placed as u64);
    metrics::histogram!("astraeus_scheduler_pass_seconds").record(started.elapsed().as_secs_f64());
    Ok((placed, claimed, next))
}

/// Reads what the pass decides over, for its claimed workers.
async fn read(
    tx: &mut sqlx::PgConnection,
    workers: Vec<PendingRow>,
    runs: HashMap<Uuid, PendingRun>,
) -> anyhow::Result<Snapshot> {
    let requests: HashMap<Uuid, Request> = runs.values().map(|r| (r.id, request(r))).collect();
    let fill_drives: HashMap<Uuid, Uuid> =
        runs.values().filter_map(|r| Some((r.id, r.fill_drive_id?))).collect();
    let scope = scope(requests.values());
    let drives: BTreeSet<Uuid> = requests.values().flat_map(|r| r.placed().map(|d| d.id)).collect();
    let drives: Vec<Uuid> = drives.into_iter().collect();
    let images: BTreeSet<String> = requests.values().filter_map(|r| r.image.clone()).collect();
    let images: Vec<String> = images.into_iter().collect();
    let machines = load_machines(&mut *tx, scope.as_deref(), &drives, &images).await?;
    let scoped = scope.is_some();
    // The (machine, drive) of each fill, as the planner pins it.
    let fills: Vec<(Uuid, Uuid)> = fill_drives
        .iter()
        .filter_map(|(run, drive)| {
            let m = machines.iter().find(|m| requests[run].selects(&m.name))?;
            Some((m.id, *drive))
        })
        .collect();
    let lent = store::workers::waiting_charges(&mut *tx, &fills).await?;
    // Grants are checked again at every placement: one narrowed since a run was made holds
    // for its next worker.
    let mounting_host: Vec<(Uuid, String)> = workers
        .iter()
        .filter_map(|w| requests.get(&w.run_id).map(|r| (w, r)))
        .filter(|(_, r)| r.drives.iter().any(|d| d.host_path.is_some()))
        .map(|(w, r)| (w.workspace_id, r.cluster.clone()))
        .collect();
    let grants = store::grants::of_many(&mut *tx, &mounting_host).await?;
    // Most passes evict nothing: only the machines that might are read, copy by copy.
    let short = plan::may_evict(&machines, &requests);
    let mut evictable: HashMap<Uuid, HashMap<Uuid, CopyView>> = HashMap::new();
    for c in store::copies::on_machines_for_eviction(&mut *tx, &short).await? {
        evictable.entry(c.machine_id).or_default().insert(c.drive_id, evict::view(&c, false));
    }
    // Only a pass over every machine fills ahead (see plan::stage_in).
    let staging = match Policy::PRODUCT.decisions.stage_in && !scoped {
        true => store::copies::staging(&mut *tx).await? as usize,
        false => 0,
    };
    let queued = match evictable.is_empty() {
        true => BTreeSet::new(),
        false => store::copies::queued_drives(&mut *tx).await?.into_iter().collect(),
    };
    Ok(Snapshot {
        workers,
        requests,
        fill_drives,
        machines,
        others: None,
        scoped,
        lent,
        grants,
        evictable,
        queued,
        staging,
    })
}

/// Writes what the pass decided, and commits: binds refused by a machine (another replica took
/// its room) leave their workers Pending for the next pass.
async fn apply(
    db: &PgPool,
    mut tx: sqlx::Transaction<'_, sqlx::Postgres>,
    s: &Snapshot,
    plan: Plan,
) -> anyhow::Result<usize> {
    let worker: HashMap<Uuid, &PendingRow> = s.workers.iter().map(|w| (w.id, w)).collect();
    let mut reasons_changed: Vec<Uuid> = Vec::new();
    for u in &plan.unplaced {
        let w = worker[&u.worker];
        store::workers::set_pending_reason(&mut *tx, w.id, &u.reason).await?;
        event(&mut tx, w, true, "FailedScheduling", &u.reason).await?;
        reasons_changed.push(w.run_id);
    }
    // Copies before the machine rows: every transaction locks copies, then workers, then
    // machines, so none waits on another in a circle. Should the bind lose a race with
    // another replica, the fill controller drops the copies nobody waits for.
    for e in &plan.evictions {
        let m = s.machines.iter().find(|m| m.id == e.machine).map_or("", |m| m.name.as_str());
        tracing::info!(machine = %m, copies = e.drives.len(), "evicting copies to make room");
        store::copies::evict(&mut *tx, e.machine, &e.drives).await?;
        metrics::counter!("astraeus_copies_evicted_total").increment(e.drives.len() as u64);
        for id in &e.drives {
            store::events::record_for_drive(&mut *tx, *id, false, "Evicted", &e.why, "scheduler").await?;
        }
        let on_machine = store::events::New {
            workspace: None,
            object_kind: "machine",
            object_name: m,
            warning: false,
            reason: "Evicted",
            message: &format!("{} copies evicted to make room", e.drives.len()),
            source: "scheduler",
        };
        store::events::record(&mut *tx, &on_machine).await?;
    }
    for c in &plan.copies {
        store::copies::ensure(&mut *tx, c.drive, c.machine, c.size_hint, c.evictable, None).await?;
    }
    for st in &plan.staged {
        let c = &st.copy;
        store::copies::ensure(&mut *tx, c.drive, c.machine, c.size_hint, c.evictable, Some(st.run)).await?;
        let m = s.machines.iter().find(|m| m.id == c.machine).map_or("", |m| m.name.as_str());
        let why = format!("copy on {m} filled ahead for a queued run that waits for resources");
        store::events::record_for_drive(&mut *tx, c.drive, false, "StagedIn", &why, "scheduler").await?;
    }
    let (used_machines, used_drives): (Vec<Uuid>, Vec<Uuid>) = plan.used.iter().copied().unzip();
    store::copies::touch_used_pairs(&mut *tx, &used_machines, &used_drives).await?;
    let bound = store::workers::bind_all(&mut tx, &plan.binds).await?;
    let mut events = Vec::with_capacity(bound.len());
    for id in &bound {
        let (w, placed) = (worker[id], &plan.placed[id]);
        events.push(store::events::New {
            workspace: Some(w.workspace_id),
            object_kind: "worker",
            object_name: &w.name,
            warning: false,
            reason: "Scheduled",
            message: &placed.explained,
            source: "scheduler",
        });
        let waited = (chrono::Utc::now() - w.created_at).to_std().unwrap_or_default();
        metrics::histogram!("astraeus_placement_latency_seconds").record(waited.as_secs_f64());
        if !placed.transports.is_empty() {
            store::workers::set_transports(&mut *tx, w.id, &placed.transports).await?;
        }
    }
    store::events::record_all(&mut *tx, &events).await?;
    // The machines' agents were woken by the bind itself (the `machines_woken` trigger, see store::rules).
    tx.commit().await?;
    for u in &plan.ungranted {
        fail_ungranted(db, worker[&u.worker], &u.reason).await?;
    }
    reasons_changed.extend(bound.iter().map(|id| worker[id].run_id));
    store::workers::refresh_runs(db, &mut reasons_changed).await?;
    Ok(bound.len())
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
        image: ImageRef::parse(&task.image).ok().filter(|i| !i.is_floating()).map(|i| i.to_string()),
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
    images: &[String],
) -> anyhow::Result<Vec<MachineView>> {
    let read = store::machines::for_placement(&mut *tx, scope).await?;
    let only: Option<Vec<Uuid>> = scope.map(|_| read.iter().map(|m| m.id).collect());
    let totals = store::copies::totals_for_placement(&mut *tx, only.as_deref()).await?;
    let mut copies: HashMap<Uuid, Copies> = HashMap::new();
    if !drives.is_empty() {
        for (drive, machine, state, bytes) in
            store::copies::states_for_placement(&mut *tx, drives, only.as_deref()).await?
        {
            let here = copies.entry(machine).or_default();
            here.states.insert(drive, state);
            if state == CopyState::Filling {
                here.filled.insert(drive, bytes);
            }
        }
    }
    let mut machines = views(read, totals, copies);
    if !images.is_empty() {
        let mut held: HashMap<Uuid, Vec<String>> = HashMap::new();
        for (machine, image) in store::machines::holding_images(&mut *tx, images).await? {
            held.entry(machine).or_default().push(image);
        }
        for m in &mut machines {
            m.images = held.remove(&m.id).unwrap_or_default();
        }
    }
    machines.sort_unstable_by(snapshot::placement_order);
    Ok(machines)
}

/// The machines a scoped pass did not read, without their copies (each is turned down by name
/// before its copies or room are weighed), in the scheduler's order: a worker that fits none of
/// those read gives a reason that counts every machine.
async fn others(tx: &mut sqlx::PgConnection, read: &[MachineView]) -> anyhow::Result<Vec<MachineView>> {
    let known: BTreeSet<Uuid> = read.iter().map(|m| m.id).collect();
    let mut rest = store::machines::for_placement(&mut *tx, None).await?;
    rest.retain(|m| !known.contains(&m.id));
    let mut rest = views(rest, Vec::new(), HashMap::new());
    rest.sort_unstable_by(snapshot::placement_order);
    Ok(rest)
}

/// A machine's copies of the pass's drives: their states, and the bytes written of those being
/// filled.
#[derive(Default)]
struct Copies {
    states: ByDrive<CopyState>,
    filled: ByDrive<i64>,
}

fn views(
    machines: Vec<store::machines::PlacementMachine>,
    totals: Vec<store::copies::PlacementTotals>,
    mut copies: HashMap<Uuid, Copies>,
) -> Vec<MachineView> {
    let mut totals: HashMap<Uuid, store::copies::PlacementTotals> =
        totals.into_iter().map(|t| (t.machine_id, t)).collect();
    machines
        .into_iter()
        .map(|m| {
            let (bytes, promised, reclaimable, held, fill_rate) = totals
                .remove(&m.id)
                .map_or((0, 0, 0, 0, None), |t| (t.bytes, t.promised, t.reclaimable, t.held, t.fill_rate));
            let here = copies.remove(&m.id).unwrap_or_default();
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
                gpus_total: m.gpus.into(),
                cpu_free: i64::from(m.cpu_millis - m.cpu_alloc),
                memory_free: m.memory_bytes - m.memory_alloc,
                gpus_free: i64::from(m.gpus - m.gpus_alloc),
                data_free,
                reclaimable,
                held,
                freed: 0,
                images: Vec::new(),
                copies: here.states,
                filled: here.filled,
                fill_rate,
            }
        })
        .collect()
}
