//! `coffer kb add|list|show|remove|search|reindex|status`: knowledge bases (named folders of
//! markdown notes) over `/v1/knowledge…`. `reindex` follows the pass it starts with a progress
//! bar on a terminal (files, bytes, ETA) or plain progress lines otherwise; `search` prints each
//! passage as `kb:path:lines  heading` with its snippet (matches in bold on a terminal) and what
//! each engine contributed.
use std::io::IsTerminal;
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

use clap::builder::PossibleValuesParser;
use clap::{Args, Subcommand};
use coffer_api::knowledge::{
    EngineConfig, EngineState, JobState, KnowledgeBaseCreate, KnowledgeBaseInfo, KnowledgeBases, Progress, Reindex,
    ReindexStarted, Removed, SearchReply, SearchRequest,
};
use serde_json::Value;

use crate::api::ApiClient;
use crate::context::Ctx;
use crate::error::CliError;
use crate::output::{self, printable, render_fields, render_table, render_table_fitted, text_cell, yes_no};

/// Engines a search may be limited to.
pub const ENGINES: &[&str] = &["grep", "keyword", "vector"];

/// The progress bar of `kb reindex` on a terminal: bytes drive the bar and the ETA, the message
/// says files done of total.
pub const BAR_TEMPLATE: &str = "{spinner} {msg} [{wide_bar}] {binary_bytes}/{binary_total_bytes} ETA {eta}";

/// The spinner of `kb reindex` while the folders are still being walked (nothing counted yet:
/// no `0/0`, no bar).
pub const SCANNING_TEMPLATE: &str = "{spinner} {msg}";

/// How often `kb reindex` asks how the pass is going.
const POLL: Duration = Duration::from_millis(250);

const ADD_EXAMPLES: &str = "\
Examples:
  coffer kb add notes                                # a new folder: COFFER_HOME/knowledge/notes/
  coffer kb add vault --path ~/Documents/Obsidian     # an existing folder (never written to)
  coffer kb add docs --path ./docs --include '**/*.md' --exclude 'drafts/**'

A relative --path is taken from the current folder. Indexing starts in the background; follow it
with `coffer kb status`.";

const SEARCH_EXAMPLES: &str = "\
Examples:
  coffer kb search how do we rotate the API keys
  coffer kb search --kb vault --path projects/ --since 7d release checklist
  coffer kb search --engine grep --regex 'TODO\\(\\w+\\)'
  coffer kb search 部署 --json | jq '.results[].path'

Each passage is shown as kb:path:first-last line, its heading path, then the snippet (matches in
bold on a terminal). The last line says what each engine found; a failed engine is named.
--since takes a duration ago (90s, 15m, 2h, 7d), a date (its midnight UTC) or an RFC 3339 time.";

const REINDEX_EXAMPLES: &str = "\
Examples:
  coffer kb reindex            # every knowledge base
  coffer kb reindex notes --clean
  coffer kb reindex --no-wait --json

Waits for the pass to end, with a progress bar on a terminal (plain progress lines on stderr
otherwise), then prints documents, chunks and errors. Exits 1 when a pass failed.";

#[derive(Debug, Subcommand)]
pub enum KbCommand {
    /// Add a knowledge base: a folder of markdown notes Coffer indexes and searches.
    #[command(after_help = ADD_EXAMPLES)]
    Add(AddArgs),
    /// List the knowledge bases with their documents, chunks and indexing state.
    #[command(after_help = "Example:\n  coffer kb list --json | jq -r '.items[].name'")]
    List(NoArgs),
    /// Show one knowledge base: folder, globs, counts, progress and file errors.
    #[command(after_help = "Example:\n  coffer kb show notes")]
    Show(KbArg),
    /// Forget a knowledge base and its indexes (no file is deleted).
    #[command(after_help = "Example:\n  coffer kb remove notes")]
    Remove(KbArg),
    /// Search the knowledge bases (grep, keyword and vector engines, fused).
    #[command(after_help = SEARCH_EXAMPLES)]
    Search(SearchArgs),
    /// Rebuild indexes from the files, showing the progress until the pass ends.
    #[command(after_help = REINDEX_EXAMPLES)]
    Reindex(ReindexArgs),
    /// Show documents, chunks, embedded chunks, last sync, pending work, errors per file and engines.
    #[command(after_help = "Examples:\n  coffer kb status\n  coffer kb status notes --json")]
    Status(StatusArgs),
    /// Change a knowledge base's settings: whether tools may write notes into it.
    #[command(after_help = "Example:\n  coffer kb set vault --writable true")]
    Set(SetArgs),
    /// List the notes that link to a note ([[wikilinks]] by file name, alias or path).
    #[command(
        after_help = "Examples:\n  coffer kb backlinks vault Projects/Coffer.md\n  coffer kb backlinks vault Ideas.md --json"
    )]
    Backlinks(BacklinksArgs),
}

#[derive(Debug, Args)]
pub struct SetArgs {
    /// The knowledge base's name.
    pub kb: String,
    /// Let coffer__write_note write notes into the folder (true) or not (false). A knowledge base
    /// under COFFER_HOME/knowledge is always writable.
    #[arg(long, value_name = "BOOL", action = clap::ArgAction::Set)]
    pub writable: bool,
}

#[derive(Debug, Args)]
pub struct BacklinksArgs {
    /// The knowledge base's name.
    pub kb: String,
    /// The note's path inside it, e.g. Projects/Coffer.md.
    pub path: String,
}

#[derive(Debug, Args)]
pub struct NoArgs {}

#[derive(Debug, Args)]
pub struct KbArg {
    /// The knowledge base's name.
    pub kb: String,
}

#[derive(Debug, Args)]
pub struct AddArgs {
    /// Its name: lowercase letters, digits, `-` and `_` (at most 64).
    pub name: String,
    /// An existing folder to index (relative: from the current folder) [default: a new
    /// COFFER_HOME/knowledge/NAME/].
    #[arg(long, value_name = "DIR")]
    pub path: Option<PathBuf>,
    /// Only files matching this glob (relative to the folder; repeatable) [default: **/*.md,
    /// **/*.markdown].
    #[arg(long, value_name = "GLOB")]
    pub include: Vec<String>,
    /// Skip files matching this glob (repeatable); .gitignore is respected too.
    #[arg(long, value_name = "GLOB")]
    pub exclude: Vec<String>,
    /// Let coffer__write_note write notes into your folder (as `coffer kb set NAME --writable
    /// true` after adding). A new COFFER_HOME/knowledge/NAME/ is always writable.
    #[arg(long)]
    pub writable: bool,
}

