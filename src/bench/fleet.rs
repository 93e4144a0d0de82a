//! Simulated machines: agent-API clients in this process, one pair of tasks per machine. Each
//! joins with a join token, heartbeats its data location and its copies, and long-polls for its
//! workers like the real agent. Its "disk" is a map of complete copies; a fill assigned to it
//! completes at once: the copy is marked complete and reported in a heartbeat sent right away,
//! then the fill's worker is reported Running and Completed. Seed workers (which exist only to
//! make copies through fills) are completed the same way; every other worker is left as it is.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::StreamExt;
use reqwest::Client;
use serde_json::json;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use uuid::Uuid;

use super::http::{Api, Lat};
use crate::protocol::{
    Assignment, Assignments, CopyReport, DataUsage, HeartbeatRequest, HeartbeatResponse, MountSource,
    assignments_tag,
};

/// Every simulated machine's data location.
pub const DATA_PATH: &str = "/data/astraeus";
/// What each copy holds, as reported.
pub const COPY_BYTES: u64 = 1_000_000_000;
const DISK_BYTES: u64 = 100_000_000_000_000;
/// How long a long-poll waits for a change.
const POLL_SECONDS: u64 = 30;
/// How long a machine waits for any answer before it tries another server.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Run-name prefixes the simulated agent completes at once.
pub const FILL_PREFIX: &str = "fill-";
pub const SEED_PREFIX: &str = "seed-";
/// Workers measured by the copy-complete-to-start phase.
pub const PROBE_PREFIX: &str = "probe-";

pub fn machine_name(i: usize) -> String {
    format!("m-{i:05}")
}

/// A copy a simulated machine holds: the drive it was filled for, and when a heartbeat first
/// carried it.
type Held = (Option<Uuid>, Option<Instant>);

pub struct Machine {
    pub index: usize,
    pub name: String,
    auth: String,
    /// Complete copies (folder `<ns>.<drive>`): the drive each was filled for, and when a
    /// heartbeat first carried each.
    copies: Mutex<BTreeMap<String, Held>>,
    /// Held while a heartbeat is in flight: like the real agent, a machine never sends two at once.
    beating: tokio::sync::Mutex<()>,
    /// Workers already handled.
    seen: Mutex<HashSet<Uuid>>,
    /// Which of the fleet's servers it talks to; moves on to the next when a request fails.
    via: AtomicUsize,
}

impl Machine {
    pub fn copy_count(&self) -> usize {
        self.copies.lock().expect("not poisoned").len()
    }

    /// The folders of the copies it holds.
    pub fn folders(&self) -> Vec<String> {
        self.copies.lock().expect("not poisoned").keys().cloned().collect()
    }

    /// The workers the server has assigned it so far.
    pub fn assigned(&self) -> HashSet<Uuid> {
        self.seen.lock().expect("not poisoned").clone()
    }
}

/// What machines ask for when they join.
#[derive(Debug, Clone, Copy)]
pub struct Capacity {
    pub cpu_cores: u32,
    pub memory_bytes: u64,
    pub gpus: u32,
}

pub struct Fleet {
    http: Client,
    api: Api,
    /// The servers machines may talk to (replicas behind one database): the API's by default.
    servers: RwLock<Vec<String>>,
    join_token: String,
    capacity: Capacity,
    interval: Duration,
    /// Heartbeats and status reports in flight: each holds a connection, and connections count
    /// against the limit on open files in this process and in the server.
    calls: Semaphore,
    machines: RwLock<Vec<Arc<Machine>>>,
    tasks: Mutex<JoinSet<()>>,
    /// While set, machines skip their background heartbeats (the heartbeat phase drives them).
    pub beats_paused: AtomicBool,
    /// Background heartbeats' latency, and failures of either loop.
    pub beat_lat: Mutex<Lat>,
    pub beat_errors: AtomicU64,
    pub poll_errors: AtomicU64,
    pub report_errors: AtomicU64,
    /// Copy-complete to start: from the heartbeat that reported a copy complete to the long-poll
    /// answer that brought the probe worker waiting for it.
    pub probe_samples: Mutex<Vec<Duration>>,
    pub probes_seen: AtomicU64,
}

