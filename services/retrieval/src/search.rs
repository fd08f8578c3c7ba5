//! A search: validation, the three engines run concurrently (each under
//! `retrieval.engine_timeout_ms`), reciprocal rank fusion ([`crate::fusion`]), snippets.
//!
//! - keyword: the store's FTS5 `KeywordQuery` with [`terms::query_terms`] (never user syntax),
//!   every term first (`MODE_ALL`); when that finds nothing, or a question of three or more
//!   terms finds fewer than 50 chunks, the any-term matches (`MODE_ANY`) come after them (with
//!   a warning when no chunk had every term). A query with no searchable terms (only punctuation or FTS5 operators) gives the
//!   keyword engine nothing to do, never a syntax error.
//! - grep: [`grep::search`] over the raw files (always fresh; literal unless `regex`), its hits
//!   mapped to chunks by the store's `LocateLines`; chunks ranked by how many distinct terms
//!   matched, then by hit count.
//! - vector: the query embedded by the configured endpoint, then `VectorQuery` (cosine KNN).
//!
//! Results are one per document: each engine's list keeps a document's best chunk only, and the
//! lists are fused per (KB, path) as the `retrieval.fusion.*` settings say (weighted normalised
//! scores by default, or weighted reciprocal ranks; [`fusion::fuse`]), so a document whose best
//! keyword chunk differs from its best vector chunk has both engines' credit; it shows the chunk
//! of the engine that contributed most.
//!
//! A vector hit whose cosine similarity is below [`MIN_VECTOR_SIMILARITY`] is not a result on
//! its own (nearest is not near: every query has nearest neighbours); it still adds its rank to
//! a chunk another engine found. A KB whose folder is gone is not searched (a warning says so)
//! until the folder is back.
//!
//! The reply lists every engine with its state (ok, failed, timeout, disabled), hits and time;
//! a failed or timed-out engine is also named in `warnings`.
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use coffer_proto::retrieval::{EngineRank, EngineReport, EngineState, SearchFilters, SearchReply, SearchResult};
use coffer_proto::store::{
    Chunk, ChunkHit, Filters, KeywordQueryRequest, LineRef, LocateLinesRequest, MatchMode, VectorQueryRequest,
};

use crate::embedding_worker::Embeddings;
use crate::error::{Error, Result};
use crate::fusion::{self, ChunkRef, Ranked};
use crate::sources::{MEMORY, Sources};
use crate::{grep, snippet, terms};

/// Longest query, bytes (after trimming).
pub const MAX_QUERY_BYTES: usize = 8192;
/// Longest `filters.path_prefix`, bytes.
pub const MAX_PATH_PREFIX_BYTES: usize = 1024;
/// Default and largest number of results.
pub const DEFAULT_LIMIT: u32 = 8;
/// Largest number of results.
pub const MAX_LIMIT: u32 = 50;
/// Default and largest snippet, characters.
pub const DEFAULT_SNIPPET: u32 = 240;
/// Largest snippet, characters.
pub const MAX_SNIPPET: u32 = 2000;
/// How many hits each engine contributes to fusion.
const DEPTH: u32 = 100;
/// Fewer all-term chunks than this are topped up with any-term matches.
const TOP_UP: usize = 50;
/// Grep's bounds.
const GREP_MAX_HITS: usize = 2000;
const GREP_MAX_PER_FILE: usize = 50;
/// Cosine similarity (the store's vector score, 1 − cosine distance) below which a vector hit
/// alone does not make a result. Chosen for the small sentence-embedding models this is used
/// with (bge-small, MiniLM): unrelated English text scores about 0.0-0.2 with MiniLM and well
/// above this with bge only when it shares a topic.
pub const MIN_VECTOR_SIMILARITY: f64 = 0.25;
/// The engines, in report order.
pub const ENGINES: [&str; 3] = ["grep", "keyword", "vector"];

/// A validated search.
#[derive(Debug, Clone, PartialEq)]
pub struct Query {
    /// Trimmed query text.
    pub text: String,
    /// KBs to search (resolved: every folder KB when the request named none).
    pub kbs: Vec<String>,
    /// Path prefix, tags, modified after.
    pub path_prefix: String,
    /// Every one required.
    pub tags: Vec<String>,
    /// Unix ms; 0 = any.
    pub modified_after_ms: i64,
    /// Engines asked for (subset of [`ENGINES`]).
    pub engines: Vec<&'static str>,
    /// Whether the caller named the engines (otherwise every engine that fits the query runs:
    /// grep only for a literal-looking one, see [`looks_literal`]).
    pub engines_named: bool,
    /// Results.
    pub limit: u32,
    /// Snippet characters.
    pub snippet_chars: u32,
    /// Grep treats the query as a regex.
    pub regex: bool,
    /// A tag listing (empty `text`): the previous page's `next_cursor`.
    pub cursor: String,
}

