//! podman, called by absolute path with an environment of the agent's own: nothing a worker
//! sets (its `PATH`, a `bin/` in its copy) can change which program runs on the host.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use serde::Deserialize;
use tokio::process::Command;
use uuid::Uuid;

use super::container::{LABEL_GPUS, LABEL_HOME, LABEL_WORKER};
use crate::settings::RuntimeArgs;

/// How the agent runs containers: which podman and OCI runtime, and what operators allow.
#[derive(Debug, Clone)]
pub struct Config {
    pub podman: PathBuf,
    pub runc: PathBuf,
    /// Registries, mirrors and their trust (`CONTAINERS_REGISTRIES_CONF`); podman's default when
    /// unset.
    pub registries_conf: Option<PathBuf>,
    /// Where images and containers live (`CONTAINERS_STORAGE_CONF`); podman's default when unset.
    pub storage_conf: Option<PathBuf>,
    /// Capabilities workers keep; all others are dropped.
    pub capabilities: Vec<String>,
    /// The CDI kind of this machine's GPUs, e.g. `nvidia.com/gpu`.
    pub gpu_kind: String,
    /// How long a stopped worker has between SIGTERM and SIGKILL.
    pub stop_grace: Duration,
    /// Free bytes to keep on the disk that holds images (`agent::images`).
    pub image_keep_free_bytes: u64,
}

impl Config {
    /// Finds podman and runc on the agent's own PATH now, unless given.
    pub fn from_args(args: &RuntimeArgs) -> anyhow::Result<Config> {
        let find = |given: &Option<PathBuf>, name: &str| -> anyhow::Result<PathBuf> {
            let path = match given {
                Some(p) => p.clone(),
                None => which::which(name)
                    .with_context(|| format!("{name} is not on PATH: install it or pass --{name}"))?,
            };
            anyhow::ensure!(path.is_absolute(), "--{name} {}: give an absolute path", path.display());
            Ok(path)
        };
        Ok(Config {
            podman: find(&args.podman, "podman")?,
            runc: find(&args.runc, "runc")?,
            registries_conf: args.registries_conf.clone(),
            storage_conf: args.storage_conf.clone(),
            capabilities: args.allow_capabilities.iter().filter(|c| !c.is_empty()).cloned().collect(),
            gpu_kind: args.gpu_kind.clone(),
            stop_grace: Duration::from_secs(args.stop_grace_seconds),
            image_keep_free_bytes: args.image_keep_free_bytes,
        })
    }
}

#[derive(Debug, Clone)]
pub struct Podman {
    config: Config,
}

/// A container of this agent's, as `podman ps` lists it.
#[derive(Debug, Clone)]
pub struct Found {
    pub id: String,
    pub worker: Uuid,
    pub gpus: Vec<u32>,
}

