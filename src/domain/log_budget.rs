//! How much of an upload of log lines is kept: a cap in bytes per worker, a quota per workspace.

use super::quantity::binary_bytes;

/// Bytes of logs one worker may keep by default.
pub const DEFAULT_PER_WORKER: u64 = 64 << 20;
/// Bytes of logs one workspace's workers may keep in all by default.
pub const DEFAULT_PER_WORKSPACE: u64 = 10 << 30;

/// The bounds, each in bytes; 0 turns one off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub per_worker: u64,
    pub per_workspace: u64,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits { per_worker: DEFAULT_PER_WORKER, per_workspace: DEFAULT_PER_WORKSPACE }
    }
}

/// Why a worker's output is being dropped. A worker past its cap stays cut; one cut by its
/// workspace's quota goes on once the workspace has room again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::Type)]
#[sqlx(type_name = "text", rename_all = "lowercase")]
pub enum Cut {
    Cap,
    Quota,
}

/// What the counters say before an upload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spent {
    /// Bytes the worker's output took towards its cap.
    pub worker_taken: u64,
    /// Bytes the workspace's workers keep now.
    pub workspace_kept: u64,
    pub cut: Option<Cut>,
}

/// What to do with an upload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The first `keep` lines are stored; the rest are dropped.
    pub keep: usize,
    /// Their bytes.
    pub bytes: u64,
    /// The worker's cut after this upload.
    pub cut: Option<Cut>,
    /// The one line saying output was cut, stored after the kept lines when it is newly cut.
    pub note: Option<String>,
}

/// A line costs its bytes and the newline the log is printed with, so that even empty lines
/// count.
pub fn cost(line: &str) -> u64 {
    line.len() as u64 + 1
}

/// Keeps the longest run of whole lines, from the first, that fits both the worker's cap and
/// the workspace's quota.
pub fn plan(lines: &[u64], spent: Spent, limits: Limits, workspace: &str) -> Plan {
    if spent.cut == Some(Cut::Cap) {
        return Plan { keep: 0, bytes: 0, cut: Some(Cut::Cap), note: None };
    }
    let room = |limit: u64, used: u64| if limit == 0 { u64::MAX } else { limit.saturating_sub(used) };
    let cap_room = room(limits.per_worker, spent.worker_taken);
    let quota_room = room(limits.per_workspace, spent.workspace_kept);
    let fits = cap_room.min(quota_room);
    let (mut keep, mut bytes) = (0, 0u64);
    for &size in lines {
        if bytes.saturating_add(size) > fits {
            break;
        }
        bytes += size;
        keep += 1;
    }
    if keep == lines.len() {
        return Plan { keep, bytes, cut: None, note: None };
    }
    let cut = if cap_room <= quota_room { Cut::Cap } else { Cut::Quota };
    let note = (spent.cut != Some(cut)).then(|| match cut {
        Cut::Cap => format!(
            "[astraeus] output past {} was not kept: this worker's logs are full (status.log_dropped counts the lines dropped)",
            binary_bytes(limits.per_worker)
        ),
        Cut::Quota => format!(
            "[astraeus] output is not kept while workspace {workspace} holds its quota of {} of logs: delete runs to make room (status.log_dropped counts the lines dropped)",
            binary_bytes(limits.per_workspace)
        ),
    });
    Plan { keep, bytes, cut: Some(cut), note }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits { per_worker: 100, per_workspace: 1000 };

    fn spent(worker_taken: u64, workspace_kept: u64, cut: Option<Cut>) -> Spent {
        Spent { worker_taken, workspace_kept, cut }
    }

    #[test]
    fn a_line_costs_its_bytes_and_a_newline() {
        assert_eq!(cost(""), 1);
        assert_eq!(cost("é"), 3);
    }

    #[test]
    fn lines_that_fit_are_all_kept() {
        // 60 + 30 + 10 = 100 = the cap: all fit, nothing cut.
        let p = plan(&[30, 30, 10], spent(30, 0, None), LIMITS, "ws");
        assert_eq!(p, Plan { keep: 3, bytes: 70, cut: None, note: None });
    }

    #[test]
    fn a_worker_past_its_cap_keeps_whole_lines_to_the_cap_and_one_note() {
        // 90 taken, 10 of room: the 6-byte line fits, 6 + 5 = 11 does not.
        let p = plan(&[6, 5, 1], spent(90, 0, None), LIMITS, "ws");
        assert_eq!((p.keep, p.bytes, p.cut), (1, 6, Some(Cut::Cap)));
        assert!(p.note.unwrap().starts_with("[astraeus] output past 100 B was not kept"));
    }

    #[test]
    fn a_cut_worker_keeps_nothing_more_and_says_so_once() {
        let p = plan(&[1], spent(100, 0, Some(Cut::Cap)), LIMITS, "ws");
        assert_eq!(p, Plan { keep: 0, bytes: 0, cut: Some(Cut::Cap), note: None });
        // Not even when the quota had cut it before and the cap is what is reached now.
        let p = plan(&[1], spent(100, 999, Some(Cut::Quota)), LIMITS, "ws");
        assert_eq!((p.keep, p.cut), (0, Some(Cut::Cap)));
        assert!(p.note.is_some(), "the cap's note follows the quota's");
    }

    #[test]
    fn a_workspace_at_its_quota_drops_new_lines_until_it_has_room() {
        // 995 of 1000 kept: 5 bytes of room.
        let p = plan(&[5, 1], spent(0, 995, None), LIMITS, "ws");
        assert_eq!((p.keep, p.cut), (1, Some(Cut::Quota)));
        assert!(p.note.unwrap().contains("workspace ws holds its quota of 1000 B"));
        let p = plan(&[1], spent(5, 1000, Some(Cut::Quota)), LIMITS, "ws");
        assert_eq!(p, Plan { keep: 0, bytes: 0, cut: Some(Cut::Quota), note: None });
        // Room again (a run was deleted): lines are kept, the cut is lifted.
        let p = plan(&[1], spent(5, 10, Some(Cut::Quota)), LIMITS, "ws");
        assert_eq!(p, Plan { keep: 1, bytes: 1, cut: None, note: None });
    }

    #[test]
    fn the_nearer_bound_names_the_cut() {
        // Cap room 100 - 95 = 5, quota room 1000 - 992 = 8: the cap is nearer.
        assert_eq!(plan(&[9], spent(95, 992, None), LIMITS, "ws").cut, Some(Cut::Cap));
        // Cap room 100 - 90 = 10, quota room 8: the quota is.
        assert_eq!(plan(&[9], spent(90, 992, None), LIMITS, "ws").cut, Some(Cut::Quota));
    }

    #[test]
    fn zero_turns_a_bound_off() {
        let off = Limits { per_worker: 0, per_workspace: 0 };
        let p = plan(&[u64::MAX / 4, u64::MAX / 4], spent(u64::MAX / 4, u64::MAX / 4, None), off, "ws");
        assert_eq!(p.keep, 2);
    }
}
