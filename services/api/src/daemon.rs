//! Bodies of the daemon routes: `GET /v1/health`, `GET /v1/status`, `POST /v1/daemon/stop`,
//! `POST /v1/daemon/services/{name}/restart`.
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::servers::{SandboxState, UpstreamStatus};
use crate::sync::SyncStatus;

/// `GET /v1/health`: the daemon is up.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Health {
    /// Always `ok`.
    #[schemars(extend("const" = "ok"))]
    pub status: String,
    /// The supervisor's pid (the one in `daemon.json`).
    pub pid: u32,
    pub version: String,
    /// RFC 3339.
    #[schemars(extend("format" = "date-time"))]
    pub started_at: String,
}

/// `POST /v1/daemon/stop` → 202: the daemon stops its services in order and exits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Stopping {
    /// Always true.
    pub stopping: bool,
}

/// `POST /v1/daemon/services/{name}/restart` → 200: the service after its restart.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ServiceRestart {
    pub name: String,
    pub pid: u32,
    /// `starting`, `healthy`, `restarting`, `failed` or `stopped`.
    pub state: String,
    pub restarts: u32,
}

/// `POST /v1/daemon/services/gateway/restart` → 202: the gateway restarts right after answering.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Restarting {
    /// Always `gateway`.
    pub restarting: String,
}

/// The supervisor, in `GET /v1/status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct DaemonInfo {
    /// The supervisor's pid (the one in `daemon.json`).
    pub pid: u32,
    pub version: String,
    /// RFC 3339.
    #[schemars(extend("format" = "date-time"))]
    pub started_at: String,
    /// The loopback TCP port of the edge.
    pub port: u32,
}

/// One internal service in `GET /v1/status`'s `services`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ServiceStatus {
    pub name: String,
    /// 0 when not running.
    pub pid: u32,
    /// `starting`, `healthy`, `restarting`, `failed` or `stopped`.
    #[schemars(extend("enum" = ["starting", "healthy", "restarting", "failed", "stopped"]))]
    pub state: String,
    /// Seconds since it started.
    pub uptime_s: u64,
    pub restarts: u32,
    /// Its last error; null when none.
    pub last_error: Option<String>,
    /// Runs only while needed (coffer-callback: while a SeaTalk channel is enabled); `stopped`
    /// is then its normal state.
    pub on_demand: bool,
}

/// Each coding agent's vault sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AgentSandboxes {
    /// `off`: `chat.claude_code_sandbox` is 0; `unavailable`: no Landlock.
    pub claude_code: SandboxState,
    /// `off`: `chat.codex_sandbox` is 0; `unavailable`: no Landlock.
    pub codex: SandboxState,
}

/// The vault sandbox (Landlock) that keeps upstreams and agents out of COFFER_HOME. Each
/// upstream's own state is its `upstreams[].sandbox`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SandboxStatus {
    /// The kernel's Landlock ABI version; null: no Landlock, nothing is confined.
    pub landlock_abi: Option<u32>,
    /// One sentence for people.
    pub summary: String,
    pub agents: AgentSandboxes,
}

/// `GET /v1/status`: the daemon, its services, every registered upstream, the vault sandbox
/// and sync.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Status {
    pub daemon: DaemonInfo,
    pub services: Vec<ServiceStatus>,
    /// Every registered upstream and its health, in name order.
    pub upstreams: Vec<UpstreamStatus>,
    pub sandbox: SandboxStatus,
    /// `GET /v1/sync/status`'s body; null while coffer-retrieval does not answer.
    pub sync: Option<SyncStatus>,
    /// The MCP client sessions open now (issue 36 §1: each with its profile), oldest activity
    /// last; absent from a daemon that predates it (read as empty).
    #[serde(default)]
    pub sessions: Vec<McpSessionStatus>,
}

/// One MCP client session in `GET /v1/status`'s `sessions`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct McpSessionStatus {
    /// The first 8 characters of its id (the invocation log's `session_id` starts with them;
    /// the whole id is the client's to present, never shown).
    pub id: String,
    /// The client's `clientInfo` name and version (empty when it gave none).
    pub client_name: String,
    pub client_version: String,
    /// The profile the session uses (`default` when its client named none).
    pub profile: String,
    /// The MCP revision it speaks.
    pub protocol_version: String,
    /// Seconds since its last request.
    pub idle_s: u64,
}
