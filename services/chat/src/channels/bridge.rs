//! The turn seam every channel adapter shares (see [`super`]): the owner gate, the commands,
//! and the bound conversation's turns handed to the adapter's [`super::Replier`].
//!
//! The public API below is the contract every adapter (Telegram, SeaTalk) codes against.
//!
//! - **Owner gate.** `/pair <code>` is heard from anyone (the store compares the code in
//!   constant time and, after five wrong tries from one sender, refuses that sender for the
//!   rest of the code — never anyone else); everything else is heard only from the
//!   owner (`sender_id` = the stored record's `owner_id`, read for each message so a pairing or
//!   an unpairing counts at once; the adapter's copy when the store does not answer). Anyone else is answered once per sender per bridge with a polite refusal, and
//!   that first refusal is audited (actor `channel`, action `channel.refused`, target the
//!   channel, the sender and chat ids; never the text).
//! - **Binding.** Each chat has at most one bound conversation: the one `/new` made, else the
//!   newest active conversation whose channel binding is (channel, chat), else one created on
//!   the first message with the channel's default agent and agent config.
//! - **Turns.** Per chat, one *folder* follows the bound conversation's bus and folds each turn
//!   (whoever started it) into [`TurnView`] snapshots on a watch; one *renderer* hands those
//!   watches to [`Replier::turn`] one at a time, in the order the turns began. `/new` retires
//!   the old folder after its in-flight turn, so nothing is shown out of order. Dropping the
//!   bridge aborts every folder and renderer: nothing more is sent.
//! - **Told when it finishes.** After a turn's final snapshot is shown, the renderer sends a
//!   new one-line notice ([`super::notify`]) when the turn ran at least `chat.notify_after_s`
//!   (read at its end, so a changed setting counts at once).
//! - **Send now.** `/now <text>` sends with `now` ([`Engine::send_now`]): the running turn is
//!   interrupted and the text runs next; `/stop` then a message redirects too (the message runs
//!   at once, what was queued waits for `/resume`).
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use coffer_proto::chat::{self as c, event::Kind};
use coffer_proto::store::{self as st, ChannelRecord};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::{ApprovalView, ChannelError, Decided, Inbound, Replier, TurnState, TurnView};
use crate::engine::Engine;
use crate::error::Error;

#[path = "bridge_import.rs"]
mod import;

/// The agent of a channel whose record names none.
pub const DEFAULT_AGENT: &str = "claude_code";
/// Senders remembered as refused per bridge (beyond it, a refusal is neither answered nor
/// audited again until the adapter restarts).
pub const MAX_REFUSED: usize = 10_000;
/// Longest pairing code accepted from a chat, bytes (the store's codes are 8 characters).
const MAX_CODE_BYTES: usize = 64;
/// Characters of each pending item `/queue` shows.
const QUEUE_PREVIEW_CHARS: usize = 80;

/// The commands' help (`/help`, `/start`).
pub const HELP: &str = "Coffer commands:\n\
/new — start a new conversation (/new N: in project N of /projects)\n\
/projects — folders to start a conversation in\n\
/sessions — your recent Claude Code and Codex sessions\n\
/import N — continue session N of /sessions here\n\
/model <id> — set the model of this conversation (/model alone shows it)\n\
/stop — interrupt the running turn (your next message runs at once)\n\
/now <text> — interrupt the running turn and run this next\n\
/status — agent, model, turn, queue, the approvals waiting for you\n\
/queue — the messages waiting to run\n\
/diff [path] — what the last turn changed, or one file's diff\n\
/resume — run the paused queue\n\
/pair <code> — make this chat the owner\n\
Anything else is sent to the agent.";

/// How an answer to an approval request from a chat went (the adapter says so: Telegram in
/// the callback query's answer, SeaTalk in a notice).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answered {
    /// Decided now, as asked.
    Decided(Decided),
    /// Decided before (another surface, the timeout, the turn's end): nothing changed.
    Already(Decided),
    /// The sender is not the channel's paired owner: nothing decided (audited once).
    NotOwner,
    /// No such waiting or recent request in this chat's conversation: the reason.
    NotFound(String),
    /// Refused or failed: the reason, for people.
    Failed(String),
}

/// The words a chat may use for a permission mode → the mode (`read-only` is `read_only`).
pub fn mode_word(word: &str) -> Option<&'static str> {
    match word.trim().to_ascii_lowercase().replace('-', "_").as_str() {
        "bypass" => Some("bypass"),
        "ask" => Some("ask"),
        "read_only" | "readonly" => Some("read_only"),
        _ => None,
    }
}

/// What each mode means, for `/mode`.
fn mode_help(mode: &str) -> &'static str {
    match mode {
        "ask" => "actions that are not read-only wait for your /allow or /deny",
        "read_only" => "actions that are not read-only are refused",
        _ => "the agent acts without asking",
    }
}

/// One agent setting of a chat's bound conversation, as `/mode` and `/model` show and set it
/// ([`Bridge::bound_field`]).
struct BoundField {
    /// The reply showing the setting, from the conversation's agent config.
    show: fn(&c::AgentConfig) -> String,
    /// The update setting it to the command's argument (conversation id, argument), or the
    /// reply refusing the argument.
    set: fn(String, &str) -> Result<c::UpdateConversationRequest, String>,
    /// The reply once set, from the updated conversation's agent config.
    done: fn(&c::AgentConfig) -> String,
}

/// One channel's bridge: created by the coordinator when it starts the channel's adapter,
/// dropped (every follower task with it) when it stops it.
pub struct Bridge {
    engine: Arc<Engine>,
    replier: Arc<dyn Replier>,
    /// Held for the whole of [`Bridge::handle`]: messages apply one at a time, in order.
    state: tokio::sync::Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Senders already answered with a refusal.
    refused: HashSet<String>,
    /// Senders already told their `/pair` cannot succeed (no code waiting, expired, used).
    pair_refused: HashSet<String>,
    /// Chats already told that a message of theirs could not be read (not text).
    told_unsupported: HashSet<String>,
    /// The owner paired through this bridge (newer than the record the adapter holds).
    owner: Option<String>,
    /// The channel's name (from the record of the last call; the approvals' source).
    channel: String,
    chats: HashMap<String, Chat>,
    /// The lists `/sessions` and `/projects` last showed, per chat.
    picks: HashMap<String, import::Picks>,
}

/// One chat's binding and its turn display.
struct Chat {
    /// The bound conversation (empty: not resolved yet).
    conversation: String,
    /// To the renderer: one watch per turn, in the order the turns began (and the notices that
    /// follow a turn, such as its changed files).
    turns: mpsc::UnboundedSender<Show>,
    renderer: JoinHandle<()>,
    /// To the approval shower: requests and decisions, in event order (not behind the turn
    /// being rendered: a turn waits for its approvals).
    approvals: mpsc::UnboundedSender<ApprovalView>,
    approver: JoinHandle<()>,
    folder: Option<Folder>,
}

