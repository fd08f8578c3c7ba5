//! [`ApiClient`]: the CLI's client of the daemon's `/v1/*` REST API. Every command that talks
//! to the daemon goes through it, so authentication, timeouts, the error envelope and the trace
//! id are handled once.
use std::time::Duration;

use coffer_runtime::connect::Daemon;
use reqwest::Method;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::error::{ApiFailure, CliError};

/// Default deadline of one REST call. Generous: `POST …/restart` waits for a service to come
/// back healthy.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(90);

/// How many times [`ApiClient::send_idempotent`] sends a request again after no answer.
pub const IDEMPOTENT_RETRIES: u32 = 2;
/// The pause before each of those repeats.
pub const RETRY_PAUSE: Duration = Duration::from_millis(300);

/// Request header naming the acting party in the audit log; the CLI always says `cli`.
pub use coffer_types::header::ACTOR as ACTOR_HEADER;
/// Response header carrying the trace id.
pub use coffer_types::header::TRACE as TRACE_HEADER;

/// A successful (2xx) REST response, body kept as received so `--json` can print it unchanged.
#[derive(Debug, Clone)]
pub struct ApiResponse {
    pub status: u16,
    /// `X-Coffer-Trace`, when present.
    pub trace: Option<String>,
    /// The raw body (UTF-8; may be empty).
    pub body: String,
}

impl ApiResponse {
    /// The body parsed as JSON; an empty body is `null`.
    ///
    /// # Errors
    /// [`CliError::Failed`] when the body is not JSON.
    pub fn json(&self) -> Result<Value, CliError> {
        if self.body.trim().is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_str(&self.body).map_err(|e| {
            CliError::Failed(format!(
                "the daemon answered with a body that is not JSON ({e}); trace {}",
                self.trace.as_deref().unwrap_or("-")
            ))
        })
    }
}

impl ApiResponse {
    /// The body read as `T`, one of the `coffer-api` contract types.
    ///
    /// # Errors
    /// [`CliError::Failed`] when the body is not a `T` (a daemon of another version?), naming
    /// the field.
    pub fn parse<T: DeserializeOwned>(&self) -> Result<T, CliError> {
        let mut de = serde_json::Deserializer::from_str(&self.body);
        serde_path_to_error::deserialize(&mut de).map_err(|e| {
            CliError::Failed(format!(
                "the daemon's answer is not what this coffer expects (at {}: {}); is the daemon another version? trace {}",
                e.path(),
                e.inner(),
                self.trace.as_deref().unwrap_or("-")
            ))
        })
    }
}

/// An authenticated client of one running daemon.
#[derive(Clone)]
pub struct ApiClient {
    daemon: Daemon,
}

impl ApiClient {
    pub fn new(daemon: Daemon) -> Self {
        Self { daemon }
    }

    /// The daemon this client talks to (pid, port, version from `daemon.json`).
    pub fn daemon(&self) -> &Daemon {
        &self.daemon
    }

