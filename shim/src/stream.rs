//! The shim's fast link: `/mcp` switched to a stream (`Upgrade: coffer-mcp-stream`, see the
//! gateway's `mcp::downstream::stream`), carrying MCP's stdio framing (newline-delimited JSON-RPC) both
//! ways on one HTTP/1.1 connection. Many messages travel per read and per write, where
//! Streamable HTTP costs an HTTP exchange each; the session is the connection's.
//!
//! [`StreamLink`] is the connection: a writer task gathers queued lines into one write, a
//! reader task copies what the daemon sends to stdout, answering requests by their ids from the
//! pending table. When the connection ends (daemon gone, session ended by the daemon) or the
//! bridge ends it, every request still waiting gets -32001 at once; the bridge opens a new link
//! on the next message.
//!
//! Why a stream and not Streamable HTTP for the shim, although MCP names Streamable HTTP as the
//! link: an HTTP exchange per message cost the shim and the gateway several times more CPU per call
//! than a stream, where many messages share each read and write, and with 16 requests in flight the
//! HTTP path stayed under the project's floor of 0.5× a direct stdio connection after everything
//! else that was tried (h2c, reactor stdio, a one-thread gateway, mimalloc); the figures are in
//! `docs/BENCHMARKS.md` ("Reading the numbers" and "Measurements behind design decisions"). The
//! stream keeps everything else of the design: the `/mcp` path, the token and DNS-rebinding
//! checks, one session per client, the same session code; every other client still uses
//! Streamable HTTP. It runs on the edge's Unix-domain socket (`COFFER_HOME/gateway.sock`) when it
//! can, the TCP port otherwise. A request takes no task of its own: the stdin loop writes it, the
//! stream's reader answers it, and queued lines go out in one write (both ends). Liveness: while a
//! request waits and the daemon has sent nothing for a while, the shim pings it, and gives the
//! stream up when nothing at all comes back ([`crate::Config`]).
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use coffer_runtime::ndjson::{FrameReader, Input};
use http_body_util::Empty;
use hyper::header::{CONNECTION, HOST, UPGRADE};
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use secrecy::ExposeSecret;
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::{Notify, mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::connector::Endpoint;
use crate::frame::Frame;
use crate::jsonrpc::{self, INTERNAL_ERROR, Kind, Parsed};
use crate::memory::Acks;

/// The `Upgrade` token of the stream.
use coffer_types::mcp::STREAM_UPGRADE as PROTOCOL;
/// Largest line accepted from the daemon (an answer can be far larger than a request).
const MAX_LINE_BYTES: usize = 256 * 1024 * 1024;
/// Bytes gathered into one write at most (more only for a single message).
const WRITE_BATCH_BYTES: usize = 256 * 1024;
/// Lines queued for the writer at most.
const QUEUE_LINES: usize = 1024;
/// How long the TCP connection and the `101` may take.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// How a link notices a daemon that stopped answering while requests wait (see
/// [`crate::Config::liveness_interval`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Liveness {
    pub(crate) interval: Duration,
    pub(crate) timeout: Duration,
}

/// Who waits for the answer to a request sent on the stream.
enum Waiter {
    /// The client: the answer goes straight to stdout; on loss, -32001 for this id.
    Client(Value),
    /// The bridge (a replayed `initialize`, a request of a split batch).
    Bridge(oneshot::Sender<Frame>),
}

/// Why a request was not sent on the stream.
pub(crate) enum Unsent {
    /// The link is lost; the request never left.
    Lost,
    /// A request with the same id is still waiting for its answer on this link. MCP request
    /// ids "MUST NOT have been previously used by the requestor within the same session", and
    /// answers are matched by id.
    DuplicateId,
}

/// Why opening a stream failed.
pub(crate) enum OpenError {
    /// The daemon does not offer the stream (any answer but `101`, `401`): use Streamable HTTP.
    NotOffered(String),
    /// The message never reached the daemon: connection refused or timed out, token refused.
    Unreachable(String),
}

/// One `/mcp` stream connection. Ends when `lost` is cancelled (by its tasks when the
/// connection ends, or by the bridge); `reason` says why.
pub(crate) struct StreamLink {
    /// Lines for the writer; bounded, so a daemon that stops reading (it does when the client
    /// leaves 1024 answers unread) stops the shim reading stdin, and nothing piles up here.
    queue: mpsc::Sender<Bytes>,
    pending: Mutex<HashMap<String, Waiter>>,
    /// Signalled whenever the pending table becomes empty.
    idle: Notify,
    lost: CancellationToken,
    reason: Arc<OnceLock<String>>,
    /// When the link opened, and the last time anything came from the daemon (ns after it).
    opened: Instant,
    heard_ns: AtomicU64,
    /// Acknowledgments of `subscriptions/listen` the shim gave itself or remembers.
    acks: Arc<Acks>,
}

