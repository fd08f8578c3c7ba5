//! Search-result snippets: the window of a chunk's text that holds the most distinct query
//! terms, with each match wrapped in `**…**`.
use crate::terms::is_cjk;

/// Most term occurrences considered when choosing a window (the rest are still highlighted).
const MAX_MATCHES: usize = 4096;

/// Case-folds one character to one character (simple lower-case mapping; a character whose
/// lower case is several characters stays itself), so folded and original text align.
fn fold(c: char) -> char {
    let mut l = c.to_lowercase();
    match (l.next(), l.next()) {
        (Some(a), None) => a,
        _ => c,
    }
}

/// The best window of `text` for `terms`, at most `max_chars` characters of it (plus the
/// `**` markers and a leading/trailing `…` where the text was cut).
///
/// - Whitespace runs (line breaks included) become one space; the result is trimmed.
/// - Terms match case-insensitively. A CJK term (or one starting with a CJK character)
///   matches anywhere; any other term only at the start of a word, and it may end inside one,
///   so `layer` marks the stem of `layers` as FTS5's stemming would match it.
/// - The window is the one with the most distinct terms (then the most matches, then the
///   earliest), placed so the first match has some context before it; cut ends move to a space
///   when one is near, and never split a character.
/// - Empty or whitespace-only terms are ignored; with no match the window is the text's start.
/// - `max_chars` of 0 gives an empty string.
pub fn snippet(text: &str, terms: &[String], max_chars: usize) -> String {
    if max_chars == 0 {
        return String::new();
    }
    // Whitespace-collapsed characters, and their folded twins (same length).
    let mut chars: Vec<char> = Vec::with_capacity(text.len().min(1 << 20));
    for c in text.chars() {
        if c.is_whitespace() {
            if chars.last().is_some_and(|&p| p != ' ') {
                chars.push(' ');
            }
        } else {
            chars.push(c);
        }
    }
    while chars.last() == Some(&' ') {
        chars.pop();
    }
    let folded: Vec<char> = chars.iter().map(|&c| fold(c)).collect();
    let needles: Vec<Vec<char>> = {
        let mut v: Vec<Vec<char>> = terms
            .iter()
            .map(|t| t.split_whitespace().collect::<Vec<_>>().join(" ").chars().map(fold).collect::<Vec<char>>())
            .filter(|t| !t.is_empty())
            .collect();
        v.sort();
        v.dedup();
        v
    };

    // Every match: (start, end, term index), by start.
    let mut matches: Vec<(usize, usize, usize)> = Vec::new();
    for (ti, needle) in needles.iter().enumerate() {
        let anywhere = is_cjk(needle[0]);
        // A number matches whole (`2` is not in `2024`); a word may end inside a longer one.
        let whole = needle.last().is_some_and(char::is_ascii_digit);
        let mut i = 0;
        while i + needle.len() <= folded.len() {
            // The word-start test first: it is one comparison, the slice comparison up to a
            // needle's length (a run of one letter would otherwise compare at every position).
            if folded[i] == needle[0]
                && (anywhere || i == 0 || !folded[i - 1].is_alphanumeric())
                && folded[i..i + needle.len()] == needle[..]
                && (!whole || folded.get(i + needle.len()).is_none_or(|c| !c.is_alphanumeric()))
            {
                matches.push((i, i + needle.len(), ti));
                i += needle.len();
            } else {
                i += 1;
            }
        }
    }
    matches.sort_unstable();

    // Choose the window.
    let len = chars.len();
    let (mut start, mut end) = (0, len.min(max_chars));
    if len > max_chars && !matches.is_empty() {
        let lead = max_chars / 4;
        let considered = &matches[..matches.len().min(MAX_MATCHES)];
        // (distinct terms, matches, window start): the first window that has the most.
        let mut best = (0usize, 0usize, considered[0].0.saturating_sub(lead).min(len - max_chars));
        let mut seen = vec![0usize; needles.len()];
        let mut last_ws = usize::MAX;
        for &(s, _, _) in considered {
            let ws = s.saturating_sub(lead).min(len - max_chars);
            if ws == last_ws {
                continue;
            }
            last_ws = ws;
            let we = ws + max_chars;
            seen.iter_mut().for_each(|x| *x = 0);
            let mut count = 0;
            let from = considered.partition_point(|m| m.0 < ws);
            for &(_, me, ti) in considered[from..].iter().take_while(|m| m.0 < we) {
                if me <= we {
                    seen[ti] += 1;
                    count += 1;
                }
            }
            let distinct = seen.iter().filter(|&&x| x > 0).count();
            if (distinct, count) > (best.0, best.1) {
                best = (distinct, count, ws);
            }
        }
        start = best.2;
        end = start + max_chars;
    }
    // Move cut ends to a nearby space, so words are not cut (CJK text has no spaces: it stays).
    let slack = (max_chars / 8).min(24);
    if start > 0 && chars[start - 1] != ' ' {
        let first_match = matches.iter().find(|m| m.0 >= start).map_or(end, |m| m.0);
        if let Some(off) = chars[start..end.min(start + slack + 1)].iter().position(|&c| c == ' ')
            && start + off < first_match
        {
            start += off + 1;
        }
    }
    if end < len && chars[end] != ' ' {
        let last_match_end = matches.iter().filter(|m| m.1 <= end).map(|m| m.1).max().unwrap_or(start);
        if let Some(off) = chars[end.saturating_sub(slack).max(start)..end].iter().rposition(|&c| c == ' ') {
            let cut = end.saturating_sub(slack).max(start) + off;
            if cut > last_match_end && cut > start {
                end = cut;
            }
        }
    }
    while start < end && chars[start] == ' ' {
        start += 1;
    }
    while end > start && chars[end - 1] == ' ' {
        end -= 1;
    }

    // Highlight spans inside the window (overlapping matches merged).
    let mut spans: Vec<(usize, usize)> = Vec::new();
    for &(ms, me, _) in &matches {
        let (s, e) = (ms.max(start), me.min(end));
        if s >= e {
            continue;
        }
        match spans.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => spans.push((s, e)),
        }
    }
    let mut out = String::with_capacity((end - start) * 3 + spans.len() * 4 + 8);
    if start > 0 {
        out.push('…');
    }
    let mut pos = start;
    for (s, e) in spans {
        out.extend(&chars[pos..s]);
        out.push_str("**");
        out.extend(&chars[s..e]);
        out.push_str("**");
        pos = e;
    }
    out.extend(&chars[pos..end]);
    if end < len {
        out.push('…');
    }
    out
}

#[cfg(test)]
#[path = "tests/snippet.rs"]
mod tests;
