//! The browser sign-in (OAuth 2.1 §4.1 authorization code grant with PKCE, for a native app as
//! RFC 8252 §7.3 says: a loopback redirect URI on a port chosen for the one flow).
//!
//! [`OAuth::start_sign_in`] discovers the server's authorization server, gets a client (the
//! id the user gave, a Client ID Metadata Document URL the server accepts, or RFC 7591
//! registration), binds `127.0.0.1:0`, and returns the authorization URL for the user's
//! browser. The listener answers one redirect: its `state` must match (compared in constant
//! time; anything else ends the flow, nothing stored), its `code` is exchanged with the PKCE
//! verifier and the `resource`, and the grant goes to the credential store. Then, or after the
//! flow's timeout, or when a new flow for the same server starts, the listener closes. Its
//! requests must name it as `Host` (no DNS rebinding), and its answers are plain text that
//! never echo what the request carried.
//!
//! Who ends what: the listener task belongs to its [`Flow`] (aborted when the flow is dropped:
//! replaced, its server removed, the gateway shut down) and ends itself on the first redirect
//! or its deadline.
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use reqwest::Url;
use secrecy::{ExposeSecret, SecretString};
use serde::Serialize;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use super::client::{self, Client, ClientAuth, Pkce, TokenError};
use super::discovery::{self, Challenge, shown};
use super::{Grant, OAuth, OAuthError, ServerAuth, now_ms};

/// How long a sign-in waits for the browser's redirect by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
/// Longest sign-in wait a caller may ask for.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(1800);
/// Longest wait for the unauthenticated probe of the MCP endpoint.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);
/// The redirect path on the loopback listener.
pub const CALLBACK_PATH: &str = "/callback";

/// What the user may say about the client and scopes (`coffer mcp auth` flags).
#[derive(Default)]
pub struct SignInOptions {
    /// A client id registered by hand (skips registration).
    pub client_id: Option<String>,
    /// Its secret, for a confidential client (sent with `client_secret_post`).
    pub client_secret: Option<SecretString>,
    /// An `https://` URL of Coffer's Client ID Metadata Document, used as the client id when
    /// the authorization server supports such documents.
    pub client_metadata_url: Option<String>,
    /// Scopes to ask for instead of those the server names (space-separated).
    pub scope: Option<String>,
    /// How long to wait for the redirect ([`DEFAULT_TIMEOUT`] when `None`).
    pub timeout: Option<Duration>,
}

/// A sign-in's state, as `GET /v1/mcp/servers/{name}/auth` shows it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(tag = "flow", rename_all = "snake_case")]
pub enum FlowState {
    /// Waiting for the browser's redirect.
    Pending { authorization_url: String, redirect_uri: String, expires_at_ms: u64 },
    /// The grant is stored.
    SignedIn,
    /// The flow ended without a grant: why.
    Failed { error: String },
}

/// One sign-in in progress (or just ended).
pub struct Flow {
    state: watch::Sender<FlowState>,
    cancel: CancellationToken,
    _task: AbortOnDropHandle<()>,
}

/// The sign-ins of every server (at most one each).
#[derive(Default)]
pub struct Flows {
    map: Mutex<HashMap<String, Arc<Flow>>>,
}

impl Flows {
    /// Stops `server`'s flow, if any.
    pub fn cancel(&self, server: &str) {
        if let Some(f) = self.map.lock().expect("flows").remove(server) {
            f.cancel.cancel();
        }
    }

    /// `server`'s latest flow's state, waiting at most `wait` for a pending one to end.
    pub async fn state(&self, server: &str, wait: Duration) -> Option<FlowState> {
        let flow = self.map.lock().expect("flows").get(server).cloned()?;
        let mut rx = flow.state.subscribe();
        let _ = tokio::time::timeout(wait, rx.wait_for(|s| !matches!(s, FlowState::Pending { .. }))).await;
        let s = rx.borrow().clone();
        Some(s)
    }
}

/// What the one redirect needs, taken by the first request that carries a `state`.
struct Pending {
    server: String,
    expected_state: SecretString,
    verifier: SecretString,
    client: Client,
    token_endpoint: Url,
    redirect_uri: String,
    resource: String,
    scope: Option<String>,
    issuer: String,
    auth: Arc<ServerAuth>,
    http: reqwest::Client,
}

