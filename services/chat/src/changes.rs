//! What a turn changed in the conversation's working directory (issue 34 §4): a snapshot of the
//! tree at the turn's start ([`start`]), compared with the tree at its end ([`Pending::finish`]),
//! gives the files added, modified, deleted and renamed, each with its line counts and a unified
//! diff.
//!
//! How the tree is read:
//! - **Every directory**: a walk (ripgrep's `ignore` walker: `.gitignore`, `.git/info/exclude`
//!   and the user's global excludes apply, also outside a repository; `.git`, `node_modules` and
//!   `target` are skipped) records each file's size, mtime and kind, at most [`MAX_FILES`] files:
//!   past that the turn says "too many files to compare" and lists nothing. Symbolic links are
//!   not followed (their target is their content); unreadable files are compared by size and
//!   mtime alone. Nothing here fails a turn: a problem gives a note on the result.
//! - **The earlier content** of a file (for the line counts and the diff) is what the turn-start
//!   snapshot kept: in a git repository a tracked file unchanged against the index is read back
//!   from git's object store at the end (`git cat-file`), so nothing is copied; other files (dirty
//!   or untracked in a repository, every file elsewhere) are read at the start and kept in memory
//!   while the turn runs, at most [`KEEP_FILE`] bytes each and [`KEEP_TOTAL`] bytes in all. A file
//!   whose earlier content was not kept is still listed when its size or mtime changed, with
//!   zero counts and a diff saying so.
//! - **Changes that existed before the turn are not the turn's**: a file is listed only when it
//!   differs from its state at the turn's start (not from git's HEAD), so a user's uncommitted
//!   work, and commits the agent makes, do not matter. A file whose mtime changed but whose
//!   content did not is not listed.
//! - **Renames**: a deleted file and an added file with the same content are one `renamed` entry.
//!
//! Git runs through [`coffer_runtime::spawn`] (`--no-optional-locks`: never writes the user's
//! index); without git, or outside a repository, the directory is read as a plain one.
//!
//! The diffs are kept by [`DiffStore`]: one JSON file per turn under
//! `COFFER_HOME/chat/diffs/<conversation>/<message>.json`, the newest [`KEEP_TURNS`] turns of a
//! conversation, removed with it.
use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Longest the turn's start waits for its snapshot before the agent starts anyway.
pub const SNAPSHOT_WAIT: Duration = Duration::from_secs(3);
/// Most files walked in one snapshot; past it the turn's changes are not compared.
pub const MAX_FILES: usize = 20_000;
/// Largest file whose earlier content is kept in memory, bytes.
pub const KEEP_FILE: u64 = 1 << 20;
/// Most bytes of earlier content kept for one turn.
pub const KEEP_TOTAL: u64 = 32 << 20;
/// Most files listed on one turn's result (`truncated` past it).
pub const MAX_LISTED: usize = 300;
/// Longest diff kept for one file, bytes (cut past it with a line saying so).
pub const MAX_DIFF_BYTES: usize = 256 << 10;
/// Most diff bytes kept for one turn; later files' diffs say they were not kept.
pub const MAX_TURN_DIFF_BYTES: usize = 4 << 20;
/// Turns whose diffs are kept per conversation (the oldest are removed).
pub const KEEP_TURNS: usize = 200;
/// Longest one git command may run.
const GIT_TIMEOUT: Duration = Duration::from_secs(20);
/// Longest one file's line diff may take before it is approximated.
const DIFF_TIMEOUT: Duration = Duration::from_secs(2);
/// Directories never walked.
const SKIPPED_DIRS: &[&str] = &[".git", "node_modules", "target"];
/// Bytes looked at for a NUL to call a file binary (git's rule).
const BINARY_SNIFF: usize = 8000;

/// How a file changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    Added,
    Modified,
    Deleted,
    Renamed,
}

impl ChangeKind {
    /// `added` | `modified` | `deleted` | `renamed`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Added => "added",
            Self::Modified => "modified",
            Self::Deleted => "deleted",
            Self::Renamed => "renamed",
        }
    }
}

