//! `McpGatewaySession`: one downstream MCP session (one `Mcp-Session-Id`). It owns its own
//! upstream children, started lazily by the first request that needs them, caches each
//! upstream's capability lists for 60 s, keeps the reverse map from exposed names to
//! `(server, original name)`, checks policy before any upstream contact, and routes calls with
//! fresh upstream request ids, returning results verbatim.
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use coffer_proto::store::McpServer;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

use super::jsonrpc::{self, INVALID_PARAMS, METHOD_NOT_FOUND, TOOL_DISABLED, UPSTREAM_TIMEOUT, UPSTREAM_UNAVAILABLE};
use super::naming::{self, NameMap};
use super::upstream::{Reply, Upstream, UpstreamError, UpstreamEvent};
use super::{Outcome, Shared};
use crate::snapshot::{Generation, Kind};

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
    Resources,
    ResourceTemplates,
}

impl ListKind {
    pub fn method(self) -> &'static str {
        match self {
            ListKind::Tools => "tools/list",
            ListKind::Prompts => "prompts/list",
            ListKind::Resources => "resources/list",
            ListKind::ResourceTemplates => "resources/templates/list",
        }
    }
    /// Key of the items array in the list result.
    pub fn key(self) -> &'static str {
        match self {
            ListKind::Tools => "tools",
            ListKind::Prompts => "prompts",
            ListKind::Resources => "resources",
            ListKind::ResourceTemplates => "resourceTemplates",
        }
    }
    /// The server capability (in `initialize`) that offers this list.
    pub fn capability(self) -> &'static str {
        match self {
            ListKind::Tools => "tools",
            ListKind::Prompts => "prompts",
            ListKind::Resources | ListKind::ResourceTemplates => "resources",
        }
    }
    /// The field that identifies an item (and is rewritten when exposed).
    pub fn ident(self) -> &'static str {
        match self {
            ListKind::Tools | ListKind::Prompts => "name",
            ListKind::Resources => "uri",
            ListKind::ResourceTemplates => "uriTemplate",
        }
    }
    pub fn kind(self) -> Kind {
        match self {
            ListKind::Tools => Kind::Tool,
            ListKind::Prompts => Kind::Prompt,
            ListKind::Resources | ListKind::ResourceTemplates => Kind::Resource,
        }
    }
}

/// Prefix of exposed resource URIs: `coffer://<server>/<original URI, unencoded>`.
pub const URI_PREFIX: &str = "coffer://";

/// The exposed form of an upstream resource URI (or URI template).
pub fn expose_uri(server: &str, uri: &str) -> String {
    format!("{URI_PREFIX}{server}/{uri}")
}

/// Splits an exposed URI into `(server, original URI)`; `None` if it is not `coffer://…/…`.
pub fn split_uri(uri: &str) -> Option<(&str, &str)> {
    uri.strip_prefix(URI_PREFIX)?.split_once('/').filter(|(s, _)| !s.is_empty())
}

/// What the HTTP layer knows about the request being handled.
#[derive(Default, Clone)]
pub struct RequestCtx {
    /// The downstream request id as raw JSON text (for `notifications/cancelled`).
    pub id: Option<String>,
    /// The originating POST's response stream, for relaying upstream requests on it.
    pub side: Option<mpsc::UnboundedSender<String>>,
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
        Self { code, message: message.into(), data: None }
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
            UpstreamError::Timeout { server, ms } => {
                RpcError::new(UPSTREAM_TIMEOUT, e.to_string()).with_data(json!({"server": server, "timeout_ms": ms}))
            }
            UpstreamError::Start { server, .. } | UpstreamError::Closed { server, .. } => {
                RpcError::new(UPSTREAM_UNAVAILABLE, e.to_string()).with_data(json!({"server": server}))
            }
        }
    }
}

/// What a handled request produced: a raw result or an error (upstream errors stay raw).
pub enum Answer {
    Result(Box<RawValue>),
    UpstreamError(Box<RawValue>),
    Error(RpcError),
    /// The client cancelled the request (`notifications/cancelled`) while it was in flight.
    /// MCP (basic/utilities/cancellation): the receiver SHOULD NOT answer it, so the `/mcp`
    /// stream sends nothing; an HTTP POST, which must get a response, gets -32800.
    Cancelled,
}

impl Answer {
    fn ok(v: Value) -> Self {
        Answer::Result(RawValue::from_string(v.to_string()).expect("json"))
    }

    /// The JSON-RPC response text for downstream request `id` (raw).
    pub fn into_response(self, id: &RawValue) -> String {
        match self {
            Answer::Result(r) => format!("{{\"jsonrpc\":\"2.0\",\"id\":{},\"result\":{}}}", id.get(), r.get()),
            Answer::UpstreamError(e) => format!("{{\"jsonrpc\":\"2.0\",\"id\":{},\"error\":{}}}", id.get(), e.get()),
            Answer::Error(e) => {
                let id: Value = serde_json::from_str(id.get()).unwrap_or(Value::Null);
                jsonrpc::error_object(id, e.code, &e.message, e.data).to_string()
            }
            Answer::Cancelled => {
                let id: Value = serde_json::from_str(id.get()).unwrap_or(Value::Null);
                jsonrpc::error_object(id, jsonrpc::REQUEST_CANCELLED, "Request cancelled by the client", None)
                    .to_string()
            }
        }
    }
}

/// One message for the GET stream: its event id and the JSON-RPC text.
pub type OutboundEvent = (u64, Arc<str>);

/// Server→client messages for the session's GET stream, with ids for resumption.
pub struct Outbound {
    next: AtomicU64,
    ring: Mutex<VecDeque<(u64, Arc<str>)>>,
    tx: broadcast::Sender<(u64, Arc<str>)>,
}

