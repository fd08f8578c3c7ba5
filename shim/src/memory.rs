//! The shim's memory of the daemon's discovery answers, so a client started while the daemon is
//! still starting (a cold first session) is answered at once.
//!
//! Why: headless Claude Code (`claude -p`, 2.1.197 and 2.1.332 measured) counts an MCP server
//! as connected, and offers its tools on the first turn, only when the server answered its
//! discovery (`initialize`, or 2026-07-28's `server/discover`) *and* `tools/list` within about
//! a second of being launched on a loaded machine (its `CLAUDE_CODE_MCP_STARTUP_WAIT_MS`, 2 s,
//! counts from before it launches the server). A cold daemon takes 0.7–1.6 s to answer there,
//! so answering `initialize` alone early does not help: the lists must be answered too.
//!
//! What: after relaying one of the [`REMEMBERED`] requests, the shim stores the daemon's result
//! under a key made of the exact request (method and params, including 2026-07-28's `_meta`)
//! and the shim's [`Memory::scope`] (its arguments and the environment that selects what a
//! session sees). When no daemon link is up yet, the same request is answered from that result
//! at once, and then asked of the daemon once it is up: the daemon's answer replaces the stored
//! one, and when a list differs the client gets the list's `list_changed` notification (see
//! `bridge.rs`). Nothing is remembered for a request never seen before: it waits for the daemon,
//! as before. The daemon stays the authority for everything: calls are never answered here.
//!
//! Where: `COFFER_HOME/cache/shim/<sha256 of scope and request>.json`, `{"method", "result"}`,
//! written to a temporary file and renamed (shims of several clients share the folder). Tool
//! lists hold names and descriptions, no secrets; the files are the owner's (0600).
use std::path::PathBuf;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// Requests whose results depend only on the request and on what the daemon serves, and that a
/// client waits for before it counts the server usable.
pub(crate) const REMEMBERED: [&str; 6] =
    ["initialize", "server/discover", "tools/list", "prompts/list", "resources/list", "resources/templates/list"];

/// MCP 2026-07-28's `subscriptions/listen`: a long-lived request, not answered from memory;
/// what is remembered is its `notifications/subscriptions/acknowledged`, which Claude Code
/// 2.1.332 waits for before it lists (see [`Acks`]).
pub(crate) const LISTEN: &str = "subscriptions/listen";
const ACKNOWLEDGED: &str = "notifications/subscriptions/acknowledged";
const SUBSCRIPTION_ID_META: &str = "io.modelcontextprotocol/subscriptionId";

/// Whether `method` is one of [`REMEMBERED`].
pub(crate) fn remembered(method: &str) -> bool {
    REMEMBERED.contains(&method)
}

/// The `list_changed` notification method for a list request (`tools/list` →
/// `notifications/tools/list_changed`); `None` for the other remembered methods.
pub(crate) fn list_changed_method(method: &str) -> Option<&'static str> {
    match method {
        "tools/list" => Some("notifications/tools/list_changed"),
        "prompts/list" => Some("notifications/prompts/list_changed"),
        "resources/list" | "resources/templates/list" => Some("notifications/resources/list_changed"),
        _ => None,
    }
}

/// The stored answers of one home and one scope.
#[derive(Debug, Clone)]
pub struct Memory {
    dir: PathBuf,
    scope: String,
}

impl Memory {
    /// Answers kept in `dir` for shims of `scope` (anything that changes what a session is
    /// offered: the shim's arguments, the profile it selects, whose access it uses).
    pub fn new(dir: PathBuf, scope: String) -> Self {
        Self { dir, scope }
    }

    /// The scope this memory keys its answers with.
    pub fn scope(&self) -> &str {
        &self.scope
    }

