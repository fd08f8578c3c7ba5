//! Streamable HTTP upstreams (MCP 2025-11-25, basic/transports §Streamable HTTP, client side):
//! one upstream MCP session over HTTP that behaves exactly like a stdio upstream.
//!
//! Every JSON-RPC message is its own `POST` to the MCP endpoint. Each `POST`'s answer is read
//! by a task of its own, so any number of requests can be in flight: `202 Accepted` carries
//! nothing, `application/json` one message (or a batch), `text/event-stream` any number of
//! messages ending with the response. After `initialize`, a `GET` stream carries the server's
//! own notifications and requests. Every message received goes to [`Core::dispatch`]. An
//! unreachable upstream or an expired upstream session (404, or a 400 that names the session)
//! ends in [`Core::close`], so the
//! downstream session starts a new upstream session on its next call; a request whose `POST`
//! failed (non-2xx, HTML, invalid JSON, a stream that ended early) ends in [`Core::fail`] with
//! -32001 and a message naming the upstream and the HTTP status.
//!
//! Who ends what: every task (one per `POST` answer, the `GET` listener) lives in the
//! transport's `JoinSet` and stops when the transport's cancellation token fires;
//! [`HttpTransport::close`] cancels and awaits them, dropping the transport aborts them. A task
//! also stops by itself once nobody waits for what it reads (the request timed out, the
//! upstream closed).
//!
//! No secret reaches a log or an error message: configured header values are marked sensitive
//! and redacted from quoted error bodies, URLs are shown without user info, query or fragment.
//!
//! Only `http://` is supported: reqwest 0.13 offers rustls with the `ring` provider only as
//! `rustls-no-provider`, and that feature, unified across the workspace, makes every
//! `reqwest::Client` in every Coffer binary panic unless a provider was installed first.
//! `https://` URLs use rustls (ring provider) with the platform's certificate verifier.
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use coffer_proto::store::McpServer;
use coffer_types::sse::SseParser;
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use reqwest::{Method, Response, StatusCode, Url};
use secrecy::{ExposeSecret, SecretString};
use serde_json::value::RawValue;
use tokio::sync::oneshot;
use tokio::task::JoinSet;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use crate::mcp::jsonrpc::UPSTREAM_UNAVAILABLE;
use crate::mcp::upstream::{Core, MAX_FRAME, UpstreamError, trim_line};

const MCP_SESSION_ID: HeaderName = HeaderName::from_static("mcp-session-id");
const MCP_PROTOCOL_VERSION: HeaderName = HeaderName::from_static("mcp-protocol-version");
const MCP_METHOD: HeaderName = HeaderName::from_static("mcp-method");
const MCP_NAME: HeaderName = HeaderName::from_static("mcp-name");
const LAST_EVENT_ID: HeaderName = HeaderName::from_static("last-event-id");
const ACCEPT_POST: &str = "application/json, text/event-stream";
const EVENT_STREAM: &str = "text/event-stream";
const JSON: &str = "application/json";

/// Longest wait for a TCP connection to the upstream.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest wait in `send` for the server to accept a notification or response (202).
const ACCEPT_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest wait for the session `DELETE` at close.
const DELETE_TIMEOUT: Duration = Duration::from_secs(2);
/// After the response arrived on a `POST` stream, how long the server gets to end the stream.
const DRAIN_GRACE: Duration = Duration::from_secs(5);
/// How often a reader checks that someone still waits for what it reads.
const CHECK_EVERY: Duration = Duration::from_secs(1);
/// Reconnection delay when the server sent no `retry`, and the first step of the backoff.
const RECONNECT_BASE: Duration = Duration::from_secs(1);
/// Longest backoff between two failed `GET` stream connections.
const RECONNECT_MAX: Duration = Duration::from_secs(30);
/// Most consecutive resumptions of one `POST` stream that deliver no event.
const MAX_RESUMES: u32 = 5;
/// Bytes of an error body read to quote in an error message.
const ERROR_BODY_LIMIT: usize = 64 * 1024;
/// Longest wait for an error body.
const ERROR_BODY_TIMEOUT: Duration = Duration::from_secs(5);
/// Characters of an error body quoted in an error message.
const SNIPPET_CHARS: usize = 200;
/// Headers the transport sets itself; a server's configured headers may not replace them.
const MANAGED_HEADERS: [&str; 11] = [
    "accept",
    "content-type",
    "content-length",
    "transfer-encoding",
    "host",
    "connection",
    "mcp-session-id",
    "mcp-protocol-version",
    "mcp-method",
    "mcp-name",
    "last-event-id",
];

/// The request metadata headers of a stateless-revision POST (MCP 2026-07-28
/// basic/transports/streamable-http §Request Metadata): the protocol version, the method and,
/// for `tools/call`, `resources/read` and `prompts/get`, the name (already encoded, see
/// `upstream_era::header_value`).
#[derive(Debug, Clone)]
pub struct Mirror {
    pub version: &'static str,
    pub method: String,
    pub name: Option<String>,
}

/// Client side of one upstream Streamable HTTP session (MCP 2025-11-25, basic/transports
/// §Streamable HTTP). Created by `Upstream::start` for a server whose transport is `"http"`.
pub struct HttpTransport {
    inner: Arc<Inner>,
    tasks: Mutex<JoinSet<()>>,
    listening: AtomicBool,
    closing: AtomicBool,
}

/// What the transport's tasks share.
struct Inner {
    core: Arc<Core>,
    client: reqwest::Client,
    url: Url,
    /// `url` without user info, query or fragment: the only form that is logged or shown.
    shown_url: String,
    /// The server's configured headers, values marked sensitive.
    headers: HeaderMap,
    /// Configured header values (and their long words), redacted from quoted error bodies.
    secrets: Vec<SecretString>,
    /// `Mcp-Session-Id` from the `initialize` answer.
    session_id: Mutex<Option<HeaderValue>>,
    /// `MCP-Protocol-Version`, known once `initialize` succeeded.
    protocol_version: Mutex<Option<HeaderValue>>,
    /// Fires when the transport closes or the upstream session expired; stops every task.
    cancel: CancellationToken,
    /// The server no longer knows our session id: there is nothing left to `DELETE`.
    expired: AtomicBool,
    /// Why this transport closed the core (for errors of sends that race with it).
    close_reason: Mutex<String>,
    /// The upstream speaks the stateless revision: no session id is kept, no `GET` stream
    /// opened, no `DELETE` sent.
    stateless: AtomicBool,
}

