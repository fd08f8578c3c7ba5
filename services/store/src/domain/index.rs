//! The `Index` service (`proto/store_index.proto`): the derived retrieval indexes of
//! `coffer-retrieval`, its only writer — knowledge bases' definitions (`kb_knowledge_bases`),
//! documents (`kb_documents`, `kb_document_tags`), chunks (`kb_chunks`), the FTS5 keyword index
//! (`kb_fts`, rowid = chunk id, an external-content table over the view `kb_fts_source`: the text
//! is stored once, in `kb_chunks`/`kb_documents`, with the normalized form beside the raw only
//! where they tokenize differently, see [`IndexText`]) and the sqlite-vec vector index (`kb_vectors`, a
//! `vec0` table created by `ConfigureVectors`, `chunk_id` = chunk id, each vector stored as
//! 8-bit integers at unit scale ([`stored_i8`]: a quarter of the float bytes on disk); its model
//! and dimension in `kb_vector_config`).
//!
//! Every write is one transaction on the store's writer thread; queries run on the reader pool,
//! the searches' (`KeywordQuery`, `VectorQuery`, `LocateLines`) on the RPC's own thread
//! ([`Db::read_now`]: no hand-over to the blocking pool and back while a search waits).
//! `VectorQuery` scans [`Vectors`], an in-memory copy of `kb_vectors` that those writes keep in
//! step (exact cosine, several times faster than sqlite-vec 0.1.9's scalar KNN); when the
//! vectors exceed its cap it uses sqlite-vec's KNN instead.
//! Index writes produce no change rows (they are derived data, written at file-scan rates) and
//! no audit rows (the user's actions are audited where they are taken).
//!
//! Determinism: a clean rebuild gives new chunk ids, so every ranked answer breaks score ties by
//! (KB, document path, ordinal), never by id.
//!
//! How the pieces answer (measured effects in `docs/BENCHMARKS.md`, "Retrieval"):
//! - **Writes.** `kb_chunks` ids are `AUTOINCREMENT`, never reused, so a vector computed for a
//!   chunk deleted since can never land on another. `UpsertDocument` replaces a document's chunks
//!   in one transaction: a chunk whose (hash, heading path) is already stored keeps its id, vector
//!   and FTS row (rewritten only if its index text changed, e.g. a new title); the others are
//!   inserted, the missing ones deleted with their FTS rows and vectors. FTS5 deletes a row of
//!   the external-content `kb_fts` by reading its text back from `kb_fts_source`, so an FTS row
//!   is always deleted before anything that view reads changes (the chunk, its document's title),
//!   and the bm25 statistics stay those of a fresh index. `ConfigureVectors` creates
//!   `kb_vectors` once the dimension is known; another model or dimension drops and recreates it
//!   (never mixed vectors).
//! - **Keyword.** `KeywordQuery` builds the MATCH expression itself (each term a quoted string,
//!   `"` doubled, joined by AND or OR; terms with no letter or digit dropped), so user text is
//!   never FTS5 syntax; filters (KBs, path prefix by `substr`, every tag, mtime) are SQL. Without
//!   filters, or with a filter by KBs alone (what every search has), the ranking runs on `kb_fts`
//!   alone, rows of other KBs are skipped as they come, and the top rows are kept in a bounded heap
//!   as FTS5 scores them (`fts_rank::best_rows`) rather than by `ORDER BY … LIMIT`, whose sorter
//!   cost an index b-tree insert per matching row; `one_per_document` keeps each document's best
//!   chunk, so a keyword-only search reads just `limit` documents. An any-term query leaves out a
//!   term found in `COMMON_TERM_CHUNKS` chunks or more when a rarer term is in it (its idf adds
//!   little, and scoring every row that holds it dominated the query).
//! - **Vector.** `VectorQuery` scans the in-memory copy (loaded on first use, at most
//!   `VECTOR_CACHE_MAX_BYTES`; beyond that sqlite-vec's KNN with over-fetch and an exact filtered
//!   fallback) in two stages: every allowed row scored on its stored 8-bit vector (a quarter
//!   of the bytes to stream), then the best `rescore_candidates` (4 × limit + 64) rescored
//!   in f32 against the vectors those integers stand for (the stored vectors, not the floats the
//!   embedder sent, which are not kept); the answer is their exact order (a test checks it equals the exact scan's on random
//!   vectors). The 8-bit loop (`dot_rows_i8`) takes its AVX2 build when the CPU has it and splits
//!   large scans over two threads; its dot products are exact integers on every path (a test
//!   compares them). A filter by KBs alone leaves out the other KBs' chunks, found from the KB
//!   table through the `(kb, path)` index.
//! - **Reads.** The pool's read-only connections map `coffer.db` (`mmap_size`, [`crate::db`])
//!   instead of copying each page into a per-connection cache. bm25's term counts come from a
//!   cache forgotten at each write of `kb_fts`, warmed once writes have stopped for a while
//!   (`DocFreq::warm`, `fill_row_sizes`), so the first questions after an index pass do not count
//!   words or look up lengths row by row. `services/store/examples/index_bench.rs` times indexing
//!   and queries at the store level.
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, RwLock};

use coffer_proto::store::index_server::Index;
use coffer_proto::store::*;
use rusqlite::{Connection, OptionalExtension, Row, params};
use sha2::{Digest, Sha256};
use tonic::{Request, Response, Status};

use super::truncate;
use crate::db::{Db, StoreError};
use crate::fts_rank::DocFreq;

/// Most terms a keyword query takes.
pub const MAX_TERMS: usize = 64;
/// Longest keyword term (bytes).
pub const MAX_TERM_BYTES: usize = 128;
/// Largest `limit` of a query (and of `PendingEmbeddings`).
pub const MAX_LIMIT: u32 = 1000;
/// Longest document path or path prefix (bytes).
pub const MAX_PATH_BYTES: usize = 4096;
/// Most lines one `LocateLines` call asks about.
pub const MAX_LINES: usize = 10_000;
/// Most ids one `GetChunks` call asks about.
pub const MAX_IDS: usize = 1000;
/// Most tags of a document or of a filter; longest tag (bytes).
const MAX_TAGS: usize = 256;
const MAX_TAG_BYTES: usize = 256;
/// Most `[[wikilinks]]` stored of one document; longest target, fragment or alias (bytes).
pub const MAX_LINKS: usize = 4096;
const MAX_LINK_TEXT_BYTES: usize = 1024;
/// Default and largest number of backlinks `NoteLinks` returns.
const DEFAULT_BACKLINKS: u32 = 200;
/// Largest vector dimension (sqlite-vec's `vec0` limit).
pub const MAX_DIMENSION: u32 = 8192;
/// Largest `k` of a sqlite-vec KNN query.
const VEC_K_MAX: u32 = 4096;
/// Largest request the Index service decodes (bytes): a document's chunks with their text and
/// their normalized index text, for files up to `retrieval.max_file_bytes` (16 MiB default).
pub const MAX_DECODING_MESSAGE_SIZE: usize = coffer_proto::store::INDEX_MAX_MESSAGE_BYTES;

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// Validates a knowledge base name: `^[a-z0-9][a-z0-9_-]{0,63}$`.
///
/// # Errors
/// [`StoreError::Invalid`] naming `field` and the rule.
pub fn validate_kb_name(field: &str, name: &str) -> Result<(), StoreError> {
    let ok_chars = name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
    let ok_first = name.bytes().next().is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if name.is_empty() || name.len() > 64 || !ok_chars || !ok_first {
        return Err(StoreError::Invalid(format!(
            "{field}: invalid knowledge base name {:?}: use 1-64 characters a-z, 0-9, '-' and '_', starting with a \
             letter or digit",
            truncate(name, 70)
        )));
    }
    Ok(())
}

/// Validates a document path: relative to the KB root, `/`-separated, not empty, no leading
/// `/`, no `..` segment, no NUL, at most [`MAX_PATH_BYTES`].
///
/// # Errors
/// [`StoreError::Invalid`] naming `field` and the rule.
pub fn validate_path(field: &str, path: &str) -> Result<(), StoreError> {
    let why = if path.is_empty() {
        "is empty"
    } else if path.len() > MAX_PATH_BYTES {
        "is longer than 4096 bytes"
    } else if path.starts_with('/') {
        "must be relative to the knowledge base root (no leading '/')"
    } else if path.contains('\0') {
        "contains a NUL byte"
    } else if path.split('/').any(|s| s == "..") {
        "must not contain a '..' segment"
    } else {
        return Ok(());
    };
    Err(StoreError::Invalid(format!("{field} {:?} {why}", truncate(path, 80))))
}

/// `limit` if it is in `1..=MAX_LIMIT`, else [`StoreError::Invalid`] naming `field`.
fn validate_limit(field: &str, limit: u32) -> Result<u32, StoreError> {
    if limit == 0 || limit > MAX_LIMIT {
        return Err(StoreError::Invalid(format!("{field} must be 1-{MAX_LIMIT}, not {limit}")));
    }
    Ok(limit)
}

/// Validates a list of short strings (tags, globs): at most `max` entries, each non-empty, at
/// most `max_bytes`, without NUL.
fn validate_strings(field: &str, items: &[String], max: usize, max_bytes: usize) -> Result<(), StoreError> {
    if items.len() > max {
        return Err(StoreError::Invalid(format!("{field} has {} entries; at most {max}", items.len())));
    }
    for (i, s) in items.iter().enumerate() {
        if s.is_empty() || s.len() > max_bytes || s.contains('\0') {
            return Err(StoreError::Invalid(format!(
                "{field}[{i}] {:?} must be 1-{max_bytes} bytes without NUL",
                truncate(s, 40)
            )));
        }
    }
    Ok(())
}

/// Tags sorted and without duplicates.
fn normalized_tags(tags: &[String]) -> Vec<String> {
    let mut t = tags.to_vec();
    t.sort();
    t.dedup();
    t
}

fn kind_str(kind: KnowledgeBaseKind) -> &'static str {
    match kind {
        KnowledgeBaseKind::Memory => "memory",
        _ => "folder",
    }
}

fn validate_kb(kb: &KnowledgeBase) -> Result<KnowledgeBaseKind, StoreError> {
    validate_kb_name("name", &kb.name)?;
    let kind = super::required::<KnowledgeBaseKind>(kb.kind, "kind")?;
    if !kb.root.starts_with('/') || kb.root.contains('\0') || kb.root.len() > MAX_PATH_BYTES {
        return Err(StoreError::Invalid(format!("root {:?} must be an absolute path", truncate(&kb.root, 80))));
    }
    validate_strings("include", &kb.include, 256, 1024)?;
    validate_strings("exclude", &kb.exclude, 256, 1024)?;
    Ok(kind)
}

fn kb_from_row(r: &Row<'_>) -> rusqlite::Result<KnowledgeBase> {
    let kind = match r.get::<_, String>(1)?.as_str() {
        "memory" => KnowledgeBaseKind::Memory,
        _ => KnowledgeBaseKind::Folder,
    };
    Ok(KnowledgeBase {
        name: r.get(0)?,
        kind: kind.into(),
        root: r.get(2)?,
        include: serde_json::from_str(&r.get::<_, String>(3)?).unwrap_or_default(),
        exclude: serde_json::from_str(&r.get::<_, String>(4)?).unwrap_or_default(),
        created_ms: r.get(5)?,
        writable: r.get(6)?,
    })
}

const KB_COLS: &str = "name, kind, root, include_json, exclude_json, created_ms, writable";

fn get_kb(c: &Connection, name: &str) -> Result<Option<KnowledgeBase>, StoreError> {
    let mut st = c.prepare_cached(&format!("SELECT {KB_COLS} FROM kb_knowledge_bases WHERE name = ?1"))?;
    Ok(st.query_row([name], kb_from_row).optional()?)
}

/// [`StoreError::NotFound`] unless the KB `name` is defined.
/// [`require_kb`], and when `created_ms` is not 0, that KB `name` is still the one created then
/// (not removed and added again under the same name since the writer read it).
fn require_same_kb(c: &Connection, name: &str, created_ms: i64) -> Result<(), StoreError> {
    require_kb(c, name)?;
    if created_ms == 0 {
        return Ok(());
    }
    let mut st = c.prepare_cached("SELECT created_ms FROM kb_knowledge_bases WHERE name = ?1")?;
    let now: i64 = st.query_row([name], |r| r.get(0))?;
    if now != created_ms {
        return Err(StoreError::Precondition(format!(
            "knowledge base {name:?} was removed and added again since this write was prepared"
        )));
    }
    Ok(())
}

/// The name of the KB whose root is `root`, if there is one.
fn kb_at_root(c: &Connection, root: &str) -> Result<Option<String>, StoreError> {
    let mut st = c.prepare_cached("SELECT name FROM kb_knowledge_bases WHERE root = ?1 ORDER BY name LIMIT 1")?;
    Ok(st.query_row([root], |r| r.get(0)).optional()?)
}

fn require_kb(c: &Connection, name: &str) -> Result<(), StoreError> {
    let mut st = c.prepare_cached("SELECT 1 FROM kb_knowledge_bases WHERE name = ?1")?;
    if st.query_row([name], |_| Ok(())).optional()?.is_none() {
        return Err(StoreError::NotFound(format!("knowledge base {name:?}")));
    }
    Ok(())
}

/// The configured vector model and dimension, when `ConfigureVectors` ran.
fn vector_config(c: &Connection) -> Result<Option<(String, u32)>, StoreError> {
    let mut st = c.prepare_cached("SELECT model, dimension FROM kb_vector_config WHERE id = 1")?;
    Ok(st.query_row([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, u32>(1)?))).optional()?)
}

/// Removes the FTS row and the vector of each chunk in `ids` (the caller deletes the chunk rows,
/// usually by deleting their documents, and only after this: FTS5 reads a row's text back from
/// `kb_fts_source` to delete it).
fn forget_chunks(t: &Connection, vc: &Vectors, ids: &[i64], vectors: bool) -> Result<(), StoreError> {
    let mut fts = t.prepare_cached("DELETE FROM kb_fts WHERE rowid = ?1")?;
    for id in ids {
        fts.execute([id])?;
    }
    if vectors {
        let mut vec = t.prepare_cached("DELETE FROM kb_vectors WHERE chunk_id = ?1")?;
        for id in ids {
            vec.execute([id])?;
        }
        vc.remove(ids);
    }
    Ok(())
}

/// Deletes documents (with their chunks, FTS rows, vectors and tags): every document of `kb`, or
/// of every KB when `kb` is `None`, or only `path` of `kb`. Returns how many documents.
fn purge_documents(t: &Connection, vc: &Vectors, kb: Option<&str>, path: Option<&str>) -> Result<u64, StoreError> {
    let vectors = vector_config(t)?.is_some();
    match (kb, path) {
        (None, _) => {
            // Everything: one statement per table (FTS5's `delete-all` empties an
            // external-content table without reading its rows back).
            t.execute("INSERT INTO kb_fts (kb_fts) VALUES ('delete-all')", [])?;
            if vectors {
                t.execute("DELETE FROM kb_vectors", [])?;
                vc.clear();
            }
            Ok(t.execute("DELETE FROM kb_documents", [])? as u64)
        }
        (Some(kb), path) => {
            let path = path.unwrap_or("");
            let ids: Vec<i64> = {
                let mut st = t.prepare_cached(
                    "SELECT c.id FROM kb_documents d JOIN kb_chunks c ON c.document = d.id
                     WHERE d.kb = ?1 AND (?2 = '' OR d.path = ?2)",
                )?;
                let rows = st.query_map(params![kb, path], |r| r.get(0))?;
                rows.collect::<Result<_, _>>()?
            };
            forget_chunks(t, vc, &ids, vectors)?;
            let mut st = t.prepare_cached("DELETE FROM kb_documents WHERE kb = ?1 AND (?2 = '' OR path = ?2)")?;
            Ok(st.execute(params![kb, path])? as u64)
        }
    }
}

/// Hash of what the FTS row of a chunk holds.
fn index_hash(c: &ChunkInput) -> String {
    let mut h = Sha256::new();
    for part in [&c.index_title, &c.index_headings, &c.index_body] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    hex::encode(h.finalize())
}

fn validate_upsert(r: &UpsertDocumentRequest) -> Result<(), StoreError> {
    validate_kb_name("kb", &r.kb)?;
    validate_path("path", &r.path)?;
    validate_strings("tags", &r.tags, MAX_TAGS, MAX_TAG_BYTES)?;
    validate_strings("aliases", &r.aliases, MAX_TAGS, MAX_TAG_BYTES)?;
    if r.links.len() > MAX_LINKS {
        return Err(StoreError::Invalid(format!("links: {} links; at most {MAX_LINKS}", r.links.len())));
    }
    for (i, l) in r.links.iter().enumerate() {
        for (field, v) in [("target", &l.target), ("fragment", &l.fragment), ("alias", &l.alias)] {
            if v.len() > MAX_LINK_TEXT_BYTES {
                return Err(StoreError::Invalid(format!(
                    "links[{i}].{field} is longer than {MAX_LINK_TEXT_BYTES} bytes"
                )));
            }
        }
    }
    for (i, c) in r.chunks.iter().enumerate() {
        if c.hash.is_empty() {
            return Err(StoreError::Invalid(format!("chunks[{i}].hash is required")));
        }
        if c.line_start == 0 || c.line_end < c.line_start {
            return Err(StoreError::Invalid(format!(
                "chunks[{i}]: line_start {} and line_end {} must satisfy 1 <= line_start <= line_end",
                c.line_start, c.line_end
            )));
        }
    }
    Ok(())
}

/// An existing chunk of the document being replaced.
struct Existing {
    id: i64,
    ordinal: i64,
    line_start: i64,
    line_end: i64,
    index_hash: String,
}

/// Writes the document row of `r` (insert or update, error cleared) and its tags; returns its id.
/// `index_title`: the normalized title its chunks' FTS rows read when it is not the title
/// ([`IndexText::stored`]).
fn write_document(
    t: &Connection,
    r: &UpsertDocumentRequest,
    tags: &[String],
    index_title: Option<&str>,
    now: i64,
) -> Result<i64, StoreError> {
    let mut st = t.prepare_cached(
        "INSERT INTO kb_documents (kb, path, mtime_ms, size, hash, title, tags_json, error, indexed_ms, chunk_count, index_title)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, '', ?8, ?9, ?10)
         ON CONFLICT (kb, path) DO UPDATE SET mtime_ms = excluded.mtime_ms, size = excluded.size,
           hash = excluded.hash, title = excluded.title, tags_json = excluded.tags_json, error = '',
           indexed_ms = excluded.indexed_ms, chunk_count = excluded.chunk_count, index_title = excluded.index_title
         RETURNING id",
    )?;
    let id: i64 = st.query_row(
        params![
            r.kb,
            r.path,
            r.mtime_ms,
            r.size as i64,
            r.hash,
            r.title,
            serde_json::to_string(tags).expect("json"),
            now,
            r.chunks.len() as i64,
            index_title
        ],
        |row| row.get(0),
    )?;
    t.prepare_cached("DELETE FROM kb_document_tags WHERE document = ?1")?.execute([id])?;
    let mut ins = t.prepare_cached("INSERT INTO kb_document_tags (document, tag) VALUES (?1, ?2)")?;
    for tag in tags {
        ins.execute(params![id, tag])?;
    }
    Ok(id)
}

/// The lower-cased key a `[[wikilink]]` target, a file name, an alias or a path resolves by:
/// `\` as `/`, without leading `./` or `/`, without a trailing `.md` or `.markdown`.
pub fn link_key(target: &str) -> String {
    let t = target.trim().replace('\\', "/").to_lowercase();
    let t = t.trim_start_matches("./").trim_start_matches('/');
    let t = t.strip_suffix(".md").or_else(|| t.strip_suffix(".markdown")).unwrap_or(t);
    t.to_owned()
}

/// Replaces document `doc`'s links and names (file name, aliases, path) with those of `r`.
fn write_links(t: &Connection, doc: i64, r: &UpsertDocumentRequest) -> Result<(), StoreError> {
    t.prepare_cached("DELETE FROM kb_links WHERE document = ?1")?.execute([doc])?;
    t.prepare_cached("DELETE FROM kb_note_names WHERE document = ?1")?.execute([doc])?;
    let mut ins = t.prepare_cached(
        "INSERT INTO kb_links (document, ordinal, target, target_key, fragment, alias, embed, line)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )?;
    for (i, l) in r.links.iter().enumerate() {
        ins.execute(params![doc, i as i64, l.target, link_key(&l.target), l.fragment, l.alias, l.embed, l.line])?;
    }
    let mut name = t.prepare_cached("INSERT OR IGNORE INTO kb_note_names (document, kind, key) VALUES (?1, ?2, ?3)")?;
    let path_key = link_key(&r.path);
    let stem = path_key.rsplit('/').next().unwrap_or(&path_key).to_owned();
    name.execute(params![doc, 0, stem])?;
    for a in &r.aliases {
        let a = link_key(a);
        if !a.is_empty() {
            name.execute(params![doc, 1, a])?;
        }
    }
    name.execute(params![doc, 2, path_key])?;
    Ok(())
}

/// The path of the note of KB `kb` that a link with `key` ([`link_key`]) resolves to: by file
/// name, else alias, else path; several of a kind: the shortest path, then the first.
fn resolve_link(c: &Connection, kb: &str, key: &str) -> Result<Option<String>, StoreError> {
    if key.is_empty() {
        return Ok(None);
    }
    let mut st = c.prepare_cached(
        "SELECT d.path FROM kb_note_names n JOIN kb_documents d ON d.id = n.document
         WHERE n.key = ?2 AND d.kb = ?1 AND d.error = ''
         ORDER BY n.kind, length(d.path), d.path LIMIT 1",
    )?;
    Ok(st.query_row(params![kb, key], |r| r.get(0)).optional()?)
}

/// `NoteLinks` (see the proto).
fn note_links(c: &Connection, kb: &str, path: &str, limit: u32) -> Result<NoteLinksReply, StoreError> {
    require_kb(c, kb)?;
    let doc: i64 = c
        .prepare_cached("SELECT id FROM kb_documents WHERE kb = ?1 AND path = ?2")?
        .query_row(params![kb, path], |r| r.get(0))
        .optional()?
        .ok_or_else(|| StoreError::NotFound(format!("document {path:?} in knowledge base {kb:?}")))?;
    let mut cache: HashMap<String, Option<String>> = HashMap::new();
    let mut resolve = |c: &Connection, key: &str| -> Result<Option<String>, StoreError> {
        if let Some(hit) = cache.get(key) {
            return Ok(hit.clone());
        }
        let hit = resolve_link(c, kb, key)?;
        cache.insert(key.to_owned(), hit.clone());
        Ok(hit)
    };
    let mut links = Vec::new();
    {
        let mut st = c.prepare_cached(
            "SELECT target, target_key, fragment, alias, embed, line FROM kb_links WHERE document = ?1 ORDER BY ordinal",
        )?;
        let rows = st.query_map([doc], |r| {
            Ok((
                NoteLink {
                    target: r.get(0)?,
                    fragment: r.get(2)?,
                    alias: r.get(3)?,
                    embed: r.get(4)?,
                    line: r.get(5)?,
                },
                r.get::<_, String>(1)?,
            ))
        })?;
        for row in rows {
            let (link, key) = row?;
            let resolved_path = resolve(c, &key)?.unwrap_or_default();
            links.push(ResolvedLink { link: Some(link), resolved_path });
        }
    }
    // Backlinks: links whose key is one of this note's names and that resolve to it (another
    // note may own that name first).
    // One per distinct link: the same link written twice on a line is one backlink.
    let mut backlinks: Vec<Backlink> = Vec::new();
    let mut truncated = false;
    let mut st = c.prepare_cached(
        "SELECT d.path, d.title, l.line, l.alias, l.embed, l.target_key, l.fragment
         FROM kb_links l JOIN kb_documents d ON d.id = l.document
         WHERE d.kb = ?1 AND d.id <> ?2 AND l.target_key IN (SELECT key FROM kb_note_names WHERE document = ?2)
         ORDER BY d.path, l.line, l.ordinal",
    )?;
    let mut rows = st.query(params![kb, doc])?;
    while let Some(r) = rows.next()? {
        let key: String = r.get(5)?;
        if resolve(c, &key)?.as_deref() != Some(path) {
            continue;
        }
        let b = Backlink {
            path: r.get(0)?,
            title: r.get(1)?,
            line: r.get(2)?,
            alias: r.get(3)?,
            embed: r.get(4)?,
            fragment: r.get(6)?,
        };
        // Rows come by path and line: a duplicate is among the last few.
        if backlinks.iter().rev().take_while(|o| o.path == b.path && o.line == b.line).any(|o| *o == b) {
            continue;
        }
        if backlinks.len() >= limit as usize {
            truncated = true;
            break;
        }
        backlinks.push(b);
    }
    Ok(NoteLinksReply { links, backlinks, backlinks_truncated: truncated })
}

/// Decides which normalized index text must be stored beside the raw text it was made of.
///
/// `kb_fts` is an external-content table over the view `kb_fts_source` (migration 0021): FTS5
/// keeps no copy of what it indexed, and reads a row's text back from the view to delete it, so
/// the view must give back text that FTS5's tokenizer makes the very tokens of. The view reads
/// `coalesce(index_x, x)`: the normalized text (`index_title`, `index_headings`, `index_body`)
/// is stored only when its tokens are not those of the raw text (CJK bigrams, a heading path's
/// JSON escapes), so most chunks store their text once.
struct IndexText<'c> {
    tokenizer: Option<crate::fts_rank::Tokenizer<'c>>,
}

