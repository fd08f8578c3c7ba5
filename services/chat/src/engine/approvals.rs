//! Approvals: an agent's request to act (permission mode `ask`) becomes an `approval_requested`
//! event whose `number` is its own seq, waits in the conversation's [`Book`] until the first
//! answer (any surface: [`Engine::answer_approval`]), the timeout (`chat.approval_timeout_s`),
//! an interrupt or the turn's end decides it, and ends with `approval_resolved` and an audit
//! entry (`chat.approval`). The adapter gets the decision on its turn's answer channel
//! ([`crate::adapter::RunningTurn::approvals`]).
//!
//! Rules, in one place:
//! - **Mode.** `read_only`: every request is denied at once, without an event (the agent is
//!   told the conversation is read-only). `ask` and `bypass` (an agent that asks anyway, e.g. the
//!   scripted test agent): the owner decides.
//! - **Allow always.** An `allow_always` answer allows the request and remembers its tool for the
//!   conversation: the next request of that tool is allowed at once (audited, no event). The
//!   tool is persisted through the store (`AllowTool`) before the agent is told, and loaded with
//!   the conversation, so a restart of the chat service keeps it; a change of the permission
//!   mode and [`Engine::forget_allowed_tools`] forget them (`ConversationView.allowed_tools`
//!   lists them); a delete takes them with the conversation.
//! - **First answer wins.** A decided request moves to a small list of recent decisions
//!   ([`KEEP_DECIDED`] per conversation); answering it again is [`Error::AlreadyDecided`] with
//!   the first decision. A number this process never handed out for an approval is
//!   [`Error::NotFound`] (one from before a restart says so: its turn failed then).
//! - **Ends.** The timeout denies with a message to the agent ("no answer within 10 minutes"),
//!   `decided_by: timeout`; an interrupt denies what is open (`interrupt`) as the turn ends (the
//!   agent is told to stop at the same time); a turn that ends otherwise with requests open
//!   resolves them `turn_ended`, and a request that comes after the turn ended is denied at once;
//!   a delete drops them (the bus is closed).
//! - **Live state.** `Conversation.approvals_waiting` and `ConversationView.approvals` come from
//!   the book; every change touches the conversation list's watch.
use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use coffer_proto::chat::{self as c, event::Kind};
use coffer_proto::store as st;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{Conv, Engine, TurnShared, check_id, check_source, now_ms};
use crate::adapter::{AgentConfig, ApprovalAnswer, ApprovalRequest, PermissionMode};
use crate::bus::Mark;
use crate::error::{Error, Result};

/// Longest message told to the agent with a deny, bytes.
pub const MAX_MESSAGE_BYTES: usize = 4096;
/// Longest diff shown with a request, bytes (cut at a line, with a note).
pub const MAX_DIFF_BYTES: usize = 16 << 10;
/// Longest summary line, characters.
pub const MAX_SUMMARY_CHARS: usize = 200;
/// Longest tool input kept with a request, bytes (a larger one is shown cut, as a string).
pub const MAX_INPUT_BYTES: usize = 64 << 10;
/// Decided requests remembered per conversation (for "already decided" answers).
pub const KEEP_DECIDED: usize = 256;

/// `decided_by` of the decisions no surface made.
pub mod by {
    /// Nobody answered within `chat.approval_timeout_s`.
    pub const TIMEOUT: &str = "timeout";
    /// The turn was interrupted while the request was open.
    pub const INTERRUPT: &str = "interrupt";
    /// The turn ended while the request was open.
    pub const TURN_ENDED: &str = "turn_ended";
    /// The conversation is read-only.
    pub const READ_ONLY: &str = "read_only";
    /// The tool was allowed "always" earlier in this conversation.
    pub const REMEMBERED: &str = "remembered";
}

/// An answer's decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Allow,
    AllowAlways,
    Deny,
}

