//! The images this machine holds: reported to the server when they change, and removed, least
//! recently used first, when the disk they are kept on runs short.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::podman::{Image, Podman};
use crate::protocol::ImageReport;

/// How often the list is read again when no pull has changed it.
const CHECK_EVERY: Duration = Duration::from_secs(30);

#[derive(Debug, Default)]
pub struct Images {
    /// Told of a pull or a container's removal: the list is read again at once.
    changed: Notify,
    /// The list as last read, for the next heartbeat; it is read off the heartbeat's path, which
    /// must not wait for podman.
    latest: Mutex<Option<Vec<ImageReport>>>,
    /// When a worker last started from each image (by full name), in this agent's life; an
    /// image not started since counts as used when it was built.
    used: Mutex<HashMap<String, SystemTime>>,
    /// Images workers hold (see [`Images::hold`]), with how many hold each.
    held: Mutex<HashMap<String, usize>>,
}

/// A worker's hold on an image; dropping it lets the image go.
pub struct Hold<'a> {
    images: &'a Images,
    image: String,
}

impl Drop for Hold<'_> {
    fn drop(&mut self) {
        let mut held = self.images.held.lock().expect("not poisoned");
        if let Some(count) = held.get_mut(&self.image) {
            *count -= 1;
            if *count == 0 {
                held.remove(&self.image);
            }
        }
    }
}

impl Images {
    pub fn changed(&self) {
        self.changed.notify_one();
    }

    /// The images as last read; `None` before the first reading.
    pub fn latest(&self) -> Option<Vec<ImageReport>> {
        self.latest.lock().expect("not poisoned").clone()
    }

    /// A worker starts from `image` now.
    pub fn used(&self, image: &str) {
        self.used.lock().expect("not poisoned").insert(image.to_owned(), SystemTime::now());
        self.changed();
    }

    /// Holds `image` (its full name) for a worker until the guard drops: while the worker pulls
    /// it and makes its container, podman counts no use of it, and it must not be removed then.
    pub fn hold(&self, image: &str) -> Hold<'_> {
        *self.held.lock().expect("not poisoned").entry(image.to_owned()).or_default() += 1;
        Hold { images: self, image: image.to_owned() }
    }

    fn in_hand(&self, image: &Image) -> bool {
        let held = self.held.lock().expect("not poisoned");
        // An image being pulled may be listed before it is named: while a worker holds any
        // image, one without a name may be the one it pulls.
        if image.names.is_empty() && !held.is_empty() {
            return true;
        }
        image.names.iter().any(|n| held.get(n).is_some_and(|&count| count > 0))
    }

    fn last_used(&self, image: &Image) -> SystemTime {
        let used = self.used.lock().expect("not poisoned");
        let built = UNIX_EPOCH + Duration::from_secs(image.created.max(0) as u64);
        image.names.iter().filter_map(|n| used.get(n)).copied().max().unwrap_or(built)
    }
}

/// What a heartbeat says of `images`, in a stable order.
pub fn report(images: &[Image]) -> Vec<ImageReport> {
    let mut out: Vec<ImageReport> = images
        .iter()
        .map(|i| ImageReport {
            name: i.names.first().cloned().unwrap_or_else(|| "<none>".into()),
            digest: i.digest.clone(),
            bytes: i.bytes,
        })
        .collect();
    out.sort_by(|a, b| (&a.name, &a.digest).cmp(&(&b.name, &b.digest)));
    out
}

/// The images to remove so that `free` bytes become at least `keep_free`: those no container
/// uses, least recently used first, until enough would be freed.
pub fn to_remove(
    images: &[Image],
    last_used: impl Fn(&Image) -> SystemTime,
    free: u64,
    keep_free: u64,
) -> Vec<&Image> {
    if free >= keep_free {
        return vec![];
    }
    let mut unused: Vec<&Image> = images.iter().filter(|i| i.containers == 0).collect();
    unused.sort_by_key(|i| last_used(i));
    let mut freed = 0;
    unused
        .into_iter()
        .take_while(|i| {
            let more = free + freed < keep_free;
            freed += i.bytes;
            more
        })
        .collect()
}

/// Reads the images when told of a change, and every `CHECK_EVERY`, until `stop`.
pub async fn watch(podman: &Podman, state: &Images, keep_free: u64, stop: CancellationToken) {
    // Where podman keeps images does not move while the agent runs.
    let mut root = None;
    loop {
        if root.is_none() {
            root = podman
                .graph_root()
                .await
                .inspect_err(|e| tracing::warn!(error = %e, "cannot ask podman where it keeps images"))
                .ok();
        }
        let listed = match &root {
            Some(root) => reconcile(podman, state, root, keep_free).await,
            None => Err("podman did not say where it keeps images".to_owned()),
        };
        match listed {
            Ok(list) => *state.latest.lock().expect("not poisoned") = Some(list),
            Err(e) => tracing::warn!(error = %e, "cannot list this machine's images"),
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = state.changed.notified() => {}
            _ = tokio::time::sleep(CHECK_EVERY) => {}
        }
    }
}