impl<'c> IndexText<'c> {
    fn new(c: &'c Connection) -> Result<Self, StoreError> {
        let tokenizer = match crate::fts_rank::table_tokenizer(c)? {
            Some(spec) => crate::fts_rank::Tokenizer::new(c, &spec)?,
            None => None,
        };
        Ok(Self { tokenizer })
    }

    /// `normalized` when FTS5 would index it otherwise than `raw` (what the view gives back in
    /// its place), else `None`. Without the tokenizer: always `normalized`.
    fn stored<'a>(&self, normalized: &'a str, raw: &str) -> Result<Option<&'a str>, StoreError> {
        if normalized == raw {
            return Ok(None);
        }
        let Some(tk) = &self.tokenizer else { return Ok(Some(normalized)) };
        let same = tk.token_bytes(normalized)? == tk.token_bytes(raw)?;
        Ok((!same).then_some(normalized))
    }
}

/// What a chunk stores of its index text besides its raw text ([`IndexText`]).
struct ChunkIndexText<'a> {
    title: Option<&'a str>,
    headings: Option<&'a str>,
    body: Option<&'a str>,
}

impl<'a> ChunkIndexText<'a> {
    /// `doc_title`: what the view gives for the chunk without a title of its own (the
    /// document's stored index title, else its title); `headings`: the stored heading path.
    fn of(x: &IndexText<'_>, c: &'a ChunkInput, doc_title: &str, headings: &str) -> Result<Self, StoreError> {
        Ok(Self {
            title: x.stored(&c.index_title, doc_title)?,
            headings: x.stored(&c.index_headings, headings)?,
            body: x.stored(&c.index_body, &c.text)?,
        })
    }
}

/// One chunk of an `UpsertDocument` request: its heading path (JSON), its index hash, and the
/// existing chunk it keeps with whether that one's FTS row is rewritten.
struct Planned {
    headings: String,
    index_hash: String,
    kept: Option<(Existing, bool)>,
}

/// `UpsertDocument` inside the writer's transaction (see the proto).
///
/// Order matters with the external-content `kb_fts`: the FTS rows of chunks that go or whose
/// index text changes are deleted first, while `kb_fts_source` still gives back what they
/// indexed; then the document row (its title), the chunks, and the new FTS rows.
fn upsert_document(t: &Connection, vc: &Vectors, r: &UpsertDocumentRequest) -> Result<UpsertDocumentReply, StoreError> {
    require_same_kb(t, &r.kb, r.kb_created_ms)?;
    let tags = normalized_tags(&r.tags);
    let vectors = vector_config(t)?.is_some();
    let x = IndexText::new(t)?;
    // The document's index title: its first chunk's, stored when it is not the title.
    let doc_index_title = match r.chunks.first() {
        Some(c) => x.stored(&c.index_title, &r.title)?,
        None => None,
    };
    let doc_title = doc_index_title.unwrap_or(&r.title);
    let old: Option<(i64, String)> = t
        .prepare_cached("SELECT id, coalesce(index_title, title) FROM kb_documents WHERE kb = ?1 AND path = ?2")?
        .query_row(params![r.kb, r.path], |row| Ok((row.get(0)?, row.get(1)?)))
        .optional()?;
    // Another title for the chunks without their own: every kept chunk's FTS row is rewritten.
    let title_changed = old.as_ref().is_some_and(|(_, t)| t != doc_title);

    // Existing chunks by position key; several equal chunks (boilerplate) are matched in order.
    let mut existing: HashMap<(String, String), VecDeque<Existing>> = HashMap::new();
    if let Some((doc, _)) = &old {
        let mut st = t.prepare_cached(
            "SELECT id, hash, heading_path, ordinal, line_start, line_end, index_hash
             FROM kb_chunks WHERE document = ?1 ORDER BY ordinal, id",
        )?;
        let rows = st.query_map([doc], |row| {
            Ok((
                (row.get::<_, String>(1)?, row.get::<_, String>(2)?),
                Existing {
                    id: row.get(0)?,
                    ordinal: row.get(3)?,
                    line_start: row.get(4)?,
                    line_end: row.get(5)?,
                    index_hash: row.get(6)?,
                },
            ))
        })?;
        for row in rows {
            let (key, e) = row?;
            existing.entry(key).or_default().push_back(e);
        }
    }

    let mut plan: Vec<Planned> = Vec::with_capacity(r.chunks.len());
    for c in &r.chunks {
        let headings = serde_json::to_string(&c.heading_path).expect("json");
        let ih = index_hash(c);
        let kept = existing.get_mut(&(c.hash.clone(), headings.clone())).and_then(VecDeque::pop_front);
        let kept = kept.map(|e| {
            let rewrite = title_changed || e.index_hash != ih;
            (e, rewrite)
        });
        plan.push(Planned { headings, index_hash: ih, kept });
    }
    let gone: Vec<i64> = existing.into_values().flatten().map(|e| e.id).collect();

    // FTS rows first, while the view still reads what they indexed.
    let mut delete_fts = t.prepare_cached("DELETE FROM kb_fts WHERE rowid = ?1")?;
    for p in &plan {
        if let Some((e, true)) = &p.kept {
            delete_fts.execute([e.id])?;
        }
    }
    if !gone.is_empty() {
        forget_chunks(t, vc, &gone, vectors)?;
    }

    let doc = write_document(t, r, &tags, doc_index_title, now_ms())?;
    write_links(t, doc, r)?;

    let mut reply = UpsertDocumentReply::default();
    let mut insert_chunk = t.prepare_cached(
        "INSERT INTO kb_chunks (document, ordinal, heading_path, line_start, line_end, hash, index_hash, text,
           index_title, index_headings, index_body)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
    )?;
    let mut insert_fts =
        t.prepare_cached("INSERT INTO kb_fts (rowid, title, headings, body) VALUES (?1, ?2, ?3, ?4)")?;
    let mut move_chunk =
        t.prepare_cached("UPDATE kb_chunks SET ordinal = ?2, line_start = ?3, line_end = ?4 WHERE id = ?1")?;
    let mut set_index_text = t.prepare_cached(
        "UPDATE kb_chunks SET index_hash = ?2, index_title = ?3, index_headings = ?4, index_body = ?5 WHERE id = ?1",
    )?;
    for (ordinal, (c, Planned { headings, index_hash: ih, kept })) in r.chunks.iter().zip(plan).enumerate() {
        let (ordinal, start, end) = (ordinal as i64, c.line_start as i64, c.line_end as i64);
        match kept {
            Some((e, rewrite)) => {
                if (e.ordinal, e.line_start, e.line_end) != (ordinal, start, end) {
                    move_chunk.execute(params![e.id, ordinal, start, end])?;
                }
                if rewrite {
                    // Same chunk, new index text (the document's title changed): the FTS row
                    // follows, id and vector stay.
                    let own = ChunkIndexText::of(&x, c, doc_title, &headings)?;
                    set_index_text.execute(params![e.id, ih, own.title, own.headings, own.body])?;
                    insert_fts.execute(params![e.id, c.index_title, c.index_headings, c.index_body])?;
                }
                reply.kept += 1;
            }
            None => {
                let own = ChunkIndexText::of(&x, c, doc_title, &headings)?;
                insert_chunk.execute(params![
                    doc,
                    ordinal,
                    headings,
                    start,
                    end,
                    c.hash,
                    ih,
                    c.text,
                    own.title,
                    own.headings,
                    own.body
                ])?;
                let id = t.last_insert_rowid();
                insert_fts.execute(params![id, c.index_title, c.index_headings, c.index_body])?;
                reply.added += 1;
            }
        }
    }
    if !gone.is_empty() {
        let mut del = t.prepare_cached("DELETE FROM kb_chunks WHERE id = ?1")?;
        for id in &gone {
            del.execute([id])?;
        }
    }
    reply.removed = gone.len() as u32;
    Ok(reply)
}

/// `MarkDocumentError` inside the writer's transaction: the document row carries `error` and
/// no chunks.
fn mark_document_error(t: &Connection, vc: &Vectors, r: &MarkDocumentErrorRequest) -> Result<u64, StoreError> {
    require_same_kb(t, &r.kb, r.kb_created_ms)?;
    let had: Option<i64> = t
        .prepare_cached("SELECT id FROM kb_documents WHERE kb = ?1 AND path = ?2")?
        .query_row(params![r.kb, r.path], |row| row.get(0))
        .optional()?;
    if had.is_some() {
        purge_documents(t, vc, Some(&r.kb), Some(&r.path))?;
    }
    t.prepare_cached(
        "INSERT INTO kb_documents (kb, path, mtime_ms, size, hash, title, tags_json, error, indexed_ms, chunk_count)
         VALUES (?1, ?2, ?3, ?4, '', '', '[]', ?5, ?6, 0)",
    )?
    .execute(params![r.kb, r.path, r.mtime_ms, r.size as i64, r.error, now_ms()])?;
    Ok(1)
}

/// A query's [`Filters`], validated and ready to bind as `?1..?4` of [`FILTER_SQL`].
struct Filter {
    kbs: Vec<String>,
    kb_json: String,
    prefix: String,
    tags_json: String,
    after: i64,
}

impl Filter {
    fn new(f: Option<&Filters>) -> Result<Self, StoreError> {
        let f = f.cloned().unwrap_or_default();
        if f.kb.len() > 64 {
            return Err(StoreError::Invalid(format!("filters.kb has {} entries; at most 64", f.kb.len())));
        }
        for (i, kb) in f.kb.iter().enumerate() {
            validate_kb_name(&format!("filters.kb[{i}]"), kb)?;
        }
        if f.path_prefix.len() > MAX_PATH_BYTES || f.path_prefix.contains('\0') {
            return Err(StoreError::Invalid("filters.path_prefix must be at most 4096 bytes without NUL".into()));
        }
        validate_strings("filters.tags", &f.tags, 64, MAX_TAG_BYTES)?;
        Ok(Self {
            kb_json: serde_json::to_string(&f.kb).expect("json"),
            kbs: f.kb.clone(),
            tags_json: serde_json::to_string(&normalized_tags(&f.tags)).expect("json"),
            prefix: f.path_prefix,
            after: if f.modified_after_ms == 0 { i64::MIN } else { f.modified_after_ms },
        })
    }

    /// Whether the filter restricts by KB and nothing else.
    fn kb_only(&self) -> bool {
        self.kb_json != "[]" && self.prefix.is_empty() && self.tags_json == "[]" && self.after == i64::MIN
    }

    /// Whether the filter restricts anything.
    fn restricts(&self) -> bool {
        self.kb_json != "[]" || !self.prefix.is_empty() || self.tags_json != "[]" || self.after != i64::MIN
    }
}

/// The filter condition over `d` (kb_documents), parameters `?1` KBs (JSON array, `[]` = any),
/// `?2` path prefix (`''` = any; compared with `substr`, so `%` and `_` are literal), `?3` tags
/// (JSON array: the document has every one, as Obsidian matches tags: ASCII case-insensitive,
/// and a tag matches its nested tags, `project` matching `project/coffer`), `?4` mtime strictly
/// after. The KB set does not depend on the row: SQLite computes it once per query; the tag
/// check reads the document's own tags through the `(document, tag)` key.
const FILTER_SQL: &str = "(?1 = '[]' OR d.kb IN (SELECT value FROM json_each(?1)))
    AND (?2 = '' OR substr(d.path, 1, length(?2)) = ?2)
    AND (?3 = '[]' OR NOT EXISTS (
        SELECT 1 FROM json_each(?3) w WHERE NOT EXISTS (
            SELECT 1 FROM kb_document_tags g
            WHERE g.document = d.id
              AND (lower(g.tag) = lower(w.value)
                   OR substr(lower(g.tag), 1, length(w.value) + 1) = lower(w.value) || '/'))))
    AND d.mtime_ms > ?4";

/// Columns of a [`Chunk`] over `c` (kb_chunks) and `d` (kb_documents); read by [`chunk_at`].
const CHUNK_COLS: &str =
    "c.id, d.kb, d.path, c.heading_path, c.line_start, c.line_end, c.text, d.title, d.tags_json, d.mtime_ms, c.ordinal";
/// How many columns [`CHUNK_COLS`] has.
const CHUNK_NCOLS: usize = 11;

fn chunk_at(r: &Row<'_>) -> rusqlite::Result<Chunk> {
    Ok(Chunk {
        id: r.get(0)?,
        kb: r.get(1)?,
        path: r.get(2)?,
        heading_path: serde_json::from_str(&r.get::<_, String>(3)?).unwrap_or_default(),
        line_start: r.get(4)?,
        line_end: r.get(5)?,
        text: r.get(6)?,
        title: r.get(7)?,
        tags: serde_json::from_str(&r.get::<_, String>(8)?).unwrap_or_default(),
        mtime_ms: r.get(9)?,
        ordinal: r.get(10)?,
    })
}

/// The FTS5 MATCH expression for `terms`: each term a string (`"` doubled inside), joined with
/// ` AND ` or ` OR `. Terms without a letter or digit (which the tokenizer would turn into an
/// empty phrase) are left out; `None` when none is left (the query matches nothing).
///
/// # Errors
/// [`StoreError::Invalid`] naming `terms` or `terms[i]` for no terms, too many, an empty or too
/// long one, or one with NUL.
pub fn match_expression(terms: &[String], any: bool) -> Result<Option<String>, StoreError> {
    let parts = phrases(terms)?;
    if parts.is_empty() {
        return Ok(None);
    }
    Ok(Some(parts.join(if any { " OR " } else { " AND " })))
}

/// The FTS5 phrase (a string, `"` doubled inside) of each of `terms` that has a letter or
/// digit, in order: the phrases of [`match_expression`], phrase `i` of the MATCH being the
/// `i`-th of this list (what [`crate::fts_rank`] is given the row counts of).
///
/// # Errors
/// As [`match_expression`].
pub fn phrases(terms: &[String]) -> Result<Vec<String>, StoreError> {
    if terms.is_empty() {
        return Err(StoreError::Invalid("terms must not be empty".into()));
    }
    if terms.len() > MAX_TERMS {
        return Err(StoreError::Invalid(format!("terms has {} entries; at most {MAX_TERMS}", terms.len())));
    }
    let mut parts = Vec::with_capacity(terms.len());
    for (i, t) in terms.iter().enumerate() {
        if t.is_empty() || t.len() > MAX_TERM_BYTES || t.contains('\0') {
            return Err(StoreError::Invalid(format!(
                "terms[{i}] {:?} must be 1-{MAX_TERM_BYTES} bytes without NUL",
                truncate(t, 40)
            )));
        }
        if t.chars().any(char::is_alphanumeric) {
            parts.push(format!("\"{}\"", t.replace('"', "\"\"")));
        }
    }
    Ok(parts)
}

/// Most rows the ranked keyword path takes (a tie group at the cut larger than this falls back
/// to the full query).
const KEYWORD_TIE_MAX: usize = 4096;

/// Most ranked rows past the list's last document read to find, for a document whose best chunk
/// matched only in the title or parent headings, a chunk that matches in its own text.
const TITLE_ONLY_LOOKAHEAD: usize = 512;

/// Most rows of other KBs the ranked keyword path skips before it falls back to the full query
/// (a search of a small KB among large ones).
const KEYWORD_SKIP_MAX: usize = 4096;

/// How many ranked rows the first try of the ranked keyword path keeps and reads, for a list
/// of `limit` documents: enough for several chunks of each and a tie group at the cut (a query
/// that needs more runs again without a cap).
fn ranked_rows_cap(limit: usize) -> usize {
    (limit * 16).max(256)
}

/// A term in at least this many chunks is left out of an any-term query that has a rarer term:
/// its idf adds little to bm25, and scoring every row that holds it is what makes such a
/// query slow (a 10,000-note corpus: 60 ms with a common word, 4 ms without).
pub const COMMON_TERM_CHUNKS: usize = 5_000;

/// The ranking expression of every keyword query: bm25 with the column weights title 2,
/// headings 1.5, body 1 (the same as the `rank` configured in migration 0004), computed by
/// [`crate::fts_rank`] with the phrases' row counts bound as `?2` (from [`DocFreq`]) instead of
/// counted per query. Called directly rather than through FTS5's `rank` column: `ORDER BY rank`
/// makes FTS5 run its own nested, sorted query per MATCH. Together (10,000 notes, the
/// benchmark's two- and three-word queries): about half the time of `ORDER BY rank`.
/// `counts` names the SQL parameter bound to the phrases' row counts (e.g. `"?2"`).
fn bm25(counts: &str) -> String {
    bm25_with(crate::fts_rank::NAME, counts)
}

/// [`bm25`] computed by the function `name` ([`crate::fts_rank::NAME`] or its twin
/// [`crate::fts_rank::TOP_NAME`], same arguments and value).
fn bm25_with(name: &str, counts: &str) -> String {
    format!("{name}(kb_fts, {counts}, 2.0, 1.5, 1.0)")
}

/// `KeywordQuery` on a reader: best first, ties by KB, path, ordinal.
///
/// Without filters, or with a filter by KBs alone (what every search coffer-retrieval runs
/// has), the ranking runs on `kb_fts` alone (ordered by [`bm25`]); rows of other KBs are skipped as they come, and only the top `limit` rows,
/// plus every row tied with the last of them, are joined with their chunks and documents. With
/// other filters (or a huge tie group, or too many skipped rows) one query joins every match
/// and orders by (score, KB, path, ordinal).
fn keyword_query(
    c: &Connection,
    (expr, counts): (&str, &[u8]),
    f: &Filter,
    limit: u32,
    one_per_document: bool,
) -> Result<Vec<ChunkHit>, StoreError> {
    let n = limit as usize;
    if !f.restricts() || f.kb_only() {
        let kbs: Option<HashSet<&str>> = f.restricts().then(|| f.kbs.iter().map(String::as_str).collect());
        let mut documents = HashSet::new();
        let mut top: Vec<(i64, f64)> = Vec::with_capacity(n + 1);
        let mut complete = true;
        // Only the best `cap` matches are kept (a bounded heap as the rows are scored, see
        // `fts_rank::best_rows`) instead of ordering every match; when the list is not known
        // to be complete within them (many chunks of one document, rows of other KBs), the
        // query runs again without a cap.
        for cap in [ranked_rows_cap(n), usize::MAX] {
            documents.clear();
            top.clear();
            complete = true;
            let mut st = c.prepare_cached(&format!(
                // (An FTS5 auxiliary function may not be an aggregate's argument; in WHERE it
                // runs once per matching row.)
                "SELECT count(*) FROM kb_fts WHERE kb_fts MATCH ?1 AND {} IS NOT NULL",
                bm25_with(crate::fts_rank::TOP_NAME, "?2")
            ))?;
            let mut kb_of = c.prepare_cached(
                "SELECT d.kb, d.id FROM kb_chunks c CROSS JOIN kb_documents d WHERE c.id = ?1 AND d.id = c.document",
            )?;
            let (_, ranked, matched) =
                crate::fts_rank::best_rows(cap, || st.query_row(params![expr, counts], |r| r.get::<_, i64>(0)))?;
            let (mut skipped, mut stopped) = (0usize, false);
            // Documents whose best chunk matched only in the title or parent headings (repeated
            // in every chunk of a document), by their place in `top`: a later chunk of theirs
            // that matches in its own text is the one shown, with the document's best score
            // (else the shortest section of a note would stand for it).
            let mut title_only: HashMap<i64, usize> = HashMap::new();
            let mut rows = ranked.into_iter();
            for (id, rank, in_body) in rows.by_ref() {
                if top.len() >= n && top[n - 1].1 != rank {
                    stopped = true;
                    break;
                }
                if kbs.is_some() || one_per_document {
                    let row: Option<(String, i64)> =
                        kb_of.query_row([id], |r| Ok((r.get(0)?, r.get(1)?))).optional()?;
                    let Some((kb, document)) = row else { continue };
                    if kbs.as_ref().is_some_and(|kbs| !kbs.contains(kb.as_str())) {
                        skipped += 1;
                        if skipped > KEYWORD_SKIP_MAX {
                            complete = false;
                            stopped = true;
                            break;
                        }
                        continue;
                    }
                    // Ranked best first: the first chunk seen of a document is its best (a tie
                    // is ordered by ordinal below, among the rows kept).
                    if one_per_document && !documents.insert(document) {
                        if in_body && let Some(i) = title_only.remove(&document) {
                            top[i].0 = id;
                        }
                        continue;
                    }
                    if one_per_document && !in_body {
                        title_only.insert(document, top.len());
                    }
                }
                if top.len() >= KEYWORD_TIE_MAX {
                    complete = false;
                    stopped = true;
                    break;
                }
                top.push((id, rank));
            }
            // The rest of the kept rows, for those documents only.
            if !title_only.is_empty() {
                for (id, _, in_body) in rows.take(TITLE_ONLY_LOOKAHEAD) {
                    if !in_body {
                        continue;
                    }
                    let document: Option<i64> = kb_of.query_row([id], |r| r.get(1)).optional()?;
                    if let Some(i) = document.and_then(|d| title_only.remove(&d)) {
                        top[i].0 = id;
                        if title_only.is_empty() {
                            break;
                        }
                    }
                }
            }
            // Every match was within the cap: every match was seen.
            if stopped || matched <= cap as u64 {
                break;
            }
        }
        if complete {
            let mut st = c.prepare_cached(&format!(
                "SELECT {CHUNK_COLS} FROM kb_chunks c CROSS JOIN kb_documents d WHERE c.id = ?1 AND d.id = c.document"
            ))?;
            let mut hits = Vec::with_capacity(top.len());
            for (id, rank) in top {
                // A row of kb_fts always has its chunk (one transaction writes both).
                if let Some(chunk) = st.query_row([id], chunk_at).optional()? {
                    hits.push(ChunkHit { chunk: Some(chunk), score: -rank, lines: vec![] });
                }
            }
            sort_hits(&mut hits);
            hits.truncate(n);
            return Ok(hits);
        }
    }
    let mut st = c.prepare_cached(&format!(
        "SELECT {CHUNK_COLS}, {} AS s
         FROM kb_fts CROSS JOIN kb_chunks c CROSS JOIN kb_documents d
         WHERE kb_fts MATCH ?5 AND c.id = kb_fts.rowid AND d.id = c.document AND {FILTER_SQL}
         ORDER BY s, d.kb, d.path, c.ordinal
         LIMIT ?6",
        bm25("?7")
    ))?;
    // One per document: every match is read (no LIMIT) and the first of each document kept.
    let cap = if one_per_document { -1 } else { i64::from(limit) };
    let rows = st.query_map(params![f.kb_json, f.prefix, f.tags_json, f.after, expr, cap, counts], |r| {
        Ok(ChunkHit { chunk: Some(chunk_at(r)?), score: -r.get::<_, f64>(CHUNK_NCOLS)?, lines: vec![] })
    })?;
    let mut seen = HashSet::new();
    let mut hits = Vec::new();
    for h in rows {
        let h = h?;
        let c = h.chunk.as_ref().expect("chunk");
        if !one_per_document || seen.insert((c.kb.clone(), c.path.clone())) {
            hits.push(h);
            if hits.len() >= n {
                break;
            }
        }
    }
    Ok(hits)
}

