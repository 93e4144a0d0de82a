//! Copy sizes, measured off the heartbeat's path.
//!
//! Measuring a copy takes a step per file, and a copy may hold millions (a dataset, or what a
//! worker makes): a heartbeat that waited for such a walk would come past the server's grace
//! period, and every worker on the machine would fail. A [`Measurer`] walks the copies in turn,
//! a bounded number of entries per pass, and resumes where it stopped; heartbeats read the
//! latest size known of each copy from [`Sizes`] and never walk.
//!
//! A walk follows no symlink and stays on its copy's filesystem: each folder is opened beneath
//! its parent's descriptor with `O_NOFOLLOW`, starting from the `drives/` folder's descriptor,
//! and an entry on another device (something mounted inside the copy) is skipped.

use std::collections::{HashMap, VecDeque};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rustix::fs::{AtFlags, Dir, FileType};

use super::layout::{self, open_dir};

/// Entries a pass visits at most, over all the copies it walks.
pub const PASS_ENTRIES: usize = 20_000;
/// Folders a walk descends at most: each level holds a descriptor open while it is walked.
const MAX_DEPTH: usize = 128;

/// The latest size known of each copy, by folder name, shared by the measurer and heartbeats.
#[derive(Debug, Default)]
pub struct Sizes(Mutex<HashMap<String, Size>>);

/// A copy's size as its latest finished walk found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size {
    pub bytes: u64,
    /// Files, the marker aside: what a manifest of the copy would count.
    pub files: u64,
    /// Whether the walk began with the marker there: a fill writes it last, so such a walk
    /// counted the whole copy. A copy just made whole is counted by its size hint until then.
    pub whole: bool,
}

impl Sizes {
    /// The bytes last measured of `folder`; `None` until a walk of it has finished.
    pub fn get(&self, folder: &str) -> Option<u64> {
        self.size(folder).map(|s| s.bytes)
    }

    /// What the latest finished walk of `folder` found.
    pub fn size(&self, folder: &str) -> Option<Size> {
        self.0.lock().expect("not poisoned").get(folder).copied()
    }

    fn set(&self, folder: &str, size: Size) {
        self.0.lock().expect("not poisoned").insert(folder.to_owned(), size);
    }

    fn keep_only(&self, folders: &[String]) {
        self.0.lock().expect("not poisoned").retain(|f, _| folders.contains(f));
    }
}

/// What one pass did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pass {
    /// Entries visited: never more than the pass's budget.
    pub visited: usize,
    /// Whether a walk is left unfinished: the next pass should come soon.
    pub unfinished: bool,
}

/// Walks the copies of one data location in turn, resuming unfinished walks.
#[derive(Default)]
pub struct Measurer {
    dir: Option<PathBuf>,
    /// The copies in the order they are walked; the front is walked next. Copies never
    /// measured go first.
    turn: VecDeque<String>,
    /// Walks begun and not finished, by folder.
    walks: HashMap<String, Walk>,
}

impl Measurer {
    /// Visits at most `budget` entries, walking the copies in `dir`'s `drives/` in turn, and
    /// records in `sizes` each copy whose walk finishes. Stops early once every copy was
    /// measured in this pass.
    pub fn pass(&mut self, dir: &Path, sizes: &Sizes, budget: usize) -> Pass {
        if self.dir.as_deref() != Some(dir) {
            *self = Measurer { dir: Some(dir.to_path_buf()), ..Measurer::default() };
        }
        let Some(drives) = layout::open_drives(dir) else {
            self.turn.clear();
            self.walks.clear();
            sizes.keep_only(&[]);
            return Pass { visited: 0, unfinished: false };
        };
        let present = layout::copy_folders(&drives);
        sizes.keep_only(&present);
        self.turn.retain(|f| present.contains(f));
        self.walks.retain(|f, _| present.contains(f));
        // Copies never measured go first, then copies made whole since their last walk: until
        // such a copy is measured whole the server counts it by its size hint.
        let whole_since: Vec<&String> = present
            .iter()
            .filter(|f| self.turn.contains(f) && !self.walks.contains_key(*f))
            .filter(|f| sizes.size(f).is_some_and(|s| !s.whole) && layout::has_marker(&drives, f))
            .collect();
        for folder in whole_since {
            self.turn.retain(|f| f != folder);
            self.turn.push_front(folder.clone());
        }
        let new: Vec<&String> = present.iter().filter(|f| !self.turn.contains(f)).collect();
        for folder in new {
            self.turn.push_front(folder.clone());
        }
        let (mut left, mut finished) = (budget, 0);
        while left > 0 && finished < self.turn.len() {
            let Some(folder) = self.turn.front().cloned() else { break };
            let walk = match self.walks.remove(&folder) {
                Some(w) => Some(w),
                None => Walk::start(&drives, &folder),
            };
            let Some(mut walk) = walk else {
                // Not a folder this walk may enter (gone, or a link): nothing to count.
                self.turn.rotate_left(1);
                finished += 1;
                continue;
            };
            if walk.step(&mut left) {
                sizes.set(&folder, Size { bytes: walk.bytes, files: walk.files, whole: walk.whole });
                self.turn.rotate_left(1);
                finished += 1;
            } else {
                self.walks.insert(folder, walk);
            }
        }
        Pass { visited: budget - left, unfinished: !self.walks.is_empty() }
    }
}

