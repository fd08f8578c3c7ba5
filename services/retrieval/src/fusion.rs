//! Weighted reciprocal rank fusion (RRF) of the engines' ranked lists, per document.
//!
//! Cormack, Clarke and Büttcher, "Reciprocal Rank Fusion outperforms Condorcet and individual
//! rank learning methods" (SIGIR 2009), with a weight per engine: a document's fused score is
//!
//! ```text
//! score(d) = Σ over engines e that found d of w_e / (k + rank_e(d))      rank 1-based, k = 60
//! ```
//!
//! where `rank_e(d)` is the rank of the document's best chunk in engine `e`'s list (a list that
//! names a document twice keeps its first rank; ranks count documents, not chunks). Fusing per
//! document rather than per chunk matters when two engines pick different chunks of the same
//! document: each still credits the document (on Cranfield, fusing chunks lost a top-10
//! document in 91 of 225 questions). The result shows the chunk of the engine that contributed
//! most to the document's score (ties: the earlier list).
//!
//! [`K`] = 60 is the paper's constant: it damps the weight of the very first ranks so that one
//! engine's top hit does not outweigh agreement between engines, and it needs no score
//! normalisation (bm25, cosine similarity and grep hit counts are not comparable). The weights
//! ([`Weights`], the `retrieval.fusion.*_weight` settings) only matter relative to each other;
//! engines' own scores are kept only for display ([`Fused::ranks`]). With every weight equal
//! this is plain RRF.
//!
//! Ties (equal fused scores) are broken by KB name, then document path, both ascending, so the
//! order is deterministic for a given set of lists.
use std::cmp::Ordering;
use std::collections::BTreeMap;

/// The RRF constant `k` (see the module docs).
pub const K: f64 = 60.0;

/// Each engine's weight in the fused score (relative: only ratios matter). An engine not named
/// here (none today) weighs 1.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Weights {
    /// `grep`.
    pub grep: f64,
    /// `keyword`.
    pub keyword: f64,
    /// `vector`.
    pub vector: f64,
}

impl Default for Weights {
    /// Every engine 1: plain RRF.
    fn default() -> Self {
        Self { grep: 1.0, keyword: 1.0, vector: 1.0 }
    }
}

impl Weights {
    /// The weight of `engine`.
    pub fn of(&self, engine: &str) -> f64 {
        match engine {
            "grep" => self.grep,
            "keyword" => self.keyword,
            "vector" => self.vector,
            _ => 1.0,
        }
    }

    /// The fusion's name shown in replies (`SearchReply.fusion`), e.g.
    /// `rrf k=60 per document, weights grep 1 keyword 2 vector 1`.
    pub fn name(&self) -> String {
        format!("rrf k=60 per document, weights grep {} keyword {} vector {}", self.grep, self.keyword, self.vector)
    }
}

/// What identifies a chunk across engines: the store's chunk id, plus its document.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ChunkRef {
    /// KB name.
    pub kb: String,
    /// Document path relative to the KB root.
    pub path: String,
    /// First line of the chunk (1-based).
    pub line_start: u32,
    /// The store's chunk id.
    pub id: i64,
}

/// One engine's ranked list, best first, with the engine's own scores.
#[derive(Debug, Clone)]
pub struct Ranked {
    /// Engine name (`grep`, `keyword`, `vector`).
    pub engine: &'static str,
    /// Hits, best first. A document listed twice keeps its best rank (and chunk).
    pub hits: Vec<(ChunkRef, f64)>,
}

/// One engine's contribution to a fused result.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineRank {
    /// Engine name.
    pub engine: &'static str,
    /// 1-based rank of the document in that engine's list.
    pub rank: u32,
    /// The engine's own score of its best chunk of the document (higher is better).
    pub score: f64,
}

/// A fused result: one document.
#[derive(Debug, Clone, PartialEq)]
pub struct Fused {
    /// The chunk shown: that of the engine contributing most to `score`.
    pub chunk: ChunkRef,
    /// Σ w_e / (K + rank_e).
    pub score: f64,
    /// Each engine that found the document, in the order of the input lists.
    pub ranks: Vec<EngineRank>,
}

