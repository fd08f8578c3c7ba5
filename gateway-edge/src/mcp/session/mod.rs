//! `Session`: one downstream MCP session (one `Mcp-Session-Id`, or one `/mcp` stream). It
//! composes the steps of the request path, each its own piece with its own state:
//!
//! - [`Pool`] (`pool.rs`): its own upstream children, started lazily, restarted on change;
//! - [`Catalog`] (`catalog.rs`): lists fanned out and cached 60 s, exposed names and the
//!   reverse map;
//! - [`crate::mcp::policy`]: an exposed name resolved to `(server, original)` and admitted from the
//!   snapshot, before any upstream contact;
//! - routing (`route.rs`): the request forwarded with a fresh upstream id, answered verbatim;
//! - [`Relays`] (`relay.rs`): upstream→client requests and the client's cancellations;
//! - [`Outbound`] (`outbound.rs`): what the session sends on its GET stream;
//! - [`Flow`] (`flow.rs`): list changes coalesced, log messages filtered and rate-limited;
//! - [`Progress`] (`progress.rs`): progress tokens of calls in flight, routed back to their
//!   caller.
//!
//! Every queue between an upstream and the client is bounded: the upstreams' events
//! ([`EVENT_QUEUE`], list changes and ends kept aside when full), the streams' [`Lane`]s, the
//! GET stream's broadcast and replay buffer ([`Outbound`]).
//!
//! The session itself keeps only its lifecycle: identity, idle time, the end of the session,
//! and the tasks that follow its upstreams' events and policy changes.
pub mod mrtr;
pub mod outbound;
pub mod pool;
pub mod progress;
pub mod relay;
mod route;
mod upstream_input;
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use coffer_proto::store::McpServer;
use futures_util::future::BoxFuture;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

pub use crate::mcp::answer::{Answer, RpcError};
use crate::mcp::catalog::{Background, Catalog};
pub use crate::mcp::catalog::{LIST_TTL, ListKind, Listed, URI_PREFIX, expose_uri, split_uri};
use crate::mcp::client::ClientIdentity;
pub use crate::mcp::flow::{Flow, LANE_MESSAGES, Lane};
use crate::mcp::invocations::MCP_ACTOR;
use crate::mcp::jsonrpc::{self, METHOD_NOT_FOUND};
use crate::mcp::policy::{self, truncate};
use crate::mcp::profile::View;
pub use crate::mcp::session::outbound::{Outbound, OutboundEvent};
use crate::mcp::session::pool::Pool;
use crate::mcp::session::progress::Progress;
use crate::mcp::session::relay::Relays;
use crate::mcp::upstream::{EVENT_QUEUE, EventQueue, UpstreamError, UpstreamEvent};
use crate::mcp::{Shared, builtin};

/// What the transport knows about the request being handled.
#[derive(Default, Clone)]
pub struct RequestCtx {
    /// The downstream request id as raw JSON text (for `notifications/cancelled`).
    pub id: Option<String>,
    /// The originating POST's response stream (or the `/mcp` stream), for relaying upstream
    /// requests on it (a modern call's: where [`crate::mcp::session::mrtr`] collects them).
    pub side: Option<Lane>,
    /// Where the request's `notifications/progress` go (the caller's own stream); `None`: the
    /// caller cannot take notifications, and its progress is dropped.
    pub progress: Option<Lane>,
}

impl RequestCtx {
    /// A legacy client's request `id` (raw JSON) on a stream that takes both its relayed
    /// requests and its progress: the POST's SSE answer, or the `/mcp` stream.
    pub fn on(id: &str, lane: Lane) -> Self {
        Self { id: Some(id.to_owned()), side: Some(lane.clone()), progress: Some(lane) }
    }
}

