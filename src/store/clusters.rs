//! The `clusters` table.

use chrono::{DateTime, Utc};
use sqlx::PgExecutor;

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Cluster {
    pub name: String,
    pub created_at: DateTime<Utc>,
}

pub async fn list(db: impl PgExecutor<'_>) -> sqlx::Result<Vec<Cluster>> {
    sqlx::query_as("SELECT name, created_at FROM clusters ORDER BY name").fetch_all(db).await
}

pub async fn insert(db: impl PgExecutor<'_>, name: &str) -> sqlx::Result<Cluster> {
    sqlx::query_as("INSERT INTO clusters (name) VALUES ($1) RETURNING name, created_at")
        .bind(name)
        .fetch_one(db)
        .await
}

pub async fn exists(db: impl PgExecutor<'_>, name: &str) -> sqlx::Result<bool> {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM clusters WHERE name = $1)")
        .bind(name)
        .fetch_one(db)
        .await
}

/// A cluster's limit on fills from the origin at once, and how many are under way.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct OriginFills {
    pub cluster: String,
    pub max_origin_fills: Option<i32>,
    /// Fill runs of the cluster that run the drive's template and have not ended.
    pub running: i64,
}

/// The origin fills of `clusters`: those that exist.
pub async fn origin_fills(db: impl PgExecutor<'_>, clusters: &[String]) -> sqlx::Result<Vec<OriginFills>> {
    sqlx::query_as(
        "SELECT c.name AS cluster, c.max_origin_fills,
             (SELECT count(*) FROM runs r WHERE r.cluster = c.name AND r.fill_drive_id IS NOT NULL
                 AND r.fill_peer_manifest IS NULL AND r.state NOT IN ('Completed', 'Failed')) AS running
         FROM clusters c WHERE c.name = ANY($1) ORDER BY c.name",
    )
    .bind(clusters)
    .fetch_all(db)
    .await
}

/// Sets the cluster's limit on origin fills at once (`None`: no limit); whether it exists.
pub async fn set_max_origin_fills(
    db: impl PgExecutor<'_>,
    cluster: &str,
    max: Option<i32>,
) -> sqlx::Result<bool> {
    let done = sqlx::query("UPDATE clusters SET max_origin_fills = $2 WHERE name = $1")
        .bind(cluster)
        .bind(max)
        .execute(db)
        .await?;
    Ok(done.rows_affected() == 1)
}
