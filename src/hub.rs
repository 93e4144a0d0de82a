//! Wake-ups across replicas: Postgres LISTEN/NOTIFY fanned out to the tasks waiting in this
//! process (agents' long-polls, log followers, the scheduler).
//!
//! Writers call `pg_notify` inside their transaction, so a wake-up is sent only on commit and
//! reaches every replica, this one included.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// A machine's assignment version moved: sent by the `machines_woken` trigger (see
/// `store::rules`) with `<id>:<version>`, however the version was bumped.
pub const MACHINE: &str = "astraeus_machine";
pub const WORKER: &str = "astraeus_worker";
/// Pending work may fit now: sent only by Rust ([`request_schedule`], [`worker_ended`]), never
/// by a trigger.
pub const SCHEDULE: &str = "astraeus_schedule";
/// A watched object changed: sent with its kind by the change-log triggers (see
/// `store::rules`), which have written its row of `changes`.
pub const CHANGE: &str = "astraeus_change";
/// A credential was revoked or replaced: the payload is the token's or the machine's id.
pub const REVOKED: &str = "astraeus_revoked";
/// The server changed its side of a machine's heartbeat (the `copies_state_changed`,
/// `copies_deleted`, `machines_report_changed` and `machines_deleted` triggers, see
/// `store::rules`): the payload is the machine's id.
pub const REPORT: &str = "astraeus_report";
/// A drive row was deleted or updated (the `drives_announced` trigger, see `store::rules`): the
/// drives kept for assignments are read again.
pub const DRIVE_CHANGED: &str = "astraeus_drive_changed";

/// The tokens whose streams are open, each with what ends them when it is revoked.
#[derive(Default)]
struct Ends {
    map: HashMap<Uuid, Weak<CancellationToken>>,
    sweep_at: usize,
}

impl Ends {
    fn subscribe(&mut self, id: Uuid) -> Arc<CancellationToken> {
        if let Some(end) = self.map.get(&id).and_then(Weak::upgrade) {
            return end;
        }
        if self.map.len() >= self.sweep_at.max(SWEEP_FLOOR) {
            self.map.retain(|_, w| w.strong_count() > 0);
            self.sweep_at = 2 * self.map.len();
        }
        let end = Arc::new(CancellationToken::new());
        self.map.insert(id, Arc::downgrade(&end));
        end
    }
}

/// Below this many notifiers, the ones nobody holds any more are left in place.
const SWEEP_FLOOR: usize = 1024;

/// The notifiers of the objects waited on, by channel and id.
#[derive(Default)]
struct Waiters {
    map: HashMap<(&'static str, Uuid), Weak<Notify>>,
    /// The size at which the next sweep runs: twice what the last one kept, so each sweep is
    /// paid for by as many subscriptions as it visits, however many waiters stay open.
    sweep_at: usize,
}

impl Waiters {
    fn subscribe(&mut self, channel: &'static str, id: Uuid) -> Arc<Notify> {
        if let Some(n) = self.get(channel, id) {
            return n;
        }
        if self.map.len() >= self.sweep_at.max(SWEEP_FLOOR) {
            self.map.retain(|_, w| w.strong_count() > 0);
            self.sweep_at = 2 * self.map.len();
        }
        let n = Arc::new(Notify::new());
        self.map.insert((channel, id), Arc::downgrade(&n));
        n
    }

    /// The notifier of an object somebody waits on, if anybody does.
    fn get(&self, channel: &'static str, id: Uuid) -> Option<Arc<Notify>> {
        self.map.get(&(channel, id)).and_then(Weak::upgrade)
    }
}

#[derive(Default)]
pub struct Hub {
    waiters: Mutex<Waiters>,
    ends: Mutex<Ends>,
    /// Pending work may now fit somewhere: a new run, freed resources, a machine back.
    pub schedule: Notify,
    /// A watched object changed (the payload names its kind): the feed reads the changes.
    pub changes: Notify,
    /// Whether the listener holds its connection, listening.
    listening: AtomicBool,
    /// Credentials checked lately, forgotten when revoked on any replica.
    pub credentials: crate::auth::recent::Recent,
    /// User tokens and machine credentials whose signature was checked lately.
    pub tokens: crate::auth::verified::Verified<crate::auth::Claims>,
    pub machine_tokens: crate::auth::verified::Verified<crate::auth::machine::MachineClaims>,
    /// Heartbeats that changed nothing, forgotten when the server changes its side.
    pub beats: crate::beats::Beats,
    /// The drives that assignments name, by workspace and name. A drive row is never updated,
    /// so they are forgotten only when a drive is deleted (the `drives_announced` trigger, on
    /// `DRIVE_CHANGED`).
    pub drives: crate::kept::Kept<(Uuid, String), crate::store::drives::DriveRecord>,
    /// The latest assignment version each machine's wake-up carried (`<id>:<version>`).
    versions: Mutex<HashMap<Uuid, i64>>,
}

impl Hub {
    /// The notifier for one object; hold it while waiting.
    pub fn subscribe(&self, channel: &'static str, id: Uuid) -> Arc<Notify> {
        self.waiters.lock().expect("not poisoned").subscribe(channel, id)
    }

