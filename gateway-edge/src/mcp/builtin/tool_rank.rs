//! Ranking tools for a question: the index behind `coffer__search_tools` (and, later, the lazy
//! mode's meta search tool). Pure: no I/O, no session; build a [`ToolIndex`] from the tools a
//! caller sees ([`ToolDoc`]s), ask it [`ToolIndex::rank`].
//!
//! **Terms** ([`terms`]): text is split on everything that is not a letter or digit (so `_`,
//! `-`, `.`, `/` and spaces) and on case changes (`getCurrentTime` → get current time,
//! `HTMLParser` → html parser, `utf8Decode` → utf8 decode), lower-cased, stripped of
//! [`STOPWORDS`] (question and filler words that carry no topic: "what", "is", "please",
//! "want"), and stemmed with the Snowball English (Porter 2) stemmer of `rust-stemmers`, so
//! "timezones", "time zones" and "timezone" meet, and "listing" meets "list". Queries and tools
//! go through the same function.
//!
//! **Scores**: BM25F (Robertson, Zaragoza and Taylor, "Simple BM25 extension to multiple
//! weighted fields", CIKM 2004) over five fields of each tool, with per-field weights and length
//! normalisation ([`FIELDS`]): the tool's own name (without the `server__` prefix), its title,
//! its description, its parameters (names and descriptions) and its server's name. A term's
//! frequencies are weighted and normalised per field, summed, then saturated once
//! (`tf / (k1 + tf)`, [`K1`]) and multiplied by its inverse document frequency over the tools:
//! a word every tool has counts for little, a word in one tool's name counts most.
//!
//! **Words users say for what tools call otherwise** ([`THESAURUS`]): a question often shares no
//! word with the tool that answers it ("make a folder" → `create_directory`, "what hour is it"
//! → `get_current_time`). Each query term the thesaurus knows adds the terms it stands for,
//! scored at [`EXPANSION_WEIGHT`] of a term the user typed; a clock time in the query ("9:00",
//! "3pm") adds "time". The thesaurus is general vocabulary of files, folders, version control,
//! clocks and the web, not a list of any server's tool names.
//!
//! **Argument values** ([`argument_value`]): a file name, path or URL in a question is what a
//! tool will be called with, not what the task is about ("print the contents of package.json"
//! is not about packages): its words are not searched; it adds "file" (and its extension's
//! thesaurus words: `.png` an image), "path" or "url".
//!
//! **Fusion**: when an embeddings ranking is at hand (the search tool's semantic mode), the two
//! rankings are fused by reciprocal rank ([`fuse`], Cormack, Clarke and Büttcher, SIGIR 2009,
//! `k` = [`RRF_K`]): no score scales to calibrate, and a tool either ranking finds is kept.
//!
//! The labelled set in `tool_rank/questions.json` (over the test peers' real `tools/list`,
//! `tool_rank/peer_tools.json`) holds the ranking to its floor (`tool_rank/labelled.rs`).
use std::collections::HashMap;
use std::sync::LazyLock;

use rust_stemmers::{Algorithm, Stemmer};
use serde_json::Value;

/// One tool as the index reads it. Built by [`ToolDoc::from_definition`] from an MCP `Tool`.
#[derive(Debug, Clone, Default)]
pub struct ToolDoc {
    /// The tool's name as its server gives it (`get_current_time`), without the exposed prefix.
    pub name: String,
    /// `title` (or `annotations.title`), empty when none.
    pub title: String,
    /// `description`, empty when none.
    pub description: String,
    /// Every parameter's name and description (`inputSchema.properties`, one level), joined.
    pub params: String,
    /// The server's name in the vault (`time`).
    pub server: String,
}

impl ToolDoc {
    /// The document of `definition` (an MCP `Tool`; `name` may be the exposed name: its
    /// `server__` prefix is dropped) on `server`.
    pub fn from_definition(definition: &Value, server: &str, original: &str) -> Self {
        let s = |v: Option<&Value>| v.and_then(Value::as_str).unwrap_or_default().to_owned();
        let name = if original.is_empty() {
            let exposed = s(definition.get("name"));
            exposed.split_once("__").map_or(exposed.clone(), |(_, o)| o.to_owned())
        } else {
            original.to_owned()
        };
        let title = match s(definition.get("title")) {
            t if t.is_empty() => s(definition.pointer("/annotations/title")),
            t => t,
        };
        let mut params = String::new();
        if let Some(props) = definition.pointer("/inputSchema/properties").and_then(Value::as_object) {
            for (pname, rule) in props {
                params.push_str(pname);
                params.push(' ');
                if let Some(d) = rule.get("description").and_then(Value::as_str) {
                    params.push_str(d);
                    params.push(' ');
                }
            }
        }
        Self { name, title, description: s(definition.get("description")), params, server: server.to_owned() }
    }

