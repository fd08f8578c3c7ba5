//! The legacy HTTP+SSE transport against a fake 2024-11-05 server on loopback (axum): `GET`
//! opens the stream whose first event names the endpoint, `POST`s to it are answered `202`
//! and their responses arrive on the stream. Driven through `Upstream` as a session drives it.
use std::collections::HashMap;
use std::path::PathBuf;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{HeaderMap as AxHeaders, StatusCode as AxStatus};
use axum::response::{IntoResponse, Response as AxResponse};
use coffer_runtime::home::CofferHome;
use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};

use super::*;
use crate::mcp::upstream::era::Era;
use crate::mcp::upstream::{EVENT_QUEUE, EventQueue, Reply, Upstream, UpstreamEvent, events};

const SECRET: &str = "sk-legacy-secret-456";
const WAIT: Duration = Duration::from_secs(30);

/// How the fake names its endpoint.
#[derive(Clone, Copy, PartialEq)]
enum Endpoint {
    Relative,
    OtherOrigin,
    /// Ends the stream without one.
    None,
}

/// One request the fake saw: (HTTP method, path, x-api-key, JSON-RPC method).
type Seen = (String, String, Option<String>, String);

struct Fake {
    endpoint: Endpoint,
    /// The open stream's sender (one session at a time is enough here).
    stream: Mutex<Option<mpsc::UnboundedSender<String>>>,
    /// Every request line: (HTTP method, path, x-api-key, JSON-RPC method).
    seen: watch::Sender<Vec<Seen>>,
}

impl Fake {
    fn record(&self, verb: &str, path: &str, headers: &AxHeaders, method: &str) {
        let key = headers.get("x-api-key").map(|v| v.to_str().unwrap().to_owned());
        self.seen.send_modify(|s| s.push((verb.into(), path.into(), key, method.into())));
    }

    fn push(&self, frame: String) {
        if let Some(tx) = self.stream.lock().unwrap().as_ref() {
            let _ = tx.send(frame);
        }
    }
}

fn message(v: &Value) -> String {
    format!("event: message\ndata: {v}\n\n")
}

async fn sse(State(f): State<Arc<Fake>>, headers: AxHeaders, uri: axum::http::Uri) -> AxResponse {
    f.record("GET", uri.path(), &headers, "");
    let (tx, rx) = mpsc::unbounded_channel();
    match f.endpoint {
        Endpoint::Relative => tx.send("event: endpoint\ndata: /messages?session_id=s1\n\n".into()).unwrap(),
        Endpoint::OtherOrigin => tx.send("event: endpoint\ndata: http://evil.example/messages\n\n".into()).unwrap(),
        Endpoint::None => {
            drop(tx);
            let stream = tokio_stream_from(rx);
            return ([("content-type", "text/event-stream")], Body::from_stream(stream)).into_response();
        }
    }
    *f.stream.lock().unwrap() = Some(tx);
    ([("content-type", "text/event-stream")], Body::from_stream(tokio_stream_from(rx))).into_response()
}

fn tokio_stream_from(
    mut rx: mpsc::UnboundedReceiver<String>,
) -> impl futures_util::Stream<Item = Result<String, std::convert::Infallible>> {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx)).map(Ok)
}

