//! Memory: one fact per markdown file, `COFFER_HOME/memory/<id>.md`, with front matter `id`,
//! `created` (RFC 3339), `tags` and `source`, and the fact's text as the body. Ids are ULIDs made
//! here (sortable by creation time).
//!
//! `remember` writes the file atomically (a hidden temp file in the same folder, written,
//! fsynced, renamed over the final name, then the folder fsynced: a crash leaves either no file
//! or the whole file, and the temp name never matches `*.md`), indexes it at once (one
//! `UpsertDocument`, not waiting for the watcher) and answers. An exact duplicate (same text
//! once whitespace and case are normalized) or a near duplicate (token Jaccard ≥
//! [`NEAR_DUPLICATE`] with one of the best keyword hits in memory) is answered with the
//! existing fact instead of a new file. The duplicate check and the write happen under one
//! async mutex, so concurrent `remember`s of different facts each get their file and
//! concurrent ones of the same fact give one.
//!
//! A fact whose text looks like a secret (a token, a key, `password=…`: [`secret_in`]) is
//! refused: memory is plain markdown, indexed, searched and shown to models; secrets belong in
//! the credential store.
//!
//! Notes the user writes into `memory/` by hand are facts too: their id is the file name
//! without `.md` (any name [`check_fact_id`] accepts), their date the file's mtime. A fact file
//! whose front matter is malformed is still shown (without tags and source) with a `warning`
//! naming the problem, never an error.
use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use coffer_proto::retrieval::{Fact, ListFactsReply, RememberReply};
use coffer_proto::store::{Filters, KeywordQueryRequest, MatchMode};
use ulid::Ulid;

use crate::error::{Error, Result};
use crate::indexer::Indexer;
use crate::skills::{parse_yaml_map, split_front_matter, yaml_text};
use crate::sources::{MEMORY, Sources};
use crate::terms;

/// Longest fact text, bytes.
pub const MAX_TEXT: usize = 16 * 1024;
/// Most tags on a fact.
pub const MAX_TAGS: usize = 32;
/// Longest tag, characters.
pub const MAX_TAG_CHARS: usize = 64;
/// Longest `source`, bytes.
pub const MAX_SOURCE: usize = 256;
/// Token Jaccard similarity at or above which a fact is a near duplicate.
pub const NEAR_DUPLICATE: f64 = 0.9;
/// Keyword hits compared with a new fact.
const CANDIDATES: u32 = 20;
/// Default and largest page of `ListFacts`.
pub const DEFAULT_PAGE: usize = 50;
/// Largest page of `ListFacts`.
pub const MAX_PAGE: usize = 500;

/// Longest hand-written note name usable as a fact id, bytes.
pub const MAX_NOTE_ID: usize = 200;

/// Checks a fact id and returns its canonical form: a ULID (26 Crockford base-32 characters,
/// any case) in upper case, or the name of a hand-written note in `memory/` without `.md`
/// (1-[`MAX_NOTE_ID`] bytes, no `/`, `\`, control character or leading `.`), as given. Never a
/// path.
///
/// # Errors
/// [`Error::Invalid`] naming the rule.
pub fn check_fact_id(id: &str) -> Result<String> {
    if let Ok(u) = check_id(id) {
        return Ok(u.to_string());
    }
    let ok = !id.is_empty()
        && id.len() <= MAX_NOTE_ID
        && !id.starts_with('.')
        && !id.chars().any(|c| c == '/' || c == '\\' || c.is_control());
    if ok {
        Ok(id.to_owned())
    } else {
        Err(Error::Invalid(format!(
            "id {} is not a fact id (a 26-character ULID, or the name of a note in memory/ without .md: at most {MAX_NOTE_ID} bytes, no / or \\, not starting with .)",
            crate::error::shown_at(id, 40)
        )))
    }
}

/// Checks a ULID fact id (26 Crockford base-32 characters), so never a path.
///
/// # Errors
/// [`Error::Invalid`] naming the rule.
pub fn check_id(id: &str) -> Result<Ulid> {
    let ok = id.len() == 26 && id.bytes().all(|b| b.is_ascii_alphanumeric());
    ok.then(|| Ulid::from_string(id).ok()).flatten().ok_or_else(|| {
        Error::Invalid(format!("id {} is not a fact id (a 26-character ULID)", crate::error::shown_at(id, 40)))
    })
}

