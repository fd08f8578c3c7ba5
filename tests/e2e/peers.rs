//! Coffer with real MCP clients and servers (pinned in `tests/peers/`): the Python SDK 1.x and 2.x
//! clients, the MCP Inspector CLI, the Rust SDK (`rmcp`) and the conformance suite, in front of
//! `server-everything`, `server-filesystem`, `mcp-server-time` and `mcp-server-git`. Each test starts its own daemon,
//! reuses it for every step, and ends by stopping it and checking that no process is left.
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use coffer_tests::mcp::{McpSession, register_everything, register_stdio, set_tool_enabled, wait_catalog_ready};
use coffer_tests::peers::{PyClient, Sdk, TokenProxy, node22, peer_path, run_to_end, texts, venv_bin};
use coffer_tests::{SendExt, TestHome, bin, wait_for};
use serde_json::{Value, json};

/// How long a notification may take to travel upstream → Coffer → shim → client.
const EVENT_TIMEOUT: Duration = Duration::from_secs(15);

/// Stops the daemon of `home` and checks that every process of the home (daemon, services,
/// shims, upstreams, peers) has exited.
async fn stop_and_check_nothing_is_left(home: &TestHome) -> anyhow::Result<()> {
    home.terminate_daemon(Duration::from_secs(20)).await.context("processes left behind")
}

fn has(names: &[String], name: &str) -> bool {
    names.iter().any(|n| n == name)
}

/// The README walkthrough with a real client: an MCP host (here the Python SDK 1.x) starts
/// `coffer-mcp-shim` as its stdio server, sees the registered server's tools, a tool disabled
/// through the API is refused with TOOL_DISABLED, and the invocation log shows both calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readme_walkthrough_with_the_python_sdk_through_the_shim() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;

    // `coffer mcp add everything -- node …/server-everything stdio`
    register_everything(&api, "everything").await?;

    // `claude mcp add coffer -- coffer-mcp-shim`: the client's SDK starts the shim itself.
    let mut client = PyClient::through_shim(&home, &[]).await?;
    assert_eq!(client.ready["serverInfo"]["name"], "coffer", "{}", client.ready);
    assert_eq!(client.protocol_version(), "2025-11-25");
    let tools = client.tools().await?;
    ensure!(has(&tools, "everything__echo") && has(&tools, "coffer__search_tools"), "{tools:?}");
    assert_eq!(
        client.call_text("everything__echo", json!({"message": "hello from python"})).await?,
        "Echo: hello from python"
    );

    // `coffer tools disable everything__echo`: calls now get TOOL_DISABLED.
    set_tool_enabled(&api, "everything__echo", false).await?;
    let refused = client.call("everything__echo", json!({"message": "refused"})).await?;
    assert_eq!(refused["error"]["code"], -32000, "{refused}");
    assert_eq!(refused["error"]["message"], "Tool everything__echo is disabled");

    // `coffer invocations`: who called what, how long, outcome (written in batches: wait).
    let rows = wait_for("both calls in /v1/invocations", Duration::from_secs(10), || async {
        let v = api.get("/v1/invocations?target=everything__echo").reply().await?.ok_json()?;
        let rows = v["items"].as_array().cloned().unwrap_or_default();
        Ok((rows.len() >= 2).then_some(rows))
    })
    .await?;
    let outcomes: Vec<&str> = rows.iter().filter_map(|r| r["outcome"].as_str()).collect();
    ensure!(outcomes.contains(&"ok") && outcomes.contains(&"disabled"), "{rows:?}");
    ensure!(rows.iter().all(|r| r["server"] == "everything" && r["method"] == "tools/call"), "{rows:?}");
    ensure!(rows[0]["session_id"] == rows[1]["session_id"], "one shim, one session: {rows:?}");
    ensure!(!serde_json::to_string(&rows)?.contains("hello from python"), "arguments are never stored");

    client.close().await?;
    stop_and_check_nothing_is_left(&home).await
}

