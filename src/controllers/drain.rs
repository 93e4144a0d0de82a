//! Drains: a draining machine's waiting workers go elsewhere at once; its running workers have
//! until the deadline, when those left fail with a reason that says so. A machine with nothing
//! left is drained, and stays cordoned until an organisation admin makes it eligible again.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::liveness::fail_workers_on;
use crate::hub;
use crate::store;

const EVERY: Duration = Duration::from_secs(2);

pub async fn run(db: PgPool, stop: CancellationToken) {
    loop {
        if let Err(e) = tick(&db).await {
            tracing::warn!(error = %e, "drain pass failed");
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(EVERY) => {}
        }
    }
}

/// Begins draining the machine, inside the caller's transaction: it is cordoned, and its
/// workers that have not started are placed again elsewhere.
pub async fn begin(
    tx: &mut PgConnection,
    machine: Uuid,
    name: &str,
    deadline: DateTime<Utc>,
) -> sqlx::Result<store::machines::MachineRecord> {
    let reason = format!("machine {name} is draining: placing again elsewhere");
    for run in store::workers::unbind_waiting(&mut *tx, machine, &reason).await? {
        store::workers::refresh_locked_run(&mut *tx, run).await?;
    }
    let record = store::machines::start_drain(&mut *tx, machine, deadline).await?;
    let message = format!("its running workers have until {}", deadline.to_rfc3339());
    record_event(&mut *tx, name, "Draining", &message).await?;
    hub::request_schedule(&mut *tx).await?;
    Ok(record)
}

/// Ends the drains with nothing left, and fails what is left on those past their deadline;
/// returns how many drains ended.
pub async fn tick(db: &PgPool) -> anyhow::Result<usize> {
    let mut ended = 0;
    for m in store::machines::draining(db).await? {
        if m.live > 0 && !m.overdue {
            continue;
        }
        let mut tx = db.begin().await?;
        let reason = format!(
            "machine {} was drained by an organisation admin: its workers had until {}",
            m.name,
            m.deadline.to_rfc3339()
        );
        let failed = fail_workers_on(&mut tx, m.id, &reason).await?;
        if !store::machines::end_drain(&mut *tx, m.id, m.deadline).await? {
            // Made eligible or drained again meanwhile.
            tx.rollback().await?;
            continue;
        }
        let message = match failed {
            0 => "no workers left; the machine stays cordoned".to_owned(),
            n => format!("{n} workers failed at the deadline; the machine stays cordoned"),
        };
        record_event(&mut *tx, &m.name, "Drained", &message).await?;
        store::machines::touch_assignments(&mut *tx, &[m.id]).await?;
        tx.commit().await?;
        ended += 1;
    }
    Ok(ended)
}

pub async fn record_event(
    db: impl sqlx::PgExecutor<'_>,
    machine: &str,
    reason: &str,
    message: &str,
) -> sqlx::Result<()> {
    let event = store::events::New {
        workspace: None,
        object_kind: "machine",
        object_name: machine,
        warning: false,
        reason,
        message,
        source: "api",
    };
    store::events::record(db, &event).await
}
