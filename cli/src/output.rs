//! Writing results to stdout (the only place the CLI does) and formatting them: aligned tables,
//! durations, JSON bodies.
//!
//! stdout carries only a command's result; diagnostics go to stderr. Writes go through
//! [`print`] so a closed pipe (`coffer logs | head`) ends the command quietly instead of
//! panicking the way `println!` does.
use std::io::Write;

use serde_json::Value;

use crate::error::CliError;

/// Writes `text` to stdout through [`printable_text`] and flushes: nothing a daemon answer,
/// an upstream or a file put in `text` can drive the terminal.
///
/// # Errors
/// [`CliError::StdoutClosed`] when the reader went away; [`CliError::Failed`] otherwise.
pub fn print(text: &str) -> Result<(), CliError> {
    print_raw(&printable_text(text))
}

/// Writes `text` to stdout unfiltered: only for text whose every untrusted part already went
/// through [`printable`] and which adds the CLI's own styling (`kb search`'s bold matches).
///
/// # Errors
/// As [`print`].
pub fn print_styled(text: &str) -> Result<(), CliError> {
    print_raw(text)
}

fn print_raw(text: &str) -> Result<(), CliError> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes()).and_then(|_| out.flush()).map_err(|e| match e.kind() {
        std::io::ErrorKind::BrokenPipe => CliError::StdoutClosed,
        _ => CliError::Failed(format!("cannot write to stdout: {e}")),
    })
}

/// Writes `line` and a newline to stdout.
pub fn println(line: &str) -> Result<(), CliError> {
    let mut s = String::with_capacity(line.len() + 1);
    s.push_str(line);
    s.push('\n');
    print(&s)
}

/// Prints a REST body unchanged (`--json`), ending it with a newline if it has none.
pub fn print_body(body: &str) -> Result<(), CliError> {
    if body.ends_with('\n') { print(body) } else { println(body) }
}

/// Prints a value the CLI made up itself (not a REST body) as one line of JSON.
pub fn print_json(v: &Value) -> Result<(), CliError> {
    println(&v.to_string())
}

/// Whether `c` may drive a terminal or reorder what is shown: a control character (C0, DEL,
/// C1: ESC starts cursor moves, colours, OSC 52 clipboard writes and window titles; CSI is
/// U+009B) or a bidirectional formatting character (U+061C, U+200E/F, the embeddings and
/// overrides U+202A–U+202E, the isolates U+2066–U+2069), which makes text read in another order
/// than it is stored ("Trojan Source", CVE-2021-42574).
pub fn is_unsafe_char(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// The one printable filter (every terminal print of the CLI goes through it, see [`print`]):
/// `text` with each [`is_unsafe_char`] — line breaks and tabs included — shown as its JSON
/// escape `\u001b`. The JSON form keeps a JSON document valid and equal (these characters can
/// only stand inside its strings), so `--json` output passes through the same filter.
pub fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    escape_unsafe(text, false)
}

/// Like [`printable`] but keeping line breaks (LF, and CRLF) and tabs: for text shown as lines
/// (a tool's result, a log, a message). A lone carriage return is escaped (it would let a line
/// overwrite itself).
pub fn printable_text(text: &str) -> std::borrow::Cow<'_, str> {
    escape_unsafe(text, true)
}

