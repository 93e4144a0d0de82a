//! Fill runs (`runs` rows with a drive and a machine) and the workers that wait for them.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use sqlx::types::Json;
use sqlx::{PgConnection, PgExecutor};
use uuid::Uuid;

use crate::domain::run::{RunSpec, RunState};

#[derive(Debug, Clone)]
pub struct WaitingRow {
    pub worker: Uuid,
    pub machine: Uuid,
    pub drive: Uuid,
    pub reason: String,
}

/// Bound, unreleased workers and each placed drive they mount. Two statements joined here, each
/// on one table's index: as one statement, on statistics taken before a fleet's seeding, the
/// planner expected one placed drive and a few dozen waiting workers, and walked every waiting
/// worker once per drive (870,000 probes, 2–3 s a fill pass, with 8,700 waiting).
pub async fn waiting(tx: &mut PgConnection) -> sqlx::Result<Vec<WaitingRow>> {
    let workers: Vec<(Uuid, Uuid, Uuid, String)> = sqlx::query_as(
        "SELECT id, run_id, machine_id, reason FROM workers
         WHERE state = 'Preparing' AND NOT released AND machine_id IS NOT NULL",
    )
    .fetch_all(&mut *tx)
    .await?;
    let mut runs: Vec<Uuid> = workers.iter().map(|w| w.1).collect();
    runs.sort_unstable();
    runs.dedup();
    // Whether a drive is placed is read, not filtered on: a filter on the spec's JSON has no
    // statistics, and the planner's guess of one row is what led it astray.
    let mounts: Vec<(Uuid, Uuid, bool)> = sqlx::query_as(
        "SELECT rm.run_id, rm.drive_id, d.spec #>> '{sources,0,node_scope}' IS NOT DISTINCT FROM 'placed'
         FROM run_mounts rm JOIN drives d ON d.id = rm.drive_id WHERE rm.run_id = ANY($1)",
    )
    .bind(&runs)
    .fetch_all(&mut *tx)
    .await?;
    let mut placed: HashMap<Uuid, Vec<Uuid>> = HashMap::new();
    for (run, drive, is_placed) in mounts {
        if is_placed {
            placed.entry(run).or_default().push(drive);
        }
    }
    Ok(workers
        .into_iter()
        .flat_map(|(worker, run, machine, reason)| {
            let drives = placed.get(&run).map(Vec::as_slice).unwrap_or_default();
            drives.iter().map(move |&drive| WaitingRow { worker, machine, drive, reason: reason.clone() })
        })
        .collect())
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct FillRow {
    pub run: Uuid,
    pub drive: Uuid,
    pub machine: Uuid,
    pub state: RunState,
    pub last_worker: String,
    pub finished_at: Option<DateTime<Utc>>,
    /// Its workers that completed since the copy was made, each without the marker.
    pub fruitless: i64,
    /// It pulls from a peer rather than running the fill template.
    pub peer: bool,
}

/// The fill runs of copies being filled or failed: the only ones the fill controller's plan
/// looks at (a whole copy's fill, or one whose copy is gone, decides nothing).
pub async fn unsettled(db: impl PgExecutor<'_>) -> sqlx::Result<Vec<FillRow>> {
    sqlx::query_as(
        "SELECT r.id AS run, r.fill_drive_id AS drive, r.fill_machine_id AS machine, r.state,
             w.name AS last_worker, w.finished_at, r.fill_peer_manifest IS NOT NULL AS peer,
             (SELECT count(*) FROM workers f WHERE f.run_id = r.id AND f.state = 'Completed'
                AND f.finished_at >= c.created_at) AS fruitless
         FROM copies c
         JOIN runs r ON r.fill_drive_id = c.drive_id AND r.fill_machine_id = c.machine_id
         JOIN LATERAL (
             SELECT name, finished_at FROM workers WHERE run_id = r.id ORDER BY index DESC LIMIT 1) w ON true
         WHERE c.state IN ('Filling', 'Failed')",
    )
    .fetch_all(db)
    .await
}

/// Everything a fill run is made from.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct FillSource {
    pub drive: Uuid,
    pub machine: Uuid,
    pub workspace_id: Uuid,
    pub drive_name: String,
    pub drive_spec: Json<crate::domain::drive::DriveSpec>,
    pub machine_name: String,
}

