//! `coffer tools list|enable|disable|call`: the aggregated tools every client sees, by their
//! exposed names (`<server>__<tool>`), over `/v1/tools…`. Calls go through the gateway's tool
//! broker (the CLI's own broker session, actor `cli`), so they obey the same routing and
//! enable/disable policy as `/mcp`, and the invocation log records them as the CLI's.
use std::time::Duration;

use clap::{Args, Subcommand};
use coffer_api::Page;
use coffer_api::servers::{Capabilities, McpServer};
use coffer_api::tools::{CallToolResult, EnabledFlag, Tool, ToolCall};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::api::{ApiClient, path_segment, with_query};
use crate::context::Ctx;
use crate::error::{CliError, exit};
use crate::output::{self, render_table_fitted, text_cell};

/// Client-side deadline of `tools call`. The gateway enforces each server's own timeout (at
/// most a day) and answers UPSTREAM_TIMEOUT; this only guards against a daemon that never
/// answers.
const CALL_TIMEOUT: Duration = Duration::from_secs(86_400 + 60);

/// The server name of Coffer's own `coffer__*` tools, which is not in the registry.
use coffer_types::BUILTIN_SERVER;

const LIST_EXAMPLES: &str = "\
Examples:
  coffer tools list
  coffer tools list --server everything
  coffer tools list --all          # also the tools of disabled servers (starts them)
  coffer tools list --json | jq -r '.items[] | select(.enabled) | .name'

Lists the tools of every enabled server (starting them if needed), enabled or not; a disabled
tool shows ENABLED `no`. Descriptions are cut to the terminal's width ($COLUMNS overrides).";

const CALL_EXAMPLES: &str = "\
Examples:
  coffer tools call everything__echo --args '{\"message\":\"hi\"}'
  coffer tools call everything__get-tiny-image --json
  coffer tools call fs__write_file --args @big-args.json     # arguments from a file
  jq -n '{message: \"hi\"}' | coffer tools call everything__echo --args -   # or from stdin

Prints text content as text and any other content block as one line of JSON; --json prints the
CallToolResult unchanged. Exits 1 when the tool reports an error (isError) or is disabled.";

#[derive(Debug, Subcommand)]
pub enum ToolsCommand {
    /// List the tools clients see, with their exposed and original names.
    #[command(after_help = LIST_EXAMPLES)]
    List(ListArgs),
    /// Enable a tool by its exposed name.
    #[command(after_help = "Example:\n  coffer tools enable everything__echo")]
    Enable(NameArg),
    /// Disable a tool by its exposed name: clients no longer see it and calls get TOOL_DISABLED.
    #[command(after_help = "Example:\n  coffer tools disable everything__echo")]
    Disable(NameArg),
    /// Call a tool by its exposed name and print its result.
    #[command(after_help = CALL_EXAMPLES)]
    Call(CallArgs),
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// Only this server's tools.
    #[arg(long, value_name = "SERVER")]
    pub server: Option<String>,
    /// Also list the tools of disabled servers (this starts them to ask).
    #[arg(long)]
    pub all: bool,
}

#[derive(Debug, Args)]
pub struct NameArg {
    /// The tool's exposed name, as `coffer tools list` shows it (`everything__echo`).
    pub name: String,
}

#[derive(Debug, Args)]
pub struct CallArgs {
    /// The tool's exposed name (`everything__echo`).
    pub name: String,
    /// The arguments: one JSON object, `@FILE` to read it from a file, or `-` to read it from
    /// stdin (for arguments too large for a command line).
    #[arg(long, value_name = "JSON|@FILE|-", value_parser = parse_arguments_source)]
    pub args: Option<ArgumentsSource>,
}

/// Where `--args` comes from. Inline JSON is checked when the command line is parsed; a file
/// or stdin is read and checked when the command runs.
#[derive(Debug, Clone)]
pub enum ArgumentsSource {
    Inline(Value),
    File(std::path::PathBuf),
    Stdin,
}

/// Most bytes `--args @FILE` or `--args -` reads: the REST body limit (2 MiB) holds the call.
const MAX_ARGUMENTS_BYTES: u64 = 2 * 1024 * 1024;

/// Parses `--args`: `-`, `@FILE` or inline JSON (checked by [`parse_arguments`]).
///
/// # Errors
/// A message naming the problem, which clap prints as a usage error (exit 2).
pub fn parse_arguments_source(s: &str) -> Result<ArgumentsSource, String> {
    if s == "-" {
        return Ok(ArgumentsSource::Stdin);
    }
    if let Some(path) = s.strip_prefix('@') {
        if path.is_empty() {
            return Err("@ must be followed by a file name, e.g. --args @args.json".into());
        }
        return Ok(ArgumentsSource::File(path.into()));
    }
    parse_arguments(s).map(ArgumentsSource::Inline)
}

