//! `coffer audit`: who changed what (servers, preferences, settings, credentials, backups,
//! channels) and
//! how it ended, from `GET /v1/audit`, newest first.
use clap::Args;
use clap::builder::PossibleValuesParser;
use coffer_api::Page;
use coffer_api::logs::AuditEntry;
use serde_json::Value;

use crate::api::with_query;
use crate::context::Ctx;
use crate::error::CliError;
use crate::output::{self, render_table_fitted, text_cell};

/// Actors the audit log records (the gateway's `rest::logs::AUDIT_ACTORS`).
pub const ACTORS: &[&str] = &["cli", "api", "ui", "mcp", "agent", "channel", "daemon"];

/// Actions the audit log records: the store's `rpc.rs`, `retention.rs` and `domain/channels.rs`,
/// the gateway's `rest/import.rs`, coffer-chat's channel bridge (`channel.refused`) and the store's `domain/sync_export.rs` (`sync.*`, applying a pulled vault) write them (an e2e test, `cli_output`, checks this list against them).
pub const ACTIONS: &[&str] = &[
    "server.create",
    "server.update",
    "server.enable",
    "server.disable",
    "server.remove",
    "capability.enable",
    "capability.disable",
    "settings.update",
    "credential.set",
    "credential.remove",
    "mcp.import",
    "backup.create",
    "maintenance.prune",
    "channel.create",
    "channel.update",
    "channel.remove",
    "channel.pair.start",
    "channel.pair",
    "channel.unpair",
    "channel.refused",
    "sync.apply",
    "sync.conflict",
];

const EXAMPLES: &str = "\
Examples:
  coffer audit
  coffer audit --actor cli --limit 10
  coffer audit --action server.create --json

Times are shown in UTC. When more entries match than --limit, the last line on stderr gives the
--cursor for the next page.";

#[derive(Debug, Args)]
#[command(after_help = EXAMPLES)]
pub struct AuditArgs {
    /// Only changes made by this party.
    #[arg(long, value_name = "ACTOR", value_parser = PossibleValuesParser::new(ACTORS))]
    pub actor: Option<String>,
    /// Only this action.
    #[arg(long, value_name = "ACTION", value_parser = PossibleValuesParser::new(ACTIONS))]
    pub action: Option<String>,
    /// How many entries to show (1-500).
    #[arg(long, value_name = "N", default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=500))]
    pub limit: u32,
    /// Continue after the entries already shown (the cursor the previous page printed).
    #[arg(long, value_name = "CURSOR")]
    pub cursor: Option<String>,
}

/// Prints one page of the audit log.
///
/// # Errors
/// API errors, exit 5 when the daemon cannot be reached.
pub async fn run(ctx: &Ctx, a: AuditArgs) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    let limit = a.limit.to_string();
    let path = with_query(
        "/v1/audit",
        &[
            ("actor", a.actor.as_deref()),
            ("action", a.action.as_deref()),
            ("limit", Some(&limit)),
            ("cursor", a.cursor.as_deref()),
        ],
    );
    let resp = api.get_raw(&path).await?;
    if ctx.json {
        return output::print_body(&resp.body);
    }
    let page: Page<AuditEntry> = resp.parse()?;
    if page.items.is_empty() {
        output::println("No audit entries")?;
    } else {
        output::print(&render_audit(&page.items, output::terminal_width()))?;
    }
    super::invocations::print_more(page.next_cursor.as_deref());
    Ok(())
}

/// The audit table: TIME (UTC) ACTOR AUTH ACTION TARGET OUTCOME DETAIL (compact JSON, cut to
/// `width`; `-` when empty). AUTH is how the request was authenticated, found by the daemon
/// (`token`, `session:<hash>`, `internal:<service>`); ACTOR only the label the client gave.
pub fn render_audit(items: &[AuditEntry], width: Option<usize>) -> String {
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|e| {
            let detail = match &e.detail {
                Value::Object(m) if m.is_empty() => "-".to_owned(),
                Value::Null => "-".to_owned(),
                Value::String(s) if s.trim().is_empty() => "-".to_owned(),
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            vec![
                output::format_time(&e.at),
                text_cell(&e.actor, 20),
                text_cell(&e.auth, 30),
                text_cell(&e.action, 40),
                text_cell(&e.target, 80),
                text_cell(&e.outcome, 20),
                detail,
            ]
        })
        .collect();
    render_table_fitted(&["TIME (UTC)", "ACTOR", "AUTH", "ACTION", "TARGET", "OUTCOME", "DETAIL"], &rows, width)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use serde_json::json;

    #[test]
    fn actions_are_checked_before_any_request() {
        let parse = |args: &[&str]| {
            let mut full = vec!["coffer", "audit"];
            full.extend_from_slice(args);
            crate::Cli::try_parse_from(full)
        };
        for a in ACTIONS {
            assert!(parse(&["--action", a]).is_ok(), "{a}");
        }
        let e = parse(&["--action", "server.delete"]).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        let msg = e.to_string();
        for a in ACTIONS {
            assert!(msg.contains(a), "{a} missing from {msg}");
        }
    }

    #[test]
    fn audit_table() {
        let items: Vec<AuditEntry> = serde_json::from_value(json!([
            {"id":2,"at":"2026-11-30T09:57:00.195Z","actor":"cli","action":"capability.disable",
                   "target":"everything/tool/echo","outcome":"ok","trace_id":"t","detail":{},"auth":"token"},
            {"id":1,"at":"2026-11-30T09:56:56.541Z","actor":"api","action":"server.update",
                   "target":"everything","outcome":"ok","trace_id":"t","detail":{"fields":["enabled"]},"auth":""},
        ]))
        .unwrap();
        assert_eq!(
            render_audit(&items, None),
            "TIME (UTC)           ACTOR  AUTH   ACTION              TARGET                OUTCOME  DETAIL\n\
             2026-11-30 09:57:00  cli    token  capability.disable  everything/tool/echo  ok       -\n\
             2026-11-30 09:56:56  api    -      server.update       everything            ok       {\"fields\":[\"enabled\"]}\n"
        );
    }
}
