//! The MCP gateway end to end over `/mcp` (Streamable HTTP) with real upstream processes: the
//! pinned `server-everything` for correctness, our tiny upstream for volume and faults; also
//! `arguments: null`, oversized arguments to built-in tools, and which MCP client made each call.
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use coffer_tests::mcp::{
    McpSession, mcp_post, patient_lists, register_everything, register_tiny, register_tiny_with_timeout, wait_listed,
};
use coffer_tests::peers::texts;
use coffer_tests::{Api, SendExt, TestHome, procs, wait_for};
use serde_json::{Value, json};

/// Processes of our tiny upstream belonging to this home.
fn tiny_pids(home: &TestHome) -> Vec<i32> {
    home.processes().into_iter().filter(|p| p.name == "coffer-tiny-upstream").map(|p| p.pid).collect()
}

fn upstream_records(home: &TestHome) -> usize {
    home.pid_records().into_iter().filter(|r| r.kind == "upstream").count()
}

fn error_code(v: &Value) -> Option<i64> {
    v["error"]["code"].as_i64()
}

fn text_of(v: &Value) -> String {
    v["result"]["content"][0]["text"].as_str().unwrap_or_default().to_owned()
}

async fn invocations(api: &Api, query: &str) -> anyhow::Result<Vec<Value>> {
    let v = api.get(&format!("/v1/invocations?{query}")).reply().await?.ok_json()?;
    Ok(v["items"].as_array().cloned().unwrap_or_default())
}

#[tokio::test]
async fn everything_main_path_list_call_disable_and_log() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    register_everything(&api, "everything").await?;
    // The main path, not the first list's deadline (a slow start under load would leave the
    // first list without the server, which then arrives as list_changed).
    patient_lists(&api).await?;
    let s = McpSession::latest(&api).await?;
    let names = s.tool_names().await?;
    ensure!(names.contains(&"everything__echo".to_owned()), "{names:?}");
    ensure!(names.contains(&"coffer__search_tools".to_owned()), "{names:?}");
    ensure!(
        names.iter().all(|n| n.len() <= 51 && n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'))
    );

    // Verbatim: exactly what server-everything answers directly.
    let r = s.tool("everything__echo", json!({"message": "hello coffer"})).await?;
    assert_eq!(r["result"], json!({"content": [{"type": "text", "text": "Echo: hello coffer"}]}));

    // Built-in search finds it.
    let found = s.tool("coffer__search_tools", json!({"query": "echo"})).await?;
    ensure!(text_of(&found).contains("everything__echo"), "{found}");

    // Disable through REST: read-your-writes, absent from the list, refused with TOOL_DISABLED.
    let p = api
        .request(reqwest::Method::PATCH, "/v1/tools/everything__echo")
        .json(&json!({"enabled": false}))
        .reply()
        .await?;
    ensure!(p.status == 200, "{}", p.text);
    ensure!(!s.tool_names().await?.contains(&"everything__echo".to_owned()));
    let r = s.tool("everything__echo", json!({"message": "x"})).await?;
    assert_eq!(error_code(&r), Some(-32000), "{r}");
    assert_eq!(r["error"]["message"], "Tool everything__echo is disabled");
    assert_eq!(r["error"]["data"]["server"], "everything");

    // The invocation log has both calls (written in batches, so wait), never the arguments.
    let rows = wait_for("invocations to be written", Duration::from_secs(10), || async {
        let rows = invocations(&api, "target=everything__echo").await?;
        Ok((rows.len() >= 2).then_some(rows))
    })
    .await?;
    let outcomes: Vec<&str> = rows.iter().filter_map(|r| r["outcome"].as_str()).collect();
    ensure!(outcomes.contains(&"ok") && outcomes.contains(&"disabled"), "{outcomes:?}");
    ensure!(rows.iter().all(|r| r["session_id"] == s.id.as_str() && r["server"] == "everything"));
    ensure!(!serde_json::to_string(&rows)?.contains("hello coffer"), "arguments never stored");
    // An MCP client session's calls are recorded as actor `mcp`, and the log filters on it.
    ensure!(rows.iter().all(|r| r["actor"] == "mcp"), "{rows:?}");
    ensure!(invocations(&api, "target=everything__echo&actor=mcp").await?.len() == rows.len());
    ensure!(invocations(&api, "actor=agent").await?.is_empty());

    // Re-enable: works again.
    api.request(reqwest::Method::PATCH, "/v1/tools/everything__echo").json(&json!({"enabled": true})).reply().await?;
    assert_eq!(text_of(&s.tool("everything__echo", json!({"message": "back"})).await?), "Echo: back");
    Ok(())
}

/// A disabled tool is refused in a session that never listed, without starting its upstream
/// (the exposed name `<server>__<original>` names the capability the policy holds).
#[tokio::test]
async fn disabled_tool_is_refused_before_any_upstream_contact() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    register_tiny(&api, "tiny", json!({})).await?;
    // The catalog's own background start of the new server ends first: what is counted below
    // is what the preference and the session start.
    wait_listed(&api, "tiny").await?;
    let r = api
        .request(reqwest::Method::PUT, "/v1/mcp/servers/tiny/capabilities/tools/echo")
        .json(&json!({"enabled": false}))
        .reply()
        .await?;
    ensure!(r.status.is_success(), "{} {}", r.status, r.text);
    ensure!(tiny_pids(&home).is_empty(), "setting the preference started nothing");
    let s = McpSession::latest(&api).await?;
    let r = s.tool("tiny__echo", json!({"message": "x"})).await?;
    assert_eq!(error_code(&r), Some(-32000), "{r}");
    assert_eq!(r["error"]["data"]["code"], "TOOL_DISABLED", "{r}");
    ensure!(tiny_pids(&home).is_empty(), "no upstream was started for a disabled tool");
    // An enabled tool of the same server still works (and starts the upstream).
    let r = s.tool("tiny__add", json!({"a": 1, "b": 2})).await?;
    ensure!(r.get("result").is_some(), "{r}");
    Ok(())
}

