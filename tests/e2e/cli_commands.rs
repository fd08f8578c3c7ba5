//! The `coffer` CLI's smaller commands end to end on real daemons (`tools call`, `connect`,
//! `print`, `version`, `install`, `import`, `mcp add`/`edit`): arguments too large for a command line, `--json` where it is offered, …
use anyhow::{Context, ensure};
use coffer_tests::mcp::register_tiny;
use coffer_tests::{SendExt, TestHome};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

/// `--args @FILE` and `--args -` carry arguments far over the ~128 KiB a single command-line
/// argument may have (Linux's MAX_ARG_STRLEN); a bad file is a usage error naming it, before
/// any daemon is reached.
#[tokio::test]
async fn tools_call_reads_large_arguments_from_a_file_or_stdin() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let missing = home.temp().join("missing.json");
    let out = home.cli(&["tools", "call", "tiny__echo", "--args", &format!("@{}", missing.display())]).await?;
    ensure!(out.code == Some(2) && out.stderr.contains("missing.json") && out.stderr.contains("cannot read"), "{out}");
    let not_object = home.temp().join("array.json");
    std::fs::write(&not_object, "[1, 2]")?;
    let out = home.cli(&["tools", "call", "tiny__echo", "--args", &format!("@{}", not_object.display())]).await?;
    ensure!(out.code == Some(2) && out.stderr.contains("array.json") && out.stderr.contains("not an array"), "{out}");
    let huge = home.temp().join("huge.json");
    std::fs::write(&huge, format!("{{\"message\":\"{}\"}}", "x".repeat(3 * 1024 * 1024)))?;
    let out = home.cli(&["tools", "call", "tiny__echo", "--args", &format!("@{}", huge.display())]).await?;
    ensure!(out.code == Some(2) && out.stderr.contains("more than 2 MiB"), "{out}");
    assert!(home.processes().is_empty(), "usage errors start no daemon: {:?}", home.processes());

    let api = home.start_daemon().await?;
    register_tiny(&api, "tiny", json!({})).await?;
    let message = "m".repeat(300 * 1024);
    let file = home.temp().join("args.json");
    std::fs::write(&file, serde_json::to_vec(&json!({ "message": message }))?)?;
    let out =
        home.cli(&["tools", "call", "tiny__echo", "--json", "--args", &format!("@{}", file.display())]).await?.ok()?;
    assert_eq!(out.json()?["content"][0]["text"].as_str().map(str::len), Some(message.len()), "echoed from @FILE");

    let mut child = home
        .cli_command(&["tools", "call", "tiny__echo", "--json", "--args", "-"])?
        .stdin(std::process::Stdio::piped())
        .spawn()
        .context("starting coffer")?;
    let mut stdin = child.stdin.take().context("stdin")?;
    stdin.write_all(&serde_json::to_vec(&json!({ "message": message }))?).await?;
    drop(stdin);
    let done = tokio::time::timeout(coffer_tests::CLI_TIMEOUT, child.wait_with_output()).await??;
    ensure!(done.status.success(), "{}", String::from_utf8_lossy(&done.stderr));
    let result: Value = serde_json::from_slice(&done.stdout)?;
    assert_eq!(result["content"][0]["text"].as_str().map(str::len), Some(message.len()), "echoed from stdin");
    Ok(())
}

/// `coffer connect vscode` writes VS Code's user `mcp.json` (`servers.coffer`, the format
/// `coffer mcp import` reads), keeps the rest of the file, and undoes it with `--remove`.
#[tokio::test]
async fn connect_vscode_round_trip() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let user = std::path::PathBuf::from(home.env().get("HOME").context("the harness sets HOME")?);
    let path = user.join(".config/Code/User/mcp.json");
    std::fs::create_dir_all(path.parent().context("parent")?)?;
    std::fs::write(
        &path,
        "{\n\t\"servers\": {\n\t\t\"fs\": {\"type\": \"stdio\", \"command\": \"npx\"}\n\t},\n\t\"inputs\": []\n}\n",
    )?;
    let out = home.cli(&["connect", "vscode", "--json"]).await?.ok()?;
    assert_eq!(out.json()?["action"], "added", "{out}");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    let shim = coffer_tests::bin("coffer-mcp-shim")?.display().to_string();
    assert_eq!(doc["servers"]["coffer"]["command"], shim.as_str(), "{doc}");
    assert_eq!(doc["servers"]["coffer"]["type"], "stdio", "{doc}");
    assert_eq!(doc["servers"]["fs"]["command"], "npx", "other servers are kept: {doc}");
    assert_eq!(doc["inputs"], json!([]), "other keys are kept: {doc}");
    ensure!(std::fs::read_to_string(&path)?.contains("\n\t\"servers\""), "the file's tab indentation is kept");
    let again = home.cli(&["connect", "vscode", "--json"]).await?.ok()?;
    assert_eq!(again.json()?["action"], "unchanged", "{again}");
    home.cli(&["connect", "vscode", "--remove"]).await?.ok()?;
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    ensure!(doc["servers"].get("coffer").is_none() && doc["servers"].get("fs").is_some(), "{doc}");
    Ok(())
}