/// Checks tags: at most [`MAX_TAGS`], each 1-[`MAX_TAG_CHARS`] letters (any script), digits,
/// `_`, `.` or `-`, parts of a nested tag joined by `/` (`rust/async`).
///
/// # Errors
/// [`Error::Invalid`] naming the tag.
pub fn check_tags(tags: &[String]) -> Result<()> {
    if tags.len() > MAX_TAGS {
        return Err(Error::Invalid(format!("tags has {} entries; at most {MAX_TAGS}", tags.len())));
    }
    for t in tags {
        // `/` nests tags as notes apps do (`#rust/async`), between two parts only.
        let ok = (1..=MAX_TAG_CHARS).contains(&t.chars().count())
            && t.chars().all(|c| c.is_alphanumeric() || matches!(c, '_' | '.' | '-' | '/'))
            && t.split('/').all(|part| !part.is_empty());
        if !ok {
            return Err(Error::Invalid(format!(
                "tag {} must be 1-{MAX_TAG_CHARS} letters, digits, _, . or -, with / between nested parts",
                crate::error::shown_at(t, 70)
            )));
        }
    }
    Ok(())
}

/// Whitespace collapsed, lowercased, trimmed: what "the same text" means.
pub fn normalize(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ").to_lowercase()
}

/// The token set of a text, as the keyword index sees it (CJK as bigrams).
pub fn tokens(text: &str) -> HashSet<String> {
    terms::index_text(text).split_whitespace().map(str::to_lowercase).collect()
}

/// Jaccard similarity of two token sets (1.0 for two empty sets).
pub fn jaccard(a: &HashSet<String>, b: &HashSet<String>) -> f64 {
    if a.is_empty() && b.is_empty() {
        return 1.0;
    }
    let inter = a.intersection(b).count() as f64;
    let union = a.union(b).count() as f64;
    inter / union
}

/// The file text of a fact.
pub fn render(id: &Ulid, created_ms: i64, text: &str, tags: &[String], source: &str) -> String {
    // Tags and source are written as JSON strings: valid YAML whatever they hold.
    let tags = serde_json::to_string(tags).expect("strings serialize");
    let source = serde_json::to_string(source).expect("strings serialize");
    let created = coffer_runtime::rfc3339_from_unix_ms(created_ms);
    format!("---\nid: {id}\ncreated: {created}\ntags: {tags}\nsource: {source}\n---\n{}\n", text.trim_end())
}

/// Parses a fact file (`path` is where it is; its stem is the id; `mtime_ms` dates a
/// hand-written note whose name is not a ULID). Never fails: a malformed front matter leaves
/// tags and source empty and says why in `warning`.
pub fn parse_fact(path: &Path, text: &str, mtime_ms: i64) -> Fact {
    let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or_default();
    let (id, created_ms) = match check_id(stem) {
        Ok(u) if u.to_string() == stem => (stem.to_owned(), u.timestamp_ms() as i64),
        _ => (stem.to_owned(), mtime_ms),
    };
    let mut warning = String::new();
    let (tags, source, body) = match split_front_matter(text) {
        Some((yaml, body)) => match parse_yaml_map(yaml) {
            Ok(map) => {
                let mut tags = Vec::new();
                let mut source = String::new();
                for (k, v) in map {
                    match (k.as_str(), v) {
                        ("tags", yaml_rust2::Yaml::Array(a)) => tags = a.iter().map(yaml_text).collect(),
                        ("tags", v) => tags = vec![yaml_text(&v)].into_iter().filter(|t| !t.is_empty()).collect(),
                        ("source", v) => source = yaml_text(&v),
                        _ => {}
                    }
                }
                (tags, source, body)
            }
            Err(e) => {
                warning =
                    format!("{e}; shown without its tags and source (fix the front matter of {})", path.display());
                (Vec::new(), String::new(), body)
            }
        },
        None => (Vec::new(), String::new(), text),
    };
    Fact { id, text: body.trim().to_owned(), tags, source, created_ms, path: path.display().to_string(), warning }
}

