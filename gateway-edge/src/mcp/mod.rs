//! The MCP gateway: one downstream MCP server whose tools and prompts are the union of every
//! registered, enabled upstream (each name prefixed `<server>__`), plus Coffer's `coffer__*`
//! built-ins.
//!
//! One file per step of a request: the transports ([`http`] Streamable HTTP, [`stream`] the
//! shim's `/mcp` stream) decode and classify messages ([`message`]) and hand them to a
//! [`session::Session`], which composes routing (`route.rs`), policy ([`policy`]), the catalog
//! of lists and names ([`catalog`], [`naming`]), the upstream pool ([`pool`]) and relays
//! ([`relay`]); upstream connections are [`upstream`] (stdio) and [`http_upstream`]. What a
//! request produced is an [`answer::Answer`]. The test seams of the core: a fixed
//! [`crate::snapshot::SnapshotHandle::fixed`], [`invocations::Recorder::in_memory`] and a
//! [`resolver::CredentialResolver`]. Coffer's own callers (chat over gRPC, REST) get sessions
//! of their own through the tool broker ([`broker`]).
pub mod answer;
pub mod broker;
pub mod builtin;
pub mod catalog;
pub mod http;
pub mod http_upstream;
pub mod invocations;
pub mod jsonrpc;
pub mod message;
pub mod naming;
pub mod outbound;
pub mod policy;
pub mod pool;
pub mod relay;
pub mod resolver;
mod route;
pub mod session;
pub mod stream;
#[cfg(test)]
mod tests;
pub mod upstream;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use coffer_proto::store::McpServer;
use coffer_runtime::home::CofferHome;
use coffer_types::settings::{self, Setting};
use secrecy::SecretString;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::snapshot::SnapshotHandle;
use resolver::CredentialResolver;
pub use session::Session;

/// Protocol revisions `/mcp` negotiates, newest first (MCP 2025-11-25 lifecycle §version
/// negotiation: answer the client's version if supported, else our latest).
pub const SUPPORTED_VERSIONS: &[&str] = &["2025-11-25", "2025-06-18", "2025-03-26"];

/// Invocation outcome as stored in `mcp_invocations` (one vocabulary, in `coffer-types`).
pub use coffer_types::Outcome;

/// Per-server health as seen by all sessions, for `/v1/status`.
#[derive(Default)]
pub struct Health {
    map: Mutex<HashMap<String, (bool, String, String)>>, // healthy, last_error, at
}

impl Health {
    fn started(&self, server: &str) {
        let mut m = self.map.lock().expect("health");
        let e = m.entry(server.to_owned()).or_default();
        e.0 = true;
    }
    fn failed(&self, server: &str, error: &str) {
        let mut m = self.map.lock().expect("health");
        m.insert(server.to_owned(), (false, error.to_owned(), coffer_runtime::now_rfc3339()));
    }
}

/// State every session shares.
pub struct Shared {
    pub home: CofferHome,
    pub snapshot: SnapshotHandle,
    pub health: Health,
    recorder: invocations::Recorder,
    /// For resolving credential references when an upstream starts.
    credentials: Arc<dyn CredentialResolver>,
    /// Coffer's own `coffer__*` tools.
    pub builtins: builtin::Registry,
}

impl Shared {
    /// What every session of one gateway shares: `home` (logs, pid records, working
    /// directories), the policy `snapshot`, where invocations are recorded, where credential
    /// values come from, and the built-in tools.
    pub fn new(
        home: CofferHome,
        snapshot: SnapshotHandle,
        recorder: invocations::Recorder,
        credentials: Arc<dyn CredentialResolver>,
        builtins: builtin::Registry,
    ) -> Arc<Self> {
        Arc::new(Self { home, snapshot, health: Health::default(), recorder, credentials, builtins })
    }

    /// The value of `setting` in the current snapshot: its default when unset or not a value the
    /// settings table accepts (the daemon refuses such values; only one stored by hand or before
    /// the table existed can be), so every deadline is within the table's bounds.
    pub fn setting(&self, setting: &Setting) -> u64 {
        setting.value_or_default(self.snapshot.current().settings.get(setting.key).map(String::as_str))
    }
    /// Deadline for one upstream's part of a list fan-out ([`settings::LIST_TIMEOUT_MS`]).
    pub fn list_timeout(&self) -> Duration {
        Duration::from_millis(self.setting(&settings::LIST_TIMEOUT_MS))
    }
    /// Deadline for an upstream's start and `initialize` ([`settings::START_TIMEOUT_MS`]).
    pub fn start_timeout(&self) -> Duration {
        Duration::from_millis(self.setting(&settings::START_TIMEOUT_MS))
    }
    /// Default per-call timeout ([`settings::CALL_TIMEOUT_MS`]); a server's own wins.
    pub fn call_timeout(&self) -> Duration {
        Duration::from_millis(self.setting(&settings::CALL_TIMEOUT_MS))
    }
    /// Session idle timeout ([`settings::SESSION_IDLE_TIMEOUT_S`]).
    pub fn idle_timeout(&self) -> Duration {
        Duration::from_secs(self.setting(&settings::SESSION_IDLE_TIMEOUT_S))
    }
    /// Broker session idle timeout ([`settings::BROKER_IDLE_TIMEOUT_S`]).
    pub fn broker_idle_timeout(&self) -> Duration {
        Duration::from_secs(self.setting(&settings::BROKER_IDLE_TIMEOUT_S))
    }
    /// Longest exposed name ([`settings::MAX_TOOL_NAME_LEN`]).
    pub fn max_name_len(&self) -> usize {
        self.setting(&settings::MAX_TOOL_NAME_LEN) as usize
    }

