//! Scores: among machines that fit, which is best. Higher wins, compared field by field, so a
//! complete copy of the run's drives outweighs any amount of free space or resources.

use super::snapshot::{CopyState, MachineView, Request};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Score {
    /// The run's placed drives with a complete copy here.
    pub complete: usize,
    /// … with a copy being filled here.
    pub filling: usize,
    /// The machine holds the worker's image: the data comes first, as it is larger by far.
    pub image: bool,
    /// Room left for new copies in whole GB, when the run mounts placed drives: finer
    /// differences are noise from disks that change under the machines.
    pub data_free: i64,
    /// 0–100: how much cpu and memory is left after the worker.
    pub resources: i64,
}

const GB: i64 = 1_000_000_000;

impl std::fmt::Display for Score {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "complete copies {}, filling {}, image {}, data room {}, resources {}",
            self.complete,
            self.filling,
            if self.image { "held" } else { "to pull" },
            crate::domain::quantity::human_bytes((self.data_free.max(0) * GB) as u64),
            self.resources
        )
    }
}

pub fn score(m: &MachineView, r: &Request) -> Score {
    let count = |state| r.placed().filter(|d| m.copy_state(d.id) == Some(state)).count();
    let has_placed = r.placed().next().is_some();
    Score {
        complete: count(CopyState::Complete),
        filling: count(CopyState::Filling),
        image: m.holds_image(r),
        data_free: if has_placed { (m.data_free.unwrap_or(0) + m.reclaimable) / GB } else { 0 },
        resources: least_allocated(m, r),
    }
}

/// The most a machine's score `s` for `r` can become later in the same pass: copies only
/// leave (evicted), resources and data room only shrink as workers are bound, and a copy made
/// for another worker can turn up as filling, at most for each of the run's drives not whole
/// here.
pub fn bound(s: Score, r: &Request) -> Score {
    Score { filling: r.placed().count() - s.complete, ..s }
}

/// kube-scheduler's LeastAllocated: the mean of the cpu and memory shares left free, 0–100.
pub fn least_allocated(m: &MachineView, r: &Request) -> i64 {
    let left =
        |free: i64, asked: i64, total: i64| if total <= 0 { 0 } else { 100 * (free - asked).max(0) / total };
    (left(m.cpu_free, r.cpu_millis, m.cpu_total) + left(m.memory_free, r.memory_bytes, m.memory_total)) / 2
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

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
            images: vec![],
            copies: HashMap::new(),
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
            "complete copies 0, filling 0, image held, data room 0 B, resources 25"
        );
    }
}
