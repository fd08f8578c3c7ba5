//! `coffer mcp import` against a real daemon, one half-valid config file per client format
//! (Claude Desktop, Claude Code's `.mcp.json` and `~/.claude.json`, Cursor, VS Code with
//! comments): valid entries are registered, invalid ones and duplicates are reported by name with
//! their reason, secret-looking values become credentials that reach the upstream but never a
//! REST body, the report or the audit log; an unreadable or malformed file exits 2.
use std::path::PathBuf;

use anyhow::{Context, ensure};
use coffer_tests::{Api, CliOutput, SendExt, TestHome};
use serde_json::{Value, json};

/// A GitHub-token-shaped value that nothing but the credential store may hold.
const GH_TOKEN: &str = "ghp_e2eImportSecret0123456789abcdefABCD";
/// An Authorization header value of the Claude Code fixture.
const BEARER: &str = "Bearer e2e-import-bearer-9f8e7d6c5b4a";
/// An API key of the Cursor fixture (secret by its variable's name).
const CURSOR_KEY: &str = "cursor-key-31415926";

/// Writes `text` to `<temp>/<name>` and returns the path.
fn fixture(home: &TestHome, name: &str, text: &str) -> anyhow::Result<PathBuf> {
    let p = home.temp().join(name);
    if let Some(d) = p.parent() {
        std::fs::create_dir_all(d)?;
    }
    std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))?;
    Ok(p)
}

async fn import(home: &TestHome, path: &std::path::Path, extra: &[&str]) -> anyhow::Result<(CliOutput, Value)> {
    let p = path.display().to_string();
    let mut args = vec!["mcp", "import", p.as_str(), "--json"];
    args.extend_from_slice(extra);
    let out = home.cli(&args).await?;
    let report = out.json().with_context(|| out.to_string())?;
    Ok((out, report))
}

/// `(name, reason)` of each entry in `report[key]`.
fn listed(report: &Value, key: &str) -> Vec<(String, String)> {
    report[key]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| (e["name"].as_str().unwrap_or("").to_owned(), e["reason"].as_str().unwrap_or("").to_owned()))
        .collect()
}

fn names(report: &Value, key: &str) -> Vec<String> {
    listed(report, key).into_iter().map(|(n, _)| n).collect()
}

fn reason(report: &Value, key: &str, name: &str) -> String {
    listed(report, key).into_iter().find(|(n, _)| n == name).map(|(_, r)| r).unwrap_or_default()
}

fn no_secret(what: &str, text: &str) -> anyhow::Result<()> {
    for s in [GH_TOKEN, BEARER, CURSOR_KEY] {
        ensure!(!text.contains(s), "{what} holds a secret value: {text}");
    }
    Ok(())
}

