//! Bodies of `/v1/agents` and `/v1/conversations…`: the requests (a `null` field counts as
//! absent: every optional field of a request is an `Option`), the answers (a conversation, its
//! messages and their content blocks, the pending queue, the agents), and the events of the two
//! SSE streams (`…/{id}/events`: [`Event`]; `/v1/conversations/events`: [`Conversation`],
//! [`ConversationGone`], [`Reset`]), which the web console reads too. In answers and events a
//! field that may be unknown or empty is `null`, never absent (`Option` without
//! `skip_serializing_if`), except the two alternatives of [`SendMessageReply`]; times are
//! `*_ms`, Unix milliseconds.
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The agent settings a conversation may be created with (the agent's `session_id` is not the
/// caller's to set).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentConfigCreate {
    /// An existing directory (absolute); default `COFFER_HOME/workspace`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Default: the agent's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// `bypass`, `ask` or `read_only` (`read-only` is taken too); default: the agent's setting
    /// (`chat.claude_code_permission_mode`, `chat.codex_permission_mode`), else `bypass`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permission_mode: Option<String>,
}

/// `POST /v1/conversations`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ConversationCreate {
    /// An available agent (`GET /v1/agents`).
    pub agent_key: String,
    /// Default: from the first message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_config: Option<AgentConfigCreate>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_chat_id: Option<String>,
    /// Sent at once (1 byte to 1 MiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_message: Option<String>,
}

/// `PATCH /v1/conversations/{id}`: at least one field.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ConversationPatch {
    /// At most 200 characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// `""`: the agent's own default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// `false` restores an archived conversation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub archived: Option<bool>,
    /// `bypass`, `ask` or `read_only`: from the next turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permission_mode: Option<String>,
}

/// Most bytes (UTF-8) of one message's text: the chat service refuses a longer one
/// (`coffer_chat::engine::MAX_TEXT_BYTES`, 1 MiB). Clients check it first so that nothing is
/// uploaded in vain.
pub const MAX_MESSAGE_TEXT_BYTES: usize = 1 << 20;

/// `POST /v1/conversations/{id}/messages` (JSON; files as base64 in `attachments`: this route's
/// body may be up to 56 MiB, every other route's 2 MiB).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MessageSend {
    /// 1 byte to 1 MiB (UTF-8); may be `""` when `attachments` are sent.
    pub text: String,
    /// "Send now": interrupt the running turn (its partial answer kept `interrupted`, the
    /// queue's paused state unchanged) and run this message next, before the pending items.
    /// When two arrive together the later one runs. Idle: a plain send. Default false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub now: Option<bool>,
    /// Files sent with the message: at most `chat.attachment_max_files` (default 4) of at most
    /// `chat.attachment_max_bytes` (default 10 MiB) each, 40 MiB in all. Saved in the
    /// conversation's working directory under `.coffer/attachments/<message id>/<name>` and
    /// named to the agent; images (PNG, JPEG, GIF, WebP) are also passed as image content where
    /// the agent takes them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attachments: Option<Vec<AttachmentUpload>>,
}

/// A file sent with a message (`MessageSend.attachments`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AttachmentUpload {
    /// The file's name: only its last path component is kept, without control characters or
    /// leading dots (`../../x` is saved as `x`, `.bashrc` as `bashrc`); a second file of the
    /// same name gets `-2`. Empty: `file`.
    #[serde(default)]
    pub name: String,
    /// Its media type (`image/png`…); absent: from the name. An image's type is read from its
    /// bytes; a file declared `image/*` that is no PNG, JPEG, GIF or WebP is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mime: Option<String>,
    /// The file's bytes, standard base64 (with padding); at least 1 byte decoded.
    pub data_base64: String,
}

/// One item of a `PUT …/pending` body.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PendingItemSet {
    /// An existing item's id (kept); absent: a new item.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    pub text: String,
}

/// `PUT /v1/conversations/{id}/pending`: the whole queue, in order (`[]` clears it).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PendingSet {
    pub items: Vec<PendingItemSet>,
    /// Keep the queue paused. Default false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
}

// ---------------------------------------------------------------------------------------------
// Answers.

