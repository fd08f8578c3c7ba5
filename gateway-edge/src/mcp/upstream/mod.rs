//! One upstream MCP server connection owned by one downstream session, over either transport:
//! stdio ([`stdio`]: MCP 2025-11-25 basic/transports §stdio, newline-delimited JSON-RPC on the
//! child's stdin/stdout, stderr drained into `logs/upstreams/<server>.log`) or Streamable HTTP
//! ([`http`], its SSE streams in `http/sse.rs`). What the two share is here: the
//! transport-independent [`Core`] (matching responses to requests), the session's event queue
//! ([`events`]), and [`Upstream`] (start, era probe, requests, stop). The eras an upstream may
//! speak are [`era`]; the wire format of a modern upstream's `InputRequiredResult` is [`mrtr`].
//!
//! Boundary: nothing here imports the session, the downstream transports or the edge's state;
//! a session drives an upstream through [`Upstream`] and hears from it through [`EventQueue`].
//!
//! The upstream's protocol era is probed at start (MCP 2026-07-28 basic/transports/stdio
//! §Backward Compatibility): `server/discover` first, `initialize` when that fails in any way;
//! a modern upstream then gets the session's client info and capabilities in `_meta` on every
//! request, and a `subscriptions/listen` request stays open for its list changes (see
//! [`crate::mcp::upstream::era`]).
//!
//! Requests get fresh numeric ids and are matched to responses by id (out of order is fine).
//! Results and errors are kept as raw JSON so they reach the client verbatim. Lines that are
//! not JSON-RPC are skipped and logged. When the child exits, every request in flight fails at
//! once with [`UpstreamError::Closed`].
pub mod era;
mod events;
pub mod http;
pub mod mrtr;
mod stdio;
#[cfg(test)]
mod tests;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use coffer_proto::store::{McpServer, Transport as ServerTransport};
use coffer_runtime::home::CofferHome;
use coffer_runtime::spawn::ManagedChild;
use secrecy::SecretString;
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use self::http::Mirror;
use era::Era;
pub use events::{EVENT_QUEUE, EventQueue, Events, events};

/// Longest line accepted from an upstream (bytes).
pub const MAX_FRAME: usize = 64 * 1024 * 1024;

/// Why a request to an upstream failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum UpstreamError {
    #[error("upstream {server} could not be started: {reason}")]
    Start { server: String, reason: String },
    #[error("upstream {server} closed the connection: {reason}")]
    Closed { server: String, reason: String },
    #[error("upstream {server} did not answer within {ms} ms")]
    Timeout { server: String, ms: u64 },
    /// Coffer itself stopped the upstream (its session ended, or its registration or
    /// credentials changed): a normal stop, never counted against the server's health.
    #[error("upstream {server} is gone: Coffer stopped it ({reason})")]
    Stopped { server: String, reason: String },
}

impl UpstreamError {
    /// False for [`UpstreamError::Stopped`]: a stop Coffer asked for is not the server's fault
    /// and leaves its health alone.
    pub fn is_fault(&self) -> bool {
        !matches!(self, UpstreamError::Stopped { .. })
    }
}

/// A response body part, kept raw.
#[derive(Debug)]
pub enum Reply {
    Result(Box<RawValue>),
    Error(Box<RawValue>),
}

/// Something an upstream sent that is not a response to us.
#[derive(Debug)]
pub enum UpstreamEvent {
    Notification { server: String, method: String, params: Option<Box<RawValue>> },
    Request { server: String, id: Box<RawValue>, method: String, params: Option<Box<RawValue>> },
    Closed { server: String },
}

#[derive(Deserialize)]
struct Incoming {
    id: Option<Box<RawValue>>,
    method: Option<String>,
    params: Option<Box<RawValue>>,
    result: Option<Box<RawValue>>,
    error: Option<Box<RawValue>>,
}

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Reply>>>>;

/// Transport-independent half of an upstream connection: matches responses to requests and
/// hands everything else to the session. Both transports feed received messages to
/// [`Core::dispatch`] and report the end of the connection with [`Core::close`].
pub struct Core {
    pub server: String,
    pending: Pending,
    alive: AtomicBool,
    /// Messages received so far (every line or event, whatever it is).
    heard: AtomicU64,
    /// Messages received that are not JSON-RPC (MCP's stdio transport allows only protocol
    /// messages on stdout), and the start of the first one.
    junk: AtomicU64,
    first_junk: Mutex<Option<String>>,
    close_reason: Mutex<String>,
    /// Set when Coffer closed the connection itself ([`Core::stop`]).
    stopped: AtomicBool,
    events: Events,
    /// Fires when the connection closes (ends the `subscriptions/listen` task).
    ended: CancellationToken,
}

