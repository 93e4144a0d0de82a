//! The agent: joins the cluster, heartbeats with its data location and copies, long-polls for
//! the workers it should run, runs each as a podman container of its own image, and ships their
//! logs.

pub mod cgroup;
pub mod client;
pub mod container;
pub mod credential;
pub mod disk;
pub mod gpus;
pub mod host;
pub mod images;
pub mod layout;
pub mod manifest;
pub mod mounts;
pub mod output;
pub mod peer;
pub mod podman;
pub mod sizes;
pub mod worker;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::num::NonZeroU64;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use anyhow::Context;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use crate::domain::machine::TransferLimits;
use crate::protocol::{Assignment, JoinRequest};
use crate::settings::{AgentArgs, PeerArgs};
use client::Client;
use container::Ulimit;
use podman::{Found, Podman};

/// What the agent needs to run; built from `astraeus agent` flags or by dev mode.
#[derive(Debug, Clone)]
pub struct Config {
    pub server: String,
    pub join: JoinRequest,
    /// The folder the agent proposes as its data location.
    pub data_location: PathBuf,
    pub heartbeat_interval: Duration,
    /// Free space to keep on the data location's disk, as heartbeats report it.
    pub data_reserve_bytes: u64,
    pub runtime: podman::Config,
    pub peers: PeerConfig,
}

/// The data port and the bounds of transfers between peers.
#[derive(Debug, Clone)]
pub struct PeerConfig {
    /// Where to serve whole copies to peers; `None` for no data port.
    pub listen: Option<SocketAddr>,
    pub serve: peer::ServeLimits,
    /// Bytes per second sent to peers, over all uploads; `None` for no limit but the server's.
    pub upload_bytes_per_second: Option<NonZeroU64>,
    /// Bytes per second received from peers, over all pulls; `None` for no limit but the
    /// server's.
    pub download_bytes_per_second: Option<NonZeroU64>,
    /// The data port's certificate and key: it serves HTTPS; `None` for plain HTTP.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Whom a holder at an `https://` address must prove itself to.
    pub trust: peer::Trust,
}

impl Default for PeerConfig {
    fn default() -> Self {
        PeerConfig {
            listen: None,
            serve: peer::ServeLimits { uploads: 4 },
            upload_bytes_per_second: None,
            download_bytes_per_second: None,
            tls: None,
            trust: peer::Trust::default(),
        }
    }
}

impl PeerConfig {
    /// The config of `args`, its TLS files read and checked: one that cannot be used is an
    /// error naming its flag.
    pub fn from_args(args: &PeerArgs) -> Result<PeerConfig, String> {
        let listen = args.data_listen.map(|a| a.ip());
        let tls =
            peer::tls::server_from_args(args.data_tls_cert.as_deref(), args.data_tls_key.as_deref(), listen)?;
        Ok(PeerConfig {
            listen: args.data_listen,
            serve: peer::ServeLimits { uploads: args.upload_slots as usize },
            upload_bytes_per_second: args.upload_bytes_per_second,
            download_bytes_per_second: args.download_bytes_per_second,
            tls,
            trust: peer::Trust::from_args(args.data_tls_ca.as_deref())?,
        })
    }
}

/// What every worker of this machine shares.
#[derive(Debug)]
pub struct Machine {
    pub podman: Podman,
    /// The agent's own folder (`<data location>/.agent`, mode 0700): environment files and the
    /// binds of workers' drives.
    pub state: PathBuf,
    /// Its own `--data-location`: the only folder (or a folder beneath it) it keeps copies in,
    /// and the label that marks its containers (`Machine::home`).
    pub own: PathBuf,
    pub gpus: gpus::Gpus,
    pub images: images::Images,
    /// `nofile` and `nproc` for containers: no higher than the agent's own, since podman's
    /// defaults can exceed what the host lets it set. `nproc` is also held to the pids limit:
    /// podman lowers its own below the agent's, and runc may not raise it back.
    pub ulimits: (Ulimit, Ulimit),
    /// The bounds of pulls from peers, their byte rate shared by all.
    pub pulls: peer::PullLimits,
}

