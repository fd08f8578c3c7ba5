//! Legacy HTTP+SSE upstreams (MCP 2024-11-05) end to end, with real peers: the pinned
//! server-everything in `sse` mode (an URL ending in /sse, the TypeScript SDK's transport) and a
//! FastMCP server of the Python SDK 1.x (`run(transport="sse")`), registered with
//! `--transport sse` and, at another path, found by detection (its POST is refused with 405).
//! Listed and called through the gateway by a real client; a server that goes away gives a clean
//! -32001 and is reconnected once it is back.
use std::io::{BufRead, BufReader};
use std::time::Duration;

use anyhow::{Context, ensure};
use coffer_tests::mcp::McpSession;
use coffer_tests::peers::{PyClient, Sdk, peer_path, venv_bin};
use coffer_tests::{SendExt, TestHome, ports};
use serde_json::json;

/// Starts `program args…` as a process of the home (its cleanup ends it) and waits until its
/// stderr has a line containing `ready`.
fn start_peer(
    home: &TestHome,
    program: &std::path::Path,
    args: &[String],
    env: &[(&str, String)],
    ready: &'static str,
) -> anyhow::Result<std::process::Child> {
    let mut cmd = home.command(program);
    cmd.args(args).stdout(std::process::Stdio::null()).stderr(std::process::Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().with_context(|| format!("starting {}", program.display()))?;
    let stderr = child.stderr.take().context("stderr")?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains(ready) {
                let _ = tx.send(());
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(30)).with_context(|| format!("{} did not say {ready:?}", program.display()))?;
    Ok(child)
}

/// server-everything in `sse` mode on `port`: `GET /sse`, `POST /message?sessionId=…`.
fn start_everything_sse(home: &TestHome, port: u16) -> anyhow::Result<std::process::Child> {
    let node = coffer_runtime::connect::which_on_path("node").context("node is not on PATH")?;
    let entry = peer_path("node_modules/@modelcontextprotocol/server-everything/dist/index.js")?;
    start_peer(
        home,
        &node,
        &[entry.to_string_lossy().into_owned(), "sse".into()],
        &[("PORT", port.to_string())],
        "running on port",
    )
}

/// The FastMCP peer (`tests/peers/sse_server.py`) on `port`, its stream at `path`.
fn start_fastmcp_sse(home: &TestHome, port: u16, path: &str) -> anyhow::Result<std::process::Child> {
    let python = venv_bin(Sdk::V1, "python")?;
    let script = peer_path("sse_server.py")?;
    start_peer(
        home,
        &python,
        &[script.to_string_lossy().into_owned(), port.to_string(), path.into()],
        &[],
        "Uvicorn running on",
    )
}

#[tokio::test]
async fn legacy_sse_upstreams_list_and_call_through_a_real_client() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let ev_port = ports::free_port();
    let mut everything = start_everything_sse(&home, ev_port)?;
    let py_port = ports::free_port();
    let _fastmcp = start_fastmcp_sse(&home, py_port, "/sse")?;
    let detect_port = ports::free_port();
    let _detected = start_fastmcp_sse(&home, detect_port, "/events")?;

    // By its URL (…/sse), chosen outright (--transport sse, through the CLI), and detected (a
    // URL that says nothing, whose POST is refused 405).
    let r = api
        .post_json("/v1/mcp/servers", &json!({"name": "evsse", "url": format!("http://127.0.0.1:{ev_port}/sse")}))
        .reply()
        .await?;
    ensure!(r.status.is_success(), "{}", r.text);
    let out = home
        .cli(&["mcp", "add", "pysse", "--url", &format!("http://127.0.0.1:{py_port}/sse"), "--transport", "sse"])
        .await?;
    let out = out.ok()?;
    ensure!(out.stdout.contains("Added MCP server pysse (sse: "), "{}", out.stdout);
    let shown = api.get("/v1/mcp/servers/pysse").reply().await?.ok_json()?;
    assert_eq!(shown["transport"], "sse");
    let r = api
        .post_json(
            "/v1/mcp/servers",
            &json!({"name": "pydetect", "url": format!("http://127.0.0.1:{detect_port}/events")}),
        )
        .reply()
        .await?;
    ensure!(r.status.is_success(), "{}", r.text);
    for name in ["evsse", "pysse", "pydetect"] {
        coffer_tests::mcp::wait_listed(&api, name).await?;
    }
    // All three show as sse: by URL, chosen, and detected (once it has been spoken to), in
    // `mcp list` (and --json), the REST body the console shows, and status.
    let out = home.cli(&["--json", "mcp", "list"]).await?.ok()?;
    let listed: serde_json::Value = serde_json::from_str(&out.stdout)?;
    for name in ["evsse", "pysse", "pydetect"] {
        let s = listed["items"].as_array().context("items")?.iter().find(|s| s["name"] == name).context("listed")?;
        assert_eq!(s["transport"], "sse", "{name}: {s}");
        let shown = api.get(&format!("/v1/mcp/servers/{name}")).reply().await?.ok_json()?;
        assert_eq!(shown["transport"], "sse", "{name}: {shown}");
    }
    let table = home.cli(&["mcp", "list"]).await?.ok()?.stdout;
    for name in ["evsse", "pysse", "pydetect"] {
        let line = table.lines().find(|l| l.starts_with(name)).context("row")?;
        ensure!(line.split_whitespace().nth(1) == Some("sse"), "{line}");
    }
    let st = api.get("/v1/status").reply().await?.ok_json()?;
    let up = st["upstreams"].as_array().context("upstreams")?.iter().find(|u| u["name"] == "pydetect").cloned();
    assert_eq!(up.context("pydetect in status")?["transport"], "sse");

    // A real MCP client (the Python SDK through the shim) lists and calls all three.
    let mut client = PyClient::through_shim(&home, &[]).await?;
    let tools = client.tools().await?;
    for t in ["evsse__echo", "evsse__get-sum", "pysse__echo", "pydetect__echo"] {
        ensure!(tools.iter().any(|x| x == t), "{t} missing from {tools:?}");
    }
    let echoed = client.call_text("evsse__echo", json!({"message": "over legacy sse"})).await?;
    assert_eq!(echoed, "Echo: over legacy sse");
    let sum = client.call_text("evsse__get-sum", json!({"a": 2, "b": 40})).await?;
    ensure!(sum.contains("42"), "{sum}");
    assert_eq!(client.call_text("pysse__echo", json!({"message": "fastmcp"})).await?, "Echo: fastmcp");
    assert_eq!(client.call_text("pydetect__echo", json!({"message": "found"})).await?, "Echo: found");
    client.close().await?;

    // The upstream goes away: its stream closes, the call fails cleanly with -32001; back on
    // the same port, the next call opens a new stream and works.
    let s = McpSession::latest(&api).await?;
    assert_eq!(
        s.tool("evsse__echo", json!({"message": "before"})).await?["result"]["content"][0]["text"],
        "Echo: before"
    );
    everything.kill()?;
    everything.wait()?;
    let r = s.tool("evsse__echo", json!({"message": "anyone?"})).await?;
    assert_eq!(r["error"]["code"], -32001, "{r}");
    let _everything = start_everything_sse(&home, ev_port)?;
    // The failed start is retried after a backoff (1 s after a first failure): a call within it
    // gets that failure, saying so and in how many ms the next start is tried; waited out once,
    // the next call starts anew and works.
    let mut r = s.tool("evsse__echo", json!({"message": "back"})).await?;
    if r.get("result").is_none() {
        let msg = r["error"]["message"].as_str().unwrap_or_default().to_owned();
        let ms: u64 = msg
            .split("the next start is tried in ")
            .nth(1)
            .and_then(|t| t.split(' ').next())
            .and_then(|n| n.parse().ok())
            .with_context(|| format!("a call within the backoff names it: {r}"))?;
        tokio::time::sleep(std::time::Duration::from_millis(ms + 50)).await;
        r = s.tool("evsse__echo", json!({"message": "back"})).await?;
    }
    assert_eq!(r["result"]["content"][0]["text"], "Echo: back", "{r}");
    assert_eq!(s.delete().await?, 204);
    Ok(())
}
