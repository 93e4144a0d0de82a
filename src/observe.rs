//! Prometheus metrics: the process-wide recorder, the per-route request middleware, and the
//! gauges read from Postgres when `/metrics` is scraped.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio_util::sync::CancellationToken;

use crate::api::AppState;
use crate::api::caller::Caller;
use crate::api::error::ApiError;

/// The recorder, installed on first use (tests start many servers in one process).
pub fn handle() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        let _ = metrics::set_global_recorder(recorder);
        handle
    })
}

/// Histograms hold every sample until a scrape or an upkeep folds them in: without this, a
/// server nobody scrapes would grow with every request it answers.
pub async fn upkeep(every: Duration, stop: CancellationToken) {
    let mut tick = tokio::time::interval(every);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => handle().run_upkeep(),
        }
    }
}

/// Counts every request and times it, by route template (not by path, which would explode).
pub async fn track(req: Request, next: Next) -> Response {
    let route = req.extensions().get::<MatchedPath>().map_or("unmatched", |p| p.as_str()).to_owned();
    let method = req.method().to_string();
    let start = Instant::now();
    let response = next.run(req).await;
    let status = response.status().as_u16().to_string();
    metrics::counter!("astraeus_http_requests_total", "route" => route.clone(), "method" => method.clone(), "status" => status)
        .increment(1);
    metrics::histogram!("astraeus_http_request_duration_seconds", "route" => route, "method" => method)
        .record(start.elapsed().as_secs_f64());
    response
}

const STATES: [(&str, &[&str]); 4] = [
    ("workers", &["Pending", "Preparing", "Running", "Completed", "Failed"]),
    ("runs", &["Pending", "Running", "Completed", "Failed"]),
    ("machines", &["Ready", "NotReady"]),
    ("copies", &["Filling", "Complete", "Failed", "Evicting"]),
];

/// `GET /metrics` on the API: an organisation-admin token is needed, since the figures are
/// the whole organisation's, not one workspace's.
pub async fn scrape_as_admin(State(app): State<AppState>, caller: Caller) -> Result<Response, ApiError> {
    caller.require_org_admin("read metrics")?;
    scrape(State(app)).await
}

/// The Prometheus text format, with gauges refreshed from the database.
pub async fn scrape(State(app): State<AppState>) -> Result<Response, ApiError> {
    handle();
    // States with no object now read 0, not what they last were.
    for (kind, states) in STATES {
        for state in states {
            metrics::gauge!(format!("astraeus_{kind}"), "state" => *state).set(0.0);
        }
    }
    for (kind, state, n) in crate::store::counts(&app.db).await? {
        metrics::gauge!(format!("astraeus_{kind}"), "state" => state).set(n as f64);
    }
    metrics::gauge!("astraeus_db_pool_connections").set(app.db.size() as f64);
    metrics::gauge!("astraeus_db_pool_idle_connections").set(app.db.num_idle() as f64);
    let body = handle().render();
    Ok(([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response())
}
