//! [`Link`]: one connection to the daemon and, once `initialize` succeeded, one MCP session on
//! it, over either of the shim's two transports ([`Transport`]): the `/mcp` stream
//! ([`crate::stream::StreamLink`]) or Streamable HTTP ([`crate::http::HttpSession`]).
//!
//! What the bridge needs from a link is the same on both — send a request and get its answer,
//! send a notification or response, start listening once initialized, end the session — and so
//! is how a link is lost: [`Link::lose`] cancels one token that every request in flight on it
//! waits on, and a [`Lost`] says whether the message provably never reached a live session (so
//! the bridge may send it once more on a new session) or may have taken effect (-32001, never
//! resent). The bridge's replay and loss handling are written once against this type; only this
//! file and the two transports' own files look at which transport a link has.
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use reqwest::header::HeaderValue;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, warn};

use crate::connector::Endpoint;
use crate::frame::Frame;
use crate::http::HttpSession;
use crate::jsonrpc::{self, INVALID_REQUEST};
use crate::stream::{Liveness, OpenError, StreamLink, Unsent};

/// The daemon connection or session is gone (daemon dead, connection refused or broken, HTTP 404
/// for the session, HTTP 401 for a token from before a restart, the stream closed).
pub(crate) struct Lost {
    pub(crate) reason: String,
    /// The message provably never reached a live session: the connection was refused (or could
    /// not be made), the daemon refused its HTTP/2 stream, the daemon answered 404 for the
    /// session or 401 for the token, or the stream was already lost before it was written. The
    /// daemon did not act on it, so it may be sent again on a new session. Everything else (a
    /// connection closed before the answer was complete, a broken response stream) may have
    /// taken effect.
    pub(crate) undelivered: bool,
}

impl Lost {
    pub(crate) fn undelivered(reason: impl Into<String>) -> Self {
        Self { reason: reason.into(), undelivered: true }
    }

    pub(crate) fn in_flight(reason: impl Into<String>) -> Self {
        Self { reason: reason.into(), undelivered: false }
    }

    /// The same loss met after the daemon had the message (e.g. resuming its response stream).
    pub(crate) fn after_delivery(self) -> Self {
        Self { undelivered: false, ..self }
    }
}

/// What sending a message brought back.
pub(crate) enum Answer {
    /// Accepted without an answer (`202` for a notification or response; on the stream, written).
    Accepted,
    /// The response for the request (or the error standing in for it).
    Response(Frame),
    /// The server ended the response stream without answering and it cannot be resumed.
    Ended,
    /// A notification or response the server did not accept (what it said, for the log).
    Rejected(String),
}

/// Where server messages that are not the awaited response go.
#[derive(Clone, Copy)]
pub(crate) enum Sink<'a> {
    /// To the client (stdout).
    Client(&'a mpsc::Sender<Frame>),
    /// The replayed `initialize` belongs to the shim: nothing of it reaches the client.
    Discard,
}

impl Sink<'_> {
    /// Hands `frame` on (or drops it for [`Sink::Discard`]). An error means the writer is gone
    /// (stdout closed); the shim is shutting down then.
    pub(crate) async fn deliver(self, frame: Frame) {
        if let Sink::Client(out) = self {
            let _ = out.send(frame).await;
        }
    }
}

/// How a link talks to the daemon.
pub(crate) enum Transport {
    /// `/mcp` switched to a stream: the session is the connection's.
    Stream(Arc<StreamLink>),
    /// Streamable HTTP: a POST per message, the session in `Mcp-Session-Id` (boxed: its headers
    /// are much larger than the stream's pointer).
    Http(Box<HttpSession>),
}

/// One connection to the daemon and, once `initialize` succeeded, one MCP session on it.
pub(crate) struct Link {
    /// Counts links in this process, for logs.
    pub(crate) generation: u64,
    pub(crate) endpoint: Endpoint,
    /// Cancelled when the daemon connection or the session is found lost; every request in
    /// flight on this link waits on it so it can be answered at once.
    lost: CancellationToken,
    /// Why `lost` was cancelled; set exactly once, by whoever cancels.
    lost_reason: Arc<OnceLock<String>>,
    transport: Transport,
}

