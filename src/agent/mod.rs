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
pub mod manifest;
pub mod mounts;
pub mod output;
pub mod peer;
pub mod podman;
pub mod sizes;
pub mod worker;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use crate::protocol::{Assignment, JoinRequest};
use crate::settings::AgentArgs;
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
        })
    }
}

/// The confirmed data location, as the server last said.
#[derive(Debug, Default)]
pub struct Shared {
    pub data_location: Mutex<Option<PathBuf>>,
    /// The last location refused, so that it is logged once, not at every heartbeat.
    refused: Mutex<Option<String>>,
}

impl Shared {
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
        })
    }
}

/// Runs until `stop` is cancelled, then stops its workers.
pub async fn run(config: Config, stop: CancellationToken) -> anyhow::Result<()> {
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
    let shared = Arc::new(Shared::default());
    let sizes = Arc::new(sizes::Sizes::default());
    let manifests = Arc::new(manifest::Manifests::default());
    let measurer = tokio::spawn(measure_loop(config.clone(), shared.clone(), sizes.clone(), stop.clone()));
    let manifester =
        tokio::spawn(manifest_loop(config.clone(), shared.clone(), manifests.clone(), stop.clone()));
    let heartbeat = tokio::spawn(heartbeat_loop(
        client.clone(),
        config.clone(),
        machine.clone(),
        shared.clone(),
        sizes,
        manifests.clone(),
        stop.clone(),
    ));
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
    result
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
    stop: CancellationToken,
) {
    loop {
        let (dir, kept, halt) = (location(&config, &shared), manifests.clone(), stop.clone());
        let pass = tokio::task::spawn_blocking(move || manifest::keep::pass(&kept, &dir, &halt)).await;
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
        match client.heartbeat(&report).await {
            Ok(answer) => {
                if report.images.is_some() {
                    told = report.images.take();
                }
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

/// Drops the workers that ended from `running`; whether there were any.
fn forget_ended(finished: &Mutex<Vec<Uuid>>, running: &mut HashMap<Uuid, CancellationToken>) -> bool {
    let ended: Vec<Uuid> = finished.lock().expect("not poisoned").drain(..).collect();
    for id in &ended {
        running.remove(id);
    }
    !ended.is_empty()
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
    loop {
        // A worker that ended here may still be listed (its report unheard): ask for the list.
        if forget_ended(&finished, &mut running) {
            held = false;
        }
        let answer = tokio::select! {
            _ = stop.cancelled() => break,
            a = client.assignments(version, held, 30) => a,
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
        forget_ended(&finished, &mut running);
        held = true;
        let wanted: HashMap<Uuid, &Assignment> = assignments.workers.iter().map(|a| (a.uid, a)).collect();
        running.retain(|id, token| {
            let keep = wanted.contains_key(id);
            if !keep {
                tracing::info!(worker = %id, "stopping a worker that is no longer assigned");
                token.cancel();
            }
            keep
        });
        let mut adopted = left.take().unwrap_or_default();
        for (id, a) in &wanted {
            if running.contains_key(id) {
                continue;
            }
            let token = stop.child_token();
            running.insert(*id, token.clone());
            let found = adopted.remove(id);
            // Taken here, not in the task: the manifests may be made once this answer is acted on.
            let hold = manifests.hold(data.as_deref(), a);
            let (client, machine, data, finished, a) =
                (client.clone(), machine.clone(), data.clone(), finished.clone(), (*a).clone());
            let id = *id;
            workers.spawn(async move {
                worker::run(&client, &machine, a, data, found, token).await;
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
