//! Flow between upstreams and clients (issue 31): the gateway's memory stays bounded when an
//! upstream floods notifications and its clients stop reading, on the shim's `/mcp` stream and
//! on Streamable HTTP (a POST's SSE answer and the GET stream); list changes are coalesced and
//! log messages rate-limited; `notifications/progress` reach the client that made the call, in
//! both eras and on both transports, and stop when it cancels; the same through the lazy mode's
//! `coffer__call_tool`, whose routed call is logged once.
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use coffer_tests::mcp::{LATEST, McpSession, mcp_post, patient_lists, register_everything, register_tiny};
use coffer_tests::peers::{PyClient, Sdk, texts};
use coffer_tests::procs::status_kib;
use coffer_tests::stream::McpStream;
use coffer_tests::{Api, SendExt, TestHome, wait_for};
use serde_json::{Value, json};

/// How long the tiny upstream floods each session.
const FLOOD_MS: u64 = 10_000;
/// Bytes of data in each of its log messages and progress notifications.
const FLOOD_BYTES: u64 = 8_192;
/// How much the gateway's resident memory may grow over its idle size while two sessions are
/// flooded and their clients read nothing. Before flow control it grew without limit: by
/// about 340 MiB in 15 s on a release build, and in this test (debug build, whose gateway
/// parses the flood more slowly) by 64 MiB in 10 s, steadily; with it, by about 18 MiB (the
/// bounded queues filling, then flat).
const RSS_GROWTH_LIMIT_KIB: u64 = 32 * 1024;
/// The longest another client may wait for a call during the flood.
const ANSWER_LIMIT: Duration = Duration::from_secs(5);

async fn gateway_pid(api: &Api) -> anyhow::Result<i32> {
    let pid = api.service("gateway").await?["pid"].as_i64().context("the gateway's pid in /v1/status")?;
    Ok(i32::try_from(pid)?)
}

/// The `tools/call` of the tiny upstream's `flood` tool (with a progress token, so progress
/// floods too) as request `id`.
fn flood_call(id: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
        "name": "tiny__flood",
        "arguments": {"count": 10_000_000, "ms": FLOOD_MS, "bytes": FLOOD_BYTES},
        "_meta": {"progressToken": "flood"}}})
}

