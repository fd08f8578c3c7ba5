//! The `coffer.retrieval.v1.Retrieval` service: each RPC validated here (messages name the field
//! and its limit) and handed to the module that does the work; errors become `Status` once
//! ([`crate::error`]).
use std::sync::Arc;

use coffer_proto::retrieval::retrieval_server::Retrieval;
use coffer_proto::retrieval::{
    AddKnowledgeBaseRequest, EmbedReply, EmbedRequest, EngineConfig, Fact, FactId, FileError, KnowledgeBaseInfo,
    KnowledgeBaseName, ListFactsReply, ListFactsRequest, ListKnowledgeBasesReply, ListKnowledgeBasesRequest,
    ListSkillsReply, ListSkillsRequest, Note, ReadNoteRequest, RecallRequest, ReindexReply, ReindexRequest,
    RememberReply, RememberRequest, RemoveReply, SearchFilters, SearchReply, SearchRequest, SetWritableRequest, Skill,
    SkillName, StatusReply, StatusRequest, Vector, WriteNoteReply, WriteNoteRequest,
};
use coffer_proto::store::{KnowledgeBase, KnowledgeBaseKind, KnowledgeBaseStats, StatsRequest};
use tonic::{Request, Response, Status};

use crate::embedding_worker::Embeddings;
use crate::error::{Error, Result};
use crate::indexer::Indexer;
use crate::memory::Memory;
use crate::search::{self, Searcher};
use crate::sources::{MEMORY, Sources};

/// Most file errors listed per KB.
const MAX_ERRORS: usize = 200;
/// Hidden folders named in a KB's status (all are counted).
const MAX_HIDDEN_NAMED: usize = 20;

/// The service's state: what each RPC reaches.
pub struct RetrievalService {
    /// KB definitions.
    pub sources: Arc<Sources>,
    /// Passes, watchers, per-file updates.
    pub indexer: Arc<Indexer>,
    /// Facts.
    pub memory: Arc<Memory>,
    /// Searches.
    pub searcher: Arc<Searcher>,
    /// The vector engine's worker.
    pub embeddings: Arc<Embeddings>,
    /// Notes read and written by path.
    pub notes: Arc<crate::notes::Notes>,
}

type Reply<T> = std::result::Result<Response<T>, Status>;

fn ok<T>(r: Result<T>) -> Reply<T> {
    r.map(Response::new).map_err(Status::from)
}

/// Most texts one `Embed` call takes.
pub const MAX_EMBED_TEXTS: usize = 256;
/// Longest text `Embed` takes, in bytes.
pub const MAX_EMBED_TEXT_BYTES: usize = 8192;

impl RetrievalService {
    /// `Embed`: the texts' vectors from the configured endpoint.
    ///
    /// # Errors
    /// [`Error::Invalid`] naming the limit; [`Error::Precondition`] when the vector engine is off
    /// (why); [`Error::Unavailable`] when the endpoint fails (its error, never the key).
    pub async fn embed_texts(&self, texts: Vec<String>) -> Result<EmbedReply> {
        if texts.is_empty() || texts.len() > MAX_EMBED_TEXTS {
            return Err(Error::Invalid(format!("texts: 1 to {MAX_EMBED_TEXTS} texts, got {}", texts.len())));
        }
        if let Some((i, t)) = texts.iter().enumerate().find(|(_, t)| t.is_empty() || t.len() > MAX_EMBED_TEXT_BYTES) {
            return Err(Error::Invalid(format!("texts[{i}]: 1 to {MAX_EMBED_TEXT_BYTES} bytes, got {}", t.len())));
        }
        let Some(ready) = self.embeddings.ready() else {
            let why = self.embeddings.unavailable().unwrap_or_else(|| "the vector engine is off".into());
            return Err(Error::Precondition(format!("no embeddings endpoint: {why}")));
        };
        let vectors = ready.embedder.embed(&texts).await.map_err(|e| Error::Unavailable(e.to_string()))?;
        Ok(EmbedReply {
            vectors: vectors.into_iter().map(|values| Vector { values }).collect(),
            model: ready.model.clone(),
            dimension: ready.dimension,
        })
    }

    fn engines(&self) -> Vec<EngineConfig> {
        vec![
            EngineConfig { name: "grep".into(), enabled: true, detail: "regex or literal search of the files".into() },
            EngineConfig {
                name: "keyword".into(),
                enabled: true,
                detail: "FTS5 bm25, CJK bigrams, porter stemming".into(),
            },
            self.embeddings.engine(),
        ]
    }

