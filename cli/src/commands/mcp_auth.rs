//! `coffer mcp auth NAME`: OAuth sign-in to an HTTP MCP server (MCP 2025-11-25
//! basic/authorization) through `/v1/mcp/servers/{name}/auth`. The daemon discovers the
//! server's authorization server, registers Coffer as a client, and listens on a loopback port
//! for the browser's one redirect; this command opens the browser on the authorization URL (or
//! only prints it with `--no-browser`) and waits until the sign-in ends. `--status` shows where
//! the sign-in stands; `--sign-out` deletes the stored grant.
use std::time::{Duration, Instant};

use clap::Args;
use coffer_api::servers::{AuthState, ServerAuth, SignInState};
use serde_json::json;

use crate::api::path_segment;
use crate::context::Ctx;
use crate::error::CliError;
use crate::output;

pub const AUTH_EXAMPLES: &str = "\
Examples:
  coffer mcp auth linear                    # opens the browser, waits for the sign-in
  coffer mcp auth linear --no-browser       # prints the URL to open elsewhere
  coffer mcp auth corp --client-id coffer-desktop --scope 'read write'
  coffer mcp auth linear --status
  coffer mcp auth linear --sign-out

The daemon finds the server's authorization server from its 401 answer (RFC 9728), registers
Coffer as a client (RFC 7591) unless --client-id or --client-metadata-url says otherwise, and
receives the browser's redirect on http://127.0.0.1:PORT/callback for this sign-in only. Tokens go
to the credential store as oauth.NAME (sealed, never synced, never printed); the access token is
refreshed before it expires. When a refresh is refused the server needs a new sign-in: `coffer
status` and `coffer doctor` say so.";

#[derive(Debug, Args)]
pub struct AuthArgs {
    /// The server's name (an HTTP server, registered with --url).
    pub name: String,
    /// Print the authorization URL instead of opening a browser.
    #[arg(long)]
    pub no_browser: bool,
    /// A client id registered with the authorization server by hand (no registration).
    #[arg(long, value_name = "ID")]
    pub client_id: Option<String>,
    /// Read the client's secret (a confidential --client-id) from this environment variable
    /// (never from the command line, where other users could see it).
    #[arg(long, value_name = "VAR", requires = "client_id")]
    pub client_secret_env: Option<String>,
    /// An https:// URL of Coffer's Client ID Metadata Document, used as the client id where the
    /// authorization server accepts such documents.
    #[arg(long, value_name = "URL", conflicts_with = "client_id")]
    pub client_metadata_url: Option<String>,
    /// Scopes to ask for (space-separated) instead of those the server names.
    #[arg(long, value_name = "SCOPES")]
    pub scope: Option<String>,
    /// How long to wait for the browser, in seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=1800))]
    pub timeout: u64,
    /// Show the sign-in state and exit.
    #[arg(long, conflicts_with_all = ["sign_out", "no_browser", "client_id", "client_metadata_url", "scope"])]
    pub status: bool,
    /// Delete the stored tokens; the server then needs a new sign-in.
    #[arg(long, conflicts_with_all = ["no_browser", "client_id", "client_metadata_url", "scope"])]
    pub sign_out: bool,
}

impl AuthArgs {
    /// A browser sign-in to `name` with the defaults (as `coffer mcp auth NAME`).
    pub fn new(name: String) -> Self {
        Self {
            name,
            no_browser: false,
            client_id: None,
            client_secret_env: None,
            client_metadata_url: None,
            scope: None,
            timeout: 300,
            status: false,
            sign_out: false,
        }
    }
}

/// Whether to start the sign-in to `name`, a server just registered that needs one: yes with
/// `--auth`, no with `--no-auth`; otherwise asked on a terminal (stdin and stderr), and off a
/// terminal no (the command to run was printed).
///
/// # Errors
/// The terminal cannot be read.
pub fn offer_sign_in(name: &str, auth: bool, no_auth: bool) -> Result<bool, CliError> {
    use std::io::IsTerminal as _;
    if auth || no_auth {
        return Ok(auth);
    }
    if !std::io::stdin().is_terminal() || !std::io::stderr().is_terminal() {
        return Ok(false);
    }
    let line = crate::output::prompt_line(&format!("Sign in to {name} now (opens a browser)? [Y/n] "))?;
    Ok(sign_in_answer(&line))
}

