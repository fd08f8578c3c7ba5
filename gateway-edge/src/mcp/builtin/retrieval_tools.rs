//! The knowledge, memory and skill built-in tools (`coffer__search_knowledge`,
//! `coffer__recall`, `coffer__remember`, `coffer__forget`, `coffer__list_skills`,
//! `coffer__load_skill`): [`Provider`]s whose every call is one `coffer-retrieval` RPC
//! (`proto/retrieval.proto`).
//!
//! Results are written for a model: compact text (one block per passage, `kb:path:start-end  >
//! heading path` and the snippet) plus `structuredContent`: for `search_knowledge` the compact
//! [`Passages`] (what a model or program needs of a passage; its `outputSchema` is derived from
//! the same type), for the others the proto fields in the JSON of [`crate::retrieval`]. They are bounded so a result never floods a context: at most
//! [`MAX_LIMIT`] results (default [`DEFAULT_LIMIT`]) and [`MAX_SNIPPET`] characters per snippet
//! (default [`DEFAULT_SNIPPET`]); a skill's body at most [`MAX_SKILL_CHARS`]. A failed or timed-out
//! engine is named in the text too. Bad arguments and failed calls are tool errors (`isError`),
//! with the same message REST gives (`error::ApiError::from_retrieval`), so the model can correct
//! itself; the caller's mistakes (arguments, a name that names nothing) are [`Invalid`], recorded
//! as `invalid`. Policy (disable/enable) and the invocation log apply as to every tool: the session
//! checks and records before and after [`Provider::call`].
use coffer_proto::retrieval::{
    EngineState, FactId, ListSkillsRequest, RecallRequest, RememberRequest, SearchFilters, SearchReply, SearchRequest,
    SkillName,
};
use futures_util::future::BoxFuture;
use schemars::JsonSchema;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::clients::retrieval::{self, Client};
use crate::error::ApiError;
use crate::mcp::answer::Answer;
use crate::mcp::builtin::{Caller, Invalid, Provider, Registry, Reply, input_schema, tool_error};
use crate::mcp::invocations::MCP_ACTOR;

/// Results a search returns when the call does not say (`limit`).
pub const DEFAULT_LIMIT: u32 = 8;
/// Most results a search returns through MCP (the schema's `maximum`: a larger `limit` is
/// refused by the arguments' check).
pub const MAX_LIMIT: u32 = 20;
/// Snippet length when the call does not say (`snippet_chars`), in characters.
pub const DEFAULT_SNIPPET: u32 = 240;
/// Longest snippet through MCP, in characters.
pub const MAX_SNIPPET: u32 = 1000;
/// Longest skill body a `load_skill` result carries, in characters.
pub const MAX_SKILL_CHARS: usize = 64 * 1024;
/// Longest query of `search_knowledge` and `recall`, in characters (the service takes at most
/// 8192 bytes: a longer text in fewer characters is refused by it).
pub const MAX_QUERY_CHARS: usize = crate::mcp::builtin::search_tools::MAX_QUERY_CHARS;
/// Longest fact `remember` takes, in characters (the service's limit is 16 KiB).
pub const MAX_FACT_CHARS: usize = 16 * 1024;
/// Longest name (knowledge base, skill, fact id, tag), in characters.
pub const MAX_NAME_CHARS: usize = 128;
/// Longest `path_prefix`, in characters.
pub const MAX_PATH_CHARS: usize = 1024;
/// Most knowledge bases or tags in one filter.
pub const MAX_FILTER_ITEMS: usize = 32;
/// Most tags on one remembered fact, and the longest tag (characters).
pub const MAX_FACT_TAGS: usize = 32;
pub const MAX_FACT_TAG_CHARS: usize = 64;
/// Longest `source` of a fact (bytes), as the service takes it.
const MAX_SOURCE: usize = 256;

/// `registry` with the six tools, each calling `client`.
pub fn register(registry: Registry, client: Client) -> Registry {
    registry
        .with(SearchKnowledge(client.clone()))
        .with(Recall(client.clone()))
        .with(Remember(client.clone()))
        .with(Forget(client.clone()))
        .with(ListSkills(client.clone()))
        .with(LoadSkill(client))
}

/// The arguments of `tool` as `T`; absent arguments are `{}`. A problem is the caller's
/// mistake naming the tool and the field (serde's words, without its line and column).
pub(crate) fn args<T: DeserializeOwned>(tool: &str, raw: Option<&str>) -> Result<T, Invalid> {
    serde_json::from_str(raw.unwrap_or("{}")).map_err(|e| {
        let msg = e.to_string();
        let msg = msg.split(" at line ").next().unwrap_or(&msg);
        Invalid(format!("coffer__{tool}: invalid arguments: {msg}"))
    })
}

/// A failed retrieval call, with the REST envelope's message: the caller's mistake when the
/// service refused the request (`INVALID_ARGUMENT`, `OUT_OF_RANGE`, or `NOT_FOUND`: a knowledge
/// base, skill or fact the call named does not exist), else a tool error of the tool's own.
pub(crate) fn failed(status: tonic::Status) -> Reply {
    let callers =
        matches!(status.code(), tonic::Code::InvalidArgument | tonic::Code::OutOfRange | tonic::Code::NotFound);
    let message = ApiError::from_retrieval(status).message;
    if callers { Err(Invalid(message)) } else { Ok(tool_error(&message)) }
}

pub(crate) fn result(text: String, structured: Value) -> Reply {
    Ok(Answer::ok(json!({"content": [{"type": "text", "text": text}], "structuredContent": structured})))
}

/// One name or several (`"kb": "notes"` or `"kb": ["notes", "work"]`).
#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    fn into_vec(self) -> Vec<String> {
        match self {
            OneOrMany::One(s) => vec![s],
            OneOrMany::Many(v) => v,
        }
    }
}