async fn whoami_env(api: &Api, tool: &str) -> anyhow::Result<Value> {
    let r = api.post_json("/v1/tools/call", &json!({"name": tool, "arguments": {}})).reply().await?.ok_json()?;
    let text = r["content"][0]["text"].as_str().with_context(|| format!("no text in {r}"))?;
    Ok(serde_json::from_str::<Value>(text)?["env"].clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_each_client_format() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let tiny = coffer_tests::bin("coffer-tiny-upstream")?.display().to_string();
    let shim = coffer_tests::bin("coffer-mcp-shim")?.display().to_string();
    // Taken before the import: the file's "web" entry is a duplicate.
    let r = api.post_json("/v1/mcp/servers", &json!({"name": "web", "url": "http://127.0.0.1:9/mcp"})).reply().await?;
    ensure!(r.status == 201, "{} {}", r.status, r.text);

    // Claude Desktop: stdio entries only, other keys around them.
    let desktop = fixture(
        &home,
        "claude_desktop_config.json",
        &json!({
            "globalShortcut": "Ctrl+Space",
            "mcpServers": {
                "Tiny Desk": {"command": tiny, "env": {"TINY_ECHO_ENV": GH_TOKEN, "LOG_LEVEL": "info"}},
                "local": {"command": "./run-server.sh"},
                "web": {"command": tiny},
            },
        })
        .to_string(),
    )?;
    // A dry run changes nothing.
    let (out, dry) = import(&home, &desktop, &["--dry-run"]).await?;
    assert_eq!(out.code, Some(1), "an invalid entry makes the exit 1: {out}");
    assert_eq!(dry["dry_run"], true);
    assert_eq!(names(&dry, "imported"), ["tiny-desk"]);
    let r = api.get("/v1/mcp/servers/tiny-desk").reply().await?;
    ensure!(r.status == 404, "a dry run registered a server: {}", r.text);
    assert_eq!(api.get("/v1/credentials").reply().await?.ok_json()?["items"], json!([]));

    let (out, report) = import(&home, &desktop, &[]).await?;
    assert_eq!(out.code, Some(1), "{out}");
    no_secret("the import report", &out.stdout)?;
    assert_eq!(report["format"], "mcpServers");
    let imported = &report["imported"][0];
    assert_eq!((imported["name"].as_str(), imported["original_name"].as_str()), (Some("tiny-desk"), Some("Tiny Desk")));
    assert_eq!(imported["credentials_created"], json!(["tiny-desk-TINY_ECHO_ENV"]));
    assert!(reason(&report, "invalid", "local").contains("absolute path"), "{report}");
    assert!(reason(&report, "duplicates", "web").contains("already registered"), "{report}");
    let web = api.get("/v1/mcp/servers/web").reply().await?.ok_json()?;
    assert_eq!(web["transport"], "http", "a duplicate is not overwritten");

    // The secret is a credential reference; the upstream gets the value.
    let shown = home.cli(&["mcp", "show", "tiny-desk", "--json"]).await?.ok()?;
    no_secret("mcp show --json", &shown.stdout)?;
    let s = shown.json()?;
    assert_eq!(s["env"], json!({"LOG_LEVEL": "info", "TINY_ECHO_ENV": {"credential_ref": "tiny-desk-TINY_ECHO_ENV"}}));
    assert_eq!(s["command"], tiny.as_str());
    assert_eq!(whoami_env(&api, "tiny-desk__whoami").await?, json!(GH_TOKEN));
    // Importing again: everything valid is a duplicate now, nothing is replaced.
    let (_, again) = import(&home, &desktop, &[]).await?;
    assert_eq!(names(&again, "imported"), Vec::<String>::new());
    assert_eq!(names(&again, "duplicates"), ["tiny-desk", "web"]);

    // Claude Code's .mcp.json: `type`, a header secret, an unsupported SSE entry.
    let mcp_json = fixture(
        &home,
        "project/.mcp.json",
        &json!({"mcpServers": {
            "notes": {"type": "stdio", "command": "sh", "args": ["-c", "exit 0"], "env": {"NOTES_DIR": "/tmp"}},
            "linear": {"type": "http", "url": "http://127.0.0.1:9/mcp", "headers": {"Authorization": BEARER}},
            "old": {"type": "sse", "url": "http://127.0.0.1:9/sse"},
        }})
        .to_string(),
    )?;
    let (out, report) = import(&home, &mcp_json, &[]).await?;
    no_secret("the import report", &out.stdout)?;
    assert_eq!(names(&report, "imported"), ["notes", "linear", "old"]);
    // A `"type": "sse"` entry is a server of the legacy HTTP+SSE transport, which Coffer speaks.
    let old = api.get("/v1/mcp/servers/old").reply().await?.ok_json()?;
    assert_eq!(
        (old["transport"].as_str(), old["url"].as_str()),
        (Some("sse"), Some("http://127.0.0.1:9/sse")),
        "{old}"
    );
    let notes = api.get("/v1/mcp/servers/notes").reply().await?.ok_json()?;
    // A bare command is registered as given: each machine resolves it when the server starts.
    assert_eq!(notes["command"], "sh", "{notes}");
    let linear = home.cli(&["mcp", "show", "linear", "--json"]).await?.ok()?;
    no_secret("mcp show --json", &linear.stdout)?;
    assert_eq!(linear.json()?["headers"], json!({"Authorization": {"credential_ref": "linear-Authorization"}}));

    // ~/.claude.json: user and project servers; a server repeated across projects is one.
    let claude_json = fixture(
        &home,
        "claude.json",
        &json!({
            "numStartups": 7,
            "oauthAccount": {"emailAddress": "me@example.com"},
            "mcpServers": {"cc-user": {"type": "stdio", "command": tiny, "args": []}},
            "projects": {
                "/p/a": {"history": [], "mcpServers": {"cc-proj": {"command": tiny, "args": ["--banner"]}}},
                "/p/b": {"mcpServers": {"cc-proj": {"command": tiny, "args": ["--banner"]}, "Bad Name!": {"command": 7}}},
            },
        })
        .to_string(),
    )?;
    let (_, report) = import(&home, &claude_json, &[]).await?;
    assert_eq!(report["format"], "claude.json");
    assert_eq!(names(&report, "imported"), ["cc-user", "cc-proj"]);
    assert!(reason(&report, "duplicates", "cc-proj").contains("earlier in this file"), "{report}");
    assert!(reason(&report, "invalid", "bad-name").contains("command is not a string"), "{report}");

    // Cursor: a url entry, a key by its variable's name, and Coffer's own shim (refused).
    let cursor = fixture(
        &home,
        "cursor/mcp.json",
        &json!({"mcpServers": {
            "Search": {"command": tiny, "env": {"BRAVE_API_KEY": CURSOR_KEY}},
            "remote-docs": {"url": "http://127.0.0.1:9/mcp"},
            "coffer": {"command": shim, "args": []},
        }})
        .to_string(),
    )?;
    let (out, report) = import(&home, &cursor, &[]).await?;
    no_secret("the import report", &out.stdout)?;
    assert_eq!(names(&report, "imported"), ["search", "remote-docs"]);
    assert!(reason(&report, "duplicates", "coffer").contains("Coffer itself"), "{report}");
    assert_eq!(
        api.get("/v1/mcp/servers/search").reply().await?.ok_json()?["env"],
        json!({"BRAVE_API_KEY": {"credential_ref": "search-BRAVE_API_KEY"}})
    );

    // VS Code: `servers`, comments and trailing commas, an input variable that cannot be imported.
    let vscode = fixture(
        &home,
        ".vscode/mcp.json",
        &format!(
            "{{\n  // MCP servers for this workspace\n  \"inputs\": [{{\"type\": \"promptString\", \"id\": \"key\", \"password\": true}}],\n  \"servers\": {{\n    \"vs-tiny\": {{\"type\": \"stdio\", \"command\": {tiny:?}, \"args\": [],}},\n    /* remote */\n    \"vs-http\": {{\"type\": \"http\", \"url\": \"http://127.0.0.1:9/mcp\"}},\n    \"vs-input\": {{\"type\": \"stdio\", \"command\": \"sh\", \"env\": {{\"API_KEY\": \"${{input:key}}\"}}}},\n  }},\n}}\n"
        ),
    )?;
    let (out, report) = import(&home, &vscode, &[]).await?;
    assert_eq!(report["format"], "vscode", "{out}");
    assert_eq!(names(&report, "imported"), ["vs-tiny", "vs-http"]);
    assert!(reason(&report, "invalid", "vs-input").contains("${input:key}"), "{report}");

    // The human report names what happened to each entry.
    let human = home.cli(&["mcp", "import", &desktop.display().to_string()]).await?;
    assert_eq!(human.code, Some(1), "{human}");
    for s in
        ["Imported 0 of 3", "tiny-desk (was \"Tiny Desk\"): already registered: tiny-desk is the same server", "local:"]
    {
        ensure!(human.stdout.contains(s), "{s:?} missing from {human}");
    }

    // One mcp.import audit row per import, with counts and never a value.
    let audit = api.get("/v1/audit?action=mcp.import").reply().await?;
    no_secret("the audit log", &audit.text)?;
    let rows = audit.ok_json()?;
    let rows = rows["items"].as_array().context("items")?;
    assert_eq!(rows.len(), 7, "one row per import that was not a dry run: {rows:?}");
    let first = rows.iter().find(|r| r["detail"]["imported"] == 1 && r["target"] == desktop.display().to_string());
    let first = first.with_context(|| format!("no audit row of the first import: {rows:?}"))?;
    assert_eq!((first["actor"].as_str(), first["detail"]["credentials_created"].as_u64()), (Some("cli"), Some(1)));
    let everything = api.get("/v1/mcp/servers").reply().await?;
    no_secret("the server list", &everything.text)?;
    Ok(())
}

#[tokio::test]
async fn unreadable_and_malformed_files_exit_2() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let missing = home.temp().join("nope.json");
    let out = home.cli(&["mcp", "import", &missing.display().to_string()]).await?;
    assert_eq!(out.code, Some(2), "{out}");
    ensure!(out.stderr.contains("nope.json"), "{out}");
    let bad = fixture(&home, "bad.json", "{\n  \"mcpServers\": {\n    \"a\": {\"command\": \"x\"\n  }\n")?;
    let out = home.cli(&["mcp", "import", &bad.display().to_string()]).await?;
    assert_eq!(out.code, Some(2), "{out}");
    ensure!(out.stderr.contains(&format!("{}:5:", bad.display())), "names the path and line: {out}");
    let empty = fixture(&home, "settings.json", "{\"editor.fontSize\": 12}")?;
    let out = home.cli(&["mcp", "import", &empty.display().to_string()]).await?;
    assert_eq!(out.code, Some(2), "{out}");
    ensure!(out.stderr.contains("holds no MCP servers"), "{out}");
    assert!(home.processes().is_empty(), "a file that cannot be imported starts no daemon");
    Ok(())
}

