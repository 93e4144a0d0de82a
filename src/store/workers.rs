//! The `workers` table: one row per `<run>-<index>`.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use sqlx::types::Json;
use sqlx::{PgConnection, PgExecutor};
use uuid::Uuid;

use crate::domain::run::{RunSpec, WorkerState, WorkerSummary, summarize};

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct WorkerRecord {
    pub id: Uuid,
    pub run_id: Uuid,
    pub run_name: String,
    pub name: String,
    pub index: i32,
    pub state: WorkerState,
    pub reason: String,
    pub machine: Option<String>,
    pub exit_code: Option<i32>,
    pub transports: Json<std::collections::BTreeMap<String, String>>,
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    pub log_bytes: i64,
    /// Lines not kept: the earliest past the bound in lines, and those past a bound in bytes.
    pub log_dropped: i64,
    /// Times `restart_policy: OnFailure` started it again.
    pub restarts: i32,
}

const SELECT: &str = "SELECT w.id, w.run_id, r.name AS run_name, w.name, w.index, w.state, w.reason,
        mc.name AS machine, w.exit_code, w.transports, w.created_at, w.started_at, w.finished_at,
        w.log_bytes, w.log_dropped + w.log_refused AS log_dropped, w.restarts
    FROM workers w JOIN runs r ON r.id = w.run_id LEFT JOIN machines mc ON mc.id = w.machine_id";

/// A page of the run's workers in index order, from just after index `after`, read along
/// `workers_run_index_key`.
pub async fn page_of_run(
    db: impl PgExecutor<'_>,
    run: Uuid,
    after: Option<i32>,
    limit: i64,
) -> sqlx::Result<Vec<WorkerRecord>> {
    sqlx::query_as(&format!("{SELECT} WHERE w.run_id = $1 AND w.index > $2 ORDER BY w.index LIMIT $3"))
        .bind(run)
        .bind(after.unwrap_or(-1))
        .bind(limit)
        .fetch_all(db)
        .await
}

/// A page of the workspace's workers on the machine that have not ended: by run (newest
/// first), then index, from just after `after`. A machine holds as many as fit its
/// resources, found through `workers_machine_idx`, so the sort is of a few hundred rows.
pub async fn page_on_machine(
    db: impl PgExecutor<'_>,
    machine: Uuid,
    workspace: Uuid,
    after: Option<UserPosition>,
    limit: i64,
) -> sqlx::Result<Vec<WorkerRecord>> {
    let after_sql = match after {
        Some(_) => "AND (w.run_id < $4 OR (w.run_id = $4 AND w.index > $5))",
        None => "",
    };
    let sql = format!(
        "{SELECT} WHERE w.machine_id = $1 AND w.workspace_id = $2 AND w.state NOT IN ('Completed', 'Failed')
         {after_sql} ORDER BY w.run_id DESC, w.index LIMIT $3"
    );
    let query = sqlx::query_as(&sql).bind(machine).bind(workspace).bind(limit);
    match after {
        Some(p) => query.bind(p.run_id).bind(p.index),
        None => query,
    }
    .fetch_all(db)
    .await
}

pub async fn get(db: impl PgExecutor<'_>, workspace: Uuid, name: &str) -> sqlx::Result<Option<WorkerRecord>> {
    sqlx::query_as(&format!("{SELECT} WHERE w.workspace_id = $1 AND w.name = $2"))
        .bind(workspace)
        .bind(name)
        .fetch_optional(db)
        .await
}

/// A worker that mounts a drive, as the drive lists it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct DriveUser {
    pub id: Uuid,
    pub name: String,
    pub run_name: String,
    pub state: WorkerState,
    pub machine: Option<String>,
}

/// Where a worker stands in its drives' lists of users: its run, then its index.
#[derive(Debug, Clone, Copy, sqlx::FromRow)]
pub struct UserPosition {
    pub run_id: Uuid,
    pub index: i32,
}

pub async fn position(db: impl PgExecutor<'_>, worker: Uuid) -> sqlx::Result<Option<UserPosition>> {
    sqlx::query_as("SELECT run_id, index FROM workers WHERE id = $1").bind(worker).fetch_optional(db).await
}

