//! What the `coffer` CLI prints and exits with, end to end: credential references from
//! `mcp add` (and shown by name), exit codes (bad input 2, bad local configuration 1, 5 only for
//! an unreachable daemon), `--json` errors as envelopes and JSON log lines, the audit actions,
//! settings' defaults and checks, yes/no in `status`, and `daemon restart gateway`.
use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Context, ensure};
use coffer_tests::{CliOutput, SendExt, TestHome};
use reqwest::Method;
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt;

fn tiny() -> anyhow::Result<String> {
    Ok(coffer_tests::bin("coffer-tiny-upstream")?.display().to_string())
}

/// Asserts the exit code, with the whole run in the message.
fn expect_code(out: &CliOutput, code: i32) -> anyhow::Result<()> {
    ensure!(out.code == Some(code), "expected exit {code}: {out}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credential_references_from_mcp_add() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let tiny = tiny()?;
    let secret = "cli-polish-credential-value-314159";

    // Bad credential names and malformed references are usage errors, before any daemon.
    for args in [
        &["mcp", "add", "gh", "--env-credential", "T=bad name", "--", &tiny][..],
        &["mcp", "add", "gh", "--env-credential", "NOEQUALS", "--", &tiny],
        &["mcp", "add", "gh", "--env", r#"T={"credential_ref":"tok","x":1}"#, "--", &tiny],
        &["mcp", "add", "web", "--url", "http://127.0.0.1:9/mcp", "--header-credential", "Bad Name:tok"],
        &["mcp", "add", "gh", "--header-credential", "Authorization:tok", "--", &tiny],
    ] {
        let out = home.cli(args).await?;
        expect_code(&out, 2)?;
    }
    let out = home.cli(&["mcp", "add", "gh", "--env", r#"T={"credential_ref":5}"#, "--", &tiny]).await?;
    ensure!(out.stderr.contains("--env-credential T=NAME"), "the message points at the flag: {out}");
    ensure!(home.daemon_processes().is_empty(), "a usage error started a daemon");

    // A reference to a credential that does not exist: 400 from the daemon, exit 2, with a hint.
    let out = home.cli(&["mcp", "add", "gh", "--env-credential", "TINY_ECHO_ENV=tok", "--", &tiny]).await?;
    expect_code(&out, 2)?;
    ensure!(out.stderr.contains("\"tok\"") && out.stderr.contains("coffer credentials set tok"), "{out}");

    let api = home.api()?;
    let r = api.request(Method::PUT, "/v1/credentials/tok").json(&json!({"value": secret})).reply().await?;
    ensure!(r.status.is_success(), "{} {}", r.status, r.text);

    home.cli(&["mcp", "add", "gh", "--env", "LOG=debug", "--env-credential", "TINY_ECHO_ENV=tok", "--", &tiny])
        .await?
        .ok()?;
    let s = api.get("/v1/mcp/servers/gh").reply().await?.ok_json()?;
    assert_eq!(s["env"], json!({"LOG": "debug", "TINY_ECHO_ENV": {"credential_ref": "tok"}}));
    // The upstream gets the value.
    let r =
        api.post_json("/v1/tools/call", &json!({"name": "gh__whoami", "arguments": {}})).reply().await?.ok_json()?;
    let who: Value = serde_json::from_str(r["content"][0]["text"].as_str().context("text")?)?;
    assert_eq!(who["env"], secret);

    // A literal written as a reference is one (documented in `mcp add --help` and docs/CLI.md).
    home.cli(&["mcp", "add", "gh2", "--env", r#"TINY_ECHO_ENV={"credential_ref":"tok"}"#, "--", &tiny]).await?.ok()?;
    let s = api.get("/v1/mcp/servers/gh2").reply().await?.ok_json()?;
    assert_eq!(s["env"], json!({"TINY_ECHO_ENV": {"credential_ref": "tok"}}));

    home.cli(&[
        "mcp",
        "add",
        "web",
        "--url",
        "http://127.0.0.1:9/mcp",
        "-H",
        "X-Team: a",
        "--header-credential",
        "Authorization:tok",
    ])
    .await?
    .ok()?;
    let s = api.get("/v1/mcp/servers/web").reply().await?.ok_json()?;
    assert_eq!(s["headers"], json!({"Authorization": {"credential_ref": "tok"}, "X-Team": "a"}));

    // `mcp show` names the credential instead of showing an empty value; never the value.
    let show = home.cli(&["mcp", "show", "gh"]).await?.ok()?;
    ensure!(show.stdout.contains("TINY_ECHO_ENV=<credential:tok>") && show.stdout.contains("LOG=debug"), "{show}");
    let show = home.cli(&["mcp", "show", "web"]).await?.ok()?;
    ensure!(show.stdout.contains("Authorization: <credential:tok>") && show.stdout.contains("X-Team: a"), "{show}");
    let list = home.cli(&["mcp", "list"]).await?.ok()?;
    for o in [&show, &list, &home.cli(&["mcp", "show", "gh", "--json"]).await?.ok()?] {
        ensure!(!o.stdout.contains(secret) && !o.stderr.contains(secret), "a value was printed: {o}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_exits_2_and_bad_configuration_exits_1() -> anyhow::Result<()> {
    let home = TestHome::new()?;

    // Local configuration errors: exit 1 naming the path or variable, not 5; no daemon.
    let file = home.temp().join("a-file");
    std::fs::write(&file, "not a folder")?;
    let file_s = file.display().to_string();
    let out = home.cli(&["--home", &file_s, "status"]).await?;
    expect_code(&out, 1)?;
    ensure!(out.stderr.contains(&file_s) && out.stderr.contains("--home"), "{out}");
    let out = home.cli(&["--home", &file_s, "daemon", "status"]).await?;
    expect_code(&out, 1)?;
    let out = home.cli(&["--home", &file_s, "status", "--json"]).await?;
    expect_code(&out, 1)?;
    assert_eq!(out.json()?["error"]["code"], "INVALID_CONFIG", "{out}");

    let mut bad_port = TestHome::new()?;
    bad_port.set_env("COFFER_PORT", "abc");
    let out = bad_port.cli(&["status"]).await?;
    expect_code(&out, 1)?;
    ensure!(out.stderr.contains("COFFER_PORT=\"abc\""), "{out}");
    ensure!(bad_port.daemon_processes().is_empty(), "a daemon was started with COFFER_PORT=abc");
    ensure!(home.daemon_processes().is_empty(), "a daemon was started for a configuration error");

    // An argument that is not UTF-8: a usage error (exit 2) naming it, never a panic (101).
    for (args, json) in [(&["kb", "search"][..], false), (&["memory", "remember", "--json"], true)] {
        let mut cmd = home.cli_command(args)?;
        cmd.arg(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(b"bad \xff\xfe utf8"));
        let out = cmd.output().await?;
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        ensure!(out.status.code() == Some(2), "{:?}: {stderr}", out.status);
        ensure!(stderr.contains("UTF-8") && !stderr.contains("panicked"), "{stderr}");
        if json {
            let v: serde_json::Value = serde_json::from_str(&stdout)?;
            ensure!(v["error"]["code"] == "INVALID_ARGUMENT", "{stdout}");
        }
    }
    ensure!(home.daemon_processes().is_empty(), "a daemon was started for a usage error");

    // Input the daemon refuses (400 INVALID_ARGUMENT): exit 2, like clap's usage errors.
    for args in [
        &["mcp", "add", "Bad_Name", "--url", "http://127.0.0.1:9/mcp"][..],
        &["invocations", "--since", "yesterday"],
        &["invocations", "--cursor", "garbage"],
        &["audit", "--cursor", "garbage"],
        &["mcp", "add", "x", "--url", "ftp://x/mcp"],
        &["invocations", "--conversation", "bogus"],
    ] {
        let out = home.cli(args).await?;
        expect_code(&out, 2)?;
        ensure!(out.stderr.starts_with("error: ") && out.stderr.contains("(trace "), "{out}");
    }
    // A malformed conversation id matches nothing: refused naming it, not an empty list.
    let out = home.cli(&["invocations", "--conversation", "bogus"]).await?;
    ensure!(out.stderr.contains("conversation \"bogus\" is not a conversation id"), "{out}");
    let r = home.api()?.get("/v1/invocations?conversation=bogus").reply().await?;
    let e = r.expect_envelope(400, "INVALID_ARGUMENT")?;
    ensure!(e["details"] == serde_json::json!({"parameter": "conversation"}), "{e}");
    // Other outcomes keep their codes.
    expect_code(&home.cli(&["mcp", "show", "nosuch"]).await?, 3)?;
    home.cli(&["mcp", "add", "x", "--url", "http://127.0.0.1:9/mcp"]).await?.ok()?;
    expect_code(&home.cli(&["mcp", "add", "x", "--url", "http://127.0.0.1:9/mcp"]).await?, 4)?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_errors_are_envelopes_on_stdout() -> anyhow::Result<()> {
    let home = TestHome::new()?;

    // A clap usage error, before any daemon.
    let out = home.cli(&["audit", "--action", "server.delete", "--json"]).await?;
    expect_code(&out, 2)?;
    let e = out.json()?;
    assert_eq!(e["error"]["code"], "INVALID_ARGUMENT", "{out}");
    assert_eq!(e["error"]["details"]["value"], "server.delete");
    ensure!(e["error"]["details"]["valid"].as_array().is_some_and(|v| v.contains(&json!("server.remove"))), "{out}");
    // A local usage error.
    let out = home.cli(&["settings", "set", "gateway.call_timeout_ms", "0", "--json"]).await?;
    expect_code(&out, 2)?;
    assert_eq!(out.json()?["error"]["code"], "INVALID_ARGUMENT");
    // No daemon for a command that never starts one.
    let out = home.cli(&["daemon", "restart", "store", "--json"]).await?;
    expect_code(&out, 5)?;
    assert_eq!(out.json()?["error"]["code"], "DAEMON_NOT_RUNNING", "{out}");
    ensure!(home.daemon_processes().is_empty());

    // API errors: the daemon's envelope, with the trace id; the exit code is kept.
    let out = home.cli(&["mcp", "show", "nosuch", "--json"]).await?;
    expect_code(&out, 3)?;
    let e = out.json()?;
    assert_eq!(e["error"]["code"], "NOT_FOUND", "{out}");
    ensure!(e["error"]["message"].as_str().is_some_and(|m| m.contains("nosuch")), "{out}");
    ensure!(e["trace_id"].as_str().is_some_and(|t| t.len() == 16), "{out}");
    ensure!(out.stderr.contains(e["trace_id"].as_str().unwrap_or("-")), "stderr keeps the human line: {out}");
    let out = home.cli(&["invocations", "--since", "yesterday", "--json"]).await?;
    expect_code(&out, 2)?;
    let e = out.json()?;
    assert_eq!(
        (&e["error"]["code"], &e["error"]["details"]["parameter"]),
        (&json!("INVALID_ARGUMENT"), &json!("since"))
    );
    let out = home.cli(&["settings", "get", "no.such.key", "--json"]).await?;
    expect_code(&out, 3)?;
    assert_eq!(out.json()?["error"]["code"], "NOT_FOUND");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_with_json_are_one_object_per_line() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;

    let out = home.cli(&["logs", "-n", "20", "--json"]).await?.ok()?;
    let lines: Vec<Value> =
        out.stdout.lines().map(serde_json::from_str).collect::<Result<_, _>>().with_context(|| out.to_string())?;
    ensure!(!lines.is_empty(), "{out}");
    for l in &lines {
        let keys: Vec<&String> = l.as_object().context("object")?.keys().collect();
        assert_eq!(keys, ["service", "line"], "{l}");
    }
    let out = home.cli(&["logs", "store", "--json"]).await?.ok()?;
    ensure!(out.stdout.lines().all(|l| l.starts_with(r#"{"service":"store","line":"#)), "{out}");

    // An upstream's stderr.
    let body = json!({"name": "tiny", "command": tiny()?});
    ensure!(api.post_json("/v1/mcp/servers", &body).reply().await?.status == 201);
    let call = json!({"name": "tiny__stderr", "arguments": {"lines": 3}});
    api.post_json("/v1/tools/call", &call).reply().await?.ok_json()?;
    let out = coffer_tests::wait_for("tiny's stderr in its log", Duration::from_secs(10), || async {
        let out = home.cli(&["mcp", "logs", "tiny", "--json"]).await?.ok()?;
        Ok(out.stdout.contains("stderr line 2").then_some(out))
    })
    .await?;
    for l in out.stdout.lines() {
        let v: Value = serde_json::from_str(l).with_context(|| out.to_string())?;
        assert_eq!(v["server"], "tiny", "{l}");
        ensure!(v["line"].is_string(), "{l}");
    }

    // -f keeps printing JSON lines: settings patches log a line in the gateway's log, sent until
    // the follower (which starts at the end of the file) has printed one.
    let mut child = home.cli_command(&["logs", "gateway", "-f", "-n", "0", "--json"])?.spawn()?;
    let mut stdout = tokio::io::BufReader::new(child.stdout.take().context("stdout")?).lines();
    // Each round writes one patch and waits for the follower's next line; a round without a line
    // (the follower may not have opened the file yet) just writes again, up to a deadline.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut line = None;
    for i in 0.. {
        let patch = json!({"set": {"my.own.key": i.to_string()}, "force": true});
        let _ = api.request(Method::PATCH, "/v1/settings").json(&patch).reply().await;
        if let Ok(next) = tokio::time::timeout(Duration::from_millis(300), stdout.next_line()).await {
            line = Some(next);
            break;
        }
        if std::time::Instant::now() >= deadline {
            break;
        }
    }
    child.kill().await?;
    let line = line.context("no line while following")??.context("stdout closed")?;
    let v: Value = serde_json::from_str(&line).with_context(|| line.clone())?;
    assert_eq!(v["service"], "gateway", "{line}");
    Ok(())
}

/// The audit actions the sources write: string literals shaped like an action (`"x.y"`, and the
/// store's SQL `'maintenance.prune'`) in the non-test code of the store and the REST layer, minus
/// the ones that are not actions.
fn audit_actions_in_sources() -> anyhow::Result<BTreeSet<String>> {
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    const PREFIXES: &[&str] =
        &["server", "capability", "settings", "credential", "mcp", "backup", "maintenance", "channel", "sync"];
    // Quoted word.word strings in those sources that are not audit actions.
    const NOT_ACTIONS: &[&str] = &["mcp.servers", "settings.json"];
    let mut found = BTreeSet::new();
    for dir in
        ["services/store/src", "services/store/src/domain", "gateway-edge/src/rest", "services/chat/src/channels"]
    {
        for entry in std::fs::read_dir(root.join(dir))? {
            let path = entry?.path();
            let test_file = path.file_stem().is_some_and(|s| s.to_string_lossy().ends_with("_tests"));
            if path.extension().is_none_or(|e| e != "rs") || test_file {
                continue;
            }
            let text = std::fs::read_to_string(&path)?;
            let code = text.split("#[cfg(test)]").next().unwrap_or_default();
            // Like `grep '"[a-z]*\.[a-z_]*"'`: a quoted word.word, double or single quotes.
            let b = code.as_bytes();
            for (i, &q) in b.iter().enumerate() {
                if q != b'"' && q != b'\'' {
                    continue;
                }
                let len =
                    b[i + 1..].iter().take_while(|c| c.is_ascii_lowercase() || **c == b'.' || **c == b'_').count();
                if b.get(i + 1 + len) != Some(&q) {
                    continue;
                }
                let piece = &code[i + 1..i + 1 + len];
                let Some((prefix, rest)) = piece.split_once('.') else { continue };
                // Channel actions may have a third part (`channel.pair.start`).
                let parts_ok = !rest.contains('.') || (prefix == "channel" && rest.matches('.').count() == 1);
                if PREFIXES.contains(&prefix) && !rest.is_empty() && parts_ok && !NOT_ACTIONS.contains(&piece) {
                    found.insert(piece.to_owned());
                }
            }
        }
    }
    Ok(found)
}

#[tokio::test]
async fn audit_help_lists_the_actions_the_sources_write() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let help = home.cli(&["audit", "--help"]).await?.ok()?;
    let flat = help.stdout.split_whitespace().collect::<Vec<_>>().join(" ");
    let listed = flat
        .split("[possible values: ")
        .find(|part| part.starts_with("server."))
        .and_then(|part| part.split(']').next())
        .with_context(|| format!("no action list in `coffer audit --help`:\n{}", help.stdout))?;
    let listed: BTreeSet<String> = listed.split(", ").map(str::to_owned).collect();
    let sources = audit_actions_in_sources()?;
    ensure!(sources.len() >= 13, "the source scan found too little: {sources:?}");
    assert_eq!(listed, sources, "`coffer audit --help` and the sources disagree");

    let out = home.cli(&["audit", "--action", "server.delete"]).await?;
    expect_code(&out, 2)?;
    ensure!(out.stderr.contains("server.remove") && out.stderr.contains("maintenance.prune"), "{out}");
    ensure!(home.daemon_processes().is_empty(), "an unknown action was sent to a daemon");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_show_defaults_and_check_values() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let out = home.cli(&["settings", "get"]).await?.ok()?;
    ensure!(out.stdout.contains("defaults"), "says they are defaults: {out}");
    for (key, default) in [
        ("gateway.list_timeout_ms", "10000"),
        ("gateway.start_timeout_ms", "30000"),
        ("gateway.call_timeout_ms", "60000"),
        ("gateway.session_idle_timeout_s", "1800"),
        ("gateway.max_tool_name_len", "51"),
        ("retention.invocations_days", "30"),
        ("retention.invocations_max_rows", "100000"),
        ("retention.audit_days", "365"),
        ("retention.audit_max_rows", "100000"),
        ("retrieval.engine_timeout_ms", "2000"),
        ("retrieval.max_file_bytes", "16777216"),
        ("retrieval.embeddings.batch_size", "32"),
    ] {
        let row = out.stdout.lines().find(|l| l.starts_with(key)).with_context(|| format!("{key} missing: {out}"))?;
        assert_eq!(row.split_whitespace().collect::<Vec<_>>(), [key, default, "default"], "{out}");
    }
    let one = home.cli(&["settings", "get", "gateway.call_timeout_ms"]).await?.ok()?;
    assert_eq!(one.stdout, "60000\n", "{one}");

    for (key, value) in [
        ("gateway.call_timeout_ms", "0"),
        ("gateway.call_timeout_ms", "soon"),
        ("gateway.session_idle_timeout_s", "-1"),
        ("gateway.max_tool_name_len", "39"),
        ("gateway.max_tool_name_len", "65"),
        ("retention.audit_days", "1.5"),
    ] {
        let out = home.cli(&["settings", "set", key, value]).await?;
        expect_code(&out, 2)?;
        ensure!(out.stderr.contains(key), "{out}");
    }
    let out = home.cli(&["settings", "set", "gateway.call_timout_ms", "5"]).await?;
    expect_code(&out, 2)?;
    ensure!(out.stderr.contains("--force") && out.stderr.contains("gateway.call_timeout_ms"), "{out}");

    home.cli(&["settings", "set", "gateway.max_tool_name_len", "64"]).await?.ok()?;
    home.cli(&["settings", "set", "my.own.key", "x", "--force"]).await?.ok()?;
    let values = home.cli(&["settings", "get", "--json"]).await?.ok()?.json()?;
    assert_eq!(values["values"], json!({"gateway.max_tool_name_len": "64", "my.own.key": "x"}));
    // … and every setting, as the table shows it: its value in effect and whether it is the default.
    let rows = values["settings"].as_array().context("settings")?;
    let row = |key: &str| rows.iter().find(|r| r["key"] == key).cloned().unwrap_or_default();
    assert_eq!(
        row("gateway.max_tool_name_len"),
        json!({"key": "gateway.max_tool_name_len", "value": "64", "source": "set", "default": "51"})
    );
    assert_eq!(
        row("gateway.call_timeout_ms"),
        json!({"key": "gateway.call_timeout_ms", "value": "60000", "source": "default", "default": "60000"})
    );
    assert_eq!(row("my.own.key"), json!({"key": "my.own.key", "value": "x", "source": "set", "default": null}));
    ensure!(rows.len() == coffer_types::settings::SETTINGS.len() + 1, "every setting once: {values}");
    // Unsetting a key that is neither read by Coffer nor set is a typo: exit 3 naming it.
    let out = home.cli(&["settings", "unset", "nope.key"]).await?;
    expect_code(&out, 3)?;
    ensure!(out.stderr.contains("\"nope.key\" is not a setting Coffer reads"), "{out}");
    home.cli(&["settings", "unset", "my.own.key"]).await?.ok()?;
    // A key given twice in one `set` object is refused naming it (not the last one kept).
    let r = home
        .api()?
        .request(Method::PATCH, "/v1/settings")
        .header("content-type", "application/json")
        .body(r#"{"set": {"gateway.call_timeout_ms": "5000", "gateway.call_timeout_ms": "9000"}}"#)
        .reply()
        .await?;
    let e = r.expect_envelope(400, "INVALID_ARGUMENT")?;
    ensure!(e["message"] == "field \"set\": key \"gateway.call_timeout_ms\" is given twice", "{e}");
    ensure!(e["details"] == json!({"field": "set", "key": "gateway.call_timeout_ms"}), "{e}");
    let one = home.cli(&["settings", "get", "gateway.call_timeout_ms"]).await?.ok()?;
    assert_eq!(one.stdout, "60000\n", "nothing was stored: {one}");
    let out = home.cli(&["settings", "get"]).await?.ok()?;
    let row = out.stdout.lines().find(|l| l.starts_with("gateway.max_tool_name_len")).context("row")?;
    assert_eq!(row.split_whitespace().collect::<Vec<_>>(), ["gateway.max_tool_name_len", "64", "set"], "{out}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_says_yes_or_no_and_the_gateway_restarts() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    for body in [
        json!({"name": "on", "url": "http://127.0.0.1:9/mcp"}),
        json!({"name": "off", "url": "http://127.0.0.1:9/mcp", "enabled": false}),
    ] {
        ensure!(api.post_json("/v1/mcp/servers", &body).reply().await?.status == 201);
    }
    let out = home.cli(&["status"]).await?.ok()?;
    let ups = out.stdout.split("Upstreams:").nth(1).with_context(|| out.to_string())?;
    ensure!(ups.lines().nth(1).is_some_and(|h| h.contains("ENABLED")), "{out}");
    let row = |name: &str| ups.lines().find(|l| l.starts_with(name)).map(|l| l.split_whitespace().collect::<Vec<_>>());
    ensure!(row("on ").is_some_and(|r| r.contains(&"yes")) && row("off ").is_some_and(|r| r.contains(&"no")), "{out}");
    ensure!(!ups.contains("true") && !ups.contains("false"), "{out}");

    // The gateway restarts: 202, then the CLI waits for a new, healthy one.
    let old = api.service("gateway").await?["pid"].as_u64().context("pid")?;
    let out = home.cli(&["daemon", "restart", "gateway"]).await?.ok()?;
    let new = api.service("gateway").await?;
    let pid = new["pid"].as_u64().context("pid")?;
    ensure!(pid != old && new["state"] == "healthy", "{new}");
    assert_eq!(out.stdout, format!("Restarted gateway (pid {pid}, healthy)\n"), "{out}");
    let out = home.cli(&["daemon", "restart", "gateway", "--json"]).await?.ok()?;
    let j = out.json()?;
    ensure!(j["name"] == "gateway" && j["state"] == "healthy" && j["pid"] != json!(pid), "{out}");
    // Still serving.
    home.cli(&["mcp", "list"]).await?.ok()?;
    Ok(())
}

/// Sends SIGCONT to `pid` when dropped, so a failing test never leaves a stopped process.
struct Resume(i32);

impl Drop for Resume {
    fn drop(&mut self) {
        coffer_tests::procs::signal(self.0, nix::sys::signal::Signal::SIGCONT);
    }
}

/// A daemon whose gateway is frozen (SIGSTOP) is running, not gone: `coffer status` gives up
/// within seconds with exit 5 and a message naming the pid, the port and the fix (not "did not
/// become ready within 30s"), `coffer daemon status` says it runs but does not answer, and
/// `coffer daemon stop` stops it without the start-up wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_gateway_is_reported_as_unresponsive_quickly_and_can_be_stopped() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let daemon = home.daemon_info()?;
    let gateway = api.service("gateway").await?["pid"].as_i64().context("gateway pid")? as i32;
    coffer_tests::procs::signal(gateway, nix::sys::signal::Signal::SIGSTOP);
    let _resume = Resume(gateway);

    let started = std::time::Instant::now();
    let out = home.cli(&["status"]).await?;
    let took = started.elapsed();
    ensure!(out.code == Some(5), "status exit {:?}: {}{}", out.code, out.stdout, out.stderr);
    ensure!(
        out.stderr.contains(&format!("coffer-daemon (pid {}) is running but its HTTP edge", daemon.pid))
            && out.stderr.contains("coffer daemon restart"),
        "status message: {}",
        out.stderr
    );
    ensure!(took < Duration::from_secs(20), "status took {took:?} (the start-up wait is 30 s)");

    let out = home.cli(&["daemon", "status"]).await?;
    ensure!(out.code == Some(5), "daemon status exit {:?}: {}", out.code, out.stdout);
    ensure!(
        out.stdout.contains("is running but its HTTP edge") && !out.stdout.contains("not running"),
        "{}",
        out.stdout
    );
    let out = home.cli(&["daemon", "status", "--json"]).await?;
    let v: Value = serde_json::from_str(&out.stdout).with_context(|| out.stdout.clone())?;
    assert_eq!(v, json!({"running": true, "answering": false, "pid": daemon.pid, "port": daemon.port}));

    let started = std::time::Instant::now();
    let out = home.cli(&["daemon", "stop"]).await?;
    ensure!(out.success(), "daemon stop: {:?} {}{}", out.code, out.stdout, out.stderr);
    ensure!(out.stderr.contains("is running but its HTTP edge does not answer"), "{}", out.stderr);
    ensure!(started.elapsed() < Duration::from_secs(30), "stop took {:?}", started.elapsed());
    home.wait_no_processes(Duration::from_secs(15)).await?;
    Ok(())
}
