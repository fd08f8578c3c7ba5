//! `coffer credentials set|list|remove`: the encrypted credential store (`/v1/credentials`).
//!
//! Values are write-only: `set` reads one from standard input (piped) or from the terminal
//! without echo, never from the command line (where `ps` and shell history would show it), and
//! nothing ever prints one.
use std::collections::BTreeMap;
use std::io::{IsTerminal, Read};

use clap::{Args, Subcommand};
use coffer_api::Page;
use coffer_api::credentials::{Credential, CredentialPut, CredentialSet};
use coffer_api::servers::{EnvValue, McpServer};
use secrecy::{ExposeSecret, SecretString};
use serde_json::{Value, json};

use crate::api::{ApiClient, path_segment};
use crate::context::Ctx;
use crate::error::CliError;
use crate::output::{self, render_table};

/// Longest credential value (bytes), as the daemon enforces.
pub const MAX_VALUE_BYTES: usize = coffer_api::credentials::MAX_VALUE_BYTES;

const SET_EXAMPLES: &str = "\
Examples:
  coffer credentials set github-token                  # prompts; the input is not shown
  printf %s \"$GITHUB_TOKEN\" | coffer credentials set github-token
  coffer credentials set api-key < ~/secrets/api-key.txt

The value is read from standard input when it is piped (one trailing newline is dropped), else
prompted for on the terminal without echo. It is never taken from the command line. Setting an
existing credential replaces its value; servers that reference it get it on their next start.";

const LIST_EXAMPLES: &str = "\
Examples:
  coffer credentials list
  coffer credentials list --json

Shows names, versions and which servers reference each credential; never values.";

#[derive(Debug, Subcommand)]
pub enum CredentialsCommand {
    /// Store a secret under NAME, read from stdin or prompted for without echo.
    #[command(after_help = SET_EXAMPLES)]
    Set(NameArg),
    /// List the stored credentials (never their values).
    #[command(after_help = LIST_EXAMPLES)]
    List(NoArgs),
    /// Remove a credential; servers that reference it fail to start until it is set again.
    #[command(after_help = "Example:\n  coffer credentials remove github-token")]
    Remove(NameArg),
}

#[derive(Debug, Args)]
pub struct NoArgs {}

#[derive(Debug, Args)]
pub struct NameArg {
    /// The credential's name: 1-64 characters a-z, A-Z, 0-9, '_', '.' and '-', starting with a
    /// letter or digit.
    #[arg(value_parser = parse_name)]
    pub name: String,
}

/// Runs one `coffer credentials …` command.
///
/// # Errors
/// Exit 2 for a bad name or an empty value, 3 for an unknown credential, API errors, exit 5 when
/// the daemon cannot be reached.
pub async fn run(ctx: &Ctx, cmd: CredentialsCommand) -> Result<(), CliError> {
    match cmd {
        CredentialsCommand::Set(a) => set(ctx, &a.name).await,
        CredentialsCommand::List(_) => list(ctx).await,
        CredentialsCommand::Remove(a) => remove(ctx, &a.name).await,
    }
}

/// Checks a credential name (`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`, the store's rule) before
/// anything is prompted for.
///
/// # Errors
/// A message clap prints as a usage error (exit 2).
pub fn parse_name(s: &str) -> Result<String, String> {
    let b = s.as_bytes();
    let ok = !b.is_empty()
        && b.len() <= 64
        && b[0].is_ascii_alphanumeric()
        && b.iter().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'));
    if ok {
        Ok(s.to_owned())
    } else {
        Err("use 1-64 characters a-z, A-Z, 0-9, '_', '.' and '-', starting with a letter or digit".into())
    }
}

fn credential_path(name: &str) -> String {
    format!("/v1/credentials/{}", path_segment(name))
}

// ---------------------------------------------------------------------------------------------
// set

async fn set(ctx: &Ctx, name: &str) -> Result<(), CliError> {
    // Read first, so that starting a daemon does not interleave with the prompt.
    let value = read_value(name)?;
    let api = ctx.connect().await?;
    let body = CredentialPut { value: value.expose_secret().to_owned() };
    let resp = api.send(api.request(reqwest::Method::PUT, &credential_path(name)).json(&body)).await?;
    drop(body);
    if ctx.json {
        return output::print_body(&resp.body);
    }
    let CredentialSet { version, .. } = resp.parse()?;
    output::println(&if resp.status == 201 {
        format!("Stored credential {name} (version {version})")
    } else {
        format!("Replaced the value of credential {name} (version {version})")
    })
}

