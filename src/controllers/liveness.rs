//! Liveness: machines that miss heartbeats go NotReady, and their workers fail with a reason.

use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

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
    let mut lost = 0;
    for (id, name) in store::machines::silent(db, grace).await? {
        let mut tx = db.begin().await?;
        let reason = format!("machine {name} stopped responding (no heartbeat for {}s)", grace.as_secs());
        fail_workers_on(&mut tx, id, &reason).await?;
        if !store::machines::mark_not_ready(&mut *tx, id, grace).await? {
            // It spoke up meanwhile: leave its workers be.
            tx.rollback().await?;
            continue;
        }
        tracing::warn!(machine = %name, "no heartbeat within the grace period: NotReady");
        let event = store::events::New {
            workspace: None,
            object_kind: "machine",
            object_name: &name,
            warning: true,
            reason: "NotReady",
            message: &format!("no heartbeat for {}s", grace.as_secs()),
            source: "liveness",
        };
        store::events::record(&mut *tx, &event).await?;
        store::machines::touch_assignments(&mut *tx, &[id]).await?;
        tx.commit().await?;
        lost += 1;
    }
    Ok(lost)
}

/// Fails the machine's workers that have not ended, with `reason`; returns how many.
pub async fn fail_workers_on(
    tx: &mut sqlx::PgConnection,
    machine: Uuid,
    reason: &str,
) -> sqlx::Result<usize> {
    let workers = store::workers::live_on_machine(&mut *tx, machine).await?;
    fail(tx, &workers, reason).await
}

/// Fails the fills that pull from `holder`'s copies, which is going away: each is filled from
/// the origin at once (see `controllers::fill`), not once its retries find nobody. Their
/// machines are told at once, and stop their pulls.
pub async fn fail_pulls_from(tx: &mut sqlx::PgConnection, holder: Uuid, reason: &str) -> sqlx::Result<usize> {
    let pulls = store::workers::live_pulling_from(&mut *tx, holder).await?;
    let workers: Vec<Uuid> = pulls.iter().map(|(w, _)| *w).collect();
    let failed = fail(tx, &workers, reason).await?;
    let machines: Vec<Uuid> = pulls.iter().filter_map(|(_, m)| *m).collect();
    store::machines::touch_assignments(&mut *tx, &machines).await?;
    Ok(failed)
}

async fn fail(tx: &mut sqlx::PgConnection, workers: &[Uuid], reason: &str) -> sqlx::Result<usize> {
    let mut failed = 0;
    // Runs, then workers, then the machine: the order every transaction locks in.
    for &worker in workers {
        let Some(run) = store::workers::lock_run_of(&mut *tx, worker).await? else { continue };
        if store::workers::finish(&mut *tx, worker, None, WorkerState::Failed, reason, None).await?.is_some()
        {
            store::workers::refresh_run(&mut *tx, run).await?;
            hub::worker_ended(&mut *tx, worker).await?;
            failed += 1;
        }
    }
    Ok(failed)
}
