//! `coffer restore PATH [--force]`: puts a backup made by `coffer backup` back into a stopped
//! Coffer. Offline by design: the daemon must not run (its store holds `coffer.db` open), and
//! this command never starts one.
//!
//! Order, so that a refused restore changes nothing:
//! 1. refuse while `daemon.lock` is held;
//! 2. refuse a home that already holds data unless `--force`;
//! 3. verify the backup: `manifest.json` (format version, only paths a backup can hold), every
//!    listed file present with its size and SHA-256, and `PRAGMA integrity_check` on its
//!    `coffer.db` (opened read-only and immutable: it is a plain file in the backup, not the live
//!    database);
//! 4. take `daemon.lock` for the rest, so no daemon starts halfway;
//! 5. copy the files into a staging folder inside the home (hashing them again);
//! 6. move the current `coffer.db` (with any `-wal`/`-shm`), `secret.key`, `knowledge/`,
//!    `memory/` and `skills/` into `restore-backup-<time>/` and the staged ones into place
//!    (renames within the home; a failure moves everything back);
//! 7. turn `restore-backup-<time>/` into a backup of its own (WAL folded in, `manifest.json`),
//!    so `coffer restore --force` on it undoes this restore.
use std::collections::BTreeSet;
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use clap::Args;
use coffer_runtime::daemon_file::{DaemonFileError, DaemonLock, lock_is_held};
use coffer_runtime::home::CofferHome;
use serde_json::{Value, json};

use crate::context::Ctx;
use crate::error::CliError;
use crate::output;

/// The backup format this version reads and writes.
pub const FORMAT_VERSION: u64 = 1;
/// The manifest's file name in a backup.
pub const MANIFEST: &str = "manifest.json";
/// Top-level files a backup may hold besides the manifest.
const FILES: &[&str] = &["coffer.db", "secret.key"];
/// Folders a backup may hold.
const FOLDERS: &[&str] = &["knowledge", "memory", "skills"];
/// What a restore moves aside, in this order (the database's side files with it).
const REPLACED: &[&str] = &[
    "coffer.db",
    "coffer.db-wal",
    "coffer.db-shm",
    "coffer.db-journal",
    "secret.key",
    "knowledge",
    "memory",
    "skills",
];
/// Prefix of the folder keeping the previous state.
pub const ASIDE_PREFIX: &str = "restore-backup-";

const EXAMPLES: &str = "\
Examples:
  coffer daemon stop && coffer restore ~/coffer-backups/2026-11-30
  coffer restore --force ~/coffer-backups/2026-11-30     # the home already holds data

The current coffer.db, secret.key, knowledge/, memory/ and skills/ are kept in
COFFER_HOME/restore-backup-<time>/, itself a backup: `coffer restore --force` on it undoes
the restore.";

#[derive(Debug, Args)]
#[command(after_help = EXAMPLES)]
pub struct RestoreArgs {
    /// The backup directory (made by `coffer backup`).
    pub path: PathBuf,
    /// Replace a home that already holds data (its current state is kept aside either way).
    #[arg(long)]
    pub force: bool,
}

/// A backup file as the manifest lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub path: String,
    pub bytes: u64,
    pub sha256: String,
}

/// A verified backup.
#[derive(Debug)]
pub struct Verified {
    pub dir: PathBuf,
    pub coffer_version: String,
    pub created_at: String,
    pub schema_version: i64,
    pub files: Vec<Entry>,
}

/// What a restore did.
#[derive(Debug)]
pub struct Restored {
    pub backup: Verified,
    /// Where the previous state went; `None` when the home held nothing.
    pub aside: Option<PathBuf>,
    /// True when `aside` holds a `manifest.json` (restorable with `coffer restore --force`).
    pub aside_restorable: bool,
}

fn fail(msg: impl Into<String>) -> CliError {
    CliError::Failed(msg.into())
}

