//! The worker sandbox against the real bwrap and real processes.

use astraeus::agent::sandbox;

use std::path::Path;
use std::time::{Duration, Instant};

use sandbox::{LogLine, Mount, Outcome, Spec, Stream};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

fn sh(script: &str) -> Spec {
    Spec {
        command: "sh".into(),
        args: vec!["-c".into(), script.into()],
        env: vec![],
        mounts: vec![],
        time_limit: None,
    }
}

async fn run(spec: Spec) -> (Outcome, Vec<LogLine>) {
    run_until(spec, CancellationToken::new()).await
}

async fn run_until(spec: Spec, stop: CancellationToken) -> (Outcome, Vec<LogLine>) {
    let (tx, mut rx) = mpsc::channel(1024);
    let outcome = sandbox::run(spec, tx, stop).await;
    let mut lines = Vec::new();
    while let Ok(line) = rx.try_recv() {
        lines.push(line);
    }
    (outcome, lines)
}

fn stdout(lines: &[LogLine]) -> Vec<&str> {
    lines.iter().filter(|l| l.stream == Stream::Stdout).map(|l| l.line.as_str()).collect()
}

fn all_text(lines: &[LogLine]) -> String {
    lines.iter().map(|l| l.line.as_str()).collect::<Vec<_>>().join("\n")
}

/// Whether any process on the host has `needle` in its command line.
fn process_running(needle: &str) -> bool {
    std::fs::read_dir("/proc").unwrap().flatten().any(|entry| {
        std::fs::read(entry.path().join("cmdline"))
            .map(|cmdline| String::from_utf8_lossy(&cmdline).contains(needle))
            .unwrap_or(false)
    })
}

#[tokio::test]
async fn echo_hello_exits_zero_and_logs_hello_on_stdout() {
    let (outcome, lines) = run(sh("echo hello")).await;
    assert_eq!(outcome, Outcome::Exited(0));
    assert_eq!(lines, vec![LogLine { stream: Stream::Stdout, line: "hello".into() }]);
}

#[tokio::test]
async fn a_failing_command_exits_with_its_code_and_its_stderr_is_logged() {
    let (outcome, lines) = run(sh("echo oops >&2; exit 3")).await;
    assert_eq!(outcome, Outcome::Exited(3));
    assert_eq!(outcome.reason(), "exited with code 3");
    assert_eq!(lines, vec![LogLine { stream: Stream::Stderr, line: "oops".into() }]);
}

#[tokio::test]
async fn a_worker_killed_by_a_signal_is_reported_as_signalled() {
    let (outcome, _) = run(sh("kill -9 $$")).await;
    assert_eq!(outcome, Outcome::Signalled(9));
    assert_eq!(outcome.reason(), "killed by signal 9");
}

#[tokio::test]
async fn a_worker_past_its_time_limit_is_killed_with_everything_it_started() {
    let mut spec = sh("sleep 31.123 & sleep 31.123");
    spec.time_limit = Some(Duration::from_secs(1));
    let started = Instant::now();
    let (outcome, _) = run(spec).await;
    assert_eq!(outcome, Outcome::TimedOut(Duration::from_secs(1)));
    assert!(outcome.reason().contains("time limit"), "{}", outcome.reason());
    assert!(started.elapsed() < Duration::from_secs(4), "took {:?}", started.elapsed());
    assert!(!process_running("31.123"), "a sleep survived its sandbox");
}

#[tokio::test]
async fn cancelling_the_stop_token_stops_the_worker() {
    let stop = CancellationToken::new();
    let cancel = stop.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        cancel.cancel();
    });
    let started = Instant::now();
    let (outcome, _) = run_until(sh("sleep 32.456"), stop).await;
    assert_eq!(outcome, Outcome::Stopped);
    assert!(started.elapsed() < Duration::from_secs(4), "took {:?}", started.elapsed());
    assert!(!process_running("32.456"), "the sleep survived its sandbox");
}

