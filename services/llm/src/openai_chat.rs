//! The OpenAI Chat Completions wire (and the servers that copy it: vLLM, LM Studio, llama.cpp,
//! Ollama's `/v1`), following OpenAI's API reference: "Create chat completion"
//! (<https://platform.openai.com/docs/api-reference/chat/create>), "The chat completion chunk
//! object" (<https://platform.openai.com/docs/api-reference/chat-streaming>), the function
//! calling guide (<https://platform.openai.com/docs/guides/function-calling>) and "List models"
//! (<https://platform.openai.com/docs/api-reference/models/list>).
//!
//! Request: `POST /v1/chat/completions` (bearer), body `{model, messages, tools?: [{type:
//! "function", function: {name, description, parameters}}], max_completion_tokens (OpenAI's
//! own host) or max_tokens (other servers, which do not all know the newer name), stream:
//! true, stream_options: {include_usage: true}}`. Messages: `system`, `user` (text), `assistant`
//! (`content`, `tool_calls: [{id, type: "function", function: {name, arguments}}]`) and one
//! `tool` message per result (`tool_call_id`, `content`).
//!
//! Stream: `chat.completion.chunk` objects, `choices[0].delta.content` pieces and
//! `delta.tool_calls[]` pieces merged by `index` (the first piece carries `id` and
//! `function.name`, the rest `function.arguments` text), `finish_reason` (`stop`,
//! `tool_calls`, `length`), a last chunk with `usage` (`prompt_tokens`,
//! `completion_tokens`), then `data: [DONE]`. A body that ends after a `finish_reason` but
//! without `[DONE]` is accepted (some compatible servers omit it); before one it is cut.
//!
//! Models: `GET /v1/models` → `{data: [{id}]}`.
use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::error::Detail;
use crate::wire::{Adapter, DecodeError, Decoder, Frame, arguments, function_tools, json, result_text};
use crate::{Block, Request, Role, StopReason, StreamEvent, Usage};

/// The OpenAI Chat Completions adapter.
pub(crate) struct ChatCompletions;

