//! The `workers` table: one row per `<run>-<index>`.

use chrono::{DateTime, Utc};
use sqlx::PgExecutor;
use uuid::Uuid;

use crate::domain::run::WorkerState;

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct WorkerRecord {
    pub id: Uuid,
    pub run_id: Uuid,
    pub run_name: String,
    pub name: String,
    pub index: i32,
    pub state: WorkerState,
    pub reason: String,
    pub machine: Option<String>,
    pub exit_code: Option<i32>,
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
}

const SELECT: &str = "SELECT w.id, w.run_id, r.name AS run_name, w.name, w.index, w.state, w.reason,
        w.machine, w.exit_code, w.created_at, w.started_at, w.finished_at
    FROM workers w JOIN runs r ON r.id = w.run_id";

pub async fn for_run(db: impl PgExecutor<'_>, run: Uuid) -> sqlx::Result<Vec<WorkerRecord>> {
    sqlx::query_as(&format!("{SELECT} WHERE w.run_id = $1 ORDER BY w.index")).bind(run).fetch_all(db).await
}

pub async fn get(db: impl PgExecutor<'_>, workspace: Uuid, name: &str) -> sqlx::Result<Option<WorkerRecord>> {
    sqlx::query_as(&format!("{SELECT} WHERE w.workspace_id = $1 AND w.name = $2"))
        .bind(workspace)
        .bind(name)
        .fetch_optional(db)
        .await
}

/// Workers that mount the drive and have not ended, oldest first.
pub async fn using_drive(db: impl PgExecutor<'_>, drive: Uuid) -> sqlx::Result<Vec<WorkerRecord>> {
    sqlx::query_as(&format!(
        "{SELECT} JOIN run_mounts m ON m.run_id = w.run_id
         WHERE m.drive_id = $1 AND w.state NOT IN ('Completed', 'Failed') ORDER BY w.id"
    ))
    .bind(drive)
    .fetch_all(db)
    .await
}
