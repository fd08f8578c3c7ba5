//! Upstreams of both MCP eras behind one gateway, with real peers: the Python SDK 2.x servers
//! (`mcp-server-time` 2026.10.19 and `tests/peers/mcp2_server.py`, over stdio and Streamable
//! HTTP) speak the stateless 2026-07-28 revision, server-everything and the 1.x time server the
//! handshake era. An old-era client (the Python SDK 1.x, through the shim) lists and calls all
//! of them; a 2.x upstream's multi round-trip requests (elicitation, sampling) reach the
//! client's callbacks as ordinary server→client requests, and its list changes reach the
//! client as `notifications/tools/list_changed`.
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, ensure};
use coffer_tests::mcp::{register_everything, register_stdio};
use coffer_tests::peers::{PyClient, Sdk, peer_path, venv_bin};
use coffer_tests::{SendExt, TestHome, ports};
use serde_json::{Value, json};

/// How long a notification may take to travel upstream → Coffer → shim → client.
const EVENT_TIMEOUT: Duration = Duration::from_secs(15);

fn has(names: &[String], name: &str) -> bool {
    names.iter().any(|n| n == name)
}

/// The 2.x SDK's Python and the peer script.
fn mcp2_server() -> anyhow::Result<(PathBuf, PathBuf)> {
    Ok((venv_bin(Sdk::V2, "python")?, peer_path("mcp2_server.py")?))
}

