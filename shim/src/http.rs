//! The shim's Streamable HTTP transport (MCP 2025-11-25, basic/transports §Streamable HTTP:
//! "Sending Messages to the Server", "Listening for Messages from the Server", "Resumability and
//! Redelivery", "Session Management"), used when the daemon offers no `/mcp` stream: each
//! message POSTed to `/mcp` on one HTTP/2 cleartext connection, SSE answers and the `GET`
//! stream copied to the sink, `DELETE` to end the session.
//!
//! It tells the link ([`Link`]) what it learns about losing the session: a message that
//! provably never reached a live session (connection refused, or its HTTP/2 stream refused by
//! the daemon; HTTP 404 for the session; HTTP 401 for a token from before a daemon restart) is
//! [`Lost::undelivered`]; everything that may have taken effect is [`Lost::in_flight`]. A request
//! still waiting for the head of its answer when another message finds the link lost gets
//! [`LOST_VERDICT_GRACE`] for its own POST to tell which it is. The one case that cannot be told
//! apart: a request written onto the HTTP/2 connection in the instant between the daemon's
//! death and its close reaching the shim fails like the requests the daemon was working on (the
//! connection broke under all of them), so it is in flight ([`HttpSession::send`] lets pending
//! socket events in first, so a close that has arrived is always seen and the request goes to a
//! new connection, whose refusal is unambiguous).
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use coffer_runtime::Backoff;
use coffer_types::header::{LAST_EVENT_ID, MCP_PROTOCOL_VERSION, MCP_SESSION_ID, TOKEN};
use coffer_types::mcp::{ACCEPT_POST, EVENT_STREAM, JSON};
use coffer_types::sse::{SseEvent, SseParser};
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderValue};
use reqwest::{Method, StatusCode};
use secrecy::ExposeSecret;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, warn};

use crate::connector::Endpoint;
use crate::frame::Frame;
use crate::jsonrpc::{self, INTERNAL_ERROR, Kind, Parsed};
use crate::link::{Answer, Link, Lost, Sink};

/// Resumptions of a response stream in a row that bring no new event before the request is
/// given up (answered with -32001).
const MAX_IDLE_RESUMES: u32 = 5;
/// Reconnection delay of the `GET /mcp` listener when the server gave no `retry`, doubled for
/// every connection in a row that delivered nothing, up to [`LISTEN_RETRY_MAX`].
const LISTEN_RETRY: Duration = Duration::from_secs(1);
const LISTEN_RETRY_MAX: Duration = Duration::from_secs(30);
/// When the link is found lost (by another message or the `GET` stream) while a request still
/// waits for the head of its answer, how long its own POST may take to show whether it reached
/// the daemon (a dead daemon refuses or resets it at once) before it counts as in flight.
const LOST_VERDICT_GRACE: Duration = Duration::from_secs(1);

/// The answer to `GET /mcp`.
enum Listen {
    Stream(reqwest::Response),
    /// `405`: the server offers no stream here.
    NotOffered,
    Rejected(StatusCode),
}

/// The Streamable HTTP side of a [`Link`]: the request headers of its session.
pub(crate) struct HttpSession {
    /// `{base_url}/mcp`, parsed once (`None` when it does not parse: each request then reports it).
    mcp_url: Option<reqwest::Url>,
    /// The token header, built once.
    token: HeaderValue,
    pub(crate) session_id: Option<HeaderValue>,
    protocol_version: Option<HeaderValue>,
    /// The `GET /mcp` listener has been started.
    listening: AtomicBool,
}

impl HttpSession {
    /// No session yet: `initialize` is the first message.
    pub(crate) fn new(endpoint: &Endpoint) -> Self {
        let mut token = HeaderValue::from_str(endpoint.token.expose_secret())
            .unwrap_or_else(|_| HeaderValue::from_static("invalid-token"));
        token.set_sensitive(true);
        Self {
            mcp_url: reqwest::Url::parse(&endpoint.mcp_url()).ok(),
            token,
            session_id: None,
            protocol_version: None,
            listening: AtomicBool::new(false),
        }
    }