/// `${VAR}` references: without `--from-env` the entry is refused naming every reference; with
/// it the CLI reads them from its environment, the env value expanded so is a credential that
/// reaches the upstream (and no report), and an argument is expanded in place. A name that
/// only normalises to a registered one is imported under a new name, unless it is the same
/// server, which is "already registered".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_from_env_and_normalised_name_collisions() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let tiny = coffer_tests::bin("coffer-tiny-upstream")?.display().to_string();
    let file = fixture(
        &home,
        "vars/.mcp.json",
        &json!({"mcpServers": {
            "vars": {"command": tiny, "args": ["--note", "${E2E_BANNER}"], "env": {"TINY_ECHO_ENV": "${E2E_IMPORT_TOKEN}"}},
        }})
        .to_string(),
    )?;
    let (out, refused) = import(&home, &file, &[]).await?;
    ensure!(out.code == Some(1), "{out}");
    let why = reason(&refused, "invalid", "vars");
    ensure!(
        why.contains("${E2E_BANNER} (args[1])")
            && why.contains("${E2E_IMPORT_TOKEN} (env value of \"TINY_ECHO_ENV\")")
            && why.contains("--from-env"),
        "{why}"
    );

    let p = file.display().to_string();
    let mut cmd = home.cli_command(&["mcp", "import", &p, "--from-env", "--json"])?;
    cmd.env("E2E_IMPORT_TOKEN", GH_TOKEN).env("E2E_BANNER", "hello");
    let done = tokio::time::timeout(coffer_tests::CLI_TIMEOUT, cmd.output()).await??;
    let stdout = String::from_utf8_lossy(&done.stdout).into_owned();
    ensure!(done.status.success(), "{stdout} {}", String::from_utf8_lossy(&done.stderr));
    no_secret("the report", &stdout)?;
    let report: Value = serde_json::from_str(&stdout)?;
    assert_eq!(report["imported"][0]["credentials_created"], json!(["vars-TINY_ECHO_ENV"]), "{report}");
    let s = api.get("/v1/mcp/servers/vars").reply().await?.ok_json()?;
    assert_eq!(s["args"], json!(["--note", "hello"]));
    assert_eq!(s["env"]["TINY_ECHO_ENV"], json!({"credential_ref": "vars-TINY_ECHO_ENV"}));
    assert_eq!(whoami_env(&api, "vars__whoami").await?, json!(GH_TOKEN));

    // `Vars` normalises to `vars`: the same server is "already registered"; another one is
    // imported as vars-2, and the report says so.
    let same = fixture(
        &home,
        "same.json",
        &json!({"mcpServers": {"Vars": {"command": tiny, "args": ["--note", "hello"]}}}).to_string(),
    )?;
    let (_, r) = import(&home, &same, &[]).await?;
    assert_eq!(
        listed(&r, "duplicates"),
        [("vars".to_owned(), "already registered: vars is the same server; left as it is".to_owned())]
    );
    let other = fixture(&home, "other.json", &json!({"mcpServers": {"Vars": {"command": tiny}}}).to_string())?;
    let (_, r) = import(&home, &other, &[]).await?;
    assert_eq!(names(&r, "imported"), ["vars-2"]);
    assert_eq!(r["imported"][0]["warnings"][0], "imported as vars-2: vars is already registered as another server");
    Ok(())
}
