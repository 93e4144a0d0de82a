//! Choosing a machine: filter every machine, keep each rejection's reason, score the rest.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use uuid::Uuid;

use super::filter::{can_take, fits};
use super::score::{Score, bound, score};
use super::snapshot::{CopyState, MachineView, Request, placement_order};

/// The machine chosen, with its score and the runner-up's, for the event that explains it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Choice {
    pub index: usize,
    pub score: Score,
    pub runner_up: Option<(usize, Score)>,
}

/// The best machine for `r`, or a reason that sums up every rejection (`0/3 machines are
/// available: 2 Insufficient cpu (…), 1 NotReady`). `warm` holds the machines that held a whole
/// copy of a drive `r` mounts when the pass began (see [`warm_for`]). Scores rank what is left
/// to fill, then whole copies, so when two of those machines fit with a copy of every drive
/// and one whole, they outscore every other machine and the others are not looked at; the
/// choice is the one a scan of every machine makes.
pub fn select(machines: &[MachineView], r: &Request, warm: &mut Warm) -> Result<Choice, String> {
    if let (Some((score, index)), Some((s, i))) = best_two_warm(machines, r, warm)
        && s.to_fill.0 == 0
    {
        return Ok(Choice { index, score, runner_up: Some((i, s)) });
    }
    let (best, second, reasons) = rank(machines, r);
    match best {
        Some((score, index)) => Ok(Choice { index, score, runner_up: second.map(|(s, i)| (i, s)) }),
        None => Err(summary(machines.len(), &reasons)),
    }
}

/// Why `r` fits none of `read` and `others` taken together, as [`select`] says it; `None` when
/// one fits. A pass whose runs name their machines reads only those (`read`): the others are
/// needed only for this, since the reason counts every machine. Both are in the scheduler's
/// order, so merging them gives every machine in that order without sorting for each worker.
pub fn why_none(read: &[MachineView], others: &[MachineView], r: &Request) -> Option<String> {
    let (mut a, mut b) = (read.iter().peekable(), others.iter().peekable());
    let mut reasons = Vec::new();
    loop {
        let next = match (a.peek(), b.peek()) {
            (Some(x), Some(y)) if placement_order(x, y).is_gt() => b.next(),
            _ => a.next().or_else(|| b.next()),
        };
        let Some(m) = next else { break };
        let Err(why) = fits(m, r) else {
            return None;
        };
        tally(&mut reasons, why);
    }
    Some(summary(read.len() + others.len(), &reasons))
}

/// Every rejection's reason with its count, in words: `0/3 machines are available: 2
/// Insufficient cpu (…), 1 NotReady`, or the one reason of the only machine.
fn summary(machines: usize, reasons: &[(String, usize)]) -> String {
    match reasons {
        _ if machines == 0 => "no machines have joined the cluster yet".into(),
        [(why, 1)] if machines == 1 => why.clone(),
        _ => {
            let parts: Vec<String> = reasons.iter().map(|(why, n)| format!("{n} {why}")).collect();
            format!("0/{machines} machines are available: {}", parts.join(", "))
        }
    }
}

fn tally(reasons: &mut Vec<(String, usize)>, why: String) {
    match reasons.iter_mut().find(|(w, _)| *w == why) {
        Some((_, n)) => *n += 1,
        None => reasons.push((why, 1)),
    }
}

/// A machine's score and index, when one fits.
type Pick = Option<(Score, usize)>;

/// The machines holding a whole copy of a drive a run places, for the run's workers in turn: a
/// max-heap on each machine's [`bound`] (then lower index). Bounds only fall during a pass, so
/// a key may be stale but never too low; a machine whose bound fell since is put back at its
/// new one when it comes up. A worker so looks at a few machines, not at every machine the
/// workers before it took, which grew with the square of the run's workers in a pass.
#[derive(Debug, Default)]
pub struct Warm {
    heap: BinaryHeap<(Score, Reverse<usize>)>,
}