/// One downstream session.
pub struct Session {
    pub id: String,
    pub protocol_version: String,
    /// Who acts through this session, as its invocation records name it: [`MCP_ACTOR`] for an
    /// MCP client (borrowed, so recording it costs a call nothing), the caller's actor for a
    /// broker session ([`crate::mcp::broker`]).
    pub actor: Cow<'static, str>,
    /// The downstream client's `clientInfo` name and version (empty when it gave none).
    pub client: Arc<ClientIdentity>,
    /// The conversation whose agent turn opened this session (`X-Coffer-Conversation` from a
    /// managed agent's shim, believed from the agent token only: [`Session::attribute`]); its
    /// invocations name it. Unset for every other client.
    pub conversation: std::sync::OnceLock<Arc<str>>,
    /// The profile this session uses (issue 36 §1), fixed for its life
    /// ([`Session::select_profile`]); unset: `default`.
    pub profile: std::sync::OnceLock<Arc<str>>,
    /// Whether lists and calls go through the profile's view ([`crate::mcp::profile`]): an MCP
    /// client's session; an in-house caller's (the broker: REST, agents' direct calls) sees
    /// the vault as it is.
    pub(super) profiled: bool,
    /// The profile's view of the last snapshot it was computed for.
    view: Mutex<Option<(Arc<crate::snapshot::Snapshot>, Arc<View>)>>,
    /// The parameters the last tools list hid, by original exposed name.
    hidden: Mutex<HashMap<String, Vec<String>>>,
    pub(super) shared: Arc<Shared>,
    pub(super) pool: Pool,
    pub(super) catalog: Catalog,
    pub(super) relays: Relays,
    /// Calls of a modern client waiting for its input ([`crate::mcp::session::mrtr`]).
    pub(super) parked: crate::mcp::session::mrtr::Parked,
    /// What reaches the client of what upstreams send on their own (coalescing, log level
    /// and rate, drop counters).
    pub(super) flow: Arc<Flow>,
    /// Progress tokens of the calls in flight.
    pub(super) progress: Progress,
    /// Whether the client speaks a modern (handshake-less) revision ([`crate::mcp::downstream::era`]).
    pub modern: bool,
    last_activity: Mutex<Instant>,
    pub outbound: Outbound,
    pub closed: CancellationToken,
}

impl Session {
    /// Creates a session for a client that sent `initialize` with `params` and negotiated
    /// `protocol_version`; starts its event, background and policy-watch tasks (which end with
    /// it).
    pub fn new(id: String, protocol_version: String, params: &Value, shared: Arc<Shared>) -> Arc<Self> {
        Self::open(id, protocol_version, params, shared, Cow::Borrowed(MCP_ACTOR), false)
    }

    /// [`Session::new`] for an in-house caller (the tool broker: agents, channels, REST) whose
    /// invocations are recorded as `actor`'s. It gets no `list_changed`, so its lists wait for
    /// servers nobody has listed yet up to the full list deadline.
    pub fn with_actor(
        id: String,
        protocol_version: String,
        params: &Value,
        shared: Arc<Shared>,
        actor: Cow<'static, str>,
    ) -> Arc<Self> {
        Self::open(id, protocol_version, params, shared, actor, true)
    }

    /// The constructor behind [`Session::new`] and [`Session::with_actor`]; `patient`: lists wait
    /// for unknown servers up to the full list deadline instead of the first-list deadline.
    fn open(
        id: String,
        protocol_version: String,
        params: &Value,
        shared: Arc<Shared>,
        actor: Cow<'static, str>,
        patient: bool,
    ) -> Arc<Self> {
        // Upstreams see Coffer's own, always valid `clientInfo`, never the client's verbatim
        // (which may be missing or malformed: see `client.rs`).
        let client = Arc::new(ClientIdentity::of(params.get("clientInfo")));
        let init_params = json!({
            "protocolVersion": protocol_version,
            "capabilities": params.get("capabilities").cloned().unwrap_or_else(|| json!({})),
            "clientInfo": client.upstream_info(),
        });
        let profile = crate::mcp::gateway_catalog::Profile::of(&init_params);
        let (events_tx, events_rx) = crate::mcp::upstream::events(EVENT_QUEUE);
        // Unbounded by type, bounded by use: the catalog sends one `Refetch` per server a list
        // waits for, `Started` once per upstream start, and upstream list changes reach it only
        // through `Flow::relist` (one re-list in flight per server and kind).
        let (background_tx, background_rx) = mpsc::unbounded_channel();
        let closed = CancellationToken::new();
        let s = Arc::new(Self {
            pool: Pool::new(shared.clone(), &id, init_params, events_tx, closed.clone(), background_tx.clone()),
            catalog: Catalog::new(shared.clone(), &id, profile, background_tx, patient),
            relays: Relays::default(),
            parked: crate::mcp::session::mrtr::Parked::default(),
            flow: Arc::default(),
            progress: Progress::default(),
            modern: crate::mcp::downstream::era::is_modern(&protocol_version),
            id,
            protocol_version,
            actor,
            client,
            conversation: std::sync::OnceLock::new(),
            profile: std::sync::OnceLock::new(),
            profiled: !patient,
            view: Mutex::default(),
            hidden: Mutex::default(),
            shared,
            last_activity: Mutex::new(Instant::now()),
            outbound: Outbound::default(),
            closed,
        });
        tokio::spawn(event_loop(Arc::downgrade(&s), events_rx, s.closed.clone()));
        tokio::spawn(background(Arc::downgrade(&s), background_rx, s.closed.clone()));
        tokio::spawn(policy_watch(Arc::downgrade(&s), s.closed.clone()));
        tokio::spawn(list_changes(Arc::downgrade(&s), s.flow.clone(), s.closed.clone()));
        s
    }

