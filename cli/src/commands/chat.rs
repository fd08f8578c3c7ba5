//! `coffer chat agents|list|new|show|send|watch|stop|pending|archive|restore|rename|rm`:
//! conversations with the coding agents Coffer manages, over `/v1/agents` and
//! `/v1/conversations…`. `watch` renders a conversation's live events (`…/events`, SSE) in the
//! terminal: streaming text as it comes, tool calls as one-line `⚙ name(input…)` summaries,
//! results as `↳ …` cut to one line, the turn's end with its usage. `send --watch` and
//! `new … --watch` follow until the turn they started ends. Ctrl-C stops watching only: the turn
//! goes on (`coffer chat stop ID` interrupts it).
//!
//! The event stream is opened before a message is sent (from the conversation's `last_seq`), so
//! no event of the turn can be missed; a stream that breaks (the chat service, the gateway or the
//! whole daemon restarting: a new daemon is found again through `daemon.json`, never started) is
//! resumed with `Last-Event-ID`, without loss or duplicate.
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{ArgGroup, Args, Subcommand};
use coffer_api::Page;
use coffer_api::chat::MAX_MESSAGE_TEXT_BYTES;
use coffer_api::chat::{
    Agent, AgentConfigCreate, ApprovalAnswer, ApprovalResolved, ContentBlock, Conversation, ConversationCreate,
    ConversationDeleted, ConversationPatch, ConversationView, Event, EventBody, Interrupted, Message, MessageSend,
    MessageStatus, PendingItemSet, PendingQueue, PendingSet, Role, SendMessageReply, Usage,
};
use secrecy::ExposeSecret as _;
use serde_json::Value;

use crate::api::{ApiClient, path_segment, with_query};
use crate::commands::kb::{absolute, time_ms};
use crate::context::Ctx;
use crate::error::CliError;
use crate::output::{
    self, printable, printable_text, render_fields, render_table, render_table_fitted, text_cell, truncate, yes_no,
};

/// Longest silence on an event stream before it is taken for broken and resumed (the edge
/// sends a keep-alive comment every 15 s).
pub const STREAM_SILENCE: Duration = Duration::from_secs(45);
/// How many times in a row a broken event stream is reopened before `watch` gives up.
pub const RECONNECTS: u32 = 20;
/// Longest tool input and result shown on a watch line (chars).
pub const SUMMARY_CHARS: usize = 100;

const NEW_EXAMPLES: &str = "\
Examples:
  coffer chat new --agent claude_code 'Why does the build fail?' --watch
  coffer chat new --agent codex --cwd ~/src/app --model o4-mini
  coffer chat new --agent claude_code --json | jq -r .id

A relative --cwd is taken from the current folder; without one the agent works in
COFFER_HOME/workspace. Without --watch the command returns at once; follow with `coffer chat watch ID`.";

const WATCH_EXAMPLES: &str = "\
Examples:
  coffer chat watch 01JDQ8ZKXW5T3M2N4P6R7S8T9V
  coffer chat watch 01JDQ8ZKXW5T3M2N4P6R7S8T9V --json | jq -c 'select(.kind == \"turn_done\")'

Shows the running turn from its start, then every event live: text as it streams, `⚙ name(input…)`
for a tool call, `↳ …` for its result, `✓`/`✗` when the turn ends. Ctrl-C stops watching only.";

#[derive(Debug, Subcommand)]
pub enum ChatCommand {
    /// List the agents Coffer can run (Claude Code, Codex), available or not and why.
    #[command(after_help = "Example:\n  coffer chat agents")]
    Agents(NoArgs),
    /// List conversations, newest activity first.
    #[command(after_help = "Examples:\n  coffer chat list\n  coffer chat list --archived --search build")]
    List(ListArgs),
    /// Start a conversation with an agent (and send it a first message).
    #[command(after_help = NEW_EXAMPLES)]
    New(NewArgs),
    /// Show a conversation: its agent, state, pending queue and newest messages.
    #[command(after_help = "Example:\n  coffer chat show 01JDQ8ZKXW5T3M2N4P6R7S8T9V --messages 20")]
    Show(ShowArgs),
    /// Send a message: it starts a turn, or waits in the pending queue while one runs (--now:
    /// interrupts it and runs next).
    #[command(
        after_help = "Examples:\n  coffer chat send 01JDQ8ZKXW5T3M2N4P6R7S8T9V 'Now add a test' --watch\n  coffer chat send 01JDQ8ZKXW5T3M2N4P6R7S8T9V and then update the docs\n  coffer chat send 01JDQ8ZKXW5T3M2N4P6R7S8T9V --now 'Stop that: fix the build first'\n  coffer chat send 01JDQ8ZKXW5T3M2N4P6R7S8T9V 'What is wrong here?' --attach shot.png\n  git diff | coffer chat send 01JDQ8ZKXW5T3M2N4P6R7S8T9V - --watch\n  coffer chat send 01JDQ8ZKXW5T3M2N4P6R7S8T9V --file review-notes.md\n\nWith --watch it exits 0 when the turn's end was seen, 1 when the turn failed or its end was lost\n(the chat service restarted meanwhile: `coffer chat show ID` has it), 130 after Ctrl-C."
    )]
    Send(SendArgs),
    /// Watch a conversation live (Ctrl-C stops watching, not the turn).
    #[command(after_help = WATCH_EXAMPLES)]
    Watch(IdArg),
    /// Stop the running turn (its partial answer is kept; the queue pauses).
    #[command(after_help = "Example:\n  coffer chat stop 01JDQ8ZKXW5T3M2N4P6R7S8T9V")]
    Stop(IdArg),
    /// Show the pending queue, or resume, clear or replace it.
    #[command(
        after_help = "Examples:\n  coffer chat pending 01JDQ8ZKXW5T3M2N4P6R7S8T9V\n  coffer chat pending 01JDQ8ZKXW5T3M2N4P6R7S8T9V --resume\n  coffer chat pending 01JDQ8ZKXW5T3M2N4P6R7S8T9V --set 'first this' 'then that'"
    )]
    Pending(PendingArgs),
    /// Archive a conversation (it leaves `coffer chat list`; `restore` brings it back).
    #[command(after_help = "Example:\n  coffer chat archive 01JDQ8ZKXW5T3M2N4P6R7S8T9V")]
    Archive(IdArg),
    /// Restore an archived conversation.
    #[command(after_help = "Example:\n  coffer chat restore 01JDQ8ZKXW5T3M2N4P6R7S8T9V")]
    Restore(IdArg),
    /// Rename a conversation.
    #[command(after_help = "Example:\n  coffer chat rename 01JDQ8ZKXW5T3M2N4P6R7S8T9V Fix the flaky test")]
    Rename(RenameArgs),
    /// Delete a conversation and its messages (a running turn is cancelled).
    #[command(after_help = "Example:\n  coffer chat rm 01JDQ8ZKXW5T3M2N4P6R7S8T9V")]
    Rm(IdArg),
    /// List your own Claude Code and Codex sessions (made outside Coffer), newest first.
    #[command(after_help = "Examples:\n  coffer chat sessions\n  coffer chat sessions --agent codex --json")]
    Sessions(super::chat_sessions::SessionsArgs),
    /// Import one of your own sessions as a conversation, to continue it here.
    #[command(
        after_help = "Example:\n  coffer chat import claude_code 35b13f57-b1e3-45f0-bb61-b95101ccfb90\n\nIts history is shown read-only above the new turns; the next message resumes the session."
    )]
    Import(super::chat_sessions::ImportArgs),
    /// Allow an action the agent waits for (permission mode ask): N is the request's number.
    #[command(
        after_help = "Examples:\n  coffer chat approve 01JDQ8ZKXW5T3M2N4P6R7S8T9V 1042\n  coffer chat approve 01JDQ8ZKXW5T3M2N4P6R7S8T9V 1042 --always"
    )]
    Approve(ApproveArgs),
    /// Deny an action the agent waits for; the message is told to the agent.
    #[command(after_help = "Example:\n  coffer chat deny 01JDQ8ZKXW5T3M2N4P6R7S8T9V 1042 --message 'not on main'")]
    Deny(DenyArgs),
    /// Set the permission mode: bypass (acts without asking), ask, read-only. From the next turn.
    #[command(after_help = "Example:\n  coffer chat mode 01JDQ8ZKXW5T3M2N4P6R7S8T9V ask")]
    Mode(ModeArgs),
    /// What a turn changed in the conversation's folder: its files (no PATH) or one file's diff.
    #[command(
        after_help = "Examples:\n  coffer chat diff 01JDQ8ZKXW5T3M2N4P6R7S8T9V\n  coffer chat diff 01JDQ8ZKXW5T3M2N4P6R7S8T9V src/a.rs\n  coffer chat diff 01JDQ8ZKXW5T3M2N4P6R7S8T9V src/a.rs --message 01JDQ9A0B1C2D3E4F5G6H7J8K9"
    )]
    Diff(DiffArgs),
    /// Forget the tools allowed always in a conversation (`approve --always`): they ask again.
    #[command(
        name = "forget-tools",
        after_help = "Example:\n  coffer chat forget-tools 01JDQ8ZKXW5T3M2N4P6R7S8T9V\n\n`coffer chat show ID` lists them (\"allowed\"); changing the permission mode forgets them too."
    )]
    ForgetTools(IdArg),
}

#[derive(Debug, Args)]
pub struct ApproveArgs {
    /// The conversation's id.
    pub id: String,
    /// The request's number (`chat watch` and `chat show` print it).
    pub number: u64,
    /// Also allow this tool at once for the rest of the conversation.
    #[arg(long)]
    pub always: bool,
}

#[derive(Debug, Args)]
pub struct DenyArgs {
    /// The conversation's id.
    pub id: String,
    /// The request's number.
    pub number: u64,
    /// What the agent is told (default: "The user denied this action.").
    #[arg(long, value_name = "TEXT")]
    pub message: Option<String>,
}

#[derive(Debug, Args)]
pub struct ModeArgs {
    /// The conversation's id.
    pub id: String,
    /// bypass, ask, read-only (or read_only).
    #[arg(value_name = "MODE", value_parser = ["bypass", "ask", "read-only", "read_only"])]
    pub mode: String,
}

#[derive(Debug, Args)]
pub struct DiffArgs {
    /// The conversation's id.
    pub id: String,
    /// A file as the turn lists it (relative to the conversation's folder); none: list the files.
    pub path: Option<String>,
    /// The assistant message whose turn to show (default: the newest turn that changed files).
    #[arg(long, value_name = "MESSAGE_ID")]
    pub message: Option<String>,
}

#[derive(Debug, Args)]
pub struct NoArgs {}

#[derive(Debug, Args)]
pub struct IdArg {
    /// The conversation's id (as `coffer chat list` shows it).
    pub id: String,
}