/// One copy's walk: the folders being read, deepest last.
struct Walk {
    dev: u64,
    stack: Vec<Dir>,
    bytes: u64,
    files: u64,
    whole: bool,
}

impl Walk {
    fn start(drives: &OwnedFd, folder: &str) -> Option<Walk> {
        let whole = layout::has_marker(drives, folder);
        let fd = open_dir(drives, folder).ok()?;
        let dev = rustix::fs::fstat(&fd).ok()?.st_dev;
        Some(Walk { dev, stack: vec![Dir::new(fd).ok()?], bytes: 0, files: 0, whole })
    }

    /// Visits entries until `left` is spent or the walk ends; whether it ended.
    fn step(&mut self, left: &mut usize) -> bool {
        while *left > 0 {
            let depth = self.stack.len();
            let Some(top) = self.stack.last_mut() else { return true };
            let entry = match top.read() {
                None | Some(Err(_)) => {
                    self.stack.pop();
                    continue;
                }
                Some(Ok(entry)) => entry,
            };
            let name = entry.file_name();
            // The drive id the agent keeps in the copy, and the marker, are not the copy's data.
            let own = |file: &str| depth == 1 && name.to_bytes() == file.as_bytes();
            if name == c"." || name == c".." || own(layout::COPY_ID) || own(layout::MARKER) {
                continue;
            }
            *left -= 1;
            let Ok(parent) = top.fd() else { continue };
            let Ok(st) = rustix::fs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW) else { continue };
            if st.st_dev != self.dev {
                continue;
            }
            let child = match FileType::from_raw_mode(st.st_mode) {
                FileType::RegularFile => {
                    self.bytes += st.st_size.max(0) as u64;
                    self.files += 1;
                    None
                }
                FileType::Directory if depth < MAX_DEPTH => {
                    open_dir(parent, name).ok().and_then(|fd| Dir::new(fd).ok())
                }
                _ => None,
            };
            self.stack.extend(child);
        }
        self.stack.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn copy(dir: &Path, folder: &str) -> PathBuf {
        let path = dir.join("drives").join(folder);
        std::fs::create_dir_all(&path).unwrap();
        path
    }

    /// Passes until the measurer has nothing left to walk; how many it took.
    fn settle(m: &mut Measurer, dir: &Path, sizes: &Sizes, budget: usize) -> usize {
        (1..).find(|_| !m.pass(dir, sizes, budget).unfinished).unwrap()
    }

