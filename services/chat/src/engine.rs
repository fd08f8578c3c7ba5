//! The turn engine: per conversation at most one turn in flight, a FIFO pending queue (persisted,
//! restored paused after a restart), interrupt, a turn timeout, and the turn's events on the
//! conversation's [`Bus`].
//!
//! A conversation's live state ([`Conv`]) is created on first use and costs a few hundred bytes
//! while idle: no task, no buffer. A turn runs in one task ([`Engine::run_turns`]) that, when the
//! turn ends, starts the next pending item (one turn each, in order, never merged) unless the
//! queue is paused, and ends when there is none. State changes (send, set pending, interrupt,
//! delete, the move to the next turn) take the conversation's async lock, so they apply in the
//! order they arrive; the turn's own events do not take it.
//!
//! A turn: its user message and its assistant message (`streaming`) are persisted together —
//! for a queued item in the same store transaction that removes it from the queue (`StartTurn`),
//! so an acknowledged item is always either pending or a stored user message with a reply
//! record — and announced (`message_created`), `turn_started`, then the adapter's events become
//! `text_delta`, `tool_call`, `tool_result`, each folded into the assistant message's blocks; the
//! turn ends once ([`TurnShared::claim`]): the message is persisted `complete`/`interrupted`/
//! `failed` and `turn_done` or `turn_error` is published, then an audit entry with actor `agent`.
//! An interrupt ends it at once (the adapter is told to stop, its late events are dropped, and
//! the next turn waits until its task has ended, at most [`DRAIN`]). The queue pauses after
//! `turn_error` and after an interrupt; a pause holds the items that were waiting, never a
//! message sent afterwards while no turn runs (stop, then redirect). A turn's store writes are retried while the store restarts (at most
//! [`STORE_RETRY`], in order: the next turn starts only after this one's answer is written), and
//! a turn whose answer could not be stored ends in `turn_error`, never `turn_done`.
//!
//! More of the rules, so they are read in one place:
//! - **Ending a turn.** A new agent `Session` id is written into the conversation's `agent_config`
//!   at once, so a crash mid-turn still resumes the agent session. When the turn ends the message
//!   is persisted, the audit entry written (actor `agent`, action `chat.turn`, ids, status, model,
//!   token counts; never message text), the queue paused when it ended in error or interrupt, then
//!   `turn_done` or `turn_error`, then `queue_changed`. A turn with no adapter event for
//!   `chat.turn_timeout_s` is interrupted and ends `turn_error{timeout}`; an adapter that ends
//!   without a terminal event ends it `turn_error{cli_exited}`.
//! - **The pending queue.** A message sent while a turn runs (or one is about to start) becomes
//!   a pending item (persisted with `SetPending`, `queue_changed`, at most [`MAX_PENDING`] items
//!   / [`MAX_PENDING_BYTES`]); an item the store will not start stays first and the queue pauses.
//!   `SetPending` replaces the queue whole (new ids for new items), unpauses unless asked, and
//!   starts the next turn when idle.
//! - **Stop, then redirect.** A message sent while no turn runs starts its turn at once, also
//!   when the queue is paused (after a stop, a turn error or a restart): only the items already
//!   waiting stay paused, shown with resume and discard. A paused queue with nothing in it is
//!   un-paused by that message (there was nothing to hold), so what is sent during its turn
//!   queues behind it as usual.
//! - **Send now** ([`Engine::send_now`]). The turn in flight — or the one about to start — is
//!   ended `interrupted` as by an interrupt, but the queue's paused state is left as it was; the
//!   message's turn starts next (after the ended turn's task drained), before the pending
//!   items. Two sends-now in a row: the later one runs and the earlier one's turn is interrupted,
//!   even before it started (its user message is kept, its answer empty and `interrupted`), so
//!   concurrent sends-now always end with exactly the last one running.
//! - **Interrupt and delete.** An interrupt persists the partial message (text and completed tool
//!   blocks) `interrupted` and publishes `turn_done{interrupted}` at once; idle or twice, it is a
//!   no-op. Delete cancels the turn (no more writes), calls the provider's `forget`, deletes the
//!   rows and ends every subscription with `reset{deleted}`.
//! - **Restart rules** (before the service answers, [`Engine::recover`]): `FailStreamingMessages`
//!   (a turn cut by a crash is `failed`, keeping the blocks stored while it streamed: the
//!   answer is stored at most every [`CHECKPOINT_EVERY`] as it streams, so a crash loses at
//!   most that much of it), every persisted non-empty queue restored paused;
//!   `ConversationView.last_seq` after a restart lies past every number handed out before it.
//! - **Provider switching** (ADR-032, [`crate::binding`]): before each turn
//!   `Registry::turn_env` resolves the agent's bound connection through the store
//!   (`connections::Connections::get`: the record and its credential's value) into
//!   `AgentEnv.binding`, so a changed connection or key applies from the next turn. A missing
//!   connection or credential, or a wire the agent cannot use, fails the turn (`provider`) naming
//!   the connection and the setting, before any CLI starts. Unbound, Codex's provider entry and
//!   selection are gone. A kept process is reused only under the same binding
//!   (`kept::Fit.binding`, a fingerprint).
//! - **Approvals** ([`approvals`]): an adapter's `ApprovalRequested` waits in the
//!   conversation's book for the first answer, the timeout, an interrupt (denied before the agent
//!   is told to stop) or the turn's end; while one is open the turn timeout does not run.
//! - **Test hook.** [`Tuning`] lets `coffer-test-chat` (the real service plus the test-only
//!   `scripted` agent, run by `coffer-test-daemon scripted-chat`) hold the engine at an armed
//!   [`Step`] until the test releases it or kills a process (`coffer_tests::chat::arm`);
//!   `coffer-chat` has none.
use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use coffer_proto::chat::{self as c, event::Kind};
use coffer_proto::store::{self as st, content_block_record::Block};
use coffer_runtime::Backoff;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tonic::Code;

use crate::adapter::{
    AgentConfig, AgentEvent, Availability, FailureKind, INTERRUPT_GRACE, PermissionMode, TurnInput, Usage,
};
use crate::attachments;
use crate::bus::{self, Bus, Mark};
use crate::config::ConfigRx;
use crate::error::{Error, Result};
use crate::persist::{self, Store};
use crate::providers::Registry;
use crate::watch::{Watch, Watcher};

pub mod approvals;

/// Largest message text, bytes (also each pending item's).
pub const MAX_TEXT_BYTES: usize = 1 << 20;
/// Most pending items per conversation.
pub const MAX_PENDING: usize = 100;
/// Most bytes of pending text per conversation.
pub const MAX_PENDING_BYTES: usize = 16 << 20;
/// Longest title, characters.
pub const MAX_TITLE_CHARS: usize = 200;
/// Longest title taken from a first message, characters.
pub const AUTO_TITLE_CHARS: usize = 80;
/// Longest tool result kept in a message, bytes.
pub const MAX_TOOL_OUTPUT_BYTES: usize = 64 << 10;
/// How long an ended turn's adapter task may take to finish after the turn was ended (interrupt,
/// timeout, delete) before it is aborted.
pub const DRAIN: Duration = Duration::from_secs(INTERRUPT_GRACE.as_secs() + 5);
/// Events an adapter may queue before it waits for the engine.
const ADAPTER_CHANNEL: usize = 256;
/// How often a streaming answer is stored while it streams ([`Engine::checkpoint`]): what a
/// crash of this service can lose of it.
pub const CHECKPOINT_EVERY: Duration = Duration::from_secs(1);
/// How long a turn's store write (its start, its answer, the conversation read before it) is
/// retried while the store does not answer: a supervisor restart of `coffer-store` takes well
/// under a second, its crash backoff at most a few.
pub const STORE_RETRY: Duration = Duration::from_secs(30);
/// The first and the longest wait between two tries of a store write.
const RETRY_FIRST: Duration = Duration::from_millis(50);
const RETRY_MAX: Duration = Duration::from_secs(1);

/// A point of the turn engine where a test may hold it: the windows a crash or a store restart
/// could hit. Only the tests' `coffer-test-chat` installs a [`PauseHook`]; `coffer-chat` runs
/// without one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The next pending item is chosen; nothing is written yet.
    TakePending,
    /// The item's turn is started in the store (item removed, both messages appended); no
    /// event is published yet.
    PendingTaken,
    /// A turn has ended; its assistant message is about to be written.
    FinalWrite,
}

impl Step {
    /// The step's name: `take-pending`, `pending-taken`, `final-write`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::TakePending => "take-pending",
            Self::PendingTaken => "pending-taken",
            Self::FinalWrite => "final-write",
        }
    }
}

/// Called at each [`Step`] with the conversation's id; the engine goes on when the future ends.
pub type PauseHook = Arc<dyn Fn(Step, String) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// What an engine may be given beyond its parts: a pause hook (tests), how long store writes
/// are retried.
#[derive(Clone)]
pub struct Tuning {
    pub pause: Option<PauseHook>,
    pub store_retry: Duration,
}

impl Default for Tuning {
    fn default() -> Self {
        Self { pause: None, store_retry: STORE_RETRY }
    }
}

/// Whether a store failure says the store is away (refused or reset connection, a call cut
/// mid-way: it restarts) rather than giving a verdict on the request.
fn transient(e: &Error) -> bool {
    match e {
        Error::Store(s) => match s.code() {
            Code::Unavailable | Code::Unknown | Code::Cancelled | Code::DeadlineExceeded => true,
            // tonic's code for a connection the peer dropped mid-stream.
            Code::Internal => s.message().starts_with("h2 protocol error"),
            _ => false,
        },
        _ => false,
    }
}

/// The chat engine: every conversation's live state.
pub struct Engine {
    store: Store,
    registry: Arc<Registry>,
    config: ConfigRx,
    home: PathBuf,
    convs: Mutex<HashMap<String, Arc<Conv>>>,
    /// The conversation list's live feed.
    watch: Arc<Watch>,
    tuning: Tuning,
    /// The turns' file diffs (issue 34 §4).
    diffs: crate::changes::DiffStore,
}