/// Checks the query text: 1..=[`MAX_QUERY_BYTES`] bytes once trimmed.
///
/// # Errors
/// [`Error::Invalid`]: "query is empty", or one naming the limit.
pub fn check_query(query: &str) -> Result<&str> {
    let q = query.trim();
    if q.is_empty() {
        return Err(Error::Invalid("query is empty".into()));
    }
    if q.len() > MAX_QUERY_BYTES {
        return Err(Error::Invalid(format!("query is {} bytes; at most {MAX_QUERY_BYTES}", q.len())));
    }
    Ok(q)
}

/// Validates a request's fields (everything but the KB names, which [`Searcher`] resolves).
///
/// # Errors
/// [`Error::Invalid`] naming the field and its limit.
#[allow(clippy::too_many_arguments)]
pub fn validate(
    query: &str,
    filters: Option<&SearchFilters>,
    engines: &[String],
    limit: u32,
    snippet_chars: u32,
    regex: bool,
    folder_kbs: &[String],
) -> Result<Query> {
    let f = filters.cloned().unwrap_or_default();
    // No query but a tag: the notes with that tag ([`Searcher::tagged`]).
    let text =
        if query.trim().is_empty() && !f.tags.is_empty() { String::new() } else { check_query(query)?.to_owned() };
    let limit = match limit {
        0 => DEFAULT_LIMIT,
        n if n > MAX_LIMIT => return Err(Error::Invalid(format!("limit is {n}; at most {MAX_LIMIT}"))),
        n => n,
    };
    let snippet_chars = match snippet_chars {
        0 => DEFAULT_SNIPPET,
        n if n > MAX_SNIPPET => return Err(Error::Invalid(format!("snippet_chars is {n}; at most {MAX_SNIPPET}"))),
        n => n,
    };
    let mut asked = Vec::new();
    for e in engines {
        match ENGINES.iter().find(|n| **n == e.as_str()) {
            Some(n) if !asked.contains(n) => asked.push(*n),
            Some(_) => {}
            None => {
                return Err(Error::Invalid(format!(
                    "engine {} is not one of grep, keyword, vector",
                    crate::error::shown_at(e, 40)
                )));
            }
        }
    }
    let engines_named = !asked.is_empty();
    if asked.is_empty() {
        asked = ENGINES.to_vec();
    }
    if f.path_prefix.len() > MAX_PATH_PREFIX_BYTES {
        return Err(Error::Invalid(format!(
            "path_prefix is {} bytes; at most {MAX_PATH_PREFIX_BYTES}",
            f.path_prefix.len()
        )));
    }
    if f.path_prefix.contains('\0') {
        return Err(Error::Invalid("path_prefix contains a NUL byte".into()));
    }
    // A tag as notes write it (`#project`) is the tag `project`: one leading `#` is dropped.
    let tags: Vec<String> = f.tags.iter().map(|t| t.strip_prefix('#').unwrap_or(t).to_owned()).collect();
    crate::memory::check_tags(&tags)?;
    if regex && !text.is_empty() {
        grep_regex::RegexMatcherBuilder::new()
            .build(&text)
            .map(drop)
            .map_err(|e| Error::Invalid(format!("query is not a valid regex: {e}")))?;
    }
    let kbs = if f.kb.is_empty() { folder_kbs.to_vec() } else { f.kb.clone() };
    Ok(Query {
        text,
        kbs,
        path_prefix: f.path_prefix,
        tags,
        modified_after_ms: f.modified_after_ms,
        engines: asked,
        engines_named,
        limit,
        snippet_chars,
        regex,
        cursor: String::new(),
    })
}

/// Longest cursor, bytes (a `next_cursor` is a KB name, `:` and a note path).
pub const MAX_CURSOR_BYTES: usize = 2048;

/// The position a tag listing's `cursor` names: (KB, path) of the previous page's last note;
/// empty for none. `kbs` are the KBs the listing covers.
///
/// # Errors
/// [`Error::Invalid`] starting "invalid cursor: ", in the caller's terms: longer than
/// [`MAX_CURSOR_BYTES`]; not `kb:path` as a `next_cursor` is; or naming a KB the listing does not
/// cover (one removed since the previous page, or not among the `kb` asked for now): the
/// listing has to start again, since notes of that KB can no longer be placed.
pub fn parse_cursor(cursor: &str, kbs: &[String]) -> Result<(String, String)> {
    if cursor.is_empty() {
        return Ok((String::new(), String::new()));
    }
    if cursor.len() > MAX_CURSOR_BYTES {
        return Err(Error::Invalid(format!(
            "invalid cursor: it is {} bytes; at most {MAX_CURSOR_BYTES} (pass the next_cursor of the previous page as it is)",
            cursor.len()
        )));
    }
    let Some((kb, path)) = cursor
        .split_once(':')
        .filter(|(kb, path)| crate::sources::check_name(kb).is_ok() && !path.is_empty() && !path.contains('\0'))
    else {
        return Err(Error::Invalid(format!(
            "invalid cursor: {} is not a next_cursor a tag listing gave (pass the previous page's next_cursor \
             as it is, or leave the cursor out for the first page)",
            crate::error::shown_at(cursor, 80)
        )));
    };
    if !kbs.iter().any(|k| k == kb) {
        return Err(Error::Invalid(format!(
            "invalid cursor: it continues in knowledge base {}, which this listing does not cover (removed since \
             the previous page, or not among the knowledge bases asked for); start the listing again without a cursor",
            crate::error::shown(kb)
        )));
    }
    Ok((kb.to_owned(), path.to_owned()))
}

