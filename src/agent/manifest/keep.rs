//! Where the agent keeps its copies' manifests, and when it makes them.
//!
//! A manifest lives out of its copy, in `drives/.manifests/<folder>.jsonl`: a fill has its copy
//! read-write at /drive and could write one there of its own choosing. (`copy_folders` skips
//! names that start with a dot, and no drive's folder is named so.) It is written to a temporary
//! file and renamed in, names in its header the drive the copy was made for, and is removed with
//! its copy, once the copy is no longer complete, or when the folder is made for another drive.
//!
//! A manifest is made for a complete copy only while no worker of this agent mounts it
//! read-write, one copy at a time, off the heartbeat's path ([`pass`]). A worker that mounts a
//! copy read-write is [`Manifests::hold`]ed before it starts: the copy's manifest is removed, one
//! being made is discarded, and none is made again until the worker has ended. Heartbeats read
//! the digests from memory ([`Manifests::digest`]), never from the files.
//!
//! A copy received from a peer comes with its manifest, checked file by file as it landed: it
//! is [`adopt`]ed, renamed into the store and known at once, before the copy's marker is
//! written, and kept even while the fill that received it still holds the folder.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::BufWriter;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use rustix::fs::{AtFlags, Dir, Mode, OFlags};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::build::{STOPPED, build_at};
use super::lost::{self, Lost, Next};
use super::{Digest, stored, walk};
use crate::agent::layout;
use crate::agent::sizes::Sizes;
use crate::protocol::{Assignment, LostFiles, MountSource};

/// The agent's folder of manifests in `drives/`.
pub const FOLDER: &str = ".manifests";
/// What a manifest being written is named first; removed by the next pass if left behind.
const TEMP: &str = ".tmp-";
const SUFFIX: &str = ".jsonl";

/// The manifests kept and the copies being written to, shared by the passes that make
/// manifests, heartbeats and workers.
#[derive(Debug, Default)]
pub struct Manifests(Mutex<State>);

#[derive(Debug, Default)]
struct State {
    /// The data location the rest is about.
    dir: Option<PathBuf>,
    /// Whether the workers running are known: before the first assignments are acted on, a
    /// container of the agent's last life may still be writing to a copy.
    settled: bool,
    /// The manifest on disk of each folder: the drive it was made for and its digest.
    kept: HashMap<String, (Uuid, Digest)>,
    writers: HashMap<String, Writers>,
    /// Copies whose manifest could not be made, with their drive: not tried again until written
    /// to again (or the agent restarts), since the same walk would fail the same way.
    refused: HashMap<String, Uuid>,
    /// Manifests adopted with a copy received from a peer, by folder, with the holds taken of
    /// the folder when they were (`Writers::taken`) and their place in `adoptions`: such a
    /// manifest is the copy's, marker or not and held or not, until another hold is taken.
    received: HashMap<String, (u64, u64)>,
    /// Manifests adopted so far: a pass forgets no manifest adopted after it listed the store.
    adoptions: u64,
    /// Copies being pulled from peers, with their drive and the bytes on disk so far: a pull
    /// writes beside the copy's place, where the measurer does not look.
    pulling: HashMap<String, (Uuid, u64)>,
    /// What whole copies lost since their manifests were made.
    lost: Lost,
}

impl State {
    /// Makes `dir` the data location the state is about, forgetting another's manifests.
    fn locate(&mut self, dir: &Path) {
        if self.dir.as_deref() != Some(dir) {
            self.kept.clear();
            self.refused.clear();
            self.received.clear();
            self.dir = Some(dir.to_path_buf());
        }
    }
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Writers {
    running: usize,
    /// Holds ever taken: a manifest made while this changed is not the copy's.
    taken: u64,
}

impl Manifests {
    fn state(&self) -> MutexGuard<'_, State> {
        self.0.lock().expect("not poisoned")
    }

    /// The digest of `folder`'s manifest, when one is kept for the drive `drive_id`.
    pub fn digest(&self, folder: &str, drive_id: Option<Uuid>) -> Option<Digest> {
        let state = self.state();
        let (made_for, digest) = state.kept.get(folder)?;
        (Some(*made_for) == drive_id).then_some(*digest)
    }