impl ArgumentsSource {
    /// The arguments object, reading the file or stdin (at most 2 MiB).
    ///
    /// # Errors
    /// [`CliError::Usage`] (exit 2) naming the file or stdin and the problem: unreadable,
    /// too large, not JSON, not an object.
    pub fn read(self) -> Result<Value, CliError> {
        use std::io::Read;
        let (what, reader): (String, Box<dyn Read>) = match self {
            ArgumentsSource::Inline(v) => return Ok(v),
            ArgumentsSource::Stdin => ("stdin".into(), Box::new(std::io::stdin())),
            ArgumentsSource::File(p) => {
                let f = std::fs::File::open(&p)
                    .map_err(|e| CliError::Usage(format!("--args @{}: cannot read it ({e})", p.display())))?;
                (format!("@{}", p.display()), Box::new(f))
            }
        };
        let mut text = String::new();
        reader
            .take(MAX_ARGUMENTS_BYTES + 1)
            .read_to_string(&mut text)
            .map_err(|e| CliError::Usage(format!("--args {what}: cannot read it ({e})")))?;
        if text.len() as u64 > MAX_ARGUMENTS_BYTES {
            return Err(CliError::Usage(format!(
                "--args {what}: more than {} MiB of arguments (the daemon takes at most that)",
                MAX_ARGUMENTS_BYTES / (1024 * 1024)
            )));
        }
        parse_arguments(&text).map_err(|e| CliError::Usage(format!("--args {what}: {e}")))
    }
}

/// Runs one `coffer tools …` command.
///
/// # Errors
/// API errors (exit 3 unknown tool or server, 1 disabled or failed), exit 1 for a tool result
/// with `isError`, exit 5 when the daemon cannot be reached.
pub async fn run(ctx: &Ctx, cmd: ToolsCommand) -> Result<(), CliError> {
    match cmd {
        ToolsCommand::List(a) => list(ctx, a).await,
        ToolsCommand::Enable(a) => set_enabled(ctx, &a.name, true).await,
        ToolsCommand::Disable(a) => set_enabled(ctx, &a.name, false).await,
        ToolsCommand::Call(a) => call(ctx, a).await,
    }
}

/// Parses `--args`: a JSON object (MCP `tools/call` arguments are one).
///
/// # Errors
/// A message naming the problem, which clap prints as a usage error (exit 2).
pub fn parse_arguments(s: &str) -> Result<Value, String> {
    let v: Value = serde_json::from_str(s).map_err(|e| format!("not valid JSON ({e})"))?;
    if !v.is_object() {
        let kind = match v {
            Value::Null => "null",
            Value::Bool(_) => "a boolean",
            Value::Number(_) => "a number",
            Value::String(_) => "a string",
            Value::Array(_) => "an array",
            Value::Object(_) => unreachable!("checked"),
        };
        return Err(format!("the arguments must be a JSON object like {{\"key\":\"value\"}}, not {kind}"));
    }
    Ok(v)
}

// ---------------------------------------------------------------------------------------------
// list

async fn list(ctx: &Ctx, a: ListArgs) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    // `GET /v1/tools?server=` of an unknown server is just empty; ask the registry so a typo
    // exits 3 like `coffer mcp show` does. The built-in `coffer` server is not in it.
    if let Some(s) = a.server.as_deref().filter(|s| *s != BUILTIN_SERVER) {
        api.get(&format!("/v1/mcp/servers/{}", path_segment(s))).await?;
    }
    let resp = api.get_raw(&with_query("/v1/tools", &[("server", a.server.as_deref())])).await?;
    if ctx.json && !a.all {
        return output::print_body(&resp.body);
    }
    let mut items: Vec<ListedTool> =
        resp.parse::<Page<Tool>>()?.items.into_iter().map(|tool| ListedTool { tool, server_enabled: None }).collect();
    let servers = api.get_as::<Page<McpServer>>("/v1/mcp/servers").await?.items;
    let mut notes = Vec::new();
    for s in servers.iter().filter(|s| a.server.as_deref().is_none_or(|n| s.name == n)) {
        let (name, enabled) = (s.name.as_str(), s.enabled);
        if enabled && !items.iter().any(|t| t.tool.server == name) {
            notes.push(format!("note: no tools from {name}; `coffer mcp test {name}` shows why"));
        }
        if !enabled && a.all {
            match disabled_server_tools(&api, name).await {
                Ok(t) => items.extend(t),
                Err(e) => notes.push(format!("warning: cannot list the tools of disabled server {name}: {e}")),
            }
        } else if !enabled {
            notes.push(format!("note: server {name} is disabled; --all lists its tools too"));
        }
    }
    if ctx.json {
        // --all joins two kinds of REST bodies, so the document is built here, in the shape of
        // `GET /v1/tools` (items of disabled servers carry `"server_enabled": false`).
        output::print_json(&json!(Page::all(items)))?;
    } else if items.is_empty() {
        output::println("No tools")?;
    } else {
        output::print(&render_tools(&items, output::terminal_width()))?;
    }
    for n in notes {
        crate::eprintln_printable!("{n}");
    }
    Ok(())
}

