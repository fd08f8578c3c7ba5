//! `coffer`: the command-line client of the Coffer daemon. A library so tests can drive it;
//! `main.rs` only calls [`main_entry`].
//!
//! - [`commands`]: one module per command group (`daemon`, `status`, `mcp`, `tools`, `kb`,
//!   `memory`, `skills`, `chat`, `invocations`, `audit`, `settings`, `logs`, `completions`);
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

use crate::context::{Ctx, HomeSource};
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
    /// Print machine-readable JSON (REST bodies unchanged) instead of human output; errors as
    /// {"error":{"code","message","details"}} on stdout.
    #[arg(long, global = true)]
    pub json: bool,
    /// Coffer's home folder [default: $COFFER_HOME, else ~/.coffer].
    #[arg(long, global = true, value_name = "PATH")]
    pub home: Option<PathBuf>,
}

/// Parses `args` (the program name first, e.g. `["coffer", "kb", "add", "notes"]`) as the `coffer`
/// command line, running nothing: `Err` holds clap's message for a line `coffer` would refuse
/// with exit 2 (an unknown command or flag, a missing or extra argument). For a test that every
/// command the web console tells the user to run is one the CLI takes.
///
/// # Errors
/// The parser's message, as `coffer` would print it.
pub fn check_args<I, T>(args: I) -> Result<(), String>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    Cli::try_parse_from(args).map(drop).map_err(|e| e.to_string())
}

impl Cli {
    /// Runs the parsed command line.
    ///
    /// # Errors
    /// Whatever the command fails with; [`CliError::exit_code`] gives the process exit code.
    pub async fn run(self) -> Result<(), CliError> {
        let (home, home_source) = match self.global.home {
            Some(p) => (CofferHome::at(p), HomeSource::Flag),
            None => {
                let source = if std::env::var_os(coffer_runtime::env::HOME).is_some_and(|v| !v.is_empty()) {
                    HomeSource::Env
                } else {
                    HomeSource::Default
                };
                (CofferHome::from_env().map_err(|e| CliError::Config(e.to_string()))?, source)
            }
        };
        let ctx = Ctx { home, home_source, json: self.global.json };
        self.command.run(&ctx).await
    }
}

/// Process entry: parses arguments, runs the command on a single-threaded runtime, prints any
/// error on stderr (and with `--json` its envelope on stdout) and returns the exit code. clap's
/// own usage errors exit 2 (with `--json`, after an `INVALID_ARGUMENT` envelope on stdout).
pub fn main_entry() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // `args_os`: an argument that is not UTF-8 is exactly what clap may have refused
            // (`env::args` would panic on it).
            let args: Vec<String> = std::env::args_os().map(|a| a.to_string_lossy().into_owned()).collect();
            if let Some(doc) = version_json(&e, &args) {
                return match output::print_json(&doc) {
                    Ok(()) => ExitCode::SUCCESS,
                    Err(_) => ExitCode::from(error::exit::ERROR),
                };
            }
            if let Some(envelope) = clap_error_envelope(&e, &args) {
                let _ = output::print_json(&envelope);
            }
            e.exit()
        }
    };
    let json = cli.global.json;
    // Diagnostics from the shared runtime go to stderr, never stdout; quiet unless asked.
    coffer_runtime::logging::init_stderr("warn");
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            crate::eprintln_printable!("error: cannot start the async runtime: {e}");
            return ExitCode::from(error::exit::ERROR);
        }
    };
    match rt.block_on(cli.run()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            if json && let Some(envelope) = e.envelope() {
                // A closed stdout only loses the document; the exit code still tells.
                let _ = output::print_json(&envelope);
            }
            if let Some(line) = e.render() {
                crate::eprintln_printable!("{line}");
            }
            ExitCode::from(e.exit_code())
        }
    }
}

/// `coffer --version --json` (or any command's `--version` with `--json`): the version as
/// `{"name":"coffer","version":"0.1.0"}` instead of clap's text line.
pub fn version_json(e: &clap::Error, args: &[String]) -> Option<serde_json::Value> {
    let json = args.iter().skip(1).take_while(|a| *a != "--").any(|a| a == "--json");
    (json && e.kind() == clap::error::ErrorKind::DisplayVersion)
        .then(|| serde_json::json!({"name": "coffer", "version": env!("CARGO_PKG_VERSION")}))
}

