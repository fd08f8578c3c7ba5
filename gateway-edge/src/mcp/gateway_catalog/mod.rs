//! The gateway-wide capability catalog: the last list of each kind that each registered server
//! returned (to any session, or to the catalog's own background start), keyed by the server's
//! [`Generation`] (registry version and credential epoch) and by the client's capabilities
//! (a [`Profile`]: Coffer mirrors them in the upstream's `initialize`, and servers offer some
//! tools only to clients that can, e.g., sample). A new session's lists are answered from it at
//! once; a server it does not know yet is started once in the background ([`warm`]) and listed,
//! while lists wait for it at most `gateway.first_list_timeout_ms`. Failures are remembered: a
//! server that failed to start or to list is not waited on again until its backoff has passed,
//! and then it is retried in the background, never by a waiting list.
//!
//! First contact is answered at once in two more cases:
//! - **After a restart.** The catalog is kept in a regenerable cache file,
//!   `COFFER_HOME/cache/catalog.json` ([`CACHE_FILE`]: derived data like the search index, never
//!   in `coffer.db`, safe to delete). The gateway loads it at start ([`GatewayCatalog::load`]);
//!   a server's restored lists are served while it is unchanged (same registry version and
//!   identity, see [`fingerprint`]) and refreshed in the background at start; the client gets
//!   `list_changed` only if the fresh list differs. [`persist`] rewrites the file (atomically,
//!   0600) shortly after the catalog changes (both in `cache.rs`).
//! - **A capability set never seen before.** Its lists are answered from another profile's list
//!   of the same server ([`Known::Shared`]: lists rarely depend on client capabilities) while its
//!   own is fetched in the background; `list_changed` follows if that one differs.
//!
//! Who fills it: [`follow`] (every server registered or changed, from the snapshot's change
//! feed), any session's fresh list (`Catalog::fetch`), and the background retries. Sessions
//! learn what changed from [`GatewayCatalog::subscribe`] and tell their client
//! `notifications/*/list_changed` when it differs from what they showed. A background start
//! stays up for [`LINGER`] after listing, so that a server which changes its lists right after
//! starting (`notifications/*/list_changed`) is listed again.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use coffer_api::servers::{CatalogPhase, CatalogState, CatalogStatus};
use coffer_proto::store::McpServer;
use serde_json::{Value, json};
use tokio::sync::{Notify, Semaphore, broadcast, watch};
use tokio_util::sync::CancellationToken;

use crate::mcp::catalog::ListKind;
use crate::mcp::upstream::era::Era;
use crate::mcp::{SUPPORTED_VERSIONS, Session, Shared};
use crate::snapshot::Generation;

mod cache;
#[cfg(test)]
mod tests;

use cache::{CACHE_FORMAT, CacheBody, CachedList, CachedServer, read_cache};
pub use cache::{fingerprint, persist};

/// Backoff after a server's first failure to start or list; it doubles with each failure in a
/// row, up to [`MAX_BACKOFF`]. During it, lists answer without the server.
pub const FIRST_BACKOFF: Duration = Duration::from_secs(5);
/// Longest backoff between two background retries of a failing server.
pub const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// Most client profiles remembered (for background starts on registry changes).
const MAX_PROFILES: usize = 4;

/// The cache file under `COFFER_HOME`.
pub const CACHE_FILE: &str = "cache/catalog.json";
/// Background starts running at once (the rest queue): a restart refreshes every server, and a
/// small machine should not start twenty of them at the same moment.
const MAX_WARMING: usize = 4;
/// How long a background start stays up after it listed everything, so that list changes the
/// server announces right after starting are followed.
pub const LINGER: Duration = Duration::from_secs(2);

/// The client capabilities an upstream is initialized with, as canonical JSON text (keys
/// sorted): lists are known per profile.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Profile(Arc<str>);

impl Profile {
    /// The canonical capabilities text (`{"roots":{…},"sampling":{}}`).
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// How alike two profiles are: capability names both declare, less those only one does.
    fn likeness(&self, other: &Profile) -> i64 {
        fn names(p: &Profile) -> Vec<String> {
            match serde_json::from_str::<Value>(&p.0) {
                Ok(Value::Object(m)) => m.keys().cloned().collect(),
                _ => Vec::new(),
            }
        }
        let (a, b) = (names(self), names(other));
        let both = a.iter().filter(|n| b.contains(n)).count() as i64;
        both - (a.len() as i64 - both) - (b.len() as i64 - both)
    }