/// A page of the workers that mount the drive and have not ended: by run (newest first), then
/// by index, from just after `after`.
///
/// Every lookup is by key, mount by mount (`OFFSET 0` keeps each subquery from being
/// flattened into a join), so the cost follows the page, not the drive's history nor what the
/// statistics say of fast-changing tables: as joins, the planner walked every worker (236 ms a
/// call for 1,000 users among 200,000 workers) or every run and machine (12 ms for 210 users
/// among 6,500 workers). The mounts of runs not completed come newest first from
/// `run_mounts_drive_live_idx` (the `runs_completed` trigger marks a completed run's mounts; see
/// `store::rules`), and each run's live workers from `workers_live_run_idx`, so the sort orders
/// one run's workers at a time and the walk stops at `limit`. Walking every mount and skipping
/// the completed runs cost 10.8 ms a call for a drive with 1,000 seed runs behind a dozen live
/// ones.
pub async fn using_drive(
    db: impl PgExecutor<'_>,
    drive: Uuid,
    after: Option<UserPosition>,
    limit: i64,
) -> sqlx::Result<Vec<DriveUser>> {
    let (mounts_from, workers_after) = match after {
        Some(_) => ("AND m.run_id <= $3", "AND (run_id < $3 OR index > $4)"),
        None => ("", ""),
    };
    let sql = format!(
        "SELECT w.id, w.name, r.name AS run_name, w.state,
             (SELECT name FROM machines WHERE id = w.machine_id) AS machine
         FROM run_mounts m
         CROSS JOIN LATERAL (SELECT name FROM runs WHERE id = m.run_id OFFSET 0) r
         CROSS JOIN LATERAL (SELECT id, name, state, machine_id, index FROM workers
                             WHERE run_id = m.run_id AND state NOT IN ('Completed', 'Failed')
                               {workers_after} OFFSET 0) w
         WHERE m.drive_id = $1 AND NOT m.run_completed {mounts_from} ORDER BY m.run_id DESC, w.index LIMIT $2"
    );
    let query = sqlx::query_as(&sql).bind(drive).bind(limit);
    match after {
        Some(p) => query.bind(p.run_id).bind(p.index),
        None => query,
    }
    .fetch_all(db)
    .await
}

/// What binding a worker to a machine takes there.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Charge {
    pub cpu_millis: i64,
    pub memory_bytes: i64,
    pub gpus: i64,
}

/// One worker's placement, applied with the rest of its scheduling pass by [`bind_all`].
#[derive(Debug, Clone)]
pub struct Bind {
    pub worker: Uuid,
    pub machine: Uuid,
    pub charge: Charge,
    pub released: bool,
    pub reason: String,
    /// A fill's worker, which a cordoned machine still takes: it serves workers already there.
    pub fill: bool,
}

/// Places a pass's Pending workers at once; returns those bound. Each machine takes the sum of
/// its workers' charges in one conditional UPDATE, refused when it lacks room, is not Ready or
/// is cordoned (fills aside), so it is never over-committed nor given work after a cordon; the workers of a machine that refused stay Pending. Machines
/// are locked in id order, so two passes never wait on each other in a circle. The same UPDATE
/// bumps each taking machine's assignment version and wakes its agent's long-poll on commit
/// (the `machines_woken` trigger, see `store::rules`), rather than a second UPDATE of the same
/// rows.
pub async fn bind_all(tx: &mut PgConnection, binds: &[Bind]) -> sqlx::Result<Vec<Uuid>> {
    if binds.is_empty() {
        return Ok(vec![]);
    }
    let all: Vec<&Bind> = binds.iter().collect();
    let taken: Vec<Uuid> = sqlx::query_scalar(
        "WITH t AS (SELECT machine, sum(cpu) AS cpu, sum(mem) AS mem, sum(gpu) AS gpu, bool_and(fill) AS fills
                    FROM unnest($1::uuid[], $2::bigint[], $3::bigint[], $4::bigint[], $5::bool[])
                        AS t(machine, cpu, mem, gpu, fill)
                    GROUP BY machine),
              locked AS (SELECT m.id FROM machines m JOIN t ON t.machine = m.id ORDER BY m.id FOR NO KEY UPDATE OF m),
              taken AS (
                 UPDATE machines m SET cpu_alloc = m.cpu_alloc + t.cpu, memory_alloc = m.memory_alloc + t.mem,
                     gpus_alloc = m.gpus_alloc + t.gpu, assign_version = m.assign_version + 1
                 FROM t, (SELECT count(*) FROM locked) AS l
                 WHERE m.id = t.machine AND m.state = 'Ready' AND (NOT m.cordoned OR t.fills)
                   AND m.cpu_alloc + t.cpu <= m.cpu_millis
                   AND m.memory_alloc + t.mem <= m.memory_bytes AND m.gpus_alloc + t.gpu <= m.gpus
                 RETURNING m.id)
         SELECT id FROM taken",
    )
    .bind(column(&all, |b| b.machine))
    .bind(column(&all, |b| b.charge.cpu_millis))
    .bind(column(&all, |b| b.charge.memory_bytes))
    .bind(column(&all, |b| b.charge.gpus))
    .bind(column(&all, |b| b.fill))
    .fetch_all(&mut *tx)
    .await?;
    // Only the workers of machines that took their charges; filtered here, not by
    // `machine = ANY(taken)` in the statement, where a generic plan re-evaluated it for every
    // Pending worker it joined: seconds of CPU with machine rows locked, at 3,000 machines.
    let taken: std::collections::HashSet<Uuid> = taken.into_iter().collect();
    let kept: Vec<&Bind> = binds.iter().filter(|b| taken.contains(&b.machine)).collect();
    if kept.is_empty() {
        return Ok(vec![]);
    }
    // The workers were claimed (locked) by this pass, so each is still Pending.
    sqlx::query_scalar(
        "UPDATE workers w SET machine_id = t.machine, state = 'Preparing', reason = t.reason,
             released = t.released, cpu_charged = t.cpu, memory_charged = t.mem, gpus_charged = t.gpus
         FROM unnest($1::uuid[], $2::uuid[], $3::bigint[], $4::bigint[], $5::bigint[], $6::bool[], $7::text[])
             AS t(id, machine, cpu, mem, gpus, released, reason)
         WHERE w.id = t.id AND w.state = 'Pending'
         RETURNING w.id",
    )
    .bind(column(&kept, |b| b.worker))
    .bind(column(&kept, |b| b.machine))
    .bind(column(&kept, |b| b.charge.cpu_millis))
    .bind(column(&kept, |b| b.charge.memory_bytes))
    .bind(column(&kept, |b| b.charge.gpus))
    .bind(column(&kept, |b| b.released))
    .bind(column(&kept, |b| b.reason.as_str()))
    .fetch_all(&mut *tx)
    .await
}

