//! Eviction under pressure: a data location over its limit, or a disk with less free than the
//! reserve its agent reports, gives back room by evicting its unused, evictable, whole copies,
//! least recently used first (a copy in use is never taken). Placement evicts too, but only
//! when a new copy needs room.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::domain::quantity::human_bytes;
use crate::scheduler::evict;
use crate::scheduler::snapshot::CopyView;
use crate::store::{self, copies::Pressed};

const EVERY: Duration = Duration::from_secs(10);

pub async fn run(db: PgPool, stop: CancellationToken) {
    loop {
        if let Err(e) = tick(&db).await {
            tracing::warn!(error = %e, "eviction under pressure failed");
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(EVERY) => {}
        }
    }
}

/// How many bytes the machine must give back, and why, in words; `None` when none.
pub fn excess(p: &Pressed) -> Option<(i64, String)> {
    let over_limit = p.limit_bytes.map_or(0, |l| p.bytes - l);
    let under_reserve = p.reserve_bytes - p.free_bytes;
    if over_limit <= 0 && under_reserve <= 0 {
        return None;
    }
    Some(if over_limit >= under_reserve {
        let limit = human_bytes(p.limit_bytes.unwrap_or(0).max(0) as u64);
        (
            over_limit,
            format!("its data location held {} over its limit of {limit}", human_bytes(over_limit as u64)),
        )
    } else {
        let reserve = human_bytes(p.reserve_bytes.max(0) as u64);
        (
            under_reserve,
            format!(
                "its disk had {} free, under its reserve of {reserve}",
                human_bytes(p.free_bytes.max(0) as u64)
            ),
        )
    })
}

/// Evicts on every machine under pressure; returns how many copies.
pub async fn tick(db: &PgPool) -> anyhow::Result<usize> {
    let mut evicted = 0;
    let pressed = store::copies::under_pressure(db).await?;
    if !pressed.iter().any(|p| excess(p).is_some()) {
        return Ok(0);
    }
    // The same weighing as the scheduler's: the queue's drives last, a refill's bytes weighed
    // with recency. The queue is read once a round, for every machine under pressure.
    let queued: BTreeSet<Uuid> = store::copies::queued_drives(db).await?.into_iter().collect();
    for p in pressed {
        let Some((need, why)) = excess(&p) else { continue };
        let mut tx = db.begin().await?;
        let copies: HashMap<Uuid, CopyView> = store::copies::on_machine_for_eviction(&mut *tx, p.machine_id)
            .await?
            .into_iter()
            .map(|c| (c.drive_id, evict::view(&c, false)))
            .collect();
        let gone = evict::plan_weighing(&copies, need, &queued, Some(chrono::Utc::now()));
        if gone.is_empty() {
            continue;
        }
        store::copies::evict(&mut *tx, p.machine_id, &gone).await?;
        let message = format!("copy on {} evicted: {why}", p.name);
        for drive in &gone {
            store::events::record_for_drive(&mut *tx, *drive, false, "Evicted", &message, "eviction").await?;
        }
        let event = store::events::New {
            workspace: None,
            object_kind: "machine",
            object_name: &p.name,
            warning: false,
            reason: "Evicted",
            message: &format!("{} copies evicted: {why}", gone.len()),
            source: "eviction",
        };
        store::events::record(&mut *tx, &event).await?;
        tx.commit().await?;
        tracing::info!(machine = %p.name, copies = gone.len(), %why, "evicted copies under pressure");
        metrics::counter!("astraeus_copies_evicted_total").increment(gone.len() as u64);
        evicted += gone.len();
    }
    Ok(evicted)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pressed(bytes: i64, limit: Option<i64>, free: i64, reserve: i64) -> Pressed {
        Pressed {
            machine_id: Uuid::nil(),
            name: "gpu-01".into(),
            bytes,
            limit_bytes: limit,
            free_bytes: free,
            reserve_bytes: reserve,
        }
    }

    #[test]
    fn a_machine_gives_back_what_puts_it_over_its_limit_or_under_its_reserve() {
        assert_eq!(excess(&pressed(900, Some(1_000), 5_000, 0)), None);
        assert_eq!(excess(&pressed(900, None, 5_000, 4_000)), None);
        let (need, why) = excess(&pressed(1_500_000_000, Some(1_000_000_000), 1 << 40, 0)).unwrap();
        assert_eq!(need, 500_000_000);
        assert_eq!(why, "its data location held 500.0 MB over its limit of 1.0 GB");
        let (need, why) = excess(&pressed(0, None, 1_000_000_000, 3_000_000_000)).unwrap();
        assert_eq!(need, 2_000_000_000);
        assert_eq!(why, "its disk had 1.0 GB free, under its reserve of 3.0 GB");
        // Both: the larger need decides.
        assert_eq!(excess(&pressed(1_100, Some(1_000), 0, 50)).map(|e| e.0), Some(100));
    }
}
