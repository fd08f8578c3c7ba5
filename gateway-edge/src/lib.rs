//! The edge (`coffer-gateway`): axum on the public listener inherited from the supervisor —
//! `/mcp` (MCP Streamable HTTP, the gateway), `/v1/*` (REST), `/ui` (the web console, [`ui`]) — plus, on its
//! internal gRPC listener, the `ToolBroker` service ([`grpc`], authorized by [`authz::POLICY`])
//! and the health check.
//!
//! Invariants: `GET /v1/health` touches no other service; every other route needs the token or
//! a web-session cookie; `Host` must be loopback and `Origin` (when present) our own; every
//! response carries `X-Coffer-Trace`.

pub mod assemble;
pub mod authz;
pub mod clients;
pub mod credentials;
pub mod error;
pub mod grpc;
pub mod mcp;
pub mod middleware;
pub mod reach;
pub mod registry;
pub mod rest;
pub mod snapshot;
pub mod state;
pub mod ui;
pub mod web_sessions;

// The service clients' former paths, still used by `rest/` (moving to `crate::clients::*` with
// the typed REST contract).
pub use clients::{chat, llm, retrieval, store};

use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use coffer_runtime::env as cenv;
use coffer_runtime::limits::{Connections, Limits, Listener, serve_http};
use coffer_runtime::service::ServiceCtx;
use secrecy::SecretString;
use tokio_util::sync::CancellationToken;

/// Body limit of `/v1/*` and `/ui` (bytes).
pub const REST_BODY_LIMIT: usize = 2 * 1024 * 1024;
pub use mcp::downstream::MCP_BODY_LIMIT;
/// How long connections may stay open at shutdown once every MCP session has ended; the
/// supervisor sends SIGKILL 5 s after SIGTERM.
pub const DRAIN_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// Builds the full router over `state` (used by `run` and by in-process tests).
pub fn router(state: Arc<AppState>) -> Router {
    let rest = rest::routes().layer(DefaultBodyLimit::max(REST_BODY_LIMIT));
    // The MCP transports get the gateway only, not the whole state.
    let mcp = mcp::downstream::http::routes(state.gateway.clone()).layer(DefaultBodyLimit::max(MCP_BODY_LIMIT));
    Router::new()
        .merge(rest)
        .merge(mcp)
        .merge(ui::routes().layer(DefaultBodyLimit::max(REST_BODY_LIMIT)))
        .fallback(middleware::not_found)
        .method_not_allowed_fallback(middleware::method_not_allowed)
        .layer(axum::middleware::from_fn(middleware::body_limit))
        .layer(axum::middleware::from_fn_with_state(state.clone(), middleware::auth))
        .layer(axum::middleware::from_fn_with_state(state.clone(), middleware::host_origin))
        .layer(axum::middleware::from_fn(ui::security_headers))
        .layer(axum::middleware::from_fn(middleware::trace))
        .with_state(state)
}

pub use state::AppState;

/// Binds `ui.bind` when it is set: `None` when it is empty (the default: loopback only) or
/// cannot be bound (logged as a warning naming the address and the error; `coffer doctor` shows
/// the setting, the log says why it is not listening).
async fn bind_listener(st: &Arc<AppState>) -> Option<tokio::net::TcpListener> {
    let key = coffer_types::settings::UI_BIND.key;
    let stored = st.gateway.shared.snapshot.current().settings.get(key).cloned();
    let value = coffer_types::settings::UI_BIND.text_or_default(stored.as_deref());
    let addr = match coffer_types::remote::parse_bind(&value) {
        Ok(Some(addr)) => addr,
        Ok(None) => return None,
        Err(e) => {
            tracing::warn!(error = %e, "Not listening beyond loopback: ui.bind is not usable.");
            return None;
        }
    };
    match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => {
            tracing::info!(%addr, "Edge also listening beyond loopback (ui.bind).");
            Some(l)
        }
        Err(e) => {
            tracing::warn!(%addr, error = %e, "Cannot listen on ui.bind; the console answers on loopback only.");
            None
        }
    }
}

fn env(var: &'static str) -> anyhow::Result<String> {
    std::env::var(var).map_err(|_| anyhow::anyhow!("{var} is not set: this binary is started by coffer-daemon"))
}

