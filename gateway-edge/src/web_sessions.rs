//! Web-console sessions (the `coffer_session` cookie), kept in memory and persisted to
//! `COFFER_HOME/web-sessions.json` so that a restart of the gateway service signs no browser
//! out — but only within one run of the daemon: a session ends with the daemon (`coffer daemon
//! stop`/`restart`, a crash of the supervisor).
//!
//! A session has two secrets (256 bits each, 64 hex characters): its **id**, the cookie value,
//! and its **key**, handed once to the page at login and sent by it as
//! `X-Coffer-Session-Key` on every API call. Cookies are not port-scoped (every port of
//! 127.0.0.1 receives `coffer_session`), so the cookie alone authenticates nothing: the key
//! lives in the console origin's `localStorage`, which no other port's page can read.
//!
//! What is on disk: the daemon run the sessions belong to, and for each session only the
//! SHA-256 of its id and of its key (never either secret), when it was created and when it was
//! last used (Unix milliseconds):
//!
//! ```json
//! {"version": 3, "run": "4242-2026-12-06T12:00:00.000Z", "sessions": [{"sha256": "<64 hex>", "key_sha256": "<64 hex>", "created_ms": 1764460800123, "last_used_ms": 1764460900456}]}
//! ```
//!
//! - **One daemon run**: the supervisor holds the console's port for its whole life (a
//!   restarted gateway gets the same listener back), so while it runs no other program can
//!   serve a page on the console's origin. Once it stops, another local program may take the
//!   port and serve a page there that reads the origin's `localStorage` (the key) and receives
//!   the cookie. So a file written by another run ([`WebSessions::load`]'s `run`: the
//!   supervisor's pid and start time) — or by a version before runs were recorded — loads as no
//!   session: a key taken while the daemon was down opens nothing. A console tab open across
//!   `coffer daemon restart` shows the signed-out screen; `coffer ui` gives a new login link.
//!
//! A presented cookie is looked up by hashing it: the map is keyed by digests, so a lookup's
//! timing says nothing useful about any id, and a copy of the file authenticates nobody. The
//! presented key's digest is compared with the stored one in constant time (`subtle`). A
//! version-1 or -2 file (sessions without a key, or of no recorded run) loads as no session:
//! those browsers log in again.
//!
//! - **Stream tickets**: `EventSource` cannot send a header, so a page opening an event stream
//!   first asks for a ticket ([`WebSessions::mint_ticket`], an authenticated `POST`) and passes
//!   it as `?ticket=`; a ticket is bound to its session, works once and lives
//!   [`TICKET_TTL`]. Tickets are kept in memory only (by digest), never on disk.
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
//!   (the edge's `auth` middleware wraps such bodies; see [`WebSessions::check`]).
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
/// The file format's version (3: the file names its daemon run; 2 did not and 1 had no keys:
/// both load as empty).
const VERSION: u32 = 3;
/// How long a stream ticket works after it is minted.
pub const TICKET_TTL: Duration = Duration::from_secs(30);
/// Most live stream tickets at once; minting one more forgets the oldest.
pub const MAX_TICKETS: usize = 1024;

/// A failed write of the sessions file.
#[derive(Debug, thiserror::Error)]
pub enum SessionsError {
    #[error("cannot write {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
}

type Digest = [u8; 32];

/// The two secrets of a new session, each 64 hex characters: `id` goes in the cookie, `key` to
/// the page (never logged, never on disk).
pub struct NewSession {
    pub id: String,
    pub key: String,
}

/// Which session a request is signed in with (the SHA-256 of its id): what a stream ticket is
/// bound to. Reveals nothing of the id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionRef(Digest);

impl SessionRef {
    /// The first 12 hex digits of the SHA-256 of the session id: names the session in the audit
    /// log without being usable as one.
    pub fn label(&self) -> String {
        hex::encode(&self.0[..6])
    }
}

/// Why a presented cookie does not authenticate a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No live session has this id (unknown, expired, revoked, malformed).
    NoSession,
    /// The session is live but the request carries no key (nor ticket).
    KeyMissing,
    /// The key (or ticket) presented is not this session's.
    KeyWrong,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    /// SHA-256 of the session's key.
    key: Digest,
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
    /// Live stream tickets: digest of the ticket → the session it is bound to, and until when.
    tickets: HashMap<Digest, (Digest, std::time::Instant)>,
}

