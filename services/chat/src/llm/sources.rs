//! The internal agent's numbered sources: every passage a search tool (`coffer__search_knowledge`,
//! `coffer__recall`) returned during a run gets a number the model cites as `[n]`; once the run
//! ends, the answer's citations are read back, renumbered in order of first mention, and become
//! the reply's `citations`.
//!
//! Passages come from the tools' `structuredContent.results`: `coffer__search_knowledge`'s
//! `kb`, `path`, `heading` (the heading path joined by ` > `), `line_start`, `line_end`,
//! `snippet`, and `coffer__recall`'s search JSON (`heading_path`, `title`, `fact_id`, …); the
//! same passage found twice keeps its first number.
//!
//! A citation carries the source, KB, path, heading path, line range and a snippet of at most
//! [`MAX_CITATION_SNIPPET`] characters; bracketed numbers in the answer that are not sources are
//! left alone.
use coffer_proto::llm::Citation;
use serde_json::Value;

/// Longest snippet a citation carries (characters), as `proto/llm.proto` says.
pub const MAX_CITATION_SNIPPET: usize = 400;

/// The passages found so far in one run, numbered from 1 in order of discovery.
#[derive(Debug, Default)]
pub struct Sources {
    items: Vec<Citation>,
}

impl Sources {
    /// How many passages are numbered.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Source number `n` (1-based).
    pub fn get(&self, n: usize) -> Option<&Citation> {
        n.checked_sub(1).and_then(|i| self.items.get(i))
    }

    /// Numbers the passages of a search tool's result (`structured` = its `structuredContent`)
    /// and returns the text the model sees instead of the tool's own: one block per passage,
    /// `[n] kb:path:first-last > heading` (or `[n] memory fact <id>`) then the snippet. `None`
    /// when `structured` carries no `results` array (the tool's own text is then used).
    pub fn number(&mut self, structured: &Value) -> Option<String> {
        let results = structured.get("results")?.as_array()?;
        if results.is_empty() {
            return Some("No passages matched. Try other words, fewer words, or the other search tool.".to_owned());
        }
        let mut out =
            format!("{} passage{} (cite them by number):", results.len(), if results.len() == 1 { "" } else { "s" });
        for r in results {
            let c = citation_of(r);
            let n = match self.items.iter().position(|x| same_passage(x, &c)) {
                Some(i) => i + 1,
                None => {
                    self.items.push(c.clone());
                    self.items.len()
                }
            };
            let snippet = r.get("snippet").and_then(Value::as_str).unwrap_or_default().trim();
            if c.source == "memory" {
                out.push_str(&format!("\n\n[{n}] memory fact {}\n{snippet}", c.path));
            } else {
                out.push_str(&format!("\n\n[{n}] {}:{}:{}-{}", c.kb, c.path, c.line_start, c.line_end));
                if !c.heading.is_empty() {
                    out.push_str(&format!(" > {}", c.heading));
                }
                out.push('\n');
                out.push_str(snippet);
            }
        }
        Some(out)
    }

    /// The citations `answer` makes, renumbered: each `[n]` (or `[n, m]`) naming a known source
    /// becomes its position in the returned list, in order of first mention. Bracketed numbers
    /// that do not all name a known source (`[2024]`) are left as they are.
    pub fn cite(&self, answer: &str) -> (String, Vec<Citation>) {
        let mut order: Vec<usize> = Vec::new();
        let mut out = String::with_capacity(answer.len());
        let mut rest = answer;
        while let Some(open) = rest.find('[') {
            out.push_str(&rest[..open]);
            let after = &rest[open + 1..];
            let group = after.find(']').map(|close| (&after[..close], close));
            let numbers = group.and_then(|(inner, _)| self.parse_group(inner));
            match (group, numbers) {
                (Some((_, close)), Some(numbers)) => {
                    let renumbered: Vec<String> = numbers
                        .into_iter()
                        .map(|n| {
                            let pos = match order.iter().position(|&o| o == n) {
                                Some(p) => p,
                                None => {
                                    order.push(n);
                                    order.len() - 1
                                }
                            };
                            (pos + 1).to_string()
                        })
                        .collect();
                    out.push('[');
                    out.push_str(&renumbered.join(", "));
                    out.push(']');
                    rest = &after[close + 1..];
                }
                _ => {
                    out.push('[');
                    rest = after;
                }
            }
        }
        out.push_str(rest);
        let citations = order.into_iter().filter_map(|n| self.get(n).cloned()).collect();
        (out, citations)
    }

    /// Every source found, in number order, at most `max` (for an answer that cites none).
    pub fn first(&self, max: usize) -> Vec<Citation> {
        self.items.iter().take(max).cloned().collect()
    }

    /// `1` or `1, 3` or `1,3` when every number names a known source.
    fn parse_group(&self, inner: &str) -> Option<Vec<usize>> {
        let numbers: Option<Vec<usize>> = inner.split(',').map(|p| p.trim().parse::<usize>().ok()).collect();
        let numbers = numbers?;
        (!numbers.is_empty() && numbers.iter().all(|&n| n >= 1 && n <= self.items.len())).then_some(numbers)
    }
}

/// Whether two citations are the same passage (same place; the snippet may differ by query).
fn same_passage(a: &Citation, b: &Citation) -> bool {
    a.source == b.source && a.kb == b.kb && a.path == b.path && a.line_start == b.line_start && a.line_end == b.line_end
}

