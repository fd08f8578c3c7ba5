//! `coffer-mcp-shim` as a library: a stdio MCP server that bridges every JSON-RPC message to
//! the Coffer daemon's `/mcp` endpoint (MCP 2025-11-25, basic/transports §stdio on both sides
//! of a `/mcp` stream; §Streamable HTTP when the server offers no stream).
//!
//! An MCP client launches the shim as an ordinary stdio server. [`run`] reads newline-delimited
//! JSON-RPC from stdin and
//! - finds or starts the daemon through a [`Connector`] (production: [`DaemonConnector`], i.e.
//!   detect-or-spawn; for a managed agent, `COFFER_AGENT_SHIM=1`, the running daemon through
//!   `agent-access/agent.json` and its `/mcp`-only token, never a spawn: see [`Access`]) before
//!   the first message is forwarded;
//! - when the [`Endpoint`] allows it (the daemon's does), switches `/mcp` to a stream
//!   (`GET /mcp`, `Upgrade: coffer-mcp-stream` → `101`) and writes every message onto it in stdin
//!   order; answers go to stdout as the daemon sends them, each request's matched by its id.
//!   The session is the stream's: when it closes (daemon gone, session ended), every request in
//!   flight gets -32001 at once, and the next message opens a new stream and replays the
//!   client's `initialize` and `notifications/initialized` there (answers not shown). Closing
//!   the stream at exit ends the session. A server that answers the upgrade with anything but
//!   `101` is spoken to with Streamable HTTP, as follows;
//! - POSTs each message to `{base_url}/mcp` with the token, and after `initialize` the
//!   `Mcp-Session-Id` and `MCP-Protocol-Version` headers. Requests run concurrently and their
//!   answers reach stdout in whatever order they complete; a notification or response is sent
//!   before anything that follows it on stdin (the shim waits for its `202`), so e.g.
//!   `notifications/initialized` always precedes the client's first request;
//! - splits a JSON-RPC batch line into single POSTs (2025-11-25 allows no batches on HTTP) and
//!   answers it with one array of the responses;
//! - copies every answer to stdout: a JSON body, or every event of an SSE body (notifications
//!   and server→client requests first, then the response), resuming a broken SSE response with
//!   `Last-Event-ID` when the server gave event ids;
//! - once the session is initialized, listens on `GET /mcp` for server-initiated messages,
//!   reconnecting with `Last-Event-ID`; a `405` means there is no such stream;
//! - when the daemon dies, refuses the connection, or answers `404` for the session (or `401`
//!   for a token from before a restart), re-establishes the session: runs detect-or-spawn again
//!   (starting a daemon if none runs) and replays the client's `initialize` (fresh id, answer
//!   not shown to the client) and `notifications/initialized`. A request that provably never
//!   reached a live session (connection refused, or its HTTP/2 stream refused; 404; 401) is then
//!   sent once more on the new session, so the first request after a daemon restart or crash
//!   just works; requests meeting the same loss together share one re-establishment. A request
//!   that may have taken effect (its answer had begun, or the connection closed while the daemon
//!   had it) is answered at once with a JSON-RPC error (-32001, "may be retried") and never
//!   resent. A loss seen only by the `GET` stream just marks the session lost: the replay is
//!   lazy on purpose, so after `coffer daemon stop` the shim starts a new daemon only when the
//!   client actually uses it;
//! - on stdin EOF lets in-flight requests finish (for at most [`Config::drain_timeout`]), on
//!   SIGTERM/SIGINT (the caller cancels `shutdown`) stops at once; either way it ends the
//!   session with `DELETE /mcp` and returns. It never stops the daemon.
//!
//! The shim is era-blind: a 2026-07-28 client (no `initialize`, `_meta` on every request,
//! `server/discover` as its stdio probe) is forwarded line by line like any other, and the
//! daemon answers it as that revision's stdio transport requires (see the gateway's
//! `mcp::downstream::stream`). With no `initialize` recorded, re-establishing after a daemon loss replays
//! nothing: the next request opens a new stream, where its `_meta` opens a new session. On a
//! modern stream, upstream requests come back as `InputRequiredResult`s, `subscriptions/listen`
//! notifications are tagged with their subscription id on the shared stdout, and
//! `notifications/cancelled` for a listen id ends that subscription; the shim's own liveness
//! `ping` (no `_meta`) is answered there too.
//!
//! Invariant: stdout carries nothing but JSON-RPC messages, one per line. Only the writer task
//! in `frame.rs` writes it, and only validated single-line frames; logs go to stderr.
#![deny(clippy::print_stdout, clippy::print_stderr)]
#![warn(missing_docs)]

mod bridge;
mod connector;
mod frame;
mod http;
mod jsonrpc;
mod link;
mod memory;
pub mod profile;
pub mod stdio;
mod stream;

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

pub use connector::{Access, BoxError, Connector, DaemonConnector, Endpoint, mcp_client};
pub use jsonrpc::{DAEMON_UNAVAILABLE, INTERNAL_ERROR, INVALID_REQUEST, PARSE_ERROR};
pub use memory::Memory;

use crate::bridge::Bridge;
use crate::frame::{FrameReader, Input};