#[tokio::test]
async fn disabled_server_is_refused_before_any_upstream_contact() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    register_tiny(&api, "tiny", json!({})).await?;
    wait_listed(&api, "tiny").await?;
    api.request(reqwest::Method::PATCH, "/v1/mcp/servers/tiny").json(&json!({"enabled": false})).reply().await?;
    let s = McpSession::latest(&api).await?;
    let r = s.tool("tiny__echo", json!({"message": "x"})).await?;
    assert_eq!(error_code(&r), Some(-32000), "{r}");
    ensure!(tiny_pids(&home).is_empty(), "no upstream was started for a disabled server");
    ensure!(!s.tool_names().await?.iter().any(|n| n.starts_with("tiny__")));
    ensure!(tiny_pids(&home).is_empty());
    Ok(())
}

#[tokio::test]
async fn protocol_errors_are_structured_and_the_session_survives() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    register_tiny(&api, "tiny", json!({})).await?;
    let s = McpSession::latest(&api).await?;

    let r = s.post_raw("{not json".into()).await?;
    ensure!(r.status == 400 && error_code(&r.json()?) == Some(-32700), "malformed: {} {}", r.status, r.text);
    let r = s.post_raw(json!({"id": 5, "method": "ping"}).to_string()).await?;
    ensure!(r.status == 400 && error_code(&r.json()?) == Some(-32600), "missing jsonrpc: {}", r.text);
    // A member given twice: valid JSON, not a valid request; answered with its id.
    let r = s.post_raw(r#"{"jsonrpc":"2.0","id":9,"method":"ping","params":{},"params":{}}"#.into()).await?;
    let body = r.json()?;
    ensure!(r.status == 400 && error_code(&body) == Some(-32600) && body["id"] == 9, "duplicate member: {}", r.text);
    let r = s.post_raw(json!({"jsonrpc": "2.0", "id": 6, "method": 42}).to_string()).await?;
    ensure!(r.status == 400 && error_code(&r.json()?) == Some(-32600), "non-string method: {}", r.text);
    let r = s.post_raw(json!({"jsonrpc": "2.0", "id": null, "method": "tools/list"}).to_string()).await?;
    ensure!(r.status == 400 && error_code(&r.json()?) == Some(-32600), "null id: {} {}", r.status, r.text);
    let r = s.post_raw(r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#.into()).await?;
    ensure!(r.status == 400 && r.text.contains("batch"), "batch on {}: {}", s.version, r.text);
    let r = s.tool("nounderscore", json!({})).await?;
    assert_eq!(error_code(&r), Some(-32602), "{r}");
    let r = s.tool("ghost__echo", json!({})).await?;
    assert_eq!(error_code(&r), Some(-32602), "{r}");
    ensure!(r["error"]["message"].as_str().unwrap_or_default().contains("ghost"));
    let r = s.request("no/such/method", json!({})).await?;
    assert_eq!(error_code(&r), Some(-32601), "{r}");
    let r = mcp_post(&api, Some(&s.id), json!({"jsonrpc": "2.0", "id": 1, "method": "ping"}).to_string())
        .header("MCP-Protocol-Version", "1999-01-01")
        .reply()
        .await?;
    ensure!(r.status == 400, "unsupported version header: {}", r.status);

    // No session: tools/call before initialize, an unknown session id (e.g. from another run).
    let r = mcp_post(
        &api,
        None,
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "tiny__echo"}}).to_string(),
    )
    .reply()
    .await?;
    ensure!(r.status == 400 && r.json()?["error"].is_object(), "before initialize: {} {}", r.status, r.text);
    let r = mcp_post(
        &api,
        Some("0123456789abcdef0123456789abcdef"),
        json!({"jsonrpc": "2.0", "id": 1, "method": "ping"}).to_string(),
    )
    .reply()
    .await?;
    ensure!(r.status == 404 && r.json()?["error"].is_object(), "unknown session: {} {}", r.status, r.text);
    // The sessionless 2026-07-28 probe falls back.
    let r =
        mcp_post(&api, None, json!({"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {}}).to_string())
            .reply()
            .await?;
    assert_eq!(error_code(&r.json()?), Some(-32601), "{}", r.text);

    // After all that, the session still works.
    assert_eq!(text_of(&s.tool("tiny__echo", json!({"message": "still here"})).await?), "still here");
    Ok(())
}

#[tokio::test]
async fn batches_only_on_2025_03_26_sessions() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    register_tiny(&api, "tiny", json!({})).await?;
    let old = McpSession::open(&api, "2025-03-26", json!({})).await?;
    assert_eq!(old.version, "2025-03-26");
    let batch = json!([
        {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "tiny__echo", "arguments": {"message": "a"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "tiny__echo", "arguments": {"message": "b"}}}
    ]);
    let r = old.post_raw(batch.to_string()).await?;
    let arr = r.json()?;
    let arr = arr.as_array().context("batch answer is an array")?;
    assert_eq!(arr.len(), 2, "one answer per request: {arr:?}");
    let mid = McpSession::open(&api, "2025-06-18", json!({})).await?;
    let r = mid.post_raw(batch.to_string()).await?;
    ensure!(r.status == 400 && r.text.contains("2025-06-18"), "{}", r.text);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_arguments_concurrency_and_many_sessions() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    register_tiny(&api, "tiny", json!({})).await?;
    let s = McpSession::latest(&api).await?;

    // A 10 MB argument goes through (and comes back).
    let big = "z".repeat(10 * 1024 * 1024);
    let r = s.tool("tiny__echo", json!({"message": big})).await?;
    ensure!(text_of(&r).len() == big.len(), "10 MB round trip");

    // 50 concurrent calls on one session, each answered to its caller.
    let mut calls = Vec::new();
    for i in 0..50 {
        let s = s.clone();
        calls.push(tokio::spawn(async move {
            let msg = format!("call-{i}");
            let r = s.tool("tiny__echo", json!({"message": msg})).await?;
            ensure!(text_of(&r) == msg, "call {i} got {r}");
            anyhow::Ok(())
        }));
    }
    for c in calls {
        c.await??;
    }

    // 20 sessions at once, each with its own upstream child.
    let mut sessions = Vec::new();
    for i in 0..20 {
        let api = api.clone();
        sessions.push(tokio::spawn(async move {
            let s = McpSession::latest(&api).await?;
            let r = s.tool("tiny__whoami", json!({})).await?;
            let who: Value = serde_json::from_str(&text_of(&r))?;
            ensure!(who["coffer_vars"] == 0, "upstream sees no COFFER_* variable: {who}");
            let msg = format!("s{i}");
            ensure!(text_of(&s.tool("tiny__echo", json!({"message": msg})).await?) == msg);
            anyhow::Ok((s, who["pid"].as_i64().unwrap_or(0)))
        }));
    }
    let mut pids = std::collections::HashSet::new();
    let mut opened = Vec::new();
    for t in sessions {
        let (s, pid) = t.await??;
        pids.insert(pid);
        opened.push(s);
    }
    assert_eq!(pids.len(), 20, "two sessions never share an upstream");
    for s in opened {
        assert_eq!(s.delete().await?, 204);
    }
    Ok(())
}

#[tokio::test]
async fn session_end_reaps_upstreams_and_pid_records() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    register_tiny(&api, "tiny", json!({})).await?;
    coffer_tests::mcp::wait_listed(&api, "tiny").await?;
    let s = McpSession::latest(&api).await?;
    ensure!(tiny_pids(&home).is_empty(), "upstreams start lazily, not at initialize");
    s.tool_names().await?;
    ensure!(tiny_pids(&home).is_empty(), "a list is answered from the capability catalog");
    assert_eq!(text_of(&s.tool("tiny__echo", json!({"message": "up"})).await?), "up");
    assert_eq!(tiny_pids(&home).len(), 1);
    assert_eq!(upstream_records(&home), 1);
    assert_eq!(s.delete().await?, 204);
    wait_for("the upstream to be reaped", Duration::from_secs(10), || async {
        Ok((tiny_pids(&home).is_empty() && upstream_records(&home) == 0).then_some(()))
    })
    .await?;
    let r = s.request("ping", json!({})).await;
    ensure!(r.is_err() || r.as_ref().is_ok_and(|v| v["error"].is_object()), "ended session is gone");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_crash_mid_call_fails_fast_and_the_next_call_restarts_it() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    register_tiny(&api, "tiny", json!({})).await?;
    let s = McpSession::latest(&api).await?;
    assert_eq!(text_of(&s.tool("tiny__echo", json!({"message": "up"})).await?), "up");
    let slow = {
        let s = s.clone();
        tokio::spawn(async move { s.tool("tiny__slow", json!({"ms": 20000})).await })
    };
    // Make sure the slow call is in flight (the upstream logged its start), then crash it.
    home.wait_for_upstream_log("tiny", "slow 20000 started", 1, Duration::from_secs(10)).await?;
    let started = Instant::now();
    let crash = s.tool("tiny__crash", json!({})).await?;
    assert_eq!(error_code(&crash), Some(-32001), "{crash}");
    let r = slow.await??;
    assert_eq!(error_code(&r), Some(-32001), "in-flight call fails at once: {r}");
    ensure!(started.elapsed() < Duration::from_secs(5), "no hang: {:?}", started.elapsed());
    assert_eq!(text_of(&s.tool("tiny__echo", json!({"message": "again"})).await?), "again", "restarted");
    let status = api.status().await?;
    ensure!(status["upstreams"].as_array().is_some_and(|u| u.iter().any(|x| x["name"] == "tiny")), "{status}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_call_timeout_gives_32002_and_other_calls_proceed() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    register_tiny_with_timeout(&api, "tiny", 500).await?;
    let s = McpSession::latest(&api).await?;
    let slow = {
        let s = s.clone();
        tokio::spawn(async move { s.tool("tiny__slow", json!({"ms": 10000})).await })
    };
    assert_eq!(text_of(&s.tool("tiny__echo", json!({"message": "meanwhile"})).await?), "meanwhile");
    let r = slow.await??;
    assert_eq!(error_code(&r), Some(-32002), "{r}");
    assert_eq!(text_of(&s.tool("tiny__echo", json!({"message": "after"})).await?), "after");
    Ok(())
}

#[tokio::test]
async fn upstream_errors_are_forwarded_unchanged() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    register_tiny(&api, "tiny", json!({})).await?;
    let s = McpSession::latest(&api).await?;
    let r = s.tool("tiny__fail", json!({})).await?;
    assert_eq!(r["result"], json!({"content": [{"type": "text", "text": "it failed"}], "isError": true}));
    let r = s.tool("tiny__rpc_error", json!({})).await?;
    assert_eq!(r["error"], json!({"code": -32603, "message": "tiny internal error", "data": {"why": "asked to"}}));
    Ok(())
}