/// Grep's list: the chunks holding matched lines, ranked by how many distinct matched terms
/// their text holds, then how many distinct terms their lines matched, then how many lines
/// (then by KB, path, line); at most [`DEPTH`]. A line longer than a chunk is split over
/// several chunks with the same line range: the one whose text holds the match comes first, so
/// the result (one chunk per document) and its snippet show the match, not the line's start.
fn rank_grep_chunks(located: Vec<ChunkHit>, matched: &HashMap<(String, String, u32), Vec<String>>) -> Vec<ChunkHit> {
    let mut ranked: Vec<((usize, usize, usize), ChunkHit)> = located
        .into_iter()
        .filter_map(|mut h| {
            let c = h.chunk.as_ref()?;
            let mut distinct: Vec<&String> =
                h.lines.iter().filter_map(|l| matched.get(&(c.kb.clone(), c.path.clone(), *l))).flatten().collect();
            distinct.sort();
            distinct.dedup();
            let text = c.text.to_lowercase();
            let held = distinct.iter().filter(|t| text.contains(t.as_str())).count();
            let (terms, count) = (distinct.len(), h.lines.len());
            h.score = terms as f64 + count as f64 / 1000.0;
            Some(((held, terms, count), h))
        })
        .collect();
    ranked.sort_by(|a, b| {
        b.0.cmp(&a.0).then_with(|| {
            let (ca, cb) = (a.1.chunk.as_ref(), b.1.chunk.as_ref());
            ca.map(|c| (&c.kb, &c.path, c.line_start, c.ordinal))
                .cmp(&cb.map(|c| (&c.kb, &c.path, c.line_start, c.ordinal)))
        })
    });
    ranked.into_iter().take(DEPTH as usize).map(|(_, h)| h).collect()
}

/// What one engine produced.
struct EngineRun {
    name: &'static str,
    state: EngineState,
    message: String,
    took: Duration,
    hits: Vec<ChunkHit>,
    warnings: Vec<String>,
}

impl EngineRun {
    fn disabled(name: &'static str, why: &str) -> Self {
        Self {
            name,
            state: EngineState::Disabled,
            message: why.into(),
            took: Duration::ZERO,
            hits: vec![],
            warnings: vec![],
        }
    }
}

/// Runs searches over the KBs of [`Sources`].
pub struct Searcher {
    sources: Arc<Sources>,
    embeddings: Arc<Embeddings>,
    config: crate::config::ConfigRx,
}

impl Searcher {
    /// A searcher.
    pub fn new(sources: Arc<Sources>, embeddings: Arc<Embeddings>, config: crate::config::ConfigRx) -> Self {
        Self { sources, embeddings, config }
    }

    /// Every folder KB's name.
    pub fn folder_kbs(&self) -> Vec<String> {
        self.sources.folder_names()
    }

