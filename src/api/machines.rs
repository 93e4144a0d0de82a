//! `/machines`: the cluster's machines, their data locations, and join tokens to add more.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use super::AppState;
use super::caller::Caller;
use super::error::{ApiError, ErrorBody};
use super::extract::{Body, Params, Path};
use super::list::{List, PageParams};
use super::watch::{self, Kind};
use super::workers::{self, Worker};
use crate::auth::machine::new_join_token;
use crate::domain::Name;
use crate::domain::copy::{CopyState, LostFiles};
use crate::domain::drive::full_name;
use crate::domain::machine::{MachineState, TransferLimits};
use crate::domain::path::AbsPath;
use crate::domain::progress::{Progress, progress};
use crate::domain::quantity::CpuCores;
use crate::hub;
use crate::protocol::ImageReport;
use crate::store::{self, copies::MachineCopyRecord, join_tokens::JoinTokenRecord, machines::MachineRecord};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list))
        .routes(routes!(get))
        .routes(routes!(list_workers))
        .routes(routes!(confirm_data_location))
        .routes(routes!(list_join_tokens, create_join_token))
        .routes(routes!(revoke_join_token))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Machine {
    pub metadata: MachineMeta,
    pub spec: MachineSpec,
    pub status: MachineStatus,
    /// The copies kept here of the caller's workspace's drives, by drive; only when one
    /// machine is read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub copies: Option<Vec<MachineCopy>>,
    /// The container images the machine holds, as its agent last reported them; only when one
    /// machine is read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub images: Option<Vec<ImageReport>>,
    /// The caller's workspace's workers placed here that have not ended, by run (newest
    /// first), then index: one machine read alone holds the first 100; `GET
    /// /machines/{name}/workers` pages through them all.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workers: Option<Vec<Worker>>,
    /// Pass as `cursor` to `GET /machines/{name}/workers` for the workers after these; absent
    /// when there are no more.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workers_next: Option<Uuid>,
}