/// The terms of an any-term query worth scoring: every term in fewer than
/// [`COMMON_TERM_CHUNKS`] chunks; all of them when each one is that common.
fn rarer_terms(c: &Connection, df: &DocFreq, terms: &[String]) -> Result<Vec<String>, StoreError> {
    let mut rare = Vec::with_capacity(terms.len());
    for t in terms {
        let Some(expr) = match_expression(std::slice::from_ref(t), false)? else { continue };
        if (df.count(c, &expr)? as usize) < COMMON_TERM_CHUNKS {
            rare.push(t.clone());
        }
    }
    Ok(if rare.is_empty() { terms.to_vec() } else { rare })
}

/// How a vector is stored in `kb_vectors` (`int8[dimension]`): scaled to unit length, then to
/// 8-bit integers with its largest component at ±127 ([`quantize`]). A quarter of the float
/// bytes; cosine similarity ignores the per-vector scale, so none is stored, and a similarity
/// computed from the stored integers differs from the float one by about 1e-3 at 384
/// dimensions (Cranfield's nDCG@10 is unchanged: `docs/BENCHMARKS.md`, "Index size").
fn stored_i8(v: &[f32]) -> Vec<i8> {
    quantize(&unit(v)).0
}

/// An 8-bit vector as sqlite-vec's int8 blob (pass it through `vec_int8(?)`).
fn i8_blob(v: &[i8]) -> Vec<u8> {
    v.iter().map(|x| x.to_le_bytes()[0]).collect()
}

/// An int8 blob of `kb_vectors` back as integers.
fn blob_i8(b: &[u8]) -> Vec<i8> {
    b.iter().map(|x| i8::from_le_bytes([*x])).collect()
}

/// Drops the normalized text migration 0021 copied from the old `kb_fts` where FTS5 makes the
/// same tokens of the raw text ([`IndexText`]), and gives each document the index title of its
/// first chunk when that is not its title (its chunks then store theirs only when it differs).
/// What `kb_fts_source` gives back for every row tokenizes as before, so `kb_fts` stays valid
/// as it is. Runs once, at the open that applied 0021, on the writer connection, in one
/// transaction; returns how many chunk and document rows changed.
///
/// # Errors
/// [`StoreError`] when SQLite or the tokenizer fails (the transaction is rolled back: the copies
/// stay, which is correct, only larger).
pub fn compact_index_text(conn: &mut Connection) -> Result<u64, StoreError> {
    /// A chunk's stored index text: (id, title the view gives, own title stored, headings,
    /// heading path, body, text); the raw parts only where the normalized one is stored.
    type Row = (i64, String, bool, Option<String>, Option<String>, Option<String>, Option<String>);
    let t = conn.transaction()?;
    let mut changed = 0u64;
    {
        let x = IndexText::new(&t)?;
        let docs: Vec<(i64, String, Option<String>)> = {
            let mut st =
                t.prepare("SELECT id, title, index_title FROM kb_documents WHERE chunk_count > 0 ORDER BY id")?;
            let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
            rows.collect::<Result<_, _>>()?
        };
        let mut chunks_of = t.prepare(
            "SELECT id, coalesce(index_title, ?2), index_title IS NOT NULL,
                    index_headings, CASE WHEN index_headings IS NULL THEN NULL ELSE heading_path END,
                    index_body, CASE WHEN index_body IS NULL THEN NULL ELSE text END
             FROM kb_chunks WHERE document = ?1 ORDER BY ordinal, id",
        )?;
        let mut set_doc = t.prepare("UPDATE kb_documents SET index_title = ?2 WHERE id = ?1")?;
        let mut set_chunk =
            t.prepare("UPDATE kb_chunks SET index_title = ?2, index_headings = ?3, index_body = ?4 WHERE id = ?1")?;
        for (doc, title, index_title) in docs {
            let old_title = index_title.as_deref().unwrap_or(&title);
            let rows: Vec<Row> = chunks_of
                .query_map(params![doc, old_title], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?, r.get(6)?))
                })?
                .collect::<Result<_, _>>()?;
            let Some(first) = rows.first() else { continue };
            let doc_index_title = x.stored(&first.1, &title)?.map(str::to_owned);
            if doc_index_title != index_title {
                set_doc.execute(params![doc, doc_index_title])?;
                changed += 1;
            }
            let doc_title = doc_index_title.as_deref().unwrap_or(&title);
            for (id, view_title, own_title, headings, heading_path, body, text) in rows {
                let new_title = x.stored(&view_title, doc_title)?;
                let new_headings = match (&headings, &heading_path) {
                    (Some(h), Some(raw)) => x.stored(h, raw)?,
                    _ => None,
                };
                let new_body = match (&body, &text) {
                    (Some(b), Some(raw)) => x.stored(b, raw)?,
                    _ => None,
                };
                let old_title = own_title.then_some(view_title.as_str());
                if (new_title, new_headings, new_body) != (old_title, headings.as_deref(), body.as_deref()) {
                    set_chunk.execute(params![id, new_title, new_headings, new_body])?;
                    changed += 1;
                }
            }
        }
    }
    t.commit()?;
    Ok(changed)
}

/// Converts a `kb_vectors` written before vectors were stored as 8-bit integers
/// (`float[N]`, up to session 46) in place: each vector read, quantized as [`stored_i8`], the
/// table recreated as `int8[N]`. Nothing is re-embedded. Does nothing when there is no
/// `kb_vectors` or it is already `int8`. Runs once at open, on the writer connection, in one
/// transaction; returns how many vectors were converted.
///
/// # Errors
/// [`StoreError`] when SQLite fails (the transaction is rolled back: the float table stays).
pub fn upgrade_vectors_to_int8(conn: &mut Connection) -> Result<u64, StoreError> {
    let sql: Option<String> = conn
        .query_row("SELECT sql FROM sqlite_schema WHERE type = 'table' AND name = 'kb_vectors'", [], |r| r.get(0))
        .optional()?;
    let Some(sql) = sql else { return Ok(0) };
    if !sql.contains("float[") {
        return Ok(0);
    }
    let t = conn.transaction()?;
    let Some((_, dimension)) = vector_config(&t)? else {
        t.execute_batch("DROP TABLE kb_vectors")?;
        t.commit()?;
        return Ok(0);
    };
    let rows: Vec<(i64, Vec<i8>)> = {
        let mut st = t.prepare("SELECT chunk_id, embedding FROM kb_vectors")?;
        let rows = st.query_map([], |r| {
            let blob: Vec<u8> = r.get(1)?;
            let v: Vec<f32> = blob.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
            Ok((r.get::<_, i64>(0)?, stored_i8(&v)))
        })?;
        rows.collect::<Result<_, _>>()?
    };
    t.execute_batch("DROP TABLE kb_vectors")?;
    t.execute_batch(&vectors_ddl(dimension))?;
    {
        let mut ins = t.prepare("INSERT INTO kb_vectors (chunk_id, embedding) VALUES (?1, vec_int8(?2))")?;
        for (id, v) in &rows {
            ins.execute(params![id, i8_blob(v)])?;
        }
    }
    t.commit()?;
    Ok(rows.len() as u64)
}

/// `CREATE VIRTUAL TABLE kb_vectors` for vectors of `dimension` (a validated integer:
/// formatting it into the DDL is safe).
fn vectors_ddl(dimension: u32) -> String {
    format!(
        "CREATE VIRTUAL TABLE kb_vectors USING vec0 (chunk_id integer primary key, embedding int8[{dimension}] \
         distance_metric=cosine)"
    )
}

/// [`StoreError::Invalid`] naming `field` unless `v` has `dimension` finite values, not all zero.
fn validate_vector(field: &str, v: &[f32], dimension: u32) -> Result<(), StoreError> {
    if v.len() != dimension as usize {
        return Err(StoreError::Invalid(format!(
            "{field} has dimension {}, the configured dimension is {dimension}",
            v.len()
        )));
    }
    if let Some(i) = v.iter().position(|x| !x.is_finite()) {
        return Err(StoreError::Invalid(format!("{field}[{i}] is not a finite number ({})", v[i])));
    }
    if v.iter().all(|x| *x == 0.0) {
        return Err(StoreError::Invalid(format!("{field} is all zeros (no direction for cosine distance)")));
    }
    Ok(())
}

/// Largest in-memory copy of the vectors (bytes); beyond it queries use sqlite-vec's KNN.
const VECTOR_CACHE_MAX_BYTES: usize = 512 * 1024 * 1024;

/// `v` scaled to unit length (cosine similarity of unit vectors is their dot product).
fn unit(v: &[f32]) -> Vec<f32> {
    let norm = v.iter().map(|x| f64::from(*x) * f64::from(*x)).sum::<f64>().sqrt() as f32;
    v.iter().map(|x| x / norm).collect()
}

/// Dot product with eight independent sums (the compiler vectorizes it); the same inputs give
/// the same result bit for bit.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut sum: f32 = acc.iter().sum();
    for (x, y) in ra.iter().zip(rb) {
        sum += x * y;
    }
    sum
}

/// A unit vector as 8-bit integers and the scale that maps them back (`v[i] ≈ q[i] * scale`):
/// the largest component becomes ±127.
fn quantize(v: &[f32]) -> (Vec<i8>, f32) {
    let max = v.iter().fold(0f32, |m, x| m.max(x.abs()));
    if max == 0.0 {
        return (vec![0; v.len()], 0.0);
    }
    let k = 127.0 / max;
    (v.iter().map(|x| (x * k).round().clamp(-127.0, 127.0) as i8).collect(), max / 127.0)
}

/// Dot product of two 8-bit vectors, exact in `i32` (|sum| ≤ 127² × 8192 < 2³¹). Integer
/// arithmetic: every build and every CPU path ([`dot_rows_i8`]) gives the same value.
fn dot_i8(a: &[i8], b: &[i8]) -> i32 {
    a.iter().zip(b).map(|(x, y)| i32::from(*x) * i32::from(*y)).sum()
}

/// Rows at or above which [`dot_rows_i8`] splits the scan over two threads (below it a thread's
/// start costs more than it saves).
const PARALLEL_SCAN_ROWS: usize = 16_384;

/// `out[i]` = [`dot_i8`] of row `i` of `rows` (rows of `q.len()` values) with `q`: the 8-bit
/// stage of every vector query, the one loop over every stored vector. On x86-64 CPUs with
/// AVX2 it runs the AVX2 build of the same loop (2.5× faster than the SSE2 baseline on the
/// benchmark's 106,000 × 384 vectors: 5 vs 12.5 ms), and above [`PARALLEL_SCAN_ROWS`] rows
/// the two halves run on two threads. The values are exact integers either way.
fn dot_rows_i8(rows: &[i8], q: &[i8], out: &mut [i32]) {
    let dim = q.len();
    if dim == 0 {
        out.fill(0);
        return;
    }
    if out.len() < PARALLEL_SCAN_ROWS || scan_threads() < 2 {
        return dot_rows_i8_on_this_thread(rows, q, out);
    }
    let half = out.len() / 2;
    let (out_a, out_b) = out.split_at_mut(half);
    let (rows_a, rows_b) = rows.split_at(half * dim);
    std::thread::scope(|s| {
        s.spawn(|| dot_rows_i8_on_this_thread(rows_a, q, out_a));
        dot_rows_i8_on_this_thread(rows_b, q, out_b);
    });
}

/// How many threads a large vector scan may use: the CPUs this process may run on, asked once
/// (`available_parallelism` reads the process's CPU affinity and cgroup limits).
fn scan_threads() -> usize {
    static THREADS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *THREADS.get_or_init(|| std::thread::available_parallelism().map_or(1, usize::from))
}

fn dot_rows_i8_on_this_thread(rows: &[i8], q: &[i8], out: &mut [i32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // The baseline x86-64 target has SSE2 only, where this loop's widening multiply is
        // partly scalar; the AVX2 build of the same safe code is compiled in beside it and
        // chosen at run time. Calling a `target_feature` function is unsafe only because the
        // CPU must have the feature, which was just checked.
        #[allow(unsafe_code)]
        return unsafe { dot_rows_i8_avx2(rows, q, out) };
    }
    dot_rows_i8_portable(rows, q, out);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn dot_rows_i8_avx2(rows: &[i8], q: &[i8], out: &mut [i32]) {
    dot_rows_i8_portable(rows, q, out);
}

#[inline(always)]
fn dot_rows_i8_portable(rows: &[i8], q: &[i8], out: &mut [i32]) {
    for (o, row) in out.iter_mut().zip(rows.chunks_exact(q.len())) {
        *o = dot_i8(row, q);
    }
}

/// How many candidates the 8-bit scan hands to the exact rescoring for a query of `limit`:
/// enough that the 8-bit error (about 1e-3 of cosine similarity at 384 dimensions) cannot push
/// one of the true best `limit` out of them in practice.
fn rescore_candidates(limit: usize) -> usize {
    limit.saturating_mul(4).saturating_add(64)
}

/// The vectors of `kb_vectors`, unit-normalized, in one contiguous array, and the same as 8-bit
/// integers (a quarter of the bytes to stream per query) with a scale per row.
struct VectorCache {
    dim: usize,
    ids: Vec<i64>,
    data: Vec<f32>,
    q8: Vec<i8>,
    scale: Vec<f32>,
    pos: HashMap<i64, usize>,
}

impl VectorCache {
    fn empty(dim: usize) -> Self {
        Self { dim, ids: vec![], data: vec![], q8: vec![], scale: vec![], pos: HashMap::new() }
    }

    /// Keeps the vector of chunk `id` as it is stored ([`stored_i8`]), so that a copy kept in
    /// step by writes and one loaded from the database answer alike.
    fn put(&mut self, id: i64, v: &[f32]) {
        self.put_i8(id, &stored_i8(v));
    }

    /// Keeps a stored 8-bit vector: the integers for the scan, and the vector they stand for at
    /// unit length (the rescoring's floats; `scale` maps the integers to it).
    fn put_i8(&mut self, id: i64, q: &[i8]) {
        if q.len() != self.dim {
            return;
        }
        let norm = q.iter().map(|x| f64::from(*x) * f64::from(*x)).sum::<f64>().sqrt();
        if norm == 0.0 {
            return;
        }
        let v: Vec<f32> = q.iter().map(|x| (f64::from(*x) / norm) as f32).collect();
        let scale = (1.0 / norm) as f32;
        let d = self.dim;
        match self.pos.get(&id) {
            Some(&i) => {
                self.data[i * d..(i + 1) * d].copy_from_slice(&v);
                self.q8[i * d..(i + 1) * d].copy_from_slice(q);
                self.scale[i] = scale;
            }
            None => {
                self.pos.insert(id, self.ids.len());
                self.ids.push(id);
                self.data.extend_from_slice(&v);
                self.q8.extend_from_slice(q);
                self.scale.push(scale);
            }
        }
    }

    fn remove(&mut self, id: i64) {
        let Some(i) = self.pos.remove(&id) else { return };
        let last = self.ids.len() - 1;
        let d = self.dim;
        if i != last {
            let moved = self.ids[last];
            self.ids[i] = moved;
            self.data.copy_within(last * d..(last + 1) * d, i * d);
            self.q8.copy_within(last * d..(last + 1) * d, i * d);
            self.scale[i] = self.scale[last];
            self.pos.insert(moved, i);
        }
        self.ids.pop();
        self.data.truncate(last * d);
        self.q8.truncate(last * d);
        self.scale.pop();
    }

    fn bytes(&self) -> usize {
        self.data.len() * 4 + self.q8.len() + self.scale.len() * 4
    }

    /// The row of position `i`, exact.
    fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.dim..(i + 1) * self.dim]
    }

    /// Approximate similarity of position `i` to a query quantized as (`q`, `q_scale`).
    fn approx(&self, i: usize, q: &[i8], q_scale: f32) -> f32 {
        dot_i8(&self.q8[i * self.dim..(i + 1) * self.dim], q) as f32 * self.scale[i] * q_scale
    }
}

#[derive(Default)]
struct CacheState {
    /// `None`: not loaded (or dropped after a failed write).
    cache: Option<VectorCache>,
    /// Bumped after every index write; a load started before a write is not kept.
    generation: u64,
    /// The vectors did not fit [`VECTOR_CACHE_MAX_BYTES`]: use sqlite-vec until the next reset.
    oversized: bool,
}

/// The in-memory copy of `kb_vectors` that `VectorQuery` scans (exact brute force, several
/// times faster than sqlite-vec's scalar cosine KNN). Kept in step by the writes that change
/// `kb_vectors`, which run on the writer thread in commit order; loaded on first use.
#[derive(Clone, Default)]
pub struct Vectors(Arc<RwLock<CacheState>>);

impl Vectors {
    fn state(&self) -> std::sync::RwLockWriteGuard<'_, CacheState> {
        self.0.write().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn put(&self, id: i64, v: &[f32]) {
        let mut s = self.state();
        if let Some(c) = s.cache.as_mut() {
            c.put(id, v);
            if c.bytes() > VECTOR_CACHE_MAX_BYTES {
                s.cache = None;
                s.oversized = true;
            }
        }
    }

    fn remove(&self, ids: &[i64]) {
        if let Some(c) = self.state().cache.as_mut() {
            for id in ids {
                c.remove(*id);
            }
        }
    }

    fn clear(&self) {
        let mut s = self.state();
        if let Some(c) = s.cache.as_mut() {
            *c = VectorCache::empty(c.dim);
        }
        s.oversized = false;
    }

    fn reset(&self, dim: usize) {
        let mut s = self.state();
        s.cache = Some(VectorCache::empty(dim));
        s.oversized = false;
    }

    /// After a write job: bumps the generation; a failed job drops the copy.
    fn committed(&self, ok: bool) {
        let mut s = self.state();
        s.generation += 1;
        if !ok {
            s.cache = None;
        }
    }

    /// The nearest chunks to `q` that pass `f`, as (similarity, chunk id): the best `limit` and
    /// every one tied with the last of them. `None` when the vectors do not fit in memory.
    fn nearest(
        &self,
        c: &Connection,
        q: &[f32],
        f: &Filter,
        limit: u32,
    ) -> Result<Option<Vec<(f32, i64)>>, StoreError> {
        // Which rows count. A filter by KBs alone (every search names its KBs) is applied as
        // the few rows of the other KBs left out, not as a set of every allowed row: building
        // that set cost ~200 ms at 100k chunks, far more than the scan itself.
        let kbs_only = f.prefix.is_empty() && f.tags_json == "[]" && f.after == i64::MIN;
        let (allowed, excluded): (Option<HashSet<i64>>, HashSet<i64>) = if kbs_only && f.kb_json != "[]" {
            // From the few KBs not asked for to their documents (by the (kb, path) index):
            // starting from the documents instead walked every document of every KB, 2.3 ms
            // per query at 10,000 notes to find nothing to leave out.
            let mut st = c.prepare_cached(
                "SELECT c.id FROM kb_knowledge_bases k CROSS JOIN kb_documents d CROSS JOIN kb_chunks c
                 WHERE k.name NOT IN (SELECT value FROM json_each(?1)) AND d.kb = k.name
                   AND c.document = d.id AND c.embedded = 1",
            )?;
            let rows = st.query_map(params![f.kb_json], |r| r.get(0))?;
            (None, rows.collect::<Result<_, _>>()?)
        } else if f.restricts() {
            let mut st = c.prepare_cached(&format!(
                "SELECT c.id FROM kb_documents d CROSS JOIN kb_chunks c
                 WHERE c.document = d.id AND c.embedded = 1 AND {FILTER_SQL}"
            ))?;
            let rows = st.query_map(params![f.kb_json, f.prefix, f.tags_json, f.after], |r| r.get(0))?;
            (Some(rows.collect::<Result<_, _>>()?), HashSet::new())
        } else {
            (None, HashSet::new())
        };
        let q = unit(q);
        let (q8, q_scale) = quantize(&q);
        let keep = rescore_candidates(limit as usize);
        // Two stages: every allowed row scored on its 8-bit copy (a quarter of the memory to
        // stream), then the best `keep` rescored exactly; the answer is the exact order of those.
        let scan = |cache: &VectorCache| -> Vec<(f32, i64)> {
            let mut approx: Vec<(f32, usize)> = match &allowed {
                None => {
                    // Every row at once (one pass over the 8-bit copy), the left-out rows
                    // dropped after.
                    let mut dots = vec![0i32; cache.ids.len()];
                    dot_rows_i8(&cache.q8, &q8, &mut dots);
                    // The best `keep` of rows `lo..` (their dot products `ds`), by approximate
                    // similarity; a large index's two halves on two threads, as the scan.
                    let best = |lo: usize, ds: &[i32]| -> Vec<(f32, usize)> {
                        let mut v: Vec<(f32, usize)> = ds
                            .iter()
                            .enumerate()
                            .map(|(j, &d)| (lo + j, d))
                            .filter(|&(i, _)| excluded.is_empty() || !excluded.contains(&cache.ids[i]))
                            .map(|(i, d)| (d as f32 * cache.scale[i] * q_scale, i))
                            .collect();
                        if v.len() > keep {
                            v.select_nth_unstable_by(keep - 1, |a, b| b.0.total_cmp(&a.0));
                            v.truncate(keep);
                        }
                        v
                    };
                    if dots.len() >= PARALLEL_SCAN_ROWS && scan_threads() >= 2 {
                        let (a, b) = dots.split_at(dots.len() / 2);
                        std::thread::scope(|s| {
                            let first = s.spawn(|| best(0, a));
                            let mut v = best(a.len(), b);
                            v.extend(first.join().unwrap_or_else(|p| std::panic::resume_unwind(p)));
                            v
                        })
                    } else {
                        best(0, &dots)
                    }
                }
                Some(set) => {
                    set.iter().filter_map(|id| cache.pos.get(id).map(|&i| (cache.approx(i, &q8, q_scale), i))).collect()
                }
            };
            if approx.len() > keep {
                approx.select_nth_unstable_by(keep - 1, |a, b| b.0.total_cmp(&a.0));
                approx.truncate(keep);
            }
            approx.into_iter().map(|(_, i)| (dot(cache.row(i), &q), cache.ids[i])).collect()
        };
        let mut scored = {
            let s = self.0.read().unwrap_or_else(std::sync::PoisonError::into_inner);
            if s.oversized {
                return Ok(None);
            }
            match s.cache.as_ref() {
                Some(cache) if cache.dim == q.len() => Some(scan(cache)),
                _ => None,
            }
        };
        if scored.is_none() {
            let Some((loaded, generation)) = self.load(c, q.len())? else { return Ok(None) };
            scored = Some(scan(&loaded));
            self.install(loaded, generation);
        }
        let mut scored = scored.unwrap_or_default();
        let n = limit as usize;
        if scored.len() > n {
            scored.select_nth_unstable_by(n - 1, |a, b| b.0.total_cmp(&a.0));
            let cut = scored[n - 1].0;
            let tail = scored.split_off(n);
            scored.extend(tail.into_iter().filter(|s| s.0 == cut));
        }
        Ok(Some(scored))
    }

    /// Reads every vector from `kb_vectors` on `c`, with the generation it was read at.
    /// `None` when they do not fit in memory.
    fn load(&self, c: &Connection, dim: usize) -> Result<Option<(VectorCache, u64)>, StoreError> {
        let generation = self.0.read().unwrap_or_else(std::sync::PoisonError::into_inner).generation;
        let count: i64 = c.query_row("SELECT COUNT(*) FROM kb_chunks WHERE embedded = 1", [], |r| r.get(0))?;
        if count as usize * (dim * 5 + 4) > VECTOR_CACHE_MAX_BYTES {
            self.state().oversized = true;
            return Ok(None);
        }
        let mut cache = VectorCache::empty(dim);
        cache.ids.reserve(count as usize);
        cache.data.reserve(count as usize * dim);
        cache.q8.reserve(count as usize * dim);
        cache.scale.reserve(count as usize);
        let mut st = c.prepare_cached("SELECT chunk_id, embedding FROM kb_vectors")?;
        let mut rows = st.query([])?;
        while let Some(r) = rows.next()? {
            let id: i64 = r.get(0)?;
            let blob: Vec<u8> = r.get(1)?;
            cache.put_i8(id, &blob_i8(&blob));
        }
        Ok(Some((cache, generation)))
    }

    /// Keeps a loaded copy unless a write happened since its load began.
    fn install(&self, cache: VectorCache, generation: u64) {
        let mut s = self.state();
        if s.generation == generation && !s.oversized && s.cache.as_ref().is_none_or(|c| c.dim != cache.dim) {
            s.cache = Some(cache);
        }
    }
}