/// Runs `coffer restore`.
///
/// # Errors
/// Exit 1 with the reason: the daemon runs, the home holds data without `--force`, the backup
/// is incomplete or corrupt (naming the file), or a file operation failed (everything moved
/// back).
pub async fn run(ctx: &Ctx, args: RestoreArgs) -> Result<(), CliError> {
    let src = std::path::absolute(&args.path)
        .map_err(|e| CliError::Usage(format!("cannot resolve {}: {e}", args.path.display())))?;
    let r = restore(&ctx.home, &src, args.force)?;
    let aside = r.aside.as_ref().map(|p| p.display().to_string());
    if let Some(a) = &aside
        && !r.aside_restorable
    {
        crate::eprintln_printable!(
            "warning: the previous state in {a} could not be made restorable; move its files back by hand to undo"
        );
    }
    if ctx.json {
        return output::print_json(&json!({
            "restored_from": r.backup.dir,
            "home": ctx.home.root(),
            "created_at": r.backup.created_at,
            "coffer_version": r.backup.coffer_version,
            "schema_version": r.backup.schema_version,
            "files": r.backup.files.len(),
            "previous_state": aside,
        }));
    }
    let mut out = format!(
        "Restored {} (made {} by coffer {}) into {}\n",
        r.backup.dir.display(),
        output::format_time(&r.backup.created_at),
        r.backup.coffer_version,
        ctx.home.root().display()
    );
    match &aside {
        Some(a) if r.aside_restorable => out.push_str(&format!(
            "The previous state is in {a}\nTo undo: coffer restore --force {}\n",
            output::shell_quote(a)
        )),
        Some(a) => out.push_str(&format!("The previous state is in {a}\n")),
        None => {}
    }
    output::print(&out)
}

/// Restores the backup in `src` into `home` (see the module docs for the order of steps).
///
/// # Errors
/// [`CliError::Failed`] naming what is wrong; nothing in the home has changed unless the
/// message says so.
pub fn restore(home: &CofferHome, src: &Path, force: bool) -> Result<Restored, CliError> {
    let refuse_running = || {
        fail(format!(
            "the Coffer daemon is running on {} (it holds daemon.lock); stop it with `coffer daemon stop` first, then run `coffer restore` again",
            home.root().display()
        ))
    };
    if lock_is_held(&home.daemon_lock()) {
        return Err(refuse_running());
    }
    if !force && let Some(what) = existing_data(home.root()) {
        return Err(fail(format!(
            "{} already holds data ({what}); rerun with --force to replace it (the current state is kept in {}/{ASIDE_PREFIX}<time>/)",
            home.root().display(),
            home.root().display()
        )));
    }
    let backup = verify(src)?;

    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(home.root())
        .map_err(|e| fail(format!("cannot create {}: {e}", home.root().display())))?;
    let _lock = match DaemonLock::acquire(&home.daemon_lock(), Duration::ZERO) {
        Ok(l) => l,
        Err(DaemonFileError::Locked { .. }) => return Err(refuse_running()),
        Err(e) => return Err(fail(e.to_string())),
    };

    let stamp = unique_stamp(home.root());
    let staging = home.root().join(format!(".restore-staging-{stamp}"));
    let staged = stage(&backup, &staging);
    if let Err(e) = staged {
        let _ = std::fs::remove_dir_all(&staging);
        return Err(e);
    }
    let aside = home.root().join(format!("{ASIDE_PREFIX}{stamp}"));
    let swapped = swap(home.root(), &staging, &aside);
    let _ = std::fs::remove_dir_all(&staging);
    let moved_aside = swapped?;
    for f in FOLDERS {
        let _ = std::fs::DirBuilder::new().mode(0o700).create(home.root().join(f));
    }
    let (aside, aside_restorable) = if moved_aside {
        let ok = make_restorable(&aside).is_ok();
        (Some(aside), ok)
    } else {
        let _ = std::fs::remove_dir(&aside);
        (None, false)
    };
    Ok(Restored { backup, aside, aside_restorable })
}

/// What makes `root` a home with data, if anything: a database, a key, or markdown files.
fn existing_data(root: &Path) -> Option<String> {
    let mut found = Vec::new();
    for f in FILES {
        if root.join(f).exists() {
            found.push((*f).to_owned());
        }
    }
    for d in FOLDERS {
        if std::fs::read_dir(root.join(d)).is_ok_and(|mut rd| rd.next().is_some()) {
            found.push(format!("{d}/"));
        }
    }
    (!found.is_empty()).then(|| found.join(", "))
}

