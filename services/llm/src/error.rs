//! The one error classification of every wire: HTTP statuses, transport failures, timeouts,
//! stalls, cut streams and garbage become an [`LlmError`] whose message names the provider
//! (wire and base URL, without user info or query) and the cause, quotes the provider's own
//! error type and message when it gave one (whitespace collapsed, at most
//! [`MAX_QUOTED_CHARS`] characters), and never contains the key: every quoted text has the
//! key replaced by `[redacted]`.
use std::time::{Duration, SystemTime};

use reqwest::StatusCode;
use reqwest::header::HeaderMap;
use secrecy::{ExposeSecret, SecretString};

use crate::{ErrorKind, LlmError, Wire};

/// Longest quoted provider text, characters.
pub(crate) const MAX_QUOTED_CHARS: usize = 300;

/// What a provider said about its own failure (an error body or a stream's error event).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Detail {
    /// The provider's error type or code (`authentication_error`, `rate_limit_exceeded`).
    pub(crate) kind: Option<String>,
    /// Its message.
    pub(crate) message: String,
}

impl Detail {
    /// The detail of an error body shaped `{"error": {"code"|"type", "message"}}` (Anthropic,
    /// OpenAI and compatible servers) or `{"error": "text"}` (Ollama); `None` for another shape.
    pub(crate) fn from_body(body: &serde_json::Value) -> Option<Self> {
        match &body["error"] {
            serde_json::Value::String(s) => Some(Self { kind: None, message: s.clone() }),
            serde_json::Value::Object(o) => {
                // OpenAI's `code` (`invalid_api_key`) says more than its `type`
                // (`invalid_request_error`); Anthropic sends only `type`.
                let kind = ["code", "type"]
                    .iter()
                    .find_map(|k| o.get(*k).and_then(|v| v.as_str()).filter(|s| !s.is_empty()))
                    .map(str::to_owned);
                let message = o.get("message").and_then(|m| m.as_str()).unwrap_or_default().to_owned();
                (kind.is_some() || !message.is_empty()).then_some(Self { kind, message })
            }
            _ => None,
        }
    }
}

/// A provider's error type (from a stream's error event) as one of our kinds: a failure the
/// provider reports without a type (Ollama's `{"error"}` line) is its own, Server; a type we do
/// not know is BadResponse.
pub(crate) fn kind_of_provider_type(kind: Option<&str>) -> ErrorKind {
    let Some(kind) = kind else {
        return ErrorKind::Server;
    };
    match kind {
        "authentication_error" | "permission_error" | "invalid_api_key" | "insufficient_quota" => ErrorKind::Auth,
        "not_found_error" | "model_not_found" => ErrorKind::NotFound,
        "rate_limit_error" | "rate_limit_exceeded" | "rate_limited" => ErrorKind::RateLimited,
        "overloaded_error" | "api_error" | "server_error" | "server_is_overloaded" | "internal_error" => {
            ErrorKind::Server
        }
        _ => ErrorKind::BadResponse,
    }
}

/// What the failed request was for (changes the wording of a 404).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Purpose {
    /// A model request.
    Model,
    /// The models listing.
    Models,
}

/// Names one provider and knows its key, to word and scrub every error about it.
#[derive(Clone)]
pub(crate) struct Namer {
    /// `anthropic at https://api.anthropic.com`.
    provider: String,
    wire: Wire,
    secret: Option<SecretString>,
}

impl std::fmt::Debug for Namer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Namer").field("provider", &self.provider).finish_non_exhaustive()
    }
}

/// `scheme://host[:port]/path` of a URL: no user info, query or fragment (where keys hide).
pub(crate) fn shown_url(u: &url::Url) -> String {
    let mut s = format!("{}://{}", u.scheme(), u.host_str().unwrap_or(""));
    if let Some(p) = u.port() {
        s.push_str(&format!(":{p}"));
    }
    s.push_str(u.path().trim_end_matches('/'));
    s
}

/// A duration for a person: `250 ms`, `30 s`, `1.5 s`.
pub(crate) fn human(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        format!("{} ms", d.as_millis())
    } else if d.subsec_millis() == 0 {
        format!("{} s", d.as_secs())
    } else {
        format!("{:.1} s", d.as_secs_f64())
    }
}

impl Namer {
    pub(crate) fn new(wire: Wire, base: &url::Url, secret: Option<SecretString>) -> Self {
        Self { provider: format!("{} at {}", wire.as_str(), shown_url(base)), wire, secret }
    }

    /// `anthropic at http://127.0.0.1:4000`.
    pub(crate) fn provider(&self) -> &str {
        &self.provider
    }

