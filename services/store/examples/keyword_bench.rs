//! Store-level probe of the keyword engine on the retrieval benchmark's own corpus (no network,
//! no daemon): the 10,000 generated notes of `coffer-bench --only retrieval-speed`
//! (`tests/src/bench/corpus.rs`, same seed), chunked and normalized by coffer-retrieval's own
//! code (`indexer::document_request`), written through the Index service, then the benchmark's
//! 220 keyword questions (same seed; terms by `terms::query_terms`) run the way
//! coffer-retrieval's keyword engine runs them (all-term query, then any-term when it must; a
//! KB filter; one result per document; limit 10), each question once, in order, as the
//! benchmark does (so a word's first use is measured too).
//!
//! `cargo build --release -p coffer-store --example keyword_bench && target/release/examples/keyword_bench [notes] [answers.tsv]`
//!
//! With `answers.tsv`, each question's result list (document paths, best first) is written
//! there, one line per question, to compare two builds' rankings.
#![allow(clippy::print_stdout)]
use std::io::Write as _;
use std::time::Instant;

use coffer_proto::store::index_server::Index;
use coffer_proto::store::*;
use coffer_store::db::Db;
use coffer_store::domain::index::IndexService;
use rusqlite::OptionalExtension as _;
use tonic::Request;

/// The benchmark's generator, compiled in as it is.
#[allow(dead_code)]
#[path = "../../../tests/src/bench/corpus.rs"]
mod corpus;

/// The speed benchmark's seed and sizes (`tests/src/bin/coffer-bench/retrieval.rs`).
const SEED: u64 = 20_261_201;
const QUERIES: usize = 200;
const WARM_QUERIES: usize = 20;
/// coffer-retrieval's `TOP_UP` (search.rs).
const TOP_UP: usize = 50;

fn main() {
    let notes: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(10_000);
    let answers = std::env::args().nth(2);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(run(notes, answers));
}

fn pct(mut v: Vec<f64>, p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() as f64 - 1.0) * p) as usize]
}

