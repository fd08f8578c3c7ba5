//! CPU scheduling hints for the processes on the MCP request path.
//!
//! The shim and the gateway are relays: each wake-up does a few microseconds of work (read a
//! line, route it, write it on) and then waits again. Under Linux's EEVDF scheduler (6.6+) a
//! woken task that asks for a shorter time slice gets an earlier virtual deadline, so it runs
//! sooner instead of waiting behind a busy process for the rest of that process's slice
//! (default about 1.4 ms on two CPUs); custom slices for ordinary tasks came with Linux 6.12
//! (`sched_setattr(2)` with `sched_runtime` set for `SCHED_OTHER`/`SCHED_BATCH`). The slice
//! changes when a task runs, not how much CPU it gets: its fair share stays the same.
//!
//! Children inherit the setting across `fork`/`exec`, so upstream MCP servers the gateway starts
//! get it too; they are relays of the same calls. `COFFER_SCHED_SLICE_US` overrides the length
//! (microseconds; the kernel clamps it to 100..=100,000) and `0` leaves the kernel's default.
//! Elsewhere, and on kernels without custom slices, this does nothing.
//!
//! Background services do the opposite: [`background_priority`] makes the calling thread (and
//! every thread it starts later) nicer, so that bulk work no request waits on (the store writing
//! thousands of invocation records at a time, pruning, backups) runs in the CPU time the relays
//! leave, instead of taking a CPU from a call in flight for milliseconds at a time.
//! `COFFER_BACKGROUND_NICE` sets the nice value (0..=19, default 10; `0` leaves it as is).
//!
//! Measured effect: `docs/BENCHMARKS.md` (the gateway section).

/// The slice the relays ask for unless `COFFER_SCHED_SLICE_US` says otherwise: the shortest
/// the kernel grants (100 µs).
pub const DEFAULT_SLICE_US: u64 = 100;

/// What [`request_short_slice`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SliceOutcome {
    /// The kernel took a slice request of this many microseconds (as clamped to what the kernel
    /// grants: 100..=100,000).
    Requested(u64),
    /// `COFFER_SCHED_SLICE_US=0`, or the process runs under a policy other than
    /// `SCHED_OTHER`/`SCHED_BATCH` (real-time or idle: left as the user set it).
    Skipped,
    /// The platform or kernel refused; the reason.
    Unsupported(String),
}

/// The kernel's bounds for a custom slice, in µs (`sched_setattr(2)`, Linux 6.12+).
pub const SLICE_RANGE_US: std::ops::RangeInclusive<u64> = 100..=100_000;

/// Asks the kernel for a short time slice for the calling thread (the whole process when called
/// before other threads are started: threads inherit it). Never fails the caller; a
/// `COFFER_SCHED_SLICE_US` that is not a whole number of µs is warned about once and the
/// default used.
pub fn request_short_slice() -> SliceOutcome {
    let us = match slice_us(std::env::var(crate::env::SCHED_SLICE_US).ok().as_deref()) {
        Ok(us) => us,
        Err(e) => {
            tracing::warn!("{e}; using the default of {DEFAULT_SLICE_US} µs.");
            DEFAULT_SLICE_US
        }
    };
    if us == 0 {
        return SliceOutcome::Skipped;
    }
    let us = us.clamp(*SLICE_RANGE_US.start(), *SLICE_RANGE_US.end());
    imp::set_slice(us * 1000)
}

/// The slice length in µs for a `COFFER_SCHED_SLICE_US` value (unset or empty: the default).
fn slice_us(value: Option<&str>) -> Result<u64, String> {
    match value.map(str::trim) {
        None | Some("") => Ok(DEFAULT_SLICE_US),
        Some(v) if v.bytes().all(|b| b.is_ascii_digit()) => {
            // All digits: only too large to count can fail; that is the longest slice.
            Ok(v.parse::<u64>().unwrap_or(u64::MAX))
        }
        Some(v) => Err(format!("COFFER_SCHED_SLICE_US={v:?} is not a whole number of microseconds")),
    }
}

/// The nice value background services take unless `COFFER_BACKGROUND_NICE` says otherwise.
/// Nice 10 weighs 110 against 1024 for nice 0 (`sched_prio_to_weight` in the kernel): a
/// background thread gets about a tenth of a CPU that a request-path process also wants, and
/// all of an idle one.
pub const DEFAULT_BACKGROUND_NICE: i32 = 10;

/// What [`background_priority`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NiceOutcome {
    /// The calling thread now runs at this nice value.
    Set(i32),
    /// Already at least as nice as asked (e.g. the daemon was started with `nice`): left as is.
    Kept(i32),
    /// `COFFER_BACKGROUND_NICE=0`.
    Skipped,
    /// The platform refused; the reason.
    Unsupported(String),
}