/// The task following one conversation's bus for a chat.
struct Folder {
    conversation: String,
    /// Asks it to end once no turn is in flight (the chat was bound to another conversation).
    retire: CancellationToken,
    task: JoinHandle<()>,
}

impl Drop for Bridge {
    fn drop(&mut self) {
        for chat in self.state.get_mut().chats.values() {
            chat.renderer.abort();
            chat.approver.abort();
            if let Some(f) = &chat.folder {
                f.task.abort();
            }
        }
    }
}

/// A command word and its argument: `/model@my_bot  opus` → `("model", "opus")`.
fn command(text: &str) -> Option<(String, &str)> {
    let rest = text.strip_prefix('/')?;
    let (word, arg) = match rest.find(char::is_whitespace) {
        Some(i) => (&rest[..i], rest[i..].trim()),
        None => (rest, ""),
    };
    let word = word.split('@').next().unwrap_or_default();
    if word.is_empty() || !word.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        return None;
    }
    Some((word.to_ascii_lowercase(), arg))
}

/// What a chat is told when the engine refused something: the caller's errors as the engine
/// words them (they name the field and limit), the rest as "try again".
fn say(e: &Error) -> String {
    match e {
        Error::Invalid(m)
        | Error::NotFound(m)
        | Error::Precondition(m)
        | Error::Aborted(m)
        | Error::Exhausted(m)
        | Error::AlreadyDecided(m, _) => m.clone(),
        Error::AlreadyExists(m) => m.clone(),
        Error::Store(_) | Error::Internal(_) => {
            "Coffer could not do that right now (see logs/chat.log); try again.".to_owned()
        }
    }
}

/// Whether the error is Coffer's own (reported to the adapter's status), not the chat's.
fn internal(e: &Error) -> Option<ChannelError> {
    matches!(e, Error::Store(_) | Error::Internal(_)).then(|| ChannelError::Internal(e.to_string()))
}

/// The `/status` lines of the approval requests waiting for an answer: how many, then one line
/// each with its number, summary and the commands that answer it; "" when none waits.
fn waiting_approvals(open: &[c::Approval]) -> String {
    if open.is_empty() {
        return String::new();
    }
    let mut out = format!("\nWaiting for your approval: {}", open.len());
    for a in open {
        let n = a.number;
        out.push_str(&format!(
            "\n#{n} {} — /allow {n} · /always {n} · /deny {n} [why]",
            cut_chars(&a.summary, QUEUE_PREVIEW_CHARS)
        ));
    }
    out
}

/// The text of a final message: its text blocks, a blank line between blocks that a tool call
/// separated.
fn message_text(m: &c::Message) -> String {
    let texts: Vec<&str> = m
        .blocks
        .iter()
        .filter_map(|b| match &b.block {
            Some(c::content_block::Block::Text(t)) if !t.trim().is_empty() => Some(t.as_str()),
            _ => None,
        })
        .collect();
    texts.join("\n\n")
}

fn cut_chars(s: &str, n: usize) -> String {
    let line = s.lines().next().unwrap_or_default();
    if line.chars().count() <= n && !s.contains('\n') {
        return line.to_owned();
    }
    format!("{}…", line.chars().take(n).collect::<String>())
}

impl Bridge {
    /// A bridge for one channel whose output goes to `replier`.
    pub fn new(engine: Arc<Engine>, replier: Arc<dyn Replier>) -> Arc<Self> {
        Arc::new(Self { engine, replier, state: tokio::sync::Mutex::new(State::default()) })
    }

    /// Follows the turns of the conversations bound to the owner's chat (an adapter calls it
    /// once after it started, so turns started from the web page show in the chat before the
    /// chat says anything). Does nothing for an unpaired channel.
    ///
    /// # Errors
    /// [`ChannelError::Internal`] when the store does not answer.
    pub async fn resume(&self, channel: &ChannelRecord) -> Result<(), ChannelError> {
        let mut st = self.state.lock().await;
        st.channel.clone_from(&channel.name);
        let owner = self.owner(&st, channel).await;
        if owner.is_empty() {
            return Ok(());
        }
        match self.lookup(channel, &owner).await {
            Ok(Some(conv)) => {
                self.follow(&mut st, &owner, &conv).await.map_err(|e| ChannelError::Internal(e.to_string()))
            }
            Ok(None) => Ok(()),
            Err(e) => Err(ChannelError::Internal(e.to_string())),
        }
    }

    /// Handles one inbound message of `channel` (the resource as the adapter last read it):
    /// the owner gate, a command, or a message for the bound conversation. Returns once the
    /// message is accepted (a turn started or queued, a command answered); the turn's output
    /// goes to the replier on its own. Errors are answered to the chat as a notice and logged;
    /// the returned error is for the adapter's status only.
    pub async fn handle(&self, channel: &ChannelRecord, msg: Inbound) -> Result<(), ChannelError> {
        let mut st = self.state.lock().await;
        st.channel.clone_from(&channel.name);
        let text = msg.text.trim();
        let cmd = command(text);
        if let Some(("pair", code)) = cmd.as_ref().map(|(w, a)| (w.as_str(), *a)) {
            return self.pair(&mut st, channel, &msg, code).await;
        }
        let owner = self.owner(&st, channel).await;
        if owner.is_empty() || owner != msg.sender_id {
            let unpaired = owner.is_empty();
            return self.refuse(&mut st, channel, &msg, unpaired).await;
        }
        if text.is_empty() {
            return Ok(());
        }
        let (word, arg) = match &cmd {
            Some((w, a)) => (w.as_str(), *a),
            None => ("", ""),
        };
        let chat = msg.chat_id.as_str();
        let result = match word {
            "help" | "start" => return self.replier.notice(chat, HELP).await,
            "new" => self.new_conversation(&mut st, channel, chat, arg).await,
            "sessions" => self.sessions(&mut st, chat).await,
            "import" => self.import(&mut st, channel, chat, arg).await,
            "projects" => self.projects(&mut st, chat).await,
            "model" => self.model(&mut st, channel, chat, arg).await,
            "stop" => self.stop(&mut st, channel, chat).await,
            "now" if arg.is_empty() => {
                let m = "Send /now followed by your message: it interrupts the running turn and runs next.";
                return self.replier.notice(chat, m).await;
            }
            "now" => self.send(&mut st, channel, chat, arg, true).await,
            "status" => self.status(&mut st, channel, chat).await,
            "queue" => self.queue(&mut st, channel, chat).await,
            "resume" => self.resume_queue(&mut st, channel, chat).await,
            "allow" | "deny" | "always" => self.answer_command(&mut st, channel, &msg, word, arg).await,
            "mode" => self.mode(&mut st, channel, chat, arg).await,
            "diff" => self.diff(&mut st, channel, chat, arg).await,
            _ => self.send(&mut st, channel, chat, text, false).await,
        };
        match result {
            Ok(Some(notice)) => self.replier.notice(chat, &notice).await,
            Ok(None) => Ok(()),
            Err(e) => {
                tracing::warn!(channel = %channel.name, error = %e, "A channel message was not handled.");
                self.replier.notice(chat, &say(&e)).await?;
                internal(&e).map_or(Ok(()), Err)
            }
        }
    }

