//! `McpGatewaySession`: one downstream MCP session (one `Mcp-Session-Id`). It owns its own
//! upstream children, started lazily by the first request that needs them, caches each
//! upstream's capability lists for 60 s, keeps the reverse map from exposed names to
//! `(server, original name)`, checks policy before any upstream contact, and routes calls with
//! fresh upstream request ids, returning results verbatim.
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use coffer_proto::store::McpServer;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

use super::jsonrpc::{
    self, INVALID_PARAMS, METHOD_NOT_FOUND, TOOL_DISABLED, UPSTREAM_TIMEOUT, UPSTREAM_UNAVAILABLE,
};
use super::naming::{self, NameMap};
use super::upstream::{Reply, Upstream, UpstreamError, UpstreamEvent};
use super::{Outcome, Shared};
use crate::snapshot::Kind;

/// How long a capability list stays cached per session per upstream.
pub const LIST_TTL: Duration = Duration::from_secs(60);
/// Most pages followed when an upstream paginates a list.
const MAX_PAGES: usize = 100;
/// Messages kept per session for `Last-Event-ID` resumption of the GET stream.
const REPLAY_BUFFER: usize = 512;

/// A list method that fans out to every upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ListKind {
    Tools,
    Prompts,
}

impl ListKind {
    pub fn method(self) -> &'static str {
        match self {
            ListKind::Tools => "tools/list",
            ListKind::Prompts => "prompts/list",
        }
    }
    /// Key of the items array in the list result (and of the capability in `initialize`).
    pub fn key(self) -> &'static str {
        match self {
            ListKind::Tools => "tools",
            ListKind::Prompts => "prompts",
        }
    }
    pub fn kind(self) -> Kind {
        match self {
            ListKind::Tools => Kind::Tool,
            ListKind::Prompts => Kind::Prompt,
        }
    }
}

/// A JSON-RPC error produced by the gateway itself.
#[derive(Debug)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
    pub data: Option<Value>,
}

impl RpcError {
    pub fn new(code: i64, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            data: None,
        }
    }
    fn with_data(mut self, data: Value) -> Self {
        self.data = Some(data);
        self
    }
    fn outcome(&self) -> Outcome {
        match self.code {
            TOOL_DISABLED => Outcome::Disabled,
            UPSTREAM_TIMEOUT => Outcome::Timeout,
            UPSTREAM_UNAVAILABLE => Outcome::Unreachable,
            _ => Outcome::Invalid,
        }
    }
}

impl From<UpstreamError> for RpcError {
    fn from(e: UpstreamError) -> Self {
        match &e {
            UpstreamError::Timeout { server, ms } => RpcError::new(UPSTREAM_TIMEOUT, e.to_string())
                .with_data(json!({"server": server, "timeout_ms": ms})),
            UpstreamError::Start { server, .. } | UpstreamError::Closed { server, .. } => {
                RpcError::new(UPSTREAM_UNAVAILABLE, e.to_string())
                    .with_data(json!({"server": server}))
            }
        }
    }
}

/// What a handled request produced: a raw result or an error (upstream errors stay raw).
pub enum Answer {
    Result(Box<RawValue>),
    UpstreamError(Box<RawValue>),
    Error(RpcError),
}

impl Answer {
    fn ok(v: Value) -> Self {
        Answer::Result(RawValue::from_string(v.to_string()).expect("json"))
    }

    /// The JSON-RPC response text for downstream request `id` (raw).
    pub fn into_response(self, id: &RawValue) -> String {
        match self {
            Answer::Result(r) => format!(
                "{{\"jsonrpc\":\"2.0\",\"id\":{},\"result\":{}}}",
                id.get(),
                r.get()
            ),
            Answer::UpstreamError(e) => format!(
                "{{\"jsonrpc\":\"2.0\",\"id\":{},\"error\":{}}}",
                id.get(),
                e.get()
            ),
            Answer::Error(e) => {
                let id: Value = serde_json::from_str(id.get()).unwrap_or(Value::Null);
                jsonrpc::error_object(id, e.code, &e.message, e.data).to_string()
            }
        }
    }
}

