//! An incremental Server-Sent Events parser for the `text/event-stream` bodies of `/mcp`
//! (WHATWG HTML §9.2.6 "Interpreting an event stream"; MCP 2025-11-25, basic/transports
//! §Streamable HTTP).
//!
//! Written here rather than taken from a crate because the shim needs two things the small SSE
//! crates do not give: the last event id and `retry` of events that carry no data (the priming
//! event a Streamable HTTP server sends first is exactly `id: …` with empty data, and it is what
//! a resumption needs), and linear-time parsing of very long `data:` lines (tool results of
//! several MiB arrive as one line split over many chunks).
use std::time::Duration;

/// One dispatched event. Events whose data buffer is empty are not dispatched (per the
/// standard); their `id` and `retry` still update the parser.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SseEvent {
    /// The `event:` type, `message` when absent.
    pub event: String,
    /// The `data:` lines joined with LF.
    pub data: Vec<u8>,
}

/// Parser state for one logical event stream, which may span several HTTP responses when a
/// stream is resumed with `Last-Event-ID`.
#[derive(Debug, Default)]
pub(crate) struct SseParser {
    /// The current, not yet terminated line.
    line: Vec<u8>,
    /// The previous chunk ended in CR: a LF at the start of the next chunk belongs to it.
    skip_lf: bool,
    /// Bytes of the current HTTP response have been seen (a leading BOM is only skipped once).
    started: bool,
    data: Vec<u8>,
    event_type: String,
    id_buffer: Option<String>,
    last_event_id: Option<String>,
    retry: Option<Duration>,
}

const BOM: &[u8] = b"\xEF\xBB\xBF";

impl SseParser {
    /// A parser at the start of a stream.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Feeds the next chunk of the body; complete events are appended to `out`.
    pub(crate) fn push(&mut self, mut chunk: &[u8], out: &mut Vec<SseEvent>) {
        if chunk.is_empty() {
            return;
        }
        if !self.started {
            self.started = true;
            // The BOM may be split over chunks only in theory; servers send it whole if at all.
            chunk = chunk.strip_prefix(BOM).unwrap_or(chunk);
        }
        if self.skip_lf {
            self.skip_lf = false;
            chunk = chunk.strip_prefix(b"\n").unwrap_or(chunk);
        }
        while let Some(i) = chunk.iter().position(|&b| b == b'\n' || b == b'\r') {
            self.line.extend_from_slice(&chunk[..i]);
            let was_cr = chunk[i] == b'\r';
            chunk = &chunk[i + 1..];
            if was_cr {
                match chunk.first() {
                    Some(b'\n') => chunk = &chunk[1..],
                    None => self.skip_lf = true,
                    Some(_) => {}
                }
            }
            let line = std::mem::take(&mut self.line);
            self.process_line(&line, out);
            // Reuse the allocation for the next line.
            self.line = line;
            self.line.clear();
        }
        self.line.extend_from_slice(chunk);
    }

    /// Forgets the partial event of a response that ended, keeping the last event id and the
    /// reconnection time, before the stream continues in a new response.
    pub(crate) fn start_new_response(&mut self) {
        self.line.clear();
        self.skip_lf = false;
        self.started = false;
        self.data.clear();
        self.event_type.clear();
        self.id_buffer = self.last_event_id.clone();
    }

    /// The last event id seen (the value for `Last-Event-ID`); `None` when none or empty.
    pub(crate) fn last_event_id(&self) -> Option<&str> {
        self.last_event_id.as_deref().filter(|s| !s.is_empty())
    }

    /// The reconnection time the server asked for with `retry:`.
    pub(crate) fn retry(&self) -> Option<Duration> {
        self.retry
    }

