//! Running one assigned worker: pull its image, bind its drives, run it as a container of its
//! own, ship its output, and report how it ended.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::client::Client;
use super::container::{self, Bind, Container};
use super::output::{self, LogLine, Stream};
use super::podman::{Found, State};
use super::{Machine, cgroup, disk, gpus, mounts};
use crate::domain::image::ImageRef;
use crate::domain::path::AbsPath;
use crate::domain::quantity::binary_bytes;
use crate::domain::run::WorkerState;
use crate::domain::task::Mode;
use crate::protocol::{Assignment, EventReport, LogLineIn, MountSource, StatusReport};

/// Lines sent in one upload, and the longest a line waits to be sent.
const BATCH: usize = 500;
/// Bytes of JSON one upload carries at most: half the server's body limit, so that no upload is
/// refused and its lines lost, whatever the lines hold.
const BATCH_BYTES: usize = crate::api::BODY_LIMIT / 2;
const FLUSH: Duration = Duration::from_millis(100);
/// Pulls tried before the worker fails, the first retry after `PULL_BACKOFF`, doubling.
const PULL_ATTEMPTS: u32 = 3;
const PULL_BACKOFF: Duration = Duration::from_secs(2);
/// How long the log file's reader may take to finish once the container is gone.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// catatonit, the container's pid 1, exits 128 + N for a worker killed by signal N.
const SIGKILL_EXIT: i32 = 128 + 9;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Exited(i32),
    Signalled(i32),
    OomKilled(u64),
    TimedOut(Duration),
    Stopped,
}

impl Outcome {
    /// Human words for events and the console.
    pub fn reason(&self) -> String {
        match self {
            Outcome::Exited(code) => format!("exited with code {code}"),
            Outcome::Signalled(signal) => format!("killed by signal {signal}"),
            Outcome::OomKilled(limit) => format!("OOMKilled: used more than its {}", binary_bytes(*limit)),
            Outcome::TimedOut(limit) => format!("exceeded its time limit of {}s", limit.as_secs_f64()),
            Outcome::Stopped => "stopped".to_string(),
        }
    }
}

pub async fn run(
    client: &Client,
    machine: &Machine,
    a: Assignment,
    data_location: Option<PathBuf>,
    adopted: Option<Found>,
    stop: CancellationToken,
) {
    if let Some(found) = adopted {
        if machine.podman.state(&found.id).await == Ok(State::Created) {
            // Made but never started: the agent stopped in between. Start over.
            cleanup(machine, a.uid, Some(&found.id), &[]).await;
        } else {
            tracing::info!(worker = %a.name, container = %found.id, "the agent restarted: following the worker's container again");
            machine.gpus.claim(&found.gpus);
            let outcome = follow(client, machine, &a, &found.id, true, stop).await;
            finish(client, machine, &a, &found.id, &found.gpus, outcome).await;
            return;
        }
    }
    // The server saw it start, but its container is gone: it cannot be followed again.
    let resumed = a.state == WorkerState::Running;
    if resumed && !a.fill {
        fail(client, &a, "the agent restarted while the worker ran, and its container is gone").await;
        return;
    }
    if resumed {
        tracing::info!(worker = %a.name, "the agent restarted during this fill: filling again");
    }
    let image = match ImageRef::parse(&a.image) {
        Ok(image) => image,
        Err(why) => return fail(client, &a, &format!("image {why}")).await,
    };
    // Kept from the pull until the worker ends: before its container exists, podman counts no
    // use of the image, and a short disk would have it removed.
    let _held = machine.images.hold(&image.to_string());
    if let Err(why) = pull(client, machine, &a, &image, &stop).await {
        if !stop.is_cancelled() {
            fail(client, &a, &why).await;
        }
        return;
    }
    let Some(gpus) = machine.gpus.take(a.resources.gpus) else {
        let why = format!("{} GPUs asked for, but fewer are free on this machine", a.resources.gpus);
        return fail(client, &a, &why).await;
    };
    // Read once: the container gets the devices and the worker's event says so.
    let cdi = !gpus.is_empty() && gpus::cdi_has_kind(&machine.podman.config().gpu_kind);
    let id = match create(machine, &a, data_location.as_deref(), &image, &gpus, cdi).await {
        Ok(id) => id,
        Err(why) => {
            cleanup(machine, a.uid, None, &gpus).await;
            return fail(client, &a, &why).await;
        }
    };
    if !resumed && !report_started(client, machine, &a, &image, &gpus, cdi).await {
        cleanup(machine, a.uid, Some(&id), &gpus).await;
        return;
    }
    if let Err(why) = machine.podman.start(&id).await {
        cleanup(machine, a.uid, Some(&id), &gpus).await;
        return fail(client, &a, &format!("cannot start its container: {why}")).await;
    }
    tracing::info!(worker = %a.name, container = %id, "started");
    let outcome = follow(client, machine, &a, &id, false, stop).await;
    finish(client, machine, &a, &id, &gpus, outcome).await;
}

