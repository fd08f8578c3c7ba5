//! In-process tests of the turn engine: the real [`Engine`] over a small in-memory stand-in for
//! the store's Conversations and Audit services served on loopback gRPC, with a test provider
//! whose turns follow a few words of script (`say:`, `hang`, `exit`, `fail:`). The end-to-end
//! tests (`tests/e2e/chat_engine.rs`) run the same cases through the real daemon and store.
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use coffer_proto::chat::event::Kind;
use coffer_proto::store::audit_server::{Audit, AuditServer};
use coffer_proto::store::conversations_server::{Conversations, ConversationsServer};
use coffer_proto::store::*;
use tokio::sync::{mpsc, oneshot};
use tonic::{Request, Response, Status};

use crate::adapter::*;
use crate::engine::Engine;
use crate::persist::Store;
use crate::providers::{Entry, Registry};

#[derive(Default)]
pub(crate) struct Db {
    pub(crate) convs: HashMap<String, ConversationRecord>,
    pub(crate) messages: HashMap<String, Vec<MessageRecord>>,
    pub(crate) pending: HashMap<String, PendingRecord>,
    seq: HashMap<String, u64>,
    pub(crate) audit: Vec<AuditEntry>,
    /// Channels: the pending pairing code, wrong tries left, and the owner once claimed.
    pub(crate) pairing: Option<(String, u32)>,
    pub(crate) owner: Option<String>,
    /// Faults: how many of the next calls of a method (`start_turn`, `update_message`) fail
    /// `UNAVAILABLE` as while the store restarts (`u32::MAX`: every one).
    pub(crate) faults: HashMap<&'static str, u32>,
    /// Tools allowed always, by conversation.
    pub(crate) allowed: HashMap<String, Vec<AllowedToolRecord>>,
}

#[derive(Clone, Default)]
pub(crate) struct Fake(Arc<Mutex<Db>>);

type R<T> = Result<Response<T>, Status>;

impl Fake {
    pub(crate) fn db(&self) -> std::sync::MutexGuard<'_, Db> {
        self.0.lock().unwrap()
    }

    /// Fails this call of `method` when a fault is armed for it.
    fn fault(&self, method: &'static str) -> Result<(), Status> {
        let mut db = self.db();
        match db.faults.get_mut(method) {
            Some(n) if *n > 0 => {
                *n = n.saturating_sub(u32::from(*n != u32::MAX));
                Err(Status::unavailable(format!("fake: the store is restarting ({method})")))
            }
            _ => Ok(()),
        }
    }
}