impl Decision {
    /// The words a caller may send.
    pub const WORDS: [&'static str; 3] = ["allow", "allow_always", "deny"];

    /// Its word.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Allow => "allow",
            Self::AllowAlways => "allow_always",
            Self::Deny => "deny",
        }
    }

    /// The decision of a word.
    ///
    /// # Errors
    /// [`Error::Invalid`] naming `decision` and the allowed words.
    pub fn parse(word: &str) -> Result<Self> {
        match word {
            "allow" => Ok(Self::Allow),
            "allow_always" => Ok(Self::AllowAlways),
            "deny" => Ok(Self::Deny),
            other => Err(Error::Invalid(format!(
                "decision: {:?} is not one of {}",
                other.chars().take(40).collect::<String>(),
                Self::WORDS.join(", ")
            ))),
        }
    }
}

/// One open request.
struct Open {
    approval: c::Approval,
    request_id: String,
    turn_id: String,
    answers: mpsc::Sender<ApprovalAnswer>,
    expires: Instant,
}

/// A conversation's approvals: the open requests, the recent decisions, the tools allowed
/// always.
#[derive(Default)]
pub struct Book {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    open: BTreeMap<u64, Open>,
    decided: VecDeque<c::ApprovalResolved>,
    /// The tools allowed always, by name.
    always: BTreeMap<String, c::AllowedTool>,
}

impl Book {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many requests wait for an answer.
    pub fn waiting(&self) -> u32 {
        self.lock().open.len() as u32
    }

    /// The open requests, oldest first.
    pub fn open(&self) -> Vec<c::Approval> {
        self.lock().open.values().map(|o| o.approval.clone()).collect()
    }

    /// When the first open request times out.
    fn next_expiry(&self) -> Option<Instant> {
        self.lock().open.values().map(|o| o.expires).min()
    }

    fn remembered(&self, tool: &str) -> bool {
        self.lock().always.contains_key(tool)
    }

    /// The tools allowed always, by name.
    pub fn allowed(&self) -> Vec<c::AllowedTool> {
        self.lock().always.values().cloned().collect()
    }

    /// Adds tools allowed always (the stored ones, when the conversation is loaded).
    pub fn load(&self, tools: impl IntoIterator<Item = c::AllowedTool>) {
        let mut inner = self.lock();
        for t in tools {
            inner.always.insert(t.tool.clone(), t);
        }
    }

    /// Forgets the tools allowed always; how many there were.
    fn forget(&self) -> usize {
        std::mem::take(&mut self.lock().always).len()
    }

    /// Takes open request `number` and records `resolved` as its decision (first wins).
    fn take(&self, resolved: &c::ApprovalResolved) -> std::result::Result<Open, Option<c::ApprovalResolved>> {
        let mut inner = self.lock();
        match inner.open.remove(&resolved.number) {
            Some(open) => {
                if resolved.decision == Decision::AllowAlways.as_str() {
                    let tool = c::AllowedTool {
                        tool: open.approval.tool.clone(),
                        decided_by: resolved.decided_by.clone(),
                        actor: resolved.actor.clone(),
                        allowed_ms: now_ms(),
                    };
                    inner.always.insert(tool.tool.clone(), tool);
                }
                inner.decided.push_back(resolved.clone());
                if inner.decided.len() > KEEP_DECIDED {
                    inner.decided.pop_front();
                }
                Ok(open)
            }
            None => Err(inner.decided.iter().find(|d| d.number == resolved.number).cloned()),
        }
    }

    /// The numbers of the open requests (of `turn_id` when given) that match `due`.
    fn numbers(&self, turn_id: Option<&str>, due: Option<Instant>) -> Vec<u64> {
        self.lock()
            .open
            .iter()
            .filter(|(_, o)| turn_id.is_none_or(|t| o.turn_id == t))
            .filter(|(_, o)| due.is_none_or(|d| o.expires <= d))
            .map(|(n, _)| *n)
            .collect()
    }
}

/// "10 minutes", "1 minute", "90 s": a timeout for the agent and the owner.
pub fn human(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        60 => "1 minute".to_owned(),
        s if s % 60 == 0 => format!("{} minutes", s / 60),
        s => format!("{s} s"),
    }
}

