//! Reading a manifest from another machine: hostile input until its digest matches and every
//! line is found valid.

use std::fmt;
use std::io::{self, BufRead, BufReader, Read, Seek};

use super::{
    CHUNK_BYTES, Digest, Entry, Header, Line, MAX_ENTRIES, MAX_FILE_BYTES, MAX_LINE_BYTES,
    MAX_MANIFEST_BYTES, MAX_PATH_BYTES, Manifest, VERSION, parse_hex, reserved,
};

/// Why a manifest was refused, and at which line (1 for the header) when one is to blame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    pub line: Option<u64>,
    pub why: String,
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(n) => write!(f, "manifest line {n}: {}", self.why),
            None => write!(f, "manifest: {}", self.why),
        }
    }
}

impl std::error::Error for Invalid {}

impl Manifest {
    /// The manifest in `file`, read from its start, once the BLAKE3 of its bytes is `digest`:
    /// a line is looked at only then. It reads the file twice, at most [`MAX_MANIFEST_BYTES`].
    pub fn read(file: &mut (impl Read + Seek), digest: &Digest) -> Result<Manifest, Invalid> {
        let whole = |why: String| Invalid { line: None, why };
        let failed = |e: io::Error| whole(format!("cannot read it: {e}"));
        file.rewind().map_err(failed)?;
        let mut hasher = blake3::Hasher::new();
        let len = io::copy(&mut file.by_ref().take(MAX_MANIFEST_BYTES + 1), &mut hasher).map_err(failed)?;
        if len > MAX_MANIFEST_BYTES {
            return Err(whole(format!("larger than {MAX_MANIFEST_BYTES} bytes")));
        }
        let found = Digest::of(&hasher);
        if found != *digest {
            return Err(whole(format!("its digest is {found}, not {digest}")));
        }
        file.rewind().map_err(failed)?;
        parse(BufReader::new(file.by_ref().take(len)))
    }
}

/// Reads and checks every line of a manifest, without a digest to check it against: the
/// agent's own, or a peer's once its digest matched.
pub(super) fn parse(mut reader: impl BufRead) -> Result<Manifest, Invalid> {
    let mut lines = Lines { buf: Vec::new(), number: 0 };
    let at = |n: u64| move |why: String| Invalid { line: Some(n), why };
    let Some((_, first)) = lines.next(&mut reader)? else {
        return Err(Invalid { line: None, why: "it is empty".into() });
    };
    let header: Header = serde_json::from_slice(first).map_err(|e| at(1)(format!("not a header: {e}")))?;
    check_header(&header).map_err(at(1))?;
    let (mut entries, mut tree) = (Vec::<Entry>::new(), Tree::default());
    let (mut files, mut bytes) = (0u64, 0u64);
    while let Some((number, text)) = lines.next(&mut reader)? {
        let bad = at(number);
        if entries.len() as u64 >= MAX_ENTRIES {
            return Err(bad(format!("more than {MAX_ENTRIES} entries")));
        }
        let line: Line = serde_json::from_slice(text).map_err(|e| bad(format!("not an entry: {e}")))?;
        let entry = entry(line).map_err(&bad)?;
        if let Some(before) = entries.last()
            && before.path >= entry.path
        {
            let why = format!(
                "{} comes after {}: paths are listed once, in byte-wise order",
                entry.path, before.path
            );
            return Err(bad(why));
        }
        tree.check(&entries, &entry.path).map_err(&bad)?;
        if !entry.is_dir() {
            files += 1;
            bytes = bytes.checked_add(entry.size).ok_or_else(|| bad("the sizes overflow".into()))?;
        }
        tree.push(entries.len(), entry.path.len());
        entries.push(entry);
    }
    if (files, bytes) != (header.files, header.bytes) {
        let why = format!(
            "the header counts {} files of {} bytes, the lines {files} files of {bytes} bytes",
            header.files, header.bytes
        );
        return Err(at(1)(why));
    }
    Ok(Manifest { drive_id: header.drive_id, files, bytes, entries })
}

fn check_header(h: &Header) -> Result<(), String> {
    if h.version != VERSION {
        return Err(format!("version {} is not {VERSION}", h.version));
    }
    if h.chunk_bytes != CHUNK_BYTES {
        return Err(format!("chunks of {} bytes, not {CHUNK_BYTES}", h.chunk_bytes));
    }
    Ok(())
}