/// The LLM connection an agent's turns run on (settings `chat.claude_code_connection`,
/// `chat.codex_connection`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AgentBinding {
    /// The LLM connection's name.
    pub connection: String,
    /// The connection's model: the agent's default model (a conversation's own `model` still
    /// wins); null when the connection has none.
    pub model: Option<String>,
    /// The connection's fast model; null: none.
    pub fast_model: Option<String>,
    /// `anthropic`, `openai-responses`, `openai-chat` or `ollama`; null when the connection is
    /// missing.
    pub wire: Option<String>,
    /// Why a turn would fail now (the connection is missing, the agent cannot use its wire);
    /// null: usable.
    pub problem: Option<String>,
}

/// One agent provider of `GET /v1/agents`, available or not.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Agent {
    /// `claude_code`, `codex`, …
    pub agent_key: String,
    pub display_name: String,
    /// Its CLI resolves (on the daemon's PATH or the path set in settings).
    pub available: bool,
    /// Why it is not available; null when it is.
    pub reason: Option<String>,
    /// The resolved CLI path; null when unknown.
    pub command: Option<String>,
    /// The CLI's version; null when unknown.
    pub version: Option<String>,
    /// The LLM connection its turns use; null: the CLI's own login.
    pub binding: Option<AgentBinding>,
}

/// A conversation's agent settings.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AgentConfig {
    /// The agent's working directory (absolute).
    pub cwd: String,
    /// Passed to the CLI as is; empty: the agent's default.
    pub model: String,
    /// The agent's own session or thread id, set after the first turn; empty before.
    pub session_id: String,
    /// `bypass` (acts without asking), `ask` (actions that are not read-only wait for an
    /// answer: `approval_requested`) or `read_only` (they are refused). Absent from older
    /// daemons: read as empty (`bypass`).
    #[serde(default)]
    pub permission_mode: String,
}

/// A conversation (`GET /v1/conversations` items, `POST`, `PATCH`, the `conversation` events
/// of `GET /v1/conversations/events`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Conversation {
    /// A ULID.
    pub id: String,
    pub agent_key: String,
    /// From the first message unless set; may be empty.
    pub title: String,
    pub agent_config: AgentConfig,
    /// The channel it is bound to; null: none.
    pub channel_name: Option<String>,
    /// The channel's chat; null: none.
    pub peer_chat_id: Option<String>,
    pub archived: bool,
    /// Unix milliseconds; null: unknown.
    pub created_ms: Option<i64>,
    /// Unix milliseconds; null: unknown.
    pub updated_ms: Option<i64>,
    /// Unix milliseconds; null: no message yet.
    pub last_message_ms: Option<i64>,
    /// Bumped by every change; the `ETag`.
    pub version: u64,
    pub message_count: u64,
    /// Live: a turn is in flight.
    pub turn_running: bool,
    /// Live: queued messages.
    pub pending_count: u32,
    /// Live: the queue is paused (after an interrupt, a failed turn or a restart).
    pub pending_paused: bool,
    /// Live: approval requests waiting for an answer (the "waiting for you" badge).
    #[serde(default)]
    pub approvals_waiting: u32,
}

/// Who wrote a message.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    #[default]
    User,
    Assistant,
}

impl Role {
    /// Its word on the wire.
    pub fn word(self) -> &'static str {
        match self {
            Role::User => "user",
            Role::Assistant => "assistant",
        }
    }
}

/// Where a message stands.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum MessageStatus {
    #[default]
    Complete,
    /// A turn is writing it.
    Streaming,
    /// Its turn was interrupted; what it holds was kept.
    Interrupted,
    /// Its turn failed (`error` says why).
    Failed,
}

impl MessageStatus {
    /// Its word on the wire.
    pub fn word(self) -> &'static str {
        match self {
            MessageStatus::Complete => "complete",
            MessageStatus::Streaming => "streaming",
            MessageStatus::Interrupted => "interrupted",
            MessageStatus::Failed => "failed",
        }
    }
}

/// Tokens a turn used.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_read_tokens: u64,
    pub cache_write_tokens: u64,
}

/// A tool call in a message.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ToolUse {
    pub id: String,
    /// e.g. `mcp__coffer__coffer__search_tools`, `Bash`.
    pub name: String,
    /// The tool's input as JSON (an object; a string when the agent sent text that is not
    /// JSON).
    pub input: Value,
}

/// A tool's answer in a message.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ToolResult {
    pub tool_use_id: String,
    /// At most 64 KiB.
    pub output: String,
    pub is_error: bool,
}

