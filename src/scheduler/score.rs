//! Scores: among machines that fit, which is best. Higher wins, compared field by field, so a
//! complete copy of the run's drives outweighs any amount of free space or resources.

use std::cmp::Reverse;

use super::snapshot::{CopyState, MachineView, Request};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Score {
    /// The bytes of the run's placed drives with no copy here, in whole GB: what placing the
    /// worker here makes the cluster fill. A machine holding the largest of two drives beats
    /// one holding the smaller whole and the larger not at all.
    pub to_fill: Reverse<i64>,
    /// The run's placed drives with a complete copy here.
    pub complete: usize,
    /// … with a copy being filled here.
    pub filling: usize,
    /// Seconds until the data not yet whole here could be, in steps of [`READY_STEP`]: what its
    /// copies being filled have left and what it has no copy of, at its fill rate. Among
    /// machines with as many copies, a copy nearer whole or a faster fill starts the worker
    /// sooner.
    pub ready_in: Reverse<i64>,
    /// The machine holds the worker's image: the data comes first, as it is larger by far.
    pub image: bool,
    /// Room left for new copies without evicting (when the run mounts placed drives; none
    /// otherwise), less [`COPY_WORTH`] for each copy the machine holds, in whole GB: among
    /// machines as good for the worker's own data, it goes where it keeps least data from the
    /// workers that mount it, and evicts least. Finer differences are noise from disks that
    /// change under the machines.
    pub room: i64,
    /// 0–100: how much cpu and memory is left after the worker.
    pub resources: i64,
    /// The copies `room` was lessened for, for the event to say.
    pub held: i64,
}

const GB: i64 = 1_000_000_000;

/// What a copy a machine holds is worth, in room: a worker needing none of it goes to a
/// machine holding fewer copies, unless the other has this much more room for each. Measured
/// in `astraeus sim` (docs/placement.md): a heavier weight starts a few more workers warm, and
/// past 500 GB fills more bytes for it.
pub const COPY_WORTH: i64 = 500 * GB;

/// The step `ready_in` is counted in: estimates closer than this are the same, so room and
/// resources decide between them.
pub const READY_STEP: i64 = 60;

/// The fill rate assumed of a machine whose fills were never measured: the same for every such
/// machine, so it only weighs what is left to fill.
pub const DEFAULT_FILL_RATE: i64 = 100_000_000;

impl std::fmt::Display for Score {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.to_fill.0 > 0 {
            let to_fill = crate::domain::quantity::human_bytes((self.to_fill.0 * GB) as u64);
            write!(f, "{to_fill} to fill, ")?;
        }
        write!(f, "complete copies {}, filling {}, ", self.complete, self.filling)?;
        if self.ready_in.0 > 0 {
            write!(f, "data ready in {}, ", crate::domain::quantity::human_seconds(self.ready_in.0))?;
        }
        write!(
            f,
            "image {}, data room {}, copies held {}, resources {}",
            if self.image { "held" } else { "to pull" },
            crate::domain::quantity::human_bytes((self.data_free().max(0) * GB) as u64),
            self.held,
            self.resources
        )
    }
}

impl Score {
    /// The room left without evicting, in whole GB, before the copies held were weighed.
    fn data_free(&self) -> i64 {
        self.room.saturating_add(self.held.saturating_mul(COPY_WORTH / GB))
    }
}

pub fn score(m: &MachineView, r: &Request) -> Score {
    let count = |state| r.placed().filter(|d| m.copy_state(d.id) == Some(state)).count();
    // What this pass's evictions freed is not free yet: the room only shrinks in a pass.
    let data_free =
        if r.placed().next().is_some() { m.data_free.unwrap_or(0).saturating_sub(m.freed) } else { 0 };
    Score {
        to_fill: Reverse(to_fill(m, r) / GB),
        complete: count(CopyState::Complete),
        filling: count(CopyState::Filling),
        ready_in: Reverse(ready_in(m, r)),
        image: m.holds_image(r),
        // Rounded down, so that the room before the copies were weighed is exact in GB.
        room: data_free.saturating_sub(m.held.saturating_mul(COPY_WORTH)).div_euclid(GB),
        resources: least_allocated(m, r),
        held: m.held,
    }
}

