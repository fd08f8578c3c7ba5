//! In-process tests of the gateway core — routing, policy, naming, caching, built-ins and
//! credential resolution — on its test seams: a fixed (or hand-fed) policy snapshot, the
//! in-memory invocation recorder, fixed credentials, and a fake upstream MCP server on loopback
//! that speaks the Streamable HTTP wire format (MCP 2025-11-25 basic/transports), driven
//! through the real `Upstream` and HTTP transport.
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use coffer_proto::store::McpServer;
use coffer_runtime::home::CofferHome;
use coffer_types::BUILTIN_SERVER;
use futures_util::future::BoxFuture;
use secrecy::SecretString;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};

use crate::credentials::encode_ref;
use crate::mcp::builtin::{Caller, Provider, Registry};
use crate::mcp::invocations::{Record, Recorder};
use crate::mcp::jsonrpc::{INVALID_PARAMS, TOOL_DISABLED, UPSTREAM_UNAVAILABLE};
use crate::mcp::resolver::FixedCredentials;
use crate::mcp::session::{Answer, ListKind, RpcError, Session};
use crate::mcp::{SUPPORTED_VERSIONS, Shared};
use crate::snapshot::{Kind, Snapshot, SnapshotHandle};

/// What the fake upstream serves and what it saw.
struct Fake {
    tools: Mutex<Vec<Value>>,
    /// How long `initialize` takes to answer (ms): a slow start; `u64::MAX`: never (hung).
    init_delay_ms: std::sync::atomic::AtomicU64,
    /// Tools per `tools/list` page; 0: one page.
    page: usize,
    /// Every message received: its method (empty for responses) and the request's headers.
    seen: Mutex<Vec<(String, HeaderMap)>>,
}

impl Fake {
    /// How many `method` messages the fake received.
    fn count(&self, method: &str) -> usize {
        self.seen.lock().unwrap().iter().filter(|(m, _)| m == method).count()
    }

    fn header(&self, name: &str) -> Option<String> {
        let seen = self.seen.lock().unwrap();
        seen.iter().find_map(|(_, h)| h.get(name).map(|v| v.to_str().unwrap().to_owned()))
    }
}

async fn fake_post(State(f): State<Arc<Fake>>, headers: HeaderMap, body: Bytes) -> Response {
    let msg: Value = serde_json::from_slice(&body).expect("the gateway sends JSON");
    let method = msg["method"].as_str().unwrap_or_default().to_owned();
    f.seen.lock().unwrap().push((method.clone(), headers));
    let Some(id) = msg.get("id").cloned().filter(|_| !method.is_empty()) else {
        return StatusCode::ACCEPTED.into_response(); // a notification or a response
    };
    let answer = match method.as_str() {
        "initialize" => {
            let delay = f.init_delay_ms.load(std::sync::atomic::Ordering::Relaxed);
            if delay > 0 {
                // A slow (or, at u64::MAX, hung) server on purpose: what these tests are about.
                tokio::time::sleep(Duration::from_millis(delay.min(3_600_000))).await;
            }
            json!({"result": {
            "protocolVersion": "2025-11-25",
            "capabilities": {"tools": {"listChanged": true}, "prompts": {}},
            "serverInfo": {"name": "fake", "version": "1"},
            }})
        }
        "tools/list" => {
            let tools = f.tools.lock().unwrap().clone();
            let from: usize = msg["params"]["cursor"].as_str().map_or(0, |c| c.parse().unwrap());
            let to = if f.page == 0 { tools.len() } else { (from + f.page).min(tools.len()) };
            let mut page = json!({"tools": tools[from..to]});
            if to < tools.len() {
                page["nextCursor"] = json!(to.to_string());
            }
            json!({"result": page})
        }
        "prompts/list" => json!({"result": {"prompts": []}}),
        "tools/call" => {
            let name = &msg["params"]["name"];
            json!({"result": {
                "content": [{"type": "text", "text": name}],
                "structuredContent": {"name": name, "arguments": msg["params"]["arguments"]},
            }})
        }
        _ => json!({"error": {"code": -32601, "message": "no such method"}}),
    };
    let mut body = answer;
    body["jsonrpc"] = json!("2.0");
    body["id"] = id;
    ([("content-type", "application/json"), ("mcp-session-id", "fake-1")], body.to_string()).into_response()
}

