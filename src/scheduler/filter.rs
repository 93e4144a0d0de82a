//! Filters: whether a machine can take a worker, and if not, why, in words a person can act on.

use super::snapshot::{DriveNeed, MachineView, Request};
use crate::domain::drive::Transport;
use crate::domain::grant::{self, Grant};
use crate::domain::path::AbsPath;
use crate::domain::quantity::human_bytes;

/// Why the worker may start nowhere: a host path it mounts that none of its workspace's
/// `grants` on the cluster covers any more (a grant narrowed or removed since its run was made).
pub fn ungranted(r: &Request, grants: &[Grant]) -> Option<String> {
    r.drives.iter().find_map(|d| {
        let path = d.host_path.as_deref()?;
        let covered = AbsPath::parse(path).is_ok_and(|p| grant::covering(grants, &p).is_some());
        let namespace = d.full.strip_suffix(&d.name).unwrap_or(&d.full).trim_end_matches('.');
        (!covered).then(|| {
            format!(
                "drive {} mounts {path}, which is no longer under a host path granted to workspace \
                 {namespace} on cluster {}",
                d.full, r.cluster
            )
        })
    })
}

/// `Ok` when the machine fits, otherwise the first reason it does not.
pub fn fits(m: &MachineView, r: &Request) -> Result<(), String> {
    admits(m, r)?;
    resources(m.cpu_free, m.memory_free, m.gpus_free, r)?;
    data_fits(m, r)
}

/// Whether the machine would fit once the workers on it ended: stage-in fills its data ahead
/// for a worker that waits for resources.
pub fn fits_when_free(m: &MachineView, r: &Request) -> bool {
    admits(m, r).is_ok()
        && resources(m.cpu_total, m.memory_total, m.gpus_total, r).is_ok()
        && lacks_room(m, r).is_none()
}

/// [`fits`] without its reasons, for the scans that turn most machines down.
pub fn can_take(m: &MachineView, r: &Request) -> bool {
    has_resources(m, r) && lacks_room(m, r).is_none() && admits(m, r).is_ok()
}

/// Everything but resources and data: whether the machine may take the worker at all.
fn admits(m: &MachineView, r: &Request) -> Result<(), String> {
    if m.cluster != r.cluster {
        return Err(format!("not in cluster {}", r.cluster));
    }
    if !r.selects(&m.name) {
        return Err("not among the run's node_selection names".into());
    }
    for d in r.drives.iter().filter(|d| d.transport == Transport::Local) {
        if let Some(node) = d.node.as_deref().filter(|n| *n != m.name) {
            return Err(format!("drive {} is reached only on {node} (transport Local)", d.name));
        }
    }
    if !m.ready {
        return Err("NotReady".into());
    }
    if m.cordoned && !r.fill {
        return Err("cordoned".into());
    }
    Ok(())
}

fn has_resources(m: &MachineView, r: &Request) -> bool {
    m.cpu_free >= r.cpu_millis && m.memory_free >= r.memory_bytes && m.gpus_free >= r.gpus
}

fn resources(cpu_free: i64, memory_free: i64, gpus_free: i64, r: &Request) -> Result<(), String> {
    if cpu_free < r.cpu_millis {
        return Err(format!(
            "Insufficient cpu ({} of {} cores free)",
            cpu_free.max(0) as f64 / 1000.0,
            r.cpu_millis as f64 / 1000.0
        ));
    }
    if memory_free < r.memory_bytes {
        return Err(format!(
            "Insufficient memory ({} of {} free)",
            human_bytes(memory_free.max(0) as u64),
            human_bytes(r.memory_bytes as u64)
        ));
    }
    if gpus_free < r.gpus {
        return Err(format!("Insufficient gpus ({} of {} free)", gpus_free.max(0), r.gpus));
    }
    Ok(())
}

/// Each placed drive without a copy here needs a confirmed data location with room for its
/// `size_hint_bytes`, counting what evicting unused copies would free.
fn data_fits(m: &MachineView, r: &Request) -> Result<(), String> {
    match lacks_room(m, r) {
        None => Ok(()),
        Some(Lack::Location) => Err(format!("Choose where to keep data on {}", m.name)),
        Some(Lack::Room { drive, room }) => Err(format!(
            "drive {} needs {} at this machine's data location, {} free",
            drive.name,
            human_bytes(drive.size_hint as u64),
            human_bytes(room.max(0) as u64)
        )),
    }
}

/// What keeps the machine from holding `r`'s data: [`data_fits`] before it is written out.
enum Lack<'a> {
    /// No confirmed data location.
    Location,
    /// The first drive the room runs out at, and the room.
    Room { drive: &'a DriveNeed, room: i64 },
}