impl HttpTransport {
    /// Prepares a client for `server.url` with `server.headers`; nothing is sent until the
    /// first [`HttpTransport::send`] (the `initialize` request).
    ///
    /// # Errors
    /// A message (never quoting a header value or the URL) when the URL is missing, not
    /// `http://` or `https://`, or a header name or
    /// value is not valid HTTP or names a header the transport sets itself.
    pub fn new(server: &McpServer, core: Arc<Core>) -> Result<Self, String> {
        let url = parse_url(&server.url)?;
        let mut headers = HeaderMap::new();
        let mut secrets = Vec::new();
        for (name, value) in &server.headers {
            let header =
                HeaderName::from_bytes(name.as_bytes()).map_err(|_| format!("header name {name:?} is not valid"))?;
            if MANAGED_HEADERS.contains(&header.as_str()) {
                return Err(format!("header {name:?} is set by the transport and cannot be configured"));
            }
            let mut v =
                HeaderValue::from_str(value).map_err(|_| format!("the value of header {name:?} is not valid"))?;
            v.set_sensitive(true);
            headers.append(header, v);
            let value = value.trim();
            if value.len() >= 4 {
                secrets.push(value.to_owned());
            }
            secrets.extend(value.split_whitespace().filter(|w| w.len() >= 8 && *w != value).map(str::to_owned));
        }
        // Longest first, so a whole value is redacted before any word of it.
        secrets.sort_by_key(|s: &String| std::cmp::Reverse(s.len()));
        let secrets = secrets.into_iter().map(SecretString::from).collect();
        // Redirects stay off: following one would send the configured headers (credentials)
        // to wherever the server points. An MCP endpoint answers where it is registered.
        coffer_runtime::tls::ensure_provider();
        let client = reqwest::Client::builder()
            .no_proxy()
            .connect_timeout(CONNECT_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .pool_idle_timeout(Duration::from_secs(90))
            .tcp_nodelay(true)
            .build()
            .map_err(|e| format!("HTTP client: {e}"))?;
        let shown_url = shown_url(&url);
        Ok(Self {
            inner: Arc::new(Inner {
                core,
                client,
                url,
                shown_url,
                headers,
                secrets,
                session_id: Mutex::new(None),
                protocol_version: Mutex::new(None),
                cancel: CancellationToken::new(),
                expired: AtomicBool::new(false),
                close_reason: Mutex::new(String::new()),
                stateless: AtomicBool::new(false),
            }),
            tasks: Mutex::new(JoinSet::new()),
            listening: AtomicBool::new(false),
            closing: AtomicBool::new(false),
        })
    }

    /// Records the negotiated protocol version (sent as `MCP-Protocol-Version` on every later
    /// request; nothing when empty) and opens the `GET` stream for server-to-client messages.
    pub fn initialized(&self, protocol_version: &str) {
        if !protocol_version.is_empty()
            && let Ok(v) = HeaderValue::from_str(protocol_version)
        {
            *self.inner.protocol_version.lock().expect("version") = Some(v);
        }
        if self.inner.cancel.is_cancelled() || self.listening.swap(true, Ordering::AcqRel) {
            return;
        }
        self.spawn(self.inner.clone().listen());
    }

    /// Switches to the stateless revision (MCP 2026-07-28 basic/transports/streamable-http):
    /// every later POST carries the [`Mirror`] headers its request gives, and there is no
    /// session, no `GET` stream and no `DELETE`.
    pub fn stateless(&self) {
        self.inner.stateless.store(true, Ordering::Release);
        *self.inner.session_id.lock().expect("session") = None;
    }

    /// POSTs one complete JSON-RPC message (`line`); `mirror`: the stateless revision's
    /// request headers for it. For a request (`request_id` set) this
    /// returns at once and a task reads the answer, feeding every message to the core (or
    /// failing that request with -32001). For a notification or a response it waits until the
    /// server accepted it (at most 5 s), so that it reaches the server before anything sent
    /// after it: `notifications/initialized` must precede the first request.
    ///
    /// # Errors
    /// [`UpstreamError::Closed`] when the transport is closed, the upstream is unreachable, or
    /// its session expired.
    pub async fn send(
        &self,
        line: String,
        request_id: Option<u64>,
        mirror: Option<Box<Mirror>>,
    ) -> Result<(), UpstreamError> {
        if self.inner.cancel.is_cancelled() || !self.inner.core.is_alive() {
            return Err(self.inner.closed_error());
        }
        let inner = self.inner.clone();
        if request_id.is_some() {
            self.spawn(inner.post(line, request_id, None, mirror));
            return Ok(());
        }
        let (accepted, answered) = oneshot::channel();
        self.spawn(inner.post(line, None, Some(accepted), mirror));
        // Either outcome of the channel means the POST's status is known (or the task ended).
        let _ = tokio::time::timeout(ACCEPT_TIMEOUT, answered).await;
        if self.inner.core.is_alive() { Ok(()) } else { Err(self.inner.closed_error()) }
    }

    /// Ends the upstream session: stops every task (aborting reads in progress), then sends
    /// `DELETE` with the session id (at most 2 s; errors, including 405, are ignored).
    pub async fn close(&self) {
        if self.closing.swap(true, Ordering::AcqRel) {
            return;
        }
        self.inner.cancel.cancel();
        let mut tasks = std::mem::take(&mut *self.tasks.lock().expect("tasks"));
        tasks.shutdown().await;
        self.inner.delete_session().await;
    }

    /// Runs `task` in the transport's task set until it ends or the transport is cancelled.
    fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        let mut tasks = self.tasks.lock().expect("tasks");
        while let Some(done) = tasks.try_join_next() {
            if let Err(e) = done
                && e.is_panic()
            {
                tracing::error!(server = %self.inner.core.server, "An HTTP upstream task panicked.");
            }
        }
        let cancel = self.inner.cancel.clone();
        tasks.spawn(async move {
            tokio::select! {
                _ = cancel.cancelled() => {}
                _ = task => {}
            }
        });
    }
}

impl Drop for HttpTransport {
    fn drop(&mut self) {
        // The JoinSet aborts its tasks when dropped; the token also stops any task that is
        // between two polls.
        self.inner.cancel.cancel();
    }
}

/// An answer to a message that carried the session id, checked for the session being gone.
enum Checked {
    /// The session is gone; the core is closed.
    Expired,
    /// A 400 that does not concern the session, its body already read.
    Refused { status: StatusCode, ctype: String, snippet: String },
    /// Anything else, for the caller to handle.
    Answer(Response),
}

/// How one SSE response ended.
#[derive(Debug)]
enum StreamEnd {
    /// The server ended it.
    Ended,
    /// Reading failed (connection reset, …).
    Failed(String),
    /// The response to its request was read (and the server ended the stream or its grace ran out).
    Answered,
    /// Nobody waits for it any more: the request timed out or the upstream closed.
    Unwanted,
}

impl Inner {
    /// A request builder carrying the configured headers, the session id and the protocol
    /// version; and whether it carries a session id (a 404 then means the session expired).
    fn request(&self, method: Method) -> (reqwest::RequestBuilder, bool) {
        let mut headers = self.headers.clone();
        let session = self.session_id.lock().expect("session").clone();
        let has_session = session.is_some();
        if let Some(s) = session {
            headers.insert(MCP_SESSION_ID, s);
        }
        if let Some(v) = self.protocol_version.lock().expect("version").clone() {
            headers.insert(MCP_PROTOCOL_VERSION, v);
        }
        (self.client.request(method, self.url.clone()).headers(headers), has_session)
    }

    /// POSTs `body` and handles the answer. `accepted` is dropped once the status is known.
    async fn post(
        self: Arc<Self>,
        body: String,
        request_id: Option<u64>,
        accepted: Option<oneshot::Sender<()>>,
        mirror: Option<Box<Mirror>>,
    ) {
        let (mut rb, had_session) = self.request(Method::POST);
        let stateless = mirror.is_some();
        if let Some(m) = mirror {
            rb = rb.header(MCP_PROTOCOL_VERSION, m.version);
            if let Ok(v) = HeaderValue::from_str(&m.method) {
                rb = rb.header(MCP_METHOD, v);
            }
            if let Some(v) = m.name.and_then(|n| HeaderValue::from_str(&n).ok()) {
                rb = rb.header(MCP_NAME, v);
            }
        }
        let rb = rb.header(CONTENT_TYPE, JSON).header(ACCEPT, ACCEPT_POST).body(body);
        let resp = match rb.send().await {
            Ok(r) => r,
            Err(e) => return self.send_failed(request_id, e),
        };
        // A stateless request (or the probe) never starts a session, even if a server sends an
        // id with its answer.
        if !stateless {
            self.capture_session(&resp);
        }
        let resp = match self.check_session(resp, had_session).await {
            Checked::Expired => return,
            Checked::Refused { status, ctype, snippet } => {
                drop(accepted);
                return self.refused(status, &ctype, &snippet, request_id);
            }
            Checked::Answer(resp) => resp,
        };
        drop(accepted);
        self.answer(resp, request_id).await;
    }

