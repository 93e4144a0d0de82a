//! The `changes` table: every change to a watched object, in one global order. Only the
//! change-log triggers (`runs_changed`, `workers_modified`, `copies_modified` and their kin, see
//! `store::rules`) write it; these functions read and compact it.

use chrono::{DateTime, Utc};
use sqlx::PgExecutor;
use uuid::Uuid;

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Change {
    pub version: i64,
    pub name: String,
    /// `ADDED`, `MODIFIED` or `DELETED`.
    #[sqlx(rename = "type")]
    pub kind: String,
    pub at: DateTime<Utc>,
}

/// A change as the replica's feed reads it: of any watched kind, in any workspace.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Recorded {
    pub version: i64,
    /// The list it belongs to: `runs`, `drives`, `machines` or `secrets`.
    pub kind: String,
    /// `None` for objects of the organisation (machines), seen by every workspace.
    pub workspace_id: Option<Uuid>,
    pub name: String,
    /// `ADDED`, `MODIFIED` or `DELETED`.
    #[sqlx(rename = "type")]
    pub change: String,
}

/// Changes to objects of `kinds` after `version`, oldest first, whoever they belong to.
pub async fn since(
    db: impl PgExecutor<'_>,
    kinds: &[&str],
    version: i64,
    limit: i64,
) -> sqlx::Result<Vec<Recorded>> {
    sqlx::query_as(
        "SELECT version, kind, workspace_id, name, type FROM changes
         WHERE version > $1 AND kind = ANY($2) ORDER BY version LIMIT $3",
    )
    .bind(version)
    .bind(kinds)
    .bind(limit)
    .fetch_all(db)
    .await
}

/// Changes to objects of `kind` visible to the workspace, after `version` and at most `upto`,
/// oldest first.
pub async fn between(
    db: impl PgExecutor<'_>,
    kind: &str,
    workspace: Uuid,
    version: i64,
    upto: i64,
    limit: i64,
) -> sqlx::Result<Vec<Change>> {
    sqlx::query_as(
        "SELECT version, name, type, at FROM changes
         WHERE kind = $1 AND (workspace_id = $2 OR workspace_id IS NULL) AND version > $3 AND version <= $4
         ORDER BY version LIMIT $5",
    )
    .bind(kind)
    .bind(workspace)
    .bind(version)
    .bind(upto)
    .bind(limit)
    .fetch_all(db)
    .await
}

/// The newest version, for a list to hand to a watch.
pub async fn latest(db: impl PgExecutor<'_>) -> sqlx::Result<i64> {
    sqlx::query_scalar("SELECT COALESCE(max(version), (SELECT version FROM changes_compacted)) FROM changes")
        .fetch_one(db)
        .await
}

/// Versions at or below this are gone.
pub async fn compacted(db: impl PgExecutor<'_>) -> sqlx::Result<i64> {
    sqlx::query_scalar("SELECT version FROM changes_compacted").fetch_one(db).await
}

/// Drops changes older than `age`, remembering the newest version dropped.
pub async fn compact(db: impl PgExecutor<'_>, age: std::time::Duration) -> sqlx::Result<()> {
    sqlx::query(
        "WITH gone AS (DELETE FROM changes WHERE at < now() - make_interval(secs => $1) RETURNING version)
         UPDATE changes_compacted SET version = GREATEST(version, (SELECT max(version) FROM gone))
         WHERE EXISTS (SELECT 1 FROM gone)",
    )
    .bind(age.as_secs_f64())
    .execute(db)
    .await
    .map(drop)
}
