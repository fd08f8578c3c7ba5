//! HTTP access to a daemon under test: a client that carries the token, and [`Reply`], a fully
//! read response with helpers for Coffer's wire contracts (error envelope, JSON-RPC error,
//! `X-Coffer-Trace`).
use std::future::Future;
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use reqwest::header::HeaderMap;
use reqwest::{Method, RequestBuilder, StatusCode};
use serde_json::Value;

/// Response header carrying the trace id.
pub use coffer_types::header::TRACE as TRACE_HEADER;

/// A loopback HTTP client: no proxy, short connect timeout, 30 s request timeout.
pub fn http_client() -> reqwest::Client {
    coffer_runtime::tls::ensure_provider();
    reqwest::Client::builder()
        .no_proxy()
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(30))
        .build()
        .expect("reqwest client builds")
}

/// A client for one running daemon: its base URL and token (from `daemon.json`).
#[derive(Clone)]
pub struct Api {
    base_url: String,
    port: u16,
    token: String,
    http: reqwest::Client,
}

impl Api {
    /// A client for the daemon on `127.0.0.1:port` with `token`.
    pub fn new(port: u16, token: impl Into<String>) -> Self {
        Self { base_url: format!("http://127.0.0.1:{port}"), port, token: token.into(), http: http_client() }
    }

    /// `http://127.0.0.1:<port>`
    pub fn base_url(&self) -> &str {
        &self.base_url
    }
    pub fn port(&self) -> u16 {
        self.port
    }
    /// The public token (64 hex characters).
    pub fn token(&self) -> &str {
        &self.token
    }
    /// The underlying client, for requests built by hand.
    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }
    /// `http://127.0.0.1:<port><path>`
    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base_url, path)
    }

    /// A request carrying `X-Coffer-Token`.
    pub fn request(&self, method: Method, path: &str) -> RequestBuilder {
        self.anon(method, path).header("X-Coffer-Token", &self.token)
    }
    /// A request without any credentials.
    pub fn anon(&self, method: Method, path: &str) -> RequestBuilder {
        self.http.request(method, self.url(path))
    }
    pub fn get(&self, path: &str) -> RequestBuilder {
        self.request(Method::GET, path)
    }
    pub fn post(&self, path: &str) -> RequestBuilder {
        self.request(Method::POST, path)
    }
    /// `POST path` with a JSON body and the token.
    pub fn post_json(&self, path: &str, body: &Value) -> RequestBuilder {
        self.post(path).json(body)
    }

    /// Sends a hand-written HTTP/1.1 request over a fresh connection and reads the response:
    /// the request line, `Host`, the token, `headers`, `Connection: close`, then `body` as is.
    /// A `Content-Length` in `headers` may promise more than `body` holds: that shows a check
    /// made on the headers alone, before any handler reads the body (a client that writes a
    /// large body the server refuses early may instead see a broken pipe).
    ///
    /// # Errors
    /// On a transport error, a malformed response, or no complete response within 10 s.
    pub async fn raw(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, String)],
        body: &[u8],
    ) -> anyhow::Result<Reply> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut head =
            format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nX-Coffer-Token: {}\r\n", self.port, self.token);
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("Connection: close\r\n\r\n");
        let exchange = async {
            let mut s = tokio::net::TcpStream::connect(("127.0.0.1", self.port)).await?;
            s.write_all(head.as_bytes()).await?;
            s.write_all(body).await?;
            let mut buf = Vec::new();
            let mut chunk = [0u8; 8192];
            loop {
                if let Some(r) = parse_response(&buf)? {
                    return Ok(r);
                }
                let n = s.read(&mut chunk).await?;
                if n == 0 {
                    return parse_response(&buf)?.context("connection closed before a complete response");
                }
                buf.extend_from_slice(&chunk[..n]);
            }
        };
        tokio::time::timeout(Duration::from_secs(10), exchange).await.context("no response within 10 s")?
    }

    /// `GET /v1/health` (no token); the body as JSON.
    ///
    /// # Errors
    /// On a transport error or a non-200 status.
    pub async fn health(&self) -> anyhow::Result<Value> {
        self.anon(Method::GET, "/v1/health").reply().await?.ok_json()
    }

    /// `GET /v1/status`; the body as JSON.
    ///
    /// # Errors
    /// On a transport error or a non-200 status.
    pub async fn status(&self) -> anyhow::Result<Value> {
        self.get("/v1/status").reply().await?.ok_json()
    }

    /// The entry for service `name` in `GET /v1/status`.
    ///
    /// # Errors
    /// As [`Api::status`], or when the service is not listed.
    pub async fn service(&self, name: &str) -> anyhow::Result<Value> {
        let st = self.status().await?;
        service_in(&st, name).cloned()
    }
}

