//! `/mcp` switched to a stream (`Upgrade: coffer-mcp-stream`) end to end on a running daemon:
//! the handshake behind the edge's checks, newline-delimited JSON-RPC with one session per
//! connection, errors that leave the stream usable, the size limit, batches by protocol
//! version, concurrency, server→client messages, and how the session and the connection end.
use std::collections::{HashMap, HashSet};
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use coffer_tests::mcp::{LATEST, McpSession, mcp_post, register_everything, register_tiny, set_tool_enabled};
use coffer_tests::stream::{Handshake, McpStream, PROTOCOL, handshake, upgrade_headers};
use coffer_tests::{Api, SendExt, TestHome, procs, wait_for};
use serde_json::{Value, json};

/// `crate::MCP_BODY_LIMIT` of the gateway: the largest line the stream accepts.
const LINE_LIMIT: usize = 16 * 1024 * 1024;
/// How long a session end may take to reach the client or reap an upstream.
const END_TIMEOUT: Duration = Duration::from_secs(15);

async fn daemon() -> anyhow::Result<(TestHome, Api)> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    Ok((home, api))
}

/// Processes of our tiny upstream belonging to this home.
fn tiny_pids(home: &TestHome) -> Vec<i32> {
    home.processes().into_iter().filter(|p| p.name == "coffer-tiny-upstream").map(|p| p.pid).collect()
}

fn upstream_records(home: &TestHome) -> usize {
    home.pid_records().into_iter().filter(|r| r.kind == "upstream").count()
}

fn text_of(v: &Value) -> String {
    v["result"]["content"][0]["text"].as_str().unwrap_or_default().to_owned()
}

/// The pid of the session's `tiny` upstream (starting it if needed).
async fn tiny_pid(s: &mut McpStream) -> anyhow::Result<i32> {
    let r = s.tool("tiny__whoami", json!({})).await?;
    let who: Value = serde_json::from_str(&text_of(&r)).with_context(|| format!("whoami: {r}"))?;
    Ok(who["pid"].as_i64().with_context(|| format!("whoami: {who}"))? as i32)
}

/// A `tiny__slow` call (id `"slow"`) that stays in flight for a minute.
fn slow_call() -> Value {
    json!({"jsonrpc": "2.0", "id": "slow", "method": "tools/call",
        "params": {"name": "tiny__slow", "arguments": {"ms": 60000}}})
}

/// Sets the sessions' idle timeout (`gateway.session_idle_timeout_s`).
async fn set_idle_timeout_s(api: &Api, seconds: u64) -> anyhow::Result<()> {
    let r = api
        .request(reqwest::Method::PATCH, "/v1/settings")
        .json(&json!({"set": {"gateway.session_idle_timeout_s": seconds.to_string()}}))
        .reply()
        .await?;
    ensure!(r.status == 200, "{} {}", r.status, r.text);
    Ok(())
}

/// Waits until upstream `pid` is gone and no upstream pid record is left.
async fn wait_reaped(home: &TestHome, pid: i32) -> anyhow::Result<()> {
    wait_for(&format!("upstream {pid} to be reaped"), END_TIMEOUT, || async {
        Ok((!procs::alive(pid) && upstream_records(home) == 0).then_some(()))
    })
    .await
}

