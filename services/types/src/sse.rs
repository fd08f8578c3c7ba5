//! An incremental Server-Sent Events parser (WHATWG HTML §9.2.6 "Interpreting an event
//! stream") for the `text/event-stream` bodies of MCP Streamable HTTP (MCP 2025-11-25,
//! basic/transports §Streamable HTTP): the shim reads the daemon's with it, the gateway its HTTP
//! upstreams'.
//!
//! Written here rather than taken from a crate because both need what the small SSE crates do
//! not give: the last event id and `retry` of events that carry no data (the priming event a
//! Streamable HTTP server sends first is exactly `id: …` with empty data, and it is what a
//! resumption needs), linear-time parsing of very long `data:` lines (tool results of several
//! MiB arrive as one line split over many chunks), and a size limit per event.
use std::time::Duration;

/// One dispatched event. Events whose data buffer is empty are not dispatched (per the
/// standard); their `id` and `retry` still update the parser.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` type as sent; empty when absent (the standard's default, `message`).
    pub event: String,
    /// The `data:` lines joined with LF.
    pub data: Vec<u8>,
}

impl SseEvent {
    /// The event type, `message` when none was sent.
    pub fn kind(&self) -> &str {
        if self.event.is_empty() { "message" } else { &self.event }
    }

    /// Whether it is a `message` event (the only type MCP sends).
    pub fn is_message(&self) -> bool {
        self.kind() == "message"
    }
}

/// Parser state for one logical event stream, which may span several HTTP responses when a
/// stream is resumed with `Last-Event-ID`.
#[derive(Debug)]
pub struct SseParser {
    /// The current, not yet terminated line.
    line: Vec<u8>,
    /// The previous chunk ended in CR: a LF at the start of the next chunk belongs to it.
    skip_lf: bool,
    /// The first line of the current response was seen (a leading BOM is dropped from it).
    started: bool,
    /// The data buffer of the current event.
    data: Vec<u8>,
    /// The event type buffer.
    event: String,
    /// The last event ID buffer: set by `id:`, kept across events.
    id_buffer: Option<String>,
    /// The last event ID of the stream: the buffer at the last dispatch (survives responses).
    last_event_id: Option<String>,
    /// The reconnection time the server asked for (`retry:`).
    retry: Option<Duration>,
    /// Largest event (line plus data), in bytes; a larger one is discarded.
    max_event_bytes: usize,
    /// The current event is over the size limit and is being discarded.
    oversized: bool,
    /// An event was discarded for its size since the last [`SseParser::take_oversized`].
    dropped: bool,
    /// The current event has an `id` or `data` field.
    has_fields: bool,
    /// Events completed that had an `id` or `data` field.
    events_seen: u64,
}

impl Default for SseParser {
    fn default() -> Self {
        Self::new()
    }
}

const BOM: &[u8] = b"\xEF\xBB\xBF";

impl SseParser {
    /// A parser at the start of a stream, with no limit on an event's size.
    pub fn new() -> Self {
        Self::with_limit(usize::MAX)
    }

    /// A parser that discards (and reports through [`SseParser::take_oversized`]) every event
    /// larger than `max_event_bytes`.
    pub fn with_limit(max_event_bytes: usize) -> Self {
        Self {
            line: Vec::new(),
            skip_lf: false,
            started: false,
            data: Vec::new(),
            event: String::new(),
            id_buffer: None,
            last_event_id: None,
            retry: None,
            max_event_bytes,
            oversized: false,
            dropped: false,
            has_fields: false,
            events_seen: 0,
        }
    }

    /// Feeds the next chunk of the body; complete events are appended to `out`. Linear in the
    /// chunk: a long line arriving in many chunks is appended to, never rescanned.
    pub fn push(&mut self, mut chunk: &[u8], out: &mut Vec<SseEvent>) {
        while !chunk.is_empty() {
            if self.skip_lf {
                self.skip_lf = false;
                if chunk[0] == b'\n' {
                    chunk = &chunk[1..];
                    continue;
                }
            }
            match chunk.iter().position(|&b| b == b'\n' || b == b'\r') {
                Some(i) => {
                    self.append(&chunk[..i]);
                    self.skip_lf = chunk[i] == b'\r';
                    chunk = &chunk[i + 1..];
                    self.end_line(out);
                }
                None => {
                    self.append(chunk);
                    break;
                }
            }
        }
    }

    /// Forgets the partial event of a response that ended, keeping the last event id and the
    /// reconnection time, before the stream continues in a new response.
    pub fn start_new_response(&mut self) {
        self.line.clear();
        self.skip_lf = false;
        self.started = false;
        self.data.clear();
        self.event.clear();
        self.oversized = false;
        self.has_fields = false;
        self.id_buffer.clone_from(&self.last_event_id);
    }

    /// The last event id seen (the value for `Last-Event-ID`); `None` when none or empty.
    pub fn last_event_id(&self) -> Option<&str> {
        self.last_event_id.as_deref().filter(|s| !s.is_empty())
    }

    /// The reconnection time the server asked for with `retry:`.
    pub fn retry(&self) -> Option<Duration> {
        self.retry
    }

    /// True once after an event was discarded for its size.
    pub fn take_oversized(&mut self) -> bool {
        std::mem::take(&mut self.dropped)
    }

    /// Events completed so far that had an `id` or `data` field, dispatched or not: tells a
    /// stream that delivered something (a priming event included) from one that only kept the
    /// connection open.
    pub fn events_seen(&self) -> u64 {
        self.events_seen
    }