/// Longest start of a non-protocol line kept to name it (characters).
const JUNK_SHOWN: usize = 120;

impl Core {
    /// A new core for `server` whose unsolicited messages go to `events`.
    pub fn new(server: &str, events: Events) -> Arc<Self> {
        Arc::new(Self {
            server: server.to_owned(),
            pending: Arc::default(),
            alive: AtomicBool::new(true),
            heard: AtomicU64::new(0),
            junk: AtomicU64::new(0),
            first_junk: Mutex::new(None),
            close_reason: Mutex::new(String::new()),
            stopped: AtomicBool::new(false),
            events,
            ended: CancellationToken::new(),
        })
    }

    /// Counts a message that is not JSON-RPC and keeps the start of the first one (only this
    /// path pays for it).
    fn skipped(&self, line: &[u8]) {
        if self.junk.fetch_add(1, Ordering::Relaxed) == 0 {
            let text: String = String::from_utf8_lossy(line).chars().take(JUNK_SHOWN).collect();
            *self.first_junk.lock().expect("junk") = Some(text);
        }
    }

    /// How many received messages were not JSON-RPC, and the start of the first one.
    pub fn junk(&self) -> (u64, Option<String>) {
        (self.junk.load(Ordering::Relaxed), self.first_junk.lock().expect("junk").clone())
    }

    /// True until [`Core::close`].
    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    /// Handles one received JSON-RPC message (one line / one SSE event). Non-JSON-RPC input is
    /// skipped and logged.
    pub fn dispatch(&self, line: &[u8]) {
        self.heard.fetch_add(1, Ordering::Relaxed);
        let line = trim_line(line);
        if line.is_empty() {
            return;
        }
        let msg: Incoming = match serde_json::from_slice(line) {
            Ok(m) => m,
            Err(_) => {
                tracing::debug!(server = %self.server, bytes = line.len(), "Skipped a non-JSON-RPC message from upstream.");
                self.skipped(line);
                return;
            }
        };
        let server = self.server.clone();
        match (msg.method, msg.id) {
            (Some(method), Some(id)) => {
                self.events.send(UpstreamEvent::Request { server, id, method, params: msg.params });
            }
            (Some(method), None) => {
                self.events.send(UpstreamEvent::Notification { server, method, params: msg.params });
            }
            (None, Some(id)) => {
                let Ok(n) = id.get().parse::<u64>() else {
                    tracing::debug!(server = %self.server, "Response with an id we never sent; ignored.");
                    return;
                };
                let tx = self.pending.lock().expect("pending").remove(&n);
                let reply = match (msg.result, msg.error) {
                    (Some(r), _) => Reply::Result(r),
                    (None, Some(e)) => Reply::Error(e),
                    (None, None) => Reply::Result(RawValue::from_string("{}".into()).expect("json")),
                };
                match tx {
                    Some(tx) => {
                        let _ = tx.send(reply);
                    }
                    None => tracing::debug!(server = %self.server, id = n, "Late or duplicate response ignored."),
                }
            }
            (None, None) => {
                tracing::debug!(server = %self.server, "Skipped a JSON value that is not JSON-RPC.");
                self.skipped(line);
            }
        }
    }

    /// Whether request `id` still waits for its reply (false once answered, failed or timed
    /// out): an HTTP transport stops reading a response stream that nobody waits on.
    pub fn is_pending(&self, id: u64) -> bool {
        self.pending.lock().expect("pending").contains_key(&id)
    }

    /// Marks the connection dead: every request in flight fails at once with `reason`.
    pub fn close(&self, reason: &str) {
        self.close_as(reason, false);
    }

    /// [`Core::close`] because Coffer stops the upstream: requests in flight fail with
    /// [`UpstreamError::Stopped`]. A connection already closed keeps its first reason.
    pub fn stop(&self, reason: &str) {
        self.close_as(reason, true);
    }

    fn close_as(&self, reason: &str, stopped: bool) {
        if !self.alive.swap(false, Ordering::AcqRel) {
            return;
        }
        self.stopped.store(stopped, Ordering::Release);
        *self.close_reason.lock().expect("reason") = reason.to_owned();
        self.pending.lock().expect("pending").clear();
        self.ended.cancel();
        self.events.send(UpstreamEvent::Closed { server: self.server.clone() });
    }

    /// Fails one request in flight (e.g. its HTTP POST failed) with a JSON-RPC error `message`.
    pub fn fail(&self, id: u64, code: i64, message: &str) {
        if let Some(tx) = self.pending.lock().expect("pending").remove(&id) {
            let e = serde_json::json!({"code": code, "message": message});
            let _ = tx.send(Reply::Error(RawValue::from_string(e.to_string()).expect("json")));
        }
    }

