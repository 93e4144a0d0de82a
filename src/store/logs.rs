//! The `worker_logs` table: each worker's output, bounded in bytes per worker and per workspace
//! (the first bytes are kept), and in lines (the oldest are dropped).

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgExecutor};
use uuid::Uuid;

use crate::domain::log_budget::{self, Cut, Limits, Spent};

/// Lines kept per worker.
pub const MAX_LINES: i64 = 20_000;

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct LogRecord {
    pub id: i64,
    pub at: DateTime<Utc>,
    pub stream: String,
    pub line: String,
}

/// Appends what fits of an upload and drops the oldest lines past [`MAX_LINES`], counting what
/// was dropped. What fits is decided with the worker's row and then its workspace's locked (in
/// that order, as the deletion trigger `workers_release_log_bytes` of migration 0022 takes them),
/// so concurrent uploads cannot overshoot either bound. False when the worker is gone.
pub async fn append(
    tx: &mut PgConnection,
    worker: Uuid,
    streams: &[String],
    lines: &[String],
    limits: Limits,
) -> sqlx::Result<bool> {
    let found: Option<(i64, Option<Cut>, Uuid)> =
        sqlx::query_as("SELECT log_taken, log_cut, workspace_id FROM workers WHERE id = $1 FOR UPDATE")
            .bind(worker)
            .fetch_optional(&mut *tx)
            .await?;
    let Some((taken, cut, workspace)) = found else { return Ok(false) };
    let (name, kept): (String, i64) =
        sqlx::query_as("SELECT name, log_bytes FROM workspaces WHERE id = $1 FOR UPDATE")
            .bind(workspace)
            .fetch_one(&mut *tx)
            .await?;
    let sizes: Vec<u64> = lines.iter().map(|l| log_budget::cost(l)).collect();
    let spent = Spent { worker_taken: unsigned(taken), workspace_kept: unsigned(kept), cut };
    let plan = log_budget::plan(&sizes, spent, limits, &name);

    let mut streams = streams[..plan.keep].to_vec();
    let mut lines = lines[..plan.keep].to_vec();
    let mut stored = plan.bytes;
    if let Some(note) = &plan.note {
        stored += log_budget::cost(note);
        streams.push("stderr".to_owned());
        lines.push(note.clone());
    }
    if !lines.is_empty() {
        sqlx::query(
            "INSERT INTO worker_logs (worker_id, stream, line) SELECT $1, s, l FROM unnest($2::text[], $3::text[]) AS x(s, l)",
        )
        .bind(worker)
        .bind(&streams)
        .bind(&lines)
        .execute(&mut *tx)
        .await?;
    }
    let total: i64 = sqlx::query_scalar(
        "UPDATE workers SET log_lines = log_lines + $2, log_taken = log_taken + $3, log_bytes = log_bytes + $4,
             log_refused = log_refused + $5, log_cut = $6
         WHERE id = $1 RETURNING log_lines",
    )
    .bind(worker)
    .bind(lines.len() as i64)
    .bind(signed(plan.bytes))
    .bind(signed(stored))
    .bind((sizes.len() - plan.keep) as i64)
    .bind(plan.cut)
    .fetch_one(&mut *tx)
    .await?;
    if stored > 0 {
        sqlx::query("UPDATE workspaces SET log_bytes = log_bytes + $2 WHERE id = $1")
            .bind(workspace)
            .bind(signed(stored))
            .execute(&mut *tx)
            .await?;
    }
    if total > MAX_LINES {
        sqlx::query(
            "WITH old AS (SELECT id FROM worker_logs WHERE worker_id = $1 ORDER BY id LIMIT $2),
             gone AS (DELETE FROM worker_logs WHERE id IN (SELECT id FROM old) RETURNING octet_length(line) + 1 AS bytes),
             freed AS (SELECT count(*) AS lines, COALESCE(sum(bytes), 0) AS bytes FROM gone),
             w AS (UPDATE workers SET log_lines = log_lines - f.lines, log_dropped = log_dropped + f.lines,
                       log_bytes = log_bytes - f.bytes
                   FROM freed f WHERE id = $1 RETURNING 1)
             UPDATE workspaces SET log_bytes = log_bytes - f.bytes FROM freed f WHERE id = $3",
        )
        .bind(worker)
        .bind(total - MAX_LINES)
        .bind(workspace)
        .execute(&mut *tx)
        .await?;
    }
    if !lines.is_empty() {
        crate::hub::worker_changed(&mut *tx, worker).await?;
    }
    Ok(true)
}

fn unsigned(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

fn signed(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
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

/// How many of the earliest lines were dropped to keep [`MAX_LINES`].
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
