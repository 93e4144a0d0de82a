//! The `runs` and `run_mounts` tables. A run is written with its workers in one transaction.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use sqlx::types::Json;
use sqlx::{PgConnection, PgExecutor};
use uuid::Uuid;

use super::Page;
use crate::domain::run::{RunSpec, RunState};

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct RunRecord {
    pub id: Uuid,
    pub workspace_id: Uuid,
    pub name: String,
    pub labels: Json<BTreeMap<String, String>>,
    pub spec: Json<RunSpec>,
    pub state: RunState,
    pub reason: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

const COLUMNS: &str = "id, workspace_id, name, labels, spec, state, reason, created_at, updated_at";

/// Writes the run, its `replicas` workers (`<run>-<i>`, Pending) and the drives it mounts.
pub async fn insert(
    tx: &mut PgConnection,
    workspace: Uuid,
    name: &str,
    labels: &BTreeMap<String, String>,
    spec: &RunSpec,
    drive_ids: &[Uuid],
) -> sqlx::Result<RunRecord> {
    let run: RunRecord = sqlx::query_as(&format!(
        "INSERT INTO runs (id, workspace_id, name, cluster, labels, spec)
         VALUES ($1, $2, $3, $4, $5, $6) RETURNING {COLUMNS}"
    ))
    .bind(Uuid::now_v7())
    .bind(workspace)
    .bind(name)
    .bind(spec.cluster.as_str())
    .bind(Json(labels))
    .bind(Json(spec))
    .fetch_one(&mut *tx)
    .await?;
    let resources = &spec.task_template.requested_resources;
    let indexes: Vec<i32> = (0..spec.replicas as i32).collect();
    let ids: Vec<Uuid> = indexes.iter().map(|_| Uuid::now_v7()).collect();
    sqlx::query(
        "INSERT INTO workers (id, run_id, workspace_id, name, index, cpu_millis, memory_bytes, gpus)
         SELECT w.id, $2, $3, $4 || '-' || w.index, w.index, $6, $7, $8
         FROM unnest($1::uuid[], $5::int[]) AS w(id, index)",
    )
    .bind(&ids)
    .bind(run.id)
    .bind(workspace)
    .bind(name)
    .bind(&indexes)
    .bind(resources.cpu_cores.millis() as i32)
    .bind(resources.memory_bytes as i64)
    .bind(resources.gpus as i32)
    .execute(&mut *tx)
    .await?;
    sqlx::query("INSERT INTO run_mounts (run_id, drive_id) SELECT $1, unnest($2::uuid[])")
        .bind(run.id)
        .bind(drive_ids)
        .execute(&mut *tx)
        .await?;
    Ok(run)
}

pub async fn get(db: impl PgExecutor<'_>, workspace: Uuid, name: &str) -> sqlx::Result<Option<RunRecord>> {
    sqlx::query_as(&format!("SELECT {COLUMNS} FROM runs WHERE workspace_id = $1 AND name = $2"))
        .bind(workspace)
        .bind(name)
        .fetch_optional(db)
        .await
}

/// The specs of these runs, those that still exist.
pub async fn specs(db: impl PgExecutor<'_>, runs: Vec<Uuid>) -> sqlx::Result<Vec<(Uuid, RunSpec)>> {
    let read: Vec<(Uuid, Json<RunSpec>)> =
        sqlx::query_as("SELECT id, spec FROM runs WHERE id = ANY($1)").bind(runs).fetch_all(db).await?;
    Ok(read.into_iter().map(|(id, spec)| (id, spec.0)).collect())
}

/// Newest first; terminal runs only when `all`.
pub async fn list(
    db: impl PgExecutor<'_>,
    workspace: Uuid,
    all: bool,
    page: Page,
) -> sqlx::Result<Vec<RunRecord>> {
    // Conditions written out only when they apply, rather than `$2 OR state NOT IN (…)` and
    // `$3 IS NULL OR id < $3`: a generic plan can then still walk runs_live_idx from `before`.
    let live = if all { "" } else { "AND state NOT IN ('Completed', 'Failed')" };
    let before = if page.before.is_some() { "AND id < $3" } else { "" };
    let sql = format!(
        "SELECT {COLUMNS} FROM runs WHERE workspace_id = $1 {live} {before} ORDER BY id DESC LIMIT $2"
    );
    let query = sqlx::query_as(&sql).bind(workspace).bind(page.limit);
    match page.before {
        Some(id) => query.bind(id),
        None => query,
    }
    .fetch_all(db)
    .await
}

/// Locks the run for deletion; `None` when the workspace has no such run.
pub async fn lock(tx: &mut PgConnection, workspace: Uuid, name: &str) -> sqlx::Result<Option<Uuid>> {
    sqlx::query_scalar("SELECT id FROM runs WHERE workspace_id = $1 AND name = $2 FOR UPDATE")
        .bind(workspace)
        .bind(name)
        .fetch_optional(tx)
        .await
}

/// Deletes the run and, by cascade, its workers, their logs and mounts. Their log bytes go back
/// to the workspace's quota by the `workers_release_log_bytes` trigger (see `store::rules`).
pub async fn delete(db: impl PgExecutor<'_>, id: Uuid) -> sqlx::Result<()> {
    sqlx::query("DELETE FROM runs WHERE id = $1").bind(id).execute(db).await.map(drop)
}
