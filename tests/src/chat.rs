//! Chat test support: the test-only `scripted` agent provider (registered by the
//! `coffer-test-chat` binary, never by the shipped `coffer-chat`), and a small client harness for
//! the chat service of a real daemon (`coffer-test-daemon scripted-chat`).
//!
//! ## The scripted agent's script
//!
//! A turn follows the script in its message text, one command per line (blank lines skipped);
//! a line that is no command is said as text. Commands:
//!
//! | line | what the adapter does |
//! |---|---|
//! | `say:<text>` | streams `<text>` word by word, one `TextDelta` per word (its trailing space included) |
//! | `deltas:<n>` | streams `n` deltas `w0 `, `w1 `, … |
//! | `nl` | streams a newline (`say` words never hold one) |
//! | `big:<bytes>` | streams `bytes` of text (numbered lines `line <n> of a long reply …`) in deltas of [`BIG_DELTA`] bytes |
//! | `stamped:<n>` | streams `n` deltas `t<µs> `, each carrying the wall-clock time it is sent (Unix µs, [`unix_micros`]; read back with [`stamp_of`]): the benchmark's emit time |
//! | `slow:<ms>` | from now on waits `ms` before each delta |
//! | `wait:<ms>` | waits `ms` |
//! | `tool:<name> [json]` | a `ToolCall` (`input` = the JSON, default `{}`), then its `ToolResult` `"result of <name>"` |
//! | `tool_error:<name>` | the same with `is_error` and output `"<name> failed"` |
//! | `call:<name> [json]` | a `ToolCall` only: its result never comes (a turn stopped, failed or crashed mid-tool) |
//! | `mcp:<tool> [json]` | calls `<tool>` through Coffer for real, as Claude Code would: starts the MCP server of the turn's Claude Code config (`agents_config::claude_mcp_json`: `coffer-mcp-shim` with the agent token and the conversation), `initialize`s as `scripted-agent 1`, `tools/call`s, and reports a `ToolCall` and a `ToolResult` with the result's text (or the error) |
//! | `session` | says `session=<id>` (the session the turn resumed, or `new`) |
//! | `fail:<kind> [message]` | ends with `Failed` (`provider`, `auth`, `protocol`, `cli_exited`, `cli_missing`, `internal`) |
//! | `APPROVE[<Tool>: <text>]` | asks for approval (`ApprovalRequested`: tool `<Tool>`, input `{"command": text}` for Bash/shell, `{"file_path": text}` for Edit/Write, else `{"text": text}`), waits for the answer, then says `approved` or `denied: <message>` (each with a newline; the engine decides by the conversation's mode: `read_only` denies at once) |
//! | `hang` | sends nothing more until interrupted |
//! | `exit` | ends the task without a terminal event (as a CLI that dies mid-turn) |
//! | `write:<path> <text>` | writes `<text>` (`\n` becomes a newline) to `<path>` in the conversation's folder (folders created) |
//! | `rm:<path>` | removes the file `<path>` in the conversation's folder |
//! | `mv:<from> <to>` | renames a file in the conversation's folder |
//!
//! Every turn first reports `Session` (the config's `session_id`, or `scripted-<turn id>` for a
//! new one) and, unless a command ended it, finishes with `Done { stop_reason: "end_turn" }`,
//! usage = (input bytes / 4, deltas sent), model = the config's model or `scripted-model`. An
//! interrupt during any wait ends the turn with `Done { stop_reason: "interrupted" }`. The agent
//! `scripted_missing` is registered too and is never available (reason: "scripted_missing is
//! never available").
//!
//! ## Pause points
//!
//! `coffer-test-chat` installs [`pause_hook`] in its engine: at each [`Step`] (the windows a
//! crash or a store restart could hit: `take-pending`, `pending-taken`, `final-write`) it looks
//! for `COFFER_HOME/test-pause/<step>`. A test [`arm`]s a step (once: the file is taken when the
//! engine reaches it), waits with [`reached`] until the engine holds there (the answer is the
//! conversation's id), then kills a process or [`release`]s it. The shipped `coffer-chat` has no
//! hook.
//!
//! ## The harness
//!
//! ```no_run
//! # async fn t() -> anyhow::Result<()> {
//! use coffer_tests::{TestHome, chat};
//! let home = TestHome::new()?;
//! let api = chat::start_daemon(&home).await?;     // coffer-test-daemon scripted-chat
//! let mut c = chat::client(&api).await?;          // ChatClient with the gateway's identity
//! let conv = chat::create(&mut c).await?;         // a `scripted` conversation in the workspace
//! let mut w = chat::watch(&mut c, &conv.id, 0).await?;
//! chat::send(&mut c, &conv.id, "say:hello world").await?;
//! let turn = w.turn().await?;                      // events up to turn_done / turn_error
//! assert_eq!(chat::text(&turn), "hello world");
//! # Ok(()) }
//! ```
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use coffer_chat::adapter::{
    APPROVAL_CHANNEL, AgentConfig, AgentEnv, AgentEvent, AgentProvider, ApprovalAnswer, ApprovalRequest, Availability,
    ConfigError, FailureKind, RunningTurn, StartError, TurnInput, Usage,
};
use coffer_chat::providers::{self, Entry};
use coffer_proto::chat::chat_client::ChatClient;
use coffer_proto::chat::{self as c, event::Kind};
use coffer_runtime::grpc::AuthChannel;
use secrecy::SecretString;
use tokio::sync::{mpsc, oneshot};

