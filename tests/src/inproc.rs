//! The in-process edge: REST behaviour tested without starting a process. [`Edge::start`] serves
//! the real `coffer-store` library ([`coffer_store::run`]: its migrations, writer thread and gRPC
//! services) on one loopback port and the edge's router ([`coffer_gateway::router`] over
//! [`coffer_gateway::assemble::state`], with every middleware layer) on another, both on the
//! test's own Tokio runtime, over a temporary `COFFER_HOME`. Calls go through an ordinary
//! [`Api`], exactly as to a daemon.
//!
//! What is not there: the supervisor, coffer-chat and coffer-retrieval (their clients point at a
//! closed port, so the routes that need them answer `503 UNAVAILABLE`), log files (tracing is
//! not initialised) and the edge socket. A test that needs those starts a daemon
//! ([`crate::TestHome::start_daemon`], `tests/e2e`); the rest belongs here (`tests/inproc`, the
//! `fast` nextest profile).
//!
//! Shutdown: dropping the [`Edge`] cancels both servers; [`Edge::stop`] also waits for the store
//! to checkpoint its database.
use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context;
use coffer_gateway::assemble::{Parts, state};
use coffer_runtime::home::CofferHome;
use coffer_runtime::identity::{Identity, PeerDigests};
use coffer_runtime::limits::{Connections, Limits, Listener, serve_http};
use coffer_runtime::service::{Internal, ServiceCtx};
use coffer_runtime::token::random_token;
use secrecy::ExposeSecret;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::Api;

/// How long [`Edge::start`] waits for the edge's first policy snapshot from the store.
pub const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(20);

/// A store and an edge on the test's runtime, on a temporary home (see the module docs).
pub struct Edge {
    api: Api,
    home: CofferHome,
    shutdown: CancellationToken,
    store: Option<JoinHandle<anyhow::Result<()>>>,
    edge: Option<JoinHandle<()>>,
    snapshot: coffer_gateway::snapshot::SnapshotHandle,
    // Last: removed after both servers were told to stop.
    _temp: tempfile::TempDir,
}

impl Edge {
    /// Starts the store and the edge; returns once the edge has loaded its first policy
    /// snapshot (as the daemon's edge does before it reports healthy).
    ///
    /// # Errors
    /// When a loopback port cannot be bound, the store cannot open its database, or the
    /// snapshot does not load within [`SNAPSHOT_TIMEOUT`].
    pub async fn start() -> anyhow::Result<Self> {
        let temp = tempfile::Builder::new().prefix("coffer-inproc-").tempdir()?;
        let home = CofferHome::at(temp.path().join("home"));
        home.ensure()?;
        let shutdown = CancellationToken::new();

        // The store accepts the edge's made-up internal token, as the supervisor would arrange.
        let gateway_token = random_token();
        let store_listener = TcpListener::bind("127.0.0.1:0").await?;
        let store_addr = store_listener.local_addr()?.to_string();
        let store_internal = Internal::new(
            random_token(),
            PeerDigests::from_tokens([(Identity::Gateway, &gateway_token)]),
            BTreeMap::new(),
        );
        let store = tokio::spawn(coffer_store::run(ServiceCtx {
            home: home.clone(),
            identity: Identity::Store,
            listener: store_listener,
            internal: store_internal,
            shutdown: shutdown.clone(),
        }));

        // Chat, retrieval and the supervisor are not running: their address is a closed port.
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0")?;
            l.local_addr()?.to_string()
        };
        let addrs = BTreeMap::from([
            (Identity::Store, store_addr),
            (Identity::Retrieval, closed.clone()),
            (Identity::Chat, closed.clone()),
            (Identity::Supervisor, closed),
        ]);
        let public = TcpListener::bind("127.0.0.1:0").await?;
        let port = public.local_addr()?.port();
        let public_token = random_token();
        let token = public_token.expose_secret().to_owned();
        let st = state(Parts {
            home: home.clone(),
            internal: Internal::new(gateway_token, PeerDigests::default(), addrs),
            public_token,
            agent_token: random_token(),
            port,
            pid: std::process::id(),
            started_at: coffer_runtime::now_rfc3339(),
            run: format!("inproc-{}", std::process::id()),
            shutdown: shutdown.clone(),
        })?;
        if !st.snapshot.wait_for(0, SNAPSHOT_TIMEOUT).await {
            shutdown.cancel();
            let store_result = match tokio::time::timeout(Duration::from_secs(5), store).await {
                Ok(Ok(Err(e))) => format!(": the store failed: {e:#}"),
                _ => String::new(),
            };
            anyhow::bail!("the in-process edge loaded no policy snapshot within {SNAPSHOT_TIMEOUT:?}{store_result}");
        }
        let snapshot = st.snapshot.clone();
        let app = coffer_gateway::router(st);
        let conns = Connections::new("edge", Limits::EDGE);
        let edge =
            tokio::spawn(serve_http(Listener::Tcp(public), conns, app, shutdown.clone(), coffer_gateway::DRAIN_GRACE));
        Ok(Self {
            api: Api::new(port, token),
            home,
            shutdown,
            store: Some(store),
            edge: Some(edge),
            snapshot,
            _temp: temp,
        })
    }

    /// A client for the edge (the public token, `127.0.0.1:<port>`).
    pub fn api(&self) -> &Api {
        &self.api
    }

    /// The edge's policy snapshot (what its MCP sessions read: servers, preferences, profiles).
    pub fn snapshot(&self) -> &coffer_gateway::snapshot::SnapshotHandle {
        &self.snapshot
    }

    /// The temporary `COFFER_HOME`.
    pub fn home(&self) -> &CofferHome {
        &self.home
    }

    /// Stops the edge and the store and waits for both (the store checkpoints its database).
    ///
    /// # Errors
    /// When the store ended with an error.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        self.shutdown.cancel();
        if let Some(edge) = self.edge.take() {
            let _ = edge.await;
        }
        if let Some(store) = self.store.take() {
            store.await.context("the store task panicked")??;
        }
        Ok(())
    }
}

impl Drop for Edge {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}