/// Makes the calling thread a background one: nice [`DEFAULT_BACKGROUND_NICE`] or
/// `COFFER_BACKGROUND_NICE` (0..=19; larger values are held to 19), never less nice than it is.
/// Threads it starts afterwards inherit the value, so call it before a runtime starts its
/// threads. Never fails the caller. Returns what was done and, for a `COFFER_BACKGROUND_NICE`
/// that is not a whole number, a warning for the caller to log (this may run before logging is
/// set up); the default is used then.
pub fn background_priority() -> (NiceOutcome, Option<String>) {
    let value = std::env::var(crate::env::BACKGROUND_NICE).ok();
    let (nice, warning) = match background_nice(value.as_deref()) {
        Ok(19) if value.as_deref().is_some_and(|v| v.trim() != "19") => (
            19,
            Some(format!(
                "COFFER_BACKGROUND_NICE={:?} is above 19, the nicest value; using 19",
                value.unwrap_or_default()
            )),
        ),
        Ok(n) => (n, None),
        Err(e) => (DEFAULT_BACKGROUND_NICE, Some(format!("{e}; using the default of {DEFAULT_BACKGROUND_NICE}"))),
    };
    if nice == 0 {
        return (NiceOutcome::Skipped, warning);
    }
    (imp::set_nice(nice), warning)
}

/// The nice value for a `COFFER_BACKGROUND_NICE` value (unset or empty: the default).
fn background_nice(value: Option<&str>) -> Result<i32, String> {
    match value.map(str::trim) {
        None | Some("") => Ok(DEFAULT_BACKGROUND_NICE),
        Some(v) if v.bytes().all(|b| b.is_ascii_digit()) => Ok(v.parse::<i32>().unwrap_or(19).min(19)),
        Some(v) => Err(format!("COFFER_BACKGROUND_NICE={v:?} is not a whole number from 0 to 19")),
    }
}

#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
mod imp {
    use super::{NiceOutcome, SliceOutcome};

    /// Raises the calling thread's nice value to `nice` unless it is already that nice. On
    /// Linux, `PRIO_PROCESS` with `who` 0 is the calling thread (`setpriority(2)`, BUGS).
    pub(super) fn set_nice(nice: i32) -> NiceOutcome {
        // SAFETY: plain syscalls on the calling thread. `getpriority` may return -1 as a valid
        // value, so errno is cleared first and checked after.
        let current = unsafe {
            *libc::__errno_location() = 0;
            libc::getpriority(libc::PRIO_PROCESS, 0)
        };
        if current == -1 && std::io::Error::last_os_error().raw_os_error() != Some(0) {
            return NiceOutcome::Unsupported(format!("getpriority: {}", std::io::Error::last_os_error()));
        }
        if current >= nice {
            return NiceOutcome::Kept(current);
        }
        // SAFETY: as above.
        if unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) } != 0 {
            return NiceOutcome::Unsupported(format!("setpriority: {}", std::io::Error::last_os_error()));
        }
        NiceOutcome::Set(nice)
    }

    pub(super) fn set_slice(ns: u64) -> SliceOutcome {
        // SAFETY: `attr` is a valid, writable `sched_attr` and the size passed is its size;
        // the kernel writes at most that many bytes (pid 0: the calling thread, flags 0).
        let mut attr: libc::sched_attr = unsafe { std::mem::zeroed() };
        let size = std::mem::size_of::<libc::sched_attr>() as u32;
        let got = unsafe { libc::syscall(libc::SYS_sched_getattr, 0, &mut attr as *mut libc::sched_attr, size, 0) };
        if got != 0 {
            return SliceOutcome::Unsupported(format!("sched_getattr: {}", std::io::Error::last_os_error()));
        }
        if attr.sched_policy != libc::SCHED_OTHER as u32 && attr.sched_policy != libc::SCHED_BATCH as u32 {
            return SliceOutcome::Skipped;
        }
        // Keep policy and nice value; only the slice request changes. No RESET_ON_FORK:
        // upstream servers the gateway starts inherit it (see the module docs).
        attr.size = size;
        attr.sched_flags = 0;
        attr.sched_runtime = ns;
        attr.sched_deadline = 0;
        attr.sched_period = 0;
        // SAFETY: as above; the kernel only reads `size` bytes of `attr`.
        let set = unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &attr as *const libc::sched_attr, 0) };
        if set != 0 {
            return SliceOutcome::Unsupported(format!("sched_setattr: {}", std::io::Error::last_os_error()));
        }
        SliceOutcome::Requested(ns / 1000)
    }
}

