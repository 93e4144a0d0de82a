//! The drives that agents' assignments name, kept in memory.
//!
//! Every answer to a machine's long-poll resolves its workers' mounts to drive records: read
//! from Postgres, that was about 28,000 statements over a placement at 10,000 machines. A drive
//! row is never updated, so a record read once stays true until its drive is deleted. A trigger
//! announces every deletion (and any update, should one ever be made) on
//! `astraeus_drive_changed`, which forgets every record on every replica; so does a reconnection
//! of the notification listener.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use uuid::Uuid;

use crate::store::drives::DriveRecord;

/// Past this many records, all are forgotten: there are seldom more drives than this.
const CAPACITY: usize = 10_000;

/// A drive's key in an assignment: the workspace and the name its run mounts it by.
pub type Key = (Uuid, String);

#[derive(Default)]
pub struct DriveCache {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Bumped by every [`DriveCache::forget_all`]: records read before it are not kept after it.
    generation: u64,
    records: HashMap<Key, Arc<DriveRecord>>,
}

impl DriveCache {
    /// The records known of `keys`, and the keys to read from Postgres, with the generation to
    /// pass to [`DriveCache::remember`] (read before Postgres is asked).
    pub fn lookup(&self, keys: &[Key]) -> (Vec<Arc<DriveRecord>>, Vec<Key>, u64) {
        let inner = self.inner.lock().expect("not poisoned");
        let (mut known, mut missing) = (Vec::new(), Vec::new());
        for key in keys {
            match inner.records.get(key) {
                Some(record) => known.push(Arc::clone(record)),
                None => missing.push(key.clone()),
            }
        }
        (known, missing, inner.generation)
    }

    /// Keeps records read from Postgres, unless a drive changed since `generation` was read.
    pub fn remember(&self, generation: u64, records: &[Arc<DriveRecord>]) {
        let mut inner = self.inner.lock().expect("not poisoned");
        if inner.generation != generation {
            return;
        }
        if inner.records.len() + records.len() > CAPACITY {
            inner.records.clear();
        }
        for r in records {
            inner.records.insert((r.workspace_id, r.name.clone()), Arc::clone(r));
        }
    }

    /// After a drive changed or notifications may have been missed.
    pub fn forget_all(&self) {
        let mut inner = self.inner.lock().expect("not poisoned");
        inner.generation += 1;
        inner.records.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlx::types::Json;

    fn record(name: &str) -> Arc<DriveRecord> {
        let spec = serde_json::json!({
            "sources": [{"node_scope": "placed", "path": "", "mount_path": "/data", "mode": "ReadOnly"}],
        });
        Arc::new(DriveRecord {
            id: Uuid::now_v7(),
            workspace_id: Uuid::nil(),
            name: name.into(),
            labels: Json(Default::default()),
            spec: Json(serde_json::from_value(spec).expect("a drive spec")),
            created_at: chrono::Utc::now(),
        })
    }

    #[test]
    fn a_record_read_before_a_drive_changed_is_not_kept() {
        let cache = DriveCache::default();
        let key = (Uuid::nil(), "imagenet".to_string());
        let (known, missing, generation) = cache.lookup(std::slice::from_ref(&key));
        assert!(known.is_empty());
        assert_eq!(missing, vec![key.clone()]);

        let first = record("imagenet");
        cache.remember(generation, std::slice::from_ref(&first));
        let (known, missing, generation) = cache.lookup(std::slice::from_ref(&key));
        assert_eq!(known.iter().map(|r| r.id).collect::<Vec<_>>(), vec![first.id]);
        assert!(missing.is_empty());

        // Deleted and made again between a read from Postgres and its remembering.
        cache.forget_all();
        cache.remember(generation, std::slice::from_ref(&first));
        let (known, missing, generation) = cache.lookup(std::slice::from_ref(&key));
        assert!(known.is_empty(), "a record read before the change was kept");
        assert_eq!(missing, vec![key.clone()]);

        let second = record("imagenet");
        cache.remember(generation, std::slice::from_ref(&second));
        let (known, _, _) = cache.lookup(&[key]);
        assert_eq!(known.iter().map(|r| r.id).collect::<Vec<_>>(), vec![second.id]);
    }
}
