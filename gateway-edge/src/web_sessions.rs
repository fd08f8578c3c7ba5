//! Web-console sessions (the `coffer_session` cookie), kept in memory and persisted to
//! `COFFER_HOME/web-sessions.json` so that a gateway or daemon restart signs no browser out.
//!
//! What is on disk: for each session only the SHA-256 of its id (never the id, which is the
//! cookie value), when it was created and when it was last used (Unix milliseconds):
//!
//! ```json
//! {"version": 1, "sessions": [{"sha256": "<64 hex>", "created_ms": 1764460800123, "last_used_ms": 1764460900456}]}
//! ```
//!
//! A presented cookie is looked up by hashing it: the map is keyed by digests, so a lookup's
//! timing says nothing useful about any id, and a copy of the file authenticates nobody.
//!
//! - **Idle expiry**: a session unused for [`IDLE_EXPIRY`] (30 days, the cookie's `Max-Age`) is
//!   gone; expired entries are dropped when met, at load and when a session is created.
//! - **Writes**: the file is replaced atomically (a temp file created exclusively with mode 0600
//!   in the same folder, fsync, rename, fsync of the folder), so a reader or a crash never sees
//!   half a file. Creating and revoking sessions write before they answer (a revocation must
//!   hold across a crash); last-used times are written in the background, at most once per
//!   [`TOUCH_PERSIST`] per session, so requests do not each cost a disk write. Writes are
//!   serialised and each one writes the newest state, so an older state never lands last.
//! - **Damage**: a file that cannot be read or parsed (or is over [`MAX_FILE_BYTES`], or of
//!   another version) is logged, treated as empty and replaced; it never stops the gateway.
//!
//! - **Revocation ends open streams**: every live session shares one revocation token
//!   ([`CancellationToken`]); [`WebSessions::revoke_all`] cancels it (and starts a fresh one for
//!   later sessions), so a response already streaming to a revoked cookie can end at once
//!   (the edge's `auth` middleware wraps such bodies; see [`WebSessions::check_live`]).
//!
//! Only the gateway process reads or writes this file. It is not SQLite, so the rule that
//! only `coffer-store` opens `coffer.db` is untouched; sessions stay out of the database on
//! purpose: checking a cookie must not cost a store round trip on every page request.
use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use secrecy::ExposeSecret;
use serde::{Deserialize, Serialize};
use sha2::Digest as _;
use tokio_util::sync::CancellationToken;

/// The file's name under `COFFER_HOME`.
pub const FILE_NAME: &str = "web-sessions.json";
/// A session unused this long has expired; also the cookie's `Max-Age`.
pub const IDLE_EXPIRY: Duration = Duration::from_secs(30 * 24 * 3600);
/// How stale a persisted last-used time may get before a request writes it again.
pub const TOUCH_PERSIST: Duration = Duration::from_secs(600);
/// Most sessions kept; creating one more drops the least recently used.
pub const MAX_SESSIONS: usize = 1000;
/// Largest file read at start (bytes); [`MAX_SESSIONS`] entries take about 150 KB.
pub const MAX_FILE_BYTES: u64 = 4 * 1024 * 1024;
/// The file format's version.
const VERSION: u32 = 1;

/// A failed write of the sessions file.
#[derive(Debug, thiserror::Error)]
pub enum SessionsError {
    #[error("cannot write {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
}

type Digest = [u8; 32];

#[derive(Debug, Clone, Copy)]
struct Entry {
    created_ms: i64,
    last_used_ms: i64,
    /// The last-used time the file holds (or will hold once the queued write lands).
    persisted_last_used_ms: i64,
    /// Order of creation in this process (breaks ties between equal times when evicting).
    serial: u64,
}

#[derive(Default)]
struct State {
    map: HashMap<Digest, Entry>,
    /// Bumped by every change worth writing.
    generation: u64,
    /// The next [`Entry::serial`].
    serial: u64,
    /// Cancelled when the sessions live now are revoked; replaced by a fresh one then.
    revoked: CancellationToken,
}

struct Inner {
    /// `None`: memory only (tests).
    path: Option<PathBuf>,
    state: Mutex<State>,
    /// Held while writing; holds the generation last written.
    writer: tokio::sync::Mutex<u64>,
}

/// The web sessions; cheap to clone (one shared set).
#[derive(Clone)]
pub struct WebSessions(Arc<Inner>);

