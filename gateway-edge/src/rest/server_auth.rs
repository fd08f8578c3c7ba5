//! `/v1/mcp/servers/{name}/auth`: an HTTP server's OAuth sign-in (MCP 2025-11-25
//! basic/authorization), for `coffer mcp auth` and the console's sign-in button. `POST` starts
//! a browser sign-in and answers with the authorization URL to open; `GET` shows where it
//! stands (`?wait_s=` waits for a pending sign-in to end); `DELETE` signs out. The flow itself
//! is `mcp::upstream::http::oauth`. No answer carries a token.
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use coffer_api::servers::{AuthState, ServerAuth, SignInFlow, SignInRequest, SignInState};
use coffer_proto::store::{GetServerRequest, McpServer, Transport};
use secrecy::SecretString;
use serde::Deserialize;
use serde_json::json;

use crate::error::{ApiError, Code, JsonBody};
use crate::mcp::upstream::http::oauth::{self, OAuth, OAuthError, flow};
use crate::state::AppState;

/// Longest `wait_s` of `GET …/auth` (seconds).
pub const MAX_WAIT_S: u64 = 60;

pub fn routes() -> Router<Arc<AppState>> {
    Router::new().route("/v1/mcp/servers/{name}/auth", get(show).post(start).delete(sign_out))
}

