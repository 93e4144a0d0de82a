//! The `secrets` table. Values are stored sealed; only key names are ever read back to users.

use chrono::{DateTime, Utc};
use sqlx::PgExecutor;
use uuid::Uuid;

use super::Page;
use crate::auth::seal::Sealed;

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct SecretRecord {
    pub id: Uuid,
    pub name: String,
    pub keys: Vec<String>,
    pub created_at: DateTime<Utc>,
}

const COLUMNS: &str = "id, name, keys, created_at";

pub async fn insert(
    db: impl PgExecutor<'_>,
    workspace: Uuid,
    name: &str,
    keys: &[String],
    sealed: &Sealed,
) -> sqlx::Result<SecretRecord> {
    sqlx::query_as(&format!(
        "INSERT INTO secrets (id, workspace_id, name, keys, sealed, key_id) VALUES ($1, $2, $3, $4, $5, $6)
         RETURNING {COLUMNS}"
    ))
    .bind(Uuid::now_v7())
    .bind(workspace)
    .bind(name)
    .bind(keys)
    .bind(&sealed.bytes)
    .bind(&sealed.key_id)
    .fetch_one(db)
    .await
}

pub async fn get(db: impl PgExecutor<'_>, workspace: Uuid, name: &str) -> sqlx::Result<Option<SecretRecord>> {
    sqlx::query_as(&format!("SELECT {COLUMNS} FROM secrets WHERE workspace_id = $1 AND name = $2"))
        .bind(workspace)
        .bind(name)
        .fetch_optional(db)
        .await
}

pub async fn list(db: impl PgExecutor<'_>, workspace: Uuid, page: Page) -> sqlx::Result<Vec<SecretRecord>> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM secrets WHERE workspace_id = $1 AND ($2::uuid IS NULL OR id < $2)
         ORDER BY id DESC LIMIT $3"
    ))
    .bind(workspace)
    .bind(page.before)
    .bind(page.limit)
    .fetch_all(db)
    .await
}

/// Names of the given secrets that exist in the workspace.
pub async fn existing(
    db: impl PgExecutor<'_>,
    workspace: Uuid,
    names: &[String],
) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar("SELECT name FROM secrets WHERE workspace_id = $1 AND name = ANY($2)")
        .bind(workspace)
        .bind(names)
        .fetch_all(db)
        .await
}

pub async fn delete(db: impl PgExecutor<'_>, workspace: Uuid, name: &str) -> sqlx::Result<bool> {
    let done = sqlx::query("DELETE FROM secrets WHERE workspace_id = $1 AND name = $2")
        .bind(workspace)
        .bind(name)
        .execute(db)
        .await?;
    Ok(done.rows_affected() == 1)
}

/// A secret's sealed value, as stored.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct SealedRow {
    pub id: Uuid,
    pub workspace_id: Uuid,
    pub name: String,
    /// The key that sealed it; `None` when sealed before key ids.
    pub key_id: Option<String>,
    pub sealed: Vec<u8>,
}

/// The sealed values of the secrets named by these (workspace, name) pairs that exist.
pub async fn sealed_many(
    db: impl PgExecutor<'_>,
    workspaces: &[Uuid],
    names: &[String],
) -> sqlx::Result<Vec<SealedRow>> {
    if names.is_empty() {
        return Ok(Vec::new());
    }
    sqlx::query_as(
        "SELECT id, workspace_id, name, key_id, sealed FROM secrets
         WHERE (workspace_id, name) IN (SELECT * FROM unnest($1::uuid[], $2::text[]))",
    )
    .bind(workspaces)
    .bind(names)
    .fetch_all(db)
    .await
}

/// Up to `limit` values not sealed with key `newest`, after id `after`, in id order.
pub async fn not_sealed_with(
    db: impl PgExecutor<'_>,
    newest: &str,
    after: Option<Uuid>,
    limit: i64,
) -> sqlx::Result<Vec<SealedRow>> {
    sqlx::query_as(
        "SELECT id, workspace_id, name, key_id, sealed FROM secrets
         WHERE key_id IS DISTINCT FROM $1 AND ($2::uuid IS NULL OR id > $2) ORDER BY id LIMIT $3",
    )
    .bind(newest)
    .bind(after)
    .bind(limit)
    .fetch_all(db)
    .await
}

/// Replaces a value with `resealed` if it is still `old`: a replica that resealed it first, or
/// a secret deleted meanwhile, leaves nothing to do. Returns whether it was replaced. Watchers
/// hear nothing: `secrets_modified` records only what a secret shows (see `store::rules`).
pub async fn reseal(db: impl PgExecutor<'_>, id: Uuid, old: &[u8], resealed: &Sealed) -> sqlx::Result<bool> {
    let done = sqlx::query("UPDATE secrets SET sealed = $3, key_id = $4 WHERE id = $1 AND sealed = $2")
        .bind(id)
        .bind(old)
        .bind(&resealed.bytes)
        .bind(&resealed.key_id)
        .execute(db)
        .await?;
    Ok(done.rows_affected() == 1)
}

/// A run not yet ended, or a drive's fill, that references the secret (in `secret_refs` or as
/// its `image_pull_secret`): `run NAME` / `drive NAME`.
pub async fn user(db: impl PgExecutor<'_>, workspace: Uuid, name: &str) -> sqlx::Result<Option<String>> {
    let refs = serde_json::json!([{ "name": name }]);
    sqlx::query_scalar(
        "(SELECT 'run ' || name FROM runs WHERE workspace_id = $1 AND state NOT IN ('Completed', 'Failed')
             AND (spec #> '{task_template,secret_refs}' @> $2
                  OR spec #>> '{task_template,image_pull_secret}' = $3) LIMIT 1)
         UNION ALL
         (SELECT 'drive ' || name FROM drives WHERE workspace_id = $1
             AND (spec #> '{fill,template,secret_refs}' @> $2
                  OR spec #>> '{fill,template,image_pull_secret}' = $3) LIMIT 1)
         LIMIT 1",
    )
    .bind(workspace)
    .bind(refs)
    .bind(name)
    .fetch_optional(db)
    .await
}