impl Link {
    /// A new link to `endpoint`: a `/mcp` stream when the endpoint may offer one and the daemon
    /// accepts the upgrade (daemon messages that answer no pending request go to `out`), else
    /// Streamable HTTP. `Err` (never delivered) when the daemon cannot be reached.
    pub(crate) async fn open(
        generation: u64,
        endpoint: Endpoint,
        out: mpsc::Sender<Frame>,
        liveness: Liveness,
        acks: Arc<crate::memory::Acks>,
    ) -> Result<Arc<Self>, Lost> {
        let lost = CancellationToken::new();
        let lost_reason = Arc::<OnceLock<String>>::default();
        let transport = if endpoint.stream {
            match StreamLink::open(&endpoint, out, lost.clone(), lost_reason.clone(), liveness, acks).await {
                Ok(stream) => {
                    debug!(generation, "Talking to the daemon on a /mcp stream.");
                    Transport::Stream(stream)
                }
                Err(OpenError::NotOffered(why)) => {
                    debug!(reason = %why, "No /mcp stream; using Streamable HTTP.");
                    Transport::Http(Box::new(HttpSession::new(&endpoint)))
                }
                Err(OpenError::Unreachable(why)) => return Err(Lost::undelivered(why)),
            }
        } else {
            Transport::Http(Box::new(HttpSession::new(&endpoint)))
        };
        Ok(Arc::new(Self { generation, endpoint, lost, lost_reason, transport }))
    }

    /// The same connection once `initialize` succeeded on it: over HTTP the session's headers
    /// added (the stream's session is the connection's), the loss state shared (losing one
    /// loses both).
    pub(crate) fn with_session(
        &self,
        session_id: Option<HeaderValue>,
        protocol_version: Option<HeaderValue>,
    ) -> Arc<Self> {
        let transport = match &self.transport {
            Transport::Stream(stream) => Transport::Stream(stream.clone()),
            Transport::Http(http) => Transport::Http(Box::new(http.with_session(session_id, protocol_version))),
        };
        Arc::new(Self {
            generation: self.generation,
            endpoint: self.endpoint.clone(),
            lost: self.lost.clone(),
            lost_reason: self.lost_reason.clone(),
            transport,
        })
    }

    pub(crate) fn usable(&self) -> bool {
        !self.lost.is_cancelled()
    }

    /// Cancelled once the link is lost.
    pub(crate) fn lost(&self) -> &CancellationToken {
        &self.lost
    }

    pub(crate) fn reason(&self) -> String {
        self.lost_reason.get().cloned().unwrap_or_else(|| "the daemon connection was lost".into())
    }

    /// Marks the link lost: every request in flight on it is answered at once (over HTTP, one
    /// still waiting for the head of its answer after its grace), and the next message, or a
    /// request that never reached the daemon, establishes a new session.
    pub(crate) fn lose(&self, reason: &str) {
        if self.lost_reason.set(reason.to_owned()).is_err() {
            return; // someone else found it first
        }
        self.lost.cancel();
        warn!(
            generation = self.generation,
            %reason,
            "Lost the MCP session with the Coffer daemon; requests in flight get an error, the next one re-establishes it."
        );
    }

    /// The `/mcp` stream, when this link is one (the bridge's fast path for requests).
    pub(crate) fn stream(&self) -> Option<&Arc<StreamLink>> {
        match &self.transport {
            Transport::Stream(stream) => Some(stream),
            Transport::Http(_) => None,
        }
    }

    /// The Streamable HTTP session, when this link is one.
    pub(crate) fn http(&self) -> Option<&HttpSession> {
        match &self.transport {
            Transport::Http(http) => Some(http),
            Transport::Stream(_) => None,
        }
    }

