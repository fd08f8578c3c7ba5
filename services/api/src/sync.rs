//! Request bodies of `/v1/sync…`. (Answers are still described by the edge's hand-written
//! remainder.)
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