/// `--json` where it is offered: `connect --print --json` is one JSON document (not the TOML or
/// JSON snippet as text), and `coffer --version --json` too.
#[tokio::test]
async fn print_and_version_take_json() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let out = home.cli(&["connect", "codex", "--print", "--json"]).await?.ok()?;
    let doc = out.json()?;
    assert_eq!(
        (doc["client"].as_str(), doc["kind"].as_str(), doc["remove"].as_bool()),
        (Some("codex"), Some("toml"), Some(false)),
        "{out}"
    );
    ensure!(doc["snippet"].as_str().is_some_and(|s| s.contains("[mcp_servers.coffer]")), "{out}");
    ensure!(out.stderr.is_empty(), "nothing on stderr with --json: {out}");
    let out = home.cli(&["connect", "vscode", "--print", "--json"]).await?.ok()?;
    let doc = out.json()?;
    let snippet: Value = serde_json::from_str(doc["snippet"].as_str().context("snippet")?)?;
    ensure!(snippet["servers"]["coffer"]["command"].is_string(), "{out}");
    let out = home.cli(&["--version", "--json"]).await?.ok()?;
    assert_eq!(out.json()?, json!({"name": "coffer", "version": env!("CARGO_PKG_VERSION")}), "{out}");
    let out = home.cli(&["--version"]).await?.ok()?;
    ensure!(out.stdout.starts_with("coffer "), "{out}");
    assert!(home.processes().is_empty(), "none of these starts a daemon");
    Ok(())
}

/// `./scripts/install` installs stripped binaries (unstripped, the release build's line tables
/// made them 364 MB), through a rename, and says where and how large.
#[tokio::test]
// The test runs the install script and inspects what it installed with readelf.
#[allow(clippy::disallowed_methods)]
async fn install_strips_the_binaries() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let prefix = home.temp().join("prefix");
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/install");
    let from = coffer_tests::bins::bin_dir()?;
    let out = tokio::process::Command::new("bash")
        .arg(&script)
        .env("PREFIX", &prefix)
        .env("COFFER_INSTALL_FROM", from)
        .env_remove("COFFER_INSTALL_KEEP_SYMBOLS")
        .output()
        .await?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    ensure!(out.status.success(), "install failed: {stdout}{}", String::from_utf8_lossy(&out.stderr));
    ensure!(stdout.contains("Installed coffer coffer-mcp-shim") && stdout.contains("MiB)"), "{stdout}");
    let mut total = 0;
    for name in coffer_tests::bins::DAEMON_BINARIES.iter().chain(&["coffer", "coffer-mcp-shim"]) {
        let installed = prefix.join("bin").join(name);
        let built = std::fs::metadata(from.join(name))?.len();
        let size = std::fs::metadata(&installed).with_context(|| format!("{name} was not installed"))?.len();
        total += size;
        ensure!(size < built / 2, "{name} is not stripped: {size} bytes installed, {built} built");
        let sections = std::process::Command::new("readelf").arg("-S").arg(&installed).output()?;
        let sections = String::from_utf8_lossy(&sections.stdout);
        ensure!(
            sections.contains(".text") && !sections.contains(".debug_line") && !sections.contains(".symtab"),
            "{name}: {sections}"
        );
    }
    // The size it reports is what it put on disk (the README's install size is this line's,
    // measured on a release build).
    ensure!(stdout.contains(&format!("({} MiB)", total / (1024 * 1024))), "{total} bytes installed: {stdout}");
    let v = std::process::Command::new(prefix.join("bin/coffer")).arg("--version").output()?;
    ensure!(
        v.status.success() && String::from_utf8_lossy(&v.stdout).starts_with("coffer "),
        "the stripped coffer runs"
    );
    Ok(())
}