/// Creates a git repository with one commit in `dir`, isolated from the machine's git config;
/// returns the commit id.
pub(crate) fn git_repo_with_one_commit(home: &TestHome, dir: &Path) -> anyhow::Result<String> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("README.md"), "hello from coffer-tests\n")?;
    let git = coffer_runtime::connect::which_on_path("git").context("git is not on PATH")?;
    let run = |args: &[&str]| {
        let mut cmd = home.command(&git);
        cmd.args(args)
            .current_dir(dir)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_AUTHOR_NAME", "Coffer Tests")
            .env("GIT_AUTHOR_EMAIL", "tests@coffer.invalid")
            .env("GIT_COMMITTER_NAME", "Coffer Tests")
            .env("GIT_COMMITTER_EMAIL", "tests@coffer.invalid");
        let out = cmd.output()?;
        ensure!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    };
    run(&["init", "-q"])?;
    run(&["add", "README.md"])?;
    run(&["commit", "-q", "-m", "first commit from coffer-tests"])?;
    run(&["rev-parse", "HEAD"])
}

/// The Python SDK 1.x Streamable HTTP client straight on `/mcp` (the token as a custom header),
/// with Python upstreams of the same SDK major (`mcp-server-time`, `mcp-server-git`) next to
/// `server-everything`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_http_client_with_time_and_git_upstreams() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let repo = home.temp().join("repo");
    let head = git_repo_with_one_commit(&home, &repo)?;
    register_everything(&api, "everything").await?;
    let time = venv_bin(Sdk::V1, "mcp-server-time")?;
    register_stdio(&api, "time", &time, &["--local-timezone".into(), "UTC".into()], json!({})).await?;
    let git = venv_bin(Sdk::V1, "mcp-server-git")?;
    register_stdio(&api, "git", &git, &["--repository".into(), repo.display().to_string()], json!({})).await?;

    let mut client = PyClient::over_http(&home, &api, Sdk::V1, &[]).await?;
    assert_eq!(client.protocol_version(), "2025-11-25");
    let tools = client.tools().await?;
    for t in ["coffer__search_tools", "everything__echo", "time__get_current_time", "git__git_log", "git__git_status"] {
        ensure!(has(&tools, t), "{t} missing from {tools:?}");
    }
    assert_eq!(client.call_text("everything__echo", json!({"message": "over http"})).await?, "Echo: over http");

    let now: Value =
        serde_json::from_str(&client.call_text("time__get_current_time", json!({"timezone": "UTC"})).await?)?;
    assert_eq!(now["timezone"], "UTC", "{now}");
    ensure!(now["datetime"].as_str().is_some_and(|d| d.ends_with("+00:00") && d.len() >= 25), "{now}");

    let log = client.call_text("git__git_log", json!({"repo_path": repo})).await?;
    ensure!(log.contains(&head) && log.contains("first commit from coffer-tests"), "{log}");
    let status = client.call_text("git__git_status", json!({"repo_path": repo})).await?;
    ensure!(status.contains("nothing to commit"), "{status}");

    client.close().await?;
    stop_and_check_nothing_is_left(&home).await
}

/// The Python SDK 2.x `Client` in auto mode probes `server/discover` (2026-07-28), which Coffer
/// answers, and stays on 2026-07-28 without `initialize` (more in `eras.rs`); forced to the
/// legacy era (`--mode legacy`) it initializes at 2025-11-25 as before, on the same daemon.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_2x_client_speaks_2026_07_28_or_legacy_when_asked() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    register_everything(&api, "everything").await?;

    let mut client = PyClient::over_http(&home, &api, Sdk::V2, &["--mode", "auto"]).await?;
    assert_eq!(client.ready["sdk"], "2.3.0", "{}", client.ready);
    assert_eq!(client.protocol_version(), "2026-07-28");
    let tools = client.tools().await?;
    ensure!(has(&tools, "everything__echo"), "{tools:?}");
    assert_eq!(client.call_text("everything__echo", json!({"message": "v2"})).await?, "Echo: v2");
    let wire = client.op(json!({"op": "wire"})).await?["wire"].clone();
    let wire = wire.as_array().context("wire log")?;
    assert_eq!(wire[0], json!({"sent": "server/discover"}), "{wire:?}");
    ensure!(wire[1]["status"] == 200 && wire[1].get("error").is_none(), "the probe is answered: {wire:?}");
    ensure!(!wire.contains(&json!({"sent": "initialize"})), "{wire:?}");
    client.close().await?;

    let mut legacy = PyClient::over_http(&home, &api, Sdk::V2, &["--mode", "legacy"]).await?;
    assert_eq!(legacy.protocol_version(), "2025-11-25");
    assert_eq!(legacy.call_text("everything__echo", json!({"message": "old"})).await?, "Echo: old");
    home.wait_for_log_line("gateway", &["MCP session started", "2025-11-25"], Duration::from_secs(10)).await?;
    legacy.close().await?;
    stop_and_check_nothing_is_left(&home).await
}