#[tokio::test]
async fn noisy_stderr_and_banner_lines_never_stall_an_upstream() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let tiny = coffer_tests::bin("coffer-tiny-upstream")?;
    coffer_tests::mcp::register_stdio(&api, "tiny", &tiny, &["--banner".into()], json!({})).await?;
    let s = McpSession::latest(&api).await?;
    let r = s.tool("tiny__stderr", json!({"lines": 100000})).await?;
    assert_eq!(text_of(&r), "wrote 100000 lines");
    let log = home.root().join("logs/upstreams/tiny.log");
    wait_for("the stderr log to fill", Duration::from_secs(10), || async {
        Ok(std::fs::metadata(&log).is_ok_and(|m| m.len() > 1_000_000).then_some(()))
    })
    .await?;
    assert_eq!(text_of(&s.tool("tiny__echo", json!({"message": "ok"})).await?), "ok");
    Ok(())
}

#[tokio::test]
async fn resources_are_namespaced_reversibly() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    register_everything(&api, "everything").await?;
    register_tiny(&api, "tiny", json!({})).await?;
    let s = McpSession::latest(&api).await?;
    // A list answers with what is ready within the first-list deadline and a server that starts
    // later arrives with `list_changed` (the session model): on a loaded machine server-everything
    // (node) may take longer than that to start, so list again until both servers are in it.
    let uris: Vec<String> = wait_for("both servers' resources listed", Duration::from_secs(30), || async {
        let list = s.call("resources/list", json!({})).await?;
        let uris: Vec<String> = list["resources"]
            .as_array()
            .context("resources")?
            .iter()
            .filter_map(|r| r["uri"].as_str().map(str::to_owned))
            .collect();
        Ok(uris.iter().any(|u| u.starts_with("coffer://everything/")).then_some(uris))
    })
    .await?;
    ensure!(uris.iter().any(|u| u == "coffer://tiny/tiny://doc/1"), "{uris:?}");
    let ev = uris.iter().find(|u| u.starts_with("coffer://everything/")).context("an everything resource")?;
    let read = s.call("resources/read", json!({"uri": ev})).await?;
    assert_eq!(read["contents"][0]["uri"].as_str(), Some(ev.as_str()), "contents[].uri exposed");
    let templates = s.call("resources/templates/list", json!({})).await?;
    ensure!(
        templates["resourceTemplates"]
            .as_array()
            .is_some_and(|t| t.iter().all(|x| x["uriTemplate"].as_str().is_some_and(|u| u.starts_with("coffer://"))))
    );
    // Bad URIs: unknown server, another server's URI under the wrong prefix, unprefixed unknown.
    for bad in ["coffer://ghost/x", "coffer://tiny/demo://resource/static/document/architecture.md", "demo://nothing"] {
        let r = s.request("resources/read", json!({"uri": bad})).await?;
        ensure!(r["error"].is_object(), "{bad}: {r}");
    }
    let r = s.request("resources/subscribe", json!({"uri": "coffer://ghost/x"})).await?;
    assert_eq!(error_code(&r), Some(-32602));
    // A resource link returned in a tool result can be read unprefixed.
    let links = s.tool("everything__get-resource-links", json!({"count": 1})).await?;
    let link = links["result"]["content"]
        .as_array()
        .and_then(|c| c.iter().find(|b| b["type"] == "resource_link"))
        .context("a link")?;
    let read = s.call("resources/read", json!({"uri": link["uri"]})).await?;
    ensure!(read["contents"].as_array().is_some_and(|c| !c.is_empty()), "{read}");
    Ok(())
}

