//! `coffer-mcp-shim` across daemon restarts and crashes, driven over stdio with raw JSON lines
//! like any MCP client: the first request after `coffer daemon stop`, `coffer daemon restart` or
//! a SIGKILL of `coffer-daemon` is sent on a new session (detect-or-spawn again, the client's
//! `initialize` replayed) instead of failing with "the connection to the Coffer daemon was lost";
//! a managed agent's shim (`COFFER_AGENT_SHIM=1`) does the same with `agent-access/agent.json`
//! (the next run's agent token) but never starts a daemon; and a stdin line over the frame
//! limit, answered by its id.
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use coffer_tests::mcp::register_tiny;
use coffer_tests::peers::texts;
use coffer_tests::{START_TIMEOUT, TestHome, bin, procs, wait_for};
use nix::sys::signal::Signal;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};

/// How long one answer may take: a request that finds the daemon gone waits for a new one.
const ANSWER_TIMEOUT: Duration = START_TIMEOUT;

/// The shim as an MCP client runs it: stdin/stdout pipes, stderr to a file of the home's
/// temporary directory (shown by the diagnostics of a failing test).
struct Shim {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: Lines<BufReader<ChildStdout>>,
    stderr_path: PathBuf,
    next_id: i64,
}

impl Shim {
    fn start(home: &TestHome) -> anyhow::Result<Self> {
        Self::start_with(home, &[])
    }

    /// [`Shim::start`] with extra environment variables.
    fn start_with(home: &TestHome, env: &[(&str, &str)]) -> anyhow::Result<Self> {
        let stderr_path = home.temp().join("coffer-mcp-shim.stderr");
        let mut cmd = home.command(&bin("coffer-mcp-shim")?);
        cmd.envs(env.iter().copied());
        cmd.env("COFFER_LOG", "debug")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr_path)?);
        let mut child = tokio::process::Command::from(cmd).kill_on_drop(true).spawn().context("starting the shim")?;
        let stdin = child.stdin.take().context("shim stdin")?;
        let stdout = BufReader::new(child.stdout.take().context("shim stdout")?).lines();
        Ok(Self { child, stdin: Some(stdin), stdout, stderr_path, next_id: 0 })
    }

    fn pid(&self) -> Option<i32> {
        self.child.id().and_then(|p| i32::try_from(p).ok())
    }

    async fn send(&mut self, message: &Value) -> anyhow::Result<()> {
        let stdin = self.stdin.as_mut().context("stdin is closed")?;
        stdin.write_all(format!("{message}\n").as_bytes()).await?;
        stdin.flush().await?;
        Ok(())
    }

    /// Sends a request and returns its answer (skipping anything else the shim writes).
    async fn request(&mut self, method: &str, params: Value) -> anyhow::Result<Value> {
        self.next_id += 1;
        let id = self.next_id;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})).await?;
        self.answer(&json!(id), method).await
    }

    /// The answer to request `id` (a `what` request), skipping anything else the shim writes.
    async fn answer(&mut self, id: &Value, what: &str) -> anyhow::Result<Value> {
        let deadline = Instant::now() + ANSWER_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = tokio::time::timeout(left, self.stdout.next_line())
                .await
                .with_context(|| format!("no answer to {what} (id {id}) within {ANSWER_TIMEOUT:?}"))??
                .with_context(|| format!("the shim closed stdout; stderr: {}", self.stderr()))?;
            let message: Value =
                serde_json::from_str(&line).with_context(|| format!("stdout line is not JSON: {line}"))?;
            if &message["id"] == id && message.get("method").is_none() {
                return Ok(message);
            }
        }
    }

    async fn initialize(&mut self) -> anyhow::Result<()> {
        let params = json!({
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "e2e-shim-recovery", "version": "1"},
        });
        let reply = self.request("initialize", params).await?;
        ensure!(reply["result"]["protocolVersion"].is_string(), "initialize: {reply}");
        self.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await
    }

    /// `tools/call tiny__echo`, which must succeed.
    async fn echo(&mut self, message: &str) -> anyhow::Result<()> {
        let params = json!({"name": "tiny__echo", "arguments": {"message": message}});
        let reply = self.request("tools/call", params).await?;
        ensure!(
            reply.get("error").is_none() && texts(&reply["result"]) == message,
            "tools/call tiny__echo({message:?}) → {reply}\nshim stderr:\n{}",
            self.stderr()
        );
        Ok(())
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// Closes stdin and waits for a clean exit.
    async fn close(mut self) -> anyhow::Result<()> {
        drop(self.stdin.take());
        let status = tokio::time::timeout(Duration::from_secs(15), self.child.wait()).await.context("shim exit")??;
        ensure!(status.success(), "the shim exited with {status}; stderr: {}", self.stderr());
        Ok(())
    }
}

