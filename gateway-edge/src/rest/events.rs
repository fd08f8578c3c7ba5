//! `GET /v1/events`: one multiplexed SSE stream carrying the conversation list and any number
//! of conversations, each subscription tagged; `POST /v1/events/{stream}` adds and removes
//! subscriptions without reconnecting; `GET /v1/events/streams` counts the chat event streams
//! open (what a test asserts the browser holds).
//!
//! Why: a browser speaks HTTP/1.1 to the loopback edge and opens at most six connections per
//! host, shared by every tab. One stream per tab (let alone the two the console held, list and
//! thread) leaves the tabs' `fetch`es queued behind them, and a sent message silently never
//! leaves. The console keeps one of these streams per browser (`ui/js/chat/events.js`: one tab,
//! elected with the Web Locks API, holds it and fans events out to the others by
//! `BroadcastChannel`), so sends always find a free connection.
//!
//! An `invocations` subscription (`?invocations=KEY`, or `{"sub", "invocations": true}`) carries
//! the invocation log live, as `GET /v1/invocations/events` does (`invocation`, `lagged`): the
//! console's Activity page follows it on the tab's one stream.
//!
//! Framing: the first frame is `event: hello`, `data: {"stream": ID, "subscriptions": [...]}`
//! (ID names the stream in `POST /v1/events/{ID}`). Every other frame is the frame of the
//! single-purpose stream it comes from (`GET /v1/conversations/{id}/events`: `event: <kind>`,
//! the event's JSON; `GET /v1/conversations/events`: `conversation`, `deleted`, `reset`) with
//! `"sub": KEY` added to its JSON object; a conversation frame's `id:` is `KEY:SEQ`. A
//! subscription that ends (a final `reset`: `lagged`, `deleted`) or cannot start (an unknown
//! conversation) gets `event: ended`, `data: {"sub", "reason", "message"}`; the others go on.
//! A list `reset` (`lagged`) is sent after the list is watched afresh: reload the list on it.
//!
//! Resumption: a conversation subscription resumes after its own last `seq`. When the stream
//! breaks (the chat service restarts, the network, the edge) the client reopens it with every
//! subscription and each one's last `seq` (`?conversation=KEY:ID:SEQ`): nothing is lost, and
//! nothing is sent twice (each subscription is one `Chat.Subscribe` from that `seq`; a frame
//! of a replaced subscription still in flight is dropped here by its generation). The list has
//! no sequence: reload it when its subscription (re)starts.
//!
//! Security: the routes sit behind [`crate::middleware::auth`] like every `/v1` route (Host
//! and Origin checks, the session's cookie and key, or a single-use stream ticket on the
//! `GET`); a stream's id is 64 random hex digits and only the session (or token) that opened it
//! may change its subscriptions (another caller gets 404, as for an unknown id).
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::response::sse::Event as SseEvent;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use coffer_api::events::{OpenStreams, Refused, Subscription, SubscriptionChange, Subscriptions};
use coffer_proto::chat::{ConversationChange, Event, SubscribeRequest, WatchConversationsRequest};
use futures_util::{Stream, StreamExt};
use secrecy::ExposeSecret;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::chat::{self, call};
use crate::error::{ApiError, Code, JsonBody};
use crate::middleware::Via;
use crate::state::AppState;

/// Most subscriptions open on one multiplexed stream.
pub const MAX_SUBSCRIPTIONS: usize = 64;
/// Most multiplexed streams open at once (a browser needs one; a few tools may add theirs).
pub const MAX_STREAMS: usize = 64;
/// Frames queued for a stream's client before the subscriptions wait for it.
const QUEUE: usize = 256;

/// The routes.
pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/v1/events", get(open))
        .route("/v1/events/streams", get(streams))
        .route("/v1/events/{stream}", post(change))
}