/// The one-line summary of a request: `Bash: <command>`, `Edit: <path>`, `Write: <path>`,
/// `Codex shell: <command>`…; otherwise the tool and its input, cut to [`MAX_SUMMARY_CHARS`].
pub fn summary(tool: &str, input: &Value) -> String {
    let s = |k: &str| input.get(k).and_then(Value::as_str);
    let detail = match tool {
        "Bash" | "shell" => s("command").map(str::to_owned).or_else(|| {
            input
                .get("command")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(" "))
        }),
        "Edit" | "MultiEdit" | "Write" | "NotebookEdit" | "Read" => {
            s("file_path").or_else(|| s("notebook_path")).map(str::to_owned)
        }
        "apply_patch" => {
            input.get("changes").and_then(Value::as_object).map(|m| m.keys().cloned().collect::<Vec<_>>().join(", "))
        }
        "WebFetch" => s("url").map(str::to_owned),
        "WebSearch" => s("query").map(str::to_owned),
        _ => None,
    }
    .unwrap_or_else(|| match input {
        Value::Object(m) if m.is_empty() => String::new(),
        Value::Null => String::new(),
        v => v.to_string(),
    });
    let line: String = detail.split_whitespace().collect::<Vec<_>>().join(" ");
    let full = if line.is_empty() { tool.to_owned() } else { format!("{tool}: {line}") };
    if full.chars().count() <= MAX_SUMMARY_CHARS {
        return full;
    }
    let mut cut: String = full.chars().take(MAX_SUMMARY_CHARS - 1).collect();
    cut.push('…');
    cut
}

/// A unified diff of one edit: `old` → `new` of `path` as one hunk (the common first and last
/// lines kept as context, at most 3 each).
pub fn one_hunk(path: &str, old: &str, new: &str) -> String {
    let a: Vec<&str> = old.lines().collect();
    let b: Vec<&str> = new.lines().collect();
    let head = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let tail = a[head..].iter().rev().zip(b[head..].iter().rev()).take_while(|(x, y)| x == y).count();
    let ctx_before = head.min(3);
    let ctx_after = tail.min(3);
    let start = head - ctx_before;
    let a_end = a.len() - tail + ctx_after;
    let b_end = b.len() - tail + ctx_after;
    let mut out = format!("--- a/{path}\n+++ b/{path}\n");
    let range = |from: usize, len: usize| if len == 0 { format!("{from},0") } else { format!("{},{len}", from + 1) };
    out.push_str(&format!("@@ -{} +{} @@\n", range(start, a_end - start), range(start, b_end - start)));
    for l in &a[start..head] {
        out.push_str(&format!(" {l}\n"));
    }
    for l in &a[head..a.len() - tail] {
        out.push_str(&format!("-{l}\n"));
    }
    for l in &b[head..b.len() - tail] {
        out.push_str(&format!("+{l}\n"));
    }
    for l in &a[a.len() - tail..a_end] {
        out.push_str(&format!(" {l}\n"));
    }
    out
}

/// The diff shown with a request: the adapter's own, or one rendered for Claude Code's Edit
/// (`old_string` → `new_string`), MultiEdit (each edit) and Write (a new file's `content`);
/// cut at a line to [`MAX_DIFF_BYTES`]. `None` for other tools.
pub fn diff(tool: &str, input: &Value, given: Option<String>) -> Option<String> {
    let s = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).unwrap_or_default().to_owned();
    let path = s(input, "file_path");
    let d = given.or_else(|| match tool {
        "Edit" => Some(one_hunk(&path, &s(input, "old_string"), &s(input, "new_string"))),
        "MultiEdit" => input
            .get("edits")
            .and_then(Value::as_array)
            .map(|edits| edits.iter().map(|e| one_hunk(&path, &s(e, "old_string"), &s(e, "new_string"))).collect()),
        "Write" => Some(one_hunk(&path, "", &s(input, "content"))),
        _ => None,
    })?;
    if d.len() <= MAX_DIFF_BYTES {
        return Some(d);
    }
    let mut end = MAX_DIFF_BYTES;
    while !d.is_char_boundary(end) {
        end -= 1;
    }
    let end = d[..end].rfind('\n').map_or(end, |i| i + 1);
    Some(format!("{}… (diff cut at {} KiB)\n", &d[..end], MAX_DIFF_BYTES >> 10))
}

