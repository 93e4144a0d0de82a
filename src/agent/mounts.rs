//! A worker's drives as folders podman can bind: resolved inside their copy or host path
//! without following symlinks, then bound at a path of the agent's own.
//!
//! Podman (and runc after it) looks a bind's source up again when the container is made. A
//! worker that can write to a drive could swap a folder on the way for a symlink in between,
//! so podman is never handed a path inside a drive: the folder the agent opened is bound (by
//! its descriptor) at `<state>/mounts/<worker>/<n>`, a path no worker can reach.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, CWD, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;
use rustix::mount::UnmountFlags;

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

/// Opens `sub_path` (relative, already validated: no `..`, no empty components) inside `root`
/// without following any symlink, so the result can never leave `root`, and keeps it open for
/// `stage`. Errors name the component.
pub fn open_sub_path(root: &Path, sub_path: &str) -> Result<ResolvedDir, String> {
    let dir = rustix::fs::openat(CWD, root, PATH_DIR, Mode::empty())
        .map_err(|e| format!("root {}: {e}", root.display()))?;
    let fd = walk(dir, sub_path)?;
    Ok(ResolvedDir { fd, path: joined(root, sub_path) })
}

/// Opens `rel` beneath the granted folder `grant`, resolving every component of it inside the
/// grant without following a symlink (`openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`,
/// or a walk one component at a time with `O_NOFOLLOW` on kernels without it). The grant
/// itself is an organisation admin's choice and is opened as named. Errors name the component.
pub fn open_beneath(grant: &Path, rel: &str) -> Result<ResolvedDir, String> {
    let dir = rustix::fs::openat(CWD, grant, PATH_DIR, Mode::empty())
        .map_err(|e| format!("granted folder {}: {e}", grant.display()))?;
    let path = joined(grant, rel);
    if rel.is_empty() {
        return Ok(ResolvedDir { fd: dir, path });
    }
    plain(rel)?;
    let how = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
    let fd = match rustix::fs::openat2(&dir, rel, PATH_DIR, Mode::empty(), how) {
        Ok(fd) => fd,
        Err(Errno::NOSYS) => walk(dir, rel)?,
        // The walk names the component at fault; should it get through, the refusal stands.
        Err(e) => {
            walk(dir, rel)?;
            return Err(format!("{rel}: {e}"));
        }
    };
    Ok(ResolvedDir { fd, path })
}

/// O_PATH: only a handle for lookups and binding, no read permission needed.
const PATH_DIR: OFlags = OFlags::PATH.union(OFlags::DIRECTORY).union(OFlags::CLOEXEC);

fn joined(root: &Path, rel: &str) -> PathBuf {
    if rel.is_empty() { root.to_path_buf() } else { root.join(rel) }
}

/// Validated upstream; checked again because escaping the root is what the callers prevent.
fn plain(rel: &str) -> Result<(), String> {
    match rel.split('/').find(|n| n.is_empty() || *n == "." || *n == "..") {
        Some(name) => Err(format!("{rel}: {name:?} is not a plain name")),
        None => Ok(()),
    }
}

/// Opens `rel` beneath `dir` one component at a time, following no symlink.
fn walk(mut dir: OwnedFd, rel: &str) -> Result<OwnedFd, String> {
    if rel.is_empty() {
        return Ok(dir);
    }
    plain(rel)?;
    for name in rel.split('/') {
        let next = rustix::fs::openat(&dir, name, PATH_DIR | OFlags::NOFOLLOW, Mode::empty())
            .map_err(|e| format!("{rel}: {name:?} {}", why_not_dir(&dir, name, e)))?;
        dir = next;
    }
    Ok(dir)
}

