//! A drive's copy on a machine: the states it moves through.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `Filling` until the agent reports the copy's marker, `Complete` then, `Failed` when its fill
/// failed, `Evicting` until the agent reports its folder gone. A copy being evicted is not
/// listed.
// `copies.state` holds exactly these names (`copies_state_check`, see `store::rules`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema, sqlx::Type)]
#[sqlx(type_name = "text")]
pub enum CopyState {
    Filling,
    Complete,
    Failed,
    Evicting,
}

/// Files a whole copy lost since it was filled: missing, or of another size than its manifest
/// lists. The copy is no longer whole, and is filled again when next needed.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LostFiles {
    /// How many in all.
    pub count: u64,
    /// The first of them by path, relative to the copy.
    #[schema(max_items = 20)]
    pub named: Vec<String>,
}

impl LostFiles {
    /// Paths named at most.
    pub const NAMED: usize = 20;
    /// The longest path named, in bytes.
    pub const MAX_PATH_BYTES: usize = 4096;

    /// `1 file`, `3 files`.
    pub fn files(&self) -> String {
        if self.count == 1 { "1 file".to_owned() } else { format!("{} files", self.count) }
    }

    /// Why an agent's report of lost files cannot be taken, and the field (under its own) at fault.
    pub fn invalid(&self) -> Option<(String, String)> {
        if self.named.is_empty() || self.named.len() > Self::NAMED {
            return Some(("named".into(), format!("must name 1 to {} paths", Self::NAMED)));
        }
        if self.count < self.named.len() as u64 {
            return Some(("count".into(), "must count at least the paths named".into()));
        }
        let bad = |p: &String| {
            p.is_empty()
                || p.len() > Self::MAX_PATH_BYTES
                || p.starts_with('/')
                || p.chars().any(char::is_control)
        };
        self.named.iter().position(bad).map(|i| {
            let why = format!(
                "must be a relative path of 1 to {} bytes without control characters",
                Self::MAX_PATH_BYTES
            );
            (format!("named[{i}]"), why)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_state_is_read_by_its_name_and_an_unknown_one_is_an_error() {
        for state in [CopyState::Filling, CopyState::Complete, CopyState::Failed, CopyState::Evicting] {
            let name = serde_json::to_value(state).unwrap();
            assert_eq!(name, format!("{state:?}"));
            assert_eq!(serde_json::from_value::<CopyState>(name).unwrap(), state);
        }
        for unknown in ["Filled", "filling", ""] {
            assert!(serde_json::from_value::<CopyState>(unknown.into()).is_err(), "{unknown:?}");
        }
    }

    #[test]
    fn lost_files_are_taken_only_within_their_bounds() {
        let lost = |count: u64, named: &[&str]| LostFiles {
            count,
            named: named.iter().map(|s| s.to_string()).collect(),
        };
        assert_eq!(lost(2, &["a/b", "c"]).invalid(), None);
        let long = "x".repeat(LostFiles::MAX_PATH_BYTES + 1);
        let many: Vec<String> = (0..21).map(|i| i.to_string()).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        for (bad, field) in [
            (lost(0, &[]), "named"),
            (lost(30, &many), "named"),
            (lost(1, &["a", "b"]), "count"),
            (lost(2, &["a", ""]), "named[1]"),
            (lost(1, &["/etc/passwd"]), "named[0]"),
            (lost(1, &[long.as_str()]), "named[0]"),
            (lost(1, &["a\nb"]), "named[0]"),
        ] {
            assert_eq!(bad.invalid().map(|(f, _)| f), Some(field.to_owned()), "{bad:?}");
        }
    }
}