use crate::{Api, SendExt, TestHome, procs};
pub use coffer_chat::engine::Step;

/// The scripted agent's key.
pub const SCRIPTED: &str = "scripted";
/// The never-available agent's key.
pub const SCRIPTED_MISSING: &str = "scripted_missing";
/// How long a test waits for one event by default.
pub const EVENT_TIMEOUT: Duration = Duration::from_secs(20);

/// The registry `coffer-test-chat` runs: Coffer's agents plus the two scripted ones.
pub fn registry() -> Vec<Entry> {
    let mut r = providers::builtin();
    r.push(Entry::new(Arc::new(Scripted)));
    r.push(Entry::new(Arc::new(ScriptedMissing)));
    r
}

/// The test-only agent whose turns follow the script in the message (module docs).
#[derive(Debug, Default)]
pub struct Scripted;

/// A registered agent that is never available.
#[derive(Debug, Default)]
pub struct ScriptedMissing;

impl AgentProvider for ScriptedMissing {
    fn key(&self) -> &'static str {
        SCRIPTED_MISSING
    }
    fn display_name(&self) -> &'static str {
        "Scripted (missing)"
    }
    fn availability(&self, _env: &AgentEnv) -> Availability {
        Availability::Unavailable { reason: "scripted_missing is never available".into() }
    }
    fn validate_config(&self, _config: &mut AgentConfig) -> Result<(), ConfigError> {
        Ok(())
    }
    fn start_turn(
        &self,
        _env: &AgentEnv,
        _turn: TurnInput,
        _events: mpsc::Sender<AgentEvent>,
    ) -> Result<RunningTurn, StartError> {
        Err(StartError { kind: FailureKind::CliMissing, message: "scripted_missing is never available".into() })
    }
}

impl AgentProvider for Scripted {
    fn key(&self) -> &'static str {
        SCRIPTED
    }
    fn display_name(&self) -> &'static str {
        "Scripted (tests)"
    }
    fn availability(&self, _env: &AgentEnv) -> Availability {
        Availability::Available { command: "scripted".into(), version: Some("1".into()) }
    }
    fn validate_config(&self, config: &mut AgentConfig) -> Result<(), ConfigError> {
        if config.model.contains('\n') {
            return Err(ConfigError { field: "model", problem: "one line".into() });
        }
        Ok(())
    }
    fn start_turn(
        &self,
        env: &AgentEnv,
        turn: TurnInput,
        events: mpsc::Sender<AgentEvent>,
    ) -> Result<RunningTurn, StartError> {
        let (interrupt, rx) = oneshot::channel();
        let (approvals, answers) = mpsc::channel(APPROVAL_CHANNEL);
        let mcp = coffer_chat::agents_config::claude_mcp_json(&env.shim, &env.coffer_home, &turn.conversation_id);
        let task = tokio::spawn(run_script(turn, events, rx, answers, mcp));
        Ok(RunningTurn { interrupt, task, approvals: Some(approvals) })
    }
}

