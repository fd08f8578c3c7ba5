//! `/mcp` switched to a stream: MCP's stdio framing (newline-delimited JSON-RPC, MCP 2025-11-25
//! basic/transports §stdio) on an HTTP/1.1 connection upgraded with
//! `Upgrade: coffer-mcp-stream` (RFC 9110 §7.8). This is how `coffer-mcp-shim` reaches the
//! gateway: all messages of its session share one connection, many to a read or a write, where
//! Streamable HTTP costs an HTTP exchange per message (docs/BENCHMARKS.md). Every other client
//! keeps using Streamable HTTP on the same path; the session model behind both is the same
//! [`Session`].
//!
//! Handshake: `GET /mcp` over HTTP/1.1 with `Connection: Upgrade`, `Upgrade: coffer-mcp-stream`
//! and the token → `101 Switching Protocols`. The edge's Host/Origin and token checks apply to it
//! as to any request; an unsupported `MCP-Protocol-Version` gets 400. HTTP/2 has no `Upgrade`
//! (a request carrying it is malformed there, RFC 9113 §8.2.2, and hyper resets its stream);
//! an HTTP/1.0 request asking for the stream gets 400.
//!
//! On the stream:
//! - one MCP session per connection, of either era. A legacy session starts with `initialize`;
//!   a modern (2026-07-28) one with the first request carrying `_meta[io.modelcontextprotocol/
//!   protocolVersion]` (a modern `server/discover` is answered without opening one). Before
//!   either, a request gets -32600 (a `server/discover` without `_meta` gets -32601) and a
//!   notification is dropped; a second `initialize` gets -32600. On a modern session every
//!   request is checked (`_meta` version served, else -32022 / -32602), answered with
//!   `resultType`, and never followed by a server→client request (`crate::mcp::session::mrtr`);
//!   `subscriptions/listen` forwards tagged list changes until `notifications/cancelled` names
//!   it; the shim's `ping` without `_meta` is answered;
//! - requests run concurrently and their answers are written as they complete, in any order;
//!   relayed upstream requests (sampling, elicitation, roots), progress and server notifications
//!   are written on the same stream. Answers wait for the client at most
//!   [`MAX_UNWRITTEN_ANSWERS`] at a time (then the gateway stops reading it); everything else
//!   waits in a [`Lane`] of [`LANE_MESSAGES`]: when the client leaves that many unread, further
//!   notifications are dropped (counted, logged once per burst) and relayed requests refused to
//!   their upstream, so a client that stops reading never grows the gateway's memory;
//! - notifications and responses are handled before the next line is read, so they keep the
//!   client's order;
//! - a batch line is accepted only on a session that negotiated 2025-03-26 (one array answers it);
//! - a line that is not JSON-RPC gets the JSON-RPC error for it and the stream goes on; a line
//!   over [`super::MCP_BODY_LIMIT`] gets -32600 with its request id and is skipped unread;
//! - the session ends when the client closes the connection (its upstream children are
//!   terminated). When the session ends first (idle timeout, `DELETE` by session id, daemon
//!   shutdown), the gateway writes what is queued and closes the connection; the client opens a
//!   new one for a new session. A connection that has not initialized within the idle timeout
//!   is closed the same way.
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use coffer_runtime::ndjson::{FrameReader, Input, without_line_breaks};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use serde_json::value::RawValue;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, warn};

use crate::mcp::downstream::era::{self, Refusal};
use crate::mcp::downstream::listen::Filter;
use crate::mcp::downstream::message::{self, Parsed, batch_answers, open_session};
use crate::mcp::jsonrpc::{self, INVALID_REQUEST, METHOD_NOT_FOUND, PARSE_ERROR};
use crate::mcp::session::{Answer, LANE_MESSAGES, Lane, RequestCtx};
use crate::mcp::{Gateway, Session};

/// The `Upgrade` token that switches `/mcp` to a stream.
pub const PROTOCOL: &str = coffer_types::mcp::STREAM_UPGRADE;

/// How long queued answers may take to reach a client after its session ended.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(2);
/// Bytes gathered into one write to the connection at most (more only for a single message).
const WRITE_BATCH_BYTES: usize = 256 * 1024;
/// Lines a client may have sent whose answers are not yet written to it. At the limit the
/// gateway stops reading the connection until the client reads, so a client that sends without
/// reading holds at most this many answers in the gateway's memory.
pub const MAX_UNWRITTEN_ANSWERS: usize = 1024;