    /// `text` as it may be quoted: the key (and any line break or control character) gone,
    /// whitespace collapsed, at most [`MAX_QUOTED_CHARS`] characters.
    pub(crate) fn scrub(&self, text: &str) -> String {
        let mut t = text.to_owned();
        if let Some(key) = &self.secret {
            let key = key.expose_secret();
            if !key.is_empty() {
                t = t.replace(key, "[redacted]");
            }
        }
        let t: String = t.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
        let t = t.split_whitespace().collect::<Vec<_>>().join(" ");
        if t.chars().count() > MAX_QUOTED_CHARS {
            t.chars().take(MAX_QUOTED_CHARS).collect::<String>() + "…"
        } else {
            t
        }
    }

    fn err(
        &self,
        kind: ErrorKind,
        message: String,
        http_status: Option<u16>,
        retry_after: Option<Duration>,
    ) -> LlmError {
        LlmError { kind, message, http_status, retry_after }
    }

    /// `authentication_error: invalid x-api-key`, scrubbed; the status's reason when the body
    /// said nothing usable.
    fn detail_text(&self, status: StatusCode, body: &[u8]) -> String {
        let text = String::from_utf8_lossy(body);
        let detail = serde_json::from_str::<serde_json::Value>(&text).ok().and_then(|v| Detail::from_body(&v));
        match detail {
            Some(Detail { kind: Some(k), message }) if !message.is_empty() => self.scrub(&format!("{k}: {message}")),
            Some(Detail { kind: Some(k), .. }) => self.scrub(&k),
            Some(Detail { kind: None, message }) if !message.is_empty() => self.scrub(&message),
            _ if text.trim().is_empty() => status.canonical_reason().unwrap_or("no message").to_owned(),
            _ => self.scrub(&text),
        }
    }

    /// A non-2xx answer: 401/403 → Auth, 404 → NotFound, 429 → RateLimited (with
    /// `retry-after`/`retry-after-ms`), 5xx → Server (with them too when sent), any other →
    /// BadResponse.
    pub(crate) fn status(&self, status: StatusCode, headers: &HeaderMap, body: &[u8], purpose: Purpose) -> LlmError {
        let p = &self.provider;
        let code = status.as_u16();
        let detail = self.detail_text(status, body);
        let (kind, message, retry) = match code {
            401 if self.secret.is_none() => {
                (ErrorKind::Auth, format!("{p} wants a key and the connection has none (401 {detail})"), None)
            }
            401 => (ErrorKind::Auth, format!("{p} refused the key (401 {detail})"), None),
            403 => (ErrorKind::Auth, format!("{p} denied access with this key (403 {detail})"), None),
            404 if purpose == Purpose::Models => (
                ErrorKind::NotFound,
                format!("{p} has no model listing (404 {detail}); type the model id instead"),
                None,
            ),
            404 => (
                ErrorKind::NotFound,
                format!("{p} knows no such model or endpoint (404 {detail}); check the model id and the base URL"),
                None,
            ),
            429 => {
                let retry = retry_after(headers, SystemTime::now());
                let when = retry.map_or_else(|| "try again later".to_owned(), |d| format!("retry after {}", human(d)));
                (ErrorKind::RateLimited, format!("{p} is rate limiting requests (429 {detail}); {when}"), retry)
            }
            // An overloaded server may say when to come back, too (Anthropic's 529, a 503).
            500..=599 => (
                ErrorKind::Server,
                format!("{p} failed on its side (HTTP {code} {detail})"),
                retry_after(headers, SystemTime::now()),
            ),
            _ => (ErrorKind::BadResponse, format!("{p} rejected the request (HTTP {code} {detail})"), None),
        };
        self.err(kind, message, Some(code), retry)
    }

    /// A failure before any answer: timeout, TLS, connection refused, DNS, reset.
    pub(crate) fn transport(&self, e: &reqwest::Error, timeout: Duration) -> LlmError {
        if e.is_timeout() {
            return self.timeout(timeout);
        }
        let cause = self.scrub(&cause_chain(e));
        if is_tls(e) {
            return self.err(
                ErrorKind::Tls,
                format!("{} failed the TLS handshake ({cause})", self.provider),
                None,
                None,
            );
        }
        let message = if e.is_connect() {
            format!("{} is unreachable ({cause})", self.provider)
        } else {
            format!("{} could not be reached: the request failed ({cause})", self.provider)
        };
        self.err(ErrorKind::Unreachable, message, None, None)
    }

    /// No answer within the request timeout.
    pub(crate) fn timeout(&self, after: Duration) -> LlmError {
        self.err(ErrorKind::Timeout, format!("{} did not answer within {}", self.provider, human(after)), None, None)
    }

    /// A stream silent for the stall timeout.
    pub(crate) fn stalled(&self, after: Duration) -> LlmError {
        let message =
            format!("{} stopped sending mid-answer: nothing for {} (stream stalled)", self.provider, human(after));
        self.err(ErrorKind::Timeout, message, None, None)
    }

