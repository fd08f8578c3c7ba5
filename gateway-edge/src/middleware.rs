//! Edge middleware, outermost first: trace id → Host/Origin (DNS rebinding) → authentication.
//!
//! Every response carries `X-Coffer-Trace`; the id is the span field `trace_id` on every log
//! line the request causes here, and travels in gRPC metadata to the other services.
//!
//! Logs stay small whatever a client sends: the path in the request span and every other
//! client-controlled value go through [`clip`], and refusals (which anyone on the machine can
//! cause at will) through the [`REFUSALS`] budget.
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use coffer_runtime::limits::ConnHandle;
use coffer_runtime::logging::{LogBudget, clip};

use crate::error::{ApiError, Code};
use crate::reach::{self, BindListener, Reach};
use crate::state::AppState;
use crate::web_sessions::{Refusal, SessionRef};

/// The same cookie as set at an `https://` origin of `ui.allowed_hosts` (`Secure`, `__Host-`).
pub use coffer_types::header::SECURE_SESSION_COOKIE;
/// Cookie set by the web page's one-time login (never enough alone: see [`auth`]).
pub use coffer_types::header::SESSION_COOKIE;
/// Header carrying the web session's key.
pub use coffer_types::header::SESSION_KEY;
/// Response header carrying the trace id.
pub use coffer_types::header::TRACE as TRACE_HEADER;

/// Log lines about refused requests (wrong token, foreign Host or Origin, a refused web
/// login): bursts of 50, 5 a second on average; past that, the next line written says how
/// many were suppressed.
pub static REFUSALS: LogBudget = LogBudget::new(5, 50);

/// An error in the wire format of the route: JSON-RPC on `/mcp`, the envelope elsewhere.
pub fn reject(path: &str, code: Code, message: &str) -> Response {
    if path == "/mcp" || path.starts_with("/mcp/") {
        let (_, status) = code.spec();
        crate::mcp::jsonrpc::http_error(status, rpc_code(code), message)
    } else {
        ApiError::new(code, message).into_response()
    }
}

/// The JSON-RPC error code of an edge refusal on `/mcp`.
fn rpc_code(code: Code) -> i64 {
    match code {
        Code::PayloadTooLarge | Code::BadRequest => coffer_types::jsonrpc::INVALID_REQUEST,
        _ => coffer_types::jsonrpc::UPSTREAM_UNAVAILABLE,
    }
}

/// How much of a refused `/mcp` POST body is read to find its JSON-RPC id, and for how long.
const ID_SNIFF_BYTES: usize = 64 * 1024;
const ID_SNIFF_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// [`reject`] for a request refused before any handler ran: a `POST /mcp` gets its JSON-RPC
/// error with the request's id when the start of its body names one (JSON-RPC 2.0 §5: the id
/// is null only when it could not be read), else `null`.
async fn reject_request(req: Request, code: Code, message: &str) -> Response {
    let path = req.uri().path().to_owned();
    if req.method() != axum::http::Method::POST || path != "/mcp" {
        return reject(&path, code, message);
    }
    let id = tokio::time::timeout(ID_SNIFF_WAIT, body_prefix(req.into_body(), ID_SNIFF_BYTES))
        .await
        .map(|prefix| coffer_runtime::ndjson::sniff_id(&prefix))
        .unwrap_or(serde_json::Value::Null);
    let (_, status) = code.spec();
    crate::mcp::jsonrpc::http_error_for(status, id, rpc_code(code), message)
}

/// The first `limit` bytes (or so) of `body`.
async fn body_prefix(mut body: axum::body::Body, limit: usize) -> Vec<u8> {
    use http_body_util::BodyExt;
    let mut buf = Vec::new();
    while buf.len() < limit {
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    buf.extend_from_slice(data);
                }
            }
            _ => break,
        }
    }
    buf
}

/// Assigns a trace id, runs the request inside span `request{trace_id, method, path}`, and
/// stamps `X-Coffer-Trace` on the response.
pub async fn trace(req: Request, next: Next) -> Response {
    let id = coffer_runtime::grpc::new_trace_id();
    let span = tracing::info_span!("request", trace_id = %id, method = %req.method(), path = %clip(req.uri().path()));
    let started = std::time::Instant::now();
    let mut resp = coffer_runtime::grpc::with_trace(id.clone(), next.run(req)).instrument(span.clone()).await;
    let status = resp.status().as_u16();
    span.in_scope(|| tracing::debug!(status, elapsed_us = started.elapsed().as_micros() as u64, "Request done."));
    resp.headers_mut().insert(TRACE_HEADER, HeaderValue::from_str(&id).expect("hex is a valid header"));
    resp
}