#[derive(Debug, Args)]
#[command(group(ArgGroup::new("which").args(["archived", "all"])))]
pub struct ListArgs {
    /// Only archived conversations.
    #[arg(long)]
    pub archived: bool,
    /// Active and archived conversations.
    #[arg(long)]
    pub all: bool,
    /// Only conversations whose title contains this (case-insensitive).
    #[arg(long, value_name = "TEXT")]
    pub search: Option<String>,
    /// How many to show (1-200).
    #[arg(long, value_name = "N", default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=200))]
    pub limit: u32,
    /// Continue after the conversations already shown (the cursor the previous page printed).
    #[arg(long, value_name = "CURSOR")]
    pub cursor: Option<String>,
}

#[derive(Debug, Args)]
pub struct NewArgs {
    /// The agent (`coffer chat agents` lists them: claude_code, codex).
    #[arg(long, value_name = "AGENT")]
    pub agent: String,
    /// The agent's working folder (relative: from the current folder) [default:
    /// COFFER_HOME/workspace].
    #[arg(long, value_name = "DIR")]
    pub cwd: Option<PathBuf>,
    /// The model, passed to the agent's CLI as is [default: the agent's own].
    #[arg(long, value_name = "MODEL")]
    pub model: Option<String>,
    /// A title [default: the first line of the first message].
    #[arg(long, value_name = "TITLE")]
    pub title: Option<String>,
    /// Follow the first turn until it ends (or, without TEXT, watch the conversation).
    #[arg(long)]
    pub watch: bool,
    /// The permission mode: bypass, ask, read-only [default: the agent's setting].
    #[arg(long, value_name = "MODE", value_parser = ["bypass", "ask", "read-only", "read_only"])]
    pub mode: Option<String>,
    /// The first message (words are joined with spaces).
    #[arg(value_name = "TEXT")]
    pub text: Vec<String>,
}

#[derive(Debug, Args)]
pub struct ShowArgs {
    /// The conversation's id.
    pub id: String,
    /// How many of the newest messages to show (1-500).
    #[arg(long, value_name = "N", default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=500))]
    pub messages: u32,
}

#[derive(Debug, Args)]
pub struct SendArgs {
    /// The conversation's id.
    pub id: String,
    /// The message (words are joined with spaces); `-` alone reads it from standard input; may
    /// be left out with --file or --attach.
    #[arg(required_unless_present_any = ["attach", "file"], num_args = 1.., value_name = "TEXT")]
    pub text: Vec<String>,
    /// Read the message's text from this file (UTF-8, at most the chat service's 1 MiB limit),
    /// for a message longer than a command line takes. The file is the text, not an attachment
    /// (see --attach).
    #[arg(long, value_name = "PATH", conflicts_with = "text")]
    pub file: Option<PathBuf>,
    /// Follow the turn this message starts (after the queue, if it waits) until it ends.
    #[arg(long)]
    pub watch: bool,
    /// Send now: interrupt the running turn (its partial answer is kept) and run this message
    /// next, before the queue. When no turn runs it just sends.
    #[arg(long)]
    pub now: bool,
    /// Attach a file (repeat for more; default limits: 4 files of 10 MiB): saved in the
    /// conversation's working directory under .coffer/attachments/<message id>/ and named to the
    /// agent; images (PNG, JPEG, GIF, WebP) also reach it as images.
    #[arg(long, value_name = "FILE", num_args = 1)]
    pub attach: Vec<std::path::PathBuf>,
}

/// The attachments of `coffer chat send --attach`: each file read whole, named by its file name
/// (the server sanitises it and reads an image's type from its bytes).
///
/// # Errors
/// [`CliError::Usage`] naming a file that cannot be read.
fn read_attachments(paths: &[std::path::PathBuf]) -> Result<Option<Vec<coffer_api::chat::AttachmentUpload>>, CliError> {
    use base64::Engine as _;
    if paths.is_empty() {
        return Ok(None);
    }
    let mut out = Vec::with_capacity(paths.len());
    for p in paths {
        let data = std::fs::read(p).map_err(|e| CliError::Usage(format!("--attach {}: {e}", p.display())))?;
        let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        out.push(coffer_api::chat::AttachmentUpload {
            name,
            mime: None,
            data_base64: base64::engine::general_purpose::STANDARD.encode(data),
        });
    }
    Ok(Some(out))
}

/// Where `coffer chat send` takes its text from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TextSource {
    /// The words given, joined with spaces.
    Args(String),
    /// `-`: standard input, read to its end.
    Stdin,
    /// `--file PATH`.
    File(PathBuf),
}

impl TextSource {
    /// The source `a` names.
    pub fn of(a: &SendArgs) -> Self {
        match (&a.file, a.text.as_slice()) {
            (Some(p), _) => Self::File(p.clone()),
            (None, [one]) if one == "-" => Self::Stdin,
            (None, words) => Self::Args(words.join(" ")),
        }
    }

    /// How an error names it: `stdin`, `--file PATH`, `the message`.
    fn label(&self) -> String {
        match self {
            Self::Args(_) => "the message".into(),
            Self::Stdin => "the message on stdin".into(),
            Self::File(p) => format!("--file {}", p.display()),
        }
    }

    /// The text, read whole (at most [`MAX_MESSAGE_TEXT_BYTES`] + 1 bytes are read) and checked:
    /// UTF-8, not empty (blank counts as empty from stdin or a file) unless `attachments`, at
    /// most the chat service's limit.
    ///
    /// # Errors
    /// [`CliError::Usage`] (exit 2) naming the source: unreadable, not UTF-8, empty, or over
    /// [`MAX_MESSAGE_TEXT_BYTES`] (1 MiB) with its size.
    pub fn read(&self, attachments: bool) -> Result<String, CliError> {
        use std::io::{IsTerminal as _, Read as _};
        let label = self.label();
        let limit = MAX_MESSAGE_TEXT_BYTES as u64;
        let (bytes, size) = match self {
            Self::Args(t) => (t.clone().into_bytes(), t.len() as u64),
            Self::Stdin => {
                let input = std::io::stdin();
                if input.is_terminal() {
                    crate::eprintln_printable!("Reading the message from the terminal; end it with Ctrl-D.");
                }
                let mut b = Vec::new();
                input
                    .lock()
                    .take(limit + 1)
                    .read_to_end(&mut b)
                    .map_err(|e| CliError::Usage(format!("{label}: cannot read it ({e})")))?;
                let n = b.len() as u64;
                (b, n)
            }
            Self::File(p) => {
                let f =
                    std::fs::File::open(p).map_err(|e| CliError::Usage(format!("{label}: cannot read it ({e})")))?;
                // The size on disk names how much too long it is without reading it all.
                let on_disk = f.metadata().map(|m| m.len()).unwrap_or(0);
                if f.metadata().is_ok_and(|m| m.is_dir()) {
                    return Err(CliError::Usage(format!("{label}: is a folder, not a file")));
                }
                let mut b = Vec::new();
                f.take(limit + 1)
                    .read_to_end(&mut b)
                    .map_err(|e| CliError::Usage(format!("{label}: cannot read it ({e})")))?;
                let n = (b.len() as u64).max(on_disk);
                (b, n)
            }
        };
        if size > limit {
            // Standard input is read only up to the limit: its whole size is not known.
            let size = if matches!(self, Self::Stdin) { format!("more than {limit}") } else { size.to_string() };
            return Err(CliError::Usage(format!(
                "{label} is {size} bytes: over the chat service's limit of 1 MiB ({limit} bytes) per message; \
                 send a longer text as a file with --attach PATH"
            )));
        }
        let text = String::from_utf8(bytes).map_err(|e| {
            CliError::Usage(format!(
                "{label} is not UTF-8 text (invalid byte at offset {})",
                e.utf8_error().valid_up_to()
            ))
        })?;
        let blank = match self {
            Self::Args(t) => t.is_empty(),
            Self::Stdin | Self::File(_) => text.trim().is_empty(),
        };
        if blank && !attachments {
            return Err(CliError::Usage(format!(
                "{label} is empty: a message holds 1 byte to 1 MiB of text (or send files with --attach)"
            )));
        }
        Ok(text)
    }
}

#[derive(Debug, Args)]
#[command(group(ArgGroup::new("change").args(["resume", "clear", "set"])))]
pub struct PendingArgs {
    /// The conversation's id.
    pub id: String,
    /// Resume a paused queue as it is (the next message starts when no turn runs).
    #[arg(long)]
    pub resume: bool,
    /// Discard every pending message.
    #[arg(long)]
    pub clear: bool,
    /// Replace the queue with these messages, in this order (one argument each), and resume it.
    #[arg(long, value_name = "TEXT", num_args = 1..)]
    pub set: Vec<String>,
}

#[derive(Debug, Args)]
pub struct RenameArgs {
    /// The conversation's id.
    pub id: String,
    /// The new title (words are joined with spaces).
    #[arg(required = true, num_args = 1.., value_name = "TITLE")]
    pub title: Vec<String>,
}

/// Runs one `coffer chat …` command.
///
/// # Errors
/// API errors (exit 2 bad input, 3 unknown conversation or agent, 4 agent unavailable, archived
/// or changed meanwhile, 1 chat service not running), exit 5 when the daemon cannot be reached,
/// exit 1 when a followed turn failed.
pub async fn run(ctx: &Ctx, cmd: ChatCommand) -> Result<(), CliError> {
    match cmd {
        ChatCommand::Agents(_) => agents(ctx).await,
        ChatCommand::List(a) => list(ctx, a).await,
        ChatCommand::New(a) => new(ctx, a).await,
        ChatCommand::Show(a) => show(ctx, a).await,
        ChatCommand::Send(a) => send(ctx, a).await,
        ChatCommand::Watch(a) => watch(ctx, &a.id).await,
        ChatCommand::Stop(a) => stop(ctx, &a.id).await,
        ChatCommand::Pending(a) => pending(ctx, a).await,
        ChatCommand::Archive(a) => {
            patch(ctx, &a.id, ConversationPatch { archived: Some(true), ..Default::default() }, "Archived").await
        }
        ChatCommand::Restore(a) => {
            patch(ctx, &a.id, ConversationPatch { archived: Some(false), ..Default::default() }, "Restored").await
        }
        ChatCommand::Rename(a) => {
            let title = Some(a.title.join(" "));
            patch(ctx, &a.id, ConversationPatch { title, ..Default::default() }, "Renamed").await
        }
        ChatCommand::Rm(a) => rm(ctx, &a.id).await,
        ChatCommand::Sessions(a) => super::chat_sessions::sessions(ctx, a).await,
        ChatCommand::Import(a) => super::chat_sessions::import(ctx, a).await,
        ChatCommand::Approve(a) => {
            let decision = if a.always { "allow_always" } else { "allow" };
            answer(ctx, &a.id, a.number, ApprovalAnswer { decision: decision.into(), message: None }).await
        }
        ChatCommand::Deny(a) => {
            answer(ctx, &a.id, a.number, ApprovalAnswer { decision: "deny".into(), message: a.message }).await
        }
        ChatCommand::Mode(a) => {
            let permission_mode = Some(a.mode.replace('-', "_"));
            patch(ctx, &a.id, ConversationPatch { permission_mode, ..Default::default() }, "Set the permission mode of")
                .await
        }
        ChatCommand::Diff(a) => diff(ctx, a).await,
        ChatCommand::ForgetTools(a) => forget_tools(ctx, &a.id).await,
    }
}

