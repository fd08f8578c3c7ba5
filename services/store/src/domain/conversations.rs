//! The `Conversations` service (`proto/store_conversations.proto`): the chat service's persisted
//! state — conversations (`conversations`, with the trigram title index `conversation_titles`),
//! their messages (`messages`, content blocks as one JSON array per message), the pending queue
//! (`pending_items`, its paused flag on the conversation) and each conversation's event-sequence
//! high-water mark (`conversations.event_seq`), and the tools an approval allowed "always"
//! (`conversation_allowed_tools`, one row per conversation and tool, gone with the conversation).
//!
//! `coffer-chat` is its only caller ([`crate::authz`]). Ids are caller-chosen ULIDs (26
//! uppercase Crockford base-32 characters), times Unix milliseconds. Every write is one
//! transaction on the store's writer thread, so concurrent appends to a conversation keep the
//! order in which they were committed and none is lost. Writes produce no change rows (only the
//! chat service reads this domain, and it is the writer) and no audit rows (the chat service
//! audits turns where they happen).
//!
//! The retention worker ([`crate::retention`]) archives idle conversations and deletes archived
//! ones through [`archive_idle`] and [`delete_archived`].
//!
//! Details: `conversations` has an explicit `pk` rowid alias and a `version` bumped by
//! `UpdateConversation` only. The title index is a trigram FTS5 table over the title lowercased by
//! the store (Unicode, which SQLite's `lower()` is not), kept by triggers: a title search of three
//! characters or more is a quoted phrase query on it, a shorter one a scan of the same folded
//! column, so both answer the same substring question and user text is never FTS5 syntax.
//! `SetPending` replaces the queue whole and refuses an item whose id is already a message's.
//! `StartTurn` is one transaction (the user message, its `streaming` assistant message and, for a
//! queued item, the item's removal), idempotent by the user message's id (the chat service uses the
//! item's id), answering `already` with the stored records. `DeleteConversation` is one
//! transaction (messages and pending items by `ON DELETE CASCADE`, the title row by trigger). Lists
//! page by `(updated_ms, id)` (conversations) or message `pk` (messages) and stop before 8 MiB of
//! reply. Retention archives conversations idle for `retention.conversations_archive_days` (7;
//! one just restored is not archived again at the next pass) and deletes those archived more than
//! `retention.conversations_delete_days` (30) ago, 100 conversations per transaction; `0` keeps
//! them forever.
use coffer_proto::store::conversations_server::Conversations;
use coffer_proto::store::*;
use prost::Message as _;
use rusqlite::{Connection, OptionalExtension, Row, params};
use serde::{Deserialize, Serialize};
use tonic::{Request, Response, Status};

use super::{required, truncate};
use crate::db::{Db, StoreError};

/// Longest title (characters).
pub const MAX_TITLE_CHARS: usize = 200;
/// Longest `agent_config_json` (bytes).
pub const MAX_AGENT_CONFIG_BYTES: usize = 64 * 1024;
/// Longest agent key (bytes).
pub const MAX_AGENT_KEY_BYTES: usize = 64;
/// Longest channel name and peer chat id (bytes).
pub const MAX_CHANNEL_BYTES: usize = 64;
pub const MAX_PEER_CHAT_ID_BYTES: usize = 256;
/// Most bytes of text one message holds, over all its blocks (text, tool inputs, outputs): a
/// 1 MiB user message fits with room to spare, and so does a long turn's assistant message.
pub const MAX_MESSAGE_BYTES: usize = 8 * 1024 * 1024;
/// Most content blocks of one message.
pub const MAX_BLOCKS: usize = 10_000;
/// Longest tool name and tool-use id (bytes).
const MAX_TOOL_NAME_BYTES: usize = 512;
/// Longest `model` and `source` of a message (bytes).
const MAX_MODEL_BYTES: usize = 256;
const MAX_SOURCE_BYTES: usize = 128;
/// Longest `error` of a failed message (bytes).
pub const MAX_ERROR_BYTES: usize = 64 * 1024;
/// Longest `files_changed_json` of an assistant message (bytes).
pub const MAX_FILES_CHANGED_BYTES: usize = 1024 * 1024;
/// Most items of a pending queue, and the longest text of one (bytes: the chat service's limit
/// for a message).
pub const MAX_PENDING_ITEMS: usize = 1000;
pub const MAX_PENDING_TEXT_BYTES: usize = 1024 * 1024;
/// Most bytes of text of one pending queue, over its items (so one queue fits in a reply).
pub const MAX_PENDING_BYTES: usize = 8 * 1024 * 1024;
/// Most event sequence numbers one `ReserveEventSeq` reserves.
pub const MAX_RESERVE: u32 = 1_000_000;
/// Longest page of `ListConversations` and its default.
const MAX_CONVERSATION_PAGE: u32 = 200;
const DEFAULT_CONVERSATION_PAGE: u32 = 50;
/// Longest page of `ListMessages` and its default.
const MAX_MESSAGE_PAGE: u32 = 500;
const DEFAULT_MESSAGE_PAGE: u32 = 100;
/// Most bytes (protobuf-encoded) of the records in one list reply: a page stops early rather
/// than grow past it (it always holds at least one record). A client of this service should
/// decode replies up to [`super::MAX_DECODING_MESSAGE_SIZE`] (tonic's default is 4 MiB), since
/// one message may be [`MAX_MESSAGE_BYTES`].
pub const MAX_REPLY_BYTES: usize = 8 * 1024 * 1024;
/// The text block `FailStreamingMessages` appends to a message that has none.
pub const FAILED_BY_RESTART: &str = "The chat service stopped during this turn; the turn did not finish.";

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// Validates a caller-chosen id: a ULID in its canonical form (26 characters of Crockford
/// base-32, uppercase, at most `7ZZZZZZZZZZZZZZZZZZZZZZZZZ`).
///
/// # Errors
/// [`StoreError::Invalid`] naming `field`.
pub fn validate_id(field: &str, id: &str) -> Result<(), StoreError> {
    let canonical = ulid::Ulid::from_string(id).is_ok_and(|u| u.to_string() == id);
    if !canonical {
        return Err(StoreError::Invalid(format!(
            "{field} {:?} is not a ULID (26 uppercase Crockford base-32 characters)",
            truncate(id, 40)
        )));
    }
    Ok(())
}

/// [`StoreError::Invalid`] naming `field` when `s` is longer than `max` bytes or holds a NUL.
fn check_len(field: &str, s: &str, max: usize) -> Result<(), StoreError> {
    if s.len() > max {
        return Err(StoreError::Invalid(format!("{field} is {} bytes; at most {max}", s.len())));
    }
    if s.contains('\0') {
        return Err(StoreError::Invalid(format!("{field} contains a NUL byte")));
    }
    Ok(())
}

fn validate_title(title: &str) -> Result<(), StoreError> {
    let n = title.chars().count();
    if n > MAX_TITLE_CHARS {
        return Err(StoreError::Invalid(format!("title is {n} characters; at most {MAX_TITLE_CHARS}")));
    }
    check_len("title", title, usize::MAX)
}

fn validate_agent_config(json: &str) -> Result<(), StoreError> {
    if json.len() > MAX_AGENT_CONFIG_BYTES {
        return Err(StoreError::Invalid(format!(
            "agent_config_json is {} bytes; at most {MAX_AGENT_CONFIG_BYTES}",
            json.len()
        )));
    }
    match serde_json::from_str::<serde_json::Value>(json) {
        Ok(serde_json::Value::Object(_)) => Ok(()),
        Ok(_) => Err(StoreError::Invalid("agent_config_json must be a JSON object".into())),
        Err(e) => Err(StoreError::Invalid(format!("agent_config_json is not JSON: {e}"))),
    }
}

fn validate_agent_key(key: &str) -> Result<(), StoreError> {
    let ok = !key.is_empty()
        && key.len() <= MAX_AGENT_KEY_BYTES
        && key.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
    if !ok {
        return Err(StoreError::Invalid(format!(
            "agent_key {:?} must be 1-{MAX_AGENT_KEY_BYTES} characters a-z, 0-9, '_' and '-'",
            truncate(key, 40)
        )));
    }
    Ok(())
}

/// Validates a new conversation's fields.
fn validate_conversation(c: &ConversationRecord) -> Result<(), StoreError> {
    validate_id("conversation.id", &c.id)?;
    validate_agent_key(&c.agent_key)?;
    validate_title(&c.title)?;
    validate_agent_config(&c.agent_config_json)?;
    check_len("channel_name", &c.channel_name, MAX_CHANNEL_BYTES)?;
    check_len("peer_chat_id", &c.peer_chat_id, MAX_PEER_CHAT_ID_BYTES)?;
    if c.channel_name.is_empty() && !c.peer_chat_id.is_empty() {
        return Err(StoreError::Invalid("peer_chat_id needs a channel_name".into()));
    }
    Ok(())
}

/// One content block as `messages.blocks_json` stores it (an array of these, in order).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum StoredBlock {
    Text {
        text: String,
    },
    ToolUse {
        id: String,
        name: String,
        input_json: String,
    },
    ToolResult {
        tool_use_id: String,
        output: String,
        is_error: bool,
    },
    /// A file attached to a user message (its bytes are in the conversation's cwd at `path`).
    Attachment {
        name: String,
        mime: String,
        size: u64,
        path: String,
    },
}

impl StoredBlock {
    fn from_record(b: ContentBlockRecord) -> Option<Self> {
        Some(match b.block? {
            content_block_record::Block::Text(text) => StoredBlock::Text { text },
            content_block_record::Block::ToolUse(u) => {
                StoredBlock::ToolUse { id: u.id, name: u.name, input_json: u.input_json }
            }
            content_block_record::Block::ToolResult(r) => {
                StoredBlock::ToolResult { tool_use_id: r.tool_use_id, output: r.output, is_error: r.is_error }
            }
            content_block_record::Block::Attachment(a) => {
                StoredBlock::Attachment { name: a.name, mime: a.mime, size: a.size, path: a.path }
            }
        })
    }

    fn into_record(self) -> ContentBlockRecord {
        let block = match self {
            StoredBlock::Text { text } => content_block_record::Block::Text(text),
            StoredBlock::ToolUse { id, name, input_json } => {
                content_block_record::Block::ToolUse(ToolUseRecord { id, name, input_json })
            }
            StoredBlock::ToolResult { tool_use_id, output, is_error } => {
                content_block_record::Block::ToolResult(ToolResultRecord { tool_use_id, output, is_error })
            }
            StoredBlock::Attachment { name, mime, size, path } => {
                content_block_record::Block::Attachment(AttachmentRecord { name, mime, size, path })
            }
        };
        ContentBlockRecord { block: Some(block) }
    }
}

/// A validated message, ready for its row.
struct NewMessage {
    id: String,
    conversation_id: String,
    role: MessageRole,
    status: MessageStatus,
    blocks_json: String,
    usage: [i64; 4],
    model: String,
    error: String,
    source: String,
    created_ms: i64,
    /// What the turn changed (JSON, opaque here); empty: not set.
    files_changed_json: String,
    /// The agent that answered; empty: not set.
    agent_key: String,
    /// The LLM connection it was bound to; empty: its own login (or not set).
    connection: String,
}

