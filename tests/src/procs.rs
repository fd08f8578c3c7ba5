//! Processes seen through `/proc` (Linux): which belong to a `COFFER_HOME`, whether a pid is
//! still the same live process, and signalling them.
use std::path::Path;

use nix::sys::signal::Signal;
use nix::unistd::Pid;

/// One live process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcInfo {
    pub pid: i32,
    /// Executable file name (e.g. `coffer-retrieval`; not truncated like `comm`).
    pub name: String,
    pub cmdline: Vec<String>,
    /// Start time in clock ticks since boot (`/proc/<pid>/stat` field 22): with the pid, an
    /// identity that survives pid recycling.
    pub start_time: u64,
}

impl std::fmt::Display for ProcInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.pid, self.name)
    }
}

/// `(state, start_time)` from `/proc/<pid>/stat`.
fn stat(pid: i32) -> Option<(char, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let start = fields.nth(18)?.parse().ok()?;
    Some((state, start))
}

/// Information about `pid` if it is alive (exists and is not a zombie).
pub fn proc_info(pid: i32) -> Option<ProcInfo> {
    let (state, start_time) = stat(pid)?;
    if matches!(state, 'Z' | 'X' | 'x') {
        return None;
    }
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok();
    let name = exe
        .as_deref()
        .and_then(Path::file_name)
        .map(|n| n.to_string_lossy().trim_end_matches(" (deleted)").to_owned())
        .or_else(|| std::fs::read_to_string(format!("/proc/{pid}/comm")).ok().map(|c| c.trim().to_owned()))
        .unwrap_or_default();
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| {
            b.split(|c| *c == 0).filter(|s| !s.is_empty()).map(|s| String::from_utf8_lossy(s).into_owned()).collect()
        })
        .unwrap_or_default();
    Some(ProcInfo { pid, name, cmdline, start_time })
}

/// A KiB field of `/proc/<pid>/status` (`field` with its colon, e.g. `VmRSS:`, `VmHWM:`); 0
/// when the process or the field is gone.
pub fn status_kib(pid: i32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with(field)).and_then(|l| l.split_whitespace().nth(1)?.parse().ok()))
        .unwrap_or(0)
}

/// True when `pid` is a live process (not a zombie).
pub fn alive(pid: i32) -> bool {
    stat(pid).is_some_and(|(s, _)| !matches!(s, 'Z' | 'X' | 'x'))
}

/// True when the process `p` (pid *and* start time) is still alive: a recycled pid is not it.
pub fn still_alive(p: &ProcInfo) -> bool {
    stat(p.pid).is_some_and(|(s, t)| t == p.start_time && !matches!(s, 'Z' | 'X' | 'x'))
}

fn all_pids() -> Vec<i32> {
    let Ok(rd) = std::fs::read_dir("/proc") else { return Vec::new() };
    rd.flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).collect()
}

/// Every live process (other than this one) whose environment holds exactly `key=value`.
pub fn with_env(key: &str, value: &str) -> Vec<ProcInfo> {
    let needle = format!("{key}={value}").into_bytes();
    let me = std::process::id() as i32;
    all_pids()
        .into_iter()
        .filter(|&pid| pid != me)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|env| env.split(|c| *c == 0).any(|kv| kv == needle))
        })
        .filter_map(proc_info)
        .collect()
}

/// The environment of `pid` (empty when it is gone or unreadable). Test processes run as the
/// same user as the daemon, so they can read what the supervisor passed each service.
pub fn environ(pid: i32) -> std::collections::BTreeMap<String, String> {
    let Ok(raw) = std::fs::read(format!("/proc/{pid}/environ")) else { return Default::default() };
    raw.split(|c| *c == 0)
        .filter_map(|kv| {
            let kv = String::from_utf8_lossy(kv);
            let (k, v) = kv.split_once('=')?;
            Some((k.to_owned(), v.to_owned()))
        })
        .collect()
}

/// Sends `sig` to `pid`; errors (already gone) are ignored.
pub fn signal(pid: i32, sig: Signal) {
    if pid > 0 {
        let _ = nix::sys::signal::kill(Pid::from_raw(pid), sig);
    }
}

/// `readlink /proc/<pid>/fd/<fd>`, e.g. `socket:[123456]`: two processes showing the same
/// socket inode share one listener (how a restarted service keeps its address).
pub fn fd_target(pid: i32, fd: i32) -> Option<String> {
    std::fs::read_link(format!("/proc/{pid}/fd/{fd}")).ok().map(|p| p.to_string_lossy().into_owned())
}

/// The socket inodes `pid` holds open (`/proc/<pid>/fd/* → socket:[inode]`).
fn socket_inodes(pid: i32) -> std::collections::HashSet<u64> {
    let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { return Default::default() };
    rd.flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter_map(|t| t.to_str()?.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok())
        .collect()
}

/// One row of `/proc/net/tcp{,6}`: (local port, remote port, unread bytes, inode).
fn tcp_rows() -> Vec<(u16, u16, u64, u64)> {
    let port = |addr: &str| addr.rsplit(':').next().and_then(|p| u16::from_str_radix(p, 16).ok());
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .flat_map(|text| {
            text.lines()
                .skip(1)
                .filter_map(|l| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    let rx = u64::from_str_radix(f.get(4)?.split(':').nth(1)?, 16).ok()?;
                    Some((port(f.get(1)?)?, port(f.get(2)?)?, rx, f.get(9)?.parse().ok()?))
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Bytes that `writer` sent over loopback TCP to `reader` and `reader` has not read yet (the
/// receive queues of `reader`'s sockets whose peer is one of `writer`'s). With `reader`
/// stopped (SIGSTOP), more than zero means a request from `writer` is in flight to it.
pub fn unread_between(writer: i32, reader: i32) -> u64 {
    let (w, r) = (socket_inodes(writer), socket_inodes(reader));
    let rows = tcp_rows();
    let writer_ports: std::collections::HashSet<u16> =
        rows.iter().filter(|row| w.contains(&row.3)).map(|row| row.0).collect();
    rows.iter().filter(|row| r.contains(&row.3) && writer_ports.contains(&row.1)).map(|row| row.2).sum()
}
