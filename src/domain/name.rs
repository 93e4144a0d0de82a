//! Object names: DNS labels (RFC 1123), as Kubernetes names its objects.

use std::fmt;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A DNS label: 1–63 of `a-z`, `0-9` and `-`, starting and ending with a letter or digit.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, ToSchema)]
#[serde(try_from = "String", into = "String")]
#[schema(value_type = String, pattern = "^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$", example = "food101")]
pub struct Name(String);

impl Name {
    pub fn parse(s: &str) -> Result<Name, String> {
        if s.is_empty() {
            return Err("must not be empty".into());
        }
        if s.len() > 63 {
            return Err(format!("{s:?} is longer than 63 characters"));
        }
        if !s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-') {
            return Err(format!("{s:?} is not a DNS label: use lower-case letters, digits and '-'"));
        }
        if s.starts_with('-') || s.ends_with('-') {
            return Err(format!("{s:?} must start and end with a letter or digit"));
        }
        Ok(Name(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Whether `s` could name a stored run or worker. Those may be longer than a [`Name`]: a fill run
/// is `fill-<drive>-<machine>` and a worker `<run>-<index>`, but they are spelled the same way.
/// Anything else names nothing and need not be looked up.
pub fn could_name_object(s: &str) -> bool {
    (1..=253).contains(&s.len())
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

impl TryFrom<String> for Name {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        Name::parse(&s)
    }
}

impl From<Name> for String {
    fn from(n: Name) -> String {
        n.0
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_dns_labels() {
        for ok in ["a", "food101", "gpu-01", "x".repeat(63).as_str()] {
            assert_eq!(Name::parse(ok).unwrap().as_str(), ok);
        }
    }

    #[test]
    fn object_names_may_be_longer_than_names_but_not_spelled_otherwise() {
        // fill-<63>-<63>-0: 5 + 63 + 1 + 63 + 2 = 134 characters.
        let fill_worker = format!("fill-{}-{}-0", "d".repeat(63), "m".repeat(63));
        assert!(could_name_object(&fill_worker) && could_name_object("inspect-food101-0"));
        for bad in ["", "a\0b", "run/x", "Food", "a b", "(", &"x".repeat(254)] {
            assert!(!could_name_object(bad), "{bad:?}");
        }
    }

    #[test]
    fn refuses_everything_else() {
        for (bad, why) in [
            ("", "must not be empty"),
            ("Food101", "not a DNS label"),
            ("food_101", "not a DNS label"),
            ("-food", "start and end"),
            ("food-", "start and end"),
            ("a.b", "not a DNS label"),
            (&"x".repeat(64), "longer than 63"),
        ] {
            let err = Name::parse(bad).unwrap_err();
            assert!(err.contains(why), "{bad:?}: {err}");
        }
    }
}
