//! The `coffer.chat.v1.Chat` service: each RPC validated here (messages name the field and its
//! limit) and handed to the registry or the [`Engine`] — creating and updating a conversation
//! are the engine's own ([`Engine::create_conversation`], [`Engine::update_conversation`]), so
//! the channel adapters call the same rules; errors become `Status` once ([`crate::error`]).
//!
//! Validation (each message names the field and its limit): the agent known (`NOT_FOUND` naming
//! it) and available (`FAILED_PRECONDITION` with the reason); `cwd` absolute and an existing
//! directory, by default `COFFER_HOME/workspace` (created on first use); `session_id` empty on
//! create; texts 1 B–1 MiB; ids ULIDs.
use std::pin::Pin;
use std::sync::Arc;

use coffer_proto::chat::chat_server::Chat;
use coffer_proto::chat::{self as c, list_conversations_request::Archived};
use coffer_proto::store as st;
use tonic::{Request, Response, Status};

use crate::adapter::Availability;
use crate::engine::{Engine, check_id};
use crate::error::{Error, Result};
use crate::persist;

/// The service's state.
pub struct ChatService {
    /// Conversations' live state, the store and the registry.
    pub engine: Arc<Engine>,
}

type Reply<T> = std::result::Result<Response<T>, Status>;

fn ok<T>(r: Result<T>) -> Reply<T> {
    r.map(Response::new).map_err(Status::from)
}

/// The stream `Subscribe` answers with.
pub type EventStream = Pin<Box<dyn tokio_stream::Stream<Item = std::result::Result<c::Event, Status>> + Send>>;

/// The stream `WatchConversations` answers with.
pub type ChangeStream =
    Pin<Box<dyn tokio_stream::Stream<Item = std::result::Result<c::ConversationChange, Status>> + Send>>;

impl ChatService {
    async fn agents(&self) -> c::ListAgentsReply {
        let reg = self.engine.registry();
        let cfg = self.engine.config();
        // Connections are read only when some agent is bound (no store call otherwise).
        let bound = reg.entries().iter().any(|e| reg.bound_to(e, &cfg).is_some());
        let known = if bound { reg.connection_records().await } else { Vec::new() };
        let agents = reg
            .entries()
            .iter()
            .map(|e| {
                let (available, reason, command, version) = match reg.availability(e, &cfg) {
                    Availability::Available { command, version } => {
                        (true, String::new(), command.display().to_string(), version.unwrap_or_default())
                    }
                    Availability::Unavailable { reason } => (false, reason, String::new(), String::new()),
                };
                c::Agent {
                    agent_key: e.provider.key().to_owned(),
                    display_name: e.provider.display_name().to_owned(),
                    available,
                    reason,
                    command,
                    version,
                    binding: reg.bound_to(e, &cfg).map(|_| {
                        let b = reg.binding_view(e, &cfg, &known);
                        c::AgentBinding {
                            connection: b.connection,
                            model: b.model,
                            fast_model: b.fast_model,
                            wire: b.wire,
                            problem: b.problem,
                        }
                    }),
                }
            })
            .collect::<Vec<c::Agent>>();
        // The versions the providers do not know: each available CLI asked once (cached).
        let agents = futures_util::future::join_all(agents.into_iter().map(|mut a| async move {
            if a.available && a.version.is_empty() {
                a.version = crate::agent_version::detect(std::path::Path::new(&a.command)).await.unwrap_or_default();
            }
            a
        }))
        .await;
        c::ListAgentsReply { agents }
    }

