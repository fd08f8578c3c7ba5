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
use serde_json::{Value, json};

use crate::api::{ApiClient, path_segment, with_query};
use crate::commands::kb::{absolute, time_ms};
use crate::context::Ctx;
use crate::error::CliError;
use crate::output::{
    self, cell, printable, printable_text, render_fields, render_table, render_table_fitted, truncate, yes_no,
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
    /// Send a message: it starts a turn, or waits in the pending queue while one runs.
    #[command(
        after_help = "Examples:\n  coffer chat send 01JDQ8ZKXW5T3M2N4P6R7S8T9V 'Now add a test' --watch\n  coffer chat send 01JDQ8ZKXW5T3M2N4P6R7S8T9V and then update the docs"
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
    /// The message (words are joined with spaces).
    #[arg(required = true, num_args = 1.., value_name = "TEXT")]
    pub text: Vec<String>,
    /// Follow the turn this message starts (after the queue, if it waits) until it ends.
    #[arg(long)]
    pub watch: bool,
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
        ChatCommand::Archive(a) => patch(ctx, &a.id, json!({"archived": true}), "Archived").await,
        ChatCommand::Restore(a) => patch(ctx, &a.id, json!({"archived": false}), "Restored").await,
        ChatCommand::Rename(a) => patch(ctx, &a.id, json!({"title": a.title.join(" ")}), "Renamed").await,
        ChatCommand::Rm(a) => rm(ctx, &a.id).await,
    }
}

fn conv_path(id: &str) -> String {
    format!("/v1/conversations/{}", path_segment(id))
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

/// Token usage as `1234 in / 56 out tokens` (cache reads added when there were some).
pub fn usage_text(u: &Value) -> String {
    let n = |k: &str| u[k].as_u64().unwrap_or(0);
    let mut s = format!("{} in / {} out tokens", n("input_tokens"), n("output_tokens"));
    if n("cache_read_tokens") > 0 {
        s.push_str(&format!(", {} from cache", n("cache_read_tokens")));
    }
    s
}

/// A message's text blocks joined.
pub fn message_text(m: &Value) -> String {
    m["blocks"]
        .as_array()
        .map(|b| {
            b.iter().filter(|b| b["type"] == "text").filter_map(|b| b["text"].as_str()).collect::<Vec<_>>().join("")
        })
        .unwrap_or_default()
}

/// The queue in one line: `queue: 2 pending (paused)`, `queue: empty`.
pub fn queue_line(q: &Value) -> String {
    let n = q["items"].as_array().map_or(0, Vec::len);
    let paused = q["paused"].as_bool().unwrap_or(false);
    match (n, paused) {
        (0, false) => "queue: empty".to_owned(),
        (0, true) => "queue: empty (paused)".to_owned(),
        (n, false) => format!("queue: {n} pending"),
        (n, true) => format!("queue: {n} pending (paused; `coffer chat pending ID --resume`)"),
    }
}

/// A conversation's state in one cell: `running`, `idle`, `archived`, plus `+2 queued (paused)`.
pub fn state_cell(c: &Value) -> String {
    let mut s = if c["archived"].as_bool().unwrap_or(false) {
        "archived".to_owned()
    } else if c["turn_running"].as_bool().unwrap_or(false) {
        "running".to_owned()
    } else {
        "idle".to_owned()
    };
    let n = c["pending_count"].as_u64().unwrap_or(0);
    if n > 0 {
        s.push_str(&format!(" +{n} queued"));
    }
    if c["pending_paused"].as_bool().unwrap_or(false) {
        s.push_str(" (paused)");
    }
    s
}

/// The agents table: AGENT NAME AVAILABLE VERSION COMMAND OR REASON.
pub fn render_agents(items: &[Value]) -> String {
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|a| {
            let available = a["available"].as_bool().unwrap_or(false);
            vec![
                cell(a.get("agent_key"), 40),
                cell(a.get("display_name"), 40),
                yes_no(available).to_owned(),
                cell(a.get("version"), 40),
                if available { cell(a.get("command"), 200) } else { cell(a.get("reason"), 200) },
            ]
        })
        .collect();
    render_table(&["AGENT", "NAME", "AVAILABLE", "VERSION", "COMMAND OR REASON"], &rows)
}