/// The value to store: all of stdin when it is not a terminal (one trailing `\n` or `\r\n`
/// dropped), else one line typed at a prompt without echo.
///
/// # Errors
/// [`CliError::Usage`] (exit 2) for an empty, NUL-holding or too long value; [`CliError::Failed`]
/// when stdin cannot be read.
fn read_value(name: &str) -> Result<SecretString, CliError> {
    let stdin = std::io::stdin();
    let raw = if stdin.is_terminal() {
        prompt_hidden(&format!("Value for credential {name} (input hidden): "))?
    } else {
        let mut bytes = Vec::new();
        stdin.lock().read_to_end(&mut bytes).map_err(|e| CliError::Failed(format!("cannot read stdin: {e}")))?;
        let s = String::from_utf8(bytes).map_err(|_| CliError::Usage("the value on stdin is not UTF-8".into()))?;
        SecretString::from(s)
    };
    let v = trim_one_newline(raw.expose_secret());
    if v.is_empty() {
        return Err(CliError::Usage("the value is empty; nothing was stored".into()));
    }
    if v.len() > MAX_VALUE_BYTES {
        return Err(CliError::Usage(format!("the value is {} bytes; at most {MAX_VALUE_BYTES} are allowed", v.len())));
    }
    if v.contains('\0') {
        return Err(CliError::Usage("the value holds a NUL byte".into()));
    }
    Ok(SecretString::from(v.to_owned()))
}

/// `s` without one trailing `\n` or `\r\n` (what `echo` and editors add).
pub fn trim_one_newline(s: &str) -> &str {
    s.strip_suffix("\r\n").or_else(|| s.strip_suffix('\n')).unwrap_or(s)
}

/// Prints `prompt` on stderr and reads one line from the terminal on stdin with echo off (the
/// newline is still echoed, so the cursor moves on).
pub(crate) fn prompt_hidden(prompt: &str) -> Result<SecretString, CliError> {
    use nix::sys::termios::{LocalFlags, SetArg, tcgetattr, tcsetattr};
    use std::io::{BufRead, Write};

    let stdin = std::io::stdin();
    let failed = |e: &dyn std::fmt::Display| CliError::Failed(format!("cannot read from the terminal: {e}"));
    let saved = tcgetattr(&stdin).map_err(|e| failed(&e))?;
    let mut quiet = saved.clone();
    quiet.local_flags.remove(LocalFlags::ECHO);
    quiet.local_flags.insert(LocalFlags::ECHONL);
    eprint!("{prompt}");
    let _ = std::io::stderr().flush();
    tcsetattr(&stdin, SetArg::TCSANOW, &quiet).map_err(|e| failed(&e))?;
    // Restores echo however the read ends.
    struct Restore<'a>(&'a std::io::Stdin, nix::sys::termios::Termios);
    impl Drop for Restore<'_> {
        fn drop(&mut self) {
            let _ = tcsetattr(self.0, SetArg::TCSANOW, &self.1);
        }
    }
    let _restore = Restore(&stdin, saved);
    let mut line = String::new();
    stdin.lock().read_line(&mut line).map_err(|e| failed(&e))?;
    Ok(SecretString::from(line))
}

// ---------------------------------------------------------------------------------------------
// list, remove

async fn list(ctx: &Ctx) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    let resp = api.get_raw("/v1/credentials").await?;
    if ctx.json {
        return output::print_body(&resp.body);
    }
    let items = resp.parse::<Page<Credential>>()?.items;
    if items.is_empty() {
        return output::println("No credentials yet; store one with `coffer credentials set NAME`");
    }
    let users = references(&api).await.unwrap_or_default();
    output::print(&render_credentials(&items, &users))
}

/// The credentials table: NAME VERSION UPDATED USED BY.
pub fn render_credentials(items: &[Credential], users: &BTreeMap<String, Vec<String>>) -> String {
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|c| {
            let used = users.get(&c.name).filter(|u| !u.is_empty()).map_or_else(|| "-".into(), |u| u.join(", "));
            vec![c.name.clone(), c.version.to_string(), output::format_time(&c.updated_at), used]
        })
        .collect();
    render_table(&["NAME", "VERSION", "UPDATED", "USED BY"], &rows)
}

/// Which servers reference each credential (in `env` or `headers`), from the registry.
async fn references(api: &ApiClient) -> Result<BTreeMap<String, Vec<String>>, CliError> {
    let servers = api.get_as::<Page<McpServer>>("/v1/mcp/servers").await?.items;
    let mut out = credential_users(&servers);
    // Channels too (a store that does not answer them leaves them out, as before).
    if let Ok(channels) = api.get("/v1/channels").await {
        for (cred, users) in
            channel_credential_users(channels["items"].as_array().map(Vec::as_slice).unwrap_or_default())
        {
            out.entry(cred).or_default().extend(users);
        }
    }
    Ok(out)
}

