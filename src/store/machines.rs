//! The `machines` table: capacity, what is allocated, liveness and the data location.

use std::collections::BTreeMap;

use crate::domain::machine::{MachineState, TransferLimits};
use crate::protocol::ImageReport;
use chrono::{DateTime, Utc};
use sqlx::types::Json;
use sqlx::{PgConnection, PgExecutor};
use uuid::Uuid;

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct MachineRecord {
    pub id: Uuid,
    pub cluster: String,
    pub name: String,
    pub pool: String,
    pub labels: Json<BTreeMap<String, String>>,
    pub transports: Vec<String>,
    pub cpu_millis: i32,
    pub memory_bytes: i64,
    pub gpus: i32,
    pub cpu_alloc: i32,
    pub memory_alloc: i64,
    pub gpus_alloc: i32,
    pub state: MachineState,
    pub last_heartbeat_at: DateTime<Utc>,
    pub credential_id: Uuid,
    pub data_proposed: Option<String>,
    pub data_path: Option<String>,
    pub data_limit_bytes: Option<i64>,
    pub data_total_bytes: i64,
    pub data_used_bytes: i64,
    pub data_free_bytes: i64,
    pub assign_version: i64,
    pub created_at: DateTime<Utc>,
    /// No new workers but fills for those already here.
    pub cordoned: bool,
    /// Draining: its running workers have until then.
    pub drain_deadline: Option<DateTime<Utc>>,
    /// Bytes a second its agent may send to peers and receive from them; NULL for no limit.
    pub upload_bytes_per_second: Option<i64>,
    pub download_bytes_per_second: Option<i64>,
}

impl MachineRecord {
    pub fn transfer_limits(&self) -> TransferLimits {
        TransferLimits::from_columns(self.upload_bytes_per_second, self.download_bytes_per_second)
    }
}

pub const COLUMNS: &str = "id, cluster, name, pool, labels, transports, cpu_millis, memory_bytes, gpus,
    cpu_alloc, memory_alloc, gpus_alloc, state, last_heartbeat_at, credential_id, data_proposed, data_path,
    data_limit_bytes, data_total_bytes, data_used_bytes, data_free_bytes, assign_version, created_at, cordoned,
    drain_deadline, upload_bytes_per_second, download_bytes_per_second";

/// What an agent says about its machine when it joins.
pub struct Joining<'a> {
    pub cluster: &'a str,
    pub name: &'a str,
    pub pool: &'a str,
    pub labels: &'a BTreeMap<String, String>,
    pub transports: &'a [String],
    pub cpu_millis: i32,
    pub memory_bytes: i64,
    pub gpus: i32,
    pub data_proposed: Option<&'a str>,
    pub credential_id: Uuid,
}

/// Registers a new machine; `None` when the cluster has one of that name already. A join never
/// takes a machine's name, and so never its credential: a machine that restarts comes back
/// with the credential it keeps.
pub async fn join(db: impl PgExecutor<'_>, j: &Joining<'_>) -> sqlx::Result<Option<MachineRecord>> {
    sqlx::query_as(&format!(
        "INSERT INTO machines (id, cluster, name, pool, labels, transports, cpu_millis, memory_bytes, gpus,
                               data_proposed, credential_id)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
         ON CONFLICT ON CONSTRAINT machines_cluster_name_key DO NOTHING
         RETURNING {COLUMNS}"
    ))
    .bind(Uuid::now_v7())
    .bind(j.cluster)
    .bind(j.name)
    .bind(j.pool)
    .bind(Json(j.labels))
    .bind(j.transports)
    .bind(j.cpu_millis)
    .bind(j.memory_bytes)
    .bind(j.gpus)
    .bind(j.data_proposed)
    .bind(j.credential_id)
    .fetch_optional(db)
    .await
}

/// Whether the credential is the one in force for the machine.
pub async fn credential_is_current(
    db: impl PgExecutor<'_>,
    machine: Uuid,
    credential: Uuid,
) -> sqlx::Result<bool> {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM machines WHERE id = $1 AND credential_id = $2)")
        .bind(machine)
        .bind(credential)
        .fetch_one(db)
        .await
}

