//! Container image references, parsed with the distribution grammar that registries use.

use std::fmt;
use std::str::FromStr;

use oci_spec::distribution::Reference;

/// A valid image reference, with its registry and tag made explicit: `busybox:1.36` is
/// `docker.io/library/busybox:1.36`, as Docker and Kubernetes read it. Pulling by the full
/// name leaves podman no short name to resolve (which it refuses without a terminal).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRef(Reference);

impl ImageRef {
    pub fn parse(s: &str) -> Result<ImageRef, String> {
        if s.trim().is_empty() {
            return Err("must not be empty".into());
        }
        if s.len() > 512 {
            return Err("is longer than 512 bytes".into());
        }
        Reference::from_str(s).map(ImageRef).map_err(|e| format!("{s:?} is not an image reference: {e}"))
    }

    /// Whether the tag may point at another image tomorrow: such an image is pulled again
    /// before each worker, where a pinned one is pulled once per machine.
    pub fn is_floating(&self) -> bool {
        self.0.digest().is_none() && self.0.tag().is_none_or(|t| t == "latest")
    }
}

impl fmt::Display for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_names_get_their_registry_and_tag() {
        let cases = [
            ("busybox:1.36", "docker.io/library/busybox:1.36", false),
            ("busybox", "docker.io/library/busybox:latest", true),
            ("pytorch/pytorch:2.4.0-cuda12.1", "docker.io/pytorch/pytorch:2.4.0-cuda12.1", false),
            ("ghcr.io/org/train:v1", "ghcr.io/org/train:v1", false),
            ("127.0.0.1:5000/tools/fill:3", "127.0.0.1:5000/tools/fill:3", false),
        ];
        for (given, full, floating) in cases {
            let image = ImageRef::parse(given).unwrap();
            assert_eq!((image.to_string().as_str(), image.is_floating()), (full, floating), "{given}");
        }
        let pinned = format!("busybox@sha256:{}", "a".repeat(64));
        assert!(!ImageRef::parse(&pinned).unwrap().is_floating());
    }

    #[test]
    fn malformed_references_are_refused() {
        for bad in ["", "Busybox:1", "busybox:", "a b", "busybox@sha256:12", "-x/y", "x//y"] {
            assert!(ImageRef::parse(bad).is_err(), "{bad:?}");
        }
    }
}
