//! `/workers/{name}/logs`: a worker's output as text, and with `follow=true`, new lines as
//! they arrive until the worker ends.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use super::AppState;
use super::caller::Caller;
use super::error::{ApiError, ErrorBody};
use super::extract::{Params, Path};
use crate::hub;
use crate::store::{self, logs::LogRecord};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(logs))
}

/// Lines read from the database at a time.
const CHUNK: i64 = 1000;
/// A follower re-checks this often even without a notification.
const RECHECK: Duration = Duration::from_secs(15);

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct LogParams {
    /// Keep the answer open and send new lines until the worker ends.
    #[serde(default)]
    pub follow: bool,
    /// Only the last N lines.
    #[param(minimum = 0)]
    pub tail: Option<i64>,
    /// Start each line with its RFC 3339 time.
    #[serde(default)]
    pub timestamps: bool,
}

struct Follow {
    app: AppState,
    worker: Uuid,
    after: i64,
    follow: bool,
    timestamps: bool,
}

fn render(lines: &[LogRecord], timestamps: bool) -> Bytes {
    let mut text = String::new();
    for l in lines {
        if timestamps {
            text.push_str(&l.at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true));
            text.push(' ');
        }
        text.push_str(&l.line);
        text.push('\n');
    }
    Bytes::from(text)
}

/// The next chunk of lines, waiting for more when following; `None` at the end.
async fn next(mut f: Follow) -> Option<(Result<Bytes, std::io::Error>, Follow)> {
    loop {
        let notify = f.app.hub.subscribe(hub::WORKER, f.worker);
        let changed = notify.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        let lines = match store::logs::after(&f.app.db, f.worker, f.after, CHUNK).await {
            Ok(l) => l,
            Err(e) => return Some((Err(std::io::Error::other(e)), Follow { follow: false, ..f })),
        };
        if let Some(last) = lines.last() {
            f.after = last.id;
            return Some((Ok(render(&lines, f.timestamps)), f));
        }
        if !f.follow {
            return None;
        }
        match store::workers::state(&f.app.db, f.worker).await {
            Ok(Some(s)) if !s.is_terminal() => {}
            _ => return None,
        }
        let _ = tokio::time::timeout(RECHECK, changed).await;
    }
}

/// A worker's output (stdout and stderr), oldest first.
#[utoipa::path(get, path = "/workers/{name}/logs", tag = "runs",
    params(("name" = String, Path, description = "`<run>-<index>`"), LogParams),
    responses(
        (status = 200, description = "The lines, one per line", content_type = "text/plain", body = String),
        (status = 404, body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn logs(
    State(app): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    Params(p): Params<LogParams>,
) -> Result<Response, ApiError> {
    let worker = super::workers::find(&app, &caller, &name).await?;
    let after = match p.tail {
        Some(n) if n < 0 => {
            return Err(ApiError::BadRequest { message: "tail must be 0 or more".into(), fields: vec![] });
        }
        Some(n) => store::logs::tail_start(&app.db, worker.id, n).await?,
        None => 0,
    };
    let dropped = store::logs::dropped(&app.db, worker.id).await?;
    let note = (dropped > 0 && p.tail.is_none()).then(|| {
        format!("[{dropped} earlier lines were dropped to keep the last {}]\n", store::logs::MAX_LINES)
    });
    let first = futures::stream::iter(note.map(|n| Ok::<_, std::io::Error>(Bytes::from(n))));
    let follow = Follow { app, worker: worker.id, after, follow: p.follow, timestamps: p.timestamps };
    let rest = futures::stream::unfold(follow, next);
    let body = Body::from_stream(futures::StreamExt::chain(first, rest));
    Ok(([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], body).into_response())
}
