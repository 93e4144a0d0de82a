//! Running a worker in a bubblewrap sandbox: the host's /usr and /etc read-only, private /tmp,
//! /proc and /dev, each drive bound at its mount path.

use std::ffi::OsString;
use std::fmt;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use rustix::fs::{AtFlags, CWD, FileType, Mode, OFlags};
use rustix::io::{Errno, FdFlags};
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::Command;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

const BWRAP: &str = "bwrap";
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Longer lines are split so one runaway line cannot grow the agent's memory without bound.
pub const MAX_LINE: usize = 16 * 1024;
/// How long to wait for the output pipes to close once the sandbox is gone.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// A host directory bound into the sandbox.
#[derive(Debug)]
pub struct Mount {
    pub source: PathBuf,
    /// Absolute path inside the sandbox.
    pub target: String,
    pub read_only: bool,
    /// When set, bwrap binds this open directory instead of looking `source` up again.
    fd: Option<OwnedFd>,
}

impl Mount {
    /// Binds `source` by path: fine for paths the agent owns (a drive's mount path).
    pub fn bind(source: impl Into<PathBuf>, target: impl Into<String>, read_only: bool) -> Self {
        Mount { source: source.into(), target: target.into(), read_only, fd: None }
    }

    /// Binds the directory `open_sub_path` opened, so a symlink swapped in after the check
    /// cannot redirect the mount.
    pub fn dir(dir: ResolvedDir, target: impl Into<String>, read_only: bool) -> Self {
        Mount { source: dir.path, target: target.into(), read_only, fd: Some(dir.fd) }
    }
}

/// What to run. `env` holds secret values, so `Debug` prints variable names only.
pub struct Spec {
    pub command: String,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub mounts: Vec<Mount>,
    pub time_limit: Option<Duration>,
}

impl fmt::Debug for Spec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let env_names: Vec<&str> = self.env.iter().map(|(name, _)| name.as_str()).collect();
        f.debug_struct("Spec")
            .field("command", &self.command)
            .field("args", &self.args)
            .field("env", &env_names)
            .field("mounts", &self.mounts)
            .field("time_limit", &self.time_limit)
            .finish()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// One line of output without its newline; invalid UTF-8 is replaced, lines over `MAX_LINE`
/// bytes arrive in pieces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    pub stream: Stream,
    pub line: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Exited(i32),
    Signalled(i32),
    TimedOut(Duration),
    Stopped,
    FailedToStart(String),
}

impl Outcome {
    /// Human words for events and the console.
    pub fn reason(&self) -> String {
        match self {
            Outcome::Exited(code) => format!("exited with code {code}"),
            Outcome::Signalled(signal) => format!("killed by signal {signal}"),
            Outcome::TimedOut(limit) => {
                format!("exceeded its time limit of {}s", limit.as_secs_f64())
            }
            Outcome::Stopped => "stopped".to_string(),
            Outcome::FailedToStart(why) => format!("could not start: {why}"),
        }
    }
}

/// A directory inside a drive, held open so it can be bound without a second lookup.
#[derive(Debug)]
pub struct ResolvedDir {
    fd: OwnedFd,
    path: PathBuf,
}

