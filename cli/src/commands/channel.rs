//! `coffer channel add|list|show|edit|enable|disable|remove|pair|unpair`: the IM channels the
//! owner drives conversations from (`/v1/channels…`): a Telegram bot or a SeaTalk app, its
//! default agent, and its owner, set by pairing (`pair` prints a one-time code to send to the
//! bot).
//!
//! A secret is never a command-line argument (shell history and `ps` would show it): `--*-env
//! VAR` reads it from the environment, `--bot-token-stdin` from standard input (or a prompt
//! without echo on a terminal), or `--*-credential NAME` names a stored credential. The daemon
//! stores secrets in the credential store, never in the channel.
use std::io::{IsTerminal, Read};

use clap::{ArgGroup, Args, Subcommand};
use coffer_api::Page;
use coffer_api::channels::{Adapter, AgentConfig, Channel, ChannelCreate, ChannelPatch, PairingCode, PairingRequest};
use coffer_types::channels as rules;
use secrecy::{ExposeSecret, SecretString};
use serde_json::{Value, json};

use crate::api::path_segment;
use crate::context::Ctx;
use crate::error::CliError;
use crate::output::{self, render_fields, render_table_fitted, text_cell};

const ADD_EXAMPLES: &str = "\
Examples:
  coffer channel add home --kind telegram --bot-token-env TELEGRAM_BOT_TOKEN
  printf %s \"$TOKEN\" | coffer channel add home --kind telegram --bot-token-stdin --cwd ~/src/app
  coffer channel add work --kind seatalk --app-id-env SEATALK_APP_ID \\
      --app-secret-env SEATALK_APP_SECRET --signing-secret-env SEATALK_SIGNING_SECRET --agent codex

Then pair it: `coffer channel pair NAME` prints a one-time code; send `/pair CODE` to the bot
from your own chat, and only that chat is served. Secrets are stored in the credential store as
channel-NAME-bot-token (-app-id, -app-secret, -signing-secret) unless --*-credential names
another; they are never taken from the command line.";

const EDIT_EXAMPLES: &str = "\
Examples:
  coffer channel edit home --bot-token-env NEW_TOKEN     # replace the token (restarts the adapter)
  coffer channel edit home --model claude-opus-4-1 --cwd ~/src/other
  coffer channel edit home --api-base-url ''

An empty value ('') clears --api-base-url, --agent, --cwd and --model. Options not given stay.";

const PAIR_EXAMPLES: &str = "\
Examples:
  coffer channel pair home
  coffer channel pair home --ttl 30m

Prints a one-time code and what to send where. The first chat that sends `/pair CODE` to the bot
before it expires becomes the owner (replacing the previous one); five wrong tries void it.";

#[derive(Debug, Subcommand)]
pub enum ChannelCommand {
    /// Add a channel (a Telegram bot or a SeaTalk app).
    #[command(after_help = ADD_EXAMPLES)]
    Add(AddArgs),
    /// List the channels with their owner and adapter state.
    #[command(after_help = "Examples:\n  coffer channel list\n  coffer channel list --json | jq -r '.items[].name'")]
    List(NoArgs),
    /// Show one channel (never its secrets).
    #[command(after_help = "Example:\n  coffer channel show home")]
    Show(NameArg),
    /// Change a channel; options not given stay as they are.
    #[command(after_help = EDIT_EXAMPLES)]
    Edit(EditArgs),
    /// Enable a channel (its adapter starts).
    Enable(NameArg),
    /// Disable a channel (its adapter stops; a running turn finishes).
    Disable(NameArg),
    /// Remove a channel (and the credentials made for it).
    Remove(NameArg),
    /// Print a one-time pairing code; the chat that sends it to the bot becomes the owner.
    #[command(after_help = PAIR_EXAMPLES)]
    Pair(PairArgs),
    /// Forget the owner: every chat is refused until the next pairing.
    Unpair(NameArg),
}

#[derive(Debug, Args)]
pub struct NoArgs {}

#[derive(Debug, Args)]
pub struct NameArg {
    /// The channel's name.
    pub name: String,
}

#[derive(Debug, Args)]
pub struct PairArgs {
    /// The channel's name.
    pub name: String,
    /// How long the code is valid: 60s-1h, e.g. 90s, 10m, 1h (default 10m).
    #[arg(long, value_parser = parse_ttl, value_name = "DURATION")]
    pub ttl: Option<u32>,
}