    fn append(&mut self, bytes: &[u8]) {
        if self.oversized {
            return;
        }
        if self.line.len() + self.data.len() + bytes.len() > self.max_event_bytes {
            self.oversized = true;
            self.line.clear();
            self.data.clear();
            return;
        }
        self.line.extend_from_slice(bytes);
    }

    fn end_line(&mut self, out: &mut Vec<SseEvent>) {
        let line = std::mem::take(&mut self.line);
        let mut l = &line[..];
        if !self.started {
            self.started = true;
            l = l.strip_prefix(BOM).unwrap_or(l);
        }
        self.process_line(l, out);
        // Reuse the allocation for the next line.
        self.line = line;
        self.line.clear();
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
            b"event" => self.event = String::from_utf8_lossy(value).into_owned(),
            b"data" => {
                self.has_fields = true;
                if !self.oversized {
                    self.data.extend_from_slice(value);
                    self.data.push(b'\n');
                }
            }
            b"id" if !value.contains(&0) => {
                self.has_fields = true;
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
        if std::mem::take(&mut self.has_fields) {
            self.events_seen += 1;
        }
        if std::mem::take(&mut self.oversized) {
            self.dropped = true;
            self.data.clear();
            self.event.clear();
            return;
        }
        if self.data.is_empty() {
            self.event.clear();
            return;
        }
        if self.data.last() == Some(&b'\n') {
            self.data.pop();
        }
        out.push(SseEvent { event: std::mem::take(&mut self.event), data: std::mem::take(&mut self.data) });
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
        SseEvent { event: String::new(), data: data.as_bytes().to_vec() }
    }

    #[test]
    fn joins_data_lines_and_skips_comments() {
        let (out, p) = parse_chunks(&[b": keep-alive\nid: 7\ndata: {\"a\":\ndata: 1}\n\n"]);
        assert_eq!(out, vec![ev("{\"a\":\n1}")]);
        assert!(out[0].is_message());
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
        assert_eq!((expected[0].kind(), expected[0].is_message()), ("x", false));
    }

    #[test]
    fn a_bom_split_crlf_and_a_bare_data_field() {
        let (out, p) =
            parse_chunks(&[b"\xEF\xBB\xBFdata: a\r", b"\ndata:b\r\n: comment\r\n\r\nid: 7\nretry: 250\ndata\n\n"]);
        // (`data` alone is an empty data field: an event with empty data.)
        assert_eq!(out, vec![ev("a\nb"), ev("")]);
        assert_eq!(p.last_event_id(), Some("7"));
        assert_eq!(p.retry(), Some(Duration::from_millis(250)));
    }

    #[test]
    fn priming_event_without_data_sets_id_and_retry() {
        let (out, p) = parse_chunks(&[b"id: prime-1\nretry: 250\ndata:\n\n"]);
        // `data:` with an empty value appends a LF, so the standard dispatches an empty event.
        assert_eq!(out, vec![ev("")]);
        assert_eq!(p.last_event_id(), Some("prime-1"));
        assert_eq!(p.retry(), Some(Duration::from_millis(250)));

        let (out, p) = parse_chunks(&[b"id: prime-2\n\n", b"event: ping\ndata: x\n\n", b"data: {\"k\":1}\n", b"\n"]);
        assert_eq!(out, vec![SseEvent { event: "ping".into(), data: b"x".to_vec() }, ev("{\"k\":1}")]);
        assert_eq!(p.last_event_id(), Some("prime-2"));
        assert_eq!(p.events_seen(), 3);
    }

    #[test]
    fn unterminated_event_is_not_dispatched_and_is_dropped_on_resume() {
        let mut p = SseParser::new();
        let mut out = Vec::new();
        p.push(b"id: 1\ndata: a\n\nid: 2\ndata: partial", &mut out);
        assert_eq!(out, vec![ev("a")]);
        p.start_new_response();
        p.push(b"\xEF\xBB\xBFdata: b\n\n", &mut out);
        assert_eq!(out, vec![ev("a"), ev("b")]);
        assert_eq!(p.last_event_id(), Some("1"));
        let (out, _) = parse_chunks(&[b"data: one\r\rdata: two"]);
        assert_eq!(out, vec![ev("one")]);
    }

    #[test]
    fn ignores_bad_retry_and_nul_ids() {
        let (_, p) = parse_chunks(&[b"retry: 1x\nid: a\0b\ndata: x\n\n"]);
        assert_eq!(p.retry(), None);
        assert_eq!(p.last_event_id(), None);
    }

    #[test]
    fn long_lines_in_many_chunks_and_oversized_events() {
        const LIMIT: usize = 4 << 20;
        let big = "x".repeat(1 << 20);
        let mut p = SseParser::with_limit(LIMIT);
        let mut out = Vec::new();
        p.push(b"data: ", &mut out);
        for piece in big.as_bytes().chunks(1000) {
            p.push(piece, &mut out);
        }
        p.push(b"\n\n", &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].data.len(), big.len());
        assert!(!p.take_oversized());

        out.clear();
        let huge = vec![b'y'; 1 << 20];
        p.push(b"data: ", &mut out);
        for _ in 0..(LIMIT >> 20) + 1 {
            p.push(&huge, &mut out);
        }
        p.push(b"\n\ndata: after\n\n", &mut out);
        assert!(p.take_oversized());
        assert!(!p.take_oversized());
        assert_eq!(out, vec![ev("after")]);
    }
}