pub async fn source(db: impl PgExecutor<'_>, drive: Uuid, machine: Uuid) -> sqlx::Result<Option<FillSource>> {
    Ok(sources(db, &[(drive, machine)]).await?.pop())
}

/// The sources of many `(drive, machine)` pairs in one query; pairs whose drive or machine is
/// gone are left out.
pub async fn sources(db: impl PgExecutor<'_>, pairs: &[(Uuid, Uuid)]) -> sqlx::Result<Vec<FillSource>> {
    let (drives, machines): (Vec<Uuid>, Vec<Uuid>) = pairs.iter().copied().unzip();
    sqlx::query_as(
        "SELECT d.id AS drive, m.id AS machine, d.workspace_id, d.name AS drive_name, d.spec AS drive_spec,
             m.name AS machine_name
         FROM unnest($1::uuid[], $2::uuid[]) AS t(drive, machine)
         JOIN drives d ON d.id = t.drive JOIN machines m ON m.id = t.machine",
    )
    .bind(&drives)
    .bind(&machines)
    .fetch_all(db)
    .await
}

/// A fill run about to be created from its source.
pub struct NewFill<'a> {
    pub source: &'a FillSource,
    pub name: String,
    pub spec: RunSpec,
    /// The machine whose whole copy it pulls, with that copy's manifest digest; `None` to run
    /// the drive's fill template.
    pub peer: Option<(Uuid, String)>,
}

/// A machine that can serve its copy of a drive to a peer: Ready, serving a data port, its copy
/// whole with a manifest, or being pulled from another peer (a relay, which passes on what it
/// has checked as it lands).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Holder {
    pub drive: Uuid,
    pub machine: Uuid,
    pub name: String,
    pub cluster: String,
    pub manifest: String,
    /// Peer fills under way from it.
    pub uploads: i64,
    /// Its copy is still being pulled: its fill runs.
    pub relay: bool,
    /// The machine a relay pulls from.
    pub upstream: Option<Uuid>,
}

/// The holders of `drives`, with their uploads under way: whole copies first, then those whose
/// pull from a peer has started.
pub async fn holders(db: impl PgExecutor<'_>, drives: &[Uuid]) -> sqlx::Result<Vec<Holder>> {
    sqlx::query_as(
        "WITH held AS (
             SELECT c.drive_id AS drive, c.machine_id AS machine, c.manifest, false AS relay,
                 NULL::uuid AS upstream
             FROM copies c
             WHERE c.drive_id = ANY($1) AND c.state = 'Complete' AND c.manifest IS NOT NULL
             UNION ALL
             SELECT r.fill_drive_id, r.fill_machine_id, r.fill_peer_manifest, true, r.fill_peer_machine_id
             FROM runs r
             WHERE r.fill_drive_id = ANY($1) AND r.fill_peer_manifest IS NOT NULL
               AND EXISTS (SELECT 1 FROM workers w WHERE w.run_id = r.id AND w.state = 'Running')
               AND NOT EXISTS (SELECT 1 FROM copies c WHERE c.drive_id = r.fill_drive_id
                   AND c.machine_id = r.fill_machine_id AND c.state = 'Complete'))
         SELECT h.drive, m.id AS machine, m.name, m.cluster, h.manifest, h.relay, h.upstream,
             (SELECT count(*) FROM runs r WHERE r.fill_peer_machine_id = m.id
                 AND r.state NOT IN ('Completed', 'Failed')) AS uploads
         FROM held h JOIN machines m ON m.id = h.machine
         WHERE m.state = 'Ready' AND m.data_address IS NOT NULL
         ORDER BY h.relay, m.cluster, m.name",
    )
    .bind(drives)
    .fetch_all(db)
    .await
}

