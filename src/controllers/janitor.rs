//! Housekeeping: old events expire, the change log behind watches is compacted, the counts of
//! workers, copies and runs by state are folded, and idle tokens and
//! addresses leave the rate limiters.

use std::net::IpAddr;
use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::api::limit::Limiter;
use crate::store;

/// Events not seen for an hour go.
const EVENT_AGE: Duration = Duration::from_secs(3600);
/// Watches can resume from changes of the last 15 minutes; older ones answer 410.
const CHANGE_AGE: Duration = Duration::from_secs(900);
const EVERY: Duration = Duration::from_secs(60);

pub async fn run(db: PgPool, limiters: (Limiter, Limiter<IpAddr>), stop: CancellationToken) {
    loop {
        limiters.0.forget_idle();
        limiters.1.forget_idle();
        if let Err(e) = tick(&db).await {
            tracing::warn!(error = %e, "housekeeping failed");
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(EVERY) => {}
        }
    }
}

pub async fn tick(db: &PgPool) -> anyhow::Result<()> {
    store::events::expire(db, EVENT_AGE).await?;
    store::changes::compact(db, CHANGE_AGE).await?;
    // Folded on each scrape too; this bounds them on a server nobody scrapes.
    store::compact_state_counts(db).await?;
    Ok(())
}
