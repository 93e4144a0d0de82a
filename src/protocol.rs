//! The agent protocol: what agents and the server send each other over `/agent/v1`.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::domain::Name;
use crate::domain::machine::TransferLimits;
use crate::domain::quantity::CpuCores;
use crate::domain::run::WorkerState;

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Capacity {
    pub cpu_cores: CpuCores,
    pub memory_bytes: u64,
    #[serde(default)]
    pub gpus: u32,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct JoinRequest {
    pub join_token: String,
    pub name: Name,
    #[serde(default = "default_pool")]
    pub pool: Name,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub transports: Vec<String>,
    pub capacity: Capacity,
    /// Where the agent proposes to keep copies; an admin confirms it.
    pub data_location: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct JoinResponse {
    pub credential: String,
    pub machine: String,
    pub cluster: String,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HeartbeatRequest {
    pub data_location: DataUsage,
    #[serde(default)]
    pub copies: Vec<CopyReport>,
    /// The container images the machine holds; sent only when they changed since the last
    /// heartbeat the server answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub images: Option<Vec<ImageReport>>,
    /// Where this agent serves its whole copies to peers (`http://host:port`, its
    /// `--data-listen`); sent only when it changed since the last heartbeat the server answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_address: Option<String>,
}

/// A container image the machine holds.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ImageReport {
    /// Its first name, such as `docker.io/library/busybox:1.36`; `<none>` when it has none.
    pub name: String,
    /// The manifest's digest, `sha256:…`.
    pub digest: String,
    pub bytes: u64,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DataUsage {
    pub total_bytes: u64,
    pub used_bytes: u64,
    pub free_bytes: u64,
    /// Free space the agent keeps on the disk (`--data-reserve-bytes`): below it, the server
    /// evicts unused copies.
    #[serde(default)]
    pub reserve_bytes: u64,
}

/// A copy as the agent finds it on disk.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CopyReport {
    /// `<namespace>.<drive>`: the copy's folder name under `drives/`.
    pub drive: String,
    /// The id of the drive the folder was made for (its `.astraeus-drive`); `None` for a folder
    /// without one, which is no drive's copy.
    #[serde(default)]
    pub drive_id: Option<Uuid>,
    pub bytes: u64,
    /// Whether `.astralyx-filled` is present.
    pub complete: bool,
    /// Whether `bytes` count the whole copy: a walk begun after the marker measured them.
    /// Until then the server counts a complete copy's room by its size hint, so that the
    /// moments between a fill's end and its measure place nothing in room it takes.
    #[serde(default = "whole_measured")]
    pub measured: bool,
    pub last_used_at: Option<DateTime<Utc>>,
    /// The digest (BLAKE3, hex) of the copy's manifest, once the agent has made it: what a peer
    /// receiving the copy checks the manifest it is sent against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest: Option<String>,
    /// What a copy that was whole lost since its manifest was made: such a copy is reported
    /// not complete, its marker notwithstanding, and is filled again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lost: Option<LostFiles>,
}

pub use crate::domain::copy::LostFiles;

fn whole_measured() -> bool {
    true
}

#[derive(Debug, Serialize, Deserialize)]
pub struct HeartbeatResponse {
    /// The confirmed data location; `None` until an admin confirms one.
    pub data_location: Option<String>,
    pub data_limit_bytes: Option<i64>,
    /// Copies (folder names) the agent should delete, each as the heartbeat reported it: the
    /// agent leaves a folder made since for another drive of the same name.
    pub delete_copies: Vec<String>,
    /// What an organisation admin lets the agent send to peers and receive from them.
    #[serde(default)]
    pub transfer_limits: TransferLimits,
}

/// The server's public verifying keys, oldest first: what a holder checks transfer tokens with.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerKeys {
    pub keys: Vec<crate::auth::public::PublicKey>,
}

/// The entity tag of a machine's assignments at `version`. An agent that holds that answer
/// sends it in `If-None-Match` and gets `304 Not Modified` while nothing has changed, instead
/// of every assigned worker again.
pub fn assignments_tag(version: i64) -> String {
    format!("\"{version}\"")
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Assignments {
    pub version: i64,
    pub workers: Vec<Assignment>,
    /// The machine's confirmed data location as of this answer, where the workers' copies live.
    /// A worker can be assigned before the next heartbeat tells the agent of a new confirmation.
    #[serde(default)]
    pub data_location: Option<String>,
    /// Set when the workers did not fit in one answer: ask again with `after` set to this
    /// for the next part, and act on the whole list once the last part has come.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<Uuid>,
}

/// A worker the agent should be running, with everything it needs to run it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Assignment {
    pub uid: Uuid,
    pub name: String,
    pub run: String,
    pub namespace: String,
    pub state: WorkerState,
    pub image: String,
    pub command: String,
    pub args: Vec<String>,
    /// The task's environment, secrets included.
    pub env: BTreeMap<String, String>,
    pub time_limit_seconds: Option<u64>,
    pub mounts: Vec<MountSpec>,
    /// What the worker may use, enforced by its container's cgroups.
    pub resources: Limits,
    /// The workspace's number: its containers run as a range of host user ids of their own.
    pub id_slot: u32,
    /// A fill's worker. Found Running by an agent that restarted, a fill runs again (its copy
    /// is whole only once it writes the marker); any other worker fails.
    #[serde(default)]
    pub fill: bool,
    /// The registry auth file from the task's image_pull_secret; absent when it has none.
    #[serde(default)]
    pub image_pull_auth: Option<String>,
    /// A fill that pulls its copy from a peer holding a whole one, instead of running its image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<PeerSource>,
}

/// A fresh transfer token for a fill that pulls from a peer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TransferToken {
    pub token: String,
}