#[tokio::test]
async fn prompts_and_completions_route_by_exposed_name() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    // The first lists must hold the upstream however long node takes to start (a loaded machine).
    patient_lists(&api).await?;
    register_everything(&api, "everything").await?;
    let s = McpSession::latest(&api).await?;
    let prompts = s.call("prompts/list", json!({})).await?;
    ensure!(
        prompts["prompts"].as_array().is_some_and(|p| p.iter().any(|x| x["name"] == "everything__simple-prompt")),
        "{prompts}"
    );
    let got = s.call("prompts/get", json!({"name": "everything__simple-prompt"})).await?;
    ensure!(got["messages"].as_array().is_some_and(|m| !m.is_empty()));
    let c = s
        .call("completion/complete", json!({"ref": {"type": "ref/prompt", "name": "everything__completable-prompt"}, "argument": {"name": "department", "value": "E"}}))
        .await?;
    ensure!(c["completion"]["values"].as_array().is_some_and(|v| v.iter().any(|x| x == "Engineering")), "{c}");
    assert_eq!(s.call("logging/setLevel", json!({"level": "debug"})).await?, json!({}));
    Ok(())
}

#[tokio::test]
async fn five_hundred_session_cycles_leave_nothing_behind() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    register_tiny(&api, "tiny", json!({})).await?;
    for i in 0..500 {
        let s = McpSession::latest(&api).await?;
        let r = s.tool("tiny__echo", json!({"message": i.to_string()})).await?;
        ensure!(text_of(&r) == i.to_string(), "cycle {i}: {r}");
        ensure!(s.delete().await? == 204, "cycle {i}");
    }
    wait_for("every upstream of 500 sessions to be reaped", Duration::from_secs(30), || async {
        Ok((tiny_pids(&home).is_empty() && upstream_records(&home) == 0).then_some(()))
    })
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_sessions_three_upstreams_interleaved_and_a_kill_under_load() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    for n in ["ta", "tb", "tc"] {
        register_tiny(&api, n, json!({})).await?;
    }
    let mut sessions = Vec::new();
    for _ in 0..20 {
        sessions.push(McpSession::latest(&api).await?);
    }
    // Every session calls every upstream, interleaved; each answer reaches its caller.
    let mut tasks = Vec::new();
    for (i, s) in sessions.iter().enumerate() {
        for n in ["ta", "tb", "tc"] {
            let s = s.clone();
            tasks.push(tokio::spawn(async move {
                for k in 0..5 {
                    let msg = format!("{i}-{n}-{k}");
                    let r = s.tool(&format!("{n}__echo"), json!({"message": msg})).await?;
                    ensure!(text_of(&r) == msg, "{msg} got {r}");
                }
                anyhow::Ok(())
            }));
        }
    }
    for t in tasks {
        t.await??;
    }
    // Kill one session's `ta` child under load: only that session's calls to `ta` fail.
    let victim = &sessions[0];
    let who: Value = serde_json::from_str(&text_of(&victim.tool("ta__whoami", json!({})).await?))?;
    let pid = who["pid"].as_i64().context("pid")? as i32;
    let in_flight = {
        let v = victim.clone();
        tokio::spawn(async move { v.tool("ta__slow", json!({"ms": 20000})).await })
    };
    let others: Vec<_> = sessions[1..]
        .iter()
        .map(|s| {
            let s = s.clone();
            tokio::spawn(async move { s.tool("ta__slow", json!({"ms": 300})).await })
        })
        .collect();
    // The slow call is in flight once the upstream logged its start.
    home.wait_for_upstream_log("ta", "slow 20000 started", 1, Duration::from_secs(10)).await?;
    procs::signal(pid, nix::sys::signal::Signal::SIGKILL);
    let r = in_flight.await??;
    assert_eq!(error_code(&r), Some(-32001), "the victim's in-flight call: {r}");
    for o in others {
        let r = o.await??;
        assert_eq!(text_of(&r), "slept 300 ms", "other sessions unaffected: {r}");
    }
    assert_eq!(text_of(&victim.tool("tb__echo", json!({"message": "fine"})).await?), "fine");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misbehaving_upstreams_and_odd_client_messages() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    register_tiny(&api, "tiny", json!({})).await?;
    let s = McpSession::latest(&api).await?;

    // An upstream that answers one request twice: the first answer wins, the session goes on.
    assert_eq!(text_of(&s.tool("tiny__twice", json!({})).await?), "first");
    assert_eq!(text_of(&s.tool("tiny__echo", json!({"message": "next"})).await?), "next");

    // An upstream request the client cannot answer (no sampling capability declared): the
    // upstream gets an error at once, so the call completes instead of hanging.
    let r = s.tool("tiny__sample", json!({})).await?;
    ensure!(text_of(&r).contains("sampling"), "upstream saw an error naming the capability: {r}");

    // A cancel for an unknown request id is accepted and ignored.
    let r = s
        .post_raw(
            json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 424242}}).to_string(),
        )
        .await?;
    assert_eq!(r.status, 202);

    // A client cancel reaches the upstream with the upstream's own request id.
    let slow = {
        let s = s.clone();
        tokio::spawn(async move {
            s.post_raw(json!({"jsonrpc": "2.0", "id": "slow-1", "method": "tools/call", "params": {"name": "tiny__slow", "arguments": {"ms": 20000}}}).to_string())
                .await
        })
    };
    home.wait_for_upstream_log("tiny", "slow 20000 started", 1, Duration::from_secs(10)).await?;
    let started = Instant::now();
    let r = s.post_raw(json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "slow-1", "reason": "user"}}).to_string()).await?;
    assert_eq!(r.status, 202);
    home.wait_for_upstream_log("tiny", "cancelled ", 1, Duration::from_secs(10)).await?;
    let answer = slow.await??;
    ensure!(started.elapsed() < Duration::from_secs(10), "the cancelled call ends promptly");
    ensure!(answer.json()?["error"].is_object(), "{}", answer.text);
    assert_eq!(text_of(&s.tool("tiny__echo", json!({"message": "alive"})).await?), "alive");
    Ok(())
}