    fn field(&self, f: Field) -> &str {
        match f {
            Field::Name => &self.name,
            Field::Title => &self.title,
            Field::Description => &self.description,
            Field::Params => &self.params,
            Field::Server => &self.server,
        }
    }
}

/// The fields of a tool that BM25F reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    Name,
    Title,
    Description,
    Params,
    Server,
}

/// A field's weight (how much one occurrence counts against one in the description) and its
/// length normalisation `b` (0: none, 1: full).
#[derive(Debug, Clone, Copy)]
pub struct FieldRule {
    pub field: Field,
    pub weight: f64,
    pub b: f64,
}

/// The fields and their rules. Names are short and say what a tool does: a word there counts
/// three times one in the description; the server's name (often the topic: `time`, `git`)
/// twice; parameters half (they name inputs, not the task). Descriptions vary most in length,
/// so they are normalised most.
pub const FIELDS: [FieldRule; 5] = [
    FieldRule { field: Field::Name, weight: 3.0, b: 0.3 },
    FieldRule { field: Field::Title, weight: 2.0, b: 0.3 },
    FieldRule { field: Field::Description, weight: 1.0, b: 0.75 },
    FieldRule { field: Field::Params, weight: 0.5, b: 0.75 },
    FieldRule { field: Field::Server, weight: 2.0, b: 0.0 },
];

/// BM25's term-frequency saturation.
pub const K1: f64 = 1.2;
/// Reciprocal rank fusion's constant (the paper's 60).
pub const RRF_K: f64 = 60.0;
/// Most terms of a query that are scored (a longer query's extra words are ignored).
pub const MAX_QUERY_TERMS: usize = 64;

/// Words dropped from queries and tools: English function words, the fillers of a spoken
/// request ("can you please tell me what…", "I want to…") and quantifiers ("everything",
/// "each": "unstage everything I added" is about unstaging, not about a server named
/// `everything`). Short on purpose: only words that name no task or object. Matched before
/// stemming.
pub const STOPWORDS: &[&str] = &[
    "a",
    "about",
    "all",
    "am",
    "an",
    "and",
    "any",
    "anything",
    "are",
    "as",
    "at",
    "be",
    "been",
    "but",
    "by",
    "can",
    "could",
    "d",
    "did",
    "do",
    "does",
    "each",
    "every",
    "everything",
    "for",
    "from",
    "had",
    "has",
    "have",
    "he",
    "her",
    "here",
    "him",
    "his",
    "how",
    "i",
    "if",
    "in",
    "into",
    "is",
    "it",
    "its",
    "just",
    "know",
    "let",
    "like",
    "ll",
    "m",
    "me",
    "my",
    "need",
    "now",
    "of",
    "on",
    "or",
    "our",
    "please",
    "re",
    "s",
    "she",
    "should",
    "so",
    "some",
    "something",
    "t",
    "tell",
    "than",
    "that",
    "the",
    "their",
    "them",
    "then",
    "there",
    "these",
    "they",
    "this",
    "those",
    "to",
    "up",
    "us",
    "ve",
    "want",
    "was",
    "we",
    "were",
    "what",
    "whats",
    "when",
    "where",
    "which",
    "who",
    "why",
    "will",
    "with",
    "would",
    "you",
    "your",
];

/// How much a term the [`THESAURUS`] adds counts against one the user typed.
pub const EXPANSION_WEIGHT: f64 = 0.6;