/// Fuses `lists` per document with `weights` and returns the best `limit` documents, ordered
/// by fused score (descending), then by KB and path (ascending). An empty list contributes
/// nothing.
pub fn fuse(lists: &[Ranked], weights: &Weights, limit: usize) -> Vec<Fused> {
    // Per document: (contributions, the shown chunk and its contribution).
    type Entry<'a> = (Vec<EngineRank>, &'a ChunkRef, f64);
    let mut by_doc: BTreeMap<(&str, &str), Entry<'_>> = BTreeMap::new();
    for list in lists {
        let w = weights.of(list.engine);
        let mut seen = std::collections::HashSet::new();
        let mut rank = 0u32;
        for (chunk, score) in &list.hits {
            let doc = (chunk.kb.as_str(), chunk.path.as_str());
            if !seen.insert(doc) {
                continue;
            }
            rank += 1;
            let part = w / (K + f64::from(rank));
            let r = EngineRank { engine: list.engine, rank, score: *score };
            match by_doc.get_mut(&doc) {
                Some((ranks, shown, best)) => {
                    ranks.push(r);
                    if part > *best {
                        (*shown, *best) = (chunk, part);
                    }
                }
                None => {
                    by_doc.insert(doc, (vec![r], chunk, part));
                }
            }
        }
    }
    let mut out: Vec<Fused> = by_doc
        .into_values()
        .map(|(ranks, chunk, _)| {
            // Summed in input-list order, so equal rank sets give bit-identical scores.
            let score = ranks.iter().map(|r| weights.of(r.engine) / (K + f64::from(r.rank))).sum();
            Fused { chunk: chunk.clone(), score, ranks }
        })
        .collect();
    out.sort_by(|a, b| {
        b.score
            .partial_cmp(&a.score)
            .unwrap_or(Ordering::Equal)
            .then_with(|| (&a.chunk.kb, &a.chunk.path).cmp(&(&b.chunk.kb, &b.chunk.path)))
    });
    out.truncate(limit);
    out
}
#[cfg(test)]
mod tests {
    use super::*;

    fn c(kb: &str, path: &str, line: u32, id: i64) -> ChunkRef {
        ChunkRef { kb: kb.into(), path: path.into(), line_start: line, id }
    }

    fn list(engine: &'static str, hits: &[&ChunkRef]) -> Ranked {
        Ranked { engine, hits: hits.iter().enumerate().map(|(i, h)| ((*h).clone(), 10.0 - i as f64)).collect() }
    }

    fn plain(lists: &[Ranked], limit: usize) -> Vec<Fused> {
        fuse(lists, &Weights::default(), limit)
    }

    #[test]
    fn scores_are_summed_reciprocal_ranks() {
        let (a, b, x) = (c("kb", "a.md", 1, 1), c("kb", "b.md", 1, 2), c("kb", "x.md", 1, 3));
        let out = plain(&[list("keyword", &[&a, &b]), list("grep", &[&b, &x])], 10);
        // b: 1/62 + 1/61; a: 1/61; x: 1/62.
        assert_eq!(out.iter().map(|f| f.chunk.id).collect::<Vec<_>>(), [2, 1, 3]);
        assert!((out[0].score - (1.0 / 62.0 + 1.0 / 61.0)).abs() < 1e-12);
        assert!((out[1].score - 1.0 / 61.0).abs() < 1e-12);
        assert_eq!(
            out[0].ranks,
            [
                EngineRank { engine: "keyword", rank: 2, score: 9.0 },
                EngineRank { engine: "grep", rank: 1, score: 10.0 }
            ]
        );
        assert_eq!(out[2].ranks.len(), 1);
    }

    #[test]
    fn a_document_gets_every_engine_s_credit_whichever_chunk_each_found() {
        // Keyword found a.md by its chunk 1, vector by its chunk 2: one result, both ranks.
        let (a1, a2, b) = (c("kb", "a.md", 1, 1), c("kb", "a.md", 40, 2), c("kb", "b.md", 1, 3));
        let out = plain(&[list("keyword", &[&b, &a1]), list("vector", &[&a2, &b])], 10);
        assert_eq!(out.len(), 2, "{out:?}");
        // a: 1/62 + 1/61; b: 1/61 + 1/62: equal, so by path.
        assert_eq!(out[0].chunk.path, "a.md");
        assert_eq!(out[0].ranks.len(), 2);
        assert!((out[0].score - out[1].score).abs() < 1e-15);
        // The chunk shown is that of the engine contributing most: vector's rank 1 (chunk 2).
        assert_eq!(out[0].chunk.id, 2);
        // Per chunk, a.md's two chunks would each have had one engine's credit only.
        let kw_first = plain(&[list("keyword", &[&a1]), list("vector", &[&a2])], 10);
        assert_eq!(kw_first.len(), 1);
        assert_eq!(kw_first[0].chunk.id, 1, "equal contributions: the earlier list's chunk");
    }