/// A yes/no answer to the sign-in question: empty (Enter) or y/yes is yes.
fn sign_in_answer(line: &str) -> bool {
    matches!(line.trim().to_ascii_lowercase().as_str(), "" | "y" | "yes")
}

fn auth_path(name: &str) -> String {
    format!("/v1/mcp/servers/{}/auth", path_segment(name))
}

pub async fn run(ctx: &Ctx, a: AuthArgs) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    let path = auth_path(&a.name);
    if a.status {
        let resp = api.send(api.request(reqwest::Method::GET, &path)).await?;
        if ctx.json {
            return output::print_body(&resp.body);
        }
        let v: ServerAuth = resp.parse()?;
        return output::print(&describe(&a.name, &v));
    }
    if a.sign_out {
        api.delete(&path).await?;
        if ctx.json {
            return output::print_json(&json!({"server": a.name, "signed_out": true}));
        }
        return output::print(&format!("Signed out of {}; sign in again with: coffer mcp auth {}\n", a.name, a.name));
    }
    let mut body = json!({"timeout_s": a.timeout});
    if let Some(id) = &a.client_id {
        body["client_id"] = id.clone().into();
    }
    if let Some(var) = &a.client_secret_env {
        let secret = std::env::var(var).map_err(|_| {
            CliError::Usage(format!("--client-secret-env {var}: the environment variable {var} is not set"))
        })?;
        body["client_secret"] = secret.into();
    }
    if let Some(u) = &a.client_metadata_url {
        body["client_metadata_url"] = u.clone().into();
    }
    if let Some(s) = &a.scope {
        body["scope"] = s.clone().into();
    }
    let started: ServerAuth = api.send(api.request(reqwest::Method::POST, &path).json(&body)).await?.parse()?;
    let Some(url) = started.flow.as_ref().and_then(|f| f.authorization_url.clone()) else {
        return Err(CliError::Failed(format!("the daemon started no sign-in for {}", a.name)));
    };
    // The URL goes to stdout (a script or test reads it there); what to do with it to stderr.
    if !ctx.json {
        output::print(&format!("{url}\n"))?;
    }
    if a.no_browser {
        crate::eprintln_printable!("Open the URL above in a browser on this machine to sign in to {}.", a.name);
    } else {
        match crate::commands::ui::open_in_browser(&url, |k| std::env::var_os(k)).await {
            crate::commands::ui::Opened::Started(b) => {
                crate::eprintln_printable!("Opened {b}; sign in to {} there.", a.name)
            }
            crate::commands::ui::Opened::NoBrowser => {
                crate::eprintln_printable!("No browser to open here; open the URL above in a browser on this machine.")
            }
            crate::commands::ui::Opened::Failed(why) => crate::eprintln_printable!(
                "The browser did not start ({why}); open the URL above in a browser on this machine."
            ),
        }
    }
    crate::eprintln_printable!("Waiting for the sign-in (at most {} s)…", a.timeout);
    let deadline = Instant::now() + Duration::from_secs(a.timeout) + Duration::from_secs(5);
    loop {
        let left = deadline.saturating_duration_since(Instant::now()).as_secs().min(30);
        let resp = api.send(api.request(reqwest::Method::GET, &format!("{path}?wait_s={left}"))).await?;
        let v: ServerAuth = resp.parse()?;
        let state = v.flow.as_ref().map(|f| f.state);
        match state {
            Some(SignInState::Pending) if Instant::now() < deadline => continue,
            Some(SignInState::SignedIn) => {
                if ctx.json {
                    return output::print_body(&resp.body);
                }
                // The catalog lists the server afresh, so clients are offered its tools now.
                let mut out = format!("Signed in to {}.\n", a.name);
                let listed =
                    crate::commands::listed::wait(&api, std::slice::from_ref(&a.name), crate::commands::listed::WAIT)
                        .await;
                if let Some(l) = listed.first() {
                    crate::commands::listed::report(&mut out, l);
                }
                out.push_str(&format!("See its tools: coffer tools list --server {}\n", a.name));
                return output::print(&out);
            }
            _ => {
                let why = v.flow.and_then(|f| f.error).unwrap_or_else(|| "no redirect arrived in time".into());
                if ctx.json {
                    output::print_body(&resp.body)?;
                    return Err(CliError::Printed(Box::new(CliError::Failed(format!(
                        "sign-in to {} failed: {why}",
                        a.name
                    )))));
                }
                return Err(CliError::Failed(format!(
                    "sign-in to {} failed: {why}\nTry again with: coffer mcp auth {}",
                    a.name, a.name
                )));
            }
        }
    }
}

