//! The version of an agent's CLI, for `ListAgents` (`coffer chat agents`, `coffer doctor`, the
//! console): `<cli> --version` run once per file (its path, size and modification time: an
//! upgrade in place is probed again), bounded by [`PROBE_TIMEOUT`], its answer cached for the
//! service's life (a CLI that does not answer in time is cached as unknown). Claude Code
//! prints `2.1.332 (Claude Code)`, Codex `codex-cli 0.171.0`: the version is the first word
//! that starts with a digit (a leading `v` dropped), else the first line, at most
//! [`MAX_VERSION_CHARS`] characters.
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use tokio::io::AsyncReadExt;

/// Longest a `--version` probe may run (a Node CLI starts in about a second on a loaded
/// machine); past it the process group is killed and the version is unknown.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// Most bytes of its output read.
const MAX_OUTPUT: u64 = 4096;
/// Longest version string kept.
pub const MAX_VERSION_CHARS: usize = 40;

/// Which file was probed: path, size, modification time.
type Key = (PathBuf, u64, Option<SystemTime>);

fn cache() -> &'static Mutex<HashMap<Key, Option<String>>> {
    static CACHE: OnceLock<Mutex<HashMap<Key, Option<String>>>> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

/// The version `program --version` reports (cached per file, see the module docs); `None` when
/// it cannot be run, fails, says nothing or takes longer than [`PROBE_TIMEOUT`].
pub async fn detect(program: &Path) -> Option<String> {
    let meta = std::fs::metadata(program).ok()?;
    let key: Key = (program.to_path_buf(), meta.len(), meta.modified().ok());
    if let Some(v) = cache().lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(&key) {
        return v.clone();
    }
    let version = probe(program).await;
    if version.is_none() {
        tracing::debug!(program = %program.display(), "The agent CLI's version is unknown.");
    }
    cache().lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(key, version.clone());
    version
}

async fn probe(program: &Path) -> Option<String> {
    let mut spec = coffer_runtime::spawn::SpawnSpec::new(program, "agent", "version");
    spec.args = vec!["--version".into()];
    spec.stdout = Stdio::piped();
    spec.stderr = Stdio::piped();
    let mut child = coffer_runtime::spawn::spawn(spec).ok()?;
    let stdout = child.inner().stdout.take()?;
    let stderr = child.inner().stderr.take()?;
    let run = async {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let (mut stdout, mut stderr) = (stdout.take(MAX_OUTPUT), stderr.take(MAX_OUTPUT));
        let (a, b) = tokio::join!(stdout.read_to_end(&mut out), stderr.read_to_end(&mut err));
        let status = child.wait().await;
        (a.is_ok() && b.is_ok() && status.is_ok_and(|s| s.success())).then_some((out, err))
    };
    // On a timeout `child` is dropped when this returns: its process group is killed.
    let (out, err) = tokio::time::timeout(PROBE_TIMEOUT, run).await.ok()??;
    let text = String::from_utf8_lossy(if out.iter().all(u8::is_ascii_whitespace) { &err } else { &out }).into_owned();
    parse(&text)
}

/// The version in a `--version` answer (see the module docs); `None` when it is blank.
pub fn parse(text: &str) -> Option<String> {
    let line = text.lines().map(str::trim).find(|l| !l.is_empty())?;
    let word = line
        .split_whitespace()
        .map(|w| w.strip_prefix('v').unwrap_or(w))
        .find(|w| w.starts_with(|c: char| c.is_ascii_digit()));
    let v: String = word.unwrap_or(line).chars().filter(|c| !c.is_control()).take(MAX_VERSION_CHARS).collect();
    (!v.is_empty()).then_some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_read_from_what_the_clis_print() {
        assert_eq!(parse("2.1.332 (Claude Code)\n").as_deref(), Some("2.1.332"));
        assert_eq!(parse("codex-cli 0.171.0\n").as_deref(), Some("0.171.0"));
        assert_eq!(parse("\n  tool v1.2.3-beta\n").as_deref(), Some("1.2.3-beta"));
        assert_eq!(parse("nightly build\n").as_deref(), Some("nightly build"));
        assert_eq!(parse(" \n"), None);
        assert_eq!(parse(&"9".repeat(100)).map(|v| v.len()), Some(MAX_VERSION_CHARS));
    }

    #[tokio::test]
    async fn a_cli_is_probed_once_and_a_silent_or_slow_one_is_unknown_in_bounded_time() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let script = |name: &str, body: &str| {
            let p = dir.path().join(name);
            std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
            p
        };
        let count = dir.path().join("count");
        let good = script("good", &format!("echo x >> {}; echo '2.1.332 (Claude Code)'", count.display()));
        assert_eq!(detect(&good).await.as_deref(), Some("2.1.332"));
        assert_eq!(detect(&good).await.as_deref(), Some("2.1.332"));
        assert_eq!(std::fs::read_to_string(&count).unwrap().lines().count(), 1, "cached per file");
        let failing = script("failing", "echo 'unknown option' >&2; exit 2");
        assert_eq!(detect(&failing).await, None);
        assert_eq!(detect(&dir.path().join("missing")).await, None);
        let slow = script("slow", "exec sleep 30");
        let started = std::time::Instant::now();
        assert_eq!(detect(&slow).await, None);
        assert!(started.elapsed() < PROBE_TIMEOUT + Duration::from_secs(3), "{:?}", started.elapsed());
    }
}