impl StreamLink {
    /// Connects to `{base_url}/mcp` and switches it to the stream; starts its reader and writer.
    /// Daemon messages that answer no pending request go to `out` (the client).
    pub(crate) async fn open(
        endpoint: &Endpoint,
        out: mpsc::Sender<Frame>,
        lost: CancellationToken,
        reason: Arc<OnceLock<String>>,
        liveness: Liveness,
        acks: Arc<Acks>,
    ) -> Result<Arc<Self>, OpenError> {
        let io = tokio::time::timeout(CONNECT_TIMEOUT, upgrade(endpoint)).await.map_err(|_| {
            OpenError::Unreachable(format!("no answer to the stream upgrade within {CONNECT_TIMEOUT:?}"))
        })??;
        let (read, write) = tokio::io::split(io);
        let (queue, lines) = mpsc::channel(QUEUE_LINES);
        let link = Arc::new(Self {
            queue,
            pending: Mutex::default(),
            idle: Notify::new(),
            lost,
            reason,
            opened: Instant::now(),
            heard_ns: AtomicU64::new(0),
            acks,
        });
        tokio::spawn(link.clone().write_loop(lines, write));
        tokio::spawn(link.clone().read_loop(read, out));
        tokio::spawn(link.clone().watchdog(liveness));
        Ok(link)
    }

    fn usable(&self) -> bool {
        !self.lost.is_cancelled()
    }

    /// Ends the connection (its tasks answer every waiting request with -32001 for `reason`).
    pub(crate) fn end(&self, reason: &str) {
        let _ = self.reason.set(reason.to_owned());
        self.lost.cancel();
    }

    fn reason(&self) -> String {
        self.reason.get().cloned().unwrap_or_else(|| "the daemon connection was lost".into())
    }

    /// Sends a request whose answer goes straight to the client.
    pub(crate) async fn send_for_client(&self, id: Value, body: Bytes) -> Result<(), Unsent> {
        self.enqueue(&id.to_string(), Waiter::Client(id.clone()), body).await
    }

    /// Sends a request and returns the receiver of its answer. A dropped receiver means the
    /// link was lost while waiting.
    pub(crate) async fn send_for_bridge(&self, id: &Value, body: Bytes) -> Result<oneshot::Receiver<Frame>, Unsent> {
        let (tx, rx) = oneshot::channel();
        self.enqueue(&id.to_string(), Waiter::Bridge(tx), body).await?;
        Ok(rx)
    }

    /// Sends a notification or a response; false when the link is already lost.
    pub(crate) async fn send(&self, body: Bytes) -> bool {
        self.usable() && self.queue.send(body).await.is_ok()
    }

    /// The client cancelled request `id` (`notifications/cancelled`): the daemon will not answer
    /// it (MCP: no response to a cancelled request), so it no longer waits here. An answer that
    /// crossed the cancel on the wire still reaches the client, which ignores it (as MCP asks).
    pub(crate) fn forget_cancelled(&self, id: &Value) {
        let key = id.to_string();
        let mut table = self.table();
        if matches!(table.get(&key), Some(Waiter::Client(_))) {
            self.take_waiter(&mut table, &key);
        }
    }

    /// Takes the waiter for `key` out of the table, signalling `idle` when that empties it.
    fn take_waiter(&self, table: &mut HashMap<String, Waiter>, key: &str) -> Option<Waiter> {
        let waiter = table.remove(key);
        if table.is_empty() {
            self.idle.notify_waiters();
        }
        waiter
    }

    /// Whether no request waits for its answer on this link.
    pub(crate) fn is_idle(&self) -> bool {
        self.table().is_empty()
    }

    /// Waits until no request waits for its answer.
    pub(crate) async fn drained(&self) {
        loop {
            let notified = self.idle.notified();
            if self.table().is_empty() {
                return;
            }
            notified.await;
        }
    }

    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<String, Waiter>> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers the waiter and queues the line. Checked under the table lock against `lost`,
    /// which the reader cancels before it empties the table: a request is either refused here
    /// or answered there.
    ///
    /// Waits while the writer's queue is full. If the link is lost meanwhile, the request was
    /// not sent: it is given back (`Lost`) unless the reader has already answered it with
    /// -32001 while emptying the table (then it is done, `Ok`).
    async fn enqueue(&self, key: &str, waiter: Waiter, body: Bytes) -> Result<(), Unsent> {
        {
            let mut table = self.table();
            if !self.usable() {
                return Err(Unsent::Lost);
            }
            if table.contains_key(key) {
                return Err(Unsent::DuplicateId);
            }
            table.insert(key.to_owned(), waiter);
        }
        if self.queue.send(body).await.is_err() && self.table().remove(key).is_some() {
            return Err(Unsent::Lost);
        }
        Ok(())
    }

