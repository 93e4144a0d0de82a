//! The agent API (`/agent/v1`), apart from the user API: machines join, heartbeat, long-poll
//! for their workers, report worker states and upload logs. A machine credential opens these
//! routes only, and only for its own machine.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, FromRequestParts, State};
use axum::http::{StatusCode, header, request::Parts};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use chrono::Utc;
use serde::Deserialize;
use sqlx::pool::PoolConnection;
use sqlx::{PgConnection, PgPool, Postgres};
use uuid::Uuid;

use super::AppState;
use super::error::ApiError;
use super::extract::{Body, IfNoneMatch, Params, Path};
use crate::auth::Keys;
use crate::auth::machine::{self, verify_credential};
use crate::auth::seal;
use crate::auth::transfer::{TransferClaims, mint_transfer};
use crate::beats;
use crate::domain::copy::LostFiles;
use crate::domain::drive::{Location, full_name};
use crate::domain::grant::{self, Grant};
use crate::domain::machine::{MachineState, TransferLimits};
use crate::domain::quantity::human_bytes;
use crate::domain::restart;
use crate::domain::run::{RunSpec, WorkerState};
use crate::domain::task::{Mode, PULL_AUTH_KEY};
use crate::domain::{Name, Problems};
use crate::hub;
use crate::kept::Kept;
use crate::protocol::{
    self, Ack, Assignment, Assignments, HeartbeatRequest, HeartbeatResponse, ImageReport, JoinRequest,
    JoinResponse, Limits, LogUpload, MountSource, MountSpec, PeerSource, ServerKeys, StatusReport,
    TransferToken,
};
use crate::store::{
    self, drives::DriveRecord, machines::Joining, secrets::SealedRow, workers::AssignmentRow,
};

/// Longest an assignments long-poll is held open.
const MAX_WAIT: Duration = Duration::from_secs(60);
const MAX_LOG_LINES: usize = 10_000;
const MAX_COPIES: usize = 100_000;
/// Images a heartbeat may report: far more than a disk holds.
const MAX_IMAGES: usize = 1_000;
/// Bytes kept of a reason or an event an agent reports: they are shown in lists and events.
const MAX_REASON: usize = 4096;
/// Bytes of workers one assignments answer carries at most (past it the agent asks for the
/// rest with `after`); a single worker larger than this still goes alone.
pub const ANSWER_BYTES: usize = 4 << 20;
/// Room for a heartbeat of [`MAX_COPIES`] copies with long names.
const HEARTBEAT_BODY_LIMIT: usize = 32 << 20;

/// The routes a machine credential opens.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/agent/v1/heartbeat", post(heartbeat).layer(DefaultBodyLimit::max(HEARTBEAT_BODY_LIMIT)))
        .route("/agent/v1/assignments", get(assignments))
        .route("/agent/v1/workers/{id}/status", post(report_status))
        .route("/agent/v1/workers/{id}/logs", post(upload_logs))
        .route("/agent/v1/keys", get(server_keys))
        .route("/agent/v1/workers/{id}/transfer-token", post(transfer_token))
}

/// The route that needs no credential: a join, limited per client address by the caller.
pub fn open_router() -> Router<AppState> {
    Router::new().route("/agent/v1/join", post(join))
}

/// The machine a credential names, checked to be the one in force.
pub struct MachineCaller {
    pub id: Uuid,
    pub name: String,
    pub cluster: String,
}

impl FromRequestParts<AppState> for MachineCaller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, app: &AppState) -> Result<Self, ApiError> {
        let bearer = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .ok_or_else(|| {
                ApiError::Unauthorized(
                    "no machine credential: send Authorization: Bearer <credential>".into(),
                )
            })?;
        let now = chrono::Utc::now().timestamp();
        let claims = (app.hub.machine_tokens)
            .check(bearer.trim(), now, |t| verify_credential(&app.keys, t))
            .map_err(|e| ApiError::Unauthorized(format!("the machine credential is not valid: {e}")))?;
        if !app.hub.credentials.is_fresh(claims.mid, claims.jti) {
            if !store::machines::credential_is_current(&app.db, claims.mid, claims.jti).await? {
                return Err(ApiError::Unauthorized(format!(
                    "machine {} was deleted from the cluster: its credential no longer works; \
                     join again with a new join token",
                    claims.sub
                )));
            }
            app.hub.credentials.remember(claims.mid, claims.jti);
        }
        Ok(MachineCaller { id: claims.mid, name: claims.sub, cluster: claims.cluster })
    }
}

