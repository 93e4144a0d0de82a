//! One file of a pull: what an earlier pull left of it kept where its chunks match, the rest
//! asked for with `Range` and checked chunk by chunk as it lands.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use reqwest::header::{CONTENT_RANGE, RANGE, RETRY_AFTER};
use rustix::fs::{FileType, Mode, OFlags};
use rustls::ClientConfig;
use tokio_util::sync::CancellationToken;

use super::beneath::{self, Dirs};
use super::order::{Order, PullError, PullLimits, blocking, disk_error};
use super::rate::Rate;
use super::relay::Relay;
use super::tls;
use crate::agent::manifest::{CHUNK_BYTES, Entry, Manifest};

/// Bytes gathered before they are written: fewer, larger writes off the async threads.
const WRITE_BYTES: usize = 1 << 20;
/// Bytes of a refusal's body read for its message.
const MESSAGE_BYTES: usize = 4096;
/// How long to wait for a busy holder that does not say.
const BUSY_SECONDS: u64 = 5;

/// Requests to one holder for one copy.
pub(super) struct Fetch {
    http: reqwest::Client,
    /// The holder's address, as the order gives it.
    address: String,
    base: reqwest::Url,
    token: String,
    folder: String,
    rate: Rate,
    cancel: CancellationToken,
}

impl Fetch {
    pub(super) fn new(
        order: &Order,
        limits: &PullLimits,
        cancel: &CancellationToken,
    ) -> Result<Fetch, PullError> {
        let bad = |why: String| PullError::BadOrder(format!("{}: {why}", order.source));
        let base = reqwest::Url::parse(&order.source).map_err(|e| bad(e.to_string()))?;
        if base.cannot_be_a_base() || !matches!(base.scheme(), "http" | "https") {
            return Err(bad("not an http(s) address".into()));
        }
        let mut http = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(10))
            .read_timeout(limits.idle);
        if base.scheme() == "https" {
            http = http.use_preconfigured_tls(ClientConfig::clone(&limits.trust.client_config()));
        }
        let http = http.build().map_err(|e| bad(e.to_string()))?;
        Ok(Fetch {
            http,
            address: order.source.clone(),
            base,
            token: order.token.clone(),
            folder: order.folder.clone(),
            rate: limits.rate.clone(),
            cancel: cancel.clone(),
        })
    }

    /// `GET /v1/copies/<folder>/<segments…>` (each segment escaped), from byte `start`; the
    /// answer once the holder said yes: 200, or 206 from `start`.
    pub(super) async fn get(&self, segments: &[&str], start: u64) -> Result<reqwest::Response, PullError> {
        let mut url = self.base.clone();
        url.path_segments_mut()
            .expect("checked to be a base")
            .pop_if_empty()
            .extend(["v1", "copies", &self.folder])
            .extend(segments);
        let mut request = self.http.get(url).bearer_auth(&self.token);
        if start > 0 {
            request = request.header(RANGE, format!("bytes={start}-"));
        }
        let response = tokio::select! {
            _ = self.cancel.cancelled() => return Err(PullError::Cancelled),
            r = request.send() => r.map_err(|e| self.failed(&e))?,
        };
        let status = response.status();
        let from = |r: &reqwest::Response| {
            r.headers()
                .get(CONTENT_RANGE)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("bytes "))
                .and_then(|v| v.split_once('-'))
                .and_then(|(n, _)| n.parse::<u64>().ok())
        };
        match status.as_u16() {
            200 if start == 0 => Ok(response),
            206 if start > 0 && from(&response) == Some(start) => Ok(response),
            200 | 206 => {
                Err(PullError::Transfer(format!("the peer answered {status} to a request from byte {start}")))
            }
            _ => Err(refusal(response).await),
        }
    }

    /// A request that got no answer: a TLS failure, or a transfer to try again.
    fn failed(&self, e: &reqwest::Error) -> PullError {
        match tls::failure(e) {
            Some(why) => PullError::Tls { address: self.address.clone(), why },
            None => PullError::Transfer(chain(e)),
        }
    }
}

