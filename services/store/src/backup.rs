//! Backups of a Coffer home, written by the store (the one process that may read `coffer.db`
//! consistently while the daemon runs).
//!
//! A backup is a directory:
//!
//! ```text
//! <dir>/coffer.db        consistent snapshot (VACUUM INTO: one read transaction, rollback journal)
//! <dir>/knowledge/…      copies of the markdown folders (regular files; symlinks are skipped)
//! <dir>/memory/…
//! <dir>/skills/…
//! <dir>/secret.key       when present: whoever holds the backup can decrypt its credentials
//! <dir>/manifest.json    {format_version, coffer_version, created_at, schema_version,
//!                         files:[{path, bytes, sha256}]}, written last
//! ```
//!
//! The directory is created 0700 and every file 0600. `manifest.json` is written last and
//! atomically (temp file, rename), so a directory without one is an unfinished backup; `coffer
//! restore` verifies every listed file's size and SHA-256 and the database's integrity before it
//! touches anything. The database snapshot is consistent on its own; the markdown folders are
//! copied file by file after it (they are the user's files, edited outside any transaction).
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use serde::Serialize;

use crate::db::{Db, StoreError};

/// Version of the backup layout and manifest; `coffer restore` refuses other versions.
pub const FORMAT_VERSION: u32 = 1;
/// The manifest's file name inside a backup.
pub const MANIFEST: &str = "manifest.json";
/// The database's file name inside a backup (and in `COFFER_HOME`).
pub const DB_FILE: &str = "coffer.db";
/// The credential key's file name inside a backup (and in `COFFER_HOME`).
pub const KEY_FILE: &str = "secret.key";
/// The markdown folders of `COFFER_HOME` a backup copies.
pub const FOLDERS: &[&str] = &["knowledge", "memory", "skills"];

/// `manifest.json`.
#[derive(Debug, Serialize)]
pub struct Manifest {
    pub format_version: u32,
    pub coffer_version: String,
    /// RFC 3339 UTC.
    pub created_at: String,
    /// The database's schema version (`PRAGMA user_version`: the number of migrations applied).
    pub schema_version: i64,
    /// Every file of the backup but the manifest, sorted by path.
    pub files: Vec<FileEntry>,
}

/// One file of a backup.
#[derive(Debug, Serialize)]
pub struct FileEntry {
    /// Relative to the backup directory, `/`-separated.
    pub path: String,
    pub bytes: u64,
    /// Lowercase hex.
    pub sha256: String,
}

/// What a finished backup holds.
#[derive(Debug)]
pub struct Outcome {
    /// The backup directory (absolute, canonical).
    pub dir: PathBuf,
    /// `manifest.json` exactly as written.
    pub manifest_json: String,
    pub secret_key_included: bool,
    /// Entries of the markdown folders that were not copied (symlinks, sockets, …), relative.
    pub skipped: Vec<String>,
}

