//! Runs and their workers: the spec users submit, and the states they move through.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::drive::default_cluster;
use super::task::TaskTemplate;
use super::{Name, Problems};

const MAX_REPLICAS: u32 = 1000;
/// Bytes of task a run may hand out across its workers: what one workspace's run may make
/// the server and the machines hold, whatever its replicas.
pub const MAX_RUN_BYTES: usize = 16 << 20;

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RunSpec {
    #[serde(default = "default_cluster")]
    pub cluster: Name,
    /// How many workers (`<run>-0` …) run the task.
    #[serde(default = "one")]
    #[schema(minimum = 1, maximum = 1000, default = 1)]
    pub replicas: u32,
    pub task_template: TaskTemplate,
}

fn one() -> u32 {
    1
}

impl RunSpec {
    pub fn check(&self, p: &mut Problems) {
        if self.replicas == 0 || self.replicas > MAX_REPLICAS {
            p.add("spec.replicas", format!("must be between 1 and {MAX_REPLICAS}"));
        }
        self.task_template.check("spec.task_template", p);
        let total = self.task_template.size().saturating_mul(self.replicas as usize);
        if total > MAX_RUN_BYTES {
            p.add(
                "spec.replicas",
                format!(
                    "{} workers of {} bytes each take {total} bytes, more than the {MAX_RUN_BYTES} a run may",
                    self.replicas,
                    self.task_template.size()
                ),
            );
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema, sqlx::Type)]
#[sqlx(type_name = "text")]
pub enum WorkerState {
    Pending,
    Preparing,
    Running,
    Completed,
    Failed,
}

impl WorkerState {
    pub fn is_terminal(self) -> bool {
        matches!(self, WorkerState::Completed | WorkerState::Failed)
    }

    /// Holds a machine's resources or waits on it: what "a live worker" means.
    pub fn is_live(self) -> bool {
        matches!(self, WorkerState::Preparing | WorkerState::Running)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema, sqlx::Type)]
#[sqlx(type_name = "text")]
pub enum RunState {
    Pending,
    Running,
    Completed,
    Failed,
}

impl RunState {
    pub fn is_terminal(self) -> bool {
        matches!(self, RunState::Completed | RunState::Failed)
    }
}

/// One of a run's workers, as its run's summary reads it: name, state, reason, and whether it
/// waits to start again after a failure (`restart_policy: OnFailure`).
pub type WorkerSummary<'a> = (&'a str, WorkerState, &'a str, bool);

/// A run's state and reason from its workers (in index order), in the recipe's words: the first
/// failed worker's reason, then the first restarting one's, counts while they run, and while
/// they wait, why the first waits.
pub fn summarize(workers: &[WorkerSummary]) -> (RunState, String) {
    let total = workers.len();
    let count = |s: WorkerState| workers.iter().filter(|w| w.1 == s).count();
    let (running, completed) = (count(WorkerState::Running), count(WorkerState::Completed));
    if let Some((name, _, reason, _)) = workers.iter().find(|w| w.1 == WorkerState::Failed) {
        return (RunState::Failed, format!("worker {name} failed: {reason}"));
    }
    if let Some((name, _, reason, _)) = workers.iter().find(|w| w.3 && !w.1.is_terminal()) {
        return (RunState::Running, format!("worker {name} {reason}"));
    }
    if total > 0 && completed == total {
        return (RunState::Completed, "All workers completed".into());
    }
    if running > 0 {
        return (RunState::Running, format!("{running} of {total} workers running"));
    }
    if completed > 0 {
        return (RunState::Running, format!("{completed} of {total} workers completed"));
    }
    (RunState::Pending, waiting(workers))
}

/// Why the first worker not yet placed waits (`Choose where to keep data on gpu-01`), with how
/// many share that reason when the others wait for something else (`… (3 of 4 workers)`).
/// Workers placed and preparing (a fill, an image) leave the recipe's `Waiting for workers to
/// start`: their own reasons say what they wait for.
fn waiting(workers: &[WorkerSummary]) -> String {
    let reasons: Vec<&str> = workers.iter().filter(|w| w.1 == WorkerState::Pending).map(|w| w.2).collect();
    let Some(first) = reasons.first().filter(|r| !r.is_empty()) else {
        return "Waiting for workers to start".into();
    };
    match reasons.iter().filter(|r| *r == first).count() {
        same if same == workers.len() => (*first).to_owned(),
        same => format!("{first} ({same} of {} workers)", workers.len()),
    }
}

#[cfg(test)]
mod tests {
    use super::WorkerState::*;
    use super::*;