    async fn list(&self, r: c::ListConversationsRequest) -> Result<c::ListConversationsReply> {
        if r.limit > 200 {
            return Err(Error::Invalid(format!("limit: {} is over 200", r.limit)));
        }
        let archived = match Archived::try_from(r.archived).unwrap_or(Archived::Unspecified) {
            Archived::Unspecified | Archived::Active => st::ArchivedFilter::Active,
            Archived::Archived => st::ArchivedFilter::Archived,
            Archived::All => st::ArchivedFilter::Unspecified,
        };
        let page = self
            .engine
            .store()
            .list(st::ListConversationsRequest {
                archived: archived as i32,
                title_contains: r.query,
                cursor: r.cursor,
                limit: r.limit,
                ..Default::default()
            })
            .await?;
        Ok(c::ListConversationsReply {
            conversations: page.conversations.iter().map(|r| self.engine.view(r)).collect(),
            next_cursor: page.next_cursor,
        })
    }

    async fn get(&self, r: c::GetConversationRequest) -> Result<c::ConversationView> {
        check_id("id", &r.id)?;
        if r.message_limit > 500 {
            return Err(Error::Invalid(format!("message_limit: {} is over 500", r.message_limit)));
        }
        let limit = if r.message_limit == 0 { 100 } else { r.message_limit };
        let conv = self.engine.conv(&r.id).await?;
        // The stored messages, the queue and the live state are read together (under the
        // conversation's lock): an item moving from the queue to the messages is in one of them,
        // and an idle conversation with an empty queue shows every message it ran.
        let (pending, read) = self
            .engine
            .pending_with(&conv, |live| async move {
                let store = self.engine.store();
                let record = store.get(&r.id).await?;
                let page = store
                    .messages(st::ListMessagesRequest {
                        conversation_id: r.id.clone(),
                        limit,
                        newest: true,
                        ..Default::default()
                    })
                    .await?;
                Ok::<_, Error>((crate::engine::view_with(&record, Some(live)), record.message_count, page))
            })
            .await;
        let (conversation, message_count, page) = read?;
        Ok(c::ConversationView {
            conversation: Some(conversation),
            messages: page.messages.iter().map(persist::message).collect(),
            more_before: message_count > page.messages.len() as u64,
            pending: Some(pending),
            last_seq: self.engine.last_seq(&conv).await?,
            approvals: self.engine.approvals(&conv),
            allowed_tools: self.engine.allowed_tools(&conv),
        })
    }

    async fn messages(&self, r: c::ListMessagesRequest) -> Result<c::ListMessagesReply> {
        check_id("conversation_id", &r.conversation_id)?;
        if !r.after_id.is_empty() {
            check_id("after_id", &r.after_id)?;
        }
        if r.limit > 500 {
            return Err(Error::Invalid(format!("limit: {} is over 500", r.limit)));
        }
        self.engine.store().get(&r.conversation_id).await?;
        let page = self
            .engine
            .store()
            .messages(st::ListMessagesRequest {
                conversation_id: r.conversation_id,
                after_id: r.after_id,
                limit: r.limit,
                newest: false,
                inclusive: false,
            })
            .await?;
        Ok(c::ListMessagesReply {
            messages: page.messages.iter().map(persist::message).collect(),
            next_after_id: page.next_after_id,
        })
    }
}

#[tonic::async_trait]
impl Chat for ChatService {
    async fn list_agents(&self, _req: Request<c::ListAgentsRequest>) -> Reply<c::ListAgentsReply> {
        Ok(Response::new(self.agents().await))
    }

    async fn create_conversation(&self, req: Request<c::CreateConversationRequest>) -> Reply<c::Conversation> {
        ok(self.engine.create_conversation(req.into_inner()).await)
    }

    async fn list_conversations(&self, req: Request<c::ListConversationsRequest>) -> Reply<c::ListConversationsReply> {
        ok(self.list(req.into_inner()).await)
    }

    async fn get_conversation(&self, req: Request<c::GetConversationRequest>) -> Reply<c::ConversationView> {
        ok(self.get(req.into_inner()).await)
    }

    async fn list_messages(&self, req: Request<c::ListMessagesRequest>) -> Reply<c::ListMessagesReply> {
        ok(self.messages(req.into_inner()).await)
    }

    async fn update_conversation(&self, req: Request<c::UpdateConversationRequest>) -> Reply<c::Conversation> {
        ok(self.engine.update_conversation(req.into_inner()).await)
    }

