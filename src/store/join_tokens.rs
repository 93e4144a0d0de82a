//! The `join_tokens` table: hashes of the tokens machines join a cluster with.

use chrono::{DateTime, Utc};
use sqlx::PgExecutor;
use uuid::Uuid;

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct JoinTokenRecord {
    pub id: Uuid,
    pub cluster: String,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub revoked_at: Option<DateTime<Utc>>,
    /// Machines it may still admit.
    pub uses_left: i32,
}

const COLUMNS: &str = "id, cluster, created_at, expires_at, revoked_at, uses_left";

pub async fn insert(
    db: impl PgExecutor<'_>,
    cluster: &str,
    hash: &[u8],
    expires_at: DateTime<Utc>,
    uses: i32,
) -> sqlx::Result<JoinTokenRecord> {
    sqlx::query_as(&format!(
        "INSERT INTO join_tokens (id, cluster, secret_hash, expires_at, uses_left) VALUES ($1, $2, $3, $4, $5)
         RETURNING {COLUMNS}"
    ))
    .bind(Uuid::now_v7())
    .bind(cluster)
    .bind(hash)
    .bind(expires_at)
    .bind(uses)
    .fetch_one(db)
    .await
}

/// Takes one use of an active join token; the cluster it admits to. Run inside the join's
/// transaction: a join that fails gives the use back.
pub async fn use_one(db: impl PgExecutor<'_>, hash: &[u8]) -> sqlx::Result<Option<String>> {
    sqlx::query_scalar(
        "UPDATE join_tokens SET uses_left = uses_left - 1
         WHERE secret_hash = $1 AND revoked_at IS NULL AND expires_at > now() AND uses_left > 0
         RETURNING cluster",
    )
    .bind(hash)
    .fetch_optional(db)
    .await
}

pub async fn list(db: impl PgExecutor<'_>, cluster: &str) -> sqlx::Result<Vec<JoinTokenRecord>> {
    sqlx::query_as(&format!("SELECT {COLUMNS} FROM join_tokens WHERE cluster = $1 ORDER BY id DESC"))
        .bind(cluster)
        .fetch_all(db)
        .await
}

pub async fn revoke(
    db: impl PgExecutor<'_>,
    cluster: &str,
    id: Uuid,
) -> sqlx::Result<Option<JoinTokenRecord>> {
    sqlx::query_as(&format!(
        "UPDATE join_tokens SET revoked_at = COALESCE(revoked_at, now()) WHERE cluster = $1 AND id = $2
         RETURNING {COLUMNS}"
    ))
    .bind(cluster)
    .bind(id)
    .fetch_optional(db)
    .await
}