// ---------------------------------------------------------------------------------------------
// Verification.

/// Reads and checks a backup without changing anything.
///
/// # Errors
/// [`CliError::Failed`] naming the backup and what is wrong with it.
pub fn verify(dir: &Path) -> Result<Verified, CliError> {
    let bad = |what: String| fail(format!("{} is not a usable Coffer backup: {what}", dir.display()));
    if !dir.is_dir() {
        return Err(fail(format!("{} is not a directory", dir.display())));
    }
    let text = match std::fs::read(dir.join(MANIFEST)) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(bad(format!("{MANIFEST} is missing (an unfinished backup has none)")));
        }
        Err(e) => return Err(bad(format!("cannot read {MANIFEST}: {e}"))),
    };
    let m: Value = serde_json::from_slice(&text).map_err(|e| bad(format!("{MANIFEST} is not valid JSON ({e})")))?;
    let format = m["format_version"].as_u64().ok_or_else(|| bad(format!("{MANIFEST} has no format_version")))?;
    if format != FORMAT_VERSION {
        return Err(bad(format!(
            "its format version is {format}; this coffer ({}) reads format {FORMAT_VERSION}",
            coffer_runtime::VERSION
        )));
    }
    let coffer_version = m["coffer_version"].as_str().unwrap_or_default().to_owned();
    if newer(&coffer_version, coffer_runtime::VERSION) {
        return Err(bad(format!(
            "it was made by coffer {coffer_version}, newer than this coffer {}; upgrade first",
            coffer_runtime::VERSION
        )));
    }
    let schema_version =
        m["schema_version"].as_i64().ok_or_else(|| bad(format!("{MANIFEST} has no schema_version")))?;
    let list = m["files"].as_array().ok_or_else(|| bad(format!("{MANIFEST} has no files list")))?;
    let mut files = Vec::with_capacity(list.len());
    let mut seen = BTreeSet::new();
    for f in list {
        let e = entry(f).map_err(|why| bad(format!("{MANIFEST}: {why}")))?;
        if !seen.insert(e.path.clone()) {
            return Err(bad(format!("{MANIFEST} lists {} twice", e.path)));
        }
        files.push(e);
    }
    if !seen.contains("coffer.db") {
        return Err(bad(format!("{MANIFEST} does not list coffer.db")));
    }
    for e in &files {
        let p = dir.join(&e.path);
        let meta = match std::fs::symlink_metadata(&p) {
            Ok(m) => m,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                return Err(bad(format!("{} is missing", e.path)));
            }
            Err(err) => return Err(bad(format!("cannot read {}: {err}", e.path))),
        };
        if !meta.is_file() {
            return Err(bad(format!("{} is not a regular file", e.path)));
        }
        if meta.len() != e.bytes {
            return Err(bad(format!("{} is {} bytes, the manifest says {}", e.path, meta.len(), e.bytes)));
        }
        let mut input = File::open(&p).map_err(|err| bad(format!("cannot read {}: {err}", e.path)))?;
        let (_, sha) = coffer_runtime::digest::sha256_copy(&mut input, None)
            .map_err(|err| bad(format!("cannot read {}: {err}", e.path)))?;
        if sha != e.sha256 {
            return Err(bad(format!("{} does not match its SHA-256 in the manifest (corrupt or changed)", e.path)));
        }
    }
    let user_version = check_database(&dir.join("coffer.db")).map_err(|why| bad(format!("coffer.db {why}")))?;
    if user_version != schema_version {
        return Err(bad(format!("coffer.db is at schema version {user_version}, the manifest says {schema_version}")));
    }
    Ok(Verified {
        dir: dir.to_path_buf(),
        coffer_version,
        created_at: m["created_at"].as_str().unwrap_or_default().to_owned(),
        schema_version,
        files,
    })
}

