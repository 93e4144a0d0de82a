//! Eviction: which copies to remove to make room, least recently used first.

use std::collections::{BTreeSet, HashMap};

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::snapshot::{CopyView, is_evictable};
use crate::store::copies::EvictionCopy;

/// A copy as eviction weighs it; `in_use` also when a worker not yet known to Postgres mounts it.
pub fn view(c: &EvictionCopy, in_use: bool) -> CopyView {
    CopyView {
        state: c.state,
        bytes: c.bytes,
        size_hint: c.size_hint,
        evictable: c.evictable,
        in_use: c.in_use || in_use,
        last_used_at: c.last_used_at,
    }
}

/// Drives whose copies to remove so that `need` more bytes fit; unused, evictable, whole
/// copies only, never used ones first then oldest use first. Empty when `need` is already met.
pub fn plan(copies: &HashMap<Uuid, CopyView>, need: i64) -> Vec<Uuid> {
    plan_weighing(copies, need, &BTreeSet::new(), None)
}

/// [`plan`], weighing also what the queue will mount and what a refill costs. Copies of drives
/// a Pending worker mounts (`queued`) go only when the others are not enough. With
/// `refill_cost`, each copy costs its bytes (to fill again) times how likely it is to be
/// mounted again, taken as `1 / (1 + hours since its last use)`: the copy that would free
/// enough on its own is passed over when newer but smaller ones free it for less, and a copy
/// chosen early is kept when the later ones free enough without it.
pub fn plan_weighing(
    copies: &HashMap<Uuid, CopyView>,
    need: i64,
    queued: &BTreeSet<Uuid>,
    refill_cost: Option<DateTime<Utc>>,
) -> Vec<Uuid> {
    let mut candidates: Vec<(Uuid, &CopyView)> =
        copies.iter().filter(|(_, c)| is_evictable(c)).map(|(id, c)| (*id, c)).collect();
    candidates.sort_by_key(|(id, c)| (queued.contains(id), c.last_used_at, *id));
    let Some(now) = refill_cost else {
        return least_recent(&candidates, need);
    };
    let cost = |c: &CopyView| {
        let likely =
            c.last_used_at.map_or(0.0, |t| 1.0 / (1.0 + (now - t).num_seconds().max(0) as f64 / 3600.0));
        c.bytes as f64 * likely
    };
    let mut freed = 0;
    let mut chosen: Vec<(Uuid, i64)> = Vec::new();
    for (i, (id, c)) in candidates.iter().enumerate() {
        if freed >= need {
            break;
        }
        if freed + c.bytes >= need {
            // The others of its tier only: a queued drive's copy never stands in for another.
            let tier: Vec<(Uuid, &CopyView)> = candidates[i + 1..]
                .iter()
                .filter(|(d, _)| queued.contains(d) == queued.contains(id))
                .copied()
                .collect();
            let rest = least_recent(&tier, need - freed);
            let covered: i64 = rest.iter().map(|d| copies[d].bytes).sum();
            let rest_cost: f64 = rest.iter().map(|d| cost(&copies[d])).sum();
            if freed + covered >= need && rest_cost < cost(c) {
                continue;
            }
        }
        freed += c.bytes;
        chosen.push((*id, c.bytes));
    }
    // The most recently used first: the copies most likely to be mounted again.
    for i in (0..chosen.len()).rev() {
        if freed - chosen[i].1 >= need {
            freed -= chosen[i].1;
            chosen[i].1 = -1;
        }
    }
    chosen.into_iter().filter(|(_, bytes)| *bytes >= 0).map(|(id, _)| id).collect()
}