    /// The same connection with the session's headers, once `initialize` succeeded.
    pub(crate) fn with_session(&self, session_id: Option<HeaderValue>, protocol_version: Option<HeaderValue>) -> Self {
        Self {
            mcp_url: self.mcp_url.clone(),
            token: self.token.clone(),
            session_id,
            protocol_version,
            listening: AtomicBool::new(false),
        }
    }

    /// A request to `/mcp` with the token and, when known, the session headers.
    fn request(&self, endpoint: &Endpoint, method: Method) -> reqwest::RequestBuilder {
        let req = match &self.mcp_url {
            Some(url) => endpoint.http.request(method, url.clone()),
            None => endpoint.http.request(method, endpoint.mcp_url()),
        };
        let mut req = req.header(TOKEN, self.token.clone());
        if let Some(c) = crate::connector::conversation_header() {
            req = req.header(coffer_types::mcp::CONVERSATION_HEADER, c);
        }
        if let Some(p) = crate::profile::header() {
            req = req.header(coffer_types::mcp::PROFILE_HEADER, p);
        }
        if let Some(id) = &self.session_id {
            req = req.header(MCP_SESSION_ID, id.clone());
        }
        if let Some(v) = &self.protocol_version {
            req = req.header(MCP_PROTOCOL_VERSION, v.clone());
        }
        req
    }

    /// 404 for a session we sent, or 401: the session (or the daemon we knew) is gone.
    fn check_session(&self, status: StatusCode) -> Result<(), Lost> {
        check_session_status(self.session_id.is_some(), status)
    }

    /// POSTs a request on `link` and turns every answer into the frame for the client; also
    /// returns the answer's `Mcp-Session-Id` header. `Err` when the link turned out lost.
    ///
    /// Once the response has begun, the link being found lost (by anyone) ends the request at
    /// once: it may have taken effect, and its stream may never end. Before that, whether it
    /// reached the daemon is for its own POST to tell — a dead daemon refuses or resets it at
    /// once, a live one answers — so it gets [`LOST_VERDICT_GRACE`] to do so.
    pub(crate) async fn exchange(
        &self,
        link: &Link,
        body: &Bytes,
        id: &Value,
        sink: Sink<'_>,
    ) -> Result<(Frame, Option<HeaderValue>), Lost> {
        let mut send = std::pin::pin!(self.send(link, body));
        let resp = tokio::select! {
            biased;
            sent = &mut send => sent?,
            () = link.lost().cancelled() => match tokio::time::timeout(LOST_VERDICT_GRACE, &mut send).await {
                Ok(sent) => sent?,
                Err(_) => return Err(Lost::in_flight(link.reason())),
            },
        };
        let session_id = resp.headers().get(MCP_SESSION_ID).cloned();
        let answer = tokio::select! {
            biased;
            answer = self.receive(link, resp, Some(id), sink) => answer?,
            () = link.lost().cancelled() => return Err(Lost::in_flight(link.reason())),
        };
        let frame = match answer {
            Answer::Response(frame) => frame,
            Answer::Accepted => jsonrpc::error_frame(
                id,
                INTERNAL_ERROR,
                "The Coffer daemon accepted the request without answering it.",
                None,
            ),
            Answer::Ended => jsonrpc::lost_frame(id, "the daemon ended the response stream without answering"),
            Answer::Rejected(reason) => jsonrpc::error_frame(id, INTERNAL_ERROR, &reason, None),
        };
        Ok((frame, session_id))
    }

    /// One POST of a notification or a response, which expects `202` (MCP 2025-11-25,
    /// basic/transports §"Sending Messages to the Server").
    pub(crate) async fn post(&self, link: &Link, body: &Bytes) -> Result<Answer, Lost> {
        let resp = self.send(link, body).await?;
        self.receive(link, resp, None, Sink::Discard).await
    }

