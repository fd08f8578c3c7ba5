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
    let params =
        json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "test", "version": "0"}});
    let home = CofferHome::at(PathBuf::from("/nonexistent-coffer-home"));
    let up = Upstream::start(
        &server(url),
        &home,
        &params,
        tx,
        WAIT,
        Vec::new(),
        Some(crate::mcp::upstream::era::Era::Legacy),
        None,
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
    let err = HttpTransport::new(&s, core.clone(), None).err().unwrap();
    assert_eq!(err, "the value of header \"X-Bad\" is not valid");
    let mut s = server("http://127.0.0.1:1/mcp");
    s.headers.insert("Mcp-Session-Id".into(), "x".into());
    assert!(HttpTransport::new(&s, core.clone(), None).err().unwrap().contains("set by the transport"));
    assert_eq!(
        HttpTransport::new(&server("ftp://h/x"), core.clone(), None).err().unwrap(),
        "url scheme \"ftp\" is not supported (use http:// or https://)"
    );
    assert_eq!(HttpTransport::new(&server(""), core, None).err().unwrap(), "no url is configured");
    let url = Url::parse("http://user:pw@host:1/mcp?key=k#frag").unwrap();
    assert_eq!(shown_url(&url), "http://host:1/mcp");
}

#[test]
fn sanitize_quotes_json_rpc_errors_and_cuts_long_bodies() {
    let (tx, _rx) = events(EVENT_QUEUE);
    let t = HttpTransport::new(&server("http://127.0.0.1:1/mcp"), Core::new("fake", tx), None).unwrap();
    let body =
        br#"{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Bad Request: Unsupported protocol version"}}"#;
    assert_eq!(t.inner.sanitize(body, JSON), "Bad Request: Unsupported protocol version");
    let long = "word ".repeat(100);
    let cut = t.inner.sanitize(long.as_bytes(), "text/plain");
    assert!(cut.ends_with('…') && cut.chars().count() == SNIPPET_CHARS + 1, "{cut}");
    assert_eq!(t.inner.sanitize(b"  \n", ""), "(empty body)");
}
