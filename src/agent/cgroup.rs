//! A worker's parent cgroup, `astraeus/<worker>`, kept by the agent around podman's own.
//!
//! Podman removes a container's cgroup when it ends, and with it the count of processes the
//! kernel killed for memory; podman 4.3 with runc on cgroup v1 does not record it either. The
//! parent outlives the container, so the agent reads it there, then removes the parent.

use std::path::{Path, PathBuf};

use uuid::Uuid;

const ROOT: &str = "/sys/fs/cgroup";

/// The `--cgroup-parent` for a worker's container.
pub fn parent(worker: Uuid) -> String {
    format!("/astraeus/{worker}")
}

/// Whether the host has the unified hierarchy only (cgroup v2).
fn unified() -> bool {
    Path::new(ROOT).join("cgroup.controllers").exists()
}

/// The parent's folders: one in each v1 hierarchy, or the one v2 folder.
fn folders(worker: Uuid) -> Vec<PathBuf> {
    let rel = format!("astraeus/{worker}");
    if unified() {
        return vec![Path::new(ROOT).join(rel)];
    }
    let Ok(entries) = std::fs::read_dir(ROOT) else { return vec![] };
    entries.flatten().map(|e| e.path().join(&rel)).filter(|p| p.is_dir()).collect()
}

/// Whether the kernel killed a process of the worker for going over `limit` bytes.
pub fn oom_killed(worker: Uuid, limit: u64) -> bool {
    let rel = format!("astraeus/{worker}");
    if unified() {
        // v2 counts kills in the parent too (memory.events is hierarchical).
        let events =
            std::fs::read_to_string(Path::new(ROOT).join(rel).join("memory.events")).unwrap_or_default();
        return oom_kills(&events) > 0;
    }
    // v1 keeps the count in the cgroup whose limit was hit only, which is gone; the parent's
    // peak shows the worker reached its limit.
    let peak =
        std::fs::read_to_string(Path::new(ROOT).join("memory").join(rel).join("memory.max_usage_in_bytes"));
    peak.ok().and_then(|p| p.trim().parse::<u64>().ok()).is_some_and(|p| p >= limit)
}

/// `oom_kill N` from a v2 `memory.events`.
fn oom_kills(events: &str) -> u64 {
    events.lines().find_map(|l| l.strip_prefix("oom_kill ")).and_then(|n| n.trim().parse().ok()).unwrap_or(0)
}

/// Removes the worker's parent cgroup once its container is gone, with the `conmon` cgroup
/// podman makes beside the container's. A cgroup is removed with `rmdir`, only when empty.
pub fn remove(worker: Uuid) {
    for folder in folders(worker) {
        let children = std::fs::read_dir(&folder).into_iter().flatten().flatten();
        for child in children.filter(|c| c.file_type().is_ok_and(|t| t.is_dir())) {
            let _ = std::fs::remove_dir(child.path());
        }
        if let Err(e) = std::fs::remove_dir(&folder) {
            tracing::debug!(path = %folder.display(), error = %e, "cannot remove a worker's cgroup");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oom_kills_are_read_from_memory_events() {
        assert_eq!(oom_kills("low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 0\n"), 1);
        assert_eq!(oom_kills("low 0\noom 0\noom_kill 0\n"), 0);
        assert_eq!(oom_kills(""), 0);
    }
}