impl ResolvedDir {
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Resolves `sub_path` (relative, already validated: no `..`, no empty components) inside `root`
/// without following any symlink, so the result can never leave `root`. Errors name the component.
///
/// Mounting the returned path looks it up again, so a component swapped for a symlink in between
/// would be followed; `open_sub_path` with `Mount::dir` closes that window.
pub fn resolve_sub_path(root: &Path, sub_path: &str) -> Result<PathBuf, String> {
    open_sub_path(root, sub_path).map(|dir| dir.path)
}

/// Like `resolve_sub_path`, but keeps the final directory open for `Mount::dir`.
pub fn open_sub_path(root: &Path, sub_path: &str) -> Result<ResolvedDir, String> {
    // O_PATH: only a handle for lookups and binding, no read permission needed.
    let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let mut dir = rustix::fs::openat(CWD, root, flags, Mode::empty())
        .map_err(|e| format!("root {}: {e}", root.display()))?;
    // An empty sub_path is the root itself.
    for name in sub_path.split('/').filter(|_| !sub_path.is_empty()) {
        // Validated upstream; checked again because escaping `root` is what this function prevents.
        if name.is_empty() || name == "." || name == ".." {
            return Err(format!("sub_path {sub_path}: {name:?} is not a plain name"));
        }
        let next = rustix::fs::openat(&dir, name, flags | OFlags::NOFOLLOW, Mode::empty())
            .map_err(|e| format!("sub_path {sub_path}: {name:?} {}", why_not_dir(&dir, name, e)))?;
        dir = next;
    }
    let path = if sub_path.is_empty() { root.to_path_buf() } else { root.join(sub_path) };
    Ok(ResolvedDir { fd: dir, path })
}

/// Turns a failed open into words: the errno alone (ELOOP, ENOTDIR) is cryptic.
fn why_not_dir(dir: &OwnedFd, name: &str, err: Errno) -> String {
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => match FileType::from_raw_mode(st.st_mode) {
            FileType::Symlink => "is a symbolic link".to_string(),
            FileType::Directory => err.to_string(),
            _ => "is not a directory".to_string(),
        },
        Err(Errno::NOENT) => "does not exist".to_string(),
        Err(_) => err.to_string(),
    }
}

/// The bwrap argument list for `spec`. Environment values are not in it (see `sandbox_env`).
pub fn bwrap_args(spec: &Spec) -> Vec<OsString> {
    args_for(spec, usr_link)
}

/// On a usr-merged host /bin, /lib, ... are symlinks into /usr: recreate the link, else bind.
fn usr_link(path: &str) -> Option<PathBuf> {
    let target = std::fs::read_link(path).ok()?;
    let text = target.to_str()?;
    (text.starts_with("usr/") || text.starts_with("/usr/")).then_some(target)
}

fn args_for(spec: &Spec, usr_link: impl Fn(&str) -> Option<PathBuf>) -> Vec<OsString> {
    let mut args: Vec<OsString> = [
        "--die-with-parent",
        "--new-session", // no TIOCSTI into the agent's terminal
        "--unshare-pid", // the worker's tree dies with bwrap's pid 1
        "--unshare-ipc",
        "--unshare-uts",
        "--ro-bind",
        "/usr",
        "/usr",
        "--ro-bind",
        "/etc",
        "/etc",
    ]
    .map(OsString::from)
    .into();
    for dir in ["/bin", "/lib", "/lib64", "/sbin"] {
        match usr_link(dir) {
            Some(target) => args.extend(["--symlink".into(), target.into(), dir.into()]),
            None => args.extend(["--ro-bind-try", dir, dir].map(OsString::from)),
        }
    }
    args.extend(["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"].map(OsString::from));
    // bwrap mounts in order: a parent target must come before the targets nested in it.
    let mut mounts: Vec<&Mount> = spec.mounts.iter().collect();
    mounts.sort_by_key(|m| Path::new(&m.target).components().count());
    for mount in mounts {
        let (flag, source) = match (&mount.fd, mount.read_only) {
            (Some(fd), true) => ("--ro-bind-fd", fd.as_raw_fd().to_string().into()),
            (Some(fd), false) => ("--bind-fd", fd.as_raw_fd().to_string().into()),
            (None, true) => ("--ro-bind", mount.source.clone().into_os_string()),
            (None, false) => ("--bind", mount.source.clone().into_os_string()),
        };
        args.extend([flag.into(), source, mount.target.clone().into()]);
    }
    args.extend(["--chdir", "/tmp", "--"].map(OsString::from));
    args.push(spec.command.clone().into());
    args.extend(spec.args.iter().map(OsString::from));
    args
}

