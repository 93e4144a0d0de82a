//! Per-token rate limits: a flood from one token gets 429 with Retry-After instead of slowing
//! everyone (GCRA, via governor).

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota};
use uuid::Uuid;

#[derive(Clone)]
pub struct Limiter(Option<Arc<DefaultKeyedRateLimiter<Uuid>>>);

impl Limiter {
    /// `per_second` requests a second per token, with bursts of twice that; 0 turns it off.
    pub fn per_token(per_second: u32) -> Limiter {
        let Some(rate) = NonZeroU32::new(per_second) else { return Limiter(None) };
        let burst = rate.saturating_mul(NonZeroU32::new(2).expect("2 is not 0"));
        Limiter(Some(Arc::new(DefaultKeyedRateLimiter::keyed(Quota::per_second(rate).allow_burst(burst)))))
    }

    /// `Err(wait)` when the token must wait before its next request.
    pub fn check(&self, token: Uuid) -> Result<(), Duration> {
        let Some(limiter) = &self.0 else { return Ok(()) };
        limiter.check_key(&token).map_err(|not_until| not_until.wait_time_from(DefaultClock::default().now()))
    }

    /// Forgets tokens idle long enough to be back at a full burst.
    pub fn forget_idle(&self) {
        if let Some(limiter) = &self.0 {
            limiter.retain_recent();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_past_its_burst_must_wait_and_others_need_not() {
        let limiter = Limiter::per_token(5);
        let (flood, calm) = (Uuid::from_u128(1), Uuid::from_u128(2));
        // A burst of 2 × 5 = 10 passes, the 11th waits about 1/5 s.
        assert!((0..10).all(|_| limiter.check(flood).is_ok()));
        let wait = limiter.check(flood).unwrap_err();
        assert!(wait > Duration::ZERO && wait <= Duration::from_millis(200), "{wait:?}");
        assert!(limiter.check(calm).is_ok());
        assert!((0..1000).all(|_| Limiter::per_token(0).check(flood).is_ok()));
    }
}
