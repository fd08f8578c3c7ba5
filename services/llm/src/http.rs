//! The HTTP every wire shares: one `reqwest::Client` per endpoint (rustls with the ring
//! provider, no proxy, no redirects — a redirect would carry the key elsewhere), the request
//! timeout until the response's headers (and for a listing its whole body), the stall timeout
//! between two pieces of a stream, the stream framing (server-sent events with
//! [`SseParser`], or newline-delimited JSON), size bounds, and the hand-off of every failure
//! to the one classification of `error.rs`.
use std::collections::VecDeque;
use std::sync::Once;
use std::time::Duration;

use coffer_types::sse::SseParser;
use futures_util::StreamExt;
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderValue};
use secrecy::SecretString;
use tokio::time::Instant;

use crate::error::{Detail, Namer, Purpose};
use crate::wire::{Adapter, DecodeError, Decoder, Frame, Framing};
use crate::{Endpoint, ErrorKind, EventStream, LlmError, Request, StreamEvent};

/// Largest stream event or line, bytes (a long tool call's arguments arrive as one event).
pub(crate) const MAX_EVENT_BYTES: usize = 16 << 20;
/// Largest streamed answer read, bytes (a provider that never stops is cut off here).
pub(crate) const MAX_ANSWER_BYTES: u64 = 64 << 20;
/// Largest error body read, bytes (the message quoted from it is much shorter).
const MAX_ERROR_BYTES: usize = 64 << 10;
/// Largest models listing read, bytes.
const MAX_LISTING_BYTES: usize = 16 << 20;
/// Longest wait for a TCP connection (bounded by the request timeout too).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Most pages of a paginated models listing followed.
const MAX_LISTING_PAGES: usize = 20;

/// A response body as a stream of chunks.
type ByteStream = std::pin::Pin<Box<dyn futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> + Send>>;

/// Installs rustls' ring provider once per process (reqwest is built without one; a process
/// that installed another first keeps it).
fn ensure_tls_provider() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// `base` without a trailing `/` or one of `suffixes` (`/v1`), so that `/v1/...` paths are
/// never doubled.
pub(crate) fn normalized_base(base: &url::Url, suffixes: &[&str]) -> url::Url {
    let mut u = base.clone();
    let path = u.path().trim_end_matches('/');
    let path = suffixes.iter().find_map(|s| path.strip_suffix(s)).unwrap_or(path).to_owned();
    u.set_path(&path);
    u.set_fragment(None);
    u
}

/// `base` + `path` (the base's own path prefix kept, its query kept).
pub(crate) fn join(base: &url::Url, path: &str) -> url::Url {
    let mut u = base.clone();
    let prefix = base.path().trim_end_matches('/').to_owned();
    u.set_path(&format!("{prefix}{path}"));
    u
}

/// Everything a request to one endpoint needs.
pub(crate) struct Inner {
    http: Result<reqwest::Client, String>,
    pub(crate) namer: Namer,
    adapter: &'static dyn Adapter,
    base: url::Url,
    secret: Option<SecretString>,
    request_timeout: Duration,
    stall_timeout: Duration,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inner").field("provider", &self.namer.provider()).finish_non_exhaustive()
    }
}

impl Inner {
    pub(crate) fn new(endpoint: &Endpoint, adapter: &'static dyn Adapter) -> Self {
        ensure_tls_provider();
        let request_timeout = nonzero(endpoint.request_timeout, Duration::from_secs(60));
        let http = reqwest::Client::builder()
            .no_proxy()
            .connect_timeout(CONNECT_TIMEOUT.min(request_timeout))
            .redirect(reqwest::redirect::Policy::none())
            .tcp_nodelay(true)
            .build()
            .map_err(|e| e.without_url().to_string());
        Self {
            http,
            namer: Namer::new(endpoint.wire, &endpoint.base_url, endpoint.secret.clone()),
            adapter,
            base: normalized_base(&endpoint.base_url, adapter.base_suffixes()),
            secret: endpoint.secret.clone(),
            request_timeout,
            stall_timeout: nonzero(endpoint.stall_timeout, Duration::from_secs(30)),
        }
    }