#[tonic::async_trait]
impl Conversations for Fake {
    async fn create_conversation(&self, r: Request<CreateConversationRequest>) -> R<ConversationRecord> {
        let mut c = r.into_inner().conversation.unwrap_or_default();
        c.version = 1;
        self.db().convs.insert(c.id.clone(), c.clone());
        Ok(Response::new(c))
    }
    async fn list_conversations(&self, r: Request<ListConversationsRequest>) -> R<ListConversationsReply> {
        let r = r.into_inner();
        let mut conversations: Vec<ConversationRecord> = self
            .db()
            .convs
            .values()
            .filter(|c| r.channel_name.is_empty() || c.channel_name == r.channel_name)
            .filter(|c| r.peer_chat_id.is_empty() || c.peer_chat_id == r.peer_chat_id)
            .cloned()
            .collect();
        // Newest first (ULIDs sort by creation).
        conversations.sort_by(|a, b| b.id.cmp(&a.id));
        if r.limit > 0 {
            conversations.truncate(r.limit as usize);
        }
        Ok(Response::new(ListConversationsReply { conversations, next_cursor: String::new() }))
    }
    async fn get_conversation(&self, r: Request<ConversationRef>) -> R<ConversationRecord> {
        let id = r.into_inner().id;
        self.db().convs.get(&id).cloned().map(Response::new).ok_or_else(|| Status::not_found(id))
    }
    async fn update_conversation(&self, r: Request<UpdateConversationRequest>) -> R<ConversationRecord> {
        let r = r.into_inner();
        let mut db = self.db();
        let c = db.convs.get_mut(&r.id).ok_or_else(|| Status::not_found(r.id.clone()))?;
        if let Some(t) = r.title {
            c.title = t;
        }
        if let Some(j) = r.agent_config_json {
            c.agent_config_json = j;
        }
        if let Some(a) = r.archived {
            c.archived_ms = i64::from(a);
        }
        c.version += 1;
        Ok(Response::new(c.clone()))
    }
    async fn delete_conversation(&self, r: Request<ConversationRef>) -> R<ConversationDeleteReply> {
        let id = r.into_inner().id;
        let mut db = self.db();
        let removed = u64::from(db.convs.remove(&id).is_some());
        db.messages.remove(&id);
        db.pending.remove(&id);
        Ok(Response::new(ConversationDeleteReply { removed }))
    }
    async fn append_message(&self, r: Request<MessageRecord>) -> R<MessageRecord> {
        let m = r.into_inner();
        let mut db = self.db();
        let c = db.convs.get_mut(&m.conversation_id).ok_or_else(|| Status::not_found("conversation"))?;
        c.message_count += 1;
        db.messages.entry(m.conversation_id.clone()).or_default().push(m.clone());
        Ok(Response::new(m))
    }
    /// As the store: both messages appended and the item removed at once; a known user
    /// message id is answered with the stored records, `already` set.
    async fn start_turn(&self, r: Request<StartTurnRequest>) -> R<StartTurnReply> {
        self.fault("start_turn")?;
        let r = r.into_inner();
        let (user, assistant) = (r.user.unwrap_or_default(), r.assistant.unwrap_or_default());
        let mut db = self.db();
        let list = db.messages.entry(user.conversation_id.clone()).or_default();
        if let Some(i) = list.iter().position(|m| m.id == user.id) {
            let reply =
                StartTurnReply { user: Some(list[i].clone()), assistant: list.get(i + 1).cloned(), already: true };
            return Ok(Response::new(reply));
        }
        let queue = db.pending.get_mut(&user.conversation_id);
        if !r.pending_item_id.is_empty() {
            let queue = queue.ok_or_else(|| Status::not_found("pending item"))?;
            let before = queue.items.len();
            queue.items.retain(|i| i.id != r.pending_item_id);
            if queue.items.len() == before {
                return Err(Status::not_found("pending item"));
            }
        }
        let c = db.convs.get_mut(&user.conversation_id).ok_or_else(|| Status::not_found("conversation"))?;
        c.message_count += 2;
        db.messages.entry(user.conversation_id.clone()).or_default().extend([user.clone(), assistant.clone()]);
        Ok(Response::new(StartTurnReply { user: Some(user), assistant: Some(assistant), already: false }))
    }
    async fn update_message(&self, r: Request<MessageRecord>) -> R<MessageRecord> {
        self.fault("update_message")?;
        let m = r.into_inner();
        let mut db = self.db();
        let list = db.messages.get_mut(&m.conversation_id).ok_or_else(|| Status::not_found("conversation"))?;
        let slot = list.iter_mut().find(|x| x.id == m.id).ok_or_else(|| Status::not_found("message"))?;
        slot.blocks = m.blocks.clone();
        slot.status = m.status;
        slot.error = m.error.clone();
        slot.model = m.model.clone();
        Ok(Response::new(slot.clone()))
    }
    async fn list_messages(&self, r: Request<ListMessagesRequest>) -> R<ListMessagesReply> {
        let r = r.into_inner();
        let messages = self.db().messages.get(&r.conversation_id).cloned().unwrap_or_default();
        Ok(Response::new(ListMessagesReply { messages, next_after_id: String::new() }))
    }
    async fn fail_streaming_messages(&self, _r: Request<FailStreamingMessagesRequest>) -> R<ConversationDeleteReply> {
        let mut n = 0;
        for list in self.db().messages.values_mut() {
            for m in list.iter_mut().filter(|m| m.status == MessageStatus::Streaming as i32) {
                m.status = MessageStatus::Failed as i32;
                n += 1;
            }
        }
        Ok(Response::new(ConversationDeleteReply { removed: n }))
    }
    async fn set_pending(&self, r: Request<SetPendingRequest>) -> R<PendingRecord> {
        let r = r.into_inner();
        let rec = PendingRecord { conversation_id: r.conversation_id.clone(), items: r.items, paused: r.paused };
        self.db().pending.insert(r.conversation_id, rec.clone());
        Ok(Response::new(rec))
    }
    async fn get_pending(&self, r: Request<ConversationRef>) -> R<PendingRecord> {
        let id = r.into_inner().id;
        let rec = self.db().pending.get(&id).cloned();
        Ok(Response::new(rec.unwrap_or(PendingRecord { conversation_id: id, ..Default::default() })))
    }
    async fn list_pending_queues(&self, _r: Request<ListPendingQueuesRequest>) -> R<ListPendingQueuesReply> {
        let queues = self.db().pending.values().filter(|p| !p.items.is_empty()).cloned().collect();
        Ok(Response::new(ListPendingQueuesReply { queues }))
    }
    async fn reserve_event_seq(&self, r: Request<ReserveEventSeqRequest>) -> R<ReserveEventSeqReply> {
        let r = r.into_inner();
        let mut db = self.db();
        let hwm = db.seq.entry(r.conversation_id).or_default();
        let first = *hwm + 1;
        *hwm += u64::from(r.count);
        Ok(Response::new(ReserveEventSeqReply { first }))
    }
    async fn allow_tool(&self, r: Request<AllowToolRequest>) -> R<AllowedToolsRecord> {
        let r = r.into_inner();
        let tool = r.tool.unwrap_or_default();
        let mut db = self.db();
        let tools = db.allowed.entry(r.conversation_id).or_default();
        tools.retain(|t| t.tool != tool.tool);
        tools.push(tool);
        tools.sort_by(|a, b| a.tool.cmp(&b.tool));
        Ok(Response::new(AllowedToolsRecord { tools: tools.clone() }))
    }
    async fn list_allowed_tools(&self, r: Request<ConversationRef>) -> R<AllowedToolsRecord> {
        let tools = self.db().allowed.get(&r.into_inner().id).cloned().unwrap_or_default();
        Ok(Response::new(AllowedToolsRecord { tools }))
    }
    async fn clear_allowed_tools(&self, r: Request<ConversationRef>) -> R<ConversationDeleteReply> {
        let removed = self.db().allowed.remove(&r.into_inner().id).map_or(0, |t| t.len() as u64);
        Ok(Response::new(ConversationDeleteReply { removed }))
    }
}

