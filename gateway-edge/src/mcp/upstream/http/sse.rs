//! The Streamable HTTP transport's server-sent event streams: a `POST`'s SSE answer (resumed
//! with `GET` + `Last-Event-ID` when it ends before the response, MCP 2025-11-25
//! §Resumability and Redelivery) and the session's `GET` stream of server notifications and
//! requests (reconnected with backoff). Every event goes to [`Core::dispatch`]; a stream nobody
//! waits on any more is dropped.
// The rest of `Inner`'s methods: this file sees the transport's constants, types and helpers
// as its own.
use super::*;

/// How one SSE response ended.
#[derive(Debug)]
enum StreamEnd {
    /// The server ended it.
    Ended,
    /// Reading failed (connection reset, …).
    Failed(String),
    /// The response to its request was read (and the server ended the stream or its grace ran out).
    Answered,
    /// Nobody waits for it any more: the request timed out or the upstream closed.
    Unwanted,
}

impl Inner {
    /// Reads a `POST`'s SSE stream. If it ends before the response to `request_id` and events
    /// carried ids, resumes it with `GET` + `Last-Event-ID` after the server's `retry` delay
    /// (MCP 2025-11-25 §Resumability and Redelivery); otherwise fails the request.
    pub(super) async fn read_post_stream(&self, resp: Response, request_id: Option<u64>) {
        let mut parser = SseParser::with_limit(MAX_FRAME);
        let mut resp = resp;
        let mut resumes = 0;
        loop {
            let before = parser.events_seen();
            let end = self.pump(resp, &mut parser, request_id).await;
            let Some(id) = request_id else { return };
            let why = match end {
                StreamEnd::Answered | StreamEnd::Unwanted => return,
                StreamEnd::Ended => "the server ended it".to_owned(),
                StreamEnd::Failed(e) => e,
            };
            if !self.core.is_pending(id) || !self.core.is_alive() {
                return;
            }
            if parser.events_seen() > before {
                resumes = 0;
            }
            let server = &self.core.server;
            let Some(last) = parser.last_event_id().map(str::to_owned) else {
                let msg = format!("upstream {server} ended the SSE stream of its answer before responding ({why})");
                tracing::warn!(server = %server, url = %self.shown_url, request_id = id, reason = %why, "Upstream stream ended before the response.");
                return self.core.fail(id, UPSTREAM_UNAVAILABLE, &msg);
            };
            if resumes == MAX_RESUMES {
                let msg = format!(
                    "upstream {server} ended the SSE stream of its answer {MAX_RESUMES} times without an event"
                );
                return self.core.fail(id, UPSTREAM_UNAVAILABLE, &msg);
            }
            resumes += 1;
            let delay = parser.retry().unwrap_or(RECONNECT_BASE);
            tracing::debug!(server = %server, request_id = id, delay_ms = delay.as_millis() as u64, "Resuming an upstream SSE stream.");
            if self.while_wanted(Some(id), tokio::time::sleep(delay)).await.is_none() {
                return;
            }
            resp = match self.resume(&last).await {
                Ok(r) => r,
                Err(msg) => return self.core.fail(id, UPSTREAM_UNAVAILABLE, &msg),
            };
            parser.start_new_response();
        }
    }

    /// `GET` with `Last-Event-ID: last`; the response when it is an SSE stream.
    async fn resume(&self, last: &str) -> Result<Response, String> {
        let server = &self.core.server;
        let last = HeaderValue::from_str(last).map_err(|_| format!("upstream {server} sent an unusable event id"))?;
        let (rb, had_session, _) = self.authorized(Method::GET).await.map_err(|e| e.to_string())?;
        let resp = match rb.header(ACCEPT, EVENT_STREAM).header(LAST_EVENT_ID, last).send().await {
            Ok(r) => r,
            Err(e) => {
                let connect = e.is_connect();
                let why = describe(e);
                if connect {
                    self.close_core(&format!("unreachable at {} ({why})", self.shown_url));
                }
                return Err(format!("upstream {server}: resuming its SSE stream failed: {why}"));
            }
        };
        let (status, ctype, snippet) = match self.check_session(resp, had_session).await {
            Checked::Expired => return Err(self.closed_error().to_string()),
            Checked::Refused { status, ctype, snippet } => (status, ctype, snippet),
            Checked::Answer(resp) => {
                let (status, ctype) = (resp.status(), content_type(&resp));
                if status.is_success() && ctype == EVENT_STREAM {
                    return Ok(resp);
                }
                (status, ctype.clone(), self.snippet(resp, &ctype).await)
            }
        };
        Err(format!(
            "upstream {server} could not resume its SSE stream: HTTP {status}{}: {snippet}",
            ctype_note(&ctype)
        ))
    }

