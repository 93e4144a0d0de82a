//! The fill controller's decisions, as a pure function of what is observed and the time.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::domain::copy::CopyState;
use crate::domain::run::RunState;

/// A worker bound to `machine` that waits for a whole copy of `drive` there.
#[derive(Debug, Clone)]
pub struct Waiting {
    pub worker: Uuid,
    pub machine: Uuid,
    pub drive: Uuid,
    pub reason: String,
}

/// A drive's fill run on a machine.
#[derive(Debug, Clone)]
pub struct Fill {
    pub run: Uuid,
    pub drive: Uuid,
    pub machine: Uuid,
    pub state: RunState,
    /// Its newest worker, and when that worker ended.
    pub last_worker: String,
    pub finished_at: Option<DateTime<Utc>>,
    /// Its workers that completed since the copy was made: each left the copy without its
    /// marker.
    pub fruitless: i64,
    /// It pulls the copy from a peer rather than running the drive's fill template.
    pub peer: bool,
}

/// Fills that complete without the marker, in a row, before the copy fails.
pub const MAX_FRUITLESS: i64 = 3;

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Change {
    /// A waiting worker's drive has no copy there (it was evicted): make one.
    EnsureCopy { drive: Uuid, machine: Uuid },
    /// A copy is being filled and nothing fills it.
    CreateFill { drive: Uuid, machine: Uuid },
    /// The fill completed but the copy is still not whole after the interval: fill again.
    Refill { run: Uuid, drive: Uuid, machine: Uuid },
    /// The fill failed, or completed [`MAX_FRUITLESS`] times without the marker (`fruitless`):
    /// the copy failed with it, until the fill run is deleted.
    FailCopy { drive: Uuid, machine: Uuid, fruitless: bool },
    /// A fill from a peer failed (its pull said why): pull from another peer, or run the
    /// drive's fill template instead.
    FromOrigin { run: Uuid, drive: Uuid, machine: Uuid },
    /// The failed fill run was deleted: fill the copy again.
    RetryCopy { drive: Uuid, machine: Uuid },
    /// No worker waits for this partial copy any more: remove it.
    DropCopy { drive: Uuid, machine: Uuid },
    /// Tell a waiting worker why it still waits.
    Reason { worker: Uuid, reason: String },
    /// Whole copies are here: start the workers that waited for them.
    Release { machine: Uuid },
}

/// What to change now, and when to look again for a refill that is not due yet. `staged` are
/// the (drive, machine) copies filled ahead for runs that still have Pending workers: they are
/// filled as if a worker waited there.
pub fn plan(
    waiting: &[Waiting],
    staged: &BTreeSet<(Uuid, Uuid)>,
    copies: &HashMap<(Uuid, Uuid), CopyState>,
    fills: &[Fill],
    now: DateTime<Utc>,
    refill_after: Duration,
) -> (Vec<Change>, Option<Duration>) {
    let mut changes = BTreeSet::new();
    let mut next: Option<Duration> = None;
    let fill_of: HashMap<(Uuid, Uuid), &Fill> = fills.iter().map(|f| ((f.drive, f.machine), f)).collect();
    let mut waiters: HashMap<(Uuid, Uuid), Vec<&Waiting>> = HashMap::new();
    for w in waiting {
        waiters.entry((w.drive, w.machine)).or_default().push(w);
    }
    let mut keys: BTreeSet<(Uuid, Uuid)> = copies.keys().copied().collect();
    keys.extend(waiters.keys().copied());
    for key @ (drive, machine) in keys {
        let waits = waiters.get(&key).map(Vec::as_slice).unwrap_or_default();
        let unwanted = waits.is_empty() && !staged.contains(&key);
        let fill = fill_of.get(&key);
        let failed = copies.get(&key) == Some(&CopyState::Failed);
        for w in waits {
            let reason = match fill {
                Some(f) if failed => failed_reason(w, f),
                _ => base_reason(w).to_owned(),
            };
            if w.reason != reason {
                changes.insert(Change::Reason { worker: w.worker, reason });
            }
        }
        match copies.get(&key) {
            None => {
                changes.insert(Change::EnsureCopy { drive, machine });
            }
            Some(CopyState::Complete) => {}
            Some(CopyState::Evicting) => {}
            Some(CopyState::Filling) => match fill {
                None if unwanted => {
                    changes.insert(Change::DropCopy { drive, machine });
                }
                None => {
                    changes.insert(Change::CreateFill { drive, machine });
                }
                Some(f) if f.state == RunState::Failed && f.peer => {
                    changes.insert(Change::FromOrigin { run: f.run, drive, machine });
                }
                Some(f) if f.state == RunState::Failed => {
                    changes.insert(Change::FailCopy { drive, machine, fruitless: false });
                }
                Some(f) if f.state == RunState::Completed && f.fruitless >= MAX_FRUITLESS => {
                    changes.insert(Change::FailCopy { drive, machine, fruitless: true });
                }
                // Filled again only for a worker that waits for it: each fill holds its cores.
                Some(f) if f.state == RunState::Completed && unwanted => {}
                Some(f) if f.state == RunState::Completed => {
                    let due = f.finished_at.map_or(now, |t| t + refill_after);
                    if due <= now {
                        changes.insert(Change::Refill { run: f.run, drive, machine });
                    } else {
                        let wait = (due - now).to_std().unwrap_or_default();
                        next = Some(next.map_or(wait, |n| n.min(wait)));
                    }
                }
                Some(_) => {}
            },
            Some(CopyState::Failed) => match fill {
                None if unwanted => {
                    changes.insert(Change::DropCopy { drive, machine });
                }
                None => {
                    changes.insert(Change::RetryCopy { drive, machine });
                }
                Some(_) => {}
            },
        }
    }
    // A worker starts when every drive it waits for is whole there; one still missing a copy
    // keeps waiting, so its machine needs no release yet.
    let mut whole: HashMap<Uuid, (Uuid, bool)> = HashMap::new();
    for w in waiting {
        let complete = copies.get(&(w.drive, w.machine)) == Some(&CopyState::Complete);
        let entry = whole.entry(w.worker).or_insert((w.machine, true));
        entry.1 &= complete;
    }
    for (machine, ready) in whole.into_values() {
        if ready {
            changes.insert(Change::Release { machine });
        }
    }
    (changes.into_iter().collect(), next)
}

