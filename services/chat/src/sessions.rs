//! The user's own agent sessions, read from the transcripts the agent CLIs write (issue 34 §5):
//! Claude Code's `<config dir>/projects/<encoded cwd>/<session id>.jsonl` (config dir =
//! `$CLAUDE_CONFIG_DIR`, else `~/.claude`) and Codex's
//! `<codex home>/sessions/YYYY/MM/DD/rollout-<time>-<thread id>.jsonl` (`$CODEX_HOME`, else
//! `~/.codex`). Formats as written by Claude Code 2.1.332 and Codex 0.171.0 (one JSON object per
//! line; see `fixtures/` beside this file, produced by the real CLIs against a fake model API):
//!
//! - Claude Code: lines `{"type":"user"|"assistant", "message":{"role","content"}, "cwd",
//!   "sessionId", "timestamp", "isSidechain", "isMeta"?}` among many others (attachments,
//!   request shapes, cost records…). A user `content` is a string or blocks (`text`,
//!   `tool_result`); an assistant's holds `text`, `thinking` and `tool_use` blocks, often one
//!   line per block of the same reply.
//! - Codex: the first line `{"type":"session_meta","payload":{"id","cwd","timestamp"}}`; user and
//!   agent text as `event_msg` `item_completed` (`item.type` `UserMessage` / `AgentMessage`) or,
//!   in older rollouts, `event_msg` `user_message` / `agent_message`; tool calls as
//!   `response_item` `function_call` / `custom_tool_call` / `local_shell_call`.
//!
//! Reading is bounded and never fails a listing: at most [`MAX_SCAN_ENTRIES`] directory entries
//! are looked at, directories are not followed through symlinks (a loop costs nothing), only the
//! newest `limit` files (by modification time) are opened, each is read up to
//! [`MAX_SUMMARY_BYTES`] (import: [`MAX_IMPORT_BYTES`]), a line over [`MAX_LINE_BYTES`] is
//! skipped without being held in memory, and a malformed line, an unreadable file or a partial
//! last line are skipped and counted. Only the transcript folders are read, nothing else of the
//! user's home.
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use serde_json::Value;

use crate::error::{Error, Result};

/// Agent key of Claude Code.
pub const CLAUDE_CODE: &str = "claude_code";
/// Agent key of Codex.
pub const CODEX: &str = "codex";
/// Sessions listed when the request says 0.
pub const DEFAULT_LIMIT: usize = 50;
/// Most sessions one listing returns.
pub const MAX_LIMIT: usize = 200;
/// Directory entries looked at per agent before the walk stops (the listing is then `truncated`).
pub const MAX_SCAN_ENTRIES: usize = 20_000;
/// Bytes of one transcript read for its summary (its count is then a lower bound: `partial`).
pub const MAX_SUMMARY_BYTES: u64 = 8 << 20;
/// Bytes of one transcript read when it is imported.
pub const MAX_IMPORT_BYTES: u64 = 64 << 20;
/// Longest line parsed; a longer one is skipped (and counted) without being kept in memory.
pub const MAX_LINE_BYTES: usize = 1 << 20;
/// Characters of the first prompt a summary shows.
pub const PROMPT_CHARS: usize = 200;
/// Longest session id accepted.
pub const MAX_SESSION_ID_BYTES: usize = 128;
/// Bytes of a tool call's input kept in imported history.
const TOOL_INPUT_BYTES: usize = 300;

/// Where the agents keep their transcripts.
#[derive(Debug, Clone, Default)]
pub struct Roots {
    /// Claude Code's config dir (holds `projects/`).
    pub claude: Option<PathBuf>,
    /// Codex's home (holds `sessions/`).
    pub codex: Option<PathBuf>,
}

impl Roots {
    /// From the service's environment: `$CLAUDE_CONFIG_DIR` else `$HOME/.claude`; `$CODEX_HOME`
    /// else `$HOME/.codex` (the chat service runs as the user, with the user's environment).
    pub fn from_env() -> Self {
        let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
        let home = var("HOME");
        Self {
            claude: var("CLAUDE_CONFIG_DIR").or_else(|| home.as_ref().map(|h| h.join(".claude"))),
            codex: var("CODEX_HOME").or_else(|| home.as_ref().map(|h| h.join(".codex"))),
        }
    }
}