/// One field of every bind, as an array parameter.
fn column<'a, T>(binds: &[&'a Bind], field: impl Fn(&'a Bind) -> T) -> Vec<T> {
    binds.iter().map(|b| field(b)).collect()
}

/// Sets the reason of a worker that is still Pending (why it is not placed yet).
pub async fn set_pending_reason(db: impl PgExecutor<'_>, worker: Uuid, reason: &str) -> sqlx::Result<()> {
    sqlx::query("UPDATE workers SET reason = $2 WHERE id = $1 AND state = 'Pending' AND reason <> $2")
        .bind(worker)
        .bind(reason)
        .execute(db)
        .await
        .map(drop)
}

/// A worker its agent started.
#[derive(Debug, sqlx::FromRow)]
pub struct Started {
    pub run: Uuid,
    /// Its run fills a copy from a peer: the copy becomes a source as its pull runs.
    pub peer_fill: bool,
}

/// The agent started the worker. None when it is not a Preparing worker of that machine.
pub async fn start(tx: &mut PgConnection, worker: Uuid, machine: Uuid) -> sqlx::Result<Option<Started>> {
    sqlx::query_as(
        "UPDATE workers w SET state = 'Running', reason = '', started_at = now() FROM runs r
         WHERE w.id = $1 AND w.machine_id = $2 AND w.state = 'Preparing' AND w.released AND r.id = w.run_id
         RETURNING w.run_id AS run, r.fill_peer_manifest IS NOT NULL AS peer_fill",
    )
    .bind(worker)
    .bind(machine)
    .fetch_optional(&mut *tx)
    .await
}

/// Says why a worker its machine holds has not started yet (its image is being pulled).
pub async fn preparing(
    tx: &mut PgConnection,
    worker: Uuid,
    machine: Uuid,
    reason: &str,
) -> sqlx::Result<Option<Uuid>> {
    sqlx::query_scalar(
        "UPDATE workers SET reason = $3
         WHERE id = $1 AND machine_id = $2 AND state = 'Preparing' AND released RETURNING run_id",
    )
    .bind(worker)
    .bind(machine)
    .bind(reason)
    .fetch_optional(&mut *tx)
    .await
}

/// Ends a worker (Completed or Failed) and gives its machine's resources back, once.
/// `machine` restricts the change to workers on that machine (an agent's report). Returns the run.
pub async fn finish(
    tx: &mut PgConnection,
    worker: Uuid,
    machine: Option<Uuid>,
    state: WorkerState,
    reason: &str,
    exit_code: Option<i32>,
) -> sqlx::Result<Option<Uuid>> {
    sqlx::query_scalar(
        "WITH w AS (
             UPDATE workers SET state = $3, reason = $4, exit_code = $5, finished_at = now(), restart_at = NULL
             WHERE id = $1 AND ($2::uuid IS NULL OR machine_id = $2) AND state NOT IN ('Completed', 'Failed')
             RETURNING run_id, machine_id, cpu_charged, memory_charged, gpus_charged),
         m AS (
             UPDATE machines SET cpu_alloc = cpu_alloc - w.cpu_charged,
                 memory_alloc = memory_alloc - w.memory_charged, gpus_alloc = gpus_alloc - w.gpus_charged
             FROM w WHERE machines.id = w.machine_id)
         SELECT run_id FROM w",
    )
    .bind(worker)
    .bind(machine)
    .bind(state)
    .bind(reason)
    .bind(exit_code)
    .fetch_optional(&mut *tx)
    .await
}

