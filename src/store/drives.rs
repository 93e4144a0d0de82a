//! The `drives` table.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use sqlx::types::Json;
use sqlx::{PgConnection, PgExecutor};
use uuid::Uuid;

use super::Page;
use crate::domain::drive::DriveSpec;

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct DriveRecord {
    pub id: Uuid,
    pub workspace_id: Uuid,
    pub name: String,
    pub labels: Json<BTreeMap<String, String>>,
    pub spec: Json<DriveSpec>,
    pub created_at: DateTime<Utc>,
}

const COLUMNS: &str = "id, workspace_id, name, labels, spec, created_at";

pub async fn insert(
    db: impl PgExecutor<'_>,
    workspace: Uuid,
    name: &str,
    labels: &BTreeMap<String, String>,
    spec: &DriveSpec,
) -> sqlx::Result<DriveRecord> {
    sqlx::query_as(&format!(
        "INSERT INTO drives (id, workspace_id, name, cluster, labels, spec)
         VALUES ($1, $2, $3, $4, $5, $6) RETURNING {COLUMNS}"
    ))
    .bind(Uuid::now_v7())
    .bind(workspace)
    .bind(name)
    .bind(spec.cluster.as_str())
    .bind(Json(labels))
    .bind(Json(spec))
    .fetch_one(db)
    .await
}

pub async fn get(db: impl PgExecutor<'_>, workspace: Uuid, name: &str) -> sqlx::Result<Option<DriveRecord>> {
    sqlx::query_as(&format!("SELECT {COLUMNS} FROM drives WHERE workspace_id = $1 AND name = $2"))
        .bind(workspace)
        .bind(name)
        .fetch_optional(db)
        .await
}

/// The drives named by these (workspace, name) pairs that exist, in one query.
pub async fn get_many(
    db: impl PgExecutor<'_>,
    workspaces: &[Uuid],
    names: &[String],
) -> sqlx::Result<Vec<DriveRecord>> {
    if names.is_empty() {
        return Ok(Vec::new());
    }
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM drives
         WHERE (workspace_id, name) IN (SELECT * FROM unnest($1::uuid[], $2::text[]))"
    ))
    .bind(workspaces)
    .bind(names)
    .fetch_all(db)
    .await
}

pub async fn list(db: impl PgExecutor<'_>, workspace: Uuid, page: Page) -> sqlx::Result<Vec<DriveRecord>> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM drives WHERE workspace_id = $1 AND ($2::uuid IS NULL OR id < $2)
         ORDER BY id DESC LIMIT $3"
    ))
    .bind(workspace)
    .bind(page.before)
    .bind(page.limit)
    .fetch_all(db)
    .await
}

/// Locks the named drives against deletion until the transaction ends; returns those found.
pub async fn lock_for_share(
    tx: &mut PgConnection,
    workspace: Uuid,
    names: &[String],
) -> sqlx::Result<Vec<DriveRecord>> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM drives WHERE workspace_id = $1 AND name = ANY($2) FOR SHARE"
    ))
    .bind(workspace)
    .bind(names)
    .fetch_all(tx)
    .await
}

/// Locks one drive for deletion; `None` when the workspace has no such drive.
pub async fn lock_for_delete(
    tx: &mut PgConnection,
    workspace: Uuid,
    name: &str,
) -> sqlx::Result<Option<Uuid>> {
    sqlx::query_scalar("SELECT id FROM drives WHERE workspace_id = $1 AND name = $2 FOR UPDATE")
        .bind(workspace)
        .bind(name)
        .fetch_optional(tx)
        .await
}

/// Deletes the drive; every replica forgets the drives it kept for assignments (the
/// `drives_announced` trigger, see `store::rules`).
pub async fn delete(db: impl PgExecutor<'_>, id: Uuid) -> sqlx::Result<()> {
    sqlx::query("DELETE FROM drives WHERE id = $1").bind(id).execute(db).await.map(drop)
}
