//! Files and folders beneath a copy's folder, reached from its descriptor one component at a
//! time with `O_NOFOLLOW`: no link, at any depth, leads a read or a write out of the copy.
//! Paths come from a manifest, whose components are plain (`Manifest::read` checks them).

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

pub(in crate::agent) use crate::agent::layout::open_dir;

/// The folder holding `path` beneath `root`, and the last component; without making anything.
pub fn open_parent<'p>(root: &OwnedFd, path: &'p str) -> io::Result<(OwnedFd, &'p str)> {
    let (folders, name) = path.rsplit_once('/').map_or(("", path), |(f, n)| (f, n));
    let mut dir = rustix::io::dup(root)?;
    for part in folders.split('/').filter(|p| !p.is_empty()) {
        dir = open_dir(&dir, part)?;
    }
    Ok((dir, name))
}

/// The regular file `name` beneath `parent` for reading, with its size. Non-blocking, so that
/// a fifo put there cannot hold the reader.
pub fn open_file(parent: &OwnedFd, name: &str) -> io::Result<(File, u64)> {
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK | OFlags::NOCTTY;
    let fd = rustix::fs::openat(parent, name, flags, Mode::empty())?;
    let st = rustix::fs::fstat(&fd)?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return Err(io::Error::other("not a regular file"));
    }
    Ok((File::from(fd), st.st_size.max(0) as u64))
}

/// Removes `name` beneath `parent`, a folder and what it holds included, following no link.
pub fn remove(parent: &OwnedFd, name: &str) -> io::Result<()> {
    match rustix::fs::unlinkat(parent, name, AtFlags::empty()) {
        Ok(()) | Err(Errno::NOENT) => Ok(()),
        // std's removal opens each folder beneath its parent and never follows a link.
        Err(Errno::ISDIR) => std::fs::remove_dir_all(format!("/proc/self/fd/{}/{name}", parent.as_raw_fd())),
        Err(e) => Err(e.into()),
    }
}

/// The folder `name` beneath `parent`, made (mode 0755) when missing; whatever else stands
/// there (a file, a link) is removed first.
pub fn make_dir(parent: &OwnedFd, name: &str) -> io::Result<OwnedFd> {
    match open_dir(parent, name) {
        Ok(fd) => return Ok(fd),
        Err(e) if e.raw_os_error() == Some(Errno::NOENT.raw_os_error()) => {}
        Err(_) => remove(parent, name)?,
    }
    match rustix::fs::mkdirat(parent, name, Mode::from_raw_mode(0o755)) {
        Ok(()) | Err(Errno::EXIST) => {}
        Err(e) => return Err(e.into()),
    }
    open_dir(parent, name)
}

/// The folders of a walk through a manifest's paths, in order: consecutive paths mostly share
/// their folders, which are then opened (or made) once.
pub struct Dirs {
    root: OwnedFd,
    /// The open folders beneath `root`, outermost first, with their names.
    open: Vec<(String, OwnedFd)>,
}

impl Dirs {
    pub fn new(root: OwnedFd) -> Dirs {
        Dirs { root, open: vec![] }
    }

    pub fn root(&self) -> &OwnedFd {
        &self.root
    }

    /// The folder holding `path` and the last component. `make`: missing folders are made
    /// (and what stands in their place removed); otherwise a missing one is an error.
    pub fn parent<'p>(&mut self, path: &'p str, make: bool) -> io::Result<(&OwnedFd, &'p str)> {
        let (folders, name) = path.rsplit_once('/').map_or(("", path), |(f, n)| (f, n));
        let parts: Vec<&str> = folders.split('/').filter(|p| !p.is_empty()).collect();
        let same = self.open.iter().zip(&parts).take_while(|((open, _), part)| open == **part).count();
        self.open.truncate(same);
        for part in &parts[same..] {
            let parent = self.open.last().map_or(&self.root, |(_, fd)| fd);
            let fd = if make { make_dir(parent, part)? } else { open_dir(parent, *part)? };
            self.open.push(((*part).to_owned(), fd));
        }
        Ok((self.open.last().map_or(&self.root, |(_, fd)| fd), name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root(dir: &std::path::Path) -> OwnedFd {
        open_dir(rustix::fs::CWD, dir.to_str().unwrap()).unwrap()
    }

    #[test]
    fn nothing_is_reached_through_a_link() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "s").unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("link")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), dir.path().join("file")).unwrap();
        let root = root(dir.path());
        assert!(open_parent(&root, "link/secret").is_err());
        assert!(open_file(&root, "file").is_err());
        assert!(Dirs::new(rustix::io::dup(&root).unwrap()).parent("link/secret", false).is_err());

        // Made where a link stood, the folder is a new one: the link's target is untouched.
        let mut dirs = Dirs::new(root);
        let (parent, name) = dirs.parent("link/secret", true).unwrap();
        assert_eq!(name, "secret");
        assert!(open_file(parent, name).is_err());
        assert!(dir.path().join("link").is_dir() && outside.path().join("secret").exists());
        remove(dirs.root(), "link").unwrap();
        assert!(!dir.path().join("link").exists() && outside.path().join("secret").exists());
    }

    #[test]
    fn consecutive_paths_reuse_their_folders() {
        let dir = tempfile::tempdir().unwrap();
        let mut dirs = Dirs::new(root(dir.path()));
        for path in ["a/b/c", "a/b/d", "a/e", "f"] {
            let (parent, name) = dirs.parent(path, true).unwrap();
            let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC;
            rustix::fs::openat(parent, name, flags, Mode::from_raw_mode(0o644)).unwrap();
        }
        for path in ["a/b/c", "a/b/d", "a/e", "f"] {
            assert!(dir.path().join(path).is_file(), "{path}");
        }
        let (parent, name) = open_parent(dirs.root(), "a/b/c").unwrap();
        assert_eq!(open_file(&parent, name).unwrap().1, 0);
    }
}