    /// Names the conversation this session serves (the first call wins; later ones are ignored).
    pub fn attribute(&self, conversation: Option<&Arc<str>>) {
        if let Some(c) = conversation {
            let _ = self.conversation.set(c.clone());
        }
    }

    /// Sets the profile this session uses (the first call wins; later ones are ignored): one
    /// [`crate::mcp::profile::choose`] accepted when the session started.
    pub fn select_profile(&self, profile: Arc<str>) {
        let _ = self.profile.set(profile);
    }

    /// The name of this session's profile (`default` when none was selected).
    pub fn profile_name(&self) -> Arc<str> {
        self.profile.get().cloned().unwrap_or_else(|| Arc::from(coffer_api::profiles::DEFAULT_PROFILE))
    }

    /// The session's profile over the current snapshot (recomputed when the snapshot changes).
    pub fn view(&self) -> Arc<View> {
        let snap = self.shared.snapshot.current();
        let mut cached = self.view.lock().expect("view");
        if let Some((s, v)) = &*cached
            && Arc::ptr_eq(s, &snap)
        {
            return v.clone();
        }
        let v = Arc::new(View::of(&snap, &self.profile_name(), self.shared.max_name_len()));
        *cached = Some((snap, v.clone()));
        v
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
        let (logs, notifications) = (self.flow.logs_dropped.total(), self.flow.notifications_dropped.total());
        if logs + notifications > 0 {
            tracing::info!(session = %self.id, logs_dropped = logs, notifications_dropped = notifications, "Session ended; upstream messages it held back.");
        }
        self.pool.close().await;
    }

    /// Names of upstreams running in this session.
    pub fn running_upstreams(&self) -> Vec<String> {
        self.pool.running_servers()
    }

    /// The `initialize` result of `server`'s running upstream in this session, if any.
    pub async fn upstream_init(&self, server: &str) -> Option<Value> {
        self.pool.running(server).await.map(|u| u.init_result.clone())
    }

    /// One server's live list of `kind` (for `/v1/mcp/servers/{name}/capabilities`), from the
    /// session's cache when fresh.
    ///
    /// # Errors
    /// When the upstream cannot be started or fails the list.
    pub async fn fetch_server(&self, server: &McpServer, kind: ListKind) -> Result<Arc<Vec<Value>>, UpstreamError> {
        self.catalog.fetch(&self.pool, server, kind).await
    }

    /// Drops the cached lists of `server` (all kinds), or of every server, here and in the
    /// gateway catalog (they may have changed: the upstream said so, or the user refreshed).
    pub fn invalidate(&self, server: Option<&str>) {
        self.catalog.invalidate(server);
        self.shared.lists.invalidate(server);
    }

    /// Fans `kind` out to every enabled upstream in parallel and returns the enabled items with
    /// exposed names, as `(item, server, original)` (see [`Session::list_all`]).
    pub async fn list(&self, kind: ListKind) -> Vec<(Value, String, String)> {
        self.list_all(kind).await.into_iter().filter(|l| l.enabled).map(|l| (l.item, l.server, l.original)).collect()
    }