/// The audit actor word of a `decided_by` (`proto/store_audit.proto`: cli | api | ui | channel |
/// daemon).
fn audit_actor(decided_by: &str) -> &'static str {
    match decided_by {
        "web" | "ui" => "ui",
        "cli" => "cli",
        "api" => "api",
        d if d.starts_with("channel") => "channel",
        _ => "daemon",
    }
}

impl Engine {
    /// The open approval requests of `conv` (`ConversationView.approvals`).
    pub fn approvals(&self, conv: &Conv) -> Vec<c::Approval> {
        conv.approvals.open()
    }

    /// When the first open request of `conv` times out (the turn loop waits at most until then).
    pub(super) fn approval_expiry(&self, conv: &Conv) -> Option<Instant> {
        conv.approvals.next_expiry()
    }

    /// An adapter's request: decided at once (`read_only`, a tool allowed always) or published
    /// and kept open until answered.
    pub(super) async fn approval_requested(
        &self,
        conv: &Conv,
        turn: &TurnShared,
        config: &AgentConfig,
        req: ApprovalRequest,
        answers: Option<&mpsc::Sender<ApprovalAnswer>>,
    ) {
        let Some(answers) = answers else {
            tracing::warn!(conversation = %conv.id, tool = %req.tool, "An agent asked for approval without an answer channel.");
            return;
        };
        let quick = match config.permission_mode {
            _ if turn.finalized() => {
                Some((Decision::Deny, "The turn has ended: the action is denied.".to_owned(), by::TURN_ENDED))
            }
            PermissionMode::ReadOnly => Some((
                Decision::Deny,
                format!(
                    "This conversation is read-only: {} is not allowed. Tell the user what you would do instead.",
                    req.tool
                ),
                by::READ_ONLY,
            )),
            _ if conv.approvals.remembered(&req.tool) => Some((Decision::Allow, String::new(), by::REMEMBERED)),
            _ => None,
        };
        if let Some((decision, message, decided_by)) = quick {
            let answer =
                ApprovalAnswer { request_id: req.request_id.clone(), allow: decision != Decision::Deny, message };
            let _ = answers.send(answer.clone()).await;
            let resolved = c::ApprovalResolved {
                number: 0,
                decision: decision.as_str().to_owned(),
                message: answer.message,
                decided_by: decided_by.to_owned(),
                actor: String::new(),
            };
            self.audit_approval(conv, &turn.turn_id, &req.tool, &resolved).await;
            return;
        }
        let input = if req.input.to_string().len() > MAX_INPUT_BYTES {
            Value::String(super::cut(&req.input.to_string(), MAX_INPUT_BYTES).to_owned())
        } else {
            req.input.clone()
        };
        let timeout = self.config().approval_timeout;
        let now = now_ms();
        let approval = c::Approval {
            number: 0,
            tool: req.tool.clone(),
            summary: summary(&req.tool, &req.input),
            input_json: input.to_string(),
            diff: diff(&req.tool, &req.input, req.diff.clone()).unwrap_or_default(),
            cwd: req.cwd.clone().unwrap_or_else(|| config.cwd.clone()),
            requested_ms: now,
            expires_ms: now + timeout.as_millis() as i64,
        };
        let expires = Instant::now() + timeout;
        let book = &conv.approvals;
        let published = conv
            .bus
            .publish_with(
                &self.store,
                &turn.turn_id,
                |seq| {
                    let approval = c::Approval { number: seq, ..approval.clone() };
                    // Kept open before anyone can see the event: an answer never misses it.
                    book.lock().open.insert(
                        seq,
                        Open {
                            approval: approval.clone(),
                            request_id: req.request_id.clone(),
                            turn_id: turn.turn_id.clone(),
                            answers: answers.clone(),
                            expires,
                        },
                    );
                    Kind::ApprovalRequested(c::ApprovalRequested { approval: Some(approval) })
                },
                Mark::None,
            )
            .await;
        match published {
            Ok(Some(number)) => {
                tracing::info!(conversation = %conv.id, number, tool = %req.tool, "An agent asks for approval.");
                conv.sync_approvals();
            }
            Ok(None) => {}
            Err(e) => {
                tracing::error!(conversation = %conv.id, error = %e, "Cannot publish an approval request; denied.");
                let message = "Coffer could not show this request to the user; it is denied.".to_owned();
                let _ = answers.send(ApprovalAnswer { request_id: req.request_id, allow: false, message }).await;
            }
        }
    }