impl Fleet {
    /// `calls`: heartbeats and status reports in flight at most, over all machines.
    pub fn new(
        http: Client,
        api: Api,
        join_token: String,
        capacity: Capacity,
        interval: Duration,
        calls: usize,
    ) -> Arc<Fleet> {
        Arc::new(Fleet {
            http,
            servers: RwLock::new(vec![api.base.clone()]),
            api,
            join_token,
            capacity,
            interval,
            calls: Semaphore::new(calls.min(Semaphore::MAX_PERMITS)),
            machines: RwLock::new(Vec::new()),
            tasks: Mutex::new(JoinSet::new()),
            beats_paused: AtomicBool::new(false),
            beat_lat: Mutex::new(Lat::default()),
            beat_errors: AtomicU64::new(0),
            poll_errors: AtomicU64::new(0),
            report_errors: AtomicU64::new(0),
            probe_samples: Mutex::new(Vec::new()),
            probes_seen: AtomicU64::new(0),
        })
    }

    /// Spreads the machines over these servers (each sticks to one until a request fails).
    pub fn set_servers(&self, bases: Vec<String>) {
        assert!(!bases.is_empty(), "a fleet needs a server");
        *self.servers.write().expect("not poisoned") = bases;
    }

    /// `path` on the server machine `m` talks to now, and which that is (for [`Self::fail_over`]).
    fn url(&self, m: &Machine, path: &str) -> (String, usize) {
        let servers = self.servers.read().expect("not poisoned");
        let via = m.via.load(Ordering::Relaxed);
        (format!("{}/agent/v1/{path}", servers[via % servers.len()]), via)
    }

    /// A POST of the agent API as machine `m`, to the server it talks to now (which, for
    /// [`Self::fail_over`]).
    fn post(&self, m: &Machine, path: &str) -> (reqwest::RequestBuilder, usize) {
        let (url, via) = self.url(m, path);
        (self.http.post(url).timeout(REQUEST_TIMEOUT).header("authorization", &m.auth), via)
    }

    /// After a request to server `via` failed: the next server, unless another of the machine's
    /// loops has moved on already.
    fn fail_over(m: &Machine, via: usize) {
        let _ = m.via.compare_exchange(via, via + 1, Ordering::Relaxed, Ordering::Relaxed);
    }

    pub fn machines(&self) -> Vec<Arc<Machine>> {
        self.machines.read().expect("not poisoned").clone()
    }