#[derive(Debug, Clone, Args)]
pub struct SearchArgs {
    /// What to look for (words or a question). Without one, `--tag` lists the notes with that
    /// tag, by knowledge base then path.
    #[arg(num_args = 0.., value_name = "QUERY", required_unless_present_any = ["tags", "cursor"])]
    pub query: Vec<String>,
    /// Only this knowledge base (repeatable; `memory` searches remembered facts).
    #[arg(long, value_name = "KB")]
    pub kb: Vec<String>,
    /// Only files under this path inside the knowledge base.
    #[arg(long = "path", value_name = "PREFIX")]
    pub path_prefix: Option<String>,
    /// Only documents with this tag (repeatable: all must match; `#project` is `project`; a tag
    /// matches its nested tags, `project` matching `project/coffer`, in any case).
    #[arg(long = "tag", value_name = "T")]
    pub tags: Vec<String>,
    /// Only documents modified since (15m, 2h, 7d, 2026-11-30, RFC 3339).
    #[arg(long, value_name = "DATE|DURATION", value_parser = parse_since)]
    pub since: Option<i64>,
    /// Only this engine (repeatable) [default: every enabled one].
    #[arg(long = "engine", value_name = "ENGINE", value_parser = PossibleValuesParser::new(ENGINES))]
    pub engines: Vec<String>,
    /// Most results (1-50).
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=50))]
    pub limit: u32,
    /// Treat the query as a regular expression (grep engine).
    #[arg(long)]
    pub regex: bool,
    /// The next page of a tag listing (--tag without a QUERY): paste the More: line the
    /// previous page printed (the same --tag and filters with this cursor). A search with a
    /// QUERY has no pages: it shows its best --limit results.
    #[arg(long, value_name = "CURSOR")]
    pub cursor: Option<String>,
}

#[derive(Debug, Args)]
pub struct ReindexArgs {
    /// Only this knowledge base [default: every one].
    pub kb: Option<String>,
    /// Drop the index first and rebuild it from nothing.
    #[arg(long)]
    pub clean: bool,
    /// Start the pass and return at once.
    #[arg(long)]
    pub no_wait: bool,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Only this knowledge base [default: every one].
    pub kb: Option<String>,
}

/// Runs one `coffer kb …` command.
///
/// # Errors
/// API errors (exit 2 bad input, 3 unknown knowledge base, 4 name taken, 1 retrieval not
/// running), exit 5 when the daemon cannot be reached, exit 1 when a reindex pass failed.
pub async fn run(ctx: &Ctx, cmd: KbCommand) -> Result<(), CliError> {
    match cmd {
        KbCommand::Add(a) => add(ctx, a).await,
        KbCommand::List(_) => list(ctx).await,
        KbCommand::Show(a) => show(ctx, &a.kb).await,
        KbCommand::Remove(a) => remove(ctx, &a.kb).await,
        KbCommand::Search(a) => search(ctx, a).await,
        KbCommand::Reindex(a) => reindex(ctx, a).await,
        KbCommand::Status(a) => status(ctx, a).await,
        KbCommand::Set(a) => set(ctx, a).await,
        KbCommand::Backlinks(a) => backlinks(ctx, a).await,
    }
}

async fn set(ctx: &Ctx, a: SetArgs) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    let body = coffer_api::knowledge::KnowledgeBasePatch { writable: Some(a.writable) };
    let resp = api.send(api.request(reqwest::Method::PATCH, &kb_path(&a.kb)?).json(&body)).await?;
    if ctx.json {
        return output::print_body(&resp.body);
    }
    let kb: KnowledgeBaseInfo = resp.parse()?;
    output::println(&if kb.writable {
        format!("Knowledge base {} is writable: tools may write notes into {}", kb.name, printable(&kb.root))
    } else {
        format!("Knowledge base {} is read-only for tools", kb.name)
    })
}

/// The lines of `kb backlinks`: one `path:line  title` per distinct link, then what kind of
/// link it is: `#Heading` for a link to a heading or `^block` (`[[Note#Heading]]`), `(embed)` for
/// an embed (`![[Note]]`), and `(as "alias")` when the link shows other text (`[[Note|alias]]`).
pub fn render_backlinks(note: &coffer_api::knowledge::Note) -> String {
    if note.backlinks.is_empty() {
        return format!("No note links to {}\n", printable(&note.path));
    }
    let mut out = String::new();
    let mut seen = std::collections::HashSet::new();
    for b in &note.backlinks {
        // The service sends each distinct link once; an older one may repeat a link.
        if !seen.insert((&b.path, b.line, &b.fragment, b.embed, &b.alias)) {
            continue;
        }
        let mut line = format!("{}:{}  {}", printable(&b.path), b.line, text_cell(&b.title, 80));
        if !b.fragment.is_empty() {
            line.push_str(&format!("  #{}", text_cell(&b.fragment, 60)));
        }
        if b.embed {
            line.push_str("  (embed)");
        }
        if !b.alias.is_empty() {
            line.push_str(&format!("  (as {:?})", text_cell(&b.alias, 60)));
        }
        out.push_str(&line);
        out.push('\n');
    }
    if note.backlinks_truncated {
        out.push_str("(more not shown)\n");
    }
    out
}

async fn backlinks(ctx: &Ctx, a: BacklinksArgs) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    let note_path = format!("{}/note", kb_path(&a.kb)?);
    let path = crate::api::with_query(
        &note_path,
        &[("path", Some(&a.path)), ("start_line", Some("1")), ("end_line", Some("1"))],
    );
    let resp = api.get_raw(&path).await?;
    let note: coffer_api::knowledge::Note = resp.parse()?;
    if ctx.json {
        let v = serde_json::json!({"kb": note.kb, "path": note.path, "title": note.title, "backlinks": note.backlinks, "backlinks_truncated": note.backlinks_truncated});
        return output::println(&v.to_string());
    }
    output::print(&render_backlinks(&note))
}

fn kb_path(name: &str) -> Result<String, CliError> {
    check_len("knowledge base name", name, MAX_KB_NAME_BYTES)?;
    Ok(format!("/v1/knowledge/{}", crate::api::name_segment("knowledge base", name)?))
}

/// Longest knowledge base name (the daemon's rule: 1-64 of a-z, 0-9, `_`, `-`).
pub const MAX_KB_NAME_BYTES: usize = 64;
/// Longest `--path` of a search, bytes.
pub const MAX_PATH_PREFIX_BYTES: usize = 1024;
/// Longest `--cursor`, bytes.
pub const MAX_CURSOR_BYTES: usize = 2048;

/// Refuses `value` of `what` when it is over `max` bytes, before the daemon is asked (a usage
/// error, exit 2, naming the argument and the limit; the value is not echoed).
///
/// # Errors
/// [`CliError::Usage`].
pub fn check_len(what: &str, value: &str, max: usize) -> Result<(), CliError> {
    if value.len() > max {
        return Err(CliError::Usage(format!("{what} is {} bytes; at most {max}", value.len())));
    }
    Ok(())
}

