//! A client of an OpenAI-compatible embeddings endpoint (OpenAI API, `POST /v1/embeddings`):
//! `POST <base_url>/embeddings` with `{"model", "input": [...], "encoding_format": "float"}`
//! (plus `"dimensions"` when configured), answered by `{"data": [{"index", "embedding": [...]}]}`.
//!
//! Every answer is checked before a vector leaves here: `data` sorted by `index` (a permutation
//! of the inputs), one vector per input, the configured dimension (or one dimension for the
//! whole answer), every value finite (a bare `NaN`/`Infinity`, as Python's `json` writes them,
//! is read and reported as [`EmbedError::NotFinite`]); then each vector is L2-normalized, so
//! the store's cosine distance and a dot product agree.
//!
//! No secret reaches an error or a log: the bearer header is marked sensitive, error messages
//! never quote the URL's user info or query, and any occurrence of the API key in a server's
//! answer is replaced by `[redacted]` before it is quoted (truncated to 300 characters).
use std::time::Duration;

use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderValue};
use reqwest::{StatusCode, Url};
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;

/// Largest answer read, bytes (32 vectors of 3072 floats are ~2 MB of JSON).
pub const MAX_ANSWER_BYTES: usize = 64 << 20;
/// Longest quoted server message, characters.
const MAX_MESSAGE_CHARS: usize = 300;
/// Longest wait for a TCP connection (the request as a whole has `EmbedConfig::timeout`).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Where and how to embed.
#[derive(Clone)]
pub struct EmbedConfig {
    /// E.g. `http://127.0.0.1:9000/v1` (requests go to `<base_url>/embeddings`); `http` or
    /// `https`.
    pub base_url: String,
    /// The `model` sent with every request.
    pub model: String,
    /// Sent as `Authorization: Bearer <key>` when set.
    pub api_key: Option<SecretString>,
    /// Expected vector length; also sent as OpenAI's `dimensions` parameter. `None` = take
    /// what the endpoint answers (the same for every vector of an answer).
    pub dimensions: Option<u32>,
    /// Inputs per request (at least 1).
    pub batch_size: usize,
    /// Longest wait for one request's whole answer.
    pub timeout: Duration,
}

impl std::fmt::Debug for EmbedConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbedConfig")
            .field("base_url", &shown_url_str(&self.base_url))
            .field("model", &self.model)
            .field("api_key", &self.api_key.as_ref().map(|_| "[redacted]"))
            .field("dimensions", &self.dimensions)
            .field("batch_size", &self.batch_size)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// Why embedding failed. Messages never hold the API key or the URL's secrets.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EmbedError {
    /// The configuration is unusable (bad URL, empty model, batch size 0, …).
    #[error("embeddings configuration: {0}")]
    Config(String),
    /// No connection (refused, DNS, TLS, reset).
    #[error("embeddings endpoint unreachable: {0}")]
    Unreachable(String),
    /// No whole answer within the timeout.
    #[error("embeddings endpoint did not answer within {} ms", .0.as_millis())]
    Timeout(Duration),
    /// A non-2xx answer; `message` is the server's error message (scrubbed, truncated).
    #[error("embeddings endpoint answered HTTP {status}: {message}")]
    Status { status: u16, message: String },
    /// The answer is not the documented JSON shape (or too large, or a zero vector).
    #[error("embeddings endpoint answered malformed data: {0}")]
    Malformed(String),
    /// A vector of another length than the configured (or the answer's first) dimension.
    #[error("embeddings endpoint answered vectors of dimension {got}, expected {expected}")]
    WrongDimension { expected: u32, got: usize },
    /// A value that is NaN or infinite (or overflows f32), in the vector for input `index`.
    #[error("embeddings endpoint answered a non-finite value in vector {index}")]
    NotFinite { index: usize },
    /// Not one vector per input.
    #[error("embeddings endpoint answered {got} vectors for {sent} inputs")]
    CountMismatch { sent: usize, got: usize },
}

/// An embeddings client: a `reqwest::Client` (rustls with the ring provider, no proxy, no
/// redirects — a redirect would carry the bearer elsewhere) and its configuration.
pub struct Embedder {
    client: reqwest::Client,
    url: Url,
    auth: Option<HeaderValue>,
    cfg: EmbedConfig,
}

impl std::fmt::Debug for Embedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Embedder").field("cfg", &self.cfg).finish_non_exhaustive()
    }
}

/// `scheme://host[:port]/path` of a URL: no user info, query or fragment.
fn shown_url(u: &Url) -> String {
    let mut s = format!("{}://{}", u.scheme(), u.host_str().unwrap_or(""));
    if let Some(p) = u.port() {
        s.push_str(&format!(":{p}"));
    }
    s.push_str(u.path());
    s
}