/// `DELETE …/allowed-tools`: how many tools allowed always were forgotten (`--json`: the
/// server's answer).
async fn forget_tools(ctx: &Ctx, id: &str) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    let resp = api.send(api.request(reqwest::Method::DELETE, &format!("{}/allowed-tools", conv_path(id)))).await?;
    if ctx.json {
        return output::print_body(&resp.body);
    }
    match resp.parse::<coffer_api::chat::AllowedToolsForgotten>()?.forgotten {
        0 => output::println("No tool was allowed always; nothing changed"),
        1 => output::println("Forgot 1 tool allowed always: its next request asks again"),
        n => output::println(&format!("Forgot {n} tools allowed always: their next requests ask again")),
    }
}

/// `POST …/approvals/{number}`: prints the decision (`--json`: the answer as the server sent it).
async fn answer(ctx: &Ctx, id: &str, number: u64, body: ApprovalAnswer) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    let path = format!("{}/approvals/{number}", conv_path(id));
    let resp = api.send(api.request(reqwest::Method::POST, &path).json(&body)).await?;
    if ctx.json {
        return output::print_body(&resp.body);
    }
    let r: ApprovalResolved = resp.parse()?;
    output::println(&resolved_line(&r))
}

/// On a terminal: asks `[a]llow / [d]eny / allow al[w]ays` for request `number` and answers it
/// (Enter alone leaves it to another surface or the timeout). Runs beside the event stream.
fn prompt_answer(api: ApiClient, id: String, number: u64) {
    tokio::spawn(async move {
        let line = tokio::task::spawn_blocking(|| {
            let mut s = String::new();
            std::io::stdin().read_line(&mut s).map(|_| s)
        })
        .await;
        let Ok(Ok(line)) = line else { return };
        let decision = match line.trim() {
            "a" | "allow" => "allow",
            "w" | "always" => "allow_always",
            "d" | "deny" => "deny",
            _ => return,
        };
        let path = format!("{}/approvals/{number}", conv_path(&id));
        let body = ApprovalAnswer { decision: decision.into(), message: None };
        match api.send(api.request(reqwest::Method::POST, &path).json(&body)).await {
            Ok(_) => {}
            Err(e) => {
                let _ = output::println(&format!("! approval #{number}: {e}"));
            }
        }
    });
}

fn conv_path(id: &str) -> String {
    format!("/v1/conversations/{}", path_segment(id))
}

/// A `*_ms` time as `2026-11-30 09:31:36` (UTC), `-` for null.
fn at(ms: Option<i64>) -> String {
    time_ms(&Value::from(ms))
}

// ---------------------------------------------------------------------------------------------
// Formatting.

/// `text` on one line (whitespace runs as one space), at most `max` chars, control characters
/// escaped.
pub fn one_line(text: &str, max: usize) -> String {
    truncate(&printable(&text.split_whitespace().collect::<Vec<_>>().join(" ")), max)
}

/// A tool call as one line: `⚙ name(input…)`, the input as compact JSON cut to
/// [`SUMMARY_CHARS`].
pub fn tool_call_line(name: &str, input: &Value) -> String {
    let input = match input {
        Value::String(s) => s.clone(),
        Value::Object(m) if m.is_empty() => String::new(),
        v => v.to_string(),
    };
    format!("⚙ {}({})", printable(name), one_line(&input, SUMMARY_CHARS))
}

/// A tool result as one line: `↳ output…` (its first lines joined), `↳ error: …` for an error.
pub fn tool_result_line(output: &str, is_error: bool) -> String {
    let text = if output.trim().is_empty() { "(no output)".to_owned() } else { one_line(output, SUMMARY_CHARS) };
    if is_error { format!("↳ error: {text}") } else { format!("↳ {text}") }
}

/// Whether `u` says anything: a turn that was stopped or failed before the agent reported its
/// usage stores zeros, which mean "not known", never "0 tokens".
pub fn usage_known(u: &Usage) -> bool {
    u.input_tokens > 0 || u.output_tokens > 0 || u.cache_read_tokens > 0 || u.cache_write_tokens > 0
}

/// Token usage as `1234 in / 56 out tokens` (cache reads added when there were some).
pub fn usage_text(u: &Usage) -> String {
    let mut s = format!("{} in / {} out tokens", u.input_tokens, u.output_tokens);
    if u.cache_read_tokens > 0 {
        s.push_str(&format!(", {} from cache", u.cache_read_tokens));
    }
    s
}

/// The queue in one line: `queue: 2 pending (paused)`, `queue: empty`.
pub fn queue_line(q: &PendingQueue) -> String {
    match (q.items.len(), q.paused) {
        (0, false) => "queue: empty".to_owned(),
        (0, true) => "queue: empty (paused)".to_owned(),
        (n, false) => format!("queue: {n} pending"),
        (n, true) => format!("queue: {n} pending (paused; `coffer chat pending ID --resume`)"),
    }
}

/// A conversation's state in one cell: `running`, `idle`, `archived`, plus `+2 queued (paused)`.
pub fn state_cell(c: &Conversation) -> String {
    let mut s = if c.archived {
        "archived".to_owned()
    } else if c.turn_running {
        "running".to_owned()
    } else {
        "idle".to_owned()
    };
    if c.pending_count > 0 {
        s.push_str(&format!(" +{} queued", c.pending_count));
    }
    if c.pending_paused {
        s.push_str(" (paused)");
    }
    if c.approvals_waiting > 0 {
        s.push_str(&format!(" · {} waiting for you", c.approvals_waiting));
    }
    s
}

/// A table cell of an optional text: `-` when null or blank (see [`text_cell`]).
fn opt_cell(s: Option<&str>, max: usize) -> String {
    text_cell(s.unwrap_or_default(), max)
}

/// The agents table: AGENT NAME AVAILABLE VERSION COMMAND OR REASON.
pub fn render_agents(items: &[Agent]) -> String {
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|a| {
            vec![
                text_cell(&a.agent_key, 40),
                text_cell(&a.display_name, 40),
                yes_no(a.available).to_owned(),
                opt_cell(a.version.as_deref(), 40),
                opt_cell(if a.available { a.command.as_deref() } else { a.reason.as_deref() }, 200),
            ]
        })
        .collect();
    render_table(&["AGENT", "NAME", "AVAILABLE", "VERSION", "COMMAND OR REASON"], &rows)
}

/// The conversations table: ID AGENT MESSAGES STATE LAST ACTIVITY TITLE (the title last, cut to
/// `width`).
pub fn render_conversations(items: &[Conversation], width: Option<usize>) -> String {
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|c| {
            vec![
                text_cell(&c.id, 40),
                text_cell(&c.agent_key, 30),
                c.message_count.to_string(),
                state_cell(c),
                at(c.last_message_ms.or(c.updated_ms)),
                text_cell(&c.title, 200),
            ]
        })
        .collect();
    render_table_fitted(&["ID", "AGENT", "MESSAGES", "STATE", "LAST ACTIVITY (UTC)", "TITLE"], &rows, width)
}

/// One message as lines: `[time] you (cli):` then its text, or `[time] assistant (model,
/// status):` then text, tool calls and results; an error last.
pub fn render_message(m: &Message) -> String {
    let mut out = String::new();
    let when = at(m.created_ms);
    if m.role == Role::Assistant {
        let mut about: Vec<String> = Vec::new();
        if let Some(model) = &m.model {
            about.push(printable(model).into_owned());
        }
        if m.status != MessageStatus::Complete {
            about.push(m.status.word().to_owned());
        }
        if let Some(u) = m.usage.as_ref().filter(|u| usage_known(u)) {
            about.push(usage_text(u));
        }
        let about = if about.is_empty() { String::new() } else { format!(" ({})", about.join(", ")) };
        out.push_str(&format!("[{when}] assistant{about}:\n"));
    } else {
        let source = m.source.as_deref().map(|s| format!(" ({})", printable(s))).unwrap_or_default();
        out.push_str(&format!("[{when}] you{source}:\n"));
    }
    for b in &m.blocks {
        match b {
            ContentBlock::Text { text } => {
                for line in printable_text(text).lines() {
                    out.push_str(&format!("  {line}\n"));
                }
            }
            ContentBlock::ToolUse { tool_use: u } => {
                out.push_str(&format!("  {}\n", tool_call_line(&u.name, &u.input)));
            }
            ContentBlock::ToolResult { tool_result: r } => {
                out.push_str(&format!("  {}\n", tool_result_line(&r.output, r.is_error)));
            }
            ContentBlock::Attachment { attachment: a } => {
                out.push_str(&format!("  📎 {} ({}, {} bytes)\n", printable(&a.path), printable(&a.mime), a.size));
            }
        }
    }
    if let Some(e) = &m.error {
        out.push_str(&format!("  ✗ {}\n", one_line(e, 400)));
    }
    if let Some(f) = m.files_changed.as_ref().filter(|f| !f.files.is_empty() || f.note.is_some()) {
        for line in files_changed_text(f).lines() {
            out.push_str(&format!("  {line}\n"));
        }
    }
    out
}

/// The pending items, one `  N. text` line each (cut to one line).
pub fn render_pending(q: &PendingQueue) -> String {
    let mut out = format!("{}\n", queue_line(q));
    for (i, p) in q.items.iter().enumerate() {
        out.push_str(&format!("  {}. {}\n", i + 1, one_line(&p.text, 200)));
    }
    out
}

