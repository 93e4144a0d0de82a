//! Container images for tests, without the internet: a local registry (Debian's docker-registry)
//! holding `library/busybox:1.36`, an image built from the host's static busybox, and a
//! registries.conf that makes it a mirror of docker.io. A test gives that file to podman through
//! `CONTAINERS_REGISTRIES_CONF` and pulls `docker.io/library/busybox:1.36` as a worker would.
//!
//! Include it with `mod images;`; it depends on nothing else under tests/.

#![allow(dead_code)]

use std::fs::{self, File};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::{PermissionsExt, symlink};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

/// The test image, as a short name; docker.io resolves it to `docker.io/library/busybox:1.36`.
pub const BUSYBOX: &str = "busybox:1.36";

const PODMAN: &str = "/usr/bin/podman";
const REGISTRY: &str = "/usr/bin/docker-registry";
/// Debian's busybox-static: the image has no libc, so the binary must be static.
const HOST_BUSYBOX: &str = "/usr/bin/busybox";
/// The name the image has in the private podman storage it is built in, before the push.
const LOCAL_NAME: &str = "localhost/astraeus-test-busybox:1";
const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// root, and nobody for containers run as an unprivileged user.
const PASSWD: &str = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n";
const GROUP: &str = "root:x:0:\nnogroup:x:65534:\n";
/// How long the registry may take to answer.
const PATIENCE: Duration = Duration::from_secs(30);

pub struct Images {
    /// `127.0.0.1:PORT`, plain HTTP.
    pub registry: String,
    /// Points docker.io at `registry` with a mirror entry, for `CONTAINERS_REGISTRIES_CONF`.
    pub registries_conf: PathBuf,
}

impl Images {
    /// `name` straight at the registry, e.g. `127.0.0.1:PORT/library/busybox:1.36` (pull it with
    /// `--tls-verify=false`, or through `registries_conf`, which marks the registry insecure).
    pub fn reference(&self, name: &str) -> String {
        format!("{}/{name}", self.registry)
    }
}

/// Starts (once per test process) a local registry and pushes the test images; later calls
/// return the same.
pub fn images() -> &'static Images {
    static IMAGES: OnceLock<Images> = OnceLock::new();
    IMAGES.get_or_init(set_up)
}

