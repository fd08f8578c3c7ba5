//! A channel's `/sessions`, `/import N`, `/projects` and `/new N` (issue 34 §5): the owner's own
//! Claude Code and Codex sessions listed by number and one imported as a conversation bound to
//! this chat, so it is continued from the phone; and the project picker's folders by number for
//! a new conversation. The numbers refer to the last list shown in that chat (listed afresh
//! when none was).
use coffer_proto::chat as c;
use coffer_proto::store::ChannelRecord;

use super::{Bridge, State, cut_chars};
use crate::error::{Error, Result};

/// Sessions `/sessions` shows.
const SESSIONS_SHOWN: u32 = 10;
/// Projects `/projects` shows.
const PROJECTS_SHOWN: u32 = 15;
/// Characters of a session's first prompt shown.
const PROMPT_CHARS: usize = 60;

/// The lists last shown in one chat, for the numbers of `/import N` and `/new N`.
#[derive(Default)]
pub(super) struct Picks {
    /// (agent key, session id), as numbered by `/sessions`.
    sessions: Vec<(String, String)>,
    /// Folders, as numbered by `/projects`.
    projects: Vec<String>,
}

/// `N` of `/import N` / `/new N` (1-based).
fn number(arg: &str, what: &str, list: &str) -> Result<usize> {
    match arg.trim().parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(Error::Invalid(format!("{what} needs a number from {list}, e.g. {what} 1"))),
    }
}

/// "3 h ago"-style age of a Unix-ms time.
fn ago(ms: i64) -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
    let s = (now - ms).max(0) / 1000;
    match s {
        0..60 => "just now".to_owned(),
        60..3600 => format!("{} min ago", s / 60),
        3600..86_400 => format!("{} h ago", s / 3600),
        _ => format!("{} d ago", s / 86_400),
    }
}

fn agent_name(key: &str) -> &str {
    match key {
        "claude_code" => "Claude Code",
        "codex" => "Codex",
        other => other,
    }
}

impl Bridge {
    async fn session_list(&self) -> Result<Vec<c::AgentSession>> {
        let r = self
            .engine
            .list_agent_sessions(c::ListAgentSessionsRequest { agent_key: String::new(), limit: SESSIONS_SHOWN })
            .await?;
        Ok(r.sessions)
    }

    async fn project_list(&self) -> Result<Vec<c::Project>> {
        Ok(self.engine.list_projects(c::ListProjectsRequest { limit: PROJECTS_SHOWN }).await?.projects)
    }

    /// `/sessions`: the newest sessions, numbered.
    pub(super) async fn sessions(&self, st: &mut State, chat: &str) -> Result<Option<String>> {
        let list = self.session_list().await?;
        let picks = st.picks.entry(chat.to_owned()).or_default();
        picks.sessions = list.iter().map(|s| (s.agent_key.clone(), s.session_id.clone())).collect();
        if list.is_empty() {
            return Ok(Some("No Claude Code or Codex sessions were found on this machine.".into()));
        }
        let mut out = String::from("Your recent agent sessions:");
        for (i, s) in list.iter().enumerate() {
            let prompt = if s.first_prompt.is_empty() {
                "(no prompt)".to_owned()
            } else {
                cut_chars(&s.first_prompt, PROMPT_CHARS)
            };
            let folder = s.cwd.rsplit('/').find(|p| !p.is_empty()).unwrap_or("?");
            let imported = if s.conversation_id.is_empty() { "" } else { " (imported)" };
            out.push_str(&format!(
                "\n{}. {} · {folder} · {} · {} messages{imported}\n   {prompt}",
                i + 1,
                agent_name(&s.agent_key),
                ago(s.last_activity_ms),
                s.message_count
            ));
        }
        out.push_str("\n/import N continues one here.");
        Ok(Some(out))
    }

    /// `/import N`: imports session N of the last `/sessions` and binds this chat to it.
    pub(super) async fn import(
        &self,
        st: &mut State,
        channel: &ChannelRecord,
        chat: &str,
        arg: &str,
    ) -> Result<Option<String>> {
        let n = number(arg, "/import", "/sessions")?;
        if st.picks.get(chat).is_none_or(|p| p.sessions.is_empty()) {
            let list = self.session_list().await?;
            st.picks.entry(chat.to_owned()).or_default().sessions =
                list.iter().map(|s| (s.agent_key.clone(), s.session_id.clone())).collect();
        }
        let sessions = &st.picks.get(chat).map(|p| p.sessions.clone()).unwrap_or_default();
        let Some((agent_key, session_id)) = sessions.get(n - 1).cloned() else {
            return Err(Error::Invalid(format!("/import {n}: /sessions lists {} sessions", sessions.len())));
        };
        let conv = self
            .engine
            .import_agent_session(c::ImportAgentSessionRequest {
                agent_key: agent_key.clone(),
                session_id,
                channel_name: channel.name.clone(),
                peer_chat_id: chat.to_owned(),
                ..Default::default()
            })
            .await?;
        self.follow(st, chat, &conv.id).await?;
        let cwd = conv.agent_config.map(|c| c.cwd).unwrap_or_default();
        Ok(Some(format!(
            "Imported \"{}\" ({} messages) with {} in {cwd}. Send a message to continue it.",
            conv.title,
            conv.message_count,
            agent_name(&agent_key)
        )))
    }

    /// `/projects`: the project picker's folders, numbered.
    pub(super) async fn projects(&self, st: &mut State, chat: &str) -> Result<Option<String>> {
        let list = self.project_list().await?;
        st.picks.entry(chat.to_owned()).or_default().projects = list.iter().map(|p| p.path.clone()).collect();
        if list.is_empty() {
            return Ok(Some("No projects found: /new starts a conversation in Coffer's workspace.".into()));
        }
        let mut out = String::from("Projects:");
        for (i, p) in list.iter().enumerate() {
            let used = if p.last_used_ms > 0 { format!(" · {}", ago(p.last_used_ms)) } else { String::new() };
            let git = if p.git { " · git" } else { "" };
            out.push_str(&format!("\n{}. {} — {}{git}{used}", i + 1, p.name, p.path));
        }
        out.push_str("\n/new N starts a conversation in one.");
        Ok(Some(out))
    }

    /// The folder `/new ARG` names: a number of the last `/projects`, or an absolute path;
    /// `None` for no argument (the channel's default).
    pub(super) async fn project_arg(&self, st: &mut State, chat: &str, arg: &str) -> Result<Option<String>> {
        let arg = arg.trim();
        if arg.is_empty() {
            return Ok(None);
        }
        if arg.starts_with('/') {
            return Ok(Some(arg.to_owned()));
        }
        let n = number(arg, "/new", "/projects")?;
        if st.picks.get(chat).is_none_or(|p| p.projects.is_empty()) {
            let list = self.project_list().await?;
            st.picks.entry(chat.to_owned()).or_default().projects = list.into_iter().map(|p| p.path).collect();
        }
        let projects = st.picks.get(chat).map(|p| p.projects.clone()).unwrap_or_default();
        projects
            .get(n - 1)
            .cloned()
            .map(Some)
            .ok_or_else(|| Error::Invalid(format!("/new {n}: /projects lists {} projects", projects.len())))
    }
}
