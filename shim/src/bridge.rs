//! The bridge proper: forwards each stdin message to `/mcp`, copies every answer to stdout, and
//! keeps one MCP session with the daemon, re-establishing it when it is lost (MCP 2025-11-25,
//! basic/transports §Streamable HTTP: "Sending Messages to the Server", "Listening for Messages
//! from the Server", "Resumability and Redelivery", "Session Management").
//!
//! Losing the session: a message that provably never reached a live session (connection refused,
//! or its HTTP/2 stream refused by the daemon; HTTP 404 for the session; HTTP 401 for a token
//! from before a daemon restart) was not acted on, so a request that meets such a loss is sent once more on a
//! re-established session ([`Bridge::request`]). Everything that may have taken effect gets
//! -32001 at once and is never resent; a request still waiting for its answer when another
//! message finds the session lost gets [`LOST_VERDICT_GRACE`] for its own POST to tell which it
//! is. Re-establishing (detect-or-spawn, replayed `initialize`) happens under the session slot's
//! write lock, once for every request that met the same loss. The one case that cannot be told
//! apart: a request written onto the HTTP/2 connection in the instant between the daemon's
//! death and its close reaching the shim fails like the requests the daemon was working on (the
//! connection broke under all of them), so it gets -32001 ([`Bridge::send`] lets pending socket
//! events in first, so a close that has arrived is always seen and the request goes to a new
//! connection, whose refusal is unambiguous).
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
use crate::stream::{Liveness, OpenError, StreamLink, Unsent};
use crate::{Config, ShimError};
use coffer_types::sse::{SseEvent, SseParser};

use coffer_types::header::{
    LAST_EVENT_ID, MCP_PROTOCOL_VERSION as PROTOCOL_VERSION, MCP_SESSION_ID as SESSION_ID, TOKEN,
};
use coffer_types::mcp::{ACCEPT_POST, EVENT_STREAM, JSON};

/// Resumptions of a response stream in a row that bring no new event before the request is
/// given up (answered with -32001).
const MAX_IDLE_RESUMES: u32 = 5;
/// How long a notification or response may wait for the daemon's `202`.
const NOTIFY_TIMEOUT: Duration = Duration::from_secs(10);
/// Reconnection delay of the `GET /mcp` listener when the server gave no `retry`, doubled for
/// every connection in a row that delivered nothing, up to [`LISTEN_RETRY_MAX`].
const LISTEN_RETRY: Duration = Duration::from_secs(1);
const LISTEN_RETRY_MAX: Duration = Duration::from_secs(30);
/// When the link is found lost (by another message or the `GET` stream) while a request still
/// waits for the head of its answer, how long its own POST may take to show whether it reached
/// the daemon (a dead daemon refuses or resets it at once) before it counts as in flight.
const LOST_VERDICT_GRACE: Duration = Duration::from_secs(1);

