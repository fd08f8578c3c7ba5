//! Telegram's text rules for the adapter: markdown split into messages of at most
//! [`MAX_CHARS`] characters at paragraph or code-block boundaries, and each piece rendered as
//! Telegram-safe HTML (Bot API "HTML style": only `b i s u code pre a blockquote`, `<>&`
//! escaped everywhere, `"` in attributes).
use pulldown_cmark::{CodeBlockKind, Event, HeadingLevel, Options, Parser, Tag, TagEnd};

/// Most characters of one Telegram message (after entity parsing, which is never more than the
/// markdown a piece was rendered from).
pub const MAX_CHARS: usize = 4096;

/// Escapes text for Telegram HTML.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            c => out.push(c),
        }
    }
    out
}

/// The tool and what it would do as Telegram HTML: "<b>Bash</b> <code>rm -rf build</code>"
/// (the command or path cut at 300 characters, on one line).
pub fn approval_what(view: &crate::channels::ApprovalView) -> String {
    let tool = if view.tool.is_empty() { "An action".to_owned() } else { view.tool.clone() };
    let rest = if view.detail.is_empty() {
        view.summary.strip_prefix(&format!("{}: ", view.tool)).unwrap_or(&view.summary).to_owned()
    } else {
        view.detail.clone()
    };
    let one_line = rest.replace(['\n', '\r'], " ");
    let cut = if one_line.chars().count() > 300 {
        format!("{}…", one_line.chars().take(300).collect::<String>())
    } else {
        one_line
    };
    if cut.trim().is_empty() || view.summary.is_empty() && view.detail.is_empty() {
        format!("<b>{}</b>", escape(&tool))
    } else {
        format!("<b>{}</b> <code>{}</code>", escape(&tool), escape(&cut))
    }
}

/// An approval request (waiting: what the buttons answer) or its decision and who made it, as
/// Telegram HTML.
pub fn approval_html(view: &crate::channels::ApprovalView) -> String {
    let n = view.number;
    let what = approval_what(view);
    match &view.decided {
        None => {
            format!("⏳ Waiting for your approval: {what}\n#{n} · or /deny {n} <i>message</i> to tell the agent why")
        }
        Some(d) => {
            let icon = if d.decision == "deny" { "🚫" } else { "✅" };
            let told = if d.decision == "deny" && !d.message.is_empty() {
                let m: String = d.message.chars().take(500).collect();
                format!("\nThe agent was told: <i>{}</i>", escape(&m))
            } else {
                String::new()
            };
            format!("{icon} <b>{}</b>: {what} (#{n})\nby {}{told}", view.outcome(), escape(&view.by_whom()))
        }
    }
}

