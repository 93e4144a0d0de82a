//! Eviction: which copies to remove to make room, least recently used first.

use std::collections::HashMap;

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
    let mut candidates: Vec<(&Uuid, &CopyView)> = copies.iter().filter(|(_, c)| is_evictable(c)).collect();
    candidates.sort_by_key(|(id, c)| (c.last_used_at, **id));
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
}