/// `coffer mcp import ~/.claude.json` after `coffer connect claude-code`: Coffer's own entry is
/// skipped, and the import exits 0.
#[tokio::test]
async fn importing_a_config_that_holds_coffer_itself_skips_it() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let user = std::path::PathBuf::from(home.env().get("HOME").context("the harness sets HOME")?);
    let tiny = coffer_tests::bin("coffer-tiny-upstream")?.display().to_string();
    let claude_json = user.join(".claude.json");
    std::fs::write(
        &claude_json,
        json!({"mcpServers": {"tiny": {"type": "stdio", "command": tiny, "args": []}}}).to_string(),
    )?;
    home.cli(&["connect", "claude-code"]).await?.ok()?;
    let path = claude_json.display().to_string();
    let out = home.cli(&["mcp", "import", &path]).await?;
    ensure!(out.code == Some(0), "Coffer's own entry does not fail the import: {out}");
    ensure!(out.stdout.contains("Coffer itself"), "{out}");
    let out = home.cli(&["mcp", "import", &path, "--json"]).await?;
    let report = out.json()?;
    ensure!(out.code == Some(0) && report["invalid"] == json!([]), "{out}");
    let skipped: Vec<&str> =
        report["duplicates"].as_array().into_iter().flatten().filter_map(|d| d["name"].as_str()).collect();
    assert_eq!(skipped, ["tiny", "coffer"], "tiny was imported the first time, coffer is skipped: {report}");
    Ok(())
}

/// `coffer mcp add --env KEY=<secret-looking value>` moves the value to the credential store,
/// as `mcp import` does, and says so; the server still gets it; a failed add leaves no
/// credential behind; `--keep-plaintext` keeps the value as given.
#[tokio::test]
async fn mcp_add_moves_secret_looking_values_to_the_credential_store() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let tiny = coffer_tests::bin("coffer-tiny-upstream")?.display().to_string();
    let secret = "ghp_0123456789abcdefghijklmnopqrstuvwxyzAB";
    let env = format!("TINY_ECHO_ENV={secret}");
    let out = home.cli(&["mcp", "add", "gh", "--env", &env, "--env", "LOG=debug", "--", &tiny]).await?.ok()?;
    ensure!(
        out.stderr.contains("TINY_ECHO_ENV") && out.stderr.contains("credential store as gh-TINY_ECHO_ENV"),
        "{out}"
    );
    ensure!(!out.stdout.contains(secret) && !out.stderr.contains(secret), "the value was printed: {out}");
    let s = api.get("/v1/mcp/servers/gh").reply().await?.ok_json()?;
    assert_eq!(s["env"], json!({"LOG": "debug", "TINY_ECHO_ENV": {"credential_ref": "gh-TINY_ECHO_ENV"}}), "{s}");
    let show = home.cli(&["mcp", "show", "gh", "--json"]).await?.ok()?;
    ensure!(!show.stdout.contains(secret), "{show}");
    let r =
        api.post_json("/v1/tools/call", &json!({"name": "gh__whoami", "arguments": {}})).reply().await?.ok_json()?;
    let who: Value = serde_json::from_str(r["content"][0]["text"].as_str().context("text")?)?;
    assert_eq!(who["env"], secret, "the server gets the value from the credential store");

    // A second add under the same name fails (exit 4) and leaves no new credential behind.
    let out = home.cli(&["mcp", "add", "gh", "--env", &env, "--", &tiny]).await?;
    ensure!(out.code == Some(4), "{out}");
    let creds = home.cli(&["credentials", "list", "--json"]).await?.ok()?.json()?;
    let names: Vec<&str> = creds["items"].as_array().into_iter().flatten().filter_map(|c| c["name"].as_str()).collect();
    assert_eq!(names, ["gh-TINY_ECHO_ENV"], "{creds}");

    home.cli(&["mcp", "add", "plain", "--keep-plaintext", "--env", &env, "--", &tiny]).await?.ok()?;
    let s = api.get("/v1/mcp/servers/plain").reply().await?.ok_json()?;
    assert_eq!(s["env"]["TINY_ECHO_ENV"], secret, "--keep-plaintext keeps it as given");
    Ok(())
}

