//! `coffer invocations`: who called which tool or prompt through the gateway, how long it took
//! and how it ended, from `GET /v1/invocations` (newest first; never arguments or results).
use clap::Args;
use clap::builder::PossibleValuesParser;
use serde_json::Value;

use crate::api::with_query;
use crate::context::Ctx;
use crate::error::CliError;
use crate::output::{self, cell, render_table};

/// Outcomes the store records (the gateway's `rest::logs::OUTCOMES`).
pub const OUTCOMES: &[&str] = &["ok", "upstream_error", "disabled", "timeout", "unreachable", "invalid", "cancelled"];

const EXAMPLES: &str = "\
Examples:
  coffer invocations
  coffer invocations --server everything --since 1h
  coffer invocations --tool everything__echo --outcome disabled --limit 10
  coffer invocations --actor mcp
  coffer invocations --client claude-code
  coffer invocations --since 2026-11-30 --until 2026-12-01T12:00:00Z --json

--since and --until take a duration ago (90s, 15m, 2h, 7d), a date (its midnight UTC) or an
RFC 3339 time. Times are shown in UTC. When more entries match than --limit, the last line on
stderr gives the --cursor for the next page.";

#[derive(Debug, Args)]
#[command(after_help = EXAMPLES)]
pub struct InvocationsArgs {
    /// Only calls to this server.
    #[arg(long, value_name = "SERVER")]
    pub server: Option<String>,
    /// Only calls of this tool or prompt (exposed name, e.g. everything__echo).
    #[arg(long, value_name = "NAME")]
    pub tool: Option<String>,
    /// Only calls that ended this way.
    #[arg(long, value_name = "OUTCOME", value_parser = PossibleValuesParser::new(OUTCOMES))]
    pub outcome: Option<String>,
    /// Only calls by this caller (mcp: MCP client sessions).
    #[arg(long, value_name = "ACTOR")]
    pub actor: Option<String>,
    /// Only calls by MCP clients of this name (their clientInfo name, exact, e.g. claude-code).
    #[arg(long, value_name = "NAME")]
    pub client: Option<String>,
    /// Only calls at or after this time (15m, 2h, 7d, 2026-11-30, RFC 3339).
    #[arg(long, value_name = "WHEN")]
    pub since: Option<String>,
    /// Only calls before this time (same forms as --since).
    #[arg(long, value_name = "WHEN")]
    pub until: Option<String>,
    /// How many entries to show (1-500).
    #[arg(long, value_name = "N", default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=500))]
    pub limit: u32,
    /// Continue after the entries already shown (the cursor the previous page printed).
    #[arg(long, value_name = "CURSOR")]
    pub cursor: Option<String>,
}

/// Prints one page of the invocation log.
///
/// # Errors
/// API errors (a `--since` that does not parse is exit 1 with the daemon's message), exit 5 when
/// the daemon cannot be reached.
pub async fn run(ctx: &Ctx, a: InvocationsArgs) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    let limit = a.limit.to_string();
    let path = with_query(
        "/v1/invocations",
        &[
            ("server", a.server.as_deref()),
            ("target", a.tool.as_deref()),
            ("outcome", a.outcome.as_deref()),
            ("actor", a.actor.as_deref()),
            ("client", a.client.as_deref()),
            ("since", a.since.as_deref()),
            ("until", a.until.as_deref()),
            ("limit", Some(&limit)),
            ("cursor", a.cursor.as_deref()),
        ],
    );
    let resp = api.get_raw(&path).await?;
    if ctx.json {
        return output::print_body(&resp.body);
    }
    let body = resp.json()?;
    let items = body["items"].as_array().map(Vec::as_slice).unwrap_or_default();
    if items.is_empty() {
        output::println("No invocations")?;
    } else {
        output::print(&render_invocations(items))?;
    }
    print_more(&body);
    Ok(())
}

/// An internal-agent run's usage as the USAGE column shows it:
/// `local/claude-x 1200+80 tok, 3 req` (connection/model, input+output tokens, model requests);
/// empty for a call that ran none.
pub fn usage_cell(usage: Option<&Value>) -> String {
    let Some(u) = usage.filter(|u| u.is_object()) else { return String::new() };
    let text = |k: &str| u[k].as_str().unwrap_or("").to_owned();
    let n = |k: &str| u[k].as_u64().unwrap_or(0);
    let who = output::truncate(&format!("{}/{}", text("connection"), text("model")), 60);
    format!("{who} {}+{} tok, {} req", n("input_tokens"), n("output_tokens"), n("iterations"))
}