/// An image this machine holds.
#[derive(Debug, Clone, PartialEq)]
pub struct Image {
    pub id: String,
    pub names: Vec<String>,
    pub digest: String,
    pub bytes: u64,
    /// When it was built, in seconds since the epoch.
    pub created: i64,
    /// Containers made from it, whatever their state: podman removes no image they use.
    pub containers: u64,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct PsEntry {
    id: String,
    #[serde(default)]
    labels: Option<std::collections::HashMap<String, String>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ImageEntry {
    id: String,
    #[serde(default)]
    names: Option<Vec<String>>,
    #[serde(default)]
    digest: String,
    #[serde(default)]
    size: u64,
    #[serde(default)]
    created: i64,
    #[serde(default)]
    containers: u64,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct InspectEntry {
    state: InspectState,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct InspectState {
    status: String,
    exit_code: i32,
}

/// A container's state: whether it still runs, and its exit code once it does not.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum State {
    Running,
    Exited(i32),
    /// Created but never started.
    Created,
}

impl Podman {
    pub fn new(config: Config) -> Podman {
        Podman { config }
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    fn command(&self) -> Command {
        let mut cmd = Command::new(&self.config.podman);
        cmd.env_clear()
            .env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
            .env("HOME", std::env::var_os("HOME").unwrap_or_else(|| "/root".into()))
            .env("LC_ALL", "C.UTF-8");
        if let Some(conf) = &self.config.registries_conf {
            cmd.env("CONTAINERS_REGISTRIES_CONF", conf);
        }
        if let Some(conf) = &self.config.storage_conf {
            cmd.env("CONTAINERS_STORAGE_CONF", conf);
        }
        // cgroupfs: the agent keeps each worker's parent cgroup by path (agent/cgroup.rs).
        cmd.arg("--runtime").arg(&self.config.runc).args(["--cgroup-manager", "cgroupfs"]);
        cmd.stdin(Stdio::null()).kill_on_drop(true);
        cmd
    }

    /// Runs `podman args…` and returns its stdout, or its own words for why it failed.
    /// `env` is podman's own environment, for the worker's variables passed by name.
    async fn run(
        &self,
        args: impl IntoIterator<Item = impl AsRef<OsStr>>,
        env: &[(String, String)],
    ) -> Result<String, String> {
        let mut cmd = self.command();
        cmd.args(args).envs(env.iter().map(|(k, v)| (k, v)));
        let out = cmd.output().await.map_err(|e| format!("{}: {e}", self.config.podman.display()))?;
        if out.status.success() {
            return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
        }
        Err(reason(&String::from_utf8_lossy(&out.stderr), out.status))
    }

    pub async fn has_image(&self, image: &str) -> bool {
        self.run(&["image", "exists", image], &[]).await.is_ok()
    }

    /// Pulls `image`; with `auth_file` for a private registry.
    pub async fn pull(&self, image: &str, auth_file: Option<&Path>) -> Result<(), String> {
        let auth = auth_file.map(|f| f.display().to_string());
        let mut args = vec!["pull", "--quiet"];
        if let Some(auth) = &auth {
            args.extend(["--authfile", auth.as_str()]);
        }
        args.push(image);
        self.run(&args, &[]).await.map(drop)
    }

    /// `podman create …`; the container's id.
    pub async fn create(&self, args: Vec<OsString>, env: &[(String, String)]) -> Result<String, String> {
        self.run(args, env).await.map(|id| id.trim().to_owned())
    }

    pub async fn start(&self, id: &str) -> Result<(), String> {
        self.run(&["start", id], &[]).await.map(drop)
    }

    /// Waits for the container to end; its exit code.
    pub async fn wait(&self, id: &str) -> Result<i32, String> {
        let out = self.run(&["wait", id], &[]).await?;
        out.trim().parse().map_err(|_| format!("podman wait answered {out:?}"))
    }

    pub async fn state(&self, id: &str) -> Result<State, String> {
        let out = self.run(&["container", "inspect", id], &[]).await?;
        let entries: Vec<InspectEntry> =
            serde_json::from_str(&out).map_err(|e| format!("podman inspect: {e}"))?;
        let state = &entries.first().ok_or("podman inspect found nothing")?.state;
        Ok(match state.status.as_str() {
            "running" | "paused" | "stopping" => State::Running,
            "created" | "configured" | "initialized" => State::Created,
            _ => State::Exited(state.exit_code),
        })
    }

    /// SIGTERM, then SIGKILL after the grace period.
    pub async fn stop(&self, id: &str) {
        let grace = self.config.stop_grace.as_secs().to_string();
        if let Err(e) = self.run(&["stop", "--time", &grace, id], &[]).await {
            tracing::warn!(container = id, error = %e, "cannot stop a container");
        }
    }

    pub async fn remove(&self, id: &str) {
        if let Err(e) = self.run(&["rm", "--force", "--time", "0", id], &[]).await {
            tracing::warn!(container = id, error = %e, "cannot remove a container");
        }
    }

    /// The containers of the agent whose data location is `home`.
    pub async fn own(&self, home: &str) -> Result<Vec<Found>, String> {
        let filter = format!("label={LABEL_HOME}={home}");
        let out = self.run(&["ps", "--all", "--filter", &filter, "--format", "json"], &[]).await?;
        let entries: Vec<PsEntry> = serde_json::from_str(&out).map_err(|e| format!("podman ps: {e}"))?;
        Ok(entries
            .into_iter()
            .filter_map(|e| {
                let labels = e.labels?;
                let worker = labels.get(LABEL_WORKER)?.parse().ok()?;
                let gpus =
                    labels.get(LABEL_GPUS).map(|l| l.split(',').filter_map(|i| i.parse().ok()).collect());
                Some(Found { id: e.id, worker, gpus: gpus.unwrap_or_default() })
            })
            .collect())
    }

    /// The images this machine holds.
    pub async fn images(&self) -> Result<Vec<Image>, String> {
        let out = self.run(&["images", "--format", "json"], &[]).await?;
        let entries: Vec<ImageEntry> =
            serde_json::from_str(&out).map_err(|e| format!("podman images: {e}"))?;
        Ok(entries
            .into_iter()
            .map(|e| Image {
                id: e.id,
                names: e.names.unwrap_or_default(),
                digest: e.digest,
                bytes: e.size,
                created: e.created,
                containers: e.containers,
            })
            .collect())
    }

    /// Removes an image no container uses (podman refuses one that a container does).
    pub async fn remove_image(&self, id: &str) -> Result<(), String> {
        self.run(&["rmi", id], &[]).await.map(drop)
    }

    /// Where podman keeps images: the disk whose free space decides what is removed.
    pub async fn graph_root(&self) -> Result<PathBuf, String> {
        let out = self.run(&["info", "--format", "{{.Store.GraphRoot}}"], &[]).await?;
        Ok(PathBuf::from(out.trim()))
    }
}

/// podman's own reason: the last line it wrote, without its `Error: ` prefix.
fn reason(stderr: &str, status: std::process::ExitStatus) -> String {
    let line = stderr.lines().rev().map(str::trim).find(|l| !l.is_empty());
    match line {
        Some(l) => l.strip_prefix("Error: ").unwrap_or(l).to_owned(),
        None => format!("podman ended with {status}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    #[test]
    fn the_reason_is_podmans_last_line() {
        let stderr = "Trying to pull 127.0.0.1:1/x:1...\nError: initializing source docker://127.0.0.1:1/x:1: connection refused\n\n";
        let status = std::process::ExitStatus::from_raw(125 << 8);
        assert_eq!(
            reason(stderr, status),
            "initializing source docker://127.0.0.1:1/x:1: connection refused"
        );
        assert_eq!(reason("", status), "podman ended with exit status: 125");
    }
}