/// `s` as it may be shown or logged: scheme, host, port and path only (no user, password or
/// query, where keys hide).
pub fn shown_url_str(s: &str) -> String {
    Url::parse(s).map_or_else(|_| "(invalid URL)".to_owned(), |u| shown_url(&u))
}

#[derive(Deserialize)]
struct Answer {
    data: Vec<Item>,
}

#[derive(Deserialize)]
struct Item {
    #[serde(default)]
    index: Option<usize>,
    embedding: Vec<Option<f32>>,
}

#[derive(Deserialize)]
struct ErrorAnswer {
    error: ErrorBody,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum ErrorBody {
    Object { message: String },
    Text(String),
}

impl Embedder {
    /// Checks `cfg` and builds the client (no request is made).
    ///
    /// # Errors
    /// [`EmbedError::Config`] for a URL that is not `http(s)://`, an empty model, a batch size
    /// of 0, a zero timeout, a dimension of 0, or an API key that cannot be a header value.
    pub fn new(cfg: EmbedConfig) -> Result<Self, EmbedError> {
        let base =
            Url::parse(cfg.base_url.trim()).map_err(|e| EmbedError::Config(format!("base URL is not a URL ({e})")))?;
        if !matches!(base.scheme(), "http" | "https") || base.host_str().is_none_or(str::is_empty) {
            return Err(EmbedError::Config(format!("base URL {} is not http:// or https://", shown_url(&base))));
        }
        let mut url = base.clone();
        url.set_path(&format!("{}/embeddings", base.path().trim_end_matches('/')));
        if cfg.model.trim().is_empty() {
            return Err(EmbedError::Config("model is empty".into()));
        }
        if cfg.batch_size == 0 {
            return Err(EmbedError::Config("batch size is 0".into()));
        }
        if cfg.timeout.is_zero() {
            return Err(EmbedError::Config("timeout is 0".into()));
        }
        if cfg.dimensions == Some(0) {
            return Err(EmbedError::Config("dimensions is 0".into()));
        }
        let auth = match &cfg.api_key {
            None => None,
            Some(key) => {
                let mut v = HeaderValue::from_str(&format!("Bearer {}", key.expose_secret()))
                    .map_err(|_| EmbedError::Config("the API key is not a valid HTTP header value".into()))?;
                v.set_sensitive(true);
                Some(v)
            }
        };
        coffer_runtime::tls::ensure_provider();
        let client = reqwest::Client::builder()
            .no_proxy()
            .connect_timeout(CONNECT_TIMEOUT.min(cfg.timeout))
            .timeout(cfg.timeout)
            .redirect(reqwest::redirect::Policy::none())
            .tcp_nodelay(true)
            .build()
            .map_err(|e| EmbedError::Config(format!("HTTP client: {}", e.without_url())))?;
        Ok(Self { client, url, auth, cfg })
    }

    /// The configuration in use.
    pub fn config(&self) -> &EmbedConfig {
        &self.cfg
    }

    /// One unit vector per input, in input order, in batches of `batch_size` sent one after
    /// another. An empty `inputs` makes no request.
    ///
    /// # Errors
    /// The first batch's [`EmbedError`]; nothing is returned for the batches before it.
    pub async fn embed(&self, inputs: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let mut out = Vec::with_capacity(inputs.len());
        let mut dimension = self.cfg.dimensions;
        for batch in inputs.chunks(self.cfg.batch_size) {
            let vectors = self.embed_batch(batch, dimension).await?;
            if dimension.is_none() {
                dimension = vectors.first().and_then(|v| u32::try_from(v.len()).ok());
            }
            out.extend(vectors);
        }
        Ok(out)
    }

    async fn embed_batch(&self, batch: &[String], dimension: Option<u32>) -> Result<Vec<Vec<f32>>, EmbedError> {
        let mut body = serde_json::json!({ "model": self.cfg.model, "input": batch, "encoding_format": "float" });
        if let Some(d) = self.cfg.dimensions {
            body["dimensions"] = serde_json::json!(d);
        }
        let mut req =
            self.client.post(self.url.clone()).header(CONTENT_TYPE, "application/json").body(body.to_string());
        if let Some(auth) = &self.auth {
            req = req.header(AUTHORIZATION, auth.clone());
        }
        let mut resp = req.send().await.map_err(|e| self.transport_error(&e))?;
        let status = resp.status();
        let mut bytes: Vec<u8> = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(|e| self.transport_error(&e))? {
            if bytes.len() + chunk.len() > MAX_ANSWER_BYTES {
                return Err(EmbedError::Malformed(format!("answer larger than {} MiB", MAX_ANSWER_BYTES >> 20)));
            }
            bytes.extend_from_slice(&chunk);
        }
        if !status.is_success() {
            return Err(EmbedError::Status { status: status.as_u16(), message: self.status_message(status, &bytes) });
        }
        let text = String::from_utf8_lossy(&bytes);
        let answer: Answer = serde_json::from_str(&non_finite_to_null(&text))
            .map_err(|e| EmbedError::Malformed(self.scrub(&format!("not the embeddings JSON shape ({e})"))))?;
        check(answer, batch.len(), dimension)
    }

