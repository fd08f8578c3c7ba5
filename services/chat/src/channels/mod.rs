//! Channels: IM chats (Telegram, SeaTalk) as one more screen of the same conversations
//! (`proto/store_channels.proto` holds the resources, `proto/channel.proto` is this side's RPC).
//!
//! Who does what, file by file:
//! - [`coordinator`]: the only thing that starts, stops or restarts an adapter. Each tick (the
//!   Channels change stream, a credential change, an adapter that ended) it diffs the enabled
//!   channel resources against the running adapters; it asks the supervisor to start
//!   `coffer-callback` when the first SeaTalk channel comes up and to stop it when the last goes
//!   down. REST, CLI and console only change the resource.
//! - [`bridge`]: the turn seam every adapter shares. An adapter turns each platform message into
//!   an [`Inbound`] and hands it to [`bridge::Bridge::handle`]; the bridge applies the owner gate
//!   (pairing, refusals), the commands (`/pair`, `/new`, `/model`, `/stop`, `/now`, `/status`,
//!   `/queue`, `/resume`, `/allow N`, `/always N`, `/deny N [message]`, `/mode`), and sends
//!   everything else to the bound conversation through the turn engine exactly as a web message
//!   is sent (source `channel:<name>`). It follows the bound conversation's event bus and hands
//!   each turn — whoever started it, the chat or the web page — to the adapter's [`Replier`] as a
//!   stream of [`TurnView`] snapshots; a turn that ran at least `chat.notify_after_s` is
//!   followed by a new one-line notice ([`notify`]: "Done in 4m12s"), since platforms do not
//!   notify edits. Each approval request and decision ([`ApprovalView`]) goes to
//!   [`Replier::approval`] at once (Telegram: a message with inline buttons, edited with the
//!   decision; SeaTalk: an interactive card with Allow / Deny / Always buttons, updated with the
//!   decision, or the text with the `/allow N` / `/deny N` commands in a group). A button press
//!   or card click goes to [`bridge::Bridge::answer`]: only the paired owner, only a conversation
//!   bound to that chat; the first answer from any surface wins. A Telegram photo or document
//!   and a SeaTalk image or file in a private chat go to [`bridge::Bridge::handle_files`] (the
//!   owner gate before any download).
//! - [`telegram`]: Bot API long polling, the offset persisted, one progress message edited at
//!   most once a second, 4,096-character splitting, Telegram-safe HTML.
//! - [`seatalk`]: events forwarded by `coffer-callback`, ack-then-final replies through the
//!   open platform's send-message API, approval cards updated in place, files sent to the bot
//!   downloaded, app access token cached, redeliveries dropped.
//!
//! Binding: a channel's chat is bound to the newest active conversation whose channel binding
//! is (channel name, chat id) (`ListConversations` with `channel_name` + `peer_chat_id`);
//! the first message from a chat with none creates one with the channel's default agent and
//! agent config; `/new` creates a fresh one, which becomes the bound conversation.
//!
//! `coordinator::AdaptersService` serves `coffer.channel.v1.ChannelAdapters`: `ListAdapters` (from
//! the status cells) to the gateway only, `DeliverSeatalkEvent` (into the named adapter's bounded
//! inbox) to coffer-callback only. After a restart `bridge::Bridge::resume` follows the owner's
//! chat again (an in-flight turn is replayed). The resources themselves (pairing, cursors, seen
//! events) are the store's `services/store/src/domain/channels.rs`; their REST side is described
//! in `docs/notes/rest.md`.
//!
//! Tests: `channels::bridge::*` (the real engine over the in-memory store of `tests.rs`),
//! `channels::telegram::*`, `channels::seatalk::tests::*`, `channels::coordinator::tests::*`,
//! `authz::tests::*`; the fakes `tests/src/fake_telegram.rs` (as Telegram, a newer `getUpdates`
//! ends a pending one with 409) and `tests/src/fake_seatalk.rs` (expiring and revocable tokens, the
//! send-message log, signed callbacks); e2e `channel_telegram::*`, `channel_seatalk::*`,
//! `channel_findings::*`.
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use coffer_proto::store::ChannelRecord;
use coffer_runtime::grpc::AuthChannel;
use futures_util::future::BoxFuture;
use secrecy::SecretString;
use tokio_util::sync::CancellationToken;

use crate::engine::Engine;

pub mod bridge;
pub mod coordinator;
pub mod notify;
pub mod seatalk;
pub mod telegram;

