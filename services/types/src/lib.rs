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
pub mod settings;
pub mod sse;
pub mod ui;
pub mod variables;

pub use outcome::Outcome;

/// The reserved server name under which Coffer's own built-in tools are exposed
/// (`coffer__search_tools`, …). No registered MCP server may take it.
pub const BUILTIN_SERVER: &str = "coffer";

pub mod secrets;