    /// A message the adapter cannot run (a photo, a sticker, an edit…): anyone but the owner is
    /// refused as for text; the owner's chat is told `note` once per bridge (later ones are
    /// dropped quietly, so a burst of photos is one answer).
    pub async fn unsupported(&self, channel: &ChannelRecord, msg: Inbound, note: &str) -> Result<(), ChannelError> {
        let mut st = self.state.lock().await;
        let owner = self.owner(&st, channel).await;
        if owner.is_empty() || owner != msg.sender_id {
            let unpaired = owner.is_empty();
            return self.refuse(&mut st, channel, &msg, unpaired).await;
        }
        if st.told_unsupported.len() >= MAX_REFUSED || !st.told_unsupported.insert(msg.chat_id.clone()) {
            tracing::debug!(channel = %channel.name, "Another non-text message; not answered again.");
            return Ok(());
        }
        self.replier.notice(&msg.chat_id, note).await
    }

    /// A message with files (a Telegram photo or document): the owner gate as for text, then
    /// `fetch` (the adapter's download, run only for the owner) and the files sent with the
    /// message's text (its caption) to the bound conversation. A fetch that fails or refuses
    /// (over the size limit) is told to the chat and nothing reaches the agent.
    pub async fn handle_files(
        &self,
        channel: &ChannelRecord,
        msg: Inbound,
        fetch: futures_util::future::BoxFuture<'_, Result<Vec<c::AttachmentUpload>, String>>,
    ) -> Result<(), ChannelError> {
        let mut st = self.state.lock().await;
        let owner = self.owner(&st, channel).await;
        if owner.is_empty() || owner != msg.sender_id {
            let unpaired = owner.is_empty();
            return self.refuse(&mut st, channel, &msg, unpaired).await;
        }
        let chat = msg.chat_id.as_str();
        let files = match fetch.await {
            Ok(f) => f,
            Err(why) => return self.replier.notice(chat, &why).await,
        };
        match self.send_files(&mut st, channel, chat, msg.text.trim(), files).await {
            Ok(Some(notice)) => self.replier.notice(chat, &notice).await,
            Ok(None) => Ok(()),
            Err(e) => {
                tracing::warn!(channel = %channel.name, error = %e, "A channel message with files was not handled.");
                self.replier.notice(chat, &say(&e)).await?;
                internal(&e).map_or(Ok(()), Err)
            }
        }
    }

    /// The owner now: the store's record (a pairing or an unpairing since the adapter started
    /// counts at once, without a restart); when the store does not answer, the owner this
    /// bridge paired or the adapter's record says.
    async fn owner(&self, st: &State, channel: &ChannelRecord) -> String {
        let mut client = coffer_proto::store::channels_client::ChannelsClient::new(self.engine.store().channel());
        match client.get_channel(st::GetChannelRequest { name: channel.name.clone() }).await {
            Ok(r) => r.into_inner().owner_id,
            Err(s) => {
                tracing::warn!(channel = %channel.name, code = %s.code(), "Cannot read the channel's owner; using the last known.");
                st.owner.clone().unwrap_or_else(|| channel.owner_id.clone())
            }
        }
    }

    /// `/pair <code>`: the store's claim.
    async fn pair(
        &self,
        st: &mut State,
        channel: &ChannelRecord,
        msg: &Inbound,
        code: &str,
    ) -> Result<(), ChannelError> {
        let chat = msg.chat_id.as_str();
        if code.is_empty() || code.len() > MAX_CODE_BYTES {
            let m = "Send /pair followed by the code `coffer channel pair` showed.";
            return self.replier.notice(chat, m).await;
        }
        let mut client = coffer_proto::store::channels_client::ChannelsClient::new(self.engine.store().channel());
        let claim = st::ClaimPairingRequest {
            name: channel.name.clone(),
            code: code.to_owned(),
            owner_id: msg.sender_id.clone(),
            owner_display: msg.sender_display.clone(),
        };
        match client.claim_pairing(claim).await {
            Ok(reply) => {
                let reply = reply.into_inner();
                if reply.paired {
                    st.owner = Some(msg.sender_id.clone());
                    st.refused.remove(&msg.sender_id);
                    st.pair_refused.remove(&msg.sender_id);
                    tracing::info!(channel = %channel.name, "A chat paired as the channel's owner.");
                    let m = "Paired — this chat now drives Coffer. Send a message to start; /help lists the commands.";
                    self.replier.notice(chat, m).await
                } else if reply.tries_left == 0 {
                    let m = "Wrong code, and no tries left for this chat: run `coffer channel pair` for a new code.";
                    self.replier.notice(chat, m).await
                } else {
                    let m = format!("Wrong code: {} tries left.", reply.tries_left);
                    self.replier.notice(chat, &m).await
                }
            }
            Err(s) if s.code() == tonic::Code::FailedPrecondition => {
                // No code pending, or it expired or was used, or this sender used up its tries:
                // said once per sender per run (a
                // stranger repeating `/pair` gets one answer, like any other refusal), and
                // without the channel's name or the store's words.
                tracing::info!(channel = %channel.name, reason = %s.message(), "A pairing claim was refused.");
                if !st.pair_refused.insert(msg.sender_id.clone()) {
                    return Ok(());
                }
                let m = "Pairing failed: no code is waiting, or it expired or was used. \
                         Run `coffer channel pair` on the computer for a new one.";
                self.replier.notice(chat, m).await
            }
            Err(s) => {
                tracing::warn!(channel = %channel.name, code = %s.code(), error = %s.message(), "Cannot claim a pairing.");
                self.replier.notice(chat, "Pairing is unavailable right now; try again.").await?;
                Err(ChannelError::Internal(format!("the store answered {}: {}", s.code(), s.message())))
            }
        }
    }

    /// Answers approval request `number` of `conversation` for `msg`'s sender (a Telegram
    /// button press): only the paired owner, and only for a conversation bound to `msg`'s chat
    /// on this channel. Source `channel:<name>`, actor the sender's id. The first answer from
    /// any surface wins.
    pub async fn answer(
        &self,
        channel: &ChannelRecord,
        msg: &Inbound,
        conversation: &str,
        number: u64,
        decision: &str,
        message: &str,
    ) -> Answered {
        let mut st = self.state.lock().await;
        st.channel.clone_from(&channel.name);
        let owner = self.owner(&st, channel).await;
        if owner.is_empty() || owner != msg.sender_id || msg.group {
            self.audit_refusal(&mut st, channel, msg, owner.is_empty()).await;
            return Answered::NotOwner;
        }
        match self.engine.store().get(conversation).await {
            Ok(r) if r.channel_name == channel.name && r.peer_chat_id == msg.chat_id => {}
            Ok(_) | Err(Error::NotFound(_)) => {
                return Answered::NotFound("that conversation is not this chat's".into());
            }
            Err(e) => return Answered::Failed(say(&e)),
        }
        self.decide(channel, msg, conversation, number, decision, message).await
    }

