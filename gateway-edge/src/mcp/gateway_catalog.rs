//! The gateway-wide capability catalog: the last list of each kind that each registered server
//! returned (to any session, or to the catalog's own background start), keyed by the server's
//! [`Generation`] (registry version and credential epoch), in memory only — capability names
//! and schemas are never persisted. A new session's lists are answered from it at once; a
//! server it does not know yet is started once in the background ([`warm`]) and listed, while
//! lists wait for it at most `gateway.first_list_timeout_ms`. Failures are remembered: a server
//! that failed to start or to list is not waited on again until its backoff has passed, and then
//! it is retried in the background, never by a waiting list.
//!
//! Who fills it: [`follow`] (every server registered or changed, from the snapshot's change
//! feed), any session's fresh list (`Catalog::fetch`), and the background retries. Sessions
//! learn what changed from [`GatewayCatalog::subscribe`] and tell their client
//! `notifications/*/list_changed` when it differs from what they showed.
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use coffer_proto::store::McpServer;
use serde_json::{Value, json};
use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;

use super::catalog::ListKind;
use super::{SUPPORTED_VERSIONS, Session, Shared};
use crate::snapshot::Generation;

/// Backoff after a server's first failure to start or list; it doubles with each failure in a
/// row, up to [`MAX_BACKOFF`]. During it, lists answer without the server.
pub const FIRST_BACKOFF: Duration = Duration::from_secs(5);
/// Longest backoff between two background retries of a failing server.
pub const MAX_BACKOFF: Duration = Duration::from_secs(300);

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
    lists: HashMap<ListKind, Listing>,
    /// A background start in flight, for which generation, since when.
    warming: Option<(Generation, Instant)>,
    failure: Option<Failure>,
}

impl Entry {
    /// Moves the entry to `generation`: what it knew becomes stale, the failure is forgotten.
    fn at(&mut self, generation: Generation) {
        if self.generation != generation {
            self.generation = generation;
            self.failure = None;
            for l in self.lists.values_mut() {
                l.stale = true;
            }
        }
    }
}

/// The gateway's capability catalog (one per gateway, in [`Shared`]).
pub struct GatewayCatalog {
    servers: Mutex<HashMap<String, Entry>>,
    /// Bumped on every change (a list stored, a failure, a background start ended): lists that
    /// wait for servers wake on it.
    version: watch::Sender<u64>,
    /// `(server, kind)` whose known list changed (new or different items).
    changed: broadcast::Sender<(String, ListKind)>,
}

impl Default for GatewayCatalog {
    fn default() -> Self {
        Self { servers: Mutex::default(), version: watch::Sender::new(0), changed: broadcast::channel(256).0 }
    }
}

impl GatewayCatalog {
    fn bump(&self) {
        self.version.send_modify(|v| *v += 1);
    }

    /// What is known of `server`'s list of `kind` at `generation`.
    pub fn lookup(&self, server: &str, generation: Generation, kind: ListKind) -> Known {
        let servers = self.servers.lock().expect("catalog");
        let Some(e) = servers.get(server) else { return Known::Pending { warming: None, stale: None } };
        let listing = e.lists.get(&kind);
        if e.generation == generation
            && let Some(l) = listing.filter(|l| !l.stale)
        {
            return Known::Ready(l.items.clone());
        }
        let stale = listing.map(|l| l.items.clone());
        let warming = e.warming.filter(|(g, _)| *g == generation).map(|(_, since)| since);
        match &e.failure {
            Some(f) if e.generation == generation && warming.is_none() => {
                Known::Failed { error: f.error.clone(), retry_due: f.at.elapsed() >= f.backoff(), stale }
            }
            _ => Known::Pending { warming, stale },
        }
    }

