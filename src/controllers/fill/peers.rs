//! Which peer a new copy is pulled from. A holder serves one upload at a time, and each copy
//! being pulled becomes a holder in turn as soon as its pull runs, passing on what it has
//! checked as it lands: many machines that need a drive at once are filled as a pipelined
//! chain, each link at the full rate of a machine's network, so that all are whole in about one
//! copy's time plus a chunk per machine, and the origin is read once. A tree whose holders
//! serve two at once would split each sender's rate in two, and take twice as long
//! (docs/benchmarks.md, "Peer fills").

use uuid::Uuid;

use crate::store::fills::Holder;

/// Peer fills one holder serves at once.
pub const UPLOADS_PER_HOLDER: i64 = 1;

/// A copy to fill: its drive, its machine and that machine's cluster.
#[derive(Debug, Clone, Copy)]
pub struct Wanted<'a> {
    pub drive: Uuid,
    pub machine: Uuid,
    pub cluster: &'a str,
}

/// Where a new copy comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Pulled from `holders[i]`.
    Peer(usize),
    /// Every holder of the drive in its cluster is serving its most: the fill waits for a
    /// slot, or for a copy being pulled to become a holder, rather than read the origin again.
    Wait,
    /// No machine of its cluster can serve it: the drive's fill template.
    Origin,
}