/// A JSON-RPC error answer with `id` and `code` (and no result).
fn check_error(r: &Value, id: &Value, code: i64) -> anyhow::Result<()> {
    ensure!(r["jsonrpc"] == "2.0", "not JSON-RPC 2.0: {r}");
    ensure!(r.get("id") == Some(id), "expected id {id}: {r}");
    ensure!(r["error"]["code"] == code, "expected code {code}: {r}");
    ensure!(r["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "no message: {r}");
    ensure!(r.get("result").is_none(), "an error has no result: {r}");
    Ok(())
}

/// Sends `line` (a `\n` is added), requires that the very next message is the error `code` for
/// `id`, then that the stream still answers a ping. Returns the error answer.
async fn expect_error_then_ping(s: &mut McpStream, line: &str, id: Value, code: i64) -> anyhow::Result<Value> {
    s.send_raw(format!("{line}\n").as_bytes()).await?;
    let r = s.recv().await.with_context(|| format!("answer to {line:?}"))?;
    check_error(&r, &id, code).with_context(|| format!("answer to {line:?}"))?;
    s.ping().await.with_context(|| format!("ping after {line:?}"))?;
    Ok(r)
}

/// Refused handshakes are ordinary HTTP responses in `/mcp`'s wire format (a JSON-RPC error with
/// id null) that switch nothing; the edge's Host, Origin and token checks and the protocol
/// version check all apply. The good handshake switches to a live stream.
#[tokio::test]
async fn handshake_is_checked_by_the_edge_and_switches_only_when_allowed() -> anyhow::Result<()> {
    let (_home, api) = daemon().await?;
    let good = upgrade_headers(&api);
    let without = |name: &str| -> Vec<(String, String)> {
        good.iter().filter(|(k, _)| !k.eq_ignore_ascii_case(name)).cloned().collect()
    };
    let with = |name: &str, value: &str| -> Vec<(String, String)> {
        let mut h = without(name);
        h.push((name.to_owned(), value.to_owned()));
        h
    };
    let also = |name: &str, value: &str| -> Vec<(String, String)> {
        let mut h = good.clone();
        h.push((name.to_owned(), value.to_owned()));
        h
    };
    let own_origin = format!("http://127.0.0.1:{}", api.port());
    let mut two_origins = also("Origin", &own_origin);
    two_origins.push(("Origin".into(), "http://evil.com".into()));
    let cases = [
        ("no token", without("X-Coffer-Token"), 401),
        ("wrong token", with("X-Coffer-Token", &"0".repeat(64)), 401),
        ("foreign Host", with("Host", "evil.com"), 403),
        ("foreign Origin", with("Origin", "http://evil.com"), 403),
        ("unsupported MCP-Protocol-Version", with("MCP-Protocol-Version", "1999-01-01"), 400),
        ("a second, foreign Host", also("Host", "evil.com"), 400),
        ("our Origin, then a foreign one", two_origins, 400),
        // RFC 9110 §7.8: an upgrade is requested only with `Connection: upgrade`; without it
        // this is a plain GET /mcp (which needs a session id).
        ("Upgrade without Connection: upgrade", without("Connection"), 400),
    ];
    for (what, headers, status) in cases {
        let r = match handshake(api.port(), &headers).await.with_context(|| what.to_owned())? {
            Handshake::Refused(r) => r,
            Handshake::Switched(r, _) => bail!("{what}: switched to the stream: {:?}", r.headers),
        };
        let err = r.expect_jsonrpc_error(status).with_context(|| what.to_owned())?;
        ensure!(!r.headers.contains_key("upgrade"), "{what}: a refusal names no upgrade: {:?}", r.headers);
        if what.starts_with("unsupported") {
            // -32022 UnsupportedProtocolVersion (MCP 2026-07-28) with the versions served.
            assert_eq!(err["code"], -32022, "{what}: {err}");
            ensure!(err["data"]["supported"].as_array().is_some_and(|v| v.contains(&json!("2026-07-28"))), "{err}");
            ensure!(err["message"].as_str().is_some_and(|m| m.contains("1999-01-01")), "{what}: {err}");
        }
    }

    // The good handshake: 101 naming the protocol, and the connection is a stream at once
    // (a request before initialize gets its JSON-RPC error as a line).
    let (r, mut s) = match handshake(api.port(), &good).await? {
        Handshake::Switched(r, s) => (r, s),
        Handshake::Refused(r) => bail!("the good handshake was refused: {} {}", r.status, r.text),
    };
    assert_eq!(r.status, 101);
    assert_eq!(r.headers.get("upgrade").and_then(|v| v.to_str().ok()), Some(PROTOCOL), "{:?}", r.headers);
    ensure!(
        r.headers.get("connection").and_then(|v| v.to_str().ok()).is_some_and(|v| v.eq_ignore_ascii_case("upgrade")),
        "{:?}",
        r.headers
    );
    s.send(&json!({"jsonrpc": "2.0", "id": 1, "method": "ping"})).await?;
    check_error(&s.recv().await?, &json!(1), -32600)?;

    // Also allowed: our own Origin, a supported version header, the token as a bearer token.
    let mut headers = with("Origin", &format!("http://127.0.0.1:{}", api.port()));
    headers.push(("MCP-Protocol-Version".into(), LATEST.into()));
    headers.retain(|(k, _)| k != "X-Coffer-Token");
    headers.push(("Authorization".into(), format!("Bearer {}", api.token())));
    let mut s = match handshake(api.port(), &headers).await? {
        Handshake::Switched(_, s) => s,
        Handshake::Refused(r) => bail!("own Origin + bearer token refused: {} {}", r.status, r.text),
    };
    let init = s.initialize(LATEST).await?;
    assert_eq!(init["result"]["serverInfo"]["name"], "coffer", "{init}");
    Ok(())
}

/// Before `initialize` only `initialize` is served: a request gets -32600 with its id,
/// `server/discover` gets -32601, notifications and responses are dropped without an answer.
/// `initialize` answers exactly as over Streamable HTTP and negotiates the version.
#[tokio::test]
async fn before_initialize_only_initialize_is_served() -> anyhow::Result<()> {
    let (_home, api) = daemon().await?;
    let mut s = McpStream::connect(&api).await?;

    s.send(&json!({"jsonrpc": "2.0", "id": "early", "method": "tools/list", "params": {}})).await?;
    let r = s.recv().await?;
    check_error(&r, &json!("early"), -32600)?;
    ensure!(r["error"]["message"].as_str().is_some_and(|m| m.contains("initialize")), "names the fix: {r}");
    s.send(&json!({"jsonrpc": "2.0", "id": 3, "method": "server/discover", "params": {}})).await?;
    check_error(&s.recv().await?, &json!(3), -32601)?;

    // Dropped silently: the next line after them is the answer to initialize.
    s.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await?;
    s.send(&json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "early"}})).await?;
    s.send(&json!({"jsonrpc": "2.0", "id": 9, "result": {}})).await?;
    let params = json!({"protocolVersion": LATEST, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}});
    s.send(&json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": params})).await?;
    let init = s.recv().await?;
    assert_eq!(init["id"], 1, "the first line after the notifications answers initialize: {init}");
    assert_eq!(init["result"]["serverInfo"]["name"], "coffer", "{init}");
    assert_eq!(init["result"]["protocolVersion"], LATEST, "{init}");

    // The same result as initialize over Streamable HTTP.
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": params});
    let http = mcp_post(&api, None, body.to_string()).reply().await?.ok_json()?;
    assert_eq!(init["result"], http["result"], "stream and Streamable HTTP initialize alike");

    // Negotiation: a supported older version is kept, an unknown one gets the newest.
    for (asked, got) in [("2025-06-18", "2025-06-18"), ("2025-03-26", "2025-03-26"), ("1999-01-01", LATEST)] {
        let mut s = McpStream::connect(&api).await?;
        let r = s.initialize(asked).await?;
        assert_eq!(r["result"]["protocolVersion"], got, "asked {asked}: {r}");
    }
    Ok(())
}

