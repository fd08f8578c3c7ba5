//! The agent-provider contract: the only way the turn engine reaches an agent.
//!
//! A provider ([`AgentProvider`]) is one registry entry per agent (`claude_code`, `codex`, and
//! in tests a scripted one). It says whether its CLI is available, validates a conversation's
//! [`AgentConfig`] at creation, starts one turn at a time as a [`RunningTurn`] that reports
//! [`AgentEvent`]s on a channel, and tears down per-conversation state on delete. Adding an
//! agent is one more provider in the registry: no change to the engine, the REST/SSE contract,
//! the schema or the CLI.
//!
//! ## A turn's event contract
//!
//! After [`AgentProvider::start_turn`] returns `Ok`, the adapter's task sends, in order:
//! - at most one [`AgentEvent::Session`] as soon as the agent names its session (Claude Code's
//!   `system/init`, Codex's `thread/start` answer): the engine stores it as
//!   `agent_config.session_id` so the next turn resumes it;
//! - any number of [`AgentEvent::TextDelta`], [`AgentEvent::ToolCall`],
//!   [`AgentEvent::ToolResult`]: every piece of assistant text exactly once (token deltas when
//!   the CLI streams them; a whole text block once when it does not), tool calls with their
//!   complete input;
//! - exactly one terminal event, [`AgentEvent::Done`] or [`AgentEvent::Failed`], then the task
//!   ends and the agent's process group is gone — unless the provider keeps the process for the
//!   conversation's next turn (Claude Code parks it after a normal end, see
//!   `crate::claude_code`); [`AgentProvider::forget`] ends a kept process.
//!
//! ## Approvals (permission modes)
//!
//! A turn runs in the conversation's [`PermissionMode`] (`TurnInput.config.permission_mode`).
//! In `bypass` the agent acts without asking. In `ask` and `read_only` an adapter whose agent
//! asks before an action (Claude Code's `can_use_tool` control request, Codex's
//! `item/*/requestApproval`) sends [`AgentEvent::ApprovalRequested`] (among the turn's other
//! events, before its terminal event) and then waits for the matching [`ApprovalAnswer`] on the
//! [`RunningTurn::approvals`] channel it handed out, answering the agent with it; several
//! requests may be open at once, answered in any order. The engine decides: `read_only` denies
//! at once, a tool allowed "always" in this conversation is allowed at once, anything else waits
//! for the owner (or the timeout, an interrupt, the turn's end). An adapter whose agent never
//! asks gives `approvals: None`. An interrupt while a request is open fires the interrupt signal
//! and the engine denies the request at the same time (the adapter answers the agent, which is
//! stopping anyway).
//!
//! When the interrupt signal fires ([`RunningTurn::interrupt`]) the adapter asks the agent to
//! stop (Claude Code: a `control_request` interrupt; Codex: `turn/interrupt`), ends the process
//! group if it has not stopped within [`INTERRUPT_GRACE`], and sends
//! `Done { stop_reason: "interrupted" }`. A dropped receiver means nobody listens any more: the
//! adapter stops the agent the same way and ends. Adapters never sleep to wait for readiness;
//! they never write a secret to a file or a log.
use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

/// How long an interrupted agent may take to stop on its own before its process group is ended
/// (SIGTERM, then SIGKILL through the spawn helper).
pub const INTERRUPT_GRACE: Duration = Duration::from_secs(3);

/// A conversation's agent configuration (stored as a JSON object in the store,
/// `proto/store_conversations.proto` `agent_config_json`).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct AgentConfig {
    /// Absolute, existing working directory of the agent.
    pub cwd: String,
    /// Model name passed to the CLI unvalidated; empty = the agent's own default.
    pub model: String,
    /// The agent's own session (Claude Code) or thread (Codex) id; empty before the first turn.
    pub session_id: String,
    /// Whether the agent acts, asks or only reads (absent in configs from before modes:
    /// `bypass`).
    pub permission_mode: PermissionMode,
}

