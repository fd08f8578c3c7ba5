//! Bodies of `/v1/sync…`: sync across machines on git.
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `POST /v1/sync/init`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SyncInit {
    /// The git remote (1-2048 bytes).
    pub remote: String,
    /// This machine's name in the sync (commit authors, conflict sibling names), `[a-z0-9-]`
    /// after lowercasing, at most 32. Default: the name chosen at an earlier `init`, else the
    /// host name with 4 random hex digits (`vm-3fa2`), so two machines with the same host name
    /// differ; the `sync.machine_name` setting overrides it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine_name: Option<String>,
}

/// Files or vault entries a sync moved one way.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "SyncCounts")]
pub struct Counts {
    pub added: u32,
    pub changed: u32,
    pub removed: u32,
}

/// What a sync moved one way (pushed or pulled).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "SyncDirection")]
pub struct Direction {
    pub files: Counts,
    pub vault: Counts,
    /// Paths relative to COFFER_HOME, at most 200.
    pub paths: Vec<String>,
}

/// How a conflict was settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ConflictKind {
    /// A file edited on both sides: both versions kept.
    BothKept,
    /// A vault entry changed on both sides: the newer kept, the other in the audit log.
    NewerKept,
    /// A pulled removal refused: the `default` profile cannot be removed, so this machine's
    /// was kept (and pushed back); the refusal is in the audit log.
    LocalKept,
    /// A kind this build does not know.
    Unknown,
}

/// A conflict a sync settled.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SyncConflict {
    pub kind: ConflictKind,
    /// Relative to COFFER_HOME.
    pub path: String,
    /// `both_kept`: the other version's file.
    pub sibling: String,
    pub detail: String,
}

/// The answer of `POST /v1/sync` and `POST /v1/sync/init`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SyncReport {
    pub pushed: Direction,
    pub pulled: Direction,
    pub conflicts: Vec<SyncConflict>,
    /// HEAD after the sync.
    pub commit: String,
    /// Unix milliseconds; null: unknown.
    pub finished_ms: Option<i64>,
    /// Credentials the synced vault references that have no value here.
    pub missing_credentials: Vec<String>,
    /// Without a password.
    pub remote: String,
}

/// The sync worker (`sync.auto`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Worker {
    Off,
    Idle,
    Waiting,
    Syncing,
    BackingOff,
}

impl Worker {
    /// Its word on the wire.
    pub fn word(self) -> &'static str {
        match self {
            Worker::Off => "off",
            Worker::Idle => "idle",
            Worker::Waiting => "waiting",
            Worker::Syncing => "syncing",
            Worker::BackingOff => "backing_off",
        }
    }
}

/// `GET /v1/sync/status` (and `/v1/status`'s `sync`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SyncStatus {
    pub initialized: bool,
    pub remote: String,
    /// Local commits the remote lacks (as of the last fetch).
    pub ahead: u32,
    pub behind: u32,
    /// Unix milliseconds; null: never.
    pub last_sync_ms: Option<i64>,
    /// Of the last attempt; null when it succeeded.
    pub last_error: Option<String>,
    /// Sibling files a conflict left, until the user removes them.
    pub conflicts: Vec<SyncConflict>,
    pub worker: Worker,
    /// Unix milliseconds of the worker's next sync; null: none planned.
    pub next_attempt_ms: Option<i64>,
    pub machine: String,
    pub missing_credentials: Vec<String>,
    /// A sync runs now.
    pub running: bool,
    /// Consecutive failed attempts.
    pub failures: u32,
}