    fn closed_error(&self) -> UpstreamError {
        let reason = self.close_reason.lock().expect("reason").clone();
        if self.stopped.load(Ordering::Acquire) {
            return UpstreamError::Stopped { server: self.server.clone(), reason };
        }
        UpstreamError::Closed {
            server: self.server.clone(),
            reason: if reason.is_empty() { "exited".into() } else { reason },
        }
    }
}

/// How messages reach the upstream. One per upstream and never moved, so the size difference
/// between the variants costs nothing.
#[allow(clippy::large_enum_variant)]
enum Transport {
    Stdio {
        /// Frames for the writer task; `None` once stdin is closed.
        stdin: Mutex<Option<mpsc::UnboundedSender<Vec<u8>>>>,
        child: tokio::sync::Mutex<Option<ManagedChild>>,
        /// The last lines of its stderr, to say why it failed.
        stderr: Arc<stdio::StderrTail>,
    },
    Http(http::HttpTransport),
}

/// A running upstream.
pub struct Upstream {
    pub server: String,
    /// The protocol era it speaks (probed at start).
    era: Era,
    /// Modern era: the `_meta` object (JSON text) every request carries; rebuilt when the
    /// client sets a log level.
    meta: std::sync::RwLock<Arc<str>>,
    /// The session's `{protocolVersion, capabilities, clientInfo}` (for rebuilding `meta`).
    client: serde_json::Value,
    next_id: AtomicU64,
    core: Arc<Core>,
    transport: Transport,
    /// The upstream's `initialize` result, or for a modern upstream its `server/discover`
    /// result in that shape (`{protocolVersion, capabilities, serverInfo, instructions?}`).
    pub init_result: serde_json::Value,
    /// Process id (0 for HTTP upstreams).
    pub pid: i32,
    /// Redacts the credential values it was started with from what it wrote.
    redactor: Arc<crate::credentials::Redactor>,
    /// The server's gateway-wide health, set by the pool once started: an answer clears a
    /// standing error there ([`Upstream::answered`]).
    health: std::sync::OnceLock<Arc<crate::mcp::ServerHealth>>,
}

/// Longest wait, after a stdio upstream failed its start, for its exit status and last stderr
/// lines (it has usually exited already).
const EXIT_WAIT: Duration = Duration::from_secs(2);
/// Longest wait for an answer to the `server/discover` probe of a server whose era is not known
/// yet; then it is taken for a handshake-era server that ignores unknown methods (a modern one
/// answering late is still found: it refuses the `initialize` that follows with -32022).
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// Most consecutive `subscriptions/listen` requests that end without a notification before
/// Coffer stops re-opening it for an upstream.
const LISTEN_RETRIES: u32 = 5;

