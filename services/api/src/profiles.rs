//! Profiles (`/v1/mcp/profiles…`): a named view of the vault for a kind of client — which
//! servers and tools its MCP sessions see, in which tool mode, with which tool overrides.
//!
//! Rules every part of Coffer applies the same way:
//! - **A profile only narrows.** A tool disabled in the vault (server off, tool switched off) is
//!   hidden and refused whatever a profile says.
//! - **`default`** is the profile of a session that names none; as created by Coffer it selects
//!   everything in `full` mode (today's behaviour). It may be edited, not removed. Its
//!   `overrides` apply in every profile (a profile's own override of the same tool wins, field
//!   by field).
//! - **Selections** are lists of globs (`*` any run of characters, `?` one character, matched
//!   against the whole name, case-sensitive). An empty `include` selects everything; `exclude`
//!   wins over `include`.
use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The name of the profile a session gets when it names none.
pub const DEFAULT_PROFILE: &str = "default";

/// Longest profile name, in bytes. Names match `^[a-z0-9][a-z0-9-]{0,31}$`.
pub const MAX_PROFILE_NAME_LEN: usize = 32;

/// Checks a profile name: `^[a-z0-9][a-z0-9-]{0,31}$`.
///
/// # Errors
/// A message naming the rule that failed (the name shown clipped to 40 characters).
pub fn check_profile_name(name: &str) -> Result<(), String> {
    let ok_chars = name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    let ok_first = name.bytes().next().is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if name.is_empty() || name.len() > MAX_PROFILE_NAME_LEN || !ok_chars || !ok_first {
        let shown: String = name.chars().take(40).collect();
        return Err(format!(
            "profile name {shown:?} must be 1 to {MAX_PROFILE_NAME_LEN} lowercase letters, digits or '-', \
             starting with a letter or digit"
        ));
    }
    Ok(())
}

/// Which names a selection takes: those matching a glob of `include` (every name when it is
/// empty) and none of `exclude`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Selection {
    /// Globs; empty: every name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub include: Vec<String>,
    /// Globs; a name matching one is left out even when `include` takes it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude: Vec<String>,
}

/// How a profile's sessions are offered tools.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ToolMode {
    /// `tools/list` holds every selected tool with its full schema.
    #[default]
    Full,
    /// `tools/list` holds a few meta tools (search the tools, describe one, call one by name);
    /// the selected tools stay callable by their exposed names.
    Lazy,
}

/// MCP tool annotations set by an override (`readOnlyHint`, `destructiveHint`,
/// `idempotentHint`, `openWorldHint` of the MCP `Tool`); an absent field keeps the upstream's.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Annotations {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destructive: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotent: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_world: Option<bool>,
}

/// How one tool is shown to a profile's sessions; applied on the way out (`tools/list`) and
/// reversed on the way in (`tools/call`), invisible to the upstream.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolOverride {
    /// The exposed name instead of `<server>__<tool>`: `^[a-zA-Z0-9_-]{1,64}$` (valid for the
    /// strictest clients), unique among the profile's tools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Replaces the upstream's description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Added after the (upstream's or replaced) description, on a new paragraph.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description_append: Option<String>,
    /// Top-level parameters left out of the input schema. Only parameters that are optional
    /// (not in `required`) may be hidden; the upstream then applies its own default.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hide_params: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<Annotations>,
}

/// What a profile is made of: the body of `POST /v1/mcp/profiles` (with `name`) and of
/// `PUT /v1/mcp/profiles/{name}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProfileSpec {
    /// One line shown in lists.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    /// Upstream servers, by registered name.
    #[serde(default)]
    pub servers: Selection,
    /// Upstream tools, by exposed name (`<server>__<tool>`, before any override).
    #[serde(default)]
    pub tools: Selection,
    /// Coffer's own tools, by exposed name (`coffer__search_tools`, …).
    #[serde(default)]
    pub builtins: Selection,
    #[serde(default)]
    pub mode: ToolMode,
    /// Keyed by the tool's exposed name before any override (`<server>__<tool>`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub overrides: BTreeMap<String, ToolOverride>,
}

/// A stored profile (`GET /v1/mcp/profiles/{name}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Profile {
    pub name: String,
    #[serde(flatten)]
    pub spec: ProfileSpec,
    /// Optimistic-concurrency version (a write may name the version it read).
    pub version: u64,
    #[schemars(extend("format" = "date-time"))]
    pub updated_at: String,
}

/// The body of `POST /v1/mcp/profiles`: a name and a [`ProfileSpec`]'s fields beside it
/// (`{"name": "work", "servers": {"include": ["git"]}, …}`; spelled out rather than flattened so
/// an unknown field is refused).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NewProfile {
    /// `^[a-z0-9][a-z0-9-]{0,31}$` ([`check_profile_name`]).
    pub name: String,
    /// One line shown in lists; at most 4 KiB.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    /// Upstream servers, by registered name.
    #[serde(default)]
    pub servers: Selection,
    /// Upstream tools, by exposed name (`<server>__<tool>`, before any override).
    #[serde(default)]
    pub tools: Selection,
    /// Coffer's own tools, by exposed name (`coffer__search_tools`, …).
    #[serde(default)]
    pub builtins: Selection,
    #[serde(default)]
    pub mode: ToolMode,
    /// Keyed by the tool's exposed name before any override (`<server>__<tool>`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub overrides: BTreeMap<String, ToolOverride>,
}

impl NewProfile {
    /// The name and the spec.
    pub fn split(self) -> (String, ProfileSpec) {
        let NewProfile { name, description, servers, tools, builtins, mode, overrides } = self;
        (name, ProfileSpec { description, servers, tools, builtins, mode, overrides })
    }
}

impl Selection {
    /// Whether this selection takes everything (no include, no exclude).
    pub fn is_all(&self) -> bool {
        self.include.is_empty() && self.exclude.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_names_follow_the_rule() {
        for ok in ["default", "work", "a", "claude-code-2", &"x".repeat(32)] {
            assert!(check_profile_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "-x", "Work", "a b", "a_b", &"x".repeat(33), "é"] {
            assert!(check_profile_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_spec_with_nothing_set_is_the_default_view() {
        let s: ProfileSpec = serde_json::from_str("{}").unwrap();
        assert!(s.servers.is_all() && s.tools.is_all() && s.builtins.is_all());
        assert_eq!((s.mode, s.overrides.len()), (ToolMode::Full, 0));
        let e = serde_json::from_str::<ProfileSpec>(r#"{"mode":"sometimes"}"#).unwrap_err().to_string();
        assert!(e.contains("sometimes"), "{e}");
    }

    #[test]
    fn a_profile_reads_back_what_it_wrote() {
        let mut spec = ProfileSpec { mode: ToolMode::Lazy, ..Default::default() };
        spec.tools.exclude.push("git__*".into());
        spec.overrides
            .insert("time__get_current_time".into(), ToolOverride { name: Some("now".into()), ..Default::default() });
        let p = Profile { name: "work".into(), spec, version: 3, updated_at: "2026-12-07T00:00:00Z".into() };
        let text = serde_json::to_string(&p).unwrap();
        assert_eq!(serde_json::from_str::<Profile>(&text).unwrap(), p, "{text}");
    }
}