/// Calls `tool` with `arguments` through the MCP server of `config` (a Claude Code MCP config,
/// JSON text: its `coffer` entry's command and environment), as a managed agent does: one stdio
/// session (`initialize` as `scripted-agent 1`, `notifications/initialized`, `tools/call`),
/// then the server is ended. Returns the result's text (its text blocks joined) and whether it
/// is an error (`isError`, or a JSON-RPC error's message).
///
/// # Errors
/// When the server cannot be started or does not answer within 30 s.
async fn call_through_coffer(config: &str, tool: &str, arguments: serde_json::Value) -> anyhow::Result<(String, bool)> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let cfg: serde_json::Value = serde_json::from_str(config).context("the MCP config")?;
    let entry = &cfg["mcpServers"]["coffer"];
    let program = entry["command"].as_str().context("the entry's command")?;
    let mut spec = coffer_runtime::spawn::SpawnSpec::new(program, "agent", "scripted-mcp");
    spec.env = entry["env"]
        .as_object()
        .context("the entry's env")?
        .iter()
        .map(|(k, v)| (k.into(), v.as_str().unwrap_or_default().into()))
        .collect();
    spec.stdin = std::process::Stdio::piped();
    spec.stdout = std::process::Stdio::piped();
    let mut child = coffer_runtime::spawn::spawn(spec)?;
    let mut stdin = child.inner().stdin.take().context("stdin")?;
    let stdout = child.inner().stdout.take().context("stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let talk = async {
        let init = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "scripted-agent", "version": "1"}}});
        stdin.write_all(format!("{init}\n").as_bytes()).await?;
        answer(&mut lines, 1).await?;
        let call = serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": tool, "arguments": arguments}});
        stdin
            .write_all(
                format!("{}\n{call}\n", serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
                    .as_bytes(),
            )
            .await?;
        let v = answer(&mut lines, 2).await?;
        if let Some(e) = v.get("error") {
            return Ok((e["message"].as_str().unwrap_or("error").to_owned(), true));
        }
        let text = v["result"]["content"]
            .as_array()
            .map(|blocks| blocks.iter().filter_map(|b| b["text"].as_str()).collect::<Vec<_>>().join("\n"))
            .unwrap_or_default();
        Ok((text, v["result"]["isError"] == true))
    };
    let out = tokio::time::timeout(Duration::from_secs(30), talk).await.context("no answer within 30 s")?;
    drop(stdin);
    child.terminate(Duration::from_secs(2)).await;
    out
}

/// The answer to request `id` among the lines an MCP server writes (other lines skipped).
async fn answer<R: tokio::io::AsyncBufRead + Unpin>(
    lines: &mut tokio::io::Lines<R>,
    id: u64,
) -> anyhow::Result<serde_json::Value> {
    while let Some(line) = lines.next_line().await? {
        let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
        if v["id"] == id {
            return Ok(v);
        }
    }
    bail!("the MCP server closed its output before answering request {id}")
}

/// How a wait inside a script ended.
enum Waited {
    Elapsed,
    Interrupted,
    /// Nobody listens any more.
    Gone,
}

async fn wait(ms: u64, interrupt: &mut oneshot::Receiver<()>, events: &mpsc::Sender<AgentEvent>) -> Waited {
    tokio::select! {
        r = &mut *interrupt => if r.is_ok() { Waited::Interrupted } else { Waited::Gone },
        () = events.closed() => Waited::Gone,
        () = tokio::time::sleep(Duration::from_millis(ms)) => Waited::Elapsed,
    }
}

fn failure_kind(word: &str) -> FailureKind {
    match word {
        "auth" => FailureKind::Auth,
        "protocol" => FailureKind::Protocol,
        "cli_exited" => FailureKind::CliExited,
        "cli_missing" => FailureKind::CliMissing,
        "internal" => FailureKind::Internal,
        _ => FailureKind::Provider,
    }
}

/// The request of an `APPROVE[<Tool>: <text>]` line, if it is one.
pub fn approve_directive(line: &str, n: u64) -> Option<ApprovalRequest> {
    let inner = line.strip_prefix("APPROVE[")?.strip_suffix(']')?;
    let (tool, text) = inner.split_once(':').unwrap_or((inner, ""));
    let (tool, text) = (tool.trim(), text.trim());
    let input = match tool {
        "Bash" | "shell" => serde_json::json!({ "command": text }),
        "Edit" | "Write" | "MultiEdit" => serde_json::json!({ "file_path": text }),
        _ => serde_json::json!({ "text": text }),
    };
    Some(ApprovalRequest { request_id: format!("approve-{n}"), tool: tool.to_owned(), input, diff: None, cwd: None })
}