/// What a failed fill from a peer is tried again with: the peer it pulled from, the workers it
/// has had, and its machine's cluster.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct FailedPull {
    pub peer: Option<Uuid>,
    pub workers: i64,
    pub cluster: String,
}

pub async fn failed_pull(db: impl PgExecutor<'_>, run: Uuid) -> sqlx::Result<Option<FailedPull>> {
    sqlx::query_as(
        "SELECT r.fill_peer_machine_id AS peer, m.cluster,
             (SELECT count(*) FROM workers w WHERE w.run_id = r.id) AS workers
         FROM runs r JOIN machines m ON m.id = r.fill_machine_id WHERE r.id = $1",
    )
    .bind(run)
    .fetch_optional(db)
    .await
}

/// Sends a failed peer fill to another holder, `peer` with its copy's `manifest`, with a new
/// worker.
pub async fn from_another_peer(
    tx: &mut PgConnection,
    run: Uuid,
    peer: Uuid,
    manifest: &str,
) -> sqlx::Result<()> {
    sqlx::query("UPDATE runs SET fill_peer_machine_id = $2, fill_peer_manifest = $3 WHERE id = $1")
        .bind(run)
        .bind(peer)
        .bind(manifest)
        .execute(&mut *tx)
        .await?;
    add_worker(tx, run).await
}

/// Sends a peer fill back to its drive's fill template, with a new worker: its pull failed.
pub async fn from_origin(tx: &mut PgConnection, run: Uuid) -> sqlx::Result<()> {
    sqlx::query("UPDATE runs SET fill_peer_machine_id = NULL, fill_peer_manifest = NULL WHERE id = $1")
        .bind(run)
        .execute(&mut *tx)
        .await?;
    add_worker(tx, run).await
}

/// Creates each drive's one fill run on its machine, with its first worker Pending, all in one
/// statement; returns the `(drive, machine)` of those created. One that exists already is
/// skipped: the unique index decides, whichever replica gets there first.
pub async fn insert_all(tx: &mut PgConnection, fills: &[NewFill<'_>]) -> sqlx::Result<Vec<(Uuid, Uuid)>> {
    if fills.is_empty() {
        return Ok(vec![]);
    }
    let new_ids = || fills.iter().map(|_| Uuid::now_v7()).collect::<Vec<_>>();
    sqlx::query_as(&format!(
        "WITH t AS (SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::uuid[], $4::text[], $5::text[], $6::jsonb[],
                                          $7::uuid[], $8::uuid[], $9::uuid[], $10::text[])
                    AS t(run, worker, workspace, name, cluster, spec, drive, machine, peer, manifest)),
              r AS (INSERT INTO runs (id, workspace_id, name, cluster, spec, fill_drive_id, fill_machine_id,
                                      fill_peer_machine_id, fill_peer_manifest)
                    SELECT run, workspace, name, cluster, spec, drive, machine, peer, manifest FROM t
                    ON CONFLICT (fill_drive_id, fill_machine_id) WHERE fill_drive_id IS NOT NULL DO NOTHING
                    RETURNING id, workspace_id, name, spec, fill_drive_id, fill_machine_id),
              w AS (INSERT INTO workers (id, run_id, workspace_id, name, index, cpu_millis, memory_bytes, gpus)
                    SELECT t.worker, r.id, r.workspace_id, r.name || '-0', 0, {RESOURCES}
                    FROM r JOIN t ON t.run = r.id)
         SELECT fill_drive_id, fill_machine_id FROM r"
    ))
    .bind(new_ids())
    .bind(new_ids())
    .bind(fills.iter().map(|f| f.source.workspace_id).collect::<Vec<_>>())
    .bind(fills.iter().map(|f| f.name.as_str()).collect::<Vec<_>>())
    .bind(fills.iter().map(|f| f.spec.cluster.as_str()).collect::<Vec<_>>())
    .bind(fills.iter().map(|f| Json(&f.spec)).collect::<Vec<_>>())
    .bind(fills.iter().map(|f| f.source.drive).collect::<Vec<_>>())
    .bind(fills.iter().map(|f| f.source.machine).collect::<Vec<_>>())
    .bind(fills.iter().map(|f| f.peer.as_ref().map(|p| p.0)).collect::<Vec<_>>())
    .bind(fills.iter().map(|f| f.peer.as_ref().map(|p| p.1.as_str())).collect::<Vec<_>>())
    .fetch_all(&mut *tx)
    .await
}

