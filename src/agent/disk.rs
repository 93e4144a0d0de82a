//! The data location on disk: its usage, and the copies in `drives/<namespace>.<drive>`.
//!
//! The server names the data location and the copies to delete; the agent takes neither on
//! trust. The location must be its own `--data-location` or a folder beneath it, reached without
//! a symlink, and `drives/` is opened without following one: copies are then listed and removed
//! through that descriptor (`/proc/self/fd/N/<folder>`), so no link, at any depth, leads a
//! listing or a removal out of the data location.
//!
//! A heartbeat reads copies' sizes from what the measurer last found (`sizes`), and their
//! manifests' digests from memory (`manifest::keep`): it never walks.
//!
//! A copy's folder is named after its drive, and a drive deleted and made again has the same
//! name: each folder therefore holds [`COPY_ID`], the id of the drive it was made for, written
//! by the agent when a fill first mounts it. A fill of another drive (or a folder without the
//! file) never reuses the folder: it is renamed aside and removed, and a fresh one made. The
//! server takes a reported copy as its drive's only when the ids agree, and deletions name the
//! id reported, so a deletion meant for an old drive never removes its successor's new folder.

use std::collections::HashMap;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};
use std::sync::Mutex;

use rustix::fs::{AtFlags, Mode, OFlags};
use uuid::Uuid;

pub use super::layout::{COPY_ID, MARKER};
use super::layout::{
    copy_folders, copy_id, has_marker, open_dir, open_drives, plain, remove_aside, rename_aside,
};
use super::manifest::{self, Manifests};
use super::mounts;
use super::sizes::Sizes;
use crate::protocol::{CopyReport, DataUsage, HeartbeatRequest};

/// Held while a copy's folder is checked and then replaced or renamed aside, so a deletion
/// never removes a folder made for a new drive between its check and its removal.
static FOLDERS: Mutex<()> = Mutex::new(());

