//! Bodies of `/v1/knowledge…` and `/v1/memory…`: knowledge bases, their indexing progress,
//! searches and remembered facts. In requests a `null` field counts as absent, as it always has:
//! every optional field is an `Option`. In answers times are `*_ms` Unix milliseconds, `null`
//! when unknown or never; enums are lowercase words.
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::Page;

/// `POST /v1/knowledge`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KnowledgeBaseCreate {
    /// `^[a-z0-9][a-z0-9_-]{0,63}$`, not `memory`, `search` or `reindex`.
    pub name: String,
    /// An existing folder (absolute); default `COFFER_HOME/knowledge/<name>/`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Globs relative to the root; default `**/*.md`, `**/*.markdown`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include: Option<Vec<String>>,
    /// Globs; `.gitignore` is respected as well.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exclude: Option<Vec<String>>,
}

/// `POST /v1/knowledge/reindex`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Reindex {
    /// One knowledge base; default every one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kb: Option<String>,
    /// Drop the index first. Default false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clean: Option<bool>,
}

/// `POST /v1/knowledge/search`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SearchRequest {
    /// 1-8192 bytes after trimming; empty (or absent) with `tags`: no search, the notes with
    /// those tags, by knowledge base then path, `limit` a page.
    #[serde(default)]
    pub query: String,
    /// Only these knowledge bases; default every folder one (not memory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kb: Option<Vec<String>>,
    /// Only files whose path inside their knowledge base (relative to its root, e.g.
    /// `projects/`) starts with this; at most 1024 bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_prefix: Option<String>,
    /// Documents with every one of these tags.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tags: Option<Vec<String>>,
    /// Unix milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub modified_after_ms: Option<i64>,
    /// `grep`, `keyword`, `vector`; default every enabled engine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engines: Option<Vec<String>>,
    /// Results (at most 50); 0 or absent: 8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    /// Snippet length (at most 2000); 0 or absent: 240.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snippet_chars: Option<u32>,
    /// grep engine: the query is a regex (else literal).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regex: Option<bool>,
    /// A tag listing's next page: the `next_cursor` of the previous one, as it is (at most 2048
    /// bytes). A cursor into a knowledge base the listing no longer covers (removed since the
    /// previous page, or not among `kb`) is refused (`invalid cursor: …`): start again without
    /// one. A search with a `query` has no pages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<String>,
}

/// `POST /v1/memory/recall`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RecallRequest {
    pub query: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tags: Option<Vec<String>>,
    /// Results (at most 50); 0 or absent: 8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    /// Snippet length (at most 2000); 0 or absent: 240.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snippet_chars: Option<u32>,
}

/// `POST /v1/memory`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FactCreate {
    /// 1-16384 bytes.
    pub text: String,
    /// Each `^[A-Za-z0-9_.-]{1,64}$` (CJK letters too); at most 32.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tags: Option<Vec<String>>,
    /// At most 256 bytes; default the request's actor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// Store the text even though it looks like it holds a secret (a token, `Bearer …`,
    /// `password=…`, or prose such as "the staging password is hunter2-Xy9!kQ"); without it
    /// such a text is refused with INVALID_ARGUMENT. Default false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_secret: Option<bool>,
}

// ---------------------------------------------------------------------------------------------
// Answers.

/// Where an indexing pass stands: `idle` (nothing to do; also a state the service did not
/// name: nothing is known to run), `scanning` (walking the folder: nothing counted yet),
/// `indexing`, `failed` (`message` says why).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    #[default]
    Idle,
    Scanning,
    Indexing,
    Failed,
}

impl JobState {
    /// Its word on the wire.
    pub fn word(self) -> &'static str {
        match self {
            JobState::Idle => "idle",
            JobState::Scanning => "scanning",
            JobState::Indexing => "indexing",
            JobState::Failed => "failed",
        }
    }
}

/// A knowledge base's indexing pass.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Progress {
    pub state: JobState,
    /// Files processed in the current pass.
    pub done: u64,
    /// Files in the current pass (0 while scanning).
    pub total: u64,
    /// Bytes of the files processed.
    pub bytes_done: u64,
    /// Bytes of the files in the current pass.
    pub bytes_total: u64,
    /// Unix milliseconds; null: no pass yet.
    pub started_ms: Option<i64>,
    /// Why it failed (state `failed`); may be empty.
    pub message: String,
    /// Increases with every pass started.
    pub job: u64,
}

/// A file a knowledge base could not index.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct FileError {
    /// Relative to the knowledge base's root.
    pub path: String,
    /// e.g. `not UTF-8`, `binary`, `larger than the 16 MiB limit`.
    pub error: String,
}