/// Where the secrets come from (never the command line).
#[derive(Debug, Default, Args)]
#[command(group(ArgGroup::new("bot_token").args(["bot_token_env", "bot_token_stdin", "bot_token_credential"])))]
#[command(group(ArgGroup::new("app_id").args(["app_id_env", "app_id_credential"])))]
#[command(group(ArgGroup::new("app_secret").args(["app_secret_env", "app_secret_credential"])))]
#[command(group(ArgGroup::new("signing_secret").args(["signing_secret_env", "signing_secret_credential"])))]
pub struct SecretArgs {
    /// telegram: read the bot token from environment variable VAR.
    #[arg(long, value_name = "VAR")]
    pub bot_token_env: Option<String>,
    /// telegram: read the bot token from standard input (prompted for without echo on a terminal).
    #[arg(long)]
    pub bot_token_stdin: bool,
    /// telegram: the stored credential holding the bot token.
    #[arg(long, value_name = "NAME")]
    pub bot_token_credential: Option<String>,
    /// seatalk: read the app id from environment variable VAR.
    #[arg(long, value_name = "VAR")]
    pub app_id_env: Option<String>,
    /// seatalk: the stored credential holding the app id.
    #[arg(long, value_name = "NAME")]
    pub app_id_credential: Option<String>,
    /// seatalk: read the app secret from environment variable VAR.
    #[arg(long, value_name = "VAR")]
    pub app_secret_env: Option<String>,
    /// seatalk: the stored credential holding the app secret.
    #[arg(long, value_name = "NAME")]
    pub app_secret_credential: Option<String>,
    /// seatalk: read the signing secret from environment variable VAR.
    #[arg(long, value_name = "VAR")]
    pub signing_secret_env: Option<String>,
    /// seatalk: the stored credential holding the signing secret.
    #[arg(long, value_name = "NAME")]
    pub signing_secret_credential: Option<String>,
}

/// The agent options shared by `add` and `edit`.
#[derive(Debug, Default, Args)]
pub struct AgentArgs {
    /// The agent of the channel's new conversations: claude_code or codex (default claude_code).
    #[arg(long, value_name = "AGENT")]
    pub agent: Option<String>,
    /// The agent's working directory (made absolute).
    #[arg(long, value_name = "DIR")]
    pub cwd: Option<String>,
    /// The agent's model (default: the agent's own).
    #[arg(long, value_name = "MODEL")]
    pub model: Option<String>,
    /// The permission mode of the conversations the channel creates: bypass, ask or read-only
    /// (default: the agent's default; '' clears it).
    #[arg(long, value_name = "MODE", value_parser = parse_mode)]
    pub permission_mode: Option<String>,
    /// The platform's API base URL (tests, self-hosted Bot API servers; default: the public one).
    #[arg(long, value_name = "URL")]
    pub api_base_url: Option<String>,
}

#[derive(Debug, Args)]
pub struct AddArgs {
    /// The channel's name: 1-32 characters a-z, 0-9 and '-', starting with a letter or digit.
    #[arg(value_parser = parse_name)]
    pub name: String,
    /// telegram or seatalk.
    #[arg(long, value_parser = parse_kind)]
    pub kind: String,
    #[command(flatten)]
    pub secrets: SecretArgs,
    #[command(flatten)]
    pub agent: AgentArgs,
    /// Add it disabled (no adapter runs until `coffer channel enable NAME`).
    #[arg(long)]
    pub disabled: bool,
}

#[derive(Debug, Args)]
pub struct EditArgs {
    /// The channel's name.
    pub name: String,
    #[command(flatten)]
    pub secrets: SecretArgs,
    #[command(flatten)]
    pub agent: AgentArgs,
}

/// Runs one `coffer channel …` command.
///
/// # Errors
/// Exit 2 for bad options (a missing variable, an empty secret), 3 for an unknown channel, 4 for
/// a conflict, 5 when the daemon cannot be reached.
pub async fn run(ctx: &Ctx, cmd: ChannelCommand) -> Result<(), CliError> {
    match cmd {
        ChannelCommand::Add(a) => add(ctx, a).await,
        ChannelCommand::List(_) => list(ctx).await,
        ChannelCommand::Show(a) => show(ctx, &a.name).await,
        ChannelCommand::Edit(a) => edit(ctx, a).await,
        ChannelCommand::Enable(a) => set_enabled(ctx, &a.name, true).await,
        ChannelCommand::Disable(a) => set_enabled(ctx, &a.name, false).await,
        ChannelCommand::Remove(a) => remove(ctx, &a.name).await,
        ChannelCommand::Pair(a) => pair(ctx, a).await,
        ChannelCommand::Unpair(a) => unpair(ctx, &a.name).await,
    }
}

