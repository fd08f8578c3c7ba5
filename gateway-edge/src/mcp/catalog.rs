//! A session's capability catalog: each upstream's lists (all pages, cached 60 s per session
//! per upstream, one fetch at a time per list), the merged fan-out under exposed names
//! (`<server>__<name>` through [`naming`], `coffer://<server>/<uri>` for resources), and the
//! reverse maps from exposed names, and from resource URIs seen in tool results, back to their
//! upstream.
//!
//! A list is answered from what is known at once — the session's own fresh lists, else the
//! gateway-wide [`crate::mcp::gateway_catalog`] — and waits (at most the first-list deadline) only
//! for servers nobody has listed yet, which the gateway catalog starts in the background; it
//! never starts the session's own upstreams, which start on the first call routed to them. What
//! each list showed per server is remembered, so that a fresher list that differs reaches the
//! client as `notifications/*/list_changed`.
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use coffer_proto::store::McpServer;
use coffer_types::BUILTIN_SERVER;
use serde_json::value::RawValue;
use serde_json::{Value, json};

use crate::mcp::Shared;
use crate::mcp::answer::RpcError;
use crate::mcp::gateway_catalog::{self, Known, Profile};
use crate::mcp::jsonrpc::{INVALID_PARAMS, METHOD_NOT_FOUND, UPSTREAM_UNAVAILABLE};
use crate::mcp::naming::{self, NameMap};
use crate::mcp::session::pool::Pool;
use crate::mcp::upstream::{Reply, UpstreamError};
use crate::snapshot::{Generation, Kind};

/// How long a capability list stays cached per session per upstream.
pub const LIST_TTL: Duration = Duration::from_secs(60);
/// Most pages followed when an upstream paginates a list.
const MAX_PAGES: usize = 100;
/// Most resource URIs remembered from tool results per session.
const MAX_TOOL_URIS: usize = 10_000;

/// A list method that fans out to every upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ListKind {
    Tools,
    Prompts,
    Resources,
    ResourceTemplates,
}

impl ListKind {
    /// Every list kind.
    pub const ALL: [ListKind; 4] =
        [ListKind::Tools, ListKind::Prompts, ListKind::Resources, ListKind::ResourceTemplates];

    /// The notification that tells a client this kind of list changed.
    pub fn list_changed(self) -> &'static str {
        match self {
            ListKind::Tools => "notifications/tools/list_changed",
            ListKind::Prompts => "notifications/prompts/list_changed",
            ListKind::Resources | ListKind::ResourceTemplates => "notifications/resources/list_changed",
        }
    }

    /// The MCP list method, e.g. `tools/list`.
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
    /// The preference kind that governs the items.
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

/// A capability list of one upstream: (server name, kind).
type ListKey = (String, ListKind);

struct Cached {
    at: Instant,
    items: Arc<Vec<Value>>,
}

/// What the session's last list of a kind showed of one server.
struct Shown {
    /// The items, or `None` when the server was left out (not listed in time, or failing).
    items: Option<Arc<Vec<Value>>>,
    /// From the session's own upstream (not from the gateway catalog).
    own: bool,
}

/// Work a session's catalog hands to the session's background task (it needs the session).
#[derive(Debug)]
pub enum Background {
    /// List `kind` of `server` afresh from the session's own upstream (into both catalogs).
    Refetch { server: String, kind: ListKind },
    /// The session's upstream of `server` has started: list afresh what the client was shown
    /// of it from the gateway catalog, or not shown at all.
    Started { server: String },
}

/// A server's part of a list: its items and whether they came from the session's own upstream.
type Got = Option<(Arc<Vec<Value>>, bool)>;

/// How one server takes part in one list.
enum Part {
    Have {
        items: Arc<Vec<Value>>,
        own: bool,
    },
    /// Not ready; wait for it (until the deadline), else show `fallback`.
    Wait {
        fallback: Option<Arc<Vec<Value>>>,
    },
    /// Left out without waiting (a remembered failure), or `fallback`.
    Skip {
        fallback: Option<Arc<Vec<Value>>>,
    },
}

/// One session's lists and names. Upstreams are reached through the session's [`Pool`],
/// passed to each call that may need one.
pub struct Catalog {
    shared: Arc<Shared>,
    session_id: String,
    cache: Mutex<HashMap<ListKey, Cached>>,
    /// One gate per list being fetched, and the last failed fetch of each (see `fetch`).
    fetching: Mutex<HashMap<ListKey, Arc<tokio::sync::Mutex<()>>>>,
    fetch_failed: Mutex<HashMap<ListKey, (Instant, UpstreamError)>>,
    /// Exposed tool and prompt names → `(server, original)`.
    names: RwLock<HashMap<ListKind, NameMap>>,
    /// Unprefixed resource URIs that an upstream returned in a tool result this session →
    /// that upstream's server name.
    tool_uris: Mutex<HashMap<String, String>>,
    /// What the last list of each kind showed of each server.
    shown: Mutex<HashMap<ListKey, Shown>>,
    /// The session's background task.
    background: tokio::sync::mpsc::UnboundedSender<Background>,
    /// Lists wait for unknown servers up to the full list deadline, not the first-list one
    /// (REST callers such as `coffer tools list`, which have no `list_changed` to wait for).
    patient: bool,
    /// The client's capabilities, which the gateway catalog's lists are known for.
    profile: Profile,
}

