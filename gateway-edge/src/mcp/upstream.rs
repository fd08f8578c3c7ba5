//! One upstream MCP server connection owned by one downstream session (stdio transport; MCP
//! 2025-11-25 basic/transports §stdio): newline-delimited JSON-RPC on the child's stdin/stdout,
//! stderr drained continuously into `logs/upstreams/<server>.log`.
//!
//! Requests get fresh numeric ids and are matched to responses by id (out of order is fine).
//! Results and errors are kept as raw JSON so they reach the client verbatim. Lines that are
//! not JSON-RPC are skipped and logged. When the child exits, every request in flight fails at
//! once with [`UpstreamError::Closed`].
use std::collections::HashMap;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use coffer_proto::store::McpServer;
use coffer_runtime::home::CofferHome;
use coffer_runtime::spawn::{ManagedChild, SpawnSpec};
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, oneshot};

/// Longest line accepted from an upstream (bytes).
pub const MAX_FRAME: usize = 64 * 1024 * 1024;
/// A stderr log larger than this is rotated to `<server>.log.1` when an upstream starts.
const STDERR_LOG_ROTATE: u64 = 10 * 1024 * 1024;

/// Why a request to an upstream failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum UpstreamError {
    #[error("upstream {server} could not be started: {reason}")]
    Start { server: String, reason: String },
    #[error("upstream {server} closed the connection: {reason}")]
    Closed { server: String, reason: String },
    #[error("upstream {server} did not answer within {ms} ms")]
    Timeout { server: String, ms: u64 },
}

/// A response body part, kept raw.
#[derive(Debug)]
pub enum Reply {
    Result(Box<RawValue>),
    Error(Box<RawValue>),
}

/// Something an upstream sent that is not a response to us.
#[derive(Debug)]
pub enum UpstreamEvent {
    Notification {
        server: String,
        method: String,
        params: Option<Box<RawValue>>,
    },
    Request {
        server: String,
        id: Box<RawValue>,
        method: String,
        params: Option<Box<RawValue>>,
    },
    Closed {
        server: String,
    },
}

#[derive(Deserialize)]
struct Incoming {
    id: Option<Box<RawValue>>,
    method: Option<String>,
    params: Option<Box<RawValue>>,
    result: Option<Box<RawValue>>,
    error: Option<Box<RawValue>>,
}

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Reply>>>>;

/// A running upstream.
pub struct Upstream {
    pub server: String,
    next_id: AtomicU64,
    pending: Pending,
    stdin: tokio::sync::Mutex<Option<tokio::process::ChildStdin>>,
    child: tokio::sync::Mutex<Option<ManagedChild>>,
    alive: Arc<AtomicBool>,
    close_reason: Arc<Mutex<String>>,
    /// The upstream's `initialize` result (raw).
    pub init_result: serde_json::Value,
    pub pid: i32,
}

