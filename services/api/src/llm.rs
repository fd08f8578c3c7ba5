//! Bodies of `/v1/llm/connections…`: the person's LLM connections and their probes (`test`,
//! `models`). A key is write-only: `api_key` exists only on the request types, which have no
//! `Debug`; a connection says `credential_set` (whether its credential has a value), never a
//! value.
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The API a connection speaks; its REST word (`openai` is the CLI's alias of
/// `openai-responses`, not a REST word). Named here for the document; the bodies carry the word
/// as a string, so that an unknown one gets the edge's message listing the known ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
#[schemars(rename = "LlmWire")]
pub enum Wire {
    /// The Messages API.
    Anthropic,
    /// The Responses API.
    OpenaiResponses,
    /// Chat Completions (and compatible servers: vLLM, llama.cpp, LM Studio).
    OpenaiChat,
    /// Ollama's `/api/chat`.
    Ollama,
}

/// A connection: where Coffer reaches a model provider, with which credential and model. Never
/// a secret.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct LlmConnection {
    /// `^[a-z0-9][a-z0-9-]{0,31}$`.
    pub name: String,
    /// One of the [`Wire`] words.
    #[schemars(with = "Wire")]
    pub wire: String,
    /// null: the provider's public API (https://api.anthropic.com, https://api.openai.com).
    pub base_url: Option<String>,
    /// The credential holding the key; null: none.
    pub credential_ref: Option<String>,
    /// Whether that credential has a value.
    pub credential_set: bool,
    pub model: String,
    /// The model for quick background work; null: the model.
    pub fast_model: Option<String>,
    /// The connection `coffer__ask` runs on (at most one).
    pub internal_default: bool,
    /// Bumped by every write; the ETag.
    pub version: i64,
    #[schemars(extend("format" = "date-time"))]
    pub created_at: String,
    #[schemars(extend("format" = "date-time"))]
    pub updated_at: String,
}

/// `POST /v1/llm/connections`.
// No `Debug`: it may hold a key.
#[derive(Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LlmConnectionCreate {
    /// `^[a-z0-9][a-z0-9-]{0,31}$`; not `test` or `models`.
    pub name: String,
    /// One of the [`Wire`] words.
    #[schemars(with = "Wire")]
    pub wire: String,
    /// Absolute http(s) URL, no query or fragment, at most 2048 bytes; absent: the provider's
    /// public API (required for `ollama`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    /// The credential holding (or, with `api_key`, to hold) the key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential_ref: Option<String>,
    /// 1-65536 bytes, no control characters; stored as the value of `credential_ref` (or of
    /// `llm-<name>` when none is named), never shown back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("writeOnly" = true))]
    pub api_key: Option<String>,
    /// 1-256 bytes, no control characters.
    pub model: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fast_model: Option<String>,
    /// Make it the internal default (the previous one loses the flag).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub internal_default: bool,
}

/// `PATCH /v1/llm/connections/{name}`: absent fields stay; `base_url`, `credential_ref` and
/// `fast_model` set to null clear them.
// No `Debug`: it may hold a key.
#[derive(Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LlmConnectionPatch {
    /// Only the current name (no rename).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// One of the [`Wire`] words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<Wire>")]
    pub wire: Option<String>,
    /// null: the provider's public API.
    #[serde(default, deserialize_with = "crate::body::present", skip_serializing_if = "Option::is_none")]
    pub base_url: Option<Option<String>>,
    /// null: none.
    #[serde(default, deserialize_with = "crate::body::present", skip_serializing_if = "Option::is_none")]
    pub credential_ref: Option<Option<String>>,
    /// Replaces the key's value (of `credential_ref`, or `llm-<name>` when none is named); alone
    /// it leaves the record's version as it is. Never shown back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("writeOnly" = true))]
    pub api_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// null: the model.
    #[serde(default, deserialize_with = "crate::body::present", skip_serializing_if = "Option::is_none")]
    pub fast_model: Option<Option<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub internal_default: Option<bool>,
}

impl LlmConnectionPatch {
    /// Whether it changes nothing.
    pub fn is_empty(&self) -> bool {
        self.name.is_none()
            && self.wire.is_none()
            && self.base_url.is_none()
            && self.credential_ref.is_none()
            && self.api_key.is_none()
            && self.model.is_none()
            && self.fast_model.is_none()
            && self.internal_default.is_none()
    }
}

