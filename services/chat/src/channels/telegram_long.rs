//! Long Telegram answers while they stream: the progress message keeps the start of the answer.
//! Once the text not yet settled in an earlier message grows past the progress limit, a piece of
//! it is *settled*: cut at the best boundary within the limit (a blank line, else a line end,
//! else a space, else anywhere), that message edited to the piece's final rendering, and the
//! answer continues in a new progress message. A cut inside a fenced code block closes the
//! fence in the piece and opens it again (same fence and language) at the start of the rest, so
//! no piece ends mid-block and every piece renders on its own; a cut at a line or paragraph
//! boundary splits no inline markup. Reading the messages in order gives the whole answer.

/// Where a streaming answer stands: how much of its text is settled in earlier messages.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Chain {
    /// Bytes of the turn's text settled in earlier messages.
    from: usize,
    /// What the unsettled rest starts with: a code fence reopened after a cut inside its block
    /// (`"```rust\n"`), else empty.
    carry: String,
    /// Messages settled so far.
    pub settled: usize,
}

impl Chain {
    /// The markdown not settled yet: the carried fence and the text from [`Chain::from`] on.
    /// A text that no longer extends what was settled (never expected: a turn's text only
    /// grows) is taken whole.
    pub fn rest(&self, text: &str) -> String {
        match text.get(self.from..) {
            Some(t) => format!("{}{t}", self.carry),
            None => text.to_owned(),
        }
    }

    /// Settles the next piece of `text` when its unsettled rest is longer than `max`
    /// characters: the piece's markdown (at most `max` characters plus a closing fence).
    pub fn settle(&mut self, text: &str, max: usize) -> Option<String> {
        let rest = self.rest(text);
        let c = cut(&rest, max)?;
        // The piece consumed the carried fence and `consumed - carry` bytes of `text`.
        let used = c.consumed.checked_sub(self.carry.len())?;
        self.from += used;
        self.carry = c.carry;
        self.settled += 1;
        Some(c.piece)
    }
}

/// One settled piece of a streaming answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cut {
    /// The piece's markdown (trailing blank lines dropped; a code block cut inside it closed).
    pub piece: String,
    /// Bytes of the text the piece took, from its start.
    pub consumed: usize,
    /// What the rest starts with: the reopened fence line (with its newline) after a cut inside
    /// a code block, else empty.
    pub carry: String,
}

/// A fenced code block's opening fence line (up to 3 spaces of indent, three or more of
/// `` ` `` or `~`): the fence character and its length.
fn opening(line: &str) -> Option<(char, usize)> {
    let t = line.trim_start_matches(' ');
    if line.len() - t.len() > 3 {
        return None;
    }
    let c = t.chars().next().filter(|c| *c == '`' || *c == '~')?;
    let n = t.chars().take_while(|&x| x == c).count();
    (n >= 3 && !(c == '`' && t[n..].contains('`'))).then_some((c, n))
}

/// An open code block at a cut: its opening fence line and the fence that closes it.
type Fence = (String, String);

/// Whether `line` closes a block opened with `n` × `c`.
fn closes(line: &str, c: char, n: usize) -> bool {
    let t = line.trim();
    !t.is_empty() && t.chars().all(|x| x == c) && t.chars().count() >= n
}

