//! Per-process logging: `tracing` to `COFFER_HOME/logs/<service>.<date>.log`, rolled by day
//! and by size with a total cap over the folder ([`crate::rolling`]). Filter from `COFFER_LOG`
//! (default `info`).
//!
//! Lines caused by a request carry its `trace_id` as a span field, so one id can be followed
//! across the gateway, store and other services' files.
//!
//! Logs cannot be used to fill the disk: every value a client controls (a path, a query, a
//! header, a name) goes into a log field through [`clip`] (at most [`MAX_LOGGED_CHARS`]
//! characters, control characters escaped, and a visible marker saying how much was cut), and
//! lines an unauthenticated client can cause at will (refusals) go through a [`LogBudget`]: a
//! few lines a second, then one line saying how many were suppressed.
use std::sync::Mutex;
use std::time::Instant;

use tracing_appender::non_blocking::WorkerGuard;
use tracing_subscriber::EnvFilter;

use crate::home::CofferHome;

/// Installs the global subscriber writing to `logs/<service>.log`. Keep the returned guard
/// alive until exit so buffered lines are flushed.
///
/// # Errors
/// When the log folder cannot be created or opened.
pub fn init_file(home: &CofferHome, service: &str) -> anyhow::Result<WorkerGuard> {
    let limits = crate::rolling::RollingLimits::from_lookup(|k| std::env::var(k).ok());
    let appender = crate::rolling::RollingWriter::new(&home.logs(), service, limits)?;
    let (writer, guard) = tracing_appender::non_blocking(appender);
    let filter = EnvFilter::try_from_env(crate::env::LOG).unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(writer).with_ansi(false).with_target(false).init();
    Ok(guard)
}

/// Installs a subscriber writing to stderr (the shim and the CLI; never stdout).
pub fn init_stderr(default_filter: &str) {
    let filter = EnvFilter::try_from_env(crate::env::LOG).unwrap_or_else(|_| EnvFilter::new(default_filter));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .try_init();
}

/// Most characters of one client-controlled value written to a log line by [`clip`].
pub const MAX_LOGGED_CHARS: usize = 256;

/// A value as it may appear in a log line: see [`clip`].
pub struct Clipped<'a>(&'a str);

/// `value` for a log field: at most [`MAX_LOGGED_CHARS`] characters, control characters
/// escaped (`\n`, `\u{1b}`: one line stays one line), and when cut, the marker
/// `…[+N bytes]` naming how much was left out. Use it for every value a client or an upstream
/// controls: `tracing::info!(path = %clip(path), ...)`.
pub fn clip(value: &str) -> Clipped<'_> {
    Clipped(value)
}

impl std::fmt::Display for Clipped<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use std::fmt::Write as _;
        for (shown, (i, c)) in self.0.char_indices().enumerate() {
            if shown == MAX_LOGGED_CHARS {
                return write!(f, "…[+{} bytes]", self.0.len() - i);
            }
            if c.is_control() {
                for e in c.escape_default() {
                    f.write_char(e)?;
                }
            } else {
                f.write_char(c)?;
            }
        }
        Ok(())
    }
}

impl std::fmt::Debug for Clipped<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "\"{self}\"")
    }
}

/// A token bucket for one kind of log line (e.g. the edge's refusals): at most `per_second`
/// lines a second on average, in bursts of at most `burst`. [`LogBudget::allow`] says whether to
/// write the next line and how many were suppressed since the last one written, so that line
/// can say so (`suppressed = 1234`). Usable from a `static`.
pub struct LogBudget {
    per_second: u32,
    burst: u32,
    state: Mutex<BudgetState>,
}

struct BudgetState {
    tokens: f64,
    last: Option<Instant>,
    suppressed: u64,
}

impl LogBudget {
    /// A budget of `per_second` lines a second, bursts of as many (at least 1).
    pub const fn per_second(per_second: u32) -> Self {
        Self::new(per_second, per_second)
    }

    /// A budget of `per_second` lines a second on average and bursts of `burst` (each at
    /// least 1).
    pub const fn new(per_second: u32, burst: u32) -> Self {
        let per_second = if per_second == 0 { 1 } else { per_second };
        let burst = if burst == 0 { 1 } else { burst };
        Self { per_second, burst, state: Mutex::new(BudgetState { tokens: burst as f64, last: None, suppressed: 0 }) }
    }

    /// `Some(suppressed)`: write this line, mentioning the `suppressed` lines left out before
    /// it (0 when none); `None`: leave it out (it is counted).
    pub fn allow(&self) -> Option<u64> {
        let mut st = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = Instant::now();
        let rate = f64::from(self.per_second);
        if let Some(last) = st.last {
            st.tokens = (st.tokens + now.duration_since(last).as_secs_f64() * rate).min(f64::from(self.burst));
        }
        st.last = Some(now);
        if st.tokens >= 1.0 {
            st.tokens -= 1.0;
            Some(std::mem::take(&mut st.suppressed))
        } else {
            st.suppressed += 1;
            None
        }
    }
}

