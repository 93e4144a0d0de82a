//! Who is calling: the bearer token, verified, unrevoked, and its role checks.

use axum::extract::FromRequestParts;
use axum::http::{header, request::Parts};
use uuid::Uuid;

use super::AppState;
use super::error::ApiError;
use crate::auth::token::{self, TokenError};
use crate::domain::role::Role;
use crate::store;

/// The verified caller of a user-API route.
#[derive(Debug, Clone)]
pub struct Caller {
    pub token_id: Uuid,
    pub workspace_id: Uuid,
    pub workspace: String,
    pub role: Role,
    pub org_admin: bool,
}

impl Caller {
    /// 403 unless the token's role is at least `needed`.
    pub fn require(&self, needed: Role, to: &str) -> Result<(), ApiError> {
        if self.role >= needed {
            return Ok(());
        }
        Err(ApiError::Forbidden(format!(
            "the {} role is needed to {to}; this token has {}",
            needed.as_str(),
            self.role.as_str()
        )))
    }

    pub fn require_org_admin(&self, to: &str) -> Result<(), ApiError> {
        if self.org_admin {
            return Ok(());
        }
        Err(ApiError::Forbidden(format!("an organisation admin token is needed to {to}")))
    }
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, app: &AppState) -> Result<Self, ApiError> {
        let value = parts.headers.get(header::AUTHORIZATION).ok_or_else(|| {
            ApiError::Unauthorized("no token: send the header Authorization: Bearer <token>".into())
        })?;
        let bearer = value
            .to_str()
            .ok()
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim())
            .ok_or_else(|| {
                ApiError::Unauthorized("the Authorization header must be: Bearer <token>".into())
            })?;
        let now = chrono::Utc::now().timestamp();
        let claims =
            app.hub.tokens.check(bearer, now, |t| token::verify(&app.keys, t)).map_err(|e| match e {
                TokenError::Expired => ApiError::Unauthorized("the token has expired".into()),
                TokenError::Invalid(why) => ApiError::Unauthorized(format!("the token is not valid ({why})")),
            })?;
        app.limiter.check(claims.jti).map_err(ApiError::TooManyRequests)?;
        if !app.hub.credentials.is_fresh(claims.jti, claims.jti) {
            if !store::tokens::is_active(&app.db, claims.jti).await? {
                return Err(ApiError::Unauthorized(
                    "the token has been revoked, or was never issued here".into(),
                ));
            }
            app.hub.credentials.remember(claims.jti, claims.jti);
        }
        Ok(Caller {
            token_id: claims.jti,
            workspace_id: claims.wid,
            workspace: claims.ws,
            role: claims.role,
            org_admin: claims.org,
        })
    }
}