impl Catalog {
    /// An empty catalog for session `session_id` (the id only names it in logs) of a client
    /// whose capabilities are `profile`, which hands work that needs the session to
    /// `background`; `patient`: see [`Catalog::list_all`].
    pub fn new(
        shared: Arc<Shared>,
        session_id: &str,
        profile: Profile,
        background: tokio::sync::mpsc::UnboundedSender<Background>,
        patient: bool,
    ) -> Self {
        Self {
            profile,
            shown: Mutex::default(),
            background,
            patient,
            shared,
            session_id: session_id.to_owned(),
            cache: Mutex::default(),
            fetching: Mutex::default(),
            fetch_failed: Mutex::default(),
            names: RwLock::default(),
            tool_uris: Mutex::default(),
        }
    }

    /// One upstream's full list of `kind` (all pages), from the cache when fresh.
    ///
    /// One fetch per (server, kind) at a time: requests that need the same list meanwhile wait
    /// for it and take its outcome (its list from the cache, or its error), so a burst of
    /// `tools/list` costs the upstream one list, not one per request.
    ///
    /// # Errors
    /// When the upstream cannot be started or fails the list.
    pub async fn fetch(
        &self,
        pool: &Pool,
        server: &McpServer,
        kind: ListKind,
    ) -> Result<Arc<Vec<Value>>, UpstreamError> {
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
        let generation = self.shared.snapshot.current().generation(server);
        let result = self.fetch_now(pool, server, generation, kind).await;
        match &result {
            Ok(items) => {
                self.cache.lock().expect("cache").insert(key, Cached { at: Instant::now(), items: items.clone() });
                self.shared.lists.store(&server.name, generation, &self.profile, kind, items.clone());
            }
            Err(e) => {
                self.fetch_failed.lock().expect("fetching").insert(key, (Instant::now(), e.clone()));
                // A session that ended, or a stop Coffer asked for, says nothing about the server;
                // a failed start is recorded by the pool.
                if !pool.is_closed() && e.is_fault() {
                    tracing::warn!(server = %server.name, session = %self.session_id, error = %e, method = kind.method(), "Upstream could not be listed.");
                    if !matches!(e, UpstreamError::Start { .. }) {
                        self.shared.health.failed(&server.name, &e.to_string());
                    }
                    self.shared.lists.failed(&server.name, generation, &e.to_string());
                }
            }
        }
        result
    }

    fn cached(&self, key: &ListKey) -> Option<Arc<Vec<Value>>> {
        let cache = self.cache.lock().expect("cache");
        cache.get(key).filter(|c| c.at.elapsed() < LIST_TTL).map(|c| c.items.clone())
    }

    /// [`Catalog::fetch`] without cache or sharing, from the upstream of `generation`.
    async fn fetch_now(
        &self,
        pool: &Pool,
        server: &McpServer,
        generation: Generation,
        kind: ListKind,
    ) -> Result<Arc<Vec<Value>>, UpstreamError> {
        let up = pool.upstream(server, generation).await?;
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
        let repeated = naming::drop_repeats(&mut items, kind.ident());
        if !repeated.is_empty() {
            tracing::warn!(server = %server.name, method = kind.method(), names = %repeated.join(", "), "Upstream listed a name more than once; only the first is offered.");
        }
        self.shared.health.listed(&server.name, kind.key(), repeated);
        Ok(Arc::new(items))
    }

    /// Drops the session's cached lists of `server` (all kinds), or of every server (the
    /// gateway catalog's copies are [`crate::mcp::gateway_catalog::GatewayCatalog::invalidate`]d
    /// apart).
    pub fn invalidate(&self, server: Option<&str>) {
        let mut c = self.cache.lock().expect("cache");
        match server {
            Some(s) => c.retain(|(n, _), _| n != s),
            None => c.clear(),
        }
    }