/// An entry from its line, if its path is plain and its size and chunks agree.
fn entry(line: Line<'_>) -> Result<Entry, String> {
    let path = line.path;
    check_path(&path)?;
    let chunks = match (line.size, line.chunks, line.dir) {
        (None, None, Some(true)) => None,
        (Some(size), Some(chunks), None) => {
            if size > MAX_FILE_BYTES {
                return Err(format!("{path} is larger than {MAX_FILE_BYTES} bytes"));
            }
            if chunks.len() as u64 != size.div_ceil(CHUNK_BYTES) {
                return Err(format!("{path} has {} chunks for {size} bytes", chunks.len()));
            }
            let hashes = chunks.iter().map(|hex| parse_hex(hex)).collect::<Option<Box<[_]>>>();
            Some(hashes.ok_or_else(|| format!("{path} has a chunk that is not 64 lowercase hex digits"))?)
        }
        _ => return Err(format!("{path} is neither a file (size, chunks) nor an empty folder (dir: true)")),
    };
    Ok(Entry { path: path.into(), size: line.size.unwrap_or(0), chunks })
}

/// A path relative to the copy, of plain components, none of them the agent's own names.
fn check_path(path: &str) -> Result<(), String> {
    if path.len() > MAX_PATH_BYTES {
        return Err(format!("a path is longer than {MAX_PATH_BYTES} bytes"));
    }
    if path.contains('\0') {
        return Err(format!("{path:?} holds a NUL"));
    }
    if path.starts_with('/') {
        return Err(format!("{path} is not relative"));
    }
    for part in path.split('/') {
        if part.is_empty() || part == "." || part == ".." {
            return Err(format!("{path:?} has an empty, `.` or `..` component"));
        }
        if reserved(part) {
            return Err(format!("{path} uses {part}, a name kept for the agent's own files"));
        }
    }
    Ok(())
}

/// Lines read with a bound on each, numbered from 1.
struct Lines {
    buf: Vec<u8>,
    number: u64,
}

impl Lines {
    /// The next line's number, and the line without its newline; `None` at the end. Every
    /// line ends with a newline.
    fn next(&mut self, reader: &mut impl BufRead) -> Result<Option<(u64, &[u8])>, Invalid> {
        self.buf.clear();
        let bound = MAX_LINE_BYTES as u64 + 1;
        let read = reader.by_ref().take(bound).read_until(b'\n', &mut self.buf);
        self.number += 1;
        let bad = |why: String| Invalid { line: Some(self.number), why };
        if read.map_err(|e| bad(format!("cannot read it: {e}")))? == 0 {
            return Ok(None);
        }
        match self.buf.strip_suffix(b"\n") {
            Some(line) => Ok(Some((self.number, line))),
            None if self.buf.len() > MAX_LINE_BYTES => {
                Err(bad(format!("longer than {MAX_LINE_BYTES} bytes")))
            }
            None => Err(bad("it ends without a newline".into())),
        }
    }
}

/// Finds an entry listed beneath an earlier one: a file or empty folder holds nothing.
///
/// In byte-wise order, every path between an entry and a path it is a prefix of has it as a
/// prefix too. So the earlier entries that are prefixes of the next path form a chain, kept
/// here, popped as soon as the next path does not start with them; and an earlier entry is a
/// folder above the path exactly when one in the chain is as long as the path up to a `/`.
#[derive(Default)]
struct Tree {
    /// Indices of the chain's entries, each a prefix of the next.
    chain: Vec<usize>,
    /// Whether an entry in the chain is that many bytes long.
    at_len: Vec<bool>,
}

impl Tree {
    fn check(&mut self, entries: &[Entry], path: &str) -> Result<(), String> {
        while let Some(&top) = self.chain.last() {
            let prefix = &entries[top].path;
            if path.starts_with(&**prefix) {
                break;
            }
            self.at_len[prefix.len()] = false;
            self.chain.pop();
        }
        match path.match_indices('/').find(|(k, _)| self.at_len.get(*k) == Some(&true)) {
            Some((k, _)) => {
                Err(format!("{path} is listed beneath {}, listed as a file or empty folder", &path[..k]))
            }
            None => Ok(()),
        }
    }

