//! The legacy HTTP+SSE transport (MCP 2024-11-05, basic/transports §HTTP with SSE), client
//! side, for servers that predate Streamable HTTP: a `GET` of the server's URL opens an SSE
//! stream whose first event, `endpoint`, names the URL to `POST` messages to; every answer and
//! every server message then arrives on that one stream as a `message` event.
//!
//! Chosen when the registration says so (`transport: "sse"`), when the URL's path ends in
//! `/sse`, or detected as MCP 2025-11-25 basic/transports §Backwards Compatibility says: a
//! first `POST` (before any succeeded, without a session) answered 404 or 405 means the server
//! speaks the old transport, and the transport switches over for good, re-sending that message
//! to the announced endpoint.
//!
//! Faults, as for Streamable HTTP: an endpoint on another origin, no `endpoint` event in time,
//! or a stream that is not SSE fail the start with a reason; the stream closing ends the
//! session ([`Core::close`]: every request in flight fails at once, the downstream session
//! starts a new upstream on its next call, which is how this transport reconnects: it has no
//! resumption); a `POST` refused (non-2xx) fails its request with -32001 and the HTTP status,
//! 404 ends the session; oversized events are dropped, non-JSON-RPC data is skipped.
use super::*;

#[cfg(test)]
#[path = "legacy_tests.rs"]
mod tests;

/// Longest wait for the `endpoint` event after the `GET` was sent.
const ENDPOINT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest wait for the server to accept a notification or response `POST`.
const LEGACY_ACCEPT_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest endpoint URL accepted (bytes).
const MAX_ENDPOINT: usize = 8 * 1024;

/// Whether `server` is to be spoken to over the legacy transport from the start: its URL's
/// path ends in `/sse` (the convention of every legacy server seen, and how users paste them).
/// Or its registration chose the transport (`sse`).
pub(super) fn chosen(server: &McpServer, url: &Url) -> bool {
    server.transport() == coffer_proto::store::Transport::Sse || looks_legacy(url)
}

/// Whether `url` names a legacy HTTP+SSE endpoint by convention (its path ends in `/sse`).
pub fn looks_legacy(url: &Url) -> bool {
    url.path().trim_end_matches('/').ends_with("/sse")
}

impl Inner {
    /// True once this transport speaks HTTP+SSE (chosen, or detected).
    pub(super) fn is_legacy(&self) -> bool {
        self.legacy.load(Ordering::Acquire)
    }

    /// Whether an answer `status` to a `POST` sent without a session, before any `POST`
    /// succeeded, means the server speaks the legacy transport (404 or 405; MCP 2025-11-25
    /// §Backwards Compatibility).
    pub(super) fn detects_legacy(&self, status: StatusCode, had_session: bool) -> bool {
        !had_session
            && !self.confirmed.load(Ordering::Acquire)
            && matches!(status, StatusCode::NOT_FOUND | StatusCode::METHOD_NOT_ALLOWED)
            && !self.stateless.load(Ordering::Acquire)
    }

    /// Switches to the legacy transport (for good).
    pub(super) fn switch_to_legacy(&self, status: StatusCode) {
        if !self.legacy.swap(true, Ordering::AcqRel) {
            tracing::info!(server = %self.core.server, url = %self.shown_url, status = status.as_u16(), "Upstream refused a Streamable HTTP POST; using the legacy HTTP+SSE transport.");
        }
    }

