//! Choosing a machine: filter every machine, keep each rejection's reason, score the rest.

use super::filter::fits;
use super::score::{Score, score};
use super::snapshot::{MachineView, Request};

/// The machine chosen, with its score and the runner-up's, for the event that explains it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Choice {
    pub index: usize,
    pub score: Score,
    pub runner_up: Option<(usize, Score)>,
}

/// The best machine, or a reason that sums up every rejection
/// (`0/3 machines are available: 2 Insufficient cpu (…), 1 NotReady`).
pub fn select(machines: &[MachineView], r: &Request) -> Result<Choice, String> {
    let mut best: Option<(Score, usize)> = None;
    let mut second: Option<(Score, usize)> = None;
    let mut reasons: Vec<(String, usize)> = Vec::new();
    for (i, m) in machines.iter().enumerate() {
        match fits(m, r) {
            Ok(()) => {
                let s = score(m, r);
                if best.is_none_or(|(b, _)| s > b) {
                    second = best;
                    best = Some((s, i));
                } else if second.is_none_or(|(b, _)| s > b) {
                    second = Some((s, i));
                }
            }
            Err(why) => match reasons.iter_mut().find(|(w, _)| *w == why) {
                Some((_, n)) => *n += 1,
                None => reasons.push((why, 1)),
            },
        }
    }
    if let Some((score, index)) = best {
        return Ok(Choice { index, score, runner_up: second.map(|(s, i)| (i, s)) });
    }
    if machines.is_empty() {
        return Err("no machines have joined the cluster yet".into());
    }
    // One machine's own words read best: "Choose where to keep data on gpu-01".
    if let [(why, 1)] = reasons.as_slice() {
        if machines.len() == 1 {
            return Err(why.clone());
        }
    }
    let parts: Vec<String> = reasons.iter().map(|(why, n)| format!("{n} {why}")).collect();
    Err(format!("0/{} machines are available: {}", machines.len(), parts.join(", ")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::task::NodeSelection;
    use uuid::Uuid;

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
        let choice = select(&ms, &request(1000)).unwrap();
        assert_eq!(choice.index, 1);
        assert_eq!(choice.runner_up.map(|(i, _)| i), Some(0));
    }

    #[test]
    fn rejections_are_summed_up_by_reason() {
        let ms = [machine("a", 1000, true), machine("b", 1000, true), machine("c", 4000, false)];
        assert_eq!(
            select(&ms, &request(2000)),
            Err("0/3 machines are available: 2 Insufficient cpu (1 of 2 cores free), 1 NotReady".into())
        );
        assert_eq!(select(&[], &request(1)), Err("no machines have joined the cluster yet".into()));
        assert_eq!(select(&ms[2..], &request(1)), Err("NotReady".into()));
    }
}
