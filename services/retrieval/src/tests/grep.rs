//! Unit tests of the grep engine on real temporary folders.
use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use super::*;

fn write(root: &Path, rel: &str, bytes: &[u8]) {
    let p = root.join(rel);
    fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
    fs::write(p, bytes).expect("write");
}

fn root(kb: &str, dir: &Path) -> GrepRoot {
    GrepRoot { kb: kb.into(), spec: WalkSpec { root: dir.to_owned(), include: vec![], exclude: vec![], skip: vec![] } }
}

fn q(query: &str) -> GrepQuery {
    GrepQuery {
        query: query.into(),
        regex: false,
        max_hits: 1000,
        max_per_file: 100,
        deadline: None,
        path_prefix: String::new(),
    }
}

#[test]
fn a_path_prefix_reads_only_the_files_under_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    write(d, "a.md", b"boundary\n");
    write(d, "sub/b.md", b"boundary\n");
    write(d, "sub/deeper/c.md", b"boundary\n");
    write(d, "subway/d.md", b"boundary\n");
    write(d, "other/e.md", b"boundary\n");
    let under = |prefix: &str| {
        let o = search(&[root("kb", d)], &GrepQuery { path_prefix: prefix.into(), ..q("boundary") }).expect("search");
        (o.hits.iter().map(|h| h.rel_path.clone()).collect::<Vec<_>>(), o.files_searched)
    };
    assert_eq!(under("sub/"), (vec!["sub/b.md".into(), "sub/deeper/c.md".into()], 2), "only those files are read");
    assert_eq!(under("sub"), (vec!["sub/b.md".into(), "sub/deeper/c.md".into(), "subway/d.md".into()], 3));
    assert_eq!(under("sub/deeper/c"), (vec!["sub/deeper/c.md".into()], 1));
    assert_eq!(under("nowhere/"), (vec![], 0));
    assert_eq!(under("").1, 5);
    assert!(folder_may_hold("sub", "sub/deeper/") && folder_may_hold("sub/deeper/x", "sub/"));
    assert!(!folder_may_hold("other", "sub/") && !folder_may_hold("su", "sub/"));
}

fn lines(o: &GrepOutcome) -> Vec<(String, u32)> {
    o.hits.iter().map(|h| (h.rel_path.clone(), h.line)).collect()
}

#[test]
fn literal_mode_matches_phrase_or_terms_case_insensitively() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    write(d, "a.md", b"# Title\nThe Boundary Layer grows.\nnothing here\nlayer only\n");
    write(d, "sub/b.md", b"boundary conditions\r\nunrelated\r\n");
    write(d, "c.txt", b"boundary layer in a txt file is not included\n");
    let o = search(&[root("kb", d)], &q("What is the boundary layer?")).expect("search");
    assert_eq!(lines(&o), vec![("a.md".into(), 2), ("a.md".into(), 4), ("sub/b.md".into(), 1)]);
    assert_eq!(o.hits[0].text, "The Boundary Layer grows.");
    assert_eq!(o.hits[0].matched_terms, vec!["boundary", "layer"]);
    assert_eq!(o.hits[1].matched_terms, vec!["layer"]);
    assert_eq!(o.hits[2].text, "boundary conditions", "CRLF stripped");
    assert_eq!(o.files_searched, 2);
    assert!(!o.timed_out && !o.truncated);
    assert_eq!(o.hits[0].kb, "kb");
}

#[test]
fn literal_plan_drops_short_words_and_stopwords_but_keeps_cjk_bigrams() {
    let p = literal_plan("  What is  the Boundary-Layer of a 2.5 数据库? ");
    assert_eq!(p.phrase, "what is the boundary-layer of a 2.5 数据库?");
    assert_eq!(p.terms, vec!["boundary", "layer", "数据", "据库"]);
    // FTS-like syntax is just text here (fixed strings): no error, no special meaning.
    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path(), "x.md", b"literal \"quote\" NEAR( a* (b) [c] ^d $e\n");
    let o = search(&[root("kb", dir.path())], &q("\"quote\" NEAR( a* (b) [c] ^d $e")).expect("search");
    assert_eq!(o.hits.len(), 1);
}

#[test]
fn cjk_query_finds_word_inside_longer_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path(), "zh.md", "第一行\n我们的分布式数据库系统很快。\n".as_bytes());
    write(dir.path(), "ja.md", "東京タワーに行きました\n".as_bytes());
    let o = search(&[root("kb", dir.path())], &q("数据")).expect("search");
    assert_eq!(lines(&o), vec![("zh.md".into(), 2)]);
    let o = search(&[root("kb", dir.path())], &q("タワー")).expect("search");
    assert_eq!(lines(&o), vec![("ja.md".into(), 1)]);
}

