//! Bodies of `/v1/settings…`: the daemon's flat map of string settings.
use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `GET /v1/settings`, and the answer of `PATCH /v1/settings`: every stored setting.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "Settings")]
pub struct SettingsValues {
    /// Keys sorted.
    pub values: BTreeMap<String, String>,
}

/// `PATCH /v1/settings`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SettingsPatch {
    /// Keys (1-128 bytes) to set, with their (string) values.
    #[serde(default)]
    pub set: BTreeMap<String, String>,
    /// Keys to remove; removing an absent key is not an error.
    #[serde(default)]
    pub remove: Vec<String>,
    /// Store keys of `set` that are not settings Coffer reads; without it they are refused.
    /// Values of the table's keys are checked either way.
    #[serde(default)]
    pub force: bool,
}

/// One row of the settings table (`GET /v1/settings/table`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "SettingInfo")]
pub struct SettingInfo {
    pub key: String,
    /// The section it belongs to: `chat`, `gateway`, `knowledge`, `channels`, `sync` or
    /// `advanced` (in that display order; the table lists each section's rows together).
    #[schemars(extend("enum" = ["chat", "gateway", "knowledge", "channels", "sync", "advanced"]))]
    pub group: String,
    /// The section's heading for people (`Chat and agents`).
    pub group_title: String,
    /// One plain sentence about the section (no markup).
    pub group_help: String,
    /// A short name for people (`Tool call time limit`): never the key, no markup.
    pub label: String,
    /// `integer` or `text`.
    #[serde(rename = "type")]
    #[schemars(extend("enum" = ["integer", "text"]))]
    pub ty: String,
    /// The value while the key is not set (`""`: empty text).
    pub default: String,
    /// Least value (integer) or bytes (text).
    pub min: u64,
    /// Largest value (integer) or bytes (text).
    pub max: u64,
    pub unit: String,
    /// What it governs, one line; may hold `code` spans in backticks (keys, paths, commands).
    pub description: String,
}
