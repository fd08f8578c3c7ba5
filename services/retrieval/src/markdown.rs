//! Markdown documents for retrieval: YAML front matter, title, and chunks by heading section
//! then by size, each with its heading path, exact line range and content hash.
//!
//! Parsing is CommonMark (plus GFM tables, footnotes, task lists, heading attributes) by
//! `pulldown-cmark`, so a `#` line inside a fenced code block is code, not a heading. Front
//! matter is the YAML metadata block that opens the file (pulldown-cmark's
//! `ENABLE_YAML_STYLE_METADATA_BLOCKS` rules: `---` on the first line, a non-blank line after
//! it, closed by `---` or `...`); it is parsed with `yaml-rust2` under budgets (size, depth,
//! values, alias expansion) and never indexed as prose. A `---` block later in the file is an
//! ordinary thematic break.
//!
//! Lines are counted as `grep` counts them (`\n`-terminated, 1-based, inclusive), so the grep
//! engine's hits fall into the chunks that hold them. Chunk text is the file's lines as
//! written, with `\r\n` normalized to `\n`. Everything here is deterministic: the same bytes
//! give the same chunks and hashes.
use std::collections::{BTreeMap, HashMap};
use std::ops::Range;

use pulldown_cmark::{Event, LinkType, MetadataBlockKind, Options, Parser, Tag, TagEnd};
use serde_json::Value;
use sha2::{Digest, Sha256};
use yaml_rust2::parser::{Event as YamlEvent, Parser as YamlParser};
use yaml_rust2::scanner::TScalarStyle;

/// Longest front matter (bytes, fences included); longer is [`MarkdownError::FrontMatter`].
pub const MAX_FRONT_MATTER_BYTES: usize = 256 * 1024;
/// Deepest nesting of front matter mappings and lists.
pub const MAX_FRONT_MATTER_DEPTH: usize = 64;
/// Most values (scalars, lists, mappings, alias expansions counted in full) in front matter.
pub const MAX_FRONT_MATTER_VALUES: usize = 100_000;

/// How sections are cut by size. Lengths are in characters (Unicode scalar values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkOptions {
    /// Longest chunk text (default 1500). At least 16.
    pub max_chars: usize,
    /// How much of the end of a chunk the next chunk of the same section repeats (default
    /// 200), in whole lines; less than `max_chars / 2`.
    pub overlap_chars: usize,
}

impl Default for ChunkOptions {
    fn default() -> Self {
        Self { max_chars: 1500, overlap_chars: 200 }
    }
}

/// A document's parsed front matter.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FrontMatter {
    /// Every key, as JSON values (YAML 1.2 core schema: plain `true`, `12`, `1.5`, `null`
    /// typed, everything else a string; dates stay strings; `.inf`/`.nan` become strings).
    pub fields: BTreeMap<String, Value>,
    /// `title` when it is a non-empty string (or a number).
    pub title: Option<String>,
    /// `tags` (or `tag`): a list, or a string split at commas and spaces; a leading `#`
    /// dropped, empty ones dropped, duplicates removed, order kept.
    pub tags: Vec<String>,
    /// `aliases` (or `alias`): other names the note's `[[wikilinks]]` may use; a list, or one
    /// string (not split); trimmed, empty ones and duplicates dropped.
    pub aliases: Vec<String>,
}

/// One piece of a document for the indexes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    /// The headings above the chunk, outermost first (its own section's heading last).
    pub heading_path: Vec<String>,
    /// First line, 1-based, in the whole file (front matter counted).
    pub line_start: u32,
    /// Last line, 1-based, inclusive.
    pub line_end: u32,
    /// The chunk's markdown as in the file (lines `line_start..=line_end`, `\r\n` → `\n`; a
    /// line longer than `max_chars` is cut into pieces that share its line number).
    pub text: String,
    /// Lower-case hex SHA-256 of `text` (UTF-8).
    pub hash: String,
}

/// A parsed markdown document.
#[derive(Debug, Clone, PartialEq)]
pub struct Document {
    pub front_matter: Option<FrontMatter>,
    /// Front matter `title`, else the first `#` (level 1) heading, else the fallback.
    pub title: String,
    /// In document order; sections with nothing but blank lines are dropped, and so is a
    /// heading with no text of its own when a sub-heading follows (its path carries it).
    pub chunks: Vec<Chunk>,
    /// First line after the front matter, 1-based (1 without front matter).
    pub body_line: u32,
    /// Inline `#tags` of the body (see [`inline_tags_and_links`]), in order, without `#`.
    pub inline_tags: Vec<String>,
    /// `[[wikilinks]]` and `![[embeds]]` of the body, in order.
    pub links: Vec<WikiLink>,
}

/// A `[[wikilink]]` or `![[embed]]` in a note's body, as written (resolution to a note is the
/// store's: by file name, then alias, then path).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WikiLink {
    /// The note part (`Note`, `folder/Note`, `Note.md`), trimmed; empty for `[[#Heading]]` (a
    /// link into the same note).
    pub target: String,
    /// After the first `#`: a heading or `^block` id; empty without.
    pub fragment: String,
    /// The text after `|` (`[[Note|alias text]]`); empty without.
    pub alias: String,
    /// `![[…]]`: the target is embedded, not only linked.
    pub embed: bool,
    /// 1-based line of the file where the link starts.
    pub line: u32,
}