/// Starts `mcp2_server.py http` on a free port (a process of the home, so its cleanup ends it)
/// and waits for its "listening" line. Returns it and its URL.
fn start_mcp2_http(home: &TestHome) -> anyhow::Result<(std::process::Child, String)> {
    let (python, script) = mcp2_server()?;
    let port = ports::free_port();
    let mut child = home
        .command(&python)
        .arg(script)
        .args(["http", "--port", &port.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("starting mcp2_server.py http")?;
    let stderr = child.stderr.take().context("stderr")?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("listening on port") {
                let _ = tx.send(());
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(30)).context("mcp2_server.py did not say it is listening")?;
    Ok((child, format!("http://127.0.0.1:{port}/mcp")))
}

/// Lists and starts wait up to 30 s: a Python SDK 2.x server needs seconds of CPU to start,
/// and the test machine runs several at once; the first list of a client with new
/// capabilities waits for its own.
async fn patient(api: &coffer_tests::Api) -> anyhow::Result<()> {
    coffer_tests::mcp::patient_lists(api).await?;
    let r = api
        .request(reqwest::Method::PATCH, "/v1/settings")
        .json(&json!({"set": {"gateway.list_timeout_ms": "30000", "gateway.start_timeout_ms": "30000"}}))
        .reply()
        .await?;
    ensure!(r.status == 200, "PATCH /v1/settings: {} {}", r.status, r.text);
    Ok(())
}

/// The era the gateway found `server` speaking, from its "Upstream started." log line.
async fn started_era(home: &TestHome, server: &str) -> anyhow::Result<String> {
    let needle = format!("server={server}");
    home.wait_for_log_line("gateway", &["Upstream started.", &needle], Duration::from_secs(20)).await?;
    let text = home.log_text("gateway");
    let line =
        text.lines().find(|l| l.contains("Upstream started.") && l.contains(&needle)).context("no start line")?;
    let era = line.split("era=").nth(1).and_then(|r| r.split_whitespace().next()).context("no era field")?;
    Ok(era.trim_matches('"').to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_era_client_uses_new_era_stdio_upstreams_next_to_old_era_ones() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    patient(&api).await?;
    register_everything(&api, "everything").await?;
    let utc = ["--local-timezone".to_owned(), "UTC".to_owned()];
    register_stdio(&api, "time2", &venv_bin(Sdk::V2, "mcp-server-time")?, &utc, json!({})).await?;
    register_stdio(&api, "time1", &venv_bin(Sdk::V1, "mcp-server-time")?, &utc, json!({})).await?;
    let (python, script) = mcp2_server()?;
    register_stdio(&api, "peer2", &python, &[script.display().to_string(), "stdio".into()], json!({})).await?;
    for s in ["everything", "time2", "time1", "peer2"] {
        coffer_tests::mcp::wait_listed(&api, s).await?;
    }

    let mut client =
        PyClient::through_shim(&home, &["--sampling", "five", "--elicitation", r#"{"name": "Grace Hopper"}"#]).await?;
    let tools = client.tools().await?;
    for t in ["everything__echo", "time2__get_current_time", "time1__get_current_time", "peer2__greet", "peer2__echo"] {
        ensure!(has(&tools, t), "{t} missing from {tools:?}");
    }
    for server in ["time2", "time1"] {
        let now: Value = serde_json::from_str(
            &client.call_text(&format!("{server}__get_current_time"), json!({"timezone": "UTC"})).await?,
        )?;
        assert_eq!(now["timezone"], "UTC", "{server}: {now}");
    }
    let converted = client
        .call_text(
            "time2__convert_time",
            json!({"source_timezone": "UTC", "time": "12:00", "target_timezone": "Europe/Paris"}),
        )
        .await?;
    ensure!(converted.contains("Europe/Paris"), "{converted}");
    assert_eq!(client.call_text("peer2__echo", json!({"message": "both eras"})).await?, "Echo: both eras");
    assert_eq!(client.call_text("everything__echo", json!({"message": "old era"})).await?, "Echo: old era");

    assert_eq!(started_era(&home, "time2").await?, "2026-07-28");
    assert_eq!(started_era(&home, "peer2").await?, "2026-07-28");
    assert_eq!(started_era(&home, "time1").await?, "handshake");
    assert_eq!(started_era(&home, "everything").await?, "handshake");

    mrtr_tools(&mut client, "peer2").await?;
    list_changed(&mut client, "peer2").await?;

    client.close().await?;
    home.terminate_daemon(Duration::from_secs(20)).await.context("processes left behind")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_era_client_uses_a_new_era_http_upstream() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    patient(&api).await?;
    let (mut upstream, url) = start_mcp2_http(&home)?;
    let r = api.post_json("/v1/mcp/servers", &json!({"name": "web2", "url": url})).reply().await?;
    ensure!(r.status.is_success(), "{}", r.text);
    coffer_tests::mcp::wait_listed(&api, "web2").await?;

    let mut client =
        PyClient::through_shim(&home, &["--sampling", "five", "--elicitation", r#"{"name": "Grace Hopper"}"#]).await?;
    let tools = client.tools().await?;
    ensure!(has(&tools, "web2__echo") && has(&tools, "web2__greet"), "{tools:?}");
    assert_eq!(client.call_text("web2__echo", json!({"message": "over http"})).await?, "Echo: over http");
    assert_eq!(started_era(&home, "web2").await?, "2026-07-28");
    mrtr_tools(&mut client, "web2").await?;
    list_changed(&mut client, "web2").await?;

    // A client that cannot answer elicitation gets a clear error, not a hang.
    let mut plain = PyClient::through_shim(&home, &[]).await?;
    let r = plain.call("web2__greet", json!({})).await?;
    let text = r.to_string();
    ensure!(r.get("error").is_some() || r["result"]["isError"] == true, "{r}");
    ensure!(text.contains("elicitation") || text.contains("capabilit"), "{r}");
    plain.close().await?;

    client.close().await?;
    upstream.kill()?;
    upstream.wait()?;
    home.terminate_daemon(Duration::from_secs(20)).await.context("processes left behind")
}

/// `greet` (elicitation) and `ask_model` (sampling) through the client's callbacks.
async fn mrtr_tools(client: &mut PyClient, server: &str) -> anyhow::Result<()> {
    let greeted = client.call_text(&format!("{server}__greet"), json!({})).await?;
    assert_eq!(greeted, "Hello, Grace Hopper!");
    let sampled = client.call_text(&format!("{server}__ask_model"), json!({})).await?;
    ensure!(sampled.starts_with("The model said:") && sampled.contains("five"), "{sampled}");
    let kinds: Vec<Value> = client.events().iter().map(|e| e["kind"].clone()).collect();
    ensure!(kinds.contains(&json!("elicitation")) && kinds.contains(&json!("sampling")), "callbacks ran: {kinds:?}");
    Ok(())
}

/// `add_tool` makes the upstream announce a list change: it reaches the client, and the new
/// tool is listed and callable.
async fn list_changed(client: &mut PyClient, server: &str) -> anyhow::Result<()> {
    client.clear_events();
    let added = client.call_text(&format!("{server}__add_tool"), json!({"name": "fresh_tool"})).await?;
    assert_eq!(added, "added fresh_tool");
    let is_tools_changed = |e: &Value| e["kind"] == "notification" && e["method"] == "notifications/tools/list_changed";
    client.wait_event("tools/list_changed from the 2.x upstream", EVENT_TIMEOUT, is_tools_changed).await?;
    // The notification invalidated the session's list: the next one asks the upstream.
    let fresh = format!("{server}__fresh_tool");
    let tools = client.tools().await?;
    ensure!(has(&tools, &fresh), "{fresh} not listed after list_changed: {tools:?}");
    assert_eq!(client.call_text(&fresh, json!({})).await?, "I am fresh_tool");
    Ok(())
}