#[test]
fn regex_mode_and_bad_regexes() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path(), "r.md", b"id-1234 and id-99\nID-7 upper\nnone\n");
    let mut rq = q(r"id-\d+");
    rq.regex = true;
    let o = search(&[root("kb", dir.path())], &rq).expect("search");
    // Smart case: lower-case pattern matches upper case too.
    assert_eq!(lines(&o), vec![("r.md".into(), 1), ("r.md".into(), 2)]);
    assert_eq!(o.hits[0].matched_terms, vec!["id-1234", "id-99"]);
    for bad in ["(unclosed", "[z-a]", r"\p{NoSuchClass}", "a{99999999}", r"(\w{500}){500}"] {
        rq.query = bad.into();
        match search(&[root("kb", dir.path())], &rq) {
            Err(GrepError::BadRegex(msg)) => assert!(!msg.is_empty(), "{bad}"),
            other => panic!("{bad}: {other:?}"),
        }
    }
}

#[test]
fn empty_and_oversized_queries_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    assert!(matches!(search(&[root("kb", dir.path())], &q("   ")), Err(GrepError::Empty)));
    let long = "x".repeat(MAX_QUERY_BYTES + 1);
    assert!(matches!(search(&[root("kb", dir.path())], &q(&long)), Err(GrepError::TooLong { .. })));
    let missing = dir.path().join("gone");
    match search(&[root("lost", &missing)], &q("x")) {
        Err(e @ GrepError::Walk { .. }) => assert!(e.to_string().contains("lost"), "{e}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn binary_files_are_skipped_and_invalid_utf8_is_lossy() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path(), "bin.md", b"needle before\n\x00\x01\x02 needle after\n");
    write(dir.path(), "latin1.md", b"caf\xe9 needle\n");
    let o = search(&[root("kb", dir.path())], &q("needle")).expect("search");
    assert_eq!(lines(&o), vec![("latin1.md".into(), 1)]);
    assert_eq!(o.hits[0].text, "caf\u{fffd} needle");
}

#[test]
fn hits_are_bounded_per_file_in_all_and_lines_truncated() {
    let dir = tempfile::tempdir().expect("tempdir");
    let many = "hit line\n".repeat(500);
    for i in 0..10 {
        write(dir.path(), &format!("f{i}.md"), many.as_bytes());
    }
    write(dir.path(), "long.md", format!("hit {}\n", "é".repeat(2000)).as_bytes());
    let mut bq = q("hit");
    bq.max_per_file = 7;
    bq.max_hits = 10_000;
    let o = search(&[root("kb", dir.path())], &bq).expect("search");
    assert_eq!(o.hits.len(), 10 * 7 + 1);
    assert!(!o.truncated);
    let long = o.hits.iter().find(|h| h.rel_path == "long.md").expect("long");
    assert_eq!(long.text.chars().count(), MAX_LINE_CHARS);
    bq.max_hits = 20;
    let o = search(&[root("kb", dir.path())], &bq).expect("search");
    assert_eq!(o.hits.len(), 20);
    assert!(o.truncated);
}

#[test]
fn a_past_deadline_stops_the_search() {
    let dir = tempfile::tempdir().expect("tempdir");
    for i in 0..50 {
        write(dir.path(), &format!("f{i}.md"), b"needle\n");
    }
    let mut dq = q("needle");
    dq.deadline = Some(Instant::now() - Duration::from_millis(1));
    let o = search(&[root("kb", dir.path())], &dq).expect("search");
    assert!(o.timed_out);
    assert!(o.hits.is_empty());
    dq.deadline = Some(Instant::now() + Duration::from_secs(60));
    let o = search(&[root("kb", dir.path())], &dq).expect("search");
    assert!(!o.timed_out);
    assert_eq!(o.hits.len(), 50);
}

#[test]
fn walk_rules_apply_and_roots_stay_apart() {
    let outside = tempfile::tempdir().expect("outside");
    write(outside.path(), "leak.md", b"needle outside\n");
    let a = tempfile::tempdir().expect("a");
    let b = tempfile::tempdir().expect("b");
    write(a.path(), "one.md", b"needle a\n");
    write(a.path(), ".hidden/h.md", b"needle hidden\n");
    write(a.path(), "ignored/i.md", b"needle ignored\n");
    write(a.path(), ".gitignore", b"ignored/\n");
    std::os::unix::fs::symlink(outside.path(), a.path().join("out")).expect("symlink");
    std::os::unix::fs::symlink(a.path(), a.path().join("loop")).expect("loop");
    write(b.path(), "two.md", b"needle b\n");
    let o = search(&[root("b", b.path()), root("a", a.path())], &q("needle")).expect("search");
    let got: Vec<(String, String)> = o.hits.iter().map(|h| (h.kb.clone(), h.rel_path.clone())).collect();
    assert_eq!(got, vec![("b".into(), "two.md".into()), ("a".into(), "one.md".into())]);
}