/// A conversation shown in full (`chat show`): its fields, then its messages, then the queue.
pub fn render_view(v: &ConversationView) -> String {
    let c = &v.conversation;
    let or_default = |s: &str, d: &str| if s.is_empty() { d.to_owned() } else { s.to_owned() };
    let mut fields = vec![
        ("id", text_cell(&c.id, 40)),
        ("title", or_default(&c.title, "-")),
        ("agent", text_cell(&c.agent_key, 40)),
        ("cwd", or_default(&c.agent_config.cwd, "-")),
        ("model", or_default(&c.agent_config.model, "(the agent's default)")),
        ("session", or_default(&c.agent_config.session_id, "- (none yet)")),
        ("mode", or_default(&c.agent_config.permission_mode, "bypass")),
        ("allowed", allowed_cell(&v.allowed_tools)),
        ("state", state_cell(c)),
        ("messages", c.message_count.to_string()),
        ("created", at(c.created_ms)),
        ("version", c.version.to_string()),
    ];
    if let Some(ch) = &c.channel_name {
        fields.push(("channel", format!("{ch} ({})", c.peer_chat_id.as_deref().unwrap_or("-"))));
    }
    let mut out = render_fields(&fields);
    if v.more_before {
        out.push_str(&format!("\n… older messages: coffer chat show {} --messages N\n", c.id));
    }
    for m in &v.messages {
        out.push('\n');
        out.push_str(&render_message(m));
    }
    let q = &v.pending;
    if !q.items.is_empty() || q.paused {
        out.push('\n');
        out.push_str(&render_pending(q));
    }
    for a in &v.approvals {
        out.push('\n');
        out.push_str(&approval_lines(&c.id, a));
        out.push('\n');
    }
    out
}

/// The tools allowed always (`chat show`): `Bash (web), Edit (cli)`, `-` when none.
fn allowed_cell(tools: &[coffer_api::chat::AllowedTool]) -> String {
    if tools.is_empty() {
        return "-".to_owned();
    }
    let names: Vec<String> =
        tools.iter().map(|t| format!("{} ({})", text_cell(&t.tool, 60), text_cell(&t.decided_by, 40))).collect();
    names.join(", ")
}

/// Whether approval requests are asked on this terminal: stdin and stdout are both terminals.
fn prompting() -> bool {
    use std::io::IsTerminal;
    std::io::stdin().is_terminal() && std::io::stdout().is_terminal()
}

/// The lines of an approval request: its summary, its diff (at most 40 lines), and how to answer.
pub fn approval_lines(conversation_id: &str, a: &coffer_api::chat::Approval) -> String {
    let mut out = format!("? approval #{}: {}", a.number, one_line(&a.summary, 300));
    if let Some(d) = &a.diff {
        let lines: Vec<&str> = d.lines().collect();
        for l in lines.iter().take(40) {
            out.push_str(&format!("\n    {}", printable(l)));
        }
        if lines.len() > 40 {
            out.push_str(&format!("\n    … {} more lines", lines.len() - 40));
        }
    }
    out.push_str(&format!(
        "\n  allow: coffer chat approve {conversation_id} {n}   deny: coffer chat deny {conversation_id} {n}",
        n = a.number
    ));
    out
}

/// The line of a decided approval request.
pub fn resolved_line(r: &coffer_api::chat::ApprovalResolved) -> String {
    let (mark, word) = match r.decision.as_str() {
        "allow" => ("✓", "allowed"),
        "allow_always" => ("✓", "allowed always"),
        _ => ("✗", "denied"),
    };
    let who = match &r.actor {
        Some(a) => format!("{} ({})", printable(&r.decided_by), printable(a)),
        None => printable(&r.decided_by).into_owned(),
    };
    let message = r.message.as_deref().map(|m| format!(": {}", one_line(m, 200))).unwrap_or_default();
    format!("{mark} approval #{} {word} by {who}{message}", r.number)
}

/// What a turn changed, for a terminal: `± 3 files changed: +40 −12`, then one line per file
/// (`  M src/a.rs  +40 −12`; `A` added, `M` modified, `D` deleted, `R` renamed), then how to see
/// a diff.
pub fn files_changed_text(f: &coffer_api::chat::FilesChanged) -> String {
    use coffer_api::chat::FileChangeKind as K;
    let (a, d) = f.totals();
    let n = f.files.len();
    let more = if f.truncated { "+" } else { "" };
    let mut out =
        format!("± {n}{more} file{} changed: +{a} \u{2212}{d}\n", if n == 1 && !f.truncated { "" } else { "s" });
    if let Some(note) = &f.note {
        out.push_str(&format!("  ({})\n", printable(note)));
    }
    for c in &f.files {
        let letter = match c.change {
            K::Added => 'A',
            K::Modified => 'M',
            K::Deleted => 'D',
            K::Renamed => 'R',
        };
        let path = match &c.old_path {
            Some(old) => format!("{} → {}", printable(old), printable(&c.path)),
            None => printable(&c.path).into_owned(),
        };
        let counts = if c.binary { "binary".to_owned() } else { format!("+{} \u{2212}{}", c.additions, c.deletions) };
        out.push_str(&format!("  {letter} {path}  {counts}\n"));
    }
    out
}

/// Renders a conversation's events for a terminal, one at a time: text deltas as they come,
/// everything else on lines of its own (a line break is put in first when text left the cursor
/// mid-line).
#[derive(Debug, Default)]
pub struct Renderer {
    /// The cursor is not at the start of a line.
    mid_line: bool,
}

impl Renderer {
    /// What to print for one event (`data` of one SSE frame).
    pub fn render(&mut self, ev: &Event) -> String {
        let line = match &ev.body {
            EventBody::TextDelta(d) => {
                let text = printable_text(&d.text).into_owned();
                if !text.is_empty() {
                    self.mid_line = !text.ends_with('\n');
                }
                return text;
            }
            EventBody::MessageCreated(c) => {
                let m = c.message.clone().unwrap_or_default();
                if m.role == Role::Assistant {
                    return String::new();
                }
                let source = m.source.as_deref().map(|s| format!(" ({})", printable(s))).unwrap_or_default();
                format!("› you{source}: {}", one_line(&m.text(), 200))
            }
            EventBody::TurnStarted(_) => return String::new(),
            EventBody::ToolCall(t) => tool_call_line(&t.name, &t.input),
            EventBody::ToolResult(r) => tool_result_line(&r.output, r.is_error),
            EventBody::TurnDone(d) => {
                // The mark says "interrupted" already: the stop reason is not repeated after it.
                let stopped = d.stop_reason == "interrupted";
                let mut parts = Vec::new();
                if !stopped {
                    parts.push(if d.stop_reason.is_empty() { "done".to_owned() } else { d.stop_reason.clone() });
                }
                if let Some(m) = &d.model {
                    parts.push(printable(m).into_owned());
                }
                if let Some(u) = d.usage.as_ref().filter(|u| usage_known(u)) {
                    parts.push(usage_text(u));
                }
                let mark = if stopped { "■ interrupted" } else { "✓ done" };
                if parts.is_empty() { mark.to_owned() } else { format!("{mark} · {}", parts.join(" · ")) }
            }
            EventBody::TurnError(e) => {
                format!("✗ turn failed ({}): {}", printable(&e.code), one_line(&e.message, 400))
            }
            EventBody::QueueChanged(q) => format!("⧗ {}", queue_line(&q.queue)),
            EventBody::ApprovalRequested(r) => approval_lines(&ev.conversation_id, &r.approval),
            EventBody::ApprovalResolved(r) => resolved_line(r),
            EventBody::FilesChanged(f) if f.files.is_empty() && f.note.is_none() => return String::new(),
            EventBody::FilesChanged(f) => files_changed_text(f).trim_end().to_owned(),
            EventBody::Reset(r) => match r.reason.as_str() {
                "deleted" => "! the conversation was deleted".to_owned(),
                "lagged" => "! this watcher fell behind; catching up from the conversation".to_owned(),
                _ => "! earlier events are no longer kept; `coffer chat show ID` has the whole conversation".to_owned(),
            },
        };
        let mut out = String::new();
        if self.mid_line {
            out.push('\n');
        }
        self.mid_line = false;
        out.push_str(&line);
        out.push('\n');
        out
    }

    /// A line break if text left the cursor mid-line (before the command ends).
    pub fn finish(&mut self) -> &'static str {
        if std::mem::take(&mut self.mid_line) { "\n" } else { "" }
    }
}

// ---------------------------------------------------------------------------------------------
// Following a turn.

/// The turn `send --watch` waits for: the one that runs the message it sent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Target {
    /// The user message's id (a turn started) or the pending item's id (queued).
    pub id: String,
    /// The text sent: a queued item becomes a user message that may carry a new id, and is then
    /// recognised by its text (the first user message with it after the send).
    pub text: String,
    /// Queued rather than started.
    pub queued: bool,
    /// The turn, once known.
    pub turn: Option<String>,
}

impl Target {
    /// From the `POST …/messages` answer.
    pub fn from_reply(reply: &SendMessageReply, text: &str) -> Self {
        let (id, queued) = match (&reply.message, &reply.pending) {
            (Some(m), _) => (m.id.clone(), false),
            (None, Some(p)) => (p.id.clone(), true),
            (None, None) => (String::new(), true),
        };
        Self { id, text: text.to_owned(), queued, turn: None }
    }

    /// Notes the turn of an event when it is ours; true when `ev` ends it (`turn_done` or
    /// `turn_error` of our turn).
    pub fn ends_with(&mut self, ev: &Event) -> bool {
        let turn = ev.turn_id.as_deref();
        if self.turn.is_none() {
            let ours = match &ev.body {
                EventBody::MessageCreated(c) => c.message.as_ref().is_some_and(|m| {
                    m.role == Role::User && (m.id == self.id || (self.queued && m.text() == self.text))
                }),
                EventBody::TurnStarted(t) => t.user_message_id == self.id,
                _ => false,
            };
            if ours {
                self.turn = turn.map(str::to_owned);
            }
        }
        matches!(ev.body, EventBody::TurnDone(_) | EventBody::TurnError(_))
            && self.turn.is_some()
            && turn == self.turn.as_deref()
    }
}

/// How long `send --watch` waits after its turn ended for the turn's `files_changed` (it comes
/// once the conversation's folder is compared, and not at all when the turn changed nothing).
pub const FILES_CHANGED_WAIT: Duration = Duration::from_millis(1500);

/// How following a conversation ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// The followed turn ended with `turn_done`.
    Done,
    /// The followed turn ended with `turn_error`: code and message.
    Failed(String, String),
    /// The conversation was deleted.
    Deleted,
    /// Ctrl-C.
    Stopped,
    /// Events were lost (a `reset`: the chat service restarted, or this watcher fell behind)
    /// and the followed turn ended among them: its end was not seen. What it says: the reset's
    /// reason and how the turn's answer is stored, when it could be read.
    Unseen(String),
}

fn retryable(e: &CliError) -> bool {
    match e {
        CliError::Unreachable(_) => true,
        CliError::Api(f) => f.status == 503 || f.status == 502,
        _ => false,
    }
}

/// Whether reopening a stream failed because the daemon itself changed: it refused this
/// client's token (a restarted daemon writes a new one to `daemon.json`) or cannot be reached.
fn daemon_changed(e: &CliError) -> bool {
    match e {
        CliError::Unreachable(_) => true,
        CliError::Api(f) => f.status == 401,
        _ => false,
    }
}