/// Starts a fake upstream serving `tools` (`page` per list page, 0: all); returns it and its URL.
async fn fake(tools: &[&str], page: usize) -> (Arc<Fake>, String) {
    let tools = tools
        .iter()
        .map(|n| json!({"name": n, "description": format!("The {n} tool"), "inputSchema": {"type": "object"}}))
        .collect();
    fake_listing(tools, page).await
}

/// [`fake`] serving these tool definitions as they are.
async fn fake_listing(tools: Vec<Value>, page: usize) -> (Arc<Fake>, String) {
    let f =
        Arc::new(Fake { tools: Mutex::new(tools), init_delay_ms: Default::default(), page, seen: Mutex::default() });
    let app = Router::new()
        .route(
            "/mcp",
            axum::routing::post(fake_post)
                .get(|| async { StatusCode::METHOD_NOT_ALLOWED })
                .delete(|| async { StatusCode::OK }),
        )
        .with_state(f.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (f, url)
}

fn server(name: &str, url: &str) -> McpServer {
    McpServer {
        name: name.into(),
        transport: coffer_proto::store::Transport::Http as i32,
        url: url.into(),
        enabled: true,
        version: 1,
        ..Default::default()
    }
}

fn snapshot(servers: Vec<McpServer>, prefs: &[(&str, Kind, &str, bool)]) -> Snapshot {
    Snapshot {
        servers: servers.into_iter().map(|s| (s.name.clone(), s)).collect(),
        prefs: prefs.iter().map(|(s, k, n, on)| (((*s).to_owned(), *k, (*n).to_owned()), *on)).collect(),
        loaded: true,
        ..Default::default()
    }
}

/// A gateway core on its test seams.
struct Harness {
    shared: Arc<Shared>,
    records: mpsc::UnboundedReceiver<Record>,
    policy: watch::Sender<Arc<Snapshot>>,
    _home: tempfile::TempDir,
}

impl Harness {
    fn new(snap: Snapshot) -> Self {
        Self::with(snap, Registry::standard(None), FixedCredentials::default())
    }

    fn with(snap: Snapshot, builtins: Registry, credentials: FixedCredentials) -> Self {
        let home = tempfile::tempdir().unwrap();
        let (policy, snapshot) = SnapshotHandle::manual(snap);
        let (recorder, records) = Recorder::in_memory();
        let shared =
            Shared::new(CofferHome::at(home.path().into()), snapshot, recorder, Arc::new(credentials), builtins);
        Self { shared, records, policy, _home: home }
    }

    /// A gateway core on `home` (kept by the caller: a second harness on it is the same gateway
    /// after a restart), with its catalog's registry-following and cache-file tasks running
    /// until `stop`.
    fn running_at(home: &std::path::Path, snap: Snapshot, stop: &tokio_util::sync::CancellationToken) -> Self {
        let (policy, snapshot) = SnapshotHandle::manual(snap);
        let (recorder, records) = Recorder::in_memory();
        let shared = Shared::new(
            CofferHome::at(home.into()),
            snapshot,
            recorder,
            Arc::new(FixedCredentials::default()),
            Registry::standard(None),
        );
        tokio::spawn(crate::mcp::gateway_catalog::follow(shared.clone(), stop.clone()));
        tokio::spawn(crate::mcp::gateway_catalog::persist(shared.clone(), stop.clone()));
        Self { shared, records, policy, _home: tempfile::tempdir().unwrap() }
    }

    /// A session of a client that declares `capabilities`.
    fn session_with(&self, capabilities: Value) -> Arc<Session> {
        let params = json!({"protocolVersion": SUPPORTED_VERSIONS[0], "capabilities": capabilities, "clientInfo": {"name": "test", "version": "0"}});
        let s = Session::new(
            uuid::Uuid::new_v4().simple().to_string(),
            SUPPORTED_VERSIONS[0].into(),
            &params,
            self.shared.clone(),
        );
        self.shared.lists.remember_client(&params);
        s
    }

    fn session(&self) -> Arc<Session> {
        let params = json!({"protocolVersion": SUPPORTED_VERSIONS[0], "capabilities": {}, "clientInfo": {"name": "test", "version": "0"}});
        Session::new(
            uuid::Uuid::new_v4().simple().to_string(),
            SUPPORTED_VERSIONS[0].into(),
            &params,
            self.shared.clone(),
        )
    }

    /// The next invocation record (records are queued before the call returns).
    fn record(&mut self) -> Record {
        self.records.try_recv().expect("an invocation record")
    }
}

async fn call(s: &Arc<Session>, name: &str, arguments: Value) -> Answer {
    let params = RawValue::from_string(json!({"name": name, "arguments": arguments}).to_string()).unwrap();
    s.route_call(ListKind::Tools, Some(&params)).await
}

fn result(answer: Answer) -> Value {
    match answer {
        Answer::Result(r) => serde_json::from_str(r.get()).unwrap(),
        Answer::Error(e) => panic!("an error: {} {}", e.code, e.message),
        _ => panic!("not a result"),
    }
}

fn error(answer: Answer) -> RpcError {
    match answer {
        Answer::Error(e) => e,
        Answer::Result(r) => panic!("a result: {}", r.get()),
        _ => panic!("not a gateway error"),
    }
}

fn names(listed: &[(Value, String, String)]) -> Vec<&str> {
    listed.iter().map(|(t, _, _)| t["name"].as_str().unwrap()).collect()
}

#[tokio::test]
async fn a_disabled_server_or_tool_is_refused_without_contacting_its_upstream() {
    let (off_up, off_url) = fake(&["echo"], 0).await;
    let (on_up, on_url) = fake(&["echo", "add"], 0).await;
    let mut off = server("off", &off_url);
    off.enabled = false;
    let mut h = Harness::new(snapshot(vec![off, server("on", &on_url)], &[("on", Kind::Tool, "echo", false)]));
    let s = h.session();

    let e = error(call(&s, "off__echo", json!({})).await);
    assert_eq!((e.code, e.message.as_str()), (TOOL_DISABLED, "Tool off__echo is disabled"));
    assert_eq!(
        e.data.unwrap(),
        json!({"code": "TOOL_DISABLED", "server": "off", "tool": "off__echo", "kind": "tool", "scope": "server"})
    );
    let r = h.record();
    assert_eq!(
        (r.method, r.target.as_str(), r.server.as_str(), r.outcome.as_str()),
        ("tools/call", "off__echo", "off", "disabled")
    );
    assert_eq!(r.session_id, s.id);

    // A disabled tool of an enabled server, in a session that never listed: refused by its
    // name alone (not rewritten, so `<server>__<original>`).
    let e = error(call(&s, "on__echo", json!({})).await);
    assert_eq!((e.code, e.data.unwrap()["scope"].clone()), (TOOL_DISABLED, json!("tool")));
    assert_eq!(h.record().outcome.as_str(), "disabled");
    assert_eq!((off_up.count("initialize"), on_up.count("initialize")), (0, 0), "no upstream was contacted");

    // The server's other tool goes through, and the refusal holds once the names are learnt.
    assert_eq!(
        result(call(&s, "on__add", json!({"a": 1})).await)["structuredContent"],
        json!({"name": "add", "arguments": {"a": 1}})
    );
    assert_eq!(h.record().outcome.as_str(), "ok");
    assert_eq!(error(call(&s, "on__echo", json!({})).await).code, TOOL_DISABLED);
    assert_eq!(on_up.count("tools/call"), 1);
    s.close().await;
}

#[tokio::test]
async fn unknown_names_and_servers_are_invalid_params() {
    let (_up, url) = fake(&["echo"], 0).await;
    let mut h = Harness::new(snapshot(vec![server("fs", &url)], &[]));
    let s = h.session();
    for (name, message) in [
        ("echo", "Unknown tool \"echo\": exposed names look like <server>__<name>"),
        ("ghost__echo", "Unknown server \"ghost\" in tool \"ghost__echo\""),
        ("fs__nope", "Unknown tool \"fs__nope\""),
    ] {
        let e = error(call(&s, name, json!({})).await);
        assert_eq!((e.code, e.message.as_str()), (INVALID_PARAMS, message), "{name}");
        assert_eq!(h.record().outcome.as_str(), "invalid");
    }
    let long = format!("fs__{}", "x".repeat(100));
    let e = error(call(&s, &long, json!({})).await);
    assert!(
        e.message.starts_with("Unknown tool \"fs__xxxx") && e.message.ends_with("at most 64 characters"),
        "{}",
        e.message
    );
    let no_name = RawValue::from_string("{\"arguments\":{}}".into()).unwrap();
    let e = error(s.route_call(ListKind::Tools, Some(&no_name)).await);
    assert_eq!((e.code, e.message.as_str()), (INVALID_PARAMS, "tools/call needs a string params.name"));
    for (arguments, kind) in
        [("[1]", "an array"), ("\"x\"", "a string"), ("7", "a number"), ("true", "a boolean"), ("null", "null")]
    {
        let p = RawValue::from_string(format!("{{\"name\":\"fs__read\",\"arguments\":{arguments}}}")).unwrap();
        let e = error(s.route_call(ListKind::Tools, Some(&p)).await);
        let want = format!("tools/call params.arguments must be an object, not {kind}");
        assert_eq!((e.code, e.message.as_str()), (INVALID_PARAMS, want.as_str()));
    }
    s.close().await;
}

#[tokio::test]
async fn a_rewritten_name_resolves_through_the_session_s_name_map() {
    let long = "a_tool_name_that_is_far_too_long_for_the_strictest_clients";
    let (up, url) = fake(&["read file.v2", long], 0).await;
    let mut h = Harness::new(snapshot(vec![server("fs", &url)], &[("fs", Kind::Tool, long, false)]));
    let s = h.session();
    // Called before any list: the session learns this server's names, then forwards the
    // original name.
    let out = result(call(&s, "fs__read_file_v2", json!({"path": "/x"})).await);
    assert_eq!(out["structuredContent"], json!({"name": "read file.v2", "arguments": {"path": "/x"}}));
    let r = h.record();
    assert_eq!((r.target.as_str(), r.server.as_str(), r.outcome.as_str()), ("fs__read_file_v2", "fs", "ok"));

    let tools = s.list(ListKind::Tools).await;
    assert_eq!(names(&tools), ["coffer__search_tools", "fs__read_file_v2"], "the disabled tool is not listed");
    let all = s.list_all(ListKind::Tools).await;
    let hashed = all.iter().find(|l| l.original == long).expect("listed with its flag");
    let exposed = hashed.item["name"].as_str().unwrap().to_owned();
    assert!(!hashed.enabled && exposed.len() <= 51 && exposed.starts_with("fs__"), "{exposed}");
    assert_eq!(
        s.resolve(ListKind::Tools, "fs__read_file_v2").await.unwrap(),
        ("fs".to_owned(), "read file.v2".to_owned())
    );
    // Policy names the original: the rewritten name of a disabled tool is refused.
    let e = error(call(&s, &exposed, json!({})).await);
    assert_eq!((e.code, e.data.unwrap()["tool"].clone()), (TOOL_DISABLED, json!(exposed)));
    assert_eq!(up.count("tools/call"), 1);
    s.close().await;
}

#[tokio::test]
async fn lists_follow_pages_are_cached_per_session_and_invalidated() {
    let (up, url) = fake(&["t1", "t2", "t3", "t4", "t5"], 2).await;
    let h = Harness::new(snapshot(vec![server("p", &url)], &[]));
    let s = h.session();
    let tools = s.list(ListKind::Tools).await;
    assert_eq!(names(&tools), ["coffer__search_tools", "p__t1", "p__t2", "p__t3", "p__t4", "p__t5"]);
    assert_eq!(up.count("tools/list"), 3, "three pages");
    // A burst of lists and calls within the TTL costs the upstream nothing more.
    let (a, b) = tokio::join!(s.list(ListKind::Tools), s.list(ListKind::Tools));
    assert_eq!((a.len(), b.len()), (6, 6));
    assert!(matches!(s.handle_request("tools/list", None).await, Answer::Result(_)));
    assert_eq!(up.count("tools/list"), 3, "served from the session's cache");

    s.invalidate(Some("other"));
    s.list(ListKind::Tools).await;
    assert_eq!(up.count("tools/list"), 3, "another server's invalidation keeps this list");
    s.invalidate(Some("p"));
    s.list(ListKind::Tools).await;
    assert_eq!(up.count("tools/list"), 6, "listed again after invalidation");
    s.invalidate(None);
    s.fetch_server(&server("p", &url), ListKind::Tools).await.unwrap();
    assert_eq!(up.count("tools/list"), 9);

    // Another session is answered from the gateway catalog at once: no upstream of its own
    // starts for a list. Its upstream starts on its first call, and then lists afresh.
    let other = h.session();
    assert_eq!(names(&other.list(ListKind::Tools).await).len(), 6);
    assert_eq!((up.count("tools/list"), up.count("initialize")), (9, 3), "warm, warm again, s's own");
    assert!(other.running_upstreams().is_empty());
    assert!(matches!(call(&other, "p__t1", json!({})).await, Answer::Result(_)));
    wait_until("the other session's own fresh list", || up.count("tools/list") == 12).await;
    assert_eq!(up.count("initialize"), 4);
    assert_eq!(s.running_upstreams(), ["p"]);
    s.close().await;
    other.close().await;
    assert!(s.running_upstreams().is_empty());
}

/// Waits (polling, 10 s at most) until `done` holds.
async fn wait_until(what: &str, done: impl Fn() -> bool) {
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(std::time::Instant::now() < until, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The next message the session queued for its client, within 10 s.
async fn next_note(notes: &mut tokio::sync::broadcast::Receiver<(u64, Arc<str>)>) -> String {
    tokio::time::timeout(Duration::from_secs(10), notes.recv()).await.expect("a notification").unwrap().1.to_string()
}

fn with_settings(mut snap: Snapshot, settings: &[(&str, &str)]) -> Snapshot {
    snap.settings = settings.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
    snap
}

#[tokio::test]
async fn a_policy_change_reaches_running_sessions() {
    let (_up, url) = fake(&["echo"], 0).await;
    let mut h = Harness::new(snapshot(vec![server("fs", &url)], &[]));
    let s = h.session();
    let (_, mut notes) = s.outbound.subscribe(None);
    assert!(matches!(call(&s, "fs__echo", json!({})).await, Answer::Result(_)));
    h.policy.send_replace(Arc::new(snapshot(vec![server("fs", &url)], &[("fs", Kind::Tool, "echo", false)])));
    let note = tokio::time::timeout(Duration::from_secs(10), notes.recv()).await.unwrap().unwrap();
    assert!(note.1.contains("notifications/tools/list_changed"), "{}", note.1);
    assert_eq!(error(call(&s, "fs__echo", json!({})).await).code, TOOL_DISABLED);
    assert!(names(&s.list(ListKind::Tools).await) == ["coffer__search_tools"]);
    let _ = (h.record(), h.record());
    s.close().await;
}

/// A built-in that answers with the caller's session id and how many tools it sees.
struct Whoami;

impl Provider for Whoami {
    fn name(&self) -> &'static str {
        "whoami"
    }
    fn definition(&self) -> Value {
        json!({"name": "whoami", "description": "Who is calling", "inputSchema": {"type": "object"}})
    }
    fn call<'a>(&'a self, caller: &'a dyn Caller, _: Option<&'a str>) -> BoxFuture<'a, crate::mcp::builtin::Reply> {
        Box::pin(async move {
            let tools = caller.list_tools().await.len();
            Ok(Answer::ok(
                json!({"content": [], "structuredContent": {"session": caller.session_id(), "tools": tools}}),
            ))
        })
    }
}