/// With `--json` among `args` (before a `--`), the envelope of a clap error that is a real error
/// (not `--help` or `--version`): code `INVALID_ARGUMENT`, clap's first line as the message, and
/// for an invalid value the argument, the value and the valid ones in `details`.
pub fn clap_error_envelope(e: &clap::Error, args: &[String]) -> Option<serde_json::Value> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    let json = args.iter().skip(1).take_while(|a| *a != "--").any(|a| a == "--json");
    if !json || matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        return None;
    }
    let rendered = e.render().to_string();
    // clap's first paragraph (`error: …` and its continuation lines), on one line.
    let first: Vec<&str> =
        rendered.lines().map(str::trim).skip_while(|l| l.is_empty()).take_while(|l| !l.is_empty()).collect();
    let message = first.join(" ").trim_start_matches("error:").trim().to_owned();
    let message = if message.is_empty() { e.kind().to_string() } else { message };
    let mut details = serde_json::Map::new();
    let text = |v: &ContextValue| match v {
        ContextValue::String(s) => Some(serde_json::Value::String(s.clone())),
        ContextValue::Strings(v) => Some(serde_json::json!(v)),
        _ => None,
    };
    for (kind, key) in [
        (ContextKind::InvalidArg, "argument"),
        (ContextKind::InvalidValue, "value"),
        (ContextKind::ValidValue, "valid"),
    ] {
        if let Some(v) = e.get(kind).and_then(text) {
            details.insert(key.into(), v);
        }
    }
    Some(serde_json::json!({"error": {"code": error::codes::INVALID_ARGUMENT, "message": message, "details": details}}))
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

    #[test]
    fn version_with_json_is_a_json_document() {
        let args = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let argv = args(&["coffer", "--version", "--json"]);
        let doc = version_json(&Cli::try_parse_from(&argv).unwrap_err(), &argv).unwrap();
        assert_eq!(doc, serde_json::json!({"name": "coffer", "version": env!("CARGO_PKG_VERSION")}));
        let plain = args(&["coffer", "--version"]);
        assert!(version_json(&Cli::try_parse_from(&plain).unwrap_err(), &plain).is_none());
        let help = args(&["coffer", "--help", "--json"]);
        assert!(version_json(&Cli::try_parse_from(&help).unwrap_err(), &help).is_none());
    }

    #[test]
    fn usage_errors_have_an_envelope_with_json() {
        let args = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let argv = args(&["coffer", "logs", "nosuch", "--json"]);
        let e = Cli::try_parse_from(&argv).unwrap_err();
        let env = clap_error_envelope(&e, &argv).unwrap();
        assert_eq!(env["error"]["code"], "INVALID_ARGUMENT");
        assert!(env["error"]["message"].as_str().unwrap().contains("nosuch"), "{env}");
        assert_eq!(env["error"]["details"]["value"], "nosuch");
        assert!(!env["error"]["message"].as_str().unwrap().contains('\n'), "{env}");
        assert!(env["error"]["details"]["valid"].as_array().unwrap().iter().any(|v| v == "gateway"), "{env}");
        let missing = args(&["coffer", "mcp", "add", "x", "--json"]);
        let env = clap_error_envelope(&Cli::try_parse_from(&missing).unwrap_err(), &missing).unwrap();
        let msg = env["error"]["message"].as_str().unwrap();
        assert!(msg.starts_with("the following required arguments were not provided: <COMMAND"), "{msg}");
        // Without --json (or with it after `--`), or for --help, nothing.
        let plain = args(&["coffer", "logs", "nosuch"]);
        assert!(clap_error_envelope(&Cli::try_parse_from(&plain).unwrap_err(), &plain).is_none());
        let after = args(&["coffer", "mcp", "add", "x", "--", "--json"]);
        let e = Cli::try_parse_from(args(&["coffer", "frobnicate"])).unwrap_err();
        assert!(clap_error_envelope(&e, &after).is_none());
        let help = args(&["coffer", "status", "--help", "--json"]);
        assert!(clap_error_envelope(&Cli::try_parse_from(&help).unwrap_err(), &help).is_none());
    }
}