    /// How long since anything came from the daemon.
    fn silent_for(&self) -> Duration {
        self.opened.elapsed().saturating_sub(Duration::from_nanos(self.heard_ns.load(Ordering::Relaxed)))
    }

    /// While requests wait and the daemon has been silent for `interval`, pings it; gives the
    /// link up when nothing at all comes back within `timeout` (a stopped or wedged daemon
    /// would otherwise leave every waiting request hanging). A live daemon answers `ping`
    /// itself, however long its upstreams take.
    async fn watchdog(self: Arc<Self>, liveness: Liveness) {
        let mut pings = 0u64;
        loop {
            tokio::select! {
                () = self.lost.cancelled() => return,
                () = tokio::time::sleep(liveness.interval) => {}
            }
            let silent = self.silent_for();
            if self.is_idle() || silent < liveness.interval {
                continue;
            }
            pings += 1;
            let id = Value::String(format!("coffer-shim-ping-{pings}"));
            let body = Bytes::from(json!({"jsonrpc": "2.0", "id": id, "method": "ping"}).to_string());
            let heard_before = self.heard_ns.load(Ordering::Relaxed);
            // The answer needs no one to wait for it: any line from the daemon will do.
            let sent = tokio::select! {
                () = self.lost.cancelled() => return,
                sent = tokio::time::timeout(liveness.timeout, self.send_for_bridge(&id, body)) => sent,
            };
            if let Ok(Err(Unsent::DuplicateId)) = sent {
                continue; // the client uses such an id itself; try the next one
            }
            tokio::select! {
                () = self.lost.cancelled() => return,
                () = tokio::time::sleep(liveness.timeout) => {}
            }
            if self.heard_ns.load(Ordering::Relaxed) == heard_before {
                let waited = silent + liveness.timeout;
                warn!(
                    silent_ms = waited.as_millis() as u64,
                    "The daemon stopped answering; giving up the /mcp stream."
                );
                self.end(&format!(
                    "the daemon sent nothing for {} s, not even an answer to a ping (it may be stopped or overloaded)",
                    waited.as_secs()
                ));
                return;
            }
        }
    }

    async fn write_loop<W: AsyncWrite + Unpin>(self: Arc<Self>, mut lines: mpsc::Receiver<Bytes>, mut write: W) {
        let mut buf = Vec::with_capacity(16 * 1024);
        let lost = self.lost.clone();
        let lost = lost.cancelled(); // registered once, not per line
        tokio::pin!(lost);
        loop {
            let first = tokio::select! {
                biased;
                () = &mut lost => break,
                line = lines.recv() => match line {
                    Some(line) => line,
                    None => break,
                },
            };
            push_line(&mut buf, &first);
            while buf.len() < WRITE_BATCH_BYTES {
                match lines.try_recv() {
                    Ok(line) => push_line(&mut buf, &line),
                    Err(_) => break,
                }
            }
            if let Err(err) = write.write_all(&buf).await {
                self.end(&format!("writing to the daemon failed: {err}"));
                break;
            }
            buf.clear();
        }
        let _ = write.shutdown().await;
    }

    async fn read_loop<R: AsyncRead + Unpin>(self: Arc<Self>, read: R, out: mpsc::Sender<Frame>) {
        let mut reader = FrameReader::new(read, MAX_LINE_BYTES);
        let lost = self.lost.clone();
        let lost = lost.cancelled(); // registered once, not per line
        tokio::pin!(lost);
        loop {
            let input = tokio::select! {
                biased;
                () = &mut lost => break,
                input = reader.next() => input,
            };
            self.heard_ns.store(self.opened.elapsed().as_nanos() as u64, Ordering::Relaxed);
            match input {
                Ok(Some(Input::Line(line))) => self.on_line(Bytes::from(line), &out).await,
                Ok(Some(Input::Oversized { id, .. })) => {
                    warn!(limit_bytes = MAX_LINE_BYTES, id = %id, "Skipped a daemon message over the size limit.");
                    let frame = jsonrpc::error_frame(
                        &id,
                        INTERNAL_ERROR,
                        &format!("The answer is larger than the shim's limit of {MAX_LINE_BYTES} bytes."),
                        None,
                    );
                    self.answer(&id, frame, &out).await;
                }
                Ok(None) => {
                    self.end("the daemon closed the MCP stream (it stopped, or ended the session)");
                    break;
                }
                Err(err) => {
                    self.end(&format!("reading from the daemon failed: {err}"));
                    break;
                }
            }
        }
        // `lost` is cancelled now, so nothing new enters the table.
        let waiting: Vec<Waiter> = self.table().drain().map(|(_, w)| w).collect();
        self.idle.notify_waiters();
        let reason = self.reason();
        for waiter in waiting {
            if let Waiter::Client(id) = waiter {
                let _ = out.send(jsonrpc::lost_frame(&id, &reason)).await;
            }
        }
    }