/// One knowledge base (`GET /v1/knowledge/{kb}`, an item of `GET /v1/knowledge`, the answer of
/// `POST /v1/knowledge`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct KnowledgeBaseInfo {
    pub name: String,
    /// `folder` or `memory`.
    #[schemars(extend("enum" = ["folder", "memory"]))]
    pub kind: String,
    /// The folder (absolute).
    pub root: String,
    /// Globs relative to the root; empty: the default (`**/*.md`, `**/*.markdown`).
    pub include: Vec<String>,
    pub exclude: Vec<String>,
    /// Unix milliseconds; null: unknown.
    pub created_ms: Option<i64>,
    pub documents: u64,
    pub chunks: u64,
    /// Chunks with an embedding (vector engine).
    pub embedded: u64,
    /// Unix milliseconds of the end of the last completed pass or watcher update; null: never.
    pub last_sync_ms: Option<i64>,
    /// Files waiting to be (re)indexed.
    pub pending: u64,
    /// Chunks waiting for an embedding.
    pub pending_embeddings: u64,
    /// Files it could not index.
    pub errors: Vec<FileError>,
    /// Null when the service reported none.
    pub progress: Option<Progress>,
    /// The folder watcher is live.
    pub watching: bool,
    /// Hidden folders the walk skipped (`.github`, `.obsidian`…; relative to the root; `.git`
    /// not counted), at most 20 named.
    #[serde(default)]
    pub hidden_skipped: Vec<String>,
    /// How many hidden folders were skipped.
    #[serde(default)]
    pub hidden_skipped_count: u64,
    /// Bytes of its documents' files.
    #[serde(default)]
    pub corpus_bytes: u64,
    /// Bytes of the index on disk that are its share (estimated: the index tables' size shared
    /// out among knowledge bases by corpus bytes).
    #[serde(default)]
    pub index_bytes: u64,
    /// `coffer__write_note` may write into it: always for `COFFER_HOME/knowledge/<name>`, for
    /// the user's own folder once marked (`PATCH /v1/knowledge/{kb} {"writable": true}`).
    #[serde(default)]
    pub writable: bool,
}

/// `PATCH /v1/knowledge/{kb}`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KnowledgeBasePatch {
    /// Let `coffer__write_note` write into this folder (true) or make it read-only again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub writable: Option<bool>,
}

/// A `[[wikilink]]` of a note, resolved.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct NoteLink {
    /// As written: `Note`, `folder/Note`; empty for a link into the same note.
    pub target: String,
    /// After `#`: a heading or `^block`.
    pub fragment: String,
    /// After `|`.
    pub alias: String,
    /// `![[…]]`.
    pub embed: bool,
    /// 1-based line of the link.
    pub line: u32,
    /// The note it resolves to (by file name, then alias, then path); empty: unresolved.
    pub resolved_path: String,
}

/// A note that links to another.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct NoteBacklink {
    pub path: String,
    pub title: String,
    /// The link's line in it.
    pub line: u32,
    /// The link's `|alias` text.
    pub alias: String,
    /// The heading or `^block` it links to (`[[Note#Heading]]`), if any.
    #[serde(default)]
    pub fragment: String,
    /// An embed (`![[Note]]`).
    #[serde(default)]
    pub embed: bool,
}

/// `GET /v1/knowledge/{kb}/note?path=…`: one note's lines (at most 2,000 lines or 64 KiB; `next`
/// says how to read on), title, tags, links and backlinks.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Note {
    pub kb: String,
    pub path: String,
    pub absolute_path: String,
    pub title: String,
    /// Front matter tags, then inline `#tags`.
    pub tags: Vec<String>,
    pub text: String,
    pub start_line: u32,
    pub end_line: u32,
    pub total_lines: u32,
    pub truncated: bool,
    /// When `truncated`: how to read on (`start_line=N`, or `start_line=N start_byte=B` in a
    /// line longer than 64 KiB).
    pub next: String,
    /// `text` starts this many bytes into `start_line` (the `start_byte` asked for).
    #[serde(default)]
    pub start_byte: u32,
    /// Non-zero: line `end_line` is longer than 64 KiB and was cut after this many of its bytes;
    /// `start_line=end_line&start_byte=cut_at_byte` reads on.
    #[serde(default)]
    pub cut_at_byte: u32,
    pub links: Vec<NoteLink>,
    pub backlinks: Vec<NoteBacklink>,
    pub backlinks_truncated: bool,
    /// Unix milliseconds.
    pub modified_ms: i64,
    /// Bytes of the whole file.
    pub size: u64,
    /// False: not in the index yet (links unresolved, no backlinks).
    pub indexed: bool,
}