/// Pulls the image unless this machine holds it (a floating tag such as `latest` is pulled
/// every time). Retries with backoff; the worker says `Pulling image …` meanwhile.
async fn pull(
    client: &Client,
    machine: &Machine,
    a: &Assignment,
    image: &ImageRef,
    stop: &CancellationToken,
) -> Result<(), String> {
    let full = image.to_string();
    if !image.is_floating() && machine.podman.has_image(&full).await {
        return Ok(());
    }
    report_preparing(client, a, &format!("Pulling image {}", a.image)).await;
    // Only podman reads the registry's credentials, and only while it pulls.
    let auth = match &a.image_pull_auth {
        Some(text) => Some(RemovedOnDrop(
            write_private(&machine.state, AUTH_DIR, &auth_file_name(a.uid), text)
                .map_err(|why| format!("cannot pull image {}: {why}", a.image))?,
        )),
        None => None,
    };
    let auth = auth.as_ref().map(|f| f.0.as_path());
    let mut delay = PULL_BACKOFF;
    for attempt in 1..=PULL_ATTEMPTS {
        let why = tokio::select! {
            _ = stop.cancelled() => return Err("stopped".into()),
            r = machine.podman.pull(&full, auth) => match r {
                Ok(()) => {
                    machine.images.changed();
                    return Ok(());
                }
                Err(why) => why,
            },
        };
        if attempt == PULL_ATTEMPTS {
            return Err(format!("cannot pull image {}: {why}", a.image));
        }
        tracing::warn!(worker = %a.name, image = %full, attempt, error = %why, "cannot pull the image; retrying");
        tokio::select! {
            _ = stop.cancelled() => return Err("stopped".into()),
            _ = tokio::time::sleep(delay) => {}
        }
        delay *= 2;
    }
    unreachable!("the last attempt returns")
}

/// Binds the drives, writes the environment file and creates the container; its id.
async fn create(
    machine: &Machine,
    a: &Assignment,
    data_location: Option<&Path>,
    image: &ImageRef,
    gpus: &[u32],
    cdi: bool,
) -> Result<String, String> {
    let id_base = container::id_base(a.id_slot)?;
    let binds = binds(machine, a, data_location, id_base)?;
    let env: Vec<(String, String)> = a.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    let (text, inherited) = container::env_file_text(&env);
    let env_file = write_private(&machine.state, ENV_DIR, &a.uid.to_string(), &text)?;
    let logs = machine.state.join("logs");
    std::fs::create_dir_all(&logs).map_err(|e| format!("cannot create {}: {e}", logs.display()))?;
    let devices = if cdi {
        gpus.iter().map(|i| format!("{}={i}", machine.podman.config().gpu_kind)).collect()
    } else {
        vec![]
    };
    let (nofile, nproc) = machine.ulimits;
    let spec = Container {
        worker: a.uid,
        hostname: a.name.clone(),
        home: machine.home(),
        image: image.to_string(),
        command: a.command.clone(),
        args: a.args.clone(),
        env_file: Some(env_file.clone()),
        env_inherited: inherited.iter().map(|(name, _)| name.clone()).collect(),
        binds,
        log_file: log_file(&machine.state, a.uid),
        limits: a.resources,
        id_base,
        cgroup_parent: cgroup::parent(a.uid),
        gpus: gpus.to_vec(),
        devices,
        capabilities: machine.podman.config().capabilities.clone(),
        nofile,
        nproc,
        stop_grace_seconds: machine.podman.config().stop_grace.as_secs(),
    };
    machine.images.used(&spec.image);
    let created = machine.podman.create(container::create_args(&spec), &inherited).await;
    // The values now live in the container's configuration, which only root can read.
    let _ = std::fs::remove_file(&env_file);
    created.map_err(|why| format!("cannot create its container: {why}"))
}