fn parse_name(s: &str) -> Result<String, String> {
    rules::check_name(s).map(|()| s.to_owned())
}

fn parse_kind(s: &str) -> Result<String, String> {
    if rules::KINDS.contains(&s) {
        Ok(s.to_owned())
    } else {
        Err(format!("{s:?} is not a channel kind; use {}", rules::KINDS.join(" or ")))
    }
}

/// A pairing lifetime: `600`, `90s`, `10m`, `1h` → seconds, within 60 s-1 h.
pub fn parse_ttl(s: &str) -> Result<u32, String> {
    let t = s.trim();
    let (digits, unit) = match t.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => (&t[..i], &t[i..]),
        None => (t, "s"),
    };
    let n: u32 = digits.parse().map_err(|_| format!("{s:?} is not a duration like 90s, 10m or 1h"))?;
    let secs = match unit {
        "s" => Some(n),
        "m" => n.checked_mul(60),
        "h" => n.checked_mul(3600),
        _ => None,
    }
    .ok_or_else(|| format!("{s:?} is not a duration like 90s, 10m or 1h"))?;
    if !(rules::PAIRING_TTL_MIN_S..=rules::PAIRING_TTL_MAX_S).contains(&secs) {
        return Err(format!("{s:?} is outside 60s-1h"));
    }
    Ok(secs)
}

fn channel_path(name: &str) -> String {
    format!("/v1/channels/{}", path_segment(name))
}

/// Reads one secret from environment variable `var`, or from stdin when `stdin`.
///
/// # Errors
/// [`CliError::Usage`] for an unset or empty variable, an empty, non-UTF-8 or control-holding
/// value; [`CliError::Failed`] when stdin cannot be read.
fn read_secret(label: &str, var: Option<&str>, stdin: bool, channel: &str) -> Result<Option<SecretString>, CliError> {
    let raw = if let Some(var) = var {
        match std::env::var(var) {
            Ok(v) => SecretString::from(v),
            Err(std::env::VarError::NotPresent) => {
                return Err(CliError::Usage(format!("{label} from {var}: the variable is not set")));
            }
            Err(std::env::VarError::NotUnicode(_)) => {
                return Err(CliError::Usage(format!("{label} from {var}: the value is not UTF-8")));
            }
        }
    } else if stdin {
        let input = std::io::stdin();
        if input.is_terminal() {
            crate::commands::credentials::prompt_hidden(&format!("{label} for channel {channel} (input hidden): "))?
        } else {
            let mut bytes = Vec::new();
            input.lock().read_to_end(&mut bytes).map_err(|e| CliError::Failed(format!("cannot read stdin: {e}")))?;
            SecretString::from(
                String::from_utf8(bytes).map_err(|_| CliError::Usage(format!("the {label} on stdin is not UTF-8")))?,
            )
        }
    } else {
        return Ok(None);
    };
    let value = crate::commands::credentials::trim_one_newline(raw.expose_secret());
    if value.is_empty() {
        return Err(CliError::Usage(format!("the {label} is empty; nothing was stored")));
    }
    if value.trim().is_empty() {
        return Err(CliError::Usage(format!("the {label} is only whitespace; nothing was stored")));
    }
    if value.chars().any(char::is_control) {
        return Err(CliError::Usage(format!("the {label} contains control characters; nothing was stored")));
    }
    Ok(Some(SecretString::from(value.to_owned())))
}

/// One secret's options: `(body field, label, env variable, from stdin, credential name)`.
type SecretSource<'a> = (&'static str, &'static str, Option<&'a str>, bool, &'a Option<String>);

/// What the options give for one secret: its body field (`bot_token`, …), its value (read from
/// the environment or stdin) and the credential named to hold it (its `*_ref`).
pub struct GivenSecret {
    pub field: &'static str,
    pub value: Option<SecretString>,
    pub credential: Option<String>,
}

/// Reads the secrets and credential names the options give, in the order `bot_token`,
/// `app_id`, `app_secret`, `signing_secret` (those given only).
///
/// # Errors
/// As [`read_secret`].
fn given_secrets(s: &SecretArgs, channel: &str) -> Result<Vec<GivenSecret>, CliError> {
    let sources: [SecretSource<'_>; 4] = [
        ("bot_token", "bot token", s.bot_token_env.as_deref(), s.bot_token_stdin, &s.bot_token_credential),
        ("app_id", "app id", s.app_id_env.as_deref(), false, &s.app_id_credential),
        ("app_secret", "app secret", s.app_secret_env.as_deref(), false, &s.app_secret_credential),
        ("signing_secret", "signing secret", s.signing_secret_env.as_deref(), false, &s.signing_secret_credential),
    ];
    let mut out = Vec::new();
    for (field, label, var, stdin, credential) in sources {
        let value = read_secret(label, var, stdin, channel)?;
        if value.is_some() || credential.is_some() {
            out.push(GivenSecret { field, value, credential: credential.clone() });
        }
    }
    Ok(out)
}

