//! Bearer tokens: JWTs signed with the server's Ed25519 key.
//!
//! A token carries its workspace and role; its id (`jti`) is kept in the `tokens` table so a
//! revocation takes effect on the next request.

use chrono::{DateTime, Utc};
use jsonwebtoken::{Algorithm, Header, Validation};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::Keys;
use crate::domain::role::Role;

pub const ISSUER: &str = "astraeus";
/// The user API's audience; machine credentials carry another, so neither opens the other's API.
pub const USER_AUDIENCE: &str = "astraeus-api";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Claims {
    pub iss: String,
    pub aud: String,
    /// The token's name, for people reading audit trails.
    pub sub: String,
    pub jti: Uuid,
    pub iat: i64,
    pub exp: i64,
    /// Workspace id and name.
    pub wid: Uuid,
    pub ws: String,
    pub role: Role,
    #[serde(default)]
    pub org: bool,
}

impl super::verified::Expiring for Claims {
    fn expires_at(&self) -> i64 {
        self.exp
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokenError {
    #[error("the token has expired")]
    Expired,
    #[error("the token is not valid: {0}")]
    Invalid(String),
}

pub struct NewClaims<'a> {
    pub id: Uuid,
    pub name: &'a str,
    pub workspace_id: Uuid,
    pub workspace: &'a str,
    pub role: Role,
    pub org_admin: bool,
    pub issued_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
}

pub fn mint(keys: &Keys, c: &NewClaims<'_>) -> String {
    let claims = Claims {
        iss: ISSUER.into(),
        aud: USER_AUDIENCE.into(),
        sub: c.name.into(),
        jti: c.id,
        iat: c.issued_at.timestamp(),
        exp: c.expires_at.timestamp(),
        wid: c.workspace_id,
        ws: c.workspace.into(),
        role: c.role,
        org: c.org_admin,
    };
    jsonwebtoken::encode(&Header::new(Algorithm::EdDSA), &claims, &keys.encoding)
        .expect("signing with a loaded Ed25519 key cannot fail")
}

/// Checks signature, algorithm, issuer, audience, expiry and not-before. Revocation is
/// checked against the database by the caller.
pub fn verify(keys: &Keys, token: &str) -> Result<Claims, TokenError> {
    decode(keys, token, USER_AUDIENCE)
}

/// Decodes a token meant for `audience`, with every check but revocation.
pub fn decode<T: serde::de::DeserializeOwned>(
    keys: &Keys,
    token: &str,
    audience: &str,
) -> Result<T, TokenError> {
    let mut v = Validation::new(Algorithm::EdDSA);
    v.set_issuer(&[ISSUER]);
    v.set_audience(&[audience]);
    v.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
    v.validate_nbf = true;
    v.leeway = 5;
    jsonwebtoken::decode::<T>(token, &keys.decoding, &v).map(|d| d.claims).map_err(|e| {
        use jsonwebtoken::errors::ErrorKind;
        match e.kind() {
            ErrorKind::ExpiredSignature => TokenError::Expired,
            ErrorKind::InvalidIssuer => TokenError::Invalid("wrong issuer".into()),
            ErrorKind::InvalidAudience => TokenError::Invalid("wrong audience".into()),
            ErrorKind::ImmatureSignature => TokenError::Invalid("not valid yet".into()),
            ErrorKind::InvalidSignature => TokenError::Invalid("bad signature".into()),
            ErrorKind::InvalidAlgorithm => TokenError::Invalid("wrong algorithm".into()),
            ErrorKind::MissingRequiredClaim(c) => TokenError::Invalid(format!("missing claim {c}")),
            _ => TokenError::Invalid("malformed".into()),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine;
    use chrono::Duration;

    fn keys() -> Keys {
        Keys::from_pem(&Keys::generate_pem().unwrap()).unwrap()
    }

    fn claims(expires_in: Duration) -> NewClaims<'static> {
        let now = Utc::now();
        NewClaims {
            id: Uuid::now_v7(),
            name: "ci",
            workspace_id: Uuid::now_v7(),
            workspace: "default",
            role: Role::Editor,
            org_admin: false,
            issued_at: now,
            expires_at: now + expires_in,
        }
    }

    #[test]
    fn a_minted_token_verifies_with_its_claims() {
        let k = keys();
        let c = claims(Duration::hours(1));
        let got = verify(&k, &mint(&k, &c)).unwrap();
        assert_eq!((got.jti, got.role, got.ws.as_str()), (c.id, Role::Editor, "default"));
    }

    #[test]
    fn expired_forged_and_unsigned_tokens_are_refused() {
        let k = keys();
        assert_eq!(verify(&k, &mint(&k, &claims(Duration::hours(-1)))), Err(TokenError::Expired));
        let other = mint(&keys(), &claims(Duration::hours(1)));
        assert_eq!(verify(&k, &other), Err(TokenError::Invalid("bad signature".into())));
        // `alg: none`: the header says no signature and the signature part is empty.
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let good = mint(&k, &claims(Duration::hours(1)));
        let payload = good.split('.').nth(1).unwrap();
        let none = format!("{}.{payload}.", b64.encode(r#"{"alg":"none","typ":"JWT"}"#));
        assert!(verify(&k, &none).is_err());
        assert!(verify(&k, "garbage").is_err());
    }
}