async fn run_script(
    turn: TurnInput,
    events: mpsc::Sender<AgentEvent>,
    mut interrupt: oneshot::Receiver<()>,
    mut answers: mpsc::Receiver<ApprovalAnswer>,
    mcp: String,
) {
    let model = if turn.config.model.is_empty() { "scripted-model".to_owned() } else { turn.config.model.clone() };
    let resumed = turn.config.session_id.clone();
    let session = if resumed.is_empty() { format!("scripted-{}", turn.turn_id) } else { resumed.clone() };
    let mut sent = 0u64;
    let mut slow = 0u64;
    let interrupted = |sent: u64| AgentEvent::Done {
        stop_reason: "interrupted".into(),
        usage: Usage { output_tokens: sent, ..Usage::default() },
        model: Some(model.clone()),
    };
    macro_rules! send {
        ($ev:expr) => {
            if events.send($ev).await.is_err() {
                return;
            }
        };
    }
    macro_rules! pause {
        ($ms:expr) => {
            match wait($ms, &mut interrupt, &events).await {
                Waited::Elapsed => {}
                Waited::Interrupted => {
                    let _ = events.send(interrupted(sent)).await;
                    return;
                }
                Waited::Gone => return,
            }
        };
    }
    send!(AgentEvent::Session { session_id: session, model: Some(model.clone()) });
    for line in turn.text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if let Some(req) = approve_directive(line, sent) {
            let id = req.request_id.clone();
            send!(AgentEvent::ApprovalRequested(Box::new(req)));
            let answer = loop {
                tokio::select! {
                    a = answers.recv() => match a {
                        Some(a) if a.request_id == id => break a,
                        Some(_) => continue,
                        None => return,
                    },
                    r = &mut interrupt => {
                        if r.is_ok() {
                            let _ = events.send(interrupted(sent)).await;
                        }
                        return;
                    }
                    () = events.closed() => return,
                }
            };
            let said = if answer.allow { "approved\n".to_owned() } else { format!("denied: {}\n", answer.message) };
            send!(AgentEvent::TextDelta(said));
            sent += 1;
            continue;
        }
        let (cmd, arg) = line.split_once(':').unwrap_or((line, ""));
        let words: Vec<String> = match cmd {
            "say" => split_words(arg),
            "deltas" => (0..arg.trim().parse::<u64>().unwrap_or(0)).map(|i| format!("w{i} ")).collect(),
            "big" => big_text(arg.trim().parse().unwrap_or(0)),
            "nl" => vec!["\n".to_owned()],
            "stamped" => {
                for _ in 0..arg.trim().parse::<u64>().unwrap_or(0) {
                    if slow > 0 {
                        pause!(slow);
                    }
                    // Stamped as late as possible: the time the adapter hands the delta over.
                    send!(AgentEvent::TextDelta(format!("t{} ", unix_micros())));
                    sent += 1;
                }
                continue;
            }
            "session" => vec![format!("session={}", if resumed.is_empty() { "new" } else { &resumed })],
            "slow" => {
                slow = arg.trim().parse().unwrap_or(0);
                continue;
            }
            "wait" => {
                pause!(arg.trim().parse().unwrap_or(0));
                continue;
            }
            "tool" | "tool_error" => {
                let (name, input) = arg.split_once(' ').unwrap_or((arg, "{}"));
                let input = serde_json::from_str(input).unwrap_or(serde_json::json!({ "raw": input }));
                let id = format!("toolu_{sent}");
                send!(AgentEvent::ToolCall { id: id.clone(), name: name.to_owned(), input });
                let is_error = cmd == "tool_error";
                let output = if is_error { format!("{name} failed") } else { format!("result of {name}") };
                send!(AgentEvent::ToolResult { tool_use_id: id, output, is_error });
                sent += 1;
                continue;
            }
            "call" => {
                let (name, input) = arg.split_once(' ').unwrap_or((arg, "{}"));
                let input = serde_json::from_str(input).unwrap_or(serde_json::json!({ "raw": input }));
                send!(AgentEvent::ToolCall { id: format!("toolu_{sent}"), name: name.to_owned(), input });
                sent += 1;
                continue;
            }
            "mcp" => {
                let (name, input) = arg.split_once(' ').unwrap_or((arg, "{}"));
                let input: serde_json::Value =
                    serde_json::from_str(input).unwrap_or(serde_json::json!({ "raw": input }));
                let id = format!("toolu_{sent}");
                send!(AgentEvent::ToolCall { id: id.clone(), name: name.to_owned(), input: input.clone() });
                let (output, is_error) = match call_through_coffer(&mcp, name, input).await {
                    Ok(r) => r,
                    Err(e) => (format!("{e:#}"), true),
                };
                send!(AgentEvent::ToolResult { tool_use_id: id, output, is_error });
                sent += 1;
                continue;
            }
            "fail" => {
                let (kind, message) = arg.split_once(' ').unwrap_or((arg, "scripted failure"));
                send!(AgentEvent::Failed { kind: failure_kind(kind), message: message.to_owned() });
                return;
            }
            "hang" => {
                pause!(u64::MAX / 4);
                continue;
            }
            "exit" => return,
            "write" | "rm" | "mv" => {
                let cwd = std::path::Path::new(&turn.config.cwd);
                let (a, b) = arg.split_once(' ').unwrap_or((arg, ""));
                let done = match cmd {
                    "write" => {
                        let p = cwd.join(a);
                        p.parent()
                            .map_or(Ok(()), std::fs::create_dir_all)
                            .and_then(|()| std::fs::write(&p, b.replace("\\n", "\n")))
                    }
                    "rm" => std::fs::remove_file(cwd.join(a)),
                    _ => std::fs::rename(cwd.join(a), cwd.join(b)),
                };
                if let Err(e) = done {
                    send!(AgentEvent::TextDelta(format!("{cmd} failed: {e} ")));
                }
                continue;
            }
            _ => split_words(line),
        };
        for w in words {
            if slow > 0 {
                pause!(slow);
            }
            send!(AgentEvent::TextDelta(w));
            sent += 1;
        }
    }
    let _ = events
        .send(AgentEvent::Done {
            stop_reason: "end_turn".into(),
            usage: Usage { input_tokens: turn.text.len() as u64 / 4, output_tokens: sent, ..Usage::default() },
            model: Some(model),
        })
        .await;
}

