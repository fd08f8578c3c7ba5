//! Unit tests of markdown parsing and chunking: front matter, titles, heading paths, exact
//! line ranges, size splits, and hostile input.
use std::time::{Duration, Instant};

use super::*;

fn opts(max: usize, overlap: usize) -> ChunkOptions {
    ChunkOptions { max_chars: max, overlap_chars: overlap }
}

fn doc(text: &str) -> Document {
    parse(text, "stem", &ChunkOptions::default()).expect("parse")
}

/// Every chunk's text is exactly its lines of the file (CRLF normalized), or — for a piece
/// of one over-long line — a part of that line; hashes are SHA-256 of the text; chunks stay
/// within `max_chars` and in document order.
fn check_invariants(text: &str, d: &Document, o: &ChunkOptions) {
    let lines: Vec<&str> = text.split('\n').map(|l| l.strip_suffix('\r').unwrap_or(l)).collect();
    let mut prev_start = 0;
    for c in &d.chunks {
        assert!(c.line_start >= 1 && c.line_start <= c.line_end, "{c:?}");
        assert!(c.line_end as usize <= lines.len(), "{c:?}");
        assert!(c.line_start >= prev_start, "order");
        prev_start = c.line_start;
        let expect = lines[c.line_start as usize - 1..c.line_end as usize].join("\n");
        if c.line_start == c.line_end && c.text != expect {
            assert!(expect.contains(&c.text), "piece not in its line: {c:?}");
        } else {
            assert_eq!(c.text, expect, "chunk text differs from its lines {}..={}", c.line_start, c.line_end);
        }
        assert!(c.text.chars().count() <= o.max_chars, "chunk over max: {}", c.text.chars().count());
        assert!(!c.text.trim().is_empty());
        assert_eq!(c.hash, hex::encode(Sha256::digest(c.text.as_bytes())));
        assert!(c.line_start >= d.body_line, "chunk inside front matter");
    }
}

#[test]
fn front_matter_title_tags_and_body_line() {
    let text = "---\ntitle: My Note\ntags: [rust, \"#search\", rust]\ncount: 3\nratio: 1.5\ndone: true\nnothing: ~\ndate: 2024-05-01\n---\n# Heading One\n\nBody text here.\n";
    let d = doc(text);
    let fm = d.front_matter.as_ref().expect("front matter");
    assert_eq!(fm.title.as_deref(), Some("My Note"));
    assert_eq!(fm.tags, vec!["rust", "search"]);
    assert_eq!(fm.fields["count"], serde_json::json!(3));
    assert_eq!(fm.fields["ratio"], serde_json::json!(1.5));
    assert_eq!(fm.fields["done"], serde_json::json!(true));
    assert_eq!(fm.fields["nothing"], Value::Null);
    assert_eq!(fm.fields["date"], serde_json::json!("2024-05-01"));
    assert_eq!(d.title, "My Note");
    assert_eq!(d.body_line, 10);
    assert_eq!(d.chunks.len(), 1);
    let c = &d.chunks[0];
    assert_eq!((c.line_start, c.line_end), (10, 12));
    assert_eq!(c.heading_path, vec!["Heading One"]);
    assert_eq!(c.text, "# Heading One\n\nBody text here.");
    assert!(!c.text.contains("title:"));
    let (_, off) = parse_front_matter(text).expect("fm");
    assert!(text[off..].starts_with("# Heading One"));
    check_invariants(text, &d, &ChunkOptions::default());
}

#[test]
fn tags_as_a_string_and_quoted_values() {
    let (fm, _) =
        parse_front_matter("---\ntags: \"a, b  #c\" # a comment\nn: \"12\"\ninf: .inf\n...\nbody").expect("fm");
    let fm = fm.expect("some");
    assert_eq!(fm.tags, vec!["a", "b", "c"]);
    assert_eq!(fm.fields["n"], serde_json::json!("12"));
    assert_eq!(fm.fields["inf"], serde_json::json!(".inf"));
}

