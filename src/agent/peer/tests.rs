//! A holder and a receiver over real HTTP on loopback, each with a data location of its own,
//! with tokens signed by real keys.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use futures::StreamExt;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::tls::testing::Ca;
use super::*;
use crate::agent::Shared;
use crate::agent::disk::{self, COPY_ID, MARKER};
use crate::agent::manifest::{self, CHUNK_BYTES, Digest, Manifest, Manifests, keep};
use crate::auth::Keys;
use crate::auth::transfer::{TransferClaims, mint_transfer};

const FOLDER: &str = "default.food101";
const BIG: &str = "train/00000.parquet";
const BIG_BYTES: usize = 20 << 20;

/// A holder serving a complete copy of a drive on loopback.
struct Source {
    dir: tempfile::TempDir,
    url: String,
    machine: Uuid,
    drive: Uuid,
    digest: Digest,
    keys: Keys,
    /// Bytes the port sends before it cuts every answer short (over plain HTTP).
    budget: Arc<AtomicI64>,
    /// A client of the port: over HTTPS, it trusts the port's CA.
    http: reqwest::Client,
    manifests: Arc<Manifests>,
}

/// The copy: a file of three chunks, small ones, an empty one and an empty folder.
fn fill(copy: &Path) -> u64 {
    let mut big = vec![0u8; BIG_BYTES];
    blake3::Hasher::new().update(b"food101").finalize_xof().fill(&mut big);
    let files: [(&str, &[u8]); 4] = [
        (BIG, &big),
        ("train/00012.parquet", &[7u8; 1000]),
        ("meta/labels.txt", b"apple_pie\nbaby_back_ribs\n"),
        ("empty.bin", b""),
    ];
    for (path, data) in files {
        std::fs::create_dir_all(copy.join(path).parent().unwrap()).unwrap();
        std::fs::write(copy.join(path), data).unwrap();
    }
    std::fs::create_dir(copy.join("val")).unwrap();
    std::fs::write(copy.join(MARKER), "").unwrap();
    files.iter().map(|(_, d)| d.len() as u64).sum()
}

impl Source {
    async fn start(limits: ServeLimits) -> Source {
        Source::serving(limits, None).await
    }

    /// A holder whose data port serves HTTPS with `cert` and `key` (PEM) as the agent's does,
    /// and a client of it that trusts `ca`.
    async fn start_tls((cert, key): &(String, String), ca: &Ca) -> Source {
        let path = Path::new("data.pem");
        let (cert, key) = (
            tls::PemFile { flag: tls::CERT_FLAG, path, bytes: cert.clone().into_bytes() },
            tls::PemFile { flag: tls::KEY_FLAG, path, bytes: key.clone().into_bytes() },
        );
        let config = tls::server(&cert, &key, None).unwrap();
        let mut source = Source::serving(ServeLimits { uploads: 4 }, Some(Arc::new(config))).await;
        let trusted = trusting(ca).client_config();
        source.http = reqwest::Client::builder()
            .use_preconfigured_tls(rustls::ClientConfig::clone(&trusted))
            .build()
            .unwrap();
        source
    }

    async fn serving(limits: ServeLimits, tls: Option<Arc<rustls::ServerConfig>>) -> Source {
        let dir = tempfile::tempdir().unwrap();
        let (machine, drive) = (Uuid::now_v7(), Uuid::now_v7());
        let me = rustix::process::getuid().as_raw();
        fill(&disk::fill_folder(dir.path(), FOLDER, drive, me).unwrap());
        let manifests = Arc::new(Manifests::default());
        manifests.settle();
        keep::pass(&manifests, dir.path(), &Default::default(), &CancellationToken::new());
        let digest = manifests.digest(FOLDER, Some(drive)).expect("the copy's manifest is made");
        let shared = Arc::new(Shared::default());
        *shared.data_location.lock().unwrap() = Some(dir.path().to_path_buf());
        let pem = Keys::generate_pem().unwrap();
        let trusted = Arc::new(TrustedKeys::fixed(Keys::from_pem(&pem).unwrap().public()));
        let holder = Arc::new(Holder::new(machine, shared, manifests.clone(), trusted, &limits));
        let budget = Arc::new(AtomicI64::new(i64::MAX));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = serve::address(listener.local_addr().unwrap(), tls.is_some());
        match tls {
            None => {
                let router = cutting(serve::router(holder), budget.clone());
                tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
            }
            Some(tls) => {
                let serving = serve::serve(listener, Some(tls), holder, CancellationToken::new());
                tokio::spawn(async move { serving.await.unwrap() });
            }
        }
        let keys = Keys::from_pem(&pem).unwrap();
        Source { dir, url, machine, drive, digest, keys, budget, http: reqwest::Client::new(), manifests }
    }

    async fn new() -> Source {
        Source::start(ServeLimits { uploads: 4 }).await
    }

    fn copy(&self) -> PathBuf {
        self.dir.path().join("drives").join(FOLDER)
    }

    /// A token of this holder's copy, with what `change` makes of its grant.
    fn token_with(&self, change: impl FnOnce(&mut TransferClaims)) -> String {
        let digest = self.digest.to_string();
        let mut claims = TransferClaims::new(
            self.machine,
            Uuid::now_v7(),
            self.drive,
            FOLDER,
            &digest,
            chrono::Utc::now(),
        );
        change(&mut claims);
        mint_transfer(&self.keys, &claims)
    }