/// The main path with the pinned `server-everything`: tools are listed, and a call over the
/// stream answers verbatim what the same call answers over Streamable HTTP; both calls reach
/// the invocation log, each under its own session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn everything_over_the_stream_matches_streamable_http_and_is_logged() -> anyhow::Result<()> {
    let (_home, api) = daemon().await?;
    register_everything(&api, "everything").await?;
    coffer_tests::mcp::wait_listed(&api, "everything").await?;
    let mut s = McpStream::open(&api, LATEST).await?;
    let names = s.tool_names().await?;
    ensure!(names.contains(&"everything__echo".to_owned()), "{names:?}");
    ensure!(names.contains(&"coffer__search_tools".to_owned()), "{names:?}");

    let over_stream = s.tool("everything__echo", json!({"message": "hello stream"})).await?;
    assert_eq!(over_stream["jsonrpc"], "2.0", "{over_stream}");
    assert_eq!(over_stream["result"], json!({"content": [{"type": "text", "text": "Echo: hello stream"}]}));
    let http = McpSession::latest(&api).await?;
    let over_http = http.tool("everything__echo", json!({"message": "hello stream"})).await?;
    assert_eq!(over_stream["result"], over_http["result"], "verbatim on both transports");

    let rows = wait_for("both invocations to be written", Duration::from_secs(10), || async {
        let v = api.get("/v1/invocations?target=everything__echo").reply().await?.ok_json()?;
        let rows = v["items"].as_array().cloned().unwrap_or_default();
        Ok((rows.len() >= 2).then_some(rows))
    })
    .await?;
    assert_eq!(rows.len(), 2, "{rows:?}");
    ensure!(rows.iter().all(|r| r["outcome"] == "ok" && r["server"] == "everything"), "{rows:?}");
    let sessions: HashSet<&str> = rows.iter().filter_map(|r| r["session_id"].as_str()).collect();
    ensure!(sessions.len() == 2 && sessions.contains(http.id.as_str()), "one row per session: {rows:?}");
    ensure!(!serde_json::to_string(&rows)?.contains("hello stream"), "arguments never stored");
    Ok(())
}

