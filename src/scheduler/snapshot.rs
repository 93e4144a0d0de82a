//! What the scheduler decides over: plain structs, read from Postgres by the shell.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use serde::Deserialize;
use uuid::Uuid;

pub use crate::domain::copy::CopyState;
use crate::domain::drive::{NodeScope, Transport};
use crate::domain::task::{NodeSelection, SelectionMode};

/// A value per drive, looked up for every machine a pass weighs for every worker: hashed with
/// FxHash, cheaper than the default SipHash, whose resistance to chosen keys is not needed here
/// (drive ids are made by the server).
pub type ByDrive<V> = HashMap<Uuid, V, rustc_hash::FxBuildHasher>;

/// A machine as placement sees it.
#[derive(Debug, Clone)]
pub struct MachineView {
    pub id: Uuid,
    pub name: String,
    pub cluster: String,
    pub ready: bool,
    /// Takes no new workers but fills.
    pub cordoned: bool,
    pub transports: Vec<String>,
    pub cpu_total: i64,
    pub memory_total: i64,
    pub gpus_total: i64,
    pub cpu_free: i64,
    pub memory_free: i64,
    pub gpus_free: i64,
    /// Room for new copies in the confirmed data location; `None` when none is confirmed.
    pub data_free: Option<i64>,
    /// What evicting its unused, evictable, whole copies would free.
    pub reclaimable: i64,
    /// Its copies whole or being filled, of any drive: data other workers may come back for.
    pub held: i64,
    /// Room freed by the pass's own evictions: counted in `data_free`, but not free on disk
    /// until the agent has removed the copies, so the score leaves it out.
    pub freed: i64,
    /// The images it holds, of those the pass's workers run (full names).
    pub images: Vec<String>,
    /// The states of its copies of the drives the pass's workers mount, by drive: a pass
    /// weighs no other copy one by one.
    pub copies: ByDrive<CopyState>,
    /// Bytes written so far of those of `copies` being filled, where known.
    pub filled: ByDrive<i64>,
    /// How fast its fills write, in bytes a second, as last measured; `None` before one was.
    pub fill_rate: Option<i64>,
}

/// A copy as eviction weighs it.
#[derive(Debug, Clone)]
pub struct CopyView {
    pub state: CopyState,
    pub bytes: i64,
    pub size_hint: i64,
    pub evictable: bool,
    /// A worker that has not ended mounts it (known for drives with a whole, evictable copy).
    pub in_use: bool,
    pub last_used_at: Option<DateTime<Utc>>,
}

/// A drive a worker mounts, as placement needs it.
#[derive(Debug, Clone, Deserialize)]
pub struct DriveNeed {
    pub id: Uuid,
    /// The drive's name, as reasons say it.
    pub name: String,
    /// `<namespace>.<drive>`.
    pub full: String,
    /// `placed`, `shared` or absent for a drive on one machine.
    pub scope: Option<NodeScope>,
    /// The machine of a drive on one machine.
    pub node: Option<String>,
    /// `Local` pins the worker to `node`.
    pub transport: Transport,
    pub size_hint: i64,
    pub evictable: bool,
    /// The host path of a drive on one machine or a shared filesystem.
    #[serde(default)]
    pub host_path: Option<String>,
}

impl DriveNeed {
    pub fn is_placed(&self) -> bool {
        self.scope == Some(NodeScope::Placed)
    }
}

/// What one worker asks for.
#[derive(Debug, Clone)]
pub struct Request {
    pub cluster: String,
    pub cpu_millis: i64,
    pub memory_bytes: i64,
    pub gpus: i64,
    pub selection: NodeSelection,
    pub drives: Vec<DriveNeed>,
    /// A fill's worker, which serves workers already on its machine.
    pub fill: bool,
    /// The image it runs, by full name; `None` for a floating tag, pulled again anyway.
    pub image: Option<String>,
}

impl Request {
    pub fn selects(&self, machine: &str) -> bool {
        match self.selection.mode {
            SelectionMode::Any => true,
            SelectionMode::Exact => self.selection.names.iter().any(|n| n.as_str() == machine),
        }
    }

    /// The machines it is limited to, when it names them.
    pub fn named(&self) -> Option<impl Iterator<Item = &str>> {
        match self.selection.mode {
            SelectionMode::Any => None,
            SelectionMode::Exact => Some(self.selection.names.iter().map(|n| n.as_str())),
        }
    }

    pub fn placed(&self) -> impl Iterator<Item = &DriveNeed> {
        self.drives.iter().filter(|d| d.is_placed())
    }
}

impl MachineView {
    /// Takes a bound worker's resources, so later decisions in the same pass see them gone.
    pub fn take(&mut self, cpu_millis: i64, memory_bytes: i64, gpus: i64) {
        self.cpu_free -= cpu_millis;
        self.memory_free -= memory_bytes;
        self.gpus_free -= gpus;
    }

    pub fn holds_image(&self, r: &Request) -> bool {
        r.image.as_ref().is_some_and(|i| self.images.contains(i))
    }

    pub fn copy_state(&self, drive: Uuid) -> Option<CopyState> {
        self.copies.get(&drive).copied()
    }
}

/// The scheduler's order of machines, by cluster, then name, byte by byte: ties go to the first.
pub fn placement_order(a: &MachineView, b: &MachineView) -> std::cmp::Ordering {
    (&a.cluster, &a.name).cmp(&(&b.cluster, &b.name))
}

pub fn is_evictable(c: &CopyView) -> bool {
    c.evictable && c.state == CopyState::Complete && !c.in_use
}

/// Room for new copies: what the disk has free, within the location's limit less what the
/// copies hold (`used`), less what copies being filled were promised and have not written yet.
pub fn data_free(disk_free: i64, limit: Option<i64>, used: i64, promised: i64) -> i64 {
    let within_limit = limit.map_or(disk_free, |l| disk_free.min(l - used));
    within_limit - promised
}

#[cfg(test)]
mod tests {
    use super::*;

    fn copy(state: CopyState, evictable: bool, in_use: bool) -> CopyView {
        CopyView { state, bytes: 1_000, size_hint: 1_000, evictable, in_use, last_used_at: None }
    }

    #[test]
    fn room_counts_the_limit_and_what_fills_were_promised() {
        // A whole copy of 3_000 and one being filled, 1_000 of 6_000 written: 4_000 used,
        // 5_000 promised.
        // No limit: 100_000 free on disk, less 5_000 promised = 95_000.
        assert_eq!(data_free(100_000, None, 4_000, 5_000), 95_000);
        // Limit 10_000: 10_000 - 4_000 used = 6_000, less 5_000 promised = 1_000.
        assert_eq!(data_free(100_000, Some(10_000), 4_000, 5_000), 1_000);
        // The disk is the tighter bound: 2_000 free, less 5_000 promised = -3_000.
        assert_eq!(data_free(2_000, Some(10_000), 4_000, 5_000), -3_000);
    }

    #[test]
    fn only_whole_unused_evictable_copies_are_evictable() {
        assert!(is_evictable(&copy(CopyState::Complete, true, false)));
        assert!(!is_evictable(&copy(CopyState::Complete, true, true)), "in use");
        assert!(!is_evictable(&copy(CopyState::Complete, false, false)), "not evictable");
        for state in [CopyState::Filling, CopyState::Failed, CopyState::Evicting] {
            assert!(!is_evictable(&copy(state, true, false)), "{state:?}");
        }
    }
}
