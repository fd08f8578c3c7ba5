//! [`Ctx`]: what every command gets — the resolved `COFFER_HOME`, the global flags, and the two
//! ways of reaching the daemon (detect-or-spawn for commands that need one, detect-only for the
//! ones that must never start one).
use coffer_runtime::connect::{self, Daemon};
use coffer_runtime::home::CofferHome;

use crate::api::ApiClient;
use crate::error::CliError;

/// Where the home folder came from, to name it in messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HomeSource {
    /// `--home PATH`.
    Flag,
    /// `COFFER_HOME`.
    Env,
    /// `~/.coffer`.
    Default,
}

/// Shared state of one `coffer` invocation.
pub struct Ctx {
    pub home: CofferHome,
    pub home_source: HomeSource,
    /// `--json`: print REST bodies unchanged instead of human output.
    pub json: bool,
}

impl Ctx {
    /// A context for `home` (as if given with `--home`).
    pub fn new(home: CofferHome, json: bool) -> Self {
        Self { home, home_source: HomeSource::Flag, json }
    }

    /// Finds the running daemon or starts one (`coffer_runtime::connect`); warns on stderr when
    /// its version differs from this CLI's.
    ///
    /// # Errors
    /// [`CliError::Config`] (exit 1) for a home that is not a folder or a bad `COFFER_PORT` /
    /// `COFFER_PORT_RANGE`; [`CliError::Connect`] (exit 5) when no daemon can be found or started.
    pub async fn connect(&self) -> Result<ApiClient, CliError> {
        self.check_home()?;
        check_port_env(|k| std::env::var(k).ok())?;
        let daemon = connect::detect_or_spawn(&self.home).await?;
        warn_on_version_mismatch(&daemon);
        Ok(ApiClient::new(daemon))
    }

    /// Finds a running daemon without ever starting one; `None` when none is running. Warns on
    /// a version mismatch like [`Ctx::connect`].
    pub async fn detect(&self) -> Option<ApiClient> {
        let api = self.detect_quietly().await?;
        warn_on_version_mismatch(api.daemon());
        Some(api)
    }

    /// Fails when the home exists but is not a folder, naming it the way the user gave it.
    ///
    /// # Errors
    /// [`CliError::Config`] (exit 1).
    pub fn check_home(&self) -> Result<(), CliError> {
        let root = self.home.root();
        if root.exists() && !root.is_dir() {
            let how = match self.home_source {
                HomeSource::Flag => "--home",
                HomeSource::Env => "COFFER_HOME",
                HomeSource::Default => "the default home",
            };
            return Err(CliError::Config(format!(
                "{how} {} is not a folder; give Coffer's home folder (or a path to create it at)",
                root.display()
            )));
        }
        Ok(())
    }

    /// [`Ctx::detect`] without the version warning, for `daemon stop`/`restart`, which are the
    /// remedy the warning suggests.
    pub async fn detect_quietly(&self) -> Option<ApiClient> {
        connect::detect(&self.home).await.map(ApiClient::new)
    }
}

/// One line on stderr when the running daemon is another version than this CLI.
pub fn warn_on_version_mismatch(daemon: &Daemon) {
    if daemon.version_mismatch() {
        crate::eprintln_printable!(
            "warning: the running coffer-daemon is version {} but this coffer is {}; run `coffer daemon restart` to switch",
            daemon.info.version,
            coffer_runtime::VERSION
        );
    }
}

/// Checks `COFFER_PORT` (a port number) and, when it is unset, `COFFER_PORT_RANGE`
/// (`START-END`, `0 < START <= END`) the way the daemon reads them, so a typo is reported here,
/// naming the variable, instead of as a daemon that failed to start. `var` reads a variable.
///
/// # Errors
/// [`CliError::Config`] (exit 1).
pub fn check_port_env(var: impl Fn(&str) -> Option<String>) -> Result<(), CliError> {
    use coffer_runtime::env::{PORT, PORT_RANGE};
    if let Some(p) = var(PORT) {
        return match p.parse::<u16>() {
            Ok(_) => Ok(()),
            Err(_) => Err(CliError::Config(format!("{PORT}={p:?} is not a port number (0-65535); fix or unset it"))),
        };
    }
    if let Some(r) = var(PORT_RANGE) {
        let ok = r
            .split_once('-')
            .and_then(|(a, b)| Some((a.trim().parse::<u16>().ok()?, b.trim().parse::<u16>().ok()?)))
            .is_some_and(|(a, b)| a > 0 && a <= b);
        if !ok {
            return Err(CliError::Config(format!(
                "{PORT_RANGE}={r:?} is not a port range START-END (like 8000-8009); fix or unset it"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::exit;

    #[test]
    fn port_variables_are_checked() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| (*v).to_owned())
        };
        assert!(check_port_env(env(&[])).is_ok());
        assert!(check_port_env(env(&[("COFFER_PORT", "8123")])).is_ok());
        assert!(check_port_env(env(&[("COFFER_PORT_RANGE", "8000-8009")])).is_ok());
        // COFFER_PORT wins: the range is not read then (as in the daemon).
        assert!(check_port_env(env(&[("COFFER_PORT", "8123"), ("COFFER_PORT_RANGE", "x")])).is_ok());
        for bad in [&[("COFFER_PORT", "abc")][..], &[("COFFER_PORT", "70000")], &[("COFFER_PORT", "")]] {
            let e = check_port_env(env(bad)).unwrap_err();
            assert_eq!(e.exit_code(), exit::ERROR);
            assert!(e.to_string().contains("COFFER_PORT="), "{e}");
        }
        for bad in ["8000", "9-1", "0-5", "a-b"] {
            let pairs: &'static [(&'static str, &'static str)] = Box::leak(Box::new([("COFFER_PORT_RANGE", bad)]));
            let e = check_port_env(env(pairs)).unwrap_err();
            assert!(e.to_string().contains("COFFER_PORT_RANGE="), "{e}");
        }
    }

    #[test]
    fn a_home_that_is_a_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("file");
        std::fs::write(&file, "x").unwrap();
        let e = Ctx::new(CofferHome::at(file.clone()), false).check_home().unwrap_err();
        assert_eq!(e.exit_code(), exit::ERROR);
        assert!(e.to_string().contains(&format!("--home {}", file.display())), "{e}");
        assert!(Ctx::new(CofferHome::at(dir.path().join("new")), false).check_home().is_ok());
        assert!(Ctx::new(CofferHome::at(dir.path().into()), false).check_home().is_ok());
    }
}