/// Words of a request → the words tools use for the same thing (both sides stemmed on use).
pub const THESAURUS: &[(&str, &[&str])] = &[
    // clocks and calendars
    ("am", &["time"]),
    ("afternoon", &["time"]),
    ("clock", &["time"]),
    ("currently", &["current"]),
    ("date", &["time", "current"]),
    ("evening", &["time"]),
    ("hour", &["time"]),
    ("midnight", &["time"]),
    ("moment", &["current"]),
    ("morning", &["time"]),
    ("night", &["time"]),
    ("noon", &["time"]),
    ("oclock", &["time"]),
    ("pm", &["time"]),
    ("today", &["current", "time"]),
    ("tonight", &["time"]),
    ("translate", &["convert"]),
    ("zone", &["timezone"]),
    // files and folders
    ("big", &["size"]),
    ("biggest", &["size"]),
    ("bytes", &["size"]),
    ("cat", &["read"]),
    ("dir", &["directory"]),
    ("display", &["read", "show"]),
    ("folder", &["directory"]),
    ("gif", &["image", "media"]),
    ("hierarchy", &["tree"]),
    ("huge", &["size"]),
    ("inside", &["contents", "read"]),
    ("jpeg", &["image", "media"]),
    ("jpg", &["image", "media"]),
    ("large", &["size"]),
    ("largest", &["size"]),
    ("locate", &["search", "find"]),
    ("make", &["create"]),
    ("look", &["read", "search"]),
    ("nested", &["tree", "recursive"]),
    ("open", &["read"]),
    ("overwrite", &["write"]),
    ("photo", &["image", "media"]),
    ("pic", &["image", "media"]),
    ("picture", &["image", "media"]),
    ("png", &["image", "media"]),
    ("print", &["read", "show"]),
    ("rename", &["move"]),
    ("replace", &["edit"]),
    ("save", &["write", "commit"]),
    ("screenshot", &["image", "media"]),
    ("small", &["tiny", "size"]),
    ("smallest", &["size"]),
    ("sound", &["audio", "media"]),
    ("structure", &["tree"]),
    ("view", &["read"]),
    // version control
    ("checkpoint", &["commit"]),
    ("compare", &["diff", "differences"]),
    ("difference", &["diff"]),
    ("dirty", &["status", "changes"]),
    ("history", &["log", "commit"]),
    ("last", &["log"]),
    ("latest", &["log"]),
    ("modified", &["status", "changes"]),
    ("pending", &["status", "changes"]),
    ("previous", &["log"]),
    ("recent", &["log"]),
    ("recently", &["log"]),
    ("repo", &["repository", "git"]),
    ("snapshot", &["commit"]),
    ("uncommitted", &["status", "changes", "unstaged"]),
    ("undo", &["reset"]),
    ("version", &["git"]),
    // numbers, text and the rest
    ("add", &["sum"]),
    ("calculate", &["sum"]),
    ("environment", &["env"]),
    ("job", &["operation"]),
    ("parrot", &["echo"]),
    ("plus", &["sum"]),
    ("repeat", &["echo"]),
    ("task", &["operation"]),
    ("total", &["sum"]),
    ("website", &["url", "fetch"]),
    ("webpage", &["url", "fetch"]),
    ("zip", &["compress", "gzip"]),
];

/// The thesaurus over stemmed terms: term → the stemmed terms it adds.
static EXPANSIONS: LazyLock<HashMap<String, Vec<String>>> = LazyLock::new(|| {
    let mut map: HashMap<String, Vec<String>> = HashMap::new();
    for (word, targets) in THESAURUS {
        let key = STEMMER.stem(word).into_owned();
        let entry = map.entry(key).or_default();
        for t in *targets {
            for term in terms(t) {
                if !entry.contains(&term) {
                    entry.push(term);
                }
            }
        }
    }
    map
});

/// Whether `query` names a clock time: `9:00`, `14:30`, `3pm`, `11am`.
fn has_clock_time(query: &str) -> bool {
    let b = query.as_bytes();
    let colon = b.windows(4).enumerate().any(|(i, w)| {
        w[0].is_ascii_digit()
            && w[1] == b':'
            && w[2].is_ascii_digit()
            && w[3].is_ascii_digit()
            && b.get(i + 4).is_none_or(|c| !c.is_ascii_digit())
    });
    let ampm = query.split(|c: char| !c.is_alphanumeric()).any(|w| {
        let w = w.to_ascii_lowercase();
        let digits = w.trim_end_matches("am").trim_end_matches("pm");
        digits.len() < w.len() && !digits.is_empty() && digits.len() <= 2 && digits.bytes().all(|c| c.is_ascii_digit())
    });
    colon || ampm
}

