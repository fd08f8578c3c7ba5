//! Contracts shared by the daemon's services, the CLI and the shim that are not gRPC: wire
//! constants (header names, JSON-RPC codes, the stream upgrade token), vocabularies (outcome
//! names) and the settings table. gRPC contracts live in `coffer-proto`; this crate has no
//! dependencies so that the shim and the CLI stay light.

/// The reserved server name under which Coffer's own built-in tools are exposed
/// (`coffer__search_tools`, …). No registered MCP server may take it.
pub const BUILTIN_SERVER: &str = "coffer";

pub mod secrets;