    /// `engine.answer_approval` with this channel as the source, the outcome classified.
    async fn decide(
        &self,
        channel: &ChannelRecord,
        msg: &Inbound,
        conversation: &str,
        number: u64,
        decision: &str,
        message: &str,
    ) -> Answered {
        let req = c::AnswerApprovalRequest {
            conversation_id: conversation.to_owned(),
            number,
            decision: decision.to_owned(),
            message: message.to_owned(),
            source: format!("channel:{}", channel.name),
            actor: msg.sender_id.clone(),
        };
        let decided = |r: c::ApprovalResolved| Decided {
            decision: r.decision,
            decided_by: r.decided_by,
            actor: r.actor,
            message: r.message,
        };
        match self.engine.answer_approval(req).await {
            Ok(r) => {
                tracing::info!(channel = %channel.name, number, decision, "An approval was answered from a chat.");
                Answered::Decided(decided(r))
            }
            Err(Error::AlreadyDecided(_, first)) => Answered::Already(decided(*first)),
            Err(Error::NotFound(m)) => Answered::NotFound(m),
            Err(e) => {
                tracing::warn!(channel = %channel.name, number, error = %e, "An approval answer was refused.");
                Answered::Failed(say(&e))
            }
        }
    }

    /// `/allow N`, `/always N`, `/deny N [message]` in the bound conversation (`N` may be left
    /// out when exactly one request waits).
    async fn answer_command(
        &self,
        st: &mut State,
        channel: &ChannelRecord,
        msg: &Inbound,
        word: &str,
        arg: &str,
    ) -> crate::error::Result<Option<String>> {
        let chat = msg.chat_id.as_str();
        let Some(id) = self.bound(st, channel, chat, false).await? else {
            return Ok(Some("No conversation yet: nothing waits for an answer.".into()));
        };
        let (first, rest) = match arg.find(char::is_whitespace) {
            Some(i) => (&arg[..i], arg[i..].trim()),
            None => (arg, ""),
        };
        let (number, message) = match first.trim_start_matches('#').parse::<u64>() {
            Ok(n) => (n, rest),
            Err(_) => {
                let open = self.engine.approvals(&*self.engine.conv(&id).await?);
                match open.as_slice() {
                    [] => return Ok(Some("Nothing waits for your answer.".into())),
                    [one] => (one.number, arg),
                    many => {
                        let list: Vec<String> = many
                            .iter()
                            .map(|a| format!("#{} {}", a.number, cut_chars(&a.summary, QUEUE_PREVIEW_CHARS)))
                            .collect();
                        return Ok(Some(format!(
                            "{} requests wait; say which: /{word} N\n{}",
                            many.len(),
                            list.join("\n")
                        )));
                    }
                }
            }
        };
        let decision = match word {
            "allow" => "allow",
            "always" => "allow_always",
            _ => "deny",
        };
        let message = if decision == "deny" { message } else { "" };
        Ok(Some(match self.decide(channel, msg, &id, number, decision, message).await {
            Answered::Decided(d) => {
                let view = ApprovalView { number, decided: Some(d), ..Default::default() };
                format!("{} #{number}.", view.outcome())
            }
            Answered::Already(d) => {
                let view = ApprovalView { number, decided: Some(d), ..Default::default() };
                format!("#{number} was already decided: {} by {}.", view.outcome().to_lowercase(), view.by_whom())
            }
            Answered::NotFound(m) | Answered::Failed(m) => m,
            Answered::NotOwner => "Sorry — this bot only answers its owner.".into(),
        }))
    }

    /// `/mode` shows the bound conversation's permission mode; `/mode ask` (bypass,
    /// read-only) sets it from the next turn.
    async fn mode(
        &self,
        st: &mut State,
        channel: &ChannelRecord,
        chat: &str,
        arg: &str,
    ) -> crate::error::Result<Option<String>> {
        let field = BoundField {
            show: |cfg| {
                let mode = &cfg.permission_mode;
                format!(
                    "Mode: {mode} ({}). Send /mode bypass, /mode ask or /mode read-only to change it.",
                    mode_help(mode)
                )
            },
            set: |id, arg| match mode_word(arg) {
                Some(mode) => Ok(c::UpdateConversationRequest {
                    id,
                    permission_mode: Some(mode.to_owned()),
                    ..Default::default()
                }),
                None => Err(format!("Unknown mode {arg:?}: send /mode bypass, /mode ask or /mode read-only.")),
            },
            done: |cfg| {
                let mode = &cfg.permission_mode;
                format!("Mode set to {mode} for this conversation, from the next turn: {}.", mode_help(mode))
            },
        };
        self.bound_field(st, channel, chat, arg, field).await
    }

    /// `/mode` and `/model`: the bound conversation's agent setting `field`, shown when `arg`
    /// is empty, else set (from the next turn). `None` when the chat has no conversation.
    ///
    /// # Errors
    /// The engine's (an invalid value, the store).
    async fn bound_field(
        &self,
        st: &mut State,
        channel: &ChannelRecord,
        chat: &str,
        arg: &str,
        field: BoundField,
    ) -> crate::error::Result<Option<String>> {
        let Some(id) = self.bound(st, channel, chat, true).await? else { return Ok(None) };
        if arg.is_empty() {
            let record = self.engine.store().get(&id).await?;
            let cfg = self.engine.view(&record).agent_config.unwrap_or_default();
            return Ok(Some((field.show)(&cfg)));
        }
        let req = match (field.set)(id, arg) {
            Ok(req) => req,
            Err(refusal) => return Ok(Some(refusal)),
        };
        let conv = self.engine.update_conversation(req).await?;
        Ok(Some((field.done)(&conv.agent_config.unwrap_or_default())))
    }

    /// Audits a refused sender once per bridge (without the text); true the first time.
    async fn audit_refusal(&self, st: &mut State, channel: &ChannelRecord, msg: &Inbound, unpaired: bool) -> bool {
        if st.refused.contains(&msg.sender_id) || st.refused.len() >= MAX_REFUSED {
            tracing::debug!(channel = %channel.name, "A refused sender wrote again.");
            return false;
        }
        st.refused.insert(msg.sender_id.clone());
        let detail = serde_json::json!({
            "sender_id": msg.sender_id,
            "chat_id": msg.chat_id,
            "kind": channel.kind().as_str(),
            "reason": if unpaired { "unpaired" } else { "not_owner" },
        });
        let entry = st::AuditEntry {
            actor: "channel".into(),
            action: "channel.refused".into(),
            target: channel.name.clone(),
            outcome: st::AuditOutcome::Error as i32,
            detail: detail.to_string(),
            ..Default::default()
        };
        if let Err(e) = self.engine.store().audit(entry).await {
            tracing::warn!(channel = %channel.name, error = %e, "Cannot audit a refused channel message.");
        }
        true
    }