/// A word of a query that is a value for a tool's argument rather than a word of the task: a file
/// name (`notes.txt`, `src/main.rs`), a path (`build/output`) or a URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArgumentValue {
    /// A file name, with its extension lower-cased (`md` of `README.md`).
    File(String),
    /// A path of folders (`build/output`, `/tmp/cache`).
    Path,
    /// Anything with a scheme (`https://example.com/page`).
    Url,
}

/// What `word` (one whitespace-separated word of a query, with any quotes or punctuation around
/// it) is as an argument value, if it is one. A file name is a base name of letters, digits,
/// `_`, `-` and `.` ending in an extension of 1–5 letters and digits that starts with a letter
/// (`todo.txt`, `report-final.PDF`; not `v1.2` or `e.g.`); a path has a `/` between two names.
pub fn argument_value(word: &str) -> Option<ArgumentValue> {
    let core = word.trim_matches(|c: char| "'\"`,;:!?()[]{}<>".contains(c));
    if core.contains("://") {
        return Some(ArgumentValue::Url);
    }
    let name_char = |c: char| c.is_alphanumeric() || matches!(c, '_' | '-' | '.');
    let base = core.rsplit('/').next().unwrap_or_default();
    if let Some((stem, ext)) = base.rsplit_once('.') {
        let version =
            core.as_bytes().windows(3).any(|w| w[0].is_ascii_digit() && w[1] == b'.' && w[2].is_ascii_digit());
        if stem.chars().last().is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '-')
            && base.chars().all(name_char)
            && (1..=5).contains(&ext.chars().count())
            && ext.chars().next().is_some_and(char::is_alphabetic)
            && ext.chars().all(char::is_alphanumeric)
            && !version
        {
            return Some(ArgumentValue::File(ext.to_lowercase()));
        }
    }
    let inner = core.trim_matches('/');
    (inner.contains('/') && inner.chars().all(|c| name_char(c) || matches!(c, '/' | '~')))
        .then_some(ArgumentValue::Path)
}

/// The weighted terms of a query: its own terms (weight 1, each once) and what the
/// [`THESAURUS`], a clock time and argument values add ([`EXPANSION_WEIGHT`], unless typed
/// too), at most [`MAX_QUERY_TERMS`] of its own.
///
/// Argument values ([`argument_value`]) are not words of the task: `package.json` says "a file"
/// (and, through the thesaurus, what its extension is: `png` an image), not "package"; so a file
/// name adds `file` and its extension's expansions, a path adds `path`, a URL adds `url`, and
/// their own words are not searched.
pub fn query_terms(query: &str) -> Vec<(String, f64)> {
    let mut text = String::with_capacity(query.len());
    let mut added: Vec<String> = Vec::new();
    for word in query.split_whitespace() {
        match argument_value(word) {
            Some(ArgumentValue::File(ext)) => {
                added.push("file".into());
                added.extend(EXPANSIONS.get(STEMMER.stem(&ext).as_ref()).cloned().unwrap_or_default());
            }
            Some(ArgumentValue::Path) => added.push("path".into()),
            Some(ArgumentValue::Url) => added.push("url".into()),
            None => {
                text.push_str(word);
                text.push(' ');
            }
        }
    }
    let mut own = terms(&text);
    let mut seen = std::collections::HashSet::new();
    own.retain(|t| seen.insert(t.clone()));
    own.truncate(MAX_QUERY_TERMS);
    added.extend(own.iter().flat_map(|t| EXPANSIONS.get(t).cloned().unwrap_or_default()));
    if has_clock_time(query) {
        added.push("time".into());
    }
    let mut out: Vec<(String, f64)> = own.into_iter().map(|t| (t, 1.0)).collect();
    for t in added {
        if seen.insert(t.clone()) {
            out.push((t, EXPANSION_WEIGHT));
        }
    }
    out
}

static STEMMER: LazyLock<Stemmer> = LazyLock::new(|| Stemmer::create(Algorithm::English));

/// The terms of `text` (see the module docs), in order, repeats kept.
pub fn terms(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for word in text.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()) {
        for part in split_case(word) {
            let lower = part.to_lowercase();
            if STOPWORDS.binary_search(&lower.as_str()).is_ok() {
                continue;
            }
            out.push(STEMMER.stem(&lower).into_owned());
        }
    }
    out
}

