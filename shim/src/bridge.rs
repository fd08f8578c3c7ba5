//! The bridge proper: forwards each stdin message to `/mcp`, copies every answer to stdout, and
//! keeps one MCP session with the daemon, re-establishing it when it is lost (MCP 2025-11-25,
//! basic/transports §Streamable HTTP: "Sending Messages to the Server", "Listening for Messages
//! from the Server", "Resumability and Redelivery", "Session Management").
//!
//! Who ends what: every request runs in a task of `requests`, every `GET /mcp` listener and
//! session `DELETE` in a task of `background`; both end when `stop` is cancelled by
//! [`Bridge::close`]. A listener also ends with the session it belongs to ([`Link::lost`]).
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderValue};
use reqwest::{Method, StatusCode};
use secrecy::ExposeSecret;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::{OwnedRwLockWriteGuard, RwLock, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};

use crate::connector::{Connector, Endpoint};
use crate::frame::{Frame, sniff_id};
use crate::jsonrpc::{
    self, DAEMON_UNAVAILABLE, INTERNAL_ERROR, INVALID_REQUEST, Kind, PARSE_ERROR, ParseError, Parsed,
};
use crate::sse::{SseEvent, SseParser};
use crate::{Config, ShimError};

const SESSION_ID: &str = "mcp-session-id";
const PROTOCOL_VERSION: &str = "mcp-protocol-version";
const LAST_EVENT_ID: &str = "last-event-id";
const TOKEN: &str = "x-coffer-token";
const EVENT_STREAM: &str = "text/event-stream";

/// Resumptions of a response stream in a row that bring no new event before the request is
/// given up (answered with -32001).
const MAX_IDLE_RESUMES: u32 = 5;
/// How long a notification or response may wait for the daemon's `202`.
const NOTIFY_TIMEOUT: Duration = Duration::from_secs(10);
/// Reconnection delay of the `GET /mcp` listener when the server gave no `retry`, doubled for
/// every connection in a row that delivered nothing, up to [`LISTEN_RETRY_MAX`].
const LISTEN_RETRY: Duration = Duration::from_secs(1);
const LISTEN_RETRY_MAX: Duration = Duration::from_secs(30);

/// One connection to the daemon and, once `initialize` succeeded, one MCP session on it.
struct Link {
    /// Counts links in this process, for logs.
    generation: u64,
    endpoint: Endpoint,
    session_id: Option<HeaderValue>,
    protocol_version: Option<HeaderValue>,
    /// Cancelled when the daemon connection or the session is found lost; every request in
    /// flight on this link waits on it so it can be answered at once.
    lost: CancellationToken,
    /// Why `lost` was cancelled; set exactly once, by whoever cancels.
    lost_reason: OnceLock<String>,
    /// The `GET /mcp` listener has been started.
    listening: AtomicBool,
}

impl Link {
    fn new(
        generation: u64,
        endpoint: Endpoint,
        session_id: Option<HeaderValue>,
        protocol_version: Option<HeaderValue>,
    ) -> Arc<Self> {
        Arc::new(Self {
            generation,
            endpoint,
            session_id,
            protocol_version,
            lost: CancellationToken::new(),
            lost_reason: OnceLock::new(),
            listening: AtomicBool::new(false),
        })
    }

    fn usable(&self) -> bool {
        !self.lost.is_cancelled()
    }

    fn reason(&self) -> String {
        self.lost_reason.get().cloned().unwrap_or_else(|| "the daemon connection was lost".into())
    }

    /// A request to `/mcp` with the token and, when known, the session headers.
    fn request(&self, method: Method) -> reqwest::RequestBuilder {
        let mut token = HeaderValue::from_str(self.endpoint.token.expose_secret())
            .unwrap_or_else(|_| HeaderValue::from_static("invalid-token"));
        token.set_sensitive(true);
        let mut req = self.endpoint.http.request(method, self.endpoint.mcp_url()).header(TOKEN, token);
        if let Some(id) = &self.session_id {
            req = req.header(SESSION_ID, id.clone());
        }
        if let Some(v) = &self.protocol_version {
            req = req.header(PROTOCOL_VERSION, v.clone());
        }
        req
    }
}

