//! Keeps each KB's index in step with its files: the reconcile pass (at start, on `Reindex`,
//! when the watcher sees a folder change) and single-file updates from the watcher and from
//! `remember`.
//!
//! A pass walks the folder, compares it with what the store holds (`ListDocuments`: mtime and
//! size first; a changed file is read and its content hash decides), sends each changed file
//! as one `UpsertDocument` (the store replaces a document's chunks in one transaction, keeping
//! unchanged chunks and their vectors), with bounded concurrency, deletes the documents whose
//! file is gone, and records files it cannot index (`MarkDocumentError`: binary, not UTF-8,
//! larger than `retrieval.max_file_bytes`). A pass killed midway is simply redone by the next
//! one: per-document transactions leave no duplicate or orphan chunk.
//!
//! Every read-and-write of one file's index entry holds that path's lock, so a pass and the
//! watcher never write an older version over a newer one: whoever takes the lock second reads
//! the file as it is then.
//!
//! A deleted or moved KB folder marks the KB `failed` with why; its index (chunks and vectors) is
//! kept but left out of searches (a warning names it), and a shallow watch on its nearest existing
//! ancestor (plus a re-check every few seconds) notices it come back and asks for a pass —
//! unchanged files keep their chunks and vectors. Removing a KB cancels its pass and waits for the
//! writes in flight (a per-KB lock every write holds shared) before the definition goes, so no
//! document of it is written afterwards. A changed `.gitignore` or `.ignore` makes the watcher ask
//! for a pass, so notes it now hides leave the index. A KB's failing pass backs off (`RETRY` to
//! `RETRY_MAX`) and is logged on state changes only (`coffer_runtime::logging::FailureLog`).
//!
//! A file that cannot be read (permissions, I/O) is that file's error (`cannot read: …`), like
//! a binary one, not the pass's; it is read again by every pass and when the watcher sees it
//! change. A folder that cannot be watched (see [`crate::watch::start`]) is the KB's error and
//! the others are still watched; an idle KB is rescanned every `retrieval.rescan_interval_s`
//! as a safety net for what the watcher cannot see.
use coffer_runtime::logging::{Failing, FailureLog, clip};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use coffer_proto::retrieval::{FileError, JobState, Progress};
use coffer_proto::store::{
    ChunkInput, ClearIndexRequest, DocumentMeta, DocumentRef, KnowledgeBase, ListDocumentsRequest,
    MarkDocumentErrorRequest, NoteLink, UpsertDocumentRequest,
};
use futures_util::StreamExt;
use sha2::{Digest, Sha256};
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;

use crate::config::ConfigRx;
use crate::error::{Error, Result};
use crate::sources::Sources;
use crate::watch::{self, Batch, KbWatcher};
use crate::{markdown, terms, walk};

/// Files indexed at once in a pass.
pub const CONCURRENCY: usize = 4;

/// Bytes looked at for a NUL byte to call a file binary (what git and ripgrep do).
const BINARY_PROBE: usize = 8192;

/// How often a vanished KB folder is looked for besides its ancestor's events.
const RETURN_CHECK: Duration = Duration::from_secs(2);

/// Delay before a pass that failed on the store is tried again.
const RETRY: Duration = Duration::from_secs(2);
/// The longest wait between retries of a pass that keeps failing.
const RETRY_MAX: Duration = Duration::from_secs(300);
/// How often a pass that keeps failing the same way is logged again.
const RETRY_REMIND: Duration = Duration::from_secs(600);

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// What a pass must do, from the walk and the store's documents.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Files to (re)read: new, or mtime or size differ from the stored document.
    pub index: Vec<walk::FileEntry>,
    /// Stored documents whose file the walk did not find.
    pub delete: Vec<String>,
    /// Files whose mtime and size match the stored document.
    pub unchanged: usize,
}

/// The reconcile plan: `files` from the walk against `stored` from `ListDocuments`.
/// A stored document with an error counts as unchanged while mtime and size match (a binary
/// file is not re-read on every pass), except one that could not be read ([`CANNOT_READ`]):
/// its permissions may have changed without its mtime. A clean pass starts from an empty index
/// anyway.
pub fn plan(files: Vec<walk::FileEntry>, stored: &[DocumentMeta]) -> Plan {
    let by_path: HashMap<&str, &DocumentMeta> = stored.iter().map(|d| (d.path.as_str(), d)).collect();
    let mut out = Plan::default();
    let mut seen = std::collections::HashSet::new();
    for f in files {
        seen.insert(f.rel_path.clone());
        match by_path.get(f.rel_path.as_str()) {
            Some(d) if d.mtime_ms == f.mtime_ms && d.size == f.size && !d.error.starts_with(CANNOT_READ) => {
                out.unchanged += 1
            }
            _ => out.index.push(f),
        }
    }
    out.delete = stored.iter().filter(|d| !seen.contains(&d.path)).map(|d| d.path.clone()).collect();
    out.delete.sort();
    out
}

/// The files whose rules the walk follows (the `ignore` crate's: git's and its own): a change
/// to one makes the watcher ask for a pass.
const IGNORE_FILES: [&str; 2] = [".gitignore", ".ignore"];

/// Why a file is not indexed, as `MarkDocumentError` records it; `None` when it can be.
pub fn unindexable(bytes: &[u8], max: u64) -> Option<String> {
    if bytes.len() as u64 > max {
        return Some(too_large(max));
    }
    if bytes[..bytes.len().min(BINARY_PROBE)].contains(&0) {
        return Some("binary".into());
    }
    if let Err(e) = std::str::from_utf8(bytes) {
        return Some(format!("not UTF-8 (invalid byte at offset {})", e.valid_up_to()));
    }
    None
}

/// The start of the error recorded for a file that could not be read ([`cannot_read`]): such a
/// document is read again by every pass (see [`plan`]), unlike a binary or too large one.
pub const CANNOT_READ: &str = "cannot read: ";