/// A worker its machine reports failed, as the restart decision needs it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Failing {
    pub state: WorkerState,
    pub restarts: i32,
    pub spec: Json<RunSpec>,
    pub fill: bool,
    /// Waits out a restart's backoff: its agent runs nothing of it, so a failure reported now
    /// is the one that began the wait, heard again.
    pub waiting: bool,
}

/// The worker on that machine, with its run's spec; `None` when it is not there.
pub async fn failing(db: impl PgExecutor<'_>, worker: Uuid, machine: Uuid) -> sqlx::Result<Option<Failing>> {
    sqlx::query_as(
        "SELECT w.state, w.restarts, r.spec, r.fill_drive_id IS NOT NULL AS fill,
             w.restart_at IS NOT NULL AS waiting
         FROM workers w JOIN runs r ON r.id = w.run_id WHERE w.id = $1 AND w.machine_id = $2",
    )
    .bind(worker)
    .bind(machine)
    .fetch_optional(db)
    .await
}

/// Sends a worker that failed while it ran back to wait on its machine, keeping what it holds
/// there, until `after` has passed: the restart controller then lists it to its agent again.
/// Only from `Running` with `restarts` as read, so two reports of one failure count it once.
/// Returns the run.
pub async fn restart(
    tx: &mut PgConnection,
    worker: Uuid,
    machine: Uuid,
    restarts: i32,
    reason: &str,
    exit_code: Option<i32>,
    after: std::time::Duration,
) -> sqlx::Result<Option<Uuid>> {
    sqlx::query_scalar(
        "UPDATE workers SET state = 'Preparing', reason = $4, exit_code = $5, restarts = restarts + 1,
             restart_at = now() + make_interval(secs => $6)
         WHERE id = $1 AND machine_id = $2 AND state = 'Running' AND released AND restarts = $3
         RETURNING run_id",
    )
    .bind(worker)
    .bind(machine)
    .bind(restarts)
    .bind(reason)
    .bind(exit_code)
    .bind(after.as_secs_f64())
    .fetch_optional(&mut *tx)
    .await
}

/// Ends the backoff of the workers due to restart by `now` and bumps their machines'
/// assignment versions in the same statement, which wakes their agents on commit (the
/// `machines_woken` trigger, see `store::rules`); returns those machines. Workers are locked
/// before machines, each in id order, as everywhere.
pub async fn restart_due(db: impl PgExecutor<'_>, now: DateTime<Utc>) -> sqlx::Result<Vec<Uuid>> {
    sqlx::query_scalar(
        "WITH due AS (
             SELECT id FROM workers WHERE restart_at <= $1 ORDER BY id FOR UPDATE SKIP LOCKED),
         woken AS (
             UPDATE workers w SET restart_at = NULL FROM due WHERE w.id = due.id RETURNING w.machine_id),
         locked AS (
             SELECT id FROM machines WHERE id IN (SELECT machine_id FROM woken) ORDER BY id FOR NO KEY UPDATE)
         UPDATE machines m SET assign_version = m.assign_version + 1
         FROM (SELECT count(*) FROM locked) AS l
         WHERE m.id IN (SELECT id FROM locked)
         RETURNING m.id",
    )
    .bind(now)
    .fetch_all(db)
    .await
}

/// Locks a run's workers and gives back the resources of those still holding a machine;
/// returns those machines. Called before the run is deleted.
pub async fn release_run(tx: &mut PgConnection, run: Uuid) -> sqlx::Result<Vec<Uuid>> {
    sqlx::query("SELECT 1 FROM workers WHERE run_id = $1 FOR UPDATE").bind(run).execute(&mut *tx).await?;
    sqlx::query_scalar(
        "WITH held AS (
             SELECT machine_id, sum(cpu_charged)::int AS cpu, sum(memory_charged)::bigint AS mem,
                 sum(gpus_charged)::int AS gpus
             FROM workers WHERE run_id = $1 AND machine_id IS NOT NULL AND state NOT IN ('Completed', 'Failed')
             GROUP BY machine_id)
         UPDATE machines SET cpu_alloc = cpu_alloc - held.cpu, memory_alloc = memory_alloc - held.mem,
             gpus_alloc = gpus_alloc - held.gpus
         FROM held WHERE machines.id = held.machine_id RETURNING machines.id",
    )
    .bind(run)
    .fetch_all(&mut *tx)
    .await
}

