//! Bearer tokens: JWTs signed with the server's newest Ed25519 key, named in their `kid`.
//!
//! A token carries its workspace and role; its id (`jti`) is kept in the `tokens` table so a
//! revocation takes effect on the next request.

use chrono::{DateTime, Utc};
use jsonwebtoken::{Algorithm, DecodingKey, Header, Validation};
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
    sign(keys, &claims)
}

/// Signs `claims` with the newest key, named in the header's `kid`.
pub(crate) fn sign(keys: &Keys, claims: &impl Serialize) -> String {
    let key = keys.newest();
    let header = Header { kid: Some(key.id.clone()), ..Header::new(Algorithm::EdDSA) };
    jsonwebtoken::encode(&header, claims, &key.encoding)
        .expect("signing with a loaded Ed25519 key cannot fail")
}

/// Checks signature, algorithm, issuer, audience, expiry and not-before. Revocation is
/// checked against the database by the caller.
pub fn verify(keys: &Keys, token: &str) -> Result<Claims, TokenError> {
    decode(keys, token, USER_AUDIENCE)
}

/// Keys that check tokens' signatures: the server's own, or the public halves an agent was
/// handed ([`super::public::PublicKeys`]).
pub trait VerifyingKeys {
    /// The key a token whose header names `kid` (or none) was signed with, if known.
    fn decoding_key(&self, kid: Option<&str>) -> Option<&DecodingKey>;
}

impl VerifyingKeys for Keys {
    /// A token without a `kid` was signed before keys had ids, by the oldest.
    fn decoding_key(&self, kid: Option<&str>) -> Option<&DecodingKey> {
        match kid {
            Some(kid) => self.get(kid).map(|k| &k.decoding),
            None => Some(&self.oldest().decoding),
        }
    }
}

impl<K: VerifyingKeys + ?Sized> VerifyingKeys for std::sync::Arc<K> {
    fn decoding_key(&self, kid: Option<&str>) -> Option<&DecodingKey> {
        (**self).decoding_key(kid)
    }
}

/// The key id a token's header names, read without checking anything: what tells a holder of
/// public keys that it needs the server's newer ones.
pub fn key_id(token: &str) -> Option<String> {
    jsonwebtoken::decode_header(token).ok()?.kid
}

/// Decodes a token meant for `audience`, with every check but revocation, with the key the
/// header's `kid` names.
pub fn decode<T: serde::de::DeserializeOwned>(
    keys: &impl VerifyingKeys,
    token: &str,
    audience: &str,
) -> Result<T, TokenError> {
    let mut v = Validation::new(Algorithm::EdDSA);
    v.set_issuer(&[ISSUER]);
    v.set_audience(&[audience]);
    v.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
    v.validate_nbf = true;
    v.leeway = 5;
    let header = jsonwebtoken::decode_header(token).map_err(|_| TokenError::Invalid("malformed".into()))?;
    let key = keys
        .decoding_key(header.kid.as_deref())
        .ok_or_else(|| TokenError::Invalid("signed with an unknown key".into()))?;
    jsonwebtoken::decode::<T>(token, key, &v).map(|d| d.claims).map_err(|e| {
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
        let other = keys();
        let unknown = mint(&other, &claims(Duration::hours(1)));
        assert_eq!(verify(&k, &unknown), Err(TokenError::Invalid("signed with an unknown key".into())));
        // Another key's signature under this key's id.
        let header = Header { kid: Some(k.newest().id.clone()), ..Header::new(Algorithm::EdDSA) };
        let c = verify(&other, &unknown).unwrap();
        let forged = jsonwebtoken::encode(&header, &c, &other.newest().encoding).unwrap();
        assert_eq!(verify(&k, &forged), Err(TokenError::Invalid("bad signature".into())));
        // `alg: none`: the header says no signature and the signature part is empty.
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let good = mint(&k, &claims(Duration::hours(1)));
        let payload = good.split('.').nth(1).unwrap();
        let none = format!("{}.{payload}.", b64.encode(r#"{"alg":"none","typ":"JWT"}"#));
        assert!(verify(&k, &none).is_err());
        assert!(verify(&k, "garbage").is_err());
    }

    #[test]
    fn a_token_names_its_key_and_verifies_after_a_rotation_until_the_key_is_removed() {
        let (old_pem, new_pem) = (Keys::generate_pem().unwrap(), Keys::generate_pem().unwrap());
        let old = Keys::from_pem(&old_pem).unwrap();
        let rotated = Keys::from_pem(&format!("{old_pem}{new_pem}")).unwrap();
        let only_new = Keys::from_pem(&new_pem).unwrap();
        let before = mint(&old, &claims(Duration::hours(1)));
        let after = mint(&rotated, &claims(Duration::hours(1)));
        let kid = |t: &str| jsonwebtoken::decode_header(t).unwrap().kid.unwrap();
        assert_eq!(kid(&before), old.newest().id);
        assert_eq!(kid(&after), rotated.newest().id);
        assert!(verify(&rotated, &before).is_ok());
        assert!(verify(&rotated, &after).is_ok());
        assert!(verify(&only_new, &after).is_ok());
        let gone = Err(TokenError::Invalid("signed with an unknown key".into()));
        assert_eq!(verify(&only_new, &before), gone, "the old key was removed");
        assert_eq!(verify(&old, &after), gone, "a replica without the new key");
    }

    #[test]
    fn a_token_without_a_kid_is_checked_with_the_oldest_key_only() {
        let (old_pem, new_pem) = (Keys::generate_pem().unwrap(), Keys::generate_pem().unwrap());
        let rotated = Keys::from_pem(&format!("{old_pem}{new_pem}")).unwrap();
        let c = claims(Duration::hours(1));
        let payload = mint(&rotated, &c).split('.').nth(1).unwrap().to_owned();
        let unnamed = |pem: &str| {
            let key = jsonwebtoken::EncodingKey::from_ed_pem(pem.as_bytes()).unwrap();
            let claims: Claims = serde_json::from_slice(
                &base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(&payload).unwrap(),
            )
            .unwrap();
            jsonwebtoken::encode(&Header::new(Algorithm::EdDSA), &claims, &key).unwrap()
        };
        assert_eq!(verify(&rotated, &unnamed(&old_pem)).unwrap().jti, c.id, "issued before key ids");
        assert_eq!(
            verify(&rotated, &unnamed(&new_pem)),
            Err(TokenError::Invalid("bad signature".into())),
            "every token the newest key signs names it"
        );
    }
}
