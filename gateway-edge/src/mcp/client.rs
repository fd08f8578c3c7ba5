//! Who the downstream client is, and who Coffer says it is to upstreams.
//!
//! A downstream client names itself in `initialize`'s `clientInfo` (MCP 2025-11-25
//! basic/lifecycle §Initialization) or, in the modern era, in every request's
//! `_meta["io.modelcontextprotocol/clientInfo"]` (MCP 2026-07-28). Either may be missing,
//! `null`, not an object, or lack its `name`/`version`, and an upstream SDK refuses an
//! `initialize` whose `Implementation` has no `name` and `version` strings. So Coffer never
//! mirrors the client's object upstream: every upstream sees Coffer's own, always valid
//! ([`ClientIdentity::upstream_info`]), and the client's name and version are kept apart for
//! what needs them (the source of a remembered fact, each invocation's record).
use serde_json::{Value, json};

/// Most characters of a client's name or version kept (longer ones are cut).
pub const MAX_FIELD_CHARS: usize = 128;

/// The `clientInfo.name` Coffer presents to every upstream.
pub const UPSTREAM_NAME: &str = "coffer";

/// The downstream client's `clientInfo` name and version, as strings (empty when it sent none,
/// or sent something that is not a string), each cut to [`MAX_FIELD_CHARS`] characters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientIdentity {
    pub name: String,
    pub version: String,
}

impl ClientIdentity {
    /// Reads `clientInfo` as the client sent it (any JSON value, or none).
    pub fn of(client_info: Option<&Value>) -> Self {
        let field = |key: &str| -> String {
            client_info
                .and_then(|c| c.get(key))
                .and_then(Value::as_str)
                .map(|s| s.trim().chars().take(MAX_FIELD_CHARS).collect())
                .unwrap_or_default()
        };
        Self { name: field("name"), version: field("version") }
    }

    /// The `clientInfo` (an MCP `Implementation`) Coffer presents to an upstream, in
    /// `initialize` or in a modern request's `_meta`: name [`UPSTREAM_NAME`], Coffer's version,
    /// and a `title` naming the downstream client when it gave a name.
    pub fn upstream_info(&self) -> Value {
        let title = if self.name.is_empty() { "Coffer".to_owned() } else { format!("Coffer (for {})", self.name) };
        json!({"name": UPSTREAM_NAME, "title": title, "version": coffer_runtime::VERSION})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whatever the client sent, upstreams get name and version strings.
    #[test]
    fn upstreams_always_get_a_valid_implementation() {
        let cases = [
            None,
            Some(json!(null)),
            Some(json!("claude")),
            Some(json!(42)),
            Some(json!({})),
            Some(json!({"name": null, "version": 3})),
            Some(json!({"name": "claude-code"})),
            Some(json!({"name": "claude-code", "version": "2.1.0"})),
        ];
        for c in &cases {
            let info = ClientIdentity::of(c.as_ref()).upstream_info();
            assert_eq!(info["name"], UPSTREAM_NAME, "{c:?}");
            assert_eq!(info["version"], coffer_runtime::VERSION, "{c:?}");
            assert!(info["title"].is_string(), "{c:?}");
        }
    }

    #[test]
    fn the_clients_name_and_version_are_kept_apart() {
        let id = ClientIdentity::of(Some(&json!({"name": " claude-code ", "version": "2.1.0"})));
        assert_eq!(id, ClientIdentity { name: "claude-code".into(), version: "2.1.0".into() });
        assert_eq!(id.upstream_info()["title"], "Coffer (for claude-code)");
        let odd = ClientIdentity::of(Some(&json!({"name": 7, "version": ["x"]})));
        assert_eq!(odd, ClientIdentity::default());
        assert_eq!(odd.upstream_info()["title"], "Coffer");
        let long = ClientIdentity::of(Some(&json!({"name": "n".repeat(1000), "version": "1"})));
        assert_eq!(long.name.chars().count(), MAX_FIELD_CHARS);
    }
}