    fn order(&self) -> Order {
        self.order_with(|_| {})
    }

    fn order_with(&self, change: impl FnOnce(&mut TransferClaims)) -> Order {
        let token = self.token_with(change);
        Order {
            source: self.url.clone(),
            token,
            folder: FOLDER.into(),
            drive_id: self.drive,
            digest: self.digest,
        }
    }

    /// A GET of the data port's `path` with `token`, and `range`.
    async fn get(&self, path: &str, token: Option<&str>, range: Option<&str>) -> reqwest::Response {
        let mut request = self.http.get(format!("{}{path}", self.url));
        if let Some(t) = token {
            request = request.bearer_auth(t);
        }
        if let Some(r) = range {
            request = request.header("range", r);
        }
        request.send().await.unwrap()
    }
}

/// Pulls that trust `ca` alone.
fn trusting(ca: &Ca) -> Trust {
    let bytes = ca.pem.clone().into_bytes();
    Trust::cas(&tls::PemFile { flag: tls::CA_FLAG, path: Path::new("ca.pem"), bytes }).unwrap()
}

/// The data port with every answer cut once `budget` bytes were sent in all.
fn cutting(router: axum::Router, budget: Arc<AtomicI64>) -> axum::Router {
    router.layer(axum::middleware::map_response(move |response: Response| {
        let budget = budget.clone();
        async move {
            let (parts, body) = response.into_parts();
            let cut = body.into_data_stream().map(move |piece| {
                let piece = piece.map_err(axum::BoxError::from)?;
                if budget.fetch_sub(piece.len() as i64, Ordering::SeqCst) < piece.len() as i64 {
                    return Err("cut".into());
                }
                Ok::<_, axum::BoxError>(piece)
            });
            Response::from_parts(parts, Body::from_stream(cut))
        }
    }))
}

/// A receiving machine's data location.
struct Receiver {
    dir: tempfile::TempDir,
    manifests: Arc<Manifests>,
    relays: Arc<Relays>,
}

impl Receiver {
    fn new() -> Receiver {
        let (manifests, relays) = (Arc::default(), Arc::default());
        Receiver { dir: tempfile::tempdir().unwrap(), manifests, relays }
    }

    async fn pull(&self, order: &Order, limits: &PullLimits) -> Result<PullReport, PullError> {
        pull(order, self.dir.path(), &self.manifests, limits, None, &CancellationToken::new()).await
    }

    /// Serves this machine's copies, and those it is receiving, on a data port of its own that
    /// takes the tokens `source` mints; the port's address and this machine's id.
    async fn serve(&self, source: &Source) -> (String, Uuid) {
        let shared = Arc::new(Shared { relays: self.relays.clone(), ..Shared::default() });
        *shared.data_location.lock().unwrap() = Some(self.dir.path().to_path_buf());
        let machine = Uuid::now_v7();
        let trusted = Arc::new(TrustedKeys::fixed(source.keys.public()));
        let limits = ServeLimits { uploads: 4 };
        let holder = Arc::new(Holder::new(machine, shared, self.manifests.clone(), trusted, &limits));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = serve::address(listener.local_addr().unwrap(), false);
        tokio::spawn(async move { axum::serve(listener, serve::router(holder)).await.unwrap() });
        (url, machine)
    }

    /// The bytes of `path` in the copy being received.
    fn staged_bytes(&self, path: &str) -> u64 {
        let staged = self.dir.path().join("drives").join(format!("{STAGING}{FOLDER}")).join(path);
        std::fs::metadata(staged).map_or(0, |m| m.len())
    }

    fn copy(&self) -> PathBuf {
        self.dir.path().join("drives").join(FOLDER)
    }

    fn drives(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.dir.path().join("drives"))
            .map(|d| d.map(|e| e.unwrap().file_name().into_string().unwrap()).collect())
            .unwrap_or_default();
        names.sort();
        names
    }
}

/// The manifest kept for `folder` at `dir`, read with `digest`.
fn stored_manifest(dir: &Path, digest: &Digest) -> Manifest {
    let path = dir.join("drives").join(keep::FOLDER).join(keep::file_name(FOLDER));
    Manifest::read(&mut std::fs::File::open(path).unwrap(), digest).unwrap()
}

fn modified(path: &Path) -> std::time::SystemTime {
    std::fs::symlink_metadata(path).unwrap().modified().unwrap()
}