/// One conversation's live state.
pub struct Conv {
    id: String,
    bus: Bus,
    live: tokio::sync::Mutex<Live>,
    /// What list views show without waiting for the lock.
    snap: Mutex<Shown>,
    deleted: AtomicBool,
    /// Told when the snapshot changes (list watchers show the live state).
    watch: Arc<Watch>,
    /// The open and recent approval requests ([`approvals`]).
    approvals: approvals::Book,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Snapshot {
    turn_running: bool,
    pending: u32,
    paused: bool,
    approvals_waiting: u32,
}

/// A conversation's live state (turn running, queue counts, approvals) taken at one moment:
/// [`Engine::pending_with`] gives it to its reader, [`view_with`] shows it.
#[derive(Debug, Clone, Copy)]
pub struct LiveState(Snapshot);

/// The Chat conversation of record `r` with `live` state filled in (`None`: a conversation not
/// loaded in this service: idle, as stored).
pub fn view_with(r: &st::ConversationRecord, live: Option<LiveState>) -> c::Conversation {
    let mut v = persist::conversation(r);
    if let Some(LiveState(s)) = live {
        v.turn_running = s.turn_running;
        v.pending_count = s.pending;
        v.pending_paused = s.paused;
        v.approvals_waiting = s.approvals_waiting;
    }
    v
}

/// What [`Conv::sync`] last copied from the live state: the counts, and the turns that make the
/// conversation "running". Whether a turn still runs is read from the turn itself
/// ([`TurnShared::ended`]: its answer is stored, its end event about to go out), so the
/// snapshot says a turn is over from then on, without the conversation's lock. (Not from
/// `finalized`: that is set when the turn's end begins, before its answer is stored, and a
/// reader would see an idle conversation whose last answer is still `streaming`.)
#[derive(Default)]
struct Shown {
    /// The turn whose task runs ([`Live::task`]).
    task: Option<Arc<TurnShared>>,
    /// A turn announced to start once the last task drained ([`Live::next_start`]).
    next: Option<Arc<TurnShared>>,
    pending: u32,
    paused: bool,
    approvals_waiting: u32,
}

impl Shown {
    fn snapshot(&self) -> Snapshot {
        let runs = |t: &Option<Arc<TurnShared>>| t.as_ref().is_some_and(|t| !t.ended());
        Snapshot {
            turn_running: runs(&self.task) || runs(&self.next),
            pending: self.pending,
            paused: self.paused,
            approvals_waiting: self.approvals_waiting,
        }
    }
}

#[derive(Default)]
struct Live {
    pending: Vec<c::PendingItem>,
    paused: bool,
    /// The turn whose task runs (it may still be draining after the turn ended).
    task: Option<Arc<TurnShared>>,
    /// A message sent while an ended turn's task drained (after a stop, or a send-now that
    /// interrupted it): persisted and announced, it starts as soon as the task is gone.
    next_start: Option<Next>,
    /// The attachment blocks of queued items (by item id: their user message's id), for the
    /// user message when the item's turn starts. Not persisted: after a restart the files
    /// still reach the agent (read back from their folder), the stored message lacks the blocks.
    attached: HashMap<String, Vec<st::ContentBlockRecord>>,
}

/// A turn about to start: its user message is persisted and announced.
struct Next {
    turn: Arc<TurnShared>,
    text: String,
}

/// What the turn's task and the handlers share about one turn.
pub struct TurnShared {
    turn_id: String,
    user_message_id: String,
    assistant_message_id: String,
    acc: Mutex<Acc>,
    interrupt: Mutex<Option<oneshot::Sender<()>>>,
    interrupt_asked: AtomicBool,
    /// Cancelled when the conversation is deleted: the task stops the adapter and writes nothing.
    cancel: CancellationToken,
    /// When the streaming answer was last stored ([`Engine::checkpoint`]); held across each
    /// write of the answer, the final one too, so a checkpoint never lands after the end.
    stored: tokio::sync::Mutex<std::time::Instant>,
}

#[derive(Default)]
struct Acc {
    blocks: Vec<st::ContentBlockRecord>,
    finalized: bool,
    model: String,
    agent_key: String,
    /// The LLM connection the agent was bound to for the turn (empty: its own login).
    connection: String,
    /// The assistant message as the turn's end stored it (what `files_changed` is added to).
    final_record: Option<st::MessageRecord>,
}

/// Whether ending a turn pauses the queue, and how the conversation's lock is had.
enum Pause<'a> {
    No,
    /// Take the lock.
    Lock,
    /// The caller holds it.
    Held(&'a mut Live),
}

/// How a turn ended.
enum Outcome {
    Done { stop_reason: String, usage: Usage, model: Option<String> },
    Failed { kind: FailureKind, message: String },
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// A new ULID (26 uppercase Crockford base-32 characters).
pub fn new_id() -> String {
    ulid::Ulid::from_parts(now_ms() as u64, fastrand::u128(..)).to_string()
}

/// Checks a conversation (or message) id: a ULID.
///
/// # Errors
/// [`Error::Invalid`] naming `field`.
pub fn check_id(field: &str, id: &str) -> Result<()> {
    let ok = id.len() == 26
        && id.bytes().all(|b| b.is_ascii_digit() || b.is_ascii_uppercase())
        && ulid::Ulid::from_string(id).is_ok();
    if ok {
        Ok(())
    } else {
        // The ids checked here are conversations' and messages' (`message_id`, `after_id`).
        let what = if matches!(field, "message_id" | "after_id") { "a message id" } else { "a conversation id" };
        Err(Error::Invalid(format!("{field}: {id:?} is not {what} (a 26-character ULID)")))
    }
}

/// Checks a message text: 1 byte to [`MAX_TEXT_BYTES`].
///
/// # Errors
/// [`Error::Invalid`] naming `field` and the limit.
pub fn check_text(field: &str, text: &str) -> Result<()> {
    if text.is_empty() {
        return Err(Error::Invalid(format!(
            "{field}: empty; a message holds 1 byte to 1 MiB ({MAX_TEXT_BYTES} bytes)"
        )));
    }
    if text.len() > MAX_TEXT_BYTES {
        return Err(Error::Invalid(format!(
            "{field}: {} bytes is over the limit of 1 MiB ({MAX_TEXT_BYTES} bytes)",
            text.len()
        )));
    }
    Ok(())
}

/// Longest message source (`web`, `cli`, `api`, `channel:<name>`), bytes.
pub const MAX_SOURCE_BYTES: usize = 80;

/// Checks a message's source: at most [`MAX_SOURCE_BYTES`] printable ASCII characters.
///
/// # Errors
/// [`Error::Invalid`] naming `source`.
pub fn check_source(source: &str) -> Result<()> {
    if source.len() > MAX_SOURCE_BYTES || !source.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(Error::Invalid(format!(
            "source: at most {MAX_SOURCE_BYTES} printable ASCII characters (web, cli, api, channel:<name>)"
        )));
    }
    Ok(())
}

/// A permission mode word (`bypass`, `ask`, `read_only`; `read-only` too).
///
/// # Errors
/// [`Error::Invalid`] naming `field` and the words.
pub fn parse_mode(field: &str, word: &str) -> Result<PermissionMode> {
    PermissionMode::parse(word).ok_or_else(|| {
        Error::Invalid(format!(
            "{field}: {:?} is not a permission mode (one of {})",
            word.chars().take(40).collect::<String>(),
            PermissionMode::WORDS.join(", ")
        ))
    })
}

/// A title from a first message: its first non-blank line, trimmed, cut at a word boundary to
/// at most [`AUTO_TITLE_CHARS`] characters (mid-word only when its first word is longer).
pub fn title_from(text: &str) -> String {
    let line = text.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or_default();
    if line.chars().count() <= AUTO_TITLE_CHARS {
        return line.to_owned();
    }
    let cut: String = line.chars().take(AUTO_TITLE_CHARS + 1).collect();
    let head: String = cut.chars().take(AUTO_TITLE_CHARS).collect();
    // A boundary right after the 80th character counts too.
    if cut.ends_with(char::is_whitespace) {
        return head.trim_end().to_owned();
    }
    match head.rfind(char::is_whitespace) {
        Some(i) if !head[..i].trim_end().is_empty() => head[..i].trim_end().to_owned(),
        _ => head,
    }
}

/// Checks and fills a new conversation's working directory: empty = `home/workspace` (created on
/// first use); otherwise an absolute path to an existing directory.
///
/// # Errors
/// [`Error::Invalid`] naming `agent_config.cwd` and what is wrong.
pub fn check_cwd(home: &Path, cwd: &str) -> Result<String> {
    if cwd.is_empty() {
        let dir = home.join("workspace");
        std::fs::create_dir_all(&dir)
            .map_err(|e| Error::Internal(format!("cannot create the default workspace {}: {e}", dir.display())))?;
        return Ok(dir.display().to_string());
    }
    let p = Path::new(cwd);
    if !p.is_absolute() {
        return Err(Error::Invalid(format!("agent_config.cwd: {cwd:?} is not an absolute path")));
    }
    match std::fs::metadata(p) {
        Err(_) => Err(Error::Invalid(format!("agent_config.cwd: {cwd:?} does not exist"))),
        Ok(m) if !m.is_dir() => Err(Error::Invalid(format!("agent_config.cwd: {cwd:?} is not a directory"))),
        Ok(_) => Ok(cwd.to_owned()),
    }
}

fn text_block(t: impl Into<String>) -> st::ContentBlockRecord {
    st::ContentBlockRecord { block: Some(Block::Text(t.into())) }
}

/// Cuts `s` to at most `max` bytes at a character boundary.
fn cut(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut i = max;
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    &s[..i]
}

impl TurnShared {
    fn new(user_message_id: String, assistant_message_id: String) -> Arc<Self> {
        Arc::new(Self {
            turn_id: new_id(),
            user_message_id,
            assistant_message_id,
            acc: Mutex::new(Acc::default()),
            interrupt: Mutex::new(None),
            interrupt_asked: AtomicBool::new(false),
            cancel: CancellationToken::new(),
            stored: tokio::sync::Mutex::new(std::time::Instant::now()),
        })
    }

    fn acc(&self) -> std::sync::MutexGuard<'_, Acc> {
        self.acc.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn finalized(&self) -> bool {
        self.acc().finalized
    }

