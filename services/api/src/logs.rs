//! Bodies of the log routes: `GET /v1/invocations` (and its live stream), `GET /v1/audit`,
//! `GET /v1/logs/{service}` and `GET /v1/mcp/servers/{name}/log`.
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The MCP client that made a call, as its `clientInfo` named it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct InvocationClient {
    pub name: String,
    pub version: String,
}

/// The conversation whose agent turn made a call.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct InvocationConversation {
    /// Open it at `/ui/chat?c=ID` or `GET /v1/conversations/{id}`.
    pub id: String,
    /// Its title; empty when it has none or was deleted since.
    pub title: String,
}

/// What an internal-agent run used (`coffer__ask`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct InvocationUsage {
    /// The LLM connection's name.
    pub connection: String,
    pub model: String,
    /// Summed over the run's model requests.
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Model requests made.
    pub iterations: u32,
}

/// One call through the gateway (an item of `GET /v1/invocations`, the data of an `invocation`
/// event of `GET /v1/invocations/events`). Never arguments or results.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Invocation {
    pub id: i64,
    /// RFC 3339 UTC with milliseconds.
    #[schemars(extend("format" = "date-time"))]
    pub at: String,
    /// The exposed name or URI.
    pub target: String,
    /// `tools/call`, `resources/read` or `prompts/get`.
    #[schemars(extend("enum" = ["tools/call", "resources/read", "prompts/get"]))]
    pub method: String,
    pub server: String,
    pub session_id: String,
    /// Milliseconds.
    pub duration_ms: u64,
    #[schemars(extend("enum" = ["ok", "upstream_error", "disabled", "timeout", "unreachable", "invalid", "cancelled"]))]
    pub outcome: String,
    pub trace_id: String,
    /// Who called: `mcp` for an MCP client session, `api`/`cli`/`ui` for REST
    /// (`X-Coffer-Actor`), the caller's actor for the tool broker (`agent`, `channel:<name>`, …).
    pub actor: String,
    /// The MCP client that made the call, as its `clientInfo` (in `initialize`, or a modern
    /// request's `_meta`) named it; null when it gave no name or version, and for broker
    /// sessions (the actor says who called).
    pub client: Option<InvocationClient>,
    /// The conversation whose agent turn made the call (a managed agent's calls through its
    /// shim: Claude Code, Codex); null for every other caller and for calls recorded before
    /// Coffer kept it (a daemon that predates the field omits it: read as null).
    #[serde(default)]
    pub conversation: Option<InvocationConversation>,
    /// The profile of the MCP session that made the call (issue 36 §1): `default` when its
    /// client named none; absent for in-house callers (REST, channels, the broker) and for calls
    /// recorded before Coffer kept it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// What the internal agent's run used, for `coffer__ask`; null for every other call.
    pub usage: Option<InvocationUsage>,
}

/// `event: lagged` of `GET /v1/invocations/events`: this client fell behind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Lagged {
    /// Invocations it missed (list the log to catch up).
    pub missed: u64,
}

/// One audit log entry (an item of `GET /v1/audit`): who changed what.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AuditEntry {
    pub id: i64,
    /// RFC 3339 UTC.
    #[schemars(extend("format" = "date-time"))]
    pub at: String,
    /// The label the client gave (`X-Coffer-Actor`); `auth` says how it was authenticated.
    #[schemars(extend("enum" = ["cli", "api", "ui", "mcp", "agent", "channel", "daemon"]))]
    pub actor: String,
    /// How the request was authenticated, found by the daemon (never taken from the request):
    /// `token`, `session:<first 12 hex digits of the SHA-256 of the web session id>`, or
    /// `internal:<service>` for a service's own action (`internal:chat` for a channel's
    /// pairing). Empty for entries written before this was recorded.
    pub auth: String,
    /// e.g. `server.create`, `credential.set`, `backup.create`, `maintenance.prune`.
    pub action: String,
    pub target: String,
    #[schemars(extend("enum" = ["ok", "error"]))]
    pub outcome: String,
    pub trace_id: String,
    /// A JSON object (never a secret); a row whose detail is not JSON has it as a string.
    #[schemars(extend("type" = "object"))]
    pub detail: Value,
}

/// `GET /v1/logs/{service}`: the last lines of a service's newest log file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct LogTail {
    pub service: String,
    /// The file read (absolute); null when the service has written none yet.
    pub file: Option<String>,
    /// Oldest first; empty when there is no file.
    pub lines: Vec<String>,
}

/// `GET /v1/mcp/servers/{name}/log`: the last lines an upstream's stdio process wrote on stderr.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ServerLogTail {
    pub server: String,
    /// The file read (absolute); null while there is none (an HTTP server, the built-in
    /// `coffer`, a server never started).
    pub file: Option<String>,
    /// Oldest first, credential values redacted.
    pub lines: Vec<String>,
}