    /// What the whole copy in `folder`, of the drive `drive_id`, lost since its manifest was
    /// made, as the last comparison found; `None` while something writes to it.
    pub fn lost(&self, folder: &str, drive_id: Option<Uuid>) -> Option<LostFiles> {
        let state = self.state();
        let (made_for, digest) = state.kept.get(folder)?;
        let unwritten = state.writers.get(folder).is_none_or(|w| w.running == 0);
        (Some(*made_for) == drive_id && unwritten).then(|| state.lost.of(folder, digest)).flatten()
    }

    /// Records that `folder`, the copy of `drive`, is being pulled and holds `bytes` so far.
    pub fn pulling(&self, folder: &str, drive: Uuid, bytes: u64) {
        self.state().pulling.insert(folder.to_owned(), (drive, bytes));
    }

    /// The pull of `folder` ended, whichever way.
    pub fn pulled(&self, folder: &str) {
        self.state().pulling.remove(folder);
    }

    /// The copies being pulled, with their drive and bytes so far, for heartbeats.
    pub fn being_pulled(&self) -> Vec<(String, Uuid, u64)> {
        self.state().pulling.iter().map(|(f, (d, b))| (f.clone(), *d, *b)).collect()
    }

    /// Says the workers running are all known (and held): manifests may be made from now on.
    pub fn settle(&self) {
        self.state().settled = true;
    }

    /// Marks the copies `a` mounts read-write as being written to until the hold is dropped,
    /// and removes their manifests from `dir`'s `drives/`. Taken before the worker starts.
    pub fn hold(self: &Arc<Self>, dir: Option<&Path>, a: &Assignment) -> Hold {
        let folders: Vec<String> = a
            .mounts
            .iter()
            .filter(|m| !m.read_only)
            .filter_map(|m| match &m.source {
                MountSource::Copy { folder, .. } if layout::plain(folder) => Some(folder.clone()),
                _ => None,
            })
            .collect();
        {
            let mut state = self.state();
            for folder in &folders {
                let writers = state.writers.entry(folder.clone()).or_default();
                writers.running += 1;
                writers.taken += 1;
                state.kept.remove(folder);
                state.refused.remove(folder);
                state.received.remove(folder);
                state.lost.forget(folder);
            }
        }
        if let Some(drives) = dir.and_then(layout::open_drives) {
            for folder in &folders {
                remove(&drives, folder);
            }
        }
        Hold { manifests: self.clone(), folders }
    }

    fn writers(&self, folder: &str) -> Writers {
        self.state().writers.get(folder).copied().unwrap_or_default()
    }

    /// The drive `folder`'s manifest on disk is kept for: the one its copy was received with,
    /// or the complete copy's (`complete`) while nothing writes to it; `None` to remove it.
    fn keeps(&self, folder: &str, complete: Option<Uuid>) -> Option<Uuid> {
        let state = self.state();
        let writers = state.writers.get(folder).copied().unwrap_or_default();
        if state.received.get(folder).is_some_and(|(taken, _)| *taken == writers.taken) {
            return state.kept.get(folder).map(|(id, _)| *id);
        }
        complete.filter(|_| writers.running == 0)
    }
}

/// A worker's read-write mounts of copies, while it lives.
#[derive(Debug)]
pub struct Hold {
    manifests: Arc<Manifests>,
    folders: Vec<String>,
}

impl Drop for Hold {
    fn drop(&mut self) {
        let mut state = self.manifests.state();
        for folder in &self.folders {
            if let Some(w) = state.writers.get_mut(folder) {
                w.running -= 1;
            }
        }
    }
}

/// The name of `folder`'s manifest in the store.
pub(in crate::agent) fn file_name(folder: &str) -> String {
    format!("{folder}{SUFFIX}")
}

/// Removes `folder`'s manifest, if any: its copy is being removed or written to.
pub(in crate::agent) fn remove(drives: &OwnedFd, folder: &str) {
    if let Ok(store) = walk::open_dir(drives, FOLDER) {
        let _ = rustix::fs::unlinkat(&store, format!("{folder}{SUFFIX}"), AtFlags::empty());
    }
}