#[derive(Debug, Clone, Copy)]
pub struct Usage {
    pub total_bytes: i64,
    pub used_bytes: i64,
    pub free_bytes: i64,
    /// Written by the statements that reconcile a heartbeat, not by the batches of heartbeats
    /// answered from memory: a change of it is a change of the heartbeat's digest.
    pub reserve_bytes: i64,
}

#[derive(Debug, sqlx::FromRow)]
pub struct Beat {
    #[sqlx(flatten)]
    pub machine: MachineRecord,
    /// The state before this heartbeat: a machine coming back can take work again.
    pub old_state: MachineState,
}

/// Records a heartbeat: the machine is Ready, with this data-location usage. Its row is locked
/// `FOR NO KEY UPDATE`, as an UPDATE locks it: a transaction that only refers to the machine
/// (a copy, a bound worker or a fill run made there holds its foreign key's `KEY SHARE` lock
/// until it commits) does not hold the heartbeat back.
pub async fn heartbeat(db: impl PgExecutor<'_>, machine: Uuid, usage: &Usage) -> sqlx::Result<Option<Beat>> {
    sqlx::query_as(&format!(
        "UPDATE machines SET last_heartbeat_at = now(), state = 'Ready',
             data_total_bytes = $2, data_used_bytes = $3, data_free_bytes = $4, data_reserve_bytes = $5
         FROM (SELECT id AS old_id, state AS old_state FROM machines WHERE id = $1 FOR NO KEY UPDATE) old
         WHERE id = old.old_id
         RETURNING {COLUMNS}, old.old_state"
    ))
    .bind(machine)
    .bind(usage.total_bytes)
    .bind(usage.used_bytes)
    .bind(usage.free_bytes)
    .bind(usage.reserve_bytes)
    .fetch_optional(db)
    .await
}

/// What a heartbeat that changed nothing is answered with, and whether its row was written.
#[derive(Debug, sqlx::FromRow)]
pub struct Unchanged {
    pub data_path: Option<String>,
    pub data_limit_bytes: Option<i64>,
    pub upload_bytes_per_second: Option<i64>,
    pub download_bytes_per_second: Option<i64>,
    pub written: bool,
}

/// The usual heartbeat in one statement and without a transaction: a Ready machine reporting
/// exactly the copies it was known to hold (same bytes, same completeness, none to delete) only
/// refreshes its liveness and usage. Returns what the agent is told (its data location and
/// limit, its transfer limits), and whether its row was written; None when anything differs
/// and the heartbeat must be reconciled in full. A row another transaction holds (a placement
/// pass binding workers there) is not waited for: the caller queues the liveness for the next
/// batch, as for a heartbeat answered from memory, so heartbeats do not queue behind a pass,
/// each holding a connection.
pub async fn beat_if_unchanged(
    db: impl PgExecutor<'_>,
    machine: Uuid,
    usage: &Usage,
    r: &crate::store::copies::Reported,
) -> sqlx::Result<Option<Unchanged>> {
    // A folder reported with another drive's id (or none) is not the copy of the drive of its
    // name: that differs, and the full reconcile names it for deletion.
    sqlx::query_as(
        "WITH reported AS (SELECT * FROM unnest($5::text[], $6::bigint[], $7::bool[], $8::uuid[], $10::text[],
                                               $11::bool[], $12::jsonb[])
                               AS r(folder, bytes, complete, drive_id, manifest, measured, lost)),
         known AS (SELECT s.name || '.' || d.name AS folder, c.drive_id, c.bytes, c.state, c.manifest, c.measured,
                          c.lost
                   FROM copies c
                   JOIN drives d ON d.id = c.drive_id JOIN workspaces s ON s.id = d.workspace_id
                   WHERE c.machine_id = $1),
         differs AS (
             SELECT 1 FROM reported r FULL JOIN known k ON k.folder = r.folder
             WHERE k.folder IS NULL AND r.folder IS NOT NULL
                OR r.folder IS NULL AND k.state IN ('Complete', 'Evicting')
                OR r.folder IS NOT NULL AND (k.state = 'Evicting' OR k.bytes <> r.bytes
                                             OR r.drive_id IS DISTINCT FROM k.drive_id
                                             OR r.lost IS NOT NULL AND r.lost IS DISTINCT FROM k.lost
                                             OR (k.state = 'Complete') <> r.complete
                                             OR k.state = 'Complete' AND (r.manifest IS DISTINCT FROM k.manifest
                                                                          OR r.measured <> k.measured))),
         free AS (SELECT id FROM machines WHERE id = $1 AND state = 'Ready' AND NOT EXISTS (SELECT 1 FROM differs)
                  FOR NO KEY UPDATE SKIP LOCKED),
         written AS (
             UPDATE machines m SET last_heartbeat_at = now(),
                 data_total_bytes = $2, data_used_bytes = $3, data_free_bytes = $4, data_reserve_bytes = $9
             FROM free WHERE m.id = free.id
             RETURNING m.id)
         SELECT m.data_path, m.data_limit_bytes, m.upload_bytes_per_second, m.download_bytes_per_second,
             EXISTS (SELECT 1 FROM written) AS written
         FROM machines m WHERE m.id = $1 AND m.state = 'Ready' AND NOT EXISTS (SELECT 1 FROM differs)",
    )
    .bind(machine)
    .bind(usage.total_bytes)
    .bind(usage.used_bytes)
    .bind(usage.free_bytes)
    .bind(&r.folders)
    .bind(&r.bytes)
    .bind(&r.complete)
    .bind(&r.ids)
    .bind(usage.reserve_bytes)
    .bind(&r.manifests)
    .bind(&r.measured)
    .bind(&r.lost)
    .fetch_optional(db)
    .await
}

