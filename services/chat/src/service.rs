//! The `coffer.chat.v1.Chat` service: each RPC validated here (messages name the field and its
//! limit) and handed to the registry or the [`Engine`]; errors become `Status` once
//! ([`crate::error`]).
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

use crate::adapter::{AgentConfig, Availability};
use crate::engine::{self, Engine, check_cwd, check_id, check_text, title_from};
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
            .collect();
        c::ListAgentsReply { agents }
    }

    /// `CreateConversation`, validated (also the channel bridge's `/new` and first message).
    pub(crate) async fn create(&self, r: c::CreateConversationRequest) -> Result<c::Conversation> {
        let reg = self.engine.registry();
        if r.agent_key.is_empty() {
            return Err(Error::Invalid("agent_key: empty; name one of ListAgents' agents".into()));
        }
        let Some(entry) = reg.get(&r.agent_key) else {
            let known: Vec<&str> = reg.entries().iter().map(|e| e.provider.key()).collect();
            return Err(Error::NotFound(format!(
                "agent {:?} is not registered (known: {})",
                r.agent_key,
                known.join(", ")
            )));
        };
        if let Availability::Unavailable { reason } = reg.availability(entry, &self.engine.config()) {
            return Err(Error::Precondition(format!("agent {} is not available: {reason}", r.agent_key)));
        }
        if r.title.chars().count() > engine::MAX_TITLE_CHARS {
            return Err(Error::Invalid(format!("title: over the limit of {} characters", engine::MAX_TITLE_CHARS)));
        }
        if !r.first_message.is_empty() {
            check_text("first_message", &r.first_message)?;
            engine::check_source(&r.source)?;
        }
        let given = r.agent_config.unwrap_or_default();
        if !given.session_id.is_empty() {
            return Err(Error::Invalid("agent_config.session_id: must be empty when a conversation is created".into()));
        }
        let mut config = AgentConfig { cwd: given.cwd, model: given.model, session_id: String::new() };
        config.cwd = check_cwd(self.engine.home(), &config.cwd)?;
        entry.provider.validate_config(&mut config).map_err(|e| Error::Invalid(format!("agent_config.{e}")))?;
        let title = if r.title.trim().is_empty() { title_from(&r.first_message) } else { r.title.trim().to_owned() };
        let record = st::ConversationRecord {
            id: engine::new_id(),
            agent_key: r.agent_key.clone(),
            title,
            agent_config_json: persist::config_json(&config),
            channel_name: r.channel_name,
            peer_chat_id: r.peer_chat_id,
            ..Default::default()
        };
        let created = self.engine.store().create(record).await?;
        self.engine.touch(&created.id);
        if !r.first_message.is_empty() {
            self.engine.send(&created.id, r.first_message, r.source).await?;
            let now = self.engine.store().get(&created.id).await?;
            return Ok(self.engine.view(&now));
        }
        Ok(self.engine.view(&created))
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
        let record = self.engine.store().get(&r.id).await?;
        let page = self
            .engine
            .store()
            .messages(st::ListMessagesRequest {
                conversation_id: r.id.clone(),
                limit,
                newest: true,
                ..Default::default()
            })
            .await?;
        let more_before = record.message_count > page.messages.len() as u64;
        Ok(c::ConversationView {
            conversation: Some(self.engine.view(&record)),
            messages: page.messages.iter().map(persist::message).collect(),
            more_before,
            pending: Some(self.engine.pending(&conv).await),
            last_seq: self.engine.last_seq(&conv).await?,
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
            })
            .await?;
        Ok(c::ListMessagesReply {
            messages: page.messages.iter().map(persist::message).collect(),
            next_after_id: page.next_after_id,
        })
    }

    /// `UpdateConversation`, validated (also the channel bridge's `/model`).
    pub(crate) async fn update(&self, r: c::UpdateConversationRequest) -> Result<c::Conversation> {
        check_id("id", &r.id)?;
        let title = match r.title {
            Some(t) if t.trim().is_empty() => return Err(Error::Invalid("title: empty".into())),
            Some(t) if t.chars().count() > engine::MAX_TITLE_CHARS => {
                return Err(Error::Invalid(format!("title: over the limit of {} characters", engine::MAX_TITLE_CHARS)));
            }
            t => t.map(|t| t.trim().to_owned()),
        };
        let current = self.engine.store().get(&r.id).await?;
        if let Some(v) = r.expected_version
            && v != current.version
        {
            return Err(Error::Aborted(format!(
                "conversation {} is at version {}, not {v}: reload it",
                r.id, current.version
            )));
        }
        let agent_config_json = match r.model {
            Some(model) => {
                if model.len() > 256 || model.chars().any(char::is_control) {
                    return Err(Error::Invalid("model: at most 256 bytes without control characters".into()));
                }
                let mut cfg = persist::parse_config(&current.agent_config_json);
                cfg.model = model.trim().to_owned();
                // The provider's own rule, as at creation (e.g. Claude Code's model is a CLI
                // argument: never one that starts with '-').
                if let Some(entry) = self.engine.registry().get(&current.agent_key) {
                    entry
                        .provider
                        .validate_config(&mut cfg)
                        .map_err(|e| Error::Invalid(format!("agent_config.{e}")))?;
                }
                Some(persist::config_json(&cfg))
            }
            None => None,
        };
        let updated = self
            .engine
            .store()
            .update(st::UpdateConversationRequest {
                id: r.id,
                expected_version: r.expected_version,
                title,
                agent_config_json,
                archived: r.archived,
            })
            .await
            .map_err(|e| match e {
                Error::Store(s) if s.code() == tonic::Code::Aborted => Error::Aborted(s.message().to_owned()),
                e => e,
            })?;
        self.engine.touch(&updated.id);
        Ok(self.engine.view(&updated))
    }
}

#[tonic::async_trait]
impl Chat for ChatService {
    async fn list_agents(&self, _req: Request<c::ListAgentsRequest>) -> Reply<c::ListAgentsReply> {
        Ok(Response::new(self.agents().await))
    }

    async fn create_conversation(&self, req: Request<c::CreateConversationRequest>) -> Reply<c::Conversation> {
        ok(self.create(req.into_inner()).await)
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
        ok(self.update(req.into_inner()).await)
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
        ok(self.engine.send(&r.conversation_id, r.text, r.source).await)
    }

    async fn set_pending(&self, req: Request<c::SetPendingRequest>) -> Reply<c::PendingQueue> {
        let r = req.into_inner();
        ok(self.engine.set_pending(&r.conversation_id, r.items, r.paused).await)
    }

    async fn interrupt(&self, req: Request<c::ConversationRef>) -> Reply<c::InterruptReply> {
        let id = req.into_inner().id;
        ok(self.engine.interrupt(&id).await.map(|interrupted| c::InterruptReply { interrupted }))
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
