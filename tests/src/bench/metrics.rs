//! Ranking metrics over one query's ranked document ids: nDCG@k with graded gains (linear:
//! DCG = Σ gain_i / log2(i + 1) over ranks i = 1..k, divided by the ideal ordering's DCG) and
//! recall@k (relevant documents in the top k / all relevant documents). A document listed
//! twice (two chunks of one file) counts once, at its first rank.
use std::collections::{HashMap, HashSet};

/// `ranked` without repeats, first occurrence kept, cut to `k`.
pub fn top_k_unique(ranked: &[u32], k: usize) -> Vec<u32> {
    let mut seen = HashSet::new();
    ranked.iter().copied().filter(|d| seen.insert(*d)).take(k).collect()
}

/// nDCG@k of `ranked` given `gains` (doc id → gain > 0; absent = 0). 0 when nothing is
/// relevant.
pub fn ndcg_at(ranked: &[u32], gains: &HashMap<u32, f64>, k: usize) -> f64 {
    let dcg: f64 = top_k_unique(ranked, k)
        .iter()
        .enumerate()
        .map(|(i, d)| gains.get(d).copied().unwrap_or(0.0) / (i as f64 + 2.0).log2())
        .sum();
    let mut ideal: Vec<f64> = gains.values().copied().filter(|g| *g > 0.0).collect();
    ideal.sort_by(|a, b| b.total_cmp(a));
    let idcg: f64 = ideal.iter().take(k).enumerate().map(|(i, g)| g / (i as f64 + 2.0).log2()).sum();
    if idcg == 0.0 { 0.0 } else { dcg / idcg }
}

/// recall@k of `ranked`: the share of relevant documents (gain > 0) found in the top k. 0 when
/// nothing is relevant.
pub fn recall_at(ranked: &[u32], gains: &HashMap<u32, f64>, k: usize) -> f64 {
    let relevant = gains.values().filter(|g| **g > 0.0).count();
    if relevant == 0 {
        return 0.0;
    }
    let found = top_k_unique(ranked, k).iter().filter(|d| gains.get(d).is_some_and(|g| *g > 0.0)).count();
    found as f64 / relevant as f64
}

/// The `q`-quantile (0..=1, nearest rank) of `values`; 0 for none.
pub fn quantile(values: &[f64], q: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 - 1.0) * q).round() as usize]
}

/// The mean of `values`; 0 for none.
pub fn mean(values: &[f64]) -> f64 {
    // `+ 0.0`: a float sum starts at -0.0, and a mean of zeros should print as 0.
    if values.is_empty() { 0.0 } else { values.iter().sum::<f64>() / values.len() as f64 + 0.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ndcg_and_recall_on_a_hand_computed_example() {
        // Relevant: 1 (gain 4), 2 (gain 2), 3 (gain 1). Ranked: 9, 2, 1, 2 (repeat), 7.
        let gains = HashMap::from([(1, 4.0), (2, 2.0), (3, 1.0)]);
        let ranked = [9, 2, 1, 2, 7];
        // DCG = 0/log2(2) + 2/log2(3) + 4/log2(4) = 1.26186 + 2 = 3.26186
        // IDCG = 4/1 + 2/log2(3) + 1/2 = 4 + 1.26186 + 0.5 = 5.76186
        let want = (2.0 / 3f64.log2() + 2.0) / (4.0 + 2.0 / 3f64.log2() + 0.5);
        assert!((ndcg_at(&ranked, &gains, 10) - want).abs() < 1e-12);
        assert!((ndcg_at(&ranked, &gains, 10) - 0.566_11).abs() < 1e-4);
        // Cut at 2: DCG = 2/log2(3); IDCG = 4 + 2/log2(3).
        let want2 = (2.0 / 3f64.log2()) / (4.0 + 2.0 / 3f64.log2());
        assert!((ndcg_at(&ranked, &gains, 2) - want2).abs() < 1e-12);
        assert!((recall_at(&ranked, &gains, 10) - 2.0 / 3.0).abs() < 1e-12);
        assert!((recall_at(&ranked, &gains, 1)).abs() < 1e-12);
        // The ideal ranking scores 1; nothing relevant scores 0, never NaN.
        assert!((ndcg_at(&[1, 2, 3], &gains, 10) - 1.0).abs() < 1e-12);
        assert_eq!(ndcg_at(&[], &gains, 10), 0.0);
        assert_eq!(ndcg_at(&[1], &HashMap::new(), 10), 0.0);
        assert_eq!(recall_at(&[1], &HashMap::new(), 10), 0.0);
    }

    #[test]
    fn repeats_do_not_take_ranks_and_quantiles_pick_nearest_rank() {
        assert_eq!(top_k_unique(&[5, 5, 6, 5, 7, 8], 3), vec![5, 6, 7]);
        assert_eq!(quantile(&[3.0, 1.0, 2.0, 4.0, 5.0], 0.5), 3.0);
        assert_eq!(quantile(&[3.0, 1.0, 2.0, 4.0, 5.0], 1.0), 5.0);
        assert_eq!(quantile(&[], 0.5), 0.0);
        assert_eq!(mean(&[1.0, 2.0]), 1.5);
    }
}