async fn run(notes: usize, answers: Option<String>) {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(&dir.path().join("coffer.db")).unwrap();
    let svc = std::sync::Arc::new(IndexService::new(db.clone()));
    svc.create_knowledge_base(Request::new(KnowledgeBase {
        name: "speed".into(),
        kind: KnowledgeBaseKind::Folder.into(),
        root: "/tmp/speed".into(),
        ..Default::default()
    }))
    .await
    .unwrap();
    let t = Instant::now();
    let mut chunks = 0usize;
    let mut inflight = tokio::task::JoinSet::new();
    for (i, note) in corpus::Corpus::new(SEED, notes).enumerate() {
        let rel = note.path.to_string_lossy().into_owned();
        let (req, _) = coffer_retrieval::indexer::document_request(
            "speed",
            &rel,
            &note.text,
            i as i64,
            note.text.len() as u64,
            format!("{i}"),
        )
        .unwrap();
        chunks += req.chunks.len();
        if inflight.len() >= 4 {
            inflight.join_next().await.unwrap().unwrap();
        }
        let svc = svc.clone();
        inflight.spawn(async move { svc.upsert_document(Request::new(req)).await.unwrap() });
    }
    while let Some(r) = inflight.join_next().await {
        r.unwrap();
    }
    println!("{notes} notes, {chunks} chunks indexed in {:.1} s", t.elapsed().as_secs_f64());

    // (`KW_OPTIMIZE=1`: FTS5's `optimize` first, every segment merged into one.)
    if std::env::var("KW_OPTIMIZE").is_ok_and(|v| v == "1") {
        let t = Instant::now();
        db.write(|t, _| Ok(t.execute("INSERT INTO kb_fts (kb_fts) VALUES ('optimize')", [])?)).await.unwrap();
        println!("optimize: {:.1} s", t.elapsed().as_secs_f64());
    }
    let segments: i64 = db
        .read(|c| Ok(c.query_row("SELECT count(*) FROM kb_fts_data WHERE id > 10", [], |r| r.get(0))?))
        .await
        .unwrap();
    println!("kb_fts_data rows (segment pages and structure): {segments}");

    // What counting a term's rows costs (bm25's idf needs it; the store keeps counts until the
    // next write): `MATCH` + `count(*)` against FTS5's own `fts5vocab` (one C loop over the
    // term's doclist), for the words the questions use.
    {
        let words: Vec<String> = corpus::EN[25..].iter().map(|w| (*w).to_owned()).collect();
        let (a, b, d) = db
            .read(move |c| {
                c.execute_batch(
                    "CREATE VIRTUAL TABLE IF NOT EXISTS temp.kb_fts_rows USING fts5vocab(main, kb_fts, row)",
                )?;
                let (mut a, mut b, mut d) = (Vec::new(), Vec::new(), Vec::new());
                let df = coffer_store::fts_rank::DocFreq::default();
                for w in &words {
                    let t = Instant::now();
                    let n: i64 = c
                        .prepare_cached("SELECT count(*) FROM kb_fts WHERE kb_fts MATCH ?1")?
                        .query_row([format!("\"{w}\"")], |r| r.get(0))?;
                    a.push(t.elapsed().as_secs_f64() * 1e3);
                    let t = Instant::now();
                    let m: Option<i64> = c
                        .prepare_cached("SELECT doc FROM temp.kb_fts_rows WHERE term = ?1")?
                        .query_row([w], |r| r.get(0))
                        .optional()?;
                    b.push(t.elapsed().as_secs_f64() * 1e3);
                    let t = Instant::now();
                    let k = df.count(c, &format!("\"{w}\""))?;
                    d.push(t.elapsed().as_secs_f64() * 1e3);
                    assert_eq!(k, n, "{w}");
                    if m.is_some_and(|m| m != n) {
                        println!("  {w}: MATCH {n} vs vocab {m:?}");
                    }
                }
                Ok((a, b, d))
            })
            .await
            .unwrap();
        println!(
            "row count of a word: MATCH count(*) p50 {:.3} ms p99 {:.3} ms; fts5vocab p50 {:.3} ms p99 {:.3} ms; DocFreq::count (tokenize + fts5vocab) p50 {:.3} ms",
            pct(a.clone(), 0.5),
            pct(a, 0.99),
            pct(b.clone(), 0.5),
            pct(b, 0.99),
            pct(d, 0.5)
        );
    }

    let filters = Some(Filters { kb: vec!["speed".into()], ..Default::default() });
    let query = |terms: &[String], mode: MatchMode| KeywordQueryRequest {
        terms: terms.to_vec(),
        mode: mode.into(),
        filters: filters.clone(),
        limit: 10,
        one_per_document: true,
    };
    let questions = corpus::queries(SEED + 1, QUERIES);
    let mut out = answers.map(|p| std::io::BufWriter::new(std::fs::File::create(p).unwrap()));
    // Pass 1 as the benchmark runs it; pass 2 the same questions again (every word seen before).
    // (`KW_WARM_WAIT=s`: wait s seconds first, as a store does once writes stop, so that the
    // common terms' counts are read before the first question; see `DocFreq::warm`.)
    if let Some(secs) = std::env::var("KW_WARM_WAIT").ok().and_then(|v| v.parse::<u64>().ok()) {
        tokio::time::sleep(std::time::Duration::from_secs(secs)).await;
    }
    // (`KW_PASSES=n`: more passes, e.g. to profile.)
    let passes: usize = std::env::var("KW_PASSES").ok().and_then(|v| v.parse().ok()).unwrap_or(2);
    for pass in 1..=passes {
        let (mut lat, mut lat_all, mut lat_any) = (Vec::new(), Vec::new(), Vec::new());
        let (mut empty, mut any_runs) = (0, 0);
        for (i, q) in questions.iter().cycle().take(QUERIES + WARM_QUERIES).enumerate() {
            let terms = coffer_retrieval::terms::query_terms(q);
            let t = Instant::now();
            let mut hits =
                svc.keyword_query(Request::new(query(&terms, MatchMode::All))).await.unwrap().into_inner().hits;
            let all_ms = t.elapsed().as_secs_f64() * 1e3;
            let mut any_ms = None;
            if !(hits.len() >= TOP_UP.min(10) || terms.len() == 1 || (terms.len() == 2 && !hits.is_empty())) {
                let t = Instant::now();
                let any =
                    svc.keyword_query(Request::new(query(&terms, MatchMode::Any))).await.unwrap().into_inner().hits;
                any_ms = Some(t.elapsed().as_secs_f64() * 1e3);
                let have: std::collections::HashSet<i64> = hits.iter().map(|h| h.chunk.as_ref().unwrap().id).collect();
                hits.extend(any.into_iter().filter(|h| !have.contains(&h.chunk.as_ref().unwrap().id)));
            }
            let ms = t.elapsed().as_secs_f64() * 1e3;
            if let Some(out) = out.as_mut().filter(|_| pass == 1) {
                let paths: Vec<String> = hits
                    .iter()
                    .take(10)
                    .map(|h| {
                        let c = h.chunk.as_ref().unwrap();
                        format!("{}#{}", c.path, c.ordinal)
                    })
                    .collect();
                writeln!(out, "{q}\t{}", paths.join(" ")).unwrap();
            }
            if i < WARM_QUERIES {
                continue;
            }
            lat.push(ms);
            lat_all.push(all_ms);
            if let Some(a) = any_ms {
                lat_any.push(a);
                any_runs += 1;
            }
            empty += usize::from(hits.is_empty());
        }
        println!("pass {pass}:");
        println!(
            "keyword engine (all, then any when needed): p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms; {empty} answered with nothing",
            pct(lat.clone(), 0.5),
            pct(lat.clone(), 0.9),
            pct(lat, 0.99)
        );
        println!("  all-term query: p50 {:.2} ms, p99 {:.2} ms", pct(lat_all.clone(), 0.5), pct(lat_all, 0.99));
        if !lat_any.is_empty() {
            println!(
                "  any-term query ({any_runs} of {QUERIES} questions): p50 {:.2} ms, p99 {:.2} ms",
                pct(lat_any.clone(), 0.5),
                pct(lat_any, 0.99)
            );
        }
    }
}
