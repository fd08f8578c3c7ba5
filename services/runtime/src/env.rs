//! Names of the environment variables through which the supervisor configures its children.
//!
//! A child learns everything it needs from these; none of them is ever passed to a third-party
//! child (upstream MCP server, agent CLI): [`crate::spawn`] strips every `COFFER_*` variable.

/// Root of Coffer's files; default `~/.coffer`.
pub const HOME: &str = "COFFER_HOME";
/// Public port: exact port to bind (fails if taken).
pub const PORT: &str = "COFFER_PORT";
/// Public port range `START-END` tried in order when `COFFER_PORT` is unset (default 8000-8009).
pub const PORT_RANGE: &str = "COFFER_PORT_RANGE";
/// This service's own per-run internal token (64 hex characters), presented on every internal
/// gRPC call it makes; each service gets a different one. Never written to disk.
pub const INTERNAL_TOKEN: &str = "COFFER_INTERNAL_TOKEN";
/// SHA-256 digests of every identity's internal token, `name=hex,name=hex,…` (e.g.
/// `supervisor=…,store=…,gateway=…`): how a receiver tells its callers apart without holding
/// their tokens. See [`crate::identity`].
pub const PEER_DIGESTS: &str = "COFFER_PEER_DIGESTS";
/// The runtime a service runs on, from the supervisor's table: `multi-thread` (default) or
/// `current-thread`. See [`crate::service::Flavor`].
pub const FLAVOR: &str = "COFFER_FLAVOR";
/// Public token (hex) the edge checks; also in daemon.json.
pub const PUBLIC_TOKEN: &str = "COFFER_PUBLIC_TOKEN";
/// The agent token (hex) the edge accepts on `/mcp` only; also in `agent-access/agent.json`
/// (see [`crate::home::CofferHome::agent_json`]). Given to the edge only.
pub const AGENT_TOKEN: &str = "COFFER_AGENT_TOKEN";
/// Set (to `1`) in the environment of a `coffer-mcp-shim` that a managed agent starts (Coffer
/// writes it into the agents' MCP configs): the shim connects with `agent-access/agent.json`
/// (the `/mcp`-only agent token), never reads `daemon.json` and never starts a daemon.
pub const AGENT_SHIM: &str = "COFFER_AGENT_SHIM";
/// The conversation whose agent started this `coffer-mcp-shim` (Coffer writes it into the MCP
/// config of each agent turn, beside [`AGENT_SHIM`]); the shim sends it to `/mcp` as
/// `X-Coffer-Conversation` (`coffer_types::mcp::CONVERSATION_HEADER`), and the gateway records it
/// on the agent's calls so Activity can name the conversation.
pub const CONVERSATION: &str = "COFFER_CONVERSATION";
/// The profile a `coffer-mcp-shim`'s client uses (issue 36 §1), when its `--profile NAME`
/// argument does not name one: sent to `/mcp` as `Coffer-Profile`
/// (`coffer_types::mcp::PROFILE_HEADER`).
pub const PROFILE: &str = "COFFER_PROFILE";
/// File descriptor number of the service's inherited internal gRPC listener (every service).
pub const LISTEN_FD: &str = "COFFER_LISTEN_FD";
/// File descriptor number of the inherited public HTTP listener (the gateway only).
pub const PUBLIC_FD: &str = "COFFER_PUBLIC_FD";
/// Descriptor number of the edge's Unix-domain listener (`COFFER_HOME/gateway.sock`), set for
/// the gateway when the supervisor bound one.
pub const SOCKET_FD: &str = "COFFER_SOCKET_FD";
/// Addresses (`127.0.0.1:port`) of the internal services.
pub const STORE_ADDR: &str = "COFFER_STORE_ADDR";
pub const CHAT_ADDR: &str = "COFFER_CHAT_ADDR";
pub const RETRIEVAL_ADDR: &str = "COFFER_RETRIEVAL_ADDR";
/// `coffer-callback`'s internal listener (health only; its public one is `COFFER_CALLBACK_PORT`).
pub const CALLBACK_ADDR: &str = "COFFER_CALLBACK_ADDR";
/// `coffer-callback`'s public loopback port (default 8787), where a tunnel points. Set in the
/// daemon's environment (the supervisor passes it on to its services) or in the
/// `StartService` env coffer-chat gives coffer-callback.
pub const CALLBACK_PORT: &str = "COFFER_CALLBACK_PORT";
/// `coffer-callback`'s signing secrets: a JSON object, channel name → the channel's SeaTalk
/// signing secret. Only in coffer-callback's environment (coffer-chat's `StartService` env, kept
/// in the supervisor's memory); never on disk, never logged.
pub const CALLBACK_SECRETS: &str = "COFFER_CALLBACK_SECRETS";
/// Extra host names `coffer-callback` accepts in `Host` besides loopback (comma-separated,
/// e.g. the tunnel's public name `bot.example.com`); see coffer-callback's docs.
pub const CALLBACK_HOSTS: &str = "COFFER_CALLBACK_HOSTS";
pub const GATEWAY_GRPC_ADDR: &str = "COFFER_GATEWAY_GRPC_ADDR";
pub const CONTROL_ADDR: &str = "COFFER_CONTROL_ADDR";
/// The public port, for the edge's Origin check.
pub const PUBLIC_PORT: &str = "COFFER_PUBLIC_PORT";
/// `tracing` filter for every process (default `info`).
pub const LOG: &str = "COFFER_LOG";
/// Largest log file in MiB before it is rolled (1-1024, default 10). See [`crate::rolling`].
pub const LOG_MAX_FILE_MB: &str = "COFFER_LOG_MAX_FILE_MB";
/// Cap of all log files in `logs/` in MiB (1-102400, default 100). See [`crate::rolling`].
pub const LOG_MAX_TOTAL_MB: &str = "COFFER_LOG_MAX_TOTAL_MB";
/// The edge's connection cap, TCP port and Unix socket together (16-65536, default 1024). See
/// [`crate::limits`].
pub const MAX_CONNECTIONS: &str = "COFFER_MAX_CONNECTIONS";
/// Longest a request head may take on every Coffer listener (the edge, coffer-callback's port,
/// each internal gRPC listener), milliseconds (100-600000, default 10000). See
/// [`crate::limits::Limits::with_env_head_timeout`].
pub const HEAD_TIMEOUT_MS: &str = "COFFER_HEAD_TIMEOUT_MS";
/// How often the edge pings `coffer-retrieval` while a call to it is in flight, milliseconds
/// (100-60000, default 1000); a ping unanswered for twice that fails the call as unavailable
/// (a stopped or hung service). See the gateway's `clients::retrieval::keepalive`.
pub const RETRIEVAL_PING_MS: &str = "COFFER_RETRIEVAL_PING_MS";
/// Time slice (µs) the relays on the request path ask the scheduler for; `0`: the kernel's
/// default. See [`crate::sched`].
pub const SCHED_SLICE_US: &str = "COFFER_SCHED_SLICE_US";
/// Nice value (0..=19) of background services (the store); `0`: left as started. See
/// [`crate::sched::background_priority`].
pub const BACKGROUND_NICE: &str = "COFFER_BACKGROUND_NICE";
/// Path of the `coffer-daemon` binary to spawn (overrides the lookup next to the executable).
pub const DAEMON_BIN: &str = "COFFER_DAEMON_BIN";
/// Supervisor pid, so children know who started them.
pub const SUPERVISOR_PID: &str = "COFFER_SUPERVISOR_PID";
/// When the supervisor started (RFC 3339), reported by `/v1/health`.
pub const STARTED_AT: &str = "COFFER_STARTED_AT";