/// The multiplexed streams and the counts of every chat event stream the edge serves.
#[derive(Default)]
pub struct Streams {
    open: Mutex<HashMap<String, Arc<Mux>>>,
    /// `GET /v1/conversations/{id}/events` streams open.
    pub conversation: Arc<Gauge>,
    /// `GET /v1/conversations/events` streams open.
    pub list: Arc<Gauge>,
}

impl Streams {
    /// What is open now.
    pub fn counts(&self) -> OpenStreams {
        let open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        OpenStreams {
            multiplexed: open.len() as u64,
            subscriptions: open.values().map(|m| m.subs.lock().unwrap_or_else(|e| e.into_inner()).len() as u64).sum(),
            conversation: self.conversation.0.load(Ordering::Relaxed),
            list: self.list.0.load(Ordering::Relaxed),
        }
    }
}

/// A count of open streams; [`Gauge::hold`] counts one until its guard drops.
#[derive(Default)]
pub struct Gauge(AtomicU64);

impl Gauge {
    /// Counts a stream until the guard is dropped.
    pub fn hold(self: &Arc<Self>) -> GaugeGuard {
        self.0.fetch_add(1, Ordering::Relaxed);
        GaugeGuard(self.clone())
    }
}

/// Counted while alive (see [`Gauge::hold`]).
pub struct GaugeGuard(Arc<Gauge>);

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        self.0.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A streaming response whose body holds `guard` (the stream is counted while its body lives).
pub fn counted(resp: Response, guard: GaugeGuard) -> Response {
    resp.map(|body| {
        let s = body.into_data_stream().map(move |chunk| {
            let _held = &guard;
            chunk
        });
        axum::body::Body::from_stream(s)
    })
}

/// One multiplexed stream.
struct Mux {
    /// Who opened it: only they change it.
    owner: Via,
    tx: mpsc::Sender<Out>,
    /// `sub` → (generation, what ends its forwarding task).
    subs: Mutex<HashMap<String, (u64, CancellationToken)>>,
    generation: AtomicU64,
    /// Cancelled when the client goes away: every subscription's task ends.
    ended: CancellationToken,
}

/// What a subscription's task hands to the stream's body.
enum Out {
    /// A frame of subscription `sub` in generation `generation` (dropped if since replaced).
    Frame { sub: String, generation: u64, frame: SseEvent, last: bool },
    /// The subscription's source broke: the whole stream ends (the client reopens it).
    Broken,
}

/// A validated subscription.
#[derive(Debug)]
enum Spec {
    List,
    Conversation { id: String, after: u64 },
    Invocations,
}

fn check_key(k: &str) -> Result<(), String> {
    if k.is_empty() || k.len() > 64 || !k.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
    {
        return Err(format!(
            "a subscription key is 1-64 of A-Z a-z 0-9 _ . - (got {:?})",
            k.chars().take(70).collect::<String>()
        ));
    }
    Ok(())
}

fn spec_of(s: &Subscription) -> Result<Spec, String> {
    check_key(&s.sub)?;
    match (s.list, s.conversation.as_deref(), s.invocations) {
        (Some(true), None, None | Some(false)) if s.after.is_none() => Ok(Spec::List),
        (None | Some(false), Some(id), None | Some(false)) if crate::rest::logs::is_conversation_id(id) => {
            Ok(Spec::Conversation { id: id.to_owned(), after: s.after.unwrap_or(0) })
        }
        (None | Some(false), Some(id), None | Some(false)) => Err(format!(
            "subscription {:?}: {:?} is not a conversation id (a 26-character ULID)",
            s.sub,
            id.chars().take(40).collect::<String>()
        )),
        (None | Some(false), None, Some(true)) if s.after.is_none() => Ok(Spec::Invocations),
        _ => Err(format!(
            "subscription {:?}: give exactly one of \"list\": true, \"conversation\": ID or \"invocations\": true (with \"after\" only for a conversation)",
            s.sub
        )),
    }
}

