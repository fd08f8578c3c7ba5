//! A small test client for `/mcp` switched to a stream (`Upgrade: coffer-mcp-stream`):
//! newline-delimited JSON-RPC both ways on one upgraded HTTP/1.1 connection, one MCP session per
//! connection. The handshake is written by hand so tests can send exactly the headers they mean
//! (and see a refusal as a plain [`Reply`]); on the stream, [`McpStream::send_raw`] writes any
//! bytes, including malformed or oversized lines.
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use reqwest::StatusCode;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

use crate::http::{Api, Reply, parse_head};

/// The `Upgrade` token of the stream.
pub use coffer_types::mcp::STREAM_UPGRADE as PROTOCOL;
/// How long [`McpStream::recv`] waits for a line before it fails.
pub const RECV_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the handshake (connect, request, response head) may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest response head accepted from the daemon.
const MAX_HEAD_BYTES: usize = 64 * 1024;

/// The handshake headers a well-behaved client sends: loopback `Host` with the daemon's port,
/// `Connection: Upgrade`, `Upgrade: coffer-mcp-stream` and the token. Tests edit the list to
/// make refusals.
pub fn upgrade_headers(api: &Api) -> Vec<(String, String)> {
    vec![
        ("Host".into(), format!("127.0.0.1:{}", api.port())),
        ("Connection".into(), "Upgrade".into()),
        ("Upgrade".into(), PROTOCOL.into()),
        ("X-Coffer-Token".into(), api.token().into()),
    ]
}

/// How a handshake ended.
pub enum Handshake {
    /// `101 Switching Protocols`: the response head (empty body) and the stream.
    Switched(Reply, McpStream),
    /// Any other answer, read in full (its `Content-Length` body).
    Refused(Reply),
}

impl Handshake {
    /// The response (head only when switched).
    pub fn reply(&self) -> &Reply {
        match self {
            Self::Switched(r, _) | Self::Refused(r) => r,
        }
    }
}

/// Sends `GET /mcp` with exactly `headers` on a fresh connection to `127.0.0.1:port` and reads
/// the answer.
///
/// # Errors
/// On a transport error, a malformed response, or no response head within 10 s.
pub async fn handshake(port: u16, headers: &[(String, String)]) -> anyhow::Result<Handshake> {
    let exchange = async {
        let mut tcp = TcpStream::connect(("127.0.0.1", port)).await.context("connecting to the daemon")?;
        let mut req = String::from("GET /mcp HTTP/1.1\r\n");
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        tcp.write_all(req.as_bytes()).await.context("writing the handshake")?;
        // Byte by byte up to the blank line: after a 101 the next byte already belongs to the
        // stream, so nothing past the head may be read here.
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            ensure!(head.len() < MAX_HEAD_BYTES, "response head over {MAX_HEAD_BYTES} bytes");
            let b = tcp.read_u8().await.with_context(|| {
                format!("the connection ended inside the response head: {:?}", String::from_utf8_lossy(&head))
            })?;
            head.push(b);
        }
        let (status, headers) = parse_head(&head)?;
        if status == StatusCode::SWITCHING_PROTOCOLS {
            let reply = Reply { status, headers, text: String::new() };
            return Ok(Handshake::Switched(reply, McpStream::new(tcp)));
        }
        let len: usize =
            headers.get("content-length").and_then(|v| v.to_str().ok()?.parse().ok()).context("no Content-Length")?;
        let mut body = vec![0; len];
        tcp.read_exact(&mut body).await.context("reading the refusal's body")?;
        Ok(Handshake::Refused(Reply { status, headers, text: String::from_utf8_lossy(&body).into_owned() }))
    };
    tokio::time::timeout(HANDSHAKE_TIMEOUT, exchange).await.context("no answer to the handshake within 10 s")?
}

/// One switched `/mcp` connection.
pub struct McpStream {
    read: BufReader<OwnedReadHalf>,
    write: OwnedWriteHalf,
    next_id: i64,
    /// Messages [`McpStream::request`] read past while waiting for its answer (notifications,
    /// server requests, answers to other ids), oldest first.
    pub skipped: Vec<Value>,
}

impl McpStream {
    fn new(tcp: TcpStream) -> Self {
        let (read, write) = tcp.into_split();
        Self { read: BufReader::with_capacity(64 * 1024, read), write, next_id: 1000, skipped: Vec::new() }
    }