/// The conversations table: ID AGENT MESSAGES STATE LAST ACTIVITY TITLE (the title last, cut to
/// `width`).
pub fn render_conversations(items: &[Value], width: Option<usize>) -> String {
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|c| {
            let last = if c["last_message_ms"].is_null() { &c["updated_ms"] } else { &c["last_message_ms"] };
            vec![
                cell(c.get("id"), 40),
                cell(c.get("agent_key"), 30),
                c["message_count"].as_u64().unwrap_or(0).to_string(),
                state_cell(c),
                time_ms(last),
                cell(c.get("title"), 200),
            ]
        })
        .collect();
    render_table_fitted(&["ID", "AGENT", "MESSAGES", "STATE", "LAST ACTIVITY (UTC)", "TITLE"], &rows, width)
}

/// One message as lines: `[time] you (cli):` then its text, or `[time] assistant (model,
/// status):` then text, tool calls and results; an error last.
pub fn render_message(m: &Value) -> String {
    let mut out = String::new();
    let when = time_ms(&m["created_ms"]);
    if m["role"] == "assistant" {
        let mut about: Vec<String> = Vec::new();
        if let Some(model) = m["model"].as_str() {
            about.push(printable(model).into_owned());
        }
        if m["status"] != "complete" {
            about.push(m["status"].as_str().unwrap_or("?").to_owned());
        }
        if !m["usage"].is_null() {
            about.push(usage_text(&m["usage"]));
        }
        let about = if about.is_empty() { String::new() } else { format!(" ({})", about.join(", ")) };
        out.push_str(&format!("[{when}] assistant{about}:\n"));
    } else {
        let source = m["source"].as_str().map(|s| format!(" ({})", printable(s))).unwrap_or_default();
        out.push_str(&format!("[{when}] you{source}:\n"));
    }
    for b in m["blocks"].as_array().map(Vec::as_slice).unwrap_or_default() {
        match b["type"].as_str() {
            Some("text") => {
                for line in printable_text(b["text"].as_str().unwrap_or("")).lines() {
                    out.push_str(&format!("  {line}\n"));
                }
            }
            Some("tool_use") => {
                let u = &b["tool_use"];
                out.push_str(&format!("  {}\n", tool_call_line(u["name"].as_str().unwrap_or("?"), &u["input"])));
            }
            Some("tool_result") => {
                let r = &b["tool_result"];
                out.push_str(&format!(
                    "  {}\n",
                    tool_result_line(r["output"].as_str().unwrap_or(""), r["is_error"].as_bool().unwrap_or(false))
                ));
            }
            _ => {}
        }
    }
    if let Some(e) = m["error"].as_str() {
        out.push_str(&format!("  ✗ {}\n", one_line(e, 400)));
    }
    out
}

/// The pending items, one `  N. text` line each (cut to one line).
pub fn render_pending(q: &Value) -> String {
    let items = q["items"].as_array().map(Vec::as_slice).unwrap_or_default();
    let mut out = format!("{}\n", queue_line(q));
    for (i, p) in items.iter().enumerate() {
        out.push_str(&format!("  {}. {}\n", i + 1, one_line(p["text"].as_str().unwrap_or(""), 200)));
    }
    out
}