fn lacks_room<'a>(m: &MachineView, r: &'a Request) -> Option<Lack<'a>> {
    let mut missing = r.placed().filter(|d| m.copy_state(d.id).is_none()).peekable();
    missing.peek()?;
    let Some(free) = m.data_free else {
        return Some(Lack::Location);
    };
    let room = free + m.reclaimable;
    let mut need = 0;
    for d in missing {
        need += d.size_hint;
        if need > room {
            return Some(Lack::Room { drive: d, room });
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use crate::scheduler::snapshot::ByDrive;

    use super::*;
    use crate::domain::Name;
    use crate::domain::drive::NodeScope;
    use crate::domain::task::{NodeSelection, SelectionMode};
    use crate::scheduler::snapshot::{CopyState, DriveNeed};
    use uuid::Uuid;

    fn machine() -> MachineView {
        MachineView {
            id: Uuid::nil(),
            name: "gpu-01".into(),
            cluster: "main".into(),
            ready: true,
            cordoned: false,
            transports: vec![],
            cpu_total: 2000,
            memory_total: 4_000_000_000,
            cpu_free: 2000,
            memory_free: 4_000_000_000,
            gpus_total: 1,
            gpus_free: 1,
            data_free: Some(2_100_000_000),
            reclaimable: 0,
            held: 0,
            freed: 0,
            images: vec![],
            copies: ByDrive::default(),
            filled: ByDrive::default(),
            fill_rate: None,
        }
    }

    fn food101() -> DriveNeed {
        DriveNeed {
            host_path: None,
            id: Uuid::from_u128(101),
            name: "food101".into(),
            full: "default.food101".into(),
            scope: Some(NodeScope::Placed),
            node: None,
            transport: Transport::Auto,
            size_hint: 6_000_000_000,
            evictable: true,
        }
    }

    fn request() -> Request {
        Request {
            cluster: "main".into(),
            cpu_millis: 1000,
            memory_bytes: 268_435_456,
            gpus: 0,
            selection: NodeSelection::default(),
            drives: vec![],
            fill: false,
            image: None,
        }
    }

    #[test]
    fn each_filter_says_why_it_rejects() {
        type Case = (fn(&mut MachineView, &mut Request), &'static str);
        let cases: [Case; 15] = [
            (|_, _| {}, ""),
            (|m, _| m.cluster = "other".into(), "not in cluster main"),
            (|m, _| m.ready = false, "NotReady"),
            (|m, _| m.cordoned = true, "cordoned"),
            // A fill serves workers already on the machine.
            (
                |m, r| {
                    m.cordoned = true;
                    r.fill = true;
                },
                "",
            ),
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
            // The recipe's last troubleshooting row: 6.0 GB asked, 2.1 GB free.
            (
                |_, r| r.drives = vec![food101()],
                "drive food101 needs 6.0 GB at this machine's data location, 2.1 GB free",
            ),
            (
                |m, r| {
                    m.data_free = None;
                    r.drives = vec![food101()];
                },
                "Choose where to keep data on gpu-01",
            ),
            // A copy already here needs no room.
            (
                |m, r| {
                    m.copies.insert(Uuid::from_u128(101), CopyState::Complete);
                    r.drives = vec![food101()];
                },
                "",
            ),
            // 2.1 GB free + 4.0 GB that evicting unused copies would free = 6.1 GB for 6.0 GB.
            (
                |m, r| {
                    m.reclaimable = 4_000_000_000;
                    r.drives = vec![food101()];
                },
                "",
            ),
            // 2.1 GB free + 3.8 GB to evict = 5.9 GB, short of 6.0 GB.
            (
                |m, r| {
                    m.reclaimable = 3_800_000_000;
                    r.drives = vec![food101()];
                },
                "drive food101 needs 6.0 GB at this machine's data location, 5.9 GB free",
            ),
            (
                |_, r| {
                    let mut d = food101();
                    d.scope = None;
                    d.node = Some("gpu-02".into());
                    d.transport = Transport::Local;
                    r.drives = vec![d];
                },
                "drive food101 is reached only on gpu-02 (transport Local)",
            ),
        ];
        for (edit, why) in cases {
            let (mut m, mut r) = (machine(), request());
            edit(&mut m, &mut r);
            assert_eq!(fits(&m, &r).err().unwrap_or_default(), why);
            assert_eq!(can_take(&m, &r), why.is_empty(), "can_take agrees with fits: {why}");
        }
    }

    #[test]
    fn a_host_path_no_grant_covers_any_more_is_named() {
        use crate::domain::task::Mode;
        let mut r = request();
        let mut d = food101();
        d.scope = Some(NodeScope::Shared);
        d.host_path = Some("/scratch/ml/food101".into());
        r.drives = vec![d];
        let grant = |p: &str| Grant { path: AbsPath::parse(p).unwrap(), mode: Mode::ReadOnly };
        assert_eq!(ungranted(&r, &[grant("/scratch")]), None);
        assert_eq!(ungranted(&r, &[grant("/scratch/ml/food101")]), None);
        let why = "drive default.food101 mounts /scratch/ml/food101, which is no longer under a host \
                   path granted to workspace default on cluster main";
        assert_eq!(ungranted(&r, &[grant("/scratch/other")]).as_deref(), Some(why));
        assert_eq!(ungranted(&r, &[]).as_deref(), Some(why));
        r.drives[0].host_path = None;
        assert_eq!(ungranted(&r, &[]), None, "a placed drive needs no grant");
    }

    #[test]
    fn every_missing_drive_needs_room_at_once_and_a_copy_being_filled_needs_none() {
        let drive = |n: u128, name: &str, size_hint: i64| DriveNeed {
            host_path: None,
            id: Uuid::from_u128(n),
            name: name.into(),
            full: format!("default.{name}"),
            size_hint,
            ..food101()
        };
        let (m, mut r) = (machine(), request());
        // 1.5 GB fits in 2.1 GB; 1.5 + 1.5 = 3.0 GB does not: the second drive is named.
        r.drives = vec![drive(1, "cifar", 1_500_000_000), drive(2, "imagenet", 1_500_000_000)];
        assert_eq!(
            fits(&m, &r),
            Err("drive imagenet needs 1.5 GB at this machine's data location, 2.1 GB free".into())
        );
        // With cifar's copy already being filled here, only imagenet needs room.
        let mut filling = m.clone();
        filling.copies.insert(Uuid::from_u128(1), CopyState::Filling);
        assert_eq!(fits(&filling, &r), Ok(()));
        // Drives that are not placed need no data location at all.
        let mut none = m.clone();
        none.data_free = None;
        let mut shared = food101();
        shared.scope = Some(NodeScope::Shared);
        r.drives = vec![shared];
        assert_eq!(fits(&none, &r), Ok(()));
    }
}
