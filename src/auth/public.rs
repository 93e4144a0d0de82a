//! The public halves of the server's keys: what agents check tokens with, without asking the
//! server each time.
//!
//! The agent API hands them out ([`Keys::published`]); an agent takes them in only when each
//! is a valid Ed25519 point whose id is its own ([`PublicKeys::from_published`]), so a key id
//! always names the same key, on the server and on every agent.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ed25519_dalek::VerifyingKey;
use jsonwebtoken::DecodingKey;
use serde::{Deserialize, Serialize};

use super::Keys;
use super::keys::key_id;
use super::token::VerifyingKeys;

/// Keys one answer may hand out: a rotation adds one at a time, and old ones are deleted.
pub const MAX_KEYS: usize = 64;

/// A verifying key as the agent API hands it out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PublicKey {
    /// Named in tokens' `kid`.
    pub id: String,
    /// The 32 bytes of the Ed25519 public key, base64url without padding (RFC 8037's `x`).
    pub ed25519: String,
}

impl Keys {
    /// The public halves of the keys, oldest first. The private keys never leave the server.
    pub fn published(&self) -> Vec<PublicKey> {
        self.iter()
            .map(|k| PublicKey { id: k.id.clone(), ed25519: URL_SAFE_NO_PAD.encode(k.public) })
            .collect()
    }

    /// The keys as an agent holds them.
    pub fn public(&self) -> PublicKeys {
        PublicKeys::from_published(&self.published()).expect("the server's own keys are valid")
    }
}

/// Verifying keys by id; empty until an agent first fetches them.
#[derive(Default)]
pub struct PublicKeys {
    keys: Vec<(String, DecodingKey)>,
}

impl std::fmt::Debug for PublicKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<&str> = self.keys.iter().map(|(id, _)| id.as_str()).collect();
        write!(f, "PublicKeys({})", ids.join(", "))
    }
}

impl PublicKeys {
    /// Keys as the server handed them out, each checked: a valid Ed25519 public key whose id is
    /// the one derived from it, listed once, [`MAX_KEYS`] at most.
    pub fn from_published(published: &[PublicKey]) -> Result<PublicKeys, String> {
        if published.len() > MAX_KEYS {
            return Err(format!("{} keys, more than the {MAX_KEYS} a server hands out", published.len()));
        }
        let mut keys: Vec<(String, DecodingKey)> = Vec::with_capacity(published.len());
        for (i, k) in published.iter().enumerate() {
            let bad = |why: &str| format!("keys[{i}]: {why}");
            let bytes = URL_SAFE_NO_PAD.decode(&k.ed25519).map_err(|_| bad("ed25519 is not base64url"))?;
            let bytes: [u8; 32] = bytes.try_into().map_err(|_| bad("ed25519 is not 32 bytes"))?;
            VerifyingKey::from_bytes(&bytes).map_err(|_| bad("ed25519 is not a valid public key"))?;
            if key_id(&bytes) != k.id {
                return Err(bad("its id is not the one its key gives"));
            }
            if keys.iter().any(|(id, _)| *id == k.id) {
                return Err(bad("listed twice"));
            }
            let decoding = DecodingKey::from_ed_components(&k.ed25519).map_err(|_| bad("not usable"))?;
            keys.push((k.id.clone(), decoding));
        }
        Ok(PublicKeys { keys })
    }

    pub fn contains(&self, id: &str) -> bool {
        self.keys.iter().any(|(k, _)| k == id)
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

impl VerifyingKeys for PublicKeys {
    /// Only tokens that name their key: every token made since keys had ids does.
    fn decoding_key(&self, kid: Option<&str>) -> Option<&DecodingKey> {
        let kid = kid?;
        self.keys.iter().find(|(id, _)| id == kid).map(|(_, key)| key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::machine::{mint_credential, verify_credential};

    #[test]
    fn public_keys_check_what_the_private_ones_signed_and_nothing_else() {
        let (old, new) = (Keys::generate_pem().unwrap(), Keys::generate_pem().unwrap());
        let keys = Keys::from_pem(&format!("{old}{new}")).unwrap();
        let public = keys.public();
        assert_eq!(keys.published().len(), 2);
        assert!(keys.ids().all(|id| public.contains(id)));
        let expires = chrono::Utc::now() + chrono::Duration::hours(1);
        let machine = uuid::Uuid::now_v7();
        let cred = mint_credential(&keys, machine, "gpu-01", "main", uuid::Uuid::now_v7(), expires);
        assert_eq!(verify_credential(&public, &cred).unwrap().mid, machine);
        let other = Keys::from_pem(&Keys::generate_pem().unwrap()).unwrap();
        let forged = mint_credential(&other, machine, "gpu-01", "main", uuid::Uuid::now_v7(), expires);
        assert!(verify_credential(&public, &forged).is_err());
        assert!(verify_credential(&PublicKeys::default(), &cred).is_err());
    }

    #[test]
    fn a_published_key_is_refused_when_its_id_or_bytes_are_not_its_own() {
        let keys = Keys::from_pem(&Keys::generate_pem().unwrap()).unwrap();
        let good = keys.published().remove(0);
        let other = Keys::from_pem(&Keys::generate_pem().unwrap()).unwrap().published().remove(0);
        let cases = [
            (
                PublicKey { id: other.id.clone(), ..good.clone() },
                "keys[0]: its id is not the one its key gives",
            ),
            (PublicKey { ed25519: "AAAA".into(), ..good.clone() }, "keys[0]: ed25519 is not 32 bytes"),
            (PublicKey { ed25519: "!".into(), ..good.clone() }, "keys[0]: ed25519 is not base64url"),
        ];
        for (key, why) in cases {
            assert_eq!(PublicKeys::from_published(&[key]).unwrap_err(), why);
        }
        assert_eq!(
            PublicKeys::from_published(&[good.clone(), good.clone()]).unwrap_err(),
            "keys[1]: listed twice"
        );
        let many = vec![good; MAX_KEYS + 1];
        assert!(PublicKeys::from_published(&many).is_err());
    }
}