/// Puts `given` into a create or patch body (`bot_token`, `bot_token_ref`, …): the same four
/// secret fields on both, a credential reference wrapped by `$wrap` (a patch's is
/// `Option<Option<String>>`: set vs cleared).
macro_rules! put_secrets {
    ($b:expr, $given:expr, $wrap:expr) => {
        for g in $given {
            let (value, credential) = match g.field {
                "bot_token" => (&mut $b.bot_token, &mut $b.bot_token_ref),
                "app_id" => (&mut $b.app_id, &mut $b.app_id_ref),
                "app_secret" => (&mut $b.app_secret, &mut $b.app_secret_ref),
                _ => (&mut $b.signing_secret, &mut $b.signing_secret_ref),
            };
            if let Some(v) = g.value {
                *value = Some(v.expose_secret().to_owned());
            }
            if let Some(c) = g.credential {
                *credential = Some($wrap(c));
            }
        }
    };
}

/// Puts `given` into a create body.
fn put_create(b: &mut ChannelCreate, given: Vec<GivenSecret>) {
    put_secrets!(b, given, std::convert::identity);
}

/// Puts `given` into a patch body.
fn put_patch(b: &mut ChannelPatch, given: Vec<GivenSecret>) {
    put_secrets!(b, given, Some);
}

/// `cwd` as given, made absolute against the current directory (`~` expanded).
fn absolute(dir: &str) -> String {
    if dir.is_empty() {
        return String::new();
    }
    let expanded = match dir.strip_prefix("~/") {
        Some(rest) => std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(rest)),
        None if dir == "~" => std::env::var_os("HOME").map(std::path::PathBuf::from),
        None => None,
    }
    .unwrap_or_else(|| std::path::PathBuf::from(dir));
    if expanded.is_absolute() {
        return expanded.display().to_string();
    }
    std::env::current_dir().map(|c| c.join(&expanded).display().to_string()).unwrap_or_else(|_| dir.to_owned())
}

/// A permission mode word (`read-only` is `read_only`; '' clears).
fn parse_mode(s: &str) -> Result<String, String> {
    let m = s.trim().to_ascii_lowercase().replace('-', "_");
    match m.as_str() {
        "" | "bypass" | "ask" | "read_only" => Ok(m),
        _ => Err(format!("{s:?} is not a mode: use bypass, ask or read-only")),
    }
}

/// The agent config the options give on top of `current` (`''` clears a key; `null` when none
/// is left); `None` when no option touches it.
fn agent_config(a: &AgentArgs, current: Option<&AgentConfig>) -> Option<Value> {
    if a.cwd.is_none() && a.model.is_none() && a.permission_mode.is_none() {
        return None;
    }
    let mut cfg = current.cloned().unwrap_or_default();
    for (slot, v) in [
        (&mut cfg.cwd, a.cwd.as_deref().map(absolute)),
        (&mut cfg.model, a.model.clone()),
        (&mut cfg.permission_mode, a.permission_mode.clone()),
    ] {
        match v {
            Some(v) if v.is_empty() => *slot = None,
            Some(v) => *slot = Some(v),
            None => {}
        }
    }
    Some(if cfg == AgentConfig::default() { Value::Null } else { json!(cfg) })
}

/// The `POST /v1/channels` body for `a` (secrets aside).
pub fn add_body(a: &AddArgs) -> ChannelCreate {
    ChannelCreate {
        name: a.name.clone(),
        kind: a.kind.clone(),
        enabled: !a.disabled,
        bot_token: None,
        app_id: None,
        app_secret: None,
        signing_secret: None,
        bot_token_ref: None,
        app_id_ref: None,
        app_secret_ref: None,
        signing_secret_ref: None,
        api_base_url: a.agent.api_base_url.clone(),
        default_agent: a.agent.agent.clone(),
        agent_config: agent_config(&a.agent, None),
    }
}