/// Sends the machine's workers that have not started (fills aside) back to be placed again,
/// giving back what they held there; returns their runs. A draining machine's waiting workers
/// go elsewhere rather than wait out its deadline.
pub async fn unbind_waiting(tx: &mut PgConnection, machine: Uuid, reason: &str) -> sqlx::Result<Vec<Uuid>> {
    // Runs, then workers, then the machine: the order every transaction locks in.
    sqlx::query(
        "SELECT 1 FROM runs r WHERE r.fill_drive_id IS NULL AND r.id IN (
             SELECT run_id FROM workers WHERE machine_id = $1 AND state = 'Preparing')
         ORDER BY r.id FOR UPDATE",
    )
    .bind(machine)
    .execute(&mut *tx)
    .await?;
    sqlx::query_scalar(
        "WITH w AS (
             UPDATE workers w SET state = 'Pending', machine_id = NULL, released = false, reason = $2,
                 transports = '{}', cpu_charged = 0, memory_charged = 0, gpus_charged = 0, restart_at = NULL
             FROM workers old JOIN runs r ON r.id = old.run_id
             WHERE w.id = old.id AND old.machine_id = $1 AND old.state = 'Preparing' AND r.fill_drive_id IS NULL
             RETURNING w.run_id, old.cpu_charged, old.memory_charged, old.gpus_charged),
         m AS (
             UPDATE machines SET cpu_alloc = cpu_alloc - held.cpu, memory_alloc = memory_alloc - held.mem,
                 gpus_alloc = gpus_alloc - held.gpus, assign_version = assign_version + 1
             FROM (SELECT sum(cpu_charged)::int AS cpu, sum(memory_charged)::bigint AS mem,
                       sum(gpus_charged)::int AS gpus FROM w HAVING count(*) > 0) AS held
             WHERE machines.id = $1)
         SELECT DISTINCT run_id FROM w",
    )
    .bind(machine)
    .bind(reason)
    .fetch_all(&mut *tx)
    .await
}

/// Workers bound to the machine that have not ended.
pub async fn live_on_machine(db: impl PgExecutor<'_>, machine: Uuid) -> sqlx::Result<Vec<Uuid>> {
    sqlx::query_scalar(
        "SELECT id FROM workers WHERE machine_id = $1 AND state NOT IN ('Completed', 'Failed')",
    )
    .bind(machine)
    .fetch_all(db)
    .await
}

/// The workers not yet ended of fills that pull from `holder`'s copies, with their machines.
pub async fn live_pulling_from(
    db: impl PgExecutor<'_>,
    holder: Uuid,
) -> sqlx::Result<Vec<(Uuid, Option<Uuid>)>> {
    sqlx::query_as(
        "SELECT w.id, w.machine_id FROM workers w JOIN runs r ON r.id = w.run_id
         WHERE r.fill_peer_machine_id = $1 AND w.state NOT IN ('Completed', 'Failed')",
    )
    .bind(holder)
    .fetch_all(db)
    .await
}

/// Recomputes a run's state and reason from its workers. A run that becomes Completed, or stops
/// being so, has its mounts marked by the `runs_completed` trigger (see `store::rules`).
pub async fn refresh_run(tx: &mut PgConnection, run: Uuid) -> sqlx::Result<()> {
    sqlx::query("SELECT 1 FROM runs WHERE id = $1 FOR UPDATE").bind(run).execute(&mut *tx).await?;
    refresh_locked_run(tx, run).await
}

/// [`refresh_run`] for several runs in one transaction of their own, locked in id order: after
/// a scheduling pass changed why their workers wait.
pub async fn refresh_runs(db: &sqlx::PgPool, runs: &mut Vec<Uuid>) -> sqlx::Result<()> {
    if runs.is_empty() {
        return Ok(());
    }
    runs.sort_unstable();
    runs.dedup();
    let mut tx = db.begin().await?;
    sqlx::query("SELECT 1 FROM runs WHERE id = ANY($1) ORDER BY id FOR UPDATE")
        .bind(&*runs)
        .execute(&mut *tx)
        .await?;
    for run in runs.iter() {
        refresh_locked_run(&mut tx, *run).await?;
    }
    tx.commit().await
}