    /// The profile of `initialize` params `{protocolVersion, capabilities, clientInfo}`.
    pub fn of(init_params: &Value) -> Self {
        fn canonical(v: &Value) -> Value {
            match v {
                Value::Object(m) => {
                    let mut keys: Vec<&String> = m.keys().collect();
                    keys.sort();
                    Value::Object(keys.into_iter().map(|k| (k.clone(), canonical(&m[k]))).collect())
                }
                Value::Array(a) => Value::Array(a.iter().map(canonical).collect()),
                v => v.clone(),
            }
        }
        let caps = init_params.get("capabilities").cloned().unwrap_or_else(|| json!({}));
        Self(canonical(&caps).to_string().into())
    }
}

/// What the catalog knows about one list of one server, for the generation asked about.
#[derive(Debug, Clone)]
pub enum Known {
    /// The list of this generation.
    Ready(Arc<Vec<Value>>),
    /// No list of this generation for this profile yet, but another profile's (the most alike):
    /// answer with it now. `warming`: this profile's own list is being fetched in the background.
    Shared { items: Arc<Vec<Value>>, warming: bool },
    /// Not known yet. `warming`: a background start is listing it now (since `since`); `stale`:
    /// the list it had before (an older generation, or invalidated), if any.
    Pending { warming: Option<Instant>, stale: Option<Arc<Vec<Value>>> },
    /// Its last start or list failed (`error`); `retry_due` once the backoff has passed.
    Failed { error: String, retry_due: bool, stale: Option<Arc<Vec<Value>>> },
}

struct Listing {
    items: Arc<Vec<Value>>,
    /// Older than what the server may list now: its generation changed or it said its lists
    /// changed. Served only when nothing fresher arrives in time.
    stale: bool,
    /// Loaded from the cache file and not listed afresh since: served, and refreshed in the
    /// background.
    restored: bool,
}

struct Failure {
    at: Instant,
    attempts: u32,
    error: String,
}

impl Failure {
    fn backoff(&self) -> Duration {
        coffer_runtime::Backoff::new(FIRST_BACKOFF, MAX_BACKOFF).delay_after(self.attempts.max(1))
    }
}

#[derive(Default)]
struct Entry {
    generation: Generation,
    lists: HashMap<(Profile, ListKind), Listing>,
    /// Background starts in flight, per profile: for which generation, since when.
    warming: HashMap<Profile, (Generation, Instant)>,
    /// The server's last failure (whatever the profile: a server that cannot start cannot for
    /// any client).
    failure: Option<Failure>,
    /// The protocol era the server was found speaking at this generation (whatever the
    /// profile), so that later starts skip a probe that would fail.
    era: Option<Era>,
    /// Restored from the cache file: the [`fingerprint`] of the registration it was listed for,
    /// checked against the registry once it loads (then `None`).
    fingerprint: Option<String>,
}

impl Entry {
    /// The fresh list of `kind` of the profile most like `profile`, if any profile has one.
    fn shared_list(&self, profile: &Profile, kind: ListKind) -> Option<Arc<Vec<Value>>> {
        self.lists
            .iter()
            .filter(|((p, k), l)| *k == kind && !l.stale && p != profile)
            .max_by(|((a, _), _), ((b, _), _)| {
                // The most alike; among equals, the one with the shorter text (fewer extras), then
                // by text so that the choice does not depend on hash order.
                (a.likeness(profile), std::cmp::Reverse(a.0.len()), std::cmp::Reverse(a.as_str())).cmp(&(
                    b.likeness(profile),
                    std::cmp::Reverse(b.0.len()),
                    std::cmp::Reverse(b.as_str()),
                ))
            })
            .map(|(_, l)| l.items.clone())
    }

    /// Moves the entry to `generation`: what it knew becomes stale, the failure is forgotten.
    fn at(&mut self, generation: Generation) {
        if self.generation != generation {
            self.generation = generation;
            self.failure = None;
            self.era = None;
            self.fingerprint = None;
            for l in self.lists.values_mut() {
                l.stale = true;
            }
        }
    }
}