/// One changed file of a turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileChange {
    /// Path relative to the conversation's working directory, `/`-separated (the new path of a
    /// rename).
    pub path: String,
    pub change: ChangeKind,
    /// A rename's earlier path; `None` otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub old_path: Option<String>,
    /// Lines added and removed (0 for binary files and when the earlier content was not kept).
    pub additions: u32,
    pub deletions: u32,
    /// The file (before or after) is binary: no line diff.
    #[serde(default)]
    pub binary: bool,
}

/// What a turn changed: the stored form (the message's `files_changed_json`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FilesChanged {
    /// Sorted by path; at most [`MAX_LISTED`].
    pub files: Vec<FileChange>,
    /// More files changed than are listed (or the tree was too big to compare: see `note`).
    pub truncated: bool,
    /// Why the comparison is partial or missing, e.g. "too many files to compare (more than
    /// 20000)"; `None` when complete.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl FilesChanged {
    /// Whether there is anything to tell (a file or a note).
    pub fn is_empty(&self) -> bool {
        self.files.is_empty() && self.note.is_none()
    }

    /// Total lines added and removed.
    pub fn totals(&self) -> (u64, u64) {
        self.files.iter().fold((0, 0), |(a, d), f| (a + u64::from(f.additions), d + u64::from(f.deletions)))
    }

    /// The one-line summary the channels send: "3 files changed: +40 −12".
    pub fn summary(&self) -> String {
        let (a, d) = self.totals();
        let n = self.files.len();
        let more = if self.truncated { "+" } else { "" };
        let files = if n == 1 && !self.truncated { "file" } else { "files" };
        format!("{n}{more} {files} changed: +{a} \u{2212}{d}")
    }
}

impl FileChange {
    fn to_proto(&self) -> coffer_proto::chat::FileChange {
        use coffer_proto::chat::FileChangeKind as K;
        let change = match self.change {
            ChangeKind::Added => K::Added,
            ChangeKind::Modified => K::Modified,
            ChangeKind::Deleted => K::Deleted,
            ChangeKind::Renamed => K::Renamed,
        };
        coffer_proto::chat::FileChange {
            path: self.path.clone(),
            change: change as i32,
            old_path: self.old_path.clone().unwrap_or_default(),
            additions: self.additions,
            deletions: self.deletions,
            binary: self.binary,
        }
    }
}

impl FilesChanged {
    /// The wire form, naming the assistant message it belongs to.
    pub fn to_proto(&self, message_id: &str) -> coffer_proto::chat::FilesChanged {
        coffer_proto::chat::FilesChanged {
            files: self.files.iter().map(FileChange::to_proto).collect(),
            truncated: self.truncated,
            note: self.note.clone().unwrap_or_default(),
            message_id: message_id.to_owned(),
        }
    }

    /// The stored form (`MessageRecord.files_changed_json`).
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("FilesChanged serializes")
    }
}

/// The stored form read back; `None` when empty (not recorded) or unreadable.
pub fn from_json(json: &str) -> Option<FilesChanged> {
    if json.is_empty() {
        return None;
    }
    serde_json::from_str(json).ok()
}

/// A file's state at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stat {
    size: u64,
    mtime_ns: i128,
    symlink: bool,
}

/// Where a file's turn-start content can be had.
#[derive(Debug, Clone)]
enum Before {
    /// Read at the start.
    Kept(Vec<u8>),
    /// Equal to this git blob (a tracked file clean against the index).
    Blob(String),
    /// Not kept (too big, past the budget, unreadable): size and mtime only.
    StatOnly,
}

/// The tree at a turn's start.
#[derive(Debug)]
pub struct Snapshot {
    root: PathBuf,
    files: HashMap<String, (Stat, Before)>,
    /// Past [`MAX_FILES`]: nothing can be compared.
    too_many: bool,
    /// The repository's top folder and the prefix of `root` in it, when `root` is in one.
    git: Option<GitRepo>,
    pub took: Duration,
}

