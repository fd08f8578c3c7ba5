//! Smaller findings in the MCP gateway (issue 31), end to end on real daemons: `arguments: null`,
//! oversized arguments to built-in tools, and which MCP client made each recorded call.
use anyhow::ensure;
use coffer_tests::mcp::{McpSession, register_tiny};
use coffer_tests::peers::texts;
use coffer_tests::{SendExt, TestHome};
use serde_json::{Value, json};

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
