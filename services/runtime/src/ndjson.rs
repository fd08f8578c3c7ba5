//! Newline-delimited JSON-RPC framing (MCP 2025-11-25, basic/transports §stdio: "messages are
//! delimited by newlines, and MUST NOT contain embedded newlines"): reading lines under a size
//! limit without holding an oversized line in memory, and finding the request id of one.
//!
//! Used by the shim on its stdin and by the gateway on `/mcp` connections upgraded to a stream.
use std::borrow::Cow;
use std::io;

use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, Visitor};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};

/// How much of an oversized line is kept to find its request id, in bytes.
pub const SNIFF_PREFIX_BYTES: usize = 64 * 1024;

/// One line of input.
#[derive(Debug)]
pub enum Input {
    /// A line within the limit, without its line terminator.
    Line(Vec<u8>),
    /// A line over the limit: its first bytes (to find the request id); the rest was skipped.
    Oversized { prefix: Vec<u8> },
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
        let mut oversized = false;
        loop {
            let buf = self.inner.fill_buf().await?;
            if buf.is_empty() {
                if line.is_empty() && !oversized {
                    return Ok(None);
                }
                break;
            }
            let newline = buf.iter().position(|&b| b == b'\n');
            let chunk = &buf[..newline.unwrap_or(buf.len())];
            if !oversized {
                // One extra byte of room for the CR of a CRLF terminator.
                if line.len() + chunk.len() > self.max_bytes + 1 {
                    oversized = true;
                    let room = SNIFF_PREFIX_BYTES.saturating_sub(line.len()).min(chunk.len());
                    line.extend_from_slice(&chunk[..room]);
                    line.truncate(SNIFF_PREFIX_BYTES);
                    line.shrink_to_fit();
                } else {
                    line.extend_from_slice(chunk);
                }
            }
            let consumed = newline.map_or(buf.len(), |i| i + 1);
            self.inner.consume(consumed);
            if newline.is_some() {
                break;
            }
        }
        if !oversized {
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            if line.len() > self.max_bytes {
                oversized = true;
                line.truncate(SNIFF_PREFIX_BYTES);
            }
        }
        Ok(Some(if oversized { Input::Oversized { prefix: line } } else { Input::Line(line) }))
    }
}

/// Finds the request id of a JSON-RPC object from the beginning of its text, which may be cut
/// off anywhere after it. Returns `Value::Null` when there is no string or number `id` before
/// the cut (or the text is not an object).
pub fn sniff_id(prefix: &[u8]) -> Value {
    struct IdSeed<'a>(&'a mut Option<Value>);

    impl<'de> DeserializeSeed<'de> for IdSeed<'_> {
        type Value = ();
        fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_map(self)
        }
    }

    impl<'de> Visitor<'de> for IdSeed<'_> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON-RPC object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            while let Some(key) = map.next_key::<String>()? {
                if key == "id" {
                    *self.0 = Some(map.next_value()?);
                    return Ok(());
                }
                map.next_value::<IgnoredAny>()?;
            }
            Ok(())
        }
    }

    let mut found = None;
    let mut de = serde_json::Deserializer::from_slice(prefix);
    // The text is cut off, so deserialization ends in an error; what matters is whether the
    // visitor saw the id first.
    let _ = IdSeed(&mut found).deserialize(&mut de);
    match found {
        Some(v @ (Value::Number(_) | Value::String(_))) => v,
        _ => Value::Null,
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
        assert!(matches!(&got[1], Input::Oversized { prefix } if prefix.len() == SNIFF_PREFIX_BYTES));
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
    }
}