/// Escapes markdown's punctuation with backslashes (text of ours, e.g. an error message, shown
/// as written).
pub fn escape_md(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_ascii_punctuation() {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

fn chars(s: &str) -> usize {
    s.chars().count()
}

/// A fenced code block's opening fence (```` ``` ```` or `~~~`, up to 3 spaces of indent): the
/// fence character and its length.
fn fence(line: &str) -> Option<(char, usize)> {
    let t = line.trim_start_matches(' ');
    if line.len() - t.len() > 3 {
        return None;
    }
    let c = t.chars().next()?;
    if c != '`' && c != '~' {
        return None;
    }
    let n = t.chars().take_while(|&x| x == c).count();
    (n >= 3 && !(c == '`' && t[n..].contains('`'))).then_some((c, n))
}

/// One block of the source: a run of non-blank lines, or a whole fenced code block.
#[derive(Debug)]
struct Block {
    text: String,
    /// For a code block: its opening fence line and closing fence.
    code: Option<(String, String)>,
}

fn blocks(md: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut para: Vec<&str> = Vec::new();
    let mut lines = md.lines();
    let flush = |para: &mut Vec<&str>, out: &mut Vec<Block>| {
        if !para.is_empty() {
            out.push(Block { text: para.join("\n"), code: None });
            para.clear();
        }
    };
    while let Some(line) = lines.next() {
        if let Some((c, n)) = fence(line) {
            flush(&mut para, &mut out);
            let mut body = vec![line];
            let mut closing = String::new();
            for l in lines.by_ref() {
                body.push(l);
                let t = l.trim();
                if t.chars().all(|x| x == c) && chars(t) >= n {
                    closing = l.to_owned();
                    break;
                }
            }
            let close = if closing.is_empty() { c.to_string().repeat(n) } else { closing };
            out.push(Block { text: body.join("\n"), code: Some((line.to_owned(), close)) });
        } else if line.trim().is_empty() {
            flush(&mut para, &mut out);
        } else {
            para.push(line);
        }
    }
    flush(&mut para, &mut out);
    out
}

/// Cuts `s` into pieces of at most `max` characters: at line ends, else at spaces, else
/// anywhere.
fn hard_split(s: &str, max: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut n = 0;
    for line in s.split_inclusive('\n') {
        let ln = chars(line);
        if n + ln <= max {
            cur.push_str(line);
            n += ln;
            continue;
        }
        if !cur.is_empty() {
            out.push(std::mem::take(&mut cur));
        }
        if ln <= max {
            cur.push_str(line);
            n = ln;
            continue;
        }
        // One line longer than the limit: at spaces, else anywhere.
        let mut rest: Vec<char> = line.chars().collect();
        while rest.len() > max {
            let cut = rest[..max].iter().rposition(|c| *c == ' ').filter(|&i| i > max / 2).map_or(max, |i| i + 1);
            out.push(rest[..cut].iter().collect());
            rest.drain(..cut);
        }
        cur = rest.iter().collect();
        n = rest.len();
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out.into_iter().map(|p| p.trim_end_matches('\n').to_owned()).filter(|p| !p.trim().is_empty()).collect()
}

/// Splits markdown into pieces of at most `max` characters, in order: whole paragraphs and
/// code blocks packed together; a paragraph longer than `max` cut at lines or words; a code
/// block longer than `max` cut at lines, each piece fenced again (same fence and language).
pub fn split(md: &str, max: usize) -> Vec<String> {
    let mut units: Vec<String> = Vec::new();
    for b in blocks(md) {
        if chars(&b.text) <= max {
            units.push(b.text);
            continue;
        }
        match b.code {
            Some((open, close)) => {
                let inner = b.text.lines().skip(1).collect::<Vec<_>>();
                let inner = if inner.last().is_some_and(|l| l.trim() == close.trim()) {
                    &inner[..inner.len() - 1]
                } else {
                    &inner[..]
                };
                let room = max.saturating_sub(chars(&open) + chars(&close) + 2).max(16);
                for body in hard_split(&inner.join("\n"), room) {
                    units.push(format!("{open}\n{body}\n{close}"));
                }
            }
            None => units.extend(hard_split(&b.text, max)),
        }
    }
    let mut out: Vec<String> = Vec::new();
    for u in units {
        match out.last_mut() {
            Some(last) if chars(last) + 2 + chars(&u) <= max => {
                last.push_str("\n\n");
                last.push_str(&u);
            }
            _ => out.push(u),
        }
    }
    out
}

/// Whether a link target may be a Telegram link (no `javascript:` or other schemes).
fn safe_url(url: &str) -> bool {
    let lower = url.trim().to_ascii_lowercase();
    ["http://", "https://", "tg://", "mailto:"].iter().any(|p| lower.starts_with(p))
}

/// Renders markdown as Telegram HTML: bold, italic, strikethrough, inline code, code blocks
/// (`<pre><code class="language-…">`), links (http, https, tg, mailto only), block quotes;
/// headings become bold lines, lists bullets, raw HTML is shown as text.
pub fn to_html(md: &str) -> String {
    let mut out = String::new();
    let mut lists: Vec<Option<u64>> = Vec::new();
    let mut links: Vec<bool> = Vec::new();
    // The open code block has a `<code class>` inside its `<pre>`.
    let mut code_tag = false;
    let opts = Options::ENABLE_STRIKETHROUGH;
    for ev in Parser::new_ext(md, opts) {
        match ev {
            Event::Start(tag) => match tag {
                Tag::Paragraph => {}
                Tag::Heading { .. } => out.push_str("<b>"),
                Tag::BlockQuote(_) => out.push_str("<blockquote>"),
                Tag::CodeBlock(kind) => {
                    let lang = match kind {
                        CodeBlockKind::Fenced(l) => l
                            .split_whitespace()
                            .next()
                            .unwrap_or_default()
                            .chars()
                            .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '+' | '-'))
                            .take(32)
                            .collect::<String>(),
                        CodeBlockKind::Indented => String::new(),
                    };
                    code_tag = !lang.is_empty();
                    if lang.is_empty() {
                        out.push_str("<pre>");
                    } else {
                        out.push_str(&format!("<pre><code class=\"language-{lang}\">"));
                    }
                }
                Tag::List(start) => {
                    if !lists.is_empty() && !out.ends_with('\n') {
                        out.push('\n');
                    }
                    lists.push(start);
                }
                Tag::Item => {
                    let depth = lists.len().saturating_sub(1);
                    out.push_str(&"  ".repeat(depth));
                    match lists.last_mut() {
                        Some(Some(n)) => {
                            out.push_str(&format!("{n}. "));
                            *n += 1;
                        }
                        _ => out.push_str("• "),
                    }
                }
                Tag::Emphasis => out.push_str("<i>"),
                Tag::Strong => out.push_str("<b>"),
                Tag::Strikethrough => out.push_str("<s>"),
                Tag::Link { dest_url, .. } => {
                    let ok = safe_url(&dest_url);
                    if ok {
                        out.push_str(&format!("<a href=\"{}\">", escape(dest_url.trim())));
                    }
                    links.push(ok);
                }
                Tag::Image { .. } => links.push(false),
                _ => {}
            },
            Event::End(tag) => match tag {
                TagEnd::Paragraph => out.push_str(if lists.is_empty() { "\n\n" } else { "\n" }),
                TagEnd::Heading(level) => {
                    out.push_str("</b>");
                    out.push_str(if level == HeadingLevel::H1 { "\n\n" } else { "\n" });
                }
                TagEnd::BlockQuote(_) => {
                    trim_newlines(&mut out);
                    out.push_str("</blockquote>\n\n");
                }
                TagEnd::CodeBlock => {
                    if out.ends_with('\n') {
                        out.pop();
                    }
                    out.push_str(if code_tag { "</code></pre>\n\n" } else { "</pre>\n\n" });
                }
                TagEnd::List(_) => {
                    lists.pop();
                    if lists.is_empty() {
                        trim_newlines(&mut out);
                        out.push_str("\n\n");
                    }
                }
                TagEnd::Item if !out.ends_with('\n') => out.push('\n'),
                TagEnd::Emphasis => out.push_str("</i>"),
                TagEnd::Strong => out.push_str("</b>"),
                TagEnd::Strikethrough => out.push_str("</s>"),
                // The guard pops the link either way; only an opened `<a>` is closed.
                TagEnd::Link | TagEnd::Image if links.pop() == Some(true) => out.push_str("</a>"),
                _ => {}
            },
            Event::Text(t) => out.push_str(&escape(&t)),
            Event::Code(t) => {
                out.push_str("<code>");
                out.push_str(&escape(&t));
                out.push_str("</code>");
            }
            Event::Html(t) | Event::InlineHtml(t) => out.push_str(&escape(&t)),
            Event::InlineMath(t) | Event::DisplayMath(t) => out.push_str(&escape(&t)),
            Event::SoftBreak | Event::HardBreak => out.push('\n'),
            Event::Rule => out.push_str("———\n\n"),
            Event::FootnoteReference(t) => out.push_str(&escape(&format!("[{t}]"))),
            Event::TaskListMarker(done) => out.push_str(if done { "☑ " } else { "☐ " }),
        }
    }
    trim_newlines(&mut out);
    out
}

fn trim_newlines(s: &mut String) {
    while s.ends_with('\n') {
        s.pop();
    }
}

/// The visible text of Telegram HTML (tags removed, the four entities decoded): what Telegram
/// counts against [`MAX_CHARS`].
pub fn visible(html: &str) -> String {
    let mut out = String::new();
    let mut in_tag = false;
    for c in html.chars() {
        match c {
            '<' => in_tag = true,
            '>' if in_tag => in_tag = false,
            c if !in_tag => out.push(c),
            _ => {}
        }
    }
    out.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", "\"").replace("&amp;", "&")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tags are balanced and only Telegram's.
    fn well_formed(html: &str) {
        let allowed = ["b", "i", "s", "u", "code", "pre", "a", "blockquote"];
        let mut stack: Vec<String> = Vec::new();
        let mut rest = html;
        while let Some(i) = rest.find('<') {
            let end = rest[i..].find('>').expect("a tag ends") + i;
            let tag = &rest[i + 1..end];
            if let Some(name) = tag.strip_prefix('/') {
                assert_eq!(stack.pop().as_deref(), Some(name), "balanced in {html}");
            } else {
                let name = tag.split(' ').next().unwrap();
                assert!(allowed.contains(&name), "<{name}> in {html}");
                stack.push(name.to_owned());
            }
            rest = &rest[end + 1..];
        }
        assert!(stack.is_empty(), "unclosed {stack:?} in {html}");
    }

    #[test]
    fn markdown_becomes_telegram_html() {
        let h = to_html("# Title\n\nSome **bold**, *it*, ~~gone~~ and `x<y`.\n\n- one\n- two\n\n> quoted");
        assert_eq!(
            h,
            "<b>Title</b>\n\nSome <b>bold</b>, <i>it</i>, <s>gone</s> and <code>x&lt;y</code>.\n\n• one\n• two\n\n<blockquote>quoted</blockquote>"
        );
        let code = to_html("```rust\nfn main() { a && b < c }\n```");
        assert_eq!(code, "<pre><code class=\"language-rust\">fn main() { a &amp;&amp; b &lt; c }</code></pre>");
        assert_eq!(to_html("```\nplain\n```"), "<pre>plain</pre>");
        assert_eq!(
            to_html("[site](https://e.x/?a=1&b=\"2\")"),
            "<a href=\"https://e.x/?a=1&amp;b=&quot;2&quot;\">site</a>"
        );
        assert_eq!(to_html("1. a\n2. b"), "1. a\n2. b");
    }

    #[test]
    fn hostile_markdown_renders_safely() {
        for md in [
            "<script>alert(1)</script>",
            "<b>not ours</b> & <i",
            "unbalanced *star _under `tick [bracket](",
            "[x](javascript:alert(1)) ![img](http://e/x.png)",
            "````\n```\nnested\n```\n````",
            "```py\nopen\nnever closed",
            "> quote\n> ```\n> code in quote\n> ```",
            "* a\n  * b\n    * c **x",
        ] {
            let h = to_html(md);
            well_formed(&h);
            assert!(!h.contains("<script") && !h.contains("javascript:\""), "{h}");
            assert!(chars(&visible(&h)) <= chars(md), "{md:?} → {h:?}");
        }
        assert!(to_html("<script>x</script>").contains("&lt;script&gt;"));
        assert!(!to_html("[x](javascript:alert(1))").contains("href"));
    }

    #[test]
    fn long_replies_split_at_boundaries_in_order_and_code_blocks_are_refenced() {
        let para = |i: usize| format!("Paragraph {i} {}", "word ".repeat(150).trim_end());
        let md: String = (0..30).map(para).collect::<Vec<_>>().join("\n\n");
        let pieces = split(&md, MAX_CHARS);
        assert!(pieces.len() > 1);
        for p in &pieces {
            assert!(chars(p) <= MAX_CHARS);
            assert!(p.starts_with("Paragraph "), "a piece starts at a paragraph");
        }
        assert_eq!(pieces.join("\n\n"), md, "nothing lost, in order");

        let code: String = (0..800).map(|i| format!("let x{i} = {i};\n")).collect();
        let md = format!("Intro\n\n```rust\n{code}```\n\nOutro");
        let pieces = split(&md, MAX_CHARS);
        assert!(pieces.len() >= 4, "{}", pieces.len());
        let mut lines = Vec::new();
        for p in &pieces {
            assert!(chars(p) <= MAX_CHARS, "{}", chars(p));
            let h = to_html(p);
            well_formed(&h);
            if p.contains("let x") {
                assert!(
                    p.trim_start_matches("Intro\n\n").starts_with("```rust\n") && p.contains("\n```"),
                    "re-fenced: {p:.40}"
                );
                assert!(h.contains("language-rust"));
            }
            lines.extend(p.lines().filter(|l| l.starts_with("let x")).map(str::to_owned));
        }
        let want: Vec<String> = (0..800).map(|i| format!("let x{i} = {i};")).collect();
        assert_eq!(lines, want, "every line once, in order");
        assert!(pieces.last().unwrap().ends_with("Outro"));

        let one = "y".repeat(10_000);
        let pieces = split(&one, MAX_CHARS);
        assert_eq!(pieces.concat(), one);
        assert!(pieces.iter().all(|p| chars(p) <= MAX_CHARS));
        assert!(split("", MAX_CHARS).is_empty());
        let cjk = "数".repeat(5000);
        assert!(split(&cjk, MAX_CHARS).iter().all(|p| chars(p) <= MAX_CHARS), "characters, not bytes");
    }
}