/// `--status`' text.
pub fn describe(name: &str, v: &ServerAuth) -> String {
    let mut out = match v.state {
        AuthState::None => format!("{name}: not signed in (no OAuth grant stored)\n"),
        AuthState::SignedIn => {
            let mut s = format!("{name}: signed in at {}", v.issuer.as_deref().unwrap_or("?"));
            if let Some(scope) = &v.scope {
                s.push_str(&format!(", scope {scope:?}"));
            }
            if let Some(at) = &v.expires_at {
                s.push_str(&format!(", access token expires {at}"));
            }
            s.push_str(if v.refreshable { ", refreshable\n" } else { ", no refresh token\n" });
            s
        }
        AuthState::NeedsSignIn => format!(
            "{name}: needs sign-in ({}): run `{}`\n",
            v.why.as_deref().unwrap_or("no usable grant"),
            v.command.clone().unwrap_or_else(|| format!("coffer mcp auth {name}"))
        ),
    };
    if let Some(f) = &v.flow {
        let line = match f.state {
            SignInState::Pending => format!(
                "sign-in pending until {}: {}\n",
                f.expires_at.as_deref().unwrap_or("?"),
                f.authorization_url.as_deref().unwrap_or("")
            ),
            SignInState::SignedIn => "last sign-in: succeeded\n".to_owned(),
            SignInState::Failed => format!("last sign-in: failed: {}\n", f.error.as_deref().unwrap_or("?")),
        };
        out.push_str(&line);
    }
    out
}

/// The hint `coffer mcp add` prints when a new HTTP server's first list failed for want of a
/// sign-in: `Some(text)` when `error` says so.
pub fn sign_in_hint(name: &str, error: &str) -> Option<String> {
    error.contains("needs sign-in").then(|| {
        format!(
            "{name} needs sign-in: run `coffer mcp auth {name}` (opens a browser), then its tools appear.\n\
             If it takes an API token instead of an OAuth sign-in, give it as a header: \
             `coffer mcp edit {name} --header-credential 'Authorization:CREDENTIAL'` (a stored `Bearer …` value).\n"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enter_or_yes_starts_the_sign_in_anything_else_does_not() {
        for yes in ["\n", "y\n", "Y\n", "yes\r\n", " YES "] {
            assert!(sign_in_answer(yes), "{yes:?}");
        }
        for no in ["n\n", "no\n", "later\n", "q"] {
            assert!(!sign_in_answer(no), "{no:?}");
        }
        // The flags decide without asking.
        assert!(offer_sign_in("x", true, false).unwrap());
        assert!(!offer_sign_in("x", false, true).unwrap());
    }

    #[test]
    fn the_hint_names_the_exact_command() {
        let hint = sign_in_hint("linear", "upstream linear needs sign-in (it asks for OAuth sign-in): run …").unwrap();
        assert!(hint.contains("needs sign-in") && hint.contains("`coffer mcp auth linear`"), "{hint}");
        assert!(hint.contains("coffer mcp edit linear --header-credential"), "an API-token server's way: {hint}");
        assert_eq!(sign_in_hint("linear", "unreachable at http://127.0.0.1:9/"), None);
    }
}
