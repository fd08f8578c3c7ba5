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
//! [`resolver::CredentialResolver`].
pub mod answer;
pub mod builtin;
pub mod catalog;
pub mod gateway_catalog;
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
use secrecy::SecretString;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::snapshot::SnapshotHandle;
use resolver::CredentialResolver;
pub use session::Session;

/// Protocol revisions `/mcp` negotiates, newest first (MCP 2025-11-25 lifecycle §version
/// negotiation: answer the client's version if supported, else our latest).
pub const SUPPORTED_VERSIONS: &[&str] = &["2025-11-25", "2025-06-18", "2025-03-26"];

/// Invocation outcome as stored in `mcp_invocations`.
#[derive(Debug, Clone, Copy)]
pub enum Outcome {
    Ok,
    UpstreamError,
    Disabled,
    Timeout,
    Unreachable,
    Invalid,
    /// The client cancelled the request (`notifications/cancelled`), or the upstream answered
    /// it with -32800.
    Cancelled,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::UpstreamError => "upstream_error",
            Outcome::Disabled => "disabled",
            Outcome::Timeout => "timeout",
            Outcome::Unreachable => "unreachable",
            Outcome::Invalid => "invalid",
            Outcome::Cancelled => "cancelled",
        }
    }
}

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
    /// The last list each registered server returned, for every session (never persisted).
    pub lists: gateway_catalog::GatewayCatalog,
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
        Arc::new(Self {
            home,
            snapshot,
            health: Health::default(),
            recorder,
            credentials,
            builtins,
            lists: gateway_catalog::GatewayCatalog::default(),
        })
    }

    /// A numeric setting, or `default` when unset, unparsable or zero; capped at 30 days so a
    /// hand-written huge value can never overflow a deadline.
    fn setting_u64(&self, key: &str, default: u64) -> u64 {
        let v = self.snapshot.current().settings.get(key).and_then(|v| v.trim().parse::<u64>().ok()).filter(|v| *v > 0);
        v.unwrap_or(default).min(30 * 24 * 3600 * 1000)
    }
    fn setting_ms(&self, key: &str, default: u64) -> Duration {
        Duration::from_millis(self.setting_u64(key, default))
    }
    /// Deadline for one upstream's part of a list fan-out (`gateway.list_timeout_ms`, 10 s).
    pub fn list_timeout(&self) -> Duration {
        self.setting_ms("gateway.list_timeout_ms", 10_000)
    }
    /// How long a client's list waits for servers the capability catalog does not know yet
    /// (`gateway.first_list_timeout_ms`, 1 s): it then answers with what is ready, and the
    /// client gets `notifications/*/list_changed` when the rest arrive. Short enough for
    /// clients that give a server about 2 s to connect (Claude Code's headless mode).
    pub fn first_list_timeout(&self) -> Duration {
        self.setting_ms("gateway.first_list_timeout_ms", 1_000)
    }
    /// Deadline for an upstream's start and `initialize` (`gateway.start_timeout_ms`, 30 s).
    pub fn start_timeout(&self) -> Duration {
        self.setting_ms("gateway.start_timeout_ms", 30_000)
    }
    /// Default per-call timeout (`gateway.call_timeout_ms`, 60 s); a server's own wins.
    pub fn call_timeout(&self) -> Duration {
        self.setting_ms("gateway.call_timeout_ms", 60_000)
    }
    /// Session idle timeout (`gateway.session_idle_timeout_s`, 30 min).
    pub fn idle_timeout(&self) -> Duration {
        Duration::from_secs(self.setting_u64("gateway.session_idle_timeout_s", 1800).min(30 * 24 * 3600))
    }
    /// Longest exposed name (`gateway.max_tool_name_len`, 51).
    pub fn max_name_len(&self) -> usize {
        self.snapshot
            .current()
            .settings
            .get("gateway.max_tool_name_len")
            .and_then(|v| v.parse().ok())
            .unwrap_or(naming::DEFAULT_MAX_LEN)
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
    /// server) is cut and ends in `…`, so a batch always fits one store request.
    pub fn record(
        &self,
        method: &'static str,
        target: &str,
        server: &str,
        session: &str,
        elapsed: Duration,
        outcome: Outcome,
    ) {
        self.recorder.record(invocations::Record {
            at: std::time::SystemTime::now(),
            method,
            target: invocations::recorded(target, invocations::MAX_RECORDED_TARGET),
            server: invocations::recorded(server, invocations::MAX_RECORDED_SERVER),
            session_id: session.to_owned(),
            duration: elapsed,
            outcome,
            trace_id: coffer_runtime::grpc::current_trace().unwrap_or_default(),
        });
    }
}

