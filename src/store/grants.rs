//! The `host_path_grants` table: host paths a workspace may use on a cluster.

use sqlx::{PgConnection, PgExecutor};
use uuid::Uuid;

pub async fn list(db: impl PgExecutor<'_>, workspace: Uuid, cluster: &str) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar(
        "SELECT path FROM host_path_grants WHERE workspace_id = $1 AND cluster = $2 ORDER BY path",
    )
    .bind(workspace)
    .bind(cluster)
    .fetch_all(db)
    .await
}

/// Replaces the workspace's grants on `cluster` with `paths`.
pub async fn replace(
    tx: &mut PgConnection,
    workspace: Uuid,
    cluster: &str,
    paths: &[String],
) -> sqlx::Result<()> {
    sqlx::query("DELETE FROM host_path_grants WHERE workspace_id = $1 AND cluster = $2")
        .bind(workspace)
        .bind(cluster)
        .execute(&mut *tx)
        .await?;
    sqlx::query(
        "INSERT INTO host_path_grants (workspace_id, cluster, path)
         SELECT $1, $2, unnest($3::text[])",
    )
    .bind(workspace)
    .bind(cluster)
    .bind(paths)
    .execute(&mut *tx)
    .await?;
    Ok(())
}