/// A conversation shown in full (`chat show`): its fields, then its messages, then the queue.
pub fn render_view(v: &Value) -> String {
    let c = &v["conversation"];
    let cfg = &c["agent_config"];
    let or_default = |k: &str, d: &str| cfg[k].as_str().filter(|s| !s.is_empty()).unwrap_or(d).to_owned();
    let mut fields = vec![
        ("id", cell(c.get("id"), 40)),
        ("title", c["title"].as_str().filter(|t| !t.is_empty()).unwrap_or("-").to_owned()),
        ("agent", cell(c.get("agent_key"), 40)),
        ("cwd", or_default("cwd", "-")),
        ("model", or_default("model", "(the agent's default)")),
        ("session", or_default("session_id", "- (none yet)")),
        ("state", state_cell(c)),
        ("messages", c["message_count"].as_u64().unwrap_or(0).to_string()),
        ("created", time_ms(&c["created_ms"])),
        ("version", c["version"].as_u64().unwrap_or(0).to_string()),
    ];
    if let Some(ch) = c["channel_name"].as_str() {
        fields.push(("channel", format!("{ch} ({})", c["peer_chat_id"].as_str().unwrap_or("-"))));
    }
    let mut out = render_fields(&fields);
    let messages = v["messages"].as_array().map(Vec::as_slice).unwrap_or_default();
    if v["more_before"].as_bool().unwrap_or(false) {
        out.push_str(&format!(
            "\n… older messages: coffer chat show {} --messages N\n",
            c["id"].as_str().unwrap_or("ID")
        ));
    }
    for m in messages {
        out.push('\n');
        out.push_str(&render_message(m));
    }
    let q = &v["pending"];
    if q["items"].as_array().is_some_and(|a| !a.is_empty()) || q["paused"].as_bool().unwrap_or(false) {
        out.push('\n');
        out.push_str(&render_pending(q));
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
    /// What to print for one event (`data` of one SSE frame, kind from its `kind`).
    pub fn render(&mut self, ev: &Value) -> String {
        let kind = ev["kind"].as_str().unwrap_or("");
        let body = &ev[kind];
        let line = match kind {
            "text_delta" => {
                let text = printable_text(body["text"].as_str().unwrap_or("")).into_owned();
                if !text.is_empty() {
                    self.mid_line = !text.ends_with('\n');
                }
                return text;
            }
            "message_created" => {
                let m = &body["message"];
                if m["role"] == "assistant" {
                    return String::new();
                }
                let source = m["source"].as_str().map(|s| format!(" ({})", printable(s))).unwrap_or_default();
                format!("› you{source}: {}", one_line(&message_text(m), 200))
            }
            "turn_started" => return String::new(),
            "tool_call" => tool_call_line(body["name"].as_str().unwrap_or("?"), &body["input"]),
            "tool_result" => {
                tool_result_line(body["output"].as_str().unwrap_or(""), body["is_error"].as_bool().unwrap_or(false))
            }
            "turn_done" => {
                let mut parts =
                    vec![body["stop_reason"].as_str().filter(|s| !s.is_empty()).unwrap_or("done").to_owned()];
                if let Some(m) = body["model"].as_str() {
                    parts.push(printable(m).into_owned());
                }
                if !body["usage"].is_null() {
                    parts.push(usage_text(&body["usage"]));
                }
                let mark = if body["stop_reason"] == "interrupted" { "■ interrupted" } else { "✓ done" };
                format!("{mark} · {}", parts.join(" · "))
            }
            "turn_error" => format!(
                "✗ turn failed ({}): {}",
                printable(body["code"].as_str().unwrap_or("?")),
                one_line(body["message"].as_str().unwrap_or(""), 400)
            ),
            "queue_changed" => format!("⧗ {}", queue_line(&body["queue"])),
            "reset" => match body["reason"].as_str().unwrap_or("") {
                "deleted" => "! the conversation was deleted".to_owned(),
                "lagged" => "! this watcher fell behind; catching up from the conversation".to_owned(),
                _ => "! earlier events are no longer kept; `coffer chat show ID` has the whole conversation".to_owned(),
            },
            _ => return String::new(),
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
    pub fn from_reply(reply: &Value, text: &str) -> Self {
        let (id, queued) = match (reply["message"]["id"].as_str(), reply["pending"]["id"].as_str()) {
            (Some(m), _) => (m.to_owned(), false),
            (None, Some(p)) => (p.to_owned(), true),
            (None, None) => (String::new(), true),
        };
        Self { id, text: text.to_owned(), queued, turn: None }
    }

    /// Notes the turn of an event when it is ours; true when `ev` ends it (`turn_done` or
    /// `turn_error` of our turn).
    pub fn ends_with(&mut self, ev: &Value) -> bool {
        let kind = ev["kind"].as_str().unwrap_or("");
        let turn = ev["turn_id"].as_str();
        if self.turn.is_none() {
            let ours = match kind {
                "message_created" => {
                    let m = &ev[kind]["message"];
                    m["role"] == "user"
                        && (m["id"] == self.id.as_str() || (self.queued && message_text(m) == self.text))
                }
                "turn_started" => ev[kind]["user_message_id"] == self.id.as_str(),
                _ => false,
            };
            if ours {
                self.turn = turn.map(str::to_owned);
            }
        }
        matches!(kind, "turn_done" | "turn_error") && self.turn.is_some() && turn == self.turn.as_deref()
    }
}

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
) -> Result<End, CliError> {
    let json = ctx.json;
    let mut api = api.clone();
    let path = format!("{}/events", conv_path(id));
    let mut renderer = Renderer::default();
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let mut failures = 0u32;
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
            let chunk = tokio::select! {
                c = tokio::time::timeout(STREAM_SILENCE, resp.chunk()) => c,
                _ = &mut ctrl_c => {
                    output::print(renderer.finish())?;
                    return Ok(End::Stopped);
                }
            };
            let bytes = match chunk {
                Ok(Ok(Some(b))) => b,
                // Ended, broke or went silent: resume from the last event seen.
                _ => break,
            };
            parser.push(&bytes, &mut events);
            for e in events.drain(..) {
                let Ok(data) = serde_json::from_slice::<Value>(&e.data) else { continue };
                if let Some(seq) = data["seq"].as_u64() {
                    after = after.max(seq);
                    failures = 0;
                }
                if json {
                    output::println(&String::from_utf8_lossy(&e.data))?;
                } else {
                    output::print(&renderer.render(&data))?;
                }
                if let Some(t) = target.as_mut()
                    && t.ends_with(&data)
                {
                    output::print(renderer.finish())?;
                    return Ok(match data["kind"].as_str() {
                        Some("turn_error") => End::Failed(
                            data["turn_error"]["code"].as_str().unwrap_or("?").to_owned(),
                            data["turn_error"]["message"].as_str().unwrap_or("").to_owned(),
                        ),
                        _ => End::Done,
                    });
                }
                if data["kind"] == "reset" {
                    match data["reset"]["reason"].as_str() {
                        Some("deleted") => {
                            output::print(renderer.finish())?;
                            return Ok(End::Deleted);
                        }
                        Some("lagged") => reload = true,
                        _ => {}
                    }
                    // Events were lost: a followed turn may have ended among them.
                    if let Some(t) = &target
                        && turn_over(&api, id, t).await?
                    {
                        output::print(renderer.finish())?;
                        return Ok(End::Done);
                    }
                }
            }
        }
        if reload {
            // Start again from the conversation as it is now.
            let v = api.get(&with_query(&conv_path(id), &[("messages", Some("1"))])).await?;
            after = v["last_seq"].as_u64().unwrap_or(after);
        }
        failures += 1;
        if failures > RECONNECTS {
            return Err(CliError::Failed(format!(
                "the event stream of conversation {id} broke {RECONNECTS} times in a row; see `coffer status`"
            )));
        }
    }
}