    fn client(&self) -> Result<&reqwest::Client, LlmError> {
        self.http.as_ref().map_err(|e| self.namer.config(ErrorKind::Tls, &format!("no HTTP client ({e})")))
    }

    fn auth(&self) -> Result<HeaderMap, LlmError> {
        self.adapter.auth_headers(self.secret.as_ref()).map_err(|e| self.namer.config(ErrorKind::Auth, &e))
    }

    /// Sends a request and waits (at most the request timeout) for its headers; a non-2xx
    /// answer becomes its error here.
    async fn send(
        &self,
        req: reqwest::RequestBuilder,
        purpose: Purpose,
    ) -> Result<(reqwest::Response, Instant), LlmError> {
        let deadline = Instant::now() + self.request_timeout;
        let resp = match tokio::time::timeout_at(deadline, req.send()).await {
            Err(_) => return Err(self.namer.timeout(self.request_timeout)),
            Ok(Err(e)) => return Err(self.namer.transport(&e, self.request_timeout)),
            Ok(Ok(r)) => r,
        };
        let status = resp.status();
        if status.is_success() {
            return Ok((resp, deadline));
        }
        let headers = resp.headers().clone();
        let body = self.read_bounded(resp, deadline, MAX_ERROR_BYTES, true).await.unwrap_or_default();
        Err(self.namer.status(status, &headers, &body, purpose))
    }

    /// The body, at most `limit` bytes (more: truncated when `truncate`, else an error), by
    /// `deadline`.
    async fn read_bounded(
        &self,
        mut resp: reqwest::Response,
        deadline: Instant,
        limit: usize,
        truncate: bool,
    ) -> Result<Vec<u8>, LlmError> {
        let mut out = Vec::new();
        loop {
            let chunk = match tokio::time::timeout_at(deadline, resp.chunk()).await {
                Err(_) => return Err(self.namer.timeout(self.request_timeout)),
                Ok(Err(e)) => return Err(self.namer.transport(&e, self.request_timeout)),
                Ok(Ok(None)) => return Ok(out),
                Ok(Ok(Some(c))) => c,
            };
            if out.len() + chunk.len() > limit {
                if truncate {
                    out.extend_from_slice(&chunk[..limit - out.len()]);
                    return Ok(out);
                }
                return Err(self.namer.garbage(&format!("an answer larger than {} MiB", limit >> 20)));
            }
            out.extend_from_slice(&chunk);
        }
    }

    /// Sends `request` streaming; the events follow as the body arrives.
    pub(crate) async fn stream(&self, request: &Request) -> Result<EventStream, LlmError> {
        let url = join(&self.base, self.adapter.chat_path());
        let body = self.adapter.body(request, &self.base);
        let accept = match self.adapter.framing() {
            Framing::Sse => "text/event-stream",
            Framing::Ndjson => "application/x-ndjson",
        };
        let req = self
            .client()?
            .post(url)
            .headers(self.auth()?)
            .header(CONTENT_TYPE, "application/json")
            .header(ACCEPT, HeaderValue::from_static(accept))
            .body(body.to_string());
        let (resp, deadline) = self.send(req, Purpose::Model).await?;
        let content_type =
            resp.headers().get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default().to_ascii_lowercase();
        if self.adapter.framing() == Framing::Sse && content_type.starts_with("application/json") {
            // A server that ignored `stream` or answered an error with status 200.
            let body = self.read_bounded(resp, deadline, MAX_ERROR_BYTES, true).await?;
            let detail = serde_json::from_slice::<serde_json::Value>(&body).ok().and_then(|v| Detail::from_body(&v));
            return Err(match detail {
                Some(d) => self.namer.reported(&d),
                None => self.namer.garbage(&format!(
                    "JSON instead of an event stream: {}",
                    String::from_utf8_lossy(&body[..body.len().min(120)])
                )),
            });
        }
        let state = State {
            body: Box::pin(resp.bytes_stream()),
            framing: self.adapter.framing(),
            sse: SseParser::with_limit(MAX_EVENT_BYTES),
            line: Vec::new(),
            head: Vec::new(),
            frames_seen: 0,
            read: 0,
            decoder: self.adapter.decoder(),
            pending: VecDeque::new(),
            finished: false,
            namer: self.namer.clone(),
            terminal: self.adapter.terminal(),
            stall: self.stall_timeout,
        };
        Ok(Box::pin(futures_util::stream::unfold(state, State::next)))
    }