impl Machine {
    /// The value of the label that marks this agent's containers: several agents may share a
    /// host (dev mode), each minding its own.
    pub fn home(&self) -> String {
        self.own.to_string_lossy().into_owned()
    }

    fn new(config: &Config) -> anyhow::Result<Machine> {
        use std::os::unix::fs::DirBuilderExt;
        let state = config.data_location.join(".agent");
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&state)?;
        let limit = |r| {
            let l = rustix::process::getrlimit(r);
            let hard = l.maximum.unwrap_or(u64::from(u32::MAX));
            Ulimit { soft: l.current.unwrap_or(hard).min(hard), hard }
        };
        use rustix::process::Resource;
        Ok(Machine {
            podman: Podman::new(config.runtime.clone()),
            state,
            own: config.data_location.clone(),
            gpus: gpus::Gpus::new(config.join.capacity.gpus),
            images: images::Images::default(),
            ulimits: (limit(Resource::Nofile), {
                let l = limit(Resource::Nproc);
                let cap = u64::from(container::PIDS_LIMIT);
                Ulimit { soft: l.soft.min(cap), hard: l.hard.min(cap) }
            }),
            // No reserve of its own: like a fill's container, a pull may use the space the
            // server's evictions keep free, which is what it placed the fill here for.
            pulls: peer::PullLimits {
                rate: peer::Rate::bounded(config.peers.download_bytes_per_second),
                trust: config.peers.trust.clone(),
                ..peer::PullLimits::default()
            },
        })
    }
}

/// The confirmed data location, as the server last said.
#[derive(Debug, Default)]
pub struct Shared {
    pub data_location: Mutex<Option<PathBuf>>,
    /// Where this agent serves its whole copies to peers, once it does.
    pub data_address: OnceLock<String>,
    /// The copies being pulled from peers, which the data port serves on as they land.
    pub relays: Arc<peer::Relays>,
    /// Bytes a second sent to peers and received from them: this agent's flags, and the
    /// limits the server sets for the machine, which heartbeats bring.
    pub upload: peer::Rate,
    pub download: peer::Rate,
    /// The last location refused, so that it is logged once, not at every heartbeat.
    refused: Mutex<Option<String>>,
}

impl Shared {
    /// Bounds what this agent sends to peers and receives from them by what the server says,
    /// besides its own flags.
    fn limit_transfers(&self, limits: &TransferLimits) {
        self.upload.set(limits.upload_bytes_per_second.and_then(NonZeroU64::new));
        self.download.set(limits.download_bytes_per_second.and_then(NonZeroU64::new));
    }

    /// Takes the location the server confirmed, if it is `own` or beneath it
    /// (`disk::accept_location`); otherwise the machine has none.
    fn confirm(&self, own: &Path, offered: Option<&str>) -> Option<PathBuf> {
        let known = self.data_location.lock().expect("not poisoned").clone();
        let accepted = match offered {
            None => None,
            Some(o) if known.as_deref().is_some_and(|k| k == Path::new(o)) => known,
            Some(o) => match disk::accept_location(own, o) {
                Ok(path) => Some(path),
                Err(why) => {
                    let mut refused = self.refused.lock().expect("not poisoned");
                    if refused.as_deref() != Some(o) {
                        tracing::warn!(offered = o, %why, "refusing the data location the server confirmed");
                        *refused = Some(o.to_owned());
                    }
                    None
                }
            },
        };
        *self.data_location.lock().expect("not poisoned") = accepted.clone();
        accepted
    }
}

impl Config {
    pub fn from_args(args: &AgentArgs) -> anyhow::Result<Config> {
        use secrecy::ExposeSecret;
        let peers = PeerConfig::from_args(&args.peers).map_err(anyhow::Error::msg)?;
        let join = host::join_request(
            &args.name,
            args.join_token.as_ref().map_or("", |t| t.expose_secret()),
            &args.data_location,
            &args.machine,
        )?;
        std::fs::create_dir_all(&args.data_location)?;
        Ok(Config {
            server: args.server.clone(),
            join,
            data_location: std::path::absolute(&args.data_location)?,
            heartbeat_interval: Duration::from_secs(args.machine.heartbeat_interval_seconds.max(1)),
            data_reserve_bytes: args.machine.data_reserve_bytes,
            runtime: podman::Config::from_args(&args.runtime)?,
            peers,
        })
    }
}