/// A tiny upstream floods list changes, log messages and progress at two sessions whose clients
/// read nothing (the shim's stream; a Streamable HTTP session's POST answer and GET stream):
/// the gateway's RSS stays within [`RSS_GROWTH_LIMIT_KIB`] of its size before, another client's
/// calls are answered all along, and the stalled stream, once read again, gets its answer after
/// a few coalesced list changes and rate-limited log messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooding_upstream_and_clients_that_stop_reading_leave_the_gateway_small() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    register_tiny(&api, "tiny", json!({})).await?;
    let pid = gateway_pid(&api).await?;

    // The shim's way in: a stream that asks for every log message and has seen the tools.
    let mut stalled = McpStream::open(&api, LATEST).await?;
    let r = stalled.request("logging/setLevel", json!({"level": "debug"})).await?;
    ensure!(r["result"] == json!({}), "{r}");
    ensure!(stalled.tool_names().await?.iter().any(|t| t == "tiny__flood"), "no flood tool");
    let r = stalled.tool("tiny__echo", json!({"message": "warm"})).await?;
    ensure!(texts(&r["result"]) == "warm", "{r}");
    // A Streamable HTTP session the same.
    let http = McpSession::latest(&api).await?;
    http.call("logging/setLevel", json!({"level": "debug"})).await?;
    ensure!(texts(&http.tool("tiny__echo", json!({"message": "warm"})).await?["result"]) == "warm");
    // Another client, which must be answered during the flood.
    let other = McpSession::latest(&api).await?;
    ensure!(texts(&other.tool("tiny__echo", json!({"message": "warm"})).await?["result"]) == "warm");
    let baseline = status_kib(pid, "VmRSS:");
    ensure!(baseline > 0, "no VmRSS for the gateway (pid {pid})");

    // The HTTP client opens its GET stream and POSTs the flood, and reads neither body.
    let get = api
        .get("/mcp")
        .header("Accept", "text/event-stream")
        .header("Mcp-Session-Id", &http.id)
        .header("MCP-Protocol-Version", &http.version)
        .send()
        .await?;
    ensure!(get.status() == 200, "GET /mcp answered {}", get.status());
    stalled.send(&flood_call("flood")).await?;
    // Its response head comes with the first progress notification (the body is never read).
    let post = tokio::spawn(
        mcp_post(&api, Some(&http.id), flood_call("flood").to_string())
            .header("MCP-Protocol-Version", &http.version)
            .send(),
    );

    let started = Instant::now();
    let mut peak = baseline;
    let mut samples = Vec::new();
    let mut answered = 0;
    let mut slowest = Duration::ZERO;
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    while started.elapsed() < Duration::from_millis(FLOOD_MS + 1_000) {
        tick.tick().await;
        let rss = status_kib(pid, "VmRSS:");
        peak = peak.max(rss);
        samples.push(rss / 1024);
        let asked = Instant::now();
        let r = tokio::time::timeout(ANSWER_LIMIT, other.tool("tiny__echo", json!({"message": "still here"})))
            .await
            .with_context(|| {
            format!("another client waited over {ANSWER_LIMIT:?} for a call during the flood")
        })??;
        ensure!(texts(&r["result"]) == "still here", "{r}");
        slowest = slowest.max(asked.elapsed());
        answered += 1;
    }
    let after = status_kib(pid, "VmRSS:");
    eprintln!(
        "gateway VmRSS: {baseline} KiB before, peak {peak} KiB, {after} KiB after the flood (+{} KiB); {answered} calls of another client answered meanwhile, the slowest in {slowest:?}",
        peak.saturating_sub(baseline)
    );
    eprintln!("gateway VmRSS every 200 ms, MiB: {samples:?}");
    ensure!(
        peak.saturating_sub(baseline) < RSS_GROWTH_LIMIT_KIB,
        "the gateway grew from {baseline} KiB to {peak} KiB while its clients read nothing"
    );

    // The stalled stream is read again: its queue held a bounded number of messages, list
    // changes were coalesced (the list never changed), log messages rate-limited, and the
    // answer arrives.
    let (mut list_changed, mut logs, mut progress) = (0, 0, 0);
    let answer = loop {
        let m = stalled.recv().await.context("draining the stalled stream")?;
        match m["method"].as_str() {
            Some("notifications/tools/list_changed") => list_changed += 1,
            Some("notifications/message") => logs += 1,
            Some("notifications/progress") => progress += 1,
            _ if m["id"] == "flood" => break m,
            _ => {}
        }
    };
    let flooded = texts(&answer["result"]);
    let sent: u64 = flooded.trim_start_matches("flooded ").parse().with_context(|| format!("{answer}"))?;
    eprintln!(
        "stream: the upstream sent {sent} notifications; the client got {list_changed} list_changed, {logs} log messages, {progress} progress"
    );
    ensure!(sent > 2_000, "the upstream hardly flooded: {answer}");
    ensure!(list_changed <= 3, "{list_changed} tools/list_changed for a list that never changed");
    let log_limit = 50 + 20 * (FLOOD_MS / 1000 + 5);
    ensure!(logs > 0 && logs <= log_limit, "{logs} log messages (at most {log_limit} by the rate limit)");
    ensure!(progress > 0, "no progress reached the caller");
    home.wait_for_log_line(
        "gateway",
        &["Dropped messages the client could not take in time", "dropped="],
        Duration::from_secs(10),
    )
    .await?;

    let post = post.await??;
    let ct = post.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    ensure!(ct.starts_with("text/event-stream"), "the flood's progress makes the POST answer a stream: {ct}");
    drop((get, post));
    ensure!(texts(&other.tool("tiny__echo", json!({"message": "after"})).await?["result"]) == "after");
    stalled.ping().await?;
    home.terminate_daemon(Duration::from_secs(20)).await.context("processes left behind")
}

/// The calls of the progress tests: server-everything's long-running operation in 4 steps.
fn long_operation(steps: u64) -> Value {
    json!({"op": "call", "name": "everything__trigger-long-running-operation",
        "args": {"duration": 1, "steps": steps}, "progress": true})
}

