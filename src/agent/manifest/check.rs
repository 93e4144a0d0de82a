//! Comparing what is on disk with a manifest: what a receiver asks of the copy it was sent.

use std::fmt;
use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::path::Path;

use rustix::fs::{AtFlags, CWD, FileType, Mode, OFlags};

use super::walk::{self, Found, Walk};
use super::{BUFFER_BYTES, Entry, Manifest, hash_chunks};

/// How a folder differs from a manifest, each entry by its relative path.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Check {
    /// Entries listed and not on disk, or on disk as something else (a folder for a file…).
    pub missing: Vec<String>,
    /// Files of another size than listed.
    pub wrong_size: Vec<String>,
    /// The first file, in the manifest's order, whose content differs: no file is hashed after it.
    pub changed: Option<String>,
    /// What is on disk and not listed: files, empty folders, links and the like.
    pub extra: Vec<String>,
}

impl Check {
    /// Whether the folder holds exactly what the manifest lists.
    pub fn is_clear(&self) -> bool {
        *self == Check::default()
    }
}

/// Compares the folder `folder` (not followed if a link) with `manifest`, hashing every file
/// of the listed size until one differs. Blocking: it reads the whole copy. Fails only when the
/// folder cannot be walked or a file cannot be read.
pub fn check(folder: &Path, manifest: &Manifest) -> Result<Check, String> {
    let root = walk::open_dir(CWD, folder).map_err(|e| format!("cannot open {}: {e}", folder.display()))?;
    compare_all(root, manifest, Depth::Contents)
}

/// What the folder open at `root` holds that `manifest` does not list as it is: entries not
/// listed, and those of another kind than listed (a folder for a file…). What a receiver
/// removes from a folder it resumes into, whose files it checks itself; no file is read.
pub fn unlisted(root: OwnedFd, manifest: &Manifest) -> Result<Vec<String>, String> {
    let found = compare_all(root, manifest, Depth::Kinds)?;
    Ok(found.extra)
}

/// [`check`] of the folder open at `root` by sizes alone: what a whole copy lost since its
/// manifest was made, found without reading a file.
pub fn sizes(root: OwnedFd, manifest: &Manifest) -> Result<Check, String> {
    compare_all(root, manifest, Depth::Sizes)
}

/// How far a comparison looks into each file listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Depth {
    /// Only that it is a file.
    Kinds,
    Sizes,
    /// Its size, then its chunks' hashes.
    Contents,
}

/// [`check`] of the folder open at `root`, as deep as `depth`.
fn compare_all(root: OwnedFd, manifest: &Manifest, depth: Depth) -> Result<Check, String> {
    let mut walk = Walk::new(root)?;
    let mut listed = manifest.entries().iter().peekable();
    let mut found = walk.next().transpose()?;
    let mut result = Check::default();
    let mut buf = if depth == Depth::Contents { vec![0u8; BUFFER_BYTES] } else { vec![] };
    loop {
        match (listed.peek(), found.as_mut()) {
            (None, None) => return Ok(result),
            (Some(entry), Some(on_disk)) if entry.path() == on_disk.path() => {
                match on_disk {
                    Found::File { .. } if depth == Depth::Kinds && !entry.is_dir() => {}
                    _ => compare(entry, on_disk, &mut result, &mut buf, depth)?,
                }
                listed.next();
                found = walk.next().transpose()?;
            }
            (Some(entry), on_disk) if on_disk.as_ref().is_none_or(|f| entry.path() < f.path()) => {
                result.missing.push(entry.path().to_owned());
                listed.next();
            }
            (_, Some(on_disk)) => {
                result.extra.push(on_disk.path().to_owned());
                found = walk.next().transpose()?;
            }
            (Some(_), None) => unreachable!("taken by the arm before"),
        }
    }
}

fn compare(
    entry: &Entry,
    on_disk: &mut Found,
    result: &mut Check,
    buf: &mut [u8],
    depth: Depth,
) -> Result<(), String> {
    match on_disk {
        Found::EmptyDir(_) if entry.is_dir() => {}
        Found::File { size, .. } if !entry.is_dir() && *size != entry.size() => {
            result.wrong_size.push(entry.path().to_owned());
        }
        Found::File { .. } if !entry.is_dir() && depth == Depth::Sizes => {}
        Found::File { file, .. } if !entry.is_dir() => {
            if result.changed.is_none() {
                let differs = first_difference(file, entry, buf);
                if differs.map_err(|e| format!("cannot read {}: {e}", entry.path()))?.is_some() {
                    result.changed = Some(entry.path().to_owned());
                }
            }
        }
        _ => {
            result.missing.push(entry.path().to_owned());
            result.extra.push(on_disk.path().to_owned());
        }
    }
    Ok(())
}

/// The first chunk of `file` whose hash is not the one `entry` lists for it.
fn first_difference(file: &mut File, entry: &Entry, buf: &mut [u8]) -> io::Result<Option<usize>> {
    let mut differs = None;
    hash_chunks(file, entry.size(), buf, |i, hash| {
        let same = entry.chunk(i) == Some(hash);
        if !same {
            differs = Some(i);
        }
        same
    })?;
    Ok(differs)
}

