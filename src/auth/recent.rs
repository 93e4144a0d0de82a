//! Credentials found valid lately, so that a request need not ask Postgres each time.
//!
//! A revocation (a token revoked, a machine's credential replaced on rejoin) forgets its entry
//! on the replica that made it at once, and on the others when its notification arrives; every
//! entry is forgotten when the notification listener loses its connection, and an entry lapses
//! after [`TTL`] anyway, which bounds how long a lost notification matters.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use uuid::Uuid;

/// Longer than a machine's heartbeat interval, so that a machine beating every few seconds is
/// looked up about once in this time, not on every second beat.
pub const TTL: Duration = Duration::from_secs(30);
/// Past this many entries the expired ones are dropped, then all if that is not enough.
const CAPACITY: usize = 100_000;

/// Keys (a token's id, a machine's id) with the credential last found current for each.
#[derive(Default)]
pub struct Recent {
    seen: Mutex<HashMap<Uuid, (Uuid, Instant)>>,
}

impl Recent {
    /// Whether `credential` was found current for `key` less than [`TTL`] ago.
    pub fn is_fresh(&self, key: Uuid, credential: Uuid) -> bool {
        let seen = self.seen.lock().expect("not poisoned");
        seen.get(&key).is_some_and(|(c, at)| *c == credential && at.elapsed() < TTL)
    }

    pub fn remember(&self, key: Uuid, credential: Uuid) {
        let mut seen = self.seen.lock().expect("not poisoned");
        if seen.len() >= CAPACITY {
            seen.retain(|_, (_, at)| at.elapsed() < TTL);
            if seen.len() >= CAPACITY {
                seen.clear();
            }
        }
        seen.insert(key, (credential, Instant::now()));
    }

    pub fn forget(&self, key: Uuid) {
        self.seen.lock().expect("not poisoned").remove(&key);
    }

    /// After notifications may have been missed.
    pub fn forget_all(&self) {
        self.seen.lock().expect("not poisoned").clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_credential_is_fresh_until_forgotten_and_only_for_its_key() {
        let (key, credential, other) = (Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7());
        let recent = Recent::default();
        assert!(!recent.is_fresh(key, credential));
        recent.remember(key, credential);
        assert!(recent.is_fresh(key, credential));
        assert!(!recent.is_fresh(key, other), "a replaced credential is not fresh");
        assert!(!recent.is_fresh(other, credential));
        recent.forget(key);
        assert!(!recent.is_fresh(key, credential));
        recent.remember(key, credential);
        recent.remember(other, other);
        recent.forget_all();
        assert!(!recent.is_fresh(key, credential) && !recent.is_fresh(other, other));
    }
}