/// The arguments of `kb search` a daemon would refuse for their length, refused here first.
///
/// # Errors
/// [`CliError::Usage`] naming the flag and its limit.
pub fn check_search_args(a: &SearchArgs) -> Result<(), CliError> {
    for kb in &a.kb {
        check_len("--kb", kb, MAX_KB_NAME_BYTES)?;
    }
    check_len("--path", a.path_prefix.as_deref().unwrap_or_default(), MAX_PATH_PREFIX_BYTES)?;
    check_len("--cursor", a.cursor.as_deref().unwrap_or_default(), MAX_CURSOR_BYTES)?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Formatting helpers.

/// A Unix-ms time as `2026-11-30 09:57:00` (UTC); `-` for null or 0.
pub fn time_ms(v: &Value) -> String {
    time_of(v.as_i64())
}

/// A Unix-ms time as `2026-11-30 09:57:00` (UTC); `-` for `None` or 0.
pub fn time_of(ms: Option<i64>) -> String {
    match ms.filter(|ms| *ms > 0) {
        Some(ms) => {
            coffer_runtime::rfc3339_from_unix_ms(ms).chars().take(19).map(|c| if c == 'T' { ' ' } else { c }).collect()
        }
        None => "-".into(),
    }
}

/// Bytes as `512 B`, `1.5 KiB`, `12.3 MiB`.
pub fn bytes(n: u64) -> String {
    indicatif::HumanBytes(n).to_string()
}

/// A knowledge base's indexing state in one cell: `idle`, `indexing 120/500`, `failed: why`
/// (why cut to 60 characters).
pub fn state_cell(kb: &KnowledgeBaseInfo) -> String {
    state_text(kb, 60)
}

/// A knowledge base's progress; a missing one reads as idle with nothing counted.
fn progress_of(kb: &KnowledgeBaseInfo) -> Progress {
    kb.progress.clone().unwrap_or_default()
}

/// [`state_cell`] with why cut to `max` characters.
pub fn state_text(kb: &KnowledgeBaseInfo, max: usize) -> String {
    let p = progress_of(kb);
    let state = p.state.word();
    match p.state {
        JobState::Indexing if p.total > 0 => format!("{state} {}/{}", p.done, p.total),
        // Walking the folder: nothing is counted yet.
        JobState::Scanning | JobState::Indexing => format!("{state}…"),
        JobState::Failed if !p.message.is_empty() => format!("failed: {}", text_cell(&p.message, max)),
        _ => state.to_owned(),
    }
}

/// The knowledge bases table: NAME KIND WRITABLE DOCUMENTS CHUNKS EMBEDDED STATE ERRORS LAST
/// SYNC ROOT (WRITABLE: whether `coffer__write_note` may write into it; the root last, cut to
/// `width`).
pub fn render_kbs(items: &[KnowledgeBaseInfo], width: Option<usize>) -> String {
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|k| {
            vec![
                text_cell(&k.name, 64),
                text_cell(&k.kind, 10),
                crate::output::yes_no(k.writable).to_owned(),
                k.documents.to_string(),
                k.chunks.to_string(),
                k.embedded.to_string(),
                state_cell(k),
                k.errors.len().to_string(),
                time_of(k.last_sync_ms),
                text_cell(&k.root, 400),
            ]
        })
        .collect();
    render_table_fitted(
        &["NAME", "KIND", "WRITABLE", "DOCUMENTS", "CHUNKS", "EMBEDDED", "STATE", "ERRORS", "LAST SYNC (UTC)", "ROOT"],
        &rows,
        width,
    )
}

/// The errors of one knowledge base, one `  path: error` line each (at most `max`, then a
/// count of the rest).
pub fn render_file_errors(kb: &KnowledgeBaseInfo, max: usize) -> String {
    let errors = &kb.errors;
    let mut out = String::new();
    for e in errors.iter().take(max) {
        out.push_str(&format!("  {}: {}\n", printable(&e.path), printable(&e.error)));
    }
    if errors.len() > max {
        out.push_str(&format!("  … and {} more (coffer kb show {})\n", errors.len() - max, kb.name));
    }
    out
}

/// One knowledge base in full (`kb show`).
pub fn render_kb(kb: &KnowledgeBaseInfo) -> String {
    let list = |v: &[String]| if v.is_empty() { "-".to_owned() } else { v.join(", ") };
    let p = progress_of(kb);
    let mut progress = state_text(kb, 1000);
    if p.bytes_total > 0 {
        progress.push_str(&format!(" ({} of {})", bytes(p.bytes_done), bytes(p.bytes_total)));
    }
    let fields = vec![
        ("name", text_cell(&kb.name, 64)),
        ("kind", text_cell(&kb.kind, 10)),
        ("root", kb.root.clone()),
        // Empty: coffer-retrieval's default (`walk::DEFAULT_INCLUDE`).
        (
            "include",
            Some(list(&kb.include)).filter(|l| l != "-").unwrap_or_else(|| "**/*.md, **/*.markdown (default)".into()),
        ),
        ("exclude", list(&kb.exclude)),
        ("created", time_of(kb.created_ms)),
        ("documents", kb.documents.to_string()),
        ("chunks", kb.chunks.to_string()),
        ("embedded", kb.embedded.to_string()),
        ("pending", format!("{} files, {} embeddings", kb.pending, kb.pending_embeddings)),
        ("last sync", time_of(kb.last_sync_ms)),
        ("watching", yes_no(kb.watching).to_owned()),
        ("writable", yes_no(kb.writable).to_owned()),
        ("index", index_size(kb)),
        ("hidden", hidden_folders(kb)),
        ("state", progress),
        ("errors", kb.errors.len().to_string()),
    ];
    let mut out = render_fields(&fields);
    out.push_str(&render_file_errors(kb, usize::MAX));
    out
}

/// `12.0 MiB on disk for 4.0 MiB of files (3.00×)`, or `-` before anything is indexed.
fn index_size(kb: &KnowledgeBaseInfo) -> String {
    if kb.index_bytes == 0 && kb.corpus_bytes == 0 {
        return "-".into();
    }
    let ratio = if kb.corpus_bytes > 0 {
        format!(" ({:.2}×)", kb.index_bytes as f64 / kb.corpus_bytes as f64)
    } else {
        String::new()
    };
    format!("{} on disk for {} of files{ratio}", bytes(kb.index_bytes), bytes(kb.corpus_bytes))
}

/// `none`, or `2 skipped (not searched): .github, .obsidian` (names as the service lists them,
/// escaped for the terminal).
fn hidden_folders(kb: &KnowledgeBaseInfo) -> String {
    if kb.hidden_skipped_count == 0 {
        return "none".into();
    }
    let names: Vec<String> = kb.hidden_skipped.iter().map(|n| text_cell(n, 120)).collect();
    let more = kb.hidden_skipped_count.saturating_sub(names.len() as u64);
    let more = if more > 0 { format!(" and {more} more") } else { String::new() };
    format!("{} skipped (not searched): {}{more}", kb.hidden_skipped_count, names.join(", "))
}

/// The engines' configuration, one line each: `vector   off: not configured`.
pub fn render_engines(engines: &[EngineConfig]) -> String {
    let rows: Vec<Vec<String>> = engines
        .iter()
        .map(|e| {
            vec![text_cell(&e.name, 20), if e.enabled { "on" } else { "off" }.to_owned(), text_cell(&e.detail, 200)]
        })
        .collect();
    render_table(&["ENGINE", "ENABLED", "DETAIL"], &rows)
}

