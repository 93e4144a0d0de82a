//! Content digests: BLAKE3, written as 64 lowercase hex digits. A copy's manifest is named by
//! one; agents report it and the server keeps it and hands it on.

use std::fmt;

/// The BLAKE3 of a manifest's bytes, written as 64 lowercase hex digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Digest(pub(crate) blake3::Hash);

impl Digest {
    /// A digest as the server hands it on: exactly 64 lowercase hex digits.
    pub fn parse(hex: &str) -> Result<Digest, String> {
        parse_hex(hex).map(Digest).ok_or_else(|| format!("{hex:?} is not 64 lowercase hex digits"))
    }

    /// The digest of what `hasher` was fed.
    pub fn of(hasher: &blake3::Hasher) -> Digest {
        Digest(hasher.finalize())
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.to_hex())
    }
}

/// 64 lowercase hex digits as a hash; `blake3::Hash::from_hex` alone would take uppercase too,
/// and then two spellings of one manifest would have different digests.
pub fn parse_hex(hex: &str) -> Option<blake3::Hash> {
    let lower = hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    if lower { blake3::Hash::from_hex(hex).ok() } else { None }
}