/// Brings the manifests in `dir`'s `drives/` in line with its copies, then makes the manifest of
/// one complete copy that lacks one, if any (which may take minutes). Whether another still
/// lacks one: the next pass should come soon. Blocking; stops early once `stop` is cancelled.
pub fn pass(manifests: &Manifests, dir: &Path, sizes: &Sizes, stop: &CancellationToken) -> bool {
    {
        let mut state = manifests.state();
        if !state.settled {
            return false;
        }
        state.locate(dir);
    }
    let Some(drives) = layout::open_drives(dir) else {
        manifests.state().kept.clear();
        return false;
    };
    let Some(store) = open_store(&drives) else { return false };
    // Complete copies with a drive id: the only ones with a manifest.
    let complete: BTreeMap<String, Uuid> = layout::copy_folders(&drives)
        .into_iter()
        .filter_map(|folder| Some((layout::complete_copy(&drives, &folder)?, folder)))
        .map(|(id, folder)| (folder, id))
        .collect();
    tidy(manifests, &store, &complete);
    sweep(manifests, &drives);
    find_lost(manifests, &drives, &store, sizes, stop);
    let lacking: Vec<(&String, &Uuid)> = {
        let state = manifests.state();
        let unwritten = |f: &String| state.writers.get(f).is_none_or(|w| w.running == 0);
        complete
            .iter()
            .filter(|(f, id)| {
                !state.kept.contains_key(*f) && state.refused.get(*f) != Some(id) && unwritten(f)
            })
            .collect()
    };
    let Some((folder, id)) = lacking.first() else { return false };
    make(manifests, &drives, &store, folder, **id, stop);
    lacking.len() > 1
}

/// Removes what pulls from peers left that no fill of this agent is pulling any more (its run
/// or its drive deleted meanwhile): a folder being received and its fetched manifest. A fill
/// holds its copy's folder from before it starts, and the check and the move aside happen under
/// the lock a hold takes, so a pull under way or about to start keeps what it has.
fn sweep(manifests: &Manifests, drives: &OwnedFd) {
    use crate::agent::peer::{RECEIVED_MANIFEST, STAGING};
    let Ok(entries) = std::fs::read_dir(layout::through(drives)) else { return };
    let left: Vec<(String, String, bool)> = entries
        .filter_map(Result::ok)
        .filter_map(|e| Some((e.file_name().into_string().ok()?, e.file_type().ok()?.is_dir())))
        .filter_map(|(name, is_dir)| {
            let folder = name.strip_prefix(STAGING).or_else(|| name.strip_prefix(RECEIVED_MANIFEST))?;
            layout::plain(folder).then(|| (name.clone(), folder.to_owned(), is_dir))
        })
        .collect();
    for (name, folder, is_dir) in left {
        let state = manifests.state();
        if state.writers.get(&folder).is_some_and(|w| w.running > 0) {
            continue;
        }
        tracing::info!(folder, "removing what a pull from a peer left");
        if !is_dir {
            let _ = rustix::fs::unlinkat(drives, name.as_str(), AtFlags::empty());
            continue;
        }
        let aside = layout::rename_aside(drives, &name);
        drop(state);
        if let Some(aside) = aside {
            layout::remove_aside(drives, &aside);
        }
    }
}

/// `drives/.manifests`, made (mode 0700) when missing, never through a link.
fn open_store(drives: &OwnedFd) -> Option<OwnedFd> {
    match rustix::fs::mkdirat(drives, FOLDER, Mode::from_raw_mode(0o700)) {
        Ok(()) | Err(rustix::io::Errno::EXIST) => {}
        Err(e) => tracing::warn!(error = %e, "cannot make drives/{FOLDER}"),
    }
    let store = walk::open_dir(drives, FOLDER).ok();
    if store.is_none() {
        tracing::warn!("cannot open drives/{FOLDER} (not a folder?): no copy gets a manifest");
    }
    store
}

