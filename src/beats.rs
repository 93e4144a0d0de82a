//! Heartbeats that change nothing, answered from memory and written in batches.
//!
//! Most heartbeats repeat the copies the machine was last found to hold. Once Postgres has agreed
//! that a report matches (`machines::beat_if_unchanged`), the same report is answered from here,
//! and its liveness and usage are written for all machines at once every
//! [`flush_every`](crate::beats::flush_every). Whatever the server changes on its side of the
//! report (a copy evicted or dropped, the data location, the machine's state) is announced by a
//! trigger on `astraeus_report` (`copies_state_changed`, `copies_deleted`,
//! `machines_report_changed`, `machines_deleted`: see `store::rules`) and forgets the machine on
//! every replica; every machine is forgotten when the notification listener reconnects, and an
//! entry lapses after [`TTL`](crate::beats::TTL) anyway. A crash loses at most one batch of
//! liveness, which the next heartbeat restores.

use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::protocol::{CopyReport, LostFiles};
use crate::store::{self, machines::Usage};

/// A last resort: a missed notification is noticed (the listener forgets everything when its
/// connection comes back). At 30 s, a fleet beating every 5 s sent every sixth heartbeat to
/// Postgres, the second costliest statement of a bench run at 10,000 machines (92,108 calls).
pub const TTL: Duration = Duration::from_secs(300);

/// Machines written per statement by [`Beats::flush`].
const CHUNK: usize = 500;

/// What a heartbeat answers when nothing changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Known {
    pub data_location: Option<String>,
    pub data_limit_bytes: Option<i64>,
    pub transfer_limits: crate::domain::machine::TransferLimits,
}

#[derive(Debug)]
struct Entry {
    /// Bumped by every [`Beats::forget`]: an answer read before it is not remembered after it.
    generation: u64,
    report: Option<(u64, Known, Instant)>,
}

#[derive(Default)]
pub struct Beats {
    known: Mutex<HashMap<Uuid, Entry>>,
    /// Heartbeats waiting to be written: when each machine beat last, and its usage then.
    pending: Mutex<HashMap<Uuid, (DateTime<Utc>, Usage)>>,
}

/// A report's copies, order aside: the agent lists them as its disk does.
pub fn digest(copies: &[CopyReport], reserve_bytes: i64) -> u64 {
    type Row<'a> = (&'a str, Option<uuid::Uuid>, u64, bool, bool, Option<&'a str>, Option<&'a LostFiles>);
    let mut sorted: Vec<Row> = copies
        .iter()
        .map(|c| {
            let manifest = c.manifest.as_deref();
            (c.drive.as_str(), c.drive_id, c.bytes, c.complete, c.measured, manifest, c.lost.as_ref())
        })
        .collect();
    sorted.sort_unstable();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    sorted.hash(&mut h);
    reserve_bytes.hash(&mut h);
    h.finish()
}

/// How often pending heartbeats are written: well inside the grace a machine has.
pub fn flush_every(grace: Duration) -> Duration {
    (grace / 10).clamp(Duration::from_millis(100), Duration::from_secs(1))
}

impl Beats {
    /// The answer for a report Postgres agreed with lately, if `digest` is that report.
    pub fn known(&self, machine: Uuid, digest: u64) -> Option<Known> {
        let known = self.known.lock().expect("not poisoned");
        match &known.get(&machine)?.report {
            Some((d, k, at)) if *d == digest && at.elapsed() < TTL => Some(k.clone()),
            _ => None,
        }
    }

    /// Read before asking Postgres; pass it to [`Beats::remember`].
    pub fn generation(&self, machine: Uuid) -> u64 {
        self.known.lock().expect("not poisoned").get(&machine).map_or(0, |e| e.generation)
    }

    /// Remembers that Postgres agreed with this report, unless the machine was forgotten since
    /// `generation` was read.
    pub fn remember(&self, machine: Uuid, generation: u64, digest: u64, answer: Known) {
        let mut known = self.known.lock().expect("not poisoned");
        let entry = known.entry(machine).or_insert(Entry { generation: 0, report: None });
        if entry.generation == generation {
            entry.report = Some((digest, answer, Instant::now()));
        }
    }

    pub fn forget(&self, machine: Uuid) {
        let mut known = self.known.lock().expect("not poisoned");
        let entry = known.entry(machine).or_insert(Entry { generation: 0, report: None });
        entry.generation += 1;
        entry.report = None;
    }

    /// After notifications may have been missed.
    pub fn forget_all(&self) {
        for entry in self.known.lock().expect("not poisoned").values_mut() {
            entry.generation += 1;
            entry.report = None;
        }
    }

    /// Queues the machine's liveness and usage for the next batch.
    pub fn record(&self, machine: Uuid, usage: &Usage) {
        self.pending.lock().expect("not poisoned").insert(machine, (Utc::now(), *usage));
    }

