//! Which files of a knowledge base folder are its documents: the reconcile pass's walk, the
//! grep engine's walk and the watcher's filter, all from one [`WalkSpec`].
//!
//! Rules (the same everywhere): include/exclude globs relative to the root (default
//! `**/*.md` and `**/*.markdown`, case-insensitive); `.gitignore`, `.ignore` and
//! `.git/info/exclude` inside the root respected, also when the folder is not a git
//! repository (ripgrep's `ignore` crate with `require_git(false)`); ignore files *above* the
//! root are not read (a dotfiles `~/.gitignore` holding `*` must not empty a vault); hidden
//! files and folders skipped; only regular files; symlinks followed only while their target
//! stays inside the root (canonicalized), a loop reported and never followed twice; a file
//! reachable by several paths (a symlink to a folder inside the root) is listed once, under its
//! real path when that is included; folders named in [`WalkSpec::skip`] (`COFFER_HOME` when a
//! knowledge base folder contains it) are never entered.
use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::UNIX_EPOCH;

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};
use ignore::gitignore::{Gitignore, GitignoreBuilder};
use ignore::{DirEntry, WalkBuilder};

/// The globs a knowledge base includes when it names none.
pub const DEFAULT_INCLUDE: &[&str] = &["**/*.md", "**/*.markdown"];

/// What to walk: a root folder and globs relative to it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WalkSpec {
    /// The knowledge base folder (canonicalized by [`walk`] and [`matcher`]).
    pub root: PathBuf,
    /// Globs of files to include, relative to the root, `/`-separated (`*` stays inside one
    /// folder, `**` crosses folders). Empty = [`DEFAULT_INCLUDE`].
    pub include: Vec<String>,
    /// Globs of files (or folders, whose contents are then skipped) to leave out.
    pub exclude: Vec<String>,
    /// Absolute, canonical folders inside the root that are never entered, whatever the globs
    /// say (`COFFER_HOME` when the user's folder contains it: Coffer's own memory, skills,
    /// logs and database are not notes). See [`skip_for`].
    pub skip: Vec<PathBuf>,
}

/// The [`WalkSpec::skip`] list for a KB at `root` given `COFFER_HOME` at `home`: `home` when
/// it lies strictly inside `root` (both canonicalized when they exist), else nothing.
pub fn skip_for(root: &Path, home: &Path) -> Vec<PathBuf> {
    let root = std::fs::canonicalize(root).unwrap_or_else(|_| root.to_owned());
    let home = std::fs::canonicalize(home).unwrap_or_else(|_| home.to_owned());
    if home != root && home.starts_with(&root) { vec![home] } else { Vec::new() }
}

/// One document file found by [`walk`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileEntry {
    /// Path relative to the root, `/`-separated, never with `.` or `..` components.
    pub rel_path: String,
    /// The path the walk reached it by (under the canonical root).
    pub abs_path: PathBuf,
    /// Bytes.
    pub size: u64,
    /// Modification time, Unix milliseconds.
    pub mtime_ms: i64,
}

/// A file or folder the walk could not take, and why (for the KB's error list).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WalkIssue {
    /// Relative to the root, `/`-separated (lossy when the name is not UTF-8).
    pub rel_path: String,
    /// E.g. "symlink loop back to notes", "symlink points outside the knowledge base".
    pub error: String,
}

/// Why a walk (or a filter) could not start at all.
#[derive(Debug, thiserror::Error)]
pub enum WalkError {
    /// The root does not exist.
    #[error("folder {0} does not exist")]
    RootMissing(PathBuf),
    /// The root exists but is not a folder.
    #[error("{0} is not a folder")]
    NotADirectory(PathBuf),
    /// The root cannot be read (permission, I/O).
    #[error("cannot read folder {path}: {message}")]
    Root { path: PathBuf, message: String },
    /// An include or exclude glob is invalid or not relative to the root.
    #[error("bad glob {glob:?}: {message}")]
    BadGlob { glob: String, message: String },
}

/// Decides whether a path relative to the root is a document of the knowledge base, without
/// walking: include/exclude globs, hidden components, `..` and absolute paths, and the ignore
/// files at the root (`.gitignore`, `.ignore`). Nested ignore files are honoured by [`walk`]
/// (the reconcile pass), not here. Built by [`matcher`]; cheap to clone.
#[derive(Debug, Clone)]
pub struct PathFilter {
    root: PathBuf,
    include: GlobSet,
    exclude: GlobSet,
    ignores: Vec<Gitignore>,
    skip: Vec<PathBuf>,
}

