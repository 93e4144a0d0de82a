//! Which placement policy a pass follows: the product's, or one it is measured against in the
//! simulator (`astraeus sim`). Filters, eviction and fills are the same for all of them; only
//! the choice among the machines that fit differs.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use uuid::Uuid;

use super::filter::can_take;
use super::score::{least_allocated, score};
use super::select::{Choice, keep_two, why_none};
use super::snapshot::{CopyState, MachineView, Request};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Policy {
    pub scoring: Scoring,
    pub decisions: Decisions,
}

impl Policy {
    /// What the scheduler follows.
    pub const PRODUCT: Policy = Policy { scoring: Scoring::Astraeus, decisions: Decisions::ALL };
}

/// The decisions that weigh the data, each measured in the simulator against the product
/// without it (docs/placement.md); all on in the product.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decisions {
    /// Evict copies of drives no Pending worker mounts before those a queued worker will.
    pub queue_eviction: bool,
    /// Weigh a copy's bytes (what filling it again costs) with its recency when evicting, not
    /// recency alone.
    pub refill_cost: bool,
    /// Fill a queued run's drives ahead on the machines it will most likely get, while it
    /// waits for resources.
    pub stage_in: bool,
    /// Count the images machines hold, after the data, when choosing among them.
    pub images: bool,
    /// Among machines with as many copies, prefer the one whose data could be whole soonest:
    /// its copies' bytes left and its measured fill rate.
    pub expected_start: bool,
    /// A worker whose drives are whole on a machine that is full now waits for that machine,
    /// Pending, for as long as filling them elsewhere would take, before it goes there cold
    /// (delay scheduling): waiting holds no GPU, filling does.
    pub wait_for_warm: bool,
    /// Among machines as good for a worker's own data, prefer the one holding fewer copies
    /// (each weighed as [`super::score::COPY_WORTH`] of room): a worker that fills or needs
    /// nothing there leaves the machines holding data free for the workers that mount it.
    pub spare_holders: bool,
}

impl Decisions {
    pub const ALL: Decisions = Decisions {
        queue_eviction: true,
        refill_cost: true,
        stage_in: true,
        images: true,
        expected_start: true,
        wait_for_warm: true,
        spare_holders: true,
    };
    pub const NONE: Decisions = Decisions {
        queue_eviction: false,
        refill_cost: false,
        stage_in: false,
        images: false,
        expected_start: false,
        wait_for_warm: false,
        spare_holders: false,
    };
}