/// Each drive's folder, resolved without following symlinks and bound where podman reads it.
fn binds(
    machine: &Machine,
    a: &Assignment,
    data_location: Option<&Path>,
    id_base: u32,
) -> Result<Vec<Bind>, String> {
    let dir = mounts::worker_dir(&machine.state, a.uid);
    a.mounts
        .iter()
        .enumerate()
        .map(|(n, m)| {
            let cannot = |e: String| format!("cannot mount drive {} at {}: {e}", m.drive, m.target);
            let (resolved, read_only) = match &m.source {
                MountSource::Copy { folder, drive_id } => {
                    let dir = data_location.ok_or("this machine has no confirmed data location")?;
                    let root = if !m.read_only && m.sub_path.is_empty() {
                        // A fill writes into a folder made for this very drive, never an old one,
                        // which is not whole until the fill writes the marker again (a copy that
                        // lost files is filled again with its old marker there).
                        let root = disk::fill_folder(dir, folder, *drive_id, id_base).map_err(cannot)?;
                        if a.fill {
                            disk::unmark(dir, folder).map_err(cannot)?;
                        }
                        root
                    } else if disk::holds(dir, folder, *drive_id) {
                        dir.join("drives").join(folder)
                    } else {
                        return Err(cannot(format!("the copy in drives/{folder} is not this drive's")));
                    };
                    (mounts::open_sub_path(&root, &m.sub_path).map_err(cannot)?, m.read_only)
                }
                MountSource::Host { path, grant, grant_mode } => {
                    let rel = beneath_grant(path, grant.as_deref()).map_err(cannot)?;
                    let rel = [rel.as_str(), m.sub_path.as_str()]
                        .into_iter()
                        .filter(|s| !s.is_empty())
                        .collect::<Vec<_>>()
                        .join("/");
                    let grant = Path::new(grant.as_deref().unwrap_or_default());
                    let resolved =
                        mounts::open_beneath(grant, &rel).map_err(|e| cannot(format!("{path}: {e}")))?;
                    (resolved, read_only_under(m.read_only, *grant_mode))
                }
            };
            let source = mounts::stage(&dir, n, &resolved)?;
            Ok(Bind { source, target: m.target.clone(), read_only })
        })
        .collect()
}

/// A host path is mounted read-write only when the mount asks for it and its grant allows it.
fn read_only_under(asked_read_only: bool, grant_mode: Mode) -> bool {
    asked_read_only || grant_mode == Mode::ReadOnly
}

/// `path` relative to the granted folder `grant`, which must cover it by whole components.
fn beneath_grant(path: &str, grant: Option<&str>) -> Result<String, String> {
    let grant = grant.ok_or_else(|| format!("{path} is not under a host path granted to its workspace"))?;
    let (Ok(p), Ok(g)) = (AbsPath::parse(path), AbsPath::parse(grant)) else {
        return Err(format!("{path} or its grant {grant} is not a plain absolute path"));
    };
    if !p.is_within(&g) {
        return Err(format!("{path} is not under its grant {grant}"));
    }
    Ok(crate::domain::grant::beneath(&p, &g))
}

/// `<state>/logs/<worker>.log`: the container's output, as conmon writes it.
fn log_file(state: &Path, worker: uuid::Uuid) -> PathBuf {
    state.join("logs").join(format!("{worker}.log"))
}

/// Where the agent writes each worker's variables, secrets included, for podman:
/// `<state>/env/<worker>`.
const ENV_DIR: &str = "env";
/// Where the agent writes a worker's registry auth file while its image is pulled:
/// `<state>/auth/<worker>.json`.
const AUTH_DIR: &str = "auth";

