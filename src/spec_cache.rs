//! The specs of the runs whose workers agents are given, kept in memory.
//!
//! Every answer to a machine's long-poll needs the run spec of each of its workers; read with
//! the workers, the same spec came from Postgres as JSON and was parsed once per worker, about
//! 200,000 times over a placement at 10,000 machines. A run's spec is never changed once the run
//! is made and a run's id is never used again, so a spec read once stays true: nothing needs to
//! forget one but the bound on memory.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use uuid::Uuid;

use crate::domain::run::RunSpec;

/// Past this many specs, all are forgotten and read again as they are asked for.
const CAPACITY: usize = 10_000;

#[derive(Default)]
pub struct RunSpecs {
    specs: Mutex<HashMap<Uuid, Arc<RunSpec>>>,
}

impl RunSpecs {
    /// The specs known of `runs`, and the runs whose specs are to be read from Postgres.
    pub fn lookup(&self, runs: &[Uuid]) -> (HashMap<Uuid, Arc<RunSpec>>, Vec<Uuid>) {
        let specs = self.specs.lock().expect("not poisoned");
        let (mut known, mut missing) = (HashMap::new(), Vec::new());
        for run in runs {
            match specs.get(run) {
                Some(spec) => {
                    known.insert(*run, Arc::clone(spec));
                }
                None => missing.push(*run),
            }
        }
        (known, missing)
    }

    pub fn remember(&self, read: &HashMap<Uuid, Arc<RunSpec>>) {
        let mut specs = self.specs.lock().expect("not poisoned");
        if specs.len() + read.len() > CAPACITY {
            specs.clear();
        }
        specs.extend(read.iter().map(|(run, spec)| (*run, Arc::clone(spec))));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let specs = RunSpecs::default();
        let (first, second) = (Uuid::now_v7(), Uuid::now_v7());
        let (known, missing) = specs.lookup(&[first, second]);
        assert!(known.is_empty());
        assert_eq!(missing, vec![first, second]);

        specs.remember(&HashMap::from([(first, spec())]));
        let (known, missing) = specs.lookup(&[first, second]);
        assert_eq!(known.keys().collect::<Vec<_>>(), vec![&first]);
        assert_eq!(missing, vec![second]);

        let many: HashMap<Uuid, Arc<RunSpec>> = (0..CAPACITY).map(|_| (Uuid::now_v7(), spec())).collect();
        specs.remember(&many);
        let (known, missing) = specs.lookup(&[first]);
        assert!(known.is_empty(), "the bound was passed, so the older specs were forgotten");
        assert_eq!(missing, vec![first]);
        let some = *many.keys().next().expect("one");
        assert!(specs.lookup(&[some]).1.is_empty(), "the specs just read are kept");
    }
}