    /// Anyone but the owner: one polite refusal per sender, audited without the text.
    async fn refuse(
        &self,
        st: &mut State,
        channel: &ChannelRecord,
        msg: &Inbound,
        unpaired: bool,
    ) -> Result<(), ChannelError> {
        if !self.audit_refusal(st, channel, msg, unpaired).await {
            return Ok(());
        }
        let m = if unpaired {
            "Sorry — this bot is not paired yet. Its owner pairs it by running `coffer channel pair` and sending /pair <code> here."
        } else {
            "Sorry — this bot only answers its owner."
        };
        self.replier.notice(&msg.chat_id, m).await
    }

    /// The newest active conversation bound to (channel, chat), if any.
    async fn lookup(&self, channel: &ChannelRecord, chat: &str) -> crate::error::Result<Option<String>> {
        let page = self
            .engine
            .store()
            .list(st::ListConversationsRequest {
                archived: st::ArchivedFilter::Active as i32,
                channel_name: channel.name.clone(),
                peer_chat_id: chat.to_owned(),
                limit: 1,
                ..Default::default()
            })
            .await?;
        Ok(page.conversations.into_iter().next().map(|r| r.id))
    }

    /// A new conversation of the channel's default agent and agent config (its cwd, model and
    /// default permission mode), bound to `chat`.
    async fn create(&self, channel: &ChannelRecord, chat: &str) -> crate::error::Result<c::Conversation> {
        self.create_in(channel, chat, None).await
    }

    /// [`Bridge::create`] in `cwd` instead of the channel's default folder, when given.
    async fn create_in(
        &self,
        channel: &ChannelRecord,
        chat: &str,
        cwd: Option<String>,
    ) -> crate::error::Result<c::Conversation> {
        let agent_key =
            if channel.default_agent.is_empty() { DEFAULT_AGENT.to_owned() } else { channel.default_agent.clone() };
        let mut given = if channel.agent_config_json.trim().is_empty() {
            crate::adapter::AgentConfig::default()
        } else {
            crate::persist::parse_config(&channel.agent_config_json)
        };
        // The channel's own default mode (its agent config's `permission_mode`); absent: the
        // agent's default.
        let mode = serde_json::from_str::<serde_json::Value>(&channel.agent_config_json)
            .ok()
            .and_then(|v| v.get("permission_mode")?.as_str().map(str::to_owned))
            .unwrap_or_default();
        if let Some(cwd) = cwd {
            given.cwd = cwd;
        }
        let req = c::CreateConversationRequest {
            agent_key,
            agent_config: Some(c::AgentConfig {
                cwd: given.cwd,
                model: given.model,
                session_id: String::new(),
                permission_mode: mode,
            }),
            channel_name: channel.name.clone(),
            peer_chat_id: chat.to_owned(),
            ..Default::default()
        };
        self.engine.create_conversation(req).await
    }

    /// The bound conversation of `chat` (created when `create` and there is none), followed.
    async fn bound(
        &self,
        st: &mut State,
        channel: &ChannelRecord,
        chat: &str,
        create: bool,
    ) -> crate::error::Result<Option<String>> {
        if let Some(c) = st.chats.get(chat).filter(|c| !c.conversation.is_empty()) {
            return Ok(Some(c.conversation.clone()));
        }
        let id = match self.lookup(channel, chat).await? {
            Some(id) => id,
            None if create => self.create(channel, chat).await?.id,
            None => return Ok(None),
        };
        self.follow(st, chat, &id).await?;
        Ok(Some(id))
    }