impl WikiLink {
    /// The key a link resolves by: the target lower-cased, `\` as `/`, without a trailing `.md`
    /// or `.markdown` and without leading `./` or `/`.
    pub fn target_key(&self) -> String {
        link_key(&self.target)
    }
}

/// [`WikiLink::target_key`] of any target text (a link's, a file path, an alias).
pub fn link_key(target: &str) -> String {
    let t = target.trim().replace('\\', "/").to_lowercase();
    let t = t.trim_start_matches("./").trim_start_matches('/');
    let t = t.strip_suffix(".md").or_else(|| t.strip_suffix(".markdown")).unwrap_or(t);
    t.to_owned()
}

/// Why a document could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MarkdownError {
    /// The front matter is not valid YAML, not a mapping, or over a budget. `line` is the
    /// 1-based line of the file where the problem is.
    #[error("front matter, line {line}: {message}")]
    FrontMatter { line: u32, message: String },
    /// The chunk options are out of range.
    #[error("chunk options: {0}")]
    Options(String),
}

fn fm_error(line: usize, message: impl Into<String>) -> MarkdownError {
    MarkdownError::FrontMatter { line: u32::try_from(line).unwrap_or(u32::MAX), message: message.into() }
}

// ---------------------------------------------------------------------------------------------
// Front matter
// ---------------------------------------------------------------------------------------------

/// The lines of `s` as byte ranges, without their `\n` (a `\r` before it stays in the range).
fn line_ranges(s: &str) -> impl Iterator<Item = Range<usize>> + '_ {
    let mut pos = 0;
    std::iter::from_fn(move || {
        if pos >= s.len() {
            return None;
        }
        let end = s[pos..].find('\n').map_or(s.len(), |i| pos + i);
        let r = pos..end;
        pos = end + 1;
        Some(r)
    })
}

fn strip_cr(line: &str) -> &str {
    line.strip_suffix('\r').unwrap_or(line)
}

/// A closing fence line as pulldown-cmark reads one: exactly `---` or `...`, then only spaces.
fn is_closing_fence(line: &str) -> bool {
    let line = strip_cr(line);
    let (fence, rest) = line.split_at(line.len().min(3));
    (fence == "---" || fence == "...") && rest.bytes().all(|b| b == b' ')
}

/// Finds and parses the front matter at the start of `text` (after an optional UTF-8 BOM).
/// Returns it (or `None` when the file has none) and the byte offset where the body starts
/// (just after the closing fence's line; 0 without front matter).
///
/// # Errors
/// [`MarkdownError::FrontMatter`] with the file line: invalid YAML (the parser's message),
/// not a mapping, longer than [`MAX_FRONT_MATTER_BYTES`], deeper than
/// [`MAX_FRONT_MATTER_DEPTH`], more than [`MAX_FRONT_MATTER_VALUES`] values (alias bombs
/// included), an unknown alias, or a key that is not a scalar.
pub fn parse_front_matter(text: &str) -> Result<(Option<FrontMatter>, usize), MarkdownError> {
    let (body_start, yaml) = match front_matter_block(text) {
        None => return Ok((None, 0)),
        Some((_, None)) => {
            return Err(fm_error(1, format!("longer than the {} KiB limit", MAX_FRONT_MATTER_BYTES / 1024)));
        }
        Some((body_start, Some(yaml))) => (body_start, yaml),
    };
    let value = yaml_to_json(&yaml).map_err(|(line, msg)| fm_error(line + 1, msg))?;
    let fields = match value {
        Value::Object(map) => map.into_iter().collect::<BTreeMap<_, _>>(),
        Value::Null => BTreeMap::new(),
        _ => return Err(fm_error(2, "must be a mapping of keys to values")),
    };
    let title = match fields.get("title") {
        Some(Value::String(t)) if !t.trim().is_empty() => Some(t.trim().to_owned()),
        Some(Value::Number(n)) => Some(n.to_string()),
        _ => None,
    };
    let tags = tags_of(fields.get("tags").or_else(|| fields.get("tag")));
    let aliases = aliases_of(fields.get("aliases").or_else(|| fields.get("alias")));
    Ok((Some(FrontMatter { fields, title, tags, aliases }), body_start))
}