/// A file attached to a user message, saved in the conversation's working directory.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Attachment {
    /// The saved (sanitised) file name.
    pub name: String,
    /// `image/png`, `application/pdf`…
    pub mime: String,
    /// Bytes.
    pub size: u64,
    /// Relative to the conversation's `agent_config.cwd`: `.coffer/attachments/<message id>/<name>`.
    pub path: String,
}

/// One block of a message, in order: `type` names which of `text`, `tool_use`, `tool_result`,
/// `attachment` it holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentBlock {
    Text { text: String },
    ToolUse { tool_use: ToolUse },
    ToolResult { tool_result: ToolResult },
    Attachment { attachment: Attachment },
}

/// A message of a conversation.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Message {
    /// A ULID.
    pub id: String,
    pub conversation_id: String,
    pub role: Role,
    pub blocks: Vec<ContentBlock>,
    pub status: MessageStatus,
    /// Assistant messages; null for user messages or when unknown.
    pub usage: Option<Usage>,
    /// Assistant messages: the model that answered; null when unknown.
    pub model: Option<String>,
    /// Unix milliseconds; null: unknown.
    pub created_ms: Option<i64>,
    /// Unix milliseconds; null: unknown.
    pub updated_ms: Option<i64>,
    /// Failed: the cause; else null.
    pub error: Option<String>,
    /// User messages: `cli`, `api`, `ui`, `channel:<name>`; null for assistant messages.
    /// `import:<agent_key>` for history copied from an imported agent session.
    pub source: Option<String>,
    /// Read-only history copied from an imported agent session's transcript
    /// (`POST /v1/conversations/import`); present (`true`) only on those messages.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub imported: bool,
    /// Assistant messages: what the turn changed in the conversation's folder; null when it
    /// changed nothing, the turn has not ended, or it was not recorded (`chat.files_changed` 0);
    /// absent then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files_changed: Option<FilesChanged>,
    /// Assistant messages: the agent that answered (`claude_code`, `codex`, …). Absent for user
    /// messages, a turn that has not ended, and answers stored before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_key: Option<String>,
    /// Assistant messages: the LLM connection (`coffer llm`) the agent was bound to for that
    /// turn. Absent when it used its own login, and whenever `agent_key` is absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection: Option<String>,
}

/// How a turn changed a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FileChangeKind {
    Added,
    Modified,
    Deleted,
    Renamed,
}

/// One file a turn changed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct FileChange {
    /// Relative to the conversation's `cwd`, `/`-separated (a rename's new path), e.g. `src/a.rs`.
    pub path: String,
    pub change: FileChangeKind,
    /// `renamed`: the earlier path; else null.
    pub old_path: Option<String>,
    /// Lines added (0 for binary files and when the earlier content was not kept).
    pub additions: u32,
    /// Lines removed (as `additions`).
    pub deletions: u32,
    /// The file is binary: no line diff (its diff says "binary file changed").
    pub binary: bool,
}

/// What a turn changed in the conversation's folder (the `files_changed` event, and a
/// message's `files_changed`): sorted by path, at most 300 files. In a git repository the
/// comparison is against the tree at the turn's start (earlier uncommitted work is not the
/// turn's); elsewhere a listing of at most 20,000 files (past it: no files, `truncated`, and a
/// `note`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct FilesChanged {
    pub files: Vec<FileChange>,
    /// More files changed than are listed.
    pub truncated: bool,
    /// Why the comparison is partial, e.g. "too many files to compare (more than 20000)"; else null.
    pub note: Option<String>,
    /// The assistant message it belongs to (in the event); null on a message.
    pub message_id: Option<String>,
}

impl FilesChanged {
    /// Lines added and removed over every listed file.
    pub fn totals(&self) -> (u64, u64) {
        self.files.iter().fold((0, 0), |(a, d), f| (a + u64::from(f.additions), d + u64::from(f.deletions)))
    }
}

/// `GET /v1/conversations/{id}/messages/{message_id}/diff?path=…`: one file's diff of that
/// message's turn.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct FileDiff {
    /// As listed in the message's `files_changed`.
    pub path: String,
    /// Unified diff text (3 lines of context; at most 256 KiB, cut with a line saying so), or a
    /// sentence: `binary file changed`, or that the earlier content was not kept.
    pub diff: String,
}

impl Message {
    /// Its text blocks joined.
    pub fn text(&self) -> String {
        self.blocks
            .iter()
            .filter_map(|b| match b {
                ContentBlock::Text { text } => Some(text.as_str()),
                _ => None,
            })
            .collect()
    }
}