/// The hits of [`Vectors::nearest`]'s candidates: chunk metadata joined, ordered by similarity
/// then (KB, path, ordinal), cut to `limit`. A candidate whose chunk is gone (deleted since) is
/// left out.
fn candidate_hits(c: &Connection, candidates: Vec<(f32, i64)>, limit: u32) -> Result<Vec<ChunkHit>, StoreError> {
    let mut st = c.prepare_cached(&format!(
        "SELECT {CHUNK_COLS} FROM kb_chunks c CROSS JOIN kb_documents d WHERE c.id = ?1 AND d.id = c.document"
    ))?;
    let mut hits = Vec::with_capacity(candidates.len());
    for (similarity, id) in candidates {
        if let Some(chunk) = st.query_row([id], chunk_at).optional()? {
            hits.push(ChunkHit { chunk: Some(chunk), score: f64::from(similarity), lines: vec![] });
        }
    }
    sort_hits(&mut hits);
    hits.truncate(limit as usize);
    Ok(hits)
}

/// Best score first, then (KB, path, ordinal): never the chunk id, which a rebuild changes.
fn sort_hits(hits: &mut [ChunkHit]) {
    hits.sort_by(|a, b| {
        let (ca, cb) = (a.chunk.as_ref().expect("chunk"), b.chunk.as_ref().expect("chunk"));
        b.score.total_cmp(&a.score).then_with(|| (&ca.kb, &ca.path, ca.ordinal).cmp(&(&cb.kb, &cb.path, cb.ordinal)))
    });
}

/// `VectorQuery` on a reader: exact top `limit` by cosine distance between the stored 8-bit
/// vectors and the query's (`blob`: [`stored_i8`] of the query, as [`i8_blob`]), ties by KB,
/// path, ordinal.
///
/// The KNN over `kb_vectors` fetches more than `limit` (more when filters are present) and
/// filters in SQL; when that cannot prove the answer exact (fewer than `limit` survivors of a
/// full KNN page, or a tie at its far edge), the query scans the filtered chunks' vectors with
/// `vec_distance_cosine` instead.
fn vector_query(c: &Connection, blob: &[u8], f: &Filter, limit: u32) -> Result<Vec<ChunkHit>, StoreError> {
    let k = if f.restricts() { limit.saturating_mul(8).saturating_add(64) } else { limit.saturating_mul(2) + 16 };
    let k = k.min(VEC_K_MAX);
    // One KNN page, every row with whether it passes the filters, nearest first.
    let page: Vec<(Chunk, f64, bool)> = {
        let mut st = c.prepare_cached(&format!(
            "WITH knn AS MATERIALIZED (
                 SELECT chunk_id, distance FROM kb_vectors WHERE embedding MATCH vec_int8(?5) AND k = ?6)
             SELECT {CHUNK_COLS}, knn.distance, {FILTER_SQL}
             FROM knn CROSS JOIN kb_chunks c CROSS JOIN kb_documents d
             WHERE c.id = knn.chunk_id AND d.id = c.document
             ORDER BY knn.distance, d.kb, d.path, c.ordinal"
        ))?;
        let rows = st.query_map(params![f.kb_json, f.prefix, f.tags_json, f.after, blob, k], |r| {
            Ok((chunk_at(r)?, r.get::<_, f64>(CHUNK_NCOLS)?, r.get::<_, bool>(CHUNK_NCOLS + 1)?))
        })?;
        rows.collect::<Result<_, _>>()?
    };
    let farthest = page.last().map(|p| p.1);
    let complete = (page.len() as u32) < k;
    let hits: Vec<ChunkHit> = page
        .into_iter()
        .filter(|p| p.2)
        .take(limit as usize)
        .map(|(chunk, distance, _)| ChunkHit { chunk: Some(chunk), score: 1.0 - distance, lines: vec![] })
        .collect();
    // Exact when the page held every vector, or when `limit` hits are strictly nearer than the
    // page's far edge (nothing outside the page can tie with or beat them).
    let exact = complete
        || (hits.len() == limit as usize && hits.last().zip(farthest).is_some_and(|(h, far)| 1.0 - h.score < far));
    if exact {
        return Ok(hits);
    }
    let mut st = c.prepare_cached(&format!(
        "SELECT {CHUNK_COLS}, vec_distance_cosine(v.embedding, vec_int8(?5)) AS distance
         FROM kb_documents d CROSS JOIN kb_chunks c CROSS JOIN kb_vectors v
         WHERE c.document = d.id AND c.embedded = 1 AND v.chunk_id = c.id AND {FILTER_SQL}
         ORDER BY distance, d.kb, d.path, c.ordinal
         LIMIT ?6"
    ))?;
    let rows = st.query_map(params![f.kb_json, f.prefix, f.tags_json, f.after, blob, limit], |r| {
        Ok(ChunkHit { chunk: Some(chunk_at(r)?), score: 1.0 - r.get::<_, f64>(CHUNK_NCOLS)?, lines: vec![] })
    })?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// `LocateLines` on a reader: per asked line, the chunks of that document whose line range
/// holds it; each chunk once, with the asked lines inside it; in (KB, path, ordinal) order.
fn locate_lines(c: &Connection, lines: &[LineRef], f: &Filter) -> Result<Vec<ChunkHit>, StoreError> {
    let mut st = c.prepare_cached(&format!(
        "SELECT {CHUNK_COLS}
         FROM kb_documents d CROSS JOIN kb_chunks c
         WHERE d.kb = ?5 AND d.path = ?6 AND c.document = d.id AND c.line_start <= ?7 AND c.line_end >= ?7
           AND {FILTER_SQL}"
    ))?;
    let mut found: HashMap<i64, ChunkHit> = HashMap::new();
    for l in lines {
        let rows = st.query_map(params![f.kb_json, f.prefix, f.tags_json, f.after, l.kb, l.path, l.line], chunk_at)?;
        for chunk in rows {
            let chunk = chunk?;
            let hit =
                found.entry(chunk.id).or_insert_with(|| ChunkHit { chunk: Some(chunk), score: 0.0, lines: vec![] });
            if !hit.lines.contains(&l.line) {
                hit.lines.push(l.line);
            }
        }
    }
    let mut hits: Vec<ChunkHit> = found.into_values().collect();
    for h in &mut hits {
        h.lines.sort_unstable();
        h.score = h.lines.len() as f64;
    }
    hits.sort_by(|a, b| {
        let (a, b) = (a.chunk.as_ref().expect("chunk"), b.chunk.as_ref().expect("chunk"));
        (&a.kb, &a.path, a.ordinal).cmp(&(&b.kb, &b.path, b.ordinal))
    });
    Ok(hits)
}

/// The `Index` gRPC service.
pub struct IndexService {
    db: Db,
    vectors: Vectors,
    /// Phrase row counts for ranking, forgotten after every write of `kb_fts`.
    doc_freq: Arc<DocFreq>,
    /// Woken by every write of `kb_fts`: [`warm_term_counts`] reads the common terms' counts
    /// again once the writes have stopped for [`WARM_AFTER`].
    warm_wake: Arc<tokio::sync::Notify>,
    /// The index tables' size on disk ([`index_tables_bytes`]), when it was measured and what
    /// the index held then (highest chunk id, Σ document sizes), for [`INDEX_BYTES_TTL`].
    index_bytes: Arc<std::sync::Mutex<Option<IndexBytes>>>,
}

/// A measure of the index tables' size: when, what the index held (highest chunk id, Σ
/// document sizes), bytes.
type IndexBytes = (std::time::Instant, (i64, i64), u64);

/// How long a measured size of the index tables is reused by `Stats` after the index changed
/// (measuring reads every page of them); unchanged, it is reused until it changes.
const INDEX_BYTES_TTL: std::time::Duration = std::time::Duration::from_secs(2);

/// Bytes of the pages of every table and index of the knowledge-base index (`kb_*`: documents,
/// chunks, the FTS5 table's shadow tables, the vectors' shadow tables, their indexes, and the
/// automatic index of `kb_documents`' unique key), from SQLite's `dbstat` table.
fn index_tables_bytes(c: &Connection) -> rusqlite::Result<u64> {
    let mut names = c.prepare(
        "SELECT name FROM sqlite_schema WHERE type IN ('table', 'index') AND rootpage > 0
         AND (name GLOB 'kb_*' OR name GLOB 'sqlite_autoindex_kb_*')",
    )?;
    let names: Vec<String> = names.query_map([], |r| r.get(0))?.collect::<Result<_, _>>()?;
    let mut size = c.prepare("SELECT COALESCE(SUM(pgsize), 0) FROM dbstat WHERE name = ?1 AND aggregate = 1")?;
    let mut total = 0u64;
    for n in names {
        total += size.query_row([&n], |r| r.get::<_, i64>(0))? as u64;
    }
    Ok(total)
}

/// How long `kb_fts` must go unwritten before [`warm_term_counts`] reads the term counts again.
pub const WARM_AFTER: std::time::Duration = std::time::Duration::from_secs(2);

/// Keeps `df`'s common term counts read ([`DocFreq::warm`]), and the new rows' lengths
/// ([`crate::fts_rank::fill_row_sizes`]): once at start, then each time the
/// writes of `kb_fts` have stopped for [`WARM_AFTER`] (a pass reads the whole term index, so
/// it waits for a quiet moment rather than running after every write). Runs until the runtime
/// stops.
async fn warm_term_counts(db: Db, df: Arc<DocFreq>, wake: Arc<tokio::sync::Notify>) {
    loop {
        // Quiet for WARM_AFTER: every write wakes this again and the wait starts over.
        loop {
            tokio::select! {
                () = wake.notified() => {}
                () = tokio::time::sleep(WARM_AFTER) => break,
            }
        }
        let started = std::time::Instant::now();
        let (df2, sizes) = (df.clone(), db.row_sizes());
        match db.read(move |c| Ok((df2.warm(c)?, crate::fts_rank::fill_row_sizes(c, &sizes)?))).await {
            Ok((kept, lengths)) => tracing::debug!(
                kept,
                lengths,
                took_ms = started.elapsed().as_millis() as u64,
                "Term counts and row lengths read."
            ),
            Err(e) => tracing::warn!(error = %e, "Reading the term counts failed; terms are counted when asked for."),
        }
        wake.notified().await;
    }
}

impl IndexService {
    /// After a knowledge base's index was removed or cleared: its pages back to the file
    /// system and the WAL truncated ([`Db::reclaim`]). A failure is logged, not the caller's
    /// (the removal itself is committed).
    async fn reclaim(&self) {
        let started = std::time::Instant::now();
        match self.db.reclaim().await {
            Ok(bytes) => tracing::info!(
                db_bytes = bytes,
                took_ms = started.elapsed().as_millis() as u64,
                "Reclaimed the space of a removed index."
            ),
            Err(e) => tracing::warn!(error = %e, "Could not reclaim the space of a removed index."),
        }
        self.index_bytes.lock().expect("index bytes").take();
    }

    /// The service over `db`; inside a Tokio runtime it also starts [`warm_term_counts`].
    pub fn new(db: Db) -> Self {
        let doc_freq: Arc<DocFreq> = Arc::default();
        let warm_wake = Arc::new(tokio::sync::Notify::new());
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(warm_term_counts(db.clone(), doc_freq.clone(), warm_wake.clone()));
        }
        Self { db, vectors: Vectors::default(), doc_freq, warm_wake, index_bytes: Arc::default() }
    }

    /// [`Db::write`] for a job that may change `kb_vectors`: the job keeps the in-memory copy in
    /// step as it writes (on the writer thread, so in commit order); a job that fails (rolled
    /// back) drops the copy, which the next query reloads.
    async fn write<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&rusqlite::Transaction, &Vectors) -> Result<T, StoreError> + Send + 'static,
    {
        let result = self.write_vectors(f).await;
        // Committed or rolled back, the counts read before are no longer known to be current.
        self.doc_freq.invalidate();
        self.warm_wake.notify_one();
        result
    }

    /// [`IndexService::write`] for a job that leaves `kb_fts` as it is (embeddings, the vector
    /// configuration): the term counts stay current.
    async fn write_vectors<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&rusqlite::Transaction, &Vectors) -> Result<T, StoreError> + Send + 'static,
    {
        let vc = self.vectors.clone();
        let result = self.db.write(move |t, _| f(t, &vc)).await;
        self.vectors.committed(result.is_ok());
        result.map(|(value, _)| value)
    }
}

#[tonic::async_trait]
impl Index for IndexService {
    async fn create_knowledge_base(&self, req: Request<KnowledgeBase>) -> Result<Response<KnowledgeBase>, Status> {
        let mut kb = req.into_inner();
        let kind = validate_kb(&kb)?;
        let (kb, _) = self
            .db
            .write(move |t, _| {
                if get_kb(t, &kb.name)?.is_some() {
                    return Err(StoreError::Exists(format!("knowledge base {:?}", kb.name)));
                }
                // One folder is one KB. Checked here, in the write transaction (one writer at a
                // time), so two concurrent adds of one folder cannot both pass.
                if let Some(other) = kb_at_root(t, &kb.root)? {
                    return Err(StoreError::Exists(format!(
                        "a knowledge base for folder {} (knowledge base {other:?})",
                        kb.root
                    )));
                }
                kb.created_ms = now_ms();
                t.execute(
                    &format!("INSERT INTO kb_knowledge_bases ({KB_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"),
                    params![
                        kb.name,
                        kind_str(kind),
                        kb.root,
                        serde_json::to_string(&kb.include).expect("json"),
                        serde_json::to_string(&kb.exclude).expect("json"),
                        kb.created_ms,
                        kb.writable
                    ],
                )?;
                Ok(kb)
            })
            .await?;
        Ok(Response::new(kb))
    }

    async fn list_knowledge_bases(
        &self,
        _: Request<ListKnowledgeBasesRequest>,
    ) -> Result<Response<ListKnowledgeBasesReply>, Status> {
        let knowledge_bases = self
            .db
            .read(|c| {
                let mut st = c.prepare_cached(&format!("SELECT {KB_COLS} FROM kb_knowledge_bases ORDER BY name"))?;
                let rows = st.query_map([], kb_from_row)?;
                Ok(rows.collect::<Result<Vec<_>, _>>()?)
            })
            .await?;
        Ok(Response::new(ListKnowledgeBasesReply { knowledge_bases }))
    }

    async fn get_knowledge_base(&self, req: Request<KnowledgeBaseRef>) -> Result<Response<KnowledgeBase>, Status> {
        let name = req.into_inner().name;
        validate_kb_name("name", &name)?;
        let n = name.clone();
        let kb = self.db.read(move |c| get_kb(c, &n)).await?;
        kb.map(Response::new).ok_or_else(|| StoreError::NotFound(format!("knowledge base {name:?}")).into())
    }

    async fn delete_knowledge_base(&self, req: Request<KnowledgeBaseRef>) -> Result<Response<DeleteReply>, Status> {
        let name = req.into_inner().name;
        validate_kb_name("name", &name)?;
        let removed = self
            .write(move |t, vc| {
                require_kb(t, &name)?;
                let removed = purge_documents(t, vc, Some(&name), None)?;
                t.execute("DELETE FROM kb_knowledge_bases WHERE name = ?1", [&name])?;
                Ok(removed)
            })
            .await?;
        self.reclaim().await;
        Ok(Response::new(DeleteReply { removed }))
    }

    async fn list_documents(&self, req: Request<ListDocumentsRequest>) -> Result<Response<ListDocumentsReply>, Status> {
        let kb = req.into_inner().kb;
        validate_kb_name("kb", &kb)?;
        let documents = self
            .db
            .read(move |c| {
                require_kb(c, &kb)?;
                let mut st = c.prepare_cached(
                    "SELECT kb, path, mtime_ms, size, hash, chunk_count, error, indexed_ms, title, tags_json
                     FROM kb_documents WHERE kb = ?1 ORDER BY path",
                )?;
                let rows = st.query_map([&kb], document_meta)?;
                Ok(rows.collect::<Result<Vec<_>, _>>()?)
            })
            .await?;
        Ok(Response::new(ListDocumentsReply { documents }))
    }

    async fn upsert_document(
        &self,
        req: Request<UpsertDocumentRequest>,
    ) -> Result<Response<UpsertDocumentReply>, Status> {
        let r = req.into_inner();
        validate_upsert(&r)?;
        let reply = self.write(move |t, vc| upsert_document(t, vc, &r)).await?;
        Ok(Response::new(reply))
    }

    async fn mark_document_error(
        &self,
        req: Request<MarkDocumentErrorRequest>,
    ) -> Result<Response<DeleteReply>, Status> {
        let r = req.into_inner();
        validate_kb_name("kb", &r.kb)?;
        validate_path("path", &r.path)?;
        if r.error.is_empty() {
            return Err(Status::invalid_argument("error is required"));
        }
        let removed = self.write(move |t, vc| mark_document_error(t, vc, &r)).await?;
        Ok(Response::new(DeleteReply { removed }))
    }

    async fn delete_document(&self, req: Request<DocumentRef>) -> Result<Response<DeleteReply>, Status> {
        let r = req.into_inner();
        validate_kb_name("kb", &r.kb)?;
        validate_path("path", &r.path)?;
        let removed = self.write(move |t, vc| purge_documents(t, vc, Some(&r.kb), Some(&r.path))).await?;
        Ok(Response::new(DeleteReply { removed }))
    }

    async fn clear_index(&self, req: Request<ClearIndexRequest>) -> Result<Response<DeleteReply>, Status> {
        let kb = req.into_inner().kb;
        if !kb.is_empty() {
            validate_kb_name("kb", &kb)?;
        }
        let removed = self
            .write(move |t, vc| {
                if kb.is_empty() {
                    purge_documents(t, vc, None, None)
                } else {
                    require_kb(t, &kb)?;
                    purge_documents(t, vc, Some(&kb), None)
                }
            })
            .await?;
        self.reclaim().await;
        Ok(Response::new(DeleteReply { removed }))
    }

    async fn keyword_query(&self, req: Request<KeywordQueryRequest>) -> Result<Response<ChunkHits>, Status> {
        let r = req.into_inner();
        let any = r.mode() == MatchMode::Any;
        let expr = match_expression(&r.terms, any)?;
        let filter = Filter::new(r.filters.as_ref())?;
        let limit = validate_limit("limit", r.limit)?;
        if expr.is_none() {
            return Ok(Response::new(ChunkHits::default()));
        }
        let terms = r.terms.clone();
        let df = self.doc_freq.clone();
        // A search waits on this: run on the RPC's own thread (`Db::read_now`).
        let hits = self
            .db
            .read_now(move |c| {
                let terms = if any && terms.len() > 1 { rarer_terms(c, &df, &terms)? } else { terms };
                let phrases = phrases(&terms)?;
                if phrases.is_empty() {
                    return Ok(vec![]);
                }
                let expr = phrases.join(if any { " OR " } else { " AND " });
                let counts = df.blob(c, &phrases)?;
                keyword_query(c, (&expr, &counts), &filter, limit, r.one_per_document)
            })
            .await?;
        Ok(Response::new(ChunkHits { hits }))
    }

    async fn tagged_documents(&self, req: Request<TaggedDocumentsRequest>) -> Result<Response<ChunkHits>, Status> {
        let r = req.into_inner();
        if r.filters.as_ref().is_none_or(|f| f.tags.is_empty()) {
            return Err(StoreError::Invalid("filters.tags must name at least one tag".into()).into());
        }
        let filter = Filter::new(r.filters.as_ref())?;
        let limit = validate_limit("limit", r.limit)?;
        if r.after_path.len() > MAX_PATH_BYTES || r.after_kb.len() > 64 {
            return Err(StoreError::Invalid("after_kb or after_path is too long".into()).into());
        }
        let hits = self
            .db
            .read_now(move |c| {
                let mut st = c.prepare_cached(&format!(
                    "SELECT coalesce(c.id, 0), d.kb, d.path, coalesce(c.heading_path, '[]'),
                            coalesce(c.line_start, 1), coalesce(c.line_end, 1), coalesce(c.text, ''),
                            d.title, d.tags_json, d.mtime_ms, coalesce(c.ordinal, 0)
                     FROM kb_documents d LEFT JOIN kb_chunks c ON c.document = d.id AND c.ordinal = 0
                     WHERE {FILTER_SQL} AND d.error = '' AND (d.kb > ?5 OR (d.kb = ?5 AND d.path > ?6))
                     ORDER BY d.kb, d.path LIMIT ?7"
                ))?;
                let rows = st.query_map(
                    params![
                        filter.kb_json,
                        filter.prefix,
                        filter.tags_json,
                        filter.after,
                        r.after_kb,
                        r.after_path,
                        limit
                    ],
                    |row| Ok(ChunkHit { chunk: Some(chunk_at(row)?), score: 0.0, lines: vec![] }),
                )?;
                Ok(rows.collect::<Result<Vec<_>, _>>()?)
            })
            .await?;
        Ok(Response::new(ChunkHits { hits }))
    }

    async fn vector_query(&self, req: Request<VectorQueryRequest>) -> Result<Response<ChunkHits>, Status> {
        let r = req.into_inner();
        let filter = Filter::new(r.filters.as_ref())?;
        let limit = validate_limit("limit", r.limit)?;
        let vectors = self.vectors.clone();
        let hits = self
            .db
            .read_now(move |c| {
                let (_, dimension) = vector_config(c)?.ok_or_else(not_configured)?;
                validate_vector("embedding", &r.embedding, dimension)?;
                match vectors.nearest(c, &r.embedding, &filter, limit)? {
                    Some(candidates) => candidate_hits(c, candidates, limit),
                    None => vector_query(c, &i8_blob(&stored_i8(&r.embedding)), &filter, limit),
                }
            })
            .await?;
        Ok(Response::new(ChunkHits { hits }))
    }

    async fn locate_lines(&self, req: Request<LocateLinesRequest>) -> Result<Response<ChunkHits>, Status> {
        let r = req.into_inner();
        if r.lines.len() > MAX_LINES {
            return Err(Status::invalid_argument(format!("lines has {} entries; at most {MAX_LINES}", r.lines.len())));
        }
        for (i, l) in r.lines.iter().enumerate() {
            validate_kb_name(&format!("lines[{i}].kb"), &l.kb)?;
            validate_path(&format!("lines[{i}].path"), &l.path)?;
        }
        let filter = Filter::new(r.filters.as_ref())?;
        let hits = self.db.read_now(move |c| locate_lines(c, &r.lines, &filter)).await?;
        Ok(Response::new(ChunkHits { hits }))
    }

    async fn get_chunks(&self, req: Request<GetChunksRequest>) -> Result<Response<ChunkHits>, Status> {
        let ids = req.into_inner().ids;
        if ids.len() > MAX_IDS {
            return Err(Status::invalid_argument(format!("ids has {} entries; at most {MAX_IDS}", ids.len())));
        }
        let hits = self
            .db
            .read(move |c| {
                let mut st = c.prepare_cached(&format!(
                    "SELECT {CHUNK_COLS} FROM kb_chunks c JOIN kb_documents d ON d.id = c.document WHERE c.id = ?1"
                ))?;
                let mut hits = Vec::with_capacity(ids.len());
                for id in ids {
                    if let Some(chunk) = st.query_row([id], chunk_at).optional()? {
                        hits.push(ChunkHit { chunk: Some(chunk), score: 0.0, lines: vec![] });
                    }
                }
                Ok(hits)
            })
            .await?;
        Ok(Response::new(ChunkHits { hits }))
    }

    async fn configure_vectors(
        &self,
        req: Request<ConfigureVectorsRequest>,
    ) -> Result<Response<ConfigureVectorsReply>, Status> {
        let r = req.into_inner();
        if r.model.is_empty() || r.model.len() > 256 || r.model.contains('\0') {
            return Err(Status::invalid_argument("model must be 1-256 bytes without NUL"));
        }
        if r.dimension == 0 || r.dimension > MAX_DIMENSION {
            return Err(Status::invalid_argument(format!("dimension must be 1-{MAX_DIMENSION}, not {}", r.dimension)));
        }
        let reply = self.write_vectors(move |t, vc| configure_vectors(t, vc, &r.model, r.dimension)).await?;
        Ok(Response::new(reply))
    }

