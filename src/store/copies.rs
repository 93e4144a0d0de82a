//! The `copies` table: each drive's copy on each machine, and how whole it is.

use chrono::{DateTime, Utc};
use sqlx::types::Json;
use sqlx::{PgConnection, PgExecutor};
use uuid::Uuid;

use crate::domain::copy::{CopyState, LostFiles};
use crate::domain::progress;

/// A copy as the API shows it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct CopyRecord {
    pub machine_id: Uuid,
    pub machine: String,
    pub data_path: Option<String>,
    pub state: CopyState,
    pub bytes: i64,
    pub last_used_at: Option<DateTime<Utc>>,
    pub manifest: Option<String>,
    /// `peer <machine>` or `fill`, by its fill run; `None` without one.
    pub source: Option<String>,
    /// What the copy lost since it was whole, until it is whole again.
    pub lost: Option<Json<LostFiles>>,
    #[sqlx(flatten)]
    pub fill: FillObservation,
}

/// What progress is measured from: the copy's promised size and two observations of its bytes.
#[derive(Debug, Clone, Copy, sqlx::FromRow)]
pub struct FillObservation {
    pub size_hint: i64,
    pub bytes_at: Option<DateTime<Utc>>,
    pub progress_bytes: i64,
    pub progress_at: Option<DateTime<Utc>>,
}

impl FillObservation {
    pub fn with_bytes(&self, bytes: i64) -> progress::Observed {
        progress::Observed {
            bytes,
            size_hint: self.size_hint,
            bytes_at: self.bytes_at,
            sample: self.progress_at.map(|at| (self.progress_bytes, at)),
        }
    }
}

/// A copy as eviction weighs it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct EvictionCopy {
    pub drive_id: Uuid,
    pub machine_id: Uuid,
    pub state: CopyState,
    pub bytes: i64,
    pub size_hint: i64,
    pub evictable: bool,
    pub last_used_at: Option<DateTime<Utc>>,
    /// Whether a worker that has not ended mounts the drive on that machine; read only for
    /// drives with a whole, evictable copy, false for the others (whose copies stay either way).
    pub in_use: bool,
}

/// Where a copy comes from, `peer <machine>` (`peer` once that machine is deleted) or `fill`
/// (its drive's template), by its fill run.
const SOURCE: &str = "CASE WHEN fr.fill_peer_manifest IS NOT NULL THEN 'peer' || COALESCE(' ' || pm.name, '')
    WHEN fr.id IS NOT NULL THEN 'fill' END AS source";
const SOURCE_JOIN: &str =
    "LEFT JOIN runs fr ON fr.fill_drive_id = c.drive_id AND fr.fill_machine_id = c.machine_id
    LEFT JOIN machines pm ON pm.id = fr.fill_peer_machine_id";

/// A page of the drive's copies that are not being evicted, in the order their machines joined
/// (`machine_id` is a v7 UUID): read along `copies_drive_machine_key`, so a page stops at
/// `limit` however many machines hold the drive.
pub async fn for_drive(
    db: impl PgExecutor<'_>,
    drive: Uuid,
    after: Option<Uuid>,
    limit: i64,
) -> sqlx::Result<Vec<CopyRecord>> {
    let after_clause = if after.is_some() { "AND c.machine_id > $3" } else { "" };
    let sql = format!(
        "SELECT c.machine_id, m.name AS machine, m.data_path, c.state, c.bytes, c.last_used_at, c.manifest,
             c.lost, c.size_hint, c.bytes_at, c.progress_bytes, c.progress_at, {SOURCE}
         FROM copies c JOIN machines m ON m.id = c.machine_id {SOURCE_JOIN}
         WHERE c.drive_id = $1 AND c.state <> 'Evicting' {after_clause} ORDER BY c.machine_id LIMIT $2"
    );
    let query = sqlx::query_as(&sql).bind(drive).bind(limit);
    match after {
        Some(machine) => query.bind(machine),
        None => query,
    }
    .fetch_all(db)
    .await
}