impl Adapter for ChatCompletions {
    fn chat_path(&self) -> &'static str {
        "/v1/chat/completions"
    }

    fn models_path(&self) -> &'static str {
        "/v1/models"
    }

    fn terminal(&self) -> &'static str {
        "[DONE]"
    }

    fn body(&self, request: &Request, base: &url::Url) -> Value {
        let mut messages: Vec<Value> = Vec::new();
        if let Some(system) = request.system.as_deref().filter(|s| !s.is_empty()) {
            messages.push(json!({"role": "system", "content": system}));
        }
        for m in &request.messages {
            match m.role {
                Role::Assistant => {
                    let text: String = m
                        .content
                        .iter()
                        .filter_map(|b| match b {
                            Block::Text(t) => Some(t.as_str()),
                            _ => None,
                        })
                        .collect();
                    let calls: Vec<Value> = m
                        .content
                        .iter()
                        .filter_map(|b| match b {
                            Block::ToolUse { id, name, input } => Some(json!({"id": id, "type": "function",
                                "function": {"name": name, "arguments": input.to_string()}})),
                            _ => None,
                        })
                        .collect();
                    let mut msg = json!({"role": "assistant", "content": if text.is_empty() { Value::Null } else { json!(text) }});
                    if !calls.is_empty() {
                        msg["tool_calls"] = json!(calls);
                    }
                    messages.push(msg);
                }
                Role::User => {
                    let mut text = String::new();
                    for b in &m.content {
                        match b {
                            Block::Text(t) => text.push_str(t),
                            Block::ToolResult { id, content, is_error } => {
                                messages.push(json!({"role": "tool", "tool_call_id": id, "content": result_text(content, *is_error)}));
                            }
                            Block::ToolUse { .. } => {}
                        }
                    }
                    if !text.is_empty() {
                        messages.push(json!({"role": "user", "content": text}));
                    }
                }
            }
        }
        let mut body = json!({
            "model": request.model,
            "messages": messages,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        let limit = if base.host_str() == Some("api.openai.com") { "max_completion_tokens" } else { "max_tokens" };
        body[limit] = json!(request.max_tokens.max(1));
        if !request.tools.is_empty() {
            body["tools"] = function_tools(request);
        }
        body
    }

    fn decoder(&self) -> Box<dyn Decoder> {
        Box::new(ChatDecoder::default())
    }
}

#[derive(Default)]
struct Call {
    id: String,
    name: String,
    arguments: String,
}

#[derive(Default)]
struct ChatDecoder {
    /// By the call's `index`.
    calls: BTreeMap<u64, Call>,
    finish: Option<String>,
    usage: Usage,
    /// The tool calls were emitted (at the finish reason).
    flushed: bool,
}

impl ChatDecoder {
    fn flush_calls(&mut self, out: &mut Vec<StreamEvent>) -> Result<(), DecodeError> {
        if self.flushed {
            return Ok(());
        }
        self.flushed = true;
        for (index, c) in std::mem::take(&mut self.calls) {
            if c.name.is_empty() {
                return Err(DecodeError::Garbage(format!("tool call {index} has no function name")));
            }
            let id = if c.id.is_empty() { format!("call_{index}") } else { c.id };
            out.push(StreamEvent::ToolUse { id, name: c.name, input: arguments(&c.arguments) });
        }
        Ok(())
    }

    fn done(&mut self, out: &mut Vec<StreamEvent>) -> Result<(), DecodeError> {
        let called = !self.calls.is_empty() || out.iter().any(|e| matches!(e, StreamEvent::ToolUse { .. }));
        self.flush_calls(out)?;
        let stop = match self.finish.as_deref() {
            Some("tool_calls" | "function_call") => StopReason::ToolUse,
            Some("stop") if called => StopReason::ToolUse,
            Some("stop") => StopReason::EndTurn,
            Some("length") => StopReason::MaxTokens,
            Some(other) => StopReason::Other(other.to_owned()),
            None => StopReason::Other("none".to_owned()),
        };
        out.push(StreamEvent::Done { stop, usage: self.usage });
        Ok(())
    }
}

impl Decoder for ChatDecoder {
    fn feed(&mut self, frame: Frame<'_>, out: &mut Vec<StreamEvent>) -> Result<(), DecodeError> {
        let Frame::Sse { data, .. } = frame else {
            return Err(DecodeError::Garbage("a line where server-sent events were expected".into()));
        };
        if data.trim_ascii() == b"[DONE]" {
            return self.done(out);
        }
        let v = json(data)?;
        if !v["error"].is_null() {
            return Err(DecodeError::Provider(Detail::from_body(&v).unwrap_or_default()));
        }
        if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
            self.usage = Usage {
                input_tokens: u["prompt_tokens"].as_u64().unwrap_or(0),
                output_tokens: u["completion_tokens"].as_u64().unwrap_or(0),
            };
        }
        let Some(choice) = v["choices"].as_array().and_then(|c| c.first()) else {
            return Ok(()); // the usage chunk has no choices
        };
        let delta = &choice["delta"];
        if let Some(t) = delta["content"].as_str().filter(|t| !t.is_empty()) {
            out.push(StreamEvent::TextDelta(t.to_owned()));
        }
        for piece in delta["tool_calls"].as_array().into_iter().flatten() {
            let index = piece["index"].as_u64().unwrap_or(0);
            let call = self.calls.entry(index).or_default();
            if let Some(id) = piece["id"].as_str().filter(|s| !s.is_empty()) {
                id.clone_into(&mut call.id);
            }
            if let Some(name) = piece["function"]["name"].as_str().filter(|s| !s.is_empty()) {
                name.clone_into(&mut call.name);
            }
            match &piece["function"]["arguments"] {
                Value::String(a) => call.arguments.push_str(a),
                Value::Object(_) => call.arguments = piece["function"]["arguments"].to_string(),
                _ => {}
            }
        }
        if let Some(f) = choice["finish_reason"].as_str() {
            self.finish = Some(f.to_owned());
            self.flush_calls(out)?;
        }
        Ok(())
    }

    fn at_eof(&mut self, out: &mut Vec<StreamEvent>) -> bool {
        self.finish.is_some() && self.done(out).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Message, ToolSpec};

    #[test]
    fn request_shape() {
        let request = Request {
            model: "m".into(),
            system: Some("sys".into()),
            messages: vec![
                Message { role: Role::User, content: vec![Block::Text("hi".into())] },
                Message {
                    role: Role::Assistant,
                    content: vec![Block::ToolUse {
                        id: "call_1".into(),
                        name: "search".into(),
                        input: json!({"q": 1}),
                    }],
                },
                Message {
                    role: Role::User,
                    content: vec![Block::ToolResult { id: "call_1".into(), content: "bad".into(), is_error: true }],
                },
            ],
            tools: vec![ToolSpec {
                name: "search".into(),
                description: "d".into(),
                input_schema: json!({"type": "object"}),
            }],
            max_tokens: 5,
        };
        let local = url::Url::parse("http://127.0.0.1:8000").unwrap_or_else(|e| panic!("{e}"));
        let body = ChatCompletions.body(&request, &local);
        assert_eq!(
            body,
            json!({
                "model": "m", "stream": true, "stream_options": {"include_usage": true}, "max_tokens": 5,
                "messages": [
                    {"role": "system", "content": "sys"},
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "search", "arguments": "{\"q\":1}"}}]},
                    {"role": "tool", "tool_call_id": "call_1", "content": "[tool error] bad"},
                ],
                "tools": [{"type": "function", "function": {"name": "search", "description": "d", "parameters": {"type": "object"}}}],
            })
        );
        let openai = url::Url::parse("https://api.openai.com").unwrap_or_else(|e| panic!("{e}"));
        let body = ChatCompletions.body(&request, &openai);
        assert_eq!((body["max_completion_tokens"].as_u64(), body.get("max_tokens")), (Some(5), None));
    }

    #[test]
    fn merges_tool_call_pieces_by_index() {
        let mut d = ChatDecoder::default();
        let mut out = Vec::new();
        for chunk in [
            json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hm"}}]}),
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_a", "type": "function", "function": {"name": "one", "arguments": ""}}]}}]}),
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 1, "id": "call_b", "type": "function", "function": {"name": "two", "arguments": "{}"}}]}}]}),
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{\"a\":"}}]}}]}),
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}}]}),
            json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}),
            json!({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 3}}),
        ] {
            let data = chunk.to_string();
            d.feed(Frame::Sse { event: "", data: data.as_bytes() }, &mut out).unwrap_or_else(|e| panic!("{e:?}"));
        }
        d.feed(Frame::Sse { event: "", data: b"[DONE]" }, &mut out).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(
            out,
            vec![
                StreamEvent::TextDelta("Hm".into()),
                StreamEvent::ToolUse { id: "call_a".into(), name: "one".into(), input: json!({"a": 1}) },
                StreamEvent::ToolUse { id: "call_b".into(), name: "two".into(), input: json!({}) },
                StreamEvent::Done { stop: StopReason::ToolUse, usage: Usage { input_tokens: 9, output_tokens: 3 } },
            ]
        );
        let mut cut = ChatDecoder::default();
        assert!(!cut.at_eof(&mut Vec::new()));
    }
}