/// Reads the machine's images, removes what the disk cannot keep, and returns what is left.
pub async fn reconcile(
    podman: &Podman,
    state: &Images,
    root: &Path,
    keep_free: u64,
) -> Result<Vec<ImageReport>, String> {
    let images = podman.images().await?;
    let free = free_bytes(root);
    let removable: Vec<Image> = images.iter().filter(|i| !state.in_hand(i)).cloned().collect();
    let doomed = to_remove(&removable, |i| state.last_used(i), free, keep_free);
    if doomed.is_empty() {
        return Ok(report(&images));
    }
    for image in &doomed {
        // A worker may have taken it since the list was read: it pulls nothing, and creates
        // its container from this very image.
        if state.in_hand(image) {
            continue;
        }
        match podman.remove_image(&image.id).await {
            Ok(()) => {
                tracing::info!(image = ?image.names, bytes = image.bytes, "removed an unused image: the disk is short")
            }
            Err(e) => tracing::warn!(image = ?image.names, error = %e, "cannot remove an unused image"),
        }
    }
    Ok(report(&podman.images().await?))
}

fn free_bytes(path: &Path) -> u64 {
    rustix::fs::statvfs(path).map(|s| s.f_bavail * s.f_frsize).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(id: &str, bytes: u64, created: i64, containers: u64) -> Image {
        Image {
            id: id.into(),
            names: vec![format!("docker.io/library/{id}:1")],
            digest: format!("sha256:{id}"),
            bytes,
            created,
            containers,
        }
    }

    #[test]
    fn unused_images_go_least_recently_used_first_until_enough_is_free() {
        let images =
            [image("a", 100, 10, 0), image("b", 300, 20, 0), image("c", 500, 5, 1), image("d", 200, 30, 0)];
        let at = |i: &Image| UNIX_EPOCH + Duration::from_secs(i.created as u64);
        let ids = |v: Vec<&Image>| v.iter().map(|i| i.id.clone()).collect::<Vec<_>>();
        // Free 1000 of 1000 wanted: nothing goes.
        assert!(to_remove(&images, at, 1000, 1000).is_empty());
        // 950 free, 1000 wanted: the oldest unused image (a, 100 bytes) is enough.
        assert_eq!(ids(to_remove(&images, at, 950, 1000)), ["a"]);
        // 700 free: a (100) then b (300) make 1100; c is in use and never goes.
        assert_eq!(ids(to_remove(&images, at, 700, 1000)), ["a", "b"]);
        // Far short: every unused image, still oldest first.
        assert_eq!(ids(to_remove(&images, at, 0, u64::MAX)), ["a", "b", "d"]);
    }

    #[test]
    fn a_recent_start_makes_an_old_image_the_last_to_go() {
        let state = Images::default();
        let images = [image("a", 100, 10, 0), image("b", 100, 20, 0)];
        state.used("docker.io/library/a:1");
        let order = to_remove(&images, |i| state.last_used(i), 0, u64::MAX);
        assert_eq!(order.iter().map(|i| i.id.as_str()).collect::<Vec<_>>(), ["b", "a"]);
    }

    #[test]
    fn an_image_is_in_hand_while_a_worker_holds_it() {
        let state = Images::default();
        let (a, b) = (image("a", 100, 10, 0), image("b", 100, 20, 0));
        let first = state.hold("docker.io/library/a:1");
        let second = state.hold("docker.io/library/a:1");
        assert!(state.in_hand(&a));
        assert!(!state.in_hand(&b), "never held");
        drop(first);
        assert!(state.in_hand(&a), "still held by the second worker");
        drop(second);
        assert!(!state.in_hand(&a));

        // An image listed without a name may be one being pulled: kept while any is held.
        let unnamed = Image { names: vec![], ..image("c", 100, 30, 0) };
        assert!(!state.in_hand(&unnamed));
        let pulling = state.hold("docker.io/library/c:1");
        assert!(state.in_hand(&unnamed));
        drop(pulling);
        assert!(!state.in_hand(&unnamed));
    }

    #[test]
    fn the_report_names_each_image_once_in_a_stable_order() {
        let mut nameless = image("z", 1, 0, 0);
        nameless.names.clear();
        let r = report(&[image("b", 2, 0, 0), nameless, image("a", 3, 0, 0)]);
        let names: Vec<&str> = r.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(names, ["<none>", "docker.io/library/a:1", "docker.io/library/b:1"]);
    }
}
