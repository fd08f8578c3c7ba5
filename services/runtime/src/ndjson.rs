//! Newline-delimited JSON-RPC framing (MCP 2025-11-25, basic/transports §stdio: "messages are
//! delimited by newlines, and MUST NOT contain embedded newlines"): reading lines under a size
//! limit without holding an oversized line in memory, and finding the request id of one
//! wherever it stands in the object (SDKs write `id` first or last: the TypeScript SDK puts it
//! after `params`).
//!
//! Used by the shim on its stdin and by the gateway on `/mcp` connections upgraded to a stream.
use std::borrow::Cow;
use std::io;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};

/// How much of an oversized line is kept (for logging its start), in bytes.
pub const SNIFF_PREFIX_BYTES: usize = 64 * 1024;

/// Longest request id text looked at, bytes; a longer one is not taken as an id.
const MAX_ID_BYTES: usize = 1024;

/// One line of input.
#[derive(Debug)]
pub enum Input {
    /// A line within the limit, without its line terminator.
    Line(Vec<u8>),
    /// A line over the limit: its first bytes and its request id (a string or number, else
    /// `null`), found by scanning the whole line as it was skipped (see [`IdScanner`]).
    Oversized { prefix: Vec<u8>, id: Value },
}

/// Reads newline-delimited lines of at most `max_bytes` bytes (excluding `\n` or `\r\n`).
pub struct FrameReader<R> {
    inner: BufReader<R>,
    max_bytes: usize,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    pub fn new(reader: R, max_bytes: usize) -> Self {
        Self { inner: BufReader::with_capacity(64 * 1024, reader), max_bytes }
    }

    /// The next line; `None` at end of input. A last line without a terminator still counts.
    /// An oversized line is consumed to its end without being held in memory.
    ///
    /// # Errors
    /// An I/O error reading stdin.
    pub async fn next(&mut self) -> io::Result<Option<Input>> {
        let mut line = Vec::new();
        // Set once the line is over the limit: everything after is scanned for the id, not kept.
        let mut scanner: Option<IdScanner> = None;
        loop {
            let buf = self.inner.fill_buf().await?;
            if buf.is_empty() {
                if line.is_empty() && scanner.is_none() {
                    return Ok(None);
                }
                break;
            }
            let newline = buf.iter().position(|&b| b == b'\n');
            let chunk = &buf[..newline.unwrap_or(buf.len())];
            match scanner.as_mut() {
                Some(s) => s.feed(chunk),
                // One extra byte of room for the CR of a CRLF terminator.
                None if line.len() + chunk.len() > self.max_bytes + 1 => {
                    let mut s = IdScanner::default();
                    s.feed(&line);
                    s.feed(chunk);
                    scanner = Some(s);
                    let room = SNIFF_PREFIX_BYTES.saturating_sub(line.len()).min(chunk.len());
                    line.extend_from_slice(&chunk[..room]);
                    line.truncate(SNIFF_PREFIX_BYTES);
                    line.shrink_to_fit();
                }
                None => line.extend_from_slice(chunk),
            }
            let consumed = newline.map_or(buf.len(), |i| i + 1);
            self.inner.consume(consumed);
            if newline.is_some() {
                break;
            }
        }
        if scanner.is_none() {
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            if line.len() > self.max_bytes {
                let mut s = IdScanner::default();
                s.feed(&line);
                scanner = Some(s);
                line.truncate(SNIFF_PREFIX_BYTES);
            }
        }
        Ok(Some(match scanner {
            Some(s) => Input::Oversized { prefix: line, id: s.id() },
            None => Input::Line(line),
        }))
    }
}

/// Finds the request id of a JSON-RPC object from the beginning of its text, which may be cut
/// off anywhere after it. Returns `Value::Null` when there is no string or number `id` before
/// the cut (or the text is not an object).
pub fn sniff_id(prefix: &[u8]) -> Value {
    let mut s = IdScanner::default();
    s.feed(prefix);
    s.id()
}

