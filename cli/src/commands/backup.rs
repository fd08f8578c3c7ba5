//! `coffer backup PATH`: asks the daemon (starting it if needed) to write a backup of this
//! home into a new or empty directory (`POST /v1/backup`), then says where it went and — loudly,
//! on stderr — that it holds `secret.key` when it does.
use std::path::PathBuf;

use clap::Args;
use coffer_api::maintenance::{Backup, BackupRequest};

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
    let body = BackupRequest { path: path.display().to_string() };
    let req = api.request(reqwest::Method::POST, "/v1/backup").json(&body).timeout(BACKUP_TIMEOUT);
    let resp = api.send(req).await.map_err(|e| match e.api_code() {
        Some("ALREADY_EXISTS") => e.with_hint("give a directory that does not exist yet (or an empty one)"),
        _ => e,
    })?;
    let backup: Backup = resp.parse()?;
    // On stderr, also with --json: whoever runs this must see it.
    if backup.secret_key_included {
        crate::eprintln_printable!("{}", secret_key_warning(&backup.path));
    }
    if ctx.json {
        return output::print_body(&resp.body);
    }
    output::print(&render(&backup))
}

/// The human report: where, how much, what was skipped.
pub fn render(b: &Backup) -> String {
    let files = &b.manifest.files;
    let bytes: u64 = files.iter().map(|f| f.bytes).sum();
    let mut out = format!("Backup written to {} ({} files, {})\n", b.path, files.len(), human_bytes(bytes));
    if !b.skipped.is_empty() {
        out.push_str("Not copied (symlinks or special files):\n");
        for s in &b.skipped {
            out.push_str(&format!("  {s}\n"));
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
        let body: Backup = serde_json::from_value(serde_json::json!({
            "path": "/b/one",
            "manifest": {"format_version": 1, "coffer_version": "0.1.0", "created_at": "2026-12-06T00:00:00Z",
                "schema_version": 20, "files": [{"path": "coffer.db", "bytes": 4096, "sha256": "ab"},
                {"path": "secret.key", "bytes": 32, "sha256": "cd"}]},
            "secret_key_included": true,
            "skipped": ["skills/link.md"],
        }))
        .unwrap();
        assert_eq!(
            render(&body),
            "Backup written to /b/one (2 files, 4.0 KiB)\nNot copied (symlinks or special files):\n  skills/link.md\n"
        );
        assert!(secret_key_warning("/b/one").contains("/b/one can decrypt"));
        assert_eq!(human_bytes(10), "10 bytes");
        assert_eq!(human_bytes(3 * 1024 * 1024 + 1), "3.0 MiB");
    }
}