    /// Stores a fresh list (`items`, all pages) of `server` at `generation`; clears its failure.
    /// Sessions are told when it differs from what was known.
    pub fn store(&self, server: &str, generation: Generation, kind: ListKind, items: Arc<Vec<Value>>) {
        let changed = {
            let mut servers = self.servers.lock().expect("catalog");
            let e = servers.entry(server.to_owned()).or_default();
            e.at(generation);
            e.failure = None;
            let changed = e.lists.get(&kind).is_none_or(|l| l.items != items);
            e.lists.insert(kind, Listing { items, stale: false });
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

    /// Whether `server` at `generation` needs a background start: nothing is known of this
    /// generation and none is in flight.
    fn needs_warm(&self, server: &str, generation: Generation) -> bool {
        let servers = self.servers.lock().expect("catalog");
        servers.get(server).is_none_or(|e| e.generation != generation && e.warming.is_none_or(|(g, _)| g != generation))
    }

    /// Claims the background start of `server` at `generation`; false when one is in flight.
    fn begin_warm(&self, server: &str, generation: Generation) -> bool {
        let mut servers = self.servers.lock().expect("catalog");
        let e = servers.entry(server.to_owned()).or_default();
        if e.warming.is_some_and(|(g, _)| g == generation) {
            return false;
        }
        e.at(generation);
        e.warming = Some((generation, Instant::now()));
        true
    }

    fn end_warm(&self, server: &str, generation: Generation) {
        if let Some(e) = self.servers.lock().expect("catalog").get_mut(server)
            && e.warming.is_some_and(|(g, _)| g == generation)
        {
            e.warming = None;
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
    /// "error"?, "retry_in_ms"?}` at `generation`. `failed`: lists answer without it until it
    /// recovers (retried in the background after `retry_in_ms`).
    pub fn status(&self, server: &str, generation: Generation) -> Value {
        let servers = self.servers.lock().expect("catalog");
        let Some(e) = servers.get(server) else { return json!({"state": "unknown"}) };
        let current = e.generation == generation;
        if e.warming.is_some_and(|(g, _)| g == generation) {
            return json!({"state": "listing"});
        }
        if current && let Some(f) = &e.failure {
            let retry = f.backoff().saturating_sub(f.at.elapsed()).as_millis() as u64;
            return json!({"state": "failed", "error": f.error, "retry_in_ms": retry});
        }
        if current && e.lists.get(&ListKind::Tools).is_some_and(|l| !l.stale) {
            return json!({"state": "ready"});
        }
        json!({"state": "unknown"})
    }
}

/// Starts `server` once in a short-lived session of its own, lists every kind (each bounded by
/// the list deadline), which fills the catalog (or records the failure), then stops it. Does
/// nothing when a background start of the same generation is in flight.
pub async fn warm(shared: Arc<Shared>, server: McpServer) {
    let generation = shared.snapshot.current().generation(&server);
    if !shared.lists.begin_warm(&server.name, generation) {
        return;
    }
    let started = Instant::now();
    let params = json!({"protocolVersion": SUPPORTED_VERSIONS[0], "capabilities": {}, "clientInfo": {"name": "coffer-catalog", "version": coffer_runtime::VERSION}});
    let s = Session::new(
        format!("catalog-{}", uuid::Uuid::new_v4().simple()),
        SUPPORTED_VERSIONS[0].into(),
        &params,
        shared.clone(),
    );
    let deadline = shared.list_timeout();
    let mut ok = true;
    for kind in ListKind::ALL {
        match tokio::time::timeout(deadline, s.fetch_server(&server, kind)).await {
            Ok(Ok(_)) => {}
            // Recorded by the fetch itself.
            Ok(Err(_)) => ok = false,
            Err(_) => {
                let msg = format!("{} took longer than {} ms", kind.method(), deadline.as_millis());
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
    shared.lists.end_warm(&server.name, generation);
    let elapsed_ms = started.elapsed().as_millis() as u64;
    if ok {
        tracing::info!(server = %server.name, elapsed_ms, "Capability catalog filled.");
    } else {
        tracing::warn!(server = %server.name, elapsed_ms, "Capability catalog could not list the server; lists answer without it until it recovers.");
    }
}

/// Keeps the catalog in step with the registry until `shutdown`: starts every enabled server
/// that is new or changed (registry version or credential epoch) once in the background, and
/// forgets removed ones.
pub async fn follow(shared: Arc<Shared>, shutdown: CancellationToken) {
    let mut rx = shared.snapshot.subscribe();
    loop {
        let snap = rx.borrow_and_update().clone();
        if snap.loaded {
            shared.lists.retain(&snap.servers);
            for s in snap.servers.values().filter(|s| s.enabled) {
                if shared.lists.needs_warm(&s.name, snap.generation(s)) {
                    tokio::spawn(warm(shared.clone(), s.clone()));
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

    #[test]
    fn lists_are_known_per_generation_and_kept_as_stale_after_a_change() {
        let c = GatewayCatalog::default();
        let mut changes = c.subscribe();
        assert!(matches!(c.lookup("a", generation(1), ListKind::Tools), Known::Pending { warming: None, stale: None }));
        let items = Arc::new(vec![json!({"name": "echo"})]);
        c.store("a", generation(1), ListKind::Tools, items.clone());
        assert!(matches!(c.lookup("a", generation(1), ListKind::Tools), Known::Ready(i) if i == items));
        assert!(matches!(c.lookup("a", generation(1), ListKind::Prompts), Known::Pending { .. }));
        assert_eq!(changes.try_recv().unwrap(), ("a".to_owned(), ListKind::Tools));
        c.store("a", generation(1), ListKind::Tools, items.clone());
        assert!(changes.try_recv().is_err(), "the same list again is no change");
        // A new registry version: what was known is only a fallback.
        let Known::Pending { stale: Some(stale), .. } = c.lookup("a", generation(2), ListKind::Tools) else {
            panic!("pending with the old list")
        };
        assert_eq!(stale, items);
        c.invalidate(Some("a"));
        assert!(matches!(c.lookup("a", generation(1), ListKind::Tools), Known::Pending { stale: Some(_), .. }));
        c.retain(&HashMap::new());
        assert!(matches!(c.lookup("a", generation(1), ListKind::Tools), Known::Pending { stale: None, .. }));
    }

    #[test]
    fn a_failure_is_remembered_for_its_backoff_and_cleared_by_a_list() {
        let c = GatewayCatalog::default();
        c.failed("h", generation(1), "no initialize answer within 30000 ms");
        let Known::Failed { error, retry_due, .. } = c.lookup("h", generation(1), ListKind::Tools) else {
            panic!("failed")
        };
        assert!(!retry_due && error.contains("initialize"));
        assert_eq!(c.status("h", generation(1))["state"], "failed");
        assert!(matches!(c.lookup("h", generation(2), ListKind::Tools), Known::Pending { .. }), "a change retries");
        c.failed("h", generation(1), "again");
        let attempts = c.servers.lock().unwrap()["h"].failure.as_ref().unwrap().attempts;
        assert_eq!(attempts, 2, "failures in a row lengthen the backoff");
        c.failed("h", generation(2), "after a change");
        let attempts = c.servers.lock().unwrap()["h"].failure.as_ref().unwrap().attempts;
        assert_eq!(attempts, 1, "a new generation starts over");
        c.failed("h", generation(1), "back");
        assert!(c.begin_warm("h", generation(1)));
        assert!(!c.begin_warm("h", generation(1)), "one background start at a time");
        assert_eq!(c.status("h", generation(1))["state"], "listing");
        c.store("h", generation(1), ListKind::Tools, Arc::new(Vec::new()));
        c.end_warm("h", generation(1));
        assert_eq!(c.status("h", generation(1))["state"], "ready");
        assert!(!c.needs_warm("h", generation(1)) && c.needs_warm("h", generation(3)));
    }

    #[test]
    fn backoff_doubles_up_to_its_bound() {
        let f = |attempts| Failure { at: Instant::now(), attempts, error: String::new() }.backoff();
        assert_eq!((f(1), f(2), f(3)), (FIRST_BACKOFF, FIRST_BACKOFF * 2, FIRST_BACKOFF * 4));
        assert_eq!(f(40), MAX_BACKOFF);
    }
}
