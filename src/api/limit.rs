//! Rate limits: a flood from one token, or on the routes that need none from one client
//! address, gets 429 with Retry-After instead of slowing everyone (GCRA, via governor).

use std::hash::Hash;
use std::net::{IpAddr, SocketAddr};
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{ConnectInfo, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota};
use uuid::Uuid;

use super::error::ApiError;

/// Requests a second one client address may make to the routes that need no token, by default.
pub const DEFAULT_PER_ADDRESS: u32 = 10;

/// A rate limit per key: a token's id, or a client's address.
#[derive(Clone)]
pub struct Limiter<K: Hash + Eq + Clone = Uuid>(Option<Arc<DefaultKeyedRateLimiter<K>>>);

impl Limiter<Uuid> {
    /// `per_second` requests a second per token, with bursts of twice that; 0 turns it off.
    pub fn per_token(per_second: u32) -> Limiter<Uuid> {
        Limiter::per_key(per_second)
    }
}

impl Limiter<IpAddr> {
    /// `per_second` requests a second per client address, with bursts of twice that; 0 turns
    /// it off.
    pub fn per_address(per_second: u32) -> Limiter<IpAddr> {
        Limiter::per_key(per_second)
    }
}

impl<K: Hash + Eq + Clone> Limiter<K> {
    fn per_key(per_second: u32) -> Limiter<K> {
        let Some(rate) = NonZeroU32::new(per_second) else { return Limiter(None) };
        let burst = rate.saturating_mul(NonZeroU32::new(2).expect("2 is not 0"));
        Limiter(Some(Arc::new(DefaultKeyedRateLimiter::keyed(Quota::per_second(rate).allow_burst(burst)))))
    }

    /// `Err(wait)` when the key must wait before its next request.
    pub fn check(&self, token: K) -> Result<(), Duration> {
        let Some(limiter) = &self.0 else { return Ok(()) };
        limiter.check_key(&token).map_err(|not_until| not_until.wait_time_from(DefaultClock::default().now()))
    }

    /// Forgets keys idle long enough to be back at a full burst.
    pub fn forget_idle(&self) {
        if let Some(limiter) = &self.0 {
            limiter.retain_recent();
        }
    }
}

/// Middleware for the routes that need no token (`/agent/v1/join`, `/healthz`, `/readyz`):
/// limited by the peer's address, which is the client's when no proxy stands in front. A
/// server served without its peers' addresses leaves them unlimited.
pub async fn by_address(State(limiter): State<Limiter<IpAddr>>, req: Request, next: Next) -> Response {
    let peer = req.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip());
    if let Some(ip) = peer
        && let Err(wait) = limiter.check(ip)
    {
        return ApiError::TooManyFromAddress(wait).into_response();
    }
    next.run(req).await
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