#[derive(Debug, Clone)]
struct GitRepo {
    program: PathBuf,
    root: PathBuf,
    /// `root` relative to the repository's top folder (`sub/dir/`, empty at the top).
    prefix: String,
}

/// A snapshot being taken (in a task of its own, so a slow tree does not hold the turn's start
/// past [`Pending::ready`]'s bound).
pub struct Pending {
    state: State,
}

enum State {
    Running(tokio::task::JoinHandle<Snapshot>),
    Done(Snapshot),
    Failed,
}

/// Starts the turn-start snapshot of `root` in a task; the turn goes on meanwhile.
pub fn start(root: PathBuf) -> Pending {
    Pending { state: State::Running(tokio::spawn(snapshot(root))) }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let State::Running(task) = &self.state {
            task.abort();
        }
    }
}

impl Pending {
    /// Waits at most `max` for the snapshot (the engine waits before the agent starts, so what
    /// the agent does is not in it); `false` when it is still being taken (it goes on, and a
    /// change the agent makes before it reads a file is then missed).
    pub async fn ready(&mut self, max: Duration) -> bool {
        let State::Running(task) = &mut self.state else { return true };
        match tokio::time::timeout(max, task).await {
            Ok(Ok(snap)) => {
                self.state = State::Done(snap);
                true
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "The turn-start snapshot of the working directory failed.");
                self.state = State::Failed;
                true
            }
            Err(_) => false,
        }
    }

    /// Compares the tree now with the turn-start snapshot: the changed files and each one's
    /// diff (path → unified diff text, or a sentence for binary files and content not kept).
    /// `None` when the snapshot task failed (logged).
    pub async fn finish(mut self) -> Option<(FilesChanged, HashMap<String, String>)> {
        let snap = match std::mem::replace(&mut self.state, State::Failed) {
            State::Done(s) => s,
            State::Failed => return None,
            State::Running(task) => match task.await {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "The turn-start snapshot of the working directory failed.");
                    return None;
                }
            },
        };
        Some(compare(snap).await)
    }
}

/// Reads `root` as [`Snapshot`] describes: git's view first when `root` is in a repository.
pub async fn snapshot(root: PathBuf) -> Snapshot {
    let t0 = Instant::now();
    let git = match find_git() {
        Some(program) => GitRepo { program, root: root.clone(), prefix: String::new() }.probe().await,
        None => None,
    };
    // In a repository: the index's blob of each tracked file, and which are dirty.
    let mut index: HashMap<String, String> = HashMap::new();
    if let Some(g) = &git {
        let (ls, status) = tokio::join!(
            g.run(&["ls-files", "-s", "-z", "--", "."], None),
            g.run(&["status", "--porcelain", "-z", "-uall", "--ignored=no", "--", "."], None)
        );
        if let (Some(ls), Some(status)) = (ls, status) {
            index = parse_ls_files(&ls);
            // Status paths are the repository's; the walk's are relative to the root.
            for p in parse_status_dirty(&status) {
                if let Some(rel) = p.strip_prefix(g.prefix.as_str()) {
                    index.remove(rel);
                }
            }
        }
    }
    let root2 = root.clone();
    let (files, too_many) =
        tokio::task::spawn_blocking(move || walk(&root2, &index)).await.unwrap_or_else(|_| (HashMap::new(), false));
    Snapshot { root, files, too_many, git, took: t0.elapsed() }
}

/// The files under `root` as the module comment says; `true` when past [`MAX_FILES`].
fn walk_stats(root: &Path) -> (Vec<(String, PathBuf, Stat)>, bool) {
    let mut out = Vec::new();
    let walker = ignore::WalkBuilder::new(root)
        .hidden(false)
        .ignore(false)
        .git_ignore(true)
        .git_exclude(true)
        .git_global(true)
        .require_git(false)
        .parents(true)
        .follow_links(false)
        .filter_entry(|e| {
            !(e.file_type().is_some_and(|t| t.is_dir())
                && e.file_name().to_str().is_some_and(|n| SKIPPED_DIRS.contains(&n)))
        })
        .build();
    for entry in walker {
        let Ok(entry) = entry else { continue };
        let Some(ft) = entry.file_type() else { continue };
        if ft.is_dir() {
            continue;
        }
        let Ok(rel) = entry.path().strip_prefix(root) else { continue };
        let Some(rel) = rel.to_str() else { continue };
        if rel.is_empty() {
            continue;
        }
        if out.len() >= MAX_FILES {
            return (out, true);
        }
        let Ok(meta) = std::fs::symlink_metadata(entry.path()) else { continue };
        let mtime_ns = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos() as i128);
        let stat = Stat { size: meta.len(), mtime_ns, symlink: ft.is_symlink() };
        out.push((rel.replace(std::path::MAIN_SEPARATOR, "/"), entry.path().to_path_buf(), stat));
    }
    (out, false)
}

