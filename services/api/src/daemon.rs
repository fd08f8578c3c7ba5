//! Bodies of the daemon routes: `GET /v1/health`, `POST /v1/daemon/stop`,
//! `POST /v1/daemon/services/{name}/restart`. (`GET /v1/status` is still described by the
//! edge's hand-written remainder: its `upstreams` and `sandbox` come from the gateway.)
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

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