/// A conversation's permission mode (`agent_config.permission_mode`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PermissionMode {
    /// The agent acts without asking (Claude Code `bypassPermissions`, Codex
    /// `danger-full-access`): Coffer's behaviour before modes.
    #[default]
    Bypass,
    /// Actions that are not read-only wait for the owner's answer.
    Ask,
    /// Actions that are not read-only are refused without asking.
    ReadOnly,
}

impl PermissionMode {
    /// The words, as stored and on the wire.
    pub const WORDS: [&'static str; 3] = ["bypass", "ask", "read_only"];

    /// Its word.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Bypass => "bypass",
            Self::Ask => "ask",
            Self::ReadOnly => "read_only",
        }
    }

    /// The mode of a word (`read-only` is taken for `read_only`); `None` for another.
    pub fn parse(word: &str) -> Option<Self> {
        match word.trim() {
            "bypass" => Some(Self::Bypass),
            "ask" => Some(Self::Ask),
            "read_only" | "read-only" => Some(Self::ReadOnly),
            _ => None,
        }
    }
}

/// An action the agent waits to be allowed (see the module docs, "Approvals").
#[derive(Debug, Clone, PartialEq)]
pub struct ApprovalRequest {
    /// The adapter's own id of the request (Claude Code's `request_id`, Codex's JSON-RPC id);
    /// the answer names it.
    pub request_id: String,
    /// The tool (`Bash`, `Edit`, `Write`, …; Codex: `shell`, `apply_patch`).
    pub tool: String,
    /// The tool's input as the agent gave it (Bash: `{command}`; Edit: `{file_path, old_string,
    /// new_string}`; Codex shell: `{command, cwd}`; Codex patch: `{changes}`).
    pub input: serde_json::Value,
    /// A unified diff the adapter has for the action (Codex file changes); `None`: the engine
    /// renders one for Edit/MultiEdit/Write from `input`.
    pub diff: Option<String>,
    /// The folder the action runs in, when the agent says (else the conversation's `cwd`).
    pub cwd: Option<String>,
}

/// The engine's answer to an [`ApprovalRequest`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalAnswer {
    /// The request's `request_id`.
    pub request_id: String,
    /// Allowed (also for "allow always": the engine remembers that itself).
    pub allow: bool,
    /// For a deny: what the agent is told (never empty for a deny).
    pub message: String,
}

/// What every provider may use: where Coffer lives and how to attach its gateway.
#[derive(Debug, Clone)]
pub struct AgentEnv {
    /// `COFFER_HOME`.
    pub coffer_home: PathBuf,
    /// `COFFER_HOME/agents`: Coffer-owned config for managed agents (never holds a secret).
    pub agents_dir: PathBuf,
    /// The `coffer-mcp-shim` binary that attaches Coffer's gateway to the agent (next to the
    /// service's own binary); the MCP config passes it `COFFER_HOME` explicitly, since the
    /// spawn helper strips every `COFFER_*` variable from the agent's environment.
    pub shim: PathBuf,
    /// A CLI path the user set in settings (`chat.claude_code_path`, `chat.codex_path`) for this
    /// provider; `None` = resolve the command on `PATH`.
    pub command_override: Option<PathBuf>,
    /// The LLM connection the agent is bound to for this turn (`chat.claude_code_connection`,
    /// `chat.codex_connection`), resolved with its key; `None` = the CLI's own login and config.
    pub binding: Option<crate::binding::Binding>,
    /// Run the agent in the vault sandbox (its `chat.*_sandbox` setting; docs/SECURITY.md,
    /// "The vault sandbox").
    pub sandbox: bool,
}

