//! Coffer's clients for LLM providers (seeds: spec 011, ADR-024): one [`Client`] over one
//! [`Endpoint`], speaking one [`Wire`]; one request/response model ([`Request`], [`Message`],
//! [`Block`], [`StreamEvent`]) whatever the wire; one error classification ([`LlmError`],
//! [`ErrorKind`]) that names the provider and the cause and never carries a secret.
//!
//! Wires and the documents they follow:
//! - [`Wire::Anthropic`]: Anthropic Messages, `POST {base}/v1/messages` (`x-api-key`,
//!   `anthropic-version: 2023-06-01`), streaming server-sent events `message_start`,
//!   `content_block_start|delta|stop` (`text_delta`, `input_json_delta`), `message_delta`,
//!   `message_stop`, `error`; models `GET {base}/v1/models`.
//! - [`Wire::OpenAiResponses`]: OpenAI Responses, `POST {base}/v1/responses` (bearer),
//!   streaming `response.output_text.delta`, `response.output_item.added|done`
//!   (`function_call`), `response.function_call_arguments.delta|done`, `response.completed`
//!   (with `usage`), `response.failed`, `error`; models `GET {base}/v1/models`.
//! - [`Wire::OpenAiChat`]: OpenAI Chat Completions and compatible servers,
//!   `POST {base}/v1/chat/completions` (bearer), streaming `chat.completion.chunk` deltas
//!   (`content`, `tool_calls[i].function.arguments` in pieces), `finish_reason`, `usage` with
//!   `stream_options.include_usage`, then `data: [DONE]`; models `GET {base}/v1/models`.
//! - [`Wire::Ollama`]: Ollama, `POST {base}/api/chat` streaming newline-delimited JSON objects
//!   (`message.content`, `message.tool_calls`, `done`, `prompt_eval_count`, `eval_count`);
//!   models `GET {base}/api/tags`.
//!
//! Adding a wire is one adapter module implementing the private translation trait plus one
//! [`Wire`] variant; the HTTP, streaming framing, timeouts and error classification are shared.
//!
//! `Client::complete` folds `Client::stream`; `Client::models` sorts and deduplicates; `Client::test`
//! sends `max_tokens` 1. Tests: unit tests of each adapter's request JSON and stream folding; e2e
//! `llm_wire::*` on the fake providers of `tests/src/fake_llm.rs` (one per wire: scripted replies,
//! a rule callback over a wire-neutral view of the request, faults, key check by hash).
use std::sync::Arc;
use std::time::Duration;

use secrecy::SecretString;

mod anthropic;
mod error;
mod http;
mod ollama;
mod openai_chat;
mod openai_responses;
mod wire;

/// The wire protocol an endpoint speaks (the store's `LlmWire`; REST spells them `anthropic`,
/// `openai-responses`, `openai-chat`, `ollama`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Wire {
    /// Anthropic Messages.
    Anthropic,
    /// OpenAI Responses.
    OpenAiResponses,
    /// OpenAI Chat Completions (and compatible servers: vLLM, LM Studio, llama.cpp, …).
    OpenAiChat,
    /// Ollama's native API.
    Ollama,
}

impl Wire {
    /// Every wire, in the order the REST words are documented.
    pub const ALL: [Wire; 4] = [Wire::Anthropic, Wire::OpenAiResponses, Wire::OpenAiChat, Wire::Ollama];

    /// The wire a REST word names (`anthropic`, `openai-responses`, `openai-chat`, `ollama`);
    /// `None` for any other text.
    pub fn parse(word: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|w| w.as_str() == word)
    }

    /// The REST word (`anthropic`, `openai-responses`, `openai-chat`, `ollama`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Wire::Anthropic => "anthropic",
            Wire::OpenAiResponses => "openai-responses",
            Wire::OpenAiChat => "openai-chat",
            Wire::Ollama => "ollama",
        }
    }

    /// The provider's public base URL, used when a connection leaves `base_url` empty; `None`
    /// for Ollama (always local, its URL is required).
    pub const fn default_base_url(self) -> Option<&'static str> {
        match self {
            Wire::Anthropic => Some("https://api.anthropic.com"),
            Wire::OpenAiResponses | Wire::OpenAiChat => Some("https://api.openai.com"),
            Wire::Ollama => None,
        }
    }
}