#[tokio::test]
async fn a_pull_makes_a_copy_equal_to_the_source_with_its_manifest_and_the_marker_last() {
    let source = Source::new().await;
    let receiver = Receiver::new();
    let report = receiver.pull(&source.order(), &PullLimits::default()).await.unwrap();
    let total = BIG_BYTES as u64 + 1000 + 25;
    assert_eq!(report, PullReport { received: total, kept: 0, files: 4 });

    let manifest = stored_manifest(receiver.dir.path(), &source.digest);
    assert!(manifest::check(&receiver.copy(), &manifest).unwrap().is_clear());
    for entry in manifest.entries().iter().filter(|e| !e.is_dir()) {
        let (theirs, ours) = (source.copy().join(entry.path()), receiver.copy().join(entry.path()));
        assert_eq!(std::fs::read(ours).unwrap(), std::fs::read(theirs).unwrap(), "{}", entry.path());
    }
    assert_eq!(std::fs::read_to_string(receiver.copy().join(COPY_ID)).unwrap(), source.drive.to_string());
    assert!(disk::holds(receiver.dir.path(), FOLDER, source.drive));
    // The marker was written after every file and after the manifest was kept.
    let marker = modified(&receiver.copy().join(MARKER));
    let kept = receiver.dir.path().join("drives").join(keep::FOLDER).join(keep::file_name(FOLDER));
    assert!(modified(&kept) <= marker);
    for entry in manifest.entries() {
        assert!(modified(&receiver.copy().join(entry.path())) <= marker, "{}", entry.path());
    }
    // Nothing is left beside the copy, and its digest is known at once.
    assert_eq!(receiver.drives(), [keep::FOLDER, FOLDER]);
    assert_eq!(receiver.manifests.digest(FOLDER, Some(source.drive)), Some(source.digest));
    let heartbeat = disk::report(receiver.dir.path(), &Default::default(), &receiver.manifests);
    let reported = &heartbeat.copies[0];
    assert!(reported.complete);
    assert_eq!(reported.manifest, Some(source.digest.to_string()));

    // The agent's manifest passes keep it rather than make it again.
    let before = modified(&kept);
    receiver.manifests.settle();
    keep::pass(&receiver.manifests, receiver.dir.path(), &Default::default(), &CancellationToken::new());
    assert_eq!(receiver.manifests.digest(FOLDER, Some(source.drive)), Some(source.digest));
    assert_eq!(modified(&kept), before);
    // A pull again finds the copy whole and receives nothing.
    let again = receiver.pull(&source.order(), &PullLimits::default()).await.unwrap();
    assert_eq!(again, PullReport::default());
}

#[tokio::test]
async fn a_byte_changed_at_the_source_is_caught_and_named_and_nothing_takes_the_copys_place() {
    let source = Source::new().await;
    let path = source.copy().join("train/00012.parquet");
    let mut data = std::fs::read(&path).unwrap();
    data[500] ^= 1;
    std::fs::write(&path, data).unwrap();
    let receiver = Receiver::new();
    let err = receiver.pull(&source.order(), &PullLimits::default()).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "peer copy of default.food101 differs from its manifest at train/00012.parquet"
    );
    assert!(!err.retryable());
    assert!(!receiver.copy().exists());
    assert_eq!(receiver.manifests.digest(FOLDER, Some(source.drive)), None);
}

#[tokio::test]
async fn a_transfer_cut_mid_file_resumes_keeping_the_chunks_received() {
    let source = Source::new().await;
    let receiver = Receiver::new();
    // The manifest and 12 MiB of the 20 MiB file, then the connection drops.
    source.budget.store(12 << 20, Ordering::SeqCst);
    let err = receiver.pull(&source.order(), &PullLimits::default()).await.unwrap_err();
    assert!(err.retryable(), "{err}");
    assert!(!receiver.copy().exists());
    // Left over in the folder being received: nothing the manifest lists, and a link out.
    let staging = receiver.dir.path().join("drives").join(format!("{STAGING}{FOLDER}"));
    std::fs::create_dir_all(staging.join("junk")).unwrap();
    std::fs::write(staging.join("junk/file"), "x").unwrap();
    std::os::unix::fs::symlink("/etc", staging.join("train/etc")).unwrap();

    source.budget.store(i64::MAX, Ordering::SeqCst);
    let report = receiver.pull(&source.order(), &PullLimits::default()).await.unwrap();
    // The first 8 MiB chunk came whole before the cut; the second did not.
    assert!(report.kept >= CHUNK_BYTES, "{report:?}");
    assert_eq!(report.kept + report.received, BIG_BYTES as u64 + 1000 + 25);
    let manifest = stored_manifest(receiver.dir.path(), &source.digest);
    assert!(manifest::check(&receiver.copy(), &manifest).unwrap().is_clear());
    assert!(receiver.copy().join(MARKER).exists());
}

#[tokio::test]
async fn a_cancelled_pull_resumes_where_it_stopped() {
    let source = Source::new().await;
    let receiver = Arc::new(Receiver::new());
    let cancel = CancellationToken::new();
    let slow =
        PullLimits { rate: Rate::new(std::num::NonZeroU64::new(8 << 20).unwrap()), ..PullLimits::default() };
    let running = tokio::spawn({
        let (order, receiver, cancel) = (source.order(), receiver.clone(), cancel.clone());
        async move { pull(&order, receiver.dir.path(), &receiver.manifests, &slow, None, &cancel).await }
    });
    let partial = receiver.dir.path().join("drives").join(format!("{STAGING}{FOLDER}")).join(BIG);
    let mut waited = Duration::ZERO;
    while std::fs::metadata(&partial).map_or(0, |m| m.len()) < CHUNK_BYTES + (1 << 20) {
        assert!(waited < Duration::from_secs(20), "the pull does not progress");
        tokio::time::sleep(Duration::from_millis(20)).await;
        waited += Duration::from_millis(20);
    }
    cancel.cancel();
    assert_eq!(running.await.unwrap(), Err(PullError::Cancelled));

    let report = receiver.pull(&source.order(), &PullLimits::default()).await.unwrap();
    assert!(report.kept >= CHUNK_BYTES, "{report:?}");
    assert!(receiver.copy().join(MARKER).exists());
}