impl Upstream {
    /// Starts `server` (spawning a stdio child or opening a Streamable HTTP client) and learns
    /// its protocol era: `server/discover` at 2026-07-28 first (the session's client info and
    /// capabilities in `_meta`), else the `initialize` handshake mirroring the downstream
    /// client's `protocolVersion` (2025-11-25 when the session itself speaks 2026-07-28),
    /// `capabilities` and `client_info`. `hint` is the era this server was found speaking
    /// before (the gateway catalog remembers it per registration): `Legacy` skips the probe,
    /// `Modern` gives it the whole `timeout`; an upstream that changed era since is still
    /// found (a refused handshake is probed, a failed probe falls back). Without a hint the
    /// probe waits at most [`PROBE_TIMEOUT`] (and half of `timeout`). Non-response messages go to `events`. `secrets`
    /// are the credential values resolved into `server` (see `Shared::resolve_server`): they
    /// are redacted from the child's stderr log and from start errors. `auth`: an HTTP
    /// server's OAuth state ([`http::oauth`]), which gives its access token.
    ///
    /// # Errors
    /// [`UpstreamError::Start`] when the process cannot start, exits, or answers neither
    /// `server/discover` nor `initialize` within `timeout`.
    // Each argument is a separate input of one start (the pool's call site names them all); a
    // struct would only move the list.
    #[allow(clippy::too_many_arguments)]
    pub async fn start(
        server: &McpServer,
        home: &CofferHome,
        init_params: &serde_json::Value,
        events: Events,
        timeout: Duration,
        secrets: Vec<SecretString>,
        hint: Option<Era>,
        auth: Option<Arc<http::oauth::ServerAuth>>,
    ) -> Result<Arc<Self>, UpstreamError> {
        let name = server.name.clone();
        let redactor = Arc::new(crate::credentials::Redactor::new(&secrets));
        let start_err =
            |reason: String| UpstreamError::Start { server: name.clone(), reason: redactor.redact_str(&reason) };
        let core = Core::new(&name, events);
        let (transport, pid) = match server.transport() {
            ServerTransport::Stdio => {
                let (t, pid) = stdio::start_stdio(server, home, core.clone(), redactor.clone()).map_err(start_err)?;
                (t, pid)
            }
            ServerTransport::Http | ServerTransport::Sse => {
                let t = http::HttpTransport::new(server, core.clone(), auth).map_err(start_err)?;
                (Transport::Http(t), 0)
            }
            other => return Err(start_err(format!("transport {:?} is not supported", other.as_str_name()))),
        };
        let meta: Arc<str> = era::client_meta(init_params, None).into();
        let mut up = Self {
            server: name.clone(),
            era: Era::Legacy,
            meta: std::sync::RwLock::new(meta.clone()),
            client: init_params.clone(),
            next_id: AtomicU64::new(1),
            core,
            transport,
            init_result: serde_json::Value::Null,
            pid,
            redactor: redactor.clone(),
            health: std::sync::OnceLock::new(),
        };
        let started = std::time::Instant::now();
        let left = |timeout: Duration| timeout.saturating_sub(started.elapsed());
        let mut probed = false;
        if hint != Some(Era::Legacy) {
            // Unknown era: at most half the start budget, so the handshake keeps the rest.
            let wait = if hint == Some(Era::Modern) { timeout } else { (timeout / 2).min(PROBE_TIMEOUT) };
            probed = true;
            match up.discover(&meta, wait).await {
                Ok(Some(init)) => return Ok(up.into_modern(init)),
                Ok(None) => {}
                Err(e) => return Err(start_err(up.start_failure(e, " during startup").await)),
            }
        }
        let params = RawValue::from_string(era::legacy_init_params(init_params).to_string()).expect("valid JSON");
        let reply = match up.request("initialize", Some(&params), left(timeout)).await {
            Ok(Reply::Result(r)) => r,
            Ok(Reply::Error(e)) => {
                // A modern server refuses the handshake with -32022, e.g. after it answered a
                // probe that had timed out here, or because it changed era since the catalog
                // learnt it: discover it now.
                if era::error_code(&e) == Some(era::UNSUPPORTED_VERSION) {
                    tracing::debug!(server = %name, probed, "Upstream refused initialize as a 2026-07-28 server; discovering it.");
                    match up.discover(&meta, left(timeout)).await {
                        Ok(Some(init)) => return Ok(up.into_modern(init)),
                        Ok(None) => {}
                        Err(e) => return Err(start_err(up.start_failure(e, " during startup").await)),
                    }
                }
                let why = format!("initialize failed: {}", e.get());
                let why = up.explain_failure(why, false, " during initialize").await;
                up.shutdown(Duration::from_millis(500)).await;
                return Err(start_err(why));
            }
            Err(e) => return Err(start_err(up.start_failure(e, " during initialize").await)),
        };
        up.init_result = serde_json::from_str(reply.get()).unwrap_or_default();
        if let Transport::Http(t) = &up.transport {
            t.initialized(up.init_result.get("protocolVersion").and_then(|v| v.as_str()).unwrap_or_default());
        }
        up.notify("notifications/initialized", None).await?;
        Ok(Arc::new(up))
    }

    /// Why a start failed with `e` (then the upstream is shut down).
    async fn start_failure(&self, e: UpstreamError, during: &str) -> String {
        let why = match e {
            UpstreamError::Closed { reason, .. } | UpstreamError::Stopped { reason, .. } => match &self.transport {
                // An HTTP upstream never "exits": its reason says what went wrong
                // (unreachable, refused, expired).
                Transport::Http(_) => reason,
                Transport::Stdio { .. } => self.explain_failure(reason, true, during).await,
            },
            UpstreamError::Timeout { ms, .. } => {
                self.explain_failure(format!("no answer{during} within {ms} ms"), false, "").await
            }
            UpstreamError::Start { reason, .. } => reason,
        };
        self.shutdown(Duration::from_millis(500)).await;
        why
    }

