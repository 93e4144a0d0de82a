//! A copy's manifest: its files, each with its size and the BLAKE3 of each of its chunks, and its
//! empty folders, so that a copy a machine receives from a peer can be checked against what the
//! first fill wrote.
//!
//! The format is JSON lines, written and read a line at a time since a copy may hold millions of
//! files: a header, then one line per entry in byte-wise order of their paths (relative, with `/`
//! separators):
//!
//! ```text
//! {"version":1,"drive_id":"…","chunk_bytes":8388608,"files":2,"bytes":123}
//! {"path":"a/b.jpg","size":123,"chunks":["<64 lowercase hex>"]}
//! {"path":"a/c","size":0,"chunks":[]}
//! {"path":"empty/dir","dir":true}
//! ```
//!
//! A file's chunks are its consecutive [`CHUNK_BYTES`], the last one shorter; an empty file has
//! none. A folder is listed only when empty: the others are implied by the files beneath them.
//! The marker and the drive id file are not listed: a receiver writes them itself. The manifest's
//! [`Digest`], the BLAKE3 of its bytes, is what the server hands a receiver to check it with.
//!
//! A manifest is built only from a copy holding nothing but files and folders (a link, device,
//! fifo or socket anywhere means none), and read from another machine only once its digest
//! matches and every line is valid ([`Manifest::read`]).

mod build;
mod check;
pub mod keep;
mod lost;
mod parse;
mod stored;
mod walk;

use std::io::{self, Read};
use std::ops::Range;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

pub use build::{STOPPED, build};
pub use check::{Check, Mismatch, check, sizes, unlisted, verify_file};
pub use keep::Manifests;
pub use parse::Invalid;

/// The only version of the format.
pub const VERSION: u32 = 1;
/// A file is hashed in chunks of this size, so a transfer can check (and resume at) each chunk.
pub const CHUNK_BYTES: u64 = 8 << 20;
/// Entries a manifest lists at most, and a walk of a copy visits at most.
pub const MAX_ENTRIES: u64 = 10_000_000;
/// The longest path a manifest lists, in bytes.
pub const MAX_PATH_BYTES: usize = 4096;
/// The largest file a manifest lists: a copy holding a larger one has none.
pub const MAX_FILE_BYTES: u64 = 2 << 40;
/// The longest line, newline excluded: the largest file's (262,144 chunks of 67 bytes, and a
/// path of at most 6 bytes a byte when escaped) fits.
pub const MAX_LINE_BYTES: usize = 18 << 20;
/// The largest manifest read from another machine.
pub const MAX_MANIFEST_BYTES: u64 = 4 << 30;
/// Folders a walk descends at most: each level holds a descriptor open while it is walked.
const MAX_DEPTH: usize = 128;
/// Files are read through a buffer of this size, reused from file to file.
const BUFFER_BYTES: usize = 1 << 20;

pub use crate::domain::digest::{Digest, parse_hex};

/// A manifest read and found valid: every path plain and relative, listed once, in order; every
/// file's chunk count matching its size; the header's totals matching the lines.
#[derive(Debug)]
pub struct Manifest {
    drive_id: Uuid,
    files: u64,
    bytes: u64,
    entries: Vec<Entry>,
}

impl Manifest {
    /// The drive the copy was made for.
    pub fn drive_id(&self) -> Uuid {
        self.drive_id
    }

    /// How many files it lists.
    pub fn files(&self) -> u64 {
        self.files
    }

    /// The files' bytes in all.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The files and empty folders, in byte-wise order of their paths.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }
}

/// A file or empty folder of a copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    path: Box<str>,
    size: u64,
    /// `None` for a folder.
    chunks: Option<Box<[blake3::Hash]>>,
}

impl Entry {
    /// Relative to the copy, with `/` separators; plain components only.
    pub fn path(&self) -> &str {
        &self.path
    }

    pub fn is_dir(&self) -> bool {
        self.chunks.is_none()
    }

    /// The file's size in bytes; 0 for a folder.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// How many chunks the file has: `ceil(size / CHUNK_BYTES)`.
    pub fn chunk_count(&self) -> usize {
        self.chunks.as_ref().map_or(0, |c| c.len())
    }

    /// The hash of chunk `i`, bytes `chunk_span(i)` of the file.
    pub fn chunk(&self, i: usize) -> Option<blake3::Hash> {
        self.chunks.as_ref()?.get(i).copied()
    }

    /// Where chunk `i` lies in the file.
    pub fn chunk_span(&self, i: usize) -> Option<Range<u64>> {
        (i < self.chunk_count()).then(|| {
            let start = i as u64 * CHUNK_BYTES;
            start..(start + CHUNK_BYTES).min(self.size)
        })
    }