    /// A tag listing (`q.text` empty, `q.tags` not): the notes with every tag of `q` that pass
    /// its other filters, by KB then path, `q.limit` of them after `q.cursor` (`kb:path` of the
    /// previous page's last note); `next_cursor` when there are more. Each result is the note's
    /// first chunk (lines and snippet), without a score.
    ///
    /// # Errors
    /// [`Error::NotFound`] for an unknown KB, [`Error::Invalid`] for a cursor no listing gave
    /// or one into a KB this listing does not cover ([`parse_cursor`]), the store's errors.
    pub async fn tagged(&self, q: &Query) -> Result<SearchReply> {
        let started = Instant::now();
        let after = parse_cursor(&q.cursor, &q.kbs)?;
        let mut roots = BTreeMap::new();
        let mut warnings = Vec::new();
        for kb in &q.kbs {
            let def = self.sources.require(kb)?;
            match self.sources.gone(kb) {
                Some(why) => warnings.push(format!("knowledge base {kb} not searched: {why}")),
                None => {
                    roots.insert(kb.clone(), def);
                }
            }
        }
        if roots.is_empty() {
            return Ok(SearchReply {
                warnings,
                took_ms: started.elapsed().as_millis() as u32,
                ..SearchReply::default()
            });
        }
        let req = coffer_proto::store::TaggedDocumentsRequest {
            filters: Some(Filters {
                kb: roots.keys().cloned().collect(),
                path_prefix: q.path_prefix.clone(),
                tags: q.tags.clone(),
                modified_after_ms: q.modified_after_ms,
            }),
            after_kb: after.0,
            after_path: after.1,
            limit: q.limit + 1,
        };
        let mut hits = self.sources.index().tagged_documents(req).await?.into_inner().hits;
        let more = hits.len() > q.limit as usize;
        hits.truncate(q.limit as usize);
        let results: Vec<SearchResult> = hits
            .into_iter()
            .filter_map(|h| h.chunk)
            .map(|c| {
                let root = roots.get(&c.kb).map(|k| PathBuf::from(&k.root)).unwrap_or_default();
                let fact_id = if c.kb == MEMORY {
                    c.path.strip_suffix(".md").unwrap_or(&c.path).to_owned()
                } else {
                    String::new()
                };
                SearchResult {
                    snippet: snippet::snippet(&c.text, &[], q.snippet_chars as usize),
                    absolute_path: root.join(&c.path).display().to_string(),
                    kb: c.kb,
                    path: c.path,
                    title: c.title,
                    heading_path: c.heading_path,
                    line_start: c.line_start,
                    line_end: c.line_end,
                    score: 0.0,
                    ranks: vec![],
                    tags: c.tags,
                    modified_ms: c.mtime_ms,
                    fact_id,
                }
            })
            .collect();
        let next_cursor = match results.last() {
            Some(last) if more => format!("{}:{}", last.kb, last.path),
            _ => String::new(),
        };
        Ok(SearchReply {
            results,
            engines: vec![],
            warnings,
            took_ms: started.elapsed().as_millis() as u32,
            fusion: String::new(),
            next_cursor,
        })
    }