/// Default stdin frame limit: 16 MiB, the daemon's `/mcp` body limit.
pub const DEFAULT_MAX_FRAME_BYTES: usize = 16 * 1024 * 1024;

/// Frames waiting for stdout before producers wait for the client to read. Every producer
/// waits (the stream's reader, the HTTP link's SSE readers): a client that stops reading stdout
/// stops the shim reading the daemon, so the shim's memory stays bounded and the daemon's own
/// bounded queue for the session fills and drops notifications instead (`mcp::flow` there).
const OUT_QUEUE_FRAMES: usize = 256;
/// How long the last frames may take to reach stdout at exit.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(2);

/// Tunables of [`run`].
#[derive(Debug, Clone)]
pub struct Config {
    /// Largest stdin line accepted, in bytes, not counting its `\n` or `\r\n`. A longer line is
    /// skipped and answered with -32600. Default [`DEFAULT_MAX_FRAME_BYTES`].
    pub max_frame_bytes: usize,
    /// After stdin EOF, how long in-flight requests may still finish. Default 5 s.
    pub drain_timeout: Duration,
    /// Timeout of the `DELETE /mcp` that ends the session at exit. Default 1 s.
    pub delete_timeout: Duration,
    /// On the `/mcp` stream: while a request waits and nothing has come from the daemon for
    /// this long, the shim sends it a `ping`. Default 15 s.
    pub liveness_interval: Duration,
    /// If nothing at all comes from the daemon within this long after that `ping` (a stopped or
    /// wedged daemon), the stream is given up: every waiting request gets -32001 at once and
    /// the next message connects again. Default 10 s.
    pub liveness_timeout: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            max_frame_bytes: DEFAULT_MAX_FRAME_BYTES,
            drain_timeout: Duration::from_secs(5),
            delete_timeout: Duration::from_secs(1),
            liveness_interval: Duration::from_secs(15),
            liveness_timeout: Duration::from_secs(10),
        }
    }
}

/// Errors of the shim. Only [`ShimError::Stdin`] ends [`run`]; the others are reported to the
/// client as JSON-RPC errors on the message that needed the daemon.
#[derive(Debug, thiserror::Error)]
pub enum ShimError {
    /// The connector could not find or start the daemon.
    #[error("cannot reach the Coffer daemon: {0}")]
    Connect(#[source] BoxError),
    /// The daemon was reached but did not accept the replayed `initialize`.
    #[error("cannot re-initialize the MCP session with the Coffer daemon: {0}")]
    Reinitialize(String),
    /// Reading stdin failed.
    #[error("reading stdin: {0}")]
    Stdin(#[source] std::io::Error),
}

/// Runs the shim until stdin ends, `shutdown` is cancelled, or stdout is closed.
///
/// Takes stdin and stdout (any async byte streams: tests pass in-memory pipes), the connector
/// that says where the daemon is, the tunables, and a token the caller cancels on SIGTERM or
/// SIGINT. Returns after the session has been ended with `DELETE /mcp` (best effort, within
/// [`Config::delete_timeout`]) and queued frames were written.
///
/// # Errors
/// [`ShimError::Stdin`] when stdin cannot be read. Everything else (unreachable daemon, lost
/// session, malformed input) is answered on stdout as a JSON-RPC error and the shim goes on.
pub async fn run<R, W, C>(
    stdin: R,
    stdout: W,
    connector: C,
    config: Config,
    shutdown: CancellationToken,
) -> Result<(), ShimError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
    C: Connector,
{
    let (frames, queue) = mpsc::channel(OUT_QUEUE_FRAMES);
    let stdout_closed = CancellationToken::new();
    let writer = {
        let closed = stdout_closed.clone();
        tokio::spawn(async move {
            if let Err(err) = frame::write_frames(queue, stdout).await {
                tracing::debug!(error = %err, "stdout is closed; the client went away.");
            }
            closed.cancel();
        })
    };
    let bridge = Bridge::new(connector, config.clone(), frames);
    let mut reader = FrameReader::new(stdin, config.max_frame_bytes);
    let mut result = Ok(());
    // Built once: a `cancelled()` future registers with its token when first polled, and a new
    // one per message would register (and unregister) once per message.
    let stop = async {
        tokio::select! {
            () = shutdown.cancelled() => {}
            () = stdout_closed.cancelled() => {}
        }
    };
    tokio::pin!(stop);
    let eof = loop {
        let input = tokio::select! {
            biased;
            () = &mut stop => break false,
            input = reader.next() => input,
        };
        let input = match input {
            Ok(Some(input)) => input,
            Ok(None) => break true,
            Err(err) => {
                result = Err(ShimError::Stdin(err));
                break false;
            }
        };
        let handle = async {
            match input {
                Input::Line(line) => bridge.dispatch(line).await,
                Input::Oversized { id, .. } => bridge.reject_oversized(id).await,
            }
        };
        tokio::select! {
            biased;
            () = &mut stop => break false,
            () = handle => {}
        }
    };
    tracing::debug!(eof, "Shutting down.");
    bridge.close(eof, &shutdown).await;
    // The bridge holds the last sender: dropping it lets the writer finish the queue and end.
    drop(bridge);
    if tokio::time::timeout(FLUSH_TIMEOUT, writer).await.is_err() {
        tracing::debug!("stdout did not take the last frames in time.");
    }
    result
}