/// The error recorded for a file the indexer could not read (`cannot read: Permission denied
/// (os error 13)`).
pub fn cannot_read(e: &std::io::Error) -> String {
    format!("{CANNOT_READ}{e}")
}

fn too_large(max: u64) -> String {
    if max.is_multiple_of(1024 * 1024) {
        format!("larger than the {} MiB limit (retrieval.max_file_bytes)", max / (1024 * 1024))
    } else {
        format!("larger than the {max}-byte limit (retrieval.max_file_bytes)")
    }
}

/// Why a file of `size` bytes, within `retrieval.max_file_bytes` (`max`), is not indexed when
/// its index entry (`encoded` bytes: chunks, their text and index text) is over the store's
/// limit for one document ([`coffer_proto::store::INDEX_MAX_MESSAGE_BYTES`]).
fn too_large_to_store(encoded: usize, size: u64, max: u64) -> String {
    const MIB: f64 = 1024.0 * 1024.0;
    format!(
        "its index entry would be {:.1} MiB (the file is {:.1} MiB), over the store's {} MiB limit \
         for one document; split the file, or lower retrieval.max_file_bytes ({:.1} MiB) to skip such files",
        encoded as f64 / MIB,
        size as f64 / MIB,
        coffer_proto::store::INDEX_MAX_MESSAGE_BYTES / (1024 * 1024),
        max as f64 / MIB
    )
}

/// Hex SHA-256 of a file's content.
pub fn content_hash(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// What a pass or an event did to one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Its chunks were sent to the store.
    Indexed {
        /// Chunks the store added (0: nothing changed).
        added: u32,
    },
    /// It could not be indexed; the store records why.
    Marked,
    /// The file is gone; its document was removed.
    Deleted,
    /// Not a file, or outside the KB (a link that escapes): left alone.
    Skipped,
}

/// The upsert request for `text` (a file of KB `kb` at `rel`): parsed, chunked, each chunk's
/// keyword fields normalized by [`terms::index_text`]; with it, why the front matter was
/// ignored when it is malformed (the note stays searchable; the KB reports the problem).
///
/// # Errors
/// [`Error::Invalid`] when the markdown cannot be parsed (reported as the file's error).
pub fn document_request(
    kb: &str,
    rel: &str,
    text: &str,
    mtime_ms: i64,
    size: u64,
    hash: String,
) -> Result<(UpsertDocumentRequest, Option<String>)> {
    let fallback =
        Path::new(rel).file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| rel.to_owned());
    let (doc, front_matter_error) = markdown::parse_lenient(text, &fallback, &markdown::ChunkOptions::default())
        .map_err(|e| Error::Invalid(e.to_string()))?;
    let note = front_matter_error.map(|e| format!("front matter ignored: {e}"));
    let index_title = terms::index_text(&doc.title);
    // Front matter tags first, then the body's inline `#tags` not already among them.
    let mut tags = doc.front_matter.as_ref().map(|f| f.tags.clone()).unwrap_or_default();
    for t in &doc.inline_tags {
        if !tags.iter().any(|f| f.to_lowercase() == t.to_lowercase()) {
            tags.push(t.clone());
        }
    }
    tags.truncate(MAX_TAGS);
    let aliases = doc.front_matter.as_ref().map(|f| f.aliases.clone()).unwrap_or_default();
    let links = doc
        .links
        .iter()
        .map(|l| NoteLink {
            target: clip_bytes(&l.target, MAX_LINK_TEXT_BYTES),
            fragment: clip_bytes(&l.fragment, MAX_LINK_TEXT_BYTES),
            alias: clip_bytes(&l.alias, MAX_LINK_TEXT_BYTES),
            embed: l.embed,
            line: l.line,
        })
        .collect();
    let chunks = doc
        .chunks
        .into_iter()
        .map(|c| ChunkInput {
            index_title: index_title.clone(),
            index_headings: terms::index_text(&c.heading_path.join(" ")),
            index_body: terms::index_text(&c.text),
            heading_path: c.heading_path,
            line_start: c.line_start,
            line_end: c.line_end,
            hash: c.hash,
            text: c.text,
        })
        .collect();
    let req = UpsertDocumentRequest {
        kb: kb.into(),
        path: rel.into(),
        mtime_ms,
        size,
        hash,
        title: doc.title,
        tags,
        chunks,
        kb_created_ms: 0,
        links,
        aliases: aliases.into_iter().take(MAX_TAGS).map(|a| clip_bytes(&a, 256)).collect(),
    };
    Ok((req, note))
}

/// Most tags (front matter and inline) and aliases sent for one document (the store's limit).
const MAX_TAGS: usize = 256;
/// Longest link target, fragment or alias sent (bytes; the store's limit).
const MAX_LINK_TEXT_BYTES: usize = 1024;