/// After lost events: whether `t`'s turn has ended (no turn runs and its item is not queued).
async fn turn_over(api: &ApiClient, id: &str, t: &Target) -> Result<bool, CliError> {
    let v = api.get(&with_query(&conv_path(id), &[("messages", Some("1"))])).await?;
    let queued = v["pending"]["items"].as_array().is_some_and(|a| a.iter().any(|p| p["id"] == t.id.as_str()));
    Ok(!queued && !v["conversation"]["turn_running"].as_bool().unwrap_or(false))
}

/// Sends `text` to `id` and, with `watch`, follows its turn: the stream is opened first (from
/// the conversation's `last_seq`), then the message is posted.
async fn send_and_follow(ctx: &Ctx, api: &ApiClient, id: &str, text: &str, watch: bool) -> Result<(), CliError> {
    let body = json!({"text": text});
    let post = |api: &ApiClient| {
        let req = api.request(reqwest::Method::POST, &format!("{}/messages", conv_path(id))).json(&body);
        let api = api.clone();
        async move { api.send(req).await }
    };
    if !watch {
        let resp = post(api).await?;
        if ctx.json {
            return output::print_body(&resp.body);
        }
        return output::print(&sent_line(&resp.json()?, id));
    }
    let view = api.get(&with_query(&conv_path(id), &[("messages", Some("1"))])).await?;
    let after = view["last_seq"].as_u64().unwrap_or(0);
    let stream = api.stream(&format!("{}/events", conv_path(id)), Some(after)).await?;
    let resp = post(api).await?;
    let reply = resp.json()?;
    if ctx.json {
        output::print_body(&resp.body)?;
    } else if reply.get("pending").is_some() {
        output::print(&sent_line(&reply, id))?;
    }
    let target = Target::from_reply(&reply, text);
    finish(follow(ctx, api, id, after, Some(stream), Some(target)).await?, ctx, id)
}