impl PathFilter {
    /// The canonical root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Whether the file at `rel_path` (relative, `/`-separated) is a document: included, not
    /// excluded, no hidden or `.`/`..` component, not absolute, not ignored by the root's
    /// ignore files.
    pub fn accepts(&self, rel_path: &str) -> bool {
        if rel_path.is_empty() || rel_path.starts_with('/') || rel_path.contains('\\') {
            return false;
        }
        if rel_path.split('/').any(|c| c.is_empty() || c.starts_with('.')) {
            return false;
        }
        self.globs_accept(rel_path) && !self.ignored(rel_path, false) && !self.skipped(&self.root.join(rel_path))
    }

    /// Whether `abs` lies in a folder of [`WalkSpec::skip`].
    pub(crate) fn skipped(&self, abs: &Path) -> bool {
        self.skip.iter().any(|s| abs.starts_with(s))
    }

    pub(crate) fn globs_accept(&self, rel_path: &str) -> bool {
        self.include.is_match(rel_path) && !self.exclude.is_match(rel_path) && !self.excluded_parent(rel_path)
    }

    /// Whether a folder above `rel_path` matches an exclude glob (excluding a folder excludes
    /// its contents).
    fn excluded_parent(&self, rel_path: &str) -> bool {
        rel_path.match_indices('/').any(|(i, _)| self.exclude.is_match(&rel_path[..i]))
    }

    fn ignored(&self, rel_path: &str, is_dir: bool) -> bool {
        let path = self.root.join(rel_path);
        self.ignores.iter().any(|g| g.matched_path_or_any_parents(&path, is_dir).is_ignore())
    }
}

fn glob_set(globs: &[String], defaults: &[&str]) -> Result<GlobSet, WalkError> {
    // The default globs match `.MD` too; the user's globs match as written.
    let case_insensitive = globs.is_empty();
    let list: Vec<String> =
        if globs.is_empty() { defaults.iter().map(|s| (*s).to_owned()).collect() } else { globs.to_vec() };
    let mut set = GlobSetBuilder::new();
    for glob in &list {
        let bad = |message: &str| WalkError::BadGlob { glob: glob.clone(), message: message.to_owned() };
        let trimmed = glob.trim();
        if trimmed.is_empty() {
            return Err(bad("empty"));
        }
        if trimmed.starts_with('/') || trimmed.starts_with('\\') {
            return Err(bad("must be relative to the knowledge base folder"));
        }
        if trimmed.split('/').any(|c| c == "..") {
            return Err(bad("must not contain `..`"));
        }
        let g = GlobBuilder::new(trimmed)
            .literal_separator(true)
            .case_insensitive(case_insensitive)
            .backslash_escape(true)
            .build()
            .map_err(|e| bad(&e.kind().to_string()))?;
        set.add(g);
    }
    set.build().map_err(|e| WalkError::BadGlob { glob: list.join(", "), message: e.to_string() })
}

fn canonical_root(root: &Path) -> Result<PathBuf, WalkError> {
    let canon = match std::fs::canonicalize(root) {
        Ok(p) => p,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(WalkError::RootMissing(root.to_owned())),
        Err(e) => return Err(WalkError::Root { path: root.to_owned(), message: e.to_string() }),
    };
    let meta =
        std::fs::metadata(&canon).map_err(|e| WalkError::Root { path: root.to_owned(), message: e.to_string() })?;
    if !meta.is_dir() {
        return Err(WalkError::NotADirectory(root.to_owned()));
    }
    Ok(canon)
}

/// Builds the [`PathFilter`] of `spec` (for the watcher's events).
///
/// # Errors
/// [`WalkError::RootMissing`], [`WalkError::NotADirectory`], [`WalkError::Root`] for the
/// root; [`WalkError::BadGlob`] naming the first bad glob.
pub fn matcher(spec: &WalkSpec) -> Result<PathFilter, WalkError> {
    let root = canonical_root(&spec.root)?;
    filter_for(&root, spec)
}

