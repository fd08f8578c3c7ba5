//! `coffer connect claude-code|codex|claude-desktop|cursor|vscode [--remove] [--print]`: registers
//! `coffer-mcp-shim` (the one next to this `coffer`) as the MCP server `coffer` in an MCP
//! client's configuration, or removes it.
//!
//! Idempotent: a client that already has exactly this entry is left untouched (no write at
//! all). Every other key of the client's file is kept; JSON files keep their indentation and
//! key order, `config.toml` its comments and layout (`toml_edit`). A file is written through a
//! temporary file and a rename, so the client never reads half of one, and the file as it was
//! before Coffer first changed it is kept once as `<file>.bak`.
//!
//! Files (`$HOME` is honoured; tests point it at a temporary folder):
//! - Claude Code: `claude mcp add --scope user coffer -- SHIM` when `claude` is on `PATH`, else
//!   `~/.claude.json` `mcpServers.coffer = {"type":"stdio","command":SHIM,"args":[]}`;
//! - Codex: `$CODEX_HOME/config.toml` (default `~/.codex/config.toml`), table
//!   `[mcp_servers.coffer]` with `command = SHIM` and `args = []`;
//! - Claude Desktop: `~/.config/Claude/claude_desktop_config.json` (Linux) or
//!   `~/Library/Application Support/Claude/claude_desktop_config.json` (macOS),
//!   `mcpServers.coffer = {"command":SHIM,"args":[]}`;
//! - Cursor: `~/.cursor/mcp.json`, the same entry;
//! - VS Code: the user profile's `mcp.json` (`~/.config/Code/User/mcp.json` on Linux,
//!   `~/Library/Application Support/Code/User/mcp.json` on macOS),
//!   `servers.coffer = {"type":"stdio","command":SHIM,"args":[]}`.
//!
//! `--profile NAME` (issue 36 §1) makes the client's sessions use that profile: the shim is
//! registered with `args = ["--profile", NAME]` (Claude Code: `claude mcp add … -- SHIM
//! --profile NAME`) in every client above. The name is checked against the profile-name rule
//! here; whether the profile exists is the daemon's to say when the client connects (an
//! unknown one is refused at `initialize`, naming `coffer profile list`).
use std::io::Write;
use std::path::{Path, PathBuf};

use clap::{Args, ValueEnum};
use serde_json::{Map, Value, json};

use crate::context::Ctx;
use crate::error::CliError;
use crate::output;

/// The server name Coffer takes in a client's configuration.
pub const SERVER_NAME: &str = coffer_runtime::codex_config::SERVER_NAME;
/// The shim's file name, looked for next to `coffer`.
pub const SHIM: &str = "coffer-mcp-shim";
/// The variable that tells the shim which home to use (written only for a home that is not the
/// default one: a client started from the desktop does not have the shell's environment).
const ENV_HOME: &str = coffer_runtime::env::HOME;

pub const CONNECT_EXAMPLES: &str = "\
Examples:
  coffer connect claude-code
  coffer connect cursor --print        # show the snippet, change nothing
  coffer connect claude-desktop --remove
  coffer connect codex --profile work  # its sessions see the profile \"work\"

Registers coffer-mcp-shim (next to this coffer) as the MCP server \"coffer\" in the client's
configuration; running it again changes nothing. Other settings in the file are kept, and the
file as it was before the first change is kept as FILE.bak. Restart the client afterwards.";

/// The MCP clients `coffer connect` knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Client {
    /// Claude Code (`claude mcp add --scope user`, else ~/.claude.json).
    ClaudeCode,
    /// OpenAI Codex CLI (~/.codex/config.toml).
    Codex,
    /// Claude Desktop (claude_desktop_config.json).
    ClaudeDesktop,
    /// Cursor (~/.cursor/mcp.json).
    Cursor,
    /// Visual Studio Code (the user profile's mcp.json).
    Vscode,
}

impl Client {
    /// The name as typed on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Client::ClaudeCode => "claude-code",
            Client::Codex => "codex",
            Client::ClaudeDesktop => "claude-desktop",
            Client::Cursor => "cursor",
            Client::Vscode => "vscode",
        }
    }

    /// The member of a JSON client's file that holds its servers (VS Code's is `servers`).
    pub fn json_section(self) -> &'static str {
        match self {
            Client::Vscode => "servers",
            _ => "mcpServers",
        }
    }

    /// The client's configuration file under `home` (`codex_home`: `$CODEX_HOME` when set).
    pub fn config_path(self, home: &Path, codex_home: Option<&Path>) -> PathBuf {
        match self {
            Client::ClaudeCode => home.join(".claude.json"),
            Client::Codex => codex_home.map_or_else(|| home.join(".codex"), Path::to_path_buf).join("config.toml"),
            Client::ClaudeDesktop if cfg!(target_os = "macos") => {
                home.join("Library/Application Support/Claude/claude_desktop_config.json")
            }
            Client::ClaudeDesktop => home.join(".config/Claude/claude_desktop_config.json"),
            Client::Cursor => home.join(".cursor/mcp.json"),
            Client::Vscode if cfg!(target_os = "macos") => home.join("Library/Application Support/Code/User/mcp.json"),
            Client::Vscode => home.join(".config/Code/User/mcp.json"),
        }
    }

    /// The `coffer` entry of a JSON client (under [`Client::json_section`]); `home`: the `COFFER_HOME` the shim must
    /// use (when it is not the default one, which the shim finds by itself).
    pub fn json_entry(self, shim: &str, home: Option<&str>) -> Value {
        self.json_entry_with(shim, home, &[])
    }

    /// [`Client::json_entry`] with the shim's `args` (`--profile NAME`, [`shim_args`]).
    pub fn json_entry_with(self, shim: &str, home: Option<&str>, args: &[String]) -> Value {
        let mut entry = match self {
            Client::ClaudeCode | Client::Vscode => json!({"type": "stdio", "command": shim, "args": args}),
            _ => json!({"command": shim, "args": args}),
        };
        if let Some(home) = home {
            entry["env"] = json!({ENV_HOME: home});
        }
        entry
    }
}

