//! The folder watcher of one KB: `notify` (inotify on Linux) on the KB root, recursive, behind
//! `notify-debouncer-mini` so an editor's burst of events (write, rename over, chmod) becomes one
//! batch of paths ~[`DEBOUNCE`] after the last event. The batches go to the indexer
//! ([`crate::indexer::Indexer::on_paths`]), which decides per path: index, delete, or rescan.
use std::path::{Path, PathBuf};
use std::time::Duration;

use notify::{RecommendedWatcher, RecursiveMode};
use notify_debouncer_mini::{DebounceEventResult, Debouncer, new_debouncer};
use tokio::sync::mpsc;

/// Quiet time after the last event before a batch is delivered.
pub const DEBOUNCE: Duration = Duration::from_millis(300);

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
    _debouncer: Debouncer<RecommendedWatcher>,
}

impl std::fmt::Debug for KbWatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KbWatcher")
    }
}

/// A batch of changed paths (absolute, under the watched root), or a watcher error.
#[derive(Debug)]
pub enum Batch {
    /// Paths that changed (created, modified, removed or renamed from/to).
    Paths(Vec<PathBuf>),
    /// The watcher reported an error (events may have been lost: rescan).
    Error(String),
}

/// Watches `root` recursively; batches go to `tx` until the returned watcher is dropped.
///
/// # Errors
/// [`WatchError::Notify`] when the folder cannot be watched.
pub fn start(root: &Path, tx: mpsc::UnboundedSender<Batch>) -> Result<KbWatcher, WatchError> {
    let err = |source| WatchError::Notify { path: root.display().to_string(), source };
    let mut debouncer = new_debouncer(DEBOUNCE, move |res: DebounceEventResult| {
        let batch = match res {
            Ok(events) => Batch::Paths(events.into_iter().map(|e| e.path).collect()),
            Err(e) => Batch::Error(e.to_string()),
        };
        // The receiver is gone only while the KB is being removed.
        let _ = tx.send(batch);
    })
    .map_err(err)?;
    debouncer.watcher().watch(root, RecursiveMode::Recursive).map_err(err)?;
    Ok(KbWatcher { _debouncer: debouncer })
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
        let _w = start(&root, tx).unwrap();
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
        let e = start(&root.join("absent"), tx).unwrap_err().to_string();
        assert!(e.contains("absent"), "{e}");
    }
}
