//! A byte rate, shared by the transfers that draw on it: a token bucket that lets them run
//! ahead by a short burst, then paces them.
//!
//! Not `governor`: it counts cells in `u32` and spaces them by whole nanoseconds, so with a
//! byte per cell it cannot express rates above 1 GB/s, which a peer on a fast network
//! exceeds. This bucket counts in byte-nanoseconds, exactly.

use std::num::NonZeroU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const NANOS: i128 = 1_000_000_000;
/// The least burst: a few of the pieces a transfer moves at once.
const MIN_BURST: u64 = 1 << 20;

/// Bytes per second for every transfer that holds a clone: the agent's own bound (its flag) and
/// the one the server sets for the machine, whichever is lower; no bound when neither is set.
#[derive(Debug, Clone, Default)]
pub struct Rate(Arc<Mutex<Bounds>>);

#[derive(Debug, Default)]
struct Bounds {
    own: Option<NonZeroU64>,
    set: Option<NonZeroU64>,
    /// Of the lower of the two; none when neither is set.
    bucket: Option<Bucket>,
}

impl Bounds {
    fn limit(&self) -> Option<NonZeroU64> {
        self.own.into_iter().chain(self.set).min()
    }
}

impl Rate {
    /// A rate of `bytes_per_second`, letting a tenth of a second's bytes (at least 1 MiB)
    /// through at once.
    pub fn new(bytes_per_second: NonZeroU64) -> Rate {
        Rate::bounded(Some(bytes_per_second))
    }

    /// A rate bounded by `own`, if given; [`Rate::set`] may bound it further.
    pub fn bounded(own: Option<NonZeroU64>) -> Rate {
        Rate(Arc::new(Mutex::new(Bounds { own, set: None, bucket: own.map(bucket) })))
    }

    /// Bounds the rate by `set` too (the server's limit for this machine), or no longer.
    pub fn set(&self, set: Option<NonZeroU64>) {
        let mut b = self.0.lock().expect("not poisoned");
        if b.set == set {
            return;
        }
        let before = b.limit();
        b.set = set;
        if b.limit() != before {
            b.bucket = b.limit().map(bucket);
        }
    }

    /// The bytes a second it allows now; `None` for no bound.
    pub fn limit(&self) -> Option<NonZeroU64> {
        self.0.lock().expect("not poisoned").limit()
    }