/// One message from an IM chat, normalised (a Telegram update, a SeaTalk event).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inbound {
    /// The channel resource's name.
    pub channel: String,
    /// The chat the conversation is bound to and replies go to: Telegram's chat id; SeaTalk's
    /// employee code for a single chat, the group id for a group mention.
    pub chat_id: String,
    /// Who sent it, as the owner gate compares it: Telegram's `from.id`; SeaTalk's employee
    /// code.
    pub sender_id: String,
    /// For people (username or name); never used for a decision.
    pub sender_display: String,
    /// The text, with the bot's own mention removed; 1 byte to 1 MiB after trimming (longer
    /// messages are refused with a notice).
    pub text: String,
    /// The platform's id of the message (logs, replies), or empty.
    pub message_id: String,
    /// A group chat (SeaTalk group mention, a Telegram group): replies go to `chat_id`.
    pub group: bool,
}

/// Where a turn is, as a channel shows it: the latest snapshot replaces the previous one (an
/// adapter that renders slowly skips the snapshots in between).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TurnView {
    /// The conversation's id and the turn's.
    pub conversation_id: String,
    pub turn_id: String,
    /// The assistant's text so far (markdown), every text block in order.
    pub text: String,
    /// The tools called so far, by name, in order (shown as progress, e.g. "⚙ Bash").
    pub tools: Vec<String>,
    /// Running, or how it ended.
    pub state: TurnState,
    /// How long the turn ran, ms: from its first event (`message_created`) to its end event.
    /// Set with the final snapshot when the end was seen on the bus; `None` while it runs and
    /// for an end the bridge made up (the conversation no longer followed, a missed end).
    pub elapsed_ms: Option<u64>,
}

/// How a turn stands.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum TurnState {
    /// Still streaming.
    #[default]
    Running,
    /// Finished normally (`stop_reason` as the engine reports it: `end_turn`, `max_tokens`, …).
    Done { stop_reason: String },
    /// Interrupted (`/stop`, the page's stop button): the partial text is kept.
    Interrupted,
    /// Failed: the engine's message, which names the cause.
    Failed { message: String },
}

impl TurnState {
    /// Whether the turn has ended (the last snapshot of its stream).
    pub fn is_final(&self) -> bool {
        !matches!(self, TurnState::Running)
    }
}

/// An agent's approval request (permission mode `ask`) as a channel shows it, waiting or
/// decided. `number` is the request's number in its conversation (what `/allow N` takes).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ApprovalView {
    pub conversation_id: String,
    pub number: u64,
    /// The tool (`Bash`, `Edit`, …); empty when the request itself was not seen.
    pub tool: String,
    /// One line: "Bash: rm -rf build".
    pub summary: String,
    /// What the owner judges, from the tool's input: the command, else the file path (empty:
    /// none found; the summary says it).
    pub detail: String,
    /// `None` while waiting for an answer.
    pub decided: Option<Decided>,
}

/// How an approval request was decided (`approval_resolved`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Decided {
    /// `allow` | `allow_always` | `deny`.
    pub decision: String,
    /// `web` | `cli` | `api` | `channel:<name>` | `timeout` | `interrupt` | `turn_ended`.
    pub decided_by: String,
    /// Who (a chat user id, a web session's label); empty: unknown.
    pub actor: String,
    /// What the agent was told (a deny's message); empty: nothing.
    pub message: String,
}

impl ApprovalView {
    /// "Bash `rm -rf build`" (markdown): the tool and what it would do.
    pub fn what_md(&self) -> String {
        let tool = if self.tool.is_empty() { "An action".to_owned() } else { self.tool.clone() };
        if self.detail.is_empty() {
            let rest = self.summary.strip_prefix(&format!("{}: ", self.tool)).unwrap_or(&self.summary);
            if rest.is_empty() || self.summary.is_empty() { tool } else { format!("{tool} `{}`", md_code(rest)) }
        } else {
            format!("{tool} `{}`", md_code(&self.detail))
        }
    }

    /// "Allowed", "Allowed always", "Denied" for the decision (empty while waiting).
    pub fn outcome(&self) -> &'static str {
        match self.decided.as_ref().map(|d| d.decision.as_str()) {
            Some("allow") => "Allowed",
            Some("allow_always") => "Allowed always",
            Some(_) => "Denied",
            None => "",
        }
    }

    /// Who decided, for people: "you in tg (user 1001)", "the web console", "the timeout".
    pub fn by_whom(&self) -> String {
        let Some(d) = &self.decided else { return String::new() };
        let actor = if d.actor.is_empty() { String::new() } else { format!(" ({})", d.actor) };
        match d.decided_by.as_str() {
            "web" => format!("the web console{actor}"),
            "cli" => format!("the CLI{actor}"),
            "api" => format!("the API{actor}"),
            "timeout" => "the timeout (no answer in time)".into(),
            "interrupt" => "the stop (the turn was interrupted)".into(),
            "turn_ended" => "the turn's end".into(),
            "read_only" => "the read-only mode".into(),
            other => match other.strip_prefix("channel:") {
                Some(name) if d.actor.is_empty() => format!("the channel {name}"),
                Some(name) => format!("user {} in {name}", d.actor),
                None => format!("{other}{actor}"),
            },
        }
    }
}