/// One manifest entry, checked: a relative path a backup can hold, a size, a SHA-256.
fn entry(f: &Value) -> Result<Entry, String> {
    let path = f["path"].as_str().ok_or("an entry has no path")?;
    let bytes = f["bytes"].as_u64().ok_or_else(|| format!("{path:?} has no byte count"))?;
    let sha256 = f["sha256"].as_str().unwrap_or_default();
    if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return Err(format!("{path:?} has no valid sha256"));
    }
    // Only names a backup writes: a crafted manifest must not reach outside the home.
    let parts: Vec<Component<'_>> = Path::new(path).components().collect();
    let allowed = match parts.as_slice() {
        [Component::Normal(n)] => FILES.iter().any(|f| n.to_str() == Some(f)),
        [Component::Normal(first), rest @ ..] if !rest.is_empty() => {
            FOLDERS.iter().any(|d| first.to_str() == Some(d)) && rest.iter().all(|c| matches!(c, Component::Normal(_)))
        }
        _ => false,
    };
    let canonical = path.split('/').all(|seg| !seg.is_empty() && seg != "." && seg != "..");
    if !allowed || !canonical || path.contains('\\') {
        return Err(format!("{path:?} is not a path a Coffer backup holds"));
    }
    Ok(Entry { path: path.to_owned(), bytes, sha256: sha256.to_owned() })
}

/// Opens a database file read-only and immutable (no journal, no `-shm` next to it) and runs
/// `PRAGMA integrity_check`; returns its `user_version` (schema version).
// The documented exception to "only coffer-store opens coffer.db": `coffer restore` checks a\nbackup (read-only, immutable) while no daemon holds the lock.
#[allow(clippy::disallowed_methods)]
fn check_database(path: &Path) -> Result<i64, String> {
    let uri = format!("file:{}?immutable=1", uri_path(path));
    let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY
        | rusqlite::OpenFlags::SQLITE_OPEN_URI
        | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let c = rusqlite::Connection::open_with_flags(uri, flags).map_err(|e| format!("cannot be opened: {e}"))?;
    let problems: Vec<String> = (|| {
        let mut st = c.prepare("PRAGMA integrity_check(20)")?;
        let rows = st.query_map([], |r| r.get::<_, String>(0))?;
        rows.collect::<Result<Vec<_>, _>>()
    })()
    .map_err(|e| format!("is not a readable SQLite database ({e})"))?;
    if problems != ["ok"] {
        return Err(format!("fails SQLite's integrity check: {}", problems.join("; ")));
    }
    c.pragma_query_value(None, "user_version", |r| r.get(0)).map_err(|e| format!("has no schema version ({e})"))
}

/// A file path for a `file:` URI: every byte but unreserved ones and `/` percent-encoded.
fn uri_path(path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let mut out = String::new();
    for &b in path.as_os_str().as_bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'/' | b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// True when version `a` (`x.y.z`) is newer than `b`; unparsable versions are not newer.
fn newer(a: &str, b: &str) -> bool {
    let parse =
        |v: &str| -> Option<Vec<u64>> { v.split(['-', '+']).next()?.split('.').map(|p| p.parse().ok()).collect() };
    match (parse(a), parse(b)) {
        (Some(a), Some(b)) => a > b,
        _ => false,
    }
}

// ---------------------------------------------------------------------------------------------
// Applying.

/// `20261130T101254Z`, unique among the home's restore folders.
fn unique_stamp(root: &Path) -> String {
    let now = coffer_runtime::now_rfc3339();
    let base: String = now.chars().take(19).filter(|c| *c != '-' && *c != ':').collect::<String>() + "Z";
    let mut stamp = base.clone();
    let mut n = 1;
    while root.join(format!("{ASIDE_PREFIX}{stamp}")).exists()
        || root.join(format!(".restore-staging-{stamp}")).exists()
    {
        n += 1;
        stamp = format!("{base}-{n}");
    }
    stamp
}

fn mkdir_private(p: &Path) -> Result<(), CliError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(p)
        .map_err(|e| fail(format!("cannot create {}: {e}", p.display())))
}

