//! A worker's output, read line by line from its container's log file.
//!
//! conmon writes both streams to one file (podman's `k8s-file` driver), a line each:
//! `<time> stdout|stderr F|P <text>`, `P` for a piece of a longer line. Reading that file keeps
//! stdout and stderr in the order the worker wrote them, which two pipes cannot.

use std::io::SeekFrom;
use std::path::Path;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// How often the file is looked at again when it has nothing new.
const POLL: Duration = Duration::from_millis(100);

/// Longer lines are split so one runaway line cannot grow the agent's memory without bound.
pub const MAX_LINE: usize = 16 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// One line of output without its newline; invalid UTF-8 is replaced, lines over `MAX_LINE`
/// bytes arrive in pieces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    pub stream: Stream,
    pub line: String,
}

/// Follows the log file at `path` into `logs` until `ended` is cancelled and the file is read to
/// its end. A restarted agent starts `from_end`: what came before went with its last life.
pub async fn follow_file(path: &Path, from_end: bool, logs: mpsc::Sender<LogLine>, ended: CancellationToken) {
    let mut file = loop {
        match tokio::fs::File::open(path).await {
            Ok(f) => break f,
            Err(_) if ended.is_cancelled() => return,
            Err(_) => tokio::time::sleep(POLL).await,
        }
    };
    let mut pos = if from_end { file.seek(SeekFrom::End(0)).await.unwrap_or(0) } else { 0 };
    let mut pending: Vec<u8> = Vec::new();
    let mut line = Parsed::default();
    let mut sink = Some(logs);
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        // conmon truncates the file when it passes its size limit: start again from the top.
        if file.metadata().await.is_ok_and(|m| m.len() < pos) {
            pos = file.seek(SeekFrom::Start(0)).await.unwrap_or(0);
            pending.clear();
        }
        let read = file.read(&mut buf).await.unwrap_or(0);
        if read == 0 {
            if ended.is_cancelled() {
                // One last look: the end may have been written just before.
                if file.read(&mut buf).await.unwrap_or(0) == 0 {
                    break;
                }
                continue;
            }
            tokio::time::sleep(POLL).await;
            continue;
        }
        pos += read as u64;
        pending.extend_from_slice(&buf[..read]);
        while let Some(end) = pending.iter().position(|&b| b == b'\n') {
            let record: Vec<u8> = pending.drain(..=end).collect();
            if let Some((stream, full, text)) = parse_record(&record[..record.len() - 1]) {
                for piece in line.push(stream, full, text) {
                    emit(&mut sink, piece.stream, &mut piece.line.into_bytes()).await;
                }
            }
        }
    }
    if line.stream.is_some() {
        let last = line.take();
        emit(&mut sink, last.stream, &mut last.line.into_bytes()).await;
    }
}

/// A line being put together from `P` pieces, split at `MAX_LINE`.
#[derive(Default)]
struct Parsed {
    stream: Option<Stream>,
    text: Vec<u8>,
}

impl Parsed {
    /// Adds a piece; the lines it completes.
    fn push(&mut self, stream: Stream, full: bool, text: &[u8]) -> Vec<LogLine> {
        let mut out = Vec::new();
        if self.stream.is_some_and(|s| s != stream) {
            // A piece of the other stream: the unfinished line ends here.
            out.push(self.take());
        }
        self.stream = Some(stream);
        for chunk in text.chunks(MAX_LINE) {
            let room = MAX_LINE - self.text.len();
            let (now, rest) = chunk.split_at(chunk.len().min(room));
            self.text.extend_from_slice(now);
            if self.text.len() == MAX_LINE {
                out.push(self.take());
                self.stream = Some(stream);
                self.text.extend_from_slice(rest);
            }
        }
        if full {
            out.push(self.take());
        }
        out
    }

    fn take(&mut self) -> LogLine {
        let stream = self.stream.take().unwrap_or(Stream::Stdout);
        let text = std::mem::take(&mut self.text);
        LogLine { stream, line: String::from_utf8_lossy(&text).into_owned() }
    }
}

/// `<time> <stream> <F|P> <text>` → the stream, whether the line ends here, and its text.
fn parse_record(record: &[u8]) -> Option<(Stream, bool, &[u8])> {
    let mut parts = record.splitn(4, |&b| b == b' ');
    let _time = parts.next()?;
    let stream = match parts.next()? {
        b"stdout" => Stream::Stdout,
        b"stderr" => Stream::Stderr,
        _ => return None,
    };
    let full = parts.next()? != b"P";
    Some((stream, full, parts.next().unwrap_or_default()))
}

async fn emit(sink: &mut Option<mpsc::Sender<LogLine>>, stream: Stream, line: &mut Vec<u8>) {
    let text = String::from_utf8_lossy(line).into_owned();
    line.clear();
    if let Some(logs) = sink
        && logs.send(LogLine { stream, line: text }).await.is_err()
    {
        *sink = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_keep_their_stream_and_pieces_make_one_line() {
        let mut line = Parsed::default();
        let mut got = Vec::new();
        for record in [
            &b"2026-12-07T03:00:00.1+00:00 stdout F hello"[..],
            b"2026-12-07T03:00:00.2+00:00 stderr P touch: /data/x: ",
            b"2026-12-07T03:00:00.3+00:00 stderr F Read-only file system",
            b"2026-12-07T03:00:00.4+00:00 stdout F ",
            b"garbage",
        ] {
            if let Some((stream, full, text)) = parse_record(record) {
                got.extend(line.push(stream, full, text));
            }
        }
        let expected = [
            (Stream::Stdout, "hello"),
            (Stream::Stderr, "touch: /data/x: Read-only file system"),
            (Stream::Stdout, ""),
        ];
        let got: Vec<(Stream, &str)> = got.iter().map(|l| (l.stream, l.line.as_str())).collect();
        assert_eq!(got, expected);
    }

    #[test]
    fn a_line_longer_than_the_limit_arrives_in_pieces() {
        let mut line = Parsed::default();
        let long = vec![b'x'; MAX_LINE * 2 + 5];
        let got = line.push(Stream::Stdout, true, &long);
        assert_eq!(got.iter().map(|l| l.line.len()).collect::<Vec<_>>(), [MAX_LINE, MAX_LINE, 5]);
    }

    #[tokio::test]
    async fn a_followed_file_is_read_to_its_end_once_the_container_ended() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ctr.log");
        std::fs::write(&path, "t stdout F one\nt stderr F two\nt stdout P thr").unwrap();
        let (tx, mut rx) = mpsc::channel(16);
        let ended = CancellationToken::new();
        let follower = tokio::spawn({
            let (path, ended) = (path.clone(), ended.clone());
            async move { follow_file(&path, false, tx, ended).await }
        });
        tokio::time::sleep(Duration::from_millis(250)).await;
        use std::io::Write;
        std::fs::OpenOptions::new().append(true).open(&path).unwrap().write_all(b"ee\n").unwrap();
        ended.cancel();
        follower.await.unwrap();
        let mut lines = Vec::new();
        while let Ok(l) = rx.try_recv() {
            lines.push((l.stream, l.line));
        }
        assert_eq!(
            lines,
            [
                (Stream::Stdout, "one".into()),
                (Stream::Stderr, "two".into()),
                (Stream::Stdout, "three".into())
            ]
        );
    }

    #[test]
    fn invalid_utf8_is_replaced() {
        let got = Parsed::default().push(Stream::Stdout, true, b"caf\xe9");
        assert_eq!(got[0].line, "caf\u{fffd}");
    }
}