/// Text for inside a markdown code span: one line, at most 300 characters, backticks replaced.
fn md_code(s: &str) -> String {
    let line: String = s.replace('`', "'").replace(['\n', '\r'], " ");
    if line.chars().count() > 300 { format!("{}…", line.chars().take(300).collect::<String>()) } else { line }
}

/// A platform call that failed, classified for backoff. Messages never carry a token or secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChannelError {
    /// The platform asked to slow down (Telegram 429 `parameters.retry_after`); wait this long.
    #[error("rate limited by {platform}: retry after {retry_after_s} s")]
    RateLimited { platform: &'static str, retry_after_s: u64 },
    /// The credential was refused (Telegram 401/404 on the token, SeaTalk's token refused after
    /// one refresh): the adapter stops in `failed` until the resource or credential changes.
    #[error("{platform} refused the credential: {message}")]
    Auth { platform: &'static str, message: String },
    /// Another client holds the credential's one poller slot (Telegram answers `getUpdates` 409
    /// Conflict while another `getUpdates` or a webhook uses the bot token): the adapter shows
    /// `failed` naming the cause and tries again later, in case the other one goes away.
    #[error("{platform} refused to serve a second poller of this bot: {message}")]
    Conflict { platform: &'static str, message: String },
    /// The platform failed or could not be reached (5xx, timeout, connection refused): back off
    /// and retry.
    #[error("{platform} is unavailable: {message}")]
    Unavailable { platform: &'static str, message: String },
    /// The platform refused this request (400: e.g. a message Telegram cannot parse); not
    /// retried as is.
    #[error("{platform} refused the request: {message}")]
    Rejected { platform: &'static str, message: String },
    /// Coffer's side failed (store unavailable, engine error).
    #[error("{0}")]
    Internal(String),
}

/// How an adapter shows things in its chats. The bridge calls it for one chat at a time in
/// order (a second turn's stream starts after the first's final snapshot was rendered).
pub trait Replier: Send + Sync + 'static {
    /// A message that is not a turn's output: a command's answer, pairing, the refusal of a
    /// non-owner, a queued-message acknowledgement, an error. Plain text (no markup).
    fn notice<'a>(&'a self, chat_id: &'a str, text: &'a str) -> BoxFuture<'a, Result<(), ChannelError>>;

    /// Shows one turn: `views` yields snapshots until (and including) one whose state
    /// [`TurnState::is_final`]; the watch holds only the latest, so a slow renderer skips
    /// intermediate ones. Telegram edits one progress message at most once a second and then
    /// sends the final text split at 4,096 characters; SeaTalk sends a short acknowledgement
    /// at once and the final text at the end. Returns when the final snapshot is shown, or
    /// when `views` closes (the adapter is stopping: send nothing more).
    fn turn<'a>(
        &'a self,
        chat_id: &'a str,
        views: tokio::sync::watch::Receiver<TurnView>,
    ) -> BoxFuture<'a, Result<(), ChannelError>>;

    /// Shows an approval request (`view.decided` is `None`: a new message that notifies, with
    /// the way to answer) or its decision, whoever made it. Called in event order per chat, at
    /// once (not behind the turn being shown); a request may come again after a replay (the
    /// replier shows it once). The default, for platforms without buttons: the request as a
    /// notice with the `/allow N` / `/deny N` commands, a decision as a short notice unless this
    /// channel made it (its command was answered already).
    fn approval<'a>(
        &'a self,
        chat_id: &'a str,
        view: &'a ApprovalView,
        channel: &'a str,
    ) -> BoxFuture<'a, Result<(), ChannelError>> {
        Box::pin(async move {
            match &view.decided {
                None => self.notice(chat_id, &approval_request_text(view)).await,
                Some(d) if d.decided_by == format!("channel:{channel}") => Ok(()),
                Some(_) => self.notice(chat_id, &approval_decided_text(view)).await,
            }
        })
    }

    /// One file's diff of a turn (`/diff path`): `diff` is unified diff text (at most 256 KiB)
    /// or a sentence. By default a plain notice, cut at [`DIFF_NOTICE_CHARS`] characters;
    /// Telegram sends `<pre>` blocks.
    fn diff<'a>(&'a self, chat_id: &'a str, path: &'a str, diff: &'a str) -> BoxFuture<'a, Result<(), ChannelError>> {
        Box::pin(async move {
            let text = cut_diff(diff, DIFF_NOTICE_CHARS);
            self.notice(chat_id, &format!("{path}\n{text}")).await
        })
    }
}