    /// Sends one message as a POST (a request's answer is then read by [`HttpSession::receive`]) and
    /// waits for the head of the answer. A 404 for the session or a 401 means
    /// the session (or the daemon run) is gone, and the message was not acted on.
    async fn send(&self, link: &Link, body: &Bytes) -> Result<reqwest::Response, Lost> {
        // Let the runtime take in pending socket events first (tokio wakes a yielded task only
        // after it has polled its I/O driver): a keep-alive connection the daemon closed when it
        // died is then seen closed and not reused. A request written onto such a connection
        // would fail as "closed before message completed", like one the daemon read and died
        // on, and could not be told apart and resent.
        tokio::task::yield_now().await;
        let resp = self
            .request(&link.endpoint, Method::POST)
            .header(CONTENT_TYPE, JSON)
            .header(ACCEPT, ACCEPT_POST)
            .body(body.clone())
            .send()
            .await
            .map_err(|e| {
                let reason = format!("POST /mcp failed: {}", describe(&e));
                if never_delivered(&e) { Lost::undelivered(reason) } else { Lost::in_flight(reason) }
            })?;
        self.check_session(resp.status())?;
        Ok(resp)
    }

    /// Reads the answer to a POST whose head has arrived. Every loss here is one after the
    /// daemon had the message.
    async fn receive(
        &self,
        link: &Link,
        resp: reqwest::Response,
        request_id: Option<&Value>,
        sink: Sink<'_>,
    ) -> Result<Answer, Lost> {
        let status = resp.status();
        let Some(id) = request_id else {
            return Ok(if status.is_success() {
                Answer::Accepted
            } else {
                let body = resp.bytes().await.unwrap_or_default();
                Answer::Rejected(format!("HTTP {status}: {}", snippet(&body)))
            });
        };
        if status == StatusCode::ACCEPTED {
            return Ok(Answer::Accepted);
        }
        if status.is_success() && is_event_stream(&resp) {
            return self.read_stream(link, resp, id, sink).await;
        }
        let body = resp
            .bytes()
            .await
            .map_err(|e| Lost::in_flight(format!("reading the /mcp response failed: {}", describe(&e))))?;
        let frame = if status.is_success() {
            match jsonrpc::parse(&body) {
                Ok(_) => Frame::from_valid_json(body),
                Err(_) => jsonrpc::error_frame(
                    id,
                    INTERNAL_ERROR,
                    "The Coffer daemon answered with a body that is not JSON-RPC.",
                    Some(json!({"status": status.as_u16(), "body": snippet(&body)})),
                ),
            }
        } else {
            jsonrpc::error_body(&body, Some(id)).unwrap_or_else(|| {
                jsonrpc::error_frame(
                    id,
                    INTERNAL_ERROR,
                    &format!("The Coffer daemon answered HTTP {status}."),
                    Some(json!({"status": status.as_u16(), "body": snippet(&body)})),
                )
            })
        };
        Ok(Answer::Response(frame))
    }

    /// Reads an SSE response until the response to `id` arrives, writing every other message
    /// to `sink`; resumes with `GET` + `Last-Event-ID` when the stream ends early and the
    /// server gave event ids (§"Resumability and Redelivery").
    async fn read_stream(
        &self,
        link: &Link,
        mut resp: reqwest::Response,
        id: &Value,
        sink: Sink<'_>,
    ) -> Result<Answer, Lost> {
        let mut parser = SseParser::new();
        let mut events = Vec::new();
        let mut idle_resumes = 0u32;
        loop {
            let before = parser.last_event_id().map(str::to_owned);
            let broken = loop {
                match resp.chunk().await {
                    Ok(Some(chunk)) => {
                        parser.push(&chunk, &mut events);
                        for event in events.drain(..) {
                            if let Some(frame) = self.on_event(event, Some(id), sink).await {
                                return Ok(Answer::Response(frame));
                            }
                        }
                    }
                    Ok(None) => break None,
                    Err(err) => break Some(describe(&err)),
                }
            };
            let Some(last) = parser.last_event_id().map(str::to_owned) else {
                return match broken {
                    Some(err) => Err(Lost::in_flight(format!("the response stream broke: {err}"))),
                    None => Ok(Answer::Ended),
                };
            };
            idle_resumes = if before.as_deref() == Some(last.as_str()) { idle_resumes + 1 } else { 0 };
            if idle_resumes > MAX_IDLE_RESUMES {
                return Ok(Answer::Ended);
            }
            let delay = parser.retry().unwrap_or_else(|| resume_backoff(idle_resumes));
            tokio::time::sleep(delay).await;
            debug!(last_event_id = %last, "Resuming a response stream.");
            resp = match self.open_stream(link, Some(&last)).await.map_err(Lost::after_delivery)? {
                Listen::Stream(resp) => resp,
                Listen::NotOffered | Listen::Rejected(_) => return Ok(Answer::Ended),
            };
            parser.start_new_response();
        }
    }