    /// The `server/discover` probe, waiting at most `wait`: `Ok(Some(init))` when the upstream
    /// speaks 2026-07-28 (its result in `initialize` shape, see [`upstream_era::discovered`]);
    /// `Ok(None)` when it answered anything else (an error, a result that is no usable
    /// `DiscoverResult`, an HTTP rejection) or nothing in time: a handshake-era server.
    ///
    /// # Errors
    /// The connection closed (the process exited, the URL is unreachable).
    async fn discover(&self, meta: &str, wait: Duration) -> Result<Option<serde_json::Value>, UpstreamError> {
        let params = era::discover_params(meta);
        let (id, rx) = self.begin_as("server/discover", Some(&params), Some(era::MODERN)).await?;
        // No wedge watch (`heard: None`): a handshake-era server may ignore an unknown method,
        // which is no reason to close it.
        match self.finish(id, rx, wait, None).await {
            Ok(Reply::Result(r)) => {
                let init = era::discovered(&r);
                if init.is_none() {
                    tracing::info!(server = %self.server, "Upstream answered server/discover without a usable 2026-07-28 result; using initialize.");
                }
                Ok(init)
            }
            Ok(Reply::Error(e)) => {
                tracing::debug!(server = %self.server, error = %truncate_raw(&e), "Upstream refused server/discover; using initialize.");
                Ok(None)
            }
            Err(UpstreamError::Timeout { ms, .. }) => {
                tracing::info!(server = %self.server, wait_ms = ms, "Upstream did not answer server/discover in time; using initialize.");
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Finishes a start as a modern upstream: its discover result as `init_result`, the HTTP
    /// transport switched to the stateless revision, and its `subscriptions/listen` opened.
    fn into_modern(mut self, init: serde_json::Value) -> Arc<Self> {
        self.era = Era::Modern;
        self.init_result = init;
        if let Transport::Http(t) = &self.transport {
            t.stateless();
        }
        let up = Arc::new(self);
        up.listen();
        up
    }

    /// Why the upstream is gone after its connection closed (a crash): for a stdio child, its
    /// exit status and last stderr lines (waited for, at most [`EXIT_WAIT`]); for HTTP, the
    /// transport's `symptom`. Off the call path: calls in flight have failed already.
    pub async fn crash_cause(&self, symptom: String) -> String {
        // Only an end of the pipes means it exited; a wedged one Coffer closed still runs.
        let ended = ["exited", "stdin:", "stdout:"].iter().any(|p| symptom.starts_with(p));
        self.explain_failure(symptom, ended, "").await
    }

    /// Why a start (or, `during` empty, a running upstream) failed, said as the server's user
    /// needs it: for a stdio child whose connection `closed`, its exit status (waited for, at
    /// most [`EXIT_WAIT`]) instead of the transport's symptom (`stdout closed`, `Broken
    /// pipe`); then its last stderr lines and any non-protocol lines it wrote on stdout.
    /// `symptom` is what the transport saw; `during` is said after the exit
    /// (` during initialize`).
    async fn explain_failure(&self, symptom: String, closed: bool, during: &str) -> String {
        let Transport::Stdio { child, stderr, .. } = &self.transport else { return symptom };
        let mut why = symptom;
        if closed {
            let status = match child.lock().await.as_mut() {
                Some(c) => tokio::time::timeout(EXIT_WAIT, c.inner().wait()).await.ok().and_then(Result::ok),
                None => None,
            };
            why = match status {
                Some(st) => format!("{}{during}", stdio::describe_exit(st)),
                None => format!("closed its stdout{during} ({why})"),
            };
        }
        let tail = stderr.read(if closed { EXIT_WAIT } else { Duration::ZERO }).await;
        if !tail.is_empty() {
            why.push_str("; its last stderr lines: ");
            why.push_str(&tail.join(" | "));
        }
        if let Some(note) = self.junk_note() {
            why.push_str("; ");
            why.push_str(&note);
        }
        why
    }

    /// A sentence about the lines the upstream wrote on stdout that are not JSON-RPC (MCP's
    /// stdio transport allows only protocol messages there), or `None` when there were none.
    /// Credential values are redacted from the line it quotes.
    pub fn junk_note(&self) -> Option<String> {
        let (n, first) = self.core.junk();
        if n == 0 {
            return None;
        }
        let first = self.redactor.redact_str(&first.unwrap_or_default());
        let verb = if n == 1 { "is" } else { "are" };
        Some(match self.transport {
            Transport::Stdio { .. } => {
                let lines = if n == 1 { "1 line".to_owned() } else { format!("{n} lines") };
                format!(
                    "it wrote {lines} on stdout that {verb} not JSON-RPC (MCP allows only protocol messages there; logs belong on stderr), first: {first:?}"
                )
            }
            Transport::Http(_) => {
                let messages = if n == 1 { "1 message".to_owned() } else { format!("{n} messages") };
                format!("it sent {messages} that {verb} not JSON-RPC, first: {first:?}")
            }
        })
    }

    /// Whether it speaks the legacy HTTP+SSE transport (MCP 2024-11-05): registered so, or
    /// detected when its first `POST` was refused.
    pub fn speaks_legacy_sse(&self) -> bool {
        matches!(&self.transport, Transport::Http(t) if t.is_legacy())
    }

    /// The protocol era it speaks.
    pub fn era(&self) -> Era {
        self.era
    }

    /// Applies the log level the client asked for: a modern upstream gets it in every
    /// request's `_meta` from now on (the revision has no `logging/setLevel`); returns false
    /// for a handshake-era upstream, which needs `logging/setLevel`.
    pub fn set_log_level(&self, level: &str) -> bool {
        if self.era != Era::Modern {
            return false;
        }
        *self.meta.write().expect("meta") = era::client_meta(&self.client, Some(level)).into();
        true
    }

    /// Opens the modern upstream's `subscriptions/listen` request for the list changes its
    /// capabilities name (MCP 2026-07-28 basic/patterns/subscriptions): its notifications reach
    /// the session's event loop like a handshake-era upstream's `notifications/*/list_changed`.
    /// Re-opened when the server ends it, at most [`LISTEN_RETRIES`] times in a row without a
    /// notification between; the task ends with the connection.
    fn listen(self: &Arc<Self>) {
        let caps = &self.init_result["capabilities"];
        let mut filter = serde_json::Map::new();
        for (cap, key) in
            [("tools", "toolsListChanged"), ("prompts", "promptsListChanged"), ("resources", "resourcesListChanged")]
        {
            if caps.get(cap).is_some_and(serde_json::Value::is_object) {
                filter.insert(key.into(), true.into());
            }
        }
        if filter.is_empty() {
            return;
        }
        let params = serde_json::json!({"notifications": filter}).to_string();
        let weak = Arc::downgrade(self);
        let ended = self.core.ended.clone();
        tokio::spawn(async move {
            let mut quiet: u32 = 0;
            loop {
                let Some(up) = weak.upgrade().filter(|u| u.is_alive()) else { return };
                let heard = up.heard();
                let raw = RawValue::from_string(params.clone()).expect("json");
                let Ok((_, rx)) = up.begin("subscriptions/listen", Some(&raw)).await else { return };
                drop(up);
                let reply = tokio::select! {
                    _ = ended.cancelled() => return,
                    r = rx => r,
                };
                let Some(up) = weak.upgrade().filter(|u| u.is_alive()) else { return };
                match reply {
                    Err(_) => return,
                    Ok(Reply::Error(e)) if matches!(era::error_code(&e), Some(-32601 | -32602)) => {
                        tracing::debug!(server = %up.server, error = %truncate_raw(&e), "Upstream offers no subscriptions/listen; its list changes are not followed.");
                        return;
                    }
                    Ok(_) => {}
                }
                quiet = if up.heard() > heard + 2 { 0 } else { quiet + 1 };
                if quiet > LISTEN_RETRIES {
                    tracing::warn!(server = %up.server, "Upstream keeps ending subscriptions/listen; its list changes are not followed.");
                    return;
                }
                drop(up);
                // A backoff between re-opened subscriptions, not a wait for readiness.
                let backoff = coffer_runtime::Backoff::new(Duration::from_millis(200), Duration::from_millis(25_600))
                    .delay_after(quiet + 1);
                tokio::select! {
                    _ = ended.cancelled() => return,
                    _ = tokio::time::sleep(backoff) => {}
                }
            }
        });
    }

    /// Attaches the server's gateway-wide health (once): later answers clear a standing error
    /// there.
    pub fn watch_health(&self, health: Arc<crate::mcp::ServerHealth>) {
        let _ = self.health.set(health);
    }

    /// Notes that the upstream answered a request (a result or its own error: it is alive and
    /// speaking): clears the server's standing error, if any. One atomic load when there is
    /// none, so the call path pays nothing.
    pub fn answered(&self) {
        if let Some(h) = self.health.get() {
            h.answered();
        }
    }

    /// True while the connection is open (stdio: the child's stdout is open).
    pub fn is_alive(&self) -> bool {
        self.core.is_alive()
    }

    /// Whether the upstream declared capability `name` (e.g. `tools`) in its initialize result.
    pub fn has_capability(&self, name: &str) -> bool {
        self.init_result.get("capabilities").and_then(|c| c.get(name)).is_some()
    }

    /// Sends one complete JSON-RPC message. `request_id` is set for requests, so an HTTP
    /// transport can fail that request if its POST fails.
    async fn send(
        &self,
        line: String,
        request_id: Option<u64>,
        mirror: Option<Box<Mirror>>,
    ) -> Result<(), UpstreamError> {
        if !self.core.is_alive() {
            return Err(self.core.closed_error());
        }
        match &self.transport {
            Transport::Stdio { stdin, .. } => {
                // The writer task batches whatever is queued into one write; the newline
                // travels with the frame.
                let mut frame = line.into_bytes();
                frame.push(b'\n');
                let sent = stdin.lock().expect("stdin").as_ref().is_some_and(|tx| tx.send(frame).is_ok());
                if sent { Ok(()) } else { Err(self.core.closed_error()) }
            }
            // Boxed: the HTTP send is large, and a stdio call's future would otherwise carry it.
            Transport::Http(t) => Box::pin(t.send(line, request_id, mirror)).await,
        }
    }

    /// Sends request `method` with raw `params` and waits (at most `timeout`) for the reply.
    /// On timeout, sends `notifications/cancelled` for it.
    ///
    /// # Errors
    /// [`UpstreamError::Closed`] when the upstream is gone or exits before answering;
    /// [`UpstreamError::Timeout`].
    pub async fn request(
        &self,
        method: &str,
        params: Option<&RawValue>,
        timeout: Duration,
    ) -> Result<Reply, UpstreamError> {
        let heard = self.heard();
        let (id, rx) = self.begin(method, params).await?;
        self.finish(id, rx, timeout, Some(heard)).await
    }

    /// Messages received from the upstream so far (any kind); see [`Upstream::finish`].
    pub fn heard(&self) -> u64 {
        self.core.heard.load(Ordering::Relaxed)
    }

    /// First half of [`Upstream::request`]: registers and sends; returns the upstream id. A
    /// modern upstream's request carries the session's `_meta` (over HTTP also the mirrored
    /// `MCP-Protocol-Version`, `Mcp-Method` and `Mcp-Name` headers).
    pub async fn begin(
        &self,
        method: &str,
        params: Option<&RawValue>,
    ) -> Result<(u64, oneshot::Receiver<Reply>), UpstreamError> {
        let (id, rx, line, mirror) = self.frame(method, params, None)?;
        if let Err(e) = self.send(line, Some(id), mirror).await {
            self.core.pending.lock().expect("pending").remove(&id);
            return Err(e);
        }
        Ok((id, rx))
    }

    /// [`Upstream::begin`]; `version`: send it as a request of that stateless version whatever
    /// the era (the `server/discover` probe, whose params carry `_meta` already).
    async fn begin_as(
        &self,
        method: &str,
        params: Option<&RawValue>,
        version: Option<&'static str>,
    ) -> Result<(u64, oneshot::Receiver<Reply>), UpstreamError> {
        let (id, rx, line, mirror) = self.frame(method, params, version)?;
        if let Err(e) = self.send(line, Some(id), mirror).await {
            self.core.pending.lock().expect("pending").remove(&id);
            return Err(e);
        }
        Ok((id, rx))
    }

    /// Registers request `method` under a fresh id and writes its line (with the session's
    /// `_meta` for a modern upstream) and, for a stateless HTTP request, its mirrored headers.
    /// Synchronous, so that none of it is held across the send (a call's future stays small).
    #[allow(clippy::type_complexity)]
    fn frame(
        &self,
        method: &str,
        params: Option<&RawValue>,
        version: Option<&'static str>,
    ) -> Result<(u64, oneshot::Receiver<Reply>, String, Option<Box<Mirror>>), UpstreamError> {
        if !self.is_alive() {
            return Err(self.core.closed_error());
        }
        let with_meta;
        let params = if self.era == Era::Modern {
            let meta = self.meta.read().expect("meta").clone();
            with_meta = era::with_meta(params, &meta);
            Some(&*with_meta)
        } else {
            params
        };
        let mirror = match (&self.transport, version.or((self.era == Era::Modern).then_some(era::MODERN))) {
            (Transport::Http(_), Some(version)) => {
                Some(Box::new(Mirror { version, method: method.to_owned(), name: era::mcp_name(method, params) }))
            }
            _ => None,
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.core.pending.lock().expect("pending").insert(id, tx);
        let method_json = serde_json::to_string(method).expect("string");
        // Room for the whole line and the newline the stdio writer appends (no reallocation).
        let mut line = String::with_capacity(64 + method_json.len() + params.map_or(0, |p| p.get().len()));
        let _ = match params {
            Some(p) => {
                write!(line, "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":{method_json},\"params\":{}}}", p.get())
            }
            None => write!(line, "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":{method_json}}}"),
        };
        Ok((id, rx, line, mirror))
    }

    /// Second half of [`Upstream::request`]: waits (at most `timeout`) for the reply to `id`.
    /// `heard` is [`Upstream::heard`] from before the request was sent; when a stdio upstream's
    /// call times out with nothing at all received since (no answer, no other message), the
    /// upstream is taken for wedged and closed. `None`: no such watch.
    pub async fn finish(
        &self,
        id: u64,
        rx: oneshot::Receiver<Reply>,
        timeout: Duration,
        heard: Option<u64>,
    ) -> Result<Reply, UpstreamError> {
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(_)) => Err(self.core.closed_error()),
            Err(_) => {
                self.core.pending.lock().expect("pending").remove(&id);
                self.cancel(id, "timeout").await;
                if matches!(self.transport, Transport::Stdio { .. }) && heard == Some(self.heard()) {
                    // Not one message for the whole call timeout, this answer or any other: the
                    // upstream is wedged (e.g. stopped reading its stdin). Closing it fails its
                    // other calls now; the session's next call starts a fresh one.
                    tracing::warn!(server = %self.server, timeout_ms = timeout.as_millis() as u64, "Upstream silent for a whole call timeout; restarting it on the next call.");
                    self.core.close(&format!(
                        "sent nothing for {} ms (a call timeout); Coffer starts it again on the next call",
                        timeout.as_millis()
                    ));
                }
                Err(UpstreamError::Timeout { server: self.server.clone(), ms: timeout.as_millis() as u64 })
            }
        }
    }

    /// Completes request `id` locally with a JSON-RPC error (e.g. after the client cancelled it).
    pub fn fail_local(&self, id: u64, code: i64, message: &str) {
        self.core.fail(id, code, message);
    }

    /// Cancels upstream request `id`: `notifications/cancelled`, except to a modern HTTP
    /// upstream, whose request is cancelled by closing its response stream (MCP 2026-07-28
    /// basic/transports/streamable-http §Cancellation), which the transport does once nobody
    /// waits for the answer.
    pub async fn cancel(&self, id: u64, reason: &str) {
        if self.era == Era::Modern && matches!(self.transport, Transport::Http(_)) {
            return;
        }
        let params = serde_json::json!({"requestId": id, "reason": reason}).to_string();
        let _ = self.notify("notifications/cancelled", Some(&RawValue::from_string(params).expect("json"))).await;
    }

    /// Sends a notification.
    ///
    /// # Errors
    /// [`UpstreamError::Closed`] when the upstream is gone.
    pub async fn notify(&self, method: &str, params: Option<&RawValue>) -> Result<(), UpstreamError> {
        let method_json = serde_json::to_string(method).expect("string");
        let line = match params {
            Some(p) => format!("{{\"jsonrpc\":\"2.0\",\"method\":{method_json},\"params\":{}}}", p.get()),
            None => format!("{{\"jsonrpc\":\"2.0\",\"method\":{method_json}}}"),
        };
        self.send(line, None, None).await
    }

    /// Answers a request the upstream sent us (`id` raw) with a raw result or error object.
    pub async fn respond(&self, id: &RawValue, reply: Reply) -> Result<(), UpstreamError> {
        let line = match reply {
            Reply::Result(r) => format!("{{\"jsonrpc\":\"2.0\",\"id\":{},\"result\":{}}}", id.get(), r.get()),
            Reply::Error(e) => format!("{{\"jsonrpc\":\"2.0\",\"id\":{},\"error\":{}}}", id.get(), e.get()),
        };
        self.send(line, None, None).await
    }

    /// Stops the upstream. stdio: close stdin (the transport's shutdown signal), then SIGTERM to
    /// its process group, SIGKILL after `grace`, pid record removed. HTTP: `DELETE` the session.
    pub async fn shutdown(&self, grace: Duration) {
        // Said first, so requests still in flight learn that Coffer stopped the upstream, not
        // that it went away by itself.
        self.core.stop("its session ended, or its registration or credentials changed");
        match &self.transport {
            Transport::Stdio { stdin, child, .. } => {
                // Dropping the sender ends the writer task, which closes the child's stdin.
                stdin.lock().expect("stdin").take();
                if let Some(mut child) = child.lock().await.take() {
                    // Give it a moment to exit on EOF before signalling.
                    if tokio::time::timeout(Duration::from_millis(200), child.inner().wait()).await.is_err() {
                        child.terminate(grace).await;
                    } else {
                        child.terminate(Duration::ZERO).await;
                    }
                }
            }
            Transport::Http(t) => t.close().await,
        }
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        // Ends the `subscriptions/listen` task of an upstream dropped without a shutdown.
        self.core.ended.cancel();
    }
}

/// The start of a raw JSON value, for a log line.
fn truncate_raw(v: &RawValue) -> String {
    v.get().chars().take(200).collect()
}

pub fn trim_line(b: &[u8]) -> &[u8] {
    let mut s = b;
    while let [rest @ .., last] = s {
        if last.is_ascii_whitespace() {
            s = rest
        } else {
            break;
        }
    }
    while let [first, rest @ ..] = s {
        if first.is_ascii_whitespace() {
            s = rest
        } else {
            break;
        }
    }
    s
}