/// Runs until `stop` is cancelled, then stops its workers.
pub async fn run(config: Config, stop: CancellationToken) -> anyhow::Result<()> {
    // Bound before anything else, so that a port that is taken stops the agent at once.
    let data_port = match config.peers.listen {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen for peers on {addr} (--data-listen)"))?,
        ),
        None => None,
    };
    let machine = Arc::new(Machine::new(&config)?);
    // Containers left by this agent's last life: followed again if still assigned.
    let found = machine
        .podman
        .own(&machine.home())
        .await
        .map_err(|e| anyhow::anyhow!("cannot list containers: {e}"))?;
    let ids: Vec<Uuid> = found.iter().map(|f| f.worker).collect();
    mounts::unstage_all_but(&machine.state, &ids);
    let mut client = Client::new(&config.server)?;
    let Some(joined) = credential::join_or_resume(&mut client, &config, &machine.state, &stop).await? else {
        return Ok(());
    };
    tracing::info!(machine = %joined.machine, cluster = %joined.cluster, "joined");
    let shared = Arc::new(Shared {
        upload: peer::Rate::bounded(config.peers.upload_bytes_per_second),
        download: machine.pulls.rate.clone(),
        ..Shared::default()
    });
    let sizes = Arc::new(sizes::Sizes::default());
    let manifests = Arc::new(manifest::Manifests::default());
    let measurer = tokio::spawn(measure_loop(config.clone(), shared.clone(), sizes.clone(), stop.clone()));
    let manifester = tokio::spawn(manifest_loop(
        config.clone(),
        shared.clone(),
        manifests.clone(),
        sizes.clone(),
        stop.clone(),
    ));
    let heartbeat = tokio::spawn(heartbeat_loop(
        client.clone(),
        config.clone(),
        machine.clone(),
        shared.clone(),
        sizes,
        manifests.clone(),
        stop.clone(),
    ));
    let server = data_port.map(|listener| {
        let holder = (client.clone(), joined.credential.clone(), shared.clone(), manifests.clone());
        let port = (listener, config.peers.tls.clone());
        tokio::spawn(serve_peers(port, holder, config.peers.serve.clone(), stop.clone()))
    });
    let images = tokio::spawn({
        let (machine, stop) = (machine.clone(), stop.clone());
        let keep_free = config.runtime.image_keep_free_bytes;
        async move { images::watch(&machine.podman, &machine.images, keep_free, stop).await }
    });
    let result = assignment_loop(client, machine, found, shared, manifests, stop.clone()).await;
    stop.cancel();
    let _ = heartbeat.await;
    let _ = measurer.await;
    let _ = manifester.await;
    let _ = images.await;
    if let Some(server) = server {
        let _ = server.await;
    }
    result
}

/// Serves this machine's whole copies to peers on `listener` (over TLS with `tls`) until `stop`,
/// once it knows the machine's id (which transfer tokens must name as their source) from its
/// credential, checked with the server's keys; heartbeats then report the port.
async fn serve_peers(
    (listener, tls): (tokio::net::TcpListener, Option<Arc<rustls::ServerConfig>>),
    (client, credential, shared, manifests): (Client, String, Arc<Shared>, Arc<manifest::Manifests>),
    limits: peer::ServeLimits,
    stop: CancellationToken,
) {
    let address = match listener.local_addr() {
        Ok(addr) if addr.ip().is_unspecified() => {
            tracing::warn!(%addr, "the data port listens on every address, and reports this one to the server: peers cannot reach it there; pass --data-listen with this machine's own address");
            peer::serve::address(addr, tls.is_some())
        }
        Ok(addr) => peer::serve::address(addr, tls.is_some()),
        Err(e) => {
            return tracing::error!(error = %e, "the data port has no address: copies are not served to peers");
        }
    };
    let mut pause = Duration::from_secs(2);
    let (keys, machine) = loop {
        let known = client.keys().await.and_then(|keys| {
            let claims = crate::auth::machine::verify_credential(&keys, &credential)
                .map_err(|e| anyhow::anyhow!("the machine's credential does not verify: {e}"))?;
            Ok((keys, claims.mid))
        });
        match known {
            Ok(known) => break known,
            Err(e) => tracing::warn!(error = %e, "cannot serve copies to peers yet; retrying"),
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(pause) => {}
        }
        pause = (pause * 2).min(Duration::from_secs(60));
    };
    let keys = Arc::new(peer::TrustedKeys::seeded(client, keys));
    let holder = Arc::new(peer::Holder::new(machine, shared.clone(), manifests, keys, &limits));
    tracing::info!(%address, "serving whole copies to peers");
    let _ = shared.data_address.set(address);
    if let Err(e) = peer::serve::serve(listener, tls, holder, stop).await {
        tracing::error!(error = %e, "the data port stopped: copies are no longer served to peers");
    }
}