#[tokio::test]
async fn a_hung_upstream_never_delays_calls_to_other_servers() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    register_tiny(&api, "tiny", json!({})).await?;
    // Listing is given up on after 500 ms (for the catalog's background start of it too).
    api.request(reqwest::Method::PATCH, "/v1/settings")
        .json(&json!({"set": {"gateway.list_timeout_ms": "500"}}))
        .reply()
        .await?;
    // A server that never answers initialize.
    let sleep = coffer_runtime::connect::which_on_path("sleep").context("sleep")?;
    coffer_tests::mcp::register_stdio(&api, "hang", &sleep, &["1000".into()], json!({})).await?;
    let s = McpSession::latest(&api).await?;
    let started = Instant::now();
    assert_eq!(text_of(&s.tool("tiny__echo", json!({"message": "quick"})).await?), "quick");
    ensure!(started.elapsed() < Duration::from_secs(3), "call took {:?}", started.elapsed());
    // The hung one is left out of lists, and shown in status once listing it was given up on.
    let s2 = McpSession::latest(&api).await?;
    let names = s2.tool_names().await?;
    ensure!(names.contains(&"tiny__echo".to_owned()) && !names.iter().any(|n| n.starts_with("hang__")), "{names:?}");
    let hang = wait_for("the hung server in status", Duration::from_secs(10), || async {
        let status = api.status().await?;
        let hang = status["upstreams"].as_array().and_then(|u| u.iter().find(|x| x["name"] == "hang")).cloned();
        Ok(hang.filter(|h| h["state"] != "ok"))
    })
    .await?;
    assert_eq!(hang["state"], "unhealthy", "{hang}");
    assert_eq!(hang["catalog"]["state"], "failed", "{hang}");
    Ok(())
}

/// `se.slice` (ns) of `pid` from `/proc/<pid>/sched` (Linux 6.6+), `None` when not shown.
fn sched_slice_ns(pid: i64) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/sched")).ok()?;
    text.lines().find(|l| l.starts_with("se.slice"))?.split(':').nth(1)?.trim().parse().ok()
}