    /// Every item of `kind` with exposed names and its policy flag ([`Catalog::list_all`]), as
    /// the session's profile shows them (unselected items left out, tool overrides applied).
    pub async fn list_all(&self, kind: ListKind) -> Vec<Listed> {
        let items = self.catalog.list_all(&self.pool, kind).await;
        if !self.profiled {
            return items;
        }
        let (items, hidden) = self.view().shape(kind, items);
        if kind == ListKind::Tools {
            *self.hidden.lock().expect("hidden") = hidden;
        }
        items
    }

    /// What `tools/list` answers: the enabled tools the profile selects, as it shows them.
    /// (The one place a tool mode changes what is listed.)
    pub async fn listed_tools(&self) -> Vec<Value> {
        self.list(ListKind::Tools).await.into_iter().map(|(t, _, _)| t).collect()
    }

    /// Resolves an exposed tool or prompt name to `(server, original)` and checks policy
    /// ([`policy::resolve`]).
    ///
    /// # Errors
    /// -32602 for an unknown name or server; -32000 `TOOL_DISABLED`; -32001 when the name's
    /// server had to be listed to learn it and could not be.
    pub async fn resolve(&self, kind: ListKind, exposed: &str) -> Result<(String, String), RpcError> {
        self.resolve_named(kind, exposed).await.map(|(server, original, _)| (server, original))
    }

    /// [`Session::resolve`] through the session's profile: a renamed tool's name stands for
    /// the tool, and what the profile does not select is refused with a disabled capability's
    /// code (`TOOL_DISABLED`), naming the profile (`data.reason = "not_in_profile"`).
    /// Returns `(server, original, exposed name before any override)`.
    ///
    /// # Errors
    /// As [`Session::resolve`].
    pub async fn resolve_named(&self, kind: ListKind, exposed: &str) -> Result<(String, String, String), RpcError> {
        let snap = self.shared.snapshot.current();
        if !self.profiled {
            let (server, original) = policy::resolve(&snap, &self.catalog, &self.pool, kind, exposed).await?;
            return Ok((server, original, exposed.to_owned()));
        }
        // A profile removed after the session started selects nothing: say so, instead of
        // refusing each name as if it alone were disabled.
        if self.view().removed() {
            let profile = self.profile_name();
            return Err(crate::mcp::answer::RpcError::new(
                jsonrpc::TOOL_DISABLED,
                format!(
                    "Profile {profile} was removed after this session started: nothing is available through it. \
                     Reconnect with another profile (coffer profile list shows them)."
                ),
            )
            .with_data(json!({"profile": &*profile, "reason": "profile_removed"})));
        }
        // Nothing of the view is held across the await: a call's future stays small.
        let name = if kind == ListKind::Tools {
            let holder = self.catalog.lookup(kind, exposed).map(|(server, _)| server);
            self.view().inbound(exposed, holder.as_deref()).to_owned()
        } else {
            exposed.to_owned()
        };
        let (server, original) = policy::resolve(&snap, &self.catalog, &self.pool, kind, &name).await?;
        if !self.view().selects(kind, &server, &name) {
            // Refused with TOOL_DISABLED's code, as a disabled capability, but naming the
            // profile: the tool is fine, this connection's profile leaves it out.
            let profile = self.profile_name();
            let noun = policy::Noun::of(kind);
            return Err(crate::mcp::answer::RpcError::new(
                jsonrpc::TOOL_DISABLED,
                format!(
                    "{} {exposed} is not in profile {profile} (coffer profile show {profile} lists what it selects)",
                    noun.title()
                ),
            )
            .with_data(json!({
                "code": "TOOL_DISABLED", "server": server, "tool": exposed, "kind": noun.as_str(),
                "scope": "profile", "profile": &*profile, "reason": "not_in_profile"
            })));
        }
        Ok((server, original, name))
    }

    /// The parameters the profile hides of tool `exposed` (original exposed name): as the last
    /// list hid them (a required parameter is never hidden); a tool this session has not listed
    /// yet is listed first (the catalog's lists answer at once), so a call in a session that
    /// never listed is judged like one that did; only a tool that cannot be listed falls back to
    /// the profile's names.
    pub(super) async fn hidden_params(&self, exposed: &str) -> Vec<String> {
        if !self.profiled {
            return Vec::new();
        }
        let listed = || self.hidden.lock().expect("hidden").get(exposed).cloned();
        if let Some(h) = listed() {
            return h;
        }
        if self.view().hide_params(exposed).is_empty() {
            return Vec::new();
        }
        self.list_all(ListKind::Tools).await;
        listed().unwrap_or_else(|| self.view().hide_params(exposed).to_vec())
    }