/// The data location copies are kept in: the one confirmed, else the one proposed.
fn location(config: &Config, shared: &Shared) -> PathBuf {
    let confirmed = shared.data_location.lock().expect("not poisoned").clone();
    confirmed.unwrap_or_else(|| config.data_location.clone())
}

/// Measures the copies' sizes pass after pass: soon again while a walk is unfinished, once a
/// heartbeat interval when all are measured.
async fn measure_loop(
    config: Config,
    shared: Arc<Shared>,
    sizes: Arc<sizes::Sizes>,
    stop: CancellationToken,
) {
    let mut measurer = sizes::Measurer::default();
    loop {
        let (dir, known) = (location(&config, &shared), sizes.clone());
        let walked = tokio::task::spawn_blocking(move || {
            let pass = measurer.pass(&dir, &known, sizes::PASS_ENTRIES);
            (measurer, pass)
        })
        .await;
        let Ok((kept, pass)) = walked else { return };
        measurer = kept;
        let pause = if pass.unfinished { Duration::from_millis(50) } else { config.heartbeat_interval };
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(pause) => {}
        }
    }
}

/// Makes the manifests of complete copies that lack one, a copy a pass: soon again while one
/// still lacks it, once a heartbeat interval otherwise. A pass may take minutes: it holds up
/// neither heartbeats nor workers.
async fn manifest_loop(
    config: Config,
    shared: Arc<Shared>,
    manifests: Arc<manifest::Manifests>,
    sizes: Arc<sizes::Sizes>,
    stop: CancellationToken,
) {
    loop {
        let (dir, kept, halt) = (location(&config, &shared), manifests.clone(), stop.clone());
        let measured = sizes.clone();
        let pass =
            tokio::task::spawn_blocking(move || manifest::keep::pass(&kept, &dir, &measured, &halt)).await;
        let Ok(more) = pass else { return };
        let pause = if more { Duration::from_millis(50) } else { config.heartbeat_interval };
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(pause) => {}
        }
    }
}

async fn heartbeat_loop(
    client: Client,
    config: Config,
    machine: Arc<Machine>,
    shared: Arc<Shared>,
    sizes: Arc<sizes::Sizes>,
    manifests: Arc<manifest::Manifests>,
    stop: CancellationToken,
) {
    // The images the server was last told of.
    let mut told: Option<Vec<crate::protocol::ImageReport>> = None;
    // The data port the server was last told of.
    let mut told_address: Option<String> = None;
    loop {
        let (dir, known, kept) = (location(&config, &shared), sizes.clone(), manifests.clone());
        let mut report =
            tokio::task::spawn_blocking(move || disk::report(&dir, &known, &kept)).await.unwrap_or_default();
        report.data_location.reserve_bytes = config.data_reserve_bytes;
        if let Some(list) = machine.images.latest()
            && told.as_ref() != Some(&list)
        {
            report.images = Some(list);
        }
        if let Some(address) = shared.data_address.get()
            && told_address.as_ref() != Some(address)
        {
            report.data_address = Some(address.clone());
        }
        match client.heartbeat(&report).await {
            Ok(answer) => {
                if report.images.is_some() {
                    told = report.images.take();
                }
                if report.data_address.is_some() {
                    told_address = report.data_address.take();
                }
                shared.limit_transfers(&answer.transfer_limits);
                let confirmed = shared.confirm(&machine.own, answer.data_location.as_deref());
                if let Some(dir) = confirmed
                    && !answer.delete_copies.is_empty()
                {
                    let reported = report.copies.iter().map(|c| (c.drive.clone(), c.drive_id)).collect();
                    let folders = answer.delete_copies;
                    let deleting = move || disk::delete_copies(&dir, &folders, &reported);
                    let _ = tokio::task::spawn_blocking(deleting).await;
                }
            }
            Err(e) => tracing::warn!(error = %e, "heartbeat failed"),
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(config.heartbeat_interval) => {}
        }
    }
}