/// Whether the request asks for the stream: `Upgrade` lists [`PROTOCOL`] and `Connection`
/// lists `upgrade` (RFC 9110 §7.8: the upgrade option must be named in `Connection`).
pub(in crate::mcp) fn requested(headers: &HeaderMap) -> bool {
    lists(headers, header::UPGRADE, PROTOCOL) && lists(headers, header::CONNECTION, "upgrade")
}

/// Whether the comma-separated list header `name` contains `token` (case-blind).
fn lists(headers: &HeaderMap, name: header::HeaderName, token: &str) -> bool {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|p| p.trim().eq_ignore_ascii_case(token))
}

/// Answers an upgrade request: `101` and the stream served on the switched connection, or 400
/// when the connection cannot switch (HTTP/2).
/// `conversation`: the agent turn's conversation the connection's session records
/// (`X-Coffer-Conversation` from the agent token only; see `http.rs`).
pub(in crate::mcp) fn accept(
    gateway: Arc<Gateway>,
    on_upgrade: Option<hyper::upgrade::OnUpgrade>,
    conversation: Option<Arc<str>>,
    profile: crate::mcp::downstream::http::Requested,
) -> Response {
    let Some(on_upgrade) = on_upgrade else {
        return jsonrpc::http_error(
            StatusCode::BAD_REQUEST,
            INVALID_REQUEST,
            "Upgrade: coffer-mcp-stream needs an HTTP/1.1 connection; otherwise use Streamable HTTP (POST /mcp)",
        );
    };
    let trace = coffer_runtime::grpc::current_trace().unwrap_or_default();
    let span = tracing::info_span!("mcp_stream", trace_id = %trace);
    tokio::spawn(
        async move {
            match on_upgrade.await {
                Ok(upgraded) => serve(gateway, TokioIo::new(upgraded), conversation, profile).await,
                Err(err) => debug!(error = %err, "The /mcp stream upgrade did not complete."),
            }
        }
        .instrument(span),
    );
    let mut r = StatusCode::SWITCHING_PROTOCOLS.into_response();
    r.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    r.headers_mut().insert(header::UPGRADE, HeaderValue::from_static(PROTOCOL));
    r
}

/// Serves one switched connection until the client closes it or its session ends.
async fn serve<IO>(
    gateway: Arc<Gateway>,
    io: IO,
    conversation: Option<Arc<str>>,
    profile: crate::mcp::downstream::http::Requested,
) where
    IO: AsyncRead + AsyncWrite + Send + 'static,
{
    let (read, write) = tokio::io::split(io);
    let (answers, answer_queue) = mpsc::unbounded_channel::<String>();
    let (out, other_queue) = Lane::new(LANE_MESSAGES, "notifications to a /mcp stream");
    let budget = Arc::new(Semaphore::new(MAX_UNWRITTEN_ANSWERS));
    let mut writer = tokio::spawn(write_lines(answer_queue, other_queue, write, budget.clone()));
    let mut conn = Conn {
        gateway,
        answers,
        out,
        budget: budget.clone(),
        session: None,
        listens: HashMap::new(),
        conversation,
        profile,
    };
    let mut reader = FrameReader::new(read, super::MCP_BODY_LIMIT);
    // The session's end, once there is a session: registered with its token once, not per line.
    let mut ended = std::pin::pin!(None::<tokio_util::sync::WaitForCancellationFutureOwned>);
    // A stream that never initializes is idle from its start: it gets the sessions' idle timeout.
    let uninitialized = tokio::time::sleep(conn.gateway.shared.idle_timeout());
    tokio::pin!(uninitialized);
    let why = loop {
        if ended.is_none()
            && let Some(session) = &conn.session
        {
            ended.set(Some(session.closed.clone().cancelled_owned()));
        }
        // Why the connection must end now (the session ended, or it never began in time).
        let initialized = conn.session.is_some();
        let stop = async {
            tokio::select! {
                () = async {
                    match ended.as_mut().as_pin_mut() {
                        Some(ended) => ended.await,
                        None => std::future::pending().await,
                    }
                } => "the session ended",
                () = &mut uninitialized, if !initialized => "no initialize within the idle timeout",
            }
        };
        tokio::pin!(stop);
        // One unit of the budget per line read, given back when its answer is written (or at
        // once when the line gets none): a client that does not read stops being read.
        tokio::select! {
            biased;
            why = &mut stop => break why,
            permit = budget.acquire() => permit.expect("the budget is never closed").forget(),
        }
        let input = tokio::select! {
            biased;
            why = &mut stop => break why,
            input = reader.next() => input,
        };
        match input {
            Ok(Some(Input::Line(line))) => {
                if !conn.on_line(line).await {
                    budget.add_permits(1);
                }
            }
            Ok(Some(Input::Oversized { id, .. })) => {
                warn!(limit_bytes = super::MCP_BODY_LIMIT, id = %id, "Skipped a /mcp stream message over the size limit.");
                conn.send_error(
                    id,
                    INVALID_REQUEST,
                    &format!("Invalid Request: the message is larger than {} bytes", super::MCP_BODY_LIMIT),
                );
            }
            Ok(None) => break "the client closed the stream",
            Err(err) => {
                debug!(error = %err, "Reading the /mcp stream failed.");
                break "the stream broke";
            }
        }
    };
    let Conn { gateway, answers, out, session, .. } = conn;
    drop((answers, out));
    if let Some(session) = session {
        gateway.end_session(&session.id, why).await;
    }
    // Requests still running hold a sender; their upstreams are gone now, so they end soon.
    if tokio::time::timeout(FLUSH_TIMEOUT, &mut writer).await.is_err() {
        writer.abort();
    }
    debug!(reason = why, "The /mcp stream closed.");
}