#[tokio::test]
async fn a_read_only_mount_can_be_read_but_not_written() {
    let drive = tempfile::tempdir().unwrap();
    std::fs::write(drive.path().join("labels.txt"), "cat\n").unwrap();
    let mut spec = sh("cat /data/labels.txt; touch /data/should-fail");
    spec.mounts.push(Mount::bind(drive.path(), "/data", true));
    let (outcome, lines) = run(spec).await;
    assert_eq!(outcome, Outcome::Exited(1));
    assert_eq!(stdout(&lines), ["cat"]);
    assert!(all_text(&lines).contains("Read-only file system"), "{lines:?}");
    assert!(!drive.path().join("should-fail").exists());
}

#[tokio::test]
async fn a_read_write_mount_writes_through_to_the_host() {
    let drive = tempfile::tempdir().unwrap();
    let mut spec = sh("echo done > /out/result");
    spec.mounts.push(Mount::bind(drive.path(), "/out", false));
    let (outcome, lines) = run(spec).await;
    assert_eq!(outcome, Outcome::Exited(0), "{lines:?}");
    assert_eq!(std::fs::read_to_string(drive.path().join("result")).unwrap(), "done\n");
}

#[tokio::test]
async fn nested_mount_targets_work_in_any_order() {
    let outer = tempfile::tempdir().unwrap();
    let inner = tempfile::tempdir().unwrap();
    std::fs::create_dir(outer.path().join("ckpt")).unwrap();
    let mut spec = sh("echo saved > /data/ckpt/x && touch /data/y");
    spec.mounts.push(Mount::bind(inner.path(), "/data/ckpt", false));
    spec.mounts.push(Mount::bind(outer.path(), "/data", true));
    let (outcome, _) = run(spec).await;
    assert_eq!(outcome, Outcome::Exited(1));
    assert!(inner.path().join("x").exists());
    assert!(!outer.path().join("y").exists());
}

#[tokio::test]
async fn env_vars_are_visible_inside_with_default_path_and_home() {
    let mut spec = sh("echo $HF_HOME; echo $HOME; echo $PATH");
    spec.env.push(("HF_HOME".into(), "/data/hf".into()));
    let (outcome, lines) = run(spec).await;
    assert_eq!(outcome, Outcome::Exited(0));
    assert_eq!(
        stdout(&lines),
        ["/data/hf", "/tmp", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
    );
}

#[tokio::test]
async fn the_agents_own_environment_does_not_leak_in() {
    // Cargo sets CARGO_PKG_NAME for the test process; the worker must not see it.
    assert!(std::env::var_os("CARGO_PKG_NAME").is_some());
    let (outcome, lines) = run(sh("env")).await;
    assert_eq!(outcome, Outcome::Exited(0));
    assert!(!all_text(&lines).contains("CARGO_"), "{lines:?}");
}

#[tokio::test]
async fn host_paths_that_are_not_bound_are_absent() {
    let (outcome, _) = run(sh("test -e /work || test -e /root/.cargo")).await;
    assert_eq!(outcome, Outcome::Exited(1));
}

#[tokio::test]
async fn long_lines_are_split_and_invalid_utf8_is_replaced() {
    let (outcome, lines) = run(sh("head -c 20000 /dev/zero | tr '\\0' a; echo; printf 'caf\\377\\n'")).await;
    assert_eq!(outcome, Outcome::Exited(0));
    let lengths: Vec<usize> = lines.iter().map(|l| l.line.len()).collect();
    // 20000 = 16384 + 3616; the replacement character takes 3 bytes.
    assert_eq!(lengths, [16384, 3616, 6]);
    assert_eq!(lines[2].line, "caf\u{FFFD}");
}

#[tokio::test]
async fn output_is_drained_when_nobody_listens() {
    let (tx, rx) = mpsc::channel(1);
    drop(rx);
    let outcome = sandbox::run(sh("seq 1 200000"), tx, CancellationToken::new()).await;
    assert_eq!(outcome, Outcome::Exited(0));
}

#[tokio::test]
async fn a_missing_mount_source_fails_to_start() {
    let mut spec = sh("true");
    spec.mounts.push(Mount::bind("/nonexistent/drive", "/data", true));
    let (outcome, _) = run(spec).await;
    assert!(matches!(outcome, Outcome::FailedToStart(_)), "{outcome:?}");
    assert!(outcome.reason().contains("/nonexistent/drive"), "{}", outcome.reason());
}

#[test]
fn the_debug_output_of_a_spec_names_env_vars_but_hides_their_values() {
    let mut spec = sh("true");
    spec.env.push(("HF_TOKEN".into(), "hf_abcdef123".into()));
    let debug = format!("{spec:?}");
    assert!(debug.contains("HF_TOKEN"), "{debug}");
    assert!(!debug.contains("hf_abcdef123"), "{debug}");
}

fn drive_with_dataset() -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("food101/data/train")).unwrap();
    std::fs::write(root.path().join("food101/data/train/0.jpg"), "jpeg").unwrap();
    root
}