/// The best and second-best fitting machines with a whole copy in `warm`, as a scan in index
/// order would find them (higher score first, then lower index). The scan stops at the first
/// machine whose bound cannot beat the runner-up.
fn best_two_warm(machines: &[MachineView], r: &Request, warm: &mut Warm) -> (Pick, Pick) {
    let key = |(s, i): (Score, usize)| (s, Reverse(i));
    let mut best: Pick = None;
    let mut second: Pick = None;
    let mut looked = Vec::new();
    while let Some(&(stale, Reverse(i))) = warm.heap.peek() {
        if second.is_some_and(|b| (stale, Reverse(i)) < key(b)) {
            break;
        }
        warm.heap.pop();
        let m = &machines[i];
        let s = score(m, r);
        let bound = bound(s, r);
        if bound < stale {
            warm.heap.push((bound, Reverse(i)));
            continue;
        }
        // Resources and room only shrink during a pass: a machine that cannot take this
        // request now cannot later in the pass either, so it leaves the run's heap.
        if !can_take(m, r) {
            continue;
        }
        looked.push((bound, Reverse(i)));
        if s.complete == 0 {
            continue;
        }
        if best.is_none_or(|b| key((s, i)) > key(b)) {
            second = best;
            best = Some((s, i));
        } else if second.is_none_or(|b| key((s, i)) > key(b)) {
            second = Some((s, i));
        }
    }
    warm.heap.extend(looked);
    (best, second)
}

type Ranked = (Pick, Pick, Vec<(String, usize)>);

/// The best and second-best fitting machines (the first wins a tie), and, when none fits, each
/// rejection's reason with its count.
fn rank(machines: &[MachineView], r: &Request) -> Ranked {
    let mut best: Pick = None;
    let mut second: Pick = None;
    // Most machines a busy pass turns down lack the resources: their reasons are written out
    // only when no machine fits.
    for (i, m) in machines.iter().enumerate() {
        if can_take(m, r) {
            keep_two(&mut best, &mut second, score(m, r), i);
        }
    }
    let mut reasons: Vec<(String, usize)> = Vec::new();
    if best.is_none() {
        for why in machines.iter().filter_map(|m| fits(m, r).err()) {
            tally(&mut reasons, why);
        }
    }
    (best, second, reasons)
}

/// Keeps the two highest keys offered in turn, with their machines' indices; of equal keys the
/// first offered ranks higher.
pub fn keep_two<K: Ord + Copy>(
    best: &mut Option<(K, usize)>,
    second: &mut Option<(K, usize)>,
    k: K,
    i: usize,
) {
    if best.is_none_or(|(b, _)| k > b) {
        *second = *best;
        *best = Some((k, i));
    } else if second.is_none_or(|(b, _)| k > b) {
        *second = Some((k, i));
    }
}

/// For each drive, the machines (by index, ascending) holding a whole copy of it.
pub fn warm_index(machines: &[MachineView]) -> HashMap<Uuid, Vec<usize>> {
    let mut index: HashMap<Uuid, Vec<usize>> = HashMap::new();
    for (i, m) in machines.iter().enumerate() {
        for (drive, state) in &m.copies {
            if *state == CopyState::Complete {
                index.entry(*drive).or_default().push(i);
            }
        }
    }
    index
}