/// `?list=KEY`, `?conversation=KEY:ID[:AFTER]` and `?invocations=KEY` pairs as subscriptions.
fn parse_query(pairs: Vec<(String, String)>) -> Result<Vec<Subscription>, ApiError> {
    let bad = |p: &str, m: String| ApiError::invalid(m).with_details(json!({"parameter": p}));
    let mut out = Vec::new();
    for (k, v) in pairs {
        match k.as_str() {
            "list" => out.push(Subscription { sub: v, list: Some(true), ..Default::default() }),
            "invocations" => out.push(Subscription { sub: v, invocations: Some(true), ..Default::default() }),
            "conversation" => {
                let mut parts = v.splitn(3, ':');
                let sub = parts.next().unwrap_or_default().to_owned();
                let id = parts.next().unwrap_or_default().to_owned();
                let after = match parts.next() {
                    None => None,
                    Some(a) => Some(a.parse::<u64>().map_err(|_| {
                        bad("conversation", format!("conversation={v:?}: AFTER must be an event sequence number"))
                    })?),
                };
                if id.is_empty() {
                    return Err(bad("conversation", format!("conversation={v:?}: expected KEY:ID or KEY:ID:AFTER")));
                }
                out.push(Subscription { sub, conversation: Some(id), after, ..Default::default() });
            }
            other => {
                let shown: String = other.chars().take(40).collect();
                return Err(bad(
                    &shown,
                    format!("unknown parameter {shown:?}; expected list, conversation or invocations"),
                ));
            }
        }
    }
    Ok(out)
}

/// `GET /v1/events?list=KEY&conversation=KEY:ID[:AFTER]&invocations=KEY…` → `text/event-stream` (see the
/// module docs). A subscription whose conversation is unknown gets an `ended` frame
/// (`not_found`); a chat service that does not answer is 503 before the stream starts.
///
/// # Errors
/// 400 naming a malformed parameter, key or conversation id, a key given twice (its parameter
/// and the key), or more than [`MAX_SUBSCRIPTIONS`] (details name the limit); 429 past
/// [`MAX_STREAMS`]; 503 while coffer-chat is down.
async fn open(
    State(st): State<Arc<AppState>>,
    via: Option<Extension<Via>>,
    q: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(pairs) = q.map_err(|e| ApiError::invalid(format!("malformed query string: {}", e.body_text())))?;
    let subs = parse_query(pairs)?;
    let specs = specs_of(&subs, Origin::Query)?;
    if subs.len() > MAX_SUBSCRIPTIONS {
        return Err(too_many_subscriptions(subs.len(), 0));
    }
    let owner = via.map(|Extension(v)| v).unwrap_or(Via::Token);
    let (tx, rx) = mpsc::channel(QUEUE);
    let mux = Arc::new(Mux {
        owner,
        tx,
        subs: Mutex::new(HashMap::new()),
        generation: AtomicU64::new(0),
        ended: CancellationToken::new(),
    });
    let id = coffer_runtime::token::random_token().expose_secret().to_owned();
    {
        let mut open = st.streams.open.lock().unwrap_or_else(|e| e.into_inner());
        if open.len() >= MAX_STREAMS {
            return Err(ApiError::new(
                Code::TooManyRequests,
                format!("at most {MAX_STREAMS} multiplexed event streams are open at once; close one"),
            ));
        }
        open.insert(id.clone(), mux.clone());
    }
    // From here the guard removes the stream again, whatever happens.
    let guard = Registered { st: st.clone(), id: id.clone(), mux: mux.clone() };
    let refused = add(&st, &mux, specs).await?;
    let hello = SseEvent::default().event("hello").data(json!({"stream": id, "subscriptions": keys(&mux)}).to_string());
    let mut first = vec![hello];
    first.extend(refused.iter().map(|r| ended_frame(&r.sub, "not_found", &r.message)));
    tracing::debug!(subscriptions = mux.subs.lock().map(|s| s.len()).unwrap_or(0), "Multiplexed event stream opened.");
    let body = body(first, rx, guard, st.shutdown.clone());
    let sse = axum::response::sse::Sse::new(body)
        .keep_alive(axum::response::sse::KeepAlive::new().interval(crate::rest::chat::KEEPALIVE).text("keep-alive"));
    Ok(([("x-accel-buffering", "no")], sse).into_response())
}