#[tokio::test]
async fn built_in_providers_are_listed_called_and_governed_by_policy() {
    let (up, url) = fake(&["echo"], 0).await;
    let mut h = Harness::with(
        snapshot(vec![server("fs", &url)], &[]),
        Registry::standard(None).with(Whoami),
        FixedCredentials::default(),
    );
    let s = h.session();
    // Callable before any list, and it sees the caller's tools.
    let out = result(call(&s, "coffer__whoami", json!({})).await);
    assert_eq!(out["structuredContent"], json!({"session": s.id, "tools": 3}));
    let r = h.record();
    assert_eq!((r.target.as_str(), r.server.as_str(), r.outcome.as_str()), ("coffer__whoami", BUILTIN_SERVER, "ok"));
    assert_eq!(names(&s.list(ListKind::Tools).await), ["coffer__search_tools", "coffer__whoami", "fs__echo"]);
    let found = result(call(&s, "coffer__search_tools", json!({"query": "echo"})).await);
    assert_eq!(found["structuredContent"]["matches"][0]["name"], "fs__echo");
    let _ = h.record();
    assert_eq!(error(call(&s, "coffer__nope", json!({})).await).code, INVALID_PARAMS);
    let _ = h.record();

    // A built-in is governed by preferences like any tool (its server is always enabled).
    h.policy
        .send_replace(Arc::new(snapshot(vec![server("fs", &url)], &[(BUILTIN_SERVER, Kind::Tool, "whoami", false)])));
    let e = error(call(&s, "coffer__whoami", json!({})).await);
    assert_eq!((e.code, e.data.unwrap()["scope"].clone()), (TOOL_DISABLED, json!("tool")));
    assert_eq!(h.record().outcome.as_str(), "disabled");
    assert_eq!(up.count("tools/call"), 0);
    s.close().await;
}

