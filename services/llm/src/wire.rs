//! The private translation trait every wire implements ([`Adapter`]), and the stream decoder it
//! hands out ([`Decoder`]): pure functions from a [`Request`] to an HTTP path, headers and JSON
//! body, and from the wire's stream frames to [`StreamEvent`]s. The HTTP, the framing (SSE or
//! newline-delimited JSON), timeouts and error wording live in `http.rs` and `error.rs`.
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use secrecy::{ExposeSecret, SecretString};

use crate::error::Detail;
use crate::{Block, Request, StreamEvent};

/// How a wire frames its stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    /// `text/event-stream` (WHATWG HTML §9.2).
    Sse,
    /// One JSON object per line (Ollama).
    Ndjson,
}

/// One frame of a stream.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Frame<'a> {
    /// A server-sent event: its `event:` name (empty when none) and data.
    Sse { event: &'a str, data: &'a [u8] },
    /// One non-empty line of a newline-delimited JSON stream.
    Line(&'a [u8]),
}

/// Why a frame could not be folded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DecodeError {
    /// Not the wire's shape; the text says what was wrong.
    Garbage(String),
    /// The provider reported an error in the stream.
    Provider(Detail),
}

/// Folds one answer's frames into [`StreamEvent`]s (state per answer).
pub(crate) trait Decoder: Send {
    /// Folds one frame, appending the events it completes to `out` (the last one `Done`).
    fn feed(&mut self, frame: Frame<'_>, out: &mut Vec<StreamEvent>) -> Result<(), DecodeError>;

    /// The body ended. Appends what a wire lets end without its terminal event (Chat
    /// Completions after a `finish_reason`); returns whether the answer is complete.
    fn at_eof(&mut self, out: &mut Vec<StreamEvent>) -> bool {
        let _ = out;
        false
    }
}

/// One wire's translation (one implementation per module).
pub(crate) trait Adapter: Send + Sync {
    /// The model request's path under the base URL (`/v1/messages`).
    fn chat_path(&self) -> &'static str;

    /// The models listing's path (`/v1/models`).
    fn models_path(&self) -> &'static str;

    /// The stream's terminal event, for messages about a cut stream (`message_stop`).
    fn terminal(&self) -> &'static str;

    /// Path endings of a base URL that stand for the API's root and are dropped before the
    /// wire's paths are appended (a pasted `…/v1` is not doubled).
    fn base_suffixes(&self) -> &'static [&'static str] {
        &["/v1"]
    }

    /// The stream framing.
    fn framing(&self) -> Framing {
        Framing::Sse
    }

    /// The authentication headers for `secret` (default: `Authorization: Bearer`).
    ///
    /// # Errors
    /// A text when the key cannot be an HTTP header value.
    fn auth_headers(&self, secret: Option<&SecretString>) -> Result<HeaderMap, String> {
        let mut h = HeaderMap::new();
        if let Some(s) = secret {
            h.insert(reqwest::header::AUTHORIZATION, sensitive(&format!("Bearer {}", s.expose_secret()))?);
        }
        Ok(h)
    }

    /// The JSON body of a streamed model request; `base` is the normalized base URL (some
    /// wires word a field differently for the provider's own host).
    fn body(&self, request: &Request, base: &url::Url) -> serde_json::Value;

    /// A fresh decoder for one answer.
    fn decoder(&self) -> Box<dyn Decoder>;

    /// The listing's model ids (any order) and the cursor of the next page, if any.
    ///
    /// # Errors
    /// A text when the body is not the listing's shape.
    fn parse_models(&self, body: &serde_json::Value) -> Result<(Vec<String>, Option<String>), String> {
        let data = body["data"].as_array().ok_or("no `data` array")?;
        Ok((data.iter().filter_map(|m| m["id"].as_str()).map(str::to_owned).collect(), None))
    }

    /// Query parameters of the listing's page after `cursor` (first page: `None`).
    fn models_query(&self, cursor: Option<&str>) -> Vec<(&'static str, String)> {
        let _ = cursor;
        Vec::new()
    }
}

/// A header value marked sensitive (kept out of `Debug` output).
pub(crate) fn sensitive(v: &str) -> Result<HeaderValue, String> {
    let mut v = HeaderValue::from_str(v).map_err(|_| "the key is not a valid HTTP header value".to_owned())?;
    v.set_sensitive(true);
    Ok(v)
}

/// A header pair for the header map.
pub(crate) fn header(name: &'static str, value: &'static str) -> (HeaderName, HeaderValue) {
    (HeaderName::from_static(name), HeaderValue::from_static(value))
}

/// Parses a frame's data as JSON.
pub(crate) fn json(data: &[u8]) -> Result<serde_json::Value, DecodeError> {
    serde_json::from_slice(data).map_err(|e| {
        let shown: String = String::from_utf8_lossy(data).chars().take(80).collect();
        DecodeError::Garbage(format!("a stream event is not JSON ({e}): {shown:?}"))
    })
}

/// A tool call's arguments from the wire's JSON text: the object; `{}` for an empty text;
/// the text itself as a JSON string when it is not JSON (the tool's validation then fails and
/// that error goes back to the model).
pub(crate) fn arguments(text: &str) -> serde_json::Value {
    if text.trim().is_empty() {
        return serde_json::json!({});
    }
    serde_json::from_str(text).unwrap_or_else(|_| serde_json::Value::String(text.to_owned()))
}

/// The request's tools in the Chat Completions `tools` shape (`{"type": "function", "function":
/// {name, description, parameters}}`), which Ollama's `/api/chat` takes too.
pub(crate) fn function_tools(request: &Request) -> serde_json::Value {
    serde_json::Value::Array(
        request
            .tools
            .iter()
            .map(|t| {
                serde_json::json!({"type": "function", "function": {"name": t.name, "description": t.description,
                    "parameters": t.input_schema}})
            })
            .collect(),
    )
}

/// The text of a tool result for wires without an error flag: failed calls are prefixed so
/// the model knows.
pub(crate) fn result_text(content: &str, is_error: bool) -> String {
    if is_error { format!("[tool error] {content}") } else { content.to_owned() }
}

/// The name of the tool the call `id` asked for, from the latest assistant message holding it.
pub(crate) fn tool_name_of<'a>(request: &'a Request, id: &str) -> Option<&'a str> {
    request.messages.iter().rev().flat_map(|m| m.content.iter()).find_map(|b| match b {
        Block::ToolUse { id: i, name, .. } if i == id => Some(name.as_str()),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_tolerate_empty_and_broken_json() {
        assert_eq!(arguments(""), serde_json::json!({}));
        assert_eq!(arguments(r#"{"q":"x"}"#), serde_json::json!({"q": "x"}));
        assert_eq!(arguments("{oops"), serde_json::json!("{oops"));
        assert!(matches!(json(b"nope"), Err(DecodeError::Garbage(_))));
        assert_eq!(result_text("boom", true), "[tool error] boom");
    }
}
