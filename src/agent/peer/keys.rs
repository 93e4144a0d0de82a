//! The server's public keys as the agent holds them: fetched once, and again when a token
//! names a key the agent does not know (the server rotated), at most once a minute so that
//! tokens naming made-up keys cannot make the agent call the server at their pace.

use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use crate::agent::client::Client;
use crate::auth::PublicKeys;
use crate::auth::token::{TokenError, key_id};
use crate::auth::transfer::{TransferClaims, verify_transfer};

/// The least time between two fetches of the keys.
pub const REFRESH_EVERY: Duration = Duration::from_secs(60);

pub struct TrustedKeys {
    keys: RwLock<Arc<PublicKeys>>,
    /// Where newer keys come from; `None` for a fixed set.
    server: Option<Client>,
    /// When the keys were last fetched (or tried); held across a fetch, so that requests
    /// arriving meanwhile wait for its keys rather than be refused.
    fetched: tokio::sync::Mutex<Option<Instant>>,
}

impl TrustedKeys {
    /// No keys until the first token asks for them from `server`.
    pub fn new(server: Client) -> TrustedKeys {
        TrustedKeys { keys: RwLock::default(), server: Some(server), fetched: Default::default() }
    }

    /// These keys (just fetched from `server`), and newer ones from `server` when a token
    /// names a key not among them.
    pub fn seeded(server: Client, keys: PublicKeys) -> TrustedKeys {
        TrustedKeys { keys: RwLock::new(Arc::new(keys)), server: Some(server), fetched: Default::default() }
    }

    /// These keys, never fetched again.
    pub fn fixed(keys: PublicKeys) -> TrustedKeys {
        TrustedKeys { keys: RwLock::new(Arc::new(keys)), server: None, fetched: Default::default() }
    }

    pub fn current(&self) -> Arc<PublicKeys> {
        self.keys.read().expect("not poisoned").clone()
    }

    /// Fetches the keys from the server unless it was asked within [`REFRESH_EVERY`]; whether
    /// new keys were taken in.
    pub async fn refresh(&self) -> bool {
        self.refresh_for(None).await
    }

    /// As [`TrustedKeys::refresh`], unless the key `kid` is known by the time an earlier fetch
    /// under way has ended.
    async fn refresh_for(&self, kid: Option<&str>) -> bool {
        let Some(server) = &self.server else { return false };
        let mut fetched = self.fetched.lock().await;
        if kid.is_some_and(|k| self.current().contains(k)) || !due(*fetched, Instant::now()) {
            return false;
        }
        *fetched = Some(Instant::now());
        match server.keys().await {
            Ok(keys) => {
                *self.keys.write().expect("not poisoned") = Arc::new(keys);
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot fetch the server's keys: transfer tokens of newer keys are refused");
                false
            }
        }
    }

    /// The grant of a transfer token, checked with the keys held, or with the server's newer
    /// ones when it names a key not held (within the refresh's pace).
    pub async fn verify_transfer(&self, token: &str) -> Result<TransferClaims, TokenError> {
        if let Some(kid) = key_id(token).filter(|kid| !self.current().contains(kid)) {
            self.refresh_for(Some(&kid)).await;
        }
        verify_transfer(&*self.current(), token)
    }
}

/// Whether keys last fetched at `last` may be fetched again at `now`.
fn due(last: Option<Instant>, now: Instant) -> bool {
    last.is_none_or(|at| now.saturating_duration_since(at) >= REFRESH_EVERY)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_fetched_at_first_need_then_at_most_once_a_minute() {
        let t = Instant::now();
        let s = Duration::from_secs;
        let cases = [(None, t, true), (Some(t), t + s(59), false), (Some(t), t + s(60), true)];
        for (last, now, expected) in cases {
            assert_eq!(due(last, now), expected, "{last:?} {now:?}");
        }
    }
}