/// `limit` and `snippet_chars` within the MCP bounds (0 or absent: the default).
fn bounds(limit: Option<u32>, snippet: Option<u32>) -> (u32, u32) {
    let limit = limit.filter(|l| *l > 0).unwrap_or(DEFAULT_LIMIT).min(MAX_LIMIT);
    let snippet = snippet.filter(|s| *s > 0).unwrap_or(DEFAULT_SNIPPET).clamp(20, MAX_SNIPPET);
    (limit, snippet)
}

/// `s` cut to `max` characters, ending in `…` when cut; a `**` left open by the cut is closed.
pub fn cut(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_owned();
    }
    let mut t: String = s.chars().take(max.saturating_sub(1)).collect();
    t.truncate(t.trim_end().len());
    if t.matches("**").count() % 2 == 1 {
        t.push_str("**");
    }
    t.push('…');
    t
}

/// `reply` bounded to `limit` results with snippets of at most `snippet` characters (whatever
/// the service sent).
fn bound_reply(mut reply: SearchReply, limit: u32, snippet: u32) -> SearchReply {
    reply.results.truncate(limit as usize);
    for r in &mut reply.results {
        r.snippet = cut(&r.snippet, snippet as usize);
    }
    reply
}

/// The engines' part of a search's text: `keyword 5, grep 2, vector off` and one `warning:`
/// line per warning, plus one for each failed or timed-out engine no warning names.
fn engines_text(reply: &SearchReply) -> (String, Vec<String>) {
    let mut parts = Vec::new();
    let mut warnings: Vec<String> = reply.warnings.clone();
    for e in &reply.engines {
        match e.state() {
            EngineState::Ok => parts.push(format!("{} {}", e.engine, e.hits)),
            EngineState::Failed | EngineState::Timeout => {
                let what = if e.state() == EngineState::Failed { "failed" } else { "timed out" };
                parts.push(format!("{} {what}", e.engine));
                if !warnings.iter().any(|w| w.contains(&e.engine)) {
                    let why = if e.message.is_empty() { String::new() } else { format!(": {}", e.message) };
                    warnings.push(format!("the {} engine {what}{why}", e.engine));
                }
            }
            EngineState::Disabled | EngineState::Unspecified => parts.push(format!("{} off", e.engine)),
        }
    }
    (parts.join(", "), warnings.into_iter().map(|w| format!("warning: {w}")).collect())
}

/// The text of a knowledge search: a summary line, one block per passage (`kb:path:start-end
/// > heading > path`, then the snippet), the warnings.
pub fn search_text(query: &str, reply: &SearchReply) -> String {
    let (engines, warnings) = engines_text(reply);
    let mut out = if reply.results.is_empty() {
        format!("No passages match {query:?} (engines: {engines}). Try other words or fewer filters.")
    } else {
        let n = reply.results.len();
        format!("{n} passage{} for {query:?} (engines: {engines}):", if n == 1 { "" } else { "s" })
    };
    for r in &reply.results {
        out.push_str(&format!("\n\n{}:{}:{}-{}", r.kb, r.path, r.line_start, r.line_end));
        let heading = if r.heading_path.is_empty() && !r.title.is_empty() {
            vec![r.title.clone()]
        } else {
            r.heading_path.clone()
        };
        if !heading.is_empty() {
            out.push_str(&format!("  > {}", heading.join(" > ")));
        }
        out.push('\n');
        out.push_str(r.snippet.trim());
    }
    for w in warnings {
        out.push_str("\n\n");
        out.push_str(&w);
    }
    out
}

/// The text of a tag listing (no query): the notes with `tags`, one block each as in a search,
/// then how to get the next page.
pub fn tagged_text(tags: &[String], reply: &SearchReply) -> String {
    let (_, warnings) = engines_text(reply);
    // Each tag with one `#`, however it was given (`project` or `#project`).
    let tags = tags.iter().map(|t| format!("#{}", t.trim_start_matches('#'))).collect::<Vec<_>>().join(", ");
    let mut out = if reply.results.is_empty() {
        format!("No notes tagged {tags}.")
    } else {
        let n = reply.results.len();
        format!("{n} note{} tagged {tags}:", if n == 1 { "" } else { "s" })
    };
    for r in &reply.results {
        out.push_str(&format!("\n\n{}:{}:{}-{}", r.kb, r.path, r.line_start, r.line_end));
        if !r.title.is_empty() {
            out.push_str(&format!("  > {}", r.title));
        }
        out.push('\n');
        out.push_str(r.snippet.trim());
    }
    if !reply.next_cursor.is_empty() {
        out.push_str(&format!("\n\nMore notes: call again with cursor={:?}.", reply.next_cursor));
    }
    for w in warnings {
        out.push_str("\n\n");
        out.push_str(&w);
    }
    out
}

/// The text of a recall: one block per fact (`fact <id>  [tags: …]`, then its text).
pub fn recall_text(query: &str, reply: &SearchReply) -> String {
    let (_, warnings) = engines_text(reply);
    let mut out = if reply.results.is_empty() {
        format!("No remembered fact matches {query:?}.")
    } else {
        let n = reply.results.len();
        format!("{n} fact{} for {query:?}:", if n == 1 { "" } else { "s" })
    };
    for r in &reply.results {
        let id = if r.fact_id.is_empty() { r.path.trim_end_matches(".md") } else { &r.fact_id };
        out.push_str(&format!("\n\nfact {id}"));
        if !r.tags.is_empty() {
            out.push_str(&format!("  [tags: {}]", r.tags.join(", ")));
        }
        out.push('\n');
        out.push_str(r.snippet.trim());
    }
    for w in warnings {
        out.push_str("\n\n");
        out.push_str(&w);
    }
    out
}