/// `Host` must name loopback (or one of `ui.allowed_hosts`); `Origin`, when present, must be
/// exactly Coffer's own loopback origin or one of `ui.allowed_hosts`. On the `ui.bind` listener
/// only `ui.allowed_hosts` are accepted. Every request let through carries a [`Reach`]
/// extension; a remote one (see [`crate::reach`]) to `/mcp` or with a token is refused unless
/// `ui.remote_api` is 1.
pub async fn host_origin(State(st): State<Arc<AppState>>, mut req: Request, next: Next) -> Response {
    let path = req.uri().path().to_owned();
    // One Host (RFC 9112 §3.2: more than one is a 400) and at most one Origin: with two, a
    // check of the first could pass while something downstream reads the other.
    for (name, what) in [(header::HOST, "Host"), (header::ORIGIN, "Origin")] {
        if req.headers().get_all(&name).iter().nth(1).is_some() {
            if let Some(suppressed) = REFUSALS.allow() {
                tracing::info!(header = what, suppressed, "Refused: repeated header.");
            }
            return reject(&path, Code::BadRequest, &format!("more than one {what} header"));
        }
    }
    // HTTP/2 carries the host in the `:authority` pseudo-header, which hyper puts in the URI
    // (RFC 9113 §8.3.1); the check is the same either way.
    let host = match req.headers().get(header::HOST) {
        Some(v) => v.to_str().unwrap_or(""),
        None => req.uri().authority().map_or("", |a| a.as_str()),
    }
    .to_owned();
    let on_bind = req.extensions().get::<BindListener>().is_some();
    let remote = reach::config(&st);
    let loopback = !on_bind && host_is_loopback(&host, st.port);
    let extra = !loopback && remote.hosts.iter().any(|o| o.matches_host(&host));
    if !loopback && !extra {
        if let Some(suppressed) = REFUSALS.allow() {
            tracing::info!(host = %clip(&host), on_bind, suppressed, "Refused: Host is not loopback nor an allowed host.");
        }
        let message = if on_bind {
            "Host header must name one of the hosts of the setting ui.allowed_hosts: this listener (ui.bind) \
             answers nothing else"
                .to_owned()
        } else {
            format!(
                "Host header must name this daemon: 127.0.0.1:{port}, localhost:{port} or [::1]:{port} (a loopback \
                 address with this port). To open the console by another name (a tailnet name, a reverse proxy), \
                 add its origin to the setting ui.allowed_hosts: coffer settings set ui.allowed_hosts \
                 https://NAME (see docs/REMOTE.md)",
                port = st.port
            )
        };
        return reject_request(req, Code::Forbidden, &message).await;
    }
    if let Some(origin) = req.headers().get(header::ORIGIN) {
        let ok = origin.to_str().is_ok_and(|o| {
            (!on_bind && origin_is_ours(o, st.port)) || remote.hosts.iter().any(|h| h.matches_origin(o))
        });
        if !ok {
            if let Some(suppressed) = REFUSALS.allow() {
                tracing::info!(suppressed, "Refused: foreign Origin.");
            }
            return reject_request(
                req,
                Code::Forbidden,
                "Origin is not Coffer's own origin nor one of ui.allowed_hosts",
            )
            .await;
        }
    }
    let reach = if extra {
        reach::remote_for(&remote.hosts, &host)
    } else if reach::forwarded(req.headers()) {
        Reach::Remote { https: false }
    } else {
        Reach::Local
    };
    if matches!(reach, Reach::Remote { .. }) && !remote.remote_api {
        let h = req.headers();
        let is_mcp = path == "/mcp" || path.starts_with("/mcp/");
        if is_mcp || h.contains_key(coffer_types::header::TOKEN) || h.contains_key(header::AUTHORIZATION) {
            if let Some(suppressed) = REFUSALS.allow() {
                tracing::info!(host = %clip(&host), suppressed, "Refused: /mcp or a token from beyond loopback.");
            }
            let message = "/mcp and the token answer on loopback only: this request came from beyond loopback (an \
                           allowed host, ui.bind or a proxy). The console's login works here; to allow MCP clients \
                           and the token from other devices too, set ui.remote_api to 1";
            if is_mcp {
                return reject_request(req, Code::Forbidden, message).await;
            }
            return ApiError::new(Code::Forbidden, message)
                .with_details(serde_json::json!({"reason": "remote_api_off"}))
                .into_response();
        }
    }
    req.extensions_mut().insert(reach);
    let mut resp = next.run(req).await;
    // For `ui::security_headers`, which runs outside this layer.
    resp.extensions_mut().insert(reach);
    resp
}