async fn messages(
    State(f): State<Arc<Fake>>,
    Query(q): Query<HashMap<String, String>>,
    headers: AxHeaders,
    body: Bytes,
) -> AxResponse {
    let msg: Value = serde_json::from_slice(&body).expect("the client sends JSON");
    let method = msg["method"].as_str().unwrap_or_default().to_owned();
    f.record("POST", "/messages", &headers, &method);
    if q.get("session_id").map(String::as_str) != Some("s1") {
        return AxStatus::NOT_FOUND.into_response();
    }
    let Some(id) = msg.get("id").cloned() else { return AxStatus::ACCEPTED.into_response() };
    let answer = |result: Value| message(&json!({"jsonrpc": "2.0", "id": id, "result": result}));
    match method.as_str() {
        "initialize" => f.push(answer(
            json!({"protocolVersion": "2024-11-05", "capabilities": {"tools": {}}, "serverInfo": {"name": "old", "version": "1"}}),
        )),
        "tools/list" => f.push(answer(json!({"tools": [{"name": "echo", "inputSchema": {"type": "object"}}]}))),
        "tools/call" => match msg["params"]["name"].as_str().unwrap_or_default() {
            "garbage" => {
                f.push("event: message\ndata: this is not json {\n\n".into());
                f.push("event: ping\ndata: {}\n\n".into());
                f.push(message(&json!({"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "x"}})));
                f.push(answer(json!({"content": [{"type": "text", "text": "after garbage"}]})));
            }
            "oversized" => {
                // One event past the 64 MiB frame limit, then the real answer.
                let big = "x".repeat(MAX_FRAME + 16);
                f.push(format!("event: message\ndata: {big}\n\n"));
                f.push(answer(json!({"content": [{"type": "text", "text": "after oversized"}]})));
            }
            // The stream closes while the call waits.
            "die" => *f.stream.lock().unwrap() = None,
            "refuse" => return (AxStatus::INTERNAL_SERVER_ERROR, format!("no; key {SECRET}")).into_response(),
            "forget" => return AxStatus::NOT_FOUND.into_response(),
            _ => f.push(answer(json!({"content": [{"type": "text", "text": msg["params"]["arguments"]["message"]}]}))),
        },
        _ => f.push(message(&json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32601, "message": "Method not found"}}))),
    }
    (AxStatus::ACCEPTED, "Accepted").into_response()
}

/// A fake legacy server; returns it and its base URL. Its stream is at `/sse` and `/legacy`
/// (both `GET` only: a `POST` there gets axum's 405).
async fn fake(endpoint: Endpoint) -> (Arc<Fake>, String) {
    let f = Arc::new(Fake { endpoint, stream: Mutex::new(None), seen: watch::channel(Vec::new()).0 });
    let app = Router::new()
        .route("/sse", axum::routing::get(sse))
        .route("/legacy", axum::routing::get(sse))
        .route("/messages", axum::routing::post(messages))
        .with_state(f.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (f, url)
}

async fn start(url: &str, hint: Option<Era>) -> Result<(Arc<Upstream>, EventQueue), UpstreamError> {
    let (tx, rx) = events(EVENT_QUEUE);
    let server = McpServer {
        name: "old".into(),
        transport: coffer_proto::store::Transport::Http.into(),
        url: url.into(),
        headers: HashMap::from([("X-Api-Key".to_owned(), SECRET.to_owned())]),
        ..Default::default()
    };
    let params =
        json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "test", "version": "0"}});
    let home = CofferHome::at(PathBuf::from("/nonexistent-coffer-home"));
    let up = Upstream::start(&server, &home, &params, tx, WAIT, Vec::new(), hint, None).await?;
    Ok((up, rx))
}

async fn call(up: &Upstream, tool: &str) -> Result<Reply, UpstreamError> {
    let params = json!({"name": tool, "arguments": {"message": "hi"}}).to_string();
    up.request("tools/call", Some(&RawValue::from_string(params).unwrap()), WAIT).await
}

fn text(reply: Reply) -> String {
    match reply {
        Reply::Result(r) => {
            let v: Value = serde_json::from_str(r.get()).unwrap();
            v["content"][0]["text"].as_str().unwrap().to_owned()
        }
        Reply::Error(e) => panic!("expected a result, got the error {}", e.get()),
    }
}

fn start_reason(r: Result<(Arc<Upstream>, EventQueue), UpstreamError>) -> String {
    match r {
        Err(UpstreamError::Start { reason, .. }) => reason,
        other => panic!("expected Start, got {:?}", other.map(|_| ())),
    }
}

#[tokio::test]
async fn detected_from_a_405_post_then_lists_and_calls_over_the_stream() {
    let (f, base) = fake(Endpoint::Relative).await;
    // No era hint: the `server/discover` probe is the first POST, refused 405.
    let (up, _events) = start(&format!("{base}/legacy"), None).await.unwrap();
    assert_eq!(up.era(), Era::Legacy);
    assert_eq!(up.init_result["serverInfo"]["name"], "old");
    let list = match up.request("tools/list", None, WAIT).await.unwrap() {
        Reply::Result(r) => r.get().to_owned(),
        Reply::Error(e) => panic!("{}", e.get()),
    };
    assert!(list.contains("\"echo\""), "{list}");
    assert_eq!(text(call(&up, "echo").await.unwrap()), "hi");
    let seen = f.seen.borrow().clone();
    // One POST to the URL (the probe, refused), one GET, then everything to the endpoint.
    let methods: Vec<(&str, &str, &str)> =
        seen.iter().map(|(v, p, _, m)| (v.as_str(), p.as_str(), m.as_str())).collect();
    assert_eq!(
        methods,
        [
            ("GET", "/legacy", ""),
            ("POST", "/messages", "initialize"),
            ("POST", "/messages", "notifications/initialized"),
            ("POST", "/messages", "tools/list"),
            ("POST", "/messages", "tools/call"),
        ]
    );
    assert!(seen.iter().all(|(_, _, key, _)| key.as_deref() == Some(SECRET)), "the configured headers go everywhere");
    up.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test]
