//! The Codex adapter: `codex app-server`, JSON-RPC over stdio (one object per line, no
//! `jsonrpc` field), one process per turn or kept for the conversation's next one.
//!
//! A turn: `initialize` → `initialized` → `thread/start {cwd, approvalPolicy, sandbox, model?}`
//! (or `thread/resume {threadId, …, excludeTurns: true}` with the stored thread id) →
//! `turn/start {threadId, input: [{type: "text", text}, {type: "localImage", path}…], model?}`;
//! then the notifications of the turn until `turn/completed`. Interrupt is `turn/interrupt
//! {threadId, turnId}`; the process group is ended if the turn has not completed within
//! [`INTERRUPT_GRACE`].
//!
//! Permission modes ([`thread_policy`]): `bypass` runs with `approvalPolicy: "never"`, `sandbox:
//! "danger-full-access"` (server approval requests, not expected, are accepted); `ask` with
//! `"untrusted"` and `"workspace-write"`, so every command that is not known read-only asks:
//! `item/commandExecution/requestApproval` and `item/fileChange/requestApproval` become
//! [`AgentEvent::ApprovalRequested`] (tool `shell` with `{command, cwd}`, tool `apply_patch` with
//! the item's `changes` and their diffs) and the engine's answer goes back as `{"decision":
//! "accept" | "decline"}` (Codex tells the model "rejected by user"; a deny's message has no
//! place in its protocol); `read_only` with `"never"` and `"read-only"`: Codex's sandbox refuses
//! writes and nothing asks (a request that comes anyway is forwarded, and the engine denies it).
//! The mode is part of a kept app-server's fit.
//!
//! Codex runs with Coffer's own `CODEX_HOME` (`COFFER_HOME/agents/codex/`, see
//! [`crate::agents_config::codex_home`]): the user's `config.toml` (from `$CODEX_HOME` of the
//! service's environment, else `~/.codex`) plus `[mcp_servers.coffer]` naming the shim, and
//! `auth.json` linked to the user's, so their model provider and login apply and Coffer's
//! gateway is attached. Threads are kept there too (`sessions/`), which is what `thread/resume`
//! reads.
//!
//! Provider switching ([`crate::binding`]): bound to an LLM connection, that config also holds
//! `[model_providers.coffer-<name>]` (base URL, `wire_api = "responses"`, `env_key`) and
//! top-level `model_provider`/`model` selecting it; the key is only in the app-server's
//! environment ([`binding::CODEX_KEY_VAR`]). Unbound, the entry and the selection are gone and
//! the user's own config applies again. A kept app-server is reused only under the same binding.
//!
//! Process lifetime, as for Claude Code ([`crate::kept`]): a turn that completes parks its
//! app-server with the thread loaded, and the conversation's next turn (same thread, model and
//! `cwd`) starts at `turn/start` on it; otherwise a fresh app-server resumes the thread
//! (`thread/resume`), which also covers a chat-service restart. Measured on the 2-core dev
//! machine against the fake API (`tests/e2e/chat_agents.rs`,
//! `agent_start_up_cost_per_turn_against_a_kept_alive_process`): a turn with a fresh app-server
//! (start, `initialize`, `thread/resume`, turn) ~0.43 s, the same turn on a kept app-server
//! ~0.06-0.08 s; the first start with `thread/start` ~0.65 s.
//!
//! Mapping ([`Parser`]): `item/agentMessage/delta` → [`AgentEvent::TextDelta`] (an
//! `agentMessage` completed without deltas → one); `item/started` / `item/completed` of
//! `commandExecution` (tool `shell`), `mcpToolCall` (`mcp__<server>__<tool>`), `dynamicToolCall`,
//! `fileChange` (`apply_patch`) and `webSearch` (`web_search`) → [`AgentEvent::ToolCall`] /
//! [`AgentEvent::ToolResult`]; `thread/tokenUsage/updated` → the turn's usage (the sum of the
//! turn's `last` counts; input without cached tokens); `turn/completed` `completed` →
//! [`AgentEvent::Done`] (`end_turn`), `interrupted` → `Done` (`interrupted`), `failed` →
//! [`AgentEvent::Failed`] with the model provider and the HTTP status from `codexErrorInfo`
//! (`unauthorized`/401/403 → `auth`). Server requests other than approvals are answered "method
//! not found".
use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

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

const COMMAND: &str = "codex";
const PACKAGE: &str = "@openai/codex";
const SETTING: &str = "chat.codex_path";
const AGENT: &str = "Codex";

const ID_INITIALIZE: u64 = 1;
const ID_THREAD: u64 = 2;
const ID_TURN: u64 = 3;
const ID_INTERRUPT: u64 = 4;

/// The Codex provider (`agent_key` `codex`).
#[derive(Clone, Default)]
pub struct Codex {
    extra: ExtraEnv,
    kept: kept::Shared<Thread>,
}

impl std::fmt::Debug for Codex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kept = self.kept.lock().map(|k| k.len()).unwrap_or(0);
        f.debug_struct("Codex").field("extra", &self.extra).field("kept", &kept).finish()
    }
}

