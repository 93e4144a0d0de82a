//! A fill whose copy comes from a peer: it runs no container. The copy is pulled into the
//! folder the fill mounts read-write, again while the holder is busy or the connection fails
//! (each pull resumes where the last stopped), with a fresh transfer token when the holder
//! refuses the one it has; the fill ends Completed once the copy is whole with its marker, or
//! Failed with the pull's error as its reason.
//!
//! The fill's [`Manifests::hold`] is taken before it starts, like any fill's: the manifest the
//! pull adopts afterwards is kept while that hold lasts (see `manifest::keep`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::pull::{Order, PullError, PullLimits, PullReport, pull};
use super::relay::{Relay, Relays};
use crate::agent::client::{self, Client};
use crate::agent::manifest::{Digest, Manifests};
use crate::agent::worker;
use crate::domain::run::WorkerState;
use crate::protocol::{Assignment, EventReport, MountSource, PeerSource, StatusReport};

/// Pulls tried after a failed connection (each resuming) before the fill fails, the first
/// again after `BACKOFF`, doubling up to `MAX_BACKOFF`.
const TRANSFER_ATTEMPTS: u32 = 5;
const BACKOFF: Duration = Duration::from_secs(2);
const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// How long in all a fill waits on a busy holder before it fails; each wait is the holder's
/// `Retry-After`, held within `BUSY_PAUSE` whatever the holder says.
const BUSY_FOR: Duration = Duration::from_secs(30 * 60);
const BUSY_PAUSE: std::ops::RangeInclusive<Duration> = Duration::from_secs(1)..=Duration::from_secs(60);
/// Fresh transfer tokens asked for before a refusal of the token fails the fill.
const FRESH_TOKENS: u32 = 3;

/// What the fills from peers of this agent share.
pub struct Fill<'a> {
    /// The server: status reports and fresh transfer tokens.
    pub client: &'a Client,
    pub manifests: &'a Arc<Manifests>,
    /// Where the copy being pulled is entered, for the data port to serve it on as it lands.
    pub relays: &'a Arc<Relays>,
    pub limits: &'a PullLimits,
}

/// The pull a fill from `source` asks for: into the copy it mounts read-write, whole.
pub fn order(a: &Assignment, source: &PeerSource) -> Result<Order, String> {
    let mut into = a.mounts.iter().filter(|m| !m.read_only).filter_map(|m| match &m.source {
        MountSource::Copy { folder, drive_id } if m.sub_path.is_empty() => Some((folder, *drive_id)),
        _ => None,
    });
    let (folder, drive_id) = match (into.next(), into.next()) {
        (Some(copy), None) => copy,
        _ => return Err("a fill from a peer mounts exactly one drive's whole copy read-write".into()),
    };
    let digest = Digest::parse(&source.manifest)
        .map_err(|why| format!("the manifest digest of {}'s copy: {why}", source.machine))?;
    Ok(Order {
        source: source.address.clone(),
        token: source.token.clone(),
        folder: folder.clone(),
        drive_id,
        digest,
    })
}