/// Validates a message for `AppendMessage`/`UpdateMessage`: ids, role, status, blocks (at least
/// one, except while `streaming` or for a `failed` message that carries its `error`), sizes.
fn validate_message(m: MessageRecord) -> Result<NewMessage, StoreError> {
    validate_id("message.id", &m.id)?;
    validate_id("message.conversation_id", &m.conversation_id)?;
    let role = required::<MessageRole>(m.role, "message.role")?;
    let status = required::<MessageStatus>(m.status, "message.status")?;
    check_len("message.model", &m.model, MAX_MODEL_BYTES)?;
    check_len("message.source", &m.source, MAX_SOURCE_BYTES)?;
    check_len("message.error", &m.error, MAX_ERROR_BYTES)?;
    check_len("message.files_changed_json", &m.files_changed_json, MAX_FILES_CHANGED_BYTES)?;
    check_len("message.agent_key", &m.agent_key, MAX_MODEL_BYTES)?;
    check_len("message.connection", &m.connection, MAX_MODEL_BYTES)?;
    if !m.files_changed_json.is_empty() && serde_json::from_str::<serde::de::IgnoredAny>(&m.files_changed_json).is_err()
    {
        return Err(StoreError::Invalid("message.files_changed_json is not JSON".into()));
    }
    if m.blocks.len() > MAX_BLOCKS {
        return Err(StoreError::Invalid(format!("message.blocks has {} blocks; at most {MAX_BLOCKS}", m.blocks.len())));
    }
    let may_be_empty = status == MessageStatus::Streaming || (status == MessageStatus::Failed && !m.error.is_empty());
    if m.blocks.is_empty() && !may_be_empty {
        return Err(StoreError::Invalid("message.blocks is empty: a message needs at least one content block".into()));
    }
    if m.created_ms < 0 {
        return Err(StoreError::Invalid(format!("message.created_ms {} is negative", m.created_ms)));
    }
    let mut bytes = 0usize;
    let mut blocks = Vec::with_capacity(m.blocks.len());
    for (i, b) in m.blocks.into_iter().enumerate() {
        let b = StoredBlock::from_record(b).ok_or_else(|| {
            StoreError::Invalid(format!("message.blocks[{i}] has no text, tool_use, tool_result or attachment"))
        })?;
        match &b {
            StoredBlock::Text { text } => bytes += text.len(),
            StoredBlock::ToolUse { id, name, input_json } => {
                if name.is_empty() {
                    return Err(StoreError::Invalid(format!("message.blocks[{i}].tool_use.name is empty")));
                }
                check_len(&format!("message.blocks[{i}].tool_use.name"), name, MAX_TOOL_NAME_BYTES)?;
                check_len(&format!("message.blocks[{i}].tool_use.id"), id, MAX_TOOL_NAME_BYTES)?;
                if !input_json.is_empty() && serde_json::from_str::<serde::de::IgnoredAny>(input_json).is_err() {
                    return Err(StoreError::Invalid(format!("message.blocks[{i}].tool_use.input_json is not JSON")));
                }
                bytes += name.len() + id.len() + input_json.len();
            }
            StoredBlock::ToolResult { tool_use_id, output, .. } => {
                check_len(&format!("message.blocks[{i}].tool_result.tool_use_id"), tool_use_id, MAX_TOOL_NAME_BYTES)?;
                bytes += tool_use_id.len() + output.len();
            }
            StoredBlock::Attachment { name, mime, path, .. } => {
                check_len(&format!("message.blocks[{i}].attachment.name"), name, MAX_TOOL_NAME_BYTES)?;
                check_len(&format!("message.blocks[{i}].attachment.mime"), mime, MAX_TOOL_NAME_BYTES)?;
                check_len(&format!("message.blocks[{i}].attachment.path"), path, 4 * MAX_TOOL_NAME_BYTES)?;
                bytes += name.len() + mime.len() + path.len();
            }
        }
        if bytes > MAX_MESSAGE_BYTES {
            return Err(StoreError::Invalid(format!(
                "message.blocks hold more than {MAX_MESSAGE_BYTES} bytes (the limit of one message)"
            )));
        }
        blocks.push(b);
    }
    let u = m.usage.unwrap_or_default();
    let mut usage = [0i64; 4];
    for (slot, (name, v)) in usage.iter_mut().zip([
        ("input_tokens", u.input_tokens),
        ("output_tokens", u.output_tokens),
        ("cache_read_tokens", u.cache_read_tokens),
        ("cache_write_tokens", u.cache_write_tokens),
    ]) {
        *slot = i64::try_from(v).map_err(|_| StoreError::Invalid(format!("message.usage.{name} is too large")))?;
    }
    Ok(NewMessage {
        id: m.id,
        conversation_id: m.conversation_id,
        role,
        status,
        blocks_json: serde_json::to_string(&blocks).expect("blocks serialize"),
        usage,
        model: m.model,
        error: m.error,
        source: m.source,
        created_ms: m.created_ms,
        files_changed_json: m.files_changed_json,
        agent_key: m.agent_key,
        connection: m.connection,
    })
}

const CONV_COLS: &str = "id, agent_key, title, agent_config_json, channel_name, peer_chat_id, created_ms, updated_ms, \
                         last_message_ms, archived_ms, version, message_count";

fn conversation_from_row(r: &Row<'_>) -> rusqlite::Result<ConversationRecord> {
    Ok(ConversationRecord {
        id: r.get(0)?,
        agent_key: r.get(1)?,
        title: r.get(2)?,
        agent_config_json: r.get(3)?,
        channel_name: r.get(4)?,
        peer_chat_id: r.get(5)?,
        created_ms: r.get(6)?,
        updated_ms: r.get(7)?,
        last_message_ms: r.get(8)?,
        archived_ms: r.get(9)?,
        version: r.get::<_, i64>(10)? as u64,
        message_count: r.get::<_, i64>(11)? as u64,
    })
}

fn get_conversation(c: &Connection, id: &str) -> Result<Option<ConversationRecord>, StoreError> {
    let mut st = c.prepare_cached(&format!("SELECT {CONV_COLS} FROM conversations WHERE id = ?1"))?;
    Ok(st.query_row([id], conversation_from_row).optional()?)
}

/// Longest tool name (and `decided_by`, `actor`) of an allowed tool, bytes.
const MAX_ALLOWED_TOOL_BYTES: usize = 200;

/// Conversation `id`'s tools allowed "always", by tool name.
fn allowed_tools_of(c: &Connection, id: &str) -> Result<Vec<AllowedToolRecord>, StoreError> {
    let mut st = c.prepare_cached(
        "SELECT tool, decided_by, actor, allowed_ms FROM conversation_allowed_tools WHERE conversation_id = ?1 \
         ORDER BY tool",
    )?;
    let rows = st.query_map([id], |r| {
        Ok(AllowedToolRecord { tool: r.get(0)?, decided_by: r.get(1)?, actor: r.get(2)?, allowed_ms: r.get(3)? })
    })?;
    Ok(rows.collect::<Result<Vec<_>, _>>()?)
}

fn require_conversation(c: &Connection, id: &str) -> Result<ConversationRecord, StoreError> {
    get_conversation(c, id)?.ok_or_else(|| StoreError::NotFound(format!("conversation {id:?}")))
}

const MSG_COLS: &str = "id, conversation_id, role, status, blocks_json, input_tokens, output_tokens, \
                        cache_read_tokens, cache_write_tokens, model, error, source, created_ms, updated_ms, \
                        files_changed_json, agent_key, connection";

fn message_from_row(r: &Row<'_>) -> rusqlite::Result<MessageRecord> {
    // The columns' CHECKs admit only the words `parse` knows; the JSON is written by this module.
    let role = MessageRole::parse(&r.get::<_, String>(2)?).unwrap_or_default();
    let status = MessageStatus::parse(&r.get::<_, String>(3)?).unwrap_or_default();
    let blocks: Vec<StoredBlock> = serde_json::from_str(&r.get::<_, String>(4)?).unwrap_or_default();
    let n = |i: usize| -> rusqlite::Result<u64> { Ok(r.get::<_, i64>(i)?.max(0) as u64) };
    Ok(MessageRecord {
        id: r.get(0)?,
        conversation_id: r.get(1)?,
        role: role.into(),
        status: status.into(),
        blocks: blocks.into_iter().map(StoredBlock::into_record).collect(),
        usage: Some(UsageRecord {
            input_tokens: n(5)?,
            output_tokens: n(6)?,
            cache_read_tokens: n(7)?,
            cache_write_tokens: n(8)?,
        }),
        model: r.get(9)?,
        error: r.get(10)?,
        source: r.get(11)?,
        created_ms: r.get(12)?,
        updated_ms: r.get(13)?,
        files_changed_json: r.get(14)?,
        agent_key: r.get(15)?,
        connection: r.get(16)?,
    })
}

fn get_message(c: &Connection, id: &str) -> Result<Option<MessageRecord>, StoreError> {
    let mut st = c.prepare_cached(&format!("SELECT {MSG_COLS} FROM messages WHERE id = ?1"))?;
    Ok(st.query_row([id], message_from_row).optional()?)
}

fn pending_of(c: &Connection, conversation_id: &str, paused: bool) -> Result<PendingRecord, StoreError> {
    let mut st = c.prepare_cached(
        "SELECT id, text, created_ms, source FROM pending_items WHERE conversation_id = ?1 ORDER BY position",
    )?;
    let items = st
        .query_map([conversation_id], |r| {
            Ok(PendingItemRecord { id: r.get(0)?, text: r.get(1)?, created_ms: r.get(2)?, source: r.get(3)? })
        })?
        .collect::<Result<Vec<_>, _>>()?;
    Ok(PendingRecord { conversation_id: conversation_id.to_owned(), items, paused })
}

/// How many of `items`, from the first, fit in [`MAX_REPLY_BYTES`] (at least one).
fn within_budget<T>(items: &[T], size: impl Fn(&T) -> usize) -> usize {
    let mut total = 0usize;
    for (i, item) in items.iter().enumerate() {
        total += size(item) + 8;
        if total > MAX_REPLY_BYTES {
            return i.max(1);
        }
    }
    items.len()
}

/// The `ListConversations` cursor: the last row's `(updated_ms, id)`, as `<ms>.<id>`.
fn encode_cursor(c: &ConversationRecord) -> String {
    format!("{}.{}", c.updated_ms, c.id)
}

fn decode_cursor(cursor: &str) -> Result<Option<(i64, String)>, StoreError> {
    if cursor.is_empty() {
        return Ok(None);
    }
    let bad = || StoreError::Invalid(format!("cursor {:?} is not one this service returned", truncate(cursor, 40)));
    let (ms, id) = cursor.split_once('.').ok_or_else(bad)?;
    let ms: i64 = ms.parse().map_err(|_| bad())?;
    validate_id("cursor", id).map_err(|_| bad())?;
    Ok(Some((ms, id.to_owned())))
}

/// The FTS5 phrase query matching `needle` (already folded) as a substring of a trigram-indexed
/// column: the needle quoted, its quotes doubled, so user text is never FTS5 syntax.
fn phrase(needle: &str) -> String {
    format!("\"{}\"", needle.replace('"', "\"\""))
}

/// The `ListConversations` query for a validated request: only the clauses its filters need, so
/// that each shape gets the index that serves it (`conversations_recent` for pages,
/// `conversations_channel` for a channel's chats, the trigram index for a title search), and its
/// parameters. Fetches `limit + 1` rows (the extra one says there is a next page).
fn list_query(
    q: &ListConversationsRequest,
    cursor: Option<(i64, String)>,
    limit: u32,
) -> (String, Vec<rusqlite::types::Value>) {
    use rusqlite::types::Value;
    let mut sql = format!("SELECT {CONV_COLS} FROM conversations WHERE 1");
    let mut args = Vec::new();
    // Unspecified (or unknown) is "both".
    match q.archived() {
        ArchivedFilter::Active => sql.push_str(" AND archived_ms = 0"),
        ArchivedFilter::Archived => sql.push_str(" AND archived_ms <> 0"),
        ArchivedFilter::Unspecified => {}
    }
    if !q.channel_name.is_empty() {
        // `<> ''` lets the planner use the partial index.
        sql.push_str(" AND channel_name <> '' AND channel_name = ?");
        args.push(Value::Text(q.channel_name.clone()));
        if !q.peer_chat_id.is_empty() {
            sql.push_str(" AND peer_chat_id = ?");
            args.push(Value::Text(q.peer_chat_id.clone()));
        }
    }
    if let Some((ms, id)) = cursor {
        sql.push_str(" AND (updated_ms, id) < (?, ?)");
        args.extend([Value::Integer(ms), Value::Text(id)]);
    }
    let needle = q.title_contains.to_lowercase();
    match needle.chars().count() {
        0 => {}
        1 | 2 => {
            sql.push_str(" AND instr(title_fold, ?) > 0");
            args.push(Value::Text(needle));
        }
        _ => {
            sql.push_str(" AND pk IN (SELECT rowid FROM conversation_titles WHERE conversation_titles MATCH ?)");
            args.push(Value::Text(phrase(&needle)));
        }
    }
    sql.push_str(" ORDER BY updated_ms DESC, id DESC LIMIT ?");
    args.push(Value::Integer(i64::from(limit) + 1));
    (sql, args)
}

/// Inserts a validated message at the end of its conversation (which the caller checked
/// exists) and bumps the conversation's `message_count`, `updated_ms`, `last_message_ms`.
///
/// # Errors
/// [`StoreError::Exists`] when the id is taken.
fn insert_message(t: &Connection, m: &NewMessage, now: i64) -> Result<MessageRecord, StoreError> {
    if get_message(t, &m.id)?.is_some() {
        return Err(StoreError::Exists(format!("message {:?}", m.id)));
    }
    let created = if m.created_ms == 0 { now } else { m.created_ms };
    t.prepare_cached(&format!(
        "INSERT INTO messages ({MSG_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17)"
    ))?
    .execute(params![
        m.id,
        m.conversation_id,
        m.role.as_str(),
        m.status.as_str(),
        m.blocks_json,
        m.usage[0],
        m.usage[1],
        m.usage[2],
        m.usage[3],
        m.model,
        m.error,
        m.source,
        created,
        now,
        m.files_changed_json,
        m.agent_key,
        m.connection
    ])?;
    // A created_ms in the future counts as now: it must not keep the conversation from ever
    // being idle.
    t.prepare_cached(
        "UPDATE conversations SET message_count = message_count + 1, updated_ms = MAX(updated_ms, ?2),
                last_message_ms = MAX(last_message_ms, MIN(?3, ?2))
         WHERE id = ?1",
    )?
    .execute(params![m.conversation_id, now, created])?;
    get_message(t, &m.id)?.ok_or_else(|| StoreError::NotFound(format!("message {:?}", m.id)))
}