/// Bytes per delta of `big:<bytes>`.
pub const BIG_DELTA: usize = 64 << 10;

/// `bytes` of numbered text lines, cut into deltas of [`BIG_DELTA`] bytes (ASCII: every cut is
/// a character boundary).
fn big_text(bytes: usize) -> Vec<String> {
    let mut text = String::with_capacity(bytes + 64);
    let mut n = 0;
    while text.len() < bytes {
        n += 1;
        text.push_str(&format!("line {n} of a long reply, with some words to make it wrap\n"));
    }
    text.truncate(bytes);
    text.as_bytes().chunks(BIG_DELTA).map(|c| String::from_utf8_lossy(c).into_owned()).collect()
}

/// Now as Unix microseconds (the wall clock, shared by every process on the machine).
pub fn unix_micros() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
}

/// The emit time (Unix µs) a `stamped:<n>` delta carries (`t<µs> `); `None` for any other text.
pub fn stamp_of(text: &str) -> Option<u64> {
    text.strip_prefix('t')?.strip_suffix(' ')?.parse().ok()
}

/// `"a b  c"` → `["a ", "b  ", "c"]`: each word with the whitespace after it, so the deltas
/// concatenate to the text.
fn split_words(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for ch in text.chars() {
        if !ch.is_whitespace() && cur.ends_with(char::is_whitespace) {
            out.push(std::mem::take(&mut cur));
        }
        cur.push(ch);
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

// ---- pause points ----

/// How long the engine is held at a pause point before it goes on by itself (a test that
/// forgot to release it must not hang the service forever).
const HOLD_AT_MOST: Duration = Duration::from_secs(60);
/// How often a held engine looks for its release.
const HOLD_POLL: Duration = Duration::from_millis(10);

fn pause_dir(home: &std::path::Path) -> std::path::PathBuf {
    home.join("test-pause")
}

/// The engine's [`Step`] hook of `coffer-test-chat` (module docs): holds the engine at an armed
/// step until [`release`]d, the process is killed, or [`HOLD_AT_MOST`] passed.
pub fn tuning() -> coffer_chat::engine::Tuning {
    coffer_chat::engine::Tuning { pause: Some(Arc::new(pause_hook)), ..Default::default() }
}

/// One call of the hook: `step` reached in conversation `conv`.
pub fn pause_hook(step: Step, conv: String) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
    Box::pin(async move {
        let Some(home) = std::env::var_os(coffer_runtime::env::HOME) else { return };
        let dir = pause_dir(std::path::Path::new(&home));
        let armed = dir.join(step.as_str());
        // Taking the arming file makes each arming hold the engine once (a restarted service
        // does not stop there again).
        if std::fs::remove_file(&armed).is_err() {
            return;
        }
        let go = dir.join(format!("{}.go", step.as_str()));
        let reached = dir.join(format!("{}.reached", step.as_str()));
        if std::fs::write(&reached, &conv).is_err() {
            return;
        }
        let deadline = tokio::time::Instant::now() + HOLD_AT_MOST;
        while std::fs::remove_file(&go).is_err() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(HOLD_POLL).await;
        }
        let _ = std::fs::remove_file(&reached);
    })
}

