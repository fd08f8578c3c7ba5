//! `coffer logs [SERVICE] [-f] [-n N]`: prints the local log files under `COFFER_HOME/logs/`.
//! Reads files only; never starts (or even contacts) a daemon.
//!
//! Each process logs through `tracing-appender` with daily rotation, so a service's files are
//! `<service>.<YYYY-MM-DD>.log`; the newest is the one being written. Without SERVICE the last
//! lines of every service are interleaved by the RFC 3339 timestamp `tracing` puts at the start
//! of each line, each prefixed with its service name (`-n` counts lines in total). `-f` polls
//! the files for growth and moves on to the next day's file when the appender rotates. With
//! `--json` every line is one JSON object, `{"service","line"}` (`{"server","line"}` for
//! `coffer mcp logs`), also while following.
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use clap::Args;
use clap::builder::PossibleValuesParser;

use crate::context::Ctx;
use crate::error::CliError;
use crate::output;

/// Every service that writes a log file, in start order.
pub const SERVICES: &[&str] = &["daemon", "gateway", "store", "chat", "retrieval", "callback"];
/// How often `-f` looks for new lines. Polling (not inotify) keeps this portable and
/// dependency-free; a quarter second is below what a reader notices.
const FOLLOW_POLL: Duration = Duration::from_millis(250);
/// Width of the service-name prefix (the longest name, `retrieval`).
const PREFIX_WIDTH: usize = 9;
/// Chunk size of the backwards read that finds the last lines of a file.
const TAIL_CHUNK: u64 = 64 * 1024;

pub const EXAMPLES: &str = "\
Examples:
  coffer logs store -n 100
  coffer logs -f
  coffer logs gateway --json | jq -r .line

Without SERVICE, the services' lines are interleaved by time, each prefixed with its service.
With --json, each line is one {\"service\",\"line\"} object (also with -f).";

#[derive(Debug, Args)]
pub struct LogsArgs {
    /// One service's log; all services interleaved when omitted.
    #[arg(value_parser = PossibleValuesParser::new(SERVICES))]
    pub service: Option<String>,
    /// Keep printing lines as they are written (Ctrl-C to stop).
    #[arg(short, long)]
    pub follow: bool,
    /// How many of the last lines to print first (in total when interleaving services).
    #[arg(short = 'n', long = "lines", value_name = "N", default_value_t = 50)]
    pub lines: usize,
}

/// Prints the last `-n` lines, then follows with `-f`.
///
/// # Errors
/// [`CliError::Failed`] when the logs folder is missing (and not following) or a file cannot be
/// read. A service without a log file yet is noted on stderr, not an error.
pub async fn run(ctx: &Ctx, args: LogsArgs) -> Result<(), CliError> {
    let dir = ctx.home.logs();
    let services: Vec<&'static str> = match &args.service {
        Some(s) => SERVICES.iter().copied().filter(|x| x == s).collect(),
        None => SERVICES.to_vec(),
    };
    let (tail, initial) = Tail::start(&dir, &services, args.lines, args.follow)?;

    // A missing logs folder means a wrong home (or a daemon never started there); a missing
    // file only means that service has not run yet (callback runs only with SeaTalk enabled).
    if !dir.is_dir() && !args.follow {
        return Err(CliError::Config(format!(
            "no logs folder at {}; is COFFER_HOME (or --home) right?",
            dir.display()
        )));
    }
    if !tail.has_files() {
        let what = match &args.service {
            Some(s) => format!("no log file for {s} in {} yet", dir.display()),
            None => format!("no log files in {} yet", dir.display()),
        };
        crate::eprintln_printable!("{what}{}", if args.follow { "; waiting…" } else { "" });
    }
    let style = if ctx.json {
        Style::Json("service")
    } else if args.service.is_none() {
        Style::Prefixed
    } else {
        Style::Plain
    };
    output::print(&render(&initial, style))?;
    if args.follow { tail.follow(style).await } else { Ok(()) }
}

/// How log lines are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// The line as written (one file).
    Plain,
    /// `service   | line` (several files interleaved).
    Prefixed,
    /// `--json`: one object per line, `{KEY: name, "line": line}` (KEY `service` or `server`).
    Json(&'static str),
}