#[derive(Debug, Args)]
pub struct ConnectArgs {
    /// The MCP client to connect.
    pub client: Client,
    /// Remove Coffer from the client's configuration instead.
    #[arg(long)]
    pub remove: bool,
    /// Only print the exact snippet or command; change nothing.
    #[arg(long)]
    pub print: bool,
    /// The profile the client's sessions use (see `coffer profile list`); none: `default`.
    #[arg(long, value_name = "NAME")]
    pub profile: Option<String>,
}

/// The shim's arguments for `profile`: `["--profile", NAME]`, or none.
///
/// # Errors
/// [`CliError::Usage`]-style failure naming the rule a malformed name breaks.
pub fn shim_args(profile: Option<&str>) -> Result<Vec<String>, CliError> {
    match profile {
        None => Ok(Vec::new()),
        Some(p) => {
            coffer_api::profiles::check_profile_name(p).map_err(|e| CliError::Failed(format!("--profile: {e}")))?;
            Ok(vec!["--profile".to_owned(), p.to_owned()])
        }
    }
}

/// What a connect or remove did to a client's configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The entry was not there and was added.
    Added,
    /// An entry named `coffer` was there with another command and was replaced.
    Updated,
    /// The entry was already exactly so: nothing was written.
    Unchanged,
    /// The entry was there and was removed.
    Removed,
    /// `--remove`, and there was no entry: nothing was written.
    Absent,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Added => "added",
            Outcome::Updated => "updated",
            Outcome::Unchanged => "unchanged",
            Outcome::Removed => "removed",
            Outcome::Absent => "absent",
        }
    }

    fn changed(self) -> bool {
        matches!(self, Outcome::Added | Outcome::Updated | Outcome::Removed)
    }
}

/// A warning on stderr when a running daemon has no profile `name` (the client would be refused
/// at `initialize`): a typo is seen now, not at the client's next start. The profile may be
/// created later, so it is not an error; no daemon running (never started for this) or a failed
/// request: nothing is said.
async fn warn_if_no_such_profile(ctx: &Ctx, name: &str) {
    let Some(api) = ctx.detect_quietly().await else { return };
    let Ok(resp) = api.get_raw("/v1/mcp/profiles").await else { return };
    let Ok(page) = resp.json() else { return };
    let known: Vec<&str> = page["items"].as_array().into_iter().flatten().filter_map(|p| p["name"].as_str()).collect();
    if !known.is_empty() && !known.contains(&name) {
        output::eprint_line(&format!(
            "warning: Coffer has no profile {name} (it has: {}); the client's sessions are refused until it exists (coffer profile create {name})",
            known.join(", ")
        ));
    }
}

