//! The gateway-wide capability catalog: the last list of each kind that each registered server
//! returned (to any session, or to the catalog's own background start), keyed by the server's
//! [`Generation`] (registry version and credential epoch) and by the client's capabilities
//! (a [`Profile`]: Coffer mirrors them in the upstream's `initialize`, and servers offer some
//! tools only to clients that can, e.g., sample), in memory only — capability names and
//! schemas are never persisted. A new session's lists are answered from it at once; a
//! server it does not know yet is started once in the background ([`warm`]) and listed, while
//! lists wait for it at most `gateway.first_list_timeout_ms`. Failures are remembered: a server
//! that failed to start or to list is not waited on again until its backoff has passed, and then
//! it is retried in the background, never by a waiting list.
//!
//! Who fills it: [`follow`] (every server registered or changed, from the snapshot's change
//! feed), any session's fresh list (`Catalog::fetch`), and the background retries. Sessions
//! learn what changed from [`GatewayCatalog::subscribe`] and tell their client
//! `notifications/*/list_changed` when it differs from what they showed.
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use coffer_proto::store::McpServer;
use serde_json::{Value, json};
use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;

use super::catalog::ListKind;
use super::upstream_era::Era;
use super::{SUPPORTED_VERSIONS, Session, Shared};
use crate::snapshot::Generation;

/// Backoff after a server's first failure to start or list; it doubles with each failure in a
/// row, up to [`MAX_BACKOFF`]. During it, lists answer without the server.
pub const FIRST_BACKOFF: Duration = Duration::from_secs(5);
/// Longest backoff between two background retries of a failing server.
pub const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// Most client profiles remembered (for background starts on registry changes).
const MAX_PROFILES: usize = 4;

/// The client capabilities an upstream is initialized with, as canonical JSON text (keys
/// sorted): lists are known per profile.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Profile(Arc<str>);

impl Profile {
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
}

struct Failure {
    at: Instant,
    attempts: u32,
    error: String,
}

