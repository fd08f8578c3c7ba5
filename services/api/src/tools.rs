//! Bodies of `/v1/tools…` and the capability toggles of `/v1/mcp/servers/{name}/capabilities`.
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// One tool of the aggregated list (`GET /v1/tools`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Tool {
    /// Exposed name (`<server>__<tool>`).
    pub name: String,
    pub server: String,
    pub original_name: String,
    pub title: Option<String>,
    pub description: Option<String>,
    pub enabled: bool,
}

/// `POST /v1/tools/call`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolCall {
    /// Exposed name.
    pub name: String,
    /// The tool's arguments (a JSON object).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<Map<String, Value>>,
}

/// The answer of `POST /v1/tools/call`: the upstream's MCP `CallToolResult` (`{content: […],
/// structuredContent?, isError?}`), verbatim; a tool's own error is `isError: true`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(transparent)]
pub struct CallToolResult(pub Map<String, Value>);

/// `{"enabled": bool}`: the body of every toggle (`PATCH /v1/tools/{name}`, `PUT
/// …/capabilities/…`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EnabledFlag {
    pub enabled: bool,
}

/// The answer of `PATCH /v1/tools/{name}`: the tool's new state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ToolState {
    pub name: String,
    pub server: String,
    pub original_name: String,
    pub enabled: bool,
}

/// The answer of `POST /v1/mcp/refresh`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Refreshed {
    /// Sessions told their lists changed.
    pub sessions: u64,
}

/// An explicit enabled flag of one capability (`GET /v1/mcp/servers/{name}/preferences`); a
/// capability without one is enabled.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Preference {
    pub server: String,
    /// `tool`, `prompt` or `resource`.
    #[schemars(extend("enum" = ["tool", "prompt", "resource"]))]
    pub kind: String,
    /// The capability's original (unprefixed) name.
    pub name: String,
    pub enabled: bool,
    #[schemars(extend("format" = "date-time"))]
    pub updated_at: String,
}

/// The answer of the capability toggles (`PUT /v1/mcp/servers/{name}/capabilities/…`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PreferenceSet {
    pub server: String,
    /// `tool`, `prompt` or `resource`.
    #[schemars(extend("enum" = ["tool", "prompt", "resource"]))]
    pub kind: String,
    pub name: String,
    pub enabled: bool,
}
