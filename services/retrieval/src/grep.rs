//! The grep engine: a search of the raw files with ripgrep's crates (`grep-searcher`,
//! `grep-regex`, and `ignore`'s parallel walker over the same rules as [`crate::walk`]). No
//! index, so always fresh. Binary files are skipped (a NUL byte ends the file's search and
//! drops its hits), and the search is bounded by hit counts and a deadline.
//!
//! Files are read through the searcher's buffered reader, not memory maps: maps need `unsafe`
//! (denied in this workspace) and, for many small notes, reading is as fast (ripgrep itself
//! does not map when it searches many files).
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Instant;

use grep_matcher::{LineTerminator, Matcher};
use grep_regex::{RegexMatcher, RegexMatcherBuilder};
use grep_searcher::{BinaryDetection, Searcher, SearcherBuilder, Sink, SinkMatch};
use ignore::WalkState;

use crate::terms;
use crate::walk::{Prepared, WalkError, WalkSpec, rel_of};

/// Longest query, bytes (as `SearchRequest.query`).
pub const MAX_QUERY_BYTES: usize = 8192;
/// Longest line text in a hit, characters.
pub const MAX_LINE_CHARS: usize = 500;
/// Compiled-regex size limit, bytes (a bigger one is [`GrepError::BadRegex`]).
pub const REGEX_SIZE_LIMIT: usize = 1 << 20;
/// Literal-mode terms shorter than this (in characters) are not searched alone, except CJK
/// bigrams.
pub const MIN_TERM_CHARS: usize = 3;
/// Most distinct matched terms recorded per hit.
const MAX_MATCHED_TERMS: usize = 16;

/// One grep search.
#[derive(Debug, Clone)]
pub struct GrepQuery {
    /// The user's text: a natural-language query (literal mode) or a regex.
    pub query: String,
    /// Treat `query` as a regex (smart case: case-insensitive unless it has an upper-case
    /// letter; `(?i)` / `(?-i)` override). Else literal mode: the whole phrase (whitespace
    /// collapsed) or any query term of at least [`MIN_TERM_CHARS`] characters that is not a
    /// stopword (CJK bigrams too), case-insensitively.
    pub regex: bool,
    /// Most hits in all (0 = none).
    pub max_hits: usize,
    /// Most hits per file.
    pub max_per_file: usize,
    /// When to stop (hits found so far are returned with `timed_out`); `None` = no deadline.
    pub deadline: Option<Instant>,
    /// Only files whose path relative to their KB's root starts with this (empty: every
    /// file); folders that cannot hold one are not entered, other files are not read.
    pub path_prefix: String,
}

/// Whether the walk enters folder `rel` (relative, `/`-separated) for files starting with
/// `prefix`: the folder is under the prefix, or the prefix goes on inside it.
fn folder_may_hold(rel: &str, prefix: &str) -> bool {
    prefix.is_empty() || rel.starts_with(prefix) || prefix.strip_prefix(rel).is_some_and(|rest| rest.starts_with('/'))
}

/// A knowledge base to search.
#[derive(Debug, Clone)]
pub struct GrepRoot {
    pub kb: String,
    pub spec: WalkSpec,
}

/// One matching line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrepHit {
    pub kb: String,
    /// Relative to the KB root, `/`-separated.
    pub rel_path: String,
    /// 1-based line number (as the markdown chunker counts lines).
    pub line: u32,
    /// The line without its line ending, at most [`MAX_LINE_CHARS`] characters (lossy UTF-8).
    pub text: String,
    /// The distinct terms found on the line, lower-case (literal mode: query terms, or the
    /// phrase when it has no searchable term; regex mode: the matched texts), at most 16.
    /// The service ranks chunks by how many distinct terms their lines hold.
    pub matched_terms: Vec<String>,
}

/// What a search found.
#[derive(Debug, Clone, Default)]
pub struct GrepOutcome {
    /// Sorted by root (in the order given), path, line.
    pub hits: Vec<GrepHit>,
    /// The deadline passed before every file was searched.
    pub timed_out: bool,
    /// `max_hits` was reached (which hits are kept then depends on the parallel walk's order).
    pub truncated: bool,
    /// Files searched (opened), over every root.
    pub files_searched: usize,
}

/// Why a grep search could not run.
#[derive(Debug, thiserror::Error)]
pub enum GrepError {
    /// The regex does not compile (the regex engine's message), or is over the size limit.
    #[error("bad regex: {0}")]
    BadRegex(String),
    /// The query is longer than [`MAX_QUERY_BYTES`].
    #[error("query is {bytes} bytes; at most {limit}")]
    TooLong { bytes: usize, limit: usize },
    /// The query is empty or only whitespace.
    #[error("query is empty")]
    Empty,
    /// A knowledge base cannot be walked (missing root, bad glob).
    #[error("knowledge base {kb}: {error}")]
    Walk { kb: String, error: WalkError },
}

