//! `coffer-mcp-shim` on the kinds of stdin/stdout MCP clients really give it (shim/src/stdio.rs):
//! one end of a Unix socket pair as both stdin and stdout (Node's `child_process`), read and
//! written through the reactor; and a regular file as stdin (the blocking fallback) with a pipe
//! as stdout (through the reactor). Each session completes `initialize` →
//! `notifications/initialized` → `tools/list` → `tools/call coffer__search_tools`, puts nothing
//! but JSON-RPC lines on stdout, and ends with a clean exit at stdin EOF.
use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use coffer_tests::peers::texts;
use coffer_tests::{START_TIMEOUT, TestHome, bin, procs};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWriteExt, BufReader};
use tokio::process::Child;

/// How long the answers may take (the first request waits for the daemon's session).
const ANSWER_TIMEOUT: Duration = START_TIMEOUT;
/// How long the shim may take to exit after stdin EOF (its drain timeout is 5 s).
const EXIT_TIMEOUT: Duration = Duration::from_secs(15);
/// `O_NONBLOCK` as `/proc/<pid>/fdinfo/<fd>` shows it (octal `flags:` field).
const O_NONBLOCK: u32 = 0o4000;

const INITIALIZE: i64 = 1;
const TOOLS_LIST: i64 = 2;
const TOOLS_CALL: i64 = 3;

/// The client's messages, one JSON-RPC object per line.
fn requests() -> [Value; 4] {
    [
        json!({"jsonrpc": "2.0", "id": INITIALIZE, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "e2e-shim-stdio", "version": "1"},
        }}),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        json!({"jsonrpc": "2.0", "id": TOOLS_LIST, "method": "tools/list", "params": {}}),
        json!({"jsonrpc": "2.0", "id": TOOLS_CALL, "method": "tools/call",
            "params": {"name": "coffer__search_tools", "arguments": {"query": "search"}}}),
    ]
}

fn line(message: &Value) -> String {
    format!("{message}\n")
}

/// Parses a stdout line, which must be one JSON-RPC 2.0 message.
fn jsonrpc_line(line: &str) -> anyhow::Result<Value> {
    let message: Value = serde_json::from_str(line).with_context(|| format!("stdout line is not JSON: {line:?}"))?;
    ensure!(message["jsonrpc"] == "2.0", "stdout line is not JSON-RPC 2.0: {line}");
    Ok(message)
}

/// Reads stdout lines until the answers to every id in `ids` have arrived; returns them by id.
async fn answers<R: AsyncRead + Unpin>(
    lines: &mut tokio::io::Lines<BufReader<R>>,
    ids: &[i64],
    stderr: impl Fn() -> String,
) -> anyhow::Result<BTreeMap<i64, Value>> {
    let mut got = BTreeMap::new();
    let deadline = Instant::now() + ANSWER_TIMEOUT;
    while ids.iter().any(|id| !got.contains_key(id)) {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = tokio::time::timeout(left, lines.next_line())
            .await
            .with_context(|| format!("answers within {ANSWER_TIMEOUT:?}; have {got:?}; stderr: {}", stderr()))??
            .with_context(|| format!("the shim closed stdout; have {got:?}; stderr: {}", stderr()))?;
        let message = jsonrpc_line(&line)?;
        if message.get("method").is_none()
            && let Some(id) = message["id"].as_i64()
        {
            ensure!(got.insert(id, message).is_none(), "two answers to id {id}");
        }
    }
    Ok(got)
}

/// The answers to `initialize`, `tools/list` and `tools/call coffer__search_tools` are results.
fn check_answers(got: &BTreeMap<i64, Value>) -> anyhow::Result<()> {
    let init = &got[&INITIALIZE];
    ensure!(init["result"]["protocolVersion"].is_string(), "initialize: {init}");
    let list = &got[&TOOLS_LIST];
    let names: Vec<&str> = list["result"]["tools"]
        .as_array()
        .map(|t| t.iter().filter_map(|t| t["name"].as_str()).collect())
        .unwrap_or_default();
    ensure!(names.contains(&"coffer__search_tools"), "tools/list does not list coffer__search_tools: {list}");
    let call = &got[&TOOLS_CALL];
    ensure!(call.get("error").is_none() && call["result"].is_object(), "tools/call: {call}");
    ensure!(call["result"]["isError"] != true, "tools/call returned a tool error: {call}");
    ensure!(!texts(&call["result"]).is_empty(), "tools/call returned no text: {call}");
    Ok(())
}

/// Whether `fd` of process `pid` is in non-blocking mode (`/proc/<pid>/fdinfo/<fd>`).
fn nonblocking(pid: i32, fd: i32) -> anyhow::Result<bool> {
    let info = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}"))
        .with_context(|| format!("reading /proc/{pid}/fdinfo/{fd}"))?;
    let flags = info
        .lines()
        .find_map(|l| l.strip_prefix("flags:"))
        .and_then(|f| u32::from_str_radix(f.trim(), 8).ok())
        .with_context(|| format!("no flags in fdinfo: {info}"))?;
    Ok(flags & O_NONBLOCK != 0)
}

/// Starts the shim on `home` with the given stdin and stdout, stderr to a file.
fn spawn_shim(home: &TestHome, stdin: Stdio, stdout: Stdio) -> anyhow::Result<(Child, PathBuf)> {
    let stderr_path = home.temp().join("coffer-mcp-shim.stderr");
    let mut cmd = home.command(&bin("coffer-mcp-shim")?);
    cmd.env("COFFER_LOG", "debug").stdin(stdin).stdout(stdout).stderr(std::fs::File::create(&stderr_path)?);
    let mut cmd = tokio::process::Command::from(cmd);
    let child = cmd.kill_on_drop(true).spawn().context("starting the shim")?;
    // `cmd` holds the parent's copies of the child's stdio: close them, so the test sees EOF
    // when the shim is gone.
    drop(cmd);
    Ok((child, stderr_path))
}

