//! Scores: among machines that fit, which is best. Higher wins.

use super::snapshot::{MachineView, Request};

/// Prefers the machine with the most room left after the worker, so work spreads out
/// (kube-scheduler's LeastAllocated): the mean of the cpu and memory shares left free, 0–100.
pub fn score(m: &MachineView, r: &Request) -> i64 {
    let left =
        |free: i64, asked: i64, total: i64| if total <= 0 { 0 } else { 100 * (free - asked).max(0) / total };
    (left(m.cpu_free, r.cpu_millis, m.cpu_total) + left(m.memory_free, r.memory_bytes, m.memory_total)) / 2
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::task::NodeSelection;
    use uuid::Uuid;

    fn machine(cpu_free: i64, memory_free: i64) -> MachineView {
        MachineView {
            id: Uuid::nil(),
            name: "m".into(),
            cluster: "main".into(),
            ready: true,
            cpu_total: 4000,
            memory_total: 8_000,
            cpu_free,
            memory_free,
            gpus_free: 0,
        }
    }

    #[test]
    fn the_emptier_machine_scores_higher() {
        let r = Request {
            cluster: "main".into(),
            cpu_millis: 1000,
            memory_bytes: 2_000,
            gpus: 0,
            selection: NodeSelection::default(),
        };
        // cpu: 100 * (4000 - 1000) / 4000 = 75; memory: 100 * (8000 - 2000) / 8000 = 75; mean 75.
        assert_eq!(score(&machine(4000, 8_000), &r), 75);
        // cpu: 100 * (2000 - 1000) / 4000 = 25; memory: 100 * (4000 - 2000) / 8000 = 25; mean 25.
        assert_eq!(score(&machine(2000, 4_000), &r), 25);
        // Nothing left: 0.
        assert_eq!(score(&machine(1000, 2_000), &r), 0);
    }
}