impl Default for WebSessions {
    fn default() -> Self {
        Self::in_memory()
    }
}

#[derive(Serialize, Deserialize)]
struct FileBody {
    version: u32,
    sessions: Vec<Row>,
}

#[derive(Serialize, Deserialize)]
struct Row {
    sha256: String,
    created_ms: i64,
    last_used_ms: i64,
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

fn idle_ms() -> i64 {
    IDLE_EXPIRY.as_millis() as i64
}

/// The digest a session is kept under, when `id` has the form of one (64 hex characters).
fn digest_of(id: &str) -> Option<Digest> {
    (id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit())).then(|| sha2::Sha256::digest(id.as_bytes()).into())
}

impl WebSessions {
    /// Sessions kept in memory only (nothing is read or written).
    pub fn in_memory() -> Self {
        Self(Arc::new(Inner { path: None, state: Mutex::default(), writer: tokio::sync::Mutex::new(0) }))
    }

    /// Loads the sessions persisted at `path` (blocking: call it at start). A missing file is
    /// no session; an unreadable, oversized or malformed one is logged, treated as empty and
    /// replaced at once (as is one whose permissions are wider than 0600).
    pub fn load(path: PathBuf) -> Self {
        let now = now_ms();
        let (map, rewrite) = match read_file(&path) {
            Ok(None) => (HashMap::new(), false),
            Ok(Some((rows, wide_mode))) => {
                let total = rows.len();
                let mut map = HashMap::new();
                let mut bad = 0;
                for r in rows {
                    let digest = hex::decode(&r.sha256).ok().and_then(|d| Digest::try_from(d).ok());
                    match digest {
                        Some(d) => {
                            if now - r.last_used_ms <= idle_ms() {
                                let e = Entry {
                                    created_ms: r.created_ms,
                                    last_used_ms: r.last_used_ms,
                                    persisted_last_used_ms: r.last_used_ms,
                                    serial: 0,
                                };
                                map.insert(d, e);
                            }
                        }
                        None => bad += 1,
                    }
                }
                if bad > 0 {
                    tracing::warn!(path = %path.display(), skipped = bad, "Web sessions file has malformed entries; skipped them.");
                }
                if wide_mode {
                    tracing::warn!(path = %path.display(), "Web sessions file was readable by others; rewriting it with mode 0600.");
                }
                let rewrite = wide_mode || bad > 0 || map.len() != total;
                (map, rewrite)
            }
            Err(why) => {
                tracing::warn!(path = %path.display(), problem = %why, "Web sessions file unusable; starting with no web session and replacing it.");
                (HashMap::new(), true)
            }
        };
        let n = map.len();
        let sessions = Self(Arc::new(Inner {
            path: Some(path),
            state: Mutex::new(State { map, generation: 0, serial: 1, revoked: CancellationToken::new() }),
            writer: tokio::sync::Mutex::new(0),
        }));
        if rewrite {
            let (path, bytes) = (sessions.0.path.clone().expect("set"), sessions.serialize().1);
            if let Err(e) = write_atomic(&path, &bytes) {
                tracing::warn!(error = %e, "Cannot replace the web sessions file.");
            }
        }
        tracing::debug!(sessions = n, "Web sessions loaded.");
        sessions
    }

    /// Live sessions.
    pub fn len(&self) -> usize {
        self.0.state.lock().expect("web sessions").map.len()
    }

    /// True when there is no live session.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True when `id` (a cookie value) is a live session; marks it used now. An expired one is
    /// dropped. Never blocks on the disk: a write it makes necessary runs in the background.
    pub fn check(&self, id: &str) -> bool {
        self.check_at(id, now_ms())
    }

    /// [`check`](Self::check), and for a live session the token cancelled when it is revoked:
    /// a response streaming to this session ends when the token does. The token is taken under
    /// the same lock as the check, so a revocation racing the request is never missed.
    pub fn check_live(&self, id: &str) -> Option<CancellationToken> {
        self.check_live_at(id, now_ms())
    }

    fn check_at(&self, id: &str, now: i64) -> bool {
        self.check_live_at(id, now).is_some()
    }