    /// A request to `path` (e.g. `/v1/mcp/servers`) carrying the token, `X-Coffer-Actor: cli`
    /// and the default timeout; add headers (`If-Match`), a body or another timeout, then pass it
    /// to [`ApiClient::send`].
    pub fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        self.daemon.request(method, path).header(ACTOR_HEADER, "cli").timeout(REQUEST_TIMEOUT)
    }

    /// Sends `req` and returns the 2xx response.
    ///
    /// # Errors
    /// [`CliError::Unreachable`] when the daemon does not answer; [`CliError::Api`] (decoded from
    /// the error envelope, with the trace id) for any non-2xx status.
    pub async fn send(&self, req: reqwest::RequestBuilder) -> Result<ApiResponse, CliError> {
        let resp = req.send().await?;
        Self::answer(resp).await
    }

    /// Sends `req`, which carries an `Idempotency-Key` (so the daemon answers a repeat with the
    /// first answer instead of acting twice), and sends it again — the same request, the same
    /// key — when it got no answer: the connection could not be made or broke before the
    /// response came. At most [`IDEMPOTENT_RETRIES`] repeats, [`RETRY_PAUSE`] apart, each said
    /// on stderr. A timeout is not repeated (the daemon may still be working on it).
    ///
    /// # Errors
    /// As [`ApiClient::send`], for the last attempt.
    pub async fn send_idempotent(&self, req: reqwest::RequestBuilder) -> Result<ApiResponse, CliError> {
        let mut attempt = 0;
        loop {
            let Some(this) = req.try_clone() else { return self.send(req).await };
            match this.send().await {
                Ok(resp) => return Self::answer(resp).await,
                Err(e) if attempt < IDEMPOTENT_RETRIES && (e.is_connect() || e.is_request()) && !e.is_timeout() => {
                    attempt += 1;
                    crate::eprintln_printable!(
                        "The daemon did not answer ({}); sending again with the same Idempotency-Key ({attempt} of {IDEMPOTENT_RETRIES}).",
                        crate::error::error_chain(&e)
                    );
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// A response as [`ApiClient::send`] answers it: 2xx kept, any other status decoded.
    async fn answer(resp: reqwest::Response) -> Result<ApiResponse, CliError> {
        let status = resp.status().as_u16();
        let trace = resp.headers().get(TRACE_HEADER).and_then(|v| v.to_str().ok()).map(str::to_owned);
        let body = resp.text().await?;
        if (200..300).contains(&status) {
            Ok(ApiResponse { status, trace, body })
        } else {
            Err(ApiFailure::from_body(status, trace, &body).into())
        }
    }

    /// `GET path` as a stream (SSE): the token, `X-Coffer-Actor: cli`, `Accept:
    /// text/event-stream`, `Last-Event-ID` when `last_event_id` is given, and no overall
    /// timeout (the caller bounds the silence between chunks). Returns once the headers arrived.
    ///
    /// # Errors
    /// As [`ApiClient::send`]; an error status has its body read and decoded.
    pub async fn stream(&self, path: &str, last_event_id: Option<u64>) -> Result<reqwest::Response, CliError> {
        let mut req =
            self.daemon.request(Method::GET, path).header(ACTOR_HEADER, "cli").header("Accept", "text/event-stream");
        if let Some(id) = last_event_id {
            req = req.header("Last-Event-ID", id.to_string());
        }
        let resp = req.send().await?;
        let status = resp.status().as_u16();
        if (200..300).contains(&status) {
            return Ok(resp);
        }
        let trace = resp.headers().get(TRACE_HEADER).and_then(|v| v.to_str().ok()).map(str::to_owned);
        let body = resp.text().await?;
        Err(ApiFailure::from_body(status, trace, &body).into())
    }

    /// `GET path` → the raw 2xx response (for `--json`, which prints bodies unchanged).
    pub async fn get_raw(&self, path: &str) -> Result<ApiResponse, CliError> {
        self.send(self.request(Method::GET, path)).await
    }

    /// `GET path` → parsed JSON.
    pub async fn get(&self, path: &str) -> Result<Value, CliError> {
        self.get_raw(path).await?.json()
    }

    /// `GET path` → the body as contract type `T` ([`ApiResponse::parse`]).
    pub async fn get_as<T: DeserializeOwned>(&self, path: &str) -> Result<T, CliError> {
        self.get_raw(path).await?.parse()
    }

    /// `POST path` with an optional JSON body → parsed JSON.
    pub async fn post(&self, path: &str, body: Option<&Value>) -> Result<Value, CliError> {
        self.call(Method::POST, path, body).await
    }

    /// `PATCH path` with a JSON body → parsed JSON.
    pub async fn patch(&self, path: &str, body: &Value) -> Result<Value, CliError> {
        self.call(Method::PATCH, path, Some(body)).await
    }

    /// `PUT path` with a JSON body → parsed JSON.
    pub async fn put(&self, path: &str, body: &Value) -> Result<Value, CliError> {
        self.call(Method::PUT, path, Some(body)).await
    }

    /// `DELETE path` → parsed JSON (`null` for an empty body).
    pub async fn delete(&self, path: &str) -> Result<Value, CliError> {
        self.call(Method::DELETE, path, None).await
    }

    async fn call(&self, method: Method, path: &str, body: Option<&Value>) -> Result<Value, CliError> {
        let mut req = self.request(method, path);
        if let Some(b) = body {
            req = req.json(b);
        }
        self.send(req).await?.json()
    }
}

/// Percent-encodes one path segment (a server or service name) for use inside a REST path.
pub fn path_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// [`path_segment`] of a name the user gave, refusing what a URL cannot carry as one segment:
/// empty, `.` or `..` (the HTTP client would resolve them into another path, and the daemon
/// would answer for that one). `what` names the argument in the usage error.
///
/// # Errors
/// [`CliError::Usage`] naming `what` and the value.
pub fn name_segment(what: &str, s: &str) -> Result<String, CliError> {
    if s.is_empty() || s == "." || s == ".." {
        return Err(CliError::Usage(format!("{what} {s:?} is not valid: it must not be empty, \".\" or \"..\"")));
    }
    Ok(path_segment(s))
}

/// `path` with a query string of the parameters that have a value, each percent-encoded:
/// `with_query("/v1/audit", &[("actor", Some("cli")), ("limit", None)])` → `/v1/audit?actor=cli`.
pub fn with_query(path: &str, params: &[(&str, Option<&str>)]) -> String {
    let mut out = path.to_owned();
    let mut sep = '?';
    for (k, v) in params {
        if let Some(v) = v {
            out.push(sep);
            out.push_str(&path_segment(k));
            out.push('=');
            out.push_str(&path_segment(v));
            sep = '&';
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_skip_absent_values_and_escape() {
        assert_eq!(with_query("/v1/audit", &[("actor", None), ("limit", None)]), "/v1/audit");
        assert_eq!(
            with_query("/v1/invocations", &[("server", Some("a b")), ("since", None), ("limit", Some("5"))]),
            "/v1/invocations?server=a%20b&limit=5"
        );
        assert_eq!(
            with_query("/p", &[("since", Some("2026-11-30T09:00:00+01:00"))]),
            "/p?since=2026-11-30T09%3A00%3A00%2B01%3A00"
        );
    }

    #[test]
    fn names_that_are_dot_segments_are_usage_errors() {
        for bad in ["", ".", ".."] {
            let e = name_segment("fact id", bad).unwrap_err();
            assert!(matches!(&e, CliError::Usage(m) if m.starts_with("fact id")), "{bad:?}: {e:?}");
        }
        assert_eq!(name_segment("kb", "...").unwrap(), "...");
        assert_eq!(name_segment("kb", "a/..").unwrap(), "a%2F..");
    }

    #[test]
    fn path_segments_are_escaped() {
        assert_eq!(path_segment("git-hub_1.x~"), "git-hub_1.x~");
        assert_eq!(path_segment("a/b c"), "a%2Fb%20c");
        assert_eq!(path_segment("é"), "%C3%A9");
    }

    #[test]
    fn empty_body_is_null_and_garbage_is_an_error() {
        let r = |body: &str| ApiResponse { status: 200, trace: Some("t".into()), body: body.into() };
        assert_eq!(r("").json().unwrap(), Value::Null);
        assert_eq!(r(r#"{"a":1}"#).json().unwrap()["a"], 1);
        assert!(matches!(r("<html>").json(), Err(CliError::Failed(_))));
    }
}
