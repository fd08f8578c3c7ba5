//! Constants of Coffer's MCP surface that are not JSON-RPC codes or headers: the `/mcp` stream
//! upgrade, media types of Streamable HTTP, and the names Coffer gives to what it exposes.

/// The `Upgrade` token that switches `GET /mcp` to a stream (RFC 9110 §7.8) carrying MCP's
/// stdio framing (newline-delimited JSON-RPC) both ways; the shim's fast link.
pub const STREAM_UPGRADE: &str = "coffer-mcp-stream";
/// The header a managed agent's shim sends on `/mcp` (and on the stream upgrade) naming the
/// conversation whose turn it serves. The gateway believes it only from a request authenticated
/// with the agent token, and only as a label for the invocation log: it grants nothing.
pub const CONVERSATION_HEADER: &str = "x-coffer-conversation";
/// Longest conversation id the gateway takes from [`CONVERSATION_HEADER`] (bytes).
pub const MAX_CONVERSATION_ID: usize = 128;

/// Whether `id` may be a conversation id sent in [`CONVERSATION_HEADER`]: 1 to
/// [`MAX_CONVERSATION_ID`] ASCII letters, digits, `-` and `_`.
pub fn valid_conversation_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_CONVERSATION_ID
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}
/// Header naming the profile a client's MCP session uses (issue 36 §1): sent by the shim
/// (`--profile NAME` / `COFFER_PROFILE`) or any `/mcp` client; `/mcp/p/{name}` says the same.
pub const PROFILE_HEADER: &str = "coffer-profile";
/// Path prefix of `/mcp` for one profile: `/mcp/p/{name}`.
pub const PROFILE_PATH_PREFIX: &str = "/mcp/p/";
/// The path of the MCP endpoint, for Streamable HTTP and the stream alike.
pub const PATH: &str = "/mcp";

/// The media type of an SSE body (WHATWG HTML §9.2).
pub const EVENT_STREAM: &str = "text/event-stream";
/// The media type of a JSON body.
pub const JSON: &str = "application/json";
/// The `Accept` of a Streamable HTTP POST: the server may answer with JSON or with an SSE stream
/// (MCP 2025-11-25, basic/transports §"Sending Messages to the Server").
pub const ACCEPT_POST: &str = "application/json, text/event-stream";

/// Prefix of the resource URIs Coffer exposes: `coffer://<server>/<original URI>`.
pub const URI_PREFIX: &str = "coffer://";
/// Separator between the server and the original name in an exposed tool or prompt name
/// (`<server>__<name>`).
pub const NAME_SEPARATOR: &str = "__";