/// Removes left-behind temporary files and the manifests of copies gone, incomplete or made
/// for another drive; takes in those found on disk and not known (after a restart); forgets
/// manifests no longer on disk.
fn tidy(manifests: &Manifests, store: &OwnedFd, complete: &BTreeMap<String, Uuid>) {
    let mut present = vec![];
    let listed_after = manifests.state().adoptions;
    for name in names(store) {
        let wanted =
            name.strip_suffix(SUFFIX).and_then(|f| Some((f, manifests.keeps(f, complete.get(f).copied())?)));
        let Some((folder, id)) = wanted else {
            // Checked and removed under the lock that `adopt` renames under: a manifest
            // adopted since the listing is not the stale one that was looked at.
            let state = manifests.state();
            let adopted = |f: &str| state.received.get(f).is_some_and(|(_, seq)| *seq > listed_after);
            let stale = !name.strip_suffix(SUFFIX).is_some_and(adopted);
            if stale && (name.starts_with(TEMP) || name.ends_with(SUFFIX)) {
                let _ = rustix::fs::unlinkat(store, name.as_str(), AtFlags::empty());
            }
            continue;
        };
        let known = manifests.state().kept.get(folder).is_some_and(|(made_for, _)| *made_for == id);
        if !known {
            let before = manifests.writers(folder);
            match stored::drive_and_digest(store, &name) {
                Some((made_for, digest)) if made_for == id => {
                    let mut state = manifests.state();
                    // A hold taken during the read has removed the file: the digest is stale.
                    if state.writers.get(folder).copied().unwrap_or_default() == before {
                        state.kept.insert(folder.to_owned(), (made_for, digest));
                    }
                }
                _ => {
                    let _ = rustix::fs::unlinkat(store, name.as_str(), AtFlags::empty());
                    continue;
                }
            }
        }
        present.push(folder.to_owned());
    }
    let mut state = manifests.state();
    let State { kept, received, lost, .. } = &mut *state;
    let since = |f: &String| received.get(f).is_some_and(|(_, seq)| *seq > listed_after);
    kept.retain(|folder, _| present.contains(folder) || since(folder));
    received.retain(|folder, (_, seq)| present.contains(folder) || *seq > listed_after);
    lost.retain(kept);
}

/// Compares with its manifest each whole copy whose latest walk counted other files or bytes
/// than the manifest lists, once per walk (see `manifest::lost`).
fn find_lost(
    manifests: &Manifests,
    drives: &OwnedFd,
    store: &OwnedFd,
    sizes: &Sizes,
    stop: &CancellationToken,
) {
    let kept: Vec<(String, Digest)> = {
        let state = manifests.state();
        let unwritten = |f: &String| state.writers.get(f).is_none_or(|w| w.running == 0);
        state.kept.iter().filter(|(f, _)| unwritten(f)).map(|(f, (_, d))| (f.clone(), *d)).collect()
    };
    for (folder, digest) in kept {
        let Some(measured) = lost::measured(sizes, &folder) else { continue };
        let name = file_name(&folder);
        let mut next = manifests.state().lost.next(&folder, &digest, measured);
        if let Next::ReadTotals = next {
            let Some(listed) = lost::header(store, &name) else { continue };
            let mut state = manifests.state();
            state.lost.listed(&folder, &digest, listed);
            next = state.lost.next(&folder, &digest, measured);
        }
        if !matches!(next, Next::Compare) || stop.is_cancelled() {
            continue;
        }
        let before = manifests.writers(&folder);
        let found = lost::compare(drives, &folder, store, &name, &digest).unwrap_or_else(|why| {
            tracing::warn!(folder, error = %why, "cannot compare the copy with its manifest");
            None
        });
        let mut state = manifests.state();
        // A hold taken meanwhile: the copy is being written to, and what was found is stale.
        if state.writers.get(&folder).copied().unwrap_or_default() != before {
            continue;
        }
        if let Some(l) = &found {
            tracing::warn!(folder, files = l.count, first = %l.named[0], "the whole copy lost files since it was filled");
        }
        state.lost.found(&folder, &digest, measured, found);
    }
}

