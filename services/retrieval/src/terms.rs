//! The one tokenizer of the keyword engine, used both to prepare what the store indexes
//! ([`index_text`]) and to turn a user's question into terms ([`query_terms`]).
//!
//! The store's FTS5 table tokenizes with `porter unicode61 remove_diacritics 2`. That
//! tokenizer splits on spaces and punctuation and stems English words, so Latin-script words
//! pass through here as words. It cannot split Chinese, Japanese or Korean: a run of Han,
//! kana or Hangul without spaces would be one giant token, and a two-character word inside it
//! could never match. So every CJK run is cut here into overlapping character bigrams
//! ("数据库" → "数据 据库"), on both sides, and a two-character query word matches any run
//! that contains it. A lone CJK character (between non-CJK characters) stays a unigram.
//!
//! A query never reaches FTS5 as syntax: [`query_terms`] keeps only word characters, drops the
//! upper-case operators `AND`, `OR`, `NOT`, `NEAR`, and the store quotes each term it gets.

/// Most terms [`query_terms`] returns (the store's `KeywordQueryRequest` limit).
pub const MAX_TERMS: usize = 64;
/// Longest term in bytes (the store's limit); longer words are dropped from a query.
pub const MAX_TERM_BYTES: usize = 128;

/// English stopwords dropped from queries (unless a query has nothing else). Short on purpose:
/// only words that carry no topic, as in natural-language questions ("what is the …").
const STOPWORDS: &[&str] = &[
    "a", "about", "all", "also", "am", "an", "and", "any", "are", "as", "at", "be", "been", "being", "but", "by",
    "can", "could", "did", "do", "does", "for", "from", "had", "has", "have", "he", "her", "him", "his", "how", "i",
    "if", "in", "into", "is", "it", "its", "me", "my", "no", "not", "of", "on", "or", "our", "she", "should", "so",
    "such", "than", "that", "the", "their", "them", "then", "there", "these", "they", "this", "those", "to", "too",
    "very", "was", "we", "were", "what", "when", "where", "which", "who", "whom", "why", "will", "with", "would",
    "you", "your",
];

/// FTS5 operators as a user might type them (case-sensitive, as FTS5 reads them).
const OPERATORS: &[&str] = &["AND", "OR", "NOT", "NEAR"];

/// Whether `c` is a Chinese, Japanese or Korean letter that the keyword index segments into
/// bigrams: Han ideographs (CJK Unified Ideographs and extensions, compatibility ideographs,
/// `々` `〆` `〇`), Hiragana, Katakana (with `ー` and half-width forms) and Hangul (syllables
/// and jamo). CJK punctuation (`。`, `、`, `・`, full-width forms) is not.
pub fn is_cjk(c: char) -> bool {
    matches!(c as u32,
        0x3005..=0x3007            // 々 〆 〇
        | 0x3041..=0x309F          // Hiragana
        | 0x30A1..=0x30FA          // Katakana (without ・ U+30FB)
        | 0x30FC..=0x30FF          // ー ヽ ヾ ヿ
        | 0x31F0..=0x31FF          // Katakana phonetic extensions
        | 0x3400..=0x4DBF          // CJK Extension A
        | 0x4E00..=0x9FFF          // CJK Unified Ideographs
        | 0xF900..=0xFAFF          // CJK Compatibility Ideographs
        | 0xFF66..=0xFF9F          // half-width Katakana
        | 0x1100..=0x11FF          // Hangul Jamo
        | 0x3131..=0x318E          // Hangul Compatibility Jamo
        | 0xA960..=0xA97F          // Hangul Jamo Extended-A
        | 0xAC00..=0xD7A3          // Hangul syllables
        | 0xD7B0..=0xD7FF          // Hangul Jamo Extended-B
        | 0x1B000..=0x1B16F        // Kana supplement / extended
        | 0x20000..=0x3134F        // CJK Extensions B..G
    )
}

/// Punctuation and symbols outside ASCII that separate words (as unicode61 treats them).
fn is_wide_separator(c: char) -> bool {
    matches!(c as u32,
        0x00A0..=0x00BF | 0x00D7 | 0x00F7
        | 0x2000..=0x206F          // General Punctuation (spaces, dashes, quotes, ZWJ)
        | 0x20A0..=0x20CF          // currency
        | 0x2190..=0x23FF          // arrows, math operators, technical
        | 0x2500..=0x2BFF          // box drawing, shapes, dingbats, arrows
        | 0x2E00..=0x2E7F          // supplemental punctuation
        | 0x3000..=0x3004 | 0x3008..=0x303F | 0x30FB // CJK punctuation, ・
        | 0xFE00..=0xFE0F          // variation selectors
        | 0xFE10..=0xFE6F          // vertical, compatibility and small forms
        | 0xFEFF                   // BOM
        | 0xFF01..=0xFF0F | 0xFF1A..=0xFF20 | 0xFF3B..=0xFF40 | 0xFF5B..=0xFF65
        | 0xFFE0..=0xFFEF | 0xFFF0..=0xFFFF
        | 0x1F000..=0x1FAFF        // emoji, symbols
        | 0xE0000..=0xE007F        // tags
    )
}