/// The `source` of a fact a session remembers: `mcp:<clientInfo.name>` for an MCP client
/// (`mcp:unknown` when it gave none), the actor for a broker session (`agent`, `cli`, …);
/// at most 256 bytes.
pub fn source_of(caller: &dyn Caller) -> String {
    let s = if caller.actor() == MCP_ACTOR {
        let name = caller.client_name().trim();
        format!("mcp:{}", if name.is_empty() { "unknown" } else { name })
    } else {
        caller.actor().to_owned()
    };
    let mut end = s.len().min(MAX_SOURCE);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].chars().filter(|c| !c.is_control()).collect()
}

// ---------------------------------------------------------------------------------------------
// coffer__search_knowledge

/// `coffer__search_knowledge {query, kb?, path_prefix?, tags?, limit?, snippet_chars?}` →
/// `Search`.
pub struct SearchKnowledge(pub Client);

/// The arguments of `coffer__search_knowledge`; its `inputSchema` is derived from them. `kb`
/// and `tags` also take a single string (advertised as lists).
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SearchArgs {
    #[serde(default)]
    #[schemars(
        length(max = MAX_QUERY_CHARS),
        description = "What to look for: a question or words, e.g. \"how do we rotate the API keys\". Leave it out and give tags to list the notes with those tags instead (by knowledge base and path, limit a page)."
    )]
    query: String,
    #[serde(default)]
    #[schemars(
        with = "Vec<String>",
        length(max = MAX_FILTER_ITEMS),
        inner(length(max = MAX_NAME_CHARS)),
        description = "Only these knowledge bases (names); default: all of them."
    )]
    kb: Option<OneOrMany>,
    #[serde(default)]
    #[schemars(
        with = "String",
        length(max = MAX_PATH_CHARS),
        description = "Only files under this path inside the knowledge base, e.g. \"projects/\"."
    )]
    path_prefix: Option<String>,
    #[serde(default)]
    #[schemars(
        with = "Vec<String>",
        length(max = MAX_FILTER_ITEMS),
        inner(length(max = MAX_NAME_CHARS)),
        description = "Only documents with every one of these tags (front matter or inline #tag; a tag matches its nested tags, project matching project/coffer, in any case)."
    )]
    tags: Option<OneOrMany>,
    #[serde(default)]
    #[schemars(
        with = "u32",
        range(min = 1, max = MAX_LIMIT),
        description = format!("Most passages (default {DEFAULT_LIMIT}, at most {MAX_LIMIT}).")
    )]
    limit: Option<u32>,
    #[serde(default)]
    #[schemars(
        with = "u32",
        range(min = 20, max = MAX_SNIPPET),
        description = format!("Snippet length in characters (default {DEFAULT_SNIPPET}, at most {MAX_SNIPPET}).")
    )]
    snippet_chars: Option<u32>,
    #[serde(default)]
    #[schemars(
        with = "String",
        length(max = 2048),
        description = "A tag listing's next page: the next_cursor the previous page gave."
    )]
    cursor: Option<String>,
}

impl Provider for SearchKnowledge {
    fn name(&self) -> &'static str {
        "search_knowledge"
    }

    fn definition(&self) -> Value {
        json!({
            "name": "search_knowledge",
            "title": "Search the user's notes",
            "description": "Search the user's notes and documents (the markdown knowledge bases they added to Coffer: an Obsidian vault, a docs folder, project notes) with keyword, exact-text and, when configured, semantic search, fused. \
        Use it whenever the user refers to their notes, documents or something they wrote down, or when the answer may be in them. \
        Returns the best matching passages, each as `kb:path:first-last line  > heading path` followed by a snippet with the matches in **bold**; open the file at those lines for more. \
        Ask in natural language or with exact words; punctuation and quotes are fine. A line starting `warning:` means an engine failed and results may be incomplete.",
            "inputSchema": input_schema::<SearchArgs>(),
            "outputSchema": output_schema::<Passages>(),
            "annotations": {"readOnlyHint": true, "openWorldHint": false}
        })
    }

    fn call<'a>(&'a self, _caller: &'a dyn Caller, arguments: Option<&'a str>) -> BoxFuture<'a, Reply> {
        Box::pin(async move {
            let a: SearchArgs = args("search_knowledge", arguments)?;
            let (limit, snippet) = bounds(a.limit, a.snippet_chars);
            let req_tags = a.tags.map(OneOrMany::into_vec).unwrap_or_default();
            if a.query.trim().is_empty() && req_tags.is_empty() {
                return Err(Invalid(
                    "coffer__search_knowledge: invalid arguments: give a query, or tags to list the notes with them"
                        .into(),
                ));
            }
            let req = SearchRequest {
                query: a.query.clone(),
                filters: Some(SearchFilters {
                    kb: a.kb.map(OneOrMany::into_vec).unwrap_or_default(),
                    path_prefix: a.path_prefix.unwrap_or_default(),
                    tags: req_tags.clone(),
                    modified_after_ms: 0,
                }),
                engines: Vec::new(),
                limit,
                snippet_chars: snippet,
                regex: false,
                cursor: a.cursor.unwrap_or_default(),
            };
            match retrieval::call(self.0.clone().search(req)).await {
                Ok(reply) => {
                    let reply = bound_reply(reply, limit, snippet);
                    let text = if a.query.trim().is_empty() {
                        tagged_text(&req_tags, &reply)
                    } else {
                        search_text(&a.query, &reply)
                    };
                    result(text, retrieval::to_json(&Passages::of(&reply)))
                }
                Err(s) => failed(s),
            }
        })
    }
}

