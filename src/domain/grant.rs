//! Host-path grants: the folders of a cluster's machines a workspace may mount, and whether
//! its workers may write there.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::path::AbsPath;
use super::task::Mode;

/// A folder granted to a workspace on a cluster: drives may use it and what lies below it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Grant {
    pub path: AbsPath,
    /// `ReadWrite` lets workers mount what lies below read-write when they ask; `ReadOnly`
    /// (the default) mounts it read-only whatever they ask.
    #[serde(default)]
    pub mode: Mode,
}

/// A grant as a request gives it: a path alone (granted `ReadOnly`, the shape grants had before
/// they had a mode) or a path with its mode.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(
    untagged,
    expecting = "an absolute path, or {\"path\": an absolute path, \"mode\": \"ReadOnly\" or \"ReadWrite\"}"
)]
pub enum GrantInput {
    #[schema(value_type = String, example = "/scratch/ml")]
    Path(AbsPath),
    Grant(Grant),
}

impl From<GrantInput> for Grant {
    fn from(g: GrantInput) -> Grant {
        match g {
            GrantInput::Path(path) => Grant { path, mode: Mode::ReadOnly },
            GrantInput::Grant(g) => g,
        }
    }
}

/// The grant that covers `path`: the deepest of those it lies within, so a narrower grant
/// decides for what lies below it.
pub fn covering<'a>(grants: &'a [Grant], path: &AbsPath) -> Option<&'a Grant> {
    grants.iter().filter(|g| path.is_within(&g.path)).max_by_key(|g| g.path.components().count())
}

/// Why a host path may not be mounted as asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// No grant covers the path.
    Uncovered,
    /// Read-write was asked under this read-only grant.
    ReadOnly(AbsPath),
}

/// The grant under which `path` is mounted with `mode`, or why it may not be.
pub fn allow<'a>(grants: &'a [Grant], path: &AbsPath, mode: Mode) -> Result<&'a Grant, Refused> {
    let grant = covering(grants, path).ok_or(Refused::Uncovered)?;
    if mode == Mode::ReadWrite && grant.mode == Mode::ReadOnly {
        return Err(Refused::ReadOnly(grant.path.clone()));
    }
    Ok(grant)
}

/// `path` relative to `grant`, which covers it: its components below the grant's.
pub fn beneath(path: &AbsPath, grant: &AbsPath) -> String {
    path.components().skip(grant.components().count()).collect::<Vec<_>>().join("/")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(path: &str, mode: Mode) -> Grant {
        Grant { path: AbsPath::parse(path).unwrap(), mode }
    }

    #[test]
    fn the_deepest_grant_covers_a_path() {
        let grants = [grant("/scratch", Mode::ReadWrite), grant("/scratch/ml", Mode::ReadOnly)];
        let covers = |p: &str| covering(&grants, &AbsPath::parse(p).unwrap()).map(|g| g.mode);
        assert_eq!(covers("/scratch/ml/food101"), Some(Mode::ReadOnly));
        assert_eq!(covers("/scratch/mlx"), Some(Mode::ReadWrite));
        assert_eq!(covers("/scratch"), Some(Mode::ReadWrite));
        assert_eq!(covers("/data"), None);
        let allowed = |p: &str, m| allow(&grants, &AbsPath::parse(p).unwrap(), m).map(|g| g.path.to_string());
        assert_eq!(allowed("/scratch/x", Mode::ReadWrite), Ok("/scratch".into()));
        assert_eq!(allowed("/scratch/ml/x", Mode::ReadOnly), Ok("/scratch/ml".into()));
        assert_eq!(
            allowed("/scratch/ml/x", Mode::ReadWrite),
            Err(Refused::ReadOnly(AbsPath::parse("/scratch/ml").unwrap()))
        );
        assert_eq!(allowed("/data", Mode::ReadOnly), Err(Refused::Uncovered));
        let p = AbsPath::parse("/scratch/ml/a/b").unwrap();
        assert_eq!(beneath(&p, &AbsPath::parse("/scratch/ml").unwrap()), "a/b");
        assert_eq!(beneath(&p, &p), "");
    }

    #[test]
    fn a_grant_is_a_path_alone_or_a_path_with_its_mode() {
        let read = |v: serde_json::Value| serde_json::from_value::<GrantInput>(v).map(Grant::from);
        assert_eq!(read(serde_json::json!("/scratch")).unwrap(), grant("/scratch", Mode::ReadOnly));
        assert_eq!(
            read(serde_json::json!({"path": "/scratch", "mode": "ReadWrite"})).unwrap(),
            grant("/scratch", Mode::ReadWrite)
        );
        assert_eq!(read(serde_json::json!({"path": "/scratch"})).unwrap(), grant("/scratch", Mode::ReadOnly));
        for bad in [
            serde_json::json!("scratch"),
            serde_json::json!({"path": "/scratch", "mode": "rw"}),
            serde_json::json!({"path": "/scratch", "other": 1}),
        ] {
            let err = read(bad.clone()).unwrap_err().to_string();
            assert!(err.contains("an absolute path, or"), "{bad}: {err}");
        }
    }
}
