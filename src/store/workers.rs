//! The `workers` table: one row per `<run>-<index>`.

use chrono::{DateTime, Utc};
use sqlx::types::Json;
use sqlx::{PgConnection, PgExecutor};
use uuid::Uuid;

use crate::domain::run::{RunSpec, WorkerState, summarize};

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
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
}

const SELECT: &str = "SELECT w.id, w.run_id, r.name AS run_name, w.name, w.index, w.state, w.reason,
        mc.name AS machine, w.exit_code, w.created_at, w.started_at, w.finished_at
    FROM workers w JOIN runs r ON r.id = w.run_id LEFT JOIN machines mc ON mc.id = w.machine_id";

pub async fn for_run(db: impl PgExecutor<'_>, run: Uuid) -> sqlx::Result<Vec<WorkerRecord>> {
    sqlx::query_as(&format!("{SELECT} WHERE w.run_id = $1 ORDER BY w.index")).bind(run).fetch_all(db).await
}

pub async fn get(db: impl PgExecutor<'_>, workspace: Uuid, name: &str) -> sqlx::Result<Option<WorkerRecord>> {
    sqlx::query_as(&format!("{SELECT} WHERE w.workspace_id = $1 AND w.name = $2"))
        .bind(workspace)
        .bind(name)
        .fetch_optional(db)
        .await
}

/// Workers that mount the drive and have not ended, oldest first.
pub async fn using_drive(db: impl PgExecutor<'_>, drive: Uuid) -> sqlx::Result<Vec<WorkerRecord>> {
    sqlx::query_as(&format!(
        "{SELECT} JOIN run_mounts m ON m.run_id = w.run_id
         WHERE m.drive_id = $1 AND w.state NOT IN ('Completed', 'Failed') ORDER BY w.id"
    ))
    .bind(drive)
    .fetch_all(db)
    .await
}

