//! Issue 31, "Done when": a client's first contact with Coffer right after `coffer daemon
//! restart` is offered every registered server's tools. Eight servers are registered (the real
//! peers server-everything, server-filesystem, mcp-server-time and mcp-server-git, and four of
//! our tiny upstream with different tool sets, one of them taking 3 s to start), the capability
//! catalog learns them through one client session, the daemon is restarted with the real CLI,
//! and within one second a real client starts: headless Claude Code (the pinned 2.1.332 and
//! 2.1.197, on a fake Anthropic API), `codex exec` (on a fake Responses API), the Inspector CLI,
//! and a Python SDK client declaring roots, sampling and elicitation (a capability set the
//! catalog has never seen). Each must get every server's tools in its first list (for the
//! agents: on the model's first turn) and call one.
//!
//! Before the fix the catalog lived in memory only, keyed by the client's exact capabilities:
//! after the restart a first list waited at most `gateway.first_list_timeout_ms` (1 s) for the
//! servers to start again and answered with whichever had, and Claude Code (2.1.197 and later)
//! offered the model Coffer's built-in tools only.
//!
//! Each test does its own setup and restart, so each is a cold first contact.
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use coffer_tests::anthropic::{CALL_ID, ECHO_MESSAGE, FakeAnthropic};
use coffer_tests::mcp::{McpSession, register_everything, register_stdio, register_tiny, wait_catalog_ready};
use coffer_tests::openai::FakeOpenAi;
use coffer_tests::peers::{ClaudeCode, PyClient, Sdk, peer_path, run_codex, venv_bin};
use coffer_tests::{TestHome, bin};
use serde_json::{Value, json};

/// How soon after `coffer daemon restart` returned each client is started.
const FIRST_CONTACT: Duration = Duration::from_secs(1);
/// How long the catalog may take to learn the eight servers (a slow server's failed start is
/// retried after a 5 s backoff).
const LEARN_TIMEOUT: Duration = Duration::from_secs(90);
/// How long one client may run (an agent's whole headless run, tool call included).
const CLIENT_TIMEOUT: Duration = Duration::from_secs(120);
/// Coffer's own tools, listed beside the upstreams' (not part of the completeness check).
const BUILT_IN: &str = "coffer__";

/// A home with eight registered servers whose tools the capability catalog has learned, and
/// each server's exposed tool names (`<server>__<tool>`) as a client with no capabilities saw
/// them before the restart.
struct Registered {
    home: TestHome,
    expected: BTreeMap<String, Vec<String>>,
}