    fn info(&self, def: &KnowledgeBase, stats: Option<&KnowledgeBaseStats>) -> KnowledgeBaseInfo {
        let rt = self.indexer.runtime(&def.name);
        let mut errors: Vec<FileError> = stats
            .map(|s| s.errors.iter().map(|d| FileError { path: d.path.clone(), error: d.error.clone() }).collect())
            .unwrap_or_default();
        if let Some(rt) = &rt {
            errors.extend(rt.walk_issues());
        }
        errors.sort_by(|a, b| a.path.cmp(&b.path));
        errors.truncate(MAX_ERRORS);
        let embedded = stats.map_or(0, |s| s.embedded);
        let chunks = stats.map_or(0, |s| s.chunks);
        let vectors_on = self.embeddings.ready().is_some();
        let hidden = rt.as_ref().map(|r| r.hidden_skipped()).unwrap_or_default();
        KnowledgeBaseInfo {
            name: def.name.clone(),
            kind: if def.kind == KnowledgeBaseKind::Memory as i32 { "memory" } else { "folder" }.into(),
            root: def.root.clone(),
            include: def.include.clone(),
            exclude: def.exclude.clone(),
            created_ms: def.created_ms,
            documents: stats.map_or(0, |s| s.documents),
            chunks,
            embedded,
            last_sync_ms: rt.as_ref().map_or(0, |r| r.last_sync_ms()).max(stats.map_or(0, |s| s.last_indexed_ms)),
            pending: rt.as_ref().map_or(0, |r| r.pending()),
            pending_embeddings: if vectors_on { chunks.saturating_sub(embedded) } else { 0 },
            errors,
            progress: rt.as_ref().map(|r| r.progress()),
            watching: rt.as_ref().is_some_and(|r| r.watching()),
            hidden_skipped_count: hidden.len() as u64,
            hidden_skipped: hidden.into_iter().take(MAX_HIDDEN_NAMED).collect(),
            corpus_bytes: stats.map_or(0, |s| s.corpus_bytes),
            index_bytes: stats.map_or(0, |s| s.index_bytes),
            writable: self.notes.writable(def),
        }
    }

    async fn infos(&self, defs: Vec<KnowledgeBase>) -> Result<Vec<KnowledgeBaseInfo>> {
        let stats = self.sources.index().stats(StatsRequest { kb: String::new() }).await?.into_inner().knowledge_bases;
        Ok(defs.iter().map(|d| self.info(d, stats.iter().find(|s| s.kb == d.name))).collect())
    }

    async fn one(&self, name: &str) -> Result<KnowledgeBaseInfo> {
        let def = self.sources.require(name)?;
        let stats = self.sources.index().stats(StatsRequest { kb: name.into() }).await?.into_inner().knowledge_bases;
        Ok(self.info(&def, stats.iter().find(|s| s.kb == name)))
    }

    async fn search_req(&self, r: SearchRequest) -> Result<SearchReply> {
        let q = search::validate(
            &r.query,
            r.filters.as_ref(),
            &r.engines,
            r.limit,
            r.snippet_chars,
            r.regex,
            &self.searcher.folder_kbs(),
        )?;
        for kb in &q.kbs {
            crate::sources::check_name(kb).map_err(|e| Error::Invalid(format!("filters.kb: {e}")))?;
        }
        let (q, prefix_warning) = self.place_path_prefix(q)?;
        if q.text.is_empty() {
            let mut reply = self.searcher.tagged(&search::Query { cursor: r.cursor, ..q }).await?;
            reply.warnings.extend(prefix_warning);
            return Ok(reply);
        }
        if !r.cursor.is_empty() {
            return Err(Error::Invalid(
                "cursor pages a tag listing (tags without a query); a search has no pages".into(),
            ));
        }
        let mut reply = self.searcher.search(&q).await?;
        reply.warnings.extend(prefix_warning);
        Ok(reply)
    }

