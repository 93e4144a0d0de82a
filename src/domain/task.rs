//! A task template: what a worker runs, with what resources, mounting which drives.

use std::collections::{BTreeMap, HashSet};

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::image::ImageRef;
use super::path::{MountPath, SubPath};
use super::quantity::CpuCores;
use super::{Name, Problems};

const MAX_TEXT: usize = 4096;
const MAX_ARG: usize = 128 * 1024;
const MAX_ARGS: usize = 1024;
const MAX_ENV: usize = 1024;
const MAX_REFS: usize = 64;
/// Bytes of what a worker carries to its machine (command, args, env, mounts): every
/// assignment of the run repeats them, and a machine's agent holds them all.
pub const MAX_TASK_BYTES: usize = 256 * 1024;
const MAX_MEMORY: u64 = 1 << 50;
/// Thirty days.
const MAX_TIME_LIMIT: u64 = 30 * 24 * 3600;
/// Restarts a worker may have when its run sets none.
pub const DEFAULT_RESTART_LIMIT: u32 = 3;
/// Each restart holds the worker's machine for up to its backoff: a hundred is days of it.
pub const MAX_RESTART_LIMIT: u32 = 100;
/// The key of an `image_pull_secret` that holds the registry auth file.
pub const PULL_AUTH_KEY: &str = "AUTH_JSON";

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskTemplate {
    /// The container image the worker runs, pulled by the machine: `busybox:1.36` is
    /// `docker.io/library/busybox:1.36`.
    #[schema(example = "busybox:1.36")]
    pub image: String,
    #[schema(example = "sh")]
    pub command: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// `OnFailure` starts a worker that failed while it ran (a non-zero exit, killed, out of
    /// memory, past its time limit) again on the same machine, after a backoff.
    #[serde(default)]
    pub restart_policy: RestartPolicy,
    /// How many times `OnFailure` starts a worker again before it fails for good (default 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 100)]
    pub restart_limit: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 2592000)]
    pub time_limit_seconds: Option<u64>,
    pub requested_resources: Resources,
    #[serde(default)]
    pub datavolume_refs: Vec<DataVolumeRef>,
    #[serde(default)]
    pub secret_refs: Vec<SecretRef>,
    /// A workspace secret whose key `AUTH_JSON` holds a registry auth file, as `podman login`
    /// writes it (`{"auths": {"registry.example": {"auth": "…"}}}`): used to pull `image`.
    /// Its keys do not become environment variables of the worker unless it is also in
    /// `secret_refs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_secret: Option<Name>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub enum RestartPolicy {
    #[default]
    Never,
    OnFailure,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Resources {
    pub cpu_cores: CpuCores,
    #[schema(minimum = 1, example = 268435456)]
    pub memory_bytes: u64,
    #[serde(default)]
    pub gpus: u32,
    #[serde(default)]
    pub node_selection: NodeSelection,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NodeSelection {
    #[serde(default)]
    pub mode: SelectionMode,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub names: Vec<Name>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub enum SelectionMode {
    /// Any machine of the cluster.
    #[default]
    Any,
    /// One of `names`.
    Exact,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema, sqlx::Type)]
#[sqlx(type_name = "text")]
pub enum Mode {
    #[default]
    ReadOnly,
    ReadWrite,
}

/// A drive mounted into a worker.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DataVolumeRef {
    pub name: Name,
    /// Defaults to the drive's own `mount_path`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mount_path: Option<MountPath>,
    /// Defaults to the drive's own `mode`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<Mode>,
    /// One folder of the drive instead of all of it.
    #[serde(default, skip_serializing_if = "SubPath::is_empty")]
    pub sub_path: SubPath,
}

/// A secret whose keys become environment variables of the worker.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SecretRef {
    pub name: Name,
}

/// Whether `s` can name an environment variable.
pub fn is_env_name(s: &str) -> bool {
    let mut bytes = s.bytes();
    matches!(bytes.next(), Some(b) if b == b'_' || b.is_ascii_alphabetic())
        && bytes.all(|b| b == b'_' || b.is_ascii_alphanumeric())
        && s.len() <= 256
}

fn check_text(p: &mut Problems, path: &str, value: &str, max: usize, required: bool) {
    if required && value.trim().is_empty() {
        p.add(path, "must not be empty");
    } else if value.len() > max {
        p.add(path, format!("is longer than {max} bytes"));
    } else if value.contains('\0') {
        p.add(path, "must not contain a NUL byte");
    }
}