/// The daemon connection or session is gone (daemon dead, connection refused or broken, HTTP 404
/// for the session, HTTP 401 for a token from before a restart).
struct Lost(String);

/// What a POST brought back.
enum Answer {
    /// `202 Accepted`, no body.
    Accepted,
    /// The response for the request (or the error standing in for it).
    Response(Frame),
    /// The server ended the response stream without answering and it cannot be resumed.
    Ended,
    /// A notification or response the server did not accept (what it said, for the log).
    Rejected(String),
}

struct Posted {
    answer: Answer,
    /// The `Mcp-Session-Id` header of the answer, if any.
    session_id: Option<HeaderValue>,
}

/// The answer to `GET /mcp`.
enum Listen {
    Stream(reqwest::Response),
    /// `405`: the server offers no stream here.
    NotOffered,
    Rejected(StatusCode),
}

/// Where server messages that are not the awaited response go.
#[derive(Clone, Copy)]
enum Sink {
    Client,
    /// The replayed `initialize` belongs to the shim: nothing of it reaches the client.
    Discard,
}

/// The client's `initialize`, kept to replay it on a new session.
struct InitRecord {
    request: Value,
    /// The client has sent `notifications/initialized`.
    initialized: bool,
}

/// The part of an `InitializeResult` the transport needs.
#[derive(Deserialize)]
struct InitializeReply {
    result: Option<InitializeResult>,
}

#[derive(Deserialize)]
struct InitializeResult {
    #[serde(rename = "protocolVersion")]
    protocol_version: Option<String>,
}

pub(crate) struct Bridge<C> {
    connector: C,
    config: Config,
    out: mpsc::Sender<Frame>,
    /// The current link. Readers clone it; the writer lock is held while a session is being
    /// established, so messages that need the session wait for it.
    slot: Arc<RwLock<Option<Arc<Link>>>>,
    init: Mutex<Option<InitRecord>>,
    generations: AtomicU64,
    replays: AtomicU64,
    stop: CancellationToken,
    requests: TaskTracker,
    background: TaskTracker,
}

impl<C: Connector> Bridge<C> {
    pub(crate) fn new(connector: C, config: Config, out: mpsc::Sender<Frame>) -> Arc<Self> {
        Arc::new(Self {
            connector,
            config,
            out,
            slot: Arc::new(RwLock::new(None)),
            init: Mutex::new(None),
            generations: AtomicU64::new(0),
            replays: AtomicU64::new(0),
            stop: CancellationToken::new(),
            requests: TaskTracker::new(),
            background: TaskTracker::new(),
        })
    }

    /// Handles one stdin line. Returns once the message is handed off: a request once its
    /// task runs (and, for `initialize`, holds the session slot, so later messages wait for the
    /// session), a notification or response once the daemon accepted it.
    pub(crate) async fn dispatch(self: &Arc<Self>, line: Vec<u8>) {
        if line.iter().all(u8::is_ascii_whitespace) {
            return;
        }
        let line = Bytes::from(line);
        match jsonrpc::parse(&line) {
            Err(ParseError::Syntax) => {
                self.emit(jsonrpc::error_frame(
                    &Value::Null,
                    PARSE_ERROR,
                    "Parse error: the line is not valid JSON.",
                    None,
                ))
                .await;
            }
            Err(ParseError::NotAMessage) => {
                self.emit(jsonrpc::error_frame(
                    &Value::Null,
                    INVALID_REQUEST,
                    "Invalid Request: expected a JSON-RPC object or batch array.",
                    None,
                ))
                .await;
            }
            Ok(Parsed::Single(kind)) => self.dispatch_one(kind, line.clone()).await,
            Ok(Parsed::Batch(items)) if items.is_empty() => {
                self.emit(jsonrpc::error_frame(&Value::Null, INVALID_REQUEST, "Invalid Request: empty batch.", None))
                    .await;
            }
            Ok(Parsed::Batch(items)) => {
                let messages: Vec<(Kind, Bytes)> = items
                    .iter()
                    .map(|raw| {
                        let body = line.slice_ref(raw.get().as_bytes());
                        let kind = match jsonrpc::parse(&body) {
                            Ok(Parsed::Single(kind)) => kind,
                            _ => Kind::Invalid { id: Value::Null },
                        };
                        (kind, body)
                    })
                    .collect();
                let this = self.clone();
                self.spawn_request(async move { this.batch(messages).await });
            }
        }
    }