/// How many of a drive's copies are in each state, as a list of drives shows them.
#[derive(Debug, Clone, Copy, sqlx::FromRow)]
pub struct CopyCounts {
    pub drive_id: Uuid,
    pub complete: i64,
    pub filling: i64,
    pub failed: i64,
}

/// The counts of each drive in `drives` that has a copy not being evicted: one row a drive, so
/// a page of drives costs a page of rows however many machines hold them.
pub async fn counts(db: impl PgExecutor<'_>, drives: &[Uuid]) -> sqlx::Result<Vec<CopyCounts>> {
    sqlx::query_as(
        "SELECT drive_id, count(*) FILTER (WHERE state = 'Complete') AS complete,
             count(*) FILTER (WHERE state = 'Filling') AS filling,
             count(*) FILTER (WHERE state = 'Failed') AS failed
         FROM copies WHERE drive_id = ANY($1) AND state <> 'Evicting' GROUP BY drive_id",
    )
    .bind(drives)
    .fetch_all(db)
    .await
}

/// A copy on one machine, as the machine's page lists it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct MachineCopyRecord {
    pub drive: String,
    pub state: CopyState,
    pub bytes: i64,
    pub last_used_at: Option<DateTime<Utc>>,
    pub manifest: Option<String>,
    /// `peer <machine>` or `fill`, by its fill run; `None` without one.
    pub source: Option<String>,
    /// What the copy lost since it was whole, until it is whole again.
    pub lost: Option<Json<LostFiles>>,
    #[sqlx(flatten)]
    pub fill: FillObservation,
}

/// The copies on a machine, not being evicted, of the workspace's drives, by drive name: at most
/// one a drive.
pub async fn on_machine(
    db: impl PgExecutor<'_>,
    machine: Uuid,
    workspace: Uuid,
) -> sqlx::Result<Vec<MachineCopyRecord>> {
    sqlx::query_as(&format!(
        "SELECT d.name AS drive, c.state, c.bytes, c.last_used_at, c.manifest, c.lost, c.size_hint, c.bytes_at,
             c.progress_bytes, c.progress_at, {SOURCE}
         FROM copies c JOIN drives d ON d.id = c.drive_id {SOURCE_JOIN}
         WHERE c.machine_id = $1 AND d.workspace_id = $2 AND c.state <> 'Evicting' ORDER BY d.name"
    ))
    .bind(machine)
    .bind(workspace)
    .fetch_all(db)
    .await
}

/// The copies on one machine, for choosing which to evict.
pub async fn on_machine_for_eviction(
    db: impl PgExecutor<'_>,
    machine: Uuid,
) -> sqlx::Result<Vec<EvictionCopy>> {
    on_machines_for_eviction(db, &[machine]).await
}

/// The copies on `machines`, for choosing which to evict. `in_use` comes from one join of live
/// workers with their runs' mounts, rather than an `EXISTS` per copy, which reads every run
/// that ever mounted the drive once per copy.
pub async fn on_machines_for_eviction(
    db: impl PgExecutor<'_>,
    machines: &[Uuid],
) -> sqlx::Result<Vec<EvictionCopy>> {
    if machines.is_empty() {
        return Ok(Vec::new());
    }
    // A copy was last used when a worker that mounted it last started or ended there: a
    // three-day job that ended an hour ago used its copy an hour ago. Read only for the copies
    // eviction may take, and only when something is evicted.
    sqlx::query_as(&format!(
        "SELECT c.drive_id, c.machine_id, c.state, {ROOM} AS bytes, c.size_hint, c.evictable,
            CASE WHEN c.evictable AND c.state = 'Complete' THEN GREATEST(c.last_used_at, (
                SELECT max(w.finished_at) FROM run_mounts rm JOIN workers w ON w.run_id = rm.run_id
                WHERE rm.drive_id = c.drive_id AND w.machine_id = c.machine_id))
            ELSE c.last_used_at END AS last_used_at,
            u.machine_id IS NOT NULL AS in_use
         FROM copies c LEFT JOIN ({}) u ON u.machine_id = c.machine_id AND u.drive_id = c.drive_id
         WHERE c.machine_id = ANY($1)",
        in_use(" AND w.machine_id = ANY($1)", " AND machine_id = ANY($1)"),
        ROOM = ROOM,
    ))
    .bind(machines)
    .fetch_all(db)
    .await
}