fn auth_file_name(worker: uuid::Uuid) -> String {
    format!("{worker}.json")
}

/// `<state>/<folder>/<name>`, mode 0600 in a folder of mode 0700: what only the agent and the
/// podman it runs may read.
fn write_private(state: &Path, folder: &str, name: &str, text: &str) -> Result<PathBuf, String> {
    let dir = state.join(folder);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .and_then(|()| std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)))
        .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let path = dir.join(name);
    let _ = std::fs::remove_file(&path);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    file.write_all(text.as_bytes()).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(path)
}

/// A file removed however its holder ends, a stop included.
struct RemovedOnDrop(PathBuf);

impl Drop for RemovedOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Ships the container's output until it ends, its time limit passes, or `stop`.
async fn follow(
    client: &Client,
    machine: &Machine,
    a: &Assignment,
    id: &str,
    adopted: bool,
    stop: CancellationToken,
) -> Outcome {
    let (tx, rx) = mpsc::channel(4 * BATCH);
    let shipper = tokio::spawn(ship_logs(client.clone(), a.uid, rx));
    // A restarted agent ships what is written from now on: earlier lines went with its last life.
    let ended = CancellationToken::new();
    let reader = tokio::spawn({
        let (path, ended) = (log_file(&machine.state, a.uid), ended.clone());
        async move { output::follow_file(&path, adopted, tx, ended).await }
    });
    let readers = Readers { ended, reader };
    let limit = async {
        match a.time_limit_seconds {
            Some(s) => tokio::time::sleep(Duration::from_secs(s)).await,
            None => std::future::pending().await,
        }
    };
    let ended = tokio::select! {
        biased;
        code = machine.podman.wait(id) => match code {
            Ok(code) => Some(code),
            Err(why) => {
                tracing::warn!(worker = %a.name, error = %why, "cannot wait for the container");
                Some(-1)
            }
        },
        () = stop.cancelled() => None,
        () = limit => {
            machine.podman.stop(id).await;
            return drain(readers, shipper, Outcome::TimedOut(Duration::from_secs(a.time_limit_seconds.unwrap_or(0)))).await;
        }
    };
    let outcome = match ended {
        None => {
            machine.podman.stop(id).await;
            Outcome::Stopped
        }
        Some(SIGKILL_EXIT) if cgroup::oom_killed(a.uid, a.resources.memory_bytes) => {
            Outcome::OomKilled(a.resources.memory_bytes)
        }
        Some(code) if (129..=128 + 64).contains(&code) => Outcome::Signalled(code - 128),
        Some(code) => Outcome::Exited(code),
    };
    drain(readers, shipper, outcome).await
}

/// The task reading the container's log file, and how to tell it the container ended.
struct Readers {
    ended: CancellationToken,
    reader: tokio::task::JoinHandle<()>,
}

/// Waits (bounded) for the last lines to be read and shipped.
async fn drain(readers: Readers, shipper: tokio::task::JoinHandle<()>, outcome: Outcome) -> Outcome {
    let Readers { ended, mut reader } = readers;
    ended.cancel();
    if tokio::time::timeout(DRAIN_TIMEOUT, &mut reader).await.is_err() {
        reader.abort();
    }
    let _ = shipper.await;
    outcome
}

/// Reports how the worker ended and removes everything of its container.
async fn finish(
    client: &Client,
    machine: &Machine,
    a: &Assignment,
    id: &str,
    gpus: &[u32],
    outcome: Outcome,
) {
    tracing::info!(worker = %a.name, outcome = %outcome.reason(), "ended");
    cleanup(machine, a.uid, Some(id), gpus).await;
    let (state, exit_code, reason) = match outcome {
        Outcome::Stopped => return,
        Outcome::Exited(0) => (WorkerState::Completed, Some(0), String::new()),
        Outcome::Exited(code) => (WorkerState::Failed, Some(code), outcome.reason()),
        other => (WorkerState::Failed, None, other.reason()),
    };
    report_until_heard(client, a, &StatusReport { state, exit_code, reason, events: vec![] }).await;
}