#[tonic::async_trait]
impl Audit for Fake {
    async fn append_audit(&self, r: Request<AppendAuditRequest>) -> R<WriteReply> {
        self.db().audit.extend(r.into_inner().entries);
        Ok(Response::new(WriteReply::default()))
    }
    async fn list_audit(&self, _r: Request<ListAuditRequest>) -> R<ListAuditReply> {
        Ok(Response::new(ListAuditReply::default()))
    }
}

/// The Channels domain as far as the bridge uses it: one pending code (`Db::pairing`, five
/// tries), claimed once.
#[tonic::async_trait]
impl coffer_proto::store::channels_server::Channels for Fake {
    async fn list_channels(&self, _r: Request<ListChannelsRequest>) -> R<ListChannelsReply> {
        Err(Status::unimplemented("fake"))
    }
    /// The owner once one paired here; before that the store "is down" (the bridge falls back
    /// to the adapter's copy of the record).
    async fn get_channel(&self, r: Request<GetChannelRequest>) -> R<ChannelRecord> {
        let owner = self.db().owner.clone().ok_or_else(|| Status::unavailable("fake: no record"))?;
        Ok(Response::new(ChannelRecord { name: r.into_inner().name, owner_id: owner, ..Default::default() }))
    }
    async fn create_channel(&self, _r: Request<CreateChannelRequest>) -> R<WriteChannelReply> {
        Err(Status::unimplemented("fake"))
    }
    async fn update_channel(&self, _r: Request<UpdateChannelRequest>) -> R<WriteChannelReply> {
        Err(Status::unimplemented("fake"))
    }
    async fn delete_channel(&self, _r: Request<DeleteChannelRequest>) -> R<WriteReply> {
        Err(Status::unimplemented("fake"))
    }
    async fn start_pairing(&self, _r: Request<StartPairingRequest>) -> R<StartPairingReply> {
        Err(Status::unimplemented("fake"))
    }
    async fn claim_pairing(&self, r: Request<ClaimPairingRequest>) -> R<ClaimPairingReply> {
        let r = r.into_inner();
        let mut db = self.db();
        let Some((code, tries)) = db.pairing.clone() else {
            return Err(Status::failed_precondition("no pairing code is pending (used, expired or void)"));
        };
        if r.code.trim().eq_ignore_ascii_case(&code) {
            db.pairing = None;
            db.owner = Some(r.owner_id);
            return Ok(Response::new(ClaimPairingReply { paired: true, ..Default::default() }));
        }
        let left = tries - 1;
        db.pairing = (left > 0).then_some((code, left));
        Ok(Response::new(ClaimPairingReply { paired: false, tries_left: left, ..Default::default() }))
    }
    async fn unpair(&self, _r: Request<UnpairRequest>) -> R<WriteChannelReply> {
        Err(Status::unimplemented("fake"))
    }
    async fn set_cursor(&self, _r: Request<SetCursorRequest>) -> R<SetCursorReply> {
        Err(Status::unimplemented("fake"))
    }
    async fn record_event(&self, _r: Request<RecordEventRequest>) -> R<RecordEventReply> {
        Err(Status::unimplemented("fake"))
    }
}

/// A provider whose turn follows its text: `say:<words>` (one delta per word), `hang` (until
/// interrupted), `exit` (no terminal event), `fail:<message>`, `ask:<Tool> <command>` (lines of
/// them: each asks for approval, waits, says `approved` or `denied: <message>`).
pub(crate) struct Tiny;