/// The metadata block that opens `text`, whatever its YAML holds: the byte offset where the
/// body starts (a BOM counted) and the YAML text (`None` when the block is longer than
/// [`MAX_FRONT_MATTER_BYTES`]). `None` when the file has no such block.
fn front_matter_block(text: &str) -> Option<(usize, Option<String>)> {
    let bom = if text.starts_with('\u{feff}') { '\u{feff}'.len_utf8() } else { 0 };
    let s = &text[bom..];
    let mut lines = line_ranges(s);
    let first = lines.next()?;
    let opening = strip_cr(&s[first.clone()]);
    if !opening.starts_with("---") || !opening[3..].bytes().all(|b| b.is_ascii_whitespace()) {
        return None;
    }
    // The first line inside may be neither blank nor a closing fence (else `---` is a rule).
    let mut body_start = None;
    for (n, r) in lines.enumerate() {
        let line = &s[r.clone()];
        if n == 0 && (line.trim().is_empty() || is_closing_fence(line)) {
            return None;
        }
        if is_closing_fence(line) {
            body_start = Some((r.end + 1).min(s.len()));
            break;
        }
    }
    let body_start = body_start?;
    if body_start > MAX_FRONT_MATTER_BYTES {
        return Some((bom + body_start, None));
    }
    // pulldown-cmark has the last word on what the metadata block holds.
    let yaml = metadata_block(&s[..body_start])?;
    Some((bom + body_start, Some(yaml)))
}

/// The text of the YAML metadata block that opens `prefix`, as pulldown-cmark reads it.
fn metadata_block(prefix: &str) -> Option<String> {
    let mut events = Parser::new_ext(prefix, Options::ENABLE_YAML_STYLE_METADATA_BLOCKS);
    match events.next()? {
        Event::Start(Tag::MetadataBlock(MetadataBlockKind::YamlStyle)) => {}
        _ => return None,
    }
    let mut yaml = String::new();
    for e in events {
        match e {
            Event::Text(t) => yaml.push_str(&t),
            Event::End(TagEnd::MetadataBlock(_)) => return Some(yaml),
            _ => {}
        }
    }
    None
}

fn tags_of(v: Option<&Value>) -> Vec<String> {
    let mut raw: Vec<String> = Vec::new();
    match v {
        Some(Value::Array(items)) => {
            for item in items {
                match item {
                    Value::String(s) => raw.push(s.clone()),
                    Value::Number(n) => raw.push(n.to_string()),
                    Value::Bool(b) => raw.push(b.to_string()),
                    _ => {}
                }
            }
        }
        Some(Value::String(s)) => raw.extend(s.split([',', ' ', '\t']).map(str::to_owned)),
        _ => {}
    }
    let mut out: Vec<String> = Vec::new();
    for t in raw {
        let t = t.trim().trim_start_matches('#').trim();
        if !t.is_empty() && !out.iter().any(|o| o == t) {
            out.push(t.to_owned());
        }
    }
    out
}

fn aliases_of(v: Option<&Value>) -> Vec<String> {
    let raw: Vec<String> = match v {
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(|i| match i {
                Value::String(s) => Some(s.clone()),
                Value::Number(n) => Some(n.to_string()),
                _ => None,
            })
            .collect(),
        Some(Value::String(s)) => vec![s.clone()],
        _ => Vec::new(),
    };
    let mut out: Vec<String> = Vec::new();
    for a in raw {
        let a = a.trim();
        if !a.is_empty() && !out.iter().any(|o| o == a) {
            out.push(a.to_owned());
        }
    }
    out
}

/// One open collection while building the JSON value from YAML events.
enum Frame {
    Seq { items: Vec<Value>, anchor: usize },
    Map { map: serde_json::Map<String, Value>, key: Option<String>, anchor: usize },
}

/// YAML text → JSON value under the budgets; errors carry the 1-based line within `yaml`.
fn yaml_to_json(yaml: &str) -> Result<Value, (usize, String)> {
    let mut parser = YamlParser::new_from_str(yaml);
    let mut stack: Vec<Frame> = Vec::new();
    let mut anchors: HashMap<usize, Value> = HashMap::new();
    let mut values = 0usize;
    let mut root: Option<Value> = None;
    loop {
        let (event, mark) = parser.next_token().map_err(|e| (e.marker().line(), e.info().to_owned()))?;
        let line = mark.line();
        let value = match event {
            YamlEvent::StreamEnd => break,
            YamlEvent::DocumentStart if root.is_some() => {
                return Err((line, "holds more than one YAML document".to_owned()));
            }
            YamlEvent::Nothing | YamlEvent::StreamStart | YamlEvent::DocumentStart | YamlEvent::DocumentEnd => {
                continue;
            }
            YamlEvent::SequenceStart(anchor, _) | YamlEvent::MappingStart(anchor, _) => {
                if stack.len() >= MAX_FRONT_MATTER_DEPTH {
                    return Err((line, format!("nested deeper than {MAX_FRONT_MATTER_DEPTH} levels")));
                }
                stack.push(if matches!(event, YamlEvent::SequenceStart(..)) {
                    Frame::Seq { items: Vec::new(), anchor }
                } else {
                    Frame::Map { map: serde_json::Map::new(), key: None, anchor }
                });
                continue;
            }
            YamlEvent::SequenceEnd | YamlEvent::MappingEnd => match stack.pop() {
                Some(Frame::Seq { items, anchor }) => remember(&mut anchors, anchor, Value::Array(items)),
                Some(Frame::Map { map, anchor, .. }) => remember(&mut anchors, anchor, Value::Object(map)),
                None => return Err((line, "unbalanced collection".to_owned())),
            },
            YamlEvent::Scalar(text, style, anchor, tag) => {
                let tag = tag.map(|t| t.suffix);
                remember(&mut anchors, anchor, scalar(&text, style, tag.as_deref()))
            }
            YamlEvent::Alias(id) => {
                let v = anchors.get(&id).cloned().ok_or((line, "alias to an unknown anchor".to_owned()))?;
                values = values.saturating_add(count_values(&v, MAX_FRONT_MATTER_VALUES));
                v
            }
        };
        values += 1;
        if values > MAX_FRONT_MATTER_VALUES {
            return Err((line, format!("more than {MAX_FRONT_MATTER_VALUES} values (aliases counted in full)")));
        }
        match stack.last_mut() {
            None => root = Some(value),
            Some(Frame::Seq { items, .. }) => items.push(value),
            Some(Frame::Map { map, key, .. }) => match key.take() {
                Some(k) => {
                    map.insert(k, value);
                }
                None => {
                    *key = Some(match value {
                        Value::String(s) => s,
                        Value::Null => "null".to_owned(),
                        Value::Bool(b) => b.to_string(),
                        Value::Number(n) => n.to_string(),
                        _ => return Err((line, "a key is a list or a mapping (keys must be plain values)".to_owned())),
                    });
                }
            },
        }
    }
    Ok(root.unwrap_or(Value::Null))
}

