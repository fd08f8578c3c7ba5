//! `coffer doctor` end to end: on a healthy home every check passes (exit 0); an upstream whose
//! command is gone, or a home readable by others, fails (exit 1) and is named with its fix; no
//! daemon is ever started by it.
use std::os::unix::fs::PermissionsExt;

use anyhow::{Context, ensure};
use coffer_tests::{SendExt, TestHome, doctor_check};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_on_a_healthy_home_and_a_broken_upstream() -> anyhow::Result<()> {
    let home = TestHome::new()?;

    // No daemon: a warning that says how to start one, and none is started.
    let out = home.cli(&["doctor"]).await?;
    assert_eq!(out.code, Some(0), "{out}");
    ensure!(out.stdout.contains("fix: start it now: coffer daemon start"), "{out}");
    assert!(home.processes().is_empty(), "doctor started a daemon");

    let api = home.start_daemon().await?;
    let tiny = coffer_tests::bin("coffer-tiny-upstream")?;
    let body = json!({"name": "tiny", "command": tiny.display().to_string()});
    let r = api.post_json("/v1/mcp/servers", &body).reply().await?;
    ensure!(r.status == 201, "{} {}", r.status, r.text);

    // `mcp test` starts it in a fresh session and reports what it offers.
    let out = home.cli(&["mcp", "test", "tiny"]).await?.ok()?;
    ensure!(out.stdout.starts_with("tiny: initialize ok (protocol ") && out.stdout.contains(" tools, "), "{out}");
    let out = home.cli(&["mcp", "test", "nosuch"]).await?;
    assert_eq!(out.code, Some(3), "{out}");

    let out = home.cli(&["doctor"]).await?;
    assert_eq!(out.code, Some(0), "healthy home: {out}");
    ensure!(!out.stdout.contains("fail "), "{out}");
    let report = home.cli(&["doctor", "--json"]).await?.ok()?.json()?;
    assert_eq!(report["ok"], true);
    for name in [
        "home",
        "daemon.json",
        "agent.json",
        "shim",
        "daemon",
        "version",
        "service store",
        "service gateway",
        "upstream tiny",
    ] {
        assert_eq!(doctor_check(&report, name)?["status"], "ok", "{name}: {report}");
    }

    // An upstream whose command went away: exit 1, named, with a fix.
    let gone = home.temp().join("gone-server");
    std::fs::copy(&tiny, &gone)?;
    let body = json!({"name": "broken", "command": gone.display().to_string()});
    let r = api.post_json("/v1/mcp/servers", &body).reply().await?;
    ensure!(r.status == 201, "{} {}", r.status, r.text);
    std::fs::remove_file(&gone)?;
    let out = home.cli(&["doctor"]).await?;
    assert_eq!(out.code, Some(1), "{out}");
    let line = out.stdout.lines().find(|l| l.starts_with("fail")).with_context(|| out.to_string())?;
    ensure!(line.contains("upstream broken") && line.contains(&format!("{} does not exist", gone.display())), "{out}");
    ensure!(out.stdout.contains("fix: install it, or give it the right command: coffer mcp edit broken"), "{out}");
    let report = home.cli(&["doctor", "--json"]).await?;
    assert_eq!(report.code, Some(1), "{report}");
    let report = report.json()?;
    assert_eq!(report["ok"], false);
    assert_eq!(doctor_check(&report, "upstream broken")?["status"], "fail");
    assert_eq!(doctor_check(&report, "upstream tiny")?["status"], "ok");
    let out = home.cli(&["mcp", "test", "broken"]).await?;
    assert_eq!(out.code, Some(1), "{out}");
    ensure!(out.stderr.contains("broken"), "{out}");

    // Disabled, it is only a warning.
    let r =
        api.request(reqwest::Method::PATCH, "/v1/mcp/servers/broken").json(&json!({"enabled": false})).reply().await?;
    ensure!(r.status == 200, "{} {}", r.status, r.text);
    let out = home.cli(&["doctor"]).await?;
    assert_eq!(out.code, Some(0), "{out}");
    ensure!(out.stdout.contains("warn  upstream broken"), "{out}");

    // A home that others can read fails, with the chmod that fixes it.
    std::fs::set_permissions(home.root(), std::fs::Permissions::from_mode(0o755))?;
    let out = home.cli(&["doctor"]).await?;
    std::fs::set_permissions(home.root(), std::fs::Permissions::from_mode(0o700))?;
    assert_eq!(out.code, Some(1), "{out}");
    ensure!(out.stdout.contains(&format!("fix: chmod 700 {}", home.root().display())), "{out}");
    Ok(())
}

/// A bare command is registered as given (a synced registry then works on a machine with
/// another layout), and `coffer doctor` says when it is not on this machine's PATH.
#[tokio::test]
async fn doctor_names_a_bare_command_that_is_not_on_this_machine_s_path() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let r = api
        .post_json("/v1/mcp/servers", &json!({"name": "bare", "command": "sh", "args": ["-c", "exit 0"]}))
        .reply()
        .await?;
    ensure!(r.status == 201, "{} {}", r.status, r.text);
    assert_eq!(api.get("/v1/mcp/servers/bare").reply().await?.ok_json()?["command"], "sh", "stored as given");
    let report = home.cli(&["doctor", "--json"]).await?.json()?;
    assert_eq!(doctor_check(&report, "upstream bare")?["status"], "ok", "{report}");

    // The same registry seen from a machine whose PATH has no `sh`.
    let mut cmd = home.cli_command(&["doctor"])?;
    cmd.env("PATH", home.temp().join("empty-bin"));
    let out = tokio::time::timeout(coffer_tests::CLI_TIMEOUT, cmd.output()).await??;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    let line = stdout.lines().find(|l| l.contains("upstream bare")).with_context(|| stdout.to_string())?;
    ensure!(line.starts_with("fail") && line.contains("command sh is not on this machine's PATH"), "{stdout}");
    Ok(())
}
