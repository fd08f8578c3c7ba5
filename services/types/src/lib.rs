//! Contracts shared by the daemon's services, the CLI and the shim that are not gRPC: wire
//! constants (header names, JSON-RPC codes, the stream upgrade token), vocabularies (outcome
//! names), the SSE parser and the settings table. gRPC contracts live in `coffer-proto`; this
//! crate has no dependencies so that the shim and the CLI stay light.
//!
//! Every constant here is the one definition of that name or number: code that speaks the wire
//! (daemon, CLI, shim, test support) imports it rather than writing the literal again. The
//! end-to-end tests' assertions still spell the wire out literally, on purpose: they check the
//! contract independently of these definitions.

pub mod channels;
pub mod header;
pub mod jsonrpc;
pub mod llm;
pub mod mcp;
pub mod outcome;
pub mod remote;
pub mod settings;
pub mod sse;
pub mod ui;
pub mod variables;

pub use outcome::Outcome;

/// The reserved server name under which Coffer's own built-in tools are exposed
/// (`coffer__search_tools`, …). No registered MCP server may take it; preferences may name it.
pub const BUILTIN_SERVER: &str = "coffer";

/// Longest MCP server name, in bytes (the names are ASCII).
pub const MAX_SERVER_NAME_LEN: usize = 24;

/// Checks an MCP server name: `^[a-z0-9][a-z0-9-]{0,23}$`, not [`BUILTIN_SERVER`]. The store
/// enforces it on every registry write; the edge and import use it to name servers.
///
/// # Errors
/// A message naming the rule that failed (the name shown clipped to 40 characters).
pub fn check_server_name(name: &str) -> Result<(), String> {
    let ok_chars = name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    let ok_first = name.bytes().next().is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if name.is_empty() || name.len() > MAX_SERVER_NAME_LEN || !ok_chars || !ok_first {
        let shown: String = if name.chars().count() <= 40 {
            name.to_owned()
        } else {
            format!("{}…", name.chars().take(40).collect::<String>())
        };
        return Err(format!(
            "invalid server name {shown:?}: use 1-{MAX_SERVER_NAME_LEN} characters a-z, 0-9 and '-', starting with a letter or digit"
        ));
    }
    if name == BUILTIN_SERVER {
        return Err(format!("server name \"{BUILTIN_SERVER}\" is reserved for Coffer's built-in tools"));
    }
    Ok(())
}

#[cfg(test)]
mod server_name_tests {
    use super::*;

    #[test]
    fn server_names() {
        for ok in ["a", "everything", "my-server-2", "0abc", "abcdefghijklmnopqrstuvwx"] {
            check_server_name(ok).unwrap();
        }
        for bad in ["", "A", "a_b", "a__b", "-a", "coffer", "abcdefghijklmnopqrstuvwxy", "a b", "é"] {
            assert!(check_server_name(bad).is_err(), "{bad}");
        }
        assert!(check_server_name("coffer").unwrap_err().contains("reserved"));
        assert!(check_server_name(&"x".repeat(50)).unwrap_err().contains(&format!("{}…", "x".repeat(40))));
    }
}

pub mod secrets;