/// Server→client messages for the session's GET stream, with ids for resumption.
pub struct Outbound {
    next: AtomicU64,
    ring: Mutex<VecDeque<(u64, Arc<str>)>>,
    tx: broadcast::Sender<(u64, Arc<str>)>,
}

impl Outbound {
    fn new() -> Self {
        Self {
            next: AtomicU64::new(1),
            ring: Mutex::new(VecDeque::new()),
            tx: broadcast::channel(1024).0,
        }
    }

    /// Queues a message (a complete JSON-RPC object) for the client.
    pub fn push(&self, msg: String) {
        let mut ring = self.ring.lock().expect("outbound");
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let msg: Arc<str> = msg.into();
        ring.push_back((id, msg.clone()));
        if ring.len() > REPLAY_BUFFER {
            ring.pop_front();
        }
        let _ = self.tx.send((id, msg));
    }

    /// Messages after `last_event_id` still in the buffer, and a receiver for later ones.
    pub fn subscribe(
        &self,
        last_event_id: Option<u64>,
    ) -> (Vec<(u64, Arc<str>)>, broadcast::Receiver<(u64, Arc<str>)>) {
        let ring = self.ring.lock().expect("outbound");
        let rx = self.tx.subscribe();
        let backlog = match last_event_id {
            Some(last) => ring.iter().filter(|(id, _)| *id > last).cloned().collect(),
            None => Vec::new(),
        };
        (backlog, rx)
    }
}

enum SlotState {
    Idle,
    Ready {
        upstream: Arc<Upstream>,
        version: i64,
    },
    Failed {
        at: Instant,
        attempts: u32,
        error: UpstreamError,
    },
}

struct Slot {
    state: tokio::sync::Mutex<SlotState>,
}

struct Cached {
    at: Instant,
    items: Arc<Vec<Value>>,
}

/// One item of a merged list.
pub struct Listed {
    /// The upstream's definition with `name` replaced by the exposed name.
    pub item: Value,
    pub server: String,
    pub original: String,
    /// Policy: server enabled and no `enabled = false` preference.
    pub enabled: bool,
}

/// One downstream session.
pub struct Session {
    pub id: String,
    pub protocol_version: String,
    /// `{protocolVersion, capabilities, clientInfo}` mirrored to each upstream's `initialize`.
    init_params: Value,
    shared: Arc<Shared>,
    slots: Mutex<HashMap<String, Arc<Slot>>>,
    cache: Mutex<HashMap<(String, ListKind), Cached>>,
    names: RwLock<HashMap<ListKind, NameMap>>,
    last_activity: Mutex<Instant>,
    pub outbound: Outbound,
    pub closed: CancellationToken,
    events_tx: mpsc::UnboundedSender<UpstreamEvent>,
}

impl Session {
    /// Creates a session for a client that sent `initialize` with `params` and negotiated
    /// `protocol_version`; starts its event and policy-watch tasks.
    pub fn new(
        id: String,
        protocol_version: String,
        params: &Value,
        shared: Arc<Shared>,
    ) -> Arc<Self> {
        let init_params = json!({
            "protocolVersion": protocol_version,
            "capabilities": params.get("capabilities").cloned().unwrap_or_else(|| json!({})),
            "clientInfo": params.get("clientInfo").cloned().unwrap_or_else(|| json!({"name": "coffer", "version": coffer_runtime::VERSION})),
        });
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let s = Arc::new(Self {
            id,
            protocol_version,
            init_params,
            shared,
            slots: Mutex::default(),
            cache: Mutex::default(),
            names: RwLock::default(),
            last_activity: Mutex::new(Instant::now()),
            outbound: Outbound::new(),
            closed: CancellationToken::new(),
            events_tx,
        });
        tokio::spawn(event_loop(Arc::downgrade(&s), events_rx, s.closed.clone()));
        tokio::spawn(policy_watch(Arc::downgrade(&s), s.closed.clone()));
        s
    }

    /// Marks traffic (resets the idle timer).
    pub fn touch(&self) {
        *self.last_activity.lock().expect("activity") = Instant::now();
    }