/// What a kept app-server's loaded thread runs (from its `thread/start`/`thread/resume` answer).
#[derive(Debug, Clone, Default)]
pub struct Thread {
    /// The thread's model.
    pub model: Option<String>,
    /// The thread's model provider id.
    pub provider: Option<String>,
}

impl Codex {
    /// The provider as the chat service registers it: the CLI gets the service's environment
    /// (minus every `COFFER_*`), and the user's Codex config is read from its `CODEX_HOME` or
    /// `HOME`.
    pub fn new() -> Self {
        Self::default()
    }

    /// The provider with extra environment for every `codex` it starts, applied last and also
    /// used to find `PATH` and the user's Codex config (`CODEX_HOME`, `HOME`). Tests point `HOME`
    /// at a temporary folder whose `.codex/config.toml` names a fake model API.
    pub fn with_env(env: impl IntoIterator<Item = (impl Into<OsString>, impl Into<OsString>)>) -> Self {
        Self { extra: ExtraEnv(env.into_iter().map(|(k, v)| (k.into(), v.into())).collect()), kept: Default::default() }
    }

    /// The pid of the app-server kept for `conversation_id`, if any (for tests and status).
    pub fn parked_pid(&self, conversation_id: &str) -> Option<i32> {
        self.kept.lock().unwrap_or_else(|e| e.into_inner()).pid(conversation_id)
    }

    /// Coffer's `CODEX_HOME` for `env`, prepared (config merged, auth linked).
    ///
    /// # Errors
    /// [`StartError`] `internal` naming the file that could not be read or written.
    pub fn prepare_home(&self, env: &AgentEnv) -> Result<PathBuf, StartError> {
        let provider = match &env.binding {
            Some(b) => Some(
                binding::codex_provider(b)
                    .map_err(|e| StartError { kind: FailureKind::Provider, message: e.to_string() })?,
            ),
            None => None,
        };
        let ours = env.agents_dir.join("codex");
        let user = agents_config::user_codex_home(
            self.extra.var("CODEX_HOME").map(PathBuf::from),
            self.extra.var("HOME").map(PathBuf::from),
            &ours,
        );
        agents_config::codex_home(&env.agents_dir, user.as_deref(), &env.shim, &env.coffer_home, provider.as_ref())
            .map_err(|e| StartError { kind: FailureKind::Internal, message: e.to_string() })
    }

    /// The app-server's whole environment: the service's (minus `COFFER_*`), the extra
    /// environment, `CODEX_HOME` = Coffer's, and a bound turn's key under
    /// [`binding::CODEX_KEY_VAR`] (an inherited value of that name is never passed on).
    pub fn process_env(&self, home: &Path, env: &AgentEnv) -> Vec<(OsString, OsString)> {
        let own: Vec<(&str, OsString)> = env.binding.as_ref().map(binding::codex_env).unwrap_or_default();
        let own_refs: Vec<(&str, &std::ffi::OsStr)> = own.iter().map(|(k, v)| (*k, v.as_os_str())).collect();
        let mut proc_env = self.extra.build(&[]);
        proc_env.retain(|(k, _)| k != "CODEX_HOME" && k != binding::CODEX_KEY_VAR);
        proc_env.push(("CODEX_HOME".into(), home.as_os_str().to_owned()));
        proc_env.extend(own_refs.iter().map(|(k, v)| (OsString::from(k), (*v).to_owned())));
        proc_env
    }
}

