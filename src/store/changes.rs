//! The `changes` table: every change to a watched object, in one global order (triggers write it).

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

/// Changes to objects of `kind` visible to the workspace, after `version`, oldest first.
pub async fn after(
    db: impl PgExecutor<'_>,
    kind: &str,
    workspace: Uuid,
    version: i64,
    limit: i64,
) -> sqlx::Result<Vec<Change>> {
    sqlx::query_as(
        "SELECT version, name, type, at FROM changes
         WHERE kind = $1 AND (workspace_id = $2 OR workspace_id IS NULL) AND version > $3
         ORDER BY version LIMIT $4",
    )
    .bind(kind)
    .bind(workspace)
    .bind(version)
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
