//! What the chat service keeps in `coffer.db`, through the store's `Conversations` and `Audit`
//! services (`proto/store_conversations.proto`, `proto/store_audit.proto`), and the conversions
//! between the store's records and the Chat contract's messages (`proto/chat.proto`).
use coffer_proto::chat as c;
use coffer_proto::store as st;
use coffer_proto::store::audit_client::AuditClient;
use coffer_proto::store::conversations_client::ConversationsClient;
use coffer_runtime::grpc::AuthChannel;

use crate::adapter::AgentConfig;
use crate::error::{Error, Result};

/// Largest message exchanged with the store: a whole pending queue of 1 MiB texts.
pub const MAX_STORE_MESSAGE_BYTES: usize = 64 << 20;

/// The store's clients the chat service uses. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    conversations: ConversationsClient<AuthChannel>,
    audit: AuditClient<AuthChannel>,
    channel: AuthChannel,
}

impl Store {
    /// Over a channel to the store.
    pub fn new(channel: AuthChannel) -> Self {
        Self {
            conversations: ConversationsClient::new(channel.clone())
                .max_decoding_message_size(MAX_STORE_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_STORE_MESSAGE_BYTES),
            audit: AuditClient::new(channel.clone()),
            channel,
        }
    }

    /// The channel to the store (for the other domains' clients: Channels, Credentials).
    pub fn channel(&self) -> AuthChannel {
        self.channel.clone()
    }

    fn conv(&self) -> ConversationsClient<AuthChannel> {
        self.conversations.clone()
    }

    /// Creates a conversation record.
    pub async fn create(&self, record: st::ConversationRecord) -> Result<st::ConversationRecord> {
        Ok(self
            .conv()
            .create_conversation(st::CreateConversationRequest { conversation: Some(record) })
            .await?
            .into_inner())
    }

    /// The conversation `id`; [`Error::NotFound`] naming it when absent.
    pub async fn get(&self, id: &str) -> Result<st::ConversationRecord> {
        match self.conv().get_conversation(st::ConversationRef { id: id.to_owned() }).await {
            Ok(r) => Ok(r.into_inner()),
            Err(s) if s.code() == tonic::Code::NotFound => Err(Error::NotFound(format!("conversation {id} not found"))),
            Err(s) => Err(s.into()),
        }
    }

    /// A page of conversations.
    pub async fn list(&self, req: st::ListConversationsRequest) -> Result<st::ListConversationsReply> {
        Ok(self.conv().list_conversations(req).await?.into_inner())
    }

    /// Changes the fields that are set.
    pub async fn update(&self, req: st::UpdateConversationRequest) -> Result<st::ConversationRecord> {
        Ok(self.conv().update_conversation(req).await?.into_inner())
    }

    /// Stores `config` as the conversation's agent config.
    pub async fn set_config(&self, id: &str, config: &AgentConfig) -> Result<st::ConversationRecord> {
        self.update(st::UpdateConversationRequest {
            id: id.to_owned(),
            agent_config_json: Some(config_json(config)),
            ..Default::default()
        })
        .await
    }

    /// Deletes the conversation with its messages and pending items; the rows removed.
    pub async fn delete(&self, id: &str) -> Result<u64> {
        Ok(self.conv().delete_conversation(st::ConversationRef { id: id.to_owned() }).await?.into_inner().removed)
    }

    /// Appends a message.
    pub async fn append(&self, m: st::MessageRecord) -> Result<st::MessageRecord> {
        Ok(self.conv().append_message(m).await?.into_inner())
    }

    /// Starts a turn: appends its user message and its `streaming` assistant message and, for
    /// a queued item, removes it from the pending queue, all in one store transaction
    /// (`StartTurn`, idempotent by the user message's id).
    pub async fn start_turn(
        &self,
        user: st::MessageRecord,
        assistant: st::MessageRecord,
        pending_item_id: &str,
    ) -> Result<st::StartTurnReply> {
        Ok(self
            .conv()
            .start_turn(st::StartTurnRequest {
                user: Some(user),
                assistant: Some(assistant),
                pending_item_id: pending_item_id.to_owned(),
            })
            .await?
            .into_inner())
    }