#[test]
fn title_falls_back_to_first_h1_then_stem() {
    assert_eq!(doc("intro\n\n## Two\n\ntext\n\n# One *bold*\n\nmore").title, "One bold");
    assert_eq!(doc("## Only h2\n\ntext").title, "stem");
    assert_eq!(doc("---\nother: 1\n---\n# From heading\ntext").title, "From heading");
    assert_eq!(doc("---\ntitle: \"  \"\n---\nplain").title, "stem");
}

#[test]
fn heading_paths_nest_and_empty_sections_drop() {
    let text = "preamble line\n\n# A\n\nalpha\n\n## B\n\nbeta\n\n### C\n\ngamma\n\n## D\n\ndelta\n\n# E\n## F\n\nphi\n\n#\n\nafter empty heading\n";
    let d = doc(text);
    let got: Vec<(Vec<&str>, u32, u32)> = d
        .chunks
        .iter()
        .map(|c| (c.heading_path.iter().map(String::as_str).collect(), c.line_start, c.line_end))
        .collect();
    assert_eq!(
        got,
        vec![
            (vec![], 1, 1),
            (vec!["A"], 3, 5),
            (vec!["A", "B"], 7, 9),
            (vec!["A", "B", "C"], 11, 13),
            (vec!["A", "D"], 15, 17),
            // "# E" has no text of its own and F is below it: dropped, F's path carries it.
            (vec!["E", "F"], 20, 26),
        ]
    );
    check_invariants(text, &d, &ChunkOptions::default());
    // A heading alone at the end is kept (it is all there is of that section).
    let d = doc("# Only\n");
    assert_eq!(d.chunks.len(), 1);
    assert_eq!(d.chunks[0].text, "# Only");
    assert!(doc("").chunks.is_empty());
    assert!(doc("\n\n   \n").chunks.is_empty());
}

#[test]
fn headings_inside_code_blocks_are_not_headings() {
    let text = "# Real\n\n```sh\n# not a heading\n## nor this\n```\n\n    # indented code\n\n~~~\n# tilde fence\n~~~\n";
    let d = doc(text);
    assert_eq!(d.chunks.len(), 1);
    assert_eq!(d.chunks[0].heading_path, vec!["Real"]);
    assert_eq!((d.chunks[0].line_start, d.chunks[0].line_end), (1, 12));
    assert_eq!(d.title, "Real");
}

#[test]
fn setext_headings_and_mid_document_rules() {
    let text = "Title\n=====\n\ntext\n\n---\nnot: front matter\n---\n\nSub\n---\n\nend\n";
    let d = doc(text);
    assert!(d.front_matter.is_none());
    assert_eq!(d.title, "Title");
    let paths: Vec<Vec<String>> = d.chunks.iter().map(|c| c.heading_path.clone()).collect();
    assert!(paths.iter().all(|p| p.first().map(String::as_str) == Some("Title")), "{paths:?}");
    check_invariants(text, &d, &ChunkOptions::default());
}

#[test]
fn crlf_line_endings_keep_exact_lines() {
    let text = "---\r\ntitle: Win\r\n---\r\n# H\r\n\r\nline one\r\nline two\r\n\r\n## Sub\r\n\r\nthree\r\n";
    let d = doc(text);
    assert_eq!(d.title, "Win");
    assert_eq!(d.body_line, 4);
    assert_eq!(d.chunks.len(), 2);
    assert_eq!((d.chunks[0].line_start, d.chunks[0].line_end), (4, 7));
    assert_eq!(d.chunks[0].text, "# H\n\nline one\nline two");
    assert_eq!((d.chunks[1].line_start, d.chunks[1].line_end), (9, 11));
    assert_eq!(d.chunks[1].heading_path, vec!["H", "Sub"]);
    check_invariants(text, &d, &ChunkOptions::default());
}