    /// `server` with every credential reference in its `env` and `headers` replaced by the
    /// credential's value (from the [`CredentialResolver`]: the store, decrypted there), and the values used, so the caller
    /// can redact them from the upstream's stderr. Call it right before starting the upstream;
    /// the result must not outlive the start.
    ///
    /// # Errors
    /// A message naming the first credential that does not exist or cannot be read (never a
    /// value).
    pub async fn resolve_server(&self, server: &McpServer) -> Result<(McpServer, Vec<SecretString>), String> {
        let names = crate::credentials::referenced([&server.env, &server.headers]);
        if names.is_empty() {
            return Ok((server.clone(), Vec::new()));
        }
        let values = self.credentials.resolve(names.into_iter().collect()).await?;
        let mut resolved = server.clone();
        let used = crate::credentials::substitute(&mut resolved, &values)
            .map_err(|name| format!("credential {name:?} not found"))?;
        Ok((resolved, used))
    }

    /// Queues an invocation record (written in batches by the invocation writer, off the
    /// request path; see [`invocations`]). Fields a client chooses are bounded there: a target
    /// longer than [`invocations::MAX_RECORDED_TARGET`] bytes (a long resource URI) or a server
    /// part longer than [`invocations::MAX_RECORDED_SERVER`] (of a name that resolves to no
    /// server) is cut and ends in `…`, so a batch always fits one store request. The record names
    /// `session`'s id and actor ([`Session::actor`]: borrowed for MCP sessions, so recording it
    /// allocates nothing).
    pub fn record(
        &self,
        method: &'static str,
        target: &str,
        server: &str,
        session: &Session,
        elapsed: Duration,
        outcome: Outcome,
    ) {
        self.recorder.record(invocations::Record {
            at: std::time::SystemTime::now(),
            method,
            target: invocations::recorded(target, invocations::MAX_RECORDED_TARGET),
            server: invocations::recorded(server, invocations::MAX_RECORDED_SERVER),
            session_id: session.id.clone(),
            duration: elapsed,
            outcome,
            trace_id: coffer_runtime::grpc::current_trace().unwrap_or_default(),
            actor: session.actor.clone(),
        });
    }
}

/// Owner of every downstream session, and of the broker's sessions ([`broker::Broker`]).
pub struct Gateway {
    pub shared: Arc<Shared>,
    sessions: Mutex<HashMap<String, Arc<Session>>>,
    /// Sessions of in-house callers: chat over gRPC, REST's `/v1/tools*` in-process.
    pub broker: Arc<broker::Broker>,
}

impl Gateway {
    /// Creates the gateway (recording invocations through `recorder`, resolving credentials
    /// through `credentials`, with the standard built-in tools: the one place they are
    /// registered) and starts its idle-session reaper, which ends with `shutdown`.
    pub fn new(
        home: CofferHome,
        credentials: Arc<dyn CredentialResolver>,
        snapshot: SnapshotHandle,
        recorder: invocations::Recorder,
        shutdown: CancellationToken,
    ) -> Arc<Self> {
        let shared = Shared::new(home, snapshot, recorder, credentials, builtin::Registry::standard());
        Self::with_shared(shared, shutdown)
    }

    /// A gateway over `shared` (see [`Shared::new`]); starts its idle-session reaper, which
    /// ends with `shutdown`.
    pub fn with_shared(shared: Arc<Shared>, shutdown: CancellationToken) -> Arc<Self> {
        let broker = Arc::new(broker::Broker::new(shared.clone()));
        let gw = Arc::new(Self { shared, sessions: Mutex::default(), broker });
        tokio::spawn(reap_idle(Arc::downgrade(&gw), shutdown));
        gw
    }

    /// Creates and registers a session for an `initialize` with `params`; returns it.
    pub fn create_session(&self, protocol_version: &str, params: &Value) -> Arc<Session> {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let s = Session::new(id.clone(), protocol_version.to_owned(), params, self.shared.clone());
        self.sessions.lock().expect("sessions").insert(id, s.clone());
        tracing::info!(session = %s.id, protocol = %protocol_version, "MCP session started.");
        s
    }

    pub fn session(&self, id: &str) -> Option<Arc<Session>> {
        self.sessions.lock().expect("sessions").get(id).cloned()
    }

    /// Ends session `id`; false if unknown.
    pub async fn end_session(&self, id: &str, why: &str) -> bool {
        let s = self.sessions.lock().expect("sessions").remove(id);
        match s {
            Some(s) => {
                s.close().await;
                tracing::info!(session = %id, reason = why, "MCP session ended.");
                true
            }
            None => false,
        }
    }

