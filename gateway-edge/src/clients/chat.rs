//! The edge's client of `coffer-chat` (`proto/chat.proto`, `coffer.chat.v1`) and the one
//! conversion of its messages into their REST forms (`coffer_api::chat`), used by REST and SSE
//! (`rest::chat`).
//!
//! The REST forms are the proto messages with their field names (snake_case); enums as
//! lowercase words (role `user|assistant`, status `complete|streaming|interrupted|failed`);
//! `agent_config` and a tool call's `input` as JSON objects (an `input_json` that does not parse
//! stays a string); times as `*_ms` Unix milliseconds (`null` when the service sent 0: never,
//! unknown), empty strings of optional fields as `null`. A `oneof` is its case's field under a
//! word naming the case: a content block is `{"type":"text","text":…}`,
//! `{"type":"tool_use","tool_use":{id,name,input}}` or
//! `{"type":"tool_result","tool_result":{tool_use_id,output,is_error}}`; an event is
//! `{seq, conversation_id, at_ms, turn_id, kind, <kind>: {…}}` (`kind` = `text_delta`, …).
//!
//! Unary calls go through [`call`] (a deadline, [`CALL_TIMEOUT`]) on a channel whose HTTP/2
//! keep-alive pings notice a peer that stopped answering, like the retrieval client. The event
//! streams ([`Client::subscribe`], [`Client::watch_conversations`]) have no deadline: it lives as long as its SSE response.
//! Failures become the envelope in [`crate::error::ApiError::from_chat`].
use std::time::Duration;

use axum::response::sse::Event as SseEvent;
use coffer_api::chat as api;
use coffer_proto::chat::chat_client::ChatClient;
use coffer_proto::chat::{
    Agent, ContentBlock, Conversation, ConversationChange, ConversationView, Event, FilesChanged, Message,
    MessageStatus, PendingItem, PendingQueue, Role, SendMessageReply, Usage, content_block, conversation_change, event,
    send_message_reply,
};
use coffer_runtime::grpc::AuthChannel;
use secrecy::SecretString;
use serde_json::Value;

/// The Chat client type; cheap to clone (call a method on a clone: tonic clients take `&mut
/// self`).
pub type Client = ChatClient<AuthChannel>;

/// Longest chat reply the edge decodes (bytes): a conversation view holds up to 100 messages,
/// each with tool results of up to 64 KiB.
pub const MAX_REPLY: usize = 64 * 1024 * 1024;

/// Longest request the edge encodes (bytes): a message text is at most 1 MiB (the service
/// checks it and names the limit), a pending queue may hold several.
pub const MAX_REQUEST: usize = 64 * 1024 * 1024;

/// Deadline of one unary chat call. Everything answers at once (turns run in the background);
/// this only bounds a service that accepted the call and never answers.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// How often the channel pings the peer while a call or a stream is open, and how long it waits
/// for the answer before it gives the connection up (the call then fails as `UNAVAILABLE`).
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(5);

/// A lazily connecting channel to the service at `addr` presenting `token`, with the
/// keep-alive described in the module docs; every client of this service shares it
/// ([`crate::clients::Clients`]).
///
/// # Errors
/// When `addr` is not a valid authority.
pub fn channel(addr: &str, token: &SecretString) -> Result<AuthChannel, tonic::transport::Error> {
    coffer_runtime::grpc::watched_channel(addr, token, KEEPALIVE_INTERVAL, KEEPALIVE_TIMEOUT)
}

/// The client over `ch` (from [`channel`]), with its message size limits.
pub fn over(ch: AuthChannel) -> Client {
    ChatClient::new(ch).max_decoding_message_size(MAX_REPLY).max_encoding_message_size(MAX_REQUEST)
}

/// Runs one unary chat call with [`CALL_TIMEOUT`]; a call that takes longer is
/// `DEADLINE_EXCEEDED`.
///
/// # Errors
/// The call's status.
pub async fn call<T>(
    fut: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, tonic::Status> {
    coffer_runtime::grpc::call_within("chat service", CALL_TIMEOUT, fut).await
}

// ---------------------------------------------------------------------------------------------
// Words.

/// A Unix-ms time, `None` for 0 (never / unknown).
fn ms(v: i64) -> Option<i64> {
    (v > 0).then_some(v)
}

/// A string, `None` when empty.
fn opt(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_owned())
}