    /// Runs `q` (validated by [`validate`]); every KB it names must exist.
    ///
    /// # Errors
    /// [`Error::NotFound`] for an unknown KB. Engine failures are not errors: they are in the
    /// reply.
    pub async fn search(&self, q: &Query) -> Result<SearchReply> {
        let started = Instant::now();
        let mut roots = BTreeMap::new();
        let mut gone_warnings = Vec::new();
        for kb in &q.kbs {
            roots.insert(kb.clone(), self.sources.require(kb)?);
        }
        let searched: Vec<String> = q
            .kbs
            .iter()
            .filter(|kb| match self.sources.gone(kb) {
                Some(why) => {
                    gone_warnings.push(format!("knowledge base {kb} not searched: {why}"));
                    false
                }
                None => {
                    if self.sources.rebuilding(kb) {
                        gone_warnings.push(format!(
                            "knowledge base {kb} is being rebuilt from its files (reindex --clean): \
                             results may be incomplete until it finishes"
                        ));
                    }
                    true
                }
            })
            .cloned()
            .collect();
        let q = &Query { kbs: searched, ..q.clone() };
        let (timeout, fusion_params) = {
            let c = self.config.borrow();
            (c.engine_timeout, c.fusion)
        };
        let filters = Filters {
            kb: q.kbs.clone(),
            path_prefix: q.path_prefix.clone(),
            tags: q.tags.clone(),
            modified_after_ms: q.modified_after_ms,
        };
        let terms: Vec<String> = terms::query_terms(&q.text).into_iter().take(terms::MAX_TERMS).collect();
        let asked = |n: &str| q.engines.contains(&n);
        let nothing = q.kbs.is_empty();
        let grep_run = async {
            if !asked("grep") {
                return EngineRun::disabled("grep", "not asked");
            }
            if nothing {
                return EngineRun::disabled("grep", "no knowledge base to search");
            }
            if !q.engines_named && !q.regex && !looks_literal(&q.text) {
                return EngineRun::disabled(
                    "grep",
                    "skipped: a natural-language query (no quoted phrase, identifier, path, code or \
                     one-character CJK word); name the engine (engines: [\"grep\"]) to run it",
                );
            }
            timed("grep", timeout, self.grep(q, &roots, &filters, timeout)).await
        };
        let keyword_run = async {
            if !asked("keyword") {
                return EngineRun::disabled("keyword", "not asked");
            }
            if nothing {
                return EngineRun::disabled("keyword", "no knowledge base to search");
            }
            // Alone, keyword's list is the answer: `limit` documents; in a fusion, DEPTH.
            let depth = if q.engines == ["keyword"] { q.limit } else { DEPTH };
            timed("keyword", timeout, self.keyword(&terms, &filters, depth)).await
        };
        let vector_run = async {
            if !asked("vector") {
                return EngineRun::disabled("vector", "not asked");
            }
            if let Some(why) = self.embeddings.unavailable().filter(|_| self.embeddings.ready().is_none()) {
                return EngineRun::disabled("vector", &why);
            }
            if nothing {
                return EngineRun::disabled("vector", "no knowledge base to search");
            }
            timed("vector", timeout, self.vector(&q.text, &filters)).await
        };
        let (g, k, v) = tokio::join!(grep_run, keyword_run, vector_run);
        let runs = [g, k, v];

        let mut chunks: HashMap<i64, Chunk> = HashMap::new();
        let mut lists = Vec::new();
        let mut reports = Vec::new();
        let mut warnings = gone_warnings;
        for run in runs {
            // One entry per document in each engine's list: its best chunk. A document's other
            // chunks would otherwise take ranks from the next documents (on Cranfield a top 10
            // held 8.1 distinct documents, and keyword ranked below plain BM25).
            let mut listed = HashSet::new();
            let ranked: Vec<(ChunkRef, f64)> = run
                .hits
                .iter()
                .filter_map(|h| {
                    let c = h.chunk.as_ref()?;
                    listed.insert((c.kb.as_str(), c.path.as_str())).then(|| {
                        (
                            ChunkRef { kb: c.kb.clone(), path: c.path.clone(), line_start: c.line_start, id: c.id },
                            h.score,
                        )
                    })
                })
                .collect();
            for h in run.hits {
                if let Some(c) = h.chunk {
                    chunks.entry(c.id).or_insert(c);
                }
            }
            match run.state {
                EngineState::Failed => warnings.push(format!("{} engine failed: {}", run.name, run.message)),
                EngineState::Timeout => warnings.push(format!("{} engine timed out: {}", run.name, run.message)),
                _ => {}
            }
            warnings.extend(run.warnings);
            reports.push(EngineReport {
                engine: run.name.into(),
                state: run.state as i32,
                hits: ranked.len() as u32,
                took_ms: run.took.as_millis() as u32,
                message: run.message,
            });
            lists.push(Ranked { engine: run.name, hits: ranked });
        }
        let highlight: Vec<String> = if terms.is_empty() { vec![q.text.clone()] } else { terms.clone() };
        // Fused per document (engines may have picked different chunks of it: each still counts).
        let results = fusion::fuse(&lists, &fusion_params, usize::MAX)
            .into_iter()
            .filter(|f| !weak_vector_only(&f.ranks))
            .take(q.limit as usize)
            .filter_map(|f| {
                let c = chunks.get(&f.chunk.id)?;
                let root = roots.get(&c.kb).map(|k| PathBuf::from(&k.root)).unwrap_or_default();
                let fact_id = if c.kb == MEMORY {
                    c.path.strip_suffix(".md").unwrap_or(&c.path).to_owned()
                } else {
                    String::new()
                };
                Some(SearchResult {
                    kb: c.kb.clone(),
                    path: c.path.clone(),
                    title: c.title.clone(),
                    heading_path: c.heading_path.clone(),
                    line_start: c.line_start,
                    line_end: c.line_end,
                    snippet: snippet::snippet(&c.text, &highlight, q.snippet_chars as usize),
                    score: f.score,
                    ranks: f
                        .ranks
                        .into_iter()
                        .map(|r| EngineRank { engine: r.engine.into(), rank: r.rank, score: r.score })
                        .collect(),
                    tags: c.tags.clone(),
                    modified_ms: c.mtime_ms,
                    fact_id,
                    absolute_path: root.join(&c.path).display().to_string(),
                })
            })
            .collect();
        Ok(SearchReply {
            results,
            engines: reports,
            warnings,
            took_ms: started.elapsed().as_millis() as u32,
            fusion: fusion_params.name(),
            next_cursor: String::new(),
        })
    }