    /// Replaces a message's blocks, status, usage and model.
    pub async fn update_message(&self, m: st::MessageRecord) -> Result<st::MessageRecord> {
        Ok(self.conv().update_message(m).await?.into_inner())
    }

    /// A page of messages.
    pub async fn messages(&self, req: st::ListMessagesRequest) -> Result<st::ListMessagesReply> {
        Ok(self.conv().list_messages(req).await?.into_inner())
    }

    /// Every message left `streaming` becomes `failed`; how many.
    pub async fn fail_streaming(&self) -> Result<u64> {
        Ok(self.conv().fail_streaming_messages(st::FailStreamingMessagesRequest {}).await?.into_inner().removed)
    }

    /// Replaces the persisted pending queue.
    pub async fn set_pending(&self, id: &str, items: &[c::PendingItem], paused: bool) -> Result<()> {
        self.conv()
            .set_pending(st::SetPendingRequest {
                conversation_id: id.to_owned(),
                items: items.iter().map(pending_record).collect(),
                paused,
            })
            .await?;
        Ok(())
    }

    /// The persisted pending queue.
    pub async fn get_pending(&self, id: &str) -> Result<st::PendingRecord> {
        Ok(self.conv().get_pending(st::ConversationRef { id: id.to_owned() }).await?.into_inner())
    }

    /// Every non-empty persisted queue.
    pub async fn pending_queues(&self) -> Result<Vec<st::PendingRecord>> {
        Ok(self.conv().list_pending_queues(st::ListPendingQueuesRequest {}).await?.into_inner().queues)
    }

    /// Reserves `count` event sequence numbers; the first.
    pub async fn reserve_seq(&self, id: &str, count: u32) -> Result<u64> {
        Ok(self
            .conv()
            .reserve_event_seq(st::ReserveEventSeqRequest { conversation_id: id.to_owned(), count })
            .await?
            .into_inner()
            .first)
    }

    /// Records `tool` as allowed "always" in conversation `id` (again: replaces who and when).
    pub async fn allow_tool(&self, id: &str, tool: st::AllowedToolRecord) -> Result<()> {
        self.conv().allow_tool(st::AllowToolRequest { conversation_id: id.to_owned(), tool: Some(tool) }).await?;
        Ok(())
    }

    /// Conversation `id`'s tools allowed "always", by name.
    pub async fn allowed_tools(&self, id: &str) -> Result<Vec<st::AllowedToolRecord>> {
        Ok(self.conv().list_allowed_tools(st::ConversationRef { id: id.to_owned() }).await?.into_inner().tools)
    }

    /// Forgets conversation `id`'s tools allowed "always"; how many there were.
    pub async fn clear_allowed_tools(&self, id: &str) -> Result<u64> {
        Ok(self.conv().clear_allowed_tools(st::ConversationRef { id: id.to_owned() }).await?.into_inner().removed)
    }

    /// Appends one audit entry (actor, action, target, outcome, detail JSON without message text).
    pub async fn audit(&self, entry: st::AuditEntry) -> Result<()> {
        self.audit.clone().append_audit(st::AppendAuditRequest { entries: vec![entry] }).await?;
        Ok(())
    }
}

/// The JSON object the store keeps as `agent_config_json`.
pub fn config_json(config: &AgentConfig) -> String {
    serde_json::to_string(config).unwrap_or_else(|_| "{}".to_owned())
}

/// `agent_config_json` read back (unknown fields ignored, a malformed one as the default).
pub fn parse_config(json: &str) -> AgentConfig {
    serde_json::from_str(json).unwrap_or_default()
}

/// A store pending item from the Chat one.
pub fn pending_record(p: &c::PendingItem) -> st::PendingItemRecord {
    st::PendingItemRecord { id: p.id.clone(), text: p.text.clone(), created_ms: p.created_ms, source: p.source.clone() }
}

/// A Chat pending item from the store's.
pub fn pending_item(p: st::PendingItemRecord) -> c::PendingItem {
    c::PendingItem { id: p.id, text: p.text, created_ms: p.created_ms, source: p.source }
}

