//! JSON-RPC 2.0 error codes Coffer sends or looks for: the standard ones (JSON-RPC 2.0 §5.1)
//! and the implementation-defined server errors (-32000 to -32099) Coffer gives a meaning.

/// Invalid JSON was received.
pub const PARSE_ERROR: i64 = -32700;
/// The JSON sent is not a valid request object (also: a message over a frame limit).
pub const INVALID_REQUEST: i64 = -32600;
/// The method does not exist or is not available.
pub const METHOD_NOT_FOUND: i64 = -32601;
/// Invalid method parameters (also: an unknown tool or server name).
pub const INVALID_PARAMS: i64 = -32602;
/// Internal JSON-RPC error.
pub const INTERNAL_ERROR: i64 = -32603;

/// `TOOL_DISABLED`: policy refuses the server or capability; no upstream was contacted.
pub const TOOL_DISABLED: i64 = -32000;
/// An upstream could not be started, did not list in time, or died with the call in flight
/// (from the gateway); the message names the upstream.
pub const UPSTREAM_UNAVAILABLE: i64 = -32001;
/// The same code from the shim: the daemon cannot be reached, or the session was lost with the
/// request in flight; the message says whether the request may be retried.
pub const DAEMON_UNAVAILABLE: i64 = UPSTREAM_UNAVAILABLE;
/// The upstream did not answer within the call timeout (it was sent
/// `notifications/cancelled`).
pub const UPSTREAM_TIMEOUT: i64 = -32002;
/// The request was cancelled (`notifications/cancelled`), as LSP and the MCP SDKs use it; what a
/// Streamable HTTP POST, which must be answered, gets for a cancelled call.
pub const REQUEST_CANCELLED: i64 = -32800;
