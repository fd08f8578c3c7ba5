//! Reciprocal rank fusion (RRF) of the engines' ranked lists at chunk level.
//!
//! Cormack, Clarke and Büttcher, "Reciprocal Rank Fusion outperforms Condorcet and individual
//! rank learning methods" (SIGIR 2009): a chunk's fused score is
//!
//! ```text
//! score(c) = Σ over engines e that found c of 1 / (k + rank_e(c))      rank 1-based, k = 60
//! ```
//!
//! [`K`] = 60 is the paper's constant: it damps the weight of the very first ranks so that one
//! engine's top hit does not outweigh agreement between engines, and it needs no score
//! normalisation (bm25, cosine similarity and grep hit counts are not comparable). Engines'
//! own scores are kept only for display ([`Fused::ranks`]).
//!
//! Ties (equal fused scores, e.g. two chunks each found by one engine at the same rank) are
//! broken by KB name, then document path, then first line, then chunk id, all ascending, so
//! the order is deterministic for a given set of lists.
use std::cmp::Ordering;
use std::collections::BTreeMap;

/// The RRF constant `k` (see the module docs).
pub const K: f64 = 60.0;

/// The name of the fusion shown in replies (`SearchReply.fusion`).
pub const NAME: &str = "rrf k=60";

/// What identifies a chunk across engines: the store's chunk id, plus what the tie-break
/// orders by. Ordered by `(kb, path, line_start, id)`.
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
    /// Hits, best first. A chunk listed twice keeps its best rank.
    pub hits: Vec<(ChunkRef, f64)>,
}

/// One engine's contribution to a fused result.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineRank {
    /// Engine name.
    pub engine: &'static str,
    /// 1-based rank in that engine's list.
    pub rank: u32,
    /// The engine's own score (higher is better).
    pub score: f64,
}

/// A fused result.
#[derive(Debug, Clone, PartialEq)]
pub struct Fused {
    /// The chunk.
    pub chunk: ChunkRef,
    /// Σ 1 / (K + rank).
    pub score: f64,
    /// Each engine that found it, in the order of the input lists.
    pub ranks: Vec<EngineRank>,
}

/// Fuses `lists` and returns the best `limit` results, ordered by fused score (descending),
/// then by [`ChunkRef`] (ascending). An empty list contributes nothing.
pub fn fuse(lists: &[Ranked], limit: usize) -> Vec<Fused> {
    let mut by_chunk: BTreeMap<&ChunkRef, Vec<EngineRank>> = BTreeMap::new();
    for list in lists {
        let mut seen = std::collections::HashSet::new();
        let mut rank = 0u32;
        for (chunk, score) in &list.hits {
            if !seen.insert(chunk) {
                continue;
            }
            rank += 1;
            by_chunk.entry(chunk).or_default().push(EngineRank { engine: list.engine, rank, score: *score });
        }
    }
    let mut out: Vec<Fused> = by_chunk
        .into_iter()
        .map(|(chunk, ranks)| {
            // Summed in input-list order, so equal rank sets give bit-identical scores.
            let score = ranks.iter().map(|r| 1.0 / (K + f64::from(r.rank))).sum();
            Fused { chunk: chunk.clone(), score, ranks }
        })
        .collect();
    out.sort_by(|a, b| b.score.partial_cmp(&a.score).unwrap_or(Ordering::Equal).then_with(|| a.chunk.cmp(&b.chunk)));
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

    #[test]
    fn scores_are_summed_reciprocal_ranks() {
        let (a, b, x) = (c("kb", "a.md", 1, 1), c("kb", "b.md", 1, 2), c("kb", "x.md", 1, 3));
        let out = fuse(&[list("keyword", &[&a, &b]), list("grep", &[&b, &x])], 10);
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
    fn ties_break_by_kb_then_path_then_line() {
        let a = c("b-kb", "a.md", 1, 1);
        let b = c("a-kb", "z.md", 1, 2);
        let d = c("a-kb", "a.md", 9, 3);
        let e = c("a-kb", "a.md", 2, 4);
        // Each is rank 1 in its own engine or rank 1 in another list: all scores 1/61.
        let out = fuse(&[list("grep", &[&a]), list("keyword", &[&b]), list("vector", &[&d]), list("x", &[&e])], 10);
        assert_eq!(out.iter().map(|f| f.chunk.id).collect::<Vec<_>>(), [4, 3, 2, 1]);
    }

    #[test]
    fn an_engine_with_no_hits_changes_nothing() {
        let (a, b) = (c("kb", "a.md", 1, 1), c("kb", "b.md", 1, 2));
        let with = fuse(&[list("keyword", &[&a, &b]), list("vector", &[])], 10);
        let without = fuse(&[list("keyword", &[&a, &b])], 10);
        assert_eq!(with, without);
        assert!(fuse(&[], 10).is_empty());
        assert!(fuse(&[list("grep", &[])], 10).is_empty());
    }

    #[test]
    fn duplicates_in_one_list_keep_their_best_rank_and_limit_applies() {
        let (a, b) = (c("kb", "a.md", 1, 1), c("kb", "b.md", 1, 2));
        let out = fuse(&[list("grep", &[&a, &a, &b])], 10);
        assert_eq!(out.len(), 2);
        assert_eq!(out[1].ranks[0].rank, 2, "b is second, not third");
        assert_eq!(fuse(&[list("grep", &[&a, &b])], 1).len(), 1);
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
        let one = fuse(&build(&[0, 1, 2, 3, 4, 5, 6, 7, 8]), 50);
        let two = fuse(&build(&[5, 4, 3, 8, 7, 6, 2, 1, 0]), 50);
        assert_eq!(one, fuse(&build(&[0, 1, 2, 3, 4, 5, 6, 7, 8]), 50), "same input, same output");
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