/// Why a backup failed.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    /// The target path is unusable as given (relative, `..`, inside a copied folder).
    #[error("{0}")]
    Invalid(String),
    /// The target exists and is a file or a non-empty directory.
    #[error("{0}")]
    Exists(String),
    /// The target cannot be created or written (permissions, missing parent, full disk).
    #[error("{path}: {source}")]
    Target { path: PathBuf, source: std::io::Error },
    /// A file of the home could not be read.
    #[error("cannot read {path}: {source}")]
    Source { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Writes a backup of the home around `db` (its parent directory) into `target`.
///
/// `target` must be an absolute path without `..` naming a directory that does not exist yet
/// (it is created, parents included, 0700) or is empty (it is tightened to 0700); it may not lie
/// inside one of the copied folders. On failure, what was written is removed again.
///
/// # Errors
/// [`BackupError::Invalid`] or [`BackupError::Exists`] for an unusable target (nothing written);
/// [`BackupError::Target`], [`BackupError::Source`] or [`BackupError::Store`] when writing fails.
pub async fn backup(db: &Db, target: &str) -> Result<Outcome, BackupError> {
    let home = db.path().parent().map(Path::to_path_buf).unwrap_or_default();
    let target = check_target(target)?;
    let (dir, created) = {
        let (home, target) = (home.clone(), target.clone());
        blocking(move || prepare_target(&home, &target)).await?
    };
    let result = write_backup(db, &home, &dir).await;
    if result.is_err() {
        let dir = dir.clone();
        let _ = blocking(move || {
            remove_contents(&dir, created);
            Ok(())
        })
        .await;
    }
    result
}

async fn write_backup(db: &Db, home: &Path, dir: &Path) -> Result<Outcome, BackupError> {
    // The snapshot first: one read transaction on a read-only connection, so writers carry on.
    let db_copy = dir.join(DB_FILE);
    create_private(&db_copy)?;
    let into = db_copy.to_string_lossy().into_owned();
    let schema_version = db
        .read(move |c| {
            let v: i64 = c.pragma_query_value(None, "user_version", |r| r.get(0))?;
            c.execute("VACUUM INTO ?1", [into])?;
            Ok(v)
        })
        .await?;
    let (home, dir) = (home.to_path_buf(), dir.to_path_buf());
    blocking(move || {
        let mut files = vec![hash_file(&dir, DB_FILE)?];
        let mut skipped = Vec::new();
        for folder in FOLDERS {
            copy_tree(&home, &dir, Path::new(folder), &mut files, &mut skipped)?;
        }
        let key = home.join(KEY_FILE);
        let secret_key_included = match std::fs::symlink_metadata(&key) {
            Ok(m) if m.is_file() => {
                files.push(copy_file(&key, &dir, KEY_FILE)?);
                true
            }
            Ok(_) => {
                skipped.push(KEY_FILE.to_owned());
                false
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
            Err(source) => return Err(BackupError::Source { path: key, source }),
        };
        files.sort_by(|a, b| a.path.cmp(&b.path));
        let manifest = Manifest {
            format_version: FORMAT_VERSION,
            coffer_version: coffer_runtime::VERSION.to_owned(),
            created_at: coffer_runtime::now_rfc3339(),
            schema_version,
            files,
        };
        let manifest_json = serde_json::to_string_pretty(&manifest).expect("plain struct serializes") + "\n";
        let tmp = dir.join(format!(".{MANIFEST}.tmp"));
        write_private(&tmp, manifest_json.as_bytes())?;
        let target_err = |source| BackupError::Target { path: dir.join(MANIFEST), source };
        std::fs::rename(&tmp, dir.join(MANIFEST)).map_err(target_err)?;
        File::open(&dir).and_then(|d| d.sync_all()).map_err(target_err)?;
        Ok(Outcome { dir, manifest_json, secret_key_included, skipped })
    })
    .await
}

/// Runs blocking file work off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, BackupError> + Send + 'static,
) -> Result<T, BackupError> {
    tokio::task::spawn_blocking(f).await.map_err(|_| BackupError::Store(StoreError::WriterGone))?
}

/// Checks the shape of the target path (no file system access).
fn check_target(target: &str) -> Result<PathBuf, BackupError> {
    if target.trim().is_empty() {
        return Err(BackupError::Invalid("give the backup directory as an absolute path".into()));
    }
    if target.contains('\0') {
        return Err(BackupError::Invalid("the path contains a NUL byte".into()));
    }
    let p = PathBuf::from(target);
    if !p.is_absolute() {
        return Err(BackupError::Invalid(format!("{target:?} is not an absolute path")));
    }
    if p.components().any(|c| c == Component::ParentDir) {
        return Err(BackupError::Invalid(format!("{target:?} contains \"..\"; give the path without it")));
    }
    Ok(p)
}

/// Creates the target directory, or accepts an empty existing one; returns its canonical path
/// and whether it was created here.
fn prepare_target(home: &Path, target: &Path) -> Result<(PathBuf, bool), BackupError> {
    let shown = target.display();
    let created = match std::fs::symlink_metadata(target) {
        Ok(m) if m.is_dir() => {
            let mut entries =
                std::fs::read_dir(target).map_err(|source| BackupError::Target { path: target.into(), source })?;
            if entries.next().is_some() {
                return Err(BackupError::Exists(format!(
                    "{shown} is not empty; give a new or empty directory for the backup"
                )));
            }
            false
        }
        Ok(_) => return Err(BackupError::Exists(format!("{shown} exists and is not a directory"))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(target)
                .map_err(|source| BackupError::Target { path: target.into(), source })?;
            true
        }
        Err(source) => return Err(BackupError::Target { path: target.into(), source }),
    };
    let dir = std::fs::canonicalize(target).map_err(|source| BackupError::Target { path: target.into(), source })?;
    // A backup inside a folder it copies would copy itself.
    for folder in FOLDERS {
        let Ok(f) = std::fs::canonicalize(home.join(folder)) else { continue };
        if dir.starts_with(&f) {
            if created {
                let _ = std::fs::remove_dir(&dir);
            }
            return Err(BackupError::Invalid(format!(
                "{shown} is inside {}, which the backup copies; choose a directory outside it",
                f.display()
            )));
        }
    }
    // The backup may hold secret.key: owner only, also for a directory the user made.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
        .map_err(|source| BackupError::Target { path: dir.clone(), source })?;
    Ok((dir, created))
}

/// Creates an empty file with mode 0600 (`VACUUM INTO` accepts an empty file).
fn create_private(path: &Path) -> Result<File, BackupError> {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|source| BackupError::Target { path: path.into(), source })
}

