//! `coffer sync [init REMOTE_URL | status]`: sync this machine's knowledge, memory, skills and
//! vault state (servers, preferences, settings, LLM connections, channels; credentials as names
//! only) with a git remote, over `/v1/sync*`. A sync that kept both versions of something, or
//! pulled a credential reference with no value here, exits 4 with the list: it needs the user.
use clap::{Args, Subcommand};
use coffer_api::sync::{Counts, SyncConflict, SyncInit, SyncReport, SyncStatus};
use serde_json::json;

use crate::context::Ctx;
use crate::error::{CliError, exit};
use crate::output;

const EXAMPLES: &str = "\
Examples:
  coffer sync init git@github.com:me/coffer-vault.git   # first machine: create and push
  coffer sync init git@github.com:me/coffer-vault.git   # second machine: adopt and merge
  coffer sync                                           # commit, pull, merge, apply, push
  coffer sync status --json
  coffer settings set sync.auto 1                       # the worker: debounced push, interval pull

Authentication is git's own (an SSH agent, a credential helper): Coffer never asks for or
stores a password. Exit 4 when a conflict kept both versions or a pulled credential has no
value here; 5xx/502 when the remote cannot be reached (local changes stay committed).";

/// Deadline of a sync request (a first push of thousands of notes).
pub const SYNC_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(900);

#[derive(Debug, Args)]
#[command(after_help = EXAMPLES, args_conflicts_with_subcommands = true)]
pub struct SyncArgs {
    #[command(subcommand)]
    pub command: Option<SyncCommand>,
}

#[derive(Debug, Subcommand)]
pub enum SyncCommand {
    /// Set up sync with a git remote (creates or adopts the sync repository, then syncs).
    Init {
        /// The git remote: https://…, ssh://…, git@host:path or file:///path.
        remote: String,
        /// This machine's name in the sync (commits, conflict files) [default: the host name
        /// with a random suffix, e.g. vm-3fa2].
        #[arg(long, value_name = "NAME")]
        machine_name: Option<String>,
    },
    /// Show ahead/behind, the last sync, conflicts, the worker and missing credentials.
    Status,
}

/// Runs `coffer sync …`.
///
/// # Errors
/// API errors (409 before `init`, 502 remote unreachable, 400 a malformed vault file pulled);
/// exit 4 after a sync that needs the user.
pub async fn run(ctx: &Ctx, args: SyncArgs) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    match args.command {
        Some(SyncCommand::Status) => {
            let resp = api.send(api.request(reqwest::Method::GET, "/v1/sync/status")).await?;
            let status: SyncStatus = resp.parse()?;
            if ctx.json {
                output::print_body(&resp.body)?;
            } else {
                output::print(&render_status(&status))?;
            }
            if needs_user(&status.conflicts, &status.missing_credentials) {
                Err(CliError::Quiet(exit::CONFLICT))
            } else {
                Ok(())
            }
        }
        cmd => {
            let req = match cmd {
                Some(SyncCommand::Init { remote, machine_name }) => {
                    api.request(reqwest::Method::POST, "/v1/sync/init").json(&SyncInit { remote, machine_name })
                }
                _ => api.request(reqwest::Method::POST, "/v1/sync").json(&json!({})),
            };
            let resp = api.send(req.timeout(SYNC_TIMEOUT)).await.map_err(|e| match e.api_code() {
                Some("CONFLICT") => e.with_hint("set sync up first: coffer sync init REMOTE_URL"),
                Some("UPSTREAM_UNAVAILABLE") => e.with_hint(
                    "check the remote and your git access (try `git ls-remote REMOTE_URL`); nothing was lost",
                ),
                _ => e,
            })?;
            let report: SyncReport = resp.parse()?;
            if ctx.json {
                output::print_body(&resp.body)?;
            } else {
                output::print(&render_report(&report))?;
            }
            if needs_user(&report.conflicts, &report.missing_credentials) {
                Err(CliError::Quiet(exit::CONFLICT))
            } else {
                Ok(())
            }
        }
    }
}

/// A conflict kept both versions, or a credential the vault references has no value here.
fn needs_user(conflicts: &[SyncConflict], missing_credentials: &[String]) -> bool {
    !conflicts.is_empty() || !missing_credentials.is_empty()
}

fn counts(c: &Counts) -> String {
    format!("{} added, {} changed, {} removed", c.added, c.changed, c.removed)
}

fn needs_user_lines(conflicts: &[SyncConflict], missing_credentials: &[String], out: &mut String) {
    if !conflicts.is_empty() {
        out.push_str("Conflicts (nothing was lost):\n");
        for x in conflicts {
            out.push_str(&format!("  {}: {}\n", x.path, x.detail));
        }
    }
    if !missing_credentials.is_empty() {
        out.push_str(
            "Credentials referenced by synced entries but not set on this machine — set this credential here:\n",
        );
        for name in missing_credentials {
            out.push_str(&format!("  {name}   (coffer credentials set {name})\n"));
        }
    }
}

/// The human report of a sync.
pub fn render_report(r: &SyncReport) -> String {
    let short: String = r.commit.chars().take(10).collect();
    let mut out = format!("Synced with {} ({short})\n", r.remote);
    for (label, d) in [("Pushed", &r.pushed), ("Pulled", &r.pulled)] {
        out.push_str(&format!("{label}: files {}; vault entries {}\n", counts(&d.files), counts(&d.vault)));
    }
    needs_user_lines(&r.conflicts, &r.missing_credentials, &mut out);
    out
}

/// The human sync status.
pub fn render_status(s: &SyncStatus) -> String {
    if !s.initialized {
        return "Sync is not set up on this machine: coffer sync init REMOTE_URL\n".into();
    }
    let mut out = format!(
        "Remote: {}\nMachine: {}\nAhead {}, behind {} (as of the last fetch)\nLast sync: {}\nWorker: {}{}\n",
        s.remote,
        s.machine,
        s.ahead,
        s.behind,
        s.last_sync_ms.map(coffer_runtime::rfc3339_from_unix_ms).unwrap_or_else(|| "never".into()),
        s.worker.word(),
        if s.failures > 0 { format!(" ({} failed attempts)", s.failures) } else { String::new() },
    );
    if let Some(e) = &s.last_error {
        out.push_str(&format!("Last error: {e}\n"));
    }
    needs_user_lines(&s.conflicts, &s.missing_credentials, &mut out);
    out
}