/// The `PATCH` body for `a` on a channel whose agent config is `current` (secrets aside).
pub fn edit_body(a: &EditArgs, current: Option<&AgentConfig>) -> ChannelPatch {
    let clearable = |v: &Option<String>| v.as_ref().map(|v| (!v.is_empty()).then(|| v.clone()));
    ChannelPatch {
        api_base_url: clearable(&a.agent.api_base_url),
        default_agent: clearable(&a.agent.agent),
        agent_config: agent_config(&a.agent, current).map(|v| (!v.is_null()).then_some(v)),
        ..Default::default()
    }
}

async fn add(ctx: &Ctx, a: AddArgs) -> Result<(), CliError> {
    // Read the secrets first, so that starting a daemon does not interleave with a prompt.
    let mut body = add_body(&a);
    let given = given_secrets(&a.secrets, &a.name)?;
    let needed: &[&str] =
        if a.kind == "telegram" { &["bot_token"] } else { &["app_id", "app_secret", "signing_secret"] };
    for field in needed {
        if !given.iter().any(|g| g.field == *field) {
            let flag = field.replace('_', "-");
            return Err(CliError::Usage(format!(
                "a {} channel needs its {}: give --{flag}-env VAR{} or --{flag}-credential NAME",
                a.kind,
                field.replace('_', " "),
                if *field == "bot_token" { ", --bot-token-stdin" } else { "" }
            )));
        }
    }
    put_create(&mut body, given);
    let api = ctx.connect().await?;
    let resp = api.send(api.request(reqwest::Method::POST, "/v1/channels").json(&body)).await?;
    drop(body);
    if ctx.json {
        return output::print_body(&resp.body);
    }
    let c: Channel = resp.parse()?;
    let state = if c.enabled { "enabled" } else { "disabled" };
    output::println(&format!("Added {} channel {} ({state})", a.kind, a.name))?;
    // A `--*-credential NAME` may name a credential not stored yet: the channel is kept, but
    // cannot start until it is.
    for field in missing_credentials(&c) {
        let name = c.credential_of(&field).unwrap_or_default();
        crate::eprintln_printable!(
            "warning: credential {} (the {}) is not stored, so the channel cannot start until it is: \
             coffer credentials set {}",
            output::printable(name),
            field.replace('_', " "),
            output::shell_quote(name)
        );
    }
    output::println(&format!("Pair it with `coffer channel pair {}`: until then every chat is refused", a.name))
}

/// `owner display (id)`, or `not paired`.
fn owner(c: &Channel) -> String {
    match &c.owner {
        Some(o) => match o.display.as_deref() {
            Some(d) if !d.is_empty() => format!("{} ({})", output::printable(d), o.id),
            _ => o.id.clone(),
        },
        None => "not paired".into(),
    }
}

/// The adapter's state word, with its last error (`running`, `failed: …`, `stopped` for a
/// disabled channel, `unknown` when chat did not say).
pub fn adapter_state(c: &Channel) -> String {
    // A disabled channel's adapter is stopped (or stopping: the coordinator follows within a tick).
    if !c.enabled {
        return "stopped".into();
    }
    match &c.adapter {
        Some(a) => {
            let retry = retry_phrase(a);
            match a.last_error.as_deref() {
                Some(e) if !e.is_empty() => format!("{}: {}{retry}", a.state, output::printable(e)),
                _ => format!("{}{retry}", a.state),
            }
        }
        None => "unknown (chat service not answering)".into(),
    }
}

/// " (next try in 42 s)" for an adapter that will try again (`retry_at_ms` set), else empty.
pub fn retry_phrase(adapter: &Adapter) -> String {
    let Some(at) = adapter.retry_at_ms.filter(|t| *t > 0) else { return String::new() };
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
    let left_s = ((at - now).max(0) + 999) / 1000;
    format!(" (next try in {left_s} s)")
}

/// The secrets whose credential has no value (`bot_token`, …).
pub fn missing_credentials(c: &Channel) -> Vec<String> {
    c.credentials_set.iter().filter(|(_, set)| !**set).map(|(k, _)| k.clone()).collect()
}

/// One-line cells of the list table: NAME KIND ENABLED OWNER ADAPTER.
pub fn render_list(items: &[Channel]) -> String {
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|c| {
            vec![
                text_cell(&c.name, 32),
                text_cell(&c.kind, 10),
                output::yes_no(c.enabled).to_owned(),
                output::truncate(&owner(c), 40),
                output::truncate(&adapter_state(c), 60),
            ]
        })
        .collect();
    render_table_fitted(&["NAME", "KIND", "ENABLED", "OWNER", "ADAPTER"], &rows, output::terminal_width())
}