/// A snippet for the terminal: `**match**` in bold (`bold`), or without the markers. Control
/// characters from the files are shown escaped.
pub fn snippet(text: &str, bold: bool) -> String {
    let safe: String = text.trim().lines().map(printable).collect::<Vec<_>>().join("\n");
    let mut out = String::with_capacity(safe.len() + 16);
    let mut on = false;
    for (i, part) in safe.split("**").enumerate() {
        if i > 0 {
            on = !on;
            if bold {
                out.push_str(if on { "\u{1b}[1m" } else { "\u{1b}[0m" });
            }
        }
        out.push_str(part);
    }
    if on && bold {
        out.push_str("\u{1b}[0m");
    }
    out
}

/// The engines' report of a search: `engines: keyword 5 (2 ms), grep 3 (1 ms), vector failed:
/// why; rrf k=60, 4 ms`.
pub fn engines_line(reply: &SearchReply) -> String {
    let parts: Vec<String> = reply
        .engines
        .iter()
        .map(|e| {
            let name = printable(&e.engine);
            let msg = Some(&e.message).filter(|m| !m.is_empty()).map(|m| format!(": {}", printable(m)));
            match e.state {
                EngineState::Ok => format!("{name} {} ({} ms)", e.hits, e.took_ms),
                EngineState::Failed => format!("{name} FAILED{}", msg.unwrap_or_default()),
                EngineState::Timeout => format!("{name} TIMED OUT{}", msg.unwrap_or_default()),
                EngineState::Disabled => format!("{name} off"),
            }
        })
        .collect();
    let mut line = format!("engines: {}", if parts.is_empty() { "-".to_owned() } else { parts.join(", ") });
    if !reply.fusion.is_empty() {
        line.push_str(&format!("; {}", reply.fusion));
    }
    line.push_str(&format!(", {} ms", reply.took_ms));
    line
}

/// Search results, compactly: `kb:path:start-end  A › B` then the snippet indented, a blank
/// line between passages, the engines' report last (none for a tag listing, which runs no
/// engine).
pub fn render_results(reply: &SearchReply, bold: bool) -> String {
    let mut out = String::new();
    if reply.results.is_empty() {
        out.push_str("No results\n");
    }
    for r in &reply.results {
        let location = match &r.fact_id {
            Some(id) => format!("fact {id}"),
            None => format!("{}:{}:{}-{}", r.kb, r.path, r.line_start, r.line_end),
        };
        let mut head = printable(&location).into_owned();
        if !r.heading_path.is_empty() {
            head.push_str("  ");
            head.push_str(&printable(&r.heading_path.join(" › ")));
        }
        out.push_str(&head);
        out.push('\n');
        for line in snippet(&r.snippet, bold).lines() {
            out.push_str("    ");
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out.push('\n');
    }
    // A tag listing runs no engine: no engines line (it would read `engines: -`).
    if !reply.engines.is_empty() {
        out.push_str(&engines_line(reply));
        out.push('\n');
    }
    out
}

/// Whether stdout shows bold: a terminal, and `NO_COLOR` unset.
pub fn stdout_is_styled() -> bool {
    std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// `--since`: a duration ago (`90s`, `15m`, `2h`, `7d`, `2w`), a date (`2026-11-30`: its midnight
/// UTC) or an RFC 3339 UTC time, as Unix milliseconds.
///
/// # Errors
/// A message naming the forms it takes (clap prints it as a usage error, exit 2).
pub fn parse_since(s: &str) -> Result<i64, String> {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
    since_at(s, now)
}

/// [`parse_since`] relative to `now_ms`.
///
/// # Errors
/// As [`parse_since`].
pub fn since_at(s: &str, now_ms: i64) -> Result<i64, String> {
    let s = s.trim();
    let bad =
        || format!("{s:?} is not a time: give a duration ago (15m, 2h, 7d), a date (2026-11-30) or an RFC 3339 time");
    if let Some(unit) = s.chars().last().filter(char::is_ascii_alphabetic)
        && let Ok(n) = s[..s.len() - 1].parse::<i64>()
    {
        let per = match unit {
            's' => 1_000,
            'm' => 60_000,
            'h' => 3_600_000,
            'd' => 86_400_000,
            'w' => 7 * 86_400_000,
            _ => return Err(bad()),
        };
        return n.checked_mul(per).map(|d| now_ms - d).ok_or_else(bad);
    }
    if s.len() == 10 {
        let mut p = s.splitn(3, '-').map(|x| x.parse::<i64>().ok());
        if let (Some(Some(y)), Some(Some(m)), Some(Some(d))) = (p.next(), p.next(), p.next())
            && (1..=12).contains(&m)
            && (1..=31).contains(&d)
        {
            return Ok(coffer_runtime::days_from_civil(y, m, d) * 86_400_000);
        }
        return Err(bad());
    }
    output::parse_rfc3339_ms(s).ok_or_else(bad)
}

/// `path` made absolute against `cwd`, with `.` components dropped (`..` is left for the
/// daemon, which resolves symlinks too).
pub fn absolute(path: &Path, cwd: &Path) -> PathBuf {
    let joined = if path.is_absolute() { path.to_path_buf() } else { cwd.join(path) };
    joined.components().filter(|c| !matches!(c, Component::CurDir)).collect()
}

/// `v`, or `None` when it is empty (the field is then left out of the body).
fn non_empty(v: &[String]) -> Option<Vec<String>> {
    (!v.is_empty()).then(|| v.to_vec())
}

/// The body of `POST /v1/knowledge` for `a`, a relative `--path` resolved against `cwd`.
pub fn add_body(a: &AddArgs, cwd: &Path) -> KnowledgeBaseCreate {
    KnowledgeBaseCreate {
        name: a.name.clone(),
        path: a.path.as_ref().map(|p| absolute(p, cwd).display().to_string()),
        include: non_empty(&a.include),
        exclude: non_empty(&a.exclude),
    }
}

/// The body of `POST /v1/knowledge/search` for `a`.
pub fn search_body(a: &SearchArgs) -> SearchRequest {
    SearchRequest {
        query: a.query.join(" "),
        kb: non_empty(&a.kb),
        path_prefix: a.path_prefix.clone(),
        tags: non_empty(&a.tags),
        modified_after_ms: a.since,
        engines: non_empty(&a.engines),
        limit: Some(a.limit),
        snippet_chars: None,
        regex: a.regex.then_some(true),
        cursor: a.cursor.clone(),
    }
}

// ---------------------------------------------------------------------------------------------
// Commands.

async fn add(ctx: &Ctx, a: AddArgs) -> Result<(), CliError> {
    let cwd = std::env::current_dir().map_err(|e| CliError::Failed(format!("cannot read the current folder: {e}")))?;
    let body = add_body(&a, &cwd);
    let api = ctx.connect().await?;
    let mut resp = api.send(api.request(reqwest::Method::POST, "/v1/knowledge").json(&body)).await?;
    if a.writable && a.path.is_some() {
        let patch = coffer_api::knowledge::KnowledgeBasePatch { writable: Some(true) };
        resp = api.send(api.request(reqwest::Method::PATCH, &kb_path(&a.name)?).json(&patch)).await.map_err(|e| {
            CliError::Failed(format!(
                "added knowledge base {}, but marking it writable failed: {e}; retry with `coffer kb set {} --writable true`",
                a.name, a.name
            ))
        })?;
    }
    if ctx.json {
        return output::print_body(&resp.body);
    }
    let kb: KnowledgeBaseInfo = resp.parse()?;
    let name = &kb.name;
    let writable = if kb.writable { "; tools may write notes into it" } else { "" };
    output::print(&format!(
        "Added knowledge base {name} ({}){writable}; indexing in the background\nFollow it: coffer kb status {name}\n",
        printable(&kb.root)
    ))
}

async fn list(ctx: &Ctx) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    let resp = api.get_raw("/v1/knowledge").await?;
    if ctx.json {
        return output::print_body(&resp.body);
    }
    let all: KnowledgeBases = resp.parse()?;
    if all.items.is_empty() {
        return output::println("No knowledge bases yet; add one with `coffer kb add NAME --path DIR`");
    }
    output::print(&render_kbs(&all.items, output::terminal_width()))
}

async fn show(ctx: &Ctx, kb: &str) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    let resp = api.get_raw(&kb_path(kb)?).await?;
    if ctx.json {
        return output::print_body(&resp.body);
    }
    output::print(&render_kb(&resp.parse()?))
}