/// The MCP client as the CLIENT column shows it: `name version` (`claude-code 2.1.0`); empty
/// for a call whose client named itself not at all, or for a broker session.
pub fn client_cell(client: Option<&Value>) -> String {
    let Some(c) = client.filter(|c| c.is_object()) else { return String::new() };
    let text = |k: &str| c[k].as_str().unwrap_or("").trim().to_owned();
    output::truncate(format!("{} {}", text("name"), text("version")).trim(), 40)
}

/// The invocations table: TIME (UTC) TARGET SERVER ACTOR CLIENT OUTCOME DURATION USAGE.
pub fn render_invocations(items: &[Value]) -> String {
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|i| {
            vec![
                i["at"].as_str().map_or_else(|| "-".into(), output::format_time),
                cell(i.get("target"), 80),
                cell(i.get("server"), 40),
                cell(i.get("actor"), 40),
                client_cell(i.get("client")),
                cell(i.get("outcome"), 20),
                i["duration_ms"].as_u64().map_or_else(|| "-".into(), |ms| format!("{ms} ms")),
                usage_cell(i.get("usage")),
            ]
        })
        .collect();
    render_table(&["TIME (UTC)", "TARGET", "SERVER", "ACTOR", "CLIENT", "OUTCOME", "DURATION", "USAGE"], &rows)
}

/// On stderr, how to get the next page when the body has a `next_cursor`.
pub fn print_more(body: &Value) {
    if let Some(c) = body["next_cursor"].as_str() {
        crate::eprintln_printable!("(more: repeat with --cursor {c})");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use serde_json::json;

    #[test]
    fn invocations_table() {
        let items = vec![
            json!({"id":5,"at":"2026-11-30T09:57:00.211Z","target":"everything__echo","method":"tools/call",
                   "server":"everything","session_id":"s","duration_ms":0,"outcome":"disabled","trace_id":"t",
                   "actor":"mcp","client":{"name":"claude-code","version":"2.1.0"}}),
            json!({"id":3,"at":"2026-11-30T09:57:00.176Z","target":"everything__get-sum","method":"tools/call",
                   "server":"everything","session_id":"s","duration_ms":1234,"outcome":"ok","trace_id":"t",
                   "actor":"channel:telegram"}),
        ];
        assert_eq!(
            render_invocations(&items),
            "TIME (UTC)           TARGET               SERVER      ACTOR             CLIENT             OUTCOME   DURATION  USAGE\n\
             2026-11-30 09:57:00  everything__echo     everything  mcp               claude-code 2.1.0  disabled  0 ms\n\
             2026-11-30 09:57:00  everything__get-sum  everything  channel:telegram                     ok        1234 ms\n"
        );
        let ask = vec![json!({"id":9,"at":"2026-11-30T09:57:01.000Z","target":"coffer__ask","method":"tools/call",
                   "server":"coffer","session_id":"s","duration_ms":2500,"outcome":"ok","trace_id":"t","actor":"mcp",
                   "usage":{"connection":"local","model":"m-1","input_tokens":1200,"output_tokens":80,"iterations":3}})];
        assert_eq!(
            render_invocations(&ask),
            "TIME (UTC)           TARGET       SERVER  ACTOR  CLIENT  OUTCOME  DURATION  USAGE\n\
             2026-11-30 09:57:01  coffer__ask  coffer  mcp            ok       2500 ms   local/m-1 1200+80 tok, 3 req\n"
        );
        assert_eq!(usage_cell(Some(&Value::Null)), "");
    }

    #[test]
    fn flags_are_checked_before_any_request() {
        let parse = |args: &[&str]| {
            let mut full = vec!["coffer", "invocations"];
            full.extend_from_slice(args);
            crate::Cli::try_parse_from(full)
        };
        assert!(
            parse(&["--outcome", "ok", "--since", "1h", "--limit", "500", "--actor", "mcp", "--client", "claude-code"])
                .is_ok()
        );
        for bad in [&["--outcome", "great"][..], &["--limit", "0"], &["--limit", "501"], &["--limit", "x"]] {
            assert_eq!(parse(bad).unwrap_err().exit_code(), 2, "{bad:?}");
        }
    }
}