/// Waits (with a deadline) for the shim to exit, and checks it is gone.
async fn exited(child: &mut Child, pid: i32, stderr: impl Fn() -> String) -> anyhow::Result<ExitStatus> {
    let status = tokio::time::timeout(EXIT_TIMEOUT, child.wait()).await.with_context(|| {
        format!("the shim did not exit within {EXIT_TIMEOUT:?} of stdin EOF; stderr: {}", stderr())
    })??;
    ensure!(!procs::alive(pid), "the shim (pid {pid}) still runs after it was reaped");
    Ok(status)
}

/// Reads the rest of stdout until EOF (the shim is gone); every line must be JSON-RPC.
async fn rest_of_stdout<R: AsyncRead + Unpin>(lines: &mut tokio::io::Lines<BufReader<R>>) -> anyhow::Result<()> {
    let deadline = Instant::now() + EXIT_TIMEOUT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, lines.next_line()).await.context("stdout EOF after the shim exited")?? {
            Some(line) => drop(jsonrpc_line(&line)?),
            None => return Ok(()),
        }
    }
}

/// Node's `child_process` gives the server one end of a socket pair as stdin and stdout: the shim
/// reads and writes it through the reactor (the shared description turns non-blocking), answers
/// the whole session, and exits 0 when the client shuts down its writing side.
#[tokio::test]
async fn shim_stdio_socket_pair_completes_a_session() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    home.start_daemon().await?;
    let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
    let theirs = OwnedFd::from(theirs);
    let (child_in, child_out) = (theirs.try_clone()?, theirs);
    let (mut child, stderr_path) = spawn_shim(&home, Stdio::from(child_in), Stdio::from(child_out))?;
    let pid = child.id().and_then(|p| i32::try_from(p).ok()).context("shim pid")?;
    let stderr = || std::fs::read_to_string(&stderr_path).unwrap_or_default();

    ours.set_nonblocking(true)?;
    let ours = tokio::net::UnixStream::from_std(ours)?;
    let (read, mut write) = ours.into_split();
    let mut lines = BufReader::new(read).lines();

    // The handshake, then the two requests, each sent as a client sends it: after the answer.
    let [init, initialized, list, call] = requests();
    write.write_all(line(&init).as_bytes()).await?;
    let mut got = answers(&mut lines, &[INITIALIZE], &stderr).await?;
    for fd in [0, 1] {
        let target = procs::fd_target(pid, fd).unwrap_or_default();
        ensure!(target.starts_with("socket:"), "the shim's fd {fd} is {target:?}, not the socket");
        ensure!(nonblocking(pid, fd)?, "the shim's fd {fd} (a socket) is not on the reactor (O_NONBLOCK unset)");
    }
    write.write_all(format!("{}{}", line(&initialized), line(&list)).as_bytes()).await?;
    got.append(&mut answers(&mut lines, &[TOOLS_LIST], &stderr).await?);
    write.write_all(line(&call).as_bytes()).await?;
    got.append(&mut answers(&mut lines, &[TOOLS_CALL], &stderr).await?);
    check_answers(&got)?;

    // EOF on the shim's stdin: shut down our writing side; the socket stays open for reading.
    write.shutdown().await?;
    let status = exited(&mut child, pid, &stderr).await?;
    ensure!(status.success(), "the shim exited with {status} at stdin EOF; stderr: {}", stderr());
    rest_of_stdout(&mut lines).await?;
    Ok(())
}

/// Stdin a regular file holding the whole session (tokio's blocking stdin, EOF right after the
/// last line) and stdout a pipe (through the reactor): every answer arrives, in-flight requests
/// are drained at EOF, and the shim exits 0.
#[tokio::test]
async fn shim_stdio_file_stdin_and_pipe_stdout_complete_a_session() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    home.start_daemon().await?;
    let input = home.temp().join("requests.jsonl");
    std::fs::write(&input, requests().iter().map(line).collect::<String>())?;
    let (reader, writer) = std::io::pipe()?;
    // A copy of the pipe's writing end shares the shim's open file description: its flags show
    // whether the shim registered stdout with the reactor.
    let our_writer = writer.try_clone()?;
    let (mut child, stderr_path) = spawn_shim(&home, Stdio::from(std::fs::File::open(&input)?), Stdio::from(writer))?;
    let pid = child.id().and_then(|p| i32::try_from(p).ok()).context("shim pid")?;
    let stderr = || std::fs::read_to_string(&stderr_path).unwrap_or_default();

    let reader = tokio::net::unix::pipe::Receiver::from_owned_fd(OwnedFd::from(reader))?;
    let mut lines = BufReader::new(reader).lines();
    let got = answers(&mut lines, &[INITIALIZE, TOOLS_LIST, TOOLS_CALL], &stderr).await?;
    check_answers(&got)?;

    let status = exited(&mut child, pid, &stderr).await?;
    ensure!(status.success(), "the shim exited with {status} at stdin EOF; stderr: {}", stderr());
    ensure!(
        nonblocking(i32::try_from(std::process::id())?, our_writer.as_raw_fd())?,
        "the shim's stdout (a pipe) was not put on the reactor (O_NONBLOCK unset)"
    );
    drop(our_writer);
    rest_of_stdout(&mut lines).await?;
    Ok(())
}