fn remember(anchors: &mut HashMap<usize, Value>, anchor: usize, v: Value) -> Value {
    if anchor > 0 {
        anchors.insert(anchor, v.clone());
    }
    v
}

/// Values in `v` (itself included), stopping early once past `cap`.
fn count_values(v: &Value, cap: usize) -> usize {
    let mut n = 0usize;
    let mut todo = vec![v];
    while let Some(v) = todo.pop() {
        n += 1;
        if n > cap {
            return n;
        }
        match v {
            Value::Array(a) => todo.extend(a.iter()),
            Value::Object(o) => todo.extend(o.values()),
            _ => {}
        }
    }
    n
}

/// A YAML scalar under the YAML 1.2 core schema, as JSON.
fn scalar(text: &str, style: TScalarStyle, tag: Option<&str>) -> Value {
    match tag {
        Some("str") => return Value::String(text.to_owned()),
        Some("null" | "bool" | "int" | "float") => {}
        Some(_) => return Value::String(text.to_owned()),
        None if style != TScalarStyle::Plain => return Value::String(text.to_owned()),
        None => {}
    }
    match text {
        "" | "~" | "null" | "Null" | "NULL" => return Value::Null,
        "true" | "True" | "TRUE" => return Value::Bool(true),
        "false" | "False" | "FALSE" => return Value::Bool(false),
        _ => {}
    }
    let unsigned = text.strip_prefix(['-', '+']).unwrap_or(text);
    if !unsigned.is_empty()
        && unsigned.bytes().all(|b| b.is_ascii_digit())
        && let Ok(i) = text.parse::<i64>()
    {
        return Value::from(i);
    }
    if let Some(hex) = text.strip_prefix("0x")
        && let Ok(i) = i64::from_str_radix(hex, 16)
    {
        return Value::from(i);
    }
    if let Some(oct) = text.strip_prefix("0o")
        && let Ok(i) = i64::from_str_radix(oct, 8)
    {
        return Value::from(i);
    }
    let float_like = unsigned.bytes().any(|b| b.is_ascii_digit())
        && unsigned.bytes().all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'-' | b'+'));
    if float_like
        && let Ok(f) = text.parse::<f64>()
        && let Some(n) = serde_json::Number::from_f64(f)
    {
        return Value::Number(n);
    }
    Value::String(text.to_owned())
}

// ---------------------------------------------------------------------------------------------
// Body: blocks, sections, chunks
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BlockKind {
    Heading,
    Code,
    Other,
}

/// A top-level block of the body: byte range (in the whole text) and kind.
struct Block {
    range: Range<usize>,
    kind: BlockKind,
    /// Heading level (1..=6) and text, for headings.
    heading: Option<(usize, String)>,
}

/// The markdown a note may hold, as pulldown-cmark reads it: CommonMark with GitHub's extensions
/// (tables, footnotes, strikethrough, task lists, heading attributes, alerts).
fn markdown_options() -> Options {
    Options::ENABLE_TABLES
        | Options::ENABLE_FOOTNOTES
        | Options::ENABLE_STRIKETHROUGH
        | Options::ENABLE_TASKLISTS
        | Options::ENABLE_HEADING_ATTRIBUTES
        | Options::ENABLE_GFM
}