/// Every kind of bad line gets its JSON-RPC error (or, for blank lines, nothing), and the
/// stream keeps working after each; framing tolerates CRLF, several messages per write and one
/// message across writes.
#[tokio::test]
async fn bad_lines_get_their_errors_and_the_stream_goes_on() -> anyhow::Result<()> {
    let (_home, api) = daemon().await?;
    let mut s = McpStream::open(&api, LATEST).await?;

    expect_error_then_ping(&mut s, "this is not json", Value::Null, -32700).await?;
    expect_error_then_ping(&mut s, r#"{"jsonrpc":"2.0","id":11,"meth"#, Value::Null, -32700).await?;
    expect_error_then_ping(&mut s, r#"{"id":1,"method":"ping"}"#, json!(1), -32600).await?;
    let twice = r#"{"jsonrpc":"2.0","id":"d","method":"ping","method":"ping"}"#;
    expect_error_then_ping(&mut s, twice, json!("d"), -32600).await?;
    expect_error_then_ping(&mut s, r#"{"jsonrpc":"1.0","id":"v1","method":"ping"}"#, json!("v1"), -32600).await?;
    expect_error_then_ping(&mut s, r#"{"jsonrpc":"2.0","id":2,"method":5}"#, json!(2), -32600).await?;
    // MCP: a request id must not be null (it is not a notification either).
    expect_error_then_ping(&mut s, r#"{"jsonrpc":"2.0","id":null,"method":"tools/list"}"#, Value::Null, -32600).await?;
    let call = |id: u32, name: &str| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": name, "arguments": {}}})
            .to_string()
    };
    expect_error_then_ping(&mut s, &call(3, "nounderscore"), json!(3), -32602).await?;
    let r = expect_error_then_ping(&mut s, &call(4, "nope__x"), json!(4), -32602).await?;
    ensure!(r["error"]["message"].as_str().is_some_and(|m| m.contains("nope")), "names the server: {r}");
    expect_error_then_ping(&mut s, r#"{"jsonrpc":"2.0","id":5,"method":"no/such/method"}"#, json!(5), -32601).await?;
    let again = json!({"jsonrpc": "2.0", "id": 6, "method": "initialize",
        "params": {"protocolVersion": LATEST, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}});
    let r = expect_error_then_ping(&mut s, &again.to_string(), json!(6), -32600).await?;
    ensure!(r["error"]["message"].as_str().is_some_and(|m| m.contains("already initialized")), "{r}");

    // Blank lines carry no message: the next line answers the ping after them.
    s.send_raw(b"\n   \n\r\n").await?;
    s.send(&json!({"jsonrpc": "2.0", "id": "after-blank", "method": "ping"})).await?;
    let r = s.recv().await?;
    assert_eq!(r, json!({"jsonrpc": "2.0", "id": "after-blank", "result": {}}), "no answer to blank lines");

    // CRLF ends a line too; two messages in one write; one message over two writes.
    s.send_raw(b"{\"jsonrpc\":\"2.0\",\"id\":\"crlf\",\"method\":\"ping\"}\r\n").await?;
    assert_eq!(s.recv().await?["id"], "crlf");
    s.send_raw(b"{\"jsonrpc\":\"2.0\",\"id\":\"a\",\"method\":\"ping\"}\n{\"jsonrpc\":\"2.0\",\"id\":\"b\",\"method\":\"ping\"}\n")
        .await?;
    let ids: HashSet<String> = [s.recv().await?, s.recv().await?].iter().map(|m| m["id"].to_string()).collect();
    assert_eq!(ids, HashSet::from(["\"a\"".to_owned(), "\"b\"".to_owned()]));
    s.send_raw(b"{\"jsonrpc\":\"2.0\",\"id\":\"split\",").await?;
    s.send_raw(b"\"method\":\"ping\"}\n").await?;
    assert_eq!(s.recv().await?, json!({"jsonrpc": "2.0", "id": "split", "result": {}}));
    s.ping().await
}

/// A line over the 16 MiB limit gets -32600 with the request id read from its start and is
/// skipped; the stream goes on, and a 10 MB argument under the limit travels intact both ways.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_line_is_refused_by_id_and_ten_megabytes_pass() -> anyhow::Result<()> {
    let (_home, api) = daemon().await?;
    register_everything(&api, "everything").await?;
    let mut s = McpStream::open(&api, LATEST).await?;

    let mut line =
        br#"{"jsonrpc":"2.0","id":77,"method":"tools/call","params":{"name":"everything__echo","arguments":{"message":""#
            .to_vec();
    line.resize(line.len() + LINE_LIMIT + 1024, b'x');
    line.extend_from_slice(b"\"}}}\n");
    s.send_raw(&line).await?;
    drop(line);
    let r = s.recv().await?;
    check_error(&r, &json!(77), -32600)?;
    ensure!(
        r["error"]["message"].as_str().is_some_and(|m| m.contains(&LINE_LIMIT.to_string())),
        "names the limit: {r}"
    );
    s.ping().await?;

    // 10 MB (not MiB): the MCP SDK under server-everything drops a stdio message over 10 MiB.
    let big = "y".repeat(10_000_000);
    let r = s.tool("everything__echo", json!({"message": big})).await?;
    let text = text_of(&r);
    ensure!(
        text.len() == big.len() + "Echo: ".len() && text.strip_prefix("Echo: ") == Some(big.as_str()),
        "the 10 MB echo came back intact: {} bytes, error {}",
        text.len(),
        r["error"]
    );
    s.ping().await
}

/// A batch line is refused (id null) on a 2025-11-25 session and before initialize; on a
/// 2025-03-26 session it is answered with one array holding an answer per request.
#[tokio::test]
async fn batches_only_on_2025_03_26_sessions() -> anyhow::Result<()> {
    let (_home, api) = daemon().await?;
    register_tiny(&api, "tiny", json!({})).await?;
    let echo = |id: u32, m: &str| json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": "tiny__echo", "arguments": {"message": m}}});
    let batch =
        json!([echo(1, "a"), {"jsonrpc": "2.0", "method": "notifications/initialized"}, echo(2, "b")]).to_string();

    let mut fresh = McpStream::connect(&api).await?;
    let r = expect_error_then_ping_before_init(&mut fresh, &batch).await?;
    ensure!(r["error"]["message"].as_str().is_some_and(|m| m.contains("2025-03-26")), "{r}");

    let mut new = McpStream::open(&api, LATEST).await?;
    let r = expect_error_then_ping(&mut new, &batch, Value::Null, -32600).await?;
    ensure!(r["error"]["message"].as_str().is_some_and(|m| m.contains(LATEST)), "names the version: {r}");

    let mut old = McpStream::connect(&api).await?;
    let init = old.initialize("2025-03-26").await?;
    assert_eq!(init["result"]["protocolVersion"], "2025-03-26", "{init}");
    old.notify("notifications/initialized", None).await?;
    old.send_raw(format!("{batch}\n").as_bytes()).await?;
    let answer = old.recv().await?;
    let items = answer.as_array().with_context(|| format!("one array answers the batch: {answer}"))?;
    let by_id: HashMap<String, String> = items.iter().map(|m| (m["id"].to_string(), text_of(m))).collect();
    assert_eq!(items.len(), 2, "one answer per request, none for the notification: {answer}");
    assert_eq!(by_id, HashMap::from([("1".to_owned(), "a".to_owned()), ("2".to_owned(), "b".to_owned())]), "{answer}");
    expect_error_then_ping(&mut old, "[]", Value::Null, -32600).await?;
    old.ping().await
}

/// A batch before initialize: -32600 with id null, and the stream still refuses a ping the
/// same way (it is not initialized yet).
async fn expect_error_then_ping_before_init(s: &mut McpStream, batch: &str) -> anyhow::Result<Value> {
    s.send_raw(format!("{batch}\n").as_bytes()).await?;
    let r = s.recv().await?;
    check_error(&r, &Value::Null, -32600)?;
    s.send(&json!({"jsonrpc": "2.0", "id": "p", "method": "ping"})).await?;
    check_error(&s.recv().await?, &json!("p"), -32600)?;
    Ok(r)
}

/// Requests on one stream run concurrently: a slow call sent first does not hold back 50 echo
/// calls written back-to-back after it, and each of those is answered exactly once, to its own
/// id (numbers and strings alike), with its own message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_calls_on_one_stream_are_answered_once_each_in_any_order() -> anyhow::Result<()> {
    let (_home, api) = daemon().await?;
    register_tiny(&api, "tiny", json!({})).await?;
    let mut s = McpStream::open(&api, LATEST).await?;
    assert_eq!(text_of(&s.tool("tiny__echo", json!({"message": "warm"})).await?), "warm");

    let mut burst = format!("{}\n", slow_call()).into_bytes();
    let mut expected: HashMap<Value, String> = HashMap::new();
    for i in 0..50 {
        let id = if i % 2 == 0 { json!(i) } else { json!(format!("call-{i}")) };
        let msg = format!("message {i}");
        let req = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "tiny__echo", "arguments": {"message": msg}}});
        burst.extend_from_slice(format!("{req}\n").as_bytes());
        expected.insert(id, msg);
    }
    s.send_raw(&burst).await?;
    let mut seen = HashSet::new();
    while seen.len() < 50 {
        let m = s.recv().await.with_context(|| format!("{} of 50 answered", seen.len()))?;
        if m.get("method").is_some() {
            continue; // a notification
        }
        let id = m.get("id").cloned().unwrap_or_default();
        ensure!(id != "slow", "the 60 s call was answered before the echoes: {m}");
        let want = expected.get(&id).with_context(|| format!("an answer to an unknown id: {m}"))?;
        ensure!(&text_of(&m) == want, "id {id} got {m}");
        ensure!(seen.insert(id.to_string()), "id {id} answered twice");
    }
    // The slow call is still running; the stream is not blocked behind it.
    s.ping().await
}

