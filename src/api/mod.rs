//! The HTTP API (axum): the router, its state, errors, extractors and one file per resource.

pub mod agent;
pub mod caller;
pub mod console;
pub mod drives;
pub mod error;
pub mod events;
pub mod extract;
pub mod health;
pub mod limit;
pub mod list;
pub mod logs;
pub mod machines;
pub mod meta;
pub mod org;
pub mod runs;
pub mod secrets;
pub mod tokens;
pub mod watch;
pub mod workers;

use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::{Method, Uri};
use axum::routing::get;
use sqlx::PgPool;
use tower_http::trace::TraceLayer;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};
use utoipa_axum::router::OpenApiRouter;
use utoipa_swagger_ui::SwaggerUi;

use crate::auth::Keys;
use crate::hub::Hub;
use error::ApiError;

/// Request bodies larger than this are refused with 413.
pub const BODY_LIMIT: usize = 1024 * 1024;

#[derive(Clone)]
pub struct AppState {
    pub db: PgPool,
    pub keys: Arc<Keys>,
    pub hub: Arc<Hub>,
    pub limiter: limit::Limiter,
}

/// Requests a second one token may make, by default.
pub const DEFAULT_RATE_LIMIT: u32 = 1000;

impl AppState {
    /// State over `db`; the control loops and the notification listener start separately
    /// (`server::start_loops`).
    pub fn new(db: PgPool, keys: Arc<Keys>) -> AppState {
        AppState {
            db,
            keys,
            hub: Arc::new(Hub::default()),
            limiter: limit::Limiter::per_token(DEFAULT_RATE_LIMIT),
        }
    }

    /// Another per-token rate limit; 0 turns it off.
    pub fn with_rate_limit(mut self, per_second: u32) -> AppState {
        self.limiter = limit::Limiter::per_token(per_second);
        self
    }
}

#[derive(OpenApi)]
#[openapi(
    info(title = "Astraeus API", description = "Drives, runs and placement: keep datasets warm next to the GPUs that read them."),
    modifiers(&BearerAuth),
    tags(
        (name = "drives", description = "Datasets kept on machines"),
        (name = "runs", description = "Jobs and their workers"),
        (name = "events", description = "Why things happened"),
        (name = "machines", description = "Machines, their data locations, and join tokens"),
        (name = "secrets", description = "Values given to workers as environment"),
        (name = "tokens", description = "Bearer tokens of a workspace"),
        (name = "organisation", description = "Workspaces, clusters and host-path grants"),
    )
)]
struct ApiDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new().scheme(HttpAuthScheme::Bearer).bearer_format("JWT").build(),
            ),
        );
    }
}

fn api_routes() -> OpenApiRouter<AppState> {
    let v1 = OpenApiRouter::new()
        .merge(drives::router())
        .merge(runs::router())
        .merge(workers::router())
        .merge(logs::router())
        .merge(events::router())
        .merge(machines::router())
        .merge(secrets::router())
        .merge(tokens::router())
        .merge(org::router());
    OpenApiRouter::with_openapi(ApiDoc::openapi()).nest("/api/v1", v1)
}

/// The OpenAPI document, generated from the routes themselves.
pub fn openapi() -> utoipa::openapi::OpenApi {
    api_routes().split_for_parts().1
}

/// `/metrics` without a token, for a listen address of its own that only Prometheus reaches.
pub fn metrics_router(state: AppState) -> Router {
    Router::new().route("/metrics", get(crate::observe::scrape)).with_state(state)
}

pub fn router(state: AppState) -> Router {
    // Counters recorded before the recorder exists would be lost.
    crate::observe::handle();
    let (api, spec) = api_routes().split_for_parts();
    Router::new()
        .merge(api)
        .merge(agent::router())
        .merge(SwaggerUi::new("/docs").url("/openapi.json", spec))
        .route("/metrics", get(crate::observe::scrape_as_admin))
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        // The web console at `/` (and its page routes); unknown /api paths stay a JSON 404.
        .fallback(console::fallback)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .layer(axum::middleware::from_fn(crate::observe::track))
        .layer(TraceLayer::new_for_http())
        .with_state(state)
}

async fn not_found(uri: Uri) -> ApiError {
    ApiError::NotFound(format!("no route for {}", uri.path()))
}

async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::MethodNotAllowed(format!("{method} is not allowed on {}", uri.path()))
}
