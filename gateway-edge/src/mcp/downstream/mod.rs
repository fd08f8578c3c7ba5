//! The client side of `/mcp`: the transports that carry a downstream client's messages to a
//! [`crate::mcp::Session`] and its answers back — Streamable HTTP ([`http`], with the stateless
//! 2026-07-28 path in `http/modern.rs`) and the shim's `/mcp` stream ([`stream`]) — the
//! transport-independent decoding of one message ([`message`]), what each protocol era asks of
//! requests and results ([`era`]), and the `subscriptions/listen` stream ([`listen`]).
//!
//! Boundary: the transports take the gateway ([`crate::mcp::Gateway`], an axum sub-state of the
//! edge's `AppState` by `FromRef`), never the whole `AppState`; the session and the upstreams
//! never import anything here but [`era`] (the rules of the client's protocol revision).
/// Body limit of `/mcp` (bytes).
pub const MCP_BODY_LIMIT: usize = 16 * 1024 * 1024;

pub mod era;
pub mod http;
pub mod listen;
pub mod message;
pub mod stream;