/// `coffer__search_knowledge`'s `structuredContent` (its `outputSchema` is derived from this
/// type): what a model or a program needs of each passage, nothing of the engines' scores, the
/// files' absolute paths or times (REST's `/v1/knowledge/search` has those). About 60 bytes
/// a passage beside its snippet.
#[derive(Debug, serde::Serialize, JsonSchema)]
pub struct Passages {
    /// The passages, best first.
    pub results: Vec<Passage>,
    /// Engines that failed or timed out (results may be incomplete); absent when none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// A tag listing (no query) with more notes: the `cursor` of the next page.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub next_cursor: String,
}

/// One passage of [`Passages`].
#[derive(Debug, serde::Serialize, JsonSchema)]
pub struct Passage {
    /// The knowledge base's name.
    pub kb: String,
    /// The file, relative to the knowledge base's root.
    pub path: String,
    /// The headings the passage is under, outermost first, joined by ` > ` (the document's
    /// title when it has none; empty when neither).
    pub heading: String,
    /// First line of the passage in the file, 1-based.
    pub line_start: u32,
    /// Last line, inclusive.
    pub line_end: u32,
    /// The passage's text around the matches, the matches in `**`.
    pub snippet: String,
}

impl Passages {
    /// The passages of `reply` (already bounded) and the warnings its text gives.
    pub fn of(reply: &SearchReply) -> Self {
        let results = reply
            .results
            .iter()
            .map(|r| Passage {
                kb: r.kb.clone(),
                path: r.path.clone(),
                heading: if r.heading_path.is_empty() { r.title.clone() } else { r.heading_path.join(" > ") },
                line_start: r.line_start,
                line_end: r.line_end,
                snippet: r.snippet.trim().to_owned(),
            })
            .collect();
        let (_, warnings) = engines_text(reply);
        let warnings = warnings.into_iter().map(|w| w.trim_start_matches("warning: ").to_owned()).collect();
        Self { results, warnings, next_cursor: reply.next_cursor.clone() }
    }
}

/// The `outputSchema` of a tool whose `structuredContent` serializes from `T`: `T`'s JSON Schema
/// (schemars, draft 2020-12, as serialized), self-contained (no `$ref`: definitions inlined),
/// without the document's `$schema` and `title`, and without integer `format` annotations.
pub fn output_schema<T: JsonSchema>() -> Value {
    let mut settings = schemars::generate::SchemaSettings::draft2020_12().for_serialize();
    settings.inline_subschemas = true;
    let mut schema = settings.into_generator().into_root_schema_for::<T>().to_value();
    fn strip(v: &mut Value) {
        match v {
            Value::Object(o) => {
                if o.get("format")
                    .and_then(Value::as_str)
                    .is_some_and(|f| f.starts_with("uint") || f.starts_with("int"))
                {
                    o.remove("format");
                }
                o.values_mut().for_each(strip);
            }
            Value::Array(a) => a.iter_mut().for_each(strip),
            _ => {}
        }
    }
    strip(&mut schema);
    if let Some(root) = schema.as_object_mut() {
        for key in ["$schema", "title"] {
            root.remove(key);
        }
    }
    schema
}

// ---------------------------------------------------------------------------------------------
// coffer__recall

/// `coffer__recall {query, tags?, limit?}` → `Recall`.
pub struct Recall(pub Client);

/// The arguments of `coffer__recall`; its `inputSchema` is derived from them.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RecallArgs {
    #[schemars(
        length(min = 1, max = MAX_QUERY_CHARS),
        description = "What to recall, e.g. \"preferred test framework\"."
    )]
    query: String,
    #[serde(default)]
    #[schemars(
        with = "Vec<String>",
        length(max = MAX_FILTER_ITEMS),
        inner(length(max = MAX_NAME_CHARS)),
        description = "Only facts with every one of these tags."
    )]
    tags: Option<OneOrMany>,
    #[serde(default)]
    #[schemars(
        with = "u32",
        range(min = 1, max = MAX_LIMIT),
        description = format!("Most facts (default {DEFAULT_LIMIT}, at most {MAX_LIMIT}).")
    )]
    limit: Option<u32>,
}

impl Provider for Recall {
    fn name(&self) -> &'static str {
        "recall"
    }

    fn definition(&self) -> Value {
        json!({
            "name": "recall",
            "title": "Recall remembered facts",
            "description": "Search the facts remembered about the user and their work (saved earlier with coffer__remember, by you or by another assistant): preferences, decisions, setup details, names. \
        Use it at the start of a task, or whenever the user's preferences, past decisions or environment matter. \
        Returns the matching facts, each as `fact <id>  [tags: …]` followed by its text; the id is what coffer__forget takes.",
            "inputSchema": input_schema::<RecallArgs>(),
            "annotations": {"readOnlyHint": true, "openWorldHint": false}
        })
    }

    fn call<'a>(&'a self, _caller: &'a dyn Caller, arguments: Option<&'a str>) -> BoxFuture<'a, Reply> {
        Box::pin(async move {
            let a: RecallArgs = args("recall", arguments)?;
            let (limit, snippet) = bounds(a.limit, Some(MAX_SNIPPET));
            let req = RecallRequest {
                query: a.query.clone(),
                tags: a.tags.map(OneOrMany::into_vec).unwrap_or_default(),
                limit,
                snippet_chars: snippet,
            };
            match retrieval::call(self.0.clone().recall(req)).await {
                Ok(reply) => {
                    let reply = bound_reply(reply, limit, snippet);
                    result(recall_text(&a.query, &reply), retrieval::search_reply_json(&reply))
                }
                Err(s) => failed(s),
            }
        })
    }
}

// ---------------------------------------------------------------------------------------------
// coffer__remember

/// `coffer__remember {text, tags?}` → `Remember`, with `source` `mcp:<clientInfo.name>`.
pub struct Remember(pub Client);