    /// Answers a stdin line over the frame limit with -32600 for its id (null if not found).
    pub(crate) async fn reject_oversized(&self, prefix: &[u8]) {
        let id = sniff_id(prefix);
        let limit = self.config.max_frame_bytes;
        warn!(limit_bytes = limit, id = %id, "Rejected a stdin message over the frame limit.");
        let message = format!("Invalid Request: the message is larger than the stdio frame limit of {limit} bytes.");
        self.emit(jsonrpc::error_frame(&id, INVALID_REQUEST, &message, None)).await;
    }

    /// Ends the bridge: after stdin EOF (`drain`) first waits for in-flight requests (at most
    /// [`Config::drain_timeout`], or until `shutdown`), then stops every task and ends the
    /// session with `DELETE /mcp`.
    pub(crate) async fn close(&self, drain: bool, shutdown: &CancellationToken) {
        self.requests.close();
        if drain {
            tokio::select! {
                () = self.requests.wait() => {}
                () = tokio::time::sleep(self.config.drain_timeout) => {
                    debug!("In-flight requests did not finish before the drain timeout.");
                }
                () = shutdown.cancelled() => {}
            }
        }
        self.stop.cancel();
        self.requests.wait().await;
        self.background.close();
        self.background.wait().await;
        let link = self.slot.try_read().ok().and_then(|slot| slot.clone());
        if let Some(link) = link.filter(|l| l.usable() && l.session_id.is_some()) {
            self.delete(&link).await;
        }
    }

    fn spawn_request<F>(&self, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let stop = self.stop.clone();
        self.requests.spawn(async move {
            tokio::select! {
                () = stop.cancelled() => {}
                () = task => {}
            }
        });
    }

    async fn emit(&self, frame: Frame) {
        // An error means the writer is gone (stdout closed); the shim is shutting down then.
        let _ = self.out.send(frame).await;
    }

    async fn deliver(&self, sink: Sink, frame: Frame) {
        match sink {
            Sink::Client => self.emit(frame).await,
            Sink::Discard => {}
        }
    }

    async fn dispatch_one(self: &Arc<Self>, kind: Kind, body: Bytes) {
        match kind {
            Kind::Request { id, method } if method == "initialize" => {
                let slot = self.slot.clone().write_owned().await;
                let this = self.clone();
                self.spawn_request(async move { this.initialize(id, body, slot).await });
            }
            Kind::Request { id, .. } => {
                let this = self.clone();
                self.spawn_request(async move {
                    let frame = this.request(&id, &body).await;
                    this.emit(frame).await;
                });
            }
            Kind::Notification { method } => self.notify(Some(&method), &body).await,
            Kind::Response { .. } => self.notify(None, &body).await,
            Kind::Invalid { id } => self.emit(invalid_frame(&id)).await,
        }
    }