    /// Routes `tools/call` or `prompts/get`: resolve, check policy, forward with the original
    /// name, return the upstream's answer verbatim; records the invocation.
    pub async fn route_call(self: &Arc<Self>, kind: ListKind, params: Option<&RawValue>) -> Answer {
        self.route_call_ctx(kind, params, &RequestCtx::default()).await
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
            let items: Vec<Value> = if kind == ListKind::Tools {
                self.listed_tools().await
            } else {
                self.list(kind).await.into_iter().map(|(t, _, _)| t).collect()
            };
            let mut body = serde_json::Map::new();
            body.insert(kind.key().to_owned(), Value::Array(items));
            Answer::ok(Value::Object(body))
        };
        match method {
            "ping" => Answer::ok(json!({})),
            // `tools/call` is the hot path; the other methods' futures are boxed so that every
            // call's task does not carry (and move) the largest of them.
            "tools/call" => self.route_call_ctx(ListKind::Tools, params, ctx).await,
            // Issue 36 §2: a lazy profile lists the meta tools ([`builtin::meta::listing`]).
            "tools/list" => {
                Box::pin(async {
                    let tools = self.list(ListKind::Tools).await;
                    let snap = self.shared.snapshot.current();
                    let name = self.profile.get().map_or(coffer_api::profiles::DEFAULT_PROFILE, |p| &**p);
                    let profile = self.profiled.then(|| snap.profiles.get(name)).flatten();
                    Answer::ok(json!({"tools": builtin::meta::listing(&snap, profile, tools)}))
                })
                .await
            }
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
                self.relays.cancel(&self.pool, &self.id, params).await;
            }
            "notifications/initialized" => {}
            "notifications/roots/list_changed" => {
                for n in self.pool.servers() {
                    if let Some(up) = self.pool.running(&n).await {
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
        self.relays.answer(&self.pool, &self.id, id, result, error).await;
    }

    /// Sends a notification to the client on its GET stream. A `notifications/*/list_changed`
    /// without params is coalesced ([`Flow::list_changed`]): the client hears of each kind at
    /// most once per [`crate::mcp::flow::LIST_CHANGED_GAP`], and of the last change always.
    pub fn notify_client(&self, method: &str, params: Option<Value>) {
        if params.is_none() && self.flow.list_changed(method) {
            return;
        }
        let msg = match params {
            Some(p) => json!({"jsonrpc": "2.0", "method": method, "params": p}),
            None => json!({"jsonrpc": "2.0", "method": method}),
        };
        self.outbound.push(msg.to_string());
    }

    /// How long a request from the client to `server`'s upstream may take: the server's own
    /// timeout, else the default call timeout.
    fn call_timeout(&self, server: &str) -> Duration {
        self.shared
            .snapshot
            .current()
            .servers
            .get(server)
            .map(|s| s.timeout_ms)
            .filter(|t| *t > 0)
            .map(Duration::from_millis)
            .unwrap_or_else(|| self.shared.call_timeout())
    }
}

/// What a built-in tool sees of the session that calls it.
impl builtin::Caller for Session {
    fn session_id(&self) -> &str {
        &self.id
    }

    fn list_tools(&self) -> BoxFuture<'_, Vec<(Value, String, String)>> {
        Box::pin(self.list(ListKind::Tools))
    }

    fn list_all_tools(&self) -> BoxFuture<'_, Vec<(Value, String, String, bool)>> {
        Box::pin(async move {
            self.list_all(ListKind::Tools)
                .await
                .into_iter()
                .map(|l| (l.item, l.server, l.original, l.enabled))
                .collect()
        })
    }

    fn client_name(&self) -> &str {
        &self.client.name
    }

    fn actor(&self) -> &str {
        &self.actor
    }

