//! `coffer credentials set|list|remove` end to end: the value comes in on stdin (never
//! argv), reaches the upstream that references it, and is never printed; plus the usage errors
//! that must exit 2 before anything is asked of the daemon.
use std::process::Stdio;

use anyhow::{Context, ensure};
use coffer_tests::{CliOutput, SendExt, TestHome};
use serde_json::json;
use tokio::io::AsyncWriteExt;

/// Runs `coffer <args>` with `input` on its stdin (closed after it).
async fn cli_stdin(home: &TestHome, args: &[&str], input: &[u8]) -> anyhow::Result<CliOutput> {
    let mut cmd = home.cli_command(args)?;
    cmd.stdin(Stdio::piped());
    let mut child = cmd.spawn().context("starting coffer")?;
    let mut stdin = child.stdin.take().context("stdin")?;
    // A command that fails on its arguments exits without reading: a broken pipe is fine then.
    if let Err(e) = stdin.write_all(input).await
        && e.kind() != std::io::ErrorKind::BrokenPipe
    {
        return Err(e.into());
    }
    drop(stdin);
    let out = tokio::time::timeout(coffer_tests::CLI_TIMEOUT, child.wait_with_output())
        .await
        .context("coffer ran too long")??;
    Ok(CliOutput {
        args: args.iter().map(|a| (*a).to_owned()).collect(),
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_set_from_stdin_list_and_remove() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let secret = "e2e-cli-credential-value-271828";
    let replaced = "e2e-cli-credential-second-161803";

    // Usage errors exit 2 before any daemon is involved.
    let out = cli_stdin(&home, &["credentials", "set", "bad name"], b"x").await?;
    assert_eq!(out.code, Some(2), "{out}");
    let out = cli_stdin(&home, &["credentials", "set", "tok", "the-value"], b"").await?;
    assert_eq!(out.code, Some(2), "a value on the command line is refused: {out}");
    let out = cli_stdin(&home, &["credentials", "set", "tok"], b"\n").await?;
    assert_eq!(out.code, Some(2), "{out}");
    ensure!(out.stderr.contains("empty"), "{out}");
    assert!(home.processes().is_empty(), "no daemon was started for a usage error");

    // A piped value, one trailing newline dropped.
    let out = cli_stdin(&home, &["credentials", "set", "tok"], format!("{secret}\n").as_bytes()).await?.ok()?;
    ensure!(out.stdout.contains("Stored credential tok (version 1)"), "{out}");
    let out = cli_stdin(&home, &["credentials", "set", "tok", "--json"], replaced.as_bytes()).await?.ok()?;
    assert_eq!(out.json()?["version"], 2);

    // A server referencing it gets exactly the value.
    let api = home.api()?;
    let tiny = coffer_tests::bin("coffer-tiny-upstream")?.display().to_string();
    let body = json!({"name": "tiny", "command": tiny, "env": {"TINY_ECHO_ENV": {"credential_ref": "tok"}}});
    let r = api.post_json("/v1/mcp/servers", &body).reply().await?;
    ensure!(r.status == 201, "{} {}", r.status, r.text);
    let r =
        api.post_json("/v1/tools/call", &json!({"name": "tiny__whoami", "arguments": {}})).reply().await?.ok_json()?;
    let who: serde_json::Value = serde_json::from_str(r["content"][0]["text"].as_str().context("text")?)?;
    assert_eq!(who["env"], replaced, "the value arrived without its newline");

    let list = home.cli(&["credentials", "list"]).await?.ok()?;
    ensure!(list.stdout.contains("NAME") && list.stdout.contains("tok") && list.stdout.contains("tiny"), "{list}");
    let list = home.cli(&["credentials", "list", "--json"]).await?.ok()?;
    let items = list.json()?["items"].clone();
    assert_eq!((items[0]["name"].as_str(), items[0]["version"].as_i64()), (Some("tok"), Some(2)), "{list}");
    for o in [&list, &home.cli(&["credentials", "list"]).await?] {
        ensure!(!o.stdout.contains(secret) && !o.stdout.contains(replaced), "a value was printed: {o}");
    }

    // Removing one that a server references warns; removing it again is exit 3.
    let out = home.cli(&["credentials", "remove", "tok"]).await?.ok()?;
    ensure!(out.stdout.contains("Removed credential tok"), "{out}");
    ensure!(out.stderr.contains("server tiny references tok"), "{out}");
    let out = home.cli(&["credentials", "remove", "tok"]).await?;
    assert_eq!(out.code, Some(3), "{out}");
    let out = home.cli(&["credentials", "list"]).await?.ok()?;
    ensure!(out.stdout.contains("No credentials"), "{out}");
    Ok(())
}

#[tokio::test]
async fn a_json_argument_that_does_not_parse_exits_2() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let out = home.cli(&["tools", "call", "tiny__echo", "--args", "{\"message\": "]).await?;
    assert_eq!(out.code, Some(2), "{out}");
    ensure!(out.stderr.contains("--args") && out.stderr.contains("not valid JSON"), "{out}");
    let out = home.cli(&["tools", "call", "tiny__echo", "--args", "[1, 2]"]).await?;
    assert_eq!(out.code, Some(2), "{out}");
    assert!(home.processes().is_empty(), "a usage error starts no daemon");
    Ok(())
}