    fn check_live_at(&self, id: &str, now: i64) -> Option<CancellationToken> {
        let d = digest_of(id)?;
        let (live, write) = {
            let mut s = self.0.state.lock().expect("web sessions");
            match s.map.get_mut(&d) {
                None => (None, false),
                Some(e) if now - e.last_used_ms > idle_ms() => {
                    s.map.remove(&d);
                    s.generation += 1;
                    (None, true)
                }
                Some(e) => {
                    e.last_used_ms = e.last_used_ms.max(now);
                    let stale = e.last_used_ms - e.persisted_last_used_ms > TOUCH_PERSIST.as_millis() as i64;
                    if stale {
                        e.persisted_last_used_ms = e.last_used_ms;
                        s.generation += 1;
                    }
                    (Some(s.revoked.clone()), stale)
                }
            }
        };
        if write {
            self.persist_in_background();
        }
        live
    }

    /// Starts a session and writes it to disk before returning its id (the cookie value: 64
    /// hex characters). A failed write is logged: the session then lasts until this process
    /// ends.
    pub async fn create(&self) -> String {
        let id = coffer_runtime::token::random_token().expose_secret().to_owned();
        let d = digest_of(&id).expect("a random token is 64 hex characters");
        let now = now_ms();
        {
            let mut s = self.0.state.lock().expect("web sessions");
            s.map.retain(|_, e| now - e.last_used_ms <= idle_ms());
            while s.map.len() >= MAX_SESSIONS {
                let oldest = s.map.iter().min_by_key(|(_, e)| (e.last_used_ms, e.serial)).map(|(k, _)| *k);
                let Some(oldest) = oldest else { break };
                s.map.remove(&oldest);
            }
            s.serial += 1;
            let serial = s.serial;
            s.map.insert(d, Entry { created_ms: now, last_used_ms: now, persisted_last_used_ms: now, serial });
            s.generation += 1;
        }
        if let Err(e) = self.persist().await {
            tracing::warn!(error = %e, "Web session not persisted; it ends when the gateway does.");
        }
        id
    }

    /// Ends every session, in memory and on disk, before it returns how many there were; the
    /// responses still streaming to them end too (their revocation token is cancelled at once).
    ///
    /// # Errors
    /// [`SessionsError::Write`] when the file can be neither rewritten nor removed (the sessions
    /// would come back at the next start); they are gone from memory regardless.
    pub async fn revoke_all(&self) -> Result<usize, SessionsError> {
        let n = {
            let mut s = self.0.state.lock().expect("web sessions");
            let n = s.map.len();
            s.map.clear();
            s.generation += 1;
            std::mem::take(&mut s.revoked).cancel();
            n
        };
        if let Err(e) = self.persist().await {
            // Removing the file revokes as surely as rewriting it.
            let path = self.0.path.clone().expect("only a file can fail");
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(r) if r.kind() == std::io::ErrorKind::NotFound => {}
                Err(_) => return Err(e),
            }
        }
        Ok(n)
    }

    /// The file body of the current state, and its generation.
    fn serialize(&self) -> (u64, Vec<u8>) {
        let s = self.0.state.lock().expect("web sessions");
        let mut sessions: Vec<Row> = s
            .map
            .iter()
            .map(|(d, e)| Row { sha256: hex::encode(d), created_ms: e.created_ms, last_used_ms: e.last_used_ms })
            .collect();
        sessions.sort_by(|a, b| a.created_ms.cmp(&b.created_ms).then_with(|| a.sha256.cmp(&b.sha256)));
        let body = FileBody { version: VERSION, sessions };
        (s.generation, serde_json::to_vec(&body).expect("plain data serializes"))
    }

    /// Writes the current state unless a write already holds it.
    async fn persist(&self) -> Result<(), SessionsError> {
        let Some(path) = self.0.path.clone() else { return Ok(()) };
        let mut written = self.0.writer.lock().await;
        let (generation, bytes) = self.serialize();
        if generation <= *written {
            return Ok(());
        }
        let target = path.clone();
        let r = tokio::task::spawn_blocking(move || write_atomic(&target, &bytes))
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e.to_string())));
        r.map_err(|source| SessionsError::Write { path, source })?;
        *written = generation;
        Ok(())
    }

    fn persist_in_background(&self) {
        if self.0.path.is_none() {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else { return };
        let me = self.clone();
        rt.spawn(async move {
            if let Err(e) = me.persist().await {
                tracing::warn!(error = %e, "Web sessions not persisted.");
            }
        });
    }
}

