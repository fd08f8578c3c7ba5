//! `coffer mcp add|list|show|remove|enable|disable|refresh|test|logs` (`search` and `install` are
//! in `mcp_registry.rs`): the registry of upstream
//! MCP servers (`/v1/mcp/servers…`) and a look at one server's live capabilities and stderr.
//!
//! `add` resolves a stdio server's command here, against the user's `PATH` and current folder:
//! the daemon may run with another `PATH` and in another folder, so it is sent an absolute path.
//! `logs` reads `logs/upstreams/<name>.log` locally and never starts a daemon.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use clap::{ArgGroup, Args, Subcommand};
use coffer_api::Page;
use coffer_api::credentials::Credential;
use coffer_api::servers::{
    Capabilities, Capability, CredentialRef, EnvValue, McpServer, McpServerCreate, McpServerPatch, ProbeReport,
    Transport,
};
use coffer_api::tools::Refreshed;
use serde_json::{Value, json};

use crate::api::{ApiClient, path_segment};
use crate::commands::listed::Listed;
use crate::commands::logs::{Style, Tail};
use crate::context::Ctx;
use crate::error::CliError;
use crate::output::{self, format_ms_as_seconds, render_fields, render_table_fitted, shell_join, text_cell, yes_no};

const ADD_EXAMPLES: &str = "\
Examples:
  coffer mcp add everything -- npx -y @modelcontextprotocol/server-everything stdio
  coffer mcp add fs --env LOG_LEVEL=debug --timeout 30 -- ./bin/fs-server --root ~/notes
  coffer mcp add gh --env-credential GITHUB_TOKEN=github -- ./bin/github-server
  coffer mcp add remote --url https://mcp.example.com/mcp --header 'X-Team: a' \\
      --header-credential 'Authorization:remote-auth'
  coffer mcp add old --url https://legacy.example.com/events --transport sse

Secrets belong in the credential store (`coffer credentials set NAME`): --env-credential and
--header-credential send a reference to credential NAME, resolved only when the server starts; the
credential must exist. An --env or --header value written as a reference,
'{\"credential_ref\":\"NAME\"}', is read as one too (the same as the -credential flags).

A bare COMMAND must be on your PATH and on the daemon's, and is registered as given: each
machine (a synced registry reaches others) finds it on its PATH when the server starts. A
relative one is made absolute against the current folder, here. The server itself runs in --cwd,
by default its own folder, $COFFER_HOME/workspace/servers/NAME.";

const EDIT_EXAMPLES: &str = "\
Examples:
  coffer mcp edit fs -- npx -y @modelcontextprotocol/server-filesystem ~/notes
  coffer mcp edit fs --command /usr/local/bin/fs-server
  coffer mcp edit gh --env GITHUB_TOKEN=ghp_... --unset-env DEBUG
  coffer mcp edit web --url https://example.com/mcp --header 'X-Team: core' --timeout-ms 60000

Only what a flag names changes; the server keeps its name, transport, enabled state and tool
preferences. `-- COMMAND [ARGS]...` replaces the command and all its arguments; --command only
the command. --env and --header add or replace one variable or header; --unset-env and
--unset-header remove one. Secret-looking values go to the credential store as with `mcp add`.
The change is written only if nobody changed the server since it was read (else exit 4).";

const LIST_EXAMPLES: &str = "\
Examples:
  coffer mcp list
  coffer mcp list --json | jq -r '.items[].name'";

const SHOW_EXAMPLES: &str = "\
Examples:
  coffer mcp show everything
  coffer mcp show everything --capabilities   # also starts it and counts its tools and prompts";

const TEST_EXAMPLES: &str = "\
Examples:
  coffer mcp test everything
  coffer mcp test everything --json

Starts the server in a fresh session of its own (no cached lists), initializes it, counts its
tools, prompts and resources, and times it. Exits 1 with the server's error when it fails.";

const LOGS_EXAMPLES: &str = "\
Examples:
  coffer mcp logs everything
  coffer mcp logs everything -f -n 200