impl Registered {
    /// Starts a daemon, registers the eight servers, waits until the catalog has listed each,
    /// and lists them through one client session (capabilities `{}`), which must see all eight.
    async fn eight_servers() -> anyhow::Result<Self> {
        let home = TestHome::new()?;
        let api = home.start_daemon().await?;
        let node = coffer_runtime::connect::which_on_path("node").context("node is not on PATH")?;

        register_everything(&api, "everything").await?;
        let files = home.temp().join("files");
        coffer_tests::write_file(&files.join("note.txt"), "hello from a file")?;
        let fs_entry = peer_path("node_modules/@modelcontextprotocol/server-filesystem/dist/index.js")?;
        register_stdio(
            &api,
            "filesystem",
            &node,
            &[fs_entry.display().to_string(), files.display().to_string()],
            json!({}),
        )
        .await?;
        let time = venv_bin(Sdk::V1, "mcp-server-time")?;
        register_stdio(&api, "time", &time, &["--local-timezone".into(), "UTC".into()], json!({})).await?;
        let repo = home.temp().join("repo");
        crate::peers::git_repo_with_one_commit(&home, &repo)?;
        let git = venv_bin(Sdk::V1, "mcp-server-git")?;
        register_stdio(&api, "git", &git, &["--repository".into(), repo.display().to_string()], json!({})).await?;
        // Our tiny upstream with its own tools and 20 and 40 more, and one that takes 3 s to start (an
        // interpreter loading): a first list that waits 1 s for it cannot hold its tools.
        register_tiny(&api, "tiny", json!({})).await?;
        register_tiny(&api, "more", json!({"TINY_EXTRA_TOOLS": "20"})).await?;
        register_tiny(&api, "wide", json!({"TINY_EXTRA_TOOLS": "40"})).await?;
        let tiny = bin("coffer-tiny-upstream")?;
        register_stdio(
            &api,
            "slow",
            &tiny,
            &["--start-delay-ms".into(), "3000".into()],
            json!({"TINY_EXTRA_TOOLS": "10"}),
        )
        .await?;

        let servers = ["everything", "filesystem", "time", "git", "tiny", "more", "wide", "slow"];
        // On a loaded machine a Python server may miss the catalog's start deadline; it is then
        // retried in the background (after its backoff) until it lists.
        for server in servers {
            wait_catalog_ready(&api, server, LEARN_TIMEOUT).await.map_err(|e| e.context(home.diagnostics()))?;
        }
        let session = McpSession::latest(&api).await?;
        let names = session.tool_names().await?;
        let mut expected: BTreeMap<String, Vec<String>> =
            servers.iter().map(|s| ((*s).to_owned(), Vec::new())).collect();
        for name in names.iter().filter(|n| !n.starts_with(BUILT_IN)) {
            let server = name.split("__").next().unwrap_or_default();
            expected.get_mut(server).with_context(|| format!("{name} is of no registered server"))?.push(name.clone());
        }
        let empty: Vec<&String> = expected.iter().filter(|(_, t)| t.is_empty()).map(|(s, _)| s).collect();
        ensure!(empty.is_empty(), "before the restart, a session's list lacks {empty:?}: {names:?}");
        let base = expected["tiny"].len();
        ensure!(
            expected["more"].len() == base + 20
                && expected["wide"].len() == base + 40
                && expected["slow"].len() == base + 10,
            "the tiny upstreams' extra tools are not all listed: {expected:?}"
        );
        session.delete().await?;
        Ok(Self { home, expected })
    }

    /// `coffer daemon restart` (the real CLI), checked to have replaced the daemon; returns when
    /// it returned.
    async fn restart(&self) -> anyhow::Result<Instant> {
        let old = self.home.daemon_info()?.pid;
        self.home.cli(&["daemon", "restart"]).await?.ok()?;
        let restarted = Instant::now();
        let new = self.home.daemon_info()?.pid;
        ensure!(new != old, "`coffer daemon restart` left daemon {old} running");
        Ok(restarted)
    }

    /// Fails unless `has` holds for every tool of every server, naming per server what is
    /// missing.
    fn assert_complete(&self, client: &str, has: impl Fn(&str) -> bool, context: impl FnOnce() -> String) {
        let mut gaps = Vec::new();
        for (server, tools) in &self.expected {
            let missing: Vec<&str> = tools.iter().map(String::as_str).filter(|t| !has(t)).collect();
            if !missing.is_empty() {
                let shown: Vec<&str> = missing.iter().copied().take(5).collect();
                let more = if missing.len() > shown.len() { ", …" } else { "" };
                gaps.push(format!(
                    "  {server}: {} of {} tools missing ({}{more})",
                    missing.len(),
                    tools.len(),
                    shown.join(", ")
                ));
            }
        }
        assert!(
            gaps.is_empty(),
            "{client}'s first list after the restart lacks tools of {} of {} servers:\n{}\n{}",
            gaps.len(),
            self.expected.len(),
            gaps.join("\n"),
            context()
        );
    }
}

/// Fails when the client is started later than [`FIRST_CONTACT`] after the restart.
fn started_in_time(restarted: Instant) -> Duration {
    let gap = restarted.elapsed();
    assert!(gap < FIRST_CONTACT, "the client started {gap:?} after the restart, not within {FIRST_CONTACT:?}");
    gap
}

