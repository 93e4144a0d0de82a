//! A copy's files and empty folders in the manifest's order, found without following a link.
//!
//! Each folder is opened beneath its parent's descriptor with `O_NOFOLLOW`, from the copy's own
//! descriptor, as `sizes` walks. Siblings are sorted so that the paths come out in byte-wise
//! order: a folder with entries sorts as its name followed by `/`, since every path beneath it
//! has that prefix, and an empty one as its bare name, the only path it yields.

use std::fs::File;
use std::os::fd::OwnedFd;

use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags};

use super::{MAX_DEPTH, MAX_ENTRIES, MAX_PATH_BYTES, reserved};
pub(super) use crate::agent::layout::open_dir;
use crate::agent::layout::{COPY_ID, MARKER};

/// What a walk finds, in order.
#[derive(Debug)]
pub(super) enum Found {
    File {
        path: String,
        file: File,
        size: u64,
    },
    EmptyDir(String),
    /// What a manifest cannot list.
    Odd {
        path: String,
        odd: Odd,
    },
}

impl Found {
    pub(super) fn path(&self) -> &str {
        match self {
            Found::File { path, .. } | Found::EmptyDir(path) | Found::Odd { path, .. } => path,
        }
    }
}

/// Entries a manifest cannot list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Odd {
    Symlink,
    Device,
    Fifo,
    Socket,
    /// Something mounted inside the copy.
    OtherFilesystem,
    NotUtf8,
    /// A name kept for the agent's own files (`.astralyx-*`, `.astraeus-drive`).
    Reserved,
}

impl Odd {
    /// Why a copy holding it has no manifest.
    pub(super) fn refusal(self, path: &str) -> String {
        let (what, copy) = match self {
            Odd::Symlink => ("a symlink", "a copy with links"),
            Odd::Device => ("a device", "a copy with devices"),
            Odd::Fifo => ("a fifo", "a copy with fifos"),
            Odd::Socket => ("a socket", "a copy with sockets"),
            Odd::OtherFilesystem => ("on another filesystem", "a copy with mounts inside"),
            Odd::NotUtf8 => ("not named in UTF-8", "a copy with such names"),
            Odd::Reserved => ("named as the agent's own files", "a copy with such names"),
        };
        format!("{path} is {what}: {copy} is not sent to peers")
    }
}

pub(super) struct Walk {
    dev: u64,
    /// The folders being read, deepest last.
    stack: Vec<Frame>,
    /// Entries listed so far.
    seen: u64,
}

struct Frame {
    dir: OwnedFd,
    /// The folder's path with a trailing `/`; empty for the copy itself.
    prefix: String,
    /// Its entries not yet yielded, the next one last.
    left: Vec<Child>,
}

struct Child {
    /// The name, or its lossy form when not UTF-8 (then `kind` is `Odd`).
    name: String,
    kind: Kind,
    ino: u64,
}

#[derive(Clone, Copy)]
enum Kind {
    File,
    Dir { empty: bool },
    Odd(Odd),
}

impl Child {
    /// The sort key: the name, with a `/` after a folder that has entries.
    fn key(&self) -> impl Iterator<Item = u8> + '_ {
        let slash = matches!(self.kind, Kind::Dir { empty: false }).then_some(b'/');
        self.name.bytes().chain(slash)
    }
}

impl Walk {
    /// A walk of the folder open at `root`.
    pub(super) fn new(root: OwnedFd) -> Result<Walk, String> {
        let dev = rustix::fs::fstat(&root).map_err(|e| format!("cannot read the copy: {e}"))?.st_dev;
        let mut walk = Walk { dev, stack: vec![], seen: 0 };
        walk.enter(root, String::new())?;
        Ok(walk)
    }

    fn enter(&mut self, dir: OwnedFd, prefix: String) -> Result<(), String> {
        if self.stack.len() >= MAX_DEPTH {
            let folder = prefix.trim_end_matches('/');
            return Err(format!("{folder} is more than {MAX_DEPTH} folders deep"));
        }
        let mut left = self.list(&dir, &prefix)?;
        left.sort_unstable_by(|a, b| b.key().cmp(a.key()));
        self.stack.push(Frame { dir, prefix, left });
        Ok(())
    }