/// The MCP Inspector CLI (Node 22) launches `coffer-mcp-shim` as its stdio server: no token to
/// configure, the shim finds the daemon through `COFFER_HOME`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspector_cli_lists_and_calls_through_the_shim() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    // The first list must hold the upstream however long node takes to start it (a loaded
    // machine); the first-list deadline is not what this test is about.
    coffer_tests::mcp::patient_lists(&api).await?;
    register_everything(&api, "everything").await?;
    let inspector = coffer_tests::peers::InspectorCli::new(&home)?;

    let out = inspector.run(&home, &["--method", "tools/list"], Duration::from_secs(60)).await?;
    ensure!(out.code == Some(0), "inspector tools/list: {out}");
    let listed: Value = serde_json::from_str(&out.stdout).with_context(|| format!("{out}"))?;
    let names: Vec<&str> =
        listed["tools"].as_array().context("tools")?.iter().filter_map(|t| t["name"].as_str()).collect();
    ensure!(names.contains(&"everything__echo") && names.contains(&"coffer__search_tools"), "{names:?}");

    let call = ["--method", "tools/call", "--tool-name", "everything__echo", "--tool-arg", "message=hi"];
    let out = inspector.run(&home, &call, Duration::from_secs(60)).await?;
    ensure!(out.code == Some(0), "inspector tools/call: {out}");
    let result: Value = serde_json::from_str(&out.stdout).with_context(|| format!("{out}"))?;
    assert_eq!(result["content"], json!([{"type": "text", "text": "Echo: hi"}]), "{result}");

    stop_and_check_nothing_is_left(&home).await
}

/// The official Rust SDK (`rmcp`) as the client of `coffer-mcp-shim` over stdio.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rmcp_client_lists_and_calls_through_the_shim() -> anyhow::Result<()> {
    use rmcp::ServiceExt;
    use rmcp::model::CallToolRequestParams;

    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    // The first list must hold the upstream however long node takes to start it (a loaded
    // machine); the first-list deadline is not what this test is about.
    coffer_tests::mcp::patient_lists(&api).await?;
    register_everything(&api, "everything").await?;

    // rmcp's child-process transport is the async-rw transport over a spawned child's stdio; we
    // spawn the shim ourselves (see the workspace Cargo.toml for why) with the home's environment.
    let stderr = std::fs::File::create(home.temp().join("rmcp-shim.stderr"))?;
    let mut cmd = home.command(&bin("coffer-mcp-shim")?);
    cmd.stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped()).stderr(stderr);
    let mut cmd = tokio::process::Command::from(cmd);
    cmd.kill_on_drop(true);
    let mut shim = cmd.spawn().context("starting coffer-mcp-shim")?;
    let io = (shim.stdout.take().context("stdout")?, shim.stdin.take().context("stdin")?);
    let client = ().serve(io).await.context("rmcp initialize through the shim")?;

    let info = client.peer_info().context("server info after initialize")?;
    assert_eq!(info.server_info.as_ref().map(|s| s.name.as_str()), Some("coffer"), "{info:?}");
    let tools = client.list_all_tools().await?;
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    ensure!(names.contains(&"everything__echo") && names.contains(&"coffer__search_tools"), "{names:?}");
    let args = json!({"message": "from rmcp"}).as_object().cloned().context("object")?;
    let result = client.call_tool(CallToolRequestParams::new("everything__echo").with_arguments(args)).await?;
    assert_eq!(texts(&serde_json::to_value(&result)?), "Echo: from rmcp", "{result:?}");

    // Closing the client closes the shim's stdin: it ends its session and exits by itself.
    client.cancel().await?;
    let status =
        tokio::time::timeout(Duration::from_secs(15), shim.wait()).await.context("the shim did not exit")??;
    ensure!(status.success(), "shim exit: {status}");
    stop_and_check_nothing_is_left(&home).await
}