#[tokio::test]
async fn relays_ask_for_the_configured_time_slice_and_upstreams_inherit_it() -> anyhow::Result<()> {
    let mut home = TestHome::new()?;
    home.set_env("COFFER_SCHED_SLICE_US", "250");
    let api = home.start_daemon().await?;
    let gateway = api.service("gateway").await?["pid"].as_i64().context("gateway pid")?;
    let store = api.service("store").await?["pid"].as_i64().context("store pid")?;
    if sched_slice_ns(gateway).is_none() {
        eprintln!("this kernel does not show se.slice in /proc/<pid>/sched; nothing to check");
        return Ok(());
    }
    register_tiny(&api, "tiny", json!({})).await?;
    coffer_tests::mcp::wait_listed(&api, "tiny").await?;
    let s = McpSession::latest(&api).await?;
    ensure!(s.tool_names().await?.iter().any(|n| n.starts_with("tiny__")), "the tiny upstream listed no tools");
    // A call starts the session's own upstream (lists come from the capability catalog).
    assert_eq!(text_of(&s.tool("tiny__echo", json!({"message": "up"})).await?), "up");
    let upstream = *tiny_pids(&home).first().context("the tiny upstream's process")?;
    // The gateway relays calls and its upstream children inherit the request; the store is
    // not on the call path and keeps the kernel's default.
    assert_eq!(sched_slice_ns(gateway), Some(250_000), "gateway");
    assert_eq!(sched_slice_ns(i64::from(upstream)), Some(250_000), "upstream child");
    assert_ne!(sched_slice_ns(store), Some(250_000), "store");
    Ok(())
}

/// Name and nice value of every thread of `pid` (`/proc/<pid>/task/*/stat`: the name in
/// parentheses, the nice value in field 19).
fn thread_nice_values(pid: i64) -> anyhow::Result<Vec<(String, i32)>> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let stat = std::fs::read_to_string(task?.path().join("stat"))?;
        let (open, close) = (stat.find('(').context("comm")?, stat.rfind(')').context("comm")?);
        let nice = stat[close + 2..].split(' ').nth(16).context("nice field")?.parse()?;
        out.push((stat[open + 1..close].to_owned(), nice));
    }
    Ok(out)
}

