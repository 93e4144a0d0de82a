//! The `worker_logs` table: each worker's output, bounded, oldest lines dropped first.

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgExecutor};
use uuid::Uuid;

/// Lines kept per worker.
pub const MAX_LINES: i64 = 20_000;

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct LogRecord {
    pub id: i64,
    pub at: DateTime<Utc>,
    pub stream: String,
    pub line: String,
}

/// Appends lines and drops the oldest past [`MAX_LINES`], counting what was dropped.
pub async fn append(
    tx: &mut PgConnection,
    worker: Uuid,
    streams: &[String],
    lines: &[String],
) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO worker_logs (worker_id, stream, line) SELECT $1, s, l FROM unnest($2::text[], $3::text[]) AS x(s, l)",
    )
    .bind(worker)
    .bind(streams)
    .bind(lines)
    .execute(&mut *tx)
    .await?;
    let total: i64 =
        sqlx::query_scalar("UPDATE workers SET log_lines = log_lines + $2 WHERE id = $1 RETURNING log_lines")
            .bind(worker)
            .bind(lines.len() as i64)
            .fetch_one(&mut *tx)
            .await?;
    if total > MAX_LINES {
        let over = total - MAX_LINES;
        sqlx::query(
            "WITH old AS (SELECT id FROM worker_logs WHERE worker_id = $1 ORDER BY id LIMIT $2),
             gone AS (DELETE FROM worker_logs WHERE id IN (SELECT id FROM old) RETURNING 1)
             UPDATE workers SET log_lines = log_lines - (SELECT count(*) FROM gone),
                 log_dropped = log_dropped + (SELECT count(*) FROM gone)
             WHERE id = $1",
        )
        .bind(worker)
        .bind(over)
        .execute(&mut *tx)
        .await?;
    }
    crate::hub::worker_changed(&mut *tx, worker).await?;
    Ok(())
}

/// Lines after `after` (a line id), oldest first.
pub async fn after(
    db: impl PgExecutor<'_>,
    worker: Uuid,
    after: i64,
    limit: i64,
) -> sqlx::Result<Vec<LogRecord>> {
    sqlx::query_as(
        "SELECT id, at, stream, line FROM worker_logs WHERE worker_id = $1 AND id > $2 ORDER BY id LIMIT $3",
    )
    .bind(worker)
    .bind(after)
    .bind(limit)
    .fetch_all(db)
    .await
}

/// How many lines were dropped to keep the bound.
pub async fn dropped(db: impl PgExecutor<'_>, worker: Uuid) -> sqlx::Result<i64> {
    sqlx::query_scalar("SELECT log_dropped FROM workers WHERE id = $1").bind(worker).fetch_one(db).await
}

/// The line id to read after so that only the last `n` lines follow.
pub async fn tail_start(db: impl PgExecutor<'_>, worker: Uuid, n: i64) -> sqlx::Result<i64> {
    sqlx::query_scalar(
        "SELECT COALESCE(min(id) - 1, 0) FROM
             (SELECT id FROM worker_logs WHERE worker_id = $1 ORDER BY id DESC LIMIT $2) last",
    )
    .bind(worker)
    .bind(n)
    .fetch_one(db)
    .await
}