#[test]
fn a_file_of_only_front_matter_has_no_chunks() {
    let d = doc("---\ntitle: Just meta\ntags: [x]\n---\n");
    assert_eq!(d.title, "Just meta");
    assert!(d.chunks.is_empty());
    assert_eq!(d.body_line, 5);
    let d = doc("---\ntitle: No newline\n---");
    assert!(d.chunks.is_empty());
    assert_eq!(d.body_line, 4);
    assert_eq!(d.front_matter.expect("fm").title.as_deref(), Some("No newline"));
}

#[test]
fn not_front_matter_when_it_does_not_open_the_file_properly() {
    for text in [
        "---\n\ntitle: x\n---\nbody",
        "---\n---\nbody",
        "----\ntitle: x\n----\n",
        " ---\ntitle: x\n---\n",
        "---\ntitle: never closed\n",
        "text\n---\ntitle: x\n---\n",
    ] {
        let (fm, off) = parse_front_matter(text).expect("no error");
        assert!(fm.is_none(), "{text:?}");
        assert_eq!(off, 0);
    }
}

#[test]
fn bom_is_skipped() {
    let text = "\u{feff}---\ntitle: Bom\n---\nbody\n";
    let d = doc(text);
    assert_eq!(d.title, "Bom");
    assert_eq!(d.chunks[0].line_start, 4);
}

#[test]
fn invalid_yaml_is_an_error_with_the_file_line() {
    let err = parse("---\ntitle: ok\nbad: [unclosed\nmore: x\n---\nbody", "s", &ChunkOptions::default()).unwrap_err();
    let MarkdownError::FrontMatter { line, message } = &err else { panic!("{err:?}") };
    assert!((3..=5).contains(line), "line {line}: {message}");
    assert!(!message.is_empty());
    assert!(err.to_string().starts_with("front matter, line"));

    let err = parse_front_matter("---\n\tkey: tab\n: : :\n---\n").unwrap_err();
    assert!(matches!(err, MarkdownError::FrontMatter { .. }), "{err:?}");
    let err = parse_front_matter("---\n- a list\n- not a mapping\n---\n").unwrap_err();
    assert!(matches!(&err, MarkdownError::FrontMatter { message, .. } if message.contains("mapping")), "{err:?}");
    let err = parse_front_matter("---\njust a scalar\n---\n").unwrap_err();
    assert!(matches!(&err, MarkdownError::FrontMatter { message, .. } if message.contains("mapping")), "{err:?}");
    let err = parse_front_matter("---\na: *nowhere\n---\n").unwrap_err();
    assert!(matches!(&err, MarkdownError::FrontMatter { .. }), "{err:?}");
    let err = parse_front_matter("---\n[a, b]: complex key\n---\n").unwrap_err();
    assert!(matches!(&err, MarkdownError::FrontMatter { message, .. } if message.contains("key")), "{err:?}");
}

#[test]
fn yaml_budgets_stop_alias_bombs_deep_nesting_and_huge_front_matter() {
    // Billion laughs: nine levels of ten aliases each.
    let mut bomb = String::from(
        "---\na0: &a0 [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n",
    );
    for i in 1..10 {
        let refs = vec![format!("*a{}", i - 1); 10].join(",");
        bomb.push_str(&format!("a{i}: &a{i} [{refs}]\n"));
    }
    bomb.push_str("---\nbody\n");
    let t = Instant::now();
    let err = parse_front_matter(&bomb).unwrap_err();
    assert!(matches!(&err, MarkdownError::FrontMatter { message, .. } if message.contains("values")), "{err:?}");
    assert!(t.elapsed() < Duration::from_secs(5));

    let deep = format!("---\nk: {}{}\n---\n", "[".repeat(10_000), "]".repeat(10_000));
    let err = parse_front_matter(&deep).unwrap_err();
    // yaml-rust2's own recursion limit may stop it first; either way an error, in time.
    assert!(
        matches!(&err, MarkdownError::FrontMatter { message, .. } if message.contains("deeper") || message.contains("recursion")),
        "{err:?}"
    );
    let deep =
        format!("---\nk: {}{}\n---\n", "[".repeat(MAX_FRONT_MATTER_DEPTH + 1), "]".repeat(MAX_FRONT_MATTER_DEPTH + 1));
    let err = parse_front_matter(&deep).unwrap_err();
    assert!(
        matches!(&err, MarkdownError::FrontMatter { message, .. } if message.contains("deeper") || message.contains("recursion")),
        "{err:?}"
    );
    let ok =
        format!("---\nk: {}{}\n---\n", "[".repeat(MAX_FRONT_MATTER_DEPTH - 2), "]".repeat(MAX_FRONT_MATTER_DEPTH - 2));
    assert!(parse_front_matter(&ok).is_ok());

    let mut huge = String::from("---\n");
    while huge.len() <= MAX_FRONT_MATTER_BYTES {
        huge.push_str("key_with_some_length: value with some length too\n");
    }
    huge.push_str("---\nbody\n");
    let err = parse_front_matter(&huge).unwrap_err();
    assert!(matches!(&err, MarkdownError::FrontMatter { line: 1, message } if message.contains("KiB")), "{err:?}");
}

