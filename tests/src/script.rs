//! The prompt convention of the scripted fake model APIs ([`crate::anthropic::FakeAnthropic::scripted`],
//! [`crate::openai::FakeOpenAi`]): directives in the user's latest message choose the answer, so
//! a test drives a real agent CLI to any outcome by what it types.
//!
//! | directive | the fake answers |
//! |---|---|
//! | none | streamed text `Hello from the fake model (model=M).`, one delta per word |
//! | `SAY[some words]` | `some words`, streamed one delta per word |
//! | `TOOL[name]`, `TOOL[name {"json":"input"}]` | a call of the tool `name` (exactly, else the one offered tool whose name ends with `name`, e.g. `coffer__search_tools` for Codex's or Claude Code's prefixed MCP name) with that input (default `{}`); once the request carries the call's result, the text `Tool result: <result>` |
//! | `ERROR[401]`, `ERROR[500]` (any status) | that HTTP status with the API's JSON error body (`fake error N`) |
//! | `SLOW[ms]` | the same answer with `ms` milliseconds before each delta |
//! | `HANG` | the stream's first event, then nothing, the connection held open until the client goes |
//! | `MALFORMED` | status 200, `text/event-stream`, and lines that are not server-sent events of the API |
//!
//! Directives combine (`SLOW[200] SAY[a b c]`, `SLOW[50] TOOL[x]`). Every request is recorded.
use std::time::Duration;

/// The text of the model's answer when no `SAY[…]` is given.
pub fn default_text(model: &str) -> String {
    format!("Hello from the fake model (model={model}).")
}

/// What a prompt asks of the fake.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Script {
    /// `SAY[…]`.
    pub say: Option<String>,
    /// `TOOL[name {input}]`: the name and the input (JSON text; `{}` when absent).
    pub tool: Option<(String, String)>,
    /// `ERROR[status]`.
    pub error: Option<u16>,
    /// `SLOW[ms]`.
    pub slow: Option<Duration>,
    /// `HANG`.
    pub hang: bool,
    /// `MALFORMED`.
    pub malformed: bool,
}

impl Script {
    /// Reads the directives of `prompt` (unknown text is ignored).
    pub fn parse(prompt: &str) -> Self {
        let arg = |name: &str| -> Option<String> {
            let start = prompt.find(&format!("{name}["))? + name.len() + 1;
            let end = prompt[start..].rfind(']').map(|e| start + e)?;
            // The argument ends at the first `]` that closes it; a JSON input may hold brackets,
            // so take the shortest prefix that balances.
            let body = &prompt[start..end];
            let (mut depth, mut in_string, mut escaped) = (0i32, false, false);
            for (i, c) in body.char_indices() {
                match c {
                    _ if escaped => escaped = false,
                    '\\' if in_string => escaped = true,
                    '"' => in_string = !in_string,
                    _ if in_string => {}
                    '[' | '{' => depth += 1,
                    '}' => depth -= 1,
                    ']' if depth == 0 => return Some(body[..i].to_owned()),
                    ']' => depth -= 1,
                    _ => {}
                }
            }
            Some(body.to_owned())
        };
        let tool = arg("TOOL").map(|t| {
            let t = t.trim();
            match t.find(char::is_whitespace) {
                Some(i) => (t[..i].to_owned(), t[i..].trim().to_owned()),
                None => (t.to_owned(), "{}".to_owned()),
            }
        });
        Self {
            say: arg("SAY"),
            tool,
            error: arg("ERROR").and_then(|s| s.trim().parse().ok()),
            slow: arg("SLOW").and_then(|s| s.trim().parse().ok()).map(Duration::from_millis),
            hang: prompt.contains("HANG"),
            malformed: prompt.contains("MALFORMED"),
        }
    }

    /// The tool input as JSON (`{}` when it does not parse).
    pub fn tool_input(&self) -> serde_json::Value {
        self.tool
            .as_ref()
            .and_then(|(_, input)| serde_json::from_str(input).ok())
            .unwrap_or_else(|| serde_json::json!({}))
    }
}

/// `text` cut into stream deltas: one per word, each with the whitespace after it.
pub fn deltas(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for c in text.chars() {
        if c.is_whitespace() && !cur.trim().is_empty() {
            cur.push(c);
            out.push(std::mem::take(&mut cur));
        } else {
            cur.push(c);
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// The offered tool `wanted` names: exactly, else the only one ending with it.
pub fn resolve_tool<'a>(wanted: &str, offered: &[&'a str]) -> Option<&'a str> {
    if let Some(t) = offered.iter().find(|t| **t == wanted) {
        return Some(t);
    }
    let mut ends = offered.iter().filter(|t| t.ends_with(wanted));
    match (ends.next(), ends.next()) {
        (Some(t), None) => Some(t),
        _ => None,
    }
}

/// A `text/event-stream` response of `events` (`event:` name and JSON `data:`), written by a
/// task of its own: with `slow`, that long before each event after the first (a model producing
/// tokens); with `hang`, the stream then stays open, sending nothing, until the client goes.
pub fn stream_sse(
    events: Vec<(&str, serde_json::Value)>,
    slow: Option<Duration>,
    hang: bool,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let frames: Vec<String> = events.into_iter().map(|(e, d)| format!("event: {e}\ndata: {d}\n\n")).collect();
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<String, std::io::Error>>(16);
    tokio::spawn(async move {
        for (i, frame) in frames.into_iter().enumerate() {
            if let (Some(d), true) = (slow, i > 0) {
                // A simulated model's pace, not a wait for readiness.
                tokio::time::sleep(d).await;
            }
            if tx.send(Ok(frame)).await.is_err() {
                return;
            }
        }
        if hang {
            tx.closed().await;
        }
    });
    let body = axum::body::Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
    ([("content-type", "text/event-stream"), ("cache-control", "no-cache")], body).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directives() {
        let s = Script::parse(r#"please SLOW[20] TOOL[coffer__search_tools {"query": "a]b", "n": [1]}] now"#);
        assert_eq!(s.slow, Some(Duration::from_millis(20)));
        assert_eq!(s.tool.as_ref().unwrap().0, "coffer__search_tools");
        assert_eq!(s.tool_input(), serde_json::json!({"query": "a]b", "n": [1]}));
        assert_eq!(Script::parse("ERROR[401]").error, Some(401));
        assert_eq!(Script::parse("SAY[a b]").say.as_deref(), Some("a b"));
        assert_eq!(Script::parse("SAY[a] and [b]").say.as_deref(), Some("a"));
        assert!(Script::parse("x HANG").hang && !Script::parse("x").hang);
        assert_eq!(Script::parse("TOOL[echo]").tool_input(), serde_json::json!({}));
        assert_eq!(deltas("one two  three"), ["one ", "two  ", "three"]);
        assert_eq!(
            resolve_tool("search_tools", &["a", "mcp__coffer__coffer__search_tools"]),
            Some("mcp__coffer__coffer__search_tools")
        );
        assert_eq!(resolve_tool("x", &["ax", "bx"]), None);
    }
}