/// One connection to the daemon and, once `initialize` succeeded, one MCP session on it.
struct Link {
    /// Counts links in this process, for logs.
    generation: u64,
    endpoint: Endpoint,
    /// `{base_url}/mcp`, parsed once (`None` when it does not parse: each request then reports it).
    mcp_url: Option<reqwest::Url>,
    /// The token header, built once.
    token: HeaderValue,
    session_id: Option<HeaderValue>,
    protocol_version: Option<HeaderValue>,
    /// Cancelled when the daemon connection or the session is found lost; every request in
    /// flight on this link waits on it so it can be answered at once.
    lost: CancellationToken,
    /// Why `lost` was cancelled; set exactly once, by whoever cancels.
    lost_reason: Arc<OnceLock<String>>,
    /// The `/mcp` stream this link talks on ([`StreamLink`]); `None`: Streamable HTTP.
    stream: Option<Arc<StreamLink>>,
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
        let mut token = HeaderValue::from_str(endpoint.token.expose_secret())
            .unwrap_or_else(|_| HeaderValue::from_static("invalid-token"));
        token.set_sensitive(true);
        Arc::new(Self {
            generation,
            mcp_url: reqwest::Url::parse(&endpoint.mcp_url()).ok(),
            token,
            endpoint,
            session_id,
            protocol_version,
            lost: CancellationToken::new(),
            lost_reason: Arc::default(),
            stream: None,
            listening: AtomicBool::new(false),
        })
    }

    /// The same connection once `initialize` succeeded on it: the session's headers added, the
    /// loss state and the stream shared (losing one loses both).
    fn with_session(&self, session_id: Option<HeaderValue>, protocol_version: Option<HeaderValue>) -> Arc<Self> {
        Arc::new(Self {
            generation: self.generation,
            endpoint: self.endpoint.clone(),
            mcp_url: self.mcp_url.clone(),
            token: self.token.clone(),
            session_id,
            protocol_version,
            lost: self.lost.clone(),
            lost_reason: self.lost_reason.clone(),
            stream: self.stream.clone(),
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
        let req = match &self.mcp_url {
            Some(url) => self.endpoint.http.request(method, url.clone()),
            None => self.endpoint.http.request(method, self.endpoint.mcp_url()),
        };
        let mut req = req.header(TOKEN, self.token.clone());
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
struct Lost {
    reason: String,
    /// The message provably never reached a live session: the connection was refused (or could
    /// not be made), the daemon refused its HTTP/2 stream, or the daemon answered 404 for the
    /// session or 401 for the token. The daemon did not act on it, so it may be sent again on a new session.
    /// Everything else (a connection closed before the answer was complete, a broken response
    /// stream) may have taken effect.
    undelivered: bool,
}

impl Lost {
    fn undelivered(reason: impl Into<String>) -> Self {
        Self { reason: reason.into(), undelivered: true }
    }

    fn in_flight(reason: impl Into<String>) -> Self {
        Self { reason: reason.into(), undelivered: false }
    }

    /// The same loss met after the daemon had the message (e.g. resuming its response stream).
    fn after_delivery(self) -> Self {
        Self { undelivered: false, ..self }
    }
}

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
    /// Re-establishments that have ended, and the error of the last one that failed: requests
    /// that waited while one ran take its outcome instead of starting another.
    attempts: AtomicU64,
    failed: Mutex<Option<(u64, Arc<ShimError>)>>,
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
            attempts: AtomicU64::new(0),
            failed: Mutex::new(None),
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
            Err(ParseError::Shape { id, reason }) => {
                let message = format!("Invalid Request: {reason}");
                self.emit(jsonrpc::error_frame(&id, INVALID_REQUEST, &message, None)).await;
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
        let stream = self.slot.try_read().ok().and_then(|slot| slot.as_ref().and_then(|l| l.stream.clone()));
        if drain {
            let stream_drained = async {
                if let Some(stream) = &stream {
                    stream.drained().await;
                }
            };
            tokio::select! {
                () = async { tokio::join!(self.requests.wait(), stream_drained); } => {}
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
        if let Some(stream) = link.as_ref().and_then(|l| l.stream.as_ref()) {
            // Closing the stream ends its session.
            stream.end("the client ended the session");
        } else if let Some(link) = link.filter(|l| l.usable() && l.session_id.is_some()) {
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
                let Some((id, body)) = self.send_on_stream(id, body).await else { return };
                let this = self.clone();
                self.spawn_request(async move {
                    let frame = this.request(&id, &body).await;
                    this.emit(frame).await;
                });
            }
            Kind::Notification { method } => {
                if method == "notifications/cancelled"
                    && let Some(stream) = self.current_stream()
                    && let Some(id) = cancelled_request_id(&body)
                {
                    stream.forget_cancelled(&id);
                }
                self.notify(Some(&method), &body).await
            }
            Kind::Response { .. } => self.notify(None, &body).await,
            Kind::Invalid { id } => self.emit(invalid_frame(&id)).await,
        }
    }

    /// The fast path on a `/mcp` stream: the request is written in stdin order and its answer
    /// goes from the stream's reader straight to stdout, with no task of its own (a request
    /// whose id is still in flight is answered with -32600 instead). Gives the request back when
    /// there is no usable stream link (it then takes the general path, which re-establishes the
    /// session when needed).
    async fn send_on_stream(&self, id: Value, body: Bytes) -> Option<(Value, Bytes)> {
        let Some(mut stream) = self.current_stream() else { return Some((id, body)) };
        if stream.is_idle() {
            // Nothing in flight: the daemon may have closed the stream since the last answer.
            // Let the runtime take in pending socket events first (a yielded task resumes only
            // after the I/O driver ran), so a request is not written onto a stream whose close
            // has already arrived.
            tokio::task::yield_now().await;
            match self.current_stream() {
                Some(current) => stream = current,
                None => return Some((id, body)),
            }
        }
        match stream.send_for_client(id.clone(), body.clone()).await {
            Ok(()) => None,
            Err(Unsent::DuplicateId) => {
                self.emit(duplicate_id_frame(&id)).await;
                None
            }
            Err(Unsent::Lost) => Some((id, body)),
        }
    }

    fn current_stream(&self) -> Option<Arc<StreamLink>> {
        let slot = self.slot.try_read().ok()?;
        slot.as_ref().filter(|l| l.usable())?.stream.clone()
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
    ///
    /// A request that provably never reached a live session (see [`Lost::undelivered`]) is sent
    /// once more on a re-established session: the daemon did not act on it, and the client sent
    /// it to a daemon it believed running. Requests that may have taken effect are never resent.
    async fn request(self: &Arc<Self>, id: &Value, body: &Bytes) -> Frame {
        let link = match self.acquire().await {
            Ok(link) => link,
            Err(err) => return unreachable_frame(id, &err.to_string()),
        };
        let lost = match self.exchange(&link, body, id, Sink::Client).await {
            Ok((frame, _)) => return frame,
            Err(lost) => lost,
        };
        self.lose(&link, &lost.reason);
        if !lost.undelivered {
            return failure_frame(id, &lost);
        }
        debug!(
            generation = link.generation,
            reason = %lost.reason,
            "A request never reached the daemon; sending it again on a new session."
        );
        // Waits for (or runs) the one re-establishment that every request which met the lost
        // link shares: detect-or-spawn and the replayed initialize.
        let link = match self.acquire().await {
            Ok(link) => link,
            Err(err) => return unreachable_frame(id, &err.to_string()),
        };
        match self.exchange(&link, body, id, Sink::Client).await {
            Ok((frame, _)) => frame,
            Err(lost) => {
                self.lose(&link, &lost.reason);
                failure_frame(id, &lost)
            }
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
            () = link.lost.cancelled() => Err(Lost::in_flight(link.reason())),
            () = tokio::time::sleep(NOTIFY_TIMEOUT) => Ok(Answer::Rejected(format!("no answer within {NOTIFY_TIMEOUT:?}"))),
            posted = self.post(&link, body) => posted,
        };
        match result {
            Ok(Answer::Accepted) if initialized => self.listen(&link),
            Ok(Answer::Rejected(reason)) => {
                warn!(method, %reason, "The daemon did not accept a notification or response.");
            }
            Ok(_) => {}
            Err(lost) => {
                warn!(method, reason = %lost.reason, "Dropped a message for the daemon: the session was lost.");
                self.lose(&link, &lost.reason);
            }
        }
    }

    /// The client's `initialize`: starts a new session (ending the one it replaces) while
    /// holding the session slot, so nothing else is forwarded before the session id is known.
    /// Like any request, it is sent once more (after detect-or-spawn again) when it provably
    /// never reached the daemon.
    async fn initialize(self: Arc<Self>, id: Value, body: Bytes, mut slot: OwnedRwLockWriteGuard<Option<Arc<Link>>>) {
        let previous = slot.take();
        let mut endpoint = previous.as_ref().filter(|l| l.usable()).map(|l| l.endpoint.clone());
        if let Some(old) = previous.filter(|l| l.usable() && (l.session_id.is_some() || l.stream.is_some())) {
            self.retire(old);
        }
        let mut resent = false;
        let (fresh, frame, session_id) = loop {
            let endpoint = match endpoint.take() {
                Some(endpoint) => endpoint,
                None => match self.connector.connect().await {
                    Ok(endpoint) => endpoint,
                    Err(err) => {
                        drop(slot);
                        self.emit(unreachable_frame(&id, &err.to_string())).await;
                        return;
                    }
                },
            };
            let attempt = match self.open_link(endpoint).await {
                Ok(fresh) => self.exchange(&fresh, &body, &id, Sink::Client).await.map(|(f, sid)| (fresh, f, sid)),
                Err(lost) => Err(lost),
            };
            match attempt {
                Ok(done) => break done,
                Err(lost) if lost.undelivered && !resent => {
                    debug!(reason = %lost.reason, "The initialize never reached the daemon; detect-or-spawn again.");
                    resent = true;
                }
                Err(lost) => {
                    drop(slot);
                    self.emit(failure_frame(&id, &lost)).await;
                    return;
                }
            }
        };
        if let Some(result) = initialize_result(&frame) {
            let request = serde_json::from_slice::<Value>(&body).ok();
            *self.init.lock().unwrap_or_else(PoisonError::into_inner) =
                request.map(|request| InitRecord { request, initialized: false });
            let version = result.protocol_version.as_deref().and_then(|v| HeaderValue::from_str(v).ok());
            debug!(generation = fresh.generation, protocol_version = ?result.protocol_version, "Session initialized.");
            *slot = Some(fresh.with_session(session_id, version));
        } else {
            // The daemon refused this initialize; keep the connection for whatever comes next.
            *slot = Some(fresh);
        }
        drop(slot);
        self.emit(frame).await;
    }

    /// The current link, or a new one: detect-or-spawn, then (once the client initialized)
    /// a replay of its `initialize` and `notifications/initialized`.
    ///
    /// One re-establishment at a time, shared: whoever finds the link lost takes the slot's
    /// write lock and establishes; everyone who waited meanwhile gets the new link, or, when
    /// that attempt failed, its error (rather than starting one attempt each).
    async fn acquire(self: &Arc<Self>) -> Result<Arc<Link>, Arc<ShimError>> {
        let seen = self.attempts.load(Ordering::Acquire);
        if let Some(link) = self.slot.read().await.as_ref().filter(|l| l.usable()) {
            return Ok(link.clone());
        }
        let mut slot = self.slot.write().await;
        if let Some(link) = slot.as_ref().filter(|l| l.usable()) {
            return Ok(link.clone());
        }
        if let Some((attempt, err)) = self.failed.lock().unwrap_or_else(PoisonError::into_inner).as_ref()
            && *attempt > seen
        {
            return Err(err.clone());
        }
        let result = self.establish().await;
        let attempt = self.attempts.fetch_add(1, Ordering::AcqRel) + 1;
        match result {
            Ok(link) => {
                *slot = Some(link.clone());
                Ok(link)
            }
            Err(err) => {
                warn!(error = %err, "Could not re-establish the MCP session with the Coffer daemon.");
                let err = Arc::new(err);
                *self.failed.lock().unwrap_or_else(PoisonError::into_inner) = Some((attempt, err.clone()));
                Err(err)
            }
        }
    }

    async fn establish(self: &Arc<Self>) -> Result<Arc<Link>, ShimError> {
        let endpoint = self.connector.connect().await.map_err(ShimError::Connect)?;
        let record = {
            let init = self.init.lock().unwrap_or_else(PoisonError::into_inner);
            init.as_ref().map(|r| (r.request.clone(), r.initialized))
        };
        let Some((mut request, initialized)) = record else {
            return self.open_link(endpoint).await.map_err(|lost| ShimError::Connect(lost.reason.into()));
        };
        let n = self.replays.fetch_add(1, Ordering::Relaxed) + 1;
        let id = json!(format!("coffer-shim-reinit-{n}"));
        request["id"] = id.clone();
        let body = Bytes::from(serde_json::to_vec(&request).unwrap_or_default());
        let fresh = self.open_link(endpoint).await.map_err(|lost| ShimError::Connect(lost.reason.into()))?;
        let (frame, session_id) = self
            .exchange(&fresh, &body, &id, Sink::Discard)
            .await
            .map_err(|lost| ShimError::Reinitialize(lost.reason))?;
        let Some(result) = initialize_result(&frame) else {
            return Err(ShimError::Reinitialize(snippet(frame.bytes())));
        };
        let version = result.protocol_version.as_deref().and_then(|v| HeaderValue::from_str(v).ok());
        let link = fresh.with_session(session_id, version);
        if initialized {
            let body = Bytes::from_static(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
            match self.post(&link, &body).await {
                Ok(Answer::Rejected(reason)) | Err(Lost { reason, .. }) => {
                    return Err(ShimError::Reinitialize(reason));
                }
                Ok(_) => self.listen(&link),
            }
        }
        info!(generation = link.generation, protocol_version = ?result.protocol_version, "Re-established the MCP session with the Coffer daemon.");
        Ok(link)
    }

    /// POSTs a request on `link` and turns every answer into the frame for the client; also
    /// returns the answer's `Mcp-Session-Id` header. `Err` when the link turned out lost; the
    /// caller decides what the client gets (and marks the link lost).
    ///
    /// Once the response has begun, the link being found lost (by anyone) ends the request at
    /// once: it may have taken effect, and its stream may never end. Before that, whether it
    /// reached the daemon is for its own POST to tell — a dead daemon refuses or resets it at
    /// once, a live one answers — so it gets [`LOST_VERDICT_GRACE`] to do so.
    async fn exchange(
        &self,
        link: &Link,
        body: &Bytes,
        id: &Value,
        sink: Sink,
    ) -> Result<(Frame, Option<HeaderValue>), Lost> {
        if let Some(stream) = &link.stream {
            tokio::task::yield_now().await; // see `send_on_stream`
            let answer = match stream.send_for_bridge(id, body.clone()).await {
                Ok(answer) => answer,
                Err(Unsent::Lost) => return Err(Lost::undelivered(link.reason())),
                Err(Unsent::DuplicateId) => return Ok((duplicate_id_frame(id), None)),
            };
            return match answer.await {
                Ok(frame) => Ok((frame, None)),
                Err(_) => Err(Lost::in_flight(link.reason())),
            };
        }
        let mut send = std::pin::pin!(self.send(link, body));
        let resp = tokio::select! {
            biased;
            sent = &mut send => sent?,
            () = link.lost.cancelled() => match tokio::time::timeout(LOST_VERDICT_GRACE, &mut send).await {
                Ok(sent) => sent?,
                Err(_) => return Err(Lost::in_flight(link.reason())),
            },
        };
        let session_id = resp.headers().get(SESSION_ID).cloned();
        let answer = tokio::select! {
            biased;
            answer = self.receive(link, resp, Some(id), sink) => answer?,
            () = link.lost.cancelled() => return Err(Lost::in_flight(link.reason())),
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
    async fn post(&self, link: &Link, body: &Bytes) -> Result<Answer, Lost> {
        if let Some(stream) = &link.stream {
            return if stream.send(body.clone()).await {
                Ok(Answer::Accepted)
            } else {
                Err(Lost::undelivered(link.reason()))
            };
        }
        let resp = self.send(link, body).await?;
        self.receive(link, resp, None, Sink::Discard).await
    }

    /// Sends one message as a POST (a request's answer is then read by [`Bridge::receive`]) and
    /// waits for the head of the answer. A 404 for the session or a 401 means
    /// the session (or the daemon run) is gone, and the message was not acted on.
    async fn send(&self, link: &Link, body: &Bytes) -> Result<reqwest::Response, Lost> {
        // Let the runtime take in pending socket events first (tokio wakes a yielded task only
        // after it has polled its I/O driver): a keep-alive connection the daemon closed when it
        // died is then seen closed and not reused. A request written onto such a connection
        // would fail as "closed before message completed", like one the daemon read and died
        // on, and could not be told apart and resent.
        tokio::task::yield_now().await;
        let resp = link
            .request(Method::POST)
            .header(CONTENT_TYPE, JSON)
            .header(ACCEPT, ACCEPT_POST)
            .body(body.clone())
            .send()
            .await
            .map_err(|e| {
                let reason = format!("POST /mcp failed: {}", describe(&e));
                if never_delivered(&e) { Lost::undelivered(reason) } else { Lost::in_flight(reason) }
            })?;
        check_session(link, resp.status())?;
        Ok(resp)
    }

    /// Reads the answer to a POST whose head has arrived. Every loss here is one after the
    /// daemon had the message.
    async fn receive(
        &self,
        link: &Link,
        resp: reqwest::Response,
        request_id: Option<&Value>,
        sink: Sink,
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
    async fn on_event(&self, event: SseEvent, id: Option<&Value>, sink: Sink) -> Option<Frame> {
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
        let resp = req.send().await.map_err(|e| Lost::in_flight(format!("GET /mcp failed: {}", describe(&e))))?;
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
        if link.stream.is_some() || link.session_id.is_none() || link.listening.swap(true, Ordering::AcqRel) {
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
                Err(lost) => {
                    self.lose(link, &lost.reason);
                    return;
                }
            }
            let delay = parser.retry().unwrap_or(LISTEN_RETRY).saturating_mul(1 << idle.min(5)).min(LISTEN_RETRY_MAX);
            tokio::time::sleep(delay).await;
        }
    }

    /// Marks `link` lost: every request in flight on it is answered at once (one still waiting
    /// for the head of its answer after [`LOST_VERDICT_GRACE`]), and the next message, or a
    /// request that never reached the daemon, establishes a new session.
    fn lose(&self, link: &Link, reason: &str) {
        if link.lost_reason.set(reason.to_owned()).is_err() {
            return; // someone else found it first
        }
        link.lost.cancel();
        warn!(
            generation = link.generation,
            %reason,
            "Lost the MCP session with the Coffer daemon; requests in flight get an error, the next one re-establishes it."
        );
    }

    /// Ends a session the client left by initializing again.
    fn retire(self: &Arc<Self>, old: Arc<Link>) {
        let _ = old.lost_reason.set("the client started a new session".into());
        old.lost.cancel();
        if old.stream.is_some() {
            return; // closing the stream (its tasks see `lost`) ends the session
        }
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

    /// A new link to `endpoint`: a `/mcp` stream when the endpoint may offer one and the daemon
    /// accepts the upgrade, else Streamable HTTP. `Err` (never delivered) when the daemon cannot
    /// be reached.
    async fn open_link(&self, endpoint: Endpoint) -> Result<Arc<Link>, Lost> {
        let link = Link::new(self.next_generation(), endpoint, None, None);
        if !link.endpoint.stream {
            return Ok(link);
        }
        let liveness = Liveness { interval: self.config.liveness_interval, timeout: self.config.liveness_timeout };
        match StreamLink::open(&link.endpoint, self.out.clone(), link.lost.clone(), link.lost_reason.clone(), liveness)
            .await
        {
            Ok(stream) => {
                debug!(generation = link.generation, "Talking to the daemon on a /mcp stream.");
                let mut link = Arc::into_inner(link).expect("a new link has one owner");
                link.stream = Some(stream);
                Ok(Arc::new(link))
            }
            Err(OpenError::NotOffered(why)) => {
                debug!(reason = %why, "No /mcp stream; using Streamable HTTP.");
                Ok(link)
            }
            Err(OpenError::Unreachable(why)) => Err(Lost::undelivered(why)),
        }
    }

    fn next_generation(&self) -> u64 {
        self.generations.fetch_add(1, Ordering::Relaxed) + 1
    }
}

/// 404 for a session we sent, or 401, means the session (or the daemon we knew) is gone; the
/// daemon answers both before it looks at the message.
fn check_session(link: &Link, status: StatusCode) -> Result<(), Lost> {
    if status == StatusCode::NOT_FOUND && link.session_id.is_some() {
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

/// The `result` of an initialize response; `None` when it is an error.
fn initialize_result(frame: &Frame) -> Option<InitializeResult> {
    serde_json::from_slice::<InitializeReply>(frame.bytes()).ok()?.result
}

fn duplicate_id_frame(id: &Value) -> Frame {
    jsonrpc::error_frame(
        id,
        INVALID_REQUEST,
        &format!(
            "Invalid Request: id {id} is already used by a request in flight (MCP request ids must be unique in a session)."
        ),
        None,
    )
}

/// `params.requestId` of a `notifications/cancelled` line.
fn cancelled_request_id(body: &[u8]) -> Option<Value> {
    #[derive(serde::Deserialize)]
    struct Params {
        #[serde(rename = "requestId")]
        request_id: Value,
    }
    #[derive(serde::Deserialize)]
    struct Notification {
        params: Params,
    }
    serde_json::from_slice::<Notification>(body).ok().map(|n| n.params.request_id)
}

fn invalid_frame(id: &Value) -> Frame {
    jsonrpc::error_frame(
        id,
        INVALID_REQUEST,
        "Invalid Request: not a JSON-RPC request, notification or response.",
        None,
    )
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

/// The -32001 answer for a request whose session was lost: "cannot be reached" when it never
/// got to the daemon, "connection lost" when it may have.
fn failure_frame(id: &Value, lost: &Lost) -> Frame {
    if lost.undelivered { unreachable_frame(id, &lost.reason) } else { jsonrpc::lost_frame(id, &lost.reason) }
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