/// Arms `step`: the next time the chat service of `home` reaches it, it holds there.
///
/// # Errors
/// When the file cannot be written.
pub fn arm(home: &TestHome, step: Step) -> anyhow::Result<()> {
    let dir = pause_dir(home.root());
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join(step.as_str()), "")?;
    Ok(())
}

/// Waits until the engine holds at `step`; the conversation's id.
///
/// # Errors
/// When it does not within `timeout`.
pub async fn reached(home: &TestHome, step: Step, timeout: Duration) -> anyhow::Result<String> {
    let path = pause_dir(home.root()).join(format!("{}.reached", step.as_str()));
    crate::wait_for(&format!("the chat engine to hold at {}", step.as_str()), timeout, || {
        let path = path.clone();
        async move { Ok(std::fs::read_to_string(&path).ok().filter(|c| !c.is_empty())) }
    })
    .await
}

/// Lets an engine held at `step` go on (a killed one never reads it; [`arm`] again for the
/// next hold).
///
/// # Errors
/// When the file cannot be written.
pub fn release(home: &TestHome, step: Step) -> anyhow::Result<()> {
    let dir = pause_dir(home.root());
    let _ = std::fs::remove_file(dir.join(format!("{}.reached", step.as_str())));
    std::fs::write(dir.join(format!("{}.go", step.as_str())), "")?;
    Ok(())
}

// ---- the harness ----

/// A Chat client presenting the gateway's identity (as the edge calls it).
pub type Client = ChatClient<AuthChannel>;

/// Starts `coffer-test-daemon scripted-chat` on `home` (the chat service is `coffer-test-chat`)
/// and waits until it is ready.
///
/// # Errors
/// As [`TestHome::start_daemon`]; when `coffer-test-chat` is not built (naming the build command).
pub async fn start_daemon(home: &TestHome) -> anyhow::Result<Api> {
    crate::bin("coffer-test-chat")?;
    home.start_daemon_args("coffer-test-daemon", &["scripted-chat"]).await
}

/// A Chat client for the daemon behind `api`: the gateway's internal token and the chat
/// service's address, read from the gateway's environment in `/proc`. Messages up to 64 MiB.
///
/// # Errors
/// When the gateway's environment cannot be read.
pub async fn client(api: &Api) -> anyhow::Result<Client> {
    let pid = api.service("gateway").await?["pid"].as_i64().context("gateway pid")? as i32;
    let env = procs::environ(pid);
    ensure!(!env.is_empty(), "cannot read the gateway's environment (pid {pid})");
    let token = SecretString::from(env.get("COFFER_INTERNAL_TOKEN").context("COFFER_INTERNAL_TOKEN")?.clone());
    let addr = env.get("COFFER_CHAT_ADDR").context("COFFER_CHAT_ADDR")?;
    Ok(ChatClient::new(coffer_runtime::grpc::channel(addr, &token)?)
        .max_decoding_message_size(64 << 20)
        .max_encoding_message_size(64 << 20))
}

/// Creates a `scripted` conversation in the default workspace.
///
/// # Errors
/// When the service refuses.
pub async fn create(c: &mut Client) -> anyhow::Result<c::Conversation> {
    Ok(c.create_conversation(c::CreateConversationRequest { agent_key: SCRIPTED.into(), ..Default::default() })
        .await?
        .into_inner())
}

