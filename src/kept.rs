//! Rows kept in memory by key once read from Postgres, for the rows a hot path reads again and
//! again and that change seldom or never: the drives and run specs every answer to a machine's
//! long-poll names (read from Postgres, those were about 28,000 statements over a placement at
//! 10,000 machines, and as many parses of each run's spec per worker).
//!
//! Whoever keeps rows that can change forgets them all when they do ([`Kept::forget_all`], on a
//! notification); a row read before that is not kept after it.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

/// Past this many rows, all are forgotten and read again as they are asked for.
const CAPACITY: usize = 10_000;

pub struct Kept<K, V> {
    inner: Mutex<Inner<K, V>>,
}

struct Inner<K, V> {
    /// Bumped by every [`Kept::forget_all`]: rows read before it are not kept after it.
    generation: u64,
    rows: HashMap<K, Arc<V>>,
}

impl<K, V> Default for Kept<K, V> {
    fn default() -> Self {
        Kept { inner: Mutex::new(Inner { generation: 0, rows: HashMap::new() }) }
    }
}

impl<K: Eq + Hash + Clone, V> Kept<K, V> {
    /// The rows of `keys`: those kept, and the others from `read`, given the keys missing.
    pub async fn get_or_read<E, Fut>(
        &self,
        keys: impl IntoIterator<Item = K>,
        read: impl FnOnce(Vec<K>) -> Fut,
    ) -> Result<HashMap<K, Arc<V>>, E>
    where
        Fut: Future<Output = Result<Vec<(K, V)>, E>>,
    {
        let keys: Vec<K> = keys.into_iter().collect::<HashSet<K>>().into_iter().collect();
        let (mut known, missing, generation) = self.lookup(&keys);
        if !missing.is_empty() {
            let read: Vec<(K, Arc<V>)> =
                read(missing).await?.into_iter().map(|(k, v)| (k, Arc::new(v))).collect();
            self.remember(generation, read.iter().cloned());
            known.extend(read);
        }
        Ok(known)
    }

    /// The rows kept of `keys`, the keys to read from Postgres, and the generation to pass to
    /// [`Kept::remember`] (taken before Postgres is asked).
    pub fn lookup(&self, keys: &[K]) -> (HashMap<K, Arc<V>>, Vec<K>, u64) {
        let inner = self.inner.lock().expect("not poisoned");
        let (mut known, mut missing) = (HashMap::new(), Vec::new());
        for key in keys {
            match inner.rows.get(key) {
                Some(row) => {
                    known.insert(key.clone(), Arc::clone(row));
                }
                None => missing.push(key.clone()),
            }
        }
        (known, missing, inner.generation)
    }

    /// Keeps rows read from Postgres, unless they were forgotten since `generation` was taken.
    pub fn remember(&self, generation: u64, read: impl IntoIterator<Item = (K, Arc<V>)>) {
        let mut inner = self.inner.lock().expect("not poisoned");
        if inner.generation != generation {
            return;
        }
        let read: Vec<(K, Arc<V>)> = read.into_iter().collect();
        if inner.rows.len() + read.len() > CAPACITY {
            inner.rows.clear();
        }
        inner.rows.extend(read);
    }

    /// After a row kept changed, or notifications may have been missed.
    pub fn forget_all(&self) {
        let mut inner = self.inner.lock().expect("not poisoned");
        inner.generation += 1;
        inner.rows.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::run::RunSpec;
    use crate::store::drives::DriveRecord;
    use sqlx::types::Json;
    use uuid::Uuid;

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
        let cache: Kept<(Uuid, String), DriveRecord> = Kept::default();
        let key = (Uuid::nil(), "imagenet".to_string());
        let (known, missing, generation) = cache.lookup(std::slice::from_ref(&key));
        assert!(known.is_empty());
        assert_eq!(missing, vec![key.clone()]);

        let first = record("imagenet");
        cache.remember(generation, [(key.clone(), Arc::clone(&first))]);
        let (known, missing, generation) = cache.lookup(std::slice::from_ref(&key));
        assert_eq!(known.values().map(|r| r.id).collect::<Vec<_>>(), vec![first.id]);
        assert!(missing.is_empty());

        // Deleted and made again between a read from Postgres and its remembering.
        cache.forget_all();
        cache.remember(generation, [(key.clone(), Arc::clone(&first))]);
        let (known, missing, generation) = cache.lookup(std::slice::from_ref(&key));
        assert!(known.is_empty(), "a record read before the change was kept");
        assert_eq!(missing, vec![key.clone()]);

        let second = record("imagenet");
        cache.remember(generation, [(key.clone(), Arc::clone(&second))]);
        let (known, _, _) = cache.lookup(&[key]);
        assert_eq!(known.values().map(|r| r.id).collect::<Vec<_>>(), vec![second.id]);
    }

    fn spec() -> Arc<RunSpec> {
        let spec = serde_json::json!({
            "task_template": {
                "image": "python:3.12-slim", "command": "python", "args": ["train.py"],
                "requested_resources": {"cpu_cores": 2, "memory_bytes": 4294967296u64}
            },
        });
        Arc::new(serde_json::from_value(spec).expect("a run spec"))
    }

    #[test]
    fn a_spec_once_read_is_known_and_all_are_forgotten_past_the_bound() {
        let specs: Kept<Uuid, RunSpec> = Kept::default();
        let (first, second) = (Uuid::now_v7(), Uuid::now_v7());
        let (known, missing, generation) = specs.lookup(&[first, second]);
        assert!(known.is_empty());
        assert_eq!(missing, vec![first, second]);

        specs.remember(generation, [(first, spec())]);
        let (known, missing, generation) = specs.lookup(&[first, second]);
        assert_eq!(known.keys().collect::<Vec<_>>(), vec![&first]);
        assert_eq!(missing, vec![second]);

        let many: HashMap<Uuid, Arc<RunSpec>> = (0..CAPACITY).map(|_| (Uuid::now_v7(), spec())).collect();
        specs.remember(generation, many.clone());
        let (known, missing, _) = specs.lookup(&[first]);
        assert!(known.is_empty(), "the bound was passed, so the older specs were forgotten");
        assert_eq!(missing, vec![first]);
        let some = *many.keys().next().expect("one");
        assert!(specs.lookup(&[some]).1.is_empty(), "the specs just read are kept");
    }

    #[tokio::test]
    async fn only_the_missing_rows_are_read_and_a_read_raced_by_a_change_is_not_kept() {
        let kept: Kept<u32, String> = Kept::default();
        let read = |keys: Vec<u32>| async move {
            Ok::<_, ()>(keys.into_iter().map(|k| (k, format!("row {k}"))).collect::<Vec<_>>())
        };
        let rows = kept.get_or_read([1, 2, 2], read).await.unwrap();
        assert_eq!(rows.len(), 2);
        let rows = kept
            .get_or_read([1, 2, 3], |keys| async move {
                assert_eq!(keys, vec![3], "only the row not kept is read");
                read(keys).await
            })
            .await
            .unwrap();
        assert_eq!(rows[&3].as_str(), "row 3");

        let rows = kept
            .get_or_read([4], |keys| {
                kept.forget_all();
                read(keys)
            })
            .await
            .unwrap();
        assert_eq!(rows[&4].as_str(), "row 4", "the row read is answered");
        assert_eq!(kept.lookup(&[1, 4]).1, vec![1, 4], "nothing read before the change is kept");
    }
}