/// Copies every listed file into `staging` (0700 folders, 0600 files), checking each copy
/// against the manifest again: the backup must not change under a restore.
fn stage(b: &Verified, staging: &Path) -> Result<(), CliError> {
    mkdir_private(staging)?;
    for d in FOLDERS {
        mkdir_private(&staging.join(d))?;
    }
    for e in &b.files {
        let src = b.dir.join(&e.path);
        let dst = staging.join(&e.path);
        if let Some(parent) = dst.parent() {
            mkdir_private(parent)?;
        }
        let mut input = File::open(&src).map_err(|err| fail(format!("cannot read {}: {err}", src.display())))?;
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&dst)
            .map_err(|err| fail(format!("cannot write {}: {err}", dst.display())))?;
        let (bytes, sha) = coffer_runtime::digest::sha256_copy(&mut input, Some(&mut out))
            .map_err(|err| fail(format!("copying {}: {err}", e.path)))?;
        out.sync_all().map_err(|err| fail(format!("cannot write {}: {err}", dst.display())))?;
        if bytes != e.bytes || sha != e.sha256 {
            return Err(fail(format!("{} changed while it was being restored; nothing was replaced", src.display())));
        }
    }
    Ok(())
}

/// Moves the home's current state into `aside` and the staged files into the home. Returns
/// whether anything was moved aside. On failure everything is moved back.
fn swap(root: &Path, staging: &Path, aside: &Path) -> Result<bool, CliError> {
    mkdir_private(aside)?;
    let mut moved_aside: Vec<&str> = Vec::new();
    let mut moved_in: Vec<&str> = Vec::new();
    let result = (|| {
        for name in REPLACED {
            if std::fs::symlink_metadata(root.join(name)).is_ok() {
                rename(&root.join(name), &aside.join(name))?;
                moved_aside.push(name);
            }
        }
        for name in FILES.iter().chain(FOLDERS) {
            if std::fs::symlink_metadata(staging.join(name)).is_ok() {
                rename(&staging.join(name), &root.join(name))?;
                moved_in.push(name);
            }
        }
        Ok::<_, CliError>(())
    })();
    if let Err(e) = result {
        for name in &moved_in {
            let _ = rename(&root.join(name), &staging.join(name));
        }
        let mut unrestored = Vec::new();
        for name in &moved_aside {
            if rename(&aside.join(name), &root.join(name)).is_err() {
                unrestored.push(*name);
            }
        }
        if unrestored.is_empty() {
            let _ = std::fs::remove_dir(aside);
            return Err(fail(format!("{e}; the home was left as it was")));
        }
        return Err(fail(format!(
            "{e}; could not move {} back from {}: move them back by hand",
            unrestored.join(", "),
            aside.display()
        )));
    }
    if let Ok(d) = File::open(root) {
        let _ = d.sync_all();
    }
    Ok(!moved_aside.is_empty())
}

fn rename(from: &Path, to: &Path) -> Result<(), CliError> {
    std::fs::rename(from, to).map_err(|e| fail(format!("cannot move {} to {}: {e}", from.display(), to.display())))
}

/// Makes the folder holding the previous state a backup of its own: the database's WAL folded
/// into the main file, then `manifest.json`. The database there is a private copy of a stopped
/// home, not the live one, so opening it read-write here is safe.
// The documented `coffer restore` exception: a private copy of a stopped home, never the live file.
#[allow(clippy::disallowed_methods)]
fn make_restorable(aside: &Path) -> Result<(), String> {
    let db = aside.join("coffer.db");
    if !db.exists() {
        return Err("no coffer.db".into());
    }
    let schema_version: i64 = {
        let c = rusqlite::Connection::open(&db).map_err(|e| e.to_string())?;
        c.pragma_query_value(None, "wal_checkpoint", |r| r.get::<_, i64>(0)).map_err(|e| e.to_string())?;
        c.pragma_update(None, "journal_mode", "DELETE").map_err(|e| e.to_string())?;
        c.pragma_query_value(None, "user_version", |r| r.get(0)).map_err(|e| e.to_string())?
    };
    for side in ["coffer.db-wal", "coffer.db-shm", "coffer.db-journal"] {
        let _ = std::fs::remove_file(aside.join(side));
    }
    let mut files = Vec::new();
    collect(aside, Path::new(""), &mut files).map_err(|e| e.to_string())?;
    files.sort_by(|a, b| a["path"].as_str().cmp(&b["path"].as_str()));
    let manifest = json!({
        "format_version": FORMAT_VERSION,
        "coffer_version": coffer_runtime::VERSION,
        "created_at": coffer_runtime::now_rfc3339(),
        "schema_version": schema_version,
        "files": files,
    });
    let text = serde_json::to_string_pretty(&manifest).map_err(|e| e.to_string())? + "\n";
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(aside.join(MANIFEST))
        .map_err(|e| e.to_string())?;
    f.write_all(text.as_bytes()).and_then(|()| f.sync_all()).map_err(|e| e.to_string())
}