#[test]
fn long_sections_split_at_paragraphs_with_overlap() {
    let mut text = String::from("# Big\n\n");
    for p in 0..40 {
        text.push_str(&format!("Paragraph {p} line one has some words.\nParagraph {p} line two has more words.\n\n"));
    }
    let o = opts(300, 60);
    let d = parse(&text, "s", &o).expect("parse");
    assert!(d.chunks.len() > 5);
    check_invariants(&text, &d, &o);
    for c in &d.chunks {
        assert_eq!(c.heading_path, vec!["Big"]);
        // Cuts fall at a paragraph's end (the overlap may start inside one).
        assert!(c.text.ends_with("more words.") || c.line_end as usize == text.lines().count(), "{:?}", c.text);
    }
    // Consecutive chunks overlap: the next one starts at or before the previous one's end.
    for w in d.chunks.windows(2) {
        assert!(
            w[1].line_start <= w[0].line_end,
            "{:?} then {:?}",
            (w[0].line_start, w[0].line_end),
            (w[1].line_start, w[1].line_end)
        );
        assert!(w[1].line_start > w[0].line_start);
    }
    // Every non-blank line of the body is in some chunk.
    let lines: Vec<&str> = text.lines().collect();
    for (i, l) in lines.iter().enumerate() {
        if !l.trim().is_empty() {
            let n = i as u32 + 1;
            assert!(d.chunks.iter().any(|c| c.line_start <= n && n <= c.line_end), "line {n} lost");
        }
    }
    // Deterministic.
    assert_eq!(parse(&text, "s", &o).expect("again"), d);
}

#[test]
fn fitting_code_blocks_stay_whole_and_long_ones_split_at_lines() {
    let mut text = String::from("# Code\n\n");
    text.push_str(&"Some prose sentence here. ".repeat(8));
    text.push_str("\n\n```rust\n");
    for i in 0..8 {
        text.push_str(&format!("let value_{i} = compute({i});\n"));
    }
    text.push_str("```\n\nafter\n");
    let o = opts(300, 40);
    let d = parse(&text, "s", &o).expect("parse");
    check_invariants(&text, &d, &o);
    let code: Vec<&Chunk> = d.chunks.iter().filter(|c| c.text.contains("let value_0")).collect();
    assert!(
        code.iter().any(|c| c.text.contains("```rust") && c.text.contains("let value_7") && c.text.contains("\n```")),
        "{:#?}",
        d.chunks
    );

    let mut long = String::from("```\n");
    for i in 0..200 {
        long.push_str(&format!("line {i} of a very long code block\n"));
    }
    long.push_str("```\n");
    let d = parse(&long, "s", &o).expect("parse");
    assert!(d.chunks.len() > 10);
    check_invariants(&long, &d, &o);
}

