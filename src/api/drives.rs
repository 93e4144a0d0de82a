//! `/drives`: create, list, read and delete drives. A drive is immutable once created.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use super::caller::Caller;
use super::error::{ApiError, ErrorBody, on_constraint};
use super::extract::{Body, Params, Path};
use super::list::{List, ListParams, PageParams};
use super::meta::ObjectMeta;
use super::watch::{self, Kind};
use super::{
    AppState, secrets,
    workers::{self, WorkerRef},
};
use crate::domain::copy::{CopyState, LostFiles};
use crate::domain::drive::{DriveSpec, Location, full_name};
use crate::domain::grant::{self, Refused};
use crate::domain::meta::MetaInput;
use crate::domain::progress::{Progress, progress};
use crate::domain::role::Role;
use crate::domain::{Name, Problems};
use crate::hub;
use crate::store::copies::{CopyCounts, CopyRecord};
use crate::store::{self, drives::DriveRecord};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list, create))
        .routes(routes!(get, delete, replace, patch))
        .routes(routes!(list_copies))
        .routes(routes!(list_users))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DriveInput {
    pub metadata: MetaInput,
    pub spec: DriveSpec,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Drive {
    pub metadata: ObjectMeta,
    pub spec: DriveSpec,
    pub status: DriveStatus,
    /// The drive's copy on each machine that holds one, in the order the machines joined. One
    /// drive read alone holds the first 100 (a list of drives, none: see `status.copies`); `GET
    /// /drives/{name}/copies` pages through them all.
    pub copies: Vec<Copy>,
    /// Pass as `cursor` to `GET /drives/{name}/copies` for the copies after these; absent when
    /// there are no more.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub copies_next: Option<Uuid>,
    /// Workers that mount the drive and have not ended, by run (newest first), then index. One
    /// drive read alone holds the first 100 (a list of drives, none); `GET
    /// /drives/{name}/users` pages through them all.
    pub used_by: Vec<WorkerRef>,
    /// Pass as `cursor` to `GET /drives/{name}/users` for the workers after these; absent
    /// when there are no more.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub used_by_next: Option<Uuid>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct DriveStatus {
    /// `<namespace>.<drive>`, as messages and folders name it.
    pub full_name: String,
    /// Where copies live inside a machine's data location.
    pub folder: String,
    /// How many of its copies are in each state, over every machine; only in a list of drives
    /// (one drive read alone holds its copies, a page at a time).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub copies: Option<CopiesByState>,
}

/// A drive's copies, counted by state (a copy being evicted is not counted).
#[derive(Debug, Default, Serialize, ToSchema)]
pub struct CopiesByState {
    pub complete: u64,
    pub filling: u64,
    pub failed: u64,
}

impl From<&CopyCounts> for CopiesByState {
    fn from(c: &CopyCounts) -> CopiesByState {
        let n = |v: i64| v.max(0) as u64;
        CopiesByState { complete: n(c.complete), filling: n(c.filling), failed: n(c.failed) }
    }
}

/// A drive's copy in one machine's data location.
#[derive(Debug, Serialize, ToSchema)]
pub struct Copy {
    pub node: String,
    pub folder: String,
    pub bytes: u64,
    pub complete: bool,
    pub state: CopyState,
    pub last_used_at: Option<DateTime<Utc>>,
    /// The digest (BLAKE3, hex) of the manifest its agent made of the whole copy: every file's size
    /// and content hashes, which a copy pulled from a peer is checked against. Absent until made,
    /// and for a copy holding a symlink or other special file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub manifest: Option<String>,
    /// Where the copy comes from: `peer gpu-02` (pulled from that machine's copy) or `fill` (the
    /// drive's fill template).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// How far the fill has got; only while the copy is `Filling`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub progress: Option<Progress>,
    /// What the copy lost since it was whole (files missing or cut, as its agent found them
    /// against its manifest); until it is whole again.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lost_files: Option<LostFiles>,
}

fn to_copy(full: &str, c: &CopyRecord) -> Copy {
    Copy {
        node: c.machine.clone(),
        folder: format!("{}/drives/{full}", c.data_path.as_deref().unwrap_or_default()),
        bytes: c.bytes.max(0) as u64,
        complete: c.state == CopyState::Complete,
        state: c.state,
        last_used_at: c.last_used_at,
        manifest: c.manifest.clone(),
        source: c.source.clone(),
        progress: (c.state == CopyState::Filling).then(|| progress(&c.fill.with_bytes(c.bytes), Utc::now())),
        lost_files: c.lost.as_ref().map(|l| l.0.clone()),
    }
}

/// A drive as a list shows it: its copies counted (`counts` may hold other drives' too, and
/// none for a drive without copies), none listed.
fn to_listed(caller: &Caller, r: DriveRecord, counts: &[CopyCounts]) -> Drive {
    let counted = counts.iter().find(|c| c.drive_id == r.id).map(CopiesByState::from).unwrap_or_default();
    let mut drive = to_object(caller, r, List::all(vec![]), List::all(vec![]));
    drive.status.copies = Some(counted);
    drive
}

/// A drive with the given pages of its copies and users.
fn to_object(caller: &Caller, r: DriveRecord, copies: List<Copy>, used_by: List<WorkerRef>) -> Drive {
    let full = full_name(&caller.workspace, &r.name);
    Drive {
        metadata: ObjectMeta {
            name: r.name,
            namespace: caller.workspace.clone(),
            uid: r.id,
            created_at: r.created_at,
            labels: r.labels.0,
        },
        spec: r.spec.0,
        status: DriveStatus { folder: format!("drives/{full}"), full_name: full, copies: None },
        copies: copies.items,
        copies_next: copies.next,
        used_by: used_by.items,
        used_by_next: used_by.next,
    }
}

/// Host paths must lie under one the organisation admin granted this workspace on the cluster,
/// and a read-write source under a grant that allows writing.
async fn check_grant(app: &AppState, caller: &Caller, spec: &DriveSpec) -> Result<(), ApiError> {
    let path = match spec.location() {
        Location::Placed(_) => return Ok(()),
        Location::Shared(p) | Location::Node(_, p) => p,
    };
    let grants = store::grants::list(&app.db, caller.workspace_id, spec.cluster.as_str()).await?;
    match grant::allow(&grants, &path, spec.source().mode) {
        Ok(_) => Ok(()),
        Err(Refused::Uncovered) => Err(ApiError::invalid(
            "spec.sources[0].path",
            format!(
                "{path} is not under a host path granted to workspace {} on cluster {} \
                 (an organisation admin grants them in Settings → Clusters → Change → Host paths)",
                caller.workspace, spec.cluster
            ),
        )),
        Err(Refused::ReadOnly(granted)) => Err(ApiError::invalid(
            "spec.sources[0].mode",
            format!("{path} is under {granted}, granted ReadOnly: its drives mount it ReadOnly"),
        )),
    }
}

/// Create a drive.
#[utoipa::path(post, path = "/drives", tag = "drives", request_body = DriveInput,
    responses(
        (status = 201, description = "Created", body = Drive),
        (status = 400, description = "Malformed JSON or an unknown field", body = ErrorBody),
        (status = 403, description = "A viewer token", body = ErrorBody),
        (status = 409, description = "The name is taken", body = ErrorBody),
        (status = 422, description = "An invalid value", body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn create(
    State(app): State<AppState>,
    caller: Caller,
    Body(input): Body<DriveInput>,
) -> Result<(StatusCode, Json<Drive>), ApiError> {
    caller.require(Role::Editor, "create drives")?;
    let mut problems = Problems::default();
    input.metadata.check(&mut problems);
    input.spec.check(&mut problems);
    problems.finish().map_err(ApiError::Invalid)?;
    if !store::clusters::exists(&app.db, input.spec.cluster.as_str()).await? {
        return Err(ApiError::invalid(
            "spec.cluster",
            format!("cluster {} does not exist", input.spec.cluster),
        ));
    }
    check_grant(&app, &caller, &input.spec).await?;
    if let Some(fill) = &input.spec.fill {
        secrets::check_refs(&app, &caller, &fill.template, "spec.fill.template").await?;
    }
    let name = input.metadata.name.as_str();
    let record =
        store::drives::insert(&app.db, caller.workspace_id, name, &input.metadata.labels, &input.spec)
            .await
            .map_err(on_constraint("drives_workspace_name_key", || format!("drive {name} already exists")))?;
    Ok((StatusCode::CREATED, Json(to_object(&caller, record, List::all(vec![]), List::all(vec![])))))
}

/// List the workspace's drives, newest first, each with its copies counted by state.
#[utoipa::path(get, path = "/drives", tag = "drives", params(ListParams),
    responses(
        (status = 200, description = "A page, or with `watch=true` a stream of changes", content(
            (List<Drive> = "application/json"),
            (String = "application/x-ndjson"),
            (String = "text/event-stream"),
        )),
        (status = 410, description = "With `watch=true`: `resource_version` is older than the retained changes", body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn list(
    State(app): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Params(params): Params<ListParams>,
) -> Result<Response, ApiError> {
    let page = params.page()?;
    if params.watch {
        let initial = match params.resource_version {
            Some(_) => vec![],
            None => store::drives::list(&app.db, caller.workspace_id, watch::ALL).await?,
        };
        let names = initial.into_iter().rev().map(|r| r.name).collect();
        return watch::stream(app, caller, Kind::Drives, params.resource_version, names, &headers).await;
    }
    let version = store::changes::latest(&app.db).await?;
    let rows = store::drives::list(&app.db, caller.workspace_id, page).await?;
    let ids: Vec<_> = rows.iter().map(|r| r.id).collect();
    let counts = store::copies::counts(&app.db, &ids).await?;
    let list = List::from_rows(rows, page.limit, |r| r.id, |r| to_listed(&caller, r, &counts));
    Ok(Json(list.at(version)).into_response())
}

async fn find(app: &AppState, caller: &Caller, name: &str) -> Result<DriveRecord, ApiError> {
    let found = match Name::parse(name) {
        Ok(n) => store::drives::get(&app.db, caller.workspace_id, n.as_str()).await?,
        Err(_) => None,
    };
    found.ok_or_else(|| ApiError::not_found("drive", name))
}

/// Read a drive with its copies and the workers that use it.
#[utoipa::path(get, path = "/drives/{name}", tag = "drives", params(("name" = String, Path)),
    responses((status = 200, body = Drive), (status = 404, body = ErrorBody)), security(("bearer" = [])))]
pub async fn get(
    State(app): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Json<Drive>, ApiError> {
    load(&app, &caller, &name).await.map(Json)
}

/// One drive with the first page of its copies and of the workers that use it. Counting every
/// copy by state as well cost 2.0 ms of Postgres at 1,000 copies, more than both pages.
pub async fn load(app: &AppState, caller: &Caller, name: &str) -> Result<Drive, ApiError> {
    let record = find(app, caller, name).await?;
    let copies = copies_page(app, caller, &record, &PageParams::FIRST).await?;
    let used_by = users_page(app, &record, &PageParams::FIRST).await?;
    Ok(to_object(caller, record, copies, used_by))
}

async fn copies_page(
    app: &AppState,
    caller: &Caller,
    drive: &DriveRecord,
    params: &PageParams,
) -> Result<List<Copy>, ApiError> {
    let limit = params.fetch_limit()?;
    let rows = store::copies::for_drive(&app.db, drive.id, params.cursor, limit).await?;
    let full = full_name(&caller.workspace, &drive.name);
    Ok(List::from_rows(rows, limit, |c| c.machine_id, |c| to_copy(&full, &c)))
}

async fn users_page(
    app: &AppState,
    drive: &DriveRecord,
    params: &PageParams,
) -> Result<List<WorkerRef>, ApiError> {
    let limit = params.fetch_limit()?;
    let after = workers::after_cursor(app, params.cursor).await?;
    let rows = store::workers::using_drive(&app.db, drive.id, after, limit).await?;
    Ok(List::from_rows(rows, limit, |w| w.id, WorkerRef::from))
}

/// A page of the drive's copies, in the order the machines that hold them joined.
#[utoipa::path(get, path = "/drives/{name}/copies", tag = "drives",
    params(("name" = String, Path), PageParams),
    responses(
        (status = 200, body = List<Copy>),
        (status = 400, description = "A limit out of range", body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn list_copies(
    State(app): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    Params(params): Params<PageParams>,
) -> Result<Json<List<Copy>>, ApiError> {
    let record = find(&app, &caller, &name).await?;
    copies_page(&app, &caller, &record, &params).await.map(Json)
}

/// A page of the workers that mount the drive and have not ended, by run (newest first), then
/// index.
#[utoipa::path(get, path = "/drives/{name}/users", tag = "drives",
    params(("name" = String, Path), PageParams),
    responses(
        (status = 200, body = List<WorkerRef>),
        (status = 400, description = "A limit out of range", body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 410, description = "`cursor` names a worker whose run was deleted", body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn list_users(
    State(app): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    Params(params): Params<PageParams>,
) -> Result<Json<List<WorkerRef>>, ApiError> {
    let record = find(&app, &caller, &name).await?;
    users_page(&app, &record, &params).await.map(Json)
}

/// Delete a drive. Refused while a worker that has not ended mounts it.
#[utoipa::path(delete, path = "/drives/{name}", tag = "drives", params(("name" = String, Path)),
    responses(
        (status = 204, description = "Deleted"),
        (status = 403, description = "A viewer token", body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "A worker uses the drive", body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn delete(
    State(app): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    caller.require(Role::Editor, "delete drives")?;
    let mut tx = app.db.begin().await?;
    let id = match Name::parse(&name) {
        Ok(n) => store::drives::lock_for_delete(&mut tx, caller.workspace_id, n.as_str()).await?,
        Err(_) => None,
    };
    let id = id.ok_or_else(|| ApiError::not_found("drive", &name))?;
    if let Some(w) = store::workers::using_drive(&mut *tx, id, None, 1).await?.first() {
        return Err(ApiError::Conflict(format!(
            "drive {name} is used by worker {} ({:?}): delete run {} first",
            w.name, w.state, w.run_name
        )));
    }
    // Its fills stop and give their machines' resources back; copies and fill runs go with the
    // drive, and each agent deletes its folder when its next heartbeat finds no copy wanted.
    let mut machines = Vec::new();
    for run in store::fills::lock_for_drive(&mut tx, id).await? {
        machines.extend(store::workers::release_run(&mut tx, run).await?);
    }
    store::drives::delete(&mut *tx, id).await?;
    store::machines::touch_assignments(&mut *tx, &machines).await?;
    hub::request_schedule(&mut *tx).await?;
    tx.commit().await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn immutable(app: &AppState, caller: &Caller, name: &str) -> ApiError {
    if let Err(e) = caller.require(Role::Editor, "change drives") {
        return e;
    }
    match find(app, caller, name).await {
        Ok(_) => ApiError::MethodNotAllowed(format!(
            "drive {name} cannot be changed: a drive is immutable; delete it and create it again"
        )),
        Err(e) => e,
    }
}

/// Drives cannot be replaced: delete the drive and create it again.
#[utoipa::path(put, path = "/drives/{name}", tag = "drives", params(("name" = String, Path)),
    responses(
        (status = 405, description = "Always, for a drive that exists", body = ErrorBody),
        (status = 403, description = "A viewer token", body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn replace(State(app): State<AppState>, caller: Caller, Path(name): Path<String>) -> ApiError {
    immutable(&app, &caller, &name).await
}

/// Drives cannot be patched: delete the drive and create it again.
#[utoipa::path(patch, path = "/drives/{name}", tag = "drives", params(("name" = String, Path)),
    responses(
        (status = 405, description = "Always, for a drive that exists", body = ErrorBody),
        (status = 403, description = "A viewer token", body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn patch(State(app): State<AppState>, caller: Caller, Path(name): Path<String>) -> ApiError {
    immutable(&app, &caller, &name).await
}