fn top_level_blocks(text: &str, body_start: usize) -> Vec<Block> {
    let body = &text[body_start..];
    let opts = markdown_options();
    let mut blocks = Vec::new();
    let mut depth = 0usize;
    let mut current: Option<Block> = None;
    for (event, range) in Parser::new_ext(body, opts).into_offset_iter() {
        let range = (range.start + body_start)..(range.end + body_start);
        match event {
            Event::Start(tag) => {
                if depth == 0 {
                    let (kind, heading) = match &tag {
                        Tag::Heading { level, .. } => (BlockKind::Heading, Some((*level as usize, String::new()))),
                        Tag::CodeBlock(_) => (BlockKind::Code, None),
                        _ => (BlockKind::Other, None),
                    };
                    current = Some(Block { range: range.clone(), kind, heading });
                }
                depth += 1;
            }
            Event::End(_) => {
                depth = depth.saturating_sub(1);
                if depth == 0
                    && let Some(mut b) = current.take()
                {
                    b.range.end = b.range.end.max(range.end);
                    if let Some((_, t)) = &mut b.heading {
                        *t = t.split_whitespace().collect::<Vec<_>>().join(" ");
                    }
                    blocks.push(b);
                }
            }
            Event::Text(t) | Event::Code(t) | Event::InlineMath(t) | Event::DisplayMath(t) => {
                if let Some(Block { heading: Some((_, h)), .. }) = &mut current {
                    h.push_str(&t);
                } else if depth == 0 {
                    blocks.push(Block { range, kind: BlockKind::Other, heading: None });
                }
            }
            Event::SoftBreak | Event::HardBreak => {
                if let Some(Block { heading: Some((_, h)), .. }) = &mut current {
                    h.push(' ');
                }
            }
            _ => {
                if depth == 0 {
                    blocks.push(Block { range, kind: BlockKind::Other, heading: None });
                }
            }
        }
    }
    blocks
}

/// Where a cut between two adjacent lines may fall, best first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Cut {
    /// Between blocks (a paragraph boundary).
    Block,
    /// Between two lines of one block (a list, a long paragraph, a code block too long to
    /// keep whole).
    Line,
    /// Inside a code block that fits in a chunk: only when nothing else is possible.
    Never,
}

/// The lines of the whole text, with what chunking needs of each.
struct Lines<'a> {
    text: &'a str,
    /// Byte start of each line.
    starts: Vec<usize>,
    /// Byte end of each line (without `\n` and a `\r` before it).
    ends: Vec<usize>,
}

impl<'a> Lines<'a> {
    fn new(text: &'a str) -> Self {
        let mut starts = Vec::new();
        let mut ends = Vec::new();
        for r in line_ranges(text) {
            starts.push(r.start);
            let end = if text[r.clone()].ends_with('\r') { r.end - 1 } else { r.end };
            ends.push(end);
        }
        Self { text, starts, ends }
    }

    fn len(&self) -> usize {
        self.starts.len()
    }

    /// The 0-based line holding byte `offset`.
    fn line_of(&self, offset: usize) -> usize {
        self.starts.partition_point(|&s| s <= offset).saturating_sub(1)
    }

    fn line(&self, i: usize) -> &'a str {
        &self.text[self.starts[i]..self.ends[i]]
    }

    fn is_blank(&self, i: usize) -> bool {
        self.line(i).trim().is_empty()
    }
}

/// A heading section: 0-based inclusive line range and heading path.
struct Section {
    path: Vec<String>,
    level: usize,
    first: usize,
    last: usize,
    /// Lines of the heading block itself (0 for the preamble).
    heading_lines: usize,
}

/// Parses `text` (a whole markdown file) into its front matter, title and chunks.
/// `fallback_title` (usually the file stem) is the title when neither front matter nor a `#`
/// heading gives one.
///
/// Sections longer than `opts.max_chars` are cut by size: at a block boundary when one falls
/// in the second half of the window, else between two lines, never between two lines of a
/// fenced code block that fits in a chunk, and inside a single line only when that line alone
/// is too long (at a space when there is one, never inside a character). Consecutive chunks of
/// a section overlap by up to `opts.overlap_chars` of whole lines.
///
/// # Errors
/// [`MarkdownError::FrontMatter`] when the front matter is malformed (the caller decides:
/// a skill is excluded; a note is indexed without it through [`parse_lenient`]);
/// [`MarkdownError::Options`]
/// for `max_chars < 16` or `overlap_chars >= max_chars / 2`.
pub fn parse(text: &str, fallback_title: &str, opts: &ChunkOptions) -> Result<Document, MarkdownError> {
    check_options(opts)?;
    let (front_matter, body_start) = parse_front_matter(text)?;
    Ok(parse_body(text, fallback_title, opts, front_matter, body_start))
}

/// Like [`parse`], but a malformed front matter does not stop the document: its block is
/// skipped (never indexed as prose), the document has no front matter, and the front matter
/// error comes back beside it, for the caller to report (a KB note is still searchable).
///
/// # Errors
/// Only [`MarkdownError::Options`].
pub fn parse_lenient(
    text: &str,
    fallback_title: &str,
    opts: &ChunkOptions,
) -> Result<(Document, Option<MarkdownError>), MarkdownError> {
    check_options(opts)?;
    match parse_front_matter(text) {
        Ok((front_matter, body_start)) => Ok((parse_body(text, fallback_title, opts, front_matter, body_start), None)),
        Err(e) => {
            let body_start = front_matter_block(text).map_or(0, |(b, _)| b);
            Ok((parse_body(text, fallback_title, opts, None, body_start), Some(e)))
        }
    }
}

