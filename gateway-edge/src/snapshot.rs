//! The gateway's in-memory snapshot of the MCP server registry, capability preferences and
//! settings, kept fresh from the store's change stream. Policy checks read it without any
//! store round trip; a REST mutation waits until the snapshot holds its change
//! ([`SnapshotHandle::wait_for`]) so policy reads its own writes.
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use coffer_proto::store::store_client::StoreClient;
use coffer_proto::store::{
    GetSettingsRequest, HeadRequest, ListPreferencesRequest, ListServersRequest, McpServer, WatchChangesRequest,
};
use coffer_runtime::grpc::AuthChannel;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

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
    /// False until the first load from the store succeeded.
    pub loaded: bool,
}

impl Snapshot {
    /// Whether a capability may be used: its server is registered and enabled (or it is a
    /// built-in `coffer` capability) and it has no `enabled = false` preference.
    pub fn capability_enabled(&self, server: &str, kind: Kind, name: &str) -> bool {
        let server_ok = server == "coffer" || self.servers.get(server).is_some_and(|s| s.enabled);
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
pub fn start(store: StoreClient<AuthChannel>, shutdown: CancellationToken) -> SnapshotHandle {
    let (tx, rx) = watch::channel(Arc::new(Snapshot::default()));
    tokio::spawn(async move {
        let mut delay = Duration::from_millis(50);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                r = follow(store.clone(), &tx) => {
                    if let Err(e) = r {
                        tracing::warn!(error = %e, retry_ms = delay.as_millis() as u64, "Snapshot feed interrupted; reloading.");
                    }
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(delay) => {}
            }
            delay = (delay * 2).min(Duration::from_secs(2));
        }
    });
    SnapshotHandle { rx }
}

async fn load(store: &mut StoreClient<AuthChannel>, seq: u64) -> Result<Snapshot, tonic::Status> {
    let servers = store.list_servers(ListServersRequest {}).await?.into_inner().servers;
    let prefs =
        store.list_preferences(ListPreferencesRequest { server: String::new() }).await?.into_inner().preferences;
    let settings = store.get_settings(GetSettingsRequest {}).await?.into_inner().values;
    Ok(Snapshot {
        seq,
        servers: servers.into_iter().map(|s| (s.name.clone(), s)).collect(),
        prefs: prefs.into_iter().filter_map(|p| Some(((p.server, Kind::parse(&p.kind)?, p.name), p.enabled))).collect(),
        settings,
        loaded: true,
    })
}

async fn follow(mut store: StoreClient<AuthChannel>, tx: &watch::Sender<Arc<Snapshot>>) -> Result<(), tonic::Status> {
    let head = store.head(HeadRequest {}).await?.into_inner().seq;
    tx.send_replace(Arc::new(load(&mut store, head).await?));
    let mut stream = store.watch_changes(WatchChangesRequest { from_seq: head }).await?.into_inner();
    while let Some(change) = stream.message().await? {
        tx.send_replace(Arc::new(load(&mut store, change.seq).await?));
    }
    Err(tonic::Status::unavailable("change stream ended"))
}