struct Listener {
    host: String,
    pending: Mutex<Option<Pending>>,
    state: watch::Sender<FlowState>,
    done: CancellationToken,
}

impl OAuth {
    /// Starts a browser sign-in to the HTTP server `server` at `url`: discovery, client
    /// registration, a loopback listener; returns the state with the authorization URL to open.
    /// A flow already running for `server` stops.
    ///
    /// # Errors
    /// [`OAuthError`] naming the step that failed (no secret in it).
    pub async fn start_sign_in(
        self: &Arc<Self>,
        server: &str,
        url: &str,
        opts: SignInOptions,
    ) -> Result<FlowState, OAuthError> {
        self.flows.cancel(server);
        let http = self.http().clone();
        let server_url =
            Url::parse(url.trim()).map_err(|e| OAuthError::Flow(format!("the server's url is not valid: {e}")))?;
        let challenge = probe(&http, &server_url).await?;
        let prm = discovery::resource_metadata(&http, &server_url, challenge.as_ref()).await?;
        let issuer = prm.authorization_servers[0].clone();
        let meta = discovery::server_metadata(&http, &issuer).await?;
        // MCP 2025-11-25 basic/authorization §Scope Selection Strategy: the user's choice, then
        // a step-up's scopes (a 403 insufficient_scope named them), the challenge's, the
        // resource's.
        let step_up = self.server(server).step_up_scope().await;
        let scope = opts
            .scope
            .clone()
            .or(step_up)
            .or_else(|| challenge.as_ref().and_then(|c| c.scope.clone()))
            .or_else(|| (!prm.scopes_supported.is_empty()).then(|| prm.scopes_supported.join(" ")))
            .filter(|s| !s.trim().is_empty());
        let resource = prm.resource.trim_end_matches('/').to_owned();

        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .map_err(|e| OAuthError::Flow(format!("cannot listen on a loopback port for the redirect: {e}")))?;
        let port = listener.local_addr().map_err(|e| OAuthError::Flow(format!("loopback listener: {e}")))?.port();
        let host = format!("127.0.0.1:{port}");
        let redirect_uri = format!("http://{host}{CALLBACK_PATH}");

        let client = match (&opts.client_id, &opts.client_metadata_url, &meta.registration_endpoint) {
            (Some(id), _, _) => Client {
                client_id: id.clone(),
                client_secret: opts.client_secret.clone(),
                auth: if opts.client_secret.is_some() { ClientAuth::ClientSecretPost } else { ClientAuth::None },
            },
            (None, Some(doc), _) if meta.client_id_metadata_document_supported => {
                let u = discovery::safe_url(doc, "the client metadata document URL")?;
                if u.scheme() != "https" {
                    return Err(OAuthError::Flow("a client metadata document URL must be https://".into()));
                }
                Client { client_id: u.to_string(), client_secret: None, auth: ClientAuth::None }
            }
            (None, _, Some(reg)) => {
                let reg = discovery::safe_url(reg, "the registration endpoint")?;
                client::register(&http, &reg, &redirect_uri, scope.as_deref()).await?
            }
            (None, _, None) => {
                return Err(OAuthError::Flow(format!(
                    "the authorization server {} offers no client registration{}; register Coffer there with redirect URI http://127.0.0.1/callback (any port) and pass --client-id",
                    discovery::truncate(&meta.issuer, 120),
                    if meta.client_id_metadata_document_supported {
                        " (it accepts client metadata documents: pass --client-metadata-url)"
                    } else {
                        ""
                    }
                )));
            }
        };
        let pkce = Pkce::new();
        let state = coffer_runtime::token::random_token();
        let auth_endpoint = discovery::safe_url(&meta.authorization_endpoint, "the authorization endpoint")?;
        let authorization_url = client::authorization_url(
            &auth_endpoint,
            &client.client_id,
            &redirect_uri,
            &pkce,
            state.expose_secret(),
            scope.as_deref(),
            &resource,
        );
        let timeout = opts.timeout.unwrap_or(DEFAULT_TIMEOUT).min(MAX_TIMEOUT);
        let pending_state = FlowState::Pending {
            authorization_url: authorization_url.to_string(),
            redirect_uri: redirect_uri.clone(),
            expires_at_ms: now_ms() + timeout.as_millis() as u64,
        };
        let (tx, _) = watch::channel(pending_state.clone());
        let done = CancellationToken::new();
        let shared = Arc::new(Listener {
            host,
            pending: Mutex::new(Some(Pending {
                server: server.to_owned(),
                expected_state: state,
                verifier: pkce.verifier,
                client,
                token_endpoint: discovery::safe_url(&meta.token_endpoint, "the token endpoint")?,
                redirect_uri,
                resource,
                scope,
                issuer: meta.issuer.clone(),
                auth: self.server(server),
                http,
            })),
            state: tx.clone(),
            done: done.clone(),
        });
        // One handler for every path (this listener serves nothing else): the redirect on GET
        // `CALLBACK_PATH`, 404 for the rest.
        let router = axum::Router::new().fallback(callback).with_state(shared.clone());
        let name = server.to_owned();
        let task = tokio::spawn(async move {
            let serve = std::future::IntoFuture::into_future(
                axum::serve(listener, router).with_graceful_shutdown(shared.done.clone().cancelled_owned()),
            );
            tokio::select! {
                r = serve => if let Err(e) = r {
                    tracing::warn!(server = %name, error = %e, "The OAuth redirect listener failed.");
                },
                _ = tokio::time::sleep(timeout) => {
                    shared.state.send_if_modified(|s| {
                        if matches!(s, FlowState::Pending { .. }) {
                            *s = FlowState::Failed { error: format!("no redirect arrived within {} s; start the sign-in again", timeout.as_secs()) };
                            true
                        } else { false }
                    });
                    tracing::info!(server = %name, "An OAuth sign-in timed out.");
                }
            }
        });
        tracing::info!(server = %server, issuer = %meta.issuer, "OAuth sign-in started.");
        let flow = Arc::new(Flow { state: tx, cancel: done, _task: AbortOnDropHandle::new(task) });
        if let Some(old) = self.flows.map.lock().expect("flows").insert(server.to_owned(), flow) {
            old.cancel.cancel();
        }
        Ok(pending_state)
    }
}

