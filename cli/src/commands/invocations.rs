//! `coffer invocations`: who called which tool or prompt through the gateway, how long it took
//! and how it ended, from `GET /v1/invocations` (newest first; never arguments or results).
use clap::Args;
use clap::builder::PossibleValuesParser;
use coffer_api::Page;
use coffer_api::logs::{Invocation, InvocationClient, InvocationUsage};

use crate::api::with_query;
use crate::context::Ctx;
use crate::error::CliError;
use crate::output::{self, render_table, text_cell};

/// Outcomes the store records (the gateway's `rest::logs::OUTCOMES`).
pub const OUTCOMES: &[&str] = &["ok", "upstream_error", "disabled", "timeout", "unreachable", "invalid", "cancelled"];

const EXAMPLES: &str = "\
Examples:
  coffer invocations
  coffer invocations --server everything --since 1h
  coffer invocations --tool everything__echo --outcome disabled --limit 10
  coffer invocations --actor mcp
  coffer invocations --client claude-code
  coffer invocations --conversation 0193c2d4e5f6
  coffer invocations --profile work
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
    /// Only calls made by the agent of this conversation (its id, as `coffer chat list` shows it).
    #[arg(long, value_name = "ID")]
    pub conversation: Option<String>,
    /// Only calls by MCP sessions of this profile (`default`: clients that named none).
    #[arg(long, value_name = "NAME")]
    pub profile: Option<String>,
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
            ("conversation", a.conversation.as_deref()),
            ("profile", a.profile.as_deref()),
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
    let page: Page<Invocation> = resp.parse()?;
    if page.items.is_empty() {
        output::println("No invocations")?;
    } else {
        output::print(&render_invocations(&page.items))?;
    }
    print_more(page.next_cursor.as_deref());
    Ok(())
}

/// An internal-agent run's usage as the USAGE column shows it:
/// `local/claude-x 1200+80 tok, 3 req` (connection/model, input+output tokens, model requests);
/// empty for a call that ran none.
pub fn usage_cell(usage: Option<&InvocationUsage>) -> String {
    let Some(u) = usage else { return String::new() };
    let who = output::truncate(&format!("{}/{}", u.connection, u.model), 60);
    format!("{who} {}+{} tok, {} req", u.input_tokens, u.output_tokens, u.iterations)
}

/// The MCP client as the CLIENT column shows it: `name version` (`claude-code 2.1.0`); empty
/// for a call whose client named itself not at all, or for a broker session.
pub fn client_cell(client: Option<&InvocationClient>) -> String {
    let Some(c) = client else { return String::new() };
    output::truncate(format!("{} {}", c.name.trim(), c.version.trim()).trim(), 40)
}

/// Who made a call as the CLIENT column shows it: `conversation "<title>"` (or its id when it has
/// no title) for an agent turn's call, else the MCP client ([`client_cell`]); followed by
/// `· profile NAME` when the session used a profile other than `default`.
pub fn caller_cell(i: &Invocation) -> String {
    let who = caller(i);
    match i.profile.as_deref() {
        Some(p) if p != coffer_api::profiles::DEFAULT_PROFILE && !p.is_empty() => {
            format!("{who} · profile {}", text_cell(p, 32)).trim().to_owned()
        }
        _ => who,
    }
}

fn caller(i: &Invocation) -> String {
    match &i.conversation {
        Some(c) if !c.title.trim().is_empty() => {
            format!("conversation \"{}\"", text_cell(c.title.trim(), 40))
        }
        Some(c) => format!("conversation {}", text_cell(&c.id, 40)),
        None => client_cell(i.client.as_ref()),
    }
}

