//! The holder's data port: its complete copies, each file of each as its manifest lists it,
//! for the machines the server sends to it with a transfer token.
//!
//! `GET /v1/copies/{folder}/manifest` and `GET /v1/copies/{folder}/files/{*path}`, with
//! `Authorization: Bearer <transfer token>`. A request is served only when the token verifies
//! with the server's keys and grants this machine's copy in that folder; the copy is complete,
//! made for the token's drive, and its manifest the token's; and the path is a file its
//! manifest lists. No other path is ever opened, and that one beneath the copy's folder without
//! following a link. `Range: bytes=N-` is answered with 206 so that a receiver resumes.
//!
//! A copy this machine is still receiving from a peer, with the token's drive and manifest, is
//! served as it lands ([`super::relay`]): its manifest once received, and of each file what
//! has been checked and written, the rest as it comes.
//!
//! Uploads are bounded in number (503 with Retry-After past it) and share one byte rate. The
//! port serves HTTPS when given a certificate ([`super::tls`]), plain HTTP otherwise.

use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use rustls::ServerConfig;
use tokio::sync::{OnceCell, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::beneath;
use super::handshake;
use super::keys::TrustedKeys;
use super::rate::Rate;
use super::relay::{Follow, Relay, Staged};
use crate::agent::Shared;
use crate::agent::layout;
use crate::agent::manifest::{Digest, Manifest, Manifests, keep};
use crate::auth::transfer::TransferClaims;

/// What a receiver is told to wait when every upload slot is taken.
const RETRY_AFTER_SECONDS: u64 = 5;
/// Bytes read from a file and sent at a time.
const PIECE: usize = 256 << 10;
/// Parsed manifests kept in memory, most recently used: one may list millions of files.
const PARSED_KEPT: usize = 2;

/// How many uploads the data port serves at once; their bytes a second are the machine's
/// upload rate (`Shared::upload`).
#[derive(Debug, Clone)]
pub struct ServeLimits {
    /// Uploads (manifests and files) at once.
    pub uploads: usize,
}

/// The data port's state.
pub struct Holder {
    /// This machine's id: a token naming another source is refused.
    machine: Uuid,
    /// The confirmed data location, as the heartbeat keeps it, and the copies being received.
    shared: Arc<Shared>,
    /// The digests of the copies' manifests, as heartbeats report them.
    manifests: Arc<Manifests>,
    keys: Arc<TrustedKeys>,
    uploads: Arc<Semaphore>,
    parsed: Mutex<Vec<Parsed>>,
    /// Cancelled when the port stops: uploads under way end at once.
    closing: CancellationToken,
}

/// A manifest parsed (or being parsed) for a folder at a digest.
struct Parsed {
    folder: String,
    digest: Digest,
    manifest: Arc<OnceCell<Arc<Manifest>>>,
}

impl Holder {
    pub fn new(
        machine: Uuid,
        shared: Arc<Shared>,
        manifests: Arc<Manifests>,
        keys: Arc<TrustedKeys>,
        limits: &ServeLimits,
    ) -> Holder {
        Holder {
            machine,
            shared,
            manifests,
            keys,
            uploads: Arc::new(Semaphore::new(limits.uploads)),
            parsed: Mutex::default(),
            closing: CancellationToken::new(),
        }
    }
}

pub fn router(holder: Arc<Holder>) -> Router {
    Router::new()
        .route("/v1/copies/{folder}/manifest", get(manifest))
        .route("/v1/copies/{folder}/files/{*path}", get(file))
        .with_state(holder)
}

/// Serves the data port on `listener`, over TLS with `tls`, until `stop` is cancelled; uploads
/// under way then end.
pub async fn serve(
    listener: tokio::net::TcpListener,
    tls: Option<Arc<ServerConfig>>,
    holder: Arc<Holder>,
    stop: CancellationToken,
) -> std::io::Result<()> {
    let closing = holder.closing.clone();
    let shutdown = async move {
        stop.cancelled().await;
        closing.cancel();
    };
    let router = router(holder);
    match tls {
        None => axum::serve(listener, router).with_graceful_shutdown(shutdown).await,
        Some(config) => {
            let listener = handshake::Listener::new(listener, config)?;
            axum::serve(listener, router).with_graceful_shutdown(shutdown).await
        }
    }
}

/// The address peers reach a data port listening on `addr` at: `https://` when it serves TLS.
pub fn address(addr: std::net::SocketAddr, tls: bool) -> String {
    let scheme = if tls { "https" } else { "http" };
    format!("{scheme}://{addr}")
}

/// A refusal, answered as `{"error": {"code", "message"}}` like the server's API.
#[derive(Debug)]
struct Refusal(StatusCode, String);

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let Refusal(status, message) = self;
        let code = status.canonical_reason().unwrap_or("error").to_lowercase().replace(' ', "_");
        let body = Json(serde_json::json!({"error": {"code": code, "message": message}}));
        let mut response = (status, body).into_response();
        let headers = response.headers_mut();
        if status == StatusCode::SERVICE_UNAVAILABLE {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECONDS));
        }
        if status == StatusCode::UNAUTHORIZED {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

/// What a token grants.
enum Served {
    Whole(Copy),
    Relay(Arc<Relay>),
}

/// A complete copy the token grants, as found on disk.
struct Copy {
    drives: OwnedFd,
    root: OwnedFd,
    digest: Digest,
}

async fn manifest(
    State(holder): State<Arc<Holder>>,
    Path(folder): Path<String>,
    headers: HeaderMap,
) -> Result<Response, Refusal> {
    let grant = holder.authorize(&headers, &folder).await?;
    let copy = match holder.copy(&grant)? {
        Served::Whole(copy) => copy,
        Served::Relay(relay) => {
            let permit = holder.permit()?;
            let staged = holder.staged(&relay).await?;
            let file = staged.manifest_file.clone();
            let size = file.metadata().map_err(|e| conflict(format!("the manifest of {folder}: {e}")))?.len();
            return Ok(holder.send(file, 0, size, None, permit));
        }
    };
    let permit = holder.permit()?;
    let store = beneath::open_dir(&copy.drives, keep::FOLDER);
    let opened = store.and_then(|store| beneath::open_file(&store, &keep::file_name(&folder)));
    let (file, size) =
        opened.map_err(|e| conflict(format!("the manifest of {folder} cannot be read here: {e}")))?;
    Ok(holder.send(Arc::new(file), 0, size, None, permit))
}

async fn file(
    State(holder): State<Arc<Holder>>,
    Path((folder, path)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, Refusal> {
    let grant = holder.authorize(&headers, &folder).await?;
    let served = holder.copy(&grant)?;
    let permit = holder.permit()?;
    let manifest = match &served {
        Served::Whole(copy) => holder.parsed(&folder, copy).await?,
        Served::Relay(relay) => holder.staged(relay).await?.manifest.clone(),
    };
    let entries = manifest.entries();
    let listed = entries.binary_search_by(|e| e.path().cmp(&path)).ok();
    let Some((index, entry)) = listed.map(|i| (i, &entries[i])).filter(|(_, e)| !e.is_dir()) else {
        return Err(Refusal(StatusCode::NOT_FOUND, format!("{path} is not a file of {folder}'s manifest")));
    };
    let start = range_start(&headers, entry.size())?;
    let differs = |why: String| {
        conflict(format!("the copy of {folder} here differs from its manifest at {path}: {why}"))
    };
    let (root, follow) = match &served {
        Served::Whole(copy) => (&copy.root, None),
        Served::Relay(relay) => {
            // The file is made when its turn comes: its first bytes past `start` are awaited.
            let mut follow = relay.follow(index, entry.size());
            tokio::select! {
                _ = holder.closing.cancelled() => return Err(closing()),
                ready = follow.ready(start) => ready.map_err(|e| conflict(format!("{folder}: {e}")))?,
            };
            (&holder.staged(relay).await?.root, Some(follow))
        }
    };
    let (parent, name) = beneath::open_parent(root, entry.path()).map_err(|e| differs(e.to_string()))?;
    let (file, size) = beneath::open_file(&parent, name).map_err(|e| differs(e.to_string()))?;
    if follow.is_none() && size != entry.size() {
        return Err(differs(format!("{size} bytes, not the {} listed", entry.size())));
    }
    Ok(holder.send(Arc::new(file), start, entry.size(), follow, permit))
}

fn conflict(message: String) -> Refusal {
    Refusal(StatusCode::CONFLICT, message)
}

fn closing() -> Refusal {
    Refusal(StatusCode::SERVICE_UNAVAILABLE, "this machine's data port is closing".into())
}

impl Holder {
    /// The grant of the request's token, if it is for this machine's copy in `folder`.
    async fn authorize(&self, headers: &HeaderMap, folder: &str) -> Result<TransferClaims, Refusal> {
        let unauthorized = |m: String| Refusal(StatusCode::UNAUTHORIZED, m);
        let token = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .ok_or_else(|| unauthorized("no transfer token: send Authorization: Bearer <token>".into()))?;
        let grant = self
            .keys
            .verify_transfer(token.trim())
            .await
            .map_err(|e| unauthorized(format!("the transfer token is not valid: {e}")))?;
        let forbidden = |m: String| Refusal(StatusCode::FORBIDDEN, m);
        if grant.source != self.machine {
            return Err(forbidden(format!(
                "the transfer token is for machine {}, not this one",
                grant.source
            )));
        }
        if grant.folder != folder {
            return Err(forbidden(format!("the transfer token is for {}, not {folder}", grant.folder)));
        }
        Ok(grant)
    }

    /// What `grant` names: this machine's copy in its folder, complete, of the grant's drive
    /// and manifest; or else that copy being received, with that manifest.
    fn copy(&self, grant: &TransferClaims) -> Result<Served, Refusal> {
        let whole = self.whole(grant);
        match self.shared.relays.get(&grant.folder) {
            Some(relay) if whole.is_err() => {
                if relay.drive != grant.drive {
                    let why = format!(
                        "the copy of {} here is received for another drive than the token's",
                        grant.folder
                    );
                    return Err(Refusal(StatusCode::FORBIDDEN, why));
                }
                if relay.digest.to_string() != grant.manifest {
                    let why = format!("the copy of {} here is received with another manifest", grant.folder);
                    return Err(conflict(why));
                }
                Ok(Served::Relay(relay))
            }
            _ => whole.map(Served::Whole),
        }
    }

    /// The complete copy `grant` names, if it is here, of the grant's drive and manifest.
    fn whole(&self, grant: &TransferClaims) -> Result<Copy, Refusal> {
        let folder = grant.folder.as_str();
        let missing = || Refusal(StatusCode::NOT_FOUND, format!("no copy of {folder} here"));
        let dir = self.shared.data_location.lock().expect("not poisoned").clone().ok_or_else(missing)?;
        if !layout::plain(folder) || folder.starts_with('.') {
            return Err(missing());
        }
        let drives = layout::open_drives(&dir).ok_or_else(missing)?;
        let root = beneath::open_dir(&drives, folder).map_err(|_| missing())?;
        match layout::complete_copy(&drives, folder) {
            None => return Err(conflict(format!("the copy of {folder} here is not complete"))),
            Some(id) if id != grant.drive => {
                let why = format!("the copy of {folder} here was made for another drive than the token's");
                return Err(Refusal(StatusCode::FORBIDDEN, why));
            }
            Some(_) => {}
        }
        if let Some(lost) = self.manifests.lost(folder, Some(grant.drive)) {
            let why = format!("the copy of {folder} here lost {} since it was filled", lost.files());
            return Err(conflict(why));
        }
        let digest = Digest::parse(&grant.manifest).map_err(|why| Refusal(StatusCode::FORBIDDEN, why))?;
        if self.manifests.digest(folder, Some(grant.drive)) != Some(digest) {
            let why = format!(
                "the copy of {folder} here has no manifest of digest {digest} (it changed, or its manifest is not made yet)"
            );
            return Err(conflict(why));
        }
        Ok(Copy { drives, root, digest })
    }

    fn permit(&self) -> Result<OwnedSemaphorePermit, Refusal> {
        self.uploads.clone().try_acquire_owned().map_err(|_| {
            let why =
                format!("this machine is sending as many copies as it may: retry in {RETRY_AFTER_SECONDS} s");
            Refusal(StatusCode::SERVICE_UNAVAILABLE, why)
        })
    }

    /// The copy's manifest, parsed once per digest and kept while it is among the last used.
    async fn parsed(&self, folder: &str, copy: &Copy) -> Result<Arc<Manifest>, Refusal> {
        let cell = {
            let mut parsed = self.parsed.lock().expect("not poisoned");
            let at = parsed.iter().position(|p| p.folder == folder && p.digest == copy.digest);
            let entry = match at {
                Some(i) => parsed.remove(i),
                None => Parsed { folder: folder.to_owned(), digest: copy.digest, manifest: Arc::default() },
            };
            let cell = entry.manifest.clone();
            parsed.push(entry);
            if parsed.len() > PARSED_KEPT {
                parsed.remove(0);
            }
            cell
        };
        let store = beneath::open_dir(&copy.drives, keep::FOLDER);
        let digest = copy.digest;
        let read = async {
            let (mut file, _) = store
                .and_then(|store| beneath::open_file(&store, &keep::file_name(folder)))
                .map_err(|e| e.to_string())?;
            let parse = tokio::task::spawn_blocking(move || Manifest::read(&mut file, &digest));
            let manifest = parse.await.map_err(|e| e.to_string())?.map_err(|e| e.to_string())?;
            Ok::<_, String>(Arc::new(manifest))
        };
        let manifest = cell.get_or_try_init(|| read).await;
        manifest
            .cloned()
            .map_err(|why| conflict(format!("the manifest of {folder} cannot be read here: {why}")))
    }

    /// Where `relay`'s copy is received, once it is.
    async fn staged<'r>(&self, relay: &'r Relay) -> Result<&'r Staged, Refusal> {
        tokio::select! {
            _ = self.closing.cancelled() => Err(closing()),
            staged = relay.staged() => staged.map_err(|e| conflict(format!("{} here: {e}", relay.folder()))),
        }
    }

    /// Answers with bytes `start..size` of `file` (as `follow` allows, for a file being
    /// received), at the shared rate, holding `permit` until the last is sent or the receiver
    /// goes.
    fn send(
        &self,
        file: Arc<std::fs::File>,
        start: u64,
        size: u64,
        follow: Option<Follow>,
        permit: OwnedSemaphorePermit,
    ) -> Response {
        let state =
            Upload { file, at: start, end: size, follow, rate: self.shared.upload.clone(), _permit: permit };
        let closing = self.closing.clone();
        let stream = futures::stream::unfold(state, |mut up| async move {
            let piece = up.next().await?;
            Some((piece, up))
        });
        let body = Body::from_stream(futures::StreamExt::take_until(stream, closing.cancelled_owned()));
        let mut response = Response::new(body);
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
        headers.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(size - start));
        if start > 0 {
            let range = format!("bytes {start}-{}/{size}", size - 1);
            headers.insert(header::CONTENT_RANGE, HeaderValue::from_str(&range).expect("ASCII"));
            *response.status_mut() = StatusCode::PARTIAL_CONTENT;
        }
        response
    }
}

