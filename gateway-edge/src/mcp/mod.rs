//! The MCP gateway: one downstream MCP server whose tools and prompts are the union of every
//! registered, enabled upstream (each name prefixed `<server>__`), plus Coffer's `coffer__*`
//! built-ins.
//!
//! Folders by step of a request, client side to server side:
//! - [`downstream`]: the transports (Streamable HTTP, the shim's `/mcp` stream), decoding and
//!   classifying messages, the client's protocol eras, `subscriptions/listen`;
//! - [`session`]: one client's [`Session`], which composes routing (`session/route.rs`),
//!   relays, progress, the upstream pool, client input rounds (`mrtr`) and what it sends its
//!   client (`outbound`);
//! - [`upstream`]: one connection to an upstream server (stdio, Streamable HTTP and its SSE
//!   streams), its eras and the wire format of its input requests;
//! - [`builtin`]: Coffer's own `coffer__*` tools (search, knowledge/memory/skills, ask).
//!
//! The core pieces every step shares stay here: what a request produced ([`answer::Answer`]),
//! JSON-RPC codes ([`jsonrpc`]), policy ([`policy`]), the catalog of lists and names
//! ([`catalog`], [`naming`], the gateway-wide [`gateway_catalog`]), flow control ([`flow`]),
//! the invocation log ([`invocations`]), the client's identity ([`client`]), credential
//! resolution ([`resolver`]) and the tool broker ([`broker`]: sessions for Coffer's own callers,
//! chat over gRPC and REST). The test seams of the core: a fixed
//! [`crate::snapshot::SnapshotHandle::fixed`], [`invocations::Recorder::in_memory`] and a
//! [`resolver::CredentialResolver`].
//!
//! Boundaries (held by `tests/boundaries.rs` beside this file): no file here imports the edge's
//! `AppState` (the transports take the [`Gateway`] as an axum sub-state); `upstream/` imports
//! nothing from `session/`, `downstream/` or `builtin/`; `session/` imports from `downstream/`
//! only `era`; `builtin/` imports no session, transport or upstream.
pub mod answer;
pub mod broker;
pub mod builtin;
pub mod catalog;
pub mod client;
pub mod downstream;
pub mod flow;
pub mod gateway_catalog;
pub mod invocations;
pub mod jsonrpc;
pub mod naming;
pub mod policy;
pub mod profile;
pub mod resolver;
pub mod session;
#[cfg(test)]
mod tests;
pub mod upstream;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use coffer_api::daemon::{AgentSandboxes, SandboxStatus};
use coffer_api::servers::{ProbeCounts, ProbeReport, SandboxState, StartOutcome, UpstreamState, UpstreamStatus};
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

/// Per-server health as seen by all sessions, for `/v1/status`: how the last start went and
/// the error that stands now, if any. A stop Coffer asked for (a session ended, a registration
/// changed) is not an error; a successful start, list or call clears a standing one.
#[derive(Default)]
pub struct Health {
    map: Mutex<HashMap<String, Arc<ServerHealth>>>,
}

/// One server's health; upstreams hold it (see [`upstream::Upstream::answered`]) so that an
/// answer can clear a standing error without a map lookup.
#[derive(Default)]
pub struct ServerHealth {
    /// True while `record.error` is set: the call path reads only this.
    failing: std::sync::atomic::AtomicBool,
    record: Mutex<HealthRecord>,
}

/// What is known about one server since the daemon started (or since its registration last
/// changed).
#[derive(Default, Clone)]
struct HealthRecord {
    /// Registry version these facts are about; facts about an older one are dropped.
    version: i64,
    /// Whether the last start succeeded, and when (RFC 3339).
    last_start: Option<(bool, String)>,
    /// When the last successful start happened (to drop news of an older upstream's crash).
    started_at: Option<std::time::Instant>,
    /// The standing error and when it happened; cleared by a success.
    error: Option<(String, String)>,
    /// Names its last list of each kind gave more than once (later ones were dropped).
    duplicates: std::collections::BTreeMap<&'static str, Vec<String>>,
    /// A server registered as `http` was found to speak the legacy HTTP+SSE transport.
    legacy_sse: bool,
}

impl ServerHealth {
    /// The upstream answered: a standing error is over.
    pub fn answered(&self) {
        if self.failing.load(std::sync::atomic::Ordering::Relaxed) {
            self.clear();
        }
    }