    async fn delete_conversation(&self, req: Request<c::ConversationRef>) -> Reply<c::DeleteConversationReply> {
        let id = req.into_inner().id;
        ok(self
            .engine
            .delete(&id)
            .await
            .map(|turn_cancelled| c::DeleteConversationReply { deleted: true, turn_cancelled }))
    }

    async fn send_message(&self, req: Request<c::SendMessageRequest>) -> Reply<c::SendMessageReply> {
        let r = req.into_inner();
        ok(self.engine.submit(&r.conversation_id, r.text, r.source, r.now, r.attachments).await)
    }

    async fn set_pending(&self, req: Request<c::SetPendingRequest>) -> Reply<c::PendingQueue> {
        let r = req.into_inner();
        ok(self.engine.set_pending(&r.conversation_id, r.items, r.paused).await)
    }

    async fn interrupt(&self, req: Request<c::ConversationRef>) -> Reply<c::InterruptReply> {
        let id = req.into_inner().id;
        ok(self.engine.interrupt(&id).await.map(|interrupted| c::InterruptReply { interrupted }))
    }

    async fn answer_approval(&self, req: Request<c::AnswerApprovalRequest>) -> Reply<c::ApprovalResolved> {
        ok(self.engine.answer_approval(req.into_inner()).await)
    }

    async fn get_file_diff(&self, req: Request<c::GetFileDiffRequest>) -> Reply<c::FileDiff> {
        let r = req.into_inner();
        let diff = self.engine.file_diff(&r.conversation_id, &r.message_id, &r.path).await;
        ok(diff.map(|diff| c::FileDiff { path: r.path, diff }))
    }

    async fn get_attachment(&self, req: Request<c::GetAttachmentRequest>) -> Reply<c::AttachmentFile> {
        let r = req.into_inner();
        let got = self.engine.attachment(&r.conversation_id, &r.message_id, &r.name).await;
        ok(got.map(|(mime, data)| c::AttachmentFile { name: r.name, mime, data }))
    }

    async fn forget_allowed_tools(&self, req: Request<c::ConversationRef>) -> Reply<c::ForgetAllowedToolsReply> {
        let id = req.into_inner().id;
        ok(self.engine.forget_allowed_tools(&id, "api").await.map(|forgotten| c::ForgetAllowedToolsReply { forgotten }))
    }

    async fn list_agent_sessions(&self, req: Request<c::ListAgentSessionsRequest>) -> Reply<c::ListAgentSessionsReply> {
        ok(self.engine.list_agent_sessions(req.into_inner()).await)
    }

    async fn import_agent_session(&self, req: Request<c::ImportAgentSessionRequest>) -> Reply<c::Conversation> {
        ok(self.engine.import_agent_session(req.into_inner()).await)
    }

    async fn list_projects(&self, req: Request<c::ListProjectsRequest>) -> Reply<c::ListProjectsReply> {
        ok(self.engine.list_projects(req.into_inner()).await)
    }

    type SubscribeStream = EventStream;
    type WatchConversationsStream = ChangeStream;

    async fn watch_conversations(
        &self,
        _req: Request<c::WatchConversationsRequest>,
    ) -> Reply<Self::WatchConversationsStream> {
        let watcher = self.engine.watch_conversations();
        let stream = futures_util::stream::unfold(watcher, |mut w| async move {
            let change = w.next().await?;
            Some((Ok(change), w))
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn subscribe(&self, req: Request<c::SubscribeRequest>) -> Reply<Self::SubscribeStream> {
        let r = req.into_inner();
        let sub = self.engine.subscribe(&r.conversation_id, r.after_seq).await.map_err(Status::from)?;
        let stream = futures_util::stream::unfold(sub, |mut sub| async move {
            let e = sub.next().await?;
            Some((Ok(Arc::unwrap_or_clone(e)), sub))
        });
        Ok(Response::new(Box::pin(stream)))
    }
}