/// The bytes of `r`'s placed drives with no copy on `m`: what placing a worker there makes the
/// cluster fill. Size hints are a workspace's to set: the sum saturates.
pub fn to_fill(m: &MachineView, r: &Request) -> i64 {
    r.placed()
        .filter(|d| m.copy_state(d.id).is_none())
        .map(|d| d.size_hint.max(0))
        .fold(0, i64::saturating_add)
}

/// Seconds, rounded up to [`READY_STEP`], until `r`'s placed drives could all be whole on
/// `m`: the bytes its copies being filled have left and the whole size of those it has no copy
/// of, at its fill rate (they share it).
pub fn ready_in(m: &MachineView, r: &Request) -> i64 {
    let left: u64 = r
        .placed()
        .map(|d| match m.copy_state(d.id) {
            Some(CopyState::Complete) => 0,
            _ => d.size_hint.saturating_sub(m.filled.get(&d.id).copied().unwrap_or(0)).max(0) as u64,
        })
        .fold(0, u64::saturating_add);
    let rate = m.fill_rate.filter(|r| *r > 0).unwrap_or(DEFAULT_FILL_RATE) as u64;
    let steps = left.div_ceil(rate).div_ceil(READY_STEP as u64);
    i64::try_from(steps).unwrap_or(i64::MAX / READY_STEP) * READY_STEP
}

/// The most a machine's score `s` for `r` can become later in the same pass: copies only
/// leave (evicted), resources and data room only shrink as workers are bound, and a copy made
/// for another worker can turn up as filling, at most for each of the run's drives not whole
/// here, leaving nothing to fill. Such a copy has written nothing, so `ready_in` stays as it is.
pub fn bound(s: Score, r: &Request) -> Score {
    Score { to_fill: Reverse(0), filling: r.placed().count() - s.complete, ..s }
}

/// kube-scheduler's LeastAllocated: the mean of the cpu and memory shares left free, 0–100.
pub fn least_allocated(m: &MachineView, r: &Request) -> i64 {
    let left =
        |free: i64, asked: i64, total: i64| if total <= 0 { 0 } else { 100 * (free - asked).max(0) / total };
    (left(m.cpu_free, r.cpu_millis, m.cpu_total) + left(m.memory_free, r.memory_bytes, m.memory_total)) / 2
}

#[cfg(test)]
mod tests {
    use crate::scheduler::snapshot::ByDrive;

    use super::*;
    use crate::domain::drive::{NodeScope, Transport};
    use crate::domain::task::NodeSelection;
    use crate::scheduler::snapshot::DriveNeed;
    use uuid::Uuid;

    fn machine(cpu_free: i64, memory_free: i64) -> MachineView {
        MachineView {
            id: Uuid::nil(),
            name: "m".into(),
            cluster: "main".into(),
            ready: true,
            cordoned: false,
            transports: vec![],
            cpu_total: 4000,
            memory_total: 8_000,
            cpu_free,
            memory_free,
            gpus_total: 0,
            gpus_free: 0,
            data_free: Some(1_000),
            reclaimable: 0,
            held: 0,
            freed: 0,
            images: vec![],
            copies: ByDrive::default(),
            filled: ByDrive::default(),
            fill_rate: None,
        }
    }

    fn request(drives: Vec<DriveNeed>) -> Request {
        Request {
            cluster: "main".into(),
            cpu_millis: 1000,
            memory_bytes: 2_000,
            gpus: 0,
            selection: NodeSelection::default(),
            drives,
            fill: false,
            image: None,
        }
    }

    fn drive() -> DriveNeed {
        DriveNeed {
            host_path: None,
            id: Uuid::from_u128(1),
            name: "d".into(),
            full: "ws.d".into(),
            scope: Some(NodeScope::Placed),
            node: None,
            transport: Transport::Auto,
            size_hint: 10,
            evictable: false,
        }
    }