/// Manifest entries for the regular files under `dir/rel` that a backup may hold.
fn collect(dir: &Path, rel: &Path, out: &mut Vec<Value>) -> std::io::Result<()> {
    for e in std::fs::read_dir(dir.join(rel))? {
        let e = e?;
        let child = rel.join(e.file_name());
        let Some(name) = child.to_str() else { continue };
        let kind = e.file_type()?;
        let top_level_file = rel.as_os_str().is_empty() && FILES.contains(&name);
        let in_folder = FOLDERS.iter().any(|d| child.starts_with(d));
        if kind.is_dir() && in_folder {
            collect(dir, &child, out)?;
        } else if kind.is_file() && (top_level_file || (in_folder && !rel.as_os_str().is_empty())) {
            let (bytes, sha256) = coffer_runtime::digest::sha256_copy(&mut File::open(e.path())?, None)?;
            out.push(json!({"path": name, "bytes": bytes, "sha256": sha256}));
        }
    }
    Ok(())
}

#[cfg(test)]
// The tests make and corrupt databases by hand for `coffer restore` to check.
#[allow(clippy::disallowed_methods)]
mod tests {
    use super::*;

    #[test]
    fn manifest_paths_stay_inside_a_backup() {
        let sha = "a".repeat(64);
        let ok = |p: &str| entry(&json!({"path": p, "bytes": 1, "sha256": sha})).is_ok();
        for p in ["coffer.db", "secret.key", "knowledge/a.md", "memory/x/y.md", "skills/s/SKILL.md"] {
            assert!(ok(p), "{p}");
        }
        for p in [
            "../x",
            "/etc/passwd",
            "knowledge",
            "knowledge/../../x",
            "logs/a",
            "daemon.json",
            "coffer.db/x",
            "",
            "memory/./a",
        ] {
            assert!(!ok(p), "{p}");
        }
        assert!(entry(&json!({"path": "coffer.db", "bytes": 1, "sha256": "xyz"})).is_err());
        assert!(entry(&json!({"path": "coffer.db", "sha256": sha})).is_err());
    }

    #[test]
    fn versions_compare_numerically() {
        assert!(newer("0.10.0", "0.9.9"));
        assert!(!newer("0.1.0", "0.1.0"));
        assert!(!newer("0.1.0-dev", "0.1.0"));
        assert!(!newer("garbage", "0.1.0"));
    }

    #[test]
    fn uri_paths_are_escaped() {
        assert_eq!(uri_path(Path::new("/a b/c?d#e%.db")), "/a%20b/c%3Fd%23e%25.db");
    }

    /// A small backup made by hand in the format `coffer backup` writes.
    fn make_backup(dir: &Path) {
        std::fs::create_dir_all(dir.join("knowledge")).unwrap();
        let c = rusqlite::Connection::open(dir.join("coffer.db")).unwrap();
        c.execute_batch("CREATE TABLE t(x); INSERT INTO t VALUES (42); PRAGMA user_version = 1;").unwrap();
        drop(c);
        std::fs::write(dir.join("knowledge/a.md"), "# a\n").unwrap();
        std::fs::write(dir.join("secret.key"), [1u8; 32]).unwrap();
        let mut files = Vec::new();
        collect(dir, Path::new(""), &mut files).unwrap();
        let m = json!({"format_version": 1, "coffer_version": "0.1.0", "created_at": "2026-11-30T10:00:00.000Z", "schema_version": 1, "files": files});
        std::fs::write(dir.join(MANIFEST), m.to_string()).unwrap();
    }

