//! The note built-in tools (`coffer__read_note`, `coffer__write_note`): [`Provider`]s whose
//! every call is one `coffer-retrieval` RPC (`ReadNote`, `WriteNote`); the retrieval service
//! owns the knowledge bases' folders, so this process never opens a note itself.
//!
//! `read_note` answers with the note's lines (bounded by the service: 2,000 lines or 64 KiB,
//! with how to read on), a header naming its title, tags, outgoing `[[links]]` (resolved to
//! paths) and backlinks; `structuredContent` is [`NoteView`]. `write_note` writes into KBs
//! under `COFFER_HOME/knowledge` or ones the user marked writable; the service refuses the rest
//! (naming how to mark one), paths that escape, secrets and oversized content, each as a tool
//! error.
use coffer_proto::retrieval::{Note, NoteBacklink, ReadNoteRequest, WriteNoteRequest};
use futures_util::future::BoxFuture;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::clients::retrieval::{self, Client};
use crate::mcp::builtin::retrieval_tools::{MAX_NAME_CHARS, MAX_PATH_CHARS, args, failed, output_schema, result};
use crate::mcp::builtin::{Caller, Invalid, Provider, Registry, Reply, input_schema};

/// Longest content `write_note` takes, in characters (the service's bound is 1 MiB).
pub const MAX_CONTENT_CHARS: usize = 1024 * 1024;
/// Backlinks and links named in `read_note`'s text (all are in `structuredContent`).
const MAX_LISTED: usize = 50;
/// Largest `start_byte` of `read_note`: the largest file the service reads (16 MiB), so an
/// offset beyond it can point at nothing.
pub const MAX_START_BYTE: u32 = 16 * 1024 * 1024;

/// `registry` with the two note tools, each calling `client`.
pub fn register(registry: Registry, client: Client) -> Registry {
    registry.with(ReadNote(client.clone())).with(WriteNote(client))
}

// ---------------------------------------------------------------------------------------------
// coffer__read_note

/// `coffer__read_note {kb, path, start_line?, end_line?}` → `ReadNote`.
pub struct ReadNote(pub Client);

/// The arguments of `coffer__read_note`; its `inputSchema` is derived from them.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadNoteArgs {
    #[schemars(length(min = 1, max = MAX_NAME_CHARS), description = "The knowledge base's name, e.g. \"notes\".")]
    kb: String,
    #[schemars(
        length(min = 1, max = MAX_PATH_CHARS),
        description = "The note's path inside the knowledge base, as search results show it, e.g. \"projects/coffer.md\"."
    )]
    path: String,
    #[serde(default)]
    #[schemars(with = "u32", range(min = 1), description = "First line to read, 1-based (default 1).")]
    start_line: Option<u32>,
    #[serde(default)]
    #[schemars(with = "u32", range(min = 1), description = "Last line to read, inclusive (default: the end).")]
    end_line: Option<u32>,
    #[serde(default)]
    #[schemars(
        with = "u32",
        range(max = MAX_START_BYTE),
        description = "Bytes of start_line to skip (default 0). A line longer than 64 KiB comes cut: the answer's cut_at_byte (and its last line) says where, and start_line=<that line>, start_byte=<cut_at_byte> reads on in it."
    )]
    start_byte: Option<u32>,
}

/// `coffer__read_note`'s `structuredContent` (its `outputSchema` is derived from this type).
#[derive(Debug, serde::Serialize, JsonSchema)]
pub struct NoteView {
    /// The knowledge base.
    pub kb: String,
    /// The note's path inside it.
    pub path: String,
    /// Its title (front matter, first `#` heading, or file name).
    pub title: String,
    /// Front matter tags, then inline `#tags`.
    pub tags: Vec<String>,
    /// The lines read, as in the file.
    pub text: String,
    /// First line read, 1-based.
    pub start_line: u32,
    /// Last line read, inclusive.
    pub end_line: u32,
    /// Lines in the whole note.
    pub total_lines: u32,
    /// The range was cut; `next` says how to read on.
    pub truncated: bool,
    /// How to read on when cut.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub next: String,
    /// `text` starts this many bytes into `start_line` (reading on in a long line).
    #[serde(skip_serializing_if = "is_zero")]
    pub start_byte: u32,
    /// Line `end_line` is longer than 64 KiB and was cut after this many of its bytes: read on
    /// with `start_line` = `end_line` and `start_byte` = this. 0: not cut.
    #[serde(skip_serializing_if = "is_zero")]
    pub cut_at_byte: u32,
    /// Outgoing `[[wikilinks]]`, in order.
    pub links: Vec<LinkView>,
    /// The notes that link here.
    pub backlinks: Vec<BacklinkView>,
}

