//! `coffer__search_tools {query, limit?}`: the caller's tools (its enabled ones, as its
//! `tools/list` shows them; Coffer's own built-ins left out) that best answer `query`.
//!
//! Two modes, and the result says which one answered (`structuredContent.mode`):
//! - **semantic**, when an embeddings endpoint is configured (`retrieval.embeddings.*`; the
//!   client and its key live in `coffer-retrieval`, reached through its `Embed` RPC): tools
//!   ranked by cosine similarity of the query's vector and each tool's text (exposed name, title
//!   and description, at most [`TOOL_TEXT_CHARS`] characters), those below [`MIN_SIMILARITY`]
//!   left out. A tool's vector is cached by a hash of its text (and the model that made it, so
//!   a new model re-embeds), so a search embeds only the query and the tools it has not seen;
//!   the cache is filled on `search_tools` calls only, never on another tool's `tools/call`.
//! - **keyword**, otherwise, or when the endpoint fails (`structuredContent.fallback` and the
//!   text then say why): words of `query` in a tool's name (3 points a word), title (2) or
//!   description (1), best first.
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};

use coffer_types::BUILTIN_SERVER;
use futures_util::future::BoxFuture;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::mcp::answer::Answer;
use crate::mcp::builtin::{Caller, Provider, input_schema, tool_error};

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
const DEFAULT_RESULTS: u64 = 10;
const MAX_RESULTS: u64 = 50;

/// The arguments of `coffer__search_tools`; its `inputSchema` is derived from them. Read
/// leniently, as they always were: members it does not name are ignored, and a `limit` that is
/// not a whole number counts as absent.
#[derive(Deserialize, JsonSchema)]
pub struct SearchToolsArgs {
    #[schemars(length(max = MAX_QUERY_CHARS), description = "What you want to do, e.g. \"read a file\".")]
    query: String,
    #[serde(default, deserialize_with = "whole_number")]
    #[schemars(with = "u64", range(min = 1, max = MAX_RESULTS), description = "Most results (default 10).")]
    limit: Option<u64>,
}

/// A whole number, or `None` for anything else (a string, a fraction, `null`).
fn whole_number<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    Ok(Value::deserialize(d)?.as_u64())
}

impl Provider for SearchTools {
    fn name(&self) -> &'static str {
        "search_tools"
    }

    fn definition(&self) -> Value {
        json!({
            "name": "search_tools",
            "title": "Search tools",
            "description": "Find tools available through Coffer that fit what you want to do (by meaning when an \
        embeddings endpoint is configured, else by words in their name or description). Returns the best matches \
        with their exposed names, so you can call them directly.",
            "inputSchema": input_schema::<SearchToolsArgs>(),
            "annotations": {"readOnlyHint": true, "openWorldHint": false}
        })
    }

    fn call<'a>(&'a self, caller: &'a dyn Caller, arguments: Option<&'a str>) -> BoxFuture<'a, Answer> {
        Box::pin(self.search(caller, arguments))
    }
}

/// One tool as the search sees it.
struct Candidate<'a> {
    tool: &'a Value,
    server: &'a str,
}

impl Candidate<'_> {
    fn field(&self, key: &str) -> &str {
        self.tool.get(key).and_then(Value::as_str).unwrap_or_default()
    }

    /// What is embedded for the tool: `name: title. description`, cut to [`TOOL_TEXT_CHARS`].
    fn text(&self) -> String {
        let mut t = self.field("name").to_owned();
        for part in [self.field("title"), self.field("description")] {
            if !part.is_empty() {
                t.push_str(if t.contains(':') { ". " } else { ": " });
                t.push_str(part);
            }
        }
        t.chars().take(TOOL_TEXT_CHARS).collect()
    }
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

impl SearchTools {
    async fn search(&self, caller: &dyn Caller, args: Option<&str>) -> Answer {
        let Ok(args) = serde_json::from_str::<SearchToolsArgs>(args.unwrap_or("{}")) else {
            return tool_error("search_tools needs a string argument \"query\"");
        };
        let query = args.query.as_str();
        let limit = args.limit.unwrap_or(DEFAULT_RESULTS).clamp(1, MAX_RESULTS) as usize;
        let words: Vec<String> =
            query.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()).map(str::to_lowercase).collect();
        if words.is_empty() {
            return tool_error("query has no words to search for");
        }
        let tools = caller.list_tools().await;
        let candidates: Vec<Candidate<'_>> = tools
            .iter()
            .filter(|(_, server, _)| server != BUILTIN_SERVER)
            .map(|(tool, server, _)| Candidate { tool, server })
            .collect();
        let mut fallback = None;
        if let Some(embedder) = &self.embedder {
            match self.semantic(embedder.as_ref(), query, &candidates).await {
                Ok(scored) => return render(query, scored, limit, "semantic", None),
                Err(EmbedFailure::Off(_)) => {}
                Err(EmbedFailure::Failed(why)) => {
                    tracing::warn!(error = %why, "Semantic tool search failed; keyword search answered.");
                    fallback = Some(why);
                }
            }
        }
        render(query, keyword(&words, &candidates), limit, "keyword", fallback)
    }

    /// Every candidate at or above [`MIN_SIMILARITY`] with its similarity.
    async fn semantic<'a>(
        &self,
        embedder: &dyn Embed,
        query: &str,
        candidates: &[Candidate<'a>],
    ) -> Result<Vec<(f64, Candidate<'a>)>, EmbedFailure> {
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
        for (i, c) in candidates.iter().enumerate() {
            let Some(v) = cache.vectors.get(&keys[i]) else {
                return Err(EmbedFailure::Failed("tool vectors could not be kept".into()));
            };
            let s = cosine(&query_vector, v);
            if s >= MIN_SIMILARITY {
                scored.push((f64::from((s * 1000.0).round() / 1000.0), Candidate { tool: c.tool, server: c.server }));
            }
        }
        Ok(scored)
    }
}