/// Ctrl-C (SIGINT) caught from when this is made: made before a command prints anything or
/// sends its message, so a Ctrl-C at any moment after ends the watch by [`follow`]'s rule
/// (exit 130, the turn goes on) instead of killing the process midway. A Ctrl-C that comes
/// before [`follow`] reads it is kept and seen at its first wait.
pub struct CtrlC(tokio::signal::unix::Signal);

impl CtrlC {
    /// # Errors
    /// The signal handler cannot be installed (no runtime signal driver).
    pub fn catch() -> Result<Self, CliError> {
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
            .map(Self)
            .map_err(|e| CliError::Failed(format!("cannot catch Ctrl-C: {e}")))
    }
}

/// Follows `id`'s events from `after` (or from `first`, a stream already open from there):
/// prints each one (`--json`: its data line unchanged; else [`Renderer`]), resumes a broken
/// stream with `Last-Event-ID`, and returns when `target`'s turn ends (never, without one), the
/// conversation is deleted or Ctrl-C is pressed. A daemon restarted meanwhile (new port or
/// token in `daemon.json`) is found again, never started.
///
/// # Errors
/// The stream could not be opened (404: exit 3) or reopened [`RECONNECTS`] times in a row.
pub async fn follow(
    ctx: &Ctx,
    api: &ApiClient,
    id: &str,
    mut after: u64,
    mut first: Option<reqwest::Response>,
    mut target: Option<Target>,
    mut ctrl_c: CtrlC,
) -> Result<End, CliError> {
    let json = ctx.json;
    let mut api = api.clone();
    let path = format!("{}/events", conv_path(id));
    let mut renderer = Renderer::default();
    let mut failures = 0u32;
    // The followed turn ended: how, and until when its `files_changed` is waited for.
    let mut ending: Option<(End, String, tokio::time::Instant)> = None;
    loop {
        let mut resp = match first.take() {
            Some(r) => r,
            None => match api.stream(&path, Some(after)).await {
                Ok(r) => r,
                Err(e) if (retryable(&e) || daemon_changed(&e)) && failures < RECONNECTS => {
                    failures += 1;
                    if daemon_changed(&e)
                        && let Some(found) = ctx.detect_quietly().await
                    {
                        api = found;
                    }
                    // Pacing between reconnection attempts while the service restarts.
                    tokio::time::sleep(Duration::from_millis(200 * u64::from(failures.min(10)))).await;
                    continue;
                }
                Err(e) => return Err(e),
            },
        };
        let mut parser = coffer_types::sse::SseParser::new();
        let mut events = Vec::new();
        let mut reload = false;
        loop {
            let silence = match &ending {
                Some((_, _, until)) => until.saturating_duration_since(tokio::time::Instant::now()),
                None => STREAM_SILENCE,
            };
            let chunk = tokio::select! {
                c = tokio::time::timeout(silence, resp.chunk()) => c,
                _ = ctrl_c.0.recv() => {
                    output::print(renderer.finish())?;
                    return Ok(End::Stopped);
                }
            };
            let bytes = match chunk {
                Ok(Ok(Some(b))) => b,
                // The turn's `files_changed` did not come in time (not recorded): done.
                _ if ending.is_some() => {
                    output::print(renderer.finish())?;
                    return Ok(ending.map_or(End::Done, |e| e.0));
                }
                // Ended, broke or went silent: resume from the last event seen.
                _ => break,
            };
            parser.push(&bytes, &mut events);
            for e in events.drain(..) {
                let ev = serde_json::from_slice::<Event>(&e.data);
                // --json passes on every JSON event, also of a kind this coffer does not know
                // (a newer daemon's); the rest reads only the events it knows.
                if json && (ev.is_ok() || serde_json::from_slice::<serde::de::IgnoredAny>(&e.data).is_ok()) {
                    output::println(&String::from_utf8_lossy(&e.data))?;
                }
                let Ok(ev) = ev else { continue };
                after = after.max(ev.seq);
                failures = 0;
                if let Some((_, turn, _)) = &ending {
                    // After the followed turn: its changed files, then done; another turn's
                    // event means none are coming.
                    let ours = ev.turn_id.as_deref() == Some(turn.as_str());
                    if ours && !json {
                        output::print(&renderer.render(&ev))?;
                    }
                    if !ours || matches!(ev.body, EventBody::FilesChanged(_)) {
                        output::print(renderer.finish())?;
                        return Ok(ending.map_or(End::Done, |e| e.0));
                    }
                    continue;
                }
                if !json {
                    output::print(&renderer.render(&ev))?;
                    if let EventBody::ApprovalRequested(r) = &ev.body
                        && prompting()
                    {
                        output::print("  [a]llow / [d]eny / allow al[w]ays (Enter: leave it) > ")?;
                        prompt_answer(api.clone(), id.to_owned(), r.approval.number);
                    }
                }
                if let Some(t) = target.as_mut()
                    && t.ends_with(&ev)
                {
                    let end = match &ev.body {
                        EventBody::TurnError(f) => End::Failed(f.code.clone(), f.message.clone()),
                        _ => End::Done,
                    };
                    let until = tokio::time::Instant::now() + FILES_CHANGED_WAIT;
                    ending = Some((end, ev.turn_id.clone().unwrap_or_default(), until));
                    continue;
                }
                if let EventBody::Reset(r) = &ev.body {
                    match r.reason.as_str() {
                        "deleted" => {
                            output::print(renderer.finish())?;
                            return Ok(End::Deleted);
                        }
                        "lagged" => reload = true,
                        _ => {}
                    }
                    // Events were lost: a followed turn may have ended among them, unseen.
                    if let Some(t) = &target
                        && turn_over(&api, id, t).await?
                    {
                        output::print(renderer.finish())?;
                        return Ok(End::Unseen(unseen_end(&api, id, t, &r.reason).await));
                    }
                }
            }
        }
        if reload {
            // Start again from the conversation as it is now.
            after = view_now(&api, id).await?.last_seq;
        }
        failures += 1;
        if failures > RECONNECTS {
            return Err(CliError::Failed(format!(
                "the event stream of conversation {id} broke {RECONNECTS} times in a row; see `coffer status`"
            )));
        }
    }
}

/// The conversation as it is now, with its newest message only (for `last_seq`, the queue and
/// whether a turn runs).
async fn view_now(api: &ApiClient, id: &str) -> Result<ConversationView, CliError> {
    api.get_as(&with_query(&conv_path(id), &[("messages", Some("1"))])).await
}

/// After lost events: whether `t`'s turn has ended (no turn runs and its item is not queued).
async fn turn_over(api: &ApiClient, id: &str, t: &Target) -> Result<bool, CliError> {
    let v = view_now(api, id).await?;
    let queued = v.pending.items.iter().any(|p| p.id == t.id);
    Ok(!queued && !v.conversation.turn_running)
}

/// Most messages read back to find a followed turn's answer after its end was not seen.
const UNSEEN_LOOKBACK: &str = "50";

/// What is said when `t`'s turn ended among lost events (`reset` with `reason`): the reason and
/// how its answer is stored (`complete`, `failed: why`, …) when it is among the newest
/// [`UNSEEN_LOOKBACK`] messages.
async fn unseen_end(api: &ApiClient, id: &str, t: &Target, reason: &str) -> String {
    let lost = match reason {
        "lagged" => "this watcher fell behind".to_owned(),
        "too_old" => "the chat service restarted or no longer keeps them".to_owned(),
        other => printable(other).into_owned(),
    };
    let path = with_query(&conv_path(id), &[("messages", Some(UNSEEN_LOOKBACK))]);
    let answer = api.get_as::<ConversationView>(&path).await.ok().and_then(|v| {
        let mine = |m: &&Message| m.role == Role::User && (m.id == t.id || (t.queued && m.text() == t.text));
        let at = v.messages.iter().rposition(|m| mine(&m))?;
        v.messages[at + 1..].iter().find(|m| m.role == Role::Assistant).cloned()
    });
    let how = match answer {
        Some(m) => match m.error.as_deref().filter(|e| !e.is_empty()) {
            Some(why) => format!("; its answer is {}: {}", m.status.word(), one_line(why, 300)),
            None => format!("; its answer is {}", m.status.word()),
        },
        None => String::new(),
    };
    format!("events were lost ({lost}) and the turn ended among them{how}")
}

/// Sends `text` (with `attachments`; with `now` interrupting the running turn to run next) to
/// `id` and, with `watch`, follows its turn: the stream is opened first (from the
/// conversation's `last_seq`), then the message is posted.
async fn send_and_follow(
    ctx: &Ctx,
    api: &ApiClient,
    id: &str,
    text: &str,
    watch: Option<CtrlC>,
    now: bool,
    attachments: Option<Vec<coffer_api::chat::AttachmentUpload>>,
) -> Result<(), CliError> {
    let body = MessageSend { text: text.to_owned(), now: now.then_some(true), attachments };
    // One key for this command's message: the daemon queues it once however often the request
    // is sent (the client sends it again when it got no answer).
    let key = coffer_runtime::token::random_token();
    let post = |api: &ApiClient| {
        let req = api
            .request(reqwest::Method::POST, &format!("{}/messages", conv_path(id)))
            .header("Idempotency-Key", key.expose_secret())
            .json(&body);
        let api = api.clone();
        async move { api.send_idempotent(req).await }
    };
    let Some(ctrl_c) = watch else {
        let resp = post(api).await?;
        if ctx.json {
            return output::print_body(&resp.body);
        }
        if now {
            return output::print(&sent_now_line(id));
        }
        return output::print(&sent_line(&resp.parse()?, id));
    };
    let after = view_now(api, id).await?.last_seq;
    let stream = api.stream(&format!("{}/events", conv_path(id)), Some(after)).await?;
    let resp = post(api).await?;
    let reply: SendMessageReply = resp.parse()?;
    if ctx.json {
        output::print_body(&resp.body)?;
    } else if reply.pending.is_some() {
        output::print(&sent_line(&reply, id))?;
    }
    let target = Target::from_reply(&reply, text);
    finish(follow(ctx, api, id, after, Some(stream), Some(target), ctrl_c).await?, ctx, id)
}

/// Exit code of `send --watch` / `new --watch` stopped with Ctrl-C before the turn ended
/// (128 + SIGINT, as a shell reports an interrupted command).
pub const EXIT_INTERRUPTED: u8 = 130;