/// Writes a batch of heartbeats answered from memory: each machine's liveness and usage;
/// returns the machines it skipped. A machine whose row another transaction holds is skipped,
/// not waited for: the batch never joins a queue of heartbeats and placements behind one row,
/// and the caller writes the skipped ones with the next batch. The locked rows carry their
/// values, so the update joins them with `machines` by its key alone (a join of two CTEs has
/// no index and went by nested loop, 10,000 machines squared).
pub async fn beat_all(
    db: impl PgExecutor<'_>,
    ids: &[Uuid],
    at: &[chrono::DateTime<chrono::Utc>],
    usage: &[Usage],
) -> sqlx::Result<Vec<Uuid>> {
    let total: Vec<i64> = usage.iter().map(|u| u.total_bytes).collect();
    let used: Vec<i64> = usage.iter().map(|u| u.used_bytes).collect();
    let free: Vec<i64> = usage.iter().map(|u| u.free_bytes).collect();
    sqlx::query_scalar(
        "WITH locked AS (
             SELECT m.id, b.at, b.total, b.used, b.free
             FROM machines m JOIN unnest($1::uuid[], $2::timestamptz[], $3::bigint[], $4::bigint[], $5::bigint[])
                 AS b(id, at, total, used, free) ON b.id = m.id
             ORDER BY m.id FOR NO KEY UPDATE OF m SKIP LOCKED),
         written AS (
             UPDATE machines m SET last_heartbeat_at = l.at,
                 data_total_bytes = l.total, data_used_bytes = l.used, data_free_bytes = l.free
             FROM locked l WHERE m.id = l.id AND m.last_heartbeat_at < l.at)
         SELECT m.id FROM machines m WHERE m.id = ANY($1) AND m.id NOT IN (SELECT id FROM locked)",
    )
    .bind(ids)
    .bind(at)
    .bind(&total)
    .bind(&used)
    .bind(&free)
    .fetch_all(db)
    .await
}

pub async fn get(db: impl PgExecutor<'_>, id: Uuid) -> sqlx::Result<Option<MachineRecord>> {
    sqlx::query_as(&format!("SELECT {COLUMNS} FROM machines WHERE id = $1")).bind(id).fetch_optional(db).await
}

