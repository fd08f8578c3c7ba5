//! The Claude Code adapter: `claude -p` speaking stream-json both ways, one process per turn or
//! kept for the conversation's next one.
//!
//! Command: `claude -p --input-format stream-json --output-format stream-json --verbose
//! --include-partial-messages --permission-mode bypassPermissions --mcp-config
//! COFFER_HOME/agents/claude_code/mcp.json [--resume SESSION] [--model MODEL]` (permission mode
//! `bypass`; in `ask` and `read_only`: `--permission-mode default --permission-prompt-tool
//! stdio`, see "Approvals" below) in the
//! conversation's `cwd`, through the spawn helper (own process group, pid record, no `COFFER_*`
//! variable; `IS_SANDBOX=1` when running as root, which `bypassPermissions` demands there). The
//! user's message is one stdin line; stdin stays open so that an interrupt can be sent as a
//! `control_request` (`subtype: interrupt`) and the next turn's message can follow. Attached
//! images ride in that line as `image` content blocks (base64 `source`) after the text.
//!
//! Process lifetime: a turn that ends normally leaves its process running, parked for the
//! conversation's next turn, which then only writes its message to the same stdin (Claude Code
//! takes one user message after another in stream-json mode). A parked process is reused only
//! for the same session, model and `cwd` and while it is alive and quiet; otherwise, and after an
//! interrupt, a failure or a protocol error, the next turn starts a fresh process with `--resume`
//! (which also covers a chat-service restart). At most [`kept::MAX_KEPT`] processes are parked
//! (the least recently used goes first), each for at most [`kept::KEEP_IDLE`]; [`AgentProvider::forget`]
//! ends a conversation's at once. Measured on the 2-core dev machine against the fake API
//! (`tests/e2e/chat_agents.rs`, `agent_start_up_cost_per_turn_against_a_kept_alive_process`): a
//! turn with a fresh `--resume` process ~2.3 s, the same turn on a parked process ~0.05 s.
//!
//! Approvals: in `--permission-mode default` the CLI allows read-only tools itself (Read, Glob,
//! Grep…) and asks for everything else over stdio: a `control_request` `can_use_tool` (tool
//! name, input, `tool_use_id`) becomes [`AgentEvent::ApprovalRequested`] (request id = the
//! control request's); the engine's answer goes back as a `control_response` `success` with
//! `{"behavior": "allow", "updatedInput": <the input>}` or `{"behavior": "deny", "message"}`
//! (the CLI hands the message to the model as the tool's error result). `read_only` uses the
//! same flags: the engine denies every request at once (Claude Code has no stricter mode that
//! still lets a turn run: `plan` ends the turn in a plan). Checked with the pinned 2.1.332 and
//! with 2.1.197 (`tests/e2e/chat_approvals.rs`). The mode is part of a parked process's fit.
//!
//! Provider switching ([`crate::binding`]): a turn of a Claude Code bound to an LLM connection
//! runs with `ANTHROPIC_BASE_URL`, `ANTHROPIC_API_KEY`, `ANTHROPIC_MODEL` and the fast-model
//! variables of that connection in the CLI's environment (and nothing else `ANTHROPIC_*` the
//! service inherited); `--model` from the conversation's `agent_config.model` still wins over
//! `ANTHROPIC_MODEL`. A parked process is reused only under the same binding (its fingerprint
//! is part of [`Fit`]), so a changed connection, key or model takes a fresh process.
//!
//! Mapping of stdout lines ([`Parser`]): `system/init` → [`AgentEvent::Session`];
//! `stream_event` `content_block_delta`/`text_delta` → [`AgentEvent::TextDelta`]; an `assistant`
//! message's text block whose message streamed no delta → one `TextDelta`; `assistant`
//! `tool_use` → [`AgentEvent::ToolCall`]; `user` `tool_result` → [`AgentEvent::ToolResult`];
//! `result` → [`AgentEvent::Done`] (usage, model, stop reason) or [`AgentEvent::Failed`]
//! (`api_error_status` 401/403 → `auth`, another status → `provider` "the Anthropic API answered
//! N"). Lines of subagents (`parent_tool_use_id` set) are not the turn's own and are skipped; the
//! CLI's own error notes (an `assistant` line with `error`) are not assistant text. A line that
//! is not a JSON object with a `type` is [`FailureKind::Protocol`]; stdout ending without a
//! `result` is [`FailureKind::CliExited`] with the exit status and the last stderr line.
use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::path::Path;

use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};