/// A message waiting in the pending queue.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PendingItem {
    pub id: String,
    pub text: String,
    /// Unix milliseconds; null: unknown.
    pub created_ms: Option<i64>,
    /// `cli`, `api`, `ui`, `channel:<name>`; null when unknown.
    pub source: Option<String>,
}

/// A conversation's pending queue (`PUT …/pending`, a view's `pending`, `queue_changed`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PendingQueue {
    /// In the order they will run.
    pub items: Vec<PendingItem>,
    pub paused: bool,
}

/// `GET /v1/conversations/{id}`: a conversation with its newest messages and live state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ConversationView {
    pub conversation: Conversation,
    /// The newest ones, oldest first.
    pub messages: Vec<Message>,
    /// Older messages exist (`GET …/messages`).
    pub more_before: bool,
    pub pending: PendingQueue,
    /// Subscribe with `?after=` this to follow from here.
    pub last_seq: u64,
    /// The approval requests waiting for an answer, oldest first.
    #[serde(default)]
    pub approvals: Vec<Approval>,
    /// The tools an `allow_always` answer allowed in this conversation (their requests are
    /// allowed without asking), by name; `DELETE …/allowed-tools` forgets them, and so does a
    /// change of the permission mode.
    #[serde(default)]
    pub allowed_tools: Vec<AllowedTool>,
}

/// A tool allowed "always" in a conversation (an approval answered `allow_always`); kept across
/// restarts of the chat service.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AllowedTool {
    /// The agent's tool name (`Bash`, `Edit`, Codex's `shell`…).
    pub tool: String,
    /// The surface of the answer: `web`, `cli`, `api`, `channel:<name>`.
    pub decided_by: String,
    /// Who answered there (a web session's label, `daemon token`, a chat user id); `null` when
    /// unknown.
    pub actor: Option<String>,
    /// When, Unix milliseconds.
    pub allowed_ms: i64,
}

/// `DELETE /v1/conversations/{id}/allowed-tools`: how many tools allowed "always" were
/// forgotten (0 when there were none).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AllowedToolsForgotten {
    pub forgotten: u32,
}

/// The answer of `POST /v1/conversations/{id}/messages`: `message` when a turn started,
/// `pending` when the text was queued (exactly one of them).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SendMessageReply {
    pub queue: PendingQueue,
    /// The user message whose turn started; absent when queued.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Message")]
    pub message: Option<Message>,
    /// The queued item; absent when a turn started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "PendingItem")]
    pub pending: Option<PendingItem>,
}

/// `POST /v1/conversations/{id}/approvals/{number}`: the answer to an approval request.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ApprovalAnswer {
    /// `allow`, `allow_always` (this tool, for the rest of the conversation) or `deny`.
    pub decision: String,
    /// With a deny: told to the agent (at most 4 KiB); default "The user denied this action.".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// An action the agent waits to be allowed (`approval_requested`, a view's `approvals`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Approval {
    /// The seq of its `approval_requested` event: what an answer names.
    pub number: u64,
    /// `Bash`, `Edit`, `Write`, … (Codex: `shell`, `apply_patch`).
    pub tool: String,
    /// One line: `Bash: rm -rf build`, `Edit: /abs/path`.
    pub summary: String,
    /// The tool's input (an object; a string when it was cut at 64 KiB).
    pub input: Value,
    /// Edits: a unified diff (at most 16 KiB); null otherwise.
    pub diff: Option<String>,
    /// The folder the action runs in.
    pub cwd: String,
    /// Unix milliseconds.
    pub requested_ms: i64,
    /// Unix milliseconds: denied by itself then (`chat.approval_timeout_s`).
    pub expires_ms: i64,
}

/// `approval_resolved`, and the answer of `POST …/approvals/{number}`: how a request was
/// decided.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ApprovalResolved {
    pub number: u64,
    /// `allow`, `allow_always` or `deny`.
    pub decision: String,
    /// What the agent was told (a deny's reason); null: nothing.
    pub message: Option<String>,
    /// `web`, `cli`, `api`, `channel:<name>`, `timeout`, `interrupt` or `turn_ended`.
    pub decided_by: String,
    /// Who (a web session's label, `daemon token`, a chat user's id); null: nobody.
    pub actor: Option<String>,
}

/// `approval_requested`: the agent waits for an answer (`POST …/approvals/{number}`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ApprovalRequested {
    pub approval: Approval,
}