async fn remove(ctx: &Ctx, kb: &str) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    let resp = api.send(api.request(reqwest::Method::DELETE, &kb_path(kb)?)).await?;
    if ctx.json {
        return output::print_body(&resp.body);
    }
    let n = resp.parse::<Removed>()?.removed;
    output::println(&format!(
        "Removed knowledge base {kb} ({n} document{} forgotten; no file was deleted)",
        if n == 1 { "" } else { "s" }
    ))
}

async fn search(ctx: &Ctx, a: SearchArgs) -> Result<(), CliError> {
    check_search_args(&a)?;
    check_cursor_use(&a)?;
    let api = ctx.connect().await?;
    let resp = api.send(api.request(reqwest::Method::POST, "/v1/knowledge/search").json(&search_body(&a))).await?;
    if ctx.json {
        return output::print_body(&resp.body);
    }
    let reply: SearchReply = resp.parse()?;
    output::print_styled(&render_results(&reply, stdout_is_styled()))?;
    if let Some(next) = &reply.next_cursor {
        let home = (ctx.home_source == crate::context::HomeSource::Flag).then(|| ctx.home.root());
        output::println(&next_page_line(&a, home, next))?;
    }
    print_warnings(&reply);
    Ok(())
}

/// `--cursor` continues a tag listing only: with a QUERY (a search has no pages) or without
/// `--tag` (the cursor is a position in the listing of those tags), a usage error saying what
/// to pass.
///
/// # Errors
/// [`CliError::Usage`] (exit 2).
pub fn check_cursor_use(a: &SearchArgs) -> Result<(), CliError> {
    if a.cursor.is_none() {
        return Ok(());
    }
    if !a.query.is_empty() {
        return Err(CliError::Usage(
            "--cursor pages a tag listing (--tag without a QUERY); a search with a QUERY has no next page: \
             it shows its best --limit results (at most 50); narrow it with --kb, --path, --tag or --since"
                .into(),
        ));
    }
    if a.tags.is_empty() {
        return Err(CliError::Usage(
            "--cursor continues a tag listing: pass it with the same --tag (and --kb, --path, --since, --limit) \
             as the page that printed it; its More: line is that whole command"
                .into(),
        ));
    }
    Ok(())
}

/// How to get a tag listing's next page: the same command with `--cursor`, and `--home` (made
/// absolute) when the user gave it, so the line works pasted as it is.
pub fn next_page_line(a: &SearchArgs, home: Option<&Path>, next: &str) -> String {
    let mut cmd = String::from("coffer");
    if let Some(home) = home {
        let abs = std::path::absolute(home).unwrap_or_else(|_| home.to_path_buf());
        cmd.push_str(&format!(" --home {}", crate::output::shell_quote(&abs.display().to_string())));
    }
    cmd.push_str(" kb search");
    for kb in &a.kb {
        cmd.push_str(&format!(" --kb {}", crate::output::shell_quote(kb)));
    }
    if let Some(p) = &a.path_prefix {
        cmd.push_str(&format!(" --path {}", crate::output::shell_quote(p)));
    }
    for t in &a.tags {
        cmd.push_str(&format!(" --tag {}", crate::output::shell_quote(t)));
    }
    // The instant the first page's --since stood for (a relative 1d would move between pages).
    if let Some(ms) = a.since {
        cmd.push_str(&format!(" --since {}", coffer_runtime::rfc3339_from_unix_ms(ms)));
    }
    if a.limit != 8 {
        cmd.push_str(&format!(" --limit {}", a.limit));
    }
    format!("More: {cmd} --cursor {}", crate::output::shell_quote(next))
}

/// The reply's warnings, on stderr.
pub fn print_warnings(reply: &SearchReply) {
    for w in &reply.warnings {
        crate::eprintln_printable!("warning: {}", printable(w));
    }
}

async fn status(ctx: &Ctx, a: StatusArgs) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    if ctx.json {
        let path = a.kb.as_deref().map_or_else(|| Ok("/v1/knowledge".to_owned()), kb_path)?;
        return output::print_body(&api.get_raw(&path).await?.body);
    }
    let all: KnowledgeBases = api.get_as("/v1/knowledge").await?;
    let items: Vec<KnowledgeBaseInfo> = match a.kb.as_deref() {
        // One knowledge base: its own answer (a 404 for an unknown one, exit 3).
        Some(kb) => vec![api.get_as(&kb_path(kb)?).await?],
        None => all.items,
    };
    output::print(&render_status(&items, &all.engines, output::terminal_width()))
}

/// `kb status`: the table, each knowledge base's file errors, the engines.
pub fn render_status(items: &[KnowledgeBaseInfo], engines: &[EngineConfig], width: Option<usize>) -> String {
    let mut out = if items.is_empty() {
        "No knowledge bases yet; add one with `coffer kb add NAME --path DIR`\n".to_owned()
    } else {
        let rows: Vec<Vec<String>> = items
            .iter()
            .map(|k| {
                vec![
                    text_cell(&k.name, 64),
                    k.documents.to_string(),
                    k.chunks.to_string(),
                    k.embedded.to_string(),
                    time_of(k.last_sync_ms),
                    format!("{}/{}", k.pending, k.pending_embeddings),
                    k.errors.len().to_string(),
                    state_cell(k),
                ]
            })
            .collect();
        render_table_fitted(
            &[
                "NAME",
                "DOCUMENTS",
                "CHUNKS",
                "EMBEDDED",
                "LAST SYNC (UTC)",
                "PENDING FILES/EMBEDDINGS",
                "ERRORS",
                "STATE",
            ],
            &rows,
            width,
        )
    };
    for k in items.iter().filter(|k| !k.errors.is_empty()) {
        out.push_str(&format!("\nerrors in {}:\n", k.name));
        out.push_str(&render_file_errors(k, 20));
    }
    if !engines.is_empty() {
        out.push('\n');
        out.push_str(&render_engines(engines));
    }
    out
}

