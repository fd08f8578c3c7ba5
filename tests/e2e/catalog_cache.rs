//! The capability catalog on first contact, end to end on the real binaries (issue 31): `coffer
//! mcp add` waits until the catalog holds the new server's lists and says what it offers, so a
//! client started right after it sees them; the catalog survives `coffer daemon restart` in its
//! cache file, so the first session after a restart — of a client declaring capabilities the
//! catalog has never seen — is offered every server's tools on its first list; a damaged cache
//! file is ignored and rewritten.
use std::time::Instant;

use anyhow::{Context, ensure};
use coffer_tests::peers::PyClient;
use coffer_tests::{SendExt, TestHome, bin, peer};
use serde_json::{Value, json};

/// Every registered server's `echo` tool (the tiny upstreams') and server-everything's.
const EXPECTED: [&str; 3] = ["everything__echo", "tiny1__echo", "tiny2__echo"];

fn missing(tools: &[String]) -> Vec<&'static str> {
    EXPECTED.into_iter().filter(|t| !tools.iter().any(|n| n == t)).collect()
}

/// A Python SDK client through the shim that declares roots, sampling and elicitation.
async fn rich_client(home: &TestHome) -> anyhow::Result<PyClient> {
    PyClient::through_shim(home, &["--root", "file:///tmp", "--sampling", "sampled", "--elicitation", "{}"]).await
}

#[tokio::test]
async fn mcp_add_waits_for_the_catalog_and_the_first_list_after_a_restart_is_complete() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    home.start_daemon().await?;
    let tiny = bin("coffer-tiny-upstream")?.display().to_string();
    let node = coffer_runtime::connect::which_on_path("node").context("node is not on PATH")?;
    let everything = peer("node_modules/@modelcontextprotocol/server-everything/dist/index.js")?;

    // `mcp add` says what the server offers once the catalog has listed it.
    let out = home.cli(&["mcp", "add", "tiny1", "--", &tiny]).await?.ok()?;
    ensure!(out.stdout.contains("tiny1 offers ") && out.stdout.contains(" tools"), "{out}");
    let out = home
        .cli(&[
            "mcp",
            "add",
            "everything",
            "--json",
            "--",
            &node.display().to_string(),
            &everything.display().to_string(),
            "stdio",
        ])
        .await?
        .ok()?;
    let added = out.json()?;
    ensure!(added["catalog"]["state"] == "ready", "{out}");
    ensure!(added["catalog"]["tools"].as_u64().unwrap_or(0) > 5, "server-everything lists its tools: {out}");
    // --no-wait returns the registration alone.
    let out = home.cli(&["mcp", "add", "tiny2", "--no-wait", "--json", "--", &tiny]).await?.ok()?;
    ensure!(out.json()?.get("catalog").is_none(), "{out}");
    // The REST view of the same wait, for the console and scripts.
    let api = home.api()?;
    let state = api.get("/v1/mcp/servers/tiny2/catalog?wait_ms=30000").reply().await?.ok_json()?;
    ensure!(state["state"] == "ready" && state["tools"].as_u64() > Some(0), "{state}");
    let bad = api.get("/v1/mcp/servers/tiny2/catalog?wait_ms=999999").reply().await?;
    ensure!(bad.status.as_u16() == 400 && bad.text.contains("wait_ms"), "{}: {}", bad.status, bad.text);
    // Every malformed query is the structured INVALID_ARGUMENT naming what is wrong.
    for (query, needle) in [
        ("wait_ms=999999", "at most 120000"),
        ("wait_ms=-1", "wait_ms"),
        ("wait_ms=abc", "wait_ms"),
        ("wait_ms=1.5", "wait_ms"),
        ("wait_ms=", "wait_ms"),
        ("wait_ms=1&wait_ms=2", "duplicate"),
        ("foo=1", "foo"),
    ] {
        let r = api.get(&format!("/v1/mcp/servers/tiny2/catalog?{query}")).reply().await?;
        let body = r.expect_envelope(400, "INVALID_ARGUMENT").with_context(|| query.to_owned())?;
        ensure!(body["message"].as_str().is_some_and(|m| m.contains(needle)), "{query}: {body}");
    }
    let unknown = api.get("/v1/mcp/servers/nope/catalog").reply().await?;
    ensure!(unknown.status.as_u16() == 404, "{}", unknown.status);

    // A client started right after the registrations sees every server on its first list.
    let mut first = rich_client(&home).await?;
    let tools = first.tools().await?;
    ensure!(missing(&tools).is_empty(), "missing {:?} from {tools:?}", missing(&tools));
    first.close().await?;
    let cache = home.root().join("cache/catalog.json");
    coffer_tests::wait_for("the catalog's cache file", std::time::Duration::from_secs(10), || async {
        let text = std::fs::read_to_string(&cache).unwrap_or_default();
        Ok(text.contains("everything").then_some(()))
    })
    .await?;

    // After a restart, the first session — of a client with a capability set never seen
    // before, started at once — is offered every server's tools on its first list.
    home.cli(&["daemon", "restart"]).await?.ok()?;
    let started = Instant::now();
    let mut after = PyClient::through_shim(&home, &["--sampling", "sampled"]).await?;
    let tools = after.tools().await?;
    let took = started.elapsed();
    ensure!(missing(&tools).is_empty(), "missing {:?} from {tools:?} after {took:?}", missing(&tools));
    let echoed = after.call_text("tiny1__echo", json!({"message": "after the restart"})).await?;
    ensure!(echoed.contains("after the restart"), "{echoed}");
    after.close().await?;
    home.terminate_daemon(std::time::Duration::from_secs(30)).await?;
    Ok(())
}

#[tokio::test]
async fn a_damaged_cache_file_is_ignored_and_rewritten() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    coffer_tests::mcp::register_tiny(&api, "tiny1", json!({})).await?;
    let cache = home.root().join("cache/catalog.json");
    std::fs::create_dir_all(cache.parent().context("cache folder")?)?;
    home.terminate_daemon(std::time::Duration::from_secs(30)).await?;
    std::fs::write(&cache, b"{\"format\": 1, \"servers\": {\"tiny1\": [truncated")?;
    let api = home.start_daemon().await?;
    let state = api.get("/v1/mcp/servers/tiny1/catalog?wait_ms=30000").reply().await?.ok_json()?;
    ensure!(state["state"] == "ready", "the daemon lists the server afresh: {state}");
    let mut client = PyClient::through_shim(&home, &[]).await?;
    let tools = client.tools().await?;
    ensure!(tools.iter().any(|t| t == "tiny1__echo"), "{tools:?}");
    client.close().await?;
    coffer_tests::wait_for("the rewritten cache file", std::time::Duration::from_secs(10), || async {
        let text = std::fs::read_to_string(&cache).unwrap_or_default();
        Ok(serde_json::from_str::<Value>(&text).ok().filter(|v| v["servers"]["tiny1"].is_object()).map(|_| ()))
    })
    .await?;
    let log = home.log_text("gateway");
    ensure!(log.contains("cache ignored") && log.contains("not the expected JSON"), "the gateway says why: {log}");
    home.terminate_daemon(std::time::Duration::from_secs(30)).await?;
    Ok(())
}
