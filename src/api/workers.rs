//! Workers: `<run>-<index>`, readable alone or under their run.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::State;
use chrono::{DateTime, Utc};
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use super::AppState;
use super::caller::Caller;
use super::error::{ApiError, ErrorBody};
use super::extract::Path;
use super::list::List;
use crate::domain::name::could_name_object;
use crate::domain::run::WorkerState;
use crate::store::{
    self,
    workers::{DriveUser, UserPosition, WorkerRecord},
};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(get))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Worker {
    pub metadata: WorkerMeta,
    pub status: WorkerStatus,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct WorkerMeta {
    /// `<run>-<index>`.
    pub name: String,
    pub namespace: String,
    pub uid: Uuid,
    pub run: String,
    pub index: i32,
    pub created_at: DateTime<Utc>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct WorkerStatus {
    pub state: WorkerState,
    pub reason: String,
    /// The machine the worker was placed on.
    pub machine: Option<String>,
    pub exit_code: Option<i32>,
    /// How each drive kept on one machine is reached from here: `local`, `nfs` or `rdma`.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub transports: BTreeMap<String, String>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    /// Bytes of output kept: each line and its newline.
    pub log_bytes: i64,
    /// Lines of output not kept: the earliest past the last 20,000, and those past the worker's
    /// cap or its workspace's quota in bytes (a line in the log says when that happened).
    pub log_dropped: i64,
    /// Times `restart_policy: OnFailure` started it again after it failed.
    pub restarts: i32,
}

/// A worker as other objects list it.
#[derive(Debug, Serialize, ToSchema)]
pub struct WorkerRef {
    pub name: String,
    pub run: String,
    pub state: WorkerState,
    pub machine: Option<String>,
}

impl From<DriveUser> for WorkerRef {
    fn from(w: DriveUser) -> WorkerRef {
        WorkerRef { name: w.name, run: w.run_name, state: w.state, machine: w.machine }
    }
}

pub fn to_object(namespace: &str, w: WorkerRecord) -> Worker {
    Worker {
        metadata: WorkerMeta {
            name: w.name,
            namespace: namespace.to_owned(),
            uid: w.id,
            run: w.run_name,
            index: w.index,
            created_at: w.created_at,
        },
        status: WorkerStatus {
            state: w.state,
            reason: w.reason,
            machine: w.machine,
            exit_code: w.exit_code,
            transports: w.transports.0,
            started_at: w.started_at,
            finished_at: w.finished_at,
            log_bytes: w.log_bytes,
            log_dropped: w.log_dropped,
            restarts: w.restarts,
        },
    }
}

/// Read one worker.
#[utoipa::path(get, path = "/workers/{name}", tag = "runs", params(("name" = String, Path, description = "`<run>-<index>`")),
    responses((status = 200, body = Worker), (status = 404, body = ErrorBody)), security(("bearer" = [])))]
pub async fn get(
    State(app): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Json<Worker>, ApiError> {
    let worker = find(&app, &caller, &name).await?;
    Ok(Json(to_object(&caller.workspace, worker)))
}

/// The caller's worker of that name, or 404.
pub async fn find(app: &AppState, caller: &Caller, name: &str) -> Result<WorkerRecord, ApiError> {
    let found = if could_name_object(name) {
        store::workers::get(&app.db, caller.workspace_id, name).await?
    } else {
        None
    };
    found.ok_or_else(|| ApiError::not_found("worker", name))
}

/// A page of workers from rows fetched one past it, as [`List::from_rows`] takes them.
pub fn page(caller: &Caller, rows: Vec<WorkerRecord>, fetch_limit: i64) -> List<Worker> {
    List::from_rows(rows, fetch_limit, |w| w.id, |w| to_object(&caller.workspace, w))
}

/// Where a list ordered by run (newest first), then index, goes on after `cursor` (from the
/// start without one). 410 when the worker is gone: its run was deleted.
pub async fn after_cursor(app: &AppState, cursor: Option<Uuid>) -> Result<Option<UserPosition>, ApiError> {
    let Some(cursor) = cursor else { return Ok(None) };
    let found = store::workers::position(&app.db, cursor).await?;
    found.map(Some).ok_or_else(|| {
        ApiError::Gone(format!(
            "cursor {cursor} names a worker that no longer exists (its run was deleted): list again without a cursor"
        ))
    })
}