/// One switched connection: where answers go, and its session once initialized.
struct Conn {
    gateway: Arc<Gateway>,
    /// Answers to the client's lines, one per line that gets one (each holds a unit of `budget`).
    answers: mpsc::UnboundedSender<String>,
    /// Everything else for the client: relayed upstream requests, progress, server
    /// notifications (bounded: see the module docs).
    out: Lane,
    budget: Arc<Semaphore>,
    session: Option<Arc<Session>>,
    /// A modern session's open subscriptions, by `subscriptions/listen` request id (raw JSON).
    listens: HashMap<String, CancellationToken>,
    /// The agent turn's conversation its session records (see [`accept`]).
    conversation: Option<Arc<str>>,
    /// The profile the upgrade request named (`Coffer-Profile`, `/mcp/p/{name}`): checked when
    /// the session starts, refused then with a JSON-RPC error.
    profile: crate::mcp::downstream::http::Requested,
}

impl Conn {
    /// Queues the answer to the line being handled.
    fn send(&self, message: String) {
        // Fails only once the writer is gone (the client went away).
        let _ = self.answers.send(message);
    }

    /// Queues the refusal of the profile the stream named as the answer to request `id`
    /// (returns `true`); the stream stays open without a session.
    fn send_profile_error(&self, id: &RawValue, e: crate::mcp::profile::ProfileError) -> bool {
        let err = crate::mcp::answer::RpcError::from(e);
        self.send(jsonrpc::error_object(raw_id(id), err.code, &err.message, err.data).to_string());
        true
    }

    /// Queues a JSON-RPC error as the answer to the line being handled (returns `true`).
    fn send_error(&self, id: Value, code: i64, message: &str) -> bool {
        self.send(jsonrpc::error_object(id, code, message, None).to_string());
        true
    }

    /// Handles one line; returns whether an answer to it is (or will be) queued on `answers`.
    async fn on_line(&mut self, line: Vec<u8>) -> bool {
        let first = line.iter().copied().find(|b| !b.is_ascii_whitespace());
        match first {
            None => return false, // an empty line carries no message
            Some(b'[') => return self.on_batch(&line),
            Some(_) => {}
        }
        let parsed = match message::decode(&line) {
            Ok(p) => p,
            Err(e) => return self.send_error(e.id, e.code, &e.message),
        };
        let Some(session) = self.session.clone() else {
            return self.before_initialize(parsed);
        };
        if session.modern {
            return self.modern_line(session, parsed).await;
        }
        match parsed {
            Parsed::Request { id, method, .. } if method == "initialize" => self.send_error(
                raw_id(&id),
                INVALID_REQUEST,
                "Invalid Request: the session of this stream is already initialized; open a new stream for a new session",
            ),
            Parsed::Request { id, method, params } => {
                let (answers, side, budget) = (self.answers.clone(), self.out.clone(), self.budget.clone());
                let trace = coffer_runtime::grpc::new_trace_id();
                tokio::spawn(coffer_runtime::grpc::with_trace(trace, async move {
                    let ctx = RequestCtx::on(id.get(), side);
                    match session.handle_request_ctx(&method, params.as_deref(), &ctx).await {
                        // MCP: a request the client cancelled gets no answer; its unit of the
                        // budget comes back here instead of from the writer.
                        Answer::Cancelled => budget.add_permits(1),
                        answer => {
                            let _ = answers.send(answer.into_response(&id));
                        }
                    }
                }));
                true
            }
            Parsed::Notification { method, params } => {
                session.handle_notification(&method, params.as_deref()).await;
                false
            }
            Parsed::Response { id, result, error } => {
                session.handle_response(&id, result, error).await;
                false
            }
        }
    }

