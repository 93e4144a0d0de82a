//! Transfer tokens: the server's leave for one machine to pull one copy from another.
//!
//! The server mints one when it sends a fill to a peer rather than to the origin; the
//! receiver hands it to the holder's data port, which checks it with the server's public keys
//! (no call to the server) and serves only the copy it names, only if that copy's manifest is
//! the one named. Tokens are short-lived and have their own audience, so neither a machine
//! credential nor a user token opens a data port, and a transfer token opens nothing else.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::Keys;
use super::token::{ISSUER, TokenError, VerifyingKeys, decode, sign};

pub const TRANSFER_AUDIENCE: &str = "astraeus-transfer";
/// How long a transfer token is good for: a pull that outlasts it gets a 401 at its next
/// request and resumes, with a fresh token, where it stopped.
pub const TRANSFER_TTL: chrono::Duration = chrono::Duration::minutes(15);

/// What a transfer token grants.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransferClaims {
    /// The machine holding the copy: the only one that serves the token.
    pub source: Uuid,
    /// The machine pulling it, for audit trails.
    pub receiver: Uuid,
    /// The drive the copy was made for.
    pub drive: Uuid,
    /// The copy's folder in `drives/`, `<namespace>.<drive>`.
    pub folder: String,
    /// The digest of the copy's manifest, 64 lowercase hex digits, as the holder reported it.
    pub manifest: String,
    /// Seconds since the epoch.
    pub exp: i64,
    /// The token's id, for audit trails.
    pub jti: Uuid,
}

impl TransferClaims {
    /// A grant of [`TRANSFER_TTL`] from `now`, with a new id.
    pub fn new(
        source: Uuid,
        receiver: Uuid,
        drive: Uuid,
        folder: &str,
        manifest: &str,
        now: DateTime<Utc>,
    ) -> Self {
        TransferClaims {
            source,
            receiver,
            drive,
            folder: folder.to_owned(),
            manifest: manifest.to_owned(),
            exp: (now + TRANSFER_TTL).timestamp(),
            jti: Uuid::now_v7(),
        }
    }
}

/// The token as signed: the grant with the claims every token carries.
#[derive(Serialize, Deserialize)]
struct Signed {
    iss: String,
    aud: String,
    /// The receiving machine.
    sub: String,
    iat: i64,
    #[serde(flatten)]
    claims: TransferClaims,
}

/// Signs `claims` with the server's newest key.
pub fn mint_transfer(keys: &Keys, claims: &TransferClaims) -> String {
    let signed = Signed {
        iss: ISSUER.into(),
        aud: TRANSFER_AUDIENCE.into(),
        sub: claims.receiver.to_string(),
        iat: Utc::now().timestamp(),
        claims: claims.clone(),
    };
    sign(keys, &signed)
}

/// The grant of a token signed by one of `keys` for the transfer audience, unexpired. What it
/// grants (this machine, this folder, this manifest) is the holder's to check.
pub fn verify_transfer(keys: &impl VerifyingKeys, token: &str) -> Result<TransferClaims, TokenError> {
    // Read loosely first, so that another kind of token is refused for its audience rather
    // than for its fields.
    let value: serde_json::Value = decode(keys, token, TRANSFER_AUDIENCE)?;
    let signed: Signed =
        serde_json::from_value(value).map_err(|_| TokenError::Invalid("malformed".into()))?;
    Ok(signed.claims)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::machine::mint_credential;

    fn keys() -> Keys {
        Keys::from_pem(&Keys::generate_pem().unwrap()).unwrap()
    }

    fn claims(now: DateTime<Utc>) -> TransferClaims {
        let digest = "ab".repeat(32);
        TransferClaims::new(Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7(), "default.food101", &digest, now)
    }

    #[test]
    fn a_transfer_token_verifies_with_its_grant_with_the_private_or_public_keys() {
        let k = keys();
        let c = claims(Utc::now());
        let token = mint_transfer(&k, &c);
        assert_eq!(verify_transfer(&k, &token), Ok(c.clone()));
        assert_eq!(verify_transfer(&k.public(), &token), Ok(c));
    }

    #[test]
    fn an_expired_transfer_token_is_refused() {
        let k = keys();
        // Past the 5 s leeway: 15 minutes of life, from 16 minutes ago.
        let token = mint_transfer(&k, &claims(Utc::now() - chrono::Duration::minutes(16)));
        assert_eq!(verify_transfer(&k, &token), Err(TokenError::Expired));
    }

    #[test]
    fn a_machine_credential_or_another_servers_token_is_not_a_transfer_token() {
        let k = keys();
        let expires = Utc::now() + chrono::Duration::hours(1);
        let credential = mint_credential(&k, Uuid::now_v7(), "gpu-01", "main", Uuid::now_v7(), expires);
        assert_eq!(verify_transfer(&k, &credential), Err(TokenError::Invalid("wrong audience".into())));
        let other = mint_transfer(&keys(), &claims(Utc::now()));
        let unknown = Err(TokenError::Invalid("signed with an unknown key".into()));
        assert_eq!(verify_transfer(&k, &other), unknown);
        assert_eq!(verify_transfer(&k.public(), &other), unknown);
        // A transfer token opens neither the agent API nor the user API.
        let token = mint_transfer(&k, &claims(Utc::now()));
        assert!(crate::auth::machine::verify_credential(&k, &token).is_err());
        assert!(crate::auth::token::verify(&k, &token).is_err());
    }
}