/// Keyword scores (see the module docs); tools that match no word are left out.
fn keyword<'a>(words: &[String], candidates: &[Candidate<'a>]) -> Vec<(f64, Candidate<'a>)> {
    candidates
        .iter()
        .filter_map(|c| {
            let name = c.field("name").to_lowercase();
            let title = c.field("title").to_lowercase();
            let desc = c.field("description").to_lowercase();
            let score: u32 = words
                .iter()
                .map(|w| {
                    3 * u32::from(name.contains(w.as_str()))
                        + 2 * u32::from(title.contains(w.as_str()))
                        + u32::from(desc.contains(w.as_str()))
                })
                .sum();
            (score > 0).then(|| (f64::from(score), Candidate { tool: c.tool, server: c.server }))
        })
        .collect()
}

/// The result: best first (ties by name), at most `limit`; `structuredContent` `{mode, matches:
/// [{name, server, description, score}], fallback?}`.
fn render(
    query: &str,
    mut scored: Vec<(f64, Candidate<'_>)>,
    limit: usize,
    mode: &str,
    fallback: Option<String>,
) -> Answer {
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.field("name").cmp(b.1.field("name"))));
    scored.truncate(limit);
    let matches: Vec<Value> = scored
        .iter()
        .map(|(score, c)| {
            let score = if mode == "keyword" { json!(*score as u64) } else { json!(score) };
            json!({"name": c.tool["name"], "server": c.server,
                "description": c.tool.get("description").cloned().unwrap_or(Value::Null), "score": score})
        })
        .collect();
    let mut text = if matches.is_empty() {
        format!("No tools match {query:?}.")
    } else {
        matches
            .iter()
            .map(|m| {
                format!(
                    "{} — {}",
                    m["name"].as_str().unwrap_or_default(),
                    m["description"].as_str().unwrap_or("").lines().next().unwrap_or("")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    let mut structured = json!({"mode": mode, "matches": matches});
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

    fn out(answer: Answer) -> Value {
        match answer {
            Answer::Result(r) => serde_json::from_str(r.get()).unwrap(),
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
        assert_eq!(v["structuredContent"]["mode"], "semantic");
        assert_eq!(names(&v), ["http__get"]);
        assert!(v["structuredContent"]["matches"][0]["score"].as_f64().unwrap() > 0.9);
        assert_eq!(search.cached(), 3, "built-ins are not candidates");
        assert_eq!(meanings.texts.load(Ordering::SeqCst), 4, "the query and three tools");
        let keyword = out(SearchTools::new(None).search(&c, Some(r#"{"query":"fetch site"}"#)).await);
        assert_eq!(keyword["structuredContent"]["mode"], "keyword");
        assert!(names(&keyword).is_empty());

        // A second search embeds only its query.
        let v = out(search.search(&c, Some(r#"{"query":"reading text","limit":5}"#)).await);
        assert_eq!(names(&v), ["fs__cat"]);
        assert_eq!(meanings.texts.load(Ordering::SeqCst), 5);

        // A new model re-embeds the tools (vectors of two models never compare).
        *meanings.model.lock().unwrap() = "m2".into();
        let v = out(search.search(&c, Some(r#"{"query":"git branch"}"#)).await);
        assert_eq!(names(&v), ["git__log"]);
        assert_eq!(meanings.texts.load(Ordering::SeqCst), 5 + 1 + 1 + 3, "query, then query and the tools again");
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

    #[test]
    fn a_tool_s_text_is_bounded_and_cosine_is_safe() {
        let long = "x".repeat(10_000);
        let t = json!({"name": "a__b", "title": "T", "description": long});
        let c = Candidate { tool: &t, server: "a" };
        assert!(c.text().starts_with("a__b: T. xxx"));
        assert_eq!(c.text().chars().count(), TOOL_TEXT_CHARS);
        assert_eq!(cosine(&[1.0, 0.0], &[0.0]), 0.0, "different lengths do not compare");
        assert_eq!(cosine(&[0.0, 0.0], &[1.0, 0.0]), 0.0);
        assert!((cosine(&[1.0, 1.0], &[2.0, 2.0]) - 1.0).abs() < 1e-6);
    }
}