fn host_is_loopback(host: &str, port: u16) -> bool {
    let (name, p) = match host.rsplit_once(':') {
        Some((n, _)) if !n.ends_with(']') && n.contains(':') => (host, None), // bare IPv6
        Some((n, p)) => (n, Some(p)),
        None => (host, None),
    };
    let name_ok = matches!(name.to_ascii_lowercase().as_str(), "127.0.0.1" | "localhost" | "[::1]");
    let port_ok = p.is_none_or(|p| p.parse::<u16>().ok() == Some(port));
    name_ok && port_ok
}

fn origin_is_ours(origin: &str, port: u16) -> bool {
    let o = origin.to_ascii_lowercase();
    o == format!("http://127.0.0.1:{port}")
        || o == format!("http://localhost:{port}")
        || o == format!("http://[::1]:{port}")
}

/// Requires the owner's token (`X-Coffer-Token` or `Authorization: Bearer`, constant-time
/// compared), the agent token on `/mcp`, or a web session: the `coffer_session` cookie **and** its key (`X-Coffer-Session-Key`), or, on
/// a `GET`/`HEAD` (an event stream, which `EventSource` opens without headers), the cookie and a
/// single-use stream ticket in `?ticket=` (see [`crate::web_sessions`]). The cookie alone is
/// refused, whatever the method or route: cookies are not port-scoped, so a page or server on
/// any other local port receives it. Open: `GET /v1/health` and the web console's static
/// `GET /ui…` (it holds no data). A web-session request with an unsafe method must also carry
/// `Origin` (checked to be ours by [`host_origin`]).
///
/// The `ticket` parameter is removed from the request's URI before anything after this runs
/// (handlers, their query parsing), and the `trace` span records the path only: a ticket is
/// never logged. An authenticated request carries a [`Via`] extension.
///
/// A streaming answer (an SSE stream, a followed log: any body without a known length) to a
/// web-session request ends when that session is revoked ([`until_revoked`]);
/// token-authenticated requests (every `/mcp` call) are passed through untouched.
///
/// The **agent token** (`agent-access/agent.json`, the only daemon file a sandboxed managed
/// agent may read) is accepted on `/mcp` alone — the one route its `coffer-mcp-shim` uses
/// (`GET /v1/health` needs nothing). On every other route it gets 403 `FORBIDDEN` with
/// `details.reason` `agent_token_scope`: an agent following a hostile prompt may call tools,
/// never act as the owner (register a server that runs outside the sandbox, read credentials,
/// change settings).
///
/// The request then runs with how it was authenticated as its `coffer_runtime::grpc::with_auth`
/// (`token`, `agent_token`, or `session:<12 hex digits of the SHA-256 of the session id>`): the
/// store records it in every audit row the request causes, whatever `X-Coffer-Actor` claims.
pub async fn auth(State(st): State<Arc<AppState>>, mut req: Request, next: Next) -> Response {
    let path = req.uri().path();
    let safe = matches!(*req.method(), axum::http::Method::GET | axum::http::Method::HEAD);
    // Only `GET /v1/health` (and its HEAD) is open; other methods on that path need the token.
    if safe && (path == "/v1/health" || path == "/ui" || path.starts_with("/ui/")) {
        return next.run(req).await;
    }
    let agent_allowed = path == AGENT_PATH || path.starts_with(coffer_types::mcp::PROFILE_PATH_PREFIX);
    let ticket = if safe { take_ticket(&mut req) } else { None };
    let verdict = authorize(&st, req.headers(), ticket.as_deref());
    // An authenticated request makes its connection trusted: at the connection cap, it is
    // never closed to make room (see `coffer_runtime::limits`).
    if (matches!(verdict, Verdict::Token | Verdict::Session(..))
        || (matches!(verdict, Verdict::Agent) && agent_allowed))
        && let Some(conn) = req.extensions().get::<ConnHandle>()
    {
        conn.mark_trusted();
    }
    match verdict {
        Verdict::Token => {
            req.extensions_mut().insert(Via::Token);
            return coffer_runtime::grpc::with_auth("token".to_owned(), next.run(req)).await;
        }
        Verdict::Agent if agent_allowed => {
            req.extensions_mut().insert(Via::Agent);
            // What the MCP transport reads (it never names this module: see mcp/tests/boundaries.rs).
            req.extensions_mut().insert(crate::mcp::downstream::http::AgentToken);
            return coffer_runtime::grpc::with_auth(AGENT_AUTH.to_owned(), next.run(req)).await;
        }
        Verdict::Agent => {
            if let Some(suppressed) = REFUSALS.allow() {
                tracing::info!(method = %req.method(), suppressed, "Refused: the agent token outside /mcp.");
            }
            return ApiError::new(
                Code::Forbidden,
                "the agent token (agent-access/agent.json) is accepted on /mcp only: a managed agent may call \
                 tools, not use the REST API. This route needs the owner's token (daemon.json) or a console \
                 session",
            )
            .with_details(serde_json::json!({"reason": "agent_token_scope"}))
            .into_response();
        }
        Verdict::Session(session, revoked) if safe || req.headers().contains_key(header::ORIGIN) => {
            let label = format!("session:{}", session.label());
            req.extensions_mut().insert(Via::Session(session));
            let resp = coffer_runtime::grpc::with_auth(label, next.run(req)).await;
            return until_revoked(resp, revoked);
        }
        Verdict::Session(..) => {
            if let Some(suppressed) = REFUSALS.allow() {
                tracing::info!(method = %req.method(), suppressed, "Refused: web-session unsafe request without Origin.");
            }
            return reject_request(
                req,
                Code::Forbidden,
                "a web-session request that changes something must carry Origin",
            )
            .await;
        }
        Verdict::Refused(why) => {
            let (message, reason) = match why {
                Refusal::KeyMissing => (
                    "the console session key is missing: a web-session request needs X-Coffer-Session-Key (an \
                     event stream a ticket from POST /v1/ui/stream-tickets); the cookie alone is not enough. \
                     Open a new login link from `coffer ui`",
                    "session_key_missing",
                ),
                _ => (
                    "the console session key or stream ticket is wrong, used or expired. Open a new login \
                     link from `coffer ui`",
                    "session_key_wrong",
                ),
            };
            if let Some(suppressed) = REFUSALS.allow() {
                tracing::info!(method = %req.method(), reason, suppressed, "Refused: web-session cookie without its key.");
            }
            let mut resp = if req.uri().path() == "/mcp" || req.uri().path().starts_with("/mcp/") {
                reject_request(req, Code::Unauthorized, message).await
            } else {
                ApiError::new(Code::Unauthorized, message)
                    .with_details(serde_json::json!({"reason": reason}))
                    .into_response()
            };
            resp.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"coffer\""));
            return resp;
        }
        Verdict::None => {}
    }
    // A client mistake, not an error; logged so that hostile attempts leave a trace.
    if let Some(suppressed) = REFUSALS.allow() {
        tracing::info!(method = %req.method(), suppressed, "Refused: missing or wrong token.");
    }
    let on_mcp = req.uri().path() == "/mcp" || req.uri().path().starts_with("/mcp/");
    let mut resp = if session_cookies(req.headers()).next().is_some() && !on_mcp {
        // A console cookie that names no live session: it ended with the daemon run, was logged
        // out or expired. Say so, rather than point a console user at the token.
        ApiError::new(
            Code::Unauthorized,
            "the console session is unknown or has ended (sessions end with the daemon, `coffer ui --logout-all` or \
             30 idle days): open a new login link from `coffer ui`",
        )
        .with_details(serde_json::json!({"reason": "session_unknown"}))
        .into_response()
    } else {
        reject_request(
            req,
            Code::Unauthorized,
            "missing or wrong token: send X-Coffer-Token or Authorization: Bearer with the token of daemon.json",
        )
        .await
    };
    resp.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"coffer\""));
    resp
}