    /// The models listing (every page), unsorted.
    pub(crate) async fn models(&self) -> Result<Vec<String>, LlmError> {
        let mut all = Vec::new();
        let mut cursor: Option<String> = None;
        for _ in 0..MAX_LISTING_PAGES {
            let mut url = join(&self.base, self.adapter.models_path());
            let query = self.adapter.models_query(cursor.as_deref());
            if !query.is_empty() {
                url.query_pairs_mut().extend_pairs(query);
            }
            let req = self.client()?.get(url).headers(self.auth()?).header(ACCEPT, "application/json");
            let (resp, deadline) = self.send(req, Purpose::Models).await?;
            let body = self.read_bounded(resp, deadline, MAX_LISTING_BYTES, false).await?;
            let value: serde_json::Value = serde_json::from_slice(&body).map_err(|e| {
                self.namer.garbage(&format!(
                    "the models listing is not JSON ({e}): {}",
                    String::from_utf8_lossy(&body[..body.len().min(80)])
                ))
            })?;
            let (ids, next) = self
                .adapter
                .parse_models(&value)
                .map_err(|e| self.namer.garbage(&format!("the models listing has {e}")))?;
            all.extend(ids);
            match next {
                Some(n) if cursor.as_deref() != Some(n.as_str()) => cursor = Some(n),
                _ => break,
            }
        }
        Ok(all)
    }
}

fn nonzero(d: Duration, default: Duration) -> Duration {
    if d.is_zero() { default } else { d }
}

/// One answer's stream, folded as the body arrives.
struct State {
    body: ByteStream,
    framing: Framing,
    sse: SseParser,
    /// The current, unterminated line (NDJSON).
    line: Vec<u8>,
    /// The body's first bytes, quoted when it held no frame at all.
    head: Vec<u8>,
    frames_seen: u64,
    /// Body bytes read so far.
    read: u64,
    decoder: Box<dyn Decoder>,
    pending: VecDeque<StreamEvent>,
    /// `Done` or an error was produced: nothing more is read.
    finished: bool,
    namer: Namer,
    terminal: &'static str,
    stall: Duration,
}

type Step = Option<(Result<StreamEvent, LlmError>, State)>;

impl State {
    async fn next(mut self) -> Step {
        loop {
            if let Some(e) = self.pending.pop_front() {
                return Some((Ok(e), self));
            }
            if self.finished {
                return None;
            }
            let chunk = match tokio::time::timeout(self.stall, self.body.next()).await {
                Err(_) => {
                    let e = self.namer.stalled(self.stall);
                    return self.fail(e);
                }
                Ok(None) => return self.eof(),
                Ok(Some(Err(e))) => {
                    let e = if e.is_timeout() {
                        self.namer.stalled(self.stall)
                    } else {
                        self.namer.cut(self.terminal, Some(&e))
                    };
                    return self.fail(e);
                }
                Ok(Some(Ok(c))) => c,
            };
            self.read += chunk.len() as u64;
            if self.read > MAX_ANSWER_BYTES {
                let e = self.namer.garbage(&format!("an answer larger than {} MiB", MAX_ANSWER_BYTES >> 20));
                return self.fail(e);
            }
            if self.head.len() < 120 {
                let take = (120 - self.head.len()).min(chunk.len());
                self.head.extend_from_slice(&chunk[..take]);
            }
            if let Err(e) = self.push(&chunk) {
                return self.fail(e);
            }
        }
    }

    fn fail(mut self, e: LlmError) -> Step {
        self.finished = true;
        self.pending.clear();
        Some((Err(e), self))
    }