/// Opens `rel` (plain names) beneath `root`, making the folders that are missing, without
/// following a symlink at any step: a folder that an agent makes beneath its own is never a
/// folder a link pointed it to.
pub fn make_beneath(root: &Path, rel: &str) -> Result<(), String> {
    let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW;
    let mut dir = rustix::fs::openat(CWD, root, flags, Mode::empty())
        .map_err(|e| format!("{}: {e}", root.display()))?;
    for name in rel.split('/').filter(|n| !n.is_empty()) {
        if name == "." || name == ".." {
            return Err(format!("{rel}: {name:?} is not a plain name"));
        }
        let opened = match rustix::fs::openat(&dir, name, flags, Mode::empty()) {
            Err(Errno::NOENT) => {
                // O_PATH cannot make: a plain descriptor of the same folder can.
                let plain = rustix::fs::openat(
                    &dir,
                    ".",
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .map_err(|e| format!("{rel}: {e}"))?;
                match rustix::fs::mkdirat(&plain, name, Mode::from_raw_mode(0o755)) {
                    Ok(()) | Err(Errno::EXIST) => {}
                    Err(e) => return Err(format!("{rel}: cannot make {name:?}: {e}")),
                }
                rustix::fs::openat(&dir, name, flags, Mode::empty())
            }
            other => other,
        };
        dir = opened.map_err(|e| format!("{rel}: {name:?} {}", why_not_dir(&dir, name, e)))?;
    }
    Ok(())
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

/// Where a worker's drives are bound for podman.
pub fn worker_dir(state: &Path, worker: uuid::Uuid) -> PathBuf {
    state.join("mounts").join(worker.to_string())
}

/// Binds the opened `dir` at `<worker_dir>/<n>` and returns that path.
pub fn stage(worker_dir: &Path, n: usize, dir: &ResolvedDir) -> Result<PathBuf, String> {
    let at = worker_dir.join(n.to_string());
    std::fs::create_dir_all(&at).map_err(|e| format!("cannot create {}: {e}", at.display()))?;
    // The kernel resolves /proc/self/fd/N to the open directory itself, not to its path.
    let source = format!("/proc/self/fd/{}", dir.fd.as_raw_fd());
    rustix::mount::mount_bind(source.as_str(), &at)
        .map_err(|e| format!("cannot bind {} at {}: {e}", dir.path.display(), at.display()))?;
    Ok(at)
}

/// Undoes `stage` for every drive of a worker. Each bind is unmounted before its folder is
/// removed, and only empty folders are removed: a recursive removal here would go through a
/// bind that failed to unmount and delete the drive's data.
pub fn unstage(worker_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(worker_dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        match rustix::mount::unmount(&path, UnmountFlags::DETACH) {
            Ok(()) | Err(Errno::INVAL) | Err(Errno::NOENT) => {}
            Err(e) => tracing::warn!(path = %path.display(), error = %e, "cannot unmount a drive's bind"),
        }
        let _ = std::fs::remove_dir(&path);
    }
    let _ = std::fs::remove_dir(worker_dir);
}

/// Undoes `stage` for every worker not in `keep`: binds left by an agent that stopped.
pub fn unstage_all_but(state: &Path, keep: &[uuid::Uuid]) {
    let Ok(entries) = std::fs::read_dir(state.join("mounts")) else { return };
    for entry in entries.flatten() {
        let kept =
            entry.file_name().to_str().and_then(|n| n.parse().ok()).is_some_and(|id| keep.contains(&id));
        if !kept {
            unstage(&entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folders_are_made_beneath_the_root_and_never_through_a_link() {
        let root = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        make_beneath(root.path(), "a/b").unwrap();
        assert!(root.path().join("a/b").is_dir());
        std::os::unix::fs::symlink(elsewhere.path(), root.path().join("esc")).unwrap();
        let err = make_beneath(root.path(), "esc/c").unwrap_err();
        assert!(err.ends_with("\"esc\" is a symbolic link"), "{err}");
        assert!(!elsewhere.path().join("c").exists());
        assert!(make_beneath(root.path(), "a/../..").is_err());
    }

    #[test]
    fn a_sub_path_through_a_symlink_is_refused_with_the_component_named() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("a/b")).unwrap();
        std::os::unix::fs::symlink("/", root.path().join("esc")).unwrap();
        std::fs::write(root.path().join("file"), "").unwrap();
        let resolve = |sub: &str| open_sub_path(root.path(), sub).map(|d| d.path().to_path_buf());
        assert_eq!(resolve("a/b").unwrap(), root.path().join("a/b"));
        assert_eq!(resolve("").unwrap(), root.path());
        let cases = [
            ("esc", "\"esc\" is a symbolic link"),
            ("esc/etc", "\"esc\" is a symbolic link"),
            ("file", "\"file\" is not a directory"),
            ("nope", "\"nope\" does not exist"),
            ("a/../..", "\"..\" is not a plain name"),
        ];
        for (sub, why) in cases {
            let err = resolve(sub).unwrap_err();
            assert!(err.ends_with(why), "{sub}: {err}");
        }
    }

    #[test]
    fn a_host_path_is_resolved_beneath_its_grant_and_no_link_at_any_depth_leads_out() {
        let grant = tempfile::tempdir().unwrap();
        let g = grant.path();
        std::fs::create_dir_all(g.join("ml/food101/train")).unwrap();
        std::os::unix::fs::symlink("/", g.join("esc")).unwrap();
        std::os::unix::fs::symlink("/etc", g.join("ml/food101/deep")).unwrap();
        std::os::unix::fs::symlink("food101", g.join("ml/inside")).unwrap();
        let resolve = |rel: &str| open_beneath(g, rel).map(|d| d.path().to_path_buf());
        assert_eq!(resolve("ml/food101/train").unwrap(), g.join("ml/food101/train"));
        assert_eq!(resolve("").unwrap(), g);
        let cases = [
            ("esc", "\"esc\" is a symbolic link"),
            ("esc/etc", "\"esc\" is a symbolic link"),
            ("ml/food101/deep", "\"deep\" is a symbolic link"),
            // A link that stays inside the grant is refused all the same.
            ("ml/inside/train", "\"inside\" is a symbolic link"),
            ("ml/../..", "\"..\" is not a plain name"),
            ("../etc", "\"..\" is not a plain name"),
            ("ml//food101", "\"\" is not a plain name"),
        ];
        for (rel, why) in cases {
            let err = resolve(rel).unwrap_err();
            assert!(err.ends_with(why), "{rel}: {err}");
        }
    }

    #[test]
    fn the_fallback_walk_refuses_what_openat2_refuses() {
        let grant = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(grant.path().join("a/b")).unwrap();
        std::os::unix::fs::symlink("/", grant.path().join("a/esc")).unwrap();
        let open = |rel| rustix::fs::openat(CWD, grant.path(), PATH_DIR, Mode::empty()).map(|d| walk(d, rel));
        assert!(open("a/b").unwrap().is_ok());
        let err = open("a/esc/etc").unwrap().unwrap_err();
        assert!(err.ends_with("\"esc\" is a symbolic link"), "{err}");
    }
}