/// What a holder's "no" says.
async fn refusal(mut response: reqwest::Response) -> PullError {
    let status = response.status().as_u16();
    if status == 503 {
        let seconds = response.headers().get(RETRY_AFTER).and_then(|v| v.to_str().ok()?.parse().ok());
        let retry_after = std::time::Duration::from_secs(seconds.unwrap_or(BUSY_SECONDS).min(3600));
        return PullError::Busy { retry_after };
    }
    let mut body = Vec::new();
    while body.len() < MESSAGE_BYTES {
        match response.chunk().await {
            Ok(Some(piece)) => body.extend_from_slice(&piece),
            _ => break,
        }
    }
    body.truncate(MESSAGE_BYTES);
    let json: Option<serde_json::Value> = serde_json::from_slice(&body).ok();
    let message = match json.as_ref().and_then(|j| j["error"]["message"].as_str()) {
        Some(m) => m.to_owned(),
        None => String::from_utf8_lossy(&body).into_owned(),
    };
    PullError::Refused { status, message }
}

/// An error with its causes, as reqwest's own Display names only the first.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text = format!("{text}: {cause}");
        source = cause.source();
    }
    text
}

/// Receives entry `index` of `manifest` beneath the folder `dirs` walks: the bytes kept from
/// an earlier pull, and those received. What is checked and written is marked in `relay`.
pub(super) async fn entry(
    fetch: &Fetch,
    dirs: &Arc<Mutex<Dirs>>,
    manifest: &Arc<Manifest>,
    index: usize,
    relay: Option<&Relay>,
) -> Result<(u64, u64), PullError> {
    let (d, m) = (dirs.clone(), manifest.clone());
    let opened =
        blocking(move || open_entry(&mut d.lock().expect("not poisoned"), &m.entries()[index])).await??;
    let Some((file, kept)) = opened else { return Ok((0, 0)) };
    if let Some(relay) = relay {
        relay.advance(index, kept);
    }
    let entry = &manifest.entries()[index];
    if kept == entry.size() {
        return Ok((kept, 0));
    }
    let differs = || PullError::Differs { folder: fetch.folder.clone(), path: entry.path().to_owned() };
    let segments: Vec<&str> = std::iter::once("files").chain(entry.path().split('/')).collect();
    let response = fetch.get(&segments, kept).await?;
    if response.content_length().is_some_and(|n| n != entry.size() - kept) {
        return Err(differs());
    }
    let mut chunks = Chunks::new(entry, kept);
    let landed = |at, piece: &[u8]| {
        chunks.land(at, piece).ok_or_else(differs)?;
        Ok(chunks.verified())
    };
    let written = |passable: u64| {
        if let Some(relay) = relay {
            relay.advance(index, passable);
        }
    };
    let file = Arc::new(file);
    let received = download(fetch, response, &file, kept, landed, written).await?;
    if kept + received != entry.size() {
        let why =
            format!("the answer for {} ended at byte {} of {}", entry.path(), kept + received, entry.size());
        return Err(PullError::Transfer(why));
    }
    Ok((kept, received))
}

/// Makes the folder `entry` is, or opens (makes) the file it is with its whole chunks that
/// match kept and the rest cut off; with the bytes kept. Whatever else stands at its path is
/// removed.
fn open_entry(dirs: &mut Dirs, entry: &Entry) -> Result<Option<(File, u64)>, PullError> {
    let (parent, name) =
        dirs.parent(entry.path(), true).map_err(|e| disk_error(format!("{}: {e}", entry.path())))?;
    if entry.is_dir() {
        beneath::make_dir(parent, name).map_err(|e| disk_error(format!("{}: {e}", entry.path())))?;
        return Ok(None);
    }
    let file = open_writable(parent, name).map_err(|e| disk_error(format!("{}: {e}", entry.path())))?;
    let kept = kept_chunks(&file, entry).map_err(|e| disk_error(format!("{}: {e}", entry.path())))?;
    if file.metadata().map_err(disk_error)?.len() != kept {
        file.set_len(kept).map_err(disk_error)?;
    }
    Ok(Some((file, kept)))
}

