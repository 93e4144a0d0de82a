//! What `podman create` is told for a worker: a pure function of the worker, so the isolation
//! it asks for can be read, and tested, in one place.

use std::ffi::OsString;
use std::path::PathBuf;

use uuid::Uuid;

use crate::protocol::Limits;

/// The label that ties a container to its worker; an agent that restarts finds its own by it.
pub const LABEL_WORKER: &str = "io.astraeus.worker";
/// The agent's data location: several agents may share a host (dev mode), each minds its own.
pub const LABEL_HOME: &str = "io.astraeus.home";
/// The GPU indices a container holds, so a restarted agent gives them to no other worker.
pub const LABEL_GPUS: &str = "io.astraeus.gpus";
/// Host user ids per workspace: a whole 16-bit range, so images' own users map inside it.
pub const IDS_PER_WORKSPACE: u32 = 1 << 16;
/// Workspace ranges start above the ranges Debian hands out in /etc/subuid (from 100000 up).
const FIRST_ID: u32 = 1 << 31;
/// Bytes of output kept on the machine per worker before conmon starts its file again.
const LOG_FILE_MAX: u64 = 64 << 20;
/// Processes a worker may have at once: a fork bomb stops there.
pub const PIDS_LIMIT: u32 = 4096;

/// The host user ids that a workspace's containers run as: its root is `base` on the host.
pub fn id_base(slot: u32) -> Result<u32, String> {
    // The last range would end at u32::MAX, which is no user id (it means -1).
    let last = (u32::MAX - FIRST_ID) / IDS_PER_WORKSPACE - 1;
    if slot > last {
        return Err(format!("workspace number {slot} has no range of user ids (at most {last})"));
    }
    Ok(FIRST_ID + slot * IDS_PER_WORKSPACE)
}

/// A drive as podman sees it: a folder the agent bound (`mounts::stage`), and where it goes.
#[derive(Debug, Clone, PartialEq)]
pub struct Bind {
    pub source: PathBuf,
    pub target: String,
    pub read_only: bool,
}

/// A soft and hard limit, as `setrlimit` takes them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ulimit {
    pub soft: u64,
    pub hard: u64,
}

/// Everything `podman create` needs for one worker.
#[derive(Debug)]
pub struct Container {
    pub worker: Uuid,
    pub hostname: String,
    pub home: String,
    pub image: String,
    pub command: String,
    pub args: Vec<String>,
    /// A file of `NAME=value` lines, readable by the agent alone.
    pub env_file: Option<PathBuf>,
    /// Variables whose value podman takes from its own environment (values holding a newline,
    /// which an env file cannot carry); only the names are on the command line.
    pub env_inherited: Vec<String>,
    pub binds: Vec<Bind>,
    /// Where conmon writes the worker's output (`output::follow_file` reads it).
    pub log_file: PathBuf,
    pub limits: Limits,
    pub id_base: u32,
    pub cgroup_parent: String,
    /// The machine's GPU indices the worker holds, and the CDI devices that give them to it
    /// (`nvidia.com/gpu=0`; none where the host has no CDI spec for its GPUs).
    pub gpus: Vec<u32>,
    pub devices: Vec<String>,
    /// Capabilities an operator allows (`--allow-capabilities`); every other one is dropped.
    pub capabilities: Vec<String>,
    pub nofile: Ulimit,
    pub nproc: Ulimit,
    pub stop_grace_seconds: u64,
}

/// The container's name: one per worker, so creating it twice fails instead of running twice.
pub fn name(worker: Uuid) -> String {
    format!("astraeus-{worker}")
}