/// The MCP endpoint's answer to an unauthenticated `initialize`: its `Bearer` challenge when it
/// answered `401` with one (MCP 2025-11-25 §Authorization Server Location), else `None` (the
/// well-known URIs are tried then).
async fn probe(http: &reqwest::Client, url: &Url) -> Result<Option<Challenge>, OAuthError> {
    let body = serde_json::json!({
        "jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "coffer", "version": env!("CARGO_PKG_VERSION")}}
    });
    let resp = tokio::time::timeout(
        PROBE_TIMEOUT,
        http.post(url.clone()).header(header::ACCEPT, "application/json, text/event-stream").json(&body).send(),
    )
    .await
    .map_err(|_| OAuthError::Flow(format!("the server at {} did not answer in time", shown(url))))?
    .map_err(|e| {
        OAuthError::Flow(format!("the server at {} is unreachable: {}", shown(url), discovery::describe(e)))
    })?;
    let resp = match resp.status() {
        StatusCode::UNAUTHORIZED => resp,
        // A legacy HTTP+SSE server (MCP 2024-11-05) takes no POST there (404/405, MCP
        // 2025-11-25 §Backwards Compatibility): its challenge comes with the stream's GET.
        StatusCode::NOT_FOUND | StatusCode::METHOD_NOT_ALLOWED => {
            match tokio::time::timeout(
                PROBE_TIMEOUT,
                http.get(url.clone()).header(header::ACCEPT, "text/event-stream").send(),
            )
            .await
            {
                Ok(Ok(r)) if r.status() == StatusCode::UNAUTHORIZED => r,
                // A stream that opened (no auth needed) is dropped at once.
                _ => return Ok(None),
            }
        }
        _ => return Ok(None),
    };
    let values: Vec<&str> =
        resp.headers().get_all(header::WWW_AUTHENTICATE).iter().filter_map(|v| v.to_str().ok()).collect();
    Ok(discovery::bearer_challenge(values))
}

#[derive(serde::Deserialize)]
struct Redirect {
    code: Option<String>,
    state: Option<String>,
    error: Option<String>,
    error_description: Option<String>,
}