/// The one route the agent token opens (see [`auth`]).
pub const AGENT_PATH: &str = "/mcp";
/// How a request authenticated with the agent token is recorded (audit `auth`).
pub const AGENT_AUTH: &str = "agent_token";

/// How [`auth`] authenticated a request: a request extension on every authenticated one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// The token from `daemon.json`.
    Token,
    /// The agent token from `agent-access/agent.json` (on `/mcp` only).
    Agent,
    /// A web session (cookie and key, or cookie and stream ticket).
    Session(SessionRef),
}

/// What [`authorize`] found.
enum Verdict {
    /// The owner's token.
    Token,
    /// The agent token (valid on [`AGENT_PATH`] only).
    Agent,
    /// A web session; the token is cancelled when the session is revoked.
    Session(SessionRef, CancellationToken),
    /// A live session cookie without its key or ticket (or with a wrong one).
    Refused(Refusal),
    /// No credential, or a wrong token or dead cookie.
    None,
}

/// Removes every `ticket=` pair from the request's query and returns the first value.
fn take_ticket(req: &mut Request) -> Option<String> {
    let q = req.uri().query()?;
    let mut ticket = None;
    let mut kept = Vec::new();
    for pair in q.split('&') {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if k == coffer_types::header::STREAM_TICKET {
            ticket.get_or_insert_with(|| v.to_owned());
        } else {
            kept.push(pair.to_owned());
        }
    }
    ticket.as_ref()?;
    let pq =
        if kept.is_empty() { req.uri().path().to_owned() } else { format!("{}?{}", req.uri().path(), kept.join("&")) };
    let mut parts = req.uri().clone().into_parts();
    parts.path_and_query = pq.parse().ok();
    if let Ok(uri) = axum::http::Uri::from_parts(parts) {
        *req.uri_mut() = uri;
    }
    ticket
}