    fn clear(&self) {
        let mut r = self.record.lock().expect("health");
        r.error = None;
        self.failing.store(false, std::sync::atomic::Ordering::Relaxed);
    }

    fn fail(&self, error: &str) {
        let mut r = self.record.lock().expect("health");
        r.error = Some((error.to_owned(), coffer_runtime::now_rfc3339()));
        self.failing.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// The record, reset first when it is about another registry version than `version`.
    fn for_version(&self, version: i64) -> std::sync::MutexGuard<'_, HealthRecord> {
        let mut r = self.record.lock().expect("health");
        if r.version != version {
            *r = HealthRecord { version, ..HealthRecord::default() };
            self.failing.store(false, std::sync::atomic::Ordering::Relaxed);
        }
        r
    }
}

impl Health {
    /// The health of `server`, created on first use.
    pub fn entry(&self, server: &str) -> Arc<ServerHealth> {
        self.map.lock().expect("health").entry(server.to_owned()).or_default().clone()
    }

    fn get(&self, server: &str) -> Option<Arc<ServerHealth>> {
        self.map.lock().expect("health").get(server).cloned()
    }

    /// `server` started: its last start is ok and a standing error is over. Returns its
    /// health for the upstream to hold.
    pub fn started(&self, server: &McpServer) -> Arc<ServerHealth> {
        let h = self.entry(&server.name);
        {
            let mut r = h.for_version(server.version);
            r.last_start = Some((true, coffer_runtime::now_rfc3339()));
            r.started_at = Some(std::time::Instant::now());
            r.error = None;
            h.failing.store(false, std::sync::atomic::Ordering::Relaxed);
        }
        h
    }

    /// `server` (registered as `http`) was found to speak the legacy HTTP+SSE transport: it is
    /// shown as `sse` ([`Health::transport`]) until its registration changes.
    pub fn spoke_legacy_sse(&self, server: &McpServer) {
        let h = self.entry(&server.name);
        h.for_version(server.version).legacy_sse = true;
    }

    /// The transport `server` speaks as far as is known: its registration's, or `sse` for an
    /// `http` registration found to speak the legacy HTTP+SSE transport (by its URL's
    /// `/sse`, or because its first `POST` was refused).
    pub fn transport(&self, server: &McpServer) -> coffer_proto::store::Transport {
        use coffer_proto::store::Transport;
        let t = server.transport();
        if t == Transport::Http
            && let Ok(url) = reqwest::Url::parse(server.url.trim())
            && (upstream::http::looks_legacy(&url) || self.record(&server.name, server.version).legacy_sse)
        {
            return Transport::Sse;
        }
        t
    }

    /// `server` failed to start with `error` (the cause, as the server's user needs it).
    pub fn start_failed(&self, server: &McpServer, error: &str) {
        let h = self.entry(&server.name);
        {
            let mut r = h.for_version(server.version);
            r.last_start = Some((false, coffer_runtime::now_rfc3339()));
        }
        h.fail(error);
    }

    /// A fault of a started `server` (a list failed or took too long, it closed the
    /// connection); it stands until the next success.
    pub fn failed(&self, server: &str, error: &str) {
        self.entry(server).fail(error);
    }

    /// An upstream of `server` crashed at `at` with `error` (its cause, found after the fact):
    /// recorded unless a start succeeded since, whose upstream is not the one that crashed.
    pub fn crashed(&self, server: &str, error: &str, at: std::time::Instant) {
        let h = self.entry(server);
        if h.record.lock().expect("health").started_at.is_some_and(|s| s > at) {
            return;
        }
        h.fail(error);
    }

    /// `server` listed its `kind` (`tools`, `prompts`, …): a standing error is over, and
    /// `duplicates` are the names that list gave more than once.
    pub fn listed(&self, server: &str, kind: &'static str, duplicates: Vec<String>) {
        let h = match (self.get(server), duplicates.is_empty()) {
            (Some(h), _) => h,
            (None, true) => return,
            (None, false) => self.entry(server),
        };
        h.answered();
        let mut r = h.record.lock().expect("health");
        if duplicates.is_empty() {
            r.duplicates.remove(kind);
        } else {
            r.duplicates.insert(kind, duplicates);
        }
    }

