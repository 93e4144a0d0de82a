//! Whole copies that lost files since their manifest was made (deleted or cut on the machine,
//! beneath the agent). The sign is cheap: a walk of the whole copy (the measurer's) counts other
//! files or bytes than the manifest's header. Only then is the copy compared with its manifest,
//! by sizes, which names what it lost without reading a file. A heartbeat reports such a copy as
//! no longer whole, with what it lost, and it is filled again when next needed.

use std::collections::HashMap;
use std::io::BufReader;
use std::os::fd::OwnedFd;

use super::{Digest, Manifest, check, stored, walk};
use crate::agent::sizes::Sizes;
use crate::protocol::LostFiles;

/// Paths a report names at most; its count says how many there are in all.
pub const NAMED: usize = LostFiles::NAMED;

/// A copy's files and bytes, as a manifest lists them or a walk counts them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Totals {
    pub files: u64,
    pub bytes: u64,
}

/// What was found of each copy with a manifest, by folder.
#[derive(Debug, Default)]
pub(super) struct Lost {
    /// The totals each manifest's header lists, read once per manifest.
    listed: HashMap<String, (Digest, Totals)>,
    /// The manifest and the walk last compared, and what the copy lost then.
    found: HashMap<String, (Digest, Totals, Option<LostFiles>)>,
}

impl Lost {
    /// What the copy in `folder` lost since its manifest `digest` was made, as last found.
    pub(super) fn of(&self, folder: &str, digest: &Digest) -> Option<LostFiles> {
        let (compared, _, lost) = self.found.get(folder)?;
        (compared == digest).then(|| lost.clone()).flatten()
    }

    /// Forgets `folder`: it is written to, or its manifest is gone.
    pub(super) fn forget(&mut self, folder: &str) {
        self.listed.remove(folder);
        self.found.remove(folder);
    }

    /// What to do next about `folder`, whose manifest is `digest`, measured at `measured`.
    pub(super) fn next(&mut self, folder: &str, digest: &Digest, measured: Totals) -> Next {
        let Some((_, listed)) = self.listed.get(folder).filter(|(d, _)| d == digest) else {
            return Next::ReadTotals;
        };
        if self.found.get(folder).is_some_and(|(d, at, _)| d == digest && *at == measured) {
            return Next::Known;
        }
        if *listed == measured {
            self.found.insert(folder.to_owned(), (*digest, measured, None));
            return Next::Known;
        }
        Next::Compare
    }

    /// Records the totals in the header of `folder`'s manifest `digest`.
    pub(super) fn listed(&mut self, folder: &str, digest: &Digest, totals: Totals) {
        self.listed.insert(folder.to_owned(), (*digest, totals));
    }

    /// Records what comparing `folder` with its manifest `digest` at `measured` found.
    pub(super) fn found(&mut self, folder: &str, digest: &Digest, measured: Totals, lost: Option<LostFiles>) {
        self.found.insert(folder.to_owned(), (*digest, measured, lost));
    }

    /// Keeps only what is known of `kept`'s folders.
    pub(super) fn retain(&mut self, kept: &HashMap<String, (uuid::Uuid, Digest)>) {
        self.listed.retain(|f, (d, _)| kept.get(f).is_some_and(|(_, k)| k == d));
        self.found.retain(|f, (d, ..)| kept.get(f).is_some_and(|(_, k)| k == d));
    }
}

/// What to do about a copy whose manifest is `digest`, measured whole at `measured`.
pub(super) enum Next {
    /// Nothing: compared already at this measure, or the measure matches the header.
    Known,
    /// Its header's totals, to be read from the store.
    ReadTotals,
    /// Compare the copy with its manifest: the totals differ.
    Compare,
}

/// The copy's latest measure, when its walk counted the whole copy.
pub(super) fn measured(sizes: &Sizes, folder: &str) -> Option<Totals> {
    let size = sizes.size(folder).filter(|s| s.whole)?;
    Some(Totals { files: size.files, bytes: size.bytes })
}