/// What evicting a whole copy frees as placement counts room: its bytes, and until it is
/// measured whole, the rest of its size hint that placement holds for it.
const ROOM: &str =
    "CASE WHEN c.state = 'Complete' AND NOT c.measured THEN greatest(c.bytes, c.size_hint) ELSE c.bytes END";

/// The drives that Pending workers mount (through the partial index of Pending workers):
/// eviction keeps their copies for last.
pub async fn queued_drives(db: impl PgExecutor<'_>) -> sqlx::Result<Vec<Uuid>> {
    sqlx::query_scalar(
        "SELECT DISTINCT rm.drive_id FROM run_mounts rm
         WHERE rm.run_id IN (SELECT run_id FROM workers WHERE state = 'Pending')",
    )
    .fetch_all(db)
    .await
}

/// The (machine, drive) pairs where a worker that has not ended mounts a drive with a whole,
/// evictable copy: only those copies' use decides anything, and most drives are never evicted,
/// so joining every live worker on each pass would grow with the fleet's work (70 ms for
/// 100,000 workers; 6 ms when no copy is evictable). `workers` and `copies` filter the workers
/// and the copies.
fn in_use(workers: &str, copies: &str) -> String {
    format!(
        "SELECT DISTINCT w.machine_id, rm.drive_id FROM workers w JOIN run_mounts rm ON rm.run_id = w.run_id
         WHERE w.machine_id IS NOT NULL AND w.state NOT IN ('Completed', 'Failed'){workers}
           AND rm.drive_id IN (SELECT drive_id FROM copies WHERE evictable AND state = 'Complete'{copies})"
    )
}

/// What placement weighs of a machine's copies taken together, whatever drives they hold.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct PlacementTotals {
    pub machine_id: Uuid,
    /// What the copies hold.
    pub bytes: i64,
    /// Room promised to copies being filled and not written yet, and to whole copies not yet
    /// measured whole.
    pub promised: i64,
    /// What evicting the whole, evictable copies that no live worker mounts would free.
    pub reclaimable: i64,
    /// How many copies are whole or being filled.
    pub held: i64,
    /// How fast the copy whose fill was measured last wrote, in bytes a second.
    pub fill_rate: Option<i64>,
}

/// The totals of every machine with copies, or of those on `machines`: one row a machine,
/// summed in Postgres, so a pass no longer reads every copy (100,000 rows at 10,000 machines).
pub async fn totals_for_placement(
    db: impl PgExecutor<'_>,
    machines: Option<&[Uuid]>,
) -> sqlx::Result<Vec<PlacementTotals>> {
    // One text for every machine and one for some, each with its own prepared plan: a single
    // `$1 IS NULL OR …` would not let the plan use the machines' indexes.
    let on = |column: &str| machines.map_or(String::new(), |_| format!(" AND {column} = ANY($1)"));
    let sql = format!(
        "SELECT c.machine_id, sum(c.bytes)::bigint AS bytes,
            COALESCE(sum(greatest(c.size_hint - c.bytes, 0))
                FILTER (WHERE c.state = 'Filling' OR c.state = 'Complete' AND NOT c.measured), 0)::bigint
                AS promised,
            COALESCE(sum({ROOM}) FILTER (WHERE c.evictable AND c.state = 'Complete' AND u.machine_id IS NULL), 0)::bigint
                AS reclaimable,
            count(*) FILTER (WHERE c.state IN ('Filling', 'Complete')) AS held,
            (array_agg(c.fill_rate ORDER BY c.bytes_at DESC NULLS LAST) FILTER (WHERE c.fill_rate > 0))[1]
                AS fill_rate
         FROM copies c LEFT JOIN ({}) u ON u.machine_id = c.machine_id AND u.drive_id = c.drive_id{}
         GROUP BY c.machine_id",
        in_use(&on("w.machine_id"), &on("machine_id")),
        machines.map_or("", |_| " WHERE c.machine_id = ANY($1)"),
        ROOM = ROOM,
    );
    match machines {
        None => sqlx::query_as(&sql).fetch_all(db).await,
        Some(ids) => sqlx::query_as(&sql).bind(ids).fetch_all(db).await,
    }
}