/// The `progress` values of the driver's progress events for `tool`, in order.
fn progress_of(c: &PyClient) -> Vec<f64> {
    c.events().iter().filter(|e| e["kind"] == "progress").filter_map(|e| e["progress"].as_f64()).collect()
}

/// server-everything's long-running operation reports each of its 4 steps to the caller's
/// progress callback, through Coffer as directly: a Python SDK client of each era through the
/// shim and over Streamable HTTP; two modern HTTP clients that share one Coffer session and
/// both use the SDK's first progress token at once each get only their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_reaches_the_caller_on_both_transports_in_both_eras() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    patient_lists(&api).await?;
    register_everything(&api, "everything").await?;
    let clients = [
        ("1.x shim", PyClient::through_shim(&home, &[]).await?),
        ("1.x http", PyClient::over_http(&home, &api, Sdk::V1, &[]).await?),
        ("2.x shim", PyClient::through_shim_with(&home, Sdk::V2, &[]).await?),
        ("2.x http", PyClient::over_http(&home, &api, Sdk::V2, &["--mode", "auto"]).await?),
    ];
    let mut eras = Vec::new();
    for (who, mut c) in clients {
        eras.push(c.protocol_version().to_owned());
        let r = c.op(long_operation(4)).await.with_context(|| who.to_owned())?;
        ensure!(texts(&r["result"]).contains("Steps: 4"), "{who}: {r}");
        assert_eq!(progress_of(&c), [1.0, 2.0, 3.0, 4.0], "{who} ({}): {:?}", c.protocol_version(), c.events());
        c.close().await?;
    }
    ensure!(eras.contains(&"2025-11-25".to_owned()) && eras.contains(&"2026-07-28".to_owned()), "eras: {eras:?}");

    // Two modern clients with the same identity share a Coffer session; their tokens collide.
    let mut a = PyClient::over_http(&home, &api, Sdk::V2, &["--mode", "2026-07-28"]).await?;
    let mut b = PyClient::over_http(&home, &api, Sdk::V2, &["--mode", "2026-07-28"]).await?;
    a.send(long_operation(4)).await?;
    b.send(long_operation(2)).await?;
    let (ra, rb) = (a.recv().await?, b.recv().await?);
    ensure!(texts(&ra["result"]).contains("Steps: 4") && texts(&rb["result"]).contains("Steps: 2"), "{ra} {rb}");
    assert_eq!(progress_of(&a), [1.0, 2.0, 3.0, 4.0], "{:?}", a.events());
    assert_eq!(progress_of(&b), [1.0, 2.0], "{:?}", b.events());
    // They shared one session (so their tokens did collide): once the other clients' sessions
    // ended, one upstream process of the server is left.
    wait_for("one everything upstream (the two clients' shared session)", Duration::from_secs(15), || async {
        let status = api.status().await?;
        let running = status["upstreams"]
            .as_array()
            .and_then(|u| u.iter().find(|s| s["name"] == "everything"))
            .map(|e| e["running"].clone());
        Ok((running == Some(json!(1))).then_some(()))
    })
    .await?;
    a.close().await?;
    b.close().await?;
    home.terminate_daemon(Duration::from_secs(20)).await.context("processes left behind")
}

/// A call the client cancels gets no more progress (nor an answer) on the `/mcp` stream, and a
/// POST's SSE answer carries the call's progress before its response, with the client's token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_call_stops_its_progress_and_a_post_streams_progress_before_its_answer() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    register_everything(&api, "everything").await?;

    let mut s = McpStream::open(&api, LATEST).await?;
    s.send(&json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
        "name": "everything__trigger-long-running-operation", "arguments": {"duration": 10, "steps": 10},
        "_meta": {"progressToken": 42}}}))
        .await?;
    let first = s.notification("notifications/progress", Duration::from_secs(20)).await?;
    assert_eq!(first["params"]["progressToken"], 42, "the client's own token: {first}");
    assert_eq!(first["params"]["progress"], 1, "{first}");
    s.notify("notifications/cancelled", Some(json!({"requestId": 7, "reason": "enough"}))).await?;
    // Once a later request was answered, the cancel was handled: nothing more of call 7 comes
    // (the server goes on sending progress every second, and would answer in 9 s).
    s.ping().await?;
    s.skipped.clear();
    let quiet = tokio::time::timeout(Duration::from_millis(2_500), s.recv()).await;
    ensure!(quiet.is_err(), "a message after the cancel: {quiet:?}");

    let http = McpSession::latest(&api).await?;
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "everything__trigger-long-running-operation", "arguments": {"duration": 1, "steps": 3},
        "_meta": {"progressToken": "mine"}}});
    let r = http.post_raw(body.to_string()).await?;
    let msgs = coffer_tests::mcp::messages(&r)?;
    let methods: Vec<&str> = msgs.iter().map(|m| m["method"].as_str().unwrap_or("response")).collect();
    assert_eq!(methods, ["notifications/progress", "notifications/progress", "notifications/progress", "response"]);
    ensure!(msgs[..3].iter().all(|m| m["params"]["progressToken"] == "mine"), "{msgs:?}");
    home.terminate_daemon(Duration::from_secs(20)).await.context("processes left behind")
}

