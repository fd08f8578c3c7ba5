//! Newline-delimited JSON-RPC framing on stdio (MCP 2025-11-25, basic/transports §stdio):
//! reading stdin lines under a size limit, and the one task that writes stdout.
//!
//! Nothing reaches stdout except through [`write_frames`], and it only writes [`Frame`]s, each
//! of which is one compact JSON value with no CR or LF byte, followed by `\n`.
use std::io;

use bytes::Bytes;
use serde_json::Value;
use tokio::io::{AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::mpsc;

pub(crate) use coffer_runtime::ndjson::{FrameReader, Input};

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
        match coffer_runtime::ndjson::without_line_breaks(&json) {
            std::borrow::Cow::Borrowed(_) => Self(json),
            std::borrow::Cow::Owned(one) => Self(one.into()),
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