    fn with_copy(mut m: MachineView, state: CopyState) -> MachineView {
        m.copies.insert(Uuid::from_u128(1), state);
        m
    }

    #[test]
    fn the_emptier_machine_scores_higher() {
        let r = request(vec![]);
        // cpu: 100 * (4000 - 1000) / 4000 = 75; memory: 100 * (8000 - 2000) / 8000 = 75; mean 75.
        assert_eq!(score(&machine(4000, 8_000), &r).resources, 75);
        // cpu: 100 * (2000 - 1000) / 4000 = 25; memory: 100 * (4000 - 2000) / 8000 = 25; mean 25.
        assert_eq!(score(&machine(2000, 4_000), &r).resources, 25);
        // Nothing left: 0.
        assert_eq!(score(&machine(1000, 2_000), &r).resources, 0);
    }

    #[test]
    fn a_complete_copy_outweighs_a_filling_one_which_outweighs_none() {
        let r = request(vec![drive()]);
        let busy_complete = score(&with_copy(machine(1000, 2_000), CopyState::Complete), &r);
        let idle_filling = score(&with_copy(machine(4000, 8_000), CopyState::Filling), &r);
        let mut roomy = machine(4000, 8_000);
        roomy.data_free = Some(1 << 50);
        let idle_none = score(&roomy, &r);
        assert!(busy_complete > idle_filling, "{busy_complete:?} {idle_filling:?}");
        assert!(idle_filling > idle_none, "{idle_filling:?} {idle_none:?}");
    }

    #[test]
    fn among_as_many_copies_the_data_whole_soonest_scores_higher() {
        let mut d = drive();
        d.size_hint = 6 * GB;
        let r = request(vec![d]);
        let at = |state: Option<CopyState>, written: i64, rate: Option<i64>| {
            let mut m = machine(4000, 8_000);
            if let Some(state) = state {
                m = with_copy(m, state);
                m.filled.insert(Uuid::from_u128(1), written);
            }
            m.fill_rate = rate;
            m
        };
        let slow = Some(10_000_000);
        // 5 GB left at 10 MB/s: 500 s, 540 in steps of 60. 1 GB left: 100 s, 120.
        let behind = score(&at(Some(CopyState::Filling), GB, slow), &r);
        let ahead = score(&at(Some(CopyState::Filling), 5 * GB, slow), &r);
        assert_eq!((behind.ready_in.0, ahead.ready_in.0), (540, 120));
        assert!(ahead > behind);
        // No copy: 6 GB at 1 GB/s is 6 s, 60 in steps; at the default 100 MB/s, 60 s: the same.
        // At 10 MB/s, 600 s.
        let fast = score(&at(None, 0, Some(GB)), &r);
        let unknown = score(&at(None, 0, None), &r);
        let cold_slow = score(&at(None, 0, slow), &r);
        assert_eq!((fast.ready_in.0, unknown.ready_in.0, cold_slow.ready_in.0), (60, 60, 600));
        assert_eq!(fast, unknown);
        assert!(unknown > cold_slow);
        // A copy being filled outranks none however slow; a whole one outranks both.
        assert!(behind > fast);
        assert!(score(&at(Some(CopyState::Complete), 0, slow), &r) > ahead);
        // A copy of a size hint larger than what is written of it never makes the time negative.
        assert_eq!(score(&at(Some(CopyState::Filling), 7 * GB, slow), &r).ready_in.0, 0);
    }