/// Three `coffer mcp add` of one name at once, each with its own secret-looking value: one wins,
/// the others exit 4, and the winner's server references a credential that exists and holds
/// the winner's value — no add replaced or removed another's credential (each is created with
/// `If-None-Match: *`, newcomer finding). Nothing of the losers stays behind.
#[tokio::test]
async fn concurrent_adds_of_one_name_leave_the_winner_with_its_own_credential() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let tiny = coffer_tests::bin("coffer-tiny-upstream")?.display().to_string();
    let secrets: Vec<String> = (0..3).map(|i| format!("ghp_{i}123456789abcdefghijklmnopqrstuvwxyzAB")).collect();
    let envs: Vec<String> = secrets.iter().map(|s| format!("TINY_ECHO_ENV={s}")).collect();
    let args: Vec<[&str; 8]> =
        envs.iter().map(|env| ["mcp", "add", "race", "--no-wait", "--env", env, "--", &tiny]).collect();
    let runs = args.iter().map(|a| home.cli(a));
    let outs = futures_util::future::join_all(runs).await.into_iter().collect::<anyhow::Result<Vec<_>>>()?;
    let codes: Vec<Option<i32>> = outs.iter().map(|o| o.code).collect();
    ensure!(codes.iter().filter(|c| **c == Some(0)).count() == 1, "one add wins: {outs:?}");
    ensure!(codes.iter().all(|c| *c == Some(0) || *c == Some(4)), "the others exit 4 (exists): {outs:?}");
    let s = api.get("/v1/mcp/servers/race").reply().await?.ok_json()?;
    let cred = s["env"]["TINY_ECHO_ENV"]["credential_ref"].as_str().context("a reference")?.to_owned();
    let creds = home.cli(&["credentials", "list", "--json"]).await?.ok()?.json()?;
    let names: Vec<&str> = creds["items"].as_array().into_iter().flatten().filter_map(|c| c["name"].as_str()).collect();
    assert_eq!(names, [cred.as_str()], "only the winner's credential is left: {creds}");
    let r =
        api.post_json("/v1/tools/call", &json!({"name": "race__whoami", "arguments": {}})).reply().await?.ok_json()?;
    let who: Value = serde_json::from_str(r["content"][0]["text"].as_str().context("text")?)?;
    let winner = outs.iter().position(|o| o.code == Some(0)).context("a winner")?;
    assert_eq!(who["env"], secrets[winner].as_str(), "the server gets its own add's value");

    // The REST side: `If-None-Match: *` never replaces.
    let r = api
        .request(reqwest::Method::PUT, &format!("/v1/credentials/{cred}"))
        .header("If-None-Match", "*")
        .json(&json!({"value": "other"}))
        .reply()
        .await?;
    r.expect_envelope(409, "ALREADY_EXISTS")?;
    let c = api.get(&format!("/v1/credentials/{cred}")).reply().await?.ok_json()?;
    assert_eq!(c["version"], 1, "untouched: {c}");
    Ok(())
}

/// The trace id of a client error (TOOL_DISABLED, NOT_FOUND) finds it in the gateway's log, as
/// the docs promise for every request.
#[tokio::test]
async fn client_errors_are_logged_with_their_trace_id() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    register_tiny(&api, "tiny", json!({})).await?;
    coffer_tests::mcp::set_tool_enabled(&api, "tiny__echo", false).await?;
    let r =
        api.post_json("/v1/tools/call", &json!({"name": "tiny__echo", "arguments": {"message": "x"}})).reply().await?;
    ensure!(r.status.is_client_error(), "{} {}", r.status, r.text);
    ensure!(r.text.contains("TOOL_DISABLED"), "{}", r.text);
    let trace = r.headers.get("x-coffer-trace").and_then(|v| v.to_str().ok()).context("X-Coffer-Trace")?.to_owned();
    let line =
        home.wait_for_log_line("gateway", &[&trace, "TOOL_DISABLED"], std::time::Duration::from_secs(10)).await?;
    ensure!(line.contains("INFO"), "logged at info, not as an error: {line}");
    let r = api.get("/v1/mcp/servers/nosuch").reply().await?;
    ensure!(r.status == 404, "{} {}", r.status, r.text);
    let trace = r.headers.get("x-coffer-trace").and_then(|v| v.to_str().ok()).context("X-Coffer-Trace")?.to_owned();
    home.wait_for_log_line("gateway", &[&trace, "NOT_FOUND"], std::time::Duration::from_secs(10)).await?;
    Ok(())
}