/// A role (`user` for an unspecified one).
pub fn role(r: Role) -> api::Role {
    match r {
        Role::Assistant => api::Role::Assistant,
        Role::Unspecified | Role::User => api::Role::User,
    }
}

/// A message status (`complete` for an unspecified one).
pub fn status(s: MessageStatus) -> api::MessageStatus {
    match s {
        MessageStatus::Unspecified | MessageStatus::Complete => api::MessageStatus::Complete,
        MessageStatus::Streaming => api::MessageStatus::Streaming,
        MessageStatus::Interrupted => api::MessageStatus::Interrupted,
        MessageStatus::Failed => api::MessageStatus::Failed,
    }
}

/// `reset` reasons after which the service ends the stream (and the edge with it).
pub const FINAL_RESETS: &[&str] = &["lagged", "deleted"];

// ---------------------------------------------------------------------------------------------
// The REST forms (`coffer_api::chat`).

/// A tool call's `input_json` as a JSON value; text that does not parse is kept as a string
/// (never dropped: it is what the agent sent).
pub fn input_value(input_json: &str) -> Value {
    if input_json.trim().is_empty() {
        return Value::Object(serde_json::Map::new());
    }
    serde_json::from_str(input_json).unwrap_or_else(|_| Value::String(input_json.to_owned()))
}

/// An `Agent`: `reason`, `command`, `version` null when empty; `binding` null when the agent
/// runs on its own login (no connection named), else the connection it is bound to (its
/// `model`, `fast_model`, `wire`, `problem` null when empty).
pub fn agent(a: &Agent) -> api::Agent {
    let binding = a.binding.as_ref().filter(|b| !b.connection.is_empty()).map(|b| api::AgentBinding {
        connection: b.connection.clone(),
        model: opt(&b.model),
        fast_model: opt(&b.fast_model),
        wire: opt(&b.wire),
        problem: opt(&b.problem),
    });
    api::Agent {
        agent_key: a.agent_key.clone(),
        display_name: a.display_name.clone(),
        available: a.available,
        reason: opt(&a.reason),
        command: opt(&a.command),
        version: opt(&a.version),
        binding,
    }
}

/// A `Usage`.
pub fn usage(u: &Usage) -> api::Usage {
    api::Usage {
        input_tokens: u.input_tokens,
        output_tokens: u.output_tokens,
        cache_read_tokens: u.cache_read_tokens,
        cache_write_tokens: u.cache_write_tokens,
    }
}

/// A `ContentBlock`; an empty block is an empty text block.
pub fn block(b: &ContentBlock) -> api::ContentBlock {
    match &b.block {
        None => api::ContentBlock::Text { text: String::new() },
        Some(content_block::Block::Text(t)) => api::ContentBlock::Text { text: t.clone() },
        Some(content_block::Block::ToolUse(u)) => api::ContentBlock::ToolUse {
            tool_use: api::ToolUse { id: u.id.clone(), name: u.name.clone(), input: input_value(&u.input_json) },
        },
        Some(content_block::Block::ToolResult(r)) => api::ContentBlock::ToolResult {
            tool_result: api::ToolResult {
                tool_use_id: r.tool_use_id.clone(),
                output: r.output.clone(),
                is_error: r.is_error,
            },
        },
        Some(content_block::Block::Attachment(a)) => api::ContentBlock::Attachment {
            attachment: api::Attachment {
                name: a.name.clone(),
                mime: a.mime.clone(),
                size: a.size,
                path: a.path.clone(),
            },
        },
    }
}

/// A `Message` (`usage` and `model` null for user messages or when unknown, `error` null
/// unless failed, `source` null for assistant messages: the service leaves them empty).
pub fn message(m: &Message) -> api::Message {
    api::Message {
        id: m.id.clone(),
        conversation_id: m.conversation_id.clone(),
        role: role(m.role()),
        blocks: m.blocks.iter().map(block).collect(),
        status: status(m.status()),
        usage: m.usage.as_ref().map(usage),
        model: opt(&m.model),
        created_ms: ms(m.created_ms),
        updated_ms: ms(m.updated_ms),
        error: opt(&m.error),
        source: opt(&m.source),
        imported: m.imported,
        files_changed: m.files_changed.as_ref().map(|f| files_changed(f, false)),
        agent_key: opt(&m.agent_key),
        connection: opt(&m.connection),
    }
}