async fn join(
    State(app): State<AppState>,
    Body(req): Body<JoinRequest>,
) -> Result<Json<JoinResponse>, ApiError> {
    let mut p = Problems::default();
    for (i, t) in req.transports.iter().enumerate() {
        if t != "nfs" && t != "rdma" {
            p.add(format!("transports[{i}]"), format!("{t:?} is not a transport: nfs or rdma"));
        }
    }
    if req.capacity.memory_bytes > i64::MAX as u64 {
        p.add("capacity.memory_bytes", "is too large");
    }
    if let Some(d) = &req.data_location
        && let Err(e) = crate::domain::path::AbsPath::parse(d)
    {
        p.add("data_location", e);
    }
    p.finish().map_err(ApiError::Invalid)?;
    let credential_id = Uuid::now_v7();
    let mut tx = app.db.begin().await?;
    let cluster =
        store::join_tokens::use_one(&mut *tx, &machine::hash_join_token(&req.join_token)).await?.ok_or_else(
            || ApiError::Unauthorized("the join token is not valid, expired, used up or revoked".into()),
        )?;
    let m = store::machines::join(
        &mut *tx,
        &Joining {
            cluster: &cluster,
            name: req.name.as_str(),
            pool: req.pool.as_str(),
            labels: &req.labels,
            transports: &req.transports,
            cpu_millis: req.capacity.cpu_cores.millis() as i32,
            memory_bytes: req.capacity.memory_bytes as i64,
            gpus: req.capacity.gpus as i32,
            data_proposed: req.data_location.as_deref(),
            credential_id,
        },
    )
    .await?
    .ok_or_else(|| {
        // Dropping the transaction gives the token's use back.
        ApiError::Conflict(format!(
            "machine {} already exists in cluster {cluster}: a machine that restarts comes back with the \
             credential it keeps; to join under this name again, delete the machine first",
            req.name
        ))
    })?;
    hub::request_schedule(&mut *tx).await?;
    tx.commit().await?;
    tracing::info!(machine = %m.name, cluster = %m.cluster, "machine joined");
    let expires = Utc::now() + chrono::Duration::days(365);
    let credential = machine::mint_credential(&app.keys, m.id, &m.name, &m.cluster, credential_id, expires);
    Ok(Json(JoinResponse { credential, machine: m.name, cluster: m.cluster }))
}

/// An agent's data port as peers reach it: `http(s)://host:port` and nothing more (no user,
/// path, query or fragment), read with the URL grammar peers will read it with.
fn check_data_address(address: &str) -> Result<(), ApiError> {
    let plain = reqwest::Url::parse(address).is_ok_and(|u| {
        matches!(u.scheme(), "http" | "https")
            && u.host().is_some()
            && u.username().is_empty()
            && u.password().is_none()
            && u.path() == "/"
            && !address.ends_with('/')
            && u.query().is_none()
            && u.fragment().is_none()
    });
    match plain && address.len() <= 255 {
        true => Ok(()),
        false => Err(ApiError::invalid("data_address", "must be http://host:port or https://host:port")),
    }
}

/// The server's public keys, for agents to check transfer tokens with on their own. Any machine
/// may read them: they are public, and the credential only keeps strangers from counting keys.
async fn server_keys(State(app): State<AppState>, _caller: MachineCaller) -> Json<ServerKeys> {
    Json(ServerKeys { keys: app.keys.published() })
}

/// Bounds on what a machine may make the server keep about its images.
fn check_images(images: &[ImageReport]) -> Result<(), ApiError> {
    if images.len() > MAX_IMAGES {
        return Err(ApiError::invalid("images", format!("at most {MAX_IMAGES} images per heartbeat")));
    }
    for (i, image) in images.iter().enumerate() {
        if image.name.len() > 512 || image.digest.len() > 256 {
            return Err(ApiError::invalid(
                format!("images[{i}]"),
                "a name of at most 512 bytes, a digest of 256",
            ));
        }
        if image.bytes > i64::MAX as u64 {
            return Err(ApiError::invalid(format!("images[{i}].bytes"), "is too large"));
        }
    }
    Ok(())
}

/// What a copy lost, as its drive's event says it: `lost 2 files since it was filled (a, b): …`.
fn lost_files(lost: &LostFiles) -> String {
    const SHOWN: usize = 3;
    let files = lost.files();
    let shown: Vec<&str> = lost.named.iter().take(SHOWN).map(|p| cut(p)).collect();
    let more = match lost.count.saturating_sub(shown.len() as u64) {
        0 => String::new(),
        n => format!(" and {n} more"),
    };
    format!(
        "lost {files} since it was filled ({}{more}): it is no longer whole, and is filled again when next needed",
        shown.join(", ")
    )
}

/// The first `MAX_REASON` bytes of what an agent says, on a character's boundary.
fn cut(text: &str) -> &str {
    &text[..text.floor_char_boundary(MAX_REASON)]
}