    async fn batch(self: Arc<Self>, messages: Vec<(Kind, Bytes)>) {
        let this = &self;
        let answers = futures_util::future::join_all(messages.into_iter().map(|(kind, body)| async move {
            match kind {
                Kind::Request { id, method } if method == "initialize" => Some(jsonrpc::error_frame(
                    &id,
                    INVALID_REQUEST,
                    "Invalid Request: initialize must not be part of a JSON-RPC batch.",
                    None,
                )),
                Kind::Request { id, .. } => Some(this.request(&id, &body).await),
                Kind::Notification { method } => {
                    this.notify(Some(&method), &body).await;
                    None
                }
                Kind::Response { .. } => {
                    this.notify(None, &body).await;
                    None
                }
                Kind::Invalid { id } => Some(invalid_frame(&id)),
            }
        }))
        .await;
        let frames: Vec<Frame> = answers.into_iter().flatten().collect();
        if !frames.is_empty() {
            self.emit(Frame::batch(&frames)).await;
        }
    }

    /// Forwards a request and returns the frame that answers it.
    async fn request(self: &Arc<Self>, id: &Value, body: &Bytes) -> Frame {
        match self.acquire().await {
            Ok(link) => self.exchange(&link, body, id, Sink::Client).await.0,
            Err(err) => unreachable_frame(id, &err.to_string()),
        }
    }

    /// Forwards a notification or a response to a server request; logs what the daemon refused
    /// (JSON-RPC gives the client no answer to these).
    async fn notify(self: &Arc<Self>, method: Option<&str>, body: &Bytes) {
        let initialized = method == Some("notifications/initialized");
        if initialized && let Some(record) = self.init.lock().unwrap_or_else(PoisonError::into_inner).as_mut() {
            record.initialized = true;
        }
        let link = match self.acquire().await {
            Ok(link) => link,
            Err(err) => {
                warn!(error = %err, method, "Dropped a message for the daemon: it cannot be reached.");
                return;
            }
        };
        // The reader waits for this POST (to keep the client's order), so it must not wait
        // forever on a wedged daemon.
        let result = tokio::select! {
            biased;
            () = link.lost.cancelled() => Err(Lost(link.reason())),
            () = tokio::time::sleep(NOTIFY_TIMEOUT) => Ok(Posted {
                answer: Answer::Rejected(format!("no answer within {NOTIFY_TIMEOUT:?}")),
                session_id: None,
            }),
            posted = self.post(&link, body, None, Sink::Client) => posted,
        };
        match result {
            Ok(Posted { answer: Answer::Accepted, .. }) if initialized => self.listen(&link),
            Ok(Posted { answer: Answer::Rejected(reason), .. }) => {
                warn!(method, %reason, "The daemon did not accept a notification or response.");
            }
            Ok(_) => {}
            Err(Lost(reason)) => self.lose(&link, &reason),
        }
    }

    /// The client's `initialize`: starts a new session (ending the one it replaces) while
    /// holding the session slot, so nothing else is forwarded before the session id is known.
    async fn initialize(self: Arc<Self>, id: Value, body: Bytes, mut slot: OwnedRwLockWriteGuard<Option<Arc<Link>>>) {
        let previous = slot.take();
        let endpoint = match previous.as_ref().filter(|l| l.usable()) {
            Some(link) => link.endpoint.clone(),
            None => match self.connector.connect().await {
                Ok(endpoint) => endpoint,
                Err(err) => {
                    drop(slot);
                    self.emit(unreachable_frame(&id, &err.to_string())).await;
                    return;
                }
            },
        };
        if let Some(old) = previous.filter(|l| l.usable() && l.session_id.is_some()) {
            self.retire(old);
        }
        let fresh = Link::new(self.next_generation(), endpoint, None, None);
        let (frame, session_id) = self.exchange(&fresh, &body, &id, Sink::Client).await;
        if let Some(result) = initialize_result(&frame) {
            let request = serde_json::from_slice::<Value>(&body).ok();
            *self.init.lock().unwrap_or_else(PoisonError::into_inner) =
                request.map(|request| InitRecord { request, initialized: false });
            let version = result.protocol_version.as_deref().and_then(|v| HeaderValue::from_str(v).ok());
            debug!(generation = fresh.generation, protocol_version = ?result.protocol_version, "Session initialized.");
            *slot = Some(Link::new(fresh.generation, fresh.endpoint.clone(), session_id, version));
        } else if fresh.usable() {
            // The daemon refused this initialize; keep the connection for whatever comes next.
            *slot = Some(fresh);
        }
        drop(slot);
        self.emit(frame).await;
    }

