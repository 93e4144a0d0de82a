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