/// The machines of `index` holding a whole copy of any drive `r` places, each keyed by its
/// [`bound`] for `r`: made once per pass for all the workers that ask for the same.
pub fn warm_for(machines: &[MachineView], index: &HashMap<Uuid, Vec<usize>>, r: &Request) -> Warm {
    let mut warm: Vec<usize> = r.placed().filter_map(|d| index.get(&d.id)).flatten().copied().collect();
    warm.sort_unstable();
    warm.dedup();
    Warm { heap: warm.into_iter().map(|i| (bound(score(&machines[i], r), r), Reverse(i))).collect() }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::domain::Name;
    use crate::domain::drive::{NodeScope, Transport};
    use crate::domain::task::{NodeSelection, SelectionMode};
    use crate::scheduler::snapshot::{CopyView, DriveNeed, is_evictable};

    fn machine(name: &str, cpu_free: i64, ready: bool) -> MachineView {
        MachineView {
            id: Uuid::nil(),
            name: name.into(),
            cluster: "main".into(),
            ready,
            cordoned: false,
            transports: vec![],
            data_free: None,
            reclaimable: 0,
            held: 0,
            freed: 0,
            images: vec![],
            copies: Default::default(),
            filled: Default::default(),
            fill_rate: None,
            cpu_total: 4000,
            memory_total: 8_000,
            cpu_free,
            memory_free: 8_000,
            gpus_total: 0,
            gpus_free: 0,
        }
    }

    fn request(cpu_millis: i64) -> Request {
        Request {
            cluster: "main".into(),
            cpu_millis,
            memory_bytes: 1_000,
            gpus: 0,
            selection: NodeSelection::default(),
            drives: vec![],
            fill: false,
            image: None,
        }
    }

    #[test]
    fn the_best_fitting_machine_wins() {
        let ms = [machine("a", 1000, true), machine("b", 4000, true), machine("c", 4000, false)];
        let choice = select(&ms, &request(1000), &mut Warm::default()).unwrap();
        assert_eq!(choice.index, 1);
        assert_eq!(choice.runner_up.map(|(i, _)| i), Some(0));
    }

    #[test]
    fn rejections_are_summed_up_by_reason() {
        let ms = [machine("a", 1000, true), machine("b", 1000, true), machine("c", 4000, false)];
        assert_eq!(
            select(&ms, &request(2000), &mut Warm::default()),
            Err("0/3 machines are available: 2 Insufficient cpu (1 of 2 cores free), 1 NotReady".into())
        );
        assert_eq!(
            select(&[], &request(1), &mut Warm::default()),
            Err("no machines have joined the cluster yet".into())
        );
        assert_eq!(select(&ms[2..], &request(1), &mut Warm::default()), Err("NotReady".into()));
    }

    fn drive(n: u8, size_hint: i64) -> DriveNeed {
        DriveNeed {
            host_path: None,
            id: Uuid::from_u128(n.into()),
            name: format!("d{n}"),
            full: format!("default.d{n}"),
            scope: Some(NodeScope::Placed),
            node: None,
            transport: Transport::Auto,
            size_hint,
            evictable: true,
        }
    }

    /// A copy made for one run's worker raises that machine's score for another run that
    /// mounts the same drive, in the same pass: its place in that run's warm list must allow
    /// for it, or the runner-up comes out wrong.
    #[test]
    fn a_copy_made_for_one_run_counts_for_another_run_in_the_same_pass() {
        let (whole, spare) = (0, true);
        let mut ms: Vec<MachineView> = [
            (3123, true, Some(0), vec![(1, whole, 2209, spare, false)]),
            (2339, true, Some(537), vec![(0, whole, 0, false, false), (1, whole, 334, spare, false)]),
            (1243, true, None, vec![(2, whole, 0, false, false), (1, whole, 0, false, false)]),
        ]
        .into_iter()
        .enumerate()
        .map(|(i, d)| drawn_machine(i, d))
        .collect();
        let run = |drives: [u8; 2]| Request { drives: drives.map(|n| drive(n, 0)).to_vec(), ..request(0) };
        let (first, second) = (run([0, 2]), run([1, 2]));
        let index = warm_index(&ms);
        let mut warm = warm_for(&ms, &index, &second);

        // The first run's worker goes to m1, which gets a copy of drive 2 to fill.
        assert_eq!(select(&ms, &first, &mut warm_for(&ms, &index, &first)).map(|c| c.index), Ok(1));
        ms[1].copies.insert(Uuid::from_u128(2), CopyState::Filling);

        // For the second run m1 now has one copy whole and one filling: the runner-up, ahead of m0.
        let choice = select(&ms, &second, &mut warm).unwrap();
        assert_eq!((choice.index, choice.runner_up.map(|(i, _)| i)), (2, Some(1)));
        assert_eq!(select(&ms, &second, &mut warm), select(&ms, &second, &mut Warm::default()));
    }

    const STATES: [CopyState; 4] =
        [CopyState::Complete, CopyState::Filling, CopyState::Failed, CopyState::Evicting];

    /// A machine: cpu free, ready, room for data, and (drive, state, bytes, evictable, in use) copies.
    type Drawn = (i64, bool, Option<i64>, Vec<(u8, usize, i64, bool, bool)>);

    fn drawn_machine(i: usize, (cpu_free, ready, data_free, copies): Drawn) -> MachineView {
        let mut m = machine(&format!("m{i}"), cpu_free, ready);
        m.data_free = data_free;
        for (d, state, bytes, evictable, in_use) in copies {
            let c = CopyView {
                state: STATES[state],
                bytes,
                size_hint: bytes,
                evictable,
                in_use,
                last_used_at: None,
            };
            if is_evictable(&c) {
                m.reclaimable += bytes;
            }
            m.copies.insert(Uuid::from_u128(d.into()), c.state);
        }
        m
    }

    /// Up to 12 machines, most of them ready.
    fn fleet() -> impl Strategy<Value = Vec<Drawn>> {
        let copies =
            prop::collection::vec((0u8..4, 0usize..4, 0i64..3_000, any::<bool>(), any::<bool>()), 0..4);
        let machine = (0i64..4000, prop::bool::weighted(0.9), prop::option::of(0i64..5_000), copies);
        prop::collection::vec(machine, 0..12)
    }

    proptest! {
        /// Looking first at the machines that hold the data chooses what scanning every machine
        /// chooses, runner-up and reasons included.
        #[test]
        fn the_warm_shortcut_chooses_what_a_full_scan_does(
            drawn in fleet(),
            mounts in prop::collection::vec((0u8..4, 0i64..4_000), 1..3),
            cpu in 0i64..3000,
        ) {
            let ms: Vec<MachineView> = drawn.into_iter().enumerate().map(|(i, d)| drawn_machine(i, d)).collect();
            let mut r = request(cpu);
            r.drives = mounts.into_iter().map(|(n, hint)| drive(n, hint)).collect();
            let mut warm = warm_for(&ms, &warm_index(&ms), &r);
            prop_assert_eq!(select(&ms, &r, &mut warm), select(&ms, &r, &mut Warm::default()));
        }

        /// A pass that read only the machines its run names (and some more, as it reads the
        /// machines the run's drives are kept on) gives a worker that fits none of them the
        /// reason a pass that read every machine gives, in the same order.
        #[test]
        fn the_machines_read_and_the_others_give_the_reason_every_machine_gives(
            drawn in fleet(),
            roles in prop::collection::vec((prop::bool::weighted(0.8), any::<bool>(), any::<bool>()), 12),
            mounts in prop::collection::vec((0u8..4, 0i64..4_000), 1..3),
            cpu in 0i64..3000,
        ) {
            let mut ms: Vec<MachineView> = drawn.into_iter().enumerate().map(|(i, d)| drawn_machine(i, d)).collect();
            let mut r = request(cpu);
            r.drives = mounts.into_iter().map(|(n, hint)| drive(n, hint)).collect();
            r.selection.mode = SelectionMode::Exact;
            let mut read = Vec::new();
            let mut others = Vec::new();
            for (m, &(home, named, read_too)) in ms.iter_mut().zip(&roles) {
                if !home {
                    m.cluster = "other".into();
                }
                if named {
                    r.selection.names.push(Name::parse(&m.name).unwrap());
                }
                if named || read_too { read.push(m.clone()) } else { others.push(m.clone()) }
            }
            for machines in [&mut ms, &mut read, &mut others] {
                machines.sort_unstable_by(placement_order);
            }
            prop_assert_eq!(why_none(&read, &others, &r), select(&ms, &r, &mut Warm::default()).err());
        }

        /// The warm lists made when the pass begins still choose what a full scan does for
        /// each worker of two runs in turn, as each bound worker takes its machine's resources
        /// and has the copies it lacks made there (which the other run may mount too).
        #[test]
        fn the_warm_lists_of_a_pass_hold_for_every_worker_of_it(
            drawn in fleet(),
            mounts in prop::collection::vec(prop::collection::vec((0u8..4, 0i64..4_000), 1..3), 2),
            cpu in prop::collection::vec(0i64..1500, 2),
            workers in prop::collection::vec(0usize..2, 1..16),
        ) {
            let mut ms: Vec<MachineView> = drawn.into_iter().enumerate().map(|(i, d)| drawn_machine(i, d)).collect();
            let runs: Vec<Request> = mounts
                .into_iter()
                .zip(cpu)
                .map(|(mounts, cpu)| {
                    let mut r = request(cpu);
                    r.drives = mounts.into_iter().map(|(n, hint)| drive(n, hint)).collect();
                    r
                })
                .collect();
            let index = warm_index(&ms);
            let mut warm: Vec<Warm> = runs.iter().map(|r| warm_for(&ms, &index, r)).collect();
            for run in workers {
                let r = &runs[run];
                let choice = select(&ms, r, &mut warm[run]);
                prop_assert_eq!(&choice, &select(&ms, r, &mut Warm::default()));
                let Ok(c) = choice else { continue };
                let m = &mut ms[c.index];
                m.take(r.cpu_millis, r.memory_bytes, r.gpus);
                let lacking: Vec<DriveNeed> = r.placed().filter(|d| !m.copies.contains_key(&d.id)).cloned().collect();
                for d in lacking {
                    m.data_free = Some(m.data_free.unwrap_or(0) - d.size_hint);
                    m.copies.insert(d.id, CopyState::Filling);
                }
            }
        }
    }
}