/// The peer a fill pulls its copy from.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PeerSource {
    /// The holder's data port, as its agent reported it (`http://host:port`).
    pub address: String,
    /// The holder's name, for messages.
    pub machine: String,
    /// The digest of the holder's manifest, which the copy received must match.
    pub manifest: String,
    /// A transfer token for this drive, from that holder to this machine; a fresh one comes
    /// from `POST /agent/v1/workers/{id}/transfer-token`.
    pub token: String,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Limits {
    pub cpu_cores: f64,
    pub memory_bytes: u64,
    pub gpus: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MountSpec {
    pub drive: String,
    pub source: MountSource,
    /// Relative path below the source, resolved by the agent without following symlinks.
    pub sub_path: String,
    pub target: String,
    pub read_only: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum MountSource {
    /// The drive's copy in this machine's data location: `<data location>/drives/<folder>`, made
    /// for the drive `drive_id` (a drive made again with the same name never reads it).
    Copy { folder: String, drive_id: Uuid },
    /// A path on this machine, beneath the granted folder `grant` that covers it (absent when
    /// no grant of the workspace covers it any more: the agent then refuses the mount). The
    /// agent resolves the rest beneath `grant` without following symlinks, and mounts it
    /// read-only unless `grant_mode` is `ReadWrite`.
    Host {
        path: String,
        #[serde(default)]
        grant: Option<String>,
        #[serde(default)]
        grant_mode: crate::domain::task::Mode,
    },
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct StatusReport {
    /// `Preparing` (with why, e.g. pulling its image), `Running`, `Completed` or `Failed`.
    pub state: WorkerState,
    pub exit_code: Option<i32>,
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub events: Vec<EventReport>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EventReport {
    #[serde(rename = "type")]
    pub kind: String,
    pub reason: String,
    pub message: String,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Ack {
    /// False when the server no longer expects the worker on this machine: stop it. Log lines
    /// the server drops past a bound in bytes are still accepted: nothing is to be sent again.
    pub accepted: bool,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LogUpload {
    pub lines: Vec<LogLineIn>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LogLineIn {
    /// `stdout` or `stderr`.
    pub stream: String,
    pub line: String,
}

fn default_pool() -> Name {
    Name::parse("default").expect("a valid name")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_report_takes_a_manifest_digest_and_goes_without_one() {
        let digest = "a".repeat(64);
        let with = format!(
            r#"{{"drive":"default.food101","bytes":1,"complete":true,"last_used_at":null,"manifest":"{digest}"}}"#
        );
        let copy: CopyReport = serde_json::from_str(&with).unwrap();
        assert_eq!(copy.manifest.as_deref(), Some(digest.as_str()));
        let without: CopyReport = serde_json::from_str(
            r#"{"drive":"default.food101","bytes":1,"complete":true,"last_used_at":null}"#,
        )
        .unwrap();
        assert_eq!(without.manifest, None);
        // Absent, it is not sent: a server that does not know the field still takes the report.
        assert!(!serde_json::to_string(&without).unwrap().contains("manifest"));
        let other = with.replace("manifest", "manifests");
        assert!(serde_json::from_str::<CopyReport>(&other).is_err(), "unknown fields are still refused");
    }
}