async fn list(ctx: &Ctx) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    let resp = api.get_raw("/v1/channels").await?;
    if ctx.json {
        return output::print_body(&resp.body);
    }
    let items = resp.parse::<Page<Channel>>()?.items;
    if items.is_empty() {
        return output::println(
            "No channels yet; add one with `coffer channel add NAME --kind telegram --bot-token-env VAR`",
        );
    }
    output::print(&render_list(&items))
}

/// `coffer status`'s lines: `Channel NAME (KIND): enabled|disabled, paired with OWNER|not
/// paired, adapter STATE`, one per channel.
pub fn status_lines(items: &[Channel]) -> String {
    let mut out = String::new();
    for c in items {
        let paired = if c.paired { format!("paired with {}", owner(c)) } else { "not paired".into() };
        out.push_str(&format!(
            "Channel {} ({}): {}, {paired}, adapter {}\n",
            c.name,
            c.kind,
            if c.enabled { "enabled" } else { "disabled" },
            adapter_state(c)
        ));
    }
    out
}

/// The fields `show` prints.
pub fn render_show(c: &Channel) -> String {
    let mut fields = vec![
        ("name", c.name.clone()),
        ("kind", c.kind.clone()),
        ("enabled", output::yes_no(c.enabled).to_owned()),
        ("owner", owner(c)),
    ];
    if let Some(o) = &c.owner {
        fields.push(("paired", output::format_time(&o.paired_at)));
    }
    if c.pairing.pending {
        let until = c.pairing.expires_at.as_deref().map(output::format_time).unwrap_or_default();
        fields.push(("pairing", format!("a code is waiting (until {until})")));
    }
    fields.push(("adapter", adapter_state(c)));
    if let Some(bot) = c.adapter.as_ref().and_then(|a| a.bot_username.as_deref()) {
        fields.push(("bot", format!("@{bot}")));
    }
    for (secret, ok) in &c.credentials_set {
        let r = c.credential_of(secret).unwrap_or("?");
        let label: &'static str = match secret.as_str() {
            "bot_token" => "bot token",
            "app_id" => "app id",
            "app_secret" => "app secret",
            _ => "signing secret",
        };
        fields.push((label, format!("{} ({r})", if *ok { "set" } else { "missing" })));
    }
    fields.push(("agent", c.default_agent.clone().unwrap_or_else(|| "claude_code (default)".to_owned())));
    let cfg = c.agent_config.clone().unwrap_or_default();
    if let Some(cwd) = cfg.cwd {
        fields.push(("cwd", cwd));
    }
    if let Some(m) = cfg.model {
        fields.push(("model", m));
    }
    if let Some(m) = cfg.permission_mode {
        fields.push(("permission mode", m));
    }
    fields.push(("api base url", c.api_base_url.clone().unwrap_or_else(|| "(the platform's public API)".to_owned())));
    fields.push(("version", c.version.to_string()));
    fields.push(("updated", output::format_time(&c.updated_at)));
    render_fields(&fields)
}

async fn show(ctx: &Ctx, name: &str) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    let resp = api.get_raw(&channel_path(name)).await?;
    if ctx.json {
        return output::print_body(&resp.body);
    }
    let c: Channel = resp.parse()?;
    output::print(&render_show(&c))?;
    if c.enabled && !c.paired {
        output::println(&format!("Not paired: every chat is refused. Pair it with `coffer channel pair {name}`"))?;
    }
    Ok(())
}

async fn edit(ctx: &Ctx, a: EditArgs) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    let current: Channel = api.get_as(&channel_path(&a.name)).await?;
    let mut body = edit_body(&a, current.agent_config.as_ref());
    put_patch(&mut body, given_secrets(&a.secrets, &a.name)?);
    if body.is_empty() {
        return Err(CliError::Usage(
            "nothing to change: give a secret option, --agent, --cwd, --model or --api-base-url".into(),
        ));
    }
    let resp = api.send(api.request(reqwest::Method::PATCH, &channel_path(&a.name)).json(&body)).await?;
    drop(body);
    if ctx.json {
        return output::print_body(&resp.body);
    }
    let c: Channel = resp.parse()?;
    output::println(&format!("Updated channel {} (version {})", a.name, c.version))
}

