//! `coffer__search_tools {query, limit?}`: the caller's tools (every tool its `tools/list`
//! would show, and the disabled ones marked as such; Coffer's own built-ins left out) that best
//! answer `query`, a question or a task in the user's words ("what time is it in Tokyo").
//!
//! Ranking ([`crate::mcp::builtin::tool_rank`]): field-weighted BM25 over each tool's name
//! (split on `_`, `-`, `.` and case), title, description, parameters and server, on stemmed
//! terms without stopwords — the **keyword** mode, always there. When an embeddings endpoint is
//! configured (`retrieval.embeddings.*`; the client and its key live in `coffer-retrieval`,
//! reached through its `Embed` RPC), the tools are also ranked by cosine similarity of the
//! query's vector and each tool's text (exposed name, title and description, at most
//! [`TOOL_TEXT_CHARS`] characters; those below [`MIN_SIMILARITY`] left out), and the two
//! rankings are fused by reciprocal rank — the **hybrid** mode. A tool's vector is cached by a
//! hash of its text (and the model that made it, so a new model re-embeds), so a search embeds
//! only the query and the tools it has not seen; the cache is filled on `search_tools` calls
//! only. When the endpoint fails, the keyword ranking answers and `structuredContent.fallback`
//! and the text say why.
//!
//! The candidates are every tool but the meta tools themselves (`search_tools`, `describe_tool`,
//! `call_tool`): Coffer's own tools (`coffer__remember`, …) are found like upstream ones.
//!
//! **Relevance cutoff** (keyword mode, [`tool_rank::cut_weak`]): when the best tool is a good
//! match (a query term in its name, title or server, or more than half the query's terms), the
//! tools that only share a word in passing are left out; when even the best is not, the answer
//! says "No good match" before the closest tools and `structuredContent.weak` is `true` — so
//! "what time is it in Tokyo" without a time server is not answered with a filesystem tool as if
//! it fitted. (In hybrid mode the similarity floor [`MIN_SIMILARITY`] is the cutoff.)
//!
//! The answer is compact (it lands in a model's context): one line per tool, `exposed_name —
//! one-line description` (` (disabled)` when it is), at most [`DEFAULT_RESULTS`] unless `limit`
//! says more; `structuredContent` `{mode, matches: [{name, server, description, enabled}],
//! weak?, fallback?}` with the same one-line descriptions. A query that finds nothing is quoted
//! back at most [`QUOTED_QUERY_CHARS`] characters long.
//!
//! Bad input is the caller's mistake (a tool error recorded as `invalid`), said in plain words:
//! an empty query, one with no letters or digits, one that is not text, a `limit` that is not a
//! whole number from 1 to [`MAX_RESULTS`] (refused, never brought inside); a query over
//! [`MAX_QUERY_CHARS`] is refused by the registry's schema check.
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};

use coffer_types::BUILTIN_SERVER;
use futures_util::future::BoxFuture;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::mcp::answer::Answer;
use crate::mcp::builtin::tool_rank::{self, ToolDoc, ToolIndex};
use crate::mcp::builtin::{Caller, Invalid, Provider, Reply, input_schema, meta};

/// Longest `query`, in characters (also the knowledge and memory tools' limit).
pub const MAX_QUERY_CHARS: usize = 8192;
/// Longest text of one tool that is embedded, in characters.
pub const TOOL_TEXT_CHARS: usize = 2000;
/// Cosine similarity below which a tool is not a semantic match.
pub const MIN_SIMILARITY: f32 = 0.2;
/// Most tool vectors kept (the cache starts afresh beyond it).
pub const CACHE_ENTRIES: usize = 4096;
/// Most texts one embeddings call carries (the `Embed` RPC's limit).
const BATCH: usize = 256;

/// What an embeddings call gives: the model and one vector per text, in order.
pub type Embedded = Result<(String, Vec<Vec<f32>>), EmbedFailure>;

/// Vectors for texts, from wherever the embeddings endpoint is reached.
pub trait Embed: Send + Sync {
    /// One vector per text, in order, and the model that made them.
    ///
    /// # Errors
    /// [`EmbedFailure::Off`] when no endpoint is configured (the reason), [`EmbedFailure::Failed`]
    /// when it did not answer well.
    fn embed(&self, texts: Vec<String>) -> BoxFuture<'_, Embedded>;
}

/// Why no vectors came.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EmbedFailure {
    /// No embeddings endpoint is configured (the normal case for many homes: not an error).
    Off(String),
    /// The endpoint or the service failed.
    Failed(String),
}