/// The answer of `DELETE /v1/conversations/{id}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ConversationDeleted {
    /// Always true (an unknown conversation is 404).
    #[schemars(extend("const" = true))]
    pub deleted: bool,
    /// A turn was running and was cancelled.
    pub turn_cancelled: bool,
}

/// The answer of `POST /v1/conversations/{id}/interrupt`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Interrupted {
    /// A turn was running (and stopped); false: nothing changed.
    pub interrupted: bool,
}

// ---------------------------------------------------------------------------------------------
// Events (`GET /v1/conversations/{id}/events`, `GET /v1/conversations/events`).

/// A conversation event's kind: the SSE `event:` name and the event's `kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    MessageCreated,
    TurnStarted,
    TextDelta,
    ToolCall,
    ToolResult,
    TurnDone,
    TurnError,
    QueueChanged,
    Reset,
    ApprovalRequested,
    ApprovalResolved,
    FilesChanged,
}

impl EventKind {
    /// Every kind, in the order a turn emits them (then `queue_changed` and `reset`, then the
    /// approvals', then `files_changed`, which follows a turn's end).
    pub const ALL: [EventKind; 12] = [
        EventKind::MessageCreated,
        EventKind::TurnStarted,
        EventKind::TextDelta,
        EventKind::ToolCall,
        EventKind::ToolResult,
        EventKind::TurnDone,
        EventKind::TurnError,
        EventKind::QueueChanged,
        EventKind::Reset,
        EventKind::ApprovalRequested,
        EventKind::ApprovalResolved,
        EventKind::FilesChanged,
    ];

    /// Its word on the wire.
    pub fn word(self) -> &'static str {
        match self {
            EventKind::MessageCreated => "message_created",
            EventKind::TurnStarted => "turn_started",
            EventKind::TextDelta => "text_delta",
            EventKind::ToolCall => "tool_call",
            EventKind::ToolResult => "tool_result",
            EventKind::TurnDone => "turn_done",
            EventKind::TurnError => "turn_error",
            EventKind::QueueChanged => "queue_changed",
            EventKind::Reset => "reset",
            EventKind::ApprovalRequested => "approval_requested",
            EventKind::ApprovalResolved => "approval_resolved",
            EventKind::FilesChanged => "files_changed",
        }
    }
}

/// `message_created`: a user message was accepted (started or dequeued).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct MessageCreated {
    /// Null only from a service that sent none.
    pub message: Option<Message>,
}

/// `turn_started`: the agent got the message.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TurnStarted {
    pub user_message_id: String,
    pub assistant_message_id: String,
    pub agent_key: String,
}

/// `text_delta`: assistant text, token by token.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TextDelta {
    pub text: String,
}

/// `tool_call`: the agent calls a tool (its complete input).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ToolCallEvent {
    pub tool_use_id: String,
    pub name: String,
    /// As [`ToolUse::input`].
    pub input: Value,
}

/// `tool_result`: the tool answered.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ToolResultEvent {
    pub tool_use_id: String,
    pub output: String,
    pub is_error: bool,
}

/// `turn_done`: the turn ended (also when interrupted: `stop_reason` `interrupted`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TurnDone {
    /// `end_turn`, `interrupted`, `max_tokens`, …; may be empty.
    pub stop_reason: String,
    /// Null when unknown.
    pub usage: Option<Usage>,
    /// The model that answered; null when unknown.
    pub model: Option<String>,
    /// The assistant message as stored; null when the service sent none.
    pub message: Option<Message>,
}

/// `turn_error`: the turn failed; the queue pauses.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TurnError {
    /// `provider`, `auth`, `cli_missing`, `cli_exited`, `protocol`, `timeout`, `internal`.
    pub code: String,
    /// Names the cause ("the model API answered 500 …").
    pub message: String,
    /// The failed assistant message as stored; null when none was.
    pub message_record: Option<Message>,
}

/// `queue_changed`: the pending queue changed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct QueueChanged {
    pub queue: PendingQueue,
}

/// `reset`: reload the conversation (`too_old`, `lagged`, `deleted`) or, on the list's stream,
/// the list (`lagged`, `unavailable`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Reset {
    pub reason: String,
}

/// An event's own object, under its kind's word.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum EventBody {
    MessageCreated(MessageCreated),
    TurnStarted(TurnStarted),
    TextDelta(TextDelta),
    ToolCall(ToolCallEvent),
    ToolResult(ToolResultEvent),
    TurnDone(TurnDone),
    TurnError(TurnError),
    QueueChanged(QueueChanged),
    Reset(Reset),
    ApprovalRequested(ApprovalRequested),
    ApprovalResolved(ApprovalResolved),
    FilesChanged(FilesChanged),
}