/// The newest log files of some names in one folder (`<name>.log` or `<name>.<date>.log`):
/// their last lines, then, if asked, what is appended to them. Shared by `coffer logs` and
/// `coffer mcp logs` (upstream stderr under `logs/upstreams/`).
pub struct Tail<'a> {
    dir: PathBuf,
    followers: Vec<Follower<'a>>,
}

impl<'a> Tail<'a> {
    /// Reads the last `lines` lines (in total, interleaved by timestamp) of the newest file of
    /// each of `names` in `dir`. With `follow` a final line still being written is left for
    /// [`Tail::follow`]. A name without a file yet gives no lines.
    ///
    /// # Errors
    /// [`CliError::Failed`] when a file exists but cannot be read.
    pub fn start(
        dir: &Path,
        names: &[&'a str],
        lines: usize,
        follow: bool,
    ) -> Result<(Self, Vec<LogLine<'a>>), CliError> {
        let mut streams = Vec::new();
        let mut followers = Vec::new();
        for &name in names {
            let path = newest_log(dir, name);
            let (text, offset) = match &path {
                Some(p) => read_tail(p, lines, !follow).map_err(|e| read_error(p, &e))?,
                None => (Vec::new(), 0),
            };
            let mut last_key = String::new();
            streams.push(keyed(name, text, &mut last_key));
            followers.push(Follower {
                service: name,
                dir: dir.to_owned(),
                path,
                offset,
                partial: Vec::new(),
                last_key,
            });
        }
        let mut merged = merge(streams);
        let skip = merged.len().saturating_sub(lines);
        merged.drain(..skip);
        Ok((Self { dir: dir.to_owned(), followers }, merged))
    }

    /// True when at least one of the names had a file when [`Tail::start`] looked.
    pub fn has_files(&self) -> bool {
        self.followers.iter().any(|f| f.path.is_some())
    }

    /// Prints new lines as they are written until stdout closes (Ctrl-C otherwise).
    ///
    /// # Errors
    /// When a file cannot be read or stdout cannot be written.
    pub async fn follow(mut self, style: Style) -> Result<(), CliError> {
        loop {
            tokio::time::sleep(FOLLOW_POLL).await;
            let mut batch = Vec::new();
            for f in &mut self.followers {
                batch.push(f.poll().map_err(|e| read_error(f.path.as_deref().unwrap_or(&self.dir), &e))?);
            }
            let merged = merge(batch);
            if !merged.is_empty() {
                output::print(&render(&merged, style))?;
            }
        }
    }
}

fn read_error(path: &Path, e: &std::io::Error) -> CliError {
    CliError::Failed(format!("cannot read {}: {e}", path.display()))
}

/// The date part of a log file name of `service`: `Some("2026-11-30")` for
/// `daemon.2026-11-30.log`, `Some("")` for an unrotated `daemon.log`, `None` for anything else
/// (`daemon.stdio`, another service's file).
pub fn rotation_key<'a>(file_name: &'a str, service: &str) -> Option<&'a str> {
    let rest = file_name.strip_prefix(service)?.strip_prefix('.')?;
    if rest == "log" {
        return Some("");
    }
    let date = rest.strip_suffix(".log")?;
    let valid = !date.is_empty()
        && date.starts_with(|c: char| c.is_ascii_digit())
        && date.bytes().all(|b| b.is_ascii_digit() || b == b'-');
    valid.then_some(date)
}

/// Among `(file name, modified time)` pairs, the newest log of `service`: the latest date in the
/// name (dates sort as text), the modification time breaking ties.
pub fn pick_newest<'a>(files: impl IntoIterator<Item = (&'a str, SystemTime)>, service: &str) -> Option<&'a str> {
    files
        .into_iter()
        .filter_map(|(name, mtime)| rotation_key(name, service).map(|k| (k, mtime, name)))
        .max_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)))
        .map(|(_, _, name)| name)
}

/// The newest log file of `service` in `dir`, `None` when it has none (or `dir` is missing).
pub fn newest_log(dir: &Path, service: &str) -> Option<PathBuf> {
    let entries: Vec<(String, SystemTime)> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter_map(|e| Some((e.file_name().into_string().ok()?, e.metadata().ok()?.modified().ok()?)))
        .collect();
    pick_newest(entries.iter().map(|(n, t)| (n.as_str(), *t)), service).map(|n| dir.join(n))
}

