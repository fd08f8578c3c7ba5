//! Bodies of `/v1/agent-sessions`, `/v1/conversations/import` and `/v1/projects` (issue 34 §5):
//! the user's own Claude Code and Codex sessions, importing one as a conversation, and the
//! project picker's working directories. Times are `*_ms`, Unix milliseconds.
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One of the user's own agent sessions, read from its transcript.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AgentSession {
    /// `claude_code` or `codex`.
    pub agent_key: String,
    /// Claude Code's session id / Codex's thread id (what `POST /v1/conversations/import` takes).
    pub session_id: String,
    /// The folder it ran in; null when the transcript does not say.
    pub cwd: Option<String>,
    /// The first user text, one line, at most 200 characters; null when none was read.
    pub first_prompt: Option<String>,
    /// The transcript's modification time, Unix ms.
    pub last_activity_ms: i64,
    /// User prompts and assistant replies read (a lower bound when `partial`).
    pub message_count: u64,
    /// The transcript's size, bytes.
    pub size_bytes: u64,
    /// Only the first 8 MiB of the transcript were read for this summary.
    pub partial: bool,
    /// The conversation already bound to this session (imported, or started in Coffer); null
    /// when none.
    pub conversation_id: Option<String>,
}

/// `GET /v1/agent-sessions`: newest first.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AgentSessionList {
    pub items: Vec<AgentSession>,
    /// Transcript files skipped: unreadable, not a regular file, or holding no session.
    pub skipped_files: u32,
    /// Transcript lines skipped: malformed, or over 1 MiB.
    pub skipped_lines: u64,
    /// More transcripts exist than `limit`.
    pub truncated: bool,
}

/// `POST /v1/conversations/import`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionImport {
    /// `claude_code` or `codex`.
    pub agent_key: String,
    /// A session id of `GET /v1/agent-sessions` (`[A-Za-z0-9_-]`, 1-128 characters).
    pub session_id: String,
    /// At most 200 characters; default: the session's first prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// Default: the agent's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

/// A working directory the project picker offers.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Project {
    /// An absolute, existing directory.
    pub path: String,
    /// Its last component.
    pub name: String,
    /// It holds a `.git`.
    pub git: bool,
    /// The newest conversation or agent session in it, Unix ms; null when only found under the
    /// projects root.
    pub last_used_ms: Option<i64>,
    /// Where it comes from: `conversation`, `claude_code`, `codex`, `git`.
    pub sources: Vec<String>,
}

/// `GET /v1/projects`: recently used folders (newest first), then git repositories under the
/// projects root.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ProjectList {
    pub items: Vec<Project>,
    /// The folder searched for git repositories (setting `chat.projects_root`, default the
    /// user's home); null when there is none.
    pub root: Option<String>,
}