    /// Writes the queued heartbeats, `CHUNK` machines a statement; returns how many were
    /// written. A machine whose row is held elsewhere is queued again for the next batch
    /// (unless it beat again meanwhile), so no batch waits for a row; a machine deleted since
    /// is dropped.
    pub async fn flush(&self, db: &PgPool) -> sqlx::Result<usize> {
        let mut batch: Vec<(Uuid, (DateTime<Utc>, Usage))> =
            self.pending.lock().expect("not poisoned").drain().collect();
        batch.sort_unstable_by_key(|(id, _)| *id);
        let mut written = 0;
        for chunk in batch.chunks(CHUNK) {
            let ids: Vec<Uuid> = chunk.iter().map(|(id, _)| *id).collect();
            let at: Vec<DateTime<Utc>> = chunk.iter().map(|(_, (at, _))| *at).collect();
            let usage: Vec<Usage> = chunk.iter().map(|(_, (_, u))| *u).collect();
            let skipped: HashSet<Uuid> =
                store::machines::beat_all(db, &ids, &at, &usage).await?.into_iter().collect();
            written += chunk.len() - skipped.len();
            let mut pending = self.pending.lock().expect("not poisoned");
            for (id, beat) in chunk.iter().filter(|(id, _)| skipped.contains(id)) {
                pending.entry(*id).or_insert(*beat);
            }
        }
        Ok(written)
    }

    /// Flushes every `every` until `stop`, then once more.
    pub async fn run(&self, db: PgPool, every: Duration, stop: CancellationToken) {
        loop {
            let stopping = tokio::select! {
                _ = stop.cancelled() => true,
                _ = tokio::time::sleep(every) => false,
            };
            match self.flush(&db).await {
                Ok(n) => {
                    metrics::counter!("astraeus_heartbeats_batched_total").increment(n as u64);
                }
                Err(e) => tracing::warn!(error = %e, "writing heartbeats failed"),
            }
            if stopping {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn copy(drive: &str, bytes: u64, complete: bool) -> CopyReport {
        CopyReport {
            drive: drive.into(),
            drive_id: None,
            bytes,
            complete,
            measured: true,
            last_used_at: None,
            manifest: None,
            lost: None,
        }
    }

    fn answer() -> Known {
        Known {
            data_location: Some("/data".into()),
            data_limit_bytes: None,
            transfer_limits: Default::default(),
        }
    }

    #[test]
    fn a_digest_ignores_order_and_sees_bytes_and_completeness() {
        let a = [copy("ws.a", 1, true), copy("ws.b", 2, false)];
        let b = [copy("ws.b", 2, false), copy("ws.a", 1, true)];
        assert_eq!(digest(&a, 0), digest(&b, 0));
        assert_ne!(digest(&a, 0), digest(&[copy("ws.a", 1, true), copy("ws.b", 3, false)], 0));
        assert_ne!(digest(&a, 0), digest(&[copy("ws.a", 1, true), copy("ws.b", 2, true)], 0));
        assert_ne!(digest(&a, 0), digest(&a[..1], 0));
        assert_ne!(digest(&a, 0), digest(&a, 1 << 30), "a new reserve is a change to reconcile");
    }

    #[test]
    fn only_the_report_postgres_agreed_with_is_answered_from_memory() {
        let (m, other) = (Uuid::now_v7(), Uuid::now_v7());
        let beats = Beats::default();
        assert_eq!(beats.known(m, 7), None);
        beats.remember(m, beats.generation(m), 7, answer());
        assert_eq!(beats.known(m, 7), Some(answer()));
        assert_eq!(beats.known(m, 8), None, "another report");
        assert_eq!(beats.known(other, 7), None, "another machine");
        beats.forget(m);
        assert_eq!(beats.known(m, 7), None);
    }

    #[test]
    fn a_change_announced_while_postgres_was_asked_is_not_overwritten() {
        let m = Uuid::now_v7();
        let beats = Beats::default();
        let asked = beats.generation(m);
        beats.forget(m);
        beats.remember(m, asked, 7, answer());
        assert_eq!(beats.known(m, 7), None);
        beats.remember(m, beats.generation(m), 7, answer());
        assert_eq!(beats.known(m, 7), Some(answer()));
        beats.forget_all();
        assert_eq!(beats.known(m, 7), None);
    }

    #[test]
    fn batches_come_often_enough_for_the_grace() {
        assert_eq!(flush_every(Duration::from_secs(30)), Duration::from_secs(1));
        assert_eq!(flush_every(Duration::from_secs(3)), Duration::from_millis(300));
        assert_eq!(flush_every(Duration::from_millis(200)), Duration::from_millis(100));
    }
}