/// A turn's `FilesChanged`; `message_id` only in the event (`with_message`).
pub fn files_changed(f: &FilesChanged, with_message: bool) -> api::FilesChanged {
    use coffer_proto::chat::FileChangeKind as K;
    api::FilesChanged {
        files: f
            .files
            .iter()
            .map(|c| api::FileChange {
                path: c.path.clone(),
                change: match c.change() {
                    K::Added => api::FileChangeKind::Added,
                    K::Deleted => api::FileChangeKind::Deleted,
                    K::Renamed => api::FileChangeKind::Renamed,
                    K::Modified | K::Unspecified => api::FileChangeKind::Modified,
                },
                old_path: opt(&c.old_path),
                additions: c.additions,
                deletions: c.deletions,
                binary: c.binary,
            })
            .collect(),
        truncated: f.truncated,
        note: opt(&f.note),
        message_id: if with_message { opt(&f.message_id) } else { None },
    }
}

/// A `Conversation`: `agent_config` always an object (empty strings kept: the model's empty
/// means the agent's default), channel fields null when unbound.
pub fn conversation(c: &Conversation) -> api::Conversation {
    let cfg = c.agent_config.clone().unwrap_or_default();
    api::Conversation {
        id: c.id.clone(),
        agent_key: c.agent_key.clone(),
        title: c.title.clone(),
        agent_config: api::AgentConfig {
            cwd: cfg.cwd,
            model: cfg.model,
            session_id: cfg.session_id,
            permission_mode: if cfg.permission_mode.is_empty() { "bypass".to_owned() } else { cfg.permission_mode },
        },
        channel_name: opt(&c.channel_name),
        peer_chat_id: opt(&c.peer_chat_id),
        archived: c.archived,
        created_ms: ms(c.created_ms),
        updated_ms: ms(c.updated_ms),
        last_message_ms: ms(c.last_message_ms),
        version: c.version,
        message_count: c.message_count,
        turn_running: c.turn_running,
        pending_count: c.pending_count,
        pending_paused: c.pending_paused,
        approvals_waiting: c.approvals_waiting,
    }
}

/// A `PendingItem`.
pub fn pending_item(p: &PendingItem) -> api::PendingItem {
    api::PendingItem { id: p.id.clone(), text: p.text.clone(), created_ms: ms(p.created_ms), source: opt(&p.source) }
}

/// A `PendingQueue`; an absent queue is empty and not paused.
pub fn queue(q: Option<&PendingQueue>) -> api::PendingQueue {
    api::PendingQueue {
        items: q.map(|q| q.items.iter().map(pending_item).collect()).unwrap_or_default(),
        paused: q.is_some_and(|q| q.paused),
    }
}

/// A `ConversationView`.
///
/// # Errors
/// A view without its conversation (the service always sends one).
pub fn view(v: &ConversationView) -> Result<api::ConversationView, &'static str> {
    let c = v.conversation.as_ref().ok_or("the chat service answered a conversation view without the conversation")?;
    Ok(api::ConversationView {
        conversation: conversation(c),
        messages: v.messages.iter().map(message).collect(),
        more_before: v.more_before,
        pending: queue(v.pending.as_ref()),
        last_seq: v.last_seq,
        approvals: v.approvals.iter().map(approval).collect(),
        allowed_tools: v
            .allowed_tools
            .iter()
            .map(|t| api::AllowedTool {
                tool: t.tool.clone(),
                decided_by: t.decided_by.clone(),
                actor: (!t.actor.is_empty()).then(|| t.actor.clone()),
                allowed_ms: t.allowed_ms,
            })
            .collect(),
    })
}

/// A `SendMessageReply`: `message` when a turn started, `pending` when it was queued, with the
/// queue either way.
pub fn send_reply(r: &SendMessageReply) -> api::SendMessageReply {
    let mut out = api::SendMessageReply { queue: queue(r.queue.as_ref()), message: None, pending: None };
    match &r.outcome {
        Some(send_message_reply::Outcome::Message(m)) => out.message = Some(message(m)),
        Some(send_message_reply::Outcome::Pending(p)) => out.pending = Some(pending_item(p)),
        None => {}
    }
    out
}