/// A search result's JSON as a citation.
fn citation_of(r: &Value) -> Citation {
    let text = |k: &str| r.get(k).and_then(Value::as_str).unwrap_or_default().to_owned();
    let line = |k: &str| r.get(k).and_then(Value::as_u64).and_then(|v| u32::try_from(v).ok()).unwrap_or(0);
    let snippet = cut_chars(text("snippet").trim(), MAX_CITATION_SNIPPET);
    match r.get("fact_id").and_then(Value::as_str).filter(|s| !s.is_empty()) {
        Some(id) => Citation {
            source: "memory".into(),
            kb: String::new(),
            path: id.to_owned(),
            heading: String::new(),
            line_start: 0,
            line_end: 0,
            snippet,
        },
        None => {
            let joined = text("heading");
            let mut heading: Vec<String> = r
                .get("heading_path")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_str).map(str::to_owned).collect())
                .unwrap_or_default();
            if heading.is_empty() && !joined.is_empty() {
                heading.push(joined);
            } else if heading.is_empty() && !text("title").is_empty() {
                heading.push(text("title"));
            }
            Citation {
                source: "knowledge".into(),
                kb: text("kb"),
                path: text("path"),
                heading: heading.join(" > "),
                line_start: line("line_start"),
                line_end: line("line_end"),
                snippet,
            }
        }
    }
}

/// `s` cut to at most `max` characters (on a character boundary), with `…` when cut.
pub fn cut_chars(s: &str, max: usize) -> String {
    match s.char_indices().nth(max.saturating_sub(1)) {
        Some((i, _)) if s.chars().count() > max => format!("{}…", &s[..i]),
        _ => s.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn hit(kb: &str, path: &str, start: u32, end: u32, heading: &[&str]) -> Value {
        json!({"kb": kb, "path": path, "title": "T", "heading_path": heading, "line_start": start, "line_end": end,
               "snippet": format!("text of {path}"), "fact_id": null})
    }

    #[test]
    fn passages_are_numbered_once_and_rendered_for_the_model() {
        let mut s = Sources::default();
        let text = s
            .number(
                &json!({"results": [hit("notes", "a.md", 3, 9, &["Intro", "Keys"]), hit("notes", "b.md", 1, 2, &[])]}),
            )
            .unwrap();
        assert!(text.contains("[1] notes:a.md:3-9 > Intro > Keys\ntext of a.md"), "{text}");
        assert!(text.contains("[2] notes:b.md:1-2 > T"), "the title stands in for no heading: {text}");
        let again =
            s.number(&json!({"results": [hit("notes", "b.md", 1, 2, &[]), hit("work", "c.md", 5, 5, &[])]})).unwrap();
        assert!(again.contains("[2] notes:b.md") && again.contains("[3] work:c.md"), "{again}");
        assert_eq!(s.len(), 3);
        let fact = s
            .number(&json!({"results": [{"kb": "memory", "path": "01J.md", "fact_id": "01J", "snippet": "likes tea", "line_start": 1, "line_end": 1}]}))
            .unwrap();
        assert!(fact.contains("[4] memory fact 01J\nlikes tea"), "{fact}");
        assert_eq!(s.get(4).unwrap().source, "memory");
        assert!(s.number(&json!({"content": []})).is_none(), "no results array");
        assert!(s.number(&json!({"results": []})).unwrap().starts_with("No passages"));
    }

    /// `coffer__search_knowledge`'s compact `structuredContent` (the heading path joined).
    #[test]
    fn the_compact_knowledge_shape_is_numbered_too() {
        let mut s = Sources::default();
        let text = s
            .number(&json!({"results": [{"kb": "notes", "path": "a.md", "heading": "Intro > Keys", "line_start": 3,
                "line_end": 9, "snippet": "rotate them"}]}))
            .unwrap();
        assert!(text.contains("[1] notes:a.md:3-9 > Intro > Keys\nrotate them"), "{text}");
        let c = s.get(1).unwrap();
        assert_eq!((c.source.as_str(), c.heading.as_str(), c.line_end), ("knowledge", "Intro > Keys", 9));
    }

    #[test]
    fn citations_are_renumbered_in_order_of_first_mention() {
        let mut s = Sources::default();
        s.number(&json!({"results": [hit("k", "a.md", 1, 2, &[]), hit("k", "b.md", 3, 4, &[]), hit("k", "c.md", 5, 6, &[])]}));
        let (text, cites) = s.cite("C says so [3]. A too [1, 3]. In [2024] nothing; [9] is unknown; [x] [");
        assert_eq!(text, "C says so [1]. A too [2, 1]. In [2024] nothing; [9] is unknown; [x] [");
        assert_eq!(cites.iter().map(|c| c.path.as_str()).collect::<Vec<_>>(), ["c.md", "a.md"]);
        let (plain, none) = s.cite("no citations at all");
        assert_eq!(plain, "no citations at all");
        assert!(none.is_empty());
    }

    #[test]
    fn snippets_are_bounded_on_character_boundaries() {
        let long = "é".repeat(1000);
        let c = citation_of(&json!({"kb": "k", "path": "p", "snippet": long}));
        assert_eq!(c.snippet.chars().count(), MAX_CITATION_SNIPPET);
        assert!(c.snippet.ends_with('…'));
        assert_eq!(cut_chars("short", 10), "short");
    }
}