/// What literal mode searches for: the phrase and the terms (lower-case).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiteralPlan {
    pub phrase: String,
    pub terms: Vec<String>,
}

/// The literal-mode plan for `query` (see [`GrepQuery::regex`]).
pub fn literal_plan(query: &str) -> LiteralPlan {
    let phrase = query.split_whitespace().collect::<Vec<_>>().join(" ").to_lowercase();
    let terms = terms::query_terms(query)
        .into_iter()
        .filter(|t| {
            let cjk = t.chars().next().is_some_and(terms::is_cjk);
            (cjk || t.chars().count() >= MIN_TERM_CHARS) && !terms::is_stopword(t)
        })
        .collect();
    LiteralPlan { phrase, terms }
}

/// What a hit's `matched_terms` are computed from.
enum Terms {
    Literal(LiteralPlan),
    Regex,
}

fn build_matcher(q: &GrepQuery) -> Result<(RegexMatcher, Terms), GrepError> {
    let mut b = RegexMatcherBuilder::new();
    b.line_terminator(Some(b'\n')).crlf(true).size_limit(REGEX_SIZE_LIMIT).dfa_size_limit(8 * REGEX_SIZE_LIMIT);
    if q.regex {
        b.case_smart(true);
        let m = b.build(q.query.trim()).map_err(|e| GrepError::BadRegex(e.to_string()))?;
        return Ok((m, Terms::Regex));
    }
    let plan = literal_plan(&q.query);
    let mut patterns: Vec<&str> = vec![plan.phrase.as_str()];
    patterns.extend(plan.terms.iter().map(String::as_str).filter(|t| *t != plan.phrase));
    b.case_insensitive(true).fixed_strings(true);
    let m = b.build_literals(&patterns).map_err(|e| GrepError::BadRegex(e.to_string()))?;
    Ok((m, Terms::Literal(plan)))
}

fn matched_terms(line: &[u8], matcher: &RegexMatcher, terms: &Terms) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    match terms {
        Terms::Literal(plan) => {
            let lower = String::from_utf8_lossy(line).to_lowercase();
            out.extend(plan.terms.iter().filter(|t| lower.contains(t.as_str())).take(MAX_MATCHED_TERMS).cloned());
            if out.is_empty() && lower.contains(&plan.phrase) {
                out.push(plan.phrase.clone());
            }
        }
        Terms::Regex => {
            let _ = matcher.find_iter(line, |m| {
                let text: String = String::from_utf8_lossy(&line[m]).to_lowercase().chars().take(64).collect();
                if !text.is_empty() && !out.contains(&text) {
                    out.push(text);
                }
                out.len() < MAX_MATCHED_TERMS
            });
        }
    }
    out
}

/// Shared state of one search across walker threads.
struct Shared<'a> {
    q: &'a GrepQuery,
    matcher: &'a RegexMatcher,
    terms: &'a Terms,
    hits: Mutex<Vec<(usize, GrepHit)>>,
    files: AtomicUsize,
    stop: AtomicBool,
    timed_out: AtomicBool,
    truncated: AtomicBool,
}

impl Shared<'_> {
    fn should_stop(&self) -> bool {
        if self.stop.load(Ordering::Relaxed) {
            return true;
        }
        if self.q.deadline.is_some_and(|d| Instant::now() >= d) {
            self.timed_out.store(true, Ordering::Relaxed);
            self.stop.store(true, Ordering::Relaxed);
            return true;
        }
        false
    }

    /// Adds one file's hits, up to `max_hits` in all.
    fn add(&self, root: usize, hits: Vec<GrepHit>) {
        if hits.is_empty() {
            return;
        }
        let mut all = self.hits.lock().expect("grep hits");
        let room = self.q.max_hits.saturating_sub(all.len());
        all.extend(hits.into_iter().take(room).map(|h| (root, h)));
        if all.len() >= self.q.max_hits {
            // More may exist: the search stops here.
            self.truncated.store(true, Ordering::Relaxed);
            self.stop.store(true, Ordering::Relaxed);
        }
    }
}

/// Collects one file's matches.
struct FileSink<'a> {
    shared: &'a Shared<'a>,
    kb: &'a str,
    rel_path: &'a str,
    hits: Vec<GrepHit>,
    binary: bool,
}