    /// A message before `initialize` completed: only `initialize` (and the discovery probe) is
    /// answered.
    fn before_initialize(&mut self, parsed: Parsed) -> bool {
        match parsed {
            Parsed::Request { id, method, params } if method == "initialize" => {
                let profile = match crate::mcp::downstream::http::choose_profile(&self.gateway, &self.profile) {
                    Ok(p) => p,
                    Err(e) => return self.send_profile_error(&id, e),
                };
                let (session, body) = open_session(&self.gateway, &id, params.as_deref());
                session.attribute(self.conversation.as_ref());
                session.select_profile(profile);
                info!(session = %session.id, "MCP session on a /mcp stream.");
                self.forward_outbound(&session);
                self.session = Some(session);
                self.send(body);
                true
            }
            Parsed::Request { id, method, params }
                if method != "initialize" && era::mentions_meta(params.as_deref()) =>
            {
                self.modern_first(id, method, params)
            }
            Parsed::Request { id, method, .. } => {
                let id = raw_id(&id);
                if method == "server/discover" {
                    self.send_error(id, METHOD_NOT_FOUND, message::DISCOVER_NOT_FOUND)
                } else {
                    self.send_error(id, INVALID_REQUEST, "Bad Request: send initialize first")
                }
            }
            Parsed::Notification { method, .. } => {
                debug!(method = %method, "Dropped a notification sent before initialize.");
                false
            }
            Parsed::Response { .. } => {
                debug!("Dropped a response sent before initialize.");
                false
            }
        }
    }

    /// A modern (2026-07-28) request on a stream without a session: `server/discover` is
    /// answered (it opens no session); any other served method opens the stream's session with
    /// the request's `_meta` (as `initialize` would have) and runs on it.
    fn modern_first(&mut self, id: Box<RawValue>, method: String, params: Option<Box<RawValue>>) -> bool {
        let meta = era::meta(params.as_deref());
        let meta = match era::check_version(meta.as_ref()) {
            Ok(m) => m.clone(),
            Err(r) => return self.refuse(&id, &r),
        };
        if let Some(body) = message::sessionless(&method, &id) {
            self.send(body);
            return true;
        }
        if !era::is_modern_method(&method) {
            return self.send_error(raw_id(&id), METHOD_NOT_FOUND, &format!("Method not found: {}", truncate(&method)));
        }
        let profile = match crate::mcp::downstream::http::choose_profile(&self.gateway, &self.profile) {
            Ok(p) => p,
            Err(e) => return self.send_profile_error(&id, e),
        };
        let session = self.gateway.create_session(&meta.version, &meta.init_params());
        session.attribute(self.conversation.as_ref());
        session.select_profile(profile);
        info!(session = %session.id, "MCP 2026-07-28 session on a /mcp stream.");
        self.session = Some(session.clone());
        self.run_modern(session, id, method, params)
    }

    /// A line on a stream whose session is modern.
    async fn modern_line(&mut self, session: Arc<Session>, parsed: Parsed) -> bool {
        match parsed {
            // The shim's own liveness check carries no `_meta`.
            Parsed::Request { id, method, params } if method == "ping" && !era::mentions_meta(params.as_deref()) => {
                self.send(format!("{{\"jsonrpc\":\"2.0\",\"id\":{},\"result\":{{}}}}", id.get()));
                true
            }
            Parsed::Request { id, method, .. } if method == "initialize" => self.send_error(
                raw_id(&id),
                INVALID_REQUEST,
                "Invalid Request: this stream serves MCP 2026-07-28 (requests carry _meta); open a new stream to initialize",
            ),
            Parsed::Request { id, method, params } => {
                let meta = era::meta(params.as_deref());
                if let Err(r) = era::check_version(meta.as_ref()) {
                    return self.refuse(&id, &r);
                }
                if let Some(body) = message::sessionless(&method, &id) {
                    self.send(body);
                    return true;
                }
                if !era::is_modern_method(&method) {
                    return self.send_error(raw_id(&id), METHOD_NOT_FOUND, &format!("Method not found: {}", truncate(&method)));
                }
                self.run_modern(session, id, method, params)
            }
            Parsed::Notification { method, params } => {
                if method == "notifications/cancelled"
                    && let Some(key) = cancelled_id(params.as_deref())
                    && let Some(token) = self.listens.remove(&key)
                {
                    token.cancel();
                    return false;
                }
                session.handle_notification(&method, params.as_deref()).await;
                false
            }
            Parsed::Response { .. } => {
                debug!("Dropped a response from a 2026-07-28 client (input goes in inputResponses).");
                false
            }
        }
    }

