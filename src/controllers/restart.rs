//! Restarts: a worker waiting out its backoff (`restart_policy: OnFailure`) is listed to its
//! machine's agent again once the backoff has passed, and the agent is woken to start it.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::store;

/// How late a restart may start past its backoff: small beside the shortest backoff (10 s).
const EVERY: Duration = Duration::from_secs(1);

pub async fn run(db: PgPool, stop: CancellationToken) {
    loop {
        if let Err(e) = tick(&db, Utc::now()).await {
            tracing::warn!(error = %e, "restart pass failed");
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(EVERY) => {}
        }
    }
}

/// Lists again the workers whose backoff ended by `now`; returns how many machines were woken.
/// One statement on `workers_restart_due_idx`: with nothing due it reads no rows.
pub async fn tick(db: &PgPool, now: DateTime<Utc>) -> sqlx::Result<usize> {
    Ok(store::workers::restart_due(db, now).await?.len())
}