#[cfg(not(target_os = "linux"))]
mod imp {
    use super::{NiceOutcome, SliceOutcome};

    pub(super) fn set_nice(_nice: i32) -> NiceOutcome {
        NiceOutcome::Unsupported("background priority is only set on Linux".into())
    }

    pub(super) fn set_slice(_ns: u64) -> SliceOutcome {
        SliceOutcome::Unsupported("time-slice requests need Linux".into())
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// `se.slice` of this thread in ns, from `/proc/thread-self/sched` (Linux 6.6+).
    fn slice_ns() -> Option<u64> {
        let text = std::fs::read_to_string("/proc/thread-self/sched").ok()?;
        let line = text.lines().find(|l| l.starts_with("se.slice"))?;
        line.split(':').nth(1)?.trim().parse().ok()
    }

    #[test]
    fn the_environment_value_is_parsed() {
        assert_eq!(slice_us(None), Ok(DEFAULT_SLICE_US));
        assert_eq!(slice_us(Some("")), Ok(DEFAULT_SLICE_US));
        assert_eq!(slice_us(Some(" 250 ")), Ok(250));
        assert_eq!(slice_us(Some("0")), Ok(0));
        assert_eq!(slice_us(Some("18446744073709551616")), Ok(u64::MAX));
        for bad in ["fast", "-5", "+7", "1e3", "0x10", "1.5"] {
            assert!(slice_us(Some(bad)).unwrap_err().contains("is not a whole number"), "{bad}");
        }
    }

    #[test]
    fn the_background_nice_value_is_parsed() {
        assert_eq!(background_nice(None), Ok(DEFAULT_BACKGROUND_NICE));
        assert_eq!(background_nice(Some(" ")), Ok(DEFAULT_BACKGROUND_NICE));
        assert_eq!(background_nice(Some("0")), Ok(0));
        assert_eq!(background_nice(Some(" 15 ")), Ok(15));
        assert_eq!(background_nice(Some("40")), Ok(19));
        assert_eq!(background_nice(Some("99999999999999999999")), Ok(19));
        for bad in ["low", "-5", "+3", "1.5", "0x0a"] {
            assert!(background_nice(Some(bad)).unwrap_err().contains("is not a whole number"), "{bad}");
        }
    }

    /// The calling thread's nice value, from `/proc/thread-self/stat` (field 19).
    fn thread_nice() -> i32 {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").expect("stat");
        let after_comm = &stat[stat.rfind(')').expect("comm") + 2..];
        after_comm.split(' ').nth(16).expect("nice field").parse().expect("number")
    }

    #[test]
    fn a_background_thread_gets_nicer_never_less_nice_and_its_threads_inherit_it() {
        // Relative to where the test runs: under `nice -n 19` every thread starts at 19 and 7
        // is already less nice than that, so it is kept.
        let start = thread_nice();
        let (outcome, inherited, again, other) = std::thread::spawn(|| {
            let outcome = imp::set_nice(7);
            let inherited = std::thread::spawn(thread_nice).join().expect("child");
            // Asking for less than it has keeps what it has.
            let again = imp::set_nice(3);
            (outcome, inherited, again, thread_nice())
        })
        .join()
        .expect("thread");
        let now = start.max(7);
        if start < 7 {
            assert_eq!(outcome, NiceOutcome::Set(7));
        } else {
            assert_eq!(outcome, NiceOutcome::Kept(start));
        }
        assert_eq!(inherited, now, "threads started afterwards inherit the nice value");
        assert_eq!(again, NiceOutcome::Kept(now));
        assert_eq!(other, now);
        assert_eq!(thread_nice(), start, "only the calling thread changed");
    }

    #[test]
    fn a_thread_gets_the_slice_it_asks_for() {
        // On a fresh thread: the setting is per thread (and inherited by threads it starts).
        let (before, outcome, after) =
            std::thread::spawn(|| (slice_ns(), imp::set_slice(100_000), slice_ns())).join().expect("thread");
        match (outcome, before, after) {
            // Kernels with custom slices (6.12+) report the request in se.slice.
            (SliceOutcome::Requested(100), Some(before), Some(after)) => {
                assert_eq!(after, 100_000, "se.slice after the request (was {before})")
            }
            (SliceOutcome::Requested(100), ..) => {}
            (other, ..) => assert!(matches!(other, SliceOutcome::Unsupported(_)), "{other:?}"),
        }
        // This thread was not touched.
        assert_ne!(slice_ns(), Some(100_000));
    }
}