impl Outbound {
    fn new() -> Self {
        Self { next: AtomicU64::new(1), ring: Mutex::new(VecDeque::new()), tx: broadcast::channel(1024).0 }
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
    pub fn subscribe(&self, last_event_id: Option<u64>) -> (Vec<OutboundEvent>, broadcast::Receiver<OutboundEvent>) {
        let ring = self.ring.lock().expect("outbound");
        let rx = self.tx.subscribe();
        let backlog = match last_event_id {
            Some(last) => ring.iter().filter(|(id, _)| *id > last).cloned().collect(),
            None => Vec::new(),
        };
        (backlog, rx)
    }

    /// True while at least one GET stream is open.
    pub fn has_listener(&self) -> bool {
        self.tx.receiver_count() > 0
    }
}

enum SlotState {
    Idle,
    Ready {
        upstream: Arc<Upstream>,
        generation: Generation,
    },
    /// The last start failed; the next is tried after a backoff, or at once when the registry
    /// record or a credential it references changed since (`generation`: what that start was
    /// for), e.g. a missing credential set again.
    Failed {
        at: Instant,
        attempts: u32,
        error: UpstreamError,
        generation: Generation,
    },
}

struct Slot {
    state: tokio::sync::Mutex<SlotState>,
    /// Lock-free-ish fast path for the common case: the running upstream and the registry
    /// version and credential epoch it was started for. Stale entries fail the liveness and
    /// generation check.
    ready: std::sync::RwLock<Option<(Arc<Upstream>, Generation)>>,
}

impl Slot {
    fn new() -> Self {
        Self { state: tokio::sync::Mutex::new(SlotState::Idle), ready: std::sync::RwLock::new(None) }
    }

    fn ready_for(&self, generation: Generation) -> Option<Arc<Upstream>> {
        match &*self.ready.read().expect("slot") {
            Some((u, g)) if *g == generation && u.is_alive() => Some(u.clone()),
            _ => None,
        }
    }
}

/// A capability list of one upstream: (server name, kind).
type ListKey = (String, ListKind);

struct Cached {
    at: Instant,
    items: Arc<Vec<Value>>,
}

/// One item of a merged list.
pub struct Listed {
    /// The upstream's definition with its name (or URI) replaced by the exposed one.
    pub item: Value,
    pub server: String,
    /// Original name, URI or URI template.
    pub original: String,
    /// Policy: server enabled and no `enabled = false` preference.
    pub enabled: bool,
}

/// A request an upstream sent that waits for the downstream client's answer.
struct Relay {
    server: String,
    upstream_id: Box<RawValue>,
}

/// A POST response stream that upstream requests may be relayed on while its call runs.
struct RelayStream {
    token: u64,
    server: String,
    side: mpsc::UnboundedSender<String>,
}

/// One downstream session.
pub struct Session {
    pub id: String,
    pub protocol_version: String,
    /// `{protocolVersion, capabilities, clientInfo}` mirrored to each upstream's `initialize`.
    init_params: Value,
    shared: Arc<Shared>,
    slots: Mutex<HashMap<String, Arc<Slot>>>,
    cache: Mutex<HashMap<ListKey, Cached>>,
    /// One gate per list being fetched, and the last failed fetch of each (see `fetch`).
    fetching: Mutex<HashMap<ListKey, Arc<tokio::sync::Mutex<()>>>>,
    fetch_failed: Mutex<HashMap<ListKey, (Instant, UpstreamError)>>,
    names: RwLock<HashMap<ListKind, NameMap>>,
    last_activity: Mutex<Instant>,
    pub outbound: Outbound,
    pub closed: CancellationToken,
    events_tx: mpsc::UnboundedSender<UpstreamEvent>,
    /// Level set by `logging/setLevel`, applied to upstreams started later too.
    log_level: Mutex<Option<String>>,
    /// Unprefixed resource URIs that an upstream returned in a tool result this session.
    tool_uris: Mutex<HashMap<String, String>>,
    /// Downstream request id (raw JSON text) → (server, upstream request id), while in flight.
    inflight: Mutex<HashMap<String, (String, u64)>>,
    /// Downstream request ids (raw JSON text) the client cancelled while they were in flight;
    /// each is taken out again when its request ends (as [`Answer::Cancelled`]).
    cancelled: Mutex<HashSet<String>>,
    relay_streams: Mutex<Vec<RelayStream>>,
    relays: Arc<Mutex<HashMap<String, Relay>>>,
    counter: AtomicU64,
}

/// Removes a [`RelayStream`] registration when the call that made it ends.
struct StreamGuard<'a> {
    session: &'a Session,
    token: u64,
}

impl Drop for StreamGuard<'_> {
    fn drop(&mut self) {
        self.session.relay_streams.lock().expect("streams").retain(|r| r.token != self.token);
    }
}