/// A row of `coffer tools list`: a `GET /v1/tools` item, or (`--all`) a tool of a disabled
/// server, which carries `"server_enabled": false`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ListedTool {
    #[serde(flatten)]
    pub tool: Tool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_enabled: Option<bool>,
}

/// A disabled server's tools from its live capabilities, as `GET /v1/tools` items.
async fn disabled_server_tools(api: &ApiClient, server: &str) -> Result<Vec<ListedTool>, CliError> {
    let caps: Capabilities = api.get_as(&format!("/v1/mcp/servers/{}/capabilities", path_segment(server))).await?;
    Ok(caps
        .tools
        .into_iter()
        .map(|t| ListedTool {
            tool: Tool {
                name: t.exposed_name,
                server: server.to_owned(),
                original_name: t.name,
                title: None,
                description: t.description,
                enabled: t.enabled,
            },
            server_enabled: Some(false),
        })
        .collect())
}

/// The tools table: NAME SERVER ORIGINAL ENABLED DESCRIPTION (first line, cut to `width`).
/// ENABLED is `no (server)` for a tool of a disabled server.
pub fn render_tools(items: &[ListedTool], width: Option<usize>) -> String {
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|t| {
            let enabled = match (t.server_enabled, t.tool.enabled) {
                (Some(false), _) => "no (server)",
                (_, false) => "no",
                _ => "yes",
            };
            vec![
                text_cell(&t.tool.name, 80),
                text_cell(&t.tool.server, 40),
                text_cell(&t.tool.original_name, 80),
                enabled.to_owned(),
                first_line(t.tool.description.as_deref().unwrap_or_default()),
            ]
        })
        .collect();
    render_table_fitted(&["NAME", "SERVER", "ORIGINAL", "ENABLED", "DESCRIPTION"], &rows, width)
}

/// The first non-blank line of `s`, trimmed; `-` when there is none.
fn first_line(s: &str) -> String {
    s.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or("-").to_owned()
}

// ---------------------------------------------------------------------------------------------
// enable, disable

async fn set_enabled(ctx: &Ctx, name: &str, enabled: bool) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    let req = api.request(reqwest::Method::PATCH, &format!("/v1/tools/{}", path_segment(name)));
    let resp = api.send(req.json(&EnabledFlag { enabled })).await.map_err(|e| match e.api_code() {
        Some("NOT_FOUND") => e.with_hint("`coffer tools list` shows the exposed names"),
        _ => e,
    })?;
    if ctx.json {
        return output::print_body(&resp.body);
    }
    output::println(&if enabled {
        format!("Enabled {name}: clients can call it again")
    } else {
        format!("Disabled {name}: calls now get TOOL_DISABLED")
    })
}

// ---------------------------------------------------------------------------------------------
// call

async fn call(ctx: &Ctx, a: CallArgs) -> Result<(), CliError> {
    // Read the arguments before reaching the daemon: a bad file is a usage error either way.
    let arguments = a.args.map(ArgumentsSource::read).transpose()?;
    let api = ctx.connect().await?;
    let body = ToolCall { name: a.name.clone(), arguments: arguments.and_then(|v| v.as_object().cloned()) };
    let req = api.request(reqwest::Method::POST, "/v1/tools/call").timeout(CALL_TIMEOUT).json(&body);
    let resp = match api.send(req).await {
        Ok(r) => r,
        Err(e) => return Err(explain_call_error(&api, &a.name, e).await),
    };
    let CallToolResult(result) = resp.parse()?;
    // MCP's `CallToolResult`: a tool's own failure is `isError: true`.
    let is_error = result.get("isError") == Some(&Value::Bool(true));
    if ctx.json {
        output::print_body(&resp.body)?;
        return if is_error { Err(CliError::Quiet(exit::ERROR)) } else { Ok(()) };
    }
    let rendered = render_result(&Value::Object(result));
    if is_error {
        return Err(CliError::Failed(format!("{} reported an error: {}", a.name, rendered.trim_end())));
    }
    output::print(&rendered)
}