/// What a followed turn's end means for the exit code.
fn finish(end: End, ctx: &Ctx, id: &str) -> Result<(), CliError> {
    match end {
        End::Done => Ok(()),
        End::Stopped => {
            crate::eprintln_printable!("Stopped watching; the turn goes on (`coffer chat stop {id}` interrupts it).");
            Ok(())
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
pub fn sent_line(reply: &Value, id: &str) -> String {
    if let Some(p) = reply.get("pending").filter(|p| p.is_object()) {
        let q = &reply["queue"];
        let pos = q["items"].as_array().and_then(|a| a.iter().position(|i| i["id"] == p["id"])).map_or(0, |i| i + 1);
        if q["paused"].as_bool().unwrap_or(false) {
            return format!("Queued as #{pos}; the queue is paused: `coffer chat pending {id} --resume` runs it\n");
        }
        format!("Queued as #{pos} (a turn is running)\n")
    } else {
        format!("Sent; the turn started. Follow it: coffer chat watch {id}\n")
    }
}

// ---------------------------------------------------------------------------------------------
// Commands.

async fn agents(ctx: &Ctx) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    let resp = api.get_raw("/v1/agents").await?;
    if ctx.json {
        return output::print_body(&resp.body);
    }
    let v = resp.json()?;
    output::print(&render_agents(v["items"].as_array().map(Vec::as_slice).unwrap_or_default()))
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
    let v = resp.json()?;
    let items = v["items"].as_array().map(Vec::as_slice).unwrap_or_default();
    if items.is_empty() {
        return output::println("No conversations; start one with `coffer chat new --agent claude_code TEXT`");
    }
    output::print(&render_conversations(items, output::terminal_width()))?;
    if let Some(c) = v["next_cursor"].as_str() {
        output::println(&format!("More: coffer chat list --cursor {c}"))?;
    }
    Ok(())
}

/// The body of `POST /v1/conversations` for `a` (a relative `--cwd` resolved against `cwd`);
/// `first_message` only when the command does not follow the turn (it then sends the message
/// itself, after opening the event stream).
pub fn new_body(a: &NewArgs, cwd: &Path) -> Value {
    let mut body = json!({"agent_key": a.agent});
    let mut cfg = serde_json::Map::new();
    if let Some(d) = &a.cwd {
        cfg.insert("cwd".into(), json!(absolute(d, cwd).display().to_string()));
    }
    if let Some(m) = &a.model {
        cfg.insert("model".into(), json!(m));
    }
    if !cfg.is_empty() {
        body["agent_config"] = Value::Object(cfg);
    }
    if let Some(t) = &a.title {
        body["title"] = json!(t);
    }
    if !a.text.is_empty() && !a.watch {
        body["first_message"] = json!(a.text.join(" "));
    }
    body
}

async fn new(ctx: &Ctx, a: NewArgs) -> Result<(), CliError> {
    let here = std::env::current_dir().map_err(|e| CliError::Failed(format!("cannot read the current folder: {e}")))?;
    let body = new_body(&a, &here);
    let api = ctx.connect().await?;
    let resp = api.send(api.request(reqwest::Method::POST, "/v1/conversations").json(&body)).await?;
    let c = resp.json()?;
    let id = c["id"].as_str().unwrap_or_default().to_owned();
    if ctx.json {
        output::print_body(&resp.body)?;
    } else {
        output::println(&format!(
            "Started conversation {id} with {} in {}",
            printable(c["agent_key"].as_str().unwrap_or("?")),
            printable(c["agent_config"]["cwd"].as_str().unwrap_or("-"))
        ))?;
        if !a.watch {
            output::println(&format!("Follow it: coffer chat watch {id}"))?;
        }
    }
    if !a.watch {
        return Ok(());
    }
    if a.text.is_empty() {
        return finish(follow(ctx, &api, &id, 0, None, None).await?, ctx, &id);
    }
    send_and_follow(ctx, &api, &id, &a.text.join(" "), true).await
}

async fn show(ctx: &Ctx, a: ShowArgs) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    let n = a.messages.to_string();
    let resp = api.get_raw(&with_query(&conv_path(&a.id), &[("messages", Some(&n))])).await?;
    if ctx.json {
        return output::print_body(&resp.body);
    }
    output::print(&render_view(&resp.json()?))
}

async fn send(ctx: &Ctx, a: SendArgs) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    send_and_follow(ctx, &api, &a.id, &a.text.join(" "), a.watch).await
}