    /// Takes `bytes` and waits until the rate allows them.
    pub async fn take(&self, bytes: u64) {
        let wait = match &mut self.0.lock().expect("not poisoned").bucket {
            Some(bucket) => bucket.take(bytes, now()),
            None => return,
        };
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

/// A full bucket of `rate`, with a tenth of a second's bytes (at least 1 MiB) of burst.
fn bucket(rate: NonZeroU64) -> Bucket {
    let rate = rate.get();
    Bucket::new(rate, (rate / 10).max(MIN_BURST), now())
}

/// Tokio's clock, the one its sleeps follow.
fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// A bucket that goes into debt: a taker reserves its bytes at once and waits out the debt,
/// so bytes larger than the burst still go, and concurrent takers queue in the order they came.
#[derive(Debug)]
struct Bucket {
    rate: u64,
    /// The most the bucket holds, in byte-nanoseconds.
    full: i128,
    /// What it holds (negative in debt), in byte-nanoseconds, as of `at`.
    level: i128,
    at: Instant,
}

impl Bucket {
    /// A full bucket.
    fn new(rate: u64, burst: u64, now: Instant) -> Bucket {
        let full = i128::from(burst) * NANOS;
        Bucket { rate, full, level: full, at: now }
    }

    /// Takes `bytes` at `now`; how long the taker waits before they go.
    fn take(&mut self, bytes: u64, now: Instant) -> Duration {
        let elapsed = now.saturating_duration_since(self.at).as_nanos() as i128;
        self.at = self.at.max(now);
        self.level =
            (self.level + elapsed * i128::from(self.rate)).min(self.full) - i128::from(bytes) * NANOS;
        if self.level >= 0 {
            return Duration::ZERO;
        }
        // Debt over rate, rounded up (i128 has no stable `div_ceil`); both are positive.
        let (debt, rate) = (-self.level, i128::from(self.rate));
        let nanos = (debt + rate - 1) / rate;
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_lets_its_burst_through_then_paces_at_its_rate() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        // 1,000 bytes/s with a burst of 100.
        let mut b = Bucket::new(1000, 100, t0);
        let steps = [
            // (at ms, bytes, wait ms)
            (0, 100, 0),       // the burst: 100 - 100 = 0
            (0, 50, 50),       // 50 bytes of debt at 1 byte/ms
            (50, 50, 50),      // 50 ms paid the debt: 0 - 50
            (200, 0, 0),       // 150 ms more: -50 + 150 = 100, the burst and no more
            (200, 2000, 1900), // 100 - 2000: more than the burst still goes, after its wait
        ];
        for (at, bytes, wait) in steps {
            assert_eq!(b.take(bytes, ms(at)), Duration::from_millis(wait), "at {at} ms, {bytes} bytes");
        }
    }

    #[test]
    fn a_rate_above_a_gigabyte_a_second_is_exact() {
        let t0 = Instant::now();
        // 10 GB/s, burst 1 GB: 11 GB taken at once owe 10 GB, 1 s.
        let mut b = Bucket::new(10_000_000_000, 1_000_000_000, t0);
        assert_eq!(b.take(11_000_000_000, t0), Duration::from_secs(1));
        // 1 ns later a byte more: 10 bytes came back, 9,999,999,991 owed = 999,999,999.1 ns,
        // rounded up.
        assert_eq!(b.take(1, t0 + Duration::from_nanos(1)), Duration::from_secs(1));
        // 2 ns instead: 20 bytes back, 9,999,999,980 owed = 999,999,998 ns exactly.
        let mut b = Bucket::new(10_000_000_000, 1_000_000_000, t0);
        b.take(11_000_000_000, t0);
        assert_eq!(b.take(0, t0 + Duration::from_nanos(2)), Duration::from_nanos(999_999_998));
    }

    #[test]
    fn the_lower_of_the_agents_own_bound_and_the_servers_holds() {
        let n = |v| NonZeroU64::new(v);
        let rate = Rate::bounded(n(100));
        assert_eq!(rate.limit(), n(100));
        rate.set(n(50));
        assert_eq!(rate.limit(), n(50));
        rate.set(n(500));
        assert_eq!(rate.limit(), n(100), "the agent's own bound still holds");
        rate.set(None);
        assert_eq!(rate.limit(), n(100));
        let free = Rate::default();
        assert_eq!(free.limit(), None);
        free.set(n(7));
        assert_eq!(free.limit(), n(7));
    }

    #[tokio::test]
    async fn a_rate_with_no_bound_lets_everything_through_at_once() {
        use futures::FutureExt;
        let free = Rate::default();
        assert_eq!(free.take(u64::MAX).now_or_never(), Some(()));
        assert_eq!(free.take(u64::MAX).now_or_never(), Some(()));
        let bounded = Rate::new(NonZeroU64::new(1 << 20).unwrap());
        assert_eq!(bounded.take(1 << 20).now_or_never(), Some(()), "the burst");
        assert_eq!(bounded.take(1 << 20).now_or_never(), None, "then the pace");
    }

    #[tokio::test]
    async fn takers_sharing_a_rate_wait_their_turn() {
        let rate = Rate::new(NonZeroU64::new(10 << 20).unwrap());
        let start = std::time::Instant::now();
        // 1 MiB of burst, then 3 MiB at 10 MiB/s: 0.3 s, over four takers at once.
        let takers = (0..4).map(|_| {
            let rate = rate.clone();
            tokio::spawn(async move { rate.take(1 << 20).await })
        });
        for taker in takers.collect::<Vec<_>>() {
            taker.await.unwrap();
        }
        let took = start.elapsed();
        assert!(took >= Duration::from_millis(290) && took < Duration::from_secs(2), "{took:?}");
    }
}