async fn callback(
    State(l): State<Arc<Listener>>,
    method: axum::http::Method,
    uri: axum::http::Uri,
    headers: HeaderMap,
    q: Result<Query<Redirect>, axum::extract::rejection::QueryRejection>,
) -> Response {
    if uri.path() != CALLBACK_PATH || method != axum::http::Method::GET {
        return plain(StatusCode::NOT_FOUND, "Not found.");
    }
    let Ok(Query(q)) = q else {
        return plain(StatusCode::BAD_REQUEST, "Coffer: this address only takes the sign-in redirect.");
    };
    // The redirect comes from the user's browser to the exact address Coffer gave it; any other
    // Host is a rebound name or a confused request.
    if headers.get(header::HOST).and_then(|h| h.to_str().ok()) != Some(l.host.as_str()) {
        return plain(StatusCode::BAD_REQUEST, "Coffer: unexpected Host.");
    }
    if q.state.is_none() && q.code.is_none() && q.error.is_none() {
        return plain(StatusCode::BAD_REQUEST, "Coffer: this address only takes the sign-in redirect.");
    }
    let Some(p) = l.pending.lock().expect("pending").take() else {
        return plain(StatusCode::GONE, "Coffer: this sign-in is over.");
    };
    let (status, text, outcome) = finish(p, q).await;
    l.state.send_replace(outcome);
    l.done.cancel();
    plain(status, &text)
}

/// Checks the redirect and exchanges its code; returns the page to show and the flow's end.
async fn finish(p: Pending, q: Redirect) -> (StatusCode, String, FlowState) {
    let failed = |status: StatusCode, error: String| {
        tracing::warn!(server = %p.server, error = %error, "OAuth sign-in failed.");
        (status, format!("Coffer: sign-in to {} failed: {error}", p.server), FlowState::Failed { error })
    };
    let presented = q.state.unwrap_or_default();
    if !coffer_runtime::token::token_matches(&p.expected_state, presented.as_bytes()) {
        return failed(
            StatusCode::BAD_REQUEST,
            "the redirect's state does not match this sign-in (RFC 6749 §10.12); nothing was stored, start again"
                .into(),
        );
    }
    if let Some(err) = q.error {
        let desc = q.error_description.map(|d| format!(": {d}")).unwrap_or_default();
        let text = client::error_text(
            serde_json::json!({"error": err, "error_description": desc.trim_start_matches(": ")})
                .to_string()
                .as_bytes(),
            &[],
        );
        return failed(StatusCode::OK, format!("the authorization server answered {text}"));
    }
    let Some(code) = q.code.filter(|c| !c.is_empty()).map(SecretString::from) else {
        return failed(StatusCode::BAD_REQUEST, "the redirect carries no code".into());
    };
    let tokens = match client::exchange_code(
        &p.http,
        &p.token_endpoint,
        &p.client,
        &code,
        &p.verifier,
        &p.redirect_uri,
        &p.resource,
    )
    .await
    {
        Ok(t) => t,
        Err(TokenError::Refused(why)) => {
            return failed(StatusCode::OK, format!("the token endpoint refused the code: {why}"));
        }
        Err(TokenError::Unavailable(why)) => return failed(StatusCode::OK, format!("the token request failed: {why}")),
    };
    let mut grant = Grant {
        resource: p.resource.clone(),
        issuer: p.issuer.clone(),
        token_endpoint: p.token_endpoint.to_string(),
        client_id: p.client.client_id.clone(),
        client_secret: p.client.client_secret.as_ref().map(|s| s.expose_secret().to_owned()),
        client_auth: p.client.auth,
        scope: p.scope.clone(),
        signed_in_at_ms: now_ms(),
        ..Grant::default()
    };
    grant.take(tokens, now_ms());
    if let Err(e) = p.auth.signed_in(grant).await {
        return failed(StatusCode::OK, format!("the tokens could not be stored: {e}"));
    }
    tracing::info!(server = %p.server, issuer = %p.issuer, "OAuth sign-in complete.");
    (StatusCode::OK, format!("Coffer: signed in to {}. You can close this tab.", p.server), FlowState::SignedIn)
}

fn plain(status: StatusCode, text: &str) -> Response {
    (
        status,
        [
            (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CACHE_CONTROL, "no-store"),
            (header::REFERRER_POLICY, "no-referrer"),
        ],
        format!("{text}\n"),
    )
        .into_response()
}