/// The arguments after `podman`: `create … image args…`.
pub fn create_args(c: &Container) -> Vec<OsString> {
    let mut a: Vec<String> = vec!["create".into(), "--name".into(), name(c.worker)];
    pair(&mut a, "--label", format!("{LABEL_WORKER}={}", c.worker));
    pair(&mut a, "--label", format!("{LABEL_HOME}={}", c.home));
    if !c.gpus.is_empty() {
        let list: Vec<String> = c.gpus.iter().map(u32::to_string).collect();
        pair(&mut a, "--label", format!("{LABEL_GPUS}={}", list.join(",")));
    }
    pair(&mut a, "--hostname", c.hostname.clone());
    // The agent pulls first, with its own backoff and reasons; `missing` covers an image that
    // another agent of the host removed since, for room.
    pair(&mut a, "--pull", "missing".into());
    // catatonit as pid 1: a stop's SIGTERM reaches the worker, and its orphans are reaped.
    a.push("--init".into());
    a.push("--cap-drop=all".into());
    for cap in &c.capabilities {
        a.push(format!("--cap-add={cap}"));
    }
    pair(&mut a, "--security-opt", "no-new-privileges".into());
    pair(&mut a, "--pids-limit", PIDS_LIMIT.to_string());
    pair(&mut a, "--memory", c.limits.memory_bytes.to_string());
    // No swap beyond the memory asked for: over it the worker is killed, and says so.
    pair(&mut a, "--memory-swap", c.limits.memory_bytes.to_string());
    pair(&mut a, "--cpus", format!("{}", c.limits.cpu_cores));
    pair(&mut a, "--cgroup-parent", c.cgroup_parent.clone());
    let ids = format!("0:{}:{IDS_PER_WORKSPACE}", c.id_base);
    pair(&mut a, "--uidmap", ids.clone());
    pair(&mut a, "--gidmap", ids);
    // Outbound access (fills download) through a user-mode stack that has no way to the
    // host's own loopback services.
    pair(&mut a, "--network", "slirp4netns:allow_host_loopback=false".into());
    pair(&mut a, "--ulimit", format!("nofile={}:{}", c.nofile.soft, c.nofile.hard));
    pair(&mut a, "--ulimit", format!("nproc={}:{}", c.nproc.soft, c.nproc.hard));
    pair(&mut a, "--log-driver", "k8s-file".into());
    pair(&mut a, "--log-opt", format!("path={}", c.log_file.display()));
    // The agent ships lines as they come; the file only has to hold what is not shipped yet.
    pair(&mut a, "--log-opt", format!("max-size={LOG_FILE_MAX}"));
    pair(&mut a, "--stop-timeout", c.stop_grace_seconds.to_string());
    if let Some(file) = &c.env_file {
        pair(&mut a, "--env-file", file.display().to_string());
    }
    for name in &c.env_inherited {
        pair(&mut a, "--env", name.clone());
    }
    for b in &c.binds {
        let mode = if b.read_only { "ro" } else { "rw" };
        pair(&mut a, "--volume", format!("{}:{}:{mode}", b.source.display(), b.target));
    }
    for d in &c.devices {
        pair(&mut a, "--device", d.clone());
    }
    // The task's command replaces the image's entrypoint and its args the image's command, as
    // Kubernetes reads `command` and `args`.
    pair(&mut a, "--entrypoint", serde_json::to_string(&[&c.command]).expect("a string serializes"));
    a.push(c.image.clone());
    a.extend(c.args.iter().cloned());
    a.into_iter().map(OsString::from).collect()
}

fn pair(args: &mut Vec<String>, flag: &str, value: String) {
    args.push(flag.into());
    args.push(value);
}