/// Runs `coffer connect`. Contacts the daemon only if it is running, to warn about a
/// `--profile` it does not know.
///
/// # Errors
/// Exit 1 when the shim is missing, `$HOME` is unset, the client's file cannot be parsed
/// (naming it; it is left untouched) or written, or `claude mcp …` fails.
pub async fn run(ctx: &Ctx, a: ConnectArgs) -> Result<(), CliError> {
    let args = shim_args(a.profile.as_deref())?;
    let shim = shim_path()?;
    let shim_s = shim.to_string_lossy().into_owned();
    let home = std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
        .ok_or_else(|| CliError::Failed("HOME is not set; cannot find the client's configuration".into()))?;
    let codex_home = std::env::var_os("CODEX_HOME").filter(|h| !h.is_empty()).map(PathBuf::from);
    let path = a.client.config_path(&home, codex_home.as_deref());
    let claude = if a.client == Client::ClaudeCode { coffer_runtime::connect::which_on_path("claude") } else { None };
    let coffer_home = shim_home(ctx);
    let coffer_home = coffer_home.as_deref();

    if a.print {
        return print_snippet(ctx, a.client, &path, &shim_s, coffer_home, &args, a.remove, claude.is_some());
    }
    if !shim.is_file() && !a.remove {
        return Err(CliError::Failed(format!(
            "{} does not exist; install Coffer's binaries together (./scripts/install)",
            shim.display()
        )));
    }
    let (outcome, backup, via) = match (a.client, &claude) {
        (Client::ClaudeCode, Some(claude)) => {
            (claude_cli(claude, &path, &shim_s, coffer_home, &args, a.remove).await?, None, "claude")
        }
        (Client::Codex, _) => {
            let (o, b) =
                edit_file(&path, a.remove, |text| toml_edit_coffer_with(text, &shim_s, coffer_home, &args, a.remove))?;
            (o, b, "file")
        }
        (client, _) => {
            let entry = client.json_entry_with(&shim_s, coffer_home, &args);
            let (o, b) =
                edit_file(&path, a.remove, |text| json_edit_coffer(text, client.json_section(), &entry, a.remove))?;
            (o, b, "file")
        }
    };
    if ctx.json {
        return output::print_json(&json!({
            "client": a.client.as_str(), "path": path.display().to_string(), "action": outcome.as_str(),
            "changed": outcome.changed(), "backup": backup.map(|b| b.display().to_string()),
            "command": shim_s, "via": via, "coffer_home": coffer_home, "profile": a.profile,
        }));
    }
    let client = a.client.as_str();
    let shown = path.display();
    let mut out = match outcome {
        Outcome::Added => {
            format!("Connected {client} to Coffer: added the MCP server \"coffer\" ({shim_s}) to {shown}\n")
        }
        Outcome::Updated | Outcome::Unchanged if a.profile.is_some() && !a.remove => {
            let p = a.profile.as_deref().unwrap_or_default();
            format!(
                "Connected {client} to Coffer with the profile {p} ({shown}{})\n",
                if outcome.changed() { "" } else { "; nothing changed" }
            )
        }
        Outcome::Updated => {
            format!("Connected {client} to Coffer: the MCP server \"coffer\" in {shown} now runs {shim_s}\n")
        }
        Outcome::Unchanged => format!("{client} is already connected to Coffer ({shown}); nothing changed\n"),
        Outcome::Removed => format!("Removed the MCP server \"coffer\" from {shown}\n"),
        Outcome::Absent => format!("{client} has no MCP server \"coffer\" in {shown}; nothing changed\n"),
    };
    if let Some(b) = &backup {
        out.push_str(&format!("The file as it was before is kept as {}\n", b.display()));
    }
    if let Some(p) = a.profile.as_deref().filter(|_| !a.remove) {
        warn_if_no_such_profile(ctx, p).await;
    }
    if outcome.changed() {
        out.push_str(&format!("Restart {client} to pick it up.\n"));
    }
    output::print(&out)
}

/// The home the shim must be told about: the one in use unless it is the default (absolute, so
/// the client may start the shim from any folder).
fn shim_home(ctx: &Ctx) -> Option<String> {
    if ctx.home_source == crate::context::HomeSource::Default {
        return None;
    }
    let root = ctx.home.root();
    let abs = if root.is_absolute() {
        root.to_path_buf()
    } else {
        std::env::current_dir().map_or_else(|_| root.to_path_buf(), |cwd| cwd.join(root))
    };
    Some(abs.to_string_lossy().into_owned())
}

/// `coffer-mcp-shim` next to the running `coffer`.
fn shim_path() -> Result<PathBuf, CliError> {
    let exe =
        std::env::current_exe().map_err(|e| CliError::Failed(format!("cannot find this coffer executable: {e}")))?;
    Ok(exe.parent().map_or_else(|| PathBuf::from(SHIM), |d| d.join(SHIM)))
}

/// `--print`: the exact snippet or command on stdout; where it goes on stderr. With `--json`,
/// one object instead: `{client, path, remove, kind, instruction, snippet}`, `kind` being
/// `command` (run it), `toml` or `json` (merge it into `path`) or `key` (delete it from `path`).
#[allow(clippy::too_many_arguments)] // the entry's parts and the output's, each used once
fn print_snippet(
    ctx: &Ctx,
    client: Client,
    path: &Path,
    shim: &str,
    home: Option<&str>,
    args: &[String],
    remove: bool,
    claude: bool,
) -> Result<(), CliError> {
    let shown = path.display();
    let (kind, instruction, snippet) = match (client, remove) {
        (Client::ClaudeCode, false) if claude => {
            let args = claude_add_args(shim, home, args);
            ("command", None, format!("claude {}\n", output::shell_join(args.iter().map(String::as_str))))
        }
        (Client::ClaudeCode, true) if claude => {
            ("command", None, format!("claude mcp remove --scope user {SERVER_NAME}\n"))
        }
        (Client::Codex, false) => (
            "toml",
            Some(format!("Add to {shown}:")),
            toml_edit_coffer_with("", shim, home, args, false).map_err(CliError::Failed)?.1.unwrap_or_default(),
        ),
        (Client::Codex, true) => {
            ("key", Some(format!("Delete this table from {shown}:")), format!("[mcp_servers.{SERVER_NAME}]\n"))
        }
        (client, false) => {
            let doc = json!({client.json_section(): {SERVER_NAME: client.json_entry_with(shim, home, args)}});
            (
                "json",
                Some(format!("Merge into {shown}:")),
                format!("{}\n", serde_json::to_string_pretty(&doc).unwrap_or_default()),
            )
        }
        (client, true) => (
            "key",
            Some(format!("Delete this key from {shown}:")),
            format!("{}.{SERVER_NAME}\n", client.json_section()),
        ),
    };
    if ctx.json {
        return output::print_json(&json!({
            "client": client.as_str(), "path": path.display().to_string(), "remove": remove,
            "kind": kind, "instruction": instruction, "snippet": snippet,
        }));
    }
    if let Some(instruction) = instruction {
        crate::eprintln_printable!("# {instruction}");
    }
    output::print(&snippet)
}