struct Inner {
    /// `None`: memory only (tests).
    path: Option<PathBuf>,
    /// The daemon run these sessions belong to (written to the file).
    run: String,
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
    /// The daemon run that wrote it (absent before version 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    run: Option<String>,
    sessions: Vec<Row>,
}

#[derive(Serialize, Deserialize)]
struct Row {
    sha256: String,
    /// Absent in version 1: such a session cannot be used and is dropped at load.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    key_sha256: Option<String>,
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

fn hex_digest(s: &str) -> Option<Digest> {
    hex::decode(s).ok().and_then(|d| Digest::try_from(d).ok())
}

/// True when `presented` hashes to `stored`, compared in constant time.
fn key_matches(stored: &Digest, presented: &str) -> bool {
    use subtle::ConstantTimeEq as _;
    let d: Digest = sha2::Sha256::digest(presented.as_bytes()).into();
    bool::from(d.ct_eq(stored))
}

impl WebSessions {
    /// Sessions kept in memory only (nothing is read or written).
    pub fn in_memory() -> Self {
        Self(Arc::new(Inner {
            path: None,
            run: String::new(),
            state: Mutex::default(),
            writer: tokio::sync::Mutex::new(0),
        }))
    }

    /// Loads the sessions persisted at `path` for daemon run `run` (blocking: call it at start;
    /// `run` is the supervisor's `<pid>-<started_at>`, the same for every gateway process of one
    /// daemon run). A missing file is no session; a file of another run (or of no recorded run:
    /// versions 1 and 2) loads as no session and is replaced at once — see the module
    /// documentation; an unreadable, oversized or malformed one is logged, treated as empty and
    /// replaced at once (as is one whose permissions are wider than 0600).
    pub fn load(path: PathBuf, run: &str) -> Self {
        let now = now_ms();
        let (map, rewrite) = match read_file(&path) {
            Ok(None) => (HashMap::new(), false),
            Ok(Some((_, file_run, rows, _))) if file_run.as_deref() != Some(run) => {
                let n = rows.len();
                if n > 0 {
                    tracing::info!(path = %path.display(), ended = n, "Web sessions of an earlier daemon run ended; a console signs in again with `coffer ui`.");
                }
                (HashMap::new(), true)
            }
            Ok(Some((version, _, rows, wide_mode))) => {
                let total = rows.len();
                let mut map = HashMap::new();
                let mut bad = 0;
                let mut keyless = 0;
                for r in rows {
                    let digest = hex_digest(&r.sha256);
                    let key = r.key_sha256.as_deref().map(hex_digest);
                    match (digest, key) {
                        // A version-1 session has no key: it can no longer sign anything in.
                        (Some(_), None) => keyless += 1,
                        (Some(d), Some(Some(key))) => {
                            if now - r.last_used_ms <= idle_ms() {
                                let e = Entry {
                                    key,
                                    created_ms: r.created_ms,
                                    last_used_ms: r.last_used_ms,
                                    persisted_last_used_ms: r.last_used_ms,
                                    serial: 0,
                                };
                                map.insert(d, e);
                            }
                        }
                        _ => bad += 1,
                    }
                }
                if keyless > 0 {
                    tracing::info!(path = %path.display(), version, dropped = keyless, "Web sessions from before session keys dropped; those browsers log in again.");
                }
                if bad > 0 {
                    tracing::warn!(path = %path.display(), skipped = bad, "Web sessions file has malformed entries; skipped them.");
                }
                if wide_mode {
                    tracing::warn!(path = %path.display(), "Web sessions file was readable by others; rewriting it with mode 0600.");
                }
                let rewrite = wide_mode || bad > 0 || map.len() != total || version != VERSION;
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
            run: run.to_owned(),
            state: Mutex::new(State {
                map,
                generation: 0,
                serial: 1,
                revoked: CancellationToken::new(),
                tickets: HashMap::new(),
            }),
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

    /// True when `id` (a cookie value) is a live session, whatever key comes with it. It does
    /// not mark the session used and authenticates nothing (the cookie reaches every local
    /// port): it only lets a reloaded login tab go to its page instead of the refusal.
    pub fn cookie_is_live(&self, id: &str) -> bool {
        // Read only: a cookie alone (which any local port receives) never keeps a session alive.
        let Some(d) = digest_of(id) else { return false };
        let now = now_ms();
        let s = self.0.state.lock().expect("web sessions");
        s.map.get(&d).is_some_and(|e| now - e.last_used_ms <= idle_ms())
    }

    /// Authenticates a request by its cookie `id` and the `key` it sent (`X-Coffer-Session-Key`):
    /// the session, and the token cancelled when it is revoked (a response streaming to it
    /// ends when the token does; taken under the same lock as the check, so a revocation racing
    /// the request is never missed). Marks the session used.
    ///
    /// # Errors
    /// [`Refusal::NoSession`] for no live session with this id, [`Refusal::KeyMissing`] for
    /// `key` `None`, [`Refusal::KeyWrong`] for another key.
    pub fn check(&self, id: &str, key: Option<&str>) -> Result<(SessionRef, CancellationToken), Refusal> {
        self.check_at(id, key, now_ms())
    }

    fn check_at(&self, id: &str, key: Option<&str>, now: i64) -> Result<(SessionRef, CancellationToken), Refusal> {
        self.lookup(id, now, |e| match key {
            None => Err(Refusal::KeyMissing),
            Some(k) if key_matches(&e.key, k) => Ok(()),
            Some(_) => Err(Refusal::KeyWrong),
        })
    }

    /// Authenticates an event-stream request by its cookie `id` and a stream `ticket`, which
    /// is consumed whether it matches or not (a ticket is tried once).
    ///
    /// # Errors
    /// [`Refusal::NoSession`] for no live session with this id, [`Refusal::KeyWrong`] for a
    /// ticket that is unknown, used, expired or bound to another session.
    pub fn check_ticket(&self, id: &str, ticket: &str) -> Result<(SessionRef, CancellationToken), Refusal> {
        let bound = {
            let t: Digest = sha2::Sha256::digest(ticket.as_bytes()).into();
            let mut s = self.0.state.lock().expect("web sessions");
            let now = std::time::Instant::now();
            s.tickets.retain(|_, (_, until)| *until > now);
            s.tickets.remove(&t).map(|(session, _)| session)
        };
        self.lookup(id, now_ms(), |_| Ok(())).and_then(|(session, token)| {
            use subtle::ConstantTimeEq as _;
            match bound {
                Some(b) if bool::from(b.ct_eq(&session.0)) => Ok((session, token)),
                _ => Err(Refusal::KeyWrong),
            }
        })
    }

    /// Mints a stream ticket (64 hex characters) for `session`, working once within
    /// [`TICKET_TTL`]. At most [`MAX_TICKETS`] are live; one more forgets the oldest.
    pub fn mint_ticket(&self, session: SessionRef) -> String {
        let ticket = coffer_runtime::token::random_token().expose_secret().to_owned();
        let t: Digest = sha2::Sha256::digest(ticket.as_bytes()).into();
        let now = std::time::Instant::now();
        let mut s = self.0.state.lock().expect("web sessions");
        s.tickets.retain(|_, (_, until)| *until > now);
        while s.tickets.len() >= MAX_TICKETS {
            let Some(oldest) = s.tickets.iter().min_by_key(|(_, (_, until))| *until).map(|(k, _)| *k) else { break };
            s.tickets.remove(&oldest);
        }
        s.tickets.insert(t, (session.0, now + TICKET_TTL));
        ticket
    }

    /// The live session `id` names, when `accept` takes it: its reference and revocation
    /// token. Marks it used (only when accepted); drops it when expired.
    fn lookup(
        &self,
        id: &str,
        now: i64,
        accept: impl FnOnce(&Entry) -> Result<(), Refusal>,
    ) -> Result<(SessionRef, CancellationToken), Refusal> {
        let d = digest_of(id).ok_or(Refusal::NoSession)?;
        let (live, write) = {
            let mut s = self.0.state.lock().expect("web sessions");
            match s.map.get_mut(&d) {
                None => (Err(Refusal::NoSession), false),
                Some(e) if now - e.last_used_ms > idle_ms() => {
                    s.map.remove(&d);
                    s.generation += 1;
                    (Err(Refusal::NoSession), true)
                }
                Some(e) => match accept(e) {
                    Err(r) => (Err(r), false),
                    Ok(()) => {
                        e.last_used_ms = e.last_used_ms.max(now);
                        let stale = e.last_used_ms - e.persisted_last_used_ms > TOUCH_PERSIST.as_millis() as i64;
                        if stale {
                            e.persisted_last_used_ms = e.last_used_ms;
                            s.generation += 1;
                        }
                        (Ok((SessionRef(d), s.revoked.clone())), stale)
                    }
                },
            }
        };
        if write {
            self.persist_in_background();
        }
        live
    }

    /// Starts a session and writes it to disk (digests only) before returning its id (the
    /// cookie value) and key (for the page). A failed write is logged: the session then lasts
    /// until this process ends.
    pub async fn create(&self) -> NewSession {
        let id = coffer_runtime::token::random_token().expose_secret().to_owned();
        let key = coffer_runtime::token::random_token().expose_secret().to_owned();
        let d = digest_of(&id).expect("a random token is 64 hex characters");
        let key_digest: Digest = sha2::Sha256::digest(key.as_bytes()).into();
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
            s.map.insert(
                d,
                Entry { key: key_digest, created_ms: now, last_used_ms: now, persisted_last_used_ms: now, serial },
            );
            s.generation += 1;
        }
        if let Err(e) = self.persist().await {
            tracing::warn!(error = %e, "Web session not persisted; it ends when the gateway does.");
        }
        NewSession { id, key }
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
            s.tickets.clear();
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
            .map(|(d, e)| Row {
                sha256: hex::encode(d),
                key_sha256: Some(hex::encode(e.key)),
                created_ms: e.created_ms,
                last_used_ms: e.last_used_ms,
            })
            .collect();
        sessions.sort_by(|a, b| a.created_ms.cmp(&b.created_ms).then_with(|| a.sha256.cmp(&b.sha256)));
        let body = FileBody { version: VERSION, run: Some(self.0.run.clone()), sessions };
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

/// The version, run and rows of the file at `path` (`None`: no file) and whether its mode is
/// wider than 0600. Versions 1 to 3 are read (a version-1 row has no key; only version 3 names
/// its run).
#[allow(clippy::type_complexity)]
fn read_file(path: &Path) -> Result<Option<(u32, Option<String>, Vec<Row>, bool)>, String> {
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
    if !(1..=VERSION).contains(&body.version) {
        return Err(format!("version {} is not 1 or {VERSION}", body.version));
    }
    let run = if body.version >= 3 { body.run } else { None };
    Ok(Some((body.version, run, body.sessions, meta.permissions().mode() & 0o077 != 0)))
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

    /// The daemon run of these tests' sessions.
    const RUN: &str = "4242-2026-12-06T12:00:00.000Z";

    fn home() -> tempfile::TempDir {
        tempfile::tempdir().unwrap()
    }

    /// True when `n` signs a request in (cookie and key).
    fn ok(s: &WebSessions, n: &NewSession) -> bool {
        s.check(&n.id, Some(&n.key)).is_ok()
    }

    fn ok_at(s: &WebSessions, n: &NewSession, now: i64) -> bool {
        s.check_at(&n.id, Some(&n.key), now).is_ok()
    }

    fn file_text(path: &Path) -> String {
        std::fs::read_to_string(path).unwrap()
    }

    #[tokio::test]
    async fn sessions_persist_as_digests_with_mode_0600_and_survive_a_reload() {
        let dir = home();
        let path = dir.path().join(FILE_NAME);
        let s = WebSessions::load(path.clone(), RUN);
        assert!(s.is_empty());
        assert!(!path.exists(), "nothing written before a session exists");
        let n = s.create().await;
        let id = n.id.clone();
        assert_eq!((id.len(), n.key.len()), (64, 64));
        assert_ne!(id, n.key);
        assert!(ok(&s, &n));
        let text = file_text(&path);
        assert!(!text.contains(&id), "the id itself is never on disk: {text}");
        assert!(!text.contains(&n.key), "the key itself is never on disk: {text}");
        assert!(text.contains(&hex::encode(sha2::Sha256::digest(id.as_bytes()))), "{text}");
        assert!(text.contains(&hex::encode(sha2::Sha256::digest(n.key.as_bytes()))), "{text}");
        assert!(text.contains("\"version\":3"), "{text}");
        assert!(text.contains(&format!("\"run\":\"{RUN}\"")), "{text}");
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        // No temp file is left behind.
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, [std::ffi::OsString::from(FILE_NAME)]);

        let again = WebSessions::load(path.clone(), RUN);
        assert_eq!(again.len(), 1);
        assert!(ok(&again, &n));
        let key = Some(n.key.as_str());
        for bad in ["0".repeat(64), id[..63].to_owned(), format!("{}g", &id[..63]), String::new()] {
            assert_eq!(again.check(&bad, key).unwrap_err(), Refusal::NoSession, "{bad}");
        }
    }

    #[tokio::test]
    async fn the_cookie_alone_or_with_another_key_is_refused() {
        let s = WebSessions::in_memory();
        let (a, b) = (s.create().await, s.create().await);
        assert!(s.cookie_is_live(&a.id));
        assert_eq!(s.check(&a.id, None).unwrap_err(), Refusal::KeyMissing);
        assert_eq!(s.check(&a.id, Some("")).unwrap_err(), Refusal::KeyWrong);
        assert_eq!(s.check(&a.id, Some(&b.key)).unwrap_err(), Refusal::KeyWrong, "another session's key");
        assert_eq!(s.check(&a.id, Some(&a.key[..63])).unwrap_err(), Refusal::KeyWrong);
        assert_eq!(s.check(&a.id, Some(&a.id)).unwrap_err(), Refusal::KeyWrong, "the id is not the key");
        let (ra, _) = s.check(&a.id, Some(&a.key)).unwrap();
        let (rb, _) = s.check(&b.id, Some(&b.key)).unwrap();
        assert_ne!(ra, rb);
    }

    #[tokio::test]
    async fn tickets_work_once_for_their_own_session_and_expire() {
        let s = WebSessions::in_memory();
        let (a, b) = (s.create().await, s.create().await);
        let (ra, _) = s.check(&a.id, Some(&a.key)).unwrap();
        let t = s.mint_ticket(ra);
        assert_eq!(t.len(), 64);
        assert!(s.check_ticket(&a.id, &t).is_ok());
        assert_eq!(s.check_ticket(&a.id, &t).unwrap_err(), Refusal::KeyWrong, "single use");
        // Bound to its session: another cookie cannot use it, and the try burns it.
        let t = s.mint_ticket(ra);
        assert_eq!(s.check_ticket(&b.id, &t).unwrap_err(), Refusal::KeyWrong);
        assert_eq!(s.check_ticket(&a.id, &t).unwrap_err(), Refusal::KeyWrong);
        // Without a live cookie, nothing.
        let t = s.mint_ticket(ra);
        assert_eq!(s.check_ticket(&"0".repeat(64), &t).unwrap_err(), Refusal::NoSession);
        assert_eq!(s.check_ticket(&a.id, "nonsense").unwrap_err(), Refusal::KeyWrong);
        // Expired: a ticket whose time is up is gone.
        let t = s.mint_ticket(ra);
        {
            let mut st = s.0.state.lock().unwrap();
            for (_, until) in st.tickets.values_mut() {
                *until = std::time::Instant::now() - Duration::from_millis(1);
            }
        }
        assert_eq!(s.check_ticket(&a.id, &t).unwrap_err(), Refusal::KeyWrong);
        // Revocation forgets every ticket.
        let t = s.mint_ticket(ra);
        s.revoke_all().await.unwrap();
        assert!(s.0.state.lock().unwrap().tickets.is_empty());
        assert_eq!(s.check_ticket(&a.id, &t).unwrap_err(), Refusal::NoSession);
        // Bounded: the oldest ticket makes room.
        let c = s.create().await;
        let (rc, _) = s.check(&c.id, Some(&c.key)).unwrap();
        let first = s.mint_ticket(rc);
        let mut last = String::new();
        for _ in 0..MAX_TICKETS {
            last = s.mint_ticket(rc);
        }
        assert_eq!(s.0.state.lock().unwrap().tickets.len(), MAX_TICKETS);
        assert!(s.check_ticket(&c.id, &last).is_ok());
        assert!(s.check_ticket(&c.id, &first).is_err());
    }

    #[tokio::test]
    async fn a_version_1_file_loads_as_no_session_and_is_rewritten() {
        let dir = home();
        let path = dir.path().join(FILE_NAME);
        let now = now_ms();
        let body = serde_json::json!({"version": 1, "sessions": [
            {"sha256": hex::encode([8u8; 32]), "created_ms": now, "last_used_ms": now},
        ]});
        std::fs::write(&path, body.to_string()).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let s = WebSessions::load(path.clone(), RUN);
        assert!(s.is_empty());
        let v: serde_json::Value = serde_json::from_str(&file_text(&path)).unwrap();
        assert_eq!(v, serde_json::json!({"version": 3, "run": RUN, "sessions": []}));
    }

    #[tokio::test]
    async fn sessions_of_another_daemon_run_or_of_no_recorded_run_load_as_none() {
        let dir = home();
        let path = dir.path().join(FILE_NAME);
        let s = WebSessions::load(path.clone(), RUN);
        let n = s.create().await;
        // The same run (a gateway restarted by its supervisor): still signed in.
        assert!(ok(&WebSessions::load(path.clone(), RUN), &n));
        // A new daemon run: gone, and the file says so at once.
        let next = "4243-2026-12-06T13:00:00.000Z";
        let later = WebSessions::load(path.clone(), next);
        assert!(later.is_empty());
        assert_eq!(later.check(&n.id, Some(&n.key)).unwrap_err(), Refusal::NoSession);
        let v: serde_json::Value = serde_json::from_str(&file_text(&path)).unwrap();
        assert_eq!(v, serde_json::json!({"version": 3, "run": next, "sessions": []}));
        assert!(WebSessions::load(path.clone(), RUN).is_empty(), "nor back in the first run's name");
        // A version-2 file (keys, but no run) is from before runs were recorded: none either.
        let now = now_ms();
        let key = hex::encode(sha2::Sha256::digest(n.key.as_bytes()));
        let id = hex::encode(sha2::Sha256::digest(n.id.as_bytes()));
        let body = serde_json::json!({"version": 2, "run": RUN, "sessions": [
            {"sha256": id, "key_sha256": key, "created_ms": now, "last_used_ms": now},
        ]});
        std::fs::write(&path, body.to_string()).unwrap();
        assert!(WebSessions::load(path.clone(), RUN).is_empty());
    }

    #[tokio::test]
    async fn revoking_empties_memory_and_disk() {
        let dir = home();
        let path = dir.path().join(FILE_NAME);
        let s = WebSessions::load(path.clone(), RUN);
        let (a, b) = (s.create().await, s.create().await);
        assert_eq!(s.revoke_all().await.unwrap(), 2);
        assert!(!ok(&s, &a) && !ok(&s, &b));
        assert_eq!(WebSessions::load(path.clone(), RUN).len(), 0);
        assert_eq!(s.revoke_all().await.unwrap(), 0);
    }

    #[tokio::test]
    async fn idle_sessions_expire_and_use_keeps_them_alive() {
        let dir = home();
        let path = dir.path().join(FILE_NAME);
        let s = WebSessions::load(path.clone(), RUN);
        let id = s.create().await;
        let now = now_ms();
        let day = 86_400_000;
        // Used 29 days on: alive, and the new last-used time is written.
        assert!(ok_at(&s, &id, now + 29 * day));
        // The write runs in the background; a persist now writes it, or finds it written.
        s.persist().await.unwrap();
        assert!(file_text(&path).contains(&format!("\"last_used_ms\":{}", now + 29 * day)), "{}", file_text(&path));
        // Exactly 30 days after that use: still alive (and used again).
        assert!(ok_at(&s, &id, now + 59 * day));
        // 30 days and a minute after the last use: expired, and gone.
        assert!(!ok_at(&s, &id, now + 89 * day + 60_000));
        assert!(s.is_empty());

        // A file holding an expired session loads without it (and is rewritten).
        let body = serde_json::json!({"version": 3, "run": RUN, "sessions": [
            {"sha256": hex::encode([7u8; 32]), "key_sha256": hex::encode([1u8; 32]), "created_ms": 0, "last_used_ms": 0},
            {"sha256": hex::encode([8u8; 32]), "key_sha256": hex::encode([1u8; 32]), "created_ms": now, "last_used_ms": now},
        ]});
        std::fs::write(&path, body.to_string()).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let s = WebSessions::load(path.clone(), RUN);
        assert_eq!(s.len(), 1);
        assert!(!file_text(&path).contains(&hex::encode([7u8; 32])));
    }

    #[tokio::test]
    async fn a_damaged_file_is_treated_as_empty_and_replaced() {
        let dir = home();
        let path = dir.path().join(FILE_NAME);
        let bad_row = serde_json::json!({"version": 3, "run": RUN, "sessions": [{"sha256": "zz", "key_sha256": "zz", "created_ms": 0, "last_used_ms": now_ms()}]});
        for damage in [
            b"{not json".to_vec(),
            Vec::new(),
            b"{\"version\": 9, \"sessions\": []}".to_vec(),
            b"[1,2,3]".to_vec(),
            vec![0xff, 0xfe, 0x00],
            bad_row.to_string().into_bytes(),
        ] {
            std::fs::write(&path, &damage).unwrap();
            let s = WebSessions::load(path.clone(), RUN);
            assert!(s.is_empty());
            let text = file_text(&path);
            let v: serde_json::Value = serde_json::from_str(&text).unwrap();
            assert_eq!(v, serde_json::json!({"version": 3, "run": RUN, "sessions": []}), "replaced after {damage:?}");
            let id = s.create().await;
            assert!(ok(&WebSessions::load(path.clone(), RUN), &id));
        }
        // Oversized: refused without reading it all.
        let f = std::fs::File::create(&path).unwrap();
        f.set_len(MAX_FILE_BYTES + 1).unwrap();
        assert!(WebSessions::load(path.clone(), RUN).is_empty());
        assert!(std::fs::metadata(&path).unwrap().len() < 100);
        // A folder in its place: logged, the sessions live in memory.
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        let s = WebSessions::load(path.clone(), RUN);
        let id = s.create().await;
        assert!(ok(&s, &id));
        // Neither rewrite nor removal works: revoking says so, and memory is empty anyway.
        std::fs::write(path.join("x"), "keep").unwrap();
        assert!(matches!(s.revoke_all().await, Err(SessionsError::Write { .. })));
        assert!(!ok(&s, &id));
    }

    #[tokio::test]
    async fn revoking_cancels_the_token_of_every_live_session_and_only_theirs() {
        let s = WebSessions::in_memory();
        let (a, b) = (s.create().await, s.create().await);
        let live = |n: &NewSession| s.check(&n.id, Some(&n.key)).map(|(_, t)| t);
        let (ta, tb) = (live(&a).unwrap(), live(&b).unwrap());
        assert!(s.check(&"0".repeat(64), Some(&a.key)).is_err());
        assert!(!ta.is_cancelled() && !tb.is_cancelled());
        s.revoke_all().await.unwrap();
        assert!(ta.is_cancelled() && tb.is_cancelled());
        assert!(live(&a).is_err());
        // A session made after the revocation gets a token of its own, not the cancelled one.
        let c = s.create().await;
        assert!(!live(&c).unwrap().is_cancelled());
    }

    #[tokio::test]
    async fn a_file_readable_by_others_is_rewritten_0600() {
        let dir = home();
        let path = dir.path().join(FILE_NAME);
        let s = WebSessions::load(path.clone(), RUN);
        let id = s.create().await;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let s = WebSessions::load(path.clone(), RUN);
        assert!(ok(&s, &id));
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
    }

    #[tokio::test]
    async fn the_least_recently_used_session_makes_room() {
        let s = WebSessions::in_memory();
        let first = s.create().await;
        let mut last = s.create().await;
        for _ in 1..MAX_SESSIONS {
            last = s.create().await;
        }
        assert_eq!(s.len(), MAX_SESSIONS);
        assert!(ok(&s, &last));
        assert!(!ok(&s, &first));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_creates_all_land_on_disk() {
        let dir = home();
        let path = dir.path().join(FILE_NAME);
        let s = WebSessions::load(path.clone(), RUN);
        let mut set = tokio::task::JoinSet::new();
        for _ in 0..16 {
            let s = s.clone();
            set.spawn(async move { s.create().await });
        }
        let ids: Vec<NewSession> = set.join_all().await;
        let again = WebSessions::load(path, RUN);
        assert_eq!(again.len(), 16);
        assert!(ids.iter().all(|id| ok(&again, id)));
    }
}