/// `s` cut to at most `max` bytes at a character boundary.
fn clip_bytes(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

fn mtime_ms(meta: &std::fs::Metadata) -> i64 {
    meta.modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// The `/`-separated path of `p` relative to `root`, if `p` is under it (no `..`).
pub fn relative(root: &Path, p: &Path) -> Option<String> {
    let rest = p.strip_prefix(root).ok()?;
    let mut parts = Vec::new();
    for c in rest.components() {
        match c {
            std::path::Component::Normal(s) => parts.push(s.to_str()?.to_owned()),
            _ => return None,
        }
    }
    (!parts.is_empty()).then(|| parts.join("/"))
}

/// A per-path lock's key: (KB, path relative to its root).
type PathKey = (String, String);

/// One KB's live state: progress of its passes, the watcher, what the last walk reported.
pub struct KbRuntime {
    name: String,
    state: Mutex<RunState>,
    wake: Notify,
    cancel: CancellationToken,
    watcher: Mutex<Option<KbWatcher>>,
    /// Held (shared) by every write of this KB's index entries; taken exclusively by
    /// [`Indexer::stop_kb`], so a removal waits for the writes in flight and none follows.
    writes: Arc<tokio::sync::RwLock<()>>,
}

#[derive(Default)]
struct RunState {
    progress: Progress,
    /// A pass is wanted (`Some(clean)`).
    want: Option<bool>,
    walk_issues: Vec<FileError>,
    /// Files indexed with a problem (a malformed front matter), by path.
    notes: BTreeMap<String, String>,
    last_sync_ms: i64,
    pending: u64,
    /// A task waits for the vanished folder to come back.
    awaiting_return: bool,
    /// Folders the watcher cannot watch (relative; `.` = the root), and why.
    unwatched: Vec<FileError>,
    /// Hidden folders the last walk skipped (relative, sorted; not `.git`).
    hidden: Vec<String>,
}

impl KbRuntime {
    /// The current progress (state, counters, job number).
    ///
    /// A pass that was asked for and has not started yet shows as `scanning` (with the last
    /// pass's job number and no counters): a reader that asked for a pass and then polls never
    /// sees the idle state from before its request and takes the pass as done.
    pub fn progress(&self) -> Progress {
        let st = self.state.lock().expect("kb state");
        let mut p = st.progress.clone();
        let running = p.state == JobState::Scanning as i32 || p.state == JobState::Indexing as i32;
        if st.want.is_some() && !running {
            return Progress { state: JobState::Scanning as i32, job: p.job, ..Progress::default() };
        }
        if p.state == JobState::Unspecified as i32 {
            p.state = JobState::Idle as i32;
        }
        p
    }

    /// Takes the wanted pass, if any, and marks it started (scanning, the next job number) in
    /// the same hold of the state: between a request and its pass, readers see `scanning`.
    fn begin_pass(&self) -> Option<bool> {
        let mut st = self.state.lock().expect("kb state");
        let clean = st.want.take()?;
        st.progress = Progress {
            state: JobState::Scanning as i32,
            job: st.progress.job + 1,
            started_ms: now_ms(),
            ..Progress::default()
        };
        Some(clean)
    }

    /// Files the walk could not read (symlink loops, permissions) and files indexed with a
    /// problem (a malformed front matter), relative to the root.
    pub fn walk_issues(&self) -> Vec<FileError> {
        let st = self.state.lock().expect("kb state");
        let notes = st.notes.iter().map(|(path, error)| FileError { path: path.clone(), error: error.clone() });
        st.walk_issues.iter().cloned().chain(st.unwatched.iter().cloned()).chain(notes).collect()
    }

    /// Hidden folders the last walk skipped (relative, sorted; `.git` not counted).
    pub fn hidden_skipped(&self) -> Vec<String> {
        self.state.lock().expect("kb state").hidden.clone()
    }

    /// Folders the watcher cannot watch (relative to the root, `.` for the root itself).
    pub fn unwatched(&self) -> Vec<FileError> {
        self.state.lock().expect("kb state").unwatched.clone()
    }

    fn set_unwatched(&self, folders: Vec<(String, String)>) {
        let list = folders
            .into_iter()
            .map(|(path, error)| FileError {
                path,
                error: format!("not watched for changes ({error}); the periodic rescan still looks at it"),
            })
            .collect();
        self.set(|st| st.unwatched = list);
    }

    fn note(&self, rel: &str, note: Option<String>) {
        self.set(|st| match note {
            Some(n) => {
                st.notes.insert(rel.to_owned(), n);
            }
            None => {
                st.notes.remove(rel);
            }
        });
    }

    /// End of the last completed pass or watcher update (Unix ms; 0 = never).
    pub fn last_sync_ms(&self) -> i64 {
        self.state.lock().expect("kb state").last_sync_ms
    }

    /// Files waiting to be (re)indexed in the current pass.
    pub fn pending(&self) -> u64 {
        self.state.lock().expect("kb state").pending
    }

    /// Whether the folder watcher is live.
    pub fn watching(&self) -> bool {
        self.watcher.lock().expect("kb watcher").is_some()
    }

    fn set(&self, f: impl FnOnce(&mut RunState)) {
        f(&mut self.state.lock().expect("kb state"));
    }
}

/// The indexer: one worker task per KB (passes run one at a time per KB), the watchers, and the
/// per-path locks shared with `remember`.
pub struct Indexer {
    sources: Arc<Sources>,
    config: ConfigRx,
    kbs: Mutex<BTreeMap<String, Arc<KbRuntime>>>,
    locks: Mutex<HashMap<PathKey, Arc<tokio::sync::Mutex<()>>>>,
    /// Woken after chunks were added (the embedder has work).
    pub embed_wake: Arc<Notify>,
    shutdown: CancellationToken,
}

impl Indexer {
    /// An indexer over `sources`; KBs are started with [`Indexer::start_kb`].
    pub fn new(sources: Arc<Sources>, config: ConfigRx, shutdown: CancellationToken) -> Arc<Self> {
        Arc::new(Self {
            sources,
            config,
            kbs: Mutex::new(BTreeMap::new()),
            locks: Mutex::new(HashMap::new()),
            embed_wake: Arc::new(Notify::new()),
            shutdown,
        })
    }

    /// The live state of KB `name`, if started.
    pub fn runtime(&self, name: &str) -> Option<Arc<KbRuntime>> {
        self.kbs.lock().expect("kbs").get(name).cloned()
    }

    /// Starts KB `name`'s worker (idempotent) and asks it for a pass.
    pub fn start_kb(self: &Arc<Self>, name: &str) {
        let rt = {
            let mut kbs = self.kbs.lock().expect("kbs");
            if let Some(rt) = kbs.get(name) {
                rt.clone()
            } else {
                let rt = Arc::new(KbRuntime {
                    name: name.to_owned(),
                    state: Mutex::new(RunState::default()),
                    wake: Notify::new(),
                    cancel: self.shutdown.child_token(),
                    watcher: Mutex::new(None),
                    writes: Arc::new(tokio::sync::RwLock::new(())),
                });
                kbs.insert(name.to_owned(), rt.clone());
                let me = self.clone();
                let worker = rt.clone();
                tokio::spawn(async move { me.worker(worker).await });
                rt
            }
        };
        self.request(&rt, false);
    }

    /// Stops KB `name`'s worker, its pass and its watcher before its definition is removed:
    /// cancels them, then waits for the index writes in flight (a file being upserted) to
    /// end. The returned guard keeps any late write out until the caller has removed the
    /// definition; a write that comes after finds the KB stopped and does nothing. `None`
    /// when the KB was not started.
    pub async fn stop_kb(&self, name: &str) -> Option<tokio::sync::OwnedRwLockWriteGuard<()>> {
        let rt = self.kbs.lock().expect("kbs").remove(name)?;
        rt.cancel.cancel();
        rt.watcher.lock().expect("kb watcher").take();
        Some(rt.writes.clone().write_owned().await)
    }

    /// A shared hold on KB `def`'s writes, or `None` when the KB was stopped (removed) or is
    /// no longer the same definition: then nothing may be written for it.
    async fn write_hold(&self, def: &KnowledgeBase) -> Option<Option<tokio::sync::OwnedRwLockReadGuard<()>>> {
        let rt = self.runtime(&def.name);
        let hold = match &rt {
            Some(rt) => Some(rt.writes.clone().read_owned().await),
            None => None,
        };
        let same = self.sources.get(&def.name).is_some_and(|d| d.root == def.root && d.created_ms == def.created_ms);
        let live = rt.as_ref().is_none_or(|rt| !rt.cancel.is_cancelled());
        (same && live).then_some(hold)
    }

    /// Asks for a pass of KB `name` (`clean`: drop its index first). Returns false for an
    /// unknown KB.
    pub fn reindex(self: &Arc<Self>, name: &str, clean: bool) -> bool {
        match self.runtime(name) {
            Some(rt) => {
                self.request(&rt, clean);
                true
            }
            None => false,
        }
    }

    fn request(&self, rt: &KbRuntime, clean: bool) {
        rt.set(|st| st.want = Some(st.want.unwrap_or(false) || clean));
        rt.wake.notify_one();
    }

    async fn worker(self: Arc<Self>, rt: Arc<KbRuntime>) {
        // A pass that keeps failing (the store down, a file that cannot be read) is retried
        // with a growing delay, and logged when it starts failing, when the error changes, at
        // most every RETRY_REMIND while it goes on, and when it recovers: not on every attempt.
        let mut failing = FailureLog::new(RETRY_REMIND);
        loop {
            match rt.begin_pass() {
                Some(clean) => match self.pass(&rt, clean).await {
                    Ok(()) => {
                        if let Some(failures) = failing.succeeded() {
                            tracing::info!(kb = %rt.name, failures, "Reconcile pass recovered.");
                        }
                    }
                    Err(e) => {
                        let error = e.to_string();
                        let message = format!("the pass stopped: {error}");
                        let state = failing.failed(&error);
                        let retry = failing.backoff(RETRY, RETRY_MAX);
                        let retry_s = retry.as_secs();
                        match state {
                            Failing::Started => tracing::warn!(
                                kb = %rt.name,
                                error = %clip(&error),
                                retry_s,
                                "Reconcile pass failed; retrying with backoff (logged again when the error changes, \
                                 every 10 minutes while it lasts, and on recovery)."
                            ),
                            Failing::Still { failures } => tracing::warn!(
                                kb = %rt.name,
                                error = %clip(&error),
                                failures,
                                retry_s,
                                "Reconcile pass still failing."
                            ),
                            Failing::Quiet => {}
                        }
                        // Every attempt, at debug level only (the warnings above are the
                        // user's): how a test sees the retries fail quietly.
                        tracing::debug!(
                            kb = %rt.name,
                            failures = failing.failures(),
                            retry_s,
                            "The pass failed; retrying after the backoff."
                        );
                        rt.set(|st| {
                            st.progress.state = JobState::Failed as i32;
                            st.progress.message = message;
                        });
                        // The store restarts (the supervisor sees to it), a file may become
                        // readable: try again after the backoff.
                        tokio::select! {
                            _ = rt.cancel.cancelled() => return,
                            _ = tokio::time::sleep(retry) => self.request(&rt, clean),
                        }
                    }
                },
                // Idle: until asked, or until the periodic rescan is due (a safety net for what
                // the watcher cannot see: an unwatched folder, a lost event, a network mount).
                None => {
                    let mut config = self.config.clone();
                    let every = config.borrow_and_update().rescan_interval;
                    let rescan = async {
                        if every.is_zero() {
                            std::future::pending::<()>().await;
                        }
                        tokio::time::sleep(every).await;
                    };
                    tokio::select! {
                        _ = rt.cancel.cancelled() => return,
                        _ = rt.wake.notified() => {}
                        // A new interval applies at once (the wait starts again).
                        Ok(()) = config.changed() => {}
                        _ = rescan => {
                            tracing::debug!(kb = %rt.name, "Periodic rescan.");
                            self.request(&rt, false);
                        }
                    }
                }
            }
        }
    }

    fn spec(&self, def: &KnowledgeBase) -> walk::WalkSpec {
        self.sources.walk_spec(def)
    }

    /// One reconcile pass of `rt`'s KB.
    async fn pass(self: &Arc<Self>, rt: &Arc<KbRuntime>, clean: bool) -> Result<()> {
        // Marked scanning, with its job number, by `begin_pass`.
        let started = now_ms();
        let Some(def) = self.sources.get(&rt.name) else {
            rt.set(|st| st.progress.state = JobState::Idle as i32);
            return Ok(());
        };
        let mut index = self.sources.index();
        // Searches during a clean pass say their results may be incomplete (set before the
        // index is dropped, cleared however the pass ends).
        let _rebuilding = clean.then(|| self.sources.rebuilding_guard(&def.name));
        if clean {
            index.clear_index(ClearIndexRequest { kb: def.name.clone() }).await?;
        }
        let root = PathBuf::from(&def.root);
        if !root.is_dir() {
            self.folder_gone(rt, &root).await;
            return Ok(());
        }
        self.sources.set_gone(&def.name, None);
        let spec = self.spec(&def);
        self.ensure_watcher(rt, &root, &spec.skip);
        let walked = tokio::task::spawn_blocking(move || walk::walk_full(&spec))
            .await
            .map_err(|e| Error::Internal(format!("the walk panicked: {e}")))?;
        let (files, issues) = match walked {
            Ok(w) => {
                rt.set(|st| st.hidden = w.hidden);
                (w.files, w.issues)
            }
            Err(e) => {
                if !root.is_dir() {
                    self.folder_gone(rt, &root).await;
                    return Ok(());
                }
                rt.set(|st| {
                    st.progress.state = JobState::Failed as i32;
                    st.progress.message = format!("cannot walk {}: {e}", root.display());
                });
                return Ok(());
            }
        };
        let stored = index.list_documents(ListDocumentsRequest { kb: def.name.clone() }).await?.into_inner().documents;
        let plan = plan(files, &stored);
        let bytes_total: u64 = plan.index.iter().map(|f| f.size).sum();
        rt.set(|st| {
            st.progress.state = JobState::Indexing as i32;
            st.progress.total = plan.index.len() as u64;
            st.progress.bytes_total = bytes_total;
            st.pending = plan.index.len() as u64;
            st.walk_issues =
                issues.iter().map(|i| FileError { path: i.rel_path.clone(), error: i.error.clone() }).collect();
        });
        let mut results = futures_util::stream::iter(plan.index)
            .map(|f| {
                let me = self.clone();
                let def = def.clone();
                async move {
                    let r = me.index_path(&def, &f.rel_path).await;
                    (f.size, r)
                }
            })
            .buffer_unordered(CONCURRENCY);
        let mut first_error = None;
        while let Some((size, r)) = results.next().await {
            if let Err(e) = r {
                first_error.get_or_insert(e);
            }
            rt.set(|st| {
                st.progress.done += 1;
                st.progress.bytes_done += size;
                st.pending = st.pending.saturating_sub(1);
            });
            // Cancelled (the KB is being removed): the rest of the stream finishes at once
            // (each file sees the KB stopped); writes in flight are not dropped midway.
        }
        if rt.cancel.is_cancelled() {
            return Ok(());
        }
        if let Some(e) = first_error {
            return Err(e);
        }
        // Not in the walk: gone, or left out by the globs, a .gitignore or a link leaving the
        // folder — no longer a document either way, even though a file may still be there.
        for path in plan.delete {
            self.forget_path(&def, &path).await?;
        }
        rt.set(|st| {
            st.progress.state = JobState::Idle as i32;
            st.progress.message = String::new();
            st.last_sync_ms = now_ms();
            st.pending = 0;
        });
        tracing::info!(kb = %def.name, unchanged = plan.unchanged, took_ms = now_ms() - started, "Reconcile pass done.");
        Ok(())
    }

    /// The KB's folder is gone: stop watching, stop searching the KB (a deleted file never
    /// appears in results), keep its index (a folder that comes back unchanged — a remount, a
    /// `git checkout`, a move and back — keeps its chunks and vectors: the next pass compares
    /// mtime, size and hash as always), show `failed` with why, and wait for the folder to
    /// come back ([`Indexer::await_return`]), which asks for a pass.
    async fn folder_gone(self: &Arc<Self>, rt: &Arc<KbRuntime>, root: &Path) {
        rt.watcher.lock().expect("kb watcher").take();
        rt.set(|st| st.unwatched.clear());
        let message = format!(
            "the folder {} is gone (deleted, moved or unmounted); its index is kept but not searched, and it is indexed again as soon as the folder is back",
            root.display()
        );
        self.sources.set_gone(&rt.name, Some(format!("the folder {} is gone", root.display())));
        tracing::warn!(kb = %rt.name, root = %root.display(), "Knowledge base folder is gone.");
        let mut start = false;
        rt.set(|st| {
            st.progress.state = JobState::Failed as i32;
            st.progress.message = message;
            st.pending = 0;
            start = !std::mem::replace(&mut st.awaiting_return, true);
        });
        if start {
            let (me, rt, root) = (self.clone(), rt.clone(), root.to_owned());
            tokio::spawn(async move { me.await_return(rt, root).await });
        }
    }

    /// Waits for a vanished KB folder to exist again, then asks for a pass: a shallow watch on
    /// its nearest existing ancestor (the folder re-created or moved back is an event there),
    /// with a re-check every [`RETURN_CHECK`] in case that watch cannot be set or the folder
    /// comes back further up the tree. Ends when the KB is stopped.
    async fn await_return(self: Arc<Self>, rt: Arc<KbRuntime>, root: PathBuf) {
        loop {
            if root.is_dir() {
                rt.set(|st| st.awaiting_return = false);
                tracing::info!(kb = %rt.name, root = %root.display(), "Knowledge base folder is back.");
                self.request(&rt, false);
                return;
            }
            let (tx, mut rx) = mpsc::unbounded_channel();
            let ancestor = root.ancestors().skip(1).find(|a| a.is_dir()).map(Path::to_path_buf);
            let _watch = ancestor.and_then(|a| watch::start_shallow(&a, tx).ok());
            tokio::select! {
                _ = rt.cancel.cancelled() => return,
                _ = rx.recv() => {}
                _ = tokio::time::sleep(RETURN_CHECK) => {}
            }
        }
    }

    /// Starts the KB's watcher if it is not running, or brings a per-folder one up to date with
    /// the folder tree; records the folders it cannot watch as the KB's errors.
    fn ensure_watcher(self: &Arc<Self>, rt: &Arc<KbRuntime>, root: &Path, skip: &[PathBuf]) {
        let mut slot = rt.watcher.lock().expect("kb watcher");
        if let Some(w) = slot.as_mut() {
            w.refresh();
            rt.set_unwatched(w.unwatched());
            return;
        }
        let (tx, mut rx) = mpsc::unbounded_channel();
        match watch::start(root, skip, tx) {
            Ok(w) => {
                let unwatched = w.unwatched();
                if !unwatched.is_empty() {
                    tracing::warn!(
                        kb = %rt.name,
                        folders = unwatched.len(),
                        first = %unwatched[0].0,
                        "Some folders cannot be watched; watching the others (the periodic rescan covers the rest)."
                    );
                }
                rt.set_unwatched(unwatched);
                *slot = Some(w);
                let me = self.clone();
                let rt = rt.clone();
                tokio::spawn(async move {
                    loop {
                        let batch = tokio::select! {
                            _ = rt.cancel.cancelled() => return,
                            b = rx.recv() => b,
                        };
                        match batch {
                            Some(Batch::Paths(paths)) => me.on_paths(&rt, paths).await,
                            Some(Batch::Error(e)) => {
                                tracing::warn!(kb = %rt.name, error = %e, "Watcher error; rescanning.");
                                me.request(&rt, false);
                            }
                            None => return,
                        }
                    }
                });
            }
            Err(e) => {
                tracing::warn!(kb = %rt.name, error = %e, "Cannot watch the folder; periodic rescans only.");
                rt.set_unwatched(vec![(".".into(), e.to_string())]);
            }
        }
    }

    /// Applies a watcher batch: a matching file is (re)indexed or, gone, removed from the index;
    /// a directory created, moved or removed asks for a pass; the root gone marks the KB failed.
    pub async fn on_paths(self: &Arc<Self>, rt: &Arc<KbRuntime>, mut paths: Vec<PathBuf>) {
        let Some(def) = self.sources.get(&rt.name) else { return };
        let root = PathBuf::from(&def.root);
        if !root.is_dir() {
            self.folder_gone(rt, &root).await;
            return;
        }
        let Ok(filter) = walk::matcher(&self.spec(&def)) else { return };
        paths.sort();
        paths.dedup();
        let mut rescan = false;
        let mut touched = false;
        for p in paths {
            // A changed ignore file may hide notes already indexed, or show hidden ones: the
            // walk decides again.
            if p.file_name().is_some_and(|n| IGNORE_FILES.iter().any(|f| n == *f)) {
                rescan = true;
                continue;
            }
            // COFFER_HOME inside the folder: its logs and database change all the time and
            // are not notes.
            if filter.skipped(&p) {
                continue;
            }
            let Some(rel) = relative(&root, &p) else { continue };
            match std::fs::symlink_metadata(&p) {
                Ok(m) if m.is_dir() => rescan = true,
                Ok(_) if filter.accepts(&rel) => {
                    touched = true;
                    if let Err(e) = self.index_path(&def, &rel).await {
                        tracing::warn!(kb = %def.name, path = %rel, error = %e, "Cannot update the index.");
                        rescan = true;
                    }
                }
                Ok(_) => {}
                Err(_) if filter.accepts(&rel) => {
                    touched = true;
                    if let Err(e) = self.index_path(&def, &rel).await {
                        tracing::warn!(kb = %def.name, path = %rel, error = %e, "Cannot update the index.");
                        rescan = true;
                    }
                }
                // Something without an extension vanished: maybe a folder moved away.
                Err(_) => rescan |= Path::new(&rel).extension().is_none(),
            }
        }
        if touched {
            rt.set(|st| st.last_sync_ms = now_ms());
        }
        if rescan {
            self.request(rt, false);
        }
    }

    async fn lock_path(&self, kb: &str, rel: &str) -> PathGuard<'_> {
        let key = (kb.to_owned(), rel.to_owned());
        let lock = self.locks.lock().expect("path locks").entry(key.clone()).or_default().clone();
        let guard = lock.clone().lock_owned().await;
        PathGuard { indexer: self, key, lock, _guard: guard }
    }

    /// Removes the index entry of `rel` in KB `def` (under the path's lock), whether or not a
    /// file is there: for paths the walk no longer counts as documents.
    ///
    /// # Errors
    /// The store's errors.
    pub async fn forget_path(&self, def: &KnowledgeBase, rel: &str) -> Result<Outcome> {
        let _g = self.lock_path(&def.name, rel).await;
        let Some(_hold) = self.write_hold(def).await else { return Ok(Outcome::Skipped) };
        let gone = DocumentRef { kb: def.name.clone(), path: rel.to_owned() };
        self.sources.index().delete_document(gone).await?;
        if let Some(rt) = self.runtime(&def.name) {
            rt.note(rel, None);
        }
        Ok(Outcome::Deleted)
    }

    /// Brings the index entry of `rel` in KB `def` in step with the file, under the path's
    /// lock: indexed, marked with why it cannot be, or removed when the file is gone.
    ///
    /// # Errors
    /// The store's errors.
    pub async fn index_path(&self, def: &KnowledgeBase, rel: &str) -> Result<Outcome> {
        let _g = self.lock_path(&def.name, rel).await;
        // A KB being removed (or removed and added again) gets no write from an older pass.
        let Some(_hold) = self.write_hold(def).await else { return Ok(Outcome::Skipped) };
        let root = PathBuf::from(&def.root);
        let abs = root.join(rel);
        let mut index = self.sources.index();
        let gone = || DocumentRef { kb: def.name.clone(), path: rel.to_owned() };
        let meta = match std::fs::metadata(&abs) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                index.delete_document(gone()).await?;
                if let Some(rt) = self.runtime(&def.name) {
                    rt.note(rel, None);
                }
                return Ok(Outcome::Deleted);
            }
            // Unreadable (permissions, I/O): this file's error, not the pass's (which would
            // fail the whole KB and be retried forever). Retried by every pass, and at once
            // when the watcher sees its permissions change.
            Err(e) => {
                let req = MarkDocumentErrorRequest {
                    kb: def.name.clone(),
                    path: rel.to_owned(),
                    mtime_ms: 0,
                    size: 0,
                    error: cannot_read(&e),
                    kb_created_ms: def.created_ms,
                };
                index.mark_document_error(req).await?;
                return Ok(Outcome::Marked);
            }
        };
        if !meta.is_file() {
            return Ok(Outcome::Skipped);
        }
        // A link inside the folder that leads out of it is not part of the KB.
        match abs.canonicalize() {
            Ok(c) if c.starts_with(&root) => {}
            _ => {
                index.delete_document(gone()).await?;
                return Ok(Outcome::Skipped);
            }
        }
        let (mtime, size) = (mtime_ms(&meta), meta.len());
        let max = self.config.borrow().max_file_bytes;
        let mark = |error: String| MarkDocumentErrorRequest {
            kb: def.name.clone(),
            path: rel.to_owned(),
            mtime_ms: mtime,
            size,
            error,
            kb_created_ms: def.created_ms,
        };
        if size > max {
            index.mark_document_error(mark(too_large(max))).await?;
            return Ok(Outcome::Marked);
        }
        let bytes = match tokio::fs::read(&abs).await {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                index.delete_document(gone()).await?;
                return Ok(Outcome::Deleted);
            }
            Err(e) => {
                index.mark_document_error(mark(cannot_read(&e))).await?;
                return Ok(Outcome::Marked);
            }
        };
        if let Some(why) = unindexable(&bytes, max) {
            index.mark_document_error(mark(why)).await?;
            return Ok(Outcome::Marked);
        }
        let (kb, path) = (def.name.clone(), rel.to_owned());
        let built = tokio::task::spawn_blocking(move || {
            let text = std::str::from_utf8(&bytes).expect("checked by unindexable");
            document_request(&kb, &path, text, mtime, bytes.len() as u64, content_hash(&bytes))
        })
        .await
        .map_err(|e| Error::Internal(format!("parsing panicked: {e}")))?;
        let (req, note) = match built {
            Ok(r) => r,
            Err(e) => {
                index.mark_document_error(mark(format!("cannot parse: {e}"))).await?;
                return Ok(Outcome::Marked);
            }
        };
        // One document is one request: past the store's limit it would fail the whole pass
        // (and every pass after it), so it is this file's error instead.
        let encoded = prost::Message::encoded_len(&req);
        if encoded > coffer_proto::store::INDEX_MAX_MESSAGE_BYTES {
            index.mark_document_error(mark(too_large_to_store(encoded, size, max))).await?;
            return Ok(Outcome::Marked);
        }
        // Written only into the KB this pass read: one removed and added again under the same
        // name meanwhile refuses it (the store checks `created_ms`).
        let req = UpsertDocumentRequest { kb_created_ms: def.created_ms, ..req };
        let reply = index.upsert_document(req).await?.into_inner();
        if let Some(rt) = self.runtime(&def.name) {
            rt.note(rel, note);
        }
        if reply.added > 0 {
            self.embed_wake.notify_one();
        }
        Ok(Outcome::Indexed { added: reply.added })
    }
}