/// A file's content as compared: a symbolic link's target, a regular file's bytes (at most
/// `max`); `None` when unreadable or larger.
fn read_content(path: &Path, stat: &Stat, max: u64) -> Option<Vec<u8>> {
    if stat.symlink {
        return std::fs::read_link(path).ok().map(|t| t.to_string_lossy().into_owned().into_bytes());
    }
    if stat.size > max {
        return None;
    }
    let mut f = std::fs::File::open(path).ok()?;
    let mut buf = Vec::with_capacity(stat.size as usize);
    std::io::Read::read_to_end(&mut std::io::Read::take(&mut f, max + 1), &mut buf).ok()?;
    (buf.len() as u64 <= max).then_some(buf)
}

fn walk(root: &Path, index: &HashMap<String, String>) -> (HashMap<String, (Stat, Before)>, bool) {
    let (stats, too_many) = walk_stats(root);
    if too_many {
        return (HashMap::new(), true);
    }
    let mut budget = KEEP_TOTAL;
    let mut files = HashMap::with_capacity(stats.len());
    for (rel, abs, stat) in stats {
        let before = match index.get(&rel) {
            Some(oid) if !stat.symlink => Before::Blob(oid.clone()),
            _ if stat.size <= KEEP_FILE && stat.size <= budget => match read_content(&abs, &stat, KEEP_FILE) {
                Some(bytes) => {
                    budget -= bytes.len() as u64;
                    Before::Kept(bytes)
                }
                None => Before::StatOnly,
            },
            _ => Before::StatOnly,
        };
        files.insert(rel, (stat, before));
    }
    (files, false)
}

/// A changed file found by [`compare`], before counts and diff.
struct Found {
    path: String,
    old_path: Option<String>,
    change: ChangeKind,
    before: Option<Vec<u8>>,
    after: Option<Vec<u8>>,
    /// The earlier content existed but was not kept.
    unknown_before: bool,
}