fn write_private(path: &Path, bytes: &[u8]) -> Result<(), BackupError> {
    let mut f = create_private(path)?;
    f.write_all(bytes).and_then(|()| f.sync_all()).map_err(|source| BackupError::Target { path: path.into(), source })
}

/// The manifest entry of `dir/rel`, an already written file (its mode tightened to 0600).
fn hash_file(dir: &Path, rel: &str) -> Result<FileEntry, BackupError> {
    let path = dir.join(rel);
    let err = |source| BackupError::Target { path: path.clone(), source };
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).map_err(err)?;
    let mut f = File::open(&path).map_err(err)?;
    let (bytes, sha256) = coffer_runtime::digest::sha256_copy(&mut f, None).map_err(err)?;
    Ok(FileEntry { path: rel.to_owned(), bytes, sha256 })
}

/// Copies `src` to `dir/rel` (0600, fsynced), hashing the bytes as they are written, so the
/// manifest describes the copy even if the source changes meanwhile.
fn copy_file(src: &Path, dir: &Path, rel: &str) -> Result<FileEntry, BackupError> {
    let dst = dir.join(rel);
    let mut input = File::open(src).map_err(|source| BackupError::Source { path: src.into(), source })?;
    let mut out = create_private(&dst)?;
    let (bytes, sha256) = coffer_runtime::digest::sha256_copy(&mut input, Some(&mut out))
        .map_err(|source| BackupError::Source { path: src.into(), source })?;
    out.sync_all().map_err(|source| BackupError::Target { path: dst, source })?;
    Ok(FileEntry { path: rel.to_owned(), bytes, sha256 })
}

/// Copies the folder `home/rel` into `dir/rel` recursively (directories 0700, files 0600),
/// in name order. A missing folder copies nothing; symlinks and special files are skipped.
fn copy_tree(
    home: &Path,
    dir: &Path,
    rel: &Path,
    files: &mut Vec<FileEntry>,
    skipped: &mut Vec<String>,
) -> Result<(), BackupError> {
    let src = home.join(rel);
    let mut entries: Vec<std::fs::DirEntry> = match std::fs::read_dir(&src) {
        Ok(rd) => rd.collect::<Result<_, _>>().map_err(|source| BackupError::Source { path: src.clone(), source })?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => return Err(BackupError::Source { path: src, source }),
    };
    entries.sort_by_key(std::fs::DirEntry::file_name);
    let dst = dir.join(rel);
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dst)
        .map_err(|source| BackupError::Target { path: dst.clone(), source })?;
    for e in entries {
        let child = rel.join(e.file_name());
        let shown = child.to_string_lossy().into_owned();
        let Some(name) = child.to_str() else {
            // Manifest paths are JSON strings; a name that is not UTF-8 cannot be listed.
            skipped.push(shown);
            continue;
        };
        let kind = e.file_type().map_err(|source| BackupError::Source { path: e.path(), source })?;
        if kind.is_dir() {
            copy_tree(home, dir, &child, files, skipped)?;
        } else if kind.is_file() {
            files.push(copy_file(&e.path(), dir, name)?);
        } else {
            skipped.push(shown);
        }
    }
    Ok(())
}