#[tokio::test]
async fn credentials_are_resolved_only_when_an_upstream_starts() {
    let (up, url) = fake(&["echo"], 0).await;
    let mut with_ref = server("keyed", &url);
    with_ref.headers = HashMap::from([("X-Api-Key".to_owned(), encode_ref("api"))]);
    let mut missing = server("missing", &url);
    missing.headers = HashMap::from([("X-Api-Key".to_owned(), encode_ref("absent"))]);
    let credentials = FixedCredentials::new(HashMap::from([("api".to_owned(), SecretString::from("sk-value"))]));
    let mut h = Harness::with(snapshot(vec![with_ref, missing], &[]), Registry::standard(None), credentials);
    let s = h.session();
    assert!(up.header("x-api-key").is_none());
    assert!(matches!(call(&s, "keyed__echo", json!({})).await, Answer::Result(_)));
    assert_eq!(up.header("x-api-key").as_deref(), Some("sk-value"), "the value, resolved into the header");
    let _ = h.record();

    let e = error(call(&s, "missing__echo", json!({})).await);
    assert_eq!((e.code, e.data.unwrap()), (UPSTREAM_UNAVAILABLE, json!({"server": "missing"})));
    assert!(e.message.contains("credential \"absent\" not found"), "{}", e.message);
    assert_eq!(h.record().outcome.as_str(), "unreachable");
    s.close().await;
}