/// Why `text` looks like it holds a secret, if it does: a word that looks like a token
/// (`coffer_types::secrets::looks_like_token`: well-known prefixes such as `ghp_` or `sk-`, a
/// `Bearer …` value, a long high-entropy string), or `name=value` / `name: value` where the
/// name says secret (`coffer_types::secrets::SECRET_WORDS`: password, token, key, …) and the
/// value looks like one (8+ characters with a digit or a symbol, or a token). The reason names
/// the pattern, never the value.
pub fn secret_in(text: &str) -> Option<String> {
    use coffer_types::secrets::{AUTH_SCHEMES, SECRET_WORDS, looks_like_token};
    let trim = |w: &str| {
        w.trim_matches(|c: char| matches!(c, '"' | '\'' | '`' | ',' | ';' | '(' | ')' | '[' | ']' | '<' | '>'))
            .to_owned()
    };
    let lower = text.to_ascii_lowercase();
    if let Some(scheme) = AUTH_SCHEMES.iter().find(|s| {
        lower.match_indices(*s).any(|(i, _)| {
            (i == 0 || !lower.as_bytes()[i - 1].is_ascii_alphanumeric())
                && text[i + s.len()..].split_whitespace().next().is_some_and(|v| {
                    let v = trim(v);
                    v.len() >= 12 && v.bytes().any(|b| b.is_ascii_digit())
                })
        })
    }) {
        return Some(format!("it holds an authorization value ({}…)", scheme.trim()));
    }
    let words: Vec<String> = text.split_whitespace().map(trim).collect();
    if words.iter().any(|w| looks_like_token(w)) {
        return Some("it holds something that looks like an API token or key".into());
    }
    let secretish = |name: &str| {
        let n = name.to_ascii_lowercase();
        SECRET_WORDS.iter().any(|w| n.contains(w))
    };
    let value_like = |v: &str| {
        let v = trim(v);
        looks_like_token(&v)
            || (v.chars().count() >= 8
                && v.chars().any(|c| c.is_ascii_digit() || (c.is_ascii_punctuation() && c != '.'))
                && !v.contains("://"))
    };
    for (i, w) in words.iter().enumerate() {
        for sep in ['=', ':'] {
            if let Some((name, value)) = w.split_once(sep) {
                let value = if value.is_empty() { words.get(i + 1).map(String::as_str).unwrap_or("") } else { value };
                if !name.is_empty() && secretish(name) && value_like(value) {
                    return Some(format!("it looks like a {} with its value", name.to_ascii_lowercase()));
                }
            }
        }
    }
    credential_phrase_in(&words)
}

/// Words that name a credential in prose; `key` only after one of [`KEY_QUALIFIERS`].
const CREDENTIAL_WORDS: &[&str] =
    &["password", "passwd", "pwd", "passphrase", "passcode", "secret", "pin", "token", "apikey", "api-key", "api_key"];
/// What makes `key` a credential's name ("the api key is …", not "the key point is …").
const KEY_QUALIFIERS: &[&str] =
    &["api", "access", "secret", "private", "license", "licence", "encryption", "wifi", "wi-fi"];
/// Words that hand a value to the name before them: "… password is X", "… PIN was X".
const CONNECTORS: &[&str] = &["is", "was", "=", ":", "->", "=>"];
/// Filler words allowed between a credential's name and its connector ("the password for the
/// staging box is …"): at most this many.
const MAX_FILLER_WORDS: usize = 4;

/// A credential named in prose and given a value: "The staging DB password is hunter2-Xy9!kQ",
/// "wifi passphrase: Tr0ub4dor&3", "the PIN is 4821". Ordinary sentences about credentials
/// ("the password policy is strict", "the secret is to knead longer", "the api key is in
/// 1Password") pass: the value must look like a credential ([`credential_like`]), not a word.
fn credential_phrase_in(words: &[String]) -> Option<String> {
    let lower: Vec<String> = words.iter().map(|w| w.to_lowercase()).collect();
    for (i, w) in lower.iter().enumerate() {
        // `password:` / `pin=` carry their connector; `password` waits for one.
        let (name, attached) = match w.strip_suffix([':', '=']) {
            Some(n) => (n, true),
            None => (w.as_str(), false),
        };
        let is_key = name == "key" && i > 0 && KEY_QUALIFIERS.contains(&lower[i - 1].trim_end_matches([':', '=']));
        if !(CREDENTIAL_WORDS.contains(&name) || is_key) {
            continue;
        }
        let pin = matches!(name, "pin" | "passcode");
        let value_at = if attached {
            Some(i + 1)
        } else {
            (i + 1..lower.len().min(i + 2 + MAX_FILLER_WORDS))
                .find(|&j| CONNECTORS.contains(&lower[j].as_str()) || lower[j].ends_with(':'))
                .map(|j| j + 1)
        };
        let Some(value) = value_at.and_then(|j| words.get(j)) else { continue };
        if credential_like(value, pin) {
            let what = if is_key { "key" } else { name };
            return Some(format!("it names a {what} and gives its value"));
        }
    }
    None
}

/// Whether `value` (one word of a fact) looks like a credential rather than a word: 6+
/// characters with a digit or a symbol and at least two character classes (lower, upper,
/// digit, symbol), or 6+ digits; for a PIN also 4-8 digits. Not a URL, not a plain word.
fn credential_like(value: &str, pin: bool) -> bool {
    // Sentence punctuation after the value is not part of it.
    let v = value.trim_end_matches(['.', ',', ';', ':', ')', '!', '?']);
    let n = v.chars().count();
    if v.contains("://") || n > 256 {
        return false;
    }
    let digits = v.chars().filter(char::is_ascii_digit).count();
    if digits == n {
        return if pin { (4..=8).contains(&n) } else { n >= 6 };
    }
    let lower = v.chars().any(|c| c.is_lowercase());
    let upper = v.chars().any(|c| c.is_uppercase());
    let symbol = v.chars().any(|c| !c.is_alphanumeric());
    let classes = [lower, upper, digits > 0, symbol].iter().filter(|&&b| b).count();
    n >= 6 && (digits > 0 || symbol) && classes >= 2
}