    /// Whether a session lives on this link that ending it would end (a stream always has one).
    pub(crate) fn has_session(&self) -> bool {
        match &self.transport {
            Transport::Stream(_) => true,
            Transport::Http(http) => http.session_id.is_some(),
        }
    }

    /// Sends a request and returns the frame that answers it (plus, over HTTP, the answer's
    /// `Mcp-Session-Id`); messages of the daemon that are not the answer go to `sink`. `Err`
    /// when the link turned out lost; the caller decides what the client gets (and marks the
    /// link lost).
    pub(crate) async fn exchange(
        &self,
        body: &Bytes,
        id: &Value,
        sink: Sink<'_>,
    ) -> Result<(Frame, Option<HeaderValue>), Lost> {
        match &self.transport {
            Transport::Stream(stream) => {
                tokio::task::yield_now().await; // see `Bridge::send_on_stream`
                let answer = match stream.send_for_bridge(id, body.clone()).await {
                    Ok(answer) => answer,
                    Err(Unsent::Lost) => return Err(Lost::undelivered(self.reason())),
                    Err(Unsent::DuplicateId) => return Ok((duplicate_id_frame(id), None)),
                };
                match answer.await {
                    Ok(frame) => Ok((frame, None)),
                    Err(_) => Err(Lost::in_flight(self.reason())),
                }
            }
            Transport::Http(http) => http.exchange(self, body, id, sink).await,
        }
    }

    /// Sends a notification or a response to a server request.
    pub(crate) async fn post(&self, body: &Bytes) -> Result<Answer, Lost> {
        match &self.transport {
            Transport::Stream(stream) => {
                if stream.send(body.clone()).await {
                    Ok(Answer::Accepted)
                } else {
                    Err(Lost::undelivered(self.reason()))
                }
            }
            Transport::Http(http) => http.post(self, body).await,
        }
    }

    /// Once the session is initialized: over HTTP, starts the `GET /mcp` listener for
    /// server-initiated messages (once) as a task of `tasks` that ends with `stop` or with the
    /// link; on the stream they arrive on the connection anyway.
    pub(crate) fn listen(self: &Arc<Self>, out: &mpsc::Sender<Frame>, tasks: &TaskTracker, stop: &CancellationToken) {
        if let Transport::Http(http) = &self.transport {
            http.listen(self, out, tasks, stop);
        }
    }

    /// Ends the session at exit: closes the stream, or sends `DELETE /mcp` (bounded by
    /// `delete_timeout`) for a live HTTP session.
    pub(crate) async fn end_session(&self, delete_timeout: std::time::Duration) {
        match &self.transport {
            Transport::Stream(stream) => stream.end("the client ended the session"),
            Transport::Http(http) if self.usable() && http.session_id.is_some() => {
                http.delete(&self.endpoint, delete_timeout).await;
            }
            Transport::Http(_) => {}
        }
    }

    /// Ends a session the client left by initializing again: the link is lost for everything
    /// still on it, and its session ends (the stream closes; over HTTP a `DELETE` runs as a task
    /// of `tasks`).
    pub(crate) fn retire(self: Arc<Self>, tasks: &TaskTracker, delete_timeout: std::time::Duration) {
        let _ = self.lost_reason.set("the client started a new session".into());
        self.lost.cancel();
        if matches!(self.transport, Transport::Http(_)) {
            tasks.spawn(async move {
                if let Transport::Http(http) = &self.transport {
                    http.delete(&self.endpoint, delete_timeout).await;
                }
            });
        }
    }
}

/// The answer to a request whose id is still in flight on this session.
pub(crate) fn duplicate_id_frame(id: &Value) -> Frame {
    jsonrpc::error_frame(
        id,
        INVALID_REQUEST,
        &format!(
            "Invalid Request: id {id} is already used by a request in flight (MCP request ids must be unique in a session)."
        ),
        None,
    )
}
