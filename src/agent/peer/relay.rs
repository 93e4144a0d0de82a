//! A copy being pulled from a peer passes its chunks on to the next machine as soon as they are
//! checked and written, rather than once it is whole: many machines that need a drive at once
//! then get it in about one copy's time, however deep the tree of sources, as a pipelined
//! broadcast does.
//!
//! A fill from a peer enters its folder here before it tells the server it started (the server
//! names a machine whose fill runs as a source for the next), and its pull marks what it has
//! checked and written, entry by entry in the manifest's order. The data port serves from the
//! folder being received what is marked and no more, waiting for the rest; an answer under way
//! ends with an error when the pull fails, and the next machine pulls again, resuming.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::watch;
use uuid::Uuid;

use crate::agent::manifest::{Digest, Manifest};

/// The copies this agent is receiving from peers, by folder.
#[derive(Default)]
pub struct Relays(Mutex<HashMap<String, Arc<Relay>>>);

impl Relays {
    /// Enters `folder`, to be pulled for `drive` with the manifest of `digest`, until the guard
    /// returned is dropped.
    pub fn enter(self: &Arc<Self>, folder: &str, drive: Uuid, digest: Digest) -> Entered {
        let (progress, _) = watch::channel(Progress::default());
        let relay =
            Arc::new(Relay { folder: folder.to_owned(), drive, digest, staged: OnceLock::new(), progress });
        self.0.lock().expect("not poisoned").insert(folder.to_owned(), relay.clone());
        Entered { relays: self.clone(), folder: folder.to_owned(), relay }
    }

    /// The copy being received in `folder`, if one is.
    pub fn get(&self, folder: &str) -> Option<Arc<Relay>> {
        self.0.lock().expect("not poisoned").get(folder).cloned()
    }
}

impl std::fmt::Debug for Relays {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.0.lock().expect("not poisoned").keys()).finish()
    }
}

/// A folder entered in [`Relays`]; leaving it ends what is served from it that is not whole.
pub struct Entered {
    relays: Arc<Relays>,
    folder: String,
    relay: Arc<Relay>,
}

impl std::ops::Deref for Entered {
    type Target = Relay;
    fn deref(&self) -> &Relay {
        &self.relay
    }
}

impl Drop for Entered {
    fn drop(&mut self) {
        self.relay.progress.send_if_modified(|p| {
            let open = p.end.is_none();
            if open {
                p.end = Some(End::Failed);
            }
            open
        });
        let mut map = self.relays.0.lock().expect("not poisoned");
        if map.get(&self.folder).is_some_and(|r| Arc::ptr_eq(r, &self.relay)) {
            map.remove(&self.folder);
        }
    }
}

/// A copy being received.
pub struct Relay {
    folder: String,
    pub drive: Uuid,
    pub digest: Digest,
    staged: OnceLock<Staged>,
    progress: watch::Sender<Progress>,
}

/// Where a copy is being received: known once its manifest is in and its folder made.
pub struct Staged {
    pub manifest: Arc<Manifest>,
    /// The folder the copy is written into; it stays this folder once moved into place.
    pub root: OwnedFd,
    /// The manifest as received, whole.
    pub manifest_file: Arc<File>,
}

/// How far a copy being received is: every entry before `entry` is whole, and the first
/// `bytes` of `entry` are checked and written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Progress {
    pub staged: bool,
    pub entry: usize,
    pub bytes: u64,
    pub end: Option<End>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    Whole,
    Failed,
}

impl Progress {
    /// The bytes of entry `index`, `size` long, that may be read.
    pub fn available(&self, index: usize, size: u64) -> u64 {
        if self.end == Some(End::Whole) || self.entry > index {
            size
        } else if self.entry == index {
            self.bytes.min(size)
        } else {
            0
        }
    }
}

/// Why what a relay serves stopped short.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("the copy being received here stopped before it was whole")]
pub struct Stopped;

impl Relay {
    pub fn folder(&self) -> &str {
        &self.folder
    }

    /// Records where the copy is received; the first pull's folder stays (a pull again takes
    /// up the same one).
    pub fn stage(&self, staged: Staged) {
        if self.staged.set(staged).is_ok() {
            self.progress.send_modify(|p| p.staged = true);
        }
    }