/// Takes `from`, a manifest in `dir`'s `drives/` (out of the store, where a pass would remove
/// it as left behind) that a copy received from a peer was checked against, as the manifest of
/// that copy, now at `drives/<folder>` and made for `drive`: renamed into the store, its digest
/// known at once. Called before the copy's marker is written.
pub(in crate::agent) fn adopt(
    manifests: &Manifests,
    dir: &Path,
    drives: &OwnedFd,
    from: &str,
    folder: &str,
    drive: Uuid,
    digest: Digest,
) -> Result<(), String> {
    let store = open_store(drives).ok_or_else(|| format!("cannot open drives/{FOLDER}"))?;
    // Renamed under the lock, so a hold taken meanwhile comes after and removes it.
    let mut state = manifests.state();
    state.locate(dir);
    rustix::fs::renameat(drives, from, &store, file_name(folder))
        .map_err(|e| format!("cannot keep the manifest of {folder}: {e}"))?;
    let taken = state.writers.get(folder).map_or(0, |w| w.taken);
    state.adoptions += 1;
    let seq = state.adoptions;
    state.kept.insert(folder.to_owned(), (drive, digest));
    state.received.insert(folder.to_owned(), (taken, seq));
    state.refused.remove(folder);
    Ok(())
}

/// Undoes [`adopt`]: the copy it came with could not be made whole.
pub(in crate::agent) fn disown(manifests: &Manifests, drives: &OwnedFd, folder: &str) {
    let mut state = manifests.state();
    state.kept.remove(folder);
    state.received.remove(folder);
    remove(drives, folder);
}

/// The names in the folder open at `store`.
fn names(store: &OwnedFd) -> Vec<String> {
    let Ok(mut dir) = Dir::read_from(store) else { return vec![] };
    let mut names = vec![];
    while let Some(Ok(entry)) = dir.read() {
        if let Ok(name) = entry.file_name().to_str()
            && name != "."
            && name != ".."
        {
            names.push(name.to_owned());
        }
    }
    names
}