#[tokio::test]
async fn batches_run_only_on_a_2025_03_26_session_and_answer_in_item_order() {
    use crate::mcp::downstream::message::{batch_answers, batch_refused};
    let h = Harness::new(snapshot(vec![], &[]));
    let current = h.session();
    assert!(batch_refused(None).unwrap().contains("send initialize alone first"));
    assert!(batch_refused(Some(&current)).unwrap().contains("not supported in protocol 2025-11-25"));
    let old = Session::new("old".into(), "2025-03-26".into(), &json!({}), h.shared.clone());
    assert_eq!(batch_refused(Some(&old)), None);
    let items = [
        r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        r#"{"jsonrpc":"1.0","id":2,"method":"ping"}"#,
        r#"{"jsonrpc":"2.0","id":"u","method":"no/such"}"#,
    ];
    let answers =
        batch_answers(&old, items.iter().map(|i| RawValue::from_string((*i).into()).unwrap()).collect()).await;
    let answers: Vec<Value> = answers.iter().map(|a| serde_json::from_str(a).unwrap()).collect();
    assert_eq!(answers[0], json!({"jsonrpc": "2.0", "id": 1, "result": {}}));
    assert_eq!((answers[1]["id"].clone(), answers[1]["error"]["code"].clone()), (json!(2), json!(-32600)));
    assert_eq!((answers[2]["id"].clone(), answers[2]["error"]["code"].clone()), (json!("u"), json!(-32601)));
    assert_eq!(answers.len(), 3, "the notification gets no answer");
    current.close().await;
    old.close().await;
}