/// The gateway's capability catalog (one per gateway, in [`Shared`]).
pub struct GatewayCatalog {
    servers: Mutex<HashMap<String, Entry>>,
    /// The `initialize` params of the last few distinct client profiles, newest first.
    clients: Mutex<VecDeque<(Profile, Value)>>,
    /// Bumped on every change (a list stored, a failure, a background start ended): lists that
    /// wait for servers wake on it.
    version: watch::Sender<u64>,
    /// `(server, kind)` whose known list changed (new or different items).
    changed: broadcast::Sender<(String, ListKind)>,
    /// Something worth persisting changed since the cache file was last written.
    dirty: AtomicBool,
    dirty_notify: Notify,
    /// Background starts running at once.
    warming: Semaphore,
    /// The sessions of background starts running now (listing or lingering) and their server,
    /// by session id: the gateway's shutdown ends them with the clients' sessions.
    starts: Mutex<HashMap<String, (String, Arc<Session>)>>,
}

impl Default for GatewayCatalog {
    fn default() -> Self {
        Self {
            servers: Mutex::default(),
            clients: Mutex::default(),
            version: watch::Sender::new(0),
            changed: broadcast::channel(256).0,
            dirty: AtomicBool::new(false),
            dirty_notify: Notify::new(),
            warming: Semaphore::new(MAX_WARMING),
            starts: Mutex::default(),
        }
    }
}

impl GatewayCatalog {
    fn bump(&self) {
        self.version.send_modify(|v| *v += 1);
    }

    /// Ends every background start now (their upstream children are terminated): the gateway
    /// is shutting down.
    pub async fn close_starts(&self) {
        let all: Vec<Arc<Session>> = self.starts.lock().expect("catalog").drain().map(|(_, (_, s))| s).collect();
        futures_util::future::join_all(all.iter().map(|s| s.close())).await;
    }

    fn mark_dirty(&self) {
        self.dirty.store(true, Ordering::Release);
        self.dirty_notify.notify_one();
    }

    /// A catalog with what the cache file at `path` holds (lists, eras and client profiles), or
    /// an empty one when it is missing. A file that cannot be read, is larger than 64 MiB, is
    /// not the expected JSON or of another format is ignored with a warning naming the path and
    /// the reason (it is derived data: the next write replaces it).
    pub fn load(path: &Path) -> Self {
        let c = Self::default();
        let body = match read_cache(path) {
            Ok(Some(b)) => b,
            Ok(None) => return c,
            Err(why) => {
                tracing::warn!(path = %path.display(), reason = %why, "Capability catalog cache ignored; it is rebuilt as servers are listed.");
                return c;
            }
        };
        let mut servers = c.servers.lock().expect("catalog");
        let mut lists = 0usize;
        for (name, cached) in body.servers {
            let mut e = Entry {
                generation: Generation { version: cached.version, credentials: 0 },
                fingerprint: Some(cached.fingerprint),
                era: cached.era.as_deref().and_then(Era::parse),
                ..Entry::default()
            };
            for l in cached.lists {
                let Some(kind) = ListKind::ALL.into_iter().find(|k| k.method() == l.kind) else { continue };
                e.lists.insert(
                    (Profile(l.profile.into()), kind),
                    Listing { items: Arc::new(l.items), stale: false, restored: true },
                );
                lists += 1;
            }
            servers.insert(name, e);
        }
        let n = servers.len();
        drop(servers);
        {
            let mut clients = c.clients.lock().expect("catalog");
            for params in body.clients.into_iter().take(MAX_PROFILES) {
                if params.is_object() {
                    clients.push_back((Profile::of(&params), params));
                }
            }
        }
        tracing::info!(servers = n, lists, "Capability catalog restored from its cache file.");
        c
    }

    /// The cache file's body for what the catalog knows now: every server's fresh lists of the
    /// generation `snapshot` has, with its [`fingerprint`]; nothing of servers no longer
    /// registered, nothing stale.
    fn cache_body(&self, snapshot: &crate::snapshot::Snapshot) -> CacheBody {
        let servers = self.servers.lock().expect("catalog");
        let mut out = BTreeMap::new();
        for (name, e) in servers.iter() {
            let Some(spec) = snapshot.servers.get(name) else { continue };
            if snapshot.generation(spec) != e.generation || e.fingerprint.is_some() {
                continue;
            }
            let mut lists: Vec<CachedList> = e
                .lists
                .iter()
                .filter(|(_, l)| !l.stale)
                .map(|((p, k), l)| CachedList {
                    profile: p.as_str().to_owned(),
                    kind: k.method().to_owned(),
                    items: l.items.as_ref().clone(),
                })
                .collect();
            if lists.is_empty() {
                continue;
            }
            lists.sort_by(|a, b| (&a.profile, &a.kind).cmp(&(&b.profile, &b.kind)));
            out.insert(
                name.clone(),
                CachedServer {
                    version: spec.version,
                    fingerprint: fingerprint(spec),
                    era: e.era.map(|era| era.as_str().to_owned()),
                    lists,
                },
            );
        }
        drop(servers);
        let clients = self.clients.lock().expect("catalog").iter().map(|(_, p)| p.clone()).collect();
        CacheBody { format: CACHE_FORMAT, clients, servers: out }
    }