    #[test]
    fn restores_keeps_the_old_state_restorable_and_refuses_data_without_force() {
        let tmp = tempfile::tempdir().unwrap();
        let bk = tmp.path().join("bk");
        make_backup(&bk);
        let home = CofferHome::at(tmp.path().join("home"));

        // Into a fresh home: nothing to keep aside.
        let r = restore(&home, &bk, false).unwrap();
        assert!(r.aside.is_none());
        assert_eq!(std::fs::read(home.root().join("knowledge/a.md")).unwrap(), b"# a\n");
        assert!(home.root().join("memory").is_dir() && home.root().join("skills").is_dir());

        // Again: the home now holds data.
        let e = restore(&home, &bk, false).unwrap_err().to_string();
        assert!(e.contains("--force") && e.contains("coffer.db"), "{e}");

        // Change the home, restore with --force: the change is in the aside folder, which is a
        // valid backup restoring the change.
        std::fs::write(home.root().join("memory/new.md"), "new\n").unwrap();
        std::fs::write(home.root().join("coffer.db-wal"), b"stale").unwrap();
        let r = restore(&home, &bk, true).unwrap();
        let aside = r.aside.unwrap();
        assert!(r.aside_restorable);
        assert!(aside.file_name().unwrap().to_str().unwrap().starts_with(ASIDE_PREFIX));
        assert!(!home.root().join("memory/new.md").exists());
        assert!(!home.root().join("coffer.db-wal").exists());
        let undo = verify(&aside).unwrap();
        assert!(undo.files.iter().any(|f| f.path == "memory/new.md"));
        restore(&home, &aside, true).unwrap();
        assert_eq!(std::fs::read(home.root().join("memory/new.md")).unwrap(), b"new\n");
    }

    #[test]
    fn corrupt_backups_are_refused_naming_the_problem() {
        let tmp = tempfile::tempdir().unwrap();
        let check = |mutate: &dyn Fn(&Path), needle: &str| {
            let bk = tmp.path().join(format!("bk-{}", needle.len()));
            let _ = std::fs::remove_dir_all(&bk);
            make_backup(&bk);
            mutate(&bk);
            let e = verify(&bk).unwrap_err().to_string();
            assert!(e.contains(needle), "{needle}: {e}");
        };
        check(&|b| std::fs::remove_file(b.join(MANIFEST)).unwrap(), "manifest.json is missing");
        check(&|b| std::fs::write(b.join(MANIFEST), "{").unwrap(), "not valid JSON");
        check(&|b| std::fs::remove_file(b.join("knowledge/a.md")).unwrap(), "knowledge/a.md is missing");
        check(
            &|b| std::fs::write(b.join("knowledge/a.md"), "# b\n").unwrap(),
            "knowledge/a.md does not match its SHA-256",
        );
        check(
            &|b| {
                let f = std::fs::OpenOptions::new().write(true).open(b.join("coffer.db")).unwrap();
                f.set_len(100).unwrap();
            },
            "coffer.db is 100 bytes",
        );
        check(
            &|b| {
                let m: Value = serde_json::from_slice(&std::fs::read(b.join(MANIFEST)).unwrap()).unwrap();
                let mut m = m;
                m["format_version"] = json!(2);
                std::fs::write(b.join(MANIFEST), m.to_string()).unwrap();
            },
            "format version is 2",
        );
    }

    #[test]
    fn a_page_corrupted_database_fails_the_integrity_check() {
        let tmp = tempfile::tempdir().unwrap();
        let db = tmp.path().join("x.db");
        let c = rusqlite::Connection::open(&db).unwrap();
        c.execute_batch("CREATE TABLE t(x TEXT); CREATE INDEX t_x ON t(x);").unwrap();
        for i in 0..2000 {
            c.execute("INSERT INTO t VALUES (?1)", [format!("row-{i:05}-{}", "x".repeat(40))]).unwrap();
        }
        drop(c);
        assert_eq!(check_database(&db).unwrap(), 0);
        // Scribble over the middle of the file (index and table pages), keeping the header.
        let mut bytes = std::fs::read(&db).unwrap();
        let mid = bytes.len() / 2;
        for b in &mut bytes[mid..mid + 4096] {
            *b = 0x5a;
        }
        std::fs::write(&db, &bytes).unwrap();
        let e = check_database(&db).unwrap_err();
        assert!(e.contains("integrity") || e.contains("malformed") || e.contains("not a readable"), "{e}");
    }
}