    /// Checks the answer to a message that carried our session id (`had_session`) for the
    /// session being gone: 404 (MCP 2025-11-25 §Session Management), or 400 whose body names
    /// the session, which is how servers built on the TypeScript SDK's examples
    /// (server-everything among them) answer an id they do not know, e.g. after a restart.
    /// Expires the session then.
    async fn check_session(&self, resp: Response, had_session: bool) -> Checked {
        let status = resp.status();
        if !had_session || !matches!(status, StatusCode::NOT_FOUND | StatusCode::BAD_REQUEST) {
            return Checked::Answer(resp);
        }
        if status == StatusCode::NOT_FOUND {
            self.expire(status);
            return Checked::Expired;
        }
        let ctype = content_type(&resp);
        let snippet = self.snippet(resp, &ctype).await;
        if snippet.to_ascii_lowercase().contains("session") {
            self.expire(status);
            return Checked::Expired;
        }
        Checked::Refused { status, ctype, snippet }
    }

    /// Reports a non-2xx answer; fails request `request_id` with it.
    fn refused(&self, status: StatusCode, ctype: &str, snippet: &str, request_id: Option<u64>) {
        let msg = format!("upstream {} answered HTTP {status}{}: {snippet}", self.core.server, ctype_note(ctype));
        tracing::warn!(server = %self.core.server, url = %self.shown_url, status = status.as_u16(), content_type = %ctype, request_id, "Upstream refused a POST.");
        if let Some(id) = request_id {
            self.core.fail(id, UPSTREAM_UNAVAILABLE, &msg);
        }
    }

    /// A request could not be sent or got no HTTP answer.
    fn send_failed(&self, request_id: Option<u64>, err: reqwest::Error) {
        let connect = err.is_connect();
        let why = describe(err);
        if connect {
            tracing::warn!(server = %self.core.server, url = %self.shown_url, error = %why, "Upstream unreachable.");
            self.close_core(&format!("unreachable at {} ({why})", self.shown_url));
        } else if let Some(id) = request_id {
            tracing::warn!(server = %self.core.server, url = %self.shown_url, request_id = id, error = %why, "POST to upstream failed.");
            self.core.fail(
                id,
                UPSTREAM_UNAVAILABLE,
                &format!("upstream {} could not be reached: {why}", self.core.server),
            );
        } else {
            tracing::warn!(server = %self.core.server, url = %self.shown_url, error = %why, "Upstream did not take a notification.");
        }
    }

    /// Keeps the session id of the first answer that carries one (the `initialize` answer).
    fn capture_session(&self, resp: &Response) {
        let Some(v) = resp.headers().get(MCP_SESSION_ID) else { return };
        let mut session = self.session_id.lock().expect("session");
        if session.is_some() {
            return;
        }
        // The spec allows visible ASCII only; anything else could not be sent back anyway.
        if v.is_empty() || !v.as_bytes().iter().all(|b| (0x21..=0x7e).contains(b)) {
            tracing::warn!(server = %self.core.server, "Upstream sent an invalid Mcp-Session-Id; ignored.");
            return;
        }
        let mut v = v.clone();
        v.set_sensitive(true);
        *session = Some(v);
    }

    /// The server no longer knows our session (it answered `status`): close, so the next call
    /// starts a new upstream session.
    fn expire(&self, status: StatusCode) {
        if self.expired.swap(true, Ordering::AcqRel) {
            return;
        }
        let status = status.as_u16();
        tracing::info!(server = %self.core.server, url = %self.shown_url, status, "Upstream session expired; the next call starts a new one.");
        self.close_core(&format!("upstream session expired (HTTP {status})"));
        self.cancel.cancel();
    }

    fn close_core(&self, reason: &str) {
        {
            let mut r = self.close_reason.lock().expect("reason");
            if r.is_empty() {
                *r = reason.to_owned();
            }
        }
        self.core.close(reason);
    }

    fn closed_error(&self) -> UpstreamError {
        let reason = self.close_reason.lock().expect("reason").clone();
        UpstreamError::Closed {
            server: self.core.server.clone(),
            reason: if reason.is_empty() { "closed".into() } else { reason },
        }
    }

    /// Handles a `POST` answer by status and content type.
    async fn answer(&self, resp: Response, request_id: Option<u64>) {
        let status = resp.status();
        let ctype = content_type(&resp);
        tracing::debug!(server = %self.core.server, status = status.as_u16(), content_type = %ctype, request_id, "Upstream answered a POST.");
        if status == StatusCode::ACCEPTED {
            // Nothing to read. A request answered 202 stays pending: its response may still
            // come on the GET stream, and the request's own timeout covers it.
            return;
        }
        if !status.is_success() {
            let snippet = self.snippet(resp, &ctype).await;
            return self.refused(status, &ctype, &snippet, request_id);
        }
        if ctype == EVENT_STREAM {
            return self.read_post_stream(resp, request_id).await;
        }
        let body = match self.while_wanted(request_id, read_body(resp, MAX_FRAME, false)).await {
            None => return,
            Some(Ok(b)) => b,
            Some(Err(why)) => {
                tracing::warn!(server = %self.core.server, url = %self.shown_url, error = %why, request_id, "Reading an upstream answer failed.");
                if let Some(id) = request_id {
                    let msg = format!("upstream {}: reading its answer failed: {why}", self.core.server);
                    self.core.fail(id, UPSTREAM_UNAVAILABLE, &msg);
                }
                return;
            }
        };
        // Other content types are still read as JSON when they parse: some servers omit the
        // header. A body that does not parse is reported with the type that was claimed.
        let trimmed = trim_line(&body);
        if trimmed.first() == Some(&b'[') {
            // A JSON-RPC batch (allowed by earlier protocol revisions).
            if let Ok(items) = serde_json::from_slice::<Vec<&RawValue>>(trimmed) {
                for item in items {
                    self.core.dispatch(item.get().as_bytes());
                }
            }
        } else if !trimmed.is_empty() {
            self.core.dispatch(trimmed);
        }
        let Some(id) = request_id.filter(|id| self.core.is_pending(*id)) else { return };
        let is_json = serde_json::from_slice::<serde::de::IgnoredAny>(trimmed).is_ok();
        let snippet = self.sanitize(&body[..body.len().min(ERROR_BODY_LIMIT)], &ctype);
        let msg = if is_json {
            format!("upstream {} answered HTTP {status} without a response to the request: {snippet}", self.core.server)
        } else if ctype == JSON {
            format!(
                "upstream {} answered HTTP {status} (application/json) with a body that is not JSON: {snippet}",
                self.core.server
            )
        } else {
            format!(
                "upstream {} answered HTTP {status}{}, not JSON or an SSE stream: {snippet}",
                self.core.server,
                ctype_note(&ctype)
            )
        };
        tracing::warn!(server = %self.core.server, url = %self.shown_url, status = status.as_u16(), content_type = %ctype, request_id = id, "Upstream answer unusable.");
        self.core.fail(id, UPSTREAM_UNAVAILABLE, &msg);
    }

