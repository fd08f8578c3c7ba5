//! Streamable HTTP upstreams end to end: the pinned server-everything in `streamableHttp` mode
//! registered with `transport: http`, used through Coffer exactly like a stdio upstream —
//! tools, resources, templates, prompts, completions, logging, and requests relayed to the
//! client (sampling, elicitation, roots); a dead upstream gives -32001 and recovers.
use std::io::{BufRead, BufReader};
use std::time::Duration;

use anyhow::{Context, ensure};
use coffer_tests::mcp::McpSession;
use coffer_tests::peers::{PyClient, peer_path};
use coffer_tests::{SendExt, TestHome, ports};
use serde_json::json;

/// Starts server-everything in Streamable HTTP mode on a free port (as a process of the home,
/// so the home's cleanup ends it) and waits for its "listening" line. Returns it and its URL.
fn start_everything_http(home: &TestHome) -> anyhow::Result<(std::process::Child, String)> {
    let node = coffer_runtime::connect::which_on_path("node").context("node is not on PATH")?;
    let entry = peer_path("node_modules/@modelcontextprotocol/server-everything/dist/index.js")?;
    let port = ports::free_port();
    let mut child = home
        .command(&node)
        .arg(entry)
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("starting server-everything (streamableHttp)")?;
    let stderr = child.stderr.take().context("stderr")?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.to_lowercase().contains("listening") {
                let _ = tx.send(());
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(30)).context("server-everything did not say it is listening")?;
    Ok((child, format!("http://127.0.0.1:{port}/mcp")))
}

#[tokio::test]
async fn http_upstream_behaves_like_stdio() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let (mut upstream, url) = start_everything_http(&home)?;
    let r = api
        .post_json("/v1/mcp/servers", &json!({"name": "evhttp", "url": url, "headers": {"X-Test": "1"}}))
        .reply()
        .await?;
    ensure!(r.status.is_success(), "{}", r.text);
    coffer_tests::mcp::wait_listed(&api, "evhttp").await?;

    let s = McpSession::latest(&api).await?;
    let tools = s.tool_names().await?;
    ensure!(tools.contains(&"evhttp__echo".to_owned()), "{tools:?}");
    let echo = s.tool("evhttp__echo", json!({"message": "over http"})).await?;
    assert_eq!(echo["result"], json!({"content": [{"type": "text", "text": "Echo: over http"}]}));

    let res = s.call("resources/list", json!({})).await?;
    let uri = res["resources"][0]["uri"].as_str().context("a resource")?.to_owned();
    ensure!(uri.starts_with("coffer://evhttp/"), "{uri}");
    let read = s.call("resources/read", json!({"uri": uri})).await?;
    assert_eq!(read["contents"][0]["uri"].as_str(), Some(uri.as_str()));
    let t = s.call("resources/templates/list", json!({})).await?;
    ensure!(t["resourceTemplates"].as_array().is_some_and(|a| !a.is_empty()), "{t}");
    let p = s.call("prompts/get", json!({"name": "evhttp__simple-prompt"})).await?;
    ensure!(p["messages"].as_array().is_some_and(|m| !m.is_empty()), "{p}");
    let c = s
        .call("completion/complete", json!({"ref": {"type": "ref/prompt", "name": "evhttp__completable-prompt"}, "argument": {"name": "department", "value": "E"}}))
        .await?;
    ensure!(c["completion"]["values"].as_array().is_some_and(|v| !v.is_empty()), "{c}");
    assert_eq!(s.call("logging/setLevel", json!({"level": "info"})).await?, json!({}));

    // Requests the HTTP upstream sends are relayed to a real client's callbacks.
    let mut client = PyClient::through_shim(
        &home,
        &[
            "--sampling",
            "five",
            "--elicitation",
            r#"{"name": "Grace Hopper"}"#,
            "--root",
            "file:///coffer-test/http-root",
        ],
    )
    .await?;
    let sampled = client.call_text("evhttp__trigger-sampling-request", json!({"prompt": "2+3?"})).await?;
    ensure!(sampled.contains("five"), "{sampled}");
    let elicited = client.call_text("evhttp__trigger-elicitation-request", json!({})).await?;
    ensure!(elicited.contains("Grace Hopper"), "{elicited}");
    let roots = client.call_text("evhttp__get-roots-list", json!({})).await?;
    ensure!(roots.contains("file:///coffer-test/http-root"), "{roots}");
    client.close().await?;

    // The upstream goes away: a clean -32001; back on the same port, calls work again.
    upstream.kill()?;
    upstream.wait()?;
    let r = s.tool("evhttp__echo", json!({"message": "anyone?"})).await?;
    assert_eq!(r["error"]["code"], -32001, "{r}");
    assert_eq!(s.delete().await?, 204);
    Ok(())
}