/// The changes between `snap` and the tree now.
async fn compare(snap: Snapshot) -> (FilesChanged, HashMap<String, String>) {
    if snap.too_many {
        let note = format!("too many files to compare (more than {MAX_FILES})");
        return (FilesChanged { files: Vec::new(), truncated: true, note: Some(note) }, HashMap::new());
    }
    let root = snap.root.clone();
    let (now, too_many) = tokio::task::spawn_blocking(move || walk_stats(&root)).await.unwrap_or_default();
    if too_many {
        let note = format!("too many files to compare (more than {MAX_FILES})");
        return (FilesChanged { files: Vec::new(), truncated: true, note: Some(note) }, HashMap::new());
    }
    // Candidates: new, gone, or with another size, mtime or kind.
    let mut seen = HashSet::with_capacity(now.len());
    let mut candidates: Vec<(String, Option<PathBuf>, Option<Stat>)> = Vec::new();
    for (rel, abs, stat) in now {
        match snap.files.get(&rel) {
            Some((s, _)) if *s == stat => {}
            _ => candidates.push((rel.clone(), Some(abs), Some(stat))),
        }
        seen.insert(rel);
    }
    for rel in snap.files.keys() {
        if !seen.contains(rel) {
            candidates.push((rel.clone(), None, None));
        }
    }
    candidates.sort_by(|a, b| a.0.cmp(&b.0));
    // The git blobs to read back: candidates' earlier content.
    let oids: Vec<String> = candidates
        .iter()
        .filter_map(|(rel, _, _)| match snap.files.get(rel) {
            Some((_, Before::Blob(oid))) => Some(oid.clone()),
            _ => None,
        })
        .collect();
    let blobs = match (&snap.git, oids.is_empty()) {
        (Some(g), false) => g.cat_blobs(&oids).await,
        _ => HashMap::new(),
    };
    let found = tokio::task::spawn_blocking(move || {
        let mut found = Vec::new();
        for (rel, abs, stat) in candidates {
            let before_entry = snap.files.get(&rel);
            let (before, unknown_before) = match before_entry.map(|(_, b)| b) {
                None => (None, false),
                Some(Before::Kept(b)) => (Some(b.clone()), false),
                Some(Before::Blob(oid)) => match blobs.get(oid) {
                    Some(b) => (Some(b.clone()), false),
                    None => (None, true),
                },
                Some(Before::StatOnly) => (None, true),
            };
            let after = match (&abs, &stat) {
                (Some(abs), Some(stat)) => read_content(abs, stat, KEEP_FILE),
                _ => None,
            };
            let change = match (before_entry.is_some(), abs.is_some()) {
                (false, true) => ChangeKind::Added,
                (true, false) => ChangeKind::Deleted,
                (true, true) => {
                    // Only the mtime moved, or it was rewritten with the same bytes.
                    if let (Some(b), Some(a)) = (&before, &after)
                        && b == a
                    {
                        continue;
                    }
                    ChangeKind::Modified
                }
                (false, false) => continue,
            };
            found.push(Found { path: rel, old_path: None, change, before, after, unknown_before });
        }
        pair_renames(&mut found);
        found
    })
    .await
    .unwrap_or_default();
    describe(found)
}

/// Turns an added and a deleted file with the same (known, non-empty) content into a rename.
fn pair_renames(found: &mut Vec<Found>) {
    let mut deleted: HashMap<Vec<u8>, usize> = HashMap::new();
    for (i, f) in found.iter().enumerate() {
        if f.change == ChangeKind::Deleted
            && let Some(b) = f.before.as_ref().filter(|b| !b.is_empty())
        {
            deleted.entry(b.clone()).or_insert(i);
        }
    }
    let mut gone = Vec::new();
    for f in found.iter_mut() {
        if f.change != ChangeKind::Added {
            continue;
        }
        if let Some(i) = f.after.as_ref().and_then(|a| deleted.remove(a)) {
            gone.push(i);
            f.change = ChangeKind::Renamed;
            f.before = f.after.clone();
        }
    }
    // Record each rename's old path, then drop its deleted entry.
    let olds: Vec<(usize, String)> = gone.iter().map(|&i| (i, found[i].path.clone())).collect();
    let mut by_content: HashMap<Vec<u8>, String> = HashMap::new();
    for (i, p) in &olds {
        if let Some(b) = found[*i].before.clone() {
            by_content.insert(b, p.clone());
        }
    }
    for f in found.iter_mut() {
        if f.change == ChangeKind::Renamed && f.old_path.is_none() {
            f.old_path = f.after.as_ref().and_then(|a| by_content.remove(a));
        }
    }
    let gone: HashSet<usize> = gone.into_iter().collect();
    let mut i = 0;
    found.retain(|_| {
        let keep = !gone.contains(&i);
        i += 1;
        keep
    });
}

