//! Peer fills: a machine that needs a copy pulls it from another machine's agent that holds a
//! complete one, rather than from the origin.
//!
//! The server grants each pull with a transfer token (`auth::transfer`) naming the holder, the
//! copy's folder and drive, and its manifest's digest. The holder serves its complete copies
//! on a data port of its own ([`serve`]), checking tokens with the server's public keys
//! ([`keys`]); the receiver ([`pull`]) checks what it is sent against the manifest, chunk by
//! chunk, resumes where a cut transfer stopped, and moves the copy into place with its marker
//! last. A copy being received serves what it has checked on to the next machine ([`relay`]).
//! Both sides bound their byte rate ([`rate`]). The data port may serve HTTPS, and a pull
//! from it then verifies the holder's certificate ([`tls`]). A fill the server gives a peer runs
//! no container: it pulls ([`fill`]).

mod beneath;
pub mod fill;
mod handshake;
pub mod keys;
pub mod order;
pub mod pull;
pub mod rate;
mod receive;
pub mod relay;
pub mod serve;
#[cfg(test)]
mod tests;
pub mod tls;

pub use keys::TrustedKeys;
pub use pull::{Order, PullError, PullLimits, PullReport, pull};
pub use rate::Rate;
pub use relay::Relays;
pub use serve::{Holder, ServeLimits};
pub use tls::Trust;

/// What a copy being received is named in `drives/` until it is whole: `.receiving-<folder>`.
/// Its name starts with a dot, so it is not listed (or reported) as a copy.
pub const STAGING: &str = ".receiving-";
/// What the manifest of a copy being received is named in `drives/` until it is adopted:
/// `.received-manifest-<folder>`. Neither prefix starts the other, so no folder's name can
/// make one name the other's.
pub const RECEIVED_MANIFEST: &str = ".received-manifest-";
