//! `coffer chat send` as a script uses it, on a real daemon (`coffer-test-daemon scripted-chat`:
//! the chat service with the test-only `scripted` agent): a message longer than a command line
//! takes (Linux refuses one argument over 128 KiB) from standard input (`-`) or `--file`, the
//! usage errors before anything is sent (empty, unreadable, over the chat service's 1 MiB
//! limit), and `--watch`'s exit codes: 0 only when the turn's end was seen, 1 when the chat
//! service was killed mid-turn (its end lost with the events: a `reset`), 130 after Ctrl-C.
//! Each `chat send` carries a fresh `Idempotency-Key`: a send whose answer is lost (the
//! connection drops after the daemon queued it) is sent again with the same key and queued once.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, ensure};
use coffer_tests::chat::rest_create as create;
use coffer_tests::{Api, SendExt, TestHome, chat, procs, wait_for};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};

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

/// A loopback TCP proxy in front of the daemon's edge that records every request's
/// `Idempotency-Key` and, once armed, cuts the connection of the next `POST …/messages` after
/// the daemon got it and before its answer reaches the client (an answer lost on the way).
/// Request heads have their `Host` turned into the edge's own (the edge checks it exactly).
struct LossyProxy {
    port: u16,
    keys: Arc<Mutex<Vec<String>>>,
    armed: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl LossyProxy {
    async fn start(upstream: u16) -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let keys = Arc::new(Mutex::new(Vec::new()));
        let armed = Arc::new(AtomicBool::new(false));
        let (k, a) = (keys.clone(), armed.clone());
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (keys, armed) = (k.clone(), a.clone());
                tokio::spawn(async move {
                    let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await else { return };
                    let (mut cr, mut cw) = client.into_split();
                    let (mut sr, mut sw) = server.into_split();
                    let cut = Arc::new(AtomicBool::new(false));
                    let cut_up = cut.clone();
                    let up = async move {
                        let mut buf = vec![0u8; 64 * 1024];
                        loop {
                            let n = match cr.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => n,
                            };
                            let mut chunk = String::from_utf8_lossy(&buf[..n]).into_owned();
                            for line in chunk.split("\r\n") {
                                if let Some((name, value)) = line.split_once(':')
                                    && name.eq_ignore_ascii_case("idempotency-key")
                                {
                                    keys.lock().unwrap().push(value.trim().to_owned());
                                }
                            }
                            if chunk.starts_with("POST /v1/conversations/") && armed.swap(false, Ordering::SeqCst) {
                                cut_up.store(true, Ordering::SeqCst);
                            }
                            let own = format!("host: 127.0.0.1:{port}\r\n");
                            let bytes = match chunk.to_ascii_lowercase().find(&own) {
                                Some(at) => {
                                    chunk.replace_range(at..at + own.len(), &format!("host: 127.0.0.1:{upstream}\r\n"));
                                    chunk.into_bytes()
                                }
                                None => buf[..n].to_vec(),
                            };
                            if sw.write_all(&bytes).await.is_err() {
                                return;
                            }
                        }
                    };
                    let down = async move {
                        let mut buf = vec![0u8; 64 * 1024];
                        loop {
                            let n = match sr.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => n,
                            };
                            if cut.load(Ordering::SeqCst) {
                                return; // the answer is dropped with the connection
                            }
                            if cw.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    };
                    // Either direction ending ends the connection (both halves are dropped).
                    tokio::select! { () = up => {}, () = down => {} }
                });
            }
        });
        Ok(Self { port, keys, armed, task })
    }

    fn keys(&self) -> Vec<String> {
        self.keys.lock().unwrap().clone()
    }
}

impl Drop for LossyProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_send_carries_an_idempotency_key_and_a_send_whose_answer_was_lost_is_queued_once() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = chat::start_daemon(&home).await?;
    let id = create(&api).await?;
    let id = id["id"].as_str().context("id")?.to_owned();
    // The CLI reaches the daemon through the proxy: its port in `daemon.json`.
    let file = home.daemon_json_path();
    let mut info: Value = serde_json::from_slice(&std::fs::read(&file)?)?;
    let upstream = u16::try_from(info["port"].as_u64().context("port")?)?;
    let proxy = LossyProxy::start(upstream).await?;
    info["port"] = proxy.port.into();
    std::fs::write(&file, serde_json::to_vec(&info)?)?;

    // A plain send: one key, a fresh one per command.
    let out = home.cli(&["chat", "send", &id, "say:first"]).await?;
    ensure!(out.code == Some(0), "{out}");
    let out = home.cli(&["chat", "send", &id, "say:second"]).await?;
    ensure!(out.code == Some(0), "{out}");
    let keys = proxy.keys();
    ensure!(keys.len() == 2 && keys[0] != keys[1], "one key per send, fresh each time: {keys:?}");
    ensure!(keys.iter().all(|k| k.len() >= 32 && k.bytes().all(|b| b.is_ascii_hexdigit())), "{keys:?}");

    // The answer of the next send is lost after the daemon queued it: the CLI sends it again
    // with the same key, says so, and the daemon answers with the first answer.
    proxy.armed.store(true, Ordering::SeqCst);
    let out = home.cli(&["chat", "send", &id, "say:only once"]).await?;
    ensure!(out.code == Some(0), "{out}");
    ensure!(out.stderr.contains("sending again with the same Idempotency-Key"), "{out}");
    ensure!(!proxy.armed.load(Ordering::SeqCst), "the cut happened");
    let keys = proxy.keys();
    ensure!(keys.len() == 4 && keys[2] == keys[3] && keys[2] != keys[1], "the retry reuses its key: {keys:?}");
    // Queued (and run) once.
    let once = wait_for("the message's turn done", WAIT, || async {
        let msgs = messages(&api, &id).await?;
        let users = msgs.iter().filter(|m| m["role"] == "user" && text_of(m) == "say:only once").count();
        let answered = msgs.iter().any(|m| m["role"] == "assistant" && text_of(m).contains("only once"));
        Ok(answered.then_some(users))
    })
    .await?;
    let view = api.get(&format!("/v1/conversations/{id}")).reply().await?.ok_json()?;
    let pending = view["pending"]["items"].as_array().map_or(0, Vec::len);
    ensure!(once == 1 && pending == 0, "sent once: {once} user messages, {pending} pending; {view}");
    Ok(())
}