use crate::adapter::{
    APPROVAL_CHANNEL, AgentConfig, AgentEnv, AgentEvent, AgentProvider, ApprovalAnswer, ApprovalRequest, Availability,
    ConfigError, FailureKind, INTERRUPT_GRACE, PermissionMode, RunningTurn, StartError, TurnInput, Usage,
};
use crate::agent_process::{self, AgentProcess, EXIT_GRACE, ExtraEnv, Line, quote};
use crate::agents_config;
use crate::binding;
use crate::kept::{self, Fit, Kept};

const COMMAND: &str = "claude";
const PACKAGE: &str = "@anthropic-ai/claude-code";
const SETTING: &str = "chat.claude_code_path";
const AGENT: &str = "Claude Code";

/// The Claude Code provider (`agent_key` `claude_code`).
#[derive(Clone, Default)]
pub struct ClaudeCode {
    extra: ExtraEnv,
    kept: kept::Shared<()>,
}

impl std::fmt::Debug for ClaudeCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kept = self.kept.lock().map(|k| k.len()).unwrap_or(0);
        f.debug_struct("ClaudeCode").field("extra", &self.extra).field("kept", &kept).finish()
    }
}

impl ClaudeCode {
    /// The provider as the chat service registers it: the CLI gets the service's environment
    /// (minus every `COFFER_*`).
    pub fn new() -> Self {
        Self::default()
    }

    /// The provider with extra environment for every `claude` it starts, applied last (tests:
    /// `HOME`, `ANTHROPIC_BASE_URL`, `ANTHROPIC_API_KEY`, `CLAUDE_CODE_MAX_RETRIES`; also looked
    /// at for `PATH` when the CLI is resolved).
    pub fn with_env(env: impl IntoIterator<Item = (impl Into<OsString>, impl Into<OsString>)>) -> Self {
        Self { extra: ExtraEnv(env.into_iter().map(|(k, v)| (k.into(), v.into())).collect()), kept: Default::default() }
    }

    /// The pid of the process parked for `conversation_id`, if any (for tests and status).
    pub fn parked_pid(&self, conversation_id: &str) -> Option<i32> {
        self.kept.lock().unwrap_or_else(|e| e.into_inner()).pid(conversation_id)
    }

    /// The CLI's whole environment: the service's (minus `COFFER_*`), `own` over it, the extra
    /// environment last. When `bound`, every inherited variable that would fight the binding
    /// ([`binding::fights_claude_binding`]: the user's `ANTHROPIC_*`, a Bedrock/Vertex switch, an
    /// OAuth token) is dropped, so only the binding's own values remain.
    pub fn process_env(&self, own: &[(&str, OsString)], bound: bool) -> Vec<(OsString, OsString)> {
        let own_refs: Vec<(&str, &std::ffi::OsStr)> = own.iter().map(|(k, v)| (*k, v.as_os_str())).collect();
        let mut env = self.extra.build(&own_refs);
        if bound {
            drop_fighting(&mut env, own, &self.extra);
        }
        env
    }
}