    /// Runs a served modern request: `subscriptions/listen` starts forwarding (its answer comes
    /// only at a graceful end, so it holds no unit of the budget); anything else runs in its own
    /// task and is answered when done.
    fn run_modern(
        &mut self,
        session: Arc<Session>,
        id: Box<RawValue>,
        method: String,
        params: Option<Box<RawValue>>,
    ) -> bool {
        if method == "subscriptions/listen" {
            let filter = match Filter::parse(params.as_deref()) {
                Ok(f) => f,
                Err(e) => return self.send_error(raw_id(&id), e.code, &e.message),
            };
            let _ = self.out.deliver(filter.acknowledgment(&id));
            let token = session.closed.child_token();
            self.listens.insert(id.get().to_owned(), token.clone());
            let (_, mut rx) = session.outbound.subscribe(None);
            let out = self.out.clone();
            tokio::spawn(async move {
                loop {
                    let msg = tokio::select! {
                        biased;
                        () = token.cancelled() => return,
                        msg = rx.recv() => msg,
                    };
                    match msg {
                        Ok((_, msg)) => {
                            if let Some(tagged) = filter.tag(&msg, &id)
                                && !out.notify(tagged)
                            {
                                return;
                            }
                        }
                        Err(RecvError::Lagged(n)) => {
                            warn!(skipped = n, "A subscription fell behind; some list changes were dropped.")
                        }
                        Err(RecvError::Closed) => return,
                    }
                }
            });
            return false;
        }
        let (answers, budget, progress) = (self.answers.clone(), self.budget.clone(), self.out.clone());
        let trace = coffer_runtime::grpc::new_trace_id();
        tokio::spawn(coffer_runtime::grpc::with_trace(trace, async move {
            match session.modern_request(&method, params.as_deref(), id.get().to_owned(), Some(progress)).await {
                Answer::Cancelled => budget.add_permits(1),
                answer => {
                    let _ = answers.send(message::modern_response(answer, &method, &id));
                }
            }
        }));
        true
    }

    /// Queues a modern refusal (-32022 with the versions served, or -32602) for request `id`.
    fn refuse(&self, id: &RawValue, refusal: &Refusal) -> bool {
        self.send(refusal.response(raw_id(id)));
        true
    }

    /// Copies the session's server→client messages (notifications, relayed requests that have
    /// no originating request) onto the stream until the session ends.
    fn forward_outbound(&self, session: &Arc<Session>) {
        let (_, mut rx) = session.outbound.subscribe(None);
        let out = self.out.clone();
        let closed = session.closed.clone();
        tokio::spawn(async move {
            loop {
                let msg = tokio::select! {
                    biased;
                    () = closed.cancelled() => return,
                    msg = rx.recv() => msg,
                };
                match msg {
                    Ok((_, msg)) => {
                        if !out.notify(msg.to_string()) {
                            return;
                        }
                    }
                    Err(RecvError::Lagged(n)) => {
                        warn!(skipped = n, "A /mcp stream fell behind its session's messages; some were dropped.");
                    }
                    Err(RecvError::Closed) => return,
                }
            }
        });
    }

    /// A batch line; returns whether an answer to it is (or will be) queued.
    fn on_batch(&mut self, line: &[u8]) -> bool {
        if let Some(refusal) = message::batch_refused(self.session.as_deref()) {
            return self.send_error(Value::Null, INVALID_REQUEST, &refusal);
        }
        let session = self.session.clone().expect("a session that may batch");
        let items: Vec<Box<RawValue>> = match serde_json::from_slice(line) {
            Ok(v) => v,
            Err(e) => return self.send_error(Value::Null, PARSE_ERROR, &format!("Parse error: {e}")),
        };
        if items.is_empty() {
            return self.send_error(Value::Null, INVALID_REQUEST, "Invalid Request: empty batch");
        }
        let (out, budget) = (self.answers.clone(), self.budget.clone());
        tokio::spawn(async move {
            let answers = batch_answers(&session, items).await;
            if answers.is_empty() {
                budget.add_permits(1); // only notifications and responses: nothing to write
            } else {
                let _ = out.send(format!("[{}]", answers.join(",")));
            }
        });
        true
    }
}