    /// The current link, or a new one: detect-or-spawn, then (once the client initialized)
    /// a replay of its `initialize` and `notifications/initialized`.
    async fn acquire(self: &Arc<Self>) -> Result<Arc<Link>, ShimError> {
        if let Some(link) = self.slot.read().await.as_ref().filter(|l| l.usable()) {
            return Ok(link.clone());
        }
        let mut slot = self.slot.write().await;
        if let Some(link) = slot.as_ref().filter(|l| l.usable()) {
            return Ok(link.clone());
        }
        let link = self.establish().await?;
        *slot = Some(link.clone());
        Ok(link)
    }

    async fn establish(self: &Arc<Self>) -> Result<Arc<Link>, ShimError> {
        let endpoint = self.connector.connect().await.map_err(ShimError::Connect)?;
        let generation = self.next_generation();
        let record = {
            let init = self.init.lock().unwrap_or_else(PoisonError::into_inner);
            init.as_ref().map(|r| (r.request.clone(), r.initialized))
        };
        let Some((mut request, initialized)) = record else {
            return Ok(Link::new(generation, endpoint, None, None));
        };
        let n = self.replays.fetch_add(1, Ordering::Relaxed) + 1;
        let id = json!(format!("coffer-shim-reinit-{n}"));
        request["id"] = id.clone();
        let body = Bytes::from(serde_json::to_vec(&request).unwrap_or_default());
        let fresh = Link::new(generation, endpoint, None, None);
        let (frame, session_id) = self.exchange(&fresh, &body, &id, Sink::Discard).await;
        let Some(result) = initialize_result(&frame) else {
            return Err(ShimError::Reinitialize(snippet(frame.bytes())));
        };
        let version = result.protocol_version.as_deref().and_then(|v| HeaderValue::from_str(v).ok());
        let link = Link::new(generation, fresh.endpoint.clone(), session_id, version);
        if initialized {
            let body = Bytes::from_static(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
            match self.post(&link, &body, None, Sink::Discard).await {
                Ok(Posted { answer: Answer::Rejected(reason), .. }) | Err(Lost(reason)) => {
                    return Err(ShimError::Reinitialize(reason));
                }
                Ok(_) => self.listen(&link),
            }
        }
        info!(generation, protocol_version = ?result.protocol_version, "Re-established the MCP session with the Coffer daemon.");
        Ok(link)
    }

    /// POSTs a request on `link` and turns every outcome into the frame for the client;
    /// also returns the answer's `Mcp-Session-Id` header.
    async fn exchange(&self, link: &Link, body: &Bytes, id: &Value, sink: Sink) -> (Frame, Option<HeaderValue>) {
        let result = tokio::select! {
            biased;
            () = link.lost.cancelled() => Err(Lost(link.reason())),
            posted = self.post(link, body, Some(id), sink) => posted,
        };
        match result {
            Ok(Posted { answer, session_id }) => {
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
                (frame, session_id)
            }
            Err(Lost(reason)) => {
                self.lose(link, &reason);
                (jsonrpc::lost_frame(id, &link.reason()), None)
            }
        }
    }

    /// One POST of one message (MCP 2025-11-25, basic/transports §"Sending Messages to the
    /// Server"). `request_id` is `None` for notifications and responses, which expect `202`.
    async fn post(&self, link: &Link, body: &Bytes, request_id: Option<&Value>, sink: Sink) -> Result<Posted, Lost> {
        let resp = link
            .request(Method::POST)
            .header(CONTENT_TYPE, "application/json")
            .header(ACCEPT, "application/json, text/event-stream")
            .body(body.clone())
            .send()
            .await
            .map_err(|e| Lost(format!("POST /mcp failed: {}", describe(&e))))?;
        let status = resp.status();
        let session_id = resp.headers().get(SESSION_ID).cloned();
        check_session(link, status)?;
        let Some(id) = request_id else {
            let answer = if status.is_success() {
                Answer::Accepted
            } else {
                let body = resp.bytes().await.unwrap_or_default();
                Answer::Rejected(format!("HTTP {status}: {}", snippet(&body)))
            };
            return Ok(Posted { answer, session_id });
        };
        if status == StatusCode::ACCEPTED {
            return Ok(Posted { answer: Answer::Accepted, session_id });
        }
        if status.is_success() && is_event_stream(&resp) {
            let answer = self.read_stream(link, resp, id, sink).await?;
            return Ok(Posted { answer, session_id });
        }
        let body =
            resp.bytes().await.map_err(|e| Lost(format!("reading the /mcp response failed: {}", describe(&e))))?;
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
        Ok(Posted { answer: Answer::Response(frame), session_id })
    }

    /// Reads an SSE response until the response to `id` arrives, writing every other message
    /// to `sink`; resumes with `GET` + `Last-Event-ID` when the stream ends early and the
    /// server gave event ids (§"Resumability and Redelivery").
    async fn read_stream(
        &self,
        link: &Link,
        mut resp: reqwest::Response,
        id: &Value,
        sink: Sink,
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
                    Some(err) => Err(Lost(format!("the response stream broke: {err}"))),
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
            resp = match self.open_stream(link, Some(&last)).await? {
                Listen::Stream(resp) => resp,
                Listen::NotOffered | Listen::Rejected(_) => return Ok(Answer::Ended),
            };
            parser.start_new_response();
        }
    }