async fn set_enabled(ctx: &Ctx, name: &str, enabled: bool) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    let verb = if enabled { "enable" } else { "disable" };
    let resp = api.send(api.request(reqwest::Method::POST, &format!("{}/{verb}", channel_path(name)))).await?;
    if ctx.json {
        return output::print_body(&resp.body);
    }
    let c: Channel = resp.parse()?;
    if enabled {
        output::println(&format!("Enabled channel {name}; its adapter starts shortly"))?;
        if !c.paired {
            output::println(&format!("It is not paired yet: `coffer channel pair {name}`"))?;
        }
        Ok(())
    } else {
        output::println(&format!("Disabled channel {name}; its adapter stops (a running turn finishes)"))
    }
}

async fn remove(ctx: &Ctx, name: &str) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    api.delete(&channel_path(name)).await?;
    if ctx.json {
        return output::print_json(&json!({"removed": name}));
    }
    output::println(&format!("Removed channel {name}"))
}

/// What `pair` prints for a `POST …/pair` answer.
pub fn render_pair(r: &PairingCode) -> String {
    let mut out = String::new();
    out.push_str(&format!("Pairing code: {}\n", r.code));
    out.push_str(&format!("Valid until:  {}\n", output::format_time(&r.expires_at)));
    out.push_str(&format!("{}\n", r.instruction));
    if let Some(w) = &r.warning {
        out.push_str(&format!("Note: {w}\n"));
    }
    out
}

async fn pair(ctx: &Ctx, a: PairArgs) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    let mut req = api.request(reqwest::Method::POST, &format!("{}/pair", channel_path(&a.name)));
    if let Some(ttl) = a.ttl {
        req = req.json(&PairingRequest { ttl_s: Some(ttl) });
    }
    let resp = api.send(req).await?;
    if ctx.json {
        return output::print_body(&resp.body);
    }
    output::print(&render_pair(&resp.parse()?))
}

async fn unpair(ctx: &Ctx, name: &str) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    api.delete(&format!("{}/pair", channel_path(name))).await?;
    if ctx.json {
        return output::print_json(&json!({"unpaired": name}));
    }
    output::println(&format!("Unpaired channel {name}: every chat is refused until `coffer channel pair {name}`"))
}