/// Credential name → `channel <name>` for each channel whose `*_ref` names it.
pub fn channel_credential_users(channels: &[Value]) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for c in channels {
        let user = format!("channel {}", c["name"].as_str().unwrap_or_default());
        for field in ["bot_token_ref", "app_id_ref", "app_secret_ref", "signing_secret_ref"] {
            if let Some(cred) = c[field].as_str().filter(|r| !r.is_empty()) {
                let users = out.entry(cred.to_owned()).or_default();
                if !users.contains(&user) {
                    users.push(user.clone());
                }
            }
        }
    }
    out
}

/// Credential name → names of the servers whose `env` or `headers` reference it.
pub fn credential_users(servers: &[McpServer]) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for s in servers {
        for v in s.env.values().chain(s.headers.values()) {
            if let EnvValue::Ref(r) = v {
                let users = out.entry(r.credential_ref.clone()).or_default();
                if !users.contains(&s.name) {
                    users.push(s.name.clone());
                }
            }
        }
    }
    out
}

async fn remove(ctx: &Ctx, name: &str) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    let users = references(&api).await.unwrap_or_default().remove(name).unwrap_or_default();
    api.delete(&credential_path(name)).await?;
    if !users.is_empty() {
        // Channels are listed as "channel <name>", servers by their bare name.
        let named = |u: &String| if u.starts_with("channel ") { u.clone() } else { format!("server {u}") };
        let who = match users.as_slice() {
            [one] => format!("{} references", named(one)),
            many => format!("{} reference", many.iter().map(named).collect::<Vec<_>>().join(", ")),
        };
        crate::eprintln_printable!(
            "warning: {who} {name} and will fail to start until it is set again (`coffer credentials set {name}`)"
        );
    }
    if ctx.json {
        return output::print_json(&json!({"removed": name}));
    }
    output::println(&format!("Removed credential {name}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for ok in ["github-token", "A.b_c-1", &"x".repeat(64)] {
            assert_eq!(parse_name(ok).as_deref(), Ok(ok));
        }
        for bad in ["", "-x", ".x", "a b", "a/b", &"x".repeat(65)] {
            assert!(parse_name(bad).is_err(), "{bad}");
        }
        use clap::Parser;
        let e = crate::Cli::try_parse_from(["coffer", "credentials", "set", "bad name"]).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        // The value is never an argument.
        let e = crate::Cli::try_parse_from(["coffer", "credentials", "set", "x", "value"]).unwrap_err();
        assert_eq!(e.exit_code(), 2);
    }

    #[test]
    fn newlines() {
        assert_eq!(trim_one_newline("abc\n"), "abc");
        assert_eq!(trim_one_newline("abc\r\n"), "abc");
        assert_eq!(trim_one_newline("abc\n\n"), "abc\n");
        assert_eq!(trim_one_newline("a b "), "a b ");
    }

    #[test]
    fn table_and_users() {
        let server = |name: &str, env: Value, headers: Value| -> McpServer {
            serde_json::from_value(json!({"name": name, "transport": "stdio", "command": null, "args": [], "env": env,
                "cwd": null, "url": null, "headers": headers, "enabled": true, "timeout_ms": null, "sandbox": null,
                "version": 1, "created_at": "x", "updated_at": "x"}))
            .unwrap()
        };
        let servers = [
            server("gh", json!({"T": {"credential_ref": "tok"}, "L": "x"}), json!({})),
            server("web", json!({}), json!({"Authorization": {"credential_ref": "tok"}})),
        ];
        let users = credential_users(&servers);
        assert_eq!(users["tok"], ["gh", "web"]);
        let items: Vec<Credential> = serde_json::from_value(json!([
            {"name": "tok", "version": 2, "created_at": "x", "updated_at": "2026-11-30T09:57:00.211Z"},
            {"name": "spare", "version": 1, "created_at": "x", "updated_at": "2026-11-30T10:00:00Z"},
        ]))
        .unwrap();
        assert_eq!(
            render_credentials(&items, &users),
            "NAME   VERSION  UPDATED              USED BY\n\
             tok    2        2026-11-30 09:57:00  gh, web\n\
             spare  1        2026-11-30 10:00:00  -\n"
        );
        let channels = [
            json!({"name": "home", "kind": "telegram", "bot_token_ref": "channel-home-bot-token"}),
            json!({"name": "work", "kind": "seatalk", "app_id_ref": "st-id", "app_secret_ref": "st-secret",
                "signing_secret_ref": "st-id"}),
        ];
        let users = channel_credential_users(&channels);
        assert_eq!(users["channel-home-bot-token"], ["channel home"]);
        assert_eq!(users["st-id"], ["channel work"], "one channel naming a credential twice is listed once");
        assert_eq!(users["st-secret"], ["channel work"]);
    }
}