/// The states of the copies of `drives`, on every machine or on `machines`: `(drive, machine,
/// state, bytes)`. A pass weighs copies only of the drives its workers mount.
pub async fn states_for_placement(
    db: impl PgExecutor<'_>,
    drives: &[Uuid],
    machines: Option<&[Uuid]>,
) -> sqlx::Result<Vec<(Uuid, Uuid, CopyState, i64)>> {
    let sql = format!(
        "SELECT drive_id, machine_id, state, bytes FROM copies WHERE drive_id = ANY($1){}",
        machines.map_or("", |_| " AND machine_id = ANY($2)")
    );
    let query = sqlx::query_as(&sql).bind(drives);
    match machines {
        None => query.fetch_all(db).await,
        Some(ids) => query.bind(ids).fetch_all(db).await,
    }
}

/// The states of the copies the fill controller has work for: every copy not yet whole, and
/// the whole ones that the given (drive, machine) pairs wait for. Whole copies nobody waits for,
/// most of them, are not read.
pub async fn unsettled(
    db: impl PgExecutor<'_>,
    drives: &[Uuid],
    machines: &[Uuid],
) -> sqlx::Result<Vec<(Uuid, Uuid, CopyState)>> {
    sqlx::query_as(
        "SELECT drive_id, machine_id, state FROM copies WHERE state <> 'Complete'
         UNION
         SELECT c.drive_id, c.machine_id, c.state FROM copies c
         JOIN unnest($1::uuid[], $2::uuid[]) AS w(drive, machine) ON c.drive_id = w.drive AND c.machine_id = w.machine",
    )
    .bind(drives)
    .bind(machines)
    .fetch_all(db)
    .await
}

/// Makes sure the drive has a copy row on the machine (Filling, holding `size_hint` of room);
/// `staged_for` names the queued run it is filled ahead for (stage-in), when one is, and the
/// copy is made only while that run exists.
pub async fn ensure(
    db: impl PgExecutor<'_>,
    drive: Uuid,
    machine: Uuid,
    size_hint: i64,
    evictable: bool,
    staged_for: Option<Uuid>,
) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO copies (id, drive_id, machine_id, size_hint, evictable, staged_for)
         SELECT $1, $2, $3, $4, $5, $6 WHERE $6 IS NULL OR EXISTS (SELECT 1 FROM runs WHERE id = $6)
         ON CONFLICT ON CONSTRAINT copies_drive_machine_key DO NOTHING",
    )
    .bind(Uuid::now_v7())
    .bind(drive)
    .bind(machine)
    .bind(size_hint)
    .bind(evictable)
    .bind(staged_for)
    .execute(db)
    .await
    .map(drop)
}

/// Copies being filled ahead for queued runs now, against the planner's budget.
pub async fn staging(db: impl PgExecutor<'_>) -> sqlx::Result<i64> {
    sqlx::query_scalar("SELECT count(*) FROM copies WHERE staged_for IS NOT NULL AND state = 'Filling'")
        .fetch_one(db)
        .await
}

