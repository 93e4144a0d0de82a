//! Liveness: machines that miss heartbeats go NotReady, and their workers fail with a reason.

use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::domain::run::WorkerState;
use crate::hub;
use crate::store;

pub async fn run(db: PgPool, grace: Duration, stop: CancellationToken) {
    let every = (grace / 4).max(Duration::from_millis(250));
    loop {
        if let Err(e) = tick(&db, grace).await {
            tracing::warn!(error = %e, "liveness pass failed");
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
    }
}

/// Marks silent machines NotReady and fails their live workers; returns how many machines.
pub async fn tick(db: &PgPool, grace: Duration) -> anyhow::Result<usize> {
    let mut tx = db.begin().await?;
    let lost = store::machines::mark_unresponsive(&mut *tx, grace).await?;
    for m in &lost {
        tracing::warn!(machine = %m.name, "no heartbeat within the grace period: NotReady");
        let reason = format!("machine {} stopped responding (no heartbeat for {}s)", m.name, grace.as_secs());
        let event = store::events::New {
            workspace: None,
            object_kind: "machine",
            object_name: &m.name,
            warning: true,
            reason: "NotReady",
            message: &format!("no heartbeat for {}s", grace.as_secs()),
            source: "liveness",
        };
        store::events::record(&mut *tx, &event).await?;
        for worker in store::workers::live_on_machine(&mut *tx, m.id).await? {
            if let Some(run) =
                store::workers::finish(&mut tx, worker, None, WorkerState::Failed, &reason, None).await?
            {
                store::workers::refresh_run(&mut tx, run).await?;
                hub::worker_changed(&mut *tx, worker).await?;
            }
        }
    }
    if !lost.is_empty() {
        let ids: Vec<_> = lost.iter().map(|m| m.id).collect();
        store::machines::touch_assignments(&mut *tx, &ids).await?;
    }
    tx.commit().await?;
    Ok(lost.len())
}