/// `coffer-retrieval`'s `Embed` RPC.
impl Embed for crate::clients::retrieval::Client {
    fn embed(&self, texts: Vec<String>) -> BoxFuture<'_, Embedded> {
        Box::pin(async move {
            let mut client = self.clone();
            let request = coffer_proto::retrieval::EmbedRequest { texts };
            let rpc = coffer_proto::retrieval::retrieval_client::RetrievalClient::embed(&mut client, request);
            match crate::clients::retrieval::call(rpc).await {
                Ok(r) => Ok((r.model, r.vectors.into_iter().map(|v| v.values).collect())),
                Err(s) if s.code() == tonic::Code::FailedPrecondition => Err(EmbedFailure::Off(s.message().to_owned())),
                Err(s) if s.code() == tonic::Code::Unimplemented => {
                    Err(EmbedFailure::Off("the retrieval service cannot embed".into()))
                }
                Err(s) => Err(EmbedFailure::Failed(s.message().to_owned())),
            }
        })
    }
}

#[derive(Default)]
struct Cache {
    model: String,
    vectors: HashMap<u64, Arc<[f32]>>,
}

/// The `search_tools` built-in.
pub struct SearchTools {
    embedder: Option<Arc<dyn Embed>>,
    cache: Mutex<Cache>,
}

impl SearchTools {
    /// Keyword mode only (`None`) or semantic when `embedder` has an endpoint.
    pub fn new(embedder: Option<Arc<dyn Embed>>) -> Self {
        Self { embedder, cache: Mutex::default() }
    }

    /// How many tool vectors are cached (for tests).
    pub fn cached(&self) -> usize {
        self.cache.lock().unwrap_or_else(|e| e.into_inner()).vectors.len()
    }
}

/// Results of `coffer__search_tools` when the call names no `limit`, and the most it gives.
pub const DEFAULT_RESULTS: u64 = 5;
pub const MAX_RESULTS: u64 = 50;
/// Longest one-line description in a result, in characters.
pub const DESCRIPTION_CHARS: usize = 160;

/// The arguments of `coffer__search_tools`; its `inputSchema` is derived from them (the call
/// reads them in [`parse`], for errors in plain words). Members it does not name are ignored
/// (as they always were); a `limit` outside 1–50 is refused.
#[derive(Deserialize, JsonSchema)]
#[allow(dead_code, reason = "the schema's source and its examples' check; the call reads its arguments in parse()")]
pub struct SearchToolsArgs {
    #[schemars(
        length(min = 1, max = MAX_QUERY_CHARS),
        description = "What you want to do or know, in your words, e.g. \"read a file\" or \"what time is it in Tokyo\"."
    )]
    query: String,
    #[serde(default)]
    #[schemars(with = "u64", range(min = 1, max = MAX_RESULTS), description = "Most results (default 5).")]
    limit: Option<u64>,
}

impl Provider for SearchTools {
    fn name(&self) -> &'static str {
        "search_tools"
    }

    fn definition(&self) -> Value {
        json!({
            "name": "search_tools",
            "title": "Search tools",
            "description": "Find the tools available through Coffer that fit what you want to do: ask in your own words \
        (\"what time is it in Tokyo\", \"show the last commits\"). Ranks every tool by its name, description, parameters \
        and server (and by meaning when an embeddings endpoint is configured). Returns the best matches, one per line, \
        as `exposed_name — what it does`, so you can call them directly; a disabled tool is marked (disabled).",
            "inputSchema": input_schema::<SearchToolsArgs>(),
            "annotations": {"readOnlyHint": true, "openWorldHint": false}
        })
    }

    fn call<'a>(&'a self, caller: &'a dyn Caller, arguments: Option<&'a str>) -> BoxFuture<'a, Reply> {
        Box::pin(self.search(caller, arguments))
    }
}

/// One tool as the search sees it.
struct Candidate<'a> {
    tool: &'a Value,
    server: &'a str,
    enabled: bool,
}

impl Candidate<'_> {
    fn field(&self, key: &str) -> &str {
        self.tool.get(key).and_then(Value::as_str).unwrap_or_default()
    }

    fn text(&self) -> String {
        embedded_text(self.tool)
    }
}

