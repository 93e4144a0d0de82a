//! The `workspaces` table.

use chrono::{DateTime, Utc};
use sqlx::PgExecutor;
use uuid::Uuid;

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Workspace {
    pub id: Uuid,
    pub name: String,
    pub created_at: DateTime<Utc>,
}

/// Returns the workspace, creating it when missing.
pub async fn ensure(db: impl PgExecutor<'_>, name: &str) -> sqlx::Result<Workspace> {
    sqlx::query_as(
        "WITH ins AS (
             INSERT INTO workspaces (id, name) VALUES ($1, $2)
             ON CONFLICT ON CONSTRAINT workspaces_name_key DO NOTHING
             RETURNING id, name, created_at)
         SELECT * FROM ins
         UNION ALL SELECT id, name, created_at FROM workspaces WHERE name = $2
         LIMIT 1",
    )
    .bind(Uuid::now_v7())
    .bind(name)
    .fetch_one(db)
    .await
}

pub async fn insert(db: impl PgExecutor<'_>, name: &str) -> sqlx::Result<Workspace> {
    sqlx::query_as("INSERT INTO workspaces (id, name) VALUES ($1, $2) RETURNING id, name, created_at")
        .bind(Uuid::now_v7())
        .bind(name)
        .fetch_one(db)
        .await
}

pub async fn by_name(db: impl PgExecutor<'_>, name: &str) -> sqlx::Result<Option<Workspace>> {
    sqlx::query_as("SELECT id, name, created_at FROM workspaces WHERE name = $1")
        .bind(name)
        .fetch_optional(db)
        .await
}

pub async fn list(db: impl PgExecutor<'_>) -> sqlx::Result<Vec<Workspace>> {
    sqlx::query_as("SELECT id, name, created_at FROM workspaces ORDER BY name").fetch_all(db).await
}
