//! REST routes under `/v1`: health, status, daemon control. Registry and log routes live in
//! sibling modules.
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use coffer_api::daemon::{DaemonInfo, Health, Restarting, ServiceRestart, ServiceStatus, Status, Stopping};
use coffer_proto::control::{RestartServiceRequest, StatusRequest, StopRequest};
use serde_json::{Value, json};

use crate::error::ApiError;
use crate::state::AppState;

pub mod agent_sessions;
pub mod backup;
pub mod channels;
pub mod chat;
pub mod credentials;
pub mod events;
pub mod idempotency;
pub mod import;
pub mod knowledge;
pub mod llm;
pub mod logs;
pub mod openapi;
pub(crate) mod owned_credentials;
pub mod profiles;
pub mod registry;
pub mod server_auth;
pub mod servers;
pub mod settings;
pub mod sync;
pub mod tools;

/// All `/v1` routes.
pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/v1/health", get(health))
        .route("/v1/status", get(status))
        .route("/v1/daemon/stop", post(stop))
        .route("/v1/daemon/services/{name}/restart", post(restart_service))
        .merge(servers::routes())
        .merge(server_auth::routes())
        .merge(credentials::routes())
        .merge(import::routes())
        .merge(logs::routes())
        .merge(backup::routes())
        .merge(openapi::router())
        .merge(settings::routes())
        .merge(tools::routes())
        .merge(knowledge::routes())
        .merge(sync::routes())
        .merge(chat::routes())
        .merge(events::routes())
        .merge(agent_sessions::routes())
        .merge(llm::routes())
        .merge(channels::routes())
        .merge(profiles::routes())
        .merge(registry::routes())
}

/// `GET /v1/health` → `{status, pid, version, started_at}`. Touches no other service; `pid` is
/// the supervisor's (the pid in `daemon.json`).
async fn health(State(st): State<Arc<AppState>>) -> Json<Health> {
    Json(Health {
        status: "ok".into(),
        pid: st.pid,
        version: coffer_runtime::VERSION.into(),
        started_at: st.started_at.clone(),
    })
}

/// `GET /v1/status` → [`Status`]: `{daemon, services:[…], upstreams:[…], sandbox, sync}`
/// (`sandbox`: the vault sandbox, see [`crate::mcp::Gateway::sandbox_status`]; `sync`:
/// `/v1/sync/status`'s body, `null` while coffer-retrieval does not answer).
async fn status(State(st): State<Arc<AppState>>) -> Result<Json<Status>, ApiError> {
    let r = st.control.clone().status(StatusRequest {}).await?.into_inner();
    // A retrieval service the supervisor reports stopped or failed has no process to answer:
    // `sync` is null at once instead of after the channel's keep-alive gives up (~3 s).
    let retrieval_down =
        r.services.iter().any(|s| s.name == "retrieval" && matches!(s.state.as_str(), "stopped" | "failed"));
    let services = r
        .services
        .into_iter()
        .map(|s| ServiceStatus {
            name: s.name,
            pid: s.pid,
            state: s.state,
            uptime_s: s.uptime_s,
            restarts: s.restarts,
            last_error: (!s.last_error.is_empty()).then_some(s.last_error),
            on_demand: s.on_demand,
        })
        .collect();
    let mut upstreams = st.gateway.upstream_status();
    server_auth::annotate(&st, &mut upstreams).await;
    Ok(Json(Status {
        daemon: DaemonInfo { pid: r.pid, version: r.version, started_at: r.started_at, port: r.port },
        services,
        upstreams,
        sandbox: st.gateway.sandbox_status(),
        sync: if retrieval_down { None } else { sync::current_status(&st).await.as_ref().map(sync::status_view) },
        sessions: st.gateway.session_status(),
    }))
}

/// `POST /v1/daemon/stop` → 202; the daemon then shuts down in order.
async fn stop(State(st): State<Arc<AppState>>) -> Result<(axum::http::StatusCode, Json<Stopping>), ApiError> {
    st.control.clone().stop(StopRequest {}).await?;
    Ok((axum::http::StatusCode::ACCEPTED, Json(Stopping { stopping: true })))
}

/// `POST /v1/daemon/services/{name}/restart` → the service's status after the restart (200), or
/// 202 `{"restarting":"gateway"}` for the gateway itself, which restarts right after answering.
async fn restart_service(
    State(st): State<Arc<AppState>>,
    Path(name): Path<String>,
) -> Result<(axum::http::StatusCode, Json<Value>), ApiError> {
    if name == "gateway" {
        // This process serves the request: answer first, then ask the supervisor. Its SIGTERM
        // makes the edge drain (this response included) before it stops; the listener stays
        // with the supervisor, so clients only see a short gap.
        let mut control = st.control.clone();
        tokio::spawn(async move {
            if let Err(e) = control.restart_service(RestartServiceRequest { name: "gateway".into() }).await {
                tracing::debug!(error = %e, "Gateway restart request ended with the gateway (expected).");
            }
        });
        return Ok((axum::http::StatusCode::ACCEPTED, Json(json!(Restarting { restarting: "gateway".into() }))));
    }
    let s = st
        .control
        .clone()
        .restart_service(RestartServiceRequest { name })
        .await?
        .into_inner()
        .service
        .unwrap_or_default();
    Ok((
        axum::http::StatusCode::OK,
        Json(json!(ServiceRestart { name: s.name, pid: s.pid, state: s.state, restarts: s.restarts })),
    ))
}
