//! `?watch=true`: a list endpoint's changes, streamed as newline-delimited JSON
//! (`{"type":"ADDED|MODIFIED|DELETED|BOOKMARK","object":…}`), or as server-sent events when the
//! client asks for `text/event-stream`. Versions come from one Postgres sequence and wake-ups
//! from LISTEN/NOTIFY, so a watch sees changes made by any replica. Streams are capped per
//! token and per replica ([`super::streams`]), and a revoked token's streams end.

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
use crate::store;
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

struct Watch {
    app: AppState,
    caller: Caller,
    kind: Kind,
    after: i64,
    sse: bool,
    queue: VecDeque<Bytes>,
    /// Objects of the first listing not rendered yet, sent as ADDED at `after`.
    replay: VecDeque<String>,
    /// Cancelled when the caller's token is revoked.
    revoked: Arc<CancellationToken>,
    /// The stream's place under the caps, given back when the stream is dropped.
    _slot: Slot,
}

impl Watch {
    fn push(&mut self, kind: &str, object: Value) {
        let event = json!({"type": kind, "object": object});
        let text = if self.sse { format!("event: {kind}\ndata: {event}\n\n") } else { format!("{event}\n") };
        self.queue.push_back(Bytes::from(text));
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

    /// Queues the changes after `self.after`; false when there were none.
    async fn read(&mut self) -> Result<bool, ApiError> {
        let table = self.kind.table();
        let rows =
            store::changes::after(&self.app.db, table, self.caller.workspace_id, self.after, CHUNK).await?;
        for c in &rows {
            self.after = c.version;
            if c.kind == "DELETED" {
                let meta = json!({"name": c.name, "resource_version": c.version.to_string()});
                self.push("DELETED", json!({"metadata": meta}));
            } else if let Some(object) = render(&self.app, &self.caller, self.kind, &c.name).await? {
                self.push(&c.kind, with_version(object, c.version));
            }
        }
        Ok(!rows.is_empty())
    }
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
        if !w.replay.is_empty() {
            if let Err(e) = w.replay_page().await {
                return Some((Err(failed(e)), w));
            }
            continue;
        }
        let hub = w.app.hub.clone();
        let changed = hub.changes.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        match w.read().await {
            Ok(true) => continue,
            Ok(false) => {}
            Err(e) => return Some((Err(failed(e)), w)),
        }
        let revoked = w.revoked.clone();
        tokio::select! {
            _ = changed => {}
            _ = revoked.cancelled() => return None,
            _ = tokio::time::sleep(BOOKMARK_EVERY) => match w.still_allowed().await {
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
    let watch = Watch {
        app,
        caller,
        kind,
        after,
        sse,
        queue: VecDeque::new(),
        replay: replay.into(),
        revoked,
        _slot: slot,
    };
    let content_type = if sse { "text/event-stream" } else { "application/x-ndjson" };
    let body = Body::from_stream(futures::stream::unfold(watch, next));
    Ok(([(header::CONTENT_TYPE, content_type), (header::CACHE_CONTROL, "no-cache")], body).into_response())
}
