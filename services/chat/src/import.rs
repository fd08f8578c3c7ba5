//! Continuing the sessions the user already has (issue 34 §5): listing their Claude Code and
//! Codex sessions ([`crate::sessions`]) with the conversation already bound to each, importing
//! one as a conversation bound to it, and the project picker's working directories
//! ([`crate::projects`]).
//!
//! An import creates the conversation with `agent_config.session_id` = the session and `cwd` =
//! its folder, so the adapters resume it on the next turn (`--resume` / `thread/resume`), and
//! copies the transcript's user/assistant text (tool calls briefly) into it as messages of
//! source `import:<agent>` (`Message.imported`): a snapshot taken once, rather than the
//! transcript rendered on each read, because the agent keeps appending to the same transcript
//! when the session is resumed (rendering it would show every new turn twice), the messages
//! then need no second reader on every surface (console, CLI, channels page through them as
//! through any message), and the history stays after the user deletes or moves the transcript.
//! At most [`MAX_IMPORTED_MESSAGES`] of the newest are copied (a first message says how many
//! were left out).
//!
//! Codex keeps its threads under its `CODEX_HOME`, and Coffer runs Codex with its own
//! (`COFFER_HOME/agents/codex`, see [`crate::codex`]): the rollout is copied there (same
//! `sessions/YYYY/MM/DD/` path) so `thread/resume` finds it; the user's own file is left as it
//! was. Claude Code runs with the user's own config dir, so its `--resume` reads the user's
//! transcript where it is.
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use coffer_proto::chat as c;
use coffer_proto::store as st;

use crate::adapter::{AgentConfig, Availability};
use crate::engine::{Engine, MAX_TITLE_CHARS, check_source, new_id, title_from};
use crate::error::{Error, Result};
use crate::persist::{self, IMPORTED_SOURCE_PREFIX};
use crate::projects;
use crate::sessions::{self, Role, Roots};

/// Messages copied from one transcript at most (the newest).
pub const MAX_IMPORTED_MESSAGES: usize = 500;
/// Bytes of one imported message's text at most (longer ones are cut, saying so).
pub const MAX_IMPORTED_TEXT_BYTES: usize = 64 << 10;
/// Conversations looked at to find the ones bound to sessions.
const MAX_CONVERSATIONS_SCANNED: usize = 5_000;

/// Imports run one at a time, so two imports of the same session cannot both pass the
/// "already imported" check.
static IMPORTING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

impl Engine {
    /// `ListAgentSessions`: the newest sessions of `agent_key` (empty: both), each with the
    /// conversation already bound to it.
    ///
    /// # Errors
    /// [`Error::Invalid`] for an agent without sessions or a limit over 200; a store error.
    pub async fn list_agent_sessions(&self, r: c::ListAgentSessionsRequest) -> Result<c::ListAgentSessionsReply> {
        let agent = sessions::check_agent(&r.agent_key, true)?;
        if r.limit as usize > sessions::MAX_LIMIT {
            return Err(Error::Invalid(format!("limit: {} is over {}", r.limit, sessions::MAX_LIMIT)));
        }
        let limit = r.limit as usize;
        let listing = tokio::task::spawn_blocking(move || sessions::list(&Roots::from_env(), agent, limit))
            .await
            .map_err(|e| Error::Internal(format!("the session listing failed: {e}")))?;
        let bound = self.bound_sessions().await?;
        Ok(c::ListAgentSessionsReply {
            sessions: listing
                .sessions
                .into_iter()
                .map(|s| c::AgentSession {
                    conversation_id: bound
                        .get(&(s.agent_key.to_owned(), s.session_id.clone()))
                        .cloned()
                        .unwrap_or_default(),
                    agent_key: s.agent_key.to_owned(),
                    session_id: s.session_id,
                    cwd: s.cwd,
                    first_prompt: s.first_prompt,
                    last_activity_ms: s.last_activity_ms,
                    message_count: s.message_count,
                    size_bytes: s.size_bytes,
                    partial: s.partial,
                })
                .collect(),
            skipped_files: listing.skipped_files,
            skipped_lines: listing.skipped_lines,
            truncated: listing.truncated,
        })
    }

    /// (agent key, session id) → the id of the newest conversation bound to it (archived ones
    /// included), over the newest [`MAX_CONVERSATIONS_SCANNED`] conversations.
    async fn bound_sessions(&self) -> Result<HashMap<(String, String), String>> {
        let mut out = HashMap::new();
        let mut cursor = String::new();
        let mut seen = 0;
        loop {
            let page = self
                .store()
                .list(st::ListConversationsRequest {
                    archived: st::ArchivedFilter::Unspecified as i32,
                    cursor: cursor.clone(),
                    limit: 200,
                    ..Default::default()
                })
                .await?;
            seen += page.conversations.len();
            for r in page.conversations {
                let cfg = persist::parse_config(&r.agent_config_json);
                if !cfg.session_id.is_empty() {
                    out.entry((r.agent_key, cfg.session_id)).or_insert(r.id);
                }
            }
            if page.next_cursor.is_empty() || seen >= MAX_CONVERSATIONS_SCANNED {
                return Ok(out);
            }
            cursor = page.next_cursor;
        }
    }