/// How long an agent's request for assignments waits for a change.
const LONG_POLL_SECONDS: u64 = 30;

/// Drops the workers that ended from `running`; which they were.
fn forget_ended(
    finished: &Mutex<Vec<Uuid>>,
    running: &mut HashMap<Uuid, CancellationToken>,
) -> HashSet<Uuid> {
    let ended: HashSet<Uuid> = finished.lock().expect("not poisoned").drain(..).collect();
    for id in &ended {
        running.remove(id);
    }
    ended
}

/// The workers of an answer to start here: those it lists that are not running, but for those
/// that ended while it was on its way (see `assignment_loop`).
fn to_start<'a>(
    wanted: &HashMap<Uuid, &'a Assignment>,
    running: &HashMap<Uuid, CancellationToken>,
    just_ended: &HashSet<Uuid>,
) -> Vec<(Uuid, &'a Assignment)> {
    wanted
        .iter()
        .filter(|(id, _)| !running.contains_key(*id) && !just_ended.contains(*id))
        .map(|(id, a)| (*id, *a))
        .collect()
}

/// Long-polls for assignments and makes the running workers match them.
async fn assignment_loop(
    client: Client,
    machine: Arc<Machine>,
    found: Vec<Found>,
    shared: Arc<Shared>,
    manifests: Arc<manifest::Manifests>,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let mut running: HashMap<Uuid, CancellationToken> = HashMap::new();
    // Until the first answer says which of them are still wanted.
    let mut left: Option<HashMap<Uuid, Found>> = Some(found.into_iter().map(|f| (f.worker, f)).collect());
    let finished: Arc<Mutex<Vec<Uuid>>> = Arc::default();
    let workers = TaskTracker::new();
    let mut version = 0;
    // Whether `running` follows the answer for `version`; until then the whole list is asked for.
    let mut held = false;
    // Seconds the server may hold the next request until something changes.
    let mut wait = LONG_POLL_SECONDS;
    loop {
        // A worker that ended here may still be listed (its report unheard): ask for the list.
        if !forget_ended(&finished, &mut running).is_empty() {
            held = false;
        }
        let answer = tokio::select! {
            _ = stop.cancelled() => break,
            a = client.assignments(version, held, wait) => a,
        };
        let assignments = match answer {
            Ok(Some(a)) => a,
            Ok(None) => continue,
            Err(e) if client::is_unauthorized(&e) => {
                // Deleted: its workers were failed, so none of its containers may go on.
                stop_all(&running, &workers).await;
                return Err(e.context("the server no longer takes this machine's credential"));
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot fetch assignments; retrying");
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                }
            }
        };
        version = assignments.version;
        // The location as of these assignments: a heartbeat may not have brought it yet.
        let data = match &assignments.data_location {
            Some(dir) => shared.confirm(&machine.own, Some(dir)),
            None => shared.data_location.lock().expect("not poisoned").clone(),
        };
        // Those that ended while this answer was on its way and that it lists are not run from
        // it: it may have been read before their end was reported, and run again, a fill would
        // remove the marker of the copy it has just made whole. The list is asked for again at
        // once: read after they ended, it is sure of them (a worker that restarts is listed).
        let just_ended = forget_ended(&finished, &mut running);
        let wanted: HashMap<Uuid, &Assignment> = assignments.workers.iter().map(|a| (a.uid, a)).collect();
        let unsure = wanted.keys().any(|id| just_ended.contains(id));
        held = !unsure;
        wait = if unsure { 0 } else { LONG_POLL_SECONDS };
        running.retain(|id, token| {
            let keep = wanted.contains_key(id);
            if !keep {
                tracing::info!(worker = %id, "stopping a worker that is no longer assigned");
                token.cancel();
            }
            keep
        });
        let mut adopted = left.take().unwrap_or_default();
        for (id, a) in to_start(&wanted, &running, &just_ended) {
            let token = stop.child_token();
            running.insert(id, token.clone());
            // A fill from a peer runs no container: one found for it is removed below.
            let found = if a.peer.is_some() { None } else { adopted.remove(&id) };
            // Taken here, not in the task: the manifests may be made once this answer is acted on.
            let hold = manifests.hold(data.as_deref(), a);
            let (client, machine, data, finished, a) =
                (client.clone(), machine.clone(), data.clone(), finished.clone(), a.clone());
            let (manifests, shared) = (manifests.clone(), shared.clone());
            workers.spawn(async move {
                match a.peer.clone() {
                    Some(source) => {
                        let fill = peer::fill::Fill {
                            client: &client,
                            manifests: &manifests,
                            relays: &shared.relays,
                            limits: &machine.pulls,
                        };
                        fill.run(&a, &source, data, token).await;
                    }
                    None => worker::run(&client, &machine, a, data, found, token).await,
                }
                drop(hold);
                finished.lock().expect("not poisoned").push(id);
            });
        }
        // Containers of workers that ended or moved while the agent was away.
        for (worker, f) in adopted {
            tracing::info!(%worker, container = %f.id, "removing a container no longer assigned");
            machine.podman.stop(&f.id).await;
            worker::cleanup(&machine, worker, Some(&f.id), &[]).await;
        }
        // Every container still running is a worker held above.
        manifests.settle();
    }
    stop_all(&running, &workers).await;
    Ok(())
}