/// `word` (letters and digits only) cut at case changes: before an upper-case letter that
/// follows a lower-case one (`getTime`), before the last capital of a run followed by a
/// lower-case letter (`HTMLParser` → `HTML`, `Parser`). Digits stay with what they follow.
fn split_case(word: &str) -> Vec<&str> {
    let chars: Vec<(usize, char)> = word.char_indices().collect();
    let mut parts = Vec::new();
    let mut start = 0;
    for i in 1..chars.len() {
        let (at, c) = chars[i];
        let prev = chars[i - 1].1;
        let next_lower = chars.get(i + 1).is_some_and(|(_, n)| n.is_lowercase());
        if c.is_uppercase() && (prev.is_lowercase() || prev.is_numeric() || (prev.is_uppercase() && next_lower)) {
            parts.push(&word[start..at]);
            start = at;
        }
    }
    parts.push(&word[start..]);
    parts
}

/// The per-field term counts and lengths of one tool.
struct Indexed {
    /// For each field rule: term → count, and the field's length in terms.
    fields: Vec<(HashMap<String, u32>, u32)>,
}

/// The BM25F index of a set of tools (built per search: a few hundred tools take well under a
/// millisecond).
pub struct ToolIndex {
    rules: Vec<FieldRule>,
    docs: Vec<Indexed>,
    /// Average length of each field over the tools (at least 1).
    avg: Vec<f64>,
    /// Tools that have a term in any field.
    df: HashMap<String, u32>,
}

impl ToolIndex {
    /// The index of `docs` over [`FIELDS`] (their positions are the ids [`ToolIndex::rank`]
    /// answers with).
    pub fn new(docs: &[ToolDoc]) -> Self {
        Self::with_fields(docs, &FIELDS)
    }

    /// The index of `docs` over the fields `rules` name (a field not named is not read).
    pub fn with_fields(docs: &[ToolDoc], rules: &[FieldRule]) -> Self {
        let mut indexed = Vec::with_capacity(docs.len());
        let mut total = vec![0f64; rules.len()];
        let mut df: HashMap<String, u32> = HashMap::new();
        for d in docs {
            let fields: Vec<(HashMap<String, u32>, u32)> = rules
                .iter()
                .map(|rule| {
                    let t = terms(d.field(rule.field));
                    let len = t.len() as u32;
                    let mut counts = HashMap::new();
                    for term in t {
                        *counts.entry(term).or_insert(0) += 1;
                    }
                    (counts, len)
                })
                .collect();
            let mut seen: Vec<&String> = fields.iter().flat_map(|(c, _)| c.keys()).collect();
            seen.sort_unstable();
            seen.dedup();
            for term in seen {
                *df.entry(term.clone()).or_insert(0) += 1;
            }
            for (i, (_, len)) in fields.iter().enumerate() {
                total[i] += f64::from(*len);
            }
            indexed.push(Indexed { fields });
        }
        let n = docs.len().max(1) as f64;
        let avg = total.into_iter().map(|t| (t / n).max(1.0)).collect();
        Self { rules: rules.to_vec(), docs: indexed, avg, df }
    }

    /// Whether tool `id` is a good match for the weighted query terms `q` ([`query_terms`]), not
    /// one that shares a word in passing: a term of the query (typed, or added by the
    /// [`THESAURUS`]) is in the tool's name, title or server name, or the tool has at least half
    /// of the query's own terms and two of them when the query has two or more (in any field;
    /// terms no tool has count too, so "what time is it in Tokyo" is not a good match for a tool
    /// whose description mentions "time" only, while "show the latest commits of the
    /// repository" is for `git_log`, "Shows the commit logs").
    pub fn is_strong(&self, id: usize, q: &[(String, f64)]) -> bool {
        let Some(doc) = self.docs.get(id) else { return false };
        let named = self.rules.iter().zip(&doc.fields).any(|(rule, (counts, _))| {
            matches!(rule.field, Field::Name | Field::Title | Field::Server)
                && q.iter().any(|(t, _)| counts.contains_key(t))
        });
        if named {
            return true;
        }
        let own: Vec<&String> = q.iter().filter(|(_, w)| *w >= 1.0).map(|(t, _)| t).collect();
        let had = own.iter().filter(|t| doc.fields.iter().any(|(counts, _)| counts.contains_key(t.as_str()))).count();
        2 * had >= own.len() && had >= own.len().min(2)
    }

    /// Every tool that shares a term with `query`, as `(id, score)`, best first (ties by id);
    /// empty when the query has no terms.
    pub fn rank(&self, query: &str) -> Vec<(usize, f64)> {
        self.rank_terms(&query_terms(query))
    }