/// Owner of every downstream session.
pub struct Gateway {
    pub shared: Arc<Shared>,
    sessions: Mutex<HashMap<String, Arc<Session>>>,
    admin: tokio::sync::Mutex<Option<Arc<Session>>>,
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

    /// A gateway over `shared` (see [`Shared::new`]); starts its idle-session reaper and the
    /// task that fills the capability catalog from the registry, which end with `shutdown`.
    pub fn with_shared(shared: Arc<Shared>, shutdown: CancellationToken) -> Arc<Self> {
        tokio::spawn(gateway_catalog::follow(shared.clone(), shutdown.clone()));
        let gw = Arc::new(Self { shared, sessions: Mutex::default(), admin: tokio::sync::Mutex::new(None) });
        tokio::spawn(reap_idle(Arc::downgrade(&gw), shutdown));
        gw
    }

    /// Creates and registers a session for an `initialize` with `params`; returns it.
    pub fn create_session(&self, protocol_version: &str, params: &Value) -> Arc<Session> {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let s = Session::new(id.clone(), protocol_version.to_owned(), params, self.shared.clone());
        // Servers registered or changed later are started in the background for clients like it.
        self.shared.lists.remember_client(s.pool.init_params());
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
        self.shared.lists.invalidate(None);
        let sessions: Vec<Arc<Session>> = self.sessions.lock().expect("sessions").values().cloned().collect();
        for s in &sessions {
            s.invalidate(None);
            s.notify_client("notifications/tools/list_changed", None);
            s.notify_client("notifications/prompts/list_changed", None);
        }
        if let Ok(a) = self.admin.try_lock()
            && let Some(s) = a.as_ref()
        {
            s.invalidate(None);
        }
        sessions.len()
    }

    /// Number of live downstream sessions.
    pub fn session_count(&self) -> usize {
        self.sessions.lock().expect("sessions").len()
    }

    /// A long-lived internal session for REST (`/v1/tools`, capabilities), created on demand.
    pub async fn admin_session(&self) -> Arc<Session> {
        let mut a = self.admin.lock().await;
        if let Some(s) = a.as_ref() {
            s.touch();
            return s.clone();
        }
        let params = json!({"protocolVersion": SUPPORTED_VERSIONS[0], "capabilities": {}, "clientInfo": {"name": "coffer-admin", "version": coffer_runtime::VERSION}});
        // REST callers get no list_changed: their lists wait for servers not listed yet.
        let s = Session::with_patience(
            format!("admin-{}", uuid::Uuid::new_v4().simple()),
            SUPPORTED_VERSIONS[0].into(),
            &params,
            self.shared.clone(),
            true,
        );
        *a = Some(s.clone());
        s
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

    /// Ends every session and its upstream children (shutdown).
    pub async fn close_all(&self) {
        let all: Vec<Arc<Session>> = self.sessions.lock().expect("sessions").drain().map(|(_, s)| s).collect();
        let admin = self.admin.lock().await.take();
        futures_util::future::join_all(all.iter().chain(admin.iter()).map(|s| s.close())).await;
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
                        "name": n, "enabled": s.enabled, "transport": s.transport, "state": state,
                        "running": running.get(n).copied().unwrap_or(0),
                        "last_error": if err.is_empty() { Value::Null } else { Value::String(err) },
                        "last_error_at": if at.is_empty() { Value::Null } else { Value::String(at) },
                        "catalog": self.shared.lists.status(n, snap.generation(s)),
                    })
                })
                .collect(),
        )
    }
}

/// Ends sessions idle for longer than the idle timeout (an open GET stream alone does not count
/// as traffic).
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
        let admin_idle = gw.admin.lock().await.as_ref().is_some_and(|s| s.idle_for() > Duration::from_secs(120));
        if admin_idle && let Some(s) = gw.admin.lock().await.take() {
            s.close().await;
        }
    }
}