async fn a_url_ending_in_sse_goes_straight_to_the_stream() {
    let (f, base) = fake(Endpoint::Relative).await;
    let (up, _events) = start(&format!("{base}/sse"), Some(Era::Legacy)).await.unwrap();
    assert_eq!(text(call(&up, "echo").await.unwrap()), "hi");
    assert_eq!(f.seen.borrow()[0].0, "GET", "no POST to the SSE URL");
    up.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test]
async fn garbage_and_oversized_events_are_skipped_and_the_answer_still_arrives() {
    let (_f, base) = fake(Endpoint::Relative).await;
    let (up, mut events) = start(&format!("{base}/sse"), None).await.unwrap();
    assert_eq!(text(call(&up, "garbage").await.unwrap()), "after garbage");
    let mut notes = Vec::new();
    while let Ok(ev) = events.try_recv() {
        if let UpstreamEvent::Notification { method, .. } = ev {
            notes.push(method);
        }
    }
    assert!(notes.contains(&"notifications/message".to_owned()), "{notes:?}");
    assert_eq!(up.junk_note().unwrap(), "it sent 1 message that is not JSON-RPC, first: \"this is not json {\"");
    assert_eq!(text(call(&up, "oversized").await.unwrap()), "after oversized");
    assert!(up.is_alive());
    up.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test]
async fn the_stream_closing_mid_call_fails_it_and_ends_the_session() {
    let (_f, base) = fake(Endpoint::Relative).await;
    let (up, mut events) = start(&format!("{base}/sse"), None).await.unwrap();
    match call(&up, "die").await {
        Err(UpstreamError::Closed { reason, .. }) => {
            assert!(reason.starts_with("its HTTP+SSE stream closed (the server ended it)"), "{reason}")
        }
        other => panic!("expected Closed, got {:?}", other.map(|_| ())),
    }
    assert!(!up.is_alive());
    tokio::time::timeout(WAIT, async { while !matches!(events.recv().await, Some(UpstreamEvent::Closed { .. })) {} })
        .await
        .unwrap();
    // The next session starts anew and works.
    let (again, _events) = start(&format!("{base}/sse"), None).await.unwrap();
    assert_eq!(text(call(&again, "echo").await.unwrap()), "hi");
    again.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test]
async fn refused_posts_fail_the_request_and_a_forgotten_session_ends_it() {
    let (_f, base) = fake(Endpoint::Relative).await;
    let (up, _events) = start(&format!("{base}/sse"), None).await.unwrap();
    match call(&up, "refuse").await.unwrap() {
        Reply::Error(e) => {
            let e = e.get();
            assert!(e.contains("-32001") && e.contains("HTTP 500 Internal Server Error"), "{e}");
            assert!(!e.contains(SECRET) && e.contains("[REDACTED]"), "{e}");
        }
        Reply::Result(r) => panic!("{}", r.get()),
    }
    assert!(up.is_alive());
    match call(&up, "forget").await {
        Err(UpstreamError::Closed { reason, .. }) => assert_eq!(reason, "upstream session expired (HTTP 404)"),
        other => panic!("expected Closed, got {:?}", other.map(|_| ())),
    }
    up.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test]
async fn bad_endpoints_and_non_mcp_urls_fail_the_start_clearly() {
    let (_f, base) = fake(Endpoint::OtherOrigin).await;
    let reason = start_reason(start(&format!("{base}/sse"), None).await);
    assert!(reason.contains("named an endpoint on another origin (http://evil.example/messages)"), "{reason}");

    let (_f, base) = fake(Endpoint::None).await;
    let reason = start_reason(start(&format!("{base}/sse"), None).await);
    assert_eq!(reason, "upstream old closed its SSE stream before naming an endpoint");

    // A POST answered 404 and a GET answered 404: neither transport.
    let (_f, base) = fake(Endpoint::Relative).await;
    let reason = start_reason(start(&format!("{base}/nothing?key=query-secret"), None).await);
    assert!(
        reason.starts_with("upstream old is neither a Streamable HTTP nor a legacy HTTP+SSE server: its SSE GET answered HTTP 404 Not Found"),
        "{reason}"
    );
    assert!(!reason.contains("query-secret"), "{reason}");
}

#[test]
fn sse_paths_are_recognised() {
    for (url, legacy) in [
        ("http://h/sse", true),
        ("http://h/v1/sse/", true),
        ("http://h/sse?x=1", true),
        ("http://h/mcp", false),
        ("http://h/ssex", false),
        ("http://h/", false),
    ] {
        assert_eq!(looks_legacy(&Url::parse(url).unwrap()), legacy, "{url}");
    }
}
