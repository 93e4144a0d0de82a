//! The `tokens` table: one row per issued token, so it can be listed and revoked.

use chrono::{DateTime, Utc};
use sqlx::PgExecutor;
use uuid::Uuid;

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct TokenRecord {
    pub id: Uuid,
    pub workspace_id: Uuid,
    pub name: String,
    pub role: String,
    pub org_admin: bool,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub revoked_at: Option<DateTime<Utc>>,
}

const COLUMNS: &str = "id, workspace_id, name, role, org_admin, created_at, expires_at, revoked_at";

pub struct NewToken<'a> {
    pub id: Uuid,
    pub workspace_id: Uuid,
    pub name: &'a str,
    pub role: &'a str,
    pub org_admin: bool,
    pub expires_at: DateTime<Utc>,
}

pub async fn insert(db: impl PgExecutor<'_>, t: &NewToken<'_>) -> sqlx::Result<TokenRecord> {
    sqlx::query_as(&format!(
        "INSERT INTO tokens (id, workspace_id, name, role, org_admin, expires_at)
         VALUES ($1, $2, $3, $4, $5, $6) RETURNING {COLUMNS}"
    ))
    .bind(t.id)
    .bind(t.workspace_id)
    .bind(t.name)
    .bind(t.role)
    .bind(t.org_admin)
    .bind(t.expires_at)
    .fetch_one(db)
    .await
}

/// Whether the token is known, unrevoked and unexpired: checked on every request.
pub async fn is_active(db: impl PgExecutor<'_>, id: Uuid) -> sqlx::Result<bool> {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM tokens WHERE id = $1 AND revoked_at IS NULL AND expires_at > now())",
    )
    .bind(id)
    .fetch_one(db)
    .await
}

pub async fn list(db: impl PgExecutor<'_>, workspace: Uuid) -> sqlx::Result<Vec<TokenRecord>> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM tokens WHERE workspace_id = $1 ORDER BY created_at DESC, id DESC"
    ))
    .bind(workspace)
    .fetch_all(db)
    .await
}

/// Whether a token of the workspace is an organisation admin's, locked until the transaction
/// ends; `None` when the workspace has no such token.
pub async fn lock_org_admin(
    db: impl PgExecutor<'_>,
    workspace: Uuid,
    id: Uuid,
) -> sqlx::Result<Option<bool>> {
    sqlx::query_scalar("SELECT org_admin FROM tokens WHERE workspace_id = $1 AND id = $2 FOR UPDATE")
        .bind(workspace)
        .bind(id)
        .fetch_optional(db)
        .await
}

/// Revokes a token of the workspace; `None` when it has no such token.
pub async fn revoke(db: impl PgExecutor<'_>, workspace: Uuid, id: Uuid) -> sqlx::Result<Option<TokenRecord>> {
    sqlx::query_as(&format!(
        "UPDATE tokens SET revoked_at = COALESCE(revoked_at, now())
         WHERE workspace_id = $1 AND id = $2 RETURNING {COLUMNS}"
    ))
    .bind(workspace)
    .bind(id)
    .fetch_optional(db)
    .await
}
