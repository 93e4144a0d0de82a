//! Where copies live in a data location, and the few ways in: `drives/<namespace>.<drive>`,
//! each holding [`COPY_ID`] and, once whole, [`MARKER`]. Everything beneath `drives/` is reached
//! through its descriptor, without following a link. The agent's other files there (folders
//! being removed or received, manifests) start with a dot and are never a copy.

use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, CWD, FileType, Mode, OFlags};
use uuid::Uuid;

/// The file a fill writes last: a copy without it is not whole.
pub const MARKER: &str = ".astralyx-filled";

/// The file in a copy's folder naming the drive (its id) the folder was made for.
pub const COPY_ID: &str = ".astraeus-drive";

/// What a folder being removed is renamed to first: never a copy's name (no drive name starts
/// with a dot), so it is not listed or reported while its removal runs.
const DELETING: &str = ".deleting-";

/// `<dir>/drives`, opened without following a symlink there.
pub(in crate::agent) fn open_drives(dir: &Path) -> Option<OwnedFd> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW;
    rustix::fs::openat(CWD, dir.join("drives"), flags, Mode::empty()).ok()
}

/// The path of `drives/` through its descriptor: nothing after it is looked up from the top.
pub(in crate::agent) fn through(fd: &OwnedFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// The copies' folders in `drives/`: its entries that are folders themselves, not links, and
/// not folders being removed.
pub(in crate::agent) fn copy_folders(drives: &OwnedFd) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(through(drives)) else { return vec![] };
    entries
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|name| !name.starts_with('.'))
        .collect()
}

/// A plain name of an entry in `drives/`: no separator, not `.` or `..`.
pub(in crate::agent) fn plain(folder: &str) -> bool {
    !(folder.is_empty() || folder.contains('/') || folder == "." || folder == "..")
}

/// The drive `folder` was made for, from its [`COPY_ID`] file; `None` when the file is missing,
/// a link, or holds no id (a folder made before copies named their drive).
pub(in crate::agent) fn copy_id(drives: &OwnedFd, folder: &str) -> Option<Uuid> {
    let folder = open_dir(drives, folder).ok()?;
    let flags = OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW | OFlags::NONBLOCK;
    let file = rustix::fs::openat(&folder, COPY_ID, flags, Mode::empty()).ok()?;
    let mut text = String::new();
    // An id is 36 characters: a larger file is not one.
    std::fs::File::from(file).take(64).read_to_string(&mut text).ok()?;
    Uuid::try_parse(text.trim()).ok()
}

/// Whether `folder` is whole: its [`MARKER`] is a file, not a link or anything else.
pub(in crate::agent) fn has_marker(drives: &OwnedFd, folder: &str) -> bool {
    let Ok(fd) = open_dir(drives, folder) else { return false };
    rustix::fs::statat(&fd, MARKER, AtFlags::SYMLINK_NOFOLLOW)
        .is_ok_and(|m| FileType::from_raw_mode(m.st_mode) == FileType::RegularFile)
}

/// The drive whose complete copy `folder` holds: its marker is a file and it names its drive.
pub(in crate::agent) fn complete_copy(drives: &OwnedFd, folder: &str) -> Option<Uuid> {
    has_marker(drives, folder).then(|| copy_id(drives, folder)).flatten()
}

/// The folder `name` beneath `parent`, opened for reading without following a link there: the
/// one way in to anything beneath `drives/`.
pub(in crate::agent) fn open_dir<P: rustix::path::Arg>(
    parent: impl AsFd,
    name: P,
) -> std::io::Result<OwnedFd> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW;
    Ok(rustix::fs::openat(parent, name, flags, Mode::empty())?)
}

/// Renames `folder` aside atomically, so its name is free at once, and returns the new name;
/// `None` when there is nothing by that name.
pub(in crate::agent) fn rename_aside(drives: &OwnedFd, folder: &str) -> Option<String> {
    let aside = format!("{DELETING}{}", Uuid::new_v4().simple());
    match rustix::fs::renameat(drives, folder, drives, aside.as_str()) {
        Ok(()) => Some(aside),
        Err(rustix::io::Errno::NOENT) => None,
        Err(e) => {
            tracing::warn!(folder, error = %e, "cannot move copy aside");
            None
        }
    }
}

pub(in crate::agent) fn remove_aside(drives: &OwnedFd, aside: &str) {
    // std's removal opens each folder relative to its parent and never follows a link.
    if let Err(e) = std::fs::remove_dir_all(through(drives).join(aside)) {
        tracing::warn!(folder = aside, error = %e, "cannot delete a copy moved aside");
    }
}
