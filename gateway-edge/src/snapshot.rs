//! The gateway's in-memory snapshot of the MCP server registry, capability preferences,
//! settings and profiles, kept fresh from the store's change stream. Policy checks read it without any
//! store round trip; a REST mutation waits until the snapshot holds its change
//! ([`SnapshotHandle::wait_for`]) so policy reads its own writes.
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use coffer_proto::store::{
    CapabilityKind, ChangeEntity, GetSettingsRequest, HeadRequest, ListPreferencesRequest, ListProfilesRequest,
    ListServersRequest, McpServer, WatchChangesRequest,
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::clients::store::StoreClients;

/// Capability kinds with per-capability preferences.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Tool,
    Prompt,
    Resource,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Tool => "tool",
            Kind::Prompt => "prompt",
            Kind::Resource => "resource",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "tool" | "tools" => Some(Kind::Tool),
            "prompt" | "prompts" => Some(Kind::Prompt),
            "resource" | "resources" => Some(Kind::Resource),
            _ => None,
        }
    }
    /// The store's kind.
    pub fn to_proto(self) -> CapabilityKind {
        match self {
            Kind::Tool => CapabilityKind::Tool,
            Kind::Prompt => CapabilityKind::Prompt,
            Kind::Resource => CapabilityKind::Resource,
        }
    }
    /// The kind the store's names; `None` for `Unspecified`.
    pub fn from_proto(kind: CapabilityKind) -> Option<Self> {
        match kind {
            CapabilityKind::Tool => Some(Kind::Tool),
            CapabilityKind::Prompt => Some(Kind::Prompt),
            CapabilityKind::Resource => Some(Kind::Resource),
            CapabilityKind::Unspecified => None,
        }
    }
}

/// The registry version and credential epoch (see [`Snapshot::credential_epochs`]) an upstream
/// was started for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Generation {
    pub version: i64,
    pub credentials: u64,
}

/// One consistent view of the registry and preferences.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// Highest store change number reflected here.
    pub seq: u64,
    /// Registered servers by name.
    pub servers: HashMap<String, McpServer>,
    /// Explicit preferences; a capability without one is enabled.
    pub prefs: HashMap<(String, Kind, String), bool>,
    pub settings: HashMap<String, String>,
    /// Per server that references credentials: the change number of the last change to one of
    /// them seen since this gateway started (absent: none changed). An upstream started before
    /// that change holds old values in its environment or headers, so sessions start it again.
    pub credential_epochs: HashMap<String, u64>,
    /// Profiles by name (`coffer_api::profiles`: what each profile's sessions see). A session
    /// naming a profile absent here is refused; `default` absent means everything in full mode.
    pub profiles: HashMap<String, coffer_api::profiles::Profile>,
    /// False until the first load from the store succeeded.
    pub loaded: bool,
}

impl Snapshot {
    /// What an upstream of `server` must have been started for to be current: the registry
    /// version of its record and the epoch of the credentials it references.
    pub fn generation(&self, server: &McpServer) -> Generation {
        Generation {
            version: server.version,
            credentials: self.credential_epochs.get(&server.name).copied().unwrap_or(0),
        }
    }

    /// Whether a capability may be used: its server is registered and enabled (or it is a
    /// built-in `coffer` capability) and it has no `enabled = false` preference.
    pub fn capability_enabled(&self, server: &str, kind: Kind, name: &str) -> bool {
        let server_ok = server == coffer_types::BUILTIN_SERVER || self.servers.get(server).is_some_and(|s| s.enabled);
        server_ok && self.prefs.get(&(server.to_owned(), kind, name.to_owned())).copied().unwrap_or(true)
    }

    /// The preference flag alone (ignoring the server's enabled flag).
    pub fn preference(&self, server: &str, kind: Kind, name: &str) -> bool {
        self.prefs.get(&(server.to_owned(), kind, name.to_owned())).copied().unwrap_or(true)
    }
}

/// Read side of the snapshot; cheap to clone.
#[derive(Clone)]
pub struct SnapshotHandle {
    rx: watch::Receiver<Arc<Snapshot>>,
}

impl SnapshotHandle {
    /// A handle on `snapshot` that never changes (tests of the gateway core; no store).
    pub fn fixed(snapshot: Snapshot) -> Self {
        Self::manual(snapshot).1
    }

    /// A handle on `snapshot` and the sender that publishes its successors (tests that change
    /// policy; no store).
    pub fn manual(snapshot: Snapshot) -> (watch::Sender<Arc<Snapshot>>, Self) {
        let (tx, rx) = watch::channel(Arc::new(snapshot));
        (tx, Self { rx })
    }

    /// The current snapshot.
    pub fn current(&self) -> Arc<Snapshot> {
        self.rx.borrow().clone()
    }

    /// Waits (at most `timeout`) until the snapshot reflects change `seq`. Returns false on
    /// timeout.
    pub async fn wait_for(&self, seq: u64, timeout: Duration) -> bool {
        let mut rx = self.rx.clone();
        tokio::time::timeout(timeout, rx.wait_for(|s| s.loaded && s.seq >= seq)).await.is_ok_and(|r| r.is_ok())
    }

    /// A receiver that is notified on every new snapshot (sessions use it to send
    /// `notifications/tools/list_changed`).
    pub fn subscribe(&self) -> watch::Receiver<Arc<Snapshot>> {
        self.rx.clone()
    }
}

