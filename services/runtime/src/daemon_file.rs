//! `daemon.json` and `daemon.lock`: how entry points find a running daemon.
//!
//! The supervisor holds an exclusive `flock` on `daemon.lock` for its whole life; that lock, not
//! the pid (pids are recycled), is the liveness test for a `daemon.json`. Only the lock holder
//! creates `daemon.json`, exclusively and atomically: a 0600 temp file is written in full, then
//! `link()`ed into place, so readers never see a half-written file.
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::fcntl::{Flock, FlockArg};
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};

/// Contents of `daemon.json`.
#[derive(Debug, Clone)]
pub struct DaemonInfo {
    pub pid: u32,
    pub port: u16,
    pub token: SecretString,
    /// RFC 3339 UTC.
    pub started_at: String,
    pub version: String,
    /// The edge's Unix-domain socket (absolute), when the daemon bound one: the same HTTP edge
    /// as `port`. A value that is not an absolute path is read as none.
    pub socket: Option<PathBuf>,
}

#[derive(Serialize, Deserialize)]
struct Wire {
    pid: u32,
    port: u16,
    token: String,
    started_at: String,
    version: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    socket: Option<String>,
}

/// Error reading or writing `daemon.json` / `daemon.lock`.
#[derive(Debug, thiserror::Error)]
pub enum DaemonFileError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path} is not valid daemon.json: {reason}")]
    Invalid { path: PathBuf, reason: String },
    #[error("{path} already exists")]
    Exists { path: PathBuf },
    #[error("another coffer-daemon holds {path}")]
    Locked { path: PathBuf },
}

impl DaemonInfo {
    /// Reads and validates `daemon.json`.
    ///
    /// # Errors
    /// [`DaemonFileError::Io`] when missing/unreadable, [`DaemonFileError::Invalid`] when corrupt,
    /// truncated or incomplete.
    pub fn read(path: &Path) -> Result<Self, DaemonFileError> {
        let bytes = std::fs::read(path).map_err(|source| DaemonFileError::Io { path: path.into(), source })?;
        if bytes.len() > 64 * 1024 {
            return Err(DaemonFileError::Invalid { path: path.into(), reason: "larger than 64 KiB".into() });
        }
        let w: Wire = serde_json::from_slice(&bytes)
            .map_err(|e| DaemonFileError::Invalid { path: path.into(), reason: e.to_string() })?;
        if w.pid == 0 || w.port == 0 || w.token.len() < 32 {
            return Err(DaemonFileError::Invalid { path: path.into(), reason: "pid, port or token missing".into() });
        }
        Ok(Self {
            pid: w.pid,
            port: w.port,
            token: SecretString::from(w.token),
            started_at: w.started_at,
            version: w.version,
            socket: w.socket.map(PathBuf::from).filter(|p| p.is_absolute()),
        })
    }

    /// Creates `path` exclusively: writes a 0600 temp file beside it, fsyncs, then hard-links it
    /// into place (fails if `path` exists) and removes the temp name.
    ///
    /// # Errors
    /// [`DaemonFileError::Exists`] when `path` exists; [`DaemonFileError::Io`] otherwise.
    pub fn create_exclusive(&self, path: &Path) -> Result<(), DaemonFileError> {
        let io = |source| DaemonFileError::Io { path: path.into(), source };
        let tmp = path.with_extension(format!("json.tmp-{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        let wire = Wire {
            pid: self.pid,
            port: self.port,
            token: self.token.expose_secret().to_owned(),
            started_at: self.started_at.clone(),
            version: self.version.clone(),
            socket: self.socket.as_ref().map(|p| p.display().to_string()),
        };
        let body = serde_json::to_vec_pretty(&wire).expect("plain struct serializes");
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp).map_err(io)?;
        f.write_all(&body).and_then(|_| f.sync_all()).map_err(io)?;
        drop(f);
        let linked = std::fs::hard_link(&tmp, path);
        let _ = std::fs::remove_file(&tmp);
        match linked {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                Err(DaemonFileError::Exists { path: path.into() })
            }
            Err(e) => Err(io(e)),
        }
    }
}

/// The supervisor's exclusive lock on `daemon.lock`, held until dropped.
pub struct DaemonLock {
    _lock: Flock<File>,
}