    /// Marks the first `bytes` of entry `entry` checked and written; what was marked stays.
    pub fn advance(&self, entry: usize, bytes: u64) {
        self.progress.send_if_modified(|p| {
            let further = (entry, bytes) > (p.entry, p.bytes);
            if further {
                (p.entry, p.bytes) = (entry, bytes);
            }
            further
        });
    }

    /// Marks the copy whole.
    pub fn whole(&self) {
        self.progress.send_modify(|p| p.end = Some(End::Whole));
    }

    /// Where the copy is received, if that is known yet.
    pub fn staged_now(&self) -> Option<&Staged> {
        self.staged.get()
    }

    /// Where the copy is received, once it is; `Stopped` if it ends first.
    pub async fn staged(&self) -> Result<&Staged, Stopped> {
        let mut rx = self.progress.subscribe();
        rx.wait_for(|p| p.staged || p.end.is_some()).await.map_err(|_| Stopped)?;
        self.staged.get().ok_or(Stopped)
    }

    /// A reader of entry `index`, `size` bytes long.
    pub fn follow(&self, index: usize, size: u64) -> Follow {
        Follow { progress: self.progress.subscribe(), index, size }
    }
}

/// A reader of one entry of a copy being received.
pub struct Follow {
    progress: watch::Receiver<Progress>,
    index: usize,
    size: u64,
}

impl Follow {
    /// Waits until bytes of the entry past `at` may be read (or it is done, if it is empty);
    /// how far they go.
    pub async fn ready(&mut self, at: u64) -> Result<u64, Stopped> {
        let (index, size) = (self.index, self.size);
        let passed = |p: &Progress| p.entry > index || p.end == Some(End::Whole);
        let p = self
            .progress
            .wait_for(|p| p.available(index, size) > at || passed(p) || p.end == Some(End::Failed))
            .await
            .map_err(|_| Stopped)?;
        let available = p.available(index, size);
        if available > at || passed(&p) { Ok(available) } else { Err(Stopped) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_available_of_an_entry_follows_the_progress() {
        let p = |entry, bytes, end| Progress { staged: true, entry, bytes, end };
        // (progress, entry asked, its size, available)
        let cases = [
            (p(0, 0, None), 0, 10, 0),
            (p(1, 4, None), 0, 10, 10),
            (p(1, 4, None), 1, 10, 4),
            (p(1, 40, None), 1, 10, 10),
            (p(1, 4, None), 2, 10, 0),
            (p(1, 4, Some(End::Whole)), 2, 10, 10),
            (p(1, 4, Some(End::Failed)), 1, 10, 4),
        ];
        for (progress, index, size, expected) in cases {
            assert_eq!(progress.available(index, size), expected, "{progress:?} entry {index}");
        }
    }

    #[tokio::test]
    async fn a_reader_waits_for_the_bytes_it_asks_and_is_stopped_when_the_pull_fails() {
        let relays = Arc::new(Relays::default());
        let entered = relays.enter("default.food101", Uuid::now_v7(), Digest(blake3::hash(b"m")));
        let relay = relays.get("default.food101").unwrap();
        let mut second = relay.follow(1, 100);
        let waiting = tokio::spawn(async move { second.ready(10).await });
        entered.advance(1, 8);
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "8 bytes are not past 10");
        entered.advance(0, 50);
        entered.advance(1, 30);
        assert_eq!(waiting.await.unwrap(), Ok(30));
        assert_eq!(relay.follow(1, 100).ready(0).await, Ok(30), "progress never goes back");
        assert_eq!(relay.follow(0, 0).ready(0).await, Ok(0), "an empty entry passed is ready");

        let mut second = relay.follow(1, 100);
        let waiting = tokio::spawn(async move { second.ready(30).await });
        drop(entered);
        assert_eq!(waiting.await.unwrap(), Err(Stopped));
        assert!(relays.get("default.food101").is_none(), "left once the pull ends");
        assert_eq!(relay.staged().await.err(), Some(Stopped));
    }

    #[tokio::test]
    async fn a_whole_copy_serves_every_entry_after_its_fill_ends() {
        let relays = Arc::new(Relays::default());
        let entered = relays.enter("default.food101", Uuid::now_v7(), Digest(blake3::hash(b"m")));
        let mut last = entered.follow(7, 100);
        entered.whole();
        drop(entered);
        assert_eq!(last.ready(99).await, Ok(100));
    }
}