/// One outgoing link of [`NoteView`].
#[derive(Debug, serde::Serialize, JsonSchema)]
pub struct LinkView {
    /// As written: `Note`, `folder/Note`; empty for a link into this note.
    pub target: String,
    /// The heading or `^block` after `#`, if any.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub fragment: String,
    /// The note it resolves to; empty when no note has that name.
    pub resolved_path: String,
    /// Line of the link.
    pub line: u32,
}

/// One backlink of [`NoteView`].
#[derive(Debug, serde::Serialize, JsonSchema)]
pub struct BacklinkView {
    /// The linking note.
    pub path: String,
    /// Its title.
    pub title: String,
    /// The line of the link in it.
    pub line: u32,
    /// The text the link shows instead of the note's name (`[[Note|alias]]`), if any.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub alias: String,
    /// The heading or `^block` it links to (`[[Note#Heading]]`), if any.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub fragment: String,
    /// An embed (`![[Note]]`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub embed: bool,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl NoteView {
    fn of(n: &Note) -> Self {
        Self {
            kb: n.kb.clone(),
            path: n.path.clone(),
            title: n.title.clone(),
            tags: n.tags.clone(),
            text: n.text.clone(),
            start_line: n.start_line,
            end_line: n.end_line,
            total_lines: n.total_lines,
            truncated: n.truncated,
            next: n.next.clone(),
            start_byte: n.start_byte,
            cut_at_byte: n.cut_at_byte,
            links: n
                .links
                .iter()
                .map(|l| LinkView {
                    target: l.target.clone(),
                    fragment: l.fragment.clone(),
                    resolved_path: l.resolved_path.clone(),
                    line: l.line,
                })
                .collect(),
            backlinks: n
                .backlinks
                .iter()
                .map(|b| BacklinkView {
                    path: b.path.clone(),
                    title: b.title.clone(),
                    line: b.line,
                    alias: b.alias.clone(),
                    fragment: b.fragment.clone(),
                    embed: b.embed,
                })
                .collect(),
        }
    }
}

/// The text of a `read_note` answer: a header (title, lines, tags, links, backlinks), then the
/// lines, then how to read on when cut.
pub fn note_text(n: &Note) -> String {
    let mut out = format!("{}:{}  # {}\n", n.kb, n.path, n.title);
    if n.total_lines == 0 {
        out.push_str("(empty note)\n");
    } else {
        let from = if n.start_byte > 0 {
            format!(" (from byte {} of line {})", n.start_byte, n.start_line)
        } else {
            String::new()
        };
        out.push_str(&format!("lines {}-{} of {}{from}\n", n.start_line, n.end_line, n.total_lines));
    }
    if !n.tags.is_empty() {
        out.push_str(&format!("tags: {}\n", n.tags.join(", ")));
    }
    if !n.links.is_empty() {
        let shown: Vec<String> = n
            .links
            .iter()
            .take(MAX_LISTED)
            .map(|l| {
                let to = if l.resolved_path.is_empty() {
                    format!("{} (unresolved)", l.target)
                } else {
                    l.resolved_path.clone()
                };
                if l.fragment.is_empty() { to } else { format!("{to}#{}", l.fragment) }
            })
            .collect();
        let more = n.links.len().saturating_sub(MAX_LISTED);
        out.push_str(&format!(
            "links to: {}{}\n",
            shown.join(", "),
            if more > 0 { format!(" (+{more} more)") } else { String::new() }
        ));
    }
    if n.backlinks.is_empty() {
        if n.indexed {
            out.push_str("backlinks: none\n");
        }
    } else {
        let shown: Vec<String> = n.backlinks.iter().take(MAX_LISTED).map(backlink_text).collect();
        let more = n.backlinks.len().saturating_sub(MAX_LISTED);
        let more = if more > 0 || n.backlinks_truncated { format!(" (+{more} more)") } else { String::new() };
        out.push_str(&format!("backlinks: {}{more}\n", shown.join(", ")));
    }
    out.push('\n');
    out.push_str(&n.text);
    if n.truncated && !n.next.is_empty() {
        out.push_str(&format!("\n[{}]", n.next));
    }
    out
}