/// Finds the top-level `"id"` member of a JSON object fed to it in pieces, in one pass with
/// constant memory (a request id of at most 1 KiB), so that the id of a message too large to
/// hold is found wherever it stands. It tracks only string, escape and nesting state; it does
/// not validate the JSON (a message that is not valid gets whatever id its bytes show, which is
/// only used to address an error).
#[derive(Debug, Default)]
pub struct IdScanner {
    /// Nesting depth: 1 inside the top-level object.
    depth: usize,
    in_string: bool,
    escaped: bool,
    /// At depth 1, the next string is a member name.
    expect_key: bool,
    /// Reading a top-level member name (its bytes go to `key`, the first few only).
    in_key: bool,
    key: Vec<u8>,
    /// Reading the value of a top-level `"id"` (its bytes go to `value`).
    in_id: bool,
    value: Vec<u8>,
    /// Stop looking: the id was found, or the text is not an object.
    done: bool,
    found: Option<Value>,
}

impl IdScanner {
    /// Scans the next bytes of the text.
    pub fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if self.done {
                return;
            }
            self.step(b);
        }
    }

    fn step(&mut self, b: u8) {
        if self.in_string {
            if self.escaped {
                self.escaped = false;
            } else if b == b'\\' {
                self.escaped = true;
            } else if b == b'"' {
                self.in_string = false;
                if self.in_key {
                    self.in_key = false;
                    return;
                }
            }
            if self.in_key {
                if self.key.len() < 4 {
                    self.key.push(b);
                }
                return;
            }
            self.record(b);
            return;
        }
        match b {
            b'"' => {
                self.in_string = true;
                if self.depth == 1 && self.expect_key {
                    self.expect_key = false;
                    self.in_key = true;
                    self.key.clear();
                } else {
                    self.record(b);
                }
            }
            b'{' | b'[' => {
                if self.depth == 0 && b == b'[' {
                    self.done = true;
                    return;
                }
                self.depth += 1;
                if self.depth == 1 {
                    self.expect_key = true;
                } else {
                    self.record(b);
                }
            }
            b'}' | b']' if self.depth == 1 => self.end_member(true),
            b'}' | b']' => {
                self.record(b);
                self.depth = self.depth.saturating_sub(1);
            }
            b':' if self.depth == 1 => self.in_id = self.key == b"id",
            b',' if self.depth == 1 => self.end_member(false),
            _ if self.depth == 0 && !b.is_ascii_whitespace() => self.done = true,
            _ => self.record(b),
        }
    }

    /// A byte of the current value: kept when it is the id's.
    fn record(&mut self, b: u8) {
        if self.in_id {
            if self.value.len() >= MAX_ID_BYTES {
                self.in_id = false;
                self.done = true;
            } else {
                self.value.push(b);
            }
        }
    }

    /// A top-level member ended (`,`) or the object did (`last`).
    fn end_member(&mut self, last: bool) {
        if self.in_id {
            self.in_id = false;
            self.found = serde_json::from_slice(&self.value).ok();
            self.done = true;
        }
        self.expect_key = true;
        if last {
            self.done = true;
        }
    }

    /// The id found so far: a string or number; `Value::Null` when none was (yet), or it was
    /// something else. An id whose value the text was cut inside counts when it parses.
    pub fn id(&self) -> Value {
        let found = self
            .found
            .clone()
            .or_else(|| (self.in_id && !self.in_string).then(|| serde_json::from_slice(&self.value).ok()).flatten());
        match found {
            Some(v @ (Value::Number(_) | Value::String(_))) => v,
            _ => Value::Null,
        }
    }
}