    pub fn len(&self) -> usize {
        self.machines.read().expect("not poisoned").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Joins machines until there are `total`, confirms their data locations through the user
    /// API, and starts their heartbeat and long-poll loops.
    pub async fn grow(self: &Arc<Self>, total: usize) -> anyhow::Result<()> {
        let from = self.len();
        let joined: Vec<anyhow::Result<Arc<Machine>>> = futures::stream::iter(from..total)
            .map(|i| {
                let fleet = self.clone();
                async move { fleet.join(i).await }
            })
            .buffer_unordered(32)
            .collect()
            .await;
        let mut joined = joined.into_iter().collect::<anyhow::Result<Vec<_>>>()?;
        joined.sort_by_key(|m| m.index);
        let mut tasks = self.tasks.lock().expect("not poisoned");
        for m in &joined {
            tasks.spawn(self.clone().beat_loop(m.clone()));
            tasks.spawn(self.clone().poll_loop(m.clone()));
        }
        self.machines.write().expect("not poisoned").extend(joined);
        Ok(())
    }

    async fn join(&self, index: usize) -> anyhow::Result<Arc<Machine>> {
        let name = machine_name(index);
        let body = json!({
            "join_token": self.join_token,
            "name": name,
            "capacity": {
                "cpu_cores": self.capacity.cpu_cores,
                "memory_bytes": self.capacity.memory_bytes,
                "gpus": self.capacity.gpus,
            },
            "data_location": DATA_PATH,
        });
        let base = {
            let servers = self.servers.read().expect("not poisoned");
            servers[index % servers.len()].clone()
        };
        let r = self.http.post(format!("{base}/agent/v1/join")).json(&body).send().await?;
        let status = r.status();
        if !status.is_success() {
            bail!("machine {name} could not join: {status}: {}", r.text().await.unwrap_or_default());
        }
        let joined: crate::protocol::JoinResponse = r.json().await?;
        self.api
            .post(&format!("/machines/{name}/data-location"), &json!({ "path": DATA_PATH }))
            .await
            .with_context(|| format!("confirming {name}'s data location"))?;
        Ok(Arc::new(Machine {
            index,
            name,
            auth: format!("Bearer {}", joined.credential),
            copies: Mutex::new(BTreeMap::new()),
            beating: tokio::sync::Mutex::new(()),
            seen: Mutex::new(HashSet::new()),
            via: AtomicUsize::new(index),
        }))
    }

    /// The heartbeat the real agent would send: its data location's usage and every copy.
    /// Copies reported for the first time are stamped now.
    fn heartbeat_body(m: &Machine) -> HeartbeatRequest {
        let now = Instant::now();
        let mut held = m.copies.lock().expect("not poisoned");
        for (_, first) in held.values_mut().filter(|(_, t)| t.is_none()) {
            *first = Some(now);
        }
        let copies: Vec<CopyReport> = held
            .iter()
            .map(|(folder, (drive_id, _))| CopyReport {
                drive: folder.clone(),
                drive_id: *drive_id,
                bytes: COPY_BYTES,
                complete: true,
                measured: true,
                last_used_at: None,
                manifest: None,
                lost: None,
            })
            .collect();
        let used = COPY_BYTES * copies.len() as u64;
        HeartbeatRequest {
            data_location: DataUsage {
                total_bytes: DISK_BYTES,
                used_bytes: used,
                free_bytes: DISK_BYTES - used,
                reserve_bytes: 0,
            },
            copies,
            images: None,
            data_address: None,
        }
    }

    /// Sends one heartbeat, after any in flight; true when the server took it. Folders it says
    /// to delete are deleted.
    pub async fn beat(&self, m: &Machine) -> bool {
        let _one_at_a_time = m.beating.lock().await;
        let _connection = self.calls.acquire().await.expect("never closed");
        let body = Self::heartbeat_body(m);
        let (request, via) = self.post(m, "heartbeat");
        let sent = request.json(&body).send().await;
        let Ok(r) = sent else {
            Self::fail_over(m, via);
            return false;
        };
        if !r.status().is_success() {
            let _ = r.bytes().await;
            return false;
        }
        match r.json::<HeartbeatResponse>().await {
            Ok(answer) => {
                if !answer.delete_copies.is_empty() {
                    let mut copies = m.copies.lock().expect("not poisoned");
                    for folder in &answer.delete_copies {
                        copies.remove(folder);
                    }
                }
                true
            }
            Err(_) => false,
        }
    }

    async fn beat_loop(self: Arc<Self>, m: Arc<Machine>) {
        // Spread the machines' beats over the interval.
        let offset = self.interval.mul_f64((m.index as f64 * 0.618_034).fract());
        tokio::time::sleep(offset).await;
        let mut tick = tokio::time::interval(self.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if self.beats_paused.load(Ordering::Relaxed) {
                continue;
            }
            let start = Instant::now();
            if self.beat(&m).await {
                self.beat_lat.lock().expect("not poisoned").record(start.elapsed());
            } else {
                self.beat_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Long-polls as the agent does: once it holds an answer, a poll with nothing new is
    /// answered `304 Not Modified`.
    async fn poll_loop(self: Arc<Self>, m: Arc<Machine>) {
        let mut version = 0i64;
        let mut held = false;
        loop {
            let (url, via) =
                self.url(&m, &format!("assignments?version={version}&wait_seconds={POLL_SECONDS}"));
            let answer = async {
                let mut request = self
                    .http
                    .get(url)
                    .header("authorization", &m.auth)
                    .timeout(Duration::from_secs(POLL_SECONDS) + REQUEST_TIMEOUT);
                if held {
                    request = request.header(reqwest::header::IF_NONE_MATCH, assignments_tag(version));
                }
                let r = request.send().await?.error_for_status()?;
                if r.status() == reqwest::StatusCode::NOT_MODIFIED {
                    return Ok(None);
                }
                r.json::<Assignments>().await.map(Some)
            }
            .await;
            let arrived = Instant::now();
            match answer {
                Ok(None) => {}
                Ok(Some(a)) => {
                    held = true;
                    version = a.version;
                    let new: Vec<Assignment> = {
                        let mut seen = m.seen.lock().expect("not poisoned");
                        a.workers.into_iter().filter(|w| seen.insert(w.uid)).collect()
                    };
                    self.handle(&m, new, arrived);
                }
                Err(_) => {
                    self.poll_errors.fetch_add(1, Ordering::Relaxed);
                    Self::fail_over(&m, via);
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }

    /// Acts on the workers an answer brought: the fills complete at once (their copies are
    /// marked complete and reported in one heartbeat), seeds end, probes are timed.
    fn handle(self: &Arc<Self>, m: &Arc<Machine>, workers: Vec<Assignment>, arrived: Instant) {
        let mut fills = Vec::new();
        let mut seeds = Vec::new();
        for w in workers {
            if w.run.starts_with(FILL_PREFIX) {
                if let Some(mount) = w.mounts.first() {
                    let drive_id = match mount.source {
                        MountSource::Copy { drive_id, .. } => Some(drive_id),
                        MountSource::Host { .. } => None,
                    };
                    fills.push((w.uid, mount.drive.clone(), drive_id));
                }
            } else if w.run.starts_with(SEED_PREFIX) {
                seeds.push(w.uid);
            } else if w.run.starts_with(PROBE_PREFIX) {
                self.probes_seen.fetch_add(1, Ordering::Relaxed);
                let reported = w
                    .mounts
                    .first()
                    .and_then(|mount| m.copies.lock().expect("not poisoned").get(&mount.drive)?.1);
                if let Some(t0) = reported {
                    self.probe_samples
                        .lock()
                        .expect("not poisoned")
                        .push(arrived.saturating_duration_since(t0));
                }
            }
        }
        if fills.is_empty() && seeds.is_empty() {
            return;
        }
        let (fleet, m) = (self.clone(), m.clone());
        tokio::spawn(async move {
            if !fills.is_empty() {
                {
                    let mut copies = m.copies.lock().expect("not poisoned");
                    for (_, folder, drive_id) in &fills {
                        copies.entry(folder.clone()).or_insert((*drive_id, None));
                    }
                }
                if !fleet.beat(&m).await {
                    fleet.beat_errors.fetch_add(1, Ordering::Relaxed);
                }
            }
            for uid in fills.iter().map(|f| f.0).chain(seeds) {
                fleet.finish(&m, uid).await;
            }
        });
    }

    /// Reports a worker Running, then Completed; a report that fails is sent again, to the next
    /// server, for up to a minute.
    async fn finish(&self, m: &Machine, worker: Uuid) {
        for (state, exit) in [("Running", None), ("Completed", Some(0))] {
            let body = json!({ "state": state, "exit_code": exit });
            let mut tries = 0;
            loop {
                let (request, via) = self.post(m, &format!("workers/{worker}/status"));
                let connection = self.calls.acquire().await.expect("never closed");
                let retry = match request.json(&body).send().await {
                    Ok(r) if r.status().is_success() => {
                        let _ = r.bytes().await;
                        break;
                    }
                    Ok(r) => r.status().is_server_error(),
                    Err(_) => {
                        Self::fail_over(m, via);
                        true
                    }
                };
                drop(connection);
                tries += 1;
                if !retry || tries >= 60 {
                    self.report_errors.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }

    /// Stops every machine's loops.
    pub async fn stop(&self) {
        let mut tasks = std::mem::take(&mut *self.tasks.lock().expect("not poisoned"));
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
    }
}