/// Where what a failed fill adds to a waiting worker's reason begins.
const FAILED: &str = ": its fill ";

/// The reason without what a failed fill added to it.
fn base_reason(w: &Waiting) -> &str {
    w.reason.split(FAILED).next().unwrap_or(&w.reason)
}

/// Points a waiting worker at the logs of the fill that failed, or that kept completing
/// without the marker.
fn failed_reason(w: &Waiting, f: &Fill) -> String {
    let what = match f.state {
        RunState::Completed => {
            format!("completed {MAX_FRUITLESS} times without writing .astralyx-filled; read its logs")
        }
        _ => "failed, read its logs".to_owned(),
    };
    format!("{}{FAILED}{what}: astra astraeus logs {}", base_reason(w), f.last_worker)
}

/// The changes one transaction applies: every release (they start waiting workers and are
/// cheap), at most `fills` new fill runs (made together in a few statements) and at most `most`
/// of the rest (each its own statements). A fleet joining at once needs tens of thousands of
/// fills; one transaction for all of them would hold its locks for minutes, and the rest of
/// the changes wait for the next round, which comes at once.
pub fn batch(changes: Vec<Change>, fills: usize, most: usize) -> Vec<Change> {
    let (mut new_fills, mut rest) = (0, 0);
    changes
        .into_iter()
        .filter(|c| match c {
            Change::Release { .. } => true,
            Change::CreateFill { .. } => {
                new_fills += 1;
                new_fills <= fills
            }
            _ => {
                rest += 1;
                rest <= most
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    const MIN: Duration = Duration::from_secs(60);

    #[test]
    fn a_batch_keeps_every_release_and_the_first_fills_and_other_changes() {
        let mut changes: Vec<Change> =
            (0..5).map(|n| Change::CreateFill { drive: id(n), machine: id(100) }).collect();
        changes.extend((0..4).map(|n| Change::DropCopy { drive: id(n), machine: id(101) }));
        changes.push(Change::Release { machine: id(7) });
        changes.push(Change::Release { machine: id(8) });
        let kept = batch(changes, 3, 2);
        assert_eq!(
            kept,
            vec![
                Change::CreateFill { drive: id(0), machine: id(100) },
                Change::CreateFill { drive: id(1), machine: id(100) },
                Change::CreateFill { drive: id(2), machine: id(100) },
                Change::DropCopy { drive: id(0), machine: id(101) },
                Change::DropCopy { drive: id(1), machine: id(101) },
                Change::Release { machine: id(7) },
                Change::Release { machine: id(8) },
            ]
        );
    }

    fn id(n: u128) -> Uuid {
        Uuid::from_u128(n)
    }

    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 12, 1, 12, 0, 0).unwrap()
    }

    fn waiting() -> Waiting {
        Waiting {
            worker: id(9),
            machine: id(2),
            drive: id(1),
            reason: "Waiting for drive default.food101 to be filled on gpu-01".into(),
        }
    }

    fn fill(state: RunState, ended_minutes_ago: Option<i64>) -> Fill {
        Fill {
            run: id(5),
            drive: id(1),
            machine: id(2),
            state,
            last_worker: "fill-food101-gpu-01-0".into(),
            finished_at: ended_minutes_ago.map(|m| now() - chrono::Duration::minutes(m)),
            fruitless: i64::from(state == RunState::Completed),
            peer: false,
        }
    }

    fn run(waiting: &[Waiting], copy: Option<CopyState>, fills: &[Fill]) -> (Vec<Change>, Option<Duration>) {
        let copies = copy.map(|c| HashMap::from([((id(1), id(2)), c)])).unwrap_or_default();
        plan(waiting, &BTreeSet::new(), &copies, fills, now(), 10 * MIN)
    }

    #[test]
    fn a_copy_being_filled_gets_exactly_one_fill() {
        let (changes, _) = run(&[waiting(), waiting()], Some(CopyState::Filling), &[]);
        assert_eq!(changes, vec![Change::CreateFill { drive: id(1), machine: id(2) }]);
        let (changes, _) = run(&[waiting()], Some(CopyState::Filling), &[fill(RunState::Running, None)]);
        assert!(changes.is_empty());
    }

    #[test]
    fn a_copy_filled_ahead_for_a_queued_run_is_filled_while_the_run_waits_and_dropped_after() {
        let staged = BTreeSet::from([(id(1), id(2))]);
        let copies = HashMap::from([((id(1), id(2)), CopyState::Filling)]);
        let (changes, _) = plan(&[], &staged, &copies, &[], now(), MIN);
        assert_eq!(changes, vec![Change::CreateFill { drive: id(1), machine: id(2) }]);
        // The run started elsewhere, or was deleted, before the fill was made.
        let (changes, _) = plan(&[], &BTreeSet::new(), &copies, &[], now(), MIN);
        assert_eq!(changes, vec![Change::DropCopy { drive: id(1), machine: id(2) }]);
    }

    #[test]
    fn a_whole_copy_releases_its_waiting_workers() {
        let (changes, _) =
            run(&[waiting()], Some(CopyState::Complete), &[fill(RunState::Completed, Some(1))]);
        assert_eq!(changes, vec![Change::Release { machine: id(2) }]);
    }

    #[test]
    fn a_worker_waiting_for_two_drives_is_released_only_when_both_are_whole() {
        let other = Waiting { drive: id(3), ..waiting() };
        let filling = fill(RunState::Running, None);
        let other_fill = Fill { run: id(6), drive: id(3), ..filling.clone() };
        let fills = [filling, other_fill];
        let copies = |second: CopyState| {
            HashMap::from([((id(1), id(2)), CopyState::Complete), ((id(3), id(2)), second)])
        };
        let (changes, _) = plan(
            &[waiting(), other.clone()],
            &BTreeSet::new(),
            &copies(CopyState::Filling),
            &fills,
            now(),
            MIN,
        );
        assert!(changes.is_empty(), "{changes:?}");
        let (changes, _) =
            plan(&[waiting(), other], &BTreeSet::new(), &copies(CopyState::Complete), &fills, now(), MIN);
        assert_eq!(changes, vec![Change::Release { machine: id(2) }]);
    }

    #[test]
    fn a_fill_without_its_marker_runs_again_after_the_interval() {
        // Ended 4 minutes ago: due in 10 - 4 = 6 minutes.
        let (changes, next) =
            run(&[waiting()], Some(CopyState::Filling), &[fill(RunState::Completed, Some(4))]);
        assert!(changes.is_empty());
        assert_eq!(next, Some(6 * MIN));
        let (changes, _) =
            run(&[waiting()], Some(CopyState::Filling), &[fill(RunState::Completed, Some(10))]);
        assert_eq!(changes, vec![Change::Refill { run: id(5), drive: id(1), machine: id(2) }]);
    }

    #[test]
    fn a_failed_fill_from_a_peer_runs_the_fill_template_instead() {
        let from_peer = Fill { peer: true, ..fill(RunState::Failed, Some(1)) };
        let (changes, _) = run(&[waiting()], Some(CopyState::Filling), &[from_peer]);
        assert_eq!(changes, vec![Change::FromOrigin { run: id(5), drive: id(1), machine: id(2) }]);
    }

    #[test]
    fn a_failed_fill_stays_failed_and_points_at_its_logs_until_deleted() {
        let (changes, _) = run(&[waiting()], Some(CopyState::Filling), &[fill(RunState::Failed, Some(1))]);
        assert_eq!(changes, vec![Change::FailCopy { drive: id(1), machine: id(2), fruitless: false }]);
        let (changes, _) = run(&[waiting()], Some(CopyState::Failed), &[fill(RunState::Failed, Some(1))]);
        let reason = "Waiting for drive default.food101 to be filled on gpu-01: its fill failed, \
                      read its logs: astra astraeus logs fill-food101-gpu-01-0";
        assert_eq!(changes, vec![Change::Reason { worker: id(9), reason: reason.into() }]);
        // Deleting the failed fill run makes it again, and the reason says so no more.
        let told = Waiting { reason: reason.into(), ..waiting() };
        let (changes, _) = run(&[told], Some(CopyState::Failed), &[]);
        assert_eq!(
            changes,
            vec![
                Change::RetryCopy { drive: id(1), machine: id(2) },
                Change::Reason { worker: id(9), reason: waiting().reason },
            ]
        );
    }

    #[test]
    fn a_fill_that_keeps_completing_without_its_marker_stops_after_three_and_only_refills_for_a_waiter() {
        let third = Fill { fruitless: 3, ..fill(RunState::Completed, Some(60)) };
        let (changes, _) = run(&[waiting()], Some(CopyState::Filling), std::slice::from_ref(&third));
        assert_eq!(changes, vec![Change::FailCopy { drive: id(1), machine: id(2), fruitless: true }]);
        let (changes, _) = run(&[waiting()], Some(CopyState::Failed), &[third]);
        let reason = "Waiting for drive default.food101 to be filled on gpu-01: its fill completed 3 times \
                      without writing .astralyx-filled; read its logs: astra astraeus logs fill-food101-gpu-01-0";
        assert_eq!(changes, vec![Change::Reason { worker: id(9), reason: reason.into() }]);
        // Nobody waits any more: no refill, however long ago it ended.
        let (changes, next) = run(&[], Some(CopyState::Filling), &[fill(RunState::Completed, Some(60))]);
        assert_eq!((changes, next), (vec![], None));
    }

    #[test]
    fn partial_copies_nobody_waits_for_are_dropped_and_missing_ones_made() {
        let (changes, _) = run(&[], Some(CopyState::Filling), &[]);
        assert_eq!(changes, vec![Change::DropCopy { drive: id(1), machine: id(2) }]);
        let (changes, _) = run(&[waiting()], None, &[]);
        assert_eq!(changes, vec![Change::EnsureCopy { drive: id(1), machine: id(2) }]);
        let (changes, _) = run(&[], Some(CopyState::Complete), &[]);
        assert!(changes.is_empty());
    }

    #[test]
    fn an_evicted_copy_is_made_again_only_once_its_folder_is_gone() {
        // Still on disk: the worker waits, nothing is made.
        let (changes, _) =
            run(&[waiting()], Some(CopyState::Evicting), &[fill(RunState::Completed, Some(60))]);
        assert!(changes.is_empty());
        // Gone: a copy is made, and (next round) its old fill, long completed, runs again.
        let (changes, _) = run(&[waiting()], None, &[fill(RunState::Completed, Some(60))]);
        assert_eq!(changes, vec![Change::EnsureCopy { drive: id(1), machine: id(2) }]);
        let (changes, _) =
            run(&[waiting()], Some(CopyState::Filling), &[fill(RunState::Completed, Some(60))]);
        assert_eq!(changes, vec![Change::Refill { run: id(5), drive: id(1), machine: id(2) }]);
    }

    #[test]
    fn failed_copies_nobody_waits_for_are_dropped_and_told_workers_are_not_told_again() {
        let (changes, _) = run(&[], Some(CopyState::Failed), &[]);
        assert_eq!(changes, vec![Change::DropCopy { drive: id(1), machine: id(2) }]);
        // The failed fill run is kept while it exists, so its logs can be read.
        let (changes, _) = run(&[], Some(CopyState::Failed), &[fill(RunState::Failed, Some(1))]);
        assert!(changes.is_empty());
        let told = Waiting {
            reason: "Waiting for drive default.food101 to be filled on gpu-01: its fill failed, \
                     read its logs: astra astraeus logs fill-food101-gpu-01-0"
                .into(),
            ..waiting()
        };
        let (changes, _) = run(&[told], Some(CopyState::Failed), &[fill(RunState::Failed, Some(1))]);
        assert!(changes.is_empty());
    }

    #[test]
    fn the_next_look_is_at_the_earliest_refill_due() {
        let (a, b) = ((id(1), id(2)), (id(3), id(4)));
        let copies = HashMap::from([(a, CopyState::Filling), (b, CopyState::Filling)]);
        // Ended 4 and 7 minutes ago with a 10-minute interval: due in 6 and 3 minutes.
        let fills = [
            Fill { drive: a.0, machine: a.1, ..fill(RunState::Completed, Some(4)) },
            Fill { run: id(6), drive: b.0, machine: b.1, ..fill(RunState::Completed, Some(7)) },
        ];
        let waits = [
            Waiting { drive: a.0, machine: a.1, ..waiting() },
            Waiting { worker: id(10), drive: b.0, machine: b.1, ..waiting() },
        ];
        let (changes, next) = plan(&waits, &BTreeSet::new(), &copies, &fills, now(), 10 * MIN);
        assert!(changes.is_empty());
        assert_eq!(next, Some(3 * MIN));
    }
}