// ---------------------------------------------------------------------------------------------
// reindex

/// Where a reindex pass stands over the knowledge bases it covers.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Totals {
    pub done: u64,
    pub total: u64,
    pub bytes_done: u64,
    pub bytes_total: u64,
    /// Every knowledge base's pass has ended (idle or failed).
    pub finished: bool,
    /// A knowledge base is still walking its folder (its files are not counted yet).
    pub scanning: bool,
}

/// Sums the progress of `kbs`; each pass counts as finished when its job is at least the one
/// the reindex started (`started`: name → job) and it is no longer scanning or indexing.
pub fn totals(kbs: &[KnowledgeBaseInfo], started: &[(String, u64)]) -> Totals {
    let mut t = Totals { finished: true, ..Totals::default() };
    for (name, job) in started {
        let Some(kb) = kbs.iter().find(|k| k.name == *name) else { continue };
        let p = progress_of(kb);
        t.done += p.done;
        t.total += p.total;
        t.bytes_done += p.bytes_done;
        t.bytes_total += p.bytes_total;
        let running = matches!(p.state, JobState::Scanning | JobState::Indexing);
        t.scanning |= p.state == JobState::Scanning;
        if running || p.job < *job {
            t.finished = false;
        }
    }
    t
}

/// One plain progress line (stderr off a terminal).
pub fn progress_line(t: &Totals) -> String {
    if t.total == 0 {
        return "reindex: scanning…".into();
    }
    let more = if t.scanning { " (still scanning…)" } else { "" };
    format!("reindex: {}/{} files, {} of {}{more}", t.done, t.total, bytes(t.bytes_done), bytes(t.bytes_total))
}

/// The summary after a pass: per knowledge base, documents, chunks, errors and how it ended.
pub fn render_summary(kbs: &[KnowledgeBaseInfo]) -> String {
    let rows: Vec<Vec<String>> = kbs
        .iter()
        .map(|k| {
            vec![
                text_cell(&k.name, 64),
                k.documents.to_string(),
                k.chunks.to_string(),
                k.errors.len().to_string(),
                state_cell(k),
            ]
        })
        .collect();
    let mut out = render_table(&["NAME", "DOCUMENTS", "CHUNKS", "ERRORS", "STATE"], &rows);
    for k in kbs.iter().filter(|k| !k.errors.is_empty()) {
        out.push_str(&format!("\nerrors in {}:\n", k.name));
        out.push_str(&render_file_errors(k, 20));
    }
    out
}

async fn reindex(ctx: &Ctx, a: ReindexArgs) -> Result<(), CliError> {
    check_len("knowledge base name", a.kb.as_deref().unwrap_or_default(), MAX_KB_NAME_BYTES)?;
    let api = ctx.connect().await?;
    let body = Reindex { kb: a.kb.clone(), clean: Some(a.clean) };
    let resp = api.send(api.request(reqwest::Method::POST, "/v1/knowledge/reindex").json(&body)).await?;
    if a.no_wait && ctx.json {
        return output::print_body(&resp.body);
    }
    let reindexing: ReindexStarted = resp.parse()?;
    if a.no_wait {
        let n = reindexing.items.len();
        return output::println(&format!(
            "Reindexing {n} knowledge base{} in the background; follow it with `coffer kb status`",
            if n == 1 { "" } else { "s" }
        ));
    }
    let started: Vec<(String, u64)> = reindexing.items.iter().map(|k| (k.name.clone(), progress_of(k).job)).collect();
    let (final_body, kbs) = follow(&api, a.kb.as_deref(), &started).await?;
    let failed: Vec<&str> =
        kbs.iter().filter(|k| progress_of(k).state == JobState::Failed).map(|k| k.name.as_str()).collect();
    if ctx.json {
        output::print_body(&final_body)?;
    } else {
        output::print(&render_summary(&kbs))?;
    }
    if failed.is_empty() {
        Ok(())
    } else {
        let e = CliError::Failed(format!("the reindex pass of {} failed (see STATE above)", failed.join(", ")));
        Err(if ctx.json { e.printed() } else { e })
    }
}

fn bar_style() -> indicatif::ProgressStyle {
    indicatif::ProgressStyle::with_template(BAR_TEMPLATE)
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("=> ")
}

fn scanning_style() -> indicatif::ProgressStyle {
    indicatif::ProgressStyle::with_template(SCANNING_TEMPLATE)
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner())
}