/// The (drive, machine) of copies being filled ahead for runs that still have Pending workers:
/// the fill controller fills them as it does copies a bound worker waits for.
pub async fn staged_for_queued(db: impl PgExecutor<'_>) -> sqlx::Result<Vec<(Uuid, Uuid)>> {
    sqlx::query_as(
        "SELECT c.drive_id, c.machine_id FROM copies c
         WHERE c.staged_for IS NOT NULL AND c.state = 'Filling'
           AND EXISTS (SELECT 1 FROM workers w WHERE w.run_id = c.staged_for AND w.state = 'Pending')",
    )
    .fetch_all(db)
    .await
}

/// Marks copies for removal; the agent deletes their folders and the rows go once it reports
/// them gone. The machine's next heartbeat is reconciled in full, and so told to delete them,
/// by the `copies_state_changed` trigger (see `store::rules`).
pub async fn evict(db: impl PgExecutor<'_>, machine: Uuid, drives: &[Uuid]) -> sqlx::Result<()> {
    sqlx::query("UPDATE copies SET state = 'Evicting' WHERE machine_id = $1 AND drive_id = ANY($2)")
        .bind(machine)
        .bind(drives)
        .execute(db)
        .await
        .map(drop)
}

/// Moves a copy between `Filling` and `Failed`, never out of `Evicting`. Its machine's next
/// heartbeat is reconciled in full (the `copies_state_changed` trigger, see `store::rules`).
pub async fn set_state(
    db: impl PgExecutor<'_>,
    drive: Uuid,
    machine: Uuid,
    state: CopyState,
) -> sqlx::Result<()> {
    sqlx::query(
        "UPDATE copies SET state = $3 WHERE drive_id = $1 AND machine_id = $2 AND state <> 'Evicting'",
    )
    .bind(drive)
    .bind(machine)
    .bind(state)
    .execute(db)
    .await
    .map(drop)
}

/// Marks the copies of these (machine, drive) pairs as just used, in one statement.
pub async fn touch_used_pairs(
    db: impl PgExecutor<'_>,
    machines: &[Uuid],
    drives: &[Uuid],
) -> sqlx::Result<()> {
    if machines.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "WITH t AS (SELECT * FROM unnest($1::uuid[], $2::uuid[]) AS t(machine, drive)),
              locked AS (SELECT c.id FROM copies c JOIN t ON c.machine_id = t.machine AND c.drive_id = t.drive
                         ORDER BY c.id FOR UPDATE OF c)
         UPDATE copies c SET last_used_at = now() FROM locked WHERE c.id = locked.id",
    )
    .bind(machines)
    .bind(drives)
    .execute(db)
    .await
    .map(drop)
}

/// What a heartbeat changes, and what the agent should delete.
#[derive(Debug, Default)]
pub struct Reconciled {
    /// Copies that just became whole: the drive and the copy's bytes.
    pub completed: Vec<(Uuid, i64)>,
    /// Folders under `drives/` to delete: no copy is wanted there, or it is being evicted.
    pub delete: Vec<String>,
    /// Whether a whole copy was measured whole for the first time: what its size hint held
    /// back from placement may now be free.
    pub measured: bool,
    /// Copies whole until now that lost files: the drive, and what they lost.
    pub lost: Vec<(Uuid, LostFiles)>,
}

/// An agent's report of its copies, a column each, as `unnest` takes them.
#[derive(Debug, Default, Clone)]
pub struct Reported {
    /// `<namespace>.<drive>`.
    pub folders: Vec<String>,
    /// The drive each folder was made for.
    pub ids: Vec<Option<Uuid>>,
    pub bytes: Vec<i64>,
    /// Whether the marker is there.
    pub complete: Vec<bool>,
    /// Whether a complete copy's bytes were measured whole.
    pub measured: Vec<bool>,
    /// What a copy that was whole lost.
    pub lost: Vec<Option<Json<LostFiles>>>,
    /// The digest of each whole copy's manifest, once made.
    pub manifests: Vec<Option<String>>,
}