/// A drive's copy in this machine's data location.
#[derive(Debug, Serialize, ToSchema)]
pub struct MachineCopy {
    pub drive: String,
    pub folder: String,
    pub bytes: u64,
    /// Room promised to the copy while it fills: the drive's `size_hint_bytes`.
    pub size_hint_bytes: u64,
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

#[derive(Debug, Serialize, ToSchema)]
pub struct MachineMeta {
    pub name: String,
    pub uid: Uuid,
    pub created_at: DateTime<Utc>,
    pub labels: BTreeMap<String, String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct MachineSpec {
    pub cluster: String,
    pub pool: String,
    /// `nfs`, `rdma`.
    pub transports: Vec<String>,
    pub capacity: MachineResources,
}

/// A machine's CPU, memory and GPUs: what it has, or what its workers hold.
#[derive(Debug, Serialize, ToSchema)]
pub struct MachineResources {
    pub cpu_cores: CpuCores,
    pub memory_bytes: i64,
    pub gpus: i32,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct MachineStatus {
    pub state: MachineState,
    /// Takes no new workers (fills for those already here aside): an organisation admin
    /// cordoned or drained it.
    pub cordoned: bool,
    /// While it drains: when the workers still running here fail.
    pub drain_deadline: Option<DateTime<Utc>>,
    pub last_heartbeat_at: DateTime<Utc>,
    /// Held by the workers placed here.
    pub allocated: MachineResources,
    pub data_location: DataLocation,
    /// What an organisation admin lets its agent send to peers and receive from them
    /// (`PUT /machines/{name}/transfer-limits`).
    pub transfer_limits: TransferLimits,
}

/// Where the machine keeps copies of drives.
#[derive(Debug, Serialize, ToSchema)]
pub struct DataLocation {
    /// The path the agent proposed.
    pub proposed: Option<String>,
    /// The confirmed path; no copy is kept before an admin confirms one.
    pub path: Option<String>,
    pub confirmed: bool,
    /// The most copies may take there, if limited.
    pub limit_bytes: Option<i64>,
    pub total_bytes: i64,
    pub used_bytes: i64,
    pub free_bytes: i64,
}

fn cores(millis: i32) -> CpuCores {
    CpuCores::from_millis(millis.max(0) as u32)
}

pub fn to_object(m: MachineRecord) -> Machine {
    let transfer_limits = m.transfer_limits();
    Machine {
        metadata: MachineMeta { name: m.name, uid: m.id, created_at: m.created_at, labels: m.labels.0 },
        spec: MachineSpec {
            cluster: m.cluster,
            pool: m.pool,
            transports: m.transports,
            capacity: MachineResources {
                cpu_cores: cores(m.cpu_millis),
                memory_bytes: m.memory_bytes,
                gpus: m.gpus,
            },
        },
        status: MachineStatus {
            transfer_limits,
            state: m.state,
            cordoned: m.cordoned,
            drain_deadline: m.drain_deadline,
            last_heartbeat_at: m.last_heartbeat_at,
            allocated: MachineResources {
                cpu_cores: cores(m.cpu_alloc),
                memory_bytes: m.memory_alloc,
                gpus: m.gpus_alloc,
            },
            data_location: DataLocation {
                proposed: m.data_proposed,
                confirmed: m.data_path.is_some(),
                path: m.data_path,
                limit_bytes: m.data_limit_bytes,
                total_bytes: m.data_total_bytes,
                used_bytes: m.data_used_bytes,
                free_bytes: m.data_free_bytes,
            },
        },
        copies: None,
        images: None,
        workers: None,
        workers_next: None,
    }
}

fn to_copy(workspace: &str, data_path: &str, c: MachineCopyRecord) -> MachineCopy {
    MachineCopy {
        folder: format!("{data_path}/drives/{}", full_name(workspace, &c.drive)),
        drive: c.drive,
        bytes: c.bytes.max(0) as u64,
        size_hint_bytes: c.fill.size_hint.max(0) as u64,
        complete: c.state == CopyState::Complete,
        progress: (c.state == CopyState::Filling).then(|| progress(&c.fill.with_bytes(c.bytes), Utc::now())),
        state: c.state,
        last_used_at: c.last_used_at,
        manifest: c.manifest,
        source: c.source,
        lost_files: c.lost.map(|l| l.0),
    }
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct MachineListParams {
    /// At most this many items (1–1000, default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<i64>,
    /// The `next` value of the previous page.
    pub cursor: Option<Uuid>,
    /// Stream changes instead of answering the list (see `GET /runs`).
    #[serde(default)]
    pub watch: bool,
    pub resource_version: Option<i64>,
}

/// List machines, by cluster, then name, a page at a time.
#[utoipa::path(get, path = "/machines", tag = "machines", params(MachineListParams),
    responses(
        (status = 200, description = "A page, or with `watch=true` a stream of changes", content(
            (List<Machine> = "application/json"),
            (String = "application/x-ndjson"),
            (String = "text/event-stream"),
        )),
        (status = 410, description = "`cursor` names a machine deleted since, or with `watch=true`, `resource_version` is older than the retained changes", body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn list(
    State(app): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Params(params): Params<MachineListParams>,
) -> Result<Response, ApiError> {
    let limit = PageParams { limit: params.limit, cursor: params.cursor }.fetch_limit()?;
    if params.watch {
        let names = match params.resource_version {
            Some(_) => vec![],
            None => store::machines::list(&app.db).await?.into_iter().map(|m| m.name).collect(),
        };
        return watch::stream(app, caller, Kind::Machines, params.resource_version, names, &headers).await;
    }
    let version = store::changes::latest(&app.db).await?;
    let mut db = app.db.acquire().await?;
    let page = store::Page { limit, before: params.cursor };
    let rows = store::machines::page(&mut db, page)
        .await?
        .ok_or_else(|| ApiError::Gone("cursor names a machine deleted since: list again".into()))?;
    let list = List::from_rows(rows, limit, |m| m.id, to_object);
    Ok(Json(list.at(version)).into_response())
}

/// The machine a change names, for watchers: the first of that name, by cluster.
pub async fn load(app: &AppState, name: &str) -> Result<Machine, ApiError> {
    let found = match Name::parse(name) {
        Ok(n) => store::machines::by_name(&app.db, None, n.as_str()).await?,
        Err(_) => vec![],
    };
    found.into_iter().next().map(to_object).ok_or_else(|| ApiError::not_found("machine", name))
}

/// `?cluster=NAME`: names are unique within a cluster, and the same name may be in several.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct MachineRef {
    /// The machine's cluster; needed only when clusters share the name.
    pub cluster: Option<String>,
}

/// The machine of that name in `cluster`, or in the only cluster that has one of that name.
pub async fn find(app: &AppState, name: &str, cluster: Option<&str>) -> Result<MachineRecord, ApiError> {
    let cluster = match cluster.map(Name::parse) {
        None => None,
        Some(Ok(c)) => Some(c),
        Some(Err(_)) => return Err(ApiError::not_found("machine", name)),
    };
    let mut found = match Name::parse(name) {
        Ok(n) => store::machines::by_name(&app.db, cluster.as_ref().map(|c| c.as_str()), n.as_str()).await?,
        Err(_) => vec![],
    };
    match found.len() {
        0 => Err(ApiError::not_found("machine", name)),
        1 => Ok(found.remove(0)),
        _ => {
            let clusters: Vec<&str> = found.iter().map(|m| m.cluster.as_str()).collect();
            Err(ApiError::Conflict(format!(
                "clusters {} each have a machine named {name}: add ?cluster=<name>",
                clusters.join(", ")
            )))
        }
    }
}

/// Read a machine, with the copies it keeps of the workspace's drives and the first 100 of the
/// workspace's workers on it.
#[utoipa::path(get, path = "/machines/{name}", tag = "machines", params(("name" = String, Path), MachineRef),
    responses(
        (status = 200, body = Machine),
        (status = 404, body = ErrorBody),
        (status = 409, description = "Several clusters have a machine of that name: add `cluster`", body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn get(
    State(app): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    Params(at): Params<MachineRef>,
) -> Result<Json<Machine>, ApiError> {
    let record = find(&app, &name, at.cluster.as_deref()).await?;
    let copies = store::copies::on_machine(&app.db, record.id, caller.workspace_id).await?;
    let workers = workers_page(&app, &caller, record.id, &PageParams::FIRST).await?;
    let images = store::machines::images(&app.db, record.id).await?;
    let data_path = record.data_path.clone().unwrap_or_default();
    let mut machine = to_object(record);
    machine.copies = Some(copies.into_iter().map(|c| to_copy(&caller.workspace, &data_path, c)).collect());
    machine.images = Some(images);
    machine.workers = Some(workers.items);
    machine.workers_next = workers.next;
    Ok(Json(machine))
}

async fn workers_page(
    app: &AppState,
    caller: &Caller,
    machine: Uuid,
    params: &PageParams,
) -> Result<List<Worker>, ApiError> {
    let limit = params.fetch_limit()?;
    let after = workers::after_cursor(app, params.cursor).await?;
    let rows = store::workers::page_on_machine(&app.db, machine, caller.workspace_id, after, limit).await?;
    Ok(workers::page(caller, rows, limit))
}

/// A page of the workspace's workers on the machine that have not ended, by run (newest
/// first), then index.
#[utoipa::path(get, path = "/machines/{name}/workers", tag = "machines",
    params(("name" = String, Path), MachineWorkersParams),
    responses(
        (status = 200, body = List<Worker>),
        (status = 400, description = "A limit out of range", body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "Several clusters have a machine of that name: add `cluster`", body = ErrorBody),
        (status = 410, description = "`cursor` names a worker whose run was deleted", body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn list_workers(
    State(app): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    Params(params): Params<MachineWorkersParams>,
) -> Result<Json<List<Worker>>, ApiError> {
    let record = find(&app, &name, params.cluster.as_deref()).await?;
    let page = PageParams { limit: params.limit, cursor: params.cursor };
    workers_page(&app, &caller, record.id, &page).await.map(Json)
}

/// `?cluster=&limit=&cursor=`: [`MachineRef`] and [`PageParams`] together.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct MachineWorkersParams {
    /// The machine's cluster; needed only when clusters share the name.
    pub cluster: Option<String>,
    /// At most this many items (1–1000, default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<i64>,
    /// The `next` value of the previous page.
    pub cursor: Option<Uuid>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ConfirmDataLocation {
    /// Absolute path on the machine; usually the one the agent proposed.
    pub path: AbsPath,
    /// The most copies may take there.
    #[schema(minimum = 1)]
    pub limit_bytes: Option<i64>,
}

/// Confirm where the machine keeps copies (Machines → machine → Data location → Confirm): for
/// organisation admins, since every workspace shares the machine.
#[utoipa::path(post, path = "/machines/{name}/data-location", tag = "machines",
    params(("name" = String, Path), MachineRef),
    request_body = ConfirmDataLocation,
    responses(
        (status = 200, body = Machine),
        (status = 403, description = "Not an organisation admin's token", body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "Several clusters have a machine of that name: add `cluster`", body = ErrorBody),
        (status = 422, body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn confirm_data_location(
    State(app): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    Params(at): Params<MachineRef>,
    Body(input): Body<ConfirmDataLocation>,
) -> Result<Json<Machine>, ApiError> {
    caller.require_org_admin("confirm data locations")?;
    if input.path.is_root() {
        return Err(ApiError::invalid("path", "a data location cannot be /"));
    }
    if input.limit_bytes.is_some_and(|l| l <= 0) {
        return Err(ApiError::invalid("limit_bytes", "must be more than 0"));
    }
    let machine = find(&app, &name, at.cluster.as_deref()).await?;
    let mut tx = app.db.begin().await?;
    let m =
        store::machines::confirm_data_location(&mut *tx, machine.id, input.path.as_str(), input.limit_bytes)
            .await?;
    hub::request_schedule(&mut *tx).await?;
    tx.commit().await?;
    Ok(Json(to_object(m)))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct JoinToken {
    pub id: Uuid,
    pub cluster: String,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub revoked_at: Option<DateTime<Utc>>,
    /// Machines it may still admit.
    pub uses_left: i32,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct CreatedJoinToken {
    #[serde(flatten)]
    pub info: JoinToken,
    /// Give it to `astraeus agent --join-token`. Shown once: only its hash is stored.
    pub token: String,
}

impl From<JoinTokenRecord> for JoinToken {
    fn from(r: JoinTokenRecord) -> JoinToken {
        JoinToken {
            id: r.id,
            cluster: r.cluster,
            created_at: r.created_at,
            expires_at: r.expires_at,
            revoked_at: r.revoked_at,
            uses_left: r.uses_left,
        }
    }
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct JoinTokenInput {
    /// Lifetime in seconds (default 1 day, at most a year).
    #[schema(minimum = 1, maximum = 31536000)]
    pub ttl_seconds: Option<i64>,
    /// How many machines it admits (default 1, at most 10,000).
    #[schema(minimum = 1, maximum = 10000)]
    pub uses: Option<i32>,
}

/// 404 unless a cluster of that name exists.
pub async fn cluster(app: &AppState, name: &str) -> Result<(), ApiError> {
    let found = match Name::parse(name) {
        Ok(n) => store::clusters::exists(&app.db, n.as_str()).await?,
        Err(_) => false,
    };
    if found { Ok(()) } else { Err(ApiError::not_found("cluster", name)) }
}

/// Mint a token machines join the cluster with.
#[utoipa::path(post, path = "/clusters/{cluster}/join-tokens", tag = "machines", params(("cluster" = String, Path)),
    request_body = JoinTokenInput,
    responses(
        (status = 201, body = CreatedJoinToken),
        (status = 403, description = "Not an organisation-admin token", body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 422, body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn create_join_token(
    State(app): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    Body(input): Body<JoinTokenInput>,
) -> Result<(StatusCode, Json<CreatedJoinToken>), ApiError> {
    caller.require_org_admin("mint join tokens")?;
    cluster(&app, &name).await?;
    let ttl = input.ttl_seconds.unwrap_or(24 * 3600);
    if !(1..=365 * 24 * 3600).contains(&ttl) {
        return Err(ApiError::invalid("ttl_seconds", "must be between 1 and 31536000"));
    }
    let uses = input.uses.unwrap_or(1);
    if !(1..=10_000).contains(&uses) {
        return Err(ApiError::invalid("uses", "must be between 1 and 10000"));
    }
    let (token, hash) = new_join_token();
    let expires = Utc::now() + Duration::seconds(ttl);
    let record = store::join_tokens::insert(&app.db, &name, &hash, expires, uses).await?;
    Ok((StatusCode::CREATED, Json(CreatedJoinToken { info: record.into(), token })))
}

/// List a cluster's join tokens (never the tokens themselves).
#[utoipa::path(get, path = "/clusters/{cluster}/join-tokens", tag = "machines", params(("cluster" = String, Path)),
    responses(
        (status = 200, body = List<JoinToken>),
        (status = 403, description = "Not an organisation-admin token", body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn list_join_tokens(
    State(app): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Json<List<JoinToken>>, ApiError> {
    caller.require_org_admin("read join tokens")?;
    cluster(&app, &name).await?;
    let rows = store::join_tokens::list(&app.db, &name).await?;
    Ok(Json(List::all(rows.into_iter().map(JoinToken::from).collect())))
}

/// Revoke a join token. Machines that joined with it stay.
#[utoipa::path(delete, path = "/clusters/{cluster}/join-tokens/{id}", tag = "machines",
    params(("cluster" = String, Path), ("id" = String, Path)),
    responses(
        (status = 200, body = JoinToken),
        (status = 403, description = "Not an organisation-admin token", body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn revoke_join_token(
    State(app): State<AppState>,
    caller: Caller,
    Path((name, id)): Path<(String, String)>,
) -> Result<Json<JoinToken>, ApiError> {
    caller.require_org_admin("revoke join tokens")?;
    let found = match (Name::parse(&name), Uuid::parse_str(&id)) {
        (Ok(cluster), Ok(id)) => store::join_tokens::revoke(&app.db, cluster.as_str(), id).await?,
        _ => None,
    };
    found.map(|r| Json(r.into())).ok_or_else(|| ApiError::not_found("join token", &id))
}