/// Sends `text` (source `api`).
///
/// # Errors
/// When the service refuses.
pub async fn send(c: &mut Client, id: &str, text: &str) -> anyhow::Result<c::SendMessageReply> {
    let req = c::SendMessageRequest {
        conversation_id: id.into(),
        text: text.into(),
        source: "api".into(),
        ..Default::default()
    };
    Ok(c.send_message(req).await?.into_inner())
}

/// The conversation with its newest 100 messages.
///
/// # Errors
/// When the service refuses.
pub async fn get(c: &mut Client, id: &str) -> anyhow::Result<c::ConversationView> {
    Ok(c.get_conversation(c::GetConversationRequest { id: id.into(), message_limit: 0 }).await?.into_inner())
}

/// `POST /v1/conversations` with the scripted agent; the conversation's JSON.
///
/// # Errors
/// On a transport error or a status other than 201.
pub async fn rest_create(api: &Api) -> anyhow::Result<serde_json::Value> {
    let r = api.post_json("/v1/conversations", &serde_json::json!({"agent_key": SCRIPTED})).reply().await?;
    ensure!(r.status == 201, "create: {} {}", r.status, r.text);
    r.json()
}

/// `POST /v1/conversations/{id}/messages` with `text`; the reply's JSON (`{message, queue}` or
/// `{pending, queue}`).
///
/// # Errors
/// On a transport error or a status other than 202.
pub async fn rest_send(api: &Api, id: &str, text: &str) -> anyhow::Result<serde_json::Value> {
    let body = serde_json::json!({"text": text});
    let r = api.post_json(&format!("/v1/conversations/{id}/messages"), &body).reply().await?;
    ensure!(r.status == 202, "send: {} {}", r.status, r.text);
    r.json()
}

/// A subscription to a conversation's events.
pub struct Watch {
    stream: tonic::Streaming<c::Event>,
}

/// Subscribes with `after_seq`.
///
/// # Errors
/// When the service refuses.
pub async fn watch(c: &mut Client, id: &str, after_seq: u64) -> anyhow::Result<Watch> {
    let stream = c.subscribe(c::SubscribeRequest { conversation_id: id.into(), after_seq }).await?.into_inner();
    Ok(Watch { stream })
}

impl Watch {
    /// The next event within [`EVENT_TIMEOUT`]; `None` when the stream ended.
    ///
    /// # Errors
    /// On a timeout or a stream error.
    pub async fn next(&mut self) -> anyhow::Result<Option<c::Event>> {
        self.next_within(EVENT_TIMEOUT).await
    }

    /// The next event within `timeout`.
    ///
    /// # Errors
    /// On a timeout or a stream error.
    pub async fn next_within(&mut self, timeout: Duration) -> anyhow::Result<Option<c::Event>> {
        match tokio::time::timeout(timeout, self.stream.message()).await {
            Err(_) => bail!("no chat event within {timeout:?}"),
            Ok(r) => Ok(r?),
        }
    }

    /// Events until (and including) the first one `stop` accepts.
    ///
    /// # Errors
    /// When the stream ends first or an event takes longer than `timeout`.
    pub async fn until(
        &mut self,
        timeout: Duration,
        mut stop: impl FnMut(&c::Event) -> bool,
    ) -> anyhow::Result<Vec<c::Event>> {
        let mut out = Vec::new();
        loop {
            let Some(e) = self.next_within(timeout).await? else {
                bail!("the event stream ended after {:?}", out.iter().map(kind).collect::<Vec<_>>());
            };
            let done = stop(&e);
            out.push(e);
            if done {
                return Ok(out);
            }
        }
    }

    /// Events until the next `turn_done` or `turn_error` (included).
    ///
    /// # Errors
    /// As [`Watch::until`].
    pub async fn turn(&mut self) -> anyhow::Result<Vec<c::Event>> {
        self.until(EVENT_TIMEOUT, is_turn_end).await
    }

    /// Events until the first of kind `name` (included).
    ///
    /// # Errors
    /// As [`Watch::until`].
    pub async fn until_kind(&mut self, name: &str) -> anyhow::Result<Vec<c::Event>> {
        self.until(EVENT_TIMEOUT, |e| kind(e) == name).await
    }
}