impl AgentProvider for Tiny {
    fn key(&self) -> &'static str {
        "tiny"
    }
    fn display_name(&self) -> &'static str {
        "Tiny"
    }
    fn availability(&self, _env: &AgentEnv) -> Availability {
        Availability::Available { command: "tiny".into(), version: None }
    }
    fn validate_config(&self, config: &mut AgentConfig) -> Result<(), ConfigError> {
        // The rule a CLI-argument model has (Claude Code's): never an option.
        if config.model.starts_with('-') {
            return Err(ConfigError { field: "model", problem: "must not start with '-'".into() });
        }
        Ok(())
    }
    fn start_turn(
        &self,
        _env: &AgentEnv,
        turn: TurnInput,
        tx: mpsc::Sender<AgentEvent>,
    ) -> Result<RunningTurn, StartError> {
        let (interrupt, mut stop) = oneshot::channel::<()>();
        let (approvals, mut answers) = mpsc::channel::<ApprovalAnswer>(APPROVAL_CHANNEL);
        let task = tokio::spawn(async move {
            let _ = tx.send(AgentEvent::Session { session_id: format!("S-{}", turn.turn_id), model: None }).await;
            let t = turn.text.as_str();
            if t.starts_with("ask:") {
                for (i, line) in t.lines().enumerate() {
                    let Some(rest) = line.strip_prefix("ask:") else { continue };
                    let (tool, command) = rest.split_once(' ').unwrap_or((rest, ""));
                    let request_id = format!("r{i}");
                    let req = ApprovalRequest {
                        request_id: request_id.clone(),
                        tool: tool.into(),
                        input: serde_json::json!({ "command": command }),
                        diff: None,
                        cwd: None,
                    };
                    let _ = tx.send(AgentEvent::ApprovalRequested(Box::new(req))).await;
                    let answer = tokio::select! {
                        a = answers.recv() => a,
                        _ = &mut stop => {
                            let done = AgentEvent::Done { stop_reason: "interrupted".into(), usage: Usage::default(), model: None };
                            let _ = tx.send(done).await;
                            return;
                        }
                    };
                    let Some(a) = answer.filter(|a| a.request_id == request_id) else { return };
                    let said = if a.allow { "approved ".to_owned() } else { format!("denied: {} ", a.message) };
                    let _ = tx.send(AgentEvent::TextDelta(said)).await;
                }
            } else if let Some(words) = t.strip_prefix("say:") {
                for w in words.split(' ') {
                    let _ = tx.send(AgentEvent::TextDelta(format!("{w} "))).await;
                }
            } else if t == "hang" {
                let _ = tx.send(AgentEvent::TextDelta("partial ".into())).await;
                if (&mut stop).await.is_ok() {
                    let _ = tx
                        .send(AgentEvent::Done {
                            stop_reason: "interrupted".into(),
                            usage: Usage::default(),
                            model: None,
                        })
                        .await;
                }
                return;
            } else if t == "exit" {
                return;
            } else if let Some(m) = t.strip_prefix("fail:") {
                let _ = tx.send(AgentEvent::Failed { kind: FailureKind::Provider, message: m.into() }).await;
                return;
            }
            let _ = tx
                .send(AgentEvent::Done {
                    stop_reason: "end_turn".into(),
                    usage: Usage::default(),
                    model: Some("m".into()),
                })
                .await;
        });
        Ok(RunningTurn { interrupt, task, approvals: Some(approvals) })
    }
}

pub(crate) struct Rig {
    pub(crate) engine: Arc<Engine>,
    pub(crate) fake: Fake,
    pub(crate) _home: tempfile::TempDir,
    pub(crate) _config: tokio::sync::watch::Sender<Arc<crate::config::Config>>,
}

pub(crate) async fn rig(timeout_s: u64) -> Rig {
    rig_tuned(timeout_s, crate::engine::Tuning::default()).await
}

/// [`rig`] with an engine tuning (a short store retry bound).
pub(crate) async fn rig_tuned(timeout_s: u64, tuning: crate::engine::Tuning) -> Rig {
    let values = HashMap::from([("chat.turn_timeout_s".to_owned(), timeout_s.to_string())]);
    rig_values(values, tuning).await
}

/// [`rig`] over these settings.
pub(crate) async fn rig_values(values: HashMap<String, String>, tuning: crate::engine::Tuning) -> Rig {
    let fake = Fake::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let served = fake.clone();
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(ConversationsServer::new(served.clone()))
            .add_service(AuditServer::new(served.clone()))
            .add_service(coffer_proto::store::channels_server::ChannelsServer::new(served))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
            .await
    });
    let channel = coffer_runtime::grpc::channel(&addr.to_string(), &secrecy::SecretString::from("t")).unwrap();
    let home = tempfile::tempdir().unwrap();
    let (tx, rx) = tokio::sync::watch::channel(Arc::new(crate::config::Config::from_values(&values)));
    let registry = Arc::new(Registry::new(vec![Entry::new(Arc::new(Tiny))], home.path().to_path_buf()));
    let engine = Engine::with_tuning(Store::new(channel), registry, rx, home.path().to_path_buf(), tuning);
    engine.recover().await.unwrap();
    Rig { engine, fake, _home: home, _config: tx }
}