/// The worker's whole environment: PATH and HOME unless the spec sets them, then the spec's.
/// It is handed to bwrap as its own environment (which bwrap passes on) rather than as
/// `--setenv` arguments, because any host user can read a process's arguments in /proc.
pub fn sandbox_env(spec: &Spec) -> Vec<(String, String)> {
    let has = |name: &str| spec.env.iter().any(|(n, _)| n == name);
    let mut env = Vec::with_capacity(spec.env.len() + 2);
    if !has("PATH") {
        env.push(("PATH".to_string(), DEFAULT_PATH.to_string()));
    }
    if !has("HOME") {
        env.push(("HOME".to_string(), "/tmp".to_string()));
    }
    env.extend(spec.env.iter().cloned());
    env
}

/// Mistakes that bwrap would only report as a terse exit code 1.
fn check(spec: &Spec) -> Result<(), String> {
    if spec.command.is_empty() {
        return Err("the command is empty".to_string());
    }
    for mount in &spec.mounts {
        if !mount.target.starts_with('/') {
            return Err(format!("mount target {:?} is not an absolute path", mount.target));
        }
        if mount.fd.is_none() && !mount.source.is_dir() {
            return Err(format!("mount source {} is not a directory", mount.source.display()));
        }
    }
    Ok(())
}

/// Runs `spec` to completion, its time limit, or `stop`; streams its output into `logs`.
pub async fn run(spec: Spec, logs: mpsc::Sender<LogLine>, stop: CancellationToken) -> Outcome {
    if let Err(why) = check(&spec) {
        return Outcome::FailedToStart(why);
    }
    let mut cmd = Command::new(BWRAP);
    cmd.args(bwrap_args(&spec))
        .env_clear()
        .envs(sandbox_env(&spec))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let fds: Vec<RawFd> = spec.mounts.iter().filter_map(|m| m.fd.as_ref()).map(|fd| fd.as_raw_fd()).collect();
    if !fds.is_empty() {
        // The directory fds are CLOEXEC so no other child inherits them; only this bwrap
        // gets them (and closes them before running the worker).
        // SAFETY: runs between fork and exec; it only calls fcntl, which is async-signal-safe,
        // allocates nothing, and the fds stay open in the parent (`spec` owns them) until after exec.
        unsafe {
            cmd.pre_exec(move || {
                for &fd in &fds {
                    rustix::io::fcntl_setfd(BorrowedFd::borrow_raw(fd), FdFlags::empty())?;
                }
                Ok(())
            });
        }
    }
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) => return Outcome::FailedToStart(format!("{BWRAP}: {e}")),
    };
    let stdout = child.stdout.take().expect("stdout is piped");
    let stderr = child.stderr.take().expect("stderr is piped");
    let readers = [
        tokio::spawn(pump(stdout, Stream::Stdout, logs.clone())),
        tokio::spawn(pump(stderr, Stream::Stderr, logs)),
    ];
    let limit = async {
        match spec.time_limit {
            Some(limit) => tokio::time::sleep(limit).await,
            None => std::future::pending().await,
        }
    };
    let outcome = tokio::select! {
        biased;
        status = child.wait() => match status {
            Ok(status) => from_status(status),
            Err(e) => Outcome::FailedToStart(format!("waiting for {BWRAP}: {e}")),
        },
        () = stop.cancelled() => Outcome::Stopped,
        () = limit => Outcome::TimedOut(spec.time_limit.unwrap_or_default()),
    };
    if matches!(outcome, Outcome::Stopped | Outcome::TimedOut(_) | Outcome::FailedToStart(_)) {
        // Killing bwrap is enough: its pid-1 child dies with it (--die-with-parent), and the
        // kernel then kills everything else in the pid namespace.
        let _ = child.start_kill();
        let _ = child.wait().await;
    }
    // The pipes close only once every process in the sandbox is gone, so draining them is also
    // the wait for the namespace to empty. Bounded, in case a process somehow lingers.
    let [mut out, mut err] = readers;
    let drain = async { tokio::join!(&mut out, &mut err) };
    if tokio::time::timeout(DRAIN_TIMEOUT, drain).await.is_err() {
        out.abort();
        err.abort();
    }
    outcome
}

