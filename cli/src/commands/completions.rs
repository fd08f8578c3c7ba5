//! `coffer completions <shell>`: prints a completion script (clap_complete). Never starts a
//! daemon.
use clap::{Args, CommandFactory};
use clap_complete::Shell;

use crate::error::CliError;

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to generate for.
    pub shell: Shell,
}

/// Writes the script for `args.shell` to stdout.
///
/// # Errors
/// When stdout cannot be written.
pub fn run(args: CompletionsArgs) -> Result<(), CliError> {
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut crate::Cli::command(), "coffer", &mut script);
    crate::output::print(&String::from_utf8_lossy(&script))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scripts_name_the_commands() {
        for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut crate::Cli::command(), "coffer", &mut script);
            let s = String::from_utf8(script).unwrap();
            assert!(s.contains("daemon") && s.contains("logs"), "{shell}");
        }
    }
}