impl Rig {
    pub(crate) async fn conversation(&self) -> String {
        let id = crate::engine::new_id();
        let cwd = self._home.path().display().to_string();
        let rec = ConversationRecord {
            id: id.clone(),
            agent_key: "tiny".into(),
            agent_config_json: format!(r#"{{"cwd":{cwd:?}}}"#),
            ..Default::default()
        };
        self.engine.store().create(rec).await.unwrap();
        id
    }

    pub(crate) fn messages(&self, id: &str) -> Vec<MessageRecord> {
        self.fake.db().messages.get(id).cloned().unwrap_or_default()
    }
}

pub(crate) fn kind_name(e: &coffer_proto::chat::Event) -> &'static str {
    match e.kind {
        Some(Kind::MessageCreated(_)) => "message_created",
        Some(Kind::TurnStarted(_)) => "turn_started",
        Some(Kind::TextDelta(_)) => "text_delta",
        Some(Kind::ToolCall(_)) => "tool_call",
        Some(Kind::ToolResult(_)) => "tool_result",
        Some(Kind::TurnDone(_)) => "turn_done",
        Some(Kind::TurnError(_)) => "turn_error",
        Some(Kind::QueueChanged(_)) => "queue_changed",
        Some(Kind::Reset(_)) => "reset",
        Some(Kind::ApprovalRequested(_)) => "approval_requested",
        Some(Kind::ApprovalResolved(_)) => "approval_resolved",
        Some(Kind::FilesChanged(_)) => "files_changed",
        None => "",
    }
}

pub(crate) async fn until_end(sub: &mut crate::bus::Subscription) -> Vec<Arc<coffer_proto::chat::Event>> {
    let mut out = Vec::new();
    loop {
        let e = tokio::time::timeout(Duration::from_secs(10), sub.next()).await.expect("an event").expect("open");
        let end = matches!(e.kind, Some(Kind::TurnDone(_) | Kind::TurnError(_)));
        out.push(e);
        if end {
            return out;
        }
    }
}

#[tokio::test]
async fn a_turn_streams_persists_and_is_audited() {
    let r = rig(600).await;
    let id = r.conversation().await;
    let mut sub = r.engine.subscribe(&id, 0).await.unwrap();
    let reply = r.engine.send(&id, "say:hello big world".into(), "api".into()).await.unwrap();
    assert!(matches!(reply.outcome, Some(coffer_proto::chat::send_message_reply::Outcome::Message(_))));
    let events = until_end(&mut sub).await;
    let kinds: Vec<_> = events.iter().map(|e| kind_name(e)).collect();
    assert_eq!(kinds, ["message_created", "turn_started", "text_delta", "text_delta", "text_delta", "turn_done"]);
    assert!(events.windows(2).all(|w| w[1].seq == w[0].seq + 1), "consecutive seqs");
    let msgs = r.messages(&id);
    assert_eq!(msgs.len(), 2);
    assert_eq!(msgs[1].status, MessageStatus::Complete as i32);
    assert!(
        matches!(&msgs[1].blocks[..], [ContentBlockRecord { block: Some(content_block_record::Block::Text(t)) }] if t == "hello big world "),
        "{:?}",
        msgs[1].blocks
    );
    let conv = r.fake.db().convs.get(&id).cloned().unwrap();
    assert!(conv.agent_config_json.contains("\"session_id\":\"S-"), "{}", conv.agent_config_json);
    assert_eq!(conv.title, "say:hello big world", "title from the first message");
    let audit = r.fake.db().audit.clone();
    assert_eq!(audit.len(), 1);
    assert_eq!((audit[0].actor.as_str(), audit[0].action.as_str()), ("agent", "chat.turn"));
    assert!(!audit[0].detail.contains("hello"), "no message text in the audit: {}", audit[0].detail);
}

#[tokio::test]
async fn messages_sent_during_a_turn_queue_and_run_in_order_one_turn_each() {
    let r = rig(600).await;
    let id = r.conversation().await;
    let mut sub = r.engine.subscribe(&id, 0).await.unwrap();
    r.engine.send(&id, "hang".into(), "api".into()).await.unwrap();
    for i in 0..20 {
        let reply = r.engine.send(&id, format!("say:m{i}"), "api".into()).await.unwrap();
        assert!(matches!(reply.outcome, Some(coffer_proto::chat::send_message_reply::Outcome::Pending(_))), "{i}");
    }
    assert!(r.engine.interrupt(&id).await.unwrap(), "the hanging turn is interrupted");
    assert!(!r.engine.interrupt(&id).await.unwrap(), "twice: a no-op");
    let first = until_end(&mut sub).await;
    assert!(matches!(&first.last().unwrap().kind, Some(Kind::TurnDone(d)) if d.stop_reason == "interrupted"));
    let q = r.engine.pending(&r.engine.conv(&id).await.unwrap()).await;
    assert!(q.paused && q.items.len() == 20, "paused after the interrupt");
    let interrupted = r.messages(&id)[1].clone();
    assert_eq!(interrupted.status, MessageStatus::Interrupted as i32);
    r.engine.set_pending(&id, q.items, false).await.unwrap();
    let mut said = Vec::new();
    for _ in 0..20 {
        let turn = until_end(&mut sub).await;
        let text: String = turn
            .iter()
            .filter_map(|e| match &e.kind {
                Some(Kind::TextDelta(d)) => Some(d.text.clone()),
                _ => None,
            })
            .collect();
        said.push(text.trim().to_owned());
    }
    let want: Vec<String> = (0..20).map(|i| format!("m{i}")).collect();
    assert_eq!(said, want, "in order, one turn each");
    assert!(!r.engine.interrupt(&id).await.unwrap(), "idle: a no-op");
}