Prints what the server wrote on stderr, from $COFFER_HOME/logs/upstreams/NAME.log. Reads the
file only; never starts the daemon. With --json, one {\"server\",\"line\"} object per line.";

#[derive(Debug, Subcommand)]
pub enum McpCommand {
    /// Register an MCP server: a command to run (stdio) or a URL (Streamable HTTP).
    #[command(after_help = ADD_EXAMPLES)]
    Add(AddArgs),
    /// List the registered MCP servers.
    #[command(after_help = LIST_EXAMPLES)]
    List(NoArgs),
    /// Show one MCP server in full.
    #[command(after_help = SHOW_EXAMPLES)]
    Show(ShowArgs),
    /// Change a server's command, arguments, env, URL, headers, folder or timeout, keeping its
    /// tool preferences.
    #[command(after_help = EDIT_EXAMPLES)]
    Edit(EditArgs),
    /// Unregister an MCP server (its tool preferences go with it).
    #[command(after_help = "Example:\n  coffer mcp remove everything")]
    Remove(NameArg),
    /// Enable a server: its tools are offered to clients again.
    #[command(after_help = "Example:\n  coffer mcp enable everything")]
    Enable(NameArg),
    /// Disable a server: its tools disappear from clients' lists and calls get TOOL_DISABLED.
    #[command(after_help = "Example:\n  coffer mcp disable everything")]
    Disable(NameArg),
    /// Drop every session's cached tool and prompt lists; clients are told their lists changed.
    #[command(after_help = "Example:\n  coffer mcp refresh")]
    Refresh(NoArgs),
    /// Start a server in a fresh session, count its tools, prompts and resources, and time it.
    #[command(after_help = TEST_EXAMPLES)]
    Test(NameArg),
    /// Print (and follow) what a server wrote on stderr.
    #[command(after_help = LOGS_EXAMPLES)]
    Logs(McpLogsArgs),
    /// Register the MCP servers of a Claude Desktop, Claude Code, Cursor or VS Code config file.
    #[command(after_help = crate::commands::import::IMPORT_EXAMPLES)]
    Import(crate::commands::import::ImportArgs),
    /// Find servers in the MCP Registry.
    #[command(after_help = crate::commands::mcp_registry::SEARCH_EXAMPLES)]
    Search(crate::commands::mcp_registry::SearchArgs),
    /// Install a server from the MCP Registry: pick a package this machine can run (or a remote),
    /// ask for its inputs (secrets into the credential store), register it, wait for its tools.
    #[command(after_help = crate::commands::mcp_registry::INSTALL_EXAMPLES)]
    Install(crate::commands::mcp_registry::InstallArgs),
    /// Sign in to an HTTP server that uses OAuth (opens a browser), show or end the sign-in.
    #[command(after_help = crate::commands::mcp_auth::AUTH_EXAMPLES)]
    Auth(crate::commands::mcp_auth::AuthArgs),
}

#[derive(Debug, Args)]
pub struct NoArgs {}

#[derive(Debug, Args)]
pub struct NameArg {
    /// The server's name.
    pub name: String,
}

#[derive(Debug, Args)]
#[command(
    group(ArgGroup::new("target").required(true).args(["command", "url"])),
    override_usage = "coffer mcp add NAME [OPTIONS] -- COMMAND [ARGS]...\n       coffer mcp add NAME --url URL [--header KEY:VALUE]... [--header-credential KEY:CREDENTIAL]..."
)]
pub struct AddArgs {
    /// The server's name: 1-24 characters a-z, 0-9 and '-'. Its tools appear as NAME__TOOL.
    pub name: String,
    /// An environment variable for the server process (repeatable).
    #[arg(short, long = "env", value_name = "KEY=VALUE", value_parser = parse_env_pair, conflicts_with = "url")]
    pub env: Vec<(String, String)>,
    /// An environment variable set to the value of a stored credential (repeatable).
    #[arg(long = "env-credential", value_name = "KEY=CREDENTIAL", value_parser = parse_env_credential, conflicts_with = "url")]
    pub env_credentials: Vec<(String, String)>,
    /// The folder the server runs in [default: $COFFER_HOME/workspace/servers/NAME].
    #[arg(long, value_name = "DIR", conflicts_with = "url")]
    pub cwd: Option<PathBuf>,
    /// Per-call timeout in seconds [default: the gateway's].
    #[arg(long, value_name = "SECONDS", value_parser = parse_timeout_seconds)]
    pub timeout: Option<f64>,
    /// Register the server disabled.
    #[arg(long)]
    pub disabled: bool,
    /// Run the server without the vault sandbox: it can then read COFFER_HOME (secret.key,
    /// coffer.db, other servers' logs). Only for a server you trust that needs it.
    #[arg(long, conflicts_with = "url")]
    pub no_sandbox: bool,
    /// The URL of a Streamable HTTP server (instead of a command). A legacy HTTP+SSE server
    /// (MCP 2024-11-05) is detected: its URL ends in /sse, or it refuses the first POST.
    #[arg(long, value_name = "URL")]
    pub url: Option<String>,
    /// How to speak to the --url server: `http` (Streamable HTTP, the default) or `sse` (the
    /// legacy HTTP+SSE transport of MCP 2024-11-05, without detection).
    #[arg(long, value_name = "TRANSPORT", requires = "url", value_parser = ["http", "sse"])]
    pub transport: Option<String>,
    /// An HTTP header sent to the --url server (repeatable).
    #[arg(short = 'H', long = "header", value_name = "KEY:VALUE", value_parser = parse_header_pair, conflicts_with = "command")]
    pub headers: Vec<(String, String)>,
    /// An HTTP header set to the value of a stored credential (repeatable).
    #[arg(long = "header-credential", value_name = "KEY:CREDENTIAL", value_parser = parse_header_credential, conflicts_with = "command")]
    pub header_credentials: Vec<(String, String)>,
    /// Keep secret-looking --env/--header values in the registry as given, instead of moving
    /// them to the credential store (not recommended: `mcp show` prints them).
    #[arg(long)]
    pub keep_plaintext: bool,
    /// Keep secret-looking arguments (`--api-key ghp_…`, `--token=…`, a URL with a password) on
    /// the command line; without it they are refused (arguments are stored in plaintext, synced,
    /// and visible to every local user in `ps`: prefer --env-credential).
    #[arg(long)]
    pub allow_secret_args: bool,
    /// Return at once instead of waiting (up to 60 s) until the server has started and its
    /// capabilities are listed for MCP clients.
    #[arg(long)]
    pub no_wait: bool,
    /// When the --url server answers that it needs an OAuth sign-in, start it at once (as
    /// `coffer mcp auth NAME` does: opens a browser) instead of asking on a terminal.
    #[arg(long, requires = "url", conflicts_with_all = ["no_auth", "no_wait", "disabled"])]
    pub auth: bool,
    /// Never offer the sign-in: only say which command starts it.
    #[arg(long, requires = "url")]
    pub no_auth: bool,
    /// The command that starts a stdio server, and its arguments, after `--`.
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

#[derive(Debug, Args)]
#[command(override_usage = "coffer mcp edit NAME [OPTIONS] [-- COMMAND [ARGS]...]")]
pub struct EditArgs {
    /// The server's name.
    pub name: String,
    /// The new command, keeping the arguments (a stdio server).
    #[arg(long, value_name = "COMMAND")]
    pub command: Option<String>,
    /// Set an environment variable (repeatable; adds or replaces one).
    #[arg(short, long = "env", value_name = "KEY=VALUE", value_parser = parse_env_pair)]
    pub env: Vec<(String, String)>,
    /// Set an environment variable to the value of a stored credential (repeatable).
    #[arg(long = "env-credential", value_name = "KEY=CREDENTIAL", value_parser = parse_env_credential)]
    pub env_credentials: Vec<(String, String)>,
    /// Remove an environment variable (repeatable).
    #[arg(long = "unset-env", value_name = "KEY")]
    pub unset_env: Vec<String>,
    /// The new URL (a Streamable HTTP server).
    #[arg(long, value_name = "URL")]
    pub url: Option<String>,
    /// Set an HTTP header (repeatable; adds or replaces one).
    #[arg(short = 'H', long = "header", value_name = "KEY:VALUE", value_parser = parse_header_pair)]
    pub headers: Vec<(String, String)>,
    /// Set an HTTP header to the value of a stored credential (repeatable).
    #[arg(long = "header-credential", value_name = "KEY:CREDENTIAL", value_parser = parse_header_credential)]
    pub header_credentials: Vec<(String, String)>,
    /// Remove an HTTP header (repeatable).
    #[arg(long = "unset-header", value_name = "KEY")]
    pub unset_headers: Vec<String>,
    /// The folder the server runs in.
    #[arg(long, value_name = "DIR")]
    pub cwd: Option<PathBuf>,
    /// Per-call timeout in milliseconds; 0 restores the gateway's default.
    #[arg(long, value_name = "MS")]
    pub timeout_ms: Option<u64>,
    /// Run the server without the vault sandbox (it can then read COFFER_HOME).
    #[arg(long, conflicts_with = "sandbox")]
    pub no_sandbox: bool,
    /// Run the server in the vault sandbox again (the default).
    #[arg(long)]
    pub sandbox: bool,
    /// Keep secret-looking --env/--header values in the registry as given.
    #[arg(long)]
    pub keep_plaintext: bool,
    /// Return at once instead of waiting (up to 60 s) until the edited server has started and
    /// its capabilities are listed for MCP clients.
    #[arg(long)]
    pub no_wait: bool,
    /// Keep secret-looking arguments of the new command line as given (see `mcp add`).
    #[arg(long)]
    pub allow_secret_args: bool,
    /// The new command and all its arguments, after `--`.
    #[arg(last = true, value_name = "COMMAND")]
    pub new_command: Vec<String>,
}

#[derive(Debug, Args)]
pub struct ShowArgs {
    /// The server's name.
    pub name: String,
    /// Also list the server's live capabilities and count them (starts the server).
    #[arg(long)]
    pub capabilities: bool,
}

#[derive(Debug, Args)]
pub struct McpLogsArgs {
    /// The server's name.
    pub name: String,
    /// Keep printing lines as they are written (Ctrl-C to stop).
    #[arg(short, long)]
    pub follow: bool,
    /// How many of the last lines to print first.
    #[arg(short = 'n', long = "lines", value_name = "N", default_value_t = 50)]
    pub lines: usize,
}

/// Runs one `coffer mcp …` command.
///
/// # Errors
/// API errors (exit 3 unknown server, 4 duplicate, 1 rejected), a command that cannot be resolved
/// (exit 1), exit 5 when the daemon cannot be reached.
pub async fn run(ctx: &Ctx, cmd: McpCommand) -> Result<(), CliError> {
    match cmd {
        McpCommand::Add(a) => add(ctx, a).await,
        McpCommand::List(_) => list(ctx).await,
        McpCommand::Show(a) => show(ctx, a).await,
        McpCommand::Edit(a) => edit(ctx, a).await,
        McpCommand::Remove(a) => remove(ctx, &a.name).await,
        McpCommand::Enable(a) => set_enabled(ctx, &a.name, true).await,
        McpCommand::Disable(a) => set_enabled(ctx, &a.name, false).await,
        McpCommand::Refresh(_) => refresh(ctx).await,
        McpCommand::Test(a) => test(ctx, &a.name).await,
        McpCommand::Logs(a) => logs(ctx, a).await,
        McpCommand::Import(a) => crate::commands::import::run(ctx, a).await,
        McpCommand::Search(a) => crate::commands::mcp_registry::search(ctx, a).await,
        McpCommand::Install(a) => crate::commands::mcp_registry::install(ctx, a).await,
        McpCommand::Auth(a) => crate::commands::mcp_auth::run(ctx, a).await,
    }
}

fn server_path(name: &str) -> String {
    format!("/v1/mcp/servers/{}", path_segment(name))
}

// ---------------------------------------------------------------------------------------------
// add

async fn add(ctx: &Ctx, a: AddArgs) -> Result<(), CliError> {
    let body = add_body(&a, &current_dir()?, coffer_runtime::connect::which_on_path)?;
    if a.url.is_none() && a.cwd.is_none() {
        for arg in a.command.iter().skip(1).filter(|x| looks_relative(x)) {
            crate::eprintln_printable!(
                "warning: argument {arg} is a relative path, but the server runs in {}; pass --cwd or an absolute path",
                ctx.home.root().join("workspace").join("servers").join(&a.name).display()
            );
        }
    }
    let mut body = body;
    let api = ctx.connect().await?;
    let moved = if a.keep_plaintext {
        Vec::new()
    } else {
        move_secrets(&api, &a.name, &mut [("--env", &mut body.env), ("--header", &mut body.headers)]).await?
    };
    let created = api.send(api.request(reqwest::Method::POST, "/v1/mcp/servers").json(&body)).await;
    let resp = match created {
        Ok(r) => r,
        Err(e) => {
            // Nothing of a failed add stays behind: not the credentials made for it either.
            remove_credentials(&api, &moved).await;
            // A reference to a credential that does not exist (400, details {"credential": NAME}).
            return Err(match e.api_details().and_then(|d| d["credential"].as_str()).map(str::to_owned) {
                Some(c) => e.with_hint(format!("store it first: printf %s \"$VALUE\" | coffer credentials set {c}")),
                None => e,
            });
        }
    };
    note_moved(&moved);
    let s: McpServer = resp.parse()?;
    let name = s.name.clone();
    let enabled = s.enabled;
    // A client started right after this command is offered the server's tools on its first list.
    let listed = if enabled && !a.no_wait {
        crate::commands::listed::wait(&api, std::slice::from_ref(&name), crate::commands::listed::WAIT).await.pop()
    } else {
        None
    };
    if ctx.json {
        if let Some(l) = listed {
            // The daemon's body with the catalog's state of the server added.
            let mut body = resp.json()?;
            body["catalog"] = l.state;
            return output::print_json(&body);
        }
        return output::print_body(&resp.body);
    }
    let state = if enabled { "" } else { ", disabled" };
    let mut out = format!("Added MCP server {name}{state} ({}: {})\n", s.transport.word(), target(&s));
    let mut needs_sign_in = false;
    if let Some(l) = &listed {
        crate::commands::listed::report(&mut out, l);
        if let Some(hint) = crate::commands::mcp_auth::sign_in_hint(&name, &l.state.to_string()) {
            out.push_str(&hint);
            needs_sign_in = true;
        }
    }
    let failed = listed.as_ref().is_some_and(Listed::failed);
    if !enabled {
        out.push_str(&format!("Enable it with: coffer mcp enable {name}\n"));
    } else if !failed {
        out.push_str(&format!("See its tools: coffer tools list --server {name}\n"));
    } else if !needs_sign_in {
        out.push_str(&format!("See why: coffer mcp test {name} (and coffer mcp logs {name})\n"));
    }
    output::print(&out)?;
    if needs_sign_in && crate::commands::mcp_auth::offer_sign_in(&name, a.auth, a.no_auth)? {
        return crate::commands::mcp_auth::run(ctx, crate::commands::mcp_auth::AuthArgs::new(name)).await;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// edit

async fn edit(ctx: &Ctx, a: EditArgs) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    let cur: McpServer = api.get_as(&server_path(&a.name)).await?;
    let (mut body, mut fresh) = edit_body(&a, &cur, &current_dir()?, coffer_runtime::connect::which_on_path)?;
    let moved = if a.keep_plaintext {
        Vec::new()
    } else {
        move_secrets(&api, &a.name, &mut [("--env", &mut fresh.env), ("--header", &mut fresh.headers)]).await?
    };
    if !fresh.env.is_empty() {
        body.env.get_or_insert_default().extend(fresh.env);
    }
    if !fresh.headers.is_empty() {
        body.headers.get_or_insert_default().extend(fresh.headers);
    }
    let version = cur.version;
    let patch = api
        .request(reqwest::Method::PATCH, &server_path(&a.name))
        .header("If-Match", format!("\"{version}\""))
        .json(&body);
    let resp = match api.send(patch).await {
        Ok(r) => r,
        Err(e) => {
            remove_credentials(&api, &moved).await;
            return Err(e);
        }
    };
    note_moved(&moved);
    let s: McpServer = resp.parse()?;
    // The registry keeps its version when the patch changed nothing.
    if s.version == version {
        return Err(CliError::Usage(format!("nothing to change: {} already has these settings", s.name)));
    }
    // As after `mcp add`: a client started right after this command is offered the edited
    // server's tools on its first list (also right after a restart).
    let enabled = s.enabled;
    let listed = if enabled && !a.no_wait {
        crate::commands::listed::wait(&api, std::slice::from_ref(&a.name), crate::commands::listed::WAIT).await.pop()
    } else {
        None
    };
    if ctx.json {
        let mut body = resp.json()?;
        if let Some(l) = listed {
            body["catalog"] = l.state;
        }
        return output::print_json(&body);
    }
    let mut out = format!(
        "Updated MCP server {} ({}: {}); its tool preferences are kept\n",
        s.name,
        s.transport.word(),
        target(&s)
    );
    if let Some(l) = &listed {
        crate::commands::listed::report(&mut out, l);
    }
    output::print(&out)
}

/// The `PATCH /v1/mcp/servers/{name}` body for `a` over the server as it is now (`cur`, its
/// GET body), and apart from it the new `env`/`headers` values given as literals (for the
/// caller to move secret-looking ones into credentials before merging them into the body).
/// `env` and `headers` are sent whole (the current map with `--unset-*` removed and the new
/// values set), since PATCH replaces a map.
///
/// # Errors
/// [`CliError::Usage`] (exit 2) when nothing would change, for `--unset-*` of a key the server
/// does not have, or a flag that does not fit the server's transport; [`CliError::Failed`] when
/// the command or `--cwd` does not resolve.
fn edit_body(
    a: &EditArgs,
    cur: &McpServer,
    cwd: &Path,
    lookup: impl Fn(&str) -> Option<PathBuf>,
) -> Result<(McpServerPatch, Fresh), CliError> {
    let stdio = cur.transport == Transport::Stdio;
    let misplaced: &[(&str, bool)] = if stdio {
        &[
            ("--url", a.url.is_some()),
            ("--header", !a.headers.is_empty() || !a.header_credentials.is_empty()),
            ("--unset-header", !a.unset_headers.is_empty()),
        ]
    } else {
        &[
            ("--command", a.command.is_some() || !a.new_command.is_empty()),
            ("--env", !a.env.is_empty() || !a.env_credentials.is_empty()),
            ("--unset-env", !a.unset_env.is_empty()),
            ("--cwd", a.cwd.is_some()),
            ("--no-sandbox", a.no_sandbox),
            ("--sandbox", a.sandbox),
        ]
    };
    if let Some((flag, _)) = misplaced.iter().find(|m| m.1) {
        return Err(CliError::Usage(format!(
            "{flag} does not apply to {}, a {} server",
            cur.name,
            cur.transport.word()
        )));
    }
    if a.command.is_some() && !a.new_command.is_empty() {
        return Err(CliError::Usage("give either --command or -- COMMAND [ARGS]..., not both".into()));
    }
    let mut body = McpServerPatch::default();
    let mut fresh = Fresh::default();
    if let Some(cmd) = a.command.as_ref().or(a.new_command.first()) {
        body.command = Some(command_to_register(cmd, cwd, &lookup).map_err(CliError::Failed)?);
    }
    if !a.new_command.is_empty() {
        body.args = Some(a.new_command[1..].to_vec());
        body.allow_secret_args = a.allow_secret_args;
    }
    for (field, flag, set, credentials, unset, ignore_case) in [
        ("env", "--env", &a.env, &a.env_credentials, &a.unset_env, false),
        ("headers", "--header", &a.headers, &a.header_credentials, &a.unset_headers, true),
    ] {
        if set.is_empty() && credentials.is_empty() && unset.is_empty() {
            continue;
        }
        let (current, fresh_map) =
            if field == "env" { (&cur.env, &mut fresh.env) } else { (&cur.headers, &mut fresh.headers) };
        let mut map = current.clone();
        for key in unset {
            let found = map.keys().find(|k| if ignore_case { k.eq_ignore_ascii_case(key) } else { *k == key }).cloned();
            match found {
                Some(k) => {
                    map.remove(&k);
                }
                None => {
                    return Err(CliError::Usage(format!("{} has no {field} {key:?} to unset", cur.name)));
                }
            }
        }
        let new = wire_map(flag, set, credentials, ignore_case)?;
        if ignore_case {
            map.retain(|k, _| !new.keys().any(|n| n.eq_ignore_ascii_case(k)));
        }
        for (k, v) in new {
            map.remove(&k);
            match v {
                EnvValue::Literal(_) => {
                    fresh_map.insert(k, v);
                }
                EnvValue::Ref(_) => {
                    map.insert(k, v);
                }
            }
        }
        if field == "env" {
            body.env = Some(map);
        } else {
            body.headers = Some(map);
        }
    }
    body.url.clone_from(&a.url);
    if let Some(dir) = &a.cwd {
        body.cwd = Some(Some(resolve_dir(dir, cwd).map_err(CliError::Failed)?.to_string_lossy().into_owned()));
    }
    body.timeout_ms = a.timeout_ms.map(|ms| (ms != 0).then_some(ms));
    if a.no_sandbox || a.sandbox {
        body.sandbox = Some(a.sandbox);
    }
    if body == McpServerPatch::default() && fresh.env.is_empty() && fresh.headers.is_empty() {
        return Err(CliError::Usage(
            "nothing to change: give -- COMMAND [ARGS]..., --command, --env, --unset-env, --url, --header, \
             --unset-header, --cwd, --timeout-ms, --no-sandbox or --sandbox"
                .into(),
        ));
    }
    Ok((body, fresh))
}

/// The literal `env`/`headers` values an edit sets, kept apart from its PATCH body until the
/// secret-looking ones are moved to the credential store ([`move_secrets`]).
#[derive(Debug, Default, PartialEq)]
struct Fresh {
    env: BTreeMap<String, EnvValue>,
    headers: BTreeMap<String, EnvValue>,
}

/// On stderr, one note per value [`move_secrets`] moved to the credential store.
fn note_moved(moved: &[Moved]) {
    for m in moved {
        crate::eprintln_printable!(
            "note: the value of {} {} looks like a secret: it went to the credential store as {} and the server \
             references it (--keep-plaintext keeps such values as given)",
            m.flag,
            m.key,
            m.credential
        );
    }
}

/// A secret-looking `--env`/`--header` value that `mcp add` stored as a credential.
struct Moved {
    flag: &'static str,
    key: String,
    credential: String,
}

/// Moves every secret-looking literal value of `body`'s `env` and `headers`
/// ([`coffer_types::secrets::is_secret`], the rule `mcp import` follows) into a new credential
/// `<server>-<KEY>` (with a `-2`… suffix rather than replacing an existing credential), and
/// replaces it in `body` by a reference. Returns what it moved, for the caller to report (and to
/// remove again if the server cannot be added).
///
/// # Errors
/// API errors listing or storing credentials.
async fn move_secrets(
    api: &ApiClient,
    server: &str,
    maps: &mut [(&'static str, &mut BTreeMap<String, EnvValue>)],
) -> Result<Vec<Moved>, CliError> {
    use coffer_types::secrets::{MAX_CREDENTIAL_NAME, credential_name, is_secret, unique};
    let mut found = Vec::new();
    for (i, (flag, map)) in maps.iter().enumerate() {
        for (k, v) in map.iter() {
            if let EnvValue::Literal(v) = v
                && is_secret(k, v)
            {
                found.push((i, *flag, k.clone(), v.clone()));
            }
        }
    }
    if found.is_empty() {
        return Ok(Vec::new());
    }
    let listed = api.get_as::<Page<Credential>>("/v1/credentials").await?;
    let mut taken: std::collections::BTreeSet<String> = listed.items.into_iter().map(|c| c.name).collect();
    let mut moved = Vec::new();
    for (i, flag, key, value) in found {
        let base = credential_name(server, &key);
        // Create only (`If-None-Match: *`): another `mcp add` racing for the same free name gets
        // ALREADY_EXISTS and takes the next one, so neither replaces (nor later removes) the
        // other's secret.
        let mut attempts = 0;
        let credential = loop {
            let credential = if taken.contains(&base) {
                unique(&base, MAX_CREDENTIAL_NAME, |n| taken.contains(n))
            } else {
                base.clone()
            };
            let put = api
                .request(reqwest::Method::PUT, &format!("/v1/credentials/{}", path_segment(&credential)))
                .header(reqwest::header::IF_NONE_MATCH, "*")
                .json(&coffer_api::credentials::CredentialPut { value: value.clone() });
            match api.send(put).await {
                Ok(_) => break credential,
                Err(e) if e.api_code() == Some("ALREADY_EXISTS") && attempts < 20 => {
                    attempts += 1;
                    taken.insert(credential);
                }
                Err(e) => {
                    remove_credentials(api, &moved).await;
                    return Err(e);
                }
            }
        };
        taken.insert(credential.clone());
        maps[i].1.insert(key.clone(), EnvValue::Ref(CredentialRef { credential_ref: credential.clone() }));
        moved.push(Moved { flag, key, credential });
    }
    Ok(moved)
}

/// Best effort: deletes the credentials `mcp add` made, after the add failed.
async fn remove_credentials(api: &ApiClient, moved: &[Moved]) {
    for m in moved {
        let path = format!("/v1/credentials/{}", path_segment(&m.credential));
        let _ = api.send(api.request(reqwest::Method::DELETE, &path)).await;
    }
}

/// The `POST /v1/mcp/servers` body for `a`, with a stdio command resolved against `cwd` and
/// `lookup` (the user's `PATH`) and `--cwd` made absolute. `--env-credential` and
/// `--header-credential` become `{"credential_ref": NAME}` values, like literal values written
/// that way.
///
/// # Errors
/// [`CliError::Failed`] (exit 1) when the command or `--cwd` does not name what it should;
/// [`CliError::Usage`] (exit 2) for a key given both as a literal and as a credential, or a
/// literal that looks like a malformed reference.
fn add_body(a: &AddArgs, cwd: &Path, lookup: impl Fn(&str) -> Option<PathBuf>) -> Result<McpServerCreate, CliError> {
    let mut body = McpServerCreate {
        name: a.name.clone(),
        transport: None,
        command: None,
        args: Vec::new(),
        env: BTreeMap::new(),
        cwd: None,
        url: None,
        headers: BTreeMap::new(),
        enabled: a.disabled.then_some(false),
        timeout_s: a.timeout,
        timeout_ms: None,
        allow_secret_args: a.allow_secret_args,
        sandbox: None,
    };
    if let Some(url) = &a.url {
        body.transport = Some(a.transport.clone().unwrap_or_else(|| "http".into()));
        body.url = Some(url.clone());
        body.headers = wire_map("--header", &a.headers, &a.header_credentials, true)?;
    } else {
        let (cmd, args) = a.command.split_first().ok_or_else(|| CliError::Usage("give a command after --".into()))?;
        body.transport = Some("stdio".into());
        body.command = Some(command_to_register(cmd, cwd, lookup).map_err(CliError::Failed)?);
        body.args = args.to_vec();
        body.env = wire_map("--env", &a.env, &a.env_credentials, false)?;
        if let Some(dir) = &a.cwd {
            body.cwd = Some(resolve_dir(dir, cwd).map_err(CliError::Failed)?.to_string_lossy().into_owned());
        }
        if a.no_sandbox {
            body.sandbox = Some(false);
        }
    }
    Ok(body)
}

/// The REST `env` or `headers` map: `literals` (a later one wins over an earlier one with the same
/// key) as strings — or as references when written as one ([`literal_value`]) — and
/// `credentials` as `{"credential_ref": NAME}`. `ignore_case` compares keys case-insensitively
/// (header names).
///
/// # Errors
/// [`CliError::Usage`] when a key is given both as a literal and as a credential, or for a
/// malformed reference.
fn wire_map(
    flag: &str,
    literals: &[(String, String)],
    credentials: &[(String, String)],
    ignore_case: bool,
) -> Result<BTreeMap<String, EnvValue>, CliError> {
    let norm = |k: &str| if ignore_case { k.to_ascii_lowercase() } else { k.to_owned() };
    let mut map: BTreeMap<String, (String, EnvValue)> = BTreeMap::new();
    for (k, v) in literals {
        map.insert(norm(k), (k.clone(), literal_value(flag, k, v)?));
    }
    let mut refs: BTreeMap<String, (String, EnvValue)> = BTreeMap::new();
    for (k, name) in credentials {
        if map.contains_key(&norm(k)) {
            return Err(CliError::Usage(format!("{k} is given both with {flag} and with {flag}-credential; keep one")));
        }
        refs.insert(norm(k), (k.clone(), EnvValue::Ref(CredentialRef { credential_ref: name.clone() })));
    }
    map.extend(refs);
    Ok(map.into_values().collect())
}

/// A literal `--env`/`--header` value as sent: a string, or a credential reference when the
/// value is exactly a reference object, `{"credential_ref":"NAME"}` (what the docs show on the
/// wire, so a user following them gets what they meant).
///
/// # Errors
/// [`CliError::Usage`] for a JSON object that mentions `credential_ref` but is not exactly a
/// reference to a valid credential name, pointing at `{flag}-credential`.
pub fn literal_value(flag: &str, key: &str, value: &str) -> Result<EnvValue, CliError> {
    let Ok(Value::Object(obj)) = serde_json::from_str::<Value>(value.trim()) else {
        return Ok(EnvValue::Literal(value.to_owned()));
    };
    if !obj.contains_key("credential_ref") {
        return Ok(EnvValue::Literal(value.to_owned()));
    }
    let sep = if flag == "--env" { "=" } else { ":" };
    match (obj.len(), obj.get("credential_ref").and_then(Value::as_str)) {
        (1, Some(name)) if crate::commands::credentials::parse_name(name).is_ok() => {
            Ok(EnvValue::Ref(CredentialRef { credential_ref: name.to_owned() }))
        }
        _ => Err(CliError::Usage(format!(
            "{flag} {key}{sep}{value} is not a credential reference; use {flag}-credential {key}{sep}NAME to reference \
             credential NAME"
        ))),
    }
}

fn current_dir() -> Result<PathBuf, CliError> {
    std::env::current_dir().map_err(|e| CliError::Failed(format!("cannot read the current folder: {e}")))
}

/// The command of a stdio server as it is registered: a bare name (`npx`) as given, once
/// `lookup` (the user's `PATH`) finds it (each machine a synced registry reaches resolves it on
/// its own `PATH` when the server starts), a path as [`resolve_command`] makes it absolute.
///
/// # Errors
/// As [`resolve_command`].
pub fn command_to_register(cmd: &str, cwd: &Path, lookup: impl Fn(&str) -> Option<PathBuf>) -> Result<String, String> {
    let resolved = resolve_command(cmd, cwd, lookup)?;
    if cmd.contains('/') { Ok(resolved.to_string_lossy().into_owned()) } else { Ok(cmd.to_owned()) }
}

/// Resolves the command of a stdio server to an absolute path of an executable file: a bare
/// name (`npx`) through `lookup` (the user's `PATH`), a path with a `/` against `cwd`. `.`
/// components are dropped; symlinks are kept, so a versioned install behind one still upgrades.
///
/// # Errors
/// A message naming the command and what is wrong with it.
pub fn resolve_command(cmd: &str, cwd: &Path, lookup: impl Fn(&str) -> Option<PathBuf>) -> Result<PathBuf, String> {
    if cmd.trim().is_empty() {
        return Err("the command is empty".into());
    }
    let path = if cmd.contains('/') {
        cwd.join(cmd)
    } else {
        match lookup(cmd) {
            // A relative PATH entry (`.`, `bin`) is relative to the current folder too.
            Some(p) => cwd.join(p),
            None => {
                return Err(format!(
                    "command {cmd:?} not found on your PATH; give its path (./{cmd} or /abs/path/{cmd})"
                ));
            }
        }
    };
    let path = std::path::absolute(&path).unwrap_or(path);
    let shown = path.display();
    match std::fs::metadata(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(format!("command {shown} does not exist")),
        Err(e) => Err(format!("cannot inspect command {shown}: {e}")),
        Ok(m) if !m.is_file() => Err(format!("command {shown} is not a file")),
        Ok(m) if !is_executable(&m) => Err(format!("command {shown} is not executable (chmod +x?)")),
        Ok(_) => Ok(path),
    }
}

/// `--cwd` as an absolute path of an existing folder.
fn resolve_dir(dir: &Path, cwd: &Path) -> Result<PathBuf, String> {
    let path = std::path::absolute(cwd.join(dir)).unwrap_or_else(|_| cwd.join(dir));
    if path.is_dir() { Ok(path) } else { Err(format!("--cwd {} is not a folder", path.display())) }
}

fn is_executable(m: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::PermissionsExt;
    m.permissions().mode() & 0o111 != 0
}

/// True for an argument that is plainly a path relative to the current folder (`./x`, `../x`).
fn looks_relative(arg: &str) -> bool {
    arg.starts_with("./") || arg.starts_with("../")
}

/// Parses `--env KEY=VALUE`: split at the first `=`; the key must be non-empty, the value may be
/// empty or hold more `=`.
///
/// # Errors
/// A message clap prints as a usage error (exit 2).
pub fn parse_env_pair(s: &str) -> Result<(String, String), String> {
    let (k, v) = s.split_once('=').ok_or_else(|| format!("expected KEY=VALUE, got {s:?}"))?;
    if k.is_empty() {
        return Err(format!("the variable name before '=' is empty in {s:?}"));
    }
    if k.contains('\0') || v.contains('\0') {
        return Err("a NUL byte cannot be in an environment variable".into());
    }
    Ok((k.to_owned(), v.to_owned()))
}

/// Parses `--header KEY:VALUE`: split at the first `:`, blanks around the value trimmed
/// (`Authorization: Bearer x`); the name must be a valid HTTP header name (RFC 9110 token).
///
/// # Errors
/// A message clap prints as a usage error (exit 2).
pub fn parse_header_pair(s: &str) -> Result<(String, String), String> {
    let (k, v) = s.split_once(':').ok_or_else(|| format!("expected KEY:VALUE, got {s:?}"))?;
    let k = k.trim();
    let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if k.is_empty() || !k.bytes().all(token) {
        return Err(format!("{k:?} is not a valid HTTP header name"));
    }
    let v = v.trim();
    if v.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0) {
        return Err(format!("the value of header {k} holds a line break or NUL"));
    }
    Ok((k.to_owned(), v.to_owned()))
}

/// Parses `--env-credential KEY=CREDENTIAL`: a variable name and a credential name.
///
/// # Errors
/// A message clap prints as a usage error (exit 2).
pub fn parse_env_credential(s: &str) -> Result<(String, String), String> {
    let (k, name) = parse_env_pair(s).map_err(|e| e.replace("KEY=VALUE", "KEY=CREDENTIAL"))?;
    let name = crate::commands::credentials::parse_name(&name).map_err(|e| format!("credential {name:?}: {e}"))?;
    Ok((k, name))
}

/// Parses `--header-credential KEY:CREDENTIAL`: a header name and a credential name.
///
/// # Errors
/// A message clap prints as a usage error (exit 2).
pub fn parse_header_credential(s: &str) -> Result<(String, String), String> {
    let (k, name) = parse_header_pair(s).map_err(|e| e.replace("KEY:VALUE", "KEY:CREDENTIAL"))?;
    let name = crate::commands::credentials::parse_name(&name).map_err(|e| format!("credential {name:?}: {e}"))?;
    Ok((k, name))
}

/// Parses `--timeout SECONDS`: a positive number (fractions allowed), at most a day.
///
/// # Errors
/// A message clap prints as a usage error (exit 2).
pub fn parse_timeout_seconds(s: &str) -> Result<f64, String> {
    let t: f64 = s.trim().parse().map_err(|_| format!("expected a number of seconds, got {s:?}"))?;
    if !(0.001..=86_400.0).contains(&t) {
        return Err("the timeout must be between 0.001 and 86400 seconds".into());
    }
    Ok(t)
}

// ---------------------------------------------------------------------------------------------
// list, show

async fn list(ctx: &Ctx) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    let resp = api.get_raw("/v1/mcp/servers").await?;
    if ctx.json {
        return output::print_body(&resp.body);
    }
    let items = resp.parse::<Page<McpServer>>()?.items;
    if items.is_empty() {
        return output::println("No MCP servers yet; add one with `coffer mcp add NAME -- COMMAND ARGS…`");
    }
    output::print(&render_servers(&items, output::terminal_width()))
}

/// The servers table. The command (or URL) comes last, out of the order one might expect,
/// because it is the one long column: last, it can be cut to the terminal's width.
pub fn render_servers(items: &[McpServer], width: Option<usize>) -> String {
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|s| {
            vec![
                text_cell(&s.name, 40),
                s.transport.word().to_owned(),
                yes_no(s.enabled).to_owned(),
                timeout(s),
                sandbox(s).to_owned(),
                target(s),
            ]
        })
        .collect();
    render_table_fitted(&["NAME", "TRANSPORT", "ENABLED", "TIMEOUT", "SANDBOX", "COMMAND/URL"], &rows, width)
}

/// A stdio server's command line (quoted so it can be pasted) or an http server's URL.
fn target(s: &McpServer) -> String {
    if s.transport.is_remote() {
        return or_dash(s.url.as_deref());
    }
    let words = std::iter::once(s.command.as_deref().unwrap_or("-")).chain(s.args.iter().map(String::as_str));
    shell_join(words)
}

/// `yes` for a stdio server in the vault sandbox, `NO` for one that opted out, `-` for http.
fn sandbox(s: &McpServer) -> &'static str {
    match s.sandbox {
        Some(true) => "yes",
        Some(false) => "NO",
        None => "-",
    }
}

