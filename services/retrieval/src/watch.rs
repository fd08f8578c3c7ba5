//! The folder watcher of one KB: `notify` (inotify on Linux) on the KB root, recursive; an
//! editor's burst of events (write, rename over, chmod) becomes one batch of paths
//! [`DEBOUNCE`] after the last event (at most [`MAX_DELAY`] after the first). The batches go to
//! the indexer ([`crate::indexer::Indexer::on_paths`]), which decides per path: index, delete,
//! or rescan. A folder inside the root that cannot be watched (inotify needs read permission on
//! each folder it watches) does not stop the others from being watched: see [`start`].
//!
//! Reads are not changes: inotify also reports every `open` (notify watches `IN_OPEN`), of a
//! file and of a folder being listed, so the indexer's own reads, a grep search and the user's
//! `cat` would each come back as events — and a rescan, which opens every folder, would trigger
//! the next rescan forever. Access events other than close-after-write are dropped here.
use std::path::{Path, PathBuf};
use std::time::Duration;

use notify::event::{AccessKind, AccessMode, EventKind};
use notify::{RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Quiet time after the last event before a batch is delivered.
pub const DEBOUNCE: Duration = Duration::from_millis(300);
/// Longest a batch is held while events keep coming (so a busy folder still gets indexed).
pub const MAX_DELAY: Duration = Duration::from_secs(1);

/// Why a watcher could not start.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    /// `notify` refused (the folder is gone, or the inotify watch limit is reached).
    #[error("cannot watch {path}: {source}")]
    Notify {
        /// The KB root.
        path: String,
        /// The cause.
        source: notify::Error,
    },
}

/// A live watcher; dropping it stops watching (and closes its batch channel).
pub struct KbWatcher {
    watcher: RecommendedWatcher,
    batcher: tokio::task::JoinHandle<()>,
    /// `Some` when the recursive watch failed (a folder inside cannot be watched): every
    /// readable folder is then watched on its own ([`KbWatcher::refresh`]).
    per_folder: Option<PerFolder>,
}

/// The per-folder mode's state.
struct PerFolder {
    root: PathBuf,
    skip: Vec<PathBuf>,
    watched: std::collections::HashSet<PathBuf>,
    /// Folders that could not be watched, relative to the root, with why.
    unwatched: Vec<(String, String)>,
}

impl KbWatcher {
    /// Folders that are not watched (relative to the root, `/`-separated) and why: empty when
    /// the recursive watch works.
    pub fn unwatched(&self) -> Vec<(String, String)> {
        self.per_folder.as_ref().map(|p| p.unwatched.clone()).unwrap_or_default()
    }

    /// In per-folder mode, watches the folders created since the last call and tries again the
    /// ones that could not be watched (a reconcile pass calls this before it walks, so a file
    /// created after it is an event, one created before is in the walk). Blocking: reads the
    /// folder tree. A no-op with a recursive watch (notify adds new folders itself).
    pub fn refresh(&mut self) {
        let Some(pf) = &mut self.per_folder else { return };
        pf.unwatched.clear();
        let mut stack = vec![pf.root.clone()];
        let mut present = std::collections::HashSet::new();
        while let Some(dir) = stack.pop() {
            present.insert(dir.clone());
            let rel = || crate::indexer::relative(&pf.root, &dir).unwrap_or_else(|| ".".into());
            if !pf.watched.contains(&dir) {
                match self.watcher.watch(&dir, RecursiveMode::NonRecursive) {
                    Ok(()) => {
                        pf.watched.insert(dir.clone());
                    }
                    Err(e) => {
                        pf.unwatched.push((rel(), e.to_string()));
                        continue;
                    }
                }
            }
            let entries = match std::fs::read_dir(&dir) {
                Ok(r) => r,
                Err(e) => {
                    pf.unwatched.push((rel(), format!("cannot list it: {e}")));
                    continue;
                }
            };
            for entry in entries.flatten() {
                // Not through symlinks (as the recursive watch), not into hidden folders (the
                // walk skips them), not into COFFER_HOME.
                let hidden = entry.file_name().to_string_lossy().starts_with('.');
                let path = entry.path();
                if !hidden
                    && entry.file_type().is_ok_and(|t| t.is_dir())
                    && !pf.skip.iter().any(|s| path.starts_with(s))
                {
                    stack.push(path);
                }
            }
        }
        // Folders gone since: their watches went with them.
        pf.watched.retain(|d| present.contains(d));
        pf.unwatched.sort();
    }
}