/// `StartTurn` inside the writer's transaction: the user and assistant messages appended and the
/// pending item (if any) removed together, or, when `user.id` is already a message of the
/// conversation (an earlier call committed), nothing but the removal of a re-queued item.
fn start_turn(
    t: &Connection,
    user: &NewMessage,
    assistant: &NewMessage,
    item: &str,
    now: i64,
) -> Result<StartTurnReply, StoreError> {
    require_conversation(t, &user.conversation_id)?;
    let dequeue = |t: &Connection| -> Result<usize, StoreError> {
        if item.is_empty() {
            return Ok(0);
        }
        Ok(t.prepare_cached("DELETE FROM pending_items WHERE conversation_id = ?1 AND id = ?2")?
            .execute(params![user.conversation_id, item])?)
    };
    if let Some(stored) = get_message(t, &user.id)? {
        if stored.conversation_id != user.conversation_id {
            return Err(StoreError::Exists(format!("message {:?} (in another conversation)", user.id)));
        }
        dequeue(t)?;
        // The assistant message was appended in the same transaction, right after it: the
        // writer is one thread, so nothing else took a row number between them.
        let assistant = t
            .prepare_cached(&format!(
                "SELECT {MSG_COLS} FROM messages WHERE pk = (SELECT pk + 1 FROM messages WHERE id = ?1)
                 AND conversation_id = ?2 AND role = 'assistant'"
            ))?
            .query_row(params![user.id, user.conversation_id], message_from_row)
            .optional()?;
        return Ok(StartTurnReply { user: Some(stored), assistant, already: true });
    }
    if dequeue(t)? == 0 && !item.is_empty() {
        return Err(StoreError::NotFound(format!(
            "pending item {item:?} of conversation {:?} (the queue was replaced)",
            user.conversation_id
        )));
    }
    let u = insert_message(t, user, now)?;
    let a = insert_message(t, assistant, now)?;
    Ok(StartTurnReply { user: Some(u), assistant: Some(a), already: false })
}

/// Archives, in one transaction, at most `limit` active conversations whose last message (or,
/// without one, whose creation) is older than `cutoff_ms` and that nothing else touched since
/// (`updated_ms`: a restore, a rename, a turn), so that a conversation the owner just restored is
/// not archived again at the next pass; `archived_ms` and `updated_ms` become `now_ms`, `version`
/// is bumped. Returns how many it archived.
///
/// # Errors
/// [`StoreError::Sql`].
pub fn archive_idle(t: &Connection, cutoff_ms: i64, now_ms: i64, limit: u64) -> Result<u64, StoreError> {
    let n = t.execute(
        "UPDATE conversations SET archived_ms = ?2, updated_ms = ?2, version = version + 1
         WHERE pk IN (SELECT pk FROM conversations
                      WHERE archived_ms = 0 AND MAX(last_message_ms, created_ms) < ?1 AND updated_ms < ?1
                      LIMIT ?3)",
        params![cutoff_ms, now_ms.max(1), limit as i64],
    )?;
    Ok(n as u64)
}

/// Deletes, in one transaction, at most `limit` conversations archived before `cutoff_ms`, with
/// their messages, pending items and title index rows. Returns how many conversations it deleted.
///
/// # Errors
/// [`StoreError::Sql`].
pub fn delete_archived(t: &Connection, cutoff_ms: i64, limit: u64) -> Result<u64, StoreError> {
    let n = t.execute(
        "DELETE FROM conversations WHERE pk IN (SELECT pk FROM conversations
                                                WHERE archived_ms <> 0 AND archived_ms < ?1 LIMIT ?2)",
        params![cutoff_ms, limit as i64],
    )?;
    Ok(n as u64)
}

/// The `Conversations` gRPC service.
pub struct ConversationsService {
    db: Db,
    clock: Clock,
}

/// Where the service reads the time (Unix ms): the system clock, or a test's.
pub type Clock = std::sync::Arc<dyn Fn() -> i64 + Send + Sync>;

impl ConversationsService {
    /// The service over `db`, on the system clock.
    pub fn new(db: Db) -> Self {
        Self::with_clock(db, std::sync::Arc::new(now_ms))
    }

    /// The service over `db`, reading the time from `clock` (tests that need distinct or past
    /// timestamps).
    pub fn with_clock(db: Db, clock: Clock) -> Self {
        Self { db, clock }
    }

    fn now(&self) -> i64 {
        (self.clock)()
    }
}