    /// Handles one SSE event: returns it if it is the response to `id`, else writes it.
    async fn on_event(&self, event: SseEvent, id: Option<&Value>, sink: Sink<'_>) -> Option<Frame> {
        if event.data.iter().all(u8::is_ascii_whitespace) {
            return None; // a priming event: it only carries an id
        }
        let SseEvent { event, data } = event;
        let data = Bytes::from(data);
        let kind = match jsonrpc::parse(&data) {
            Ok(Parsed::Single(kind)) => Some(kind),
            Ok(Parsed::Batch(_)) => None,
            Err(_) => {
                warn!(event = %if event.is_empty() { "message" } else { &event }, "Skipped an SSE event whose data is not JSON-RPC.");
                return None;
            }
        };
        if let (Some(Kind::Response { id: got }), Some(want)) = (&kind, id) {
            if got == want {
                return Some(Frame::from_valid_json(data));
            }
            // On the stream of one request, an error without an id can only be about it.
            if got.is_null()
                && let Some(frame) = jsonrpc::error_body(&data, Some(want))
            {
                return Some(frame);
            }
        }
        let frame = Frame::from_valid_json(data);
        sink.deliver(frame).await;
        None
    }

    /// `GET /mcp` (§"Listening for Messages from the Server"), optionally resuming after
    /// `last_event_id`.
    async fn open_stream(&self, link: &Link, last_event_id: Option<&str>) -> Result<Listen, Lost> {
        let mut req = self.request(&link.endpoint, Method::GET).header(ACCEPT, EVENT_STREAM);
        if let Some(last) = last_event_id.and_then(|v| HeaderValue::from_str(v).ok()) {
            req = req.header(LAST_EVENT_ID, last);
        }
        let resp = req.send().await.map_err(|e| Lost::in_flight(format!("GET /mcp failed: {}", describe(&e))))?;
        let status = resp.status();
        self.check_session(status)?;
        if status == StatusCode::METHOD_NOT_ALLOWED {
            return Ok(Listen::NotOffered);
        }
        if status.is_success() && is_event_stream(&resp) {
            return Ok(Listen::Stream(resp));
        }
        Ok(Listen::Rejected(status))
    }

    /// Starts the `GET /mcp` listener of `link` (once; only for a link with a session).
    pub(crate) fn listen(
        &self,
        link: &Arc<Link>,
        out: &mpsc::Sender<Frame>,
        tasks: &TaskTracker,
        stop: &CancellationToken,
    ) {
        if self.session_id.is_none() || self.listening.swap(true, Ordering::AcqRel) {
            return;
        }
        let (link, out, stop) = (link.clone(), out.clone(), stop.clone());
        tasks.spawn(async move {
            let Some(http) = link.http() else { return };
            tokio::select! {
                () = stop.cancelled() => {}
                () = link.lost().cancelled() => {}
                () = http.listen_loop(&link, &out) => {}
            }
        });
    }