/// What is embedded for a tool (an MCP `Tool` with its exposed name): `name: title.
/// description`, cut to [`TOOL_TEXT_CHARS`].
pub fn embedded_text(tool: &Value) -> String {
    let field = |key: &str| tool.get(key).and_then(Value::as_str).unwrap_or_default();
    let mut t = field("name").to_owned();
    for part in [field("title"), field("description")] {
        if !part.is_empty() {
            t.push_str(if t.contains(':') { ". " } else { ": " });
            t.push_str(part);
        }
    }
    t.chars().take(TOOL_TEXT_CHARS).collect()
}

fn text_key(text: &str) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut h);
    h.finish()
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    if a.len() != b.len() || a.is_empty() {
        return 0.0;
    }
    let (mut dot, mut na, mut nb) = (0f32, 0f32, 0f32);
    for (x, y) in a.iter().zip(b) {
        dot += x * y;
        na += x * x;
        nb += y * y;
    }
    if na == 0.0 || nb == 0.0 { 0.0 } else { dot / (na.sqrt() * nb.sqrt()) }
}

/// The arguments, or the caller's mistake in plain words (never serde's: "limit must be a whole
/// number from 1 to 50; got \"ten\""). A `limit` outside 1–[`MAX_RESULTS`] is refused, not
/// brought inside.
fn parse(args: Option<&str>) -> Result<(String, usize), Invalid> {
    let bad = |why: &str| Invalid(format!("coffer__search_tools: invalid arguments: {why}"));
    let v: Value = serde_json::from_str(args.unwrap_or("{}")).map_err(|_| bad("arguments are not valid JSON"))?;
    let query = match v.get("query") {
        Some(Value::String(q)) => q.clone(),
        None | Some(Value::Null) => return Err(bad("query is missing: say what you want to do, e.g. \"read a file\"")),
        Some(other) => {
            return Err(bad(&format!("query must be text (what you want to do, in words), not {}", json_kind(other))));
        }
    };
    if query.trim().is_empty() {
        return Err(bad("query is empty: say what you want to do, e.g. \"read a file\""));
    }
    if !query.chars().any(char::is_alphanumeric) {
        return Err(bad("query has no words to search for"));
    }
    let limit = match v.get("limit") {
        None | Some(Value::Null) => DEFAULT_RESULTS,
        Some(Value::Number(n)) if n.as_u64().is_some_and(|n| (1..=MAX_RESULTS).contains(&n)) => {
            n.as_u64().unwrap_or(DEFAULT_RESULTS)
        }
        Some(other) => {
            let got = match other {
                Value::String(t) => format!("{:?}", t.chars().take(20).collect::<String>()),
                Value::Number(n) => n.to_string(),
                other => json_kind(other).to_owned(),
            };
            return Err(bad(&format!("limit must be a whole number from 1 to {MAX_RESULTS}; got {got}")));
        }
    };
    Ok((query, limit as usize))
}

/// "text", "a number", … for an error message.
fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "true or false",
        Value::Number(_) => "a number",
        Value::String(_) => "text",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// `query` as a "no match" answer quotes it: at most [`QUOTED_QUERY_CHARS`] characters.
fn quoted(query: &str) -> String {
    let q = query.trim();
    if q.chars().count() <= QUOTED_QUERY_CHARS {
        return format!("{q:?}");
    }
    let head: String = q.chars().take(QUOTED_QUERY_CHARS - 1).collect();
    format!("{:?}", format!("{}…", head.trim_end()))
}

/// Longest query a "no match" answer quotes, in characters.
pub const QUOTED_QUERY_CHARS: usize = 60;

/// Whether `original` on [`BUILTIN_SERVER`] is one of the meta tools (`search_tools` itself,
/// `describe_tool`, `call_tool`): never a search result; every other built-in is a candidate.
fn is_meta(server: &str, original: &str) -> bool {
    server == BUILTIN_SERVER && [meta::SEARCH, meta::DESCRIBE, meta::CALL].contains(&original)
}

impl SearchTools {
    async fn search(&self, caller: &dyn Caller, args: Option<&str>) -> Reply {
        let (query, limit) = parse(args)?;
        let mut tools = caller.list_all_tools().await;
        tools.retain(|(_, server, original, _)| !is_meta(server, original));
        let candidates: Vec<Candidate<'_>> =
            tools.iter().map(|(tool, server, _, enabled)| Candidate { tool, server, enabled: *enabled }).collect();
        let docs: Vec<ToolDoc> = tools.iter().map(|(t, s, o, _)| ToolDoc::from_definition(t, s, o)).collect();
        let index = ToolIndex::new(&docs);
        let keyword: Vec<usize> = index.rank(&query).into_iter().map(|(i, _)| i).collect();
        let mut fallback = None;
        if let Some(embedder) = &self.embedder {
            match self.semantic(embedder.as_ref(), &query, &candidates).await {
                Ok(semantic) => {
                    let fused: Vec<usize> = tool_rank::fuse(&[keyword, semantic]).into_iter().map(|(i, _)| i).collect();
                    return Ok(render(&query, &candidates, &fused, limit, "hybrid", None, false));
                }
                Err(EmbedFailure::Off(_)) => {}
                Err(EmbedFailure::Failed(why)) => {
                    tracing::warn!(error = %why, "Semantic tool search failed; keyword search answered.");
                    fallback = Some(why);
                }
            }
        }
        let (shown, weak) = tool_rank::cut_weak(&index, &query, &keyword);
        Ok(render(&query, &candidates, &shown, limit, "keyword", fallback, weak))
    }

