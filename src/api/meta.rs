//! The `metadata` every object answers with.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Serialize;
use utoipa::ToSchema;
use uuid::Uuid;

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ObjectMeta {
    pub name: String,
    /// The workspace the object belongs to.
    pub namespace: String,
    pub uid: Uuid,
    pub created_at: DateTime<Utc>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}
