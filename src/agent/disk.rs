//! The data location on disk: its usage, and the copies in `drives/<namespace>.<drive>`.

use std::path::Path;

use crate::protocol::{CopyReport, DataUsage, HeartbeatRequest};

/// The file a fill writes last: a copy without it is not whole.
pub const MARKER: &str = ".astralyx-filled";

/// What a heartbeat says about `dir`: its usage and each copy's bytes and marker.
pub fn report(dir: &Path) -> HeartbeatRequest {
    let copies = copies(dir);
    let used_bytes = copies.iter().map(|c| c.bytes).sum();
    let (total_bytes, free_bytes) = match rustix::fs::statvfs(dir) {
        Ok(s) => (s.f_blocks * s.f_frsize, s.f_bavail * s.f_frsize),
        Err(_) => (0, 0),
    };
    HeartbeatRequest {
        data_location: DataUsage { total_bytes, used_bytes, free_bytes },
        copies,
        images: None,
    }
}

fn copies(dir: &Path) -> Vec<CopyReport> {
    let Ok(entries) = std::fs::read_dir(dir.join("drives")) else { return vec![] };
    entries
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| {
            let drive = e.file_name().into_string().ok()?;
            let path = e.path();
            let complete = std::fs::symlink_metadata(path.join(MARKER)).is_ok_and(|m| m.is_file());
            Some(CopyReport { drive, bytes: bytes_under(&path), complete, last_used_at: None })
        })
        .collect()
}

/// Bytes of the files below `path`, not following symlinks.
fn bytes_under(path: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(path) else { return 0 };
    entries
        .filter_map(Result::ok)
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => bytes_under(&e.path()),
            Ok(m) if m.is_file() => m.len(),
            _ => 0,
        })
        .sum()
}

/// Removes a copy the server no longer wants. `folder` must be a plain name.
pub fn delete_copy(dir: &Path, folder: &str) {
    if folder.is_empty() || folder.contains('/') || folder == "." || folder == ".." {
        tracing::warn!(folder, "refusing to delete a copy with a strange name");
        return;
    }
    let path = dir.join("drives").join(folder);
    match std::fs::remove_dir_all(&path) {
        Ok(()) => tracing::info!(path = %path.display(), "deleted copy"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(path = %path.display(), error = %e, "cannot delete copy"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_report_bytes_and_marker() {
        let dir = tempfile::tempdir().unwrap();
        let copy = dir.path().join("drives/default.food101/food101");
        std::fs::create_dir_all(&copy).unwrap();
        std::fs::write(copy.join("a.parquet"), vec![0u8; 1000]).unwrap();
        let r = report(dir.path());
        assert_eq!(r.copies.len(), 1);
        assert_eq!(
            (r.copies[0].drive.as_str(), r.copies[0].bytes, r.copies[0].complete),
            ("default.food101", 1000, false)
        );
        std::fs::write(dir.path().join("drives/default.food101").join(MARKER), b"").unwrap();
        assert!(report(dir.path()).copies[0].complete);
        assert!(r.data_location.total_bytes > 0);
        delete_copy(dir.path(), "default.food101");
        assert!(report(dir.path()).copies.is_empty());
    }
}