    async fn on_line(&self, line: Bytes, out: &mpsc::Sender<Frame>) {
        match jsonrpc::parse(&line) {
            Ok(Parsed::Single(Kind::Response { id })) => self.answer(&id, Frame::from_valid_json(line), out).await,
            Ok(_) => {
                if self.acks.pass(&line) {
                    let _ = out.send(Frame::from_valid_json(line)).await;
                }
            }
            Err(_) => warn!("Skipped a line from the daemon that is not JSON-RPC."),
        }
    }

    /// Hands the answer to request `id` to whoever waits for it (the client when nobody does).
    async fn answer(&self, id: &Value, frame: Frame, out: &mpsc::Sender<Frame>) {
        let waiter = self.take_waiter(&mut self.table(), &id.to_string());
        match waiter {
            Some(Waiter::Bridge(tx)) => {
                let _ = tx.send(frame);
            }
            Some(Waiter::Client(_)) | None => {
                let _ = out.send(frame).await;
            }
        }
    }
}

/// A connection to the daemon's edge: its Unix-domain socket or its TCP port.
trait Connection: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static> Connection for T {}

/// Connects to the edge: through [`Endpoint::socket`] when set and connectable (no TCP/IP
/// stack per message: the stream's reads and writes cost about half), else to `host:port`.
async fn connect(endpoint: &Endpoint, host: &str, port: u16) -> Result<Box<dyn Connection>, OpenError> {
    if let Some(path) = &endpoint.socket {
        match tokio::net::UnixStream::connect(path).await {
            Ok(unix) => return Ok(Box::new(unix)),
            Err(e) => {
                debug!(path = %path.display(), error = %e, "The daemon's socket is not connectable; using its TCP port.")
            }
        }
    }
    let tcp = tokio::net::TcpStream::connect((host, port))
        .await
        .map_err(|e| OpenError::Unreachable(format!("connecting to {host}:{port} failed: {e}")))?;
    let _ = tcp.set_nodelay(true);
    Ok(Box::new(tcp))
}

/// `GET /mcp` with `Upgrade: coffer-mcp-stream` over a new HTTP/1.1 connection; the switched
/// connection on `101`.
async fn upgrade(endpoint: &Endpoint) -> Result<TokioIo<hyper::upgrade::Upgraded>, OpenError> {
    let url = reqwest::Url::parse(&endpoint.mcp_url())
        .map_err(|e| OpenError::Unreachable(format!("bad daemon address {}: {e}", endpoint.base_url)))?;
    let host = url.host_str().unwrap_or("127.0.0.1").to_owned();
    let port = url.port_or_known_default().unwrap_or(80);
    let io = connect(endpoint, &host, port).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| OpenError::Unreachable(format!("HTTP handshake failed: {e}")))?;
    tokio::spawn(async move {
        if let Err(err) = conn.with_upgrades().await {
            debug!(error = %err, "The stream upgrade connection failed.");
        }
    });
    let authority = format!("{host}:{port}");
    let mut token = hyper::header::HeaderValue::from_str(endpoint.token.expose_secret())
        .map_err(|_| OpenError::Unreachable("the daemon token is not a valid header value".into()))?;
    token.set_sensitive(true);
    let mut req = Request::get(url.path())
        .header(HOST, authority)
        .header(CONNECTION, "upgrade")
        .header(UPGRADE, PROTOCOL)
        .header(coffer_types::header::TOKEN, token);
    if let Some(c) = crate::connector::conversation_header() {
        req = req.header(coffer_types::mcp::CONVERSATION_HEADER, c);
    }
    if let Some(p) = crate::profile::header() {
        req = req.header(coffer_types::mcp::PROFILE_HEADER, p);
    }
    let req = req
        .body(Empty::<Bytes>::new())
        .map_err(|e| OpenError::Unreachable(format!("building the upgrade request failed: {e}")))?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| OpenError::Unreachable(format!("the stream upgrade request failed: {e}")))?;
    match resp.status() {
        StatusCode::SWITCHING_PROTOCOLS => {}
        StatusCode::UNAUTHORIZED => {
            return Err(OpenError::Unreachable(
                "the daemon refused the token (HTTP 401); it may have restarted".into(),
            ));
        }
        status => return Err(OpenError::NotOffered(format!("the daemon answered the stream upgrade with {status}"))),
    }
    let upgraded = hyper::upgrade::on(resp)
        .await
        .map_err(|e| OpenError::Unreachable(format!("switching to the stream failed: {e}")))?;
    Ok(TokioIo::new(upgraded))
}

fn push_line(buf: &mut Vec<u8>, line: &[u8]) {
    buf.extend_from_slice(line);
    buf.push(b'\n');
}