/// 20 streams at once, each its own session with its own upstream child; closing them all
/// reaps every child.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_streams_at_once_each_with_its_own_session() -> anyhow::Result<()> {
    let (home, api) = daemon().await?;
    register_tiny(&api, "tiny", json!({})).await?;
    // The catalog's own background start of it ends first: only sessions' children are counted.
    coffer_tests::mcp::wait_listed(&api, "tiny").await?;
    let mut tasks = Vec::new();
    for i in 0..20 {
        let api = api.clone();
        tasks.push(tokio::spawn(async move {
            let mut s = McpStream::connect(&api).await?;
            let init = s.initialize(LATEST).await?;
            ensure!(init["result"]["serverInfo"]["name"] == "coffer", "stream {i}: {init}");
            s.notify("notifications/initialized", None).await?;
            let msg = format!("stream {i}");
            let r = s.tool("tiny__echo", json!({"message": msg})).await?;
            ensure!(text_of(&r) == msg, "stream {i}: {r}");
            let pid = tiny_pid(&mut s).await?;
            anyhow::Ok((s, pid))
        }));
    }
    let mut streams = Vec::new();
    let mut pids = HashSet::new();
    for t in tasks {
        let (s, pid) = t.await??;
        streams.push(s);
        pids.insert(pid);
    }
    assert_eq!(pids.len(), 20, "two sessions never share an upstream");
    assert_eq!(tiny_pids(&home).len(), 20);
    drop(streams);
    wait_for("every stream's upstream to be reaped", END_TIMEOUT, || async {
        Ok((tiny_pids(&home).is_empty() && upstream_records(&home) == 0).then_some(()))
    })
    .await
}