/// A held per-path lock; the map entry goes when nobody else waits on it.
struct PathGuard<'a> {
    indexer: &'a Indexer,
    key: PathKey,
    lock: Arc<tokio::sync::Mutex<()>>,
    _guard: tokio::sync::OwnedMutexGuard<()>,
}

impl Drop for PathGuard<'_> {
    fn drop(&mut self) {
        let mut locks = self.indexer.locks.lock().expect("path locks");
        // Held by the map, this guard's `lock`, and the owned guard: nobody else.
        if Arc::strong_count(&self.lock) <= 3 {
            locks.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(rel: &str, mtime_ms: i64, size: u64) -> walk::FileEntry {
        walk::FileEntry { rel_path: rel.into(), abs_path: PathBuf::from("/kb").join(rel), size, mtime_ms }
    }

    fn doc(path: &str, mtime_ms: i64, size: u64, error: &str) -> DocumentMeta {
        DocumentMeta {
            kb: "kb".into(),
            path: path.into(),
            mtime_ms,
            size,
            error: error.into(),
            ..DocumentMeta::default()
        }
    }

    #[test]
    fn a_requested_pass_shows_as_scanning_until_it_has_run() {
        let rt = KbRuntime {
            name: "kb".into(),
            state: Mutex::new(RunState::default()),
            wake: Notify::new(),
            cancel: CancellationToken::new(),
            watcher: Mutex::new(None),
            writes: Arc::new(tokio::sync::RwLock::new(())),
        };
        let state = |p: &Progress| (JobState::try_from(p.state).unwrap(), p.job);
        assert_eq!(state(&rt.progress()), (JobState::Idle, 0), "nothing asked for");
        // Asked for, not started: a poller must not read the idle state from before it.
        rt.set(|st| st.want = Some(false));
        assert_eq!(state(&rt.progress()), (JobState::Scanning, 0));
        assert_eq!(rt.begin_pass(), Some(false));
        assert_eq!(state(&rt.progress()), (JobState::Scanning, 1), "started: the next job");
        assert_eq!(rt.begin_pass(), None, "taken once");
        rt.set(|st| {
            st.progress.state = JobState::Indexing as i32;
            st.progress.done = 3;
            st.want = Some(true);
        });
        let p = rt.progress();
        assert_eq!((state(&p), p.done), ((JobState::Indexing, 1), 3), "a running pass shows itself");
        rt.set(|st| st.progress.state = JobState::Idle as i32);
        assert_eq!(state(&rt.progress()), (JobState::Scanning, 1), "the next one is still wanted");
        assert_eq!(rt.begin_pass(), Some(true));
        rt.set(|st| st.progress.state = JobState::Failed as i32);
        assert_eq!(state(&rt.progress()), (JobState::Failed, 2));
    }

    #[test]
    fn the_plan_reads_changed_files_and_deletes_vanished_ones() {
        let files = vec![
            file("same.md", 10, 5),
            file("touched.md", 11, 5),
            file("grown.md", 10, 6),
            file("new.md", 1, 1),
            file("bin.md", 3, 3),
        ];
        let stored = vec![
            doc("same.md", 10, 5, ""),
            doc("touched.md", 10, 5, ""),
            doc("grown.md", 10, 5, ""),
            doc("gone.md", 1, 1, ""),
            doc("bin.md", 3, 3, "binary"),
            doc("a/old.md", 1, 1, ""),
        ];
        let p = plan(files, &stored);
        let index: Vec<&str> = p.index.iter().map(|f| f.rel_path.as_str()).collect();
        assert_eq!(index, ["touched.md", "grown.md", "new.md"]);
        assert_eq!(p.delete, ["a/old.md", "gone.md"]);
        assert_eq!(p.unchanged, 2, "same.md and the binary file with the same mtime and size");
        // Nothing stored: everything is read; nothing on disk: everything goes.
        assert_eq!(plan(vec![file("a.md", 1, 1)], &[]).index.len(), 1);
        assert_eq!(plan(vec![], &stored).delete.len(), stored.len());
        // A file that could not be read is read again by every pass, mtime and size unchanged.
        let e = cannot_read(&std::io::Error::from(std::io::ErrorKind::PermissionDenied));
        assert!(e.starts_with("cannot read: "), "{e}");
        let p = plan(vec![file("locked.md", 3, 3)], &[doc("locked.md", 3, 3, &e)]);
        assert_eq!((p.index.len(), p.unchanged), (1, 0));
    }

    #[test]
    fn binary_invalid_utf8_and_oversized_files_are_named() {
        assert_eq!(unindexable(b"# fine\n", 100), None);
        assert_eq!(unindexable(b"PK\x03\x04\x00\x00", 100).as_deref(), Some("binary"));
        assert_eq!(unindexable(b"caf\xe9\n", 100).as_deref(), Some("not UTF-8 (invalid byte at offset 3)"));
        assert_eq!(
            unindexable(&[b'a'; 101], 100).as_deref(),
            Some("larger than the 100-byte limit (retrieval.max_file_bytes)")
        );
        assert_eq!(too_large(16 * 1024 * 1024), "larger than the 16 MiB limit (retrieval.max_file_bytes)");
        let why = too_large_to_store(109_388_260, 50 << 20, 64 << 20);
        assert!(
            why.starts_with("its index entry would be 104.3 MiB (the file is 50.0 MiB), over the store's 64 MiB"),
            "{why}"
        );
        assert!(why.contains("retrieval.max_file_bytes (64.0 MiB)"), "{why}");
        assert_eq!(unindexable("中文笔记".as_bytes(), 100), None);
    }

    #[test]
    fn relative_paths_stay_inside_the_root() {
        let root = Path::new("/kb");
        assert_eq!(relative(root, Path::new("/kb/a/b.md")).as_deref(), Some("a/b.md"));
        assert_eq!(relative(root, Path::new("/kb")), None);
        assert_eq!(relative(root, Path::new("/kb/../etc/passwd")), None);
        assert_eq!(relative(root, Path::new("/other/a.md")), None);
    }

    #[test]
    fn a_document_request_carries_chunks_and_normalized_fields() {
        let text = "---\ntitle: Notes\ntags: [a, b]\n---\n# 标题\n\n内存数据库 and running tests\n";
        let (r, note) =
            document_request("kb", "x/y.md", text, 5, text.len() as u64, content_hash(text.as_bytes())).unwrap();
        assert_eq!(note, None);
        assert_eq!((r.kb.as_str(), r.path.as_str(), r.mtime_ms), ("kb", "x/y.md", 5));
        assert_eq!(r.title, "Notes");
        assert_eq!(r.tags, ["a", "b"]);
        assert!(!r.chunks.is_empty());
        let body: String = r.chunks.iter().map(|c| c.index_body.clone()).collect::<Vec<_>>().join(" ");
        assert!(body.contains("内存"), "CJK bigrams in the keyword body: {body}");
        assert!(!body.contains("tags"), "front matter is not prose: {body}");
        assert_eq!(r.hash.len(), 64);
        // A malformed front matter: the note is still indexed (its body), and the problem said.
        let bad = "---\ntags: [unclosed\n---\n# Body\n\nstill searchable\n";
        let (r, note) = document_request("kb", "b.md", bad, 5, bad.len() as u64, content_hash(bad.as_bytes())).unwrap();
        assert!(note.is_some_and(|n| n.starts_with("front matter ignored")));
        let body: String = r.chunks.iter().map(|c| c.index_body.clone()).collect();
        assert!(body.contains("searchable") && !body.contains("unclosed"), "{body}");
    }

    #[test]
    fn inline_tags_merge_with_front_matter_tags_and_links_go_along() {
        let text = "---\ntags: [project]\naliases: [Home]\n---\nWork on #Project and #ops/oncall; see [[Runbook|the runbook]].\n";
        let (r, _) = document_request("kb", "a.md", text, 1, text.len() as u64, content_hash(text.as_bytes())).unwrap();
        assert_eq!(r.tags, ["project", "ops/oncall"], "#Project is the front matter's project");
        assert_eq!(r.aliases, ["Home"]);
        assert_eq!(r.links.len(), 1);
        assert_eq!(
            (r.links[0].target.as_str(), r.links[0].alias.as_str(), r.links[0].line),
            ("Runbook", "the runbook", 5)
        );
        assert_eq!(clip_bytes("日本語", 4), "日");
    }
}