/// The last `n` lines of the file at `path` and the offset to follow it from. A final line
/// without its newline (still being written) is returned when `include_partial`, else left for
/// the follower (the offset then points at its start). Reads backwards in chunks, so large
/// files cost only what is printed.
///
/// # Errors
/// When the file cannot be opened or read.
pub fn read_tail(path: &Path, n: usize, include_partial: bool) -> std::io::Result<(Vec<String>, u64)> {
    let mut file = File::open(path)?;
    let len = file.metadata()?.len();
    let mut start = len;
    let mut buf: Vec<u8> = Vec::new();
    let mut newlines = 0usize;
    // n + 2 newlines guarantee n whole lines after the (possibly cut) first piece.
    while start > 0 && newlines < n.saturating_add(2) {
        let chunk = TAIL_CHUNK.min(start);
        start -= chunk;
        let mut part = vec![0; chunk as usize];
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(&mut part)?;
        newlines += part.iter().filter(|&&b| b == b'\n').count();
        part.extend_from_slice(&buf);
        buf = part;
    }
    let complete = buf.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    let resume = start + complete as u64;
    let mut lines: Vec<String> = split_lines(&buf[..complete]);
    // The first piece may be the cut-off end of an earlier line.
    if start > 0 && !lines.is_empty() {
        lines.remove(0);
    }
    if include_partial && complete < buf.len() {
        lines.push(String::from_utf8_lossy(&buf[complete..]).into_owned());
    }
    let skip = lines.len().saturating_sub(n);
    lines.drain(..skip);
    Ok((lines, if include_partial { len } else { resume }))
}

/// Splits bytes that end in a newline into lines (without `\n` or `\r`), lossily decoded.
fn split_lines(bytes: &[u8]) -> Vec<String> {
    bytes
        .split(|&b| b == b'\n')
        .collect::<Vec<_>>()
        .split_last()
        .map(|(_, body)| {
            body.iter().map(|l| String::from_utf8_lossy(l.strip_suffix(b"\r").unwrap_or(l)).into_owned()).collect()
        })
        .unwrap_or_default()
}

/// One log line with its service and sort key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine<'a> {
    pub service: &'a str,
    /// The line's leading timestamp, or the last one seen before it in the same file (a
    /// continuation line of a multi-line event sorts with its event).
    pub key: String,
    pub text: String,
}

/// The leading RFC 3339 timestamp `tracing` writes (`2026-11-30T09:31:36.123456Z  INFO …`).
pub fn leading_timestamp(line: &str) -> Option<&str> {
    let token = line.split_ascii_whitespace().next()?;
    let b = token.as_bytes();
    let looks = b.len() >= 20
        && b[..4].iter().all(u8::is_ascii_digit)
        && b[4] == b'-'
        && b[7] == b'-'
        && b[10] == b'T'
        && b[13] == b':';
    looks.then_some(token)
}

/// Attaches sort keys to consecutive lines of one file; `last_key` carries the key across calls
/// (between polls while following).
pub fn keyed<'a>(service: &'a str, lines: Vec<String>, last_key: &mut String) -> Vec<LogLine<'a>> {
    lines
        .into_iter()
        .map(|text| {
            if let Some(ts) = leading_timestamp(&text) {
                ts.clone_into(last_key);
            }
            LogLine { service, key: last_key.clone(), text }
        })
        .collect()
}

/// Interleaves several files' lines by key. Each file's own order is kept even where its
/// timestamps are not monotonic; on equal keys the stream taken from last goes on, so a
/// multi-line event stays together.
pub fn merge<'a>(streams: Vec<Vec<LogLine<'a>>>) -> Vec<LogLine<'a>> {
    let total = streams.iter().map(Vec::len).sum();
    let mut pos = vec![0usize; streams.len()];
    let mut order: Vec<(usize, usize)> = Vec::with_capacity(total);
    let mut last: Option<usize> = None;
    loop {
        let mut best: Option<usize> = None;
        for (i, s) in streams.iter().enumerate() {
            let Some(head) = s.get(pos[i]) else { continue };
            best = match best {
                Some(b) => {
                    let bk = &streams[b][pos[b]].key;
                    if head.key < *bk || (head.key == *bk && last == Some(i)) { Some(i) } else { Some(b) }
                }
                None => Some(i),
            };
        }
        let Some(b) = best else { break };
        order.push((b, pos[b]));
        pos[b] += 1;
        last = Some(b);
    }
    let mut streams: Vec<Vec<Option<LogLine<'a>>>> =
        streams.into_iter().map(|s| s.into_iter().map(Some).collect()).collect();
    order.into_iter().filter_map(|(s, i)| streams[s][i].take()).collect()
}

