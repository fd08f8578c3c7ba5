//! Profiles on the session side (issue 36 §1, §3), end to end on the real binaries: a client
//! names its profile through the shim (`--profile NAME`), by `/mcp`'s `Coffer-Profile` header or
//! by the path `/mcp/p/{name}`; an unknown one is refused at `initialize` naming
//! `coffer profile list`; each session's profile shows in `coffer status` and on its
//! invocations (`coffer invocations --profile`). The Done-when test (two real SDK clients
//! through the shim with different profiles; an override renaming and re-describing a tool
//! both ways) creates its profiles through `POST /v1/mcp/profiles` (wip/profiles).
use std::time::Duration;

use anyhow::{Context, ensure};
use coffer_tests::mcp::{register_everything, register_tiny};
use coffer_tests::peers::{PyClient, Sdk};
use coffer_tests::{SendExt, TestHome, bin};
use serde_json::{Value, json};

/// `initialize` over Streamable HTTP at `path` with `headers`; the reply's status and body.
async fn initialize_at(
    api: &coffer_tests::Api,
    path: &str,
    headers: &[(&str, &str)],
) -> anyhow::Result<(reqwest::StatusCode, Value, Option<String>)> {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "e2e-profiles", "version": "1"}}});
    let mut req = api
        .post(path)
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .json(&body);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let r = req.send().await?;
    let status = r.status();
    let session = r.headers().get("mcp-session-id").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let v: Value = serde_json::from_str(&r.text().await?).context("a JSON-RPC body")?;
    Ok((status, v, session))
}

/// A request on an initialized Streamable HTTP session at `path`; the JSON-RPC answer.
async fn request_at(
    api: &coffer_tests::Api,
    path: &str,
    session: &str,
    method: &str,
    params: Value,
) -> anyhow::Result<Value> {
    let body = json!({"jsonrpc": "2.0", "id": 2, "method": method, "params": params});
    let r = api
        .post(path)
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .header("Mcp-Session-Id", session)
        .header("MCP-Protocol-Version", "2025-11-25")
        .json(&body)
        .send()
        .await?;
    let text = r.text().await?;
    serde_json::from_str(&text).with_context(|| format!("a JSON answer: {text}"))
}

/// Runs now (no stored profile needed): unknown and malformed profiles are refused at
/// `initialize` on every way of naming one; `default` by name is today's view; a session's
/// profile shows in status and on its invocations.
#[tokio::test]
async fn sessions_name_their_profile_and_an_unknown_one_is_refused_at_initialize() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    home.start_daemon().await?;
    let api = home.api()?;
    register_tiny(&api, "tiny", json!({})).await?;

    for (path, headers) in [("/mcp/p/nope", vec![]), ("/mcp", vec![("Coffer-Profile", "nope")])] {
        let (status, v, session) = initialize_at(&api, path, &headers).await?;
        assert_eq!(status, reqwest::StatusCode::NOT_FOUND, "{path}: {v}");
        let msg = v["error"]["message"].as_str().unwrap_or_default();
        ensure!(msg.contains("\"nope\"") && msg.contains("coffer profile list"), "{path}: {v}");
        assert_eq!((v["id"].as_i64(), &v["error"]["data"]), (Some(1), &json!({"profile": "nope"})));
        ensure!(session.is_none(), "no session for a refused profile");
    }
    let (status, v, _) = initialize_at(&api, "/mcp/p/Bad_Name", &[]).await?;
    ensure!(
        status == reqwest::StatusCode::NOT_FOUND
            && v["error"]["message"].as_str().unwrap_or_default().contains("lowercase"),
        "{v}"
    );
    let (status, v, _) = initialize_at(&api, "/mcp/p/default", &[("Coffer-Profile", "other")]).await?;
    ensure!(
        status == reqwest::StatusCode::NOT_FOUND
            && v["error"]["message"].as_str().unwrap_or_default().contains("Two profiles"),
        "{v}"
    );

    // Through the shim: the SDK client sees the JSON-RPC error of its initialize.
    let shim = bin("coffer-mcp-shim")?.display().to_string();
    let refused = PyClient::start(
        &home,
        Sdk::V1,
        &["--stdio".into(), "--".into(), shim.clone(), "--profile".into(), "nope".into()],
    )
    .await;
    let e = format!("{:#}", refused.err().context("an unknown profile is refused")?);
    ensure!(e.contains("nope") && e.contains("coffer profile list"), "{e}");

    // `default` by name, by path: today's view; recorded with its profile and shown in status.
    let (status, v, session) = initialize_at(&api, "/mcp/p/default", &[]).await?;
    ensure!(status.is_success(), "{v}");
    let session = session.context("a session id")?;
    let listed = request_at(&api, "/mcp/p/default", &session, "tools/list", json!({})).await?;
    ensure!(
        listed["result"]["tools"].as_array().is_some_and(|t| t.iter().any(|t| t["name"] == "tiny__echo")),
        "{listed}"
    );
    let called = request_at(
        &api,
        "/mcp/p/default",
        &session,
        "tools/call",
        json!({"name": "tiny__echo", "arguments": {"message": "hi"}}),
    )
    .await?;
    ensure!(called["result"].is_object(), "{called}");
    let mut through_shim =
        PyClient::start(&home, Sdk::V1, &["--stdio".into(), "--".into(), shim, "--profile=default".into()]).await?;
    through_shim.call_text("tiny__echo", json!({"message": "via shim"})).await?;

    let status = home.api()?.get("/v1/status").reply().await?.ok_json()?;
    let sessions = status["sessions"].as_array().context("status lists sessions")?;
    ensure!(
        sessions.iter().any(|s| s["client_name"] == "e2e-profiles"
            && s["profile"] == "default"
            && s["id"].as_str().is_some_and(|i| session.starts_with(i))),
        "{status}"
    );
    let out = home.cli(&["status"]).await?.ok()?;
    ensure!(out.stdout.contains("MCP sessions:") && out.stdout.contains("e2e-profiles 1"), "{out}");
    let out = home.cli(&["invocations", "--profile", "default", "--json"]).await?.ok()?;
    let items = out.json()?["items"].as_array().cloned().unwrap_or_default();
    ensure!(items.len() >= 2 && items.iter().all(|i| i["profile"] == "default"), "{out}");
    let out = home.cli(&["invocations", "--profile", "work", "--json"]).await?.ok()?;
    ensure!(out.json()?["items"].as_array().is_some_and(Vec::is_empty), "{out}");
    through_shim.close().await?;
    Ok(())
}