    /// `ImportAgentSession`: a conversation bound to the user's session `session_id` of
    /// `agent_key`, its transcript's history copied in as imported messages (module docs).
    ///
    /// # Errors
    /// [`Error::Invalid`] (agent, session id, title), [`Error::NotFound`] (no such session, or
    /// an agent that is not registered), [`Error::AlreadyExists`] naming the conversation
    /// already bound to it, [`Error::Precondition`] (agent unavailable, its folder gone), or a
    /// store error.
    pub async fn import_agent_session(self: &Arc<Self>, r: c::ImportAgentSessionRequest) -> Result<c::Conversation> {
        let agent = sessions::check_agent(&r.agent_key, false)?.unwrap_or(sessions::CLAUDE_CODE);
        sessions::check_session_id(&r.session_id)?;
        if r.title.chars().count() > MAX_TITLE_CHARS {
            return Err(Error::Invalid(format!("title: over the limit of {MAX_TITLE_CHARS} characters")));
        }
        let reg = self.registry();
        let Some(entry) = reg.get(agent) else {
            return Err(Error::NotFound(format!("agent {agent:?} is not registered")));
        };
        if let Availability::Unavailable { reason } = reg.availability(entry, &self.config()) {
            return Err(Error::Precondition(format!("agent {agent} is not available: {reason}")));
        }
        let id = r.session_id.clone();
        let (path, transcript) = tokio::task::spawn_blocking(move || {
            let path = sessions::find(&Roots::from_env(), agent, &id)?;
            let t = sessions::read(agent, &path)?;
            Ok::<_, Error>((path, t))
        })
        .await
        .map_err(|e| Error::Internal(format!("reading the transcript failed: {e}")))??;
        if transcript.cwd.is_empty() {
            return Err(Error::Precondition(format!(
                "{agent} session {} does not record the folder it ran in",
                r.session_id
            )));
        }
        if !Path::new(&transcript.cwd).is_dir() {
            return Err(Error::Precondition(format!(
                "the folder of {agent} session {} no longer exists: {}",
                r.session_id, transcript.cwd
            )));
        }
        let _one_at_a_time = IMPORTING.lock().await;
        if let Some(existing) = self.bound_sessions().await?.get(&(agent.to_owned(), r.session_id.clone())) {
            return Err(Error::AlreadyExists(format!(
                "{agent} session {} is already imported as conversation {existing}",
                r.session_id
            )));
        }
        if agent == sessions::CODEX {
            self.copy_codex_rollout(&path)?;
        }
        let mut config = AgentConfig {
            cwd: transcript.cwd.clone(),
            model: r.model.clone(),
            session_id: r.session_id.clone(),
            ..Default::default()
        };
        entry.provider.validate_config(&mut config).map_err(|e| Error::Invalid(format!("agent_config.{e}")))?;
        let first_prompt = transcript.items.iter().find(|i| i.role == Role::User).map(|i| i.text.as_str());
        let title = match r.title.trim() {
            "" => title_from(first_prompt.unwrap_or(&format!("Imported {agent} session"))),
            t => t.to_owned(),
        };
        let record = st::ConversationRecord {
            id: new_id(),
            agent_key: agent.to_owned(),
            title,
            agent_config_json: persist::config_json(&config),
            channel_name: r.channel_name,
            peer_chat_id: r.peer_chat_id,
            ..Default::default()
        };
        let created = self.store().create(record).await?;
        let source = format!("{IMPORTED_SOURCE_PREFIX}{agent}");
        check_source(&source)?;
        let items = &transcript.items;
        let skip = items.len().saturating_sub(MAX_IMPORTED_MESSAGES);
        if skip > 0 {
            let note = format!("({skip} earlier messages of this {agent} session are not shown here.)");
            self.append_imported(&created.id, Role::Assistant, note, &[], items[0].at_ms, &source).await?;
        }
        for item in &items[skip..] {
            self.append_imported(&created.id, item.role, item.text.clone(), &item.tools, item.at_ms, &source).await?;
        }
        let now = self.store().get(&created.id).await?;
        self.touch(&created.id);
        tracing::info!(
            conversation = %created.id, agent, messages = items.len() - skip, skipped_lines = transcript.skipped_lines,
            "Agent session imported."
        );
        Ok(self.view(&now))
    }

