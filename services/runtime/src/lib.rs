//! Shared process plumbing used by every Coffer binary.
//!
//! - [`backoff`]: the one exponential [`backoff::Backoff`] of every retry loop.
//! - [`codex_config`]: the one writer of Coffer's entry in Codex's `config.toml`.
//! - [`home`]: the `COFFER_HOME` layout and its owner-only permissions.
//! - [`logging`]: per-process log files under `logs/`, clipped values and rate-limited lines.
//! - [`rolling`]: the log files' writer (by day and size, with a total cap).
//! - [`limits`]: every listener's timeouts and connection cap, and the HTTP server loop.
//! - [`listen`]: listeners inherited from the supervisor as file descriptors.
//! - [`grpc`]: the internal auth layer (who is calling, may they) and trace-id propagation.
//! - [`identity`]: per-service internal tokens and the digests receivers check them against.
//! - [`authz`]: the declarative tables of which identity may call which internal method.
//! - [`settings`]: the follower that keeps a service's typed settings current.
//! - [`service`]: a service binary's `main` shape and its [`service::ServiceCtx`].
//! - [`spawn`]: the one helper that starts every child process.
//! - [`sandbox`]: the Landlock ruleset that hides `COFFER_HOME` from upstreams and agents.
//! - [`daemon_file`]: `daemon.json` and `daemon.lock`.
//! - [`connect`]: detect-or-spawn, shared by the shim and the CLI.
//! - [`token`]: random tokens and constant-time comparison.

pub mod authz;
pub mod backoff;
pub mod base_env;
pub mod codex_config;
pub mod connect;
pub mod daemon_file;
pub mod digest;
pub mod env;
pub mod grpc;
pub mod home;
pub mod identity;
pub mod limits;
pub mod listen;
pub mod logging;
pub mod ndjson;
pub mod rolling;
pub mod sandbox;
pub mod sched;
pub mod service;
pub mod settings;
pub mod spawn;
pub mod tls;
pub mod token;

pub use backoff::Backoff;

/// Version of this build; the daemon and its entry points compare it.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Current time as RFC 3339 UTC with millisecond precision, e.g. `2026-11-30T09:31:36.123Z`.
pub fn now_rfc3339() -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    rfc3339_from_unix_ms(now.as_millis() as i64)
}

/// Formats milliseconds since the Unix epoch as RFC 3339 UTC (`YYYY-MM-DDTHH:MM:SS.mmmZ`).
pub fn rfc3339_from_unix_ms(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let millis = ms.rem_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    if !(0..=9999).contains(&y) {
        return format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{millis:03}Z", rem / 3600, (rem % 3600) / 60, rem % 60);
    }
    // Written digit by digit: this runs once per recorded invocation, on the gateway's hot path.
    let mut out = [0u8; 24];
    let fields: [(usize, i64, usize); 7] = [
        (0, y, 4),
        (5, i64::from(m), 2),
        (8, i64::from(d), 2),
        (11, rem / 3600, 2),
        (14, (rem % 3600) / 60, 2),
        (17, rem % 60, 2),
        (20, millis, 3),
    ];
    for (at, mut value, width) in fields {
        for i in (at..at + width).rev() {
            out[i] = b'0' + (value % 10) as u8;
            value /= 10;
        }
    }
    for (at, sep) in [(4, b'-'), (7, b'-'), (10, b'T'), (13, b':'), (16, b':'), (19, b'.'), (23, b'Z')] {
        out[at] = sep;
    }
    out.iter().map(|&b| b as char).collect()
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's `days_from_civil`);
/// the inverse of the conversion [`rfc3339_from_unix_ms`] uses.
pub fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Days since 1970-01-01 to a proleptic Gregorian (year, month, day); Howard Hinnant's
/// `civil_from_days` algorithm.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_instants() {
        assert_eq!(rfc3339_from_unix_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339_from_unix_ms(1_796_031_096_123), "2026-11-30T09:31:36.123Z");
        assert_eq!(rfc3339_from_unix_ms(951_782_400_000), "2000-02-29T00:00:00.000Z");
        for days in [-800_000, -1, 0, 59, 10_957, 20_787, 2_932_896] {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, i64::from(m), i64::from(d)), days);
        }
    }

    #[test]
    fn digit_writer_matches_the_formatter() {
        let reference = |ms: i64| {
            let (secs, millis) = (ms.div_euclid(1000), ms.rem_euclid(1000));
            let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
            let (y, m, d) = civil_from_days(days);
            format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{millis:03}Z", rem / 3600, (rem % 3600) / 60, rem % 60)
        };
        // Every day from 1900 to 2100, each at another time of day (a stride prime to a day's
        // milliseconds walks every hour, minute, second and millisecond digit), and the ends of
        // the range. (73k dates; stepping every 17 minutes instead took 6 million and 11 s.)
        let first_day = -2_208_988_800_000i64 / 86_400_000;
        for day in first_day..4_102_444_800_000 / 86_400_000 {
            let ms = day * 86_400_000 + (day - first_day) * 7_919_993 % 86_400_000;
            assert_eq!(rfc3339_from_unix_ms(ms), reference(ms));
        }
        for ms in [-62_167_219_200_000, -62_167_219_200_001, 253_402_300_799_999, 253_402_300_800_000] {
            assert_eq!(rfc3339_from_unix_ms(ms), reference(ms), "{ms}");
        }
    }
}