impl Fill<'_> {
    /// Runs the fill `a` from `source` into `data_location` until its copy is whole, it fails,
    /// or `stop` (then it reports nothing: the worker is no longer this machine's).
    pub async fn run(
        &self,
        a: &Assignment,
        source: &PeerSource,
        data_location: Option<PathBuf>,
        stop: CancellationToken,
    ) {
        let order = match order(a, source) {
            Ok(order) => order,
            Err(why) => return worker::fail(self.client, a, &why).await,
        };
        let Some(dir) = data_location else {
            return worker::fail(self.client, a, "this machine has no confirmed data location").await;
        };
        // Entered before the server hears it started: from then on it may name this machine
        // as the source of another copy.
        let relay = self.relays.enter(&order.folder, order.drive_id, order.digest);
        // The server saw it start: an agent that restarted pulls again, keeping what it has.
        if a.state != WorkerState::Running && !self.started(a, source, &order).await {
            return;
        }
        tracing::info!(worker = %a.name, folder = %order.folder, from = %source.machine, "pulling a copy from a peer");
        match self.pull(a.uid, order, &dir, Some(&relay), &stop).await {
            Ok(report) => {
                tracing::info!(worker = %a.name, received = report.received, kept = report.kept, "pulled a copy from a peer");
                let message = format!(
                    "received {} bytes of {} files from {} ({} bytes kept from an earlier pull)",
                    report.received, report.files, source.machine, report.kept
                );
                let event = EventReport { kind: "Normal".into(), reason: "Pulled".into(), message };
                let done = StatusReport {
                    state: WorkerState::Completed,
                    exit_code: None,
                    reason: String::new(),
                    events: vec![event],
                };
                worker::report_until_heard(self.client, a, &done).await;
            }
            Err(_) if stop.is_cancelled() => {}
            Err(e) => {
                tracing::warn!(worker = %a.name, error = %e, "cannot pull the copy from its peer");
                worker::fail(self.client, a, &e.to_string()).await;
            }
        }
    }

    /// Tells the server the fill starts; false when it should not (it was stopped or moved).
    async fn started(&self, a: &Assignment, source: &PeerSource, order: &Order) -> bool {
        let message = format!(
            "pulls the copy in drives/{} from {} at {}",
            order.folder, source.machine, source.address
        );
        let report = StatusReport {
            state: WorkerState::Running,
            exit_code: None,
            reason: String::new(),
            events: vec![EventReport { kind: "Normal".into(), reason: "Started".into(), message }],
        };
        match self.client.report(a.uid, &report).await {
            Ok(ack) => ack.accepted,
            Err(e) => {
                tracing::warn!(worker = %a.name, error = %e, "cannot report the fill started; not starting it");
                false
            }
        }
    }

    /// Pulls `order` into `dir` for the fill `worker`, again while that may succeed, marking
    /// its progress in `relay`.
    pub async fn pull(
        &self,
        worker: Uuid,
        mut order: Order,
        dir: &Path,
        relay: Option<&Relay>,
        cancel: &CancellationToken,
    ) -> Result<PullReport, PullError> {
        let (mut transfers, mut fresh, mut busy, mut backoff) = (1, 0, Duration::ZERO, BACKOFF);
        let mut next_backoff = || {
            let wait = backoff;
            backoff = (backoff * 2).min(MAX_BACKOFF);
            wait
        };
        loop {
            let err = match pull(&order, dir, self.manifests, self.limits, relay, cancel).await {
                Ok(report) => return Ok(report),
                Err(e) => e,
            };
            let wait = match &err {
                PullError::Busy { retry_after } if busy < BUSY_FOR => {
                    let wait = (*retry_after).clamp(*BUSY_PAUSE.start(), *BUSY_PAUSE.end());
                    busy += wait;
                    wait
                }
                PullError::Transfer(_) if transfers < TRANSFER_ATTEMPTS => {
                    transfers += 1;
                    next_backoff()
                }
                PullError::Refused { status: 401, .. } if fresh < FRESH_TOKENS => {
                    match self.client.transfer_token(worker).await {
                        Ok(token) => {
                            fresh += 1;
                            order.token = token;
                            Duration::ZERO
                        }
                        // The server may be restarting: the refused token is asked again for.
                        Err(e) if !client::is_refusal(&e) && transfers < TRANSFER_ATTEMPTS => {
                            tracing::warn!(%worker, error = %e, "cannot get a fresh transfer token; retrying");
                            transfers += 1;
                            next_backoff()
                        }
                        Err(e) => {
                            tracing::warn!(%worker, error = %e, "cannot get a fresh transfer token");
                            return Err(err);
                        }
                    }
                }
                _ => return Err(err),
            };
            if !wait.is_zero() {
                tracing::info!(%worker, error = %err, seconds = wait.as_secs(), "pulling again from the peer");
            }
            tokio::select! {
                _ = cancel.cancelled() => return Err(PullError::Cancelled),
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Limits, MountSpec};

    fn assignment(mounts: Vec<(MountSource, &str, bool)>) -> Assignment {
        let mounts = mounts
            .into_iter()
            .map(|(source, sub_path, read_only)| MountSpec {
                drive: "food101".into(),
                source,
                sub_path: sub_path.into(),
                target: "/drive".into(),
                read_only,
            })
            .collect();
        Assignment {
            uid: Uuid::now_v7(),
            name: "fill-food101-gpu-02-0".into(),
            run: "fill-food101-gpu-02".into(),
            namespace: "default".into(),
            state: WorkerState::Pending,
            image: String::new(),
            command: String::new(),
            args: vec![],
            env: Default::default(),
            time_limit_seconds: None,
            mounts,
            resources: Limits { cpu_cores: 1.0, memory_bytes: 1 << 30, gpus: 0 },
            id_slot: 1,
            fill: true,
            image_pull_auth: None,
            peer: None,
        }
    }

    fn source(manifest: &str) -> PeerSource {
        PeerSource {
            address: "http://10.0.0.5:7070".into(),
            machine: "gpu-01".into(),
            manifest: manifest.into(),
            token: "t".into(),
        }
    }

    #[test]
    fn a_peer_fill_pulls_into_the_one_copy_it_mounts_whole_and_read_write() {
        let (drive, other) = (Uuid::now_v7(), Uuid::now_v7());
        let copy = |folder: &str, id| MountSource::Copy { folder: folder.into(), drive_id: id };
        let host = MountSource::Host { path: "/scratch".into(), grant: None, grant_mode: Default::default() };
        let digest = "ab".repeat(32);
        let order = order(
            &assignment(vec![
                (copy("default.imagenet", other), "", true),
                (host.clone(), "", false),
                (copy("default.food101", drive), "", false),
            ]),
            &source(&digest),
        )
        .unwrap();
        assert_eq!((order.folder.as_str(), order.drive_id), ("default.food101", drive));
        assert_eq!((order.source.as_str(), order.token.as_str()), ("http://10.0.0.5:7070", "t"));
        assert_eq!(order.digest.to_string(), digest);

        let none = "a fill from a peer mounts exactly one drive's whole copy read-write";
        let refused = [
            (vec![(copy("default.food101", drive), "", true)], digest.as_str(), none),
            (vec![(copy("default.food101", drive), "train", false)], &digest, none),
            (vec![(host, "", false)], &digest, none),
            (
                vec![(copy("default.food101", drive), "", false), (copy("default.x", other), "", false)],
                &digest,
                none,
            ),
            (
                vec![(copy("default.food101", drive), "", false)],
                "not-hex",
                "the manifest digest of gpu-01's copy",
            ),
        ];
        for (mounts, manifest, why) in refused {
            let err = super::order(&assignment(mounts), &source(manifest)).unwrap_err();
            assert!(err.starts_with(why), "{err}");
        }
    }
}