/// Removes its stream from [`Streams`] and ends its subscriptions when the body is dropped.
struct Registered {
    st: Arc<AppState>,
    id: String,
    mux: Arc<Mux>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.mux.ended.cancel();
        self.st.streams.open.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.id);
    }
}

/// The stream's body: `first`, then the subscriptions' frames (a replaced subscription's
/// dropped), until a source breaks, the client goes away or the edge shuts down.
fn body(
    first: Vec<SseEvent>,
    rx: mpsc::Receiver<Out>,
    guard: Registered,
    shutdown: CancellationToken,
) -> impl Stream<Item = Result<SseEvent, std::convert::Infallible>> + Send + 'static {
    struct St {
        first: std::vec::IntoIter<SseEvent>,
        rx: mpsc::Receiver<Out>,
        guard: Registered,
        shutdown: CancellationToken,
    }
    futures_util::stream::unfold(St { first: first.into_iter(), rx, guard, shutdown }, |mut s| async move {
        if let Some(f) = s.first.next() {
            return Some((Ok(f), s));
        }
        loop {
            let out = tokio::select! {
                biased;
                () = s.shutdown.cancelled() => return None,
                out = s.rx.recv() => out?,
            };
            match out {
                Out::Broken => return None,
                Out::Frame { sub, generation, frame, last } => {
                    let mut subs = s.guard.mux.subs.lock().unwrap_or_else(|e| e.into_inner());
                    let current = subs.get(&sub).map(|(g, _)| *g);
                    if current != Some(generation) {
                        continue; // replaced or removed since: not the client's any more
                    }
                    if last {
                        subs.remove(&sub);
                    }
                    drop(subs);
                    return Some((Ok(frame), s));
                }
            }
        }
    })
}

fn keys(mux: &Mux) -> Vec<String> {
    let mut k: Vec<String> = mux.subs.lock().unwrap_or_else(|e| e.into_inner()).keys().cloned().collect();
    k.sort();
    k
}

fn ended_frame(sub: &str, reason: &str, message: &str) -> SseEvent {
    SseEvent::default().event("ended").data(json!({"sub": sub, "reason": reason, "message": message}).to_string())
}

/// `value` (a JSON object) with `"sub": sub` added, as one line.
fn tagged(mut value: Value, sub: &str) -> String {
    if let Value::Object(m) = &mut value {
        m.insert("sub".into(), Value::String(sub.to_owned()));
    }
    value.to_string()
}

/// A conversation event as a frame of subscription `sub`; `None` for a kind this edge does not
/// know.
fn event_frame(e: &Event, sub: &str) -> Option<SseEvent> {
    let ev = chat::event(e)?;
    let data = tagged(serde_json::to_value(&ev).ok()?, sub);
    Some(SseEvent::default().id(format!("{sub}:{}", ev.seq)).event(ev.kind.word()).data(data))
}

/// A list change as a frame of subscription `sub`, and whether it is a `reset`.
fn change_frame(c: &ConversationChange, sub: &str) -> Option<(SseEvent, bool)> {
    let (kind, value, reset) = chat::change_parts(c)?;
    Some((SseEvent::default().event(kind).data(tagged(value, sub)), reset))
}

/// Where a request's subscriptions came from, for its errors' `details`.
#[derive(Clone, Copy)]
enum Origin {
    /// `GET /v1/events?list=KEY&conversation=KEY:ID…`: named by its query parameter.
    Query,
    /// `POST /v1/events/{stream}` `{"add": [...]}`: named by `add` and its index.
    Body,
}

impl Origin {
    /// `details` of an error about subscription `i`, `s`.
    fn details(self, i: usize, s: &Subscription) -> Value {
        match self {
            Origin::Query => {
                let parameter = if s.list == Some(true) {
                    "list"
                } else if s.invocations == Some(true) {
                    "invocations"
                } else {
                    "conversation"
                };
                json!({"parameter": parameter, "sub": s.sub})
            }
            Origin::Body => json!({"field": "add", "index": i, "sub": s.sub}),
        }
    }
}