/// The hot path's future is moved into a task per call on the `/mcp` stream: rare paths
/// (starting an upstream, lists, built-ins, resources) are boxed so it stays small. 928 bytes
/// before and after the core was split into pieces; a regression shows here first.
#[tokio::test]
async fn a_call_s_future_stays_small() {
    let h = Harness::new(snapshot(vec![], &[]));
    let s = h.session();
    let ctx = crate::mcp::session::RequestCtx::default();
    let call = s.handle_request_ctx("tools/call", None, &ctx);
    assert!(std::mem::size_of_val(&call) <= 1024, "{} bytes", std::mem::size_of_val(&call));
}

/// The status object of `server` from a gateway over `h`'s core.
fn upstream_status(h: &Harness, server: &str) -> Value {
    let gw = crate::mcp::Gateway::with_shared(h.shared.clone(), tokio_util::sync::CancellationToken::new());
    let all = serde_json::to_value(gw.upstream_status()).unwrap();
    all.as_array().unwrap().iter().find(|u| u["name"] == server).cloned().unwrap_or(Value::Null)
}

#[tokio::test]
async fn two_names_that_collide_after_rewriting_resolve_the_same_before_and_after_a_list() {
    for order in [["dotted.tool.name", "dotted_tool_name"], ["dotted_tool_name", "dotted.tool.name"]] {
        let (up, url) = fake(&order, 0).await;
        let h = Harness::new(snapshot(vec![server("names", &url)], &[]));
        let lister = h.session();
        let listed = lister.list(ListKind::Tools).await;
        let exposed = |original: &str| {
            listed
                .iter()
                .find(|(_, _, o)| o == original)
                .map(|(t, _, _)| t["name"].as_str().unwrap().to_owned())
                .unwrap()
        };
        // The tool whose name needs no rewriting keeps it, whatever the listing order.
        assert_eq!(exposed("dotted_tool_name"), "names__dotted_tool_name", "{order:?}");
        let rewritten = exposed("dotted.tool.name");
        assert!(rewritten.starts_with("names__dotted_tool_name_"), "{rewritten}");

        // The rewritten one disabled: a session that has not listed still reaches the clean one.
        h.policy.send_replace(Arc::new(snapshot(
            vec![server("names", &url)],
            &[("names", Kind::Tool, "dotted.tool.name", false)],
        )));
        let fresh = h.session();
        let out = result(call(&fresh, "names__dotted_tool_name", json!({})).await);
        assert_eq!(out["structuredContent"]["name"], "dotted_tool_name", "{order:?}");
        assert_eq!(error(call(&fresh, &rewritten, json!({})).await).code, TOOL_DISABLED);

        // The clean one disabled: refused by name alone in a fresh session, and the rewritten
        // one still works.
        h.policy.send_replace(Arc::new(snapshot(
            vec![server("names", &url)],
            &[("names", Kind::Tool, "dotted_tool_name", false)],
        )));
        let calls = up.count("tools/call");
        let other = h.session();
        assert_eq!(error(call(&other, "names__dotted_tool_name", json!({})).await).code, TOOL_DISABLED);
        assert_eq!(up.count("tools/call"), calls, "refused before the upstream");
        let out = result(call(&other, &rewritten, json!({})).await);
        assert_eq!(out["structuredContent"]["name"], "dotted.tool.name");
        for s in [lister, fresh, other] {
            s.close().await;
        }
    }
}