/// Requests that upstreams send to the client (sampling, elicitation, roots) are relayed through
/// Coffer and the shim to the Python client's callbacks, and their answers come back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampling_elicitation_and_roots_reach_the_client_callbacks() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    register_everything(&api, "everything").await?;
    // This client's capabilities are new to the catalog: its first list waits for its own.
    coffer_tests::mcp::patient_lists(&api).await?;
    let mut client = PyClient::through_shim(
        &home,
        &["--sampling", "four", "--elicitation", r#"{"name": "Ada Lovelace"}"#, "--root", "file:///coffer-test/root-a"],
    )
    .await?;
    // server-everything offers these only to clients that declared the capabilities; Coffer
    // mirrors the client's capabilities in the upstream's initialize.
    let wanted = [
        "everything__trigger-sampling-request",
        "everything__trigger-elicitation-request",
        "everything__get-roots-list",
    ];
    client.tools_including(&wanted, Duration::from_secs(30)).await?;

    let sampled = client.call_text("everything__trigger-sampling-request", json!({"prompt": "What is 2+2?"})).await?;
    ensure!(sampled.contains(r#""text": "four""#) && sampled.contains("coffer-test-model"), "{sampled}");
    let asked = client.wait_event("the sampling callback", EVENT_TIMEOUT, |e| e["kind"] == "sampling").await?;
    ensure!(asked["texts"][0].as_str().is_some_and(|t| t.contains("What is 2+2?")), "{asked}");
    assert_eq!(asked["maxTokens"], 100, "the request reaches the client unchanged: {asked}");

    let elicited = client.call_text("everything__trigger-elicitation-request", json!({})).await?;
    ensure!(elicited.contains("- Name: Ada Lovelace"), "{elicited}");
    client.wait_event("the elicitation callback", EVENT_TIMEOUT, |e| e["kind"] == "elicitation").await?;

    let roots = client.call_text("everything__get-roots-list", json!({})).await?;
    ensure!(roots.contains("file:///coffer-test/root-a") && roots.contains("root0"), "{roots}");
    client.wait_event("the roots callback", EVENT_TIMEOUT, |e| e["kind"] == "roots").await?;

    client.close().await?;
    stop_and_check_nothing_is_left(&home).await
}

/// A client without the sampling capability is never offered the sampling tool, and a client
/// that declares sampling but never answers gets a bounded -32002, not a hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampling_without_the_capability_or_without_an_answer() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let node = coffer_runtime::connect::which_on_path("node").context("node is not on PATH")?;
    let everything = peer_path("node_modules/@modelcontextprotocol/server-everything/dist/index.js")?;
    let r = api
        .post_json(
            "/v1/mcp/servers",
            &json!({"name": "hasty", "command": node, "args": [everything, "stdio"], "timeout_ms": 2000}),
        )
        .reply()
        .await?;
    ensure!(r.status.is_success(), "{}", r.text);
    // Each client's capabilities are new to the catalog: its first list waits for its own.
    coffer_tests::mcp::patient_lists(&api).await?;

    // Observed: server-everything registers trigger-sampling-request only for clients that
    // declared sampling, so a plain client does not see it and calling it is an unknown tool.
    let mut plain = PyClient::through_shim(&home, &[]).await?;
    let tools = plain.tools().await?;
    ensure!(has(&tools, "hasty__echo") && !has(&tools, "hasty__trigger-sampling-request"), "{tools:?}");
    let r = plain.call("hasty__trigger-sampling-request", json!({"prompt": "x"})).await?;
    assert_eq!(r["error"]["code"], -32602, "{r}");
    plain.close().await?;

    // A client that receives the sampling request and never answers it.
    let mut silent = PyClient::through_shim(&home, &["--sampling-silent"]).await?;
    silent.tools_including(&["hasty__trigger-sampling-request"], Duration::from_secs(30)).await?;
    let started = Instant::now();
    let r = silent.call("hasty__trigger-sampling-request", json!({"prompt": "anyone?"})).await?;
    let elapsed = started.elapsed();
    assert_eq!(r["error"]["code"], -32002, "the server's per-call timeout: {r}");
    ensure!(
        elapsed >= Duration::from_millis(1500) && elapsed < Duration::from_secs(10),
        "bounded by timeout_ms 2000: {elapsed:?}"
    );
    ensure!(silent.events().iter().any(|e| e["kind"] == "sampling-ignored"), "the request reached the client");
    // The session and the upstream are still usable.
    assert_eq!(silent.call_text("hasty__echo", json!({"message": "still here"})).await?, "Echo: still here");
    silent.close().await?;
    stop_and_check_nothing_is_left(&home).await
}

/// Upstream log messages reach the client's logging callback with `logger` naming the server;
/// a tool toggled through the API makes `tools/list_changed` reach the client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logging_and_list_changed_notifications_reach_the_client() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    register_everything(&api, "everything").await?;
    let mut client = PyClient::through_shim(&home, &[]).await?;
    ensure!(has(&client.tools().await?, "everything__toggle-simulated-logging"));

    assert_eq!(client.op(json!({"op": "set_level", "level": "debug"})).await?["result"], json!({}));
    let started = client.call_text("everything__toggle-simulated-logging", json!({})).await?;
    ensure!(started.starts_with("Started simulated"), "{started}");
    let log = client.wait_event("an upstream log message", EVENT_TIMEOUT, |e| e["kind"] == "log").await?;
    assert_eq!(log["logger"], "everything", "Coffer names the server in logger: {log}");
    ensure!(log["data"].as_str().is_some_and(|d| d.contains("message")), "{log}");
    ensure!(log["level"].is_string(), "{log}");
    client.call_text("everything__toggle-simulated-logging", json!({})).await?;

    client.clear_events();
    set_tool_enabled(&api, "everything__echo", false).await?;
    let is_tools_changed = |e: &Value| e["kind"] == "notification" && e["method"] == "notifications/tools/list_changed";
    client.wait_event("tools/list_changed after disabling a tool", EVENT_TIMEOUT, is_tools_changed).await?;
    ensure!(!has(&client.tools().await?, "everything__echo"));
    client.clear_events();
    set_tool_enabled(&api, "everything__echo", true).await?;
    client.wait_event("tools/list_changed after enabling it", EVENT_TIMEOUT, is_tools_changed).await?;
    ensure!(has(&client.tools().await?, "everything__echo"));

    client.close().await?;
    stop_and_check_nothing_is_left(&home).await
}