/// The invocations table: TIME (UTC) TARGET SERVER ACTOR CLIENT OUTCOME DURATION USAGE.
pub fn render_invocations(items: &[Invocation]) -> String {
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|i| {
            vec![
                output::format_time(&i.at),
                text_cell(&i.target, 80),
                text_cell(&i.server, 40),
                text_cell(&i.actor, 40),
                caller_cell(i),
                text_cell(&i.outcome, 20),
                format!("{} ms", i.duration_ms),
                usage_cell(i.usage.as_ref()),
            ]
        })
        .collect();
    render_table(&["TIME (UTC)", "TARGET", "SERVER", "ACTOR", "CLIENT", "OUTCOME", "DURATION", "USAGE"], &rows)
}

/// On stderr, how to get the next page when a list answered a `next_cursor`.
pub fn print_more(next_cursor: Option<&str>) {
    if let Some(c) = next_cursor {
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
        let items: Vec<Invocation> = serde_json::from_value(json!([
            {"id":5,"at":"2026-11-30T09:57:00.211Z","target":"everything__echo","method":"tools/call",
                   "server":"everything","session_id":"s","duration_ms":0,"outcome":"disabled","trace_id":"t",
                   "actor":"mcp","client":{"name":"claude-code","version":"2.1.0"}},
            {"id":3,"at":"2026-11-30T09:57:00.176Z","target":"everything__get-sum","method":"tools/call",
                   "server":"everything","session_id":"s","duration_ms":1234,"outcome":"ok","trace_id":"t",
                   "actor":"channel:telegram"},
        ]))
        .unwrap();
        assert_eq!(
            render_invocations(&items),
            "TIME (UTC)           TARGET               SERVER      ACTOR             CLIENT             OUTCOME   DURATION  USAGE\n\
             2026-11-30 09:57:00  everything__echo     everything  mcp               claude-code 2.1.0  disabled  0 ms\n\
             2026-11-30 09:57:00  everything__get-sum  everything  channel:telegram                     ok        1234 ms\n"
        );
        let ask: Vec<Invocation> = serde_json::from_value(json!([{"id":9,"at":"2026-11-30T09:57:01.000Z","target":"coffer__ask","method":"tools/call",
                   "server":"coffer","session_id":"s","duration_ms":2500,"outcome":"ok","trace_id":"t","actor":"mcp",
                   "usage":{"connection":"local","model":"m-1","input_tokens":1200,"output_tokens":80,"iterations":3}}]))
        .unwrap();
        assert_eq!(
            render_invocations(&ask),
            "TIME (UTC)           TARGET       SERVER  ACTOR  CLIENT  OUTCOME  DURATION  USAGE\n\
             2026-11-30 09:57:01  coffer__ask  coffer  mcp            ok       2500 ms   local/m-1 1200+80 tok, 3 req\n"
        );
        assert_eq!(usage_cell(None), "");
        let mut agent = ask[0].clone();
        agent.conversation =
            Some(coffer_api::logs::InvocationConversation { id: "c1".into(), title: "Fix the deploy".into() });
        assert_eq!(caller_cell(&agent), "conversation \"Fix the deploy\"");
        agent.conversation = Some(coffer_api::logs::InvocationConversation { id: "c1".into(), title: String::new() });
        assert_eq!(caller_cell(&agent), "conversation c1");
        agent.profile = Some("work".into());
        assert_eq!(caller_cell(&agent), "conversation c1 · profile work");
        agent.profile = Some("default".into());
        assert_eq!(caller_cell(&agent), "conversation c1");
    }

    #[test]
    fn flags_are_checked_before_any_request() {
        let parse = |args: &[&str]| {
            let mut full = vec!["coffer", "invocations"];
            full.extend_from_slice(args);
            crate::Cli::try_parse_from(full)
        };
        assert!(
            parse(&[
                "--outcome",
                "ok",
                "--since",
                "1h",
                "--limit",
                "500",
                "--actor",
                "mcp",
                "--client",
                "claude-code",
                "--conversation",
                "c1",
                "--profile",
                "work"
            ])
            .is_ok()
        );
        for bad in [&["--outcome", "great"][..], &["--limit", "0"], &["--limit", "501"], &["--limit", "x"]] {
            assert_eq!(parse(bad).unwrap_err().exit_code(), 2, "{bad:?}");
        }
    }
}
