//! The receiver's pull: a copy fetched from a holder's data port, checked against the
//! manifest the server named, written beside its place and moved in whole.
//!
//! The copy is written into `drives/.receiving-<folder>/` (not listed as a copy: its name
//! starts with a dot), one file after another in the manifest's order, each chunk checked as
//! it lands. A pull cut short (a lost connection, a cancellation, an agent restart) leaves the
//! folder, and the next pull keeps every whole chunk in it that matches and asks for the rest
//! with `Range`; whatever in it the manifest does not list is removed first. Once every file
//! is in, the folder gets its drive id and is renamed into `drives/<folder>` (whatever stood
//! there goes aside first), the manifest is kept as the copy's, and the marker comes last.

use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::{Arc, Mutex};

use rustix::fs::{AtFlags, Mode, OFlags};
use tokio_util::sync::CancellationToken;

use super::beneath::{self, Dirs};
pub use super::order::{Order, PullError, PullLimits, PullReport};
use super::order::{blocking, disk_error};
use super::receive::{self, Fetch};
use super::relay::{Relay, Staged};
use super::{RECEIVED_MANIFEST, STAGING};
use crate::agent::disk::{self, MARKER};
use crate::agent::layout;
use crate::agent::manifest::{self, MAX_MANIFEST_BYTES, Manifest, Manifests, keep};
use crate::agent::mounts;

/// Rounds of removing what a resumed folder holds and its manifest does not list: each
/// empties the folders the last one emptied, as deep as a manifest's paths go.
const PRUNE_ROUNDS: usize = 130;

/// Pulls `order`'s copy into `data_dir`'s `drives/<folder>` and keeps its manifest in
/// `manifests`, its digest known at once. Idempotent: a copy already whole there, with this
/// manifest, is left as it is. On error, nothing is in the copy's place that was not there
/// before, and what was received stays beside it for the next pull to resume. With `relay`,
/// what is checked and written is marked there as it lands, for the data port to pass on.
pub async fn pull(
    order: &Order,
    data_dir: &Path,
    manifests: &Arc<Manifests>,
    limits: &PullLimits,
    relay: Option<&Relay>,
    cancel: &CancellationToken,
) -> Result<PullReport, PullError> {
    let folder = order.folder.as_str();
    if !layout::plain(folder) || folder.starts_with('.') {
        return Err(PullError::BadOrder(format!("{folder:?} is not a copy's folder name")));
    }
    let fetch = Fetch::new(order, limits, cancel)?;
    mounts::make_beneath(data_dir, "drives").map_err(PullError::Disk)?;
    let drives = Arc::new(layout::open_drives(data_dir).ok_or_else(|| disk_error("cannot open drives/"))?);
    if already_whole(order, &drives, manifests) {
        if let Some(relay) = relay {
            relay.whole();
        }
        return Ok(PullReport::default());
    }
    let (manifest, manifest_file) = match relay.and_then(Relay::staged_now) {
        // A pull again takes up the manifest the last one received, which may be being served.
        Some(staged) => (staged.manifest.clone(), staged.manifest_file.clone()),
        None => {
            let (manifest, file) = fetch_manifest(&fetch, order, &drives).await?;
            (Arc::new(manifest), file)
        }
    };
    let staging = format!("{STAGING}{folder}");
    let stage = {
        let (drives, manifest, staging) = (drives.clone(), manifest.clone(), staging.clone());
        let reserve = limits.reserve_bytes;
        blocking(move || prepare(&drives, &staging, &manifest, reserve)).await??
    };
    if let Some(relay) = relay {
        let root = rustix::io::dup(&stage).map_err(disk_error)?;
        relay.stage(Staged { manifest: manifest.clone(), root, manifest_file });
    }
    let dirs = Arc::new(Mutex::new(Dirs::new(stage)));
    let mut report = PullReport { files: manifest.files(), ..PullReport::default() };
    // Heartbeats report the copy with what it holds so far, file by file.
    let _progress = Progress { manifests, folder };
    for index in 0..manifest.entries().len() {
        // Files kept whole ask nothing of the holder, where a cancellation is otherwise seen.
        if cancel.is_cancelled() {
            return Err(PullError::Cancelled);
        }
        let (kept, received) = receive::entry(&fetch, &dirs, &manifest, index, relay).await?;
        if let Some(relay) = relay {
            relay.advance(index + 1, 0);
        }
        report.kept += kept;
        report.received += received;
        manifests.pulling(folder, order.drive_id, report.kept + report.received);
    }
    let (order, manifests, dir) = (order.clone(), manifests.clone(), data_dir.to_path_buf());
    blocking(move || {
        let stage = rustix::io::dup(dirs.lock().expect("not poisoned").root()).map_err(disk_error)?;
        finish(&order, &dir, &drives, &stage, &staging, &manifests)
    })
    .await??;
    if let Some(relay) = relay {
        relay.whole();
    }
    Ok(report)
}

/// Ends a pull's progress in heartbeats, however the pull ends.
struct Progress<'a> {
    manifests: &'a Manifests,
    folder: &'a str,
}

impl Drop for Progress<'_> {
    fn drop(&mut self) {
        self.manifests.pulled(self.folder);
    }
}

/// Whether `drives/<folder>` is already a complete copy of the order's drive whose kept
/// manifest has the order's digest: a pull again (a retry whose answer was lost) is then done.
fn already_whole(order: &Order, drives: &OwnedFd, manifests: &Manifests) -> bool {
    layout::complete_copy(drives, &order.folder) == Some(order.drive_id)
        && manifests.digest(&order.folder, Some(order.drive_id)) == Some(order.digest)
}