impl Upstream {
    /// Starts `server` and performs the MCP handshake, mirroring the downstream client's
    /// `protocol_version`, `capabilities` and `client_info`. Non-response messages go to `events`.
    ///
    /// # Errors
    /// [`UpstreamError::Start`] when the process cannot start, exits, or fails `initialize`
    /// within `timeout`.
    pub async fn start(
        server: &McpServer,
        home: &CofferHome,
        init_params: &serde_json::Value,
        events: mpsc::UnboundedSender<UpstreamEvent>,
        timeout: Duration,
    ) -> Result<Arc<Self>, UpstreamError> {
        let name = server.name.clone();
        let start_err = |reason: String| UpstreamError::Start {
            server: name.clone(),
            reason,
        };
        if server.transport != "stdio" {
            return Err(start_err(format!(
                "transport {:?} is not supported yet",
                server.transport
            )));
        }
        let mut spec = SpawnSpec::new(&server.command, "upstream", &server.name);
        spec.args = server.args.iter().map(Into::into).collect();
        spec.env = server
            .env
            .iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
        spec.cwd = Some(if server.cwd.is_empty() {
            home.root().join("workspace")
        } else {
            server.cwd.clone().into()
        });
        spec.stdin = Stdio::piped();
        spec.stdout = Stdio::piped();
        spec.stderr = Stdio::piped();
        spec.pid_dir = Some(home.pids());
        let mut child = coffer_runtime::spawn::spawn(spec).map_err(|e| start_err(e.to_string()))?;
        let pid = child.pid();
        let stdin = child.inner().stdin.take();
        let stdout = child
            .inner()
            .stdout
            .take()
            .ok_or_else(|| start_err("no stdout".into()))?;
        if let Some(stderr) = child.inner().stderr.take() {
            tokio::spawn(drain_stderr(
                stderr,
                home.upstream_logs().join(format!("{}.log", server.name)),
            ));
        }
        let pending: Pending = Arc::default();
        let alive = Arc::new(AtomicBool::new(true));
        let close_reason = Arc::new(Mutex::new(String::new()));
        tokio::spawn(read_loop(
            name.clone(),
            stdout,
            pending.clone(),
            alive.clone(),
            close_reason.clone(),
            events,
        ));

        let mut up = Self {
            server: name.clone(),
            next_id: AtomicU64::new(1),
            pending,
            stdin: tokio::sync::Mutex::new(stdin),
            child: tokio::sync::Mutex::new(Some(child)),
            alive,
            close_reason,
            init_result: serde_json::Value::Null,
            pid,
        };
        let params = RawValue::from_string(init_params.to_string()).expect("valid JSON");
        let reply = up
            .request("initialize", Some(&params), timeout)
            .await
            .map_err(|e| match e {
                UpstreamError::Closed { reason, .. } => {
                    start_err(format!("exited during initialize ({reason})"))
                }
                UpstreamError::Timeout { ms, .. } => {
                    start_err(format!("no initialize answer within {ms} ms"))
                }
                e => e,
            })?;
        match reply {
            Reply::Result(r) => up.init_result = serde_json::from_str(r.get()).unwrap_or_default(),
            Reply::Error(e) => return Err(start_err(format!("initialize failed: {}", e.get()))),
        }
        up.notify("notifications/initialized", None).await?;
        Ok(Arc::new(up))
    }

    /// True while the child runs and its stdout is open.
    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    /// Whether the upstream declared capability `name` (e.g. `tools`) in its initialize result.
    pub fn has_capability(&self, name: &str) -> bool {
        self.init_result
            .get("capabilities")
            .and_then(|c| c.get(name))
            .is_some()
    }

    fn closed_error(&self) -> UpstreamError {
        let reason = self.close_reason.lock().expect("reason").clone();
        UpstreamError::Closed {
            server: self.server.clone(),
            reason: if reason.is_empty() {
                "exited".into()
            } else {
                reason
            },
        }
    }

    async fn write_line(&self, line: &[u8]) -> Result<(), UpstreamError> {
        let mut guard = self.stdin.lock().await;
        let Some(stdin) = guard.as_mut() else {
            return Err(self.closed_error());
        };
        let res = async {
            stdin.write_all(line).await?;
            stdin.write_all(b"\n").await?;
            stdin.flush().await
        }
        .await;
        res.map_err(|e| {
            self.alive.store(false, Ordering::Release);
            UpstreamError::Closed {
                server: self.server.clone(),
                reason: format!("stdin: {e}"),
            }
        })
    }

    /// Sends request `method` with raw `params` and waits (at most `timeout`) for the reply.
    /// On timeout, sends `notifications/cancelled` for it.
    ///
    /// # Errors
    /// [`UpstreamError::Closed`] when the upstream is gone or exits before answering;
    /// [`UpstreamError::Timeout`].
    pub async fn request(
        &self,
        method: &str,
        params: Option<&RawValue>,
        timeout: Duration,
    ) -> Result<Reply, UpstreamError> {
        let (id, rx) = self.begin(method, params).await?;
        self.finish(id, rx, timeout).await
    }

    /// First half of [`Upstream::request`]: registers and sends; returns the upstream id.
    pub async fn begin(
        &self,
        method: &str,
        params: Option<&RawValue>,
    ) -> Result<(u64, oneshot::Receiver<Reply>), UpstreamError> {
        if !self.is_alive() {
            return Err(self.closed_error());
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending.lock().expect("pending").insert(id, tx);
        let method_json = serde_json::to_string(method).expect("string");
        let line = match params {
            Some(p) => format!(
                "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":{method_json},\"params\":{}}}",
                p.get()
            ),
            None => format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":{method_json}}}"),
        };
        if let Err(e) = self.write_line(line.as_bytes()).await {
            self.pending.lock().expect("pending").remove(&id);
            return Err(e);
        }
        Ok((id, rx))
    }

