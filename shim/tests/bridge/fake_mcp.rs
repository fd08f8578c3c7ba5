//! A stand-in for the daemon's `/mcp` endpoint speaking MCP Streamable HTTP (2025-11-25) on
//! real loopback HTTP: JSON and SSE responses, 202 for notifications and responses,
//! `Mcp-Session-Id`, 404 for a killed session, a `GET` SSE stream, `DELETE`, and the
//! `X-Coffer-Token` check.
//!
//! It runs on its own thread and tokio runtime so that [`FakeMcp::kill`] can end it the way a
//! dying process would: every socket closes at once, mid-stream included.
//!
//! Methods it serves (all other requests get -32601):
//! - `echo`: a JSON response (pretty-printed over several lines) whose result echoes `params`;
//! - `wait`: answers only once the test calls [`FakeMcp::release`] with `params.gate`;
//! - `stream`: an SSE response: priming event, a notification, a server→client request, then
//!   the response split over several `data:` lines;
//! - `hang`: an SSE response with a priming event that never answers;
//! - `drop`: an SSE response with a priming event that ends unanswered; a `GET` with its event
//!   id as `Last-Event-ID` delivers the response;
//! - `error`: HTTP 400 with a JSON-RPC error body whose id is null;
//! - `stream_error`: an SSE response ending with a JSON-RPC error whose id is null.
use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, State as AxState};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::Response;
use axum::routing::any;
use coffer_shim::Endpoint;
use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot, watch};

pub const TOKEN: &str = "test-token";
pub const PROTOCOL: &str = "2025-11-25";

/// One HTTP request the fake received.
#[derive(Debug, Clone)]
pub struct Seen {
    pub http: Method,
    /// The JSON-RPC method of a POST body.
    pub method: Option<String>,
    pub id: Option<Value>,
    pub body: Value,
    pub session: Option<String>,
    pub protocol_version: Option<String>,
    pub last_event_id: Option<String>,
    pub accept: Option<String>,
    pub content_type: Option<String>,
    /// It carried the token this fake accepts (else it was answered 401).
    pub authorized: bool,
}

struct Session {
    alive: bool,
    push: Option<mpsc::UnboundedSender<Bytes>>,
}

/// What the fake has seen, and its knobs.
pub struct State {
    pub requests: Vec<Seen>,
    /// The JSON-RPC methods of the requests a live session took on (past the token and session
    /// checks), in order.
    pub accepted: Vec<String>,
    sessions: HashMap<String, Session>,
    next_session: u64,
    next_event: u64,
    released: HashSet<String>,
    /// `GET /mcp` opens a stream (else: 405).
    pub get_allowed: bool,
    resumable: HashMap<String, Value>,
    /// What `tools/list` answers (`tools`).
    tools: Value,
}

impl State {
    pub fn posts(&self) -> impl Iterator<Item = &Seen> {
        self.requests.iter().filter(|s| s.http == Method::POST)
    }
    pub fn posts_of(&self, method: &str) -> Vec<&Seen> {
        self.posts().filter(|s| s.method.as_deref() == Some(method)).collect()
    }
    /// How many `method` requests a live session took on.
    pub fn accepted(&self, method: &str) -> usize {
        self.accepted.iter().filter(|m| *m == method).count()
    }
    pub fn gets(&self) -> Vec<&Seen> {
        self.requests.iter().filter(|s| s.http == Method::GET).collect()
    }
    pub fn deletes(&self) -> Vec<&Seen> {
        self.requests.iter().filter(|s| s.http == Method::DELETE).collect()
    }
    /// Whether the session's `GET` stream is connected.
    pub fn listening(&self, session: &str) -> bool {
        self.sessions.get(session).is_some_and(|s| s.push.as_ref().is_some_and(|p| !p.is_closed()))
    }
}

struct Shared {
    state: Mutex<State>,
    changed: watch::Sender<u64>,
    /// The `X-Coffer-Token` this "daemon run" accepts.
    token: String,
}

