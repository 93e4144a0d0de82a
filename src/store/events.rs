//! The `worker_events` table: what happened to a worker, and why.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgExecutor;
use utoipa::ToSchema;
use uuid::Uuid;

#[derive(Debug, Clone, Serialize, ToSchema, sqlx::FromRow)]
pub struct Event {
    pub at: DateTime<Utc>,
    /// `Normal` or `Warning`.
    #[sqlx(rename = "type")]
    #[serde(rename = "type")]
    pub kind: String,
    pub reason: String,
    pub message: String,
}

pub async fn add(
    db: impl PgExecutor<'_>,
    worker: Uuid,
    kind: &str,
    reason: &str,
    message: &str,
) -> sqlx::Result<()> {
    sqlx::query("INSERT INTO worker_events (worker_id, type, reason, message) VALUES ($1, $2, $3, $4)")
        .bind(worker)
        .bind(kind)
        .bind(reason)
        .bind(message)
        .execute(db)
        .await
        .map(drop)
}

pub async fn for_worker(db: impl PgExecutor<'_>, worker: Uuid) -> sqlx::Result<Vec<Event>> {
    sqlx::query_as("SELECT at, type, reason, message FROM worker_events WHERE worker_id = $1 ORDER BY id")
        .bind(worker)
        .fetch_all(db)
        .await
}
