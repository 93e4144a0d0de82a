//! Resealing: secrets sealed with an older key, or before key ids, are sealed again with the
//! newest key and bound to their row, so that an operator can remove the older key.
//!
//! A pass runs when the server starts (the key file is read then) and again now and then, for
//! values another replica still holding an older file sealed meanwhile. Each row is replaced
//! only if it still holds what was read, so replicas never undo each other's work, and a replica
//! that lacks a value's key leaves the row alone.

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::auth::Keys;
use crate::auth::seal::{self, Row};
use crate::store;

/// Rows read at a time.
const BATCH: i64 = 100;
/// Between passes.
pub const EVERY: Duration = Duration::from_secs(600);

pub async fn run(db: PgPool, keys: Arc<Keys>, stop: CancellationToken) {
    loop {
        match tick(&db, &keys).await {
            Ok(pass) if pass.resealed > 0 || pass.unopened > 0 => tracing::info!(
                resealed = pass.resealed,
                unopened = pass.unopened,
                key = %keys.newest().id,
                "secrets resealed with the newest key"
            ),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "resealing pass failed"),
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(EVERY) => {}
        }
    }
}

/// What a pass did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Pass {
    pub resealed: usize,
    /// Values that did not open with this server's keys: left as they are, their workers fail.
    pub unopened: usize,
}

/// Reseals every value not sealed with the newest key, row by row.
pub async fn tick(db: &PgPool, keys: &Keys) -> anyhow::Result<Pass> {
    let newest = keys.newest().id.as_str();
    let mut pass = Pass::default();
    let mut after = None;
    loop {
        let rows = store::secrets::not_sealed_with(db, newest, after, BATCH).await?;
        after = rows.last().map(|r| r.id);
        for r in &rows {
            let at = Row { workspace: r.workspace_id, name: &r.name };
            match seal::reseal(keys, at, r.key_id.as_deref(), &r.sealed) {
                Ok(Some(resealed)) => {
                    if store::secrets::reseal(db, r.id, &r.sealed, &resealed).await? {
                        pass.resealed += 1;
                    }
                }
                Ok(None) => {}
                Err(why) => {
                    tracing::warn!(secret = %r.name, workspace = %r.workspace_id, %why, "a secret does not open");
                    pass.unopened += 1;
                }
            }
        }
        if rows.len() < BATCH as usize {
            return Ok(pass);
        }
    }
}