fn timeout(s: &McpServer) -> String {
    s.timeout_ms.map_or_else(|| "default".into(), format_ms_as_seconds)
}

/// A field that may be null, as shown: the text, or `-`.
fn or_dash(v: Option<&str>) -> String {
    v.map_or_else(|| "-".into(), str::to_owned)
}

async fn show(ctx: &Ctx, a: ShowArgs) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    let resp = api.get_raw(&server_path(&a.name)).await?;
    if !a.capabilities {
        if ctx.json {
            return output::print_body(&resp.body);
        }
        return output::print(&render_fields(&server_fields(&resp.parse()?)));
    }
    let caps_path = format!("{}/capabilities", server_path(&a.name));
    if ctx.json {
        let server = resp.json()?;
        let caps = api.get(&caps_path).await;
        // Two REST bodies, each unchanged, in one document.
        return match caps {
            Ok(c) => output::print_json(&json!({"server": server, "capabilities": c})),
            Err(e) => {
                // One document: the server, and the error envelope's fields beside it.
                let mut doc = json!({"server": server, "capabilities": null});
                if let Some(Value::Object(envelope)) = e.envelope() {
                    doc.as_object_mut().expect("object").extend(envelope);
                }
                output::print_json(&doc)?;
                Err(e.printed())
            }
        };
    }
    let server: McpServer = resp.parse()?;
    let caps = api.get_as::<Capabilities>(&caps_path).await;
    let mut fields = server_fields(&server);
    match &caps {
        Ok(c) => fields.push(("capabilities", capability_counts(c))),
        Err(_) => fields.push(("capabilities", "unavailable (see below)".into())),
    }
    output::print(&render_fields(&fields))?;
    caps.map(|_| ()).map_err(|e| e.with_hint(format!("see `coffer mcp logs {}`", a.name)))
}