/// A file being sent.
struct Upload {
    file: Arc<std::fs::File>,
    at: u64,
    end: u64,
    /// For a file being received: how much of it may be read yet.
    follow: Option<Follow>,
    rate: Rate,
    _permit: OwnedSemaphorePermit,
}

impl Upload {
    /// The next piece; an error when the file ends early (it shrank since it was opened) or
    /// the copy being received stops, which cuts the answer short rather than let it pass for
    /// whole.
    async fn next(&mut self) -> Option<Result<Bytes, std::io::Error>> {
        if self.at == self.end {
            return None;
        }
        let ready = match &mut self.follow {
            None => self.end,
            Some(follow) => match follow.ready(self.at).await {
                Ok(ready) => ready.min(self.end),
                Err(stopped) => return Some(Err(std::io::Error::other(stopped))),
            },
        };
        let want = (ready - self.at).min(PIECE as u64) as usize;
        let (file, at) = (self.file.clone(), self.at);
        let read = tokio::task::spawn_blocking(move || {
            let mut buf = vec![0u8; want];
            let n = file.read_at(&mut buf, at)?;
            buf.truncate(n);
            Ok::<_, std::io::Error>(buf)
        })
        .await;
        let buf = match read {
            Ok(Ok(buf)) if !buf.is_empty() => buf,
            Ok(Ok(_)) => return Some(Err(std::io::ErrorKind::UnexpectedEof.into())),
            Ok(Err(e)) => return Some(Err(e)),
            Err(e) => return Some(Err(std::io::Error::other(e))),
        };
        self.at += buf.len() as u64;
        self.rate.take(buf.len() as u64).await;
        Some(Ok(Bytes::from(buf)))
    }
}