impl AgentProvider for ClaudeCode {
    fn key(&self) -> &'static str {
        "claude_code"
    }

    fn display_name(&self) -> &'static str {
        AGENT
    }

    fn availability(&self, env: &AgentEnv) -> Availability {
        agent_process::availability(env, &self.extra, COMMAND, PACKAGE, SETTING)
    }

    fn validate_config(&self, config: &mut AgentConfig) -> Result<(), ConfigError> {
        validate_model(config)
    }

    fn start_turn(
        &self,
        env: &AgentEnv,
        turn: TurnInput,
        events: mpsc::Sender<AgentEvent>,
    ) -> Result<RunningTurn, StartError> {
        let program = agent_process::resolve(env, &self.extra, COMMAND, PACKAGE, SETTING)
            .map_err(|message| StartError { kind: FailureKind::CliMissing, message })?;
        let mcp = agents_config::claude_mcp_config(&env.agents_dir, &env.shim, &env.coffer_home)
            .map_err(|e| StartError { kind: FailureKind::Internal, message: e.to_string() })?;
        let mut args: Vec<OsString> = [
            "-p",
            "--input-format",
            "stream-json",
            "--output-format",
            "stream-json",
            "--verbose",
            "--include-partial-messages",
        ]
        .map(OsString::from)
        .to_vec();
        args.extend(permission_args(turn.config.permission_mode).iter().map(OsString::from));
        // The file (agents/claude_code/mcp.json) is what a person inspects; the turn passes the same
        // entry inline with its conversation in the shim's environment (a kept process serves one
        // conversation only).
        drop(mcp);
        args.push("--mcp-config".into());
        args.push(agents_config::claude_mcp_json(&env.shim, &env.coffer_home, &turn.conversation_id).into());
        if !turn.config.session_id.is_empty() {
            args.extend(["--resume".into(), turn.config.session_id.clone().into()]);
        }
        if !turn.config.model.is_empty() {
            args.extend(["--model".into(), turn.config.model.clone().into()]);
        }
        let bound = match &env.binding {
            Some(b) => Some(
                binding::claude_env(b)
                    .map_err(|e| StartError { kind: FailureKind::Provider, message: e.to_string() })?,
            ),
            None => None,
        };
        let root = running_as_root();
        let mut own: Vec<(&str, OsString)> = if root { vec![("IS_SANDBOX", OsString::from("1"))] } else { Vec::new() };
        own.extend(bound.iter().flatten().cloned());
        let fit = Fit {
            program: program.clone(),
            session_id: turn.config.session_id.clone(),
            model: turn.config.model.clone(),
            cwd: turn.config.cwd.clone(),
            binding: binding::fingerprint(env.binding.as_ref()),
            sandbox: env.sandbox,
            mode: turn.config.permission_mode,
        };
        let reused = self.kept.lock().unwrap_or_else(|e| e.into_inner()).take(&turn.conversation_id, &fit);
        let mut process = match reused {
            Some((process, ())) => process,
            None => {
                let proc_env = self.process_env(&own, bound.is_some());
                let cwd = Path::new(&turn.config.cwd);
                // Reads its MCP config (agents/claude_code/mcp.json), nothing else of agents/.
                let sandbox = env.sandbox(cwd).map(|s| s.allow_read(env.agents_dir.join("claude_code")));
                AgentProcess::spawn(AGENT, env, &program, args, proc_env, cwd, sandbox)?
            }
        };
        let (interrupt, interrupted) = oneshot::channel();
        let (approvals, mut answers) = mpsc::channel(APPROVAL_CHANNEL);
        let kept = self.kept.clone();
        let task = tokio::spawn(async move {
            let line = user_line_with(&turn.text, &turn.attachments);
            let Outcome { terminal, reusable, session_id } =
                run(&mut process, &line, interrupted, &events, &mut answers).await;
            // Parked before the terminal event goes out: the engine may start the next turn on it.
            if let (true, Some(session_id)) = (reusable, session_id) {
                Kept::park(&kept, &turn.conversation_id, process, Fit { session_id, ..fit }, ());
            } else if reusable {
                process.finish(EXIT_GRACE).await;
            }
            if let Some(event) = terminal {
                let _ = events.send(event).await;
            }
        });
        Ok(RunningTurn { interrupt, task, approvals: Some(approvals) })
    }

    fn forget(&self, _env: &AgentEnv, conversation_id: &str) {
        // Dropping the process ends its group (SIGKILL; it is idle, its session is on disk).
        self.kept.lock().unwrap_or_else(|e| e.into_inner()).forget(conversation_id);
    }
}

/// The permission flags of a mode (module docs).
pub fn permission_args(mode: PermissionMode) -> &'static [&'static str] {
    match mode {
        PermissionMode::Bypass => &["--permission-mode", "bypassPermissions"],
        PermissionMode::Ask | PermissionMode::ReadOnly => {
            &["--permission-mode", "default", "--permission-prompt-tool", "stdio"]
        }
    }
}

/// The stdin line answering a `can_use_tool` request: allow with the tool's `input` unchanged,
/// or deny with `message` (told to the model).
pub fn permission_line(request_id: &str, allow: bool, input: &Value, message: &str) -> String {
    let response = if allow {
        json!({"behavior": "allow", "updatedInput": input})
    } else {
        json!({"behavior": "deny", "message": message})
    };
    json!({"type": "control_response", "response": {"subtype": "success", "request_id": request_id, "response": response}})
        .to_string()
}

/// Drops from `env` every variable that would fight a binding unless the adapter (`own`) or the
/// extra environment set it.
fn drop_fighting(env: &mut Vec<(OsString, OsString)>, own: &[(&str, OsString)], extra: &ExtraEnv) {
    let ours = |k: &OsString| own.iter().any(|(o, _)| k == o) || extra.0.iter().any(|(e, _)| e == k);
    env.retain(|(k, _)| !binding::fights_claude_binding(&k.to_string_lossy()) || ours(k));
}