/// Removes what a failed backup wrote: the directory itself when it was created here, else
/// only its contents (it was empty before).
fn remove_contents(dir: &Path, created: bool) {
    if created {
        let _ = std::fs::remove_dir_all(dir);
        return;
    }
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            let _ = if p.is_dir() { std::fs::remove_dir_all(&p) } else { std::fs::remove_file(&p) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn home() -> (tempfile::TempDir, Db) {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("home");
        for f in FOLDERS {
            std::fs::create_dir_all(root.join(f)).unwrap();
        }
        let db = Db::open(&root.join(DB_FILE)).unwrap();
        (dir, db)
    }

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().mode() & 0o777
    }

    fn sha(bytes: &[u8]) -> String {
        coffer_runtime::digest::sha256_copy(&mut &bytes[..], None).expect("in-memory read").1
    }

    #[tokio::test]
    async fn writes_snapshot_copies_and_manifest_privately() {
        let (tmp, db) = home();
        let root = tmp.path().join("home");
        db.write(|t, ch| {
            t.execute("INSERT INTO settings (key, value, updated_at) VALUES ('k', 'v', 'now')", [])?;
            ch.push(coffer_proto::store::ChangeEntity::Setting, "k", coffer_proto::store::ChangeOp::Set);
            Ok(())
        })
        .await
        .unwrap();
        std::fs::create_dir_all(root.join("knowledge/kb1")).unwrap();
        std::fs::write(root.join("knowledge/kb1/a.md"), "# A\n").unwrap();
        std::fs::write(root.join("memory/facts.md"), "fact\n").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", root.join("skills/link.md")).unwrap();
        std::fs::write(root.join(KEY_FILE), [7u8; 32]).unwrap();

        let target = tmp.path().join("backups/one");
        let out = backup(&db, target.to_str().unwrap()).await.unwrap();
        assert_eq!(out.dir, std::fs::canonicalize(&target).unwrap());
        assert!(out.secret_key_included);
        assert_eq!(out.skipped, ["skills/link.md"]);

        let m: serde_json::Value = serde_json::from_str(&out.manifest_json).unwrap();
        assert_eq!(m["format_version"], FORMAT_VERSION);
        assert_eq!(m["coffer_version"], coffer_runtime::VERSION);
        let live: i64 = db.read(|c| Ok(c.pragma_query_value(None, "user_version", |r| r.get(0))?)).await.unwrap();
        assert!(live >= 1);
        assert_eq!(m["schema_version"], live);
        let paths: Vec<&str> = m["files"].as_array().unwrap().iter().map(|f| f["path"].as_str().unwrap()).collect();
        assert_eq!(paths, ["coffer.db", "knowledge/kb1/a.md", "memory/facts.md", "secret.key"]);
        for f in m["files"].as_array().unwrap() {
            let p = out.dir.join(f["path"].as_str().unwrap());
            let bytes = std::fs::read(&p).unwrap();
            assert_eq!(f["bytes"], bytes.len() as u64);
            assert_eq!(f["sha256"], sha(&bytes));
            assert_eq!(mode(&p), 0o600, "{}", p.display());
        }
        assert_eq!(std::fs::read_to_string(out.dir.join(MANIFEST)).unwrap(), out.manifest_json);
        assert_eq!(mode(&out.dir.join(MANIFEST)), 0o600);
        for d in [&out.dir, &out.dir.join("knowledge"), &out.dir.join("knowledge/kb1"), &out.dir.join("skills")] {
            assert_eq!(mode(d), 0o700, "{}", d.display());
        }
        // The snapshot is a self-contained database holding the data.
        // coffer-store owns coffer.db: the test reads the snapshot it wrote.
        #[allow(clippy::disallowed_methods)]
        let c = rusqlite::Connection::open(out.dir.join(DB_FILE)).unwrap();
        let v: String = c.query_row("SELECT value FROM settings WHERE key = 'k'", [], |r| r.get(0)).unwrap();
        assert_eq!(v, "v");
        let journal: String = c.pragma_query_value(None, "journal_mode", |r| r.get(0)).unwrap();
        assert_eq!(journal, "delete");
        assert!(!out.dir.join("coffer.db-wal").exists());
    }

    #[tokio::test]
    async fn refuses_unusable_targets_and_writes_nothing() {
        let (tmp, db) = home();
        let root = tmp.path().join("home");
        let s = |p: &Path| p.to_str().unwrap().to_owned();

        let e = backup(&db, "relative/dir").await.unwrap_err();
        assert!(matches!(e, BackupError::Invalid(_)), "{e}");
        let e = backup(&db, &format!("{}/../x", s(tmp.path()))).await.unwrap_err();
        assert!(matches!(e, BackupError::Invalid(_)), "{e}");
        let e = backup(&db, &s(&root.join("memory/bk"))).await.unwrap_err();
        assert!(e.to_string().contains("inside"), "{e}");
        assert!(!root.join("memory/bk").exists());

        let full = tmp.path().join("full");
        std::fs::create_dir(&full).unwrap();
        std::fs::write(full.join("x"), "x").unwrap();
        let e = backup(&db, &s(&full)).await.unwrap_err();
        assert!(matches!(e, BackupError::Exists(_)) && e.to_string().contains("not empty"), "{e}");
        let e = backup(&db, &s(&full.join("x"))).await.unwrap_err();
        assert!(matches!(e, BackupError::Exists(_)), "{e}");

        // An empty existing directory is fine, and is tightened to 0700; no secret.key, no entry.
        let empty = tmp.path().join("empty");
        std::fs::DirBuilder::new().mode(0o755).create(&empty).unwrap();
        let out = backup(&db, &s(&empty)).await.unwrap();
        assert!(!out.secret_key_included);
        assert!(!out.manifest_json.contains(KEY_FILE));
        assert_eq!(mode(&empty), 0o700);
    }

    #[tokio::test]
    async fn a_backup_that_fails_at_the_snapshot_removes_its_directory() {
        let (tmp, db) = home();
        // No reader connection is open yet; without the file none can be.
        for f in ["coffer.db", "coffer.db-wal", "coffer.db-shm"] {
            let _ = std::fs::remove_file(tmp.path().join("home").join(f));
        }
        let target = tmp.path().join("bk");
        let e = backup(&db, target.to_str().unwrap()).await.unwrap_err();
        assert!(matches!(e, BackupError::Store(_)), "{e}");
        assert!(!target.exists());
    }

    #[tokio::test]
    async fn a_failed_backup_removes_what_it_wrote() {
        let (tmp, db) = home();
        let root = tmp.path().join("home");
        std::fs::write(root.join("knowledge/a.md"), "a").unwrap();
        // An unreadable file makes the copy fail midway (root reads anything: the test above
        // covers cleanup then).
        let locked = root.join("memory/locked.md");
        std::fs::write(&locked, "x").unwrap();
        std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o000)).unwrap();
        if File::open(&locked).is_ok() {
            return;
        }
        let target = tmp.path().join("bk");
        let e = backup(&db, target.to_str().unwrap()).await.unwrap_err();
        assert!(matches!(e, BackupError::Source { .. }) && e.to_string().contains("locked.md"), "{e}");
        assert!(!target.exists());
    }
}