impl AgentProvider for Codex {
    fn key(&self) -> &'static str {
        "codex"
    }

    fn display_name(&self) -> &'static str {
        AGENT
    }

    fn availability(&self, env: &AgentEnv) -> Availability {
        agent_process::availability(env, &self.extra, COMMAND, PACKAGE, SETTING)
    }

    fn validate_config(&self, config: &mut AgentConfig) -> Result<(), ConfigError> {
        if config.model.contains(['\n', '\0']) {
            return Err(ConfigError { field: "model", problem: "must not hold a control character".into() });
        }
        Ok(())
    }

    fn start_turn(
        &self,
        env: &AgentEnv,
        turn: TurnInput,
        events: mpsc::Sender<AgentEvent>,
    ) -> Result<RunningTurn, StartError> {
        let program = agent_process::resolve(env, &self.extra, COMMAND, PACKAGE, SETTING)
            .map_err(|message| StartError { kind: FailureKind::CliMissing, message })?;
        let home = self.prepare_home(env)?;
        let proc_env = self.process_env(&home, env);
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
        let (mut process, loaded) = match reused {
            Some((process, thread)) => (process, Some(thread)),
            None => {
                // Coffer's MCP entry names this conversation (one process serves one conversation).
                let args = vec![
                    OsString::from("-c"),
                    agents_config::codex_conversation_override(&turn.conversation_id).into(),
                    OsString::from("app-server"),
                ];
                let cwd = Path::new(&turn.config.cwd);
                // Its CODEX_HOME (agents/codex/: sessions, logs, history) is its own to write.
                let sandbox = env.sandbox(cwd).map(|s| s.allow(&home));
                (AgentProcess::spawn(AGENT, env, &program, args, proc_env, cwd, sandbox)?, None)
            }
        };
        let (interrupt, interrupted) = oneshot::channel();
        let (approvals, mut answers) = mpsc::channel(APPROVAL_CHANNEL);
        let kept = self.kept.clone();
        let task = tokio::spawn(async move {
            let mut parser = Parser::default();
            if let Some(thread) = loaded {
                parser.thread_id = Some(turn.config.session_id.clone());
                parser.model = thread.model;
                parser.provider = thread.provider;
            }
            let (terminal, reusable) = run(&mut process, &turn, interrupted, &events, &mut answers, &mut parser).await;
            // Parked before the terminal event goes out: the engine may start the next turn on it.
            match (reusable, parser.thread_id.clone()) {
                (true, Some(session_id)) => {
                    let thread = Thread { model: parser.model.clone(), provider: parser.provider.clone() };
                    Kept::park(&kept, &turn.conversation_id, process, Fit { session_id, ..fit }, thread);
                }
                (true, None) => drop(process.finish(EXIT_GRACE).await),
                (false, _) => drop(process.kill(INTERRUPT_GRACE).await),
            }
            if let Some(event) = terminal {
                let _ = events.send(event).await;
            }
        });
        Ok(RunningTurn { interrupt, task, approvals: Some(approvals) })
    }

    fn forget(&self, _env: &AgentEnv, conversation_id: &str) {
        self.kept.lock().unwrap_or_else(|e| e.into_inner()).forget(conversation_id);
    }
}

/// Where the turn's handshake is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Initializing,
    Thread,
    Starting,
    Running,
}

fn request(id: u64, method: &str, params: Value) -> String {
    json!({"id": id, "method": method, "params": params}).to_string()
}

/// The thread's `(approvalPolicy, sandbox)` for a permission mode (module docs).
pub fn thread_policy(mode: PermissionMode) -> (&'static str, &'static str) {
    match mode {
        PermissionMode::Bypass => ("never", "danger-full-access"),
        PermissionMode::Ask => ("untrusted", "workspace-write"),
        PermissionMode::ReadOnly => ("never", "read-only"),
    }
}

/// `thread/start` or `thread/resume` params for `config`.
fn thread_request(config: &AgentConfig) -> String {
    let (policy, sandbox) = thread_policy(config.permission_mode);
    let mut params = json!({"cwd": config.cwd, "approvalPolicy": policy, "sandbox": sandbox});
    if !config.model.is_empty() {
        params["model"] = json!(config.model);
    }
    if config.session_id.is_empty() {
        request(ID_THREAD, "thread/start", params)
    } else {
        params["threadId"] = json!(config.session_id);
        params["excludeTurns"] = json!(true);
        request(ID_THREAD, "thread/resume", params)
    }
}

/// `turn/start`: the text, then each attached image as a `localImage` input item (its absolute
/// path; the app-server reads the file).
fn turn_request(thread_id: &str, text: &str, model: &str, attachments: &[crate::adapter::Attachment]) -> String {
    let mut input = vec![json!({"type": "text", "text": text})];
    input.extend(attachments.iter().filter(|a| a.is_image()).map(|a| json!({"type": "localImage", "path": a.path})));
    let mut params = json!({"threadId": thread_id, "input": input});
    if !model.is_empty() {
        params["model"] = json!(model);
    }
    request(ID_TURN, "turn/start", params)
}