    /// Second half of [`Upstream::request`].
    pub async fn finish(
        &self,
        id: u64,
        rx: oneshot::Receiver<Reply>,
        timeout: Duration,
    ) -> Result<Reply, UpstreamError> {
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(_)) => Err(self.closed_error()),
            Err(_) => {
                self.pending.lock().expect("pending").remove(&id);
                let params = format!("{{\"requestId\":{id},\"reason\":\"timeout\"}}");
                let _ = self
                    .notify(
                        "notifications/cancelled",
                        Some(&RawValue::from_string(params).expect("json")),
                    )
                    .await;
                Err(UpstreamError::Timeout {
                    server: self.server.clone(),
                    ms: timeout.as_millis() as u64,
                })
            }
        }
    }

    /// Sends a notification.
    ///
    /// # Errors
    /// [`UpstreamError::Closed`] when the upstream is gone.
    pub async fn notify(
        &self,
        method: &str,
        params: Option<&RawValue>,
    ) -> Result<(), UpstreamError> {
        let method_json = serde_json::to_string(method).expect("string");
        let line = match params {
            Some(p) => format!(
                "{{\"jsonrpc\":\"2.0\",\"method\":{method_json},\"params\":{}}}",
                p.get()
            ),
            None => format!("{{\"jsonrpc\":\"2.0\",\"method\":{method_json}}}"),
        };
        self.write_line(line.as_bytes()).await
    }

    /// Answers a request the upstream sent us (`id` raw) with a raw result or error object.
    pub async fn respond(&self, id: &RawValue, reply: Reply) -> Result<(), UpstreamError> {
        let line = match reply {
            Reply::Result(r) => format!(
                "{{\"jsonrpc\":\"2.0\",\"id\":{},\"result\":{}}}",
                id.get(),
                r.get()
            ),
            Reply::Error(e) => format!(
                "{{\"jsonrpc\":\"2.0\",\"id\":{},\"error\":{}}}",
                id.get(),
                e.get()
            ),
        };
        self.write_line(line.as_bytes()).await
    }

    /// Stops the upstream: close stdin (the stdio transport's shutdown signal), then SIGTERM to
    /// its process group, then SIGKILL after `grace`. Removes its pid record.
    pub async fn shutdown(&self, grace: Duration) {
        self.stdin.lock().await.take();
        if let Some(mut child) = self.child.lock().await.take() {
            // Give it a moment to exit on EOF before signalling.
            if tokio::time::timeout(Duration::from_millis(200), child.inner().wait())
                .await
                .is_err()
            {
                child.terminate(grace).await;
            } else {
                child.terminate(Duration::ZERO).await;
            }
        }
        self.alive.store(false, Ordering::Release);
    }
}

async fn read_loop(
    server: String,
    stdout: tokio::process::ChildStdout,
    pending: Pending,
    alive: Arc<AtomicBool>,
    close_reason: Arc<Mutex<String>>,
    events: mpsc::UnboundedSender<UpstreamEvent>,
) {
    let mut reader = BufReader::with_capacity(64 * 1024, stdout);
    let mut buf = Vec::with_capacity(8 * 1024);
    let reason = loop {
        buf.clear();
        match read_frame(&mut reader, &mut buf).await {
            Ok(0) => break "exited (stdout closed)".to_owned(),
            Ok(_) => {}
            Err(e) => break format!("stdout: {e}"),
        }
        let line = trim_line(&buf);
        if line.is_empty() {
            continue;
        }
        let msg: Incoming = match serde_json::from_slice(line) {
            Ok(m) => m,
            Err(_) => {
                tracing::debug!(server = %server, bytes = line.len(), "Skipped a non-JSON-RPC line from upstream stdout.");
                continue;
            }
        };
        match (msg.method, msg.id) {
            (Some(method), Some(id)) => {
                let _ = events.send(UpstreamEvent::Request {
                    server: server.clone(),
                    id,
                    method,
                    params: msg.params,
                });
            }
            (Some(method), None) => {
                let _ = events.send(UpstreamEvent::Notification {
                    server: server.clone(),
                    method,
                    params: msg.params,
                });
            }
            (None, Some(id)) => {
                let Ok(n) = id.get().parse::<u64>() else {
                    tracing::debug!(server = %server, "Response with an id we never sent; ignored.");
                    continue;
                };
                let tx = pending.lock().expect("pending").remove(&n);
                let reply = match (msg.result, msg.error) {
                    (Some(r), _) => Reply::Result(r),
                    (None, Some(e)) => Reply::Error(e),
                    (None, None) => {
                        Reply::Result(RawValue::from_string("{}".into()).expect("json"))
                    }
                };
                match tx {
                    Some(tx) => {
                        let _ = tx.send(reply);
                    }
                    None => {
                        tracing::debug!(server = %server, id = n, "Late or duplicate response ignored.")
                    }
                }
            }
            (None, None) => {
                tracing::debug!(server = %server, "Skipped a JSON line that is not JSON-RPC.")
            }
        }
    };
    alive.store(false, Ordering::Release);
    *close_reason.lock().expect("reason") = reason;
    // Dropping every sender fails each request in flight at once.
    pending.lock().expect("pending").clear();
    let _ = events.send(UpstreamEvent::Closed { server });
}