/// Where and how to reach one provider.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// The wire.
    pub wire: Wire,
    /// Base URL without the API path (`https://api.anthropic.com`, `http://127.0.0.1:11434`);
    /// a trailing `/v1` is accepted and not doubled.
    pub base_url: url::Url,
    /// The API key (Anthropic `x-api-key`, OpenAI bearer token; Ollama: bearer when set).
    pub secret: Option<SecretString>,
    /// Until the response's headers (and for a non-streaming request its body) arrive.
    pub request_timeout: Duration,
    /// Longest silence between two events of a stream before it counts as stalled.
    pub stall_timeout: Duration,
}

/// Who said a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The person, or tool results going back to the model.
    User,
    /// The model.
    Assistant,
}

/// One piece of a message's content.
#[derive(Debug, Clone, PartialEq)]
pub enum Block {
    /// Text.
    Text(String),
    /// The model asks for a tool call.
    ToolUse {
        /// The wire's call id (Anthropic `toolu_…`, OpenAI `call_…`; Ollama has none, the
        /// adapter makes one up).
        id: String,
        /// The tool's name as it was offered.
        name: String,
        /// The arguments, a JSON object.
        input: serde_json::Value,
    },
    /// A tool call's result going back to the model.
    ToolResult {
        /// The call it answers.
        id: String,
        /// The result as text.
        content: String,
        /// Whether the call failed.
        is_error: bool,
    },
}

/// One message of a conversation with the model.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    /// Who.
    pub role: Role,
    /// What, in order.
    pub content: Vec<Block>,
}

/// A tool the model may call.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    /// Name (what the model calls).
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// JSON Schema of its arguments (an object schema).
    pub input_schema: serde_json::Value,
}

/// One model request.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The model id.
    pub model: String,
    /// System prompt.
    pub system: Option<String>,
    /// The conversation so far (first one from the user).
    pub messages: Vec<Message>,
    /// Tools offered.
    pub tools: Vec<ToolSpec>,
    /// Upper bound on the answer's tokens.
    pub max_tokens: u32,
}

/// Why the model stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReason {
    /// It finished its answer.
    EndTurn,
    /// It asks for the tool calls it made.
    ToolUse,
    /// It reached `max_tokens`.
    MaxTokens,
    /// Anything else the wire said, verbatim.
    Other(String),
}

/// Token counts of one request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Input (prompt) tokens.
    pub input_tokens: u64,
    /// Output (completion) tokens.
    pub output_tokens: u64,
}

/// One event of a streamed answer, in order: any number of `TextDelta` and `ToolUse`
/// (a tool call is emitted once, complete, when its arguments are whole), then exactly one
/// `Done`.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamEvent {
    /// A piece of text.
    TextDelta(String),
    /// A complete tool call.
    ToolUse {
        /// Call id.
        id: String,
        /// Tool name.
        name: String,
        /// Arguments (a JSON object; `{}` when the model sent none).
        input: serde_json::Value,
    },
    /// The end.
    Done {
        /// Why.
        stop: StopReason,
        /// Token counts (zero where the wire did not say).
        usage: Usage,
    },
}

/// A whole answer ([`Client::complete`]: the stream folded).
#[derive(Debug, Clone, PartialEq)]
pub struct Response {
    /// Text and tool calls, in order (adjacent text pieces joined).
    pub content: Vec<Block>,
    /// Why the model stopped.
    pub stop: StopReason,
    /// Token counts.
    pub usage: Usage,
}

/// What went wrong, for a person to act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// 401/403: bad or missing key.
    Auth,
    /// 404: unknown model or wrong base URL.
    NotFound,
    /// 429 ([`LlmError::retry_after`] when the provider said).
    RateLimited,
    /// 5xx, or a stream's `error` event of the server's making (`overloaded_error`).
    Server,
    /// Connection refused, DNS.
    Unreachable,
    /// No response within [`Endpoint::request_timeout`], or a stream silent for
    /// [`Endpoint::stall_timeout`].
    Timeout,
    /// Certificate or handshake.
    Tls,
    /// Not the wire's documented shape: garbage, a stream cut before its end, other 4xx.
    BadResponse,
}

/// A provider request's failure. `Display` names the provider (wire and base URL) and the
/// cause: "anthropic at http://127.0.0.1:4000 refused the key (401 authentication_error:
/// invalid x-api-key)". Never contains the secret.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct LlmError {
    /// The class.
    pub kind: ErrorKind,
    /// The whole human-readable message.
    pub message: String,
    /// The HTTP status, when there was an answer.
    pub http_status: Option<u16>,
    /// When to try again, from `retry-after-ms` or `retry-after` (seconds or HTTP date): a
    /// 429's, or an overloaded server's (5xx) when it sent one.
    pub retry_after: Option<Duration>,
}