    /// What is known about `server` at registry `version` (nothing when only an older version
    /// was seen).
    fn record(&self, server: &str, version: i64) -> HealthRecord {
        match self.get(server) {
            Some(h) => {
                let r = h.record.lock().expect("health");
                if r.version == version || r.version == 0 { r.clone() } else { HealthRecord::default() }
            }
            None => HealthRecord::default(),
        }
    }
}

/// Why a stdio server's registered command cannot run now (deleted, not executable), if so.
fn command_problem(server: &McpServer) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    if server.transport() != coffer_proto::store::Transport::Stdio {
        return None;
    }
    if !server.command.contains('/') {
        // A bare name is resolved on this machine's PATH when the server starts.
        return match coffer_runtime::connect::which_on_path(&server.command) {
            Some(_) => None,
            None => Some(format!("command {} is not on this machine's PATH", server.command)),
        };
    }
    match std::fs::metadata(&server.command) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Some(format!("command {} does not exist", server.command))
        }
        Err(e) => Some(format!("cannot inspect command {}: {e}", server.command)),
        Ok(m) if !m.is_file() => Some(format!("command {} is not a file", server.command)),
        Ok(m) if m.permissions().mode() & 0o111 == 0 => Some(format!("command {} is not executable", server.command)),
        Ok(_) => None,
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
    /// The last list each registered server returned, for every session (kept in a cache file
    /// under `COFFER_HOME`, never in the database).
    pub lists: gateway_catalog::GatewayCatalog,
    /// HTTP upstreams' OAuth grants and sign-ins (kept in the credential store).
    pub oauth: Arc<upstream::http::oauth::OAuth>,
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
        let lists = gateway_catalog::GatewayCatalog::load(&home.root().join(gateway_catalog::CACHE_FILE));
        let oauth = upstream::http::oauth::OAuth::new(credentials.clone());
        Arc::new(Self { home, snapshot, health: Health::default(), recorder, credentials, builtins, lists, oauth })
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
    /// How long a client's list waits for servers the capability catalog does not know yet
    /// ([`settings::FIRST_LIST_TIMEOUT_MS`]): it then answers with what is ready, and the
    /// client gets `notifications/*/list_changed` when the rest arrive. Short enough for
    /// clients that give a server about 2 s to connect (Claude Code's headless mode).
    pub fn first_list_timeout(&self) -> Duration {
        Duration::from_millis(self.setting(&settings::FIRST_LIST_TIMEOUT_MS))
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

    /// Has every invocation queued so far written to the store ([`invocations::Recorder::flush`]),
    /// for a reader of the log; never called on the request path.
    pub async fn flush_invocations(&self) {
        self.recorder.flush().await;
    }

    /// Every invocation row written from now on, with its id
    /// ([`invocations::Recorder::subscribe`]); for `GET /v1/invocations/events`.
    pub fn watch_invocations(&self) -> tokio::sync::broadcast::Receiver<Arc<coffer_proto::store::Invocation>> {
        self.recorder.subscribe()
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
        self.record_with_usage(method, target, server, session, elapsed, outcome, None);
    }

    /// [`Shared::record`] with what an internal-agent run used (`coffer__ask`).
    #[allow(clippy::too_many_arguments)]
    pub fn record_with_usage(
        &self,
        method: &'static str,
        target: &str,
        server: &str,
        session: &Session,
        elapsed: Duration,
        outcome: Outcome,
        usage: Option<Box<invocations::Usage>>,
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
            usage,
            client: (session.actor == invocations::MCP_ACTOR).then(|| session.client.clone()),
            conversation: session.conversation.get().cloned(),
            profile: (session.actor == invocations::MCP_ACTOR).then(|| session.profile_name()),
        });
    }
}

/// How long a stopping gateway waits for the catalog's last cache write.
pub const CACHE_SAVE_GRACE: Duration = Duration::from_secs(2);