    /// `filters.path_prefix` is relative to each KB's root. An absolute one inside the root of
    /// a KB searched is that KB with the rest as the prefix (what the user meant); one inside
    /// none is refused, naming the problem. A relative one that no KB searched has a file or
    /// folder for gives a warning (its results are empty for that reason, not for the query).
    ///
    /// # Errors
    /// [`Error::Invalid`] for an absolute prefix outside every KB searched.
    fn place_path_prefix(&self, mut q: search::Query) -> Result<(search::Query, Option<String>)> {
        if q.path_prefix.is_empty() {
            return Ok((q, None));
        }
        let roots: Vec<(String, std::path::PathBuf)> = q
            .kbs
            .iter()
            .filter_map(|kb| self.sources.get(kb).map(|d| (kb.clone(), std::path::PathBuf::from(d.root))))
            .collect();
        if q.path_prefix.starts_with('/') {
            let given = std::path::Path::new(&q.path_prefix);
            let inside = roots.iter().find_map(|(kb, root)| given.strip_prefix(root).ok().map(|rest| (kb, rest)));
            let Some((kb, rest)) = inside else {
                return Err(Error::Invalid(format!(
                    "path_prefix {} is absolute and inside no knowledge base searched; it is a path inside a \
                     knowledge base, relative to its root (e.g. projects/)",
                    crate::error::shown(&q.path_prefix)
                )));
            };
            let mut rel = rest.to_string_lossy().into_owned();
            if q.path_prefix.ends_with('/') && !rel.is_empty() {
                rel.push('/');
            }
            q.kbs = vec![kb.clone()];
            q.path_prefix = rel;
            return Ok((q, None));
        }
        q.path_prefix = tidy_relative_prefix(&q.path_prefix);
        if q.path_prefix.is_empty() {
            return Ok((q, None));
        }
        let exists = roots.iter().any(|(_, root)| prefix_exists(root, &q.path_prefix));
        let warning = (!exists).then(|| {
            format!(
                "no file or folder of the knowledge bases searched starts with path_prefix {}: it is a path inside \
                 a knowledge base, relative to its root (e.g. projects/)",
                crate::error::shown(&q.path_prefix)
            )
        });
        Ok((q, warning))
    }
}

/// A relative path prefix as the index stores paths: `.` and empty segments dropped
/// (`./projects`, `projects//notes` → `projects`, `projects/notes`), a trailing `/` kept; `..`
/// stays (such a prefix names nothing inside a knowledge base, and the caller warns).
fn tidy_relative_prefix(prefix: &str) -> String {
    let mut tidy = prefix.split('/').filter(|s| !s.is_empty() && *s != ".").collect::<Vec<_>>().join("/");
    if prefix.ends_with('/') && !tidy.is_empty() {
        tidy.push('/');
    }
    tidy
}

/// Whether a file or folder under `root` has a path (relative, `/`-separated) starting with
/// `prefix`: the folder `prefix` names up to its last `/` holds an entry whose name starts with
/// the rest.
fn prefix_exists(root: &std::path::Path, prefix: &str) -> bool {
    let (dir, start) = prefix.rsplit_once('/').unwrap_or(("", prefix));
    if dir.split('/').any(|s| s == "..") {
        return false;
    }
    let Ok(entries) = std::fs::read_dir(root.join(dir)) else { return false };
    entries.flatten().any(|e| e.file_name().to_string_lossy().starts_with(start))
}

#[tonic::async_trait]
impl Retrieval for RetrievalService {
    async fn add_knowledge_base(&self, req: Request<AddKnowledgeBaseRequest>) -> Reply<KnowledgeBaseInfo> {
        self.sources.ready()?;
        let r = req.into_inner();
        ok(async {
            let def = self.sources.add(&r.name, &r.path, r.include, r.exclude).await?;
            self.indexer.start_kb(&def.name);
            Ok(self.info(&def, None))
        }
        .await)
    }

    async fn list_knowledge_bases(&self, _req: Request<ListKnowledgeBasesRequest>) -> Reply<ListKnowledgeBasesReply> {
        self.sources.ready()?;
        ok(self.infos(self.sources.all()).await.map(|knowledge_bases| ListKnowledgeBasesReply { knowledge_bases }))
    }

    async fn get_knowledge_base(&self, req: Request<KnowledgeBaseName>) -> Reply<KnowledgeBaseInfo> {
        self.sources.ready()?;
        ok(self.one(&req.into_inner().name).await)
    }

    async fn remove_knowledge_base(&self, req: Request<KnowledgeBaseName>) -> Reply<RemoveReply> {
        self.sources.ready()?;
        let name = req.into_inner().name;
        ok(async {
            self.sources.require(&name)?;
            if name == MEMORY {
                // Refused by `Sources::remove`, before anything is stopped.
                return self.sources.remove(&name).await.map(|removed| RemoveReply { removed });
            }
            // The pass and the watcher stop first, and the writes in flight end, so nothing
            // re-creates a document of the KB once its definition is gone.
            let quiet = self.indexer.stop_kb(&name).await;
            match self.sources.remove(&name).await {
                Ok(removed) => {
                    drop(quiet);
                    Ok(RemoveReply { removed })
                }
                Err(e) => {
                    // Not removed (the store is down): the KB keeps being indexed.
                    drop(quiet);
                    self.indexer.start_kb(&name);
                    Err(e)
                }
            }
        }
        .await)
    }