impl Drop for KbWatcher {
    fn drop(&mut self) {
        self.batcher.abort();
    }
}

impl std::fmt::Debug for KbWatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KbWatcher")
    }
}

/// A batch of changed paths (absolute, under the watched root), or a watcher error.
#[derive(Debug)]
pub enum Batch {
    /// Paths that changed (created, modified, removed or renamed from/to), sorted, unique.
    Paths(Vec<PathBuf>),
    /// The watcher reported an error (events may have been lost: rescan).
    Error(String),
}

/// Whether an event can mean the content or the set of files changed: everything but reads
/// (open, close without write, other access).
pub fn is_change(kind: &EventKind) -> bool {
    match kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) => false,
        _ => true,
    }
}

/// Watches `root` recursively; batches go to `tx` until the returned watcher is dropped. Must
/// be called inside a Tokio runtime (the batching runs as a task).
///
/// # Errors
/// [`WatchError::Notify`] when the folder cannot be watched.
///
/// When the recursive watch fails because a folder inside cannot be watched (inotify needs read
/// permission on each folder), the root and every folder that can be are watched one by one
/// instead, skipping hidden folders and those under `skip`; [`KbWatcher::unwatched`] names the
/// others, and [`KbWatcher::refresh`] follows the tree as it changes.
pub fn start(root: &Path, skip: &[PathBuf], tx: mpsc::UnboundedSender<Batch>) -> Result<KbWatcher, WatchError> {
    match start_with(root, RecursiveMode::Recursive, tx.clone()) {
        Ok(w) => Ok(w),
        // The root itself cannot be watched (gone, unreadable, out of inotify watches): nothing
        // per folder would do better.
        Err(e) if start_with(root, RecursiveMode::NonRecursive, mpsc::unbounded_channel().0).is_err() => Err(e),
        Err(_) => {
            let mut w = start_with(root, RecursiveMode::NonRecursive, tx)?;
            w.per_folder = Some(PerFolder {
                root: root.to_owned(),
                skip: skip.to_vec(),
                watched: std::iter::once(root.to_owned()).collect(),
                unwatched: Vec::new(),
            });
            w.refresh();
            Ok(w)
        }
    }
}

/// Watches `dir` itself, not its subfolders: the entries created, removed or renamed in it
/// (how the indexer sees a vanished KB folder come back, from its parent). Must be called
/// inside a Tokio runtime.
///
/// # Errors
/// [`WatchError::Notify`] when the folder cannot be watched.
pub fn start_shallow(dir: &Path, tx: mpsc::UnboundedSender<Batch>) -> Result<KbWatcher, WatchError> {
    start_with(dir, RecursiveMode::NonRecursive, tx)
}

fn start_with(root: &Path, mode: RecursiveMode, tx: mpsc::UnboundedSender<Batch>) -> Result<KbWatcher, WatchError> {
    let err = |source| WatchError::Notify { path: root.display().to_string(), source };
    let (events_tx, events) = mpsc::unbounded_channel::<notify::Result<notify::Event>>();
    let handler = move |res: notify::Result<notify::Event>| {
        if res.as_ref().is_ok_and(|e| !is_change(&e.kind)) {
            return;
        }
        // The receiver is gone only once the watcher is being dropped.
        let _ = events_tx.send(res);
    };
    // Symlinks are not followed: notify's recursive watch would otherwise walk into whatever a
    // link points at (a link to /sys/devices never ends); folders inside the root are watched
    // at their real path anyway, and the walk refuses links that leave the root.
    let config = notify::Config::default().with_follow_symlinks(false);
    let mut watcher = RecommendedWatcher::new(handler, config).map_err(err)?;
    watcher.watch(root, mode).map_err(err)?;
    Ok(KbWatcher { watcher, batcher: tokio::spawn(batch(events, tx)), per_folder: None })
}