/// One backlink as `read_note`'s text names it: `path:line`, then `#Heading` for a link to a
/// heading or block, `(embed)` for an embed and `(as "alias")` when the link shows other text
/// (as `coffer kb backlinks` prints it).
fn backlink_text(b: &NoteBacklink) -> String {
    let mut out = format!("{}:{}", b.path, b.line);
    if !b.fragment.is_empty() {
        out.push_str(&format!(" #{}", b.fragment.chars().take(60).collect::<String>()));
    }
    if b.embed {
        out.push_str(" (embed)");
    }
    if !b.alias.is_empty() {
        out.push_str(&format!(" (as {:?})", b.alias.chars().take(60).collect::<String>()));
    }
    out
}

impl Provider for ReadNote {
    fn name(&self) -> &'static str {
        "read_note"
    }

    fn definition(&self) -> Value {
        json!({
            "name": "read_note",
            "title": "Read a note",
            "description": "Read one note of the user's knowledge bases (an Obsidian vault, a notes or docs folder) by knowledge base and path, as coffer__search_knowledge shows them: the whole note or a line range, with its title, tags (front matter and inline #tags), the notes its [[wikilinks]] point to, and its backlinks (the notes that link to it). \
        Use it to open a search result in full, or to follow links between notes. Long notes come in parts of at most 2,000 lines or 64 KiB; the answer says which start_line reads on. A single line longer than 64 KiB is cut: the answer says where (cut_at_byte), and start_line with start_byte reads the rest of that line.",
            "inputSchema": input_schema::<ReadNoteArgs>(),
            "outputSchema": output_schema::<NoteView>(),
            "annotations": {"readOnlyHint": true, "openWorldHint": false}
        })
    }

    fn call<'a>(&'a self, _caller: &'a dyn Caller, arguments: Option<&'a str>) -> BoxFuture<'a, Reply> {
        Box::pin(async move {
            let a: ReadNoteArgs = args("read_note", arguments)?;
            let req = ReadNoteRequest {
                kb: a.kb,
                path: a.path,
                start_line: a.start_line.unwrap_or(0),
                end_line: a.end_line.unwrap_or(0),
                start_byte: a.start_byte.unwrap_or(0),
            };
            match retrieval::call(self.0.clone().read_note(req)).await {
                Ok(note) => result(note_text(&note), retrieval::to_json(&NoteView::of(&note))),
                Err(s) => failed(s),
            }
        })
    }
}

// ---------------------------------------------------------------------------------------------
// coffer__write_note

/// `coffer__write_note {kb, path, content, mode?}` → `WriteNote`.
pub struct WriteNote(pub Client);

/// The arguments of `coffer__write_note`; its `inputSchema` is derived from them.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteNoteArgs {
    #[schemars(length(min = 1, max = MAX_NAME_CHARS), description = "The knowledge base's name, e.g. \"inbox\".")]
    kb: String,
    #[schemars(
        length(min = 1, max = MAX_PATH_CHARS),
        description = "The note's path inside the knowledge base, ending in .md, e.g. \"meetings/2026-12-07.md\"; folders are created."
    )]
    path: String,
    #[schemars(
        length(max = MAX_CONTENT_CHARS),
        description = "The markdown to write (or to append), e.g. \"# Standup\\n\\nShipped [[Release 4]]. #meeting\"."
    )]
    content: String,
    #[serde(default)]
    #[schemars(
        with = "String",
        extend("enum" = ["create", "replace", "append"]),
        description = "create (default): a new note, refused if it exists; replace: overwrite an existing note; append: add to its end."
    )]
    mode: Option<String>,
}