#[tokio::test]
async fn a_holders_copy_that_lost_a_file_is_not_served() {
    let source = Source::new().await;
    std::fs::remove_file(source.copy().join("meta/labels.txt")).unwrap();
    let (sizes, mut measurer) =
        (crate::agent::sizes::Sizes::default(), crate::agent::sizes::Measurer::default());
    measurer.pass(source.dir.path(), &sizes, 1_000);
    keep::pass(&source.manifests, source.dir.path(), &sizes, &CancellationToken::new());
    let receiver = Receiver::new();
    let err = receiver.pull(&source.order(), &PullLimits::default()).await.unwrap_err();
    match err {
        PullError::Refused { status: 409, message } => {
            assert!(message.contains("lost 1 file since it was filled"), "{message}")
        }
        other => panic!("{other}"),
    }
    assert!(!receiver.copy().exists());
}

#[tokio::test]
async fn a_token_for_another_folder_drive_or_machine_is_refused_and_nothing_is_written() {
    let source = Source::new().await;
    let receiver = Receiver::new();
    let (folder, drive, machine) = (Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7());
    let forbidden = [
        ("folder", source.order_with(|c| c.folder = format!("default.{}", folder.simple()))),
        ("drive", source.order_with(|c| c.drive = drive)),
        ("machine", source.order_with(|c| c.source = machine)),
    ];
    for (what, order) in forbidden {
        let err = receiver.pull(&order, &PullLimits::default()).await.unwrap_err();
        assert!(matches!(err, PullError::Refused { status: 403, .. }), "another {what}: {err}");
    }
    let other_digest = Digest::parse(&"0".repeat(64)).unwrap().to_string();
    let err = receiver.pull(&source.order_with(|c| c.manifest = other_digest), &PullLimits::default()).await;
    assert!(matches!(err, Err(PullError::Refused { status: 409, .. })), "{err:?}");
    let expired = source.order_with(|c| c.exp = chrono::Utc::now().timestamp() - 60);
    let err = receiver.pull(&expired, &PullLimits::default()).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "the peer refused (401): the transfer token is not valid: the token has expired"
    );
    assert!(receiver.drives().is_empty(), "{:?}", receiver.drives());
}

#[tokio::test]
async fn only_files_the_manifest_lists_are_served_and_from_where_asked() {
    let source = Source::new().await;
    let token = source.token_with(|_| {});
    let files = format!("/v1/copies/{FOLDER}/files");
    for path in ["etc/passwd", "..%2F..%2F..%2Fetc%2Fpasswd", "val", COPY_ID, MARKER, "train"] {
        let response = source.get(&format!("{files}/{path}"), Some(&token), None).await;
        assert_eq!(response.status(), 404, "{path}");
    }
    let whole = source.get(&format!("{files}/train/00012.parquet"), Some(&token), None).await;
    assert_eq!(whole.status(), 200);
    assert_eq!(whole.bytes().await.unwrap().len(), 1000);
    let rest = source.get(&format!("{files}/meta/labels.txt"), Some(&token), Some("bytes=6-")).await;
    assert_eq!(rest.status(), 206);
    assert_eq!(rest.headers()["content-range"], "bytes 6-24/25");
    assert_eq!(rest.text().await.unwrap(), "pie\nbaby_back_ribs\n");
    let past = source.get(&format!("{files}/meta/labels.txt"), Some(&token), Some("bytes=25-")).await;
    assert_eq!(past.status(), 416);

    assert_eq!(source.get(&format!("{files}/empty.bin"), None, None).await.status(), 401);
    assert_eq!(source.get(&format!("{files}/empty.bin"), Some("not-a-token"), None).await.status(), 401);
    // A token of another server's keys.
    let foreign = mint_transfer(
        &Keys::from_pem(&Keys::generate_pem().unwrap()).unwrap(),
        &TransferClaims::new(
            source.machine,
            Uuid::now_v7(),
            source.drive,
            FOLDER,
            &source.digest.to_string(),
            chrono::Utc::now(),
        ),
    );
    assert_eq!(source.get(&format!("{files}/empty.bin"), Some(&foreign), None).await.status(), 401);

    // A copy that lost its marker is not served, though its manifest is still known.
    std::fs::remove_file(source.copy().join(MARKER)).unwrap();
    let response = source.get(&format!("/v1/copies/{FOLDER}/manifest"), Some(&token), None).await;
    assert_eq!(response.status(), 409);
}

#[tokio::test]
async fn uploads_past_the_limit_are_told_to_come_back() {
    let source = Source::start(ServeLimits { uploads: 1 }).await;
    let token = source.token_with(|_| {});
    let big = format!("/v1/copies/{FOLDER}/files/{BIG}");
    // Headers read, body not: the upload holds its slot.
    let first = source.get(&big, Some(&token), None).await;
    assert_eq!(first.status(), 200);
    let second = source.get(&big, Some(&token), None).await;
    assert_eq!(second.status(), 503);
    assert_eq!(second.headers()["retry-after"], "5");
    let busy = Receiver::new().pull(&source.order(), &PullLimits::default()).await.unwrap_err();
    assert_eq!(busy, PullError::Busy { retry_after: Duration::from_secs(5) });
    assert!(busy.retryable());

    // The slot is free once the first receiver goes.
    drop(first);
    let mut waited = Duration::ZERO;
    while source.get(&big, Some(&token), None).await.status() == 503 {
        assert!(waited < Duration::from_secs(10), "the slot is never given back");
        tokio::time::sleep(Duration::from_millis(50)).await;
        waited += Duration::from_millis(50);
    }
}

