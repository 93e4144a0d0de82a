//! `restart_policy: OnFailure`: whether a worker that failed starts again on its machine, when,
//! and what it says meanwhile. Pure: the agent API applies the decision.

use std::time::Duration;

use super::task::{DEFAULT_RESTART_LIMIT, RestartPolicy, TaskTemplate};

/// The wait before the first restart; each next one waits twice as long, up to [`MAX_BACKOFF`].
pub const FIRST_BACKOFF: Duration = Duration::from_secs(10);
pub const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// What a worker that failed on its machine does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Starts again on the same machine after `after`; this is restart number `count`.
    Restart { count: u32, after: Duration, reason: String },
    /// Fails for good, saying `reason`.
    Fail { reason: String },
}

/// What the decision needs of a failed worker.
#[derive(Debug, Clone, Copy)]
pub struct Failure<'a> {
    /// Whether it had started: a worker that failed before (an image that does not pull, a
    /// mount refused, GPUs taken) would fail the same way again.
    pub was_running: bool,
    /// A fill's worker: its copy has its own refill rule.
    pub fill: bool,
    /// Restarts it has had.
    pub restarts: u32,
    /// Why it failed, as its agent says (`exited with code 1`).
    pub reason: &'a str,
}

/// Restarts a worker that failed while it ran, when its task asks for it and its limit allows.
pub fn decide(task: &TaskTemplate, failure: Failure) -> Next {
    let limit = task.restart_limit.unwrap_or(DEFAULT_RESTART_LIMIT);
    let wanted = task.restart_policy == RestartPolicy::OnFailure && failure.was_running && !failure.fill;
    if wanted && failure.restarts < limit {
        let count = failure.restarts + 1;
        return Next::Restart {
            count,
            after: backoff(count),
            reason: format!("restarting ({count} of {limit}) after: {}", failure.reason),
        };
    }
    let reason = match failure.restarts {
        0 => failure.reason.to_owned(),
        1 => format!("{} (after 1 restart)", failure.reason),
        n => format!("{} (after {n} restarts)", failure.reason),
    };
    Next::Fail { reason }
}

/// The wait before restart number `count` (from 1): 10 s, doubling, at most 5 minutes.
pub fn backoff(count: u32) -> Duration {
    let doublings = count.saturating_sub(1).min(16);
    (FIRST_BACKOFF * 2u32.pow(doublings)).min(MAX_BACKOFF)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(policy: &str, limit: Option<u32>) -> TaskTemplate {
        let mut json = serde_json::json!({
            "image": "busybox:1.36", "command": "sh", "restart_policy": policy,
            "requested_resources": {"cpu_cores": 1, "memory_bytes": 268435456}
        });
        if let Some(limit) = limit {
            json["restart_limit"] = limit.into();
        }
        serde_json::from_value(json).unwrap()
    }

    fn failure(restarts: u32) -> Failure<'static> {
        Failure { was_running: true, fill: false, restarts, reason: "exited with code 1" }
    }

    #[test]
    fn backoff_starts_at_ten_seconds_and_doubles_up_to_five_minutes() {
        // 10 × 2^(n-1): 10, 20, 40, 80, 160, then 320 > 300 is capped.
        let secs: Vec<u64> = (1..=8).map(|n| backoff(n).as_secs()).collect();
        assert_eq!(secs, [10, 20, 40, 80, 160, 300, 300, 300]);
        assert_eq!(backoff(u32::MAX), MAX_BACKOFF);
    }

    #[test]
    fn on_failure_restarts_a_worker_that_ran_until_its_limit() {
        let t = task("OnFailure", None);
        let cases = [
            (0, Some((1, 10, "restarting (1 of 3) after: exited with code 1"))),
            (1, Some((2, 20, "restarting (2 of 3) after: exited with code 1"))),
            (2, Some((3, 40, "restarting (3 of 3) after: exited with code 1"))),
            (3, None),
        ];
        for (restarts, want) in cases {
            let got = decide(&t, failure(restarts));
            match want {
                Some((count, secs, reason)) => assert_eq!(
                    got,
                    Next::Restart { count, after: Duration::from_secs(secs), reason: reason.into() }
                ),
                None => {
                    assert_eq!(got, Next::Fail { reason: "exited with code 1 (after 3 restarts)".into() })
                }
            }
        }
    }

    #[test]
    fn failures_that_would_recur_or_are_not_asked_for_end_the_worker() {
        let on_failure = task("OnFailure", Some(5));
        let never = task("Never", None);
        let said = |reason: &str| Next::Fail { reason: reason.into() };
        // Before it started: a secret that does not open, an ungranted host path, a pull.
        let early = Failure { was_running: false, ..failure(0) };
        assert_eq!(decide(&on_failure, early), said("exited with code 1"));
        assert_eq!(decide(&on_failure, Failure { fill: true, ..failure(0) }), said("exited with code 1"));
        assert_eq!(decide(&never, failure(0)), said("exited with code 1"));
        assert_eq!(decide(&task("OnFailure", Some(0)), failure(0)), said("exited with code 1"));
        assert_eq!(
            decide(&task("OnFailure", Some(1)), failure(1)),
            said("exited with code 1 (after 1 restart)")
        );
        assert!(matches!(decide(&on_failure, failure(4)), Next::Restart { count: 5, .. }));
    }
}
