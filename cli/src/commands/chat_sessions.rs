//! `coffer chat sessions` and `coffer chat import AGENT SESSION_ID` (issue 34 §5): the user's
//! own Claude Code and Codex sessions (`GET /v1/agent-sessions`), and importing one as a
//! conversation bound to it (`POST /v1/conversations/import`), so it can be continued with
//! `coffer chat send` (or from the console or a channel).
use clap::Args;
use coffer_api::agent_sessions::{AgentSession, AgentSessionList, SessionImport};
use coffer_api::chat::Conversation;

use crate::api::with_query;
use crate::commands::kb::time_of;
use crate::context::Ctx;
use crate::error::CliError;
use crate::output::{self, printable, render_table_fitted, text_cell};

#[derive(Debug, Args)]
pub struct SessionsArgs {
    /// Only this agent's sessions: claude_code or codex [default: both].
    #[arg(long, value_name = "AGENT", value_parser = ["claude_code", "codex"])]
    pub agent: Option<String>,
    /// How many (newest first, 1-200).
    #[arg(long, value_name = "N", default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=200))]
    pub limit: u32,
}

#[derive(Debug, Args)]
pub struct ImportArgs {
    /// The agent: claude_code or codex.
    #[arg(value_parser = ["claude_code", "codex"])]
    pub agent: String,
    /// The session id (as `coffer chat sessions` shows it).
    pub session_id: String,
    /// A title [default: the session's first prompt].
    #[arg(long, value_name = "TITLE")]
    pub title: Option<String>,
}

/// The table of `coffer chat sessions`.
pub fn render_sessions(items: &[AgentSession], width: Option<usize>) -> String {
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|s| {
            let count = if s.partial { format!("{}+", s.message_count) } else { s.message_count.to_string() };
            vec![
                text_cell(&s.agent_key, 12),
                text_cell(&s.session_id, 40),
                time_of(Some(s.last_activity_ms)),
                count,
                text_cell(s.cwd.as_deref().unwrap_or(""), 60),
                text_cell(s.conversation_id.as_deref().unwrap_or(""), 30),
                text_cell(s.first_prompt.as_deref().unwrap_or(""), 200),
            ]
        })
        .collect();
    render_table_fitted(
        &["AGENT", "SESSION", "LAST ACTIVITY (UTC)", "MESSAGES", "FOLDER", "CONVERSATION", "FIRST PROMPT"],
        &rows,
        width,
    )
}

/// `coffer chat sessions`.
///
/// # Errors
/// API errors; exit 5 when the daemon cannot be reached.
pub async fn sessions(ctx: &Ctx, a: SessionsArgs) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    let limit = a.limit.to_string();
    let path = with_query("/v1/agent-sessions", &[("agent", a.agent.as_deref()), ("limit", Some(&limit))]);
    let resp = api.get_raw(&path).await?;
    if ctx.json {
        return output::print_body(&resp.body);
    }
    let list: AgentSessionList = resp.parse()?;
    if list.items.is_empty() {
        output::println(
            "No Claude Code or Codex sessions found (looked under ~/.claude/projects and ~/.codex/sessions).",
        )?;
    } else {
        output::print(&render_sessions(&list.items, output::terminal_width()))?;
        output::println("Continue one: coffer chat import AGENT SESSION")?;
    }
    if list.skipped_files > 0 || list.skipped_lines > 0 {
        output::println(&format!(
            "Skipped {} unreadable transcript file(s) and {} malformed line(s).",
            list.skipped_files, list.skipped_lines
        ))?;
    }
    Ok(())
}

/// `coffer chat import AGENT SESSION_ID`.
///
/// # Errors
/// API errors (exit 3 unknown session, 4 already imported naming the conversation, 2 a bad
/// id); exit 5 when the daemon cannot be reached.
pub async fn import(ctx: &Ctx, a: ImportArgs) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    let body = SessionImport { agent_key: a.agent, session_id: a.session_id, title: a.title, model: None };
    let resp = api.send(api.request(reqwest::Method::POST, "/v1/conversations/import").json(&body)).await?;
    if ctx.json {
        return output::print_body(&resp.body);
    }
    let c: Conversation = resp.parse()?;
    output::println(&format!(
        "Imported as conversation {} ({} messages) with {} in {}\nContinue it: coffer chat send {} TEXT --watch",
        c.id,
        c.message_count,
        printable(&c.agent_key),
        printable(&c.agent_config.cwd),
        c.id
    ))
}