#[tokio::test]
async fn a_pull_that_does_not_fit_is_refused_before_it_starts() {
    let source = Source::new().await;
    let receiver = Receiver::new();
    let limits = PullLimits { reserve_bytes: u64::MAX / 2, ..PullLimits::default() };
    let err = receiver.pull(&source.order(), &limits).await.unwrap_err();
    assert!(matches!(err, PullError::NoRoom { needed, .. } if needed == BIG_BYTES as u64 + 1025), "{err}");
    assert!(
        err.to_string()
            .starts_with("peer copy of default.food101 needs 21.0 MB at this machine's data location"),
        "{err}"
    );
}

#[tokio::test]
async fn a_pull_over_https_from_a_holder_a_trusted_ca_signed_makes_the_whole_copy() {
    let ca = Ca::new("cluster data ports");
    let source = Source::start_tls(&ca.issue(&["127.0.0.1"]), &ca).await;
    assert!(source.url.starts_with("https://127.0.0.1:"), "{}", source.url);
    let receiver = Receiver::new();
    let limits = PullLimits { trust: trusting(&ca), ..PullLimits::default() };
    let report = receiver.pull(&source.order(), &limits).await.unwrap();
    assert_eq!(report, PullReport { received: BIG_BYTES as u64 + 1000 + 25, kept: 0, files: 4 });
    let manifest = stored_manifest(receiver.dir.path(), &source.digest);
    assert!(manifest::check(&receiver.copy(), &manifest).unwrap().is_clear());
    assert!(receiver.copy().join(MARKER).exists());
    assert_eq!(receiver.drives(), [keep::FOLDER, FOLDER]);

    // Over TLS as over plain HTTP: a token is needed, and a range is served from where asked.
    let token = source.token_with(|_| {});
    let labels = format!("/v1/copies/{FOLDER}/files/meta/labels.txt");
    assert_eq!(source.get(&labels, None, None).await.status(), 401);
    let rest = source.get(&labels, Some(&token), Some("bytes=6-")).await;
    assert_eq!(rest.status(), 206);
    assert_eq!(rest.text().await.unwrap(), "pie\nbaby_back_ribs\n");
}

#[tokio::test]
async fn a_pull_from_a_holder_whose_certificate_another_ca_signed_is_refused_naming_its_address() {
    let (ours, theirs) = (Ca::new("ours"), Ca::new("theirs"));
    let source = Source::start_tls(&theirs.issue(&["127.0.0.1"]), &theirs).await;
    // Signed by the CA trusted, but for another address than the one pulled from.
    let elsewhere = Source::start_tls(&ours.issue(&["127.0.0.2", "localhost"]), &ours).await;
    let receiver = Receiver::new();
    let cases = [
        (&source, trusting(&ours), "invalid peer certificate: UnknownIssuer"),
        // The system's roots know neither CA.
        (&source, Trust::System, "invalid peer certificate: UnknownIssuer"),
        (&elsewhere, trusting(&ours), "invalid peer certificate: certificate not valid for name"),
    ];
    for (holder, trust, why) in cases {
        let limits = PullLimits { trust, ..PullLimits::default() };
        let err = receiver.pull(&holder.order(), &limits).await.unwrap_err();
        assert!(matches!(&err, PullError::Tls { address, .. } if *address == holder.url), "{err:?}");
        let expected = format!("cannot pull over TLS from the peer at {}: {why}", holder.url);
        assert!(err.to_string().starts_with(&expected), "{err}");
        assert!(!err.retryable());
    }
    // Nothing was written: no copy, no folder being received, no manifest.
    assert!(receiver.drives().is_empty(), "{:?}", receiver.drives());
    assert_eq!(receiver.manifests.digest(FOLDER, Some(source.drive)), None);
}