impl Shared {
    fn update<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        let out = f(&mut self.state.lock().unwrap());
        self.changed.send_modify(|n| *n += 1);
        out
    }

    async fn wait_until(&self, mut cond: impl FnMut(&State) -> bool) {
        let mut rx = self.changed.subscribe();
        loop {
            if cond(&self.state.lock().unwrap()) {
                return;
            }
            if rx.changed().await.is_err() {
                return;
            }
        }
    }
}

/// A running fake `/mcp` server.
pub struct FakeMcp {
    pub base_url: String,
    pub addr: std::net::SocketAddr,
    shared: Arc<Shared>,
    kill: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeMcp {
    /// Starts a fake on `127.0.0.1:0`; it accepts connections as soon as this returns.
    pub fn start() -> Self {
        Self::start_at("127.0.0.1:0".parse().expect("address"), TOKEN)
    }

    /// Starts a fake on `addr` accepting `token`: e.g. the address of a killed fake, like a
    /// daemon restarted on the same port with a new token.
    pub fn start_at(addr: std::net::SocketAddr, token: &str) -> Self {
        let listener = std::net::TcpListener::bind(addr).unwrap_or_else(|e| panic!("bind {addr}: {e}"));
        listener.set_nonblocking(true).expect("non-blocking listener");
        let addr = listener.local_addr().expect("local addr");
        let base_url = format!("http://{addr}");
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                requests: Vec::new(),
                accepted: Vec::new(),
                sessions: HashMap::new(),
                next_session: 0,
                next_event: 0,
                released: HashSet::new(),
                get_allowed: true,
                resumable: HashMap::new(),
                tools: json!([]),
            }),
            changed: watch::channel(0).0,
            token: token.to_owned(),
        });
        let (kill, killed) = oneshot::channel::<()>();
        // Like the daemon's edge: `/mcp` bodies up to 16 MiB (axum's default limit is 2 MiB).
        let app = Router::new()
            .route("/mcp", any(mcp))
            .layer(DefaultBodyLimit::max(16 * 1024 * 1024))
            .with_state(shared.clone());
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
                tokio::select! {
                    r = axum::serve(listener, app) => r.expect("serve"),
                    _ = killed => {}
                }
            });
            // Dropping the runtime drops every connection task: all sockets close at once.
            drop(rt);
        });
        Self { base_url, addr, shared, kill: Some(kill), thread: Some(thread) }
    }

    pub fn endpoint(&self) -> Endpoint {
        Endpoint::new(self.base_url.clone(), self.shared.token.clone().into())
    }

    /// Waits (at most 10 s) until `cond` holds for the fake's state.
    pub async fn wait_until(&self, what: &str, cond: impl FnMut(&State) -> bool) {
        if tokio::time::timeout(Duration::from_secs(10), self.shared.wait_until(cond)).await.is_err() {
            let state = self.shared.state.lock().unwrap();
            panic!("timed out waiting for: {what}; requests seen: {:#?}", state.requests);
        }
    }

    /// Reads the fake's state.
    pub fn with<T>(&self, f: impl FnOnce(&State) -> T) -> T {
        f(&self.shared.state.lock().unwrap())
    }

    /// Sets what `tools/list` answers from now on (its `tools` array).
    pub fn set_tools(&self, tools: Value) {
        self.shared.update(|s| s.tools = tools);
    }

    /// Lets the `wait` requests with this gate answer.
    pub fn release(&self, gate: &str) {
        self.shared.update(|s| s.released.insert(gate.to_owned()));
    }

    /// Forgets a session: later requests carrying it get 404. Its open streams stay open.
    pub fn kill_session(&self, session: &str) {
        self.shared.update(|s| {
            if let Some(sess) = s.sessions.get_mut(session) {
                sess.alive = false;
            }
        });
    }

    /// Answers `GET /mcp` with 405 from now on.
    pub fn refuse_get(&self) {
        self.shared.update(|s| s.get_allowed = false);
    }

    /// Sends a message on the session's `GET` stream; returns its event id.
    pub fn push(&self, session: &str, message: &Value) -> String {
        self.shared.update(|s| {
            s.next_event += 1;
            let id = format!("g-{}", s.next_event);
            let push = s.sessions.get(session).and_then(|sess| sess.push.clone()).expect("session is listening");
            push.send(Bytes::from(format!("id: {id}\ndata: {message}\n\n"))).expect("stream is open");
            id
        })
    }

    /// Ends the session's `GET` stream from the server side (the client should reconnect).
    pub fn end_get_stream(&self, session: &str) {
        self.shared.update(|s| {
            if let Some(sess) = s.sessions.get_mut(session) {
                sess.push = None;
            }
        });
    }

    /// Ends the server like a process death: every connection closes at once.
    pub fn kill(&mut self) {
        if let Some(kill) = self.kill.take() {
            let _ = kill.send(());
        }
        if let Some(thread) = self.thread.take() {
            thread.join().expect("fake server thread");
        }
    }
}