/// The entry for service `name` in a `/v1/status` body.
///
/// # Errors
/// When it is not listed.
pub fn service_in<'a>(status: &'a Value, name: &str) -> anyhow::Result<&'a Value> {
    status["services"]
        .as_array()
        .and_then(|a| a.iter().find(|s| s["name"] == name))
        .with_context(|| format!("service {name:?} not in /v1/status: {status}"))
}

/// Parses one complete HTTP/1.1 response with a `Content-Length` body; `None` while incomplete.
fn parse_response(buf: &[u8]) -> anyhow::Result<Option<Reply>> {
    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else { return Ok(None) };
    let (status, headers) = parse_head(&buf[..end])?;
    let len: usize = headers.get("content-length").and_then(|v| v.to_str().ok()?.parse().ok()).unwrap_or(0);
    let body = &buf[end + 4..];
    if body.len() < len {
        return Ok(None);
    }
    Ok(Some(Reply { status, headers, text: String::from_utf8_lossy(&body[..len]).into_owned() }))
}

/// Parses an HTTP/1.1 response head (status line and header lines, without the blank line).
///
/// # Errors
/// When it is not UTF-8 or not an HTTP/1.1 head.
pub fn parse_head(head: &[u8]) -> anyhow::Result<(StatusCode, HeaderMap)> {
    let head = std::str::from_utf8(head).context("response head is not UTF-8")?;
    let mut lines = head.trim_end().split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    anyhow::ensure!(status_line.starts_with("HTTP/1.1 "), "not an HTTP/1.1 status line: {status_line:?}");
    let code: u16 = status_line
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .with_context(|| format!("bad status line {status_line:?}"))?;
    let mut headers = HeaderMap::new();
    for l in lines {
        let (k, v) = l.split_once(':').with_context(|| format!("bad header line {l:?}"))?;
        headers.append(reqwest::header::HeaderName::from_bytes(k.trim().as_bytes())?, v.trim().parse()?);
    }
    Ok((StatusCode::from_u16(code)?, headers))
}

/// A response read in full.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub text: String,
}

/// Sends a request and reads the whole response into a [`Reply`].
pub trait SendExt {
    /// # Errors
    /// On a transport error (connection refused, reset, timeout).
    fn reply(self) -> impl Future<Output = anyhow::Result<Reply>> + Send;
}

impl SendExt for RequestBuilder {
    async fn reply(self) -> anyhow::Result<Reply> {
        let resp = self.send().await.context("sending request")?;
        Reply::read(resp).await
    }
}

impl Reply {
    /// Reads `resp` in full.
    ///
    /// # Errors
    /// When the body cannot be read.
    pub async fn read(resp: reqwest::Response) -> anyhow::Result<Self> {
        let status = resp.status();
        let headers = resp.headers().clone();
        let text = resp.text().await.context("reading response body")?;
        Ok(Self { status, headers, text })
    }

    /// The body as JSON.
    ///
    /// # Errors
    /// When it is not JSON.
    pub fn json(&self) -> anyhow::Result<Value> {
        serde_json::from_str(&self.text).with_context(|| format!("{} body is not JSON: {}", self.status, self.text))
    }

    /// The body as JSON, requiring status 200.
    ///
    /// # Errors
    /// On another status or a non-JSON body.
    pub fn ok_json(&self) -> anyhow::Result<Value> {
        ensure!(self.status == StatusCode::OK, "expected 200, got {}: {}", self.status, self.text);
        self.json()
    }

