//! What a pull is asked to do, how it is bounded, what it did and how it failed: shared by the
//! pull and the transfer of each file it receives.

use std::time::Duration;

use uuid::Uuid;

use super::rate::Rate;
use super::tls::Trust;
use crate::agent::manifest::Digest;
use crate::domain::quantity::human_bytes;

/// A copy to pull: where from, with which leave, and what it must be.
#[derive(Debug, Clone)]
pub struct Order {
    /// The holder's data port, `http://host:port` or `https://host:port`.
    pub source: String,
    /// The transfer token the server minted for this pull.
    pub token: String,
    /// The copy's folder in `drives/`, `<namespace>.<drive>`.
    pub folder: String,
    /// The drive the copy is made for: the manifest must name it.
    pub drive_id: Uuid,
    /// The digest of the manifest, as the holder reported it to the server.
    pub digest: Digest,
}

/// Bounds on a pull.
#[derive(Debug, Clone)]
pub struct PullLimits {
    /// Bytes per second, shared by the pulls holding a clone.
    pub rate: Rate,
    /// Free space to leave at the data location once the copy is in.
    pub reserve_bytes: u64,
    /// How long the holder may send nothing before the pull gives up (to resume later).
    pub idle: Duration,
    /// Whom a holder at an `https://` address must prove itself to.
    pub trust: Trust,
}

impl Default for PullLimits {
    fn default() -> Self {
        PullLimits {
            rate: Rate::default(),
            reserve_bytes: 0,
            idle: Duration::from_secs(60),
            trust: Trust::default(),
        }
    }
}

/// What a pull did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PullReport {
    /// Bytes of files received from the holder.
    pub received: u64,
    /// Bytes of files found on disk from an earlier pull, checked and kept.
    pub kept: u64,
    /// Files in the copy.
    pub files: u64,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PullError {
    /// The holder said no (a bad or expired token, a copy that is gone or changed…).
    #[error("the peer refused ({status}): {message}")]
    Refused { status: u16, message: String },
    /// The holder is sending as many copies as it may.
    #[error("the peer is busy: retry in {} s", retry_after.as_secs())]
    Busy { retry_after: Duration },
    /// The connection failed or was cut: a pull again resumes where this one stopped.
    #[error("the transfer from the peer failed: {0}")]
    Transfer(String),
    /// The holder's certificate was refused, or TLS with it failed otherwise: its setup or
    /// this machine's, which pulling again would not change.
    #[error("cannot pull over TLS from the peer at {address}: {why}")]
    Tls { address: String, why: String },
    /// The manifest the holder sent is not the one the server named, or not valid.
    #[error("the peer's manifest of {folder} is not the one expected: {why}")]
    Manifest { folder: String, why: String },
    /// A file's bytes are not those the manifest lists.
    #[error("peer copy of {folder} differs from its manifest at {path}")]
    Differs { folder: String, path: String },
    #[error(
        "peer copy of {folder} needs {} at this machine's data location, {} free",
        human_bytes(*needed), human_bytes(*free)
    )]
    NoRoom { folder: String, needed: u64, free: u64 },
    /// This machine's disk failed, or its data location is not usable.
    #[error("cannot write the copy here: {0}")]
    Disk(String),
    /// The order itself cannot be carried out (a folder or address that is not one).
    #[error("the pull's order is not valid: {0}")]
    BadOrder(String),
    #[error("the pull was cancelled")]
    Cancelled,
}

impl PullError {
    /// Whether pulling again from the same holder may succeed (and resumes).
    pub fn retryable(&self) -> bool {
        matches!(self, PullError::Transfer(_) | PullError::Busy { .. })
    }
}

pub(super) fn disk_error(e: impl std::fmt::Display) -> PullError {
    PullError::Disk(e.to_string())
}

/// Runs blocking disk work off the async threads.
pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, PullError> {
    tokio::task::spawn_blocking(f).await.map_err(disk_error)
}
