//! Locating the built Coffer binaries (`coffer-daemon`, `coffer`, …) from the test executable.
//!
//! `env!("CARGO_BIN_EXE_…")` only exists for binaries of the package under test, and Coffer's
//! binaries live in other packages, so the harness looks in the target directory that holds the
//! running test executable (`target/debug/deps/e2e-…` → `target/debug/`), then in
//! `$CARGO_TARGET_DIR/debug`, then in `<workspace>/target/debug`. `cargo test` does not build
//! other packages' binaries: run `cargo build --workspace --bins` first.
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::SystemTime;

use anyhow::{Context, bail};

/// The command that builds every binary the end-to-end tests run.
pub const BUILD_COMMAND: &str = "cargo build --workspace --bins";

/// The binaries every daemon start needs (the supervisor finds its services next to itself).
pub const DAEMON_BINARIES: &[&str] =
    &["coffer-daemon", "coffer-store", "coffer-retrieval", "coffer-chat", "coffer-gateway", "coffer-callback"];

/// The directory holding the built binaries (e.g. `/work/main/target/debug`).
///
/// # Errors
/// When no candidate directory holds `coffer-daemon`; the message names [`BUILD_COMMAND`].
pub fn bin_dir() -> anyhow::Result<&'static Path> {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    DIR.get_or_init(find_bin_dir).as_deref().map_err(|e| anyhow::anyhow!("{e}"))
}

fn candidates() -> Vec<PathBuf> {
    let mut out = Vec::new();
    // target/debug/deps/e2e-<hash> → target/debug
    if let Ok(exe) = std::env::current_exe() {
        out.extend(exe.ancestors().skip(1).take(2).map(Path::to_path_buf));
    }
    if let Some(t) = std::env::var_os("CARGO_TARGET_DIR") {
        out.push(PathBuf::from(t).join("debug"));
    }
    out.push(Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("target").join("debug"));
    out
}

fn find_bin_dir() -> Result<PathBuf, String> {
    let c = candidates();
    c.iter().find(|d| d.join("coffer-daemon").is_file()).cloned().ok_or_else(|| {
        format!(
            "coffer-daemon is not built (looked in {}): run `{BUILD_COMMAND}` before `cargo test -p coffer-tests`",
            c.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
        )
    })
}

/// Absolute path of the built binary `name`.
///
/// # Errors
/// When it is missing; the message names the binary and [`BUILD_COMMAND`].
pub fn bin(name: &str) -> anyhow::Result<PathBuf> {
    let dir = bin_dir()?;
    let p = dir.join(name);
    if !p.is_file() {
        bail!("{} is missing: run `{BUILD_COMMAND}` before `cargo test -p coffer-tests`", p.display());
    }
    warn_if_stale(&p);
    Ok(p)
}

/// Checks that every binary a daemon start needs is built.
///
/// # Errors
/// Naming the first missing binary and [`BUILD_COMMAND`].
pub fn require_daemon_binaries() -> anyhow::Result<()> {
    for b in DAEMON_BINARIES {
        bin(b)?;
    }
    Ok(())
}

/// Prints (once per binary) a warning when a source file the binary was built from is newer than
/// the binary, read from cargo's dep-info file `<bin>.d`. Only a warning: other engineers edit
/// the shared tree concurrently, and a failing test shows its captured stderr, where this lands.
fn warn_if_stale(binary: &Path) {
    static WARNED: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());
    let mut warned = WARNED.lock().unwrap_or_else(|e| e.into_inner());
    if warned.iter().any(|w| w == binary) {
        return;
    }
    warned.push(binary.to_path_buf());
    if let Some(src) = newer_source(binary) {
        eprintln!(
            "warning: {} is older than {}; run `{BUILD_COMMAND}` so the tests run the current code",
            binary.display(),
            src.display()
        );
    }
}

fn newer_source(binary: &Path) -> Option<PathBuf> {
    let built = std::fs::metadata(binary).and_then(|m| m.modified()).ok()?;
    let dep_info = std::fs::read_to_string(binary.with_extension("d")).ok()?;
    // Format: `<target>: <dep> <dep> …` with spaces inside paths escaped as `\ `.
    let (_, deps) = dep_info.lines().next()?.split_once(": ")?;
    let deps = deps.replace("\\ ", "\u{0}");
    deps.split_whitespace()
        .map(|d| PathBuf::from(d.replace('\u{0}', " ")))
        .find(|d| std::fs::metadata(d).and_then(|m| m.modified()).is_ok_and(|m: SystemTime| m > built))
}

/// Path of `tests/peers/` (pinned npm/PyPI peers; see its README for `install.sh`).
pub fn peers_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("peers")
}

/// Absolute path of a file under `tests/peers/`.
///
/// # Errors
/// When it is missing, naming the setup step (`tests/peers/install.sh`).
pub fn peer(relative: &str) -> anyhow::Result<PathBuf> {
    let p = peers_dir().join(relative);
    if !p.exists() {
        bail!("test peer {} is missing: run tests/peers/install.sh", p.display());
    }
    p.canonicalize().with_context(|| format!("resolving {}", p.display()))
}