impl TaskTemplate {
    /// Rules serde cannot express, reported against `at` (e.g. `spec.task_template`).
    pub fn check(&self, at: &str, p: &mut Problems) {
        if let Err(why) = ImageRef::parse(&self.image) {
            p.add(format!("{at}.image"), why);
        }
        check_text(p, &format!("{at}.command"), &self.command, MAX_TEXT, true);
        if self.args.len() > MAX_ARGS {
            p.add(format!("{at}.args"), format!("has more than {MAX_ARGS} arguments"));
        }
        for (i, arg) in self.args.iter().enumerate() {
            check_text(p, &format!("{at}.args[{i}]"), arg, MAX_ARG, false);
        }
        if self.env.len() > MAX_ENV {
            p.add(format!("{at}.env"), format!("has more than {MAX_ENV} variables"));
        }
        for (name, value) in &self.env {
            if !is_env_name(name) {
                p.add(
                    format!("{at}.env.{name}"),
                    "is not a variable name: use letters, digits and '_', not starting with a digit",
                );
            }
            check_text(p, &format!("{at}.env.{name}"), value, MAX_ARG, false);
        }
        if let Some(t) = self.time_limit_seconds
            && (t == 0 || t > MAX_TIME_LIMIT)
        {
            p.add(
                format!("{at}.time_limit_seconds"),
                format!("must be between 1 and {MAX_TIME_LIMIT} (30 days)"),
            );
        }
        if let Some(limit) = self.restart_limit {
            if self.restart_policy != RestartPolicy::OnFailure {
                p.add(format!("{at}.restart_limit"), "is only used with restart_policy OnFailure");
            } else if limit > MAX_RESTART_LIMIT {
                p.add(format!("{at}.restart_limit"), format!("must be at most {MAX_RESTART_LIMIT}"));
            }
        }
        self.requested_resources.check(&format!("{at}.requested_resources"), p);
        if self.datavolume_refs.len() > MAX_REFS {
            p.add(format!("{at}.datavolume_refs"), format!("has more than {MAX_REFS} drives"));
        }
        let mut mounts = HashSet::new();
        for (i, r) in self.datavolume_refs.iter().enumerate() {
            if let Some(m) = &r.mount_path
                && !mounts.insert(m.as_str())
            {
                p.add(
                    format!("{at}.datavolume_refs[{i}].mount_path"),
                    format!("{m} is already used by another drive of this task"),
                );
            }
        }
        if self.secret_refs.len() > MAX_REFS {
            p.add(format!("{at}.secret_refs"), format!("has more than {MAX_REFS} secrets"));
        }
        let sizes = self.sizes();
        let total: usize = sizes.iter().map(|(_, n)| n).sum();
        if total > MAX_TASK_BYTES {
            // Named after the part that weighs most, since that is the one to trim.
            let (field, most) = sizes.iter().max_by_key(|(_, n)| *n).expect("not empty");
            p.add(
                format!("{at}.{field}"),
                format!(
                    "the task's command, args, env and mounts take {total} bytes, more than {MAX_TASK_BYTES}; \
                     {field} takes {most}"
                ),
            );
        }
        let mut secrets = HashSet::new();
        for (i, s) in self.secret_refs.iter().enumerate() {
            if !secrets.insert(&s.name) {
                p.add(format!("{at}.secret_refs[{i}].name"), format!("{} is listed twice", s.name));
            }
        }
    }
}