/// The totals in the header of the manifest `name` in the store.
pub(super) fn header(store: &OwnedFd, name: &str) -> Option<Totals> {
    let (header, _) = stored::header(&mut BufReader::new(stored::open(store, name)?))?;
    Some(Totals { files: header.files, bytes: header.bytes })
}

/// Compares the copy `folder` in `drives/` with its manifest `name` in the store (checked
/// against `digest`) by sizes: what it lost, or `None` when nothing listed is missing or of
/// another size. `Err` when either cannot be read.
pub(super) fn compare(
    drives: &OwnedFd,
    folder: &str,
    store: &OwnedFd,
    name: &str,
    digest: &Digest,
) -> Result<Option<LostFiles>, String> {
    let mut file =
        stored::open(store, name).ok_or_else(|| format!("cannot open the manifest of {folder}"))?;
    let manifest = Manifest::read(&mut file, digest).map_err(|e| e.to_string())?;
    let root = walk::open_dir(drives, folder).map_err(|e| format!("cannot open {folder}: {e}"))?;
    let check = check::sizes(root, &manifest)?;
    Ok(lost(check.missing, check.wrong_size))
}

/// Files missing or of another size, in the manifest's order, the first [`NAMED`] named.
fn lost(missing: Vec<String>, wrong_size: Vec<String>) -> Option<LostFiles> {
    let mut paths: Vec<String> = missing.into_iter().chain(wrong_size).collect();
    if paths.is_empty() {
        return None;
    }
    paths.sort_unstable();
    let count = paths.len() as u64;
    paths.truncate(NAMED);
    Some(LostFiles { count, named: paths.iter().map(|p| shown(p)).collect() })
}

/// A path as the server takes it: a fill names its files, and a name with a control character
/// or of the longest length, escaped, would have the whole heartbeat refused.
fn shown(path: &str) -> String {
    let escaped: String = path
        .chars()
        .flat_map(|c| match c.is_control() {
            true => c.escape_default().collect::<Vec<_>>(),
            false => vec![c],
        })
        .collect();
    escaped[..escaped.floor_char_boundary(LostFiles::MAX_PATH_BYTES)].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_copy_lost_is_named_in_order_up_to_a_bound_and_counted_in_full() {
        assert_eq!(lost(vec![], vec![]), None);
        let found = lost(vec!["b".into(), "a".into()], vec!["c".into()]).unwrap();
        assert_eq!(found, LostFiles { count: 3, named: vec!["a".into(), "b".into(), "c".into()] });
        let many: Vec<String> = (0..30).map(|i| format!("f{i:02}")).collect();
        let found = lost(many, vec![]).unwrap();
        assert_eq!((found.count, found.named.len()), (30, NAMED));
        assert_eq!(found.named[0], "f00");
        // Whatever a fill named its files, the report is one the server takes.
        let odd = lost(vec!["a\nb".into(), "\u{1b}".repeat(4000)], vec![]).unwrap();
        assert_eq!(odd.named[0], "\\u{1b}".repeat(4096 / 6) + "\\u{1");
        assert_eq!(odd.named[1], "a\\nb");
        assert_eq!(odd.invalid(), None, "{odd:?}");
    }

    #[test]
    fn a_copy_is_compared_only_when_its_walk_differs_from_its_manifest_and_once_per_walk() {
        let digest = Digest::of(&blake3::Hasher::new());
        let (listed, other) = (Totals { files: 3, bytes: 300 }, Totals { files: 2, bytes: 200 });
        let mut lost = Lost::default();
        assert!(matches!(lost.next("f", &digest, listed), Next::ReadTotals));
        lost.listed("f", &digest, listed);
        assert!(matches!(lost.next("f", &digest, listed), Next::Known), "as listed");
        assert_eq!(lost.of("f", &digest), None);
        assert!(matches!(lost.next("f", &digest, other), Next::Compare), "a file is gone");
        let gone = LostFiles { count: 1, named: vec!["c".into()] };
        lost.found("f", &digest, other, Some(gone.clone()));
        assert!(matches!(lost.next("f", &digest, other), Next::Known), "compared at this walk");
        assert_eq!(lost.of("f", &digest), Some(gone));
        lost.forget("f");
        assert_eq!(lost.of("f", &digest), None);
    }
}