impl Drop for FakeMcp {
    fn drop(&mut self) {
        self.kill();
    }
}

fn header(headers: &HeaderMap, name: &str) -> Option<String> {
    headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned)
}

fn json_response(status: StatusCode, body: String) -> Response {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Body::from(body))
        .expect("response")
}

fn rpc_error(status: StatusCode, code: i64, message: &str) -> Response {
    json_response(
        status,
        json!({"jsonrpc": "2.0", "id": null, "error": {"code": code, "message": message}}).to_string(),
    )
}

fn sse_response<S>(stream: S) -> Response
where
    S: futures_util::Stream<Item = Result<Bytes, Infallible>> + Send + 'static,
{
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "text/event-stream")
        .header("cache-control", "no-cache")
        .body(Body::from_stream(stream))
        .expect("response")
}

fn chunks(parts: Vec<String>) -> impl futures_util::Stream<Item = Result<Bytes, Infallible>> + Send + 'static {
    futures_util::stream::iter(parts.into_iter().map(|p| Ok(Bytes::from(p))))
}

async fn mcp(AxState(shared): AxState<Arc<Shared>>, method: Method, headers: HeaderMap, body: Bytes) -> Response {
    let body_json: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let seen = Seen {
        http: method.clone(),
        method: body_json.get("method").and_then(Value::as_str).map(str::to_owned),
        id: body_json.get("id").cloned(),
        body: body_json.clone(),
        session: header(&headers, "mcp-session-id"),
        protocol_version: header(&headers, "mcp-protocol-version"),
        last_event_id: header(&headers, "last-event-id"),
        accept: header(&headers, "accept"),
        content_type: header(&headers, "content-type"),
        authorized: header(&headers, "x-coffer-token").as_deref() == Some(shared.token.as_str()),
    };
    let (session, authorized) = (seen.session.clone(), seen.authorized);
    shared.update(|s| s.requests.push(seen));
    if !authorized {
        return rpc_error(StatusCode::UNAUTHORIZED, -32001, "missing or wrong token");
    }
    if method == Method::POST && body_json.get("method").and_then(Value::as_str) == Some("initialize") {
        let sid = shared.update(|s| {
            s.next_session += 1;
            let sid = format!("session-{}", s.next_session);
            s.sessions.insert(sid.clone(), Session { alive: true, push: None });
            sid
        });
        let result = json!({
            "jsonrpc": "2.0",
            "id": body_json["id"],
            "result": {"protocolVersion": PROTOCOL, "capabilities": {"tools": {}}, "serverInfo": {"name": "fake", "version": "0"}},
        });
        let mut resp = json_response(StatusCode::OK, result.to_string());
        resp.headers_mut().insert("mcp-session-id", sid.parse().expect("header"));
        return resp;
    }
    let Some(sid) = session else {
        return rpc_error(StatusCode::BAD_REQUEST, -32600, "missing Mcp-Session-Id");
    };
    if !shared.state.lock().unwrap().sessions.get(&sid).is_some_and(|s| s.alive) {
        return rpc_error(StatusCode::NOT_FOUND, -32001, "session not found");
    }
    match method {
        Method::POST => post(&shared, &sid, body_json).await,
        Method::GET => get(&shared, &sid, header(&headers, "last-event-id")),
        Method::DELETE => {
            shared.update(|s| s.sessions.remove(&sid));
            Response::builder().status(StatusCode::OK).body(Body::empty()).expect("response")
        }
        _ => Response::builder().status(StatusCode::METHOD_NOT_ALLOWED).body(Body::empty()).expect("response"),
    }
}