/// `params.requestId` of a `notifications/cancelled`, as raw JSON text.
fn cancelled_id(params: Option<&RawValue>) -> Option<String> {
    let p: Value = serde_json::from_str(params?.get()).ok()?;
    p.get("requestId").map(Value::to_string)
}

fn truncate(s: &str) -> String {
    s.chars().take(100).collect()
}

fn raw_id(id: &RawValue) -> Value {
    serde_json::from_str(id.get()).unwrap_or(Value::Null)
}

/// The one writer of a stream: each message and a `\n`, gathering what is queued into one
/// write; after the write, gives back a unit of `budget` per answer written. Raw CR and LF can
/// only be insignificant whitespace in valid JSON (an upstream may answer pretty-printed), so
/// they are dropped to keep one message per line. Ends when both queues have ended.
///
/// `other` is looked at first, then `answers`, one message of each in turn: a call's progress,
/// queued before its answer, is written before it (MCP: no progress after the response), and
/// neither queue starves the other.
async fn write_lines<W: AsyncWrite + Unpin>(
    mut answers: mpsc::UnboundedReceiver<String>,
    mut other: crate::mcp::flow::LaneRx,
    mut write: W,
    budget: Arc<Semaphore>,
) {
    let mut buf = Vec::with_capacity(16 * 1024);
    let (mut answers_open, mut other_open) = (true, true);
    while answers_open || other_open {
        let mut written_answers = 0;
        tokio::select! {
            biased;
            msg = other.recv(), if other_open => match msg {
                Some(msg) => push_line(&mut buf, &msg),
                None => other_open = false,
            },
            msg = answers.recv(), if answers_open => match msg {
                Some(msg) => {
                    push_line(&mut buf, &msg);
                    written_answers += 1;
                }
                None => answers_open = false,
            },
        }
        while buf.len() < WRITE_BATCH_BYTES {
            let mut took = false;
            if let Ok(msg) = other.try_recv() {
                push_line(&mut buf, &msg);
                took = true;
            }
            if let Ok(msg) = answers.try_recv() {
                push_line(&mut buf, &msg);
                written_answers += 1;
                took = true;
            }
            if !took {
                break;
            }
        }
        if buf.is_empty() {
            continue;
        }
        if let Err(err) = write.write_all(&buf).await {
            debug!(error = %err, "Writing the /mcp stream failed; the client went away.");
            return;
        }
        buf.clear();
        budget.add_permits(written_answers);
    }
    let _ = write.shutdown().await;
}

fn push_line(buf: &mut Vec<u8>, msg: &str) {
    buf.extend_from_slice(&without_line_breaks(msg.as_bytes()));
    buf.push(b'\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_upgrade_needs_both_headers_and_is_found_in_lists_case_blind() {
        let mut h = HeaderMap::new();
        assert!(!requested(&h));
        h.insert(header::CONNECTION, HeaderValue::from_static("keep-alive, Upgrade"));
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        assert!(!requested(&h));
        h.insert(header::UPGRADE, HeaderValue::from_static("h2c, Coffer-MCP-Stream"));
        assert!(requested(&h));
        h.remove(header::CONNECTION);
        assert!(!requested(&h), "Upgrade without Connection: upgrade is no upgrade request");
    }

    #[tokio::test]
    async fn lines_are_gathered_and_stay_single_lines() {
        let (tx, rx) = mpsc::unbounded_channel();
        let (w, mut r) = tokio::io::duplex(1024);
        let (other_tx, other_rx) = Lane::new(1, "test");
        let budget = Arc::new(Semaphore::new(0));
        tx.send("{\"a\":1}".to_owned()).unwrap();
        tx.send("{\n  \"b\": \"x\\ny\"\r\n}".to_owned()).unwrap();
        drop((tx, other_tx));
        write_lines(rx, other_rx, w, budget.clone()).await;
        assert_eq!(budget.available_permits(), 2, "a unit back per answer written");
        let mut s = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut r, &mut s).await.unwrap();
        assert_eq!(s, "{\"a\":1}\n{  \"b\": \"x\\ny\"}\n");
        let v: Value = serde_json::from_str(s.lines().nth(1).unwrap()).unwrap();
        assert_eq!(v["b"], "x\ny");
    }
}