/// One session's summary.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// `claude_code` or `codex`.
    pub agent_key: &'static str,
    /// Claude Code's session id / Codex's thread id.
    pub session_id: String,
    /// The folder it ran in (empty: not recorded).
    pub cwd: String,
    /// The first user text, one line, at most [`PROMPT_CHARS`] characters.
    pub first_prompt: String,
    /// The transcript's modification time, Unix ms.
    pub last_activity_ms: i64,
    /// User prompts and assistant replies read.
    pub message_count: u64,
    /// The transcript's size, bytes.
    pub size_bytes: u64,
    /// Only [`MAX_SUMMARY_BYTES`] were read.
    pub partial: bool,
    /// The transcript.
    pub path: PathBuf,
}

/// A listing of sessions.
#[derive(Debug, Default)]
pub struct Listing {
    /// Newest first.
    pub sessions: Vec<Summary>,
    /// Files skipped: unreadable, not regular, or without a session in them.
    pub skipped_files: u32,
    /// Lines skipped: malformed or over [`MAX_LINE_BYTES`].
    pub skipped_lines: u64,
    /// More transcripts exist than were summarized (or the walk hit [`MAX_SCAN_ENTRIES`]).
    pub truncated: bool,
}

/// Who said an item of history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The user.
    User,
    /// The agent.
    Assistant,
}

/// One message of a transcript's history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    /// Who said it.
    pub role: Role,
    /// Its text (may be empty when it only called tools).
    pub text: String,
    /// Tool calls: (name, input as JSON text cut to a few hundred bytes).
    pub tools: Vec<(String, String)>,
    /// When, Unix ms (0: not recorded).
    pub at_ms: i64,
}

/// A transcript read whole (up to [`MAX_IMPORT_BYTES`]).
#[derive(Debug, Default)]
pub struct Transcript {
    /// Its session id as the transcript says it.
    pub session_id: String,
    /// The folder it ran in.
    pub cwd: String,
    /// The user/assistant history, in order.
    pub items: Vec<Item>,
    /// Lines skipped.
    pub skipped_lines: u64,
    /// Not read to its end.
    pub partial: bool,
}

/// Checks a session id: 1–[`MAX_SESSION_ID_BYTES`] of `[A-Za-z0-9_-]` (both agents use UUIDs),
/// so it can never name a path.
///
/// # Errors
/// [`Error::Invalid`] naming `session_id`.
pub fn check_session_id(id: &str) -> Result<()> {
    let ok = !id.is_empty()
        && id.len() <= MAX_SESSION_ID_BYTES
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "session_id: {:?} is not a session id (1-{MAX_SESSION_ID_BYTES} letters, digits, '-' or '_')",
            cut(id, 80)
        )))
    }
}

/// Checks an agent key for sessions: `claude_code`, `codex` (or empty = both, when `any`).
///
/// # Errors
/// [`Error::Invalid`] naming `agent_key`.
pub fn check_agent(agent: &str, any: bool) -> Result<Option<&'static str>> {
    match agent {
        CLAUDE_CODE => Ok(Some(CLAUDE_CODE)),
        CODEX => Ok(Some(CODEX)),
        "" if any => Ok(None),
        _ => {
            Err(Error::Invalid(format!("agent_key: {:?} has no sessions to list (claude_code, codex)", cut(agent, 80))))
        }
    }
}

/// The newest `limit` sessions of `agent` (`None`: both), newest first.
pub fn list(roots: &Roots, agent: Option<&str>, limit: usize) -> Listing {
    let limit = if limit == 0 { DEFAULT_LIMIT } else { limit.min(MAX_LIMIT) };
    let mut listing = Listing::default();
    let mut files: Vec<(i64, &'static str, PathBuf, u64)> = Vec::new();
    if agent.is_none_or(|a| a == CLAUDE_CODE)
        && let Some(root) = &roots.claude
    {
        listing.truncated |= claude_files(root, &mut files);
    }
    if agent.is_none_or(|a| a == CODEX)
        && let Some(root) = &roots.codex
    {
        listing.truncated |= codex_files(root, &mut files);
    }
    files.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.2.cmp(&b.2)));
    if files.len() > limit {
        listing.truncated = true;
        files.truncate(limit);
    }
    for (mtime, agent, path, size) in files {
        match summarize(agent, &path) {
            Some((mut s, skipped)) => {
                listing.skipped_lines += skipped;
                s.last_activity_ms = mtime;
                s.size_bytes = size;
                listing.sessions.push(s);
            }
            None => listing.skipped_files += 1,
        }
    }
    listing
}