    /// [`ToolIndex::rank`] for weighted terms (e.g. a query's own terms without the
    /// thesaurus's: `terms(q)` each at weight 1).
    pub fn rank_terms(&self, q: &[(String, f64)]) -> Vec<(usize, f64)> {
        let n = self.docs.len() as f64;
        let mut scored: Vec<(usize, f64)> = Vec::new();
        for (id, doc) in self.docs.iter().enumerate() {
            let mut score = 0.0;
            for (term, weight) in q {
                let Some(&df) = self.df.get(term) else { continue };
                let mut tf = 0.0;
                for (i, rule) in self.rules.iter().enumerate() {
                    let (counts, len) = &doc.fields[i];
                    if let Some(&c) = counts.get(term) {
                        let norm = 1.0 - rule.b + rule.b * f64::from(*len) / self.avg[i];
                        tf += rule.weight * f64::from(c) / norm;
                    }
                }
                if tf > 0.0 {
                    let idf = (1.0 + (n - f64::from(df) + 0.5) / (f64::from(df) + 0.5)).ln();
                    score += weight * idf * tf / (K1 + tf);
                }
            }
            if score > 0.0 {
                scored.push((id, score));
            }
        }
        scored.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        scored
    }
}

/// The relevance cutoff of a keyword ranking (`ranked`, ids of `index` best first, for
/// `query`): `(shown, weak)`. When the best tool is a good match ([`ToolIndex::is_strong`]),
/// only the good matches are shown, in order (a tool that shares one word of a long question in
/// passing is left out); when it is not, there is no good match: every tool is shown, and
/// `weak` says so (the answer then says "no good match" rather than offering an unrelated tool
/// as if it fitted).
pub fn cut_weak(index: &ToolIndex, query: &str, ranked: &[usize]) -> (Vec<usize>, bool) {
    let q = query_terms(query);
    match ranked.first() {
        Some(&best) if index.is_strong(best, &q) => {
            (ranked.iter().copied().filter(|&id| index.is_strong(id, &q)).collect(), false)
        }
        Some(_) => (ranked.to_vec(), true),
        None => (Vec::new(), false),
    }
}

/// Reciprocal rank fusion of rankings (each a list of ids, best first): `(id, Σ 1/(RRF_K +
/// rank))`, best first, ties by the first ranking's order, then id.
pub fn fuse(rankings: &[Vec<usize>]) -> Vec<(usize, f64)> {
    let mut score: HashMap<usize, (f64, usize)> = HashMap::new();
    for (r, ranking) in rankings.iter().enumerate() {
        for (rank, &id) in ranking.iter().enumerate() {
            let e = score.entry(id).or_insert((0.0, usize::MAX));
            e.0 += 1.0 / (RRF_K + rank as f64 + 1.0);
            if r == 0 {
                e.1 = rank;
            }
        }
    }
    let mut out: Vec<(usize, f64, usize)> = score.into_iter().map(|(id, (s, first))| (id, s, first)).collect();
    out.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.2.cmp(&b.2)).then(a.0.cmp(&b.0)));
    out.into_iter().map(|(id, s, _)| (id, s)).collect()
}