#[test]
fn a_plain_nested_sub_path_resolves_inside_root() {
    let root = drive_with_dataset();
    let resolved = sandbox::resolve_sub_path(root.path(), "food101/data/train").unwrap();
    assert_eq!(resolved, root.path().join("food101/data/train"));
}

#[test]
fn a_symlink_component_pointing_outside_root_is_refused() {
    let root = drive_with_dataset();
    let outside = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(outside.path(), root.path().join("food101/escape")).unwrap();
    let err = sandbox::resolve_sub_path(root.path(), "food101/escape").unwrap_err();
    assert_eq!(err, r#"sub_path food101/escape: "escape" is a symbolic link"#);
}

#[test]
fn a_symlink_component_pointing_inside_root_is_refused_too() {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("food101/real/train")).unwrap();
    std::os::unix::fs::symlink("real", root.path().join("food101/data")).unwrap();
    let err = sandbox::resolve_sub_path(root.path(), "food101/data/train").unwrap_err();
    assert_eq!(err, r#"sub_path food101/data/train: "data" is a symbolic link"#);
}

#[test]
fn a_missing_or_non_directory_component_is_named() {
    let root = drive_with_dataset();
    let err = sandbox::resolve_sub_path(root.path(), "food101/test/x").unwrap_err();
    assert_eq!(err, r#"sub_path food101/test/x: "test" does not exist"#);
    let err = sandbox::resolve_sub_path(root.path(), "food101/data/train/0.jpg").unwrap_err();
    assert_eq!(err, r#"sub_path food101/data/train/0.jpg: "0.jpg" is not a directory"#);
    let err = sandbox::resolve_sub_path(root.path(), "food101/../..").unwrap_err();
    assert!(err.contains(r#"".." is not a plain name"#), "{err}");
}

#[tokio::test]
async fn a_resolved_sub_path_is_mounted_by_path_or_by_open_fd() {
    let root = drive_with_dataset();
    let by_path = sandbox::resolve_sub_path(root.path(), "food101/data").unwrap();
    let by_fd = sandbox::open_sub_path(root.path(), "food101/data").unwrap();
    assert_eq!(by_fd.path(), by_path);
    // An open directory fd left in the worker would let it walk up out of its mount with `..`.
    let mut spec = sh("cat /a/train/0.jpg; echo; cat /b/train/0.jpg; echo; \
         for f in /proc/self/fd/*; do [ -d $f ] && echo leaked $f; done; touch /b/x");
    spec.mounts.push(Mount::bind(&by_path, "/a", true));
    spec.mounts.push(Mount::dir(by_fd, "/b", true));
    let (outcome, lines) = run(spec).await;
    assert_eq!(outcome, Outcome::Exited(1), "{lines:?}");
    assert_eq!(stdout(&lines), ["jpeg", "jpeg"]);
    assert!(all_text(&lines).contains("Read-only file system"), "{lines:?}");
    assert!(!Path::new(&by_path).join("x").exists());
}

#[tokio::test]
async fn a_sub_path_swapped_for_a_symlink_after_opening_still_mounts_what_was_checked() {
    let root = drive_with_dataset();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), "host secret").unwrap();
    let opened = sandbox::open_sub_path(root.path(), "food101/data").unwrap();
    // The race a path-based mount loses: the checked directory is replaced by a symlink out.
    std::fs::rename(root.path().join("food101/data"), root.path().join("food101/moved")).unwrap();
    std::os::unix::fs::symlink(outside.path(), root.path().join("food101/data")).unwrap();
    let mut spec = sh("ls /data");
    spec.mounts.push(Mount::dir(opened, "/data", true));
    let (outcome, lines) = run(spec).await;
    assert_eq!(outcome, Outcome::Exited(0), "{lines:?}");
    assert_eq!(stdout(&lines), ["train"]);
}