/// Every field of a server, in a fixed order, for `mcp show`.
pub fn server_fields(s: &McpServer) -> Vec<(&'static str, String)> {
    let map_lines = |m: &BTreeMap<String, EnvValue>, sep: &str| -> String {
        if m.is_empty() {
            return "-".into();
        }
        m.iter().map(|(k, v)| format!("{k}{sep}{}", wire_value_text(v))).collect::<Vec<_>>().join("\n")
    };
    let mut f = vec![("name", s.name.clone()), ("transport", s.transport.word().to_owned())];
    f.push(("enabled", yes_no(s.enabled).into()));
    if s.transport.is_remote() {
        f.push(("url", or_dash(s.url.as_deref())));
        f.push(("headers", map_lines(&s.headers, ": ")));
    } else {
        f.push(("command", or_dash(s.command.as_deref())));
        f.push(("args", if s.args.is_empty() { "-".into() } else { shell_join(s.args.iter().map(String::as_str)) }));
        f.push(("env", map_lines(&s.env, "=")));
        f.push((
            "cwd",
            s.cwd.clone().unwrap_or_else(|| format!("default ($COFFER_HOME/workspace/servers/{})", s.name)),
        ));
    }
    f.push(("timeout", timeout(s)));
    f.push(("version", s.version.to_string()));
    f.push(("created", output::format_time(&s.created_at)));
    f.push(("updated", output::format_time(&s.updated_at)));
    f
}