/// Cuts `text` when it is longer than `max` characters: the first piece of at most `max`
/// characters (plus a closing fence when cut inside a code block), at the last blank line,
/// else line end, else space past a third of `max`, else at `max` itself.
pub fn cut(text: &str, max: usize) -> Option<Cut> {
    let window = match text.char_indices().nth(max) {
        Some((b, _)) => b,
        None => return None,
    };
    let least = text.char_indices().nth(max / 3).map_or(0, |(b, _)| b);
    // Each line start in the window: its byte offset, whether it follows a blank line, and the
    // fence open at it (its opening line and closing fence).
    let mut starts: Vec<(usize, bool, Option<Fence>)> = Vec::new();
    let mut fence: Option<(String, char, usize)> = None;
    let mut offset = 0;
    for line in text[..window].split_inclusive('\n') {
        if !line.ends_with('\n') {
            break;
        }
        let body = line.trim_end_matches(['\n', '\r']);
        match &fence {
            Some((_, c, n)) if closes(body, *c, *n) => fence = None,
            Some(_) => {}
            None => {
                if let Some((c, n)) = opening(body) {
                    fence = Some((body.to_owned(), c, n));
                }
            }
        }
        offset += line.len();
        let blank = body.trim().is_empty();
        let open = fence.as_ref().map(|(l, c, n)| (l.clone(), c.to_string().repeat(*n)));
        starts.push((offset, blank, open));
    }
    let usable = |o: &usize| *o > least && *o < text.len();
    // A paragraph boundary outside code, else any line end outside code, else a line end
    // inside code (the block closed and reopened).
    let at = starts
        .iter()
        .rev()
        .find(|(o, blank, open)| usable(o) && *blank && open.is_none())
        .or_else(|| starts.iter().rev().find(|(o, _, open)| usable(o) && open.is_none()))
        .or_else(|| starts.iter().rev().find(|(o, _, _)| usable(o)));
    let (consumed, open) = match at {
        Some((o, _, open)) => (*o, open.clone()),
        None => {
            // One long line: the last space past a third of the window, else the window's end.
            let space = text[..window].rfind(' ').filter(|b| *b + 1 > least).map(|b| b + 1);
            let open = starts.last().and_then(|(_, _, open)| open.clone());
            (space.unwrap_or(window), open)
        }
    };
    let mut piece = text[..consumed].trim_end().to_owned();
    let carry = match open {
        Some((opening_line, close)) => {
            piece.push('\n');
            piece.push_str(&close);
            format!("{opening_line}\n")
        }
        None => String::new(),
    };
    Some(Cut { piece, consumed, carry })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chars(s: &str) -> usize {
        s.chars().count()
    }

    #[test]
    fn a_short_text_is_not_cut_and_a_long_one_at_its_last_paragraph() {
        assert_eq!(cut("short", 10), None);
        let text = format!("{}\n\n{}\n\n{}", "a".repeat(40), "b".repeat(40), "c".repeat(40));
        let c = cut(&text, 100).unwrap();
        assert_eq!(c.piece, format!("{}\n\n{}", "a".repeat(40), "b".repeat(40)));
        assert_eq!(&text[c.consumed..], "c".repeat(40));
        assert!(c.carry.is_empty());
    }

    #[test]
    fn lines_then_spaces_then_anywhere() {
        let lines = format!("{}\n{}\n{}", "a".repeat(40), "b".repeat(40), "c".repeat(40));
        let c = cut(&lines, 100).unwrap();
        assert_eq!(c.piece, format!("{}\n{}", "a".repeat(40), "b".repeat(40)));
        let words = "word ".repeat(40);
        let c = cut(&words, 100).unwrap();
        assert!(chars(&c.piece) <= 100 && c.piece.ends_with("word"), "{:?}", c.piece);
        assert!(words[c.consumed..].starts_with("word"), "cut after a space");
        let one = "é".repeat(250);
        let c = cut(&one, 100).unwrap();
        assert_eq!(chars(&c.piece), 100, "at the limit, on a character boundary");
    }

    #[test]
    fn a_cut_inside_a_code_block_closes_it_and_reopens_it_after() {
        let code: String = (0..40).map(|i| format!("let x{i} = {i};\n")).collect();
        let text = format!("Intro line.\n\n```rust\n{code}```\n\nAfter.");
        let c = cut(&text, 200).unwrap();
        assert!(c.piece.starts_with("Intro line.\n\n```rust\n") && c.piece.ends_with("\n```"), "{}", c.piece);
        assert_eq!(c.carry, "```rust\n");
        let rest = format!("{}{}", c.carry, &text[c.consumed..]);
        assert!(rest.starts_with("```rust\nlet x"), "{rest}");
        // Each piece renders on its own: one <pre> each, nothing outside it but the intro.
        let html = super::super::format::to_html(&c.piece);
        assert_eq!(html.matches("<pre>").count(), 1, "{html}");
        assert!(html.contains("</pre>"), "{html}");
    }

    #[test]
    fn a_chain_settles_pieces_whose_concatenation_is_the_text() {
        let text: String = (0..300).map(|i| format!("Paragraph {i} says something.\n\n")).collect();
        let mut chain = Chain::default();
        let mut pieces = Vec::new();
        // The text arrives in growing prefixes, as a stream does.
        for end in (0..=text.len()).step_by(97).chain([text.len()]) {
            while let Some(p) = chain.settle(&text[..end], 500) {
                assert!(chars(&p) <= 500, "{}", chars(&p));
                pieces.push(p);
            }
        }
        let rest = chain.rest(&text);
        assert!(chars(&rest) <= 500);
        pieces.push(rest.trim_end().to_owned());
        assert_eq!(chain.settled, pieces.len() - 1);
        assert_eq!(pieces.join("\n\n"), text.trim_end(), "every paragraph once, in order");
        assert!(pieces[0].starts_with("Paragraph 0 "), "the start stays in the first message");
    }
}
