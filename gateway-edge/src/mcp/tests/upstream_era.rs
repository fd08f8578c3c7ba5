//! Upstreams of the stateless revision (MCP 2026-07-28) and of the handshake era, in process:
//! a fake upstream on loopback that speaks either era's Streamable HTTP wire format (and
//! misbehaves on purpose: a hung or garbage `server/discover`, a switch of era, malformed or
//! endless `InputRequiredResult`s), driven through the real `Upstream` and session.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use coffer_runtime::home::CofferHome;
use serde_json::value::RawValue;
use serde_json::{Value, json};

use super::{Harness, call, error, result, server, snapshot};
use crate::mcp::upstream::era::{Era, MODERN};
use crate::mcp::upstream::{Reply, Upstream, UpstreamEvent};

/// How the fake answers `server/discover`.
#[derive(Clone, Copy, PartialEq)]
enum Discover {
    /// A 2026-07-28 `DiscoverResult`.
    Modern,
    /// Never answers.
    Hang,
    /// A result that is no `DiscoverResult`.
    Garbage,
    /// HTTP 400 with a plain-text body (a handshake-era server without a session).
    Refuse,
    /// -32601 (a handshake-era server).
    Legacy,
}

struct Fake {
    discover: Mutex<Discover>,
    /// `initialize` is refused with -32022 (a server that serves only 2026-07-28).
    modern_only: AtomicBool,
    /// Every POST: its method, headers and body.
    seen: Mutex<Vec<(String, HeaderMap, Value)>>,
}

impl Fake {
    fn posts(&self, method: &str) -> Vec<(HeaderMap, Value)> {
        let seen = self.seen.lock().unwrap();
        seen.iter().filter(|(m, _, _)| m == method).map(|(_, h, b)| (h.clone(), b.clone())).collect()
    }
}

fn json_answer(id: &Value, body: Value) -> Response {
    let mut msg = body;
    msg["jsonrpc"] = json!("2.0");
    msg["id"] = id.clone();
    ([("content-type", "application/json")], msg.to_string()).into_response()
}

async fn post(State(f): State<Arc<Fake>>, headers: HeaderMap, body: Bytes) -> Response {
    let msg: Value = serde_json::from_slice(&body).expect("the gateway sends JSON");
    let method = msg["method"].as_str().unwrap_or_default().to_owned();
    f.seen.lock().unwrap().push((method.clone(), headers, msg.clone()));
    let Some(id) = msg.get("id").cloned().filter(|_| !method.is_empty()) else {
        return StatusCode::ACCEPTED.into_response();
    };
    let p = &msg["params"];
    let discover = *f.discover.lock().unwrap();
    match method.as_str() {
        "server/discover" => match discover {
            Discover::Modern => json_answer(
                &id,
                json!({"result": {"resultType": "complete", "supportedVersions": [MODERN],
                    "capabilities": {"tools": {"listChanged": true}},
                    "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "fake2", "version": "2"}},
                    "ttlMs": 0, "cacheScope": "public"}}),
            ),
            Discover::Hang => std::future::pending().await,
            Discover::Garbage => json_answer(&id, json!({"result": "garbage"})),
            Discover::Refuse => (StatusCode::BAD_REQUEST, "Bad Request: Server not initialized").into_response(),
            Discover::Legacy => json_answer(&id, json!({"error": {"code": -32601, "message": "Method not found"}})),
        },
        "initialize" if f.modern_only.load(Ordering::Relaxed) => json_answer(
            &id,
            json!({"error": {"code": -32022, "message": "this server serves 2026-07-28 only",
                "data": {"supported": [MODERN], "requested": p["protocolVersion"]}}}),
        ),
        "initialize" => json_answer(
            &id,
            json!({"result": {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}}, "serverInfo": {"name": "fake1", "version": "1"}}}),
        ),
        "subscriptions/listen" => {
            let sub = json!({"io.modelcontextprotocol/subscriptionId": id});
            let ack = json!({"jsonrpc": "2.0", "method": "notifications/subscriptions/acknowledged", "params": {"_meta": sub, "notifications": p["notifications"]}});
            let changed =
                json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed", "params": {"_meta": sub}});
            let frames = vec![format!("data: {ack}\n\n"), format!("data: {changed}\n\n")];
            let stream = futures_util::stream::iter(frames.into_iter().map(Ok::<_, std::convert::Infallible>))
                .chain(futures_util::stream::pending());
            ([("content-type", "text/event-stream")], Body::from_stream(stream)).into_response()
        }
        "tools/list" => {
            let tools: Vec<Value> = ["echo", "loop", "bad", "ask"]
                .iter()
                .map(|n| json!({"name": n, "inputSchema": {"type": "object"}}))
                .collect();
            json_answer(
                &id,
                json!({"result": {"resultType": "complete", "ttlMs": 0, "cacheScope": "public", "tools": tools}}),
            )
        }
        "tools/call" => {
            let text =
                |t: String| json!({"result": {"resultType": "complete", "content": [{"type": "text", "text": t}]}});
            let answer = match p["name"].as_str().unwrap_or_default() {
                "echo" => text(format!("echo {}", p["arguments"]["message"].as_str().unwrap_or_default())),
                "loop" => json!({"result": {"resultType": "input_required", "requestState": "again"}}),
                "bad" => {
                    json!({"result": {"resultType": "input_required", "inputRequests": {"x": {"method": "tools/call", "params": {}}}}})
                }
                "ask" => match p.get("inputResponses") {
                    Some(r) => text(format!("got {} with state {}", r["who"]["content"]["name"], p["requestState"])),
                    None => json!({"result": {"resultType": "input_required", "requestState": "s1",
                        "inputRequests": {"who": {"method": "elicitation/create", "params": {"mode": "form", "message": "Who?", "requestedSchema": {"type": "object"}}}}}}),
                },
                _ => json!({"error": {"code": -32602, "message": "no such tool"}}),
            };
            json_answer(&id, answer)
        }
        _ => json_answer(&id, json!({"error": {"code": -32601, "message": "Method not found"}})),
    }
}