/// Runs the edge until `ctx.shutdown`: stops accepting, drains in-flight requests (bounded), ends
/// every MCP session (terminating upstream children), then returns. `ctx.listener` is its
/// internal gRPC listener; the public one and the edge socket are its own inherited extras.
///
/// # Errors
/// When the inherited listeners or environment are unusable.
pub async fn run(ctx: ServiceCtx) -> anyhow::Result<()> {
    let ServiceCtx { home, listener: grpc, internal, shutdown, .. } = ctx;
    // A relay on the request path: ask for short time slices (on this, the runtime's only
    // thread; upstream children inherit it). See `coffer_runtime::sched`.
    let slice = coffer_runtime::sched::request_short_slice();
    tracing::debug!(?slice, "Scheduler time-slice request.");
    let public = coffer_runtime::listen::inherited(cenv::PUBLIC_FD)?;
    // The same edge on `COFFER_HOME/gateway.sock`, when the supervisor bound it.
    let socket = coffer_runtime::listen::inherited_unix(cenv::SOCKET_FD)?;
    let public_token = SecretString::from(env(cenv::PUBLIC_TOKEN)?);
    let agent_token = SecretString::from(env(cenv::AGENT_TOKEN)?);
    let port: u16 = env(cenv::PUBLIC_PORT)?.parse()?;
    let pid: u32 = std::env::var(cenv::SUPERVISOR_PID).ok().and_then(|p| p.parse().ok()).unwrap_or(0);
    let started_at = std::env::var(cenv::STARTED_AT).unwrap_or_else(|_| coffer_runtime::now_rfc3339());
    // The daemon run (the supervisor's pid and start time): web sessions live no longer than it.
    let run = format!("{pid}-{started_at}");
    let state = assemble::state(assemble::Parts {
        home,
        internal: internal.clone(),
        public_token,
        agent_token,
        port,
        pid,
        started_at,
        run,
        shutdown: shutdown.clone(),
    })?;
    let gateway = state.gateway.clone();
    let snapshot_ready = state.snapshot.clone();

    // Report healthy (and so let the supervisor write daemon.json) only once the policy
    // snapshot has loaded: a call arriving earlier would see an empty registry.
    if !snapshot_ready.wait_for(0, std::time::Duration::from_secs(50)).await {
        tracing::warn!("Registry snapshot not loaded after 50 s; serving anyway.");
    }
    let grpc_task = tokio::spawn(coffer_runtime::grpc::serve_with_health(
        grpc,
        internal.auth_layer(authz::POLICY),
        grpc::routes(gateway.broker.clone()),
        shutdown.clone(),
    ));
    tracing::info!(port, "Edge listening.");
    let state_bind = state.clone();
    let app = router(state);
    // On shutdown, end every MCP session first: their GET streams close, so the graceful drain
    // does not wait on long-lived SSE connections, and upstream children are terminated. Both
    // listeners keep accepting until then and stop at the same moment, so a client that
    // reconnects meanwhile finds the same edge on either (a shim whose socket stopped accepting
    // while the port still answered would wait on an upgrade nobody reads).
    let sessions_closed = CancellationToken::new();
    {
        let (drain, gw, closed) = (shutdown.clone(), gateway.clone(), sessions_closed.clone());
        tokio::spawn(async move {
            drain.cancelled().await;
            gw.close_all().await;
            closed.cancel();
        });
    }
    // Both listeners share one connection cap and its timeouts (`coffer_runtime::limits`):
    // a flood on the port cannot take the descriptors the socket needs, and the owner's
    // connections on the socket (told by uid) are never the ones closed to make room. Nagle is
    // off on TCP: small request/response exchanges on loopback.
    let conns = Connections::new("edge", Limits::EDGE.with_env_cap().with_env_head_timeout());
    tracing::info!(
        max_connections = conns.limits().max_connections,
        head_timeout_ms = conns.limits().header_read_timeout.as_millis() as u64,
        "Edge connection cap."
    );
    // Connections still open after the sessions ended (a request never finished, e.g. a client
    // that stopped sending halfway) get DRAIN_GRACE, then are dropped: a stop does not wait for
    // the supervisor's SIGKILL.
    let tcp = serve_http(Listener::Tcp(public), conns.clone(), app.clone(), sessions_closed.clone(), DRAIN_GRACE);
    // The opt-in listener beyond loopback (`ui.bind`), read once at start. Its requests carry
    // `reach::BindListener`: only `ui.allowed_hosts` are answered there (see `reach`).
    let bind = bind_listener(&state_bind).await;
    let bound = bind.map(|l| {
        let app = app.clone().layer(axum::Extension(reach::BindListener));
        tokio::spawn(serve_http(Listener::Tcp(l), conns.clone(), app, sessions_closed.clone(), DRAIN_GRACE))
    });
    match socket {
        // Every request is checked the same way on both (the router's layers); the socket only
        // skips the TCP/IP stack.
        Some(socket) => {
            let unix = serve_http(Listener::Unix(socket), conns, app, sessions_closed.clone(), DRAIN_GRACE);
            tokio::join!(tcp, unix);
        }
        None => tcp.await,
    }
    if let Some(task) = bound {
        let _ = task.await;
    }
    gateway.close_all().await;
    gateway.catalog_saved().await;
    let _ = grpc_task.await;
    Ok(())
}
