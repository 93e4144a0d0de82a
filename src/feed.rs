//! The changes of watched objects, read once per replica and shared by its watch streams.
//!
//! One task reads the new rows of `changes` when the hub hears `astraeus_change` (or its
//! listener reconnects, or [`RESYNC`] passes) and sends them to every stream as one [`Batch`]
//! over a broadcast channel. Each stream keeps the changes of its own kind and workspace; the
//! first stream that needs a changed object renders it and the others share what it rendered.
//! So a change costs a replica one read of `changes` and one read of each changed object,
//! however many streams watch.
//!
//! A stream whose client reads too slowly to keep up with the last [`BUFFER`] batches reads the
//! changes it missed from Postgres itself, from its last version, then goes on with the feed:
//! it pays for its own slowness, and the others do not wait for it.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use sqlx::PgPool;
use tokio::sync::{OnceCell, broadcast};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::hub::Hub;
use crate::store::{self, changes::Recorded};

/// The lists that can be watched: the `kind` of their rows in `changes`.
pub const KINDS: [&str; 4] = ["runs", "drives", "machines", "secrets"];
/// Changes read at a time, and so at most in one batch.
const CHUNK: i64 = 500;
/// Batches kept for the streams that have not taken them yet.
pub const BUFFER: usize = 16;
/// The feed reads again this long after its last read, for a wake-up that never came.
pub const RESYNC: Duration = Duration::from_secs(30);

/// Changes read together: every watched change after `from`, up to and including `to`.
pub struct Batch {
    pub from: i64,
    pub to: i64,
    pub changes: Vec<Recorded>,
    /// Each change's event, as the first stream that sent it wrote it.
    events: Vec<OnceCell<Option<Arc<str>>>>,
    /// Each changed object, as the first stream that needed it rendered it: by kind, workspace
    /// (none for the organisation's machines) and name.
    objects: Mutex<HashMap<ObjectKey, Arc<OnceCell<Option<Value>>>>>,
}

/// An object's kind, workspace and name: all that its rendering depends on.
type ObjectKey = (String, Option<Uuid>, String);

impl Batch {
    fn new(from: i64, changes: Vec<Recorded>) -> Batch {
        let to = changes.last().map_or(from, |c| c.version);
        let events = changes.iter().map(|_| OnceCell::new()).collect();
        Batch { from, to, changes, events, objects: Mutex::default() }
    }

    /// The event of change `i`, written by `write` once for all the streams that send it; a
    /// failure is not kept, so the next stream tries again.
    pub async fn event<E, F, Fut>(&self, i: usize, write: F) -> Result<Option<Arc<str>>, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Option<Arc<str>>, E>>,
    {
        self.events[i].get_or_try_init(write).await.cloned()
    }

    /// The object that change `i` is about, rendered by `render` once for this batch (`None`
    /// when it is gone by now).
    pub async fn object<E, F, Fut>(&self, feed: &Feed, i: usize, render: F) -> Result<Option<Value>, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Option<Value>, E>>,
    {
        let c = &self.changes[i];
        let cell = self
            .objects
            .lock()
            .expect("not poisoned")
            .entry((c.kind.clone(), c.workspace_id, c.name.clone()))
            .or_default()
            .clone();
        let rendered = cell
            .get_or_try_init(|| {
                feed.renders.fetch_add(1, Ordering::Relaxed);
                metrics::counter!("astraeus_watch_renders_total").increment(1);
                render()
            })
            .await?;
        Ok(rendered.clone())
    }
}

/// The replica's feed of changes; [`Feed::run`] reads them.
pub struct Feed {
    state: Mutex<State>,
    reads: AtomicU64,
    renders: AtomicU64,
    catch_ups: AtomicU64,
}

struct State {
    /// The newest version read; `None` until the first read.
    position: Option<i64>,
    sender: broadcast::Sender<Arc<Batch>>,
}

impl Default for Feed {
    fn default() -> Feed {
        let (sender, _) = broadcast::channel(BUFFER);
        Feed {
            state: Mutex::new(State { position: None, sender }),
            reads: AtomicU64::new(0),
            renders: AtomicU64::new(0),
            catch_ups: AtomicU64::new(0),
        }
    }
}

impl Feed {
    /// The batches to come, and the version read up to so far: a stream behind it reads the
    /// changes up to there itself. Taken together, so no batch falls between the two.
    pub fn subscribe(&self) -> (broadcast::Receiver<Arc<Batch>>, Option<i64>) {
        let state = self.state.lock().expect("not poisoned");
        (state.sender.subscribe(), state.position)
    }

    /// Reads of `changes` made by the feed so far.
    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }

    /// Objects rendered for the feed's batches so far.
    pub fn renders(&self) -> u64 {
        self.renders.load(Ordering::Relaxed)
    }

    /// Reads of `changes` made by streams for themselves so far (behind the feed).
    pub fn catch_ups(&self) -> u64 {
        self.catch_ups.load(Ordering::Relaxed)
    }

    /// A stream read the changes it was behind by.
    pub fn caught_up(&self) {
        self.catch_ups.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("astraeus_watch_catch_up_reads_total").increment(1);
    }

    fn position(&self) -> Option<i64> {
        self.state.lock().expect("not poisoned").position
    }

    fn publish(&self, batch: Batch) {
        let mut state = self.state.lock().expect("not poisoned");
        state.position = Some(batch.to);
        // Nobody watching is no error: the next stream starts from the new position.
        let _ = state.sender.send(Arc::new(batch));
    }

    /// Reads the changes made since the last read, on every wake-up and every `resync`, until
    /// `stop`.
    pub async fn run(self: Arc<Self>, db: PgPool, hub: Arc<Hub>, resync: Duration, stop: CancellationToken) {
        loop {
            let woken = hub.changes.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            let wait = match self.read(&db).await {
                Ok(()) => resync,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the changes of watched objects; retrying");
                    Duration::from_secs(1)
                }
            };
            tokio::select! {
                _ = woken => {}
                _ = tokio::time::sleep(wait) => {}
                _ = stop.cancelled() => return,
            }
        }
    }

    /// Publishes the changes after the position, a batch per chunk.
    async fn read(&self, db: &PgPool) -> sqlx::Result<()> {
        let mut from = match self.position() {
            Some(v) => v,
            // The streams open so far read what came before by themselves.
            None => {
                let latest = store::changes::latest(db).await?;
                self.state.lock().expect("not poisoned").position = Some(latest);
                latest
            }
        };
        loop {
            let rows = store::changes::since(db, &KINDS, from, CHUNK).await?;
            self.reads.fetch_add(1, Ordering::Relaxed);
            metrics::counter!("astraeus_watch_reads_total").increment(1);
            let (read, full) = (rows.len(), rows.len() as i64 == CHUNK);
            if read == 0 {
                return Ok(());
            }
            let batch = Batch::new(from, rows);
            from = batch.to;
            self.publish(batch);
            if !full {
                return Ok(());
            }
        }
    }
}