    /// Handles one SSE event: returns it if it is the response to `id`, else writes it.
    async fn on_event(&self, event: SseEvent, id: Option<&Value>, sink: Sink) -> Option<Frame> {
        if event.data.iter().all(u8::is_ascii_whitespace) {
            return None; // a priming event: it only carries an id
        }
        let data = Bytes::from(event.data);
        let kind = match jsonrpc::parse(&data) {
            Ok(Parsed::Single(kind)) => Some(kind),
            Ok(Parsed::Batch(_)) => None,
            Err(_) => {
                warn!(event = %event.event, "Skipped an SSE event whose data is not JSON-RPC.");
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
        self.deliver(sink, frame).await;
        None
    }

    /// `GET /mcp` (§"Listening for Messages from the Server"), optionally resuming after
    /// `last_event_id`.
    async fn open_stream(&self, link: &Link, last_event_id: Option<&str>) -> Result<Listen, Lost> {
        let mut req = link.request(Method::GET).header(ACCEPT, EVENT_STREAM);
        if let Some(last) = last_event_id.and_then(|v| HeaderValue::from_str(v).ok()) {
            req = req.header(LAST_EVENT_ID, last);
        }
        let resp = req.send().await.map_err(|e| Lost(format!("GET /mcp failed: {}", describe(&e))))?;
        let status = resp.status();
        check_session(link, status)?;
        if status == StatusCode::METHOD_NOT_ALLOWED {
            return Ok(Listen::NotOffered);
        }
        if status.is_success() && is_event_stream(&resp) {
            return Ok(Listen::Stream(resp));
        }
        Ok(Listen::Rejected(status))
    }

    /// Starts the `GET /mcp` listener of `link` (once; only for a link with a session).
    fn listen(self: &Arc<Self>, link: &Arc<Link>) {
        if link.session_id.is_none() || link.listening.swap(true, Ordering::AcqRel) {
            return;
        }
        let (this, link) = (self.clone(), link.clone());
        let stop = self.stop.clone();
        self.background.spawn(async move {
            tokio::select! {
                () = stop.cancelled() => {}
                () = link.lost.cancelled() => {}
                () = this.listen_loop(&link) => {}
            }
        });
    }

    async fn listen_loop(&self, link: &Link) {
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
                                    self.on_event(event, None, Sink::Client).await;
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
                Err(Lost(reason)) => {
                    self.lose(link, &reason);
                    return;
                }
            }
            let delay = parser.retry().unwrap_or(LISTEN_RETRY).saturating_mul(1 << idle.min(5)).min(LISTEN_RETRY_MAX);
            tokio::time::sleep(delay).await;
        }
    }