/// A request as plain text with the commands that answer it.
pub fn approval_request_text(view: &ApprovalView) -> String {
    let n = view.number;
    format!(
        "Waiting for your approval: {} (#{n})\nAnswer with /allow {n}, /deny {n} [a message for the agent] or /always {n} (allow this tool for the rest of the conversation).",
        view.what_md()
    )
}

/// A decision as plain text: "Denied: Bash `rm -rf build` (#1042), by the web console."
pub fn approval_decided_text(view: &ApprovalView) -> String {
    let told = view.decided.as_ref().filter(|d| d.decision == "deny" && !d.message.is_empty());
    let told = told.map(|d| format!("\nThe agent was told: {}", d.message)).unwrap_or_default();
    format!("{}: {} (#{}), by {}.{told}", view.outcome(), view.what_md(), view.number, view.by_whom())
}

/// Most characters of a diff a plain-text channel shows.
pub const DIFF_NOTICE_CHARS: usize = 12_000;

/// `diff` cut at a line end within `max` characters, with a line saying how much was left out.
pub fn cut_diff(diff: &str, max: usize) -> String {
    if diff.chars().count() <= max {
        return diff.trim_end().to_owned();
    }
    let mut out = String::new();
    let mut n = 0;
    for line in diff.split_inclusive('\n') {
        let l = line.chars().count();
        if n + l > max {
            break;
        }
        out.push_str(line);
        n += l;
    }
    let left = diff.lines().count().saturating_sub(out.lines().count());
    out.push_str(&format!("… {left} more lines (the whole diff: the web console or `coffer chat diff`)"));
    out
}

/// What the coordinator gives an adapter it starts ([`telegram::spawn`], [`seatalk::spawn`]).
/// The adapter runs until `cancel` fires (the resource was disabled, changed or deleted, or the
/// service stops), then sends nothing more.
pub struct AdapterCtx {
    /// The channel resource as the coordinator read it (a change restarts the adapter).
    pub record: ChannelRecord,
    /// The channel's credentials, resolved by reference name (`bot_token_ref`, `app_id_ref`, …
    /// → value). Never logged, never in an error message.
    pub secrets: BTreeMap<String, SecretString>,
    /// The turn engine (the bridge's).
    pub engine: Arc<Engine>,
    /// The store (Channels: cursor, events, pairing; Audit; Conversations).
    pub store: AuthChannel,
    /// The adapter's live state, read by `ListAdapters`; the adapter keeps it current.
    pub status: Arc<StatusCell>,
    /// Fires when the coordinator stops the adapter.
    pub cancel: CancellationToken,
}

/// A running adapter, as the coordinator keeps it.
pub struct AdapterHandle {
    /// The adapter's task; it ends soon after `cancel` fires.
    pub task: tokio::task::JoinHandle<()>,
    /// SeaTalk: where `DeliverSeatalkEvent` puts the verified raw bodies for this channel
    /// (bounded; a full inbox answers UNAVAILABLE so the platform redelivers). `None` for
    /// Telegram.
    pub inbox: Option<tokio::sync::mpsc::Sender<Vec<u8>>>,
}

/// An adapter's live state (`proto/channel.proto` `AdapterStatus`), shared between the adapter
/// (writer) and `ListAdapters` (reader).
#[derive(Debug, Default)]
pub struct StatusCell(Mutex<coffer_proto::channel::AdapterStatus>);

impl StatusCell {
    /// A cell for `channel` of `kind` (`telegram` | `seatalk`), state `stopped`.
    pub fn new(channel: &str, kind: &str) -> Arc<Self> {
        Arc::new(Self(Mutex::new(coffer_proto::channel::AdapterStatus {
            channel: channel.to_owned(),
            kind: kind.to_owned(),
            state: "stopped".into(),
            ..Default::default()
        })))
    }

    /// Changes the state under the lock.
    pub fn update(&self, f: impl FnOnce(&mut coffer_proto::channel::AdapterStatus)) {
        f(&mut self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
    }

    /// A copy of the state.
    pub fn get(&self) -> coffer_proto::channel::AdapterStatus {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}