    /// The key of a request: `None` unless it is one of [`REMEMBERED`]. The request's `id` and
    /// `jsonrpc` are left out; everything else counts, byte for byte as re-serialized.
    pub(crate) fn key(&self, request: &Value) -> Option<String> {
        let method = request.get("method")?.as_str()?;
        if !remembered(method) && method != LISTEN {
            return None;
        }
        let params = request.get("params").cloned().unwrap_or(Value::Null);
        let mut hash = Sha256::new();
        hash.update(json!([self.scope, method, params]).to_string().as_bytes());
        Some(hex::encode(hash.finalize()))
    }

    /// The result stored under `key`, if any (an unreadable or damaged file counts as none).
    pub(crate) fn recall(&self, key: &str) -> Option<Value> {
        let bytes = std::fs::read(self.dir.join(format!("{key}.json"))).ok()?;
        let mut stored: Value = serde_json::from_slice(&bytes).ok()?;
        let result = stored.get_mut("result")?.take();
        result.is_object().then_some(result)
    }

    /// Stores `result` (the daemon's, for `method`) under `key`. Best effort: a failure is
    /// logged at debug level and otherwise ignored (the next cold start just waits).
    pub(crate) fn store(&self, key: &str, method: &str, result: &Value) {
        if let Err(err) = self.write(key, method, result) {
            tracing::debug!(error = %err, dir = %self.dir.display(), "Cannot store the daemon's answer.");
        }
    }

    fn write(&self, key: &str, method: &str, result: &Value) -> std::io::Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::create_dir_all(&self.dir)?;
        let tmp = self.dir.join(format!(".{key}.{}.tmp", std::process::id()));
        let mut file = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp)?;
        file.write_all(json!({"method": method, "result": result}).to_string().as_bytes())?;
        drop(file);
        std::fs::rename(&tmp, self.dir.join(format!("{key}.json")))
    }
}

/// Acknowledgments of `subscriptions/listen`, between the bridge and the stream's reader: the
/// reader stores the daemon's acknowledgment of a listen the bridge relayed ([`Acks::watch`]),
/// and drops it for a listen the shim already acknowledged from memory ([`Acks::given`]), so
/// the client sees exactly one acknowledgment per subscription either way.
#[derive(Default)]
pub(crate) struct Acks {
    memory: Option<Memory>,
    /// Subscription id (JSON text) → memory key of its listen request.
    watched: std::sync::Mutex<std::collections::HashMap<String, String>>,
    /// Subscription ids (JSON text) the shim acknowledged itself.
    given: std::sync::Mutex<std::collections::HashSet<String>>,
}

impl Acks {
    /// Acknowledgments remembered in `memory` (none are without one).
    pub(crate) fn new(memory: Option<Memory>) -> Self {
        Self { memory, ..Self::default() }
    }

    fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
        m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The acknowledgment remembered for a listen request (its subscription id set to the
    /// request's id), recording that the daemon's own must be dropped when it comes.
    pub(crate) fn give(&self, id: &Value, key: &str) -> Option<Value> {
        let mut ack = self.memory.as_ref()?.recall(key)?;
        ack.pointer_mut("/params/_meta")?.as_object_mut()?.insert(SUBSCRIPTION_ID_META.into(), id.clone());
        Self::lock(&self.given).insert(id.to_string());
        Some(ack)
    }

    /// Remember the daemon's acknowledgment of the listen request `id` (memory key `key`).
    pub(crate) fn watch(&self, id: &Value, key: String) {
        if self.memory.is_some() {
            Self::lock(&self.watched).insert(id.to_string(), key);
        }
    }

    /// For every message the daemon sends the client: `false` when it is an acknowledgment the
    /// shim already gave (drop it). Stores acknowledgments of watched listens. Cheap for any
    /// other message (a byte search before any parsing).
    pub(crate) fn pass(&self, line: &[u8]) -> bool {
        if line.windows(ACKNOWLEDGED.len()).all(|w| w != ACKNOWLEDGED.as_bytes()) {
            return true;
        }
        let Ok(note) = serde_json::from_slice::<Value>(line) else { return true };
        if note.get("method").and_then(Value::as_str) != Some(ACKNOWLEDGED) {
            return true;
        }
        let Some(id) = note.pointer("/params/_meta").and_then(|m| m.get(SUBSCRIPTION_ID_META)) else { return true };
        let id = id.to_string();
        if Self::lock(&self.given).remove(&id) {
            return false;
        }
        if let (Some(memory), Some(key)) = (&self.memory, Self::lock(&self.watched).remove(&id)) {
            memory.store(&key, ACKNOWLEDGED, &note);
        }
        true
    }
}

/// The `result` of a JSON-RPC response line; `None` for an error or anything else.
pub(crate) fn result_of(frame: &[u8]) -> Option<Value> {
    let mut v: Value = serde_json::from_slice(frame).ok()?;
    let result = v.get_mut("result")?.take();
    result.is_object().then_some(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memory(dir: &std::path::Path, scope: &str) -> Memory {
        Memory::new(dir.join("shim"), scope.into())
    }

    #[test]
    fn answers_are_keyed_by_scope_method_and_params_not_id() {
        let dir = std::env::temp_dir().join(format!("coffer-shim-memory-{}", std::process::id()));
        let m = memory(&dir, "a");
        let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": {"x": 1}}});
        let key = m.key(&list).unwrap();
        assert_eq!(
            m.key(&json!({"jsonrpc": "2.0", "id": "other", "method": "tools/list", "params": {"_meta": {"x": 1}}})),
            Some(key.clone())
        );
        assert_ne!(m.key(&json!({"id": 1, "method": "tools/list", "params": {"_meta": {"x": 2}}})), Some(key.clone()));
        assert_ne!(memory(&dir, "b").key(&list), Some(key.clone()));
        assert_eq!(m.key(&json!({"id": 1, "method": "tools/call", "params": {}})), None);

        assert_eq!(m.recall(&key), None);
        let result = json!({"tools": [{"name": "a__b"}]});
        m.store(&key, "tools/list", &result);
        assert_eq!(m.recall(&key), Some(result));
        // A damaged file is no answer.
        std::fs::write(dir.join("shim").join(format!("{key}.json")), b"{not json").unwrap();
        assert_eq!(m.recall(&key), None);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn only_a_result_object_is_an_answer() {
        assert_eq!(result_of(br#"{"jsonrpc":"2.0","id":1,"result":{"tools":[]}}"#), Some(json!({"tools": []})));
        assert_eq!(result_of(br#"{"jsonrpc":"2.0","id":1,"error":{"code":-1,"message":"no"}}"#), None);
        assert_eq!(list_changed_method("tools/list"), Some("notifications/tools/list_changed"));
        assert_eq!(list_changed_method("initialize"), None);
    }

    #[test]
    fn a_listen_is_acknowledged_once_from_memory_or_by_the_daemon() {
        let dir = std::env::temp_dir().join(format!("coffer-shim-acks-{}", std::process::id()));
        let acks = Acks::new(Some(memory(&dir, "s")));
        let listen =
            json!({"id": "listen:0", "method": LISTEN, "params": {"notifications": {"toolsListChanged": true}}});
        let key = memory(&dir, "s").key(&listen).unwrap();
        let ack = |id: &str| json!({"jsonrpc": "2.0", "method": ACKNOWLEDGED, "params": {"_meta": {SUBSCRIPTION_ID_META: id}, "notifications": {"toolsListChanged": true}}});
        assert!(acks.pass(br#"{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}"#));
        // Nothing remembered yet: nothing given; the daemon's acknowledgment passes and is stored.
        assert_eq!(acks.give(&json!("listen:0"), &key), None);
        acks.watch(&json!("listen:0"), key.clone());
        assert!(acks.pass(ack("listen:0").to_string().as_bytes()));
        // Next time it is given at once, under the new request's id, and the daemon's is dropped once.
        assert_eq!(acks.give(&json!("listen:1"), &key), Some(ack("listen:1")));
        assert!(!acks.pass(ack("listen:1").to_string().as_bytes()));
        assert!(acks.pass(ack("listen:1").to_string().as_bytes()));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
