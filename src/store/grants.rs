//! The `host_path_grants` table: host paths a workspace may use on a cluster, and how.

use std::collections::HashMap;

use sqlx::{PgConnection, PgExecutor};
use uuid::Uuid;

use crate::domain::grant::Grant;
use crate::domain::path::AbsPath;
use crate::domain::task::Mode;

/// Rows whose path no longer parses are left out: they grant nothing.
fn grants(rows: Vec<(String, Mode)>) -> Vec<Grant> {
    rows.into_iter().filter_map(|(p, mode)| Some(Grant { path: AbsPath::parse(&p).ok()?, mode })).collect()
}

pub async fn list(db: impl PgExecutor<'_>, workspace: Uuid, cluster: &str) -> sqlx::Result<Vec<Grant>> {
    let rows = sqlx::query_as(
        "SELECT path, mode FROM host_path_grants WHERE workspace_id = $1 AND cluster = $2 ORDER BY path",
    )
    .bind(workspace)
    .bind(cluster)
    .fetch_all(db)
    .await?;
    Ok(grants(rows))
}

/// The grants of each (workspace, cluster) pair asked for, in one statement; a pair without
/// grants is absent.
pub async fn of_many(
    db: impl PgExecutor<'_>,
    pairs: &[(Uuid, String)],
) -> sqlx::Result<HashMap<(Uuid, String), Vec<Grant>>> {
    if pairs.is_empty() {
        return Ok(HashMap::new());
    }
    let (workspaces, clusters): (Vec<Uuid>, Vec<String>) = pairs.iter().cloned().unzip();
    let rows: Vec<(Uuid, String, String, Mode)> = sqlx::query_as(
        "SELECT g.workspace_id, g.cluster, g.path, g.mode
         FROM host_path_grants g
         JOIN (SELECT DISTINCT * FROM unnest($1::uuid[], $2::text[])) AS t(workspace_id, cluster)
           ON t.workspace_id = g.workspace_id AND t.cluster = g.cluster",
    )
    .bind(&workspaces)
    .bind(&clusters)
    .fetch_all(db)
    .await?;
    let mut by_pair: HashMap<(Uuid, String), Vec<Grant>> = HashMap::new();
    for (ws, cluster, path, mode) in rows {
        by_pair.entry((ws, cluster)).or_default().extend(grants(vec![(path, mode)]));
    }
    Ok(by_pair)
}

/// Replaces the workspace's grants on `cluster` with `grants` (one per path).
pub async fn replace(
    tx: &mut PgConnection,
    workspace: Uuid,
    cluster: &str,
    grants: &[Grant],
) -> sqlx::Result<()> {
    sqlx::query("DELETE FROM host_path_grants WHERE workspace_id = $1 AND cluster = $2")
        .bind(workspace)
        .bind(cluster)
        .execute(&mut *tx)
        .await?;
    let paths: Vec<&str> = grants.iter().map(|g| g.path.as_str()).collect();
    let modes: Vec<Mode> = grants.iter().map(|g| g.mode).collect();
    sqlx::query(
        "INSERT INTO host_path_grants (workspace_id, cluster, path, mode)
         SELECT $1, $2, t.path, t.mode FROM unnest($3::text[], $4::text[]) AS t(path, mode)",
    )
    .bind(workspace)
    .bind(cluster)
    .bind(&paths)
    .bind(&modes)
    .execute(&mut *tx)
    .await?;
    Ok(())
}