/// The transcript of `agent`'s session `id`.
///
/// # Errors
/// [`Error::Invalid`] for a bad id, [`Error::NotFound`] when no transcript has it.
pub fn find(roots: &Roots, agent: &str, id: &str) -> Result<PathBuf> {
    check_session_id(id)?;
    let agent = check_agent(agent, false)?.unwrap_or(CLAUDE_CODE);
    let not_found = || Error::NotFound(format!("no {agent} session {id} (looked in {})", root_of(roots, agent)));
    let mut files = Vec::new();
    match agent {
        CLAUDE_CODE => {
            let Some(root) = &roots.claude else { return Err(not_found()) };
            // `<id>.jsonl` in one of the project folders; the id holds no path character.
            for dir in dirs(&root.join("projects")) {
                let p = dir.join(format!("{id}.jsonl"));
                if is_file(&p) {
                    return Ok(p);
                }
            }
        }
        _ => {
            let Some(root) = &roots.codex else { return Err(not_found()) };
            codex_files(root, &mut files);
            let suffix = format!("-{id}.jsonl");
            if let Some((_, _, p, _)) = files
                .into_iter()
                .find(|(_, _, p, _)| p.file_name().is_some_and(|n| n.to_string_lossy().ends_with(&suffix)))
            {
                return Ok(p);
            }
        }
    }
    Err(not_found())
}

fn root_of(roots: &Roots, agent: &str) -> String {
    let r = if agent == CODEX {
        roots.codex.as_ref().map(|p| p.join("sessions"))
    } else {
        roots.claude.as_ref().map(|p| p.join("projects"))
    };
    r.map_or_else(|| "nowhere: no HOME".to_owned(), |p| p.display().to_string())
}

/// A summary of one transcript and its skipped lines; `None` when it cannot be read or holds
/// no session.
fn summarize(agent: &'static str, path: &Path) -> Option<(Summary, u64)> {
    let file = File::open(path).ok()?;
    let mut parser = Parser::new(agent);
    let mut first = String::new();
    let mut count = 0u64;
    let mut on = |item: Item| {
        count += 1;
        if first.is_empty() && item.role == Role::User && !item.text.trim().is_empty() {
            first = one_line(&item.text, PROMPT_CHARS);
        }
    };
    let (skipped, partial) = lines(file, MAX_SUMMARY_BYTES, |v| parser.line(&v, &mut on));
    parser.flush(&mut on);
    let mut session_id = parser.session_id;
    if agent == CLAUDE_CODE {
        // The file's name is the id Claude Code resumes by.
        session_id = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    }
    if check_session_id(&session_id).is_err() || (count == 0 && parser.cwd.is_empty()) {
        return None;
    }
    let summary = Summary {
        agent_key: agent,
        session_id,
        cwd: parser.cwd,
        first_prompt: first,
        message_count: count,
        partial,
        path: path.to_owned(),
        ..Default::default()
    };
    Some((summary, skipped))
}

/// Calls `f` with each JSON object line of `r`, reading at most `max` bytes; lines that are
/// not JSON objects or longer than [`MAX_LINE_BYTES`] (skipped without being buffered) and a
/// last line cut by `max` are counted. Returns (skipped lines, stopped before the end).
fn lines(r: impl Read, max: u64, mut f: impl FnMut(Value)) -> (u64, bool) {
    let mut r = BufReader::with_capacity(64 << 10, r.take(max));
    let mut line = Vec::new();
    let mut skipped = 0u64;
    let mut read = 0u64;
    loop {
        line.clear();
        let mut too_long = false;
        let mut ended = false;
        // One line, keeping at most MAX_LINE_BYTES of it.
        loop {
            let buf = match r.fill_buf() {
                Ok(b) => b,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => return (skipped + u64::from(!line.is_empty() || too_long), true),
            };
            if buf.is_empty() {
                ended = true;
                break;
            }
            let (chunk, found) = match buf.iter().position(|&b| b == b'\n') {
                Some(i) => (&buf[..=i], true),
                None => (buf, false),
            };
            let n = chunk.len();
            if !too_long {
                if line.len() + n > MAX_LINE_BYTES + 1 {
                    too_long = true;
                    line.clear();
                } else {
                    line.extend_from_slice(chunk);
                }
            }
            r.consume(n);
            read += n as u64;
            if found {
                break;
            }
        }
        if too_long {
            skipped += 1;
        } else if !line.is_empty() {
            // A last line without its newline (cut by `max`, or still being written) is
            // parsed like any other: it is either whole or counted as skipped.
            match serde_json::from_slice::<Value>(&line) {
                Ok(v) if v.is_object() => f(v),
                _ if line.iter().all(u8::is_ascii_whitespace) => {}
                _ => skipped += 1,
            }
        }
        if ended {
            return (skipped, read >= max);
        }
    }
}