/// [`refresh_run`] for a transaction that already holds the run's lock ([`lock_run_of`]).
pub async fn refresh_locked_run(tx: &mut PgConnection, run: Uuid) -> sqlx::Result<()> {
    // A Preparing worker that has restarted waits to start again (`restart`). A fill run's
    // workers are its attempts, one after another: it is as its last one is, so a fill tried
    // again (from the origin, from another peer, or refilled) is no longer Failed.
    let rows: Vec<(String, WorkerState, String, bool)> = sqlx::query_as(
        "SELECT w.name, w.state, w.reason, w.state = 'Preparing' AND w.restarts > 0
         FROM workers w JOIN runs r ON r.id = w.run_id
         WHERE w.run_id = $1
           AND (r.fill_drive_id IS NULL OR w.index = (SELECT max(index) FROM workers WHERE run_id = $1))
         ORDER BY w.index",
    )
    .bind(run)
    .fetch_all(&mut *tx)
    .await?;
    let workers: Vec<WorkerSummary> =
        rows.iter().map(|(n, s, r, again)| (n.as_str(), *s, r.as_str(), *again)).collect();
    let (state, reason) = summarize(&workers);
    sqlx::query(
        "UPDATE runs SET state = $2, reason = $3, updated_at = now()
         WHERE id = $1 AND (state <> $2 OR reason <> $3)",
    )
    .bind(run)
    .bind(state)
    .bind(reason)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// A worker as its agent needs it: the run's task and where it belongs.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct AssignmentRow {
    pub id: Uuid,
    pub name: String,
    pub state: WorkerState,
    pub workspace_id: Uuid,
    pub namespace: String,
    /// The workspace's number (`workspaces.id_slot`), for its containers' user ids.
    pub id_slot: i32,
    pub run_id: Uuid,
    pub run_name: String,
    /// For a fill's worker: the name of the drive it fills.
    pub fill_drive: Option<String>,
    pub fill_drive_id: Option<Uuid>,
    /// For a fill from a peer: the holder, its name, its data port and its copy's manifest.
    pub peer_id: Option<Uuid>,
    pub peer_name: Option<String>,
    pub peer_address: Option<String>,
    pub peer_manifest: Option<String>,
}

/// What an agent is told of its workers: the released ones that have not ended.
const ASSIGNED: &str =
    "SELECT w.id, w.name, w.state, w.workspace_id, s.name AS namespace, s.id_slot, w.run_id,
         r.name AS run_name, fd.name AS fill_drive, fd.id AS fill_drive_id,
         pm.id AS peer_id, pm.name AS peer_name, pm.data_address AS peer_address,
         r.fill_peer_manifest AS peer_manifest
     FROM workers w JOIN runs r ON r.id = w.run_id JOIN workspaces s ON s.id = w.workspace_id
     LEFT JOIN drives fd ON fd.id = r.fill_drive_id
     LEFT JOIN machines pm ON pm.id = r.fill_peer_machine_id
     WHERE w.machine_id = $1 AND w.released AND w.state IN ('Preparing', 'Running') AND w.restart_at IS NULL";

/// The released workers of a machine that have not ended, after the worker `after` in id order:
/// what its agent should be running.
pub async fn assigned_to(
    db: impl PgExecutor<'_>,
    machine: Uuid,
    after: Option<Uuid>,
) -> sqlx::Result<Vec<AssignmentRow>> {
    sqlx::query_as(&format!("{ASSIGNED} AND ($2::uuid IS NULL OR w.id > $2) ORDER BY w.id"))
        .bind(machine)
        .bind(after)
        .fetch_all(db)
        .await
}

/// One of them, if `worker` is assigned to `machine`.
pub async fn assigned(
    db: impl PgExecutor<'_>,
    machine: Uuid,
    worker: Uuid,
) -> sqlx::Result<Option<AssignmentRow>> {
    sqlx::query_as(&format!("{ASSIGNED} AND w.id = $2")).bind(machine).bind(worker).fetch_optional(db).await
}

/// A Pending worker for the scheduler, claimed so that no other replica places it meanwhile.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct PendingRow {
    pub id: Uuid,
    pub run_id: Uuid,
    pub workspace_id: Uuid,
    pub name: String,
    pub reason: String,
    pub created_at: DateTime<Utc>,
}

/// What the scheduler needs of a run with claimed workers, read once however many they are.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct PendingRun {
    pub id: Uuid,
    pub spec: Json<RunSpec>,
    /// The drives the run mounts, as the scheduler needs them.
    pub drives: Json<Vec<crate::scheduler::snapshot::DriveNeed>>,
    /// For a fill's worker: the drive it fills.
    pub fill_drive_id: Option<Uuid>,
}

/// Where a claim stopped in the Pending workers' order (`created_at`, then `id`).
pub type ClaimCursor = (DateTime<Utc>, Uuid);