// ---------------------------------------------------------------------------------------------
// Claude Code through its own CLI

/// Adds or removes the server with `claude mcp …` (user scope). Idempotent: `~/.claude.json`
/// (where that scope lives) is read first, and `claude` only runs when something must change.
async fn claude_cli(
    claude: &Path,
    config: &Path,
    shim: &str,
    home: Option<&str>,
    shim_args: &[String],
    remove: bool,
) -> Result<Outcome, CliError> {
    let current = match std::fs::read_to_string(config) {
        Ok(text) if !text.trim().is_empty() => serde_json::from_str::<Value>(&text).ok(),
        _ => None,
    };
    let entry = current.as_ref().and_then(|v| v.get("mcpServers")).and_then(|m| m.get(SERVER_NAME));
    let run = |args: Vec<String>| async move { run_claude(claude, &args).await };
    let name = SERVER_NAME.to_owned();
    if remove {
        if entry.is_none() {
            return Ok(Outcome::Absent);
        }
        run(vec!["mcp".into(), "remove".into(), "--scope".into(), "user".into(), name]).await?;
        return Ok(Outcome::Removed);
    }
    if entry.is_some_and(|e| same_entry(e, shim, home, shim_args)) {
        return Ok(Outcome::Unchanged);
    }
    let outcome = if entry.is_some() {
        run(vec!["mcp".into(), "remove".into(), "--scope".into(), "user".into(), name.clone()]).await?;
        Outcome::Updated
    } else {
        Outcome::Added
    };
    run(claude_add_args(shim, home, shim_args)).await?;
    Ok(outcome)
}

/// `claude` arguments that add the server (user scope), with the home when it must be given.
fn claude_add_args(shim: &str, home: Option<&str>, shim_args: &[String]) -> Vec<String> {
    let mut args: Vec<String> = ["mcp", "add", "--scope", "user", SERVER_NAME].map(str::to_owned).into();
    if let Some(home) = home {
        args.extend(["--env".to_owned(), format!("{ENV_HOME}={home}")]);
    }
    args.extend(["--".to_owned(), shim.to_owned()]);
    args.extend(shim_args.iter().cloned());
    args
}

/// Runs `claude ARGS` to completion through the one spawn helper.
async fn run_claude(claude: &Path, args: &[String]) -> Result<(), CliError> {
    use coffer_runtime::spawn::{SpawnSpec, spawn};
    use tokio::io::AsyncReadExt;

    let mut spec = SpawnSpec::new(claude, "client", "claude");
    spec.args = args.iter().map(Into::into).collect();
    spec.stdin = std::process::Stdio::null();
    spec.stdout = std::process::Stdio::piped();
    spec.stderr = std::process::Stdio::piped();
    let shown = format!("claude {}", output::shell_join(args.iter().map(String::as_str)));
    let mut child = spawn(spec).map_err(|e| CliError::Failed(format!("cannot run `{shown}`: {e}")))?;
    let mut stdout = child.inner().stdout.take();
    let mut stderr = child.inner().stderr.take();
    let (mut out, mut err) = (String::new(), String::new());
    let read_out = async {
        if let Some(s) = stdout.as_mut() {
            let _ = s.read_to_string(&mut out).await;
        }
    };
    let read_err = async {
        if let Some(s) = stderr.as_mut() {
            let _ = s.read_to_string(&mut err).await;
        }
    };
    tokio::join!(read_out, read_err);
    let status = child.wait().await.map_err(|e| CliError::Failed(format!("`{shown}` failed: {e}")))?;
    if status.success() {
        return Ok(());
    }
    let said = format!("{}{}", err.trim(), out.trim());
    Err(CliError::Failed(format!("`{shown}` failed ({status}): {}", output::truncate(&said, 400))))
}

/// True when a client's entry already runs exactly `shim` with exactly `args` (none: no or
/// empty `args`), and with no environment but `COFFER_HOME=home` when `home` is given.
fn same_entry(e: &Value, shim: &str, home: Option<&str>, args: &[String]) -> bool {
    let empty = |k: &str| match e.get(k) {
        None | Some(Value::Null) => true,
        Some(Value::Array(a)) => a.is_empty(),
        Some(Value::Object(o)) => o.is_empty(),
        _ => false,
    };
    let env_ok = match home {
        None => empty("env"),
        Some(home) => e.get("env") == Some(&json!({ENV_HOME: home})),
    };
    let args_ok = if args.is_empty() { empty("args") } else { e.get("args") == Some(&json!(args)) };
    e["command"] == shim && args_ok && env_ok && e.get("type").is_none_or(|t| t == "stdio") && e.get("url").is_none()
}

