//! `?watch=true`: a list endpoint's changes, streamed as newline-delimited JSON
//! (`{"type":"ADDED|MODIFIED|DELETED|BOOKMARK","object":…}`), or as server-sent events when the
//! client asks for `text/event-stream`. Versions come from one Postgres sequence and wake-ups
//! from LISTEN/NOTIFY, so a watch sees changes made by any replica. The changes reach a
//! replica's streams through its one feed ([`crate::feed`]), not a read per stream. Streams are
//! capped per token and per replica ([`super::streams`]), and a revoked token's streams end.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::AppState;
use super::caller::Caller;
use super::error::ApiError;
use super::streams::Slot;
use super::{drives, machines, runs, secrets};
use crate::feed::Batch;
use crate::store;
use tokio::sync::broadcast::{self, error::RecvError};
use tokio_util::sync::CancellationToken;

/// A bookmark is sent when nothing changed for this long, so clients know the stream is alive.
const BOOKMARK_EVERY: Duration = Duration::from_secs(30);
const CHUNK: i64 = 500;
/// Objects of the first listing rendered at a time, so the first ones go out before the last
/// are read.
const REPLAY_PAGE: usize = 100;
/// The objects a watch without a version starts with: at most this many.
pub const ALL: store::Page = store::Page { limit: 10_000, before: None };

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Runs,
    Drives,
    Machines,
    Secrets,
}

impl Kind {
    fn table(self) -> &'static str {
        match self {
            Kind::Runs => "runs",
            Kind::Drives => "drives",
            Kind::Machines => "machines",
            Kind::Secrets => "secrets",
        }
    }
}