/// The arguments of `coffer__remember`; its `inputSchema` is derived from them.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RememberArgs {
    #[schemars(
        length(min = 1, max = MAX_FACT_CHARS),
        description = "The fact, one self-contained sentence or short paragraph."
    )]
    text: String,
    #[serde(default)]
    #[schemars(
        with = "Vec<String>",
        length(max = MAX_FACT_TAGS),
        inner(length(min = 1, max = MAX_FACT_TAG_CHARS)),
        description = "A few topic words to find it by, e.g. [\"deploy\", \"staging\"]."
    )]
    tags: Option<OneOrMany>,
    #[serde(default)]
    #[schemars(
        description = "Save it even though it looks like a password, token or other secret. Only when the user explicitly asked for this very text to be remembered as it is."
    )]
    allow_secret: bool,
}

impl Provider for Remember {
    fn name(&self) -> &'static str {
        "remember"
    }

    fn definition(&self) -> Value {
        json!({
            "name": "remember",
            "title": "Remember a fact",
            "description": "Save one durable fact about the user or their work (a preference, a decision, a setup detail, a name, a recurring instruction) so that later sessions and other assistants can recall it with coffer__recall. \
        One fact per call, as a self-contained sentence (\"The user's staging database is db-stage-2\", not \"it is db-stage-2\"). Never save passwords, tokens or other secrets (text that looks like one is refused: keep those in Coffer's credential store). \
        Returns the new fact's id; when the same or a nearly identical fact already exists, reports that fact's id instead of saving it twice. The fact is a markdown file the user can read and edit.",
            "inputSchema": input_schema::<RememberArgs>(),
            "annotations": {"readOnlyHint": false, "destructiveHint": false, "idempotentHint": true, "openWorldHint": false}
        })
    }

    fn call<'a>(&'a self, caller: &'a dyn Caller, arguments: Option<&'a str>) -> BoxFuture<'a, Reply> {
        Box::pin(async move {
            let a: RememberArgs = args("remember", arguments)?;
            let req = RememberRequest {
                text: a.text,
                tags: a.tags.map(OneOrMany::into_vec).unwrap_or_default(),
                source: source_of(caller),
                allow_secret: a.allow_secret,
            };
            match retrieval::call(self.0.clone().remember(req)).await {
                Ok(reply) => {
                    let fact = reply.fact.clone().unwrap_or_default();
                    let text = if reply.created {
                        format!("Remembered as fact {}.", fact.id)
                    } else {
                        format!(
                            "Not saved again: fact {} already says this (similarity {:.2}): {}",
                            fact.id,
                            reply.similarity,
                            cut(&fact.text, 300)
                        )
                    };
                    result(text, retrieval::remember_json(&reply))
                }
                Err(s) => failed(s),
            }
        })
    }
}

// ---------------------------------------------------------------------------------------------
// coffer__forget

/// `coffer__forget {id}` → `Forget`.
pub struct Forget(pub Client);

/// The arguments of `coffer__forget`; its `inputSchema` is derived from them.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ForgetArgs {
    #[schemars(
        length(min = 1, max = MAX_NAME_CHARS),
        description = "The fact's id, e.g. \"01JDQ8ZKXW5T3M2N4P6R7S8T9V\"."
    )]
    id: String,
}

impl Provider for Forget {
    fn name(&self) -> &'static str {
        "forget"
    }

    fn definition(&self) -> Value {
        json!({
            "name": "forget",
            "title": "Forget a fact",
            "description": "Delete one remembered fact by its id (as coffer__recall or coffer__remember show it), e.g. when the user says it is wrong or no longer true. \
        Its file is removed; to correct a fact, forget it and remember the right one.",
            "inputSchema": input_schema::<ForgetArgs>(),
            "annotations": {"readOnlyHint": false, "destructiveHint": true, "idempotentHint": true, "openWorldHint": false}
        })
    }

    fn call<'a>(&'a self, _caller: &'a dyn Caller, arguments: Option<&'a str>) -> BoxFuture<'a, Reply> {
        Box::pin(async move {
            let a: ForgetArgs = args("forget", arguments)?;
            match retrieval::call(self.0.clone().forget(FactId { id: a.id.clone() })).await {
                Ok(r) if r.removed == 0 => Err(Invalid(format!("no fact {:?}", a.id))),
                Ok(r) => result(format!("Forgot fact {}.", a.id), json!({"removed": r.removed})),
                Err(s) => failed(s),
            }
        })
    }
}

// ---------------------------------------------------------------------------------------------
// coffer__list_skills

/// `coffer__list_skills {}` → `ListSkills`.
pub struct ListSkills(pub Client);

/// No arguments (`coffer__list_skills`): an empty object, nothing else.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NoArgs {}

impl Provider for ListSkills {
    fn name(&self) -> &'static str {
        "list_skills"
    }

    fn definition(&self) -> Value {
        json!({
            "name": "list_skills",
            "title": "List skills",
            "description": "List the skills installed in Coffer: instructions for particular tasks (the SKILL.md format Claude Code and Codex use), each with its name and a one-line description of when to use it. \
        Use it when a task might have a prepared way of doing it, then load the one that fits with coffer__load_skill.",
            "inputSchema": input_schema::<NoArgs>(),
            "annotations": {"readOnlyHint": true, "openWorldHint": false}
        })
    }

    fn call<'a>(&'a self, _caller: &'a dyn Caller, arguments: Option<&'a str>) -> BoxFuture<'a, Reply> {
        Box::pin(async move {
            args::<NoArgs>("list_skills", arguments)?;
            match retrieval::call(self.0.clone().list_skills(ListSkillsRequest {})).await {
                Ok(r) => {
                    let mut text = if r.skills.is_empty() {
                        "No skills are installed.".to_owned()
                    } else {
                        let lines: Vec<String> = r
                            .skills
                            .iter()
                            .map(|s| format!("{} — {}", s.name, cut(s.description.lines().next().unwrap_or(""), 300)))
                            .collect();
                        format!("{}\n\nLoad one with coffer__load_skill {{\"name\": …}}.", lines.join("\n"))
                    };
                    for i in &r.invalid {
                        text.push_str(&format!("\nnot loadable: {} ({})", i.name, i.error));
                    }
                    let structured = json!({
                        "skills": r.skills.iter().cloned().map(retrieval::skill_summary).map(|s| retrieval::to_json(&s)).collect::<Vec<_>>(),
                        "invalid": r.invalid.iter().cloned().map(retrieval::invalid_skill).map(|s| retrieval::to_json(&s)).collect::<Vec<_>>(),
                    });
                    result(text, structured)
                }
                Err(s) => failed(s),
            }
        })
    }
}