/// Turns transcript lines into history items, remembering the session's id and folder.
struct Parser {
    agent: &'static str,
    session_id: String,
    cwd: String,
    /// Claude Code: the id of the assistant reply being merged (one line per content block).
    reply: Option<String>,
    pending: Option<Item>,
    /// Codex: whether `item_completed` items were seen (then the older event kinds, which would
    /// repeat them, are ignored).
    codex_items: bool,
}

impl Parser {
    fn new(agent: &str) -> Self {
        let agent = if agent == CODEX { CODEX } else { CLAUDE_CODE };
        Self { agent, session_id: String::new(), cwd: String::new(), reply: None, pending: None, codex_items: false }
    }

    fn line(&mut self, v: &Value, out: &mut dyn FnMut(Item)) {
        if self.agent == CODEX {
            self.codex(v, out);
        } else {
            self.claude(v, out);
        }
    }

    fn claude(&mut self, v: &Value, out: &mut dyn FnMut(Item)) {
        let kind = v["type"].as_str().unwrap_or_default();
        if kind != "user" && kind != "assistant" {
            return;
        }
        if self.cwd.is_empty()
            && let Some(cwd) = v["cwd"].as_str()
        {
            self.cwd = cwd.to_owned();
        }
        if self.session_id.is_empty()
            && let Some(id) = v["sessionId"].as_str()
        {
            self.session_id = id.to_owned();
        }
        // Sub-agents' lines and Claude Code's own injected ones are not the conversation.
        if v["isSidechain"] == true || v["isMeta"] == true {
            return;
        }
        let at_ms = time_ms(&v["timestamp"]);
        let content = &v["message"]["content"];
        if kind == "user" {
            let text = match content {
                Value::String(s) => s.clone(),
                Value::Array(blocks) => blocks
                    .iter()
                    .filter(|b| b["type"] == "text")
                    .filter_map(|b| b["text"].as_str())
                    .collect::<Vec<_>>()
                    .join("\n"),
                _ => String::new(),
            };
            // Tool results and Claude Code's own command echoes are not prompts.
            let t = text.trim_start();
            if t.is_empty()
                || t.starts_with("<command-")
                || t.starts_with("<local-command")
                || t.starts_with("<system-reminder>")
            {
                return;
            }
            self.flush(out);
            out(Item { role: Role::User, text, tools: Vec::new(), at_ms });
            return;
        }
        let id = v["message"]["id"].as_str().map(str::to_owned);
        if self.reply.is_none() || id != self.reply {
            self.flush(out);
            self.reply = id;
        }
        let item = self.pending.get_or_insert_with(|| Item {
            role: Role::Assistant,
            text: String::new(),
            tools: Vec::new(),
            at_ms,
        });
        for b in content.as_array().into_iter().flatten() {
            match b["type"].as_str() {
                Some("text") => {
                    let t = b["text"].as_str().unwrap_or_default();
                    if !item.text.is_empty() && !t.is_empty() {
                        item.text.push_str("\n\n");
                    }
                    item.text.push_str(t);
                }
                Some("tool_use") => {
                    item.tools.push((b["name"].as_str().unwrap_or("tool").to_owned(), brief(&b["input"])));
                }
                _ => {}
            }
        }
    }