use futures_util::StreamExt as _;

/// A fake upstream answering discover as `discover`; returns it and its URL.
async fn fake(discover: Discover) -> (Arc<Fake>, String) {
    let f =
        Arc::new(Fake { discover: Mutex::new(discover), modern_only: AtomicBool::new(false), seen: Mutex::default() });
    let app = Router::new()
        .route(
            "/mcp",
            axum::routing::post(post)
                .get(|| async { StatusCode::METHOD_NOT_ALLOWED })
                .delete(|| async { StatusCode::METHOD_NOT_ALLOWED }),
        )
        .with_state(f.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (f, url)
}

fn client() -> Value {
    json!({"protocolVersion": "2025-06-18", "capabilities": {"elicitation": {}}, "clientInfo": {"name": "era-test", "version": "7"}})
}

async fn start(
    url: &str,
    hint: Option<Era>,
    timeout: Duration,
) -> (Result<Arc<Upstream>, crate::mcp::upstream::UpstreamError>, crate::mcp::upstream::EventQueue) {
    let (tx, rx) = crate::mcp::upstream::events(crate::mcp::upstream::EVENT_QUEUE);
    let home = CofferHome::at(std::path::PathBuf::from("/nonexistent-coffer-home"));
    let up = Upstream::start(&server("x", url), &home, &client(), tx, timeout, Vec::new(), hint, None).await;
    (up, rx)
}

const WAIT: Duration = Duration::from_secs(10);

#[tokio::test]
async fn a_modern_http_upstream_gets_meta_and_request_headers_and_no_session() {
    let (f, url) = fake(Discover::Modern).await;
    let (up, mut events) = start(&url, None, WAIT).await;
    let up = up.unwrap();
    assert_eq!(up.era(), Era::Modern);
    assert_eq!(up.init_result["serverInfo"]["name"], "fake2");
    assert!(up.has_capability("tools"));
    assert!(f.posts("initialize").is_empty(), "no handshake with a modern server");

    let params = RawValue::from_string(json!({"name": "echo", "arguments": {"message": "hi"}}).to_string()).unwrap();
    let Reply::Result(r) = up.request("tools/call", Some(&params), WAIT).await.unwrap() else { panic!("a result") };
    assert!(r.get().contains("echo hi"), "{}", r.get());
    let (headers, body) = f.posts("tools/call").pop().unwrap();
    assert_eq!(headers["mcp-protocol-version"], MODERN);
    assert_eq!(headers["mcp-method"], "tools/call");
    assert_eq!(headers["mcp-name"], "echo");
    assert!(headers.get("mcp-session-id").is_none());
    let meta = &body["params"]["_meta"];
    assert_eq!(meta["io.modelcontextprotocol/protocolVersion"], MODERN);
    assert_eq!(meta["io.modelcontextprotocol/clientInfo"]["name"], "era-test");
    assert_eq!(meta["io.modelcontextprotocol/clientCapabilities"], json!({"elicitation": {}}));
    let (discover_headers, _) = f.posts("server/discover").pop().unwrap();
    assert_eq!(discover_headers["mcp-method"], "server/discover");

    // The listen stream's list change arrives like a handshake-era server's notification.
    let (_, listen) = f.posts("subscriptions/listen").pop().expect("a subscriptions/listen request");
    assert_eq!(listen["params"]["notifications"], json!({"toolsListChanged": true}));
    tokio::time::timeout(WAIT, async {
        loop {
            match events.recv().await.unwrap() {
                UpstreamEvent::Notification { method, .. } if method == "notifications/tools/list_changed" => return,
                _ => {}
            }
        }
    })
    .await
    .expect("the list change arrived");
    // Logging: no logging/setLevel in this revision, the level rides in _meta.
    assert!(up.set_log_level("debug"));
    up.request("tools/list", None, WAIT).await.unwrap();
    let (_, body) = f.posts("tools/list").pop().unwrap();
    assert_eq!(body["params"]["_meta"]["io.modelcontextprotocol/logLevel"], "debug");
    up.shutdown(Duration::from_millis(200)).await;
    assert!(
        f.seen.lock().unwrap().iter().all(|(m, _, _)| !m.is_empty()),
        "no GET, no DELETE: {} posts",
        f.seen.lock().unwrap().len()
    );
}

#[tokio::test]
async fn a_hung_discover_costs_a_bounded_wait_then_the_handshake() {
    let (f, url) = fake(Discover::Hang).await;
    let t = Instant::now();
    let (up, _events) = start(&url, None, Duration::from_secs(3)).await;
    let up = up.unwrap();
    assert_eq!(up.era(), Era::Legacy);
    assert_eq!(up.init_result["serverInfo"]["name"], "fake1");
    let elapsed = t.elapsed();
    assert!(elapsed >= Duration::from_millis(1400) && elapsed < Duration::from_millis(2900), "{elapsed:?}");
    assert_eq!(f.posts("initialize").len(), 1);
    assert_eq!(f.posts("initialize")[0].1["params"]["protocolVersion"], "2025-06-18", "the client's own version");
    up.shutdown(Duration::from_millis(200)).await;
}

#[tokio::test]
async fn garbage_or_refused_discover_means_the_handshake_era() {
    for mode in [Discover::Garbage, Discover::Refuse, Discover::Legacy] {
        let (f, url) = fake(mode).await;
        let (up, _events) = start(&url, None, WAIT).await;
        let up = up.unwrap();
        assert_eq!(up.era(), Era::Legacy);
        assert_eq!(f.posts("initialize").len(), 1);
        // A handshake-era request: no _meta added, no stateless headers.
        up.request("tools/list", None, WAIT).await.unwrap();
        let (headers, body) = f.posts("tools/list").pop().unwrap();
        assert!(body.get("params").is_none(), "{body}");
        assert!(headers.get("mcp-method").is_none());
        up.shutdown(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn an_upstream_that_changed_era_since_it_was_learnt_is_still_found() {
    // Remembered as handshake-era, now modern-only: the refused handshake leads to discover.
    let (f, url) = fake(Discover::Modern).await;
    f.modern_only.store(true, Ordering::Relaxed);
    let (up, _events) = start(&url, Some(Era::Legacy), WAIT).await;
    let up = up.unwrap();
    assert_eq!(up.era(), Era::Modern);
    assert_eq!(f.posts("initialize").len(), 1);
    up.shutdown(Duration::from_millis(200)).await;

    // Remembered as modern, now handshake-era: the refused probe leads to initialize.
    let (f, url) = fake(Discover::Legacy).await;
    let (up, _events) = start(&url, Some(Era::Modern), WAIT).await;
    let up = up.unwrap();
    assert_eq!(up.era(), Era::Legacy);
    assert_eq!(f.posts("server/discover").len(), 1);
    up.shutdown(Duration::from_millis(200)).await;

    // A modern-only server whose version Coffer does not speak: a clear start error.
    let (f, url) = fake(Discover::Garbage).await;
    f.modern_only.store(true, Ordering::Relaxed);
    let (up, _events) = start(&url, None, WAIT).await;
    let err = up.err().unwrap().to_string();
    assert!(err.contains("initialize failed") && err.contains("-32022"), "{err}");
}

#[tokio::test]
async fn input_required_results_are_relayed_retried_and_bounded() {
    let (f, url) = fake(Discover::Modern).await;
    let h = Harness::new(snapshot(vec![server("m", &url)], &[]));
    let s = h.session();

    // Endless rounds: requestState only, never complete.
    let e = error(call(&s, "m__loop", json!({})).await);
    assert!(e.message.contains("after 8 rounds"), "{}", e.message);
    assert_eq!(f.posts("tools/call").len(), 1 + crate::mcp::upstream::mrtr::MAX_ROUNDS);
    let (_, last) = f.posts("tools/call").pop().unwrap();
    assert_eq!(last["params"]["requestState"], "again", "the state is echoed");
    assert_eq!(last["params"]["inputResponses"], json!({}));

    // An input request that is not one of the three allowed: named, not relayed.
    let e = error(call(&s, "m__bad", json!({})).await);
    assert!(e.message.contains("unusable InputRequiredResult") && e.message.contains("not one of"), "{}", e.message);

    // An elicitation with no client stream to relay it on: a clear error, no retry.
    let before = f.posts("tools/call").len();
    let e = error(call(&s, "m__ask", json!({})).await);
    assert!(e.message.contains("elicitation/create") && e.message.contains("did not give"), "{}", e.message);
    assert_eq!(f.posts("tools/call").len(), before + 1);

    // A plain call still works, verbatim.
    let r = result(call(&s, "m__echo", json!({"message": "yo"})).await);
    assert_eq!(r["content"][0]["text"], "echo yo");
    s.close().await;
}

#[tokio::test]
async fn an_elicitation_asked_by_a_modern_upstream_reaches_the_client_and_the_answer_goes_back() {
    let (f, url) = fake(Discover::Modern).await;
    let h = Harness::new(snapshot(vec![server("m", &url)], &[]));
    let s = crate::mcp::session::Session::new("era-s".into(), "2025-06-18".into(), &client(), h.shared.clone());
    let (side, mut relayed) = crate::mcp::session::Lane::new(8, "test");
    let ctx = crate::mcp::session::RequestCtx::on("1", side);
    let s2 = s.clone();
    let answerer = tokio::spawn(async move {
        let msg: Value = serde_json::from_str(&relayed.recv().await.unwrap()).unwrap();
        assert_eq!(msg["method"], "elicitation/create");
        assert_eq!(msg["params"]["message"], "Who?");
        let id = RawValue::from_string(msg["id"].to_string()).unwrap();
        let answer =
            RawValue::from_string(json!({"action": "accept", "content": {"name": "Ada"}}).to_string()).unwrap();
        s2.handle_response(&id, Some(answer), None).await;
    });
    let params = RawValue::from_string(json!({"name": "m__ask", "arguments": {}}).to_string()).unwrap();
    let r = result(s.handle_request_ctx("tools/call", Some(&params), &ctx).await);
    answerer.await.unwrap();
    assert_eq!(r["content"][0]["text"], "got \"Ada\" with state \"s1\"");
    let calls = f.posts("tools/call");
    assert_eq!(calls.len(), 2, "the original and one retry");
    assert_ne!(calls[0].1["id"], calls[1].1["id"], "a retry is a new request");
    s.close().await;
}