    /// The candidates at or above [`MIN_SIMILARITY`], most similar first (ties by position).
    async fn semantic(
        &self,
        embedder: &dyn Embed,
        query: &str,
        candidates: &[Candidate<'_>],
    ) -> Result<Vec<usize>, EmbedFailure> {
        let texts: Vec<String> = candidates.iter().map(Candidate::text).collect();
        let keys: Vec<u64> = texts.iter().map(|t| text_key(t)).collect();
        let mut query_vector = None;
        // Twice at most: a reply from another model than the cached vectors' starts the cache afresh.
        for _ in 0..2 {
            let missing: Vec<usize> = {
                let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
                let mut seen = std::collections::HashSet::new();
                (0..texts.len()).filter(|&i| !cache.vectors.contains_key(&keys[i]) && seen.insert(keys[i])).collect()
            };
            let mut inputs: Vec<String> = vec![query.to_owned()];
            inputs.extend(missing.iter().map(|&i| texts[i].clone()));
            let mut vectors = Vec::with_capacity(inputs.len());
            let mut model = None::<String>;
            for batch in inputs.chunks(BATCH) {
                let (m, v) = embedder.embed(batch.to_vec()).await?;
                if v.len() != batch.len() {
                    return Err(EmbedFailure::Failed(format!("{} vectors for {} texts", v.len(), batch.len())));
                }
                if model.as_ref().is_some_and(|old| *old != m) {
                    return Err(EmbedFailure::Failed("the embeddings model changed during the search".into()));
                }
                model = Some(m);
                vectors.extend(v);
            }
            let model = model.unwrap_or_default();
            let mut rest = vectors.into_iter();
            query_vector = rest.next();
            let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            let restarted = cache.model != model;
            if restarted {
                cache.vectors.clear();
                cache.model = model;
            }
            if cache.vectors.len() + missing.len() > CACHE_ENTRIES {
                cache.vectors.clear();
            }
            for (&i, v) in missing.iter().zip(rest) {
                cache.vectors.insert(keys[i], v.into());
            }
            if keys.iter().all(|k| cache.vectors.contains_key(k)) {
                break;
            }
        }
        let query_vector = query_vector.unwrap_or_default();
        let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let mut scored = Vec::new();
        for (i, key) in keys.iter().enumerate() {
            let Some(v) = cache.vectors.get(key) else {
                return Err(EmbedFailure::Failed("tool vectors could not be kept".into()));
            };
            let s = cosine(&query_vector, v);
            if s >= MIN_SIMILARITY {
                scored.push((i, s));
            }
        }
        scored.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        Ok(scored.into_iter().map(|(i, _)| i).collect())
    }
}

/// `description`'s first line, cut to [`DESCRIPTION_CHARS`] (at the end of a sentence when one
/// ends in the second half, else with `…`).
pub fn one_line(description: &str) -> String {
    let line = description.trim().lines().next().unwrap_or_default().trim();
    if line.chars().count() <= DESCRIPTION_CHARS {
        return line.to_owned();
    }
    let head: String = line.chars().take(DESCRIPTION_CHARS - 1).collect();
    match head.rfind(". ") {
        Some(end) if end >= DESCRIPTION_CHARS / 2 => head[..=end].to_owned(),
        _ => format!("{}…", head.trim_end()),
    }
}

/// The answer: the candidates `ranked` names, in that order, at most `limit` (see the module docs).
fn render(
    query: &str,
    candidates: &[Candidate<'_>],
    ranked: &[usize],
    limit: usize,
    mode: &str,
    fallback: Option<String>,
    weak: bool,
) -> Answer {
    let shown: Vec<&Candidate<'_>> = ranked.iter().take(limit).map(|&i| &candidates[i]).collect();
    let mut lines = Vec::with_capacity(shown.len());
    let mut matches = Vec::with_capacity(shown.len());
    for c in shown {
        let description = one_line(c.field("description"));
        let off = if c.enabled { "" } else { " (disabled)" };
        lines.push(format!("{} — {description}{off}", c.field("name")));
        matches.push(
            json!({"name": c.field("name"), "server": c.server, "description": description, "enabled": c.enabled}),
        );
    }
    let mut text = if lines.is_empty() {
        format!("No tools match {}. Try other words for what you want to do.", quoted(query))
    } else if weak {
        format!(
            "No good match: these tools share only a word or two with your query; check that one really does \
             what you want, or try other words.\n{}",
            lines.join("\n")
        )
    } else {
        lines.join("\n")
    };
    let mut structured = json!({"mode": mode, "matches": matches});
    if weak {
        structured["weak"] = json!(true);
    }
    if let Some(why) = fallback {
        text.push_str(&format!("\n(keyword search: the semantic search failed: {why})"));
        structured["fallback"] = json!(why);
    }
    Answer::ok(json!({"content": [{"type": "text", "text": text}], "structuredContent": structured}))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    struct Tools(Vec<(Value, String, String)>);

    impl Caller for Tools {
        fn session_id(&self) -> &str {
            "test"
        }
        fn list_tools(&self) -> BoxFuture<'_, Vec<(Value, String, String)>> {
            Box::pin(async move { self.0.clone() })
        }
    }

    fn tool(name: &str, server: &str, description: &str) -> (Value, String, String) {
        (json!({"name": name, "description": description}), server.to_owned(), name.to_owned())
    }

    /// Vectors over a small vocabulary of meanings: each word adds to the axis of its meaning.
    struct Meanings {
        model: Mutex<String>,
        texts: AtomicUsize,
        fail: Mutex<Option<EmbedFailure>>,
    }

    impl Meanings {
        fn new() -> Arc<Self> {
            Arc::new(Self { model: Mutex::new("m1".into()), texts: AtomicUsize::new(0), fail: Mutex::new(None) })
        }
    }

    const AXES: &[&[&str]] = &[
        &["read", "reading", "open", "contents", "file", "text"],
        &["web", "page", "url", "fetch", "download", "site"],
        &["commit", "git", "history", "branch"],
    ];

    impl Embed for Meanings {
        fn embed(&self, texts: Vec<String>) -> BoxFuture<'_, Embedded> {
            Box::pin(async move {
                if let Some(f) = self.fail.lock().unwrap().clone() {
                    return Err(f);
                }
                self.texts.fetch_add(texts.len(), Ordering::SeqCst);
                let v = texts
                    .iter()
                    .map(|t| {
                        let t = t.to_lowercase();
                        let words: Vec<&str> = t.split(|c: char| !c.is_alphanumeric()).collect();
                        AXES.iter()
                            .map(|axis| words.iter().filter(|w| axis.contains(w)).count() as f32 + 0.01)
                            .collect()
                    })
                    .collect();
                Ok((self.model.lock().unwrap().clone(), v))
            })
        }
    }