    /// Whether `data` is chunk `i`: what a resumed transfer asks of each chunk already on disk.
    pub fn chunk_matches(&self, i: usize, data: &[u8]) -> bool {
        let (Some(span), Some(hash)) = (self.chunk_span(i), self.chunk(i)) else { return false };
        data.len() as u64 == span.end - span.start && blake3::hash(data) == hash
    }
}

/// The first line.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Header {
    version: u32,
    drive_id: Uuid,
    chunk_bytes: u64,
    files: u64,
    bytes: u64,
}

/// Every other line: a file (`size` and `chunks`) or an empty folder (`dir: true`).
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Line<'a> {
    #[serde(borrow)]
    path: std::borrow::Cow<'a, str>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    size: Option<u64>,
    /// Hex digits never need an escape: borrowed, so a chunk costs no allocation.
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    chunks: Option<Vec<&'a str>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    dir: Option<bool>,
}

/// Calls `each` with the hash of every chunk of the first `size` bytes of `file`, in order, until
/// it returns false, reading through `buf`. A file that ends before `size` is an error.
fn hash_chunks(
    file: &mut impl Read,
    size: u64,
    buf: &mut [u8],
    mut each: impl FnMut(usize, blake3::Hash) -> bool,
) -> io::Result<()> {
    let mut hasher = blake3::Hasher::new();
    let (mut done, mut index) = (0u64, 0usize);
    while done < size {
        let chunk_end = ((done / CHUNK_BYTES) + 1) * CHUNK_BYTES;
        let want = (chunk_end.min(size) - done).min(buf.len() as u64) as usize;
        let read = file.read(&mut buf[..want])?;
        if read == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        hasher.update(&buf[..read]);
        done += read as u64;
        if done == chunk_end || done == size {
            if !each(index, hasher.finalize()) {
                return Ok(());
            }
            hasher.reset();
            index += 1;
        }
    }
    Ok(())
}

/// A name kept for what the agent writes in a copy: never listed, never received from a peer.
fn reserved(name: &str) -> bool {
    name.starts_with(".astralyx-") || name == crate::agent::layout::COPY_ID
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The entry of a file `path` holding `data`, as a manifest would list it.
    pub(crate) fn entry(path: &str, data: &[u8]) -> Entry {
        let chunks = data.chunks(CHUNK_BYTES as usize).map(blake3::hash).collect();
        Entry { path: path.into(), size: data.len() as u64, chunks: Some(chunks) }
    }

    #[test]
    fn chunks_are_8_mib_with_a_shorter_last_and_none_for_an_empty_file() {
        let data: Vec<u8> = (0..CHUNK_BYTES + 5).map(|i| (i % 251) as u8).collect();
        let mut buf = vec![0; 1000];
        let mut seen = vec![];
        hash_chunks(&mut &data[..], data.len() as u64, &mut buf, |i, h| {
            seen.push((i, h));
            true
        })
        .unwrap();
        let split = CHUNK_BYTES as usize;
        let expected = [(0, blake3::hash(&data[..split])), (1, blake3::hash(&data[split..]))];
        assert_eq!(seen, expected);

        let mut none = 0;
        hash_chunks(&mut &[][..], 0, &mut buf, |_, _| {
            none += 1;
            true
        })
        .unwrap();
        assert_eq!(none, 0);
        let short = hash_chunks(&mut &data[..10], 11, &mut buf, |_, _| true).unwrap_err();
        assert_eq!(short.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn a_chunk_matches_only_its_own_bytes() {
        let data = b"hello".to_vec();
        let entry = Entry { path: "a".into(), size: 5, chunks: Some(vec![blake3::hash(&data)].into()) };
        assert_eq!(entry.chunk_span(0), Some(0..5));
        assert!(entry.chunk_matches(0, &data));
        assert!(!entry.chunk_matches(0, b"hellO") && !entry.chunk_matches(0, b"hell"));
        assert!(!entry.chunk_matches(1, &data) && entry.chunk_span(1).is_none());
    }

    #[test]
    fn a_digest_is_64_lowercase_hex_digits() {
        let hex = blake3::hash(b"x").to_hex().to_string();
        assert_eq!(Digest::parse(&hex).unwrap().to_string(), hex);
        for bad in [hex.to_uppercase(), hex[1..].to_string(), format!("{hex}0"), format!("{}g", &hex[1..])] {
            assert!(Digest::parse(&bad).is_err(), "{bad}");
        }
    }
}