/// The object as its GET answers it, or `None` when it is gone by now (its DELETED follows).
async fn render(app: &AppState, caller: &Caller, kind: Kind, name: &str) -> Result<Option<Value>, ApiError> {
    let found = match kind {
        Kind::Runs => runs::load(app, caller, name).await.map(|o| json!(o)),
        Kind::Drives => drives::load(app, caller, name).await.map(|o| json!(o)),
        Kind::Machines => machines::load(app, name).await.map(|o| json!(o)),
        Kind::Secrets => secrets::load(app, caller, name).await.map(|o| json!(o)),
    };
    match found {
        Ok(v) => Ok(Some(v)),
        Err(ApiError::NotFound(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

fn with_version(mut object: Value, version: i64) -> Value {
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert("resource_version".into(), json!(version.to_string()));
    }
    object
}

/// An event as JSON: `{"type":…,"object":…}`.
fn event_json(kind: &str, object: Value) -> String {
    json!({"type": kind, "object": object}).to_string()
}

fn deleted(name: &str, version: i64) -> Value {
    json!({"metadata": {"name": name, "resource_version": version.to_string()}})
}

struct Watch {
    app: AppState,
    caller: Caller,
    kind: Kind,
    /// Every change up to this version was sent or is not this stream's.
    after: i64,
    sse: bool,
    queue: VecDeque<Bytes>,
    /// Objects of the first listing not rendered yet, sent as ADDED at `after`.
    replay: VecDeque<String>,
    /// The replica's batches of changes ([`crate::feed`]).
    feed: broadcast::Receiver<Arc<Batch>>,
    /// The changes up to this version are read from Postgres first: the stream started behind
    /// the feed, or fell behind it.
    catch_up: Option<i64>,
    /// A batch taken from the feed and not sent yet.
    batch: Option<Arc<Batch>>,
    /// Cancelled when the caller's token is revoked.
    revoked: Arc<CancellationToken>,
    /// The stream's place under the caps, given back when the stream is dropped.
    _slot: Slot,
}

impl Watch {
    fn push_json(&mut self, kind: &str, event: &str) {
        let text = if self.sse { format!("event: {kind}\ndata: {event}\n\n") } else { format!("{event}\n") };
        self.queue.push_back(Bytes::from(text));
    }

    fn push(&mut self, kind: &str, object: Value) {
        self.push_json(kind, &event_json(kind, object));
    }

    fn bookmark(&mut self) {
        let version = self.after;
        self.push("BOOKMARK", json!({"metadata": {"resource_version": version.to_string()}}));
    }

    /// Renders the next page of the first listing.
    async fn replay_page(&mut self) -> Result<(), ApiError> {
        for _ in 0..REPLAY_PAGE {
            let Some(name) = self.replay.pop_front() else { break };
            if let Some(object) = render(&self.app, &self.caller, self.kind, &name).await? {
                self.push("ADDED", with_version(object, self.after));
            }
        }
        Ok(())
    }

    /// Whether the caller's token is still in force: the safety net for a revocation whose
    /// notification this replica missed.
    async fn still_allowed(&self) -> Result<bool, ApiError> {
        let id = self.caller.token_id;
        if self.revoked.is_cancelled() {
            return Ok(false);
        }
        if self.app.hub.credentials.is_fresh(id, id) {
            return Ok(true);
        }
        let active = store::tokens::is_active(&self.app.db, id).await?;
        if active {
            self.app.hub.credentials.remember(id, id);
        }
        Ok(active)
    }

    /// Queues the next page of this stream's changes up to `upto`, read from Postgres by the
    /// stream itself.
    async fn catch_up_page(&mut self, upto: i64) -> Result<(), ApiError> {
        let (table, workspace) = (self.kind.table(), self.caller.workspace_id);
        // A stream that fell behind the retained changes ends; resumed from its last version,
        // it is answered 410.
        let compacted = store::changes::compacted(&self.app.db).await?;
        if self.after < compacted {
            return Err(ApiError::Gone(format!(
                "this stream fell behind the retained changes (up to {compacted} were compacted): list again"
            )));
        }
        let rows = store::changes::between(&self.app.db, table, workspace, self.after, upto, CHUNK).await?;
        self.app.feed.caught_up();
        for c in &rows {
            self.after = c.version;
            if c.kind == "DELETED" {
                self.push("DELETED", deleted(&c.name, c.version));
            } else if let Some(object) = render(&self.app, &self.caller, self.kind, &c.name).await? {
                self.push(&c.kind, with_version(object, c.version));
            }
        }
        if rows.len() < CHUNK as usize {
            self.after = upto;
            self.catch_up = None;
        }
        Ok(())
    }

    /// Queues this stream's changes in `batch`: each event written once for every stream of
    /// the replica that sends it.
    async fn send_batch(&mut self, batch: &Batch) -> Result<(), ApiError> {
        let (app, caller, kind) = (&self.app, &self.caller, self.kind);
        let mut events = Vec::new();
        for (i, c) in batch.changes.iter().enumerate() {
            let ours = c.kind == kind.table() && c.workspace_id.is_none_or(|w| w == caller.workspace_id);
            if c.version <= self.after || !ours {
                continue;
            }
            let write = || async {
                if c.change == "DELETED" {
                    return Ok(Some(event_json("DELETED", deleted(&c.name, c.version)).into()));
                }
                let object = batch.object(&app.feed, i, || render(app, caller, kind, &c.name)).await?;
                Ok::<_, ApiError>(object.map(|o| event_json(&c.change, with_version(o, c.version)).into()))
            };
            if let Some(event) = batch.event(i, write).await? {
                events.push((c.change.as_str(), event));
            }
        }
        for (change, event) in events {
            self.push_json(change, &event);
        }
        self.after = self.after.max(batch.to);
        Ok(())
    }

    /// Takes the next batch from the feed.
    fn take(&mut self, got: Result<Arc<Batch>, RecvError>) -> bool {
        match got {
            Ok(batch) => {
                let (catch_up, send) = plan(self.after, batch.from, batch.to);
                self.catch_up = catch_up;
                self.batch = send.then_some(batch);
                true
            }
            // Batches were missed: the next one starts past `after`, so the stream reads up to
            // it from Postgres before sending it.
            Err(RecvError::Lagged(_)) => {
                metrics::counter!("astraeus_watch_lagged_total").increment(1);
                true
            }
            Err(RecvError::Closed) => false,
        }
    }
}

/// What a stream that sent every change up to `after` does with a batch of the changes in
/// `(from, to]`: first reads the changes up to `from` itself when it is behind the batch (it
/// started behind the feed or missed batches), then sends the batch unless it had it all.
fn plan(after: i64, from: i64, to: i64) -> (Option<i64>, bool) {
    ((from > after).then_some(from), to > after)
}

enum Woken {
    Batch(Result<Arc<Batch>, RecvError>),
    Revoked,
    Quiet,
}

async fn next(mut w: Watch) -> Option<(Result<Bytes, std::io::Error>, Watch)> {
    let failed = |e: ApiError| std::io::Error::other(e.to_string());
    loop {
        if w.revoked.is_cancelled() {
            return None;
        }
        if let Some(chunk) = w.queue.pop_front() {
            return Some((Ok(chunk), w));
        }
        let step = if !w.replay.is_empty() {
            Some(w.replay_page().await)
        } else if let Some(upto) = w.catch_up {
            Some(w.catch_up_page(upto).await)
        } else if let Some(batch) = w.batch.take() {
            Some(w.send_batch(&batch).await)
        } else {
            None
        };
        match step {
            Some(Ok(())) => continue,
            Some(Err(e)) => return Some((Err(failed(e)), w)),
            None => {}
        }
        let revoked = w.revoked.clone();
        let woken = tokio::select! {
            got = w.feed.recv() => Woken::Batch(got),
            _ = revoked.cancelled() => Woken::Revoked,
            _ = tokio::time::sleep(BOOKMARK_EVERY) => Woken::Quiet,
        };
        match woken {
            Woken::Batch(got) => {
                if !w.take(got) {
                    return None;
                }
            }
            Woken::Revoked => return None,
            Woken::Quiet => match w.still_allowed().await {
                Ok(true) => w.bookmark(),
                Ok(false) => return None,
                Err(e) => return Some((Err(failed(e)), w)),
            },
        }
    }
}

/// Streams changes of `kind` after `from`; without `from`, every current object (`initial`) as
/// ADDED first, then what changes after.
pub async fn stream(
    app: AppState,
    caller: Caller,
    kind: Kind,
    from: Option<i64>,
    initial: Vec<String>,
    headers: &HeaderMap,
) -> Result<Response, ApiError> {
    let slot = app.streams.open(caller.token_id)?;
    let (feed, read_to) = app.feed.subscribe();
    let revoked = app.hub.ends_on_revocation(caller.token_id);
    let sse = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/event-stream"));
    let compacted = store::changes::compacted(&app.db).await?;
    let (after, replay) = match from {
        Some(v) if v < compacted => {
            return Err(ApiError::Gone(format!(
                "resource_version {v} is too old (changes up to {compacted} were compacted): list again"
            )));
        }
        Some(v) => (v, vec![]),
        None => (store::changes::latest(&app.db).await?, initial),
    };
    let read_to = match read_to {
        Some(v) => v,
        None => store::changes::latest(&app.db).await?,
    };
    let watch = Watch {
        app,
        caller,
        kind,
        after,
        sse,
        queue: VecDeque::new(),
        replay: replay.into(),
        feed,
        catch_up: (after < read_to).then_some(read_to),
        batch: None,
        revoked,
        _slot: slot,
    };
    let content_type = if sse { "text/event-stream" } else { "application/x-ndjson" };
    let body = Body::from_stream(futures::stream::unfold(watch, next));
    Ok(([(header::CONTENT_TYPE, content_type), (header::CACHE_CONTROL, "no-cache")], body).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_reads_what_it_missed_before_a_batch_and_sends_only_what_it_has_not() {
        let cases = [
            // (after, from, to) => (read up to, send)
            ((10, 10, 20), (None, true)),  // the next batch, as expected
            ((15, 10, 20), (None, true)),  // ahead of the feed: sends (15, 20] of it
            ((20, 10, 20), (None, false)), // had it all already
            ((25, 10, 20), (None, false)),
            ((5, 10, 20), (Some(10), true)), // behind: reads (5, 10] first
            ((0, 500, 501), (Some(500), true)),
        ];
        for ((after, from, to), want) in cases {
            assert_eq!(plan(after, from, to), want, "after {after}, batch ({from}, {to}]");
        }
    }
}
