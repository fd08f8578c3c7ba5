//! Store-level benchmark of the Index domain (no network): full keyword index of a generated
//! corpus (10,000 documents × 5 chunks, ~50 MB of text) and keyword/vector query latency.
//! `cargo run --release -p coffer-store --example index_bench [documents]`.
#![allow(clippy::print_stdout)]
use std::time::Instant;

use coffer_proto::store::index_server::Index;
use coffer_proto::store::*;
use coffer_store::db::Db;
use coffer_store::domain::index::IndexService;
use tonic::Request;

fn main() {
    let docs: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(10_000);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(run(docs));
}

/// A deterministic word stream: a Zipf-like draw over a generated vocabulary.
struct Words {
    vocab: Vec<String>,
    state: u64,
}

impl Words {
    fn new() -> Self {
        let syll = ["ka", "lo", "mi", "ne", "ru", "sa", "to", "vi", "ze", "qu", "ion", "ing", "er", "al"];
        let mut vocab = Vec::new();
        for a in syll {
            for b in syll {
                for c in syll {
                    vocab.push(format!("{a}{b}{c}"));
                }
            }
        }
        Self { vocab, state: 42 }
    }
    fn next(&mut self) -> &str {
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        let u = (self.state % 1_000_000) as f64 / 1_000_000.0;
        let i = ((self.vocab.len() as f64).powf(u) as usize).saturating_sub(1).min(self.vocab.len() - 1);
        &self.vocab[i]
    }
    fn text(&mut self, n: usize) -> String {
        let mut s = String::with_capacity(n * 7);
        for i in 0..n {
            if i > 0 {
                s.push(' ');
            }
            let w = self.next().to_owned();
            s.push_str(&w);
        }
        s
    }
}

fn pct(mut v: Vec<f64>, p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() as f64 - 1.0) * p) as usize]
}

