//! `/mcp`: MCP Streamable HTTP for clients of both eras at once (MCP 2025-11-25 and 2026-07-28,
//! basic/transports §Streamable HTTP; also negotiating 2025-06-18 and 2025-03-26).
//!
//! Legacy clients (2025-03-26 … 2025-11-25):
//! - `POST` carries one JSON-RPC message (or, on a 2025-03-26 session only, a batch). A request
//!   gets `application/json` with its response; notifications and client responses get 202.
//!   `initialize` (without a session id) creates a session and returns `Mcp-Session-Id`.
//! - `GET` opens the session's server→client SSE stream (`Last-Event-ID` resumes it). It
//!   reads the session's bounded broadcast ([`crate::mcp::Outbound`]): a client that reads too
//!   slowly misses messages (counted in the session's drops) instead of growing a queue.
//! - A request's own server→client messages (relayed requests, its progress) go on its POST's
//!   SSE answer through a bounded [`Lane`]; the final response always follows them.
//! - `DELETE` ends the session. An unknown or ended session gets 404 so clients re-initialize.
//! - `MCP-Protocol-Version`, when sent, must be a supported revision (else 400 -32022 listing
//!   them). A `server/discover` with neither a modern header nor `_meta` gets -32601, as before.
//!
//! Modern clients (2026-07-28): a POST whose `MCP-Protocol-Version` is modern, or (without
//! `Mcp-Session-Id`) whose request carries `params._meta[io.modelcontextprotocol/protocolVersion]`,
//! is served statelessly ([`modern`]): headers checked against the body (400 -32020), version
//! served (400 -32022 listing them), `server/discover` answered, unknown methods 404 -32601,
//! results carrying `resultType` (and `ttlMs`/`cacheScope` on lists and reads), calls that need
//! client input answered with an `InputRequiredResult` ([`crate::mcp::session::mrtr`]), `subscriptions/listen`
//! as an SSE stream ([`crate::mcp::downstream::listen`]). Calls, prompts and reads are answered on an SSE stream
//! (keep-alive comments) when the client accepts one: closing it cancels the request upstream.
//! `GET` and `DELETE` with a modern version get 405. The client's gateway session is scoped by
//! [`scope`]: per credential and `X-Coffer-Connection` header when sent, else per credential and
//! client identity (`clientInfo` name and version).
use std::convert::Infallible;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use futures_util::StreamExt;
use serde_json::Value;
use serde_json::value::RawValue;

use crate::mcp::downstream::era::{self, Refusal};
use crate::mcp::downstream::message::{self, Parsed};
use crate::mcp::jsonrpc::{self, INVALID_REQUEST, METHOD_NOT_FOUND, PARSE_ERROR};
use crate::mcp::session::{LANE_MESSAGES, Lane, RequestCtx};
use crate::mcp::{Gateway, SUPPORTED_VERSIONS, Session};

mod modern;

const SESSION_HEADER: &str = coffer_types::header::MCP_SESSION_ID;
pub(in crate::mcp) const VERSION_HEADER: &str = coffer_types::header::MCP_PROTOCOL_VERSION;

/// The `/mcp` route over `gateway`, mountable in a router of any state: the transports use the
/// gateway only.
pub fn routes<S: Clone + Send + Sync + 'static>(gateway: Arc<Gateway>) -> Router<S> {
    Router::new().route("/mcp", any(handle)).route("/mcp/p/{profile}", any(handle_in_profile)).with_state(gateway)
}

async fn handle(
    State(gw): State<Arc<Gateway>>,
    agent: Option<axum::Extension<AgentToken>>,
    method: Method,
    headers: HeaderMap,
    upgrade: StreamUpgrade,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    serve_mcp(gw, agent.is_some(), None, method, headers, upgrade, body).await
}

/// `/mcp/p/{profile}`: `/mcp` for sessions of one profile (issue 36 §1), with the same Host,
/// Origin and authentication rules.
async fn handle_in_profile(
    State(gw): State<Arc<Gateway>>,
    axum::extract::Path(profile): axum::extract::Path<String>,
    agent: Option<axum::Extension<AgentToken>>,
    method: Method,
    headers: HeaderMap,
    upgrade: StreamUpgrade,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    serve_mcp(gw, agent.is_some(), Some(profile), method, headers, upgrade, body).await
}