/// Reads one `\n`-terminated frame into `buf` (without losing sync on an over-long line, which
/// is discarded). Returns bytes consumed; 0 at EOF.
async fn read_frame<R: tokio::io::AsyncBufRead + Unpin>(
    r: &mut R,
    buf: &mut Vec<u8>,
) -> std::io::Result<usize> {
    let mut total = 0;
    let mut discarding = false;
    loop {
        let available = r.fill_buf().await?;
        if available.is_empty() {
            return Ok(total);
        }
        let (chunk, done) = match memchr(available) {
            Some(i) => (&available[..=i], true),
            None => (available, false),
        };
        let n = chunk.len();
        if !discarding {
            if buf.len() + n > MAX_FRAME {
                discarding = true;
                buf.clear();
                tracing::warn!(
                    limit = MAX_FRAME,
                    "Upstream frame over the limit; discarded."
                );
            } else {
                buf.extend_from_slice(chunk);
            }
        }
        r.consume(n);
        total += n;
        if done {
            return Ok(total);
        }
    }
}

fn memchr(b: &[u8]) -> Option<usize> {
    b.iter().position(|&c| c == b'\n')
}

fn trim_line(b: &[u8]) -> &[u8] {
    let mut s = b;
    while let [rest @ .., last] = s {
        if last.is_ascii_whitespace() {
            s = rest
        } else {
            break;
        }
    }
    while let [first, rest @ ..] = s {
        if first.is_ascii_whitespace() {
            s = rest
        } else {
            break;
        }
    }
    s
}

/// Copies an upstream's stderr to its log file, line by line, never blocking the upstream (a
/// write failure or invalid UTF-8 never stops the draining).
async fn drain_stderr(stderr: tokio::process::ChildStderr, path: std::path::PathBuf) {
    if std::fs::metadata(&path).is_ok_and(|m| m.len() > STDERR_LOG_ROTATE) {
        let _ = std::fs::rename(&path, path.with_extension("log.1"));
    }
    let mut file = match tokio::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .await
    {
        Ok(f) => Some(f),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "Cannot open upstream log; discarding its stderr.");
            None
        }
    };
    let mut reader = BufReader::new(stderr);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match read_frame(&mut reader, &mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        if let Some(f) = file.as_mut() {
            let line = String::from_utf8_lossy(trim_line(&buf));
            let stamped = format!("{} {line}\n", coffer_runtime::now_rfc3339());
            if f.write_all(stamped.as_bytes()).await.is_err() {
                file = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn frames_split_and_overlong_discarded() {
        let data = b"{\"a\":1}\nnot json\n\n{\"b\":2}\n".to_vec();
        let mut r = BufReader::new(&data[..]);
        let mut buf = Vec::new();
        let mut frames = Vec::new();
        while read_frame(&mut r, &mut buf).await.unwrap() > 0 {
            frames.push(String::from_utf8(trim_line(&buf).to_vec()).unwrap());
            buf.clear();
        }
        assert_eq!(frames, vec!["{\"a\":1}", "not json", "", "{\"b\":2}"]);
    }
}