/// Places a Pending worker on a machine, taking its resources there. The conditional UPDATE
/// refuses when the machine lacks room or is not Ready, so it is never over-committed.
/// Returns false when the worker was not bound.
pub async fn bind(
    tx: &mut PgConnection,
    worker: Uuid,
    machine: Uuid,
    released: bool,
    reason: &str,
) -> sqlx::Result<bool> {
    let bound: Option<Uuid> = sqlx::query_scalar(
        "WITH w AS (SELECT cpu_millis, memory_bytes, gpus FROM workers WHERE id = $1 AND state = 'Pending'),
         m AS (
             UPDATE machines SET cpu_alloc = cpu_alloc + w.cpu_millis,
                 memory_alloc = memory_alloc + w.memory_bytes, gpus_alloc = gpus_alloc + w.gpus
             FROM w
             WHERE machines.id = $2 AND machines.state = 'Ready'
               AND machines.cpu_alloc + w.cpu_millis <= machines.cpu_millis
               AND machines.memory_alloc + w.memory_bytes <= machines.memory_bytes
               AND machines.gpus_alloc + w.gpus <= machines.gpus
             RETURNING machines.id)
         UPDATE workers SET machine_id = (SELECT id FROM m), state = 'Preparing', reason = $3, released = $4
         WHERE id = $1 AND state = 'Pending' AND EXISTS (SELECT 1 FROM m)
         RETURNING id",
    )
    .bind(worker)
    .bind(machine)
    .bind(reason)
    .bind(released)
    .fetch_optional(&mut *tx)
    .await?;
    Ok(bound.is_some())
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

/// The agent started the worker. False when it is not a Preparing worker of that machine.
pub async fn start(tx: &mut PgConnection, worker: Uuid, machine: Uuid) -> sqlx::Result<Option<Uuid>> {
    sqlx::query_scalar(
        "UPDATE workers SET state = 'Running', reason = '', started_at = now()
         WHERE id = $1 AND machine_id = $2 AND state = 'Preparing' AND released RETURNING run_id",
    )
    .bind(worker)
    .bind(machine)
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
             UPDATE workers SET state = $3, reason = $4, exit_code = $5, finished_at = now()
             WHERE id = $1 AND ($2::uuid IS NULL OR machine_id = $2) AND state NOT IN ('Completed', 'Failed')
             RETURNING run_id, machine_id, cpu_millis, memory_bytes, gpus),
         m AS (
             UPDATE machines SET cpu_alloc = cpu_alloc - w.cpu_millis,
                 memory_alloc = memory_alloc - w.memory_bytes, gpus_alloc = gpus_alloc - w.gpus
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

/// Locks a run's workers and gives back the resources of those still holding a machine;
/// returns those machines. Called before the run is deleted.
pub async fn release_run(tx: &mut PgConnection, run: Uuid) -> sqlx::Result<Vec<Uuid>> {
    sqlx::query("SELECT 1 FROM workers WHERE run_id = $1 FOR UPDATE").bind(run).execute(&mut *tx).await?;
    sqlx::query_scalar(
        "WITH held AS (
             SELECT machine_id, sum(cpu_millis)::int AS cpu, sum(memory_bytes)::bigint AS mem, sum(gpus)::int AS gpus
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

/// Workers bound to the machine that have not ended.
pub async fn live_on_machine(db: impl PgExecutor<'_>, machine: Uuid) -> sqlx::Result<Vec<Uuid>> {
    sqlx::query_scalar(
        "SELECT id FROM workers WHERE machine_id = $1 AND state NOT IN ('Completed', 'Failed')",
    )
    .bind(machine)
    .fetch_all(db)
    .await
}

/// Recomputes a run's state and reason from its workers.
pub async fn refresh_run(tx: &mut PgConnection, run: Uuid) -> sqlx::Result<()> {
    sqlx::query("SELECT 1 FROM runs WHERE id = $1 FOR UPDATE").bind(run).execute(&mut *tx).await?;
    let rows: Vec<(String, WorkerState, String)> =
        sqlx::query_as("SELECT name, state, reason FROM workers WHERE run_id = $1 ORDER BY index")
            .bind(run)
            .fetch_all(&mut *tx)
            .await?;
    let states: Vec<WorkerState> = rows.iter().map(|r| r.1).collect();
    let failure = rows.iter().find(|r| r.1 == WorkerState::Failed).map(|r| (r.0.as_str(), r.2.as_str()));
    let (state, reason) = summarize(&states, failure);
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
    pub run_name: String,
    pub spec: Json<RunSpec>,
}

/// The released workers of a machine that have not ended: what its agent should be running.
pub async fn assigned_to(db: impl PgExecutor<'_>, machine: Uuid) -> sqlx::Result<Vec<AssignmentRow>> {
    sqlx::query_as(
        "SELECT w.id, w.name, w.state, w.workspace_id, s.name AS namespace, r.name AS run_name, r.spec
         FROM workers w JOIN runs r ON r.id = w.run_id JOIN workspaces s ON s.id = w.workspace_id
         WHERE w.machine_id = $1 AND w.released AND w.state IN ('Preparing', 'Running')
         ORDER BY w.id",
    )
    .bind(machine)
    .fetch_all(db)
    .await
}

/// A Pending worker for the scheduler, claimed so that no other replica places it meanwhile.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct PendingRow {
    pub id: Uuid,
    pub reason: String,
    pub spec: Json<RunSpec>,
    /// Full names of the mounted drives whose copies live in data locations.
    pub placed_drives: Vec<String>,
}

pub async fn claim_pending(tx: &mut PgConnection, limit: i64) -> sqlx::Result<Vec<PendingRow>> {
    sqlx::query_as(
        "SELECT w.id, w.reason, r.spec,
             ARRAY(SELECT s.name || '.' || d.name FROM run_mounts m JOIN drives d ON d.id = m.drive_id
                   JOIN workspaces s ON s.id = d.workspace_id
                   WHERE m.run_id = r.id AND d.spec #>> '{sources,0,node_scope}' = 'placed'
                   ORDER BY d.name) AS placed_drives
         FROM workers w JOIN runs r ON r.id = w.run_id
         WHERE w.state = 'Pending' ORDER BY w.created_at, w.id LIMIT $1 FOR UPDATE OF w SKIP LOCKED",
    )
    .bind(limit)
    .fetch_all(&mut *tx)
    .await
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