/// What a request names of its session's profile: its path's `/mcp/p/{name}` and its
/// `Coffer-Profile` header ([`crate::mcp::profile::requested`]); used when it starts a session.
pub(in crate::mcp) type Requested = Result<Option<String>, crate::mcp::profile::ProfileError>;

/// The profile a new session of `gw` gets for `requested`.
pub(in crate::mcp) fn choose_profile(
    gw: &Gateway,
    requested: &Requested,
) -> Result<Arc<str>, crate::mcp::profile::ProfileError> {
    let name = requested.clone()?;
    crate::mcp::profile::choose(&gw.shared.snapshot.current(), name.as_deref())
}

async fn serve_mcp(
    gw: Arc<Gateway>,
    by_agent_token: bool,
    path_profile: Option<String>,
    method: Method,
    headers: HeaderMap,
    upgrade: StreamUpgrade,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    let conversation = conversation(by_agent_token, &headers);
    let profile = crate::mcp::profile::requested(
        path_profile.as_deref(),
        headers.get(coffer_types::mcp::PROFILE_HEADER).map(HeaderValue::as_bytes),
    );
    if let StreamUpgrade::Requested(on_upgrade) = upgrade {
        if let Err(r) = check_version(&headers) {
            return r;
        }
        return crate::mcp::downstream::stream::accept(gw, on_upgrade, conversation, profile);
    }
    match method {
        Method::POST => {
            let body = match body {
                Ok(b) => b,
                Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                    return jsonrpc::http_error(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        INVALID_REQUEST,
                        &format!("request body is larger than {} bytes", super::MCP_BODY_LIMIT),
                    );
                }
                Err(e) => {
                    return jsonrpc::http_error(
                        StatusCode::BAD_REQUEST,
                        INVALID_REQUEST,
                        &format!("cannot read body: {}", e.body_text()),
                    );
                }
            };
            post(gw, headers, body, conversation, profile).await
        }
        Method::GET | Method::DELETE if modern_header(&headers) => {
            let mut r = jsonrpc::http_error(
                StatusCode::METHOD_NOT_ALLOWED,
                INVALID_REQUEST,
                "MCP 2026-07-28 has no GET stream and no session to DELETE: POST requests, and subscriptions/listen for notifications",
            );
            r.headers_mut().insert(header::ALLOW, HeaderValue::from_static("POST"));
            r
        }
        Method::GET => get(gw, headers).await,
        Method::DELETE => delete(gw, headers).await,
        _ => {
            let mut r =
                jsonrpc::http_error(StatusCode::METHOD_NOT_ALLOWED, INVALID_REQUEST, "use POST, GET or DELETE on /mcp");
            r.headers_mut().insert(header::ALLOW, HeaderValue::from_static("GET, POST, DELETE"));
            r
        }
    }
}

/// Whether a request asks to switch `/mcp` to a stream ([`crate::mcp::downstream::stream`]), and hyper's handle
/// for the switched connection (absent on HTTP/2, which has no `Upgrade`).
enum StreamUpgrade {
    No,
    Requested(Option<hyper::upgrade::OnUpgrade>),
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for StreamUpgrade {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, _: &S) -> Result<Self, Infallible> {
        if parts.method != Method::GET || !crate::mcp::downstream::stream::requested(&parts.headers) {
            return Ok(Self::No);
        }
        Ok(Self::Requested(parts.extensions.remove::<hyper::upgrade::OnUpgrade>()))
    }
}

