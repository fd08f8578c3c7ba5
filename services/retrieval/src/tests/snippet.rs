//! Unit tests of snippets: best window, highlighting, CJK, cut ends and hostile input.
use super::*;

fn t(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn short_text_is_whole_with_matches_marked() {
    assert_eq!(
        snippet("The Boundary layer  grows.\n\nNext line", &t(&["boundary", "layer"]), 240),
        "The **Boundary** **layer** grows. Next line"
    );
    assert_eq!(snippet("no match here", &t(&["zebra"]), 240), "no match here");
    assert_eq!(snippet("", &t(&["x"]), 240), "");
    assert_eq!(snippet("abc", &t(&[]), 240), "abc");
    assert_eq!(snippet("abc", &t(&["a"]), 0), "");
}

#[test]
fn latin_terms_match_at_word_starts_and_stems() {
    assert_eq!(snippet("layers and player", &t(&["layer"]), 240), "**layer**s and player");
    assert_eq!(snippet("in 2024 we had 2 runs", &t(&["2"]), 240), "in 2024 we had **2** runs");
}

#[test]
fn cjk_terms_match_inside_runs() {
    assert_eq!(snippet("我们的分布式数据库系统很快", &t(&["数据", "据库"]), 240), "我们的分布式**数据库**系统很快");
    assert_eq!(snippet("東京タワーに行きました", &t(&["タワ", "ワー"]), 240), "東京**タワー**に行きました");
}

#[test]
fn best_window_has_most_distinct_terms() {
    let filler = "lorem ipsum dolor sit amet ".repeat(40);
    let text = format!("alpha here. {filler} alpha beta gamma together. {filler} gamma end.");
    let s = snippet(&text, &t(&["alpha", "beta", "gamma"]), 80);
    assert!(s.contains("**alpha** **beta** **gamma**"), "{s}");
    assert!(s.starts_with('…') && s.ends_with('…'), "{s}");
    let visible: String = s.replace("**", "");
    assert!(visible.chars().count() <= 80 + 2, "{} chars: {s}", visible.chars().count());
}

#[test]
fn never_splits_characters_and_respects_the_limit() {
    let text = "数据库🎉é".repeat(500);
    for max in [1, 2, 3, 7, 50, 240] {
        let s = snippet(&text, &t(&["🎉", "数据"]), max);
        let visible = s.replace("**", "").replace('…', "");
        assert!(visible.chars().count() <= max, "{max}: {s}");
        assert!(!visible.is_empty());
    }
    // Case folding that changes length (İ lower-cases to two chars) keeps alignment.
    let s = snippet("İstanbul and istanbul", &t(&["istanbul"]), 240);
    assert_eq!(s, "İstanbul and **istanbul**");
}

#[test]
fn cut_ends_prefer_spaces() {
    let text = "word ".repeat(100) + "target " + &"word ".repeat(100);
    let s = snippet(&text, &t(&["target"]), 60);
    assert!(s.contains("**target**"));
    let inner = s.trim_start_matches('…').trim_end_matches('…');
    assert!(inner.starts_with("word") && inner.ends_with("word"), "{s}");
}

#[test]
fn hostile_input_is_bounded() {
    // One letter repeated, and 64 terms that all match at every word start: the worst case of
    // the match scan (its cost is a benchmark's to measure, not a timed test's; the test run's
    // slow-timeout ends a blow-up). The snippet stays within its length.
    let text = "a".repeat(500_000);
    let terms: Vec<String> = (0..64).map(|i| "a".repeat(i + 1)).collect();
    let s = snippet(&text, &terms, 240);
    assert!(s.replace("**", "").replace('…', "").chars().count() <= 240);
    let s = snippet("x **bold** y", &t(&["**", "   "]), 240);
    assert!(s.contains("bold"));
}