/// The subscriptions of one request as (key, what), each checked ([`spec_of`]) and no key
/// given twice (which one would win is not the client's to guess).
///
/// # Errors
/// 400 naming the parameter (or `add` and its index) and the key.
/// 400 for `asked` subscriptions more on a stream holding `open`, past [`MAX_SUBSCRIPTIONS`]:
/// the request itself is too big (retrying it cannot help), so not a 429. `details` name the
/// limit: `{"limit": 64, "asked": N, "open": M}`.
fn too_many_subscriptions(asked: usize, open: usize) -> ApiError {
    let also = if open > 0 { format!(" ({open} open, {asked} more asked)") } else { format!(" ({asked} asked)") };
    ApiError::invalid(format!("at most {MAX_SUBSCRIPTIONS} subscriptions on one event stream{also}"))
        .with_details(json!({"limit": MAX_SUBSCRIPTIONS, "asked": asked, "open": open}))
}

fn specs_of(subs: &[Subscription], origin: Origin) -> Result<Vec<(String, Spec)>, ApiError> {
    let mut specs: Vec<(String, Spec)> = Vec::with_capacity(subs.len());
    for (i, s) in subs.iter().enumerate() {
        let spec = spec_of(s).map_err(|m| ApiError::invalid(m).with_details(origin.details(i, s)))?;
        if specs.iter().any(|(k, _)| *k == s.sub) {
            let m = format!("subscription key {:?} is given twice; each subscription needs its own key", s.sub);
            return Err(ApiError::invalid(m).with_details(origin.details(i, s)));
        }
        specs.push((s.sub.clone(), spec));
    }
    Ok(specs)
}

/// Starts `specs` ([`specs_of`]) on `mux` (replacing any of the same key). Unknown
/// conversations are refused one by one; any other failure fails the whole call (nothing of it
/// was started).
async fn add(st: &Arc<AppState>, mux: &Arc<Mux>, specs: Vec<(String, Spec)>) -> Result<Vec<Refused>, ApiError> {
    let have = mux.subs.lock().unwrap_or_else(|e| e.into_inner()).len();
    if have + specs.len() > MAX_SUBSCRIPTIONS {
        return Err(too_many_subscriptions(specs.len(), have));
    }
    // Every source first (so a failure starts nothing), then the tasks.
    enum Source {
        List(tonic::Streaming<ConversationChange>),
        Conversation(tonic::Streaming<Event>),
        Invocations(tokio::sync::broadcast::Receiver<Arc<coffer_proto::store::Invocation>>),
    }
    let mut started = Vec::new();
    let mut refused = Vec::new();
    for (sub, spec) in specs {
        let source = match spec {
            Spec::Invocations => Source::Invocations(st.gateway.shared.watch_invocations()),
            Spec::List => Source::List(
                call(st.chat.clone().watch_conversations(WatchConversationsRequest {}))
                    .await
                    .map_err(ApiError::from_chat)?,
            ),
            Spec::Conversation { id, after } => {
                match call(st.chat.clone().subscribe(SubscribeRequest { conversation_id: id, after_seq: after })).await
                {
                    Ok(s) => Source::Conversation(s),
                    Err(s) if s.code() == tonic::Code::NotFound => {
                        refused.push(Refused { sub, code: "NOT_FOUND".into(), message: s.message().to_owned() });
                        continue;
                    }
                    Err(s) => return Err(ApiError::from_chat(s)),
                }
            }
        };
        started.push((sub, source));
    }
    for (sub, source) in started {
        let generation = mux.generation.fetch_add(1, Ordering::Relaxed) + 1;
        let stop = mux.ended.child_token();
        if let Some((_, old)) =
            mux.subs.lock().unwrap_or_else(|e| e.into_inner()).insert(sub.clone(), (generation, stop.clone()))
        {
            old.cancel();
        }
        let tx = mux.tx.clone();
        match source {
            Source::Conversation(s) => {
                tokio::spawn(forward_conversation(s, sub, generation, tx, stop));
            }
            Source::Invocations(rx) => {
                tokio::spawn(forward_invocations(rx, sub, generation, tx, stop));
            }
            Source::List(s) => {
                tokio::spawn(forward_list(
                    s,
                    st.clone(),
                    coffer_runtime::grpc::current_auth(),
                    sub,
                    generation,
                    tx,
                    stop,
                ));
            }
        }
    }
    Ok(refused)
}