/// The event's kind as its proto field name (`text_delta`, `turn_done`, …).
pub fn kind(e: &c::Event) -> &'static str {
    match &e.kind {
        Some(Kind::MessageCreated(_)) => "message_created",
        Some(Kind::TurnStarted(_)) => "turn_started",
        Some(Kind::TextDelta(_)) => "text_delta",
        Some(Kind::ToolCall(_)) => "tool_call",
        Some(Kind::ToolResult(_)) => "tool_result",
        Some(Kind::TurnDone(_)) => "turn_done",
        Some(Kind::TurnError(_)) => "turn_error",
        Some(Kind::QueueChanged(_)) => "queue_changed",
        Some(Kind::Reset(_)) => "reset",
        Some(Kind::ApprovalRequested(_)) => "approval_requested",
        Some(Kind::ApprovalResolved(_)) => "approval_resolved",
        Some(Kind::FilesChanged(_)) => "files_changed",
        None => "none",
    }
}

/// Whether the event ends a turn.
pub fn is_turn_end(e: &c::Event) -> bool {
    matches!(e.kind, Some(Kind::TurnDone(_) | Kind::TurnError(_)))
}

/// The kinds of `events`, in order.
pub fn kinds(events: &[c::Event]) -> Vec<&'static str> {
    events.iter().map(kind).collect()
}

/// The text the `text_delta`s of `events` stream.
pub fn text(events: &[c::Event]) -> String {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            Some(Kind::TextDelta(d)) => Some(d.text.as_str()),
            _ => None,
        })
        .collect()
}

/// A message's text blocks joined.
pub fn message_text(m: &c::Message) -> String {
    m.blocks
        .iter()
        .filter_map(|b| match &b.block {
            Some(c::content_block::Block::Text(t)) => Some(t.as_str()),
            _ => None,
        })
        .collect()
}

/// The user message texts of `events`' `message_created`s, in order.
pub fn created_texts(events: &[c::Event]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            Some(Kind::MessageCreated(m)) => m.message.as_ref().map(message_text),
            _ => None,
        })
        .collect()
}

/// Sets `home` up for the real Claude Code CLI against a fake Anthropic API at `anthropic_url`:
/// every `ANTHROPIC_*`, `CLAUDE*`, `OPENAI_*`, `CODEX_*` and `MCP_*` variable of the machine is
/// unset (nothing of the machine's own agent set-up leaks in), Claude Code's offline variables
/// are set (its config dir in the home's `HOME`, no telemetry, updates or retries), and
/// `COFFER_PASS_ENV` names them, so a daemon started by the CLI keeps them for its agents.
/// Returns the names passed, for a caller that adds more to `COFFER_PASS_ENV`.
pub fn offline_claude_code(home: &mut TestHome, anthropic_url: &str) -> Vec<&'static str> {
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        if ["ANTHROPIC_", "CLAUDE", "OPENAI_", "CODEX_", "MCP_"].iter().any(|p| k.starts_with(p)) {
            home.unset_env(&k);
        }
    }
    let user_home = std::path::PathBuf::from(&home.env()["HOME"]);
    let vars = [
        ("CLAUDE_CONFIG_DIR", user_home.join(".claude").display().to_string()),
        ("ANTHROPIC_BASE_URL", anthropic_url.to_owned()),
        ("ANTHROPIC_API_KEY", "sk-ant-test-not-a-real-key".to_owned()),
        ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1".to_owned()),
        ("DISABLE_TELEMETRY", "1".to_owned()),
        ("DISABLE_AUTOUPDATER", "1".to_owned()),
        ("DISABLE_ERROR_REPORTING", "1".to_owned()),
        ("CLAUDE_CODE_MAX_RETRIES", "0".to_owned()),
    ];
    let names: Vec<&'static str> = vars.iter().map(|(k, _)| *k).collect();
    for (k, v) in vars {
        home.set_env(k, v);
    }
    home.set_env("COFFER_PASS_ENV", names.join(","));
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_keep_their_spacing() {
        assert_eq!(split_words("hello  big world"), ["hello  ", "big ", "world"]);
        assert_eq!(split_words("").len(), 0);
        assert_eq!(split_words("hello  big world").concat(), "hello  big world");
    }

    #[test]
    fn stamps_read_back_and_other_text_has_none() {
        let now = unix_micros();
        assert!(now > 1_700_000_000_000_000, "{now}");
        assert_eq!(stamp_of(&format!("t{now} ")), Some(now));
        for other in ["w0 ", "t12", "tx1 ", "hello ", "", "t "] {
            assert_eq!(stamp_of(other), None, "{other:?}");
        }
    }
}