    fn flush(&mut self, out: &mut dyn FnMut(Item)) {
        self.reply = None;
        if let Some(item) = self.pending.take()
            && (!item.text.is_empty() || !item.tools.is_empty())
        {
            out(item);
        }
    }

    fn codex(&mut self, v: &Value, out: &mut dyn FnMut(Item)) {
        let p = &v["payload"];
        let at_ms = time_ms(&v["timestamp"]);
        match (v["type"].as_str().unwrap_or_default(), p["type"].as_str().unwrap_or_default()) {
            ("session_meta", _) => {
                if self.session_id.is_empty() {
                    self.session_id = p["id"].as_str().unwrap_or_default().to_owned();
                }
                if self.cwd.is_empty() {
                    self.cwd = p["cwd"].as_str().unwrap_or_default().to_owned();
                }
            }
            ("event_msg", "item_completed") => {
                let item = &p["item"];
                let role = match item["type"].as_str() {
                    Some("UserMessage") => Role::User,
                    Some("AgentMessage") => Role::Assistant,
                    _ => return,
                };
                self.codex_items = true;
                let text = item["content"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|c| c["text"].as_str())
                    .collect::<Vec<_>>()
                    .join("\n");
                self.codex_say(role, text, at_ms, out);
            }
            ("event_msg", kind @ ("user_message" | "agent_message")) if !self.codex_items => {
                let role = if kind == "user_message" { Role::User } else { Role::Assistant };
                self.codex_say(role, p["message"].as_str().unwrap_or_default().to_owned(), at_ms, out);
            }
            ("response_item", "function_call" | "custom_tool_call" | "local_shell_call") => {
                let name = p["name"].as_str().unwrap_or("shell").to_owned();
                let input =
                    p.get("arguments").or_else(|| p.get("input")).or_else(|| p.get("action")).unwrap_or(&Value::Null);
                let input = match input {
                    Value::String(s) => serde_json::from_str(s).unwrap_or_else(|_| Value::String(s.clone())),
                    other => other.clone(),
                };
                let item = self.pending.get_or_insert_with(|| Item {
                    role: Role::Assistant,
                    text: String::new(),
                    tools: Vec::new(),
                    at_ms,
                });
                item.tools.push((name, brief(&input)));
            }
            _ => {}
        }
    }

    fn codex_say(&mut self, role: Role, text: String, at_ms: i64, out: &mut dyn FnMut(Item)) {
        if text.trim().is_empty() {
            return;
        }
        match (role, self.pending.as_mut()) {
            // Tool calls made before a reply's text belong to that reply.
            (Role::Assistant, Some(item)) if item.text.is_empty() => item.text = text,
            _ => {
                self.flush(out);
                if role == Role::Assistant {
                    self.pending = Some(Item { role, text, tools: Vec::new(), at_ms });
                } else {
                    out(Item { role, text, tools: Vec::new(), at_ms });
                }
            }
        }
    }
}

/// Reads the transcript `path` of `agent` whole, up to [`MAX_IMPORT_BYTES`].
///
/// # Errors
/// [`Error::NotFound`] when it cannot be opened.
pub fn read(agent: &str, path: &Path) -> Result<Transcript> {
    let file = File::open(path).map_err(|e| Error::NotFound(format!("cannot read {}: {e}", path.display())))?;
    let mut t = Transcript::default();
    let mut parser = Parser::new(agent);
    let mut items = Vec::new();
    let (skipped, partial) = lines(file, MAX_IMPORT_BYTES, |v| parser.line(&v, &mut |item| items.push(item)));
    parser.flush(&mut |item| items.push(item));
    t.items = items;
    t.skipped_lines = skipped;
    t.partial = partial;
    t.session_id = std::mem::take(&mut parser.session_id);
    t.cwd = std::mem::take(&mut parser.cwd);
    if parser.agent == CLAUDE_CODE {
        t.session_id = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    }
    Ok(t)
}

/// A JSON value as compact text, cut to [`TOOL_INPUT_BYTES`].
fn brief(v: &Value) -> String {
    cut(&v.to_string(), TOOL_INPUT_BYTES)
}