fn filter_for(root: &Path, spec: &WalkSpec) -> Result<PathFilter, WalkError> {
    let include = glob_set(&spec.include, DEFAULT_INCLUDE)?;
    let exclude = glob_set(&spec.exclude, &[])?;
    let mut ignores = Vec::new();
    for name in [".gitignore", ".ignore"] {
        let file = root.join(name);
        if file.is_file() {
            let mut b = GitignoreBuilder::new(root);
            // A malformed line is skipped (as git does); the rest of the file still applies.
            let _ = b.add(&file);
            if let Ok(g) = b.build() {
                ignores.push(g);
            }
        }
    }
    Ok(PathFilter { root: root.to_owned(), include, exclude, ignores, skip: spec.skip.clone() })
}

/// The path of `p` relative to `root`, `/`-separated; `None` when `p` is not under `root` or
/// a component is not UTF-8.
pub(crate) fn rel_of(root: &Path, p: &Path) -> Option<String> {
    let rel = p.strip_prefix(root).ok()?;
    let mut out = String::new();
    for c in rel.components() {
        match c {
            Component::Normal(s) => {
                if !out.is_empty() {
                    out.push('/');
                }
                out.push_str(s.to_str()?);
            }
            Component::CurDir => {}
            _ => return None,
        }
    }
    Some(out)
}

fn lossy_rel(root: &Path, p: &Path) -> String {
    match p.strip_prefix(root) {
        Ok(rel) => rel.to_string_lossy().replace('\\', "/"),
        Err(_) => p.to_string_lossy().into_owned(),
    }
}

/// The prepared walk shared by [`walk`] and the grep engine: canonical root, filter, and a
/// `WalkBuilder` whose entry filter enforces the rules (recording issues in `issues`).
pub(crate) struct Prepared {
    pub(crate) root: PathBuf,
    pub(crate) filter: PathFilter,
    pub(crate) issues: Arc<Mutex<Vec<WalkIssue>>>,
    /// Hidden folders skipped (relative), `.git` left out.
    pub(crate) hidden: Arc<Mutex<Vec<String>>>,
}

impl Prepared {
    pub(crate) fn new(spec: &WalkSpec) -> Result<Self, WalkError> {
        let root = canonical_root(&spec.root)?;
        let filter = filter_for(&root, spec)?;
        Ok(Self { root, filter, issues: Arc::new(Mutex::new(Vec::new())), hidden: Arc::new(Mutex::new(Vec::new())) })
    }

    /// A builder over the root with the rules above; `sorted` sorts each folder by name (for
    /// a deterministic sequential walk; the parallel walk ignores it).
    pub(crate) fn builder(&self, sorted: bool) -> WalkBuilder {
        let mut b = WalkBuilder::new(&self.root);
        // Hidden entries are skipped by `admit` (which counts the folders), not by the walker.
        b.standard_filters(true)
            .hidden(false)
            .parents(false)
            .ignore(true)
            .git_ignore(true)
            .git_exclude(true)
            .git_global(false)
            .require_git(false)
            .follow_links(true);
        if sorted {
            b.sort_by_file_name(|a, b| a.cmp(b));
        }
        let filter = self.filter.clone();
        let issues = self.issues.clone();
        let hidden = self.hidden.clone();
        b.filter_entry(move |entry| {
            if entry.depth() > 0 && entry.file_name().to_string_lossy().starts_with('.') {
                let name = entry.file_name();
                if name != ".git" && entry.file_type().is_some_and(|t| t.is_dir()) {
                    hidden.lock().expect("hidden folders").push(lossy_rel(&filter.root, entry.path()));
                }
                return false;
            }
            admit(&filter, &issues, entry)
        });
        b
    }

    fn issue(&self, rel_path: String, error: impl Into<String>) {
        self.issues.lock().expect("walk issues").push(WalkIssue { rel_path, error: error.into() });
    }