/// Valid JSON text as one line: raw CR and LF can occur in valid JSON only as insignificant
/// whitespace, so removing them keeps the value intact. Borrows when there are none.
pub fn without_line_breaks(json: &[u8]) -> Cow<'_, [u8]> {
    if json.iter().any(|&b| b == b'\n' || b == b'\r') {
        Cow::Owned(json.iter().copied().filter(|&b| b != b'\n' && b != b'\r').collect())
    } else {
        Cow::Borrowed(json)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// The limit Coffer uses on stdio and on `/mcp`: 16 MiB.
    const MAX: usize = 16 * 1024 * 1024;

    async fn read_all(data: &[u8], max: usize) -> Vec<Input> {
        let mut r = FrameReader::new(data, max);
        let mut out = Vec::new();
        while let Some(i) = r.next().await.expect("reading a slice cannot fail") {
            out.push(i);
        }
        out
    }

    fn lines(inputs: &[Input]) -> Vec<String> {
        inputs
            .iter()
            .map(|i| match i {
                Input::Line(l) => String::from_utf8_lossy(l).into_owned(),
                Input::Oversized { .. } => "<oversized>".into(),
            })
            .collect()
    }

    #[tokio::test]
    async fn splits_lines_and_strips_crlf() {
        let got = read_all(b"a\r\nbb\n\nlast", 10).await;
        assert_eq!(lines(&got), ["a", "bb", "", "last"]);
    }

    #[tokio::test]
    async fn enforces_the_limit_and_keeps_going() {
        let got = read_all(b"12345\n123456\n1234567890\r\nok\n", 5).await;
        assert_eq!(lines(&got), ["12345", "<oversized>", "<oversized>", "ok"]);
        let got = read_all(b"12345\r\n", 5).await;
        assert_eq!(lines(&got), ["12345"]);
    }

    #[tokio::test]
    async fn a_line_of_exactly_the_limit_passes_and_one_byte_more_does_not() {
        let mut data = vec![b'x'; MAX];
        data.push(b'\n');
        data.extend(std::iter::repeat_n(b'y', MAX + 1));
        data.extend_from_slice(b"\nz");
        let got = read_all(&data, MAX).await;
        assert!(matches!(&got[0], Input::Line(l) if l.len() == MAX));
        assert!(matches!(&got[1], Input::Oversized { prefix, .. } if prefix.len() == SNIFF_PREFIX_BYTES));
        assert_eq!(lines(&got[2..]), ["z"]);
    }

    #[test]
    fn line_breaks_are_removed_and_the_value_kept() {
        let pretty = b"{\r\n  \"a\": \"x\\ny\",\n  \"b\": [1,\n 2]\n}";
        let one = without_line_breaks(pretty);
        assert!(!one.contains(&b'\n') && !one.contains(&b'\r'));
        let v: Value = serde_json::from_slice(&one).unwrap();
        assert_eq!(v, json!({"a": "x\ny", "b": [1, 2]}));
        assert!(matches!(without_line_breaks(b"{}"), Cow::Borrowed(_)));
    }

    #[test]
    fn sniffs_the_id_of_a_truncated_request() {
        assert_eq!(sniff_id(br#"{"jsonrpc":"2.0","id":42,"method":"tools/call","params":{"x":"aaa"#), json!(42));
        assert_eq!(sniff_id(br#"{"jsonrpc":"2.0","method":"m","params":{},"id":"s-1"}"#), json!("s-1"));
        assert_eq!(sniff_id(br#"{"jsonrpc":"2.0","method":"m","params":{"x":"aaa"#), Value::Null);
        assert_eq!(sniff_id(br#"{"id":{"no":1}}"#), Value::Null);
        assert_eq!(sniff_id(br#"[{"id":1}]"#), Value::Null);
        assert_eq!(sniff_id(b"garbage"), Value::Null);
        assert_eq!(sniff_id(br#"{"params":{"id":1,"s":"\"id\":2,"},"id" : "x\"y" }"#), json!("x\"y"));
        assert_eq!(sniff_id(br#"{"method":"m","params":["}",{"a":[1,{"id":3}]}],"id":-7.5}"#), json!(-7.5));
        assert_eq!(sniff_id(br#"{"idx":1,"id":null}"#), Value::Null);
    }

    /// A line over the limit is answered with its id even when the id comes after a huge
    /// `params` (as the TypeScript SDK writes requests), and the next line is read as usual.
    #[tokio::test]
    async fn the_id_of_an_oversized_line_is_found_after_its_params() {
        let big = "a".repeat(300 * 1024);
        let mut data = format!(
            r#"{{"method":"tools/call","params":{{"arguments":{{"q":"{big}","id":0}}}},"jsonrpc":"2.0","id":"late-9"}}"#
        )
        .into_bytes();
        data.extend_from_slice(b"\n{\"id\":1}\n");
        data.extend_from_slice(format!(r#"{{"id":77,"params":"{big}"}}"#).as_bytes());
        let got = read_all(&data, 64 * 1024).await;
        assert!(matches!(&got[0], Input::Oversized { id, .. } if id == &json!("late-9")), "{got:?}");
        assert_eq!(lines(&got[1..2]), [r#"{"id":1}"#]);
        assert!(matches!(&got[2], Input::Oversized { id, .. } if id == &json!(77)), "{got:?}");
    }
}
