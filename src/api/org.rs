//! Organisation administration: workspaces, clusters, and the host paths each workspace may use.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::caller::Caller;
use super::error::{ApiError, ErrorBody, on_constraint};
use super::extract::{Body, Path};
use super::list::List;
use crate::domain::grant::{Grant, GrantInput};
use crate::domain::{FieldError, Name};
use crate::store;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_workspaces, create_workspace))
        .routes(routes!(list_clusters, create_cluster))
        .routes(routes!(get_origin_fills, put_origin_fills))
        .routes(routes!(get_host_paths, put_host_paths))
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NameInput {
    pub name: Name,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Named {
    pub name: String,
    pub created_at: DateTime<Utc>,
}

/// The host paths a workspace may use on a cluster.
#[derive(Debug, Serialize, ToSchema)]
pub struct HostPaths {
    /// Drives of the workspace may use these folders and what lies below them; the deepest
    /// grant that covers a path decides its mode.
    pub paths: Vec<Grant>,
}

/// The host paths to grant, replacing those granted before.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HostPathsInput {
    /// Each an absolute path (granted `ReadOnly`) or `{path, mode}`.
    pub paths: Vec<GrantInput>,
}

/// List workspaces.
#[utoipa::path(get, path = "/workspaces", tag = "organisation",
    responses((status = 200, body = List<Named>), (status = 403, description = "Not an organisation-admin token", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list_workspaces(
    State(app): State<AppState>,
    caller: Caller,
) -> Result<Json<List<Named>>, ApiError> {
    caller.require_org_admin("list workspaces")?;
    let rows = store::workspaces::list(&app.db).await?;
    let items = rows.into_iter().map(|w| Named { name: w.name, created_at: w.created_at }).collect();
    Ok(Json(List::all(items)))
}

/// Create a workspace.
#[utoipa::path(post, path = "/workspaces", tag = "organisation", request_body = NameInput,
    responses(
        (status = 201, body = Named),
        (status = 403, description = "Not an organisation-admin token", body = ErrorBody),
        (status = 409, body = ErrorBody),
        (status = 422, body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn create_workspace(
    State(app): State<AppState>,
    caller: Caller,
    Body(input): Body<NameInput>,
) -> Result<(StatusCode, Json<Named>), ApiError> {
    caller.require_org_admin("create workspaces")?;
    let name = input.name.as_str();
    let w = store::workspaces::insert(&app.db, name)
        .await
        .map_err(on_constraint("workspaces_name_key", || format!("workspace {name} already exists")))?;
    Ok((StatusCode::CREATED, Json(Named { name: w.name, created_at: w.created_at })))
}

/// List clusters.
#[utoipa::path(get, path = "/clusters", tag = "organisation",
    responses((status = 200, body = List<Named>)), security(("bearer" = [])))]
pub async fn list_clusters(
    State(app): State<AppState>,
    _caller: Caller,
) -> Result<Json<List<Named>>, ApiError> {
    let rows = store::clusters::list(&app.db).await?;
    let items = rows.into_iter().map(|c| Named { name: c.name, created_at: c.created_at }).collect();
    Ok(Json(List::all(items)))
}

/// Create a cluster.
#[utoipa::path(post, path = "/clusters", tag = "organisation", request_body = NameInput,
    responses(
        (status = 201, body = Named),
        (status = 403, description = "Not an organisation-admin token", body = ErrorBody),
        (status = 409, body = ErrorBody),
        (status = 422, body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn create_cluster(
    State(app): State<AppState>,
    caller: Caller,
    Body(input): Body<NameInput>,
) -> Result<(StatusCode, Json<Named>), ApiError> {
    caller.require_org_admin("create clusters")?;
    let name = input.name.as_str();
    let c = store::clusters::insert(&app.db, name)
        .await
        .map_err(on_constraint("clusters_pkey", || format!("cluster {name} already exists")))?;
    Ok((StatusCode::CREATED, Json(Named { name: c.name, created_at: c.created_at })))
}

/// How many fills from the origin (drives' fill templates) a cluster runs at once. Copies
/// pulled from peers are not counted.
#[derive(Debug, Serialize, ToSchema)]
pub struct OriginFills {
    /// At most this many at once; absent for no limit. Fills past it wait for one to end.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_concurrent: Option<u32>,
    /// Fills from the origin that have not ended.
    pub running: u64,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OriginFillsInput {
    /// 1–100000, or null for no limit.
    pub max_concurrent: Option<u32>,
}

async fn origin_fills(app: &AppState, cluster: &str) -> Result<OriginFills, ApiError> {
    let found = store::clusters::origin_fills(&app.db, &[cluster.to_owned()]).await?.pop();
    let c = found.ok_or_else(|| ApiError::not_found("cluster", cluster))?;
    Ok(OriginFills {
        max_concurrent: c.max_origin_fills.map(|m| m.max(0) as u32),
        running: c.running.max(0) as u64,
    })
}

/// A cluster's limit on fills from the origin at once.
#[utoipa::path(get, path = "/clusters/{cluster}/origin-fills", tag = "organisation",
    params(("cluster" = String, Path)),
    responses((status = 200, body = OriginFills), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn get_origin_fills(
    State(app): State<AppState>,
    _caller: Caller,
    Path(cluster): Path<String>,
) -> Result<Json<OriginFills>, ApiError> {
    Ok(Json(origin_fills(&app, &cluster).await?))
}

/// Set a cluster's limit on fills from the origin at once.
#[utoipa::path(put, path = "/clusters/{cluster}/origin-fills", tag = "organisation",
    params(("cluster" = String, Path)), request_body = OriginFillsInput,
    responses(
        (status = 200, body = OriginFills),
        (status = 403, description = "Not an organisation-admin token", body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 422, body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn put_origin_fills(
    State(app): State<AppState>,
    caller: Caller,
    Path(cluster): Path<String>,
    Body(input): Body<OriginFillsInput>,
) -> Result<Json<OriginFills>, ApiError> {
    caller.require_org_admin("limit fills from the origin")?;
    let max = match input.max_concurrent {
        None => None,
        Some(n @ 1..=100_000) => Some(n as i32),
        Some(_) => return Err(ApiError::invalid("max_concurrent", "must be 1–100000, or null for no limit")),
    };
    if !store::clusters::set_max_origin_fills(&app.db, &cluster, max).await? {
        return Err(ApiError::not_found("cluster", &cluster));
    }
    crate::hub::request_schedule(&app.db).await?;
    Ok(Json(origin_fills(&app, &cluster).await?))
}

async fn target(app: &AppState, workspace: &str, cluster: &str) -> Result<uuid::Uuid, ApiError> {
    let ws = match Name::parse(workspace) {
        Ok(name) => store::workspaces::by_name(&app.db, name.as_str()).await?,
        Err(_) => None,
    };
    let ws = ws.ok_or_else(|| ApiError::not_found("workspace", workspace))?;
    super::machines::cluster(app, cluster).await?;
    Ok(ws.id)
}

/// The host paths a workspace may use on a cluster.
#[utoipa::path(get, path = "/workspaces/{workspace}/clusters/{cluster}/host-paths", tag = "organisation",
    params(("workspace" = String, Path), ("cluster" = String, Path)),
    responses(
        (status = 200, body = HostPaths),
        (status = 403, description = "Not an organisation-admin token", body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn get_host_paths(
    State(app): State<AppState>,
    caller: Caller,
    Path((workspace, cluster)): Path<(String, String)>,
) -> Result<Json<HostPaths>, ApiError> {
    caller.require_org_admin("read host-path grants")?;
    let ws = target(&app, &workspace, &cluster).await?;
    Ok(Json(HostPaths { paths: store::grants::list(&app.db, ws, &cluster).await? }))
}

/// Replace the host paths a workspace may use on a cluster.
#[utoipa::path(put, path = "/workspaces/{workspace}/clusters/{cluster}/host-paths", tag = "organisation",
    params(("workspace" = String, Path), ("cluster" = String, Path)), request_body = HostPathsInput,
    responses(
        (status = 200, body = HostPaths),
        (status = 403, description = "Not an organisation-admin token", body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 422, body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn put_host_paths(
    State(app): State<AppState>,
    caller: Caller,
    Path((workspace, cluster)): Path<(String, String)>,
    Body(input): Body<HostPathsInput>,
) -> Result<Json<HostPaths>, ApiError> {
    caller.require_org_admin("grant host paths")?;
    let ws = target(&app, &workspace, &cluster).await?;
    let grants: Vec<Grant> = input.paths.into_iter().map(Grant::from).collect();
    let roots: Vec<FieldError> = grants
        .iter()
        .enumerate()
        .filter(|(_, g)| g.path.is_root())
        .map(|(i, _)| FieldError {
            path: format!("paths[{i}]"),
            message: "granting / would grant the whole machine".into(),
        })
        .collect();
    if !roots.is_empty() {
        return Err(ApiError::Invalid(roots));
    }
    let mut seen = std::collections::HashSet::new();
    let twice: Vec<FieldError> = grants
        .iter()
        .enumerate()
        .filter(|(_, g)| !seen.insert(g.path.clone()))
        .map(|(i, g)| FieldError {
            path: format!("paths[{i}]"),
            message: format!("{} is given twice", g.path),
        })
        .collect();
    if !twice.is_empty() {
        return Err(ApiError::Invalid(twice));
    }
    let mut grants = grants;
    grants.sort_by(|a, b| a.path.as_str().cmp(b.path.as_str()));
    let mut tx = app.db.begin().await?;
    store::grants::replace(&mut tx, ws, &cluster, &grants).await?;
    tx.commit().await?;
    Ok(Json(HostPaths { paths: grants }))
}