/// An `env`/`headers` value as shown: a literal as it is, a credential reference as
/// `<credential:NAME>` (the value itself is never in a REST body).
pub fn wire_value_text(v: &EnvValue) -> String {
    match v {
        EnvValue::Literal(s) => s.clone(),
        EnvValue::Ref(r) => format!("<credential:{}>", r.credential_ref),
    }
}

/// `13 tools (12 enabled), 4 prompts (4 enabled), 0 resources` from a capabilities body.
pub fn capability_counts(c: &Capabilities) -> String {
    let part = |key: &str, items: &[Capability]| {
        let on = items.iter().filter(|i| i.enabled).count();
        if items.is_empty() {
            format!("{} {key}", items.len())
        } else {
            format!("{} {key} ({on} enabled)", items.len())
        }
    };
    format!("{}, {}, {} resources", part("tools", &c.tools), part("prompts", &c.prompts), c.resources.len())
}

// ---------------------------------------------------------------------------------------------
// remove, enable, disable, refresh, test

async fn remove(ctx: &Ctx, name: &str) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    api.delete(&server_path(name)).await?;
    if ctx.json {
        return output::print_json(&json!({"removed": name}));
    }
    output::println(&format!("Removed MCP server {name}"))
}

async fn set_enabled(ctx: &Ctx, name: &str, enabled: bool) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    let body = McpServerPatch { enabled: Some(enabled), ..Default::default() };
    let req = api.request(reqwest::Method::PATCH, &server_path(name)).json(&body);
    let resp = api.send(req).await?;
    if ctx.json {
        return output::print_body(&resp.body);
    }
    output::println(&if enabled {
        format!("Enabled MCP server {name}: its tools are offered to clients")
    } else {
        format!("Disabled MCP server {name}: its tools are hidden from clients and calls get TOOL_DISABLED")
    })
}