/// What a followed turn's end means for the exit code: 0 only when its end (`turn_done`) was
/// seen; 1 when it failed or its end was not seen; [`EXIT_INTERRUPTED`] after Ctrl-C.
fn finish(end: End, ctx: &Ctx, id: &str) -> Result<(), CliError> {
    match end {
        End::Done => Ok(()),
        End::Stopped => {
            crate::eprintln_printable!("Stopped watching; the turn goes on (`coffer chat stop {id}` interrupts it).");
            Err(CliError::Quiet(EXIT_INTERRUPTED))
        }
        End::Unseen(what) => {
            let e = CliError::Failed(format!(
                "the end of the turn was not seen: {what}. `coffer chat show {id}` has the whole answer"
            ));
            Err(if ctx.json { e.printed() } else { e })
        }
        End::Deleted => {
            let e = CliError::NotFound(format!("conversation {id} was deleted"));
            Err(if ctx.json { e.printed() } else { e })
        }
        End::Failed(code, message) => {
            let e = CliError::Failed(format!("the turn failed ({code}): {}", one_line(&message, 400)));
            Err(if ctx.json { e.printed() } else { e })
        }
    }
}

/// What `send` says without `--watch`.
pub fn sent_line(reply: &SendMessageReply, id: &str) -> String {
    if let Some(p) = &reply.pending {
        let q = &reply.queue;
        let pos = q.items.iter().position(|i| i.id == p.id).map_or(0, |i| i + 1);
        if q.paused {
            return format!("Queued as #{pos}; the queue is paused: `coffer chat pending {id} --resume` runs it\n");
        }
        format!("Queued as #{pos} (a turn is running)\n")
    } else {
        format!("Sent; the turn started. Follow it: coffer chat watch {id}\n")
    }
}

/// What `send --now` says without `--watch` (the message always runs next).
pub fn sent_now_line(id: &str) -> String {
    format!("Sent now: it runs next (a running turn, if any, was interrupted). Follow it: coffer chat watch {id}\n")
}

// ---------------------------------------------------------------------------------------------
// Commands.

async fn agents(ctx: &Ctx) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    let resp = api.get_raw("/v1/agents").await?;
    if ctx.json {
        return output::print_body(&resp.body);
    }
    let page: Page<Agent> = resp.parse()?;
    output::print(&render_agents(&page.items))
}

/// The path of `GET /v1/conversations` for `a`.
pub fn list_path(a: &ListArgs) -> String {
    let archived = if a.all {
        Some("all")
    } else if a.archived {
        Some("archived")
    } else {
        None
    };
    let limit = a.limit.to_string();
    with_query(
        "/v1/conversations",
        &[("archived", archived), ("q", a.search.as_deref()), ("limit", Some(&limit)), ("cursor", a.cursor.as_deref())],
    )
}

async fn list(ctx: &Ctx, a: ListArgs) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    let resp = api.get_raw(&list_path(&a)).await?;
    if ctx.json {
        return output::print_body(&resp.body);
    }
    let page: Page<Conversation> = resp.parse()?;
    if page.items.is_empty() {
        return output::println("No conversations; start one with `coffer chat new --agent claude_code TEXT`");
    }
    output::print(&render_conversations(&page.items, output::terminal_width()))?;
    if let Some(c) = &page.next_cursor {
        output::println(&format!("More: coffer chat list --cursor {c}"))?;
    }
    Ok(())
}

/// The body of `POST /v1/conversations` for `a` (a relative `--cwd` resolved against `cwd`);
/// `first_message` only when the command does not follow the turn (it then sends the message
/// itself, after opening the event stream).
pub fn new_body(a: &NewArgs, cwd: &Path) -> ConversationCreate {
    let cfg = AgentConfigCreate {
        cwd: a.cwd.as_ref().map(|d| absolute(d, cwd).display().to_string()),
        model: a.model.clone(),
        permission_mode: a.mode.as_ref().map(|m| m.replace('-', "_")),
    };
    ConversationCreate {
        agent_key: a.agent.clone(),
        title: a.title.clone(),
        agent_config: (cfg != AgentConfigCreate::default()).then_some(cfg),
        first_message: (!a.text.is_empty() && !a.watch).then(|| a.text.join(" ")),
        ..Default::default()
    }
}

async fn new(ctx: &Ctx, a: NewArgs) -> Result<(), CliError> {
    let here = std::env::current_dir().map_err(|e| CliError::Failed(format!("cannot read the current folder: {e}")))?;
    let body = new_body(&a, &here);
    let ctrl_c = if a.watch { Some(CtrlC::catch()?) } else { None };
    let api = ctx.connect().await?;
    let resp = api.send(api.request(reqwest::Method::POST, "/v1/conversations").json(&body)).await?;
    let c: Conversation = resp.parse()?;
    let id = c.id;
    if ctx.json {
        output::print_body(&resp.body)?;
    } else {
        output::println(&format!(
            "Started conversation {id} with {} in {}",
            printable(&c.agent_key),
            printable(&c.agent_config.cwd)
        ))?;
        if !a.watch {
            output::println(&format!("Follow it: coffer chat watch {id}"))?;
        }
    }
    let Some(ctrl_c) = ctrl_c else { return Ok(()) };
    if a.text.is_empty() {
        return finish(follow(ctx, &api, &id, 0, None, None, ctrl_c).await?, ctx, &id);
    }
    send_and_follow(ctx, &api, &id, &a.text.join(" "), Some(ctrl_c), false, None).await
}

/// Newest messages `chat diff` looks through for the last turn that changed files.
const DIFF_LOOKBACK: &str = "200";

/// `chat diff ID [PATH] [--message MID]`: the turn's changed files, or one file's unified diff
/// as the daemon keeps it (`--json`: the server's JSON).
async fn diff(ctx: &Ctx, a: DiffArgs) -> Result<(), CliError> {
    if a.path.as_deref().is_some_and(|p| p.trim().is_empty()) {
        return Err(CliError::Usage(format!(
            "PATH is empty: give a file as `coffer chat diff {}` lists it (e.g. src/main.rs), or no PATH to list them",
            a.id
        )));
    }
    let api = ctx.connect().await?;
    let view: ConversationView =
        api.get_as(&with_query(&conv_path(&a.id), &[("messages", Some(DIFF_LOOKBACK))])).await?;
    let here =
        std::env::current_dir().map_err(|e| CliError::Failed(format!("cannot read the current directory: {e}")))?;
    let path = a.path.as_deref().map(|p| diff_path(p, &here, &view.conversation.agent_config.cwd)).transpose()?;
    let found = view.messages.iter().rev().find(|m| match &a.message {
        Some(id) => &m.id == id,
        None => m.files_changed.as_ref().is_some_and(|f| !f.files.is_empty()),
    });
    let Some(m) = found else {
        return Err(CliError::NotFound(match &a.message {
            Some(mid) => format!("message {mid} is not among conversation {}'s newest {DIFF_LOOKBACK}", a.id),
            None => {
                format!("no turn of conversation {} changed files (among its newest {DIFF_LOOKBACK} messages)", a.id)
            }
        }));
    };
    let Some(path) = &path else {
        let files = m.files_changed.clone().unwrap_or_default();
        if ctx.json {
            let v = serde_json::to_value(&files).map_err(|e| CliError::Failed(e.to_string()))?;
            return output::println(&serde_json::to_string_pretty(&v).unwrap_or_default());
        }
        let mut out = format!("Message {} ({}):\n", m.id, at(m.created_ms));
        out.push_str(&files_changed_text(&files));
        out.push_str(&format!("One file's diff: coffer chat diff {} PATH --message {}\n", a.id, m.id));
        return output::print(&out);
    };
    let resp = api
        .get_raw(&with_query(&format!("{}/messages/{}/diff", conv_path(&a.id), m.id), &[("path", Some(path))]))
        .await?;
    if ctx.json {
        return output::print_body(&resp.body);
    }
    let d: coffer_api::chat::FileDiff = resp.parse()?;
    let mut text = printable_text(&d.diff).into_owned();
    if !text.ends_with('\n') {
        text.push('\n');
    }
    output::print(&text)
}

/// `chat diff`'s PATH as a turn lists its files: relative to the conversation's folder `cwd`,
/// `/`-separated, normalised lexically (no file is looked at): `./sub/d.rs`, `sub//d.rs`,
/// `sub/x/../d.rs` and `<cwd>/sub/d.rs` are all `sub/d.rs`. The command passes the path the
/// A relative `path` is read against `here`, the shell's current directory, as any command reads
/// a path (from `<cwd>/sub`, `d.rs` is `sub/d.rs`; from elsewhere, `sub/d.rs` is outside).
///
/// # Errors
/// [`CliError::Usage`] for a path that leaves the folder (`../x`, an absolute path elsewhere)
/// or names the folder itself.
fn diff_path(path: &str, here: &Path, cwd: &str) -> Result<String, CliError> {
    use std::path::Component;
    /// The parts of `p` with `.` dropped and `..` taken back; `None` when `..` goes above its start.
    fn parts(p: &Path) -> Option<Vec<String>> {
        let mut out: Vec<String> = Vec::new();
        for c in p.components() {
            match c {
                Component::Normal(n) => out.push(n.to_string_lossy().into_owned()),
                Component::ParentDir => {
                    out.pop()?;
                }
                Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
            }
        }
        Some(out)
    }
    let outside = || {
        CliError::Usage(format!(
            "PATH {path:?} is outside the conversation's folder {cwd} (a relative PATH is read from the current directory, {}): give a file inside the folder",
            here.display()
        ))
    };
    let p = here.join(path);
    let rel = if p.is_absolute() {
        let (full, base) = (parts(&p).ok_or_else(outside)?, parts(Path::new(cwd)).ok_or_else(outside)?);
        if cwd.is_empty() || !full.starts_with(&base) {
            return Err(outside());
        }
        full[base.len()..].to_vec()
    } else {
        parts(&p).ok_or_else(outside)?
    };
    if rel.is_empty() {
        return Err(CliError::Usage(format!(
            "PATH {path:?} is the conversation's folder itself: give a file in it (as `coffer chat diff ID` lists it)"
        )));
    }
    Ok(rel.join("/"))
}

async fn show(ctx: &Ctx, a: ShowArgs) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    let n = a.messages.to_string();
    let resp = api.get_raw(&with_query(&conv_path(&a.id), &[("messages", Some(&n))])).await?;
    if ctx.json {
        return output::print_body(&resp.body);
    }
    output::print(&render_view(&resp.parse()?))
}

async fn send(ctx: &Ctx, a: SendArgs) -> Result<(), CliError> {
    // Read and checked before the daemon is reached: a usage error starts nothing.
    let text = TextSource::of(&a).read(!a.attach.is_empty())?;
    let attachments = read_attachments(&a.attach)?;
    let ctrl_c = if a.watch { Some(CtrlC::catch()?) } else { None };
    let api = ctx.connect().await?;
    send_and_follow(ctx, &api, &a.id, &text, ctrl_c, a.now, attachments).await
}

async fn watch(ctx: &Ctx, id: &str) -> Result<(), CliError> {
    let ctrl_c = CtrlC::catch()?;
    let api = ctx.connect().await?;
    // after = 0: the running turn from its start, then live.
    let stream = api.stream(&format!("{}/events", conv_path(id)), Some(0)).await?;
    // On stderr also with --json: stdout holds only the events.
    crate::eprintln_printable!("Watching conversation {id} (Ctrl-C stops watching, not the turn)");
    match follow(ctx, &api, id, 0, Some(stream), None, ctrl_c).await? {
        End::Stopped => Ok(()),
        end => finish(end, ctx, id),
    }
}