    /// Whether the turn's end is stored (its final assistant message; [`Engine::finish`] sets
    /// it just before the end event): from then on lists show the turn over.
    fn ended(&self) -> bool {
        self.acc().final_record.is_some()
    }

    /// Tells the adapter to stop (once; remembered when it has not started yet).
    fn fire_interrupt(&self) {
        self.interrupt_asked.store(true, Ordering::Release);
        if let Some(tx) = self.interrupt.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = tx.send(());
        }
    }

    /// Marks the turn ended; its blocks, model, agent and connection when this call ended it,
    /// `None` when it had ended already.
    fn claim(&self) -> Option<(Vec<st::ContentBlockRecord>, String, String, String)> {
        let mut acc = self.acc();
        if acc.finalized {
            return None;
        }
        acc.finalized = true;
        Some((acc.blocks.clone(), acc.model.clone(), acc.agent_key.clone(), acc.connection.clone()))
    }
}

impl Conv {
    fn new(id: &str, pending: Vec<c::PendingItem>, paused: bool, watch: Arc<Watch>) -> Self {
        let snap = Shown { pending: pending.len() as u32, paused, ..Shown::default() };
        Self {
            id: id.to_owned(),
            bus: Bus::new(id),
            live: tokio::sync::Mutex::new(Live { pending, paused, ..Live::default() }),
            snap: Mutex::new(snap),
            deleted: AtomicBool::new(false),
            watch,
            approvals: approvals::Book::default(),
        }
    }

    /// Updates the snapshot's count of open approval requests (touching the list's watch when
    /// it changed).
    fn sync_approvals(&self) {
        let waiting = self.approvals.waiting();
        let changed = {
            let mut snap = self.snap.lock().unwrap_or_else(|e| e.into_inner());
            std::mem::replace(&mut snap.approvals_waiting, waiting) != waiting
        };
        if changed {
            self.watch.touch(&self.id);
        }
    }

    /// Copies the live state into the snapshot (under the conversation's lock, the caller's
    /// `live`), touching the list's watch when what it shows changed.
    fn sync(&self, live: &Live) {
        let shown = Shown {
            task: live.task.clone(),
            next: live.next_start.as_ref().map(|n| n.turn.clone()),
            pending: live.pending.len() as u32,
            paused: live.paused,
            approvals_waiting: self.approvals.waiting(),
        };
        let (before, after) = {
            let mut snap = self.snap.lock().unwrap_or_else(|e| e.into_inner());
            let before = snap.snapshot();
            *snap = shown;
            (before, snap.snapshot())
        };
        if before != after {
            self.watch.touch(&self.id);
        }
    }

    fn snapshot(&self) -> Snapshot {
        self.snap.lock().unwrap_or_else(|e| e.into_inner()).snapshot()
    }

    fn deleted(&self) -> bool {
        self.deleted.load(Ordering::Acquire)
    }
}

fn queue(live: &Live) -> c::PendingQueue {
    c::PendingQueue { items: live.pending.clone(), paused: live.paused }
}

impl Engine {
    /// An engine over the store, the provider registry and the chat settings.
    pub fn new(store: Store, registry: Arc<Registry>, config: ConfigRx, home: PathBuf) -> Arc<Self> {
        Self::with_tuning(store, registry, config, home, Tuning::default())
    }

    /// [`Engine::new`] with a pause hook or another store retry bound.
    pub fn with_tuning(
        store: Store,
        registry: Arc<Registry>,
        config: ConfigRx,
        home: PathBuf,
        tuning: Tuning,
    ) -> Arc<Self> {
        Arc::new(Self {
            store,
            registry,
            config,
            diffs: crate::changes::DiffStore::new(&home),
            home,
            convs: Mutex::new(HashMap::new()),
            watch: Arc::default(),
            tuning,
        })
    }

    /// Waits at `step` while the pause hook (tests only) holds the engine there.
    async fn pause_at(&self, step: Step, conv: &str) {
        if let Some(hook) = &self.tuning.pause {
            hook(step, conv.to_owned()).await;
        }
    }