    /// Sends one message over the legacy transport, opening the SSE stream first if needed.
    /// `stateless`: a request of the stateless revision (the `server/discover` probe), which a
    /// 2024-11-05 server cannot know: failed locally with -32601 instead of sent.
    pub(super) async fn legacy_post(
        self: Arc<Self>,
        body: String,
        request_id: Option<u64>,
        accepted: Option<oneshot::Sender<()>>,
        stateless: bool,
    ) {
        if stateless {
            if let Some(id) = request_id {
                self.core.fail(id, -32601, "a legacy HTTP+SSE server (MCP 2024-11-05) has no server/discover");
            }
            return;
        }
        let endpoint = match self.endpoint.get_or_try_init(|| self.clone().legacy_connect()).await {
            Ok(u) => u.clone(),
            Err(why) => {
                tracing::warn!(server = %self.core.server, url = %self.shown_url, error = %why, "Legacy HTTP+SSE upstream unusable.");
                self.close_core(&why);
                return self.cancel.cancel();
            }
        };
        let token = match self.bearer().await {
            Ok(t) => t,
            Err(e) => return self.auth_failed(request_id, e),
        };
        let mut resp = match self.legacy_send(&endpoint, &body, token.as_ref(), request_id).await {
            None => return,
            Some(Ok(r)) => r,
            Some(Err(e)) => return self.send_failed(request_id, e),
        };
        if resp.status() == StatusCode::UNAUTHORIZED {
            // As on Streamable HTTP: a refused token is refreshed once and the POST sent again.
            let Some(auth) = self.auth.clone().filter(|_| bearer_challenged(&resp) || token.is_some()) else {
                drop(accepted);
                return self.refused_unauthorized(resp, request_id).await;
            };
            let fresh = match auth.rejected(token.as_ref()).await {
                Ok(t) => t,
                Err(e) => return self.auth_failed(request_id, e),
            };
            resp = match self.legacy_send(&endpoint, &body, Some(&fresh), request_id).await {
                None => return,
                Some(Ok(r)) => r,
                Some(Err(e)) => return self.send_failed(request_id, e),
            };
            if resp.status() == StatusCode::UNAUTHORIZED {
                let e = auth.refused_after_refresh().await;
                return self.auth_failed(request_id, e);
            }
        }
        if let Some(e) = self.scope_challenged(&resp).await {
            return self.auth_failed(request_id, e);
        }
        drop(accepted);
        let status = resp.status();
        if status.is_success() {
            // The answer comes on the SSE stream; the POST's own body ("Accepted") means
            // nothing.
            return;
        }
        if status == StatusCode::NOT_FOUND {
            // The server forgot the session id in the endpoint URL (e.g. it restarted).
            self.expire(status);
            return;
        }
        let ctype = content_type(&resp);
        let snippet = self.snippet(resp, &ctype).await;
        self.refused(status, &ctype, &snippet, request_id);
    }

    /// POSTs `body` to the legacy `endpoint` with the configured headers and `token` (OAuth):
    /// a request as long as someone waits for its answer (the server-everything SDK never
    /// answers a POST for a session it does not know), anything else for at most
    /// [`LEGACY_ACCEPT_TIMEOUT`]. `None` when it is no longer wanted or timed out.
    async fn legacy_send(
        &self,
        endpoint: &Url,
        body: &str,
        token: Option<&SecretString>,
        request_id: Option<u64>,
    ) -> Option<Result<Response, reqwest::Error>> {
        let rb = self.client.post(endpoint.clone()).headers(self.headers.clone()).header(CONTENT_TYPE, JSON);
        let rb = with_bearer(rb, token).body(body.to_owned());
        match request_id {
            Some(_) => self.while_wanted(request_id, rb.send()).await,
            None => tokio::time::timeout(LEGACY_ACCEPT_TIMEOUT, rb.send()).await.ok(),
        }
    }

    /// The `GET` of the SSE stream with the configured headers and `token` (OAuth).
    ///
    /// # Errors
    /// The reason, as [`Inner::legacy_connect`] gives it.
    async fn legacy_get(&self, token: Option<&SecretString>) -> Result<Response, String> {
        let server = &self.core.server;
        let rb = self.client.get(self.url.clone()).headers(self.headers.clone()).header(ACCEPT, EVENT_STREAM);
        match tokio::time::timeout(ENDPOINT_TIMEOUT, with_bearer(rb, token).send()).await {
            Err(_) => {
                Err(format!("upstream {server} did not answer the SSE GET within {} s", ENDPOINT_TIMEOUT.as_secs()))
            }
            Ok(Err(e)) if e.is_connect() => Err(format!("unreachable at {} ({})", self.shown_url, describe(e))),
            Ok(Err(e)) => Err(format!("upstream {server}: the SSE GET failed: {}", describe(e))),
            Ok(Ok(r)) => Ok(r),
        }
    }