    #[test]
    fn a_waiting_run_says_why_its_first_worker_waits_with_a_count_when_others_differ() {
        let choose = "Choose where to keep data on gpu-01";
        let cases: [(&[(WorkerState, &str)], &str); 6] = [
            (&[(Pending, choose), (Pending, choose)], choose),
            (
                &[(Pending, choose), (Pending, choose), (Pending, choose), (Preparing, "Starting on gpu-02")],
                "Choose where to keep data on gpu-01 (3 of 4 workers)",
            ),
            // The recipe's step 3: placed, waiting for the fill.
            (
                &[(Preparing, "Waiting for drive default.food101 to be filled on gpu-01")],
                "Waiting for workers to start",
            ),
            (
                &[(Preparing, "Waiting for drive default.food101 to be filled on gpu-01"), (Pending, choose)],
                "Choose where to keep data on gpu-01 (1 of 2 workers)",
            ),
            (&[(Pending, ""), (Pending, choose)], "Waiting for workers to start"),
            (&[], "Waiting for workers to start"),
        ];
        for (workers, reason) in cases {
            let named: Vec<WorkerSummary> = workers.iter().map(|&(s, r)| ("w", s, r, false)).collect();
            assert_eq!(summarize(&named), (RunState::Pending, reason.to_owned()), "{workers:?}");
        }
    }

    #[test]
    fn run_state_reads_like_the_recipe() {
        let cases: [(&[WorkerState], RunState, &str); 6] = [
            (&[Pending], RunState::Pending, "Waiting for workers to start"),
            (&[Preparing], RunState::Pending, "Waiting for workers to start"),
            (&[Running], RunState::Running, "1 of 1 workers running"),
            (&[Running, Pending, Completed], RunState::Running, "1 of 3 workers running"),
            (&[Completed], RunState::Completed, "All workers completed"),
            (&[Completed, Pending], RunState::Running, "1 of 2 workers completed"),
        ];
        for (states, state, reason) in cases {
            let named: Vec<WorkerSummary> = states.iter().map(|&s| ("w", s, "", false)).collect();
            assert_eq!(summarize(&named), (state, reason.to_string()), "{states:?}");
        }
    }

    #[test]
    fn a_runs_workers_together_carry_at_most_its_byte_budget() {
        let spec = |replicas: u32| -> RunSpec {
            serde_json::from_value(serde_json::json!({
                "replicas": replicas,
                "task_template": {
                    "image": "busybox:1.36", "command": "sh", "args": ["x".repeat(20 * 1024)],
                    "requested_resources": {"cpu_cores": 1, "memory_bytes": 268435456}
                }
            }))
            .unwrap()
        };
        let problems = |s: RunSpec| {
            let mut p = Problems::default();
            s.check(&mut p);
            p.finish().err().unwrap_or_default()
        };
        // 1000 × (20,480 + 14) bytes = 20.5 MB > 16 MiB (16,777,216); 100 × is 2 MB.
        let found = problems(spec(1000));
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].path, "spec.replicas");
        assert!(found[0].message.contains("more than the 16777216 a run may"), "{}", found[0].message);
        assert!(problems(spec(100)).is_empty());
    }

    #[test]
    fn a_run_or_worker_state_is_read_by_its_name_and_an_unknown_one_is_an_error() {
        for state in [Pending, Preparing, Running, Completed, Failed] {
            let name = serde_json::to_value(state).unwrap();
            assert_eq!(name, format!("{state:?}"));
            assert_eq!(serde_json::from_value::<WorkerState>(name).unwrap(), state);
        }
        for state in [RunState::Pending, RunState::Running, RunState::Completed, RunState::Failed] {
            let name = serde_json::to_value(state).unwrap();
            assert_eq!(name, format!("{state:?}"));
            assert_eq!(serde_json::from_value::<RunState>(name).unwrap(), state);
        }
        for unknown in ["Succeeded", "running", ""] {
            assert!(serde_json::from_value::<WorkerState>(unknown.into()).is_err(), "{unknown:?}");
            assert!(serde_json::from_value::<RunState>(unknown.into()).is_err(), "{unknown:?}");
        }
        // A run is never Preparing: only its workers are.
        assert!(serde_json::from_value::<RunState>("Preparing".into()).is_err());
    }

    #[test]
    fn one_failed_worker_fails_the_run_and_says_why() {
        let (state, reason) =
            summarize(&[("r-0", Completed, "", false), ("r-1", Failed, "exited with code 3", false)]);
        assert_eq!(state, RunState::Failed);
        assert_eq!(reason, "worker r-1 failed: exited with code 3");
    }

    #[test]
    fn a_restarting_worker_names_itself_in_its_runs_reason_until_one_fails() {
        let again = "restarting (2 of 3) after: exited with code 1";
        let (state, reason) = summarize(&[("r-0", Running, "", false), ("r-1", Preparing, again, true)]);
        assert_eq!(
            (state, reason.as_str()),
            (RunState::Running, "worker r-1 restarting (2 of 3) after: exited with code 1")
        );
        let (state, reason) =
            summarize(&[("r-0", Failed, "exited with code 3", false), ("r-1", Preparing, again, true)]);
        assert_eq!((state, reason.as_str()), (RunState::Failed, "worker r-0 failed: exited with code 3"));
    }
}