    /// Reads a `POST`'s SSE stream. If it ends before the response to `request_id` and events
    /// carried ids, resumes it with `GET` + `Last-Event-ID` after the server's `retry` delay
    /// (MCP 2025-11-25 §Resumability and Redelivery); otherwise fails the request.
    async fn read_post_stream(&self, resp: Response, request_id: Option<u64>) {
        let mut parser = SseParser::with_limit(MAX_FRAME);
        let mut resp = resp;
        let mut resumes = 0;
        loop {
            let before = parser.events_seen();
            let end = self.pump(resp, &mut parser, request_id).await;
            let Some(id) = request_id else { return };
            let why = match end {
                StreamEnd::Answered | StreamEnd::Unwanted => return,
                StreamEnd::Ended => "the server ended it".to_owned(),
                StreamEnd::Failed(e) => e,
            };
            if !self.core.is_pending(id) || !self.core.is_alive() {
                return;
            }
            if parser.events_seen() > before {
                resumes = 0;
            }
            let server = &self.core.server;
            let Some(last) = parser.last_event_id().map(str::to_owned) else {
                let msg = format!("upstream {server} ended the SSE stream of its answer before responding ({why})");
                tracing::warn!(server = %server, url = %self.shown_url, request_id = id, reason = %why, "Upstream stream ended before the response.");
                return self.core.fail(id, UPSTREAM_UNAVAILABLE, &msg);
            };
            if resumes == MAX_RESUMES {
                let msg = format!(
                    "upstream {server} ended the SSE stream of its answer {MAX_RESUMES} times without an event"
                );
                return self.core.fail(id, UPSTREAM_UNAVAILABLE, &msg);
            }
            resumes += 1;
            let delay = parser.retry().unwrap_or(RECONNECT_BASE);
            tracing::debug!(server = %server, request_id = id, delay_ms = delay.as_millis() as u64, "Resuming an upstream SSE stream.");
            if self.while_wanted(Some(id), tokio::time::sleep(delay)).await.is_none() {
                return;
            }
            resp = match self.resume(&last).await {
                Ok(r) => r,
                Err(msg) => return self.core.fail(id, UPSTREAM_UNAVAILABLE, &msg),
            };
            parser.start_new_response();
        }
    }

    /// `GET` with `Last-Event-ID: last`; the response when it is an SSE stream.
    async fn resume(&self, last: &str) -> Result<Response, String> {
        let server = &self.core.server;
        let last = HeaderValue::from_str(last).map_err(|_| format!("upstream {server} sent an unusable event id"))?;
        let (rb, had_session) = self.request(Method::GET);
        let resp = match rb.header(ACCEPT, EVENT_STREAM).header(LAST_EVENT_ID, last).send().await {
            Ok(r) => r,
            Err(e) => {
                let connect = e.is_connect();
                let why = describe(e);
                if connect {
                    self.close_core(&format!("unreachable at {} ({why})", self.shown_url));
                }
                return Err(format!("upstream {server}: resuming its SSE stream failed: {why}"));
            }
        };
        let (status, ctype, snippet) = match self.check_session(resp, had_session).await {
            Checked::Expired => return Err(self.closed_error().to_string()),
            Checked::Refused { status, ctype, snippet } => (status, ctype, snippet),
            Checked::Answer(resp) => {
                let (status, ctype) = (resp.status(), content_type(&resp));
                if status.is_success() && ctype == EVENT_STREAM {
                    return Ok(resp);
                }
                (status, ctype.clone(), self.snippet(resp, &ctype).await)
            }
        };
        Err(format!(
            "upstream {server} could not resume its SSE stream: HTTP {status}{}: {snippet}",
            ctype_note(&ctype)
        ))
    }

    /// Reads one SSE response, dispatching each event's data, until it ends, the response to
    /// `request_id` was read (then the server has [`DRAIN_GRACE`] to end it), or nobody waits.
    async fn pump(&self, mut resp: Response, parser: &mut SseParser, request_id: Option<u64>) -> StreamEnd {
        let mut events = Vec::new();
        let mut check = tokio::time::interval(CHECK_EVERY);
        check.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut answered_at: Option<Instant> = None;
        loop {
            tokio::select! {
                chunk = resp.chunk() => match chunk {
                    Ok(Some(bytes)) => {
                        parser.push(&bytes, &mut events);
                        if parser.take_oversized() {
                            tracing::warn!(server = %self.core.server, limit = MAX_FRAME, "Upstream SSE event over the limit; discarded.");
                        }
                        // MCP sends only `message` events; others (a ping) carry no JSON-RPC.
                        for event in events.drain(..).filter(|e| e.is_message() && !e.data.is_empty()) {
                            self.core.dispatch(&event.data);
                        }
                        if let Some(id) = request_id
                            && answered_at.is_none()
                            && !self.core.is_pending(id)
                        {
                            answered_at = Some(Instant::now());
                        }
                    }
                    Ok(None) if answered_at.is_some() => return StreamEnd::Answered,
                    Ok(None) => return StreamEnd::Ended,
                    Err(_) if answered_at.is_some() => return StreamEnd::Answered,
                    Err(e) => return StreamEnd::Failed(describe(e)),
                },
                _ = check.tick() => {
                    if !self.core.is_alive() {
                        return StreamEnd::Unwanted;
                    }
                    match (request_id, answered_at) {
                        (_, Some(at)) if at.elapsed() >= DRAIN_GRACE => {
                            tracing::debug!(server = %self.core.server, "Upstream kept a stream open after the response; dropped it.");
                            return StreamEnd::Answered;
                        }
                        (Some(id), None) if !self.core.is_pending(id) => return StreamEnd::Unwanted,
                        _ => {}
                    }
                }
            }
        }
    }

    /// The `GET` stream (MCP 2025-11-25 §Listening for Messages from the Server): dispatches
    /// the server's notifications and requests; reconnects with `Last-Event-ID` after the
    /// server's `retry` or a bounded backoff while the upstream is alive; stops on 405 (no
    /// stream offered) or another client error.
    async fn listen(self: Arc<Self>) {
        let server = self.core.server.clone();
        let mut parser = SseParser::with_limit(MAX_FRAME);
        let mut failures: u32 = 0;
        loop {
            if !self.core.is_alive() {
                return;
            }
            let (rb, had_session) = self.request(Method::GET);
            let mut rb = rb.header(ACCEPT, EVENT_STREAM);
            if let Some(last) = parser.last_event_id()
                && let Ok(v) = HeaderValue::from_str(last)
            {
                rb = rb.header(LAST_EVENT_ID, v);
            }
            match rb.send().await {
                Err(e) if e.is_connect() => {
                    let why = describe(e);
                    tracing::warn!(server = %server, url = %self.shown_url, error = %why, "Upstream unreachable.");
                    return self.close_core(&format!("unreachable at {} ({why})", self.shown_url));
                }
                Err(e) => {
                    failures += 1;
                    tracing::debug!(server = %server, error = %describe(e), "Upstream GET stream failed; retrying.");
                }
                Ok(resp) => {
                    let resp = match self.check_session(resp, had_session).await {
                        Checked::Expired => return,
                        Checked::Refused { status, ctype, .. } => {
                            tracing::warn!(server = %server, url = %self.shown_url, status = status.as_u16(), content_type = %ctype, "Upstream GET stream unusable; its own messages arrive only on POST streams.");
                            return;
                        }
                        Checked::Answer(resp) => resp,
                    };
                    let status = resp.status();
                    let ctype = content_type(&resp);
                    if status == StatusCode::METHOD_NOT_ALLOWED {
                        tracing::debug!(server = %server, "Upstream offers no GET stream (HTTP 405).");
                        return;
                    }
                    if status.is_success() && ctype == EVENT_STREAM {
                        parser.start_new_response();
                        let before = parser.events_seen();
                        let end = self.pump(resp, &mut parser, None).await;
                        if matches!(end, StreamEnd::Unwanted) {
                            return;
                        }
                        failures = if parser.events_seen() > before { 0 } else { failures + 1 };
                        tracing::debug!(server = %server, end = ?end, "Upstream GET stream ended; reconnecting.");
                    } else if status.is_server_error() || matches!(status.as_u16(), 408 | 409 | 425 | 429) {
                        failures += 1;
                        tracing::debug!(server = %server, status = status.as_u16(), "Upstream refused the GET stream; retrying.");
                    } else {
                        tracing::warn!(server = %server, url = %self.shown_url, status = status.as_u16(), content_type = %ctype, "Upstream GET stream unusable; its own messages arrive only on POST streams.");
                        return;
                    }
                }
            }
            let backoff = if failures == 0 {
                Duration::ZERO
            } else {
                RECONNECT_BASE.saturating_mul(1 << (failures - 1).min(5)).min(RECONNECT_MAX)
            };
            tokio::time::sleep(parser.retry().unwrap_or(RECONNECT_BASE).max(backoff)).await;
        }
    }