async fn watch(ctx: &Ctx, id: &str) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    // after = 0: the running turn from its start, then live.
    let stream = api.stream(&format!("{}/events", conv_path(id)), Some(0)).await?;
    // On stderr also with --json: stdout holds only the events.
    crate::eprintln_printable!("Watching conversation {id} (Ctrl-C stops watching, not the turn)");
    match follow(ctx, &api, id, 0, Some(stream), None).await? {
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
    if resp.json()?["interrupted"].as_bool().unwrap_or(false) {
        output::println(&format!(
            "Stopped the turn; its partial answer is kept. The queue is paused: `coffer chat pending {id} --resume`"
        ))
    } else {
        output::println("No turn was running; nothing changed")
    }
}

/// The body of `PUT …/pending` for `a` given the queue now (`--resume` sends it back as it is).
pub fn pending_body(a: &PendingArgs, queue: &Value) -> Option<Value> {
    if a.clear {
        return Some(json!({"items": []}));
    }
    if !a.set.is_empty() {
        return Some(json!({"items": a.set.iter().map(|t| json!({"text": t})).collect::<Vec<_>>()}));
    }
    if a.resume {
        let items: Vec<Value> = queue["items"]
            .as_array()
            .map(|a| a.iter().map(|i| json!({"id": i["id"], "text": i["text"]})).collect())
            .unwrap_or_default();
        return Some(json!({"items": items}));
    }
    None
}

async fn pending(ctx: &Ctx, a: PendingArgs) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    let view_path = with_query(&conv_path(&a.id), &[("messages", Some("1"))]);
    let queue = if a.resume || (!a.clear && a.set.is_empty()) {
        let resp = api.get_raw(&view_path).await?;
        let v = resp.json()?;
        if !a.resume {
            if ctx.json {
                return output::print_json(&v["pending"]);
            }
            return output::print(&render_pending(&v["pending"]));
        }
        v["pending"].clone()
    } else {
        Value::Null
    };
    let Some(body) = pending_body(&a, &queue) else { return Ok(()) };
    let resp =
        api.send(api.request(reqwest::Method::PUT, &format!("{}/pending", conv_path(&a.id))).json(&body)).await?;
    if ctx.json {
        return output::print_body(&resp.body);
    }
    output::print(&render_pending(&resp.json()?))
}

async fn patch(ctx: &Ctx, id: &str, body: Value, done: &str) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    let resp = api.send(api.request(reqwest::Method::PATCH, &conv_path(id)).json(&body)).await?;
    if ctx.json {
        return output::print_body(&resp.body);
    }
    let c = resp.json()?;
    output::println(&format!("{done} conversation {id}: {}", one_line(c["title"].as_str().unwrap_or(""), 100)))
}