/// Claims up to `limit` Pending workers, fills' workers first (they unblock the workers
/// waiting for them), then the others from just after `after`, and reads their runs. Returns
/// where the others stopped (`after` when none were claimed), for the next batch: starting
/// from the oldest again would claim the workers that fit nowhere every time.
pub async fn claim_pending(
    tx: &mut PgConnection,
    limit: i64,
    after: Option<ClaimCursor>,
) -> sqlx::Result<(Vec<PendingRow>, HashMap<Uuid, PendingRun>, Option<ClaimCursor>)> {
    // Fills' workers first: the workers waiting for a copy wait for them. Each step walks an
    // index and stops at the limit; one sort of every Pending worker by "is a fill" took 50 ms
    // with 100,000 of them.
    let fills: Vec<Uuid> = sqlx::query_scalar(
        "SELECT id FROM runs WHERE fill_drive_id IS NOT NULL AND state NOT IN ('Completed', 'Failed')",
    )
    .fetch_all(&mut *tx)
    .await?;
    let mut workers: Vec<PendingRow> = if fills.is_empty() {
        Vec::new()
    } else {
        sqlx::query_as(
            "SELECT id, run_id, workspace_id, name, reason, created_at FROM workers
             WHERE run_id = ANY($1) AND state = 'Pending'
             ORDER BY created_at, id LIMIT $2 FOR UPDATE SKIP LOCKED",
        )
        .bind(&fills)
        .bind(limit)
        .fetch_all(&mut *tx)
        .await?
    };
    let first: Vec<Uuid> = workers.iter().map(|w| w.id).collect();
    let rest = limit - workers.len() as i64;
    let mut next = after;
    if rest > 0 {
        // A fill's worker whose run the first step missed is claimed here, in turn.
        // `created_at >= $3` is what `workers_pending_idx` (on `created_at`) starts from.
        let from = match after {
            Some(_) => "AND created_at >= $3 AND (created_at, id) > ($3, $4)",
            None => "",
        };
        let sql = format!(
            "SELECT id, run_id, workspace_id, name, reason, created_at FROM workers
             WHERE state = 'Pending' AND id <> ALL($1) {from}
             ORDER BY created_at, id LIMIT $2 FOR UPDATE SKIP LOCKED"
        );
        let query = sqlx::query_as(&sql).bind(&first).bind(rest);
        let others: Vec<PendingRow> = match after {
            Some((at, id)) => query.bind(at).bind(id),
            None => query,
        }
        .fetch_all(&mut *tx)
        .await?;
        next = others.last().map(|w| (w.created_at, w.id)).or(after);
        workers.extend(others);
    }
    let mut ids: Vec<Uuid> = workers.iter().map(|w| w.run_id).collect();
    ids.sort_unstable();
    ids.dedup();
    let runs: Vec<PendingRun> = sqlx::query_as(
        "SELECT r.id, r.spec, r.fill_drive_id,
             COALESCE((SELECT jsonb_agg(jsonb_build_object(
                     'id', d.id, 'name', d.name, 'full', s.name || '.' || d.name,
                     'scope', d.spec #>> '{sources,0,node_scope}', 'node', d.spec #>> '{sources,0,node}',
                     'transport', COALESCE(d.spec ->> 'transport', 'Auto'),
                     'size_hint', COALESCE((d.spec ->> 'size_hint_bytes')::bigint, 0),
                     'evictable', COALESCE((d.spec ->> 'evictable')::boolean, false),
                     'host_path', CASE WHEN d.spec #>> '{sources,0,node_scope}' = 'placed' THEN NULL
                                       ELSE d.spec #>> '{sources,0,path}' END) ORDER BY d.name)
                 FROM run_mounts m JOIN drives d ON d.id = m.drive_id JOIN workspaces s ON s.id = d.workspace_id
                 WHERE m.run_id = r.id), '[]'::jsonb) AS drives
         FROM runs r WHERE r.id = ANY($1)",
    )
    .bind(&ids)
    .fetch_all(&mut *tx)
    .await?;
    Ok((workers, runs.into_iter().map(|r| (r.id, r)).collect(), next))
}

/// What the workers waiting on each machine for each drive hold, by (machine, drive): they lend
/// it to the drive's fill there. A pair nobody waits on is left out.
pub async fn waiting_charges(
    db: impl PgExecutor<'_>,
    pairs: &[(Uuid, Uuid)],
) -> sqlx::Result<HashMap<(Uuid, Uuid), Charge>> {
    if pairs.is_empty() {
        return Ok(HashMap::new());
    }
    let (machines, drives): (Vec<Uuid>, Vec<Uuid>) = pairs.iter().copied().unzip();
    let rows: Vec<(Uuid, Uuid, i64, i64, i64)> = sqlx::query_as(
        "SELECT t.machine, t.drive, sum(w.cpu_charged)::bigint, sum(w.memory_charged)::bigint,
                sum(w.gpus_charged)::bigint
         FROM unnest($1::uuid[], $2::uuid[]) AS t(machine, drive)
         JOIN workers w ON w.machine_id = t.machine AND w.state = 'Preparing' AND NOT w.released
         JOIN run_mounts m ON m.run_id = w.run_id AND m.drive_id = t.drive
         GROUP BY t.machine, t.drive",
    )
    .bind(&machines)
    .bind(&drives)
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(m, d, cpu_millis, memory_bytes, gpus)| ((m, d), Charge { cpu_millis, memory_bytes, gpus }))
        .collect())
}