    /// Every enabled server's items of `kind`, plus the built-in tools, merged in server-name
    /// order under exposed names (or `coffer://` URIs); refreshes the reverse map and returns
    /// every item with its policy flag (disabled ones included, flagged).
    ///
    /// Each server's items come from what is known now: the session's own fresh list, else
    /// (when its upstream runs in this session) a fresh list from it, else the gateway catalog.
    /// A server nobody has listed yet is started in the background by the gateway catalog,
    /// and the list waits for it at most `gateway.first_list_timeout_ms` (the full list
    /// deadline when `patient`) before answering without it; one whose last start or list
    /// failed is not waited on during its backoff. What arrives later reaches the client as
    /// `notifications/*/list_changed` ([`Catalog::outdated`]).
    pub async fn list_all(&self, pool: &Pool, kind: ListKind) -> Vec<Listed> {
        let snap = self.shared.snapshot.current();
        let mut servers: Vec<&McpServer> = snap.servers.values().filter(|s| s.enabled).collect();
        servers.sort_by(|a, b| a.name.cmp(&b.name));
        let asked = Instant::now();
        let wait = if self.patient { self.shared.list_timeout() } else { self.shared.first_list_timeout() };
        let until = tokio::time::Instant::now() + wait;
        let mut changes = self.shared.lists.watch();
        let mut kicked: HashSet<&str> = HashSet::new();
        let mut late = false;
        let results: Vec<(String, Got)> = loop {
            changes.borrow_and_update();
            let mut waiting = false;
            let mut results = Vec::with_capacity(servers.len());
            for s in &servers {
                let got = match self.part(pool, s, snap.generation(s), kind, asked, &mut kicked) {
                    Part::Have { items, own } => Some((items, own)),
                    Part::Wait { fallback } => {
                        waiting = true;
                        fallback.map(|f| (f, false))
                    }
                    Part::Skip { fallback } => fallback.map(|f| (f, false)),
                };
                results.push((s.name.clone(), got));
            }
            if !waiting || late {
                break results;
            }
            late = tokio::time::timeout_at(until, changes.changed()).await.is_err();
        };
        {
            let mut shown = self.shown.lock().expect("shown");
            for (server, got) in &results {
                if got.is_none() {
                    tracing::info!(server = %server, session = %self.session_id, method = kind.method(), "Server not listed yet; left out of this list (list_changed follows).");
                }
                let (items, own) = match got {
                    Some((items, own)) => (Some(items.clone()), *own),
                    None => (None, false),
                };
                shown.insert((server.clone(), kind), Shown { items, own });
            }
        }
        let results: Vec<(String, Arc<Vec<Value>>)> =
            results.into_iter().filter_map(|(s, got)| got.map(|(items, _)| (s, items))).collect();

        let mut all: Vec<(String, Value)> = Vec::new();
        if kind == ListKind::Tools {
            all.extend(self.shared.builtins.definitions().into_iter().map(|d| (BUILTIN_SERVER.to_owned(), d)));
        }
        for (server, items) in results {
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

    /// How `server` (at `generation`) takes part in a list of `kind` asked at `asked`; starts
    /// what must be started (once per list: `kicked`).
    fn part<'s>(
        &self,
        pool: &Pool,
        server: &'s McpServer,
        generation: Generation,
        kind: ListKind,
        asked: Instant,
        kicked: &mut HashSet<&'s str>,
    ) -> Part {
        let key = (server.name.clone(), kind);
        if let Some(items) = self.cached(&key) {
            return Part::Have { items, own: true };
        }
        let known = self.shared.lists.lookup(&server.name, generation, &self.profile, kind);
        let fallback = match &known {
            Known::Ready(items) | Known::Shared { items, .. } => Some(items.clone()),
            Known::Pending { stale, .. } | Known::Failed { stale, .. } => stale.clone(),
        };
        if pool.is_running(&server.name, generation) {
            // Its own upstream runs: ask it (in the background, so that a slow answer still
            // arrives, as list_changed), and show what the catalog knows if it is late.
            let failed_since = self.fetch_failed.lock().expect("fetching").get(&key).is_some_and(|(at, _)| *at > asked);
            if failed_since {
                return Part::Skip { fallback };
            }
            if kicked.insert(&server.name) {
                let _ = self.background.send(Background::Refetch { server: server.name.clone(), kind });
            }
            return Part::Wait { fallback };
        }
        match known {
            Known::Ready(items) => {
                // Restored from the cache file and not listed afresh for this profile yet.
                if self.shared.lists.needs_warm(&server.name, generation, &self.profile) && kicked.insert(&server.name)
                {
                    tokio::spawn(gateway_catalog::warm(
                        self.shared.clone(),
                        server.clone(),
                        pool.init_params().clone(),
                    ));
                }
                Part::Have { items, own: false }
            }
            // Another client profile's list, at once; this profile's own follows in the
            // background (list_changed if it differs).
            Known::Shared { items, warming } => {
                if !warming && kicked.insert(&server.name) {
                    tokio::spawn(gateway_catalog::warm(
                        self.shared.clone(),
                        server.clone(),
                        pool.init_params().clone(),
                    ));
                }
                Part::Have { items, own: false }
            }
            Known::Pending { warming, stale } => {
                if warming.is_none() && kicked.insert(&server.name) {
                    tokio::spawn(gateway_catalog::warm(
                        self.shared.clone(),
                        server.clone(),
                        pool.init_params().clone(),
                    ));
                }
                Part::Wait { fallback: stale }
            }
            Known::Failed { retry_due, stale, .. } => {
                if retry_due && kicked.insert(&server.name) {
                    tokio::spawn(gateway_catalog::warm(
                        self.shared.clone(),
                        server.clone(),
                        pool.init_params().clone(),
                    ));
                }
                Part::Skip { fallback: stale }
            }
        }
    }

    /// Whether the client should be told that `server`'s list of `kind` changed: the
    /// session's last list showed it from the gateway catalog (or left it out), and the
    /// catalog now knows a different one. Remembers the new one as shown.
    pub fn outdated(&self, server: &str, kind: ListKind) -> bool {
        let Some(spec) = self.shared.snapshot.current().servers.get(server).cloned() else { return false };
        let generation = self.shared.snapshot.current().generation(&spec);
        let Known::Ready(items) = self.shared.lists.lookup(server, generation, &self.profile, kind) else {
            return false;
        };
        let mut shown = self.shown.lock().expect("shown");
        match shown.get_mut(&(server.to_owned(), kind)) {
            Some(s) if !s.own && s.items.as_ref() != Some(&items) => {
                s.items = Some(items);
                true
            }
            _ => false,
        }
    }

    /// The kinds of `server` whose last list did not come from the session's own upstream.
    pub fn not_own(&self, server: &str) -> Vec<ListKind> {
        let shown = self.shown.lock().expect("shown");
        shown.iter().filter(|((s, _), v)| s == server && !v.own).map(|((_, k), _)| *k).collect()
    }

    /// The `(server, original)` behind exposed tool or prompt name `exposed`, if this session
    /// has learnt it (from a list, or [`Catalog::learn_names`]).
    pub fn lookup(&self, kind: ListKind, exposed: &str) -> Option<(String, String)> {
        self.names.read().expect("names").get(&kind).and_then(|m| m.get(exposed).cloned())
    }

    /// Fetches one server's list of `kind` (bounded by the list deadline) and adds its exposed
    /// names to the session's reverse map.
    ///
    /// # Errors
    /// -32001 naming the upstream when it cannot be started or listed in time; -32602 when
    /// `server` is not registered.
    pub async fn learn_names(&self, pool: &Pool, kind: ListKind, server: &str) -> Result<(), RpcError> {
        let items: Arc<Vec<Value>> = if server == BUILTIN_SERVER {
            Arc::new(if kind == ListKind::Tools { self.shared.builtins.all_definitions() } else { Vec::new() })
        } else {
            let Some(spec) = self.shared.snapshot.current().servers.get(server).cloned() else {
                return Err(RpcError::new(INVALID_PARAMS, format!("Unknown server {server:?}")));
            };
            let generation = self.shared.snapshot.current().generation(&spec);
            let deadline = self.shared.list_timeout();
            if let Some(items) = self.cached(&(server.to_owned(), kind)) {
                items
            } else if let Known::Ready(items) = self.shared.lists.lookup(server, generation, &self.profile, kind) {
                // The names every session computes from this list; the call starts the upstream.
                // (Never another profile's list: a name it lacks may be one this client is
                // offered, e.g. a tool only for clients that can sample.)
                items
            } else {
                match tokio::time::timeout(deadline, self.fetch(pool, &spec, kind)).await {
                    Ok(Ok(items)) => items,
                    Ok(Err(e)) => return Err(e.into()),
                    Err(_) => {
                        return Err(RpcError::new(
                            UPSTREAM_UNAVAILABLE,
                            format!(
                                "upstream {server} did not list its {} within {} ms",
                                kind.key(),
                                deadline.as_millis()
                            ),
                        )
                        .with_data(json!({"server": server})));
                    }
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

    /// Remembers resource URIs a tool result points at (`resource_link`, embedded resources),
    /// so a later unprefixed `resources/read` of one reaches the same upstream.
    pub fn learn_uris(&self, server: &str, result: &RawValue) {
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
                && uris.len() < MAX_TOOL_URIS
            {
                uris.insert(u.to_owned(), server.to_owned());
            }
        }
    }

    /// The server whose tool result returned unprefixed resource URI `uri` this session.
    pub fn uri_server(&self, uri: &str) -> Option<String> {
        self.tool_uris.lock().expect("uris").get(uri).cloned()
    }
}