    async fn reindex(&self, req: Request<ReindexRequest>) -> Reply<ReindexReply> {
        self.sources.ready()?;
        let r = req.into_inner();
        ok(async {
            let defs = if r.kb.is_empty() { self.sources.all() } else { vec![self.sources.require(&r.kb)?] };
            for d in &defs {
                if !self.indexer.reindex(&d.name, r.clean) {
                    self.indexer.start_kb(&d.name);
                    self.indexer.reindex(&d.name, r.clean);
                }
            }
            Ok(ReindexReply { knowledge_bases: self.infos(defs).await? })
        }
        .await)
    }

    async fn status(&self, _req: Request<StatusRequest>) -> Reply<StatusReply> {
        self.sources.ready()?;
        ok(async {
            Ok(StatusReply { knowledge_bases: self.infos(self.sources.all()).await?, engines: self.engines() })
        }
        .await)
    }

    async fn search(&self, req: Request<SearchRequest>) -> Reply<SearchReply> {
        self.sources.ready()?;
        ok(self.search_req(req.into_inner()).await)
    }

    async fn remember(&self, req: Request<RememberRequest>) -> Reply<RememberReply> {
        self.sources.ready()?;
        let r = req.into_inner();
        ok(self.memory.remember(&r.text, r.tags, &r.source, r.allow_secret).await)
    }

    async fn recall(&self, req: Request<RecallRequest>) -> Reply<SearchReply> {
        self.sources.ready()?;
        let r = req.into_inner();
        let search = SearchRequest {
            query: r.query,
            filters: Some(SearchFilters { kb: vec![MEMORY.into()], tags: r.tags, ..SearchFilters::default() }),
            engines: vec![],
            limit: r.limit,
            snippet_chars: r.snippet_chars,
            regex: false,
            cursor: String::new(),
        };
        ok(self.search_req(search).await)
    }

    async fn list_facts(&self, req: Request<ListFactsRequest>) -> Reply<ListFactsReply> {
        self.sources.ready()?;
        let r = req.into_inner();
        ok(self.memory.list(r.limit, &r.after, &r.tags))
    }

    async fn get_fact(&self, req: Request<FactId>) -> Reply<Fact> {
        self.sources.ready()?;
        ok(self.memory.get(&req.into_inner().id))
    }

    async fn forget(&self, req: Request<FactId>) -> Reply<RemoveReply> {
        self.sources.ready()?;
        ok(self.memory.forget(&req.into_inner().id).await.map(|removed| RemoveReply { removed }))
    }

    async fn list_skills(&self, _req: Request<ListSkillsRequest>) -> Reply<ListSkillsReply> {
        let dir = self.sources.home().root().join("skills");
        ok(tokio::task::spawn_blocking(move || crate::skills::list(&dir))
            .await
            .map_err(|e| Error::Internal(format!("listing skills panicked: {e}"))))
    }

    async fn embed(&self, req: Request<EmbedRequest>) -> Reply<EmbedReply> {
        ok(self.embed_texts(req.into_inner().texts).await)
    }

    async fn read_note(&self, req: Request<ReadNoteRequest>) -> Reply<Note> {
        self.sources.ready()?;
        let r = req.into_inner();
        ok(self.notes.read(&r.kb, &r.path, r.start_line, r.end_line, r.start_byte).await)
    }

    async fn write_note(&self, req: Request<WriteNoteRequest>) -> Reply<WriteNoteReply> {
        self.sources.ready()?;
        let r = req.into_inner();
        ok(self.notes.write(&r.kb, &r.path, &r.content, &r.mode).await)
    }

    async fn set_writable(&self, req: Request<SetWritableRequest>) -> Reply<KnowledgeBaseInfo> {
        self.sources.ready()?;
        let r = req.into_inner();
        ok(async {
            self.sources.set_writable(&r.kb, r.writable).await?;
            self.one(&r.kb).await
        }
        .await)
    }

    async fn load_skill(&self, req: Request<SkillName>) -> Reply<Skill> {
        let dir = self.sources.home().root().join("skills");
        let name = req.into_inner().name;
        ok(tokio::task::spawn_blocking(move || crate::skills::load(&dir, &name))
            .await
            .map_err(|e| Error::Internal(format!("loading a skill panicked: {e}")))
            .and_then(|r| r))
    }
}

#[cfg(test)]
mod tests {
    use super::tidy_relative_prefix;

    #[test]
    fn relative_prefixes_are_tidied_as_the_index_stores_paths() {
        for (given, want) in [
            ("./projects", "projects"),
            ("./projects/", "projects/"),
            ("projects//notes", "projects/notes"),
            ("projects/./notes/", "projects/notes/"),
            ("./", ""),
            (".", ""),
            ("projects", "projects"),
            ("projects/../daily", "projects/../daily"),
        ] {
            assert_eq!(tidy_relative_prefix(given), want, "{given:?}");
        }
    }
}
