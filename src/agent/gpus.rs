//! This machine's GPUs: each worker gets indices of its own, never shared while it lives.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Mutex;

/// Where CDI specs live (the CDI specification's own defaults, which podman reads).
const CDI_DIRS: [&str; 2] = ["/etc/cdi", "/var/run/cdi"];

#[derive(Debug)]
pub struct Gpus {
    free: Mutex<BTreeSet<u32>>,
}

impl Gpus {
    pub fn new(count: u32) -> Gpus {
        Gpus { free: Mutex::new((0..count).collect()) }
    }

    /// The `n` lowest free indices, taken; `None` (and nothing taken) when fewer are free.
    pub fn take(&self, n: u32) -> Option<Vec<u32>> {
        let mut free = self.free.lock().expect("not poisoned");
        if (free.len() as u64) < u64::from(n) {
            return None;
        }
        Some((0..n).filter_map(|_| free.pop_first()).collect())
    }

    pub fn give_back(&self, indices: &[u32]) {
        self.free.lock().expect("not poisoned").extend(indices);
    }

    /// Marks indices a container found at start already holds.
    pub fn claim(&self, indices: &[u32]) {
        let mut free = self.free.lock().expect("not poisoned");
        for i in indices {
            free.remove(i);
        }
    }
}

/// Whether a CDI spec on this host names devices of `kind` (e.g. `nvidia.com/gpu`).
pub fn cdi_has_kind(kind: &str) -> bool {
    CDI_DIRS.iter().any(|dir| dir_has_kind(Path::new(dir), kind))
}

fn dir_has_kind(dir: &Path, kind: &str) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else { return false };
    entries.flatten().any(|e| {
        let text = std::fs::read_to_string(e.path()).unwrap_or_default();
        if let Ok(spec) = serde_json::from_str::<serde_json::Value>(&text) {
            return spec["kind"] == kind;
        }
        // YAML: a top-level `kind: x`, quoted or not.
        text.lines()
            .any(|l| l.strip_prefix("kind:").is_some_and(|v| v.trim().trim_matches(['"', '\'']) == kind))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_get_distinct_indices_and_none_when_too_few_are_free() {
        let gpus = Gpus::new(4);
        let a = gpus.take(2).unwrap();
        let b = gpus.take(1).unwrap();
        assert_eq!((a.clone(), b.clone()), (vec![0, 1], vec![2]));
        assert_eq!(gpus.take(2), None);
        gpus.give_back(&a);
        assert_eq!(gpus.take(3).unwrap(), vec![0, 1, 3]);
        assert_eq!(gpus.take(0).unwrap(), Vec::<u32>::new());
    }

    #[test]
    fn a_spec_names_its_kind_in_json_or_yaml() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("a.json"),
            r#"{"cdiVersion":"0.5.0","kind":"vendor.example/gpu","devices":[]}"#,
        )
        .unwrap();
        assert!(dir_has_kind(dir.path(), "vendor.example/gpu"));
        assert!(!dir_has_kind(dir.path(), "nvidia.com/gpu"));
        std::fs::write(dir.path().join("b.yaml"), "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\n").unwrap();
        assert!(dir_has_kind(dir.path(), "nvidia.com/gpu"));
    }
}