    /// Time since the last request.
    pub fn idle_for(&self) -> Duration {
        self.last_activity.lock().expect("activity").elapsed()
    }

    /// Ends the session: every upstream child is terminated and its pid record removed.
    pub async fn close(&self) {
        self.closed.cancel();
        let slots: Vec<Arc<Slot>> = self
            .slots
            .lock()
            .expect("slots")
            .drain()
            .map(|(_, s)| s)
            .collect();
        let mut stops = Vec::new();
        for slot in slots {
            stops.push(async move {
                let mut st = slot.state.lock().await;
                if let SlotState::Ready { upstream, .. } =
                    std::mem::replace(&mut *st, SlotState::Idle)
                {
                    upstream.shutdown(Duration::from_secs(2)).await;
                }
            });
        }
        futures_util::future::join_all(stops).await;
    }

    /// Names of upstreams running in this session.
    pub fn running_upstreams(&self) -> Vec<String> {
        let slots = self.slots.lock().expect("slots");
        slots
            .iter()
            .filter(|(_, s)| {
                s.state.try_lock().is_ok_and(
                    |st| matches!(&*st, SlotState::Ready { upstream, .. } if upstream.is_alive()),
                )
            })
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// The running upstream for `server`, started on demand (with bounded backoff after a
    /// failed start; restarted at once after a crash or a registry change).
    async fn upstream(&self, server: &McpServer) -> Result<Arc<Upstream>, UpstreamError> {
        let slot = {
            let mut slots = self.slots.lock().expect("slots");
            slots
                .entry(server.name.clone())
                .or_insert_with(|| {
                    Arc::new(Slot {
                        state: tokio::sync::Mutex::new(SlotState::Idle),
                    })
                })
                .clone()
        };
        let mut st = slot.state.lock().await;
        let attempts = match &*st {
            SlotState::Ready { upstream, version }
                if upstream.is_alive() && *version == server.version =>
            {
                return Ok(upstream.clone());
            }
            SlotState::Ready { upstream, .. } => {
                upstream.shutdown(Duration::from_secs(2)).await;
                0
            }
            SlotState::Failed {
                at,
                attempts,
                error,
            } => {
                let backoff = Duration::from_millis(500u64.saturating_mul(1 << (*attempts).min(6)))
                    .min(Duration::from_secs(30));
                if at.elapsed() < backoff {
                    return Err(error.clone());
                }
                *attempts
            }
            SlotState::Idle => 0,
        };
        let started = Instant::now();
        let res = Upstream::start(
            server,
            &self.shared.home,
            &self.init_params,
            self.events_tx.clone(),
            self.shared.start_timeout(),
        )
        .await;
        match res {
            Ok(u) => {
                tracing::info!(server = %server.name, session = %self.id, pid = u.pid, elapsed_ms = started.elapsed().as_millis() as u64, "Upstream started.");
                self.shared.health.started(&server.name);
                *st = SlotState::Ready {
                    upstream: u.clone(),
                    version: server.version,
                };
                Ok(u)
            }
            Err(e) => {
                tracing::warn!(server = %server.name, session = %self.id, error = %e, "Upstream failed to start.");
                self.shared.health.failed(&server.name, &e.to_string());
                *st = SlotState::Failed {
                    at: Instant::now(),
                    attempts: attempts + 1,
                    error: e.clone(),
                };
                Err(e)
            }
        }
    }

    /// One upstream's full list of `kind` (all pages), from the cache when fresh.
    async fn fetch(
        &self,
        server: &McpServer,
        kind: ListKind,
    ) -> Result<Arc<Vec<Value>>, UpstreamError> {
        let key = (server.name.clone(), kind);
        if let Some(c) = self.cache.lock().expect("cache").get(&key)
            && c.at.elapsed() < LIST_TTL
        {
            return Ok(c.items.clone());
        }
        let up = self.upstream(server).await?;
        let mut items = Vec::new();
        if up.has_capability(kind.key()) {
            let mut cursor: Option<String> = None;
            for _ in 0..MAX_PAGES {
                let params = match &cursor {
                    Some(c) => {
                        Some(RawValue::from_string(json!({"cursor": c}).to_string()).expect("json"))
                    }
                    None => None,
                };
                let reply = up
                    .request(kind.method(), params.as_deref(), self.shared.list_timeout())
                    .await?;
                let body: Value = match reply {
                    Reply::Result(r) => serde_json::from_str(r.get()).unwrap_or_default(),
                    Reply::Error(e) => {
                        return Err(UpstreamError::Closed {
                            server: server.name.clone(),
                            reason: format!("{} failed: {}", kind.method(), e.get()),
                        });
                    }
                };
                if let Some(Value::Array(page)) = body.get(kind.key()) {
                    items.extend(
                        page.iter()
                            .filter(|i| i.get("name").and_then(Value::as_str).is_some())
                            .cloned(),
                    );
                }
                match body.get("nextCursor").and_then(Value::as_str) {
                    Some(c) if !c.is_empty() && cursor.as_deref() != Some(c) => {
                        cursor = Some(c.to_owned())
                    }
                    _ => break,
                }
            }
        }
        let items = Arc::new(items);
        self.cache.lock().expect("cache").insert(
            key,
            Cached {
                at: Instant::now(),
                items: items.clone(),
            },
        );
        Ok(items)
    }

    /// One server's live list of `kind` (for `/v1/mcp/servers/{name}/capabilities`).
    ///
    /// # Errors
    /// When the upstream cannot be started or fails the list.
    pub async fn fetch_server(&self, server: &McpServer, kind: ListKind) -> Result<Arc<Vec<Value>>, UpstreamError> {
        self.fetch(server, kind).await
    }

    /// Drops the cached lists of `server` (all kinds), or of every server.
    pub fn invalidate(&self, server: Option<&str>) {
        let mut c = self.cache.lock().expect("cache");
        match server {
            Some(s) => c.retain(|(n, _), _| n != s),
            None => c.clear(),
        }
    }

    /// Fans `kind` out to every enabled upstream in parallel (each bounded by the list
    /// deadline; a slow or failing one is left out and logged), merges in server-name order,
    /// assigns exposed names, refreshes the reverse map, and returns the enabled items with
    /// exposed names, plus `(server, original)` for each.
    pub async fn list(&self, kind: ListKind) -> Vec<(Value, String, String)> {
        self.list_all(kind).await.into_iter().filter(|l| l.enabled).map(|l| (l.item, l.server, l.original)).collect()
    }

    /// Like [`Session::list`] but keeps disabled items, flagged (for `/v1/tools`).
    pub async fn list_all(&self, kind: ListKind) -> Vec<Listed> {
        let snap = self.shared.snapshot.current();
        let mut servers: Vec<McpServer> = snap
            .servers
            .values()
            .filter(|s| s.enabled)
            .cloned()
            .collect();
        servers.sort_by(|a, b| a.name.cmp(&b.name));
        let deadline = self.shared.list_timeout();
        let fetches = servers.iter().map(|s| async move {
            match tokio::time::timeout(deadline, self.fetch(s, kind)).await {
                Ok(Ok(items)) => Some((s.name.clone(), items)),
                Ok(Err(e)) => {
                    tracing::warn!(server = %s.name, session = %self.id, error = %e, method = kind.method(), "Upstream left out of the list.");
                    self.shared.health.failed(&s.name, &e.to_string());
                    None
                }
                Err(_) => {
                    let msg = format!("{} took longer than {} ms", kind.method(), deadline.as_millis());
                    tracing::warn!(server = %s.name, session = %self.id, "{msg}; left out of the list.");
                    self.shared.health.failed(&s.name, &msg);
                    None
                }
            }
        });
        let results = futures_util::future::join_all(fetches).await;

        let mut all: Vec<(String, Value)> = Vec::new();
        if kind == ListKind::Tools {
            all.extend(
                super::builtin::definitions()
                    .into_iter()
                    .map(|d| ("coffer".to_owned(), d)),
            );
        }
        for (server, items) in results.into_iter().flatten() {
            all.extend(items.iter().map(|i| (server.clone(), i.clone())));
        }
        all.sort_by(|a, b| a.0.cmp(&b.0)); // stable: upstream order kept within a server
        let pairs: Vec<(String, String)> = all
            .iter()
            .map(|(s, i)| {
                (
                    s.clone(),
                    i.get("name")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned(),
                )
            })
            .collect();
        let exposed = naming::assign(&pairs, self.shared.max_name_len());
        let mut map = NameMap::default();
        let mut out = Vec::with_capacity(all.len());
        for (((server, mut item), (_, original)), name) in all.into_iter().zip(pairs).zip(exposed) {
            map.insert(name.clone(), server.clone(), original.clone());
            let enabled = snap.capability_enabled(&server, kind.kind(), &original);
            item["name"] = Value::String(name);
            out.push(Listed { item, server, original, enabled });
        }
        self.names.write().expect("names").insert(kind, map);
        out
    }

    /// Resolves an exposed name to `(server, original)` and checks policy — all before any
    /// upstream is contacted, unless the name is unknown to this session and its server is
    /// enabled (then the lists are fetched once to learn it).
    pub async fn resolve(&self, kind: ListKind, exposed: &str) -> Result<(String, String), RpcError> {
        let lookup = |s: &Self| {
            s.names
                .read()
                .expect("names")
                .get(&kind)
                .and_then(|m| m.get(exposed).cloned())
        };
        let snap = self.shared.snapshot.current();
        let noun = if kind == ListKind::Tools {
            "tool"
        } else {
            "prompt"
        };
        let disabled = |server: &str| {
            RpcError::new(TOOL_DISABLED, format!("Tool {exposed} is disabled")).with_data(
                json!({"code": "TOOL_DISABLED", "server": server, "tool": exposed, "kind": noun}),
            )
        };
        let found = match lookup(self) {
            Some(f) => f,
            None => {
                let Some((server, _)) = naming::split(exposed) else {
                    return Err(RpcError::new(
                        INVALID_PARAMS,
                        format!(
                            "Unknown {noun} {exposed:?}: exposed names look like <server>__<name>"
                        ),
                    ));
                };
                if server != "coffer" {
                    match snap.servers.get(server) {
                        None => {
                            return Err(RpcError::new(
                                INVALID_PARAMS,
                                format!("Unknown server {server:?} in {noun} {exposed:?}"),
                            ));
                        }
                        Some(s) if !s.enabled => return Err(disabled(server)),
                        Some(_) => {}
                    }
                }
                self.list(kind).await;
                lookup(self).ok_or_else(|| {
                    RpcError::new(INVALID_PARAMS, format!("Unknown {noun} {exposed:?}"))
                })?
            }
        };
        if !snap.capability_enabled(&found.0, kind.kind(), &found.1) {
            return Err(disabled(&found.0));
        }
        Ok(found)
    }

    /// Routes `tools/call` or `prompts/get`: resolve, check policy, forward with the original
    /// name, return the upstream's answer verbatim; records the invocation.
    pub async fn route_call(self: &Arc<Self>, kind: ListKind, params: Option<&RawValue>) -> Answer {
        let started = Instant::now();
        let method = if kind == ListKind::Tools {
            "tools/call"
        } else {
            "prompts/get"
        };
        let mut fields: std::collections::BTreeMap<String, Box<RawValue>> =
            match params.map(|p| serde_json::from_str(p.get())) {
                Some(Ok(f)) => f,
                _ => {
                    return Answer::Error(RpcError::new(
                        INVALID_PARAMS,
                        format!("{method} needs params {{name, arguments}}"),
                    ));
                }
            };
        let exposed: String = match fields
            .get("name")
            .map(|n| serde_json::from_str::<String>(n.get()))
        {
            Some(Ok(n)) => n,
            _ => {
                return Answer::Error(RpcError::new(
                    INVALID_PARAMS,
                    format!("{method} needs a string params.name"),
                ));
            }
        };
        let (answer, server) = match self.resolve(kind, &exposed).await {
            Err(e) => {
                let server = naming::split(&exposed)
                    .map(|(s, _)| s.to_owned())
                    .unwrap_or_default();
                (Answer::Error(e), server)
            }
            Ok((server, original)) if server == "coffer" && kind == ListKind::Tools => {
                let args = fields.get("arguments").map(|a| a.get().to_owned());
                (
                    super::builtin::call(self, &original, args.as_deref()).await,
                    server,
                )
            }
            Ok((server, original)) => {
                fields.insert(
                    "name".into(),
                    RawValue::from_string(serde_json::to_string(&original).expect("json"))
                        .expect("json"),
                );
                let forwarded =
                    RawValue::from_string(serde_json::to_string(&fields).expect("json"))
                        .expect("json");
                let answer = self.forward(&server, method, &forwarded).await;
                (answer, server)
            }
        };
        let outcome = match &answer {
            Answer::Result(_) => Outcome::Ok,
            Answer::UpstreamError(_) => Outcome::UpstreamError,
            Answer::Error(e) => e.outcome(),
        };
        self.shared.record(
            method,
            &exposed,
            &server,
            &self.id,
            started.elapsed(),
            outcome,
        );
        answer
    }

    async fn forward(&self, server: &str, method: &str, params: &RawValue) -> Answer {
        let Some(spec) = self.shared.snapshot.current().servers.get(server).cloned() else {
            return Answer::Error(RpcError::new(
                INVALID_PARAMS,
                format!("Unknown server {server:?}"),
            ));
        };
        let up = match self.upstream(&spec).await {
            Ok(u) => u,
            Err(e) => return Answer::Error(e.into()),
        };
        let timeout = if spec.timeout_ms > 0 {
            Duration::from_millis(spec.timeout_ms)
        } else {
            self.shared.call_timeout()
        };
        match up.request(method, Some(params), timeout).await {
            Ok(Reply::Result(r)) => Answer::Result(r),
            Ok(Reply::Error(e)) => Answer::UpstreamError(e),
            Err(e) => {
                if matches!(e, UpstreamError::Closed { .. }) {
                    self.shared.health.failed(server, &e.to_string());
                }
                Answer::Error(e.into())
            }
        }
    }

    /// Handles one downstream request (after `initialize`).
    pub async fn handle_request(
        self: &Arc<Self>,
        method: &str,
        params: Option<&RawValue>,
    ) -> Answer {
        self.touch();
        match method {
            "ping" => Answer::ok(json!({})),
            "tools/list" => {
                let tools: Vec<Value> = self
                    .list(ListKind::Tools)
                    .await
                    .into_iter()
                    .map(|(t, _, _)| t)
                    .collect();
                Answer::ok(json!({"tools": tools}))
            }
            "prompts/list" => {
                let prompts: Vec<Value> = self
                    .list(ListKind::Prompts)
                    .await
                    .into_iter()
                    .map(|(t, _, _)| t)
                    .collect();
                Answer::ok(json!({"prompts": prompts}))
            }
            "tools/call" => self.route_call(ListKind::Tools, params).await,
            "prompts/get" => self.route_call(ListKind::Prompts, params).await,
            "resources/list" => Answer::ok(json!({"resources": []})),
            "resources/templates/list" => Answer::ok(json!({"resourceTemplates": []})),
            "resources/read" => Answer::Error(RpcError::new(INVALID_PARAMS, "Unknown resource")),
            "resources/subscribe" | "resources/unsubscribe" => {
                Answer::Error(RpcError::new(INVALID_PARAMS, "Unknown resource"))
            }
            "completion/complete" => {
                Answer::ok(json!({"completion": {"values": [], "hasMore": false}}))
            }
            "logging/setLevel" => Answer::ok(json!({})),
            "initialize" => Answer::Error(RpcError::new(
                jsonrpc::INVALID_REQUEST,
                "session already initialized; start a new session without Mcp-Session-Id",
            )),
            other => Answer::Error(RpcError::new(
                METHOD_NOT_FOUND,
                format!("Method not found: {}", truncate(other, 100)),
            )),
        }
    }

    /// Handles a downstream notification (no answer).
    pub async fn handle_notification(&self, method: &str, _params: Option<&RawValue>) {
        self.touch();
        match method {
            "notifications/initialized" | "notifications/roots/list_changed" => {}
            other => {
                tracing::debug!(session = %self.id, method = %truncate(other, 100), "Notification ignored.")
            }
        }
    }

    /// Sends a notification to the client on its GET stream.
    pub fn notify_client(&self, method: &str, params: Option<Value>) {
        let msg = match params {
            Some(p) => json!({"jsonrpc": "2.0", "method": method, "params": p}),
            None => json!({"jsonrpc": "2.0", "method": method}),
        };
        self.outbound.push(msg.to_string());
    }
}

fn truncate(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

/// Handles what upstreams send on their own: list changes invalidate the cache and are
/// forwarded; log messages are forwarded with the server named; requests we cannot relay get an
/// error at once; progress is deliberately not forwarded.
async fn event_loop(
    session: std::sync::Weak<Session>,
    mut rx: mpsc::UnboundedReceiver<UpstreamEvent>,
    closed: CancellationToken,
) {
    loop {
        let ev = tokio::select! {
            _ = closed.cancelled() => return,
            ev = rx.recv() => match ev { Some(e) => e, None => return },
        };
        let Some(s) = session.upgrade() else { return };
        match ev {
            UpstreamEvent::Notification {
                server,
                method,
                params,
            } => match method.as_str() {
                "notifications/tools/list_changed"
                | "notifications/prompts/list_changed"
                | "notifications/resources/list_changed" => {
                    s.invalidate(Some(&server));
                    s.notify_client(&method, None);
                }
                "notifications/message" => {
                    let mut p: Value = params
                        .and_then(|p| serde_json::from_str(p.get()).ok())
                        .unwrap_or_else(|| json!({}));
                    if p.is_object() {
                        p["logger"] = Value::String(server);
                    }
                    s.notify_client(&method, Some(p));
                }
                _ => {}
            },
            UpstreamEvent::Request {
                server, id, method, ..
            } => {
                let up = {
                    let slot = s.slots.lock().expect("slots").get(&server).cloned();
                    match slot {
                        Some(slot) => match &*slot.state.lock().await {
                            SlotState::Ready { upstream, .. } => Some(upstream.clone()),
                            _ => None,
                        },
                        None => None,
                    }
                };
                if let Some(up) = up {
                    let reply = if method == "ping" {
                        Reply::Result(RawValue::from_string("{}".into()).expect("json"))
                    } else {
                        let err = json!({"code": METHOD_NOT_FOUND, "message": format!("Coffer cannot relay {method} to the client")});
                        Reply::Error(RawValue::from_string(err.to_string()).expect("json"))
                    };
                    let _ = up.respond(&id, reply).await;
                }
            }
            UpstreamEvent::Closed { server } => {
                tracing::info!(server = %server, session = %s.id, "Upstream exited.");
                s.invalidate(Some(&server));
            }
        }
    }
}

/// Tells the client about policy and registry changes (`notifications/*/list_changed`) and
/// stops upstreams whose server was removed or disabled.
async fn policy_watch(session: std::sync::Weak<Session>, closed: CancellationToken) {
    let mut rx = match session.upgrade() {
        Some(s) => s.shared.snapshot.subscribe(),
        None => return,
    };
    rx.mark_unchanged();
    loop {
        tokio::select! {
            _ = closed.cancelled() => return,
            r = rx.changed() => if r.is_err() { return },
        }
        let Some(s) = session.upgrade() else { return };
        let snap = rx.borrow_and_update().clone();
        let gone: Vec<Arc<Slot>> = {
            let mut slots = s.slots.lock().expect("slots");
            let names: Vec<String> = slots
                .keys()
                .filter(|n| !snap.servers.get(*n).is_some_and(|sv| sv.enabled))
                .cloned()
                .collect();
            names.into_iter().filter_map(|n| slots.remove(&n)).collect()
        };
        for slot in gone {
            if let SlotState::Ready { upstream, .. } =
                std::mem::replace(&mut *slot.state.lock().await, SlotState::Idle)
            {
                upstream.shutdown(Duration::from_secs(2)).await;
            }
        }
        s.notify_client("notifications/tools/list_changed", None);
        s.notify_client("notifications/prompts/list_changed", None);
    }
}