    #[test]
    fn ranks_count_documents_not_chunks() {
        let (a1, a2, b) = (c("kb", "a.md", 1, 1), c("kb", "a.md", 9, 2), c("kb", "b.md", 1, 3));
        let out = plain(&[list("keyword", &[&a1, &a2, &b])], 10);
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].chunk.id, 1, "a document keeps its best chunk");
        assert_eq!(out[1].ranks[0].rank, 2, "b is the second document, not the third chunk");
    }

    #[test]
    fn weights_scale_each_engine_s_share() {
        let (a, b) = (c("kb", "a.md", 1, 1), c("kb", "b.md", 1, 2));
        let lists = [list("keyword", &[&a, &b]), list("vector", &[&b, &a])];
        // Equal weights: a tie, broken by path.
        assert_eq!(plain(&lists, 10)[0].chunk.path, "a.md");
        // Vector weighs more: b first.
        let w = Weights { grep: 1.0, keyword: 1.0, vector: 2.0 };
        let out = fuse(&lists, &w, 10);
        assert_eq!(out[0].chunk.path, "b.md");
        assert!((out[0].score - (1.0 / 62.0 + 2.0 / 61.0)).abs() < 1e-12);
        // Keyword weighs more: a first, and its score says so.
        let w = Weights { grep: 1.0, keyword: 2.0, vector: 1.0 };
        let out = fuse(&lists, &w, 10);
        assert_eq!(out[0].chunk.path, "a.md");
        assert!((out[0].score - (2.0 / 61.0 + 1.0 / 62.0)).abs() < 1e-12);
        assert_eq!(w.name(), "rrf k=60 per document, weights grep 1 keyword 2 vector 1");
        assert_eq!(Weights::default().of("anything"), 1.0);
    }

    #[test]
    fn ties_break_by_kb_then_path() {
        let a = c("b-kb", "a.md", 1, 1);
        let b = c("a-kb", "z.md", 1, 2);
        let d = c("a-kb", "b.md", 9, 3);
        let e = c("a-kb", "a.md", 2, 4);
        // Each is rank 1 in its own list: all scores 1/61.
        let out = plain(&[list("grep", &[&a]), list("keyword", &[&b]), list("vector", &[&d]), list("x", &[&e])], 10);
        assert_eq!(out.iter().map(|f| f.chunk.id).collect::<Vec<_>>(), [4, 3, 2, 1]);
    }

    #[test]
    fn an_engine_with_no_hits_changes_nothing() {
        let (a, b) = (c("kb", "a.md", 1, 1), c("kb", "b.md", 1, 2));
        let with = plain(&[list("keyword", &[&a, &b]), list("vector", &[])], 10);
        let without = plain(&[list("keyword", &[&a, &b])], 10);
        assert_eq!(with, without);
        assert!(plain(&[], 10).is_empty());
        assert!(plain(&[list("grep", &[])], 10).is_empty());
    }

    #[test]
    fn duplicates_in_one_list_keep_their_best_rank_and_limit_applies() {
        let (a, b) = (c("kb", "a.md", 1, 1), c("kb", "b.md", 1, 2));
        let out = plain(&[list("grep", &[&a, &a, &b])], 10);
        assert_eq!(out.len(), 2);
        assert_eq!(out[1].ranks[0].rank, 2, "b is second, not third");
        assert_eq!(plain(&[list("grep", &[&a, &b])], 1).len(), 1);
        assert!(plain(&[list("grep", &[&a, &b])], 0).is_empty());
    }

    #[test]
    fn fusion_is_deterministic_whatever_the_input_order_of_ties() {
        const ENGINES: [&str; 3] = ["grep", "keyword", "vector"];
        let chunks: Vec<ChunkRef> = (0..9).map(|i| c("kb", &format!("{:02}.md", 8 - i), 1, i)).collect();
        // Each engine finds three chunks, so every chunk has rank 1, 2 or 3 in exactly one list.
        let build = |order: &[usize]| -> Vec<Ranked> {
            ENGINES
                .iter()
                .enumerate()
                .map(|(e, name)| list(name, &order[e * 3..e * 3 + 3].iter().map(|&i| &chunks[i]).collect::<Vec<_>>()))
                .collect()
        };
        let one = plain(&build(&[0, 1, 2, 3, 4, 5, 6, 7, 8]), 50);
        let two = plain(&build(&[5, 4, 3, 8, 7, 6, 2, 1, 0]), 50);
        assert_eq!(one, plain(&build(&[0, 1, 2, 3, 4, 5, 6, 7, 8]), 50), "same input, same output");
        // Within each rank, ties go by path whatever list the chunk came from.
        for out in [&one, &two] {
            for group in out.chunks(3) {
                let paths: Vec<&str> = group.iter().map(|f| f.chunk.path.as_str()).collect();
                let mut sorted = paths.clone();
                sorted.sort_unstable();
                assert_eq!(paths, sorted, "{out:?}");
                assert!(group.windows(2).all(|w| w[0].score == w[1].score));
            }
        }
    }
}