    async fn append_imported(
        &self,
        conversation: &str,
        role: Role,
        mut text: String,
        tools: &[(String, String)],
        at_ms: i64,
        source: &str,
    ) -> Result<()> {
        use st::content_block_record::Block;
        if text.len() > MAX_IMPORTED_TEXT_BYTES {
            let mut end = MAX_IMPORTED_TEXT_BYTES;
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            text.truncate(end);
            text.push_str("\n\n(cut: the rest of this message is in the transcript)");
        }
        let mut blocks = Vec::new();
        if !text.is_empty() {
            blocks.push(st::ContentBlockRecord { block: Some(Block::Text(text)) });
        }
        for (i, (name, input)) in tools.iter().enumerate() {
            // The input was cut to a few hundred bytes: kept as a JSON string when no longer JSON.
            let input_json = if serde_json::from_str::<serde_json::Value>(input).is_ok() {
                input.clone()
            } else {
                serde_json::Value::String(input.clone()).to_string()
            };
            blocks.push(st::ContentBlockRecord {
                block: Some(Block::ToolUse(st::ToolUseRecord {
                    id: format!("imported_{i}"),
                    name: name.clone(),
                    input_json,
                })),
            });
        }
        if blocks.is_empty() {
            return Ok(());
        }
        let role = match role {
            Role::User => st::MessageRole::User,
            Role::Assistant => st::MessageRole::Assistant,
        };
        self.store()
            .append(st::MessageRecord {
                id: new_id(),
                conversation_id: conversation.to_owned(),
                role: role as i32,
                blocks,
                status: st::MessageStatus::Complete as i32,
                created_ms: at_ms.max(0),
                source: source.to_owned(),
                ..Default::default()
            })
            .await?;
        Ok(())
    }

    /// Copies a user's Codex rollout into Coffer's `CODEX_HOME` (same path under `sessions/`),
    /// where the app-server Coffer runs resumes threads from; an existing copy is kept.
    fn copy_codex_rollout(&self, rollout: &Path) -> Result<()> {
        let rel: PathBuf = rollout.iter().rev().take(4).collect::<Vec<_>>().into_iter().rev().collect();
        let target = self.home().join("agents/codex/sessions").join(rel);
        if target.exists() {
            return Ok(());
        }
        let copy = || -> std::io::Result<()> {
            std::fs::create_dir_all(target.parent().unwrap_or(Path::new(".")))?;
            std::fs::copy(rollout, &target)?;
            Ok(())
        };
        copy().map_err(|e| Error::Internal(format!("cannot copy the Codex rollout to {}: {e}", target.display())))
    }

    /// `ListProjects`: recent working directories (conversations, agent sessions) and the git
    /// repositories under the setting `chat.projects_root` (default: the user's home).
    ///
    /// # Errors
    /// [`Error::Invalid`] for a limit over 200; a store error.
    pub async fn list_projects(&self, r: c::ListProjectsRequest) -> Result<c::ListProjectsReply> {
        if r.limit as usize > projects::MAX_LIMIT {
            return Err(Error::Invalid(format!("limit: {} is over {}", r.limit, projects::MAX_LIMIT)));
        }
        let mut used: BTreeMap<String, projects::Use> = BTreeMap::new();
        let page = self
            .store()
            .list(st::ListConversationsRequest {
                archived: st::ArchivedFilter::Active as i32,
                limit: 200,
                ..Default::default()
            })
            .await?;
        for rec in page.conversations {
            let cfg = persist::parse_config(&rec.agent_config_json);
            let at = rec.last_message_ms.max(rec.created_ms);
            projects::note(&mut used, &cfg.cwd, at, "conversation");
        }
        let root = self.config().projects_root();
        let workspace = self.home().join("workspace");
        let limit = r.limit as usize;
        let (projects, root) = tokio::task::spawn_blocking(move || {
            let listing = sessions::list(&Roots::from_env(), None, sessions::MAX_LIMIT);
            for s in &listing.sessions {
                projects::note(&mut used, &s.cwd, s.last_activity_ms, s.agent_key);
            }
            let root = root.or_else(|| std::env::var_os("HOME").filter(|h| !h.is_empty()).map(PathBuf::from));
            let found = root.as_deref().map(projects::git_repos).unwrap_or_default();
            (projects::merge(used, found, &workspace, limit), root)
        })
        .await
        .map_err(|e| Error::Internal(format!("the project listing failed: {e}")))?;
        Ok(c::ListProjectsReply {
            projects: projects
                .into_iter()
                .map(|p| c::Project {
                    name: Path::new(&p.path)
                        .file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_else(|| p.path.clone()),
                    path: p.path,
                    git: p.git,
                    last_used_ms: p.last_used_ms,
                    sources: p.sources,
                })
                .collect(),
            root: root.map(|r| r.display().to_string()).unwrap_or_default(),
        })
    }
}