/// Owner of every downstream session, and of the broker's sessions ([`broker::Broker`]).
pub struct Gateway {
    pub shared: Arc<Shared>,
    sessions: Mutex<HashMap<String, Arc<Session>>>,
    /// Modern (2026-07-28) HTTP clients' sessions by scope ([`Gateway::modern_session`]): scope
    /// key → session id.
    modern: Mutex<HashMap<String, String>>,
    /// Sessions of in-house callers: chat over gRPC, REST's `/v1/tools*` in-process.
    pub broker: Arc<broker::Broker>,
    /// The task keeping the catalog's cache file, which writes it once more at shutdown:
    /// awaited by [`Gateway::catalog_saved`] so that a stop right after a server was listed
    /// keeps its list for the next start.
    cache_writer: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Gateway {
    /// Creates the gateway (recording invocations through `recorder`, resolving credentials
    /// through `credentials`, with the standard built-in tools, whose knowledge, memory and
    /// skill tools call `retrieval`: the one place they are registered) and starts its
    /// idle-session reaper, which ends with `shutdown`.
    pub fn new(
        home: CofferHome,
        credentials: Arc<dyn CredentialResolver>,
        snapshot: SnapshotHandle,
        recorder: invocations::Recorder,
        retrieval: crate::clients::retrieval::Client,
        llm: crate::clients::llm::Client,
        shutdown: CancellationToken,
    ) -> Arc<Self> {
        let builtins = builtin::ask_tool::register(builtin::Registry::standard(Some(retrieval)), llm);
        let shared = Shared::new(home, snapshot, recorder, credentials, builtins);
        Self::with_shared(shared, shutdown)
    }

    /// A gateway over `shared` (see [`Shared::new`]); starts its idle-session reaper, the task
    /// that fills the capability catalog from the registry and the one that keeps its cache
    /// file, which end with `shutdown`.
    pub fn with_shared(shared: Arc<Shared>, shutdown: CancellationToken) -> Arc<Self> {
        tokio::spawn(gateway_catalog::follow(shared.clone(), shutdown.clone()));
        let cache_writer = tokio::spawn(gateway_catalog::persist(shared.clone(), shutdown.clone()));
        let broker = Arc::new(broker::Broker::new(shared.clone()));
        let gw = Arc::new(Self {
            shared,
            sessions: Mutex::default(),
            modern: Mutex::default(),
            broker,
            cache_writer: Mutex::new(Some(cache_writer)),
        });
        tokio::spawn(reap_idle(Arc::downgrade(&gw), shutdown));
        gw
    }

    /// After `shutdown`: waits (at most [`CACHE_SAVE_GRACE`]) until the catalog's cache file has
    /// been written for the last time, so the next start restores every server listed until
    /// now (without this, the process could exit before that write; `first_contact` found a
    /// server listed 200 ms before a restart missing from the next first list).
    pub async fn catalog_saved(&self) {
        let writer = self.cache_writer.lock().expect("cache writer").take();
        if let Some(writer) = writer
            && tokio::time::timeout(CACHE_SAVE_GRACE, writer).await.is_err()
        {
            tracing::warn!("The capability catalog's cache file was not written in time at shutdown.");
        }
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

    /// The gateway session of a modern (2026-07-28) client that reaches `/mcp` directly over
    /// HTTP, created on its first request. Modern clients have no protocol session, so Coffer
    /// scopes one per `scope` (see `http.rs`: the credential and the client's identity) so that
    /// a stateful upstream keeps its state between one client's calls and two clients never
    /// share upstream processes. The session is reaped when idle like any other; the next
    /// request then gets a new one (and so does a request after a daemon restart).
    pub fn modern_session(&self, scope: &str, meta: &downstream::era::Meta) -> Arc<Session> {
        let mut modern = self.modern.lock().expect("modern sessions");
        if let Some(s) = modern.get(scope).and_then(|id| self.session(id)) {
            return s;
        }
        let s = self.create_session(&meta.version, &meta.init_params());
        modern.retain(|_, id| self.sessions.lock().expect("sessions").contains_key(id));
        modern.insert(scope.to_owned(), s.id.clone());
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
        self.broker.invalidate_all();
        sessions.len()
    }

    /// Every live MCP client session as `GET /v1/status` shows it (issue 36 §1), most recently
    /// active first.
    pub fn session_status(&self) -> Vec<coffer_api::daemon::McpSessionStatus> {
        let sessions: Vec<Arc<Session>> = self.sessions.lock().expect("sessions").values().cloned().collect();
        let mut out: Vec<coffer_api::daemon::McpSessionStatus> = sessions
            .iter()
            .map(|s| coffer_api::daemon::McpSessionStatus {
                id: s.id.chars().take(8).collect(),
                client_name: s.client.name.clone(),
                client_version: s.client.version.clone(),
                profile: s.profile_name().to_string(),
                protocol_version: s.protocol_version.clone(),
                idle_s: s.idle_for().as_secs(),
            })
            .collect();
        out.sort_by(|a, b| a.idle_s.cmp(&b.idle_s).then_with(|| a.id.cmp(&b.id)));
        out
    }

    /// Number of live downstream sessions.
    pub fn session_count(&self) -> usize {
        self.sessions.lock().expect("sessions").len()
    }

    /// Starts `server` once in a fresh, short-lived session and reports its `initialize`
    /// result, capability counts and timing (`coffer mcp test`), its `transport`, `warnings`
    /// (e.g. lines on stdout that are not JSON-RPC, which MCP forbids there) and `log`: the
    /// path of its stderr log when one exists (HTTP upstreams have none). The session is
    /// closed after.
    pub async fn probe(&self, server: &coffer_proto::store::McpServer) -> ProbeReport {
        let params = json!({"protocolVersion": SUPPORTED_VERSIONS[0], "capabilities": {}, "clientInfo": {"name": "coffer-test", "version": coffer_runtime::VERSION}});
        let s = Session::new(
            format!("probe-{}", uuid::Uuid::new_v4().simple()),
            SUPPORTED_VERSIONS[0].into(),
            &params,
            self.shared.clone(),
        );
        let started = std::time::Instant::now();
        let mut counts = ProbeCounts::default();
        let mut error: Option<String> = None;
        let mut initialize_ms = None;
        for kind in [session::ListKind::Tools, session::ListKind::Prompts, session::ListKind::Resources] {
            match s.fetch_server(server, kind).await {
                Ok(items) => {
                    let n = Some(items.len() as u64);
                    match kind {
                        session::ListKind::Tools => counts.tools = n,
                        session::ListKind::Prompts => counts.prompts = n,
                        _ => counts.resources = n,
                    }
                }
                Err(e) => {
                    error = Some(e.to_string());
                    break;
                }
            }
            if kind == session::ListKind::Tools {
                initialize_ms = Some(started.elapsed().as_millis() as u64);
            }
        }
        let mut warnings: Vec<String> = Vec::new();
        let (mut protocol_version, mut server_info, mut capabilities) = (None, None, None);
        if let Some(up) = s.pool.running(&server.name).await {
            let init = &up.init_result;
            protocol_version = Some(init.get("protocolVersion").and_then(Value::as_str).map(str::to_owned));
            server_info = Some(init.get("serverInfo").cloned().filter(|v| !v.is_null()));
            capabilities = Some(init.get("capabilities").cloned().filter(|v| !v.is_null()));
            warnings.extend(up.junk_note());
        }
        let log = self.shared.home.upstream_logs().join(format!("{}.log", server.name));
        let report = ProbeReport {
            server: server.name.clone(),
            initialize_ms,
            protocol_version,
            server_info,
            capabilities,
            transport: transport_view(self.shared.health.transport(server)),
            warnings,
            log: log.exists().then(|| log.display().to_string()),
            elapsed_ms: started.elapsed().as_millis() as u64,
            counts,
            ok: error.is_none(),
            error,
        };
        s.close().await;
        report
    }

    /// Ends every session, the broker's too, and their upstream children (shutdown).
    pub async fn close_all(&self) {
        let all: Vec<Arc<Session>> = self.sessions.lock().expect("sessions").drain().map(|(_, s)| s).collect();
        let sessions = futures_util::future::join_all(all.iter().map(|s| s.close()));
        tokio::join!(sessions, self.broker.close_all(), self.shared.lists.close_starts());
    }
    /// The vault sandbox for `GET /v1/status`: `{landlock_abi, summary, agents: {claude_code,
    /// codex}}`; `landlock_abi` is the kernel's Landlock ABI version (`null`: no Landlock,
    /// nothing is confined), each agent `on`, `off` (its `chat.*_sandbox` setting is 0) or
    /// `unavailable`. Each upstream's own state is in its `upstreams[].sandbox`.
    pub fn sandbox_status(&self) -> SandboxStatus {
        let abi = coffer_runtime::sandbox::kernel_abi();
        let agent = |s: &Setting| match (self.shared.setting(s), abi) {
            (0, _) => SandboxState::Off,
            (_, Some(_)) => SandboxState::On,
            (_, None) => SandboxState::Unavailable,
        };
        SandboxStatus {
            landlock_abi: abi,
            summary: coffer_runtime::sandbox::support_summary(),
            agents: AgentSandboxes {
                claude_code: agent(&settings::CHAT_CLAUDE_CODE_SANDBOX),
                codex: agent(&settings::CHAT_CODEX_SANDBOX),
            },
        }
    }

    /// Per-upstream status for `/v1/status`, one per registered server in name order (see
    /// [`UpstreamStatus`]): `state` is `ok` when its last start succeeded and nothing failed
    /// since, `unhealthy` when an error stands (or its command cannot run now), `idle` when not
    /// started since the daemon started or its registration changed, or `disabled`;
    /// `duplicates` are the names its last lists gave more than once, as `tools/<name>` (only
    /// the first of each is offered).
    pub fn upstream_status(&self) -> Vec<UpstreamStatus> {
        let snap = self.shared.snapshot.current();
        let mut running: HashMap<String, usize> = HashMap::new();
        for s in self.sessions.lock().expect("sessions").values() {
            for n in s.running_upstreams() {
                *running.entry(n).or_default() += 1;
            }
        }
        let mut names: Vec<&String> = snap.servers.keys().collect();
        names.sort();
        names
            .into_iter()
            .map(|n| {
                let s = &snap.servers[n];
                let record = self.shared.health.record(n, s.version);
                let problem = if s.enabled { command_problem(s) } else { None };
                let (last_error, last_error_at) = match (problem, record.error) {
                    (Some(p), _) => (Some(p), None),
                    (None, Some((e, at))) => (Some(e), Some(at)),
                    (None, None) => (None, None),
                };
                let state = if !s.enabled {
                    UpstreamState::Disabled
                } else if last_error.is_some() {
                    UpstreamState::Unhealthy
                } else if matches!(record.last_start, Some((true, _))) {
                    UpstreamState::Ok
                } else {
                    UpstreamState::Idle
                };
                let (last_start, last_start_at) = match record.last_start {
                    Some((ok, at)) => (Some(if ok { StartOutcome::Ok } else { StartOutcome::Failed }), Some(at)),
                    None => (None, None),
                };
                let duplicates: Vec<String> = record
                    .duplicates
                    .iter()
                    .flat_map(|(kind, names)| names.iter().map(move |d| format!("{kind}/{d}")))
                    .collect();
                UpstreamStatus {
                    name: n.clone(),
                    enabled: s.enabled,
                    transport: transport_view(self.shared.health.transport(s)),
                    state,
                    running: running.get(n).copied().unwrap_or(0) as u64,
                    last_start,
                    last_start_at,
                    last_error,
                    last_error_at,
                    duplicates,
                    sandbox: sandbox_state(s),
                    catalog: self.shared.lists.status(n, snap.generation(s)),
                    auth: None,
                }
            })
            .collect()
    }
}

/// A registered transport as the REST contract names it. The store refuses `Unspecified`, so
/// it never reaches here; it would read as stdio.
pub fn transport_view(t: coffer_proto::store::Transport) -> coffer_api::servers::Transport {
    use coffer_proto::store::Transport;
    match t {
        Transport::Http => coffer_api::servers::Transport::Http,
        Transport::Sse => coffer_api::servers::Transport::Sse,
        Transport::Stdio | Transport::Unspecified => coffer_api::servers::Transport::Stdio,
    }
}

/// A server's vault sandbox as `GET /v1/status` shows it: `on` (confined), `off` (its
/// registration opted out), `unavailable` (asked for, but this kernel has no Landlock: it runs
/// unconfined), `None` for an http server (nothing is spawned).
fn sandbox_state(s: &McpServer) -> Option<SandboxState> {
    if s.transport() != coffer_proto::store::Transport::Stdio {
        None
    } else if s.no_sandbox {
        Some(SandboxState::Off)
    } else if coffer_runtime::sandbox::kernel_abi().is_some() {
        Some(SandboxState::On)
    } else {
        Some(SandboxState::Unavailable)
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