/// The body of one kind of event.
fn event_body(k: &event::Kind) -> api::EventBody {
    use api::EventBody as B;
    use event::Kind as K;
    let msg = |m: Option<&Message>| m.map(message);
    match k {
        K::MessageCreated(m) => B::MessageCreated(api::MessageCreated { message: msg(m.message.as_ref()) }),
        K::TurnStarted(t) => B::TurnStarted(api::TurnStarted {
            user_message_id: t.user_message_id.clone(),
            assistant_message_id: t.assistant_message_id.clone(),
            agent_key: t.agent_key.clone(),
        }),
        K::TextDelta(t) => B::TextDelta(api::TextDelta { text: t.text.clone() }),
        K::ToolCall(t) => B::ToolCall(api::ToolCallEvent {
            tool_use_id: t.tool_use_id.clone(),
            name: t.name.clone(),
            input: input_value(&t.input_json),
        }),
        K::ToolResult(t) => B::ToolResult(api::ToolResultEvent {
            tool_use_id: t.tool_use_id.clone(),
            output: t.output.clone(),
            is_error: t.is_error,
        }),
        K::TurnDone(t) => B::TurnDone(api::TurnDone {
            stop_reason: t.stop_reason.clone(),
            usage: t.usage.as_ref().map(usage),
            model: opt(&t.model),
            message: msg(t.message.as_ref()),
        }),
        K::TurnError(t) => B::TurnError(api::TurnError {
            code: t.code.clone(),
            message: t.message.clone(),
            message_record: msg(t.message_record.as_ref()),
        }),
        K::QueueChanged(q) => B::QueueChanged(api::QueueChanged { queue: queue(q.queue.as_ref()) }),
        K::Reset(r) => B::Reset(api::Reset { reason: r.reason.clone() }),
        K::FilesChanged(f) => B::FilesChanged(files_changed(f, true)),
        K::ApprovalRequested(a) => B::ApprovalRequested(api::ApprovalRequested {
            approval: a.approval.as_ref().map(approval).unwrap_or_default(),
        }),
        K::ApprovalResolved(r) => B::ApprovalResolved(approval_resolved(r)),
    }
}

/// An `Approval`: `input` as an object, an empty diff null.
pub fn approval(a: &coffer_proto::chat::Approval) -> api::Approval {
    api::Approval {
        number: a.number,
        tool: a.tool.clone(),
        summary: a.summary.clone(),
        input: input_value(&a.input_json),
        diff: opt(&a.diff),
        cwd: a.cwd.clone(),
        requested_ms: a.requested_ms,
        expires_ms: a.expires_ms,
    }
}

/// An `ApprovalResolved`: an empty message or actor null.
pub fn approval_resolved(r: &coffer_proto::chat::ApprovalResolved) -> api::ApprovalResolved {
    api::ApprovalResolved {
        number: r.number,
        decision: r.decision.clone(),
        message: opt(&r.message),
        decided_by: r.decided_by.clone(),
        actor: opt(&r.actor),
    }
}

/// An `Event` (`turn_id` null outside a turn); `None` for an event without a kind (a newer
/// service's kind this edge does not know: it is not forwarded).
pub fn event(e: &Event) -> Option<api::Event> {
    let body = event_body(e.kind.as_ref()?);
    Some(api::Event::new(e.seq, e.conversation_id.clone(), ms(e.at_ms), opt(&e.turn_id), body))
}

/// True for an event after which the stream ends: `reset` with reason `lagged` or `deleted`.
pub fn ends_stream(e: &Event) -> bool {
    matches!(&e.kind, Some(event::Kind::Reset(r)) if FINAL_RESETS.contains(&r.reason.as_str()))
}

/// One line of JSON (serde_json escapes every newline inside strings).
fn line(v: &impl serde::Serialize) -> String {
    // Serialising these types cannot fail: every map key is a string.
    serde_json::to_string(v).unwrap_or_default()
}

/// One SSE frame of an event: `id: <seq>`, `event: <kind>`, `data: <event JSON>` (one line).
/// `None` for an event without a kind.
pub fn sse_frame(e: &Event) -> Option<SseEvent> {
    let ev = event(e)?;
    Some(SseEvent::default().id(ev.seq.to_string()).event(ev.kind.word()).data(line(&ev)))
}

/// One SSE frame of a `WatchConversations` change, and whether the stream ends after it:
/// `event: conversation` (data: the conversation as [`conversation`], exactly an item of
/// `GET /v1/conversations`), `event: deleted` (`{"id"}`), `event: reset` (`{"reason"}`; the
/// stream ends). No `id:` lines: the list has no sequence to resume from (reload it instead).
/// `None` for a change of a kind this edge does not know.
pub fn change_frame(c: &ConversationChange) -> Option<(SseEvent, bool)> {
    let (kind, data, ends) = change_parts(c)?;
    Some((SseEvent::default().event(kind).data(data.to_string()), ends))
}