/// Writes `contents` to `dir/name` atomically: a hidden temp file in `dir`, fsynced, renamed to
/// `name`, and `dir` fsynced. Never leaves a half-written `name`; the temp file is removed when
/// any step fails.
///
/// # Errors
/// The I/O error, with the path.
pub fn write_atomic(dir: &Path, name: &str, contents: &[u8]) -> Result<PathBuf> {
    write_atomic_with_mode(dir, name, contents, None)
}

/// [`write_atomic`], the file getting permission bits `mode` (e.g. `0o644`) instead of what the
/// process's umask gives a new file: a note written into the user's own folder keeps the mode
/// the user gave it.
///
/// # Errors
/// As [`write_atomic`].
pub fn write_atomic_with_mode(dir: &Path, name: &str, contents: &[u8], mode: Option<u32>) -> Result<PathBuf> {
    let target = dir.join(name);
    let mut suffix = [0u8; 8];
    getrandom::fill(&mut suffix).map_err(|e| Error::Internal(format!("no randomness: {e}")))?;
    let temp = dir.join(format!(".{name}.tmp-{}", hex::encode(suffix)));
    let io = |what: &str, e| Error::io(format!("{what} {}", temp.display()), e);
    let result = (|| {
        let mut f =
            std::fs::OpenOptions::new().write(true).create_new(true).open(&temp).map_err(|e| io("creating", e))?;
        f.write_all(contents).map_err(|e| io("writing", e))?;
        if let Some(mode) = mode {
            use std::os::unix::fs::PermissionsExt as _;
            f.set_permissions(std::fs::Permissions::from_mode(mode & 0o7777))
                .map_err(|e| io("setting the mode of", e))?;
        }
        f.sync_all().map_err(|e| io("syncing", e))?;
        drop(f);
        std::fs::rename(&temp, &target).map_err(|e| io("renaming", e))?;
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| Error::io(format!("syncing {}", dir.display()), e))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    result.map(|()| target)
}

/// Removes temp files a crash left in `dir` (names `.<x>.tmp-<hex>`). Returns how many.
pub fn sweep_temp_files(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_str().is_some_and(|n| n.starts_with('.') && n.contains(".tmp-")))
        .filter(|e| std::fs::remove_file(e.path()).is_ok())
        .count()
}

/// Memory: facts on disk, indexed in the `memory` KB.
pub struct Memory {
    sources: Arc<Sources>,
    indexer: Arc<Indexer>,
    write: tokio::sync::Mutex<()>,
}

impl Memory {
    /// Memory over `sources`' memory folder.
    pub fn new(sources: Arc<Sources>, indexer: Arc<Indexer>) -> Self {
        Self { sources, indexer, write: tokio::sync::Mutex::new(()) }
    }

    fn dir(&self) -> PathBuf {
        self.sources.memory_root()
    }

    /// The file name (`<id>.md`) of fact `id` in the memory folder: the canonical id's file,
    /// else (a hand-written `01abc….md` in lower case) the id as given.
    ///
    /// # Errors
    /// [`Error::Invalid`] for a bad id, [`Error::NotFound`] when there is no such file.
    fn file_of(&self, id: &str) -> Result<String> {
        let canonical = check_fact_id(id)?;
        for name in [format!("{canonical}.md"), format!("{id}.md")] {
            if std::fs::symlink_metadata(self.dir().join(&name)).is_ok_and(|m| m.is_file()) {
                return Ok(name);
            }
        }
        Err(Error::NotFound(format!("no fact {}", crate::error::shown_at(id, 40))))
    }

