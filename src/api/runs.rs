//! `/runs`: submit, list, read and delete runs; each run's workers under it.

use std::collections::{HashMap, HashSet};

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

use super::AppState;
use super::caller::Caller;
use super::error::{ApiError, ErrorBody, on_constraint};
use super::extract::{Body, Params, Path};
use super::list::{List, ListParams, PageParams};
use super::meta::ObjectMeta;
use super::secrets;
use super::watch::{self, Kind};
use super::workers::{self, Worker};
use crate::domain::Problems;
use crate::domain::drive::Location;
use crate::domain::grant::{self, Grant, Refused};
use crate::domain::meta::MetaInput;
use crate::domain::name::could_name_object;
use crate::domain::role::Role;
use crate::domain::run::{RunSpec, RunState};
use crate::hub;
use crate::store::{self, drives::DriveRecord, runs::RunRecord};

/// Fill runs are named `fill-<drive>-<machine>`; users pick other names.
pub const FILL_PREFIX: &str = "fill-";

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list, create))
        .routes(routes!(get, delete))
        .routes(routes!(list_workers))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RunInput {
    pub metadata: MetaInput,
    pub spec: RunSpec,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Run {
    pub metadata: ObjectMeta,
    pub spec: RunSpec,
    pub status: RunStatus,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct RunStatus {
    /// `Pending`, `Running`, `Completed` or `Failed`.
    pub state: RunState,
    /// Why, in a person's words: `Waiting for workers to start`, `1 of 1 workers running`, …
    pub reason: String,
    /// When the state or reason last changed.
    pub updated_at: DateTime<Utc>,
    /// The run's workers in index order: one run read alone holds the first 100 (a list of
    /// runs, none); `GET /runs/{name}/workers` pages through them all.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workers: Option<Vec<Worker>>,
    /// Pass as `cursor` to `GET /runs/{name}/workers` for the workers after these; absent when
    /// there are no more.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workers_next: Option<Uuid>,
}

fn to_object(namespace: &str, r: RunRecord, workers: Option<List<Worker>>) -> Run {
    let (workers, workers_next) = match workers {
        Some(page) => (Some(page.items), page.next),
        None => (None, None),
    };
    Run {
        metadata: ObjectMeta {
            name: r.name,
            namespace: namespace.to_owned(),
            uid: r.id,
            created_at: r.created_at,
            labels: r.labels.0,
        },
        spec: r.spec.0,
        status: RunStatus {
            state: r.state,
            reason: r.reason,
            updated_at: r.updated_at,
            workers,
            workers_next,
        },
    }
}

/// Fills in each mount's path and mode from its drive, and checks what needs the drives: a
/// host path is still granted (`grants`, the workspace's on the run's cluster), read-write
/// only under a grant that allows writing.
fn resolve_mounts(spec: &mut RunSpec, drives: &[DriveRecord], grants: &[Grant], p: &mut Problems) {
    let by_name: HashMap<&str, &DriveRecord> = drives.iter().map(|d| (d.name.as_str(), d)).collect();
    let mut mount_paths = HashSet::new();
    for (i, r) in spec.task_template.datavolume_refs.iter_mut().enumerate() {
        let at = format!("spec.task_template.datavolume_refs[{i}]");
        let Some(drive) = by_name.get(r.name.as_str()) else {
            p.add(format!("{at}.name"), format!("drive {} does not exist", r.name));
            continue;
        };
        let source = drive.spec.0.source();
        if drive.spec.0.cluster != spec.cluster {
            p.add(
                format!("{at}.name"),
                format!(
                    "drive {} is on cluster {}, the run on {}",
                    r.name, drive.spec.0.cluster, spec.cluster
                ),
            );
        }
        let mount = r.mount_path.get_or_insert_with(|| source.mount_path.clone());
        if !mount_paths.insert(mount.as_str().to_owned()) {
            p.add(
                format!("{at}.mount_path"),
                format!("{mount} is already used by another drive of this task"),
            );
        }
        let mode = *r.mode.get_or_insert(source.mode);
        let (Location::Shared(path) | Location::Node(_, path)) = drive.spec.0.location() else { continue };
        match grant::allow(grants, &path, mode) {
            Ok(_) => {}
            Err(Refused::Uncovered) => p.add(
                format!("{at}.name"),
                format!(
                    "drive {}'s path {path} is no longer under a host path granted to this workspace",
                    r.name
                ),
            ),
            Err(Refused::ReadOnly(granted)) => p.add(
                format!("{at}.mode"),
                format!(
                    "drive {} is at {path}, under {granted}, granted ReadOnly: mount it ReadOnly",
                    r.name
                ),
            ),
        }
    }
}

/// Submit a run. Its workers start Pending.
#[utoipa::path(post, path = "/runs", tag = "runs", request_body = RunInput,
    responses(
        (status = 201, description = "Created", body = Run),
        (status = 400, description = "Malformed JSON or an unknown field", body = ErrorBody),
        (status = 403, description = "A viewer token", body = ErrorBody),
        (status = 409, description = "The name is taken", body = ErrorBody),
        (status = 422, description = "An invalid value", body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn create(
    State(app): State<AppState>,
    caller: Caller,
    Body(input): Body<RunInput>,
) -> Result<(StatusCode, Json<Run>), ApiError> {
    caller.require(Role::Editor, "create runs")?;
    let RunInput { metadata, mut spec } = input;
    let mut problems = Problems::default();
    metadata.check(&mut problems);
    spec.check(&mut problems);
    if metadata.name.as_str().starts_with(FILL_PREFIX) {
        problems.add("metadata.name", "names starting with fill- are kept for fill runs");
    }
    problems.finish().map_err(ApiError::Invalid)?;
    if !store::clusters::exists(&app.db, spec.cluster.as_str()).await? {
        return Err(ApiError::invalid("spec.cluster", format!("cluster {} does not exist", spec.cluster)));
    }
    secrets::check_refs(&app, &caller, &spec.task_template, "spec.task_template").await?;

    let mut tx = app.db.begin().await?;
    let drive_names: Vec<String> =
        spec.task_template.datavolume_refs.iter().map(|r| r.name.to_string()).collect();
    let drives = store::drives::lock_for_share(&mut tx, caller.workspace_id, &drive_names).await?;
    let grants = store::grants::list(&mut *tx, caller.workspace_id, spec.cluster.as_str()).await?;
    let mut problems = Problems::default();
    resolve_mounts(&mut spec, &drives, &grants, &mut problems);
    problems.finish().map_err(ApiError::Invalid)?;
    let name = metadata.name.as_str();
    let drive_ids: Vec<_> = drives.iter().map(|d| d.id).collect();
    let run = store::runs::insert(&mut tx, caller.workspace_id, name, &metadata.labels, &spec, &drive_ids)
        .await
        .map_err(on_constraint("runs_workspace_name_key", || format!("run {name} already exists")))?;
    hub::request_schedule(&mut *tx).await?;
    tx.commit().await?;
    Ok((StatusCode::CREATED, Json(to_object(&caller.workspace, run, None))))
}

/// List runs, newest first: those not yet ended, or all with `all=true`.
#[utoipa::path(get, path = "/runs", tag = "runs", params(ListParams),
    responses(
        (status = 200, description = "A page, or with `watch=true` a stream of changes", content(
            (List<Run> = "application/json"),
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
            None => store::runs::list(&app.db, caller.workspace_id, params.all, watch::ALL).await?,
        };
        let names = initial.into_iter().rev().map(|r| r.name).collect();
        return watch::stream(app, caller, Kind::Runs, params.resource_version, names, &headers).await;
    }
    let version = store::changes::latest(&app.db).await?;
    let rows = store::runs::list(&app.db, caller.workspace_id, params.all, page).await?;
    let list = List::from_rows(rows, page.limit, |r| r.id, |r| to_object(&caller.workspace, r, None));
    Ok(Json(list.at(version)).into_response())
}

async fn find(app: &AppState, caller: &Caller, name: &str) -> Result<RunRecord, ApiError> {
    // A fill run's name may be longer than a name a user picks.
    let found = if could_name_object(name) {
        store::runs::get(&app.db, caller.workspace_id, name).await?
    } else {
        None
    };
    found.ok_or_else(|| ApiError::not_found("run", name))
}

/// Read a run with its first 100 workers.
#[utoipa::path(get, path = "/runs/{name}", tag = "runs", params(("name" = String, Path)),
    responses((status = 200, body = Run), (status = 404, body = ErrorBody)), security(("bearer" = [])))]
pub async fn get(
    State(app): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Json<Run>, ApiError> {
    load(&app, &caller, &name).await.map(Json)
}

/// One run with the first page of its workers.
pub async fn load(app: &AppState, caller: &Caller, name: &str) -> Result<Run, ApiError> {
    let run = find(app, caller, name).await?;
    let workers = workers_page(app, caller, &run, &PageParams::FIRST).await?;
    Ok(to_object(&caller.workspace, run, Some(workers)))
}

async fn workers_page(
    app: &AppState,
    caller: &Caller,
    run: &RunRecord,
    params: &PageParams,
) -> Result<List<Worker>, ApiError> {
    let limit = params.fetch_limit()?;
    let after = match params.cursor {
        Some(id) => match store::workers::position(&app.db, id).await? {
            Some(p) if p.run_id == run.id => Some(p.index),
            _ => {
                return Err(ApiError::bad_param(
                    "cursor",
                    format!("{id} names no worker of run {}", run.name),
                ));
            }
        },
        None => None,
    };
    let rows = store::workers::page_of_run(&app.db, run.id, after, limit).await?;
    Ok(workers::page(caller, rows, limit))
}

/// A page of the run's workers, in index order.
#[utoipa::path(get, path = "/runs/{name}/workers", tag = "runs",
    params(("name" = String, Path), PageParams),
    responses(
        (status = 200, body = List<Worker>),
        (status = 400, description = "A limit out of range, or a cursor naming no worker of the run", body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn list_workers(
    State(app): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    Params(params): Params<PageParams>,
) -> Result<Json<List<Worker>>, ApiError> {
    let run = find(&app, &caller, &name).await?;
    workers_page(&app, &caller, &run, &params).await.map(Json)
}

/// Delete a run and stop its workers.
#[utoipa::path(delete, path = "/runs/{name}", tag = "runs", params(("name" = String, Path)),
    responses(
        (status = 204, description = "Deleted"),
        (status = 403, description = "A viewer token", body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn delete(
    State(app): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    caller.require(Role::Editor, "delete runs")?;
    let mut tx = app.db.begin().await?;
    let run = if could_name_object(&name) {
        store::runs::lock(&mut tx, caller.workspace_id, &name).await?
    } else {
        None
    };
    let run = run.ok_or_else(|| ApiError::not_found("run", &name))?;
    // Workers still on machines give their resources back and their agents stop them.
    let machines = store::workers::release_run(&mut tx, run).await?;
    store::runs::delete(&mut *tx, run).await?;
    let event = store::events::New {
        workspace: Some(caller.workspace_id),
        object_kind: "run",
        object_name: &name,
        warning: false,
        reason: "Deleted",
        message: &format!("run {name} deleted; its workers were stopped"),
        source: "api",
    };
    store::events::record(&mut *tx, &event).await?;
    store::machines::touch_assignments(&mut *tx, &machines).await?;
    hub::request_schedule(&mut *tx).await?;
    tx.commit().await?;
    Ok(StatusCode::NO_CONTENT)
}