/// Where the answer starts: 0 without a `Range`; N for `bytes=N-` with N before the end. Only
/// that form is served: it is all a resuming receiver asks.
fn range_start(headers: &HeaderMap, size: u64) -> Result<u64, Refusal> {
    let Some(range) = headers.get(header::RANGE) else { return Ok(0) };
    let start = range
        .to_str()
        .ok()
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.strip_suffix('-'))
        .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|n| n.parse::<u64>().ok());
    match start {
        Some(n) if n < size => Ok(n),
        _ => Err(Refusal(
            StatusCode::RANGE_NOT_SATISFIABLE,
            format!("only Range: bytes=N- with N below the file's {size} bytes is served"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_address_reported_says_whether_the_port_serves_tls() {
        let cases = [
            ("10.0.0.5:7070", false, "http://10.0.0.5:7070"),
            ("10.0.0.5:7070", true, "https://10.0.0.5:7070"),
            ("[fd00::5]:7070", true, "https://[fd00::5]:7070"),
        ];
        for (addr, tls, expected) in cases {
            assert_eq!(address(addr.parse().unwrap(), tls), expected);
        }
    }

    #[test]
    fn a_range_is_bytes_from_n_to_the_end_within_the_file() {
        let cases = [
            (None, 10, Ok(0)),
            (Some("bytes=0-"), 10, Ok(0)),
            (Some("bytes=9-"), 10, Ok(9)),
            (Some("bytes=10-"), 10, Err(416)),
            (Some("bytes=0-"), 0, Err(416)),
            (Some("bytes=1-5"), 10, Err(416)),
            (Some("bytes=-5"), 10, Err(416)),
            (Some("bytes=+1-"), 10, Err(416)),
            (Some("bytes=1-,3-"), 10, Err(416)),
            (Some("items=1-"), 10, Err(416)),
            (Some("bytes=99999999999999999999-"), 10, Err(416)),
        ];
        for (range, size, expected) in cases {
            let mut headers = HeaderMap::new();
            if let Some(r) = range {
                headers.insert(header::RANGE, HeaderValue::from_static(r));
            }
            let got = range_start(&headers, size).map_err(|r| r.0.as_u16());
            assert_eq!(got, expected, "{range:?} of {size}");
        }
    }
}