/// Adds what the user can do to a failed call. TOOL_DISABLED does not say whether the tool or
/// its whole server is off, so the registry is asked.
async fn explain_call_error(api: &ApiClient, name: &str, e: CliError) -> CliError {
    let server = e
        .api_details()
        .and_then(|d| d["server"].as_str())
        .map(str::to_owned)
        .or_else(|| name.split_once("__").map(|(s, _)| s.to_owned()))
        .unwrap_or_else(|| "SERVER".into());
    match e.api_code() {
        Some("TOOL_DISABLED") => {
            let server_off = server != BUILTIN_SERVER
                && api
                    .get_as::<McpServer>(&format!("/v1/mcp/servers/{}", path_segment(&server)))
                    .await
                    .is_ok_and(|s| !s.enabled);
            if server_off {
                e.with_hint(format!("its server is disabled; enable it with `coffer mcp enable {server}`"))
            } else {
                e.with_hint(format!("enable it with `coffer tools enable {name}`"))
            }
        }
        Some("NOT_FOUND") => e.with_hint("`coffer tools list` shows the exposed names"),
        Some("UPSTREAM_UNAVAILABLE" | "UPSTREAM_TIMEOUT") => {
            // An HTTP server has no stderr log to point at.
            let http = api
                .get_as::<McpServer>(&format!("/v1/mcp/servers/{}", path_segment(&server)))
                .await
                .is_ok_and(|s| s.transport.is_remote());
            if http {
                e.with_hint(format!("`coffer mcp test {server}` shows more; check that its URL answers"))
            } else {
                e.with_hint(format!("`coffer mcp test {server}` and `coffer mcp logs {server}` show more"))
            }
        }
        _ => e,
    }
}

/// A `CallToolResult` for people: each text content block as its text, any other block as one
/// line of JSON; `structuredContent` as JSON when there is no content.
pub fn render_result(result: &Value) -> String {
    let blocks = result["content"].as_array().map(Vec::as_slice).unwrap_or_default();
    let mut out = String::new();
    for b in blocks {
        match (b["type"].as_str(), b["text"].as_str()) {
            (Some("text"), Some(t)) => out.push_str(t),
            _ => out.push_str(&b.to_string()),
        }
        if !out.ends_with('\n') {
            out.push('\n');
        }
    }
    if blocks.is_empty()
        && let Some(s) = result.get("structuredContent").filter(|s| !s.is_null())
    {
        out.push_str(&s.to_string());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn arguments_must_be_a_json_object() {
        assert_eq!(parse_arguments(r#"{"message":"hi"}"#).unwrap(), json!({"message": "hi"}));
        assert_eq!(parse_arguments(" {} ").unwrap(), json!({}));
        let e = parse_arguments(r#"{"message":}"#).unwrap_err();
        assert!(e.starts_with("not valid JSON (") && e.contains("column"), "{e}");
        assert!(parse_arguments("[1]").unwrap_err().contains("not an array"));
        assert!(parse_arguments("\"hi\"").unwrap_err().contains("not a string"));
        assert!(parse_arguments("").unwrap_err().contains("not valid JSON"));
    }

    #[test]
    fn bad_arguments_are_a_usage_error() {
        let e = crate::Cli::try_parse_from(["coffer", "tools", "call", "x__y", "--args", "{nope"]).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        let msg = e.to_string();
        assert!(msg.contains("--args") && msg.contains("not valid JSON"), "{msg}");
    }

    #[test]
    fn tools_table() {
        let items: Vec<ListedTool> = serde_json::from_value(json!([
            {"name":"everything__echo","server":"everything","original_name":"echo","title":"Echo Tool",
                   "description":"Echoes back the input string\nSecond line","enabled":true},
            {"name":"everything__add","server":"everything","original_name":"add","title":null,
                   "description":null,"enabled":false},
            {"name":"off__x","server":"off","original_name":"x","title":null,"description":"  \n  Does x  ","enabled":true,
                   "server_enabled":false},
        ]))
        .unwrap();
        assert_eq!(
            render_tools(&items, None),
            "NAME              SERVER      ORIGINAL  ENABLED      DESCRIPTION\n\
             everything__echo  everything  echo      yes          Echoes back the input string\n\
             everything__add   everything  add       no           -\n\
             off__x            off         x         no (server)  Does x\n"
        );
        let narrow = render_tools(&items, Some(70));
        assert!(narrow.lines().all(|l| l.chars().count() <= 70), "{narrow}");
        assert!(narrow.contains("  Echoes back the …\n"), "{narrow}");
    }

    #[test]
    fn results_render_text_as_text_and_other_blocks_as_json() {
        let r = json!({"content":[
            {"type":"text","text":"Echo: hi"},
            {"type":"image","data":"AAA","mimeType":"image/png"},
            {"type":"text","text":"two\nlines\n"},
        ]});
        assert_eq!(
            render_result(&r),
            "Echo: hi\n{\"type\":\"image\",\"data\":\"AAA\",\"mimeType\":\"image/png\"}\ntwo\nlines\n"
        );
        assert_eq!(render_result(&json!({"content":[],"structuredContent":{"sum":3}})), "{\"sum\":3}\n");
        assert_eq!(render_result(&json!({})), "");
    }
}