    /// Checks restored entries against the loaded registry: a server whose registration is not
    /// the one its lists were made for (another [`fingerprint`]) loses them.
    fn validate_restored(&self, snapshot: &crate::snapshot::Snapshot) {
        let mut servers = self.servers.lock().expect("catalog");
        servers.retain(|name, e| {
            let Some(fp) = e.fingerprint.take() else { return true };
            let same = snapshot.servers.get(name).is_some_and(|s| fingerprint(s) == fp);
            if !same {
                tracing::info!(server = %name, "Restored capability lists dropped: the server was registered again or changed.");
            }
            same
        });
    }

    /// Remembers the `initialize` params of a client session, so that servers registered or
    /// changed later are started in the background for clients like it too.
    pub fn remember_client(&self, init_params: &Value) {
        let profile = Profile::of(init_params);
        let mut clients = self.clients.lock().expect("catalog");
        clients.retain(|(p, _)| *p != profile);
        clients.push_front((profile, init_params.clone()));
        clients.truncate(MAX_PROFILES);
        drop(clients);
        self.mark_dirty();
    }

    /// The `initialize` params of the clients remembered, newest first (a client without
    /// capabilities when none connected yet).
    fn clients(&self) -> Vec<Value> {
        let clients = self.clients.lock().expect("catalog");
        if clients.is_empty() {
            return vec![default_client()];
        }
        clients.iter().map(|(_, params)| params.clone()).collect()
    }

    /// What is known of `server`'s list of `kind` at `generation` for clients of `profile`.
    pub fn lookup(&self, server: &str, generation: Generation, profile: &Profile, kind: ListKind) -> Known {
        let servers = self.servers.lock().expect("catalog");
        let Some(e) = servers.get(server) else { return Known::Pending { warming: None, stale: None } };
        let listing = e.lists.get(&(profile.clone(), kind));
        if e.generation == generation
            && let Some(l) = listing.filter(|l| !l.stale)
        {
            return Known::Ready(l.items.clone());
        }
        let stale = listing.map(|l| l.items.clone());
        let warming = e.warming.get(profile).filter(|(g, _)| *g == generation).map(|(_, since)| *since);
        if e.generation == generation
            && listing.is_none()
            && let Some(items) = e.shared_list(profile, kind)
        {
            return Known::Shared { items, warming: warming.is_some() };
        }
        match &e.failure {
            // Failed: not waited on, also while a background retry runs.
            Some(f) if e.generation == generation => Known::Failed {
                error: f.error.clone(),
                retry_due: warming.is_none() && f.at.elapsed() >= f.backoff(),
                stale,
            },
            _ => Known::Pending { warming, stale },
        }
    }

    /// Stores a fresh list (`items`, all pages) of `server` at `generation` for clients of
    /// `profile`; clears its failure. Sessions are told when it differs from what was known.
    pub fn store(
        &self,
        server: &str,
        generation: Generation,
        profile: &Profile,
        kind: ListKind,
        items: Arc<Vec<Value>>,
    ) {
        let changed = {
            let mut servers = self.servers.lock().expect("catalog");
            let e = servers.entry(server.to_owned()).or_default();
            e.at(generation);
            e.failure = None;
            let key = (profile.clone(), kind);
            let changed = e.lists.get(&key).is_none_or(|l| l.items != items);
            e.lists.insert(key, Listing { items, stale: false, restored: false });
            changed
        };
        if changed {
            let _ = self.changed.send((server.to_owned(), kind));
        }
        self.mark_dirty();
        self.bump();
    }

