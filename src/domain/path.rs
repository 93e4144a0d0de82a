//! Paths users write: absolute host and mount paths, and sub-paths inside a copy.
//!
//! Both are kept in one normal form (no `.`, `..` or empty components, no NUL), so comparing
//! them component by component is enough to know whether one lies inside another.

use std::fmt;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

const MAX_LEN: usize = 4096;
const MAX_COMPONENT: usize = 255;

/// Splits `body` (the part of `s` after any leading '/') into normal components, refusing
/// anything that could step outside its root.
fn components<'a>(s: &str, body: &'a str) -> Result<Vec<&'a str>, String> {
    if s.len() > MAX_LEN {
        return Err(format!("is longer than {MAX_LEN} bytes"));
    }
    if s.contains('\0') {
        return Err("must not contain a NUL byte".into());
    }
    let trimmed = body.strip_suffix('/').unwrap_or(body);
    if trimmed.is_empty() {
        return Ok(Vec::new());
    }
    let mut parts = Vec::new();
    for part in trimmed.split('/') {
        match part {
            "" => return Err(format!("{s:?} has an empty component ('//')")),
            "." | ".." => return Err(format!("{s:?} must not contain '{part}'")),
            p if p.len() > MAX_COMPONENT => {
                return Err(format!("{s:?} has a component longer than {MAX_COMPONENT} bytes"));
            }
            p => parts.push(p),
        }
    }
    Ok(parts)
}

/// An absolute, normalised path such as `/datasets/food101`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(try_from = "String", into = "String")]
#[schema(value_type = String, example = "/data")]
pub struct AbsPath(String);

impl AbsPath {
    pub fn parse(s: &str) -> Result<AbsPath, String> {
        let Some(rest) = s.strip_prefix('/') else {
            return Err(format!("{s:?} is not an absolute path"));
        };
        let parts = components(s, rest)?;
        Ok(AbsPath(format!("/{}", parts.join("/"))))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn is_root(&self) -> bool {
        self.0 == "/"
    }

    pub fn components(&self) -> impl Iterator<Item = &str> {
        self.0.split('/').filter(|c| !c.is_empty())
    }

    /// Whether `self` is `root` or lies below it, by whole components:
    /// `/data` holds `/data/x` but not `/database`.
    pub fn is_within(&self, root: &AbsPath) -> bool {
        let mut mine = self.components();
        root.components().all(|r| mine.next() == Some(r))
    }
}

impl TryFrom<String> for AbsPath {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        AbsPath::parse(&s)
    }
}

impl From<AbsPath> for String {
    fn from(p: AbsPath) -> String {
        p.0
    }
}

impl fmt::Display for AbsPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where a worker sees a drive. Absolute, and not over the sandbox's own system folders.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(try_from = "String", into = "String")]
#[schema(value_type = String, example = "/data")]
pub struct MountPath(AbsPath);

/// First components a sandbox keeps for itself.
const RESERVED: [&str; 10] = ["bin", "dev", "etc", "lib", "lib32", "lib64", "proc", "sbin", "sys", "usr"];

impl MountPath {
    pub fn parse(s: &str) -> Result<MountPath, String> {
        let path = AbsPath::parse(s)?;
        if path.is_root() {
            return Err("must not be '/'".into());
        }
        let first = path.components().next().unwrap_or_default();
        if RESERVED.contains(&first) {
            return Err(format!("{s:?} is inside /{first}, which the sandbox keeps for itself"));
        }
        // podman's volume syntax (`source:target:ro`) separates with these.
        if s.contains([':', ',']) {
            return Err(format!("{s:?} must not contain ':' or ','"));
        }
        Ok(MountPath(path))
    }

    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }
}

impl TryFrom<String> for MountPath {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        MountPath::parse(&s)
    }
}

impl From<MountPath> for String {
    fn from(p: MountPath) -> String {
        p.0.0
    }
}

impl fmt::Display for MountPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A relative path inside a copy, such as `food101/data`; empty means the copy itself.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(try_from = "String", into = "String")]
#[schema(value_type = String, example = "food101/data")]
pub struct SubPath(String);

impl SubPath {
    pub fn parse(s: &str) -> Result<SubPath, String> {
        if s.starts_with('/') {
            return Err(format!("{s:?} must be relative to the drive, not absolute"));
        }
        Ok(SubPath(components(s, s)?.join("/")))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn components(&self) -> impl Iterator<Item = &str> {
        self.0.split('/').filter(|c| !c.is_empty())
    }
}

impl TryFrom<String> for SubPath {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        SubPath::parse(&s)
    }
}