impl TaskTemplate {
    /// The bytes each part of what a worker carries takes, by field.
    fn sizes(&self) -> [(&'static str, usize); 5] {
        let refs = self.datavolume_refs.iter().map(|r| {
            r.name.as_str().len()
                + r.mount_path.as_ref().map_or(0, |m| m.as_str().len())
                + r.sub_path.as_str().len()
        });
        let secrets = self.secret_refs.iter().map(|s| s.name.as_str().len());
        [
            ("command", self.command.len() + self.image.len()),
            ("args", self.args.iter().map(String::len).sum()),
            ("env", self.env.iter().map(|(k, v)| k.len() + v.len()).sum()),
            ("datavolume_refs", refs.sum()),
            ("secret_refs", secrets.sum()),
        ]
    }

    /// The bytes a worker of this task carries, as [`MAX_TASK_BYTES`] counts them.
    pub fn size(&self) -> usize {
        self.sizes().iter().map(|(_, n)| n).sum()
    }
}

impl Resources {
    fn check(&self, at: &str, p: &mut Problems) {
        if self.memory_bytes == 0 || self.memory_bytes > MAX_MEMORY {
            p.add(format!("{at}.memory_bytes"), "must be between 1 byte and 1 PiB");
        }
        if self.gpus > 1024 {
            p.add(format!("{at}.gpus"), "must be at most 1024");
        }
        let sel = &self.node_selection;
        match sel.mode {
            SelectionMode::Any if !sel.names.is_empty() => {
                p.add(format!("{at}.node_selection.names"), "names are only used with mode Exact");
            }
            SelectionMode::Exact if sel.names.is_empty() => {
                p.add(format!("{at}.node_selection.names"), "mode Exact needs at least one machine name");
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template(json: serde_json::Value) -> TaskTemplate {
        serde_json::from_value(json).unwrap()
    }

    fn problems(t: &TaskTemplate) -> Vec<(String, String)> {
        let mut p = Problems::default();
        t.check("t", &mut p);
        p.finish().err().unwrap_or_default().into_iter().map(|e| (e.path, e.message)).collect()
    }

    fn base() -> serde_json::Value {
        serde_json::json!({
            "image": "busybox:1.36", "command": "sh",
            "requested_resources": {"cpu_cores": 1, "memory_bytes": 268435456}
        })
    }

    #[test]
    fn a_minimal_template_passes() {
        assert!(problems(&template(base())).is_empty());
    }

    #[test]
    fn each_rule_names_its_field() {
        let cases = [
            ("image", serde_json::json!(""), "t.image"),
            ("image", serde_json::json!("busy box"), "t.image"),
            ("command", serde_json::json!("  "), "t.command"),
            ("env", serde_json::json!({"1BAD": "x"}), "t.env.1BAD"),
            ("time_limit_seconds", serde_json::json!(0), "t.time_limit_seconds"),
            ("restart_limit", serde_json::json!(2), "t.restart_limit"),
            (
                "datavolume_refs",
                serde_json::json!([{"name": "a", "mount_path": "/d"}, {"name": "b", "mount_path": "/d"}]),
                "t.datavolume_refs[1].mount_path",
            ),
            ("secret_refs", serde_json::json!([{"name": "s"}, {"name": "s"}]), "t.secret_refs[1].name"),
        ];
        for (field, value, path) in cases {
            let mut json = base();
            json[field] = value;
            let found = problems(&template(json));
            assert!(found.iter().any(|(p, _)| p == path), "{field}: {found:?}");
        }
    }

    #[test]
    fn exact_selection_needs_names_and_any_takes_none() {
        let mut json = base();
        json["requested_resources"]["node_selection"] = serde_json::json!({"mode": "Exact"});
        assert_eq!(problems(&template(json.clone()))[0].0, "t.requested_resources.node_selection.names");
        json["requested_resources"]["node_selection"] =
            serde_json::json!({"mode": "Any", "names": ["gpu-01"]});
        assert_eq!(problems(&template(json))[0].0, "t.requested_resources.node_selection.names");
    }

    #[test]
    fn an_image_pull_secret_is_a_name_and_is_echoed_only_when_given() {
        let t = template(base());
        assert!(t.image_pull_secret.is_none());
        assert!(serde_json::to_value(&t).unwrap().get("image_pull_secret").is_none());
        let mut json = base();
        json["image_pull_secret"] = serde_json::json!("registry");
        let t = template(json.clone());
        assert!(problems(&t).is_empty());
        assert_eq!(serde_json::to_value(&t).unwrap()["image_pull_secret"], "registry");
        json["image_pull_secret"] = serde_json::json!("Not A Name");
        assert!(serde_json::from_value::<TaskTemplate>(json).is_err());
    }

    #[test]
    fn a_task_past_its_byte_budget_is_refused_naming_its_heaviest_field() {
        let value = "v".repeat(100 * 1024);
        // 3 × 100 KiB of env = 300 KiB > 256 KiB, each value within its own 128 KiB.
        let mut json = base();
        json["env"] = serde_json::json!({"A": value, "B": value, "C": value});
        let found = problems(&template(json));
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].0, "t.env");
        assert!(found[0].1.contains("more than 262144"), "{}", found[0].1);
        // 2 × 100 KiB of args and 100 KiB of env: args weigh most.
        let mut json = base();
        json["args"] = serde_json::json!([value, value]);
        json["env"] = serde_json::json!({"A": value});
        assert_eq!(problems(&template(json))[0].0, "t.args");
        // 2 × 100 KiB in all is within the budget.
        let mut json = base();
        json["args"] = serde_json::json!([value, value]);
        assert!(problems(&template(json)).is_empty());
        let mut json = base();
        let refs: Vec<_> = (0..65).map(|i| serde_json::json!({"name": format!("s{i}")})).collect();
        json["secret_refs"] = serde_json::json!(refs);
        assert_eq!(problems(&template(json))[0].0, "t.secret_refs");
    }

    #[test]
    fn a_restart_limit_goes_with_on_failure_and_up_to_its_cap() {
        let mut json = base();
        json["restart_policy"] = serde_json::json!("OnFailure");
        let t = template(json.clone());
        assert!(problems(&t).is_empty() && t.restart_limit.is_none());
        json["restart_limit"] = serde_json::json!(100);
        assert!(problems(&template(json.clone())).is_empty());
        json["restart_limit"] = serde_json::json!(101);
        assert_eq!(
            problems(&template(json.clone())),
            [("t.restart_limit".to_owned(), "must be at most 100".to_owned())]
        );
        json["restart_limit"] = serde_json::json!(-1);
        assert!(serde_json::from_value::<TaskTemplate>(json).is_err());
    }

    #[test]
    fn env_names_follow_the_shell() {
        assert!(is_env_name("HF_HOME") && is_env_name("_x1"));
        assert!(!is_env_name("1X") && !is_env_name("A-B") && !is_env_name(""));
    }
}
