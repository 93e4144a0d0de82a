//! Making a copy's manifest: a walk, hashing each file through one buffer.
//!
//! The header's totals are known only at the end, so the entries go to a scratch file first and
//! follow the header into the manifest after: a walk of millions of files never holds them in
//! memory.

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Seek, Write};
use std::os::fd::OwnedFd;
use std::path::Path;

use rustix::fs::CWD;
use uuid::Uuid;

use super::walk::{self, Found, Walk};
use super::{
    BUFFER_BYTES, CHUNK_BYTES, Digest, Header, Line, MAX_FILE_BYTES, MAX_LINE_BYTES, MAX_MANIFEST_BYTES,
    VERSION, hash_chunks,
};

/// What a build that `go_on` stopped returns.
pub const STOPPED: &str = "stopped before the manifest was made";

/// Writes the manifest of the copy in the folder `copy` (not followed if a link) to `out`, using
/// `scratch` (an empty file open for reading and writing) for its entries, and returns its
/// digest. Fails naming the first entry a manifest cannot list. `go_on` is asked between files
/// and chunks: once it says no, the build stops with [`STOPPED`].
pub fn build(
    copy: &Path,
    drive_id: Uuid,
    scratch: File,
    out: impl Write,
    go_on: &dyn Fn() -> bool,
) -> Result<Digest, String> {
    let root = walk::open_dir(CWD, copy).map_err(|e| format!("cannot open {}: {e}", copy.display()))?;
    build_at(root, drive_id, scratch, out, go_on)
}

/// [`build`] of the copy open at `root`.
pub(super) fn build_at(
    root: OwnedFd,
    drive_id: Uuid,
    mut scratch: File,
    out: impl Write,
    go_on: &dyn Fn() -> bool,
) -> Result<Digest, String> {
    let mut walk = Walk::new(root)?;
    let scratch_failed = |e: io::Error| format!("cannot write the manifest: {e}");
    let mut body = BufWriter::new(&mut scratch);
    let (mut files, mut bytes, mut written) = (0u64, 0u64, 0u64);
    let mut buf = vec![0u8; BUFFER_BYTES];
    let (mut line, mut last) = (Vec::new(), String::new());
    while let Some(found) = walk.next() {
        if !go_on() {
            return Err(STOPPED.into());
        }
        line.clear();
        let path = match found? {
            Found::Odd { path, odd } => return Err(odd.refusal(&path)),
            Found::EmptyDir(path) => {
                let entry = Line { path: path.as_str().into(), size: None, chunks: None, dir: Some(true) };
                serde_json::to_writer(&mut line, &entry).map_err(|e| e.to_string())?;
                path
            }
            Found::File { path, mut file, size } => {
                if size > MAX_FILE_BYTES {
                    return Err(format!("{path} is larger than a manifest lists ({MAX_FILE_BYTES} bytes)"));
                }
                let mut hexes = Vec::with_capacity(size.div_ceil(CHUNK_BYTES) as usize);
                hash_chunks(&mut file, size, &mut buf, |_, hash| {
                    hexes.push(hash.to_hex());
                    go_on()
                })
                .map_err(|e| format!("cannot read {path}: {e}"))?;
                if hexes.len() as u64 != size.div_ceil(CHUNK_BYTES) {
                    return Err(STOPPED.into());
                }
                let chunks = Some(hexes.iter().map(|h| h.as_str()).collect());
                let entry = Line { path: path.as_str().into(), size: Some(size), chunks, dir: None };
                serde_json::to_writer(&mut line, &entry).map_err(|e| e.to_string())?;
                files += 1;
                bytes = bytes.checked_add(size).ok_or("the copy holds more bytes than a manifest counts")?;
                path
            }
        };
        // The walk yields paths in order while the copy holds still: a copy that changed under
        // it would give a manifest no receiver accepts.
        if !last.is_empty() && path <= last {
            return Err(format!("the copy changed while its manifest was made (at {path})"));
        }
        written += line.len() as u64 + 1;
        if line.len() > MAX_LINE_BYTES || written > MAX_MANIFEST_BYTES {
            return Err(format!("the manifest would be larger than a receiver reads (at {path})"));
        }
        body.write_all(&line).and_then(|()| body.write_all(b"\n")).map_err(scratch_failed)?;
        last = path;
    }
    body.flush().map_err(scratch_failed)?;
    drop(body);
    scratch.rewind().map_err(scratch_failed)?;
    let header = Header { version: VERSION, drive_id, chunk_bytes: CHUNK_BYTES, files, bytes };
    let mut out = Hashing { inner: out, hasher: blake3::Hasher::new() };
    serde_json::to_writer(&mut out, &header).map_err(|e| e.to_string())?;
    out.write_all(b"\n").map_err(scratch_failed)?;
    io::copy(&mut BufReader::new(scratch), &mut out).map_err(scratch_failed)?;
    out.flush().map_err(scratch_failed)?;
    Ok(Digest::of(&out.hasher))
}

/// Hashes what passes through it.
struct Hashing<W> {
    inner: W,
    hasher: blake3::Hasher,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(data)?;
        self.hasher.update(&data[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}
