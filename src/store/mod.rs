//! Postgres access: one file per table; each query takes an executor and returns domain types.
//! The rules that live in Postgres, its triggers, are listed in [`rules`](crate::store::rules).

pub mod changes;
pub mod clusters;
pub mod copies;
pub mod drives;
pub mod events;
pub mod fills;
pub mod grants;
pub mod join_tokens;
pub mod logs;
pub mod machines;
pub mod rules;
pub mod runs;
pub mod secrets;
pub mod tokens;
pub mod workers;
pub mod workspaces;

use std::time::Duration;

use anyhow::Context;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgPool};

pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// Postgres ends a session that holds a transaction open this long without a statement, and
/// with it the transaction and its locks. That fences a paused or partitioned replica: its
/// late writes are rolled back, and the others are not kept waiting on its locks.
pub const IDLE_IN_TRANSACTION: &str = "5s";
/// No statement waits longer than this; the caller gets an error, never a hang.
const STATEMENT_TIMEOUT: &str = "60s";

/// A pooled connection idle longer than this is pinged before use.
const PING_AFTER_IDLE: Duration = Duration::from_secs(10);

/// Opens a pool and brings the schema up to date.
pub async fn connect(url: &str, max_connections: u32) -> anyhow::Result<PgPool> {
    let options: PgConnectOptions = url.parse().context("DATABASE_URL is not a valid Postgres URL")?;
    let options = options
        // The process id tells replicas apart in pg_stat_activity.
        .application_name(&format!("astraeus {}", std::process::id()))
        .options([
            ("idle_in_transaction_session_timeout", IDLE_IN_TRANSACTION),
            ("statement_timeout", STATEMENT_TIMEOUT),
            // Compiling a plan costs tens of milliseconds, more than any of these queries runs.
            ("jit", "off"),
        ]);
    let pool = PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(5))
        // sqlx pings a connection on every acquire by default: a round trip per statement on
        // the busiest paths, and an acquire given up during its ping drops the connection
        // (sqlx issue #1869), which under load reopens sessions by the dozen. A busy
        // connection proves itself; only one idle a while is pinged. A session that died in
        // between fails its statement, which answers 503 and is not returned to the pool.
        .test_before_acquire(false)
        .before_acquire(|conn, meta| {
            Box::pin(async move {
                if meta.idle_for > PING_AFTER_IDLE {
                    conn.ping().await?;
                }
                Ok(true)
            })
        })
        .connect_with(options)
        .await
        .context("cannot connect to Postgres (check DATABASE_URL)")?;
    MIGRATOR.run(&pool).await.context("cannot apply database migrations")?;
    Ok(pool)
}

/// Keyset pagination over time-ordered ids (UUIDv7): newest first.
#[derive(Debug, Clone, Copy)]
pub struct Page {
    pub limit: i64,
    pub before: Option<uuid::Uuid>,
}

/// Objects by state, for gauges: `(workers|runs|machines|copies, state, count)`. All but
/// machines (as many as the fleet, and updated by every heartbeat batch) are summed from what
/// each statement appended to `state_counts` (the `*_counted_*` triggers, see [`rules`]),
/// folded first so the sum stays short.
pub async fn counts(db: &sqlx::PgPool) -> sqlx::Result<Vec<(String, String, i64)>> {
    compact_state_counts(db).await?;
    // A statement of its own: a fold running alongside has committed once ours is done, and a
    // new statement sees its rows.
    sqlx::query_as(
        "SELECT kind, state, sum(n)::bigint FROM state_counts GROUP BY kind, state HAVING sum(n) <> 0
         UNION ALL SELECT 'machines', state, count(*) FROM machines GROUP BY state",
    )
    .fetch_all(db)
    .await
}

/// Folds the rows appended to `state_counts` into one per state.
pub async fn compact_state_counts(db: impl sqlx::PgExecutor<'_>) -> sqlx::Result<()> {
    sqlx::query("SELECT compact_state_counts()").execute(db).await.map(drop)
}