fn check_options(opts: &ChunkOptions) -> Result<(), MarkdownError> {
    if opts.max_chars < 16 {
        return Err(MarkdownError::Options(format!("max_chars is {}; at least 16", opts.max_chars)));
    }
    if opts.overlap_chars >= opts.max_chars / 2 {
        return Err(MarkdownError::Options(format!(
            "overlap_chars ({}) must be less than half of max_chars ({})",
            opts.overlap_chars, opts.max_chars
        )));
    }
    Ok(())
}

fn parse_body(
    text: &str,
    fallback_title: &str,
    opts: &ChunkOptions,
    front_matter: Option<FrontMatter>,
    body_start: usize,
) -> Document {
    let lines = Lines::new(text);
    // `body_start` is the start of a line (just after the closing fence's `\n`) or the end.
    let body_first = if body_start >= text.len() { lines.len() } else { lines.line_of(body_start) };
    let body_line = u32::try_from(body_first + 1).unwrap_or(u32::MAX);

    let blocks = if body_start < text.len() { top_level_blocks(text, body_start) } else { Vec::new() };
    let title = front_matter
        .as_ref()
        .and_then(|f| f.title.clone())
        .or_else(|| {
            blocks.iter().find_map(|b| match &b.heading {
                Some((1, t)) if !t.is_empty() => Some(t.clone()),
                _ => None,
            })
        })
        .unwrap_or_else(|| fallback_title.to_owned());

    // Each line's block (by index) and its cut class towards the next line.
    let n = lines.len();
    let mut block_of: Vec<u32> = vec![u32::MAX; n];
    let mut block_lines: Vec<(usize, usize)> = Vec::with_capacity(blocks.len());
    for (id, b) in blocks.iter().enumerate() {
        let first = lines.line_of(b.range.start);
        let last = lines.line_of(b.range.end.saturating_sub(1).max(b.range.start));
        block_lines.push((first, last));
        for slot in &mut block_of[first..=last.min(n.saturating_sub(1))] {
            if *slot == u32::MAX {
                *slot = u32::try_from(id).unwrap_or(u32::MAX - 1);
            }
        }
    }
    let line_chars: Vec<usize> = (0..n).map(|i| lines.line(i).chars().count()).collect();
    let block_chars: Vec<usize> =
        block_lines.iter().map(|&(f, l)| (f..=l.min(n - 1)).map(|i| line_chars[i] + 1).sum()).collect();
    let cut_after = |i: usize| -> Cut {
        let (a, b) = (block_of[i], block_of.get(i + 1).copied().unwrap_or(u32::MAX));
        if a == u32::MAX || b == u32::MAX || a != b {
            Cut::Block
        } else if blocks[a as usize].kind == BlockKind::Code && block_chars[a as usize] <= opts.max_chars {
            Cut::Never
        } else {
            Cut::Line
        }
    };

    // Sections by top-level headings.
    let mut sections: Vec<Section> = Vec::new();
    let mut path: Vec<(usize, String)> = Vec::new();
    let mut open = Section { path: Vec::new(), level: 0, first: body_first, last: 0, heading_lines: 0 };
    for (id, b) in blocks.iter().enumerate() {
        let Some((level, heading)) = &b.heading else { continue };
        if heading.is_empty() {
            continue;
        }
        let (first, last) = block_lines[id];
        // The open section ends above this heading (a preamble with no lines is dropped).
        if first > open.first {
            open.last = first - 1;
            sections.push(open);
        }
        while path.last().is_some_and(|(l, _)| l >= level) {
            path.pop();
        }
        path.push((*level, heading.clone()));
        open = Section {
            path: path.iter().map(|(_, h)| h.clone()).collect(),
            level: *level,
            first,
            last: 0,
            heading_lines: last - first + 1,
        };
    }
    if open.first < n {
        open.last = n - 1;
        sections.push(open);
    }

    let mut chunks = Vec::new();
    for (i, s) in sections.iter().enumerate() {
        let content = (s.first + s.heading_lines..=s.last).any(|l| l < n && !lines.is_blank(l));
        let any = (s.first..=s.last.min(n.saturating_sub(1))).any(|l| !lines.is_blank(l));
        if !any {
            continue;
        }
        if !content && s.heading_lines > 0 && sections.get(i + 1).is_some_and(|next| next.level > s.level) {
            continue;
        }
        chunk_section(&lines, &line_chars, &cut_after, s, opts, &mut chunks);
    }
    let (inline_tags, links) =
        if body_start < text.len() { inline_tags_and_links(text, body_start) } else { Default::default() };
    Document { front_matter, title, chunks, body_line, inline_tags, links }
}

/// Longest inline tag kept, in bytes (a longer `#run` is not a tag).
pub const MAX_INLINE_TAG_BYTES: usize = 128;
/// Most inline tags and most links kept of one note (the rest are ignored).
pub const MAX_INLINE_TAGS: usize = 256;
/// Most `[[wikilinks]]` kept of one note.
pub const MAX_LINKS: usize = 4096;