fn escape_unsafe(text: &str, keep_lines: bool) -> std::borrow::Cow<'_, str> {
    let bad = |c: char| is_unsafe_char(c) && !(keep_lines && (c == '\n' || c == '\t'));
    // A line break written CRLF (a file from Windows) stays one: only a lone CR overwrites.
    let crlf = |i: usize, c: char| keep_lines && c == '\r' && text[i + 1..].starts_with('\n');
    if !text.char_indices().any(|(i, c)| bad(c) && !crlf(i, c)) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for (i, c) in text.char_indices() {
        if bad(c) && !crlf(i, c) {
            // Every unsafe character is in the Basic Multilingual Plane: four digits suffice.
            out.push_str(&format!("\\u{:04x}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Writes `line` and a newline to stderr through [`printable_text`] (the way of `eprintln!`
/// for everything that may hold a daemon's, an upstream's or a file's text).
pub fn eprint_line(line: &str) {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{}", printable_text(line));
}

/// `eprintln!` through [`eprint_line`]: the CLI's stderr lines pass the printable filter too.
#[macro_export]
macro_rules! eprintln_printable {
    ($($arg:tt)*) => {
        $crate::output::eprint_line(&format!($($arg)*))
    };
}

/// Columns `s` takes on a terminal (`unicode-width`: a CJK character takes two, a combining
/// mark none).
pub fn display_width(s: &str) -> usize {
    unicode_width::UnicodeWidthStr::width(s)
}

/// Renders rows under `headers` as columns separated by two spaces, each as wide as its widest
/// cell (in terminal columns, [`display_width`], so CJK text lines up; control characters
/// shown escaped, see [`printable`]). The last column is not padded, so no line ends in
/// spaces.
pub fn render_table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let rows: Vec<Vec<String>> =
        rows.iter().map(|row| row.iter().map(|c| printable(c).into_owned()).collect()).collect();
    let rows = &rows;
    let cols = headers.len();
    let mut width: Vec<usize> = headers.iter().map(|h| display_width(h)).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate().take(cols) {
            width[i] = width[i].max(display_width(cell));
        }
    }
    let mut out = String::new();
    let header_cells: Vec<String> = headers.iter().map(|h| (*h).to_owned()).collect();
    for row in std::iter::once(&header_cells).chain(rows) {
        let mut line = String::new();
        for (i, w) in width.iter().enumerate() {
            let cell = row.get(i).map(String::as_str).unwrap_or("");
            line.push_str(cell);
            if i + 1 < cols {
                line.extend(std::iter::repeat_n(' ', w - display_width(cell) + 2));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// Like [`render_table`], but with the last column cut (ending in `…`) so that every line fits
/// in `max_width` chars, keeping at least [`MIN_LAST_COLUMN`] chars of it. `None` leaves the
/// table as wide as its cells.
pub fn render_table_fitted(headers: &[&str], rows: &[Vec<String>], max_width: Option<usize>) -> String {
    let (Some(max), Some(last)) = (max_width, headers.len().checked_sub(1)) else {
        return render_table(headers, rows);
    };
    let mut width: Vec<usize> = headers[..last].iter().map(|h| display_width(h)).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate().take(last) {
            width[i] = width[i].max(display_width(&printable(cell)));
        }
    }
    let used: usize = width.iter().map(|w| w + 2).sum();
    let room = max.saturating_sub(used).max(MIN_LAST_COLUMN);
    let fitted: Vec<Vec<String>> = rows
        .iter()
        .map(|row| {
            let mut r = row.clone();
            if let Some(c) = r.get_mut(last) {
                *c = truncate(&printable(c), room);
            }
            r
        })
        .collect();
    render_table(headers, &fitted)
}

/// The narrowest a fitted table's last column gets, however narrow the terminal.
pub const MIN_LAST_COLUMN: usize = 16;

/// The width to fit tables to: `$COLUMNS` when set to a number, else the width of the terminal
/// stdout is, else `None` (piped output is not cut).
pub fn terminal_width() -> Option<usize> {
    if let Some(n) = std::env::var("COLUMNS").ok().and_then(|c| c.trim().parse::<usize>().ok()).filter(|&n| n > 0) {
        return Some(n);
    }
    terminal_size::terminal_size_of(std::io::stdout()).map(|(w, _)| usize::from(w.0)).filter(|&w| w > 0)
}

/// A timeout in milliseconds as seconds without trailing zeros: `30s`, `1.5s`, `0.25s`.
pub fn format_ms_as_seconds(ms: u64) -> String {
    let whole = ms / 1000;
    let frac = ms % 1000;
    if frac == 0 {
        return format!("{whole}s");
    }
    let digits = format!("{frac:03}");
    format!("{whole}.{}s", digits.trim_end_matches('0'))
}

/// A timestamp from the daemon (`2026-11-30T09:57:00.211Z`) as `2026-11-30 09:57:00` (UTC,
/// whole seconds); anything that does not parse is shown as it is.
pub fn format_time(rfc3339: &str) -> String {
    match parse_rfc3339_ms(rfc3339) {
        Some(ms) => {
            coffer_runtime::rfc3339_from_unix_ms(ms).chars().take(19).map(|c| if c == 'T' { ' ' } else { c }).collect()
        }
        None => rfc3339.to_owned(),
    }
}

/// `yes` / `no`.
pub fn yes_no(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

/// One word as a POSIX shell would need it typed: unchanged when it holds only safe characters,
/// else in single quotes (a `'` inside becomes `'\''`).
pub fn shell_quote(word: &str) -> String {
    let safe = !word.is_empty()
        && word.bytes().all(|b| {
            b.is_ascii_alphanumeric()
                || matches!(b, b'-' | b'_' | b'.' | b'/' | b':' | b'=' | b'@' | b'+' | b',' | b'%')
        });
    if safe { word.to_owned() } else { format!("'{}'", word.replace('\'', "'\\''")) }
}

/// Words joined by spaces, each quoted by [`shell_quote`]: a command line that can be pasted.
pub fn shell_join<'a>(words: impl IntoIterator<Item = &'a str>) -> String {
    words.into_iter().map(shell_quote).collect::<Vec<_>>().join(" ")
}

/// `key: value` lines with the values aligned, for one resource shown in full (`mcp show`).
/// A multi-line value continues under its first line.
pub fn render_fields(fields: &[(&str, String)]) -> String {
    let width = fields.iter().map(|(k, _)| k.chars().count()).max().unwrap_or(0) + 1;
    let mut out = String::new();
    for (k, v) in fields {
        let mut lines = v.lines().map(printable);
        let first = lines.next().unwrap_or_default();
        out.push_str(format!("{:<width$} {first}", format!("{k}:")).trim_end());
        out.push('\n');
        for more in lines {
            out.push_str(format!("{:<width$} {more}", "").trim_end());
            out.push('\n');
        }
    }
    out
}

/// A duration in seconds as its two largest units: `45s`, `3m12s`, `2h05m`, `3d04h`.
pub fn format_duration(secs: u64) -> String {
    let (d, h, m, s) = (secs / 86_400, (secs % 86_400) / 3600, (secs % 3600) / 60, secs % 60);
    if d > 0 {
        format!("{d}d{h:02}h")
    } else if h > 0 {
        format!("{h}h{m:02}m")
    } else if m > 0 {
        format!("{m}m{s:02}s")
    } else {
        format!("{s}s")
    }
}

/// One table cell from a JSON value: strings as they are (on one line, at most `max` chars),
/// `null` and empty strings as `-`, anything else as compact JSON.
pub fn cell(v: Option<&Value>, max: usize) -> String {
    match v {
        None | Some(Value::Null) => "-".into(),
        Some(Value::String(s)) => text_cell(s, max),
        Some(other) => truncate(&other.to_string(), max),
    }
}

/// A text table cell as [`cell`] makes it of a JSON string: whitespace runs collapsed, cut to
/// `max` columns, `-` when blank.
pub fn text_cell(s: &str, max: usize) -> String {
    if s.trim().is_empty() {
        return "-".into();
    }
    truncate(&s.split_whitespace().collect::<Vec<_>>().join(" "), max)
}

/// `s` cut to at most `max` terminal columns ([`display_width`]), ending in `…` when cut.
pub fn truncate(s: &str, max: usize) -> String {
    if display_width(s) <= max {
        return s.to_owned();
    }
    let room = max.saturating_sub(1);
    let mut t = String::new();
    let mut used = 0;
    for c in s.chars() {
        let w = unicode_width::UnicodeWidthChar::width(c).unwrap_or(0);
        if used + w > room {
            break;
        }
        used += w;
        t.push(c);
    }
    t.push('…');
    t
}

/// Parses an RFC 3339 UTC timestamp as written by the daemon (`2026-11-30T09:31:36.123Z`;
/// fraction optional, `+00:00` accepted) into milliseconds since the Unix epoch.
pub fn parse_rfc3339_ms(s: &str) -> Option<i64> {
    let s = s.trim();
    let (date, time) = s.split_once(['T', 't', ' '])?;
    let mut d = date.splitn(3, '-').map(|p| p.parse::<i64>().ok());
    let (y, mo, da) = (d.next()??, d.next()??, d.next()??);
    let time = time.strip_suffix(['Z', 'z']).or_else(|| time.strip_suffix("+00:00"))?;
    let (hms, frac) = time.split_once('.').unwrap_or((time, ""));
    let mut t = hms.splitn(3, ':').map(|p| p.parse::<i64>().ok());
    let (h, mi, se) = (t.next()??, t.next()??, t.next()??);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&da) || h > 23 || mi > 59 || se > 60 {
        return None;
    }
    let millis = if frac.is_empty() {
        0
    } else {
        if !frac.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let three: String = frac.chars().chain(std::iter::repeat('0')).take(3).collect();
        three.parse::<i64>().ok()?
    };
    let days = coffer_runtime::days_from_civil(y, mo, da);
    Some(((days * 86_400 + h * 3600 + mi * 60 + se) * 1000) + millis)
}

/// Seconds elapsed since an RFC 3339 instant, `None` when it does not parse.
pub fn seconds_since(rfc3339: &str) -> Option<u64> {
    let then = parse_rfc3339_ms(rfc3339)?;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).ok()?.as_millis() as i64;
    Some(((now - then).max(0) / 1000) as u64)
}

/// Writes `prompt` on stderr and reads one line from stdin: the line without its end
/// (`\n` or `\r\n`); empty at end of input.
///
/// # Errors
/// [`crate::error::CliError::Failed`] when stdin cannot be read.
pub fn prompt_line(prompt: &str) -> Result<String, crate::error::CliError> {
    use std::io::{BufRead, Write};
    eprint!("{prompt}");
    let _ = std::io::stderr().flush();
    let mut line = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut line)
        .map_err(|e| crate::error::CliError::Failed(format!("cannot read from the terminal: {e}")))?;
    Ok(line.trim_end_matches(['\r', '\n']).to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn table_is_aligned_without_trailing_spaces() {
        let rows = vec![
            vec!["store".into(), "1240".into(), "healthy".into(), "-".into()],
            vec!["retrieval".into(), "7".into(), "failed".into(), "exit status 1".into()],
        ];
        let t = render_table(&["NAME", "PID", "STATE", "LAST ERROR"], &rows);
        assert_eq!(
            t,
            "NAME       PID   STATE    LAST ERROR\n\
             store      1240  healthy  -\n\
             retrieval  7     failed   exit status 1\n"
        );
        assert!(t.lines().all(|l| !l.ends_with(' ')));
    }

    #[test]
    fn table_with_no_rows_is_the_header_and_short_rows_are_padded() {
        assert_eq!(render_table(&["A", "B"], &[]), "A  B\n");
        // Terminal control sequences in cells are shown, not obeyed; columns stay aligned.
        let rows =
            vec![vec!["x\u{1b}[31mRED\u{7}".to_owned(), "t".to_owned()], vec!["plain".to_owned(), "u".to_owned()]];
        let t = render_table(&["NAME", "V"], &rows);
        assert!(!t.chars().any(|c| c.is_control() && c != '\n'), "{t:?}");
        assert_eq!(t, "NAME                  V\nx\\u001b[31mRED\\u0007  t\nplain                 u\n");
        assert_eq!(render_fields(&[("uri", "a\u{9b}b\nc".to_owned())]), "uri: a\\u009bb\n     c\n");
        assert_eq!(render_table(&["A", "B", "C"], &[vec!["xyz".into()]]), "A    B  C\nxyz\n");
    }

    /// Hostile strings from upstreams and titles: every escape, control and bidi character is
    /// shown as its JSON escape, on one line and in multi-line text, and a JSON document stays
    /// valid and equal.
    #[test]
    fn the_printable_filter_shows_escapes_controls_and_bidi_characters() {
        let cases = [
            // OSC 52: write "hi" to the clipboard, BEL-terminated; and ST-terminated.
            ("\u{1b}]52;c;aGk=\u{7}", "\\u001b]52;c;aGk=\\u0007"),
            ("\u{1b}]52;c;aGk=\u{1b}\\", "\\u001b]52;c;aGk=\\u001b\\"),
            // OSC 0: window title; CSI clear screen; 8-bit CSI (C1); DEL; CR overwriting a line.
            ("\u{1b}]0;pwned\u{7}", "\\u001b]0;pwned\\u0007"),
            ("\u{1b}[2J\u{1b}[H", "\\u001b[2J\\u001b[H"),
            ("a\u{9b}31mb\u{7f}", "a\\u009b31mb\\u007f"),
            ("ok\rFAILED", "ok\\u000dFAILED"),
            // Right-to-left override, isolates, embeddings and marks (Trojan Source).
            ("invoice\u{202e}fdp.exe", "invoice\\u202efdp.exe"),
            ("\u{2066}a\u{2067}b\u{2068}c\u{2069}", "\\u2066a\\u2067b\\u2068c\\u2069"),
            (
                "\u{202a}\u{202b}\u{202c}\u{202d}\u{200e}\u{200f}\u{61c}",
                "\\u202a\\u202b\\u202c\\u202d\\u200e\\u200f\\u061c",
            ),
            // Ordinary text, CJK, emoji and joiners are left alone.
            ("plain 笔记 👩‍💻 é", "plain 笔记 👩‍💻 é"),
        ];
        for (hostile, shown) in cases {
            assert_eq!(printable(hostile), shown, "{hostile:?}");
            assert_eq!(printable_text(hostile), shown, "{hostile:?}");
        }
        assert_eq!(printable("a\nb\tc"), "a\\u000ab\\u0009c");
        assert_eq!(printable_text("a\nb\tc\u{1b}"), "a\nb\tc\\u001b");
        assert_eq!(printable_text("crlf\r\nok\r"), "crlf\r\nok\\u000d");
        assert_eq!(printable("crlf\r\n"), "crlf\\u000d\\u000a");
        // Idempotent, and a JSON document keeps its value.
        let doc = serde_json::json!({"title": "x\u{202e}y\u{9b}z\u{1b}]0;t\u{7}", "n": 1}).to_string();
        let once = printable_text(&doc).into_owned();
        assert_eq!(printable_text(&once), once);
        assert!(!once.chars().any(is_unsafe_char), "{once}");
        assert_eq!(serde_json::from_str::<Value>(&once).unwrap(), serde_json::from_str::<Value>(&doc).unwrap());
    }

    #[test]
    fn table_counts_chars_not_bytes() {
        let t = render_table(&["N", "X"], &[vec!["é".into(), "1".into()], vec!["ab".into(), "2".into()]]);
        assert_eq!(t, "N   X\né   1\nab  2\n");
    }

    #[test]
    fn cjk_cells_line_up_by_display_width() {
        let rows = vec![vec!["笔记".to_owned(), "1".to_owned()], vec!["notes".to_owned(), "2".to_owned()]];
        let t = render_table(&["NAME", "N"], &rows);
        assert_eq!(t, "NAME   N\n笔记   1\nnotes  2\n");
        let col =
            |line: &str| display_width(&line[..line.rfind(|c: char| !c.is_ascii_digit() && c != 'N').unwrap() + 1]);
        assert!(t.lines().map(col).collect::<std::collections::HashSet<_>>().len() == 1, "{t}");
        // Cut by columns too: two columns a character.
        assert_eq!(truncate("数据库备份笔记", 7), "数据库…");
        assert_eq!(display_width(&truncate("数据库备份笔记", 7)), 7);
        let fitted = render_table_fitted(
            &["KB", "TEXT"],
            &[vec!["日记".into(), "周六去图书馆借一本关于机器学习的书".into()]],
            Some(24),
        );
        assert!(fitted.lines().all(|l| display_width(l) <= 24), "{fitted}");
    }

    #[test]
    fn fitted_tables_cut_only_the_last_column() {
        let rows = vec![
            vec!["everything__echo".into(), "Echoes back the input string, at length".into()],
            vec!["x".into(), "short".into()],
        ];
        let t = render_table_fitted(&["NAME", "DESCRIPTION"], &rows, Some(36));
        assert_eq!(t, "NAME              DESCRIPTION\neverything__echo  Echoes back the i…\nx                 short\n");
        assert!(t.lines().all(|l| l.chars().count() <= 36));
        // Never narrower than MIN_LAST_COLUMN, and no width means no cut.
        let narrow = render_table_fitted(&["NAME", "DESCRIPTION"], &rows, Some(5));
        assert!(narrow.contains(&format!("{}…", &"Echoes back the input string"[..MIN_LAST_COLUMN - 1])), "{narrow}");
        assert_eq!(
            render_table_fitted(&["NAME", "DESCRIPTION"], &rows, None),
            render_table(&["NAME", "DESCRIPTION"], &rows)
        );
    }

    #[test]
    fn timeouts_in_seconds() {
        assert_eq!(format_ms_as_seconds(30_000), "30s");
        assert_eq!(format_ms_as_seconds(1_500), "1.5s");
        assert_eq!(format_ms_as_seconds(250), "0.25s");
        assert_eq!(format_ms_as_seconds(1), "0.001s");
    }

    #[test]
    fn times_are_shown_to_the_second() {
        assert_eq!(format_time("2026-11-30T09:57:00.211Z"), "2026-11-30 09:57:00");
        assert_eq!(format_time("soon"), "soon");
    }

    #[test]
    fn shell_words_are_quoted_only_when_needed() {
        assert_eq!(shell_quote("/usr/bin/node"), "/usr/bin/node");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_join(["npx", "-y", "@scope/pkg", "$HOME"]), "npx -y @scope/pkg '$HOME'");
    }

    #[test]
    fn fields_are_aligned() {
        let f = [("name", "everything".to_owned()), ("env", "A=1\nB=2".to_owned()), ("cwd", String::new())];
        assert_eq!(render_fields(&f), "name: everything\nenv:  A=1\n      B=2\ncwd:\n");
    }

    #[test]
    fn durations_show_two_units() {
        assert_eq!(format_duration(0), "0s");
        assert_eq!(format_duration(45), "45s");
        assert_eq!(format_duration(192), "3m12s");
        assert_eq!(format_duration(7500), "2h05m");
        assert_eq!(format_duration(3 * 86_400 + 4 * 3600 + 59), "3d04h");
    }

    #[test]
    fn cells_flatten_and_truncate() {
        assert_eq!(cell(None, 10), "-");
        assert_eq!(cell(Some(&Value::Null), 10), "-");
        assert_eq!(cell(Some(&json!("")), 10), "-");
        assert_eq!(cell(Some(&json!("a\n  b")), 10), "a b");
        assert_eq!(cell(Some(&json!(3)), 10), "3");
        assert_eq!(cell(Some(&json!("abcdefghijkl")), 5), "abcd…");
    }

    #[test]
    fn rfc3339_round_trips_with_the_runtime_formatter() {
        for ms in [0_i64, 951_782_400_000, 1_796_031_096_123, 4_102_444_799_999] {
            let s = coffer_runtime::rfc3339_from_unix_ms(ms);
            assert_eq!(parse_rfc3339_ms(&s), Some(ms), "{s}");
        }
        assert_eq!(parse_rfc3339_ms("2026-11-30T09:31:36Z"), Some(1_796_031_096_000));
        assert_eq!(parse_rfc3339_ms("2026-11-30T09:31:36.123456Z"), Some(1_796_031_096_123));
        assert_eq!(parse_rfc3339_ms("2026-11-30T09:31:36+00:00"), Some(1_796_031_096_000));
        for bad in ["", "yesterday", "2026-13-01T00:00:00Z", "2026-11-30T09:31:36", "2026-11-30T09:31:36.x1Z"] {
            assert_eq!(parse_rfc3339_ms(bad), None, "{bad}");
        }
    }
}