/// Fetches the manifest into `drives/.received-manifest-<folder>` and reads it once its digest
/// is the order's and it names the order's drive; with the file it is in.
async fn fetch_manifest(
    fetch: &Fetch,
    order: &Order,
    drives: &Arc<OwnedFd>,
) -> Result<(Manifest, Arc<std::fs::File>), PullError> {
    let bad = |why: String| PullError::Manifest { folder: order.folder.clone(), why };
    let too_large = || bad(format!("larger than {MAX_MANIFEST_BYTES} bytes"));
    let response = fetch.get(&["manifest"], 0).await?;
    if response.content_length().is_some_and(|n| n > MAX_MANIFEST_BYTES) {
        return Err(too_large());
    }
    // Made only once the holder said yes: a refusal writes nothing.
    let name = format!("{RECEIVED_MANIFEST}{}", order.folder);
    let flags = OFlags::RDWR | OFlags::CREATE | OFlags::TRUNC | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = rustix::fs::openat(&**drives, name.as_str(), flags, Mode::from_raw_mode(0o600))
        .map_err(disk_error)?;
    let file = Arc::new(std::fs::File::from(fd));
    let bounded = |at: u64, piece: &[u8]| {
        let end = at + piece.len() as u64;
        if end > MAX_MANIFEST_BYTES { Err(too_large()) } else { Ok(end) }
    };
    receive::download(fetch, response, &file, 0, bounded, |_| {}).await?;
    let (digest, read_from) = (order.digest, file.clone());
    let read = blocking(move || Manifest::read(&mut &*read_from, &digest)).await?;
    let manifest = read.map_err(|e| bad(e.to_string()))?;
    if manifest.drive_id() != order.drive_id {
        return Err(bad(format!("it is of drive {}, not {}", manifest.drive_id(), order.drive_id)));
    }
    Ok((manifest, file))
}

/// Makes (or takes up again) the folder the copy is written into, removes what it holds that
/// `manifest` does not list, and checks that the files still to come fit.
fn prepare(drives: &OwnedFd, staging: &str, manifest: &Manifest, reserve: u64) -> Result<OwnedFd, PullError> {
    let stage = beneath::make_dir(drives, staging).map_err(disk_error)?;
    for round in 0.. {
        let extra = manifest::unlisted(rustix::io::dup(&stage).map_err(disk_error)?, manifest)
            .map_err(PullError::Disk)?;
        if extra.is_empty() {
            break;
        }
        if round == PRUNE_ROUNDS {
            return Err(disk_error(format!(
                "{staging} still holds {} after {PRUNE_ROUNDS} removals",
                extra[0]
            )));
        }
        for path in extra {
            let (parent, name) = beneath::open_parent(&stage, &path).map_err(disk_error)?;
            beneath::remove(&parent, name).map_err(|e| disk_error(format!("cannot remove {path}: {e}")))?;
        }
    }
    // What is there already counts as received: the check is of what is still to come.
    let mut dirs = Dirs::new(rustix::io::dup(&stage).map_err(disk_error)?);
    let mut there = 0u64;
    for entry in manifest.entries().iter().filter(|e| !e.is_dir()) {
        let Ok((parent, name)) = dirs.parent(entry.path(), false) else { continue };
        if let Ok(st) = rustix::fs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW) {
            there += (st.st_size.max(0) as u64).min(entry.size());
        }
    }
    let needed = manifest.bytes() - there;
    let vfs = rustix::fs::fstatvfs(drives).map_err(disk_error)?;
    let free = vfs.f_bavail.saturating_mul(vfs.f_frsize);
    if needed.saturating_add(reserve) > free {
        let folder = staging.strip_prefix(STAGING).unwrap_or(staging).to_owned();
        return Err(PullError::NoRoom { folder, needed, free: free.saturating_sub(reserve) });
    }
    Ok(stage)
}

/// Names the copy's drive, moves it into place, keeps its manifest and writes the marker,
/// last, once everything it marks is on disk.
fn finish(
    order: &Order,
    dir: &Path,
    drives: &OwnedFd,
    stage: &OwnedFd,
    staging: &str,
    manifests: &Manifests,
) -> Result<(), PullError> {
    let folder = order.folder.as_str();
    disk::write_copy_id(stage, order.drive_id).map_err(disk_error)?;
    match rustix::fs::unlinkat(stage, MARKER, AtFlags::empty()) {
        Ok(()) | Err(rustix::io::Errno::NOENT) => {}
        Err(e) => return Err(disk_error(e)),
    }
    rustix::fs::syncfs(stage).map_err(disk_error)?;
    disk::install_received(drives, staging, folder).map_err(PullError::Disk)?;
    let from = format!("{RECEIVED_MANIFEST}{folder}");
    keep::adopt(manifests, dir, drives, &from, folder, order.drive_id, order.digest)
        .map_err(PullError::Disk)?;
    let marked = beneath::open_dir(drives, folder).and_then(|copy| {
        let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        rustix::fs::openat(&copy, MARKER, flags, Mode::from_raw_mode(0o644))?;
        Ok(rustix::fs::fsync(&copy)?)
    });
    marked.map_err(|e| {
        keep::disown(manifests, drives, folder);
        disk_error(format!("cannot write the marker of {folder}: {e}"))
    })
}