    /// The reply as the client sees it (the caller's mistake as the registry answers it).
    fn out(reply: Reply) -> Value {
        match reply {
            Ok(Answer::Result(r)) => serde_json::from_str(r.get()).unwrap(),
            Err(Invalid(why)) => json!({"content": [{"type": "text", "text": why}], "isError": true}),
            _ => panic!("a result"),
        }
    }

    fn names(v: &Value) -> Vec<String> {
        v["structuredContent"]["matches"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["name"].as_str().unwrap().to_owned())
            .collect()
    }

    fn caller() -> Tools {
        Tools(vec![
            tool("coffer__search_knowledge", BUILTIN_SERVER, "Search the web of notes"),
            tool("fs__cat", "fs", "Show the contents of a file"),
            tool("http__get", "http", "Download a page by its URL"),
            tool("git__log", "git", "Commit history"),
        ])
    }

    #[tokio::test]
    async fn semantic_mode_ranks_by_meaning_and_caches_tool_vectors() {
        let meanings = Meanings::new();
        let search = SearchTools::new(Some(meanings.clone()));
        let c = caller();
        // No word of the query is in any tool's name or description: keyword mode finds nothing.
        let v = out(search.search(&c, Some(r#"{"query":"fetch site"}"#)).await);
        assert_eq!(v["structuredContent"]["mode"], "hybrid");
        assert_eq!(names(&v), ["http__get", "coffer__search_knowledge"], "found by meaning alone, built-ins too");
        assert_eq!(search.cached(), 4, "Coffer's own tools are candidates");
        assert_eq!(meanings.texts.load(Ordering::SeqCst), 5, "the query and four tools");
        let keyword = out(SearchTools::new(None).search(&c, Some(r#"{"query":"fetch site"}"#)).await);
        assert_eq!(keyword["structuredContent"]["mode"], "keyword");
        assert!(names(&keyword).is_empty());

        // A second search embeds only its query.
        let v = out(search.search(&c, Some(r#"{"query":"reading text","limit":5}"#)).await);
        assert_eq!(names(&v), ["fs__cat"]);
        assert_eq!(meanings.texts.load(Ordering::SeqCst), 6);

        // A new model re-embeds the tools (vectors of two models never compare).
        *meanings.model.lock().unwrap() = "m2".into();
        let v = out(search.search(&c, Some(r#"{"query":"git branch"}"#)).await);
        assert_eq!(names(&v), ["git__log"]);
        assert_eq!(meanings.texts.load(Ordering::SeqCst), 6 + 1 + 1 + 4, "query, then query and the tools again");
    }

    #[tokio::test]
    async fn an_endpoint_that_fails_falls_back_to_keywords_and_says_so() {
        let meanings = Meanings::new();
        let search = SearchTools::new(Some(meanings.clone()));
        *meanings.fail.lock().unwrap() = Some(EmbedFailure::Failed("embeddings endpoint answered HTTP 500".into()));
        let v = out(search.search(&caller(), Some(r#"{"query":"commit"}"#)).await);
        assert_eq!(v["structuredContent"]["mode"], "keyword");
        assert_eq!(v["structuredContent"]["fallback"], "embeddings endpoint answered HTTP 500");
        assert_eq!(names(&v), ["git__log"]);
        assert!(
            v["content"][0]["text"]
                .as_str()
                .unwrap()
                .ends_with("(keyword search: the semantic search failed: embeddings endpoint answered HTTP 500)")
        );

        // Not configured: keyword mode, quietly.
        *meanings.fail.lock().unwrap() = Some(EmbedFailure::Off("retrieval.embeddings.url is not set".into()));
        let v = out(search.search(&caller(), Some(r#"{"query":"commit"}"#)).await);
        assert_eq!(v["structuredContent"]["mode"], "keyword");
        assert!(v["structuredContent"].get("fallback").is_none());
        assert_eq!(v["content"][0]["text"], "git__log — Commit history");

        // Bad arguments are tool errors in either mode.
        *meanings.fail.lock().unwrap() = None;
        assert_eq!(out(search.search(&caller(), None).await)["isError"], true);
        assert_eq!(out(search.search(&caller(), Some(r#"{"query":"  ?! "}"#)).await)["isError"], true);
    }

    /// The test peers' real tools (`tool_rank/peer_tools.json`) as a session lists them, with
    /// the tools named in `disabled` disabled.
    struct Peers(Vec<(Value, String, String, bool)>);

    impl Peers {
        fn new(disabled: &[&str]) -> Self {
            let v: Value = serde_json::from_str(include_str!("tool_rank/peer_tools.json")).unwrap();
            let mut tools = vec![(
                json!({"name": "coffer__search_tools", "description": "Find tools"}),
                BUILTIN_SERVER.to_owned(),
                "search_tools".to_owned(),
                true,
            )];
            for s in v["servers"].as_array().unwrap() {
                let server = s["server"].as_str().unwrap();
                for t in s["tools"].as_array().unwrap() {
                    let original = t["name"].as_str().unwrap().to_owned();
                    let mut exposed = t.clone();
                    exposed["name"] = json!(format!("{server}__{original}"));
                    let enabled = !disabled.contains(&exposed["name"].as_str().unwrap());
                    tools.push((exposed, server.to_owned(), original, enabled));
                }
            }
            Self(tools)
        }
    }

    impl Caller for Peers {
        fn session_id(&self) -> &str {
            "test"
        }
        fn list_tools(&self) -> BoxFuture<'_, Vec<(Value, String, String)>> {
            Box::pin(
                async move { self.0.iter().filter(|t| t.3).map(|t| (t.0.clone(), t.1.clone(), t.2.clone())).collect() },
            )
        }
        fn list_all_tools(&self) -> BoxFuture<'_, Vec<(Value, String, String, bool)>> {
            Box::pin(async move { self.0.clone() })
        }
    }

    /// Issue 36 §4: the question that found ten filesystem tools finds the time tools first,
    /// and the answer is a few short lines.
    #[allow(clippy::print_stdout, reason = "prints the byte counts docs/BENCHMARKS.md quotes")]
    #[tokio::test]
    async fn what_time_is_it_in_tokyo_finds_the_time_tools_compactly() {
        let peers = Peers::new(&["time__convert_time"]);
        let v = out(SearchTools::new(None).search(&peers, Some(r#"{"query":"what time is it in Tokyo"}"#)).await);
        let found = names(&v);
        let mut first_two = found[..2].to_vec();
        first_two.sort();
        assert_eq!(first_two, ["time__convert_time", "time__get_current_time"], "{v}");
        assert!(found.len() <= DEFAULT_RESULTS as usize);
        let m = &v["structuredContent"]["matches"];
        let current = m.as_array().unwrap().iter().find(|m| m["name"] == "time__get_current_time").unwrap();
        assert_eq!(
            *current,
            json!({"name": "time__get_current_time", "server": "time", "description": "Get current time in a specific timezone", "enabled": true})
        );
        let convert = m.as_array().unwrap().iter().find(|m| m["name"] == "time__convert_time").unwrap();
        assert_eq!(convert["enabled"], false, "a disabled tool is found, and marked");
        let text = v["content"][0]["text"].as_str().unwrap();
        assert!(text.contains("time__convert_time — Convert time between timezones (disabled)"), "{text}");
        assert!(!text.contains("coffer__search_tools"), "the search tool itself is no result: {text}");
        assert!(v["structuredContent"].get("weak").is_none(), "a good match: {v}");

        // Bytes of a typical answer (the whole JSON result), before and after: the old scorer's
        // answer held ten tools with whole descriptions and scores.
        let after = v.to_string().len();
        let long = out(SearchTools::new(None).search(&peers, Some(r#"{"query":"read the file notes.txt"}"#)).await);
        let long_after = long.to_string().len();
        println!(
            "search_tools answer bytes: \"what time is it in Tokyo\" {after}, \"read the file notes.txt\" {long_after}"
        );
        assert!(after < 1200 && long_after < 2400, "{after} / {long_after} bytes");
        for m in long["structuredContent"]["matches"].as_array().unwrap() {
            assert!(m["description"].as_str().unwrap().chars().count() <= DESCRIPTION_CHARS, "{m}");
        }
    }

    #[test]
    fn one_line_descriptions_end_at_a_sentence_or_an_ellipsis() {
        assert_eq!(one_line("  Read a file.\nMore lines."), "Read a file.");
        let long = format!("{}. {}", "a".repeat(100), "b".repeat(200));
        assert_eq!(one_line(&long), format!("{}.", "a".repeat(100)));
        let one = "c".repeat(300);
        let cut = one_line(&one);
        assert_eq!(cut.chars().count(), DESCRIPTION_CHARS);
        assert!(cut.ends_with('…'));
        assert_eq!(one_line(""), "");
    }

    /// Bad input is a clear tool error recorded as the caller's mistake, never a search.
    #[tokio::test]
    async fn bad_input_is_the_caller_s_mistake() {
        let registry = crate::mcp::builtin::Registry::standard(None);
        let peers = Peers::new(&[]);
        for (args, says) in [
            (Some(r#"{"query":""}"#), "query is empty"),
            (Some(r#"{"query":"   "}"#), "query is empty"),
            (Some(r#"{"query":"?! …"}"#), "query has no words to search for"),
            (Some(r#"{"query":42}"#), "query must be text (what you want to do, in words), not a number"),
            (Some(r#"{"query":["time"]}"#), "query must be text (what you want to do, in words), not a list"),
            (Some(r#"{"query":"time","limit":"ten"}"#), "limit must be a whole number from 1 to 50; got \"ten\""),
            (Some(r#"{"query":"time","limit":2.5}"#), "limit must be a whole number from 1 to 50; got 2.5"),
            (Some(r#"{"query":"time","limit":0}"#), "limit must be a whole number from 1 to 50; got 0"),
            // Over the schema's maximum: the arguments check refuses it by name before the tool runs.
            (Some(r#"{"query":"time","limit":1000}"#), "argument \"limit\" is 1000, over its maximum of 50"),
            (Some(r#"{"query":"time","limit":-3}"#), "limit must be a whole number from 1 to 50; got -3"),
            (None, "missing argument \"query\""),
            (Some("[1]"), "arguments must be an object"),
        ] {
            let called = registry.call_metered("search_tools", &peers, args).await;
            assert_eq!(called.outcome, crate::mcp::Outcome::Invalid, "{args:?}");
            let v = match called.answer {
                Answer::Result(r) => serde_json::from_str::<Value>(r.get()).unwrap(),
                _ => panic!("a tool error, not a protocol error"),
            };
            assert_eq!(v["isError"], true, "{args:?}");
            let text = v["content"][0]["text"].as_str().unwrap();
            assert!(
                text.starts_with("coffer__search_tools: invalid arguments: ") && text.contains(says),
                "{args:?}: {text}"
            );
            assert!(!text.contains("invalid type") && !text.contains("expected"), "no serde wording: {text}");
        }
        let huge = json!({"query": "time ".repeat(MAX_QUERY_CHARS)}).to_string();
        let called = registry.call_metered("search_tools", &peers, Some(&huge)).await;
        assert_eq!(called.outcome, crate::mcp::Outcome::Invalid);
        // Limits 1–50 are taken as they are; unknown members are ignored.
        let v = out(SearchTools::new(None).search(&peers, Some(r#"{"query":"file","limit":1,"x":1}"#)).await);
        assert_eq!(names(&v).len(), 1);
        let v = out(SearchTools::new(None).search(&peers, Some(r#"{"query":"file","limit":50}"#)).await);
        assert!(names(&v).len() > DEFAULT_RESULTS as usize && names(&v).len() <= MAX_RESULTS as usize);
        // Only stopwords: a normal answer that finds nothing.
        let v = out(SearchTools::new(None).search(&peers, Some(r#"{"query":"what is it"}"#)).await);
        assert_eq!(v["content"][0]["text"], "No tools match \"what is it\". Try other words for what you want to do.");
        // A long query that finds nothing is not echoed whole.
        let long = format!("{} what is it", "zzzq ".repeat(1000));
        let v = out(SearchTools::new(None).search(&peers, Some(&json!({"query": long}).to_string())).await);
        let text = v["content"][0]["text"].as_str().unwrap();
        assert!(text.starts_with("No tools match \"zzzq zzzq") && text.contains('…') && text.len() < 200, "{text}");
    }

    /// Issue 36 §4 leftovers: without a time server, "what time is it in Tokyo" is answered "no
    /// good match" (the filesystem tool that mentions a file's time is shown, marked weak), and
    /// Coffer's own tools are found like any other.
    #[tokio::test]
    async fn a_weak_best_match_says_so_and_built_ins_are_found() {
        let mut peers = Peers::new(&[]);
        peers.0.retain(|t| t.1 != "time");
        peers.0.push((
            json!({"name": "coffer__remember", "description": "Save a fact about the user to long-term memory."}),
            BUILTIN_SERVER.to_owned(),
            "remember".to_owned(),
            true,
        ));
        let v = out(SearchTools::new(None).search(&peers, Some(r#"{"query":"what time is it in Tokyo"}"#)).await);
        assert_eq!(v["structuredContent"]["weak"], true, "{v}");
        let text = v["content"][0]["text"].as_str().unwrap();
        assert!(text.starts_with("No good match: "), "{text}");
        let v = out(SearchTools::new(None).search(&peers, Some(r#"{"query":"remember this fact for later"}"#)).await);
        assert_eq!(names(&v)[0], "coffer__remember", "{v}");
        assert!(v["structuredContent"].get("weak").is_none());
        // A good best match cuts the tools that only share a word in passing.
        let all = Peers::new(&[]);
        let q = r#"{"query":"what time is it in Tokyo","limit":50}"#;
        let v = out(SearchTools::new(None).search(&all, Some(q)).await);
        assert_eq!(names(&v).len(), 2, "the time tools only, not the file tool that mentions a time: {v}");
    }

    #[test]
    fn a_tool_s_text_is_bounded_and_cosine_is_safe() {
        let long = "x".repeat(10_000);
        let t = json!({"name": "a__b", "title": "T", "description": long});
        let c = Candidate { tool: &t, server: "a", enabled: true };
        assert!(c.text().starts_with("a__b: T. xxx"));
        assert_eq!(c.text().chars().count(), TOOL_TEXT_CHARS);
        assert_eq!(cosine(&[1.0, 0.0], &[0.0]), 0.0, "different lengths do not compare");
        assert_eq!(cosine(&[0.0, 0.0], &[1.0, 0.0]), 0.0);
        assert!((cosine(&[1.0, 1.0], &[2.0, 2.0]) - 1.0).abs() < 1e-6);
    }
}