fn json_response(status: StatusCode, body: String) -> Response {
    let mut r = (status, body).into_response();
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

fn rpc_error(status: StatusCode, id: Value, code: i64, msg: &str) -> Response {
    json_response(status, jsonrpc::error_object(id, code, msg, None).to_string())
}

fn session_id(headers: &HeaderMap) -> Option<&str> {
    headers.get(SESSION_HEADER).and_then(|v| v.to_str().ok())
}

/// Checks `MCP-Protocol-Version` when present: 400 -32022 (`data.supported` listing every
/// revision served) for one Coffer does not serve.
// The error is the HTTP answer itself, built only on the refusal path; boxing it buys nothing.
#[allow(clippy::result_large_err)]
fn check_version(headers: &HeaderMap) -> Result<(), Response> {
    match headers.get(VERSION_HEADER).map(|v| v.to_str().unwrap_or("")) {
        Some(v) if !SUPPORTED_VERSIONS.contains(&v) && !era::is_modern(v) => {
            Err(refuse(StatusCode::BAD_REQUEST, Value::Null, &Refusal::unsupported(v)))
        }
        _ => Ok(()),
    }
}

/// Whether `MCP-Protocol-Version` names a modern (handshake-less) revision.
fn modern_header(headers: &HeaderMap) -> bool {
    headers.get(VERSION_HEADER).and_then(|v| v.to_str().ok()).is_some_and(era::is_modern)
}

fn refuse(status: StatusCode, id: Value, refusal: &Refusal) -> Response {
    json_response(status, refusal.response(id))
}

fn accepts(headers: &HeaderMap, what: &str) -> bool {
    match headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()) {
        None => true,
        Some(a) => a.contains(what) || a.contains("*/*"),
    }
}

/// The session named by `Mcp-Session-Id`, or the refusal: 400 without the header, 404 for an
/// unknown or ended session. `request` is the id of the request being refused (raw JSON), when
/// there is one: the error carries it.
#[allow(clippy::result_large_err)]
fn lookup(gw: &Gateway, headers: &HeaderMap, request: Option<&RawValue>) -> Result<Arc<Session>, Response> {
    let id = || request.and_then(|r| serde_json::from_str(r.get()).ok()).unwrap_or(Value::Null);
    match session_id(headers) {
        None => Err(rpc_error(
            StatusCode::BAD_REQUEST,
            id(),
            INVALID_REQUEST,
            "Bad Request: no Mcp-Session-Id header; send initialize first",
        )),
        Some(session) => gw.session(session).ok_or_else(|| {
            rpc_error(
                StatusCode::NOT_FOUND,
                id(),
                jsonrpc::UPSTREAM_UNAVAILABLE,
                "Session not found: it ended or belongs to another daemon run; initialize a new session",
            )
        }),
    }
}

/// A request extension the edge's authentication adds to a request authenticated with the
/// agents' token (`agent-access/agent.json`): only such a request may name its conversation.
#[derive(Debug, Clone, Copy)]
pub struct AgentToken;

/// The conversation a managed agent's shim names in `X-Coffer-Conversation`, believed only from a
/// request authenticated with the agent token (anyone else's is ignored: the owner's clients are
/// named by their `clientInfo`) and only when it has a conversation id's shape. A label for the
/// invocation log; it grants nothing.
fn conversation(by_agent_token: bool, headers: &HeaderMap) -> Option<Arc<str>> {
    if !by_agent_token {
        return None;
    }
    let v = headers.get(coffer_types::mcp::CONVERSATION_HEADER)?.to_str().ok()?;
    coffer_types::mcp::valid_conversation_id(v).then(|| Arc::from(v))
}

async fn post(
    gw: Arc<Gateway>,
    headers: HeaderMap,
    body: Bytes,
    conversation: Option<Arc<str>>,
    profile: Requested,
) -> Response {
    if let Some(ct) = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok())
        && !ct.to_ascii_lowercase().starts_with("application/json")
    {
        return rpc_error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Value::Null,
            INVALID_REQUEST,
            "Content-Type must be application/json",
        );
    }
    if !accepts(&headers, "application/json") && !accepts(&headers, "text/event-stream") {
        return rpc_error(
            StatusCode::NOT_ACCEPTABLE,
            Value::Null,
            INVALID_REQUEST,
            "Accept must allow application/json and text/event-stream",
        );
    }
    let first = body.iter().copied().find(|b| !b.is_ascii_whitespace());
    if first == Some(b'[') {
        if let Err(r) = check_version(&headers) {
            return r;
        }
        return post_batch(gw, headers, body).await;
    }
    let parsed = match message::decode(&body) {
        Ok(p) => p,
        Err(e) => return rpc_error(StatusCode::BAD_REQUEST, e.id, e.code, &e.message),
    };
    // A modern client: its header says so, or (without a legacy session) its request's `_meta`.
    let modern = modern_header(&headers)
        || (session_id(&headers).is_none()
            && matches!(&parsed, Parsed::Request { params, .. } if era::mentions_meta(params.as_deref())));
    if modern {
        return modern::post(gw, headers, parsed, &profile).await;
    }
    if let Err(r) = check_version(&headers) {
        return r;
    }
    match parsed {
        Parsed::Request { id, method, params } if method == "initialize" => match choose_profile(&gw, &profile) {
            Ok(profile) => initialize(&gw, &id, params.as_deref(), conversation.as_ref(), profile),
            Err(e) => profile_refused(&id, e),
        },
        Parsed::Request { id, method, .. } if method == "server/discover" && session_id(&headers).is_none() => {
            let id: Value = serde_json::from_str(id.get()).unwrap_or(Value::Null);
            rpc_error(StatusCode::OK, id, METHOD_NOT_FOUND, message::DISCOVER_NOT_FOUND)
        }
        Parsed::Request { id, method, params } => {
            let session = match lookup(&gw, &headers, Some(&id)) {
                Ok(s) => s,
                Err(r) => return r,
            };
            respond(session, id, method, params).await
        }
        Parsed::Notification { method, params } => match lookup(&gw, &headers, None) {
            Ok(session) => {
                session.handle_notification(&method, params.as_deref()).await;
                StatusCode::ACCEPTED.into_response()
            }
            Err(r) => r,
        },
        Parsed::Response { id, result, error } => match lookup(&gw, &headers, None) {
            Ok(session) => {
                session.handle_response(&id, result, error).await;
                StatusCode::ACCEPTED.into_response()
            }
            Err(r) => r,
        },
    }
}