    fn push(&mut self, index: usize, len: usize) {
        if self.at_len.len() <= len {
            self.at_len.resize(MAX_PATH_BYTES + 1, false);
        }
        self.at_len[len] = true;
        self.chain.push(index);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const DRIVE: &str = "0190c5f0-0000-7000-8000-000000000001";

    fn hex(data: &[u8]) -> String {
        blake3::hash(data).to_hex().to_string()
    }

    /// A header counting the file lines among `lines`, then `lines`, each with its newline.
    fn manifest(lines: &[serde_json::Value]) -> String {
        let files = lines.iter().filter(|l| l.get("size").is_some()).count();
        let bytes: u64 = lines.iter().filter_map(|l| l.get("size")?.as_u64()).sum();
        let header = json!({"version": 1, "drive_id": DRIVE, "chunk_bytes": CHUNK_BYTES, "files": files, "bytes": bytes});
        [header].iter().chain(lines).map(|l| format!("{l}\n")).collect()
    }

    fn file(path: &str, data: &[u8]) -> serde_json::Value {
        json!({"path": path, "size": data.len(), "chunks": [hex(data)]})
    }

    fn dir(path: &str) -> serde_json::Value {
        json!({"path": path, "dir": true})
    }

    fn parsed(text: &str) -> Result<Manifest, Invalid> {
        parse(text.as_bytes())
    }

    #[test]
    fn a_valid_manifest_parses_into_its_entries() {
        let text = manifest(&[
            file("a.txt", b"x"),
            file("a/b", b"yz"),
            dir("e"),
            json!({"path": "z", "size": 0, "chunks": []}),
        ]);
        let m = parsed(&text).unwrap();
        assert_eq!((m.drive_id().to_string().as_str(), m.files(), m.bytes()), (DRIVE, 3, 3));
        let paths: Vec<&str> = m.entries().iter().map(Entry::path).collect();
        assert_eq!(paths, ["a.txt", "a/b", "e", "z"]);
        assert!(m.entries()[2].is_dir() && m.entries()[3].chunk_count() == 0);
        assert_eq!(m.entries()[1].chunk(0), Some(blake3::hash(b"yz")));
    }

    #[test]
    fn hostile_manifests_are_refused_with_the_line_to_blame() {
        let ok = file("a", b"x");
        let long = "d/".repeat(MAX_PATH_BYTES / 2) + "f";
        let header = |h: serde_json::Value| format!("{h}\n{ok}\n");
        let good_header =
            json!({"version": 1, "drive_id": DRIVE, "chunk_bytes": CHUNK_BYTES, "files": 1, "bytes": 1});
        let with = |key: &str, value: serde_json::Value| {
            let mut h = good_header.clone();
            h[key] = value;
            header(h)
        };
        let big_chunks = vec![hex(b"x"); 2];
        let cases: Vec<(&str, String, Option<u64>, &str)> = vec![
            ("empty", String::new(), None, "empty"),
            ("version 2", with("version", json!(2)), Some(1), "version 2"),
            ("other chunk size", with("chunk_bytes", json!(1024)), Some(1), "chunks of 1024"),
            ("header totals", with("files", json!(2)), Some(1), "counts 2 files"),
            ("header bytes", with("bytes", json!(7)), Some(1), "of 7 bytes"),
            ("unknown header field", with("extra", json!(1)), Some(1), "unknown field"),
            (
                "no trailing newline",
                manifest(std::slice::from_ref(&ok)).trim_end().to_string(),
                Some(2),
                "newline",
            ),
            ("dot-dot", manifest(&[file("a/../b", b"x")]), Some(2), "`..`"),
            ("dot", manifest(&[file("./b", b"x")]), Some(2), "`..`"),
            ("absolute", manifest(&[file("/etc/passwd", b"x")]), Some(2), "not relative"),
            ("empty component", manifest(&[file("a//b", b"x")]), Some(2), "empty"),
            ("trailing slash", manifest(&[file("a/", b"x")]), Some(2), "empty"),
            ("empty path", manifest(&[file("", b"x")]), Some(2), "empty"),
            ("NUL", manifest(&[file("a\0b", b"x")]), Some(2), "NUL"),
            ("the marker", manifest(&[file(".astralyx-filled", b"")]), Some(2), "kept for the agent"),
            ("a marker below", manifest(&[file("d/.astralyx-x", b"")]), Some(2), "kept for the agent"),
            ("the drive id", manifest(&[file(".astraeus-drive", b"")]), Some(2), "kept for the agent"),
            ("too long a path", manifest(&[file(&long, b"x")]), Some(2), "longer than 4096"),
            ("duplicate", manifest(&[ok.clone(), ok.clone()]), Some(3), "listed once"),
            ("out of order", manifest(&[file("b", b"x"), ok.clone()]), Some(3), "byte-wise order"),
            ("beneath a file", manifest(&[ok.clone(), file("a/b", b"x")]), Some(3), "beneath a,"),
            ("beneath an empty folder", manifest(&[dir("a"), file("a/b", b"x")]), Some(3), "beneath a,"),
            (
                "beneath, further on",
                manifest(&[ok.clone(), dir("a!"), file("a/b", b"x")]),
                Some(4),
                "beneath a,",
            ),
            (
                "too few chunks",
                manifest(&[json!({"path": "a", "size": 9, "chunks": []})]),
                Some(2),
                "0 chunks for 9",
            ),
            (
                "too many chunks",
                manifest(&[json!({"path": "a", "size": 9, "chunks": big_chunks})]),
                Some(2),
                "2 chunks for 9",
            ),
            (
                "uppercase hex",
                manifest(&[json!({"path": "a", "size": 1, "chunks": [hex(b"x").to_uppercase()]})]),
                Some(2),
                "lowercase hex",
            ),
            (
                "short hex",
                manifest(&[json!({"path": "a", "size": 1, "chunks": [&hex(b"x")[1..]]})]),
                Some(2),
                "lowercase hex",
            ),
            (
                "huge file",
                manifest(&[json!({"path": "a", "size": MAX_FILE_BYTES + 1, "chunks": []})]),
                Some(2),
                "larger than",
            ),
            (
                "file and folder at once",
                manifest(&[json!({"path": "a", "size": 0, "chunks": [], "dir": true})]),
                Some(2),
                "neither",
            ),
            ("a folder that is not", manifest(&[json!({"path": "a", "dir": false})]), Some(2), "neither"),
            ("a size without chunks", manifest(&[json!({"path": "a", "size": 0})]), Some(2), "neither"),
            (
                "unknown entry field",
                manifest(&[json!({"path": "a", "dir": true, "mode": 4095})]),
                Some(2),
                "unknown field",
            ),
            (
                "duplicate key",
                format!("{good_header}\n{{\"path\":\"a\",\"path\":\"b\",\"dir\":true}}\n"),
                Some(2),
                "duplicate",
            ),
            ("blank line", format!("{good_header}\n\n{ok}\n"), Some(2), "not an entry"),
            ("a second header", format!("{good_header}\n{good_header}\n"), Some(2), "not an entry"),
            (
                "negative size",
                manifest(&[json!({"path": "a", "size": -1, "chunks": []})]),
                Some(2),
                "not an entry",
            ),
        ];
        for (name, text, line, why) in cases {
            let err = parsed(&text).expect_err(name);
            assert_eq!(err.line, line, "{name}: {err}");
            assert!(err.why.contains(why), "{name}: {err}");
        }
    }

    #[test]
    fn a_line_past_the_bound_is_refused_before_it_is_read_whole() {
        let mut text = manifest(&[]).into_bytes();
        text.extend(std::iter::repeat_n(b' ', MAX_LINE_BYTES + 10));
        let err = parse(&text[..]).unwrap_err();
        assert_eq!((err.line, err.why.contains("longer than")), (Some(2), true), "{err}");
    }

    #[test]
    fn a_manifest_is_read_only_when_its_digest_matches() {
        let text = manifest(&[file("a", b"x")]);
        let digest = Digest(blake3::hash(text.as_bytes()));
        let m = Manifest::read(&mut io::Cursor::new(text.as_bytes()), &digest).unwrap();
        assert_eq!(m.entries().len(), 1);
        let forged = text.replace("\"size\":1", "\"size\":1 ");
        let err = Manifest::read(&mut io::Cursor::new(forged.as_bytes()), &digest).unwrap_err();
        assert_eq!(err.line, None);
        assert!(err.why.contains(&format!("not {digest}")), "{err}");
    }
}