/// `@modelcontextprotocol/conformance` (server mode) through the token proxy: every scenario that
/// does not depend on the reference server's own capability names passes, and the baseline of
/// those that do is not stale (the suite fails on a listed scenario that passes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_suite_passes_outside_the_baseline() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    register_everything(&api, "everything").await?;
    let proxy = TokenProxy::start(&home, &api).await?;
    let suite = peer_path("node_modules/@modelcontextprotocol/conformance/dist/index.js")?;
    let baseline = Path::new(env!("CARGO_MANIFEST_DIR")).join("conformance-baseline.yml");
    let results = home.temp().join("conformance");
    std::fs::create_dir_all(&results)?;
    let args = vec![
        suite.display().to_string(),
        "server".into(),
        "--url".into(),
        proxy.mcp_url(),
        "--expected-failures".into(),
        baseline.display().to_string(),
        "-o".into(),
        results.display().to_string(),
    ];
    let out = run_to_end(&home, &node22()?, &args, &[], &results, Duration::from_secs(180)).await?;
    // Its output is shown only on failure: its "Total: N passed, N failed" line reads like a
    // test runner's summary to CI log parsers.
    ensure!(out.code == Some(0), "conformance suite failed:\n{out}");
    ensure!(out.stdout.contains("Baseline check passed"), "conformance suite output:\n{out}");
    proxy.stop().await;
    stop_and_check_nothing_is_left(&home).await
}