    /// Reads one SSE response, dispatching each event's data, until it ends, the response to
    /// `request_id` was read (then the server has [`DRAIN_GRACE`] to end it), or nobody waits.
    async fn pump(&self, mut resp: Response, parser: &mut SseParser, request_id: Option<u64>) -> StreamEnd {
        let mut events = Vec::new();
        let mut check = tokio::time::interval(CHECK_EVERY);
        check.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut answered_at: Option<Instant> = None;
        loop {
            tokio::select! {
                chunk = resp.chunk() => match chunk {
                    Ok(Some(bytes)) => {
                        parser.push(&bytes, &mut events);
                        if parser.take_oversized() {
                            tracing::warn!(server = %self.core.server, limit = MAX_FRAME, "Upstream SSE event over the limit; discarded.");
                        }
                        // MCP sends only `message` events; others (a ping) carry no JSON-RPC.
                        for event in events.drain(..).filter(|e| e.is_message() && !e.data.is_empty()) {
                            self.core.dispatch(&event.data);
                        }
                        if let Some(id) = request_id
                            && answered_at.is_none()
                            && !self.core.is_pending(id)
                        {
                            answered_at = Some(Instant::now());
                        }
                    }
                    Ok(None) if answered_at.is_some() => return StreamEnd::Answered,
                    Ok(None) => return StreamEnd::Ended,
                    Err(_) if answered_at.is_some() => return StreamEnd::Answered,
                    Err(e) => return StreamEnd::Failed(describe(e)),
                },
                _ = check.tick() => {
                    if !self.core.is_alive() {
                        return StreamEnd::Unwanted;
                    }
                    match (request_id, answered_at) {
                        (_, Some(at)) if at.elapsed() >= DRAIN_GRACE => {
                            tracing::debug!(server = %self.core.server, "Upstream kept a stream open after the response; dropped it.");
                            return StreamEnd::Answered;
                        }
                        (Some(id), None) if !self.core.is_pending(id) => return StreamEnd::Unwanted,
                        _ => {}
                    }
                }
            }
        }
    }

    /// The `GET` stream (MCP 2025-11-25 §Listening for Messages from the Server): dispatches
    /// the server's notifications and requests; reconnects with `Last-Event-ID` after the
    /// server's `retry` or a bounded backoff while the upstream is alive; stops on 405 (no
    /// stream offered) or another client error.
    pub(super) async fn listen(self: Arc<Self>) {
        let server = self.core.server.clone();
        let mut parser = SseParser::with_limit(MAX_FRAME);
        let mut failures: u32 = 0;
        loop {
            if !self.core.is_alive() {
                return;
            }
            let (rb, had_session) = match self.authorized(Method::GET).await {
                Ok((rb, had_session, _)) => (rb, had_session),
                Err(e) => {
                    tracing::debug!(server = %server, error = %e, "No GET stream: the upstream's token is not usable.");
                    return;
                }
            };
            let mut rb = rb.header(ACCEPT, EVENT_STREAM);
            if let Some(last) = parser.last_event_id()
                && let Ok(v) = HeaderValue::from_str(last)
            {
                rb = rb.header(LAST_EVENT_ID, v);
            }
            match rb.send().await {
                Err(e) if e.is_connect() => {
                    let why = describe(e);
                    tracing::warn!(server = %server, url = %self.shown_url, error = %why, "Upstream unreachable.");
                    return self.close_core(&format!("unreachable at {} ({why})", self.shown_url));
                }
                Err(e) => {
                    failures += 1;
                    tracing::debug!(server = %server, error = %describe(e), "Upstream GET stream failed; retrying.");
                }
                Ok(resp) => {
                    let resp = match self.check_session(resp, had_session).await {
                        Checked::Expired => return,
                        Checked::Refused { status, ctype, .. } => {
                            tracing::warn!(server = %server, url = %self.shown_url, status = status.as_u16(), content_type = %ctype, "Upstream GET stream unusable; its own messages arrive only on POST streams.");
                            return;
                        }
                        Checked::Answer(resp) => resp,
                    };
                    let status = resp.status();
                    let ctype = content_type(&resp);
                    if status == StatusCode::METHOD_NOT_ALLOWED {
                        tracing::debug!(server = %server, "Upstream offers no GET stream (HTTP 405).");
                        return;
                    }
                    if status.is_success() && ctype == EVENT_STREAM {
                        parser.start_new_response();
                        let before = parser.events_seen();
                        let end = self.pump(resp, &mut parser, None).await;
                        if matches!(end, StreamEnd::Unwanted) {
                            return;
                        }
                        failures = if parser.events_seen() > before { 0 } else { failures + 1 };
                        tracing::debug!(server = %server, end = ?end, "Upstream GET stream ended; reconnecting.");
                    } else if status.is_server_error() || matches!(status.as_u16(), 408 | 409 | 425 | 429) {
                        failures += 1;
                        tracing::debug!(server = %server, status = status.as_u16(), "Upstream refused the GET stream; retrying.");
                    } else {
                        tracing::warn!(server = %server, url = %self.shown_url, status = status.as_u16(), content_type = %ctype, "Upstream GET stream unusable; its own messages arrive only on POST streams.");
                        return;
                    }
                }
            }
            // At most five doublings (1 s … 30 s); zero before any failure.
            let backoff = coffer_runtime::Backoff::new(RECONNECT_BASE, RECONNECT_MAX).delay_after(failures.min(6));
            tokio::time::sleep(parser.retry().unwrap_or(RECONNECT_BASE).max(backoff)).await;
        }
    }
}
