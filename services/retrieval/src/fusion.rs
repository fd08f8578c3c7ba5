//! Fusion of the engines' ranked lists, per document: a weighted sum of normalised scores (the
//! default) or weighted reciprocal rank fusion (RRF).
//!
//! Each engine's list is first cut to one entry per document, its best chunk (a list that names
//! a document twice keeps its first entry; ranks count documents, not chunks). Fusing per
//! document rather than per chunk matters when two engines pick different chunks of the same
//! document: each still credits the document (on Cranfield, fusing chunks lost a top-10
//! document in 91 of 225 questions). A document's fused score is a sum over the engines that
//! found it of `w_e · part_e(d)` ([`Params`]: the weights `retrieval.fusion.*_weight`, only
//! their ratios matter), where the part depends on the [`Method`]:
//!
//! ```text
//! scores:  part_e(d) = s_e(d) / max over the list of s_e       keyword (bm25), grep (terms, hits)
//!          part_e(d) = max(0, cos(d))                          vector (cosine similarity)
//! rrf:     part_e(d) = 1 / (k + rank_e(d))                     rank 1-based
//! ```
//!
//! **scores** is a convex combination of normalised scores (Bruch, Gai and Ingber, "An Analysis
//! of Fusion Functions for Hybrid Retrieval", ACM TOIS 2023): bm25 has no fixed scale, so it is
//! divided by the best score of the same search (the best keyword hit scores 1); cosine
//! similarity already lies in 0..1 for these models and is kept as is, so a question the model
//! finds nothing close to leans on keyword, and one it matches closely leans on the vector. A
//! document one engine did not list gets nothing from it.
//!
//! **rrf** is Cormack, Clarke and Büttcher, "Reciprocal Rank Fusion outperforms Condorcet and
//! individual rank learning methods" (SIGIR 2009) with a weight per engine; `k`
//! (`retrieval.fusion.k`) damps the first ranks: with the paper's 60 a document two engines both
//! rank 10th outscores one that a single engine ranks 1st; a small k lets a first rank count for
//! more. It ignores the engines' scores.
//!
//! On Cranfield and on the paraphrase set (docs/BENCHMARKS.md, session 50) scores with keyword 3
//! : vector 2 (the default weights) is the setting measured that holds both sets' floors: rrf
//! with any k and weights either lost Cranfield's nDCG@10 floor or the paraphrase set's top-1.
//!
//! The result shows the chunk of the engine that contributed most to the document's score
//! (ties: the earlier list); engines' own scores are kept for display ([`Fused::ranks`]). Ties
//! (equal fused scores) are broken by KB name, then document path, both ascending, so the order
//! is deterministic for a given set of lists.
use std::cmp::Ordering;
use std::collections::BTreeMap;

/// The paper's RRF constant `k` (plain RRF; see the module docs).
pub const PAPER_K: f64 = 60.0;

/// How the lists are fused (the `retrieval.fusion.method` setting).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// Weighted sum of normalised scores (`scores`).
    Scores,
    /// Weighted reciprocal rank fusion (`rrf`).
    Rrf,
}

impl Method {
    /// From the setting's word; anything else is [`Method::Scores`] (the settings registry
    /// refuses other words before they are stored).
    pub fn parse(word: &str) -> Self {
        if word.trim() == "rrf" { Method::Rrf } else { Method::Scores }
    }
}

/// The fusion's parameters: the method, the RRF constant `k` (rrf only) and each engine's
/// weight in the fused score (relative: only ratios matter). An engine not named here (none
/// today) weighs 1.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Params {
    /// Scores or rrf.
    pub method: Method,
    /// The RRF constant (> 0): a rank r contributes `w / (k + r)`.
    pub k: f64,
    /// `grep`.
    pub grep: f64,
    /// `keyword`.
    pub keyword: f64,
    /// `vector`.
    pub vector: f64,
}

impl Default for Params {
    /// Plain RRF: k = 60 and every engine 1.
    fn default() -> Self {
        Self { method: Method::Rrf, k: PAPER_K, grep: 1.0, keyword: 1.0, vector: 1.0 }
    }
}

