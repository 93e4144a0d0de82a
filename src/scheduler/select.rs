//! Choosing a machine: filter every machine, keep each rejection's reason, score the rest.

use std::collections::HashMap;

use uuid::Uuid;

use super::filter::fits;
use super::score::{Score, score};
use super::snapshot::{CopyState, MachineView, Request};

/// The machine chosen, with its score and the runner-up's, for the event that explains it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Choice {
    pub index: usize,
    pub score: Score,
    pub runner_up: Option<(usize, Score)>,
}

/// The best machine for `r`, or a reason that sums up every rejection (`0/3 machines are
/// available: 2 Insufficient cpu (…), 1 NotReady`). `warm` lists, in index order, the machines that
/// held a whole copy of a drive `r` mounts when the pass began (see [`warm_index`]). Scores
/// rank whole copies first, so when two of those machines fit with a whole copy, they outscore
/// every other machine and the others are not looked at; the choice is the one a scan of every
/// machine makes.
pub fn select(machines: &[MachineView], r: &Request, warm: &[usize]) -> Result<Choice, String> {
    let (best, second, _) = rank(machines, r, warm.iter().copied(), true);
    if let (Some((score, index)), Some((s, i))) = (best, second) {
        return Ok(Choice { index, score, runner_up: Some((i, s)) });
    }
    let (best, second, reasons) = rank(machines, r, 0..machines.len(), false);
    if let Some((score, index)) = best {
        return Ok(Choice { index, score, runner_up: second.map(|(s, i)| (i, s)) });
    }
    if machines.is_empty() {
        return Err("no machines have joined the cluster yet".into());
    }
    if let [(why, 1)] = reasons.as_slice() {
        if machines.len() == 1 {
            return Err(why.clone());
        }
    }
    let parts: Vec<String> = reasons.iter().map(|(why, n)| format!("{n} {why}")).collect();
    Err(format!("0/{} machines are available: {}", machines.len(), parts.join(", ")))
}

type Ranked = (Option<(Score, usize)>, Option<(Score, usize)>, Vec<(String, usize)>);

/// The best and second-best fitting machines among `indices` (the first wins a tie), and each
/// rejection's reason with its count. With `whole_only`, only machines holding a whole copy
/// of a drive `r` mounts count, and reasons are not kept.
fn rank(
    machines: &[MachineView],
    r: &Request,
    indices: impl Iterator<Item = usize>,
    whole_only: bool,
) -> Ranked {
    let mut best: Option<(Score, usize)> = None;
    let mut second: Option<(Score, usize)> = None;
    let mut reasons: Vec<(String, usize)> = Vec::new();
    for i in indices {
        let m = &machines[i];
        match fits(m, r) {
            Ok(()) => {
                let s = score(m, r);
                if whole_only && s.complete == 0 {
                    continue;
                }
                if best.is_none_or(|(b, _)| s > b) {
                    second = best;
                    best = Some((s, i));
                } else if second.is_none_or(|(b, _)| s > b) {
                    second = Some((s, i));
                }
            }
            Err(_) if whole_only => {}
            Err(why) => match reasons.iter_mut().find(|(w, _)| *w == why) {
                Some((_, n)) => *n += 1,
                None => reasons.push((why, 1)),
            },
        }
    }
    (best, second, reasons)
}

/// For each drive, the machines (by index, ascending) holding a whole copy of it.
pub fn warm_index(machines: &[MachineView]) -> HashMap<Uuid, Vec<usize>> {
    let mut index: HashMap<Uuid, Vec<usize>> = HashMap::new();
    for (i, m) in machines.iter().enumerate() {
        for (drive, c) in &m.copies {
            if c.state == CopyState::Complete {
                index.entry(*drive).or_default().push(i);
            }
        }
    }
    index
}

/// The machines of `index` holding a whole copy of any drive `r` places, ascending.
pub fn warm_for(index: &HashMap<Uuid, Vec<usize>>, r: &Request) -> Vec<usize> {
    let mut warm: Vec<usize> = r.placed().filter_map(|d| index.get(&d.id)).flatten().copied().collect();
    warm.sort_unstable();
    warm.dedup();
    warm
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::domain::task::NodeSelection;
    use crate::scheduler::snapshot::{CopyView, DriveNeed};

    fn machine(name: &str, cpu_free: i64, ready: bool) -> MachineView {
        MachineView {
            id: Uuid::nil(),
            name: name.into(),
            cluster: "main".into(),
            ready,
            transports: vec![],
            data_free: None,
            copies: Default::default(),
            cpu_total: 4000,
            memory_total: 8_000,
            cpu_free,
            memory_free: 8_000,
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
        }
    }

    #[test]
    fn the_best_fitting_machine_wins() {
        let ms = [machine("a", 1000, true), machine("b", 4000, true), machine("c", 4000, false)];
        let choice = select(&ms, &request(1000), &[]).unwrap();
        assert_eq!(choice.index, 1);
        assert_eq!(choice.runner_up.map(|(i, _)| i), Some(0));
    }

    #[test]
    fn rejections_are_summed_up_by_reason() {
        let ms = [machine("a", 1000, true), machine("b", 1000, true), machine("c", 4000, false)];
        assert_eq!(
            select(&ms, &request(2000), &[]),
            Err("0/3 machines are available: 2 Insufficient cpu (1 of 2 cores free), 1 NotReady".into())
        );
        assert_eq!(select(&[], &request(1), &[]), Err("no machines have joined the cluster yet".into()));
        assert_eq!(select(&ms[2..], &request(1), &[]), Err("NotReady".into()));
    }

    fn drive(n: u8, size_hint: i64) -> DriveNeed {
        DriveNeed {
            id: Uuid::from_u128(n.into()),
            name: format!("d{n}"),
            full: format!("default.d{n}"),
            scope: Some("placed".into()),
            node: None,
            transport: "Auto".into(),
            size_hint,
            evictable: true,
        }
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
            m.copies.insert(Uuid::from_u128(d.into()), c);
        }
        m
    }

    proptest! {
        /// Looking first at the machines that hold the data chooses what scanning every machine
        /// chooses, runner-up and reasons included.
        #[test]
        fn the_warm_shortcut_chooses_what_a_full_scan_does(
            drawn in prop::collection::vec(
                (0i64..4000, prop::bool::weighted(0.9), prop::option::of(0i64..5_000),
                 prop::collection::vec((0u8..4, 0usize..4, 0i64..3_000, any::<bool>(), any::<bool>()), 0..4)),
                0..12),
            mounts in prop::collection::vec((0u8..4, 0i64..4_000), 1..3),
            cpu in 0i64..3000,
        ) {
            let ms: Vec<MachineView> = drawn.into_iter().enumerate().map(|(i, d)| drawn_machine(i, d)).collect();
            let mut r = request(cpu);
            r.drives = mounts.into_iter().map(|(n, hint)| drive(n, hint)).collect();
            let warm = warm_for(&warm_index(&ms), &r);
            prop_assert_eq!(select(&ms, &r, &warm), select(&ms, &r, &[]));
        }
    }
}