    /// Cancelled when the token `id` is revoked (heard on this replica); hold it while streaming.
    pub fn ends_on_revocation(&self, id: Uuid) -> Arc<CancellationToken> {
        self.ends.lock().expect("not poisoned").subscribe(id)
    }

    /// The credentials of `id` (a token or a machine) were revoked or replaced: forgotten
    /// here, and the token's open streams end.
    pub fn revoke(&self, id: Uuid) {
        self.credentials.forget(id);
        self.beats.forget(id);
        let mut ends = self.ends.lock().expect("not poisoned");
        if let Some(end) = ends.map.remove(&id).and_then(|w| w.upgrade()) {
            end.cancel();
        }
    }

    pub fn wake(&self, channel: &str, payload: &str) {
        if channel == SCHEDULE {
            self.schedule.notify_one();
            return;
        }
        if channel == CHANGE {
            self.changes.notify_waiters();
            return;
        }
        if channel == DRIVE_CHANGED {
            self.drives.forget_all();
            return;
        }
        if channel == MACHINE {
            let (id, version) = match payload.split_once(':') {
                Some((id, v)) => (id, v.parse::<i64>().ok()),
                None => (payload, None),
            };
            let Ok(id) = id.parse::<Uuid>() else { return };
            self.heard_version(id, version);
            self.notify(MACHINE, id);
            return;
        }
        let Ok(id) = payload.parse::<Uuid>() else { return };
        if channel == REVOKED {
            self.revoke(id);
            return;
        }
        if channel == REPORT {
            self.beats.forget(id);
            return;
        }
        if channel == WORKER {
            self.notify(WORKER, id);
        }
    }

    fn notify(&self, channel: &'static str, id: Uuid) {
        let waiter = self.waiters.lock().expect("not poisoned").get(channel, id);
        if let Some(n) = waiter {
            n.notify_waiters();
        }
    }

    /// The machine's assignment version as of the latest wake-up heard for it, if one was heard
    /// since the listener last (re)connected. Wake-ups come in commit order, so Postgres holds
    /// this version or a newer one, whose wake-up is on its way.
    pub fn assign_version(&self, machine: Uuid) -> Option<i64> {
        self.versions.lock().expect("not poisoned").get(&machine).copied()
    }

    /// A wake-up without a version says the version moved to one not known here.
    fn heard_version(&self, machine: Uuid, version: Option<i64>) {
        let mut versions = self.versions.lock().expect("not poisoned");
        match version {
            Some(v) => {
                let known = versions.entry(machine).or_insert(v);
                *known = (*known).max(v);
            }
            None => {
                versions.remove(&machine);
            }
        }
    }

    /// The listener may have missed notifications (its connection dropped and was made again):
    /// what they would have kept true here is read from Postgres again.
    fn missed(&self) {
        self.schedule.notify_one();
        self.changes.notify_waiters();
        self.beats.forget_all();
        self.credentials.forget_all();
        self.drives.forget_all();
        self.versions.lock().expect("not poisoned").clear();
    }

    /// Whether notifications are heard now (the listener is connected and listening).
    pub fn listening(&self) -> bool {
        self.listening.load(Ordering::Relaxed)
    }

