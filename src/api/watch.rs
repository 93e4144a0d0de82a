//! `?watch=true`: a list endpoint's changes, streamed as newline-delimited JSON
//! (`{"type":"ADDED|MODIFIED|DELETED|BOOKMARK","object":…}`), or as server-sent events when the
//! client asks for `text/event-stream`. Versions come from one Postgres sequence and wake-ups
//! from LISTEN/NOTIFY, so a watch sees changes made by any replica.

use std::collections::VecDeque;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::AppState;
use super::caller::Caller;
use super::error::ApiError;
use super::{drives, machines, runs, secrets};
use crate::store;

/// A bookmark is sent when nothing changed for this long, so clients know the stream is alive.
const BOOKMARK_EVERY: Duration = Duration::from_secs(30);
const CHUNK: i64 = 500;
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
    loop {
        if let Some(chunk) = w.queue.pop_front() {
            return Some((Ok(chunk), w));
        }
        let hub = w.app.hub.clone();
        let changed = hub.changes.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        match w.read().await {
            Ok(true) => continue,
            Ok(false) => {}
            Err(e) => return Some((Err(std::io::Error::other(e.to_string())), w)),
        }
        if tokio::time::timeout(BOOKMARK_EVERY, changed).await.is_err() {
            w.bookmark();
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
    let mut watch = Watch { app, caller, kind, after, sse, queue: VecDeque::new() };
    for name in replay {
        if let Some(object) = render(&watch.app, &watch.caller, kind, &name).await? {
            watch.push("ADDED", with_version(object, after));
        }
    }
    let content_type = if sse { "text/event-stream" } else { "application/x-ndjson" };
    let body = Body::from_stream(futures::stream::unfold(watch, next));
    Ok(([(header::CONTENT_TYPE, content_type), (header::CACHE_CONTROL, "no-cache")], body).into_response())
}