    #[test]
    fn the_fewest_bytes_to_fill_outrank_more_whole_copies() {
        let drive = |n: u128, size: i64| DriveNeed { id: Uuid::from_u128(n), size_hint: size, ..drive() };
        let r = request(vec![drive(1, 5000 * GB), drive(2, 10 * GB), drive(3, 10 * GB)]);
        let holding = |copies: &[(u128, CopyState)]| {
            let mut m = machine(4000, 8_000);
            m.copies = copies.iter().map(|(n, s)| (Uuid::from_u128(*n), *s)).collect();
            score(&m, &r)
        };
        // Two small drives whole leave 5 TB to fill; the large one whole leaves 20 GB.
        let small = holding(&[(2, CopyState::Complete), (3, CopyState::Complete)]);
        let large = holding(&[(1, CopyState::Complete)]);
        assert_eq!((small.to_fill.0, large.to_fill.0), (5000, 20));
        assert!(large > small, "{large:?} {small:?}");
        // Copies being filled leave nothing new to fill: they beat whole copies of fewer drives,
        // and lose to as many with one whole.
        let filling = holding(&[(1, CopyState::Filling), (2, CopyState::Filling), (3, CopyState::Filling)]);
        let one_whole =
            holding(&[(1, CopyState::Complete), (2, CopyState::Filling), (3, CopyState::Filling)]);
        assert!(filling > large && one_whole > filling);
        assert!(small.to_string().starts_with("5.0 TB to fill, complete copies 2, filling 0, "), "{small}");
        assert!(one_whole.to_string().starts_with("complete copies 1, filling 2, "), "{one_whole}");
    }

    #[test]
    fn without_drives_data_space_does_not_count() {
        let r = request(vec![]);
        let mut a = machine(4000, 8_000);
        a.data_free = Some(1 << 40);
        assert_eq!(score(&a, &r), score(&machine(4000, 8_000), &r));
    }

    #[test]
    fn a_held_image_counts_after_the_data() {
        let mut r = request(vec![drive()]);
        r.image = Some("docker.io/library/busybox:1.36".into());
        let mut holds = machine(2000, 4_000);
        holds.images = vec!["docker.io/library/busybox:1.36".into()];
        let idle = machine(4000, 8_000);
        assert!(score(&holds, &r) > score(&idle, &r), "the image outweighs free resources");
        assert!(
            score(&with_copy(idle, CopyState::Filling), &r) > score(&holds, &r),
            "the data outweighs the image"
        );
        assert_eq!(
            score(&holds, &r).to_string(),
            "complete copies 0, filling 0, data ready in 1 min, image held, data room 0 B, copies held 0, resources 25"
        );
    }

    #[test]
    fn a_worker_needing_a_fill_either_way_spares_the_machine_holding_more_copies() {
        let r = request(vec![drive()]);
        let at = |free: i64, reclaimable: i64, held: i64| {
            let mut m = machine(4000, 8_000);
            (m.data_free, m.reclaimable, m.held) = (Some(free), reclaimable, held);
            score(&m, &r)
        };
        // 4 TB free and 5 copies: 4,000 - 5 * 500 = 1,500 GB; 3 TB and 1 copy: 2,500 GB.
        let many = at(4000 * GB, 0, 5);
        let few = at(3000 * GB, 0, 1);
        assert_eq!((many.room, few.room), (1500, 2500));
        assert!(few > many, "{few:?} {many:?}");
        // Each copy is worth 500 GB of room: 600 GB more room per copy wins all the same.
        assert!(at(6000 * GB, 0, 5) > at(3000 * GB, 0, 0));
        // Room freed only by evicting unused copies does not count: they are data, too.
        assert!(at(2000 * GB, 0, 0) > at(1000 * GB, 5000 * GB, 0));
        assert!(many.to_string().ends_with("data room 4.0 TB, copies held 5, resources 75"), "{many}");
    }

    #[test]
    fn room_freed_by_the_passs_own_evictions_does_not_raise_the_score() {
        let r = request(vec![drive()]);
        let mut m = machine(4000, 8_000);
        (m.data_free, m.reclaimable, m.held) = (Some(100 * GB), 900 * GB, 2);
        let before = score(&m, &r);
        // An eviction of 900 GB for a copy of 10 GB: counted as room, for the filters.
        (m.data_free, m.freed, m.reclaimable) = (Some(990 * GB), 900 * GB, 0);
        assert!(score(&m, &r) <= before, "bounds on a machine's score hold for the whole pass");
    }
}
