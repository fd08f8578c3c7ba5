//! `coffer backup PATH`: asks the daemon (starting it if needed) to write a backup of this
//! home into a new or empty directory (`POST /v1/backup`), then says where it went and — loudly,
//! on stderr — that it holds `secret.key` when it does.
use std::path::PathBuf;

use clap::Args;
use serde_json::{Value, json};

use crate::context::Ctx;
use crate::error::CliError;
use crate::output;

const EXAMPLES: &str = "\
Examples:
  coffer backup ~/coffer-backups/2026-11-30
  coffer backup /mnt/usb/coffer --json

The directory is created 0700 (files 0600) and must not exist yet or be empty. It holds
coffer.db, knowledge/, memory/, skills/, secret.key and manifest.json; restore it with
`coffer restore PATH` while the daemon is stopped.";

/// Deadline of the backup request.
pub const BACKUP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3600);

#[derive(Debug, Args)]
#[command(after_help = EXAMPLES)]
pub struct BackupArgs {
    /// Directory to write the backup into: new, or empty (relative to the current directory).
    pub path: PathBuf,
}

/// The warning printed when a backup holds `secret.key`.
pub fn secret_key_warning(dir: &str) -> String {
    format!(
        "WARNING: this backup contains secret.key, the key that decrypts your stored credentials.\n\
         WARNING: anyone who can read {dir} can decrypt them. Keep it private (owner-only\n\
         WARNING: permissions are set) and store it encrypted; delete copies you do not need."
    )
}

/// Runs `coffer backup PATH`.
///
/// # Errors
/// API errors (an unusable or non-empty target: exit 1 or 4); exit 5 when the daemon cannot be
/// reached or started.
pub async fn run(ctx: &Ctx, args: BackupArgs) -> Result<(), CliError> {
    let path = std::path::absolute(&args.path)
        .map_err(|e| CliError::Usage(format!("cannot resolve {}: {e}", args.path.display())))?;
    let api = ctx.connect().await?;
    // Copying large markdown folders may take longer than an ordinary request may.
    let req = api.request(reqwest::Method::POST, "/v1/backup").json(&json!({"path": path})).timeout(BACKUP_TIMEOUT);
    let resp = api.send(req).await.map_err(|e| match e.api_code() {
        Some("ALREADY_EXISTS") => e.with_hint("give a directory that does not exist yet (or an empty one)"),
        _ => e,
    })?;
    let body = resp.json()?;
    let dir = body["path"].as_str().unwrap_or_default();
    // On stderr, also with --json: whoever runs this must see it.
    if body["secret_key_included"] == true {
        crate::eprintln_printable!("{}", secret_key_warning(dir));
    }
    if ctx.json {
        return output::print_body(&resp.body);
    }
    output::print(&render(&body))
}

/// The human report: where, how much, what was skipped.
pub fn render(body: &Value) -> String {
    let files = body["manifest"]["files"].as_array().map(Vec::as_slice).unwrap_or_default();
    let bytes: u64 = files.iter().filter_map(|f| f["bytes"].as_u64()).sum();
    let mut out = format!(
        "Backup written to {} ({} files, {})\n",
        body["path"].as_str().unwrap_or_default(),
        files.len(),
        human_bytes(bytes)
    );
    if let Some(skipped) = body["skipped"].as_array().filter(|s| !s.is_empty()) {
        out.push_str("Not copied (symlinks or special files):\n");
        for s in skipped {
            out.push_str(&format!("  {}\n", s.as_str().unwrap_or_default()));
        }
    }
    out
}

/// `1536` → `1.5 KiB`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} bytes");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_counts_files_and_lists_skipped() {
        let body = json!({
            "path": "/b/one",
            "manifest": {"files": [{"path": "coffer.db", "bytes": 4096}, {"path": "secret.key", "bytes": 32}]},
            "secret_key_included": true,
            "skipped": ["skills/link.md"],
        });
        assert_eq!(
            render(&body),
            "Backup written to /b/one (2 files, 4.0 KiB)\nNot copied (symlinks or special files):\n  skills/link.md\n"
        );
        assert!(secret_key_warning("/b/one").contains("/b/one can decrypt"));
        assert_eq!(human_bytes(10), "10 bytes");
        assert_eq!(human_bytes(3 * 1024 * 1024 + 1), "3.0 MiB");
    }
}