    /// `AnswerApproval`: the first answer to request `number` decides it; the adapter is told,
    /// `approval_resolved` published, the decision audited.
    ///
    /// # Errors
    /// [`Error::Invalid`] for a bad id, decision word, message or source; [`Error::NotFound`]
    /// for a request this conversation does not have open or recently decided;
    /// [`Error::AlreadyDecided`] with the first decision.
    pub async fn answer_approval(&self, r: c::AnswerApprovalRequest) -> Result<c::ApprovalResolved> {
        check_id("conversation_id", &r.conversation_id)?;
        let decision = Decision::parse(&r.decision)?;
        if r.message.len() > MAX_MESSAGE_BYTES {
            return Err(Error::Invalid(format!(
                "message: {} bytes is over the limit of {MAX_MESSAGE_BYTES} bytes",
                r.message.len()
            )));
        }
        check_source(&r.source)?;
        if r.actor.len() > 200 || r.actor.chars().any(char::is_control) {
            return Err(Error::Invalid("actor: at most 200 bytes without control characters".into()));
        }
        let source = if r.source.is_empty() { "api".to_owned() } else { r.source };
        let conv = self.conv(&r.conversation_id).await?;
        let message = match decision {
            Decision::Deny if r.message.trim().is_empty() => "The user denied this action.".to_owned(),
            Decision::Deny => r.message.trim().to_owned(),
            _ => String::new(),
        };
        let resolved = c::ApprovalResolved {
            number: r.number,
            decision: decision.as_str().to_owned(),
            message,
            decided_by: source,
            actor: r.actor,
        };
        self.resolve(&conv, resolved).await
    }

    /// Decides open request `resolved.number` of `conv`: tells the adapter, publishes
    /// `approval_resolved`, audits.
    ///
    /// # Errors
    /// [`Error::NotFound`], [`Error::AlreadyDecided`].
    async fn resolve(&self, conv: &Conv, resolved: c::ApprovalResolved) -> Result<c::ApprovalResolved> {
        let open = match conv.approvals.take(&resolved) {
            Ok(open) => open,
            Err(Some(first)) => {
                return Err(Error::AlreadyDecided(
                    format!(
                        "approval {} was already decided: {} by {}",
                        first.number, first.decision, first.decided_by
                    ),
                    Box::new(first),
                ));
            }
            Err(None) => {
                let floor = conv.bus.floor();
                let why = if floor > 0 && resolved.number < floor {
                    " (requests from before the chat service restarted are gone: their turn failed; send a new message)"
                } else {
                    ""
                };
                return Err(Error::NotFound(format!(
                    "no approval request {} in conversation {}{why}",
                    resolved.number, conv.id
                )));
            }
        };
        let allow = resolved.decision != Decision::Deny.as_str();
        if resolved.decision == Decision::AllowAlways.as_str() {
            self.persist_allowed_tool(conv, &open.approval.tool).await;
        }
        // A closed channel: the adapter is gone (the turn ended); the decision still stands.
        let _ = open
            .answers
            .send(ApprovalAnswer { request_id: open.request_id.clone(), allow, message: resolved.message.clone() })
            .await;
        tracing::info!(conversation = %conv.id, number = resolved.number, decision = %resolved.decision,
            decided_by = %resolved.decided_by, "Approval decided.");
        let kind = Kind::ApprovalResolved(resolved.clone());
        if let Err(e) = conv.bus.publish(&self.store, &open.turn_id, kind, Mark::None).await {
            tracing::error!(conversation = %conv.id, error = %e, "Cannot publish an approval's decision.");
        }
        conv.sync_approvals();
        self.audit_approval(conv, &open.turn_id, &open.approval.tool, &resolved).await;
        Ok(resolved)
    }