/// Whether this process runs as root (the owner of `/proc/self` is the effective uid; off Linux
/// the answer is no, and Claude Code says itself what it refuses).
fn running_as_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// A model name is passed through unvalidated; only one that could be taken for an option is
/// refused.
fn validate_model(config: &AgentConfig) -> Result<(), ConfigError> {
    if config.model.starts_with('-') || config.model.contains(['\n', '\0']) {
        return Err(ConfigError {
            field: "model",
            problem: "must not start with '-' or hold a control character".into(),
        });
    }
    Ok(())
}

/// The stdin line of the user's message.
pub fn user_line(text: &str) -> String {
    user_line_with(text, &[])
}

/// The stdin line of the user's message with its attached images as `image` content blocks
/// (base64 `source`, as the Messages API takes them) after the text; other attachments (and an
/// image that can no longer be read) are named in the text only.
pub fn user_line_with(text: &str, attachments: &[crate::adapter::Attachment]) -> String {
    use base64::Engine as _;
    let mut content = vec![json!({"type": "text", "text": text})];
    for a in attachments.iter().filter(|a| a.is_image()) {
        match std::fs::read(&a.path) {
            Ok(bytes) => content.push(json!({"type": "image", "source": {
                "type": "base64", "media_type": a.mime, "data": base64::engine::general_purpose::STANDARD.encode(bytes)}})),
            Err(e) => tracing::warn!(file = %a.rel_path, error = %e, "An attached image could not be read; named in the text only."),
        }
    }
    json!({"type": "user", "message": {"role": "user", "content": content},
        "parent_tool_use_id": null, "session_id": ""})
    .to_string()
}

/// The stdin line that asks the CLI to stop the turn.
pub fn interrupt_line() -> String {
    json!({"type": "control_request", "request_id": "coffer-interrupt", "request": {"subtype": "interrupt"}})
        .to_string()
}

/// How a turn ended.
struct Outcome {
    /// The terminal event (`None` when nobody listens any more).
    terminal: Option<AgentEvent>,
    /// The turn ended normally and the process still runs, ready for another message (else its
    /// group is gone).
    reusable: bool,
    /// The session the process holds (`system/init`'s).
    session_id: Option<String>,
}

/// Runs the turn to its end.
async fn run(
    process: &mut AgentProcess,
    line: &str,
    interrupt: oneshot::Receiver<()>,
    events: &mpsc::Sender<AgentEvent>,
    answers: &mut mpsc::Receiver<ApprovalAnswer>,
) -> Outcome {
    let mut parser = Parser::default();
    let (terminal, reusable) = run_turn(process, line, interrupt, events, answers, &mut parser).await;
    if !reusable {
        // Every path that does not keep the process has ended it already; this is a no-op then.
        process.kill(INTERRUPT_GRACE).await;
    }
    Outcome { terminal, reusable, session_id: parser.session_id.clone() }
}

/// The turn's loop: the terminal event and whether the process may be kept.
async fn run_turn(
    process: &mut AgentProcess,
    line: &str,
    mut interrupt: oneshot::Receiver<()>,
    events: &mpsc::Sender<AgentEvent>,
    answers: &mut mpsc::Receiver<ApprovalAnswer>,
    parser: &mut Parser,
) -> (Option<AgentEvent>, bool) {
    // `can_use_tool` requests sent to the engine: request id → the tool's input (the allow
    // answer carries it back).
    let mut waiting: HashMap<String, Value> = HashMap::new();
    // A CLI that exits at once closes its stdin: what it printed is still read below, and its
    // end is reported as `cli_exited` there.
    let _ = process.send(line).await;
    let mut interrupt_armed = true;
    let mut deadline: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            line = process.lines.recv() => {
                let line = line.unwrap_or(Line::Eof);
                let outcome = match line {
                    Line::Text(l) => parser.line(&l),
                    Line::TooLong(start) => Err(protocol(&format!("a line over 16 MiB starting {start:?}"))),
                    Line::Eof => {
                        if deadline.is_some() {
                            process.finish(EXIT_GRACE).await;
                            return (Some(parser.interrupted_done()), false);
                        }
                        let message = process.exited_message(EXIT_GRACE).await;
                        return (Some(AgentEvent::Failed { kind: FailureKind::CliExited, message }), false);
                    }
                };
                match outcome {
                    Ok(step) => {
                        for request in step.control_requests {
                            let _ = process.send(&unsupported_control(&request)).await;
                        }
                        for req in step.approvals {
                            waiting.insert(req.request_id.clone(), req.input.clone());
                            if events.send(AgentEvent::ApprovalRequested(Box::new(req))).await.is_err() {
                                process.kill(INTERRUPT_GRACE).await;
                                return (None, false);
                            }
                        }
                        for event in step.events {
                            if events.send(event).await.is_err() {
                                process.kill(INTERRUPT_GRACE).await;
                                return (None, false);
                            }
                        }
                        if let Some(terminal) = step.terminal {
                            if deadline.is_none() && matches!(terminal, AgentEvent::Done { .. }) {
                                return (Some(terminal), true);
                            }
                            process.finish(EXIT_GRACE).await;
                            return (Some(if deadline.is_some() { parser.interrupted_done() } else { terminal }), false);
                        }
                    }
                    Err(failed) => {
                        process.kill(INTERRUPT_GRACE).await;
                        return (Some(failed), false);
                    }
                }
            }
            Some(answer) = answers.recv(), if !waiting.is_empty() => {
                if let Some(input) = waiting.remove(&answer.request_id) {
                    let line = permission_line(&answer.request_id, answer.allow, &input, &answer.message);
                    let _ = process.send(&line).await;
                }
            }
            fired = &mut interrupt, if interrupt_armed => {
                interrupt_armed = false;
                if fired.is_ok() {
                    if process.send(&interrupt_line()).await.is_err() {
                        process.kill(INTERRUPT_GRACE).await;
                        return (Some(parser.interrupted_done()), false);
                    }
                    deadline = Some(tokio::time::Instant::now() + INTERRUPT_GRACE);
                }
            }
            () = events.closed() => {
                process.kill(INTERRUPT_GRACE).await;
                return (None, false);
            }
            () = sleep_until(deadline) => {
                process.kill(INTERRUPT_GRACE).await;
                return (Some(parser.interrupted_done()), false);
            }
        }
    }
}