/// The store is a background service: every one of its threads runs at nice 10 by default, at
/// `COFFER_BACKGROUND_NICE` when set (`0`: as started), and at the default with a warning in its
/// log for a value that is not a number. So does the gateway's invocation-log writer thread;
/// the gateway's other threads, which relay calls, stay at 0.
#[tokio::test]
async fn the_store_and_the_invocation_writer_run_in_the_background_and_the_relays_do_not() -> anyhow::Result<()> {
    for (value, want) in [(None, 10), (Some("0"), 0), (Some("15"), 15), (Some("soon"), 10), (Some("40"), 19)] {
        let mut home = TestHome::new()?;
        if let Some(v) = value {
            home.set_env("COFFER_BACKGROUND_NICE", v);
        }
        let api = home.start_daemon().await?;
        let store = api.service("store").await?["pid"].as_i64().context("store pid")?;
        let gateway = api.service("gateway").await?["pid"].as_i64().context("gateway pid")?;
        let nice = thread_nice_values(store)?;
        ensure!(!nice.is_empty() && nice.iter().all(|(_, n)| *n == want), "store threads with {value:?}: {nice:?}");
        let threads = thread_nice_values(gateway)?;
        let (writer, relays): (Vec<_>, Vec<_>) = threads.iter().partition(|(name, _)| name == "invocation-log");
        ensure!(writer.len() == 1 && writer[0].1 == want, "invocation writer with {value:?}: {threads:?}");
        ensure!(
            !relays.is_empty() && relays.iter().all(|(_, n)| *n == 0),
            "gateway threads with {value:?}: {threads:?}"
        );
        let warning = match value {
            Some("soon") => {
                Some(r#"COFFER_BACKGROUND_NICE="soon" is not a whole number from 0 to 19; using the default of 10"#)
            }
            Some("40") => Some(r#"COFFER_BACKGROUND_NICE="40" is above 19, the nicest value; using 19"#),
            _ => None,
        };
        if let Some(warning) = warning {
            let log = home.log_text("store");
            ensure!(log.contains(warning), "no warning {warning:?} in the store log: {log}");
        }
        home.terminate_daemon(Duration::from_secs(30)).await?;
    }
    Ok(())
}

#[tokio::test]
async fn invocations_with_huge_targets_are_all_recorded_cut_short() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    register_everything(&api, "everything").await?;
    let s = std::sync::Arc::new(McpSession::latest(&api).await?);
    // 450 reads of a 100 KB URI: 45 MB of targets, more than one store request may carry if
    // they were kept whole; every one of them must still be recorded.
    let uri = format!("coffer://everything/demo://resource/{}", "x".repeat(100_000));
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let (s, uri) = (s.clone(), uri.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..75 {
                let r = s.request("resources/read", json!({"uri": uri})).await?;
                ensure!(r.get("result").is_some() || r.get("error").is_some(), "{r}");
            }
            Ok::<_, anyhow::Error>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let cut = format!("{}…", &uri[..1024 - '…'.len_utf8()]);
    let rows = wait_for("450 invocation records", Duration::from_secs(20), || async {
        let rows = invocations(&api, &format!("target={}&limit=500", urlencode(&cut))).await?;
        Ok((rows.len() >= 450).then_some(rows))
    })
    .await?;
    assert_eq!(rows.len(), 450);
    ensure!(rows.iter().all(|r| r["method"] == "resources/read" && r["server"] == "everything"), "{:?}", rows[0]);
    // The daemon keeps serving.
    let r = s.tool("everything__echo", json!({"message": "still here"})).await?;
    assert_eq!(text_of(&r), "Echo: still here");
    Ok(())
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[tokio::test]
async fn huge_unknown_names_neither_bloat_errors_nor_push_records_out_of_the_log() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    register_tiny(&api, "tiny", json!({})).await?;
    let s = McpSession::latest(&api).await?;
    // A 1 MiB "server" part: no such server, and nothing of it may reach the store whole.
    let huge = format!("{}__echo", "d".repeat(1 << 20));
    for i in 0..20 {
        let r = s.tool("tiny__echo", json!({"message": format!("m{i}")})).await?;
        assert_eq!(text_of(&r), format!("m{i}"));
        let r = s.tool(&huge, json!({})).await?;
        assert_eq!(error_code(&r), Some(-32602), "{}", &r.to_string()[..200]);
        let message = r["error"]["message"].as_str().unwrap_or_default();
        ensure!(
            message.len() < 200 && message.contains("at most 64 characters"),
            "{}",
            &message[..message.len().min(300)]
        );
    }
    // Every record, the refused calls' too: the last of them may come in the batch after the
    // last echo's (batches are cut by time), so wait for all 40, not for the echoes alone.
    let all = wait_for("40 invocation records", Duration::from_secs(20), || async {
        let rows = invocations(&api, "limit=100").await?;
        Ok((rows.len() >= 40).then_some(rows))
    })
    .await?;
    let rows = invocations(&api, "target=tiny__echo").await?;
    assert_eq!(rows.len(), 20);
    let long: Vec<&Value> = all.iter().filter(|r| r["target"] != "tiny__echo").collect();
    assert_eq!(long.len(), 20, "the refused calls are recorded too");
    ensure!(long.iter().all(|r| r["server"].as_str().is_some_and(|s| s.len() <= 128)), "{:?}", long[0]["server"]);
    Ok(())
}

/// An upstream that sends nothing at all for a whole call timeout is wedged: the call gets
/// -32002, and the next call runs on a fresh upstream instead of timing out behind it.
#[tokio::test]
async fn a_wedged_upstream_is_replaced_after_a_silent_timeout() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    register_tiny_with_timeout(&api, "tiny", 500).await?;
    // The catalog's background start of it has ended (and its process with it), so the only
    // tiny process below is the session's.
    wait_listed(&api, "tiny").await?;
    let s = McpSession::latest(&api).await?;
    assert_eq!(text_of(&s.tool("tiny__echo", json!({"message": "before"})).await?), "before");
    let first = tiny_pids(&home);
    ensure!(first.len() == 1, "{first:?}");
    let r = s.tool("tiny__slow", json!({"ms": 60000, "wedge": true})).await?;
    assert_eq!(error_code(&r), Some(-32002), "{r}");
    let started = Instant::now();
    assert_eq!(text_of(&s.tool("tiny__echo", json!({"message": "after"})).await?), "after");
    ensure!(started.elapsed() < Duration::from_secs(5), "the next call did not wait behind the wedged upstream");
    wait_for("the wedged upstream to be reaped", Duration::from_secs(10), || async {
        let now = tiny_pids(&home);
        Ok((now.len() == 1 && now != first).then_some(()))
    })
    .await?;
    Ok(())
}

/// The next SSE event with an id on `resp`: `(id, data)` (comments and keep-alives skipped).
async fn next_sse_event(resp: &mut reqwest::Response, buf: &mut String) -> anyhow::Result<(u64, Value)> {
    loop {
        while let Some(end) = buf.find("\n\n") {
            let block: String = buf.drain(..end + 2).collect();
            let id = block.lines().find_map(|l| l.strip_prefix("id:")).map(|v| v.trim().parse::<u64>());
            let data: String = block.lines().filter_map(|l| l.strip_prefix("data:")).map(str::trim).collect();
            if let Some(id) = id {
                return Ok((id?, serde_json::from_str(&data).with_context(|| format!("event data: {data}"))?));
            }
        }
        let chunk = tokio::time::timeout(Duration::from_secs(10), resp.chunk())
            .await
            .context("no SSE event within 10 s")??
            .context("the SSE stream ended")?;
        buf.push_str(&String::from_utf8_lossy(&chunk));
    }
}

/// The session's GET stream carries event ids, and a new GET with `Last-Event-ID` gets what
/// was sent after that id while no stream was open, and nothing from before it.
#[tokio::test]
async fn the_get_stream_resumes_after_last_event_id() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    register_tiny(&api, "tiny", json!({})).await?;
    let s = McpSession::latest(&api).await?;
    ensure!(s.tool_names().await?.contains(&"tiny__echo".to_owned()));
    let open = |last: Option<u64>| {
        let mut r = api
            .get("/mcp")
            .header("Accept", "text/event-stream")
            .header("Mcp-Session-Id", &s.id)
            .header("MCP-Protocol-Version", &s.version);
        if let Some(last) = last {
            r = r.header("Last-Event-ID", last.to_string());
        }
        r.send()
    };
    let mut first = open(None).await?;
    ensure!(first.status() == 200, "GET /mcp: {}", first.status());
    coffer_tests::mcp::set_tool_enabled(&api, "tiny__echo", false).await?;
    let mut buf = String::new();
    let (seen, msg) = next_sse_event(&mut first, &mut buf).await?;
    assert_eq!(msg["method"], "notifications/tools/list_changed", "{msg}");
    drop(first);

    // Sent while no stream is open: kept for the next GET that names the last id it saw.
    coffer_tests::mcp::set_tool_enabled(&api, "tiny__echo", true).await?;
    let mut resumed = open(Some(seen)).await?;
    let mut buf = String::new();
    // Each change announces tools and prompts; the replay starts right after `seen` and goes on
    // in order up to the second change's tools/list_changed.
    let mut ids = Vec::new();
    loop {
        let (id, msg) = next_sse_event(&mut resumed, &mut buf).await?;
        ensure!(msg["method"].as_str().is_some_and(|m| m.ends_with("/list_changed")), "{msg}");
        ids.push(id);
        if msg["method"] == "notifications/tools/list_changed" {
            break;
        }
    }
    assert_eq!(ids[0], seen + 1, "the replay starts right after the last id seen: {ids:?}");
    ensure!(ids.windows(2).all(|w| w[1] == w[0] + 1), "in order, none skipped: {ids:?}");
    // From an earlier id, the earlier event comes first again.
    let mut again = open(Some(seen - 1)).await?;
    let mut buf = String::new();
    assert_eq!(next_sse_event(&mut again, &mut buf).await?.0, seen);
    assert_eq!(next_sse_event(&mut again, &mut buf).await?.0, seen + 1);
    Ok(())
}