#[tokio::test]
async fn a_name_listed_twice_is_offered_once_with_its_first_definition_and_shown_in_status() {
    let tools = vec![
        json!({"name": "same", "description": "first", "inputSchema": {"type": "object", "properties": {"a": {"type": "string"}}}}),
        json!({"name": "other", "inputSchema": {"type": "object"}}),
        json!({"name": "same", "description": "second", "inputSchema": {"type": "object"}}),
    ];
    let (_up, url) = fake_listing(tools, 0).await;
    let h = Harness::new(snapshot(vec![server("dup", &url)], &[]));
    let s = h.session();
    let listed = s.list(ListKind::Tools).await;
    assert_eq!(names(&listed), ["coffer__search_tools", "dup__same", "dup__other"]);
    let same = listed.iter().find(|(t, _, _)| t["name"] == "dup__same").unwrap();
    assert_eq!(same.0["description"], "first");
    assert_eq!(upstream_status(&h, "dup")["duplicates"], json!(["tools/same"]));
    s.close().await;
}

#[tokio::test]
async fn health_says_why_a_start_failed_and_a_normal_stop_or_a_success_leaves_no_error() {
    let home = tempfile::tempdir().unwrap();
    let ws = home.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let stdio = |name: &str, script: &str| McpServer {
        name: name.into(),
        transport: coffer_proto::store::Transport::Stdio as i32,
        command: "/bin/sh".into(),
        args: vec!["-c".into(), script.into()],
        cwd: ws.display().to_string(),
        enabled: true,
        version: 1,
        ..Default::default()
    };
    let keyed = stdio("keyed", "echo 'starting up' >&2; echo 'fatal: missing API key FOO_KEY' >&2; exit 3");
    let noisy = stdio("noisy", "echo 'hello, I am not JSON-RPC'; exec sleep 30");
    let mut deleted = stdio("deleted", "exit 0");
    deleted.command = home.path().join("gone").display().to_string();
    let closed_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let refused = server("refused", &format!("http://127.0.0.1:{closed_port}/mcp"));
    let (_up, url) = fake(&["echo"], 0).await;
    let servers = vec![keyed, noisy, deleted, refused, server("fine", &url)];
    let mut snap = snapshot(servers, &[]);
    // The noisy one never answers initialize: give up on it soon.
    snap.settings.insert("gateway.start_timeout_ms".into(), "1000".into());
    let mut h = Harness::new(snap);
    let s = h.session();

    // A stdio server that exits at once: its exit status and last stderr lines.
    let e = error(call(&s, "keyed__anything", json!({})).await);
    assert_eq!(e.code, UPSTREAM_UNAVAILABLE);
    assert!(e.message.contains("exited with status 3"), "{}", e.message);
    assert!(e.message.contains("fatal: missing API key FOO_KEY"), "{}", e.message);
    assert!(!e.message.contains("stdout closed") && !e.message.contains("Broken pipe"), "{}", e.message);
    let st = upstream_status(&h, "keyed");
    assert_eq!((st["state"].as_str(), st["last_start"].as_str()), (Some("unhealthy"), Some("failed")), "{st}");
    assert!(st["last_error"].as_str().unwrap().contains("fatal: missing API key FOO_KEY"), "{st}");

    // An HTTP server that refuses connections is unreachable; it never "exited".
    let e = error(call(&s, "refused__anything", json!({})).await);
    assert!(e.message.contains("unreachable") && !e.message.contains("exited"), "{}", e.message);

    // A deleted command is not ok, even before anything tried to start it.
    let st = upstream_status(&h, "deleted");
    assert_eq!(st["state"], "unhealthy", "{st}");
    assert!(st["last_error"].as_str().unwrap().contains("does not exist"), "{st}");

    // Non-protocol lines on stdout are named when the start fails for them.
    let e = error(call(&s, "noisy__anything", json!({})).await);
    assert!(e.message.contains("not JSON-RPC") && e.message.contains("hello, I am not JSON-RPC"), "{}", e.message);

    // A fine server: a standing error is cleared by a successful call, and a normal stop is none.
    assert!(matches!(call(&s, "fine__echo", json!({})).await, Answer::Result(_)));
    assert_eq!(upstream_status(&h, "fine")["state"], "ok");
    h.shared.health.failed("fine", "a list took too long");
    assert_eq!(upstream_status(&h, "fine")["state"], "unhealthy");
    assert!(matches!(call(&s, "fine__echo", json!({})).await, Answer::Result(_)));
    let st = upstream_status(&h, "fine");
    assert_eq!((st["state"].as_str(), &st["last_error"]), (Some("ok"), &Value::Null), "{st}");
    s.close().await;
    let st = upstream_status(&h, "fine");
    assert_eq!((st["state"].as_str(), &st["last_error"]), (Some("ok"), &Value::Null), "{st}");
    while h.records.try_recv().is_ok() {}
}

mod boundaries;
mod broker;
mod catalog;
mod lazy;
mod profiles;
mod retrieval_tools;

mod upstream_era;
