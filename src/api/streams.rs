//! Caps on the streams held open (`watch=true`): per token and per replica, so that one token
//! cannot hold a replica's connections, tasks and wake-ups for itself.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use uuid::Uuid;

use super::error::ApiError;

/// Streams one token may hold open on one replica, by default.
pub const DEFAULT_PER_TOKEN: usize = 8;
/// Streams one replica holds open at most, by default.
pub const DEFAULT_PER_REPLICA: usize = 2000;

#[derive(Clone)]
pub struct Streams {
    open: Arc<Mutex<Open>>,
    per_token: usize,
    per_replica: usize,
}

#[derive(Default)]
struct Open {
    total: usize,
    by_token: HashMap<Uuid, usize>,
}

/// One stream's place, given back when dropped (when the stream ends or its client leaves).
pub struct Slot {
    open: Arc<Mutex<Open>>,
    token: Uuid,
}

impl Streams {
    /// At most `per_token` streams per token and `per_replica` in all; 0 leaves either uncapped.
    pub fn new(per_token: usize, per_replica: usize) -> Streams {
        Streams { open: Arc::default(), per_token, per_replica }
    }

    /// A place for one more stream of `token`, or a 429 saying which cap it met.
    pub fn open(&self, token: Uuid) -> Result<Slot, ApiError> {
        let mut open = self.open.lock().expect("not poisoned");
        if self.per_replica != 0 && open.total >= self.per_replica {
            return Err(ApiError::TooManyStreams(format!(
                "this server holds {} streams open, its limit: retry later",
                self.per_replica
            )));
        }
        let held = open.by_token.entry(token).or_default();
        if self.per_token != 0 && *held >= self.per_token {
            return Err(ApiError::TooManyStreams(format!(
                "this token holds {} streams open, its limit: close one first",
                self.per_token
            )));
        }
        *held += 1;
        open.total += 1;
        Ok(Slot { open: self.open.clone(), token })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.open.lock().expect("not poisoned");
        open.total -= 1;
        if let Some(held) = open.by_token.get_mut(&self.token) {
            *held -= 1;
            if *held == 0 {
                open.by_token.remove(&self.token);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_at_its_cap_waits_for_one_of_its_streams_and_others_are_served() {
        let streams = Streams::new(2, 3);
        let (a, b, c) = (Uuid::from_u128(1), Uuid::from_u128(2), Uuid::from_u128(3));
        let first = streams.open(a).unwrap();
        let _second = streams.open(a).unwrap();
        assert!(matches!(streams.open(a), Err(ApiError::TooManyStreams(m)) if m.contains("this token")));
        let _other = streams.open(b).unwrap();
        // 3 open: the replica is full, whoever asks.
        assert!(matches!(streams.open(c), Err(ApiError::TooManyStreams(m)) if m.contains("this server")));
        drop(first);
        let _again = streams.open(a).unwrap();
        assert_eq!(streams.open.lock().unwrap().by_token.len(), 2);
    }

    #[test]
    fn zero_leaves_a_cap_off_and_dropped_slots_leave_nothing_behind() {
        let streams = Streams::new(0, 0);
        let slots: Vec<Slot> = (0..100).map(|_| streams.open(Uuid::from_u128(1)).unwrap()).collect();
        drop(slots);
        let open = streams.open.lock().unwrap();
        assert_eq!((open.total, open.by_token.len()), (0, 0));
    }
}