    async fn keyword(
        &self,
        terms: &[String],
        filters: &Filters,
        depth: u32,
    ) -> std::result::Result<(Vec<ChunkHit>, Vec<String>), String> {
        if terms.is_empty() {
            return Ok((vec![], vec!["keyword engine: the query has no searchable words".into()]));
        }
        let mut index = self.sources.index();
        let query = |mode: MatchMode| KeywordQueryRequest {
            terms: terms.to_vec(),
            mode: mode as i32,
            filters: Some(filters.clone()),
            limit: depth,
            // The lists are one entry per document (`search`): the store keeps each document's
            // best chunk and fetches nothing else.
            one_per_document: true,
        };
        let mut all =
            index.keyword_query(query(MatchMode::All)).await.map_err(|e| e.message().to_owned())?.into_inner().hits;
        // One or two words are a precise query: what holds them all, if anything does. A longer
        // question whose words all appear in too few chunks gets those first, then the
        // any-term matches (so it still gets a full list).
        if all.len() >= TOP_UP.min(depth as usize) || terms.len() == 1 || (terms.len() == 2 && !all.is_empty()) {
            return Ok((all, vec![]));
        }
        let any =
            index.keyword_query(query(MatchMode::Any)).await.map_err(|e| e.message().to_owned())?.into_inner().hits;
        let warn = if all.is_empty() && !any.is_empty() {
            vec!["no result had every term; showing any-term matches".into()]
        } else {
            vec![]
        };
        let have: HashSet<i64> = all.iter().filter_map(|h| h.chunk.as_ref().map(|c| c.id)).collect();
        all.extend(any.into_iter().filter(|h| h.chunk.as_ref().is_some_and(|c| !have.contains(&c.id))));
        Ok((all, warn))
    }

    async fn vector(&self, text: &str, filters: &Filters) -> std::result::Result<(Vec<ChunkHit>, Vec<String>), String> {
        let ready = self.embeddings.ready().ok_or("the embeddings endpoint is not configured")?;
        let mut v = ready.embedder.embed(&[text.to_owned()]).await.map_err(|e| e.to_string())?;
        let v = v.pop().ok_or("the embeddings endpoint answered no vector")?;
        crate::embedding_worker::check_vector(&v, ready.dimension)?;
        let hits = self
            .sources
            .index()
            .vector_query(VectorQueryRequest { embedding: v, filters: Some(filters.clone()), limit: DEPTH })
            .await
            .map_err(|e| e.message().to_owned())?
            .into_inner()
            .hits;
        Ok((hits, vec![]))
    }

    async fn grep(
        &self,
        q: &Query,
        roots: &BTreeMap<String, coffer_proto::store::KnowledgeBase>,
        filters: &Filters,
        timeout: Duration,
    ) -> std::result::Result<(Vec<ChunkHit>, Vec<String>), String> {
        let grep_roots: Vec<grep::GrepRoot> =
            roots.values().map(|k| grep::GrepRoot { kb: k.name.clone(), spec: self.sources.walk_spec(k) }).collect();
        let gq = grep::GrepQuery {
            query: q.text.clone(),
            regex: q.regex,
            max_hits: GREP_MAX_HITS,
            max_per_file: GREP_MAX_PER_FILE,
            deadline: Some(Instant::now() + timeout),
            path_prefix: q.path_prefix.clone(),
        };
        let prefix = q.path_prefix.clone();
        let outcome = tokio::task::spawn_blocking(move || grep::search(&grep_roots, &gq))
            .await
            .map_err(|e| format!("grep panicked: {e}"))?
            .map_err(|e| e.to_string())?;
        let mut warnings = Vec::new();
        if outcome.timed_out {
            warnings.push("grep engine: stopped at its deadline; results are partial".into());
        }
        // Terms matched per (kb, path, line), for ranking once lines are chunks.
        let mut matched: HashMap<(String, String, u32), Vec<String>> = HashMap::new();
        let mut lines = Vec::new();
        for h in outcome.hits.into_iter().filter(|h| h.rel_path.starts_with(&prefix)) {
            lines.push(LineRef { kb: h.kb.clone(), path: h.rel_path.clone(), line: h.line });
            matched.insert((h.kb, h.rel_path, h.line), h.matched_terms);
        }
        if lines.is_empty() {
            return Ok((vec![], warnings));
        }
        let located = self
            .sources
            .index()
            .locate_lines(LocateLinesRequest { lines, filters: Some(filters.clone()) })
            .await
            .map_err(|e| e.message().to_owned())?
            .into_inner()
            .hits;
        Ok((rank_grep_chunks(located, &matched), warnings))
    }
}

/// Whether a query reads as a literal to find as written rather than a question: a quoted
/// phrase, or a word that is an identifier, path, number with letters or code (`snake_case`,
/// `camelCase`, `a.b`, `a/b`, `a::b`, `f(x)`, `x86`, `ARCHIVE-00667`), or a one-character CJK
/// word (`茶`: the keyword index holds CJK text as character pairs, so only grep finds it inside
/// a longer run, see [`terms::has_lone_cjk_char`]). Only such queries run the grep engine in a
/// search that does not name its engines: on a natural-language question grep adds
/// literal-match noise to the fusion (Cranfield: fused nDCG@10 fell below keyword's) and costs a
/// full read of every file.
pub fn looks_literal(text: &str) -> bool {
    if text.contains('"') || text.contains('`') || terms::has_lone_cjk_char(text) {
        return true;
    }
    text.split_whitespace().any(|word| {
        let w = word.trim_matches(|c: char| matches!(c, '?' | '!' | ',' | ';' | ':' | '.' | '\'' | '(' | ')'));
        let inner = |c: char| {
            matches!(
                c,
                '_' | '.' | '/' | '\\' | ':' | '(' | ')' | '[' | ']' | '{' | '}' | '=' | '<' | '>' | '#' | '$' | '@'
            )
        };
        let camel = w.chars().zip(w.chars().skip(1)).any(|(a, b)| a.is_lowercase() && b.is_uppercase());
        let ascii_letters = w.chars().any(|c| c.is_ascii_alphabetic());
        let digits = w.chars().any(|c| c.is_ascii_digit());
        w.chars().any(inner) || camel || (ascii_letters && digits)
    })
}

