//! A cap on user-API requests in progress. Past it a request is answered 503 at once, with
//! `Retry-After`, instead of queueing for the database behind thousands of others: a saturated
//! server stays quick to say so, and its memory stays bounded. The agent API is not capped, so
//! heartbeats and long-polls keep machines Ready while users flood the API.

use axum::Router;
use axum::error_handling::HandleErrorLayer;
use tower::limit::GlobalConcurrencyLimitLayer;
use tower::load_shed::LoadShedLayer;
use tower::{BoxError, ServiceBuilder};

use super::AppState;
use super::error::ApiError;

/// User-API requests in progress at most, by default: at the API's usual 1–5 ms a request, a
/// quarter to one second of work queued on one replica.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 256;

/// `routes` with at most `max` requests in progress together (a stream counts until its
/// headers are sent); 0 leaves them uncapped.
pub fn cap(routes: Router<AppState>, max: usize) -> Router<AppState> {
    if max == 0 {
        return routes;
    }
    // The limit is not ready when full; load shedding turns "not ready" into an error at once.
    routes.layer(
        ServiceBuilder::new()
            .layer(HandleErrorLayer::new(move |_: BoxError| async move { ApiError::Overloaded(max) }))
            .layer(LoadShedLayer::new())
            .layer(GlobalConcurrencyLimitLayer::new(max)),
    )
}
