//! A session's capability catalog: each upstream's lists (all pages, cached 60 s per session
//! per upstream, one fetch at a time per list), the merged fan-out under exposed names
//! (`<server>__<name>` through [`naming`], `coffer://<server>/<uri>` for resources), and the
//! reverse maps from exposed names, and from resource URIs seen in tool results, back to their
//! upstream.
use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use coffer_proto::store::McpServer;
use coffer_types::BUILTIN_SERVER;
use serde_json::value::RawValue;
use serde_json::{Value, json};

use super::Shared;
use super::answer::RpcError;
use super::jsonrpc::{INVALID_PARAMS, METHOD_NOT_FOUND, UPSTREAM_UNAVAILABLE};
use super::naming::{self, NameMap};
use super::pool::Pool;
use super::upstream::{Reply, UpstreamError};
use crate::snapshot::Kind;

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
}

impl Catalog {
    /// An empty catalog for session `session_id` (the id only names it in logs).
    pub fn new(shared: Arc<Shared>, session_id: &str) -> Self {
        Self {
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
        let result = self.fetch_now(pool, server, kind).await;
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

    /// [`Catalog::fetch`] without cache or sharing.
    async fn fetch_now(
        &self,
        pool: &Pool,
        server: &McpServer,
        kind: ListKind,
    ) -> Result<Arc<Vec<Value>>, UpstreamError> {
        let up = pool.upstream(server, self.shared.snapshot.current().generation(server)).await?;
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

    /// Drops the cached lists of `server` (all kinds), or of every server.
    pub fn invalidate(&self, server: Option<&str>) {
        let mut c = self.cache.lock().expect("cache");
        match server {
            Some(s) => c.retain(|(n, _), _| n != s),
            None => c.clear(),
        }
    }

    /// Fans `kind` out to every enabled upstream in parallel (each bounded by the list
    /// deadline; a slow or failing one is left out, logged and shown in status), adds the
    /// built-in tools, merges in server-name order, assigns exposed names (or `coffer://`
    /// URIs), refreshes the reverse map, and returns every item with its policy flag.
    pub async fn list_all(&self, pool: &Pool, kind: ListKind) -> Vec<Listed> {
        let snap = self.shared.snapshot.current();
        let mut servers: Vec<McpServer> = snap.servers.values().filter(|s| s.enabled).cloned().collect();
        servers.sort_by(|a, b| a.name.cmp(&b.name));
        let deadline = self.shared.list_timeout();
        let fetches = servers.iter().map(|s| async move {
            match tokio::time::timeout(deadline, self.fetch(pool, s, kind)).await {
                Ok(Ok(items)) => Some((s.name.clone(), items)),
                Ok(Err(e)) => {
                    tracing::warn!(server = %s.name, session = %self.session_id, error = %e, method = kind.method(), "Upstream left out of the list.");
                    // A failed start is recorded by the pool; a stop Coffer asked for is no fault.
                    if e.is_fault() && !matches!(e, UpstreamError::Start { .. }) {
                        self.shared.health.failed(&s.name, &e.to_string());
                    }
                    None
                }
                Err(_) => {
                    let msg = format!("{} took longer than {} ms", kind.method(), deadline.as_millis());
                    tracing::warn!(server = %s.name, session = %self.session_id, "{msg}; left out of the list.");
                    self.shared.health.failed(&s.name, &msg);
                    None
                }
            }
        });
        let results = futures_util::future::join_all(fetches).await;

        let mut all: Vec<(String, Value)> = Vec::new();
        if kind == ListKind::Tools {
            all.extend(self.shared.builtins.definitions().into_iter().map(|d| (BUILTIN_SERVER.to_owned(), d)));
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
            Arc::new(if kind == ListKind::Tools { self.shared.builtins.definitions() } else { Vec::new() })
        } else {
            let Some(spec) = self.shared.snapshot.current().servers.get(server).cloned() else {
                return Err(RpcError::new(INVALID_PARAMS, format!("Unknown server {server:?}")));
            };
            let deadline = self.shared.list_timeout();
            match tokio::time::timeout(deadline, self.fetch(pool, &spec, kind)).await {
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