    /// Switches a fresh connection to the stream with [`upgrade_headers`].
    ///
    /// # Errors
    /// When the daemon answers anything but `101` with `Upgrade: coffer-mcp-stream`.
    pub async fn connect(api: &Api) -> anyhow::Result<Self> {
        match handshake(api.port(), &upgrade_headers(api)).await? {
            Handshake::Switched(r, s) => {
                let up = r.headers.get("upgrade").and_then(|v| v.to_str().ok());
                ensure!(up == Some(PROTOCOL), "101 without Upgrade: {PROTOCOL}: {:?}", r.headers);
                Ok(s)
            }
            Handshake::Refused(r) => bail!("the stream upgrade was refused: {} {}", r.status, r.text),
        }
    }

    /// [`McpStream::connect`], then [`McpStream::initialize`] with `version` and
    /// `notifications/initialized`.
    ///
    /// # Errors
    /// As those two.
    pub async fn open(api: &Api, version: &str) -> anyhow::Result<Self> {
        let mut s = Self::connect(api).await?;
        let r = s.initialize(version).await?;
        ensure!(r["result"]["protocolVersion"].is_string(), "initialize failed: {r}");
        s.notify("notifications/initialized", None).await?;
        Ok(s)
    }

    /// Writes `bytes` as they are (add the `\n` yourself).
    ///
    /// # Errors
    /// When the connection is gone.
    pub async fn send_raw(&mut self, bytes: &[u8]) -> anyhow::Result<()> {
        self.write.write_all(bytes).await.context("writing to the stream")?;
        self.write.flush().await.context("flushing the stream")
    }

    /// Writes `msg` as one line.
    ///
    /// # Errors
    /// When the connection is gone.
    pub async fn send(&mut self, msg: &Value) -> anyhow::Result<()> {
        let mut line = serde_json::to_vec(msg)?;
        line.push(b'\n');
        self.send_raw(&line).await
    }

    /// Sends notification `method` (with `params` when given).
    ///
    /// # Errors
    /// When the connection is gone.
    pub async fn notify(&mut self, method: &str, params: Option<Value>) -> anyhow::Result<()> {
        let mut msg = json!({"jsonrpc": "2.0", "method": method});
        if let Some(p) = params {
            msg["params"] = p;
        }
        self.send(&msg).await
    }

    /// The next line, parsed, within [`RECV_TIMEOUT`].
    ///
    /// # Errors
    /// When nothing arrives in time, the daemon closed the stream, or the line is not JSON.
    pub async fn recv(&mut self) -> anyhow::Result<Value> {
        self.recv_within(RECV_TIMEOUT).await
    }

    /// The next line, parsed, within `timeout`.
    ///
    /// # Errors
    /// As [`McpStream::recv`].
    pub async fn recv_within(&mut self, timeout: Duration) -> anyhow::Result<Value> {
        let mut line = Vec::new();
        let n = tokio::time::timeout(timeout, self.read.read_until(b'\n', &mut line))
            .await
            .with_context(|| format!("no message on the stream within {timeout:?}"))?
            .context("reading the stream")?;
        ensure!(n > 0, "the daemon closed the stream (EOF) while a message was expected");
        ensure!(line.ends_with(b"\n"), "the stream ended inside a line: {}", preview(&line));
        serde_json::from_slice(&line).with_context(|| format!("a line that is not JSON: {}", preview(&line)))
    }