#[tokio::test]
async fn a_data_port_over_tls_answers_past_a_peer_that_never_shakes_hands_and_stops_when_told() {
    let ca = Ca::new("cluster data ports");
    let (cert, key) = ca.issue(&["127.0.0.1"]);
    let path = Path::new("data.pem");
    let config = tls::server(
        &tls::PemFile { flag: tls::CERT_FLAG, path, bytes: cert.into_bytes() },
        &tls::PemFile { flag: tls::KEY_FLAG, path, bytes: key.into_bytes() },
        None,
    )
    .unwrap();
    let public = Keys::from_pem(&Keys::generate_pem().unwrap()).unwrap().public();
    let limits = ServeLimits { uploads: 4 };
    let holder = Holder::new(
        Uuid::now_v7(),
        Arc::default(),
        Arc::default(),
        Arc::new(TrustedKeys::fixed(public)),
        &limits,
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    let serving =
        tokio::spawn(serve::serve(listener, Some(Arc::new(config)), Arc::new(holder), stop.clone()));

    let _silent = tokio::net::TcpStream::connect(addr).await.unwrap();
    let trusted = trusting(&ca).client_config();
    let client = reqwest::Client::builder()
        .use_preconfigured_tls(rustls::ClientConfig::clone(&trusted))
        .build()
        .unwrap();
    let url = format!("{}/v1/copies/{FOLDER}/manifest", serve::address(addr, true));
    let answer = tokio::time::timeout(Duration::from_secs(5), client.get(&url).send()).await;
    assert_eq!(answer.expect("answered at once").unwrap().status(), 401);

    stop.cancel();
    let stopped = tokio::time::timeout(Duration::from_secs(5), serving).await;
    stopped.expect("the port stops").unwrap().unwrap();
    assert!(client.get(&url).send().await.is_err(), "the port is closed");
}

/// What the server is told of a fill, and the fresh transfer tokens it hands out.
#[derive(Clone, Default)]
struct Told {
    reports: Arc<std::sync::Mutex<Vec<crate::protocol::StatusReport>>>,
    fresh: Arc<std::sync::Mutex<Vec<String>>>,
    asked: Arc<AtomicI64>,
}

/// A stand-in for the server's agent API: the status reports and fresh transfer tokens of
/// fills, over real HTTP on loopback.
async fn server(told: Told) -> crate::agent::client::Client {
    use axum::routing::post;
    let router = axum::Router::new()
        .route(
            "/agent/v1/workers/{id}/status",
            post(
                |axum::extract::State(told): axum::extract::State<Told>,
                 axum::Json(r): axum::Json<crate::protocol::StatusReport>| async move {
                    told.reports.lock().unwrap().push(r);
                    axum::Json(serde_json::json!({"accepted": true}))
                },
            ),
        )
        .route(
            "/agent/v1/workers/{id}/transfer-token",
            post(|axum::extract::State(told): axum::extract::State<Told>| async move {
                told.asked.fetch_add(1, Ordering::SeqCst);
                let token = told.fresh.lock().unwrap().pop().unwrap_or_default();
                axum::Json(serde_json::json!({"token": token}))
            }),
        )
        .with_state(told);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    crate::agent::client::Client::new(&url).unwrap()
}

/// The fill of `source`'s drive on another machine, from `source` with `token`.
fn fill_assignment(source: &Source, token: String) -> crate::protocol::Assignment {
    use crate::protocol::{Assignment, Limits, MountSource, MountSpec, PeerSource};
    Assignment {
        uid: Uuid::now_v7(),
        name: "fill-food101-gpu-02-0".into(),
        run: "fill-food101-gpu-02".into(),
        namespace: "default".into(),
        state: crate::domain::run::WorkerState::Pending,
        image: "docker.io/library/busybox:1.36".into(),
        command: String::new(),
        args: vec![],
        env: Default::default(),
        time_limit_seconds: None,
        mounts: vec![MountSpec {
            drive: "food101".into(),
            source: MountSource::Copy { folder: FOLDER.into(), drive_id: source.drive },
            sub_path: String::new(),
            target: "/drive".into(),
            read_only: false,
        }],
        resources: Limits { cpu_cores: 1.0, memory_bytes: 1 << 30, gpus: 0 },
        id_slot: 1,
        fill: true,
        image_pull_auth: None,
        peer: Some(PeerSource {
            address: source.url.clone(),
            machine: "gpu-01".into(),
            manifest: source.digest.to_string(),
            token,
        }),
    }
}

/// Runs the fill `a` on `receiver` as the assignment loop does: held, then run.
async fn run_fill(
    receiver: &Receiver,
    client: &crate::agent::client::Client,
    a: &crate::protocol::Assignment,
    limits: &PullLimits,
) -> manifest::keep::Hold {
    let hold = receiver.manifests.hold(Some(receiver.dir.path()), a);
    let fill = fill::Fill { client, manifests: &receiver.manifests, relays: &receiver.relays, limits };
    let peer = a.peer.clone().unwrap();
    fill.run(a, &peer, Some(receiver.dir.path().to_path_buf()), CancellationToken::new()).await;
    hold
}

#[tokio::test]
async fn a_fill_from_a_peer_with_an_expired_token_gets_a_fresh_one_and_completes_with_a_whole_copy() {
    let source = Source::new().await;
    let receiver = Receiver::new();
    let told = Told::default();
    told.fresh.lock().unwrap().push(source.token_with(|_| {}));
    let client = server(told.clone()).await;
    let expired = source.token_with(|c| c.exp = chrono::Utc::now().timestamp() - 60);
    let a = fill_assignment(&source, expired);

    let hold = run_fill(&receiver, &client, &a, &PullLimits::default()).await;
    let states: Vec<_> = told.reports.lock().unwrap().iter().map(|r| (r.state, r.reason.clone())).collect();
    use crate::domain::run::WorkerState::{Completed, Running};
    assert_eq!(states, [(Running, String::new()), (Completed, String::new())]);
    assert_eq!(told.asked.load(Ordering::SeqCst), 1, "one fresh token");
    let manifest = stored_manifest(receiver.dir.path(), &source.digest);
    assert!(manifest::check(&receiver.copy(), &manifest).unwrap().is_clear());
    assert!(receiver.copy().join(MARKER).exists());
    // The manifest the pull adopted outlives the fill's own hold and the passes made meanwhile.
    receiver.manifests.settle();
    keep::pass(&receiver.manifests, receiver.dir.path(), &Default::default(), &CancellationToken::new());
    assert_eq!(receiver.manifests.digest(FOLDER, Some(source.drive)), Some(source.digest));
    drop(hold);
    keep::pass(&receiver.manifests, receiver.dir.path(), &Default::default(), &CancellationToken::new());
    assert_eq!(receiver.manifests.digest(FOLDER, Some(source.drive)), Some(source.digest));
    let heartbeat = disk::report(receiver.dir.path(), &Default::default(), &receiver.manifests);
    assert_eq!(heartbeat.copies[0].manifest, Some(source.digest.to_string()));
}

#[tokio::test]
async fn a_fill_from_a_peer_whose_copy_differs_fails_naming_the_path() {
    let source = Source::new().await;
    let path = source.copy().join("meta/labels.txt");
    std::fs::write(&path, "apple_pie\nbaby_back_ribz\n").unwrap();
    let receiver = Receiver::new();
    let told = Told::default();
    let client = server(told.clone()).await;
    let a = fill_assignment(&source, source.token_with(|_| {}));

    drop(run_fill(&receiver, &client, &a, &PullLimits::default()).await);
    let states: Vec<_> = told.reports.lock().unwrap().iter().map(|r| (r.state, r.reason.clone())).collect();
    use crate::domain::run::WorkerState::{Failed, Running};
    let why = "peer copy of default.food101 differs from its manifest at meta/labels.txt";
    assert_eq!(states, [(Running, String::new()), (Failed, why.to_owned())]);
    assert!(!receiver.copy().exists());
    assert_eq!(told.asked.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_fill_from_a_peer_refused_its_token_again_fails_with_the_refusal() {
    let source = Source::new().await;
    let receiver = Receiver::new();
    let told = Told::default();
    let client = server(told.clone()).await;
    // Every token the server hands out is for another machine's copy.
    let other = source.order_with(|c| c.source = Uuid::now_v7()).token;
    let a = fill_assignment(&source, other);
    let reports = run_fill(&receiver, &client, &a, &PullLimits::default()).await;
    drop(reports);
    let last = told.reports.lock().unwrap().last().map(|r| (r.state, r.reason.clone())).unwrap();
    assert_eq!(last.0, crate::domain::run::WorkerState::Failed);
    assert!(last.1.starts_with("the peer refused (403): the transfer token is for machine"), "{}", last.1);
    assert_eq!(told.asked.load(Ordering::SeqCst), 0, "only a 401 asks for a fresh token");
}

#[tokio::test]
async fn a_peer_fill_resumes_after_a_cut_and_waits_out_a_busy_holder() {
    let source = Source::start(ServeLimits { uploads: 1 }).await;
    let receiver = Receiver::new();
    let client = server(Told::default()).await;
    let limits = PullLimits::default();
    let fill = fill::Fill {
        client: &client,
        manifests: &receiver.manifests,
        relays: &receiver.relays,
        limits: &limits,
    };
    let a = fill_assignment(&source, source.token_with(|_| {}));
    let order = fill::order(&a, a.peer.as_ref().unwrap()).unwrap();

    // The connection drops after 12 MiB; once it has, the holder sends again.
    source.budget.store(12 << 20, Ordering::SeqCst);
    let budget = source.budget.clone();
    tokio::spawn(async move {
        while budget.load(Ordering::SeqCst) > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        budget.store(i64::MAX, Ordering::SeqCst);
    });
    let report =
        fill.pull(a.uid, order.clone(), receiver.dir.path(), None, &CancellationToken::new()).await.unwrap();
    assert!(report.kept >= CHUNK_BYTES, "the retry resumed: {report:?}");
    assert!(receiver.copy().join(MARKER).exists());

    // Another receiver while the holder's one slot is taken, then given back.
    let other = Receiver::new();
    let fill =
        fill::Fill { client: &client, manifests: &other.manifests, relays: &other.relays, limits: &limits };
    let taken = source.get(&format!("/v1/copies/{FOLDER}/files/{BIG}"), Some(&order.token), None).await;
    assert_eq!(taken.status(), 200);
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        drop(taken);
    });
    let started = std::time::Instant::now();
    fill.pull(a.uid, order, other.dir.path(), None, &CancellationToken::new()).await.unwrap();
    assert!(started.elapsed() >= Duration::from_secs(5), "waited the holder's Retry-After");
    assert!(other.copy().join(MARKER).exists());
}

#[tokio::test]
async fn a_fill_from_a_holder_whose_certificate_is_refused_fails_at_once_naming_its_address() {
    let (ours, theirs) = (Ca::new("ours"), Ca::new("theirs"));
    let source = Source::start_tls(&theirs.issue(&["127.0.0.1"]), &theirs).await;
    let receiver = Receiver::new();
    let told = Told::default();
    let client = server(told.clone()).await;
    let a = fill_assignment(&source, source.token_with(|_| {}));
    let limits = PullLimits { trust: trusting(&ours), ..PullLimits::default() };

    let started = std::time::Instant::now();
    drop(run_fill(&receiver, &client, &a, &limits).await);
    // A failed connection is tried again after 2 s: a refused certificate is not.
    assert!(started.elapsed() < Duration::from_secs(2), "tried again: {:?}", started.elapsed());
    let states: Vec<_> = told.reports.lock().unwrap().iter().map(|r| (r.state, r.reason.clone())).collect();
    use crate::domain::run::WorkerState::{Failed, Running};
    assert_eq!(states.len(), 2, "{states:?}");
    assert_eq!(states[0], (Running, String::new()));
    assert_eq!(states[1].0, Failed);
    let why = format!(
        "cannot pull over TLS from the peer at {}: invalid peer certificate: UnknownIssuer",
        source.url
    );
    assert_eq!(states[1].1, why);
    assert!(!receiver.copy().exists());
}

/// A machine receiving `source`'s copy at 4 MiB/s, entered as a relay, serving on a port of
/// its own; the pull, the relay's address and machine id, and the relay.
async fn relaying(
    source: &Source,
    cancel: &CancellationToken,
) -> (tokio::task::JoinHandle<Result<PullReport, PullError>>, String, Uuid, Arc<Receiver>) {
    let relay = Arc::new(Receiver::new());
    let (url, machine) = relay.serve(source).await;
    let slow =
        PullLimits { rate: Rate::new(std::num::NonZeroU64::new(4 << 20).unwrap()), ..PullLimits::default() };
    let entered = relay.relays.enter(FOLDER, source.drive, source.digest);
    let receiving = tokio::spawn({
        let (order, relay, cancel) = (source.order(), relay.clone(), cancel.clone());
        async move {
            let pulled =
                pull(&order, relay.dir.path(), &relay.manifests, &slow, Some(&entered), &cancel).await;
            drop(entered);
            pulled
        }
    });
    (receiving, url, machine, relay)
}

/// Waits until `receiver` holds at least `bytes` of `path` in the copy it is receiving.
async fn until_staged(receiver: &Receiver, path: &str, bytes: u64) {
    let mut waited = Duration::ZERO;
    while receiver.staged_bytes(path) < bytes {
        assert!(waited < Duration::from_secs(30), "{path}: {} bytes", receiver.staged_bytes(path));
        tokio::time::sleep(Duration::from_millis(10)).await;
        waited += Duration::from_millis(10);
    }
}

#[tokio::test]
async fn a_copy_being_received_passes_what_it_checked_on_to_the_next_machine_before_it_is_whole() {
    let source = Source::new().await;
    let cancel = CancellationToken::new();
    let (receiving, url, machine, relay) = relaying(&source, &cancel).await;
    let next = Arc::new(Receiver::new());
    let order = Order { source: url, ..source.order_with(|c| c.source = machine) };
    let pulling = tokio::spawn({
        let (next, order) = (next.clone(), order.clone());
        async move { next.pull(&order, &PullLimits::default()).await }
    });

    // The next machine has the first chunk of the large file while the relay, at 4 MiB/s, is
    // still receiving the rest.
    until_staged(&next, BIG, CHUNK_BYTES).await;
    assert!(!receiving.is_finished(), "the relay is still receiving");
    assert!(!relay.copy().join(MARKER).exists());
    assert!(relay.staged_bytes(BIG) < BIG_BYTES as u64);

    let report = pulling.await.unwrap().unwrap();
    receiving.await.unwrap().unwrap();
    assert_eq!(report.received, BIG_BYTES as u64 + 1000 + 25);
    let manifest = stored_manifest(next.dir.path(), &source.digest);
    assert!(manifest::check(&next.copy(), &manifest).unwrap().is_clear());
    assert!(next.copy().join(MARKER).exists());
    // Once whole, the relay serves its copy as any holder does.
    let again = Receiver::new();
    assert_eq!(again.pull(&order, &PullLimits::default()).await.unwrap().received, report.received);
}

#[tokio::test]
async fn a_relay_whose_pull_stops_cuts_what_it_serves_and_serves_only_its_drive_and_manifest() {
    let source = Source::new().await;
    let cancel = CancellationToken::new();
    let (receiving, url, machine, relay) = relaying(&source, &cancel).await;
    let order = Order { source: url, ..source.order_with(|c| c.source = machine) };

    let other_drive = Order {
        source: order.source.clone(),
        ..source.order_with(|c| {
            c.source = machine;
            c.drive = Uuid::now_v7();
        })
    };
    let err = Receiver::new().pull(&other_drive, &PullLimits::default()).await.unwrap_err();
    assert!(matches!(err, PullError::Refused { status: 403, .. }), "{err}");
    let digest = "0".repeat(64);
    let other_manifest = Order {
        source: order.source.clone(),
        ..source.order_with(|c| {
            c.source = machine;
            c.manifest = digest.clone();
        })
    };
    let err = Receiver::new().pull(&other_manifest, &PullLimits::default()).await.unwrap_err();
    assert!(matches!(err, PullError::Refused { status: 409, .. }), "{err}");

    let next = Arc::new(Receiver::new());
    let pulling = tokio::spawn({
        let next = next.clone();
        async move { next.pull(&order, &PullLimits::default()).await }
    });
    until_staged(&next, BIG, CHUNK_BYTES).await;
    cancel.cancel();
    assert_eq!(receiving.await.unwrap(), Err(PullError::Cancelled));
    let err = pulling.await.unwrap().unwrap_err();
    assert!(matches!(err, PullError::Transfer(_)), "the answer is cut: {err}");
    assert!(!next.copy().exists());
    assert!(next.staged_bytes(BIG) < BIG_BYTES as u64);
    assert!(relay.relays.get(FOLDER).is_none());
}