    /// Invalidates every session's capability cache and notifies each client; returns how many
    /// sessions were refreshed.
    pub fn refresh_all(&self) -> usize {
        let sessions: Vec<Arc<Session>> = self.sessions.lock().expect("sessions").values().cloned().collect();
        for s in &sessions {
            s.invalidate(None);
            s.notify_client("notifications/tools/list_changed", None);
            s.notify_client("notifications/prompts/list_changed", None);
        }
        self.broker.invalidate_all();
        sessions.len()
    }

    /// Number of live downstream sessions.
    pub fn session_count(&self) -> usize {
        self.sessions.lock().expect("sessions").len()
    }

    /// Starts `server` once in a fresh, short-lived session and reports its `initialize`
    /// result, capability counts and timing (`coffer mcp test`). The session is closed after.
    pub async fn probe(&self, server: &coffer_proto::store::McpServer) -> Value {
        let params = json!({"protocolVersion": SUPPORTED_VERSIONS[0], "capabilities": {}, "clientInfo": {"name": "coffer-test", "version": coffer_runtime::VERSION}});
        let s = Session::new(
            format!("probe-{}", uuid::Uuid::new_v4().simple()),
            SUPPORTED_VERSIONS[0].into(),
            &params,
            self.shared.clone(),
        );
        let started = std::time::Instant::now();
        let mut report = json!({"server": server.name});
        let mut counts = serde_json::Map::new();
        let mut error: Option<String> = None;
        for kind in [session::ListKind::Tools, session::ListKind::Prompts, session::ListKind::Resources] {
            match s.fetch_server(server, kind).await {
                Ok(items) => {
                    counts.insert(kind.key().to_owned(), json!(items.len()));
                }
                Err(e) => {
                    error = Some(e.to_string());
                    break;
                }
            }
            if kind == session::ListKind::Tools {
                report["initialize_ms"] = json!(started.elapsed().as_millis() as u64);
            }
        }
        if let Some(init) = s.upstream_init(&server.name).await {
            report["protocol_version"] = init.get("protocolVersion").cloned().unwrap_or(Value::Null);
            report["server_info"] = init.get("serverInfo").cloned().unwrap_or(Value::Null);
            report["capabilities"] = init.get("capabilities").cloned().unwrap_or(Value::Null);
        }
        report["elapsed_ms"] = json!(started.elapsed().as_millis() as u64);
        report["counts"] = Value::Object(counts);
        report["ok"] = json!(error.is_none());
        report["error"] = error.map(Value::String).unwrap_or(Value::Null);
        s.close().await;
        report
    }

    /// Ends every session, the broker's too, and their upstream children (shutdown).
    pub async fn close_all(&self) {
        let all: Vec<Arc<Session>> = self.sessions.lock().expect("sessions").drain().map(|(_, s)| s).collect();
        let sessions = futures_util::future::join_all(all.iter().map(|s| s.close()));
        tokio::join!(sessions, self.broker.close_all());
    }

    /// Per-upstream status for `/v1/status`: running instances across sessions and last error.
    pub fn upstream_status(&self) -> Value {
        let snap = self.shared.snapshot.current();
        let mut running: HashMap<String, usize> = HashMap::new();
        for s in self.sessions.lock().expect("sessions").values() {
            for n in s.running_upstreams() {
                *running.entry(n).or_default() += 1;
            }
        }
        let health = self.shared.health.map.lock().expect("health");
        let mut names: Vec<&String> = snap.servers.keys().collect();
        names.sort();
        Value::Array(
            names
                .into_iter()
                .map(|n| {
                    let s = &snap.servers[n];
                    let (healthy, err, at) = health.get(n).cloned().unwrap_or((true, String::new(), String::new()));
                    let state = if !s.enabled {
                        "disabled"
                    } else if healthy {
                        "ok"
                    } else {
                        "unhealthy"
                    };
                    json!({
                        "name": n, "enabled": s.enabled, "transport": s.transport().as_str(), "state": state,
                        "running": running.get(n).copied().unwrap_or(0),
                        "last_error": if err.is_empty() { Value::Null } else { Value::String(err) },
                        "last_error_at": if at.is_empty() { Value::Null } else { Value::String(at) },
                    })
                })
                .collect(),
        )
    }
}

/// Ends sessions idle for longer than the idle timeout (an open GET stream alone does not count
/// as traffic), and broker sessions idle for longer than theirs.
async fn reap_idle(gw: std::sync::Weak<Gateway>, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(5)) => {}
        }
        let Some(gw) = gw.upgrade() else { return };
        let limit = gw.shared.idle_timeout();
        let idle: Vec<String> = gw
            .sessions
            .lock()
            .expect("sessions")
            .iter()
            .filter(|(_, s)| s.idle_for() > limit)
            .map(|(id, _)| id.clone())
            .collect();
        for id in idle {
            gw.end_session(&id, "idle timeout").await;
        }
        gw.broker.reap_idle(gw.shared.broker_idle_timeout()).await;
    }
}