/// The rows of the file at `path` (`None`: no file) and whether its mode is wider than 0600.
fn read_file(path: &Path) -> Result<Option<(Vec<Row>, bool)>, String> {
    use std::io::Read as _;
    use std::os::unix::fs::PermissionsExt as _;
    let f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot open it: {e}")),
    };
    let meta = f.metadata().map_err(|e| format!("cannot read it: {e}"))?;
    if !meta.is_file() {
        return Err("it is not a regular file".into());
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err(format!("it has {} bytes, more than the {MAX_FILE_BYTES} expected at most", meta.len()));
    }
    let mut bytes = Vec::new();
    f.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes).map_err(|e| format!("cannot read it: {e}"))?;
    let body: FileBody = serde_json::from_slice(&bytes).map_err(|e| format!("not the expected JSON: {e}"))?;
    if body.version != VERSION {
        return Err(format!("version {} is not {VERSION}", body.version));
    }
    Ok(Some((body.sessions, meta.permissions().mode() & 0o077 != 0)))
}

/// Replaces `path` with `bytes` atomically: an exclusive 0600 temp file in the same folder,
/// fsync, rename over `path`, fsync of the folder. The temp file is removed on failure.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let dir = path.parent().ok_or_else(|| std::io::Error::other("no parent folder"))?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}.{}.{}.tmp", std::process::id(), uuid::Uuid::new_v4().simple()));
    let written = (|| {
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
        return written;
    }
    // The rename itself is durable once the folder is synced; failing that is not worth an error.
    let _ = std::fs::File::open(dir).and_then(|d| d.sync_all());
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    fn home() -> tempfile::TempDir {
        tempfile::tempdir().unwrap()
    }

    fn file_text(path: &Path) -> String {
        std::fs::read_to_string(path).unwrap()
    }

    #[tokio::test]
    async fn sessions_persist_as_digests_with_mode_0600_and_survive_a_reload() {
        let dir = home();
        let path = dir.path().join(FILE_NAME);
        let s = WebSessions::load(path.clone());
        assert!(s.is_empty());
        assert!(!path.exists(), "nothing written before a session exists");
        let id = s.create().await;
        assert_eq!(id.len(), 64);
        assert!(s.check(&id));
        let text = file_text(&path);
        assert!(!text.contains(&id), "the id itself is never on disk: {text}");
        assert!(text.contains(&hex::encode(sha2::Sha256::digest(id.as_bytes()))), "{text}");
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        // No temp file is left behind.
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, [std::ffi::OsString::from(FILE_NAME)]);

        let again = WebSessions::load(path.clone());
        assert_eq!(again.len(), 1);
        assert!(again.check(&id));
        assert!(!again.check(&"0".repeat(64)));
        assert!(!again.check(&id[..63]));
        assert!(!again.check(&format!("{}g", &id[..63])));
        assert!(!again.check(""));
    }

    #[tokio::test]
    async fn revoking_empties_memory_and_disk() {
        let dir = home();
        let path = dir.path().join(FILE_NAME);
        let s = WebSessions::load(path.clone());
        let (a, b) = (s.create().await, s.create().await);
        assert_eq!(s.revoke_all().await.unwrap(), 2);
        assert!(!s.check(&a) && !s.check(&b));
        assert_eq!(WebSessions::load(path.clone()).len(), 0);
        assert_eq!(s.revoke_all().await.unwrap(), 0);
    }

    #[tokio::test]
    async fn idle_sessions_expire_and_use_keeps_them_alive() {
        let dir = home();
        let path = dir.path().join(FILE_NAME);
        let s = WebSessions::load(path.clone());
        let id = s.create().await;
        let now = now_ms();
        let day = 86_400_000;
        // Used 29 days on: alive, and the new last-used time is written.
        assert!(s.check_at(&id, now + 29 * day));
        // The write runs in the background; a persist now writes it, or finds it written.
        s.persist().await.unwrap();
        assert!(file_text(&path).contains(&format!("\"last_used_ms\":{}", now + 29 * day)), "{}", file_text(&path));
        // Exactly 30 days after that use: still alive (and used again).
        assert!(s.check_at(&id, now + 59 * day));
        // 30 days and a minute after the last use: expired, and gone.
        assert!(!s.check_at(&id, now + 89 * day + 60_000));
        assert!(s.is_empty());

        // A file holding an expired session loads without it (and is rewritten).
        let body = serde_json::json!({"version": 1, "sessions": [
            {"sha256": hex::encode([7u8; 32]), "created_ms": 0, "last_used_ms": 0},
            {"sha256": hex::encode([8u8; 32]), "created_ms": now, "last_used_ms": now},
        ]});
        std::fs::write(&path, body.to_string()).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let s = WebSessions::load(path.clone());
        assert_eq!(s.len(), 1);
        assert!(!file_text(&path).contains(&hex::encode([7u8; 32])));
    }

    #[tokio::test]
    async fn a_damaged_file_is_treated_as_empty_and_replaced() {
        let dir = home();
        let path = dir.path().join(FILE_NAME);
        let bad_row = serde_json::json!({"version": 1, "sessions": [{"sha256": "zz", "created_ms": 0, "last_used_ms": now_ms()}]});
        for damage in [
            b"{not json".to_vec(),
            Vec::new(),
            b"{\"version\": 9, \"sessions\": []}".to_vec(),
            b"[1,2,3]".to_vec(),
            vec![0xff, 0xfe, 0x00],
            bad_row.to_string().into_bytes(),
        ] {
            std::fs::write(&path, &damage).unwrap();
            let s = WebSessions::load(path.clone());
            assert!(s.is_empty());
            let text = file_text(&path);
            let v: serde_json::Value = serde_json::from_str(&text).unwrap();
            assert_eq!(v, serde_json::json!({"version": 1, "sessions": []}), "replaced after {damage:?}");
            let id = s.create().await;
            assert!(WebSessions::load(path.clone()).check(&id));
        }
        // Oversized: refused without reading it all.
        let f = std::fs::File::create(&path).unwrap();
        f.set_len(MAX_FILE_BYTES + 1).unwrap();
        assert!(WebSessions::load(path.clone()).is_empty());
        assert!(std::fs::metadata(&path).unwrap().len() < 100);
        // A folder in its place: logged, the sessions live in memory.
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        let s = WebSessions::load(path.clone());
        let id = s.create().await;
        assert!(s.check(&id));
        // Neither rewrite nor removal works: revoking says so, and memory is empty anyway.
        std::fs::write(path.join("x"), "keep").unwrap();
        assert!(matches!(s.revoke_all().await, Err(SessionsError::Write { .. })));
        assert!(!s.check(&id));
    }

    #[tokio::test]
    async fn revoking_cancels_the_token_of_every_live_session_and_only_theirs() {
        let s = WebSessions::in_memory();
        let (a, b) = (s.create().await, s.create().await);
        let (ta, tb) = (s.check_live(&a).unwrap(), s.check_live(&b).unwrap());
        assert!(s.check_live(&"0".repeat(64)).is_none());
        assert!(!ta.is_cancelled() && !tb.is_cancelled());
        s.revoke_all().await.unwrap();
        assert!(ta.is_cancelled() && tb.is_cancelled());
        assert!(s.check_live(&a).is_none());
        // A session made after the revocation gets a token of its own, not the cancelled one.
        let c = s.create().await;
        assert!(!s.check_live(&c).unwrap().is_cancelled());
    }

    #[tokio::test]
    async fn a_file_readable_by_others_is_rewritten_0600() {
        let dir = home();
        let path = dir.path().join(FILE_NAME);
        let s = WebSessions::load(path.clone());
        let id = s.create().await;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let s = WebSessions::load(path.clone());
        assert!(s.check(&id));
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
    }

    #[tokio::test]
    async fn the_least_recently_used_session_makes_room() {
        let s = WebSessions::in_memory();
        let first = s.create().await;
        let mut last = String::new();
        for _ in 0..MAX_SESSIONS {
            last = s.create().await;
        }
        assert_eq!(s.len(), MAX_SESSIONS);
        assert!(s.check(&last));
        assert!(!s.check(&first));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_creates_all_land_on_disk() {
        let dir = home();
        let path = dir.path().join(FILE_NAME);
        let s = WebSessions::load(path.clone());
        let mut set = tokio::task::JoinSet::new();
        for _ in 0..16 {
            let s = s.clone();
            set.spawn(async move { s.create().await });
        }
        let ids: Vec<String> = set.join_all().await;
        let again = WebSessions::load(path);
        assert_eq!(again.len(), 16);
        assert!(ids.iter().all(|id| again.check(id)));
    }
}
