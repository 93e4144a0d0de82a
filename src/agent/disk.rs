//! The data location on disk: its usage, and the copies in `drives/<namespace>.<drive>`.
//!
//! The server names the data location and the copies to delete; the agent takes neither on
//! trust. The location must be its own `--data-location` or a folder beneath it, reached without
//! a symlink, and `drives/` is opened without following one: copies are then listed and removed
//! through that descriptor (`/proc/self/fd/N/<folder>`), so no link, at any depth, leads a
//! listing or a removal out of the data location.
//!
//! A heartbeat reads copies' sizes from what the measurer last found (`sizes`), never walks.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use rustix::fs::{CWD, Mode, OFlags};

use super::mounts;
use super::sizes::Sizes;
use crate::protocol::{CopyReport, DataUsage, HeartbeatRequest};

/// The file a fill writes last: a copy without it is not whole.
pub const MARKER: &str = ".astralyx-filled";

/// What a heartbeat says about `dir`: its usage and each copy's marker and latest known bytes
/// (0 for a copy not measured yet). It costs a step per copy, not per file.
pub fn report(dir: &Path, sizes: &Sizes) -> HeartbeatRequest {
    let copies = copies(dir, sizes);
    let used_bytes = copies.iter().map(|c| c.bytes).sum();
    let (total_bytes, free_bytes) = match rustix::fs::statvfs(dir) {
        Ok(s) => (s.f_blocks * s.f_frsize, s.f_bavail * s.f_frsize),
        Err(_) => (0, 0),
    };
    HeartbeatRequest {
        data_location: DataUsage { total_bytes, used_bytes, free_bytes, reserve_bytes: 0 },
        copies,
        images: None,
    }
}

/// `<dir>/drives`, opened without following a symlink there.
pub(super) fn open_drives(dir: &Path) -> Option<OwnedFd> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW;
    rustix::fs::openat(CWD, dir.join("drives"), flags, Mode::empty()).ok()
}

/// The path of `drives/` through its descriptor: nothing after it is looked up from the top.
fn through(fd: &OwnedFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// The data location the server confirmed, if it is `own` or a folder beneath it reached
/// without a symlink (made when missing).
pub fn accept_location(own: &Path, offered: &str) -> Result<PathBuf, String> {
    let path = Path::new(offered);
    let rel = path.strip_prefix(own).map_err(|_| {
        format!("{offered} is not this agent's data location ({}) or beneath it", own.display())
    })?;
    if !rel.components().all(|c| matches!(c, Component::Normal(_))) {
        return Err(format!("{offered} is not a plain path beneath {}", own.display()));
    }
    mounts::make_beneath(own, &rel.to_string_lossy())?;
    Ok(path.to_path_buf())
}

fn copies(dir: &Path, sizes: &Sizes) -> Vec<CopyReport> {
    let Some(drives) = open_drives(dir) else { return vec![] };
    let root = through(&drives);
    copy_folders(&drives)
        .into_iter()
        .map(|drive| {
            let marker = root.join(&drive).join(MARKER);
            let complete = std::fs::symlink_metadata(marker).is_ok_and(|m| m.is_file());
            let bytes = sizes.get(&drive).unwrap_or(0);
            CopyReport { drive, bytes, complete, last_used_at: None }
        })
        .collect()
}

/// The copies' folders in `drives/`: its entries that are folders themselves, not links.
pub(super) fn copy_folders(drives: &OwnedFd) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(through(drives)) else { return vec![] };
    entries
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().into_string().ok())
        .collect()
}

/// Removes a copy the server no longer wants. `folder` must be a plain name.
pub fn delete_copy(dir: &Path, folder: &str) {
    if folder.is_empty() || folder.contains('/') || folder == "." || folder == ".." {
        tracing::warn!(folder, "refusing to delete a copy with a strange name");
        return;
    }
    let Some(drives) = open_drives(dir) else { return };
    // std's removal opens each folder relative to its parent and never follows a link.
    let path = through(&drives).join(folder);
    match std::fs::remove_dir_all(&path) {
        Ok(()) => tracing::info!(folder, "deleted copy"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(folder, error = %e, "cannot delete copy"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::sizes::Measurer;

    #[test]
    fn copies_report_bytes_and_marker() {
        let dir = tempfile::tempdir().unwrap();
        let copy = dir.path().join("drives/default.food101/food101");
        std::fs::create_dir_all(&copy).unwrap();
        std::fs::write(copy.join("a.parquet"), vec![0u8; 1000]).unwrap();
        let sizes = Sizes::default();
        let r = report(dir.path(), &sizes);
        assert_eq!(r.copies[0].bytes, 0, "not measured yet");
        Measurer::default().pass(dir.path(), &sizes, 100);
        let r = report(dir.path(), &sizes);
        assert_eq!(r.copies.len(), 1);
        assert_eq!(
            (r.copies[0].drive.as_str(), r.copies[0].bytes, r.copies[0].complete),
            ("default.food101", 1000, false)
        );
        std::fs::write(dir.path().join("drives/default.food101").join(MARKER), b"").unwrap();
        assert!(report(dir.path(), &sizes).copies[0].complete);
        assert!(r.data_location.total_bytes > 0);
        delete_copy(dir.path(), "default.food101");
        assert!(report(dir.path(), &sizes).copies.is_empty());
    }

    #[test]
    fn a_drives_folder_that_is_a_link_is_neither_listed_nor_emptied() {
        let dir = tempfile::tempdir().unwrap();
        let victim = tempfile::tempdir().unwrap();
        std::fs::create_dir(victim.path().join("default.etc")).unwrap();
        std::fs::write(victim.path().join("default.etc/passwd"), "root").unwrap();
        std::os::unix::fs::symlink(victim.path(), dir.path().join("drives")).unwrap();
        assert!(report(dir.path(), &Sizes::default()).copies.is_empty());
        delete_copy(dir.path(), "default.etc");
        assert!(victim.path().join("default.etc/passwd").exists());
    }

    #[test]
    fn a_copy_holding_a_link_out_is_removed_without_following_it() {
        let dir = tempfile::tempdir().unwrap();
        let victim = tempfile::tempdir().unwrap();
        std::fs::write(victim.path().join("keep"), "").unwrap();
        std::fs::create_dir_all(dir.path().join("drives/default.x/deep")).unwrap();
        std::os::unix::fs::symlink(victim.path(), dir.path().join("drives/default.x/deep/esc")).unwrap();
        delete_copy(dir.path(), "default.x");
        assert!(!dir.path().join("drives/default.x").exists());
        assert!(victim.path().join("keep").exists());
    }

    #[test]
    fn the_data_location_is_the_agents_own_or_beneath_it() {
        let own = tempfile::tempdir().unwrap();
        let o = own.path().display().to_string();
        assert_eq!(accept_location(own.path(), &o).unwrap(), own.path());
        assert_eq!(accept_location(own.path(), &format!("{o}/sub/dir")).unwrap(), own.path().join("sub/dir"));
        assert!(own.path().join("sub/dir").is_dir());
        for bad in ["/", "/etc", &format!("{o}-other"), &format!("{o}/../x")] {
            assert!(accept_location(own.path(), bad).is_err(), "{bad}");
        }
        std::os::unix::fs::symlink("/", own.path().join("esc")).unwrap();
        let err = accept_location(own.path(), &format!("{o}/esc/etc")).unwrap_err();
        assert!(err.contains("symbolic link"), "{err}");
    }
}