/// Forwards a conversation's events to its stream until `stop`, a final `reset` (then an
/// `ended` frame), or a broken source (the whole stream ends: the client resumes it).
async fn forward_conversation(
    mut events: tonic::Streaming<Event>,
    sub: String,
    generation: u64,
    tx: mpsc::Sender<Out>,
    stop: CancellationToken,
) {
    loop {
        let next = tokio::select! {
            biased;
            () = stop.cancelled() => return,
            next = events.next() => next,
        };
        let out = match next {
            Some(Ok(e)) => {
                let Some(frame) = event_frame(&e, &sub) else { continue };
                let last = chat::ends_stream(&e);
                if tx.send(Out::Frame { sub: sub.clone(), generation, frame, last: false }).await.is_err() {
                    return;
                }
                if !last {
                    continue;
                }
                let reason = match &e.kind {
                    Some(coffer_proto::chat::event::Kind::Reset(r)) => r.reason.clone(),
                    _ => "ended".to_owned(),
                };
                Out::Frame {
                    sub: sub.clone(),
                    generation,
                    frame: ended_frame(&sub, &reason, "the subscription ended; subscribe again to follow it"),
                    last: true,
                }
            }
            Some(Err(status)) => {
                tracing::info!(code = ?status.code(), error = %status.message(), "A multiplexed conversation subscription broke; the stream ends and the client resumes it.");
                Out::Broken
            }
            None => Out::Broken,
        };
        let _ = tx.send(out).await;
        return;
    }
}

/// Forwards the invocation log's rows (`invocation`, as `GET /v1/invocations/events`; `lagged`
/// when this stream fell behind the log's live buffer) until `stop` or the gateway's end.
async fn forward_invocations(
    mut rx: tokio::sync::broadcast::Receiver<Arc<coffer_proto::store::Invocation>>,
    sub: String,
    generation: u64,
    tx: mpsc::Sender<Out>,
    stop: CancellationToken,
) {
    use tokio::sync::broadcast::error::RecvError;
    loop {
        let got = tokio::select! {
            biased;
            () = stop.cancelled() => return,
            got = rx.recv() => got,
        };
        let (kind, value) = match got {
            Ok(i) => ("invocation", serde_json::to_value(crate::rest::logs::invocation(&i)).unwrap_or_default()),
            Err(RecvError::Lagged(n)) => {
                ("lagged", serde_json::to_value(coffer_api::logs::Lagged { missed: n }).unwrap_or_default())
            }
            Err(RecvError::Closed) => return,
        };
        let frame = SseEvent::default().event(kind).data(tagged(value, &sub));
        if tx.send(Out::Frame { sub: sub.clone(), generation, frame, last: false }).await.is_err() {
            return;
        }
    }
}

