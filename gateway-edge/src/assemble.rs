//! Assembling the edge's [`AppState`] from what a service is given: its home, its internal
//! identity ([`Internal`]: its token and the other services' addresses), the public token and
//! port. The in-process test harness (`coffer_tests::inproc`) builds the edge with it over a
//! store served on a loopback port; [`crate::run`] builds the same parts inline (to be folded
//! onto [`state`] once the MCP restructuring lands: the parts are the same).
//!
//! Every client is lazily connected: a service that is not running (chat, retrieval, the
//! supervisor in the harness) fails the calls that need it with `503`, as in a daemon where it
//! is down.

use std::sync::Arc;

use coffer_runtime::home::CofferHome;
use coffer_runtime::identity::Identity;
use coffer_runtime::service::Internal;
use secrecy::SecretString;
use tokio_util::sync::CancellationToken;

use crate::{AppState, chat, llm, mcp, rest, retrieval, snapshot, store, web_sessions};

/// What [`state`] builds the edge from.
pub struct Parts {
    /// `COFFER_HOME` (web sessions, the gateway's catalog cache, logs).
    pub home: CofferHome,
    /// The edge's internal identity: its token and the addresses of the store, retrieval, chat
    /// and the supervisor (all four must be present; unreachable ones fail only their calls).
    pub internal: Internal,
    /// The token `/v1/*` and `/mcp` accept (`X-Coffer-Token`).
    pub public_token: SecretString,
    /// The public port, for the `Host`/`Origin` checks.
    pub port: u16,
    /// The supervisor's pid, as `/v1/status` reports it (0 when there is none).
    pub pid: u32,
    /// RFC 3339 start time, as `/v1/status` reports it.
    pub started_at: String,
    /// Cancelled to stop the edge's tasks (snapshot feed, gateway reaper, SSE responses).
    pub shutdown: CancellationToken,
}

/// The edge's state over `parts`, with its background tasks (policy snapshot feed, invocation
/// writer thread, gateway tasks) started. Serve it with [`crate::router`]. Must be called
/// inside a Tokio runtime. The snapshot loads asynchronously: wait on
/// `state.snapshot.wait_for(0, …)` before serving calls that depend on the registry.
///
/// # Errors
/// When an address in `parts.internal` is missing or unusable, or the invocation writer thread
/// cannot be started.
pub fn state(parts: Parts) -> anyhow::Result<Arc<AppState>> {
    let Parts { home, internal, public_token, port, pid, started_at, shutdown } = parts;
    let store = store::StoreClients::new(internal.channel(Identity::Store)?);
    let retrieval = retrieval::client(internal.addr(Identity::Retrieval)?, internal.token())?;
    let chat = chat::client(internal.addr(Identity::Chat)?, internal.token())?;
    let sync = rest::sync::client(internal.addr(Identity::Retrieval)?, internal.token())?;
    let llm = llm::client(internal.addr(Identity::Chat)?, internal.token())?;
    let adapters =
        coffer_proto::channel::channel_adapters_client::ChannelAdaptersClient::new(internal.channel(Identity::Chat)?);
    let control = coffer_proto::control::control_client::ControlClient::new(internal.channel(Identity::Supervisor)?);
    let snapshot = snapshot::start(store.clone(), shutdown.clone());
    let recorder =
        mcp::invocations::Recorder::spawn(internal.addr(Identity::Store)?.to_owned(), internal.token().clone())?;
    let credentials = Arc::new(mcp::resolver::StoreResolver::new(store.credentials.clone()));
    let gateway = mcp::Gateway::new(
        home.clone(),
        credentials,
        snapshot.clone(),
        recorder,
        retrieval.clone(),
        llm.clone(),
        shutdown.clone(),
    );
    Ok(Arc::new(AppState {
        public_token,
        port,
        pid,
        started_at,
        store,
        retrieval,
        sync,
        chat,
        llm,
        adapters,
        control,
        snapshot,
        web_sessions: web_sessions::WebSessions::load(home.root().join(web_sessions::FILE_NAME)),
        login_codes: Default::default(),
        gateway,
        home,
        shutdown,
    }))
}