/// The regular file `name` beneath `parent`, made when missing; a link, folder or anything
/// else in its place is removed first.
fn open_writable(parent: &rustix::fd::OwnedFd, name: &str) -> std::io::Result<File> {
    let flags = OFlags::RDWR
        | OFlags::CREATE
        | OFlags::NOFOLLOW
        | OFlags::CLOEXEC
        | OFlags::NONBLOCK
        | OFlags::NOCTTY;
    for _ in 0..2 {
        match rustix::fs::openat(parent, name, flags, Mode::from_raw_mode(0o644)) {
            Ok(fd) if FileType::from_raw_mode(rustix::fs::fstat(&fd)?.st_mode) == FileType::RegularFile => {
                return Ok(File::from(fd));
            }
            _ => beneath::remove(parent, name)?,
        }
    }
    Err(std::io::Error::other("something keeps taking the file's place"))
}

/// The bytes at the start of `file` that are whole chunks of `entry`, each read and matched.
fn kept_chunks(file: &File, entry: &Entry) -> std::io::Result<u64> {
    let on_disk = file.metadata()?.len().min(entry.size());
    if on_disk < CHUNK_BYTES.min(entry.size()) || entry.size() == 0 {
        return Ok(0);
    }
    let mut buf = vec![0u8; CHUNK_BYTES.min(entry.size()) as usize];
    let mut kept = 0;
    for i in 0..entry.chunk_count() {
        let span = entry.chunk_span(i).expect("within the count");
        if span.end > on_disk {
            break;
        }
        let data = &mut buf[..(span.end - span.start) as usize];
        file.read_exact_at(data, span.start)?;
        if !entry.chunk_matches(i, data) {
            break;
        }
        kept = span.end;
    }
    Ok(kept)
}

/// A file's chunks checked as its bytes land, from a chunk's start.
struct Chunks<'e> {
    entry: &'e Entry,
    index: usize,
    /// The file's bytes landed so far.
    at: u64,
    hasher: blake3::Hasher,
}