/// Counts and diffs of `found`, listed as [`FilesChanged`].
fn describe(found: Vec<Found>) -> (FilesChanged, HashMap<String, String>) {
    let truncated = found.len() > MAX_LISTED;
    let mut files = Vec::new();
    let mut diffs = HashMap::new();
    let mut diff_bytes = 0usize;
    for f in found.into_iter().take(MAX_LISTED) {
        let binary = f.before.as_deref().is_some_and(is_binary) || f.after.as_deref().is_some_and(is_binary);
        let (additions, deletions, text) = if binary {
            (0, 0, "binary file changed\n".to_owned())
        } else if f.unknown_before {
            (0, 0, "the file's earlier content was not kept (too large, or past this turn's budget)\n".to_owned())
        } else if f.change != ChangeKind::Deleted && f.after.is_none() {
            (0, 0, "the file is too large (or unreadable) to show its diff\n".to_owned())
        } else {
            let old = String::from_utf8_lossy(f.before.as_deref().unwrap_or_default()).into_owned();
            let new = String::from_utf8_lossy(f.after.as_deref().unwrap_or_default()).into_owned();
            unified(&f, &old, &new)
        };
        let text = if diff_bytes + text.len() > MAX_TURN_DIFF_BYTES {
            format!("diff not kept: this turn's diffs passed {} MiB\n", MAX_TURN_DIFF_BYTES >> 20)
        } else {
            text
        };
        diff_bytes += text.len();
        diffs.insert(f.path.clone(), text);
        files.push(FileChange { path: f.path, change: f.change, old_path: f.old_path, additions, deletions, binary });
    }
    (FilesChanged { files, truncated, note: None }, diffs)
}

/// Whether `bytes` look binary: a NUL in the first [`BINARY_SNIFF`] bytes.
fn is_binary(bytes: &[u8]) -> bool {
    bytes[..bytes.len().min(BINARY_SNIFF)].contains(&0)
}

/// The unified diff (3 lines of context) of one file, with its added and removed line counts;
/// cut at [`MAX_DIFF_BYTES`].
fn unified(f: &Found, old: &str, new: &str) -> (u32, u32, String) {
    let diff = similar::TextDiff::configure().timeout(DIFF_TIMEOUT).diff_lines(old, new);
    let (mut add, mut del) = (0u32, 0u32);
    for op in diff.ops() {
        for change in diff.iter_changes(op) {
            match change.tag() {
                similar::ChangeTag::Insert => add += 1,
                similar::ChangeTag::Delete => del += 1,
                similar::ChangeTag::Equal => {}
            }
        }
    }
    let from = match f.change {
        ChangeKind::Added => "/dev/null".to_owned(),
        _ => format!("a/{}", f.old_path.as_deref().unwrap_or(&f.path)),
    };
    let to = match f.change {
        ChangeKind::Deleted => "/dev/null".to_owned(),
        _ => format!("b/{}", f.path),
    };
    let mut text = diff.unified_diff().context_radius(3).header(&from, &to).to_string();
    if f.change == ChangeKind::Renamed && add == 0 && del == 0 {
        text = format!("renamed from {} to {} (content unchanged)\n", f.old_path.as_deref().unwrap_or("?"), f.path);
    }
    if text.len() > MAX_DIFF_BYTES {
        let mut i = MAX_DIFF_BYTES;
        while !text.is_char_boundary(i) {
            i -= 1;
        }
        let cut = text[..i].rfind('\n').map_or(0, |n| n + 1);
        text.truncate(cut);
        text.push_str(&format!("… diff cut at {} KiB\n", MAX_DIFF_BYTES >> 10));
    }
    (add, del, text)
}

/// The absolute path of `git` on `PATH`, if any.
fn find_git() -> Option<PathBuf> {
    coffer_runtime::connect::which_on_path("git")
}

impl GitRepo {
    /// `self` when `root` is inside a git work tree.
    async fn probe(mut self) -> Option<Self> {
        let out = self.run(&["rev-parse", "--is-inside-work-tree", "--show-prefix"], None).await?;
        let out = String::from_utf8_lossy(&out).into_owned();
        let mut lines = out.lines();
        if lines.next() != Some("true") {
            return None;
        }
        self.prefix = lines.next().unwrap_or_default().to_owned();
        Some(self)
    }