/// Issue 36's Done-when for profiles and overrides. NEEDS wip/profiles (`POST /v1/mcp/profiles`
/// and the snapshot's profiles from the store): two real SDK clients through the shim with
/// different profiles see different tools, a disabled tool is hidden in both; an override
/// renames and re-describes server-everything's `echo` both ways (listed as `say`; a call to
/// `say` reaches the upstream as `echo`, whose own answer says so).
#[tokio::test]
async fn two_clients_through_the_shim_with_different_profiles_and_an_override_both_ways() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    home.start_daemon().await?;
    let api = home.api()?;
    register_everything(&api, "everything").await?;
    register_tiny(&api, "tiny", json!({})).await?;
    home.cli(&["tools", "disable", "tiny__crash"]).await?.ok()?;
    for body in [
        json!({"name": "reader", "servers": {"include": ["everything"]}, "builtins": {"exclude": ["*"]},
               "overrides": {"everything__echo": {"name": "say", "description": "Says the message back.",
                                                  "description_append": "Use it to test the line."}}}),
        json!({"name": "tinkerer", "servers": {"include": ["tiny"]}, "tools": {"exclude": ["tiny__slow"]}}),
    ] {
        let r = api.post_json("/v1/mcp/profiles", &body).reply().await?;
        ensure!(r.status.is_success(), "creating a profile: {} {}", r.status, r.text);
    }
    let shim = bin("coffer-mcp-shim")?.display().to_string();
    let with_profile =
        |p: &str| vec!["--stdio".to_owned(), "--".into(), shim.clone(), "--profile".into(), p.to_owned()];
    let mut reader = PyClient::start(&home, Sdk::V1, &with_profile("reader")).await?;
    let mut tinkerer = PyClient::start(&home, Sdk::V2, &with_profile("tinkerer")).await?;

    let r = reader.tools_including(&["say"], Duration::from_secs(30)).await?;
    let t = tinkerer.tools_including(&["tiny__echo"], Duration::from_secs(30)).await?;
    ensure!(
        r.iter().all(|n| !n.starts_with("tiny__") && !n.starts_with("coffer__"))
            && !r.contains(&"everything__echo".to_owned()),
        "{r:?}"
    );
    // tinkerer keeps Coffer's own tools (its `builtins` selects them all); reader excludes them.
    ensure!(
        t.iter().all(|n| n.starts_with("tiny__") || n.starts_with("coffer__"))
            && t.contains(&"coffer__search_tools".to_owned())
            && !t.contains(&"tiny__slow".to_owned()),
        "{t:?}"
    );
    ensure!(!r.contains(&"tiny__crash".to_owned()) && !t.contains(&"tiny__crash".to_owned()), "disabled stays hidden");

    // Both ways: `say` reaches server-everything as `echo` (its own answer); the other
    // profile's and the disabled tool are refused like disabled ones.
    let said = reader.call_text("say", json!({"message": "profiles"})).await?;
    assert_eq!(said, "Echo: profiles");
    let refused = reader.call("tiny__echo", json!({"message": "x"})).await?;
    ensure!(
        refused["error"]["message"].as_str().is_some_and(|m| m.starts_with("Tool tiny__echo is not in profile reader"))
            || refused["result"]["isError"] == true,
        "{refused}"
    );
    let refused = tinkerer.call("tiny__crash", json!({})).await?;
    ensure!(refused.to_string().contains("disabled"), "{refused}");

    // The description as the reader's sessions see it, over /mcp/p/reader.
    let (_, _, session) = initialize_at(&api, "/mcp/p/reader", &[]).await?;
    let listed = request_at(&api, "/mcp/p/reader", &session.context("session")?, "tools/list", json!({})).await?;
    let say = listed["result"]["tools"].as_array().and_then(|t| t.iter().find(|t| t["name"] == "say")).cloned();
    assert_eq!(say.context("say listed")?["description"], "Says the message back.\n\nUse it to test the line.");
    let out = home.cli(&["invocations", "--profile", "reader", "--json"]).await?.ok()?;
    ensure!(
        out.json()?["items"]
            .as_array()
            .is_some_and(|i| i.iter().any(|i| i["target"] == "say" && i["server"] == "everything")),
        "{out}"
    );
    reader.close().await?;
    tinkerer.close().await?;
    Ok(())
}