    fn transport_error(&self, e: &reqwest::Error) -> EmbedError {
        if e.is_timeout() {
            return EmbedError::Timeout(self.cfg.timeout);
        }
        // The message and its causes, without the URL (it may carry secrets in its query).
        let mut msg = e.to_string();
        if let Some(u) = e.url() {
            msg = msg.replace(u.as_str(), &shown_url(u));
        }
        let mut source = std::error::Error::source(e);
        while let Some(s) = source {
            msg.push_str(": ");
            msg.push_str(&s.to_string());
            source = s.source();
        }
        EmbedError::Unreachable(format!("{} ({})", self.scrub(&msg), shown_url(&self.url)))
    }

    fn status_message(&self, status: StatusCode, body: &[u8]) -> String {
        let text = String::from_utf8_lossy(body);
        let msg = match serde_json::from_str::<ErrorAnswer>(&text) {
            Ok(ErrorAnswer { error: ErrorBody::Object { message } | ErrorBody::Text(message) }) => message,
            Err(_) if text.trim().is_empty() => status.canonical_reason().unwrap_or("no message").to_owned(),
            Err(_) => text.into_owned(),
        };
        self.scrub(&msg)
    }

    /// Redacts the API key (and the bearer value) and truncates to the quoting limit.
    fn scrub(&self, msg: &str) -> String {
        let mut m = msg.to_owned();
        if let Some(key) = &self.cfg.api_key {
            let key = key.expose_secret();
            if key.len() >= 4 {
                m = m.replace(key, "[redacted]");
            }
        }
        let mut m: String = m.split_whitespace().collect::<Vec<_>>().join(" ");
        if m.chars().count() > MAX_MESSAGE_CHARS {
            m = m.chars().take(MAX_MESSAGE_CHARS).collect::<String>() + "…";
        }
        m
    }
}

/// Replaces the bare tokens `NaN`, `Infinity` and `-Infinity` outside JSON strings by `null`
/// (they are not JSON, but Python's `json` writes them), so they can be reported per vector.
fn non_finite_to_null(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.contains("NaN") && !text.contains("Infinity") {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut in_string = false;
    let mut escaped = false;
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        if in_string {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
            rest = &rest[c.len_utf8()..];
            continue;
        }
        if c == '"' {
            in_string = true;
        }
        let token = ["-Infinity", "Infinity", "NaN"].into_iter().find(|t| rest.starts_with(t));
        if let Some(t) = token {
            out.push_str("null");
            rest = &rest[t.len()..];
        } else {
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Validates an answer for `sent` inputs and returns unit vectors in input order.
fn check(answer: Answer, sent: usize, dimension: Option<u32>) -> Result<Vec<Vec<f32>>, EmbedError> {
    let mut items = answer.data;
    if items.len() != sent {
        return Err(EmbedError::CountMismatch { sent, got: items.len() });
    }
    if items.iter().all(|i| i.index.is_some()) {
        items.sort_by_key(|i| i.index);
        if items.iter().enumerate().any(|(n, i)| i.index != Some(n)) {
            return Err(EmbedError::Malformed(format!("the indexes are not 0..{sent}, each once")));
        }
    } else if items.iter().any(|i| i.index.is_some()) {
        return Err(EmbedError::Malformed("some items have an index and some do not".into()));
    }
    let expected = match dimension {
        Some(d) => d as usize,
        None => items.first().map_or(0, |i| i.embedding.len()),
    };
    let mut out = Vec::with_capacity(items.len());
    for (index, item) in items.into_iter().enumerate() {
        if item.embedding.is_empty() {
            return Err(EmbedError::Malformed(format!("vector {index} is empty")));
        }
        if item.embedding.len() != expected {
            return Err(EmbedError::WrongDimension {
                expected: u32::try_from(expected).unwrap_or(u32::MAX),
                got: item.embedding.len(),
            });
        }
        let mut v: Vec<f32> = Vec::with_capacity(expected);
        for x in item.embedding {
            match x {
                Some(x) if x.is_finite() => v.push(x),
                _ => return Err(EmbedError::NotFinite { index }),
            }
        }
        let norm = v.iter().map(|x| f64::from(*x) * f64::from(*x)).sum::<f64>().sqrt();
        if !norm.is_finite() {
            return Err(EmbedError::NotFinite { index });
        }
        if norm == 0.0 {
            return Err(EmbedError::Malformed(format!("vector {index} is all zeros")));
        }
        #[allow(clippy::cast_possible_truncation)] // unit-vector components fit in f32
        v.iter_mut().for_each(|x| *x = (f64::from(*x) / norm) as f32);
        out.push(v);
    }
    Ok(out)
}

#[cfg(test)]
#[path = "tests/embeddings_client.rs"]
mod tests;
