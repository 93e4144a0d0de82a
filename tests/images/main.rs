//! The image fixture itself (`cargo test --test images`): a worker's podman, given the fixture's
//! registries.conf, pulls busybox from "docker.io" and runs it.
//!
//! This binary lives beside mod.rs rather than in tests/images.rs: with both tests/images.rs and
//! tests/images/mod.rs, every other binary's `mod images;` would be ambiguous.

#[path = "mod.rs"]
mod images;

use std::process::{Command, Output, Stdio};

#[test]
fn busybox_is_pulled_from_docker_io_through_the_mirror_and_runs() {
    let images = images::images();
    // A private storage, so the host's podman images are neither used nor changed.
    let store = tempfile::tempdir().unwrap();
    let podman = |args: &[&str]| -> Output {
        let output = Command::new("/usr/bin/podman")
            .arg("--root")
            .arg(store.path().join("storage"))
            .arg("--runroot")
            .arg(store.path().join("runroot"))
            .args(["--storage-driver", "vfs", "--runtime", "runc"])
            .args(args)
            .env("CONTAINERS_REGISTRIES_CONF", &images.registries_conf)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "podman {args:?}: {}\nstderr:\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        output
    };
    let image = format!("docker.io/library/{}", images::BUSYBOX);

    // docker.io itself is out of reach here: this succeeds only through the mirror.
    podman(&["pull", &image]);
    let run = podman(&[
        "run",
        "--rm",
        "--network",
        "none",
        // podman's default open-files limit is above the hard limit some hosts allow (this one's
        // is 20,000), and runc then fails to start the container.
        "--ulimit",
        "nofile=1024:1024",
        "--ulimit",
        "nproc=4096:4096",
        &image,
        "sh",
        "-c",
        "echo hello",
    ]);
    assert_eq!(String::from_utf8_lossy(&run.stdout), "hello\n");
}
