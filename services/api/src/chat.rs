//! Request bodies of `/v1/conversations…`. (Answers are still described by the edge's
//! hand-written remainder.) A `null` field counts as absent: every optional field is an
//! `Option`.
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The agent settings a conversation may be created with (the agent's `session_id` is not the
/// caller's to set).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentConfigCreate {
    /// An existing directory (absolute); default `COFFER_HOME/workspace`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Default: the agent's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

/// `POST /v1/conversations`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ConversationCreate {
    /// An available agent (`GET /v1/agents`).
    pub agent_key: String,
    /// Default: from the first message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_config: Option<AgentConfigCreate>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_chat_id: Option<String>,
    /// Sent at once (1 byte to 1 MiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_message: Option<String>,
}

/// `PATCH /v1/conversations/{id}`: at least one field.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ConversationPatch {
    /// At most 200 characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// `""`: the agent's own default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// `false` restores an archived conversation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub archived: Option<bool>,
}

/// `POST /v1/conversations/{id}/messages`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MessageSend {
    /// 1 byte to 1 MiB (UTF-8).
    #[schemars(length(min = 1))]
    pub text: String,
}

/// One item of a `PUT …/pending` body.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PendingItemSet {
    /// An existing item's id (kept); absent: a new item.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    pub text: String,
}

/// `PUT /v1/conversations/{id}/pending`: the whole queue, in order (`[]` clears it).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PendingSet {
    pub items: Vec<PendingItemSet>,
    /// Keep the queue paused. Default false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
}
