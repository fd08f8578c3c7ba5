//! Request bodies of `/v1/knowledge…` and `/v1/memory…`. (Answers are still described by the
//! edge's hand-written remainder.) A `null` field counts as absent, as it always has: every
//! optional field is an `Option`.
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `POST /v1/knowledge`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KnowledgeBaseCreate {
    /// `^[a-z0-9][a-z0-9_-]{0,63}$`, not `memory`, `search` or `reindex`.
    pub name: String,
    /// An existing folder (absolute); default `COFFER_HOME/knowledge/<name>/`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Globs relative to the root; default `**/*.md`, `**/*.markdown`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include: Option<Vec<String>>,
    /// Globs; `.gitignore` is respected as well.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exclude: Option<Vec<String>>,
}

/// `POST /v1/knowledge/reindex`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Reindex {
    /// One knowledge base; default every one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kb: Option<String>,
    /// Drop the index first. Default false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clean: Option<bool>,
}

/// `POST /v1/knowledge/search`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SearchRequest {
    /// 1-8192 bytes after trimming.
    pub query: String,
    /// Only these knowledge bases; default every folder one (not memory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kb: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_prefix: Option<String>,
    /// Documents with every one of these tags.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tags: Option<Vec<String>>,
    /// Unix milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub modified_after_ms: Option<i64>,
    /// `grep`, `keyword`, `vector`; default every enabled engine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engines: Option<Vec<String>>,
    /// Results (at most 50); 0 or absent: 8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    /// Snippet length (at most 2000); 0 or absent: 240.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snippet_chars: Option<u32>,
    /// grep engine: the query is a regex (else literal).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regex: Option<bool>,
}

/// `POST /v1/memory/recall`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RecallRequest {
    pub query: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tags: Option<Vec<String>>,
    /// Results (at most 50); 0 or absent: 8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    /// Snippet length (at most 2000); 0 or absent: 240.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snippet_chars: Option<u32>,
}

/// `POST /v1/memory`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FactCreate {
    /// 1-16384 bytes.
    pub text: String,
    /// Each `^[A-Za-z0-9_.-]{1,64}$` (CJK letters too); at most 32.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tags: Option<Vec<String>>,
    /// At most 256 bytes; default the request's actor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// Store the text even though it looks like it holds a secret (a token, `Bearer …`,
    /// `password=…`, or prose such as "the staging password is hunter2-Xy9!kQ"); without it
    /// such a text is refused with INVALID_ARGUMENT. Default false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_secret: Option<bool>,
}
