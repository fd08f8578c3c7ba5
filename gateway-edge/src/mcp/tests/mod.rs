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
async fn a_new_session_s_list_comes_from_the_gateway_catalog_under_policy_and_its_fresh_list_follows() {
    let (up, url) = fake(&["echo", "hidden"], 0).await;
    let mut h = Harness::new(snapshot(vec![server("fs", &url)], &[("fs", Kind::Tool, "hidden", false)]));
    let first = h.session();
    assert_eq!(names(&first.list(ListKind::Tools).await), ["coffer__search_tools", "fs__echo"]);
    first.close().await;
    let inits = up.count("initialize");

    // The server's tools change; a new session is shown what the catalog knows, under policy,
    // without any upstream contact.
    up.tools.lock().unwrap().push(json!({"name": "added", "inputSchema": {"type": "object"}}));
    let s = h.session();
    let (_, mut notes) = s.outbound.subscribe(None);
    let all = s.list_all(ListKind::Tools).await;
    assert_eq!(
        all.iter().map(|l| (l.item["name"].as_str().unwrap(), l.enabled)).collect::<Vec<_>>(),
        [("coffer__search_tools", true), ("fs__echo", true), ("fs__hidden", false)]
    );
    assert_eq!(up.count("initialize"), inits, "nothing started for a list");
    assert_eq!(error(call(&s, "fs__hidden", json!({})).await).code, TOOL_DISABLED);
    let _ = h.record();

    // Its first call starts its own upstream, whose fresh list differs: list_changed.
    assert!(matches!(call(&s, "fs__echo", json!({})).await, Answer::Result(_)));
    let _ = h.record();
    assert!(next_note(&mut notes).await.contains("notifications/tools/list_changed"));
    assert_eq!(names(&s.list(ListKind::Tools).await), ["coffer__search_tools", "fs__echo", "fs__added"]);
    // Later sessions see the new list from the catalog.
    let later = h.session();
    assert_eq!(names(&later.list(ListKind::Tools).await), ["coffer__search_tools", "fs__echo", "fs__added"]);
    s.close().await;
    later.close().await;
}

#[tokio::test]
async fn a_server_not_listed_yet_costs_a_list_at_most_the_first_list_deadline_and_arrives_as_list_changed() {
    let (fast, fast_url) = fake(&["echo"], 0).await;
    let (slow, slow_url) = fake(&["late"], 0).await;
    slow.init_delay_ms.store(2_000, std::sync::atomic::Ordering::Relaxed);
    let snap = snapshot(vec![server("fast", &fast_url), server("slow", &slow_url)], &[]);
    let h = Harness::new(with_settings(snap, &[("gateway.first_list_timeout_ms", "600")]));
    let s = h.session();
    let (_, mut notes) = s.outbound.subscribe(None);
    let t = std::time::Instant::now();
    assert_eq!(names(&s.list(ListKind::Tools).await), ["coffer__search_tools", "fast__echo"]);
    let took = t.elapsed();
    assert!(took >= Duration::from_millis(600) && took < Duration::from_millis(1_500), "{took:?}");
    assert!(next_note(&mut notes).await.contains("notifications/tools/list_changed"));
    assert_eq!(names(&s.list(ListKind::Tools).await), ["coffer__search_tools", "fast__echo", "slow__late"]);
    assert_eq!((fast.count("initialize"), slow.count("initialize")), (1, 1), "each started once, in the background");
    assert!(s.running_upstreams().is_empty());
    s.close().await;
}