/// Sleeps until `deadline`, or forever without one.
async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// The answer to a control request from the CLI that Coffer does not serve (with
/// `bypassPermissions` none is expected; answering keeps the CLI from waiting forever).
fn unsupported_control(request_id: &str) -> String {
    json!({"type": "control_response", "response": {"subtype": "error", "request_id": request_id,
        "error": "Coffer does not answer this control request"}})
    .to_string()
}

fn protocol(what: &str) -> AgentEvent {
    AgentEvent::Failed { kind: FailureKind::Protocol, message: format!("{AGENT} printed {what}, not stream-json") }
}

/// What one stdout line means for the turn.
#[derive(Debug, Default, PartialEq)]
pub struct Step {
    /// Events to report now, in order.
    pub events: Vec<AgentEvent>,
    /// The turn's terminal event (a `result` line).
    pub terminal: Option<AgentEvent>,
    /// Ids of control requests from the CLI to answer (as unsupported).
    pub control_requests: Vec<String>,
    /// `can_use_tool` requests for the engine.
    pub approvals: Vec<ApprovalRequest>,
}

/// The stream-json line parser: a state machine over one turn's stdout.
#[derive(Debug, Default)]
pub struct Parser {
    /// The session `system/init` named.
    pub session_id: Option<String>,
    session_sent: bool,
    init_model: Option<String>,
    last_model: Option<String>,
    /// Message being streamed (`message_start`'s id) and whether it had text deltas.
    streaming: Option<String>,
    streamed: HashSet<String>,
    usage: Usage,
}

impl Parser {
    /// Interprets one line.
    ///
    /// # Errors
    /// [`AgentEvent::Failed`] `protocol` naming the line's first bytes when it is not a JSON
    /// object with a string `type`.
    pub fn line(&mut self, line: &str) -> Result<Step, AgentEvent> {
        let mut step = Step::default();
        if line.trim().is_empty() {
            return Ok(step);
        }
        let v: Value = serde_json::from_str(line).map_err(|_| protocol(&format!("{:?}", quote(line))))?;
        let Some(kind) = v.get("type").and_then(Value::as_str) else {
            return Err(protocol(&format!("a line without a type: {:?}", quote(line))));
        };
        let own = v.get("parent_tool_use_id").is_none_or(Value::is_null);
        match kind {
            "system" if v["subtype"] == "init" => {
                let model = v["model"].as_str().map(str::to_owned);
                self.init_model.clone_from(&model);
                if let Some(id) = v["session_id"].as_str() {
                    self.session_id = Some(id.to_owned());
                }
                if let (false, Some(id)) = (self.session_sent, v["session_id"].as_str()) {
                    self.session_sent = true;
                    step.events.push(AgentEvent::Session { session_id: id.to_owned(), model });
                }
            }
            "stream_event" if own => self.stream_event(&v["event"], &mut step),
            "assistant" if own && v.get("error").is_none() => self.assistant(&v["message"], &mut step),
            "user" if own => {
                for block in blocks(&v["message"]) {
                    if block["type"] == "tool_result" {
                        step.events.push(AgentEvent::ToolResult {
                            tool_use_id: block["tool_use_id"].as_str().unwrap_or_default().to_owned(),
                            output: content_text(&block["content"]),
                            is_error: block["is_error"] == true,
                        });
                    }
                }
            }
            "result" => step.terminal = Some(self.result(&v)),
            "control_request" => {
                let request = &v["request"];
                match v["request_id"].as_str() {
                    Some(id) if request["subtype"] == "can_use_tool" => step.approvals.push(ApprovalRequest {
                        request_id: id.to_owned(),
                        tool: request["tool_name"].as_str().unwrap_or_default().to_owned(),
                        input: request["input"].clone(),
                        diff: None,
                        cwd: None,
                    }),
                    Some(id) => step.control_requests.push(id.to_owned()),
                    None => {}
                }
            }
            // `control_response`, `system/api_retry`, `rate_limit_event`, subagents' lines and
            // whatever a newer CLI adds carry nothing for the turn.
            _ => {}
        }
        Ok(step)
    }