/// Forwards the conversation list's changes until `stop` or a broken source; after a `reset`
/// the list is watched afresh before the `reset` frame goes out (a reload after it misses
/// nothing).
async fn forward_list(
    mut changes: tonic::Streaming<ConversationChange>,
    st: Arc<AppState>,
    auth: Option<String>,
    sub: String,
    generation: u64,
    tx: mpsc::Sender<Out>,
    stop: CancellationToken,
) {
    loop {
        let next = tokio::select! {
            biased;
            () = stop.cancelled() => return,
            next = changes.next() => next,
        };
        match next {
            Some(Ok(c)) => {
                let Some((frame, reset)) = change_frame(&c, &sub) else { continue };
                if reset {
                    let mut client = st.chat.clone();
                    let watch = call(client.watch_conversations(WatchConversationsRequest {}));
                    let again = match auth.clone() {
                        Some(a) => coffer_runtime::grpc::with_auth(a, watch).await,
                        None => watch.await,
                    };
                    match again {
                        Ok(s) => changes = s,
                        Err(_) => {
                            let _ = tx.send(Out::Broken).await;
                            return;
                        }
                    }
                }
                if tx.send(Out::Frame { sub: sub.clone(), generation, frame, last: false }).await.is_err() {
                    return;
                }
            }
            Some(Err(_)) | None => {
                let _ = tx.send(Out::Broken).await;
                return;
            }
        }
    }
}

/// `POST /v1/events/{stream}` `{add, remove}` → 200 [`Subscriptions`]. Removals first; an added
/// key that exists is replaced (its frames still in flight are dropped).
///
/// # Errors
/// 404 for an unknown stream or one another session opened, 400 naming a malformed
/// subscription or a key given twice in `add` (nothing changed), 429 past [`MAX_SUBSCRIPTIONS`], 503 while coffer-chat is down.
async fn change(
    State(st): State<Arc<AppState>>,
    Path(stream): Path<String>,
    via: Option<Extension<Via>>,
    JsonBody(body): JsonBody<SubscriptionChange>,
) -> Result<Json<Subscriptions>, ApiError> {
    let caller = via.map(|Extension(v)| v).unwrap_or(Via::Token);
    let mux = st.streams.open.lock().unwrap_or_else(|e| e.into_inner()).get(&stream).cloned();
    let mux = mux.filter(|m| m.owner == caller).ok_or_else(|| {
        ApiError::new(Code::NotFound, "no such event stream (it has ended: open GET /v1/events again)")
            .with_details(json!({"stream": stream.chars().take(80).collect::<String>()}))
    })?;
    // Checked before the removals: a refused request changes nothing.
    let specs = specs_of(&body.add, Origin::Body)?;
    {
        let mut subs = mux.subs.lock().unwrap_or_else(|e| e.into_inner());
        for k in &body.remove {
            if let Some((_, stop)) = subs.remove(k) {
                stop.cancel();
            }
        }
    }
    let refused = add(&st, &mux, specs).await?;
    Ok(Json(Subscriptions { subscriptions: keys(&mux), refused }))
}