/// The shim outlives the daemon: after `coffer daemon stop` the call in flight fails at once with
/// -32001, and the client, without initializing again, is served by a daemon the shim starts.
///
/// The first call after the stop races the shim's discovery of the loss (its `GET /mcp` listener
/// reconnects about a second after the stream ends): sent before that, its POST is refused and it
/// gets -32001 at once ("may be retried"); sent after, the shim re-initializes first and it works.
/// Either way the call after that works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shim_survives_a_daemon_restart() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    register_everything(&api, "everything").await?;
    let first = home.daemon_info()?.pid;
    // A client that can hold a call open: it never answers the sampling request the call triggers.
    let mut client = PyClient::through_shim(&home, &["--sampling-silent"]).await?;
    let before = client.call_text("everything__echo", json!({"message": "before"})).await.context("before the stop")?;
    assert_eq!(before, "Echo: before");

    client
        .send(json!({"op": "call", "name": "everything__trigger-sampling-request", "args": {"prompt": "wait"}}))
        .await?;
    client.wait_event("the call to be in flight", EVENT_TIMEOUT, |e| e["kind"] == "sampling-ignored").await?;
    let stopped = home.cli(&["daemon", "stop"]).await?.ok()?;
    let stopped_at = Instant::now();
    let r = client.recv().await?;
    assert_eq!(r["error"]["code"], -32001, "the call in flight: {r}; stop said {stopped}");
    ensure!(
        stopped_at.elapsed() < Duration::from_secs(5),
        "at once, not at the call timeout: {:?}",
        stopped_at.elapsed()
    );

    let mut refused = 0;
    let after = loop {
        let started = Instant::now();
        let r = client.call("everything__echo", json!({"message": "after"})).await?;
        if r["error"]["code"] == -32001 && refused == 0 {
            ensure!(started.elapsed() < Duration::from_secs(2), "refused at once: {:?}", started.elapsed());
            refused += 1;
            continue;
        }
        break r;
    };
    assert_eq!(texts(&after["result"]), "Echo: after", "the call after the stop (after {refused} refused): {after}");
    let second = home.wait_ready(Duration::from_secs(10)).await?;
    let now = home.daemon_info()?.pid;
    ensure!(now != first, "a new daemon runs: {first} then {now}");
    assert_eq!(second.health().await?["pid"], now);
    ensure!(has(&client.tools().await?, "everything__echo"));

    client.close().await?;
    stop_and_check_nothing_is_left(&home).await
}

#[tokio::test]
async fn filesystem_peer_through_coffer() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let dir = home.temp().join("shared-files");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("note.txt"), "hello from a file")?;
    let node = coffer_runtime::connect::which_on_path("node").context("node is not on PATH")?;
    let entry = coffer_tests::peer("node_modules/@modelcontextprotocol/server-filesystem/dist/index.js")?;
    register_stdio(&api, "fs", &node, &[entry.display().to_string(), dir.display().to_string()], json!({})).await?;
    // A session's first list holds only the servers the catalog has listed within
    // `gateway.first_list_timeout_ms`: wait until it has listed this one (a loaded machine
    // starts Node slower than that).
    wait_catalog_ready(&api, "fs", Duration::from_secs(60)).await?;
    let s = McpSession::latest(&api).await?;
    let names = s.tool_names().await?;
    let read =
        names.iter().find(|n| *n == "fs__read_text_file" || *n == "fs__read_file").context("a read tool")?.clone();
    let file = dir.join("note.txt").canonicalize()?;
    let r = s.tool(&read, json!({"path": file})).await?;
    let text = r["result"]["content"][0]["text"].as_str().unwrap_or_default();
    ensure!(text.contains("hello from a file"), "{r}");
    // Outside the allowed folder: the upstream's own error comes back unchanged (isError).
    let r = s.tool(&read, json!({"path": "/etc/hostname"})).await?;
    ensure!(r["result"]["isError"] == true || r["error"].is_object(), "{r}");
    Ok(())
}

