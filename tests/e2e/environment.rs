//! The environment upstreams get: a daemon started by an entry point (here the CLI, as a
//! client's shim would) runs with the documented base environment, so no upstream of any later
//! client sees the first client's variables; `COFFER_PASS_ENV` names extra ones to keep.
use anyhow::Context;
use coffer_tests::TestHome;
use coffer_tests::peers::peer_path;
use serde_json::Value;

#[tokio::test]
async fn upstreams_never_see_the_variables_of_the_client_that_started_the_daemon() -> anyhow::Result<()> {
    let home = TestHome::builder()
        .env("ANTHROPIC_API_KEY", "sk-ant-api03-not-for-upstreams")
        .env("CLAUDE_CODE_SESSION_ID", "session-of-the-first-client")
        .env("CLAUDE_PROJECT_DIR", "/projects/first-client")
        .env("COFFER_PASS_ENV", "KEEP_FOR_UPSTREAMS")
        .env("KEEP_FOR_UPSTREAMS", "kept")
        .env("LC_ALL", "C.UTF-8")
        .build()?;
    let everything = peer_path("node_modules/@modelcontextprotocol/server-everything/dist/index.js")?;
    let node = coffer_runtime::connect::which_on_path("node").context("node is not on PATH")?.display().to_string();
    // The first CLI command starts the daemon (detect-or-spawn) from this environment.
    home.cli(&["mcp", "add", "everything", "--", &node, &everything.display().to_string(), "stdio"]).await?.ok()?;
    let out = home.cli(&["tools", "call", "everything__get-env", "--json"]).await?.ok()?;
    let result = out.json()?;
    let text = result["content"][0]["text"].as_str().unwrap_or_default();
    let env: Value =
        serde_json::from_str(text).map_err(|e| anyhow::anyhow!("get-env did not print JSON ({e}): {out}"))?;
    for secret in ["ANTHROPIC_API_KEY", "CLAUDE_CODE_SESSION_ID", "CLAUDE_PROJECT_DIR", "CARGO", "NEXTEST_RUN_ID"] {
        assert!(env.get(secret).is_none(), "the upstream saw {secret}: {env}");
    }
    assert!(
        env.as_object().is_some_and(|m| m.keys().all(|k| !k.starts_with("COFFER_"))),
        "no COFFER_* variable reaches an upstream: {env}"
    );
    assert_eq!(env["KEEP_FOR_UPSTREAMS"], "kept", "COFFER_PASS_ENV keeps what it names: {env}");
    assert_eq!(env["LC_ALL"], "C.UTF-8", "the locale is part of the base: {env}");
    assert!(env.get("PATH").is_some_and(Value::is_string), "PATH is part of the base: {env}");
    assert_eq!(env["HOME"].as_str(), home.env().get("HOME").map(String::as_str), "HOME is kept: {env}");
    Ok(())
}