/// Keeps the images the machine's agent reported.
pub async fn set_images(db: impl PgExecutor<'_>, machine: Uuid, images: &[ImageReport]) -> sqlx::Result<()> {
    sqlx::query("UPDATE machines SET images = $2 WHERE id = $1 AND images IS DISTINCT FROM $2")
        .bind(machine)
        .bind(Json(images))
        .execute(db)
        .await
        .map(drop)
}

/// Where the machine's agent serves its copies to peers, as it last reported.
pub async fn set_data_address(db: impl PgExecutor<'_>, machine: Uuid, address: &str) -> sqlx::Result<()> {
    sqlx::query("UPDATE machines SET data_address = $2 WHERE id = $1 AND data_address IS DISTINCT FROM $2")
        .bind(machine)
        .bind(address)
        .execute(db)
        .await
        .map(drop)
}

/// The images the machine's agent last reported.
pub async fn images(db: impl PgExecutor<'_>, machine: Uuid) -> sqlx::Result<Vec<ImageReport>> {
    let images: Option<Json<Vec<ImageReport>>> =
        sqlx::query_scalar("SELECT images FROM machines WHERE id = $1")
            .bind(machine)
            .fetch_optional(db)
            .await?;
    Ok(images.map(|i| i.0).unwrap_or_default())
}

/// The machines of that name: in `cluster`, or in every cluster (names are unique only within
/// one), by cluster.
pub async fn by_name(
    db: impl PgExecutor<'_>,
    cluster: Option<&str>,
    name: &str,
) -> sqlx::Result<Vec<MachineRecord>> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM machines WHERE name = $1 AND ($2::text IS NULL OR cluster = $2)
         ORDER BY cluster LIMIT 10"
    ))
    .bind(name)
    .bind(cluster)
    .fetch_all(db)
    .await
}

pub async fn list(db: impl PgExecutor<'_>) -> sqlx::Result<Vec<MachineRecord>> {
    sqlx::query_as(&format!("SELECT {COLUMNS} FROM machines ORDER BY cluster, name")).fetch_all(db).await
}

/// A page of machines by cluster, then name, after the machine `page.before` names; `None` when
/// that machine is gone (the pager must list again).
pub async fn page(
    db: &mut sqlx::PgConnection,
    page: super::Page,
) -> sqlx::Result<Option<Vec<MachineRecord>>> {
    let after: Option<(String, String)> = match page.before {
        None => None,
        Some(id) => {
            let at = sqlx::query_as("SELECT cluster, name FROM machines WHERE id = $1")
                .bind(id)
                .fetch_optional(&mut *db)
                .await?;
            match at {
                None => return Ok(None),
                some => some,
            }
        }
    };
    let (cluster, name) = after.unzip();
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM machines WHERE $1::text IS NULL OR (cluster, name) > ($1, $2)
         ORDER BY cluster, name LIMIT $3"
    ))
    .bind(cluster)
    .bind(name)
    .bind(page.limit)
    .fetch_all(&mut *db)
    .await
    .map(Some)
}

/// A machine as placement weighs it: what it has and holds, not its labels or history.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct PlacementMachine {
    pub id: Uuid,
    pub cluster: String,
    pub name: String,
    pub transports: Vec<String>,
    pub cpu_millis: i32,
    pub memory_bytes: i64,
    pub gpus: i32,
    pub cpu_alloc: i32,
    pub memory_alloc: i64,
    pub gpus_alloc: i32,
    pub state: MachineState,
    /// A data location is confirmed.
    pub confirmed: bool,
    pub data_limit_bytes: Option<i64>,
    pub data_free_bytes: i64,
    pub cordoned: bool,
}

/// The machines placement weighs, in no order: every one, or those with the given names in any
/// cluster. Sorting 10,000 names by the database's collation took longer than reading them
/// (15–30 ms against 3–8), so the scheduler sorts them itself.
pub async fn for_placement(
    db: impl PgExecutor<'_>,
    names: Option<&[&str]>,
) -> sqlx::Result<Vec<PlacementMachine>> {
    let sql = format!(
        "SELECT id, cluster, name, transports, cpu_millis, memory_bytes, gpus, cpu_alloc, memory_alloc,
            gpus_alloc, state, data_path IS NOT NULL AS confirmed, data_limit_bytes, data_free_bytes, cordoned
         FROM machines{}",
        names.map_or("", |_| " WHERE name = ANY($1)")
    );
    match names {
        None => sqlx::query_as(&sql).fetch_all(db).await,
        Some(names) => sqlx::query_as(&sql).bind(names).fetch_all(db).await,
    }
}