/// True when the request carries the token (constant-time compared); a web session never does.
pub fn via_token(st: &AppState, h: &HeaderMap) -> bool {
    matches!(authorize(st, h, None), Verdict::Token)
}

/// True when the request's `coffer_session` cookie names a live session, key or not. This
/// authenticates nothing (any local port receives the cookie): it only lets the login page
/// send an already signed-in browser to its page instead of the refusal.
pub fn has_live_cookie(st: &AppState, h: &HeaderMap) -> bool {
    session_cookies(h).any(|v| st.web_sessions.cookie_is_live(v))
}

/// The values of every `coffer_session` (or `__Host-coffer_session`) cookie the request carries.
fn session_cookies(h: &HeaderMap) -> impl Iterator<Item = &str> {
    h.get_all(header::COOKIE).iter().filter_map(|c| c.to_str().ok()).flat_map(|s| {
        s.split(';').filter_map(|part| {
            part.trim()
                .split_once('=')
                .filter(|(k, _)| *k == SESSION_COOKIE || *k == SECURE_SESSION_COOKIE)
                .map(|(_, v)| v)
        })
    })
}

/// Ends a streaming response's body when `revoked` is cancelled (the session it streams to was
/// revoked): the client sees the stream end, and its reconnection is refused with 401. A body
/// of known length is already complete and is returned unchanged.
fn until_revoked(resp: Response, revoked: CancellationToken) -> Response {
    use axum::body::HttpBody as _;
    use futures_util::StreamExt as _;
    if resp.body().size_hint().exact().is_some() {
        return resp;
    }
    resp.map(|body| axum::body::Body::from_stream(body.into_data_stream().take_until(revoked.cancelled_owned())))
}

/// The token when one is sent (right or wrong: a wrong token is not retried as a cookie): the
/// owner's or the agents' (both compared in constant time, both always); else the session
/// cookie with its key (`X-Coffer-Session-Key`) or, failing a key, `ticket`.
fn authorize(st: &AppState, h: &HeaderMap, ticket: Option<&str>) -> Verdict {
    let token = |presented: &[u8]| {
        let owner = coffer_runtime::token::token_matches(&st.public_token, presented);
        let agent = coffer_runtime::token::token_matches(&st.agent_token, presented);
        match (owner, agent) {
            (true, _) => Verdict::Token,
            (false, true) => Verdict::Agent,
            (false, false) => Verdict::None,
        }
    };
    if let Some(v) = h.get(coffer_types::header::TOKEN) {
        return token(v.as_bytes());
    }
    if let Some(v) = h.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok())
        && let Some(t) = v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer "))
    {
        return token(t.trim().as_bytes());
    }
    let key = h.get(coffer_types::header::SESSION_KEY).map(|v| v.to_str().unwrap_or(""));
    let mut verdict = Verdict::None;
    for id in session_cookies(h) {
        let checked = match (key, ticket) {
            (None, Some(t)) => st.web_sessions.check_ticket(id, t),
            _ => st.web_sessions.check(id, key),
        };
        match checked {
            Ok((session, revoked)) => return Verdict::Session(session, revoked),
            Err(Refusal::NoSession) => {}
            Err(why) => verdict = Verdict::Refused(why),
        }
    }
    verdict
}

