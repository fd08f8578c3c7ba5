//! `coffer`: the command-line client of the Coffer daemon. A library so tests can drive it;
//! `main.rs` only calls [`main_entry`].
//!
//! - [`commands`]: one module per command group (`daemon`, `status`, `mcp`, `tools`,
//!   `invocations`, `audit`, `settings`, `logs`, `completions`);
//!   adding a group is one new file plus one variant in [`commands::Command`].
//! - [`api`]: [`api::ApiClient`], the authenticated REST client every command uses.
//! - [`context`]: [`context::Ctx`], the home and global flags, detect / detect-or-spawn.
//! - [`error`]: [`error::CliError`] and the one HTTP status → exit code mapping.
//! - [`output`]: stdout writes, tables, durations.

pub mod api;
pub mod commands;
pub mod context;
pub mod error;
pub mod output;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser};
use coffer_runtime::home::CofferHome;

use crate::context::Ctx;
use crate::error::CliError;

/// Coffer: your local AI vault. The daemon starts on demand; `coffer daemon stop` stops it.
#[derive(Debug, Parser)]
#[command(name = "coffer", version, propagate_version = true, max_term_width = 100)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: commands::Command,
}

/// Flags accepted before or after any command.
#[derive(Debug, Args)]
pub struct GlobalArgs {
    /// Print machine-readable JSON (REST bodies unchanged) instead of human output.
    #[arg(long, global = true)]
    pub json: bool,
    /// Coffer's home folder [default: $COFFER_HOME, else ~/.coffer].
    #[arg(long, global = true, value_name = "PATH")]
    pub home: Option<PathBuf>,
}

impl Cli {
    /// Runs the parsed command line.
    ///
    /// # Errors
    /// Whatever the command fails with; [`CliError::exit_code`] gives the process exit code.
    pub async fn run(self) -> Result<(), CliError> {
        let home = match self.global.home {
            Some(p) => CofferHome::at(p),
            None => CofferHome::from_env().map_err(|e| CliError::Failed(e.to_string()))?,
        };
        let ctx = Ctx { home, json: self.global.json };
        self.command.run(&ctx).await
    }
}

/// Process entry: parses arguments (clap exits with 2 on usage errors), runs the command on a
/// single-threaded runtime, prints any error on stderr and returns the exit code.
pub fn main_entry() -> ExitCode {
    let cli = Cli::parse();
    // Diagnostics from the shared runtime go to stderr, never stdout; quiet unless asked.
    coffer_runtime::logging::init_stderr("warn");
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(error::exit::ERROR);
        }
    };
    match rt.block_on(cli.run()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            if let Some(line) = e.render() {
                eprintln!("{line}");
            }
            ExitCode::from(e.exit_code())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_valid() {
        Cli::command().debug_assert();
    }

    #[test]
    fn json_and_home_are_global() {
        let c = Cli::try_parse_from(["coffer", "status", "--json", "--home", "/tmp/x"]).unwrap();
        assert!(c.global.json);
        assert_eq!(c.global.home.as_deref(), Some(std::path::Path::new("/tmp/x")));
        let c = Cli::try_parse_from(["coffer", "--json", "daemon", "status"]).unwrap();
        assert!(c.global.json);
    }

    #[test]
    fn usage_errors_exit_2() {
        let e = Cli::try_parse_from(["coffer", "logs", "nosuch"]).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        let msg = e.to_string();
        for s in commands::logs::SERVICES {
            assert!(msg.contains(s), "{msg}");
        }
        assert_eq!(Cli::try_parse_from(["coffer", "frobnicate"]).unwrap_err().exit_code(), 2);
    }
}