async fn refresh(ctx: &Ctx) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    let resp = api.send(api.request(reqwest::Method::POST, "/v1/mcp/refresh")).await?;
    if ctx.json {
        return output::print_body(&resp.body);
    }
    let n = resp.parse::<Refreshed>()?.sessions;
    let s = if n == 1 { "" } else { "s" };
    output::println(&format!("Dropped the cached capability lists of {n} session{s}; clients were told to list again"))
}

async fn test(ctx: &Ctx, name: &str) -> Result<(), CliError> {
    let api: ApiClient = ctx.connect().await?;
    let resp = api.send(api.request(reqwest::Method::POST, &format!("{}/test", server_path(name)))).await?;
    let report: ProbeReport = resp.parse()?;
    if ctx.json {
        output::print_body(&resp.body)?;
        return if report.ok { Ok(()) } else { Err(CliError::Quiet(crate::error::exit::ERROR)) };
    }
    if report.ok {
        return output::println(&render_test(name, &report));
    }
    let error = report.error.as_deref().unwrap_or("the server did not answer");
    let ms = report.elapsed_ms;
    Err(CliError::Failed(format!("{name}: {error} (after {ms} ms); {}", look_further(name, &report))))
}

/// Where to look next after a failed test (a `POST …/test` body): its stderr log when it has
/// one; an HTTP server has none, so its URL instead.
pub fn look_further(name: &str, report: &ProbeReport) -> String {
    if report.log.is_some() {
        format!("see `coffer mcp logs {name}`")
    } else if report.transport.is_remote() {
        format!("check that its URL answers (`coffer mcp show {name}` shows it)")
    } else {
        format!("it wrote nothing on stderr; `coffer mcp show {name}` shows how it is run")
    }
}

/// `NAME: initialize ok (protocol P, server X vY), N tools, M prompts, K resources, in T ms`
/// from a successful `POST …/test` body.
pub fn render_test(name: &str, r: &ProbeReport) -> String {
    // `serverInfo` is MCP's `Implementation` (`{name, version, …}`), passed on as the upstream
    // sent it.
    let info = r.server_info.clone().flatten().unwrap_or_default();
    let server = match (info["name"].as_str(), info["version"].as_str()) {
        (Some(n), Some(v)) => format!(", server {n} v{}", v.trim_start_matches('v')),
        (Some(n), None) => format!(", server {n}"),
        _ => String::new(),
    };
    let mut out = format!(
        "{name}: initialize ok (protocol {}{server}), {} tools, {} prompts, {} resources, in {} ms",
        r.protocol_version.clone().flatten().as_deref().unwrap_or("?"),
        r.counts.tools.unwrap_or(0),
        r.counts.prompts.unwrap_or(0),
        r.counts.resources.unwrap_or(0),
        r.elapsed_ms
    );
    for w in &r.warnings {
        out.push_str(&format!("\nwarning: {name}: {w}"));
    }
    out
}

// ---------------------------------------------------------------------------------------------
// logs