impl DaemonLock {
    /// Takes the exclusive lock, retrying for up to `patience` while another process holds it
    /// (entry points probe the lock with a brief shared lock).
    ///
    /// # Errors
    /// [`DaemonFileError::Locked`] when a live daemon holds it; [`DaemonFileError::Io`] when the
    /// file cannot be opened.
    pub fn acquire(path: &Path, patience: Duration) -> Result<Self, DaemonFileError> {
        let deadline = Instant::now() + patience;
        loop {
            let file = open_lock_file(path)?;
            match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                Ok(lock) => return Ok(Self { _lock: lock }),
                Err((_, nix::errno::Errno::EWOULDBLOCK)) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(25));
                }
                Err((_, nix::errno::Errno::EWOULDBLOCK)) => return Err(DaemonFileError::Locked { path: path.into() }),
                Err((_, e)) => return Err(DaemonFileError::Io { path: path.into(), source: e.into() }),
            }
        }
    }
}

fn open_lock_file(path: &Path) -> Result<File, DaemonFileError> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)
        .map_err(|source| DaemonFileError::Io { path: path.into(), source })
}

/// True when some process holds `daemon.lock` (a live daemon). Probes with a non-blocking shared
/// lock that is released at once.
pub fn lock_is_held(path: &Path) -> bool {
    let Ok(file) = std::fs::OpenOptions::new().read(true).open(path) else { return false };
    match Flock::lock(file, FlockArg::LockSharedNonblock) {
        Ok(lock) => {
            drop(lock);
            false
        }
        Err(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn info() -> DaemonInfo {
        DaemonInfo {
            pid: 42,
            port: 8000,
            token: SecretString::from("ab".repeat(32)),
            started_at: "2026-11-30T00:00:00.000Z".into(),
            version: "0.1.0".into(),
            socket: Some("/home/u/.coffer/gateway.sock".into()),
        }
    }

    #[test]
    fn create_is_exclusive_and_private() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("daemon.json");
        info().create_exclusive(&p).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o600);
        assert!(matches!(info().create_exclusive(&p), Err(DaemonFileError::Exists { .. })));
        let back = DaemonInfo::read(&p).unwrap();
        assert_eq!(back.port, 8000);
        assert_eq!(back.socket.as_deref(), Some(Path::new("/home/u/.coffer/gateway.sock")));
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "no temp file left");
    }

    #[test]
    fn corrupt_and_truncated_are_invalid() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("daemon.json");
        for body in [
            &b"{\"pid\": 4"[..],
            b"",
            b"null",
            b"{\"pid\":1,\"port\":0,\"token\":\"x\",\"started_at\":\"\",\"version\":\"\"}",
        ] {
            std::fs::write(&p, body).unwrap();
            assert!(matches!(DaemonInfo::read(&p), Err(DaemonFileError::Invalid { .. })), "{body:?}");
        }
    }

    #[test]
    fn the_socket_is_optional_and_only_taken_when_absolute() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("daemon.json");
        let base = format!(r#""pid":7,"port":8001,"token":"{}","started_at":"","version":"x""#, "ab".repeat(32));
        for (extra, want) in [
            ("", None),
            (r#","socket":null"#, None),
            (r#","socket":"gateway.sock""#, None),
            (r#","socket":"""#, None),
            (r#","socket":"/run/x/gateway.sock""#, Some("/run/x/gateway.sock")),
        ] {
            std::fs::write(&p, format!("{{{base}{extra}}}")).unwrap();
            let info = DaemonInfo::read(&p).unwrap_or_else(|e| panic!("{extra}: {e}"));
            assert_eq!(info.socket.as_deref(), want.map(Path::new), "{extra}");
        }
        std::fs::write(&p, format!(r#"{{{base},"socket":5}}"#)).unwrap();
        assert!(matches!(DaemonInfo::read(&p), Err(DaemonFileError::Invalid { .. })), "a socket that is not a string");
        // Written without one, the file has no socket member at all (older readers see nothing new).
        let q = dir.path().join("b.json");
        DaemonInfo { socket: None, ..info() }.create_exclusive(&q).unwrap();
        assert!(!std::fs::read_to_string(&q).unwrap().contains("socket"));
    }

    #[test]
    fn lock_excludes_and_probe_sees_it() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("daemon.lock");
        assert!(!lock_is_held(&p));
        let l = DaemonLock::acquire(&p, Duration::ZERO).unwrap();
        assert!(lock_is_held(&p));
        assert!(matches!(DaemonLock::acquire(&p, Duration::from_millis(50)), Err(DaemonFileError::Locked { .. })));
        drop(l);
        assert!(!lock_is_held(&p));
    }
}