/// `coffer__call_tool` carries the caller's request on (issue 36 §2): its `progressToken` reaches
/// the upstream and the progress comes back with the caller's token; cancelling the meta call
/// cancels the routed call at once. Each call through it is logged once, as the tool it called,
/// with the session's client and profile; a meta call whose own arguments are wrong is logged
/// as itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coffer_call_tool_carries_progress_and_cancellation_and_is_logged_once() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    register_tiny(&api, "tiny", json!({})).await?;
    let invocations = |target: &'static str| {
        let api = api.clone();
        async move {
            let v = api.get(&format!("/v1/invocations?target={target}")).reply().await?.ok_json()?;
            anyhow::Ok(v["items"].as_array().cloned().unwrap_or_default())
        }
    };

    let mut s = McpStream::open(&api, LATEST).await?;
    s.send(&json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
        "name": "coffer__call_tool", "arguments": {"name": "tiny__slow", "arguments": {"ms": 60_000}},
        "_meta": {"progressToken": "mine"}}}))
        .await?;
    let first = s.notification("notifications/progress", Duration::from_secs(20)).await?;
    assert_eq!(first["params"], json!({"progressToken": "mine", "progress": 0, "message": "started"}), "{first}");
    s.notify("notifications/cancelled", Some(json!({"requestId": 7, "reason": "enough"}))).await?;
    // The routed call ended as cancelled at once (the upstream would answer in a minute).
    let slow = wait_for("tiny__slow logged as cancelled", Duration::from_secs(10), || async {
        let items = invocations("tiny__slow").await?;
        Ok(items.into_iter().find(|i| i["outcome"] == "cancelled"))
    })
    .await?;
    assert_eq!(
        (&slow["server"], &slow["client"]["name"], &slow["profile"], &slow["actor"]),
        (&json!("tiny"), &json!("coffer-tests-stream"), &json!("default"), &json!("mcp")),
        "{slow}"
    );

    // A call that completes: the upstream's answer, one record.
    let r = s.tool("coffer__call_tool", json!({"name": "tiny__echo", "arguments": {"message": "once"}})).await?;
    ensure!(texts(&r["result"]) == "once", "{r}");
    let echo = wait_for("tiny__echo logged", Duration::from_secs(10), || async {
        let items = invocations("tiny__echo").await?;
        Ok((!items.is_empty()).then_some(items))
    })
    .await?;
    ensure!(echo.len() == 1 && echo[0]["outcome"] == "ok", "{echo:?}");
    // Wrong arguments of the meta call itself: the caller's mistake, logged as the meta call.
    let r = s.tool("coffer__call_tool", json!({"name": "tiny__echo", "arguments": "not an object"})).await?;
    ensure!(r["result"]["isError"] == true, "{r}");
    let meta = wait_for("coffer__call_tool logged as invalid", Duration::from_secs(10), || async {
        let items = invocations("coffer__call_tool").await?;
        Ok((!items.is_empty()).then_some(items))
    })
    .await?;
    ensure!(meta.len() == 1 && meta[0]["outcome"] == "invalid", "only the call that routed nothing: {meta:?}");
    ensure!(invocations("tiny__echo").await?.len() == 1, "the echo stays logged once");
    home.terminate_daemon(Duration::from_secs(20)).await.context("processes left behind")
}