    /// Waits for the daemon to close the stream: reads (and returns) whatever messages still
    /// arrive, until a clean end of stream within `timeout`.
    ///
    /// # Errors
    /// When the stream is still open after `timeout`, or ends with an error (e.g. a reset)
    /// instead of a clean EOF.
    pub async fn expect_eof(&mut self, timeout: Duration) -> anyhow::Result<Vec<Value>> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut got = Vec::new();
        loop {
            let mut line = Vec::new();
            let n = tokio::time::timeout_at(deadline, self.read.read_until(b'\n', &mut line))
                .await
                .with_context(|| format!("the stream is still open after {timeout:?}; read meanwhile: {got:?}"))?
                .context("the stream ended with an error instead of a clean EOF")?;
            if n == 0 {
                return Ok(got);
            }
            got.push(serde_json::from_slice(&line).with_context(|| format!("not JSON: {}", preview(&line)))?);
        }
    }

    /// Sends request `method` with `params` under a fresh id and returns its response object,
    /// keeping any other message read meanwhile in [`McpStream::skipped`].
    ///
    /// # Errors
    /// When no response with that id arrives within [`RECV_TIMEOUT`] of each read.
    pub async fn request(&mut self, method: &str, params: Value) -> anyhow::Result<Value> {
        self.next_id += 1;
        let id = json!(self.next_id);
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})).await?;
        self.response_to(&id).await.with_context(|| format!("waiting for the answer to {method} (id {id})"))
    }

    /// Reads until the response (no `method`) carrying `id`, keeping other messages in
    /// [`McpStream::skipped`].
    ///
    /// # Errors
    /// As [`McpStream::recv`].
    pub async fn response_to(&mut self, id: &Value) -> anyhow::Result<Value> {
        loop {
            let m = self.recv().await?;
            if m.get("method").is_none() && m.get("id") == Some(id) {
                return Ok(m);
            }
            self.skipped.push(m);
        }
    }

    /// Waits up to `timeout` for notification `method` (taking it from [`McpStream::skipped`]
    /// when [`McpStream::request`] already read past it), keeping other messages there.
    ///
    /// # Errors
    /// When it does not arrive in time.
    pub async fn notification(&mut self, method: &str, timeout: Duration) -> anyhow::Result<Value> {
        let is_it = |m: &Value| m["method"] == method && m.get("id").is_none();
        if let Some(i) = self.skipped.iter().position(is_it) {
            return Ok(self.skipped.remove(i));
        }
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let m = self.recv_within(left).await.with_context(|| format!("waiting for {method}"))?;
            if is_it(&m) {
                return Ok(m);
            }
            self.skipped.push(m);
        }
    }

    /// `initialize` with `version` and no client capabilities; the whole response object.
    ///
    /// # Errors
    /// As [`McpStream::request`].
    pub async fn initialize(&mut self, version: &str) -> anyhow::Result<Value> {
        self.initialize_with(version, json!({})).await
    }

    /// `initialize` with `version` and client `capabilities`; the whole response object.
    ///
    /// # Errors
    /// As [`McpStream::request`].
    pub async fn initialize_with(&mut self, version: &str, capabilities: Value) -> anyhow::Result<Value> {
        self.request(
            "initialize",
            json!({"protocolVersion": version, "capabilities": capabilities, "clientInfo": {"name": "coffer-tests-stream", "version": "1"}}),
        )
        .await
    }

    /// `tools/call` of exposed `name` with `arguments`; the whole response object.
    ///
    /// # Errors
    /// As [`McpStream::request`].
    pub async fn tool(&mut self, name: &str, arguments: Value) -> anyhow::Result<Value> {
        self.request("tools/call", json!({"name": name, "arguments": arguments})).await
    }

    /// Exposed tool names from `tools/list`.
    ///
    /// # Errors
    /// When the request fails.
    pub async fn tool_names(&mut self) -> anyhow::Result<Vec<String>> {
        let r = self.request("tools/list", json!({})).await?;
        let tools = r["result"]["tools"].as_array().with_context(|| format!("tools/list failed: {r}"))?;
        Ok(tools.iter().filter_map(|t| t["name"].as_str().map(str::to_owned)).collect())
    }

    /// `ping`, which must answer `{}`.
    ///
    /// # Errors
    /// When it does not.
    pub async fn ping(&mut self) -> anyhow::Result<()> {
        let r = self.request("ping", json!({})).await?;
        ensure!(r["result"] == json!({}), "ping answered {r}");
        Ok(())
    }

    /// Shuts down the write side (the daemon reads end of stream); reading still works.
    ///
    /// # Errors
    /// When the connection is already broken.
    pub async fn shutdown_write(&mut self) -> anyhow::Result<()> {
        self.write.shutdown().await.context("shutting down the write side")
    }
}

/// The first bytes of a line for error messages (lines may be megabytes long).
fn preview(line: &[u8]) -> String {
    let cut = &line[..line.len().min(300)];
    let more = if line.len() > cut.len() { format!("… ({} bytes)", line.len()) } else { String::new() };
    format!("{}{more}", String::from_utf8_lossy(cut))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_switching_head() {
        let (s, h) = parse_head(
            b"HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: coffer-mcp-stream\r\n\r\n",
        )
        .unwrap();
        assert_eq!(s, StatusCode::SWITCHING_PROTOCOLS);
        assert_eq!(h["upgrade"], PROTOCOL);
        assert!(parse_head(b"garbage\r\n\r\n").is_err());
    }
}