    /// Reads fact `id` from its file (a malformed front matter gives the fact with a
    /// `warning`, not an error).
    ///
    /// # Errors
    /// [`Error::Invalid`] for a bad id, [`Error::NotFound`] when there is no such file,
    /// [`Error::Precondition`] when it is not UTF-8 text.
    pub fn get(&self, id: &str) -> Result<Fact> {
        let name = self.file_of(id)?;
        let path = self.dir().join(&name);
        let bytes = match std::fs::read(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::NotFound(format!("no fact {}", crate::error::shown(id))));
            }
            Err(e) => return Err(Error::io(format!("reading {}", path.display()), e)),
        };
        let text = String::from_utf8(bytes).map_err(|e| {
            Error::Precondition(format!(
                "fact file {} is not UTF-8 text (invalid byte at offset {})",
                path.display(),
                e.utf8_error().valid_up_to()
            ))
        })?;
        let mtime = std::fs::metadata(&path)
            .ok()
            .and_then(|m| m.modified().ok())
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_millis() as i64);
        Ok(parse_fact(&path, &text, mtime))
    }

    /// Facts newest first, `tags` all present, after cursor `after` (an id), at most `limit`
    /// (0 = [`DEFAULT_PAGE`]).
    ///
    /// # Errors
    /// [`Error::Invalid`] for a bad cursor, limit or tag.
    pub fn list(&self, limit: u32, after: &str, tags: &[String]) -> Result<ListFactsReply> {
        check_tags(tags)?;
        let limit = match limit as usize {
            0 => DEFAULT_PAGE,
            n if n > MAX_PAGE => return Err(Error::Invalid(format!("limit must be at most {MAX_PAGE}"))),
            n => n,
        };
        if !after.is_empty() {
            check_fact_id(after)?;
        }
        // Every `*.md` file is a fact (the memory KB indexes them all): ours by ULID, the
        // user's hand-written notes by their name.
        let mut ids: Vec<String> = std::fs::read_dir(self.dir())
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
                    .filter_map(|e| e.file_name().to_str().and_then(|n| n.strip_suffix(".md")).map(str::to_owned))
                    .filter(|stem| check_fact_id(stem).is_ok())
                    .collect()
            })
            .unwrap_or_default();
        ids.sort_unstable_by(|a, b| b.cmp(a));
        let mut facts = Vec::new();
        let mut next_cursor = String::new();
        for id in ids.into_iter().filter(|id| after.is_empty() || id.as_str() < after) {
            let Ok(fact) = self.get(&id) else { continue };
            if !tags.iter().all(|t| fact.tags.contains(t)) {
                continue;
            }
            if facts.len() == limit {
                next_cursor = facts.last().map(|f: &Fact| f.id.clone()).unwrap_or_default();
                break;
            }
            facts.push(fact);
        }
        Ok(ListFactsReply { facts, next_cursor })
    }

    /// The existing fact that `text` duplicates, with the similarity, if any.
    async fn duplicate_of(&self, text: &str) -> Result<Option<(Fact, f64)>> {
        let wanted = normalize(text);
        let mine = tokens(text);
        let terms: Vec<String> = terms::query_terms(text).into_iter().take(terms::MAX_TERMS).collect();
        if terms.is_empty() {
            return Ok(None);
        }
        let mut index = self.sources.index();
        let filters = Filters { kb: vec![MEMORY.into()], ..Filters::default() };
        let mut seen = HashSet::new();
        let mut best: Option<(Fact, f64)> = None;
        for mode in [MatchMode::All, MatchMode::Any] {
            let req = KeywordQueryRequest {
                terms: terms.clone(),
                mode: mode as i32,
                filters: Some(filters.clone()),
                limit: CANDIDATES,
                one_per_document: true,
            };
            let hits = index.keyword_query(req).await?.into_inner().hits;
            for hit in hits {
                let Some(chunk) = hit.chunk else { continue };
                if !seen.insert(chunk.path.clone()) {
                    continue;
                }
                let Some(id) = chunk.path.strip_suffix(".md") else { continue };
                let Ok(fact) = self.get(id) else { continue };
                let similarity =
                    if normalize(&fact.text) == wanted { 1.0 } else { jaccard(&mine, &tokens(&fact.text)) };
                if similarity >= NEAR_DUPLICATE && best.as_ref().is_none_or(|(_, s)| similarity > *s) {
                    best = Some((fact, similarity));
                }
            }
            if best.as_ref().is_some_and(|(_, s)| *s >= 1.0) {
                break;
            }
        }
        Ok(best)
    }

    /// Remembers a fact (see the module docs).
    ///
    /// # Errors
    /// [`Error::Invalid`] for an empty or over-long text, bad tags or source, or a text that
    /// looks like it holds a secret ([`secret_in`]) unless `allow_secret`; file and store errors
    /// (then no file is left behind).
    pub async fn remember(
        &self,
        text: &str,
        tags: Vec<String>,
        source: &str,
        allow_secret: bool,
    ) -> Result<RememberReply> {
        let text = text.trim();
        if text.is_empty() {
            return Err(Error::Invalid("text is empty".into()));
        }
        if text.len() > MAX_TEXT {
            return Err(Error::Invalid(format!("text is {} bytes; at most {MAX_TEXT}", text.len())));
        }
        check_tags(&tags)?;
        if !allow_secret && let Some(why) = secret_in(text) {
            return Err(Error::Invalid(format!(
                "text looks like it holds a secret ({why}); memory is plain markdown that models read and sync copies: keep secrets in the credential store (`coffer credentials set NAME`) and remember only where they are, or store it anyway with allow_secret (CLI: --allow-secret)"
            )));
        }
        if source.len() > MAX_SOURCE || source.chars().any(char::is_control) {
            return Err(Error::Invalid(format!(
                "source must be at most {MAX_SOURCE} bytes without control characters"
            )));
        }
        let _one_at_a_time = self.write.lock().await;
        if let Some((fact, similarity)) = self.duplicate_of(text).await? {
            return Ok(RememberReply { fact: Some(fact), created: false, similarity });
        }
        let created_ms = crate::indexer::now_ms();
        let mut random = [0u8; 16];
        getrandom::fill(&mut random).map_err(|e| Error::Internal(format!("no randomness: {e}")))?;
        let id = Ulid::from_parts(created_ms as u64, u128::from_le_bytes(random));
        let dir = self.dir();
        std::fs::create_dir_all(&dir).map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
        let name = format!("{id}.md");
        let path = write_atomic(&dir, &name, render(&id, created_ms, text, &tags, source).as_bytes())?;
        let def = self.sources.require(MEMORY)?;
        if let Err(e) = self.indexer.index_path(&def, &name).await {
            // Not indexed means not remembered as far as recall goes: take the file back.
            let _ = std::fs::remove_file(&path);
            return Err(e);
        }
        let fact = Fact {
            id: id.to_string(),
            text: text.to_owned(),
            tags,
            source: source.to_owned(),
            created_ms,
            path: path.display().to_string(),
            warning: String::new(),
        };
        Ok(RememberReply { fact: Some(fact), created: true, similarity: 0.0 })
    }

    /// Forgets fact `id`: its file and its index entries.
    ///
    /// # Errors
    /// [`Error::Invalid`] for a bad id, [`Error::NotFound`] when there is no such fact.
    pub async fn forget(&self, id: &str) -> Result<u64> {
        let _one_at_a_time = self.write.lock().await;
        let name = self.file_of(id)?;
        let path = self.dir().join(&name);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::NotFound(format!("no fact {}", crate::error::shown(id))));
            }
            Err(e) => return Err(Error::io(format!("removing {}", path.display()), e)),
        }
        let _ = std::fs::File::open(self.dir()).and_then(|d| d.sync_all());
        let def = self.sources.require(MEMORY)?;
        self.indexer.index_path(&def, &name).await?;
        Ok(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_ulids_and_nothing_else() {
        let id = Ulid::from_parts(1_700_000_000_000, 42).to_string();
        assert!(check_id(&id).is_ok());
        for bad in [
            "",
            "../../etc/passwd",
            "01ARZ3NDEKTSV4RRFFQ69G5FA/",
            "01ARZ3NDEKTSV4RRFFQ69G5FA",
            "..",
            "01ARZ3NDEKTSV4RRFFQ69G5FAVX",
            "a/b",
        ] {
            let e = check_id(bad).unwrap_err().to_string();
            assert!(e.contains("not a fact id"), "{bad}: {e}");
        }
        for bad in ["", "../../etc/passwd", "01ARZ3NDEKTSV4RRFFQ69G5FA/", "..", "a/b"] {
            let e = check_fact_id(bad).unwrap_err().to_string();
            assert!(e.contains("not a fact id"), "{bad}: {e}");
        }
    }

    #[test]
    fn tags_are_checked() {
        check_tags(&["work".into(), "项目".into(), "a.b-c_d".into(), "rust/async".into()]).unwrap();
        for bad in ["", "a b", "/a", "a//b", "..x/", &"t".repeat(65)] {
            assert!(check_tags(&[bad.to_owned()]).is_err(), "{bad:?}");
        }
        assert!(check_tags(&vec!["t".to_owned(); 33]).is_err());
    }

    #[test]
    fn a_fact_round_trips_through_its_file() {
        let id = Ulid::from_parts(1_796_031_096_123, 7);
        let text = render(
            &id,
            1_796_031_096_123,
            "The deploy key is in \"vault\": rotate monthly.\n",
            &["ops".into(), "密钥".into()],
            "mcp:claude-code",
        );
        assert!(text.starts_with(&format!("---\nid: {id}\ncreated: 2026-11-30T09:31:36.123Z\n")), "{text}");
        let path = PathBuf::from(format!("/m/{id}.md"));
        let f = parse_fact(&path, &text, 5);
        assert_eq!(f.id, id.to_string());
        assert_eq!(f.text, "The deploy key is in \"vault\": rotate monthly.");
        assert_eq!(f.tags, ["ops", "密钥"]);
        assert_eq!(f.source, "mcp:claude-code");
        assert_eq!(f.created_ms, 1_796_031_096_123);
        assert_eq!(f.warning, "");
        // A hand-written note: its name is its id, its mtime its date.
        let note = parse_fact(Path::new("/m/groceries.md"), "# Groceries\n\nmilk\n", 42);
        assert_eq!((note.id.as_str(), note.created_ms, note.warning.as_str()), ("groceries", 42, ""));
        assert_eq!(note.text, "# Groceries\n\nmilk");
    }

    #[test]
    fn a_malformed_front_matter_is_a_warning_not_an_error() {
        let id = Ulid::from_parts(1_796_031_096_123, 7);
        let f = parse_fact(
            &PathBuf::from(format!("/m/{id}.md")),
            "---\nid: x\ntags: [unclosed\nsource: \"cli\n---\nThe body survives.\n",
            0,
        );
        assert_eq!(f.id, id.to_string());
        assert_eq!(f.text, "The body survives.");
        assert!(f.tags.is_empty() && f.source.is_empty());
        assert!(
            f.warning.contains("invalid YAML front matter") && f.warning.contains(&format!("{id}.md")),
            "{}",
            f.warning
        );
    }

    #[test]
    fn note_names_are_fact_ids_but_never_paths() {
        let id = Ulid::from_parts(1_700_000_000_000, 42);
        assert_eq!(check_fact_id(&id.to_string().to_lowercase()).unwrap(), id.to_string(), "ULIDs in upper case");
        for ok in ["groceries", "my note", "笔记", "2024-01-01 standup", "01ARZ3NDEKTSV4RRFFQ69G5FA"] {
            assert_eq!(check_fact_id(ok).unwrap(), ok);
        }
        for bad in ["", ".hidden", "..", "../x", "a/b", "a\\b", "a\nb", &"n".repeat(201)] {
            let e = check_fact_id(bad).unwrap_err().to_string();
            assert!(e.contains("not a fact id"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn secrets_are_recognized_by_pattern_and_never_echoed() {
        for (text, why) in [
            ("my github token is ghp_16C7e42F292c6912E7710c838347Ae178B4a", "api token"),
            ("use sk-proj-abcdefghij1234567890 for the embeddings", "api token"),
            ("AWS key AKIAIOSFODNN7EXAMPLE for the bucket", "api token"),
            ("the db password=hunter2!x", "password"),
            ("Password: Tr0ub4dor&3 for the router", "password"),
            ("curl -H 'Authorization: Bearer abc123def456ghi789'", "authorization"),
            ("api_key: 9f8e7d6c5b4a39281706", "api_key"),
            // Credentials named in prose.
            ("The staging DB password is hunter2-Xy9!kQ", "password"),
            ("the wifi password for the office is Sommer2024!", "password"),
            ("Our VPN passphrase: Tr0ub4dor&3x", "passphrase"),
            ("The router's admin pwd was admin123", "pwd"),
            ("The PIN is 4821.", "pin"),
            ("bank card pin = 739105", "pin"),
            ("the staging api key is 9f8e7d6c5b4a", "key"),
            ("The shared secret is s3cr3t-Value", "secret"),
            ("the password is 12345678", "password"),
            ("the wi-fi key is Pa55word", "key"),
        ] {
            let got = secret_in(text).unwrap_or_else(|| panic!("{text:?} is a secret"));
            assert!(got.to_lowercase().contains(why), "{text:?}: {got}");
            for w in text.split_whitespace().filter(|w| w.len() > 10) {
                assert!(!got.contains(w), "the reason must not echo the value: {got}");
            }
        }
        for fine in [
            "The deploy key is in \"vault\": rotate monthly.",
            "the password policy: twelve characters minimum",
            "token bucket rate limiting at 100 req/s",
            "see https://example.com/docs/auth/token-endpoint",
            "我的密码规则是每月更换",
            "ERR-4711 means the disk is full",
            "the key: value store is fast",
            // Prose about credentials, not credentials.
            "the password policy is strict",
            "The password is stored in 1Password under Staging.",
            "the secret is to knead the dough longer",
            "the api key is in the team vault",
            "The PIN is required at every login",
            "the password was changed on Monday",
            "the password is at least 12 characters",
            "The key point is that backups run at 02:00",
            "the token is refreshed every 3600 seconds",
            "The password for staging is the same as production.",
            "the PIN is 12",
            "my password manager is Bitwarden",
            "the passphrase is four random words",
            "The password policy is strict: twelve characters minimum",
            "Is the secret sauce ready? The secret is: patience.",
        ] {
            assert_eq!(secret_in(fine), None, "{fine:?}");
        }
    }

    #[test]
    fn duplicates_are_measured_on_normalized_tokens() {
        assert_eq!(normalize("  The  Sky\nis BLUE "), "the sky is blue");
        let a = tokens("the deploy key rotates every month on the first monday");
        let b = tokens("The deploy key rotates every month on the first Monday!");
        assert!((jaccard(&a, &b) - 1.0).abs() < 1e-9);
        let c = tokens("the deploy key rotates every week");
        assert!(jaccard(&a, &c) < NEAR_DUPLICATE);
        assert!(jaccard(&tokens("我喜欢喝咖啡"), &tokens("我喜欢喝茶")) < NEAR_DUPLICATE);
    }

    /// Memory over a temporary home whose store is nowhere (listing and reading facts never
    /// call it).
    fn offline_memory(home: &Path) -> Memory {
        let token = secrecy::SecretString::from("t".to_owned());
        let index = coffer_proto::store::index_client::IndexClient::new(
            coffer_runtime::grpc::channel("127.0.0.1:9", &token).unwrap(),
        );
        let sources = Arc::new(Sources::new(coffer_runtime::home::CofferHome::at(home.to_path_buf()), index));
        let (_tx, rx) = tokio::sync::watch::channel(Arc::new(crate::config::Config::default()));
        let indexer = Indexer::new(sources.clone(), rx, tokio_util::sync::CancellationToken::new());
        Memory::new(sources, indexer)
    }

    #[tokio::test]
    async fn facts_list_newest_first_by_page_and_tag() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("memory");
        std::fs::create_dir_all(&dir).unwrap();
        let mut ids = Vec::new();
        for i in 0..7u64 {
            let id = Ulid::from_parts(1_700_000_000_000 + i, u128::from(i));
            let tags: Vec<String> = if i % 2 == 0 { vec!["even".into()] } else { vec![] };
            write_atomic(&dir, &format!("{id}.md"), render(&id, 0, &format!("fact {i}"), &tags, "t").as_bytes())
                .unwrap();
            ids.push(id.to_string());
        }
        // Not facts: a temp file, a folder.
        std::fs::write(dir.join(".x.md.tmp-00"), "half").unwrap();
        std::fs::create_dir(dir.join("sub")).unwrap();
        let m = offline_memory(tmp.path());
        let page = m.list(3, "", &[]).unwrap();
        let newest: Vec<&str> = ids.iter().rev().take(3).map(String::as_str).collect();
        assert_eq!(page.facts.iter().map(|f| f.id.as_str()).collect::<Vec<_>>(), newest);
        assert_eq!(page.next_cursor, newest[2]);
        let rest = m.list(10, &page.next_cursor, &[]).unwrap();
        assert_eq!(rest.facts.len(), 4);
        assert_eq!(rest.next_cursor, "", "the last page has no cursor");
        let even = m.list(0, "", &["even".into()]).unwrap();
        assert_eq!(even.facts.len(), 4);
        assert!(even.facts.iter().all(|f| f.tags == ["even"]));
        assert_eq!(m.get(&ids[3]).unwrap().text, "fact 3");
        assert!(matches!(m.get(&Ulid::from_parts(1, 1).to_string()), Err(Error::NotFound(_))));
        assert!(matches!(m.list(501, "", &[]), Err(Error::Invalid(_))));
        assert!(matches!(m.list(1, "../x", &[]), Err(Error::Invalid(_))));
        // A hand-written note is listed and read by its name; a broken one with a warning.
        std::fs::write(dir.join("notes.md"), "hello").unwrap();
        std::fs::write(dir.join(format!("{}.md", ids[0])), "---\ntags: [\n---\nbroken but readable\n").unwrap();
        let all = m.list(0, "", &[]).unwrap();
        assert_eq!(all.facts.len(), 8);
        assert_eq!(all.facts[0].id, "notes", "names sort after upper-case ULIDs, newest first");
        assert_eq!(m.get("notes").unwrap().text, "hello");
        let broken = m.get(&ids[0]).unwrap();
        assert_eq!(broken.text, "broken but readable");
        assert!(!broken.warning.is_empty());
        assert_eq!(m.get(&ids[1].to_lowercase()).unwrap().id, ids[1], "a lower-case id finds the fact");
        // Not text at all: a clear refusal naming the file, not an internal error.
        std::fs::write(dir.join("latin1.md"), b"caf\xe9\n").unwrap();
        assert!(
            matches!(m.get("latin1"), Err(Error::Precondition(e)) if e.contains("latin1.md") && e.contains("not UTF-8"))
        );
        assert!(matches!(m.get("absent-note"), Err(Error::NotFound(_))));
    }

    #[test]
    fn atomic_writes_leave_no_temp_file_and_a_crash_leaves_no_half_file() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let p = write_atomic(dir, "a.md", b"whole").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"whole");
        let names: Vec<String> =
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        assert_eq!(names, ["a.md"], "no temp file left");
        // Overwriting is all or nothing too.
        write_atomic(dir, "a.md", b"second").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"second");
        // A crash between write and rename: the temp file exists, the fact does not; it is not
        // a fact, the walker's *.md never matches it, and the sweep at start removes it.
        std::fs::write(dir.join(".b.md.tmp-0011223344556677"), b"half").unwrap();
        assert!(!dir.join("b.md").exists());
        assert!(!".b.md.tmp-0011223344556677".ends_with(".md"));
        assert_eq!(sweep_temp_files(dir), 1);
        let names: Vec<String> =
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        assert_eq!(names, ["a.md"]);
        // A failing write (the folder is gone) leaves nothing behind and says where.
        let e = write_atomic(&dir.join("absent"), "c.md", b"x").unwrap_err().to_string();
        assert!(e.contains("absent"), "{e}");
    }
}