/// How one search engine is configured.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct EngineConfig {
    /// `grep`, `keyword` or `vector`.
    #[schemars(extend("enum" = ["grep", "keyword", "vector"]))]
    pub name: String,
    pub enabled: bool,
    /// vector: `<model> (<dimension>) at <base url>` or why it is off.
    pub detail: String,
}

/// `GET /v1/knowledge`: every knowledge base (the memory one too, kind `memory`), one page, and
/// the engines.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct KnowledgeBases {
    pub items: Vec<KnowledgeBaseInfo>,
    /// Always null: one page.
    #[schemars(extend("type" = "null"))]
    pub next_cursor: Option<String>,
    pub engines: Vec<EngineConfig>,
}

/// `POST /v1/knowledge/reindex` → 202: the knowledge bases whose pass started (follow each with
/// `GET /v1/knowledge/{kb}` until its `progress.job` is at least the one here and its state is
/// `idle` or `failed`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ReindexStarted {
    pub items: Vec<KnowledgeBaseInfo>,
}

/// `DELETE /v1/knowledge/{kb}` and `DELETE /v1/memory/{id}`: what was forgotten.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Removed {
    /// Documents forgotten (a knowledge base), or 1 (a fact).
    pub removed: u64,
}

/// How a search engine's part of a search ended: `ok`, `failed`, `timeout` (`message` says
/// why), or `disabled` (not configured, like vector without an endpoint, or not asked; also a
/// state the service did not name).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum EngineState {
    Ok,
    Failed,
    Timeout,
    #[default]
    Disabled,
}

/// One engine that found a result, and where it ranked it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct EngineRank {
    pub engine: String,
    /// 1-based.
    pub rank: u32,
    /// The engine's own score.
    pub score: f64,
}

/// One passage a search found.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SearchResult {
    pub kb: String,
    /// Relative to the knowledge base's root.
    pub path: String,
    pub title: String,
    /// The headings the passage is under, outermost first.
    pub heading_path: Vec<String>,
    /// 1-based, inclusive.
    pub line_start: u32,
    pub line_end: u32,
    /// Matches wrapped in `**`.
    pub snippet: String,
    /// Fused score (reciprocal rank fusion).
    pub score: f64,
    /// Each engine that found it.
    pub ranks: Vec<EngineRank>,
    pub tags: Vec<String>,
    /// Unix milliseconds; null: unknown.
    pub modified_ms: Option<i64>,
    /// Memory results: the fact's id; null elsewhere.
    pub fact_id: Option<String>,
    pub absolute_path: String,
}

/// What one engine did in a search.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct EngineReport {
    pub engine: String,
    pub state: EngineState,
    /// Hits it contributed before fusion.
    pub hits: u32,
    /// Milliseconds.
    pub took_ms: u32,
    /// Why it failed or timed out (never a secret); empty otherwise.
    pub message: String,
}

/// The answer of `POST /v1/knowledge/search` and `POST /v1/memory/recall`: the fused results,
/// best first.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SearchReply {
    pub results: Vec<SearchResult>,
    pub engines: Vec<EngineReport>,
    /// e.g. `vector engine failed: …`.
    pub warnings: Vec<String>,
    /// Milliseconds.
    pub took_ms: u32,
    /// e.g. `scores per document, weights grep 1 keyword 3 vector 2`.
    pub fusion: String,
    /// A tag listing with more notes: pass it as `cursor` for the next page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// A remembered fact (`GET /v1/memory/{id}`, an item of `GET /v1/memory`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Fact {
    /// A ULID (upper case); for a note written into `memory/` by hand, its file name without
    /// `.md`.
    pub id: String,
    pub text: String,
    pub tags: Vec<String>,
    /// Who said it: `mcp:<client name>`, `cli`, `api`, …
    pub source: String,
    /// Unix milliseconds; null: unknown.
    pub created_ms: Option<i64>,
    /// Its file (absolute).
    pub path: String,
    /// Present when the file has a problem (a malformed front matter: the fact is shown without
    /// its tags and source).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub warning: Option<String>,
}

/// The answer of `POST /v1/memory`: 201 with the new fact, or 200 with an existing duplicate.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RememberReply {
    pub fact: Fact,
    /// false: `fact` is an existing exact or near duplicate.
    pub created: bool,
    /// With the duplicate (1.0: exact); present only when `created` is false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "f64")]
    pub similarity: Option<f64>,
}

/// `GET /v1/memory`: a page of facts, newest first.
pub type Facts = Page<Fact>;