/// A home with a daemon, the tiny upstream registered, and an initialized shim that has made
/// one successful call.
async fn connected() -> anyhow::Result<(TestHome, Shim)> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    register_tiny(&api, "tiny", json!({})).await?;
    let mut shim = Shim::start(&home)?;
    shim.initialize().await?;
    shim.echo("before").await?;
    Ok((home, shim))
}

/// Whether a TCP connection to `127.0.0.1:port` is still established from the client side
/// (`/proc/net/tcp{,6}`: fields `local_address rem_address st`, state `01` = ESTABLISHED).
fn established_to(port: u16) -> bool {
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|table| {
        std::fs::read_to_string(table).unwrap_or_default().lines().skip(1).any(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let remote_port =
                fields.get(2).and_then(|a| a.rsplit(':').next()).and_then(|p| u16::from_str_radix(p, 16).ok());
            fields.get(3) == Some(&"01") && remote_port == Some(port)
        })
    })
}

/// The daemon that `daemon.json` names is alive and not `old`; returns its pid.
fn new_daemon(home: &TestHome, old: u32) -> anyhow::Result<u32> {
    let pid = home.daemon_info()?.pid;
    ensure!(pid != old, "still the old daemon {old}");
    ensure!(procs::alive(pid as i32), "daemon.json names {pid}, which is not running");
    Ok(pid)
}

#[tokio::test]
async fn first_request_after_daemon_stop_starts_a_new_daemon() -> anyhow::Result<()> {
    let (home, mut shim) = connected().await?;
    let old = home.daemon_info()?.pid;
    home.cli(&["daemon", "stop"]).await?.ok()?;
    ensure!(!home.root().join("daemon.json").exists(), "the daemon stopped");

    // At once: the request itself finds the daemon gone and starts a new one.
    shim.echo("right after the stop").await?;
    let pid = new_daemon(&home, old)?;
    home.cli(&["daemon", "status"]).await?.ok()?;
    shim.echo("and after that").await?;
    ensure!(home.daemon_info()?.pid == pid && home.daemon_processes().len() == 1, "one daemon, started once");
    shim.close().await
}

#[tokio::test]
async fn first_request_after_daemon_restart_uses_the_restarted_daemon() -> anyhow::Result<()> {
    let (home, mut shim) = connected().await?;
    let old = home.daemon_info()?.pid;
    home.cli(&["daemon", "restart"]).await?.ok()?;
    let restarted = new_daemon(&home, old)?;

    shim.echo("right after the restart").await?;
    ensure!(home.daemon_info()?.pid == restarted, "the shim used the restarted daemon, it did not start another");
    ensure!(home.daemon_processes().len() == 1, "one daemon: {:?}", home.daemon_processes());
    shim.close().await
}