/// Starts the task that keeps the snapshot fresh; it ends when `shutdown` is cancelled.
pub fn start(store: StoreClients, shutdown: CancellationToken) -> SnapshotHandle {
    let (tx, rx) = watch::channel(Arc::new(Snapshot::default()));
    tokio::spawn(async move {
        let mut backoff = coffer_runtime::Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
        let mut feed = Feed::default();
        loop {
            let r = tokio::select! {
                _ = shutdown.cancelled() => return,
                r = follow(store.clone(), &tx, &mut feed) => r,
            };
            let delay = backoff.next_delay();
            if let Err(e) = r {
                tracing::warn!(error = %e, retry_ms = delay.as_millis() as u64, "Snapshot feed interrupted; reloading.");
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(delay) => {}
            }
        }
    });
    SnapshotHandle { rx }
}

/// What the feed keeps across reconnections to the store.
#[derive(Default)]
struct Feed {
    /// Highest change number seen; `None` before the first load.
    seen: Option<u64>,
    /// Change number of the last change to each credential, by name.
    credentials: HashMap<String, u64>,
}

impl Feed {
    /// [`Snapshot::credential_epochs`] for `servers`.
    fn epochs(&self, servers: &HashMap<String, McpServer>) -> HashMap<String, u64> {
        if self.credentials.is_empty() {
            return HashMap::new();
        }
        servers
            .values()
            .filter_map(|s| {
                let names = crate::credentials::referenced([&s.env, &s.headers]);
                let epoch = names.iter().filter_map(|n| self.credentials.get(n)).max()?;
                Some((s.name.clone(), *epoch))
            })
            .collect()
    }
}

async fn load(store: &mut StoreClients, seq: u64) -> Result<Snapshot, tonic::Status> {
    let servers = store.registry.list_servers(ListServersRequest {}).await?.into_inner().servers;
    let prefs = store
        .registry
        .list_preferences(ListPreferencesRequest { server: String::new() })
        .await?
        .into_inner()
        .preferences;
    let settings = store.settings.get_settings(GetSettingsRequest {}).await?.into_inner().values;
    let profiles = store.profiles.list_profiles(ListProfilesRequest {}).await?.into_inner().profiles;
    Ok(Snapshot {
        seq,
        servers: servers.into_iter().map(|s| (s.name.clone(), s)).collect(),
        prefs: prefs
            .into_iter()
            .filter_map(|p| {
                let kind = Kind::from_proto(p.kind())?;
                Some(((p.server, kind, p.name), p.enabled))
            })
            .collect(),
        settings,
        credential_epochs: HashMap::new(),
        // The store lists `default` too (as never written when it was not).
        profiles: crate::rest::profiles::by_name(&profiles),
        loaded: true,
    })
}

/// Loads the snapshot, then reloads it on every change. After a reconnection the changes
/// missed meanwhile are read first (from the last one seen; change rows are never pruned, so
/// the one at `head` comes): the snapshot loaded at `head` is published only then, with the
/// credential epochs those changes moved, so a write that waits for the snapshot to reach its
/// change number sees its effect on running upstreams too.
async fn follow(
    mut store: StoreClients,
    tx: &watch::Sender<Arc<Snapshot>>,
    feed: &mut Feed,
) -> Result<(), tonic::Status> {
    let publish = |mut snap: Snapshot, feed: &Feed| {
        snap.credential_epochs = feed.epochs(&snap.servers);
        tx.send_replace(Arc::new(snap));
    };
    let head = store.changes.head(HeadRequest {}).await?.into_inner().seq;
    let from = feed.seen.map_or(head, |seen| seen.min(head));
    feed.seen = Some(from);
    let mut stream = store.changes.watch_changes(WatchChangesRequest { from_seq: from }).await?.into_inner();
    let snap = load(&mut store, head).await?;
    let mut current = snap.seq;
    let mut held = None;
    if from < head {
        held = Some(snap);
    } else {
        publish(snap, feed);
    }
    while let Some(change) = stream.message().await? {
        feed.seen = feed.seen.max(Some(change.seq));
        if change.entity() == ChangeEntity::Credential {
            feed.credentials.insert(change.key, change.seq);
        }
        if change.seq >= current
            && let Some(snap) = held.take()
        {
            publish(snap, feed);
        }
        if change.seq > current {
            let snap = load(&mut store, change.seq).await?;
            current = snap.seq;
            publish(snap, feed);
        }
    }
    Err(tonic::Status::unavailable("change stream ended"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::credentials::encode_ref;

    fn server(name: &str, env: &[(&str, &str)], headers: &[(&str, &str)]) -> (String, McpServer) {
        let map = |kv: &[(&str, &str)]| kv.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        (
            name.to_owned(),
            McpServer { name: name.into(), version: 3, env: map(env), headers: map(headers), ..Default::default() },
        )
    }

    #[test]
    fn a_server_s_credential_epoch_is_its_newest_referenced_change() {
        let servers: HashMap<String, McpServer> = [
            server("both", &[("A", &encode_ref("a")), ("PLAIN", "x")], &[("Authorization", &encode_ref("b"))]),
            server("only-a", &[("A", &encode_ref("a"))], &[]),
            server("unchanged", &[("C", &encode_ref("c"))], &[]),
            server("plain", &[("A", "a")], &[]),
        ]
        .into_iter()
        .collect();
        let mut feed = Feed::default();
        assert!(feed.epochs(&servers).is_empty(), "no credential changed yet");
        feed.credentials.insert("a".into(), 7);
        feed.credentials.insert("b".into(), 12);
        let epochs = feed.epochs(&servers);
        assert_eq!(epochs, HashMap::from([("both".to_owned(), 12), ("only-a".to_owned(), 7)]));
        let snap = Snapshot { servers, credential_epochs: epochs, ..Default::default() };
        assert_eq!(snap.generation(&snap.servers["both"]), Generation { version: 3, credentials: 12 });
        assert_eq!(snap.generation(&snap.servers["plain"]), Generation { version: 3, credentials: 0 });
    }
}