#[tokio::test]
async fn a_hung_server_costs_lists_nothing_after_its_first_failure() {
    let (_ok, ok_url) = fake(&["echo"], 0).await;
    let (hung, hung_url) = fake(&["never"], 0).await;
    hung.init_delay_ms.store(u64::MAX, std::sync::atomic::Ordering::Relaxed);
    let snap = snapshot(vec![server("hung", &hung_url), server("ok", &ok_url)], &[]);
    let h = Harness::new(with_settings(snap, &[("gateway.list_timeout_ms", "300")]));
    let s = h.session();
    // The first list waits for it until its start is given up (300 ms), not the whole
    // first-list deadline (1 s).
    let t = std::time::Instant::now();
    assert_eq!(names(&s.list(ListKind::Tools).await), ["coffer__search_tools", "ok__echo"]);
    assert!(t.elapsed() < Duration::from_millis(900), "{:?}", t.elapsed());
    let generation = h.shared.snapshot.current().generation(&server("hung", &hung_url));
    wait_until("the hung server's failure", || h.shared.lists.status("hung", generation)["state"] == "failed").await;
    let status = h.shared.lists.status("hung", generation);
    assert!(status["error"].as_str().unwrap().contains("300 ms"), "{status}");
    // Every later list, in this session or a new one, answers at once without it.
    for session in [s.clone(), h.session(), h.session()] {
        let t = std::time::Instant::now();
        assert_eq!(names(&session.list(ListKind::Tools).await), ["coffer__search_tools", "ok__echo"]);
        assert!(t.elapsed() < Duration::from_millis(250), "{:?}", t.elapsed());
    }
    assert_eq!(hung.count("initialize"), 1, "not retried during its backoff");
    s.close().await;
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
    fn call<'a>(&'a self, caller: &'a dyn Caller, _: Option<&'a str>) -> BoxFuture<'a, Answer> {
        Box::pin(async move {
            let tools = caller.list_tools().await.len();
            Answer::ok(json!({"content": [], "structuredContent": {"session": caller.session_id(), "tools": tools}}))
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
    let credentials = FixedCredentials(HashMap::from([("api".to_owned(), SecretString::from("sk-value"))]));
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
    let all = gw.upstream_status();
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

mod broker {
    //! The tool broker on the same seams: sessions per (caller, key) recording their actor,
    //! policy as for any client, idle reaping and closing, malformed input, locating a tool.
    use std::borrow::Cow;

    use coffer_runtime::identity::Identity;

    use super::*;
    use crate::mcp::broker::{self, Broker, BrokerError, Failure, Located, MAX_SESSIONS_PER_CALLER};

    async fn call(s: &Arc<Session>, name: &str, arguments: Value) -> Answer {
        let arguments = serde_json::value::to_raw_value(&arguments).unwrap();
        broker::call(s, ListKind::Tools, name, Some(&arguments)).await
    }

    #[tokio::test]
    async fn a_broker_session_records_its_actor_and_obeys_policy_like_any_client() {
        let (up, url) = fake(&["echo", "add"], 0).await;
        let mut h = Harness::new(snapshot(vec![server("fs", &url)], &[("fs", Kind::Tool, "add", false)]));
        let b = Broker::new(h.shared.clone());
        let s = b.lease(Identity::Chat, "conversation-1", "agent").unwrap();
        assert_eq!(s.actor, "agent");
        assert!(s.id.starts_with("broker-"), "{}", s.id);
        let listed: Vec<String> = broker::list_enabled(&s, ListKind::Tools)
            .await
            .into_iter()
            .map(|l| l.item["name"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(listed, ["coffer__search_tools", "fs__echo"], "the disabled tool is not listed");

        let out = result(call(&s, "fs__echo", json!({"message": "hi"})).await);
        assert_eq!(out["structuredContent"], json!({"name": "echo", "arguments": {"message": "hi"}}));
        let r = h.record();
        assert_eq!((r.target.as_str(), r.outcome.as_str(), r.actor.as_ref()), ("fs__echo", "ok", "agent"));
        assert_eq!(r.session_id, s.id);

        let e = error(call(&s, "fs__add", json!({})).await);
        assert_eq!((e.code, Failure::of(&e)), (TOOL_DISABLED, Failure::Disabled));
        let r = h.record();
        assert_eq!((r.outcome.as_str(), r.actor.as_ref()), ("disabled", "agent"));
        let e = error(call(&s, "fs__nope", json!({})).await);
        assert_eq!(Failure::of(&e), Failure::NotFound, "{}", e.message);
        let e = error(call(&s, "ghost__echo", json!({})).await);
        assert_eq!(Failure::of(&e), Failure::NotFound, "{}", e.message);
        let _ = (h.record(), h.record());
        assert_eq!(up.count("tools/call"), 1);

        // The key is the caller's: the same key with another actor is refused; another service's
        // same key is another session, with its own upstream.
        let e = b.lease(Identity::Chat, "conversation-1", "channel:telegram").err().unwrap();
        assert_eq!(
            e,
            BrokerError::ActorMismatch {
                key: "conversation-1".into(),
                open: "agent".into(),
                asked: "channel:telegram".into()
            }
        );
        let other = b.lease(Identity::Gateway, "conversation-1", "api").unwrap();
        assert_ne!(other.id, s.id);
        let started = up.count("initialize");
        assert!(matches!(call(&other, "fs__echo", json!({})).await, Answer::Result(_)));
        assert_eq!(h.record().actor.as_ref(), "api");
        assert_eq!(up.count("initialize"), started + 1, "two sessions never share an upstream");
        assert_eq!(b.count(), 2);

        // An MCP client session's actor is borrowed: recording it allocates nothing.
        let mcp = h.session();
        assert!(matches!(super::call(&mcp, "fs__echo", json!({})).await, Answer::Result(_)));
        let r = h.record();
        assert!(matches!(r.actor, Cow::Borrowed("mcp")), "{:?}", r.actor);
        mcp.close().await;
        drop((s, other));
        b.close_all().await;
        assert_eq!(b.count(), 0);
    }

    #[tokio::test]
    async fn broker_sessions_end_when_idle_or_closed_and_their_upstreams_with_them() {
        let (_up, url) = fake(&["echo"], 0).await;
        let h = Harness::new(snapshot(vec![server("fs", &url)], &[]));
        let b = Broker::new(h.shared.clone());
        let lease = b.lease(Identity::Chat, "c1", "agent").unwrap();
        assert!(lease.running_upstreams().is_empty(), "upstreams start lazily");
        assert!(matches!(call(&lease, "fs__echo", json!({})).await, Answer::Result(_)));
        assert_eq!(lease.running_upstreams(), ["fs"]);
        let session = Arc::clone(&lease);
        assert_eq!(b.reap_idle(Duration::ZERO).await, 0, "a session with a request in flight is kept");
        drop(lease);
        assert_eq!(b.reap_idle(Duration::from_secs(3600)).await, 0, "not idle for that long");
        assert_eq!(b.reap_idle(Duration::ZERO).await, 1);
        assert!(session.running_upstreams().is_empty() && session.closed.is_cancelled());
        assert_eq!(b.count(), 0);

        // Reopened under the same key: a new session. Closed by the caller: gone, upstreams too.
        let again = b.lease(Identity::Chat, "c1", "agent").unwrap();
        assert_ne!(again.id, session.id);
        assert!(matches!(call(&again, "fs__echo", json!({})).await, Answer::Result(_)));
        let session = Arc::clone(&again);
        drop(again);
        assert!(!b.close(Identity::Gateway, "c1").await, "another caller's key is not this one");
        assert!(b.close(Identity::Chat, "c1").await);
        assert!(!b.close(Identity::Chat, "c1").await, "closing twice is no error");
        assert!(session.running_upstreams().is_empty());
        assert_eq!(b.count(), 0);
    }

    #[tokio::test]
    async fn malformed_broker_input_is_refused_clearly() {
        for bad in ["", "a b", "tab\t", "é", &"x".repeat(65)] {
            assert!(matches!(broker::check_actor(bad), Err(BrokerError::InvalidActor(_))), "{bad:?}");
        }
        for good in ["agent", "channel:telegram", &"x".repeat(64)] {
            assert_eq!(broker::check_service_actor(good), Ok(()), "{good:?}");
        }
        for reserved in ["mcp", "api", "cli", "ui", "daemon"] {
            assert_eq!(broker::check_actor(reserved), Ok(()));
            let e = broker::check_service_actor(reserved).unwrap_err();
            assert_eq!(e, BrokerError::ReservedActor(reserved.into()));
        }
        let e = broker::check_actor("").unwrap_err().to_string();
        assert_eq!(
            e,
            "actor must be 1-64 printable ASCII characters without spaces (agent, channel:<name>, …): it is empty"
        );
        assert!(broker::check_key(&"k".repeat(128)).is_ok());
        for bad in ["", "two words", &"k".repeat(129)] {
            assert!(matches!(broker::check_key(bad), Err(BrokerError::InvalidKey(_))), "{bad:?}");
        }
        assert_eq!(broker::parse_arguments("").unwrap().map(|r| r.get().to_owned()), None);
        assert_eq!(broker::parse_arguments(" {\"a\": 1} ").unwrap().unwrap().get(), "{\"a\": 1}");
        for bad in ["nope", "[1]", "\"text\"", "{\"a\":", "{} {}"] {
            assert!(matches!(broker::parse_arguments(bad), Err(BrokerError::InvalidArguments(_))), "{bad:?}");
        }

        let h = Harness::new(snapshot(vec![], &[]));
        let b = Broker::new(h.shared.clone());
        assert!(matches!(b.lease(Identity::Chat, "", "agent"), Err(BrokerError::InvalidKey(_))));
        assert!(matches!(b.lease(Identity::Chat, "k", "a\u{7f}"), Err(BrokerError::InvalidActor(_))));
        assert_eq!(b.count(), 0, "nothing opened for a refused request");
        for i in 0..MAX_SESSIONS_PER_CALLER {
            drop(b.lease(Identity::Chat, &format!("k{i}"), "agent").unwrap());
        }
        let e = b.lease(Identity::Chat, "one-more", "agent").err().unwrap();
        assert_eq!(e, BrokerError::TooManySessions { caller: Identity::Chat });
        assert!(b.lease(Identity::Chat, "k0", "agent").is_ok(), "an open key still works");
        assert!(b.lease(Identity::Gateway, "one-more", "api").is_ok(), "the limit is per caller");
        b.close_all().await;
    }

    #[tokio::test]
    async fn a_tool_is_located_for_toggling_by_listing_only_its_server() {
        let (a_up, a_url) = fake(&["echo", "read file"], 0).await;
        let (b_up, b_url) = fake(&["echo"], 0).await;
        let mut off = server("off", &b_url);
        off.enabled = false;
        let h = Harness::new(snapshot(
            vec![server("a", &a_url), server("b", &b_url), off],
            &[("a", Kind::Tool, "echo", false)],
        ));
        let b = Broker::new(h.shared.clone());
        let s = b.lease(Identity::Gateway, "api", "api").unwrap();
        // A disabled tool is found (it must be re-enableable), and so is a rewritten name.
        for (exposed, original) in [("a__echo", "echo"), ("a__read_file", "read file")] {
            match broker::locate_tool(&s, exposed).await {
                Located::Tool { server, original: o } => assert_eq!((server.as_str(), o.as_str()), ("a", original)),
                other => panic!("{exposed}: {other:?}"),
            }
        }
        assert_eq!(a_up.count("tools/list"), 1, "listed once, then from the name map");
        assert_eq!(b_up.count("initialize"), 0, "no other upstream was started");
        assert!(
            matches!(broker::locate_tool(&s, "off__echo").await, Located::ServerDisabled { server } if server == "off")
        );
        let coffer = broker::locate_tool(&s, "coffer__search_tools").await;
        assert!(matches!(coffer, Located::Tool { ref server, .. } if server == BUILTIN_SERVER), "{coffer:?}");
        for (exposed, message) in [
            ("a__nope", "Unknown tool \"a__nope\""),
            ("ghost__echo", "Unknown server \"ghost\" in tool \"ghost__echo\""),
            ("echo", "Unknown tool \"echo\": exposed names look like <server>__<name>"),
        ] {
            match broker::locate_tool(&s, exposed).await {
                Located::Unknown(e) => assert_eq!(e.message, message),
                other => panic!("{exposed}: {other:?}"),
            }
        }
        assert_eq!(b_up.count("initialize"), 0);
        drop(s);
        b.close_all().await;
    }
}

/// A server that never answers `initialize` is reported as such by the catalog's background
/// start, not as a list that took too long (newcomer finding).
#[tokio::test]
async fn a_server_that_never_answers_initialize_is_reported_as_not_started() {
    let home = tempfile::tempdir().unwrap();
    let hung = McpServer {
        name: "hung".into(),
        transport: coffer_proto::store::Transport::Stdio as i32,
        command: "/bin/sh".into(),
        args: vec!["-c".into(), "exec sleep 30".into()],
        cwd: home.path().display().to_string(),
        enabled: true,
        version: 1,
        ..Default::default()
    };
    let snap = with_settings(snapshot(vec![hung.clone()], &[]), &[("gateway.list_timeout_ms", "300")]);
    let h = Harness::new(snap);
    let client =
        json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}});
    crate::mcp::gateway_catalog::warm(h.shared.clone(), hung, client).await;
    let st = upstream_status(&h, "hung");
    let error = st["last_error"].as_str().unwrap_or_default();
    assert!(error.contains("did not start and answer initialize within 300 ms"), "{st}");
    assert!(!error.contains("tools/list"), "{st}");
}

/// A fake `coffer-retrieval` on loopback (real gRPC): canned answers, and every `Remember` and
/// `Search` request it received.
#[derive(Default)]
struct FakeRetrieval {
    remembered: Mutex<Vec<coffer_proto::retrieval::RememberRequest>>,
    searched: Mutex<Vec<coffer_proto::retrieval::SearchRequest>>,
}

type Rpc<T> = Result<tonic::Response<T>, tonic::Status>;

#[tonic::async_trait]
impl coffer_proto::retrieval::retrieval_server::Retrieval for FakeRetrieval {
    async fn add_knowledge_base(
        &self,
        _: tonic::Request<coffer_proto::retrieval::AddKnowledgeBaseRequest>,
    ) -> Rpc<coffer_proto::retrieval::KnowledgeBaseInfo> {
        Err(tonic::Status::unimplemented("fake"))
    }
    async fn list_knowledge_bases(
        &self,
        _: tonic::Request<coffer_proto::retrieval::ListKnowledgeBasesRequest>,
    ) -> Rpc<coffer_proto::retrieval::ListKnowledgeBasesReply> {
        Err(tonic::Status::unimplemented("fake"))
    }
    async fn get_knowledge_base(
        &self,
        _: tonic::Request<coffer_proto::retrieval::KnowledgeBaseName>,
    ) -> Rpc<coffer_proto::retrieval::KnowledgeBaseInfo> {
        Err(tonic::Status::unimplemented("fake"))
    }
    async fn remove_knowledge_base(
        &self,
        _: tonic::Request<coffer_proto::retrieval::KnowledgeBaseName>,
    ) -> Rpc<coffer_proto::retrieval::RemoveReply> {
        Err(tonic::Status::unimplemented("fake"))
    }
    async fn reindex(
        &self,
        _: tonic::Request<coffer_proto::retrieval::ReindexRequest>,
    ) -> Rpc<coffer_proto::retrieval::ReindexReply> {
        Err(tonic::Status::unimplemented("fake"))
    }
    async fn status(
        &self,
        _: tonic::Request<coffer_proto::retrieval::StatusRequest>,
    ) -> Rpc<coffer_proto::retrieval::StatusReply> {
        Err(tonic::Status::unimplemented("fake"))
    }
    async fn embed(
        &self,
        _: tonic::Request<coffer_proto::retrieval::EmbedRequest>,
    ) -> Rpc<coffer_proto::retrieval::EmbedReply> {
        Err(tonic::Status::failed_precondition("no embeddings endpoint: retrieval.embeddings.url is not set"))
    }
    async fn search(
        &self,
        r: tonic::Request<coffer_proto::retrieval::SearchRequest>,
    ) -> Rpc<coffer_proto::retrieval::SearchReply> {
        use coffer_proto::retrieval::{EngineReport, EngineState, SearchReply, SearchResult};
        let r = r.into_inner();
        if r.query.trim().is_empty() {
            return Err(tonic::Status::invalid_argument("query is empty: give 1-8192 bytes of text"));
        }
        self.searched.lock().unwrap().push(r);
        let results = (1..=40)
            .map(|i| SearchResult {
                kb: "notes".into(),
                path: format!("n{i}.md"),
                heading_path: vec!["Top".into()],
                line_start: i,
                line_end: i + 1,
                snippet: format!("**word** {}", "y".repeat(3000)),
                ..Default::default()
            })
            .collect();
        let engines = vec![
            EngineReport { engine: "keyword".into(), state: EngineState::Ok as i32, hits: 40, ..Default::default() },
            EngineReport {
                engine: "vector".into(),
                state: EngineState::Failed as i32,
                message: "embeddings endpoint refused the connection".into(),
                ..Default::default()
            },
        ];
        Ok(tonic::Response::new(SearchReply {
            results,
            engines,
            warnings: vec![],
            took_ms: 1,
            fusion: "rrf k=60".into(),
        }))
    }
    async fn remember(
        &self,
        r: tonic::Request<coffer_proto::retrieval::RememberRequest>,
    ) -> Rpc<coffer_proto::retrieval::RememberReply> {
        let r = r.into_inner();
        let n = {
            let mut seen = self.remembered.lock().unwrap();
            seen.push(r.clone());
            seen.len()
        };
        let fact = coffer_proto::retrieval::Fact {
            id: format!("01FACT{n}"),
            text: r.text,
            tags: r.tags,
            source: r.source,
            created_ms: 1,
            path: format!("/home/memory/01FACT{n}.md"),
            warning: String::new(),
        };
        Ok(tonic::Response::new(coffer_proto::retrieval::RememberReply {
            fact: Some(fact),
            created: n == 1,
            similarity: 1.0,
        }))
    }
    async fn recall(
        &self,
        _: tonic::Request<coffer_proto::retrieval::RecallRequest>,
    ) -> Rpc<coffer_proto::retrieval::SearchReply> {
        Err(tonic::Status::unimplemented("fake"))
    }
    async fn list_facts(
        &self,
        _: tonic::Request<coffer_proto::retrieval::ListFactsRequest>,
    ) -> Rpc<coffer_proto::retrieval::ListFactsReply> {
        Err(tonic::Status::unimplemented("fake"))
    }
    async fn get_fact(&self, _: tonic::Request<coffer_proto::retrieval::FactId>) -> Rpc<coffer_proto::retrieval::Fact> {
        Err(tonic::Status::unimplemented("fake"))
    }
    async fn forget(
        &self,
        r: tonic::Request<coffer_proto::retrieval::FactId>,
    ) -> Rpc<coffer_proto::retrieval::RemoveReply> {
        Err(tonic::Status::not_found(format!("no fact {:?}", r.into_inner().id)))
    }
    async fn list_skills(
        &self,
        _: tonic::Request<coffer_proto::retrieval::ListSkillsRequest>,
    ) -> Rpc<coffer_proto::retrieval::ListSkillsReply> {
        Err(tonic::Status::unimplemented("fake"))
    }
    async fn load_skill(
        &self,
        _: tonic::Request<coffer_proto::retrieval::SkillName>,
    ) -> Rpc<coffer_proto::retrieval::Skill> {
        Err(tonic::Status::unimplemented("fake"))
    }
}

/// Serves `fake` on a loopback port; returns a client of it.
async fn serve_retrieval(fake: Arc<FakeRetrieval>) -> crate::retrieval::Client {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(coffer_proto::retrieval::retrieval_server::RetrievalServer::from_arc(fake))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    crate::retrieval::client(&addr.to_string(), &SecretString::from("00".to_owned())).unwrap()
}

#[tokio::test]
async fn retrieval_tools_set_the_source_bound_results_and_obey_policy_and_the_log() {
    let fake = Arc::new(FakeRetrieval::default());
    let client = serve_retrieval(fake.clone()).await;
    let mut h = Harness::with(snapshot(vec![], &[]), Registry::standard(Some(client)), FixedCredentials::default());
    let s = h.session();
    let listed = s.list(ListKind::Tools).await;
    let listed = names(&listed);
    for tool in ["search_knowledge", "recall", "remember", "forget", "list_skills", "load_skill"] {
        assert!(listed.contains(&format!("coffer__{tool}").as_str()), "{listed:?}");
    }

    // remember: the source is the session's client (clientInfo.name "test"); a duplicate says so.
    let out =
        result(call(&s, "coffer__remember", json!({"text": "The user deploys on Fridays", "tags": ["deploy"]})).await);
    assert_eq!(out["content"][0]["text"], "Remembered as fact 01FACT1.");
    assert_eq!(out["structuredContent"]["fact"]["id"], "01FACT1");
    assert_eq!(out["structuredContent"]["created"], true);
    let dup = result(call(&s, "coffer__remember", json!({"text": "The user deploys on Fridays"})).await);
    let text = dup["content"][0]["text"].as_str().unwrap();
    assert!(text.starts_with("Not saved again: fact 01FACT2 already says this (similarity 1.00)"), "{text}");
    {
        let seen = fake.remembered.lock().unwrap();
        assert_eq!(seen[0].source, "mcp:test");
        assert_eq!((seen[0].tags.clone(), seen[1].tags.len()), (vec!["deploy".to_owned()], 0));
    }
    let r = h.record();
    assert_eq!((r.target.as_str(), r.server.as_str(), r.outcome.as_str()), ("coffer__remember", BUILTIN_SERVER, "ok"));
    let _ = h.record();

    // search: bounded to 8 results of at most 240-character snippets; the failed engine is named.
    let out = result(call(&s, "coffer__search_knowledge", json!({"query": "word", "kb": "notes"})).await);
    assert_eq!(out["structuredContent"]["results"].as_array().unwrap().len(), 8);
    assert!(out["structuredContent"]["results"][0]["snippet"].as_str().unwrap().chars().count() <= 242);
    let text = out["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("notes:n1.md:1-2  > Top\n**word** yyy"), "{text}");
    assert!(text.contains("warning: the vector engine failed: embeddings endpoint refused the connection"), "{text}");
    let asked = fake.searched.lock().unwrap()[0].clone();
    assert_eq!((asked.limit, asked.snippet_chars, asked.filters.unwrap().kb), (8, 240, vec!["notes".to_owned()]));
    let big = result(
        call(&s, "coffer__search_knowledge", json!({"query": "word", "limit": 100, "snippet_chars": 9999})).await,
    );
    assert_eq!(big["structuredContent"]["results"].as_array().unwrap().len(), 20);
    assert_eq!(fake.searched.lock().unwrap()[1].snippet_chars, 1000);
    let _ = (h.record(), h.record());

    // The service's refusals are tool errors with its message; the log records them.
    let bad = result(call(&s, "coffer__search_knowledge", json!({"query": "  "})).await);
    assert_eq!(bad["isError"], true);
    assert_eq!(bad["content"][0]["text"], "query is empty: give 1-8192 bytes of text");
    let _ = h.record();
    let gone = result(call(&s, "coffer__forget", json!({"id": "01NOPE"})).await);
    assert_eq!((&gone["isError"], &gone["content"][0]["text"]), (&json!(true), &json!("no fact \"01NOPE\"")));
    let _ = h.record();

    // Disabled like any tool: refused before the service is asked, and recorded as disabled.
    h.policy.send_replace(Arc::new(snapshot(vec![], &[(BUILTIN_SERVER, Kind::Tool, "remember", false)])));
    let e = error(call(&s, "coffer__remember", json!({"text": "refused"})).await);
    assert_eq!((e.code, e.message.as_str()), (TOOL_DISABLED, "Tool coffer__remember is disabled"));
    assert_eq!(h.record().outcome.as_str(), "disabled");
    assert_eq!(fake.remembered.lock().unwrap().len(), 2, "the service never saw the refused call");
    assert!(!names(&s.list(ListKind::Tools).await).contains(&"coffer__remember"));
    s.close().await;
}

mod upstream_era;

/// The tool names of `s`'s lists once the catalog's cache file names `tool` (written by the
/// persist task after a list).
async fn wait_cached(home: &std::path::Path, tool: &str) {
    let path = home.join(crate::mcp::gateway_catalog::CACHE_FILE);
    wait_until("the catalog's cache file", || std::fs::read_to_string(&path).is_ok_and(|t| t.contains(tool))).await;
}

#[tokio::test]
async fn after_a_restart_the_first_list_comes_from_the_cache_file_and_a_changed_list_follows() {
    use std::os::unix::fs::PermissionsExt as _;
    let (up, url) = fake(&["echo", "add"], 0).await;
    let home = tempfile::tempdir().unwrap();
    // The long first-list deadline would show here if the list waited for the upstream.
    let snap = || with_settings(snapshot(vec![server("s", &url)], &[]), &[("gateway.first_list_timeout_ms", "5000")]);
    let stop = tokio_util::sync::CancellationToken::new();
    {
        let h = Harness::running_at(home.path(), snap(), &stop);
        let s = h.session_with(json!({}));
        assert_eq!(names(&s.list(ListKind::Tools).await), ["coffer__search_tools", "s__echo", "s__add"]);
        wait_cached(home.path(), "\"add\"").await;
        s.close().await;
    }
    stop.cancel();
    let path = home.path().join(crate::mcp::gateway_catalog::CACHE_FILE);
    assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
    assert_eq!(std::fs::metadata(path.parent().unwrap()).unwrap().permissions().mode() & 0o777, 0o700);

    // The restarted gateway: the upstream now takes 1.5 s to start and lists one more tool.
    let lists_before = up.count("tools/list");
    up.init_delay_ms.store(1_500, std::sync::atomic::Ordering::Relaxed);
    up.tools.lock().unwrap().push(json!({"name": "added", "inputSchema": {"type": "object"}}));
    let stop = tokio_util::sync::CancellationToken::new();
    let h = Harness::running_at(home.path(), snap(), &stop);
    let s = h.session_with(json!({}));
    let (_, mut notes) = s.outbound.subscribe(None);
    assert_eq!(
        names(&s.list(ListKind::Tools).await),
        ["coffer__search_tools", "s__echo", "s__add"],
        "answered from the cache file"
    );
    assert_eq!(up.count("tools/list"), lists_before, "without waiting for the upstream");
    // The background refresh lists the server afresh; the difference reaches the client.
    assert!(next_note(&mut notes).await.contains("notifications/tools/list_changed"));
    assert_eq!(names(&s.list(ListKind::Tools).await), ["coffer__search_tools", "s__echo", "s__add", "s__added"]);
    wait_cached(home.path(), "\"added\"").await;
    s.close().await;
    stop.cancel();
}

#[tokio::test]
async fn an_unchanged_list_refreshed_after_a_restart_sends_no_list_changed() {
    let (up, url) = fake(&["echo"], 0).await;
    let home = tempfile::tempdir().unwrap();
    let snap = || snapshot(vec![server("s", &url)], &[]);
    let stop = tokio_util::sync::CancellationToken::new();
    {
        let h = Harness::running_at(home.path(), snap(), &stop);
        let s = h.session_with(json!({}));
        assert_eq!(names(&s.list(ListKind::Tools).await), ["coffer__search_tools", "s__echo"]);
        wait_cached(home.path(), "echo").await;
        s.close().await;
    }
    stop.cancel();
    let inits = up.count("initialize");
    let stop = tokio_util::sync::CancellationToken::new();
    let h = Harness::running_at(home.path(), snap(), &stop);
    let s = h.session_with(json!({}));
    let (_, mut notes) = s.outbound.subscribe(None);
    assert_eq!(names(&s.list(ListKind::Tools).await), ["coffer__search_tools", "s__echo"]);
    let generation = h.shared.snapshot.current().generation(&server("s", &url));
    // Refreshed: listed afresh by the background start, no longer the restored copy.
    wait_until("the refresh", || {
        let summary = crate::mcp::gateway_catalog::summary(&h.shared, "s", generation);
        summary["state"] == "ready" && summary.get("restored").is_none() && summary["prompts"].is_number()
    })
    .await;
    assert!(up.count("initialize") > inits, "the server was started again to refresh its lists");
    assert!(notes.try_recv().is_err(), "nothing changed, so the client is told nothing");
    s.close().await;
    stop.cancel();
}

#[tokio::test]
async fn a_capability_set_never_seen_is_answered_from_another_s_list_at_once() {
    let (up, url) = fake(&["echo", "add"], 0).await;
    let snap = with_settings(snapshot(vec![server("s", &url)], &[]), &[("gateway.first_list_timeout_ms", "5000")]);
    let home = tempfile::tempdir().unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let h = Harness::running_at(home.path(), snap, &stop);
    let plain = h.session_with(json!({}));
    assert_eq!(names(&plain.list(ListKind::Tools).await), ["coffer__search_tools", "s__echo", "s__add"]);
    let lists = up.count("tools/list");
    up.init_delay_ms.store(1_500, std::sync::atomic::Ordering::Relaxed);
    // A client declaring roots, sampling and elicitation: a profile the catalog has no list of.
    let rich = h.session_with(json!({"roots": {"listChanged": true}, "sampling": {}, "elicitation": {}}));
    let (_, mut notes) = rich.outbound.subscribe(None);
    assert_eq!(names(&rich.list(ListKind::Tools).await), ["coffer__search_tools", "s__echo", "s__add"]);
    assert_eq!(up.count("tools/list"), lists, "answered without waiting for its own list");
    // Its own list is fetched in the background (the same here: no list_changed).
    wait_until("the profile's own list", || up.count("tools/list") > lists).await;
    let generation = h.shared.snapshot.current().generation(&server("s", &url));
    let profile = crate::mcp::gateway_catalog::Profile::of(
        &json!({"capabilities": {"roots": {"listChanged": true}, "sampling": {}, "elicitation": {}}}),
    );
    wait_until("the profile's list in the catalog", || {
        matches!(
            h.shared.lists.lookup("s", generation, &profile, ListKind::Tools),
            crate::mcp::gateway_catalog::Known::Ready(_)
        )
    })
    .await;
    assert!(notes.try_recv().is_err(), "the same list: nothing to tell");
    plain.close().await;
    rich.close().await;
    stop.cancel();
}
