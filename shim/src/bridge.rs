//! The bridge proper: forwards each stdin message to the daemon, copies every answer to stdout,
//! and keeps one MCP session with the daemon, re-establishing it when it is lost. How a message
//! travels is the [`Link`]'s business (`/mcp` stream or Streamable HTTP, `link.rs`); what to do
//! when a link is lost is written here once, for both.
//!
//! Losing the session: a message that provably never reached a live session ([`Lost::undelivered`]:
//! connection refused, the stream already lost before it was written, its HTTP/2 stream refused
//! by the daemon, HTTP 404 for the session, HTTP 401 for a token from before a daemon restart)
//! was not acted on, so a request that meets such a loss is sent once more on a re-established
//! session ([`Bridge::request`]). Everything that may have taken effect gets -32001 at once and
//! is never resent. Re-establishing (detect-or-spawn, replayed `initialize` and
//! `notifications/initialized`) happens under the session slot's write lock, once for every
//! request that met the same loss ([`Bridge::acquire`]).
//!
//! Who ends what: every request runs in a task of `requests`, every `GET /mcp` listener and
//! session `DELETE` in a task of `background`; both end when `stop` is cancelled by
//! [`Bridge::close`]. A listener also ends with the link it belongs to ([`Link::lost`]).
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use reqwest::header::HeaderValue;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::{OwnedRwLockWriteGuard, RwLock, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};

use crate::connector::Connector;
use crate::frame::Frame;
use crate::http::snippet;
use crate::jsonrpc::{self, DAEMON_UNAVAILABLE, INVALID_REQUEST, Kind, PARSE_ERROR, ParseError, Parsed};
use crate::link::{Answer, Link, Lost, Sink, duplicate_id_frame};
use crate::memory::{self, Memory};
use crate::stream::{Liveness, StreamLink, Unsent};
use crate::{Config, ShimError};

/// How long a notification or response may wait for the daemon's acceptance.
const NOTIFY_TIMEOUT: Duration = Duration::from_secs(10);

/// `_meta` key that marks a request of MCP 2026-07-28 (basic/lifecycle: every request carries
/// its protocol version).
const MODERN_VERSION_META: &str = "io.modelcontextprotocol/protocolVersion";
/// `_meta` key tagging a message of a `subscriptions/listen` stream with its request id (MCP
/// 2026-07-28, basic/patterns/subscriptions).
const SUBSCRIPTION_ID_META: &str = "io.modelcontextprotocol/subscriptionId";
/// `subscriptions/listen` requests remembered for tagging the shim's own `list_changed`.
const MAX_LISTENS: usize = 16;

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
    /// The daemon's discovery answers from earlier sessions (`memory.rs`), when the connector
    /// keeps any.
    memory: Option<Memory>,
    /// An `initialize` answered from memory whose session is still being established: whether
    /// the client's `notifications/initialized` arrived meanwhile (the initialize task sends it
    /// once the daemon answered, so the stdin reader never waits for a starting daemon).
    early_init: Mutex<Option<bool>>,
    /// Requests the shim asks the daemon itself to check an answer given from memory.
    rechecks: AtomicU64,
    /// The client's `subscriptions/listen` requests (MCP 2026-07-28): id and
    /// `params.notifications`, to tag a `list_changed` the shim sends itself.
    listens: Mutex<Vec<(Value, Value)>>,
    /// `subscriptions/listen` acknowledgments given from memory or to remember (`memory.rs`).
    acks: Arc<memory::Acks>,
    stop: CancellationToken,
    requests: TaskTracker,
    background: TaskTracker,
}