// ---------------------------------------------------------------------------------------------
// coffer__load_skill

/// `coffer__load_skill {name}` → `LoadSkill`.
pub struct LoadSkill(pub Client);

/// The arguments of `coffer__load_skill`; its `inputSchema` is derived from them.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LoadArgs {
    #[schemars(length(min = 1, max = MAX_NAME_CHARS), description = "The skill's name, e.g. \"release-notes\".")]
    name: String,
}

impl Provider for LoadSkill {
    fn name(&self) -> &'static str {
        "load_skill"
    }

    fn definition(&self) -> Value {
        json!({
            "name": "load_skill",
            "title": "Load a skill",
            "description": "Load one skill's full instructions by name (as coffer__list_skills shows it): its SKILL.md without the front matter, and the names of the other files in its folder. Follow the instructions for the task at hand.",
            "inputSchema": input_schema::<LoadArgs>(),
            "annotations": {"readOnlyHint": true, "openWorldHint": false}
        })
    }

    fn call<'a>(&'a self, _caller: &'a dyn Caller, arguments: Option<&'a str>) -> BoxFuture<'a, Reply> {
        Box::pin(async move {
            let a: LoadArgs = args("load_skill", arguments)?;
            match retrieval::call(self.0.clone().load_skill(SkillName { name: a.name })).await {
                Ok(mut skill) => {
                    if skill.body.chars().count() > MAX_SKILL_CHARS {
                        let mut body: String = skill.body.chars().take(MAX_SKILL_CHARS).collect();
                        body.push_str(&format!(
                            "\n\n[cut at {MAX_SKILL_CHARS} characters; the whole file is {}]",
                            skill.path
                        ));
                        skill.body = body;
                    }
                    let mut text = format!("# Skill: {}\n{}\n", skill.name, skill.description);
                    if !skill.files.is_empty() {
                        let dir = std::path::Path::new(&skill.path).parent().map(|p| p.display().to_string());
                        text.push_str(&format!(
                            "(other files in {}: {})\n",
                            dir.unwrap_or_default(),
                            skill.files.join(", ")
                        ));
                    }
                    text.push('\n');
                    text.push_str(&skill.body);
                    result(text, retrieval::to_json(&retrieval::skill(skill)))
                }
                Err(s) => failed(s),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use coffer_proto::retrieval::{EngineReport, SearchResult};

    use super::*;

    struct Session(&'static str, &'static str);

    impl Caller for Session {
        fn session_id(&self) -> &str {
            "s"
        }
        fn list_tools(&self) -> BoxFuture<'_, Vec<(Value, String, String)>> {
            Box::pin(async { Vec::new() })
        }
        fn client_name(&self) -> &str {
            self.1
        }
        fn actor(&self) -> &str {
            self.0
        }
    }

    fn answer_json(a: Answer) -> Value {
        match a {
            Answer::Result(r) => serde_json::from_str(r.get()).unwrap(),
            _ => panic!("a result"),
        }
    }

    /// A client of a port nothing listens on (calls fail as UNAVAILABLE).
    fn dead_client() -> Client {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        retrieval::client(&format!("127.0.0.1:{port}"), &secrecy::SecretString::from("00".to_owned())).unwrap()
    }

    #[test]
    fn sources_name_the_client() {
        assert_eq!(source_of(&Session("mcp", "claude-code")), "mcp:claude-code");
        assert_eq!(source_of(&Session("mcp", "")), "mcp:unknown");
        assert_eq!(source_of(&Session("agent", "coffer")), "agent");
        let long = source_of(&Session("mcp", Box::leak("é".repeat(300).into_boxed_str())));
        assert!(long.len() <= MAX_SOURCE && long.starts_with("mcp:é"), "{}", long.len());
        assert_eq!(source_of(&Session("mcp", "a\u{1b}[31mb")), "mcp:a[31mb");
    }

    #[test]
    fn bounds_default_and_cap() {
        assert_eq!(bounds(None, None), (DEFAULT_LIMIT, DEFAULT_SNIPPET));
        assert_eq!(bounds(Some(0), Some(0)), (DEFAULT_LIMIT, DEFAULT_SNIPPET));
        assert_eq!(bounds(Some(50), Some(5000)), (MAX_LIMIT, MAX_SNIPPET));
        assert_eq!(bounds(Some(3), Some(5)), (3, 20));
        assert_eq!(cut("abc", 3), "abc");
        assert_eq!(cut("a **bold** word", 6), "a **b**…");
        assert_eq!(cut("a **b** c d e", 9), "a **b**…");
    }

    fn reply() -> SearchReply {
        SearchReply {
            results: (1..=30)
                .map(|i| SearchResult {
                    kb: "notes".into(),
                    path: format!("n{i}.md"),
                    heading_path: vec!["Projects".into(), "Coffer".into()],
                    line_start: i,
                    line_end: i + 4,
                    snippet: format!("the **gateway** {}", "x".repeat(2000)),
                    ..Default::default()
                })
                .collect(),
            engines: vec![
                EngineReport {
                    engine: "keyword".into(),
                    state: EngineState::Ok as i32,
                    hits: 30,
                    ..Default::default()
                },
                EngineReport {
                    engine: "vector".into(),
                    state: EngineState::Failed as i32,
                    message: "connection refused".into(),
                    ..Default::default()
                },
                EngineReport { engine: "grep".into(), state: EngineState::Timeout as i32, ..Default::default() },
            ],
            warnings: vec!["grep engine timed out after 2000 ms".into()],
            took_ms: 3,
            fusion: "rrf k=60".into(),
            ..Default::default()
        }
    }

    #[test]
    fn search_text_is_compact_bounded_and_names_failed_engines() {
        let r = bound_reply(reply(), 8, 240);
        assert_eq!(r.results.len(), 8);
        let text = search_text("gateway", &r);
        assert!(
            text.starts_with("8 passages for \"gateway\" (engines: keyword 30, vector failed, grep timed out):"),
            "{text}"
        );
        assert!(text.contains("\n\nnotes:n1.md:1-5  > Projects > Coffer\nthe **gateway** xxx"), "{text}");
        assert!(text.contains("warning: the vector engine failed: connection refused"), "{text}");
        assert!(text.contains("warning: grep engine timed out after 2000 ms"), "{text}");
        assert_eq!(text.matches("warning:").count(), 2, "the grep warning is not repeated: {text}");
        assert!(text.chars().count() < 8 * 300 + 400, "bounded: {} chars", text.chars().count());
        for res in &r.results {
            assert!(res.snippet.chars().count() <= 242, "{}", res.snippet.chars().count());
        }
        let none = search_text("zebra", &SearchReply::default());
        assert!(none.starts_with("No passages match \"zebra\""), "{none}");
    }

    /// A search as the service answers it: eight passages with every field set (absolute
    /// paths, scores, each engine's rank, tags, times), snippets of the default length.
    fn full_reply() -> SearchReply {
        let mut r = reply();
        r.results.truncate(DEFAULT_LIMIT as usize);
        for (i, res) in r.results.iter_mut().enumerate() {
            res.title = "Coffer".into();
            res.score = 0.032_786_885;
            res.ranks = ["keyword", "grep", "vector"]
                .iter()
                .map(|e| coffer_proto::retrieval::EngineRank { engine: (*e).into(), rank: i as u32 + 1, score: 12.5 })
                .collect();
            res.tags = vec!["projects".into(), "gateway".into()];
            res.modified_ms = 1_765_000_000_000;
            res.absolute_path = format!("/home/someone/Documents/Obsidian Vault/notes/projects/{}", res.path);
        }
        bound_reply(r, DEFAULT_LIMIT, DEFAULT_SNIPPET)
    }

    /// Issue 36 §5: the structured part carries what a model or program needs of a passage and
    /// no more — about its snippet plus a line of place — where the service's JSON was more than
    /// twice that.
    #[allow(clippy::print_stdout, reason = "prints the byte counts docs/BENCHMARKS.md quotes")]
    #[test]
    fn search_knowledge_s_structured_content_is_compact() {
        let r = full_reply();
        let old = retrieval::search_reply_json(&r).to_string();
        let new = retrieval::to_json(&Passages::of(&r));
        let bytes = new.to_string().len();
        let snippets: usize = r.results.iter().map(|x| serde_json::to_string(&x.snippet).unwrap().len()).sum();
        println!(
            "search_knowledge structuredContent, 8 passages of 240 characters: {} bytes before, {bytes} after",
            old.len()
        );
        assert!(bytes <= snippets + 8 * 110 + 200, "{bytes} bytes for {snippets} bytes of snippets: {new}");
        assert!(bytes * 2 < old.len(), "{bytes} vs {}", old.len());
        let first = &new["results"][0];
        let keys: Vec<&str> = first.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(keys, ["kb", "path", "heading", "line_start", "line_end", "snippet"]);
        assert_eq!(first["path"], "n1.md", "relative to the knowledge base");
        assert_eq!(first["heading"], "Projects > Coffer");
        assert!(!new.to_string().contains("/home/someone"), "no absolute path");
        assert_eq!(
            new["warnings"],
            json!(["grep engine timed out after 2000 ms", "the vector engine failed: connection refused"])
        );
        let quiet = Passages::of(&SearchReply::default());
        assert_eq!(retrieval::to_json(&quiet), json!({"results": []}), "no warnings member when none");
    }

    /// The advertised `outputSchema` is the one derived from [`Passages`], and what the tool
    /// returns has exactly its members, of its types.
    #[tokio::test]
    async fn search_knowledge_s_output_schema_matches_what_it_returns() {
        let registry = register(Registry::default(), dead_client());
        let def = registry.definitions().into_iter().find(|d| d["name"] == "search_knowledge").unwrap();
        let schema = &def["outputSchema"];
        assert_eq!(*schema, output_schema::<Passages>());
        assert_eq!(schema["type"], "object");
        assert!(!schema.to_string().contains("$ref") && schema.get("$schema").is_none(), "self-contained: {schema}");
        assert_eq!(schema["required"], json!(["results"]));
        let item = &schema["properties"]["results"]["items"];
        let value = retrieval::to_json(&Passages::of(&full_reply()));
        for (key, v) in value["results"][0].as_object().unwrap() {
            let t = item["properties"][key]["type"].as_str().unwrap_or_else(|| panic!("{key} in the schema: {item}"));
            let fits = match t {
                "string" => v.is_string(),
                "integer" => v.is_u64(),
                _ => false,
            };
            assert!(fits, "{key}: {v} is not {t}");
        }
        let mut required: Vec<&str> = item["required"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
        required.sort_unstable();
        assert_eq!(required, ["heading", "kb", "line_end", "line_start", "path", "snippet"]);
        assert_eq!(schema["properties"]["warnings"]["type"], "array");
        for d in registry.definitions().iter().filter(|d| d["name"] != "search_knowledge") {
            assert!(d.get("outputSchema").is_none(), "{}: no schema where structuredContent varies", d["name"]);
        }
    }

    /// The service's refusals of what the call named are the caller's mistakes; its failures are
    /// the tool's.
    #[test]
    fn failed_calls_are_classified() {
        assert!(matches!(failed(tonic::Status::invalid_argument("query is empty")), Err(Invalid(_))));
        assert!(matches!(failed(tonic::Status::not_found("no knowledge base \"x\"")), Err(Invalid(_))));
        assert!(failed(tonic::Status::internal("disk full")).is_ok());
        assert!(failed(tonic::Status::unavailable("down")).is_ok());
    }

    #[test]
    fn recall_text_shows_ids_and_tags() {
        let r = SearchReply {
            results: vec![SearchResult {
                kb: "memory".into(),
                path: "01JX.md".into(),
                fact_id: "01JX".into(),
                tags: vec!["deploy".into()],
                snippet: "Staging is **db-stage-2**".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        assert_eq!(
            recall_text("staging", &r),
            "1 fact for \"staging\":\n\nfact 01JX  [tags: deploy]\nStaging is **db-stage-2**"
        );
    }

    #[tokio::test]
    async fn bad_arguments_are_tool_errors_naming_the_field() {
        let registry = register(Registry::default(), dead_client());
        let caller = Session("mcp", "t");
        for (tool, args, needle) in [
            // Missing and unknown arguments are found against the schema, before the provider.
            ("search_knowledge", None, "give a query, or tags to list the notes with them"),
            ("search_knowledge", Some(r#"{"query": " "}"#), "give a query, or tags to list the notes with them"),
            ("search_knowledge", Some(r#"{"query": 5}"#), "invalid type: integer `5`, expected a string"),
            ("search_knowledge", Some(r#"{"query": "x", "limit": "many"}"#), "invalid type: string \"many\""),
            ("recall", Some(r#"{"query": "x", "color": 1}"#), "unknown argument \"color\""),
            ("remember", Some(r#"{}"#), "missing argument \"text\""),
            ("forget", Some(r#"{"id": ["a"]}"#), "invalid type: sequence"),
            ("list_skills", Some(r#"{"x": 1}"#), "unknown argument \"x\""),
            ("load_skill", Some(r#"{"name": 1}"#), "invalid type: integer `1`, expected a string"),
        ] {
            let called = registry.call_metered(tool, &caller, args).await;
            assert_eq!(called.outcome, crate::mcp::Outcome::Invalid, "{tool} {args:?}: the caller's mistake");
            let out = answer_json(called.answer);
            assert_eq!(out["isError"], true, "{tool} {args:?}: {out}");
            let text = out["content"][0]["text"].as_str().unwrap();
            assert!(text.starts_with(&format!("coffer__{tool}: invalid arguments: ")), "{text}");
            assert!(text.contains(needle), "{tool}: {text}");
            assert!(!text.contains(" at line "), "{text}");
        }
    }

    #[tokio::test]
    async fn a_retrieval_service_that_is_down_is_a_clear_tool_error() {
        let registry = register(Registry::default(), dead_client());
        let started = std::time::Instant::now();
        let called = registry.call_metered("recall", &Session("mcp", "t"), Some(r#"{"query":"x"}"#)).await;
        assert_eq!(called.outcome, crate::mcp::Outcome::UpstreamError, "a service down is not the caller's mistake");
        let out = answer_json(called.answer);
        assert_eq!(out["isError"], true, "{out}");
        let text = out["content"][0]["text"].as_str().unwrap();
        assert!(text.starts_with("the retrieval service is not running ("), "{text}");
        assert!(started.elapsed() < std::time::Duration::from_secs(10), "{:?}", started.elapsed());
    }

    #[tokio::test]
    async fn a_service_that_accepts_and_never_answers_is_noticed_within_seconds() {
        // What a stopped or restarting service looks like: the supervisor keeps its listener, so
        // connections are accepted by the kernel and nobody answers.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let client = retrieval::client(&addr, &secrecy::SecretString::from("00".to_owned())).unwrap();
        let registry = register(Registry::default(), client);
        let started = std::time::Instant::now();
        let out = answer_json(registry.call("list_skills", &Session("mcp", "t"), None).await);
        assert_eq!(out["isError"], true, "{out}");
        let text = out["content"][0]["text"].as_str().unwrap();
        assert!(text.starts_with("the retrieval service is not running ("), "{text}");
        assert!(started.elapsed() < std::time::Duration::from_secs(8), "noticed after {:?}", started.elapsed());
        drop(listener);
    }

    #[tokio::test]
    async fn definitions_are_complete_for_a_model() {
        let registry = register(Registry::default(), dead_client());
        let defs = registry.definitions();
        let names: Vec<&str> = defs.iter().map(|d| d["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["forget", "list_skills", "load_skill", "recall", "remember", "search_knowledge"]);
        for d in &defs {
            assert!(d["description"].as_str().unwrap().len() > 120, "{}", d["name"]);
            assert!(d["description"].as_str().unwrap().contains("Use it") || d["name"] != "search_knowledge");
            assert_eq!(d["inputSchema"]["type"], "object");
            assert_eq!(d["inputSchema"]["additionalProperties"], false, "{}", d["name"]);
            assert!(d["annotations"]["readOnlyHint"].is_boolean(), "{}", d["name"]);
        }
    }
}
