//! The log files' writer: one file per day and service, rolled to a new file also when it
//! reaches a size, with a total cap over the whole `logs/` folder, so no amount of logging can
//! fill the disk. `tracing-appender` rolls only by time; `rolling-file` (1.1) rolls by size but
//! renames files (`x.log.1`, …, which `coffer logs` would no longer find by date), caps their
//! count rather than their bytes, and knows nothing of the other services' files in the folder.
//!
//! Names: `<service>.<YYYY-MM-DD>.log` for a day's first file, then `<service>.<YYYY-MM-DD>-001.log`,
//! `-002`, … (UTC dates; names sort in write order, the form `coffer logs` already reads).
//! After every roll (and at start), files of any service in the folder are deleted, oldest
//! first, while the folder's files total more than [`RollingLimits::max_total_bytes`] or are
//! older than [`RollingLimits::keep_days`]; the newest file of each service is never deleted
//! (another process may be writing it).
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

/// Default largest log file (MiB) before it is rolled.
pub const DEFAULT_MAX_FILE_MB: u64 = 10;
/// Default cap of the whole `logs/` folder's service logs (MiB).
pub const DEFAULT_MAX_TOTAL_MB: u64 = 100;
/// Days of logs kept at most.
pub const KEEP_DAYS: i64 = 7;

/// The sizes a [`RollingWriter`] keeps to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RollingLimits {
    /// A file reaching this many bytes is rolled (a single line larger than it still goes into
    /// one file).
    pub max_file_bytes: u64,
    /// Total of every service's log files in the folder, bytes.
    pub max_total_bytes: u64,
    /// Files of days older than this many days are deleted.
    pub keep_days: i64,
}

impl Default for RollingLimits {
    fn default() -> Self {
        Self {
            max_file_bytes: DEFAULT_MAX_FILE_MB << 20,
            max_total_bytes: DEFAULT_MAX_TOTAL_MB << 20,
            keep_days: KEEP_DAYS,
        }
    }
}

impl RollingLimits {
    /// The defaults, with `COFFER_LOG_MAX_FILE_MB` (1-1024) and `COFFER_LOG_MAX_TOTAL_MB`
    /// (1-102400) from `get` when set to a number in range (others are ignored: logging is not
    /// up yet to say so). The total is raised to at least twice the file size.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Self {
        let mut l = Self::default();
        let num =
            |var: &str, max: u64| get(var).and_then(|v| v.trim().parse::<u64>().ok()).filter(|n| (1..=max).contains(n));
        if let Some(mb) = num(crate::env::LOG_MAX_FILE_MB, 1024) {
            l.max_file_bytes = mb << 20;
        }
        if let Some(mb) = num(crate::env::LOG_MAX_TOTAL_MB, 102_400) {
            l.max_total_bytes = mb << 20;
        }
        l.max_total_bytes = l.max_total_bytes.max(2 * l.max_file_bytes);
        l
    }
}

/// The clock a writer reads dates from (replaceable in tests).
pub type Clock = Arc<dyn Fn() -> SystemTime + Send + Sync>;

/// Writes one service's log lines under a folder, rolling by day and size (see the module docs).
pub struct RollingWriter {
    dir: PathBuf,
    prefix: String,
    limits: RollingLimits,
    clock: Clock,
    file: Option<File>,
    /// Days since the epoch of the open file.
    day: i64,
    /// Its roll number that day (0: the day's first file).
    index: u32,
    size: u64,
}

fn day_of(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64).div_euclid(86_400)
}

fn date_of(day: i64) -> String {
    crate::rfc3339_from_unix_ms(day * 86_400_000)[..10].to_owned()
}

/// The file name of `prefix`'s `index`th file of `day`.
fn file_name(prefix: &str, day: i64, index: u32) -> String {
    match index {
        0 => format!("{prefix}.{}.log", date_of(day)),
        n => format!("{prefix}.{}-{n:03}.log", date_of(day)),
    }
}

/// A log file name's parts: (service, day, roll number), for names this writer makes.
fn parse_name(name: &str) -> Option<(&str, i64, u32)> {
    let stem = name.strip_suffix(".log")?;
    let (prefix, key) = stem.split_once('.')?;
    let (date, index) = match key.len() {
        10 => (key, 0),
        14 if key.as_bytes()[10] == b'-' => (&key[..10], key[11..].parse().ok()?),
        _ => return None,
    };
    let b = date.as_bytes();
    if b[4] != b'-' || b[7] != b'-' {
        return None;
    }
    let (y, m, d) = (date[..4].parse().ok()?, date[5..7].parse().ok()?, date[8..].parse().ok()?);
    Some((prefix, crate::days_from_civil(y, m, d), index))
}