impl Sink for FileSink<'_> {
    type Error = std::io::Error;

    fn matched(&mut self, _searcher: &Searcher, mat: &SinkMatch<'_>) -> Result<bool, std::io::Error> {
        let bytes = mat.bytes();
        let line = bytes.strip_suffix(b"\n").unwrap_or(bytes);
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let text: String = String::from_utf8_lossy(line).chars().take(MAX_LINE_CHARS).collect();
        let number = mat.line_number().and_then(|n| u32::try_from(n).ok()).unwrap_or(u32::MAX);
        self.hits.push(GrepHit {
            kb: self.kb.to_owned(),
            rel_path: self.rel_path.to_owned(),
            line: number,
            text,
            matched_terms: matched_terms(line, self.shared.matcher, self.shared.terms),
        });
        Ok(self.hits.len() < self.shared.q.max_per_file && !self.shared.stop.load(Ordering::Relaxed))
    }

    fn binary_data(&mut self, _searcher: &Searcher, _offset: u64) -> Result<bool, std::io::Error> {
        self.binary = true;
        Ok(false)
    }
}

/// Searches every root for `q`, in parallel (one `ignore` walker thread per core), and
/// returns the matching lines.
///
/// # Errors
/// [`GrepError::Empty`], [`GrepError::TooLong`], [`GrepError::BadRegex`] for the query;
/// [`GrepError::Walk`] naming the first KB whose folder or globs are unusable.
pub fn search(roots: &[GrepRoot], q: &GrepQuery) -> Result<GrepOutcome, GrepError> {
    if q.query.trim().is_empty() {
        return Err(GrepError::Empty);
    }
    if q.query.len() > MAX_QUERY_BYTES {
        return Err(GrepError::TooLong { bytes: q.query.len(), limit: MAX_QUERY_BYTES });
    }
    let (matcher, terms) = build_matcher(q)?;
    let prepared: Vec<Prepared> = roots
        .iter()
        .map(|r| Prepared::new(&r.spec).map_err(|error| GrepError::Walk { kb: r.kb.clone(), error }))
        .collect::<Result<_, _>>()?;
    let shared = Shared {
        q,
        matcher: &matcher,
        terms: &terms,
        hits: Mutex::new(Vec::new()),
        files: AtomicUsize::new(0),
        stop: AtomicBool::new(q.max_hits == 0 || q.max_per_file == 0),
        timed_out: AtomicBool::new(false),
        truncated: AtomicBool::new(false),
    };
    let mut searcher_builder = SearcherBuilder::new();
    // CRLF on both sides (the matcher's `$` before `\r\n`; the searcher must agree with it).
    searcher_builder
        .line_terminator(LineTerminator::crlf())
        .line_number(true)
        .binary_detection(BinaryDetection::quit(b'\x00'));

    for (ri, (root, p)) in roots.iter().zip(&prepared).enumerate() {
        if shared.should_stop() {
            break;
        }
        let shared = &shared;
        p.builder(false).build_parallel().run(|| {
            let mut searcher = searcher_builder.build();
            let kb = root.kb.as_str();
            Box::new(move |result| {
                if shared.should_stop() {
                    return WalkState::Quit;
                }
                let Ok(entry) = result else { return WalkState::Continue };
                let prefix = shared.q.path_prefix.as_str();
                if entry.file_type().is_some_and(|t| t.is_dir()) {
                    if entry.depth() > 0
                        && let Some(rel) = rel_of(&p.root, entry.path())
                        && !folder_may_hold(&rel, prefix)
                    {
                        return WalkState::Skip;
                    }
                    return WalkState::Continue;
                }
                if !entry.file_type().is_some_and(|t| t.is_file()) {
                    return WalkState::Continue;
                }
                let Some(rel) = rel_of(&p.root, entry.path()) else { return WalkState::Continue };
                if !rel.starts_with(prefix) || !p.filter.globs_accept(&rel) {
                    return WalkState::Continue;
                }
                shared.files.fetch_add(1, Ordering::Relaxed);
                let mut sink = FileSink { shared, kb, rel_path: &rel, hits: Vec::new(), binary: false };
                // An unreadable file (vanished, permission) has no hits; the indexer reports it.
                let searched = searcher.search_path(shared.matcher, entry.path(), &mut sink);
                if searched.is_ok() && !sink.binary {
                    shared.add(ri, sink.hits);
                }
                if shared.stop.load(Ordering::Relaxed) { WalkState::Quit } else { WalkState::Continue }
            })
        });
    }
    let mut hits = shared.hits.into_inner().expect("grep hits");
    hits.sort_by(|(ra, a), (rb, b)| (ra, &a.rel_path, a.line).cmp(&(rb, &b.rel_path, b.line)));
    Ok(GrepOutcome {
        hits: hits.into_iter().map(|(_, h)| h).collect(),
        timed_out: shared.timed_out.load(Ordering::Relaxed),
        truncated: shared.truncated.load(Ordering::Relaxed),
        files_searched: shared.files.load(Ordering::Relaxed),
    })
}

#[cfg(test)]
#[path = "tests/grep.rs"]
mod tests;