impl Session {
    /// Creates a session for a client that sent `initialize` with `params` and negotiated
    /// `protocol_version`; starts its event and policy-watch tasks.
    pub fn new(id: String, protocol_version: String, params: &Value, shared: Arc<Shared>) -> Arc<Self> {
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
            fetching: Mutex::default(),
            fetch_failed: Mutex::default(),
            names: RwLock::default(),
            last_activity: Mutex::new(Instant::now()),
            outbound: Outbound::new(),
            closed: CancellationToken::new(),
            events_tx,
            log_level: Mutex::default(),
            tool_uris: Mutex::default(),
            inflight: Mutex::default(),
            cancelled: Mutex::default(),
            relay_streams: Mutex::default(),
            relays: Arc::default(),
            counter: AtomicU64::new(1),
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

    /// Whether the downstream client declared capability `name` (`sampling`, `roots`, …).
    fn client_has(&self, name: &str) -> bool {
        self.init_params["capabilities"].get(name).is_some()
    }

    /// Ends the session: every upstream child is terminated and its pid record removed.
    pub async fn close(&self) {
        self.closed.cancel();
        let slots: Vec<Arc<Slot>> = self.slots.lock().expect("slots").drain().map(|(_, s)| s).collect();
        futures_util::future::join_all(slots.into_iter().map(|slot| async move {
            let mut st = slot.state.lock().await;
            if let SlotState::Ready { upstream, .. } = std::mem::replace(&mut *st, SlotState::Idle) {
                upstream.shutdown(Duration::from_secs(2)).await;
            }
        }))
        .await;
    }

    /// Names of upstreams running in this session.
    pub fn running_upstreams(&self) -> Vec<String> {
        let slots = self.slots.lock().expect("slots");
        slots
            .iter()
            .filter(|(_, s)| {
                s.state
                    .try_lock()
                    .is_ok_and(|st| matches!(&*st, SlotState::Ready { upstream, .. } if upstream.is_alive()))
            })
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// The running upstream for `server`, if any (never starts one).
    async fn running(&self, server: &str) -> Option<Arc<Upstream>> {
        let slot = self.slots.lock().expect("slots").get(server).cloned()?;
        match &*slot.state.lock().await {
            SlotState::Ready { upstream, .. } if upstream.is_alive() => Some(upstream.clone()),
            _ => None,
        }
    }

    /// The running upstream for `server`, started on demand (with bounded backoff after a
    /// failed start; restarted at once after a crash, a registry change or a change to a
    /// credential it references). `generation` is the snapshot's [`crate::snapshot::Snapshot::generation`] of
    /// `server`.
    async fn upstream(&self, server: &McpServer, generation: Generation) -> Result<Arc<Upstream>, UpstreamError> {
        let slot = {
            let mut slots = self.slots.lock().expect("slots");
            match slots.get(&server.name) {
                Some(slot) => slot.clone(),
                None => slots.entry(server.name.clone()).or_insert_with(|| Arc::new(Slot::new())).clone(),
            }
        };
        match slot.ready_for(generation) {
            Some(u) => Ok(u),
            // Boxed: the start path is large, and every call's future would otherwise carry it.
            None => Box::pin(self.start_upstream(server, generation, slot)).await,
        }
    }

    /// [`Session::upstream`] when the slot has no live upstream of the current version: starts
    /// one (once, however many callers wait), with backoff after failures.
    async fn start_upstream(
        &self,
        server: &McpServer,
        generation: Generation,
        slot: Arc<Slot>,
    ) -> Result<Arc<Upstream>, UpstreamError> {
        let mut st = slot.state.lock().await;
        let attempts = match &*st {
            SlotState::Ready { upstream, generation: started } if upstream.is_alive() && *started == generation => {
                return Ok(upstream.clone());
            }
            SlotState::Ready { upstream, .. } => {
                upstream.shutdown(Duration::from_secs(2)).await;
                0
            }
            SlotState::Failed { generation: failed_for, .. } if *failed_for != generation => 0,
            SlotState::Failed { at, attempts, error, .. } => {
                let backoff =
                    Duration::from_millis(500u64.saturating_mul(1 << (*attempts).min(6))).min(Duration::from_secs(30));
                if at.elapsed() < backoff {
                    return Err(error.clone());
                }
                *attempts
            }
            SlotState::Idle => 0,
        };
        if self.closed.is_cancelled() {
            return Err(UpstreamError::Closed { server: server.name.clone(), reason: "session ended".into() });
        }
        let started = Instant::now();
        // Credential references become values only here, only for this child; a missing
        // credential fails the start like any other start error (-32001, naming it).
        let res = match self.shared.resolve_server(server).await {
            Ok((resolved, secrets)) => {
                Upstream::start(
                    &resolved,
                    &self.shared.home,
                    &self.init_params,
                    self.events_tx.clone(),
                    self.shared.start_timeout(),
                    secrets,
                )
                .await
            }
            Err(reason) => Err(UpstreamError::Start { server: server.name.clone(), reason }),
        };
        match res {
            Ok(u) => {
                tracing::info!(server = %server.name, session = %self.id, pid = u.pid, elapsed_ms = started.elapsed().as_millis() as u64, "Upstream started.");
                self.shared.health.started(&server.name);
                let level = self.log_level.lock().expect("level").clone();
                if let Some(level) = level
                    && u.has_capability("logging")
                {
                    let p = RawValue::from_string(json!({"level": level}).to_string()).expect("json");
                    let _ = u.request("logging/setLevel", Some(&p), self.shared.list_timeout()).await;
                }
                *slot.ready.write().expect("slot") = Some((u.clone(), generation));
                *st = SlotState::Ready { upstream: u.clone(), generation };
                Ok(u)
            }
            Err(e) => {
                tracing::warn!(server = %server.name, session = %self.id, error = %e, "Upstream failed to start.");
                self.shared.health.failed(&server.name, &e.to_string());
                *st = SlotState::Failed { at: Instant::now(), attempts: attempts + 1, error: e.clone(), generation };
                Err(e)
            }
        }
    }

    /// One upstream's full list of `kind` (all pages), from the cache when fresh.
    ///
    /// One fetch per (server, kind) at a time: requests that need the same list meanwhile wait
    /// for it and take its outcome (its list from the cache, or its error), so a burst of
    /// `tools/list` costs the upstream one list, not one per request.
    async fn fetch(&self, server: &McpServer, kind: ListKind) -> Result<Arc<Vec<Value>>, UpstreamError> {
        let key = (server.name.clone(), kind);
        if let Some(items) = self.cached(&key) {
            return Ok(items);
        }
        let asked = Instant::now();
        let gate = self.fetching.lock().expect("fetching").entry(key.clone()).or_default().clone();
        let _turn = gate.lock().await;
        if let Some(items) = self.cached(&key) {
            return Ok(items);
        }
        if let Some((at, err)) = self.fetch_failed.lock().expect("fetching").get(&key)
            && *at > asked
        {
            return Err(err.clone());
        }
        let result = self.fetch_now(server, kind).await;
        match &result {
            Ok(items) => {
                self.cache.lock().expect("cache").insert(key, Cached { at: Instant::now(), items: items.clone() });
            }
            Err(e) => {
                self.fetch_failed.lock().expect("fetching").insert(key, (Instant::now(), e.clone()));
            }
        }
        result
    }

    fn cached(&self, key: &ListKey) -> Option<Arc<Vec<Value>>> {
        let cache = self.cache.lock().expect("cache");
        cache.get(key).filter(|c| c.at.elapsed() < LIST_TTL).map(|c| c.items.clone())
    }

    /// [`Session::fetch`] without cache or sharing.
    async fn fetch_now(&self, server: &McpServer, kind: ListKind) -> Result<Arc<Vec<Value>>, UpstreamError> {
        let up = self.upstream(server, self.shared.snapshot.current().generation(server)).await?;
        let mut items = Vec::new();
        if up.has_capability(kind.capability()) {
            let mut cursor: Option<String> = None;
            for _ in 0..MAX_PAGES {
                let params =
                    cursor.as_ref().map(|c| RawValue::from_string(json!({"cursor": c}).to_string()).expect("json"));
                let reply = up.request(kind.method(), params.as_deref(), self.shared.list_timeout()).await?;
                let body: Value = match reply {
                    Reply::Result(r) => serde_json::from_str(r.get()).unwrap_or_default(),
                    Reply::Error(e) => {
                        // An upstream without this list (e.g. no templates) is simply empty.
                        let code = serde_json::from_str::<Value>(e.get()).ok().and_then(|v| v["code"].as_i64());
                        if code == Some(METHOD_NOT_FOUND) {
                            break;
                        }
                        return Err(UpstreamError::Closed {
                            server: server.name.clone(),
                            reason: format!("{} failed: {}", kind.method(), e.get()),
                        });
                    }
                };
                if let Some(Value::Array(page)) = body.get(kind.key()) {
                    items
                        .extend(page.iter().filter(|i| i.get(kind.ident()).and_then(Value::as_str).is_some()).cloned());
                }
                match body.get("nextCursor").and_then(Value::as_str) {
                    Some(c) if !c.is_empty() && cursor.as_deref() != Some(c) => cursor = Some(c.to_owned()),
                    _ => break,
                }
            }
        }
        Ok(Arc::new(items))
    }

    /// The `initialize` result of `server`'s running upstream in this session, if any.
    pub async fn upstream_init(&self, server: &str) -> Option<Value> {
        self.running(server).await.map(|u| u.init_result.clone())
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

    /// Fans `kind` out to every enabled upstream in parallel and returns the enabled items with
    /// exposed names (see [`Session::list_all`]).
    pub async fn list(&self, kind: ListKind) -> Vec<(Value, String, String)> {
        self.list_all(kind).await.into_iter().filter(|l| l.enabled).map(|l| (l.item, l.server, l.original)).collect()
    }

    /// Fans `kind` out to every enabled upstream in parallel (each bounded by the list
    /// deadline; a slow or failing one is left out, logged and shown in status), merges in
    /// server-name order, assigns exposed names (or `coffer://` URIs), refreshes the reverse
    /// map, and returns every item with its policy flag.
    pub async fn list_all(&self, kind: ListKind) -> Vec<Listed> {
        let snap = self.shared.snapshot.current();
        let mut servers: Vec<McpServer> = snap.servers.values().filter(|s| s.enabled).cloned().collect();
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
            all.extend(super::builtin::definitions().into_iter().map(|d| ("coffer".to_owned(), d)));
        }
        for (server, items) in results.into_iter().flatten() {
            all.extend(items.iter().map(|i| (server.clone(), i.clone())));
        }
        all.sort_by(|a, b| a.0.cmp(&b.0)); // stable: upstream order kept within a server
        let ident = kind.ident();
        let pairs: Vec<(String, String)> = all
            .iter()
            .map(|(s, i)| (s.clone(), i.get(ident).and_then(Value::as_str).unwrap_or_default().to_owned()))
            .collect();
        let exposed: Vec<String> = match kind {
            ListKind::Tools | ListKind::Prompts => naming::assign(&pairs, self.shared.max_name_len()),
            ListKind::Resources | ListKind::ResourceTemplates => pairs.iter().map(|(s, o)| expose_uri(s, o)).collect(),
        };
        let mut map = NameMap::default();
        let mut out = Vec::with_capacity(all.len());
        for (((server, mut item), (_, original)), name) in all.into_iter().zip(pairs).zip(exposed) {
            map.insert(name.clone(), server.clone(), original.clone());
            let enabled = snap.capability_enabled(&server, kind.kind(), &original);
            item[ident] = Value::String(name);
            out.push(Listed { item, server, original, enabled });
        }
        if matches!(kind, ListKind::Tools | ListKind::Prompts) {
            self.names.write().expect("names").insert(kind, map);
        }
        out
    }

    /// The `TOOL_DISABLED` error; `data.scope` says whether the capability itself or its whole
    /// server is disabled.
    fn disabled(snap: &crate::snapshot::Snapshot, exposed: &str, server: &str, noun: &str) -> RpcError {
        let scope =
            if server != "coffer" && !snap.servers.get(server).is_some_and(|s| s.enabled) { "server" } else { noun };
        let what = if noun == "tool" {
            "Tool"
        } else if noun == "prompt" {
            "Prompt"
        } else {
            "Resource"
        };
        RpcError::new(TOOL_DISABLED, format!("{what} {exposed} is disabled")).with_data(
            json!({"code": "TOOL_DISABLED", "server": server, "tool": exposed, "kind": noun, "scope": scope}),
        )
    }

    /// Resolves an exposed tool or prompt name to `(server, original)` and checks policy — all
    /// before any upstream is contacted, unless the name is unknown to this session and its
    /// server is enabled (then the lists are fetched once to learn it).
    ///
    /// # Errors
    /// -32602 for an unknown name or server; -32000 `TOOL_DISABLED`.
    pub async fn resolve(&self, kind: ListKind, exposed: &str) -> Result<(String, String), RpcError> {
        let noun = if kind == ListKind::Tools { "tool" } else { "prompt" };
        if exposed.chars().count() > naming::ABSOLUTE_MAX_LEN {
            // No exposed name is that long; the error quotes only its start.
            return Err(RpcError::new(
                INVALID_PARAMS,
                format!(
                    "Unknown {noun} \"{}…\" ({} bytes): exposed names have at most {} characters",
                    truncate(exposed, 40),
                    exposed.len(),
                    naming::ABSOLUTE_MAX_LEN
                ),
            ));
        }
        let lookup = |s: &Self| s.names.read().expect("names").get(&kind).and_then(|m| m.get(exposed).cloned());
        let snap = self.shared.snapshot.current();
        let found = match lookup(self) {
            Some(f) => f,
            None => {
                let Some((server, _)) = naming::split(exposed) else {
                    return Err(RpcError::new(
                        INVALID_PARAMS,
                        format!("Unknown {noun} {exposed:?}: exposed names look like <server>__<name>"),
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
                        Some(s) if !s.enabled => return Err(Self::disabled(&snap, exposed, server, noun)),
                        Some(_) => {}
                    }
                }
                // Policy before contact: an exposed name that was not rewritten is
                // `<server>__<original>`, so a disabled capability is refused here, before its
                // upstream is started to learn the session's names.
                if let Some((_, original)) = naming::split(exposed)
                    && !snap.capability_enabled(server, kind.kind(), original)
                {
                    return Err(Self::disabled(&snap, exposed, server, noun));
                }
                // Learn only this server's names: exposed names never collide across servers
                // (the `<server>__` prefix is kept whole), so an unrelated slow or hung upstream
                // never delays this call.
                Box::pin(self.learn_names(kind, server)).await?;
                lookup(self).ok_or_else(|| RpcError::new(INVALID_PARAMS, format!("Unknown {noun} {exposed:?}")))?
            }
        };
        if found.0 != "coffer" && !snap.servers.contains_key(&found.0) {
            return Err(RpcError::new(
                INVALID_PARAMS,
                format!("Unknown server {:?} in {noun} {exposed:?}: it was removed", found.0),
            ));
        }
        if !snap.capability_enabled(&found.0, kind.kind(), &found.1) {
            return Err(Self::disabled(&snap, exposed, &found.0, noun));
        }
        Ok(found)
    }

    /// Fetches one server's list of `kind` (bounded by the list deadline) and adds its exposed
    /// names to the session's reverse map.
    ///
    /// # Errors
    /// -32001 naming the upstream when it cannot be started or listed in time.
    async fn learn_names(&self, kind: ListKind, server: &str) -> Result<(), RpcError> {
        let items: Arc<Vec<Value>> = if server == "coffer" {
            Arc::new(if kind == ListKind::Tools { super::builtin::definitions() } else { Vec::new() })
        } else {
            let Some(spec) = self.shared.snapshot.current().servers.get(server).cloned() else {
                return Err(RpcError::new(INVALID_PARAMS, format!("Unknown server {server:?}")));
            };
            let deadline = self.shared.list_timeout();
            match tokio::time::timeout(deadline, self.fetch(&spec, kind)).await {
                Ok(Ok(items)) => items,
                Ok(Err(e)) => return Err(e.into()),
                Err(_) => {
                    return Err(RpcError::new(
                        UPSTREAM_UNAVAILABLE,
                        format!("upstream {server} did not list its {} within {} ms", kind.key(), deadline.as_millis()),
                    )
                    .with_data(json!({"server": server})));
                }
            }
        };
        let pairs: Vec<(String, String)> = items
            .iter()
            .map(|i| (server.to_owned(), i.get("name").and_then(Value::as_str).unwrap_or_default().to_owned()))
            .collect();
        let exposed = naming::assign(&pairs, self.shared.max_name_len());
        let mut names = self.names.write().expect("names");
        let map = names.entry(kind).or_default();
        for ((server, original), name) in pairs.into_iter().zip(exposed) {
            map.insert(name, server, original);
        }
        Ok(())
    }

    /// Resolves a resource URI: `coffer://<server>/<uri>`, or an unprefixed URI an upstream
    /// returned in a tool result this session. Checks policy.
    fn resolve_uri(&self, uri: &str) -> Result<(String, String), RpcError> {
        let snap = self.shared.snapshot.current();
        let (server, original) = match split_uri(uri) {
            Some((server, original)) => (server.to_owned(), original.to_owned()),
            None => match self.tool_uris.lock().expect("uris").get(uri) {
                Some(server) => (server.clone(), uri.to_owned()),
                None => {
                    return Err(RpcError::new(
                        INVALID_PARAMS,
                        format!(
                            "Unknown resource {:?}: resource URIs look like coffer://<server>/<uri>",
                            truncate(uri, 200)
                        ),
                    ));
                }
            },
        };
        match snap.servers.get(&server) {
            None => Err(RpcError::new(
                INVALID_PARAMS,
                format!("Unknown server {:?} in resource URI", truncate(&server, 100)),
            )),
            Some(s) if !s.enabled => Err(Self::disabled(&snap, uri, &server, "resource")),
            Some(_) if !snap.capability_enabled(&server, Kind::Resource, &original) => {
                Err(Self::disabled(&snap, uri, &server, "resource"))
            }
            Some(_) => Ok((server, original)),
        }
    }

    /// Routes `tools/call` or `prompts/get`: resolve, check policy, forward with the original
    /// name, return the upstream's answer verbatim; records the invocation.
    pub async fn route_call(self: &Arc<Self>, kind: ListKind, params: Option<&RawValue>) -> Answer {
        self.route_call_ctx(kind, params, &RequestCtx::default()).await
    }

    async fn route_call_ctx(self: &Arc<Self>, kind: ListKind, params: Option<&RawValue>, ctx: &RequestCtx) -> Answer {
        let started = Instant::now();
        let method = if kind == ListKind::Tools { "tools/call" } else { "prompts/get" };
        let fields = match parse_fields(params) {
            Some(f) => f,
            None => {
                return Answer::Error(RpcError::new(
                    INVALID_PARAMS,
                    format!("{method} needs params {{name, arguments}}"),
                ));
            }
        };
        let exposed: String = match fields.get("name").map(|n| serde_json::from_str::<String>(n.get())) {
            Some(Ok(n)) => n,
            _ => return Answer::Error(RpcError::new(INVALID_PARAMS, format!("{method} needs a string params.name"))),
        };
        let (answer, server) = match self.resolve(kind, &exposed).await {
            Err(e) => (Answer::Error(e), naming::split(&exposed).map(|(s, _)| s.to_owned()).unwrap_or_default()),
            Ok((server, original)) if server == "coffer" && kind == ListKind::Tools => {
                let args = fields.get("arguments").map(|a| a.get().to_owned());
                (Box::pin(super::builtin::call(self, &original, args.as_deref())).await, server)
            }
            Ok((server, original)) => {
                let forwarded = to_raw(&fields, "name", &raw_string(&original));
                let answer = self.forward(&server, method, &forwarded, ctx).await;
                if kind == ListKind::Tools
                    && let Answer::Result(r) = &answer
                {
                    self.learn_uris(&server, r);
                }
                (answer, server)
            }
        };
        let outcome = answer.outcome();
        self.shared.record(method, &exposed, &server, &self.id, started.elapsed(), outcome);
        answer
    }

    /// Remembers resource URIs a tool result points at (`resource_link`, embedded resources),
    /// so a later unprefixed `resources/read` of one reaches the same upstream.
    fn learn_uris(&self, server: &str, result: &RawValue) {
        if !result.get().contains("\"resource") {
            return;
        }
        let Ok(v) = serde_json::from_str::<Value>(result.get()) else { return };
        let Some(content) = v.get("content").and_then(Value::as_array) else { return };
        let mut uris = self.tool_uris.lock().expect("uris");
        for block in content {
            let uri = match block.get("type").and_then(Value::as_str) {
                Some("resource_link") => block.get("uri"),
                Some("resource") => block.get("resource").and_then(|r| r.get("uri")),
                _ => None,
            };
            if let Some(u) = uri.and_then(Value::as_str)
                && uris.len() < 10_000
            {
                uris.insert(u.to_owned(), server.to_owned());
            }
        }
    }

    /// `resources/read`, `resources/subscribe`, `resources/unsubscribe`: resolve the URI, forward
    /// with the original one; in read results, `contents[].uri` is rewritten to the exposed form
    /// when the request used it.
    async fn route_resource(self: &Arc<Self>, method: &str, params: Option<&RawValue>, ctx: &RequestCtx) -> Answer {
        let started = Instant::now();
        let Some(fields) = parse_fields(params) else {
            return Answer::Error(RpcError::new(INVALID_PARAMS, format!("{method} needs params {{uri}}")));
        };
        let Some(Ok(uri)) = fields.get("uri").map(|u| serde_json::from_str::<String>(u.get())) else {
            return Answer::Error(RpcError::new(INVALID_PARAMS, format!("{method} needs a string params.uri")));
        };
        let (server, original) = match self.resolve_uri(&uri) {
            Ok(p) => p,
            Err(e) => {
                if method == "resources/read" {
                    let server = split_uri(&uri).map(|(s, _)| s.to_owned()).unwrap_or_default();
                    self.shared.record("resources/read", &uri, &server, &self.id, started.elapsed(), e.outcome());
                }
                return Answer::Error(e);
            }
        };
        let forwarded = to_raw(&fields, "uri", &raw_string(&original));
        let mut answer = self.forward(&server, method, &forwarded, ctx).await;
        if method == "resources/read"
            && split_uri(&uri).is_some()
            && let Answer::Result(r) = &answer
            && let Ok(mut v) = serde_json::from_str::<Value>(r.get())
        {
            if let Some(contents) = v.get_mut("contents").and_then(Value::as_array_mut) {
                for c in contents {
                    if let Some(u) = c.get("uri").and_then(Value::as_str) {
                        c["uri"] = Value::String(expose_uri(&server, u));
                    }
                }
            }
            answer = Answer::ok(v);
        }
        if method == "resources/read" {
            let outcome = answer.outcome();
            self.shared.record("resources/read", &uri, &server, &self.id, started.elapsed(), outcome);
        }
        answer
    }

    /// `completion/complete`: routes by `ref/prompt` name or `ref/resource` URI.
    async fn route_completion(self: &Arc<Self>, params: Option<&RawValue>, ctx: &RequestCtx) -> Answer {
        let Some(mut p) = params.and_then(|p| serde_json::from_str::<Value>(p.get()).ok()) else {
            return Answer::Error(RpcError::new(INVALID_PARAMS, "completion/complete needs params {ref, argument}"));
        };
        let server = match p["ref"]["type"].as_str() {
            Some("ref/prompt") => {
                let name = p["ref"]["name"].as_str().unwrap_or_default().to_owned();
                match self.resolve(ListKind::Prompts, &name).await {
                    Ok((server, original)) => {
                        p["ref"]["name"] = Value::String(original);
                        server
                    }
                    Err(e) => return Answer::Error(e),
                }
            }
            Some("ref/resource") => {
                let uri = p["ref"]["uri"].as_str().unwrap_or_default().to_owned();
                match self.resolve_uri(&uri) {
                    Ok((server, original)) => {
                        p["ref"]["uri"] = Value::String(original);
                        server
                    }
                    Err(e) => return Answer::Error(e),
                }
            }
            _ => {
                return Answer::Error(RpcError::new(
                    INVALID_PARAMS,
                    "completion/complete needs ref.type ref/prompt or ref/resource",
                ));
            }
        };
        let raw = RawValue::from_string(p.to_string()).expect("json");
        self.forward(&server, "completion/complete", &raw, ctx).await
    }

    /// `logging/setLevel`: remembered for the session and applied to every running upstream
    /// that offers logging.
    async fn set_level(&self, params: Option<&RawValue>) -> Answer {
        let level = params
            .and_then(|p| serde_json::from_str::<Value>(p.get()).ok())
            .and_then(|v| v["level"].as_str().map(str::to_owned));
        let Some(level) = level else {
            return Answer::Error(RpcError::new(INVALID_PARAMS, "logging/setLevel needs params.level"));
        };
        *self.log_level.lock().expect("level") = Some(level.clone());
        let names: Vec<String> = self.slots.lock().expect("slots").keys().cloned().collect();
        let p = RawValue::from_string(json!({"level": level}).to_string()).expect("json");
        for name in names {
            if let Some(up) = self.running(&name).await
                && up.has_capability("logging")
                && let Err(e) = up.request("logging/setLevel", Some(&p), self.shared.list_timeout()).await
            {
                tracing::debug!(server = %name, error = %e, "logging/setLevel not applied.");
            }
        }
        Answer::ok(json!({}))
    }

    async fn forward(&self, server: &str, method: &str, params: &RawValue, ctx: &RequestCtx) -> Answer {
        let snapshot = self.shared.snapshot.current();
        let Some(spec) = snapshot.servers.get(server) else {
            return Answer::Error(RpcError::new(INVALID_PARAMS, format!("Unknown server {server:?}")));
        };
        let up = match self.upstream(spec, snapshot.generation(spec)).await {
            Ok(u) => u,
            Err(e) => return Answer::Error(e.into()),
        };
        let timeout =
            if spec.timeout_ms > 0 { Duration::from_millis(spec.timeout_ms) } else { self.shared.call_timeout() };
        let _guard = ctx.side.as_ref().map(|side| {
            let token = self.counter.fetch_add(1, Ordering::Relaxed);
            self.relay_streams.lock().expect("streams").push(RelayStream {
                token,
                server: server.to_owned(),
                side: side.clone(),
            });
            StreamGuard { session: self, token }
        });
        let heard = up.heard();
        let (uid, rx) = match up.begin(method, Some(params)).await {
            Ok(p) => p,
            Err(e) => return Answer::Error(e.into()),
        };
        if let Some(id) = &ctx.id {
            self.inflight.lock().expect("inflight").insert(id.clone(), (server.to_owned(), uid));
        }
        let res = up.finish(uid, rx, timeout, Some(heard)).await;
        if let Some(id) = &ctx.id {
            // Under the `inflight` lock, as the cancel handler marks it: a cancel either finds
            // the request in flight and marks it, or finds it gone and does nothing.
            let mut inflight = self.inflight.lock().expect("inflight");
            inflight.remove(id);
            if self.cancelled.lock().expect("cancelled").remove(id) {
                return Answer::Cancelled;
            }
        }
        match res {
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
    pub async fn handle_request(self: &Arc<Self>, method: &str, params: Option<&RawValue>) -> Answer {
        self.handle_request_ctx(method, params, &RequestCtx::default()).await
    }

    /// Handles one downstream request with what the HTTP layer knows about it.
    pub async fn handle_request_ctx(
        self: &Arc<Self>,
        method: &str,
        params: Option<&RawValue>,
        ctx: &RequestCtx,
    ) -> Answer {
        self.touch();
        let list = |kind: ListKind| async move {
            let items: Vec<Value> = self.list(kind).await.into_iter().map(|(t, _, _)| t).collect();
            let mut body = serde_json::Map::new();
            body.insert(kind.key().to_owned(), Value::Array(items));
            Answer::ok(Value::Object(body))
        };
        match method {
            "ping" => Answer::ok(json!({})),
            // `tools/call` is the hot path; the other methods' futures are boxed so that every
            // call's task does not carry (and move) the largest of them.
            "tools/call" => self.route_call_ctx(ListKind::Tools, params, ctx).await,
            "tools/list" => Box::pin(list(ListKind::Tools)).await,
            "prompts/list" => Box::pin(list(ListKind::Prompts)).await,
            "resources/list" => Box::pin(list(ListKind::Resources)).await,
            "resources/templates/list" => Box::pin(list(ListKind::ResourceTemplates)).await,
            "prompts/get" => Box::pin(self.route_call_ctx(ListKind::Prompts, params, ctx)).await,
            "resources/read" | "resources/subscribe" | "resources/unsubscribe" => {
                Box::pin(self.route_resource(method, params, ctx)).await
            }
            "completion/complete" => Box::pin(self.route_completion(params, ctx)).await,
            "logging/setLevel" => Box::pin(self.set_level(params)).await,
            "initialize" => Answer::Error(RpcError::new(
                jsonrpc::INVALID_REQUEST,
                "session already initialized; initialize again only in a new session",
            )),
            other => {
                Answer::Error(RpcError::new(METHOD_NOT_FOUND, format!("Method not found: {}", truncate(other, 100))))
            }
        }
    }

    /// Handles a downstream notification (no answer). `notifications/cancelled` is forwarded to
    /// the upstream handling that request, with the upstream's request id.
    pub async fn handle_notification(&self, method: &str, params: Option<&RawValue>) {
        self.touch();
        match method {
            "notifications/cancelled" => {
                let p: Value = params.and_then(|p| serde_json::from_str(p.get()).ok()).unwrap_or_default();
                let Some(rid) = p.get("requestId") else { return };
                let key = rid.to_string();
                let found = {
                    let inflight = self.inflight.lock().expect("inflight");
                    let found = inflight.get(&key).cloned();
                    if found.is_some() {
                        self.cancelled.lock().expect("cancelled").insert(key);
                    }
                    found
                };
                match found {
                    Some((server, uid)) => {
                        if let Some(up) = self.running(&server).await {
                            let reason = p.get("reason").and_then(Value::as_str).unwrap_or("cancelled by the client");
                            up.cancel(uid, reason).await;
                            up.fail_local(uid, jsonrpc::REQUEST_CANCELLED, "Request cancelled by the client");
                        }
                    }
                    None => tracing::debug!(session = %self.id, "Cancel for an unknown or finished request ignored."),
                }
            }
            "notifications/initialized" => {}
            "notifications/roots/list_changed" => {
                let names: Vec<String> = self.slots.lock().expect("slots").keys().cloned().collect();
                for n in names {
                    if let Some(up) = self.running(&n).await {
                        let _ = up.notify(method, None).await;
                    }
                }
            }
            other => tracing::debug!(session = %self.id, method = %truncate(other, 100), "Notification ignored."),
        }
    }

    /// A response from the client to a request we relayed from an upstream: passed back to that
    /// upstream with its original id. Unknown ids are ignored (already answered or timed out).
    pub async fn handle_response(&self, id: &RawValue, result: Option<Box<RawValue>>, error: Option<Box<RawValue>>) {
        self.touch();
        let relay = self.relays.lock().expect("relays").remove(id.get());
        let Some(relay) = relay else {
            tracing::debug!(session = %self.id, "Response for an unknown relayed request ignored.");
            return;
        };
        let reply = match (result, error) {
            (Some(r), _) => Reply::Result(r),
            (None, Some(e)) => Reply::Error(e),
            (None, None) => Reply::Result(RawValue::from_string("{}".into()).expect("json")),
        };
        if let Some(up) = self.running(&relay.server).await {
            let _ = up.respond(&relay.upstream_id, reply).await;
        }
    }

    /// Relays a request an upstream sent (`sampling/createMessage`, `elicitation/create`,
    /// `roots/list`, `ping`) to the client: on the originating POST's stream when a call to that
    /// upstream is running, else on the GET stream; the id is rewritten both ways. When the
    /// client lacks the capability or cannot be reached, the upstream gets an error at once.
    async fn relay(&self, server: String, id: Box<RawValue>, method: String, params: Option<Box<RawValue>>) {
        let Some(up) = self.running(&server).await else { return };
        let needed = match method.as_str() {
            "sampling/createMessage" => Some("sampling"),
            "elicitation/create" => Some("elicitation"),
            "roots/list" => Some("roots"),
            "ping" => None,
            _ => {
                let err = error_raw(
                    METHOD_NOT_FOUND,
                    &format!(
                        "Method not found: {} (Coffer relays sampling, elicitation, roots and ping)",
                        truncate(&method, 100)
                    ),
                );
                let _ = up.respond(&id, Reply::Error(err)).await;
                return;
            }
        };
        if let Some(cap) = needed
            && !self.client_has(cap)
        {
            let err = error_raw(METHOD_NOT_FOUND, &format!("The client did not declare the {cap} capability"));
            let _ = up.respond(&id, Reply::Error(err)).await;
            return;
        }
        let side = self
            .relay_streams
            .lock()
            .expect("streams")
            .iter()
            .rev()
            .find(|r| r.server == server && !r.side.is_closed())
            .map(|r| r.side.clone());
        if side.is_none() && !self.outbound.has_listener() {
            if method == "ping" {
                let _ = up.respond(&id, Reply::Result(RawValue::from_string("{}".into()).expect("json"))).await;
            } else {
                let err = error_raw(UPSTREAM_UNAVAILABLE, "The client has no open stream to relay this request on");
                let _ = up.respond(&id, Reply::Error(err)).await;
            }
            return;
        }
        let relay_id = format!("\"coffer-relay-{}\"", self.counter.fetch_add(1, Ordering::Relaxed));
        self.relays.lock().expect("relays").insert(relay_id.clone(), Relay { server: server.clone(), upstream_id: id });
        let msg = match &params {
            Some(p) => format!(
                "{{\"jsonrpc\":\"2.0\",\"id\":{relay_id},\"method\":{},\"params\":{}}}",
                serde_json::to_string(&method).expect("json"),
                p.get()
            ),
            None => format!(
                "{{\"jsonrpc\":\"2.0\",\"id\":{relay_id},\"method\":{}}}",
                serde_json::to_string(&method).expect("json")
            ),
        };
        match side {
            Some(tx) if tx.send(msg.clone()).is_ok() => {}
            _ => self.outbound.push(msg),
        }
        // Bound the wait by the call timeout: an unanswered relay gets an error upstream.
        let timeout = self
            .shared
            .snapshot
            .current()
            .servers
            .get(&server)
            .map(|s| s.timeout_ms)
            .filter(|t| *t > 0)
            .map(Duration::from_millis)
            .unwrap_or_else(|| self.shared.call_timeout());
        let relays = self.relays.clone();
        let closed = self.closed.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep(timeout) => {}
                _ = closed.cancelled() => {}
            }
            let expired = relays.lock().expect("relays").remove(&relay_id);
            if let Some(r) = expired {
                let err = error_raw(
                    UPSTREAM_TIMEOUT,
                    &format!("The client did not answer {method} within {} ms", timeout.as_millis()),
                );
                let _ = up.respond(&r.upstream_id, Reply::Error(err)).await;
            }
        });
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

impl Answer {
    /// How the invocation log records this answer.
    fn outcome(&self) -> Outcome {
        match self {
            Answer::Result(r) if is_tool_error(r) => Outcome::UpstreamError,
            Answer::Result(_) => Outcome::Ok,
            Answer::UpstreamError(e) if is_cancellation(e) => Outcome::Cancelled,
            Answer::UpstreamError(_) => Outcome::UpstreamError,
            Answer::Error(e) => e.outcome(),
            Answer::Cancelled => Outcome::Cancelled,
        }
    }
}

/// Whether an upstream error is the "request cancelled" error (-32800, as LSP and MCP SDKs use
/// it; also what the gateway answers a request its client cancelled).
fn is_cancellation(error: &RawValue) -> bool {
    error.get().contains("-32800")
        && serde_json::from_str::<Value>(error.get())
            .is_ok_and(|v| v.get("code").and_then(Value::as_i64) == Some(-32800))
}

/// Whether a tool result reports a tool-level error (`isError: true`); cheap on the common path.
fn is_tool_error(result: &RawValue) -> bool {
    let t = result.get();
    t.contains("\"isError\"")
        && serde_json::from_str::<Value>(t).is_ok_and(|v| v.get("isError").and_then(Value::as_bool) == Some(true))
}

fn truncate(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

/// Top-level params fields with raw values, borrowed from the params text (so everything but
/// the field we rewrite stays verbatim, and nothing is copied per call). A repeated key: the
/// last one counts. `None` when params is absent or not a JSON object.
fn parse_fields(params: Option<&RawValue>) -> Option<BTreeMap<FieldKey<'_>, &RawValue>> {
    serde_json::from_str(params?.get()).ok()
}

/// The fields again as one JSON object, with `key` set to `value` (keys in sorted order).
fn to_raw(fields: &BTreeMap<FieldKey<'_>, &RawValue>, key: &str, value: &RawValue) -> Box<RawValue> {
    let mut out: BTreeMap<&str, &RawValue> = fields.iter().map(|(k, v)| (&*k.0, *v)).collect();
    out.insert(key, value);
    RawValue::from_string(serde_json::to_string(&out).expect("json")).expect("json")
}

/// An object key as it appears in the params text: borrowed, or unescaped when it has escapes.
#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct FieldKey<'a>(std::borrow::Cow<'a, str>);

impl std::borrow::Borrow<str> for FieldKey<'_> {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl<'de> serde::Deserialize<'de> for FieldKey<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = FieldKey<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object key")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(FieldKey(std::borrow::Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(FieldKey(std::borrow::Cow::Owned(v.to_owned())))
            }
        }
        d.deserialize_str(Visit)
    }
}

