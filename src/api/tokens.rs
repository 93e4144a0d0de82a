//! `/tokens`: a workspace admin creates, lists and revokes the workspace's tokens.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use super::AppState;
use super::caller::Caller;
use super::error::{ApiError, ErrorBody};
use super::extract::{Body, Path};
use super::list::List;
use crate::auth::issue;
use crate::domain::Name;
use crate::domain::role::Role;
use crate::hub;
use crate::store::{self, tokens::TokenRecord, workspaces::Workspace};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(list, create)).routes(routes!(revoke))
}

const DEFAULT_TTL_SECONDS: i64 = 30 * 24 * 3600;
const MAX_TTL_SECONDS: i64 = 365 * 24 * 3600;

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenInput {
    /// What the token is for, e.g. `ci`.
    pub name: Name,
    pub role: Role,
    /// Only an organisation admin may mint organisation-admin tokens.
    #[serde(default)]
    pub org_admin: bool,
    /// Lifetime in seconds (default 30 days, at most a year).
    #[schema(minimum = 1, maximum = 31536000)]
    pub ttl_seconds: Option<i64>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Token {
    pub id: Uuid,
    pub name: String,
    pub role: String,
    pub org_admin: bool,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub revoked_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct CreatedToken {
    #[serde(flatten)]
    pub info: Token,
    /// The bearer token itself. Shown once: it is not stored.
    pub token: String,
}

impl From<TokenRecord> for Token {
    fn from(r: TokenRecord) -> Token {
        Token {
            id: r.id,
            name: r.name,
            role: r.role,
            org_admin: r.org_admin,
            created_at: r.created_at,
            expires_at: r.expires_at,
            revoked_at: r.revoked_at,
        }
    }
}

/// Create a token for this workspace. The answer holds the token once.
#[utoipa::path(post, path = "/tokens", tag = "tokens", request_body = TokenInput,
    responses(
        (status = 201, body = CreatedToken),
        (status = 403, description = "Not an admin token, or an organisation-admin token asked for without one", body = ErrorBody),
        (status = 422, body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn create(
    State(app): State<AppState>,
    caller: Caller,
    Body(input): Body<TokenInput>,
) -> Result<(StatusCode, Json<CreatedToken>), ApiError> {
    caller.require(Role::Admin, "manage tokens")?;
    if input.org_admin {
        caller.require_org_admin("mint organisation-admin tokens")?;
    }
    let seconds = input.ttl_seconds.unwrap_or(DEFAULT_TTL_SECONDS);
    if !(1..=MAX_TTL_SECONDS).contains(&seconds) {
        return Err(ApiError::invalid("ttl_seconds", format!("must be between 1 and {MAX_TTL_SECONDS}")));
    }
    let workspace =
        Workspace { id: caller.workspace_id, name: caller.workspace.clone(), created_at: Utc::now() };
    let request = issue::Request {
        workspace: &workspace,
        name: input.name.as_str(),
        role: input.role,
        org_admin: input.org_admin,
        ttl: Duration::seconds(seconds),
    };
    let (record, token) = issue::issue(&app.db, &app.keys, &request).await?;
    Ok((StatusCode::CREATED, Json(CreatedToken { info: record.into(), token })))
}

/// List the workspace's tokens (never the tokens themselves).
#[utoipa::path(get, path = "/tokens", tag = "tokens",
    responses((status = 200, body = List<Token>), (status = 403, description = "Not an admin token", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list(State(app): State<AppState>, caller: Caller) -> Result<Json<List<Token>>, ApiError> {
    caller.require(Role::Admin, "manage tokens")?;
    let rows = store::tokens::list(&app.db, caller.workspace_id).await?;
    Ok(Json(List::all(rows.into_iter().map(Token::from).collect())))
}

/// Revoke a token. It stops working on its next request.
#[utoipa::path(delete, path = "/tokens/{id}", tag = "tokens", params(("id" = String, Path)),
    responses(
        (status = 200, body = Token),
        (status = 403, description = "Not an admin token, or an organisation admin's token revoked without one", body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn revoke(
    State(app): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<Token>, ApiError> {
    caller.require(Role::Admin, "manage tokens")?;
    let Ok(uid) = Uuid::parse_str(&id) else { return Err(ApiError::not_found("token", &id)) };
    let mut tx = app.db.begin().await?;
    let org_admin = store::tokens::lock_org_admin(&mut *tx, caller.workspace_id, uid).await?;
    if org_admin.ok_or_else(|| ApiError::not_found("token", &id))? {
        // A workspace admin would otherwise lock the organisation's admins out.
        caller.require_org_admin("revoke an organisation admin's token")?;
    }
    let found = store::tokens::revoke(&mut *tx, caller.workspace_id, uid).await?;
    let found = found.ok_or_else(|| ApiError::not_found("token", &id))?;
    hub::revoked(&mut *tx, uid).await?;
    tx.commit().await?;
    // Refused from the very next request here, its streams ended; other replicas hear of it
    // on commit.
    app.hub.revoke(uid);
    Ok(Json(found.into()))
}