    /// Binds `chat` to `conversation` and follows its turns (a folder already following it is
    /// kept; one following another conversation is retired after its in-flight turn).
    async fn follow(&self, st: &mut State, chat: &str, conversation: &str) -> crate::error::Result<()> {
        let name = st.channel.clone();
        let entry = st.chats.entry(chat.to_owned()).or_insert_with(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            let renderer = tokio::spawn(render(self.engine.clone(), self.replier.clone(), chat.to_owned(), rx));
            let (atx, arx) = mpsc::unbounded_channel();
            let approver = tokio::spawn(show_approvals(self.replier.clone(), chat.to_owned(), name, arx));
            Chat { conversation: String::new(), turns: tx, renderer, approvals: atx, approver, folder: None }
        });
        entry.conversation = conversation.to_owned();
        if entry.folder.as_ref().is_some_and(|f| f.conversation == conversation && !f.task.is_finished()) {
            return Ok(());
        }
        if let Some(old) = entry.folder.take() {
            old.retire.cancel();
        }
        // Subscribed before this returns, so a turn started right after is not missed.
        let sub = self.engine.subscribe(conversation, 0).await?;
        let retire = CancellationToken::new();
        let task = tokio::spawn(fold(
            self.engine.clone(),
            conversation.to_owned(),
            sub,
            entry.turns.clone(),
            entry.approvals.clone(),
            retire.clone(),
        ));
        entry.folder = Some(Folder { conversation: conversation.to_owned(), retire, task });
        Ok(())
    }

    async fn new_conversation(
        &self,
        st: &mut State,
        channel: &ChannelRecord,
        chat: &str,
        arg: &str,
    ) -> crate::error::Result<Option<String>> {
        let cwd = self.project_arg(st, chat, arg).await?;
        let in_project = cwd.is_some();
        let conv = self.create_in(channel, chat, cwd).await?;
        self.follow(st, chat, &conv.id).await?;
        let cfg = conv.agent_config.unwrap_or_default();
        let model = if cfg.model.is_empty() { "the agent's default".to_owned() } else { cfg.model };
        let folder = if in_project { format!(" in {}", cfg.cwd) } else { String::new() };
        Ok(Some(format!("New conversation with {}{folder} (model: {model}). Send a message to start.", conv.agent_key)))
    }

    /// `/model` shows the bound conversation's model; `/model ID` sets it from the next turn.
    async fn model(
        &self,
        st: &mut State,
        channel: &ChannelRecord,
        chat: &str,
        arg: &str,
    ) -> crate::error::Result<Option<String>> {
        let field = BoundField {
            show: |cfg| {
                let model = if cfg.model.is_empty() { "the agent's default" } else { &cfg.model };
                format!("Model: {model}. Send /model <id> to change it.")
            },
            set: |id, arg| Ok(c::UpdateConversationRequest { id, model: Some(arg.to_owned()), ..Default::default() }),
            done: |cfg| format!("Model set to {} for this conversation (from the next turn).", cfg.model),
        };
        self.bound_field(st, channel, chat, arg, field).await
    }

    async fn stop(&self, st: &mut State, channel: &ChannelRecord, chat: &str) -> crate::error::Result<Option<String>> {
        let Some(id) = self.bound(st, channel, chat, false).await? else {
            return Ok(Some("Nothing is running.".into()));
        };
        let stopped = self.engine.interrupt(&id).await?;
        if !stopped {
            return Ok(Some("Nothing is running.".into()));
        }
        let waiting = self.engine.pending(&*self.engine.conv(&id).await?).await.items.len();
        Ok(Some(match waiting {
            0 => "Stopped. Your next message runs at once.".into(),
            n => format!(
                "Stopped. Your next message runs at once; {n} queued wait{}: /resume runs them, /queue shows them.",
                if n == 1 { "s" } else { "" }
            ),
        }))
    }

    async fn status(
        &self,
        st: &mut State,
        channel: &ChannelRecord,
        chat: &str,
    ) -> crate::error::Result<Option<String>> {
        let Some(id) = self.bound(st, channel, chat, false).await? else {
            return Ok(Some("No conversation yet: send a message to start one.".into()));
        };
        let record = self.engine.store().get(&id).await?;
        let view = self.engine.view(&record);
        let cfg = view.agent_config.unwrap_or_default();
        let model = if cfg.model.is_empty() { "the agent's default".to_owned() } else { cfg.model };
        let title = if view.title.is_empty() { "(untitled)".to_owned() } else { view.title };
        let turn = if view.turn_running { "running" } else { "idle" };
        let paused = if view.pending_paused { " (paused)" } else { "" };
        let mut out = format!(
            "Conversation: {title}\nAgent: {}\nModel: {model}\nTurn: {turn}\nQueue: {}{paused}",
            view.agent_key, view.pending_count
        );
        let conv = self.engine.conv(&id).await?;
        out.push_str(&waiting_approvals(&self.engine.approvals(&conv)));
        let always: Vec<String> = self.engine.allowed_tools(&conv).into_iter().map(|t| t.tool).collect();
        if !always.is_empty() {
            out.push_str(&format!("\nAllowed always: {}", always.join(", ")));
        }
        Ok(Some(out))
    }

    async fn queue(&self, st: &mut State, channel: &ChannelRecord, chat: &str) -> crate::error::Result<Option<String>> {
        let Some(id) = self.bound(st, channel, chat, false).await? else {
            return Ok(Some("The queue is empty.".into()));
        };
        let q = self.engine.pending(&*self.engine.conv(&id).await?).await;
        if q.items.is_empty() {
            return Ok(Some(if q.paused { "The queue is empty (paused)." } else { "The queue is empty." }.into()));
        }
        let mut out = format!("Queue{}:", if q.paused { " (paused: /resume runs it)" } else { "" });
        for (i, it) in q.items.iter().enumerate() {
            out.push_str(&format!("\n{}. {}", i + 1, cut_chars(&it.text, QUEUE_PREVIEW_CHARS)));
        }
        Ok(Some(out))
    }

    async fn resume_queue(
        &self,
        st: &mut State,
        channel: &ChannelRecord,
        chat: &str,
    ) -> crate::error::Result<Option<String>> {
        let Some(id) = self.bound(st, channel, chat, false).await? else {
            return Ok(Some("Nothing to resume.".into()));
        };
        let q = self.engine.pending(&*self.engine.conv(&id).await?).await;
        if !q.paused {
            return Ok(Some(if q.items.is_empty() { "Nothing to resume." } else { "The queue is running." }.into()));
        }
        let n = q.items.len();
        self.engine.set_pending(&id, q.items, false).await?;
        Ok(Some(if n == 0 { "Resumed (the queue is empty).".into() } else { format!("Resumed: {n} queued.") }))
    }

    /// `/diff [path]`: the files the bound conversation's last turn that changed any changed
    /// (no path), or one file's diff of that turn sent through [`Replier::diff`].
    async fn diff(
        &self,
        st: &mut State,
        channel: &ChannelRecord,
        chat: &str,
        path: &str,
    ) -> crate::error::Result<Option<String>> {
        let none = || Ok(Some("No turn has changed files yet.".to_owned()));
        let Some(id) = self.bound(st, channel, chat, false).await? else { return none() };
        let page = self
            .engine
            .store()
            .messages(st::ListMessagesRequest {
                conversation_id: id.clone(),
                limit: 50,
                newest: true,
                ..Default::default()
            })
            .await?;
        let Some((message_id, changed)) = page.messages.iter().rev().find_map(|m| {
            crate::changes::from_json(&m.files_changed_json).filter(|f| !f.files.is_empty()).map(|f| (m.id.clone(), f))
        }) else {
            return none();
        };
        let path = path.trim();
        if path.is_empty() {
            let mut out = changed.summary();
            for f in changed.files.iter().take(DIFF_LIST_FILES) {
                let counts =
                    if f.binary { "binary".to_owned() } else { format!("+{} \u{2212}{}", f.additions, f.deletions) };
                out.push_str(&format!("\n{} {}  {counts}", f.change.as_str(), f.path));
            }
            if changed.files.len() > DIFF_LIST_FILES {
                out.push_str(&format!("\n… and {} more", changed.files.len() - DIFF_LIST_FILES));
            }
            out.push_str("\nSend /diff <path> for one file's diff.");
            return Ok(Some(out));
        }
        let text = self.engine.file_diff(&id, &message_id, path).await?;
        self.replier.diff(chat, path, &text).await.map_err(|e| Error::Internal(e.to_string()))?;
        Ok(None)
    }

    /// Anything else: the bound conversation's next message (created on the first); `now`
    /// (`/now <text>`): it interrupts the running turn and runs next.
    async fn send(
        &self,
        st: &mut State,
        channel: &ChannelRecord,
        chat: &str,
        text: &str,
        now: bool,
    ) -> crate::error::Result<Option<String>> {
        let source = format!("channel:{}", channel.name);
        let Some(id) = self.bound(st, channel, chat, true).await? else { return Ok(None) };
        let send = |id: String, source: String| async move {
            if now {
                self.engine.send_now(&id, text.to_owned(), source).await
            } else {
                self.engine.send(&id, text.to_owned(), source).await
            }
        };
        let reply = match send(id, source.clone()).await {
            // The bound conversation was archived or deleted since: bind afresh, once.
            Err(Error::NotFound(_) | Error::Precondition(_)) => {
                if let Some(c) = st.chats.get_mut(chat) {
                    c.conversation.clear();
                }
                let Some(id) = self.bound(st, channel, chat, true).await? else { return Ok(None) };
                send(id, source).await?
            }
            r => r?,
        };
        match reply.outcome {
            Some(c::send_message_reply::Outcome::Pending(item)) => {
                let q = reply.queue.unwrap_or_default();
                let pos = q.items.iter().position(|p| p.id == item.id).unwrap_or(q.items.len().saturating_sub(1));
                Ok(Some(if q.paused {
                    format!("Queued ({pos} ahead; the queue is paused: /resume runs it).")
                } else {
                    format!("Queued ({} ahead).", pos + 1)
                }))
            }
            _ => Ok(None),
        }
    }
}

/// Requests a folder remembers to show their decision with (the oldest are forgotten beyond).
const MAX_REMEMBERED_REQUESTS: usize = 256;