/// What a retry loop should log about one more failure (see [`FailureLog::failed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failing {
    /// The first failure after success (or ever), or a different error than before: log it.
    Started,
    /// Still failing, `failures` times so far: the periodic reminder, log it.
    Still { failures: u64 },
    /// Still failing the same way, reminded recently: log nothing.
    Quiet,
}

/// The state of a retry loop, so it logs state changes rather than every attempt: the first
/// failure, a reminder at most every `remind_every` while it keeps failing (or when the error
/// changes), and the recovery. It also gives the loop its backoff.
#[derive(Debug)]
pub struct FailureLog {
    failures: u64,
    last_error: String,
    last_logged: Option<Instant>,
    remind_every: std::time::Duration,
}

impl FailureLog {
    /// A loop that has not failed, reminding at most every `remind_every` while failing.
    pub fn new(remind_every: std::time::Duration) -> Self {
        Self { failures: 0, last_error: String::new(), last_logged: None, remind_every }
    }

    /// Records one failure with `error` (its text, compared with the previous one's) and says
    /// what to log.
    pub fn failed(&mut self, error: &str) -> Failing {
        self.failures += 1;
        let changed = self.last_error != error;
        if changed {
            self.last_error = error.to_owned();
        }
        let due = self.last_logged.is_none_or(|t| t.elapsed() >= self.remind_every);
        if self.failures == 1 || changed {
            self.last_logged = Some(Instant::now());
            Failing::Started
        } else if due {
            self.last_logged = Some(Instant::now());
            Failing::Still { failures: self.failures }
        } else {
            Failing::Quiet
        }
    }

    /// Records a success; `Some(failures)` when it ends a run of failures (log the recovery).
    pub fn succeeded(&mut self) -> Option<u64> {
        let was = std::mem::take(&mut self.failures);
        self.last_error.clear();
        self.last_logged = None;
        (was > 0).then_some(was)
    }

    /// Failures in a row so far.
    pub fn failures(&self) -> u64 {
        self.failures
    }

    /// The wait before the next attempt: `base` doubled per failure in a row, at most `max`
    /// ([`crate::Backoff`]'s curve; `base` also before any failure).
    pub fn backoff(&self, base: std::time::Duration, max: std::time::Duration) -> std::time::Duration {
        let failures = u32::try_from(self.failures).unwrap_or(u32::MAX).max(1);
        crate::Backoff::new(base, max).delay_after(failures)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_values_are_unchanged() {
        assert_eq!(clip("/v1/health").to_string(), "/v1/health");
        assert_eq!(clip("").to_string(), "");
        let exact = "é".repeat(MAX_LOGGED_CHARS);
        assert_eq!(clip(&exact).to_string(), exact);
    }

    #[test]
    fn long_values_are_cut_with_a_marker_naming_the_rest() {
        let path = format!("/{}", "a".repeat(60_000));
        let shown = clip(&path).to_string();
        assert_eq!(shown.chars().count(), MAX_LOGGED_CHARS + "…[+59745 bytes]".chars().count());
        assert!(shown.ends_with("…[+59745 bytes]"), "{}", &shown[shown.len() - 30..]);
        // Multi-byte characters are cut on a character boundary; the count is in bytes.
        let wide = "日".repeat(300);
        assert!(clip(&wide).to_string().ends_with(&format!("…[+{} bytes]", 44 * 3)));
    }

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(clip("a\nb\u{1b}[31m").to_string(), "a\\nb\\u{1b}[31m");
        assert_eq!(format!("{:?}", clip("x")), "\"x\"");
    }

    #[test]
    fn a_budget_lets_a_burst_through_then_counts_what_it_suppresses() {
        let budget = LogBudget::per_second(5);
        let allowed: Vec<_> = (0..1_000).map(|_| budget.allow()).collect();
        let passed = allowed.iter().filter(|a| a.is_some()).count();
        assert!((5..=6).contains(&passed), "{passed}");
        assert_eq!(allowed[0], Some(0));
        std::thread::sleep(std::time::Duration::from_millis(250));
        assert_eq!(budget.allow(), Some(1_000 - passed as u64));
    }

    #[test]
    fn a_failure_log_reports_state_changes_not_attempts() {
        let mut log = FailureLog::new(std::time::Duration::from_millis(200));
        let second = std::time::Duration::from_secs(1);
        assert_eq!(log.succeeded(), None);
        assert_eq!(log.failed("EACCES"), Failing::Started);
        assert_eq!(log.backoff(2 * second, 300 * second), 2 * second);
        for _ in 0..100 {
            assert_eq!(log.failed("EACCES"), Failing::Quiet);
        }
        assert_eq!(log.backoff(2 * second, 300 * second), 300 * second);
        assert_eq!(log.failed("EIO"), Failing::Started, "a new error is logged");
        std::thread::sleep(std::time::Duration::from_millis(250));
        assert_eq!(log.failed("EIO"), Failing::Still { failures: 103 });
        assert_eq!(log.failed("EIO"), Failing::Quiet);
        assert_eq!(log.succeeded(), Some(104));
        assert_eq!(log.failed("EIO"), Failing::Started, "failing again after a recovery");
        assert_eq!(log.backoff(2 * second, 300 * second), 2 * second);
    }
}