async fn stop(ctx: &Ctx, id: &str) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    let resp = api.send(api.request(reqwest::Method::POST, &format!("{}/interrupt", conv_path(id)))).await?;
    if ctx.json {
        return output::print_body(&resp.body);
    }
    if resp.parse::<Interrupted>()?.interrupted {
        output::println(&format!(
            "Stopped the turn; its partial answer is kept. The next message you send runs at once; \
             queued ones wait: `coffer chat pending {id} --resume`"
        ))
    } else {
        output::println("No turn was running; nothing changed")
    }
}

/// The body of `PUT …/pending` for `a` given the queue now (`--resume` sends it back as it is).
pub fn pending_body(a: &PendingArgs, queue: &PendingQueue) -> Option<PendingSet> {
    let items: Vec<PendingItemSet> = if a.clear {
        Vec::new()
    } else if !a.set.is_empty() {
        a.set.iter().map(|t| PendingItemSet { id: None, text: t.clone() }).collect()
    } else if a.resume {
        queue.items.iter().map(|i| PendingItemSet { id: Some(i.id.clone()), text: i.text.clone() }).collect()
    } else {
        return None;
    };
    Some(PendingSet { items, paused: None })
}

async fn pending(ctx: &Ctx, a: PendingArgs) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    let view_path = with_query(&conv_path(&a.id), &[("messages", Some("1"))]);
    let queue = if a.resume || (!a.clear && a.set.is_empty()) {
        let v: ConversationView = api.get_as(&view_path).await?;
        if !a.resume {
            if ctx.json {
                return output::print_json(
                    &serde_json::to_value(&v.pending)
                        .map_err(|e| CliError::Failed(format!("cannot write the queue as JSON: {e}")))?,
                );
            }
            return output::print(&render_pending(&v.pending));
        }
        v.pending
    } else {
        PendingQueue::default()
    };
    let Some(body) = pending_body(&a, &queue) else { return Ok(()) };
    let resp =
        api.send(api.request(reqwest::Method::PUT, &format!("{}/pending", conv_path(&a.id))).json(&body)).await?;
    if ctx.json {
        return output::print_body(&resp.body);
    }
    output::print(&render_pending(&resp.parse()?))
}

async fn patch(ctx: &Ctx, id: &str, body: ConversationPatch, done: &str) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    let resp = api.send(api.request(reqwest::Method::PATCH, &conv_path(id)).json(&body)).await?;
    if ctx.json {
        return output::print_body(&resp.body);
    }
    let c: Conversation = resp.parse()?;
    output::println(&format!("{done} conversation {id}: {}", one_line(&c.title, 100)))
}