/// Stops every worker and waits until each has stopped its container and cleaned up, those
/// no longer assigned included.
async fn stop_all(running: &HashMap<Uuid, CancellationToken>, workers: &TaskTracker) {
    for token in running.values() {
        token.cancel();
    }
    workers.close();
    workers.wait().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_starts_what_it_lists_but_what_runs_and_what_ended_while_it_came() {
        let a = |n: u128| {
            serde_json::from_value::<Assignment>(serde_json::json!({
                "uid": Uuid::from_u128(n), "name": format!("w-{n}"), "run": "r", "namespace": "default",
                "state": "Running", "image": "busybox", "command": "true", "args": [], "env": {},
                "time_limit_seconds": null, "mounts": [], "id_slot": 1, "fill": true,
                "resources": {"cpu_cores": 1.0, "memory_bytes": 1, "gpus": 0},
            }))
            .unwrap()
        };
        let listed = [a(1), a(2), a(3)];
        let wanted: HashMap<Uuid, &Assignment> = listed.iter().map(|a| (a.uid, a)).collect();
        let running = HashMap::from([(Uuid::from_u128(1), CancellationToken::new())]);
        // A fill that ended as the answer came, read before its end was heard: not filled again.
        let just_ended = HashSet::from([Uuid::from_u128(2)]);
        let started: Vec<Uuid> =
            to_start(&wanted, &running, &just_ended).into_iter().map(|(id, _)| id).collect();
        assert_eq!(started, vec![Uuid::from_u128(3)]);
        // The next answer, asked for after it ended, is sure of it: listed still, it runs again.
        let started = to_start(&wanted, &running, &HashSet::new()).len();
        assert_eq!(started, 2);
    }

    #[test]
    fn the_transfer_limits_a_heartbeat_brings_bound_the_agents_rates_below_its_flags() {
        let n = NonZeroU64::new;
        let shared = Shared { upload: peer::Rate::bounded(n(200_000_000)), ..Shared::default() };
        let limits =
            |up, down| TransferLimits { upload_bytes_per_second: up, download_bytes_per_second: down };
        shared.limit_transfers(&limits(Some(100_000_000), Some(50_000_000)));
        assert_eq!((shared.upload.limit(), shared.download.limit()), (n(100_000_000), n(50_000_000)));
        shared.limit_transfers(&limits(Some(300_000_000), None));
        assert_eq!(
            (shared.upload.limit(), shared.download.limit()),
            (n(200_000_000), None),
            "the flag holds"
        );
    }
}