impl Params {
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
    /// `scores per document, weights grep 1 keyword 1 vector 1` or
    /// `rrf k=60 per document, weights grep 1 keyword 2 vector 1`.
    pub fn name(&self) -> String {
        let method = match self.method {
            Method::Scores => "scores".to_owned(),
            Method::Rrf => format!("rrf k={}", self.k),
        };
        format!("{method} per document, weights grep {} keyword {} vector {}", self.grep, self.keyword, self.vector)
    }

    /// What a document adds to its score from `engine`'s list, where it has `rank` (1-based)
    /// and the engine's `score`, the list's best score being `best`.
    pub fn contribution(&self, engine: &str, rank: u32, score: f64, best: f64) -> f64 {
        let part = match self.method {
            Method::Rrf => 1.0 / (self.k + f64::from(rank)),
            Method::Scores if engine == "vector" => score.max(0.0),
            Method::Scores if best > 0.0 => (score / best).max(0.0),
            Method::Scores => 0.0,
        };
        self.of(engine) * part
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
    /// Σ over the engines of w_e · part_e (see the module docs).
    pub score: f64,
    /// Each engine that found the document, in the order of the input lists.
    pub ranks: Vec<EngineRank>,
}

/// Fuses `lists` per document with `params` (method, k and weights) and returns the best
/// `limit` documents, ordered
/// by fused score (descending), then by KB and path (ascending). An empty list contributes
/// nothing.
pub fn fuse(lists: &[Ranked], params: &Params, limit: usize) -> Vec<Fused> {
    // Per document: (contributions and their parts, the shown chunk and its part).
    type Entry<'a> = (Vec<(EngineRank, f64)>, &'a ChunkRef, f64);
    let mut by_doc: BTreeMap<(&str, &str), Entry<'_>> = BTreeMap::new();
    for list in lists {
        let best = list.hits.iter().map(|(_, s)| *s).fold(f64::NEG_INFINITY, f64::max);
        let mut seen = std::collections::HashSet::new();
        let mut rank = 0u32;
        for (chunk, score) in &list.hits {
            let doc = (chunk.kb.as_str(), chunk.path.as_str());
            if !seen.insert(doc) {
                continue;
            }
            rank += 1;
            let part = params.contribution(list.engine, rank, *score, best);
            let r = (EngineRank { engine: list.engine, rank, score: *score }, part);
            match by_doc.get_mut(&doc) {
                Some((ranks, shown, shown_part)) => {
                    ranks.push(r);
                    if part > *shown_part {
                        (*shown, *shown_part) = (chunk, part);
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
            let score = ranks.iter().map(|(_, part)| part).sum();
            Fused { chunk: chunk.clone(), score, ranks: ranks.into_iter().map(|(r, _)| r).collect() }
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
        fuse(lists, &Params::default(), limit)
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
        let w = Params { grep: 1.0, keyword: 1.0, vector: 2.0, ..Params::default() };
        let out = fuse(&lists, &w, 10);
        assert_eq!(out[0].chunk.path, "b.md");
        assert!((out[0].score - (1.0 / 62.0 + 2.0 / 61.0)).abs() < 1e-12);
        // Keyword weighs more: a first, and its score says so.
        let w = Params { grep: 1.0, keyword: 2.0, vector: 1.0, ..Params::default() };
        let out = fuse(&lists, &w, 10);
        assert_eq!(out[0].chunk.path, "a.md");
        assert!((out[0].score - (2.0 / 61.0 + 1.0 / 62.0)).abs() < 1e-12);
        assert_eq!(w.name(), "rrf k=60 per document, weights grep 1 keyword 2 vector 1");
        assert_eq!(Params::default().of("anything"), 1.0);
    }

    #[test]
    fn a_small_k_lets_one_engine_s_first_rank_outweigh_moderate_agreement() {
        // top.md is keyword's 1st and unseen by vector; both.md is 8th in both lists.
        let top = c("kb", "top.md", 1, 1);
        let both = c("kb", "both.md", 1, 2);
        let fill: Vec<ChunkRef> = (0..14).map(|i| c("kb", &format!("f{i:02}.md"), 1, 10 + i)).collect();
        let kw: Vec<&ChunkRef> = std::iter::once(&top).chain(&fill[..6]).chain([&both]).collect();
        let vec: Vec<&ChunkRef> = fill[6..13].iter().chain([&both]).collect();
        let lists = [list("keyword", &kw), list("vector", &vec)];
        let top_first = |k: f64| {
            let out = fuse(&lists, &Params { k, ..Params::default() }, 20);
            let at = |p: &str| out.iter().position(|f| f.chunk.path == p);
            at("top.md") < at("both.md")
        };
        // k = 60: 1/61 < 2/68, agreement wins; k = 5: 1/6 > 2/13, the first rank wins.
        assert!(!top_first(60.0));
        assert!(top_first(5.0));
        let p = Params { k: 10.0, grep: 1.0, keyword: 3.0, vector: 1.0, method: Method::Rrf };
        assert!((p.contribution("keyword", 2, 7.5, 9.0) - 3.0 / 12.0).abs() < 1e-15);
        assert_eq!(p.name(), "rrf k=10 per document, weights grep 1 keyword 3 vector 1");
    }

    fn scored(engine: &'static str, hits: &[(&ChunkRef, f64)]) -> Ranked {
        Ranked { engine, hits: hits.iter().map(|(c, s)| ((*c).clone(), *s)).collect() }
    }

    #[test]
    fn scores_add_keyword_over_its_best_and_the_raw_cosine() {
        let (a, b, x) = (c("kb", "a.md", 1, 1), c("kb", "b.md", 1, 2), c("kb", "x.md", 1, 3));
        let p = Params { method: Method::Scores, ..Params::default() };
        // bm25 20 and 10 (a is keyword's best: 1, b: 0.5); cosines 0.3 and 0.9.
        let lists =
            [scored("keyword", &[(&a, 20.0), (&b, 10.0)]), scored("vector", &[(&b, 0.9), (&a, 0.3), (&x, 0.2)])];
        let out = fuse(&lists, &p, 10);
        assert_eq!(out.iter().map(|f| f.chunk.path.as_str()).collect::<Vec<_>>(), ["b.md", "a.md", "x.md"]);
        assert!((out[0].score - (0.5 + 0.9)).abs() < 1e-12, "{out:?}");
        assert!((out[1].score - (1.0 + 0.3)).abs() < 1e-12);
        assert!((out[2].score - 0.2).abs() < 1e-12, "a document one engine missed gets nothing from it");
        // The scale of bm25 does not matter: ten times the scores, the same fusion.
        let tenfold = [scored("keyword", &[(&a, 200.0), (&b, 100.0)]), lists[1].clone()];
        let shape = |v: &[Fused]| v.iter().map(|f| (f.chunk.path.clone(), f.score)).collect::<Vec<_>>();
        assert_eq!(shape(&fuse(&tenfold, &p, 10)), shape(&out));
        // A weak match for the model (cosines 0.1 and 0.35) leaves keyword's order.
        let weak = [lists[0].clone(), scored("vector", &[(&b, 0.35), (&a, 0.1)])];
        assert_eq!(fuse(&weak, &p, 10)[0].chunk.path, "a.md");
        // Weights scale each share: keyword 3 makes a (3 + 0.3) beat b (1.5 + 0.9).
        let w = Params { keyword: 3.0, ..p };
        assert_eq!(fuse(&lists, &w, 10)[0].chunk.path, "a.md");
        assert_eq!(p.name(), "scores per document, weights grep 1 keyword 1 vector 1");
    }

    #[test]
    fn scores_give_nothing_for_a_negative_cosine_or_a_list_without_a_positive_score() {
        let (a, b) = (c("kb", "a.md", 1, 1), c("kb", "b.md", 1, 2));
        let p = Params { method: Method::Scores, ..Params::default() };
        let out = fuse(&[scored("vector", &[(&a, -0.4)]), scored("grep", &[(&b, 0.0)])], &p, 10);
        assert_eq!(out.len(), 2, "still listed: found by an engine");
        assert!(out.iter().all(|f| f.score == 0.0), "{out:?}");
        assert_eq!(Method::parse("rrf"), Method::Rrf);
        assert_eq!(Method::parse(" scores "), Method::Scores);
        assert_eq!(Method::parse(""), Method::Scores);
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