    /// Denies every open request of `conv` (of `turn_id` when given) with `decided_by`
    /// (`interrupt`, `turn_ended`) and the message for the agent; `due`: only those expired by
    /// then (`timeout`).
    pub(super) async fn close_approvals(
        &self,
        conv: &Conv,
        turn_id: Option<&str>,
        decided_by: &str,
        due: Option<Instant>,
    ) {
        let message = match decided_by {
            by::TIMEOUT => format!("No answer within {}: the action is denied.", human(self.config().approval_timeout)),
            by::INTERRUPT => "The user interrupted the turn: the action is denied.".to_owned(),
            _ => "The turn ended before an answer: the action is denied.".to_owned(),
        };
        for number in conv.approvals.numbers(turn_id, due) {
            let resolved = c::ApprovalResolved {
                number,
                decision: Decision::Deny.as_str().to_owned(),
                message: message.clone(),
                decided_by: decided_by.to_owned(),
                actor: String::new(),
            };
            // Another answer may have won in between: nothing to do then.
            let _ = self.resolve(conv, resolved).await;
        }
    }

    /// Stores `tool` of `conv` as allowed always (the book has it already), before the agent is
    /// told: a restart after the answer keeps it. A failed write is logged; the tool stays
    /// allowed in memory until the chat service restarts.
    async fn persist_allowed_tool(&self, conv: &Conv, tool: &str) {
        let Some(t) = conv.approvals.allowed().into_iter().find(|t| t.tool == tool) else { return };
        let record =
            st::AllowedToolRecord { tool: t.tool, decided_by: t.decided_by, actor: t.actor, allowed_ms: t.allowed_ms };
        if let Err(e) = self.store.allow_tool(&conv.id, record).await {
            tracing::warn!(conversation = %conv.id, tool, error = %e, "Cannot store a tool allowed always.");
        }
    }

    /// The tools `conv` allows always (`ConversationView.allowed_tools`), by name.
    pub fn allowed_tools(&self, conv: &Conv) -> Vec<c::AllowedTool> {
        conv.approvals.allowed()
    }

    /// The stored tools allowed always of conversation `id`, for a conversation being loaded;
    /// none (logged) when the store cannot say.
    pub(super) async fn stored_allowed_tools(&self, id: &str) -> Vec<c::AllowedTool> {
        match self.store.allowed_tools(id).await {
            Ok(tools) => tools
                .into_iter()
                .map(|t| c::AllowedTool {
                    tool: t.tool,
                    decided_by: t.decided_by,
                    actor: t.actor,
                    allowed_ms: t.allowed_ms,
                })
                .collect(),
            Err(e) => {
                tracing::warn!(conversation = %id, error = %e, "Cannot read the tools allowed always.");
                Vec::new()
            }
        }
    }

    /// `ForgetAllowedTools`: conversation `id`'s tools allowed always are forgotten, in the store
    /// and here; their next requests ask again. Audited (`chat.approval.forget`, with the names).
    /// Returns how many there were.
    ///
    /// # Errors
    /// [`Error::Invalid`] for a bad id, [`Error::NotFound`], a store error.
    pub async fn forget_allowed_tools(&self, id: &str, source: &str) -> Result<u32> {
        let conv = self.conv(id).await?;
        let names: Vec<String> = conv.approvals.allowed().into_iter().map(|t| t.tool).collect();
        let stored = self.store.clear_allowed_tools(id).await?;
        let held = conv.approvals.forget();
        let forgotten = stored.max(held as u64) as u32;
        if forgotten > 0 {
            tracing::info!(conversation = %id, forgotten, "Tools allowed always forgotten.");
            let entry = st::AuditEntry {
                actor: audit_actor(source).into(),
                action: "chat.approval.forget".into(),
                target: id.to_owned(),
                outcome: st::AuditOutcome::Ok as i32,
                trace_id: coffer_runtime::grpc::current_trace().unwrap_or_default(),
                detail: serde_json::json!({ "tools": names, "decided_by": source }).to_string(),
                ..Default::default()
            };
            if let Err(e) = self.store.audit(entry).await {
                tracing::warn!(conversation = %id, error = %e, "Cannot audit forgetting the allowed tools.");
            }
        }
        Ok(forgotten)
    }