/// `s` cut to at most `max` bytes at a character boundary, with `…` when cut.
fn cut(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// The text's whitespace collapsed to single spaces, cut to `chars` characters (with `…`).
pub fn one_line(text: &str, chars: usize) -> String {
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() <= chars {
        return flat;
    }
    let mut s: String = flat.chars().take(chars.saturating_sub(1)).collect();
    s.push('…');
    s
}

/// An RFC 3339 timestamp as Unix ms (0 when absent or malformed).
fn time_ms(v: &Value) -> i64 {
    v.as_str().and_then(parse_utc).unwrap_or(0)
}

/// `YYYY-MM-DDTHH:MM:SS[.fff…]Z` (what both CLIs write) as Unix ms; `None` for anything else.
fn parse_utc(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || b[10] != b'T'
        || b[13] != b':'
        || b[16] != b':'
        || !s.ends_with('Z')
    {
        return None;
    }
    let n = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (y, mo, d, h, mi, sec) = (n(0..4)?, n(5..7)?, n(8..10)?, n(11..13)?, n(14..16)?, n(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    let frac = s.get(19..s.len() - 1)?;
    let ms = match frac.strip_prefix('.') {
        Some(f) if !f.is_empty() && f.bytes().all(|c| c.is_ascii_digit()) => {
            format!("{:0<3}", &f[..f.len().min(3)]).parse::<i64>().ok()?
        }
        None if frac.is_empty() => 0,
        _ => return None,
    };
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if mo <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(((days * 24 + h) * 60 + mi) * 60_000 + sec * 1000 + ms)
}

fn mtime_ms(m: &std::fs::Metadata) -> i64 {
    m.modified().ok().and_then(|t| t.duration_since(UNIX_EPOCH).ok()).map_or(0, |d| d.as_millis() as i64)
}

fn is_file(p: &Path) -> bool {
    std::fs::symlink_metadata(p).is_ok_and(|m| m.is_file())
}

/// The real (not symlinked) subdirectories of `dir`, at most [`MAX_SCAN_ENTRIES`] entries looked at.
fn dirs(dir: &Path) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else { return Vec::new() };
    rd.take(MAX_SCAN_ENTRIES)
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect()
}

/// Pushes the `*.jsonl` regular files of `dir` (mtime, agent, path, size); true when the scan
/// budget ran out.
fn jsonl_files(
    dir: &Path,
    agent: &'static str,
    prefix: &str,
    budget: &mut usize,
    out: &mut Vec<(i64, &'static str, PathBuf, u64)>,
) -> bool {
    let Ok(rd) = std::fs::read_dir(dir) else { return false };
    for e in rd {
        if *budget == 0 {
            return true;
        }
        *budget -= 1;
        let Ok(e) = e else { continue };
        let name = e.file_name();
        let name = name.to_string_lossy();
        if !name.ends_with(".jsonl") || !name.starts_with(prefix) {
            continue;
        }
        // Not followed through a symlink: a regular file or nothing.
        let Ok(m) = std::fs::symlink_metadata(e.path()) else { continue };
        if m.is_file() {
            out.push((mtime_ms(&m), agent, e.path(), m.len()));
        }
    }
    false
}

/// Claude Code's transcripts: `projects/*/*.jsonl`. True when the walk was cut short.
fn claude_files(root: &Path, out: &mut Vec<(i64, &'static str, PathBuf, u64)>) -> bool {
    let mut budget = MAX_SCAN_ENTRIES;
    let mut cut_short = false;
    for dir in dirs(&root.join("projects")) {
        cut_short |= jsonl_files(&dir, CLAUDE_CODE, "", &mut budget, out);
    }
    cut_short
}

/// Codex's rollouts: `sessions/YYYY/MM/DD/rollout-*.jsonl`, newest days first. True when the
/// walk was cut short.
fn codex_files(root: &Path, out: &mut Vec<(i64, &'static str, PathBuf, u64)>) -> bool {
    let mut budget = MAX_SCAN_ENTRIES;
    let sorted = |p: &Path| {
        let mut d = dirs(p);
        d.sort_by(|a, b| b.cmp(a));
        d
    };
    for year in sorted(&root.join("sessions")) {
        for month in sorted(&year) {
            for day in sorted(&month) {
                if jsonl_files(&day, CODEX, "rollout-", &mut budget, out) {
                    return true;
                }
            }
        }
    }
    false
}

#[cfg(test)]
#[path = "sessions_tests.rs"]
mod tests;