async fn logs(ctx: &Ctx, a: McpLogsArgs) -> Result<(), CliError> {
    // The name becomes a file name: refuse anything that is not a server name (`../gateway`).
    let valid = !a.name.is_empty() && a.name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if !valid {
        return Err(CliError::Usage(format!("{:?} is not a server name (a-z, 0-9 and '-')", a.name)));
    }
    let dir = ctx.home.upstream_logs();
    let names = [a.name.as_str()];
    let (tail, initial) = Tail::start(&dir, &names, a.lines, a.follow)?;
    if !tail.has_files() {
        // Tell an unknown name from a server that has not run yet, if a daemon is there to ask;
        // never start one just for that.
        if let Some(api) = ctx.detect().await
            && let Err(e) = api.get(&server_path(&a.name)).await
            && e.api_code() == Some("NOT_FOUND")
        {
            return Err(e);
        }
        crate::eprintln_printable!(
            "no log for {} in {} yet (written once the server has started){}",
            a.name,
            dir.display(),
            if a.follow { "; waiting…" } else { "" }
        );
    }
    let style = if ctx.json { Style::Json("server") } else { Style::Plain };
    output::print(&crate::commands::logs::render(&initial, style))?;
    if a.follow { tail.follow(style).await } else { Ok(()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json_of(v: impl serde::Serialize) -> Value {
        serde_json::to_value(v).unwrap()
    }

    /// An edit's fresh values as `{"env": …, "headers": …}`, empty maps left out.
    fn fresh_json(f: Fresh) -> Value {
        let mut v = json!({});
        if !f.env.is_empty() {
            v["env"] = json_of(f.env);
        }
        if !f.headers.is_empty() {
            v["headers"] = json_of(f.headers);
        }
        v
    }
    use clap::Parser;

    fn parse(args: &[&str]) -> Result<AddArgs, clap::Error> {
        let mut full = vec!["coffer", "mcp", "add"];
        full.extend_from_slice(args);
        match crate::Cli::try_parse_from(full)?.command {
            crate::commands::Command::Mcp(McpCommand::Add(a)) => Ok(a),
            other => panic!("{other:?}"),
        }
    }

    /// A server body: `fields` over a stdio server with every field at its default.
    fn server(fields: Value) -> McpServer {
        let mut full = json!({"name": "s", "transport": "stdio", "command": null, "args": [], "env": {}, "cwd": null,
            "url": null, "headers": {}, "enabled": true, "timeout_ms": null, "sandbox": null, "version": 1,
            "created_at": "x", "updated_at": "x"});
        for (k, v) in fields.as_object().unwrap() {
            full[k] = v.clone();
        }
        serde_json::from_value(full).unwrap()
    }

    /// A probe report: `fields` over a successful stdio probe that listed nothing.
    fn probe(fields: Value) -> ProbeReport {
        let mut full = json!({"server": "t", "transport": "stdio", "warnings": [], "log": null, "elapsed_ms": 0,
            "counts": {}, "ok": true, "error": null});
        for (k, v) in fields.as_object().unwrap() {
            full[k] = v.clone();
        }
        serde_json::from_value(full).unwrap()
    }

    fn parse_edit(args: &[&str]) -> EditArgs {
        let mut full = vec!["coffer", "mcp", "edit"];
        full.extend_from_slice(args);
        match crate::Cli::try_parse_from(full).unwrap().command {
            crate::commands::Command::Mcp(McpCommand::Edit(a)) => a,
            other => panic!("{other:?}"),
        }
    }

    /// `mcp edit` sends the whole env map (PATCH replaces maps): the current one with
    /// `--unset-env` removed and `--env` set; new literal values apart, for moving secrets.
    #[test]
    fn edit_builds_a_patch_over_the_current_server() {
        let cur = server(json!({"name": "s", "transport": "stdio", "command": "/bin/srv", "args": ["a"],
            "env": {"KEEP": "1", "DROP": "x", "REF": {"credential_ref": "c"}}, "version": 3}));
        let none = |_: &str| None;
        let a = parse_edit(&[
            "s",
            "--env",
            "NEW=v",
            "--env-credential",
            "TOK=cred",
            "--unset-env",
            "DROP",
            "--timeout-ms",
            "0",
        ]);
        let (body, fresh) = edit_body(&a, &cur, Path::new("/"), none).unwrap();
        let (body, fresh) = (json_of(body), json_of(fresh_json(fresh)));
        assert_eq!(
            body,
            json!({"env": {"KEEP": "1", "REF": {"credential_ref": "c"}, "TOK": {"credential_ref": "cred"}}, "timeout_ms": null})
        );
        assert_eq!(fresh, json!({"env": {"NEW": "v"}}));
        let on_path = |n: &str| (n == "sh").then(|| PathBuf::from("/bin/sh"));
        let (body, _) = edit_body(&parse_edit(&["s", "--", "sh", "-c", "x"]), &cur, Path::new("/"), on_path).unwrap();
        let body = json_of(body);
        assert_eq!(body, json!({"command": "sh", "args": ["-c", "x"]}));
        for bad in [
            &["s"][..],
            &["s", "--unset-env", "NOPE"],
            &["s", "--url", "http://x"],
            &["s", "--command", "sh", "--", "sh"],
        ] {
            let e = edit_body(&parse_edit(bad), &cur, Path::new("/"), on_path).unwrap_err();
            assert_eq!(e.exit_code(), crate::error::exit::USAGE, "{bad:?}");
        }
    }

    fn exe(dir: &Path, name: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let p = dir.join(name);
        std::fs::write(&p, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    #[test]
    fn env_pairs() {
        assert_eq!(parse_env_pair("A=1").unwrap(), ("A".into(), "1".into()));
        assert_eq!(parse_env_pair("A=").unwrap(), ("A".into(), String::new()));
        assert_eq!(parse_env_pair("URL=a=b").unwrap(), ("URL".into(), "a=b".into()));
        assert!(parse_env_pair("A").unwrap_err().contains("KEY=VALUE"));
        assert!(parse_env_pair("=1").unwrap_err().contains("empty"));
    }

    #[test]
    fn header_pairs() {
        assert_eq!(
            parse_header_pair("Authorization: Bearer x:y").unwrap(),
            ("Authorization".into(), "Bearer x:y".into())
        );
        assert_eq!(parse_header_pair("X-A:1").unwrap(), ("X-A".into(), "1".into()));
        assert!(parse_header_pair("X-A=1").unwrap_err().contains("KEY:VALUE"));
        assert!(parse_header_pair(": 1").is_err());
        assert!(parse_header_pair("Bad Name: 1").unwrap_err().contains("not a valid HTTP header name"));
    }

    #[test]
    fn timeouts() {
        assert_eq!(parse_timeout_seconds("30").unwrap(), 30.0);
        assert_eq!(parse_timeout_seconds("0.5").unwrap(), 0.5);
        for bad in ["0", "-1", "abc", "inf", "86401"] {
            assert!(parse_timeout_seconds(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn commands_resolve_to_absolute_paths() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        let srv = exe(&bin, "srv");
        let none = |_: &str| None;
        // A bare name through PATH; a relative PATH entry is relative to the current folder.
        let on_path = |n: &str| (n == "srv").then(|| srv.clone());
        assert_eq!(resolve_command("srv", Path::new("/elsewhere"), on_path).unwrap(), srv);
        assert_eq!(resolve_command("srv", dir.path(), |_: &str| Some(PathBuf::from("bin/srv"))).unwrap(), srv);
        assert!(resolve_command("nosuch", dir.path(), none).unwrap_err().contains("not found on your PATH"));
        // Relative paths against the current folder, `.` dropped; absolute paths as they are.
        assert_eq!(resolve_command("./bin/srv", dir.path(), none).unwrap(), srv);
        assert_eq!(resolve_command("bin/./srv", dir.path(), none).unwrap(), srv);
        assert_eq!(resolve_command(srv.to_str().unwrap(), Path::new("/"), none).unwrap(), srv);
        // What is wrong is named.
        assert!(resolve_command("./bin/missing", dir.path(), none).unwrap_err().contains("does not exist"));
        assert!(resolve_command("./bin", dir.path(), none).unwrap_err().contains("not a file"));
        std::fs::write(bin.join("plain"), "x").unwrap();
        assert!(resolve_command("bin/plain", dir.path(), none).unwrap_err().contains("not executable"));
        assert!(resolve_command(" ", dir.path(), none).unwrap_err().contains("empty"));
        // What is registered: a bare name as given (once found), a path made absolute.
        assert_eq!(command_to_register("srv", Path::new("/elsewhere"), on_path).unwrap(), "srv");
        assert_eq!(command_to_register("./bin/srv", dir.path(), none).unwrap(), srv.to_str().unwrap());
        assert!(command_to_register("nosuch", dir.path(), none).is_err());
    }

    #[test]
    fn add_builds_the_stdio_body() {
        let dir = tempfile::tempdir().unwrap();
        let node = exe(dir.path(), "node");
        let a = parse(&[
            "fs",
            "-e",
            "A=1",
            "--env",
            "B=x=y",
            "--cwd",
            ".",
            "--timeout",
            "2.5",
            "--disabled",
            "--",
            "node",
            "-y",
            "./s.js",
        ])
        .unwrap();
        let body = json_of(add_body(&a, dir.path(), |n: &str| (n == "node").then(|| node.clone())).unwrap());
        assert_eq!(
            body,
            json!({
                "name": "fs", "transport": "stdio", "command": "node", "args": ["-y", "./s.js"],
                "env": {"A": "1", "B": "x=y"}, "cwd": dir.path().to_str().unwrap(), "timeout_s": 2.5, "enabled": false,
            })
        );
        let missing = add_body(&a, dir.path(), |_: &str| None).unwrap_err();
        assert_eq!(missing.exit_code(), crate::error::exit::ERROR);
    }

    #[test]
    fn add_builds_the_http_body() {
        let a = parse(&["remote", "--url", "https://x.test/mcp", "-H", "Authorization: Bearer t"]).unwrap();
        let body = json_of(add_body(&a, Path::new("/"), |_: &str| None).unwrap());
        assert_eq!(
            body,
            json!({"name": "remote", "transport": "http", "url": "https://x.test/mcp", "headers": {"Authorization": "Bearer t"}})
        );
    }

    #[test]
    fn add_usage_errors_exit_2() {
        for bad in [
            &["x"][..],                                  // neither command nor url
            &["x", "--url", "http://a", "--", "node"],   // both
            &["x", "--env", "NOEQUALS", "--", "node"],   // bad K=V
            &["x", "-H", "A:1", "--", "node"],           // header without url
            &["x", "--url", "http://a", "--env", "A=1"], // env with url
            &["x", "--timeout", "soon", "--", "node"],   // bad timeout
            &["x", "--"],                                // empty command
        ] {
            let e = parse(bad).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{bad:?}: {e}");
        }
        let e = parse(&["x", "--env", "NOEQUALS", "--", "node"]).unwrap_err().to_string();
        assert!(e.contains("KEY=VALUE"), "{e}");
    }

    #[test]
    fn servers_table_and_fields() {
        let stdio = server(json!({
            "name": "everything", "transport": "stdio", "command": "/usr/bin/node", "args": ["/p/index.js", "stdio"],
            "env": {"A": "1", "B": "two words"}, "cwd": null, "url": null, "headers": {}, "enabled": true,
            "timeout_ms": null, "sandbox": true, "version": 3, "created_at": "2026-11-30T09:56:56.541Z", "updated_at": "2026-11-30T10:00:00.000Z",
        }));
        let http = server(json!({
            "name": "remote", "transport": "http", "command": null, "args": [], "env": {}, "cwd": null,
            "url": "https://x.test/mcp", "headers": {"Authorization": "Bearer t"}, "enabled": false, "timeout_ms": 1500,
            "version": 1, "created_at": "x", "updated_at": "x",
        }));
        assert_eq!(
            render_servers(&[stdio.clone(), http.clone()], None),
            "NAME        TRANSPORT  ENABLED  TIMEOUT  SANDBOX  COMMAND/URL\n\
             everything  stdio      yes      default  yes      /usr/bin/node /p/index.js stdio\n\
             remote      http       no       1.5s     -        https://x.test/mcp\n"
        );
        assert_eq!(
            render_fields(&server_fields(&stdio)),
            "name:      everything\n\
             transport: stdio\n\
             enabled:   yes\n\
             command:   /usr/bin/node\n\
             args:      /p/index.js stdio\n\
             env:       A=1\n           B=two words\n\
             cwd:       default ($COFFER_HOME/workspace/servers/everything)\n\
             timeout:   default\n\
             version:   3\n\
             created:   2026-11-30 09:56:56\n\
             updated:   2026-11-30 10:00:00\n"
        );
        let f = render_fields(&server_fields(&http));
        assert!(f.contains("url:       https://x.test/mcp\nheaders:   Authorization: Bearer t\n"), "{f}");
    }

    #[test]
    fn credential_flags_send_references() {
        let dir = tempfile::tempdir().unwrap();
        let node = exe(dir.path(), "node");
        let a = parse(&[
            "gh",
            "--env",
            "LOG=debug",
            "--env-credential",
            "GITHUB_TOKEN=github",
            "--env-credential",
            "NPM_TOKEN=npm.token",
            "--",
            "node",
        ])
        .unwrap();
        let body = json_of(add_body(&a, dir.path(), |n: &str| (n == "node").then(|| node.clone())).unwrap());
        assert_eq!(
            body["env"],
            json!({"GITHUB_TOKEN": {"credential_ref": "github"}, "LOG": "debug", "NPM_TOKEN": {"credential_ref": "npm.token"}})
        );
        let a = parse(&[
            "remote",
            "--url",
            "https://x.test/mcp",
            "-H",
            "X-Team: a",
            "--header-credential",
            "Authorization:remote-auth",
        ])
        .unwrap();
        let body = json_of(add_body(&a, Path::new("/"), |_: &str| None).unwrap());
        assert_eq!(body["headers"], json!({"Authorization": {"credential_ref": "remote-auth"}, "X-Team": "a"}));
    }

    #[test]
    fn a_literal_written_as_a_reference_is_one() {
        let dir = tempfile::tempdir().unwrap();
        let node = exe(dir.path(), "node");
        for v in [r#"{"credential_ref":"github"}"#, r#" { "credential_ref" : "github" } "#] {
            let a = parse(&["gh", "--env", &format!("T={v}"), "--", "node"]).unwrap();
            let body = json_of(add_body(&a, dir.path(), |_: &str| Some(node.clone())).unwrap());
            assert_eq!(body["env"], json!({"T": {"credential_ref": "github"}}), "{v}");
        }
        let a = parse(&["r", "--url", "http://a/mcp", "-H", r#"Authorization: {"credential_ref":"tok"}"#]).unwrap();
        assert_eq!(
            json_of(add_body(&a, Path::new("/"), |_: &str| None).unwrap())["headers"]["Authorization"],
            json!({"credential_ref": "tok"})
        );
        // Other JSON stays literal; a malformed reference is refused, pointing at the flag.
        assert_eq!(json_of(literal_value("--env", "J", r#"{"a":1}"#).unwrap()), json!(r#"{"a":1}"#));
        assert_eq!(json_of(literal_value("--env", "J", "credential_ref").unwrap()), json!("credential_ref"));
        for bad in [r#"{"credential_ref":"x","more":1}"#, r#"{"credential_ref":5}"#, r#"{"credential_ref":"bad name"}"#]
        {
            let e = literal_value("--env", "T", bad).unwrap_err();
            assert_eq!(e.exit_code(), crate::error::exit::USAGE, "{bad}");
            assert!(e.to_string().contains("--env-credential T=NAME"), "{e}");
        }
        let e = literal_value("--header", "A", r#"{"credential_ref":""}"#).unwrap_err();
        assert!(e.to_string().contains("--header-credential A:NAME"), "{e}");
    }

    #[test]
    fn credential_flag_usage_errors() {
        for bad in [
            &["x", "--env-credential", "NOEQUALS", "--", "node"][..],
            &["x", "--env-credential", "T=bad name", "--", "node"],
            &["x", "--env-credential", "=tok", "--", "node"],
            &["x", "--url", "http://a", "--env-credential", "T=tok"],
            &["x", "--header-credential", "Authorization:tok", "--", "node"],
            &["x", "--url", "http://a", "--header-credential", "Authorization=tok"],
            &["x", "--url", "http://a", "--header-credential", "Bad Name:tok"],
            &["x", "--url", "http://a", "--header-credential", "A:-tok"],
        ] {
            let e = parse(bad).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{bad:?}: {e}");
        }
        // The same key as a literal and as a credential.
        let dir = tempfile::tempdir().unwrap();
        let node = exe(dir.path(), "node");
        let a = parse(&["x", "--env", "T=1", "--env-credential", "T=tok", "--", "node"]).unwrap();
        let e = add_body(&a, dir.path(), |_: &str| Some(node.clone())).unwrap_err();
        assert_eq!(e.exit_code(), crate::error::exit::USAGE);
        let a = parse(&["x", "--url", "http://a", "-H", "authorization: x", "--header-credential", "Authorization:t"])
            .unwrap();
        assert_eq!(add_body(&a, Path::new("/"), |_: &str| None).unwrap_err().exit_code(), crate::error::exit::USAGE);
    }

    #[test]
    fn references_are_shown_by_name() {
        let stdio = server(json!({
            "name": "gh", "transport": "stdio", "command": "/usr/bin/node", "args": [], "cwd": null,
            "env": {"GITHUB_TOKEN": {"credential_ref": "github"}, "LOG": "debug"}, "enabled": true,
        }));
        let f = render_fields(&server_fields(&stdio));
        assert!(f.contains("env:       GITHUB_TOKEN=<credential:github>\n           LOG=debug\n"), "{f}");
        let http = server(json!({
            "name": "r", "transport": "http", "url": "https://x.test/mcp", "enabled": true,
            "headers": {"Authorization": {"credential_ref": "remote-auth"}},
        }));
        let f = render_fields(&server_fields(&http));
        assert!(f.contains("headers:   Authorization: <credential:remote-auth>\n"), "{f}");
        assert_eq!(wire_value_text(&EnvValue::Literal(r#"{"other":1}"#.into())), r#"{"other":1}"#);
    }

    #[test]
    fn test_line() {
        let r = probe(json!({"server": "e", "ok": true, "error": null, "protocol_version": "2025-06-18",
            "server_info": {"name": "example-servers/everything", "version": "1.0.0"}, "capabilities": {},
            "counts": {"tools": 11, "prompts": 3, "resources": 100}, "initialize_ms": 80, "elapsed_ms": 412}));
        assert_eq!(
            render_test("e", &r),
            "e: initialize ok (protocol 2025-06-18, server example-servers/everything v1.0.0), 11 tools, 3 prompts, 100 resources, in 412 ms"
        );
        let bare = probe(json!({"ok": true, "protocol_version": "2025-11-25", "counts": {}, "elapsed_ms": 5}));
        assert_eq!(
            render_test("t", &bare),
            "t: initialize ok (protocol 2025-11-25), 0 tools, 0 prompts, 0 resources, in 5 ms"
        );
        let noisy = probe(json!({"ok": true, "protocol_version": "2025-11-25", "counts": {}, "elapsed_ms": 5,
            "warnings": ["it wrote 1 line on stdout that is not JSON-RPC"]}));
        assert!(
            render_test("t", &noisy).ends_with("in 5 ms\nwarning: t: it wrote 1 line on stdout that is not JSON-RPC"),
            "{}",
            render_test("t", &noisy)
        );
    }

    #[test]
    fn a_failed_test_points_where_there_is_something_to_read() {
        let stdio = probe(json!({"transport": "stdio", "log": "/h/logs/upstreams/s.log"}));
        assert_eq!(look_further("s", &stdio), "see `coffer mcp logs s`");
        let http = probe(json!({"transport": "http", "log": null}));
        let hint = look_further("r", &http);
        assert!(!hint.contains("mcp logs") && hint.contains("URL"), "{hint}");
        let silent = probe(json!({"transport": "stdio", "log": null}));
        assert!(!look_further("q", &silent).contains("mcp logs"));
    }

    #[test]
    fn counts() {
        let tool =
            |enabled: bool| json!({"name": "t", "exposed_name": "e__t", "description": null, "enabled": enabled});
        let c: Capabilities = serde_json::from_value(
            json!({"server": "e", "tools": [tool(true), tool(false)], "prompts": [], "resources": []}),
        )
        .unwrap();
        assert_eq!(capability_counts(&c), "2 tools (1 enabled), 0 prompts, 0 resources");
    }
}