    /// `DELETE` of the session (MCP 2025-11-25 §Session Management), unless it expired.
    async fn delete_session(&self) {
        if self.expired.load(Ordering::Acquire) || self.session_id.lock().expect("session").is_none() {
            return;
        }
        let (rb, _) = self.request(Method::DELETE);
        match tokio::time::timeout(DELETE_TIMEOUT, rb.send()).await {
            Ok(Ok(resp)) => {
                tracing::debug!(server = %self.core.server, status = resp.status().as_u16(), "Upstream session deleted.")
            }
            Ok(Err(e)) => {
                tracing::debug!(server = %self.core.server, error = %describe(e), "Upstream session DELETE failed.")
            }
            Err(_) => tracing::debug!(server = %self.core.server, "Upstream session DELETE got no answer in time."),
        }
    }

    /// Runs `fut` while its result is still wanted: `None` once the upstream closed or (for a
    /// request) nobody waits for request `request_id` any more.
    async fn while_wanted<F: Future>(&self, request_id: Option<u64>, fut: F) -> Option<F::Output> {
        tokio::pin!(fut);
        let mut check = tokio::time::interval(CHECK_EVERY);
        check.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                out = &mut fut => return Some(out),
                _ = check.tick() => {
                    if !self.core.is_alive() || request_id.is_some_and(|id| !self.core.is_pending(id)) {
                        return None;
                    }
                }
            }
        }
    }

    /// A short, printable quote of an error body (read for at most 5 s).
    async fn snippet(&self, resp: Response, ctype: &str) -> String {
        match tokio::time::timeout(ERROR_BODY_TIMEOUT, read_body(resp, ERROR_BODY_LIMIT, true)).await {
            Ok(Ok(body)) => self.sanitize(&body, ctype),
            Ok(Err(why)) => format!("(body unreadable: {why})"),
            Err(_) => "(body not received in time)".into(),
        }
    }

    /// Makes `body` fit for an error message: the `error.message` of a JSON-RPC error body,
    /// else its text with HTML tags dropped; configured header values redacted; whitespace and
    /// control characters collapsed; at most [`SNIPPET_CHARS`] characters.
    fn sanitize(&self, body: &[u8], ctype: &str) -> String {
        let mut text = serde_json::from_slice::<serde_json::Value>(body)
            .ok()
            .and_then(|v| v.pointer("/error/message").and_then(|m| m.as_str()).map(str::to_owned))
            .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
        for secret in &self.secrets {
            let secret = secret.expose_secret();
            if text.contains(secret) {
                text = text.replace(secret, "[REDACTED]");
            }
        }
        if ctype.contains("html") || text.trim_start().starts_with('<') {
            text = strip_tags(&text);
        }
        let words: Vec<&str> =
            text.split(|c: char| c.is_whitespace() || c.is_control()).filter(|w| !w.is_empty()).collect();
        let mut out = words.join(" ");
        if let Some((cut, _)) = out.char_indices().nth(SNIPPET_CHARS) {
            out.truncate(cut);
            out.push('…');
        }
        if out.is_empty() { "(empty body)".into() } else { out }
    }
}

/// Parses and checks an upstream URL.
fn parse_url(raw: &str) -> Result<Url, String> {
    let raw = raw.trim();
    if raw.is_empty() {
        return Err("no url is configured".into());
    }
    let url = Url::parse(raw).map_err(|e| format!("url is not valid: {e}"))?;
    match url.scheme() {
        "http" | "https" => {}
        other => return Err(format!("url scheme {other:?} is not supported (use http:// or https://)")),
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err("url has no host".into());
    }
    Ok(url)
}

/// `url` without user info, query or fragment.
fn shown_url(url: &Url) -> String {
    let mut u = url.clone();
    let _ = u.set_username("");
    let _ = u.set_password(None);
    u.set_query(None);
    u.set_fragment(None);
    u.to_string()
}

/// The media type of `resp`, lowercased, without parameters; empty when absent.
fn content_type(resp: &Response) -> String {
    resp.headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(|v| v.trim().to_ascii_lowercase())
        .unwrap_or_default()
}

fn ctype_note(ctype: &str) -> String {
    if ctype.is_empty() { " (no content type)".into() } else { format!(" ({ctype})") }
}

/// A reqwest error without its URL (which may carry a query string), with its root cause.
fn describe(err: reqwest::Error) -> String {
    let err = err.without_url();
    let mut out = err.to_string();
    let mut root: Option<&dyn std::error::Error> = None;
    let mut source = std::error::Error::source(&err);
    while let Some(s) = source {
        root = Some(s);
        source = s.source();
    }
    if let Some(root) = root {
        let root = root.to_string();
        if !out.contains(&root) {
            out = format!("{out}: {root}");
        }
    }
    out
}