/// Runs one request. Answers `application/json`, unless the request causes an upstream request
/// to be relayed to the client before it completes: then the answer switches to
/// `text/event-stream`, carrying the relayed request(s) and finally the response.
async fn respond(session: Arc<Session>, id: Box<RawValue>, method: String, params: Option<Box<RawValue>>) -> Response {
    let (side, mut side_rx) = Lane::new(LANE_MESSAGES, "notifications on a POST's SSE answer");
    let ctx = RequestCtx::on(id.get(), side);
    let trace = coffer_runtime::grpc::current_trace().unwrap_or_default();
    let mut task = tokio::spawn(coffer_runtime::grpc::with_trace(trace, async move {
        let answer = session.handle_request_ctx(&method, params.as_deref(), &ctx).await;
        drop(ctx);
        answer.into_response(&id)
    }));
    let first = tokio::select! {
        biased;
        done = &mut task => {
            return match done {
                Ok(body) => json_response(StatusCode::OK, body),
                Err(e) => {
                    tracing::error!(error = %e, "Request task failed.");
                    rpc_error(StatusCode::INTERNAL_SERVER_ERROR, Value::Null, jsonrpc::INTERNAL_ERROR, "internal error")
                }
            };
        }
        Some(msg) = side_rx.recv() => msg,
    };
    let relayed = futures_util::stream::once(async move { first }).chain(side_rx.into_stream());
    let last = futures_util::stream::once(async move {
        task.await.unwrap_or_else(|_| {
            jsonrpc::error_object(Value::Null, jsonrpc::INTERNAL_ERROR, "internal error", None).to_string()
        })
    });
    let stream = relayed.chain(last).map(|m| Ok::<_, Infallible>(Event::default().data(m)));
    Sse::new(stream).into_response()
}

/// `initialize`: negotiates the version, creates the session, answers as one server.
fn initialize(
    gw: &Gateway,
    id: &RawValue,
    params: Option<&RawValue>,
    conversation: Option<&Arc<str>>,
    profile: Arc<str>,
) -> Response {
    let (session, body) = message::open_session(gw, id, params);
    session.attribute(conversation);
    session.select_profile(profile);
    let mut r = json_response(StatusCode::OK, body);
    r.headers_mut().insert(SESSION_HEADER, HeaderValue::from_str(&session.id).expect("hex id"));
    r
}

/// A session refused for the profile it names: 404 with the JSON-RPC error (naming the profile
/// and `coffer profile list`) answering request `id`.
pub(super) fn profile_refused(id: &RawValue, e: crate::mcp::profile::ProfileError) -> Response {
    let err = crate::mcp::answer::RpcError::from(e);
    let id: Value = serde_json::from_str(id.get()).unwrap_or(Value::Null);
    json_response(StatusCode::NOT_FOUND, jsonrpc::error_object(id, err.code, &err.message, err.data).to_string())
}