impl From<SubPath> for String {
    fn from(p: SubPath) -> String {
        p.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absolute_paths_are_normalised_or_refused() {
        assert_eq!(AbsPath::parse("/data/").unwrap().as_str(), "/data");
        assert_eq!(AbsPath::parse("/").unwrap().as_str(), "/");
        for (bad, why) in [
            ("data", "not an absolute path"),
            ("", "not an absolute path"),
            ("/data/../etc", "'..'"),
            ("/data/./x", "'.'"),
            ("//data", "empty component"),
            ("/data//x", "empty component"),
            ("/da\0ta", "NUL"),
        ] {
            let err = AbsPath::parse(bad).unwrap_err();
            assert!(err.contains(why), "{bad:?}: {err}");
        }
    }

    #[test]
    fn within_compares_whole_components() {
        let root = AbsPath::parse("/data").unwrap();
        let p = |s| AbsPath::parse(s).unwrap();
        assert!(p("/data").is_within(&root));
        assert!(p("/data/x/y").is_within(&root));
        assert!(!p("/database").is_within(&root));
        assert!(!p("/").is_within(&root));
        assert!(!p("/data/foo").is_within(&p("/data/fo")));
        assert!(p("/anything").is_within(&p("/")));
    }

    #[test]
    fn mount_paths_keep_off_system_folders() {
        assert_eq!(MountPath::parse("/data").unwrap().as_str(), "/data");
        assert!(MountPath::parse("/").unwrap_err().contains("'/'"));
        assert!(MountPath::parse("/usr/share/x").unwrap_err().contains("/usr"));
        assert!(MountPath::parse("/proc").unwrap_err().contains("/proc"));
        assert_eq!(MountPath::parse("/usrdata").unwrap().as_str(), "/usrdata");
    }

    #[test]
    fn sub_paths_stay_inside_their_drive() {
        assert_eq!(SubPath::parse("").unwrap().as_str(), "");
        assert_eq!(SubPath::parse("food101/data/").unwrap().as_str(), "food101/data");
        for (bad, why) in [
            ("/etc", "must be relative"),
            ("..", "'..'"),
            ("a/../../b", "'..'"),
            ("a//b", "empty component"),
            ("a\0", "NUL"),
        ] {
            let err = SubPath::parse(bad).unwrap_err();
            assert!(err.contains(why), "{bad:?}: {err}");
        }
    }
}

#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    use super::*;

    /// Path-ish strings: components drawn from names, dots, empties and odd bytes.
    fn pathish() -> impl Strategy<Value = String> {
        let part = prop_oneof![
            Just("".to_string()),
            Just(".".to_string()),
            Just("..".to_string()),
            Just("%2e%2e".to_string()),
            Just("a\0b".to_string()),
            "[a-z0-9._-]{1,8}",
            "\\PC{1,4}",
        ];
        (any::<bool>(), prop::collection::vec(part, 0..8))
            .prop_map(|(abs, parts)| format!("{}{}", if abs { "/" } else { "" }, parts.join("/")))
    }

    proptest! {
        /// Whatever parses as a sub-path joins below its root and never climbs out of it.
        #[test]
        fn a_sub_path_never_leaves_its_root(s in pathish()) {
            if let Ok(sub) = SubPath::parse(&s) {
                let root = AbsPath::parse("/data/drives/ws.d").unwrap();
                let joined = if sub.is_empty() { root.to_string() } else { format!("{root}/{}", sub.as_str()) };
                let joined = AbsPath::parse(&joined).expect("a joined sub-path is a normal path");
                prop_assert!(joined.is_within(&root));
                prop_assert!(sub.components().all(|c| c != ".." && c != "." && !c.is_empty()));
                prop_assert!(!sub.as_str().contains('\0'));
            }
        }

        /// A host path inside a grant stays inside it by components, and parsing is idempotent.
        #[test]
        fn absolute_paths_are_normal_and_within_compares_components(s in pathish(), g in pathish()) {
            if let (Ok(p), Ok(grant)) = (AbsPath::parse(&s), AbsPath::parse(&g)) {
                prop_assert_eq!(AbsPath::parse(p.as_str()).unwrap(), p.clone());
                let by_prefix = p.as_str() == grant.as_str()
                    || grant.is_root()
                    || p.as_str().starts_with(&format!("{}/", grant.as_str()));
                prop_assert_eq!(p.is_within(&grant), by_prefix);
            }
        }
    }
}
