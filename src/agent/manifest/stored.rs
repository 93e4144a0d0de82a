//! Reading a manifest kept in the store: its file, its header, and what it was made for.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::os::fd::OwnedFd;

use rustix::fs::{Mode, OFlags};
use uuid::Uuid;

use super::{Digest, Header};

/// The manifest `name` in the store, opened without following a link.
pub(super) fn open(store: &OwnedFd, name: &str) -> Option<File> {
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK;
    rustix::fs::openat(store, name, flags, Mode::empty()).ok().map(File::from)
}

/// A stored manifest's header, and the line it was read from.
pub(super) fn header(reader: &mut impl BufRead) -> Option<(Header, Vec<u8>)> {
    let mut first = vec![];
    // A header is well under a kilobyte.
    reader.by_ref().take(4096).read_until(b'\n', &mut first).ok()?;
    let header: Header = serde_json::from_slice(first.strip_suffix(b"\n")?).ok()?;
    Some((header, first))
}

/// The drive a manifest on disk was made for, from its header, and its digest.
pub(super) fn drive_and_digest(store: &OwnedFd, name: &str) -> Option<(Uuid, Digest)> {
    let mut reader = BufReader::new(open(store, name)?);
    let (header, first) = header(&mut reader)?;
    let mut hasher = blake3::Hasher::new();
    hasher.update(&first);
    io::copy(&mut reader, &mut hasher).ok()?;
    Some((header.drive_id, Digest::of(&hasher)))
}