    /// Turns one walker result into a document file, an issue, or nothing (a folder, a file
    /// the globs leave out).
    pub(crate) fn accept(&self, result: Result<DirEntry, ignore::Error>) -> Option<FileEntry> {
        let entry = match result {
            Ok(e) => e,
            Err(err) => {
                self.report(&err);
                return None;
            }
        };
        let ft = entry.file_type()?;
        if ft.is_dir() {
            return None;
        }
        let Some(rel) = rel_of(&self.root, entry.path()) else {
            self.issue(lossy_rel(&self.root, entry.path()), "file name is not UTF-8");
            return None;
        };
        if !self.filter.globs_accept(&rel) {
            return None;
        }
        if !ft.is_file() {
            self.issue(rel, "not a regular file");
            return None;
        }
        let meta = match std::fs::metadata(entry.path()) {
            Ok(m) => m,
            Err(e) => {
                self.issue(rel, format!("cannot read: {e}"));
                return None;
            }
        };
        let mtime_ms = meta
            .modified()
            .ok()
            .map(|t| match t.duration_since(UNIX_EPOCH) {
                Ok(d) => i64::try_from(d.as_millis()).unwrap_or(i64::MAX),
                Err(e) => -i64::try_from(e.duration().as_millis()).unwrap_or(i64::MAX),
            })
            .unwrap_or(0);
        Some(FileEntry { rel_path: rel, abs_path: entry.into_path(), size: meta.len(), mtime_ms })
    }

    fn report(&self, err: &ignore::Error) {
        let mut path = None;
        let mut e = err;
        loop {
            match e {
                ignore::Error::WithPath { path: p, err } => {
                    path.get_or_insert(p.clone());
                    e = err;
                }
                ignore::Error::WithDepth { err, .. } | ignore::Error::WithLineNumber { err, .. } => e = err,
                ignore::Error::Loop { ancestor, child } => {
                    let to = lossy_rel(&self.root, ancestor);
                    let to = if to.is_empty() { "the knowledge base folder".to_owned() } else { to };
                    self.issue(lossy_rel(&self.root, child), format!("symlink loop back to {to}"));
                    return;
                }
                ignore::Error::Partial(_) => return, // a partly bad ignore file: the good lines apply
                ignore::Error::Io(io) => {
                    let Some(p) = path.as_deref() else { return };
                    let rel = lossy_rel(&self.root, p);
                    if io.kind() == std::io::ErrorKind::NotFound {
                        // A dangling symlink (or a file gone meanwhile): worth a word only
                        // when it would be a document.
                        let is_link = std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_symlink());
                        if is_link && self.filter.globs_accept(&rel) {
                            self.issue(rel, "symlink target does not exist");
                        }
                        return;
                    }
                    self.issue(rel, format!("cannot read: {io}"));
                    return;
                }
                other => {
                    let rel = path.as_deref().map(|p| lossy_rel(&self.root, p)).unwrap_or_default();
                    // Problems in ignore files are not problems with documents.
                    if !(rel.ends_with(".gitignore") || rel.ends_with(".ignore")) {
                        self.issue(rel, other.to_string());
                    }
                    return;
                }
            }
        }
    }

    pub(crate) fn take_issues(&self) -> Vec<WalkIssue> {
        std::mem::take(&mut *self.issues.lock().expect("walk issues"))
    }
}

/// The walker's entry filter: prunes excluded folders and symlinks whose target leaves the
/// root (recording an issue for each such link to a folder or to a file the globs include).
fn admit(filter: &PathFilter, issues: &Mutex<Vec<WalkIssue>>, entry: &DirEntry) -> bool {
    let root = filter.root.as_path();
    if entry.depth() == 0 {
        return true;
    }
    if entry.path_is_symlink() {
        match std::fs::canonicalize(entry.path()) {
            Ok(target) if target.starts_with(root) => {}
            Ok(target) => {
                let rel = rel_of(root, entry.path());
                let document = rel.as_deref().is_some_and(|r| filter.globs_accept(r));
                if !target.is_dir() && !document {
                    return false;
                }
                issues.lock().expect("walk issues").push(WalkIssue {
                    rel_path: lossy_rel(root, entry.path()),
                    error: "symlink points outside the knowledge base folder (not followed)".to_owned(),
                });
                return false;
            }
            // A dangling link: nothing to index; reported when it would be a document.
            Err(_) => {
                if rel_of(root, entry.path()).is_some_and(|r| filter.globs_accept(&r)) {
                    issues.lock().expect("walk issues").push(WalkIssue {
                        rel_path: lossy_rel(root, entry.path()),
                        error: "symlink target does not exist".to_owned(),
                    });
                }
                return false;
            }
        }
    }
    let is_dir = entry.file_type().is_some_and(|t| t.is_dir());
    if is_dir && !filter.skip.is_empty() {
        let real = std::fs::canonicalize(entry.path()).unwrap_or_else(|_| entry.path().to_owned());
        if filter.skipped(entry.path()) || filter.skipped(&real) {
            return false;
        }
    }
    if is_dir
        && let Some(rel) = rel_of(root, entry.path())
        && filter.exclude.is_match(&rel)
    {
        return false;
    }
    true
}