    fn stream_event(&mut self, event: &Value, step: &mut Step) {
        match event["type"].as_str() {
            Some("message_start") => self.streaming = event["message"]["id"].as_str().map(str::to_owned),
            Some("content_block_delta") if event["delta"]["type"] == "text_delta" => {
                let text = event["delta"]["text"].as_str().unwrap_or_default();
                if !text.is_empty() {
                    if let Some(id) = &self.streaming {
                        self.streamed.insert(id.clone());
                    }
                    step.events.push(AgentEvent::TextDelta(text.to_owned()));
                }
            }
            _ => {}
        }
    }

    fn assistant(&mut self, message: &Value, step: &mut Step) {
        if let Some(model) = message["model"].as_str().filter(|m| !m.starts_with('<')) {
            self.last_model = Some(model.to_owned());
        }
        let streamed = message["id"].as_str().is_some_and(|id| self.streamed.contains(id));
        for block in blocks(message) {
            match block["type"].as_str() {
                Some("text") if !streamed => {
                    let text = block["text"].as_str().unwrap_or_default();
                    if !text.is_empty() {
                        step.events.push(AgentEvent::TextDelta(text.to_owned()));
                    }
                }
                Some("tool_use") => step.events.push(AgentEvent::ToolCall {
                    id: block["id"].as_str().unwrap_or_default().to_owned(),
                    name: block["name"].as_str().unwrap_or_default().to_owned(),
                    input: block["input"].clone(),
                }),
                _ => {}
            }
        }
    }

    fn result(&mut self, v: &Value) -> AgentEvent {
        let u = &v["usage"];
        let n = |k: &str| u[k].as_u64().unwrap_or(0);
        self.usage = Usage {
            input_tokens: n("input_tokens"),
            output_tokens: n("output_tokens"),
            cache_read_tokens: n("cache_read_input_tokens"),
            cache_write_tokens: n("cache_creation_input_tokens"),
        };
        let text = quote(v["result"].as_str().unwrap_or_default().trim());
        if v["is_error"] == true || v["subtype"].as_str().is_some_and(|s| s.starts_with("error")) {
            return match v["api_error_status"].as_u64() {
                Some(status @ (401 | 403)) => AgentEvent::Failed {
                    kind: FailureKind::Auth,
                    message: format!("the Anthropic API answered {status}: {text}"),
                },
                Some(status) => AgentEvent::Failed {
                    kind: FailureKind::Provider,
                    message: format!("the Anthropic API answered {status}: {text}"),
                },
                None => {
                    let subtype = v["subtype"].as_str().unwrap_or("an error");
                    AgentEvent::Failed {
                        kind: FailureKind::Provider,
                        message: format!("{AGENT} ended the turn with {subtype}: {text}"),
                    }
                }
            };
        }
        AgentEvent::Done {
            stop_reason: v["stop_reason"].as_str().unwrap_or("end_turn").to_owned(),
            usage: self.usage,
            model: self.model(),
        }
    }

    fn model(&self) -> Option<String> {
        self.last_model.clone().or_else(|| self.init_model.clone())
    }

    /// The terminal event of an interrupted turn (usage so far, when a `result` came).
    pub fn interrupted_done(&self) -> AgentEvent {
        AgentEvent::Done { stop_reason: "interrupted".into(), usage: self.usage, model: self.model() }
    }
}