/// How one entry on disk differs from its line in a manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mismatch {
    Missing,
    /// A folder, link or the like where a file is listed, or the other way round.
    NotAsListed,
    Size {
        listed: u64,
        found: u64,
    },
    /// The first chunk whose hash differs.
    Chunk(usize),
    Unreadable(String),
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mismatch::Missing => write!(f, "missing"),
            Mismatch::NotAsListed => write!(f, "not a regular file or folder as listed"),
            Mismatch::Size { listed, found } => write!(f, "{found} bytes, not the {listed} listed"),
            Mismatch::Chunk(i) => write!(f, "chunk {i} differs from the one listed"),
            Mismatch::Unreadable(why) => write!(f, "cannot be read: {why}"),
        }
    }
}

/// Whether the file (or empty folder) at `path` is `entry`: what a receiver asks of each file
/// as it lands. The last component of `path` is not followed if a link. Blocking: it reads the
/// whole file.
pub fn verify_file(path: &Path, entry: &Entry) -> Result<(), Mismatch> {
    let unreadable = |e: rustix::io::Errno| Mismatch::Unreadable(e.to_string());
    let st = match rustix::fs::statat(CWD, path, AtFlags::SYMLINK_NOFOLLOW) {
        Err(rustix::io::Errno::NOENT) => return Err(Mismatch::Missing),
        other => other.map_err(unreadable)?,
    };
    let kind = FileType::from_raw_mode(st.st_mode);
    if entry.is_dir() {
        return if kind == FileType::Directory { Ok(()) } else { Err(Mismatch::NotAsListed) };
    }
    if kind != FileType::RegularFile {
        return Err(Mismatch::NotAsListed);
    }
    // Non-blocking and not followed: what replaced the file since cannot hold or lead the read.
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK | OFlags::NOCTTY;
    let fd = rustix::fs::openat(CWD, path, flags, Mode::empty()).map_err(unreadable)?;
    let st = rustix::fs::fstat(&fd).map_err(unreadable)?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return Err(Mismatch::NotAsListed);
    }
    let found = st.st_size.max(0) as u64;
    if found != entry.size() {
        return Err(Mismatch::Size { listed: entry.size(), found });
    }
    let mut buf = vec![0u8; BUFFER_BYTES.min(found as usize)];
    match first_difference(&mut File::from(fd), entry, &mut buf) {
        Ok(None) => Ok(()),
        Ok(Some(i)) => Err(Mismatch::Chunk(i)),
        Err(e) => Err(Mismatch::Unreadable(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

    use uuid::Uuid;

    use super::super::{CHUNK_BYTES, Digest, build, parse::parse};
    use super::*;

    fn built(copy: &Path) -> Result<(Vec<u8>, Digest), String> {
        let mut out = vec![];
        let digest = build(copy, Uuid::nil(), tempfile::tempfile().unwrap(), &mut out, &|| true)?;
        Ok((out, digest))
    }

    fn manifest_of(copy: &Path) -> Manifest {
        let (bytes, digest) = built(copy).unwrap();
        Manifest::read(&mut Cursor::new(bytes), &digest).unwrap()
    }

    /// A copy of names that sort differently one by one and as whole paths, a file of more
    /// than one chunk, an empty file and an empty folder, with the agent's own files on top.
    fn sample() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        for sub in ["a/b", "empty", "a0"] {
            std::fs::create_dir_all(p.join(sub)).unwrap();
        }
        std::fs::write(p.join("a.txt"), "a").unwrap();
        std::fs::write(p.join("a/b/c.jpg"), "c").unwrap();
        std::fs::write(p.join("a/zero"), "").unwrap();
        std::fs::write(p.join("a0/big"), vec![7u8; CHUNK_BYTES as usize + 3]).unwrap();
        std::fs::write(p.join(crate::agent::layout::MARKER), "").unwrap();
        std::fs::write(p.join(crate::agent::layout::COPY_ID), Uuid::nil().to_string()).unwrap();
        dir
    }

    #[test]
    fn a_copy_built_then_checked_is_clear_and_its_manifest_reads_back() {
        let copy = sample();
        let (bytes, digest) = built(copy.path()).unwrap();
        let m = parse(&bytes[..]).unwrap();
        let paths: Vec<&str> = m.entries().iter().map(Entry::path).collect();
        // "a.txt" < "a/…" < "a0/…": '.' < '/' < '0', though the folder `a` sorts before `a.txt`.
        assert_eq!(paths, ["a.txt", "a/b/c.jpg", "a/zero", "a0/big", "empty"]);
        assert_eq!((m.files(), m.bytes()), (4, 2 + CHUNK_BYTES + 3));
        assert_eq!(m.entries()[3].chunk_count(), 2);
        assert_eq!(m.entries()[2].chunk_count(), 0);
        let text = String::from_utf8(bytes.clone()).unwrap();
        let header = text.lines().next().unwrap();
        assert_eq!(
            header,
            format!(
                r#"{{"version":1,"drive_id":"{}","chunk_bytes":8388608,"files":4,"bytes":8388613}}"#,
                Uuid::nil()
            )
        );
        assert!(
            text.contains(r#"{"path":"empty","dir":true}"#)
                && text.contains(r#""path":"a/zero","size":0,"chunks":[]}"#)
        );
        assert!(check(copy.path(), &m).unwrap().is_clear());
        assert_eq!(digest, Digest(blake3::hash(&bytes)));
    }

    #[test]
    fn the_digest_is_stable_for_the_same_content_and_changes_with_it() {
        let (one, two) = (sample(), sample());
        let digest = built(one.path()).unwrap().1;
        assert_eq!(built(two.path()).unwrap().1, digest);
        std::fs::write(two.path().join("a/zero"), "!").unwrap();
        assert_ne!(built(two.path()).unwrap().1, digest);
    }

    #[test]
    fn a_check_names_the_changed_missing_resized_and_extra_files() {
        let copy = sample();
        let m = manifest_of(copy.path());
        let p = copy.path();
        let mut big = std::fs::read(p.join("a0/big")).unwrap();
        big[CHUNK_BYTES as usize + 1] ^= 1;
        std::fs::write(p.join("a0/big"), &big).unwrap();
        let result = check(p, &m).unwrap();
        assert_eq!(result, Check { changed: Some("a0/big".into()), ..Check::default() });
        assert_eq!(verify_file(&p.join("a0/big"), &m.entries()[3]), Err(Mismatch::Chunk(1)));

        std::fs::remove_file(p.join("a/b/c.jpg")).unwrap();
        std::fs::write(p.join("a.txt"), "longer").unwrap();
        std::fs::write(p.join("new"), "").unwrap();
        std::fs::remove_dir(p.join("empty")).unwrap();
        std::fs::write(p.join("empty"), "").unwrap();
        let result = check(p, &m).unwrap();
        let expected = Check {
            // `a/b` is empty now: on disk, an empty folder the manifest does not list.
            missing: vec!["a/b/c.jpg".into(), "empty".into()],
            wrong_size: vec!["a.txt".into()],
            changed: Some("a0/big".into()),
            extra: vec!["a/b".into(), "empty".into(), "new".into()],
        };
        assert_eq!(result, expected);
        // What a receiver removes: the extras alone, found without reading a file.
        let root = walk::open_dir(CWD, p).unwrap();
        assert_eq!(unlisted(root, &m).unwrap(), expected.extra);
        assert_eq!(
            verify_file(&p.join("a.txt"), &m.entries()[0]),
            Err(Mismatch::Size { listed: 1, found: 6 })
        );
        assert_eq!(verify_file(&p.join("a/b/c.jpg"), &m.entries()[1]), Err(Mismatch::Missing));
        assert_eq!(verify_file(&p.join("empty"), &m.entries()[4]), Err(Mismatch::NotAsListed));
        assert_eq!(verify_file(&p.join("a/zero"), &m.entries()[2]), Ok(()));
    }

    #[test]
    fn a_copy_holding_a_link_or_fifo_has_no_manifest_and_the_refusal_names_it() {
        let copy = sample();
        std::os::unix::fs::symlink("/etc/passwd", copy.path().join("a/b/link")).unwrap();
        let err = built(copy.path()).unwrap_err();
        assert_eq!(err, "a/b/link is a symlink: a copy with links is not sent to peers");
        // Where a link stands in a received copy, a check counts it as extra.
        let m = manifest_of(sample().path());
        assert_eq!(check(copy.path(), &m).unwrap().extra, ["a/b/link"]);
        std::fs::remove_file(copy.path().join("a/b/c.jpg")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", copy.path().join("a/b/c.jpg")).unwrap();
        assert_eq!(verify_file(&copy.path().join("a/b/c.jpg"), &m.entries()[1]), Err(Mismatch::NotAsListed));

        let other = sample();
        rustix::fs::mknodat(CWD, other.path().join("pipe"), FileType::Fifo, Mode::from_raw_mode(0o600), 0)
            .unwrap();
        let err = built(other.path()).unwrap_err();
        assert_eq!(err, "pipe is a fifo: a copy with fifos is not sent to peers");
        let third = sample();
        std::fs::write(third.path().join("a/.astralyx-filled"), "").unwrap();
        assert!(
            built(third.path()).unwrap_err().starts_with("a/.astralyx-filled is named as the agent's own")
        );
    }

    #[test]
    fn a_copy_holding_a_large_sparse_file_has_no_manifest() {
        let copy = sample();
        let hole = std::fs::File::create(copy.path().join("hole.bin")).unwrap();
        hole.set_len(1 << 30).unwrap();
        let err = built(copy.path()).unwrap_err();
        assert!(err.starts_with("hole.bin is sparse ("), "{err}");
        assert!(err.ends_with("of 1073741824): a copy with sparse files is not sent to peers"), "{err}");
    }

    #[test]
    fn a_build_stops_when_asked() {
        let copy = sample();
        let mut out = vec![];
        let err =
            build(copy.path(), Uuid::nil(), tempfile::tempfile().unwrap(), &mut out, &|| false).unwrap_err();
        assert_eq!(err, super::super::build::STOPPED);
    }
}