/// A worker's resources, read from its run's spec `r.spec`.
const RESOURCES: &str =
    "round((r.spec #>> '{task_template,requested_resources,cpu_cores}')::numeric * 1000)::int,
    (r.spec #>> '{task_template,requested_resources,memory_bytes}')::bigint,
    COALESCE((r.spec #>> '{task_template,requested_resources,gpus}')::int, 0)";

/// Adds the run's next worker (`<run>-<n>`), Pending, with the task's resources.
pub async fn add_worker(tx: &mut PgConnection, run: Uuid) -> sqlx::Result<()> {
    sqlx::query(&format!(
        "INSERT INTO workers (id, run_id, workspace_id, name, index, cpu_millis, memory_bytes, gpus)
         SELECT $2, r.id, r.workspace_id, r.name || '-' || n.i, n.i, {RESOURCES}
         FROM runs r, (SELECT COALESCE(max(index) + 1, 0) AS i FROM workers WHERE run_id = $1) n
         WHERE r.id = $1"
    ))
    .bind(run)
    .bind(Uuid::now_v7())
    .execute(&mut *tx)
    .await
    .map(drop)
}

/// Locks the drive's fill runs; returns them.
pub async fn lock_for_drive(tx: &mut PgConnection, drive: Uuid) -> sqlx::Result<Vec<Uuid>> {
    sqlx::query_scalar("SELECT id FROM runs WHERE fill_drive_id = $1 FOR UPDATE")
        .bind(drive)
        .fetch_all(tx)
        .await
}

/// For a fill's worker that just ended: how long it ran, in seconds. `None` for other workers.
pub async fn ended(db: impl PgExecutor<'_>, run: Uuid, worker: Uuid) -> sqlx::Result<Option<f64>> {
    sqlx::query_scalar(
        "SELECT EXTRACT(EPOCH FROM (w.finished_at - COALESCE(w.started_at, w.finished_at)))::float8
         FROM workers w JOIN runs r ON r.id = w.run_id
         WHERE w.id = $2 AND r.id = $1 AND r.fill_drive_id IS NOT NULL",
    )
    .bind(run)
    .bind(worker)
    .fetch_optional(db)
    .await
}

/// Why the fill run's newest worker ended as it did.
pub async fn last_reason(db: impl PgExecutor<'_>, run: Uuid) -> sqlx::Result<Option<String>> {
    sqlx::query_scalar("SELECT reason FROM workers WHERE run_id = $1 ORDER BY index DESC LIMIT 1")
        .bind(run)
        .fetch_optional(db)
        .await
}

/// Whether the copy of `drive` on `machine` is being filled from a peer.
pub async fn from_peer(db: impl PgExecutor<'_>, drive: Uuid, machine: Uuid) -> sqlx::Result<bool> {
    let peer: Option<bool> = sqlx::query_scalar(
        "SELECT fill_peer_manifest IS NOT NULL FROM runs WHERE fill_drive_id = $1 AND fill_machine_id = $2",
    )
    .bind(drive)
    .bind(machine)
    .fetch_optional(db)
    .await?;
    Ok(peer.unwrap_or(false))
}