/// The inline `#tags` and `[[wikilinks]]` of the body of `text` (from byte `body_start`).
///
/// A tag is `#` followed by letters, digits, `_`, `-` and `/` (nested tags such as `#a/b`),
/// at the start of a text run or after whitespace, with at least one character that is not a
/// digit (`#1984` is not a tag), as Obsidian reads them. It is found in prose only: not in code
/// spans or blocks, raw HTML, link destinations (URL fragments), and a `# heading` marker is
/// not one. Tags come back without `#`, in order, without duplicates (compared
/// case-insensitively, the first spelling kept), at most [`MAX_INLINE_TAGS`].
///
/// Links are pulldown-cmark's wikilinks (`[[Note]]`, `[[Note|alias]]`, `[[Note#Heading]]`, and
/// `![[embed]]`), at most [`MAX_LINKS`], with the line each starts on.
pub fn inline_tags_and_links(text: &str, body_start: usize) -> (Vec<String>, Vec<WikiLink>) {
    let body = &text[body_start..];
    let opts = markdown_options() | Options::ENABLE_WIKILINKS;
    let line_starts: Vec<usize> = std::iter::once(0).chain(text.match_indices('\n').map(|(i, _)| i + 1)).collect();
    let line_of =
        |offset: usize| -> u32 { u32::try_from(line_starts.partition_point(|&s| s <= offset)).unwrap_or(u32::MAX) };
    let mut tags: Vec<String> = Vec::new();
    let mut links: Vec<WikiLink> = Vec::new();
    let mut code_depth = 0usize;
    // The open wikilink: its link and the alias text gathered so far.
    let mut open: Option<(WikiLink, Option<String>)> = None;
    // Whether the previous event ended in a character that may precede a tag.
    let mut boundary = true;
    for (event, range) in Parser::new_ext(body, opts).into_offset_iter() {
        match event {
            Event::Start(Tag::CodeBlock(_)) => code_depth += 1,
            Event::End(TagEnd::CodeBlock) => code_depth = code_depth.saturating_sub(1),
            Event::Start(Tag::Link { link_type: LinkType::WikiLink { has_pothole }, dest_url, .. })
            | Event::Start(Tag::Image { link_type: LinkType::WikiLink { has_pothole }, dest_url, .. }) => {
                let embed = body[range.clone()].starts_with('!');
                let (target, fragment) = match dest_url.split_once('#') {
                    Some((t, f)) => (t.trim().to_owned(), f.trim().to_owned()),
                    None => (dest_url.trim().to_owned(), String::new()),
                };
                let link =
                    WikiLink { target, fragment, alias: String::new(), embed, line: line_of(body_start + range.start) };
                open = Some((link, has_pothole.then(String::new)));
            }
            Event::End(TagEnd::Link | TagEnd::Image) => {
                if let Some((mut link, alias)) = open.take() {
                    if let Some(alias) = alias {
                        link.alias = alias.split_whitespace().collect::<Vec<_>>().join(" ");
                    }
                    if links.len() < MAX_LINKS && !(link.target.is_empty() && link.fragment.is_empty()) {
                        links.push(link);
                    }
                }
                boundary = false;
            }
            Event::Text(t) => {
                if let Some((_, alias)) = &mut open {
                    if let Some(alias) = alias {
                        alias.push_str(&t);
                    }
                } else if code_depth == 0 {
                    scan_tags(&t, boundary, &mut tags);
                }
                boundary = t.chars().last().is_none_or(char::is_whitespace);
            }
            Event::SoftBreak | Event::HardBreak => boundary = true,
            Event::Start(_) | Event::End(_) => boundary = true,
            _ => boundary = false,
        }
    }
    (tags, links)
}

/// The `#tags` of one run of prose text, appended to `out` (see [`inline_tags_and_links`]).
/// `boundary`: the run starts where a tag may start.
fn scan_tags(text: &str, boundary: bool, out: &mut Vec<String>) {
    let is_tag_char = |c: char| c.is_alphanumeric() || matches!(c, '_' | '-' | '/');
    let mut prev_ok = boundary;
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if c == '#' && prev_ok {
            let rest = &text[i + 1..];
            let end = rest.find(|c: char| !is_tag_char(c)).unwrap_or(rest.len());
            let tag = rest[..end].trim_end_matches('/');
            let valid = !tag.is_empty()
                && !tag.starts_with('/')
                && !tag.contains("//")
                && tag.len() <= MAX_INLINE_TAG_BYTES
                && tag.chars().any(|c| !c.is_ascii_digit() && c != '/');
            if valid && out.len() < MAX_INLINE_TAGS && !out.iter().any(|o| o.to_lowercase() == tag.to_lowercase()) {
                out.push(tag.to_owned());
            }
            // Skip what was read as the tag (or the run after a `#` that is not one).
            while chars.peek().is_some_and(|&(j, _)| j <= i + end) {
                chars.next();
            }
            prev_ok = false;
            continue;
        }
        prev_ok = c.is_whitespace() || matches!(c, '(' | '[' | ',' | ';');
    }
}

fn make_chunk(path: &[String], first: usize, last: usize, text: String) -> Chunk {
    let hash = hex::encode(Sha256::digest(text.as_bytes()));
    Chunk {
        heading_path: path.to_vec(),
        line_start: u32::try_from(first + 1).unwrap_or(u32::MAX),
        line_end: u32::try_from(last + 1).unwrap_or(u32::MAX),
        text,
        hash,
    }
}

