//! [`Ctx`]: what every command gets — the resolved `COFFER_HOME`, the global flags, and the two
//! ways of reaching the daemon (detect-or-spawn for commands that need one, detect-only for the
//! ones that must never start one).
use coffer_runtime::connect::{self, Daemon};
use coffer_runtime::home::CofferHome;

use crate::api::ApiClient;
use crate::error::CliError;

/// Shared state of one `coffer` invocation.
pub struct Ctx {
    pub home: CofferHome,
    /// `--json`: print REST bodies unchanged instead of human output.
    pub json: bool,
}

impl Ctx {
    /// Finds the running daemon or starts one (design, "Detect-or-spawn"); warns on stderr when
    /// its version differs from this CLI's.
    ///
    /// # Errors
    /// [`CliError::Connect`] (exit 5) when no daemon can be found or started.
    pub async fn connect(&self) -> Result<ApiClient, CliError> {
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

    /// [`Ctx::detect`] without the version warning, for `daemon stop`/`restart`, which are the
    /// remedy the warning suggests.
    pub async fn detect_quietly(&self) -> Option<ApiClient> {
        connect::detect(&self.home).await.map(ApiClient::new)
    }
}

/// One line on stderr when the running daemon is another version than this CLI.
pub fn warn_on_version_mismatch(daemon: &Daemon) {
    if daemon.version_mismatch() {
        eprintln!(
            "warning: the running coffer-daemon is version {} but this coffer is {}; run `coffer daemon restart` to switch",
            daemon.info.version,
            coffer_runtime::VERSION
        );
    }
}