/// What a heartbeat says about `dir`: its usage and each copy's marker, latest known bytes (0
/// for a copy not measured yet) and manifest's digest. It costs a step per copy, not per file.
pub fn report(dir: &Path, sizes: &Sizes, manifests: &Manifests) -> HeartbeatRequest {
    let copies = copies(dir, sizes, manifests);
    let used_bytes = copies.iter().map(|c| c.bytes).sum();
    let (total_bytes, free_bytes) = match rustix::fs::statvfs(dir) {
        Ok(s) => (s.f_blocks * s.f_frsize, s.f_bavail * s.f_frsize),
        Err(_) => (0, 0),
    };
    HeartbeatRequest {
        data_location: DataUsage { total_bytes, used_bytes, free_bytes, reserve_bytes: 0 },
        copies,
        images: None,
        data_address: None,
    }
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

/// The copies in `dir`, and those being pulled from peers as they stand: a copy being pulled is
/// reported with its bytes received so far (whatever is in its place will go when it is in).
fn copies(dir: &Path, sizes: &Sizes, manifests: &Manifests) -> Vec<CopyReport> {
    let mut copies = copies_on_disk(dir, sizes, manifests);
    for (drive, drive_id, bytes) in manifests.being_pulled() {
        let pulled = CopyReport {
            drive: drive.clone(),
            drive_id: Some(drive_id),
            bytes,
            complete: false,
            measured: false,
            last_used_at: None,
            manifest: None,
            lost: None,
        };
        match copies.iter_mut().find(|c| c.drive == drive) {
            Some(c) if !c.complete => *c = pulled,
            Some(_) => {}
            None => copies.push(pulled),
        }
    }
    copies
}

fn copies_on_disk(dir: &Path, sizes: &Sizes, manifests: &Manifests) -> Vec<CopyReport> {
    let Some(drives) = open_drives(dir) else { return vec![] };
    copy_folders(&drives)
        .into_iter()
        .map(|drive| {
            let size = sizes.size(&drive);
            let bytes = size.map_or(0, |s| s.bytes);
            let drive_id = copy_id(&drives, &drive);
            let marked = has_marker(&drives, &drive);
            // A copy that lost files is whole no more, whatever its marker says.
            let lost = marked.then(|| manifests.lost(&drive, drive_id)).flatten();
            let complete = marked && lost.is_none();
            let measured = complete && size.is_some_and(|s| s.whole);
            let manifest = complete.then(|| manifests.digest(&drive, drive_id)).flatten();
            let manifest = manifest.map(|digest| digest.to_string());
            CopyReport { drive, drive_id, bytes, complete, measured, last_used_at: None, manifest, lost }
        })
        .collect()
}

/// Removes copies the server no longer wants, with their manifests, each only while its folder
/// still holds the drive id this agent reported for it (`reported`, by folder): a folder the
/// report did not list, or one made since for another drive of the same name, is left alone.
pub fn delete_copies(dir: &Path, folders: &[String], reported: &HashMap<String, Option<Uuid>>) {
    let Some(drives) = open_drives(dir) else { return };
    for folder in folders {
        if !plain(folder) {
            tracing::warn!(folder, "refusing to delete a copy with a strange name");
            continue;
        }
        let Some(id) = reported.get(folder) else {
            tracing::warn!(folder, "refusing to delete a copy this agent did not report");
            continue;
        };
        let aside = {
            let _held = FOLDERS.lock().expect("not poisoned");
            if copy_id(&drives, folder) != *id {
                tracing::info!(folder, "not deleting a copy made again since it was reported");
                continue;
            }
            let aside = rename_aside(&drives, folder);
            manifest::keep::remove(&drives, folder);
            aside
        };
        if let Some(aside) = aside {
            remove_aside(&drives, &aside);
            tracing::info!(folder, "deleted copy");
        }
    }
}

/// The folder of `drive`'s copy, `<dir>/drives/<folder>`, for its fill to write: the one there
/// when it was made for `drive`, else a new empty one (whatever was there is removed first),
/// owned by `owner` so the workspace's root in the container can write to it.
pub fn fill_folder(dir: &Path, folder: &str, drive: Uuid, owner: u32) -> Result<PathBuf, String> {
    if !plain(folder) {
        return Err(format!("{folder} is not a plain folder name"));
    }
    mounts::make_beneath(dir, "drives")?;
    let drives = open_drives(dir).ok_or("cannot open drives/")?;
    let aside = {
        let _held = FOLDERS.lock().expect("not poisoned");
        if copy_id(&drives, folder) == Some(drive) {
            return Ok(dir.join("drives").join(folder));
        }
        let aside = rename_aside(&drives, folder);
        make_folder(&drives, folder, drive, owner)?;
        aside
    };
    if let Some(aside) = aside {
        tracing::info!(folder, "removing a copy made for an earlier drive of this name");
        remove_aside(&drives, &aside);
    }
    Ok(dir.join("drives").join(folder))
}

/// Removes the [`MARKER`] of the copy in `folder`, if it has one.
pub fn unmark(dir: &Path, folder: &str) -> Result<(), String> {
    let drives = open_drives(dir).ok_or("cannot open drives/")?;
    let fd = open_dir(&drives, folder).map_err(|e| format!("cannot open {folder}: {e}"))?;
    match rustix::fs::unlinkat(&fd, MARKER, AtFlags::empty()) {
        Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(()),
        Err(e) => Err(format!("cannot remove {MARKER} from {folder}: {e}")),
    }
}

/// Makes the folder with its [`COPY_ID`]. The fill could replace the file, but only to point
/// its own workspace's folder at a drive of the same name, which reads nothing of another's.
fn make_folder(drives: &OwnedFd, folder: &str, drive: Uuid, owner: u32) -> Result<(), String> {
    let cannot = |e: rustix::io::Errno| format!("cannot make the copy's folder {folder}: {e}");
    rustix::fs::mkdirat(drives, folder, Mode::from_raw_mode(0o755)).map_err(cannot)?;
    let fd = open_dir(drives, folder).map_err(|e| format!("cannot open {folder}: {e}"))?;
    write_copy_id(&fd, drive).map_err(|e| format!("cannot write {COPY_ID} in {folder}: {e}"))?;
    // The folder itself is handed over through its descriptor, never what a link names.
    let (uid, gid) = (rustix::fs::Uid::from_raw(owner), rustix::fs::Gid::from_raw(owner));
    rustix::fs::fchown(&fd, Some(uid), Some(gid)).map_err(cannot)
}

/// Writes [`COPY_ID`] naming `drive` in the folder open at `fd`, replacing any there.
pub(super) fn write_copy_id(fd: &OwnedFd, drive: Uuid) -> std::io::Result<()> {
    match rustix::fs::unlinkat(fd, COPY_ID, AtFlags::empty()) {
        Ok(()) | Err(rustix::io::Errno::NOENT) => {}
        Err(e) => return Err(e.into()),
    }
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC | OFlags::NOFOLLOW;
    let file = rustix::fs::openat(fd, COPY_ID, flags, Mode::from_raw_mode(0o444))?;
    std::fs::File::from(file).write_all(drive.to_string().as_bytes())
}

/// Puts `staging`, a folder of `drives/` holding a copy received from a peer, in `folder`'s
/// place. Whatever stood there (a failed fill, a copy of an earlier drive of the name) is
/// renamed aside first, with its manifest removed, then deleted.
pub(super) fn install_received(drives: &OwnedFd, staging: &str, folder: &str) -> Result<(), String> {
    if !plain(folder) || !plain(staging) {
        return Err(format!("{folder} is not a plain folder name"));
    }
    let aside = {
        let _held = FOLDERS.lock().expect("not poisoned");
        let aside = rename_aside(drives, folder);
        manifest::keep::remove(drives, folder);
        rustix::fs::renameat(drives, staging, drives, folder)
            .map_err(|e| format!("cannot move the received copy into drives/{folder}: {e}"))?;
        aside
    };
    if let Some(aside) = aside {
        tracing::info!(folder, "removing what stood in the place of the received copy");
        remove_aside(drives, &aside);
    }
    Ok(())
}

/// Whether `<dir>/drives/<folder>` was made for `drive`: a worker reads a copy only then.
pub fn holds(dir: &Path, folder: &str, drive: Uuid) -> bool {
    plain(folder) && open_drives(dir).is_some_and(|drives| copy_id(&drives, folder) == Some(drive))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::agent::sizes::Measurer;

    /// Deletes `folder` as the server would answer a heartbeat reporting it now.
    pub(in crate::agent) fn delete_reported(dir: &Path, folder: &str) {
        let reported = report(dir, &Sizes::default(), &Manifests::default())
            .copies
            .into_iter()
            .map(|c| (c.drive, c.drive_id));
        delete_copies(dir, &[folder.to_owned()], &reported.collect());
    }

    fn entries(dir: &Path) -> Vec<String> {
        let names = std::fs::read_dir(dir.join("drives")).unwrap();
        names.map(|e| e.unwrap().file_name().into_string().unwrap()).collect()
    }

    #[test]
    fn a_copy_being_pulled_is_reported_with_the_bytes_received_so_far() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("drives")).unwrap();
        let (manifests, drive) = (Manifests::default(), Uuid::now_v7());
        manifests.pulling("default.food101", drive, 4096);
        let copies = report(dir.path(), &Sizes::default(), &manifests).copies;
        assert_eq!(copies.len(), 1);
        let c = &copies[0];
        assert_eq!(
            (c.drive.as_str(), c.drive_id, c.bytes, c.complete),
            ("default.food101", Some(drive), 4096, false)
        );
        manifests.pulled("default.food101");
        assert!(report(dir.path(), &Sizes::default(), &manifests).copies.is_empty());
    }

    #[test]
    fn a_fill_of_a_drive_made_again_starts_in_a_new_folder_holding_nothing_of_the_old() {
        let dir = tempfile::tempdir().unwrap();
        let me = rustix::process::getuid().as_raw();
        let (old, new) = (Uuid::now_v7(), Uuid::now_v7());
        let folder = fill_folder(dir.path(), "default.food101", old, me).unwrap();
        std::fs::write(folder.join("old"), "old").unwrap();
        let sizes = Sizes::default();
        Measurer::default().pass(dir.path(), &sizes, 100);
        assert_eq!(sizes.get("default.food101"), Some(3), "the drive id is not counted as data");
        std::fs::write(folder.join(MARKER), "").unwrap();
        let copy = &report(dir.path(), &Sizes::default(), &Manifests::default()).copies[0];
        assert_eq!((copy.drive_id, copy.complete), (Some(old), true));
        // The same drive's fill again (a retry) keeps what it wrote.
        assert!(fill_folder(dir.path(), "default.food101", old, me).unwrap().join("old").exists());

        let folder = fill_folder(dir.path(), "default.food101", new, me).unwrap();
        assert!(!folder.join("old").exists() && !folder.join(MARKER).exists());
        let copy = &report(dir.path(), &Sizes::default(), &Manifests::default()).copies[0];
        assert_eq!((copy.drive_id, copy.complete), (Some(new), false));
        assert!(holds(dir.path(), "default.food101", new) && !holds(dir.path(), "default.food101", old));
        assert_eq!(entries(dir.path()), ["default.food101"], "nothing is left aside");
    }

    #[test]
    fn a_folder_without_a_drive_id_is_reported_as_no_drives_and_never_read() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("drives/default.food101")).unwrap();
        std::fs::write(dir.path().join("drives/default.food101").join(MARKER), "").unwrap();
        let copy = &report(dir.path(), &Sizes::default(), &Manifests::default()).copies[0];
        assert_eq!((copy.drive_id, copy.complete), (None, true));
        assert!(!holds(dir.path(), "default.food101", Uuid::now_v7()));
        // An id file that is a link is not read.
        let elsewhere = tempfile::tempdir().unwrap();
        let id = Uuid::now_v7();
        std::fs::write(elsewhere.path().join("id"), id.to_string()).unwrap();
        let link = dir.path().join("drives/default.food101").join(COPY_ID);
        std::os::unix::fs::symlink(elsewhere.path().join("id"), link).unwrap();
        assert!(!holds(dir.path(), "default.food101", id));
    }

    #[test]
    fn a_deletion_leaves_a_folder_made_for_a_new_drive_since_the_report() {
        let dir = tempfile::tempdir().unwrap();
        let me = rustix::process::getuid().as_raw();
        fill_folder(dir.path(), "default.food101", Uuid::now_v7(), me).unwrap();
        let reported = report(dir.path(), &Sizes::default(), &Manifests::default())
            .copies
            .into_iter()
            .map(|c| (c.drive, c.drive_id));
        let reported: HashMap<_, _> = reported.collect();
        let new = Uuid::now_v7();
        fill_folder(dir.path(), "default.food101", new, me).unwrap();
        // The answer to the earlier report names the folder: it now holds the new drive's copy.
        delete_copies(dir.path(), &["default.food101".into()], &reported);
        assert!(holds(dir.path(), "default.food101", new));
        // A folder the report did not list is not the server's to delete.
        delete_copies(dir.path(), &["default.other".into()], &reported);
        std::fs::create_dir(dir.path().join("drives/default.other")).unwrap();
        delete_copies(dir.path(), &["default.other".into()], &reported);
        assert!(dir.path().join("drives/default.other").exists());
        delete_reported(dir.path(), "default.food101");
        assert_eq!(entries(dir.path()), ["default.other"]);
    }

    #[test]
    fn copies_report_bytes_and_marker() {
        let dir = tempfile::tempdir().unwrap();
        let copy = dir.path().join("drives/default.food101/food101");
        std::fs::create_dir_all(&copy).unwrap();
        std::fs::write(copy.join("a.parquet"), vec![0u8; 1000]).unwrap();
        let (sizes, mut measurer) = (Sizes::default(), Measurer::default());
        let r = report(dir.path(), &sizes, &Manifests::default());
        assert_eq!(r.copies[0].bytes, 0, "not measured yet");
        measurer.pass(dir.path(), &sizes, 100);
        let r = report(dir.path(), &sizes, &Manifests::default());
        assert_eq!(r.copies.len(), 1);
        assert_eq!(
            (r.copies[0].drive.as_str(), r.copies[0].bytes, r.copies[0].complete),
            ("default.food101", 1000, false)
        );
        std::fs::write(copy.join("b.parquet"), vec![0u8; 500]).unwrap();
        std::fs::write(dir.path().join("drives/default.food101").join(MARKER), b"").unwrap();
        // Whole, but measured before its last file: the server must not take 1000 bytes for all.
        let c = &report(dir.path(), &sizes, &Manifests::default()).copies[0];
        assert_eq!((c.complete, c.bytes, c.measured), (true, 1000, false));
        measurer.pass(dir.path(), &sizes, 100);
        let c = &report(dir.path(), &sizes, &Manifests::default()).copies[0];
        assert_eq!((c.complete, c.bytes, c.measured), (true, 1500, true));
        assert!(r.data_location.total_bytes > 0);
        delete_reported(dir.path(), "default.food101");
        assert!(report(dir.path(), &sizes, &Manifests::default()).copies.is_empty());
    }

    #[test]
    fn a_drives_folder_that_is_a_link_is_neither_listed_nor_emptied() {
        let dir = tempfile::tempdir().unwrap();
        let victim = tempfile::tempdir().unwrap();
        std::fs::create_dir(victim.path().join("default.etc")).unwrap();
        std::fs::write(victim.path().join("default.etc/passwd"), "root").unwrap();
        std::os::unix::fs::symlink(victim.path(), dir.path().join("drives")).unwrap();
        assert!(report(dir.path(), &Sizes::default(), &Manifests::default()).copies.is_empty());
        delete_copies(dir.path(), &["default.etc".into()], &HashMap::from([("default.etc".into(), None)]));
        assert!(victim.path().join("default.etc/passwd").exists());
    }

    #[test]
    fn a_copy_holding_a_link_out_is_removed_without_following_it() {
        let dir = tempfile::tempdir().unwrap();
        let victim = tempfile::tempdir().unwrap();
        std::fs::write(victim.path().join("keep"), "").unwrap();
        std::fs::create_dir_all(dir.path().join("drives/default.x/deep")).unwrap();
        std::os::unix::fs::symlink(victim.path(), dir.path().join("drives/default.x/deep/esc")).unwrap();
        delete_reported(dir.path(), "default.x");
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