/// Runs one engine under `timeout`, timing it and turning its outcome into an [`EngineRun`].
/// Whether a fused result rests on a vector hit alone whose similarity is below
/// [`MIN_VECTOR_SIMILARITY`].
fn weak_vector_only(ranks: &[fusion::EngineRank]) -> bool {
    !ranks.is_empty() && ranks.iter().all(|r| r.engine == "vector" && r.score < MIN_VECTOR_SIMILARITY)
}

async fn timed<F>(name: &'static str, timeout: Duration, fut: F) -> EngineRun
where
    F: std::future::Future<Output = std::result::Result<(Vec<ChunkHit>, Vec<String>), String>>,
{
    let started = Instant::now();
    let r = tokio::time::timeout(timeout, fut).await;
    let took = started.elapsed();
    match r {
        Ok(Ok((hits, warnings))) => {
            EngineRun { name, state: EngineState::Ok, message: String::new(), took, hits, warnings }
        }
        Ok(Err(message)) => {
            EngineRun { name, state: EngineState::Failed, message, took, hits: vec![], warnings: vec![] }
        }
        Err(_) => EngineRun {
            name,
            state: EngineState::Timeout,
            message: format!("no answer within {} ms (retrieval.engine_timeout_ms)", timeout.as_millis()),
            took,
            hits: vec![],
            warnings: vec![],
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grep_prefers_the_chunk_of_a_long_line_that_holds_the_match() {
        // One 3-line document whose line 3 is split over three chunks; the match is in the last.
        let chunk = |id: i64, ordinal: u32, text: &str| ChunkHit {
            chunk: Some(Chunk {
                id,
                kb: "vault".into(),
                path: "long.md".into(),
                line_start: 3,
                line_end: 3,
                ordinal,
                text: text.into(),
                ..Chunk::default()
            }),
            score: 0.0,
            lines: vec![3],
        };
        let located =
            vec![chunk(1, 0, "filler0 filler1"), chunk(2, 1, "filler2 filler3"), chunk(3, 2, "a Zebrafish here")];
        let matched = HashMap::from([(("vault".to_owned(), "long.md".to_owned(), 3), vec!["zebrafish".to_owned()])]);
        let ids: Vec<i64> =
            rank_grep_chunks(located, &matched).iter().filter_map(|h| h.chunk.as_ref().map(|c| c.id)).collect();
        assert_eq!(ids, [3, 1, 2]);
    }

    #[test]
    fn a_cursor_is_checked_in_the_caller_s_terms() {
        let kbs = ["vault".to_owned(), "notes".to_owned()];
        assert_eq!(parse_cursor("", &kbs).ok(), Some((String::new(), String::new())));
        assert_eq!(parse_cursor("vault:a/b:c.md", &kbs).ok(), Some(("vault".into(), "a/b:c.md".into())));
        let msg = |c: &str| parse_cursor(c, &kbs).err().map(|e| e.to_string()).unwrap_or_default();
        for bad in ["nocolon", "Vault:a.md", "vault:", ":a.md"] {
            let m = msg(bad);
            assert!(m.starts_with("invalid cursor: ") && m.contains("not a next_cursor"), "{bad}: {m}");
            assert!(!m.contains("after_"), "{m}");
        }
        assert!(msg(&format!("vault:{}", "x".repeat(2042))).is_empty(), "2048 bytes pass");
        let m = msg(&format!("vault:{}", "x".repeat(2043)));
        assert_eq!(
            m,
            "invalid cursor: it is 2049 bytes; at most 2048 (pass the next_cursor of the previous page as it is)"
        );
        let m = msg("gone:a.md");
        assert!(m.starts_with("invalid cursor: it continues in knowledge base \"gone\", which this listing"), "{m}");
    }

    fn v(query: &str) -> Result<Query> {
        validate(query, None, &[], 0, 0, false, &["notes".into()])
    }

    #[test]
    fn literal_queries_are_told_from_questions() {
        for q in [
            "\"exact phrase\"",
            "parse_front_matter",
            "kbStatus",
            "config.toml",
            "src/main.rs",
            "a::b",
            "fn(x)",
            "x86 assembly",
            "ARCHIVE-00667",
            "`code`",
            "茶",
            "喝 茶",
        ] {
            assert!(looks_literal(q), "{q}");
        }
        for q in [
            "what is the boundary layer thickness?",
            "mach 5 flow (supersonic).",
            "heat-transfer in a laminar flow",
            "会议 记录",
            "What's new?",
        ] {
            assert!(!looks_literal(q), "{q}");
        }
    }

    #[test]
    fn empty_and_oversized_queries_are_refused_by_name() {
        for q in ["", "   ", "\n\t"] {
            assert_eq!(v(q).unwrap_err().to_string(), "query is empty");
        }
        let e = v(&"a".repeat(8193)).unwrap_err().to_string();
        assert_eq!(e, "query is 8193 bytes; at most 8192");
        let e = v(&"a ".repeat(50_000)).unwrap_err().to_string();
        assert!(e.contains("at most 8192"), "{e}");
        assert!(v(&format!("  {}  ", "a".repeat(8192))).is_ok(), "trimmed first");
    }

    #[test]
    fn punctuation_and_fts_syntax_are_queries_not_errors() {
        for q in ["\"", "*", "NEAR(", "AND OR NOT", "^", "-", "(((", "\"unbalanced", "a:b"] {
            let query = v(q).unwrap_or_else(|e| panic!("{q:?}: {e}"));
            assert_eq!(query.text, q.trim());
        }
    }

    #[test]
    fn a_weak_vector_hit_alone_is_not_a_result() {
        let r = |engine: &'static str, score: f64| fusion::EngineRank { engine, rank: 1, score };
        assert!(weak_vector_only(&[r("vector", 0.1)]));
        assert!(!weak_vector_only(&[r("vector", MIN_VECTOR_SIMILARITY)]));
        assert!(!weak_vector_only(&[r("vector", 0.9)]));
        // Found by another engine too: the weak vector rank only adds to it.
        assert!(!weak_vector_only(&[r("keyword", 3.0), r("vector", 0.1)]));
        assert!(!weak_vector_only(&[r("grep", 1.0)]));
    }

    #[test]
    fn defaults_bounds_and_engine_names() {
        let q = v("x").unwrap();
        assert_eq!((q.limit, q.snippet_chars), (DEFAULT_LIMIT, DEFAULT_SNIPPET));
        assert_eq!(q.engines, ENGINES);
        assert_eq!(q.kbs, ["notes"], "no KB named: every folder KB");
        let e = validate("x", None, &[], 51, 0, false, &[]).unwrap_err().to_string();
        assert_eq!(e, "limit is 51; at most 50");
        let e = validate("x", None, &[], 0, 2001, false, &[]).unwrap_err().to_string();
        assert_eq!(e, "snippet_chars is 2001; at most 2000");
        let e = validate("x", None, &["bm25".into()], 0, 0, false, &[]).unwrap_err().to_string();
        assert!(e.contains("\"bm25\" is not one of grep, keyword, vector"), "{e}");
        let q = validate("x", None, &["keyword".into(), "keyword".into()], 0, 0, false, &[]).unwrap();
        assert_eq!(q.engines, ["keyword"]);
        let f = SearchFilters { kb: vec!["memory".into()], tags: vec!["a b".into()], ..Default::default() };
        assert!(validate("x", Some(&f), &[], 0, 0, false, &[]).unwrap_err().to_string().contains("tag"));
        // A tag written as in a note (`#project`) filters like `project`; only one `#` goes.
        let f = SearchFilters { tags: vec!["#project".into(), "rust/async".into()], ..Default::default() };
        assert_eq!(validate("x", Some(&f), &[], 0, 0, false, &[]).unwrap().tags, ["project", "rust/async"]);
        // No query but a tag: a tag listing (empty text); no query and no tag is still refused.
        let f = SearchFilters { tags: vec!["#project".into()], ..Default::default() };
        let q = validate("  ", Some(&f), &[], 0, 0, true, &[]).unwrap();
        assert_eq!((q.text.as_str(), q.tags.as_slice()), ("", ["project".to_owned()].as_slice()));
        assert_eq!(validate("", None, &[], 0, 0, false, &[]).unwrap_err().to_string(), "query is empty");
        let f = SearchFilters { tags: vec!["##project".into()], ..Default::default() };
        let e = validate("x", Some(&f), &[], 0, 0, false, &[]).unwrap_err().to_string();
        assert!(e.contains("\"#project\""), "{e}");
        let e = validate("(unclosed", None, &[], 0, 0, true, &[]).unwrap_err().to_string();
        assert!(e.starts_with("query is not a valid regex"), "{e}");
        assert!(validate("(unclosed", None, &[], 0, 0, false, &[]).is_ok(), "literal grep takes anything");
    }
}