impl RollingWriter {
    /// A writer for `prefix`'s files in `dir` (created if missing), continuing today's newest
    /// file when it has room.
    ///
    /// # Errors
    /// When the folder or the file cannot be created or opened.
    pub fn new(dir: &Path, prefix: &str, limits: RollingLimits) -> io::Result<Self> {
        Self::with_clock(dir, prefix, limits, Arc::new(SystemTime::now))
    }

    /// [`RollingWriter::new`] reading dates from `clock`.
    ///
    /// # Errors
    /// As [`RollingWriter::new`].
    pub fn with_clock(dir: &Path, prefix: &str, limits: RollingLimits, clock: Clock) -> io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let day = day_of(clock());
        let index = std::fs::read_dir(dir)?
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let (p, d, i) = parse_name(&name)?;
                (p == prefix && d == day).then_some(i)
            })
            .max()
            .unwrap_or(0);
        let mut w =
            Self { dir: dir.to_owned(), prefix: prefix.to_owned(), limits, clock, file: None, day, index, size: 0 };
        w.open()?;
        if w.size >= limits.max_file_bytes {
            w.index += 1;
            w.open()?;
        }
        w.prune();
        Ok(w)
    }

    /// The path of the file being written.
    pub fn current_path(&self) -> PathBuf {
        self.dir.join(file_name(&self.prefix, self.day, self.index))
    }

    fn open(&mut self) -> io::Result<()> {
        let path = self.current_path();
        let file = OpenOptions::new().create(true).append(true).open(&path)?;
        self.size = file.metadata()?.len();
        self.file = Some(file);
        Ok(())
    }

    /// Deletes files (any service's, never one's newest) beyond the total cap or the kept days,
    /// oldest first.
    fn prune(&self) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return };
        // (service, day, index, size, name)
        let mut files: Vec<(String, i64, u32, u64, PathBuf)> = entries
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let (p, d, i) = parse_name(&name)?;
                Some((p.to_owned(), d, i, e.metadata().ok()?.len(), e.path()))
            })
            .collect();
        files.sort_by(|a, b| (a.1, a.2, &a.0).cmp(&(b.1, b.2, &b.0)));
        let mut newest: std::collections::HashMap<&str, (i64, u32)> = std::collections::HashMap::new();
        for f in &files {
            newest.insert(f.0.as_str(), (f.1, f.2));
        }
        let protected = |f: &(String, i64, u32, u64, PathBuf)| {
            newest.get(f.0.as_str()) == Some(&(f.1, f.2)) || f.4 == self.current_path()
        };
        let mut total: u64 = files.iter().map(|f| f.3).sum();
        let oldest_kept = self.day - self.limits.keep_days + 1;
        for f in files.iter().filter(|f| !protected(f)) {
            if total <= self.limits.max_total_bytes && f.1 >= oldest_kept {
                continue;
            }
            if std::fs::remove_file(&f.4).is_ok() {
                total -= f.3;
            }
        }
    }

    fn roll_if_needed(&mut self, incoming: usize) -> io::Result<()> {
        let day = day_of((self.clock)());
        if day != self.day {
            self.day = day;
            self.index = 0;
        } else if self.size > 0 && self.size + incoming as u64 > self.limits.max_file_bytes {
            self.index += 1;
        } else {
            return Ok(());
        }
        self.file = None;
        self.open()?;
        self.prune();
        Ok(())
    }
}