/// Applies an agent's report of its copies.
pub async fn reconcile(tx: &mut PgConnection, machine: Uuid, r: &Reported) -> sqlx::Result<Reconciled> {
    // Lock the machine's copies and read their states first: a CTE cannot, because rows that
    // the UPDATE below changes are invisible to a FOR UPDATE in the same statement.
    let before: std::collections::HashMap<Uuid, (CopyState, bool)> = sqlx::query_as(
        "SELECT drive_id, state, measured FROM copies WHERE machine_id = $1 ORDER BY id FOR UPDATE",
    )
    .bind(machine)
    .fetch_all(&mut *tx)
    .await?
    .into_iter()
    .map(|(drive, state, measured)| (drive, (state, measured)))
    .collect();
    // Map each reported folder `<namespace>.<drive>` to a drive and update its copy: only when
    // the folder was made for that very drive (the id the agent read in it), so a folder left by
    // a drive deleted and made again under the same name is never the new drive's copy, and is
    // named for deletion. The copies the agent no longer has, which no reported folder holds,
    // change in the same statement: evicted ones are gone; whole ones must be filled again.
    type Row = (String, Option<Uuid>, Option<CopyState>, i64, bool, Option<Json<LostFiles>>);
    let rows: Vec<Row> = sqlx::query_as(
        "WITH r AS (SELECT * FROM unnest($2::text[], $3::bigint[], $4::bool[], $5::uuid[], $7::text[], $8::bool[],
                                         $9::jsonb[])
                    AS r(folder, bytes, complete, reported_id, manifest, measured, lost)),
         d AS (SELECT r.folder, r.bytes, r.complete, r.manifest, r.measured, r.lost, dr.id AS drive_id FROM r
               LEFT JOIN workspaces s ON s.name = split_part(r.folder, '.', 1)
               LEFT JOIN drives dr ON dr.workspace_id = s.id AND dr.name = substr(r.folder, length(s.name) + 2)
                   AND dr.id = r.reported_id),
         up AS (UPDATE copies c SET bytes = d.bytes,
                    bytes_at = CASE WHEN d.bytes <> c.bytes THEN now() ELSE c.bytes_at END,
                    fill_rate = CASE WHEN d.bytes > c.bytes AND c.progress_at < now() - make_interval(secs => $6)
                                          AND c.bytes_at > c.progress_at AND c.bytes > c.progress_bytes
                                     THEN ((c.bytes - c.progress_bytes)
                                           / extract(epoch FROM c.bytes_at - c.progress_at))::bigint
                                     ELSE c.fill_rate END,
                    progress_bytes = CASE WHEN d.bytes < c.bytes THEN 0
                                          WHEN d.bytes > c.bytes AND (c.progress_at IS NULL
                                               OR c.progress_at < now() - make_interval(secs => $6))
                                          THEN c.bytes ELSE c.progress_bytes END,
                    progress_at = CASE WHEN d.bytes < c.bytes THEN NULL
                                       WHEN d.bytes > c.bytes AND (c.progress_at IS NULL
                                            OR c.progress_at < now() - make_interval(secs => $6))
                                       THEN c.bytes_at ELSE c.progress_at END,
                    state = CASE WHEN c.state = 'Evicting' THEN 'Evicting'
                                 WHEN d.complete THEN 'Complete'
                                 WHEN c.state = 'Complete' THEN 'Filling'
                                 ELSE c.state END,
                    completed_at = CASE WHEN d.complete AND c.state <> 'Complete' THEN now() ELSE c.completed_at END,
                    manifest = CASE WHEN d.complete AND c.state <> 'Evicting' THEN d.manifest END,
                    measured = d.measured,
                    lost = CASE WHEN d.complete THEN NULL ELSE COALESCE(d.lost, c.lost) END
                FROM d WHERE c.machine_id = $1 AND c.drive_id = d.drive_id
                RETURNING c.drive_id, c.state),
         missing AS (SELECT c.id, c.state FROM copies c
                     WHERE c.machine_id = $1 AND c.state IN ('Evicting', 'Complete')
                       AND NOT EXISTS (SELECT 1 FROM d WHERE d.drive_id = c.drive_id)),
         gone AS (DELETE FROM copies c USING missing WHERE c.id = missing.id AND missing.state = 'Evicting'),
         lost AS (UPDATE copies c SET state = 'Filling', bytes = 0, bytes_at = NULL, progress_bytes = 0,
                      progress_at = NULL, manifest = NULL FROM missing
                  WHERE c.id = missing.id AND missing.state = 'Complete')
         SELECT d.folder, d.drive_id, up.state, d.bytes, d.measured, d.lost
         FROM d LEFT JOIN up ON up.drive_id = d.drive_id",
    )
    .bind(machine)
    .bind(&r.folders)
    .bind(&r.bytes)
    .bind(&r.complete)
    .bind(&r.ids)
    .bind(progress::SAMPLE_EVERY_SECONDS as f64)
    .bind(&r.manifests)
    .bind(&r.measured)
    .bind(&r.lost)
    .fetch_all(&mut *tx)
    .await?;
    let mut out = Reconciled::default();
    for (folder, drive, state, bytes, measured, lost) in rows {
        let was = drive.and_then(|d| before.get(&d));
        let was_incomplete = was.is_some_and(|(s, _)| *s != CopyState::Complete);
        if let (Some((CopyState::Complete, false)), Some(CopyState::Complete)) = (was, state) {
            out.measured |= measured;
        }
        if let (Some(d), Some((CopyState::Complete, _)), Some(Json(lost))) = (drive, was, lost) {
            out.lost.push((d, lost));
        }
        match (drive, state) {
            (Some(d), Some(CopyState::Complete)) if was_incomplete => out.completed.push((d, bytes)),
            (_, None) | (_, Some(CopyState::Evicting)) => out.delete.push(folder),
            _ => {}
        }
    }
    Ok(out)
}