// ---------------------------------------------------------------------------------------------
// Editing the files

/// Applies `edit` to the text of `path` (empty when it does not exist) and, when it returns new
/// text, writes it atomically, keeping the previous file as `<path>.bak` unless one exists.
/// With `remove` a missing file is left missing.
///
/// `edit` returns the outcome and the new text (`None`: write nothing).
///
/// # Errors
/// [`CliError::Failed`] naming the file for a read, parse or write failure.
fn edit_file(
    path: &Path,
    remove: bool,
    edit: impl FnOnce(&str) -> Result<(Outcome, Option<String>), String>,
) -> Result<(Outcome, Option<PathBuf>), CliError> {
    let shown = path.display();
    let existing = match std::fs::read_to_string(path) {
        Ok(t) => Some(t),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(CliError::Failed(format!("cannot read {shown}: {e}"))),
    };
    if existing.is_none() && remove {
        return Ok((Outcome::Absent, None));
    }
    let (outcome, text) = edit(existing.as_deref().unwrap_or(""))
        .map_err(|e| CliError::Failed(format!("{shown}: {e}; it was left as it is")))?;
    let Some(text) = text else {
        return Ok((outcome, None));
    };
    let mut backup = None;
    if existing.is_some() {
        let bak = PathBuf::from(format!("{}.bak", path.display()));
        if !bak.exists() {
            std::fs::copy(path, &bak).map_err(|e| CliError::Failed(format!("cannot keep a copy of {shown}: {e}")))?;
            backup = Some(bak);
        }
    }
    write_atomically(path, text.as_bytes()).map_err(|e| CliError::Failed(format!("cannot write {shown}: {e}")))?;
    Ok((outcome, backup))
}