    fn process_line(&mut self, line: &[u8], out: &mut Vec<SseEvent>) {
        if line.is_empty() {
            self.dispatch(out);
            return;
        }
        if line[0] == b':' {
            return; // comment (keep-alive)
        }
        let (name, value) = match line.iter().position(|&b| b == b':') {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &[][..]),
        };
        match name {
            b"event" => self.event_type = String::from_utf8_lossy(value).into_owned(),
            b"data" => {
                self.data.extend_from_slice(value);
                self.data.push(b'\n');
            }
            b"id" if !value.contains(&0) => {
                self.id_buffer = Some(String::from_utf8_lossy(value).into_owned());
            }
            b"retry" if !value.is_empty() && value.iter().all(u8::is_ascii_digit) => {
                if let Some(ms) = std::str::from_utf8(value).ok().and_then(|s| s.parse::<u64>().ok()) {
                    self.retry = Some(Duration::from_millis(ms));
                }
            }
            _ => {}
        }
    }

    fn dispatch(&mut self, out: &mut Vec<SseEvent>) {
        self.last_event_id.clone_from(&self.id_buffer);
        if self.data.is_empty() {
            self.event_type.clear();
            return;
        }
        if self.data.last() == Some(&b'\n') {
            self.data.pop();
        }
        let event =
            if self.event_type.is_empty() { "message".to_owned() } else { std::mem::take(&mut self.event_type) };
        out.push(SseEvent { event, data: std::mem::take(&mut self.data) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_chunks(chunks: &[&[u8]]) -> (Vec<SseEvent>, SseParser) {
        let mut p = SseParser::new();
        let mut out = Vec::new();
        for c in chunks {
            p.push(c, &mut out);
        }
        (out, p)
    }

    fn ev(data: &str) -> SseEvent {
        SseEvent { event: "message".into(), data: data.as_bytes().to_vec() }
    }

    #[test]
    fn joins_data_lines_and_skips_comments() {
        let (out, p) = parse_chunks(&[b": keep-alive\nid: 7\ndata: {\"a\":\ndata: 1}\n\n"]);
        assert_eq!(out, vec![ev("{\"a\":\n1}")]);
        assert_eq!(p.last_event_id(), Some("7"));
    }

    #[test]
    fn every_line_terminator_and_any_chunking() {
        let text = b"event: x\r\ndata: one\r\rdata:two\n\ndata: three\r\n\r\n";
        let expected = vec![SseEvent { event: "x".into(), data: b"one".to_vec() }, ev("two"), ev("three")];
        for split in 0..text.len() {
            let (a, b) = text.split_at(split);
            let (out, _) = parse_chunks(&[a, b]);
            assert_eq!(out, expected, "split at {split}");
        }
        let bytes: Vec<&[u8]> = text.chunks(1).collect();
        assert_eq!(parse_chunks(&bytes).0, expected);
    }

    #[test]
    fn priming_event_without_data_sets_id_and_retry() {
        let (out, p) = parse_chunks(&[b"id: prime-1\nretry: 250\ndata:\n\n"]);
        // `data:` with an empty value appends a LF, so the standard dispatches an empty event.
        assert_eq!(out, vec![ev("")]);
        assert_eq!(p.last_event_id(), Some("prime-1"));
        assert_eq!(p.retry(), Some(Duration::from_millis(250)));

        let (out, p) = parse_chunks(&[b"id: prime-2\n\n"]);
        assert!(out.is_empty());
        assert_eq!(p.last_event_id(), Some("prime-2"));
    }

    #[test]
    fn unterminated_event_is_not_dispatched_and_is_dropped_on_resume() {
        let mut p = SseParser::new();
        let mut out = Vec::new();
        p.push(b"id: 1\ndata: a\n\ndata: partial", &mut out);
        assert_eq!(out, vec![ev("a")]);
        p.start_new_response();
        p.push(b"\xEF\xBB\xBFdata: b\n\n", &mut out);
        assert_eq!(out, vec![ev("a"), ev("b")]);
        assert_eq!(p.last_event_id(), Some("1"));
    }

    #[test]
    fn ignores_bad_retry_and_nul_ids() {
        let (_, p) = parse_chunks(&[b"retry: 1x\nid: a\0b\ndata: x\n\n"]);
        assert_eq!(p.retry(), None);
        assert_eq!(p.last_event_id(), None);
    }
}