/// Whether `c` belongs to a word (a token character): letters, digits and, outside ASCII,
/// anything that is not space, control, punctuation or a symbol (combining marks, private use).
fn is_word_char(c: char) -> bool {
    if c.is_ascii() {
        return c.is_ascii_alphanumeric();
    }
    c.is_alphanumeric() || !(c.is_whitespace() || c.is_control() || is_wide_separator(c))
}

/// A word of the input: a run of word characters that is either all CJK or has none.
struct Word<'a> {
    text: &'a str,
    cjk: bool,
}

/// Splits `text` into words: runs of word characters, cut where CJK meets non-CJK.
fn words(text: &str) -> impl Iterator<Item = Word<'_>> {
    let mut rest = text;
    std::iter::from_fn(move || {
        let start = rest.find(is_word_char)?;
        rest = &rest[start..];
        let cjk = rest.chars().next().is_some_and(is_cjk);
        let end = rest.find(|c: char| !is_word_char(c) || is_cjk(c) != cjk).unwrap_or(rest.len());
        let (word, tail) = rest.split_at(end);
        rest = tail;
        Some(Word { text: word, cjk })
    })
}

/// Calls `f` with each bigram of a CJK run (each a `&str` of two characters), or with the run
/// itself when it is a single character.
fn bigrams(run: &str, mut f: impl FnMut(&str)) {
    let mut starts = run.char_indices().map(|(i, _)| i).chain(std::iter::once(run.len()));
    let Some(mut a) = starts.next() else { return };
    let Some(mut b) = starts.next() else { return };
    if b == run.len() {
        f(run);
        return;
    }
    for c in starts {
        f(&run[a..c]);
        a = b;
        b = c;
    }
}

/// What the keyword index stores for `text` (a title, headings or a chunk's markdown): its
/// words separated by single spaces, every CJK run replaced by its overlapping bigrams (a lone
/// CJK character stays itself), and everything FTS5 would treat as a separator — markdown
/// syntax (`#`, `*`, `` ` ``, `>`, `|`, `[`, `]`, …), punctuation, symbols, line breaks — left
/// out. Case and diacritics are kept: FTS5 folds them. Linear in the input.
pub fn index_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + text.len() / 4);
    for word in words(text) {
        if word.cjk {
            bigrams(word.text, |g| push_word(&mut out, g));
        } else {
            push_word(&mut out, word.text);
        }
    }
    out
}

fn push_word(out: &mut String, word: &str) {
    if !out.is_empty() {
        out.push(' ');
    }
    out.push_str(word);
}

/// The terms of a user's query for the store's `KeywordQuery`: its words lower-cased (as
/// [`index_text`] splits them, so "2.5" gives "2" and "5", matching how the index holds it),
/// CJK runs as bigrams, English stopwords dropped unless that leaves nothing, the upper-case
/// FTS5 operators `AND` `OR` `NOT` `NEAR` dropped, words longer than [`MAX_TERM_BYTES`]
/// dropped, duplicates removed (first occurrence kept), at most [`MAX_TERMS`].
///
/// Punctuation, quotes and FTS5 syntax (`"`, `*`, `NEAR(`, `^`, `-`, `:`, parentheses) never
/// survive: a query of only those gives an empty list, which the caller reports as an error.
pub fn query_terms(query: &str) -> Vec<String> {
    let mut all: Vec<String> = Vec::new();
    for word in words(query) {
        if word.cjk {
            bigrams(word.text, |g| all.push(g.to_owned()));
        } else if !OPERATORS.contains(&word.text) {
            all.push(word.text.to_lowercase());
        }
    }
    all.retain(|t| t.len() <= MAX_TERM_BYTES);
    let has_content = all.iter().any(|t| !is_stopword(t));
    let mut out: Vec<String> = Vec::new();
    for term in all {
        if (has_content && is_stopword(&term)) || out.contains(&term) {
            continue;
        }
        out.push(term);
        if out.len() == MAX_TERMS {
            break;
        }
    }
    out
}

/// Whether `query` has a CJK word of one character (`茶`): the keyword index holds CJK text as
/// overlapping character pairs, so such a word is found there only where it stands alone; the
/// grep engine finds it anywhere.
pub fn has_lone_cjk_char(query: &str) -> bool {
    words(query).any(|w| w.cjk && w.text.chars().nth(1).is_none())
}

/// Whether `term` (lower-case) is one of the English stopwords queries drop.
pub fn is_stopword(term: &str) -> bool {
    STOPWORDS.binary_search(&term).is_ok()
}

#[cfg(test)]
#[path = "tests/terms.rs"]
mod tests;
