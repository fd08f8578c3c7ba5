//! Unit tests of the keyword tokenizer, including searches in a real SQLite FTS5 table with
//! the store's tokenizer (`porter unicode61 remove_diacritics 2`).
use super::*;

/// An in-memory FTS5 table like the store's, holding `index_text` of each note.
struct Fts(rusqlite::Connection);

impl Fts {
    fn new(notes: &[&str]) -> Self {
        let db = rusqlite::Connection::open_in_memory().expect("in-memory SQLite");
        db.execute_batch("CREATE VIRTUAL TABLE t USING fts5(body, tokenize='porter unicode61 remove_diacritics 2');")
            .expect("fts5 table");
        for (i, note) in notes.iter().enumerate() {
            db.execute("INSERT INTO t(rowid, body) VALUES (?1, ?2)", rusqlite::params![i as i64, index_text(note)])
                .expect("insert");
        }
        Self(db)
    }

    /// Row ids matching every term of `query` (each quoted, as the store builds MATCH).
    fn search(&self, query: &str) -> Vec<i64> {
        let terms = query_terms(query);
        assert!(!terms.is_empty(), "no terms for {query:?}");
        let expr = terms.iter().map(|t| format!("\"{}\"", t.replace('"', "\"\""))).collect::<Vec<_>>().join(" AND ");
        let mut stmt = self.0.prepare("SELECT rowid FROM t WHERE t MATCH ?1 ORDER BY rowid").expect("prepare");
        stmt.query_map([expr], |r| r.get(0)).expect("query").map(|r| r.expect("row")).collect()
    }
}

#[test]
fn stopwords_are_sorted_for_binary_search() {
    assert!(STOPWORDS.windows(2).all(|w| w[0] < w[1]));
}

#[test]
fn a_one_character_cjk_word_is_told_apart() {
    for q in ["茶", "喝 茶", "tea 茶", "茶?", "「茶」"] {
        assert!(has_lone_cjk_char(q), "{q}");
    }
    for q in ["茶叶", "喝茶", "tea", "a", "", "東京 会議"] {
        assert!(!has_lone_cjk_char(q), "{q}");
    }
}

#[test]
fn cjk_runs_become_overlapping_bigrams() {
    assert_eq!(index_text("数据库"), "数据 据库");
    assert_eq!(index_text("我们的数据库很快。"), "我们 们的 的数 数据 据库 库很 很快");
    assert_eq!(index_text("a 我 b"), "a 我 b");
    assert_eq!(index_text("使用Rust编程"), "使用 Rust 编程");
    assert_eq!(index_text("東京タワー"), "東京 京タ タワ ワー");
    assert_eq!(index_text("데이터베이스"), "데이 이터 터베 베이 이스");
    assert_eq!(query_terms("数据"), vec!["数据"]);
    assert_eq!(query_terms("库"), vec!["库"]);
}

#[test]
fn markdown_noise_is_removed_and_words_kept() {
    assert_eq!(
        index_text("## Heading *bold* `code` > [link](http://x.io/a_b)"),
        "Heading bold code link http x io a b"
    );
    assert_eq!(index_text("| a | b |\n|---|---|"), "a b");
    assert_eq!(index_text("Café naïve 2.5"), "Café naïve 2 5");
    assert_eq!(index_text(""), "");
    assert_eq!(index_text("*** --- ###"), "");
}

#[test]
fn query_terms_lowercase_dedup_and_drop_stopwords() {
    assert_eq!(query_terms("What is the Boundary-Layer of the boundary?"), vec!["boundary", "layer"]);
    // Only stopwords: they are kept, so the query still finds something.
    assert_eq!(query_terms("the who"), vec!["the", "who"]);
    assert_eq!(query_terms("version 2.5"), vec!["version", "2", "5"]);
    assert_eq!(query_terms("AND gate OR NOT near"), vec!["gate", "near"]);
}

#[test]
fn query_terms_of_only_punctuation_or_fts_syntax_is_empty() {
    for q in [
        "",
        "   ",
        "\"",
        "\"\"\"",
        "*",
        "NEAR(",
        "AND OR NOT",
        "^",
        "-",
        ":",
        "()",
        "?!.,;",
        "\" * NEAR( AND OR NOT ^ - :",
        "。、・！？",
        "🎉🎉",
    ] {
        assert!(query_terms(q).is_empty(), "{q:?} gave {:?}", query_terms(q));
    }
}

#[test]
fn query_terms_are_bounded() {
    let long: String = (0..500).map(|i| format!("w{i} ")).collect();
    let terms = query_terms(&long);
    assert_eq!(terms.len(), MAX_TERMS);
    assert_eq!(terms[0], "w0");
    let huge = "x".repeat(MAX_TERM_BYTES + 1);
    assert_eq!(query_terms(&format!("{huge} small")), vec!["small"]);
    assert!(query_terms(&huge).is_empty());
    // A 100 KB query of one CJK run still gives at most 64 bounded terms.
    let cjk: String = "数据库系统".repeat(20_000);
    let terms = query_terms(&cjk);
    assert!(terms.len() <= MAX_TERMS && terms.iter().all(|t| t.chars().count() == 2));
}

#[test]
fn is_cjk_classifies_scripts() {
    for c in ['中', '々', 'ひ', 'カ', 'ー', 'ｶ', '한', 'ᄀ', '𠀀'] {
        assert!(is_cjk(c), "{c}");
    }
    for c in ['a', '。', '、', '・', '！', ' ', '1', 'é', 'Я'] {
        assert!(!is_cjk(c), "{c}");
    }
}

#[test]
fn fts5_finds_two_character_chinese_word_inside_longer_run() {
    let fts = Fts::new(&[
        "我们的分布式数据库系统很快。",
        "今天天气很好",
        "東京タワーに行きました",
        "한국어 데이터베이스 검색",
        "The boundary layers were measured at 2.5 mm.",
    ]);
    assert_eq!(fts.search("数据"), vec![0]);
    assert_eq!(fts.search("数据库"), vec![0]);
    assert_eq!(fts.search("分布式 系统"), vec![0]);
    assert_eq!(fts.search("天气"), vec![1]);
    assert_eq!(fts.search("タワー"), vec![2]);
    assert_eq!(fts.search("行き"), vec![2]);
    assert_eq!(fts.search("데이터"), vec![3]);
    assert_eq!(fts.search("검색"), vec![3]);
    // English: porter stemming on both sides; numbers as unicode61 splits them.
    assert_eq!(fts.search("boundary turbulence"), Vec::<i64>::new());
    assert_eq!(fts.search("boundary layer measure"), vec![4]);
    assert_eq!(fts.search("what was measured at 2.5?"), vec![4]);
    // Hostile text is only words by the time FTS5 sees it.
    assert_eq!(fts.search("\"boundary\" NEAR(layer) AND -mm* ^"), vec![4]);
}