/// A Chat content block from the store's.
pub fn block(b: &st::ContentBlockRecord) -> c::ContentBlock {
    use c::content_block::Block as C;
    use st::content_block_record::Block as S;
    let block = b.block.as_ref().map(|b| match b {
        S::Text(t) => C::Text(t.clone()),
        S::ToolUse(u) => {
            C::ToolUse(c::ToolUse { id: u.id.clone(), name: u.name.clone(), input_json: u.input_json.clone() })
        }
        S::ToolResult(r) => C::ToolResult(c::ToolResult {
            tool_use_id: r.tool_use_id.clone(),
            output: r.output.clone(),
            is_error: r.is_error,
        }),
        S::Attachment(a) => C::Attachment(c::Attachment {
            name: a.name.clone(),
            mime: a.mime.clone(),
            size: a.size,
            path: a.path.clone(),
        }),
    });
    c::ContentBlock { block }
}

/// A Chat message from the store's record.
pub fn message(m: &st::MessageRecord) -> c::Message {
    c::Message {
        id: m.id.clone(),
        conversation_id: m.conversation_id.clone(),
        role: m.role,
        blocks: m.blocks.iter().map(block).collect(),
        status: m.status,
        usage: m.usage.map(usage),
        model: m.model.clone(),
        created_ms: m.created_ms,
        updated_ms: m.updated_ms,
        error: m.error.clone(),
        source: m.source.clone(),
        files_changed: crate::changes::from_json(&m.files_changed_json).map(|f| f.to_proto(&m.id)),
        imported: m.source.starts_with(IMPORTED_SOURCE_PREFIX),
        agent_key: m.agent_key.clone(),
        connection: m.connection.clone(),
    }
}

/// The source prefix of messages copied from an imported agent session's transcript
/// (`import:<agent_key>`): [`c::Message::imported`].
pub const IMPORTED_SOURCE_PREFIX: &str = "import:";

/// Chat usage from the store's.
pub fn usage(u: st::UsageRecord) -> c::Usage {
    c::Usage {
        input_tokens: u.input_tokens,
        output_tokens: u.output_tokens,
        cache_read_tokens: u.cache_read_tokens,
        cache_write_tokens: u.cache_write_tokens,
    }
}

/// The store's usage from an adapter's.
pub fn usage_record(u: crate::adapter::Usage) -> st::UsageRecord {
    st::UsageRecord {
        input_tokens: u.input_tokens,
        output_tokens: u.output_tokens,
        cache_read_tokens: u.cache_read_tokens,
        cache_write_tokens: u.cache_write_tokens,
    }
}

/// A Chat conversation from the store's record (live state left at its defaults).
pub fn conversation(r: &st::ConversationRecord) -> c::Conversation {
    let cfg = parse_config(&r.agent_config_json);
    c::Conversation {
        id: r.id.clone(),
        agent_key: r.agent_key.clone(),
        title: r.title.clone(),
        agent_config: Some(c::AgentConfig {
            cwd: cfg.cwd,
            model: cfg.model,
            session_id: cfg.session_id,
            permission_mode: cfg.permission_mode.as_str().to_owned(),
        }),
        channel_name: r.channel_name.clone(),
        peer_chat_id: r.peer_chat_id.clone(),
        archived: r.archived_ms != 0,
        created_ms: r.created_ms,
        updated_ms: r.updated_ms,
        last_message_ms: r.last_message_ms,
        version: r.version,
        message_count: r.message_count,
        turn_running: false,
        pending_count: 0,
        pending_paused: false,
        approvals_waiting: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_round_trips_and_tolerates_garbage() {
        let cfg = AgentConfig {
            cwd: "/w".into(),
            model: "m".into(),
            session_id: "s".into(),
            permission_mode: crate::adapter::PermissionMode::ReadOnly,
        };
        assert_eq!(parse_config(&config_json(&cfg)), cfg);
        assert_eq!(parse_config("not json"), AgentConfig::default());
        assert_eq!(parse_config(r#"{"cwd":"/x","extra":1}"#).cwd, "/x");
        assert!(config_json(&cfg).contains(r#""permission_mode":"read_only""#));
        let old = parse_config(r#"{"cwd":"/x"}"#);
        assert_eq!(old.permission_mode, crate::adapter::PermissionMode::Bypass, "before modes: bypass");
    }
}