/// The texts of the deltas of `events`.
pub(crate) fn said(events: &[Arc<coffer_proto::chat::Event>]) -> String {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            Some(Kind::TextDelta(d)) => Some(d.text.as_str()),
            _ => None,
        })
        .collect()
}

/// A message's text blocks joined.
pub(crate) fn stored_text(m: &MessageRecord) -> String {
    m.blocks
        .iter()
        .filter_map(|b| match &b.block {
            Some(content_block_record::Block::Text(t)) => Some(t.as_str()),
            _ => None,
        })
        .collect()
}

fn short_retry() -> crate::engine::Tuning {
    crate::engine::Tuning { store_retry: Duration::from_millis(400), ..Default::default() }
}

#[tokio::test]
async fn turn_done_waits_until_the_answer_is_stored_across_a_store_restart() {
    let r = rig(600).await;
    let id = r.conversation().await;
    let mut sub = r.engine.subscribe(&id, 0).await.unwrap();
    r.fake.db().faults.insert("update_message", 3);
    r.engine.send(&id, "say:stored at last".into(), "api".into()).await.unwrap();
    let events = until_end(&mut sub).await;
    assert!(matches!(&events.last().unwrap().kind, Some(Kind::TurnDone(_))), "{events:?}");
    // At turn_done the answer is in the store already.
    let msgs = r.messages(&id);
    assert_eq!((msgs.len(), msgs[1].status), (2, MessageStatus::Complete as i32), "{msgs:?}");
    assert_eq!(stored_text(&msgs[1]), "stored at last ");
    assert_eq!(r.fake.db().faults["update_message"], 0, "the first three writes failed");
}

#[tokio::test]
async fn an_answer_the_store_never_takes_is_a_turn_error_never_turn_done() {
    let r = rig_tuned(600, short_retry()).await;
    let id = r.conversation().await;
    let mut sub = r.engine.subscribe(&id, 0).await.unwrap();
    r.engine.send(&id, "hang".into(), "api".into()).await.unwrap();
    r.engine.send(&id, "say:next".into(), "api".into()).await.unwrap();
    r.fake.db().faults.insert("update_message", u32::MAX);
    // The interrupt's `turn_done{interrupted}` cannot be stored either.
    r.engine.interrupt(&id).await.unwrap();
    let events = until_end(&mut sub).await;
    let Some(Kind::TurnError(e)) = &events.last().unwrap().kind else { panic!("{events:?}") };
    assert_eq!(e.code, "internal");
    assert!(e.message.contains("could not store the answer"), "{e:?}");
    assert!(!events.iter().any(|e| matches!(e.kind, Some(Kind::TurnDone(_)))));
    let q = r.engine.pending(&r.engine.conv(&id).await.unwrap()).await;
    assert!(q.paused && q.items.len() == 1, "the queue waits for the owner: {q:?}");
}

#[tokio::test]
async fn queued_items_start_exactly_once_across_store_failures() {
    let r = rig(600).await;
    let id = r.conversation().await;
    let mut sub = r.engine.subscribe(&id, 0).await.unwrap();
    r.engine.send(&id, "hang".into(), "api".into()).await.unwrap();
    let mut ids = Vec::new();
    for i in 0..5 {
        let reply = r.engine.send(&id, format!("say:m{i}"), "api".into()).await.unwrap();
        let Some(coffer_proto::chat::send_message_reply::Outcome::Pending(p)) = reply.outcome else { panic!() };
        ids.push(p.id);
    }
    r.engine.interrupt(&id).await.unwrap();
    until_end(&mut sub).await;
    r.fake.db().faults.insert("start_turn", 4);
    let q = r.engine.pending(&r.engine.conv(&id).await.unwrap()).await;
    r.engine.set_pending(&id, q.items, false).await.unwrap();
    let mut texts = Vec::new();
    for _ in 0..5 {
        texts.push(said(&until_end(&mut sub).await).trim().to_owned());
    }
    assert_eq!(texts, ["m0", "m1", "m2", "m3", "m4"]);
    let users: Vec<String> =
        r.messages(&id).iter().filter(|m| m.role == MessageRole::User as i32).skip(1).map(|m| m.id.clone()).collect();
    assert_eq!(users, ids, "each item became the user message of its id, once");
    assert!(r.fake.db().pending[&id].items.is_empty());
}