/// A telegram channel `home` as `GET /v1/channels/home` answers it, with the fields of `over`
/// replaced (adapter, owner and credentials_set as given), for tests.
#[cfg(test)]
pub fn test_channel(over: Value) -> Channel {
    let mut v = json!({
        "name": "home", "kind": "telegram", "enabled": true, "api_base_url": null, "default_agent": null,
        "agent_config": null, "paired": false, "owner": null, "pairing": {"pending": false, "expires_at": null},
        "version": 2, "created_at": "", "updated_at": "", "adapter": null,
        "bot_token_ref": "channel-home-bot-token", "credentials_set": {"bot_token": true},
    });
    for (k, x) in over.as_object().cloned().unwrap_or_default() {
        v[k] = x;
    }
    if let Some(a) = v["adapter"].as_object_mut() {
        for k in ["last_error", "started_ms", "last_inbound_ms", "last_outbound_ms", "retry_at_ms", "bot_username"] {
            a.entry(k).or_insert(Value::Null);
        }
    }
    if let Some(o) = v["owner"].as_object_mut() {
        o.entry("display").or_insert(Value::Null);
        o.entry("paired_at").or_insert(json!(""));
    }
    serde_json::from_value(v).expect("a channel")
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct T {
        #[command(subcommand)]
        cmd: ChannelCommand,
    }

    fn parse(args: &[&str]) -> Result<ChannelCommand, clap::Error> {
        T::try_parse_from(std::iter::once("channel").chain(args.iter().copied())).map(|t| t.cmd)
    }

    #[test]
    fn add_parses_and_builds_its_body() {
        let ChannelCommand::Add(a) =
            parse(&["add", "home", "--kind", "telegram", "--bot-token-env", "T", "--agent", "codex", "--model", "m"])
                .unwrap()
        else {
            panic!()
        };
        let b = serde_json::to_value(add_body(&a)).unwrap();
        assert_eq!(
            b,
            json!({"name": "home", "kind": "telegram", "enabled": true, "default_agent": "codex", "agent_config": {"model": "m"}})
        );
        assert!(parse(&["add", "x", "--kind", "slack"]).is_err());
        assert!(parse(&["add", "../x", "--kind", "telegram"]).is_err());
        assert!(parse(&["add", "x", "--kind", "telegram", "--bot-token", "123:abc"]).is_err(), "no secret argument");
        assert!(
            parse(&["add", "x", "--kind", "telegram", "--bot-token-env", "T", "--bot-token-stdin"]).is_err(),
            "one source per secret"
        );
        let ChannelCommand::Add(a) = parse(&["add", "x", "--kind", "seatalk", "--disabled", "--cwd", "/w"]).unwrap()
        else {
            panic!()
        };
        let b = serde_json::to_value(add_body(&a)).unwrap();
        assert_eq!((&b["enabled"], &b["agent_config"]), (&json!(false), &json!({"cwd": "/w"})));
    }

    #[test]
    fn edit_clears_and_keeps() {
        let ChannelCommand::Edit(a) = parse(&["edit", "home", "--model", "", "--api-base-url", ""]).unwrap() else {
            panic!()
        };
        let cfg = AgentConfig { cwd: Some("/w".into()), model: Some("m".into()), ..Default::default() };
        let b = serde_json::to_value(edit_body(&a, Some(&cfg))).unwrap();
        assert_eq!(b, json!({"api_base_url": null, "agent_config": {"cwd": "/w"}}));
        let ChannelCommand::Edit(a) = parse(&["edit", "home", "--model", ""]).unwrap() else { panic!() };
        let cfg = AgentConfig { model: Some("m".into()), ..Default::default() };
        assert_eq!(serde_json::to_value(edit_body(&a, Some(&cfg))).unwrap(), json!({"agent_config": null}));
    }

    #[test]
    fn a_default_permission_mode_is_set_and_cleared() {
        let ChannelCommand::Edit(a) = parse(&["edit", "home", "--permission-mode", "read-only"]).unwrap() else {
            panic!()
        };
        let cfg = AgentConfig { model: Some("m".into()), ..Default::default() };
        let b = serde_json::to_value(edit_body(&a, Some(&cfg))).unwrap();
        assert_eq!(b, json!({"agent_config": {"model": "m", "permission_mode": "read_only"}}));
        assert!(parse(&["edit", "home", "--permission-mode", "sometimes"]).is_err());
    }

    #[test]
    fn ttls() {
        assert_eq!(parse_ttl("600"), Ok(600));
        assert_eq!(parse_ttl("90s"), Ok(90));
        assert_eq!(parse_ttl("10m"), Ok(600));
        assert_eq!(parse_ttl("1h"), Ok(3600));
        for bad in ["59s", "2h", "10x", "m", "", "-5m", "99999999999h"] {
            assert!(parse_ttl(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn secrets_come_from_the_environment() {
        // A variable nothing sets (setting one is `unsafe` in edition 2024).
        let var = "COFFER_TEST_CHANNEL_SECRET_NEVER_SET_7Q";
        let s = SecretArgs { bot_token_env: Some(var.into()), ..Default::default() };
        let e = given_secrets(&s, "home").err().unwrap();
        assert!(e.to_string().contains("the variable is not set"), "{e}");
        let s = SecretArgs { app_id_credential: Some("mine".into()), ..Default::default() };
        let mut b = ChannelPatch::default();
        put_patch(&mut b, given_secrets(&s, "w").unwrap());
        assert_eq!(serde_json::to_value(b).unwrap(), json!({"app_id_ref": "mine"}));
    }

    #[test]
    fn renders() {
        let c = test_channel(json!({
            "paired": true,
            "owner": {"id": "42", "display": "@me", "paired_at": "2026-12-01T00:00:00.000Z"},
            "adapter": {"state": "backoff", "last_error": "getUpdates answered 502"},
            "credentials_set": {"bot_token": false},
        }));
        let list = render_list(std::slice::from_ref(&c));
        assert!(list.contains("@me (42)") && list.contains("backoff: getUpdates answered 502"), "{list}");
        let show = render_show(&c);
        assert!(show.contains("missing (channel-home-bot-token)"), "{show}");
        assert_eq!(missing_credentials(&c), ["bot_token"]);
        let lines = status_lines(std::slice::from_ref(&c));
        assert_eq!(
            lines,
            "Channel home (telegram): enabled, paired with @me (42), adapter backoff: getUpdates answered 502\n"
        );
        let c = test_channel(json!({"enabled": true, "adapter": null, "owner": null}));
        assert_eq!(
            (adapter_state(&c), owner(&c)),
            ("unknown (chat service not answering)".into(), "not paired".into())
        );
        let p = render_pair(
            &serde_json::from_value(json!({"channel": "home", "code": "7KQ2M9XD", "expires_at": "2026-12-01T00:10:00.000Z", "ttl_s": 600, "instruction": "Send `/pair 7KQ2M9XD` to …", "warning": null}))
                .unwrap(),
        );
        assert!(p.starts_with("Pairing code: 7KQ2M9XD\n") && p.contains("Send `/pair 7KQ2M9XD`"), "{p}");
    }
}