    fn list(&mut self, dir: &OwnedFd, prefix: &str) -> Result<Vec<Child>, String> {
        let cannot = |e| format!("cannot read {}: {e}", shown(prefix));
        let mut entries = Dir::read_from(dir).map_err(cannot)?;
        let mut children = vec![];
        while let Some(entry) = entries.read() {
            let entry = entry.map_err(cannot)?;
            let raw = entry.file_name();
            if raw == c"." || raw == c".." {
                continue;
            }
            let name = raw.to_string_lossy();
            // The agent's own files at the top are not the copy's data.
            if prefix.is_empty() && (name == MARKER || name == COPY_ID) {
                continue;
            }
            self.seen += 1;
            if self.seen > MAX_ENTRIES {
                return Err(format!("the copy holds more than {MAX_ENTRIES} entries"));
            }
            let Ok(st) = rustix::fs::statat(dir, raw, AtFlags::SYMLINK_NOFOLLOW) else { continue };
            let kind = match FileType::from_raw_mode(st.st_mode) {
                _ if raw.to_str().is_err() => Kind::Odd(Odd::NotUtf8),
                _ if reserved(&name) => Kind::Odd(Odd::Reserved),
                _ if st.st_dev != self.dev => Kind::Odd(Odd::OtherFilesystem),
                FileType::RegularFile => Kind::File,
                FileType::Directory => Kind::Dir { empty: is_empty(dir, raw) },
                FileType::Symlink => Kind::Odd(Odd::Symlink),
                FileType::Fifo => Kind::Odd(Odd::Fifo),
                FileType::Socket => Kind::Odd(Odd::Socket),
                _ => Kind::Odd(Odd::Device),
            };
            children.push(Child { name: name.into_owned(), kind, ino: st.st_ino });
        }
        Ok(children)
    }

    /// The next file, empty folder or odd entry; `None` once the walk is over.
    pub(super) fn next(&mut self) -> Option<Result<Found, String>> {
        loop {
            let frame = self.stack.last_mut()?;
            let Some(child) = frame.left.pop() else {
                self.stack.pop();
                continue;
            };
            let path = format!("{}{}", frame.prefix, child.name);
            if path.len() > MAX_PATH_BYTES {
                return Some(Err(format!("{path} is longer than {MAX_PATH_BYTES} bytes")));
            }
            let found = match child.kind {
                Kind::Odd(odd) => Found::Odd { path, odd },
                Kind::Dir { empty: true } => Found::EmptyDir(path),
                Kind::File => match open_file(&frame.dir, &child, self.dev) {
                    Ok((_, size, on_disk)) if sparse(size, on_disk) => {
                        return Some(Err(format!(
                            "{path} is sparse ({on_disk} bytes on disk of {size}): a copy with sparse files \
                             is not sent to peers"
                        )));
                    }
                    Ok((file, size, _)) => Found::File { path, file, size },
                    Err(e) => return Some(Err(format!("cannot read {path}: {e}"))),
                },
                Kind::Dir { empty: false } => {
                    let Ok(dir) = open_dir(&frame.dir, child.name.as_str()) else {
                        return Some(Err(format!("cannot open folder {path}")));
                    };
                    if let Err(e) = self.enter(dir, path + "/") {
                        return Some(Err(e));
                    }
                    continue;
                }
            };
            return Some(Ok(found));
        }
    }
}

/// Files at least this large are hashed only when most of them is on disk.
const SPARSE_FLOOR: u64 = 64 << 20;

/// A large file with less than half of it on disk: hashing it would read mostly holes, at
/// the cost of the machine's other work, for bytes the copy does not hold (a fill can make a
/// file of terabytes in an instant).
fn sparse(size: u64, on_disk: u64) -> bool {
    size >= SPARSE_FLOOR && on_disk < size / 2
}

/// The file `child` of `dir`, if it is still the regular file listed; with its size and the
/// bytes it takes on disk.
fn open_file(dir: &OwnedFd, child: &Child, dev: u64) -> Result<(File, u64, u64), String> {
    // Non-blocking, so that a fifo put there since the listing cannot hold the walk.
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK | OFlags::NOCTTY;
    let fd = rustix::fs::openat(dir, child.name.as_str(), flags, Mode::empty()).map_err(|e| e.to_string())?;
    let st = rustix::fs::fstat(&fd).map_err(|e| e.to_string())?;
    let same = FileType::from_raw_mode(st.st_mode) == FileType::RegularFile
        && (st.st_dev, st.st_ino) == (dev, child.ino);
    if !same {
        return Err("it changed while the copy was walked".into());
    }
    Ok((File::from(fd), st.st_size.max(0) as u64, (st.st_blocks.max(0) as u64).saturating_mul(512)))
}

/// Whether the folder `name` beneath `parent` has no entries; a folder that cannot be read is
/// taken as having some, so that opening it fails the walk with its name.
fn is_empty(parent: &OwnedFd, name: &std::ffi::CStr) -> bool {
    let Some(mut dir) = open_dir(parent, name).ok().and_then(|fd| Dir::new(fd).ok()) else { return false };
    while let Some(entry) = dir.read() {
        match entry {
            Ok(e) if e.file_name() == c"." || e.file_name() == c".." => continue,
            _ => return false,
        }
    }
    true
}

fn shown(prefix: &str) -> String {
    match prefix.strip_suffix('/') {
        Some(folder) => format!("folder {folder}"),
        None => "the copy".into(),
    }
}