    fn call_tool<'a>(&'a self, name: &'a str, arguments: Option<&'a str>) -> BoxFuture<'a, Answer> {
        Box::pin(async move {
            let params = builtin::meta::call_params(name, arguments);
            self.route_call_ctx(ListKind::Tools, Some(&params), &RequestCtx::default()).await
        })
    }
}

/// Handles what upstreams send on their own: a list change makes the session list that kind
/// again from its upstream (at most one re-list in flight per server and kind, [`relist`]) and
/// the client hears of it when the list differs; log messages are forwarded at the client's
/// level and rate ([`Flow::admit_log`]) with the server named in `logger`; resource updates
/// get their URI exposed; progress goes to the call that asked for it ([`Progress::deliver`]);
/// requests are relayed to the client.
async fn event_loop(session: std::sync::Weak<Session>, mut rx: EventQueue, closed: CancellationToken) {
    loop {
        let ev = tokio::select! {
            _ = closed.cancelled() => return,
            ev = rx.recv() => match ev { Some(e) => e, None => return },
        };
        let Some(s) = session.upgrade() else { return };
        match ev {
            UpstreamEvent::Notification { server, method, params } => match method.as_str() {
                "notifications/tools/list_changed" => relist(&s, server, &[ListKind::Tools]),
                "notifications/prompts/list_changed" => relist(&s, server, &[ListKind::Prompts]),
                "notifications/resources/list_changed" => {
                    relist(&s, server, &[ListKind::Resources, ListKind::ResourceTemplates])
                }
                "notifications/progress" if !s.progress.deliver(&server, params.as_deref()) => {
                    s.flow.notifications_dropped.add(1);
                }
                "notifications/message" => {
                    let Some(mut p) = params.and_then(|p| serde_json::from_str::<Value>(p.get()).ok()) else {
                        continue;
                    };
                    if !s.flow.admit_log(&server, p.get("level").and_then(Value::as_str)) {
                        continue;
                    }
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
                tokio::spawn(async move {
                    let timeout = s2.call_timeout(&server);
                    s2.relays.relay(&s2.pool, &s2.outbound, &s2.closed, timeout, server, id, method, params).await;
                });
            }
            UpstreamEvent::Closed { server } => {
                tracing::info!(server = %server, session = %s.id, "Upstream connection closed.");
                // Only this session's copy: a restart lists again, what others know stands.
                s.catalog.invalidate(Some(&server));
            }
        }
    }
}

/// `server`'s upstream said its lists of `kinds` changed: each is listed afresh from it in the
/// background (into the session's and the gateway catalog, [`Catalog::fetch`]), one re-list
/// per server and kind at a time, again at most every [`crate::mcp::flow::RELIST_GAP`] while changes
/// keep coming. The client is told (coalesced) when a list differs from the one before; the
/// first re-list of a kind in this session, with nothing to compare, always tells it.
fn relist(s: &Arc<Session>, server: String, kinds: &[ListKind]) {
    for &kind in kinds {
        if !s.flow.relist(&server, kind) {
            continue;
        }
        let (weak, server) = (Arc::downgrade(s), server.clone());
        tokio::spawn(async move {
            let mut before: Option<Arc<Vec<Value>>> = None;
            let mut first = true;
            loop {
                let Some(s) = weak.upgrade() else { return };
                let started = Instant::now();
                let snapshot = s.shared.snapshot.current();
                // A server removed, or whose upstream is gone, is listed when it starts again:
                // nothing stays in flight for it.
                let spec = snapshot.servers.get(&server).cloned();
                let Some(spec) = spec
                    .filter(|spec| !s.closed.is_cancelled() && s.pool.is_running(&server, snapshot.generation(spec)))
                else {
                    while s.flow.relisted(&server, kind) {}
                    return;
                };
                s.invalidate(Some(&server));
                if let Some(items) = s.refetch(&spec, kind).await {
                    if first || before.as_ref() != Some(&items) {
                        s.notify_client(kind.list_changed(), None);
                    }
                    before = Some(items);
                    first = false;
                }
                if !s.flow.relisted(&server, kind) {
                    return;
                }
                drop(s);
                tokio::time::sleep_until((started + crate::mcp::flow::RELIST_GAP).into()).await;
            }
        });
    }
}

/// Sends the coalesced `notifications/*/list_changed` ([`Flow::next_list_changes`]) to the
/// client, one batch per [`crate::mcp::flow::LIST_CHANGED_GAP`] at most, until the session ends.
async fn list_changes(session: std::sync::Weak<Session>, flow: Arc<Flow>, closed: CancellationToken) {
    loop {
        let methods = tokio::select! {
            _ = closed.cancelled() => return,
            m = flow.next_list_changes() => m,
        };
        let Some(s) = session.upgrade() else { return };
        for method in methods {
            s.outbound.push(format!("{{\"jsonrpc\":\"2.0\",\"method\":\"{method}\"}}"));
        }
        drop(s);
        tokio::select! {
            _ = closed.cancelled() => return,
            () = tokio::time::sleep(crate::mcp::flow::LIST_CHANGED_GAP) => {}
        }
    }
}

/// Runs what the session's catalog and pool hand over ([`Background`]): fresh lists from the
/// session's own upstreams, each in its own task bounded by the list deadline (it fills both
/// catalogs; a difference reaches the client through [`policy_watch`]).
async fn background(
    session: std::sync::Weak<Session>,
    mut rx: mpsc::UnboundedReceiver<Background>,
    closed: CancellationToken,
) {
    loop {
        let work = tokio::select! {
            _ = closed.cancelled() => return,
            w = rx.recv() => match w { Some(w) => w, None => return },
        };
        let Some(s) = session.upgrade() else { return };
        let (server, kinds) = match work {
            Background::Refetch { server, kind } => (server, vec![kind]),
            Background::Started { server } => {
                let kinds = s.catalog.not_own(&server);
                (server, kinds)
            }
        };
        let Some(spec) = s.shared.snapshot.current().servers.get(&server).cloned() else { continue };
        for kind in kinds {
            let s = s.clone();
            let spec = spec.clone();
            tokio::spawn(async move {
                s.refetch(&spec, kind).await;
            });
        }
    }
}

impl Session {
    /// Lists `kind` of `spec` afresh from the session's own upstream, bounded by the list
    /// deadline ([`Catalog::fetch`]: it fills both catalogs; a difference reaches the client
    /// through [`policy_watch`]). The list, or `None` when it failed or took too long (then
    /// recorded as the server's failure).
    async fn refetch(&self, spec: &McpServer, kind: ListKind) -> Option<Arc<Vec<Value>>> {
        let deadline = self.shared.list_timeout();
        match tokio::time::timeout(deadline, self.catalog.fetch(&self.pool, spec, kind)).await {
            Ok(r) => r.ok(),
            Err(_) => {
                let msg = format!("{} took longer than {} ms", kind.method(), deadline.as_millis());
                let generation = self.shared.snapshot.current().generation(spec);
                self.shared.health.failed(&spec.name, &msg);
                self.shared.lists.failed(&spec.name, generation, &msg);
                None
            }
        }
    }
}

/// Tells the client about policy and registry changes (`notifications/*/list_changed`) and
/// stops upstreams whose server was removed; tells it too when the gateway catalog learns a
/// list that differs from what the session's last list showed (a server listed late, or
/// listed afresh).
async fn policy_watch(session: std::sync::Weak<Session>, closed: CancellationToken) {
    let (mut rx, mut lists) = match session.upgrade() {
        Some(s) => (s.shared.snapshot.subscribe(), s.shared.lists.subscribe()),
        None => return,
    };
    rx.mark_unchanged();
    loop {
        tokio::select! {
            _ = closed.cancelled() => return,
            r = rx.changed() => if r.is_err() { return },
            l = lists.recv() => {
                let Some(s) = session.upgrade() else { return };
                match l {
                    Ok((server, kind)) => {
                        if s.catalog.outdated(&server, kind) {
                            s.notify_client(kind.list_changed(), None);
                        }
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        for kind in [ListKind::Tools, ListKind::Prompts, ListKind::Resources] {
                            s.notify_client(kind.list_changed(), None);
                        }
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                }
                continue;
            }
        }
        let Some(s) = session.upgrade() else { return };
        let snap = rx.borrow_and_update().clone();
        s.pool.stop_removed(&snap).await;
        s.notify_client("notifications/tools/list_changed", None);
        s.notify_client("notifications/prompts/list_changed", None);
        s.notify_client("notifications/resources/list_changed", None);
    }
}