/// For each wanted copy, where it comes from: a holder of its drive in its cluster, not the
/// machine itself, with an upload slot free, the fewest uploads first, then the order given.
pub fn choose(wanted: &[Wanted<'_>], holders: &[Holder]) -> Vec<Source> {
    let mut uploads: Vec<i64> = holders.iter().map(|h| h.uploads).collect();
    wanted
        .iter()
        .map(|w| {
            let serving = |h: &Holder| h.drive == w.drive && h.cluster == w.cluster && h.machine != w.machine;
            let pick = holders
                .iter()
                .enumerate()
                .filter(|(i, h)| serving(h) && uploads[*i] < UPLOADS_PER_HOLDER)
                .min_by_key(|(i, _)| (uploads[*i], *i))
                .map(|(i, _)| i);
            match pick {
                Some(i) => {
                    uploads[i] += 1;
                    Source::Peer(i)
                }
                None if holders.iter().any(serving) => Source::Wait,
                None => Source::Origin,
            }
        })
        .collect()
}

/// For a fill whose pull from `failed` failed, another holder to pull from: one with a slot
/// free, the least busy, not `failed`, and whose copy does not come (through the copies being
/// pulled) from the wanted machine itself, which would wait on its own copy.
pub fn choose_again(w: &Wanted<'_>, holders: &[Holder], failed: Option<Uuid>) -> Option<usize> {
    let upstream = |machine: Uuid| {
        holders
            .iter()
            .find(|h| h.drive == w.drive && h.machine == machine && h.relay)
            .and_then(|h| h.upstream)
    };
    let feeds_on_wanted = |h: &Holder| {
        let mut at = Some(h.machine);
        // A chain longer than the holders is a loop: it is not taken.
        for _ in 0..=holders.len() {
            match at {
                None => return false,
                Some(m) if m == w.machine => return true,
                Some(m) => at = upstream(m),
            }
        }
        true
    };
    holders
        .iter()
        .enumerate()
        .filter(|(_, h)| h.drive == w.drive && h.cluster == w.cluster && h.machine != w.machine)
        .filter(|(_, h)| Some(h.machine) != failed && h.uploads < UPLOADS_PER_HOLDER && !feeds_on_wanted(h))
        .min_by_key(|(i, h)| (h.uploads, *i))
        .map(|(i, _)| i)
}

/// Holds back the fills from the origin past each cluster's limit (`room`: how many more it
/// may start, by cluster; a cluster not named has no limit): they wait, as for a busy holder.
pub fn within_origin_limit(
    wanted: &[Wanted<'_>],
    chosen: &mut [Source],
    room: &std::collections::HashMap<String, i64>,
) {
    let mut room = room.clone();
    for (w, source) in wanted.iter().zip(chosen.iter_mut()) {
        if *source != Source::Origin {
            continue;
        }
        if let Some(left) = room.get_mut(w.cluster) {
            if *left <= 0 {
                *source = Source::Wait;
            } else {
                *left -= 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u128) -> Uuid {
        Uuid::from_u128(n)
    }

    fn holder(drive: u128, machine: u128, cluster: &str, uploads: i64) -> Holder {
        Holder {
            drive: id(drive),
            machine: id(machine),
            name: format!("gpu-{machine:02}"),
            cluster: cluster.into(),
            manifest: "a".repeat(64),
            uploads,
            relay: false,
            upstream: None,
        }
    }

    fn relay(drive: u128, machine: u128, upstream: u128, uploads: i64) -> Holder {
        Holder { relay: true, upstream: Some(id(upstream)), ..holder(drive, machine, "main", uploads) }
    }

    fn wanted(drive: u128, machine: u128) -> Wanted<'static> {
        Wanted { drive: id(drive), machine: id(machine), cluster: "main" }
    }

    #[test]
    fn holders_serve_the_least_busy_first_and_no_more_than_their_slots() {
        // Holder 0 has an upload under way, holders 1 and 2 none: they serve one each, then the
        // last two wait for a slot or a new holder rather than read the origin.
        let holders = [holder(1, 10, "main", 1), holder(1, 11, "main", 0), holder(1, 12, "main", 0)];
        let want: Vec<_> = (20..24).map(|m| wanted(1, m)).collect();
        let (peer, wait) = (Source::Peer, Source::Wait);
        assert_eq!(choose(&want, &holders), vec![peer(1), peer(2), wait, wait]);
    }

    #[test]
    fn a_copy_being_pulled_serves_the_next_as_a_holder_does() {
        // The whole copy's slot is taken; the copy it is sending serves the next.
        let holders = [holder(1, 10, "main", 1), relay(1, 11, 10, 0)];
        let want: Vec<_> = (20..22).map(|m| wanted(1, m)).collect();
        assert_eq!(choose(&want, &holders), vec![Source::Peer(1), Source::Wait]);
    }

    #[test]
    fn a_failed_pull_is_tried_from_another_holder_whose_copy_does_not_come_from_its_own() {
        // Machine 20 pulled from 11 (a relay of 10), which failed. 21 and 22 pull from 20, 23
        // from 21: they wait on 20's copy. 10 has no slot free; 12 holds it whole, and has.
        let holders = [
            holder(1, 10, "main", 1),
            relay(1, 11, 10, 1),
            relay(1, 21, 20, 1),
            relay(1, 22, 20, 0),
            relay(1, 23, 21, 0),
            holder(1, 12, "main", 0),
        ];
        let w = wanted(1, 20);
        assert_eq!(choose_again(&w, &holders, Some(id(11))), Some(5));
        // Without 12: none, rather than a machine that waits on 20's own copy.
        assert_eq!(choose_again(&w, &holders[..5], Some(id(11))), None);
        // A loop among relays is not taken either.
        let looped = [relay(1, 30, 31, 0), relay(1, 31, 30, 0)];
        assert_eq!(choose_again(&w, &looped, None), None);
    }

    #[test]
    fn fills_from_the_origin_past_the_clusters_limit_wait() {
        // Room for one more in main: the first of three goes, the others wait; another cluster
        // has no limit; a peer fill is no origin fill.
        let want =
            [wanted(1, 20), wanted(2, 21), Wanted { cluster: "other", ..wanted(3, 22) }, wanted(4, 23)];
        let mut chosen = vec![Source::Origin, Source::Peer(0), Source::Origin, Source::Origin];
        let room = std::collections::HashMap::from([("main".to_owned(), 1)]);
        within_origin_limit(&want, &mut chosen, &room);
        assert_eq!(chosen, vec![Source::Origin, Source::Peer(0), Source::Origin, Source::Wait]);
    }

    #[test]
    fn only_a_holder_of_the_same_drive_in_the_same_cluster_and_not_itself_serves() {
        let holders = [
            holder(2, 10, "main", 0),
            holder(1, 11, "other", 0),
            holder(1, 20, "main", 0),
            holder(1, 12, "main", 0),
        ];
        // Drive 1 on machine 20: not drive 2's holder, not the other cluster's, not itself.
        assert_eq!(choose(&[wanted(1, 20)], &holders), vec![Source::Peer(3)]);
        assert_eq!(choose(&[wanted(3, 20)], &holders), vec![Source::Origin], "nobody holds drive 3");
        // The holder itself, were it to need the copy again, reads the origin.
        assert_eq!(choose(&[wanted(2, 10)], &holders), vec![Source::Origin]);
    }
}
