//! The agent token (issue 32 follow-up): a managed agent's shim reaches the gateway with the
//! token of `agent-access/agent.json`, which the edge accepts on `/mcp` only. With it, tools
//! work; every REST route — registering a server that would run `/bin/sh` outside the sandbox,
//! reading credentials, minting a console login — is refused with 403 naming why, and nothing
//! changes. The owner's token (`daemon.json`) is untouched.
use std::os::unix::fs::PermissionsExt as _;

use anyhow::{Context, ensure};
use coffer_tests::mcp::{McpSession, register_tiny};
use coffer_tests::peers::texts;
use coffer_tests::{Api, SendExt, TestHome};
use reqwest::Method;
use serde_json::{Value, json};

/// `agent-access/agent.json` of `home`, parsed.
fn agent_file(home: &TestHome) -> anyhow::Result<Value> {
    let path = home.root().join("agent-access").join("agent.json");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    Ok(serde_json::from_str(&text)?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_token_calls_tools_on_mcp_and_opens_no_rest_route() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    register_tiny(&api, "tiny", json!({})).await?;

    // Its own file, private, in its own private folder; the same daemon, another token.
    let dir = home.root().join("agent-access");
    ensure!(std::fs::metadata(&dir)?.permissions().mode() & 0o777 == 0o700, "agent-access/ is 0700");
    ensure!(std::fs::metadata(dir.join("agent.json"))?.permissions().mode() & 0o777 == 0o600, "agent.json is 0600");
    let agent = agent_file(&home)?;
    let owner = home.daemon_json()?;
    ensure!(agent["pid"] == owner["pid"] && agent["port"] == owner["port"], "{agent} vs {owner}");
    let token = agent["token"].as_str().context("a token")?.to_owned();
    ensure!(token.len() == 64 && token != api.token(), "a token of its own");
    let as_agent = Api::new(api.port(), token.clone());

    // /mcp: the whole MCP session works.
    let session = McpSession::latest(&as_agent).await?;
    let names = session.tool_names().await?;
    ensure!(names.iter().any(|n| n == "tiny__echo"), "{names:?}");
    let r = session.tool("tiny__echo", json!({"message": "from an agent"})).await?;
    ensure!(texts(&r["result"]) == "from an agent", "{r}");
    ensure!(session.delete().await? < 300, "the agent ends its session");

    // Every REST route: 403 with the reason, whether the token comes as X-Coffer-Token or Bearer.
    let evil = json!({"name": "evil", "command": "/bin/sh", "args": ["-c", "id"], "sandbox": false});
    let routes: [(Method, &str, Option<Value>); 9] = [
        (Method::POST, "/v1/mcp/servers", Some(evil)),
        (Method::GET, "/v1/credentials", None),
        (Method::PUT, "/v1/credentials/stolen", Some(json!({"value": "v-1234567890"}))),
        (Method::GET, "/v1/status", None),
        (Method::PATCH, "/v1/settings", Some(json!({"chat.claude_code_sandbox": 0}))),
        (Method::POST, "/v1/ui/login-codes", Some(json!({}))),
        (Method::POST, "/v1/tools/call", Some(json!({"name": "tiny__echo", "arguments": {"message": "x"}}))),
        (Method::GET, "/v1/audit", None),
        (Method::GET, "/v1/invocations/events", None),
    ];
    for (method, path, body) in routes {
        for bearer in [false, true] {
            let mut req = if bearer {
                as_agent.anon(method.clone(), path).header("Authorization", format!("Bearer {token}"))
            } else {
                as_agent.request(method.clone(), path)
            };
            if let Some(b) = &body {
                req = req.json(b);
            }
            let r = req.reply().await?;
            ensure!(r.status == 403, "{method} {path} (bearer {bearer}) answered {}: {}", r.status, r.text);
            let e: Value = r.json()?;
            ensure!(
                e["error"]["code"] == "FORBIDDEN" && e["error"]["details"]["reason"] == "agent_token_scope",
                "{method} {path}: {e}"
            );
            let message = e["error"]["message"].as_str().unwrap_or_default();
            ensure!(message.contains("/mcp only") && !message.contains(&token), "{message}");
        }
    }
    // Health needs no token at all, as before.
    ensure!(as_agent.health().await?["pid"] == owner["pid"]);

    // Nothing happened: no server, no credential; the owner's token still opens everything.
    let servers = api.get("/v1/mcp/servers").reply().await?.ok_json()?;
    ensure!(!servers.to_string().contains("\"evil\""), "{servers}");
    let creds = api.get("/v1/credentials").reply().await?.ok_json()?;
    ensure!(!creds.to_string().contains("stolen"), "{creds}");
    ensure!(!home.root().join("workspace").join("servers").join("evil").exists());
    let owner_session = McpSession::latest(&api).await?;
    ensure!(owner_session.tool_names().await?.iter().any(|n| n == "tiny__echo"));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_token_is_new_for_every_daemon_run_and_its_file_goes_with_the_daemon() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let first = agent_file(&home)?["token"].as_str().context("token")?.to_owned();
    home.cli(&["daemon", "restart"]).await?.ok()?;
    let api2 = home.api()?;
    let second = agent_file(&home)?["token"].as_str().context("token")?.to_owned();
    ensure!(first != second, "a new agent token for the new run");
    // The old one opens nothing, not even /mcp.
    let old = Api::new(api2.port(), first);
    ensure!(McpSession::latest(&old).await.is_err(), "the previous run's agent token is dead");
    McpSession::latest(&Api::new(api2.port(), second)).await?;
    drop(api);
    home.cli(&["daemon", "stop"]).await?.ok()?;
    home.wait_no_processes(std::time::Duration::from_secs(15)).await?;
    ensure!(!home.root().join("agent-access").join("agent.json").exists(), "removed at stop");
    Ok(())
}