/// Collects events into batches: one batch per burst (quiet for [`DEBOUNCE`], or [`MAX_DELAY`]
/// after its first event).
async fn batch(mut events: mpsc::UnboundedReceiver<notify::Result<notify::Event>>, tx: mpsc::UnboundedSender<Batch>) {
    while let Some(first) = events.recv().await {
        let until = Instant::now() + MAX_DELAY;
        let (mut paths, mut error) = (Vec::new(), None);
        let mut absorb = |ev: notify::Result<notify::Event>| match ev {
            Ok(e) => paths.extend(e.paths),
            Err(e) => error = Some(e.to_string()),
        };
        absorb(first);
        let mut open = true;
        while open {
            let quiet = (Instant::now() + DEBOUNCE).min(until);
            match tokio::time::timeout_at(quiet, events.recv()).await {
                Ok(Some(ev)) => absorb(ev),
                Ok(None) => open = false,
                Err(_) => break,
            }
        }
        if let Some(e) = error {
            let _ = tx.send(Batch::Error(e));
        }
        paths.sort();
        paths.dedup();
        if !paths.is_empty() && tx.send(Batch::Paths(paths)).is_err() {
            return;
        }
        if !open {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_edit_arrives_as_one_batch_and_a_missing_folder_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().canonicalize().unwrap();
        // The folder exists before watching: a file written into a folder created a moment
        // earlier can beat inotify's watch on it (the indexer rescans on a folder event).
        std::fs::create_dir(root.join("sub")).unwrap();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let _w = start(&root, &[], tx).unwrap();
        std::fs::write(root.join("sub").join("a.md"), "one").unwrap();
        let mut seen = Vec::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while !seen.contains(&root.join("sub").join("a.md")) {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(Batch::Paths(p))) => seen.extend(p),
                other => panic!("no batch for sub/a.md: {other:?} (seen {seen:?})"),
            }
        }
        let (tx, _rx) = mpsc::unbounded_channel();
        let e = start(&root.join("absent"), &[], tx).unwrap_err().to_string();
        assert!(e.contains("absent"), "{e}");
    }

    #[tokio::test]
    async fn reads_and_listings_are_not_changes() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().canonicalize().unwrap();
        std::fs::create_dir(root.join("sub")).unwrap();
        std::fs::write(root.join("sub").join("a.md"), "one").unwrap();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let _w = start(&root, &[], tx).unwrap();
        // Reads and listings: nothing must come of them …
        for _ in 0..3 {
            assert_eq!(std::fs::read_to_string(root.join("sub").join("a.md")).unwrap(), "one");
            assert_eq!(std::fs::read_dir(root.join("sub")).unwrap().count(), 1);
        }
        // … then a write, whose batch must be the first and hold only that file.
        std::fs::write(root.join("sub").join("b.md"), "two").unwrap();
        let first = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await;
        match first {
            Ok(Some(Batch::Paths(p))) => assert_eq!(p, [root.join("sub").join("b.md")]),
            other => panic!("expected the write's batch first: {other:?}"),
        }
    }

    #[tokio::test]
    async fn symlinked_folders_are_not_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path().canonicalize().unwrap();
        let (root, outside) = (base.join("kb"), base.join("outside"));
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("link")).unwrap();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let _w = start(&root, &[], tx).unwrap();
        // A change behind the link is not watched; the next change inside is the first batch.
        std::fs::write(outside.join("x.md"), "outside").unwrap();
        std::fs::write(root.join("a.md"), "inside").unwrap();
        match tokio::time::timeout(Duration::from_secs(5), rx.recv()).await {
            Ok(Some(Batch::Paths(p))) => assert_eq!(p, [root.join("a.md")]),
            other => panic!("expected the inside write's batch first: {other:?}"),
        }
    }
}
