//! `/events?object=KIND/NAME`: why things happened to an object, newest last.

use axum::Json;
use axum::extract::State;
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::caller::Caller;
use super::error::{ApiError, ErrorBody};
use super::extract::Params;
use super::list::List;
use crate::domain::name::could_name_object;
use crate::store::{self, events::Event};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(list))
}

const KINDS: [&str; 4] = ["run", "worker", "drive", "machine"];

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct EventParams {
    /// `run/NAME` (with its workers' events), `worker/NAME`, `drive/NAME` or `machine/NAME`.
    pub object: String,
    /// At most this many of the newest events (default 100, at most 1000).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<i64>,
}

/// Events of one object: decisions of the scheduler, the fill controller, liveness and agents.
#[utoipa::path(get, path = "/events", tag = "events", params(EventParams),
    responses((status = 200, body = List<Event>), (status = 400, body = ErrorBody)), security(("bearer" = [])))]
pub async fn list(
    State(app): State<AppState>,
    caller: Caller,
    Params(p): Params<EventParams>,
) -> Result<Json<List<Event>>, ApiError> {
    let object = p.object.split_once('/').filter(|(k, n)| KINDS.contains(k) && could_name_object(n));
    let Some((kind, name)) = object else {
        let kinds = KINDS.join(", ");
        return Err(ApiError::bad_param(
            "object",
            format!("must be KIND/NAME with KIND one of {kinds} and NAME an object's name"),
        ));
    };
    let limit = p.limit.unwrap_or(100);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::bad_param("limit", "must be between 1 and 1000".into()));
    }
    let items = store::events::for_object(&app.db, caller.workspace_id, kind, name, limit).await?;
    Ok(Json(List::all(items)))
}