async fn rm(ctx: &Ctx, id: &str) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    let resp = api.send(api.request(reqwest::Method::DELETE, &conv_path(id))).await?;
    if ctx.json {
        return output::print_body(&resp.body);
    }
    let cancelled = resp.parse::<ConversationDeleted>()?.turn_cancelled;
    output::println(&format!(
        "Deleted conversation {id}{}",
        if cancelled { " (its running turn was cancelled)" } else { "" }
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use coffer_api::chat::PendingItem;
    use serde_json::json;

    #[test]
    fn diff_paths_are_normalised_lexically_and_escapes_refused() {
        let cwd = "/work/proj";
        for (given, want) in [
            ("sub/d.rs", "sub/d.rs"),
            ("./sub/d.rs", "sub/d.rs"),
            ("sub//d.rs", "sub/d.rs"),
            ("sub/./x/../d.rs", "sub/d.rs"),
            ("/work/proj/sub/d.rs", "sub/d.rs"),
            ("/work//proj/./sub/d.rs", "sub/d.rs"),
            ("sub/d.rs/", "sub/d.rs"),
        ] {
            assert_eq!(diff_path(given, Path::new(cwd), cwd).unwrap(), want, "{given}");
        }
        // A relative PATH is read from the shell's current directory.
        let sub = Path::new("/work/proj/sub");
        assert_eq!(diff_path("d.rs", sub, cwd).unwrap(), "sub/d.rs");
        assert_eq!(diff_path("../top.rs", sub, cwd).unwrap(), "top.rs");
        assert_eq!(diff_path("/work/proj/x.rs", Path::new("/elsewhere"), cwd).unwrap(), "x.rs");
        let e = diff_path("sub/d.rs", Path::new("/elsewhere"), cwd).unwrap_err();
        assert!(
            matches!(&e, CliError::Usage(m) if m.contains("\"sub/d.rs\" is outside") && m.contains("/elsewhere")),
            "{e}"
        );
        for outside in ["../x", "sub/../../x", "/etc/passwd", "/work/projx/d.rs", "/work/proj/../other/d.rs", "/.."] {
            let e = diff_path(outside, Path::new(cwd), cwd).unwrap_err();
            assert!(
                matches!(&e, CliError::Usage(m) if m.contains("outside the conversation's folder")),
                "{outside}: {e}"
            );
        }
        for itself in [".", "./", "/work/proj", "sub/.."] {
            let e = diff_path(itself, Path::new(cwd), cwd).unwrap_err();
            assert!(matches!(&e, CliError::Usage(m) if m.contains("folder itself")), "{itself}: {e}");
        }
    }

    /// A body as the daemon would send it, read as `T`.
    fn typed<T: serde::de::DeserializeOwned>(v: Value) -> T {
        serde_json::from_value(v).unwrap()
    }

    fn parse(args: &[&str]) -> Result<crate::Cli, clap::Error> {
        let mut full = vec!["coffer", "chat"];
        full.extend_from_slice(args);
        crate::Cli::try_parse_from(full)
    }

    fn ev(seq: u64, turn: Option<&str>, kind: &str, body: Value) -> Event {
        let mut v = json!({"seq": seq, "conversation_id": "01C", "at_ms": 1, "turn_id": turn, "kind": kind});
        v[kind] = body;
        typed(v)
    }

    fn user(id: &str, text: &str) -> Value {
        json!({"message": {"id": id, "conversation_id": "01C", "role": "user", "source": "cli", "status": "complete",
               "blocks": [{"type": "text", "text": text}]}})
    }

    fn started(user_message_id: &str) -> Value {
        json!({"user_message_id": user_message_id, "assistant_message_id": "01A", "agent_key": "claude_code"})
    }

    fn done() -> Value {
        json!({"stop_reason": "end_turn"})
    }

    fn failed() -> Value {
        json!({"code": "provider", "message": "the model API answered 500"})
    }

    fn item(id: &str, text: &str) -> PendingItem {
        PendingItem { id: id.into(), text: text.into(), created_ms: None, source: None }
    }

    #[test]
    fn arguments_are_checked_before_any_request() {
        for ok in [
            &["agents"][..],
            &["list", "--archived", "--search", "x"],
            &["new", "--agent", "claude_code", "fix", "it", "--watch"],
            &["new", "--agent", "codex", "--cwd", ".", "--model", "o4"],
            &["send", "01C", "hi", "--watch"],
            &["send", "01C", "-", "--watch"],
            &["send", "01C", "--file", "long.md"],
            &["send", "01C", "--file", "long.md", "--attach", "a.png"],
            &["pending", "01C", "--set", "a", "b"],
            &["pending", "01C"],
            &["rename", "01C", "new", "title"],
        ] {
            assert!(parse(ok).is_ok(), "{ok:?}");
        }
        for bad in [
            &["new", "hi"][..],
            &["send", "01C"],
            &["send", "01C", "--file", "long.md", "and", "words"],
            &["send", "01C", "--file"],
            &["list", "--archived", "--all"],
            &["list", "--limit", "0"],
            &["pending", "01C", "--resume", "--clear"],
            &["rename", "01C"],
            &["show"],
        ] {
            assert_eq!(parse(bad).unwrap_err().exit_code(), 2, "{bad:?}");
        }
    }

    fn send_args(args: &[&str]) -> SendArgs {
        let mut all = vec!["send", "01C"];
        all.extend_from_slice(args);
        let crate::commands::Command::Chat(ChatCommand::Send(a)) = parse(&all).unwrap().command else { panic!("send") };
        a
    }

    #[test]
    fn a_message_comes_from_words_stdin_or_a_file_and_is_checked_before_sending() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(TextSource::of(&send_args(&["fix", "it"])), TextSource::Args("fix it".into()));
        assert_eq!(TextSource::of(&send_args(&["-"])), TextSource::Stdin);
        // `-` among other words is a word.
        assert_eq!(TextSource::of(&send_args(&["a", "-", "b"])), TextSource::Args("a - b".into()));
        let long = dir.path().join("long.md");
        let text = format!("{}\nend", "x".repeat(300 * 1024));
        std::fs::write(&long, &text).unwrap();
        let a = send_args(&["--file", long.to_str().unwrap()]);
        assert_eq!(TextSource::of(&a).read(false).unwrap(), text, "read whole, as written");

        let usage = |src: TextSource, attachments: bool| {
            let e = src.read(attachments).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{e}");
            e.to_string()
        };
        let missing = dir.path().join("missing.md");
        let e = usage(TextSource::File(missing.clone()), false);
        assert!(e.contains(&format!("--file {}", missing.display())) && e.contains("cannot read"), "{e}");
        let e = usage(TextSource::File(dir.path().to_owned()), false);
        assert!(e.contains("folder"), "{e}");
        let blank = dir.path().join("blank.md");
        std::fs::write(&blank, " \n\n").unwrap();
        let e = usage(TextSource::File(blank.clone()), false);
        assert!(e.contains("blank.md is empty") && e.contains("1 MiB"), "{e}");
        assert!(TextSource::File(blank).read(true).is_ok(), "with --attach the text may be empty");
        let binary = dir.path().join("image.png");
        std::fs::write(&binary, [b'o', b'k', 0xff, 0xfe]).unwrap();
        let e = usage(TextSource::File(binary), false);
        assert!(e.contains("not UTF-8") && e.contains("offset 2"), "{e}");
        let huge = dir.path().join("huge.md");
        std::fs::write(&huge, "y".repeat(MAX_MESSAGE_TEXT_BYTES + 1)).unwrap();
        let e = usage(TextSource::File(huge), false);
        assert!(
            e.contains("1048577 bytes")
                && e.contains("chat service's limit of 1 MiB (1048576 bytes)")
                && e.contains("--attach"),
            "{e}"
        );
        let at_limit = dir.path().join("limit.md");
        std::fs::write(&at_limit, "z".repeat(MAX_MESSAGE_TEXT_BYTES)).unwrap();
        assert_eq!(TextSource::File(at_limit).read(false).unwrap().len(), MAX_MESSAGE_TEXT_BYTES, "1 MiB is allowed");
        let e = usage(TextSource::Args("w ".repeat(MAX_MESSAGE_TEXT_BYTES / 2 + 1)), false);
        assert!(e.contains("the message is 1048578 bytes"), "{e}");
    }

    #[test]
    fn bodies_and_paths_carry_what_was_asked() {
        let crate::commands::Command::Chat(ChatCommand::New(a)) =
            parse(&["new", "--agent", "codex", "--cwd", "src", "--model", "o4", "fix", "it"]).unwrap().command
        else {
            panic!("new")
        };
        assert_eq!(
            serde_json::to_value(new_body(&a, Path::new("/home/u"))).unwrap(),
            json!({"agent_key": "codex", "agent_config": {"cwd": "/home/u/src", "model": "o4"}, "first_message": "fix it"})
        );
        // With --watch the CLI sends the first message itself, after opening the stream.
        let crate::commands::Command::Chat(ChatCommand::New(a)) =
            parse(&["new", "--agent", "claude_code", "hi", "--watch"]).unwrap().command
        else {
            panic!("new")
        };
        assert_eq!(serde_json::to_value(new_body(&a, Path::new("/"))).unwrap(), json!({"agent_key": "claude_code"}));
        let crate::commands::Command::Chat(ChatCommand::List(l)) =
            parse(&["list", "--all", "--search", "a b"]).unwrap().command
        else {
            panic!("list")
        };
        assert_eq!(list_path(&l), "/v1/conversations?archived=all&q=a%20b&limit=50");
        let queue =
            typed(json!({"items": [{"id": "01P", "text": "a", "created_ms": 5, "source": "cli"}], "paused": true}));
        let p = |args: &[&str]| {
            let crate::commands::Command::Chat(ChatCommand::Pending(p)) = parse(args).unwrap().command else {
                panic!("pending")
            };
            pending_body(&p, &queue).map(|b| serde_json::to_value(b).unwrap())
        };
        assert_eq!(p(&["pending", "01C", "--resume"]), Some(json!({"items": [{"id": "01P", "text": "a"}]})));
        assert_eq!(p(&["pending", "01C", "--clear"]), Some(json!({"items": []})));
        assert_eq!(p(&["pending", "01C", "--set", "x", "y"]), Some(json!({"items": [{"text": "x"}, {"text": "y"}]})));
        assert_eq!(p(&["pending", "01C"]), None);
    }

    #[test]
    fn watch_renders_streaming_text_tools_and_the_turn_end() {
        let mut r = Renderer::default();
        let mut out = String::new();
        for e in [
            ev(1, Some("T"), "message_created", user("01U", "Why does\nthe build fail?")),
            ev(2, Some("T"), "turn_started", started("01U")),
            ev(3, Some("T"), "text_delta", json!({"text": "Let me "})),
            ev(4, Some("T"), "text_delta", json!({"text": "look.\u{1b}[2J"})),
            ev(
                5,
                Some("T"),
                "tool_call",
                json!({"tool_use_id": "t1", "name": "Bash", "input": {"command": "cargo build"}}),
            ),
            ev(
                6,
                Some("T"),
                "tool_result",
                json!({"tool_use_id": "t1", "output": "error[E0308]: mismatched types\n --> src/main.rs", "is_error": false}),
            ),
            ev(7, Some("T"), "text_delta", json!({"text": "A type error."})),
            ev(
                8,
                Some("T"),
                "turn_done",
                json!({"stop_reason": "end_turn", "model": "claude-x", "usage": {"input_tokens": 1200, "output_tokens": 56, "cache_read_tokens": 0, "cache_write_tokens": 0}}),
            ),
            ev(9, None, "queue_changed", json!({"queue": {"items": [{"id": "p", "text": "later"}], "paused": true}})),
        ] {
            out.push_str(&r.render(&e));
        }
        out.push_str(r.finish());
        assert_eq!(
            out,
            "› you (cli): Why does the build fail?\n\
             Let me look.\\u001b[2J\n\
             ⚙ Bash({\"command\":\"cargo build\"})\n\
             ↳ error[E0308]: mismatched types --> src/main.rs\n\
             A type error.\n\
             ✓ done · end_turn · claude-x · 1200 in / 56 out tokens\n\
             ⧗ queue: 1 pending (paused; `coffer chat pending ID --resume`)\n"
        );
        let long = "x".repeat(300);
        let line = tool_result_line(&long, true);
        assert!(line.starts_with("↳ error: xxx") && line.ends_with('…') && line.chars().count() < 120, "{line}");
        assert_eq!(tool_call_line("t", &json!({})), "⚙ t()");
        let mut r = Renderer::default();
        assert!(
            r.render(&ev(1, Some("T"), "turn_error", json!({"code": "timeout", "message": "no output for 600 s"})))
                .starts_with("✗ turn failed (timeout): no output")
        );
        assert!(r.render(&ev(2, None, "reset", json!({"reason": "deleted"}))).contains("deleted"));
    }

    #[test]
    fn a_broken_stream_is_reopened_on_a_restarted_daemon_only_for_the_right_errors() {
        use crate::error::ApiFailure;
        let api = |status: u16| CliError::Api(Box::new(ApiFailure::from_body(status, None, "{}")));
        // A restarted daemon: unreachable while it starts, then the old token refused.
        assert!(daemon_changed(&CliError::Unreachable("refused".into())));
        assert!(daemon_changed(&api(401)));
        assert!(!retryable(&api(401)), "a 401 alone is no service restart");
        // The conversation is gone or the request is wrong: no retry, no re-detect.
        for status in [400, 403, 404] {
            assert!(!daemon_changed(&api(status)) && !retryable(&api(status)), "{status}");
        }
        assert!(retryable(&api(503)) && !daemon_changed(&api(503)));
    }

    #[test]
    fn a_sent_message_is_followed_to_the_end_of_its_own_turn() {
        // Started at once: matched by the user message id.
        let started_now = SendMessageReply {
            message: Some(Message { id: "01U".into(), ..Default::default() }),
            ..Default::default()
        };
        let mut t = Target::from_reply(&started_now, "hi");
        assert!(!t.ends_with(&ev(1, Some("OTHER"), "turn_done", done())));
        assert!(!t.ends_with(&ev(2, Some("T1"), "message_created", user("01U", "hi"))));
        assert!(!t.ends_with(&ev(3, Some("T1"), "text_delta", json!({"text": "x"}))));
        assert!(t.ends_with(&ev(4, Some("T1"), "turn_done", done())));
        // Queued: the earlier turn's end is not ours; the dequeued message is, by id or by text.
        let reply = SendMessageReply {
            pending: Some(item("01P", "next")),
            queue: PendingQueue { items: vec![item("01P", "next")], paused: false },
            message: None,
        };
        let mut t = Target::from_reply(&reply, "next");
        assert!(t.queued);
        assert!(!t.ends_with(&ev(5, Some("T1"), "turn_done", done())));
        assert!(!t.ends_with(&ev(6, Some("T2"), "message_created", user("01X", "other"))));
        assert!(!t.ends_with(&ev(7, Some("T2"), "turn_error", failed())));
        assert!(!t.ends_with(&ev(8, Some("T3"), "message_created", user("01Y", "next"))));
        assert!(t.ends_with(&ev(9, Some("T3"), "turn_error", failed())));
        let mut t = Target::from_reply(&reply, "next");
        assert!(!t.ends_with(&ev(10, Some("T4"), "turn_started", started("01P"))));
        assert!(t.ends_with(&ev(11, Some("T4"), "turn_done", done())));
    }

    #[test]
    fn lists_and_conversations_read_at_a_glance() {
        let c = json!({
            "id": "01C", "agent_key": "claude_code", "title": "Fix the build", "message_count": 4,
            "archived": false, "turn_running": true, "pending_count": 2, "pending_paused": false,
            "last_message_ms": 1_796_031_096_000_i64, "updated_ms": 1, "created_ms": 1, "version": 3,
            "agent_config": {"cwd": "/w", "model": "", "session_id": ""}, "channel_name": null,
        });
        let t = render_conversations(&[typed(c.clone())], None);
        assert!(t.contains("01C  claude_code  4         running +2 queued  2026-11-30 09:31:36  Fix the build"), "{t}");
        let v = json!({
            "conversation": c, "more_before": true, "last_seq": 9,
            "messages": [
                {"id": "01U", "conversation_id": "01C", "role": "user", "source": "cli", "created_ms": 1_796_031_096_000_i64, "status": "complete", "usage": null, "model": null, "error": null,
                 "blocks": [{"type": "text", "text": "hi"}]},
                {"id": "01A", "conversation_id": "01C", "role": "assistant", "created_ms": 1_796_031_097_000_i64, "status": "interrupted", "model": "claude-x",
                 "usage": {"input_tokens": 3, "output_tokens": 1, "cache_read_tokens": 0, "cache_write_tokens": 0}, "error": null,
                 "blocks": [{"type": "text", "text": "Hel"}, {"type": "tool_use", "tool_use": {"id": "t1", "name": "Read", "input": {"path": "a"}}}]},
            ],
            "pending": {"items": [{"id": "01P", "text": "then\nthis"}], "paused": true},
        });
        let s = render_view(&typed(v));
        for want in [
            "model:    (the agent's default)",
            "state:    running +2 queued",
            "… older messages: coffer chat show 01C --messages N",
            "[2026-11-30 09:31:36] you (cli):\n  hi\n",
            "[2026-11-30 09:31:37] assistant (claude-x, interrupted, 3 in / 1 out tokens):\n  Hel\n  ⚙ Read({\"path\":\"a\"})\n",
            "queue: 1 pending (paused; `coffer chat pending ID --resume`)\n  1. then this\n",
        ] {
            assert!(s.contains(want), "missing {want:?} in\n{s}");
        }
        let a = render_agents(&[
            typed(
                json!({"agent_key": "claude_code", "display_name": "Claude Code", "available": true, "command": "/usr/bin/claude", "version": "2.0.1", "reason": null}),
            ),
            typed(
                json!({"agent_key": "codex", "display_name": "Codex", "available": false, "command": null, "version": null, "reason": "`codex` was not found on PATH"}),
            ),
        ]);
        assert!(a.contains("claude_code  Claude Code  yes        2.0.1    /usr/bin/claude"), "{a}");
        assert!(a.contains("codex        Codex        no         -        `codex` was not found on PATH"), "{a}");
        assert_eq!(
            sent_line(
                &SendMessageReply {
                    pending: Some(item("b", "y")),
                    queue: PendingQueue { items: vec![item("a", "x"), item("b", "y")], paused: false },
                    message: None,
                },
                "01C"
            ),
            "Queued as #2 (a turn is running)\n"
        );
    }
}