/// Releases the machine's waiting workers whose placed drives all have whole copies there, and
/// returns how many. When any is released, the machine's assignment version is bumped in the
/// same statement (one round trip less), which wakes its agent on commit (the `machines_woken`
/// trigger, see `store::rules`). Called when a copy completes, and by the fill controller as a
/// safety net.
pub async fn release_ready(db: impl PgExecutor<'_>, machine: Uuid) -> sqlx::Result<i64> {
    // `count(*)` reads every released worker before the machine row is touched: workers are
    // locked before machines everywhere. No copies are touched here: their statement-level
    // triggers would run for every call, released or not.
    sqlx::query_scalar(
        "WITH released AS (
             UPDATE workers w SET released = true, reason = 'Starting on ' || mc.name
             FROM machines mc
             WHERE w.machine_id = $1 AND mc.id = w.machine_id AND w.state = 'Preparing' AND NOT w.released
               AND NOT EXISTS (
                   SELECT 1 FROM run_mounts rm JOIN drives d ON d.id = rm.drive_id
                   LEFT JOIN copies c ON c.drive_id = rm.drive_id AND c.machine_id = w.machine_id
                   WHERE rm.run_id = w.run_id AND d.spec #>> '{sources,0,node_scope}' = 'placed'
                     AND c.state IS DISTINCT FROM 'Complete')
             RETURNING w.id),
         n AS (SELECT count(*) AS n FROM released),
         woken AS (
             UPDATE machines m SET assign_version = m.assign_version + 1 FROM n
             WHERE n.n > 0 AND m.id = $1)
         SELECT n.n FROM n",
    )
    .bind(machine)
    .fetch_one(db)
    .await
}

/// Records how each drive of a bound worker is reached (`local`, `nfs`, `rdma`).
pub async fn set_transports(
    db: impl PgExecutor<'_>,
    worker: Uuid,
    transports: &std::collections::BTreeMap<String, String>,
) -> sqlx::Result<()> {
    sqlx::query("UPDATE workers SET transports = $2 WHERE id = $1")
        .bind(worker)
        .bind(Json(transports))
        .execute(db)
        .await
        .map(drop)
}

/// Whether the worker is bound to the machine.
pub async fn is_on_machine(db: impl PgExecutor<'_>, worker: Uuid, machine: Uuid) -> sqlx::Result<bool> {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM workers WHERE id = $1 AND machine_id = $2)")
        .bind(worker)
        .bind(machine)
        .fetch_one(db)
        .await
}

/// The worker's state; `None` once it is gone (its run was deleted).
pub async fn state(db: impl PgExecutor<'_>, worker: Uuid) -> sqlx::Result<Option<WorkerState>> {
    sqlx::query_scalar("SELECT state FROM workers WHERE id = $1").bind(worker).fetch_optional(db).await
}

/// Sets the reason of a worker that waits on its machine.
pub async fn set_waiting_reason(db: impl PgExecutor<'_>, worker: Uuid, reason: &str) -> sqlx::Result<bool> {
    let done = sqlx::query(
        "UPDATE workers SET reason = $2 WHERE id = $1 AND state = 'Preparing' AND NOT released AND reason <> $2",
    )
    .bind(worker)
    .bind(reason)
    .execute(db)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// The worker's workspace and name.
pub async fn identity(db: impl PgExecutor<'_>, worker: Uuid) -> sqlx::Result<Option<(Uuid, String)>> {
    sqlx::query_as("SELECT workspace_id, name FROM workers WHERE id = $1")
        .bind(worker)
        .fetch_optional(db)
        .await
}

/// Locks the run of a worker, first: transactions lock runs, then workers, then machines.
pub async fn lock_run_of(tx: &mut PgConnection, worker: Uuid) -> sqlx::Result<Option<Uuid>> {
    sqlx::query_scalar(
        "SELECT r.id FROM runs r JOIN workers w ON w.run_id = r.id WHERE w.id = $1 FOR UPDATE OF r",
    )
    .bind(worker)
    .fetch_optional(&mut *tx)
    .await
}