    async fn pending_embeddings(&self, req: Request<PendingEmbeddingsRequest>) -> Result<Response<ChunkHits>, Status> {
        let limit = validate_limit("limit", req.into_inner().limit)?;
        let hits = self
            .db
            .read(move |c| {
                vector_config(c)?.ok_or_else(not_configured)?;
                let mut st = c.prepare_cached(&format!(
                    "SELECT {CHUNK_COLS} FROM kb_chunks c CROSS JOIN kb_documents d
                     WHERE c.embedded = 0 AND d.id = c.document ORDER BY c.id LIMIT ?1"
                ))?;
                let rows =
                    st.query_map([limit], |r| Ok(ChunkHit { chunk: Some(chunk_at(r)?), score: 0.0, lines: vec![] }))?;
                Ok(rows.collect::<Result<Vec<_>, _>>()?)
            })
            .await?;
        Ok(Response::new(ChunkHits { hits }))
    }

    async fn put_embeddings(&self, req: Request<PutEmbeddingsRequest>) -> Result<Response<PutEmbeddingsReply>, Status> {
        let r = req.into_inner();
        for (i, e) in r.embeddings.iter().enumerate() {
            // Shape only; the dimension is checked against the configuration in the transaction.
            validate_vector(&format!("embeddings[{i}].vector"), &e.vector, e.vector.len() as u32)?;
        }
        let reply = self.write_vectors(move |t, vc| put_embeddings(t, vc, &r)).await?;
        Ok(Response::new(reply))
    }

    async fn note_links(&self, req: Request<NoteLinksRequest>) -> Result<Response<NoteLinksReply>, Status> {
        let r = req.into_inner();
        validate_kb_name("kb", &r.kb)?;
        validate_path("path", &r.path)?;
        let limit = match r.backlinks_limit {
            0 => DEFAULT_BACKLINKS,
            n => validate_limit("backlinks_limit", n)?,
        };
        let reply = self.db.read(move |c| note_links(c, &r.kb, &r.path, limit)).await?;
        Ok(Response::new(reply))
    }

    async fn set_knowledge_base_writable(
        &self,
        req: Request<SetKnowledgeBaseWritableRequest>,
    ) -> Result<Response<KnowledgeBase>, Status> {
        let r = req.into_inner();
        validate_kb_name("name", &r.name)?;
        let (kb, _) = self
            .db
            .write(move |t, _| {
                require_kb(t, &r.name)?;
                t.execute("UPDATE kb_knowledge_bases SET writable = ?2 WHERE name = ?1", params![r.name, r.writable])?;
                Ok(get_kb(t, &r.name)?.expect("checked"))
            })
            .await?;
        Ok(Response::new(kb))
    }

    async fn stats(&self, req: Request<StatsRequest>) -> Result<Response<StatsReply>, Status> {
        let kb = req.into_inner().kb;
        if !kb.is_empty() {
            validate_kb_name("kb", &kb)?;
        }
        let cached = *self.index_bytes.lock().expect("index bytes");
        let cache = self.index_bytes.clone();
        let reply = self
            .db
            .read(move |c| {
                // What the index holds, cheaply: a measure is reused while this is unchanged, and
                // for INDEX_BYTES_TTL after a change (a pass writes continuously).
                let key: (i64, i64) = c.query_row(
                    "SELECT COALESCE((SELECT MAX(id) FROM kb_chunks), 0), COALESCE((SELECT SUM(size) FROM kb_documents), 0)",
                    [],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )?;
                let index = match cached {
                    Some((at, k, bytes)) if k == key || at.elapsed() < INDEX_BYTES_TTL => bytes,
                    _ => {
                        let bytes = index_tables_bytes(c)?;
                        *cache.lock().expect("index bytes") = Some((std::time::Instant::now(), key, bytes));
                        bytes
                    }
                };
                stats(c, &kb, index)
            })
            .await?;
        Ok(Response::new(reply))
    }
}

fn not_configured() -> StoreError {
    StoreError::Precondition("vectors are not configured: call ConfigureVectors first".into())
}

fn document_meta(r: &Row<'_>) -> rusqlite::Result<DocumentMeta> {
    Ok(DocumentMeta {
        kb: r.get(0)?,
        path: r.get(1)?,
        mtime_ms: r.get(2)?,
        size: r.get::<_, i64>(3)? as u64,
        hash: r.get(4)?,
        chunks: r.get(5)?,
        error: r.get(6)?,
        indexed_ms: r.get(7)?,
        title: r.get(8)?,
        tags: serde_json::from_str(&r.get::<_, String>(9)?).unwrap_or_default(),
    })
}

/// `ConfigureVectors` inside the writer's transaction: the same model and dimension are a no-op;
/// anything else drops every vector and recreates `kb_vectors`.
fn configure_vectors(
    t: &Connection,
    vc: &Vectors,
    model: &str,
    dimension: u32,
) -> Result<ConfigureVectorsReply, StoreError> {
    let current = vector_config(t)?;
    if current.as_ref().is_some_and(|(m, d)| m == model && *d == dimension) {
        return Ok(ConfigureVectorsReply { reset: false, dropped: 0 });
    }
    let dropped: u64 = if current.is_some() {
        t.query_row("SELECT COUNT(*) FROM kb_chunks WHERE embedded = 1", [], |r| r.get::<_, i64>(0))? as u64
    } else {
        0
    };
    t.execute_batch("DROP TABLE IF EXISTS kb_vectors")?;
    t.execute_batch(&vectors_ddl(dimension))?;
    t.execute("UPDATE kb_chunks SET embedded = 0 WHERE embedded = 1", [])?;
    t.execute(
        "INSERT INTO kb_vector_config (id, model, dimension) VALUES (1, ?1, ?2)
         ON CONFLICT (id) DO UPDATE SET model = excluded.model, dimension = excluded.dimension",
        params![model, dimension],
    )?;
    vc.reset(dimension as usize);
    Ok(ConfigureVectorsReply { reset: true, dropped })
}

/// `PutEmbeddings` inside the writer's transaction.
fn put_embeddings(t: &Connection, vc: &Vectors, r: &PutEmbeddingsRequest) -> Result<PutEmbeddingsReply, StoreError> {
    let (model, dimension) = vector_config(t)?.ok_or_else(not_configured)?;
    if r.model != model || r.dimension != dimension {
        return Err(StoreError::Aborted(format!(
            "vectors are configured for model {:?} with dimension {dimension}; these are for {:?} with dimension {} \
             (the configuration changed: embed again)",
            truncate(&model, 80),
            truncate(&r.model, 80),
            r.dimension
        )));
    }
    for (i, e) in r.embeddings.iter().enumerate() {
        validate_vector(&format!("embeddings[{i}].vector"), &e.vector, dimension)?;
    }
    let mut exists = t.prepare_cached("SELECT embedded FROM kb_chunks WHERE id = ?1")?;
    let mut del = t.prepare_cached("DELETE FROM kb_vectors WHERE chunk_id = ?1")?;
    let mut ins = t.prepare_cached("INSERT INTO kb_vectors (chunk_id, embedding) VALUES (?1, vec_int8(?2))")?;
    let mut mark = t.prepare_cached("UPDATE kb_chunks SET embedded = 1 WHERE id = ?1")?;
    let mut reply = PutEmbeddingsReply::default();
    for e in &r.embeddings {
        let Some(embedded) = exists.query_row([e.chunk_id], |row| row.get::<_, i64>(0)).optional()? else {
            reply.skipped += 1;
            continue;
        };
        if embedded != 0 {
            del.execute([e.chunk_id])?;
        }
        ins.execute(params![e.chunk_id, i8_blob(&stored_i8(&e.vector))])?;
        mark.execute([e.chunk_id])?;
        vc.put(e.chunk_id, &e.vector);
        reply.stored += 1;
    }
    Ok(reply)
}

/// `Stats` on a reader: per KB (or only `kb`), counts and the documents with an error.
/// `Stats` of one KB or all (`kb` empty). `index_bytes` is the size of the index tables
/// ([`index_tables_bytes`]); each KB's `index_bytes` is its share of them by corpus bytes (the
/// tables hold every KB's rows together, so a KB's own share is estimated, not measured).
fn stats(c: &Connection, kb: &str, index_bytes: u64) -> Result<StatsReply, StoreError> {
    if !kb.is_empty() {
        require_kb(c, kb)?;
    }
    let mut per_kb = c.prepare_cached(
        "SELECT k.name, COUNT(d.id), COALESCE(SUM(d.chunk_count), 0), COALESCE(MAX(d.indexed_ms), 0),
                COALESCE(SUM(d.size), 0)
         FROM kb_knowledge_bases k LEFT JOIN kb_documents d ON d.kb = k.name
         WHERE ?1 = '' OR k.name = ?1 GROUP BY k.name ORDER BY k.name",
    )?;
    let all_corpus: i64 = c.query_row("SELECT COALESCE(SUM(size), 0) FROM kb_documents", [], |r| r.get(0))?;
    // Chunks without a vector, through the partial index (few once embedding has caught up).
    let mut pending = c.prepare_cached(
        "SELECT COUNT(*) FROM kb_chunks c INDEXED BY kb_chunks_pending CROSS JOIN kb_documents d
         WHERE c.embedded = 0 AND d.id = c.document AND d.kb = ?1",
    )?;
    let vectors = vector_config(c)?;
    let mut errors = c.prepare_cached(
        "SELECT kb, path, mtime_ms, size, hash, chunk_count, error, indexed_ms, title, tags_json
         FROM kb_documents WHERE kb = ?1 AND error <> '' ORDER BY path",
    )?;
    let rows = per_kb.query_map([kb], |r| {
        Ok(KnowledgeBaseStats {
            kb: r.get(0)?,
            documents: r.get::<_, i64>(1)? as u64,
            chunks: r.get::<_, i64>(2)? as u64,
            embedded: 0,
            last_indexed_ms: r.get(3)?,
            errors: vec![],
            corpus_bytes: r.get::<_, i64>(4)? as u64,
            index_bytes: 0,
        })
    })?;
    let mut knowledge_bases = rows.collect::<Result<Vec<_>, _>>()?;
    for s in &mut knowledge_bases {
        if vectors.is_some() {
            s.embedded = s.chunks.saturating_sub(pending.query_row([&s.kb], |r| r.get::<_, i64>(0))? as u64);
        }
        s.errors = errors.query_map([&s.kb], document_meta)?.collect::<Result<_, _>>()?;
        if all_corpus > 0 {
            s.index_bytes = (index_bytes as f64 * s.corpus_bytes as f64 / all_corpus as f64).round() as u64;
        }
    }
    let (vector_model, vector_dimension) = vectors.unwrap_or_default();
    Ok(StatsReply { knowledge_bases, vector_model, vector_dimension })
}

#[cfg(test)]
mod tests {
    use super::*;
    use coffer_proto::store::index_client::IndexClient;
    use coffer_proto::store::index_server::IndexServer;
    use tonic::transport::Channel;

    /// The Index service over a fresh `coffer.db` in a temp dir, served on loopback, and a
    /// client of it.
    struct Served {
        db: Db,
        client: IndexClient<Channel>,
        _dir: tempfile::TempDir,
    }