/// Polls until every pass in `started` ended, drawing progress; returns the last body (the one
/// knowledge base's, or the list's) and the knowledge bases it covers.
async fn follow(
    api: &ApiClient,
    kb: Option<&str>,
    started: &[(String, u64)],
) -> Result<(String, Vec<KnowledgeBaseInfo>), CliError> {
    let path = kb.map_or_else(|| Ok("/v1/knowledge".to_owned()), kb_path)?;
    let bar = std::io::stderr().is_terminal().then(|| {
        let bar = indicatif::ProgressBar::with_draw_target(Some(0), indicatif::ProgressDrawTarget::stderr());
        bar.set_style(scanning_style());
        bar.enable_steady_tick(Duration::from_millis(120));
        bar
    });
    let mut counting = false;
    let mut last_line = String::new();
    let mut last_print = Instant::now() - Duration::from_secs(10);
    let mut ticker = tokio::time::interval(POLL);
    loop {
        ticker.tick().await;
        let resp = api.get_raw(&path).await?;
        let kbs: Vec<KnowledgeBaseInfo> =
            if kb.is_some() { vec![resp.parse()?] } else { resp.parse::<KnowledgeBases>()?.items };
        let t = totals(&kbs, started);
        match &bar {
            Some(bar) => {
                if t.total == 0 {
                    bar.set_message("reindex: scanning…");
                } else {
                    if !counting {
                        counting = true;
                        bar.set_style(bar_style());
                    }
                    bar.set_length(t.bytes_total);
                    bar.set_position(t.bytes_done);
                    let more = if t.scanning { " (still scanning…)" } else { "" };
                    bar.set_message(format!("{}/{} files{more}", t.done, t.total));
                }
            }
            None => {
                let line = progress_line(&t);
                if line != last_line && (last_print.elapsed() >= Duration::from_secs(1) || t.finished) {
                    crate::eprintln_printable!("{line}");
                    last_print = Instant::now();
                    last_line = line;
                }
            }
        }
        if t.finished {
            if let Some(bar) = bar {
                bar.finish_and_clear();
            }
            return Ok((resp.body, kbs.into_iter().filter(|k| started.iter().any(|(n, _)| k.name == *n)).collect()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use serde_json::json;

    fn parse(args: &[&str]) -> Result<crate::Cli, clap::Error> {
        let mut full = vec!["coffer", "kb"];
        full.extend_from_slice(args);
        crate::Cli::try_parse_from(full)
    }

    fn kb(name: &str, state: &str, done: u64, total: u64, job: u64) -> KnowledgeBaseInfo {
        serde_json::from_value(json!({
            "name": name, "kind": "folder", "root": format!("/srv/{name}"), "include": [], "exclude": [],
            "created_ms": 1_796_031_096_000_i64, "documents": 12, "chunks": 40, "embedded": 0,
            "last_sync_ms": 1_796_031_096_000_i64, "pending": 0, "pending_embeddings": 0,
            "errors": [{"path": "bin/x.md", "error": "not UTF-8"}],
            "progress": {"state": state, "done": done, "total": total, "bytes_done": done * 1024, "bytes_total": total * 1024, "started_ms": null, "message": "", "job": job},
            "watching": true,
        }))
        .unwrap()
    }

    #[test]
    fn arguments_are_checked_before_any_request() {
        assert!(
            parse(&["search", "how", "do", "we", "--kb", "a", "--kb", "b", "--engine", "grep", "--since", "7d"])
                .is_ok()
        );
        assert!(parse(&["add", "notes", "--path", "./n", "--include", "**/*.md"]).is_ok());
        assert!(parse(&["reindex", "--clean", "--no-wait"]).is_ok());
        assert!(parse(&["status"]).is_ok());
        for bad in [
            &["search"][..],
            &["search", "x", "--engine", "bm25"],
            &["search", "x", "--limit", "0"],
            &["search", "x", "--limit", "51"],
            &["search", "x", "--since", "yesterday"],
            &["add"],
            &["show"],
        ] {
            assert_eq!(parse(bad).unwrap_err().exit_code(), 2, "{bad:?}");
        }
    }

    #[test]
    fn since_takes_durations_dates_and_times() {
        let now = 1_796_031_096_000;
        assert_eq!(since_at("15m", now), Ok(now - 900_000));
        assert_eq!(since_at("7d", now), Ok(now - 7 * 86_400_000));
        assert_eq!(since_at("2w", now), Ok(now - 14 * 86_400_000));
        assert_eq!(since_at("2026-11-30", now), Ok(1_796_000_000_000 - 1_796_000_000_000 % 86_400_000));
        assert_eq!(since_at("2026-11-30T09:31:36Z", now), Ok(1_796_031_096_000));
        for bad in ["", "soon", "5y", "2026-13-01", "99999999999999999999d"] {
            assert!(since_at(bad, now).is_err(), "{bad}");
        }
    }

    #[test]
    fn relative_paths_are_resolved_against_the_current_folder() {
        let cwd = Path::new("/home/u/work");
        assert_eq!(absolute(Path::new("./notes"), cwd), PathBuf::from("/home/u/work/notes"));
        assert_eq!(absolute(Path::new("../x"), cwd), PathBuf::from("/home/u/work/../x"));
        assert_eq!(absolute(Path::new("/abs/./v"), cwd), PathBuf::from("/abs/v"));
        let a = AddArgs {
            name: "n".into(),
            path: Some("docs".into()),
            include: vec!["*.md".into()],
            exclude: vec![],
            writable: false,
        };
        assert_eq!(
            serde_json::to_value(add_body(&a, cwd)).unwrap(),
            json!({"name": "n", "path": "/home/u/work/docs", "include": ["*.md"]})
        );
        let a = AddArgs { name: "n".into(), path: None, include: vec![], exclude: vec![], writable: false };
        assert_eq!(serde_json::to_value(add_body(&a, cwd)).unwrap(), json!({"name": "n"}));
    }

    #[test]
    fn search_bodies_name_every_filter() {
        let crate::commands::Command::Kb(KbCommand::Search(a)) = parse(&[
            "search", "rotate", "keys", "--kb", "notes", "--path", "ops/", "--tag", "t", "--engine", "keyword",
            "--limit", "3", "--regex",
        ])
        .unwrap()
        .command
        else {
            panic!("a search")
        };
        assert_eq!(
            serde_json::to_value(search_body(&a)).unwrap(),
            json!({"query": "rotate keys", "limit": 3, "kb": ["notes"], "path_prefix": "ops/", "tags": ["t"], "engines": ["keyword"], "regex": true})
        );
    }

    #[test]
    fn results_are_compact_with_bold_only_on_a_terminal() {
        let hit = |kb: &str, path: &str, heading: &[&str], lines: (u32, u32), snippet: &str, fact: Option<&str>| {
            coffer_api::knowledge::SearchResult {
                kb: kb.into(),
                path: path.into(),
                heading_path: heading.iter().map(|h| (*h).to_owned()).collect(),
                line_start: lines.0,
                line_end: lines.1,
                snippet: snippet.into(),
                fact_id: fact.map(str::to_owned),
                ..Default::default()
            }
        };
        let mut reply: SearchReply = serde_json::from_value(json!({
            "results": [],
            "engines": [
                {"engine": "keyword", "state": "ok", "hits": 2, "took_ms": 1, "message": ""},
                {"engine": "vector", "state": "failed", "hits": 0, "took_ms": 0, "message": "connection refused"},
                {"engine": "grep", "state": "disabled", "hits": 0, "took_ms": 0, "message": ""},
            ],
            "warnings": ["vector engine failed: connection refused"], "took_ms": 4, "fusion": "rrf k=60",
        }))
        .unwrap();
        reply.results = vec![
            hit("notes", "ops/keys.md", &["Ops", "Keys"], (3, 9), "how to **rotate** the\n**keys**", None),
            hit("memory", "01J.md", &[], (1, 1), "likes \u{1b}[31m**tea**", Some("01J")),
        ];
        assert_eq!(
            render_results(&reply, false),
            "notes:ops/keys.md:3-9  Ops › Keys\n    how to rotate the\n    keys\n\n\
             fact 01J\n    likes \\u001b[31mtea\n\n\
             engines: keyword 2 (1 ms), vector FAILED: connection refused, grep off; rrf k=60, 4 ms\n"
        );
        let styled = render_results(&reply, true);
        assert!(styled.contains("how to \u{1b}[1mrotate\u{1b}[0m the"), "{styled:?}");
        assert_eq!(snippet("open **end", true), "open \u{1b}[1mend\u{1b}[0m");
        assert_eq!(render_results(&SearchReply::default(), false), "No results\n", "a tag listing: no engines line");
    }

    #[test]
    fn the_bar_template_is_valid() {
        assert!(indicatif::ProgressStyle::with_template(BAR_TEMPLATE).is_ok());
        assert!(indicatif::ProgressStyle::with_template(SCANNING_TEMPLATE).is_ok());
    }

    #[test]
    fn progress_counts_every_pass_until_each_ended() {
        let started = vec![("a".to_owned(), 3), ("b".to_owned(), 7)];
        let t = totals(&[kb("a", "indexing", 2, 4, 3), kb("b", "idle", 0, 0, 6)], &started);
        assert_eq!((t.done, t.total, t.bytes_total, t.finished), (2, 4, 4096, false));
        assert_eq!(progress_line(&t), "reindex: 2/4 files, 2.00 KiB of 4.00 KiB");
        // b still shows its previous pass (job 6): not finished until job 7 is idle.
        let t = totals(&[kb("a", "idle", 4, 4, 3), kb("b", "idle", 0, 0, 6)], &started);
        assert!(!t.finished);
        let t = totals(&[kb("a", "idle", 4, 4, 3), kb("b", "failed", 1, 1, 7)], &started);
        assert!(t.finished);
        assert_eq!(progress_line(&Totals::default()), "reindex: scanning…");
        // One KB counted, another still walking its folder: said, never 0/0.
        let t = totals(&[kb("a", "indexing", 1, 4, 3), kb("b", "scanning", 0, 0, 7)], &started);
        assert_eq!(progress_line(&t), "reindex: 1/4 files, 1.00 KiB of 4.00 KiB (still scanning…)");
        assert_eq!(state_cell(&kb("b", "scanning", 0, 0, 7)), "scanning…");
        assert_eq!(state_cell(&kb("b", "indexing", 0, 0, 7)), "indexing…");
        assert_eq!(state_cell(&kb("a", "indexing", 1, 4, 3)), "indexing 1/4");
    }

    #[test]
    fn tables_show_counts_state_and_errors() {
        let mut items = vec![kb("notes", "indexing", 120, 500, 2), kb("vault", "failed", 0, 0, 1)];
        items[0].writable = true;
        let t = render_kbs(&items, None);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].starts_with("NAME   KIND    WRITABLE  DOCUMENTS  CHUNKS  EMBEDDED  STATE"), "{t}");
        assert!(lines[1].contains("indexing 120/500") && lines[1].ends_with("/srv/notes"), "{t}");
        assert!(lines[1].contains("  yes  ") && lines[2].contains("  no  "), "{t}");
        assert!(lines[2].contains("failed"), "{t}");
        let s = render_status(
            &items,
            &[EngineConfig { name: "vector".into(), enabled: false, detail: "no embeddings endpoint".into() }],
            Some(200),
        );
        assert!(s.contains("errors in notes:\n  bin/x.md: not UTF-8\n"), "{s}");
        assert!(s.contains("vector  off      no embeddings endpoint"), "{s}");
        let summary = render_summary(&items[..1]);
        assert!(
            summary.starts_with(
                "NAME   DOCUMENTS  CHUNKS  ERRORS  STATE\nnotes  12         40      1       indexing 120/500\n"
            ),
            "{summary}"
        );
        let shown = render_kb(&items[0]);
        assert!(shown.contains("state:     indexing 120/500 (120.00 KiB of 500.00 KiB)"), "{shown}");
        assert!(shown.contains("last sync: 2026-11-30 09:31:36"), "{shown}");
        assert!(shown.contains("include:   **/*.md, **/*.markdown (default)\n"), "no globs given: {shown}");
        let mut globbed = items[0].clone();
        globbed.include = vec!["docs/**/*.md".into()];
        assert!(render_kb(&globbed).contains("include:   docs/**/*.md\n"));
        assert!(shown.contains("index:     -\n") && shown.contains("hidden:    none\n"), "{shown}");
        let mut sized = items[0].clone();
        (sized.index_bytes, sized.corpus_bytes) = (3 * 1024 * 1024, 2 * 1024 * 1024);
        sized.hidden_skipped = vec![".github".into(), ".obsidian".into()];
        sized.hidden_skipped_count = 3;
        let shown = render_kb(&sized);
        assert!(shown.contains("index:     3.00 MiB on disk for 2.00 MiB of files (1.50×)\n"), "{shown}");
        assert!(shown.contains("hidden:    3 skipped (not searched): .github, .obsidian and 1 more\n"), "{shown}");
    }

    #[test]
    fn a_tag_listing_says_how_to_get_its_next_page() {
        let a = SearchArgs {
            query: vec![],
            kb: vec!["vault".into()],
            path_prefix: None,
            tags: vec!["#project".into()],
            since: None,
            engines: vec![],
            limit: 2,
            regex: false,
            cursor: Some("vault:a.md".into()),
        };
        assert_eq!(search_body(&a).cursor.as_deref(), Some("vault:a.md"));
        assert_eq!(search_body(&a).query, "");
        assert_eq!(
            next_page_line(&a, None, "vault:Daily/it's.md"),
            "More: coffer kb search --kb vault --tag '#project' --limit 2 --cursor 'vault:Daily/it'\\''s.md'"
        );
        // The --home the user gave comes along, absolute.
        assert_eq!(
            next_page_line(&a, Some(Path::new("/srv/my home")), "vault:a.md"),
            "More: coffer --home '/srv/my home' kb search --kb vault --tag '#project' --limit 2 --cursor vault:a.md"
        );
        // A cursor goes with the listing's --tag, never with a query.
        assert!(check_cursor_use(&a).is_ok());
        let e = check_cursor_use(&SearchArgs { tags: vec![], ..a.clone() }).expect_err("no --tag");
        assert!(e.to_string().contains("pass it with the same --tag"), "{e}");
        let e = check_cursor_use(&SearchArgs { query: vec!["x".into()], ..a.clone() }).expect_err("a query");
        assert!(e.to_string().contains("has no next page"), "{e}");
        // --since is kept, as the instant it stood for, and reads back to the same instant.
        let since = since_at("1d", 1_796_601_600_000).expect("since");
        let line = next_page_line(&SearchArgs { since: Some(since), ..a }, None, "vault:a.md");
        let given = line.split(" --since ").nth(1).and_then(|r| r.split(' ').next()).expect("--since in the line");
        assert_eq!(parse_since(given), Ok(since), "{line}");
    }

    #[test]
    fn backlinks_show_each_linking_note_and_the_alias_it_links_with() {
        use coffer_api::knowledge::{Note, NoteBacklink};
        let link = |path: &str, title: &str, line: u32, alias: &str| NoteBacklink {
            path: path.into(),
            title: title.into(),
            line,
            alias: alias.into(),
            ..NoteBacklink::default()
        };
        let heading = NoteBacklink { fragment: "Plans".into(), ..link("Daily/2026-12-07.md", "Monday", 5, "") };
        let embed = NoteBacklink { embed: true, ..link("Ideas.md", "Ideas", 3, "") };
        let note = Note {
            kb: "vault".into(),
            path: "Coffer.md".into(),
            backlinks: vec![
                link("Daily/2026-12-07.md", "Monday", 3, ""),
                link("Daily/2026-12-07.md", "Monday", 3, ""),
                heading,
                embed,
                link("Ideas.md", "Ideas", 12, "the vault"),
            ],
            backlinks_truncated: true,
            ..Note::default()
        };
        assert_eq!(
            render_backlinks(&note),
            "Daily/2026-12-07.md:3  Monday\nDaily/2026-12-07.md:5  Monday  #Plans\nIdeas.md:3  Ideas  (embed)\n\
             Ideas.md:12  Ideas  (as \"the vault\")\n(more not shown)\n"
        );
        let none = Note { kb: "vault".into(), path: "Alone.md".into(), ..Note::default() };
        assert_eq!(render_backlinks(&none), "No note links to Alone.md\n");
    }
}