    /// Runs `git args…` in the root with a clean environment; its stdout when it succeeded.
    async fn run(&self, args: &[&str], stdin: Option<Vec<u8>>) -> Option<Vec<u8>> {
        let mut spec = coffer_runtime::spawn::SpawnSpec::new(&self.program, "git", "changes");
        spec.args = ["--no-optional-locks", "-c", "core.quotepath=false"]
            .iter()
            .chain(args.iter())
            .map(OsString::from)
            .collect();
        spec.env_clear = true;
        spec.env = ["PATH", "HOME", "XDG_CONFIG_HOME", "USER", "TMPDIR"]
            .iter()
            .filter_map(|k| std::env::var_os(k).map(|v| (OsString::from(k), v)))
            .chain([("LC_ALL".into(), "C".into()), ("GIT_TERMINAL_PROMPT".into(), "0".into())])
            .collect();
        spec.cwd = Some(self.root.clone());
        spec.stdin = if stdin.is_some() { Stdio::piped() } else { Stdio::null() };
        spec.stdout = Stdio::piped();
        let mut child = coffer_runtime::spawn::spawn(spec).ok()?;
        let mut out = child.inner().stdout.take()?;
        let input = child.inner().stdin.take();
        let work = async {
            let write = async {
                if let (Some(mut w), Some(data)) = (input, stdin) {
                    let _ = w.write_all(&data).await;
                }
            };
            let mut buf = Vec::new();
            let mut limited = (&mut out).take(KEEP_TOTAL * 2);
            let read = limited.read_to_end(&mut buf);
            let (_, r) = tokio::join!(write, read);
            r.ok()?;
            let status = child.wait().await.ok()?;
            status.success().then_some(buf)
        };
        tokio::time::timeout(GIT_TIMEOUT, work).await.ok().flatten()
    }

    /// The content of each blob (`git cat-file --batch`), those git answered.
    async fn cat_blobs(&self, oids: &[String]) -> HashMap<String, Vec<u8>> {
        let mut input = String::new();
        for o in oids {
            input.push_str(o);
            input.push('\n');
        }
        let Some(out) = self.run(&["cat-file", "--batch"], Some(input.into_bytes())).await else {
            return HashMap::new();
        };
        parse_batch(&out)
    }
}

/// `git cat-file --batch` output: `<oid> blob <size>\n<bytes>\n` per object (`<oid> missing`).
fn parse_batch(mut out: &[u8]) -> HashMap<String, Vec<u8>> {
    let mut map = HashMap::new();
    while let Some(nl) = out.iter().position(|&b| b == b'\n') {
        let header = String::from_utf8_lossy(&out[..nl]).into_owned();
        out = &out[nl + 1..];
        let parts: Vec<&str> = header.split(' ').collect();
        let (Some(oid), Some(size)) = (parts.first(), parts.get(2).and_then(|s| s.parse::<usize>().ok())) else {
            continue;
        };
        if out.len() < size {
            break;
        }
        map.insert((*oid).to_owned(), out[..size].to_vec());
        out = &out[(size + 1).min(out.len())..];
    }
    map
}

/// `git ls-files -s -z` (run in the root, paths relative to it): path → blob id, regular files
/// and symlinks of stage 0 only (gitlinks are directories of their own).
fn parse_ls_files(out: &[u8]) -> HashMap<String, String> {
    let mut map = HashMap::new();
    for rec in out.split(|&b| b == 0).filter(|r| !r.is_empty()) {
        let rec = String::from_utf8_lossy(rec);
        let Some((meta, path)) = rec.split_once('\t') else { continue };
        let mut f = meta.split(' ');
        let (Some(mode), Some(oid), Some(stage)) = (f.next(), f.next(), f.next()) else { continue };
        if stage == "0" && mode != "160000" && mode != "120000" {
            map.insert(path.to_owned(), oid.to_owned());
        }
    }
    map
}

/// `git status --porcelain -z` (paths from the repository's top): the paths whose work-tree content is not the index's
/// (modified, deleted, untracked, both sides of a rename or copy).
fn parse_status_dirty(out: &[u8]) -> Vec<String> {
    let mut paths = Vec::new();
    let mut recs = out.split(|&b| b == 0).filter(|r| !r.is_empty());
    while let Some(rec) = recs.next() {
        if rec.len() < 4 {
            continue;
        }
        let (x, _y) = (rec[0], rec[1]);
        paths.push(String::from_utf8_lossy(&rec[3..]).into_owned());
        if (x == b'R' || x == b'C')
            && let Some(orig) = recs.next()
        {
            paths.push(String::from_utf8_lossy(orig).into_owned());
        }
    }
    paths
}