/// No container, bind, file or cgroup outlives its worker, and its GPUs are free again.
pub async fn cleanup(machine: &Machine, worker: uuid::Uuid, id: Option<&str>, gpus: &[u32]) {
    if let Some(id) = id {
        machine.podman.remove(id).await;
    }
    mounts::unstage(&mounts::worker_dir(&machine.state, worker));
    let _ = std::fs::remove_file(machine.state.join(ENV_DIR).join(worker.to_string()));
    let _ = std::fs::remove_file(machine.state.join(AUTH_DIR).join(auth_file_name(worker)));
    let _ = std::fs::remove_file(log_file(&machine.state, worker));
    cgroup::remove(worker);
    machine.gpus.give_back(gpus);
    // Its image may be unused now, and removable when the disk is short.
    machine.images.changed();
}

async fn report_preparing(client: &Client, a: &Assignment, reason: &str) {
    let report = StatusReport {
        state: WorkerState::Preparing,
        exit_code: None,
        reason: reason.to_owned(),
        events: vec![],
    };
    if let Err(e) = client.report(a.uid, &report).await {
        tracing::warn!(worker = %a.name, error = %e, "cannot report why the worker waits");
    }
}

/// Tells the server the worker starts; false when it should not (it was stopped or moved).
async fn report_started(
    client: &Client,
    machine: &Machine,
    a: &Assignment,
    image: &ImageRef,
    gpus: &[u32],
    cdi: bool,
) -> bool {
    let mut events = vec![EventReport {
        kind: "Normal".into(),
        reason: "Started".into(),
        message: format!("runs image {image} as container {}", container::name(a.uid)),
    }];
    if !gpus.is_empty() {
        let list: Vec<String> = gpus.iter().map(u32::to_string).collect();
        let kind = &machine.podman.config().gpu_kind;
        let (level, how) = if cdi {
            ("Normal", format!("through CDI devices {kind}={}", list.join(",")))
        } else {
            (
                "Warning",
                format!("but this machine has no CDI spec for {kind}, so no device reaches the container"),
            )
        };
        events.push(EventReport {
            kind: level.into(),
            reason: "GPUs".into(),
            message: format!("given GPUs {} of this machine {how}", list.join(",")),
        });
    }
    let started =
        StatusReport { state: WorkerState::Running, exit_code: None, reason: String::new(), events };
    match client.report(a.uid, &started).await {
        Ok(ack) => ack.accepted,
        Err(e) => {
            tracing::warn!(worker = %a.name, error = %e, "cannot report the worker started; not starting it");
            false
        }
    }
}

pub(in crate::agent) async fn fail(client: &Client, a: &Assignment, why: &str) {
    let report =
        StatusReport { state: WorkerState::Failed, exit_code: None, reason: why.to_owned(), events: vec![] };
    report_until_heard(client, a, &report).await;
}

