//! Honest upstream health end to end (issue 13 §2 and the gateway's smaller findings): sessions
//! that end normally leave `coffer status` and `coffer doctor` clean; start failures name their
//! cause (exit status and stderr, "unreachable"); a deleted command is not `ok`; `mcp test`
//! names non-protocol stdout lines; a tool listed twice is offered once; refusals on `/mcp`
//! carry the request's id; the invocation log has every call answered before it is read.
use std::time::Duration;

use anyhow::{Context, ensure};
use coffer_tests::mcp::{McpSession, mcp_post, register_stdio, register_tiny};
use coffer_tests::{Api, SendExt, TestHome, wait_for};
use serde_json::{Value, json};

async fn upstream(api: &Api, name: &str) -> anyhow::Result<Value> {
    let status = api.status().await?;
    status["upstreams"]
        .as_array()
        .and_then(|u| u.iter().find(|x| x["name"] == name))
        .cloned()
        .with_context(|| format!("no upstream {name} in {status}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_that_end_normally_leave_status_and_doctor_clean() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    register_tiny(&api, "tiny", json!({})).await?;

    let s = McpSession::latest(&api).await?;
    let r = s.tool("tiny__echo", json!({"message": "hi"})).await?;
    ensure!(r.get("result").is_some(), "{r}");
    let up = upstream(&api, "tiny").await?;
    assert_eq!((&up["state"], &up["running"], &up["last_start"]), (&json!("ok"), &json!(1), &json!("ok")), "{up}");

    // A call still in flight when its session ends: the stop is Coffer's, not the server's.
    let slow = {
        let s = s.clone();
        tokio::spawn(async move { s.tool("tiny__slow", json!({"ms": 20000})).await })
    };
    home.wait_for_upstream_log("tiny", "slow 20000 started", 1, Duration::from_secs(10)).await?;
    assert_eq!(s.delete().await?, 204);
    let _ = slow.await?;
    // A second session that lists and ends.
    let s2 = McpSession::latest(&api).await?;
    ensure!(s2.tool_names().await?.contains(&"tiny__echo".to_owned()));
    assert_eq!(s2.delete().await?, 204);

    let up = upstream(&api, "tiny").await?;
    assert_eq!((&up["state"], &up["running"], &up["last_error"]), (&json!("ok"), &json!(0), &Value::Null), "{up}");
    let out = home.cli(&["status"]).await?.ok()?;
    // coffer-callback is stopped until a SeaTalk channel is enabled: its row is not an upstream's.
    let rows: Vec<&str> = out.stdout.lines().filter(|l| !l.trim_start().starts_with("callback")).collect();
    ensure!(rows.iter().all(|l| !l.contains("unhealthy") && !l.contains("stopped")), "{out}");
    let report = home.cli(&["doctor", "--json"]).await?.ok()?.json()?;
    let warnings: Vec<&Value> =
        report["checks"].as_array().into_iter().flatten().filter(|c| c["status"] != "ok").collect();
    ensure!(warnings.iter().all(|c| !c["name"].as_str().unwrap_or("").starts_with("upstream")), "{warnings:?}");

    // A crash is an error, with its exit status; the next successful call clears it.
    let s3 = McpSession::latest(&api).await?;
    let r = s3.tool("tiny__crash", json!({})).await?;
    ensure!(r["error"]["code"] == -32001, "{r}");
    let up = wait_for("the crash in status", Duration::from_secs(10), || async {
        let up = upstream(&api, "tiny").await?;
        Ok(up["last_error"].as_str().is_some_and(|e| e.contains("exited with status 3")).then_some(up))
    })
    .await?;
    assert_eq!(up["state"], "unhealthy", "{up}");
    ensure!(s3.tool("tiny__echo", json!({"message": "again"})).await?.get("result").is_some());
    let up = upstream(&api, "tiny").await?;
    assert_eq!((&up["state"], &up["last_error"]), (&json!("ok"), &Value::Null), "{up}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_failures_name_their_cause_and_hints_point_at_what_exists() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let script = "echo 'loading config' >&2; echo 'fatal: missing API key FOO_KEY' >&2; exit 3";
    register_stdio(&api, "keyed", std::path::Path::new("/bin/sh"), &["-c".into(), script.into()], json!({})).await?;

    let s = McpSession::latest(&api).await?;
    let r = s.tool("keyed__anything", json!({})).await?;
    let message = r["error"]["message"].as_str().with_context(|| r.to_string())?;
    ensure!(message.contains("exited with status 3") && message.contains("fatal: missing API key FOO_KEY"), "{r}");
    ensure!(!message.contains("stdout closed") && !message.contains("Broken pipe"), "{r}");
    let up = upstream(&api, "keyed").await?;
    assert_eq!((&up["state"], &up["last_start"]), (&json!("unhealthy"), &json!("failed")), "{up}");
    ensure!(up["last_error"].as_str().is_some_and(|e| e.contains("FOO_KEY")), "{up}");

    let out = home.cli(&["mcp", "test", "keyed"]).await?;
    assert_eq!(out.code, Some(1), "{out}");
    ensure!(out.stderr.contains("exited with status 3") && out.stderr.contains("FOO_KEY"), "{out}");
    ensure!(out.stderr.contains("coffer mcp logs keyed"), "its stderr log exists: {out}");

    // An HTTP server nobody listens for is unreachable, and has no log to point at.
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let r = api
        .post_json("/v1/mcp/servers", &json!({"name": "remote", "url": format!("http://127.0.0.1:{port}/mcp")}))
        .reply()
        .await?;
    ensure!(r.status == 201, "{}", r.text);
    let out = home.cli(&["mcp", "test", "remote"]).await?;
    assert_eq!(out.code, Some(1), "{out}");
    ensure!(out.stderr.contains("unreachable") && !out.stderr.contains("exited"), "{out}");
    ensure!(!out.stderr.contains("mcp logs"), "no log exists for an HTTP server: {out}");
    let r = s.tool("remote__anything", json!({})).await?;
    ensure!(r["error"]["message"].as_str().is_some_and(|m| m.contains("unreachable") && !m.contains("exited")), "{r}");

    // A server whose command was deleted is not ok, though nothing started it; doctor names it
    // once, as a failed check.
    let gone = home.temp().join("gone-server");
    std::fs::copy(coffer_tests::bin("coffer-tiny-upstream")?, &gone)?;
    register_stdio(&api, "gone", &gone, &[], json!({})).await?;
    std::fs::remove_file(&gone)?;
    let up = upstream(&api, "gone").await?;
    assert_eq!(up["state"], "unhealthy", "{up}");
    ensure!(up["last_error"].as_str().is_some_and(|e| e.contains("does not exist")), "{up}");
    let out = home.cli(&["doctor"]).await?;
    ensure!(out.stdout.matches("upstream gone").count() == 1, "one line names it: {out}");

    // Lines on stdout that are not JSON-RPC: `mcp test` says so.
    let tiny = coffer_tests::bin("coffer-tiny-upstream")?;
    register_stdio(&api, "noisy", &tiny, &["--banner".into()], json!({})).await?;
    let out = home.cli(&["mcp", "test", "noisy"]).await?.ok()?;
    ensure!(out.stdout.contains("not JSON-RPC") && out.stdout.contains("tiny-upstream starting"), "{out}");
    let report = home.cli(&["mcp", "test", "noisy", "--json"]).await?.ok()?.json()?;
    ensure!(report["warnings"].as_array().is_some_and(|w| w.len() == 1), "{report}");
    let out = home.cli(&["mcp", "test", "keyed", "--json"]).await?;
    assert_eq!(out.code, Some(1), "{out}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_listed_twice_is_offered_once_and_shown_in_status() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    register_tiny(&api, "dup", json!({"TINY_REPEAT_TOOL": "echo"})).await?;
    let s = McpSession::latest(&api).await?;
    let r = s.call("tools/list", json!({})).await?;
    let echoes: Vec<&Value> = r["tools"]
        .as_array()
        .context("tools")?
        .iter()
        .filter(|t| t["name"].as_str().is_some_and(|n| n.starts_with("dup__echo")))
        .collect();
    assert_eq!(echoes.len(), 1, "{echoes:?}");
    assert_eq!(echoes[0]["name"], "dup__echo");
    assert_eq!(echoes[0]["description"], "Echoes the message", "the first definition");
    let up = upstream(&api, "dup").await?;
    assert_eq!(up["duplicates"], json!(["tools/echo"]), "{up}");
    home.wait_for_log_line("gateway", &["more than once", "dup", "echo"], Duration::from_secs(5)).await?;
    let out = home.cli(&["status"]).await?.ok()?;
    ensure!(out.stdout.contains("note: dup listed tools/echo more than once"), "{out}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_on_mcp_carry_the_request_id_and_the_log_has_every_answered_call() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let body = json!({"jsonrpc": "2.0", "id": "req-7", "method": "tools/list"}).to_string();
    let r = mcp_post(&api, Some("no-such-session"), body.clone()).reply().await?;
    r.expect_jsonrpc_error_for(404, &json!("req-7"))?;
    let r = mcp_post(&api, None, body.clone()).header("Origin", "http://evil.com").reply().await?;
    r.expect_jsonrpc_error_for(403, &json!("req-7"))?;
    let r =
        api.anon(reqwest::Method::POST, "/mcp").header("Content-Type", "application/json").body(body).reply().await?;
    r.expect_jsonrpc_error_for(401, &json!("req-7"))?;
    // A body whose id cannot be read still gets null.
    let r = mcp_post(&api, Some("no-such-session"), "{\"jsonrpc\":\"2.0\",\"method\":\"x\"}").reply().await?;
    r.expect_jsonrpc_error(404)?;

    // Calls answered just before: the log has them at once, no waiting for the batch.
    register_tiny(&api, "tiny", json!({})).await?;
    let s = McpSession::latest(&api).await?;
    for i in 0..3 {
        let r = s.tool("tiny__echo", json!({"message": i.to_string()})).await?;
        ensure!(r.get("result").is_some(), "{r}");
    }
    let v = api.get("/v1/invocations?target=tiny__echo").reply().await?.ok_json()?;
    assert_eq!(v["items"].as_array().map(Vec::len), Some(3), "{v}");
    ensure!(s.tool("tiny__add", json!({"a": 1, "b": 2})).await?.get("result").is_some());
    let rows = home.cli(&["invocations", "--json"]).await?.ok()?.json()?;
    let items = rows["items"].as_array().or(rows.as_array()).cloned().unwrap_or_default();
    ensure!(items.iter().any(|r| r["target"] == "tiny__add"), "{rows}");
    Ok(())
}