    async fn audit_approval(&self, conv: &Conv, turn_id: &str, tool: &str, r: &c::ApprovalResolved) {
        let detail = serde_json::json!({
            "turn_id": turn_id,
            "number": r.number,
            "tool": tool,
            "decision": r.decision,
            "decided_by": r.decided_by,
            "actor": r.actor,
        });
        let entry = st::AuditEntry {
            actor: audit_actor(&r.decided_by).into(),
            action: "chat.approval".into(),
            target: conv.id.clone(),
            outcome: st::AuditOutcome::Ok as i32,
            trace_id: coffer_runtime::grpc::current_trace().unwrap_or_default(),
            detail: detail.to_string(),
            ..Default::default()
        };
        if let Err(e) = self.store.audit(entry).await {
            tracing::warn!(conversation = %conv.id, error = %e, "Cannot write an approval's audit entry.");
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn summaries_name_the_tool_and_what_it_acts_on() {
        assert_eq!(summary("Bash", &json!({"command": "rm -rf build", "description": "x"})), "Bash: rm -rf build");
        assert_eq!(summary("Edit", &json!({"file_path": "/w/a.rs", "old_string": "a"})), "Edit: /w/a.rs");
        assert_eq!(summary("Write", &json!({"file_path": "/w/b"})), "Write: /w/b");
        assert_eq!(summary("shell", &json!({"command": ["bash", "-lc", "ls"]})), "shell: bash -lc ls");
        assert_eq!(summary("Bash", &json!({"command": "a\n  b"})), "Bash: a b", "one line");
        assert_eq!(summary("Mystery", &json!({})), "Mystery");
        let long = summary("Bash", &json!({"command": "x".repeat(500)}));
        assert_eq!(long.chars().count(), MAX_SUMMARY_CHARS);
        assert!(long.ends_with('…'));
    }

    #[test]
    fn edits_render_as_one_hunk_and_long_diffs_are_cut() {
        let d = one_hunk("a.txt", "one\ntwo\nthree\n", "one\nTWO\nthree\n");
        assert_eq!(d, "--- a/a.txt\n+++ b/a.txt\n@@ -1,3 +1,3 @@\n one\n-two\n+TWO\n three\n");
        let w = diff("Write", &json!({"file_path": "n.txt", "content": "hi\n"}), None).unwrap();
        assert_eq!(w, "--- a/n.txt\n+++ b/n.txt\n@@ -0,0 +1,1 @@\n+hi\n");
        assert!(diff("Bash", &json!({"command": "ls"}), None).is_none());
        let big = "line\n".repeat(10_000);
        let cut = diff("Write", &json!({"file_path": "b", "content": big}), None).unwrap();
        assert!(cut.len() <= MAX_DIFF_BYTES + 64 && cut.ends_with("(diff cut at 16 KiB)\n"), "{}", cut.len());
        assert_eq!(diff("apply_patch", &json!({}), Some("given".into())).as_deref(), Some("given"));
    }

    #[test]
    fn decisions_and_durations_read_well() {
        assert_eq!(Decision::parse("allow_always").unwrap(), Decision::AllowAlways);
        let e = Decision::parse("yes").unwrap_err().to_string();
        assert!(e.contains("decision") && e.contains("allow, allow_always, deny"), "{e}");
        assert_eq!(human(Duration::from_secs(600)), "10 minutes");
        assert_eq!(human(Duration::from_secs(60)), "1 minute");
        assert_eq!(human(Duration::from_secs(2)), "2 s");
        assert_eq!(audit_actor("channel:telegram"), "channel");
        assert_eq!(audit_actor("timeout"), "daemon");
    }
}