    /// Runs `op`, an idempotent store call, until it succeeds, fails with a verdict on the
    /// request, or the store has not answered for [`Tuning::store_retry`] (waits of 50 ms
    /// doubling to 1 s between tries). `what` names the write in the logs.
    ///
    /// # Errors
    /// The last failure.
    async fn retry<T, F, Fut>(&self, what: &'static str, conv: &str, mut op: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let deadline = tokio::time::Instant::now() + self.tuning.store_retry;
        let mut backoff = Backoff::new(RETRY_FIRST, RETRY_MAX);
        let mut tries = 1u32;
        loop {
            match op().await {
                Err(e) if transient(&e) && tokio::time::Instant::now() + backoff.peek() < deadline => {
                    let delay = backoff.next_delay();
                    tracing::warn!(conversation = %conv, what, tries, error = %e, retry_ms = delay.as_millis() as u64,
                        "The store did not answer a turn's write; retrying.");
                    tokio::time::sleep(delay).await;
                    tries += 1;
                }
                Ok(v) => {
                    if tries > 1 {
                        tracing::info!(conversation = %conv, what, tries, "A turn's write went through after retrying.");
                    }
                    return Ok(v);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The provider registry.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The store's clients.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// `COFFER_HOME`.
    pub fn home(&self) -> &Path {
        &self.home
    }

    /// The settings in force.
    pub fn config(&self) -> Arc<crate::config::Config> {
        self.config.borrow().clone()
    }

    fn convs(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Conv>>> {
        self.convs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The restart rules, run once before the service answers: every message left `streaming`
    /// becomes `failed`; every persisted pending queue is restored paused.
    ///
    /// # Errors
    /// When the store does not answer.
    pub async fn recover(&self) -> Result<()> {
        let failed = self.store.fail_streaming().await?;
        let queues = self.store.pending_queues().await?;
        let restored = queues.len();
        for q in queues {
            let items: Vec<c::PendingItem> = q.items.into_iter().map(persist::pending_item).collect();
            if !q.paused {
                self.store.set_pending(&q.conversation_id, &items, true).await?;
            }
            let conv = Arc::new(Conv::new(&q.conversation_id, items, true, self.watch.clone()));
            self.convs().insert(q.conversation_id.clone(), conv);
        }
        tracing::info!(failed, restored, "Chat state recovered: streaming messages failed, pending queues paused.");
        Ok(())
    }

    /// The live state of conversation `id`, loaded from the store on first use.
    ///
    /// # Errors
    /// [`Error::NotFound`] when it does not exist.
    pub async fn conv(&self, id: &str) -> Result<Arc<Conv>> {
        check_id("conversation_id", id)?;
        if let Some(c) = self.convs().get(id) {
            return Ok(c.clone());
        }
        self.store.get(id).await?;
        let pending = self.store.get_pending(id).await?;
        let items = pending.items.into_iter().map(persist::pending_item).collect();
        let conv = Arc::new(Conv::new(id, items, pending.paused, self.watch.clone()));
        // Tools an earlier run allowed always (approvals.rs).
        conv.approvals.load(self.stored_allowed_tools(id).await);
        Ok(self.convs().entry(id.to_owned()).or_insert(conv).clone())
    }

    /// A Chat conversation from its record with the live state filled in.
    pub fn view(&self, r: &st::ConversationRecord) -> c::Conversation {
        let live = self.convs().get(&r.id).map(|conv| LiveState(conv.snapshot()));
        view_with(r, live)
    }

    /// The pending queue of `conv`.
    pub async fn pending(&self, conv: &Conv) -> c::PendingQueue {
        queue(&*conv.live.lock().await)
    }

    /// The pending queue of `conv` with what `read` returns, read under the conversation's
    /// lock. A pending item becomes a stored user message only under that lock (the turn's
    /// start is stored, then the item leaves the queue), so a view built from the store as
    /// `read` reads it and from this queue shows each item exactly once: queued or stored.
    ///
    /// `read` gets the live state as it was *before* it reads: a turn ends without the lock
    /// (its answer is stored, then it says it ended), so a state taken after the store was read
    /// could say "idle" beside an answer read while still `streaming`. Taken before, an idle
    /// state means the answers read after it are final.
    pub async fn pending_with<T, F: Future<Output = T>>(
        &self,
        conv: &Conv,
        read: impl FnOnce(LiveState) -> F,
    ) -> (c::PendingQueue, T) {
        let live = conv.live.lock().await;
        let read = read(LiveState(conv.snapshot())).await;
        (queue(&live), read)
    }

    /// The conversation's last event sequence number (subscribe after it to follow from now).
    ///
    /// # Errors
    /// When the store cannot reserve sequence numbers.
    pub async fn last_seq(&self, conv: &Conv) -> Result<u64> {
        conv.bus.ready(&self.store).await?;
        Ok(conv.bus.last_seq())
    }

    /// A subscriber to the conversation's events (see [`crate::bus`]).
    ///
    /// # Errors
    /// [`Error::NotFound`], or when the store cannot reserve sequence numbers.
    pub async fn subscribe(&self, id: &str, after_seq: u64) -> Result<bus::Subscription> {
        let conv = self.conv(id).await?;
        conv.bus.ready(&self.store).await?;
        Ok(conv.bus.subscribe(after_seq))
    }

    /// Marks conversation `id` changed for the list's watchers ([`crate::watch`]): after a
    /// create or an update.
    pub fn touch(&self, id: &str) {
        self.watch.touch(id);
    }

    /// A watcher of every conversation's changes from now on (`WatchConversations`).
    pub fn watch_conversations(self: &Arc<Self>) -> Watcher {
        self.watch.subscribe(self)
    }

    async fn publish(&self, conv: &Conv, turn_id: &str, kind: Kind, mark: Mark) {
        // What a list shows changes with every event but the turn's stream of deltas and tools
        // (messages appended, a turn starting or ending, the queue).
        if !matches!(kind, Kind::TextDelta(_) | Kind::ToolCall(_) | Kind::ToolResult(_)) {
            self.watch.touch(&conv.id);
        }
        if let Err(e) = conv.bus.publish(&self.store, turn_id, kind, mark).await {
            tracing::error!(conversation = %conv.id, error = %e, "Cannot publish a chat event.");
        }
    }

    async fn publish_queue(&self, conv: &Conv, live: &Live) {
        conv.sync(live);
        self.publish(conv, "", Kind::QueueChanged(c::QueueChanged { queue: Some(queue(live)) }), Mark::None).await;
    }

    /// Creates a conversation (`CreateConversation`, and a channel's `/new` and first message),
    /// validated: a registered, available agent, a title of at most [`MAX_TITLE_CHARS`]
    /// characters (empty: from the first message), a `cwd` inside the home's allowed folders and
    /// the provider's own `agent_config` rules; with a `first_message`, its turn starts (or
    /// queues) at once. Returns the conversation as it is after that.
    ///
    /// # Errors
    /// [`Error::Invalid`] naming the field, [`Error::NotFound`] for an unknown agent,
    /// [`Error::Precondition`] for an unavailable one, or a store error.
    pub async fn create_conversation(self: &Arc<Self>, r: c::CreateConversationRequest) -> Result<c::Conversation> {
        let reg = self.registry();
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
        if let Availability::Unavailable { reason } = reg.availability(entry, &self.config()) {
            return Err(Error::Precondition(format!("agent {} is not available: {reason}", r.agent_key)));
        }
        if r.title.chars().count() > MAX_TITLE_CHARS {
            return Err(Error::Invalid(format!("title: over the limit of {} characters", MAX_TITLE_CHARS)));
        }
        if !r.first_message.is_empty() {
            check_text("first_message", &r.first_message)?;
            check_source(&r.source)?;
        }
        let given = r.agent_config.unwrap_or_default();
        if !given.session_id.is_empty() {
            return Err(Error::Invalid("agent_config.session_id: must be empty when a conversation is created".into()));
        }
        let permission_mode = if given.permission_mode.is_empty() {
            self.config().default_mode(&r.agent_key)
        } else {
            parse_mode("agent_config.permission_mode", &given.permission_mode)?
        };
        let mut config = AgentConfig { cwd: given.cwd, model: given.model, session_id: String::new(), permission_mode };
        config.cwd = check_cwd(self.home(), &config.cwd)?;
        entry.provider.validate_config(&mut config).map_err(|e| Error::Invalid(format!("agent_config.{e}")))?;
        let title = if r.title.trim().is_empty() { title_from(&r.first_message) } else { r.title.trim().to_owned() };
        let record = st::ConversationRecord {
            id: new_id(),
            agent_key: r.agent_key.clone(),
            title,
            agent_config_json: persist::config_json(&config),
            channel_name: r.channel_name,
            peer_chat_id: r.peer_chat_id,
            ..Default::default()
        };
        let created = self.store().create(record).await?;
        self.touch(&created.id);
        if !r.first_message.is_empty() {
            self.send(&created.id, r.first_message, r.source).await?;
            let now = self.store().get(&created.id).await?;
            return Ok(self.view(&now));
        }
        Ok(self.view(&created))
    }

    /// Updates a conversation (`UpdateConversation`, and a channel's `/model`): its title (not
    /// empty, at most [`MAX_TITLE_CHARS`] characters), model (the provider's rules), archived
    /// flag, at `expected_version` when given.
    ///
    /// # Errors
    /// [`Error::Invalid`] naming the field, [`Error::Aborted`] when the version moved on,
    /// [`Error::NotFound`] or a store error.
    pub async fn update_conversation(&self, r: c::UpdateConversationRequest) -> Result<c::Conversation> {
        check_id("id", &r.id)?;
        let title = match r.title {
            Some(t) if t.trim().is_empty() => return Err(Error::Invalid("title: empty".into())),
            Some(t) if t.chars().count() > MAX_TITLE_CHARS => {
                return Err(Error::Invalid(format!("title: over the limit of {} characters", MAX_TITLE_CHARS)));
            }
            t => t.map(|t| t.trim().to_owned()),
        };
        let current = self.store().get(&r.id).await?;
        if let Some(v) = r.expected_version
            && v != current.version
        {
            return Err(Error::Aborted(format!(
                "conversation {} is at version {}, not {v}: reload it",
                r.id, current.version
            )));
        }
        let mode = r.permission_mode.as_deref().map(|m| parse_mode("permission_mode", m)).transpose()?;
        let agent_config_json = match r.model {
            None if mode.is_some() => {
                let mut cfg = persist::parse_config(&current.agent_config_json);
                cfg.permission_mode = mode.unwrap_or_default();
                Some(persist::config_json(&cfg))
            }
            Some(model) => {
                if model.len() > 256 || model.chars().any(char::is_control) {
                    return Err(Error::Invalid("model: at most 256 bytes without control characters".into()));
                }
                let mut cfg = persist::parse_config(&current.agent_config_json);
                cfg.model = model.trim().to_owned();
                if let Some(m) = mode {
                    cfg.permission_mode = m;
                }
                // The provider's own rule, as at creation (e.g. Claude Code's model is a CLI
                // argument: never one that starts with '-').
                if let Some(entry) = self.registry().get(&current.agent_key) {
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
        // A new permission mode starts without the tools allowed always under the old one.
        if mode.is_some_and(|m| m != persist::parse_config(&current.agent_config_json).permission_mode)
            && let Err(e) = self.forget_allowed_tools(&updated.id, "mode").await
        {
            tracing::warn!(conversation = %updated.id, error = %e, "Cannot forget the tools allowed always.");
        }
        self.touch(&updated.id);
        Ok(self.view(&updated))
    }

    /// Whether conversation `id` has no turn task left (its last turn's adapter drained and its
    /// folder compared): tests wait for it before asserting on what an idle conversation does.
    #[cfg(test)]
    pub(crate) async fn settled(&self, id: &str) -> bool {
        match self.conv(id).await {
            Ok(conv) => conv.live.lock().await.task.is_none(),
            Err(_) => true,
        }
    }

    /// `SendMessage`: starts a turn when no turn runs — also when the queue is paused, whose
    /// waiting items stay paused — otherwise appends a pending item; answers at once.
    ///
    /// # Errors
    /// [`Error::Invalid`] for the text, [`Error::NotFound`], [`Error::Precondition`] for an
    /// archived conversation, [`Error::Exhausted`] for a full queue, store failures.
    pub async fn send(self: &Arc<Self>, id: &str, text: String, source: String) -> Result<c::SendMessageReply> {
        self.submit(id, text, source, false, Vec::new()).await
    }

    /// `SendMessage{now}`: interrupts the turn in flight or about to start (see the module's
    /// "Send now") and starts this message's turn next, before the pending items; idle, a plain
    /// [`Engine::send`]. The reply's outcome is always the started user message.
    ///
    /// # Errors
    /// As [`Engine::send`] (never [`Error::Exhausted`]: nothing is queued).
    pub async fn send_now(self: &Arc<Self>, id: &str, text: String, source: String) -> Result<c::SendMessageReply> {
        self.submit(id, text, source, true, Vec::new()).await
    }

    /// [`Engine::send`] with attached files ([`crate::attachments`]): checked against the
    /// limits in force, saved under the message's id in the conversation's working directory
    /// before the message is stored (removed again when it is not), shown as attachment blocks
    /// on the user message and named to the agent. With files the text may be empty.
    ///
    /// # Errors
    /// As [`Engine::send`]; [`Error::Invalid`] naming the file and the limit it is over;
    /// [`Error::Internal`] when the files cannot be written.
    pub async fn send_with(
        self: &Arc<Self>,
        id: &str,
        text: String,
        source: String,
        uploads: Vec<c::AttachmentUpload>,
    ) -> Result<c::SendMessageReply> {
        self.submit(id, text, source, false, uploads).await
    }

    /// `SendMessage` whole: [`Engine::send`], with `now` [`Engine::send_now`], with `uploads`
    /// [`Engine::send_with`] (both may be given).
    ///
    /// # Errors
    /// As those.
    pub async fn submit(
        self: &Arc<Self>,
        id: &str,
        text: String,
        source: String,
        now: bool,
        uploads: Vec<c::AttachmentUpload>,
    ) -> Result<c::SendMessageReply> {
        let files = attachments::check(uploads, self.config().attachments)?;
        if files.is_empty() || !text.trim().is_empty() {
            check_text("text", &text)?;
        } else {
            check_text("text", &attachments::placeholder(&files))?;
        }
        check_source(&source)?;
        let conv = self.conv(id).await?;
        let record = self.store.get(id).await?;
        if record.archived_ms != 0 {
            return Err(Error::Precondition(format!("conversation {id} is archived; restore it to send messages")));
        }
        let live = conv.live.lock().await;
        if conv.deleted() {
            return Err(Error::NotFound(format!("conversation {id} not found")));
        }
        let message_id = new_id();
        let cwd = PathBuf::from(persist::parse_config(&record.agent_config_json).cwd);
        let (text, blocks) = if files.is_empty() {
            (text, Vec::new())
        } else {
            let shown = if text.trim().is_empty() { attachments::placeholder(&files) } else { text };
            let blocks = attachments::save(&cwd, &message_id, files)?;
            (shown, blocks)
        };
        let sent = self.send_locked(&conv, live, &record, message_id.clone(), text, source, now, blocks).await;
        if sent.is_err() {
            attachments::remove(&cwd, &message_id);
        }
        sent
    }

    /// The rest of [`Engine::submit`], under the conversation's lock: the title, then a turn
    /// (with `now` after ending the one in flight) or a pending item with id `message_id`.
    #[allow(clippy::too_many_arguments)]
    async fn send_locked(
        self: &Arc<Self>,
        conv: &Arc<Conv>,
        mut live: tokio::sync::MutexGuard<'_, Live>,
        record: &st::ConversationRecord,
        message_id: String,
        text: String,
        source: String,
        now: bool,
        blocks: Vec<st::ContentBlockRecord>,
    ) -> Result<c::SendMessageReply> {
        let id = conv.id.as_str();
        let record = record.clone();
        if record.title.is_empty() && record.message_count == 0 {
            let title = title_from(&text);
            if !title.is_empty() {
                self.store
                    .update(st::UpdateConversationRequest {
                        id: id.to_owned(),
                        title: Some(title),
                        ..Default::default()
                    })
                    .await?;
            }
        }
        if now {
            self.end_for_now(conv, &mut live).await;
        }
        // No turn in flight and none about to start: this message runs now, whatever waits in
        // a paused queue (stop, then redirect). A queue that is not paused is never passed.
        let idle = now || (live.next_start.is_none() && (live.paused || live.pending.is_empty()));
        let running = live.task.as_ref().map(|t| !t.finalized());
        if idle && running != Some(true) {
            self.unpause_empty(conv, &mut live).await;
        }
        match (idle, running) {
            (true, None) => {
                let (turn, user) = self.begin(conv, message_id, &text, &source, blocks).await?;
                live.task = Some(turn.clone());
                conv.sync(&live);
                drop(live);
                self.spawn_turns(conv.clone(), turn, text, Some(record));
                let q = self.pending(conv).await;
                Ok(c::SendMessageReply { outcome: Some(c::send_message_reply::Outcome::Message(user)), queue: Some(q) })
            }
            (true, Some(false)) => {
                // The last turn ended but its adapter is still stopping: this one starts next.
                let (turn, user) = self.begin(conv, message_id, &text, &source, blocks).await?;
                live.next_start = Some(Next { turn, text });
                conv.sync(&live);
                Ok(c::SendMessageReply {
                    outcome: Some(c::send_message_reply::Outcome::Message(user)),
                    queue: Some(queue(&live)),
                })
            }
            _ => {
                let bytes: usize = live.pending.iter().map(|p| p.text.len()).sum();
                if live.pending.len() >= MAX_PENDING {
                    return Err(Error::Exhausted(format!("the pending queue is full ({MAX_PENDING} items)")));
                }
                if bytes + text.len() > MAX_PENDING_BYTES {
                    return Err(Error::Exhausted(format!(
                        "the pending queue is full ({MAX_PENDING_BYTES} bytes of text at most)"
                    )));
                }
                let item = c::PendingItem { id: message_id, text, created_ms: now_ms(), source };
                live.pending.push(item.clone());
                if let Err(e) = self.store.set_pending(id, &live.pending, live.paused).await {
                    live.pending.pop();
                    return Err(e);
                }
                if !blocks.is_empty() {
                    live.attached.insert(item.id.clone(), blocks);
                }
                self.publish_queue(conv, &live).await;
                Ok(c::SendMessageReply {
                    outcome: Some(c::send_message_reply::Outcome::Pending(item)),
                    queue: Some(queue(&live)),
                })
            }
        }
    }

    /// Send-now's first half, under the conversation's lock: ends the turn in flight and the one
    /// about to start (if any) as `interrupted` (their adapters told to stop), without pausing
    /// the queue. Afterwards no turn is in flight: the caller's message starts next.
    async fn end_for_now(&self, conv: &Conv, live: &mut Live) {
        let interrupted = || Outcome::Done { stop_reason: "interrupted".into(), usage: Usage::default(), model: None };
        if let Some(turn) = live.task.clone().filter(|t| !t.finalized()) {
            turn.fire_interrupt();
            self.finish(conv, &turn, interrupted(), Pause::No).await;
        }
        if let Some(next) = live.next_start.take() {
            // Announced but not started: it never reaches the agent.
            next.turn.fire_interrupt();
            self.finish(conv, &next.turn, interrupted(), Pause::No).await;
        }
        conv.sync(live);
    }

    /// A message starts while the queue is paused with nothing in it: the pause held nothing,
    /// so it ends (persisted, `queue_changed`), and what is sent during this turn queues behind
    /// it as usual. A paused queue with items stays paused.
    async fn unpause_empty(&self, conv: &Conv, live: &mut Live) {
        if !live.paused || !live.pending.is_empty() {
            return;
        }
        if let Err(e) = self.store.set_pending(&conv.id, &[], false).await {
            tracing::warn!(conversation = %conv.id, error = %e, "Cannot persist the un-paused empty queue.");
            return;
        }
        live.paused = false;
        self.publish_queue(conv, live).await;
    }

    /// Starts a turn for a message sent to an idle conversation: see [`Engine::start_in_store`]
    /// and [`Engine::announce`].
    async fn begin(
        &self,
        conv: &Conv,
        user_id: String,
        text: &str,
        source: &str,
        attached: Vec<st::ContentBlockRecord>,
    ) -> Result<(Arc<TurnShared>, c::Message)> {
        let (user, assistant_id) = self
            .start_in_store(conv, user_id, text, source, "", attached)
            .await?
            .ok_or_else(|| Error::Internal("a new message's turn was found already run".into()))?;
        Ok(self.announce(conv, &user, assistant_id).await)
    }

    /// Stores a turn's start in one transaction (`StartTurn`): the user message `user_id`, the
    /// assistant message (`streaming`, no blocks) and, when `item` is set, that pending item's
    /// removal; retried while the store restarts (the same request: idempotent by `user_id`).
    /// The stored user message and the assistant message's id; `None` when the item's turn had
    /// run already (its assistant message is no longer `streaming`).
    ///
    /// # Errors
    /// The store's verdict, or its absence past [`Tuning::store_retry`]; nothing was stored then.
    async fn start_in_store(
        &self,
        conv: &Conv,
        user_id: String,
        text: &str,
        source: &str,
        item: &str,
        attached: Vec<st::ContentBlockRecord>,
    ) -> Result<Option<(st::MessageRecord, String)>> {
        let mut blocks = vec![text_block(text)];
        blocks.extend(attached);
        let user = st::MessageRecord {
            id: user_id,
            conversation_id: conv.id.clone(),
            role: st::MessageRole::User as i32,
            blocks,
            status: st::MessageStatus::Complete as i32,
            source: source.to_owned(),
            ..Default::default()
        };
        let assistant = st::MessageRecord {
            id: new_id(),
            conversation_id: conv.id.clone(),
            role: st::MessageRole::Assistant as i32,
            status: st::MessageStatus::Streaming as i32,
            ..Default::default()
        };
        let store = self.store.clone();
        let item = item.to_owned();
        let reply = self
            .retry("start the turn", &conv.id, move || {
                let (store, user, assistant, item) = (store.clone(), user.clone(), assistant.clone(), item.clone());
                async move { store.start_turn(user, assistant, &item).await }
            })
            .await?;
        self.watch.touch(&conv.id);
        match (reply.user, reply.assistant) {
            (Some(u), Some(a)) if !reply.already || a.status == st::MessageStatus::Streaming as i32 => {
                Ok(Some((u, a.id)))
            }
            _ => Ok(None),
        }
    }

    /// Publishes `message_created` (the turn's first event) for a turn whose start is stored.
    async fn announce(
        &self,
        conv: &Conv,
        user: &st::MessageRecord,
        assistant_id: String,
    ) -> (Arc<TurnShared>, c::Message) {
        let turn = TurnShared::new(user.id.clone(), assistant_id);
        let message = self.announce_turn(conv, &turn, user).await;
        (turn, message)
    }

    /// [`Engine::announce`] for a turn already made: publishes its `message_created`; the
    /// user message as sent.
    async fn announce_turn(&self, conv: &Conv, turn: &TurnShared, user: &st::MessageRecord) -> c::Message {
        let message = persist::message(user);
        let kind = Kind::MessageCreated(c::MessageCreated { message: Some(message.clone()) });
        self.publish(conv, &turn.turn_id, kind, Mark::Begin).await;
        message
    }

    /// Takes the first pending item as the next turn; `None` when the queue is empty or paused,
    /// or when the store would not start it (then the queue is paused with the item still
    /// first, and the owner resumes it). The item's id becomes its user message's id, so every
    /// attempt to start it is the same idempotent `StartTurn`.
    async fn take_pending(&self, conv: &Conv, live: &mut Live) -> Option<Next> {
        loop {
            if live.paused || live.pending.is_empty() {
                return None;
            }
            let item = live.pending[0].clone();
            self.pause_at(Step::TakePending, &conv.id).await;
            let attached = live.attached.get(&item.id).cloned().unwrap_or_default();
            match self.start_in_store(conv, item.id.clone(), &item.text, &item.source, &item.id, attached).await {
                Ok(Some((user, assistant_id))) => {
                    live.pending.remove(0);
                    live.attached.remove(&item.id);
                    self.pause_at(Step::PendingTaken, &conv.id).await;
                    // The item's turn is the conversation's task before the queue without it is
                    // shown: no snapshot shows the item neither queued nor running (a reader
                    // seeing "idle, queue empty" then would miss its stored message).
                    let turn = TurnShared::new(user.id.clone(), assistant_id);
                    live.task = Some(turn.clone());
                    self.publish_queue(conv, live).await;
                    self.announce_turn(conv, &turn, &user).await;
                    return Some(Next { turn, text: item.text });
                }
                Ok(None) => {
                    tracing::warn!(conversation = %conv.id, item = %item.id, "A pending item had already run; dropped.");
                    live.pending.remove(0);
                    self.publish_queue(conv, live).await;
                }
                Err(e) => {
                    tracing::error!(conversation = %conv.id, item = %item.id, error = %e,
                        "Cannot start the next pending item; the queue is paused.");
                    self.pause(conv, live).await;
                    self.publish_queue(conv, live).await;
                    return None;
                }
            }
        }
    }

    /// Runs the turn (and those after it) in a task of its own; `record` is the conversation as
    /// just read, when the caller has it (one store read less before `turn_started`).
    fn spawn_turns(
        self: &Arc<Self>,
        conv: Arc<Conv>,
        turn: Arc<TurnShared>,
        text: String,
        record: Option<st::ConversationRecord>,
    ) {
        let engine = self.clone();
        tokio::spawn(async move { engine.run_turns(conv, turn, text, record).await });
    }

    /// Runs turns until none is left to run: this one, then whatever was sent while it drained,
    /// then the pending queue (unless paused).
    async fn run_turns(
        self: Arc<Self>,
        conv: Arc<Conv>,
        mut turn: Arc<TurnShared>,
        mut text: String,
        mut record: Option<st::ConversationRecord>,
    ) {
        loop {
            self.run_turn(&conv, &turn, text, record.take()).await;
            let mut live = conv.live.lock().await;
            if conv.deleted() {
                return;
            }
            let next = match live.next_start.take() {
                Some(n) => Some(n),
                None => self.take_pending(&conv, &mut live).await,
            };
            match next {
                Some(n) => {
                    live.task = Some(n.turn.clone());
                    conv.sync(&live);
                    (turn, text) = (n.turn, n.text);
                }
                None => {
                    live.task = None;
                    conv.sync(&live);
                    // The task's end (its changed files stored) is the turn's last change: the
                    // list reads the conversation once more (also when the snapshot it shows
                    // ended with the turn, before the task drained).
                    self.watch.touch(&conv.id);
                    return;
                }
            }
        }
    }

    /// Pauses the queue after a turn error or an interrupt (persisted; `queue_changed` is
    /// published after the turn's terminal event).
    async fn pause(&self, conv: &Conv, live: &mut Live) {
        if !live.paused {
            live.paused = true;
            if let Err(e) = self.store.set_pending(&conv.id, &live.pending, true).await {
                tracing::warn!(conversation = %conv.id, error = %e, "Cannot persist the paused queue.");
            }
        }
    }

    /// Publishes a turn event folded into the assistant message by `fold`, unless the turn has
    /// ended (then nothing happens and `false` is returned).
    async fn turn_event(&self, conv: &Conv, turn: &TurnShared, kind: Kind, fold: impl FnOnce(&mut Acc)) -> bool {
        if conv.bus.ready(&self.store).await.is_err() {
            return false;
        }
        let published = {
            let mut acc = turn.acc();
            if acc.finalized {
                return false;
            }
            fold(&mut acc);
            conv.bus.try_publish(&turn.turn_id, kind.clone(), Mark::None).is_some()
        };
        if !published {
            self.publish(conv, &turn.turn_id, kind, Mark::None).await;
        }
        true
    }

    /// Ends the turn once: persists the assistant message (retried while the store restarts),
    /// writes the audit entry, pauses the queue as `pause` says, publishes `turn_done` or
    /// `turn_error` (then `queue_changed` when it paused). An answer the store would not take
    /// ends the turn in `turn_error` (`internal`) and pauses the queue: `turn_done` always
    /// names a stored message. `false` when the turn had ended already.
    async fn finish(&self, conv: &Conv, turn: &TurnShared, mut outcome: Outcome, mut pause: Pause<'_>) -> bool {
        let Some((mut blocks, acc_model, agent_key, connection)) = turn.claim() else { return false };
        if conv.deleted() {
            return true;
        }
        // What still waits for an answer is denied: the agent is stopping or gone.
        let closed_by = match &outcome {
            Outcome::Done { stop_reason, .. } if stop_reason == "interrupted" => approvals::by::INTERRUPT,
            _ => approvals::by::TURN_ENDED,
        };
        self.close_approvals(conv, Some(&turn.turn_id), closed_by, None).await;
        blocks.retain(|b| !matches!(&b.block, Some(Block::Text(t)) if t.is_empty()));
        if blocks.is_empty() {
            blocks.push(text_block(""));
        }
        let shape = |outcome: &Outcome| match outcome {
            Outcome::Done { stop_reason, usage, model } => {
                let status = if stop_reason == "interrupted" {
                    st::MessageStatus::Interrupted
                } else {
                    st::MessageStatus::Complete
                };
                (status, *usage, model.clone().unwrap_or_else(|| acc_model.clone()), String::new(), stop_reason.clone())
            }
            Outcome::Failed { message, .. } => {
                (st::MessageStatus::Failed, Usage::default(), acc_model.clone(), message.clone(), String::new())
            }
        };
        let record_of = |status: st::MessageStatus, usage, model: &str, error: String| st::MessageRecord {
            id: turn.assistant_message_id.clone(),
            conversation_id: conv.id.clone(),
            role: st::MessageRole::Assistant as i32,
            blocks: blocks.clone(),
            status: status as i32,
            usage: Some(persist::usage_record(usage)),
            model: model.to_owned(),
            error,
            agent_key: agent_key.clone(),
            connection: connection.clone(),
            ..Default::default()
        };
        let (mut status, mut usage, mut model, error, mut stop) = shape(&outcome);
        let record = record_of(status, usage, &model, error);
        self.pause_at(Step::FinalWrite, &conv.id).await;
        // After any checkpoint being written: the end is the last word.
        let _stored = turn.stored.lock().await;
        let store = self.store.clone();
        let written = {
            let record = record.clone();
            self.retry("store the answer", &conv.id, move || {
                let (store, record) = (store.clone(), record.clone());
                async move { store.update_message(record).await }
            })
            .await
        };
        let record = match written {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(conversation = %conv.id, turn = %turn.turn_id, error = %e,
                    "Cannot store the turn's answer; the turn ends in an error.");
                outcome = Outcome::Failed {
                    kind: FailureKind::Internal,
                    message: format!("the chat service could not store the answer: {e}"),
                };
                if matches!(pause, Pause::No) {
                    pause = Pause::Lock;
                }
                let error;
                (status, usage, model, error, stop) = shape(&outcome);
                record_of(status, usage, &model, error)
            }
        };
        turn.acc().final_record = Some(record.clone());
        let message = persist::message(&record);
        let (kind, outcome_word, detail_kind) = match outcome {
            Outcome::Done { stop_reason, usage, .. } => (
                Kind::TurnDone(c::TurnDone {
                    stop_reason,
                    usage: Some(persist::usage(persist::usage_record(usage))),
                    model: model.clone(),
                    message: Some(message),
                }),
                st::AuditOutcome::Ok,
                ("stop_reason", stop),
            ),
            Outcome::Failed { kind, message: text } => (
                Kind::TurnError(c::TurnError {
                    code: kind.as_str().to_owned(),
                    message: text,
                    message_record: Some(message),
                }),
                st::AuditOutcome::Error,
                ("code", kind.as_str().to_owned()),
            ),
        };
        let status_word = match status {
            st::MessageStatus::Interrupted => "interrupted",
            st::MessageStatus::Failed => "failed",
            _ => "complete",
        };
        let mut detail = serde_json::json!({
            "agent_key": agent_key,
            "turn_id": turn.turn_id,
            "message_id": turn.assistant_message_id,
            "status": status_word,
            "model": model,
            "input_tokens": usage.input_tokens,
            "output_tokens": usage.output_tokens,
        });
        detail[detail_kind.0] = serde_json::Value::String(detail_kind.1);
        let entry = st::AuditEntry {
            actor: "agent".into(),
            action: "chat.turn".into(),
            target: conv.id.clone(),
            outcome: outcome_word as i32,
            trace_id: coffer_runtime::grpc::current_trace().unwrap_or_default(),
            detail: detail.to_string(),
            ..Default::default()
        };
        if let Err(e) = self.store.audit(entry).await {
            tracing::warn!(conversation = %conv.id, error = %e, "Cannot write the turn's audit entry.");
        }
        let mut guard = None;
        let live = match pause {
            Pause::No => None,
            Pause::Held(l) => Some(l),
            Pause::Lock => Some(&mut **guard.insert(conv.live.lock().await)),
        };
        // The snapshot says the turn is over from here (it reads `final_record`, set above),
        // before its end event is out: a client that reads the conversation on `turn_done` does
        // not see it running while the adapter's task drains and the folder is compared
        // (`files_changed`). The end event touches the list's watch.
        if let Some(l) = live {
            self.pause(conv, l).await;
            conv.sync(l);
            self.publish(conv, &turn.turn_id, kind, Mark::End).await;
            self.publish_queue(conv, l).await;
        } else {
            self.publish(conv, &turn.turn_id, kind, Mark::End).await;
        }
        true
    }

    /// One turn, from the assistant message's creation to the end of its adapter's task.
    async fn run_turn(
        &self,
        conv: &Arc<Conv>,
        turn: &Arc<TurnShared>,
        text: String,
        record: Option<st::ConversationRecord>,
    ) {
        let failed = |kind, message: String| Outcome::Failed { kind, message };
        let record = match record {
            Some(r) => r,
            None => match self.retry("read the conversation", &conv.id, || self.store.get(&conv.id)).await {
                Ok(r) => r,
                Err(e) => {
                    tracing::error!(conversation = %conv.id, error = %e, "Cannot read the conversation for a turn.");
                    let m = "the chat service could not read the conversation".to_owned();
                    self.finish_error(conv, turn, failed(FailureKind::Internal, m)).await;
                    return;
                }
            },
        };
        turn.acc().agent_key = record.agent_key.clone();
        let mut config = persist::parse_config(&record.agent_config_json);
        turn.acc().model = config.model.clone();
        // What the turn changes in its folder: the snapshot is taken while the agent starts.
        let mut tracking = (!config.cwd.is_empty() && self.config().files_changed)
            .then(|| crate::changes::start(PathBuf::from(&config.cwd)));
        // The assistant message was stored `streaming` with the user message (`StartTurn`).
        let started = Kind::TurnStarted(c::TurnStarted {
            user_message_id: turn.user_message_id.clone(),
            assistant_message_id: turn.assistant_message_id.clone(),
            agent_key: record.agent_key.clone(),
        });
        self.publish(conv, &turn.turn_id, started, Mark::None).await;

        let cfg = self.config();
        let Some(entry) = self.registry.get(&record.agent_key) else {
            let m = format!("agent {} is not registered in this chat service", record.agent_key);
            self.finish_error(conv, turn, failed(FailureKind::CliMissing, m)).await;
            return;
        };
        if let Availability::Unavailable { reason } = self.registry.availability(entry, &cfg) {
            self.finish_error(conv, turn, failed(FailureKind::CliMissing, reason)).await;
            return;
        }
        // A bound agent's connection is resolved for each turn (a missing one fails the turn).
        let env = match self.registry.turn_env(entry, &cfg).await {
            Ok(env) => {
                turn.acc().connection = env.binding.as_ref().map(|b| b.connection.clone()).unwrap_or_default();
                env
            }
            Err(e) => {
                self.finish_error(conv, turn, failed(e.kind, e.message)).await;
                return;
            }
        };
        // The agent starts once the folder's snapshot is taken (bounded: a huge or slow tree does
        // not hold the turn; its snapshot then goes on beside the agent).
        if let Some(t) = tracking.as_mut()
            && !t.ready(crate::changes::SNAPSHOT_WAIT).await
        {
            tracing::warn!(conversation = %conv.id, wait_ms = crate::changes::SNAPSHOT_WAIT.as_millis() as u64,
                "The folder's snapshot is slow; the agent starts before it is complete.");
        }
        let (tx, mut rx) = mpsc::channel(ADAPTER_CHANNEL);
        // The message's files, read back from their folder (a queued one's too, after a restart).
        let files = attachments::list(Path::new(&config.cwd), &turn.user_message_id);
        let input = TurnInput {
            conversation_id: conv.id.clone(),
            turn_id: turn.turn_id.clone(),
            text: attachments::agent_text(&text, &files),
            config: config.clone(),
            attachments: files,
        };
        let running = match entry.provider.start_turn(&env, input, tx) {
            Ok(r) => r,
            Err(e) => {
                self.finish_error(conv, turn, failed(e.kind, e.message)).await;
                return;
            }
        };
        *turn.interrupt.lock().unwrap_or_else(|e| e.into_inner()) = Some(running.interrupt);
        let answers = running.approvals;
        if turn.interrupt_asked.load(Ordering::Acquire) {
            turn.fire_interrupt();
        }
        let mut task = running.task;
        let timeout = cfg.turn_timeout;
        loop {
            // While an approval request is open the agent is silent by design: the loop wakes
            // when the first one times out instead of the turn timeout.
            let expiry = if turn.finalized() { None } else { self.approval_expiry(conv) };
            let wait = match (turn.finalized(), expiry) {
                (true, _) => DRAIN,
                (false, Some(at)) => at.saturating_duration_since(tokio::time::Instant::now()),
                (false, None) => timeout,
            };
            let ev = tokio::select! {
                _ = turn.cancel.cancelled() => {
                    turn.fire_interrupt();
                    break;
                }
                ev = tokio::time::timeout(wait, rx.recv()) => ev,
            };
            match ev {
                Err(_) if turn.finalized() => break,
                Err(_) if expiry.is_some() => {
                    let now = tokio::time::Instant::now();
                    self.close_approvals(conv, Some(&turn.turn_id), approvals::by::TIMEOUT, Some(now)).await;
                }
                Err(_) => {
                    turn.fire_interrupt();
                    let m = format!("the agent produced no output for {} s (chat.turn_timeout_s)", timeout.as_secs());
                    self.finish_error(conv, turn, failed(FailureKind::Timeout, m)).await;
                    break;
                }
                Ok(None) => {
                    let m = "the agent ended without finishing the turn".to_owned();
                    self.finish_error(conv, turn, failed(FailureKind::CliExited, m)).await;
                    break;
                }
                Ok(Some(AgentEvent::ApprovalRequested(req))) => {
                    self.approval_requested(conv, turn, &config, *req, answers.as_ref()).await;
                }
                Ok(Some(ev)) => {
                    if self.handle(conv, turn, &mut config, ev).await {
                        break;
                    }
                }
            }
        }
        drop(rx);
        if tokio::time::timeout(DRAIN, &mut task).await.is_err() {
            tracing::warn!(conversation = %conv.id, turn = %turn.turn_id, "An adapter task did not end; aborted.");
            task.abort();
        }
        if let Some(tracking) = tracking {
            self.files_changed(conv, turn, tracking).await;
        }
    }

    /// After a turn's task ended: what it changed in its folder, stored on its assistant message
    /// (its diffs under `COFFER_HOME/chat/diffs`) and published as `files_changed` after the
    /// turn's end event. Nothing when the turn changed nothing, or the conversation is gone.
    async fn files_changed(&self, conv: &Conv, turn: &TurnShared, tracking: crate::changes::Pending) {
        if conv.deleted() || turn.cancel.is_cancelled() {
            return;
        }
        let t0 = std::time::Instant::now();
        let Some((changed, diffs)) = tracking.finish().await else { return };
        tracing::debug!(conversation = %conv.id, turn = %turn.turn_id, files = changed.files.len(),
            compare_ms = t0.elapsed().as_millis() as u64, "Compared the turn's folder.");
        if changed.is_empty() || conv.deleted() {
            return;
        }
        let message_id = turn.assistant_message_id.clone();
        if let Err(e) = self.diffs.put(&conv.id, &message_id, &diffs) {
            tracing::warn!(conversation = %conv.id, error = %e, "Cannot keep the turn's diffs.");
        }
        let record = turn.acc().final_record.clone();
        if let Some(mut record) = record {
            record.files_changed_json = changed.to_json();
            let store = self.store.clone();
            let written = self
                .retry("store the files changed", &conv.id, move || {
                    let (store, record) = (store.clone(), record.clone());
                    async move { store.update_message(record).await }
                })
                .await;
            if let Err(e) = written {
                tracing::warn!(conversation = %conv.id, error = %e, "Cannot store the turn's changed files.");
            }
        }
        let kind = Kind::FilesChanged(changed.to_proto(&message_id));
        self.publish(conv, &turn.turn_id, kind, Mark::None).await;
    }

    /// One file's diff of the turn that wrote `message_id` (`GetFileDiff`).
    ///
    /// # Errors
    /// [`Error::Invalid`] for a path outside the folder, [`Error::NotFound`] for a conversation,
    /// turn or file with no diff kept.
    pub async fn file_diff(&self, conversation_id: &str, message_id: &str, path: &str) -> Result<String> {
        check_id("conversation_id", conversation_id)?;
        check_id("message_id", message_id)?;
        self.conv(conversation_id).await?;
        let diffs = self.diffs.clone();
        let (c, m, p) = (conversation_id.to_owned(), message_id.to_owned(), path.to_owned());
        let got = tokio::task::spawn_blocking(move || diffs.get(&c, &m, &p))
            .await
            .map_err(|e| Error::Internal(format!("reading the diff: {e}")))?;
        got.map_err(|e| match e {
            crate::changes::DiffError::BadPath(_) => Error::Invalid(e.to_string()),
            _ => Error::NotFound(e.to_string()),
        })
    }

    /// `GetAttachment`: the saved file `name` of message `message_id` (a message of this
    /// conversation) as (type, bytes). Only a name recorded in one of that message's
    /// `attachment` blocks is served (a file planted in its folder by anyone else is not), then
    /// [`crate::attachments::read`] says which files are read.
    ///
    /// # Errors
    /// [`Error::Invalid`] for a bad id or name; [`Error::NotFound`] for an unknown conversation,
    /// a message of another conversation, a name the message does not record, or a file that is
    /// not served.
    pub async fn attachment(&self, conversation_id: &str, message_id: &str, name: &str) -> Result<(String, Vec<u8>)> {
        check_id("conversation_id", conversation_id)?;
        check_id("message_id", message_id)?;
        let record = self.store.get(conversation_id).await?;
        // The store answers NOT_FOUND for a cursor that is not a message of this conversation;
        // an inclusive one-message page from it is the message itself.
        let no_message = || Error::NotFound(format!("no message {message_id} in conversation {conversation_id}"));
        let page = st::ListMessagesRequest {
            conversation_id: conversation_id.to_owned(),
            after_id: message_id.to_owned(),
            limit: 1,
            newest: false,
            inclusive: true,
        };
        let page = self.store.messages(page).await.map_err(|e| match e {
            Error::Store(s) if s.code() == tonic::Code::NotFound => no_message(),
            e => e,
        })?;
        let message = page.messages.into_iter().find(|m| m.id == message_id).ok_or_else(no_message)?;
        let recorded = message.blocks.iter().any(|b| matches!(&b.block, Some(Block::Attachment(a)) if a.name == name));
        if !recorded {
            // Checked first for its own message: a bad name stays a 400 naming it.
            attachments::check_name(name).map_err(|e| Error::Invalid(e.to_string()))?;
            return Err(Error::NotFound(format!(
                "message {message_id} has no attachment named {:?}",
                name.chars().take(80).collect::<String>()
            )));
        }
        let cwd = PathBuf::from(persist::parse_config(&record.agent_config_json).cwd);
        let (m, n) = (message_id.to_owned(), name.to_owned());
        let read = tokio::task::spawn_blocking(move || attachments::read(&cwd, &m, &n))
            .await
            .map_err(|e| Error::Internal(format!("reading an attachment: {e}")))?;
        read.map_err(|e| match e {
            attachments::ReadError::BadName(_) => Error::Invalid(e.to_string()),
            attachments::ReadError::NotFound(_) => Error::NotFound(e.to_string()),
        })
    }

    /// Stores the streaming answer's blocks so far, at most every [`CHECKPOINT_EVERY`] (called
    /// after each text, tool call and tool result): when this service dies mid-turn, the store
    /// marks the answer failed at the next start and it keeps the text that had streamed up to
    /// the last checkpoint (the console shows it after a reload, with the failure). Nothing
    /// once the turn has ended or the conversation is deleted; a failed write is only logged
    /// (the turn's end writes the whole answer again).
    async fn checkpoint(&self, conv: &Conv, turn: &TurnShared) {
        let Ok(mut last) = turn.stored.try_lock() else { return };
        if last.elapsed() < CHECKPOINT_EVERY || conv.deleted() {
            return;
        }
        let record = {
            let acc = turn.acc();
            if acc.finalized {
                return;
            }
            st::MessageRecord {
                id: turn.assistant_message_id.clone(),
                conversation_id: conv.id.clone(),
                role: st::MessageRole::Assistant as i32,
                blocks: acc.blocks.clone(),
                status: st::MessageStatus::Streaming as i32,
                model: acc.model.clone(),
                ..Default::default()
            }
        };
        *last = std::time::Instant::now();
        if let Err(e) = self.store.update_message(record).await {
            tracing::debug!(conversation = %conv.id, error = %e, "Cannot store the streaming answer so far.");
        }
    }

    /// Ends the turn with an error and pauses the queue.
    async fn finish_error(&self, conv: &Conv, turn: &TurnShared, outcome: Outcome) {
        self.finish(conv, turn, outcome, Pause::Lock).await;
    }

    /// Handles one adapter event; `true` when it ended the turn.
    async fn handle(&self, conv: &Conv, turn: &TurnShared, config: &mut AgentConfig, ev: AgentEvent) -> bool {
        match ev {
            AgentEvent::Session { session_id, model } => {
                if let Some(m) = model {
                    turn.acc().model = m;
                }
                if !session_id.is_empty() && session_id != config.session_id && !conv.deleted() {
                    config.session_id = session_id;
                    if let Err(e) = self.store.set_config(&conv.id, config).await {
                        tracing::warn!(conversation = %conv.id, error = %e, "Cannot persist the agent session id.");
                    }
                }
                false
            }
            AgentEvent::TextDelta(t) => {
                let kind = Kind::TextDelta(c::TextDelta { text: t.clone() });
                self.turn_event(conv, turn, kind, |acc| match acc.blocks.last_mut() {
                    Some(st::ContentBlockRecord { block: Some(Block::Text(s)) }) => s.push_str(&t),
                    _ => acc.blocks.push(text_block(t.clone())),
                })
                .await;
                self.checkpoint(conv, turn).await;
                false
            }
            AgentEvent::ToolCall { id, name, input } => {
                let input_json = input.to_string();
                let kind = Kind::ToolCall(c::ToolCall {
                    tool_use_id: id.clone(),
                    name: name.clone(),
                    input_json: input_json.clone(),
                });
                self.turn_event(conv, turn, kind, |acc| {
                    acc.blocks.push(st::ContentBlockRecord {
                        block: Some(Block::ToolUse(st::ToolUseRecord { id, name, input_json })),
                    });
                })
                .await;
                self.checkpoint(conv, turn).await;
                false
            }
            AgentEvent::ToolResult { tool_use_id, output, is_error } => {
                let output = cut(&output, MAX_TOOL_OUTPUT_BYTES).to_owned();
                let kind = Kind::ToolResult(c::ToolResultEvent {
                    tool_use_id: tool_use_id.clone(),
                    output: output.clone(),
                    is_error,
                });
                self.turn_event(conv, turn, kind, |acc| {
                    acc.blocks.push(st::ContentBlockRecord {
                        block: Some(Block::ToolResult(st::ToolResultRecord { tool_use_id, output, is_error })),
                    });
                })
                .await;
                self.checkpoint(conv, turn).await;
                false
            }
            AgentEvent::Done { stop_reason, usage, model } => {
                let pause = if stop_reason == "interrupted" { Pause::Lock } else { Pause::No };
                self.finish(conv, turn, Outcome::Done { stop_reason, usage, model }, pause).await;
                true
            }
            AgentEvent::Failed { kind, message } => {
                self.finish_error(conv, turn, Outcome::Failed { kind, message }).await;
                true
            }
            // Handled by the turn loop, which holds the answer channel.
            AgentEvent::ApprovalRequested(_) => false,
        }
    }

    /// `SetPending`: replaces the queue (new ids for items without), un-pauses unless `paused`,
    /// broadcasts `queue_changed`, starts the next turn when idle.
    ///
    /// # Errors
    /// [`Error::Invalid`] for an item's text, [`Error::Exhausted`] beyond the limits,
    /// [`Error::NotFound`], store failures.
    pub async fn set_pending(
        self: &Arc<Self>,
        id: &str,
        items: Vec<c::PendingItem>,
        paused: bool,
    ) -> Result<c::PendingQueue> {
        for (i, it) in items.iter().enumerate() {
            check_text(&format!("items[{i}].text"), &it.text)?;
        }
        if items.len() > MAX_PENDING {
            return Err(Error::Exhausted(format!("{} pending items is over the limit of {MAX_PENDING}", items.len())));
        }
        let bytes: usize = items.iter().map(|p| p.text.len()).sum();
        if bytes > MAX_PENDING_BYTES {
            return Err(Error::Exhausted(format!(
                "{bytes} bytes of pending text is over the limit of {MAX_PENDING_BYTES}"
            )));
        }
        let conv = self.conv(id).await?;
        let mut live = conv.live.lock().await;
        if conv.deleted() {
            return Err(Error::NotFound(format!("conversation {id} not found")));
        }
        let now = now_ms();
        // An item kept by id keeps when and from where it was sent (a caller sends id and text).
        let kept: HashMap<&str, &c::PendingItem> = live.pending.iter().map(|p| (p.id.as_str(), p)).collect();
        let items: Vec<c::PendingItem> = items
            .into_iter()
            .map(|mut p| {
                if let Some(old) = kept.get(p.id.as_str()) {
                    if p.created_ms == 0 {
                        p.created_ms = old.created_ms;
                    }
                    if p.source.is_empty() {
                        p.source.clone_from(&old.source);
                    }
                }
                if p.id.is_empty() {
                    p.id = new_id();
                }
                if p.created_ms == 0 {
                    p.created_ms = now;
                }
                p
            })
            .collect();
        self.store.set_pending(id, &items, paused).await?;
        live.attached.retain(|k, _| items.iter().any(|p| &p.id == k));
        live.pending = items;
        live.paused = paused;
        self.publish_queue(&conv, &live).await;
        if live.task.is_none()
            && live.next_start.is_none()
            && let Some(next) = self.take_pending(&conv, &mut live).await
        {
            live.task = Some(next.turn.clone());
            conv.sync(&live);
            drop(live);
            self.spawn_turns(conv.clone(), next.turn, next.text, None);
            return Ok(self.pending(&conv).await);
        }
        // As it is now: an item the store would not start left the queue paused.
        Ok(queue(&live))
    }

    /// `Interrupt`: ends the in-flight turn (or the one about to start) at once (its partial
    /// message persisted `interrupted`, `turn_done{interrupted}` published), tells the adapter
    /// to stop, pauses the queue. `false` when no turn was in flight.
    ///
    /// # Errors
    /// [`Error::NotFound`].
    pub async fn interrupt(&self, id: &str) -> Result<bool> {
        let conv = self.conv(id).await?;
        let mut live = conv.live.lock().await;
        // The turn in flight, else one announced to start once the last one's task drained
        // (lists show it running: stopping it must stop it). What waits for an answer is denied
        // (`interrupt`) once the turn is claimed, in `finish`.
        let turn = match live.task.clone().filter(|t| !t.finalized()) {
            Some(t) => t,
            None => match live.next_start.take() {
                Some(next) => next.turn,
                None => return Ok(false),
            },
        };
        turn.fire_interrupt();
        let done = Outcome::Done { stop_reason: "interrupted".into(), usage: Usage::default(), model: None };
        Ok(self.finish(&conv, &turn, done, Pause::Held(&mut live)).await)
    }

    /// `DeleteConversation`: cancels the in-flight turn, tears down the provider's state, deletes
    /// every row, ends every subscription with `reset{deleted}`. Whether a turn was cancelled.
    ///
    /// # Errors
    /// [`Error::NotFound`], store failures.
    pub async fn delete(&self, id: &str) -> Result<bool> {
        let conv = self.conv(id).await?;
        let record = self.store.get(id).await?;
        let mut live = conv.live.lock().await;
        conv.deleted.store(true, Ordering::Release);
        let mut cancelled = false;
        for t in live.task.iter().chain(live.next_start.as_ref().map(|n| &n.turn)) {
            cancelled |= !t.finalized();
            t.acc().finalized = true;
            t.cancel.cancel();
        }
        live.next_start = None;
        live.pending.clear();
        if let Some(entry) = self.registry.get(&record.agent_key) {
            entry.provider.forget(&self.registry.env(entry, &self.config()), id);
        }
        let result = self.store.delete(id).await;
        if result.is_ok() {
            self.diffs.remove_conversation(id);
        }
        conv.bus.close(bus::reason::DELETED);
        self.convs().remove(id);
        self.watch.touch(id);
        result.map(|_| cancelled)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn titles_come_from_the_first_line_cut_at_a_word() {
        assert_eq!(title_from("\n  Fix the build  \nmore"), "Fix the build");
        let long = "word ".repeat(30);
        let t = title_from(&long);
        assert!(t.chars().count() <= AUTO_TITLE_CHARS && t.ends_with("word"), "{t:?}");
        let one = "x".repeat(100);
        assert_eq!(title_from(&one).chars().count(), AUTO_TITLE_CHARS, "one long word is cut");
        let cjk = "数".repeat(90);
        assert_eq!(title_from(&cjk).chars().count(), AUTO_TITLE_CHARS, "characters, not bytes");
        let exact = format!("{} tail", "a".repeat(80));
        assert_eq!(title_from(&exact), "a".repeat(80), "a boundary right after the limit");
        assert_eq!(title_from("   \n\n"), "");
    }

    #[test]
    fn texts_ids_and_cwds_are_checked() {
        assert!(check_text("text", "a").is_ok());
        assert!(check_text("text", &"a".repeat(MAX_TEXT_BYTES)).is_ok());
        let e = check_text("text", &"a".repeat(MAX_TEXT_BYTES + 1)).unwrap_err().to_string();
        assert!(e.contains("1 MiB") && e.contains("text"), "{e}");
        assert!(check_text("text", "").unwrap_err().to_string().contains("empty"));
        assert!(check_source("channel:telegram").is_ok() && check_source("").is_ok());
        assert!(check_source("a b").is_err() && check_source(&"x".repeat(81)).is_err() && check_source("\n").is_err());
        assert!(check_id("id", &new_id()).is_ok());
        for bad in ["", "x", "../../etc/passwd", &new_id().to_lowercase(), "01ARZ3NDEKTSV4RRFFQ69G5FA/"] {
            assert!(check_id("id", bad).is_err(), "{bad:?}");
        }
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, "x").unwrap();
        let e = check_cwd(dir.path(), "relative/path").unwrap_err().to_string();
        assert!(e.contains("absolute"), "{e}");
        let e = check_cwd(dir.path(), file.to_str().unwrap()).unwrap_err().to_string();
        assert!(e.contains("not a directory"), "{e}");
        let e = check_cwd(dir.path(), "/does/not/exist").unwrap_err().to_string();
        assert!(e.contains("does not exist"), "{e}");
        let d = check_cwd(dir.path(), "").unwrap();
        assert!(Path::new(&d).is_dir() && d.ends_with("workspace"), "{d}");
        assert_eq!(cut("héllo", 2), "h");
    }
}