/// Makes `folder`'s manifest and keeps it, unless the copy was written to (or stopped being
/// the complete copy of `id`) meanwhile.
fn make(
    manifests: &Manifests,
    drives: &OwnedFd,
    store: &OwnedFd,
    folder: &str,
    id: Uuid,
    stop: &CancellationToken,
) {
    let before = manifests.writers(folder);
    let temp = format!("{TEMP}{}", Uuid::new_v4().simple());
    let scratch = format!("{temp}-entries");
    let create = |name: &str| {
        let flags = OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        rustix::fs::openat(store, name, flags, Mode::from_raw_mode(0o600)).map(File::from)
    };
    let go_on = || !stop.is_cancelled() && manifests.writers(folder) == before;
    let started = std::time::Instant::now();
    let made = match (walk::open_dir(drives, folder).ok(), create(&scratch), create(&temp)) {
        (Some(root), Ok(scratch), Ok(out)) => {
            let made = build_at(root, id, scratch, BufWriter::new(&out), &go_on);
            made.and_then(|digest| out.sync_all().map(|()| digest).map_err(|e| e.to_string()))
        }
        (None, ..) => Err(STOPPED.into()),
        (_, Err(e), _) | (_, _, Err(e)) => Err(format!("cannot write in drives/{FOLDER}: {e}")),
    };
    let _ = rustix::fs::unlinkat(store, scratch.as_str(), AtFlags::empty());
    let kept = match made {
        Ok(digest) if layout::complete_copy(drives, folder) == Some(id) => {
            let mut state = manifests.state();
            let still = state.writers.get(folder).copied().unwrap_or_default() == before;
            let name = format!("{folder}{SUFFIX}");
            let renamed = still && rustix::fs::renameat(store, temp.as_str(), store, name.as_str()).is_ok();
            if renamed {
                state.kept.insert(folder.to_owned(), (id, digest));
                tracing::info!(folder, %digest, seconds = started.elapsed().as_secs(), "made the copy's manifest");
            }
            renamed
        }
        Ok(_) => false,
        Err(why) if why == STOPPED => false,
        Err(why) => {
            tracing::warn!(folder, %why, "no manifest for this copy: it cannot be sent to peers");
            manifests.state().refused.insert(folder.to_owned(), id);
            false
        }
    };
    if !kept {
        let _ = rustix::fs::unlinkat(store, temp.as_str(), AtFlags::empty());
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::{Manifest, check};
    use super::*;

    const FOLDER_NAME: &str = "default.food101";

    /// A data location holding a complete copy of a drive, and the drive's id.
    fn location() -> (tempfile::TempDir, Uuid) {
        let dir = tempfile::tempdir().unwrap();
        let id = Uuid::now_v7();
        let me = rustix::process::getuid().as_raw();
        let copy = crate::agent::disk::fill_folder(dir.path(), FOLDER_NAME, id, me).unwrap();
        std::fs::create_dir(copy.join("train")).unwrap();
        std::fs::write(copy.join("train/0.jpg"), "jpeg").unwrap();
        std::fs::write(copy.join(layout::MARKER), "").unwrap();
        (dir, id)
    }

    fn file(dir: &Path) -> PathBuf {
        dir.join("drives").join(FOLDER).join(format!("{FOLDER_NAME}{SUFFIX}"))
    }

    fn reported(dir: &Path, manifests: &Manifests) -> Option<String> {
        let report = crate::agent::disk::report(dir, &Default::default(), manifests);
        report.copies.into_iter().find(|c| c.drive == FOLDER_NAME)?.manifest
    }

    /// A fill of the copy: it mounts it read-write.
    fn fill() -> Assignment {
        serde_json::from_value(json!({
            "uid": Uuid::nil(), "name": "fill-food101-gpu-01-0", "run": "fill-food101-gpu-01",
            "namespace": "default", "state": "Pending", "image": "busybox", "command": "sh", "args": [],
            "env": {}, "time_limit_seconds": null, "id_slot": 1, "fill": true,
            "resources": {"cpu_cores": 1.0, "memory_bytes": 1, "gpus": 0},
            "mounts": [{
                "drive": "food101", "source": {"kind": "copy", "folder": FOLDER_NAME, "drive_id": Uuid::nil()},
                "sub_path": "", "target": "/drive", "read_only": false
            }]
        }))
        .unwrap()
    }

    #[test]
    fn a_complete_copy_gets_a_manifest_out_of_its_folder_and_heartbeats_report_its_digest() {
        let (dir, id) = location();
        let (manifests, stop) = (Manifests::default(), CancellationToken::new());
        assert!(!pass(&manifests, dir.path(), &Sizes::default(), &stop));
        assert!(!file(dir.path()).exists(), "none before the running workers are known");

        manifests.settle();
        assert!(!pass(&manifests, dir.path(), &Sizes::default(), &stop), "no other copy lacks one");
        let bytes = std::fs::read(file(dir.path())).unwrap();
        let digest = Digest(blake3::hash(&bytes));
        assert_eq!(reported(dir.path(), &manifests), Some(digest.to_string()));
        let m = Manifest::read(&mut std::io::Cursor::new(bytes), &digest).unwrap();
        assert_eq!((m.drive_id(), m.files()), (id, 1));
        assert!(check(&dir.path().join("drives").join(FOLDER_NAME), &m).unwrap().is_clear());
        let listed = std::fs::read_dir(dir.path().join("drives").join(FOLDER)).unwrap();
        assert_eq!(listed.count(), 1, "no temporary file is left");

        // After a restart, the manifest on disk is taken in, not made again.
        let again = Manifests::default();
        again.settle();
        pass(&again, dir.path(), &Sizes::default(), &stop);
        assert_eq!(reported(dir.path(), &again), Some(digest.to_string()));
    }

    #[test]
    fn a_whole_copy_that_loses_files_is_reported_not_complete_naming_them_until_a_fill_holds_it() {
        let (dir, _) = location();
        let copy = dir.path().join("drives").join(FOLDER_NAME);
        std::fs::write(copy.join("train/1.jpg"), "jpeg2").unwrap();
        let (manifests, stop) = (Arc::new(Manifests::default()), CancellationToken::new());
        let (sizes, mut measurer) = (Sizes::default(), crate::agent::sizes::Measurer::default());
        let report = |sizes: &Sizes| {
            let report = crate::agent::disk::report(dir.path(), sizes, &manifests);
            report.copies.into_iter().find(|c| c.drive == FOLDER_NAME).unwrap()
        };
        manifests.settle();
        measurer.pass(dir.path(), &sizes, 100);
        pass(&manifests, dir.path(), &sizes, &stop);
        pass(&manifests, dir.path(), &sizes, &stop);
        let whole = report(&sizes);
        assert!(whole.complete && whole.manifest.is_some() && whole.lost.is_none(), "{whole:?}");

        // A file goes, and another is cut, beneath the agent: the next walk counts less than the
        // manifest lists, and the comparison names both.
        std::fs::remove_file(copy.join("train/0.jpg")).unwrap();
        std::fs::write(copy.join("train/1.jpg"), "jp").unwrap();
        measurer.pass(dir.path(), &sizes, 100);
        pass(&manifests, dir.path(), &sizes, &stop);
        let damaged = report(&sizes);
        let named = vec!["train/0.jpg".to_owned(), "train/1.jpg".to_owned()];
        assert_eq!(damaged.lost, Some(LostFiles { count: 2, named }), "{damaged:?}");
        assert!(!damaged.complete && damaged.manifest.is_none(), "{damaged:?}");

        // A fill holds it to write it again: nothing is said of it until it is whole once more.
        let hold = manifests.hold(Some(dir.path()), &fill());
        assert_eq!(report(&sizes).lost, None);
        drop(hold);
    }

    #[test]
    fn what_a_pull_left_goes_unless_a_fill_of_its_copy_holds_it() {
        use crate::agent::peer::{RECEIVED_MANIFEST, STAGING};
        let (dir, _) = location();
        let (manifests, stop) = (Arc::new(Manifests::default()), CancellationToken::new());
        manifests.settle();
        let drives = dir.path().join("drives");
        let staging = drives.join(format!("{STAGING}{FOLDER_NAME}"));
        std::fs::create_dir_all(staging.join("train")).unwrap();
        std::fs::write(staging.join("train/0.jpg"), "half").unwrap();
        std::fs::write(drives.join(format!("{RECEIVED_MANIFEST}{FOLDER_NAME}")), "{}").unwrap();

        let hold = manifests.hold(Some(dir.path()), &fill());
        pass(&manifests, dir.path(), &Sizes::default(), &stop);
        assert!(staging.join("train/0.jpg").exists(), "a pull under way keeps what it has");
        drop(hold);
        pass(&manifests, dir.path(), &Sizes::default(), &stop);
        let names: Vec<String> = std::fs::read_dir(&drives)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| {
                n.starts_with(STAGING) || n.starts_with(RECEIVED_MANIFEST) || n.starts_with(".deleting-")
            })
            .collect();
        assert!(names.is_empty(), "{names:?}");
        assert!(drives.join(FOLDER_NAME).exists(), "the copy itself stays");
    }

    #[test]
    fn a_copy_being_written_to_has_no_manifest_until_its_writer_ends() {
        let (dir, _) = location();
        let (manifests, stop) = (Arc::new(Manifests::default()), CancellationToken::new());
        manifests.settle();
        pass(&manifests, dir.path(), &Sizes::default(), &stop);
        let before = reported(dir.path(), &manifests).unwrap();

        let hold = manifests.hold(Some(dir.path()), &fill());
        assert!(!file(dir.path()).exists());
        assert_eq!(reported(dir.path(), &manifests), None);
        std::fs::write(dir.path().join("drives").join(FOLDER_NAME).join("train/1.jpg"), "more").unwrap();
        assert!(!pass(&manifests, dir.path(), &Sizes::default(), &stop));
        assert!(!file(dir.path()).exists(), "none while the fill runs");

        drop(hold);
        pass(&manifests, dir.path(), &Sizes::default(), &stop);
        let after = reported(dir.path(), &manifests).unwrap();
        assert_ne!(after, before);
        // A read-only mount holds nothing.
        let mut read = fill();
        read.mounts[0].read_only = true;
        let _reading = manifests.hold(Some(dir.path()), &read);
        assert_eq!(reported(dir.path(), &manifests), Some(after));
    }

    #[test]
    fn a_manifest_goes_with_its_copy_its_marker_or_its_drive() {
        let (dir, id) = location();
        let (manifests, stop) = (Manifests::default(), CancellationToken::new());
        manifests.settle();
        pass(&manifests, dir.path(), &Sizes::default(), &stop);
        let copy = dir.path().join("drives").join(FOLDER_NAME);

        std::fs::remove_file(copy.join(layout::MARKER)).unwrap();
        assert_eq!(reported(dir.path(), &manifests), None, "an incomplete copy has none");
        pass(&manifests, dir.path(), &Sizes::default(), &stop);
        assert!(!file(dir.path()).exists());
        std::fs::write(copy.join(layout::MARKER), "").unwrap();
        pass(&manifests, dir.path(), &Sizes::default(), &stop);
        assert!(file(dir.path()).exists());

        // The folder now names another drive: the manifest made for the first is stale.
        let kept = std::fs::read(file(dir.path())).unwrap();
        std::fs::remove_file(copy.join(layout::COPY_ID)).unwrap();
        std::fs::write(copy.join(layout::COPY_ID), Uuid::now_v7().to_string()).unwrap();
        assert_eq!(reported(dir.path(), &manifests), None);
        let fresh = Manifests::default();
        fresh.settle();
        pass(&fresh, dir.path(), &Sizes::default(), &stop);
        assert_ne!(std::fs::read(file(dir.path())).unwrap(), kept, "made again for the new drive");
        std::fs::remove_file(copy.join(layout::COPY_ID)).unwrap();
        std::fs::write(copy.join(layout::COPY_ID), id.to_string()).unwrap();

        crate::agent::disk::tests::delete_reported(dir.path(), FOLDER_NAME);
        assert!(!file(dir.path()).exists(), "deleted with its copy");
    }

    #[test]
    fn a_manifest_adopted_with_a_received_copy_is_kept_before_its_marker_and_under_the_fills_hold() {
        let (dir, id) = location();
        let copy = dir.path().join("drives").join(FOLDER_NAME);
        let mut bytes = vec![];
        let digest =
            super::super::build(&copy, id, tempfile::tempfile().unwrap(), &mut bytes, &|| true).unwrap();
        // The copy as a pull leaves it before its marker, held by the fill that received it.
        std::fs::remove_file(copy.join(layout::MARKER)).unwrap();
        let (manifests, stop) = (Arc::new(Manifests::default()), CancellationToken::new());
        manifests.settle();
        let hold = manifests.hold(Some(dir.path()), &fill());
        std::fs::write(dir.path().join("drives/.received"), &bytes).unwrap();
        let drives = layout::open_drives(dir.path()).unwrap();
        adopt(&manifests, dir.path(), &drives, ".received", FOLDER_NAME, id, digest).unwrap();
        assert_eq!(manifests.digest(FOLDER_NAME, Some(id)), Some(digest), "known at once");
        assert!(!pass(&manifests, dir.path(), &Sizes::default(), &stop));
        assert!(file(dir.path()).exists(), "kept though the copy has no marker yet and is held");

        std::fs::write(copy.join(layout::MARKER), "").unwrap();
        drop(hold);
        pass(&manifests, dir.path(), &Sizes::default(), &stop);
        assert_eq!(reported(dir.path(), &manifests), Some(digest.to_string()));
        assert_eq!(std::fs::read(file(dir.path())).unwrap(), bytes, "not made again");

        // A hold taken since may write to the copy: its manifest goes.
        let _writer = manifests.hold(Some(dir.path()), &fill());
        pass(&manifests, dir.path(), &Sizes::default(), &stop);
        assert!(!file(dir.path()).exists());
        assert_eq!(reported(dir.path(), &manifests), None);
        // A pull that cannot finish takes back what it adopted.
        std::fs::write(dir.path().join("drives/.received"), &bytes).unwrap();
        adopt(&manifests, dir.path(), &drives, ".received", FOLDER_NAME, id, digest).unwrap();
        disown(&manifests, &drives, FOLDER_NAME);
        assert!(!file(dir.path()).exists());
        assert_eq!(manifests.digest(FOLDER_NAME, Some(id)), None);
    }

    #[test]
    fn a_copy_holding_a_link_gets_no_manifest_and_is_not_walked_again() {
        let (dir, _) = location();
        let copy = dir.path().join("drives").join(FOLDER_NAME);
        std::os::unix::fs::symlink("/etc", copy.join("train/escape")).unwrap();
        let (manifests, stop) = (Manifests::default(), CancellationToken::new());
        manifests.settle();
        assert!(!pass(&manifests, dir.path(), &Sizes::default(), &stop));
        assert!(!file(dir.path()).exists());
        assert_eq!(manifests.state().refused.len(), 1);
        assert_eq!(reported(dir.path(), &manifests), None);
    }
}