    /// `GET`s the SSE stream and waits (at most [`ENDPOINT_TIMEOUT`]) for its `endpoint` event;
    /// a task then reads the stream until it ends or the transport closes.
    ///
    /// The `GET` carries the OAuth access token when the server has a grant; a `401` with a
    /// `Bearer` challenge refreshes it once (or, without a grant, says the server needs
    /// sign-in, naming the command), as a `POST` does.
    ///
    /// # Errors
    /// A reason naming the upstream: unreachable, HTTP error, not an SSE stream, no endpoint
    /// in time, an endpoint that is not a URL or is on another origin, a sign-in needed.
    async fn legacy_connect(self: Arc<Self>) -> Result<Url, String> {
        let server = self.core.server.clone();
        let token = self.bearer().await.map_err(|e| e.to_string())?;
        let mut resp = self.legacy_get(token.as_ref()).await?;
        if resp.status() == StatusCode::UNAUTHORIZED
            && let Some(auth) = self.auth.clone().filter(|_| bearer_challenged(&resp) || token.is_some())
        {
            let fresh = auth.rejected(token.as_ref()).await.map_err(|e| e.to_string())?;
            resp = self.legacy_get(Some(&fresh)).await?;
            if resp.status() == StatusCode::UNAUTHORIZED {
                return Err(auth.refused_after_refresh().await.to_string());
            }
        }
        let (status, ctype) = (resp.status(), content_type(&resp));
        if !status.is_success() || ctype != EVENT_STREAM {
            let snippet = self.snippet(resp, &ctype).await;
            return Err(format!(
                "upstream {server} is neither a Streamable HTTP nor a legacy HTTP+SSE server: its SSE GET answered HTTP {status}{}: {snippet}",
                ctype_note(&ctype)
            ));
        }
        let (tx, rx) = oneshot::channel();
        let cancel = self.cancel.clone();
        let inner = self.clone();
        // Owned by the transport's cancellation token (closing or dropping the transport ends
        // it), and it ends by itself with the stream.
        tokio::spawn(async move {
            tokio::select! {
                _ = cancel.cancelled() => {}
                _ = inner.legacy_read(resp, tx) => {}
            }
        });
        match tokio::time::timeout(ENDPOINT_TIMEOUT, rx).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err(format!("upstream {server} closed its SSE stream before naming an endpoint")),
            Err(_) => Err(format!(
                "upstream {server} sent no endpoint event within {} s (is {} an MCP HTTP+SSE endpoint?)",
                ENDPOINT_TIMEOUT.as_secs(),
                self.shown_url
            )),
        }
    }

    /// Reads the legacy SSE stream: the first `endpoint` event goes to `endpoint`, every
    /// `message` event to the core. The end of the stream ends the session.
    async fn legacy_read(self: Arc<Self>, mut resp: Response, endpoint: oneshot::Sender<Result<Url, String>>) {
        let server = self.core.server.clone();
        let mut endpoint = Some(endpoint);
        let mut parser = SseParser::with_limit(MAX_FRAME);
        let mut events = Vec::new();
        let why = loop {
            match resp.chunk().await {
                Ok(Some(bytes)) => {
                    parser.push(&bytes, &mut events);
                    if parser.take_oversized() {
                        tracing::warn!(server = %server, limit = MAX_FRAME, "Upstream SSE event over the limit; discarded.");
                    }
                    for event in events.drain(..) {
                        match event.kind() {
                            "endpoint" => match endpoint.take() {
                                Some(tx) => {
                                    let _ = tx.send(self.endpoint_url(&event.data));
                                }
                                None => {
                                    tracing::debug!(server = %server, "Upstream named its endpoint again; ignored.")
                                }
                            },
                            "message" if !event.data.is_empty() => self.core.dispatch(&event.data),
                            other => {
                                tracing::debug!(server = %server, event = %other.chars().take(40).collect::<String>(), "Skipped an SSE event that is not MCP.")
                            }
                        }
                    }
                }
                Ok(None) => break "the server ended it".to_owned(),
                Err(e) => break describe(e),
            }
        };
        // Before the endpoint, the connect that waits for it says why, closes the core and
        // cancels the transport: cancelling here could end that connect's task (it runs under
        // the same token) before it has failed the request waiting for it.
        if endpoint.is_some() {
            return;
        }
        if self.core.is_alive() {
            tracing::info!(server = %server, url = %self.shown_url, reason = %why, "Legacy HTTP+SSE stream closed; the next call starts a new session.");
            self.close_core(&format!("its HTTP+SSE stream closed ({why}); the next call starts a new session"));
        }
        self.cancel.cancel();
    }

    /// The endpoint an `endpoint` event names (a URL or a reference relative to the SSE URL),
    /// which must be on the SSE URL's origin: the configured headers (credentials) go there.
    fn endpoint_url(&self, data: &[u8]) -> Result<Url, String> {
        let server = &self.core.server;
        let text = std::str::from_utf8(data)
            .ok()
            .map(str::trim)
            .filter(|t| !t.is_empty() && t.len() <= MAX_ENDPOINT && !t.chars().any(char::is_control))
            .ok_or_else(|| format!("upstream {server} sent an endpoint event that is not a URL"))?;
        let url =
            self.url.join(text).map_err(|e| format!("upstream {server} sent an endpoint that is not a URL: {e}"))?;
        if url.origin() != self.url.origin() {
            return Err(format!(
                "upstream {server} named an endpoint on another origin ({}); refused, the configured headers would go there",
                shown_url(&url)
            ));
        }
        Ok(url)
    }
}