/// The session is the connection's: closing the connection (or only its write side) ends the
/// session and terminates its upstream child, and after a half-close the daemon closes its side.
#[tokio::test]
async fn closing_the_connection_ends_the_session_and_its_upstream() -> anyhow::Result<()> {
    let (home, api) = daemon().await?;
    register_tiny(&api, "tiny", json!({})).await?;
    // The catalog's own background start of it ends first: only sessions' children are counted.
    coffer_tests::mcp::wait_listed(&api, "tiny").await?;

    let mut s = McpStream::open(&api, LATEST).await?;
    let pid = tiny_pid(&mut s).await?;
    ensure!(tiny_pids(&home) == vec![pid], "the session's child: {:?} vs {pid}", tiny_pids(&home));
    drop(s);
    wait_reaped(&home, pid).await?;
    home.wait_for_log_line("gateway", &["MCP session ended", "the client closed the stream"], END_TIMEOUT).await?;

    let mut s = McpStream::open(&api, LATEST).await?;
    let pid = tiny_pid(&mut s).await?;
    s.shutdown_write().await?;
    let late = s.expect_eof(END_TIMEOUT).await?;
    ensure!(late.is_empty(), "nothing was pending: {late:?}");
    wait_reaped(&home, pid).await?;
    ensure!(tiny_pids(&home).is_empty(), "{:?}", tiny_pids(&home));
    Ok(())
}

/// When the daemon ends the session (idle timeout), it closes the connection: the client reads
/// a clean EOF and the session's upstream is terminated.
#[tokio::test]
async fn idle_timeout_ends_the_session_and_closes_the_stream() -> anyhow::Result<()> {
    let (home, api) = daemon().await?;
    register_tiny(&api, "tiny", json!({})).await?;
    set_idle_timeout_s(&api, 1).await?;
    let mut s = McpStream::open(&api, LATEST).await?;
    let pid = tiny_pid(&mut s).await?;
    // A call in flight does not keep a session alive; when the session ends, its upstream is
    // terminated and the call's error answer is written before the connection closes.
    s.send(&slow_call()).await?;
    // The reaper looks every 5 s.
    let late = s.expect_eof(Duration::from_secs(20)).await?;
    ensure!(late.len() == 1, "exactly the in-flight call's answer before EOF: {late:?}");
    check_error(&late[0], &json!("slow"), -32001)?;
    let message = late[0]["error"]["message"].as_str().unwrap_or_default();
    ensure!(message.contains("Coffer stopped it"), "the error says Coffer ended it, not the upstream: {message}");
    wait_reaped(&home, pid).await?;
    home.wait_for_log_line("gateway", &["MCP session ended", "idle timeout"], END_TIMEOUT).await?;
    Ok(())
}

/// A call the client cancels gets no answer (MCP, cancellation: the receiver SHOULD NOT
/// respond), ends at the upstream, and is logged as `cancelled`, not as an upstream error.
#[tokio::test]
async fn a_cancelled_call_gets_no_answer_and_is_logged_as_cancelled() -> anyhow::Result<()> {
    let (home, api) = daemon().await?;
    register_tiny(&api, "tiny", json!({})).await?;
    let mut s = McpStream::open(&api, LATEST).await?;
    s.send(&slow_call()).await?;
    // Cancel once the upstream is working on it (tiny logs "slow … started" to stderr).
    home.wait_for_upstream_log("tiny", "slow 60000 started", 1, END_TIMEOUT).await?;
    s.notify("notifications/cancelled", Some(json!({"requestId": "slow", "reason": "test"}))).await?;
    // The cancel was handled before the ping was read, and it produced no answer: the next
    // message on the stream is the ping's.
    s.send(&json!({"jsonrpc": "2.0", "id": "after", "method": "ping"})).await?;
    let next = s.recv().await?;
    assert_eq!(next, json!({"jsonrpc": "2.0", "id": "after", "result": {}}));
    wait_for("the cancelled call in the invocation log", END_TIMEOUT, || async {
        let v = api.get("/v1/invocations?outcome=cancelled").reply().await?.ok_json()?;
        let items = v["items"].as_array().cloned().unwrap_or_default();
        Ok(items.iter().any(|i| i["target"] == "tiny__slow").then_some(()))
    })
    .await?;
    // Nothing for it ever arrives, up to the end of the stream.
    s.shutdown_write().await?;
    let rest = s.expect_eof(END_TIMEOUT).await?;
    ensure!(rest.iter().all(|m| m.get("id") != Some(&json!("slow"))), "answered after all: {rest:?}");
    Ok(())
}