/// `POST /v1/llm/connections/test` and `…/models`: an unsaved connection, with its key in `api_key`
/// if it needs one. `credential_ref` is refused (`details.reason` `stored_credential_in_draft`): a
/// stored key goes only to the base URL of the connection it was saved with.
// No `Debug`: it may hold a key.
#[derive(Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LlmDraft {
    /// Default `draft`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// One of the [`Wire`] words.
    #[schemars(with = "Wire")]
    pub wire: String,
    /// Required for `ollama`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    /// Refused when not empty (see above).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential_ref: Option<String>,
    /// Used for this probe only, never stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("writeOnly" = true))]
    pub api_key: Option<String>,
    /// Required for a test.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fast_model: Option<String>,
}

/// What went wrong with a provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
#[schemars(rename = "LlmFailureKind")]
pub enum FailureKind {
    /// 401/403: a bad or missing key.
    Auth,
    /// 404: an unknown model or a wrong base URL.
    NotFound,
    /// 429 (`retry_after_ms` when the provider said).
    RateLimited,
    /// A 5xx.
    Server,
    /// Connection refused, DNS.
    Unreachable,
    /// No answer within `llm.request_timeout_s`.
    Timeout,
    /// A certificate or the handshake.
    Tls,
    /// Not the wire's documented shape (garbage, a cut stream).
    BadResponse,
    /// The record itself (a credential without a value, a bad URL).
    Config,
    /// A kind this build does not know.
    Unknown,
}

/// A provider's failure.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct LlmFailure {
    pub kind: FailureKind,
    /// Names the provider and the cause; never a secret.
    pub message: String,
    /// null: no HTTP answer.
    pub http_status: Option<u32>,
    /// A 429's `retry-after` (ms); null: none.
    pub retry_after_ms: Option<u64>,
}

/// The answer of `POST /v1/llm/connections/{name}/test` and `POST /v1/llm/connections/test`:
/// a provider's failure is 200 with `ok: false`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct LlmTestReport {
    pub ok: bool,
    /// The request's wall time (ms), also on failure.
    pub latency_ms: u64,
    /// The model the request named.
    pub model: String,
    /// null when `ok`.
    pub failure: Option<LlmFailure>,
}

/// One model id a provider lists.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct LlmModel {
    pub id: String,
}

/// The answer of `GET /v1/llm/connections/{name}/models` and `POST …/models`: the provider's
/// model ids, sorted; when listing is impossible an empty list and a `hint`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct LlmModels {
    pub items: Vec<LlmModel>,
    /// Always null: one page.
    pub next_cursor: Option<String>,
    /// Why the list is empty or partial (type an id instead); null: none.
    pub hint: Option<String>,
    /// The provider answered with an error; null: none.
    pub failure: Option<LlmFailure>,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::schema::{Components, request, response};

    #[test]
    fn a_patch_tells_absent_from_null() {
        let p: LlmConnectionPatch = crate::body::from_value(json!({"base_url": null, "model": "m"})).unwrap();
        assert_eq!((&p.base_url, &p.fast_model, p.model.as_deref()), (&Some(None), &None, Some("m")));
        assert_eq!(serde_json::to_value(&p).unwrap(), json!({"base_url": null, "model": "m"}));
        assert!(LlmConnectionPatch::default().is_empty() && !p.is_empty());
    }

    #[test]
    fn the_key_is_write_only_and_never_in_an_answer() {
        let mut c = Components::new();
        response::<LlmConnection>(&mut c);
        response::<LlmTestReport>(&mut c);
        response::<LlmModels>(&mut c);
        request::<LlmConnectionCreate>(&mut c);
        request::<LlmConnectionPatch>(&mut c);
        request::<LlmDraft>(&mut c);
        let defs = c.finish();
        for answer in ["LlmConnection", "LlmTestReport", "LlmModels", "LlmFailure"] {
            assert!(defs[answer]["properties"].get("api_key").is_none(), "{answer}");
        }
        for body in ["LlmConnectionCreate", "LlmConnectionPatch", "LlmDraft"] {
            assert_eq!(defs[body]["properties"]["api_key"]["writeOnly"], true, "{body}");
            assert_eq!(defs[body]["additionalProperties"], false, "{body}");
        }
        let words = serde_json::to_value([Wire::Anthropic, Wire::OpenaiResponses, Wire::OpenaiChat, Wire::Ollama]);
        assert_eq!(words.unwrap(), json!(["anthropic", "openai-responses", "openai-chat", "ollama"]));
    }
}