    fn eof(mut self) -> Step {
        if self.framing == Framing::Ndjson && !self.line.is_empty() {
            let line = std::mem::take(&mut self.line);
            if let Err(e) = self.frame(Frame::Line(&line)) {
                return self.fail(e);
            }
            if self.finished {
                return self.next_now();
            }
        }
        let mut out = Vec::new();
        if self.decoder.at_eof(&mut out) {
            self.pending.extend(out);
            self.finished = true;
            return self.next_now();
        }
        if self.frames_seen == 0 {
            let head = String::from_utf8_lossy(&self.head).into_owned();
            let what = if head.trim().is_empty() {
                "an empty body".to_owned()
            } else {
                format!("no event of the wire; the body began {head:?}")
            };
            let e = self.namer.garbage(&what);
            return self.fail(e);
        }
        let e = self.namer.cut(self.terminal, None);
        self.fail(e)
    }

    /// Pops a pending event without reading more.
    fn next_now(mut self) -> Step {
        let e = self.pending.pop_front()?;
        Some((Ok(e), self))
    }

    fn push(&mut self, chunk: &[u8]) -> Result<(), LlmError> {
        match self.framing {
            Framing::Sse => {
                let mut events = Vec::new();
                self.sse.push(chunk, &mut events);
                if self.sse.take_oversized() {
                    return Err(self
                        .namer
                        .garbage(&format!("a stream event larger than {} MiB", MAX_EVENT_BYTES >> 20)));
                }
                for ev in events {
                    self.frame(Frame::Sse { event: &ev.event, data: &ev.data })?;
                    if self.finished {
                        break;
                    }
                }
            }
            Framing::Ndjson => {
                let mut rest = chunk;
                while let Some(i) = rest.iter().position(|&b| b == b'\n') {
                    self.line.extend_from_slice(&rest[..i]);
                    rest = &rest[i + 1..];
                    let line = std::mem::take(&mut self.line);
                    self.frame(Frame::Line(&line))?;
                    if self.finished {
                        return Ok(());
                    }
                }
                if self.line.len() + rest.len() > MAX_EVENT_BYTES {
                    return Err(self
                        .namer
                        .garbage(&format!("a stream line larger than {} MiB", MAX_EVENT_BYTES >> 20)));
                }
                self.line.extend_from_slice(rest);
            }
        }
        Ok(())
    }

    fn frame(&mut self, frame: Frame<'_>) -> Result<(), LlmError> {
        if let Frame::Line(l) = frame
            && l.iter().all(u8::is_ascii_whitespace)
        {
            return Ok(());
        }
        self.frames_seen += 1;
        let mut out = Vec::new();
        let result = self.decoder.feed(frame, &mut out);
        let done = out.iter().any(|e| matches!(e, StreamEvent::Done { .. }));
        self.pending.extend(out);
        match result {
            Ok(()) => {
                if done {
                    self.finished = true;
                }
                Ok(())
            }
            Err(DecodeError::Garbage(what)) => Err(self.namer.garbage(&what)),
            Err(DecodeError::Provider(detail)) => Err(self.namer.reported(&detail)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls_with_or_without_v1() {
        for (base, want) in [
            ("https://api.anthropic.com", "https://api.anthropic.com/v1/messages"),
            ("https://api.anthropic.com/", "https://api.anthropic.com/v1/messages"),
            ("https://api.anthropic.com/v1", "https://api.anthropic.com/v1/messages"),
            ("https://api.anthropic.com/v1/", "https://api.anthropic.com/v1/messages"),
            ("http://127.0.0.1:4000/proxy/v1", "http://127.0.0.1:4000/proxy/v1/messages"),
            ("http://h/x?api-version=2", "http://h/x/v1/messages?api-version=2"),
        ] {
            let u = url::Url::parse(base).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(join(&normalized_base(&u, &["/v1"]), "/v1/messages").as_str(), want, "{base}");
        }
        for base in ["http://127.0.0.1:11434", "http://127.0.0.1:11434/api/", "http://127.0.0.1:11434/v1"] {
            let u = url::Url::parse(base).unwrap_or_else(|e| panic!("{e}"));
            let got = join(&normalized_base(&u, &["/api", "/v1"]), "/api/chat");
            assert_eq!(got.as_str(), "http://127.0.0.1:11434/api/chat", "{base}");
        }
    }
}