impl AgentEnv {
    /// The vault sandbox for an agent working in `cwd`, or `None` when this agent's sandbox is
    /// off: `COFFER_HOME` hidden except `cwd` (when inside it), read access to `agent-access/`
    /// (`agent.json`: the `/mcp`-only agent token) and `daemon.lock`, and use of `gateway.sock` —
    /// what the `coffer-mcp-shim` that attaches Coffer's gateway to the agent
    /// (`COFFER_AGENT_SHIM=1`) needs to find and reach the daemon. Never `daemon.json`: its
    /// token is the owner's, good for every REST route. The provider adds its own config folder
    /// under `agents/`.
    pub fn sandbox(&self, cwd: &std::path::Path) -> Option<coffer_runtime::sandbox::Sandbox> {
        let home = coffer_runtime::home::CofferHome::at(self.coffer_home.clone());
        self.sandbox.then(|| {
            coffer_runtime::sandbox::Sandbox::hiding(home.root())
                .allow(cwd)
                .allow_read(home.agent_access())
                .allow_read(home.daemon_lock())
                .allow(home.gateway_socket())
        })
    }
}

/// Whether a provider's agent can be chosen now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Availability {
    /// The CLI resolves at `command`; `version` when cheaply known.
    Available { command: PathBuf, version: Option<String> },
    /// Why not, for the owner (e.g. "`claude` was not found on PATH; install
    /// @anthropic-ai/claude-code or set chat.claude_code_path").
    Unavailable { reason: String },
}

/// One turn for an adapter to run.
#[derive(Debug, Clone)]
pub struct TurnInput {
    /// The conversation (ULID).
    pub conversation_id: String,
    /// This turn (ULID); the same id is on every event of the turn.
    pub turn_id: String,
    /// The user's message text.
    pub text: String,
    /// The conversation's config at turn start (resume `session_id` when non-empty).
    pub config: AgentConfig,
    /// The files attached to the user's message, saved in `config.cwd` (the text already names
    /// them, one `Attached: <path>` line each: [`crate::attachments`]); an adapter whose CLI
    /// takes images passes the images as content too. Empty for most turns.
    pub attachments: Vec<Attachment>,
}

/// A file attached to the turn's message, saved in the working directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attachment {
    /// The saved file name.
    pub name: String,
    /// Its type (`image/png`…; images are sniffed from their bytes).
    pub mime: String,
    /// Bytes.
    pub size: u64,
    /// Relative to the working directory: `.coffer/attachments/<message id>/<name>`.
    pub rel_path: String,
    /// Absolute.
    pub path: PathBuf,
}

impl Attachment {
    /// Whether it is an image a model API takes as content (PNG, JPEG, GIF, WebP).
    pub fn is_image(&self) -> bool {
        crate::attachments::IMAGE_TYPES.contains(&self.mime.as_str())
    }
}

/// Token usage of a turn (the model API's counts as the CLI reports them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Input tokens (not counting cache reads).
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// Input tokens read from the prompt cache.
    pub cache_read_tokens: u64,
    /// Input tokens written to the prompt cache.
    pub cache_write_tokens: u64,
}

/// Why a turn failed; each is a `turn_error` code (`proto/chat.proto` `TurnError.code`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// The model API answered an error (status in the message).
    Provider,
    /// The model API refused the credentials (401/403).
    Auth,
    /// The CLI could not be started (not found, not executable).
    CliMissing,
    /// The CLI exited before the turn ended.
    CliExited,
    /// The CLI printed something that is not its documented protocol.
    Protocol,
    /// No output within the turn timeout (set by the engine, not adapters).
    Timeout,
    /// Anything else.
    Internal,
}

impl FailureKind {
    /// The `turn_error` code.
    pub const fn as_str(self) -> &'static str {
        match self {
            FailureKind::Provider => "provider",
            FailureKind::Auth => "auth",
            FailureKind::CliMissing => "cli_missing",
            FailureKind::CliExited => "cli_exited",
            FailureKind::Protocol => "protocol",
            FailureKind::Timeout => "timeout",
            FailureKind::Internal => "internal",
        }
    }
}