async fn run(docs: usize) {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(&dir.path().join("coffer.db")).unwrap();
    let svc = IndexService::new(db.clone());
    svc.create_knowledge_base(Request::new(KnowledgeBase {
        name: "bench".into(),
        kind: KnowledgeBaseKind::Folder.into(),
        root: "/tmp/bench".into(),
        ..Default::default()
    }))
    .await
    .unwrap();
    let mut words = Words::new();
    let mut bytes = 0usize;
    let mut requests = Vec::with_capacity(docs);
    for d in 0..docs {
        let chunks: Vec<ChunkInput> = (0..5u32)
            .map(|j| {
                let body = words.text(140);
                bytes += body.len() * 2;
                ChunkInput {
                    heading_path: vec![format!("Section {j}")],
                    line_start: j * 10 + 1,
                    line_end: j * 10 + 10,
                    hash: format!("{d}-{j}-{}", body.len()),
                    text: body.clone(),
                    index_title: format!("note {d}"),
                    index_headings: format!("section {j}"),
                    index_body: body,
                }
            })
            .collect();
        requests.push(UpsertDocumentRequest {
            kb: "bench".into(),
            path: format!("dir{}/note{d}.md", d % 50),
            mtime_ms: d as i64,
            size: 5000,
            hash: format!("{d}"),
            title: format!("note {d}"),
            tags: vec![format!("tag{}", d % 7)],
            chunks,
            kb_created_ms: 0,
            links: vec![],
            aliases: vec![],
        });
    }
    println!("corpus: {docs} documents, {} chunks, {:.1} MB of text and index text", docs * 5, bytes as f64 / 1e6);
    let t = Instant::now();
    // Like coffer-retrieval: a few upserts in flight, each its own transaction.
    let svc = std::sync::Arc::new(svc);
    let mut inflight = tokio::task::JoinSet::new();
    for r in requests {
        if inflight.len() >= 4 {
            inflight.join_next().await.unwrap().unwrap();
        }
        let svc = svc.clone();
        inflight.spawn(async move { svc.upsert_document(Request::new(r)).await.unwrap() });
    }
    while let Some(r) = inflight.join_next().await {
        r.unwrap();
    }
    println!("full keyword index: {:.2} s", t.elapsed().as_secs_f64());

    // Content words (what remains of a question once coffer-retrieval drops stopwords): rank
    // 50 and below of the vocabulary; then the same with one very common word in each.
    let mut pick = 7u64;
    let mut content = |words: &Words| {
        pick = pick.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        words.vocab[50 + (pick >> 33) as usize % (words.vocab.len() - 50)].clone()
    };
    let queries: Vec<Vec<String>> = (0..200).map(|_| (0..3).map(|_| content(&words)).collect()).collect();
    let common: Vec<Vec<String>> =
        queries.iter().map(|q| vec![q[0].clone(), q[1].clone(), words.vocab[3].clone()]).collect();
    // Every search coffer-retrieval runs names its KBs (a KB filter) and asks 100 deep.
    let kb_only = Some(Filters { kb: vec!["bench".into()], ..Default::default() });
    for (name, mode, filters) in [
        ("keyword all + kb filter (limit 100)", MatchMode::All, kb_only.clone()),
        ("keyword any + kb filter (limit 100)", MatchMode::Any, kb_only.clone()),
        ("keyword any, a common word + kb filter (limit 100)", MatchMode::Any, kb_only.clone()),
        ("keyword all", MatchMode::All, None),
        ("keyword any", MatchMode::Any, None),
        (
            "keyword any + filters",
            MatchMode::Any,
            Some(Filters { tags: vec!["tag3".into()], path_prefix: "dir1".into(), ..Default::default() }),
        ),
        ("keyword any, a common word", MatchMode::Any, None),
        (
            "keyword any, a common word + filters",
            MatchMode::Any,
            Some(Filters { tags: vec!["tag3".into()], ..Default::default() }),
        ),
    ] {
        let mut lat = Vec::new();
        let mut found = 0;
        let queries = if name.contains("common") { &common } else { &queries };
        for q in queries {
            let t = Instant::now();
            let r = svc
                .keyword_query(Request::new(KeywordQueryRequest {
                    terms: q.clone(),
                    mode: mode.into(),
                    filters: filters.clone(),
                    limit: if name.contains("limit 100") { 100 } else { 20 },
                    one_per_document: name.contains("limit 100"),
                }))
                .await
                .unwrap();
            lat.push(t.elapsed().as_secs_f64() * 1000.0);
            found += r.into_inner().hits.len();
        }
        println!(
            "{name}: p50 {:.2} ms, p99 {:.2} ms, {:.1} hits/query",
            pct(lat.clone(), 0.5),
            pct(lat, 0.99),
            found as f64 / 200.0
        );
    }

    // Raw SQL variants (where does a keyword query spend its time?).
    for (name, sql) in [
        ("fts only, rank", "SELECT rowid, rank FROM kb_fts WHERE kb_fts MATCH ?1 ORDER BY rank LIMIT 20"),
        ("fts only, count", "SELECT COUNT(*) FROM kb_fts WHERE kb_fts MATCH ?1"),
        (
            "fts + join, count",
            "SELECT COUNT(*) FROM kb_fts f CROSS JOIN kb_chunks c CROSS JOIN kb_documents d WHERE kb_fts MATCH ?1 AND c.id = f.rowid AND d.id = c.document",
        ),
    ] {
        let mut lat = Vec::new();
        for q in &queries {
            let expr = q.iter().map(|t| format!("\"{t}\"")).collect::<Vec<_>>().join(" OR ");
            let sql = sql.to_owned();
            let t = Instant::now();
            db.read(move |c| {
                let mut st = c.prepare_cached(&sql)?;
                let mut rows = st.query([expr])?;
                while rows.next()?.is_some() {}
                Ok(())
            })
            .await
            .unwrap();
            lat.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        println!("{name} (any): p50 {:.2} ms, p99 {:.2} ms", pct(lat.clone(), 0.5), pct(lat, 0.99));
    }

    let dim = 384u32;
    svc.configure_vectors(Request::new(ConfigureVectorsRequest { model: "bench".into(), dimension: dim }))
        .await
        .unwrap();
    let t = Instant::now();
    let mut n = 0;
    loop {
        let pending = svc
            .pending_embeddings(Request::new(PendingEmbeddingsRequest { limit: 1000 }))
            .await
            .unwrap()
            .into_inner()
            .hits;
        if pending.is_empty() {
            break;
        }
        let embeddings = pending
            .iter()
            .map(|h| {
                let id = h.chunk.as_ref().unwrap().id;
                Embedding {
                    chunk_id: id,
                    vector: (0..dim).map(|i| (id as f32 * 0.37 + i as f32 * 1.3).sin()).collect(),
                }
            })
            .collect::<Vec<_>>();
        n += embeddings.len();
        svc.put_embeddings(Request::new(PutEmbeddingsRequest { model: "bench".into(), dimension: dim, embeddings }))
            .await
            .unwrap();
    }
    println!("stored {n} vectors of {dim} dimensions: {:.2} s", t.elapsed().as_secs_f64());
    for (name, filters) in [
        ("vector", None),
        ("vector + kb filter", Some(Filters { kb: vec!["bench".into()], ..Default::default() })),
        ("vector + tag filter", Some(Filters { tags: vec!["tag3".into()], ..Default::default() })),
    ] {
        let mut lat = Vec::new();
        for q in 0..50 {
            let embedding: Vec<f32> = (0..dim).map(|i| (q as f32 * 0.11 + i as f32 * 0.7).cos()).collect();
            let t = Instant::now();
            svc.vector_query(Request::new(VectorQueryRequest { embedding, filters: filters.clone(), limit: 20 }))
                .await
                .unwrap();
            lat.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        println!("{name}: p50 {:.2} ms, p99 {:.2} ms", pct(lat.clone(), 0.5), pct(lat, 0.99));
    }
    let t = Instant::now();
    let stats = svc.stats(Request::new(StatsRequest::default())).await.unwrap().into_inner();
    println!(
        "stats: {:.2} ms ({:?})",
        t.elapsed().as_secs_f64() * 1000.0,
        stats.knowledge_bases.iter().map(|k| (k.documents, k.chunks, k.embedded)).collect::<Vec<_>>()
    );
    let size = std::fs::metadata(dir.path().join("coffer.db")).map(|m| m.len()).unwrap_or(0)
        + std::fs::metadata(dir.path().join("coffer.db-wal")).map(|m| m.len()).unwrap_or(0);
    println!("database: {:.1} MB", size as f64 / 1e6);
}