fn clamp(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

async fn heartbeat(
    State(app): State<AppState>,
    caller: MachineCaller,
    Body(req): Body<HeartbeatRequest>,
) -> Result<Json<HeartbeatResponse>, ApiError> {
    if req.copies.len() > MAX_COPIES {
        return Err(ApiError::invalid("copies", format!("at most {MAX_COPIES} copies per heartbeat")));
    }
    for (i, c) in req.copies.iter().enumerate() {
        if let Some(m) = &c.manifest
            && crate::domain::digest::Digest::parse(m).is_err()
        {
            return Err(ApiError::invalid(
                format!("copies[{i}].manifest"),
                "must be 64 lowercase hex digits",
            ));
        }
        if let Some((field, why)) = c.lost.as_ref().and_then(|l| l.invalid()) {
            return Err(ApiError::invalid(format!("copies[{i}].lost.{field}"), why));
        }
    }
    let usage = store::machines::Usage {
        total_bytes: clamp(req.data_location.total_bytes),
        used_bytes: clamp(req.data_location.used_bytes),
        free_bytes: clamp(req.data_location.free_bytes),
        reserve_bytes: clamp(req.data_location.reserve_bytes),
    };
    metrics::counter!("astraeus_heartbeats_total").increment(1);
    if let Some(images) = &req.images {
        check_images(images)?;
        store::machines::set_images(&app.db, caller.id, images).await?;
    }
    if let Some(address) = &req.data_address {
        check_data_address(address)?;
        store::machines::set_data_address(&app.db, caller.id, address).await?;
    }
    let digest = beats::digest(&req.copies, usage.reserve_bytes);
    // Whatever the server changed on its side since is announced by a trigger and forgotten
    // here (`copies_state_changed` and its kin, see store::rules).
    if let Some(known) = app.hub.beats.known(caller.id, digest) {
        app.hub.beats.record(caller.id, &usage);
        return Ok(Json(heartbeat_answer(known, vec![])));
    }
    let reported = store::copies::Reported {
        folders: req.copies.iter().map(|c| c.drive.clone()).collect(),
        ids: req.copies.iter().map(|c| c.drive_id).collect(),
        bytes: req.copies.iter().map(|c| clamp(c.bytes)).collect(),
        complete: req.copies.iter().map(|c| c.complete).collect(),
        measured: req.copies.iter().map(|c| c.measured).collect(),
        lost: req.copies.iter().map(|c| c.lost.clone().map(sqlx::types::Json)).collect(),
        manifests: req.copies.iter().map(|c| c.manifest.clone()).collect(),
    };
    let generation = app.hub.beats.generation(caller.id);
    let same = store::machines::beat_if_unchanged(&app.db, caller.id, &usage, &reported).await?;
    if let Some(same) = same {
        if !same.written {
            app.hub.beats.record(caller.id, &usage);
        }
        let known = beats::Known {
            data_location: same.data_path,
            data_limit_bytes: same.data_limit_bytes,
            transfer_limits: TransferLimits::from_columns(
                same.upload_bytes_per_second,
                same.download_bytes_per_second,
            ),
        };
        app.hub.beats.remember(caller.id, generation, digest, known.clone());
        return Ok(Json(heartbeat_answer(known, vec![])));
    }
    // Rows are locked in one order everywhere, copies, then workers, then machines, so that
    // heartbeats, placement and deletions never wait on each other in a circle.
    let mut tx = app.db.begin().await?;
    let copies = store::copies::reconcile(&mut tx, caller.id, &reported).await?;
    for (drive, bytes) in &copies.completed {
        let filled = (*bytes).max(0) as u64;
        metrics::counter!("astraeus_fill_bytes_total").increment(filled);
        match store::fills::from_peer(&mut *tx, *drive, caller.id).await? {
            true => metrics::counter!("astraeus_peer_bytes_total").increment(filled),
            false => metrics::counter!("astraeus_origin_bytes_total").increment(filled),
        }
        let why =
            format!("the copy on {} is complete ({})", caller.name, human_bytes((*bytes).max(0) as u64));
        store::events::record_for_drive(&mut *tx, *drive, false, "FillCompleted", &why, "agent").await?;
    }
    for (drive, lost) in &copies.lost {
        let why = format!("the copy on {} {}", caller.name, lost_files(lost));
        store::events::record_for_drive(&mut *tx, *drive, true, "FilesLost", &why, "agent").await?;
    }
    if !copies.completed.is_empty() {
        // The marker is there: the workers waiting for these copies start now, not at the next pass.
        if store::workers::release_ready(&mut *tx, caller.id).await? > 0 {
            let drives: Vec<Uuid> = copies.completed.iter().map(|(d, _)| *d).collect();
            store::copies::touch_used_pairs(&mut *tx, &vec![caller.id; drives.len()], &drives).await?;
        }
    }
    // A copy made whole starts its workers; one measured whole may free room its hint held.
    if !copies.completed.is_empty() || copies.measured {
        hub::request_schedule(&mut *tx).await?;
    }
    let beat = store::machines::heartbeat(&mut *tx, caller.id, &usage)
        .await?
        .ok_or_else(|| ApiError::Unauthorized(format!("machine {} is not registered", caller.name)))?;
    if beat.old_state != MachineState::Ready {
        tracing::info!(machine = %caller.name, "machine is Ready again");
        hub::request_schedule(&mut *tx).await?;
    }
    tx.commit().await?;
    let m = beat.machine;
    let known = beats::Known {
        transfer_limits: m.transfer_limits(),
        data_location: m.data_path,
        data_limit_bytes: m.data_limit_bytes,
    };
    Ok(Json(heartbeat_answer(known, copies.delete)))
}

/// A heartbeat's answer: what the server says of the machine, and the copies to delete.
fn heartbeat_answer(known: beats::Known, delete_copies: Vec<String>) -> HeartbeatResponse {
    let beats::Known { data_location, data_limit_bytes, transfer_limits } = known;
    HeartbeatResponse { data_location, data_limit_bytes, delete_copies, transfer_limits }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AssignmentsQuery {
    /// Answer at once when the machine's assignments are newer than this.
    #[serde(default)]
    pub version: i64,
    /// Otherwise wait up to this long for a change.
    #[serde(default)]
    pub wait_seconds: u64,
    /// The next part of an answer too large for one: the workers after this one, at once.
    #[serde(default)]
    pub after: Option<Uuid>,
}

async fn assignments(
    State(app): State<AppState>,
    caller: MachineCaller,
    seen: IfNoneMatch,
    Params(q): Params<AssignmentsQuery>,
) -> Result<Response, ApiError> {
    if q.after.is_some() {
        let (version, db) = Box::pin(read_version(&app.db, caller.id)).await?;
        return Box::pin(answer(&app, caller.id, None, version, db, q.after)).await;
    }
    let wait = Duration::from_secs(q.wait_seconds).min(MAX_WAIT);
    let notify = app.hub.subscribe(hub::MACHINE, caller.id);
    let changed = notify.notified();
    tokio::pin!(changed);
    changed.as_mut().enable();
    // A version heard in a wake-up (the `machines_woken` trigger, see store::rules) is the one
    // Postgres holds, or an older one whose successor's wake-up is on its way: an agent behind
    // it is answered, and an agent holding it waits, without asking Postgres (an agent that
    // will not wait is told what Postgres holds). The reads are boxed: inline, they would be
    // part of the future every waiting machine holds, several times its size.
    let heard = app.hub.assign_version(caller.id).filter(|&v| v > q.version || !wait.is_zero());
    let (mut version, mut db) = match heard {
        Some(heard) => (heard, None),
        None => Box::pin(read_version(&app.db, caller.id)).await?,
    };
    if version <= q.version && !wait.is_zero() {
        drop(db);
        let woken = tokio::time::timeout(wait, changed).await.is_ok();
        // Woken, the wake-up's version is enough; when the wait ran out, Postgres says, as it
        // does should a wake-up have been missed.
        (version, db) = match app.hub.assign_version(caller.id) {
            Some(heard) if woken && heard > q.version => (heard, None),
            _ => Box::pin(read_version(&app.db, caller.id)).await?,
        };
    }
    Box::pin(answer(&app, caller.id, Some(&seen), version, db, None)).await
}

/// The machine's assignment version, with the connection that read it: one connection for
/// every read of an answer (each connection given back to the pool costs a round trip), but
/// none held while waiting.
async fn read_version(
    db: &PgPool,
    machine: Uuid,
) -> Result<(i64, Option<PoolConnection<Postgres>>), ApiError> {
    let mut conn = db.acquire().await?;
    let version = store::machines::assign_version(&mut *conn, machine).await?;
    Ok((version, Some(conn)))
}

/// The machine's workers as of `version` or later (those after `after`, as many as
/// [`ANSWER_BYTES`] holds), or `304 Not Modified` when the agent holds them (`seen`); `db` is
/// the connection that read the version, if one did.
async fn answer(
    app: &AppState,
    machine: Uuid,
    seen: Option<&IfNoneMatch>,
    version: i64,
    db: Option<PoolConnection<Postgres>>,
    after: Option<Uuid>,
) -> Result<Response, ApiError> {
    // The version moves with every change an agent acts on (that is what ends a long-poll early),
    // so an agent holding this version's answer has nothing to read again.
    let tag = protocol::assignments_tag(version);
    let etag = [(header::ETAG, tag.clone())];
    if seen.is_some_and(|s| s.holds(&tag)) {
        return Ok((StatusCode::NOT_MODIFIED, etag).into_response());
    }
    let mut db = match db {
        Some(db) => db,
        None => app.db.acquire().await?,
    };
    let mut rows = store::workers::assigned_to(&mut *db, machine, after).await?;
    let runs = rows.iter().map(|r| r.run_id);
    let specs = app.run_specs.get_or_read(runs, |missing| store::runs::specs(&mut *db, missing)).await?;
    // A run deleted since its workers were read has none left to run.
    rows.retain(|r| specs.contains_key(&r.run_id));
    let refs = Referenced::read(&mut db, &app.hub.drives, &rows, &specs).await?;
    // Read after the workers: a worker placed there was placed after its location was confirmed.
    let data_location = store::machines::get(&mut *db, machine).await?.and_then(|m| m.data_path);
    drop(db);
    let (mut workers, mut bytes, mut next) = (Vec::new(), 0, None);
    let mut unopened = Vec::new();
    for row in rows {
        let run = &specs[&row.run_id];
        let opened = match open_secrets(app, &refs, run, &row) {
            Ok(opened) => opened,
            Err(reason) => {
                unopened.push((row.id, reason));
                continue;
            }
        };
        let peer = peer_source(&app.keys, machine, &row);
        let a = assignment(&refs, run, row, opened, peer)?;
        let size = json_size(&a);
        if let Some(last) = workers.last().filter(|_| bytes + size > ANSWER_BYTES) {
            let last: &Assignment = last;
            next = Some(last.uid);
            break;
        }
        bytes += size;
        workers.push(a);
    }
    // Those workers leave the answer and fail; the machine's others are answered all the same.
    for (worker, reason) in &unopened {
        fail_worker(app, machine, *worker, reason).await?;
    }
    Ok((etag, Json(Assignments { version, workers, data_location, next })).into_response())
}

/// The bytes `value` takes as JSON, counted without keeping them.
fn json_size(value: &impl serde::Serialize) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    serde_json::to_writer(&mut count, value).map_or(usize::MAX, |()| count.0)
}

/// The drives and sealed secrets the assigned workers name, each read once for the whole answer;
/// drives the server keeps in memory are not read at all.
struct Referenced {
    drives: HashMap<(Uuid, String), Arc<DriveRecord>>,
    secrets: HashMap<(Uuid, String), SealedRow>,
    /// The host-path grants of each (workspace, cluster) whose workers mount drives.
    grants: HashMap<(Uuid, String), Vec<Grant>>,
}

impl Referenced {
    async fn read(
        db: &mut PgConnection,
        kept: &Kept<(Uuid, String), DriveRecord>,
        rows: &[AssignmentRow],
        specs: &HashMap<Uuid, Arc<RunSpec>>,
    ) -> Result<Referenced, ApiError> {
        let mut drives: Vec<(Uuid, String)> = Vec::new();
        let mut secrets: (Vec<Uuid>, Vec<String>) = Default::default();
        let mut grants: Vec<(Uuid, String)> = Vec::new();
        for row in rows {
            let spec = &specs[&row.run_id];
            let task = &spec.task_template;
            if !task.datavolume_refs.is_empty() {
                grants.push((row.workspace_id, spec.cluster.to_string()));
            }
            drives.extend(task.datavolume_refs.iter().map(|r| (row.workspace_id, r.name.to_string())));
            for s in task.secret_refs.iter().map(|s| &s.name).chain(&task.image_pull_secret) {
                secrets.0.push(row.workspace_id);
                secrets.1.push(s.to_string());
            }
        }
        let read_db = &mut *db;
        let drives = kept
            .get_or_read(drives, |missing| async move {
                let (workspaces, names): (Vec<Uuid>, Vec<String>) = missing.into_iter().unzip();
                let read = store::drives::get_many(read_db, &workspaces, &names).await?;
                Ok::<_, sqlx::Error>(
                    read.into_iter().map(|d| ((d.workspace_id, d.name.clone()), d)).collect(),
                )
            })
            .await?;
        let secrets = store::secrets::sealed_many(&mut *db, &secrets.0, &secrets.1)
            .await?
            .into_iter()
            .map(|row| ((row.workspace_id, row.name.clone()), row))
            .collect();
        // Read at every answer, never kept: narrowing a grant holds for the next mount.
        let grants = store::grants::of_many(&mut *db, &grants).await?;
        Ok(Referenced { drives, secrets, grants })
    }
}

/// What a worker's secrets hold, opened.
struct Opened {
    env: BTreeMap<String, String>,
    image_pull_auth: Option<String>,
}

/// Opens the secrets a worker names; `Err` is the reason it fails, naming the secret but never
/// anything of its value.
fn open_secrets(
    app: &AppState,
    refs: &Referenced,
    run: &RunSpec,
    row: &AssignmentRow,
) -> Result<Opened, String> {
    let task = &run.task_template;
    // A secret deleted since the run was made is skipped: its variables are not set.
    let open = |name: &Name| -> Result<Option<BTreeMap<String, String>>, String> {
        let Some(found) = refs.secrets.get(&(row.workspace_id, name.to_string())) else {
            return Ok(None);
        };
        let at = seal::Row { workspace: row.workspace_id, name: &found.name };
        let unopened = |why: String| {
            tracing::warn!(worker = %row.id, workspace = %row.workspace_id, secret = %name, %why,
                "a secret does not open: its workers fail");
            format!("secret {name} cannot be opened: {why}")
        };
        let plain = seal::open(&app.keys, at, found.key_id.as_deref(), &found.sealed)
            .map_err(|e| unopened(e.to_string()))?;
        serde_json::from_slice(&plain).map(Some).map_err(|_| unopened("it holds no variables".into()))
    };
    let mut env = task.env.clone();
    for s in &task.secret_refs {
        env.extend(open(&s.name)?.unwrap_or_default());
    }
    // A secret without the auth file's variable leaves the pull unauthenticated, and podman
    // says why it fails.
    let image_pull_auth = match &task.image_pull_secret {
        Some(name) => open(name)?.and_then(|mut values| values.remove(PULL_AUTH_KEY)),
        None => None,
    };
    Ok(Opened { env, image_pull_auth })
}

/// Fails a worker of `machine` whose assignment cannot be made, as its agent's report would.
async fn fail_worker(app: &AppState, machine: Uuid, worker: Uuid, reason: &str) -> Result<(), ApiError> {
    let mut tx = app.db.begin().await?;
    let Some(run) = store::workers::lock_run_of(&mut tx, worker).await? else { return Ok(()) };
    let failed = WorkerState::Failed;
    if store::workers::finish(&mut tx, worker, Some(machine), failed, reason, None).await?.is_some() {
        store::workers::refresh_locked_run(&mut tx, run).await?;
        ended(&mut tx, machine, run, worker, failed).await?;
        tx.commit().await?;
    }
    Ok(())
}

/// What follows a worker's end: whoever follows it is woken, a fill's outcome counted, and the
/// machine's agent told.
async fn ended(
    tx: &mut PgConnection,
    machine: Uuid,
    run: Uuid,
    worker: Uuid,
    state: WorkerState,
) -> sqlx::Result<()> {
    hub::worker_ended(&mut *tx, worker).await?;
    if let Some(took) = store::fills::ended(&mut *tx, run, worker).await? {
        let outcome = if state == WorkerState::Completed { "completed" } else { "failed" };
        metrics::counter!("astraeus_fills_total", "outcome" => outcome).increment(1);
        metrics::histogram!("astraeus_fill_duration_seconds").record(took);
    }
    store::machines::touch_assignments(&mut *tx, &[machine]).await
}

/// What a worker its machine reports failed does: waits to start again there, or ends.
enum Failed {
    Restarting { run: Uuid, after: Duration, reason: String },
    Ended(Option<Uuid>),
}

/// Restarts the worker on its machine when its run's `restart_policy` says so
/// ([`restart::decide`]), or ends it; the run is locked.
async fn failed(
    tx: &mut PgConnection,
    worker: Uuid,
    machine: Uuid,
    reason: &str,
    exit_code: Option<i32>,
) -> sqlx::Result<Failed> {
    let Some(w) = store::workers::failing(&mut *tx, worker, machine).await?.filter(|w| !w.waiting) else {
        return Ok(Failed::Ended(None));
    };
    let failure = restart::Failure {
        was_running: w.state == WorkerState::Running,
        fill: w.fill,
        restarts: w.restarts.max(0) as u32,
        reason,
    };
    let reason = match restart::decide(&w.spec.task_template, failure) {
        restart::Next::Restart { after, reason, .. } => {
            let again =
                store::workers::restart(&mut *tx, worker, machine, w.restarts, &reason, exit_code, after)
                    .await?;
            if let Some(run) = again {
                return Ok(Failed::Restarting { run, after, reason });
            }
            // Changed since it was read: it ends, if it has not already.
            failure.reason.to_owned()
        }
        restart::Next::Fail { reason } => reason,
    };
    let run =
        store::workers::finish(tx, worker, Some(machine), WorkerState::Failed, &reason, exit_code).await?;
    Ok(Failed::Ended(run))
}

/// Records that the worker will start again, and when.
async fn restarted(tx: &mut PgConnection, worker: Uuid, after: Duration, reason: &str) -> sqlx::Result<()> {
    let Some((workspace, name)) = store::workers::identity(&mut *tx, worker).await? else {
        return Ok(());
    };
    metrics::counter!("astraeus_worker_restarts_total").increment(1);
    let message = format!("{reason}; starts again in {}s", after.as_secs());
    let event = store::events::New {
        workspace: Some(workspace),
        object_kind: "worker",
        object_name: &name,
        warning: true,
        reason: "Restarting",
        message: &message,
        source: "api",
    };
    store::events::record(&mut *tx, &event).await
}

/// A fresh transfer token for a fill of this machine that pulls from a peer: its pull outlasted
/// the one its assignment carried.
async fn transfer_token(
    State(app): State<AppState>,
    caller: MachineCaller,
    Path(id): Path<Uuid>,
) -> Result<Json<TransferToken>, ApiError> {
    let row = store::workers::assigned(&app.db, caller.id, id).await?;
    let peer = row.as_ref().and_then(|row| peer_source(&app.keys, caller.id, row));
    match peer {
        Some(p) => Ok(Json(TransferToken { token: p.token })),
        None => Err(ApiError::NotFound(format!("worker {id} on {} pulls from no peer", caller.name))),
    }
}

/// For a fill from a peer, where to pull from, with a fresh transfer token for that holder,
/// this drive and this machine. `None` for any other worker, and for a fill whose holder no
/// longer serves a data port (its pull fails, and the fill goes back to its template).
fn peer_source(keys: &Keys, machine: Uuid, row: &AssignmentRow) -> Option<PeerSource> {
    let (Some(holder), Some(name), Some(address), Some(manifest)) =
        (row.peer_id, &row.peer_name, &row.peer_address, &row.peer_manifest)
    else {
        return None;
    };
    let (drive, drive_id) = (row.fill_drive.as_ref()?, row.fill_drive_id?);
    let folder = full_name(&row.namespace, drive);
    let claims = TransferClaims::new(holder, machine, drive_id, &folder, manifest, Utc::now());
    Some(PeerSource {
        address: address.clone(),
        machine: name.clone(),
        manifest: manifest.clone(),
        token: mint_transfer(keys, &claims),
    })
}

/// Turns a worker row into what the agent runs: mounts resolved, secrets as opened.
fn assignment(
    refs: &Referenced,
    run: &RunSpec,
    row: AssignmentRow,
    opened: Opened,
    peer: Option<PeerSource>,
) -> Result<Assignment, ApiError> {
    let task = &run.task_template;
    let Opened { env, image_pull_auth } = opened;
    let mut mounts = Vec::new();
    if let (Some(drive), Some(drive_id)) = (&row.fill_drive, row.fill_drive_id) {
        // A fill writes the whole copy, read-write, at /drive.
        let folder = full_name(&row.namespace, drive);
        mounts.push(MountSpec {
            drive: folder.clone(),
            source: MountSource::Copy { folder, drive_id },
            sub_path: String::new(),
            target: "/drive".into(),
            read_only: false,
        });
    }
    for r in &task.datavolume_refs {
        let Some(drive) = refs.drives.get(&(row.workspace_id, r.name.to_string())) else {
            continue;
        };
        let spec = &drive.spec.0;
        let (source, base) = match spec.location() {
            Location::Placed(sub) => (
                MountSource::Copy { folder: full_name(&row.namespace, &drive.name), drive_id: drive.id },
                sub.as_str().to_owned(),
            ),
            Location::Shared(path) | Location::Node(_, path) => {
                let grants = refs.grants.get(&(row.workspace_id, spec.cluster.to_string()));
                let grant = grant::covering(grants.map_or(&[][..], Vec::as_slice), &path);
                let source = MountSource::Host {
                    path: path.to_string(),
                    grant: grant.map(|g| g.path.to_string()),
                    grant_mode: grant.map_or(Mode::ReadOnly, |g| g.mode),
                };
                (source, String::new())
            }
        };
        let sub_path = [base.as_str(), r.sub_path.as_str()]
            .iter()
            .filter(|s| !s.is_empty())
            .cloned()
            .collect::<Vec<_>>()
            .join("/");
        let target = r
            .mount_path
            .as_ref()
            .map(|m| m.to_string())
            .unwrap_or_else(|| spec.source().mount_path.to_string());
        let read_only = r.mode.unwrap_or(spec.source().mode) == crate::domain::task::Mode::ReadOnly;
        mounts.push(MountSpec {
            drive: full_name(&row.namespace, &drive.name),
            source,
            sub_path,
            target,
            read_only,
        });
    }
    Ok(Assignment {
        uid: row.id,
        name: row.name,
        run: row.run_name,
        namespace: row.namespace,
        state: row.state,
        image: task.image.clone(),
        command: task.command.clone(),
        args: task.args.clone(),
        env,
        time_limit_seconds: task.time_limit_seconds,
        mounts,
        resources: Limits {
            cpu_cores: task.requested_resources.cpu_cores.into(),
            memory_bytes: task.requested_resources.memory_bytes,
            gpus: task.requested_resources.gpus,
        },
        id_slot: u32::try_from(row.id_slot).map_err(anyhow::Error::from)?,
        fill: row.fill_drive.is_some(),
        peer,
        image_pull_auth,
    })
}

async fn report_status(
    State(app): State<AppState>,
    caller: MachineCaller,
    Path(id): Path<Uuid>,
    Body(report): Body<StatusReport>,
) -> Result<Json<Ack>, ApiError> {
    let mut tx = app.db.begin().await?;
    // Runs, then workers, then machines: the order every transaction locks in.
    if store::workers::lock_run_of(&mut tx, id).await?.is_none() {
        return Ok(Json(Ack { accepted: false }));
    }
    let reason = cut(&report.reason);
    let mut restarting = None;
    let mut peer_fill = false;
    let run = match report.state {
        WorkerState::Preparing => store::workers::preparing(&mut tx, id, caller.id, reason).await?,
        WorkerState::Running => store::workers::start(&mut tx, id, caller.id).await?.map(|s| {
            peer_fill = s.peer_fill;
            s.run
        }),
        WorkerState::Completed => {
            store::workers::finish(&mut tx, id, Some(caller.id), report.state, reason, report.exit_code)
                .await?
        }
        WorkerState::Failed => match failed(&mut tx, id, caller.id, reason, report.exit_code).await? {
            Failed::Restarting { run, after, reason } => {
                restarting = Some((after, reason));
                Some(run)
            }
            Failed::Ended(run) => run,
        },
        other => {
            return Err(ApiError::invalid(
                "state",
                format!("an agent reports Preparing, Running, Completed or Failed, not {other:?}"),
            ));
        }
    };
    let Some(run) = run else {
        return Ok(Json(Ack { accepted: false }));
    };
    let named = if report.events.is_empty() { None } else { store::workers::identity(&mut *tx, id).await? };
    if let Some((workspace, name)) = named {
        let source = format!("agent/{}", caller.name);
        for e in &report.events {
            let event = store::events::New {
                workspace: Some(workspace),
                object_kind: "worker",
                object_name: &name,
                warning: e.kind == "Warning",
                reason: cut(&e.reason),
                message: cut(&e.message),
                source: &source,
            };
            store::events::record(&mut *tx, &event).await?;
        }
    }
    store::workers::refresh_locked_run(&mut tx, run).await?;
    if let Some((after, reason)) = restarting {
        restarted(&mut tx, id, after, &reason).await?;
        hub::worker_changed(&mut *tx, id).await?;
    } else if report.state.is_terminal() {
        ended(&mut tx, caller.id, run, id, report.state).await?;
    } else {
        hub::worker_changed(&mut *tx, id).await?;
        // A pull from a peer under way may feed the next copies: the fills waiting for a
        // source are planned again.
        if peer_fill {
            hub::request_schedule(&mut *tx).await?;
        }
    }
    tx.commit().await?;
    Ok(Json(Ack { accepted: true }))
}

async fn upload_logs(
    State(app): State<AppState>,
    caller: MachineCaller,
    Path(id): Path<Uuid>,
    Body(upload): Body<LogUpload>,
) -> Result<Json<Ack>, ApiError> {
    if upload.lines.len() > MAX_LOG_LINES {
        return Err(ApiError::invalid("lines", format!("at most {MAX_LOG_LINES} lines per upload")));
    }
    let (streams, lines): (Vec<String>, Vec<String>) = upload
        .lines
        .into_iter()
        .map(|l| {
            (if l.stream == "stderr" { "stderr" } else { "stdout" }.to_owned(), l.line.replace('\0', ""))
        })
        .unzip();
    let mut tx = app.db.begin().await?;
    if !store::workers::is_on_machine(&mut *tx, id, caller.id).await? {
        return Ok(Json(Ack { accepted: false }));
    }
    // Lines dropped past a bound are still an accepted upload: the agent has nothing to retry.
    if !store::logs::append(&mut tx, id, &streams, &lines, app.log_limits).await? {
        return Ok(Json(Ack { accepted: false }));
    }
    tx.commit().await?;
    Ok(Json(Ack { accepted: true }))
}