/// The registered HTTP server `name`.
async fn http_server(st: &AppState, name: String) -> Result<McpServer, ApiError> {
    let s = st.store.registry.clone().get_server(GetServerRequest { name }).await?.into_inner();
    if s.transport() == Transport::Stdio {
        return Err(ApiError::invalid(format!(
            "server {} runs on stdio; OAuth sign-in is for HTTP servers (--url)",
            s.name
        ))
        .with_details(json!({"field": "transport"})));
    }
    Ok(s)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WaitQuery {
    #[serde(default)]
    wait_s: Option<u64>,
}

/// `GET /v1/mcp/servers/{name}/auth[?wait_s=N]` → [`ServerAuth`]. With `wait_s` (at most
/// [`MAX_WAIT_S`]) a pending sign-in is waited for until it ends or the time is up.
async fn show(
    State(st): State<Arc<AppState>>,
    Path(name): Path<String>,
    q: Result<Query<WaitQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<ServerAuth>, ApiError> {
    let Query(q) = q.map_err(|_| ApiError::invalid(format!("wait_s must be an integer 0-{MAX_WAIT_S}")))?;
    let wait = q.wait_s.unwrap_or(0);
    if wait > MAX_WAIT_S {
        return Err(ApiError::invalid(format!("wait_s must be 0-{MAX_WAIT_S}, not {wait}"))
            .with_details(json!({"field": "wait_s"})));
    }
    let s = http_server(&st, name).await?;
    Ok(Json(view(&st.gateway.shared.oauth, &s.name, Duration::from_secs(wait)).await))
}

/// `POST /v1/mcp/servers/{name}/auth` with [`SignInRequest`] → 200 [`ServerAuth`] whose `flow`
/// is pending with the `authorization_url` to open. Discovery or registration failures answer
/// 502 `UPSTREAM_UNAVAILABLE` naming the step.
async fn start(
    State(st): State<Arc<AppState>>,
    Path(name): Path<String>,
    body: Result<JsonBody<SignInRequest>, ApiError>,
) -> Result<Json<ServerAuth>, ApiError> {
    let JsonBody(req) = body?;
    let timeout = match req.timeout_s {
        None => None,
        Some(t) if (1..=flow::MAX_TIMEOUT.as_secs()).contains(&t) => Some(Duration::from_secs(t)),
        Some(t) => {
            return Err(ApiError::invalid(format!("timeout_s must be 1-{}, not {t}", flow::MAX_TIMEOUT.as_secs()))
                .with_details(json!({"field": "timeout_s"})));
        }
    };
    for (field, v, max) in [
        ("client_id", &req.client_id, 2048),
        ("client_secret", &req.client_secret, 4096),
        ("client_metadata_url", &req.client_metadata_url, 2048),
        ("scope", &req.scope, 4096),
    ] {
        if let Some(v) = v
            && (v.trim().is_empty() || v.len() > max || v.chars().any(char::is_control))
        {
            return Err(ApiError::invalid(format!("{field} must be 1-{max} bytes without control characters"))
                .with_details(json!({"field": field})));
        }
    }
    let s = http_server(&st, name).await?;
    let opts = flow::SignInOptions {
        client_id: req.client_id,
        client_secret: req.client_secret.map(SecretString::from),
        client_metadata_url: req.client_metadata_url,
        scope: req.scope,
        timeout,
    };
    let oauth = &st.gateway.shared.oauth;
    oauth.start_sign_in(&s.name, &s.url, opts).await.map_err(|e| {
        let code = match e {
            OAuthError::Store(_) => Code::ServiceUnavailable,
            _ => Code::UpstreamUnavailable,
        };
        ApiError::new(code, format!("sign-in to {} cannot start: {e}", s.name))
    })?;
    Ok(Json(view(oauth, &s.name, Duration::ZERO).await))
}

/// `DELETE /v1/mcp/servers/{name}/auth` → 204: the grant is deleted (a sign-in in progress
/// stops). The server then needs a new sign-in.
async fn sign_out(State(st): State<Arc<AppState>>, Path(name): Path<String>) -> Result<StatusCode, ApiError> {
    let s = http_server(&st, name).await?;
    let oauth = &st.gateway.shared.oauth;
    oauth.flows.cancel(&s.name);
    oauth
        .server(&s.name)
        .sign_out()
        .await
        .map_err(|e| ApiError::new(Code::ServiceUnavailable, format!("cannot sign out of {}: {e}", s.name)))?;
    Ok(StatusCode::NO_CONTENT)
}

/// `server`'s OAuth state and latest sign-in (waiting at most `wait` for a pending one).
pub async fn view(oauth: &Arc<OAuth>, server: &str, wait: Duration) -> ServerAuth {
    let flow = oauth.flows.state(server, wait).await.map(flow_view);
    let mut out = ServerAuth {
        state: AuthState::None,
        why: None,
        command: None,
        issuer: None,
        scope: None,
        expires_at: None,
        refreshable: false,
        flow,
    };
    match oauth.server(server).status().await {
        Ok(oauth::AuthState::None) => {}
        Ok(oauth::AuthState::SignedIn { issuer, scope, expires_at_ms, refreshable }) => {
            out.state = AuthState::SignedIn;
            out.issuer = Some(issuer);
            out.scope = scope;
            out.expires_at = expires_at_ms.map(|ms| coffer_runtime::rfc3339_from_unix_ms(ms as i64));
            out.refreshable = refreshable;
        }
        Ok(oauth::AuthState::NeedsSignIn { why, command }) => {
            out.state = AuthState::NeedsSignIn;
            out.why = Some(why);
            out.command = Some(command);
        }
        Err(e) => out.why = Some(e.to_string()),
    }
    out
}

fn flow_view(s: flow::FlowState) -> SignInFlow {
    match s {
        flow::FlowState::Pending { authorization_url, redirect_uri, expires_at_ms } => SignInFlow {
            state: SignInState::Pending,
            authorization_url: Some(authorization_url),
            redirect_uri: Some(redirect_uri),
            expires_at: Some(coffer_runtime::rfc3339_from_unix_ms(expires_at_ms as i64)),
            error: None,
        },
        flow::FlowState::SignedIn => SignInFlow {
            state: SignInState::SignedIn,
            authorization_url: None,
            redirect_uri: None,
            expires_at: None,
            error: None,
        },
        flow::FlowState::Failed { error } => SignInFlow {
            state: SignInState::Failed,
            authorization_url: None,
            redirect_uri: None,
            expires_at: None,
            error: Some(error),
        },
    }
}

/// `UpstreamStatus.auth` for the HTTP servers among `upstreams` that have a grant or a sign-in;
/// a server that needs sign-in is `unhealthy` with that as its error when no other stands.
pub async fn annotate(st: &AppState, upstreams: &mut [coffer_api::servers::UpstreamStatus]) {
    let oauth = &st.gateway.shared.oauth;
    for u in upstreams.iter_mut().filter(|u| u.transport.is_remote()) {
        let v = view(oauth, &u.name, Duration::ZERO).await;
        if v.state == AuthState::None && v.flow.is_none() {
            continue;
        }
        if v.state == AuthState::NeedsSignIn && u.enabled {
            u.state = coffer_api::servers::UpstreamState::Unhealthy;
            if u.last_error.is_none() {
                u.last_error = Some(format!(
                    "needs sign-in ({}): run `{}`",
                    v.why.as_deref().unwrap_or("no usable OAuth grant"),
                    oauth::sign_in_command(&u.name)
                ));
            }
        }
        u.auth = Some(v);
    }
}
