//! Free loopback ports for daemons under test.
//!
//! Ports come from a window outside the kernel's ephemeral range
//! (`/proc/sys/net/ipv4/ip_local_port_range`), so an outgoing connection of some other test can
//! never take a port between our check and the daemon's `bind`. Each call reserves a block of
//! consecutive ports (every one checked free by binding it) from a per-process cursor that
//! starts at a pid-derived offset, so concurrent test processes rarely probe the same block.
use std::net::TcpListener;
use std::sync::Mutex;

/// How many consecutive ports [`free_port_block`] returns at most.
pub const MAX_BLOCK: u16 = 16;

struct Window {
    lo: u16,
    hi: u16,
    next: u16,
}

static WINDOW: Mutex<Option<Window>> = Mutex::new(None);

fn ephemeral_range() -> (u16, u16) {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| {
            let mut it = s.split_whitespace().map(|v| v.parse::<u16>().ok());
            Some((it.next()??, it.next()??))
        })
        .unwrap_or((32768, 60999))
}

fn new_window() -> Window {
    let (elo, ehi) = ephemeral_range();
    let (lo, hi) = if elo >= 12_000 {
        (elo - 10_000, elo - 1)
    } else if ehi <= 55_000 {
        (ehi + 1, 65_000)
    } else {
        (20_000, 30_000)
    };
    let span = u32::from(hi - lo);
    let start = lo + ((std::process::id().wrapping_mul(7919)) % span) as u16;
    Window { lo, hi, next: start }
}

/// Returns the first port of `len` consecutive loopback ports that were all free when checked.
///
/// # Panics
/// When `len` is 0 or above [`MAX_BLOCK`], or the whole window is taken.
pub fn free_port_block(len: u16) -> u16 {
    assert!((1..=MAX_BLOCK).contains(&len), "block length {len} out of range");
    let mut guard = WINDOW.lock().unwrap_or_else(|e| e.into_inner());
    let w = guard.get_or_insert_with(new_window);
    let tries = (w.hi - w.lo) / len + 1;
    for _ in 0..tries {
        if w.next.checked_add(len).is_none_or(|end| end > w.hi) {
            w.next = w.lo;
        }
        let start = w.next;
        w.next += len;
        if (start..start + len).all(port_is_free) {
            return start;
        }
    }
    panic!("no {len} consecutive free loopback ports in {}-{}", w.lo, w.hi);
}

/// One free loopback port.
pub fn free_port() -> u16 {
    free_port_block(1)
}

/// True when `127.0.0.1:port` can be bound now.
pub fn port_is_free(port: u16) -> bool {
    TcpListener::bind(("127.0.0.1", port)).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_free_distinct_and_outside_the_ephemeral_range() {
        let (elo, ehi) = ephemeral_range();
        let a = free_port_block(5);
        let b = free_port_block(5);
        assert!(a.abs_diff(b) >= 5, "blocks overlap: {a} {b}");
        for p in (a..a + 5).chain(b..b + 5) {
            assert!(p < elo || p > ehi, "{p} is ephemeral");
            assert!(port_is_free(p), "{p} is taken");
        }
    }
}