async fn rm(ctx: &Ctx, id: &str) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    let resp = api.send(api.request(reqwest::Method::DELETE, &conv_path(id))).await?;
    if ctx.json {
        return output::print_body(&resp.body);
    }
    let cancelled = resp.json()?["turn_cancelled"].as_bool().unwrap_or(false);
    output::println(&format!(
        "Deleted conversation {id}{}",
        if cancelled { " (its running turn was cancelled)" } else { "" }
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn parse(args: &[&str]) -> Result<crate::Cli, clap::Error> {
        let mut full = vec!["coffer", "chat"];
        full.extend_from_slice(args);
        crate::Cli::try_parse_from(full)
    }

    fn ev(seq: u64, turn: Option<&str>, kind: &str, body: Value) -> Value {
        let mut v = json!({"seq": seq, "conversation_id": "01C", "at_ms": 1, "turn_id": turn, "kind": kind});
        v[kind] = body;
        v
    }

    fn user(id: &str, text: &str) -> Value {
        json!({"message": {"id": id, "role": "user", "source": "cli", "blocks": [{"type": "text", "text": text}]}})
    }

    #[test]
    fn arguments_are_checked_before_any_request() {
        for ok in [
            &["agents"][..],
            &["list", "--archived", "--search", "x"],
            &["new", "--agent", "claude_code", "fix", "it", "--watch"],
            &["new", "--agent", "codex", "--cwd", ".", "--model", "o4"],
            &["send", "01C", "hi", "--watch"],
            &["pending", "01C", "--set", "a", "b"],
            &["pending", "01C"],
            &["rename", "01C", "new", "title"],
        ] {
            assert!(parse(ok).is_ok(), "{ok:?}");
        }
        for bad in [
            &["new", "hi"][..],
            &["send", "01C"],
            &["list", "--archived", "--all"],
            &["list", "--limit", "0"],
            &["pending", "01C", "--resume", "--clear"],
            &["rename", "01C"],
            &["show"],
        ] {
            assert_eq!(parse(bad).unwrap_err().exit_code(), 2, "{bad:?}");
        }
    }

    #[test]
    fn bodies_and_paths_carry_what_was_asked() {
        let crate::commands::Command::Chat(ChatCommand::New(a)) =
            parse(&["new", "--agent", "codex", "--cwd", "src", "--model", "o4", "fix", "it"]).unwrap().command
        else {
            panic!("new")
        };
        assert_eq!(
            new_body(&a, Path::new("/home/u")),
            json!({"agent_key": "codex", "agent_config": {"cwd": "/home/u/src", "model": "o4"}, "first_message": "fix it"})
        );
        // With --watch the CLI sends the first message itself, after opening the stream.
        let crate::commands::Command::Chat(ChatCommand::New(a)) =
            parse(&["new", "--agent", "claude_code", "hi", "--watch"]).unwrap().command
        else {
            panic!("new")
        };
        assert_eq!(new_body(&a, Path::new("/")), json!({"agent_key": "claude_code"}));
        let crate::commands::Command::Chat(ChatCommand::List(l)) =
            parse(&["list", "--all", "--search", "a b"]).unwrap().command
        else {
            panic!("list")
        };
        assert_eq!(list_path(&l), "/v1/conversations?archived=all&q=a%20b&limit=50");
        let queue = json!({"items": [{"id": "01P", "text": "a", "source": "cli"}], "paused": true});
        let p = |args: &[&str]| {
            let crate::commands::Command::Chat(ChatCommand::Pending(p)) = parse(args).unwrap().command else {
                panic!("pending")
            };
            pending_body(&p, &queue)
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
            ev(2, Some("T"), "turn_started", json!({"user_message_id": "01U"})),
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
                json!({"stop_reason": "end_turn", "model": "claude-x", "usage": {"input_tokens": 1200, "output_tokens": 56, "cache_read_tokens": 0}}),
            ),
            ev(9, None, "queue_changed", json!({"queue": {"items": [{"id": "p"}], "paused": true}})),
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
        let mut t = Target::from_reply(&json!({"message": {"id": "01U"}, "queue": {"items": []}}), "hi");
        assert!(!t.ends_with(&ev(1, Some("OTHER"), "turn_done", json!({}))));
        assert!(!t.ends_with(&ev(2, Some("T1"), "message_created", user("01U", "hi"))));
        assert!(!t.ends_with(&ev(3, Some("T1"), "text_delta", json!({"text": "x"}))));
        assert!(t.ends_with(&ev(4, Some("T1"), "turn_done", json!({}))));
        // Queued: the earlier turn's end is not ours; the dequeued message is, by id or by text.
        let reply = json!({"pending": {"id": "01P", "text": "next"}, "queue": {"items": [{"id": "01P"}]}});
        let mut t = Target::from_reply(&reply, "next");
        assert!(t.queued);
        assert!(!t.ends_with(&ev(5, Some("T1"), "turn_done", json!({}))));
        assert!(!t.ends_with(&ev(6, Some("T2"), "message_created", user("01X", "other"))));
        assert!(!t.ends_with(&ev(7, Some("T2"), "turn_error", json!({}))));
        assert!(!t.ends_with(&ev(8, Some("T3"), "message_created", user("01Y", "next"))));
        assert!(t.ends_with(&ev(9, Some("T3"), "turn_error", json!({}))));
        let mut t = Target::from_reply(&reply, "next");
        assert!(!t.ends_with(&ev(10, Some("T4"), "turn_started", json!({"user_message_id": "01P"}))));
        assert!(t.ends_with(&ev(11, Some("T4"), "turn_done", json!({}))));
    }

    #[test]
    fn lists_and_conversations_read_at_a_glance() {
        let c = json!({
            "id": "01C", "agent_key": "claude_code", "title": "Fix the build", "message_count": 4,
            "archived": false, "turn_running": true, "pending_count": 2, "pending_paused": false,
            "last_message_ms": 1_796_031_096_000_i64, "updated_ms": 1, "created_ms": 1, "version": 3,
            "agent_config": {"cwd": "/w", "model": "", "session_id": ""}, "channel_name": null,
        });
        let t = render_conversations(std::slice::from_ref(&c), None);
        assert!(t.contains("01C  claude_code  4         running +2 queued  2026-11-30 09:31:36  Fix the build"), "{t}");
        let v = json!({
            "conversation": c, "more_before": true, "last_seq": 9,
            "messages": [
                {"role": "user", "source": "cli", "created_ms": 1_796_031_096_000_i64, "status": "complete", "usage": null, "model": null, "error": null,
                 "blocks": [{"type": "text", "text": "hi"}]},
                {"role": "assistant", "created_ms": 1_796_031_097_000_i64, "status": "interrupted", "model": "claude-x",
                 "usage": {"input_tokens": 3, "output_tokens": 1}, "error": null,
                 "blocks": [{"type": "text", "text": "Hel"}, {"type": "tool_use", "tool_use": {"name": "Read", "input": {"path": "a"}}}]},
            ],
            "pending": {"items": [{"id": "01P", "text": "then\nthis"}], "paused": true},
        });
        let s = render_view(&v);
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
            json!({"agent_key": "claude_code", "display_name": "Claude Code", "available": true, "command": "/usr/bin/claude", "version": "2.0.1", "reason": null}),
            json!({"agent_key": "codex", "display_name": "Codex", "available": false, "command": null, "version": null, "reason": "`codex` was not found on PATH"}),
        ]);
        assert!(a.contains("claude_code  Claude Code  yes        2.0.1    /usr/bin/claude"), "{a}");
        assert!(a.contains("codex        Codex        no         -        `codex` was not found on PATH"), "{a}");
        assert_eq!(
            sent_line(
                &json!({"pending": {"id": "b"}, "queue": {"items": [{"id": "a"}, {"id": "b"}], "paused": false}}),
                "01C"
            ),
            "Queued as #2 (a turn is running)\n"
        );
    }
}
