//! An organisation admin's say over a machine's life: cordon it (no new workers), drain it
//! (its work goes elsewhere), make it eligible again, bound what it sends to peers and
//! receives from them, or delete it (its credential stops working at once and its workers fail
//! with a reason that says so).

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use chrono::{Duration, Utc};
use serde::Deserialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::caller::Caller;
use super::error::{ApiError, ErrorBody};
use super::extract::{Body, Params, Path};
use super::machines::{Machine, MachineRef, find, to_object};
use crate::controllers::{drain, liveness};
use crate::domain::machine::TransferLimits;
use crate::hub;
use crate::store;

/// A drain's default time for running workers to end, as Nomad's.
const DRAIN_DEADLINE: u32 = 3600;
const DRAIN_DEADLINE_MAX: u32 = 7 * 24 * 3600;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(cordon))
        .routes(routes!(uncordon))
        .routes(routes!(drain_machine))
        .routes(routes!(put_transfer_limits))
        .routes(routes!(delete))
}

/// Cordon a machine: it takes no new workers (fills for the workers already there aside);
/// those there run on.
#[utoipa::path(post, path = "/machines/{name}/cordon", tag = "machines", params(("name" = String, Path), MachineRef),
    responses(
        (status = 200, body = Machine),
        (status = 403, description = "Not an organisation admin's token", body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "Several clusters have a machine of that name: add `cluster`", body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn cordon(
    State(app): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    Params(at): Params<MachineRef>,
) -> Result<Json<Machine>, ApiError> {
    caller.require_org_admin("cordon machines")?;
    set_cordoned(&app, &name, at, true).await
}

/// Make a cordoned or draining machine eligible for new workers again.
#[utoipa::path(post, path = "/machines/{name}/uncordon", tag = "machines", params(("name" = String, Path), MachineRef),
    responses(
        (status = 200, body = Machine),
        (status = 403, description = "Not an organisation admin's token", body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "Several clusters have a machine of that name: add `cluster`", body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn uncordon(
    State(app): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    Params(at): Params<MachineRef>,
) -> Result<Json<Machine>, ApiError> {
    caller.require_org_admin("make machines eligible")?;
    set_cordoned(&app, &name, at, false).await
}

async fn set_cordoned(
    app: &AppState,
    name: &str,
    at: MachineRef,
    cordoned: bool,
) -> Result<Json<Machine>, ApiError> {
    let m = find(app, name, at.cluster.as_deref()).await?;
    let mut tx = app.db.begin().await?;
    let record = store::machines::set_cordoned(&mut *tx, m.id, cordoned).await?;
    let (reason, message) = if cordoned {
        ("Cordoned", "takes no new workers")
    } else {
        ("Uncordoned", "takes new workers again")
    };
    drain::record_event(&mut *tx, &m.name, reason, message).await?;
    if !cordoned {
        hub::request_schedule(&mut *tx).await?;
    }
    tx.commit().await?;
    Ok(Json(to_object(record)))
}

/// Bound what a machine's agent sends to peers and receives from them, in bytes a second over
/// all its transfers (its next heartbeat brings the limits; its own flags still hold where
/// lower). Uploads within their limit leave the machine's disk and network to the workers that
/// read its copies.
#[utoipa::path(put, path = "/machines/{name}/transfer-limits", tag = "machines",
    params(("name" = String, Path), MachineRef),
    request_body = TransferLimits,
    responses(
        (status = 200, body = Machine),
        (status = 403, description = "Not an organisation admin's token", body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "Several clusters have a machine of that name: add `cluster`", body = ErrorBody),
        (status = 422, body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn put_transfer_limits(
    State(app): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    Params(at): Params<MachineRef>,
    Body(limits): Body<TransferLimits>,
) -> Result<Json<Machine>, ApiError> {
    caller.require_org_admin("limit machines' transfers")?;
    if let Some((field, why)) = limits.invalid() {
        return Err(ApiError::invalid(field, why));
    }
    let m = find(&app, &name, at.cluster.as_deref()).await?;
    let record = store::machines::set_transfer_limits(&app.db, m.id, &limits).await?;
    let record = record.ok_or_else(|| ApiError::not_found("machine", &name))?;
    Ok(Json(to_object(record)))
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DrainInput {
    /// How long the workers running there may go on, in seconds (default 3600, at most 7 days);
    /// those left then fail. 0 fails them at once.
    #[schema(minimum = 0, maximum = 604800)]
    pub deadline_seconds: Option<u32>,
}

/// Drain a machine: it is cordoned, its workers that have not started are placed again
/// elsewhere, and those running have until the deadline. Once none is left it stays cordoned.
#[utoipa::path(post, path = "/machines/{name}/drain", tag = "machines", params(("name" = String, Path), MachineRef),
    request_body = DrainInput,
    responses(
        (status = 200, body = Machine),
        (status = 403, description = "Not an organisation admin's token", body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "Several clusters have a machine of that name: add `cluster`", body = ErrorBody),
        (status = 422, body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn drain_machine(
    State(app): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    Params(at): Params<MachineRef>,
    Body(input): Body<DrainInput>,
) -> Result<Json<Machine>, ApiError> {
    caller.require_org_admin("drain machines")?;
    let seconds = input.deadline_seconds.unwrap_or(DRAIN_DEADLINE);
    if seconds > DRAIN_DEADLINE_MAX {
        return Err(ApiError::invalid("deadline_seconds", "must be at most 604800 (7 days)"));
    }
    let m = find(&app, &name, at.cluster.as_deref()).await?;
    let mut tx = app.db.begin().await?;
    let record = drain::begin(&mut tx, m.id, &m.name, Utc::now() + Duration::seconds(seconds.into())).await?;
    tx.commit().await?;
    Ok(Json(to_object(record)))
}

/// Delete a machine: its credential stops working at once, its workers fail with a reason
/// that says so, and its copies and fill runs go. The agent stops its containers; to come
/// back, the machine joins again with a new join token.
#[utoipa::path(delete, path = "/machines/{name}", tag = "machines", params(("name" = String, Path), MachineRef),
    responses(
        (status = 204, description = "Deleted"),
        (status = 403, description = "Not an organisation admin's token", body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "Several clusters have a machine of that name: add `cluster`", body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn delete(
    State(app): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    Params(at): Params<MachineRef>,
) -> Result<StatusCode, ApiError> {
    caller.require_org_admin("delete machines")?;
    let m = find(&app, &name, at.cluster.as_deref()).await?;
    let mut tx = app.db.begin().await?;
    let reason = format!("machine {} was deleted by an organisation admin", m.name);
    let failed = liveness::fail_workers_on(&mut tx, m.id, &reason).await?;
    let why = format!("its peer {} was deleted by an organisation admin", m.name);
    liveness::fail_pulls_from(&mut tx, m.id, &why).await?;
    // Ends its agent's long-poll on commit: it asks again, is refused, and stops its containers.
    store::machines::touch_assignments(&mut *tx, &[m.id]).await?;
    if !store::machines::delete(&mut tx, m.id).await? {
        return Err(ApiError::not_found("machine", &name));
    }
    // Every replica forgets the credential it remembered as good.
    hub::revoked(&mut *tx, m.id).await?;
    let message = format!("{failed} workers failed; its credential no longer works");
    drain::record_event(&mut *tx, &m.name, "Deleted", &message).await?;
    hub::request_schedule(&mut *tx).await?;
    tx.commit().await?;
    // At once on this replica, as a token's revocation, without waiting for the notification.
    app.hub.credentials.forget(m.id);
    app.hub.beats.forget(m.id);
    Ok(StatusCode::NO_CONTENT)
}