impl<C: Connector> Bridge<C> {
    pub(crate) fn new(connector: C, config: Config, out: mpsc::Sender<Frame>) -> Arc<Self> {
        let memory = connector.memory();
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
            memory: memory.clone(),
            early_init: Mutex::new(None),
            rechecks: AtomicU64::new(0),
            listens: Mutex::new(Vec::new()),
            acks: Arc::new(memory::Acks::new(memory.clone())),
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

    /// Answers a stdin line over the frame limit with -32600 for its `id` (found by the frame
    /// reader anywhere in the line; null if it has none).
    pub(crate) async fn reject_oversized(&self, id: Value) {
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
        let stream = self.slot.try_read().ok().and_then(|slot| slot.as_ref().and_then(|l| l.stream().cloned()));
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
        if let Some(link) = link {
            link.end_session(self.config.delete_timeout).await;
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

    async fn dispatch_one(self: &Arc<Self>, kind: Kind, body: Bytes) {
        match kind {
            Kind::Request { id, method } if method == "initialize" => {
                let slot = self.slot.clone().write_owned().await;
                let cold = slot.as_ref().is_none_or(|l| !l.usable()) && !self.connector.daemon_ready();
                let recalled = self.recall(&body);
                let early = match recalled {
                    Some((key, Some(result))) if cold => {
                        // Answered now; the client's next messages must not wait for the daemon.
                        *self.early_init.lock().unwrap_or_else(PoisonError::into_inner) = Some(false);
                        self.emit(result_frame(&id, &result)).await;
                        Some((key, Some(result)))
                    }
                    other => other.map(|(key, _)| (key, None)),
                };
                let this = self.clone();
                self.spawn_request(async move { this.initialize(id, body, slot, early).await });
            }
            Kind::Request { id, method } if self.memory.is_some() && memory::remembered(&method) => {
                self.remembered_request(id, method, body).await;
            }
            Kind::Request { id, method } => {
                if method == memory::LISTEN {
                    self.note_listen(&id, &body);
                    self.acknowledge_listen(&id, &body).await;
                }
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
        slot.as_ref().filter(|l| l.usable())?.stream().cloned()
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
        self.request_to(id, body, Sink::Client(&self.out)).await
    }

    /// [`Bridge::request`] with what the daemon sends before the answer going to `sink`.
    async fn request_to(self: &Arc<Self>, id: &Value, body: &Bytes, sink: Sink<'_>) -> Frame {
        let link = match self.acquire().await {
            Ok(link) => link,
            Err(err) => return unreachable_frame(id, &err.to_string()),
        };
        let lost = match link.exchange(body, id, sink).await {
            Ok((frame, _)) => return frame,
            Err(lost) => lost,
        };
        link.lose(&lost.reason);
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
        match link.exchange(body, id, sink).await {
            Ok((frame, _)) => frame,
            Err(lost) => {
                link.lose(&lost.reason);
                failure_frame(id, &lost)
            }
        }
    }

    /// Forwards a notification or a response to a server request; logs what the daemon refused
    /// (JSON-RPC gives the client no answer to these).
    async fn notify(self: &Arc<Self>, method: Option<&str>, body: &Bytes) {
        let initialized = method == Some("notifications/initialized");
        if initialized && let Some(pending) = self.early_init.lock().unwrap_or_else(PoisonError::into_inner).as_mut() {
            // The initialize answered from memory is still being established: its task sends
            // this once the daemon answered.
            *pending = true;
            return;
        }
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
            () = link.lost().cancelled() => Err(Lost::in_flight(link.reason())),
            () = tokio::time::sleep(NOTIFY_TIMEOUT) => Ok(Answer::Rejected(format!("no answer within {NOTIFY_TIMEOUT:?}"))),
            posted = link.post(body) => posted,
        };
        match result {
            Ok(Answer::Accepted) if initialized => self.listen(&link),
            Ok(Answer::Rejected(reason)) => {
                warn!(method, %reason, "The daemon did not accept a notification or response.");
            }
            Ok(_) => {}
            Err(lost) => {
                warn!(method, reason = %lost.reason, "Dropped a message for the daemon: the session was lost.");
                link.lose(&lost.reason);
            }
        }
    }

    /// The client's `initialize`: starts a new session (ending the one it replaces) while
    /// holding the session slot, so nothing else is forwarded before the session id is known.
    /// Like any request, it is sent once more (after detect-or-spawn again) when it provably
    /// never reached the daemon.
    ///
    /// `early` is the request's memory key and, when the client was already answered from
    /// memory, that answer: the daemon's own answer then goes nowhere but into the memory (and a
    /// `notifications/initialized` that arrived meanwhile is sent once it is in).
    async fn initialize(
        self: Arc<Self>,
        id: Value,
        body: Bytes,
        mut slot: OwnedRwLockWriteGuard<Option<Arc<Link>>>,
        early: Option<(String, Option<Value>)>,
    ) {
        let (key, answered) = match early {
            Some((key, answered)) => (Some(key), answered),
            None => (None, None),
        };
        let sink = if answered.is_some() { Sink::Discard } else { Sink::Client(&self.out) };
        let previous = slot.take();
        let mut endpoint = previous.as_ref().filter(|l| l.usable()).map(|l| l.endpoint.clone());
        if let Some(old) = previous.filter(|l| l.usable() && l.has_session()) {
            old.retire(&self.background, self.config.delete_timeout);
        }
        let mut resent = false;
        let (fresh, frame, session_id) = loop {
            let endpoint = match endpoint.take() {
                Some(endpoint) => endpoint,
                None => match self.connector.connect().await {
                    Ok(endpoint) => endpoint,
                    Err(err) => {
                        drop(slot);
                        self.early_failed(answered.is_some(), &err.to_string());
                        if answered.is_none() {
                            self.emit(unreachable_frame(&id, &err.to_string())).await;
                        }
                        return;
                    }
                },
            };
            let attempt = match self.open_link(endpoint).await {
                Ok(fresh) => fresh.exchange(&body, &id, sink).await.map(|(f, sid)| (fresh, f, sid)),
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
                    self.early_failed(answered.is_some(), &lost.reason);
                    if answered.is_none() {
                        self.emit(failure_frame(&id, &lost)).await;
                    }
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
            let link = fresh.with_session(session_id, version);
            if let (Some(key), Some(memory), Some(result)) = (&key, &self.memory, memory::result_of(frame.bytes())) {
                if answered.as_ref().is_some_and(|a| *a != result) {
                    // The client keeps what it was told (an initialize cannot be taken back);
                    // what differs is a newer daemon's: the next session gets it.
                    warn!(
                        "The daemon's initialize answer differs from the one given from memory; stored for next time."
                    );
                }
                memory.store(key, "initialize", &result);
            }
            let pending = self.early_init.lock().unwrap_or_else(PoisonError::into_inner).take();
            if pending == Some(true) {
                if let Some(record) = self.init.lock().unwrap_or_else(PoisonError::into_inner).as_mut() {
                    record.initialized = true;
                }
                let note = Bytes::from_static(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
                match link.post(&note).await {
                    Ok(Answer::Accepted) => self.listen(&link),
                    Ok(Answer::Rejected(reason)) | Err(Lost { reason, .. }) => {
                        warn!(%reason, "The daemon did not take notifications/initialized.");
                    }
                    Ok(_) => {}
                }
            }
            *slot = Some(link);
        } else {
            // The daemon refused this initialize; keep the connection for whatever comes next.
            self.early_failed(answered.is_some(), &snippet(frame.bytes()));
            *slot = Some(fresh);
        }
        drop(slot);
        if answered.is_none() {
            self.emit(frame).await;
        }
    }

    /// An `initialize` answered from memory could not be established with the daemon: the
    /// requests that follow find no session and are answered with the daemon's error then.
    fn early_failed(&self, early: bool, reason: &str) {
        if early {
            self.early_init.lock().unwrap_or_else(PoisonError::into_inner).take();
            warn!(%reason, "The initialize answered from memory could not be established with the daemon.");
        }
    }

    /// The memory key of a request line and the answer stored under it (`None` when the
    /// bridge keeps no memory or the request is not remembered).
    fn recall(&self, body: &[u8]) -> Option<(String, Option<Value>)> {
        let memory = self.memory.as_ref()?;
        let request: Value = serde_json::from_slice(body).ok()?;
        let key = memory.key(&request)?;
        let answer = memory.recall(&key);
        Some((key, answer))
    }

    /// Whether the daemon is not up yet: no daemon link (none, lost, or one being established)
    /// and no ready daemon to make one with ([`Connector::daemon_ready`]).
    fn cold(&self) -> bool {
        let linked = match self.slot.try_read() {
            Ok(slot) => slot.as_ref().is_some_and(|l| l.usable()),
            Err(_) => false,
        };
        !linked && !self.connector.daemon_ready()
    }

    /// A remembered request (`memory.rs`) other than `initialize`: answered from memory at once
    /// while the daemon is not up yet, then checked with the daemon; else relayed, its answer
    /// stored for the next cold start.
    async fn remembered_request(self: &Arc<Self>, id: Value, method: String, body: Bytes) {
        let Some((key, answer)) = self.recall(&body) else {
            let this = self.clone();
            self.spawn_request(async move {
                let frame = this.request(&id, &body).await;
                this.emit(frame).await;
            });
            return;
        };
        match answer {
            Some(answer) if self.cold() => {
                self.emit(result_frame(&id, &answer)).await;
                let this = self.clone();
                self.spawn_request(async move { this.recheck(method, body, key, answer).await });
            }
            _ => {
                let this = self.clone();
                self.spawn_request(async move {
                    let frame = this.request(&id, &body).await;
                    if let (Some(memory), Some(result)) = (&this.memory, memory::result_of(frame.bytes())) {
                        memory.store(&key, &method, &result);
                    }
                    this.emit(frame).await;
                });
            }
        }
    }

    /// Asks the daemon the request answered from memory (under an id of the shim's) and stores
    /// its answer; when a list differs from what the client was told, sends the client that
    /// list's `list_changed`, so it lists again.
    async fn recheck(self: Arc<Self>, method: String, body: Bytes, key: String, answered: Value) {
        let Ok(mut request) = serde_json::from_slice::<Value>(&body) else { return };
        let n = self.rechecks.fetch_add(1, Ordering::Relaxed) + 1;
        let id = json!(format!("coffer-shim-recheck-{n}"));
        request["id"] = id.clone();
        let modern = request.pointer("/params/_meta").and_then(|m| m.get(MODERN_VERSION_META)).is_some();
        let body = Bytes::from(serde_json::to_vec(&request).unwrap_or_default());
        let frame = self.request_to(&id, &body, Sink::Discard).await;
        let Some(result) = memory::result_of(frame.bytes()) else {
            debug!(method, answer = %snippet(frame.bytes()), "The daemon did not answer a request given from memory.");
            return;
        };
        if result == answered {
            return;
        }
        if let Some(memory) = &self.memory {
            memory.store(&key, &method, &result);
        }
        let Some(note) = memory::list_changed_method(&method) else { return };
        info!(method, "The daemon's list differs from the one given from memory; telling the client.");
        for frame in self.list_changed_frames(note, modern) {
            self.emit(frame).await;
        }
    }

    /// The `list_changed` notification(s) for `note`: one plain notification (2025 revisions),
    /// or, for a 2026-07-28 client, one per `subscriptions/listen` that opted in to it, tagged
    /// with its subscription id as the daemon tags its own.
    fn list_changed_frames(&self, note: &str, modern: bool) -> Vec<Frame> {
        if !modern {
            return vec![Frame::from_value(&json!({"jsonrpc": "2.0", "method": note}))];
        }
        let opt_in = match note {
            "notifications/tools/list_changed" => "toolsListChanged",
            "notifications/prompts/list_changed" => "promptsListChanged",
            _ => "resourcesListChanged",
        };
        let listens = self.listens.lock().unwrap_or_else(PoisonError::into_inner);
        listens
            .iter()
            .filter(|(_, wanted)| wanted.get(opt_in).and_then(Value::as_bool) == Some(true))
            .map(|(id, _)| {
                Frame::from_value(&json!({"jsonrpc": "2.0", "method": note,
                    "params": {"_meta": {SUBSCRIPTION_ID_META: id}}}))
            })
            .collect()
    }

    /// A `subscriptions/listen` while the daemon is not up yet: acknowledged at once from memory
    /// when its acknowledgment is remembered (the daemon's own is then dropped); otherwise its
    /// acknowledgment is remembered when the daemon sends it. The request itself is relayed.
    async fn acknowledge_listen(&self, id: &Value, body: &[u8]) {
        let Some((key, _)) = self.recall(body) else { return };
        if self.cold()
            && let Some(ack) = self.acks.give(id, &key)
        {
            self.emit(Frame::from_value(&ack)).await;
            return;
        }
        self.acks.watch(id, key);
    }

    /// Records a client's `subscriptions/listen` (at most a few are open at a time).
    fn note_listen(&self, id: &Value, body: &[u8]) {
        let wanted = serde_json::from_slice::<Value>(body)
            .ok()
            .and_then(|v| v.pointer("/params/notifications").cloned())
            .unwrap_or_default();
        let mut listens = self.listens.lock().unwrap_or_else(PoisonError::into_inner);
        listens.retain(|(known, _)| known != id);
        if listens.len() >= MAX_LISTENS {
            listens.remove(0);
        }
        listens.push((id.clone(), wanted));
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
        let (frame, session_id) =
            fresh.exchange(&body, &id, Sink::Discard).await.map_err(|lost| ShimError::Reinitialize(lost.reason))?;
        let Some(result) = initialize_result(&frame) else {
            return Err(ShimError::Reinitialize(snippet(frame.bytes())));
        };
        let version = result.protocol_version.as_deref().and_then(|v| HeaderValue::from_str(v).ok());
        let link = fresh.with_session(session_id, version);
        if initialized {
            let body = Bytes::from_static(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
            match link.post(&body).await {
                Ok(Answer::Rejected(reason)) | Err(Lost { reason, .. }) => {
                    return Err(ShimError::Reinitialize(reason));
                }
                Ok(_) => self.listen(&link),
            }
        }
        info!(generation = link.generation, protocol_version = ?result.protocol_version, "Re-established the MCP session with the Coffer daemon.");
        Ok(link)
    }

    /// Starts the link's listener for server-initiated messages, when its transport needs one.
    fn listen(&self, link: &Arc<Link>) {
        link.listen(&self.out, &self.background, &self.stop);
    }

    /// A new link to `endpoint` (see [`Link::open`]).
    async fn open_link(&self, endpoint: crate::connector::Endpoint) -> Result<Arc<Link>, Lost> {
        let liveness = Liveness { interval: self.config.liveness_interval, timeout: self.config.liveness_timeout };
        Link::open(self.next_generation(), endpoint, self.out.clone(), liveness, self.acks.clone()).await
    }

    fn next_generation(&self) -> u64 {
        self.generations.fetch_add(1, Ordering::Relaxed) + 1
    }
}

/// The `result` of an initialize response; `None` when it is an error.
fn initialize_result(frame: &Frame) -> Option<InitializeResult> {
    serde_json::from_slice::<InitializeReply>(frame.bytes()).ok()?.result
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

/// A JSON-RPC response with `result` for `id`.
fn result_frame(id: &Value, result: &Value) -> Frame {
    Frame::from_value(&json!({"jsonrpc": "2.0", "id": id, "result": result}))
}

fn invalid_frame(id: &Value) -> Frame {
    jsonrpc::error_frame(
        id,
        INVALID_REQUEST,
        "Invalid Request: not a JSON-RPC request, notification or response.",
        None,
    )
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
