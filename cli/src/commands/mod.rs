//! The command tree. Each command group is one module with its clap arguments and a
//! `run(ctx, args)`; adding a group is one new file plus one variant and one match arm here.

pub mod completions;
pub mod daemon;
pub mod logs;
pub mod status;

use clap::Subcommand;

use crate::context::Ctx;
use crate::error::CliError;

/// Top-level commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Start, stop, restart or inspect the daemon.
    #[command(subcommand)]
    Daemon(daemon::DaemonCommand),
    /// Show the daemon, its services and upstreams (starts the daemon if needed).
    Status(status::StatusArgs),
    /// Print (and follow) the local log files; never starts the daemon.
    Logs(logs::LogsArgs),
    /// Print a shell completion script.
    Completions(completions::CompletionsArgs),
}

impl Command {
    /// Runs the command.
    ///
    /// # Errors
    /// Whatever the command fails with.
    pub async fn run(self, ctx: &Ctx) -> Result<(), CliError> {
        match self {
            Command::Daemon(c) => daemon::run(ctx, c).await,
            Command::Status(a) => status::run(ctx, a).await,
            Command::Logs(a) => logs::run(ctx, a).await,
            Command::Completions(a) => completions::run(a),
        }
    }
}