    async fn listen_loop(&self, link: &Link, out: &mpsc::Sender<Frame>) {
        let mut parser = SseParser::new();
        let mut events = Vec::new();
        let mut idle = 0u32;
        loop {
            let last = parser.last_event_id().map(str::to_owned);
            match self.open_stream(link, last.as_deref()).await {
                Ok(Listen::Stream(mut resp)) => {
                    parser.start_new_response();
                    let mut delivered = false;
                    loop {
                        match resp.chunk().await {
                            Ok(Some(chunk)) => {
                                parser.push(&chunk, &mut events);
                                for event in events.drain(..) {
                                    delivered = true;
                                    self.on_event(event, None, Sink::Client(out)).await;
                                }
                            }
                            Ok(None) => break,
                            Err(err) => {
                                debug!(error = %describe(&err), "The server-to-client stream broke.");
                                break;
                            }
                        }
                    }
                    idle = if delivered { 0 } else { idle + 1 };
                }
                Ok(Listen::NotOffered) => {
                    debug!("The daemon offers no server-to-client stream (HTTP 405).");
                    return;
                }
                Ok(Listen::Rejected(status)) => {
                    warn!(%status, "The daemon refused the server-to-client stream.");
                    return;
                }
                Err(lost) => {
                    link.lose(&lost.reason);
                    return;
                }
            }
            let first = parser.retry().unwrap_or(LISTEN_RETRY);
            let delay = Backoff::new(first, LISTEN_RETRY_MAX).delay_after(idle.min(5) + 1);
            tokio::time::sleep(delay).await;
        }
    }

    /// `DELETE /mcp` for the session (§"Session Management"), bounded by `timeout`.
    pub(crate) async fn delete(&self, endpoint: &Endpoint, timeout: Duration) {
        match self.request(endpoint, Method::DELETE).timeout(timeout).send().await {
            Ok(resp) => debug!(status = %resp.status(), "Ended the MCP session."),
            Err(err) => debug!(error = %describe(&err), "Could not end the MCP session."),
        }
    }
}

/// 404 for a session we sent, or 401, means the session (or the daemon we knew) is gone; the
/// daemon answers both before it looks at the message.
fn check_session_status(has_session: bool, status: StatusCode) -> Result<(), Lost> {
    if status == StatusCode::NOT_FOUND && has_session {
        return Err(Lost::undelivered("the daemon no longer knows this MCP session (HTTP 404)"));
    }
    if status == StatusCode::UNAUTHORIZED {
        return Err(Lost::undelivered("the daemon refused the token (HTTP 401); it may have restarted"));
    }
    Ok(())
}

fn is_event_stream(resp: &reqwest::Response) -> bool {
    resp.headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case(EVENT_STREAM))
}

/// Whether a POST that failed without an answer provably never reached the daemon: the
/// connection could not be made (refused, timed out), or the daemon refused the HTTP/2 stream
/// (`REFUSED_STREAM`: "no application processing has happened", RFC 9113 §8.7). A connection
/// that reset or closed under the request says nothing: every stream of the session shares it,
/// including those the daemon was working on, so such a request may have taken effect.
fn never_delivered(err: &reqwest::Error) -> bool {
    if err.is_connect() {
        return true;
    }
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        if let Some(h2) = cause.downcast_ref::<h2::Error>()
            && h2.reason() == Some(h2::Reason::REFUSED_STREAM)
        {
            return true;
        }
        source = cause.source();
    }
    false
}

/// Delay before the `n`th resumption in a row that brought nothing new (the first is
/// immediate, then 100 ms doubling to 1.6 s), when the server asked for no `retry`.
fn resume_backoff(n: u32) -> Duration {
    Backoff::new(Duration::from_millis(100), Duration::from_millis(1600)).delay_after(n)
}

/// An error with its chain of causes (reqwest's own message leaves out the cause).
pub(crate) fn describe(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// The start of a body, for messages and logs.
pub(crate) fn snippet(body: &[u8]) -> String {
    const MAX: usize = 300;
    let text = String::from_utf8_lossy(&body[..body.len().min(MAX)]);
    if body.len() > MAX { format!("{text}…") } else { text.into_owned() }
}
