//! `coffer chat send` as a script uses it, on a real daemon (`coffer-test-daemon scripted-chat`:
//! the chat service with the test-only `scripted` agent): a message longer than a command line
//! takes (Linux refuses one argument over 128 KiB) from standard input (`-`) or `--file`, the
//! usage errors before anything is sent (empty, unreadable, over the chat service's 1 MiB
//! limit), and `--watch`'s exit codes: 0 only when the turn's end was seen, 1 when the chat
//! service was killed mid-turn (its end lost with the events: a `reset`), 130 after Ctrl-C.
use std::time::Duration;

use anyhow::{Context, ensure};
use coffer_tests::chat::rest_create as create;
use coffer_tests::{Api, SendExt, TestHome, chat, procs, wait_for};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

/// How long a step waits (the chat service's restart included) on the loaded test machine.
const WAIT: Duration = Duration::from_secs(40);

/// The conversation's messages (oldest first) as REST has them.
async fn messages(api: &Api, id: &str) -> anyhow::Result<Vec<Value>> {
    let v = api.get(&format!("/v1/conversations/{id}?messages=50")).reply().await?.ok_json()?;
    Ok(v["messages"].as_array().cloned().unwrap_or_default())
}

fn text_of(m: &Value) -> String {
    m["blocks"]
        .as_array()
        .map(|bs| bs.iter().filter_map(|b| b["text"].as_str()).collect::<String>())
        .unwrap_or_default()
}