    #[test]
    fn a_copy_of_very_many_files_is_measured_over_passes_while_reports_read_what_is_known() {
        const FILES: usize = 200_000;
        const BUDGET: usize = 10_000;
        let dir = tempfile::tempdir().unwrap();
        let big = copy(dir.path(), "default.many");
        for i in 0..FILES / 1000 {
            let sub = big.join(i.to_string());
            std::fs::create_dir(&sub).unwrap();
            for j in 0..1000 {
                std::fs::File::create(sub.join(j.to_string())).unwrap();
            }
        }
        std::fs::write(big.join("weights"), vec![0u8; 4096]).unwrap();
        std::fs::write(big.join(layout::MARKER), b"").unwrap();
        let (sizes, mut m) = (Sizes::default(), Measurer::default());

        let first = m.pass(dir.path(), &sizes, BUDGET);
        assert_eq!(first, Pass { visited: BUDGET, unfinished: true });
        // The heartbeat's report, made while the walk is unfinished, reads only what is known.
        let report = crate::agent::disk::report(dir.path(), &sizes, &Default::default());
        assert_eq!(report.copies.len(), 1);
        let c = &report.copies[0];
        assert_eq!((c.drive.as_str(), c.bytes, c.complete), ("default.many", 0, true));

        // 200,000 files, 200 folders, and `weights` (the marker is not data): 200,201 entries, 10,000 a pass.
        let rest = settle(&mut m, dir.path(), &sizes, BUDGET);
        assert_eq!(1 + rest, 200_201usize.div_ceil(BUDGET));
        assert_eq!(crate::agent::disk::report(dir.path(), &sizes, &Default::default()).copies[0].bytes, 4096);
    }

    #[test]
    fn a_new_copy_is_measured_before_an_unfinished_walk_resumes() {
        let dir = tempfile::tempdir().unwrap();
        let big = copy(dir.path(), "default.big");
        for i in 0..100 {
            std::fs::write(big.join(i.to_string()), b"x").unwrap();
        }
        let (sizes, mut m) = (Sizes::default(), Measurer::default());
        assert!(m.pass(dir.path(), &sizes, 10).unfinished);
        std::fs::write(copy(dir.path(), "default.small").join("a"), vec![0u8; 7]).unwrap();
        assert!(m.pass(dir.path(), &sizes, 10).unfinished);
        assert_eq!(sizes.get("default.small"), Some(7), "measured in the first pass that saw it");
        assert_eq!(sizes.get("default.big"), None);
        settle(&mut m, dir.path(), &sizes, 10);
        assert_eq!(sizes.get("default.big"), Some(100));
        // Every copy measured in one pass: the pass stops there, however large its budget.
        assert_eq!(m.pass(dir.path(), &sizes, 1_000), Pass { visited: 101, unfinished: false });
    }

    #[test]
    fn a_copy_made_whole_since_its_walk_is_measured_again_before_an_unfinished_walk_resumes() {
        let dir = tempfile::tempdir().unwrap();
        let small = copy(dir.path(), "default.small");
        std::fs::write(small.join("a"), b"abc").unwrap();
        let (sizes, mut m) = (Sizes::default(), Measurer::default());
        settle(&mut m, dir.path(), &sizes, 10);
        assert_eq!(sizes.size("default.small"), Some(Size { bytes: 3, files: 1, whole: false }));
        let big = copy(dir.path(), "default.big");
        for i in 0..100 {
            std::fs::write(big.join(i.to_string()), b"x").unwrap();
        }
        assert!(m.pass(dir.path(), &sizes, 50).unfinished, "big's walk is under way, ahead of small");

        // The fill ends: its last file, then the marker. small's three entries come before big's
        // walk goes on.
        std::fs::write(small.join("b"), b"defg").unwrap();
        std::fs::write(small.join(layout::MARKER), b"").unwrap();
        assert!(m.pass(dir.path(), &sizes, 5).unfinished);
        assert_eq!(sizes.size("default.small"), Some(Size { bytes: 7, files: 2, whole: true }));
        assert_eq!(sizes.get("default.big"), None);
    }

    #[test]
    fn a_walk_counts_no_link_and_forgets_removed_copies() {
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        std::fs::write(elsewhere.path().join("big"), vec![0u8; 10_000]).unwrap();
        let c = copy(dir.path(), "default.x");
        std::fs::write(c.join("own"), vec![0u8; 5]).unwrap();
        std::fs::create_dir(c.join("deep")).unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), c.join("deep/esc")).unwrap();
        std::os::unix::fs::symlink(elsewhere.path().join("big"), c.join("file-link")).unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), dir.path().join("drives/default.link")).unwrap();
        let (sizes, mut m) = (Sizes::default(), Measurer::default());
        settle(&mut m, dir.path(), &sizes, 1_000);
        assert_eq!(sizes.get("default.x"), Some(5));
        assert_eq!(sizes.get("default.link"), None, "a link in drives/ is not a copy");

        crate::agent::disk::tests::delete_reported(dir.path(), "default.x");
        m.pass(dir.path(), &sizes, 1_000);
        assert_eq!(sizes.get("default.x"), None);
    }
}