#[tokio::test]
async fn first_request_after_the_daemon_is_killed_starts_a_new_daemon() -> anyhow::Result<()> {
    let (home, mut shim) = connected().await?;
    let info = home.daemon_info()?;
    let old = info.pid;
    // The daemon and the gateway (its child, holding the public listener with it) die at once.
    // Wait only until that death has reached the clients' sockets (their keep-alive connections
    // got the FIN), so the call below goes to a daemon that is gone instead of racing its death:
    // a request written before the FIN arrived cannot be told apart from one the dying gateway
    // read, may have taken effect, and is rightly failed rather than resent.
    let doomed: Vec<_> = home
        .processes()
        .into_iter()
        .filter(|p| Some(p.pid) != shim.pid() && matches!(p.name.as_str(), "coffer-daemon" | "coffer-gateway"))
        .collect();
    ensure!(doomed.len() == 2, "daemon and gateway: {doomed:?}");
    procs::signal(old as i32, Signal::SIGKILL);
    wait_for("the killed daemon and its gateway to be gone", Duration::from_secs(10), || async {
        Ok((doomed.iter().all(|p| !procs::still_alive(p)) && !established_to(info.port)).then_some(()))
    })
    .await?;

    shim.echo("right after the kill").await?;
    let pid = new_daemon(&home, old)?;
    home.cli(&["daemon", "status"]).await?.ok()?;
    shim.echo("and after that").await?;
    ensure!(home.daemon_info()?.pid == pid, "one new daemon");
    shim.close().await
}

/// A managed agent's shim connects with `agent.json` alone (`daemon.json` out of its reach — here
/// moved away while it connects), follows a `coffer daemon restart` to the new run's agent
/// token, and, the daemon stopped, answers -32001 saying so instead of starting one.
#[tokio::test]
async fn an_agent_shim_uses_agent_json_follows_a_restart_and_never_starts_a_daemon() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    register_tiny(&api, "tiny", json!({})).await?;
    let daemon_json = home.root().join("daemon.json");
    let aside = home.temp().join("daemon.json.aside");
    std::fs::rename(&daemon_json, &aside)?;
    let mut shim = Shim::start_with(&home, &[("COFFER_AGENT_SHIM", "1")])?;
    let connected = async {
        shim.initialize().await?;
        shim.echo("with the agent token").await
    }
    .await;
    std::fs::rename(&aside, &daemon_json)?;
    connected?;
    ensure!(home.daemon_processes().len() == 1, "no second daemon: {:?}", home.daemon_processes());

    let old = home.daemon_info()?.pid;
    home.cli(&["daemon", "restart"]).await?.ok()?;
    let restarted = new_daemon(&home, old)?;
    shim.echo("after the restart").await?;
    ensure!(home.daemon_info()?.pid == restarted, "the restarted daemon, none started by the shim");

    home.cli(&["daemon", "stop"]).await?.ok()?;
    let reply = shim.request("tools/call", json!({"name": "tiny__echo", "arguments": {"message": "x"}})).await?;
    ensure!(reply["error"]["code"] == -32001, "{reply}");
    ensure!(reply["error"]["data"]["reason"].as_str().is_some_and(|m| m.contains("not running")), "{reply}");
    ensure!(home.daemon_processes().is_empty(), "the agent's shim started a daemon: {:?}", home.daemon_processes());
    ensure!(!daemon_json.exists(), "no daemon wrote daemon.json");
    shim.close().await
}

/// A stdin line over the shim's 16 MiB frame limit is answered -32600 with its request id even
/// when the id follows the huge `params` (the TypeScript SDK writes `id` last), so the client
/// does not wait for its own timeout; the session goes on.
#[tokio::test]
async fn an_oversized_request_is_refused_with_its_id_even_when_the_id_comes_last() -> anyhow::Result<()> {
    const FRAME_LIMIT: usize = 16 * 1024 * 1024;
    let (_home, mut shim) = connected().await?;
    let mut line = br#"{"method":"tools/call","params":{"name":"tiny__echo","arguments":{"message":""#.to_vec();
    line.resize(line.len() + FRAME_LIMIT + 1024, b'x');
    line.extend_from_slice(br#""}},"jsonrpc":"2.0","id":"big-1"}"#);
    line.push(b'\n');
    let stdin = shim.stdin.as_mut().context("stdin")?;
    stdin.write_all(&line).await?;
    stdin.flush().await?;
    drop(line);
    let reply = shim.answer(&json!("big-1"), "the oversized tools/call").await?;
    assert_eq!(reply["error"]["code"], -32600, "{reply}");
    ensure!(
        reply["error"]["message"].as_str().is_some_and(|m| m.contains(&FRAME_LIMIT.to_string())),
        "names the limit: {reply}"
    );
    shim.echo("after the oversized line").await?;
    shim.close().await
}