/// Writes `bytes` to a temporary file beside `path`, then renames it over `path`: readers see
/// the old file or the new one, never a part. Keeps the old file's permissions (new files: 0600,
/// since client configs hold tokens); creates missing parent folders.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let mode = std::fs::metadata(path).map(|m| m.permissions().mode() & 0o7777).unwrap_or(0o600);
    let file_name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{file_name}.coffer-{}.tmp", std::process::id()));
    let result = (|| {
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(mode).open(&tmp)?;
        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Sets (or with `remove`, deletes) `<section>.coffer` (`mcpServers`, VS Code's `servers`) in the
/// JSON text of a client's file, keeping every other key in its order and the file's indentation.
///
/// # Errors
/// A message when the text is not a JSON object, or `section` is not an object.
pub fn json_edit_coffer(
    text: &str,
    section: &str,
    entry: &Value,
    remove: bool,
) -> Result<(Outcome, Option<String>), String> {
    let mut doc: Value = if text.trim().is_empty() {
        Value::Object(Map::new())
    } else {
        serde_json::from_str(text).map_err(|e| {
            // JSON with comments (VS Code's files may have them) is valid to its client, but
            // rewriting it would drop the comments: say so, and how to add the entry by hand.
            if serde_json::from_str::<Value>(&crate::commands::import::strip_jsonc(text)).is_ok() {
                "it has comments or trailing commas (JSON with comments), which rewriting it would lose; add the \
                 entry by hand: `--print` shows it"
                    .to_owned()
            } else {
                format!("not valid JSON at line {} column {}", e.line(), e.column())
            }
        })?
    };
    let root = doc.as_object_mut().ok_or("the file is not a JSON object")?;
    let outcome = if remove {
        let Some(servers) = root.get_mut(section) else {
            return Ok((Outcome::Absent, None));
        };
        let servers = servers.as_object_mut().ok_or_else(|| format!("{section} is not an object"))?;
        if servers.shift_remove(SERVER_NAME).is_none() {
            return Ok((Outcome::Absent, None));
        }
        Outcome::Removed
    } else {
        let servers = root.entry(section).or_insert_with(|| Value::Object(Map::new()));
        let servers = servers.as_object_mut().ok_or_else(|| format!("{section} is not an object"))?;
        let shim = entry["command"].as_str().unwrap_or_default();
        let home = entry["env"][ENV_HOME].as_str();
        let args: Vec<String> =
            entry["args"].as_array().into_iter().flatten().filter_map(Value::as_str).map(str::to_owned).collect();
        match servers.get(SERVER_NAME) {
            Some(e) if same_entry(e, shim, home, &args) => return Ok((Outcome::Unchanged, None)),
            Some(_) => {
                servers.insert(SERVER_NAME.to_owned(), entry.clone());
                Outcome::Updated
            }
            None => {
                servers.insert(SERVER_NAME.to_owned(), entry.clone());
                Outcome::Added
            }
        }
    };
    Ok((outcome, Some(to_json_text(&doc, &detect_indent(text)))))
}

/// The indentation unit of a JSON text: the leading blanks of its first indented line; two
/// spaces when it has none.
fn detect_indent(text: &str) -> String {
    text.lines()
        .skip(1)
        .map(|l| &l[..l.len() - l.trim_start_matches([' ', '\t']).len()])
        .find(|ws| !ws.is_empty())
        .unwrap_or("  ")
        .to_owned()
}

/// `doc` pretty-printed with `indent` as the indentation unit, ending in a newline.
fn to_json_text(doc: &Value, indent: &str) -> String {
    let pretty = serde_json::to_string_pretty(doc).expect("a JSON value serializes");
    let mut out = String::with_capacity(pretty.len() + 1);
    // serde_json indents with two spaces; a newline inside a value is always escaped, so every
    // line's leading spaces are indentation.
    for line in pretty.lines() {
        let body = line.trim_start_matches(' ');
        out.push_str(&indent.repeat((line.len() - body.len()) / 2));
        out.push_str(body);
        out.push('\n');
    }
    out
}

/// Sets (or with `remove`, deletes) `[mcp_servers.coffer]` in the TOML text of Codex's
/// `config.toml`, keeping comments, order and layout of everything else.
///
/// # Errors
/// A message when the text is not TOML, or `mcp_servers` is not a table.
pub fn toml_edit_coffer(
    text: &str,
    shim: &str,
    home: Option<&str>,
    remove: bool,
) -> Result<(Outcome, Option<String>), String> {
    toml_edit_coffer_with(text, shim, home, &[], remove)
}

/// [`toml_edit_coffer`] with the shim's `args` (`--profile NAME`).
///
/// # Errors
/// As [`toml_edit_coffer`].
pub fn toml_edit_coffer_with(
    text: &str,
    shim: &str,
    home: Option<&str>,
    args: &[String],
    remove: bool,
) -> Result<(Outcome, Option<String>), String> {
    let mut config = coffer_runtime::codex_config::CodexConfig::parse(text)?;
    if remove {
        return Ok(if config.remove_coffer_server()? {
            (Outcome::Removed, Some(config.to_string()))
        } else {
            (Outcome::Absent, None)
        });
    }
    let current = config.coffer_server_is_with(shim, home, args);
    if current == Some(true) {
        return Ok((Outcome::Unchanged, None));
    }
    config.set_coffer_server_with(shim, home, args)?;
    Ok((if current.is_some() { Outcome::Updated } else { Outcome::Added }, Some(config.to_string())))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHIM_PATH: &str = "/opt/coffer/bin/coffer-mcp-shim";

    fn entry() -> Value {
        Client::Cursor.json_entry(SHIM_PATH, None)
    }

    #[test]
    fn paths() {
        let h = Path::new("/h");
        assert_eq!(Client::ClaudeCode.config_path(h, None), Path::new("/h/.claude.json"));
        assert_eq!(Client::Codex.config_path(h, None), Path::new("/h/.codex/config.toml"));
        assert_eq!(Client::Codex.config_path(h, Some(Path::new("/c"))), Path::new("/c/config.toml"));
        assert_eq!(Client::Cursor.config_path(h, None), Path::new("/h/.cursor/mcp.json"));
        #[cfg(target_os = "linux")]
        assert_eq!(
            Client::ClaudeDesktop.config_path(h, None),
            Path::new("/h/.config/Claude/claude_desktop_config.json")
        );
    }

    #[test]
    fn json_add_is_idempotent_and_keeps_other_keys() {
        let text = "{\n    \"theme\": \"dark\",\n    \"mcpServers\": {\n        \"fs\": {\"command\": \"npx\"}\n    },\n    \"z\": 1\n}\n";
        let (o, new) = json_edit_coffer(text, "mcpServers", &entry(), false).unwrap();
        assert_eq!(o, Outcome::Added);
        let new = new.unwrap();
        assert!(new.starts_with("{\n    \"theme\": \"dark\",\n    \"mcpServers\": {\n        \"fs\": {"), "{new}");
        let v: Value = serde_json::from_str(&new).unwrap();
        assert_eq!(v["mcpServers"]["coffer"], entry());
        assert_eq!(v["mcpServers"]["fs"]["command"], "npx");
        assert_eq!(v["z"], 1);
        let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["theme", "mcpServers", "z"], "order kept");
        // Twice is once.
        assert_eq!(json_edit_coffer(&new, "mcpServers", &entry(), false).unwrap(), (Outcome::Unchanged, None));
        // Another command: updated.
        let other = new.replace(SHIM_PATH, "/old/coffer-mcp-shim");
        assert_eq!(json_edit_coffer(&other, "mcpServers", &entry(), false).unwrap().0, Outcome::Updated);
        // Remove, then remove again.
        let (o, removed) = json_edit_coffer(&new, "mcpServers", &entry(), true).unwrap();
        assert_eq!(o, Outcome::Removed);
        let removed = removed.unwrap();
        let v: Value = serde_json::from_str(&removed).unwrap();
        assert_eq!(v["mcpServers"], json!({"fs": {"command": "npx"}}));
        assert_eq!(json_edit_coffer(&removed, "mcpServers", &entry(), true).unwrap(), (Outcome::Absent, None));
    }

    #[test]
    fn json_with_comments_is_left_alone_with_a_way_forward() {
        let text = "{\n  // my servers\n  \"servers\": {\"fs\": {\"command\": \"npx\"},},\n}\n";
        let e = json_edit_coffer(text, "servers", &entry(), false).unwrap_err();
        assert!(e.contains("comments or trailing commas") && e.contains("--print"), "{e}");
        let e = json_edit_coffer("{\"servers\": ", "servers", &entry(), false).unwrap_err();
        assert!(e.starts_with("not valid JSON at line 1"), "{e}");
    }

    #[test]
    fn json_edge_cases() {
        let (o, t) = json_edit_coffer("", "mcpServers", &entry(), false).unwrap();
        assert_eq!(o, Outcome::Added);
        assert_eq!(
            t.unwrap(),
            format!(
                "{{\n  \"mcpServers\": {{\n    \"coffer\": {{\n      \"command\": \"{SHIM_PATH}\",\n      \"args\": []\n    }}\n  }}\n}}\n"
            )
        );
        assert_eq!(json_edit_coffer("{}", "mcpServers", &entry(), true).unwrap(), (Outcome::Absent, None));
        assert!(json_edit_coffer("{\"a\": ", "mcpServers", &entry(), false).unwrap_err().contains("line 1"));
        assert!(json_edit_coffer("[]", "mcpServers", &entry(), false).unwrap_err().contains("not a JSON object"));
        assert!(
            json_edit_coffer("{\"mcpServers\": []}", "mcpServers", &entry(), false)
                .unwrap_err()
                .contains("not an object")
        );
        // Claude Code's own shape, with an empty env, counts as the same entry.
        let cc = json!({"mcpServers": {"coffer": {"type": "stdio", "command": SHIM_PATH, "args": [], "env": {}}}});
        let e = Client::ClaudeCode.json_entry(SHIM_PATH, None);
        assert_eq!(json_edit_coffer(&cc.to_string(), "mcpServers", &e, false).unwrap(), (Outcome::Unchanged, None));
    }

    #[test]
    fn toml_add_remove_keeps_the_rest() {
        let text = "# my codex config\nmodel = \"o3\"  # fast\n\n[mcp_servers.fs]\ncommand = \"npx\"\nargs = [\"-y\", \"fs\"]\n\n[profiles.x]\nmodel = \"y\"\n";
        let (o, new) = toml_edit_coffer(text, SHIM_PATH, None, false).unwrap();
        assert_eq!(o, Outcome::Added);
        let new = new.unwrap();
        for part in [
            "# my codex config\nmodel = \"o3\"  # fast\n",
            "[mcp_servers.fs]\ncommand = \"npx\"\nargs = [\"-y\", \"fs\"]\n",
            "[profiles.x]\nmodel = \"y\"\n",
        ] {
            assert!(new.contains(part), "{part} kept in {new}");
        }
        assert!(new.contains(&format!("[mcp_servers.coffer]\ncommand = \"{SHIM_PATH}\"\nargs = []\n")), "{new}");
        assert_eq!(toml_edit_coffer(&new, SHIM_PATH, None, false).unwrap(), (Outcome::Unchanged, None));
        assert_eq!(toml_edit_coffer(&new, "/other/shim", None, false).unwrap().0, Outcome::Updated);
        let (o, removed) = toml_edit_coffer(&new, SHIM_PATH, None, true).unwrap();
        assert_eq!(o, Outcome::Removed);
        assert_eq!(removed.unwrap().trim_end(), text.trim_end());
        assert_eq!(toml_edit_coffer(text, SHIM_PATH, None, true).unwrap(), (Outcome::Absent, None));
        // From nothing, and back to nothing.
        let (_, fresh) = toml_edit_coffer("", SHIM_PATH, None, false).unwrap();
        let fresh = fresh.unwrap();
        assert_eq!(fresh, format!("[mcp_servers.coffer]\ncommand = \"{SHIM_PATH}\"\nargs = []\n"));
        assert_eq!(toml_edit_coffer(&fresh, SHIM_PATH, None, true).unwrap().1.unwrap().trim(), "");
        // An inline table stays inline.
        let (_, inline) =
            toml_edit_coffer("mcp_servers = { fs = { command = \"npx\" } }\n", SHIM_PATH, None, false).unwrap();
        let inline = inline.unwrap();
        assert!(inline.contains("coffer = { command = "), "{inline}");
        assert!(toml_edit_coffer("x = [", SHIM_PATH, None, false).unwrap_err().contains("not valid TOML"));
        assert!(toml_edit_coffer("mcp_servers = 3", SHIM_PATH, None, false).unwrap_err().contains("not a table"));
    }

    #[test]
    fn files_are_written_atomically_with_one_backup() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sub/mcp.json");
        // Removing from a missing file creates nothing.
        let r = edit_file(&p, true, |t| json_edit_coffer(t, "mcpServers", &entry(), true)).unwrap();
        assert_eq!(r, (Outcome::Absent, None));
        assert!(!p.exists());
        let (o, bak) = edit_file(&p, false, |t| json_edit_coffer(t, "mcpServers", &entry(), false)).unwrap();
        assert_eq!((o, bak), (Outcome::Added, None), "no backup of a file that did not exist");
        assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o600);
        std::fs::write(&p, "{\"keep\": true}").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        let (_, bak) = edit_file(&p, false, |t| json_edit_coffer(t, "mcpServers", &entry(), false)).unwrap();
        let bak = bak.unwrap();
        assert_eq!(std::fs::read_to_string(&bak).unwrap(), "{\"keep\": true}");
        assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o644, "mode kept");
        // The backup is taken once: a later change keeps the first one.
        let (o, again) = edit_file(&p, true, |t| json_edit_coffer(t, "mcpServers", &entry(), true)).unwrap();
        assert_eq!((o, again), (Outcome::Removed, None));
        assert_eq!(std::fs::read_to_string(&bak).unwrap(), "{\"keep\": true}");
        let left: Vec<_> = std::fs::read_dir(p.parent().unwrap()).unwrap().flatten().map(|e| e.file_name()).collect();
        assert_eq!(left.len(), 2, "no temporary file left: {left:?}");
        // A file that does not parse is left untouched.
        std::fs::write(&p, "{oops").unwrap();
        let e = edit_file(&p, false, |t| json_edit_coffer(t, "mcpServers", &entry(), false)).unwrap_err();
        assert!(e.to_string().contains("left as it is"), "{e}");
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "{oops");
    }

    #[test]
    fn a_home_that_is_not_the_default_is_written_for_the_shim() {
        const HOME: &str = "/srv/vault home";
        // JSON clients: the entry carries it, and only the same home is "unchanged".
        let entry = Client::Cursor.json_entry(SHIM_PATH, Some(HOME));
        assert_eq!(entry, json!({"command": SHIM_PATH, "args": [], "env": {"COFFER_HOME": HOME}}));
        let (o, text) = json_edit_coffer("", "mcpServers", &entry, false).unwrap();
        assert_eq!(o, Outcome::Added);
        let text = text.unwrap();
        assert_eq!(json_edit_coffer(&text, "mcpServers", &entry, false).unwrap(), (Outcome::Unchanged, None));
        let other = Client::Cursor.json_entry(SHIM_PATH, Some("/elsewhere"));
        assert_eq!(json_edit_coffer(&text, "mcpServers", &other, false).unwrap().0, Outcome::Updated);
        let default = Client::Cursor.json_entry(SHIM_PATH, None);
        assert_eq!(
            json_edit_coffer(&text, "mcpServers", &default, false).unwrap().0,
            Outcome::Updated,
            "back to the default home"
        );
        // Codex: an env table, compared the same way.
        let (_, toml) = toml_edit_coffer("", SHIM_PATH, Some(HOME), false).unwrap();
        let toml = toml.unwrap();
        let parsed: toml_edit::DocumentMut = toml.parse().unwrap();
        assert_eq!(parsed["mcp_servers"]["coffer"]["env"]["COFFER_HOME"].as_str(), Some(HOME), "{toml}");
        assert_eq!(toml_edit_coffer(&toml, SHIM_PATH, Some(HOME), false).unwrap(), (Outcome::Unchanged, None));
        assert_eq!(toml_edit_coffer(&toml, SHIM_PATH, None, false).unwrap().0, Outcome::Updated);
        // Claude Code's CLI: --env after the name, the command after `--`.
        assert_eq!(
            claude_add_args(SHIM_PATH, Some(HOME), &[]),
            ["mcp", "add", "--scope", "user", "coffer", "--env", "COFFER_HOME=/srv/vault home", "--", SHIM_PATH]
        );
        assert_eq!(claude_add_args(SHIM_PATH, None, &[]), ["mcp", "add", "--scope", "user", "coffer", "--", SHIM_PATH]);
        // A profile: the shim's own arguments follow it; the same entry again is unchanged.
        let args = shim_args(Some("work")).unwrap();
        assert_eq!(
            claude_add_args(SHIM_PATH, None, &args),
            ["mcp", "add", "--scope", "user", "coffer", "--", SHIM_PATH, "--profile", "work"]
        );
        let (_, toml) = toml_edit_coffer_with("", SHIM_PATH, None, &args, false).unwrap();
        let toml = toml.unwrap();
        assert_eq!(toml_edit_coffer_with(&toml, SHIM_PATH, None, &args, false).unwrap(), (Outcome::Unchanged, None));
        assert_eq!(toml_edit_coffer(&toml, SHIM_PATH, None, false).unwrap().0, Outcome::Updated);
        let entry = Client::Cursor.json_entry_with(SHIM_PATH, None, &args);
        let (_, text) = json_edit_coffer("", "mcpServers", &entry, false).unwrap();
        assert_eq!(json_edit_coffer(&text.unwrap(), "mcpServers", &entry, false).unwrap(), (Outcome::Unchanged, None));
        assert!(shim_args(Some("Work")).is_err());
    }
}