/// Retries a final report for a while: the server may be restarting.
pub(in crate::agent) async fn report_until_heard(client: &Client, a: &Assignment, report: &StatusReport) {
    for attempt in 0..30 {
        match client.report(a.uid, report).await {
            Ok(_) => return,
            Err(e) => {
                tracing::warn!(worker = %a.name, attempt, error = %e, "cannot report how the worker ended");
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        }
    }
}

/// Lines gathered for one upload, bounded in lines and in bytes of JSON.
#[derive(Default)]
struct Batch {
    lines: Vec<LogLineIn>,
    bytes: usize,
}

impl Batch {
    /// Adds a line; the lines gathered before it when it would not fit with them.
    fn push(&mut self, line: LogLineIn) -> Option<Vec<LogLineIn>> {
        // A line's JSON, with its separator: escapes may make it six times its text.
        let size = serde_json::to_string(&line).map_or(usize::MAX, |j| j.len()) + 1;
        let full = !self.lines.is_empty() && (self.bytes + size > BATCH_BYTES || self.lines.len() >= BATCH);
        let sent = full.then(|| self.take());
        self.bytes += size;
        self.lines.push(line);
        sent
    }

    fn take(&mut self) -> Vec<LogLineIn> {
        self.bytes = 0;
        std::mem::take(&mut self.lines)
    }
}

async fn ship_logs(client: Client, worker: uuid::Uuid, mut rx: mpsc::Receiver<LogLine>) {
    let mut batch = Batch::default();
    loop {
        let line = if batch.lines.is_empty() {
            rx.recv().await
        } else {
            match tokio::time::timeout(FLUSH, rx.recv()).await {
                Ok(line) => line,
                Err(_) => {
                    send(&client, worker, batch.take()).await;
                    continue;
                }
            }
        };
        let Some(line) = line else { break };
        let stream = match line.stream {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        };
        if let Some(full) = batch.push(LogLineIn { stream: stream.into(), line: line.line }) {
            send(&client, worker, full).await;
        }
    }
    send(&client, worker, batch.take()).await;
}

async fn send(client: &Client, worker: uuid::Uuid, batch: Vec<LogLineIn>) {
    if batch.is_empty() {
        return;
    }
    if let Err(e) = client.logs(worker, batch).await {
        tracing::warn!(%worker, error = %e, "cannot upload logs; lines dropped");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_path_is_read_only_unless_both_mount_and_grant_allow_writing() {
        assert!(read_only_under(false, Mode::ReadOnly), "a read-only grant wins over a rw mount");
        assert!(read_only_under(true, Mode::ReadWrite));
        assert!(!read_only_under(false, Mode::ReadWrite));
    }

    #[test]
    fn a_host_path_must_lie_within_its_grant() {
        assert_eq!(beneath_grant("/scratch/ml/a", Some("/scratch")).unwrap(), "ml/a");
        assert_eq!(beneath_grant("/scratch", Some("/scratch")).unwrap(), "");
        let refused = [
            ("/scratch/ml", None, "/scratch/ml is not under a host path granted to its workspace"),
            ("/scratchy/x", Some("/scratch"), "/scratchy/x is not under its grant /scratch"),
            ("/scratch/../etc", Some("/scratch"), "is not a plain absolute path"),
        ];
        for (path, grant, why) in refused {
            let err = beneath_grant(path, grant).unwrap_err();
            assert!(err.contains(why), "{path}: {err}");
        }
    }

    #[test]
    fn log_uploads_stay_under_the_body_limit_whatever_the_lines_hold() {
        // Lines of control characters, each escaped as \u00XX: 16 KiB of text is 96 KiB of JSON.
        let nasty = "\u{1}".repeat(output::MAX_LINE);
        let mut batch = Batch::default();
        let mut uploads = Vec::new();
        for _ in 0..100 {
            let line = LogLineIn { stream: "stdout".into(), line: nasty.clone() };
            uploads.extend(batch.push(line));
        }
        uploads.push(batch.take());
        assert_eq!(uploads.iter().map(Vec::len).sum::<usize>(), 100, "no line lost");
        for upload in &uploads {
            let body = serde_json::to_vec(&crate::protocol::LogUpload { lines: upload.clone() }).unwrap();
            assert!(body.len() <= crate::api::BODY_LIMIT, "an upload of {} bytes", body.len());
        }
        // Short lines still go 500 at a time.
        let mut batch = Batch::default();
        let sent: Vec<_> = (0..501)
            .filter_map(|_| batch.push(LogLineIn { stream: "stdout".into(), line: "x".into() }))
            .collect();
        assert_eq!(sent.iter().map(Vec::len).collect::<Vec<_>>(), [BATCH]);
    }

    #[test]
    fn reasons_read_as_words() {
        let cases = [
            (Outcome::Exited(3), "exited with code 3"),
            (Outcome::Signalled(9), "killed by signal 9"),
            (Outcome::OomKilled(256 << 20), "OOMKilled: used more than its 256 MiB"),
            (Outcome::OomKilled(3 << 29), "OOMKilled: used more than its 1.5 GiB"),
            (Outcome::TimedOut(Duration::from_secs(2)), "exceeded its time limit of 2s"),
            (Outcome::TimedOut(Duration::from_millis(1500)), "exceeded its time limit of 1.5s"),
            (Outcome::Stopped, "stopped"),
        ];
        for (outcome, reason) in cases {
            assert_eq!(outcome.reason(), reason);
        }
    }
}