/// Refuses a request whose declared `Content-Length` exceeds its route's body limit (`/mcp`
/// 16 MiB, `POST /v1/conversations/{id}/messages` 56 MiB (attached files), everything else 2 MiB) with 413 in the route's wire format, before any handler runs:
/// a handler that never reads its body must not run for an oversized request either. A body
/// without a declared length is bounded where it is read (`DefaultBodyLimit`).
pub async fn body_limit(req: Request, next: Next) -> Response {
    let path = req.uri().path();
    let is_mcp = path == "/mcp" || path.starts_with("/mcp/");
    let limit = if is_mcp {
        crate::MCP_BODY_LIMIT
    } else if crate::rest::chat::is_message_post(req.method(), path) {
        crate::rest::chat::MESSAGE_BODY_LIMIT
    } else {
        crate::REST_BODY_LIMIT
    };
    let declared = req.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        if is_mcp {
            return reject(path, Code::PayloadTooLarge, &crate::error::too_large_message(limit));
        }
        return crate::error::too_large(limit).into_response();
    }
    next.run(req).await
}

/// Fallback for a known path with an unsupported method: 405 in the route's wire format (axum
/// keeps its `Allow` header).
pub async fn method_not_allowed(req: Request) -> Response {
    let path = req.uri().path().to_owned();
    reject(&path, Code::MethodNotAllowed, &format!("{} is not allowed on {}", req.method(), truncate(&path, 200)))
}

/// Fallback for unknown routes: 404 in the route's wire format.
pub async fn not_found(req: Request) -> Response {
    let path = req.uri().path().to_owned();
    let mut r = reject(&path, Code::NotFound, &format!("no route for {} {}", req.method(), truncate(&path, 200)));
    if path.starts_with("/mcp") {
        *r.status_mut() = StatusCode::NOT_FOUND;
    }
    r
}

fn truncate(s: &str, n: usize) -> &str {
    match s.char_indices().nth(n) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts() {
        for ok in ["127.0.0.1:8000", "localhost:8000", "LOCALHOST", "[::1]:8000", "127.0.0.1"] {
            assert!(host_is_loopback(ok, 8000), "{ok}");
        }
        for bad in [
            "evil.com",
            "evil.com:8000",
            "127.0.0.1:8001",
            "127.0.0.1.evil.com",
            "",
            "localhost.:8000",
            "10.0.0.1:8000",
        ] {
            assert!(!host_is_loopback(bad, 8000), "{bad}");
        }
    }

    #[test]
    fn the_ticket_is_taken_out_of_the_query() {
        let take = |uri: &str| {
            let mut req = Request::builder().uri(uri).body(axum::body::Body::empty()).unwrap();
            let t = take_ticket(&mut req);
            (t, req.uri().to_string())
        };
        assert_eq!(take("/v1/x?ticket=ab"), (Some("ab".into()), "/v1/x".into()));
        assert_eq!(take("/v1/x?follow=true&ticket=ab&n=5"), (Some("ab".into()), "/v1/x?follow=true&n=5".into()));
        // Every copy goes; the first is the one tried.
        assert_eq!(take("/v1/x?ticket=ab&ticket=cd&after=3"), (Some("ab".into()), "/v1/x?after=3".into()));
        assert_eq!(take("/v1/x?tickets=ab"), (None, "/v1/x?tickets=ab".into()));
        assert_eq!(take("/v1/x"), (None, "/v1/x".into()));
    }

    #[test]
    fn origins() {
        assert!(origin_is_ours("http://127.0.0.1:8000", 8000));
        assert!(origin_is_ours("http://localhost:8000", 8000));
        for bad in [
            "http://evil.com",
            "http://127.0.0.1:8001",
            "https://127.0.0.1:8000",
            "null",
            "http://127.0.0.1:8000.evil.com",
        ] {
            assert!(!origin_is_ours(bad, 8000), "{bad}");
        }
    }
}