#[test]
fn an_over_long_line_is_cut_at_char_boundaries() {
    let line: String = "数据库系统🎉 word ".repeat(2_000);
    let text = format!("# L\n\n{line}\nnext line\n");
    let o = opts(500, 50);
    let d = parse(&text, "s", &o).expect("parse");
    check_invariants(&text, &d, &o);
    let pieces: Vec<&Chunk> = d.chunks.iter().filter(|c| c.line_start == 3 && c.line_end == 3).collect();
    assert!(pieces.len() > 10);
    let no_spaces = "数".repeat(5_000);
    let d = parse(&no_spaces, "s", &o).expect("parse");
    assert!(d.chunks.iter().all(|c| c.text.chars().count() <= 500 && c.text.chars().all(|ch| ch == '数')));
    let covered: usize = d.chunks.iter().map(|c| c.text.chars().count()).sum();
    assert!(covered >= 5_000);
}

#[test]
fn hostile_nesting_parses_in_bounded_time() {
    let cases = [
        format!("{}deep quote", "> ".repeat(20_000)),
        (0..2_000).map(|i| format!("{}- item\n", "  ".repeat(i))).collect::<String>(),
        "[".repeat(200_000),
        "*a ".repeat(100_000),
        "`".repeat(100_000),
        "<div>".repeat(50_000),
        "#".repeat(100_000),
        "|a|b|\n|-|-|\n".to_owned() + &"|x|y|\n".repeat(50_000),
    ];
    for text in &cases {
        let t = Instant::now();
        let d = parse(text, "s", &ChunkOptions::default()).expect("parse");
        assert!(t.elapsed() < Duration::from_secs(20), "took {:?}", t.elapsed());
        check_invariants(text, &d, &ChunkOptions::default());
    }
}

#[test]
fn fifty_megabytes_parse_in_bounded_time() {
    let mut text = String::with_capacity(51 << 20);
    let mut i = 0;
    while text.len() < 50 << 20 {
        text.push_str(&format!("## Section {i}\n\nSome text about topic {i} with 数据库 and more words to fill the line.\n\n```\n# not a heading {i}\n```\n\n"));
        i += 1;
    }
    // Its speed is the benchmarks' to measure; a parse that blew up (quadratic in the text)
    // would not end, and the run's slow-timeout ends it.
    let d = parse(&text, "s", &ChunkOptions::default()).expect("parse");
    assert_eq!(d.chunks.len(), i);
    assert_eq!(d.chunks[i - 1].heading_path, vec![format!("Section {}", i - 1)]);
    let last = &d.chunks[i - 1];
    assert_eq!(
        last.line_end as usize,
        text.lines().collect::<Vec<_>>().iter().rposition(|l| !l.trim().is_empty()).expect("a line") + 1
    );
}

#[test]
fn bad_options_are_refused() {
    assert!(matches!(parse("x", "s", &opts(8, 0)), Err(MarkdownError::Options(_))));
    assert!(matches!(parse("x", "s", &opts(100, 50)), Err(MarkdownError::Options(_))));
    assert!(parse("x", "s", &opts(100, 49)).is_ok());
}

#[test]
fn lenient_parse_skips_a_malformed_block_and_reports_it() {
    let text = "---\ntitle: [unclosed\nsecret_field: x\n---\n# Note\n\nbody words\n";
    assert!(parse(text, "stem", &ChunkOptions::default()).is_err());
    let (d, err) = parse_lenient(text, "stem", &ChunkOptions::default()).expect("lenient");
    assert!(matches!(err, Some(MarkdownError::FrontMatter { .. })), "{err:?}");
    assert!(d.front_matter.is_none());
    assert_eq!(d.title, "Note");
    assert_eq!(d.body_line, 5);
    assert_eq!(d.chunks.len(), 1);
    assert!(!d.chunks[0].text.contains("secret_field"));
    assert_eq!((d.chunks[0].line_start, d.chunks[0].line_end), (5, 7));
    // Over the size limit: skipped the same way.
    let mut huge = String::from("---\n");
    while huge.len() <= MAX_FRONT_MATTER_BYTES {
        huge.push_str("k: v\n");
    }
    huge.push_str("---\nafter\n");
    let (d, err) = parse_lenient(&huge, "stem", &ChunkOptions::default()).expect("lenient");
    assert!(err.is_some());
    assert_eq!(d.chunks.len(), 1);
    assert_eq!(d.chunks[0].text, "after");
    // Valid front matter: the same as parse, no error.
    let ok = "---\ntitle: T\n---\nx\n";
    let (d, err) = parse_lenient(ok, "stem", &ChunkOptions::default()).expect("lenient");
    assert!(err.is_none());
    assert_eq!(d, parse(ok, "stem", &ChunkOptions::default()).expect("parse"));
    assert!(matches!(parse_lenient(ok, "s", &opts(4, 0)), Err(MarkdownError::Options(_))));
}