    /// A stream that ended (or broke) before its terminal event.
    pub(crate) fn cut(&self, terminal: &str, cause: Option<&reqwest::Error>) -> LlmError {
        let why = cause.map(|e| format!(": {}", self.scrub(&cause_chain(e)))).unwrap_or_default();
        let message = format!("{} cut the answer short: the stream ended before `{terminal}`{why}", self.provider);
        self.err(ErrorKind::BadResponse, message, None, None)
    }

    /// An answer that is not the wire's documented shape.
    pub(crate) fn garbage(&self, what: &str) -> LlmError {
        let message = format!(
            "{} answered something that is not the {} wire ({})",
            self.provider,
            self.wire.as_str(),
            self.scrub(what)
        );
        self.err(ErrorKind::BadResponse, message, None, None)
    }

    /// An error the provider reported inside a 200 answer (a stream's error event).
    pub(crate) fn reported(&self, detail: &Detail) -> LlmError {
        let kind = kind_of_provider_type(detail.kind.as_deref());
        let said = match (&detail.kind, detail.message.is_empty()) {
            (Some(k), false) => format!("{k}: {}", detail.message),
            (Some(k), true) => k.clone(),
            (None, _) => detail.message.clone(),
        };
        let message = format!("{} reported an error mid-answer ({})", self.provider, self.scrub(&said));
        self.err(kind, message, None, None)
    }

    /// A configuration problem found before sending (a key that cannot be a header).
    pub(crate) fn config(&self, kind: ErrorKind, what: &str) -> LlmError {
        self.err(kind, format!("{}: {what}", self.provider), None, None)
    }
}

/// A 429's wait: `retry-after-ms` (OpenAI), else `retry-after` as seconds or an HTTP date
/// (RFC 9110 §10.2.3), relative to `now`; `None` when absent or unreadable.
pub(crate) fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let value = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim);
    if let Some(ms) = value("retry-after-ms").and_then(|v| v.parse::<f64>().ok()).filter(|v| v.is_finite() && *v >= 0.0)
    {
        return Some(Duration::from_secs_f64(ms / 1000.0));
    }
    let v = value("retry-after")?;
    if let Ok(secs) = v.parse::<f64>() {
        return (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs));
    }
    let at = httpdate::parse_http_date(v).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// An error's message and its causes, de-duplicated and without the request URL (which may
/// carry a key in its query or user info).
fn cause_chain(e: &reqwest::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut push = |s: String| {
        if !s.is_empty() && !parts.iter().any(|p| p.contains(&s)) {
            parts.push(s);
        }
    };
    // reqwest's own words ("error sending request for url") add nothing when a cause follows.
    if std::error::Error::source(e).is_none() {
        push(e.without_url_ref());
    }
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        push(s.to_string());
        source = s.source();
    }
    parts.join(": ")
}

/// Whether a transport error is a TLS failure (a rustls error anywhere in its chain, also
/// inside an `io::Error`, whose `source` skips the error it wraps).
fn is_tls(e: &reqwest::Error) -> bool {
    // The request's own message (which names the URL) is skipped: only its causes count.
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if s.is::<rustls::Error>() {
            return true;
        }
        if let Some(io) = s.downcast_ref::<std::io::Error>()
            && io.get_ref().is_some_and(|inner| inner.is::<rustls::Error>())
        {
            return true;
        }
        // The connector may box the rustls error in a type of its own; its words still say.
        let text = s.to_string().to_ascii_lowercase();
        if [
            "certificate",
            "tls handshake",
            "handshakefailure",
            "corrupt message",
            "peer is incompatible",
            "received fatal alert",
        ]
        .iter()
        .any(|w| text.contains(w))
        {
            return true;
        }
        source = s.source();
    }
    false
}

/// `without_url` without consuming the error.
trait WithoutUrlRef {
    fn without_url_ref(&self) -> String;
}

