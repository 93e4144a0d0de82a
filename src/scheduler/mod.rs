//! The scheduler: places Pending workers on machines. Filters, scores and selection are pure
//! (this folder's other files); this shell reads a snapshot, binds in one transaction, and
//! leaves each unplaced worker a reason.

pub mod filter;
pub mod score;
pub mod select;
pub mod snapshot;

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::hub::Hub;
use crate::store;
use snapshot::{MachineView, Request};

/// Workers claimed per transaction.
const BATCH: i64 = 256;
/// The safety net when no notification arrives.
const RESYNC: Duration = Duration::from_secs(5);

/// Places work whenever something may have changed, until `stop`.
pub async fn run(db: PgPool, hub: Arc<Hub>, stop: CancellationToken) {
    loop {
        match tick(&db).await {
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "scheduling pass failed"),
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = hub.schedule.notified() => {}
            _ = tokio::time::sleep(RESYNC) => {}
        }
    }
}

/// Places what it can, batch after batch; returns how many workers it bound.
pub async fn tick(db: &PgPool) -> anyhow::Result<usize> {
    let mut bound = 0;
    loop {
        let (placed, claimed) = pass(db).await?;
        bound += placed;
        if claimed < BATCH as usize || placed == 0 {
            return Ok(bound);
        }
    }
}

async fn pass(db: &PgPool) -> anyhow::Result<(usize, usize)> {
    let mut tx = db.begin().await?;
    let pending = store::workers::claim_pending(&mut tx, BATCH).await?;
    if pending.is_empty() {
        return Ok((0, 0));
    }
    let mut machines: Vec<MachineView> = store::machines::list(&mut *tx)
        .await?
        .into_iter()
        .map(|m| MachineView {
            id: m.id,
            name: m.name,
            cluster: m.cluster,
            ready: m.state == "Ready",
            cpu_total: m.cpu_millis.into(),
            memory_total: m.memory_bytes,
            cpu_free: i64::from(m.cpu_millis - m.cpu_alloc),
            memory_free: m.memory_bytes - m.memory_alloc,
            gpus_free: i64::from(m.gpus - m.gpus_alloc),
        })
        .collect();
    let mut touched: Vec<Uuid> = Vec::new();
    let mut placed = 0;
    for w in &pending {
        let task = &w.spec.0.task_template;
        let request = Request {
            cluster: w.spec.0.cluster.to_string(),
            cpu_millis: task.requested_resources.cpu_cores.millis().into(),
            memory_bytes: task.requested_resources.memory_bytes as i64,
            gpus: task.requested_resources.gpus.into(),
            selection: task.requested_resources.node_selection.clone(),
        };
        match select::select(&machines, &request) {
            Ok(i) => {
                let m = &mut machines[i];
                let (released, reason) = match w.placed_drives.first() {
                    None => (true, format!("Starting on {}", m.name)),
                    Some(drive) => (false, format!("Waiting for drive {drive} to be filled on {}", m.name)),
                };
                if store::workers::bind(&mut tx, w.id, m.id, released, &reason).await? {
                    m.take(&request);
                    touched.push(m.id);
                    placed += 1;
                }
            }
            Err(why) => {
                if w.reason != why {
                    store::workers::set_pending_reason(&mut *tx, w.id, &why).await?;
                }
            }
        }
    }
    touched.sort();
    touched.dedup();
    store::machines::touch_assignments(&mut *tx, &touched).await?;
    tx.commit().await?;
    Ok((placed, pending.len()))
}
