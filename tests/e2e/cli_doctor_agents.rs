//! `coffer doctor` and `coffer chat agents` on the chat agents, end to end on the shipped daemon:
//! an agent whose CLI is there shows the version its `--version` prints (a stand-in script
//! printing what Claude Code 2.1.332 prints, set with `coffer settings set`), one whose CLI is
//! missing is a doctor warning naming why and how to fix it (the report still exits 0), in the
//! text and the `--json` report.
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use anyhow::{Context, ensure};
use coffer_tests::{TestHome, doctor_check, wait_for};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_names_unavailable_agents_and_the_versions_of_the_others() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let _api = home.start_daemon().await?;
    let claude = home.temp().join("claude");
    std::fs::write(
        &claude,
        "#!/bin/sh\nif [ \"$1\" = --version ]; then echo '2.1.332 (Claude Code)'; exit 0; fi\nexit 1\n",
    )?;
    std::fs::set_permissions(&claude, std::fs::Permissions::from_mode(0o755))?;
    let missing = home.temp().join("no-codex-here");
    home.cli(&["settings", "set", "chat.claude_code_path", claude.to_str().context("path")?]).await?.ok()?;
    home.cli(&["settings", "set", "chat.codex_path", missing.to_str().context("path")?]).await?.ok()?;

    // The agents list: the version read from the CLI, the reason for the missing one.
    let agents = wait_for("the settings to reach the chat service", Duration::from_secs(30), || async {
        let out = home.cli(&["chat", "agents", "--json"]).await?.ok()?;
        let v = out.json()?;
        let items = v["items"].as_array().cloned().unwrap_or_default();
        let by = |k: &str| items.iter().find(|a| a["agent_key"] == k).cloned();
        Ok(match (by("claude_code"), by("codex")) {
            (Some(c), Some(x)) if c["available"] == true && x["available"] == false => Some((c, x)),
            _ => None,
        })
    })
    .await?;
    let (claude_code, codex) = agents;
    assert_eq!(claude_code["version"], "2.1.332", "{claude_code}");
    assert_eq!(claude_code["command"], claude.to_str().context("path")?, "{claude_code}");
    let reason = codex["reason"].as_str().context("a reason")?.to_owned();
    ensure!(reason.contains("chat.codex_path") && reason.contains("not an executable file"), "{reason}");
    let out = home.cli(&["chat", "agents"]).await?.ok()?;
    let row = out.stdout.lines().find(|l| l.starts_with("claude_code")).context("a claude_code row")?;
    ensure!(row.contains("2.1.332"), "the VERSION column is filled: {out}");

    // Doctor: ok with the version, a warning with the reason and a fix; still exit 0.
    let out = home.cli(&["doctor"]).await?;
    assert_eq!(out.code, Some(0), "warnings only: {out}");
    ensure!(
        out.stdout.lines().any(|l| l.starts_with("ok") && l.contains("agent claude_code") && l.contains("2.1.332")),
        "{out}"
    );
    ensure!(
        out.stdout.lines().any(|l| l.starts_with("warn") && l.contains("agent codex") && l.contains("unavailable")),
        "{out}"
    );
    ensure!(out.stdout.contains("coffer settings set chat.codex_path"), "a fix: {out}");
    let report = home.cli(&["doctor", "--json"]).await?.ok()?.json()?;
    let c = doctor_check(&report, "agent claude_code")?;
    assert_eq!(c["status"], "ok", "{c}");
    ensure!(c["message"].as_str().is_some_and(|m| m.contains("2.1.332") && m.contains("claude")), "{c}");
    let x = doctor_check(&report, "agent codex")?;
    assert_eq!(x["status"], "warn", "{x}");
    ensure!(x["message"].as_str().is_some_and(|m| m.contains(&reason)), "{x}");
    ensure!(x["fix"].as_str().is_some_and(|f| f.contains("chat.codex_path")), "{x}");
    Ok(())
}