/// Headless Claude Code (`program`) through the shim, started right after the restart: its
/// first model turn offers every server's tools (in `tools`, or deferred behind `ToolSearch`),
/// and it calls `everything`'s echo through Coffer.
async fn claude_code_first_turn(program: std::path::PathBuf) -> anyhow::Result<()> {
    const TOOL: &str = "mcp__coffer__everything__echo";
    let setup = Registered::eight_servers().await?;
    let home = &setup.home;
    let model = FakeAnthropic::start(TOOL).await?;
    // Waiting for its MCP servers: the first turn then holds Coffer's first list, which is what
    // this test judges (by default Claude Code races the shim's start against the first turn).
    let claude = ClaudeCode::of(program, home, &model.url)?.waiting_for_mcp();
    claude.add_coffer(home).await?;
    let args = ["-p", "Call the echo tool of Coffer's everything server.", "--allowedTools", TOOL];
    let args = [&args[..], &["--output-format", "stream-json", "--verbose"]].concat();

    let restarted = setup.restart().await?;
    let gap = started_in_time(restarted);
    let out = claude.run(home, &args, CLIENT_TIMEOUT).await?;
    let context = || format!("started {gap:?} after the restart: {out}\n{}", home.diagnostics());
    assert_eq!(out.code, Some(0), "{}", context());

    let turns = model.turns();
    let first = turns.first().unwrap_or_else(|| panic!("the model was never asked\n{}", context()));
    setup.assert_complete(
        "Claude Code",
        |t| first.offers(&format!("mcp__coffer__{t}")),
        || format!("first turn's tools {:?}\n{}", first.tools(), context()),
    );
    let result = turns.iter().flat_map(|t| t.tool_results()).find(|(id, _)| id == CALL_ID);
    let result = result.unwrap_or_else(|| panic!("no result of the call\n{}", context())).1;
    assert!(result.contains(&format!("Echo: {ECHO_MESSAGE}")), "{result}\n{}", context());
    Ok(())
}

#[tokio::test]
async fn claude_code_is_offered_every_server_on_its_first_turn_right_after_a_restart() -> anyhow::Result<()> {
    claude_code_first_turn(coffer_tests::peers::claude_code()?).await
}

#[tokio::test]
async fn claude_code_2_1_197_is_offered_every_server_on_its_first_turn_right_after_a_restart() -> anyhow::Result<()> {
    claude_code_first_turn(coffer_tests::peers::claude_code_2_1_197()?).await
}

/// `codex exec` with Coffer's shim as its MCP server `coffer` (written by `coffer connect
/// codex`), started right after the restart: its first request to the model offers every
/// server's tools (Codex puts an MCP server's tools in one `namespace` tool, `mcp__coffer`), and
/// it calls `time`'s `get_current_time` through Coffer. Before the fix its first request right
/// after a restart carried no Coffer tool at all, or only those of the servers that had started
/// within the first list's 1 s wait.
#[tokio::test]
async fn codex_exec_is_offered_every_server_on_its_first_request_right_after_a_restart() -> anyhow::Result<()> {
    let setup = Registered::eight_servers().await?;
    let home = &setup.home;
    let model = FakeOpenAi::start().await?;
    let user_home = std::path::PathBuf::from(&home.env()["HOME"]);
    coffer_tests::write_file(&user_home.join(".codex/config.toml"), model.codex_config("fake-model"))?;
    home.cli(&["connect", "codex"]).await?.ok()?;
    let prompt = r#"Ask Coffer for the time. TOOL[time__get_current_time {"timezone": "UTC"}]"#;
    let args = ["exec", "--skip-git-repo-check", prompt];
    let env = [("OPENAI_API_KEY", "sk-test-not-a-real-key")];

    let restarted = setup.restart().await?;
    let gap = started_in_time(restarted);
    let out = run_codex(home, &args, &env, CLIENT_TIMEOUT).await?;
    let context = || format!("started {gap:?} after the restart: {out}\n{}", home.diagnostics());
    assert_eq!(out.code, Some(0), "codex exec failed: {}", context());

    let requests = model.requests();
    let first = requests.first().unwrap_or_else(|| panic!("the model was never asked\n{}", context()));
    let offered: Vec<String> =
        first.functions().into_iter().filter(|(ns, _)| *ns == Some("mcp__coffer")).map(|(_, f)| f.to_owned()).collect();
    // Codex offers a tool name with `-` as `_` (server-everything's `get-env` as `get_env`).
    setup.assert_complete(
        "codex exec",
        |t| offered.iter().any(|o| *o == t.replace('-', "_")),
        || format!("first request's functions {:?}\n{}", first.functions(), context()),
    );
    let output = requests.iter().find_map(|r| r.call_output());
    let output = output.unwrap_or_else(|| panic!("no output of the call\n{}", context()));
    assert!(output.contains("\"timezone\"") && output.contains("UTC"), "{output}\n{}", context());
    Ok(())
}