/// A 200 KB message (1,000 lines) no command line can carry in one argument.
fn long_message(tag: &str) -> String {
    let mut s = format!("say:{tag}\n");
    for i in 0..1000 {
        s.push_str(&format!("line {i:04} {}\n", "x".repeat(190)));
    }
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_send_takes_a_long_message_from_stdin_or_a_file_and_refuses_bad_input_first() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    // Usage errors are found before the daemon is reached: none is started.
    let unknown = "01JDQ8ZKXW5T3M2N4P6R7S8T9V";
    let missing = home.temp().join("missing.md");
    let out = home.cli(&["chat", "send", unknown, "--file", missing.to_str().context("path")?]).await?;
    ensure!(out.code == Some(2) && out.stderr.contains("missing.md: cannot read it"), "{out}");
    let huge = home.temp().join("huge.md");
    std::fs::write(&huge, "y".repeat(1024 * 1024 + 10))?;
    let out = home.cli(&["chat", "send", unknown, "--file", huge.to_str().context("path")?]).await?;
    ensure!(
        out.code == Some(2)
            && out.stderr.contains("1048586 bytes")
            && out.stderr.contains("the chat service's limit of 1 MiB (1048576 bytes)"),
        "{out}"
    );
    let mut child = home.cli_command(&["chat", "send", unknown, "-"])?.stdin(std::process::Stdio::piped()).spawn()?;
    drop(child.stdin.take());
    let done = tokio::time::timeout(WAIT, child.wait_with_output()).await??;
    let stderr = String::from_utf8_lossy(&done.stderr);
    ensure!(done.status.code() == Some(2) && stderr.contains("the message on stdin is empty"), "{stderr}");
    let out = home.cli(&["chat", "send", unknown, "--json", "--file", huge.to_str().context("path")?]).await?;
    assert_eq!(out.json()?["error"]["code"], "INVALID_ARGUMENT", "{out}");
    assert!(home.processes().is_empty(), "usage errors start no daemon: {:?}", home.processes());

    let api = chat::start_daemon(&home).await?;
    let id = create(&api).await?["id"].as_str().context("id")?.to_owned();
    // From standard input, followed to its end.
    let from_stdin = long_message("from stdin");
    let mut child = home
        .cli_command(&["chat", "send", &id, "-", "--watch"])?
        .stdin(std::process::Stdio::piped())
        .spawn()
        .context("starting coffer")?;
    let mut stdin = child.stdin.take().context("stdin")?;
    stdin.write_all(from_stdin.as_bytes()).await?;
    drop(stdin);
    let done = tokio::time::timeout(WAIT, child.wait_with_output()).await??;
    let stdout = String::from_utf8_lossy(&done.stdout);
    ensure!(done.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&done.stderr));
    ensure!(stdout.contains("from stdin") && stdout.contains("line 0999") && stdout.contains("✓ done"), "{stdout}");
    // From a file.
    let from_file = long_message("from a file");
    let file = home.temp().join("long.md");
    std::fs::write(&file, &from_file)?;
    let out = home.cli(&["chat", "send", &id, "--file", file.to_str().context("path")?, "--watch"]).await?.ok()?;
    ensure!(out.stdout.contains("from a file") && out.stdout.contains("✓ done"), "{out}");
    let users: Vec<String> = messages(&api, &id).await?.iter().filter(|m| m["role"] == "user").map(text_of).collect();
    assert_eq!(users.len(), 2, "{users:?}");
    assert!(users[0] == from_stdin && users[1] == from_file, "each message stored whole, byte for byte");
    // A blank file is empty too (with the daemon up: still refused before sending).
    let blank = home.temp().join("blank.md");
    std::fs::write(&blank, "\n \n")?;
    let out = home.cli(&["chat", "send", &id, "--file", blank.to_str().context("path")?]).await?;
    ensure!(out.code == Some(2) && out.stderr.contains("blank.md is empty"), "{out}");
    assert_eq!(messages(&api, &id).await?.iter().filter(|m| m["role"] == "user").count(), 2, "nothing more sent");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_watch_exits_non_zero_when_the_turn_s_end_was_not_seen() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = chat::start_daemon(&home).await?;
    let id = create(&api).await?["id"].as_str().context("id")?.to_owned();
    // Seen to its end: 0.
    let out = home.cli(&["chat", "send", &id, "say:all of it", "--watch"]).await?.ok()?;
    ensure!(out.stdout.contains("all of it") && out.stdout.contains("✓ done"), "{out}");

    // The chat service is killed mid-turn: the stream resumes after its restart with a `reset`
    // (the events are gone) and the turn is over, failed: its end was never seen.
    let mut child = home.cli_command(&["chat", "send", &id, "slow:300\ndeltas:200", "--watch"])?.spawn()?;
    let mut lines = tokio::io::BufReader::new(child.stdout.take().context("stdout")?);
    let mut seen = String::new();
    tokio::time::timeout(WAIT, async {
        while !seen.contains("w1 ") {
            let mut buf = Vec::new();
            // Deltas carry no newline: read what is there, byte by byte up to a space.
            if lines.read_until(b' ', &mut buf).await? == 0 {
                anyhow::bail!("the watch ended before streaming: {seen}");
            }
            seen.push_str(&String::from_utf8_lossy(&buf));
        }
        anyhow::Ok(())
    })
    .await??;
    let old = api.service("chat").await?["pid"].as_i64().context("pid")? as i32;
    procs::signal(old, nix::sys::signal::Signal::SIGKILL);
    wait_for("chat to be restarted", WAIT, || async {
        let s = api.service("chat").await?;
        Ok((s["state"] == "healthy" && s["pid"] != old).then_some(()))
    })
    .await?;
    let mut stderr = child.stderr.take().context("stderr")?;
    let status = tokio::time::timeout(WAIT, child.wait()).await??;
    let mut said = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut stderr, &mut said).await?;
    ensure!(status.code() == Some(1), "exit {status:?}: {said}");
    ensure!(
        said.contains("the end of the turn was not seen")
            && said.contains("the chat service restarted")
            && said.contains("its answer is failed")
            && said.contains(&format!("coffer chat show {id}")),
        "{said}"
    );

    // Ctrl-C while following: the turn goes on, the exit says it was interrupted (130).
    let mut child = home.cli_command(&["chat", "send", &id, "slow:300\ndeltas:200", "--watch"])?.spawn()?;
    let mut out = tokio::io::BufReader::new(child.stdout.take().context("stdout")?);
    let mut first = Vec::new();
    tokio::time::timeout(WAIT, out.read_until(b' ', &mut first)).await??;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id().context("pid")? as i32),
        nix::sys::signal::Signal::SIGINT,
    )?;
    let status = tokio::time::timeout(WAIT, child.wait()).await??;
    assert_eq!(status.code(), Some(130), "Ctrl-C before the end");
    let v = api.get(&format!("/v1/conversations/{id}?messages=1")).reply().await?.ok_json()?;
    assert_eq!(v["conversation"]["turn_running"], true, "Ctrl-C stops watching, not the turn: {v}");
    Ok(())
}