/// Cancelled calls give back their share of the stream's budget of unanswered lines (1024):
/// 1,600 cancelled calls later the stream still reads and answers.
#[tokio::test]
async fn cancelled_calls_do_not_use_up_the_stream() -> anyhow::Result<()> {
    let (home, api) = daemon().await?;
    register_tiny(&api, "tiny", json!({})).await?;
    let mut s = McpStream::open(&api, LATEST).await?;
    tiny_pid(&mut s).await?;
    const ROUNDS: usize = 8;
    const PER_ROUND: usize = 200;
    for round in 0..ROUNDS {
        let mut calls = String::new();
        let mut cancels = String::new();
        for i in 0..PER_ROUND {
            let id = format!("s{round}-{i}");
            calls.push_str(&format!(
                "{}\n",
                json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": "tiny__slow", "arguments": {"ms": 60000}}})
            ));
            cancels.push_str(&format!(
                "{}\n",
                json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": id}})
            ));
        }
        s.send_raw(calls.as_bytes()).await?;
        let want = (round + 1) * PER_ROUND;
        home.wait_for_upstream_log("tiny", "slow 60000 started", want, END_TIMEOUT).await?;
        s.send_raw(cancels.as_bytes()).await?;
    }
    s.ping().await?;
    assert_eq!(text_of(&s.tool("tiny__echo", json!({"message": "still read"})).await?), "still read");
    ensure!(
        s.skipped.iter().all(|m| !m["id"].as_str().is_some_and(|id| id.starts_with('s'))),
        "a cancelled call was answered: {:?}",
        s.skipped.iter().find(|m| m["id"].as_str().is_some_and(|id| id.starts_with('s')))
    );
    Ok(())
}

/// A burst of `tools/list` on a session that has not listed yet costs the upstream one list:
/// the first request fetches it, the others wait for that fetch and share it; every answer is
/// complete.
#[tokio::test]
async fn a_burst_of_tools_list_costs_the_upstream_one_list() -> anyhow::Result<()> {
    let (home, api) = daemon().await?;
    register_tiny(&api, "tiny", json!({})).await?;
    let mut s = McpStream::open(&api, LATEST).await?;
    const BURST: usize = 200;
    let mut lines = String::new();
    for i in 0..BURST {
        lines.push_str(&format!("{}\n", json!({"jsonrpc": "2.0", "id": i, "method": "tools/list"})));
    }
    s.send_raw(lines.as_bytes()).await?;
    let mut answered = HashSet::new();
    while answered.len() < BURST {
        let m = s.recv().await?;
        let names: Vec<&str> = m["result"]["tools"]
            .as_array()
            .context("a tools/list result")?
            .iter()
            .filter_map(|t| t["name"].as_str())
            .collect();
        ensure!(names.contains(&"tiny__echo") && names.contains(&"coffer__search_tools"), "incomplete list: {names:?}");
        ensure!(answered.insert(m["id"].as_u64().context("numeric id")?), "answered twice: {m}");
    }
    let log = home.logs_dir().join("upstreams").join("tiny.log");
    let count = || std::fs::read_to_string(&log).unwrap_or_default().matches("tools/list received").count();
    wait_for("the upstream's log of its tools/list", END_TIMEOUT, || async { Ok((count() > 0).then_some(())) }).await?;
    ensure!(count() == 1, "the upstream was asked {} times", count());
    Ok(())
}

/// A client that sends without reading is not read further once 1024 of its lines are
/// unanswered (`MAX_UNWRITTEN_ANSWERS`), so it cannot make the gateway hold unbounded answers:
/// a `ping` sent after 1030 slow calls is read, and answered, only once slow answers have begun
/// to be written; nothing is lost.
#[tokio::test]
async fn a_client_with_1024_unanswered_lines_is_not_read_further_and_loses_nothing() -> anyhow::Result<()> {
    let (_home, api) = daemon().await?;
    register_tiny(&api, "tiny", json!({})).await?;
    let mut s = McpStream::open(&api, LATEST).await?;
    tiny_pid(&mut s).await?; // the upstream runs
    const SLOW: usize = 1030;
    let mut batch = String::new();
    for i in 0..SLOW {
        let call = json!({"jsonrpc": "2.0", "id": i, "method": "tools/call",
            "params": {"name": "tiny__slow", "arguments": {"ms": 1500}}});
        batch.push_str(&format!("{call}\n"));
    }
    batch.push_str("{\"jsonrpc\":\"2.0\",\"id\":\"ping\",\"method\":\"ping\"}\n");
    s.send_raw(batch.as_bytes()).await?;
    let mut slow_before_ping = None;
    let mut slow_answers = HashSet::new();
    while slow_answers.len() < SLOW || slow_before_ping.is_none() {
        let m = s.recv().await?;
        if m["id"] == "ping" {
            ensure!(m["result"] == json!({}), "ping: {m}");
            slow_before_ping = Some(slow_answers.len());
        } else {
            ensure!(m["result"]["content"].is_array(), "a slow call's result: {m}");
            let id = m["id"].as_u64().context("numeric id")?;
            ensure!(slow_answers.insert(id), "answered twice: {id}");
        }
    }
    // Unthrottled, the ping would be answered at once, 1.5 s before any slow call.
    let before = slow_before_ping.unwrap_or(0);
    ensure!(before > 0, "the ping was read before any slow answer was written");
    Ok(())
}