/// A JSON-RPC batch: only on a session that negotiated 2025-03-26 (batching was removed in
/// 2025-06-18).
async fn post_batch(gw: Arc<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let session = session_id(&headers).and_then(|id| gw.session(id));
    if session.is_none() && session_id(&headers).is_some() {
        return lookup(&gw, &headers, None).err().expect("unknown session");
    }
    let session = match (message::batch_refused(session.as_deref()), session) {
        (None, Some(s)) => s,
        (refusal, _) => {
            let refusal = refusal.unwrap_or_default();
            return rpc_error(StatusCode::BAD_REQUEST, Value::Null, INVALID_REQUEST, &refusal);
        }
    };
    let items: Vec<Box<RawValue>> = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            return rpc_error(StatusCode::BAD_REQUEST, Value::Null, PARSE_ERROR, &format!("Parse error: {e}"));
        }
    };
    if items.is_empty() {
        return rpc_error(StatusCode::BAD_REQUEST, Value::Null, INVALID_REQUEST, "Invalid Request: empty batch");
    }
    let answers = message::batch_answers(&session, items).await;
    if answers.is_empty() {
        return StatusCode::ACCEPTED.into_response();
    }
    json_response(StatusCode::OK, format!("[{}]", answers.join(",")))
}

/// `GET /mcp`: the session's server→client SSE stream.
async fn get(gw: Arc<Gateway>, headers: HeaderMap) -> Response {
    if !accepts(&headers, "text/event-stream") {
        return rpc_error(
            StatusCode::NOT_ACCEPTABLE,
            Value::Null,
            INVALID_REQUEST,
            "GET /mcp needs Accept: text/event-stream",
        );
    }
    if let Err(r) = check_version(&headers) {
        return r;
    }
    let session = match lookup(&gw, &headers, None) {
        Ok(s) => s,
        Err(r) => return r,
    };
    let last = headers
        .get(coffer_types::header::LAST_EVENT_ID)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let (backlog, rx) = session.outbound.subscribe(last);
    let last_sent = backlog.last().map(|(id, _)| *id).or(last).unwrap_or(0);
    let closed = session.closed.clone();
    let lagging = session.clone();
    let live = tokio_stream::wrappers::BroadcastStream::new(rx)
        .filter_map(move |m| {
            let m = match m {
                Ok(m) => Some(m),
                Err(tokio_stream::wrappers::errors::BroadcastStreamRecvError::Lagged(n)) => {
                    lagging.flow.notifications_dropped.add(n);
                    None
                }
            };
            async move { m.filter(|(id, _)| *id > last_sent) }
        })
        .take_until(async move { closed.cancelled().await });
    let stream = futures_util::stream::iter(backlog)
        .chain(live)
        .map(|(id, msg)| Ok::<_, Infallible>(Event::default().id(id.to_string()).data(msg.as_ref())));
    Sse::new(stream).keep_alive(KeepAlive::default()).into_response()
}

/// `DELETE /mcp`: ends the session and its upstream children.
async fn delete(gw: Arc<Gateway>, headers: HeaderMap) -> Response {
    let Some(id) = session_id(&headers) else {
        return rpc_error(
            StatusCode::BAD_REQUEST,
            Value::Null,
            INVALID_REQUEST,
            "Bad Request: no Mcp-Session-Id header",
        );
    };
    if gw.end_session(id, "DELETE").await {
        StatusCode::NO_CONTENT.into_response()
    } else {
        lookup(&gw, &headers, None).err().unwrap_or_else(|| StatusCode::NOT_FOUND.into_response())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_agent_token_names_a_conversation_and_only_a_well_formed_one() {
        let with = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(coffer_types::mcp::CONVERSATION_HEADER, HeaderValue::from_str(v).unwrap());
            h
        };
        assert_eq!(conversation(true, &with("01JF3Q-abc_9")).as_deref(), Some("01JF3Q-abc_9"));
        assert_eq!(conversation(false, &with("01JF3Q")), None, "the owner's clients are named by clientInfo");
        assert_eq!(conversation(false, &with("01JF3Q")), None);
        assert_eq!(conversation(true, &HeaderMap::new()), None);
        for bad in ["", "a b", "../x", "x;y", &"c".repeat(129)] {
            assert_eq!(conversation(true, &with(bad)), None, "{bad:?}");
        }
    }
}
