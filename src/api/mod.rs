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
pub mod machine_actions;
pub mod machines;
pub mod meta;
pub mod org;
pub mod overload;
pub mod runs;
pub mod secrets;
pub mod streams;
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
use utoipa::openapi::header::HeaderBuilder;
use utoipa::openapi::path::ParameterIn;
use utoipa::openapi::response::ResponseBuilder;
use utoipa::openapi::schema::{Object, Type};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{Content, Ref};
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
    /// The changes of watched objects, shared by the replica's watch streams.
    pub feed: Arc<crate::feed::Feed>,
    /// The run specs that agents' assignments need, by run id: a run's spec never changes once
    /// the run is made and run ids are never reused, so nothing forgets them but the bound.
    pub run_specs: Arc<crate::kept::Kept<uuid::Uuid, crate::domain::run::RunSpec>>,
    pub limiter: limit::Limiter,
    /// The limit per client address on the routes that need no token.
    pub address_limiter: limit::Limiter<std::net::IpAddr>,
    /// User-API requests in progress at most ([`overload`]); 0 for no cap.
    pub max_in_flight: usize,
    /// Streams held open, capped per token and per replica.
    pub streams: streams::Streams,
    /// Bytes of logs kept per worker and per workspace.
    pub log_limits: crate::domain::log_budget::Limits,
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
            feed: Arc::default(),
            run_specs: Arc::default(),
            limiter: limit::Limiter::per_token(DEFAULT_RATE_LIMIT),
            address_limiter: limit::Limiter::per_address(limit::DEFAULT_PER_ADDRESS),
            max_in_flight: overload::DEFAULT_MAX_IN_FLIGHT,
            streams: streams::Streams::new(streams::DEFAULT_PER_TOKEN, streams::DEFAULT_PER_REPLICA),
            log_limits: crate::domain::log_budget::Limits::default(),
        }
    }

    /// Other caps on streams held open, per token and per replica; 0 turns either off.
    pub fn with_stream_caps(mut self, per_token: usize, per_replica: usize) -> AppState {
        self.streams = streams::Streams::new(per_token, per_replica);
        self
    }

    /// Another per-token rate limit; 0 turns it off.
    pub fn with_rate_limit(mut self, per_second: u32) -> AppState {
        self.limiter = limit::Limiter::per_token(per_second);
        self
    }

    /// Another limit per client address on the routes that need no token; 0 turns it off.
    pub fn with_address_rate_limit(mut self, per_second: u32) -> AppState {
        self.address_limiter = limit::Limiter::per_address(per_second);
        self
    }

    /// Other bounds on bytes of logs kept, per worker and per workspace; 0 turns either off.
    pub fn with_log_limits(mut self, limits: crate::domain::log_budget::Limits) -> AppState {
        self.log_limits = limits;
        self
    }

    /// Another cap on user-API requests in progress; 0 turns it off.
    pub fn with_max_in_flight(mut self, max: usize) -> AppState {
        self.max_in_flight = max;
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
        .merge(machine_actions::router())
        .merge(secrets::router())
        .merge(tokens::router())
        .merge(org::router());
    OpenApiRouter::with_openapi(ApiDoc::openapi()).nest("/api/v1", v1)
}

/// The API's routes and their OpenAPI document, generated from the routes themselves.
fn api() -> (Router<AppState>, utoipa::openapi::OpenApi) {
    let (routes, mut spec) = api_routes().split_for_parts();
    document_shared_answers(&mut spec);
    (routes, spec)
}

/// The OpenAPI document.
pub fn openapi() -> utoipa::openapi::OpenApi {
    api().1
}

/// Documents, on every operation they apply to, the answers that come from the shared
/// extractors and layers rather than the handler: a missing or bad token and the rate limit
/// ([`caller`]), the cap on requests in progress ([`overload`]) and the database unavailable, a
/// query string that does not parse ([`extract::Params`]), a body that is not JSON, too large or
/// not of its shape ([`extract::Body`]). An operation's own description of a status wins.
fn document_shared_answers(spec: &mut utoipa::openapi::OpenApi) {
    let error = |description: &str| {
        ResponseBuilder::new()
            .description(description)
            .content("application/json", Content::new(Some(Ref::from_schema_name("ErrorBody"))))
    };
    let text = |description: &str| {
        HeaderBuilder::new().schema(Object::with_type(Type::String)).description(Some(description)).build()
    };
    let shared = [
        (
            "Unauthorized",
            error("No token, or one that is not valid, expired or revoked")
                .header("WWW-Authenticate", text("`Bearer`"))
                .build(),
        ),
        (
            "TooManyRequests",
            error("This token made too many requests, or holds too many streams open (`watch=true`), or the server holds its limit of streams")
                .header("Retry-After", text("Seconds to wait before the next request"))
                .build(),
        ),
        (
            "Unavailable",
            error("The server is at its limit of requests in progress (`overloaded`), or its database is unavailable (`unavailable`)")
                .header("Retry-After", text("Seconds to wait before trying again, when `overloaded`"))
                .build(),
        ),
        ("BadRequest", error("A query string or body that does not parse, or an unknown field").build()),
        ("PayloadTooLarge", error(&format!("The body is larger than {BODY_LIMIT} bytes")).build()),
        ("UnsupportedMediaType", error("The body is not sent as application/json").build()),
    ];
    let components = spec.components.get_or_insert_with(Default::default);
    for (name, response) in shared {
        components.responses.insert(name.into(), response.into());
    }

    for item in spec.paths.paths.values_mut() {
        let ops = [&mut item.get, &mut item.put, &mut item.post, &mut item.delete, &mut item.patch];
        for op in ops.into_iter().flatten() {
            let mut answers = Vec::new();
            if op.security.as_ref().is_some_and(|s| !s.is_empty()) {
                answers.extend([("401", "Unauthorized"), ("429", "TooManyRequests"), ("503", "Unavailable")]);
            }
            let query = op.parameters.iter().flatten().any(|p| p.parameter_in == ParameterIn::Query);
            if query || op.request_body.is_some() {
                answers.push(("400", "BadRequest"));
            }
            if op.request_body.is_some() {
                answers.extend([("413", "PayloadTooLarge"), ("415", "UnsupportedMediaType")]);
            }
            for (status, name) in answers {
                op.responses
                    .responses
                    .entry(status.into())
                    .or_insert_with(|| Ref::from_response_name(name).into());
            }
        }
    }
}

/// `/metrics` without a token, for a listen address of its own that only Prometheus reaches.
pub fn metrics_router(state: AppState) -> Router {
    Router::new().route("/metrics", get(crate::observe::scrape)).with_state(state)
}

pub fn router(state: AppState) -> Router {
    // Counters recorded before the recorder exists would be lost.
    crate::observe::handle();
    let (api, spec) = api();
    // Answers hold tokens, secrets' names and state that changes by the second: no browser or
    // proxy keeps one.
    let api = api.layer(tower_http::set_header::SetResponseHeaderLayer::if_not_present(
        axum::http::header::CACHE_CONTROL,
        axum::http::HeaderValue::from_static("no-store"),
    ));
    let open = Router::new()
        .merge(agent::open_router())
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .layer(axum::middleware::from_fn_with_state(state.address_limiter.clone(), limit::by_address));
    Router::new()
        .merge(overload::cap(api, state.max_in_flight))
        .merge(agent::router())
        .merge(open)
        .merge(SwaggerUi::new("/docs").url("/openapi.json", spec))
        .route("/metrics", get(crate::observe::scrape_as_admin))
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