/// Reads a body of at most `limit` bytes: longer bodies are cut there when `truncate`, an
/// error otherwise.
async fn read_body(mut resp: Response, limit: usize, truncate: bool) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(describe)? {
        if body.len() + chunk.len() > limit {
            if truncate {
                body.extend_from_slice(&chunk[..limit - body.len()]);
                return Ok(body);
            }
            return Err(format!("the body is larger than {limit} bytes"));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// Drops `<…>` tags: enough for a one-line quote of an HTML error page.
fn strip_tags(html: &str) -> String {
    let mut out = String::with_capacity(html.len());
    let mut in_tag = false;
    for c in html.chars() {
        match c {
            '<' => in_tag = true,
            '>' if in_tag => {
                in_tag = false;
                out.push(' ');
            }
            _ if !in_tag => out.push(c),
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    //! The transport against a fake upstream on loopback that speaks the Streamable HTTP wire
    //! format (axum), driven through `Upstream` exactly as a session drives it.
    use std::collections::HashMap;
    use std::convert::Infallible;
    use std::path::PathBuf;

    use axum::Router;
    use axum::body::{Body, Bytes};
    use axum::extract::State;
    use axum::http::{HeaderMap as AxHeaders, Method as AxMethod, StatusCode as AxStatus};
    use axum::response::{IntoResponse, Response as AxResponse};
    use coffer_runtime::home::CofferHome;
    use futures_util::StreamExt;
    use serde_json::{Value, json};
    use tokio::sync::{mpsc, watch};

    use super::*;
    use crate::mcp::upstream::{EVENT_QUEUE, EventQueue, Reply, Upstream, UpstreamEvent, events};

    const SECRET: &str = "sk-test-secret-value-123";
    const WAIT: Duration = Duration::from_secs(10);

    #[derive(Clone, Debug)]
    struct Seen {
        method: AxMethod,
        headers: AxHeaders,
        body: Value,
    }

    /// The fake upstream's state: what it saw, how many streams are open, a stored answer for
    /// a resumed stream.
    struct Fake {
        seen: watch::Sender<Vec<Seen>>,
        open: watch::Sender<usize>,
        resume_answer: Mutex<Option<String>>,
        get_allowed: bool,
    }

    /// Counts an open SSE stream while alive.
    struct Open(Arc<Fake>);
    impl Drop for Open {
        fn drop(&mut self) {
            self.0.open.send_modify(|n| *n -= 1);
        }
    }

    impl Fake {
        fn record(&self, method: AxMethod, headers: &AxHeaders, body: Value) {
            self.seen.send_modify(|s| s.push(Seen { method, headers: headers.clone(), body }));
        }

        /// An SSE response of `frames`; when `hang`, it never ends (and counts as open).
        fn sse(self: &Arc<Self>, frames: Vec<String>, hang: bool) -> AxResponse {
            let guard = hang.then(|| {
                self.open.send_modify(|n| *n += 1);
                Open(self.clone())
            });
            let stream = futures_util::stream::iter(frames)
                .chain(futures_util::stream::unfold(hang, |hang| async move {
                    if hang {
                        std::future::pending::<()>().await;
                    }
                    None
                }))
                .map(move |frame| {
                    let _alive = &guard;
                    Ok::<_, Infallible>(frame)
                });
            ([("content-type", "text/event-stream")], Body::from_stream(stream)).into_response()
        }
    }

    fn frame(id: Option<&str>, data: &Value) -> String {
        match id {
            Some(id) => format!("event: message\nid: {id}\ndata: {data}\n\n"),
            None => format!("event: message\ndata: {data}\n\n"),
        }
    }

    fn result(id: &Value, result: Value) -> Value {
        json!({"jsonrpc": "2.0", "id": id, "result": result})
    }

    async fn post(State(f): State<Arc<Fake>>, headers: AxHeaders, body: Bytes) -> AxResponse {
        let msg: Value = serde_json::from_slice(&body).expect("the client sends JSON");
        f.record(AxMethod::POST, &headers, msg.clone());
        let method = msg["method"].as_str().unwrap_or_default();
        if method != "initialize" && headers.get("mcp-session-id").is_none_or(|v| v != "sess-1") {
            return (AxStatus::BAD_REQUEST, "Bad Request: no valid session id").into_response();
        }
        let id = msg.get("id").cloned();
        let (Some(id), false) = (id, method.is_empty()) else {
            return AxStatus::ACCEPTED.into_response();
        };
        let json_answer = |v: Value| ([("content-type", "application/json")], v.to_string()).into_response();
        match method {
            "initialize" => (
                [("content-type", "application/json"), ("mcp-session-id", "sess-1")],
                result(
                    &id,
                    json!({"protocolVersion": "2025-11-25", "capabilities": {"tools": {}}, "serverInfo": {"name": "fake", "version": "1"}}),
                )
                .to_string(),
            )
                .into_response(),
            "tools/list" => json_answer(result(&id, json!({"tools": [{"name": "echo", "inputSchema": {"type": "object"}}]}))),
            "tools/call" => match msg["params"]["name"].as_str().unwrap_or_default() {
                "sse" => {
                    let note = json!({"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "working"}});
                    let done = result(&id, json!({"content": [{"type": "text", "text": "streamed"}]}));
                    f.sse(vec![frame(None, &note), frame(None, &done)], false)
                }
                "hang" => f.sse(vec!["id: h0\ndata:\n\n".into()], true),
                "resume" => {
                    let done = result(&id, json!({"content": [{"type": "text", "text": "resumed"}]}));
                    *f.resume_answer.lock().unwrap() = Some(done.to_string());
                    f.sse(vec!["id: r1\nretry: 10\ndata:\n\n".into()], false)
                }
                "boom" => (
                    AxStatus::INTERNAL_SERVER_ERROR,
                    [("content-type", "text/plain")],
                    format!("internal boom; your header was {SECRET}"),
                )
                    .into_response(),
                "html" => (
                    [("content-type", "text/html; charset=utf-8")],
                    "<html><head><title>Sign in</title></head>\n<body><h1>Login   required</h1></body></html>",
                )
                    .into_response(),
                "badjson" => ([("content-type", "application/json")], "not json {").into_response(),
                "expire" => AxStatus::NOT_FOUND.into_response(),
                "expire400" => (
                    AxStatus::BAD_REQUEST,
                    [("content-type", "application/json")],
                    json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32000, "message": "Bad Request: No valid session ID provided"}}).to_string(),
                )
                    .into_response(),
                "bad400" => (AxStatus::BAD_REQUEST, "Bad Request: arguments are wrong").into_response(),
                _ => json_answer(result(&id, json!({"content": [{"type": "text", "text": msg["params"]["arguments"]["message"]}]}))),
            },
            _ => json_answer(json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32601, "message": "no such method"}})),
        }
    }

    async fn get(State(f): State<Arc<Fake>>, headers: AxHeaders) -> AxResponse {
        f.record(AxMethod::GET, &headers, Value::Null);
        if !f.get_allowed {
            return AxStatus::METHOD_NOT_ALLOWED.into_response();
        }
        if headers.get("mcp-session-id").is_none_or(|v| v != "sess-1") {
            return AxStatus::BAD_REQUEST.into_response();
        }
        if let Some(last) = headers.get("last-event-id") {
            let answer = f.resume_answer.lock().unwrap().take();
            return match (last == "r1", answer) {
                (true, Some(a)) => f.sse(vec![format!("id: r2\ndata: {a}\n\n")], false),
                _ => AxStatus::CONFLICT.into_response(),
            };
        }
        let changed = json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"});
        let ping = json!({"jsonrpc": "2.0", "id": "srv-1", "method": "ping"});
        f.sse(vec![": keep-alive\n\n".into(), frame(Some("g1"), &changed), frame(Some("g2"), &ping)], true)
    }

    async fn delete(State(f): State<Arc<Fake>>, headers: AxHeaders) -> AxStatus {
        f.record(AxMethod::DELETE, &headers, Value::Null);
        AxStatus::OK
    }

    /// Starts a fake upstream; returns it and its MCP endpoint URL.
    async fn fake(get_allowed: bool) -> (Arc<Fake>, String) {
        let f = Arc::new(Fake {
            seen: watch::channel(Vec::new()).0,
            open: watch::channel(0).0,
            resume_answer: Mutex::new(None),
            get_allowed,
        });
        let app = Router::new().route("/mcp", axum::routing::post(post).get(get).delete(delete)).with_state(f.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/mcp?key=query-secret", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (f, url)
    }

    fn server(url: &str) -> McpServer {
        McpServer {
            name: "fake".into(),
            transport: coffer_proto::store::Transport::Http.into(),
            url: url.into(),
            headers: HashMap::from([("X-Api-Key".to_owned(), SECRET.to_owned())]),
            ..Default::default()
        }
    }

    async fn start(url: &str) -> Result<(Arc<Upstream>, EventQueue), UpstreamError> {
        let (tx, rx) = events(EVENT_QUEUE);
        let params = json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "test", "version": "0"}});
        let home = CofferHome::at(PathBuf::from("/nonexistent-coffer-home"));
        let up = Upstream::start(
            &server(url),
            &home,
            &params,
            tx,
            WAIT,
            Vec::new(),
            Some(crate::mcp::upstream::era::Era::Legacy),
        )
        .await?;
        Ok((up, rx))
    }

    async fn call(up: &Upstream, tool: &str, timeout: Duration) -> Result<Reply, UpstreamError> {
        let params = json!({"name": tool, "arguments": {"message": "hi"}}).to_string();
        up.request("tools/call", Some(&RawValue::from_string(params).unwrap()), timeout).await
    }

    fn text(reply: Reply) -> Value {
        match reply {
            Reply::Result(r) => serde_json::from_str(r.get()).unwrap(),
            Reply::Error(e) => panic!("expected a result, got the error {}", e.get()),
        }
    }

    fn error(reply: Reply) -> (i64, String) {
        match reply {
            Reply::Error(e) => {
                let v: Value = serde_json::from_str(e.get()).unwrap();
                (v["code"].as_i64().unwrap(), v["message"].as_str().unwrap().to_owned())
            }
            Reply::Result(r) => panic!("expected an error, got the result {}", r.get()),
        }
    }

    /// Waits (with a deadline) until what the fake saw satisfies `pred`.
    async fn wait_seen(f: &Fake, pred: impl Fn(&[Seen]) -> bool) -> Vec<Seen> {
        let mut rx = f.seen.subscribe();
        let seen = tokio::time::timeout(WAIT, rx.wait_for(|s| pred(s))).await.expect("the fake saw it in time");
        seen.unwrap().clone()
    }

    /// Waits (with a deadline) for an event matching `pred`, skipping others.
    async fn wait_event(rx: &mut EventQueue, pred: impl Fn(&UpstreamEvent) -> bool) {
        tokio::time::timeout(WAIT, async {
            loop {
                let ev = rx.recv().await.expect("events channel open");
                if pred(&ev) {
                    return;
                }
            }
        })
        .await
        .expect("the event arrived in time");
    }

    fn header<'a>(s: &'a Seen, name: &str) -> Option<&'a str> {
        s.headers.get(name).map(|v| v.to_str().unwrap())
    }

    #[tokio::test]
    async fn json_and_sse_answers_with_session_and_version_headers() {
        let (f, url) = fake(true).await;
        let (up, mut events) = start(&url).await.unwrap();
        assert_eq!(up.init_result["serverInfo"]["name"], "fake");
        assert!(up.has_capability("tools"));

        let list = text(up.request("tools/list", None, WAIT).await.unwrap());
        assert_eq!(list["tools"][0]["name"], "echo");
        let echoed = text(call(&up, "echo", WAIT).await.unwrap());
        assert_eq!(echoed["content"][0]["text"], "hi");

        // The notification sent before the response on the same stream is already with the
        // session when the response arrives.
        let streamed = text(call(&up, "sse", WAIT).await.unwrap());
        assert_eq!(streamed["content"][0]["text"], "streamed");
        let mut before = Vec::new();
        while let Ok(ev) = events.try_recv() {
            if let UpstreamEvent::Notification { method, .. } = ev {
                before.push(method);
            }
        }
        assert!(before.contains(&"notifications/message".to_owned()), "{before:?}");

        let seen = f.seen.borrow().clone();
        let posts: Vec<&Seen> = seen.iter().filter(|s| s.method == AxMethod::POST).collect();
        assert_eq!(posts[0].body["method"], "initialize");
        assert_eq!(header(posts[0], "mcp-session-id"), None);
        assert_eq!(header(posts[0], "mcp-protocol-version"), None);
        assert_eq!(posts[1].body["method"], "notifications/initialized");
        for p in &posts {
            assert_eq!(header(p, "accept"), Some("application/json, text/event-stream"));
            assert_eq!(header(p, "content-type"), Some("application/json"));
            assert_eq!(header(p, "x-api-key"), Some(SECRET));
        }
        for p in &posts[1..] {
            assert_eq!(header(p, "mcp-session-id"), Some("sess-1"));
            assert_eq!(header(p, "mcp-protocol-version"), Some("2025-11-25"));
        }
        up.shutdown(Duration::from_secs(2)).await;
    }

    #[tokio::test]
    async fn notifications_are_accepted_with_202() {
        let (f, url) = fake(true).await;
        let (up, _events) = start(&url).await.unwrap();
        let params = RawValue::from_string(json!({"requestId": 7, "reason": "test"}).to_string()).unwrap();
        up.notify("notifications/cancelled", Some(&params)).await.unwrap();
        // `notify` returned after the server accepted it: no waiting needed.
        let seen = f.seen.borrow().clone();
        assert!(seen.iter().any(|s| s.body["method"] == "notifications/cancelled"));
        up.shutdown(Duration::from_secs(2)).await;
    }

    #[tokio::test]
    async fn get_stream_delivers_server_notifications_and_requests() {
        let (f, url) = fake(true).await;
        let (up, mut events) = start(&url).await.unwrap();
        wait_event(
            &mut events,
            |e| matches!(e, UpstreamEvent::Notification { method, .. } if method == "notifications/tools/list_changed"),
        )
        .await;
        let (tx, mut rx) = mpsc::unbounded_channel();
        // The ping request comes next; answer it as the session would.
        tokio::time::timeout(WAIT, async {
            loop {
                if let UpstreamEvent::Request { id, method, .. } = events.recv().await.unwrap() {
                    tx.send((id, method)).unwrap();
                    return;
                }
            }
        })
        .await
        .unwrap();
        let (id, method) = rx.recv().await.unwrap();
        assert_eq!(method, "ping");
        up.respond(&id, Reply::Result(RawValue::from_string("{}".into()).unwrap())).await.unwrap();
        let seen = wait_seen(&f, |s| s.iter().any(|s| s.body["id"] == "srv-1")).await;
        let get = seen.iter().find(|s| s.method == AxMethod::GET).unwrap();
        assert_eq!(header(get, "accept"), Some("text/event-stream"));
        assert_eq!(header(get, "mcp-session-id"), Some("sess-1"));
        assert_eq!(header(get, "mcp-protocol-version"), Some("2025-11-25"));
        up.shutdown(Duration::from_secs(2)).await;
    }

    #[tokio::test]
    async fn get_405_means_no_stream_and_requests_still_work() {
        let (f, url) = fake(false).await;
        let (up, _events) = start(&url).await.unwrap();
        wait_seen(&f, |s| s.iter().any(|s| s.method == AxMethod::GET)).await;
        assert_eq!(text(call(&up, "echo", WAIT).await.unwrap())["content"][0]["text"], "hi");
        assert!(up.is_alive());
        let gets = f.seen.borrow().iter().filter(|s| s.method == AxMethod::GET).count();
        assert_eq!(gets, 1, "no reconnection after 405");
        up.shutdown(Duration::from_secs(2)).await;
    }

    #[tokio::test]
    async fn http_404_expires_the_session_and_closes_the_core() {
        let (f, url) = fake(true).await;
        let (up, mut events) = start(&url).await.unwrap();
        match call(&up, "expire", WAIT).await {
            Err(UpstreamError::Closed { reason, .. }) => assert_eq!(reason, "upstream session expired (HTTP 404)"),
            other => panic!("expected Closed, got {other:?}", other = other.map(|_| ())),
        }
        assert!(!up.is_alive());
        wait_event(&mut events, |e| matches!(e, UpstreamEvent::Closed { .. })).await;
        up.shutdown(Duration::from_secs(2)).await;
        assert!(!f.seen.borrow().iter().any(|s| s.method == AxMethod::DELETE), "no DELETE for an expired session");
    }

    #[tokio::test]
    async fn http_400_naming_the_session_expires_it_other_400s_fail_the_request() {
        let (_f, url) = fake(true).await;
        let (up, _events) = start(&url).await.unwrap();
        let (code, msg) = error(call(&up, "bad400", WAIT).await.unwrap());
        assert_eq!(code, UPSTREAM_UNAVAILABLE);
        assert_eq!(msg, "upstream fake answered HTTP 400 Bad Request (text/plain): Bad Request: arguments are wrong");
        assert!(up.is_alive());
        match call(&up, "expire400", WAIT).await {
            Err(UpstreamError::Closed { reason, .. }) => assert_eq!(reason, "upstream session expired (HTTP 400)"),
            other => panic!("expected Closed, got {other:?}", other = other.map(|_| ())),
        }
        assert!(!up.is_alive());
        up.shutdown(Duration::from_secs(2)).await;
    }

    #[tokio::test]
    async fn server_errors_html_and_invalid_json_fail_the_request_clearly() {
        let (_f, url) = fake(true).await;
        let (up, _events) = start(&url).await.unwrap();

        let (code, msg) = error(call(&up, "boom", WAIT).await.unwrap());
        assert_eq!(code, UPSTREAM_UNAVAILABLE);
        assert!(
            msg.starts_with("upstream fake answered HTTP 500 Internal Server Error (text/plain): internal boom"),
            "{msg}"
        );
        assert!(!msg.contains(SECRET) && msg.contains("[REDACTED]"), "{msg}");

        let (code, msg) = error(call(&up, "html", WAIT).await.unwrap());
        assert_eq!(code, UPSTREAM_UNAVAILABLE);
        assert!(msg.contains("HTTP 200 OK (text/html), not JSON or an SSE stream"), "{msg}");
        assert!(msg.contains("Sign in Login required") && !msg.contains('<'), "{msg}");

        let (code, msg) = error(call(&up, "badjson", WAIT).await.unwrap());
        assert_eq!(code, UPSTREAM_UNAVAILABLE);
        assert!(msg.contains("(application/json) with a body that is not JSON: not json {"), "{msg}");

        // None of this ends the upstream session.
        assert!(up.is_alive());
        assert_eq!(text(call(&up, "echo", WAIT).await.unwrap())["content"][0]["text"], "hi");
        up.shutdown(Duration::from_secs(2)).await;
    }

    #[tokio::test]
    async fn a_stream_that_never_ends_blocks_nothing_and_is_dropped_once_unwanted() {
        let (f, url) = fake(true).await;
        let (up, _events) = start(&url).await.unwrap();
        let mut open = f.open.subscribe();
        // The GET stream is the one open stream to begin with.
        tokio::time::timeout(WAIT, open.wait_for(|n| *n == 1)).await.unwrap().unwrap();

        let params = RawValue::from_string(json!({"name": "hang", "arguments": {}}).to_string()).unwrap();
        let (hung, rx) = up.begin("tools/call", Some(&params)).await.unwrap();
        tokio::time::timeout(WAIT, open.wait_for(|n| *n == 2)).await.unwrap().unwrap();
        // Another request completes while that stream stays open.
        let list = text(up.request("tools/list", None, WAIT).await.unwrap());
        assert_eq!(list["tools"][0]["name"], "echo");

        match up.finish(hung, rx, Duration::from_millis(200), None).await {
            Err(UpstreamError::Timeout { ms: 200, .. }) => {}
            other => panic!("expected a timeout, got {other:?}", other = other.map(|_| ())),
        }
        // Nobody waits for the hung stream any more: the transport lets it go.
        tokio::time::timeout(WAIT, open.wait_for(|n| *n == 1)).await.unwrap().unwrap();
        assert!(up.is_alive());

        // Closing stops the GET stream too and ends the session with DELETE.
        up.shutdown(Duration::from_secs(2)).await;
        tokio::time::timeout(WAIT, open.wait_for(|n| *n == 0)).await.unwrap().unwrap();
        let seen = f.seen.borrow().clone();
        let delete = seen.iter().find(|s| s.method == AxMethod::DELETE).expect("DELETE sent");
        assert_eq!(header(delete, "mcp-session-id"), Some("sess-1"));
    }

    #[tokio::test]
    async fn a_post_stream_closed_before_the_response_is_resumed_with_last_event_id() {
        let (f, url) = fake(true).await;
        let (up, _events) = start(&url).await.unwrap();
        let resumed = text(call(&up, "resume", WAIT).await.unwrap());
        assert_eq!(resumed["content"][0]["text"], "resumed");
        let seen = f.seen.borrow().clone();
        assert!(seen.iter().any(|s| s.method == AxMethod::GET && header(s, "last-event-id") == Some("r1")));
        up.shutdown(Duration::from_secs(2)).await;
    }

    #[tokio::test]
    async fn unreachable_and_non_tls_https_upstreams_fail_to_start_with_clear_reasons() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        match start(&format!("http://127.0.0.1:{port}/mcp?token=query-secret")).await {
            Err(UpstreamError::Start { reason, .. }) => {
                assert!(reason.contains(&format!("unreachable at http://127.0.0.1:{port}/mcp (")), "{reason}");
                assert!(!reason.contains("query-secret"), "{reason}");
            }
            other => panic!("expected Start, got {:?}", other.map(|_| ())),
        }
        // https goes through rustls: a peer that does not speak TLS fails the handshake cleanly
        // (no panic, a reason naming the URL), proving the TLS client path runs.
        let plain = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let tls_port = plain.local_addr().unwrap().port();
        let not_tls = tokio::spawn(async move {
            while let Ok((mut sock, _)) = plain.accept().await {
                use tokio::io::AsyncWriteExt;
                let _ = sock.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").await;
            }
        });
        match start(&format!("https://127.0.0.1:{tls_port}/mcp")).await {
            Err(UpstreamError::Start { reason, .. }) => {
                assert!(reason.contains(&format!("https://127.0.0.1:{tls_port}/mcp")), "{reason}")
            }
            other => panic!("expected Start, got {:?}", other.map(|_| ())),
        }
        not_tls.abort();
    }

    #[test]
    fn configuration_errors_never_quote_values() {
        let (tx, _rx) = events(EVENT_QUEUE);
        let core = Core::new("fake", tx);
        let mut s = server("http://127.0.0.1:1/mcp");
        s.headers.insert("X-Bad".into(), format!("{SECRET}\n"));
        let err = HttpTransport::new(&s, core.clone()).err().unwrap();
        assert_eq!(err, "the value of header \"X-Bad\" is not valid");
        let mut s = server("http://127.0.0.1:1/mcp");
        s.headers.insert("Mcp-Session-Id".into(), "x".into());
        assert!(HttpTransport::new(&s, core.clone()).err().unwrap().contains("set by the transport"));
        assert_eq!(
            HttpTransport::new(&server("ftp://h/x"), core.clone()).err().unwrap(),
            "url scheme \"ftp\" is not supported (use http:// or https://)"
        );
        assert_eq!(HttpTransport::new(&server(""), core).err().unwrap(), "no url is configured");
        let url = Url::parse("http://user:pw@host:1/mcp?key=k#frag").unwrap();
        assert_eq!(shown_url(&url), "http://host:1/mcp");
    }

    #[test]
    fn sanitize_quotes_json_rpc_errors_and_cuts_long_bodies() {
        let (tx, _rx) = events(EVENT_QUEUE);
        let t = HttpTransport::new(&server("http://127.0.0.1:1/mcp"), Core::new("fake", tx)).unwrap();
        let body = br#"{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Bad Request: Unsupported protocol version"}}"#;
        assert_eq!(t.inner.sanitize(body, JSON), "Bad Request: Unsupported protocol version");
        let long = "word ".repeat(100);
        let cut = t.inner.sanitize(long.as_bytes(), "text/plain");
        assert!(cut.ends_with('…') && cut.chars().count() == SNIPPET_CHARS + 1, "{cut}");
        assert_eq!(t.inner.sanitize(b"  \n", ""), "(empty body)");
    }
}