    /// `X-Coffer-Trace`, checked to be 16 lowercase hex characters.
    ///
    /// # Errors
    /// When missing or malformed.
    pub fn trace_id(&self) -> anyhow::Result<&str> {
        let v = self
            .headers
            .get(TRACE_HEADER)
            .with_context(|| format!("{} response has no X-Coffer-Trace: {:?}", self.status, self.headers))?
            .to_str()?;
        ensure!(
            v.len() == 16 && v.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()),
            "bad trace id {v:?}"
        );
        Ok(v)
    }

    /// Checks a `/v1` error: `status`, the envelope `{"error":{"code","message","details"}}`
    /// with `code`, a non-empty message, an object `details`, and `X-Coffer-Trace`. Returns the
    /// `error` object.
    ///
    /// # Errors
    /// Describing the first mismatch, with the body.
    pub fn expect_envelope(&self, status: u16, code: &str) -> anyhow::Result<Value> {
        ensure!(self.status.as_u16() == status, "expected {status} {code}, got {}: {}", self.status, self.text);
        self.trace_id()?;
        let body = self.json()?;
        let err = body.get("error").with_context(|| format!("no error envelope: {body}"))?;
        ensure!(err["code"] == code, "expected code {code}, got {body}");
        ensure!(err["message"].as_str().is_some_and(|m| !m.is_empty()), "empty message: {body}");
        ensure!(err["details"].is_object(), "details is not an object: {body}");
        if body.as_object().is_some_and(|o| o.len() != 1) {
            bail!("envelope has extra top-level fields: {body}");
        }
        Ok(err.clone())
    }

    /// Checks an `/mcp` HTTP error: `status`, a JSON-RPC 2.0 error object with `id: null`, an
    /// integer code and a message, and `X-Coffer-Trace`. Returns the `error` member (check its
    /// `code` where the contract fixes one).
    ///
    /// # Errors
    /// Describing the first mismatch, with the body.
    pub fn expect_jsonrpc_error(&self, status: u16) -> anyhow::Result<Value> {
        self.expect_jsonrpc_error_for(status, &Value::Null)
    }

    /// [`Reply::expect_jsonrpc_error`] for a refused request whose id was readable: the error
    /// carries that `id`.
    ///
    /// # Errors
    /// Describing the first mismatch, with the body.
    pub fn expect_jsonrpc_error_for(&self, status: u16, id: &Value) -> anyhow::Result<Value> {
        ensure!(self.status.as_u16() == status, "expected {status}, got {}: {}", self.status, self.text);
        self.trace_id()?;
        let body = self.json()?;
        ensure!(body["jsonrpc"] == "2.0", "not JSON-RPC 2.0: {body}");
        ensure!(body.get("id") == Some(id), "id is not {id}: {body}");
        ensure!(body["error"]["code"].is_i64(), "no integer code: {body}");
        ensure!(body["error"]["message"].is_string(), "no message: {body}");
        Ok(body["error"].clone())
    }
}

/// Serves `app` on a free loopback port until the returned task is aborted or dropped with its
/// owner: `("http://127.0.0.1:PORT", task)`. Every accepted connection gets `TCP_NODELAY`, so a
/// fake never adds Nagle's delay (~40 ms a reply written in two parts) to what a test or a
/// benchmark measures through it.
///
/// # Errors
/// When no loopback port can be bound.
pub async fn serve_on_loopback(app: axum::Router) -> anyhow::Result<(String, tokio::task::JoinHandle<()>)> {
    use axum::serve::ListenerExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok((url, task))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_complete_responses_only() {
        let full = b"HTTP/1.1 413 Payload Too Large\r\ncontent-type: application/json\r\nx-coffer-trace: 0123456789abcdef\r\ncontent-length: 2\r\n\r\n{}";
        assert!(parse_response(&full[..20]).unwrap().is_none(), "head incomplete");
        assert!(parse_response(&full[..full.len() - 1]).unwrap().is_none(), "body incomplete");
        let r = parse_response(full).unwrap().unwrap();
        assert_eq!(r.status, 413);
        assert_eq!(r.text, "{}");
        assert_eq!(r.trace_id().unwrap(), "0123456789abcdef");
    }

    #[test]
    fn envelope_check_names_the_mismatch() {
        let mut headers = HeaderMap::new();
        headers.insert(TRACE_HEADER, "0123456789abcdef".parse().unwrap());
        let r = Reply {
            status: StatusCode::NOT_FOUND,
            headers,
            text: r#"{"error":{"code":"NOT_FOUND","message":"no route","details":{}}}"#.into(),
        };
        assert_eq!(r.expect_envelope(404, "NOT_FOUND").unwrap()["message"], "no route");
        let e = r.expect_envelope(404, "CONFLICT").unwrap_err().to_string();
        assert!(e.contains("expected code CONFLICT"), "{e}");
        assert!(r.expect_jsonrpc_error(404).is_err(), "an envelope is not JSON-RPC");
    }
}