/// Lines as printed in `style`, each ending in a newline.
pub fn render(lines: &[LogLine<'_>], style: Style) -> String {
    let mut out = String::new();
    for l in lines {
        match style {
            Style::Plain => out.push_str(&l.text),
            Style::Prefixed => {
                out.push_str(&format!("{:<PREFIX_WIDTH$} | ", l.service));
                out.push_str(&l.text);
            }
            Style::Json(key) => out.push_str(&serde_json::json!({key: l.service, "line": l.text}).to_string()),
        }
        out.push('\n');
    }
    out
}

/// Follows one service's newest log file across growth, truncation and daily rotation.
struct Follower<'a> {
    service: &'a str,
    dir: PathBuf,
    path: Option<PathBuf>,
    /// Bytes of `path` already consumed.
    offset: u64,
    /// An incomplete last line, held until its newline arrives.
    partial: Vec<u8>,
    last_key: String,
}

impl<'a> Follower<'a> {
    /// New complete lines since the last poll.
    fn poll(&mut self) -> std::io::Result<Vec<LogLine<'a>>> {
        let mut lines = Vec::new();
        let newest = newest_log(&self.dir, self.service);
        if newest.is_some() && newest != self.path {
            // Rotated (or the first file appeared): finish the old file — the appender may have
            // written to it until the moment it opened the new one — then start the new one.
            if self.path.is_some() {
                lines.extend(self.read_new()?);
                if !self.partial.is_empty() {
                    lines.push(String::from_utf8_lossy(&std::mem::take(&mut self.partial)).into_owned());
                }
            }
            self.path = newest;
            self.offset = 0;
        }
        lines.extend(self.read_new()?);
        Ok(keyed(self.service, lines, &mut self.last_key))
    }

    fn read_new(&mut self) -> std::io::Result<Vec<String>> {
        let Some(path) = &self.path else {
            return Ok(Vec::new());
        };
        let mut file = match File::open(path) {
            Ok(f) => f,
            // Pruned by the appender's retention between polls: nothing more to read.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let len = file.metadata()?.len();
        if len < self.offset {
            // Truncated: start over.
            self.offset = 0;
            self.partial.clear();
        }
        if len == self.offset {
            return Ok(Vec::new());
        }
        file.seek(SeekFrom::Start(self.offset))?;
        let mut fresh = Vec::new();
        file.take(len - self.offset).read_to_end(&mut fresh)?;
        self.offset += fresh.len() as u64;
        self.partial.extend_from_slice(&fresh);
        let Some(end) = self.partial.iter().rposition(|&b| b == b'\n') else {
            return Ok(Vec::new());
        };
        let rest = self.partial.split_off(end + 1);
        let complete = std::mem::replace(&mut self.partial, rest);
        Ok(split_lines(&complete))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn t(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn rotation_keys() {
        assert_eq!(rotation_key("gateway.2026-11-30.log", "gateway"), Some("2026-11-30"));
        assert_eq!(rotation_key("gateway.2026-11-30-09.log", "gateway"), Some("2026-11-30-09"));
        assert_eq!(rotation_key("gateway.log", "gateway"), Some(""));
        for other in [
            "daemon.stdio",
            "gateway.2026-11-30.log.gz",
            "gatewayx.2026-11-30.log",
            "gateway.old.log",
            "gateway..log",
            "store.log",
        ] {
            assert_eq!(rotation_key(other, "gateway"), None, "{other}");
        }
    }

    #[test]
    fn newest_is_latest_date_then_mtime() {
        let files = [
            ("chat.2026-11-29.log", t(500)),
            ("chat.2026-11-30.log", t(100)),
            ("chat.2026-11-28.log", t(900)),
            ("daemon.2026-12-01.log", t(900)),
            ("chat.stdio", t(999)),
        ];
        assert_eq!(pick_newest(files, "chat"), Some("chat.2026-11-30.log"));
        assert_eq!(pick_newest(files, "daemon"), Some("daemon.2026-12-01.log"));
        assert_eq!(pick_newest(files, "store"), None);
        let tie = [("chat.log", t(1)), ("chat.log", t(2))];
        assert_eq!(pick_newest(tie, "chat"), Some("chat.log"));
        assert_eq!(
            pick_newest([("chat.log", t(9)), ("chat.2026-01-01.log", t(1))], "chat"),
            Some("chat.2026-01-01.log")
        );
    }

    #[test]
    fn newest_log_reads_the_folder() {
        let dir = tempfile::tempdir().unwrap();
        for n in ["gateway.2026-11-29.log", "gateway.2026-11-30.log", "daemon.stdio"] {
            std::fs::write(dir.path().join(n), "x\n").unwrap();
        }
        std::fs::create_dir(dir.path().join("upstreams")).unwrap();
        assert_eq!(newest_log(dir.path(), "gateway").unwrap(), dir.path().join("gateway.2026-11-30.log"));
        assert_eq!(newest_log(dir.path(), "daemon"), None);
        assert_eq!(newest_log(&dir.path().join("missing"), "daemon"), None);
    }

    #[test]
    fn tail_takes_last_lines_and_handles_partial() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.log");
        std::fs::write(&p, "one\ntwo\nthree\nfour").unwrap();
        let (lines, off) = read_tail(&p, 2, false).unwrap();
        assert_eq!(lines, ["two", "three"]);
        assert_eq!(off, "one\ntwo\nthree\n".len() as u64);
        let (lines, off) = read_tail(&p, 2, true).unwrap();
        assert_eq!(lines, ["three", "four"]);
        assert_eq!(off, 18);
        assert_eq!(read_tail(&p, 0, true).unwrap().0, Vec::<String>::new());
        assert_eq!(read_tail(&p, 100, false).unwrap().0, ["one", "two", "three"]);
        std::fs::write(&p, "").unwrap();
        assert_eq!(read_tail(&p, 5, true).unwrap(), (vec![], 0));
    }

    #[test]
    fn tail_across_chunks() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("big.log");
        let body: String = (0..50_000).map(|i| format!("line {i:06} {}\n", "x".repeat(i % 7))).collect();
        std::fs::write(&p, &body).unwrap();
        let (lines, off) = read_tail(&p, 20_000, false).unwrap();
        assert_eq!(lines.len(), 20_000);
        assert!(lines[0].starts_with("line 030000"), "{}", lines[0]);
        assert!(lines[19_999].starts_with("line 049999"));
        assert_eq!(off, body.len() as u64);
    }

    #[test]
    fn continuation_lines_inherit_the_key() {
        let mut last = String::new();
        let lines = vec![
            "  at start of file".to_owned(),
            "2026-11-30T09:00:00.000001Z  INFO a".to_owned(),
            "   continuation".to_owned(),
        ];
        let k = keyed("store", lines, &mut last);
        assert_eq!(k[0].key, "");
        assert_eq!(k[1].key, "2026-11-30T09:00:00.000001Z");
        assert_eq!(k[2].key, "2026-11-30T09:00:00.000001Z");
        assert_eq!(last, "2026-11-30T09:00:00.000001Z");
        assert_eq!(leading_timestamp("2026-11-30 nope"), None);
    }

    #[test]
    fn merge_interleaves_by_timestamp_and_keeps_file_order() {
        let mk = |svc: &'static str, ts: &[&str]| {
            let mut last = String::new();
            keyed(
                svc,
                ts.iter()
                    .map(|t| if t.is_empty() { "  more".to_owned() } else { format!("{t}  INFO {svc}") })
                    .collect(),
                &mut last,
            )
        };
        let a = mk("daemon", &["2026-11-30T09:00:01.000000Z", "2026-11-30T09:00:03.000000Z", ""]);
        let b = mk(
            "gateway",
            &["2026-11-30T09:00:02.000000Z", "2026-11-30T09:00:03.000000Z", "2026-11-30T09:00:04.000000Z"],
        );
        // Out of order inside one file (non-blocking writer): file order wins.
        let c = mk("store", &["2026-11-30T09:00:05.000000Z", "2026-11-30T09:00:00.500000Z"]);
        let m = merge(vec![a, b, c]);
        let order: Vec<(&str, &str)> = m.iter().map(|l| (l.service, &l.key[17..19])).collect();
        assert_eq!(
            order,
            [
                ("daemon", "01"),
                ("gateway", "02"),
                ("gateway", "03"),
                ("daemon", "03"),
                ("daemon", "03"),
                ("gateway", "04"),
                ("store", "05"),
                ("store", "00")
            ]
        );
        assert_eq!(m[4].text, "  more", "a continuation stays with its event");
    }

    #[test]
    fn render_prefixes_only_when_interleaving() {
        let l = vec![LogLine { service: "chat", key: String::new(), text: "hello".into() }];
        assert_eq!(render(&l, Style::Plain), "hello\n");
        assert_eq!(render(&l, Style::Prefixed), "chat      | hello\n");
    }

    #[test]
    fn json_lines_are_one_object_each() {
        let l = vec![
            LogLine { service: "store", key: String::new(), text: "a \"quoted\" line\twith tab".into() },
            LogLine { service: "gateway", key: String::new(), text: String::new() },
        ];
        let out = render(&l, Style::Json("service"));
        let lines: Vec<serde_json::Value> = out.lines().map(|x| serde_json::from_str(x).unwrap()).collect();
        assert_eq!(lines[0], serde_json::json!({"service": "store", "line": "a \"quoted\" line\twith tab"}));
        assert_eq!(lines[1], serde_json::json!({"service": "gateway", "line": ""}));
        assert_eq!(out.lines().next().unwrap(), r#"{"service":"store","line":"a \"quoted\" line\twith tab"}"#);
        let srv = render(&l[..1], Style::Json("server"));
        assert!(srv.starts_with(r#"{"server":"store","line":"#), "{srv}");
    }

    #[test]
    fn follower_sees_growth_partial_lines_truncation_and_rotation() {
        let dir = tempfile::tempdir().unwrap();
        let day1 = dir.path().join("gateway.2026-11-30.log");
        std::fs::write(&day1, "old\n").unwrap();
        let (_, offset) = read_tail(&day1, 10, false).unwrap();
        let mut f = Follower {
            service: "gateway",
            dir: dir.path().into(),
            path: Some(day1.clone()),
            offset,
            partial: Vec::new(),
            last_key: String::new(),
        };
        let texts = |v: Vec<LogLine>| v.into_iter().map(|l| l.text).collect::<Vec<_>>();
        assert!(f.poll().unwrap().is_empty());

        let mut w = std::fs::OpenOptions::new().append(true).open(&day1).unwrap();
        w.write_all(b"a\nb").unwrap();
        assert_eq!(texts(f.poll().unwrap()), ["a"]);
        w.write_all(b"c\n").unwrap();
        assert_eq!(texts(f.poll().unwrap()), ["bc"]);

        // The appender wrote a last line to the old file, then rotated.
        w.write_all(b"last of day 1\n").unwrap();
        std::fs::write(dir.path().join("gateway.2026-12-01.log"), "first of day 2\n").unwrap();
        assert_eq!(texts(f.poll().unwrap()), ["last of day 1", "first of day 2"]);

        // Truncated in place: read from the start again.
        std::fs::write(dir.path().join("gateway.2026-12-01.log"), "new\n").unwrap();
        assert_eq!(texts(f.poll().unwrap()), ["new"]);
    }

    #[test]
    fn follower_waits_for_a_file_to_appear() {
        let dir = tempfile::tempdir().unwrap();
        let mut f = Follower {
            service: "chat",
            dir: dir.path().into(),
            path: None,
            offset: 0,
            partial: Vec::new(),
            last_key: String::new(),
        };
        assert!(f.poll().unwrap().is_empty());
        std::fs::write(dir.path().join("chat.2026-11-30.log"), "2026-11-30T09:00:00.000000Z  INFO hi\n").unwrap();
        let l = f.poll().unwrap();
        assert_eq!(l.len(), 1);
        assert_eq!(l[0].key, "2026-11-30T09:00:00.000000Z");
    }
}
