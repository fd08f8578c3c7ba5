//! Headless Claude Code (`claude -p`, the real CLI with default settings, on a fake model API)
//! through Coffer's shim: with seven registered servers — one slow to start, one hung — on a
//! cold daemon, it is offered Coffer's tools on its first turn and calls one (issue 13: before
//! the capability catalog, the first `tools/list` waited for every upstream, Claude Code gave
//! the `coffer` server up as `pending` after about two seconds, and the model saw no tool).
//! On a loaded machine a cold daemon alone takes longer than Claude Code waits; the shim answers
//! discovery from the answers it kept from an earlier session (`shim/src/memory.rs`), so the
//! test has Claude Code used once before the daemon stops.
use std::time::{Duration, Instant};

use coffer_tests::anthropic::{CALL_ID, ECHO_MESSAGE, FakeAnthropic};
use coffer_tests::mcp::register_stdio;
use coffer_tests::peers::ClaudeCode;
use coffer_tests::{SendExt, TestHome, bin, wait_for};
use serde_json::{Value, json};

const TOOL: &str = "mcp__coffer__tiny1__echo";

#[tokio::test]
async fn headless_claude_code_is_offered_coffer_s_tools_and_calls_one_from_a_cold_daemon() -> anyhow::Result<()> {
    from_a_cold_daemon(coffer_tests::peers::claude_code()?).await
}

/// The same with Claude Code 2.1.197, which speaks MCP 2025-11-25 (`initialize`) where 2.1.332
/// speaks 2026-07-28 (`server/discover`, `subscriptions/listen`).
#[tokio::test]
async fn headless_claude_code_2_1_197_is_offered_coffer_s_tools_and_calls_one_from_a_cold_daemon() -> anyhow::Result<()>
{
    from_a_cold_daemon(coffer_tests::peers::claude_code_2_1_197()?).await
}

async fn from_a_cold_daemon(program: std::path::PathBuf) -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let tiny = bin("coffer-tiny-upstream")?;
    // Five, so that the first turn offers their tools itself: with more (~90 tools) Claude Code
    // 2.1.332 defers MCP tools behind ToolSearch, which `first_contact.rs` covers.
    for i in 1..=5 {
        register_stdio(&api, &format!("tiny{i}"), &tiny, &[], json!({})).await?;
    }
    // A server that takes 3 s to start, and one that prints a banner and never answers.
    register_stdio(&api, "slow", &tiny, &["--start-delay-ms".into(), "3000".into()], json!({})).await?;
    register_stdio(&api, "hung", &tiny, &["--banner".into(), "--hang".into()], json!({})).await?;
    let prompt = "Call the echo tool of the tiny1 server through Coffer.";
    let args = ["-p", prompt, "--allowedTools", TOOL, "--output-format", "stream-json", "--verbose"];
    // Claude Code has been used before (the shim keeps the daemon's discovery answers in the
    // home): a session with the daemon up, as yesterday's.
    let earlier = FakeAnthropic::start(TOOL).await?;
    let before = ClaudeCode::of(program.clone(), &home, &earlier.url)?;
    before.add_coffer(&home).await?;
    let out = before.run(&home, &args, Duration::from_secs(120)).await?;
    assert_eq!(out.code, Some(0), "the earlier session: {out}\n{}", home.diagnostics());
    // Cold: no daemon runs; Claude Code's shim starts one (with an empty catalog) and answers
    // discovery from what it kept meanwhile (`shim/src/memory.rs`).
    home.terminate_daemon(Duration::from_secs(30)).await?;

    let model = FakeAnthropic::start(TOOL).await?;
    let claude = ClaudeCode::of(program, &home, &model.url)?;
    let started = Instant::now();
    let out = claude.run(&home, &args, Duration::from_secs(120)).await?;
    let took = started.elapsed();
    let events: Vec<Value> = out.stdout.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    let context = || format!("after {took:?}: {out}\n{}", home.diagnostics());
    assert_eq!(out.code, Some(0), "{}", context());

    // Claude Code connected to Coffer in time (not `pending`) …
    let init = events.iter().find(|e| e["type"] == "system" && e["subtype"] == "init").expect("an init event");
    let coffer = init["mcp_servers"].as_array().into_iter().flatten().find(|s| s["name"] == "coffer");
    assert_eq!(coffer.map(|s| s["status"].clone()), Some(json!("connected")), "{init}\n{}", context());
    // … the model's first turn was offered Coffer's tools …
    let turns = model.turns();
    let first = turns.first().expect("the model was asked");
    assert!(first.offers(TOOL), "first turn's tools {:?}\n{}", first.tools(), context());
    // … and the call went through Coffer to the upstream and back.
    let result = turns.iter().flat_map(|t| t.tool_results()).find(|(id, _)| id == CALL_ID);
    let result = result.unwrap_or_else(|| panic!("no result of the call\n{}", context())).1;
    assert!(result.contains(ECHO_MESSAGE), "{result}\n{}", context());
    let done = events.iter().find(|e| e["type"] == "result").expect("a result event");
    assert_eq!(done["subtype"], "success", "{done}");
    assert!(done["result"].as_str().unwrap_or_default().contains(ECHO_MESSAGE), "{done}");

    let api = home.api()?;
    let records = wait_for("the call in the invocation log", Duration::from_secs(10), || async {
        let r = api.get("/v1/invocations?target=tiny1__echo").reply().await?;
        let items: Value = r.json()?;
        let found = items["items"].as_array().into_iter().flatten().any(|i| i["target"] == "tiny1__echo");
        Ok(found.then_some(items))
    })
    .await?;
    let call = records["items"].as_array().unwrap().iter().find(|i| i["target"] == "tiny1__echo").unwrap().clone();
    assert_eq!((call["server"].clone(), call["outcome"].clone()), (json!("tiny1"), json!("ok")), "{call}");

    // The hung server is remembered as failing (status says so), and costs a list nothing.
    wait_for("the hung server's failure in status", Duration::from_secs(30), || async {
        let s: Value = api.get("/v1/status").reply().await?.json()?;
        let hung = s["upstreams"].as_array().into_iter().flatten().find(|u| u["name"] == "hung").cloned();
        Ok(hung.filter(|h| h["catalog"]["state"] == "failed"))
    })
    .await?;
    let mut session = coffer_tests::stream::McpStream::open(&api, "2025-11-25").await?;
    let t = Instant::now();
    let names = session.tool_names().await?;
    let list_took = t.elapsed();
    assert!(names.iter().any(|n| n == "slow__echo"), "the slow server arrived meanwhile: {names:?}");
    assert!(!names.iter().any(|n| n.starts_with("hung__")), "{names:?}");
    // Far below the 10 s a list waiting for the hung server would take (`gateway.list_timeout_ms`);
    // 2 s, not less, so a loaded machine (the test runs beside CPU burners too) passes.
    assert!(list_took < Duration::from_secs(2), "a list with a hung server took {list_took:?}");
    Ok(())
}