#[tonic::async_trait]
impl Conversations for ConversationsService {
    async fn create_conversation(
        &self,
        req: Request<CreateConversationRequest>,
    ) -> Result<Response<ConversationRecord>, Status> {
        let c = req.into_inner().conversation.ok_or_else(|| Status::invalid_argument("conversation is required"))?;
        validate_conversation(&c)?;
        let now = self.now();
        let (c, _) = self
            .db
            .write(move |t, _| {
                if get_conversation(t, &c.id)?.is_some() {
                    return Err(StoreError::Exists(format!("conversation {:?}", c.id)));
                }
                t.execute(
                    "INSERT INTO conversations (id, agent_key, title, title_fold, agent_config_json, channel_name,
                                                peer_chat_id, created_ms, updated_ms)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?8)",
                    params![
                        c.id,
                        c.agent_key,
                        c.title,
                        c.title.to_lowercase(),
                        c.agent_config_json,
                        c.channel_name,
                        c.peer_chat_id,
                        now
                    ],
                )?;
                require_conversation(t, &c.id)
            })
            .await?;
        Ok(Response::new(c))
    }

    async fn list_conversations(
        &self,
        req: Request<ListConversationsRequest>,
    ) -> Result<Response<ListConversationsReply>, Status> {
        let q = req.into_inner();
        let limit = if q.limit == 0 { DEFAULT_CONVERSATION_PAGE } else { q.limit.min(MAX_CONVERSATION_PAGE) };
        let cursor = decode_cursor(&q.cursor)?;
        check_len("title_contains", &q.title_contains, 4 * MAX_TITLE_CHARS)?;
        check_len("channel_name", &q.channel_name, MAX_CHANNEL_BYTES)?;
        check_len("peer_chat_id", &q.peer_chat_id, MAX_PEER_CHAT_ID_BYTES)?;
        if q.channel_name.is_empty() && !q.peer_chat_id.is_empty() {
            return Err(Status::invalid_argument("peer_chat_id needs a channel_name"));
        }
        let (sql, args) = list_query(&q, cursor, limit);
        let mut rows = self
            .db
            .read(move |c| {
                let mut st = c.prepare_cached(&sql)?;
                let rows = st.query_map(rusqlite::params_from_iter(args), conversation_from_row)?;
                Ok(rows.collect::<Result<Vec<_>, _>>()?)
            })
            .await?;
        let fits = within_budget(&rows, |c| c.encoded_len());
        let next_cursor = if rows.len() > limit as usize || fits < rows.len() {
            rows.truncate((limit as usize).min(fits));
            rows.last().map(encode_cursor).unwrap_or_default()
        } else {
            String::new()
        };
        Ok(Response::new(ListConversationsReply { conversations: rows, next_cursor }))
    }

    async fn get_conversation(&self, req: Request<ConversationRef>) -> Result<Response<ConversationRecord>, Status> {
        let id = req.into_inner().id;
        validate_id("id", &id)?;
        let c = self.db.read(move |c| require_conversation(c, &id)).await?;
        Ok(Response::new(c))
    }

    async fn update_conversation(
        &self,
        req: Request<UpdateConversationRequest>,
    ) -> Result<Response<ConversationRecord>, Status> {
        let r = req.into_inner();
        validate_id("id", &r.id)?;
        if let Some(title) = &r.title {
            validate_title(title)?;
        }
        if let Some(json) = &r.agent_config_json {
            validate_agent_config(json)?;
        }
        let expected = r.expected_version.map(|v| i64::try_from(v).unwrap_or(i64::MAX));
        let now = self.now();
        let (c, _) = self
            .db
            .write(move |t, _| {
                let cur = require_conversation(t, &r.id)?;
                if let Some(expected) = expected
                    && expected != cur.version as i64
                {
                    return Err(StoreError::Conflict {
                        what: format!("conversation {:?}", r.id),
                        expected,
                        current: cur.version as i64,
                    });
                }
                if r.title.is_none() && r.agent_config_json.is_none() && r.archived.is_none() {
                    // Nothing to change: the current record, version untouched.
                    return Ok(cur);
                }
                let archived_ms = match r.archived {
                    // Archiving an archived conversation keeps when it was archived.
                    Some(true) if cur.archived_ms != 0 => cur.archived_ms,
                    Some(true) => now.max(1),
                    Some(false) => 0,
                    None => cur.archived_ms,
                };
                let title = r.title.unwrap_or(cur.title);
                t.execute(
                    "UPDATE conversations SET title = ?2, title_fold = ?3, agent_config_json = ?4, archived_ms = ?5,
                            updated_ms = MAX(updated_ms, ?6), version = version + 1
                     WHERE id = ?1",
                    params![
                        r.id,
                        title,
                        title.to_lowercase(),
                        r.agent_config_json.unwrap_or(cur.agent_config_json),
                        archived_ms,
                        now
                    ],
                )?;
                require_conversation(t, &r.id)
            })
            .await?;
        Ok(Response::new(c))
    }

    async fn delete_conversation(
        &self,
        req: Request<ConversationRef>,
    ) -> Result<Response<ConversationDeleteReply>, Status> {
        let id = req.into_inner().id;
        validate_id("id", &id)?;
        let (removed, _) = self
            .db
            .write(move |t, _| {
                // Messages and pending items go with it (ON DELETE CASCADE), the title index row by
                // trigger: one transaction, no orphan.
                let n = t.execute("DELETE FROM conversations WHERE id = ?1", [&id])?;
                if n == 0 {
                    return Err(StoreError::NotFound(format!("conversation {id:?}")));
                }
                Ok(n as u64)
            })
            .await?;
        Ok(Response::new(ConversationDeleteReply { removed }))
    }

    async fn append_message(&self, req: Request<MessageRecord>) -> Result<Response<MessageRecord>, Status> {
        let m = validate_message(req.into_inner())?;
        let now = self.now();
        let (m, _) = self
            .db
            .write(move |t, _| {
                require_conversation(t, &m.conversation_id)?;
                insert_message(t, &m, now)
            })
            .await?;
        Ok(Response::new(m))
    }

    async fn start_turn(&self, req: Request<StartTurnRequest>) -> Result<Response<StartTurnReply>, Status> {
        let r = req.into_inner();
        let user = validate_message(r.user.ok_or_else(|| Status::invalid_argument("user is required"))?)?;
        let assistant =
            validate_message(r.assistant.ok_or_else(|| Status::invalid_argument("assistant is required"))?)?;
        if user.role != MessageRole::User || user.status == MessageStatus::Streaming {
            return Err(Status::invalid_argument("user must be a user message that is not streaming"));
        }
        if assistant.role != MessageRole::Assistant || assistant.status != MessageStatus::Streaming {
            return Err(Status::invalid_argument("assistant must be an assistant message with status streaming"));
        }
        if assistant.conversation_id != user.conversation_id {
            return Err(Status::invalid_argument("assistant.conversation_id differs from user.conversation_id"));
        }
        if assistant.id == user.id {
            return Err(Status::invalid_argument("assistant.id equals user.id"));
        }
        let item = r.pending_item_id;
        if !item.is_empty() {
            validate_id("pending_item_id", &item)?;
        }
        let now = self.now();
        let (reply, _) = self.db.write(move |t, _| start_turn(t, &user, &assistant, &item, now)).await?;
        Ok(Response::new(reply))
    }

    async fn update_message(&self, req: Request<MessageRecord>) -> Result<Response<MessageRecord>, Status> {
        let m = validate_message(req.into_inner())?;
        let now = self.now();
        let (m, _) = self
            .db
            .write(move |t, _| {
                let cur = get_message(t, &m.id)?.ok_or_else(|| StoreError::NotFound(format!("message {:?}", m.id)))?;
                if cur.conversation_id != m.conversation_id {
                    return Err(StoreError::NotFound(format!(
                        "message {:?} in conversation {:?}",
                        m.id, m.conversation_id
                    )));
                }
                t.prepare_cached(
                    "UPDATE messages SET status = ?2, blocks_json = ?3, input_tokens = ?4, output_tokens = ?5,
                            cache_read_tokens = ?6, cache_write_tokens = ?7, model = ?8, error = ?9, updated_ms = MAX(updated_ms, ?10),
                            files_changed_json = CASE WHEN ?11 = '' THEN files_changed_json ELSE ?11 END,
                            agent_key = CASE WHEN ?12 = '' THEN agent_key ELSE ?12 END,
                            connection = CASE WHEN ?12 = '' THEN connection ELSE ?13 END
                     WHERE id = ?1",
                )?
                .execute(params![
                    m.id,
                    m.status.as_str(),
                    m.blocks_json,
                    m.usage[0],
                    m.usage[1],
                    m.usage[2],
                    m.usage[3],
                    m.model,
                    m.error,
                    now,
                    m.files_changed_json,
                    m.agent_key,
                    m.connection
                ])?;
                t.prepare_cached("UPDATE conversations SET updated_ms = MAX(updated_ms, ?2) WHERE id = ?1")?
                    .execute(params![m.conversation_id, now])?;
                get_message(t, &m.id)?.ok_or_else(|| StoreError::NotFound(format!("message {:?}", m.id)))
            })
            .await?;
        Ok(Response::new(m))
    }

    async fn list_messages(&self, req: Request<ListMessagesRequest>) -> Result<Response<ListMessagesReply>, Status> {
        let q = req.into_inner();
        validate_id("conversation_id", &q.conversation_id)?;
        if !q.after_id.is_empty() {
            validate_id("after_id", &q.after_id)?;
        }
        let limit = if q.limit == 0 { DEFAULT_MESSAGE_PAGE } else { q.limit.min(MAX_MESSAGE_PAGE) };
        let reply = self
            .db
            .read(move |c| {
                require_conversation(c, &q.conversation_id)?;
                let after_pk: i64 = if q.after_id.is_empty() {
                    0
                } else {
                    let pk: i64 = c
                        .prepare_cached("SELECT pk FROM messages WHERE id = ?1 AND conversation_id = ?2")?
                        .query_row([&q.after_id, &q.conversation_id], |r| r.get(0))
                        .optional()?
                        .ok_or_else(|| {
                            StoreError::NotFound(format!(
                                "message {:?} (after_id) in conversation {:?}",
                                q.after_id, q.conversation_id
                            ))
                        })?;
                    // `inclusive`: `pk > pk - 1`, the cursor's own message first.
                    if q.inclusive { pk - 1 } else { pk }
                };
                let mut messages = if q.newest {
                    // The last `limit` after the cursor, read newest first and turned around.
                    let mut st = c.prepare_cached(&format!(
                        "SELECT {MSG_COLS} FROM messages WHERE conversation_id = ?1 AND pk > ?2 ORDER BY pk DESC LIMIT ?3"
                    ))?;
                    let mut v = st
                        .query_map(params![q.conversation_id, after_pk, limit as i64], message_from_row)?
                        .collect::<Result<Vec<_>, _>>()?;
                    // The newest that fit in a reply.
                    v.truncate(within_budget(&v, |m| m.encoded_len()));
                    v.reverse();
                    v
                } else {
                    let mut st = c.prepare_cached(&format!(
                        "SELECT {MSG_COLS} FROM messages WHERE conversation_id = ?1 AND pk > ?2 ORDER BY pk LIMIT ?3"
                    ))?;
                    st.query_map(params![q.conversation_id, after_pk, limit as i64 + 1], message_from_row)?
                        .collect::<Result<Vec<_>, _>>()?
                };
                let fits = within_budget(&messages, |m| m.encoded_len());
                // Newest pages end at the last message: nothing comes after them.
                let next_after_id = if !q.newest && (messages.len() > limit as usize || fits < messages.len()) {
                    messages.truncate((limit as usize).min(fits));
                    messages.last().map(|m| m.id.clone()).unwrap_or_default()
                } else {
                    String::new()
                };
                Ok(ListMessagesReply { messages, next_after_id })
            })
            .await?;
        Ok(Response::new(reply))
    }

    async fn fail_streaming_messages(
        &self,
        _: Request<FailStreamingMessagesRequest>,
    ) -> Result<Response<ConversationDeleteReply>, Status> {
        let now = self.now();
        let (removed, _) = self
            .db
            .write(move |t, _| {
                let rows: Vec<(i64, String, String, String)> = t
                    .prepare("SELECT pk, conversation_id, blocks_json, error FROM messages WHERE status = 'streaming'")?
                    .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
                    .collect::<Result<_, _>>()?;
                let mut update = t.prepare(
                    "UPDATE messages SET status = 'failed', blocks_json = ?2, error = ?3, updated_ms = ?4 WHERE pk = ?1",
                )?;
                let mut touch = t.prepare("UPDATE conversations SET updated_ms = MAX(updated_ms, ?2) WHERE id = ?1")?;
                for (pk, conversation, blocks_json, error) in &rows {
                    let mut blocks: Vec<StoredBlock> = serde_json::from_str(blocks_json).unwrap_or_default();
                    if !blocks.iter().any(|b| matches!(b, StoredBlock::Text { .. })) {
                        blocks.push(StoredBlock::Text { text: FAILED_BY_RESTART.to_owned() });
                    }
                    let error = if error.is_empty() { FAILED_BY_RESTART } else { error.as_str() };
                    let json = serde_json::to_string(&blocks).expect("blocks serialize");
                    update.execute(params![pk, json, error, now])?;
                    touch.execute(params![conversation, now])?;
                }
                Ok(rows.len() as u64)
            })
            .await?;
        if removed > 0 {
            tracing::info!(messages = removed, "Messages left streaming by a stopped chat service marked failed.");
        }
        Ok(Response::new(ConversationDeleteReply { removed }))
    }

    async fn set_pending(&self, req: Request<SetPendingRequest>) -> Result<Response<PendingRecord>, Status> {
        let r = req.into_inner();
        validate_id("conversation_id", &r.conversation_id)?;
        if r.items.len() > MAX_PENDING_ITEMS {
            return Err(Status::invalid_argument(format!(
                "items has {} entries; at most {MAX_PENDING_ITEMS}",
                r.items.len()
            )));
        }
        let total: usize = r.items.iter().map(|i| i.text.len()).sum();
        if total > MAX_PENDING_BYTES {
            return Err(Status::invalid_argument(format!(
                "items hold {total} bytes of text; at most {MAX_PENDING_BYTES} in one queue"
            )));
        }
        let mut seen = std::collections::HashSet::new();
        for (i, item) in r.items.iter().enumerate() {
            validate_id(&format!("items[{i}].id"), &item.id)?;
            if !seen.insert(item.id.as_str()) {
                return Err(Status::invalid_argument(format!("items[{i}].id {:?} appears twice", item.id)));
            }
            if item.text.is_empty() {
                return Err(Status::invalid_argument(format!("items[{i}].text is empty")));
            }
            check_len(&format!("items[{i}].text"), &item.text, MAX_PENDING_TEXT_BYTES)?;
            check_len(&format!("items[{i}].source"), &item.source, MAX_SOURCE_BYTES)?;
            if item.created_ms < 0 {
                return Err(Status::invalid_argument(format!("items[{i}].created_ms is negative")));
            }
        }
        let now = self.now();
        let (p, _) = self
            .db
            .write(move |t, _| {
                require_conversation(t, &r.conversation_id)?;
                // An item that already started its turn (StartTurn made it a message) queued
                // again would run twice.
                for (i, item) in r.items.iter().enumerate() {
                    if get_message(t, &item.id)?.is_some() {
                        return Err(StoreError::Invalid(format!(
                            "items[{i}].id {:?} is already a message (the item was sent); queue it again without an id",
                            item.id
                        )));
                    }
                }
                t.prepare_cached("DELETE FROM pending_items WHERE conversation_id = ?1")?
                    .execute([&r.conversation_id])?;
                let mut ins = t.prepare_cached(
                    "INSERT INTO pending_items (conversation_id, position, id, text, created_ms, source)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                )?;
                for (i, item) in r.items.iter().enumerate() {
                    let created = if item.created_ms == 0 { now } else { item.created_ms };
                    ins.execute(params![r.conversation_id, i as i64, item.id, item.text, created, item.source])?;
                }
                t.prepare_cached("UPDATE conversations SET pending_paused = ?2 WHERE id = ?1")?
                    .execute(params![r.conversation_id, r.paused as i64])?;
                pending_of(t, &r.conversation_id, r.paused)
            })
            .await?;
        Ok(Response::new(p))
    }

    async fn get_pending(&self, req: Request<ConversationRef>) -> Result<Response<PendingRecord>, Status> {
        let id = req.into_inner().id;
        validate_id("id", &id)?;
        let p = self
            .db
            .read(move |c| {
                let paused: Option<i64> = c
                    .prepare_cached("SELECT pending_paused FROM conversations WHERE id = ?1")?
                    .query_row([&id], |r| r.get(0))
                    .optional()?;
                let paused = paused.ok_or_else(|| StoreError::NotFound(format!("conversation {id:?}")))?;
                pending_of(c, &id, paused != 0)
            })
            .await?;
        Ok(Response::new(p))
    }

    async fn list_pending_queues(
        &self,
        _: Request<ListPendingQueuesRequest>,
    ) -> Result<Response<ListPendingQueuesReply>, Status> {
        let queues = self
            .db
            .read(|c| {
                let convs: Vec<(String, i64)> = c
                    .prepare_cached(
                        "SELECT id, pending_paused FROM conversations
                         WHERE id IN (SELECT conversation_id FROM pending_items) ORDER BY id",
                    )?
                    .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
                    .collect::<Result<_, _>>()?;
                convs.into_iter().map(|(id, paused)| pending_of(c, &id, paused != 0)).collect()
            })
            .await?;
        Ok(Response::new(ListPendingQueuesReply { queues }))
    }

    async fn reserve_event_seq(
        &self,
        req: Request<ReserveEventSeqRequest>,
    ) -> Result<Response<ReserveEventSeqReply>, Status> {
        let r = req.into_inner();
        validate_id("conversation_id", &r.conversation_id)?;
        if r.count == 0 || r.count > MAX_RESERVE {
            return Err(Status::invalid_argument(format!("count must be 1-{MAX_RESERVE}, not {}", r.count)));
        }
        let (first, _) = self
            .db
            .write(move |t, _| {
                // The high-water mark moves without touching version or updated_ms: reserving
                // numbers is not a change of the conversation.
                let last: Option<i64> = t
                    .prepare_cached(
                        "UPDATE conversations SET event_seq = event_seq + ?2 WHERE id = ?1 RETURNING event_seq",
                    )?
                    .query_row(params![r.conversation_id, r.count as i64], |row| row.get(0))
                    .optional()?;
                let last = last.ok_or_else(|| StoreError::NotFound(format!("conversation {:?}", r.conversation_id)))?;
                Ok((last - i64::from(r.count) + 1) as u64)
            })
            .await?;
        Ok(Response::new(ReserveEventSeqReply { first }))
    }

    async fn allow_tool(&self, req: Request<AllowToolRequest>) -> Result<Response<AllowedToolsRecord>, Status> {
        let r = req.into_inner();
        validate_id("conversation_id", &r.conversation_id)?;
        let tool = r.tool.unwrap_or_default();
        if tool.tool.is_empty() {
            return Err(StoreError::Invalid("tool.tool is empty".into()).into());
        }
        check_len("tool.tool", &tool.tool, MAX_ALLOWED_TOOL_BYTES)?;
        check_len("tool.decided_by", &tool.decided_by, MAX_ALLOWED_TOOL_BYTES)?;
        check_len("tool.actor", &tool.actor, MAX_ALLOWED_TOOL_BYTES)?;
        let allowed_ms = if tool.allowed_ms > 0 { tool.allowed_ms } else { self.now() };
        let (tools, _) = self
            .db
            .write(move |t, _| {
                require_conversation(t, &r.conversation_id)?;
                t.prepare_cached(
                    "INSERT INTO conversation_allowed_tools (conversation_id, tool, decided_by, actor, allowed_ms) \
                     VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (conversation_id, tool) DO UPDATE SET \
                     decided_by = excluded.decided_by, actor = excluded.actor, allowed_ms = excluded.allowed_ms",
                )?
                .execute(params![
                    r.conversation_id,
                    tool.tool,
                    tool.decided_by,
                    tool.actor,
                    allowed_ms
                ])?;
                allowed_tools_of(t, &r.conversation_id)
            })
            .await?;
        Ok(Response::new(AllowedToolsRecord { tools }))
    }

    async fn list_allowed_tools(&self, req: Request<ConversationRef>) -> Result<Response<AllowedToolsRecord>, Status> {
        let id = req.into_inner().id;
        validate_id("id", &id)?;
        let tools = self
            .db
            .read(move |c| {
                require_conversation(c, &id)?;
                allowed_tools_of(c, &id)
            })
            .await?;
        Ok(Response::new(AllowedToolsRecord { tools }))
    }

    async fn clear_allowed_tools(
        &self,
        req: Request<ConversationRef>,
    ) -> Result<Response<ConversationDeleteReply>, Status> {
        let id = req.into_inner().id;
        validate_id("id", &id)?;
        let (removed, _) = self
            .db
            .write(move |t, _| {
                require_conversation(t, &id)?;
                Ok(t.execute("DELETE FROM conversation_allowed_tools WHERE conversation_id = ?1", [&id])? as u64)
            })
            .await?;
        Ok(Response::new(ConversationDeleteReply { removed }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    /// 2026-01-31T00:00:00Z, where the tests' clock starts.
    const T0: i64 = 1_769_817_600_000;

    /// A clock that moves 1 ms forward at every reading, so that every write has its own time.
    fn ticking() -> Clock {
        let t = std::sync::Arc::new(std::sync::atomic::AtomicI64::new(T0));
        std::sync::Arc::new(move || t.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
    }

    fn service() -> (tempfile::TempDir, ConversationsService) {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("coffer.db")).unwrap();
        (dir, ConversationsService::with_clock(db, ticking()))
    }

    /// The `n`-th test id: a canonical ULID.
    fn id(n: u128) -> String {
        ulid::Ulid((1_700_000_000_000u128 << 80) | n).to_string()
    }

    fn conversation(n: u128, title: &str) -> ConversationRecord {
        ConversationRecord {
            id: id(n),
            agent_key: "claude_code".into(),
            title: title.into(),
            agent_config_json: r#"{"cwd":"/tmp","model":""}"#.into(),
            ..Default::default()
        }
    }

    async fn create(svc: &ConversationsService, c: ConversationRecord) -> Result<ConversationRecord, Status> {
        svc.create_conversation(Request::new(CreateConversationRequest { conversation: Some(c) }))
            .await
            .map(Response::into_inner)
    }

    fn text(t: &str) -> ContentBlockRecord {
        ContentBlockRecord { block: Some(content_block_record::Block::Text(t.into())) }
    }

    fn user(n: u128, conv: u128, t: &str) -> MessageRecord {
        MessageRecord {
            id: id(n),
            conversation_id: id(conv),
            role: MessageRole::User.into(),
            status: MessageStatus::Complete.into(),
            blocks: vec![text(t)],
            source: "cli".into(),
            ..Default::default()
        }
    }

    async fn append(svc: &ConversationsService, m: MessageRecord) -> Result<MessageRecord, Status> {
        svc.append_message(Request::new(m)).await.map(Response::into_inner)
    }

    async fn messages(
        svc: &ConversationsService,
        conv: u128,
        after: &str,
        limit: u32,
        newest: bool,
    ) -> ListMessagesReply {
        svc.list_messages(Request::new(ListMessagesRequest {
            conversation_id: id(conv),
            after_id: after.into(),
            limit,
            newest,
            inclusive: false,
        }))
        .await
        .unwrap()
        .into_inner()
    }

    async fn list(svc: &ConversationsService, q: ListConversationsRequest) -> Result<ListConversationsReply, Status> {
        svc.list_conversations(Request::new(q)).await.map(Response::into_inner)
    }

    async fn get(svc: &ConversationsService, n: u128) -> Result<ConversationRecord, Status> {
        svc.get_conversation(Request::new(ConversationRef { id: id(n) })).await.map(Response::into_inner)
    }

    async fn update(svc: &ConversationsService, r: UpdateConversationRequest) -> Result<ConversationRecord, Status> {
        svc.update_conversation(Request::new(r)).await.map(Response::into_inner)
    }

    /// Row counts of every conversations table, for "nothing half-written" checks.
    async fn counts(svc: &ConversationsService) -> [i64; 4] {
        svc.db
            .read(|c| {
                let n = |t: &str| c.query_row(&format!("SELECT COUNT(*) FROM {t}"), [], |r| r.get::<_, i64>(0));
                Ok([n("conversations")?, n("messages")?, n("pending_items")?, n("conversation_titles")?])
            })
            .await
            .unwrap()
    }

    #[test]
    fn ids_must_be_canonical_ulids() {
        validate_id("id", &id(1)).unwrap();
        validate_id("id", "7ZZZZZZZZZZZZZZZZZZZZZZZZZ").unwrap();
        let lower = id(1).to_lowercase();
        let slash = format!("{}/", &id(1)[..25]);
        for bad in [
            "",
            "01",
            "8ZZZZZZZZZZZZZZZZZZZZZZZZZ",
            lower.as_str(),
            slash.as_str(),
            "0000000000000000000000000I",
            "../../../../etc/passwd/xx",
        ] {
            let e = validate_id("conversation.id", bad).unwrap_err().to_string();
            assert!(e.starts_with("conversation.id ") && e.contains("is not a ULID"), "{bad}: {e}");
        }
    }

    #[tokio::test]
    async fn create_get_rename_archive_restore_delete() {
        let (_dir, svc) = service();
        let c = create(
            &svc,
            ConversationRecord {
                channel_name: "telegram".into(),
                peer_chat_id: "42".into(),
                ..conversation(1, "Fix the build")
            },
        )
        .await
        .unwrap();
        assert_eq!((c.version, c.message_count, c.last_message_ms, c.archived_ms), (1, 0, 0, 0));
        assert!(c.created_ms > 0 && c.updated_ms == c.created_ms);
        assert_eq!((c.channel_name.as_str(), c.peer_chat_id.as_str()), ("telegram", "42"));
        assert_eq!(get(&svc, 1).await.unwrap(), c);
        let e = create(&svc, conversation(1, "again")).await.unwrap_err();
        assert_eq!(
            (e.code(), e.message()),
            (Code::AlreadyExists, format!("conversation {:?} already exists", id(1)).as_str())
        );
        let e = get(&svc, 2).await.unwrap_err();
        assert_eq!((e.code(), e.message()), (Code::NotFound, format!("conversation {:?} not found", id(2)).as_str()));

        // Only the fields that are set change; each update bumps the version.
        let r =
            update(&svc, UpdateConversationRequest { id: id(1), title: Some("Renamed".into()), ..Default::default() })
                .await
                .unwrap();
        assert_eq!(
            (r.title.as_str(), r.version, r.agent_config_json.as_str()),
            ("Renamed", 2, c.agent_config_json.as_str())
        );
        let cfg = r#"{"cwd":"/tmp","model":"opus","session_id":"s1"}"#;
        let r = update(
            &svc,
            UpdateConversationRequest {
                id: id(1),
                expected_version: Some(2),
                agent_config_json: Some(cfg.into()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
        assert_eq!((r.title.as_str(), r.version, r.agent_config_json.as_str()), ("Renamed", 3, cfg));
        // A stale version is ABORTED and changes nothing.
        let e = update(
            &svc,
            UpdateConversationRequest {
                id: id(1),
                expected_version: Some(2),
                title: Some("lost".into()),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
        assert_eq!(e.code(), Code::Aborted);
        assert!(e.message().contains("expected 2, current 3"), "{}", e.message());
        assert_eq!(get(&svc, 1).await.unwrap().title, "Renamed");
        // Nothing set: the record as it is.
        assert_eq!(
            update(&svc, UpdateConversationRequest { id: id(1), ..Default::default() }).await.unwrap().version,
            3
        );

        let a = update(&svc, UpdateConversationRequest { id: id(1), archived: Some(true), ..Default::default() })
            .await
            .unwrap();
        assert!(a.archived_ms > 0 && a.version == 4);
        let again = update(&svc, UpdateConversationRequest { id: id(1), archived: Some(true), ..Default::default() })
            .await
            .unwrap();
        assert_eq!(again.archived_ms, a.archived_ms, "archiving twice keeps when it was archived");
        let r = update(&svc, UpdateConversationRequest { id: id(1), archived: Some(false), ..Default::default() })
            .await
            .unwrap();
        assert_eq!((r.archived_ms, r.version), (0, 6));
        let e = update(&svc, UpdateConversationRequest { id: id(9), title: Some("x".into()), ..Default::default() })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::NotFound);

        let del = |n| svc.delete_conversation(Request::new(ConversationRef { id: id(n) }));
        assert_eq!(del(1).await.unwrap().into_inner().removed, 1);
        assert_eq!(del(1).await.unwrap_err().code(), Code::NotFound);
        assert_eq!(counts(&svc).await, [0, 0, 0, 0]);
    }

    #[tokio::test]
    async fn hostile_conversation_fields_are_refused_naming_the_field_and_nothing_is_written() {
        let (_dir, svc) = service();
        let big_config = format!(r#"{{"cwd":"{}"}}"#, "a".repeat(MAX_AGENT_CONFIG_BYTES));
        let cases: Vec<(ConversationRecord, &str)> = vec![
            (ConversationRecord { id: "a/b".into(), ..conversation(1, "t") }, "conversation.id \"a/b\" is not a ULID"),
            (ConversationRecord { id: id(1).to_lowercase(), ..conversation(1, "t") }, "is not a ULID"),
            (ConversationRecord { agent_key: String::new(), ..conversation(1, "t") }, "agent_key \"\" must be"),
            (
                ConversationRecord { agent_key: "Claude Code".into(), ..conversation(1, "t") },
                "agent_key \"Claude Code\"",
            ),
            (conversation(1, &"é".repeat(201)), "title is 201 characters; at most 200"),
            (conversation(1, "nul\0"), "title contains a NUL byte"),
            (
                ConversationRecord { agent_config_json: "[1]".into(), ..conversation(1, "t") },
                "agent_config_json must be a JSON object",
            ),
            (
                ConversationRecord { agent_config_json: "{".into(), ..conversation(1, "t") },
                "agent_config_json is not JSON",
            ),
            (
                ConversationRecord { agent_config_json: big_config.clone(), ..conversation(1, "t") },
                "agent_config_json is 65546 bytes; at most 65536",
            ),
            (
                ConversationRecord { peer_chat_id: "42".into(), ..conversation(1, "t") },
                "peer_chat_id needs a channel_name",
            ),
            (
                ConversationRecord { channel_name: "c".repeat(65), ..conversation(1, "t") },
                "channel_name is 65 bytes; at most 64",
            ),
        ];
        for (c, want) in cases {
            let e = create(&svc, c).await.unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument, "{want}");
            assert!(e.message().contains(want), "{:?} does not say {want:?}", e.message());
        }
        let e =
            svc.create_conversation(Request::new(CreateConversationRequest { conversation: None })).await.unwrap_err();
        assert_eq!((e.code(), e.message()), (Code::InvalidArgument, "conversation is required"));
        assert_eq!(counts(&svc).await, [0, 0, 0, 0]);
        // 200 characters of a multi-byte script are fine.
        create(&svc, conversation(1, &"é".repeat(200))).await.unwrap();
        let e =
            update(&svc, UpdateConversationRequest { id: id(1), title: Some("x".repeat(201)), ..Default::default() })
                .await
                .unwrap_err();
        assert_eq!((e.code(), e.message()), (Code::InvalidArgument, "title is 201 characters; at most 200"));
        let e = update(
            &svc,
            UpdateConversationRequest { id: id(1), agent_config_json: Some(big_config), ..Default::default() },
        )
        .await
        .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        let e =
            update(&svc, UpdateConversationRequest { id: "x/../y".into(), ..Default::default() }).await.unwrap_err();
        assert_eq!(
            (e.code(), e.message()),
            (Code::InvalidArgument, "id \"x/../y\" is not a ULID (26 uppercase Crockford base-32 characters)")
        );
        assert_eq!(get(&svc, 1).await.unwrap().version, 1);
    }

    #[tokio::test]
    async fn list_pages_newest_first_and_filters() {
        let (_dir, svc) = service();
        for n in 1..=7u128 {
            create(&svc, conversation(n, &format!("Talk {n}"))).await.unwrap();
        }
        // Activity order: a message moves a conversation to the front.
        append(&svc, user(100, 3, "hi")).await.unwrap();
        update(&svc, UpdateConversationRequest { id: id(5), archived: Some(true), ..Default::default() })
            .await
            .unwrap();
        let all = list(&svc, ListConversationsRequest::default()).await.unwrap().conversations;
        assert_eq!(all.len(), 7);
        let mut expected = all.clone();
        expected.sort_by(|a, b| (b.updated_ms, &b.id).cmp(&(a.updated_ms, &a.id)));
        assert_eq!(all, expected, "updated_ms desc, id desc");
        assert_eq!(all[0].id, id(5), "archiving is an update");
        assert_eq!(all[1].id, id(3));

        // Pages of 3 walk the same order with no gap or repeat.
        let mut walked = Vec::new();
        let mut cursor = String::new();
        loop {
            let page = list(&svc, ListConversationsRequest { limit: 3, cursor: cursor.clone(), ..Default::default() })
                .await
                .unwrap();
            assert!(page.conversations.len() <= 3);
            walked.extend(page.conversations);
            if page.next_cursor.is_empty() {
                break;
            }
            cursor = page.next_cursor;
        }
        assert_eq!(walked, all);

        let active =
            list(&svc, ListConversationsRequest { archived: ArchivedFilter::Active.into(), ..Default::default() })
                .await
                .unwrap();
        assert_eq!(active.conversations.len(), 6);
        assert!(active.conversations.iter().all(|c| c.archived_ms == 0));
        let archived =
            list(&svc, ListConversationsRequest { archived: ArchivedFilter::Archived.into(), ..Default::default() })
                .await
                .unwrap();
        assert_eq!(archived.conversations.iter().map(|c| c.id.clone()).collect::<Vec<_>>(), [id(5)]);

        for bad in ["nope", "12.x", "x.01", &format!("abc.{}", id(1))] {
            let e =
                list(&svc, ListConversationsRequest { cursor: bad.into(), ..Default::default() }).await.unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument, "{bad}");
            assert!(e.message().starts_with("cursor "), "{}", e.message());
        }
        // limit is clamped, not refused.
        assert_eq!(
            list(&svc, ListConversationsRequest { limit: 100_000, ..Default::default() })
                .await
                .unwrap()
                .conversations
                .len(),
            7
        );
    }

    #[tokio::test]
    async fn title_search_is_a_case_insensitive_substring_and_user_text_is_not_syntax() {
        let (_dir, svc) = service();
        let titles =
            ["Über die Straße", "Fix the BUILD", "rebuild cache", "say \"hi\" OR *", "日本語のテスト", "a_b%c"];
        for (i, t) in titles.iter().enumerate() {
            create(&svc, conversation(i as u128 + 1, t)).await.unwrap();
        }
        let search = |needle: &str| {
            let q = ListConversationsRequest { title_contains: needle.into(), ..Default::default() };
            let svc = &svc;
            async move {
                let mut v: Vec<String> =
                    list(svc, q).await.unwrap().conversations.into_iter().map(|c| c.title).collect();
                v.sort();
                v
            }
        };
        assert_eq!(search("build").await, ["Fix the BUILD", "rebuild cache"]);
        assert_eq!(search("BUILD").await, ["Fix the BUILD", "rebuild cache"]);
        assert_eq!(search("über").await, ["Über die Straße"]);
        assert_eq!(search("STRASSE").await, Vec::<String>::new(), "folding is lowercase, not full case folding");
        assert_eq!(search("straße").await, ["Über die Straße"]);
        assert_eq!(search("\"hi\" or").await, ["say \"hi\" OR *"]);
        assert_eq!(search("OR *").await, ["say \"hi\" OR *"]);
        assert_eq!(search("テスト").await, ["日本語のテスト"]);
        // One or two characters: the same semantics by a scan.
        assert_eq!(search("日本").await, ["日本語のテスト"]);
        assert_eq!(search("%").await, ["a_b%c"]);
        assert_eq!(search("_").await, ["a_b%c"]);
        assert_eq!(search("ü").await, ["Über die Straße"]);
        assert_eq!(search("zzz").await, Vec::<String>::new());
        // A renamed conversation is found by its new title only.
        update(&svc, UpdateConversationRequest { id: id(3), title: Some("warm caches".into()), ..Default::default() })
            .await
            .unwrap();
        assert_eq!(search("build").await, ["Fix the BUILD"]);
        assert_eq!(search("warm").await, ["warm caches"]);
    }

    /// `EXPLAIN QUERY PLAN` of `sql` with `args`, one line per step.
    async fn plan(svc: &ConversationsService, sql: String, args: Vec<rusqlite::types::Value>) -> String {
        svc.db
            .read(move |c| {
                let mut st = c.prepare(&format!("EXPLAIN QUERY PLAN {sql}"))?;
                let rows = st.query_map(rusqlite::params_from_iter(args), |r| r.get::<_, String>(3))?;
                Ok(rows.collect::<Result<Vec<_>, _>>()?.join("\n"))
            })
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn list_and_retention_queries_use_their_indexes() {
        let (_dir, svc) = service();
        let page = ListConversationsRequest::default();
        let (sql, args) = list_query(&page, Some((T0, id(1))), 50);
        let p = plan(&svc, sql, args).await;
        assert!(p.contains("conversations_recent") && !p.contains("TEMP B-TREE"), "{p}");
        let active = ListConversationsRequest { archived: ArchivedFilter::Active.into(), ..Default::default() };
        let (sql, args) = list_query(&active, None, 50);
        let p = plan(&svc, sql, args).await;
        assert!(p.contains("conversations_recent") && !p.contains("TEMP B-TREE"), "{p}");
        let chat = ListConversationsRequest {
            channel_name: "telegram".into(),
            peer_chat_id: "42".into(),
            ..Default::default()
        };
        let (sql, args) = list_query(&chat, None, 1);
        let p = plan(&svc, sql, args).await;
        assert!(p.contains("conversations_channel"), "{p}");
        let search = ListConversationsRequest { title_contains: "build".into(), ..Default::default() };
        let (sql, args) = list_query(&search, None, 50);
        let p = plan(&svc, sql, args).await;
        assert!(p.contains("conversation_titles VIRTUAL TABLE INDEX"), "{p}");
        let archive = "EXPLAIN QUERY PLAN SELECT pk FROM conversations
                       WHERE archived_ms = 0 AND MAX(last_message_ms, created_ms) < 5 AND updated_ms < 5 LIMIT 100";
        let p = plan(&svc, archive.replace("EXPLAIN QUERY PLAN ", ""), vec![]).await;
        assert!(p.contains("conversations_active_idle"), "{p}");
        let delete = "SELECT pk FROM conversations WHERE archived_ms <> 0 AND archived_ms < 5 LIMIT 100";
        let p = plan(&svc, delete.into(), vec![]).await;
        assert!(p.contains("conversations_archived"), "{p}");
        let streaming = "SELECT pk FROM messages WHERE status = 'streaming'";
        let p = plan(&svc, streaming.into(), vec![]).await;
        assert!(p.contains("messages_streaming"), "{p}");
    }

    #[tokio::test]
    async fn channel_binding_lookup() {
        let (_dir, svc) = service();
        let bound = |n, ch: &str, peer: &str| ConversationRecord {
            channel_name: ch.into(),
            peer_chat_id: peer.into(),
            ..conversation(n, "t")
        };
        create(&svc, bound(1, "telegram", "42")).await.unwrap();
        create(&svc, bound(2, "telegram", "43")).await.unwrap();
        create(&svc, bound(3, "seatalk", "42")).await.unwrap();
        create(&svc, conversation(4, "t")).await.unwrap();
        let ids = |r: ListConversationsReply| r.conversations.into_iter().map(|c| c.id).collect::<Vec<_>>();
        let q = |ch: &str, peer: &str| ListConversationsRequest {
            channel_name: ch.into(),
            peer_chat_id: peer.into(),
            ..Default::default()
        };
        assert_eq!(ids(list(&svc, q("telegram", "42")).await.unwrap()), [id(1)]);
        assert_eq!(ids(list(&svc, q("telegram", "")).await.unwrap()), [id(2), id(1)]);
        assert_eq!(list(&svc, q("", "")).await.unwrap().conversations.len(), 4);
        let e = list(&svc, q("", "42")).await.unwrap_err();
        assert_eq!((e.code(), e.message()), (Code::InvalidArgument, "peer_chat_id needs a channel_name"));
    }

    #[tokio::test]
    async fn messages_append_update_and_page() {
        let (_dir, svc) = service();
        let c = create(&svc, conversation(1, "t")).await.unwrap();
        let m = append(&svc, user(10, 1, "hello")).await.unwrap();
        assert!(m.created_ms > 0 && m.updated_ms == m.created_ms);
        assert_eq!((m.role(), m.status(), m.source.as_str()), (MessageRole::User, MessageStatus::Complete, "cli"));
        let after = get(&svc, 1).await.unwrap();
        assert_eq!((after.message_count, after.version), (1, 1), "appending does not bump the version");
        assert!(after.last_message_ms >= c.created_ms && after.updated_ms >= c.updated_ms);

        // The turn's assistant message: created streaming with no block, then finalised.
        let streaming = MessageRecord {
            id: id(11),
            conversation_id: id(1),
            role: MessageRole::Assistant.into(),
            status: MessageStatus::Streaming.into(),
            ..Default::default()
        };
        append(&svc, streaming.clone()).await.unwrap();
        let tool_use = ContentBlockRecord {
            block: Some(content_block_record::Block::ToolUse(ToolUseRecord {
                id: "toolu_1".into(),
                name: "mcp__coffer__coffer__search_tools".into(),
                input_json: r#"{"query":"files"}"#.into(),
            })),
        };
        let tool_result = ContentBlockRecord {
            block: Some(content_block_record::Block::ToolResult(ToolResultRecord {
                tool_use_id: "toolu_1".into(),
                output: "3 tools".into(),
                is_error: true,
            })),
        };
        let done = MessageRecord {
            status: MessageStatus::Complete.into(),
            blocks: vec![text("Looking."), tool_use, tool_result, text("Done.")],
            usage: Some(UsageRecord {
                input_tokens: 10,
                output_tokens: 20,
                cache_read_tokens: 3,
                cache_write_tokens: 4,
            }),
            model: "claude-sonnet".into(),
            ..streaming.clone()
        };
        let u = svc.update_message(Request::new(done.clone())).await.unwrap().into_inner();
        assert_eq!(
            (u.blocks.clone(), u.usage, u.model.as_str(), u.status()),
            (done.blocks.clone(), done.usage, "claude-sonnet", MessageStatus::Complete)
        );
        assert_eq!(u.created_ms, messages(&svc, 1, "", 0, false).await.messages[1].created_ms);
        // UpdateMessage finds messages by id within their conversation.
        create(&svc, conversation(2, "other")).await.unwrap();
        let e = svc
            .update_message(Request::new(MessageRecord { conversation_id: id(2), ..done.clone() }))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::NotFound);
        let e = svc.update_message(Request::new(MessageRecord { id: id(99), ..done })).await.unwrap_err();
        assert_eq!((e.code(), e.message()), (Code::NotFound, format!("message {:?} not found", id(99)).as_str()));

        for n in 12..40u128 {
            append(&svc, user(n, 1, &format!("m{n}"))).await.unwrap();
        }
        let all = messages(&svc, 1, "", 500, false).await;
        assert_eq!(all.messages.len(), 30);
        assert!(all.next_after_id.is_empty());
        assert_eq!(all.messages[1].blocks.len(), 4);
        // Pages of 7 from the first, then the newest 5 (oldest first).
        let mut walked = Vec::new();
        let mut after = String::new();
        loop {
            let page = messages(&svc, 1, &after, 7, false).await;
            walked.extend(page.messages.into_iter().map(|m| m.id));
            if page.next_after_id.is_empty() {
                break;
            }
            after = page.next_after_id;
        }
        assert_eq!(walked, all.messages.iter().map(|m| m.id.clone()).collect::<Vec<_>>());
        let newest = messages(&svc, 1, "", 5, true).await;
        assert_eq!(
            newest.messages.iter().map(|m| m.id.clone()).collect::<Vec<_>>(),
            (35..40u128).map(id).collect::<Vec<_>>()
        );
        assert!(newest.next_after_id.is_empty());
        // `inclusive`: the page starts at the cursor itself (a message read by its id).
        let one = |after: u128, inclusive: bool| {
            svc.list_messages(Request::new(ListMessagesRequest {
                conversation_id: id(1),
                after_id: id(after),
                limit: 1,
                inclusive,
                ..Default::default()
            }))
        };
        let page = one(20, true).await.unwrap().into_inner();
        assert_eq!(page.messages.iter().map(|m| m.id.clone()).collect::<Vec<_>>(), [id(20)]);
        assert_eq!(page.next_after_id, id(20));
        assert_eq!(one(20, false).await.unwrap().into_inner().messages[0].id, id(21));
        assert_eq!(one(500, true).await.unwrap_err().code(), Code::NotFound);

        // Cursors and conversations that do not exist.
        let e = svc
            .list_messages(Request::new(ListMessagesRequest {
                conversation_id: id(1),
                after_id: id(500),
                ..Default::default()
            }))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::NotFound);
        let e = svc
            .list_messages(Request::new(ListMessagesRequest {
                conversation_id: id(2),
                after_id: id(12),
                ..Default::default()
            }))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::NotFound, "a cursor of another conversation");
        let e = svc
            .list_messages(Request::new(ListMessagesRequest { conversation_id: id(3), ..Default::default() }))
            .await
            .unwrap_err();
        assert_eq!((e.code(), e.message()), (Code::NotFound, format!("conversation {:?} not found", id(3)).as_str()));
        let e = append(&svc, user(600, 3, "lost")).await.unwrap_err();
        assert_eq!(e.code(), Code::NotFound);
        let e = append(&svc, user(12, 1, "reused id")).await.unwrap_err();
        assert_eq!(e.code(), Code::AlreadyExists);
        assert_eq!(get(&svc, 1).await.unwrap().message_count, 30);

        // A message dated in the future keeps its date, but the conversation's last activity is
        // now, so it can still go idle.
        let future = MessageRecord { created_ms: T0 + 365 * 86_400_000, ..user(40, 1, "from the future") };
        assert_eq!(append(&svc, future).await.unwrap().created_ms, T0 + 365 * 86_400_000);
        let c = get(&svc, 1).await.unwrap();
        assert!(c.last_message_ms < T0 + 86_400_000, "{}", c.last_message_ms);
    }

    #[tokio::test]
    async fn hostile_messages_are_refused_naming_the_field() {
        let (_dir, svc) = service();
        create(&svc, conversation(1, "t")).await.unwrap();
        let block = |b| ContentBlockRecord { block: Some(b) };
        let tool = |name: &str, input: &str| {
            block(content_block_record::Block::ToolUse(ToolUseRecord {
                id: "t".into(),
                name: name.into(),
                input_json: input.into(),
            }))
        };
        let cases: Vec<(MessageRecord, &str)> = vec![
            (MessageRecord { id: "../x".into(), ..user(2, 1, "x") }, "message.id \"../x\" is not a ULID"),
            (
                MessageRecord { conversation_id: "C/1".into(), ..user(2, 1, "x") },
                "message.conversation_id \"C/1\" is not a ULID",
            ),
            (MessageRecord { role: 0, ..user(2, 1, "x") }, "message.role is required"),
            (MessageRecord { role: 7, ..user(2, 1, "x") }, "message.role is required"),
            (MessageRecord { status: 0, ..user(2, 1, "x") }, "message.status is required"),
            (MessageRecord { blocks: vec![], ..user(2, 1, "x") }, "message.blocks is empty"),
            (
                MessageRecord { status: MessageStatus::Failed.into(), blocks: vec![], ..user(2, 1, "x") },
                "message.blocks is empty",
            ),
            (
                MessageRecord { blocks: vec![text("a"), ContentBlockRecord { block: None }], ..user(2, 1, "x") },
                "message.blocks[1] has no text",
            ),
            (
                MessageRecord { blocks: vec![tool("", "{}")], ..user(2, 1, "x") },
                "message.blocks[0].tool_use.name is empty",
            ),
            (
                MessageRecord { blocks: vec![tool("Bash", "{not json")], ..user(2, 1, "x") },
                "message.blocks[0].tool_use.input_json is not JSON",
            ),
            (
                MessageRecord { blocks: vec![text(&"x".repeat(MAX_MESSAGE_BYTES + 1))], ..user(2, 1, "x") },
                "message.blocks hold more than 8388608 bytes",
            ),
            (
                MessageRecord { blocks: vec![text("x"); MAX_BLOCKS + 1], ..user(2, 1, "x") },
                "message.blocks has 10001 blocks; at most 10000",
            ),
            (MessageRecord { model: "m".repeat(300), ..user(2, 1, "x") }, "message.model is 300 bytes; at most 256"),
            (
                MessageRecord { error: "e".repeat(MAX_ERROR_BYTES + 1), ..user(2, 1, "x") },
                "message.error is 65537 bytes",
            ),
            (MessageRecord { created_ms: -1, ..user(2, 1, "x") }, "message.created_ms -1 is negative"),
            (
                MessageRecord {
                    usage: Some(UsageRecord { output_tokens: u64::MAX, ..Default::default() }),
                    ..user(2, 1, "x")
                },
                "message.usage.output_tokens is too large",
            ),
        ];
        for (m, want) in cases {
            let e = append(&svc, m.clone()).await.unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument, "{want}");
            assert!(e.message().contains(want), "{:?} does not say {want:?}", e.message());
        }
        assert_eq!(counts(&svc).await, [1, 0, 0, 1]);
        // A failed message may carry only its error; a 1 MiB text stores and reads back whole.
        let failed = MessageRecord {
            role: MessageRole::Assistant.into(),
            status: MessageStatus::Failed.into(),
            blocks: vec![],
            error: "Claude Code exited with status 1".into(),
            ..user(2, 1, "x")
        };
        append(&svc, failed).await.unwrap();
        let big = "ü".repeat(512 * 1024);
        assert_eq!(big.len(), 1024 * 1024);
        append(&svc, user(3, 1, &big)).await.unwrap();
        let back = messages(&svc, 1, "", 0, false).await.messages;
        assert_eq!(back[1].blocks, vec![text(&big)]);
        assert_eq!(back[0].error, "Claude Code exited with status 1");
    }

    #[tokio::test]
    async fn a_page_stops_before_the_reply_budget() {
        let (_dir, svc) = service();
        create(&svc, conversation(1, "t")).await.unwrap();
        let big = "x".repeat(3 * 1024 * 1024);
        for n in 10..15u128 {
            append(&svc, user(n, 1, &big)).await.unwrap();
        }
        // 5 × 3 MiB: two per page (6 MiB), never the 15 MiB that tonic clients refuse.
        let page = messages(&svc, 1, "", 100, false).await;
        assert_eq!(page.messages.len(), 2);
        assert_eq!(page.next_after_id, id(11));
        let page = messages(&svc, 1, &id(11), 100, false).await;
        assert_eq!((page.messages.len(), page.next_after_id.as_str()), (2, id(13).as_str()));
        let page = messages(&svc, 1, &id(13), 100, false).await;
        assert_eq!((page.messages.len(), page.next_after_id.as_str()), (1, ""));
        let newest = messages(&svc, 1, "", 100, true).await;
        assert_eq!(newest.messages.iter().map(|m| m.id.clone()).collect::<Vec<_>>(), [id(13), id(14)]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn twenty_concurrent_appenders_keep_their_order_and_count() {
        let (_dir, svc) = service();
        create(&svc, conversation(1, "t")).await.unwrap();
        let svc = std::sync::Arc::new(svc);
        let mut tasks = tokio::task::JoinSet::new();
        for task in 0..20u128 {
            let svc = svc.clone();
            tasks.spawn(async move {
                for i in 0..10u128 {
                    append(&svc, user(1000 + task * 100 + i, 1, &format!("{task}:{i}"))).await.unwrap();
                }
            });
        }
        while let Some(r) = tasks.join_next().await {
            r.unwrap();
        }
        let mut all = Vec::new();
        let mut after = String::new();
        loop {
            let page = messages(&svc, 1, &after, 37, false).await;
            all.extend(page.messages);
            if page.next_after_id.is_empty() {
                break;
            }
            after = page.next_after_id;
        }
        assert_eq!(all.len(), 200);
        assert_eq!(get(&svc, 1).await.unwrap().message_count, 200);
        let mut next = [0u32; 20];
        for m in &all {
            let Some(content_block_record::Block::Text(t)) = &m.blocks[0].block else { panic!("text") };
            let (task, i) = t.split_once(':').unwrap();
            let (task, i): (usize, u32) = (task.parse().unwrap(), i.parse().unwrap());
            assert_eq!(i, next[task], "task {task}'s messages are out of order");
            next[task] += 1;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn of_ten_concurrent_renames_at_one_version_exactly_one_wins() {
        let (_dir, svc) = service();
        create(&svc, conversation(1, "t")).await.unwrap();
        let svc = std::sync::Arc::new(svc);
        let mut tasks = tokio::task::JoinSet::new();
        for n in 0..10 {
            let svc = svc.clone();
            tasks.spawn(async move {
                let r = UpdateConversationRequest {
                    id: id(1),
                    expected_version: Some(1),
                    title: Some(format!("title {n}")),
                    ..Default::default()
                };
                update(&svc, r).await
            });
        }
        let mut won = Vec::new();
        while let Some(r) = tasks.join_next().await {
            match r.unwrap() {
                Ok(c) => won.push(c.title),
                Err(e) => assert_eq!(e.code(), Code::Aborted, "{e:?}"),
            }
        }
        assert_eq!(won.len(), 1, "{won:?}");
        let c = get(&svc, 1).await.unwrap();
        assert_eq!((c.title.as_str(), c.version), (won[0].as_str(), 2));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_delete_racing_appends_leaves_no_orphan_message() {
        let (_dir, svc) = service();
        create(&svc, conversation(1, "t")).await.unwrap();
        let svc = std::sync::Arc::new(svc);
        let mut tasks = tokio::task::JoinSet::new();
        for task in 0..5u128 {
            let svc = svc.clone();
            tasks.spawn(async move {
                let mut refused = 0;
                for i in 0..20u128 {
                    match append(&svc, user(1000 + task * 100 + i, 1, "x")).await {
                        Ok(_) => {}
                        Err(e) => {
                            assert_eq!(e.code(), Code::NotFound, "{e:?}");
                            refused += 1;
                        }
                    }
                }
                refused
            });
        }
        // Once some appends have landed, delete in the middle of the others.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while get(&svc, 1).await.unwrap().message_count < 10 {
            assert!(std::time::Instant::now() < deadline, "no append landed");
            tokio::task::yield_now().await;
        }
        svc.delete_conversation(Request::new(ConversationRef { id: id(1) })).await.unwrap();
        let mut refused = 0;
        while let Some(r) = tasks.join_next().await {
            refused += r.unwrap();
        }
        assert_eq!(counts(&svc).await, [0, 0, 0, 0], "{refused} appends refused after the delete");
    }

    #[tokio::test]
    async fn delete_leaves_no_orphan_rows() {
        let (_dir, svc) = service();
        create(&svc, conversation(1, "doomed")).await.unwrap();
        create(&svc, conversation(2, "kept")).await.unwrap();
        for n in 0..5u128 {
            append(&svc, user(10 + n, 1, "x")).await.unwrap();
        }
        append(&svc, user(20, 2, "x")).await.unwrap();
        let item = |n| PendingItemRecord { id: id(n), text: "later".into(), ..Default::default() };
        svc.set_pending(Request::new(SetPendingRequest {
            conversation_id: id(1),
            items: vec![item(30), item(31)],
            paused: true,
        }))
        .await
        .unwrap();
        svc.reserve_event_seq(Request::new(ReserveEventSeqRequest { conversation_id: id(1), count: 10 }))
            .await
            .unwrap();
        assert_eq!(counts(&svc).await, [2, 6, 2, 2]);
        svc.delete_conversation(Request::new(ConversationRef { id: id(1) })).await.unwrap();
        assert_eq!(counts(&svc).await, [1, 1, 0, 1]);
        let found = list(&svc, ListConversationsRequest { title_contains: "doomed".into(), ..Default::default() })
            .await
            .unwrap();
        assert!(found.conversations.is_empty());
        assert!(
            svc.list_pending_queues(Request::new(ListPendingQueuesRequest {}))
                .await
                .unwrap()
                .into_inner()
                .queues
                .is_empty()
        );
        // The id may be used again, from a clean slate.
        create(&svc, conversation(1, "reborn")).await.unwrap();
        assert_eq!(messages(&svc, 1, "", 0, false).await.messages.len(), 0);
    }

    #[tokio::test]
    async fn streaming_messages_fail_at_restart() {
        let (_dir, svc) = service();
        create(&svc, conversation(1, "t")).await.unwrap();
        let assistant = |n, status: MessageStatus, blocks| MessageRecord {
            id: id(n),
            conversation_id: id(1),
            role: MessageRole::Assistant.into(),
            status: status.into(),
            blocks,
            ..Default::default()
        };
        append(&svc, assistant(10, MessageStatus::Streaming, vec![])).await.unwrap();
        append(&svc, assistant(11, MessageStatus::Streaming, vec![text("half a sen")])).await.unwrap();
        append(&svc, assistant(12, MessageStatus::Complete, vec![text("whole")])).await.unwrap();
        let n = svc
            .fail_streaming_messages(Request::new(FailStreamingMessagesRequest {}))
            .await
            .unwrap()
            .into_inner()
            .removed;
        assert_eq!(n, 2);
        let m = messages(&svc, 1, "", 0, false).await.messages;
        assert_eq!(
            m.iter().map(|m| m.status()).collect::<Vec<_>>(),
            [MessageStatus::Failed, MessageStatus::Failed, MessageStatus::Complete]
        );
        assert_eq!(m[0].blocks, vec![text(FAILED_BY_RESTART)]);
        assert_eq!(m[1].blocks, vec![text("half a sen")], "a message with text keeps it as it was");
        assert_eq!((m[0].error.as_str(), m[1].error.as_str()), (FAILED_BY_RESTART, FAILED_BY_RESTART));
        assert_eq!(m[2].error, "");
        let again =
            svc.fail_streaming_messages(Request::new(FailStreamingMessagesRequest {})).await.unwrap().into_inner();
        assert_eq!(again.removed, 0);
    }

    #[tokio::test]
    async fn the_pending_queue_is_replaced_whole() {
        let (_dir, svc) = service();
        create(&svc, conversation(1, "t")).await.unwrap();
        create(&svc, conversation(2, "t")).await.unwrap();
        let item = |n, t: &str| PendingItemRecord { id: id(n), text: t.into(), created_ms: 0, source: "web".into() };
        let set = |conv, items, paused| {
            svc.set_pending(Request::new(SetPendingRequest { conversation_id: id(conv), items, paused }))
        };
        let p = svc.get_pending(Request::new(ConversationRef { id: id(1) })).await.unwrap().into_inner();
        assert_eq!((p.items.len(), p.paused), (0, false));
        let p = set(1, vec![item(10, "one"), item(11, "two"), item(12, "three")], false).await.unwrap().into_inner();
        assert_eq!(p.items.iter().map(|i| i.text.as_str()).collect::<Vec<_>>(), ["one", "two", "three"]);
        assert!(p.items.iter().all(|i| i.created_ms > 0 && i.source == "web"));
        // Reordered and one dropped, paused.
        let p = set(1, vec![p.items[2].clone(), p.items[0].clone()], true).await.unwrap().into_inner();
        let got = svc.get_pending(Request::new(ConversationRef { id: id(1) })).await.unwrap().into_inner();
        assert_eq!(got, p);
        assert_eq!(
            (got.items.iter().map(|i| i.text.as_str()).collect::<Vec<_>>(), got.paused),
            (vec!["three", "one"], true)
        );
        set(2, vec![item(20, "x")], false).await.unwrap();
        let queues =
            svc.list_pending_queues(Request::new(ListPendingQueuesRequest {})).await.unwrap().into_inner().queues;
        assert_eq!(
            queues.iter().map(|q| (q.conversation_id.clone(), q.items.len(), q.paused)).collect::<Vec<_>>(),
            [(id(1), 2, true), (id(2), 1, false)]
        );
        set(2, vec![], false).await.unwrap();
        assert_eq!(
            svc.list_pending_queues(Request::new(ListPendingQueuesRequest {})).await.unwrap().into_inner().queues.len(),
            1
        );

        // Bad queues change nothing.
        let cases: Vec<(Vec<PendingItemRecord>, &str)> = vec![
            (vec![item(10, "a"), item(10, "b")], "items[1].id"),
            (vec![item(10, "")], "items[0].text is empty"),
            (vec![PendingItemRecord { id: "x/y".into(), ..item(10, "a") }], "items[0].id \"x/y\" is not a ULID"),
            (
                vec![item(10, &"x".repeat(MAX_PENDING_TEXT_BYTES + 1))],
                "items[0].text is 1048577 bytes; at most 1048576",
            ),
            ((0..1001u128).map(|n| item(n + 100, "a")).collect(), "items has 1001 entries; at most 1000"),
        ];
        for (items, want) in cases {
            let e = set(1, items, false).await.unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument, "{want}");
            assert!(e.message().contains(want), "{:?} does not say {want:?}", e.message());
        }
        assert_eq!(svc.get_pending(Request::new(ConversationRef { id: id(1) })).await.unwrap().into_inner(), got);
        let e = set(1, (0..9u128).map(|n| item(n + 100, &"x".repeat(MAX_PENDING_TEXT_BYTES))).collect(), false)
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(e.message().contains("bytes of text; at most 8388608 in one queue"), "{}", e.message());
        set(1, vec![item(10, &"x".repeat(MAX_PENDING_TEXT_BYTES))], true).await.unwrap();
        let e = set(3, vec![], false).await.unwrap_err();
        assert_eq!(e.code(), Code::NotFound);
        let e = svc.get_pending(Request::new(ConversationRef { id: id(3) })).await.unwrap_err();
        assert_eq!(e.code(), Code::NotFound);
    }

    /// `StartTurn`: a queued item becomes the turn's user message (same id) with its assistant
    /// record in one transaction; a retry changes nothing and says so; a failure half-way writes
    /// nothing (the item stays queued); an item that started cannot be queued again.
    #[tokio::test]
    async fn a_pending_item_starts_its_turn_in_one_transaction_and_a_retry_changes_nothing() {
        let (_dir, svc) = service();
        create(&svc, conversation(1, "t")).await.unwrap();
        create(&svc, conversation(2, "t")).await.unwrap();
        let item = |n, t: &str| PendingItemRecord { id: id(n), text: t.into(), created_ms: 0, source: "web".into() };
        let set =
            |items| svc.set_pending(Request::new(SetPendingRequest { conversation_id: id(1), items, paused: false }));
        let assistant = |n, conv| MessageRecord {
            id: id(n),
            conversation_id: id(conv),
            role: MessageRole::Assistant.into(),
            status: MessageStatus::Streaming.into(),
            ..Default::default()
        };
        let start = |u: MessageRecord, a: MessageRecord, item: Option<u128>| {
            svc.start_turn(Request::new(StartTurnRequest {
                user: Some(u),
                assistant: Some(a),
                pending_item_id: item.map(id).unwrap_or_default(),
            }))
        };
        let pending =
            || async { svc.get_pending(Request::new(ConversationRef { id: id(1) })).await.unwrap().into_inner() };
        let texts = |p: &PendingRecord| p.items.iter().map(|i| i.text.clone()).collect::<Vec<_>>();
        set(vec![item(10, "one"), item(11, "two")]).await.unwrap();
        let before = counts(&svc).await;

        // A failure half-way (the assistant's id is another conversation's message) rolls the
        // whole transaction back: the item is still queued, no user message was kept.
        append(&svc, user(90, 2, "elsewhere")).await.unwrap();
        let before = [before[0], before[1] + 1, before[2], before[3]];
        let e = start(user(10, 1, "one"), assistant(90, 1), Some(10)).await.unwrap_err();
        assert_eq!(e.code(), Code::AlreadyExists, "{e:?}");
        assert_eq!(counts(&svc).await, before, "nothing half-written");
        assert_eq!(texts(&pending().await), ["one", "two"]);

        // The move: both messages appended, the item gone, in one step.
        let r = start(user(10, 1, "one"), assistant(20, 1), Some(10)).await.unwrap().into_inner();
        assert!(!r.already);
        let (u, a) = (r.user.unwrap(), r.assistant.unwrap());
        assert_eq!(
            (u.id.as_str(), a.id.as_str(), a.status),
            (id(10).as_str(), id(20).as_str(), MessageStatus::Streaming as i32)
        );
        assert_eq!(texts(&pending().await), ["two"]);
        let page = messages(&svc, 1, "", 0, false).await.messages;
        assert_eq!(page.iter().map(|m| m.id.clone()).collect::<Vec<_>>(), [id(10), id(20)]);
        assert_eq!(get(&svc, 1).await.unwrap().message_count, 2);

        // The same request again (a reply lost to a restart): nothing written, the stored
        // records returned — also with another assistant id (a new attempt after a restart).
        for a in [20, 21] {
            let again = start(user(10, 1, "one"), assistant(a, 1), Some(10)).await.unwrap().into_inner();
            assert!(again.already);
            assert_eq!((again.user.unwrap().id, again.assistant.unwrap().id), (id(10), id(20)));
        }
        assert_eq!(messages(&svc, 1, "", 0, false).await.messages.len(), 2, "exactly once");
        assert_eq!(texts(&pending().await), ["two"]);

        // An item that started cannot be queued again; one that is not queued cannot start.
        let e = set(vec![item(10, "one"), item(11, "two")]).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(e.message().contains("items[0].id") && e.message().contains("already a message"), "{e:?}");
        let e = start(user(12, 1, "three"), assistant(22, 1), Some(12)).await.unwrap_err();
        assert_eq!(e.code(), Code::NotFound);
        assert!(e.message().contains(&id(12)), "{e:?}");
        assert_eq!(messages(&svc, 1, "", 0, false).await.messages.len(), 2);

        // Without an item (a message sent to an idle conversation); hostile shapes are refused.
        start(user(13, 1, "direct"), assistant(23, 1), None).await.unwrap();
        assert_eq!(texts(&pending().await), ["two"], "the queue is untouched");
        let cases = [
            (assistant(14, 1), assistant(24, 1), "user must be a user message"),
            (user(14, 1, "x"), user(24, 1, "y"), "assistant must be an assistant message"),
            (user(14, 1, "x"), assistant(24, 2), "conversation_id differs"),
            (user(14, 1, "x"), assistant(14, 1), "assistant.id equals user.id"),
        ];
        for (u, a, want) in cases {
            let e = start(u, a, None).await.unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument, "{want}");
            assert!(e.message().contains(want), "{:?} does not say {want:?}", e.message());
        }
        let e = start(user(14, 3, "x"), assistant(24, 3), None).await.unwrap_err();
        assert_eq!(e.code(), Code::NotFound);
        assert_eq!(messages(&svc, 1, "", 0, false).await.messages.len(), 4);
    }

    #[tokio::test]
    async fn event_sequence_reservations_only_move_forward() {
        let (dir, svc) = service();
        create(&svc, conversation(1, "t")).await.unwrap();
        async fn reserve(svc: &ConversationsService, count: u32) -> Result<Response<ReserveEventSeqReply>, Status> {
            svc.reserve_event_seq(Request::new(ReserveEventSeqRequest { conversation_id: id(1), count })).await
        }
        assert_eq!(reserve(&svc, 100).await.unwrap().into_inner().first, 1);
        assert_eq!(reserve(&svc, 1).await.unwrap().into_inner().first, 101);
        assert_eq!(reserve(&svc, 50).await.unwrap().into_inner().first, 102);
        for bad in [0, MAX_RESERVE + 1] {
            let e = reserve(&svc, bad).await.unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument);
            assert!(e.message().starts_with("count must be 1-"), "{}", e.message());
        }
        let e = svc
            .reserve_event_seq(Request::new(ReserveEventSeqRequest { conversation_id: id(2), count: 1 }))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::NotFound);
        let c = get(&svc, 1).await.unwrap();
        assert_eq!(c.version, 1, "reserving is not an update");
        // Across a restart of the store: the mark is in the file.
        drop(svc);
        let svc = ConversationsService::new(Db::open(&dir.path().join("coffer.db")).unwrap());
        assert_eq!(reserve(&svc, 10).await.unwrap().into_inner().first, 152);
    }

    #[tokio::test]
    async fn allowed_tools_are_kept_replaced_cleared_and_go_with_the_conversation() {
        let (dir, svc) = service();
        create(&svc, conversation(1, "a")).await.unwrap();
        create(&svc, conversation(2, "b")).await.unwrap();
        let allow = |conv: u128, tool: &str, by: &str| AllowToolRequest {
            conversation_id: id(conv),
            tool: Some(AllowedToolRecord { tool: tool.into(), decided_by: by.into(), ..Default::default() }),
        };
        let tools = |r: AllowedToolsRecord| r.tools.into_iter().map(|t| (t.tool, t.decided_by)).collect::<Vec<_>>();
        svc.allow_tool(Request::new(allow(1, "Edit", "cli"))).await.unwrap();
        let got = svc.allow_tool(Request::new(allow(1, "Bash", "web"))).await.unwrap().into_inner();
        assert!(got.tools.iter().all(|t| t.allowed_ms >= T0), "the store's clock fills the time");
        assert_eq!(tools(got), [("Bash".into(), "web".into()), ("Edit".into(), "cli".into())]);
        let again = svc.allow_tool(Request::new(allow(1, "Bash", "channel:tg"))).await.unwrap().into_inner();
        assert_eq!(tools(again)[0], ("Bash".into(), "channel:tg".into()), "allowed again: replaced, not doubled");
        svc.allow_tool(Request::new(allow(2, "Bash", "web"))).await.unwrap();
        for bad in [allow(1, "", "web"), allow(1, &"x".repeat(201), "web")] {
            let e = svc.allow_tool(Request::new(bad)).await.unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        }
        let e = svc.allow_tool(Request::new(allow(9, "Bash", "web"))).await.unwrap_err();
        assert_eq!(e.code(), Code::NotFound);
        // Across a reopen of the database.
        drop(svc);
        let svc = ConversationsService::new(Db::open(&dir.path().join("coffer.db")).unwrap());
        let list = |n| svc.list_allowed_tools(Request::new(ConversationRef { id: id(n) }));
        assert_eq!(list(1).await.unwrap().into_inner().tools.len(), 2);
        let cleared = svc.clear_allowed_tools(Request::new(ConversationRef { id: id(1) })).await.unwrap();
        assert_eq!(cleared.into_inner().removed, 2);
        assert!(list(1).await.unwrap().into_inner().tools.is_empty());
        assert_eq!(list(2).await.unwrap().into_inner().tools.len(), 1, "another conversation's stay");
        svc.delete_conversation(Request::new(ConversationRef { id: id(2) })).await.unwrap();
        let left: i64 = svc
            .db
            .read(|c| Ok(c.query_row("SELECT COUNT(*) FROM conversation_allowed_tools", [], |r| r.get(0))?))
            .await
            .unwrap();
        assert_eq!(left, 0, "deleted with the conversation");
        assert_eq!(list(2).await.unwrap_err().code(), Code::NotFound);
    }
}