/// The first of `candidates` that free `need` bytes together.
fn least_recent(candidates: &[(Uuid, &CopyView)], need: i64) -> Vec<Uuid> {
    let mut freed = 0;
    let mut chosen = Vec::new();
    for (id, c) in candidates {
        if freed >= need {
            break;
        }
        freed += c.bytes;
        chosen.push(*id);
    }
    chosen
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::snapshot::CopyState;
    use chrono::{TimeZone, Utc};

    fn copy(bytes: i64, used_day: Option<u32>, evictable: bool, in_use: bool) -> CopyView {
        CopyView {
            state: CopyState::Complete,
            bytes,
            size_hint: bytes,
            evictable,
            in_use,
            last_used_at: used_day.map(|d| Utc.with_ymd_and_hms(2026, 11, d, 0, 0, 0).unwrap()),
        }
    }

    #[test]
    fn least_recently_used_copies_go_first_and_only_as_many_as_needed() {
        let id = Uuid::from_u128;
        let copies = HashMap::from([
            (id(1), copy(3_000, Some(20), true, false)),
            (id(2), copy(2_000, Some(10), true, false)),
            (id(3), copy(9_000, Some(1), false, false)), // not evictable
            (id(4), copy(9_000, Some(2), true, true)),   // in use
            (id(5), copy(1_000, None, true, false)),     // never used: oldest
        ]);
        // 1_000 (never used) + 2_000 (day 10) = 3_000 >= 2_500.
        assert_eq!(plan(&copies, 2_500), vec![id(5), id(2)]);
        assert_eq!(plan(&copies, 0), Vec::<Uuid>::new());
        // Everything evictable is still short of 99_000: all three go, the caller sees too little.
        assert_eq!(plan(&copies, 99_000), vec![id(5), id(2), id(1)]);
    }

    #[test]
    fn only_whole_copies_are_evicted_and_equal_ages_go_in_drive_order() {
        let id = Uuid::from_u128;
        let state = |s: CopyState| CopyView { state: s, ..copy(5_000, None, true, false) };
        let copies = HashMap::from([
            (id(1), state(CopyState::Filling)),
            (id(2), state(CopyState::Failed)),
            (id(3), state(CopyState::Evicting)),
            (id(7), copy(1_000, Some(5), true, false)),
            (id(6), copy(1_000, Some(5), true, false)),
        ]);
        // Only the two whole copies count, 1_000 each; used the same day, drive 6 goes first.
        assert_eq!(plan(&copies, 500), vec![id(6)]);
        assert_eq!(plan(&copies, 1_500), vec![id(6), id(7)]);
    }

    #[test]
    fn queued_drives_go_last_and_a_refill_costs_bytes_times_how_likely_they_come_back() {
        let id = Uuid::from_u128;
        let copies = HashMap::from([
            (id(1), copy(800, Some(1), true, false)), // oldest and large
            (id(2), copy(100, Some(2), true, false)),
            (id(3), copy(100, Some(3), true, false)), // a Pending worker mounts it
            (id(4), copy(50, Some(4), true, false)),
        ]);
        let queued = BTreeSet::from([id(3)]);
        let now = Some(Utc.with_ymd_and_hms(2026, 11, 7, 0, 0, 0).unwrap());
        // Least recently used alone: 800 >= 100, the large old copy goes.
        assert_eq!(plan(&copies, 100), vec![id(1)]);
        // The queue's drive goes last: 800 + 100 + 50 = 950 before d3 is needed for 1_000.
        assert_eq!(plan_weighing(&copies, 1_000, &queued, None), vec![id(1), id(2), id(4), id(3)]);
        // For 100: d1 costs 800 / (1 + 144 h) = 5.5, d2 alone 100 / (1 + 120 h) = 0.83: d2 goes.
        assert_eq!(plan_weighing(&copies, 100, &queued, now), vec![id(2)]);
        // For 900: d2 + d4 free only 150, so d1 is needed; d1 + d2 = 900, and d4 is not.
        assert_eq!(plan_weighing(&copies, 900, &queued, now), vec![id(1), id(2)]);
        // For 100 with d2 queued too: d1 is the only copy no queued worker mounts, and it goes.
        let both = BTreeSet::from([id(2), id(3)]);
        assert_eq!(plan_weighing(&copies, 100, &both, now), vec![id(1)]);
        // For 1_000, everything but the queued drive is 950: d3 goes too, and then d1 + d2 + d3
        // = 1_000 without d4, which stays.
        assert_eq!(plan_weighing(&copies, 1_000, &queued, now), vec![id(1), id(2), id(3)]);
    }
}