async fn post(shared: &Arc<Shared>, sid: &str, msg: Value) -> Response {
    let Some(id) = msg.get("id").cloned() else {
        return Response::builder().status(StatusCode::ACCEPTED).body(Body::empty()).expect("response");
    };
    if msg.get("method").is_none() {
        // A response to a server→client request.
        return Response::builder().status(StatusCode::ACCEPTED).body(Body::empty()).expect("response");
    }
    let params = msg.get("params").cloned().unwrap_or(Value::Null);
    shared.update(|s| s.accepted.push(msg["method"].as_str().unwrap_or_default().to_owned()));
    match msg["method"].as_str().unwrap_or_default() {
        "tools/list" => {
            let tools = shared.state.lock().unwrap().tools.clone();
            json_response(StatusCode::OK, json!({"jsonrpc": "2.0", "id": id, "result": {"tools": tools}}).to_string())
        }
        "echo" => {
            let body = json!({"jsonrpc": "2.0", "id": id, "result": {"echo": params}});
            json_response(StatusCode::OK, serde_json::to_string_pretty(&body).expect("json"))
        }
        "wait" => {
            let gate = params["gate"].as_str().unwrap_or_default().to_owned();
            shared.wait_until(|s| s.released.contains(&gate)).await;
            json_response(StatusCode::OK, json!({"jsonrpc": "2.0", "id": id, "result": {"gate": gate}}).to_string())
        }
        "stream" => {
            let note = json!({"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "working"}});
            let ask = json!({"jsonrpc": "2.0", "id": "srv-1", "method": "roots/list"});
            let response =
                json!({"jsonrpc": "2.0", "id": id, "result": {"content": [{"type": "text", "text": "done\nline 2"}]}});
            let pretty = serde_json::to_string_pretty(&response).expect("json");
            let data: String = pretty.lines().map(|l| format!("data: {l}\n")).collect();
            sse_response(chunks(vec![
                format!("id: {sid}-s-0\ndata:\n\n"),
                format!(": a comment\r\nid: {sid}-s-1\r\ndata: {note}\r\n\r\n"),
                format!("id: {sid}-s-2\ndata: {ask}\n\n"),
                format!("id: {sid}-s-3\n{data}\n"),
            ]))
        }
        "hang" => {
            sse_response(chunks(vec![format!("id: {sid}-h-0\ndata:\n\n")]).chain(futures_util::stream::pending()))
        }
        "drop" => {
            let event = format!("{sid}-d-0");
            let response = json!({"jsonrpc": "2.0", "id": id, "result": {"resumed": true}});
            shared.update(|s| s.resumable.insert(event.clone(), response));
            sse_response(chunks(vec![format!("id: {event}\ndata:\n\n")]))
        }
        "error" => rpc_error(StatusCode::BAD_REQUEST, -32602, "bad params"),
        "stream_error" => {
            let note = json!({"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "error"}});
            let error = json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32603, "message": "internal error"}});
            sse_response(chunks(vec![format!("data: {note}\n\n"), format!("data: {error}\n\n")]))
        }
        _ => json_response(
            StatusCode::OK,
            json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32601, "message": "method not found"}}).to_string(),
        ),
    }
}

fn get(shared: &Arc<Shared>, sid: &str, last_event_id: Option<String>) -> Response {
    if !shared.state.lock().unwrap().get_allowed {
        return Response::builder().status(StatusCode::METHOD_NOT_ALLOWED).body(Body::empty()).expect("response");
    }
    if let Some(last) = &last_event_id
        && let Some(response) = shared.update(|s| s.resumable.remove(last))
    {
        return sse_response(chunks(vec![format!("id: {last}-r\ndata: {response}\n\n")]));
    }
    let (tx, rx) = mpsc::unbounded_channel::<Bytes>();
    shared.update(|s| {
        if let Some(sess) = s.sessions.get_mut(sid) {
            sess.push = Some(tx);
        }
    });
    let events = futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|b| (Ok(b), rx)) });
    sse_response(chunks(vec!["retry: 10\n\n".to_owned()]).chain(events))
}