/// Runs the turn to its end: the terminal event (`None` when nobody listens any more) and
/// whether the app-server may be kept (the turn completed; its thread is loaded). On a kept
/// app-server (`parser.thread_id` set) the turn starts at `turn/start`.
async fn run(
    process: &mut AgentProcess,
    turn: &TurnInput,
    mut interrupt: oneshot::Receiver<()>,
    events: &mpsc::Sender<AgentEvent>,
    answers: &mut mpsc::Receiver<ApprovalAnswer>,
    parser: &mut Parser,
) -> (Option<AgentEvent>, bool) {
    let mut phase = Phase::Initializing;
    // Approval requests forwarded to the engine: our request id → Codex's JSON-RPC id.
    let mut waiting: HashMap<String, Value> = HashMap::new();
    if let Some(thread) = parser.thread_id.clone() {
        let session = AgentEvent::Session { session_id: thread.clone(), model: parser.model.clone() };
        if events.send(session).await.is_err() {
            return (None, false);
        }
        let _ = process.send(&turn_request(&thread, &turn.text, &turn.config.model, &turn.attachments)).await;
        phase = Phase::Starting;
    } else {
        let init = json!({"clientInfo": {"name": "coffer", "title": "Coffer", "version": env!("CARGO_PKG_VERSION")}});
        let _ = process.send(&request(ID_INITIALIZE, "initialize", init)).await;
    }
    let mut interrupt_armed = true;
    let mut interrupt_wanted = false;
    let mut deadline: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            line = process.lines.recv() => {
                let text = match line.unwrap_or(Line::Eof) {
                    Line::Text(l) => l,
                    Line::TooLong(start) => {
                        process.kill(INTERRUPT_GRACE).await;
                        return (Some(protocol(&format!("a line over 16 MiB starting {start:?}"))), false);
                    }
                    Line::Eof => {
                        if deadline.is_some() {
                            process.finish(EXIT_GRACE).await;
                            return (Some(parser.interrupted_done()), false);
                        }
                        let message = process.exited_message(EXIT_GRACE).await;
                        let message = match &parser.last_error {
                            Some(e) => format!("{message} (after: {})", quote(e["message"].as_str().unwrap_or_default())),
                            None => message,
                        };
                        return (Some(AgentEvent::Failed { kind: FailureKind::CliExited, message }), false);
                    }
                };
                if text.trim().is_empty() {
                    continue;
                }
                let Some(msg) = serde_json::from_str::<Value>(&text).ok().filter(Value::is_object) else {
                    process.kill(INTERRUPT_GRACE).await;
                    return (Some(protocol(&format!("{:?}", quote(&text)))), false);
                };
                let method = msg.get("method").and_then(Value::as_str);
                let id = msg.get("id").filter(|v| !v.is_null());
                match (method, id) {
                    // A response to one of our requests.
                    (None, Some(id)) => {
                        let id = id.as_u64().unwrap_or(0);
                        if let Some(error) = msg.get("error") {
                            if id == ID_INTERRUPT {
                                continue;
                            }
                            process.kill(INTERRUPT_GRACE).await;
                            return (Some(refused(phase, &turn.config, error)), false);
                        }
                        let result = &msg["result"];
                        match (phase, id) {
                            (Phase::Initializing, ID_INITIALIZE) => {
                                let _ = process.send(&json!({"method": "initialized"}).to_string()).await;
                                let _ = process.send(&thread_request(&turn.config)).await;
                                phase = Phase::Thread;
                            }
                            (Phase::Thread, ID_THREAD) => {
                                let thread = result["thread"]["id"].as_str().unwrap_or_default().to_owned();
                                if thread.is_empty() {
                                    process.kill(INTERRUPT_GRACE).await;
                                    return (Some(protocol("a thread answer without a thread id")), false);
                                }
                                parser.model = result["model"].as_str().map(str::to_owned);
                                parser.provider = result["modelProvider"].as_str().map(str::to_owned);
                                let session = AgentEvent::Session { session_id: thread.clone(), model: parser.model.clone() };
                                if events.send(session).await.is_err() {
                                    process.kill(INTERRUPT_GRACE).await;
                                    return (None, false);
                                }
                                let _ = process.send(&turn_request(&thread, &turn.text, &turn.config.model, &turn.attachments)).await;
                                parser.thread_id = Some(thread);
                                phase = Phase::Starting;
                            }
                            (Phase::Starting, ID_TURN) => {
                                parser.turn_id = result["turn"]["id"].as_str().map(str::to_owned);
                                phase = Phase::Running;
                                if interrupt_wanted {
                                    let _ = process.send(&parser.interrupt_request()).await;
                                }
                            }
                            _ => {}
                        }
                    }
                    // A request from Codex: approvals go to the engine unless the mode is bypass.
                    (Some(method), Some(id)) => {
                        let asked = (turn.config.permission_mode != PermissionMode::Bypass)
                            .then(|| parser.approval_request(method, id, &msg["params"]))
                            .flatten();
                        match asked {
                            Some(req) => {
                                waiting.insert(req.request_id.clone(), id.clone());
                                if events.send(AgentEvent::ApprovalRequested(Box::new(req))).await.is_err() {
                                    process.kill(INTERRUPT_GRACE).await;
                                    return (None, false);
                                }
                            }
                            None => {
                                let _ = process.send(&answer_server_request(method, id, turn.config.permission_mode)).await;
                            }
                        }
                    }
                    (Some(method), None) => {
                        let step = parser.notification(method, &msg["params"]);
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
                    (None, None) => {
                        process.kill(INTERRUPT_GRACE).await;
                        return (Some(protocol(&format!("a message that is neither request, response nor notification: {:?}", quote(&text)))), false);
                    }
                }
            }
            Some(answer) = answers.recv(), if !waiting.is_empty() => {
                if let Some(id) = waiting.remove(&answer.request_id) {
                    let decision = if answer.allow { "accept" } else { "decline" };
                    let _ = process.send(&json!({"id": id, "result": {"decision": decision}}).to_string()).await;
                }
            }
            fired = &mut interrupt, if interrupt_armed => {
                interrupt_armed = false;
                if fired.is_ok() {
                    deadline = Some(tokio::time::Instant::now() + INTERRUPT_GRACE);
                    if phase == Phase::Running {
                        let _ = process.send(&parser.interrupt_request()).await;
                    } else if phase == Phase::Starting {
                        interrupt_wanted = true;
                    } else {
                        // No turn started yet: nothing to ask Codex to stop.
                        process.kill(INTERRUPT_GRACE).await;
                        return (Some(parser.interrupted_done()), false);
                    }
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

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

fn protocol(what: &str) -> AgentEvent {
    AgentEvent::Failed { kind: FailureKind::Protocol, message: format!("{AGENT} app-server sent {what}, not JSON-RPC") }
}

/// The failure when Codex answers one of the handshake requests with an error.
fn refused(phase: Phase, config: &AgentConfig, error: &Value) -> AgentEvent {
    let said = quote(error["message"].as_str().unwrap_or("no reason given"));
    let what = match phase {
        Phase::Initializing => "initialize".to_owned(),
        Phase::Thread if config.session_id.is_empty() => "to start a thread".to_owned(),
        Phase::Thread => format!("to resume thread {}", config.session_id),
        Phase::Starting | Phase::Running => "to start the turn".to_owned(),
    };
    AgentEvent::Failed { kind: FailureKind::Internal, message: format!("{AGENT} refused {what}: {said}") }
}

/// The answer to a request from Codex the engine does not see: in `bypass` approvals are
/// accepted (the owner chose it); in another mode the old API's approvals are denied; anything
/// else is not served.
fn answer_server_request(method: &str, id: &Value, mode: PermissionMode) -> String {
    let bypass = mode == PermissionMode::Bypass;
    if method.ends_with("/requestApproval") {
        json!({"id": id, "result": {"decision": if bypass { "accept" } else { "decline" }}}).to_string()
    } else if method == "execCommandApproval" || method == "applyPatchApproval" {
        json!({"id": id, "result": {"decision": if bypass { "approved" } else { "denied" }}}).to_string()
    } else {
        json!({"id": id, "error": {"code": -32601, "message": format!("Coffer does not serve {method}")}}).to_string()
    }
}

/// What one notification means for the turn.
#[derive(Debug, Default, PartialEq)]
pub struct Step {
    /// Events to report now, in order.
    pub events: Vec<AgentEvent>,
    /// The turn's terminal event (`turn/completed`).
    pub terminal: Option<AgentEvent>,
}

/// The notification mapper of one turn.
#[derive(Debug, Default)]
pub struct Parser {
    /// The thread (from the `thread/start`/`thread/resume` answer).
    pub thread_id: Option<String>,
    /// This turn (from the `turn/start` answer); notifications of other turns are ignored.
    pub turn_id: Option<String>,
    /// The model the thread runs (its answer's `model`).
    pub model: Option<String>,
    /// The thread's model provider id (`openai`, or the user's own), for failure messages.
    pub provider: Option<String>,
    /// The last `error` notification that Codex will not retry.
    pub last_error: Option<Value>,
    streamed: HashSet<String>,
    started: HashSet<String>,
    /// Each started tool item's input (an approval request names its item).
    inputs: HashMap<String, Value>,
    usage: Usage,
}

impl Parser {
    fn ours(&self, params: &Value) -> bool {
        let turn = params.get("turnId").and_then(Value::as_str).or_else(|| params["turn"]["id"].as_str());
        match (turn, &self.turn_id) {
            (Some(t), Some(ours)) => t == ours,
            _ => true,
        }
    }

    /// Interprets one notification (`method`, `params`).
    pub fn notification(&mut self, method: &str, params: &Value) -> Step {
        let mut step = Step::default();
        if !self.ours(params) {
            return step;
        }
        match method {
            "item/agentMessage/delta" => {
                let delta = params["delta"].as_str().unwrap_or_default();
                if !delta.is_empty() {
                    if let Some(id) = params["itemId"].as_str() {
                        self.streamed.insert(id.to_owned());
                    }
                    step.events.push(AgentEvent::TextDelta(delta.to_owned()));
                }
            }
            "item/started" => {
                if let Some(call) = self.tool_call(&params["item"]) {
                    step.events.push(call);
                }
            }
            "item/completed" => self.item_completed(&params["item"], &mut step),
            // Usage updates come before the turn is known too (a resumed thread's totals).
            "thread/tokenUsage/updated" if self.turn_id.is_some() => {
                let last = &params["tokenUsage"]["last"];
                let n = |k: &str| last[k].as_u64().unwrap_or(0);
                self.usage.input_tokens += n("inputTokens").saturating_sub(n("cachedInputTokens"));
                self.usage.output_tokens += n("outputTokens");
                self.usage.cache_read_tokens += n("cachedInputTokens");
                self.usage.cache_write_tokens += n("cacheWriteInputTokens");
            }
            "error" if params["willRetry"] != true => self.last_error = Some(params["error"].clone()),
            "turn/completed" => {
                let turn = &params["turn"];
                step.terminal = Some(match turn["status"].as_str() {
                    Some("completed") => AgentEvent::Done {
                        stop_reason: "end_turn".into(),
                        usage: self.usage,
                        model: self.model.clone(),
                    },
                    Some("interrupted") => self.interrupted_done(),
                    _ => {
                        let error = if turn["error"].is_object() {
                            &turn["error"]
                        } else {
                            self.last_error.as_ref().unwrap_or(&Value::Null)
                        };
                        let (kind, message) = failure(self.provider.as_deref().unwrap_or("the model provider"), error);
                        AgentEvent::Failed { kind, message }
                    }
                });
            }
            _ => {}
        }
        step
    }

    /// A tool item's call, once per item.
    fn tool_call(&mut self, item: &Value) -> Option<AgentEvent> {
        let id = item["id"].as_str()?.to_owned();
        let (name, input) = match item["type"].as_str()? {
            "commandExecution" => ("shell".to_owned(), json!({"command": item["command"], "cwd": item["cwd"]})),
            "mcpToolCall" => (
                format!(
                    "mcp__{}__{}",
                    item["server"].as_str().unwrap_or_default(),
                    item["tool"].as_str().unwrap_or_default()
                ),
                item["arguments"].clone(),
            ),
            "dynamicToolCall" => (item["tool"].as_str().unwrap_or_default().to_owned(), item["arguments"].clone()),
            "fileChange" => ("apply_patch".to_owned(), json!({"changes": item["changes"]})),
            "webSearch" => ("web_search".to_owned(), json!({"query": item["query"]})),
            _ => return None,
        };
        if !self.started.insert(id.clone()) {
            return None;
        }
        self.inputs.insert(id.clone(), input.clone());
        Some(AgentEvent::ToolCall { id, name, input })
    }

    /// The engine's view of an approval request from Codex (`id` its JSON-RPC id); `None` for
    /// another method. A command is shown as its actions (`touch a && echo b`), not the shell
    /// wrapper; a file change with the diffs of the item Codex named.
    pub fn approval_request(&self, method: &str, id: &Value, params: &Value) -> Option<ApprovalRequest> {
        let item = params["itemId"].as_str().unwrap_or_default();
        let cwd = params["cwd"].as_str().map(str::to_owned);
        let (tool, input, diff) = match method {
            "item/commandExecution/requestApproval" => {
                let actions: Vec<&str> = params["commandActions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|a| a["command"].as_str())
                    .collect();
                let command = if actions.is_empty() {
                    params["command"].as_str().unwrap_or_default().to_owned()
                } else {
                    actions.join(" && ")
                };
                ("shell", json!({"command": command, "cwd": params["cwd"], "reason": params["reason"]}), None)
            }
            "item/fileChange/requestApproval" => {
                let changes = self.inputs.get(item).map(|v| v["changes"].clone()).unwrap_or(Value::Null);
                let diff: String = changes
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|c| {
                        let path = c["path"].as_str().unwrap_or_default();
                        format!("--- a/{path}\n+++ b/{path}\n{}\n", c["diff"].as_str().unwrap_or_default().trim_end())
                    })
                    .collect();
                let input = json!({"changes": changes, "reason": params["reason"], "grantRoot": params["grantRoot"]});
                ("apply_patch", input, (!diff.is_empty()).then_some(diff))
            }
            _ => return None,
        };
        Some(ApprovalRequest { request_id: id.to_string(), tool: tool.to_owned(), input, diff, cwd })
    }

    fn item_completed(&mut self, item: &Value, step: &mut Step) {
        let id = item["id"].as_str().unwrap_or_default().to_owned();
        let status = item["status"].as_str().unwrap_or_default();
        let (output, is_error) = match item["type"].as_str().unwrap_or_default() {
            "agentMessage" => {
                let text = item["text"].as_str().unwrap_or_default();
                if !self.streamed.contains(&id) && !text.is_empty() {
                    step.events.push(AgentEvent::TextDelta(text.to_owned()));
                }
                return;
            }
            "commandExecution" => {
                let code = item["exitCode"].as_i64();
                (
                    item["aggregatedOutput"].as_str().unwrap_or_default().to_owned(),
                    status != "completed" || code.is_some_and(|c| c != 0),
                )
            }
            "mcpToolCall" => match item["error"]["message"].as_str() {
                Some(message) => (message.to_owned(), true),
                None => {
                    (content_text(&item["result"]["content"], &item["result"]["structuredContent"]), status == "failed")
                }
            },
            "dynamicToolCall" => (content_text(&item["contentItems"], &Value::Null), item["success"] == false),
            "fileChange" => (status.to_owned(), status != "completed"),
            "webSearch" => {
                (item["results"].as_array().map(|r| Value::Array(r.clone()).to_string()).unwrap_or_default(), false)
            }
            _ => return,
        };
        if let Some(call) = self.tool_call(item) {
            step.events.push(call);
        }
        step.events.push(AgentEvent::ToolResult { tool_use_id: id, output, is_error });
    }

    /// The `turn/interrupt` request for this turn.
    pub fn interrupt_request(&self) -> String {
        request(
            ID_INTERRUPT,
            "turn/interrupt",
            json!({"threadId": self.thread_id.clone().unwrap_or_default(), "turnId": self.turn_id.clone().unwrap_or_default()}),
        )
    }

    /// The terminal event of an interrupted turn (usage so far).
    pub fn interrupted_done(&self) -> AgentEvent {
        AgentEvent::Done { stop_reason: "interrupted".into(), usage: self.usage, model: self.model.clone() }
    }
}

/// Text blocks of an MCP result (or Codex's content items) joined by newlines; the structured
/// content as JSON when there is no text.
fn content_text(content: &Value, structured: &Value) -> String {
    let text: Vec<String> = content
        .as_array()
        .into_iter()
        .flatten()
        .map(|b| b["text"].as_str().map_or_else(|| b.to_string(), str::to_owned))
        .collect();
    if text.is_empty() && !structured.is_null() { structured.to_string() } else { text.join("\n") }
}

/// The kind and owner-facing message of a failed turn from Codex's error object
/// (`{message, codexErrorInfo}`): the HTTP status when Codex forwards one (`httpStatusCode` of
/// the connection variants; `unauthorized` is 401 and `internalServerError` 500 as Codex maps
/// them), 401/403 being `auth`.
pub fn failure(provider: &str, error: &Value) -> (FailureKind, String) {
    let info = &error["codexErrorInfo"];
    let said = quote(error["message"].as_str().unwrap_or("no reason given").trim());
    let status = match info.as_str() {
        Some("unauthorized") => Some(401),
        Some("internalServerError") => Some(500),
        Some(_) => None,
        None => info.as_object().and_then(|o| o.values().find_map(|v| v["httpStatusCode"].as_u64())),
    };
    let kind = if matches!(status, Some(401 | 403)) { FailureKind::Auth } else { FailureKind::Provider };
    let message = match (status, info.as_str()) {
        (Some(n), _) => format!("the model provider `{provider}` answered {n}: {said}"),
        (None, Some(code)) => format!("{AGENT} reported {code} from the model provider `{provider}`: {said}"),
        (None, None) => format!("{AGENT} failed the turn with the model provider `{provider}`: {said}"),
    };
    (kind, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds the notifications (lines with a `method` and no `id`) of a fixture to a parser whose
    /// thread and turn are known.
    fn run_fixture(text: &str) -> (Vec<AgentEvent>, Option<AgentEvent>) {
        let mut p = Parser {
            thread_id: Some("thr-1".into()),
            turn_id: Some("turn-1".into()),
            model: Some("fake-model".into()),
            provider: Some("fake".into()),
            ..Parser::default()
        };
        let mut events = Vec::new();
        let mut terminal = None;
        for line in text.lines() {
            let v: Value = serde_json::from_str(line).unwrap();
            if let (Some(m), None) = (v["method"].as_str(), v.get("id")) {
                let step = p.notification(m, &v["params"]);
                events.extend(step.events);
                terminal = terminal.or(step.terminal);
            }
        }
        (events, terminal)
    }

    #[test]
    fn deltas_tools_and_usage_of_a_turn() {
        let (events, done) = run_fixture(include_str!("../tests/fixtures/codex_turn.ndjson"));
        assert_eq!(
            events,
            [
                AgentEvent::ToolCall {
                    id: "call_1".into(),
                    name: "shell".into(),
                    input: json!({"command": "/bin/bash -lc 'echo hi'", "cwd": "/w"})
                },
                AgentEvent::ToolResult { tool_use_id: "call_1".into(), output: "hi\n".into(), is_error: false },
                AgentEvent::ToolCall {
                    id: "call_2".into(),
                    name: "mcp__coffer__coffer__search_tools".into(),
                    input: json!({"query": "echo"})
                },
                AgentEvent::ToolResult { tool_use_id: "call_2".into(), output: "tiny__echo".into(), is_error: false },
                AgentEvent::TextDelta("Hello ".into()),
                AgentEvent::TextDelta("there".into()),
                AgentEvent::TextDelta("Unstreamed.".into()),
            ]
        );
        assert_eq!(
            done,
            Some(AgentEvent::Done {
                stop_reason: "end_turn".into(),
                usage: Usage { input_tokens: 32, output_tokens: 16, cache_read_tokens: 8, cache_write_tokens: 0 },
                model: Some("fake-model".into()),
            })
        );
    }

    #[test]
    fn a_failed_turn_names_provider_and_status() {
        let (_, done) = run_fixture(include_str!("../tests/fixtures/codex_failed.ndjson"));
        let Some(AgentEvent::Failed { kind, message }) = done else { panic!("{done:?}") };
        assert_eq!(kind, FailureKind::Provider);
        assert!(message.starts_with("the model provider `fake` answered 500: "), "{message}");

        let auth = json!({"message": "unexpected status 401 Unauthorized", "codexErrorInfo": {"responseStreamConnectionFailed": {"httpStatusCode": 401}}});
        let (kind, message) = failure("openai", &auth);
        assert_eq!(kind, FailureKind::Auth);
        assert!(message.contains("`openai` answered 401"), "{message}");
        let (kind, message) = failure("x", &json!({"message": "too long", "codexErrorInfo": "contextWindowExceeded"}));
        assert_eq!(kind, FailureKind::Provider);
        assert!(message.contains("contextWindowExceeded") && message.contains("too long"), "{message}");
    }

    #[test]
    fn other_turns_and_earlier_usage_are_ignored() {
        let mut p = Parser::default();
        let usage = json!({"turnId": "old", "tokenUsage": {"last": {"inputTokens": 100, "outputTokens": 100}}});
        assert_eq!(p.notification("thread/tokenUsage/updated", &usage), Step::default());
        p.turn_id = Some("t".into());
        let other = json!({"turnId": "old", "itemId": "m", "delta": "x"});
        assert_eq!(p.notification("item/agentMessage/delta", &other), Step::default());
        let Some(AgentEvent::Done { usage, .. }) =
            p.notification("turn/completed", &json!({"turn": {"id": "t", "status": "interrupted"}})).terminal
        else {
            panic!()
        };
        assert_eq!(usage, Usage::default());
    }

    #[test]
    fn requests_and_answers() {
        let r: Value = serde_json::from_str(&thread_request(&AgentConfig {
            cwd: "/w".into(),
            model: "m".into(),
            session_id: String::new(),
            ..Default::default()
        }))
        .unwrap();
        assert_eq!(r["method"], "thread/start");
        assert_eq!(
            r["params"],
            json!({"cwd": "/w", "approvalPolicy": "never", "sandbox": "danger-full-access", "model": "m"})
        );
        let r: Value = serde_json::from_str(&thread_request(&AgentConfig {
            cwd: "/w".into(),
            model: String::new(),
            session_id: "thr".into(),
            permission_mode: PermissionMode::Ask,
        }))
        .unwrap();
        assert_eq!((r["method"].as_str(), r["params"]["threadId"].as_str()), (Some("thread/resume"), Some("thr")));
        assert!(r.get("jsonrpc").is_none());
        assert_eq!(r["params"]["approvalPolicy"], "untrusted");
        assert_eq!(r["params"]["sandbox"], "workspace-write");
        assert_eq!(thread_policy(PermissionMode::ReadOnly), ("never", "read-only"));
        let approval = "item/commandExecution/requestApproval";
        let a: Value =
            serde_json::from_str(&answer_server_request(approval, &json!(7), PermissionMode::Bypass)).unwrap();
        assert_eq!(a, json!({"id": 7, "result": {"decision": "accept"}}));
        let a: Value = serde_json::from_str(&answer_server_request(approval, &json!(7), PermissionMode::Ask)).unwrap();
        assert_eq!(a, json!({"id": 7, "result": {"decision": "decline"}}));
        let a: Value = serde_json::from_str(&answer_server_request(
            "item/tool/requestUserInput",
            &json!("x"),
            PermissionMode::Bypass,
        ))
        .unwrap();
        assert_eq!(a["error"]["code"], -32601);
    }

    /// The approval requests of the recorded app-server transcripts (0.171.0): what the engine
    /// is shown, and what Codex was answered.
    #[test]
    fn approval_requests_of_the_fixtures() {
        for (fixture, answered) in [
            (include_str!("../tests/fixtures/codex_11_app_server_approval_accept.ndjson"), "accept"),
            (include_str!("../tests/fixtures/codex_12_app_server_approval_decline.ndjson"), "decline"),
        ] {
            let mut p = Parser::default();
            let mut asked = None;
            for line in fixture.lines() {
                let v: Value = serde_json::from_str(line).unwrap();
                let method = v["method"].as_str().unwrap_or_default();
                if v["_dir"] == "send" {
                    if asked.is_some() && v.get("result").is_some() {
                        assert_eq!(v["result"]["decision"], answered);
                    }
                    continue;
                }
                if v.get("id").is_some_and(|id| !id.is_null()) && !method.is_empty() {
                    asked = p.approval_request(method, &v["id"], &v["params"]);
                } else if !method.is_empty() {
                    p.notification(method, &v["params"]);
                }
            }
            let req = asked.expect("an approval request");
            assert_eq!((req.request_id.as_str(), req.tool.as_str()), ("0", "shell"));
            let cmd = req.input["command"].as_str().unwrap();
            assert!(cmd.starts_with("touch ") && !cmd.contains("/bin/bash"), "{cmd}");
            assert_eq!(req.cwd.as_deref(), Some("<TMP>/ws_codex"));
        }
        // A file change shows the diffs of the item it names.
        let mut p = Parser::default();
        let item = json!({"type": "fileChange", "id": "call_1", "status": "inProgress",
            "changes": [{"path": "/w/a.txt", "kind": {"type": "update"}, "diff": "@@ -1 +1 @@\n-a\n+b"}]});
        p.notification("item/started", &json!({"item": item}));
        let req = p
            .approval_request(
                "item/fileChange/requestApproval",
                &json!(3),
                &json!({"itemId": "call_1", "reason": null}),
            )
            .unwrap();
        assert_eq!(req.tool, "apply_patch");
        assert_eq!(req.diff.as_deref(), Some("--- a//w/a.txt\n+++ b//w/a.txt\n@@ -1 +1 @@\n-a\n+b\n"));
        assert!(p.approval_request("item/tool/requestUserInput", &json!(4), &json!({})).is_none());
    }
}