/// Issue 36 §4 and §5 through the real gateway, with the real peers registered as the labelled
/// set's fixture names them (`tool_rank/peer_tools.json`): `coffer__search_tools` answers "what
/// time is it in Tokyo" with the two time tools first (a disabled one found, and marked), in a
/// few short lines; bad input is a tool error that the invocation log records as the caller's
/// (`invalid`), not as `upstream_error`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_tools_finds_the_time_tools_among_the_real_peers() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let repo = home.temp().join("repo");
    git_repo_with_one_commit(&home, &repo)?;
    let files = home.temp().join("files");
    std::fs::create_dir_all(&files)?;
    register_everything(&api, "everything").await?;
    let node = coffer_runtime::connect::which_on_path("node").context("node is not on PATH")?;
    let fs_entry = coffer_tests::peer("node_modules/@modelcontextprotocol/server-filesystem/dist/index.js")?;
    register_stdio(&api, "fs", &node, &[fs_entry.display().to_string(), files.display().to_string()], json!({}))
        .await?;
    let time = venv_bin(Sdk::V1, "mcp-server-time")?;
    register_stdio(&api, "time", &time, &["--local-timezone".into(), "UTC".into()], json!({})).await?;
    let git = venv_bin(Sdk::V1, "mcp-server-git")?;
    register_stdio(&api, "git", &git, &["--repository".into(), repo.display().to_string()], json!({})).await?;
    for server in ["everything", "fs", "time", "git"] {
        wait_catalog_ready(&api, server, Duration::from_secs(60)).await?;
    }
    set_tool_enabled(&api, "time__convert_time", false).await?;

    let s = McpSession::latest(&api).await?;
    let r = s.tool("coffer__search_tools", json!({"query": "what time is it in Tokyo"})).await?;
    let result = &r["result"];
    ensure!(result["isError"] != true, "{r}");
    let matches = result["structuredContent"]["matches"].as_array().context("matches")?;
    let names: Vec<&str> = matches.iter().filter_map(|m| m["name"].as_str()).collect();
    ensure!(names.len() >= 2 && names[..2].iter().all(|n| n.starts_with("time__")), "time tools first: {names:?}");
    ensure!(matches.len() <= 5, "five at most by default: {names:?}");
    let convert = matches.iter().find(|m| m["name"] == "time__convert_time").context("the disabled tool is found")?;
    assert_eq!(convert["enabled"], false, "{convert}");
    assert_eq!(convert["server"], "time");
    let text = result["content"][0]["text"].as_str().unwrap_or_default();
    ensure!(text.contains("time__get_current_time — Get current time in a specific timezone"), "{text}");
    ensure!(text.contains("(disabled)"), "{text}");
    let bytes = serde_json::to_string(result)?.len();
    ensure!(bytes < 1500, "a compact answer: {bytes} bytes: {result}");

    // Bad input: a clear tool error, recorded as the caller's mistake.
    let bad = s.tool("coffer__search_tools", json!({"query": ""})).await?;
    assert_eq!(bad["result"]["isError"], true, "{bad}");
    let why = bad["result"]["content"][0]["text"].as_str().unwrap_or_default();
    ensure!(why.starts_with("coffer__search_tools: invalid arguments: query is empty"), "{why}");
    let wrong = s.tool("coffer__search_tools", json!({"query": "time", "limit": "ten"})).await?;
    assert_eq!(wrong["result"]["isError"], true, "{wrong}");
    let rows = wait_for("the three search_tools calls in /v1/invocations", Duration::from_secs(10), || async {
        let v = api.get("/v1/invocations?target=coffer__search_tools").reply().await?.ok_json()?;
        let rows = v["items"].as_array().cloned().unwrap_or_default();
        Ok((rows.len() >= 3).then_some(rows))
    })
    .await?;
    let mut outcomes: Vec<&str> = rows.iter().filter_map(|r| r["outcome"].as_str()).collect();
    outcomes.sort_unstable();
    assert_eq!(outcomes, ["invalid", "invalid", "ok"], "{rows:?}");

    stop_and_check_nothing_is_left(&home).await
}