    /// Listens until the process ends, reconnecting when the connection drops. While it is
    /// down, waiters fall back on their timeouts and the periodic passes.
    pub async fn listen(self: Arc<Self>, db: PgPool) {
        loop {
            match self.listen_once(&db).await {
                Ok(()) => return,
                Err(e) => {
                    self.listening.store(false, Ordering::Relaxed);
                    tracing::warn!(error = %e, "notification listener lost its connection; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }

    async fn listen_once(&self, db: &PgPool) -> sqlx::Result<()> {
        let mut listener = PgListener::connect_with(db).await?;
        listener.listen_all([MACHINE, WORKER, SCHEDULE, CHANGE, REVOKED, REPORT, DRIVE_CHANGED]).await?;
        // Something may have changed while nobody listened.
        self.missed();
        self.listening.store(true, Ordering::Relaxed);
        loop {
            match listener.try_recv().await? {
                Some(n) => self.wake(n.channel(), n.payload()),
                // The connection dropped and was made again, listening as before.
                None => {
                    tracing::warn!(
                        "notification listener reconnected; notifications sent meanwhile are lost"
                    );
                    self.missed();
                }
            }
        }
    }
}

/// Asks every replica's scheduler to look at pending work, on commit.
pub async fn request_schedule(db: impl sqlx::PgExecutor<'_>) -> sqlx::Result<()> {
    sqlx::query("SELECT pg_notify($1, '')").bind(SCHEDULE).execute(db).await.map(drop)
}

/// Tells every replica, on commit, to check the credentials of `id` (a token or a machine)
/// in Postgres again.
pub async fn revoked(db: impl sqlx::PgExecutor<'_>, id: Uuid) -> sqlx::Result<()> {
    sqlx::query("SELECT pg_notify($1, $2::text)").bind(REVOKED).bind(id).execute(db).await.map(drop)
}

/// Wakes whoever follows the worker (its logs, its state), on commit.
pub async fn worker_changed(db: impl sqlx::PgExecutor<'_>, worker: Uuid) -> sqlx::Result<()> {
    sqlx::query("SELECT pg_notify($1, $2::text)").bind(WORKER).bind(worker).execute(db).await.map(drop)
}

/// Wakes whoever follows the worker and the scheduler, on commit, in one statement: an ended
/// worker leaves room to place another.
pub async fn worker_ended(db: impl sqlx::PgExecutor<'_>, worker: Uuid) -> sqlx::Result<()> {
    sqlx::query("SELECT pg_notify($1, $2::text), pg_notify($3, '')")
        .bind(WORKER)
        .bind(worker)
        .bind(SCHEDULE)
        .execute(db)
        .await
        .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_notifier_is_shared_while_held_and_forgotten_once_dropped() {
        let mut w = Waiters::default();
        let id = Uuid::now_v7();
        let held = w.subscribe(MACHINE, id);
        assert!(Arc::ptr_eq(&held, &w.subscribe(MACHINE, id)));
        assert!(!Arc::ptr_eq(&held, &w.subscribe(WORKER, id)), "another channel");
        drop(held);
        for _ in 0..10 * SWEEP_FLOOR {
            w.subscribe(WORKER, Uuid::now_v7());
        }
        assert!(w.map.len() <= SWEEP_FLOOR, "{} notifiers kept", w.map.len());
    }

    #[test]
    fn sweeps_grow_with_the_notifiers_held_and_keep_them() {
        let mut w = Waiters::default();
        let held: Vec<(Uuid, Arc<Notify>)> = (0..5000)
            .map(|_| {
                let id = Uuid::now_v7();
                (id, w.subscribe(MACHINE, id))
            })
            .collect();
        let mut sweeps = 0;
        for _ in 0..10_000 {
            let before = w.map.len();
            w.subscribe(MACHINE, Uuid::now_v7());
            if w.map.len() <= before {
                sweeps += 1;
            }
            assert!(w.map.len() <= 2 * held.len(), "{} notifiers kept", w.map.len());
        }
        // Every 5,000 subscriptions or so, not on each of them.
        assert!((1..=4).contains(&sweeps), "{sweeps} sweeps");
        for (id, n) in &held {
            assert!(Arc::ptr_eq(n, &w.subscribe(MACHINE, *id)));
        }
    }

    #[test]
    fn a_revocation_ends_the_streams_of_its_token_only() {
        let hub = Hub::default();
        let (revoked, kept) = (Uuid::now_v7(), Uuid::now_v7());
        let (one, two, other) =
            (hub.ends_on_revocation(revoked), hub.ends_on_revocation(revoked), hub.ends_on_revocation(kept));
        hub.wake(REVOKED, &revoked.to_string());
        assert!(one.is_cancelled() && two.is_cancelled());
        assert!(!other.is_cancelled());
        // A stream opened after the revocation was heard starts with an end of its own; the
        // request that opened it was checked against Postgres already.
        assert!(!hub.ends_on_revocation(revoked).is_cancelled());
    }

    #[tokio::test]
    async fn a_machines_wake_up_wakes_its_waiters_and_keeps_the_newest_version_it_carried() {
        let hub = Hub::default();
        let (id, other) = (Uuid::now_v7(), Uuid::now_v7());
        assert_eq!(hub.assign_version(id), None, "none heard yet");
        let held = hub.subscribe(MACHINE, id);
        let woken = held.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        hub.wake(MACHINE, &format!("{id}:7"));
        tokio::time::timeout(Duration::from_secs(5), woken).await.expect("the waiter was woken");
        assert_eq!(hub.assign_version(id), Some(7));
        // Wake-ups arrive in commit order, but an older one never lowers what is known.
        hub.wake(MACHINE, &format!("{id}:5"));
        assert_eq!(hub.assign_version(id), Some(7));
        hub.wake(MACHINE, &format!("{id}:9"));
        assert_eq!(hub.assign_version(id), Some(9));
        assert_eq!(hub.assign_version(other), None);
        // A wake-up without its version leaves it unknown: Postgres is asked again.
        hub.wake(MACHINE, &id.to_string());
        assert_eq!(hub.assign_version(id), None);
        hub.wake(MACHINE, &format!("{id}:10"));
        hub.wake(MACHINE, &format!("{other}:not-a-version"));
        assert_eq!(hub.assign_version(other), None);
        // Wake-ups missed while the listener reconnected leave nothing known.
        hub.missed();
        assert_eq!(hub.assign_version(id), None);
    }
}