fn join_lines(lines: &Lines<'_>, first: usize, last: usize) -> String {
    let mut out = String::new();
    for i in first..=last {
        if i > first {
            out.push('\n');
        }
        out.push_str(lines.line(i));
    }
    out
}

fn chunk_section(
    lines: &Lines<'_>,
    line_chars: &[usize],
    cut_after: &dyn Fn(usize) -> Cut,
    s: &Section,
    opts: &ChunkOptions,
    out: &mut Vec<Chunk>,
) {
    let n = lines.len();
    let mut first = s.first;
    let mut last = s.last.min(n - 1);
    while first <= last && lines.is_blank(first) {
        first += 1;
    }
    while last > first && lines.is_blank(last) {
        last -= 1;
    }
    if first > last {
        return;
    }
    let max = opts.max_chars;
    let mut start = first;
    while start <= last {
        // The window: as many whole lines from `start` as fit.
        let mut size = 0usize;
        let mut end = None;
        for (j, &chars) in line_chars.iter().enumerate().take(last + 1).skip(start) {
            let add = chars + usize::from(j > start);
            if size + add > max {
                break;
            }
            size += add;
            end = Some(j);
        }
        let Some(end) = end else {
            // One line longer than a chunk: cut it into pieces of its own.
            split_long_line(lines.line(start), start, &s.path, opts, out);
            start = next_nonblank(lines, start + 1, last);
            continue;
        };
        if end == last {
            out.push(make_chunk(&s.path, start, end, join_lines(lines, start, end)));
            break;
        }
        // Pick the cut: the last block boundary in the second half of the window, else the
        // last line boundary there, else the last block or line boundary at all, else the end.
        let mut sizes = Vec::with_capacity(end - start + 1);
        let mut acc = 0usize;
        for (j, &chars) in line_chars.iter().enumerate().take(end + 1).skip(start) {
            acc += chars + usize::from(j > start);
            sizes.push(acc);
        }
        let pick = |want: Cut, min_size: usize| -> Option<usize> {
            (start..=end).rev().find(|&c| cut_after(c) == want && sizes[c - start] >= min_size && !lines.is_blank(c))
        };
        let half = max / 2;
        let cut = pick(Cut::Block, half)
            .or_else(|| pick(Cut::Line, half))
            .or_else(|| pick(Cut::Block, 0))
            .or_else(|| pick(Cut::Line, 0))
            .unwrap_or(end);
        let mut cut = cut;
        while cut > start && lines.is_blank(cut) {
            cut -= 1;
        }
        out.push(make_chunk(&s.path, start, cut, join_lines(lines, start, cut)));
        // Overlap: the last whole lines of this chunk that fit in `overlap_chars`, never
        // starting inside a code block that fits in a chunk.
        let mut next = cut + 1;
        let mut ov = 0usize;
        while next > start + 1 {
            let add = line_chars[next - 1] + 1;
            if ov + add > opts.overlap_chars || cut_after(next - 2) == Cut::Never {
                break;
            }
            ov += add;
            next -= 1;
        }
        start = next_nonblank(lines, next, last);
    }
}

fn next_nonblank(lines: &Lines<'_>, mut i: usize, last: usize) -> usize {
    while i <= last && lines.is_blank(i) {
        i += 1;
    }
    i
}

/// Cuts one over-long line into chunks of at most `max_chars` characters, at the last space
/// of each window when there is one in its second half, overlapping by up to `overlap_chars`.
fn split_long_line(line: &str, line_no: usize, path: &[String], opts: &ChunkOptions, out: &mut Vec<Chunk>) {
    let max = opts.max_chars;
    let mut rest = line;
    loop {
        // Byte offset after `max` characters.
        let Some((window_end, _)) = rest.char_indices().nth(max) else {
            if !rest.trim().is_empty() {
                out.push(make_chunk(path, line_no, line_no, rest.to_owned()));
            }
            return;
        };
        let window = &rest[..window_end];
        let half = window.char_indices().nth(max / 2).map_or(0, |(i, _)| i);
        let cut = match window.rfind(char::is_whitespace) {
            Some(i) if i >= half => i + window[i..].chars().next().map_or(1, char::len_utf8),
            _ => window_end,
        };
        let piece = &rest[..cut];
        if !piece.trim().is_empty() {
            out.push(make_chunk(path, line_no, line_no, piece.to_owned()));
        }
        // The next piece starts up to `overlap_chars` characters back (after a space when
        // there is one), and always at least one character further than this one.
        let piece_chars = piece.chars().count();
        let back = opts.overlap_chars.min(piece_chars.saturating_sub(1));
        let mut from = piece.char_indices().nth(piece_chars - back).map_or(cut, |(i, _)| i);
        if let Some(sp) = piece[from..].find(char::is_whitespace) {
            let after = from + sp + piece[from + sp..].chars().next().map_or(1, char::len_utf8);
            if after < cut {
                from = after;
            }
        }
        rest = &rest[from..];
    }
}

#[cfg(test)]
#[path = "tests/markdown.rs"]
mod tests;