#[tokio::test]
async fn an_item_the_store_will_not_start_stays_first_and_pauses_the_queue() {
    let r = rig_tuned(600, short_retry()).await;
    let id = r.conversation().await;
    let mut sub = r.engine.subscribe(&id, 0).await.unwrap();
    let mut list = r.engine.watch_conversations();
    r.engine.send(&id, "hang".into(), "api".into()).await.unwrap();
    r.engine.send(&id, "say:a".into(), "api".into()).await.unwrap();
    r.engine.send(&id, "say:b".into(), "api".into()).await.unwrap();
    r.engine.interrupt(&id).await.unwrap();
    until_end(&mut sub).await;
    // The hang's turn task has drained (else it, not set_pending, takes the next item): the
    // run loop touches the list's watch when the task ends.
    let drained = async {
        while !r.engine.settled(&id).await {
            list.next().await.expect("the list's watch goes on");
        }
    };
    tokio::time::timeout(Duration::from_secs(10), drained).await.expect("the interrupted turn's task never ended");
    r.fake.db().faults.insert("start_turn", u32::MAX);
    let q = r.engine.pending(&r.engine.conv(&id).await.unwrap()).await;
    let items = q.items.clone();
    let after = r.engine.set_pending(&id, q.items, false).await.unwrap();
    assert!(after.paused, "paused when the store would not start the item: {after:?}");
    assert_eq!(after.items, items, "nothing dropped, nothing reordered");
    assert_eq!(r.messages(&id).len(), 2, "nothing appended");
    r.fake.db().faults.clear();
    r.engine.set_pending(&id, after.items, false).await.unwrap();
    assert_eq!(said(&until_end(&mut sub).await), "a ");
    assert_eq!(said(&until_end(&mut sub).await), "b ");
    assert_eq!(r.messages(&id).len(), 6);
}

#[tokio::test]
async fn a_resumed_item_keeps_when_and_from_where_it_was_sent() {
    let r = rig(600).await;
    let id = r.conversation().await;
    let mut sub = r.engine.subscribe(&id, 0).await.unwrap();
    r.engine.send(&id, "hang".into(), "api".into()).await.unwrap();
    r.engine.send(&id, "say:queued".into(), "cli".into()).await.unwrap();
    assert!(r.engine.interrupt(&id).await.unwrap());
    until_end(&mut sub).await;
    let q = r.engine.pending(&r.engine.conv(&id).await.unwrap()).await;
    let sent = q.items[0].clone();
    assert_eq!(sent.source, "cli");
    // As `PUT …/pending` (and `coffer chat pending --resume`) sends it back: id and text only.
    let back = coffer_proto::chat::PendingItem { id: sent.id.clone(), text: sent.text.clone(), ..Default::default() };
    let resumed = r.engine.set_pending(&id, vec![back], true).await.unwrap();
    assert_eq!((resumed.items[0].created_ms, resumed.items[0].source.as_str()), (sent.created_ms, "cli"));
    r.engine.set_pending(&id, resumed.items, false).await.unwrap();
    until_end(&mut sub).await;
    let user = r.messages(&id).into_iter().rfind(|m| m.role == MessageRole::User as i32).unwrap();
    assert_eq!(user.source, "cli", "the message run from the queue says where it was sent from");
}

#[tokio::test]
async fn exit_mid_turn_and_a_hang_past_the_timeout_are_turn_errors_and_pause_the_queue() {
    let r = rig(1).await;
    let id = r.conversation().await;
    let mut sub = r.engine.subscribe(&id, 0).await.unwrap();
    r.engine.send(&id, "exit".into(), "api".into()).await.unwrap();
    let ev = until_end(&mut sub).await;
    assert!(matches!(&ev.last().unwrap().kind, Some(Kind::TurnError(e)) if e.code == "cli_exited"), "{ev:?}");
    let q = r.engine.pending(&r.engine.conv(&id).await.unwrap()).await;
    assert!(q.paused, "paused after turn_error");
    r.engine.set_pending(&id, vec![], false).await.unwrap();
    r.engine.send(&id, "hang".into(), "api".into()).await.unwrap();
    let ev = until_end(&mut sub).await;
    assert!(matches!(&ev.last().unwrap().kind, Some(Kind::TurnError(e)) if e.code == "timeout"), "{ev:?}");
    r.engine.set_pending(&id, vec![], false).await.unwrap();
    r.engine.send(&id, "say:still here".into(), "api".into()).await.unwrap();
    let ev = until_end(&mut sub).await;
    assert!(matches!(&ev.last().unwrap().kind, Some(Kind::TurnDone(_))), "usable after: {ev:?}");
    let statuses: Vec<i32> = r.messages(&id).iter().map(|m| m.status).collect();
    assert!(!statuses.contains(&(MessageStatus::Streaming as i32)), "{statuses:?}");
}

