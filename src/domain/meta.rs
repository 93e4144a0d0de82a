//! What every object's `metadata` holds when a user writes it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{Name, Problems};

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MetaInput {
    pub name: Name,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

const MAX_LABELS: usize = 64;

fn is_label_key(k: &str) -> bool {
    (1..=63).contains(&k.len())
        && k.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'/'))
}

impl MetaInput {
    pub fn check(&self, p: &mut Problems) {
        if self.labels.len() > MAX_LABELS {
            p.add("metadata.labels", format!("has more than {MAX_LABELS} labels"));
        }
        for (k, v) in &self.labels {
            if !is_label_key(k) {
                p.add(
                    format!("metadata.labels.{k}"),
                    "is not a label key: 1-63 letters, digits, '-', '_', '.' or '/'",
                );
            } else if v.len() > 63 || v.contains('\0') {
                p.add(format!("metadata.labels.{k}"), "value must be at most 63 bytes, without NUL");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_keys_and_values_are_bounded() {
        let meta: MetaInput = serde_json::from_value(serde_json::json!({
            "name": "food101",
            "labels": {"dataset": "food101", "bad key": "x", "long": "v".repeat(64)}
        }))
        .unwrap();
        let mut p = Problems::default();
        meta.check(&mut p);
        let paths: Vec<_> = p.finish().unwrap_err().into_iter().map(|e| e.path).collect();
        assert_eq!(paths, ["metadata.labels.bad key", "metadata.labels.long"]);
    }
}