fn from_status(status: ExitStatus) -> Outcome {
    match (status.code(), status.signal()) {
        // bwrap reports a worker killed by signal N as 128 + N, as a shell does.
        (Some(code), _) if (129..=128 + 64).contains(&code) => Outcome::Signalled(code - 128),
        (Some(code), _) => Outcome::Exited(code),
        (None, Some(signal)) => Outcome::Signalled(signal),
        (None, None) => Outcome::FailedToStart(format!("{BWRAP} ended with {status}")),
    }
}

/// Reads `pipe` line by line into `logs`. Once the receiver is gone it keeps reading, so the
/// worker never blocks on a full pipe.
async fn pump(pipe: impl AsyncRead + Unpin, stream: Stream, logs: mpsc::Sender<LogLine>) {
    let mut reader = BufReader::new(pipe);
    let mut sink = Some(logs);
    let mut line = Vec::new();
    // After a split exactly at MAX_LINE, a newline right behind it ends that line, not a new one.
    let mut just_split = false;
    loop {
        let buf = match reader.fill_buf().await {
            Ok([]) | Err(_) => break,
            Ok(buf) => buf,
        };
        if std::mem::take(&mut just_split) && buf[0] == b'\n' {
            reader.consume(1);
            continue;
        }
        let room = MAX_LINE - line.len();
        let window = &buf[..buf.len().min(room + 1)];
        if let Some(end) = window.iter().position(|&b| b == b'\n') {
            line.extend_from_slice(&buf[..end]);
            reader.consume(end + 1);
        } else {
            let take = buf.len().min(room);
            line.extend_from_slice(&buf[..take]);
            reader.consume(take);
            if line.len() < MAX_LINE {
                continue;
            }
            just_split = true;
        }
        emit(&mut sink, stream, &mut line).await;
    }
    if !line.is_empty() {
        emit(&mut sink, stream, &mut line).await;
    }
}