#[cfg(test)]
mod labelled;

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn stopwords_are_sorted_for_binary_search() {
        assert!(STOPWORDS.windows(2).all(|w| w[0] < w[1]), "STOPWORDS must be sorted and unique");
    }

    #[test]
    fn terms_split_names_on_separators_and_case_and_stem() {
        assert_eq!(terms("get_current_time"), ["get", "current", "time"]);
        assert_eq!(terms("git-diff.staged"), ["git", "diff", "stage"]);
        assert_eq!(terms("getCurrentTime"), ["get", "current", "time"]);
        assert_eq!(terms("HTMLParser utf8Decode"), ["html", "parser", "utf8", "decod"]);
        assert_eq!(terms("What time is it in Tokyo?"), ["time", "tokyo"]);
        assert_eq!(terms("timezones"), terms("timezone"));
        assert_eq!(terms("listing directories"), ["list", "directori"]);
        assert_eq!(terms("directory"), ["directori"]);
        assert_eq!(terms(""), Vec::<String>::new());
        assert_eq!(terms("¿日本語 ÉTÉ?"), ["日本語", "été"], "other scripts and accents pass through");
    }

    #[test]
    fn argument_values_are_recognised_and_not_searched_as_words() {
        use ArgumentValue::{File, Path, Url};
        let cases: [(&str, Option<ArgumentValue>); 16] = [
            ("todo.txt", Some(File("txt".into()))),
            ("'README.md'", Some(File("md".into()))),
            ("report-final.PDF,", Some(File("pdf".into()))),
            ("src/main.rs", Some(File("rs".into()))),
            ("~/.bashrc", Some(Path)),
            (".env", None),
            ("build/output", Some(Path)),
            ("/tmp/cache/", Some(Path)),
            ("https://example.com/a.html", Some(Url)),
            ("v1.2", None),
            ("release-1.2.tar", None),
            ("e.g.", None),
            ("10:00", None),
            ("and/or", Some(Path)),
            ("file", None),
            ("a.b.c.toolong", None),
        ];
        for (word, want) in cases {
            assert_eq!(argument_value(word), want, "{word:?}");
        }
        let q = query_terms("print the contents of package.json");
        assert!(q.contains(&("file".into(), EXPANSION_WEIGHT)), "{q:?}");
        assert!(!q.iter().any(|(t, _)| t == "packag" || t == "json"), "the file's own words are not searched: {q:?}");
        let q = query_terms("show me logo.png");
        assert!(
            q.contains(&("imag".into(), EXPANSION_WEIGHT)),
            "an extension the thesaurus knows adds its words: {q:?}"
        );
        assert_eq!(
            query_terms("notes.txt"),
            [("file".to_owned(), EXPANSION_WEIGHT)],
            "only an argument: still a query"
        );
        let own: Vec<String> = query_terms("unstage everything I added").into_iter().map(|(t, _)| t).take(2).collect();
        assert_eq!(own, [terms("unstage"), terms("added")].concat(), "a quantifier is no topic");
    }

    fn doc(server: &str, name: &str, description: &str) -> ToolDoc {
        ToolDoc::from_definition(&json!({"name": name, "description": description}), server, name)
    }

    #[test]
    fn a_name_match_outranks_a_description_match_and_idf_favours_rare_words() {
        let docs = [
            doc("fs", "read_file", "Read a file. Returns its text. Works on any path in the allowed directories."),
            doc("fs", "list_directory", "List the entries of a directory; each file is marked [FILE]."),
            doc("time", "get_current_time", "Get current time in a specific timezone"),
            doc("time", "convert_time", "Convert time between timezones"),
        ];
        let index = ToolIndex::new(&docs);
        let mut ids: Vec<usize> = index.rank("what time is it in Tokyo").into_iter().map(|(i, _)| i).collect();
        ids.sort_unstable();
        assert_eq!(ids, [2, 3], "the time tools, and only they");
        assert_eq!(index.rank("read a file")[0].0, 0);
        assert_eq!(index.rank("time zones")[0].0, 3, "'time zones' meets 'timezones' by its stem");
        assert!(index.rank("the of and").is_empty(), "only stopwords: nothing");
        assert!(index.rank("zebra").is_empty());
        assert!(ToolIndex::new(&[]).rank("time").is_empty());
    }

    #[test]
    fn parameters_and_server_names_are_searched() {
        let t = json!({"name": "fetch", "description": "Fetches a thing.",
            "inputSchema": {"properties": {"url": {"type": "string", "description": "The page's address"}}}});
        let d = ToolDoc::from_definition(&t, "web", "");
        assert_eq!(d.params, "url The page's address ");
        let other = doc("fs", "read_file", "Read a file");
        let index = ToolIndex::new(&[other, d]);
        assert_eq!(index.rank("page address")[0].0, 1);
        assert_eq!(index.rank("web")[0].0, 1);
        let exposed = ToolDoc::from_definition(&json!({"name": "time__convert_time", "title": "Convert"}), "time", "");
        assert_eq!((exposed.name.as_str(), exposed.title.as_str()), ("convert_time", "Convert"));
    }

    #[test]
    fn fusion_keeps_what_either_ranking_found() {
        let fused = fuse(&[vec![1, 2, 3], vec![3, 4]]);
        let ids: Vec<usize> = fused.iter().map(|(i, _)| *i).collect();
        assert_eq!(ids, [3, 1, 2, 4], "in both lists beats first in one");
        assert!(fuse(&[]).is_empty());
    }
}