/// A request event's approval as a channel shows it: the command (`command`, `cmd`), else the
/// path (`file_path`, `path`, `notebook_path`), else the URL or pattern, from its input.
pub fn approval_view(conversation_id: &str, a: &c::Approval) -> ApprovalView {
    let input: serde_json::Value = serde_json::from_str(&a.input_json).unwrap_or_default();
    let detail = ["command", "cmd", "file_path", "path", "notebook_path", "url", "pattern"]
        .iter()
        .find_map(|k| match input.get(*k)? {
            serde_json::Value::String(s) if !s.trim().is_empty() => Some(s.trim().to_owned()),
            // Codex gives the command as argv.
            serde_json::Value::Array(l) if !l.is_empty() => Some(
                l.iter().map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_owned)).collect::<Vec<_>>().join(" "),
            ),
            _ => None,
        })
        .unwrap_or_default();
    ApprovalView {
        conversation_id: conversation_id.to_owned(),
        number: a.number,
        tool: a.tool.clone(),
        summary: a.summary.clone(),
        detail,
        decided: None,
    }
}

/// Hands each approval request and decision to the replier, in order.
async fn show_approvals(
    replier: Arc<dyn Replier>,
    chat: String,
    channel: String,
    mut views: mpsc::UnboundedReceiver<ApprovalView>,
) {
    while let Some(view) = views.recv().await {
        if let Err(e) = replier.approval(&chat, &view, &channel).await {
            tracing::warn!(error = %e, number = view.number, "An approval could not be shown in its chat.");
        }
    }
}

impl Bridge {
    /// A message with files for the bound conversation (created on the first), as
    /// [`Bridge::send`] does for text.
    async fn send_files(
        &self,
        st: &mut State,
        channel: &ChannelRecord,
        chat: &str,
        text: &str,
        files: Vec<c::AttachmentUpload>,
    ) -> crate::error::Result<Option<String>> {
        let source = format!("channel:{}", channel.name);
        let Some(id) = self.bound(st, channel, chat, true).await? else { return Ok(None) };
        let reply = match self.engine.send_with(&id, text.to_owned(), source.clone(), files.clone()).await {
            // The bound conversation was archived or deleted since: bind afresh, once.
            Err(Error::NotFound(_) | Error::Precondition(_)) => {
                if let Some(c) = st.chats.get_mut(chat) {
                    c.conversation.clear();
                }
                let Some(id) = self.bound(st, channel, chat, true).await? else { return Ok(None) };
                self.engine.send_with(&id, text.to_owned(), source, files).await?
            }
            r => r?,
        };
        Ok(match reply.outcome {
            Some(c::send_message_reply::Outcome::Pending(_)) => {
                let q = reply.queue.unwrap_or_default();
                Some(if q.paused {
                    "Queued with its files (the queue is paused: /resume runs it).".to_owned()
                } else {
                    format!("Queued with its files ({} ahead).", q.items.len().saturating_sub(1))
                })
            }
            _ => None,
        })
    }
}

/// What the renderer shows next in a chat, in order.
pub enum Show {
    /// One turn's snapshots.
    Turn(watch::Receiver<TurnView>),
    /// A notice after a turn (its changed files: [`files_summary`]).
    Notice(String),
}

/// Hands each turn's watch (and each notice) to the replier, one at a time, in order; after a
/// turn that ran at least `chat.notify_after_s`, a new one-line notice ([`super::notify`]).
async fn render(
    engine: Arc<Engine>,
    replier: Arc<dyn Replier>,
    chat: String,
    mut turns: mpsc::UnboundedReceiver<Show>,
) {
    while let Some(show) = turns.recv().await {
        let views = match show {
            Show::Turn(views) => views,
            Show::Notice(text) => {
                if let Err(e) = replier.notice(&chat, &text).await {
                    tracing::warn!(error = %e, "A notice could not be shown in its chat.");
                }
                continue;
            }
        };
        let last = views.clone();
        if let Err(e) = replier.turn(&chat, views).await {
            tracing::warn!(error = %e, "A turn could not be shown in its chat.");
            continue;
        }
        let end = last.borrow().clone();
        if super::notify::due(&end, engine.config().notify_after)
            && let Err(e) = replier.notice(&chat, &super::notify::finished_line(&end)).await
        {
            tracing::warn!(error = %e, "The end of a long turn could not be announced in its chat.");
        }
    }
}

/// The one-line summary of a turn's changed files a chat gets after the turn:
/// `3 files changed: +40 −12 · /diff src/a.rs` (the first file named as an example).
pub fn files_summary(f: &c::FilesChanged) -> String {
    if f.files.is_empty() {
        return format!("Files changed: not compared ({}).", f.note);
    }
    let (a, d) =
        f.files.iter().fold((0u64, 0u64), |(a, d), x| (a + u64::from(x.additions), d + u64::from(x.deletions)));
    let n = f.files.len();
    let more = if f.truncated { "+" } else { "" };
    let files = if n == 1 && !f.truncated { "file" } else { "files" };
    format!("{n}{more} {files} changed: +{a} \u{2212}{d} · /diff {}", f.files[0].path)
}

/// Most files `/diff` lists.
const DIFF_LIST_FILES: usize = 30;

/// The turn being folded.
struct Current {
    tx: watch::Sender<TurnView>,
    view: TurnView,
    /// A tool call came after the last text: the next text starts a new paragraph.
    after_tool: bool,
    assistant_message_id: String,
    /// When the turn's first event was published (Unix ms): its elapsed time at the end.
    started_ms: i64,
}

impl Current {
    fn publish(&self) {
        self.tx.send_replace(self.view.clone());
    }

    fn end(mut self, state: TurnState, final_text: Option<String>) {
        if let Some(t) = final_text.filter(|t| !t.is_empty()) {
            self.view.text = t;
        }
        self.view.state = state;
        self.publish();
    }
}