#[tokio::test]
async fn delete_during_a_turn_cancels_it_and_resets_subscribers() {
    let r = rig(600).await;
    let id = r.conversation().await;
    let mut sub = r.engine.subscribe(&id, 0).await.unwrap();
    r.engine.send(&id, "hang".into(), "api".into()).await.unwrap();
    loop {
        let e = sub.next().await.unwrap();
        if matches!(e.kind, Some(Kind::TextDelta(_))) {
            break;
        }
    }
    assert!(r.engine.delete(&id).await.unwrap(), "a turn was cancelled");
    let e = sub.next().await.unwrap();
    assert!(matches!(&e.kind, Some(Kind::Reset(x)) if x.reason == "deleted"), "{e:?}");
    assert!(sub.next().await.is_none());
    assert!(r.fake.db().convs.is_empty() && r.fake.db().messages.is_empty());
    assert!(r.engine.send(&id, "x".into(), "api".into()).await.unwrap_err().to_string().contains("not found"));
}

/// The next list change within the deadline.
async fn change(w: &mut crate::watch::Watcher) -> coffer_proto::chat::conversation_change::Change {
    let c = tokio::time::timeout(Duration::from_secs(10), w.next()).await.expect("a change in time").expect("open");
    c.change.expect("a change")
}

#[tokio::test]
async fn list_watchers_see_turns_queues_and_deletes_as_the_list_shows_them() {
    use coffer_proto::chat::conversation_change::Change;
    let r = rig(600).await;
    let id = r.conversation().await;
    let mut w = r.engine.watch_conversations();
    let mut sub = r.engine.subscribe(&id, 0).await.unwrap();
    r.engine.send(&id, "hang".into(), "api".into()).await.unwrap();
    // Changes are coalesced: wait until one shows the turn running.
    loop {
        if let Change::Conversation(c) = change(&mut w).await {
            assert_eq!(c.id, id);
            if c.turn_running {
                break;
            }
        }
    }
    r.engine.send(&id, "say:queued".into(), "api".into()).await.unwrap();
    loop {
        if let Change::Conversation(c) = change(&mut w).await
            && c.pending_count == 1
        {
            assert!(c.turn_running);
            break;
        }
    }
    r.engine.interrupt(&id).await.unwrap();
    until_end(&mut sub).await;
    let last = loop {
        if let Change::Conversation(c) = change(&mut w).await
            && !c.turn_running
            && c.pending_paused
        {
            break c;
        }
    };
    assert_eq!((last.pending_count, last.message_count), (1, 2), "{last:?}");
    r.engine.delete(&id).await.unwrap();
    loop {
        match change(&mut w).await {
            Change::Deleted(gone) => {
                assert_eq!(gone, id);
                break;
            }
            Change::Conversation(_) => {}
            Change::Reset(r) => panic!("unexpected reset {r:?}"),
        }
    }
}

#[tokio::test]
async fn a_list_watcher_that_falls_behind_gets_reset_lagged_and_its_stream_ends() {
    use coffer_proto::chat::conversation_change::Change;
    let r = rig(600).await;
    let mut slow = r.engine.watch_conversations();
    let mut fast = r.engine.watch_conversations();
    let n = crate::watch::WATCH_BUFFER + 50;
    let ids: Vec<String> = (0..n).map(|_| crate::engine::new_id()).collect();
    for id in &ids {
        r.engine.touch(id);
    }
    // The fast watcher sees every one (unknown ids read as deleted), in order.
    for id in &ids {
        assert!(matches!(change(&mut fast).await, Change::Deleted(d) if &d == id));
    }
    match change(&mut slow).await {
        Change::Reset(reset) => assert_eq!(reset.reason, "lagged"),
        other => panic!("expected reset, got {other:?}"),
    }
    assert!(slow.next().await.is_none(), "the lagged stream ends");
    // The other watcher goes on.
    let id = r.conversation().await;
    r.engine.touch(&id);
    assert!(matches!(change(&mut fast).await, Change::Conversation(c) if c.id == id));
}

/// A model set after creation (the web page's PATCH, a channel's `/model`) passes the provider's
/// own rule, as at creation: an option-looking model never reaches the agent's command line.
#[tokio::test]
async fn an_updated_model_is_validated_by_the_provider() {
    let r = rig(30).await;
    let id = r.conversation().await;
    let req = |m: &str| coffer_proto::chat::UpdateConversationRequest {
        id: id.clone(),
        model: Some(m.to_owned()),
        ..Default::default()
    };
    let e = r.engine.update_conversation(req("--dangerously-skip-permissions")).await.unwrap_err();
    assert!(e.to_string().contains("agent_config.model"), "{e}");
    let ok = r.engine.update_conversation(req("opus")).await.unwrap();
    assert_eq!(ok.agent_config.unwrap_or_default().model, "opus");
}
