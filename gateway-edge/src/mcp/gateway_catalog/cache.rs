//! The catalog's cache file, `COFFER_HOME/cache/catalog.json` ([`CACHE_FILE`]): regenerable
//! derived data (never in `coffer.db`, safe to delete), read once at start
//! (`GatewayCatalog::load`), rewritten atomically (0600) shortly after the catalog changes
//! ([`persist`]). Restored lists are served only for the registration they were listed for
//! ([`fingerprint`]); a file of another format, too large or damaged is ignored.
use std::collections::BTreeMap;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use coffer_proto::store::McpServer;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};
use tokio_util::sync::CancellationToken;

use super::CACHE_FILE;
use crate::mcp::Shared;

/// The cache file's format; a file of another format is ignored (and rewritten).
pub(super) const CACHE_FORMAT: u32 = 1;
/// A cache file larger than this is ignored (bytes).
pub(super) const MAX_CACHE_BYTES: u64 = 64 * 1024 * 1024;
/// How long after a change the cache file is rewritten (changes meanwhile share one write).
const PERSIST_DELAY: Duration = Duration::from_millis(500);

/// The cache file's body (`format` [`CACHE_FORMAT`]).
#[derive(Serialize, Deserialize)]
pub(super) struct CacheBody {
    pub(super) format: u32,
    /// The `initialize` params of the last client profiles, newest first.
    pub(super) clients: Vec<Value>,
    pub(super) servers: BTreeMap<String, CachedServer>,
}

#[derive(Serialize, Deserialize)]
pub(super) struct CachedServer {
    /// The registry version the lists are of.
    pub(super) version: i64,
    /// [`fingerprint`] of the registration.
    pub(super) fingerprint: String,
    /// `"2026-07-28"` or `"handshake"` when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) era: Option<String>,
    pub(super) lists: Vec<CachedList>,
}

#[derive(Serialize, Deserialize)]
pub(super) struct CachedList {
    /// [`Profile::as_str`].
    pub(super) profile: String,
    /// The list method, e.g. `tools/list`.
    pub(super) kind: String,
    pub(super) items: Vec<Value>,
}

/// Identifies one registration of a server (its name, creation time, transport, command, args,
/// URL and working directory — never `env` or header values, which may be secrets): restored
/// lists are served only for the registration they were listed for, also when a server removed
/// and registered again reaches the same registry version.
pub fn fingerprint(s: &McpServer) -> String {
    let identity = json!([s.name, s.created_at, s.transport, s.command, s.args, s.url, s.cwd, s.version]);
    hex::encode(Sha256::digest(identity.to_string().as_bytes()))
}

/// Reads the cache file: `None` when there is none; the reason when it cannot be used.
pub(super) fn read_cache(path: &Path) -> Result<Option<CacheBody>, String> {
    let f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot open it: {e}")),
    };
    let mut bytes = Vec::new();
    f.take(MAX_CACHE_BYTES + 1).read_to_end(&mut bytes).map_err(|e| format!("cannot read it: {e}"))?;
    if bytes.len() as u64 > MAX_CACHE_BYTES {
        return Err(format!("larger than {MAX_CACHE_BYTES} bytes"));
    }
    let body: CacheBody = serde_json::from_slice(&bytes).map_err(|e| format!("not the expected JSON: {e}"))?;
    if body.format != CACHE_FORMAT {
        return Err(format!("format {} is not {CACHE_FORMAT}", body.format));
    }
    Ok(Some(body))
}

/// Writes the catalog to its cache file ([`CACHE_FILE`] under `home`, folder 0700, file 0600,
/// replaced atomically) [`PERSIST_DELAY`] after each change, and once more at `shutdown`.
/// A failed write is logged and retried at the next change; lists keep being served from
/// memory.
pub async fn persist(shared: Arc<Shared>, shutdown: CancellationToken) {
    let path = shared.home.root().join(CACHE_FILE);
    loop {
        let stopping = tokio::select! {
            () = shutdown.cancelled() => true,
            () = shared.lists.dirty_notify.notified() => false,
        };
        if !stopping {
            tokio::select! {
                () = shutdown.cancelled() => {}
                () = tokio::time::sleep(PERSIST_DELAY) => {}
            }
        }
        if shared.lists.dirty.swap(false, Ordering::AcqRel) {
            let snap = shared.snapshot.current();
            if snap.loaded {
                let body = shared.lists.cache_body(&snap);
                let path = path.clone();
                let written = tokio::task::spawn_blocking(move || write_cache(&path, &body)).await;
                if let Ok(Err(e)) = written {
                    tracing::warn!(path = %path_display(&shared), error = %e, "Capability catalog cache not written; lists are still served from memory.");
                    shared.lists.dirty.store(true, Ordering::Release);
                }
            } else {
                shared.lists.dirty.store(true, Ordering::Release);
            }
        }
        if stopping || shutdown.is_cancelled() {
            return;
        }
    }
}

fn path_display(shared: &Shared) -> String {
    shared.home.root().join(CACHE_FILE).display().to_string()
}

pub(super) fn write_cache(path: &Path, body: &CacheBody) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt as _;
    let dir: PathBuf = path.parent().map(Path::to_path_buf).unwrap_or_default();
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&dir)?;
    let bytes = serde_json::to_vec(body).map_err(std::io::Error::other)?;
    crate::web_sessions::write_atomic(path, &bytes)
}