impl EventBody {
    /// Its kind.
    pub fn kind(&self) -> EventKind {
        match self {
            EventBody::MessageCreated(_) => EventKind::MessageCreated,
            EventBody::TurnStarted(_) => EventKind::TurnStarted,
            EventBody::TextDelta(_) => EventKind::TextDelta,
            EventBody::ToolCall(_) => EventKind::ToolCall,
            EventBody::ToolResult(_) => EventKind::ToolResult,
            EventBody::TurnDone(_) => EventKind::TurnDone,
            EventBody::TurnError(_) => EventKind::TurnError,
            EventBody::QueueChanged(_) => EventKind::QueueChanged,
            EventBody::Reset(_) => EventKind::Reset,
            EventBody::ApprovalRequested(_) => EventKind::ApprovalRequested,
            EventBody::ApprovalResolved(_) => EventKind::ApprovalResolved,
            EventBody::FilesChanged(_) => EventKind::FilesChanged,
        }
    }
}

/// One event of `GET /v1/conversations/{id}/events` (the `data:` of its SSE frame):
/// `{seq, conversation_id, at_ms, turn_id, kind, <kind>: {…}}`, e.g. `{"seq":42, …,
/// "kind":"text_delta","text_delta":{"text":"Hel"}}`. Build it with [`Event::new`], which keeps
/// `kind` and `body` in step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Event {
    /// Per conversation, strictly increasing (gaps allowed); the SSE `id:`.
    pub seq: u64,
    pub conversation_id: String,
    /// Unix milliseconds; null: unknown.
    pub at_ms: Option<i64>,
    /// Null outside a turn (`queue_changed`, `reset`).
    pub turn_id: Option<String>,
    /// Names the one other field the event holds.
    pub kind: EventKind,
    #[serde(flatten)]
    pub body: EventBody,
}

impl Event {
    /// The event with `kind` taken from `body`.
    pub fn new(
        seq: u64,
        conversation_id: String,
        at_ms: Option<i64>,
        turn_id: Option<String>,
        body: EventBody,
    ) -> Self {
        Self { seq, conversation_id, at_ms, turn_id, kind: body.kind(), body }
    }
}

/// The `deleted` event of `GET /v1/conversations/events`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ConversationGone {
    /// The deleted conversation's id.
    pub id: String,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn events_carry_their_kind_and_its_object_and_read_back() {
        let e = Event::new(4, "01C".into(), Some(9), None, EventBody::TextDelta(TextDelta { text: "Hel".into() }));
        let line = serde_json::to_string(&e).unwrap();
        assert_eq!(
            line,
            r#"{"seq":4,"conversation_id":"01C","at_ms":9,"turn_id":null,"kind":"text_delta","text_delta":{"text":"Hel"}}"#
        );
        assert_eq!(serde_json::from_str::<Event>(&line).unwrap(), e);
        for k in EventKind::ALL {
            assert_eq!(serde_json::to_value(k).unwrap(), json!(k.word()));
        }
        // A kind this build does not know is not an Event.
        let newer = json!({"seq": 5, "conversation_id": "01C", "at_ms": 1, "turn_id": null, "kind": "thinking", "thinking": {}});
        assert!(serde_json::from_value::<Event>(newer).is_err());
    }

    #[test]
    fn blocks_are_tagged_by_type_and_replies_omit_the_other_outcome() {
        let b = ContentBlock::ToolUse { tool_use: ToolUse { id: "t".into(), name: "Bash".into(), input: json!({}) } };
        let v = serde_json::to_value(&b).unwrap();
        assert_eq!(v, json!({"type": "tool_use", "tool_use": {"id": "t", "name": "Bash", "input": {}}}));
        assert_eq!(serde_json::from_value::<ContentBlock>(v).unwrap(), b);
        let r = SendMessageReply { pending: Some(PendingItem::default()), ..Default::default() };
        let v = serde_json::to_value(&r).unwrap();
        assert!(v.get("message").is_none() && v["pending"].is_object(), "{v}");
        let m = Message {
            blocks: vec![ContentBlock::Text { text: "a".into() }, b, ContentBlock::Text { text: "b".into() }],
            ..Default::default()
        };
        assert_eq!(m.text(), "ab");
    }
}