impl WithoutUrlRef for reqwest::Error {
    fn without_url_ref(&self) -> String {
        let mut msg = self.to_string();
        if let Some(u) = self.url() {
            msg = msg.replace(u.as_str(), &shown_url(u));
            msg = msg.replace(&format!(" ({})", shown_url(u)), "");
        }
        msg
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    fn namer(secret: Option<&str>) -> Namer {
        let base = url::Url::parse("https://user:pw@api.example.com/v1?key=abc").unwrap_or_else(|e| panic!("{e}"));
        Namer::new(Wire::Anthropic, &base, secret.map(|s| SecretString::from(s.to_owned())))
    }

    #[test]
    fn provider_name_hides_user_info_and_query() {
        assert_eq!(namer(None).provider(), "anthropic at https://api.example.com/v1");
    }

    #[test]
    fn statuses_are_classified_and_the_key_is_redacted() {
        let n = namer(Some("sk-very-secret"));
        let h = HeaderMap::new();
        let body = br#"{"type":"error","error":{"type":"authentication_error","message":"bad key sk-very-secret"}}"#;
        let e = n.status(StatusCode::UNAUTHORIZED, &h, body, Purpose::Model);
        assert_eq!((e.kind, e.http_status), (ErrorKind::Auth, Some(401)));
        assert!(!e.message.contains("sk-very-secret"), "{}", e.message);
        assert!(e.message.contains("authentication_error: bad key [redacted]"), "{}", e.message);
        assert!(e.message.starts_with("anthropic at https://api.example.com/v1 refused the key"), "{}", e.message);
        for (code, kind) in [
            (403, ErrorKind::Auth),
            (404, ErrorKind::NotFound),
            (429, ErrorKind::RateLimited),
            (500, ErrorKind::Server),
            (529, ErrorKind::Server),
            (400, ErrorKind::BadResponse),
            (422, ErrorKind::BadResponse),
        ] {
            let status = StatusCode::from_u16(code).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(n.status(status, &h, b"", Purpose::Model).kind, kind, "{code}");
        }
        let e = n.status(StatusCode::NOT_FOUND, &h, b"<html>nope</html>", Purpose::Models);
        assert!(e.message.contains("no model listing (404 <html>nope</html>)"), "{}", e.message);
        let long = "x".repeat(5000);
        let e = n.status(StatusCode::BAD_REQUEST, &h, long.as_bytes(), Purpose::Model);
        assert!(e.message.len() < 500, "{}", e.message.len());
        let e = n.status(StatusCode::UNAUTHORIZED, &h, b"", Purpose::Model);
        assert!(e.message.contains("refused the key (401 Unauthorized)"), "{}", e.message);
        let e = namer(None).status(StatusCode::UNAUTHORIZED, &h, b"{\"error\":\"no key\"}", Purpose::Model);
        assert!(e.message.contains("wants a key and the connection has none (401 no key)"), "{}", e.message);
    }

    #[test]
    fn retry_after_seconds_date_and_ms() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let mut h = HeaderMap::new();
        assert_eq!(retry_after(&h, now), None);
        h.insert("retry-after", HeaderValue::from_static("7"));
        assert_eq!(retry_after(&h, now), Some(Duration::from_secs(7)));
        h.insert(
            "retry-after",
            HeaderValue::from_str(&httpdate::fmt_http_date(now + Duration::from_secs(90)))
                .unwrap_or_else(|e| panic!("{e}")),
        );
        assert_eq!(retry_after(&h, now), Some(Duration::from_secs(90)));
        h.insert(
            "retry-after",
            HeaderValue::from_str(&httpdate::fmt_http_date(now - Duration::from_secs(90)))
                .unwrap_or_else(|e| panic!("{e}")),
        );
        assert_eq!(retry_after(&h, now), Some(Duration::ZERO));
        h.insert("retry-after", HeaderValue::from_static("soon"));
        assert_eq!(retry_after(&h, now), None);
        h.insert("retry-after-ms", HeaderValue::from_static("1500"));
        assert_eq!(retry_after(&h, now), Some(Duration::from_millis(1500)));
        let mut h = HeaderMap::new();
        h.insert("retry-after", HeaderValue::from_static("3"));
        let e = namer(None).status(StatusCode::TOO_MANY_REQUESTS, &h, b"", Purpose::Model);
        assert_eq!(e.retry_after, Some(Duration::from_secs(3)));
        assert!(e.message.contains("retry after 3 s"), "{}", e.message);
    }

    #[test]
    fn reported_errors_map_by_type() {
        let n = namer(Some("k3y-secret"));
        let e = n.reported(&Detail { kind: Some("overloaded_error".into()), message: "Overloaded k3y-secret".into() });
        assert_eq!(e.kind, ErrorKind::Server);
        assert!(e.message.contains("overloaded_error: Overloaded [redacted]"), "{}", e.message);
        assert_eq!(
            n.reported(&Detail { kind: Some("rate_limit_exceeded".into()), message: String::new() }).kind,
            ErrorKind::RateLimited
        );
        assert_eq!(n.reported(&Detail { kind: None, message: "boom".into() }).kind, ErrorKind::Server);
        assert_eq!(
            n.reported(&Detail { kind: Some("invalid_prompt".into()), message: "no".into() }).kind,
            ErrorKind::BadResponse
        );
        assert_eq!(human(Duration::from_millis(250)), "250 ms");
        assert_eq!(human(Duration::from_secs(30)), "30 s");
        assert_eq!(human(Duration::from_millis(1500)), "1.5 s");
    }
}