/// A `WatchConversations` change as its SSE event name, its body (a JSON object) and whether the
/// list stream ends after it (see [`change_frame`]); shared by the list stream and the console's
/// multiplexed stream. `None` for a change of a kind this edge does not know.
pub fn change_parts(c: &ConversationChange) -> Option<(&'static str, serde_json::Value, bool)> {
    // Serialising these types cannot fail (every map key is a string); the workspace's
    // serde_json keeps field order, so the body reads as the type declares it.
    Some(match c.change.as_ref()? {
        conversation_change::Change::Conversation(c) => {
            ("conversation", serde_json::to_value(conversation(c)).ok()?, false)
        }
        conversation_change::Change::Deleted(id) => {
            ("deleted", serde_json::to_value(api::ConversationGone { id: id.clone() }).ok()?, false)
        }
        conversation_change::Change::Reset(r) => {
            ("reset", serde_json::to_value(api::Reset { reason: r.reason.clone() }).ok()?, true)
        }
    })
}

/// The `after_seq` a subscriber resumes from: `Last-Event-ID` (what an `EventSource` sends on
/// reconnection) wins over `?after=`; absent both, 0 (the in-flight turn's events so far, then
/// live).
///
/// # Errors
/// A message naming the header or parameter when it is not a non-negative integer.
pub fn after_seq(last_event_id: Option<&str>, after: Option<&str>) -> Result<u64, String> {
    let parse = |what: &str, v: &str| {
        let v = v.trim();
        v.parse::<u64>().map_err(|_| {
            format!(
                "{what} must be an event sequence number (a non-negative integer), not {:?}",
                v.chars().take(40).collect::<String>()
            )
        })
    };
    match (last_event_id.filter(|v| !v.trim().is_empty()), after.filter(|v| !v.trim().is_empty())) {
        (Some(v), _) => parse("Last-Event-ID", v),
        (None, Some(v)) => parse("after", v),
        (None, None) => Ok(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn wire(x: impl serde::Serialize) -> Value {
        serde_json::to_value(x).unwrap()
    }
    use coffer_proto::chat::{
        AgentConfig, MessageCreated, QueueChanged, Reset, TextDelta, ToolCall, ToolResult, ToolResultEvent, ToolUse,
        TurnDone, TurnError, TurnStarted,
    };

    /// The bytes an SSE response writes for `e`.
    pub(crate) async fn render(e: SseEvent) -> String {
        use axum::response::IntoResponse;
        use http_body_util::BodyExt;
        let body = axum::response::sse::Sse::new(futures_util::stream::iter([Ok::<_, std::convert::Infallible>(e)]))
            .into_response()
            .into_body();
        String::from_utf8(body.collect().await.unwrap().to_bytes().to_vec()).unwrap()
    }

    fn ev(seq: u64, kind: event::Kind) -> Event {
        Event { seq, conversation_id: "01C".into(), at_ms: 1000 + seq as i64, turn_id: "01T".into(), kind: Some(kind) }
    }

    fn assistant() -> Message {
        Message {
            id: "01A".into(),
            conversation_id: "01C".into(),
            role: Role::Assistant as i32,
            blocks: vec![
                ContentBlock { block: Some(content_block::Block::Text("Hello".into())) },
                ContentBlock {
                    block: Some(content_block::Block::ToolUse(ToolUse {
                        id: "tu1".into(),
                        name: "Bash".into(),
                        input_json: r#"{"command":"ls"}"#.into(),
                    })),
                },
                ContentBlock {
                    block: Some(content_block::Block::ToolResult(ToolResult {
                        tool_use_id: "tu1".into(),
                        output: "a\nb".into(),
                        is_error: false,
                    })),
                },
            ],
            status: MessageStatus::Interrupted as i32,
            usage: Some(Usage { input_tokens: 10, output_tokens: 3, ..Default::default() }),
            model: "claude-x".into(),
            created_ms: 5,
            ..Default::default()
        }
    }

    #[test]
    fn messages_use_words_objects_and_null_times() {
        let v = wire(message(&assistant()));
        assert_eq!((&v["role"], &v["status"]), (&json!("assistant"), &json!("interrupted")));
        assert_eq!(v["blocks"][0], json!({"type": "text", "text": "Hello"}));
        assert_eq!(
            v["blocks"][1],
            json!({"type": "tool_use", "tool_use": {"id": "tu1", "name": "Bash", "input": {"command": "ls"}}})
        );
        assert_eq!(
            v["blocks"][2],
            json!({"type": "tool_result", "tool_result": {"tool_use_id": "tu1", "output": "a\nb", "is_error": false}})
        );
        assert_eq!(v["usage"]["input_tokens"], 10);
        assert_eq!((&v["created_ms"], &v["updated_ms"], &v["error"]), (&json!(5), &Value::Null, &Value::Null));
        let user = wire(message(&Message { source: "cli".into(), ..Default::default() }));
        assert_eq!(
            (&user["role"], &user["status"], &user["source"]),
            (&json!("user"), &json!("complete"), &json!("cli"))
        );
        assert_eq!(user["usage"], Value::Null);
        assert_eq!(status(MessageStatus::Unspecified).word(), "complete");
        assert_eq!(role(Role::Unspecified).word(), "user");
    }

    /// The bytes REST and SSE write: field order, nulls and absences as the console and the
    /// CLI have always read them.
    #[test]
    fn the_wire_keeps_its_order_nulls_and_absences() {
        assert_eq!(
            line(&message(&assistant())),
            r#"{"id":"01A","conversation_id":"01C","role":"assistant","blocks":[{"type":"text","text":"Hello"},{"type":"tool_use","tool_use":{"id":"tu1","name":"Bash","input":{"command":"ls"}}},{"type":"tool_result","tool_result":{"tool_use_id":"tu1","output":"a\nb","is_error":false}}],"status":"interrupted","usage":{"input_tokens":10,"output_tokens":3,"cache_read_tokens":0,"cache_write_tokens":0},"model":"claude-x","created_ms":5,"updated_ms":null,"error":null,"source":null}"#
        );
        assert_eq!(
            line(&conversation(&Conversation { id: "01C".into(), version: 2, ..Default::default() })),
            r#"{"id":"01C","agent_key":"","title":"","agent_config":{"cwd":"","model":"","session_id":"","permission_mode":"bypass"},"channel_name":null,"peer_chat_id":null,"archived":false,"created_ms":null,"updated_ms":null,"last_message_ms":null,"version":2,"message_count":0,"turn_running":false,"pending_count":0,"pending_paused":false,"approvals_waiting":0}"#
        );
        let bound = Agent {
            agent_key: "codex".into(),
            display_name: "Codex".into(),
            binding: Some(coffer_proto::chat::AgentBinding { connection: "work".into(), ..Default::default() }),
            ..Default::default()
        };
        assert_eq!(
            line(&agent(&bound)),
            r#"{"agent_key":"codex","display_name":"Codex","available":false,"reason":null,"command":null,"version":null,"binding":{"connection":"work","model":null,"fast_model":null,"wire":null,"problem":null}}"#
        );
        let unbound = Agent { binding: Some(Default::default()), ..bound };
        assert!(line(&agent(&unbound)).ends_with(r#""binding":null}"#));
        let reply = SendMessageReply {
            outcome: Some(send_message_reply::Outcome::Pending(PendingItem { id: "01P".into(), ..Default::default() })),
            queue: None,
        };
        assert_eq!(
            line(&send_reply(&reply)),
            r#"{"queue":{"items":[],"paused":false},"pending":{"id":"01P","text":"","created_ms":null,"source":null}}"#
        );
        let e = Event { turn_id: String::new(), ..ev(7, event::Kind::TextDelta(TextDelta { text: "Hel".into() })) };
        assert_eq!(
            line(&event(&e).unwrap()),
            r#"{"seq":7,"conversation_id":"01C","at_ms":1007,"turn_id":null,"kind":"text_delta","text_delta":{"text":"Hel"}}"#
        );
        let done = ev(8, event::Kind::TurnDone(TurnDone { stop_reason: "end_turn".into(), ..Default::default() }));
        assert!(line(&event(&done).unwrap()).ends_with(
            r#""kind":"turn_done","turn_done":{"stop_reason":"end_turn","usage":null,"model":null,"message":null}}"#
        ));
    }

    #[test]
    fn tool_input_is_an_object_and_garbage_stays_a_string() {
        assert_eq!(input_value(r#"{"a":[1,2]}"#), json!({"a": [1, 2]}));
        assert_eq!(input_value(""), json!({}));
        assert_eq!(input_value("{not json"), json!("{not json"));
    }

    #[test]
    fn conversations_carry_config_as_an_object_and_live_state() {
        let c = Conversation {
            id: "01C".into(),
            agent_key: "codex".into(),
            title: "Fix the build".into(),
            agent_config: Some(AgentConfig {
                cwd: "/w".into(),
                model: String::new(),
                session_id: "s1".into(),
                ..Default::default()
            }),
            version: 3,
            turn_running: true,
            pending_count: 2,
            pending_paused: true,
            ..Default::default()
        };
        let v = wire(conversation(&c));
        assert_eq!(
            v["agent_config"],
            json!({"cwd": "/w", "model": "", "session_id": "s1", "permission_mode": "bypass"})
        );
        assert_eq!((&v["channel_name"], &v["last_message_ms"]), (&Value::Null, &Value::Null));
        assert_eq!((&v["version"], &v["turn_running"], &v["pending_count"]), (&json!(3), &json!(true), &json!(2)));
        assert_eq!(wire(conversation(&Conversation::default()))["agent_config"]["cwd"], "");
        assert!(view(&ConversationView::default()).is_err(), "a view needs its conversation");
        let view = wire(view(&ConversationView { conversation: Some(c), last_seq: 41, ..Default::default() }).unwrap());
        assert_eq!(view["pending"], json!({"items": [], "paused": false}));
        assert_eq!((&view["last_seq"], &view["more_before"]), (&json!(41), &json!(false)));
    }

    #[test]
    fn a_send_reply_is_a_message_or_a_pending_item_with_the_queue() {
        let item = PendingItem { id: "01P".into(), text: "next".into(), created_ms: 9, source: "cli".into() };
        let queue = PendingQueue { items: vec![item.clone()], paused: false };
        let v = wire(send_reply(&SendMessageReply {
            outcome: Some(send_message_reply::Outcome::Pending(item)),
            queue: Some(queue),
        }));
        assert_eq!(v["pending"], json!({"id": "01P", "text": "next", "created_ms": 9, "source": "cli"}));
        assert!(v.get("message").is_none(), "{v}");
        assert_eq!(v["queue"]["items"][0]["id"], "01P");
        let v = wire(send_reply(&SendMessageReply {
            outcome: Some(send_message_reply::Outcome::Message(Message { id: "01M".into(), ..Default::default() })),
            queue: None,
        }));
        assert_eq!((&v["message"]["id"], &v["queue"]), (&json!("01M"), &json!({"items": [], "paused": false})));
    }

    #[tokio::test]
    async fn every_event_kind_has_its_frame() {
        let events = vec![
            ev(1, event::Kind::MessageCreated(MessageCreated { message: Some(Message::default()) })),
            ev(
                2,
                event::Kind::TurnStarted(TurnStarted {
                    user_message_id: "01U".into(),
                    assistant_message_id: "01A".into(),
                    agent_key: "claude_code".into(),
                }),
            ),
            ev(3, event::Kind::TextDelta(TextDelta { text: "line one\nline two".into() })),
            ev(
                4,
                event::Kind::ToolCall(ToolCall {
                    tool_use_id: "tu1".into(),
                    name: "mcp__coffer__coffer__search_tools".into(),
                    input_json: r#"{"query":"x"}"#.into(),
                }),
            ),
            ev(
                5,
                event::Kind::ToolResult(ToolResultEvent {
                    tool_use_id: "tu1".into(),
                    output: "found".into(),
                    is_error: true,
                }),
            ),
            ev(
                6,
                event::Kind::TurnDone(TurnDone {
                    stop_reason: "end_turn".into(),
                    usage: Some(Usage { output_tokens: 7, ..Default::default() }),
                    model: "m".into(),
                    message: Some(assistant()),
                }),
            ),
            ev(
                7,
                event::Kind::TurnError(TurnError {
                    code: "provider".into(),
                    message: "the model API answered 500".into(),
                    message_record: None,
                }),
            ),
            ev(8, event::Kind::QueueChanged(QueueChanged { queue: Some(PendingQueue::default()) })),
            ev(9, event::Kind::Reset(Reset { reason: "too_old".into() })),
            ev(
                10,
                event::Kind::ApprovalRequested(coffer_proto::chat::ApprovalRequested {
                    approval: Some(coffer_proto::chat::Approval {
                        number: 10,
                        tool: "Bash".into(),
                        summary: "Bash: rm -rf build".into(),
                        input_json: r#"{"command":"rm -rf build"}"#.into(),
                        ..Default::default()
                    }),
                }),
            ),
            ev(
                11,
                event::Kind::ApprovalResolved(coffer_proto::chat::ApprovalResolved {
                    number: 10,
                    decision: "deny".into(),
                    decided_by: "web".into(),
                    ..Default::default()
                }),
            ),
            ev(
                12,
                event::Kind::FilesChanged(coffer_proto::chat::FilesChanged {
                    files: vec![coffer_proto::chat::FileChange {
                        path: "src/a.rs".into(),
                        change: coffer_proto::chat::FileChangeKind::Modified as i32,
                        additions: 3,
                        deletions: 1,
                        ..Default::default()
                    }],
                    message_id: "01A".into(),
                    ..Default::default()
                }),
            ),
        ];
        let mut kinds: Vec<String> = Vec::new();
        for e in &events {
            let frame = render(sse_frame(e).unwrap()).await;
            let lines: Vec<&str> = frame.trim_end_matches('\n').split('\n').collect();
            assert_eq!(lines.len(), 3, "{frame:?}");
            assert_eq!(lines[0], format!("id: {}", e.seq));
            let kind = lines[1].strip_prefix("event: ").unwrap();
            kinds.push(kind.to_owned());
            let data: Value = serde_json::from_str(lines[2].strip_prefix("data: ").unwrap()).unwrap();
            assert_eq!((&data["seq"], &data["kind"], &data["turn_id"]), (&json!(e.seq), &json!(kind), &json!("01T")));
            assert!(data[kind].is_object(), "{data}");
            assert!(frame.ends_with("\n\n"));
        }
        assert_eq!(kinds, api::EventKind::ALL.map(api::EventKind::word));
        // Multi-line text stays on one data line, escaped.
        assert!(render(sse_frame(&events[2]).unwrap()).await.contains(r#""text":"line one\nline two""#));
        let data = wire(event(&events[3]).unwrap());
        assert_eq!(data["tool_call"]["input"], json!({"query": "x"}));
        let data = wire(event(&events[5]).unwrap());
        assert_eq!(
            (&data["turn_done"]["usage"]["output_tokens"], &data["turn_done"]["message"]["status"]),
            (&json!(7), &json!("interrupted"))
        );
        assert_eq!(wire(event(&events[6]).unwrap())["turn_error"]["message_record"], Value::Null);
        let outside = Event { turn_id: String::new(), ..events[7].clone() };
        assert_eq!(wire(event(&outside).unwrap())["turn_id"], Value::Null);
        let asked = wire(event(&events[9]).unwrap());
        assert_eq!(asked["approval_requested"]["approval"]["input"], json!({"command": "rm -rf build"}));
        assert_eq!(asked["approval_requested"]["approval"]["diff"], Value::Null);
        let decided = wire(event(&events[10]).unwrap());
        assert_eq!(
            decided["approval_resolved"],
            json!({"number": 10, "decision": "deny", "message": null, "decided_by": "web", "actor": null})
        );
        // An event of a kind this edge does not know is not forwarded.
        assert!(sse_frame(&Event { seq: 10, ..Default::default() }).is_none());
    }

    #[test]
    fn only_lagged_and_deleted_resets_end_the_stream() {
        let reset = |r: &str| ev(1, event::Kind::Reset(Reset { reason: r.into() }));
        assert!(ends_stream(&reset("lagged")));
        assert!(ends_stream(&reset("deleted")));
        assert!(!ends_stream(&reset("too_old")));
        assert!(!ends_stream(&ev(2, event::Kind::TextDelta(TextDelta { text: "x".into() }))));
    }

    #[test]
    fn resumption_takes_last_event_id_over_after() {
        assert_eq!(after_seq(None, None), Ok(0));
        assert_eq!(after_seq(Some("17"), None), Ok(17));
        assert_eq!(after_seq(Some(" 17 "), Some("3")), Ok(17));
        assert_eq!(after_seq(None, Some("3")), Ok(3));
        assert_eq!(after_seq(Some(""), Some("3")), Ok(3));
        let e = after_seq(Some("-1"), None).unwrap_err();
        assert!(e.starts_with("Last-Event-ID must be"), "{e}");
        assert!(after_seq(None, Some("x")).unwrap_err().starts_with("after must be"));
        assert!(after_seq(None, Some("99999999999999999999999")).is_err());
    }
}
