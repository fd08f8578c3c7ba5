//! Bodies of the daemon routes: `GET /v1/health`, `GET /v1/status`, `POST /v1/daemon/stop`,
//! `POST /v1/daemon/services/{name}/restart`.
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

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

/// The daemon itself, in `GET /v1/status`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct DaemonInfo {
    /// The supervisor's pid.
    pub pid: u32,
    pub version: String,
    /// RFC 3339 UTC.
    #[schemars(extend("format" = "date-time"))]
    pub started_at: String,
    /// The REST port on 127.0.0.1.
    pub port: u32,
}

/// One of the daemon's services, in `GET /v1/status`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ServiceStatus {
    pub name: String,
    /// 0 when not running.
    pub pid: u32,
    #[schemars(extend("enum" = ["starting", "healthy", "restarting", "failed", "stopped"]))]
    pub state: String,
    /// Seconds.
    pub uptime_s: u64,
    pub restarts: u32,
    /// Null when none.
    pub last_error: Option<String>,
    /// Runs only while needed (coffer-callback: while a SeaTalk channel is enabled); `stopped`
    /// is then its normal state.
    pub on_demand: bool,
}

/// One registered upstream and its health, in `GET /v1/status`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct UpstreamStatus {
    pub name: String,
    pub enabled: bool,
    /// `stdio` or `http`.
    pub transport: String,
    /// ok: its last start succeeded and nothing failed since; idle: not started since the
    /// daemon started or its registration changed; unhealthy: an error stands (or its command
    /// cannot run now); disabled.
    #[schemars(extend("enum" = ["ok", "idle", "unhealthy", "disabled"]))]
    pub state: String,
    /// Sessions in which it runs now.
    pub running: u64,
    /// `ok`, `failed`, or null: not started since the daemon started.
    #[schemars(extend("enum" = ["ok", "failed", null]))]
    pub last_start: Option<String>,
    /// RFC 3339 UTC; null with `last_start`.
    #[schemars(extend("format" = "date-time"))]
    pub last_start_at: Option<String>,
    /// The standing error, with its cause (exit status and last stderr lines of a stdio
    /// server); null once a start, list or call succeeded.
    pub last_error: Option<String>,
    /// RFC 3339 UTC; null with `last_error` (and for a command that cannot run now).
    #[schemars(extend("format" = "date-time"))]
    pub last_error_at: Option<String>,
    /// `tools/<name>` listed more than once by its last list; only the first is offered.
    pub duplicates: Vec<String>,
    /// stdio: `on` (confined by the vault sandbox), `off` (its registration opted out),
    /// `unavailable` (no Landlock in this kernel: runs unconfined); null for http.
    #[schemars(extend("enum" = ["on", "off", "unavailable", null]))]
    pub sandbox: Option<String>,
    /// Its catalog's state, as `GET /v1/mcp/servers/{name}/catalog` answers it.
    pub catalog: Value,
}

/// The managed agents' vault sandbox: `on`, `off` (the agent's `chat.*_sandbox` setting is 0)
/// or `unavailable` (no Landlock).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AgentSandboxes {
    #[schemars(extend("enum" = ["on", "off", "unavailable"]))]
    pub claude_code: String,
    #[schemars(extend("enum" = ["on", "off", "unavailable"]))]
    pub codex: String,
}

/// The vault sandbox (Landlock) that keeps upstreams and agents out of COFFER_HOME.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Sandbox {
    /// The kernel's Landlock ABI version; null: no Landlock, nothing is confined.
    pub landlock_abi: Option<u32>,
    pub summary: String,
    pub agents: AgentSandboxes,
}

/// `GET /v1/status`: the daemon, its services, the upstreams, the sandbox and sync.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Status {
    pub daemon: DaemonInfo,
    pub services: Vec<ServiceStatus>,
    /// Every registered upstream, in name order, and its health.
    pub upstreams: Vec<UpstreamStatus>,
    pub sandbox: Sandbox,
    /// `GET /v1/sync/status`'s body; null while coffer-retrieval does not answer.
    pub sync: Option<SyncStatus>,
}