/// A connection that never sends `initialize` holds no session, and is closed after the idle
/// timeout like an idle session.
#[tokio::test]
async fn a_stream_that_never_initializes_is_closed_after_the_idle_timeout() -> anyhow::Result<()> {
    let (_home, api) = daemon().await?;
    set_idle_timeout_s(&api, 1).await?;
    let mut s = McpStream::connect(&api).await?;
    // Traffic before initialize is answered, but does not start a session.
    let r = s.request("tools/list", json!({})).await?;
    check_error(&r, &r["id"], -32600)?;
    let late = s.expect_eof(Duration::from_secs(10)).await?;
    ensure!(late.is_empty(), "nothing but EOF: {late:?}");
    // The daemon still serves new streams.
    McpStream::open(&api, LATEST).await?.request("ping", json!({})).await?;
    Ok(())
}

/// Stopping the daemon ends every stream session and closes its connection: the client reads
/// a clean EOF, and nothing of the home is left.
#[tokio::test]
async fn daemon_stop_closes_the_stream() -> anyhow::Result<()> {
    let (home, api) = daemon().await?;
    register_tiny(&api, "tiny", json!({})).await?;
    let mut s = McpStream::open(&api, LATEST).await?;
    tiny_pid(&mut s).await?;
    s.send(&slow_call()).await?;
    let r = api.post("/v1/daemon/stop").reply().await?;
    assert_eq!(r.status, 202, "{}", r.text);
    // The in-flight call's error answer may still be written (the gateway process may also
    // exit first); nothing else may arrive.
    let late = s.expect_eof(END_TIMEOUT).await?;
    ensure!(late.len() <= 1, "{late:?}");
    for m in &late {
        check_error(m, &json!("slow"), -32001)?;
    }
    home.wait_no_processes(END_TIMEOUT).await
}

/// Server→client messages travel on the stream: `tools/list_changed` after a tool is disabled
/// or enabled over REST and when an upstream announces a change, and an upstream's sampling
/// request relayed to the client, whose answer goes back to the upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_messages_arrive_on_the_stream() -> anyhow::Result<()> {
    const CHANGED: &str = "notifications/tools/list_changed";
    let wait = Duration::from_secs(10);
    let (_home, api) = daemon().await?;
    register_tiny(&api, "tiny", json!({})).await?;
    let mut s = McpStream::connect(&api).await?;
    s.initialize_with(LATEST, json!({"sampling": {}})).await?;
    s.notify("notifications/initialized", None).await?;
    ensure!(s.tool_names().await?.contains(&"tiny__echo".to_owned()));
    ensure!(s.skipped.iter().all(|m| m["method"] != CHANGED), "no change yet: {:?}", s.skipped);

    set_tool_enabled(&api, "tiny__echo", false).await?;
    s.notification(CHANGED, wait).await.context("after disabling tiny__echo")?;
    ensure!(!s.tool_names().await?.contains(&"tiny__echo".to_owned()), "disabled tool is not listed");
    let r = s.tool("tiny__echo", json!({"message": "x"})).await?;
    assert_eq!(r["error"]["code"], -32000, "{r}");
    s.skipped.clear();
    set_tool_enabled(&api, "tiny__echo", true).await?;
    s.notification(CHANGED, wait).await.context("after enabling tiny__echo")?;
    ensure!(s.tool_names().await?.contains(&"tiny__echo".to_owned()), "listed again");

    // An upstream's own list_changed is passed on.
    s.skipped.clear();
    assert_eq!(text_of(&s.tool("tiny__changed", json!({})).await?), "changed");
    s.notification(CHANGED, wait).await.context("after tiny announced a change")?;

    // A sampling request from the upstream is relayed on the stream; the answer goes back.
    s.send(&json!({"jsonrpc": "2.0", "id": "call", "method": "tools/call", "params": {"name": "tiny__sample", "arguments": {}}}))
        .await?;
    let ask = loop {
        let m = s.recv().await?;
        if m["method"] == "sampling/createMessage" {
            break m;
        }
        ensure!(m.get("id") != Some(&json!("call")), "the call ended before sampling was relayed: {m}");
    };
    let ask_id = ask.get("id").cloned().with_context(|| format!("a relayed request has an id: {ask}"))?;
    ensure!(ask["params"]["messages"][0]["content"]["text"] == "say hi", "{ask}");
    let answer =
        json!({"role": "assistant", "content": {"type": "text", "text": "hi from the client"}, "model": "test"});
    s.send(&json!({"jsonrpc": "2.0", "id": ask_id, "result": answer})).await?;
    let r = s.response_to(&json!("call")).await?;
    let text = text_of(&r);
    ensure!(text.starts_with("sampled:") && text.contains("hi from the client"), "{r}");
    s.ping().await
}