/// The (machine, image) pairs where a machine's agent last reported holding one of `images`
/// (full names), through the GIN index on the reports.
pub async fn holding_images(db: impl PgExecutor<'_>, images: &[String]) -> sqlx::Result<Vec<(Uuid, String)>> {
    sqlx::query_as(
        "SELECT m.id, i.name FROM unnest($1::text[]) AS i(name)
         JOIN machines m ON m.images @> jsonb_build_array(jsonb_build_object('name', i.name))",
    )
    .bind(images)
    .fetch_all(db)
    .await
}

/// Confirms where the machine keeps copies, and the most they may take. The version bump wakes
/// its agent (the `machines_woken` trigger), and the new location makes every replica reconcile
/// its next heartbeat (`machines_report_changed`; see `store::rules`).
pub async fn confirm_data_location(
    db: impl PgExecutor<'_>,
    id: Uuid,
    path: &str,
    limit: Option<i64>,
) -> sqlx::Result<MachineRecord> {
    sqlx::query_as(&format!(
        "UPDATE machines SET data_path = $2, data_limit_bytes = $3, assign_version = assign_version + 1
         WHERE id = $1 RETURNING {COLUMNS}"
    ))
    .bind(id)
    .bind(path)
    .bind(limit)
    .fetch_one(db)
    .await
}

/// Ready machines whose last heartbeat is older than `grace`: `(id, name)`.
pub async fn silent(
    db: impl PgExecutor<'_>,
    grace: std::time::Duration,
) -> sqlx::Result<Vec<(Uuid, String)>> {
    sqlx::query_as(
        "SELECT id, name FROM machines
         WHERE state = 'Ready' AND last_heartbeat_at < now() - make_interval(secs => $1)",
    )
    .bind(grace.as_secs_f64())
    .fetch_all(db)
    .await
}