    async fn serve() -> Served {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("coffer.db")).unwrap();
        let mut s = serve_db(db, dir).await;
        for name in ["notes", "work"] {
            s.client
                .create_knowledge_base(KnowledgeBase {
                    name: name.into(),
                    kind: KnowledgeBaseKind::Folder.into(),
                    root: format!("/tmp/{name}"),
                    ..Default::default()
                })
                .await
                .unwrap();
        }
        s
    }

    /// The Index service over `db` (in `dir`), served on loopback, and a client of it.
    async fn serve_db(db: Db, dir: tempfile::TempDir) -> Served {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let svc = IndexServer::new(IndexService::new(db.clone())).max_decoding_message_size(MAX_DECODING_MESSAGE_SIZE);
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap().connect_lazy();
        let client = IndexClient::new(channel).max_decoding_message_size(MAX_DECODING_MESSAGE_SIZE);
        Served { db, client, _dir: dir }
    }

    /// A chunk whose text, hash and index body are `body` (headings `h`).
    fn chunk(h: &[&str], lines: (u32, u32), body: &str) -> ChunkInput {
        ChunkInput {
            heading_path: h.iter().map(|s| s.to_string()).collect(),
            line_start: lines.0,
            line_end: lines.1,
            hash: hex::encode(Sha256::digest(body.as_bytes())),
            text: body.into(),
            index_title: String::new(),
            index_headings: h.join(" "),
            index_body: body.into(),
        }
    }

    fn doc(kb: &str, path: &str, chunks: Vec<ChunkInput>) -> UpsertDocumentRequest {
        UpsertDocumentRequest {
            kb: kb.into(),
            path: path.into(),
            mtime_ms: 1_000,
            size: 10,
            hash: "h".into(),
            title: path.into(),
            tags: vec![],
            chunks,
            kb_created_ms: 0,
            links: vec![],
            aliases: vec![],
        }
    }

    fn link(target: &str, line: u32) -> NoteLink {
        NoteLink { target: target.into(), line, ..Default::default() }
    }

    /// A note with `links` and `aliases`.
    fn note(kb: &str, path: &str, links: Vec<NoteLink>, aliases: &[&str]) -> UpsertDocumentRequest {
        UpsertDocumentRequest {
            links,
            aliases: aliases.iter().map(|s| s.to_string()).collect(),
            ..doc(kb, path, vec![chunk(&[], (1, 1), path)])
        }
    }

    impl Served {
        async fn links_of(&mut self, kb: &str, path: &str) -> (Vec<(String, String)>, Vec<(String, u32)>) {
            let r = self
                .client
                .note_links(NoteLinksRequest { kb: kb.into(), path: path.into(), backlinks_limit: 0 })
                .await
                .unwrap()
                .into_inner();
            (
                r.links.into_iter().map(|l| (l.link.unwrap().target, l.resolved_path)).collect(),
                r.backlinks.into_iter().map(|b| (b.path, b.line)).collect(),
            )
        }
    }

    #[tokio::test]
    async fn backlinks_are_one_per_distinct_link_with_heading_and_embed() {
        let mut s = serve().await;
        s.upsert(note("notes", "Coffer.md", vec![], &[])).await;
        let heading = NoteLink { fragment: "Roadmap".into(), ..link("Coffer", 2) };
        let embed = NoteLink { embed: true, ..link("Coffer", 2) };
        let aliased = NoteLink { alias: "the app".into(), ..link("Coffer", 2) };
        let links = vec![link("Coffer", 2), link("Coffer", 2), heading, embed, aliased, link("Coffer", 3)];
        s.upsert(note("notes", "Daily.md", links, &[])).await;
        let r = s
            .client
            .note_links(NoteLinksRequest { kb: "notes".into(), path: "Coffer.md".into(), backlinks_limit: 0 })
            .await
            .unwrap()
            .into_inner();
        let got: Vec<(u32, &str, &str, bool)> =
            r.backlinks.iter().map(|b| (b.line, b.fragment.as_str(), b.alias.as_str(), b.embed)).collect();
        assert_eq!(
            got,
            [
                (2, "", "", false),
                (2, "Roadmap", "", false),
                (2, "", "", true),
                (2, "", "the app", false),
                (3, "", "", false)
            ]
        );
    }

    #[tokio::test]
    async fn links_resolve_by_name_then_alias_then_path_and_backlinks_follow_the_notes() {
        let mut s = serve().await;
        s.upsert(note("notes", "Projects/Coffer.md", vec![link("Roadmap", 3)], &["The Vault"])).await;
        s.upsert(note("notes", "Roadmap.md", vec![], &[])).await;
        s.upsert(note("notes", "deep/a/Roadmap.md", vec![], &[])).await;
        s.upsert(note(
            "notes",
            "Daily/today.md",
            vec![
                link("coffer", 2),
                link("The Vault", 4),
                link("projects/coffer.md", 5),
                link("Nowhere", 6),
                link("", 7),
            ],
            &[],
        ))
        .await;
        // The same names in another KB never resolve here.
        s.upsert(note("work", "Coffer.md", vec![link("Coffer", 1)], &[])).await;
        let (links, back) = s.links_of("notes", "Daily/today.md").await;
        assert_eq!(
            links,
            [
                ("coffer".into(), "Projects/Coffer.md".into()),
                ("The Vault".into(), "Projects/Coffer.md".into()),
                ("projects/coffer.md".into(), "Projects/Coffer.md".into()),
                ("Nowhere".into(), String::new()),
                (String::new(), String::new()),
            ]
        );
        assert!(back.is_empty());
        let (_, back) = s.links_of("notes", "Projects/Coffer.md").await;
        assert_eq!(back, [("Daily/today.md".into(), 2), ("Daily/today.md".into(), 4), ("Daily/today.md".into(), 5)]);
        // Two notes named Roadmap: the shortest path wins, the other has no backlink by name.
        let (links, _) = s.links_of("notes", "Projects/Coffer.md").await;
        assert_eq!(links, [("Roadmap".into(), "Roadmap.md".into())]);
        assert_eq!(s.links_of("notes", "Roadmap.md").await.1, [("Projects/Coffer.md".into(), 3)]);
        assert!(s.links_of("notes", "deep/a/Roadmap.md").await.1.is_empty());
        // A name beats an alias: a note named "The Vault" takes the alias's links.
        s.upsert(note("notes", "The Vault.md", vec![], &[])).await;
        assert_eq!(s.links_of("notes", "The Vault.md").await.1, [("Daily/today.md".into(), 4)]);
        assert_eq!(s.links_of("notes", "Projects/Coffer.md").await.1.len(), 2);
        // An edit replaces the note's links; a removed note takes its links and names along.
        s.upsert(note("notes", "Daily/today.md", vec![link("Roadmap", 9)], &[])).await;
        assert!(s.links_of("notes", "Projects/Coffer.md").await.1.is_empty());
        s.client.delete_document(DocumentRef { kb: "notes".into(), path: "Daily/today.md".into() }).await.unwrap();
        assert_eq!(s.links_of("notes", "Roadmap.md").await.1, [("Projects/Coffer.md".into(), 3)]);
        s.client.delete_document(DocumentRef { kb: "notes".into(), path: "Roadmap.md".into() }).await.unwrap();
        assert_eq!(
            s.links_of("notes", "deep/a/Roadmap.md").await.1,
            [("Projects/Coffer.md".into(), 3)],
            "the other Roadmap now"
        );
        let c =
            s.db.read(|c| Ok(c.query_row("SELECT count(*) FROM kb_links", [], |r| r.get::<_, i64>(0))?)).await.unwrap();
        assert_eq!(c, 2, "only the links of the notes still there");
        // Unknown note and KB: NOT_FOUND; a bad path: INVALID_ARGUMENT.
        let e = s
            .client
            .note_links(NoteLinksRequest { kb: "notes".into(), path: "absent.md".into(), backlinks_limit: 0 })
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::NotFound);
        let e = s
            .client
            .note_links(NoteLinksRequest { kb: "notes".into(), path: "../x.md".into(), backlinks_limit: 0 })
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        // Too many links is refused whole.
        let many = (0..=MAX_LINKS as u32).map(|i| link("x", i)).collect();
        let e = s.client.upsert_document(note("notes", "many.md", many, &[])).await.unwrap_err();
        assert!(e.message().contains("links"), "{e}");
        // A KB marked writable says so; the mark survives in the definition.
        let kb = s
            .client
            .set_knowledge_base_writable(SetKnowledgeBaseWritableRequest { name: "work".into(), writable: true })
            .await
            .unwrap()
            .into_inner();
        assert!(kb.writable);
        let again = s.client.get_knowledge_base(KnowledgeBaseRef { name: "work".into() }).await.unwrap().into_inner();
        assert!(again.writable);
    }

    fn kw(terms: &[&str], mode: MatchMode) -> KeywordQueryRequest {
        KeywordQueryRequest {
            terms: terms.iter().map(|s| s.to_string()).collect(),
            mode: mode.into(),
            filters: None,
            limit: 10,
            one_per_document: false,
        }
    }

    impl Served {
        async fn upsert(&mut self, r: UpsertDocumentRequest) -> UpsertDocumentReply {
            self.client.upsert_document(r).await.unwrap().into_inner()
        }

        async fn keyword(&mut self, r: KeywordQueryRequest) -> Vec<(String, u32)> {
            let hits = self.client.keyword_query(r).await.unwrap().into_inner().hits;
            hits.into_iter().map(|h| h.chunk.map(|c| (c.path, c.ordinal)).unwrap()).collect()
        }

        /// (chunks, FTS rows, vectors, tag rows, documents) in the whole database.
        async fn counts(&self) -> (i64, i64, i64, i64, i64) {
            self.db
                .read(|c| {
                    let n = |sql: &str| c.query_row(sql, [], |r| r.get::<_, i64>(0));
                    let vectors = if vector_config(c)?.is_some() { n("SELECT COUNT(*) FROM kb_vectors")? } else { 0 };
                    Ok((
                        n("SELECT COUNT(*) FROM kb_chunks")?,
                        n("SELECT COUNT(*) FROM kb_fts_docsize")?,
                        vectors,
                        n("SELECT COUNT(*) FROM kb_document_tags")?,
                        n("SELECT COUNT(*) FROM kb_documents")?,
                    ))
                })
                .await
                .unwrap()
        }

        /// (id, ordinal, line_start) of a document's chunks, in order.
        async fn chunk_ids(&self, kb: &str, path: &str) -> Vec<(i64, i64, i64)> {
            let (kb, path) = (kb.to_owned(), path.to_owned());
            self.db
                .read(move |c| {
                    let mut st = c.prepare(
                        "SELECT c.id, c.ordinal, c.line_start FROM kb_chunks c JOIN kb_documents d ON d.id = c.document
                         WHERE d.kb = ?1 AND d.path = ?2 ORDER BY c.ordinal",
                    )?;
                    let rows = st.query_map([kb, path], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
                    Ok(rows.collect::<Result<Vec<_>, _>>()?)
                })
                .await
                .unwrap()
        }
    }

    /// bm25 scores of `terms` (any term) as (path, ordinal, score).
    async fn scores(s: &mut Served, terms: &[&str]) -> Vec<(String, u32, f64)> {
        let hits = s.client.keyword_query(kw(terms, MatchMode::Any)).await.unwrap().into_inner().hits;
        hits.into_iter().map(|h| h.chunk.map(|c| (c.path, c.ordinal, h.score)).unwrap()).collect()
    }

    /// Deleted and replaced rows leave nothing in bm25's statistics (document count, average
    /// length, term frequencies): after edits and deletes the scores are those of an index built
    /// fresh from the final documents — what makes a clean rebuild answer identically.
    #[tokio::test]
    async fn scores_after_edits_and_deletes_equal_a_fresh_index_s() {
        let finals = [
            doc(
                "notes",
                "a.md",
                vec![chunk(&["A"], (1, 2), "apple banana"), chunk(&["A", "B"], (3, 4), "cherry apple")],
            ),
            doc("notes", "b.md", vec![chunk(&["C"], (1, 3), "apple kiwi lemon mango")]),
        ];
        let mut edited = serve().await;
        edited.upsert(doc("notes", "a.md", vec![chunk(&["A"], (1, 9), &"apple filler ".repeat(40))])).await;
        edited.upsert(doc("notes", "gone.md", vec![chunk(&["G"], (1, 2), "apple apple apple pear")])).await;
        for d in &finals {
            edited.upsert(d.clone()).await;
        }
        let gone = DocumentRef { kb: "notes".into(), path: "gone.md".into() };
        edited.client.delete_document(gone).await.unwrap();
        let mut fresh = serve().await;
        for d in &finals {
            fresh.upsert(d.clone()).await;
        }
        let want = scores(&mut fresh, &["apple", "kiwi"]).await;
        assert_eq!(want.len(), 3, "{want:?}");
        assert_eq!(scores(&mut edited, &["apple", "kiwi"]).await, want);
    }

    /// A chunk of CJK text as coffer-retrieval sends it: `index_*` hold its runs as bigrams
    /// (`pairs`: the text's bigram form), under headings `h` (`h_pairs` likewise) and a
    /// document title whose index form is `title`.
    fn cjk_chunk(h: &[&str], h_pairs: &str, lines: (u32, u32), text: &str, pairs: &str, title: &str) -> ChunkInput {
        ChunkInput {
            index_title: title.into(),
            index_headings: h_pairs.into(),
            index_body: pairs.into(),
            text: text.into(),
            hash: hex::encode(Sha256::digest(text.as_bytes())),
            ..chunk(h, lines, "")
        }
    }

    /// A document titled `title` whose chunks' index title is `index_title`.
    fn titled(path: &str, title: &str, index_title: &str, chunks: Vec<ChunkInput>) -> UpsertDocumentRequest {
        let chunks = chunks.into_iter().map(|c| ChunkInput { index_title: index_title.into(), ..c }).collect();
        UpsertDocumentRequest { title: title.into(), ..doc("notes", path, chunks) }
    }

    /// The final documents of the CJK and title tests: CJK text, headings and title; a chunk
    /// with an index title of its own; a heading with JSON escapes; plain English.
    fn cjk_finals() -> Vec<UpsertDocumentRequest> {
        let zh = cjk_chunk(&["机器学习"], "机器 器学 学习", (1, 3), "机器学习 apple", "机器 器学 学习 apple", "");
        let zh2 = ChunkInput {
            index_title: "数据 据库 其他".into(),
            ..cjk_chunk(
                &["机器学习", "深度"],
                "机器 器学 学习 深度",
                (4, 6),
                "深度学习 kiwi",
                "深度 度学 学习 kiwi",
                "",
            )
        };
        let quoted = chunk(&["He said \"hi\" \\ there"], (1, 2), "apple cherry");
        vec![
            UpsertDocumentRequest {
                chunks: vec![ChunkInput { index_title: "数据 据库 notes".into(), ..zh }, zh2],
                ..titled("zh.md", "数据库 notes", "", vec![])
            },
            titled("en.md", "Apple Pie", "apple pie", vec![chunk(&["Recipe"], (1, 4), "apple pie, with kiwi")]),
            titled("q.md", "Quoted", "quoted", vec![quoted]),
        ]
    }

    impl Served {
        /// FTS5's `integrity-check` of `kb_fts` with rank 1: the index holds exactly the tokens of
        /// the text `kb_fts_source` gives back for every row.
        async fn fts_integrity(&self) {
            self.db
                .write(|t, _| Ok(t.execute("INSERT INTO kb_fts (kb_fts, rank) VALUES ('integrity-check', 1)", [])?))
                .await
                .unwrap();
        }

        /// How many (chunks store their index body, their index headings, their own index title;
        /// documents store their index title).
        async fn stored_index_text(&self) -> (i64, i64, i64, i64) {
            self.db
                .read(|c| {
                    Ok(c.query_row(
                        "SELECT count(index_body), count(index_headings), count(index_title),
                                (SELECT count(index_title) FROM kb_documents) FROM kb_chunks",
                        [],
                        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
                    )?)
                })
                .await
                .unwrap()
        }
    }

    const CJK_TERMS: [&str; 7] = ["机器", "学习", "数据", "其他", "apple", "kiwi", "hi"];

    /// With CJK text (indexed as bigrams, not as FTS5 would split the raw text) and title
    /// changes, FTS5 still removes exactly what it indexed: after inserts, edits, title changes,
    /// error marks and deletes, the scores are a fresh index's and `integrity-check` passes at
    /// every step; the normalized text is stored only where it tokenizes otherwise than the raw.
    #[tokio::test]
    async fn cjk_text_and_title_changes_score_as_a_fresh_index_and_stay_intact() {
        let finals = cjk_finals();
        let mut edited = serve().await;
        // Earlier versions: another title (bigrams too), other chunks, a document that goes.
        let mut old_zh = finals[0].clone();
        old_zh.title = "旧标题".into();
        for c in &mut old_zh.chunks {
            c.index_title = "旧标 标题".into();
        }
        edited.upsert(old_zh).await;
        edited.fts_integrity().await;
        edited.upsert(titled("en.md", "Old", "old", vec![chunk(&["Recipe"], (1, 4), "apple pie, with kiwi")])).await;
        edited.upsert(titled("en.md", "Old", "old", vec![chunk(&[], (1, 9), &"apple filler ".repeat(30))])).await;
        edited
            .upsert(titled(
                "gone.md",
                "走了",
                "走了",
                vec![cjk_chunk(&[], "", (1, 1), "机器学习机器", "机器 器学 学习 习机 机器", "走了")],
            ))
            .await;
        edited.fts_integrity().await;
        edited
            .upsert(titled("err.md", "错误", "错误", vec![cjk_chunk(&[], "", (1, 1), "数据库", "数据 据库", "错误")]))
            .await;
        let mark = MarkDocumentErrorRequest {
            kb: "notes".into(),
            path: "err.md".into(),
            mtime_ms: 5,
            size: 9,
            error: "unreadable".into(),
            kb_created_ms: 0,
        };
        edited.client.mark_document_error(mark).await.unwrap();
        for d in &finals {
            let r = edited.upsert(d.clone()).await;
            edited.fts_integrity().await;
            if d.path == "zh.md" {
                assert_eq!((r.kept, r.added, r.removed), (2, 0, 0), "a new title keeps the chunks");
            }
        }
        let gone = DocumentRef { kb: "notes".into(), path: "gone.md".into() };
        edited.client.delete_document(gone).await.unwrap();
        edited.fts_integrity().await;

        let mut fresh = serve().await;
        for d in &finals {
            fresh.upsert(d.clone()).await;
        }
        fresh.fts_integrity().await;
        let want = scores(&mut fresh, &CJK_TERMS).await;
        assert_eq!(want.len(), 4, "{want:?}");
        assert_eq!(scores(&mut edited, &CJK_TERMS).await, want);
        assert!(edited.keyword(kw(&["标题"], MatchMode::Any)).await.is_empty(), "the old title is gone");
        assert!(edited.keyword(kw(&["走了"], MatchMode::Any)).await.is_empty());
        assert_eq!(edited.keyword(kw(&["其他"], MatchMode::Any)).await, [("zh.md".into(), 1)]);
        // Stored: both CJK bodies and headings, zh.md's index title and its second chunk's own,
        // and err.md's nothing (no chunks); no English text twice, the escaped heading neither.
        assert_eq!(edited.stored_index_text().await, (2, 2, 1, 1));
        assert_eq!(fresh.stored_index_text().await, (2, 2, 1, 1));
    }

    /// A chunk without an index title of its own reads its document's: when the document's
    /// changes (here its first chunk's index title) the FTS row of every kept chunk is rewritten,
    /// even one whose own index text did not change (it then stores its own title).
    #[tokio::test]
    async fn a_kept_chunk_reading_its_document_s_title_follows_a_new_title() {
        let two = |title: &str, first: &str, second: &str| {
            let mut d = titled("two.md", title, "", vec![chunk(&[], (1, 1), "one"), chunk(&[], (2, 2), "two")]);
            d.chunks[0].index_title = first.into();
            d.chunks[1].index_title = second.into();
            d
        };
        let mut edited = serve().await;
        edited.upsert(two("Alpha", "alpha", "alpha")).await;
        assert_eq!(edited.stored_index_text().await, (0, 0, 0, 0), "both chunks read the title");
        let r = edited.upsert(two("Bravo", "bravo", "alpha")).await;
        assert_eq!((r.kept, r.added, r.removed), (2, 0, 0));
        edited.fts_integrity().await;
        assert_eq!(edited.stored_index_text().await, (0, 0, 1, 0), "the second chunk keeps its own title");
        let mut fresh = serve().await;
        fresh.upsert(two("Bravo", "bravo", "alpha")).await;
        let want = scores(&mut fresh, &["alpha", "bravo", "one"]).await;
        assert_eq!(want.len(), 2, "{want:?}");
        assert_eq!(scores(&mut edited, &["alpha", "bravo", "one"]).await, want);
        edited.client.delete_document(DocumentRef { kb: "notes".into(), path: "two.md".into() }).await.unwrap();
        edited.fts_integrity().await;
        assert_eq!(edited.counts().await, (0, 0, 0, 0, 0));
    }

    /// A database written by the store of schema 0020 (`kb_fts` holding its own copy of the
    /// text, CJK as bigrams, rows deleted) converts at open: the same scores as an index built
    /// fresh, `integrity-check` passes, the text that tokenizes as the raw text is dropped, and
    /// the index keeps working through edits and deletes.
    #[tokio::test]
    async fn an_index_of_schema_0020_converts_and_scores_as_before() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("coffer.db");
        let finals = cjk_finals();
        {
            // The old store's writes, as SQL.
            #[allow(clippy::disallowed_methods)]
            let mut c = Connection::open(&path).unwrap();
            crate::db::migrations_of(&crate::db::MIGRATIONS[..20]).to_latest(&mut c).unwrap();
            c.execute(
                "INSERT INTO kb_knowledge_bases (name, kind, root, created_ms) VALUES ('notes', 'folder', '/tmp/notes', 1)",
                [],
            )
            .unwrap();
            let gone = titled(
                "gone.md",
                "走了",
                "走了",
                vec![cjk_chunk(&[], "", (1, 1), "机器学习", "机器 器学 学习", "走了")],
            );
            for d in finals.iter().chain([&gone]) {
                c.execute(
                    "INSERT INTO kb_documents (kb, path, mtime_ms, size, hash, title, indexed_ms, chunk_count)
                     VALUES (?1, ?2, 1, 1, 'h', ?3, 1, ?4)",
                    params![d.kb, d.path, d.title, d.chunks.len() as i64],
                )
                .unwrap();
                let doc = c.last_insert_rowid();
                for (i, ch) in d.chunks.iter().enumerate() {
                    c.execute(
                        "INSERT INTO kb_chunks (document, ordinal, heading_path, line_start, line_end, hash, index_hash, text)
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                        params![
                            doc,
                            i as i64,
                            serde_json::to_string(&ch.heading_path).unwrap(),
                            ch.line_start,
                            ch.line_end,
                            ch.hash,
                            index_hash(ch),
                            ch.text
                        ],
                    )
                    .unwrap();
                    c.execute(
                        "INSERT INTO kb_fts (rowid, title, headings, body) VALUES (?1, ?2, ?3, ?4)",
                        params![c.last_insert_rowid(), ch.index_title, ch.index_headings, ch.index_body],
                    )
                    .unwrap();
                }
            }
            c.execute("DELETE FROM kb_fts WHERE rowid IN (SELECT c.id FROM kb_chunks c JOIN kb_documents d ON d.id = c.document WHERE d.path = 'gone.md')", []).unwrap();
            c.execute("DELETE FROM kb_documents WHERE path = 'gone.md'", []).unwrap();
        }
        let db = Db::open(&path).unwrap();
        let mut migrated = serve_db(db, dir).await;
        migrated.fts_integrity().await;
        let mut fresh = serve().await;
        for d in &finals {
            fresh.upsert(d.clone()).await;
        }
        let want = scores(&mut fresh, &CJK_TERMS).await;
        assert_eq!(want.len(), 4, "{want:?}");
        assert_eq!(scores(&mut migrated, &CJK_TERMS).await, want);
        assert_eq!(migrated.stored_index_text().await, fresh.stored_index_text().await);
        // Writes on the converted index: everything kept, then a new title, an edit and a
        // delete, as on the fresh one.
        for d in &finals {
            let r = migrated.upsert(d.clone()).await;
            assert_eq!((r.added, r.removed), (0, 0), "{}: the converted chunks are kept", d.path);
        }
        for s in [&mut migrated, &mut fresh] {
            let mut zh = finals[0].clone();
            zh.title = "新数据库".into();
            zh.chunks[0].index_title = "新数 数据 据库".into();
            s.upsert(zh).await;
            s.upsert(titled("en.md", "Apple Pie", "apple pie", vec![chunk(&["Recipe"], (1, 4), "apple crumble")]))
                .await;
            s.client.delete_document(DocumentRef { kb: "notes".into(), path: "q.md".into() }).await.unwrap();
            s.fts_integrity().await;
        }
        let want = scores(&mut fresh, &CJK_TERMS).await;
        assert_eq!(scores(&mut migrated, &CJK_TERMS).await, want);
        assert_eq!(migrated.counts().await.1, 3, "three FTS rows");
    }

    #[tokio::test]
    async fn upsert_keeps_unchanged_chunks_with_their_ids_and_vectors() {
        let mut s = serve().await;
        s.client.configure_vectors(ConfigureVectorsRequest { model: "m".into(), dimension: 2 }).await.unwrap();
        let a = chunk(&["A"], (1, 3), "alpha text");
        let b = chunk(&["B"], (4, 6), "bravo text");
        let c = chunk(&["C"], (7, 9), "charlie text");
        let r = s.upsert(doc("notes", "x.md", vec![a.clone(), b.clone(), c.clone()])).await;
        assert_eq!((r.kept, r.added, r.removed), (0, 3, 0));
        let before = s.chunk_ids("notes", "x.md").await;
        let embeddings =
            before.iter().map(|(id, ..)| Embedding { chunk_id: *id, vector: vec![1.0, *id as f32] }).collect();
        let put = PutEmbeddingsRequest { model: "m".into(), dimension: 2, embeddings };
        assert_eq!(s.client.put_embeddings(put).await.unwrap().into_inner().stored, 3);

        // A new chunk above, b changed, c moved down by two lines, a unchanged.
        let new = chunk(&["N"], (1, 2), "november text");
        let b2 = chunk(&["B"], (6, 8), "bravo changed");
        let c2 = ChunkInput { line_start: 9, line_end: 11, ..c.clone() };
        let a2 = ChunkInput { line_start: 3, line_end: 5, ..a.clone() };
        let r = s.upsert(doc("notes", "x.md", vec![new, a2, b2, c2])).await;
        assert_eq!((r.kept, r.added, r.removed), (2, 2, 1));
        let after = s.chunk_ids("notes", "x.md").await;
        assert_eq!(after.len(), 4);
        assert_eq!((after[1].0, after[1].1, after[1].2), (before[0].0, 1, 3), "a kept its id, moved");
        assert_eq!((after[3].0, after[3].1, after[3].2), (before[2].0, 3, 9), "c kept its id, moved");
        assert!(after[0].0 > before[2].0 && after[2].0 > before[2].0, "new chunks get new ids");
        // Vectors: a and c kept, b's gone; the two new ones pending.
        assert_eq!(s.counts().await, (4, 4, 2, 0, 1));
        let pending = s.client.pending_embeddings(PendingEmbeddingsRequest { limit: 10 }).await.unwrap().into_inner();
        let pending: Vec<i64> = pending.hits.iter().map(|h| h.chunk.as_ref().unwrap().id).collect();
        assert_eq!(pending, [after[0].0, after[2].0]);
        // The old text is no longer found; the new is, the kept is.
        assert!(s.keyword(kw(&["bravo", "text"], MatchMode::All)).await.is_empty());
        assert_eq!(s.keyword(kw(&["changed"], MatchMode::All)).await, [("x.md".into(), 2)]);
        assert_eq!(s.keyword(kw(&["charlie"], MatchMode::All)).await, [("x.md".into(), 3)]);

        // The same content again: everything kept, nothing written but the document row.
        let again = s
            .upsert(doc(
                "notes",
                "x.md",
                vec![
                    chunk(&["N"], (1, 2), "november text"),
                    ChunkInput { line_start: 3, line_end: 5, ..a.clone() },
                    chunk(&["B"], (6, 8), "bravo changed"),
                    ChunkInput { line_start: 9, line_end: 11, ..c.clone() },
                ],
            ))
            .await;
        assert_eq!((again.kept, again.added, again.removed), (4, 0, 0));
        assert_eq!(s.chunk_ids("notes", "x.md").await, after);

        // Same text under another heading is another chunk.
        let moved = ChunkInput { heading_path: vec!["Z".into()], ..a.clone() };
        let r = s.upsert(doc("notes", "x.md", vec![moved])).await;
        assert_eq!((r.kept, r.added, r.removed), (0, 1, 4));
        assert_eq!(s.counts().await, (1, 1, 0, 0, 1));
    }

    #[tokio::test]
    async fn a_new_title_rewrites_the_fts_row_but_keeps_the_chunk() {
        let mut s = serve().await;
        let a = chunk(&[], (1, 1), "plain words");
        s.upsert(doc("notes", "t.md", vec![ChunkInput { index_title: "oldtitle".into(), ..a.clone() }])).await;
        let id = s.chunk_ids("notes", "t.md").await[0].0;
        let r = s.upsert(doc("notes", "t.md", vec![ChunkInput { index_title: "newtitle".into(), ..a }])).await;
        assert_eq!((r.kept, r.added, r.removed), (1, 0, 0));
        assert_eq!(s.chunk_ids("notes", "t.md").await[0].0, id);
        assert!(s.keyword(kw(&["oldtitle"], MatchMode::All)).await.is_empty());
        assert_eq!(s.keyword(kw(&["newtitle"], MatchMode::All)).await.len(), 1);
        assert_eq!(s.counts().await.1, 1, "one FTS row");
    }

    #[tokio::test]
    async fn deleting_leaves_no_orphan_chunk_fts_row_vector_or_tag() {
        let mut s = serve().await;
        s.client.configure_vectors(ConfigureVectorsRequest { model: "m".into(), dimension: 3 }).await.unwrap();
        for (kb, path) in [("notes", "a.md"), ("notes", "b.md"), ("work", "c.md")] {
            let mut d = doc(kb, path, vec![chunk(&["H"], (1, 2), "one"), chunk(&["H"], (3, 4), "two")]);
            d.tags = vec!["t1".into(), "t2".into(), "t1".into()];
            s.upsert(d).await;
        }
        let pending = s.client.pending_embeddings(PendingEmbeddingsRequest { limit: 100 }).await.unwrap().into_inner();
        let embeddings = pending
            .hits
            .iter()
            .map(|h| Embedding { chunk_id: h.chunk.as_ref().unwrap().id, vector: vec![1.0, 0.5, 0.25] })
            .collect();
        let put = PutEmbeddingsRequest { model: "m".into(), dimension: 3, embeddings };
        assert_eq!(s.client.put_embeddings(put).await.unwrap().into_inner().stored, 6);
        assert_eq!(s.counts().await, (6, 6, 6, 6, 3));

        let del = |kb: &str, path: &str| DocumentRef { kb: kb.into(), path: path.into() };
        assert_eq!(s.client.delete_document(del("notes", "a.md")).await.unwrap().into_inner().removed, 1);
        assert_eq!(s.client.delete_document(del("notes", "a.md")).await.unwrap().into_inner().removed, 0);
        assert_eq!(s.counts().await, (4, 4, 4, 4, 2));
        // An error mark drops the chunks of a document that had some.
        let mark = MarkDocumentErrorRequest {
            kb: "notes".into(),
            path: "b.md".into(),
            mtime_ms: 5,
            size: 9,
            error: "invalid UTF-8".into(),
            kb_created_ms: 0,
        };
        s.client.mark_document_error(mark).await.unwrap();
        assert_eq!(s.counts().await, (2, 2, 2, 2, 2));
        let stats = s.client.stats(StatsRequest { kb: "notes".into() }).await.unwrap().into_inner();
        assert_eq!(stats.knowledge_bases.len(), 1);
        let notes = &stats.knowledge_bases[0];
        assert_eq!((notes.documents, notes.chunks, notes.embedded), (1, 0, 0));
        assert_eq!(
            notes.errors.iter().map(|e| (e.path.as_str(), e.error.as_str())).collect::<Vec<_>>(),
            [("b.md", "invalid UTF-8")]
        );
        assert_eq!((stats.vector_model.as_str(), stats.vector_dimension), ("m", 3));
        // Deleting the KB removes its documents (and the error row) and its definition.
        let r = s.client.delete_knowledge_base(KnowledgeBaseRef { name: "notes".into() }).await.unwrap();
        assert_eq!(r.into_inner().removed, 1);
        assert_eq!(s.counts().await, (2, 2, 2, 2, 1));
        let e = s.client.get_knowledge_base(KnowledgeBaseRef { name: "notes".into() }).await.unwrap_err();
        assert_eq!((e.code(), e.message()), (tonic::Code::NotFound, "knowledge base \"notes\" not found"));
        // Clearing everything keeps the definitions.
        s.upsert(doc("work", "d.md", vec![chunk(&[], (1, 1), "three")])).await;
        assert_eq!(
            s.client.clear_index(ClearIndexRequest { kb: String::new() }).await.unwrap().into_inner().removed,
            2
        );
        assert_eq!(s.counts().await, (0, 0, 0, 0, 0));
        let kbs = s.client.list_knowledge_bases(ListKnowledgeBasesRequest {}).await.unwrap().into_inner();
        assert_eq!(kbs.knowledge_bases.iter().map(|k| k.name.as_str()).collect::<Vec<_>>(), ["work"]);
        // And the index works after a clear.
        s.upsert(doc("work", "d.md", vec![chunk(&[], (1, 1), "three")])).await;
        assert_eq!(s.keyword(kw(&["three"], MatchMode::All)).await.len(), 1);
    }

    #[tokio::test]
    async fn hostile_terms_never_cause_an_fts5_syntax_error() {
        let mut s = serve().await;
        s.upsert(doc("notes", "a.md", vec![chunk(&[], (1, 1), "near the col term and or not of a quoted \"word\"")]))
            .await;
        let hostile = [
            "\"",
            "\"\"",
            "*",
            "NEAR(",
            "NEAR",
            "AND",
            "OR",
            "NOT",
            "AND OR NOT",
            "^",
            "-",
            ":",
            "col:term",
            "(",
            ")",
            "(near",
            "a\"b",
            "\"word\"",
            "term*",
            "-term",
            "^near",
            "{col}",
            "+",
            "NEAR(col, term)",
            "'",
            "\\",
            "…",
        ];
        for mode in [MatchMode::All, MatchMode::Any] {
            for t in hostile {
                let r = s.client.keyword_query(kw(&[t], mode)).await;
                assert!(r.is_ok(), "{t:?}: {r:?}");
            }
            let r = s.client.keyword_query(kw(&hostile, mode)).await;
            assert!(r.is_ok(), "all at once: {r:?}");
        }
        // Operators are words like any other; only-punctuation terms match nothing.
        assert_eq!(s.keyword(kw(&["AND", "OR", "NOT"], MatchMode::All)).await.len(), 1);
        assert_eq!(s.keyword(kw(&["NEAR(", "col:term"], MatchMode::All)).await.len(), 1);
        assert_eq!(s.keyword(kw(&["\"word\""], MatchMode::All)).await.len(), 1);
        assert!(s.keyword(kw(&["*", "\"", "^"], MatchMode::Any)).await.is_empty());
        assert!(s.keyword(kw(&["missing", "-"], MatchMode::All)).await.is_empty());
    }

    #[tokio::test]
    async fn bad_queries_are_refused_naming_the_field() {
        let mut s = serve().await;
        let check = |r: Result<tonic::Response<ChunkHits>, Status>, needle: &str| {
            let e = r.unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
            assert!(e.message().contains(needle), "{:?} lacks {needle:?}", e.message());
        };
        check(s.client.keyword_query(kw(&[], MatchMode::All)).await, "terms must not be empty");
        let many: Vec<&str> = vec!["x"; 65];
        check(s.client.keyword_query(kw(&many, MatchMode::All)).await, "terms has 65 entries");
        let long = "x".repeat(129);
        check(s.client.keyword_query(kw(&["ok", &long], MatchMode::All)).await, "terms[1]");
        check(s.client.keyword_query(kw(&["ok", ""], MatchMode::All)).await, "terms[1]");
        check(s.client.keyword_query(kw(&["a\0b"], MatchMode::All)).await, "terms[0]");
        for limit in [0, 1001] {
            check(s.client.keyword_query(KeywordQueryRequest { limit, ..kw(&["x"], MatchMode::All) }).await, "limit");
        }
        let filters = |f: Filters| KeywordQueryRequest { filters: Some(f), ..kw(&["x"], MatchMode::All) };
        check(
            s.client.keyword_query(filters(Filters { kb: vec!["Bad Name".into()], ..Default::default() })).await,
            "filters.kb[0]",
        );
        check(
            s.client.keyword_query(filters(Filters { tags: vec![String::new()], ..Default::default() })).await,
            "filters.tags[0]",
        );
        // Paths.
        for (path, why) in [("", "is empty"), ("/abs.md", "leading '/'"), ("a/../b.md", "'..'"), ("a\0.md", "NUL")] {
            let e = s.client.upsert_document(doc("notes", path, vec![])).await.unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument);
            assert!(e.message().starts_with("path ") && e.message().contains(why), "{}", e.message());
            let e = s.client.delete_document(DocumentRef { kb: "notes".into(), path: path.into() }).await.unwrap_err();
            assert!(e.message().starts_with("path "), "{}", e.message());
        }
        // A `..` inside a name is fine.
        s.upsert(doc("notes", "a..b.md", vec![])).await;
        let e = s.client.upsert_document(doc("No", "a.md", vec![])).await.unwrap_err();
        assert!(e.message().starts_with("kb: invalid knowledge base name \"No\""), "{}", e.message());
        let e = s.client.upsert_document(doc("absent", "a.md", vec![])).await.unwrap_err();
        assert_eq!((e.code(), e.message()), (tonic::Code::NotFound, "knowledge base \"absent\" not found"));
        let bad_lines = doc("notes", "a.md", vec![chunk(&[], (3, 2), "x")]);
        let e = s.client.upsert_document(bad_lines).await.unwrap_err();
        assert!(e.message().starts_with("chunks[0]: line_start 3"), "{}", e.message());
        // Knowledge bases.
        let kb = |name: &str, root: &str, kind: KnowledgeBaseKind| KnowledgeBase {
            name: name.into(),
            kind: kind.into(),
            root: root.into(),
            ..Default::default()
        };
        let e = s.client.create_knowledge_base(kb("notes", "/x", KnowledgeBaseKind::Folder)).await.unwrap_err();
        assert_eq!((e.code(), e.message()), (tonic::Code::AlreadyExists, "knowledge base \"notes\" already exists"));
        // One folder is one KB: checked in the write, whatever the caller checked before.
        let e = s.client.create_knowledge_base(kb("again", "/tmp/notes", KnowledgeBaseKind::Folder)).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::AlreadyExists, "{e:?}");
        assert!(e.message().contains("/tmp/notes") && e.message().contains("\"notes\""), "{}", e.message());
        let e = s.client.create_knowledge_base(kb("x", "rel", KnowledgeBaseKind::Folder)).await.unwrap_err();
        assert!(e.message().starts_with("root \"rel\""), "{}", e.message());
        let e = s.client.create_knowledge_base(kb("x", "/x", KnowledgeBaseKind::Unspecified)).await.unwrap_err();
        assert_eq!(e.message(), "kind is required");
        let e = s.client.create_knowledge_base(kb(&"x".repeat(65), "/x", KnowledgeBaseKind::Folder)).await.unwrap_err();
        assert!(e.message().starts_with("name: invalid knowledge base name"), "{}", e.message());
        let m =
            s.client.create_knowledge_base(kb("memory", "/m", KnowledgeBaseKind::Memory)).await.unwrap().into_inner();
        assert!(m.created_ms > 0);
        let got = s.client.get_knowledge_base(KnowledgeBaseRef { name: "memory".into() }).await.unwrap().into_inner();
        assert_eq!(got, m);
    }

    #[tokio::test]
    async fn cjk_bigrams_match_and_english_is_stemmed() {
        let mut s = serve().await;
        s.upsert(doc("notes", "zh.md", vec![chunk(&[], (1, 1), "机器 器学 学习")])).await;
        s.upsert(doc("notes", "en.md", vec![chunk(&[], (1, 1), "a bird has one wing")])).await;
        s.upsert(doc("notes", "fr.md", vec![chunk(&[], (1, 1), "café crème")])).await;
        assert_eq!(s.keyword(kw(&["机器"], MatchMode::All)).await, [("zh.md".into(), 0)]);
        assert_eq!(s.keyword(kw(&["学习", "机器"], MatchMode::All)).await, [("zh.md".into(), 0)]);
        assert!(s.keyword(kw(&["机学"], MatchMode::All)).await.is_empty());
        assert_eq!(s.keyword(kw(&["wings"], MatchMode::All)).await, [("en.md".into(), 0)]);
        assert_eq!(s.keyword(kw(&["birds", "winged"], MatchMode::All)).await, [("en.md".into(), 0)]);
        assert_eq!(s.keyword(kw(&["cafe", "CREME"], MatchMode::All)).await, [("fr.md".into(), 0)]);
    }

    /// One document whose chunks fill more than the ranked path's first cap of rows
    /// ([`ranked_rows_cap`]), all ranked above every other document: the list of documents
    /// still reaches past them (the query runs again without a cap), with and without a KB
    /// filter, and equals the full query's (a path prefix filter takes the other path).
    #[tokio::test]
    async fn one_per_document_reads_past_the_first_cap_of_rows() {
        let mut s = serve().await;
        let many = ranked_rows_cap(3) as u32 + 40;
        let chunks = (0..many).map(|i| chunk(&[], (i + 1, i + 1), &format!("zebra zebra zebra {i}"))).collect();
        s.upsert(doc("notes", "a/many.md", chunks)).await;
        s.upsert(doc("notes", "a/one.md", vec![chunk(&[], (1, 1), "zebra and a lot of other words here")])).await;
        s.upsert(doc("notes", "a/two.md", vec![chunk(&[], (1, 1), "zebra and even more other words here too")])).await;
        let query = |filters: Option<Filters>| KeywordQueryRequest {
            limit: 3,
            one_per_document: true,
            filters,
            ..kw(&["zebra"], MatchMode::All)
        };
        let want = ["a/many.md", "a/one.md", "a/two.md"];
        for filters in [
            None,
            Some(Filters { kb: vec!["notes".into()], ..Default::default() }),
            Some(Filters { path_prefix: "a/".into(), ..Default::default() }),
        ] {
            let got = s.keyword(query(filters.clone())).await;
            assert_eq!(got.iter().map(|(p, _)| p.as_str()).collect::<Vec<_>>(), want, "{filters:?}");
        }
    }

    #[tokio::test]
    async fn title_beats_headings_beats_body_and_modes_combine_terms() {
        let mut s = serve().await;
        let with = |path: &str, title: &str, headings: &str, body: &str| {
            let mut c = chunk(&[], (1, 1), body);
            c.index_title = title.into();
            c.index_headings = headings.into();
            doc("notes", path, vec![c])
        };
        s.upsert(with("body.md", "other", "other", "zebra lives here")).await;
        s.upsert(with("title.md", "zebra", "other", "lives here")).await;
        s.upsert(with("heading.md", "other", "zebra", "lives here")).await;
        let order = s.keyword(kw(&["zebra"], MatchMode::All)).await;
        assert_eq!(order.iter().map(|(p, _)| p.as_str()).collect::<Vec<_>>(), ["title.md", "heading.md", "body.md"]);
        let hits = s.client.keyword_query(kw(&["zebra"], MatchMode::All)).await.unwrap().into_inner().hits;
        assert!(hits.windows(2).all(|w| w[0].score > w[1].score), "scores decrease: {hits:?}");
        assert!(hits[0].score > 0.0);
        assert!(s.keyword(kw(&["zebra", "giraffe"], MatchMode::All)).await.is_empty());
        assert_eq!(s.keyword(kw(&["zebra", "giraffe"], MatchMode::Any)).await.len(), 3);
        // Unspecified mode means all terms.
        assert!(s.keyword(kw(&["zebra", "giraffe"], MatchMode::Unspecified)).await.is_empty());
    }

    #[tokio::test]
    async fn ties_are_broken_by_kb_path_and_ordinal_not_by_insertion() {
        let mut s = serve().await;
        // Inserted in reverse: equal chunks in equal documents score the same.
        for (kb, path) in [("work", "b.md"), ("work", "a.md"), ("notes", "z.md"), ("notes", "a.md")] {
            s.upsert(doc(kb, path, vec![chunk(&[], (1, 1), "same words"), chunk(&[], (2, 2), "same words")])).await;
        }
        let hits = s.client.keyword_query(kw(&["same"], MatchMode::All)).await.unwrap().into_inner().hits;
        let order: Vec<(String, String, u32)> =
            hits.iter().map(|h| h.chunk.clone().map(|c| (c.kb, c.path, c.ordinal)).unwrap()).collect();
        let mut sorted = order.clone();
        sorted.sort_by(|a, b| (&a.0, &a.1, a.2).cmp(&(&b.0, &b.1, b.2)));
        // Both chunks of a document score the same, so the whole list is in (kb, path, ordinal) order.
        assert_eq!(order, sorted);
        assert_eq!(order.len(), 8);
        // A limit cuts the same list.
        let top3 = s.client.keyword_query(KeywordQueryRequest { limit: 3, ..kw(&["same"], MatchMode::All) }).await;
        let top3: Vec<_> = top3
            .unwrap()
            .into_inner()
            .hits
            .into_iter()
            .map(|h| h.chunk.map(|c| (c.kb, c.path, c.ordinal)).unwrap())
            .collect();
        assert_eq!(top3, sorted[..3]);
        // The filtered query (another plan) orders the same way.
        let both = Filters { kb: vec!["work".into(), "notes".into()], ..Default::default() };
        let q = KeywordQueryRequest { limit: 5, filters: Some(both), ..kw(&["same"], MatchMode::All) };
        let top5: Vec<_> = s
            .client
            .keyword_query(q)
            .await
            .unwrap()
            .into_inner()
            .hits
            .into_iter()
            .map(|h| h.chunk.map(|c| (c.kb, c.path, c.ordinal)).unwrap())
            .collect();
        assert_eq!(top5, sorted[..5]);
    }

    #[tokio::test]
    async fn filters_restrict_by_kb_prefix_tags_and_mtime() {
        let mut s = serve().await;
        let mk = |kb: &str, path: &str, tags: &[&str], mtime: i64| UpsertDocumentRequest {
            tags: tags.iter().map(|t| t.to_string()).collect(),
            mtime_ms: mtime,
            ..doc(kb, path, vec![chunk(&[], (1, 1), "common word")])
        };
        s.upsert(mk("notes", "projects/a.md", &["rust", "db"], 100)).await;
        s.upsert(mk("notes", "projects/b.md", &["rust"], 200)).await;
        s.upsert(mk("notes", "projectsx/c.md", &[], 300)).await;
        s.upsert(mk("notes", "p%_/d.md", &["db"], 400)).await;
        s.upsert(mk("work", "projects/e.md", &["rust", "db"], 500)).await;
        let q = |f: Filters| KeywordQueryRequest { filters: Some(f), ..kw(&["common"], MatchMode::All) };
        let paths = |v: Vec<(String, u32)>| v.into_iter().map(|(p, _)| p).collect::<Vec<_>>();
        let all = s.keyword(q(Filters::default())).await;
        assert_eq!(all.len(), 5);
        let notes = s.keyword(q(Filters { kb: vec!["notes".into()], ..Default::default() })).await;
        assert_eq!(notes.len(), 4);
        let both = s.keyword(q(Filters { kb: vec!["notes".into(), "work".into()], ..Default::default() })).await;
        assert_eq!(both.len(), 5);
        let prefix = s.keyword(q(Filters { path_prefix: "projects/".into(), ..Default::default() })).await;
        assert_eq!(paths(prefix), ["projects/a.md", "projects/b.md", "projects/e.md"]);
        // `%` and `_` in a prefix are literal.
        let literal = s.keyword(q(Filters { path_prefix: "p%_".into(), ..Default::default() })).await;
        assert_eq!(paths(literal), ["p%_/d.md"]);
        assert!(s.keyword(q(Filters { path_prefix: "p__".into(), ..Default::default() })).await.is_empty());
        let tags = s.keyword(q(Filters { tags: vec!["rust".into(), "db".into()], ..Default::default() })).await;
        assert_eq!(paths(tags), ["projects/a.md", "projects/e.md"]);
        let twice = Filters { tags: vec!["db".into(), "rust".into(), "db".into()], ..Default::default() };
        assert_eq!(paths(s.keyword(q(twice)).await), ["projects/a.md", "projects/e.md"]);
        let one = s.keyword(q(Filters { tags: vec!["db".into()], ..Default::default() })).await;
        assert_eq!(paths(one), ["p%_/d.md", "projects/a.md", "projects/e.md"]);
        assert!(s.keyword(q(Filters { tags: vec!["none".into()], ..Default::default() })).await.is_empty());
        // As Obsidian: a tag matches its nested tags and any case; not a tag it only begins.
        s.upsert(mk("notes", "nested/f.md", &["Project/Coffer", "db"], 50)).await;
        s.upsert(mk("notes", "nested/g.md", &["projects"], 60)).await;
        for asked in ["project", "PROJECT", "project/coffer"] {
            let f = Filters { tags: vec![asked.into(), "db".into()], ..Default::default() };
            assert_eq!(paths(s.keyword(q(f)).await), ["nested/f.md"], "{asked}");
        }
        assert!(s.keyword(q(Filters { tags: vec!["project/cof".into()], ..Default::default() })).await.is_empty());
        // The notes with a tag, without a query: by KB then path, a page at a time.
        let tagged = |tag: &str, after: (&str, &str), limit: u32| TaggedDocumentsRequest {
            filters: Some(Filters { tags: vec![tag.into()], ..Default::default() }),
            after_kb: after.0.into(),
            after_path: after.1.into(),
            limit,
        };
        let page = |r: ChunkHits| {
            r.hits.into_iter().map(|h| h.chunk.unwrap()).map(|c| format!("{}:{}", c.kb, c.path)).collect::<Vec<_>>()
        };
        let first = s.client.tagged_documents(tagged("db", ("", ""), 2)).await.unwrap().into_inner();
        assert_eq!(first.hits[0].chunk.as_ref().unwrap().text, "common word");
        assert_eq!(page(first), ["notes:nested/f.md", "notes:p%_/d.md"]);
        let next = s.client.tagged_documents(tagged("db", ("notes", "p%_/d.md"), 2)).await.unwrap().into_inner();
        assert_eq!(page(next), ["notes:projects/a.md", "work:projects/e.md"]);
        let last = s.client.tagged_documents(tagged("db", ("work", "projects/e.md"), 2)).await.unwrap().into_inner();
        assert!(last.hits.is_empty());
        assert_eq!(
            page(s.client.tagged_documents(tagged("PROJECT", ("", ""), 10)).await.unwrap().into_inner()),
            ["notes:nested/f.md"]
        );
        let e = s.client.tagged_documents(TaggedDocumentsRequest { limit: 5, ..Default::default() }).await.unwrap_err();
        assert!(e.message().contains("at least one tag"), "{e}");
        for path in ["nested/f.md", "nested/g.md"] {
            s.client.delete_document(DocumentRef { kb: "notes".into(), path: path.into() }).await.unwrap();
        }
        let newer = s.keyword(q(Filters { modified_after_ms: 300, ..Default::default() })).await;
        assert_eq!(paths(newer), ["p%_/d.md", "projects/e.md"]);
        let mixed = Filters {
            kb: vec!["notes".into()],
            path_prefix: "projects".into(),
            tags: vec!["rust".into()],
            modified_after_ms: 150,
        };
        assert_eq!(paths(s.keyword(q(mixed)).await), ["projects/b.md"]);
        // Tags come back sorted and once each.
        let hits = s.client.keyword_query(q(Filters { path_prefix: "projects/a".into(), ..Default::default() })).await;
        assert_eq!(hits.unwrap().into_inner().hits[0].chunk.as_ref().unwrap().tags, ["db", "rust"]);
        // Documents of a KB, for the reconcile pass.
        let docs = s.client.list_documents(ListDocumentsRequest { kb: "notes".into() }).await.unwrap().into_inner();
        let docs: Vec<(String, i64, u32, Vec<String>)> =
            docs.documents.into_iter().map(|d| (d.path, d.mtime_ms, d.chunks, d.tags)).collect();
        assert_eq!(docs[0], ("p%_/d.md".into(), 400, 1, vec!["db".into()]));
        assert_eq!(docs.len(), 4);
    }

    #[tokio::test]
    async fn locate_lines_and_get_chunks() {
        let mut s = serve().await;
        // Overlapping chunks: line 5 is in both.
        s.upsert(doc("notes", "a.md", vec![chunk(&["A"], (1, 5), "first"), chunk(&["B"], (5, 9), "second")])).await;
        s.upsert(doc("notes", "b.md", vec![chunk(&[], (1, 3), "other")])).await;
        let line = |path: &str, line: u32| LineRef { kb: "notes".into(), path: path.into(), line };
        let req = LocateLinesRequest {
            lines: vec![
                line("a.md", 2),
                line("a.md", 5),
                line("a.md", 7),
                line("a.md", 50),
                line("b.md", 3),
                line("zz.md", 1),
            ],
            filters: None,
        };
        let hits = s.client.locate_lines(req.clone()).await.unwrap().into_inner().hits;
        let got: Vec<(String, u32, Vec<u32>)> = hits
            .iter()
            .map(|h| (h.chunk.as_ref().unwrap().path.clone(), h.chunk.as_ref().unwrap().ordinal, h.lines.clone()))
            .collect();
        assert_eq!(got, [("a.md".into(), 0, vec![2, 5]), ("a.md".into(), 1, vec![5, 7]), ("b.md".into(), 0, vec![3])]);
        let filtered =
            LocateLinesRequest { filters: Some(Filters { path_prefix: "b".into(), ..Default::default() }), ..req };
        assert_eq!(s.client.locate_lines(filtered).await.unwrap().into_inner().hits.len(), 1);
        let e = s.client.locate_lines(LocateLinesRequest { lines: vec![line("../x", 1)], filters: None }).await;
        assert!(e.unwrap_err().message().starts_with("lines[0].path"));

        let ids: Vec<i64> = hits.iter().map(|h| h.chunk.as_ref().unwrap().id).collect();
        let got = s.client.get_chunks(GetChunksRequest { ids: vec![ids[2], 999_999, ids[0]] }).await.unwrap();
        let got: Vec<(String, String, Vec<String>, u32, u32)> = got
            .into_inner()
            .hits
            .into_iter()
            .map(|h| h.chunk.map(|c| (c.path, c.text, c.heading_path, c.line_start, c.line_end)).unwrap())
            .collect();
        assert_eq!(
            got,
            [("b.md".into(), "other".into(), vec![], 1, 3), ("a.md".into(), "first".into(), vec!["A".into()], 1, 5)]
        );
    }

    #[tokio::test]
    async fn a_write_prepared_for_a_removed_and_re_added_kb_is_refused() {
        let mut s = serve().await;
        let list = s.client.list_knowledge_bases(ListKnowledgeBasesRequest {}).await.unwrap().into_inner();
        let created = list.knowledge_bases.iter().find(|k| k.name == "notes").unwrap().created_ms;
        assert!(created > 0);
        let stale = UpsertDocumentRequest { kb_created_ms: created - 1, ..doc("notes", "a.md", vec![]) };
        let e = s.client.upsert_document(stale).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
        assert!(e.message().contains("removed and added again"), "{}", e.message());
        let mark = MarkDocumentErrorRequest {
            kb: "notes".into(),
            path: "b.md".into(),
            error: "x".into(),
            kb_created_ms: created + 1,
            ..Default::default()
        };
        assert_eq!(s.client.mark_document_error(mark).await.unwrap_err().code(), tonic::Code::FailedPrecondition);
        assert_eq!(s.counts().await.4, 0, "nothing was written");
        // The KB it was read as, or no check (0): written.
        s.upsert(UpsertDocumentRequest { kb_created_ms: created, ..doc("notes", "a.md", vec![]) }).await;
        s.upsert(doc("notes", "b.md", vec![])).await;
        assert_eq!(s.counts().await.4, 2);
    }

    #[tokio::test]
    async fn vectors_configure_query_and_embed() {
        let mut s = serve().await;
        let vq = |v: Vec<f32>, limit: u32| VectorQueryRequest { embedding: v, filters: None, limit };
        let e = s.client.vector_query(vq(vec![1.0, 0.0], 5)).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition);
        let e = s.client.pending_embeddings(PendingEmbeddingsRequest { limit: 5 }).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition);

        for (i, path) in ["east.md", "north.md", "northeast.md", "west.md"].iter().enumerate() {
            s.upsert(doc(if i == 3 { "work" } else { "notes" }, path, vec![chunk(&[], (1, 1), path)])).await;
        }
        let r = s.client.configure_vectors(ConfigureVectorsRequest { model: "m1".into(), dimension: 2 }).await.unwrap();
        assert_eq!(r.into_inner(), ConfigureVectorsReply { reset: true, dropped: 0 });
        let pending = s.client.pending_embeddings(PendingEmbeddingsRequest { limit: 3 }).await.unwrap().into_inner();
        assert_eq!(pending.hits.len(), 3, "limit");
        let pending = s.client.pending_embeddings(PendingEmbeddingsRequest { limit: 100 }).await.unwrap().into_inner();
        let by_path: HashMap<String, i64> = pending
            .hits
            .iter()
            .map(|h| (h.chunk.as_ref().unwrap().path.clone(), h.chunk.as_ref().unwrap().id))
            .collect();
        let v = |p: &str| match p {
            "east.md" => vec![1.0, 0.0],
            "north.md" => vec![0.0, 3.0],
            "northeast.md" => vec![2.0, 2.0],
            _ => vec![-1.0, 0.1],
        };
        let mut embeddings: Vec<Embedding> =
            by_path.iter().map(|(p, id)| Embedding { chunk_id: *id, vector: v(p) }).collect();
        // A chunk that no longer exists is skipped.
        embeddings.push(Embedding { chunk_id: 987_654, vector: vec![1.0, 1.0] });
        let put = |embeddings: Vec<Embedding>, model: &str, dimension: u32| PutEmbeddingsRequest {
            model: model.into(),
            dimension,
            embeddings,
        };
        let r = s.client.put_embeddings(put(embeddings.clone(), "m1", 2)).await.unwrap().into_inner();
        assert_eq!((r.stored, r.skipped), (4, 1));
        assert!(
            s.client
                .pending_embeddings(PendingEmbeddingsRequest { limit: 10 })
                .await
                .unwrap()
                .into_inner()
                .hits
                .is_empty()
        );
        // Another model's vectors are refused whole.
        let e = s.client.put_embeddings(put(embeddings.clone(), "m2", 2)).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::Aborted, "{e:?}");
        let e = s.client.put_embeddings(put(vec![], "m1", 3)).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::Aborted);
        // Bad vectors.
        for (bad, needle) in [
            (vec![1.0, f32::NAN], "embeddings[0].vector[1] is not a finite number"),
            (vec![f32::INFINITY, 1.0], "embeddings[0].vector[0]"),
            (vec![1.0, 2.0, 3.0], "embeddings[0].vector has dimension 3"),
            (vec![0.0, 0.0], "all zeros"),
        ] {
            let e =
                s.client.put_embeddings(put(vec![Embedding { chunk_id: 1, vector: bad }], "m1", 2)).await.unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument);
            assert!(e.message().contains(needle), "{}", e.message());
        }

        // Cosine order: direction matters, length does not.
        let order =
            |hits: ChunkHits| hits.hits.into_iter().map(|h| (h.chunk.unwrap().path, h.score)).collect::<Vec<_>>();
        let got = order(s.client.vector_query(vq(vec![10.0, 1.0], 10)).await.unwrap().into_inner());
        assert_eq!(
            got.iter().map(|(p, _)| p.as_str()).collect::<Vec<_>>(),
            ["east.md", "northeast.md", "north.md", "west.md"]
        );
        assert!((got[0].1 - (1.0 - (1.0 - 10.0 / 101f64.sqrt()))).abs() < 1e-4, "{got:?}");
        assert!((got[1].1 - std::f64::consts::FRAC_1_SQRT_2 * 11.0 / 101f64.sqrt()).abs() < 1e-4, "{got:?}");
        let top = order(s.client.vector_query(vq(vec![1.0, 1.0], 1)).await.unwrap().into_inner());
        assert_eq!(top[0].0, "northeast.md");
        assert!((top[0].1 - 1.0).abs() < 1e-5);
        // Filters.
        let filtered = VectorQueryRequest {
            filters: Some(Filters { kb: vec!["work".into()], ..Default::default() }),
            ..vq(vec![1.0, 0.0], 2)
        };
        let got = order(s.client.vector_query(filtered).await.unwrap().into_inner());
        assert_eq!(got.iter().map(|(p, _)| p.as_str()).collect::<Vec<_>>(), ["west.md"]);
        // Bad query vectors.
        for (bad, needle) in [(vec![1.0], "embedding has dimension 1"), (vec![f32::NAN, 1.0], "embedding[0]")] {
            let e = s.client.vector_query(vq(bad, 3)).await.unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument);
            assert!(e.message().contains(needle), "{}", e.message());
        }
        let e = s.client.vector_query(vq(vec![1.0, 0.0], 0)).await.unwrap_err();
        assert!(e.message().starts_with("limit"));

        // Same configuration: a no-op; vectors stay.
        let r = s.client.configure_vectors(ConfigureVectorsRequest { model: "m1".into(), dimension: 2 }).await.unwrap();
        assert_eq!(r.into_inner(), ConfigureVectorsReply { reset: false, dropped: 0 });
        assert_eq!(s.counts().await.2, 4);
        let stats = s.client.stats(StatsRequest::default()).await.unwrap().into_inner();
        assert_eq!(stats.knowledge_bases.iter().map(|k| k.embedded).sum::<u64>(), 4);
        // Another model (same dimension): a clean reset; every chunk pending again.
        let r = s.client.configure_vectors(ConfigureVectorsRequest { model: "m2".into(), dimension: 2 }).await.unwrap();
        assert_eq!(r.into_inner(), ConfigureVectorsReply { reset: true, dropped: 4 });
        assert_eq!(s.counts().await.2, 0);
        let pending = s.client.pending_embeddings(PendingEmbeddingsRequest { limit: 10 }).await.unwrap().into_inner();
        assert_eq!(pending.hits.len(), 4);
        assert!(s.client.vector_query(vq(vec![1.0, 0.0], 3)).await.unwrap().into_inner().hits.is_empty());
        // Old-model vectors arriving late are refused.
        let e = s.client.put_embeddings(put(embeddings, "m1", 2)).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::Aborted);
        // Another dimension: the table is recreated for it.
        let r = s.client.configure_vectors(ConfigureVectorsRequest { model: "m2".into(), dimension: 3 }).await.unwrap();
        assert_eq!(r.into_inner(), ConfigureVectorsReply { reset: true, dropped: 0 });
        let embeddings = pending
            .hits
            .iter()
            .map(|h| Embedding { chunk_id: h.chunk.as_ref().unwrap().id, vector: vec![0.0, 0.0, 1.0] })
            .collect();
        assert_eq!(s.client.put_embeddings(put(embeddings, "m2", 3)).await.unwrap().into_inner().stored, 4);
        let got = s.client.vector_query(vq(vec![0.0, 1.0, 1.0], 10)).await.unwrap().into_inner();
        // All equal: ties in (kb, path, ordinal) order.
        let paths: Vec<(String, String)> =
            got.hits.into_iter().map(|h| h.chunk.map(|c| (c.kb, c.path)).unwrap()).collect();
        assert_eq!(
            paths,
            [
                ("notes".into(), "east.md".into()),
                ("notes".into(), "north.md".into()),
                ("notes".into(), "northeast.md".into()),
                ("work".into(), "west.md".into())
            ]
        );
        let e =
            s.client.configure_vectors(ConfigureVectorsRequest { model: "m".into(), dimension: 0 }).await.unwrap_err();
        assert!(e.message().starts_with("dimension"));
        let e = s
            .client
            .configure_vectors(ConfigureVectorsRequest { model: String::new(), dimension: 4 })
            .await
            .unwrap_err();
        assert!(e.message().starts_with("model"));
    }

    #[tokio::test]
    async fn vector_queries_with_selective_filters_are_exact() {
        let mut s = serve().await;
        s.client.configure_vectors(ConfigureVectorsRequest { model: "m".into(), dimension: 2 }).await.unwrap();
        // 300 chunks close to the query in `notes`, 3 far ones in `work`: a KNN page of the
        // nearest alone would miss them.
        let chunks = (0..300).map(|i| chunk(&[], (i + 1, i + 1), &format!("n{i}"))).collect();
        s.upsert(doc("notes", "many.md", chunks)).await;
        let far = (0..3).map(|i| chunk(&[], (i + 1, i + 1), &format!("w{i}"))).collect();
        s.upsert(doc("work", "few.md", far)).await;
        let pending = s.client.pending_embeddings(PendingEmbeddingsRequest { limit: 1000 }).await.unwrap().into_inner();
        let embeddings = pending
            .hits
            .iter()
            .map(|h| {
                let c = h.chunk.as_ref().unwrap();
                let vector = if c.kb == "work" {
                    vec![-1.0, c.ordinal as f32 + 1.0]
                } else {
                    vec![1.0, c.ordinal as f32 / 1000.0]
                };
                Embedding { chunk_id: c.id, vector }
            })
            .collect();
        s.client.put_embeddings(PutEmbeddingsRequest { model: "m".into(), dimension: 2, embeddings }).await.unwrap();
        let q = VectorQueryRequest {
            embedding: vec![1.0, 0.0],
            filters: Some(Filters { kb: vec!["work".into()], ..Default::default() }),
            limit: 2,
        };
        let got = s.client.vector_query(q).await.unwrap().into_inner().hits;
        let got: Vec<u32> = got.into_iter().map(|h| h.chunk.unwrap().ordinal).collect();
        assert_eq!(got, [2, 1], "the two least far of `work`");
        // sqlite-vec's KNN (the path for vectors too large for memory) answers the same.
        let via_vec0 = |filters: Option<Filters>, limit: u32| {
            let db = s.db.clone();
            async move {
                let f = Filter::new(filters.as_ref()).unwrap();
                let hits =
                    db.read(move |c| vector_query(c, &i8_blob(&stored_i8(&[1.0, 0.0])), &f, limit)).await.unwrap();
                hits.into_iter().map(|h| h.chunk.unwrap().ordinal).collect::<Vec<u32>>()
            }
        };
        assert_eq!(via_vec0(Some(Filters { kb: vec!["work".into()], ..Default::default() }), 2).await, [2, 1]);
        assert_eq!(via_vec0(None, 3).await, [0, 1, 2]);
        let q = VectorQueryRequest { embedding: vec![1.0, 0.0], filters: None, limit: 3 };
        let got: Vec<u32> = s
            .client
            .vector_query(q)
            .await
            .unwrap()
            .into_inner()
            .hits
            .into_iter()
            .map(|h| h.chunk.unwrap().ordinal)
            .collect();
        assert_eq!(got, [0, 1, 2]);
    }

    #[tokio::test]
    async fn twenty_concurrent_upserts_of_different_and_of_the_same_document() {
        let s = serve().await;
        let mut tasks = Vec::new();
        for i in 0..20u32 {
            let mut client = s.client.clone();
            tasks.push(tokio::spawn(async move {
                let chunks = (0..5).map(|j| chunk(&["H"], (j + 1, j + 1), &format!("doc{i} part{j} shared"))).collect();
                client.upsert_document(doc("notes", &format!("d{i}.md"), chunks)).await.unwrap().into_inner()
            }));
            let mut client = s.client.clone();
            tasks.push(tokio::spawn(async move {
                // Writers of one document: each version shares chunk "common" and has 3 own.
                let mut chunks = vec![chunk(&["H"], (1, 1), "common")];
                chunks.extend((0..3).map(|j| chunk(&["H"], (j + 2, j + 2), &format!("version{i} line{j}"))));
                let mut d = doc("notes", "same.md", chunks);
                d.hash = format!("v{i}");
                client.upsert_document(d).await.unwrap().into_inner()
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let mut s = s;
        let (chunks, fts, _, _, docs) = s.counts().await;
        assert_eq!((chunks, fts, docs), (20 * 5 + 4, 20 * 5 + 4, 21));
        let same = s.chunk_ids("notes", "same.md").await;
        assert_eq!(same.iter().map(|c| c.1).collect::<Vec<_>>(), [0, 1, 2, 3]);
        // The last writer's version is the whole document: one version's chunks, not a mix.
        let docs = s.client.list_documents(ListDocumentsRequest { kb: "notes".into() }).await.unwrap().into_inner();
        let version = docs.documents.iter().find(|d| d.path == "same.md").unwrap().hash.clone();
        let n = version.trim_start_matches('v');
        let mine = s.keyword(kw(&[&format!("version{n}")], MatchMode::All)).await;
        assert_eq!(mine.len(), 3);
        let any_version = s.keyword(KeywordQueryRequest { limit: 100, ..kw(&["line0"], MatchMode::All) }).await;
        assert_eq!(any_version.len(), 1, "no chunk of another version left");
        assert_eq!(s.keyword(kw(&["common"], MatchMode::All)).await.len(), 1);
        assert_eq!(s.keyword(KeywordQueryRequest { limit: 1000, ..kw(&["shared"], MatchMode::All) }).await.len(), 100);
    }

    #[tokio::test]
    async fn the_in_memory_vectors_follow_every_write_and_match_a_fresh_load() {
        let mut s = serve().await;
        s.client.configure_vectors(ConfigureVectorsRequest { model: "m".into(), dimension: 3 }).await.unwrap();
        let q = VectorQueryRequest { embedding: vec![1.0, 0.2, 0.1], filters: None, limit: 50 };
        // Load the copy early (empty), then write through it.
        assert!(s.client.vector_query(q.clone()).await.unwrap().into_inner().hits.is_empty());
        let embed_pending = |mut client: IndexClient<Channel>, seed: f32| async move {
            let pending = client.pending_embeddings(PendingEmbeddingsRequest { limit: 1000 }).await.unwrap();
            let embeddings = pending
                .into_inner()
                .hits
                .iter()
                .map(|h| {
                    let id = h.chunk.as_ref().unwrap().id as f32;
                    Embedding { chunk_id: id as i64, vector: vec![1.0, (id * seed).sin(), (id * 0.3).cos()] }
                })
                .collect();
            client.put_embeddings(PutEmbeddingsRequest { model: "m".into(), dimension: 3, embeddings }).await.unwrap();
        };
        for i in 0..6 {
            let chunks = (0..4).map(|j| chunk(&[], (j + 1, j + 1), &format!("d{i} c{j}"))).collect();
            s.upsert(doc("notes", &format!("d{i}.md"), chunks)).await;
        }
        embed_pending(s.client.clone(), 0.7).await;
        // Replace some chunks, delete a document, mark one as an error, re-embed one chunk.
        s.upsert(doc("notes", "d0.md", vec![chunk(&[], (1, 1), "d0 c0"), chunk(&[], (2, 2), "new")])).await;
        s.client.delete_document(DocumentRef { kb: "notes".into(), path: "d1.md".into() }).await.unwrap();
        let mark = MarkDocumentErrorRequest {
            kb: "notes".into(),
            path: "d2.md".into(),
            error: "binary".into(),
            ..Default::default()
        };
        s.client.mark_document_error(mark).await.unwrap();
        embed_pending(s.client.clone(), 1.3).await;
        let some = s.chunk_ids("notes", "d3.md").await[0].0;
        let again = Embedding { chunk_id: some, vector: vec![1.0, 0.2, 0.1] };
        let put = PutEmbeddingsRequest { model: "m".into(), dimension: 3, embeddings: vec![again] };
        s.client.put_embeddings(put).await.unwrap();
        // A failed write (rolled back) drops the copy; the next query reloads it.
        let bad = PutEmbeddingsRequest {
            model: "m".into(),
            dimension: 3,
            embeddings: vec![
                Embedding { chunk_id: some, vector: vec![0.0, 1.0, 0.0] },
                Embedding { chunk_id: some, vector: vec![1.0, 1.0] },
            ],
        };
        assert!(s.client.put_embeddings(bad).await.is_err());

        let answer =
            |hits: ChunkHits| hits.hits.into_iter().map(|h| (h.chunk.unwrap().id, h.score)).collect::<Vec<_>>();
        let cached = answer(s.client.vector_query(q.clone()).await.unwrap().into_inner());
        let (chunks, _, vectors, _, _) = s.counts().await;
        assert_eq!(cached.len() as i64, vectors);
        assert_eq!(chunks, vectors);
        assert_eq!(cached[0].0, some, "the re-embedded chunk is the nearest");
        // The stored 8-bit vector is ~1e-5 off the float one at 3 dimensions.
        assert!((cached[0].1 - 1.0).abs() < 1e-4);
        // A fresh service loads the copy from the database: the same answer.
        let fresh = IndexService::new(s.db.clone());
        let loaded = answer(fresh.vector_query(Request::new(q.clone())).await.unwrap().into_inner());
        assert_eq!(loaded, cached);
        // Clearing the index empties it.
        s.client.clear_index(ClearIndexRequest::default()).await.unwrap();
        assert!(s.client.vector_query(q).await.unwrap().into_inner().hits.is_empty());
    }

    /// A database written before vectors were stored as 8-bit integers (`kb_vectors` as
    /// `float[N]`) is converted when it is opened: every vector kept (nothing to re-embed), the
    /// table now `int8[N]`, and vector queries answer as a database written in the new format.
    #[tokio::test]
    async fn a_float_vector_table_of_an_old_database_is_converted_at_open() {
        let mut s = serve().await;
        s.client.configure_vectors(ConfigureVectorsRequest { model: "m".into(), dimension: 8 }).await.unwrap();
        for i in 0..5 {
            let chunks = (0..4).map(|j| chunk(&[], (j + 1, j + 1), &format!("d{i} c{j}"))).collect();
            s.upsert(doc("notes", &format!("d{i}.md"), chunks)).await;
        }
        let ids: Vec<i64> = {
            let mut all = Vec::new();
            for i in 0..5 {
                all.extend(s.chunk_ids("notes", &format!("d{i}.md")).await.into_iter().map(|c| c.0));
            }
            all
        };
        let vector = |id: i64| -> Vec<f32> { (0..8).map(|k| ((id * 7 + k) as f32 * 0.37).sin()).collect() };
        let embeddings = ids.iter().map(|&id| Embedding { chunk_id: id, vector: vector(id) }).collect();
        s.client.put_embeddings(PutEmbeddingsRequest { model: "m".into(), dimension: 8, embeddings }).await.unwrap();
        let q = VectorQueryRequest { embedding: vector(ids[3]), filters: None, limit: 10 };
        let answer = |hits: ChunkHits| hits.hits.into_iter().map(|h| h.chunk.unwrap().id).collect::<Vec<_>>();
        let new_format = answer(s.client.vector_query(q.clone()).await.unwrap().into_inner());
        assert_eq!(new_format[0], ids[3]);
        let ddl = |c: &Connection| -> String {
            c.query_row("SELECT sql FROM sqlite_schema WHERE name = 'kb_vectors'", [], |r| r.get(0)).unwrap()
        };

        // The same vectors as the old code wrote them: a float table.
        let path = s._dir.path().join("coffer.db");
        {
            #[allow(clippy::disallowed_methods)]
            let c = Connection::open(&path).unwrap();
            assert!(ddl(&c).contains("int8[8]"), "{}", ddl(&c));
            c.execute_batch(
                "DROP TABLE kb_vectors;
                 CREATE VIRTUAL TABLE kb_vectors USING vec0 (chunk_id integer primary key, embedding float[8] \
                 distance_metric=cosine)",
            )
            .unwrap();
            for &id in &ids {
                let blob: Vec<u8> = vector(id).iter().flat_map(|x| x.to_le_bytes()).collect();
                c.execute("INSERT INTO kb_vectors (chunk_id, embedding) VALUES (?1, ?2)", params![id, blob]).unwrap();
            }
        }
        let reopened = Db::open(&path).unwrap();
        let (sql, count, embedded) = reopened
            .read(move |c| {
                let n = |sql: &str| c.query_row(sql, [], |r| r.get::<_, i64>(0));
                Ok((
                    ddl(c),
                    n("SELECT COUNT(*) FROM kb_vectors")?,
                    n("SELECT COUNT(*) FROM kb_chunks WHERE embedded = 1")?,
                ))
            })
            .await
            .unwrap();
        assert!(sql.contains("int8[8]"), "{sql}");
        assert_eq!((count, embedded), (ids.len() as i64, ids.len() as i64), "every vector kept, nothing to re-embed");
        let fresh = IndexService::new(reopened.clone());
        let converted = answer(fresh.vector_query(Request::new(q.clone())).await.unwrap().into_inner());
        assert_eq!(converted, new_format);
        // Opening it again changes nothing.
        #[allow(clippy::disallowed_methods)]
        let mut c = Connection::open(&path).unwrap();
        assert_eq!(upgrade_vectors_to_int8(&mut c).unwrap(), 0);
    }

    /// The ranked path for a KB-only filter (rows of other KBs skipped as they come) answers
    /// what the full filtered query answers; `one_per_document` keeps each document's best
    /// chunk and counts documents against the limit.
    #[tokio::test]
    async fn kb_filter_fast_path_and_one_per_document_match_the_full_query() {
        let mut s = serve().await;
        for i in 0..30u32 {
            let kb = if i % 3 == 0 { "work" } else { "notes" };
            // Chunk 0 says "alpha" i+1 times (better ranks for larger i), chunk 1 once.
            let strong = vec!["alpha"; (i + 1) as usize].join(" ");
            let chunks = vec![chunk(&[], (1, 1), &format!("{strong} beta")), chunk(&[], (2, 2), "alpha gamma")];
            s.upsert(doc(kb, &format!("d{i:02}.md"), chunks)).await;
        }
        let notes = Filters { kb: vec!["notes".into()], ..Default::default() };
        // The same filter with a no-op extra condition takes the full query.
        let full = Filters { modified_after_ms: 1, ..notes.clone() };
        for limit in [1, 5, 19, 40] {
            let q = |f: &Filters, per_doc: bool| KeywordQueryRequest {
                filters: Some(f.clone()),
                limit,
                one_per_document: per_doc,
                ..kw(&["alpha"], MatchMode::All)
            };
            for per_doc in [false, true] {
                let fast = s.keyword(q(&notes, per_doc)).await;
                let slow = s.keyword(q(&full, per_doc)).await;
                assert_eq!(fast, slow, "limit {limit}, one per document {per_doc}");
                assert_eq!(fast.len(), if per_doc { 20.min(limit as usize) } else { 40.min(limit as usize) });
                assert!(fast.iter().all(|(p, _)| p[1..3].parse::<u32>().unwrap() % 3 != 0), "{fast:?}");
                if per_doc {
                    assert!(fast.iter().all(|(_, ordinal)| *ordinal == 0), "best chunk of each: {fast:?}");
                    let mut paths: Vec<_> = fast.iter().map(|(p, _)| p.clone()).collect();
                    paths.dedup();
                    assert_eq!(paths.len(), fast.len());
                }
            }
        }
    }

    /// A term in COMMON_TERM_CHUNKS chunks or more is left out of an any-term query that has a
    /// rarer term (and kept when every term is that common).
    #[tokio::test]
    async fn any_term_queries_leave_out_a_term_every_chunk_has() {
        let mut s = serve().await;
        let per_doc = 500;
        for d in 0..(COMMON_TERM_CHUNKS / per_doc) {
            let chunks =
                (0..per_doc as u32).map(|i| chunk(&[], (i + 1, i + 1), &format!("everywhere c{d}x{i}"))).collect();
            s.upsert(doc("notes", &format!("bulk{d}.md"), chunks)).await;
        }
        s.upsert(doc("notes", "rare.md", vec![chunk(&[], (1, 1), "needle")])).await;
        let any = |t: &[&str]| KeywordQueryRequest { limit: 50, ..kw(t, MatchMode::Any) };
        // With the common term left out only the rare one is scored: its one chunk.
        assert_eq!(s.keyword(any(&["needle", "everywhere"])).await, [("rare.md".to_string(), 0)]);
        // Alone (or with only common company) the common term is still searched.
        assert_eq!(s.keyword(any(&["everywhere", "everywhere"])).await.len(), 50);
        assert_eq!(s.keyword(KeywordQueryRequest { limit: 50, ..kw(&["everywhere"], MatchMode::All) }).await.len(), 50);
    }

    /// One result per document: when the document's best chunk matched only in the title and
    /// parent headings (in every chunk), the chunk shown is its best one that matches in its own
    /// text, with the document's best score; documents keep their order.
    #[tokio::test]
    async fn a_document_is_shown_by_a_chunk_that_matches_in_its_own_text() {
        let mut s = serve().await;
        let titled = |mut c: ChunkInput, title: &str| {
            c.index_title = title.into();
            c
        };
        s.upsert(doc(
            "notes",
            "running.md",
            vec![
                titled(chunk(&["Running guide"], (1, 2), "Notes on my habits."), "Running guide"),
                titled(
                    chunk(
                        &["Running guide", "Training"],
                        (3, 9),
                        "I run every morning before work, and long runs on the weekend build endurance \
                         over the months of a training plan that grows slowly.",
                    ),
                    "Running guide",
                ),
                titled(chunk(&["Running guide", "Shoes"], (10, 12), "Light trainers."), "Running guide"),
            ],
        ))
        .await;
        s.upsert(doc("notes", "other.md", vec![chunk(&["Log"], (1, 2), "a run in the rain")])).await;
        let one = |t: &[&str]| KeywordQueryRequest { one_per_document: true, ..kw(t, MatchMode::All) };
        let shown = s.keyword(one(&["run"])).await;
        assert!(shown.contains(&("running.md".to_string(), 1)), "the Training section stands for it: {shown:?}");
        assert_eq!(shown.len(), 2, "{shown:?}");
        // Every chunk, best first: the shortest (title-only) one is the best by score, which the
        // document keeps.
        let all = s.keyword(kw(&["run"], MatchMode::All)).await;
        let hits = s.client.keyword_query(one(&["run"])).await.unwrap().into_inner().hits;
        let running = hits.iter().find(|h| h.chunk.as_ref().is_some_and(|c| c.path == "running.md")).unwrap();
        let best = s.client.keyword_query(kw(&["run"], MatchMode::All)).await.unwrap().into_inner().hits;
        let best_running = best.iter().find(|h| h.chunk.as_ref().is_some_and(|c| c.path == "running.md")).unwrap();
        assert_eq!(running.score, best_running.score, "{all:?}");
        // A title-only match with no better chunk: that chunk stays.
        s.upsert(doc(
            "notes",
            "titles.md",
            vec![
                titled(chunk(&["Gear"], (1, 1), "Nothing else."), "Marathon gear"),
                titled(chunk(&["More"], (2, 2), "Still nothing."), "Marathon gear"),
            ],
        ))
        .await;
        let shown = s.keyword(one(&["marathon"])).await;
        assert_eq!(shown.len(), 1, "{shown:?}");
    }

    #[test]
    fn the_8_bit_scan_gives_each_rows_exact_dot_product_on_every_path() {
        // Above the two-thread threshold and below it; dimensions that are and are not a
        // multiple of the vector width; the extreme values (-128 × -128 and 127 × -128).
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % 256) as u8 as i8
        };
        for (rows, dim) in [(PARALLEL_SCAN_ROWS + 3, 384), (1000, 385), (7, 1), (0, 16)] {
            let data: Vec<i8> = (0..rows * dim).map(|_| next()).collect();
            let mut q: Vec<i8> = (0..dim).map(|_| next()).collect();
            q[0] = -128;
            let mut out = vec![i32::MIN; rows];
            dot_rows_i8(&data, &q, &mut out);
            for (i, got) in out.iter().enumerate() {
                let row = &data[i * dim..(i + 1) * dim];
                let want: i64 = row.iter().zip(&q).map(|(a, b)| i64::from(*a) * i64::from(*b)).sum();
                assert_eq!(i64::from(*got), want, "row {i} of {rows} × {dim}");
            }
        }
        let extreme = vec![-128i8; 8192];
        assert_eq!(dot_i8(&extreme, &extreme), 128 * 128 * 8192);
    }

    /// The 8-bit scan plus exact rescoring answers what an exact scan answers: the same best
    /// ten, in the same order, with exact similarities (random unit vectors are the hard case:
    /// their similarities crowd together).
    #[test]
    fn two_stage_vector_scan_matches_the_exact_scan() {
        let dim = 384;
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        };
        let mut cache = VectorCache::empty(dim);
        for id in 0..5_000 {
            let v: Vec<f32> = (0..dim).map(|_| next()).collect();
            cache.put(id, &v);
        }
        let vectors = Vectors::default();
        vectors.state().cache = Some(cache);
        let c = Connection::open_in_memory().unwrap();
        let filter = Filter::new(None).unwrap();
        for _ in 0..20 {
            let q: Vec<f32> = (0..dim).map(|_| next()).collect();
            let got = vectors.nearest(&c, &q, &filter, 10).unwrap().unwrap();
            let s = vectors.0.read().unwrap();
            let cache = s.cache.as_ref().unwrap();
            let u = unit(&q);
            let mut exact: Vec<(f32, i64)> =
                (0..cache.ids.len()).map(|i| (dot(cache.row(i), &u), cache.ids[i])).collect();
            exact.sort_by(|a, b| b.0.total_cmp(&a.0));
            let mut got = got;
            got.sort_by(|a, b| b.0.total_cmp(&a.0));
            assert_eq!(got[..10], exact[..10]);
        }
    }
}