impl<'e> Chunks<'e> {
    fn new(entry: &'e Entry, from: u64) -> Chunks<'e> {
        Chunks { entry, index: (from / CHUNK_BYTES) as usize, at: from, hasher: blake3::Hasher::new() }
    }

    /// The bytes from the file's start that are whole chunks checked.
    fn verified(&self) -> u64 {
        self.entry.chunk_span(self.index).map_or(self.entry.size(), |span| span.start)
    }

    /// Takes `piece`, the bytes at `at`: `None` when they go past the file's end, or complete
    /// a chunk whose hash is not the listed one.
    fn land(&mut self, at: u64, mut piece: &[u8]) -> Option<()> {
        if at != self.at || at + piece.len() as u64 > self.entry.size() {
            return None;
        }
        while !piece.is_empty() {
            let span = self.entry.chunk_span(self.index)?;
            let take = (span.end - self.at).min(piece.len() as u64) as usize;
            self.hasher.update(&piece[..take]);
            self.at += take as u64;
            piece = &piece[take..];
            if self.at == span.end {
                if Some(self.hasher.finalize()) != self.entry.chunk(self.index) {
                    return None;
                }
                self.hasher.reset();
                self.index += 1;
            }
        }
        Some(())
    }
}

/// Writes the body of `response` into `file` from byte `start`, each piece shown to `landed`
/// (with its offset) before it is written; the bytes received. `landed` says how far from the
/// file's start its bytes are checked, and after each write `passable` is told how far they
/// are both checked and written. What arrived is written even when the body is cut, so a pull
/// again keeps its whole chunks.
pub(super) async fn download(
    fetch: &Fetch,
    response: reqwest::Response,
    file: &Arc<File>,
    start: u64,
    mut landed: impl FnMut(u64, &[u8]) -> Result<u64, PullError>,
    mut passable: impl FnMut(u64),
) -> Result<u64, PullError> {
    let mut body = response.bytes_stream();
    let (mut at, mut written, mut checked) = (start, start, start);
    let mut buf: Vec<u8> = Vec::with_capacity(WRITE_BYTES);
    let result = loop {
        let next = tokio::select! {
            _ = fetch.cancel.cancelled() => break Err(PullError::Cancelled),
            next = body.next() => next,
        };
        let piece = match next {
            None => break Ok(()),
            Some(Err(e)) => break Err(PullError::Transfer(chain(&e))),
            Some(Ok(piece)) => piece,
        };
        match landed(at, &piece) {
            Ok(through) => checked = through,
            Err(e) => break Err(e),
        }
        at += piece.len() as u64;
        buf.extend_from_slice(&piece);
        if buf.len() >= WRITE_BYTES {
            buf = write(file, buf, &mut written).await?;
            passable(written.min(checked));
        }
        tokio::select! {
            _ = fetch.cancel.cancelled() => break Err(PullError::Cancelled),
            _ = fetch.rate.take(piece.len() as u64) => {}
        }
    };
    write(file, buf, &mut written).await?;
    passable(written.min(checked));
    result.map(|()| at - start)
}

/// Writes `buf` at `*at` off the async threads; the buffer back, emptied.
async fn write(file: &Arc<File>, mut buf: Vec<u8>, at: &mut u64) -> Result<Vec<u8>, PullError> {
    if buf.is_empty() {
        return Ok(buf);
    }
    let (f, offset) = (file.clone(), *at);
    let (buf_back, written) = blocking(move || {
        let r = f.write_all_at(&buf, offset);
        (buf, r)
    })
    .await?;
    written.map_err(disk_error)?;
    *at += buf_back.len() as u64;
    buf = buf_back;
    buf.clear();
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry_of(data: &[u8]) -> Entry {
        crate::agent::manifest::tests::entry("f", data)
    }

    #[test]
    fn chunks_land_in_order_and_a_bad_byte_or_an_overrun_is_caught() {
        let data: Vec<u8> = (0..CHUNK_BYTES + 10).map(|i| (i % 253) as u8).collect();
        let e = entry_of(&data);
        let mut c = Chunks::new(&e, 0);
        // Pieces that straddle the chunk boundary.
        let cut = CHUNK_BYTES as usize - 3;
        assert!(c.land(0, &data[..cut]).is_some());
        assert!(c.land(cut as u64, &data[cut..]).is_some());
        assert_eq!(c.index, 2);

        let mut bad = data.clone();
        bad[5] ^= 1;
        assert!(Chunks::new(&e, 0).land(0, &bad).is_none());
        // From the second chunk, as a resumed pull starts.
        let mut c = Chunks::new(&e, CHUNK_BYTES);
        assert!(c.land(CHUNK_BYTES, &data[CHUNK_BYTES as usize..]).is_some());
        let mut c = Chunks::new(&e, CHUNK_BYTES);
        assert!(
            c.land(CHUNK_BYTES, &[&data[CHUNK_BYTES as usize..], b"!"].concat()).is_none(),
            "past the end"
        );
        assert!(Chunks::new(&e, 0).land(1, &data[1..2]).is_none(), "not where the last piece ended");
    }

    #[test]
    fn whole_matching_chunks_on_disk_are_kept_and_the_rest_is_not() {
        let data: Vec<u8> = (0..2 * CHUNK_BYTES + 10).map(|i| (i % 251) as u8).collect();
        let e = entry_of(&data);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let kept = |bytes: &[u8]| {
            std::fs::write(&path, bytes).unwrap();
            kept_chunks(&File::open(&path).unwrap(), &e).unwrap()
        };
        let c = CHUNK_BYTES as usize;
        // (what is on disk, bytes kept)
        assert_eq!(kept(&data[..c - 1]), 0);
        assert_eq!(kept(&data[..c + 5]), CHUNK_BYTES, "the second chunk is not whole");
        assert_eq!(kept(&data), data.len() as u64);
        assert_eq!(kept(&[&data[..], b"more"].concat()), data.len() as u64, "what is past the end is cut");
        let mut bad = data.clone();
        bad[c + 1] ^= 1;
        assert_eq!(kept(&bad), CHUNK_BYTES, "up to the first chunk that differs");
    }
}