    /// Marks `link` lost: every request in flight on it is answered at once, and the next
    /// message establishes a new session.
    fn lose(&self, link: &Link, reason: &str) {
        if link.lost_reason.set(reason.to_owned()).is_err() {
            return; // someone else found it first
        }
        link.lost.cancel();
        warn!(
            generation = link.generation,
            %reason,
            "Lost the MCP session with the Coffer daemon; requests in flight get an error and the next message re-initializes."
        );
    }

    /// Ends a session the client left by initializing again.
    fn retire(self: &Arc<Self>, old: Arc<Link>) {
        let _ = old.lost_reason.set("the client started a new session".into());
        old.lost.cancel();
        let this = self.clone();
        self.background.spawn(async move { this.delete(&old).await });
    }

    /// `DELETE /mcp` for the link's session (§"Session Management"), bounded by
    /// [`Config::delete_timeout`].
    async fn delete(&self, link: &Link) {
        match link.request(Method::DELETE).timeout(self.config.delete_timeout).send().await {
            Ok(resp) => debug!(status = %resp.status(), "Ended the MCP session."),
            Err(err) => debug!(error = %describe(&err), "Could not end the MCP session."),
        }
    }

    fn next_generation(&self) -> u64 {
        self.generations.fetch_add(1, Ordering::Relaxed) + 1
    }
}

/// 404 for a session we sent, or 401, means the session (or the daemon we knew) is gone.
fn check_session(link: &Link, status: StatusCode) -> Result<(), Lost> {
    if status == StatusCode::NOT_FOUND && link.session_id.is_some() {
        return Err(Lost("the daemon no longer knows this MCP session (HTTP 404)".into()));
    }
    if status == StatusCode::UNAUTHORIZED {
        return Err(Lost("the daemon refused the token (HTTP 401); it may have restarted".into()));
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

/// The `result` of an initialize response; `None` when it is an error.
fn initialize_result(frame: &Frame) -> Option<InitializeResult> {
    serde_json::from_slice::<InitializeReply>(frame.bytes()).ok()?.result
}

fn invalid_frame(id: &Value) -> Frame {
    jsonrpc::error_frame(
        id,
        INVALID_REQUEST,
        "Invalid Request: not a JSON-RPC request, notification or response.",
        None,
    )
}

fn unreachable_frame(id: &Value, reason: &str) -> Frame {
    jsonrpc::error_frame(
        id,
        DAEMON_UNAVAILABLE,
        "The Coffer daemon cannot be reached; the request may be retried.",
        Some(json!({"reason": reason})),
    )
}

/// Delay before the `n`th resumption in a row that brought nothing new (the first is
/// immediate), when the server asked for no `retry`.
fn resume_backoff(n: u32) -> Duration {
    if n == 0 { Duration::ZERO } else { Duration::from_millis(100 << (n - 1).min(4)) }
}

/// An error with its chain of causes (reqwest's own message leaves out the cause).
fn describe(err: &dyn std::error::Error) -> String {
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
fn snippet(body: &[u8]) -> String {
    const MAX: usize = 300;
    let text = String::from_utf8_lossy(&body[..body.len().min(MAX)]);
    if body.len() > MAX { format!("{text}…") } else { text.into_owned() }
}