fn set_up() -> Images {
    // The registry's storage and registries.conf must outlive every test, so this folder is
    // kept (statics are never dropped anyway); the image is built in a folder of its own,
    // removed once it is pushed.
    let dir = tempfile::Builder::new().prefix("astraeus-images-").tempdir().unwrap().keep();
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let registry = format!("127.0.0.1:{port}");

    let registries_conf = dir.join("registries.conf");
    fs::write(
        &registries_conf,
        format!(
            r#"unqualified-search-registries = ["docker.io"]
short-name-mode = "permissive"

[[registry]]
prefix = "docker.io"
location = "docker.io"

[[registry.mirror]]
location = "{registry}"
insecure = true
"#
        ),
    )
    .unwrap();

    start_registry(&dir, &registry);

    let build = tempfile::tempdir().unwrap();
    let rootfs_tar = build_busybox_rootfs(build.path());
    // A private storage, so the host's podman images are neither used nor changed.
    let podman = || {
        let mut command = Command::new(PODMAN);
        command
            .arg("--root")
            .arg(build.path().join("storage"))
            .arg("--runroot")
            .arg(build.path().join("runroot"))
            .args(["--storage-driver", "vfs"])
            // Our own file rather than whatever the environment names (a developer's mirror).
            .env("CONTAINERS_REGISTRIES_CONF", &registries_conf);
        command
    };
    run(podman()
        .arg("import")
        // PATH goes into the image config: containers get no PATH from the host.
        .args(["--change", r#"CMD=["sh"]"#, "--change", &format!("ENV=PATH={PATH}")])
        .arg(&rootfs_tar)
        .arg(LOCAL_NAME));
    run(podman()
        .args(["push", "--tls-verify=false", LOCAL_NAME])
        .arg(format!("docker://{registry}/library/{BUSYBOX}")));

    Images { registry, registries_conf }
}

/// Runs `docker-registry serve` on `addr` with its storage and log in `dir`, and waits until it
/// answers.
fn start_registry(dir: &Path, addr: &str) {
    let config = dir.join("registry.yml");
    let log = dir.join("registry.log");
    fs::write(
        &config,
        format!(
            "version: 0.1
log:
  level: info
storage:
  filesystem:
    rootdirectory: {}
http:
  addr: {addr}
",
            dir.join("registry").display()
        ),
    )
    .unwrap();

    let exited = spawn_registry(config, File::create(&log).unwrap());
    let deadline = Instant::now() + PATIENCE;
    while !answers_v2(addr) {
        if let Ok(why) = exited.try_recv() {
            panic!("{REGISTRY} {why}; its log ({}):\n{}", log.display(), tail(&log));
        }
        if Instant::now() >= deadline {
            panic!(
                "{REGISTRY} did not answer on http://{addr}/v2/ within {}s; its log ({}):\n{}",
                PATIENCE.as_secs(),
                log.display(),
                tail(&log)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Spawns the registry from a thread that outlives every test. The child is killed when that
/// thread ends (PR_SET_PDEATHSIG follows the spawning thread, not the process), which then
/// happens only when the test process exits. The receiver tells why the registry stopped, if
/// it does.
fn spawn_registry(config: PathBuf, log: File) -> Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("test-registry".into())
        .spawn(move || {
            let mut command = Command::new(REGISTRY);
            command
                .arg("serve")
                .arg(&config)
                // The registry reads REGISTRY_* variables over its config file.
                .env_clear()
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log);
            // SAFETY: runs between fork and exec; prctl is async-signal-safe and allocates nothing.
            unsafe {
                command.pre_exec(|| {
                    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))?;
                    Ok(())
                });
            }
            let why = match command.spawn() {
                Err(e) => format!("did not start: {e}"),
                Ok(mut child) => match child.wait() {
                    Ok(status) => format!("exited: {status}"),
                    Err(e) => format!("could not be waited for: {e}"),
                },
            };
            let _ = tx.send(why);
            // Never return: should `wait` fail, the registry may still run, and it must keep
            // running until the process ends.
            loop {
                std::thread::park();
            }
        })
        .unwrap();
    rx
}

/// Whether a registry answers `GET /v2/` on `addr` with 200 (HTTP by hand: the tests have no
/// blocking HTTP client).
fn answers_v2(addr: &str) -> bool {
    let Ok(mut stream) = TcpStream::connect_timeout(&addr.parse().unwrap(), Duration::from_secs(1)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let request = format!("GET /v2/ HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    if stream.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    // The header tells our registry from anything else that took the port.
    response.split_whitespace().nth(1) == Some("200") && response.contains("registry/2.0")
}

/// Writes a busybox root filesystem under `dir` and returns its tarball: /bin/busybox, a
/// symlink in /bin for each applet, /tmp, /etc/passwd and /etc/group. Mount points such as
/// /data are left to the runtime.
fn build_busybox_rootfs(dir: &Path) -> PathBuf {
    assert!(
        Path::new(HOST_BUSYBOX).exists(),
        "{HOST_BUSYBOX} is missing: install busybox-static (scripts/test does)"
    );
    assert!(
        is_static(Path::new(HOST_BUSYBOX)),
        "{HOST_BUSYBOX} is dynamically linked, and the image has no libc: install busybox-static"
    );
    let rootfs = dir.join("rootfs");
    // Explicit modes: the image's own (/ at 0755, /tmp sticky), whatever the umask.
    for (path, mode) in [("", 0o755), ("bin", 0o755), ("etc", 0o755), ("tmp", 0o1777)] {
        let path = rootfs.join(path);
        fs::create_dir_all(&path).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(mode)).unwrap();
    }
    fs::copy(HOST_BUSYBOX, rootfs.join("bin/busybox")).unwrap();
    fs::set_permissions(rootfs.join("bin/busybox"), fs::Permissions::from_mode(0o755)).unwrap();
    let applets = String::from_utf8(run(Command::new(HOST_BUSYBOX).arg("--list")).stdout).unwrap();
    for applet in applets.lines().filter(|a| !a.is_empty() && *a != "busybox") {
        symlink("busybox", rootfs.join("bin").join(applet)).unwrap();
    }
    for (path, text) in [("etc/passwd", PASSWD), ("etc/group", GROUP)] {
        fs::write(rootfs.join(path), text).unwrap();
        fs::set_permissions(rootfs.join(path), fs::Permissions::from_mode(0o644)).unwrap();
    }

    let tar = dir.join("rootfs.tar");
    // Owned by root in the image, whoever runs the tests.
    run(Command::new("tar")
        .args(["--create", "--numeric-owner", "--owner=0", "--group=0", "--file"])
        .arg(&tar)
        .arg("--directory")
        .arg(&rootfs)
        .arg("."));
    tar
}

/// Whether `path` is an ELF executable without a program interpreter (PT_INTERP), that is,
/// statically linked.
fn is_static(path: &Path) -> bool {
    let elf = fs::read(path).unwrap();
    let u16_at = |at: usize| u16::from_le_bytes(elf[at..at + 2].try_into().unwrap()) as usize;
    let u32_at = |at: usize| u32::from_le_bytes(elf[at..at + 4].try_into().unwrap());
    let u64_at = |at: usize| u64::from_le_bytes(elf[at..at + 8].try_into().unwrap()) as usize;
    // 64-bit little-endian ELF, the only kind the tests run on.
    if elf.len() < 64 || &elf[..4] != b"\x7fELF" || elf[4] != 2 || elf[5] != 1 {
        return false;
    }
    const PT_INTERP: u32 = 3;
    let (phoff, phentsize, phnum) = (u64_at(0x20), u16_at(0x36), u16_at(0x38));
    (0..phnum).all(|i| u32_at(phoff + i * phentsize) != PT_INTERP)
}

/// Runs `command` and returns its output; panics with its stderr unless it succeeds.
fn run(command: &mut Command) -> Output {
    let output =
        command.stdin(Stdio::null()).output().unwrap_or_else(|e| panic!("{command:?} did not start: {e}"));
    assert!(
        output.status.success(),
        "{command:?}: {}\nstderr:\n{}\nstdout:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr),
        String::from_utf8_lossy(&output.stdout)
    );
    output
}

/// The end of a log file, for a failure message.
fn tail(path: &Path) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let start = text.len().saturating_sub(4000);
    let start = (start..text.len()).find(|&i| text.is_char_boundary(i)).unwrap_or(text.len());
    text[start..].to_owned()
}

/// Removes the containers of the agent whose data location is `home` (podman's label
/// `io.astraeus.home`), and unmounts the binds it made for their drives: what an agent killed
/// by a test leaves behind.
pub fn remove_machine_leftovers(home: &Path) {
    let filter = format!("label=io.astraeus.home={}", home.display());
    let listed = Command::new("/usr/bin/podman")
        .args(["ps", "--all", "--quiet", "--filter", &filter])
        .stdin(Stdio::null())
        .output();
    let ids: Vec<String> = listed
        .map(|o| String::from_utf8_lossy(&o.stdout).split_whitespace().map(str::to_owned).collect())
        .unwrap_or_default();
    if !ids.is_empty() {
        let _ = Command::new("/usr/bin/podman")
            .args(["--runtime", "runc", "--cgroup-manager", "cgroupfs", "rm", "--force", "--time", "0"])
            .args(&ids)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
    // A bind left mounted would make the folder's removal go into the drive it shows.
    let Ok(workers) = std::fs::read_dir(home.join(".agent/mounts")) else { return };
    for worker in workers.flatten() {
        for bind in std::fs::read_dir(worker.path()).into_iter().flatten().flatten() {
            let _ = Command::new("umount").arg("--lazy").arg(bind.path()).stderr(Stdio::null()).status();
            let _ = std::fs::remove_dir(bind.path());
        }
        let _ = std::fs::remove_dir(worker.path());
    }
}