/// Marks the machine NotReady if it is still silent; false when a heartbeat came meanwhile.
/// Its next heartbeat is reconciled in full, not answered from memory: the state change is
/// announced by the `machines_report_changed` trigger (see `store::rules`).
pub async fn mark_not_ready(
    db: impl PgExecutor<'_>,
    id: Uuid,
    grace: std::time::Duration,
) -> sqlx::Result<bool> {
    let done = sqlx::query(
        "UPDATE machines SET state = 'NotReady'
         WHERE id = $1 AND state = 'Ready' AND last_heartbeat_at < now() - make_interval(secs => $2)",
    )
    .bind(id)
    .bind(grace.as_secs_f64())
    .execute(db)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Bumps the machines' assignment versions, which wakes their agents' long-polls on commit (a
/// trigger, `machines_woken`, as for every bump; see `store::rules`).
pub async fn touch_assignments(db: impl PgExecutor<'_>, ids: &[Uuid]) -> sqlx::Result<()> {
    sqlx::query("UPDATE machines SET assign_version = assign_version + 1 WHERE id = ANY($1)")
        .bind(ids)
        .execute(db)
        .await
        .map(drop)
}

pub async fn assign_version(db: impl PgExecutor<'_>, id: Uuid) -> sqlx::Result<i64> {
    sqlx::query_scalar("SELECT assign_version FROM machines WHERE id = $1").bind(id).fetch_one(db).await
}

/// Cordons the machine (no new workers) or makes it eligible again, which also ends a drain.
pub async fn set_cordoned(db: impl PgExecutor<'_>, id: Uuid, cordoned: bool) -> sqlx::Result<MachineRecord> {
    sqlx::query_as(&format!(
        "UPDATE machines SET cordoned = $2, drain_deadline = NULL WHERE id = $1 RETURNING {COLUMNS}"
    ))
    .bind(id)
    .bind(cordoned)
    .fetch_one(db)
    .await
}

/// Cordons the machine and gives its running workers until `deadline`; the version bump wakes
/// its agent (the `machines_woken` trigger, see `store::rules`).
pub async fn start_drain(
    db: impl PgExecutor<'_>,
    id: Uuid,
    deadline: DateTime<Utc>,
) -> sqlx::Result<MachineRecord> {
    sqlx::query_as(&format!(
        "UPDATE machines SET cordoned = true, drain_deadline = $2, assign_version = assign_version + 1
         WHERE id = $1 RETURNING {COLUMNS}"
    ))
    .bind(id)
    .bind(deadline)
    .fetch_one(db)
    .await
}

/// A draining machine, as the drain controller sees it.
#[derive(Debug, sqlx::FromRow)]
pub struct Draining {
    pub id: Uuid,
    pub name: String,
    pub deadline: DateTime<Utc>,
    pub overdue: bool,
    /// Workers on it that have not ended.
    pub live: i64,
}

pub async fn draining(db: impl PgExecutor<'_>) -> sqlx::Result<Vec<Draining>> {
    sqlx::query_as(
        "SELECT m.id, m.name, m.drain_deadline AS deadline, m.drain_deadline <= now() AS overdue,
             (SELECT count(*) FROM workers w
              WHERE w.machine_id = m.id AND w.state NOT IN ('Completed', 'Failed')) AS live
         FROM machines m WHERE m.drain_deadline IS NOT NULL",
    )
    .fetch_all(db)
    .await
}

/// Ends the drain begun at `deadline` (the machine stays cordoned); false when it was ended or
/// begun again meanwhile.
pub async fn end_drain(db: impl PgExecutor<'_>, id: Uuid, deadline: DateTime<Utc>) -> sqlx::Result<bool> {
    let done = sqlx::query("UPDATE machines SET drain_deadline = NULL WHERE id = $1 AND drain_deadline = $2")
        .bind(id)
        .bind(deadline)
        .execute(db)
        .await?;
    Ok(done.rows_affected() == 1)
}

/// Locks the machine's row for its deletion; false when it is gone already.
pub async fn lock(db: impl PgExecutor<'_>, id: Uuid) -> sqlx::Result<bool> {
    sqlx::query_scalar("SELECT true FROM machines WHERE id = $1 FOR UPDATE")
        .bind(id)
        .fetch_optional(db)
        .await
        .map(|found: Option<bool>| found.is_some())
}

/// Deletes the machine, its copies and its fill runs (their foreign keys cascade); its
/// credential goes with the row. Every replica forgets its heartbeat (the `machines_deleted`
/// trigger, see `store::rules`). The fill runs go first: in the machine's one statement, the
/// cascade would also unset their placed workers' `machine_id` (`ON DELETE SET NULL`), and that
/// update fails its check against the run deleted beside it.
pub async fn delete(tx: &mut PgConnection, id: Uuid) -> sqlx::Result<bool> {
    sqlx::query("DELETE FROM runs WHERE fill_machine_id = $1").bind(id).execute(&mut *tx).await?;
    let done = sqlx::query("DELETE FROM machines WHERE id = $1").bind(id).execute(&mut *tx).await?;
    Ok(done.rows_affected() == 1)
}

/// Sets what the machine's agent may send to peers and receive from them; the machine, if it
/// exists.
pub async fn set_transfer_limits(
    db: impl PgExecutor<'_>,
    id: Uuid,
    limits: &TransferLimits,
) -> sqlx::Result<Option<MachineRecord>> {
    let column = |r: Option<u64>| r.and_then(|r| i64::try_from(r).ok());
    sqlx::query_as(&format!(
        "UPDATE machines SET upload_bytes_per_second = $2, download_bytes_per_second = $3
         WHERE id = $1 RETURNING {COLUMNS}"
    ))
    .bind(id)
    .bind(column(limits.upload_bytes_per_second))
    .bind(column(limits.download_bytes_per_second))
    .fetch_optional(db)
    .await
}
