//! Machine credentials and join tokens.
//!
//! A join token is an opaque secret an organisation admin mints for a cluster; only its hash is
//! stored. A machine that joins with one gets a credential (a JWT for the agent audience) that
//! names the machine, so it can call the agent API only, and only for itself. Joining again
//! rotates the credential: the machine row keeps the id of the one in force.

use base64::Engine;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use super::Keys;
use super::token::{ISSUER, TokenError, VerifyingKeys, decode, sign};

pub const AGENT_AUDIENCE: &str = "astraeus-agent";
const JOIN_PREFIX: &str = "astj_";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MachineClaims {
    pub iss: String,
    pub aud: String,
    /// The machine's name.
    pub sub: String,
    /// The credential's id, checked against the machine row.
    pub jti: Uuid,
    pub mid: Uuid,
    pub cluster: String,
    pub iat: i64,
    pub exp: i64,
}

impl super::verified::Expiring for MachineClaims {
    fn expires_at(&self) -> i64 {
        self.exp
    }
}

pub fn mint_credential(
    keys: &Keys,
    machine: Uuid,
    name: &str,
    cluster: &str,
    credential: Uuid,
    expires_at: DateTime<Utc>,
) -> String {
    let claims = MachineClaims {
        iss: ISSUER.into(),
        aud: AGENT_AUDIENCE.into(),
        sub: name.into(),
        jti: credential,
        mid: machine,
        cluster: cluster.into(),
        iat: Utc::now().timestamp(),
        exp: expires_at.timestamp(),
    };
    sign(keys, &claims)
}

/// The claims of a machine credential; with the server's public keys, how an agent learns its
/// own machine's id.
pub fn verify_credential(keys: &impl VerifyingKeys, token: &str) -> Result<MachineClaims, TokenError> {
    decode(keys, token, AGENT_AUDIENCE)
}

/// A new join token and the hash to store.
pub fn new_join_token() -> (String, Vec<u8>) {
    let mut secret = [0u8; 32];
    getrandom::getrandom(&mut secret).expect("the OS gives randomness");
    let token = format!("{JOIN_PREFIX}{}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(secret));
    let hash = hash_join_token(&token);
    (token, hash)
}

pub fn hash_join_token(token: &str) -> Vec<u8> {
    Sha256::digest(token.as_bytes()).to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::token;

    #[test]
    fn a_machine_credential_opens_only_the_agent_api() {
        let keys = Keys::from_pem(&Keys::generate_pem().unwrap()).unwrap();
        let (m, c) = (Uuid::now_v7(), Uuid::now_v7());
        let cred = mint_credential(&keys, m, "gpu-01", "main", c, Utc::now() + chrono::Duration::days(1));
        let claims = verify_credential(&keys, &cred).unwrap();
        assert_eq!((claims.mid, claims.jti, claims.sub.as_str()), (m, c, "gpu-01"));
        assert!(token::verify(&keys, &cred).is_err(), "a machine credential is not a user token");
    }

    #[test]
    fn join_tokens_are_stored_only_as_hashes() {
        let (token, hash) = new_join_token();
        assert!(token.starts_with("astj_"));
        assert_eq!(hash, hash_join_token(&token));
        assert!(!hash.windows(8).any(|w| token.as_bytes().windows(8).any(|t| t == w)));
    }
}