// `arguments: null`, oversized arguments to built-in tools, and which MCP client made each
// recorded call.
/// The newest invocation of `target` as `GET /v1/invocations` lists it.
async fn last_invocation(api: &coffer_tests::Api, target: &str) -> anyhow::Result<Value> {
    let v = api.get(&format!("/v1/invocations?target={target}&limit=1")).reply().await?.ok_json()?;
    Ok(v["items"][0].clone())
}

/// `tools/call` with `arguments: null` is -32602 like any other non-object, and reaches no
/// upstream.
#[tokio::test]
async fn null_arguments_are_invalid_params() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    register_tiny(&api, "tiny", json!({})).await?;
    let mcp = McpSession::latest(&api).await?;
    let r = mcp.request("tools/call", json!({"name": "tiny__echo", "arguments": null})).await?;
    assert_eq!(r["error"]["code"], -32602, "{r}");
    assert_eq!(r["error"]["message"], "tools/call params.arguments must be an object, not null", "{r}");
    // Without the member, the call runs.
    let r = mcp.request("tools/call", json!({"name": "tiny__echo"})).await?;
    ensure!(r.get("result").is_some(), "{r}");
    Ok(())
}

/// A 10 MB query to `coffer__search_knowledge` and a 100 000-character fact to
/// `coffer__remember` are refused at the gateway with a tool error naming the argument and its
/// limit (not the retrieval service's gRPC message-size error), recorded as the caller's
/// mistake (`invalid`), not an upstream error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_built_in_arguments_are_the_caller_s_error() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let mcp = McpSession::latest(&api).await?;
    let r = mcp.tool("coffer__search_knowledge", json!({"query": "q".repeat(10_000_000)})).await?;
    assert_eq!(r["result"]["isError"], true, "{r}");
    assert_eq!(
        texts(&r["result"]),
        "coffer__search_knowledge: invalid arguments: argument \"query\" is 10000000 characters long, over its limit of 8192"
    );
    let row = last_invocation(&api, "coffer__search_knowledge").await?;
    assert_eq!(row["outcome"], "invalid", "{row}");

    let r = mcp.tool("coffer__remember", json!({"text": "f".repeat(100_000)})).await?;
    assert_eq!(
        texts(&r["result"]),
        "coffer__remember: invalid arguments: argument \"text\" is 100000 characters long, over its limit of 16384"
    );
    assert_eq!(last_invocation(&api, "coffer__remember").await?["outcome"], "invalid");

    // Within the limits, the tools still run.
    let r = mcp.tool("coffer__search_knowledge", json!({"query": "anything"})).await?;
    ensure!(r["result"].get("isError").is_none_or(|e| e == false), "{r}");
    Ok(())
}

/// Each invocation records the MCP client's `clientInfo` name and version: `GET
/// /v1/invocations` carries it (and filters on it), `coffer invocations` shows a CLIENT column
/// and takes `--client`; a broker call (the CLI's `tools call`) has none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invocations_name_the_mcp_client() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    register_tiny(&api, "tiny", json!({})).await?;
    // McpSession's clientInfo is {"name": "coffer-tests", "version": "1"}.
    let mcp = McpSession::latest(&api).await?;
    let r = mcp.tool("tiny__echo", json!({"message": "hi"})).await?;
    ensure!(texts(&r["result"]) == "hi", "{r}");
    home.cli(&["tools", "call", "tiny__echo", "--args", r#"{"message":"from the cli"}"#]).await?.ok()?;

    let v = api.get("/v1/invocations?target=tiny__echo").reply().await?.ok_json()?;
    let clients: Vec<(Value, Value)> =
        v["items"].as_array().into_iter().flatten().map(|i| (i["actor"].clone(), i["client"].clone())).collect();
    assert_eq!(
        clients,
        [(json!("cli"), Value::Null), (json!("mcp"), json!({"name": "coffer-tests", "version": "1"}))],
        "newest first"
    );
    let v = api.get("/v1/invocations?client=coffer-tests").reply().await?.ok_json()?;
    assert_eq!(v["items"].as_array().map(Vec::len), Some(1), "{v}");

    let out = home.cli(&["invocations", "--client", "coffer-tests"]).await?.ok()?;
    let header = out.stdout.lines().next().unwrap_or_default();
    ensure!(header.contains("ACTOR") && header.contains("CLIENT"), "{out}");
    ensure!(out.stdout.lines().nth(1).is_some_and(|l| l.contains("coffer-tests 1")), "{out}");
    ensure!(out.stdout.lines().count() == 2, "one row: {out}");
    let json = home.cli(&["invocations", "--client", "coffer-tests", "--json"]).await?.ok()?.json()?;
    assert_eq!(json["items"][0]["client"], json!({"name": "coffer-tests", "version": "1"}));
    let none = home.cli(&["invocations", "--client", "nobody"]).await?.ok()?;
    ensure!(none.stdout.trim() == "No invocations", "{none}");
    Ok(())
}