fn raw_string(s: &str) -> Box<RawValue> {
    RawValue::from_string(serde_json::to_string(s).expect("json")).expect("json")
}

fn error_raw(code: i64, message: &str) -> Box<RawValue> {
    RawValue::from_string(json!({"code": code, "message": message}).to_string()).expect("json")
}

/// Handles what upstreams send on their own: list changes invalidate the cache and are
/// forwarded once; log messages are forwarded with the server named in `logger`; resource
/// updates get their URI exposed; requests are relayed to the client; progress is deliberately
/// not forwarded.
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
            UpstreamEvent::Notification { server, method, params } => match method.as_str() {
                "notifications/tools/list_changed"
                | "notifications/prompts/list_changed"
                | "notifications/resources/list_changed" => {
                    s.invalidate(Some(&server));
                    s.notify_client(&method, None);
                }
                "notifications/message" => {
                    let mut p: Value =
                        params.and_then(|p| serde_json::from_str(p.get()).ok()).unwrap_or_else(|| json!({}));
                    if p.is_object() {
                        p["logger"] = Value::String(server);
                    }
                    s.notify_client(&method, Some(p));
                }
                "notifications/resources/updated" => {
                    let mut p: Value =
                        params.and_then(|p| serde_json::from_str(p.get()).ok()).unwrap_or_else(|| json!({}));
                    if let Some(u) = p.get("uri").and_then(Value::as_str) {
                        p["uri"] = Value::String(expose_uri(&server, u));
                    }
                    s.notify_client(&method, Some(p));
                }
                _ => {}
            },
            UpstreamEvent::Request { server, id, method, params } => {
                // Relays wait on the client; never block the loop on them.
                let s2 = s.clone();
                tokio::spawn(async move { s2.relay(server, id, method, params).await });
            }
            UpstreamEvent::Closed { server } => {
                tracing::info!(server = %server, session = %s.id, "Upstream connection closed.");
                s.invalidate(Some(&server));
            }
        }
    }
}

/// Tells the client about policy and registry changes (`notifications/*/list_changed`) and
/// stops upstreams whose server was removed.
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
            // Only removed servers: a disabled server's upstream stays up (calls already running
            // finish; new ones are refused by policy) and is reaped with the session.
            let names: Vec<String> = slots.keys().filter(|n| !snap.servers.contains_key(*n)).cloned().collect();
            names.into_iter().filter_map(|n| slots.remove(&n)).collect()
        };
        for slot in gone {
            if let SlotState::Ready { upstream, .. } = std::mem::replace(&mut *slot.state.lock().await, SlotState::Idle)
            {
                upstream.shutdown(Duration::from_secs(2)).await;
            }
        }
        s.notify_client("notifications/tools/list_changed", None);
        s.notify_client("notifications/prompts/list_changed", None);
        s.notify_client("notifications/resources/list_changed", None);
    }
}