impl Write for RollingWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.roll_if_needed(buf.len())?;
        let file = self.file.as_mut().ok_or_else(|| io::Error::other("log file not open"))?;
        let n = file.write(buf)?;
        self.size += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.as_mut().map_or(Ok(()), Write::flush)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    const DAY: u64 = 86_400;

    fn clock(at: &Arc<AtomicU64>) -> Clock {
        let at = at.clone();
        Arc::new(move || SystemTime::UNIX_EPOCH + Duration::from_secs(at.load(Ordering::SeqCst)))
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> =
            std::fs::read_dir(dir).unwrap().flatten().map(|e| e.file_name().into_string().unwrap()).collect();
        v.sort();
        v
    }

    fn total(dir: &Path) -> u64 {
        std::fs::read_dir(dir).unwrap().flatten().map(|e| e.metadata().unwrap().len()).sum()
    }

    #[test]
    fn names_round_trip() {
        let day = crate::days_from_civil(2026, 12, 6);
        assert_eq!(file_name("gateway", day, 0), "gateway.2026-12-06.log");
        assert_eq!(file_name("gateway", day, 12), "gateway.2026-12-06-012.log");
        assert_eq!(parse_name("gateway.2026-12-06.log"), Some(("gateway", day, 0)));
        assert_eq!(parse_name("gateway.2026-12-06-012.log"), Some(("gateway", day, 12)));
        for other in ["gateway.log", "gateway.stdio", "gateway.2026-12-06.log.gz", "x.2026-1206.log", "a.b.log"] {
            assert_eq!(parse_name(other), None, "{other}");
        }
    }

    #[test]
    fn a_full_file_rolls_to_the_next_number() {
        let dir = tempfile::tempdir().unwrap();
        let at = Arc::new(AtomicU64::new(20_000 * DAY + 5));
        let limits = RollingLimits { max_file_bytes: 100, max_total_bytes: 10_000, keep_days: 7 };
        let mut w = RollingWriter::with_clock(dir.path(), "svc", limits, clock(&at)).unwrap();
        for _ in 0..25 {
            w.write_all(&[b'x'; 9]).unwrap();
            w.write_all(b"\n").unwrap();
        }
        w.flush().unwrap();
        let n = names(dir.path());
        assert_eq!(n, ["svc.2024-10-04-001.log", "svc.2024-10-04-002.log", "svc.2024-10-04.log"]);
        for f in &n {
            assert!(std::fs::metadata(dir.path().join(f)).unwrap().len() <= 100, "{f}");
        }
        // A new writer (a restart) continues in the newest file.
        drop(w);
        let w = RollingWriter::with_clock(dir.path(), "svc", limits, clock(&at)).unwrap();
        assert!(w.current_path().ends_with("svc.2024-10-04-002.log"));
    }

    #[test]
    fn a_new_day_starts_a_new_file() {
        let dir = tempfile::tempdir().unwrap();
        let at = Arc::new(AtomicU64::new(20_000 * DAY + DAY - 1));
        let mut w = RollingWriter::with_clock(dir.path(), "svc", RollingLimits::default(), clock(&at)).unwrap();
        w.write_all(b"late\n").unwrap();
        at.store(20_001 * DAY, Ordering::SeqCst);
        w.write_all(b"early\n").unwrap();
        assert_eq!(names(dir.path()), ["svc.2024-10-04.log", "svc.2024-10-05.log"]);
        assert_eq!(std::fs::read_to_string(dir.path().join("svc.2024-10-05.log")).unwrap(), "early\n");
    }

    #[test]
    fn the_folder_stays_under_the_total_cap_keeping_each_services_newest_file() {
        let dir = tempfile::tempdir().unwrap();
        let at = Arc::new(AtomicU64::new(20_000 * DAY));
        let limits = RollingLimits { max_file_bytes: 1_000, max_total_bytes: 5_000, keep_days: 7 };
        // Another service's single file: never deleted, it may be open elsewhere.
        std::fs::write(dir.path().join("other.2024-10-03.log"), vec![b'o'; 1_500]).unwrap();
        std::fs::write(dir.path().join("notes.txt"), b"not a log").unwrap();
        let mut w = RollingWriter::with_clock(dir.path(), "svc", limits, clock(&at)).unwrap();
        let line = [b'y'; 99];
        for _ in 0..2_000 {
            w.write_all(&line).unwrap();
            w.write_all(b"\n").unwrap();
        }
        assert!(total(dir.path()) <= 5_000 + 1_000 + 9, "total {}", total(dir.path()));
        let n = names(dir.path());
        assert!(n.contains(&"other.2024-10-03.log".to_owned()), "{n:?}");
        assert!(n.contains(&"notes.txt".to_owned()));
        assert!(n.iter().any(|f| f == "svc.2024-10-04-199.log"), "{n:?}");
    }

    #[test]
    fn days_beyond_the_kept_ones_are_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let at = Arc::new(AtomicU64::new(20_000 * DAY));
        let mut w = RollingWriter::with_clock(dir.path(), "svc", RollingLimits::default(), clock(&at)).unwrap();
        for d in 1..=9 {
            at.store((20_000 + d) * DAY, Ordering::SeqCst);
            w.write_all(b"a line\n").unwrap();
        }
        let n = names(dir.path());
        assert_eq!(n.len(), 7, "{n:?}");
        assert_eq!(n[0], "svc.2024-10-07.log");
    }

    #[test]
    fn limits_from_the_environment() {
        let get = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| (*v).to_owned())
        };
        assert_eq!(RollingLimits::from_lookup(get(&[])), RollingLimits::default());
        let l = RollingLimits::from_lookup(get(&[("COFFER_LOG_MAX_FILE_MB", "2"), ("COFFER_LOG_MAX_TOTAL_MB", "50")]));
        assert_eq!((l.max_file_bytes, l.max_total_bytes), (2 << 20, 50 << 20));
        let l = RollingLimits::from_lookup(get(&[("COFFER_LOG_MAX_FILE_MB", "0"), ("COFFER_LOG_MAX_TOTAL_MB", "x")]));
        assert_eq!(l, RollingLimits::default());
        let l = RollingLimits::from_lookup(get(&[("COFFER_LOG_MAX_FILE_MB", "40"), ("COFFER_LOG_MAX_TOTAL_MB", "50")]));
        assert_eq!(l.max_total_bytes, 80 << 20, "at least two files");
    }
}
