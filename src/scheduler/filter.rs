//! Filters: whether a machine can take a worker, and if not, why, in words a person can act on.

use super::snapshot::{MachineView, Request};
use crate::domain::quantity::human_bytes;

/// `Ok` when the machine fits, otherwise the first reason it does not.
pub fn fits(m: &MachineView, r: &Request) -> Result<(), String> {
    if m.cluster != r.cluster {
        return Err(format!("not in cluster {}", r.cluster));
    }
    if !r.selects(&m.name) {
        return Err("not among the run's node_selection names".into());
    }
    if !m.ready {
        return Err("NotReady".into());
    }
    if m.cpu_free < r.cpu_millis {
        return Err(format!(
            "Insufficient cpu ({} of {} cores free)",
            m.cpu_free.max(0) as f64 / 1000.0,
            r.cpu_millis as f64 / 1000.0
        ));
    }
    if m.memory_free < r.memory_bytes {
        return Err(format!(
            "Insufficient memory ({} of {} free)",
            human_bytes(m.memory_free.max(0) as u64),
            human_bytes(r.memory_bytes as u64)
        ));
    }
    if m.gpus_free < r.gpus {
        return Err(format!("Insufficient gpus ({} of {} free)", m.gpus_free.max(0), r.gpus));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Name;
    use crate::domain::task::{NodeSelection, SelectionMode};
    use uuid::Uuid;

    fn machine() -> MachineView {
        MachineView {
            id: Uuid::nil(),
            name: "gpu-01".into(),
            cluster: "main".into(),
            ready: true,
            cpu_total: 2000,
            memory_total: 4_000_000_000,
            cpu_free: 2000,
            memory_free: 4_000_000_000,
            gpus_free: 1,
        }
    }

    fn request() -> Request {
        Request {
            cluster: "main".into(),
            cpu_millis: 1000,
            memory_bytes: 268_435_456,
            gpus: 0,
            selection: NodeSelection::default(),
        }
    }

    #[test]
    fn each_filter_says_why_it_rejects() {
        type Case = (fn(&mut MachineView, &mut Request), &'static str);
        let cases: [Case; 7] = [
            (|_, _| {}, ""),
            (|m, _| m.cluster = "other".into(), "not in cluster main"),
            (|m, _| m.ready = false, "NotReady"),
            // 2 cores free, 3 asked.
            (|_, r| r.cpu_millis = 3000, "Insufficient cpu (2 of 3 cores free)"),
            (|_, r| r.memory_bytes = 5_000_000_000, "Insufficient memory (4.0 GB of 5.0 GB free)"),
            (|_, r| r.gpus = 2, "Insufficient gpus (1 of 2 free)"),
            (
                |_, r| {
                    r.selection = NodeSelection {
                        mode: SelectionMode::Exact,
                        names: vec![Name::parse("gpu-02").unwrap()],
                    }
                },
                "not among the run's node_selection names",
            ),
        ];
        for (edit, why) in cases {
            let (mut m, mut r) = (machine(), request());
            edit(&mut m, &mut r);
            assert_eq!(fits(&m, &r).err().unwrap_or_default(), why);
        }
    }
}