/// Makes sure the drive has a copy row on the machine, sized from the drive's spec.
pub async fn ensure_for(db: impl PgExecutor<'_>, drive: Uuid, machine: Uuid) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO copies (id, drive_id, machine_id, size_hint, evictable)
         SELECT $1, d.id, $3, COALESCE((d.spec ->> 'size_hint_bytes')::bigint, 0),
             COALESCE((d.spec ->> 'evictable')::boolean, false)
         FROM drives d WHERE d.id = $2
         ON CONFLICT ON CONSTRAINT copies_drive_machine_key DO NOTHING",
    )
    .bind(Uuid::now_v7())
    .bind(drive)
    .bind(machine)
    .execute(db)
    .await
    .map(drop)
}

/// A machine whose confirmed data location holds more than its limit allows, or whose disk has
/// less free than the reserve its agent reports.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Pressed {
    pub machine_id: Uuid,
    pub name: String,
    /// What its copies hold.
    pub bytes: i64,
    pub limit_bytes: Option<i64>,
    pub free_bytes: i64,
    pub reserve_bytes: i64,
}

pub async fn under_pressure(db: impl PgExecutor<'_>) -> sqlx::Result<Vec<Pressed>> {
    sqlx::query_as(
        "SELECT m.id AS machine_id, m.name, COALESCE(c.bytes, 0)::bigint AS bytes, m.data_limit_bytes AS limit_bytes,
             m.data_free_bytes AS free_bytes, m.data_reserve_bytes AS reserve_bytes
         FROM machines m
         LEFT JOIN (SELECT machine_id, sum(bytes) AS bytes FROM copies WHERE state <> 'Evicting' GROUP BY machine_id) c
             ON c.machine_id = m.id
         WHERE m.data_path IS NOT NULL AND m.state = 'Ready'
           AND ((m.data_limit_bytes IS NOT NULL AND COALESCE(c.bytes, 0) > m.data_limit_bytes)
                OR (m.data_total_bytes > 0 AND m.data_free_bytes < m.data_reserve_bytes))",
    )
    .fetch_all(db)
    .await
}