impl Failure {
    fn backoff(&self) -> Duration {
        FIRST_BACKOFF.saturating_mul(1 << self.attempts.saturating_sub(1).min(10)).min(MAX_BACKOFF)
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
}

impl Entry {
    /// Moves the entry to `generation`: what it knew becomes stale, the failure is forgotten.
    fn at(&mut self, generation: Generation) {
        if self.generation != generation {
            self.generation = generation;
            self.failure = None;
            self.era = None;
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
}

impl Default for GatewayCatalog {
    fn default() -> Self {
        Self {
            servers: Mutex::default(),
            clients: Mutex::default(),
            version: watch::Sender::new(0),
            changed: broadcast::channel(256).0,
        }
    }
}

impl GatewayCatalog {
    fn bump(&self) {
        self.version.send_modify(|v| *v += 1);
    }

    /// Remembers the `initialize` params of a client session, so that servers registered or
    /// changed later are started in the background for clients like it too.
    pub fn remember_client(&self, init_params: &Value) {
        let profile = Profile::of(init_params);
        let mut clients = self.clients.lock().expect("catalog");
        clients.retain(|(p, _)| *p != profile);
        clients.push_front((profile, init_params.clone()));
        clients.truncate(MAX_PROFILES);
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
            e.lists.insert(key, Listing { items, stale: false });
            changed
        };
        if changed {
            let _ = self.changed.send((server.to_owned(), kind));
        }
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
        self.bump();
    }

    /// Forgets servers that are no longer registered.
    pub fn retain(&self, registered: &HashMap<String, McpServer>) {
        self.servers.lock().expect("catalog").retain(|name, _| registered.contains_key(name));
    }

    /// Whether `server` at `generation` needs a background start for `profile`: nothing is
    /// known of this generation (for that profile), it has not failed, and none is in flight.
    fn needs_warm(&self, server: &str, generation: Generation, profile: &Profile) -> bool {
        let servers = self.servers.lock().expect("catalog");
        servers.get(server).is_none_or(|e| {
            let current = e.generation == generation;
            let known = current && e.lists.keys().any(|(p, _)| p == profile);
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

    /// `server`'s part of `/v1/status`: `{"state": "ready" | "listing" | "failed" | "unknown",
    /// "error"?, "retry_in_ms"?, "retrying"?}` at `generation`. `failed`: lists answer without
    /// it until it recovers (retried in the background after `retry_in_ms`; `retrying` while
    /// that runs).
    pub fn status(&self, server: &str, generation: Generation) -> Value {
        let servers = self.servers.lock().expect("catalog");
        let Some(e) = servers.get(server) else { return json!({"state": "unknown"}) };
        let current = e.generation == generation;
        let listing = e.warming.values().any(|(g, _)| *g == generation);
        if current && let Some(f) = &e.failure {
            let retry = f.backoff().saturating_sub(f.at.elapsed()).as_millis() as u64;
            return json!({"state": "failed", "error": f.error, "retry_in_ms": retry, "retrying": listing});
        }
        if listing {
            return json!({"state": "listing"});
        }
        if current && e.lists.iter().any(|((_, k), l)| *k == ListKind::Tools && !l.stale) {
            return json!({"state": "ready"});
        }
        json!({"state": "unknown"})
    }
}

/// `initialize` params of a client without capabilities (the background starts' default).
fn default_client() -> Value {
    json!({"protocolVersion": SUPPORTED_VERSIONS[0], "capabilities": {}, "clientInfo": {"name": "coffer-catalog", "version": coffer_runtime::VERSION}})
}

/// Starts `server` once in a short-lived session of its own that presents itself as the client
/// of `client` (`initialize` params, mirrored upstream), lists every kind (each bounded by the
/// list deadline), which fills the catalog for that client's [`Profile`] (or records the
/// failure), then stops it. Does nothing when such a start is in flight.
pub async fn warm(shared: Arc<Shared>, server: McpServer, client: Value) {
    let generation = shared.snapshot.current().generation(&server);
    let profile = Profile::of(&client);
    if !shared.lists.begin_warm(&server.name, generation, &profile) {
        return;
    }
    let started = Instant::now();
    let version = client.get("protocolVersion").and_then(Value::as_str).unwrap_or(SUPPORTED_VERSIONS[0]).to_owned();
    let s = Session::new(format!("catalog-{}", uuid::Uuid::new_v4().simple()), version, &client, shared.clone());
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
    s.close().await;
    shared.lists.end_warm(&server.name, generation, &profile);
    let elapsed_ms = started.elapsed().as_millis() as u64;
    if ok {
        tracing::info!(server = %server.name, elapsed_ms, "Capability catalog filled.");
    } else {
        tracing::warn!(server = %server.name, elapsed_ms, "Capability catalog could not list the server; lists answer without it until it recovers.");
    }
}

/// Keeps the catalog in step with the registry until `shutdown`: starts every enabled server
/// that is new or changed (registry version or credential epoch) once in the background for
/// each client profile remembered, and forgets removed ones.
pub async fn follow(shared: Arc<Shared>, shutdown: CancellationToken) {
    let mut rx = shared.snapshot.subscribe();
    loop {
        let snap = rx.borrow_and_update().clone();
        if snap.loaded {
            shared.lists.retain(&snap.servers);
            for client in shared.lists.clients() {
                let profile = Profile::of(&client);
                for s in snap.servers.values().filter(|s| s.enabled) {
                    if shared.lists.needs_warm(&s.name, snap.generation(s), &profile) {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn generation(version: i64) -> Generation {
        Generation { version, credentials: 0 }
    }

    fn p() -> Profile {
        Profile::default()
    }

    #[test]
    fn the_era_is_remembered_per_generation() {
        let c = GatewayCatalog::default();
        assert_eq!(c.era("a", generation(1)), None);
        c.learn_era("a", generation(1), Era::Modern);
        assert_eq!(c.era("a", generation(1)), Some(Era::Modern));
        assert_eq!(c.era("b", generation(1)), None, "per server");
        // A new registry version or credential epoch may run another program: probe again.
        assert_eq!(c.era("a", generation(2)), None);
        c.store("a", generation(2), &p(), ListKind::Tools, Arc::new(vec![]));
        assert_eq!(c.era("a", generation(2)), None);
        c.learn_era("a", generation(2), Era::Legacy);
        assert_eq!(c.era("a", generation(2)), Some(Era::Legacy));
        // A late start of the old generation does not overwrite what the new one learnt.
        c.learn_era("a", generation(1), Era::Modern);
        assert_eq!(c.era("a", generation(2)), Some(Era::Legacy));
    }

    #[test]
    fn lists_are_known_per_generation_and_kept_as_stale_after_a_change() {
        let c = GatewayCatalog::default();
        let mut changes = c.subscribe();
        assert!(matches!(
            c.lookup("a", generation(1), &p(), ListKind::Tools),
            Known::Pending { warming: None, stale: None }
        ));
        let items = Arc::new(vec![json!({"name": "echo"})]);
        c.store("a", generation(1), &p(), ListKind::Tools, items.clone());
        assert!(matches!(c.lookup("a", generation(1), &p(), ListKind::Tools), Known::Ready(i) if i == items));
        assert!(matches!(c.lookup("a", generation(1), &p(), ListKind::Prompts), Known::Pending { .. }));
        assert_eq!(changes.try_recv().unwrap(), ("a".to_owned(), ListKind::Tools));
        c.store("a", generation(1), &p(), ListKind::Tools, items.clone());
        assert!(changes.try_recv().is_err(), "the same list again is no change");
        // A new registry version: what was known is only a fallback.
        let Known::Pending { stale: Some(stale), .. } = c.lookup("a", generation(2), &p(), ListKind::Tools) else {
            panic!("pending with the old list")
        };
        assert_eq!(stale, items);
        c.invalidate(Some("a"));
        assert!(matches!(c.lookup("a", generation(1), &p(), ListKind::Tools), Known::Pending { stale: Some(_), .. }));
        c.retain(&HashMap::new());
        assert!(matches!(c.lookup("a", generation(1), &p(), ListKind::Tools), Known::Pending { stale: None, .. }));
    }

    #[test]
    fn a_failure_is_remembered_for_its_backoff_and_cleared_by_a_list() {
        let c = GatewayCatalog::default();
        c.failed("h", generation(1), "no initialize answer within 30000 ms");
        let Known::Failed { error, retry_due, .. } = c.lookup("h", generation(1), &p(), ListKind::Tools) else {
            panic!("failed")
        };
        assert!(!retry_due && error.contains("initialize"));
        assert_eq!(c.status("h", generation(1))["state"], "failed");
        assert!(
            matches!(c.lookup("h", generation(2), &p(), ListKind::Tools), Known::Pending { .. }),
            "a change retries"
        );
        c.failed("h", generation(1), "again");
        let attempts = c.servers.lock().unwrap()["h"].failure.as_ref().unwrap().attempts;
        assert_eq!(attempts, 2, "failures in a row lengthen the backoff");
        c.failed("h", generation(2), "after a change");
        let attempts = c.servers.lock().unwrap()["h"].failure.as_ref().unwrap().attempts;
        assert_eq!(attempts, 1, "a new generation starts over");
        c.failed("h", generation(1), "back");
        assert!(c.begin_warm("h", generation(1), &p()));
        assert!(!c.begin_warm("h", generation(1), &p()), "one background start at a time");
        assert!(
            matches!(c.lookup("h", generation(1), &p(), ListKind::Tools), Known::Failed { retry_due: false, .. }),
            "a background retry is not waited on"
        );
        assert_eq!(c.status("h", generation(1))["retrying"], true);
        c.store("h", generation(1), &p(), ListKind::Tools, Arc::new(Vec::new()));
        c.end_warm("h", generation(1), &p());
        assert_eq!(c.status("h", generation(1))["state"], "ready");
        assert!(!c.needs_warm("h", generation(1), &p()) && c.needs_warm("h", generation(3), &p()));
    }

    #[test]
    fn lists_are_known_per_client_profile_whatever_the_key_order() {
        let c = GatewayCatalog::default();
        let sampling = Profile::of(&json!({"capabilities": {"sampling": {}, "roots": {"listChanged": true}}}));
        let same = Profile::of(&json!({"capabilities": {"roots": {"listChanged": true}, "sampling": {}}}));
        assert_eq!(sampling, same);
        assert_ne!(sampling, Profile::of(&json!({"capabilities": {}})));
        c.store("e", generation(1), &sampling, ListKind::Tools, Arc::new(vec![json!({"name": "trigger-sampling"})]));
        assert!(matches!(c.lookup("e", generation(1), &same, ListKind::Tools), Known::Ready(_)));
        let plain = Profile::of(&json!({}));
        assert!(matches!(c.lookup("e", generation(1), &plain, ListKind::Tools), Known::Pending { stale: None, .. }));
        assert!(c.needs_warm("e", generation(1), &plain) && !c.needs_warm("e", generation(1), &sampling));
        assert_eq!(c.clients().len(), 1, "a client without capabilities when none connected");
        for i in 0..6 {
            c.remember_client(&json!({"capabilities": {"experimental": {"n": i}}}));
        }
        c.remember_client(&json!({"capabilities": {"experimental": {"n": 5}}}));
        assert_eq!(c.clients().len(), MAX_PROFILES);
    }

    #[test]
    fn backoff_doubles_up_to_its_bound() {
        let f = |attempts| Failure { at: Instant::now(), attempts, error: String::new() }.backoff();
        assert_eq!((f(1), f(2), f(3)), (FIRST_BACKOFF, FIRST_BACKOFF * 2, FIRST_BACKOFF * 4));
        assert_eq!(f(40), MAX_BACKOFF);
    }
}