async fn emit(sink: &mut Option<mpsc::Sender<LogLine>>, stream: Stream, line: &mut Vec<u8>) {
    let text = String::from_utf8_lossy(line).into_owned();
    line.clear();
    if let Some(logs) = sink
        && logs.send(LogLine { stream, line: text }).await.is_err()
    {
        *sink = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(mounts: Vec<Mount>) -> Spec {
        Spec {
            command: "python".into(),
            args: vec!["train.py".into(), "--epochs=1".into()],
            env: vec![("HF_TOKEN".into(), "hf_secret".into())],
            mounts,
            time_limit: None,
        }
    }

    fn merged(dir: &str) -> Option<PathBuf> {
        Some(PathBuf::from(format!("usr{dir}")))
    }

    fn strings(args: Vec<OsString>) -> Vec<String> {
        args.into_iter().map(|a| a.into_string().unwrap()).collect()
    }

    fn position(args: &[String], window: &[&str]) -> usize {
        args.windows(window.len())
            .position(|w| w == window)
            .unwrap_or_else(|| panic!("{window:?} not in {args:?}"))
    }

    #[test]
    fn a_usr_merged_host_gets_symlinks_and_the_command_comes_last() {
        let args = strings(args_for(&spec(vec![]), merged));
        let expected = "--die-with-parent --new-session --unshare-pid --unshare-ipc --unshare-uts \
            --ro-bind /usr /usr --ro-bind /etc /etc \
            --symlink usr/bin /bin --symlink usr/lib /lib --symlink usr/lib64 /lib64 --symlink usr/sbin /sbin \
            --proc /proc --dev /dev --tmpfs /tmp --chdir /tmp -- python train.py --epochs=1";
        assert_eq!(args, expected.split_whitespace().collect::<Vec<_>>());
    }

    #[test]
    fn a_host_with_real_system_dirs_binds_them_if_present() {
        let args = strings(args_for(&spec(vec![]), |_| None));
        position(&args, &["--ro-bind-try", "/bin", "/bin"]);
        position(&args, &["--ro-bind-try", "/lib64", "/lib64"]);
        assert!(!args.contains(&"--symlink".to_string()));
    }

    #[test]
    fn mounts_follow_the_tmpfs_sorted_by_depth_with_their_access_mode() {
        let mounts = vec![
            Mount::bind("/drives/a/ckpt", "/data/out/ckpt", false),
            Mount::bind("/drives/a", "/data", true),
            Mount::bind("/drives/b", "/tmp/cache", false),
        ];
        let args = strings(args_for(&spec(mounts), merged));
        let tmpfs = position(&args, &["--tmpfs", "/tmp"]);
        // Depths: /data = 1, /tmp/cache = 2, /data/out/ckpt = 3.
        let data = position(&args, &["--ro-bind", "/drives/a", "/data"]);
        let cache = position(&args, &["--bind", "/drives/b", "/tmp/cache"]);
        let ckpt = position(&args, &["--bind", "/drives/a/ckpt", "/data/out/ckpt"]);
        assert!(tmpfs < data && data < cache && cache < ckpt, "{args:?}");
        assert!(ckpt < position(&args, &["--"]));
    }

    #[test]
    fn an_open_directory_is_bound_by_its_fd() {
        let root = std::env::temp_dir();
        let dir = ResolvedDir {
            fd: rustix::fs::openat(CWD, &root, OFlags::PATH | OFlags::CLOEXEC, Mode::empty()).unwrap(),
            path: root,
        };
        let fd = dir.fd.as_raw_fd().to_string();
        let args = strings(args_for(&spec(vec![Mount::dir(dir, "/data", true)]), merged));
        position(&args, &["--ro-bind-fd", &fd, "/data"]);
    }

    #[test]
    fn env_values_stay_out_of_the_arguments_and_the_debug_output() {
        let spec = spec(vec![]);
        assert!(!strings(bwrap_args(&spec)).iter().any(|a| a.contains("hf_secret")));
        let debug = format!("{spec:?}");
        assert!(debug.contains("HF_TOKEN") && !debug.contains("hf_secret"), "{debug}");
    }

    #[test]
    fn path_and_home_have_defaults_that_the_spec_can_override() {
        let mut spec = spec(vec![]);
        let env = sandbox_env(&spec);
        assert_eq!(env[0], ("PATH".into(), DEFAULT_PATH.into()));
        assert_eq!(env[1], ("HOME".into(), "/tmp".into()));
        assert_eq!(env[2], ("HF_TOKEN".into(), "hf_secret".into()));
        spec.env.push(("PATH".into(), "/opt/bin".into()));
        let env = sandbox_env(&spec);
        assert_eq!(env.iter().filter(|(n, _)| n == "PATH").count(), 1);
        assert!(env.contains(&("PATH".into(), "/opt/bin".into())));
    }

    #[test]
    fn reasons_read_as_words() {
        let cases = [
            (Outcome::Exited(3), "exited with code 3"),
            (Outcome::Signalled(9), "killed by signal 9"),
            (Outcome::TimedOut(Duration::from_secs(2)), "exceeded its time limit of 2s"),
            (Outcome::TimedOut(Duration::from_millis(1500)), "exceeded its time limit of 1.5s"),
            (Outcome::Stopped, "stopped"),
            (Outcome::FailedToStart("bwrap: not found".into()), "could not start: bwrap: not found"),
        ];
        for (outcome, reason) in cases {
            assert_eq!(outcome.reason(), reason);
        }
    }

    #[test]
    fn exit_codes_above_128_mean_a_signal() {
        // bwrap exits 128 + 9 = 137 when the worker was SIGKILLed.
        assert_eq!(from_status(ExitStatus::from_raw(137 << 8)), Outcome::Signalled(9));
        assert_eq!(from_status(ExitStatus::from_raw(3 << 8)), Outcome::Exited(3));
        assert_eq!(from_status(ExitStatus::from_raw(15)), Outcome::Signalled(15));
    }
}
