//! Assembling the edge's [`AppState`] from what a service is given: its home, its internal
//! identity ([`Internal`]: its token and the other services' addresses), the public token and
//! and agent tokens and port. [`crate::run`] builds the daemon's edge with it; the in-process
//! test harness (`coffer_tests::inproc`) builds the edge with it over a store served on a
//! loopback port.
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

use crate::{AppState, clients, mcp, snapshot, web_sessions};

/// What [`state`] builds the edge from.
pub struct Parts {
    /// `COFFER_HOME` (web sessions, the gateway's catalog cache, logs).
    pub home: CofferHome,
    /// The edge's internal identity: its token and the addresses of the store, retrieval, chat
    /// and the supervisor (all four must be present; unreachable ones fail only their calls).
    pub internal: Internal,
    /// The owner's token: every `/v1/*` route and `/mcp` accept it (`X-Coffer-Token`).
    pub public_token: SecretString,
    /// The agents' token (`agent-access/agent.json`): `/mcp` only.
    pub agent_token: SecretString,
    /// The public port, for the `Host`/`Origin` checks.
    pub port: u16,
    /// The supervisor's pid, as `/v1/status` reports it (0 when there is none).
    pub pid: u32,
    /// RFC 3339 start time, as `/v1/status` reports it.
    pub started_at: String,
    /// The daemon run (`<supervisor pid>-<started_at>`): web sessions of another run are dropped.
    pub run: String,
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
    let Parts { home, internal, public_token, agent_token, port, pid, started_at, run, shutdown } = parts;
    let clients::Clients { store, retrieval, sync, chat, llm, adapters, control } =
        clients::Clients::connect(&internal)?;
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
        agent_token,
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
        web_sessions: web_sessions::WebSessions::load(home.root().join(web_sessions::FILE_NAME), &run),
        login_codes: Default::default(),
        gateway,
        home,
        streams: Default::default(),
        sends: Default::default(),
        shutdown,
    }))
}