/// Follows conversation `id`'s bus, folding every turn into snapshots for the renderer; ends
/// when the conversation is deleted, or when `retire` fired and no turn is in flight.
async fn fold(
    engine: Arc<Engine>,
    id: String,
    mut sub: crate::bus::Subscription,
    turns: mpsc::UnboundedSender<Show>,
    approvals: mpsc::UnboundedSender<ApprovalView>,
    retire: CancellationToken,
) {
    let mut cur: Option<Current> = None;
    // The requests seen, by number (a decision is shown with its request's tool and command).
    let mut requests: std::collections::BTreeMap<u64, ApprovalView> = std::collections::BTreeMap::new();
    loop {
        let ev = tokio::select! {
            biased;
            () = retire.cancelled(), if cur.is_none() => return,
            ev = sub.next() => ev,
        };
        let Some(ev) = ev else {
            if let Some(c) = cur.take() {
                c.end(TurnState::Failed { message: "the conversation is no longer followed".into() }, None);
            }
            return;
        };
        let Some(kind) = &ev.kind else { continue };
        match kind {
            Kind::MessageCreated(_) | Kind::TurnStarted(_) if !ev.turn_id.is_empty() => {
                let same = cur.as_ref().is_some_and(|c| c.view.turn_id == ev.turn_id);
                if matches!(kind, Kind::MessageCreated(_)) && same {
                    // A replay of the turn being folded (after a resubscription): fold it afresh.
                    if let Some(c) = cur.as_mut() {
                        c.view.text.clear();
                        c.view.tools.clear();
                        c.after_tool = false;
                    }
                } else if !same {
                    if let Some(old) = cur.take() {
                        old.end(TurnState::Failed { message: "the turn's end was not seen".into() }, None);
                    }
                    let view =
                        TurnView { conversation_id: id.clone(), turn_id: ev.turn_id.clone(), ..Default::default() };
                    let (tx, rx) = watch::channel(view.clone());
                    if turns.send(Show::Turn(rx)).is_err() {
                        return;
                    }
                    cur = Some(Current {
                        tx,
                        view,
                        after_tool: false,
                        assistant_message_id: String::new(),
                        started_ms: ev.at_ms,
                    });
                }
                if let (Kind::TurnStarted(t), Some(c)) = (kind, cur.as_mut()) {
                    c.assistant_message_id.clone_from(&t.assistant_message_id);
                }
            }
            Kind::TextDelta(d) => {
                if let Some(c) = cur.as_mut().filter(|c| c.view.turn_id == ev.turn_id) {
                    if c.after_tool && !c.view.text.is_empty() && !d.text.trim().is_empty() {
                        c.view.text.push_str("\n\n");
                    }
                    if !d.text.trim().is_empty() {
                        c.after_tool = false;
                    }
                    c.view.text.push_str(&d.text);
                    c.publish();
                }
            }
            Kind::ToolCall(t) => {
                if let Some(c) = cur.as_mut().filter(|c| c.view.turn_id == ev.turn_id) {
                    c.view.tools.push(t.name.clone());
                    c.after_tool = true;
                    c.publish();
                }
            }
            Kind::TurnDone(d) => {
                if let Some(mut c) = cur.take_if(|c| c.view.turn_id == ev.turn_id) {
                    c.view.elapsed_ms = Some(ev.at_ms.saturating_sub(c.started_ms).max(0) as u64);
                    let state = if d.stop_reason == "interrupted" {
                        TurnState::Interrupted
                    } else {
                        TurnState::Done { stop_reason: d.stop_reason.clone() }
                    };
                    c.end(state, d.message.as_ref().map(message_text));
                }
            }
            Kind::TurnError(e) => {
                if let Some(mut c) = cur.take_if(|c| c.view.turn_id == ev.turn_id) {
                    c.view.elapsed_ms = Some(ev.at_ms.saturating_sub(c.started_ms).max(0) as u64);
                    c.end(
                        TurnState::Failed { message: e.message.clone() },
                        e.message_record.as_ref().map(message_text),
                    );
                }
            }
            Kind::ApprovalRequested(r) => {
                if let Some(a) = &r.approval {
                    let view = approval_view(&id, a);
                    if requests.len() >= MAX_REMEMBERED_REQUESTS
                        && let Some(oldest) = requests.keys().next().copied()
                    {
                        requests.remove(&oldest);
                    }
                    requests.insert(a.number, view.clone());
                    let _ = approvals.send(view);
                }
            }
            Kind::ApprovalResolved(r) => {
                let mut view = requests.remove(&r.number).unwrap_or_else(|| ApprovalView {
                    conversation_id: id.clone(),
                    number: r.number,
                    ..Default::default()
                });
                view.decided = Some(Decided {
                    decision: r.decision.clone(),
                    decided_by: r.decided_by.clone(),
                    actor: r.actor.clone(),
                    message: r.message.clone(),
                });
                let _ = approvals.send(view);
            }
            Kind::FilesChanged(f)
                if (!f.files.is_empty() || !f.note.is_empty())
                    && turns.send(Show::Notice(files_summary(f))).is_err() =>
            {
                return;
            }
            Kind::Reset(r) if r.reason != crate::bus::reason::DELETED => {
                // Fell behind (or too old): follow afresh; the in-flight turn is replayed from
                // its start; a turn that ended in the gap is read back from the store.
                match engine.subscribe(&id, 0).await {
                    Ok(s) => sub = s,
                    Err(e) => {
                        tracing::warn!(conversation = %id, error = %e, "Cannot follow a conversation again.");
                        if let Some(c) = cur.take() {
                            c.end(TurnState::Failed { message: "the turn's stream was lost".into() }, None);
                        }
                        return;
                    }
                }
                if let Some(c) = cur.as_ref()
                    && !engine.view(&engine.store().get(&id).await.unwrap_or_default()).turn_running
                {
                    let (state, text) = ended_turn(&engine, &id, &c.assistant_message_id).await;
                    if let Some(c) = cur.take() {
                        c.end(state, text);
                    }
                }
            }
            _ => {}
        }
    }
}

/// How a turn whose end was missed ended, read from its assistant message.
async fn ended_turn(engine: &Engine, conversation: &str, message_id: &str) -> (TurnState, Option<String>) {
    let page = engine
        .store()
        .messages(st::ListMessagesRequest {
            conversation_id: conversation.to_owned(),
            limit: 20,
            newest: true,
            ..Default::default()
        })
        .await;
    let found = page.ok().and_then(|p| p.messages.into_iter().find(|m| m.id == message_id));
    match found {
        Some(m) => {
            let m = crate::persist::message(&m);
            let text = Some(message_text(&m));
            let state = match c::MessageStatus::try_from(m.status).unwrap_or_default() {
                c::MessageStatus::Interrupted => TurnState::Interrupted,
                c::MessageStatus::Failed => TurnState::Failed { message: m.error.clone() },
                _ => TurnState::Done { stop_reason: "end_turn".into() },
            };
            (state, text)
        }
        None => (TurnState::Failed { message: "the turn's end was not seen".into() }, None),
    }
}

#[cfg(test)]
#[path = "bridge_tests.rs"]
mod rig_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_parsed_with_the_bot_suffix_and_arguments() {
        assert_eq!(command("/model  opus-4 "), Some(("model".into(), "opus-4")));
        assert_eq!(command("/NEW@my_bot"), Some(("new".into(), "")));
        assert_eq!(command("/pair 7KQ2-M9XD"), Some(("pair".into(), "7KQ2-M9XD")));
        assert_eq!(command("/etc/passwd please"), None, "a path is text");
        assert_eq!(command("hello /new"), None);
        assert_eq!(command("/"), None);
    }

    #[test]
    fn final_text_joins_text_blocks_and_skips_tools() {
        use c::content_block::Block;
        let m = c::Message {
            blocks: vec![
                c::ContentBlock { block: Some(Block::Text("one".into())) },
                c::ContentBlock { block: Some(Block::ToolUse(c::ToolUse::default())) },
                c::ContentBlock { block: Some(Block::Text("two".into())) },
                c::ContentBlock { block: Some(Block::Text("  ".into())) },
            ],
            ..Default::default()
        };
        assert_eq!(message_text(&m), "one\n\ntwo");
        assert_eq!(cut_chars("short", 10), "short");
        assert_eq!(cut_chars("line one\nline two", 80), "line one…");
        assert_eq!(cut_chars(&"x".repeat(100), 3), "xxx…");
    }
}
