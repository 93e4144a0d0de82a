//! The `events` table: what happened to an object and why, folded by count, expiring.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgExecutor;
use utoipa::ToSchema;
use uuid::Uuid;

#[derive(Debug, Clone, Serialize, ToSchema, sqlx::FromRow)]
pub struct Event {
    /// `run`, `worker`, `drive` or `machine`.
    pub object_kind: String,
    pub object_name: String,
    /// `Normal` or `Warning`.
    #[sqlx(rename = "type")]
    #[serde(rename = "type")]
    pub kind: String,
    pub reason: String,
    pub message: String,
    /// Who decided: `scheduler`, `fill-controller`, `liveness`, `api`, `agent/<machine>`.
    pub source: String,
    /// How many times it happened; repeats fold into one event.
    pub count: i32,
    pub first_at: DateTime<Utc>,
    pub last_at: DateTime<Utc>,
}

/// An event about to be recorded.
pub struct New<'a> {
    /// `None` for organisation objects (machines).
    pub workspace: Option<Uuid>,
    pub object_kind: &'a str,
    pub object_name: &'a str,
    pub warning: bool,
    pub reason: &'a str,
    pub message: &'a str,
    pub source: &'a str,
}

/// Records the event, or counts it again when the same one was recorded before.
pub async fn record(db: impl PgExecutor<'_>, e: &New<'_>) -> sqlx::Result<()> {
    record_all(db, std::slice::from_ref(e)).await
}

/// Records many events in one statement (each counted again when recorded before). No two may
/// be the same event.
pub async fn record_all<'a>(db: impl PgExecutor<'_>, events: &[New<'a>]) -> sqlx::Result<()> {
    if events.is_empty() {
        return Ok(());
    }
    let col = |f: fn(&New<'a>) -> &'a str| events.iter().map(f).collect::<Vec<&str>>();
    let workspaces: Vec<Option<Uuid>> = events.iter().map(|e| e.workspace).collect();
    let types = col(|e| if e.warning { "Warning" } else { "Normal" });
    sqlx::query(
        "INSERT INTO events (workspace_id, object_kind, object_name, type, reason, message, source)
         SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[])
         ON CONFLICT (COALESCE(workspace_id, '00000000-0000-0000-0000-000000000000'::uuid),
                      object_kind, object_name, reason, message)
         DO UPDATE SET count = events.count + 1, last_at = now(), source = EXCLUDED.source",
    )
    .bind(&workspaces)
    .bind(col(|e| e.object_kind))
    .bind(col(|e| e.object_name))
    .bind(&types)
    .bind(col(|e| e.reason))
    .bind(col(|e| e.message))
    .bind(col(|e| e.source))
    .execute(db)
    .await
    .map(drop)
}

/// Records an event on the drive with this id.
pub async fn record_for_drive(
    db: impl PgExecutor<'_>,
    drive: Uuid,
    warning: bool,
    reason: &str,
    message: &str,
    source: &str,
) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO events (workspace_id, object_kind, object_name, type, reason, message, source)
         SELECT workspace_id, 'drive', name, $2, $3, $4, $5 FROM drives WHERE id = $1
         ON CONFLICT (COALESCE(workspace_id, '00000000-0000-0000-0000-000000000000'::uuid),
                      object_kind, object_name, reason, message)
         DO UPDATE SET count = events.count + 1, last_at = now(), source = EXCLUDED.source",
    )
    .bind(drive)
    .bind(if warning { "Warning" } else { "Normal" })
    .bind(reason)
    .bind(message)
    .bind(source)
    .execute(db)
    .await
    .map(drop)
}

const COLUMNS: &str = "object_kind, object_name, type, reason, message, source, count, first_at, last_at";

/// Events of one object, oldest first. A run's include its workers' (`<run>-<index>`).
pub async fn for_object(
    db: impl PgExecutor<'_>,
    workspace: Uuid,
    kind: &str,
    name: &str,
    limit: i64,
) -> sqlx::Result<Vec<Event>> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM (
             SELECT * FROM events
             WHERE (workspace_id = $1 OR workspace_id IS NULL)
               AND ((object_kind = $2 AND object_name = $3)
                    OR ($2 = 'run' AND object_kind = 'worker' AND starts_with(object_name, $3 || '-')
                        AND substr(object_name, length($3) + 2) ~ '^[0-9]+$'))
             ORDER BY last_at DESC, id DESC LIMIT $4) e
         ORDER BY last_at, object_name"
    ))
    .bind(workspace)
    .bind(kind)
    .bind(name)
    .bind(limit)
    .fetch_all(db)
    .await
}

/// Removes events not seen for `age`.
pub async fn expire(db: impl PgExecutor<'_>, age: std::time::Duration) -> sqlx::Result<u64> {
    let done = sqlx::query("DELETE FROM events WHERE last_at < now() - make_interval(secs => $1)")
        .bind(age.as_secs_f64())
        .execute(db)
        .await?;
    Ok(done.rows_affected())
}