/// `GET /v1/events/streams` → [`OpenStreams`].
async fn streams(State(st): State<Arc<AppState>>) -> Json<OpenStreams> {
    Json(st.streams.counts())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_pairs_become_subscriptions_and_bad_ones_are_named() {
        let q = |v: &[(&str, &str)]| parse_query(v.iter().map(|(a, b)| ((*a).to_owned(), (*b).to_owned())).collect());
        let s = q(&[("list", "t1.l"), ("conversation", "t1.c:abc:42"), ("conversation", "t2.c:abc")]).unwrap();
        assert_eq!(s.len(), 3);
        assert_eq!(s[1].conversation.as_deref(), Some("abc"));
        assert_eq!(s[1].after, Some(42));
        assert_eq!(s[2].after, None);
        let e = q(&[("conversation", "k:abc:x")]).unwrap_err();
        assert_eq!(e.details["parameter"], "conversation");
        assert!(q(&[("conversation", "k")]).is_err());
        let e = q(&[("after", "3")]).unwrap_err();
        assert!(e.message.contains("unknown parameter"), "{}", e.message);
        for bad in ["", "a b", "x/y", &"k".repeat(65)] {
            assert!(
                spec_of(&Subscription { sub: bad.into(), list: Some(true), ..Default::default() }).is_err(),
                "{bad:?}"
            );
        }
        let both =
            Subscription { sub: "k".into(), list: Some(true), conversation: Some("c".into()), ..Default::default() };
        assert!(spec_of(&both).is_err());
        let list_after = Subscription { sub: "k".into(), list: Some(true), after: Some(3), ..Default::default() };
        assert!(spec_of(&list_after).is_err());
        let s = q(&[("invocations", "t1.a")]).unwrap();
        assert!(matches!(spec_of(&s[0]), Ok(Spec::Invocations)));
        let two = Subscription { sub: "k".into(), list: Some(true), invocations: Some(true), ..Default::default() };
        assert!(spec_of(&two).is_err());
    }

    #[test]
    fn a_key_given_twice_is_refused_naming_the_key_and_its_parameter() {
        let q = |v: &[(&str, &str)]| parse_query(v.iter().map(|(a, b)| ((*a).to_owned(), (*b).to_owned())).collect());
        let subs = q(&[("list", "k1"), ("conversation", "k1:01JDQ8ZKXW5T3M2N4P6R7S8T9V")]).unwrap();
        let e = specs_of(&subs, Origin::Query).unwrap_err();
        assert!(e.message.contains("\"k1\" is given twice"), "{}", e.message);
        assert_eq!(e.details, json!({"parameter": "conversation", "sub": "k1"}));
        let subs = q(&[("conversation", "k2:01JDQ8ZKXW5T3M2N4P6R7S8T9V"), ("list", "k2")]).unwrap();
        assert_eq!(specs_of(&subs, Origin::Query).unwrap_err().details["parameter"], "list");
        let subs = q(&[("list", "k3"), ("invocations", "k3")]).unwrap();
        assert_eq!(specs_of(&subs, Origin::Query).unwrap_err().details["parameter"], "invocations");
        // A bad key in the query names its parameter, not `add`.
        let subs = q(&[("list", "a b")]).unwrap();
        assert_eq!(specs_of(&subs, Origin::Query).unwrap_err().details, json!({"parameter": "list", "sub": "a b"}));
        // In a body: `add` and the index.
        let e = specs_of(&subs, Origin::Body).unwrap_err();
        assert_eq!(e.details, json!({"field": "add", "index": 0, "sub": "a b"}));
        let twice = [
            Subscription { sub: "x".into(), list: Some(true), ..Default::default() },
            Subscription {
                sub: "x".into(),
                conversation: Some("01JDQ8ZKXW5T3M2N4P6R7S8T9V".into()),
                ..Default::default()
            },
        ];
        // A conversation id that is not a ULID is refused with the subscription's details.
        let bad = Subscription { sub: "y".into(), conversation: Some("BAD".into()), ..Default::default() };
        let e = specs_of(std::slice::from_ref(&bad), Origin::Query).unwrap_err();
        assert!(e.message.contains("\"BAD\" is not a conversation id"), "{}", e.message);
        assert_eq!(e.details, json!({"parameter": "conversation", "sub": "y"}));
        // Past the limit: a 400 naming it.
        let e = too_many_subscriptions(65, 0);
        assert_eq!((e.code, e.details), (Code::InvalidArgument, json!({"limit": 64, "asked": 65, "open": 0})));
        assert_eq!(
            specs_of(&twice, Origin::Body).unwrap_err().details,
            json!({"field": "add", "index": 1, "sub": "x"})
        );
        assert_eq!(specs_of(&twice[..1], Origin::Body).unwrap().len(), 1);
    }

    #[test]
    fn frames_carry_their_subscription() {
        let e = Event {
            seq: 7,
            conversation_id: "c1".into(),
            kind: Some(coffer_proto::chat::event::Kind::TextDelta(coffer_proto::chat::TextDelta { text: "hi".into() })),
            ..Default::default()
        };
        let f = event_frame(&e, "t1.3").unwrap();
        let text = format!("{f:?}");
        assert!(text.contains("t1.3:7"), "{text}");
        let v: Value = serde_json::from_str(&tagged(json!({"seq": 7}), "t1.3")).unwrap();
        assert_eq!(v, json!({"seq": 7, "sub": "t1.3"}));
    }
}
