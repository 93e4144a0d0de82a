//! Drives: where a dataset lives, how workers see it, and how a machine's copy is filled.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::path::{AbsPath, MountPath, SubPath};
use super::task::{Mode, SelectionMode, TaskTemplate};
use super::{Name, Problems};

/// One exabyte: more than any data location holds.
const MAX_SIZE_HINT: u64 = 1 << 60;

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DriveSpec {
    /// The cluster whose machines hold the drive.
    #[serde(default = "default_cluster")]
    pub cluster: Name,
    pub sources: Vec<Source>,
    /// A machine without a copy is chosen only if its data location has this much free.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, example = 6000000000u64)]
    pub size_hint_bytes: Option<u64>,
    /// Copies no worker uses may be removed when a data location fills, least recently used first.
    #[serde(default)]
    pub evictable: bool,
    #[serde(default)]
    pub transport: Transport,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fill: Option<Fill>,
}

/// `<namespace>.<drive>`: how messages and folders name a drive.
pub fn full_name(namespace: &str, drive: &str) -> String {
    format!("{namespace}.{drive}")
}

pub fn default_cluster() -> Name {
    Name::parse("main").expect("a valid name")
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Source {
    /// `placed`: a copy in each machine's data location; `shared`: the same path on every machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_scope: Option<NodeScope>,
    /// The one machine that holds the data, with `path` on its disk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<Name>,
    /// Inside the copy for `placed` (empty: all of it); an absolute host path otherwise.
    #[serde(default)]
    pub path: String,
    pub mount_path: MountPath,
    #[serde(default)]
    pub mode: Mode,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum NodeScope {
    Placed,
    Shared,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub enum Transport {
    /// Runs elsewhere read the data over the network.
    #[default]
    Auto,
    /// Every run that mounts the drive goes to its machine.
    Local,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Fill {
    /// The fill run's worker. It must write `/drive/.astralyx-filled` last.
    pub template: TaskTemplate,
}

/// Where a source's bytes are, once its fields have been checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// In each machine's copy, at this folder of it.
    Placed(SubPath),
    /// At the same path on every machine.
    Shared(AbsPath),
    /// On one machine's disk.
    Node(Name, AbsPath),
}

impl Source {
    /// Reads `node_scope`/`node` and `path` together; `at` is the source's field path.
    pub fn location(&self, at: &str) -> Result<Location, (String, String)> {
        let path_err = |e: String| (format!("{at}.path"), e);
        match (&self.node_scope, &self.node) {
            (Some(_), Some(_)) => {
                Err((format!("{at}.node"), "give either node_scope or node, not both".into()))
            }
            (None, None) => Err((
                format!("{at}.node_scope"),
                "give node_scope (placed or shared), or node and path".into(),
            )),
            (Some(NodeScope::Placed), None) => {
                SubPath::parse(&self.path).map(Location::Placed).map_err(path_err)
            }
            (Some(NodeScope::Shared), None) => {
                AbsPath::parse(&self.path).map(Location::Shared).map_err(path_err)
            }
            (None, Some(node)) => {
                AbsPath::parse(&self.path).map(|p| Location::Node(node.clone(), p)).map_err(path_err)
            }
        }
    }
}

impl DriveSpec {
    /// Cross-field rules; host-path grants need the database and are checked by the caller.
    pub fn check(&self, p: &mut Problems) {
        let Some(location) = self.location_checked(p) else { return };
        if let Some(size) = self.size_hint_bytes
            && (size == 0 || size > MAX_SIZE_HINT)
        {
            p.add("spec.size_hint_bytes", "must be between 1 byte and 1 EiB");
        }
        if self.transport == Transport::Local && !matches!(location, Location::Node(..)) {
            p.add("spec.transport", "Local applies only to a drive on one machine (node and path)");
        }
        match (&location, &self.fill) {
            (Location::Placed(_), None) => {
                p.add("spec.fill", "a drive kept on each machine needs fill.template to fill its copies");
            }
            (Location::Placed(_), Some(fill)) => fill.check(p),
            (_, Some(_)) => p.add("spec.fill", "only a drive with node_scope placed is filled"),
            (_, None) => {}
        }
    }

    fn location_checked(&self, p: &mut Problems) -> Option<Location> {
        if self.sources.len() != 1 {
            p.add("spec.sources", format!("a drive has exactly one source, found {}", self.sources.len()));
            return None;
        }
        match self.sources[0].location("spec.sources[0]") {
            Ok(l) => Some(l),
            Err((path, message)) => {
                p.add(path, message);
                None
            }
        }
    }

    pub fn source(&self) -> &Source {
        &self.sources[0]
    }

    /// The checked location of the drive's one source.
    pub fn location(&self) -> Location {
        self.source().location("").expect("checked when the drive was created")
    }
}

impl Fill {
    fn check(&self, p: &mut Problems) {
        let at = "spec.fill.template";
        self.template.check(at, p);
        if !self.template.datavolume_refs.is_empty() {
            p.add(format!("{at}.datavolume_refs"), "a fill template may not mount drives");
        }
        if self.template.requested_resources.node_selection.mode != SelectionMode::Any {
            p.add(
                format!("{at}.requested_resources.node_selection"),
                "a fill runs on the machine that needs the copy: leave node_selection out",
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The recipe's drive.json, as written.
    fn recipe_spec() -> serde_json::Value {
        json!({
            "sources": [{"node_scope": "placed", "path": "", "mount_path": "/data", "mode": "ReadOnly"}],
            "size_hint_bytes": 6000000000u64,
            "evictable": true,
            "fill": {"template": {
                "image": "python:3.12-slim", "command": "sh",
                "args": ["-c", "touch /drive/.astralyx-filled"],
                "env": {"HF_HOME": "/tmp/hf"}, "time_limit_seconds": 7200,
                "requested_resources": {"cpu_cores": 2, "memory_bytes": 4294967296u64}
            }}
        })
    }

    fn problems(spec: serde_json::Value) -> Vec<(String, String)> {
        let spec: DriveSpec = serde_json::from_value(spec).unwrap();
        let mut p = Problems::default();
        spec.check(&mut p);
        p.finish().err().unwrap_or_default().into_iter().map(|e| (e.path, e.message)).collect()
    }

    #[test]
    fn the_recipe_drive_is_valid_and_placed() {
        assert!(problems(recipe_spec()).is_empty());
        let spec: DriveSpec = serde_json::from_value(recipe_spec()).unwrap();
        assert_eq!(spec.location(), Location::Placed(SubPath::default()));
        assert_eq!(spec.cluster.as_str(), "main");
    }

    #[test]
    fn each_rule_names_its_field() {
        type Edit = fn(&mut serde_json::Value);
        let cases: [(Edit, &str, &str); 9] = [
            (|s| s["sources"] = json!([]), "spec.sources", "exactly one source"),
            (|s| s["sources"][0]["node"] = json!("gpu-01"), "spec.sources[0].node", "not both"),
            (
                |s| s["sources"][0] = json!({"path": "", "mount_path": "/data"}),
                "spec.sources[0].node_scope",
                "give node_scope",
            ),
            (|s| s["sources"][0]["path"] = json!("../x"), "spec.sources[0].path", "'..'"),
            (|s| s["size_hint_bytes"] = json!(0), "spec.size_hint_bytes", "between"),
            (|s| s["transport"] = json!("Local"), "spec.transport", "one machine"),
            (|s| s["fill"] = json!(null), "spec.fill", "needs fill.template"),
            (
                |s| s["fill"]["template"]["datavolume_refs"] = json!([{"name": "other"}]),
                "spec.fill.template.datavolume_refs",
                "may not mount drives",
            ),
            (
                |s| {
                    s["sources"][0] =
                        json!({"node_scope": "shared", "path": "/lustre/food101", "mount_path": "/data"})
                },
                "spec.fill",
                "only a drive with node_scope placed",
            ),
        ];
        for (edit, path, why) in cases {
            let mut spec = recipe_spec();
            edit(&mut spec);
            let found = problems(spec);
            assert_eq!(found.len(), 1, "{path}: {found:?}");
            assert_eq!(found[0].0, path);
            assert!(found[0].1.contains(why), "{path}: {}", found[0].1);
        }
    }

    #[test]
    fn a_scope_or_transport_is_read_by_its_name_and_an_unknown_one_is_an_error() {
        // The scheduler reads both from JSON its claim builds in SQL, as the spec spells them.
        for (name, scope) in [("placed", NodeScope::Placed), ("shared", NodeScope::Shared)] {
            assert_eq!(serde_json::from_value::<NodeScope>(json!(name)).unwrap(), scope);
            assert_eq!(serde_json::to_value(scope).unwrap(), json!(name));
        }
        for (name, transport) in [("Auto", Transport::Auto), ("Local", Transport::Local)] {
            assert_eq!(serde_json::from_value::<Transport>(json!(name)).unwrap(), transport);
            assert_eq!(serde_json::to_value(transport).unwrap(), json!(name));
        }
        for unknown in ["node", "Placed", ""] {
            assert!(serde_json::from_value::<NodeScope>(json!(unknown)).is_err(), "{unknown:?}");
        }
        for unknown in ["Remote", "local", ""] {
            assert!(serde_json::from_value::<Transport>(json!(unknown)).is_err(), "{unknown:?}");
        }
    }

    #[test]
    fn a_drive_on_one_machine_reads_its_path() {
        let spec: DriveSpec = serde_json::from_value(json!({
            "sources": [{"node": "gpu-01", "path": "/datasets/food101", "mount_path": "/data", "mode": "ReadWrite"}],
            "transport": "Auto"
        }))
        .unwrap();
        let mut p = Problems::default();
        spec.check(&mut p);
        assert!(p.is_empty());
        assert_eq!(
            spec.location(),
            Location::Node(Name::parse("gpu-01").unwrap(), AbsPath::parse("/datasets/food101").unwrap())
        );
    }
}
