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
use oauth::{AuthError, ServerAuth};

mod legacy;
pub mod oauth;
pub use legacy::looks_legacy;
mod sse;
#[cfg(test)]
mod tests;

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
    /// The upstream speaks the legacy HTTP+SSE transport (MCP 2024-11-05; see `legacy.rs`):
    /// chosen by its registration or URL, or detected from a first `POST` answered 404/405.
    legacy: AtomicBool,
    /// A `POST` succeeded: the upstream speaks Streamable HTTP, no legacy detection any more.
    confirmed: AtomicBool,
    /// The legacy transport's `POST` endpoint, once its SSE stream named it.
    endpoint: tokio::sync::OnceCell<Url>,
    /// The server's OAuth state, unless its registration sets `Authorization` itself (then a
    /// `401` is that credential's problem, not a sign-in to offer).
    auth: Option<Arc<ServerAuth>>,
}

impl HttpTransport {
    /// Prepares a client for `server.url` with `server.headers`; nothing is sent until the
    /// first [`HttpTransport::send`] (the `initialize` request).
    ///
    /// # Errors
    /// A message (never quoting a header value or the URL) when the URL is missing, not
    /// `http://` or `https://`, or a header name or
    /// value is not valid HTTP or names a header the transport sets itself.
    ///
    /// `auth`: the server's OAuth state ([`oauth`]): its access token goes in `Authorization`
    /// and a `401` refreshes it; ignored when the registration configures `Authorization`.
    pub fn new(server: &McpServer, core: Arc<Core>, auth: Option<Arc<ServerAuth>>) -> Result<Self, String> {
        let url = parse_url(&server.url)?;
        let legacy = legacy::chosen(server, &url);
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
        let auth = auth.filter(|_| !headers.contains_key(reqwest::header::AUTHORIZATION));
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
                legacy: AtomicBool::new(legacy),
                confirmed: AtomicBool::new(false),
                endpoint: tokio::sync::OnceCell::new(),
                auth,
            }),
            tasks: Mutex::new(JoinSet::new()),
            listening: AtomicBool::new(false),
            closing: AtomicBool::new(false),
        })
    }

    /// True once it speaks the legacy HTTP+SSE transport (chosen, or detected).
    pub fn is_legacy(&self) -> bool {
        self.inner.is_legacy()
    }

    /// Records the negotiated protocol version (sent as `MCP-Protocol-Version` on every later
    /// request; nothing when empty) and opens the `GET` stream for server-to-client messages.
    pub fn initialized(&self, protocol_version: &str) {
        if !protocol_version.is_empty()
            && let Ok(v) = HeaderValue::from_str(protocol_version)
        {
            *self.inner.protocol_version.lock().expect("version") = Some(v);
        }
        if self.inner.cancel.is_cancelled() || self.inner.is_legacy() || self.listening.swap(true, Ordering::AcqRel) {
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
        if inner.is_legacy() {
            let stateless = mirror.is_some();
            if request_id.is_some() {
                self.spawn(inner.legacy_post(line, request_id, None, stateless));
                return Ok(());
            }
            let (accepted, answered) = oneshot::channel();
            self.spawn(inner.legacy_post(line, None, Some(accepted), stateless));
            let _ = answered.await;
            return if self.inner.core.is_alive() { Ok(()) } else { Err(self.inner.closed_error()) };
        }
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

impl Inner {
    /// The OAuth access token to send, when the server has a grant (refreshed first when it is
    /// about to expire).
    ///
    /// # Errors
    /// The server needs sign-in, or its token could not be refreshed.
    async fn bearer(&self) -> Result<Option<SecretString>, AuthError> {
        match &self.auth {
            Some(a) => a.bearer().await,
            None => Ok(None),
        }
    }

    /// [`Inner::request`] with the OAuth access token (when the server has a grant), and the
    /// token sent.
    ///
    /// # Errors
    /// The server needs sign-in, or its token could not be refreshed.
    async fn authorized(
        &self,
        method: Method,
    ) -> Result<(reqwest::RequestBuilder, bool, Option<SecretString>), AuthError> {
        let token = self.bearer().await?;
        let (rb, had_session) = self.request(method);
        Ok((with_bearer(rb, token.as_ref()), had_session, token))
    }

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
        let (rb, had_session, token) = match self.authorized(Method::POST).await {
            Ok(r) => r,
            Err(e) => return self.auth_failed(request_id, e),
        };
        let stateless = mirror.is_some();
        let finish = |mut rb: reqwest::RequestBuilder, body: String| {
            if let Some(m) = &mirror {
                rb = rb.header(MCP_PROTOCOL_VERSION, m.version);
                if let Ok(v) = HeaderValue::from_str(&m.method) {
                    rb = rb.header(MCP_METHOD, v);
                }
                if let Some(v) = m.name.as_deref().and_then(|n| HeaderValue::from_str(n).ok()) {
                    rb = rb.header(MCP_NAME, v);
                }
            }
            rb.header(CONTENT_TYPE, JSON).header(ACCEPT, ACCEPT_POST).body(body)
        };
        // Kept until the server proved it speaks Streamable HTTP, to re-send over the legacy
        // transport if it turns out not to.
        let first = (!had_session && !self.confirmed.load(Ordering::Acquire)).then(|| body.clone());
        let mut resp = match finish(rb, body.clone()).send().await {
            Ok(r) => r,
            Err(e) => return self.send_failed(request_id, e),
        };
        if let Some(first) = first
            && self.detects_legacy(resp.status(), had_session)
        {
            self.switch_to_legacy(resp.status());
            return self.legacy_post(first, request_id, accepted, stateless).await;
        }
        if resp.status() == StatusCode::UNAUTHORIZED {
            // MCP 2025-11-25 basic/authorization §Token Handling: a refused (expired, revoked)
            // token is refreshed once and the request sent again; a second refusal, or no
            // way to refresh, means only a new sign-in helps.
            let challenged = bearer_challenged(&resp);
            let Some(auth) = self.auth.clone().filter(|_| challenged || token.is_some()) else {
                return self.refused_unauthorized(resp, request_id).await;
            };
            let fresh = match auth.rejected(token.as_ref()).await {
                Ok(t) => t,
                Err(e) => return self.auth_failed(request_id, e),
            };
            let (rb, _) = self.request(Method::POST);
            resp = match finish(with_bearer(rb, Some(&fresh)), body).send().await {
                Ok(r) => r,
                Err(e) => return self.send_failed(request_id, e),
            };
            if resp.status() == StatusCode::UNAUTHORIZED {
                let e = auth.refused_after_refresh().await;
                return self.auth_failed(request_id, e);
            }
        }
        if let Some(e) = self.scope_challenged(&resp).await {
            return self.auth_failed(request_id, e);
        }
        if resp.status().is_success() {
            self.confirmed.store(true, Ordering::Release);
        }
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

    /// The request cannot be authorized: a server that needs sign-in is closed with that reason
    /// (every request in flight fails with it, and a start fails naming the command to run);
    /// a refresh that failed for now fails this request only.
    fn auth_failed(&self, request_id: Option<u64>, e: AuthError) {
        match &e {
            AuthError::NeedsSignIn { .. } => {
                tracing::warn!(server = %self.core.server, url = %self.shown_url, error = %e, "Upstream needs sign-in.");
                self.close_core(&e.to_string());
                self.cancel.cancel();
            }
            AuthError::Unavailable { .. } => match request_id {
                Some(id) => self.core.fail(id, UPSTREAM_UNAVAILABLE, &e.to_string()),
                None => tracing::warn!(server = %self.core.server, error = %e, "Upstream did not take a notification."),
            },
        }
    }

    /// A `403` whose `Bearer` challenge says `error="insufficient_scope"` (MCP 2025-11-25
    /// basic/authorization §Scope Challenge Handling): the server needs a new sign-in asking
    /// for the scopes the challenge names (with those granted), and this is that error.
    /// `None` for any other answer, or a server whose registration sets `Authorization`.
    async fn scope_challenged(&self, resp: &Response) -> Option<AuthError> {
        if resp.status() != StatusCode::FORBIDDEN {
            return None;
        }
        let auth = self.auth.as_ref()?;
        let values = resp.headers().get_all(reqwest::header::WWW_AUTHENTICATE);
        let challenge = oauth::discovery::bearer_challenge(values.iter().filter_map(|v| v.to_str().ok()))?;
        if challenge.error.as_deref() != Some("insufficient_scope") {
            return None;
        }
        Some(auth.insufficient_scope(challenge.scope.as_deref()).await)
    }

    /// A `401` that is not about OAuth (the configured `Authorization` was refused, or the
    /// server sent no `Bearer` challenge): reported like any refusal.
    async fn refused_unauthorized(&self, resp: Response, request_id: Option<u64>) {
        let status = resp.status();
        let ctype = content_type(&resp);
        let snippet = self.snippet(resp, &ctype).await;
        self.refused(status, &ctype, &snippet, request_id);
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

    /// `DELETE` of the session (MCP 2025-11-25 §Session Management), unless it expired.
    async fn delete_session(&self) {
        if self.expired.load(Ordering::Acquire) || self.session_id.lock().expect("session").is_none() {
            return;
        }
        let (rb, _) = self.request(Method::DELETE);
        // A token that is at hand is sent; a DELETE never waits for a refresh.
        let token = match &self.auth {
            Some(a) => tokio::time::timeout(DELETE_TIMEOUT, a.bearer()).await.ok().and_then(Result::ok).flatten(),
            None => None,
        };
        let rb = with_bearer(rb, token.as_ref());
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

/// `rb` with `Authorization: Bearer <token>` (RFC 6750 §2.1, marked sensitive) when there is
/// a token.
fn with_bearer(rb: reqwest::RequestBuilder, token: Option<&SecretString>) -> reqwest::RequestBuilder {
    match token.and_then(|t| HeaderValue::from_str(&format!("Bearer {}", t.expose_secret())).ok()) {
        Some(mut v) => {
            v.set_sensitive(true);
            rb.header(reqwest::header::AUTHORIZATION, v)
        }
        None => rb,
    }
}

/// Whether a `401` carries a `Bearer` challenge (RFC 6750 §3).
fn bearer_challenged(resp: &Response) -> bool {
    let values = resp.headers().get_all(reqwest::header::WWW_AUTHENTICATE);
    oauth::discovery::bearer_challenge(values.iter().filter_map(|v| v.to_str().ok())).is_some()
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