/// Splits the worker's environment between the env file's text and the variables podman must
/// take from its own environment: a value with a newline cannot be a `NAME=value` line.
pub fn env_file_text(env: &[(String, String)]) -> (String, Vec<(String, String)>) {
    let (inherited, plain): (Vec<_>, Vec<_>) =
        env.iter().cloned().partition(|(_, v)| v.contains(['\n', '\r']));
    let text = plain.iter().map(|(name, value)| format!("{name}={value}\n")).collect();
    (text, inherited)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container() -> Container {
        Container {
            worker: Uuid::nil(),
            hostname: "train-0".into(),
            home: "/var/lib/astraeus".into(),
            image: "docker.io/library/busybox:1.36".into(),
            command: "sh".into(),
            args: vec!["-c".into(), "echo hi".into()],
            env_file: Some("/state/env/x".into()),
            env_inherited: vec!["PEM".into()],
            binds: vec![Bind { source: "/state/mounts/x/0".into(), target: "/data".into(), read_only: true }],
            log_file: "/state/logs/x.log".into(),
            limits: Limits { cpu_cores: 1.5, memory_bytes: 268435456, gpus: 0 },
            id_base: id_base(3).unwrap(),
            cgroup_parent: "/astraeus/x".into(),
            gpus: vec![1],
            devices: vec!["nvidia.com/gpu=1".into()],
            capabilities: vec![],
            nofile: Ulimit { soft: 1024, hard: 4096 },
            nproc: Ulimit { soft: 100, hard: 200 },
            stop_grace_seconds: 10,
        }
    }

    fn args(c: &Container) -> Vec<String> {
        create_args(c).into_iter().map(|a| a.into_string().unwrap()).collect()
    }

    fn has(args: &[String], window: &[&str]) -> bool {
        args.windows(window.len()).any(|w| w == window)
    }

    #[test]
    fn the_isolation_is_all_asked_for() {
        let a = args(&container());
        for window in [
            &["--cap-drop=all"][..],
            &["--security-opt", "no-new-privileges"],
            &["--pids-limit", "4096"],
            &["--memory", "268435456"],
            &["--memory-swap", "268435456"],
            &["--cpus", "1.5"],
            // 2^31 + 3 * 65536 = 2147680256
            &["--uidmap", "0:2147680256:65536"],
            &["--gidmap", "0:2147680256:65536"],
            &["--network", "slirp4netns:allow_host_loopback=false"],
            &["--ulimit", "nofile=1024:4096"],
            &["--ulimit", "nproc=100:200"],
            &["--volume", "/state/mounts/x/0:/data:ro"],
            &["--device", "nvidia.com/gpu=1"],
            &["--label", "io.astraeus.gpus=1"],
            &["--env-file", "/state/env/x"],
            &["--env", "PEM"],
            &["--pull", "missing"],
            &["--log-opt", "path=/state/logs/x.log"],
        ] {
            assert!(has(&a, window), "{window:?} not in {a:?}");
        }
        assert!(!a.iter().any(|x| x.starts_with("--cap-add")));
    }

    #[test]
    fn the_command_replaces_the_entrypoint_and_the_args_come_after_the_image() {
        let a = args(&container());
        let n = a.len();
        assert_eq!(
            &a[n - 5..],
            ["--entrypoint", "[\"sh\"]", "docker.io/library/busybox:1.36", "-c", "echo hi"]
        );
    }

    #[test]
    fn workspace_ranges_do_not_overlap_and_stay_valid_user_ids() {
        assert_eq!(id_base(0).unwrap(), 1 << 31);
        assert_eq!(id_base(1).unwrap() - id_base(0).unwrap(), IDS_PER_WORKSPACE);
        // Slot 32767 would end at 2^31 + 32768 * 2^16 - 1 = 2^32 - 1, which is no user id.
        let last = id_base(32766).unwrap();
        assert_eq!(u64::from(last) + u64::from(IDS_PER_WORKSPACE), u64::from(u32::MAX) + 1 - (1 << 16));
        assert!(id_base(32767).is_err());
    }

    #[test]
    fn values_with_newlines_stay_out_of_the_env_file() {
        let env = vec![("A".into(), "1 2".into()), ("PEM".into(), "-----\nkey\n".into())];
        let (text, inherited) = env_file_text(&env);
        assert_eq!(text, "A=1 2\n");
        assert_eq!(inherited.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), ["PEM"]);
    }
}