/// A streamed answer: [`StreamEvent`]s in order, ending with `Done` or one error.
pub type EventStream = std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<StreamEvent, LlmError>> + Send>>;

/// A client for one endpoint; cheap to clone (one connection pool).
#[derive(Clone)]
pub struct Client {
    endpoint: Endpoint,
    inner: Arc<http::Inner>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("endpoint", &self.endpoint).finish_non_exhaustive()
    }
}

/// The adapter of a wire.
fn adapter(wire: Wire) -> &'static dyn wire::Adapter {
    match wire {
        Wire::Anthropic => &anthropic::Anthropic,
        Wire::OpenAiResponses => &openai_responses::Responses,
        Wire::OpenAiChat => &openai_chat::ChatCompletions,
        Wire::Ollama => &ollama::Ollama,
    }
}

/// The user message [`Client::test`] sends.
pub const TEST_PROMPT: &str = "Reply with OK.";

impl Client {
    /// A client for `endpoint` (no request is made). A zero `request_timeout` or
    /// `stall_timeout` means the defaults, 60 s and 30 s.
    pub fn new(endpoint: Endpoint) -> Self {
        let inner = Arc::new(http::Inner::new(&endpoint, adapter(endpoint.wire)));
        Self { endpoint, inner }
    }

    /// The endpoint.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// How errors name this provider: `anthropic at https://api.anthropic.com`.
    pub fn provider(&self) -> &str {
        self.inner.namer.provider()
    }

    /// Sends `request` streaming and returns its events.
    ///
    /// # Errors
    /// [`LlmError`] when the request fails before the stream starts (status, connection,
    /// timeout); later failures are the stream's last item.
    pub async fn stream(&self, request: &Request) -> Result<EventStream, LlmError> {
        self.inner.stream(request).await
    }

    /// Sends `request` and waits for the whole answer (the stream folded).
    ///
    /// # Errors
    /// As [`Client::stream`], and the stream's error.
    pub async fn complete(&self, request: &Request) -> Result<Response, LlmError> {
        use futures_util::StreamExt;
        let mut stream = self.stream(request).await?;
        let mut content: Vec<Block> = Vec::new();
        while let Some(event) = stream.next().await {
            match event? {
                StreamEvent::TextDelta(t) => match content.last_mut() {
                    Some(Block::Text(prev)) => prev.push_str(&t),
                    _ => content.push(Block::Text(t)),
                },
                StreamEvent::ToolUse { id, name, input } => content.push(Block::ToolUse { id, name, input }),
                StreamEvent::Done { stop, usage } => return Ok(Response { content, stop, usage }),
            }
        }
        // The stream always ends with `Done` or an error; this is a defect guard.
        Err(LlmError {
            kind: ErrorKind::BadResponse,
            message: format!("{} ended the answer without its end", self.provider()),
            http_status: None,
            retry_after: None,
        })
    }

    /// The provider's model ids, sorted and deduplicated.
    ///
    /// # Errors
    /// [`LlmError`]; an endpoint that has no listing (404 on the models path) is
    /// [`ErrorKind::NotFound`].
    pub async fn models(&self) -> Result<Vec<String>, LlmError> {
        let mut ids = self.inner.models().await?;
        ids.sort();
        ids.dedup();
        Ok(ids)
    }

    /// One minimal request (`max_tokens` 1 — 16 on the Responses wire, its minimum — one
    /// short user message, [`TEST_PROMPT`]) naming `model`; its wall time on success (an
    /// answer cut by `max_tokens` is a success).
    ///
    /// # Errors
    /// [`LlmError`]: an unknown model is [`ErrorKind::NotFound`].
    pub async fn test(&self, model: &str) -> Result<Duration, LlmError> {
        let started = std::time::Instant::now();
        let request = Request {
            model: model.to_owned(),
            system: None,
            messages: vec![Message { role: Role::User, content: vec![Block::Text(TEST_PROMPT.to_owned())] }],
            tools: Vec::new(),
            max_tokens: 1,
        };
        self.complete(&request).await?;
        Ok(started.elapsed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_words_round_trip() {
        for w in Wire::ALL {
            assert_eq!(Wire::parse(w.as_str()), Some(w));
        }
        assert_eq!(Wire::parse("openai"), None);
        assert_eq!(Wire::parse("Anthropic"), None);
        assert_eq!(Wire::Ollama.default_base_url(), None);
    }
}