    /// Remembers that `server` at `generation` failed to start or to list (`error`, no secret:
    /// upstream errors never carry credential values).
    pub fn failed(&self, server: &str, generation: Generation, error: &str) {
        {
            let mut servers = self.servers.lock().expect("catalog");
            let e = servers.entry(server.to_owned()).or_default();
            e.at(generation);
            let attempts = e.failure.as_ref().map_or(0, |f| f.attempts) + 1;
            e.failure = Some(Failure { at: Instant::now(), attempts, error: error.to_owned() });
        }
        self.bump();
    }

    /// The era `server` was found speaking at `generation`, if known.
    pub fn era(&self, server: &str, generation: Generation) -> Option<Era> {
        let servers = self.servers.lock().expect("catalog");
        servers.get(server).filter(|e| e.generation == generation).and_then(|e| e.era)
    }

    /// Remembers that `server` at `generation` speaks `era` (learnt by a start's probe).
    pub fn learn_era(&self, server: &str, generation: Generation, era: Era) {
        let mut servers = self.servers.lock().expect("catalog");
        let e = servers.entry(server.to_owned()).or_default();
        if e.generation == generation || (e.lists.is_empty() && e.warming.is_empty()) {
            e.at(generation);
            e.era = Some(era);
        }
        drop(servers);
        self.mark_dirty();
    }

    /// Marks the known lists of `server` (or of every server) stale: the server said its lists
    /// changed, or the user asked for a refresh.
    pub fn invalidate(&self, server: Option<&str>) {
        {
            let mut servers = self.servers.lock().expect("catalog");
            for (name, e) in servers.iter_mut() {
                if server.is_none_or(|s| s == name) {
                    for l in e.lists.values_mut() {
                        l.stale = true;
                    }
                }
            }
        }
        self.mark_dirty();
        self.bump();
    }

    /// Forgets servers that are no longer registered.
    pub fn retain(&self, registered: &HashMap<String, McpServer>) {
        let mut servers = self.servers.lock().expect("catalog");
        let before = servers.len();
        servers.retain(|name, _| registered.contains_key(name));
        if servers.len() != before {
            drop(servers);
            self.mark_dirty();
        }
    }

    /// Whether `server` at `generation` needs a background start for `profile`: nothing is
    /// known of this generation (for that profile; lists restored from the cache file count as
    /// unknown: they are listed afresh once), it has not failed, and none is in flight.
    pub fn needs_warm(&self, server: &str, generation: Generation, profile: &Profile) -> bool {
        self.needs_start(server, generation, profile, true)
    }

    /// [`GatewayCatalog::needs_warm`]; `refresh_restored` false: restored lists count as known.
    fn needs_start(&self, server: &str, generation: Generation, profile: &Profile, refresh_restored: bool) -> bool {
        let servers = self.servers.lock().expect("catalog");
        servers.get(server).is_none_or(|e| {
            let current = e.generation == generation;
            let known = current && e.lists.iter().any(|((p, _), l)| p == profile && !(refresh_restored && l.restored));
            let failed = current && e.failure.is_some();
            let warming = e.warming.get(profile).is_some_and(|(g, _)| *g == generation);
            !known && !failed && !warming
        })
    }

    /// Claims the background start of `server` at `generation` for `profile`; false when one
    /// is in flight.
    fn begin_warm(&self, server: &str, generation: Generation, profile: &Profile) -> bool {
        let mut servers = self.servers.lock().expect("catalog");
        let e = servers.entry(server.to_owned()).or_default();
        if e.warming.get(profile).is_some_and(|(g, _)| *g == generation) {
            return false;
        }
        e.at(generation);
        e.warming.insert(profile.clone(), (generation, Instant::now()));
        true
    }

    fn end_warm(&self, server: &str, generation: Generation, profile: &Profile) {
        if let Some(e) = self.servers.lock().expect("catalog").get_mut(server)
            && e.warming.get(profile).is_some_and(|(g, _)| *g == generation)
        {
            e.warming.remove(profile);
        }
        self.bump();
    }

    /// A receiver that changes whenever the catalog does.
    pub fn watch(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }

    /// The `(server, kind)` lists that changed from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<(String, ListKind)> {
        self.changed.subscribe()
    }

    /// `server`'s part of `/v1/status` ([`CatalogStatus`]: `state` ready, listing, failed or
    /// unknown; `error`, `retry_in_ms`, `retrying` when failed; `background`) at `generation`. `failed`: lists
    /// answer without it until it recovers (retried in the background after `retry_in_ms`;
    /// `retrying` while that runs). `background`: a background start of it is running (listing,
    /// or up for [`LINGER`] after listing to follow its list changes).
    pub fn status(&self, server: &str, generation: Generation) -> CatalogStatus {
        let background = self.starts.lock().expect("catalog").values().any(|(s, _)| s == server);
        CatalogStatus { background, ..self.state(server, generation) }
    }

    /// [`GatewayCatalog::status`] without `background`.
    fn state(&self, server: &str, generation: Generation) -> CatalogStatus {
        let servers = self.servers.lock().expect("catalog");
        let Some(e) = servers.get(server) else { return CatalogStatus::of(CatalogPhase::Unknown) };
        let current = e.generation == generation;
        let listing = e.warming.values().any(|(g, _)| *g == generation);
        if current && let Some(f) = &e.failure {
            let retry = f.backoff().saturating_sub(f.at.elapsed()).as_millis() as u64;
            return CatalogStatus {
                error: Some(f.error.clone()),
                retry_in_ms: Some(retry),
                retrying: Some(listing),
                ..CatalogStatus::of(CatalogPhase::Failed)
            };
        }
        if listing {
            return CatalogStatus::of(CatalogPhase::Listing);
        }
        if current && e.lists.iter().any(|((_, k), l)| *k == ListKind::Tools && !l.stale) {
            return CatalogStatus::of(CatalogPhase::Ready);
        }
        CatalogStatus::of(CatalogPhase::Unknown)
    }
}

/// `initialize` params of a client without capabilities (the background starts' default).
fn default_client() -> Value {
    json!({"protocolVersion": SUPPORTED_VERSIONS[0], "capabilities": {}, "clientInfo": {"name": "coffer-catalog", "version": coffer_runtime::VERSION}})
}

/// What `GET /v1/mcp/servers/{name}/catalog` says of `server` at `generation` ([`CatalogState`]:
/// [`GatewayCatalog::status`], then `server`, the counts `tools`, `prompts`, `resources`,
/// `resource_templates` and `restored`) — counts from the list of the profile most like a client
/// without capabilities (`None`, null on the wire, for a kind not listed yet).
pub fn summary(shared: &Shared, server: &str, generation: Generation) -> CatalogState {
    let status = shared.lists.status(server, generation);
    let plain = Profile::of(&default_client());
    let servers = shared.lists.servers.lock().expect("catalog");
    let mut restored = false;
    let mut count = |kind: ListKind| {
        servers.get(server).filter(|e| e.generation == generation).and_then(|e| {
            let own = e.lists.get(&(plain.clone(), kind)).filter(|l| !l.stale);
            restored |= own.is_some_and(|l| l.restored);
            own.map(|l| l.items.clone()).or_else(|| e.shared_list(&plain, kind)).map(|i| i.len() as u64)
        })
    };
    let (tools, prompts, resources, resource_templates) = (
        count(ListKind::Tools),
        count(ListKind::Prompts),
        count(ListKind::Resources),
        count(ListKind::ResourceTemplates),
    );
    CatalogState { status, server: server.to_owned(), tools, prompts, resources, resource_templates, restored }
}

/// Waits until the catalog has listed `server` at its current generation (every kind, by a
/// background start that has ended), or failed to, at most `timeout`; starts that background
/// start when none is in flight or known. Returns [`summary`] (`state` `listing` when the
/// time ran out, `unknown` for a server not registered or disabled).
pub async fn wait_listed(shared: Arc<Shared>, server: &str, timeout: Duration) -> CatalogState {
    let until = tokio::time::Instant::now() + timeout;
    let mut changes = shared.lists.watch();
    let mut kicked = false;
    loop {
        changes.borrow_and_update();
        let snap = shared.snapshot.current();
        let Some(spec) = snap.servers.get(server).filter(|s| s.enabled).cloned() else {
            return summary(&shared, server, Generation::default());
        };
        let generation = snap.generation(&spec);
        let s = summary(&shared, server, generation);
        let settled = match s.status.state {
            CatalogPhase::Failed => true,
            CatalogPhase::Ready => {
                [s.tools, s.prompts, s.resources, s.resource_templates].iter().all(Option::is_some) && !s.restored
            }
            _ => false,
        };
        if settled {
            return s;
        }
        if !kicked && s.status.state != CatalogPhase::Listing {
            kicked = true;
            let client = shared.lists.clients().into_iter().next().unwrap_or_else(default_client);
            tokio::spawn(warm(shared.clone(), spec, client));
        }
        if tokio::time::timeout_at(until, changes.changed()).await.is_err() {
            return summary(&shared, server, generation);
        }
    }
}