impl Provider for WriteNote {
    fn name(&self) -> &'static str {
        "write_note"
    }

    fn definition(&self) -> Value {
        json!({
            "name": "write_note",
            "title": "Write a note",
            "description": "Create, replace or append to one markdown note in a knowledge base Coffer keeps (COFFER_HOME/knowledge/<name>) or one the user marked writable; the user's other folders are read-only. \
        Use it when the user asks you to write something down as a note (meeting notes, a summary, a journal entry); for a single durable fact use coffer__remember instead. \
        [[Wikilinks]] and #tags in the content work as in Obsidian. Never put passwords, tokens or other secrets in a note (such content is refused). The note is searchable at once.",
            "inputSchema": input_schema::<WriteNoteArgs>(),
            "annotations": {"readOnlyHint": false, "destructiveHint": true, "idempotentHint": false, "openWorldHint": false}
        })
    }

    fn call<'a>(&'a self, _caller: &'a dyn Caller, arguments: Option<&'a str>) -> BoxFuture<'a, Reply> {
        Box::pin(async move {
            let a: WriteNoteArgs = args("write_note", arguments)?;
            if a.content.chars().count() > MAX_CONTENT_CHARS {
                return Err(Invalid(format!("coffer__write_note: content is over {MAX_CONTENT_CHARS} characters")));
            }
            // The service checks the mode and names the accepted ones.
            let mode = a.mode.unwrap_or_else(|| "create".to_owned());
            let mode = mode.as_str();
            let req = WriteNoteRequest { kb: a.kb, path: a.path, content: a.content, mode: mode.into() };
            match retrieval::call(self.0.clone().write_note(req)).await {
                Ok(r) => {
                    let verb = match (mode, r.created) {
                        (_, true) => "Created",
                        ("append", false) => "Appended to",
                        _ => "Replaced",
                    };
                    let text = format!(
                        "{verb} {}:{} ({} line{}, {} bytes){}.",
                        r.kb,
                        r.path,
                        r.lines,
                        if r.lines == 1 { "" } else { "s" },
                        r.size,
                        if r.indexed { "; searchable now" } else { "" }
                    );
                    let structured = json!({
                        "kb": r.kb, "path": r.path, "created": r.created, "lines": r.lines, "size": r.size, "indexed": r.indexed
                    });
                    result(text, structured)
                }
                Err(s) => failed(s),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use coffer_proto::retrieval::NoteLinkInfo;

    use super::*;

    #[test]
    fn the_text_names_title_tags_links_and_backlinks() {
        let n = Note {
            kb: "vault".into(),
            path: "Projects/Coffer.md".into(),
            title: "Coffer".into(),
            tags: vec!["project".into(), "rust/async".into()],
            text: "# Coffer\n\nSee [[Roadmap]] and [[Nowhere]].\n".into(),
            start_line: 1,
            end_line: 3,
            total_lines: 3,
            links: vec![
                NoteLinkInfo {
                    target: "Roadmap".into(),
                    resolved_path: "Roadmap.md".into(),
                    line: 3,
                    ..Default::default()
                },
                NoteLinkInfo { target: "Nowhere".into(), line: 3, ..Default::default() },
            ],
            backlinks: vec![
                NoteBacklink {
                    path: "Daily/2026-12-07.md".into(),
                    title: "Today".into(),
                    line: 4,
                    ..Default::default()
                },
                NoteBacklink {
                    path: "Ideas.md".into(),
                    title: "Ideas".into(),
                    line: 2,
                    alias: "the vault".into(),
                    ..Default::default()
                },
                NoteBacklink {
                    path: "Ideas.md".into(),
                    title: "Ideas".into(),
                    line: 5,
                    fragment: "Plans".into(),
                    embed: true,
                    ..Default::default()
                },
            ],
            indexed: true,
            ..Default::default()
        };
        let t = note_text(&n);
        assert!(
            t.starts_with("vault:Projects/Coffer.md  # Coffer\nlines 1-3 of 3\ntags: project, rust/async\n"),
            "{t}"
        );
        assert!(t.contains("links to: Roadmap.md, Nowhere (unresolved)\n"), "{t}");
        // The alias a linking note used, as `coffer kb backlinks` shows it.
        assert!(
            t.contains("backlinks: Daily/2026-12-07.md:4, Ideas.md:2 (as \"the vault\"), Ideas.md:5 #Plans (embed)\n"),
            "{t}"
        );
        assert!(t.ends_with("See [[Roadmap]] and [[Nowhere]].\n"), "{t}");
        let v = retrieval::to_json(&NoteView::of(&n));
        assert_eq!(v["backlinks"][0]["path"], "Daily/2026-12-07.md");
        assert_eq!((v["backlinks"][0].get("alias"), &v["backlinks"][1]["alias"]), (None, &json!("the vault")));
        assert_eq!(v["links"][1]["resolved_path"], "");
        let cut = Note { truncated: true, next: "read on with start_line=2001".into(), ..n };
        assert!(note_text(&cut).ends_with("[read on with start_line=2001]"));
        let on = Note { start_line: 3, end_line: 3, start_byte: 65536, ..cut };
        assert!(note_text(&on).contains("lines 3-3 of 3 (from byte 65536 of line 3)\n"), "{}", note_text(&on));
        assert_eq!(retrieval::to_json(&NoteView::of(&on))["start_byte"], 65536);
        // The schema tells a model how to read on in a long line.
        let schema = input_schema::<ReadNoteArgs>();
        let d = schema["properties"]["start_byte"]["description"].as_str().unwrap_or_default();
        assert!(d.contains("cut_at_byte") && d.contains("64 KiB"), "{schema}");
    }
}