/// What an adapter reports during a turn (see the module docs for the order).
#[derive(Debug, Clone, PartialEq)]
pub enum AgentEvent {
    /// The agent's session/thread id and, when it says, the model it runs.
    Session { session_id: String, model: Option<String> },
    /// A piece of assistant text (appended to the current text block; a text after a tool call
    /// starts a new block).
    TextDelta(String),
    /// The agent calls a tool; `input` is the complete JSON input.
    ToolCall { id: String, name: String, input: serde_json::Value },
    /// A tool's result (text; the engine truncates it for storage).
    ToolResult { tool_use_id: String, output: String, is_error: bool },
    /// The turn ended normally (or was interrupted: `stop_reason` "interrupted").
    Done { stop_reason: String, usage: Usage, model: Option<String> },
    /// The turn failed; `message` names the cause for the owner (provider, status, what the CLI
    /// said) and never holds a secret.
    Failed { kind: FailureKind, message: String },
    /// The agent waits for permission to act; answered on [`RunningTurn::approvals`].
    ApprovalRequested(Box<ApprovalRequest>),
}

/// A turn in flight.
#[derive(Debug)]
pub struct RunningTurn {
    /// Fire to interrupt (dropping it without sending does nothing).
    pub interrupt: oneshot::Sender<()>,
    /// The adapter's task; it ends after the terminal event, with the agent's processes gone.
    pub task: tokio::task::JoinHandle<()>,
    /// Where the engine sends the answers to this turn's [`AgentEvent::ApprovalRequested`];
    /// `None` when the agent never asks.
    pub approvals: Option<mpsc::Sender<ApprovalAnswer>>,
}

/// How many answers an adapter's approval channel holds (the engine never waits on it long:
/// requests are few).
pub const APPROVAL_CHANNEL: usize = 16;

/// A configuration the provider refuses (nothing is persisted).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct ConfigError {
    /// The field at fault (`cwd`, `model`, `session_id`).
    pub field: &'static str,
    /// What is wrong, for the owner.
    pub problem: String,
}

/// Why a turn could not start (the engine reports it as `turn_error` with the kind).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct StartError {
    /// The `turn_error` code.
    pub kind: FailureKind,
    /// The cause, for the owner.
    pub message: String,
}

/// One agent the chat service can drive. Implementations are cheap to share
/// (`Arc<dyn AgentProvider>` in the registry).
pub trait AgentProvider: Send + Sync + 'static {
    /// The stable key (`claude_code`, `codex`), stored with each conversation.
    fn key(&self) -> &'static str;
    /// The name shown to the owner (`Claude Code`).
    fn display_name(&self) -> &'static str;
    /// Whether the CLI resolves now (called for `ListAgents` and before each turn; cheap: a
    /// `PATH` lookup, no process started).
    fn availability(&self, env: &AgentEnv) -> Availability;
    /// Checks (and may normalise) a new conversation's config beyond what the engine checks
    /// itself (the engine checks that `cwd` is an existing directory and that `session_id` is
    /// empty).
    ///
    /// # Errors
    /// [`ConfigError`] naming the field.
    fn validate_config(&self, config: &mut AgentConfig) -> Result<(), ConfigError>;
    /// Starts one turn: spawns (or reuses) the agent process through the spawn helper, in
    /// `turn.config.cwd`, with Coffer's gateway attached, and returns at once.
    ///
    /// # Errors
    /// [`StartError`] when nothing could be started (the CLI is missing, the config cannot be
    /// written).
    fn start_turn(
        &self,
        env: &AgentEnv,
        turn: TurnInput,
        events: mpsc::Sender<AgentEvent>,
    ) -> Result<RunningTurn, StartError>;
    /// Tears down whatever the provider keeps for a conversation (a kept-alive process, files
    /// under `agents/`), when the conversation is deleted. Default: nothing.
    fn forget(&self, env: &AgentEnv, conversation_id: &str) {
        let _ = (env, conversation_id);
    }
}
