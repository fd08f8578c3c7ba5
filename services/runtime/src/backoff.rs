//! The one exponential backoff every retry loop uses (service restarts, store reconnections,
//! platform calls, stream resumptions): a wait that starts at `first` and doubles per failure in
//! a row up to `max`.

use std::time::Duration;

/// Exponential backoff: the wait after the `n`th failure in a row is `first · 2ⁿ⁻¹`, at most
/// `max` (so `first`, `2·first`, `4·first`, … `max`, `max`, …).
///
/// Two ways to use it: as a counter in a loop ([`Backoff::next_delay`] after each failure,
/// [`Backoff::reset`] after a success), or as a pure curve ([`Backoff::delay_after`]) where the
/// caller keeps its own failure count. Nothing here sleeps or reads the clock, so the curve is
/// tested without time passing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    /// Failures in a row recorded by [`Backoff::next_delay`] since the last reset.
    failures: u32,
}

impl Backoff {
    /// A backoff that waits `first` after the first failure and doubles per further failure,
    /// never more than `max` (a `max` below `first` caps every wait at `max`).
    pub const fn new(first: Duration, max: Duration) -> Self {
        Self { first, max, failures: 0 }
    }

    /// The wait after the `failures`th failure in a row: zero for none, `first` for one,
    /// doubling per further failure, at most `max`. Saturates instead of overflowing.
    pub fn delay_after(&self, failures: u32) -> Duration {
        if failures == 0 {
            return Duration::ZERO;
        }
        let doublings = (failures - 1).min(31);
        self.first.saturating_mul(1u32 << doublings).min(self.max)
    }

    /// Records one more failure and returns the wait before the next attempt (`first` after
    /// the first failure since the last reset).
    pub fn next_delay(&mut self) -> Duration {
        self.failures = self.failures.saturating_add(1);
        self.delay_after(self.failures)
    }

    /// The wait [`Backoff::next_delay`] would return now, without recording a failure.
    pub fn peek(&self) -> Duration {
        self.delay_after(self.failures.saturating_add(1))
    }

    /// Failures in a row recorded since the last reset.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// Forgets the failures: the next wait is `first` again.
    pub fn reset(&mut self) {
        self.failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn doubles_from_first_up_to_max() {
        let mut b = Backoff::new(100 * MS, 1000 * MS);
        let waits: Vec<_> = (0..6).map(|_| b.next_delay()).collect();
        assert_eq!(waits, [100 * MS, 200 * MS, 400 * MS, 800 * MS, 1000 * MS, 1000 * MS]);
        assert_eq!(b.failures(), 6);
    }

    #[test]
    fn reset_starts_over_and_peek_records_nothing() {
        let mut b = Backoff::new(50 * MS, Duration::from_secs(1));
        assert_eq!(b.peek(), 50 * MS);
        b.next_delay();
        b.next_delay();
        assert_eq!(b.peek(), 200 * MS);
        assert_eq!(b.peek(), 200 * MS, "peek does not count a failure");
        b.reset();
        assert_eq!((b.failures(), b.next_delay()), (0, 50 * MS));
    }

    #[test]
    fn delay_after_is_the_pure_curve() {
        let b = Backoff::new(Duration::from_secs(5), Duration::from_secs(300));
        assert_eq!(b.delay_after(0), Duration::ZERO);
        assert_eq!(b.delay_after(1), Duration::from_secs(5));
        assert_eq!(b.delay_after(3), Duration::from_secs(20));
        assert_eq!(b.delay_after(7), Duration::from_secs(300));
    }

    #[test]
    fn never_overflows() {
        let b = Backoff::new(Duration::from_secs(u64::MAX / 2), Duration::MAX);
        assert_eq!(b.delay_after(u32::MAX), Duration::MAX);
        let mut b = Backoff::new(MS, Duration::from_secs(3600));
        for _ in 0..100 {
            b.next_delay();
        }
        assert_eq!(b.next_delay(), Duration::from_secs(3600));
    }

    #[test]
    fn max_below_first_caps_every_wait() {
        let b = Backoff::new(Duration::from_secs(2), Duration::from_secs(1));
        assert_eq!(b.delay_after(1), Duration::from_secs(1));
    }
}