/// The Inspector CLI (Node 22) launching the shim, right after the restart: `tools/list`
/// returns every server's tools, and then a `tools/call` (another Inspector run, so another
/// session) of the slow server's echo succeeds.
#[tokio::test]
async fn inspector_cli_lists_every_server_and_calls_right_after_a_restart() -> anyhow::Result<()> {
    let setup = Registered::eight_servers().await?;
    let home = &setup.home;
    let inspector = coffer_tests::peers::InspectorCli::new(home)?;

    let restarted = setup.restart().await?;
    let gap = started_in_time(restarted);
    let out = inspector.run(home, &["--method", "tools/list"], CLIENT_TIMEOUT).await?;
    let context = || format!("started {gap:?} after the restart: {out}\n{}", home.diagnostics());
    assert_eq!(out.code, Some(0), "inspector tools/list: {}", context());
    let listed: Value = serde_json::from_str(&out.stdout).with_context(context)?;
    let names: Vec<&str> =
        listed["tools"].as_array().into_iter().flatten().filter_map(|t| t["name"].as_str()).collect();
    setup.assert_complete("the Inspector CLI", |t| names.contains(&t), context);

    let call = ["--method", "tools/call", "--tool-name", "slow__echo", "--tool-arg", "message=inspector"];
    let out = inspector.run(home, &call, CLIENT_TIMEOUT).await?;
    ensure!(out.code == Some(0), "inspector tools/call: {out}\n{}", home.diagnostics());
    let result: Value = serde_json::from_str(&out.stdout).with_context(|| format!("{out}"))?;
    assert_eq!(result["content"], json!([{"type": "text", "text": "inspector"}]), "{result}");
    Ok(())
}

/// A Python SDK client through the shim declaring roots, sampling and elicitation — client
/// capabilities no session had before — right after the restart: its first `tools/list` has
/// every server's tools, and it calls `tiny`'s `add`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_with_new_capabilities_lists_every_server_right_after_a_restart() -> anyhow::Result<()> {
    let setup = Registered::eight_servers().await?;
    let home = &setup.home;
    let root = format!("file://{}", home.temp().join("files").display());
    let options =
        ["--root", root.as_str(), "--sampling", "sampled by the test", "--elicitation", r#"{"name": "test"}"#];

    let restarted = setup.restart().await?;
    let gap = started_in_time(restarted);
    let mut client = PyClient::through_shim(home, &options).await?;
    let tools = client.tools().await?;
    setup.assert_complete(
        "the Python client (roots, sampling, elicitation)",
        |t| tools.iter().any(|n| n == t),
        || format!("started {gap:?} after the restart; listed {tools:?}\n{}", home.diagnostics()),
    );
    assert_eq!(client.call_text("tiny__add", json!({"a": 2, "b": 3})).await?, "5");
    client.close().await
}