/// Walks `spec.root` and lists its document files, sorted by `rel_path`, with the issues met
/// on the way (unreadable folders, symlink loops, symlinks leaving the root, non-regular
/// files, names that are not UTF-8). Sequential and deterministic; for the reconcile pass.
///
/// # Errors
/// [`WalkError`] when the root is missing, not a folder or unreadable, or a glob is bad.
pub fn walk(spec: &WalkSpec) -> Result<(Vec<FileEntry>, Vec<WalkIssue>), WalkError> {
    walk_full(spec).map(|w| (w.files, w.issues))
}

/// What [`walk_full`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Walk {
    /// The documents, by `rel_path`.
    pub files: Vec<FileEntry>,
    /// What it could not take.
    pub issues: Vec<WalkIssue>,
    /// The hidden folders it skipped (relative, sorted; `.git` not counted: never notes).
    pub hidden: Vec<String>,
}

/// [`walk`], also naming the hidden folders it skipped.
///
/// # Errors
/// As [`walk`].
pub fn walk_full(spec: &WalkSpec) -> Result<Walk, WalkError> {
    let prepared = Prepared::new(spec)?;
    let mut files: Vec<FileEntry> = Vec::new();
    for result in prepared.builder(true).build() {
        if let Some(f) = prepared.accept(result) {
            files.push(f);
        }
    }
    let files = dedupe(&prepared.root, files);
    let mut issues = prepared.take_issues();
    issues.sort_by(|a, b| a.rel_path.cmp(&b.rel_path).then_with(|| a.error.cmp(&b.error)));
    issues.dedup();
    let mut hidden = std::mem::take(&mut *prepared.hidden.lock().expect("hidden folders"));
    hidden.sort();
    hidden.dedup();
    Ok(Walk { files, issues, hidden })
}

/// Keeps one entry per real file: the one whose `rel_path` is the file's real (canonical)
/// path when present, else the smallest `rel_path`. Sorted by `rel_path`.
fn dedupe(root: &Path, files: Vec<FileEntry>) -> Vec<FileEntry> {
    let mut best: HashMap<PathBuf, FileEntry> = HashMap::with_capacity(files.len());
    for f in files {
        let canon = std::fs::canonicalize(&f.abs_path).unwrap_or_else(|_| f.abs_path.clone());
        let real = rel_of(root, &canon);
        match best.get(&canon) {
            None => {
                best.insert(canon, f);
            }
            Some(kept) => {
                let kept_real = real.as_deref() == Some(kept.rel_path.as_str());
                let new_real = real.as_deref() == Some(f.rel_path.as_str());
                if new_real || (!kept_real && f.rel_path < kept.rel_path) {
                    best.insert(canon, f);
                }
            }
        }
    }
    let mut out: Vec<FileEntry> = best.into_values().collect();
    out.sort_by(|a, b| a.rel_path.cmp(&b.rel_path));
    out
}

/// The `/`-separated path of `candidate` relative to `root`, after resolving symlinks, or
/// `None` when it escapes the root (by `..` or a symlink), is the root itself, or is not UTF-8.
/// `candidate` may be absolute or relative to `root`, and need not exist (a deleted file): its
/// longest existing ancestor is resolved and the rest appended, where a `..` is refused.
pub fn safe_relative(root: &Path, candidate: &Path) -> Option<String> {
    let root = std::fs::canonicalize(root).ok()?;
    let joined = if candidate.is_absolute() { candidate.to_owned() } else { root.join(candidate) };
    // Find the longest existing prefix and resolve it; the remainder must be plain names.
    let comps: Vec<Component<'_>> = joined.components().collect();
    let mut split = comps.len();
    let resolved = loop {
        let prefix: PathBuf = comps[..split].iter().collect();
        if let Ok(p) = std::fs::canonicalize(&prefix) {
            break p;
        }
        if split == 0 {
            return None;
        }
        split -= 1;
    };
    let mut full = resolved;
    for c in &comps[split..] {
        match c {
            Component::Normal(s) => full.push(s),
            Component::CurDir => {}
            _ => return None,
        }
    }
    let rel = rel_of(&root, &full)?;
    if rel.is_empty() { None } else { Some(rel) }
}

#[cfg(test)]
#[path = "tests/walk.rs"]
mod tests;