#[test]
fn inline_tags_are_found_in_prose_only() {
    let text = "---\ntags: [fm]\n---\n# Heading #inhead\n\nPlain #alpha and #Nested/deep/ tags, #alpha again, #ALPHA too.\n\
        Not a tag: `#code` span, a#glued, https://x.org/page#frag, [link](https://x.org/#dest), #1984, #, ##.\n\n\
        ```\n#infence\n```\n\n    #indented-code\n\n<div>#inhtml</div>\n\n- item #in-list\n\n中文 #标签 (#paren)\n";
    let d = doc(text);
    assert_eq!(d.inline_tags, ["inhead", "alpha", "Nested/deep", "in-list", "标签", "paren"]);
    assert_eq!(d.front_matter.unwrap().tags, ["fm"], "front matter tags stay apart");
    // A `# heading` is a heading, not a tag; `#heading` without a space is a tag.
    assert_eq!(doc("# Title\n\n#todo\n").inline_tags, ["todo"]);
    // Front matter is not prose.
    assert!(doc("---\nnote: \"#notatag\"\n---\nbody\n").inline_tags.is_empty());
}

#[test]
fn wikilinks_embeds_aliases_and_headings() {
    let text = "---\naliases: [Other name, \"Second\"]\n---\nSee [[Note]] and [[folder/Deep Note|the deep one]].\n\
        Jump to [[Note#Some Heading]] or [[#Local]]; embed ![[diagram.png]] and ![[Note#^block]].\n\
        `[[not a link]]`\n\n```\n[[neither]]\n```\n";
    let d = doc(text);
    let fm = d.front_matter.as_ref().unwrap();
    assert_eq!(fm.aliases, ["Other name", "Second"]);
    let got: Vec<(&str, &str, &str, bool, u32)> =
        d.links.iter().map(|l| (l.target.as_str(), l.fragment.as_str(), l.alias.as_str(), l.embed, l.line)).collect();
    assert_eq!(
        got,
        [
            ("Note", "", "", false, 4),
            ("folder/Deep Note", "", "the deep one", false, 4),
            ("Note", "Some Heading", "", false, 5),
            ("", "Local", "", false, 5),
            ("diagram.png", "", "", true, 5),
            ("Note", "^block", "", true, 5),
        ]
    );
    assert_eq!(d.links[1].target_key(), "folder/deep note");
    assert_eq!(link_key("./Folder\\Note.md"), "folder/note");
    // One string alias is one alias, not split at spaces.
    assert_eq!(doc("---\nalias: My Long Name\n---\nx\n").front_matter.unwrap().aliases, ["My Long Name"]);
}

#[test]
fn hostile_tags_and_links_are_bounded() {
    let many: String = (0..10_000).map(|i| format!("#t{i} [[n{i}]] ")).collect();
    let d = doc(&many);
    assert_eq!(d.inline_tags.len(), MAX_INLINE_TAGS);
    assert_eq!(d.links.len(), MAX_LINKS);
    let long = format!("#{}", "a".repeat(MAX_INLINE_TAG_BYTES + 1));
    assert!(doc(&long).inline_tags.is_empty());
    // Unclosed brackets and stray `#` are text, nothing breaks.
    let d = doc("[[unclosed and #ok\n[[|]] [[]] #/x #a//b\n");
    assert_eq!(d.inline_tags, ["ok"]);
    assert!(d.links.iter().all(|l| !l.target.is_empty() || !l.fragment.is_empty()));
}
