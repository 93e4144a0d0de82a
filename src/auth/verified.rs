//! Tokens whose signature was checked lately, with what they say.
//!
//! Checking an Ed25519 signature costs more than the rest of a heartbeat answered from memory,
//! and a token's bytes say the same thing until it expires, so each replica checks them once.
//! Revocation is not this cache's business: callers still ask [`super::recent`] or Postgres.

use std::collections::HashMap;
use std::sync::Mutex;

use sha2::{Digest, Sha256};

use super::TokenError;

/// Past this many entries the expired ones are dropped, then all if that is not enough.
const CAPACITY: usize = 100_000;

/// Claims that end.
pub trait Expiring: Clone {
    /// Seconds since the epoch.
    fn expires_at(&self) -> i64;
}

/// Verified tokens by the SHA-256 of their bytes.
pub struct Verified<C> {
    seen: Mutex<HashMap<[u8; 32], C>>,
}

impl<C> Default for Verified<C> {
    fn default() -> Self {
        Verified { seen: Mutex::new(HashMap::new()) }
    }
}

impl<C: Expiring> Verified<C> {
    /// The claims of `token`, from memory when it was verified before and has not expired
    /// (`now`, seconds since the epoch), else from `verify`, whose success is remembered.
    pub fn check(
        &self,
        token: &str,
        now: i64,
        verify: impl FnOnce(&str) -> Result<C, TokenError>,
    ) -> Result<C, TokenError> {
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let known =
            self.seen.lock().expect("not poisoned").get(&key).filter(|c| c.expires_at() > now).cloned();
        if let Some(claims) = known {
            return Ok(claims);
        }
        let claims = verify(token)?;
        let mut seen = self.seen.lock().expect("not poisoned");
        if seen.len() >= CAPACITY {
            seen.retain(|_, c| c.expires_at() > now);
            if seen.len() >= CAPACITY {
                seen.clear();
            }
        }
        seen.insert(key, claims.clone());
        Ok(claims)
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    #[derive(Debug, Clone, PartialEq)]
    struct Ends(i64);

    impl Expiring for Ends {
        fn expires_at(&self) -> i64 {
            self.0
        }
    }

    #[test]
    fn a_token_is_verified_once_until_it_expires() {
        let cache = Verified::default();
        let calls = Cell::new(0);
        let verify = |_: &str| {
            calls.set(calls.get() + 1);
            Ok(Ends(100))
        };
        assert_eq!(cache.check("a.b.c", 10, verify), Ok(Ends(100)));
        assert_eq!(cache.check("a.b.c", 50, verify), Ok(Ends(100)));
        assert_eq!(calls.get(), 1, "the second check came from memory");
        assert_eq!(cache.check("a.b.d", 50, verify), Ok(Ends(100)));
        assert_eq!(calls.get(), 2, "other bytes are verified apart");
        assert_eq!(cache.check("a.b.c", 100, verify), Ok(Ends(100)));
        assert_eq!(calls.get(), 3, "an expired entry is verified again");
    }

    #[test]
    fn a_failed_verification_is_not_remembered() {
        let cache: Verified<Ends> = Verified::default();
        let bad = |_: &str| Err(TokenError::Invalid("bad signature".into()));
        assert!(cache.check("x.y.z", 10, bad).is_err());
        assert_eq!(cache.check("x.y.z", 10, |_| Ok(Ends(20))), Ok(Ends(20)));
        assert!(cache.seen.lock().unwrap().len() == 1);
    }
}