/// Where the turns' diffs are kept: `<dir>/<conversation>/<message>.json`, a JSON object of
/// path → diff text.
#[derive(Debug, Clone)]
pub struct DiffStore {
    dir: PathBuf,
}

/// Why a diff cannot be given.
#[derive(Debug, thiserror::Error)]
pub enum DiffError {
    /// `path` is not a relative path inside the working directory.
    #[error("path {0:?} is not a relative path inside the conversation's folder")]
    BadPath(String),
    /// The turn's diffs are not kept (older than the newest turns, or the turn changed nothing).
    #[error(
        "the diffs of message {0} are not kept (none were recorded, or they are older than the newest {KEEP_TURNS} turns)"
    )]
    NoTurn(String),
    /// The turn did not change that file.
    #[error("message {message} did not change {path:?}")]
    NoFile { message: String, path: String },
}

impl DiffStore {
    /// Diffs under `home/chat/diffs`.
    pub fn new(home: &Path) -> Self {
        Self { dir: home.join("chat").join("diffs") }
    }

    fn conv_dir(&self, conversation: &str) -> PathBuf {
        self.dir.join(conversation)
    }

    /// Writes one turn's diffs and removes the conversation's oldest past [`KEEP_TURNS`].
    /// Ids are checked by the caller (ULID-like, no separators).
    ///
    /// # Errors
    /// I/O errors creating the folder or writing the file.
    pub fn put(&self, conversation: &str, message: &str, diffs: &HashMap<String, String>) -> std::io::Result<()> {
        let dir = self.conv_dir(conversation);
        std::fs::create_dir_all(&dir)?;
        let tmp = dir.join(format!(".{message}.tmp"));
        std::fs::write(&tmp, serde_json::to_vec(diffs).map_err(std::io::Error::other)?)?;
        std::fs::rename(&tmp, dir.join(format!("{message}.json")))?;
        let mut turns: Vec<(std::time::SystemTime, PathBuf)> = std::fs::read_dir(&dir)?
            .filter_map(|e| e.ok())
            .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
            .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
            .collect();
        if turns.len() > KEEP_TURNS {
            turns.sort();
            for (_, p) in &turns[..turns.len() - KEEP_TURNS] {
                let _ = std::fs::remove_file(p);
            }
        }
        Ok(())
    }

    /// One file's diff of the turn that wrote `message`.
    ///
    /// # Errors
    /// [`DiffError::BadPath`] for an absolute path or one with `..`, an empty or NUL-bearing
    /// one; [`DiffError::NoTurn`], [`DiffError::NoFile`].
    pub fn get(&self, conversation: &str, message: &str, path: &str) -> Result<String, DiffError> {
        check_path(path)?;
        let file = self.conv_dir(conversation).join(format!("{message}.json"));
        let map: HashMap<String, String> = std::fs::read(&file)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .ok_or_else(|| DiffError::NoTurn(message.to_owned()))?;
        map.get(path).cloned().ok_or_else(|| DiffError::NoFile { message: message.to_owned(), path: path.to_owned() })
    }

    /// Removes a conversation's diffs (it was deleted).
    pub fn remove_conversation(&self, conversation: &str) {
        let _ = std::fs::remove_dir_all(self.conv_dir(conversation));
    }
}

/// A file path as a turn lists them: relative, `/`-separated, no `..`, `.` or empty part, no NUL.
///
/// # Errors
/// [`DiffError::BadPath`].
pub fn check_path(path: &str) -> Result<(), DiffError> {
    let bad = path.is_empty()
        || path.len() > 4096
        || path.starts_with('/')
        || path.contains('\0')
        || path.contains('\\')
        || path.split('/').any(|p| p.is_empty() || p == ".." || p == ".");
    if bad { Err(DiffError::BadPath(path.to_owned())) } else { Ok(()) }
}

#[cfg(test)]
mod tests;