fn blocks(message: &Value) -> impl Iterator<Item = &Value> {
    message["content"].as_array().into_iter().flatten()
}

/// A tool result's content as text: a string as it is, text blocks joined by newlines, anything
/// else as JSON.
fn content_text(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(items) => items
            .iter()
            .map(|b| b["text"].as_str().map_or_else(|| b.to_string(), str::to_owned))
            .collect::<Vec<_>>()
            .join("\n"),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_fixture(text: &str) -> (Vec<AgentEvent>, Option<AgentEvent>) {
        let mut p = Parser::default();
        let mut events = Vec::new();
        let mut terminal = None;
        for line in text.lines() {
            let step = p.line(line).unwrap_or_else(|e| panic!("{line}: {e:?}"));
            events.extend(step.events);
            if step.terminal.is_some() {
                terminal = step.terminal;
            }
        }
        (events, terminal)
    }

    #[test]
    fn streamed_text_is_reported_once_token_by_token() {
        let (events, done) = run_fixture(include_str!("../tests/fixtures/claude_streamed_text.ndjson"));
        assert_eq!(
            events,
            [
                AgentEvent::Session { session_id: "sess-1".into(), model: Some("claude-test[1m]".into()) },
                AgentEvent::TextDelta("Hello".into()),
                AgentEvent::TextDelta(" there".into()),
            ]
        );
        assert_eq!(
            done,
            Some(AgentEvent::Done {
                stop_reason: "end_turn".into(),
                usage: Usage { input_tokens: 12, output_tokens: 7, cache_read_tokens: 3, cache_write_tokens: 2 },
                model: Some("claude-test".into()),
            })
        );
    }

    #[test]
    fn an_unstreamed_text_block_is_one_delta_and_tools_are_mapped() {
        let (events, done) = run_fixture(include_str!("../tests/fixtures/claude_tool.ndjson"));
        assert_eq!(
            events,
            [
                AgentEvent::Session { session_id: "sess-2".into(), model: Some("m".into()) },
                AgentEvent::ToolCall {
                    id: "toolu_1".into(),
                    name: "Bash".into(),
                    input: json!({"command": "echo hi"})
                },
                AgentEvent::ToolResult { tool_use_id: "toolu_1".into(), output: "hi".into(), is_error: false },
                AgentEvent::ToolResult { tool_use_id: "toolu_2".into(), output: "a\nb".into(), is_error: true },
                AgentEvent::TextDelta("Tool said hi".into()),
            ]
        );
        assert!(matches!(done, Some(AgentEvent::Done { .. })));
    }

    #[test]
    fn api_errors_name_the_status_and_auth_is_its_own_kind() {
        let (events, done) = run_fixture(include_str!("../tests/fixtures/claude_401.ndjson"));
        assert_eq!(events.len(), 1, "the CLI's own error note is not assistant text: {events:?}");
        let Some(AgentEvent::Failed { kind, message }) = done else { panic!("{done:?}") };
        assert_eq!(kind, FailureKind::Auth);
        assert!(message.starts_with("the Anthropic API answered 401: "), "{message}");

        let mut p = Parser::default();
        let line = r#"{"type":"result","subtype":"success","is_error":true,"api_error_status":500,"result":"API Error: 500 boom","usage":{}}"#;
        let step = p.line(line).unwrap();
        assert_eq!(
            step.terminal,
            Some(AgentEvent::Failed {
                kind: FailureKind::Provider,
                message: "the Anthropic API answered 500: API Error: 500 boom".into()
            })
        );
    }

    #[test]
    fn junk_is_a_protocol_failure_naming_the_line() {
        let mut p = Parser::default();
        let Err(AgentEvent::Failed { kind, message }) = p.line("Segmentation fault (core dumped)") else { panic!() };
        assert_eq!(kind, FailureKind::Protocol);
        assert!(message.contains("Segmentation fault"), "{message}");
        let Err(AgentEvent::Failed { kind, .. }) = p.line("[1,2]") else { panic!() };
        assert_eq!(kind, FailureKind::Protocol);
        assert!(p.line("").unwrap().events.is_empty());
        // Unknown types are a newer CLI's business.
        assert_eq!(p.line(r#"{"type":"rate_limit_event"}"#).unwrap(), Step::default());
    }

    /// The recorded permission exchanges (2.1.197, `--permission-prompt-tool stdio`): the
    /// request the engine is shown, and the answer line as the CLI took it.
    #[test]
    fn can_use_tool_requests_of_the_fixtures() {
        for (fixture, allow) in [
            (include_str!("../tests/fixtures/claude_08_stdin_control_permission_allow.ndjson"), true),
            (include_str!("../tests/fixtures/claude_08b_stdin_control_permission_deny.ndjson"), false),
        ] {
            let mut p = Parser::default();
            let mut asked = Vec::new();
            let mut sent = None;
            for line in fixture.lines() {
                let v: Value = serde_json::from_str(line).unwrap();
                if v.get("_sent").is_some() {
                    if v["type"] == "control_response" {
                        sent = Some(v);
                    }
                    continue;
                }
                let step = p.line(line).unwrap();
                assert!(step.control_requests.is_empty());
                asked.extend(step.approvals);
            }
            assert_eq!(asked.len(), 1);
            let req = &asked[0];
            assert_eq!(req.tool, "Bash");
            assert_eq!(req.input["command"], "python3 -c 'print(6*7)'");
            let mut sent = sent.unwrap();
            sent.as_object_mut().unwrap().remove("_sent");
            let ours: Value =
                serde_json::from_str(&permission_line(&req.request_id, allow, &req.input, "denied by test driver"))
                    .unwrap();
            assert_eq!(ours, sent, "the answer the CLI accepted");
        }
        assert_eq!(permission_args(PermissionMode::Bypass), ["--permission-mode", "bypassPermissions"]);
        assert_eq!(permission_args(PermissionMode::ReadOnly)[1], "default");
    }

    #[test]
    fn control_requests_are_answered_and_subagents_skipped() {
        let mut p = Parser::default();
        let step =
            p.line(r#"{"type":"control_request","request_id":"r1","request":{"subtype":"hook_callback"}}"#).unwrap();
        assert_eq!(step.control_requests, ["r1"]);
        let sub = r#"{"type":"assistant","parent_tool_use_id":"toolu_9","message":{"id":"x","content":[{"type":"text","text":"inner"}]}}"#;
        assert!(p.line(sub).unwrap().events.is_empty());
        assert!(unsupported_control("r1").contains(r#""request_id":"r1""#));
    }

    #[test]
    fn a_binding_replaces_inherited_anthropic_variables() {
        let os = |k: &str, v: &str| (OsString::from(k), OsString::from(v));
        let mut env = vec![
            os("PATH", "/usr/bin"),
            os("ANTHROPIC_BASE_URL", "https://theirs"),
            os("ANTHROPIC_AUTH_TOKEN", "their-token"),
            os("CLAUDE_CODE_USE_BEDROCK", "1"),
            os("ANTHROPIC_API_KEY", "bound-key"),
            os("CLAUDE_CODE_MAX_RETRIES", "0"),
        ];
        let own = [("ANTHROPIC_API_KEY", OsString::from("bound-key"))];
        drop_fighting(&mut env, &own, &ExtraEnv(vec![("CLAUDE_CODE_MAX_RETRIES".into(), "0".into())]));
        let keys: Vec<_> = env.iter().map(|(k, _)| k.to_string_lossy().into_owned()).collect();
        assert_eq!(keys, ["PATH", "ANTHROPIC_API_KEY", "CLAUDE_CODE_MAX_RETRIES"]);

        // Through the provider: the bound values are there once each.
        let b = crate::binding::Binding::of(&crate::binding::tests::resolved(
            "work",
            coffer_llm::Wire::Anthropic,
            "http://127.0.0.1:9",
            Some("sk-bound"),
            "m-bound",
            "",
        ));
        let own = crate::binding::claude_env(&b).unwrap();
        let env = ClaudeCode::new().process_env(&own, true);
        let base: Vec<_> = env.iter().filter(|(k, _)| k == "ANTHROPIC_BASE_URL").collect();
        assert_eq!(base.len(), 1);
        assert_eq!(base[0].1, "http://127.0.0.1:9");
        assert!(env.iter().any(|(k, v)| k == "ANTHROPIC_MODEL" && v == "m-bound"));
        assert!(!env.iter().any(|(k, _)| k == "ANTHROPIC_AUTH_TOKEN"));
    }

    #[test]
    fn stdin_lines() {
        let v: Value = serde_json::from_str(&user_line("hi \"you\"")).unwrap();
        assert_eq!(v["message"]["content"][0]["text"], "hi \"you\"");
        let v: Value = serde_json::from_str(&interrupt_line()).unwrap();
        assert_eq!(v["request"]["subtype"], "interrupt");
        assert!(validate_model(&AgentConfig { model: "--evil".into(), ..Default::default() }).is_err());
        assert!(validate_model(&AgentConfig { model: "claude-sonnet-4-5".into(), ..Default::default() }).is_ok());
    }
}