/// Starts `server` once in a short-lived session of its own that presents itself as the client
/// of `client` (`initialize` params, mirrored upstream), lists every kind (each bounded by the
/// list deadline), which fills the catalog for that client's [`Profile`] (or records the
/// failure), keeps it up for [`LINGER`] (a list change it announces meanwhile is listed again
/// by the session), then stops it. Does nothing when such a start is in flight; at most
/// [`MAX_WARMING`] run at once.
pub async fn warm(shared: Arc<Shared>, server: McpServer, client: Value) {
    let generation = shared.snapshot.current().generation(&server);
    let profile = Profile::of(&client);
    if !shared.lists.begin_warm(&server.name, generation, &profile) {
        return;
    }
    let permit = shared.lists.warming.acquire().await.expect("the warming semaphore is never closed");
    let started = Instant::now();
    let version = client.get("protocolVersion").and_then(Value::as_str).unwrap_or(SUPPORTED_VERSIONS[0]).to_owned();
    let s = Session::new(format!("catalog-{}", uuid::Uuid::new_v4().simple()), version, &client, shared.clone());
    shared.lists.starts.lock().expect("catalog").insert(s.id.clone(), (server.name.clone(), s.clone()));
    let deadline = shared.list_timeout();
    let mut ok = true;
    for kind in ListKind::ALL {
        match tokio::time::timeout(deadline, s.fetch_server(&server, kind)).await {
            Ok(Ok(_)) => {}
            // Recorded by the fetch itself.
            Ok(Err(_)) => ok = false,
            Err(_) => {
                // The deadline covers the start too: say which part did not finish.
                let msg = if s.running_upstreams().contains(&server.name) {
                    format!("{} took longer than {} ms", kind.method(), deadline.as_millis())
                } else {
                    format!("did not start and answer initialize within {} ms", deadline.as_millis())
                };
                shared.health.failed(&server.name, &msg);
                shared.lists.failed(&server.name, generation, &msg);
                ok = false;
            }
        }
        if !ok {
            break;
        }
    }
    shared.lists.end_warm(&server.name, generation, &profile);
    drop(permit);
    let elapsed_ms = started.elapsed().as_millis() as u64;
    if ok {
        tracing::info!(server = %server.name, elapsed_ms, "Capability catalog filled.");
        // Followed by the session's own event loop: a list change is listed again.
        tokio::select! {
            () = tokio::time::sleep(LINGER) => {}
            () = s.closed.cancelled() => {}
        }
    } else {
        tracing::warn!(server = %server.name, elapsed_ms, "Capability catalog could not list the server; lists answer without it until it recovers.");
    }
    shared.lists.starts.lock().expect("catalog").remove(&s.id);
    s.close().await;
}

/// Keeps the catalog in step with the registry until `shutdown`: checks lists restored from the
/// cache file against the first registry it sees, starts every enabled server that is new or
/// changed (registry version or credential epoch) once in the background for each client
/// profile remembered (and, for the newest profile, every server whose lists were restored),
/// and forgets removed ones.
pub async fn follow(shared: Arc<Shared>, shutdown: CancellationToken) {
    let mut rx = shared.snapshot.subscribe();
    let mut validated = false;
    loop {
        let snap = rx.borrow_and_update().clone();
        if snap.loaded {
            if !validated {
                shared.lists.validate_restored(&snap);
                validated = true;
            }
            shared.lists.retain(&snap.servers);
            for (newest, client) in shared.lists.clients().into_iter().enumerate().map(|(i, c)| (i == 0, c)) {
                let profile = Profile::of(&client);
                for s in snap.servers.values().filter(|s| s.enabled) {
                    // Restored lists are refreshed here for the newest client profile only (a
                    // restart would otherwise start every server once per profile); the other
                    // profiles' when a session of theirs lists them (`Catalog::part`).
                    if shared.lists.needs_start(&s.name, snap.generation(s), &profile, newest) {
                        tokio::spawn(warm(shared.clone(), s.clone(), client.clone()));
                    }
                }
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            r = rx.changed() => if r.is_err() { return },
        }
    }
}
