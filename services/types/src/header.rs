//! HTTP header names (and the one cookie) of Coffer's public edge, and the gRPC metadata keys of
//! its internal calls. All lowercase: that is how HTTP/2 and gRPC metadata carry them, and what
//! `http::HeaderName::from_static` accepts; HTTP/1.1 compares them case-insensitively
//! (RFC 9110 §5.1).

/// The public token from `daemon.json`, on every request to the edge but `GET /v1/health`
/// (`Authorization: Bearer <token>` is accepted too).
pub const TOKEN: &str = "x-coffer-token";
/// The trace id (16 lowercase hex digits) on every edge response, and in the gRPC metadata of
/// the internal calls a request causes, so every log line it caused carries the same id.
pub const TRACE: &str = "x-coffer-trace";
/// Who acts, for the audit log: `cli`, `api`, `ui`, `mcp`, `agent` or `channel` (default `api`).
pub const ACTOR: &str = "x-coffer-actor";
/// gRPC metadata key saying how the request that caused an internal call was authenticated
/// (`token`, `session:<12 hex>`, set by the edge; see `coffer_runtime::grpc::current_auth`).
/// Never sent to or accepted from outside: the edge sets it, internal peers forward it.
pub const AUTH: &str = "x-coffer-auth";
/// gRPC metadata key of the per-run internal token on every internal call (never on disk).
pub const INTERNAL_TOKEN: &str = "x-coffer-internal-token";
/// The cookie set by the web page's one-time login; with [`SESSION_KEY`] (or, on an event
/// stream, a [`STREAM_TICKET`]) it is accepted instead of [`TOKEN`]. Alone it authenticates
/// nothing: cookies are not port-scoped, so every local port receives it.
pub const SESSION_COOKIE: &str = "coffer_session";
/// [`SESSION_COOKIE`] as set for a console opened at an `https://` origin of
/// `ui.allowed_hosts`: `Secure`, and the `__Host-` prefix (RFC 6265bis §4.1.3.2) makes the
/// browser keep it only when set by a secure page of that very host, with `Path=/` and no
/// `Domain`, so no page of another port or subdomain can set or shadow it.
pub const SECURE_SESSION_COOKIE: &str = "__Host-coffer_session";
/// The web session's second secret (64 hex characters), handed to the page once at login and
/// kept in the console origin's `localStorage`; sent with the cookie on every API call.
pub const SESSION_KEY: &str = "x-coffer-session-key";
/// The query parameter carrying a single-use stream ticket (`POST /v1/ui/stream-tickets`) on
/// an event-stream `GET`, which `EventSource` cannot add a header to.
pub const STREAM_TICKET: &str = "ticket";

/// MCP 2025-11-25, basic/transports §Streamable HTTP "Session Management": the session id a
/// server returns on the `initialize` answer and the client sends on every later request.
pub const MCP_SESSION_ID: &str = "mcp-session-id";
/// MCP 2025-11-25, basic/transports §"Protocol Version Header": the negotiated revision, on
/// every request after `initialize`.
pub const MCP_PROTOCOL_VERSION: &str = "mcp-protocol-version";
/// Names one MCP client connection to `/mcp` when its protocol has no session (MCP 2026-07-28):
/// a modern client that sends it gets a gateway session (and upstream processes) of its own per
/// value, instead of one per client identity. Any opaque string up to 128 bytes.
pub const CONNECTION_ID: &str = "x-coffer-connection";
/// WHATWG HTML §9.2 (Server-Sent Events): the id of the last event seen, to resume a stream
/// (MCP 2025-11-25, basic/transports §"Resumability and Redelivery").
pub const LAST_EVENT_ID: &str = "last-event-id";
