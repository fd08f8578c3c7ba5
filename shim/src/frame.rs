//! Newline-delimited JSON-RPC framing on stdio (MCP 2025-11-25, basic/transports §stdio):
//! reading stdin lines under a size limit, and the one task that writes stdout.
//!
//! Nothing reaches stdout except through [`write_frames`], and it only writes [`Frame`]s, each
//! of which is one compact JSON value with no CR or LF byte, followed by `\n`.
use std::io;

use bytes::Bytes;
use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, Visitor};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader, BufWriter};
use tokio::sync::mpsc;

/// How much of an oversized line is kept to find its request id, in bytes.
const SNIFF_PREFIX_BYTES: usize = 64 * 1024;

/// One JSON-RPC message (or batch) ready for stdout: a JSON text with no CR or LF byte.
#[derive(Debug, Clone)]
pub(crate) struct Frame(Bytes);

impl Frame {
    /// Wraps JSON text that has already been validated. Raw CR and LF cannot occur inside JSON
    /// strings, so in valid JSON they are insignificant whitespace and removing them keeps the
    /// value intact while making it one line.
    pub(crate) fn from_valid_json(json: Bytes) -> Self {
        let start = json.iter().position(|b| !b.is_ascii_whitespace()).unwrap_or(json.len());
        let end = json.iter().rposition(|b| !b.is_ascii_whitespace()).map_or(start, |i| i + 1);
        let json = json.slice(start..end);
        if json.iter().any(|&b| b == b'\n' || b == b'\r') {
            Self(json.iter().copied().filter(|&b| b != b'\n' && b != b'\r').collect::<Vec<u8>>().into())
        } else {
            Self(json)
        }
    }

    /// Serializes a JSON value (serde_json writes it compactly, on one line).
    pub(crate) fn from_value(value: &Value) -> Self {
        // Serializing a `Value` cannot fail: its map keys are strings.
        Self(serde_json::to_vec(value).unwrap_or_default().into())
    }

    /// A JSON-RPC batch response: the frames as one array.
    pub(crate) fn batch(frames: &[Frame]) -> Self {
        let mut out = Vec::with_capacity(frames.iter().map(|f| f.0.len() + 1).sum::<usize>() + 2);
        out.push(b'[');
        for (i, f) in frames.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(&f.0);
        }
        out.push(b']');
        Self(out.into())
    }

    /// The JSON text.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.0
    }
}

/// One stdin line.
#[derive(Debug)]
pub(crate) enum Input {
    /// A line within the limit, without its line terminator.
    Line(Vec<u8>),
    /// A line over the limit: its first bytes (to find the request id); the rest was skipped.
    Oversized { prefix: Vec<u8> },
}

/// Reads newline-delimited lines of at most `max_bytes` bytes (excluding `\n` or `\r\n`).
pub(crate) struct FrameReader<R> {
    inner: BufReader<R>,
    max_bytes: usize,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    pub(crate) fn new(reader: R, max_bytes: usize) -> Self {
        Self { inner: BufReader::with_capacity(64 * 1024, reader), max_bytes }
    }

    /// The next line; `None` at end of input. A last line without a terminator still counts.
    /// An oversized line is consumed to its end without being held in memory.
    ///
    /// # Errors
    /// An I/O error reading stdin.
    pub(crate) async fn next(&mut self) -> io::Result<Option<Input>> {
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
pub(crate) fn sniff_id(prefix: &[u8]) -> Value {
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

/// The one writer of stdout: writes each frame followed by `\n`, flushing whenever no further
/// frame is queued. Returns when every sender is gone (after writing what was queued).
///
/// # Errors
/// The I/O error that stopped writing (typically a broken pipe: the client went away).
pub(crate) async fn write_frames<W: AsyncWrite + Unpin>(mut frames: mpsc::Receiver<Frame>, out: W) -> io::Result<()> {
    let mut out = BufWriter::with_capacity(64 * 1024, out);
    while let Some(frame) = frames.recv().await {
        write_one(&mut out, &frame).await?;
        while let Ok(frame) = frames.try_recv() {
            write_one(&mut out, &frame).await?;
        }
        out.flush().await?;
    }
    out.flush().await
}

async fn write_one<W: AsyncWrite + Unpin>(out: &mut BufWriter<W>, frame: &Frame) -> io::Result<()> {
    out.write_all(frame.bytes()).await?;
    out.write_all(b"\n").await
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::DEFAULT_MAX_FRAME_BYTES;

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
    async fn default_limit_is_16_mib() {
        assert_eq!(DEFAULT_MAX_FRAME_BYTES, 16 * 1024 * 1024);
        let mut data = vec![b'x'; DEFAULT_MAX_FRAME_BYTES];
        data.push(b'\n');
        data.extend(std::iter::repeat_n(b'y', DEFAULT_MAX_FRAME_BYTES + 1));
        data.extend_from_slice(b"\nz");
        let got = read_all(&data, DEFAULT_MAX_FRAME_BYTES).await;
        assert!(matches!(&got[0], Input::Line(l) if l.len() == DEFAULT_MAX_FRAME_BYTES));
        assert!(matches!(&got[1], Input::Oversized { prefix } if prefix.len() == SNIFF_PREFIX_BYTES));
        assert_eq!(lines(&got[2..]), ["z"]);
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

    #[test]
    fn frames_are_single_lines() {
        let f = Frame::from_valid_json(Bytes::from_static(b"  {\r\n  \"a\": \"x\\ny\",\n  \"b\": [1,\n 2]\n}\n"));
        assert_eq!(f.bytes(), br#"{  "a": "x\ny",  "b": [1, 2]}"#);
        let v: Value = serde_json::from_slice(f.bytes()).unwrap();
        assert_eq!(v, json!({"a": "x\ny", "b": [1, 2]}));
        let b = Frame::batch(&[Frame::from_value(&json!({"id": 1})), Frame::from_value(&json!({"id": 2}))]);
        assert_eq!(b.bytes(), br#"[{"id":1},{"id":2}]"#);
    }

    #[tokio::test]
    async fn writer_terminates_each_frame() {
        let (tx, rx) = mpsc::channel(4);
        let (w, mut r) = tokio::io::duplex(1024);
        let task = tokio::spawn(write_frames(rx, w));
        tx.send(Frame::from_value(&json!({"a": 1}))).await.unwrap();
        tx.send(Frame::from_value(&json!([2]))).await.unwrap();
        drop(tx);
        task.await.unwrap().unwrap();
        let mut s = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut r, &mut s).await.unwrap();
        assert_eq!(s, "{\"a\":1}\n[2]\n");
    }
}