impl Default for Decisions {
    fn default() -> Self {
        Decisions::ALL
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Scoring {
    /// What is left to fill first, then whole copies, copies being filled, how soon the data
    /// could be whole, data room (less the copies held), then free resources.
    #[default]
    Astraeus,
    /// Any machine that fits, drawn per worker from `seed`.
    Random { seed: u64 },
    /// Kubernetes' ImageLocality applied to data: the bytes of the worker's drives a machine
    /// holds whole, each damped by the share of machines holding it, so data everywhere counts
    /// for little; added to the free-resources score, as kube-scheduler's default profile adds
    /// its plugins.
    ImageLocality,
}

/// For each drive, the share of machines (0–1) holding a whole copy, from the warm index.
pub fn spread(index: &HashMap<Uuid, Vec<usize>>, machines: usize) -> HashMap<Uuid, f64> {
    index.iter().map(|(d, holders)| (*d, holders.len() as f64 / machines.max(1) as f64)).collect()
}

/// The machine `scoring` picks for worker `worker` among those that fit, with the runner-up; the
/// same reason as [`super::select::select`] when none fits.
pub fn select(
    scoring: Scoring,
    machines: &[MachineView],
    r: &Request,
    worker: Uuid,
    spread: &HashMap<Uuid, f64>,
) -> Result<Choice, String> {
    let key = |i: usize, m: &MachineView| -> i64 {
        match scoring {
            Scoring::Astraeus => unreachable!("the product's scoring is select::select"),
            Scoring::Random { seed } => {
                let mut h = DefaultHasher::new();
                (seed, worker, m.id, i).hash(&mut h);
                (h.finish() >> 1) as i64
            }
            Scoring::ImageLocality => image_locality(m, r, spread) + least_allocated(m, r),
        }
    };
    let mut best: Option<(i64, usize)> = None;
    let mut second: Option<(i64, usize)> = None;
    for (i, m) in machines.iter().enumerate() {
        if !can_take(m, r) {
            continue;
        }
        keep_two(&mut best, &mut second, key(i, m), i);
    }
    let Some((_, index)) = best else {
        return Err(why_none(machines, &[], r).unwrap_or_default());
    };
    Ok(Choice {
        index,
        score: score(&machines[index], r),
        runner_up: second.map(|(_, i)| (i, score(&machines[i], r))),
    })
}

/// 0–100: the bytes of `r`'s placed drives whole on `m`, each times the share of machines
/// holding it, over all of `r`'s placed bytes (kube-scheduler's `scaledImageScore`, with the
/// thresholds at 0 and the request's size).
fn image_locality(m: &MachineView, r: &Request, spread: &HashMap<Uuid, f64>) -> i64 {
    let total: i64 = r.placed().map(|d| d.size_hint.max(1)).sum();
    if total == 0 {
        return 0;
    }
    let held: f64 = r
        .placed()
        .filter(|d| m.copy_state(d.id) == Some(CopyState::Complete))
        .map(|d| d.size_hint.max(1) as f64 * spread.get(&d.id).copied().unwrap_or(0.0))
        .sum();
    (100.0 * held / total as f64) as i64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::task::NodeSelection;
    use crate::scheduler::snapshot::{ByDrive, DriveNeed};

    fn machine(n: u8, copy: Option<CopyState>) -> MachineView {
        MachineView {
            id: Uuid::from_u128(n.into()),
            name: format!("m{n}"),
            cluster: "main".into(),
            ready: true,
            cordoned: false,
            transports: vec![],
            cpu_total: 4000,
            memory_total: 8_000,
            cpu_free: 4000,
            memory_free: 8_000,
            gpus_total: 0,
            gpus_free: 0,
            data_free: Some(1_000_000),
            reclaimable: 0,
            held: 0,
            freed: 0,
            images: vec![],
            copies: copy.map(|c| (Uuid::from_u128(7), c)).into_iter().collect(),
            filled: ByDrive::default(),
            fill_rate: None,
        }
    }

    fn request() -> Request {
        let d = DriveNeed {
            host_path: None,
            id: Uuid::from_u128(7),
            name: "d".into(),
            full: "ws.d".into(),
            scope: Some(crate::domain::drive::NodeScope::Placed),
            node: None,
            transport: crate::domain::drive::Transport::Auto,
            size_hint: 1_000,
            evictable: true,
        };
        Request {
            cluster: "main".into(),
            cpu_millis: 1000,
            memory_bytes: 2_000,
            gpus: 0,
            selection: NodeSelection::default(),
            drives: vec![d],
            fill: false,
            image: None,
        }
    }

    #[test]
    fn image_locality_counts_data_for_less_the_wider_it_is_spread() {
        let ms =
            [machine(1, Some(CopyState::Complete)), machine(2, None), machine(3, None), machine(4, None)];
        let r = request();
        // One machine of four holds the 1_000 bytes: 100 * 1_000 * 1/4 / 1_000 = 25.
        let few = HashMap::from([(Uuid::from_u128(7), 0.25)]);
        assert_eq!(image_locality(&ms[0], &r, &few), 25);
        assert_eq!(image_locality(&ms[1], &r, &few), 0);
        // Every machine holds it: 100 * 1_000 * 1 / 1_000 = 100, alike on each.
        let all = HashMap::from([(Uuid::from_u128(7), 1.0)]);
        assert_eq!(image_locality(&ms[0], &r, &all), 100);
        // Free resources: (100 * 3000/4000 + 100 * 6000/8000) / 2 = 75; 25 + 75 wins.
        let c = select(Scoring::ImageLocality, &ms, &r, Uuid::nil(), &few).unwrap();
        assert_eq!(c.index, 0);
    }

    #[test]
    fn random_draws_among_the_machines_that_fit_and_is_the_same_for_the_same_seed() {
        let mut ms: Vec<MachineView> = (1..=8).map(|n| machine(n, None)).collect();
        ms[3].ready = false;
        let r = request();
        let pick = |ms: &[MachineView], seed, worker| {
            select(Scoring::Random { seed }, ms, &r, Uuid::from_u128(worker), &HashMap::new())
        };
        let picks: Vec<usize> = (0..64).map(|w| pick(&ms, 1, w).unwrap().index).collect();
        assert!(!picks.contains(&3), "a machine that does not fit is never drawn");
        assert!(picks.iter().collect::<std::collections::BTreeSet<_>>().len() > 3, "{picks:?}");
        assert_eq!(pick(&ms, 1, 5), pick(&ms, 1, 5));
        for m in &mut ms {
            m.ready = false;
        }
        assert_eq!(pick(&ms, 1, 5), Err("0/8 machines are available: 8 NotReady".into()));
    }
}