/// `coffer mcp edit` changes a server in place: env (a secret-looking value moved to the
/// credential store, another variable removed), timeout, then command and arguments; the
/// server's tool preferences stay, the upstream is restarted with the new env, and flags that
/// change nothing or do not fit are usage errors (exit 2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_edit_changes_a_server_and_keeps_its_preferences() -> anyhow::Result<()> {
    const TOKEN: &str = "ghp_e2eEditSecret0123456789abcdefABCDEF";
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    register_tiny(&api, "tiny", json!({"KEEP": "1", "DROP": "x"})).await?;
    coffer_tests::mcp::set_tool_enabled(&api, "tiny__add", false).await?;
    let before = api.get("/v1/mcp/servers/tiny").reply().await?.ok_json()?;
    let whoami = || async {
        let r = api
            .post_json("/v1/tools/call", &json!({"name": "tiny__whoami", "arguments": {}}))
            .reply()
            .await?
            .ok_json()?;
        let text = r["content"][0]["text"].as_str().context("text")?.to_owned();
        anyhow::Ok(serde_json::from_str::<Value>(&text)?["env"].clone())
    };
    assert_eq!(whoami().await?, Value::Null, "no TINY_ECHO_ENV yet");

    let out = home
        .cli(&[
            "mcp",
            "edit",
            "tiny",
            "--env",
            &format!("TINY_ECHO_ENV={TOKEN}"),
            "--unset-env",
            "DROP",
            "--timeout-ms",
            "9000",
        ])
        .await?
        .ok()?;
    ensure!(out.stdout.contains("Updated MCP server tiny") && out.stderr.contains("credential store"), "{out}");
    // It waited for the catalog to list the edited server, and says what it offers.
    ensure!(out.stdout.contains("tiny offers 14 tools"), "{out}");
    ensure!(!out.stdout.contains(TOKEN) && !out.stderr.contains(TOKEN), "{out}");
    let s = api.get("/v1/mcp/servers/tiny").reply().await?.ok_json()?;
    assert_eq!(s["env"], json!({"KEEP": "1", "TINY_ECHO_ENV": {"credential_ref": "tiny-TINY_ECHO_ENV"}}));
    assert_eq!(s["timeout_ms"], 9000);
    ensure!(s["version"].as_i64() > before["version"].as_i64(), "{s}");
    assert_eq!(whoami().await?, json!(TOKEN), "the upstream runs with the new env");
    let r =
        api.post_json("/v1/tools/call", &json!({"name": "tiny__add", "arguments": {"a": 1, "b": 2}})).reply().await?;
    ensure!(r.status == 403 && r.text.contains("TOOL_DISABLED"), "the preference stayed: {} {}", r.status, r.text);

    let tiny = coffer_tests::bin("coffer-tiny-upstream")?.display().to_string();
    home.cli(&["mcp", "edit", "tiny", "--", &tiny, "--note", "x"]).await?.ok()?;
    let s = api.get("/v1/mcp/servers/tiny").reply().await?.ok_json()?;
    assert_eq!((s["command"].as_str(), s["args"].clone()), (Some(tiny.as_str()), json!(["--note", "x"])));

    for bad in [
        &["mcp", "edit", "tiny"][..],
        &["mcp", "edit", "tiny", "--unset-env", "NOPE"],
        &["mcp", "edit", "tiny", "--url", "http://127.0.0.1:9/mcp"],
    ] {
        let out = home.cli(bad).await?;
        ensure!(out.code == Some(2), "{bad:?}: {out}");
    }
    // The same values again change nothing: exit 2, and the version stays.
    let version = api.get("/v1/mcp/servers/tiny").reply().await?.ok_json()?["version"].clone();
    let out = home.cli(&["mcp", "edit", "tiny", "--timeout-ms", "9000", "--no-wait"]).await?;
    ensure!(out.code == Some(2) && out.stderr.contains("nothing to change"), "{out}");
    assert_eq!(api.get("/v1/mcp/servers/tiny").reply().await?.ok_json()?["version"], version);
    let out = home.cli(&["mcp", "edit", "ghost", "--timeout-ms", "1"]).await?;
    ensure!(out.code == Some(3), "unknown server: {out}");
    Ok(())
}
