//! `coffer llm add|list|show|edit|remove|default|test|models`: the person's LLM connections
//! (`/v1/llm/connections…`) — where Coffer reaches a model provider, with which key and model —
//! and the internal default the `coffer__ask` agent runs on.
//!
//! A key is never a command-line argument (shell history and `ps` would show it): `--api-key-env
//! VAR` reads it from the environment, `--api-key-stdin` from standard input (or a prompt without
//! echo on a terminal). The daemon stores it in the credential store, never in the connection.
use std::io::{IsTerminal, Read};
use std::time::Duration;

use clap::{ArgGroup, Args, Subcommand};
use coffer_api::Page;
use coffer_api::llm::{LlmConnection, LlmConnectionCreate, LlmConnectionPatch, LlmModels, LlmTestReport};
use coffer_types::llm as rules;
use secrecy::{ExposeSecret, SecretString};
use serde_json::json;

use crate::api::path_segment;
use crate::context::Ctx;
use crate::error::{CliError, exit};
use crate::output::{self, render_fields, render_table_fitted, text_cell};

/// How long `test` and `models` wait: the daemon answers a provider's own timeout
/// (`llm.request_timeout_s`, at most an hour) itself, as a failure.
const PROBE_TIMEOUT: Duration = Duration::from_secs(130);

const ADD_EXAMPLES: &str = "\
Examples:
  coffer llm add claude --wire anthropic --model claude-sonnet-4-5 --api-key-env ANTHROPIC_API_KEY --default
  printf %s \"$OPENAI_API_KEY\" | coffer llm add gpt --wire openai --model gpt-5 --api-key-stdin
  coffer llm add local --wire ollama --base-url http://127.0.0.1:11434 --model llama3.2
  coffer llm add vllm --wire openai-chat --base-url http://127.0.0.1:8000 --model qwen3 --credential vllm-key

Wires: anthropic (Messages API), openai-responses (Responses API; `openai` is short for it),
openai-chat (Chat Completions and compatible servers), ollama. --base-url is required for ollama;
without it the cloud wires use the provider's public API and need a key (--api-key-env,
--api-key-stdin) or a stored credential (--credential NAME). A key is stored in the credential
store as llm-NAME unless --credential names another; it is never taken from the command line.";

const EDIT_EXAMPLES: &str = "\
Examples:
  coffer llm edit claude --model claude-opus-4-1
  coffer llm edit claude --api-key-env ANTHROPIC_API_KEY     # replace the key
  coffer llm edit local --base-url http://10.0.0.5:11434 --fast-model ''

An empty value ('') clears --base-url, --fast-model and --credential. Options not given stay.";

const TEST_EXAMPLES: &str = "\
Examples:
  coffer llm test claude
  coffer llm test claude --json

Sends one minimal request with the connection's model and prints the latency, or the provider's
failure (bad key, unknown model, unreachable, timeout, TLS), exiting 1. Stores nothing.";

const MODELS_EXAMPLES: &str = "\
Examples:
  coffer llm models claude
  coffer llm models local --json | jq -r '.items[].id'

Lists the provider's model ids. When the provider cannot list them, prints why; type an id
yourself (`coffer llm edit NAME --model ID`).";

const DEFAULT_EXAMPLES: &str = "\
Examples:
  coffer llm default claude      # coffer__ask runs on claude from now on
  coffer llm default             # which connection is the default
  coffer llm default --clear     # none (coffer__ask then says how to set one)";

#[derive(Debug, Subcommand)]
pub enum LlmCommand {
    /// Add an LLM connection (wire, base URL, key, model).
    #[command(after_help = ADD_EXAMPLES)]
    Add(AddArgs),
    /// List the LLM connections.
    #[command(after_help = "Examples:\n  coffer llm list\n  coffer llm list --json | jq -r '.items[].name'")]
    List(NoArgs),
    /// Show one LLM connection (never its key).
    #[command(after_help = "Example:\n  coffer llm show claude")]
    Show(NameArg),
    /// Change an LLM connection; options not given stay as they are.
    #[command(after_help = EDIT_EXAMPLES)]
    Edit(EditArgs),
    /// Remove an LLM connection (and the llm-NAME credential made for it).
    #[command(after_help = "Example:\n  coffer llm remove claude")]
    Remove(NameArg),
    /// Show, set or clear the internal default connection (what coffer__ask runs on).
    #[command(after_help = DEFAULT_EXAMPLES)]
    Default(DefaultArgs),
    /// Send one minimal request; print the latency or the provider's failure (exit 1).
    #[command(after_help = TEST_EXAMPLES)]
    Test(NameArg),
    /// List the provider's model ids.
    #[command(after_help = MODELS_EXAMPLES)]
    Models(NameArg),
}

#[derive(Debug, Args)]
pub struct NoArgs {}

#[derive(Debug, Args)]
pub struct NameArg {
    /// The connection's name.
    pub name: String,
}

/// Where a key comes from (never the command line).
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("key").args(["api_key_env", "api_key_stdin"])))]
pub struct KeyArgs {
    /// Read the API key from environment variable VAR.
    #[arg(long, value_name = "VAR")]
    pub api_key_env: Option<String>,
    /// Read the API key from standard input (prompted for without echo on a terminal).
    #[arg(long)]
    pub api_key_stdin: bool,
}

#[derive(Debug, Args)]
pub struct AddArgs {
    /// The connection's name: 1-32 characters a-z, 0-9 and '-', starting with a letter or digit.
    #[arg(value_parser = parse_name)]
    pub name: String,
    /// anthropic, openai-responses (or openai), openai-chat or ollama.
    #[arg(long, value_parser = parse_wire)]
    pub wire: String,
    /// The provider's base URL (required for ollama; default: the provider's public API).
    #[arg(long, value_name = "URL")]
    pub base_url: Option<String>,
    /// The model id requests name (see `coffer llm models NAME` once added).
    #[arg(long, value_name = "ID")]
    pub model: String,
    /// A faster, cheaper model for background work.
    #[arg(long, value_name = "ID")]
    pub fast_model: Option<String>,
    #[command(flatten)]
    pub key: KeyArgs,
    /// The credential that holds (or, with a key, will hold) the API key.
    #[arg(long, value_name = "NAME")]
    pub credential: Option<String>,
    /// Make it the internal default (what coffer__ask runs on).
    #[arg(long)]
    pub default: bool,
}

#[derive(Debug, Args)]
pub struct EditArgs {
    /// The connection's name.
    pub name: String,
    /// anthropic, openai-responses (or openai), openai-chat or ollama.
    #[arg(long, value_parser = parse_wire)]
    pub wire: Option<String>,
    /// The provider's base URL ('' = the provider's public API).
    #[arg(long, value_name = "URL")]
    pub base_url: Option<String>,
    /// The model id.
    #[arg(long, value_name = "ID")]
    pub model: Option<String>,
    /// The fast model ('' = none).
    #[arg(long, value_name = "ID")]
    pub fast_model: Option<String>,
    #[command(flatten)]
    pub key: KeyArgs,
    /// The credential holding the key ('' = none).
    #[arg(long, value_name = "NAME")]
    pub credential: Option<String>,
    /// Make it the internal default.
    #[arg(long, conflicts_with = "no_default")]
    pub default: bool,
    /// Stop it being the internal default.
    #[arg(long)]
    pub no_default: bool,
}

#[derive(Debug, Args)]
pub struct DefaultArgs {
    /// The connection to make the default; without it, print the current default.
    #[arg(conflicts_with = "clear")]
    pub name: Option<String>,
    /// No internal default from now on.
    #[arg(long)]
    pub clear: bool,
}

/// Runs one `coffer llm …` command.
///
/// # Errors
/// Exit 2 for bad options (a missing key variable, an empty key), 3 for an unknown connection, 4
/// for a conflict, 1 for a failed test, 5 when the daemon cannot be reached.
pub async fn run(ctx: &Ctx, cmd: LlmCommand) -> Result<(), CliError> {
    match cmd {
        LlmCommand::Add(a) => add(ctx, a).await,
        LlmCommand::List(_) => list(ctx).await,
        LlmCommand::Show(a) => show(ctx, &a.name).await,
        LlmCommand::Edit(a) => edit(ctx, a).await,
        LlmCommand::Remove(a) => remove(ctx, &a.name).await,
        LlmCommand::Default(a) => default(ctx, a).await,
        LlmCommand::Test(a) => test(ctx, &a.name).await,
        LlmCommand::Models(a) => models(ctx, &a.name).await,
    }
}

/// clap's check of a connection name (the store's rule).
fn parse_name(s: &str) -> Result<String, String> {
    rules::check_name(s).map(|()| s.to_owned())
}

/// clap's check of a wire: a REST word or an alias (`openai`), as the REST word.
fn parse_wire(s: &str) -> Result<String, String> {
    rules::wire_word(s).map(str::to_owned).ok_or_else(|| {
        format!("{s:?} is not a wire; use anthropic, openai-responses (or openai), openai-chat or ollama")
    })
}

fn connection_path(name: &str) -> String {
    format!("/v1/llm/connections/{}", path_segment(name))
}

/// The key the options ask for, if any: from `--api-key-env VAR` or `--api-key-stdin`.
///
/// # Errors
/// [`CliError::Usage`] for an unset or empty variable, an empty, non-UTF-8 or control-holding
/// value; [`CliError::Failed`] when stdin cannot be read.
fn read_key(k: &KeyArgs, name: &str) -> Result<Option<SecretString>, CliError> {
    let raw = if let Some(var) = &k.api_key_env {
        match std::env::var(var) {
            Ok(v) => SecretString::from(v),
            Err(std::env::VarError::NotPresent) => {
                return Err(CliError::Usage(format!("--api-key-env {var}: the variable is not set")));
            }
            Err(std::env::VarError::NotUnicode(_)) => {
                return Err(CliError::Usage(format!("--api-key-env {var}: the value is not UTF-8")));
            }
        }
    } else if k.api_key_stdin {
        let stdin = std::io::stdin();
        if stdin.is_terminal() {
            crate::commands::credentials::prompt_hidden(&format!("API key for LLM connection {name} (input hidden): "))?
        } else {
            let mut bytes = Vec::new();
            stdin.lock().read_to_end(&mut bytes).map_err(|e| CliError::Failed(format!("cannot read stdin: {e}")))?;
            SecretString::from(
                String::from_utf8(bytes).map_err(|_| CliError::Usage("the key on stdin is not UTF-8".into()))?,
            )
        }
    } else {
        return Ok(None);
    };
    let key = crate::commands::credentials::trim_one_newline(raw.expose_secret());
    if key.is_empty() {
        return Err(CliError::Usage("the API key is empty; nothing was stored".into()));
    }
    rules::check_api_key(key).map_err(CliError::Usage)?;
    Ok(Some(SecretString::from(key.to_owned())))
}

/// The `POST /v1/llm/connections` body for `a` (the key aside).
pub fn add_body(a: &AddArgs) -> LlmConnectionCreate {
    LlmConnectionCreate {
        name: a.name.clone(),
        wire: a.wire.clone(),
        base_url: a.base_url.clone(),
        credential_ref: a.credential.clone(),
        api_key: None,
        model: a.model.clone(),
        fast_model: a.fast_model.clone(),
        internal_default: a.default,
    }
}

/// The `PATCH` body for `a` (the key aside): `''` clears `base_url`, `fast_model` and
/// `credential_ref` (null).
pub fn edit_body(a: &EditArgs) -> LlmConnectionPatch {
    let clearable = |v: &Option<String>| v.as_ref().map(|v| (!v.is_empty()).then(|| v.clone()));
    LlmConnectionPatch {
        wire: a.wire.clone(),
        base_url: clearable(&a.base_url),
        model: a.model.clone(),
        fast_model: clearable(&a.fast_model),
        credential_ref: clearable(&a.credential),
        internal_default: if a.default {
            Some(true)
        } else if a.no_default {
            Some(false)
        } else {
            None
        },
        ..Default::default()
    }
}

async fn add(ctx: &Ctx, a: AddArgs) -> Result<(), CliError> {
    // Read the key first, so that starting a daemon does not interleave with a prompt.
    let key = read_key(&a.key, &a.name)?;
    let mut body = add_body(&a);
    body.api_key = key.as_ref().map(|k| k.expose_secret().to_owned());
    let api = ctx.connect().await?;
    let resp = api.send(api.request(reqwest::Method::POST, "/v1/llm/connections").json(&body)).await?;
    drop(body);
    if ctx.json {
        return output::print_body(&resp.body);
    }
    let c: LlmConnection = resp.parse()?;
    let mut line = format!("Added LLM connection {} ({} {})", a.name, a.wire, c.model);
    if key.is_some() {
        line.push_str(&format!("; its key is in credential {}", c.credential_ref.as_deref().unwrap_or("?")));
    }
    if c.internal_default {
        line.push_str("; it is the internal default");
    }
    output::println(&line)?;
    output::println(&format!("Check it with `coffer llm test {}`", a.name))
}

/// One-line cells of the list table: NAME WIRE BASE URL MODEL DEFAULT KEY.
pub fn render_list(items: &[LlmConnection]) -> String {
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|c| {
            vec![
                text_cell(&c.name, 32),
                text_cell(&c.wire, 20),
                c.base_url.as_deref().map_or_else(|| "(provider's API)".to_owned(), |u| output::truncate(u, 48)),
                text_cell(&c.model, 40),
                if c.internal_default { "yes".into() } else { String::new() },
                key_state(c),
            ]
        })
        .collect();
    render_table_fitted(&["NAME", "WIRE", "BASE URL", "MODEL", "DEFAULT", "KEY"], &rows, output::terminal_width())
}

/// `set (NAME)`, `missing (NAME)` or `none`.
fn key_state(c: &LlmConnection) -> String {
    match &c.credential_ref {
        None => "none".into(),
        Some(r) if c.credential_set => format!("set ({r})"),
        Some(r) => format!("missing ({r})"),
    }
}

/// Whether `c` names a credential that has no value.
fn key_missing(c: &LlmConnection) -> bool {
    c.credential_ref.is_some() && !c.credential_set
}

async fn list(ctx: &Ctx) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    let resp = api.get_raw("/v1/llm/connections").await?;
    if ctx.json {
        return output::print_body(&resp.body);
    }
    let items = resp.parse::<Page<LlmConnection>>()?.items;
    if items.is_empty() {
        return output::println(
            "No LLM connections yet; add one with `coffer llm add NAME --wire anthropic|openai|openai-chat|ollama --model ID`",
        );
    }
    output::print(&render_list(&items))
}

/// The fields `show` prints.
pub fn render_show(c: &LlmConnection) -> String {
    let fields = [
        ("name", c.name.clone()),
        ("wire", c.wire.clone()),
        ("base url", c.base_url.clone().unwrap_or_else(|| "(the provider's public API)".to_owned())),
        ("model", c.model.clone()),
        ("fast model", c.fast_model.clone().unwrap_or_else(|| "(the model)".to_owned())),
        ("key", key_state(c)),
        ("internal default", output::yes_no(c.internal_default).to_owned()),
        ("version", c.version.to_string()),
        ("updated", output::format_time(&c.updated_at)),
    ];
    render_fields(&fields)
}

async fn show(ctx: &Ctx, name: &str) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    let resp = api.get_raw(&connection_path(name)).await?;
    if ctx.json {
        return output::print_body(&resp.body);
    }
    let c: LlmConnection = resp.parse()?;
    output::print(&render_show(&c))?;
    if let Some(r) = c.credential_ref.as_deref().filter(|_| !c.credential_set) {
        output::println(&format!(
            "The key is missing: `coffer llm edit {name} --api-key-stdin` or `coffer credentials set {r}`"
        ))?;
    }
    Ok(())
}

async fn edit(ctx: &Ctx, a: EditArgs) -> Result<(), CliError> {
    let key = read_key(&a.key, &a.name)?;
    let mut body = edit_body(&a);
    body.api_key = key.as_ref().map(|k| k.expose_secret().to_owned());
    if body.is_empty() {
        return Err(CliError::Usage(
            "nothing to change: give --wire, --base-url, --model, --fast-model, --credential, a key option or --default"
                .into(),
        ));
    }
    let api = ctx.connect().await?;
    let resp = api.send(api.request(reqwest::Method::PATCH, &connection_path(&a.name)).json(&body)).await?;
    drop(body);
    if ctx.json {
        return output::print_body(&resp.body);
    }
    let c: LlmConnection = resp.parse()?;
    output::println(&format!("Updated LLM connection {} (version {})", a.name, c.version))
}

async fn remove(ctx: &Ctx, name: &str) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    api.delete(&connection_path(name)).await?;
    if ctx.json {
        return output::print_json(&json!({"removed": name}));
    }
    output::println(&format!("Removed LLM connection {name}"))
}

async fn default(ctx: &Ctx, a: DefaultArgs) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    if let Some(name) = &a.name {
        let resp = api.send(api.request(reqwest::Method::POST, &format!("{}/default", connection_path(name)))).await?;
        if ctx.json {
            return output::print_body(&resp.body);
        }
        return output::println(&format!("{name} is the internal default: coffer__ask runs on it"));
    }
    let items = api.get_as::<Page<LlmConnection>>("/v1/llm/connections").await?.items;
    let current = internal_default(&items).map(|c| c.name.as_str());
    if a.clear {
        if let Some(name) = current {
            api.delete(&format!("{}/default", connection_path(name))).await?;
        }
        if ctx.json {
            return output::print_json(&json!({"internal_default": null}));
        }
        return output::println(match current {
            Some(_) => "No internal default now: coffer__ask needs one (`coffer llm default NAME`)",
            None => "There was no internal default",
        });
    }
    if ctx.json {
        return output::print_json(&json!({"internal_default": current}));
    }
    output::println(&match current {
        Some(name) => format!("{name} is the internal default (coffer__ask runs on it)"),
        None => "No internal default: coffer__ask needs one (`coffer llm default NAME`)".into(),
    })
}

/// The internal default among `items` (a `GET /v1/llm/connections` page), if any.
pub fn internal_default(items: &[LlmConnection]) -> Option<&LlmConnection> {
    items.iter().find(|c| c.internal_default)
}

/// The one line `coffer status` adds: `Internal LLM connection: NAME (WIRE, MODEL)`, or that
/// none is set and `coffer__ask` needs one.
pub fn status_line(items: &[LlmConnection]) -> String {
    match internal_default(items) {
        Some(c) => format!(
            "Internal LLM connection: {} ({}, {}){}",
            c.name,
            c.wire,
            c.model,
            if key_missing(c) { "; its key is missing" } else { "" }
        ),
        None => "Internal LLM connection: none (coffer__ask needs one: `coffer llm add NAME … --default` or `coffer llm default NAME`)".into(),
    }
}

/// `NAME: ok in T ms (model M)` or `NAME: <failure message>` from a test report.
pub fn render_test(name: &str, r: &LlmTestReport) -> String {
    let ms = r.latency_ms;
    if r.ok {
        return format!("{name}: ok in {ms} ms (model {})", r.model);
    }
    let f = r.failure.as_ref();
    let mut line =
        format!("{name}: {} (after {ms} ms)", f.map_or("the provider did not answer", |f| f.message.as_str()));
    if let Some(retry) = f.and_then(|f| f.retry_after_ms)
        && !line.contains("retry after")
    {
        line.push_str(&format!("; retry after {} s", retry.div_ceil(1000)));
    }
    line
}

async fn test(ctx: &Ctx, name: &str) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    let req = api.request(reqwest::Method::POST, &format!("{}/test", connection_path(name))).timeout(PROBE_TIMEOUT);
    let resp = api.send(req).await?;
    let report: LlmTestReport = resp.parse()?;
    let ok = report.ok;
    if ctx.json {
        output::print_body(&resp.body)?;
    } else if ok {
        output::println(&render_test(name, &report))?;
    } else {
        return Err(CliError::Failed(render_test(name, &report)));
    }
    if ok { Ok(()) } else { Err(CliError::Quiet(exit::ERROR)) }
}

async fn models(ctx: &Ctx, name: &str) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    let req = api.request(reqwest::Method::GET, &format!("{}/models", connection_path(name))).timeout(PROBE_TIMEOUT);
    let resp = api.send(req).await?;
    let r: LlmModels = resp.parse()?;
    if ctx.json {
        output::print_body(&resp.body)?;
        return if r.failure.is_some() { Err(CliError::Quiet(exit::ERROR)) } else { Ok(()) };
    }
    if let Some(f) = &r.failure {
        return Err(CliError::Failed(format!("{name}: {}", f.message)));
    }
    for m in &r.items {
        output::println(&m.id)?;
    }
    if let Some(hint) = &r.hint {
        // On stderr, so `coffer llm models NAME | …` still gets ids only.
        crate::eprintln_printable!("{hint}");
    }
    if r.items.is_empty() && r.hint.is_none() {
        crate::eprintln_printable!(
            "{name}: the provider listed no models; type an id (`coffer llm edit {name} --model ID`)"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use serde_json::from_value;

    use super::*;

    #[derive(Debug, Parser)]
    struct T {
        #[command(subcommand)]
        cmd: LlmCommand,
    }

    fn parse(args: &[&str]) -> Result<LlmCommand, clap::Error> {
        T::try_parse_from(std::iter::once("llm").chain(args.iter().copied())).map(|t| t.cmd)
    }

    #[test]
    fn add_parses_and_builds_its_body() {
        let LlmCommand::Add(a) =
            parse(&["add", "gpt", "--wire", "openai", "--model", "gpt-5", "--api-key-env", "K", "--default"]).unwrap()
        else {
            panic!()
        };
        assert_eq!(a.wire, "openai-responses", "openai is short for the Responses wire");
        let b = serde_json::to_value(add_body(&a)).unwrap();
        assert_eq!(b, json!({"name": "gpt", "wire": "openai-responses", "model": "gpt-5", "internal_default": true}));
        assert!(parse(&["add", "x", "--wire", "gemini", "--model", "m"]).is_err());
        assert!(parse(&["add", "Bad", "--wire", "ollama", "--model", "m"]).is_err());
        assert!(parse(&["add", "x", "--wire", "ollama"]).is_err(), "--model is required");
        let both = ["add", "x", "--wire", "anthropic", "--model", "m", "--api-key-env", "K", "--api-key-stdin"];
        assert!(parse(&both).is_err(), "one key source");
        assert!(
            parse(&["add", "x", "--wire", "anthropic", "--model", "m", "--api-key", "sk-1"]).is_err(),
            "no key argument"
        );
    }

    #[test]
    fn edit_clears_with_empty_values() {
        let LlmCommand::Edit(a) =
            parse(&["edit", "local", "--base-url", "", "--fast-model", "", "--model", "m2", "--no-default"]).unwrap()
        else {
            panic!()
        };
        assert_eq!(
            serde_json::to_value(edit_body(&a)).unwrap(),
            json!({"base_url": null, "fast_model": null, "model": "m2", "internal_default": false})
        );
        assert!(parse(&["edit", "x", "--default", "--no-default"]).is_err());
    }

    #[test]
    fn keys_come_from_the_environment_never_an_argument() {
        let k = |var: &str| KeyArgs { api_key_env: Some(var.into()), api_key_stdin: false };
        let e = read_key(&k("COFFER_TEST_SURELY_UNSET_VAR_1234"), "x").unwrap_err();
        assert!(e.to_string().contains("is not set"), "{e}");
        assert!(read_key(&KeyArgs { api_key_env: None, api_key_stdin: false }, "x").unwrap().is_none());
    }

    #[test]
    fn renders() {
        let c: LlmConnection =
            from_value(json!({"name": "claude", "wire": "anthropic", "base_url": null, "credential_ref": "llm-claude",
            "credential_set": false, "model": "m", "fast_model": null, "internal_default": true, "version": 2,
            "created_at": "2026-12-01T00:00:00Z", "updated_at": "2026-12-01T00:00:00Z"}))
            .unwrap();
        let t = render_list(std::slice::from_ref(&c));
        assert!(t.contains("claude") && t.contains("(provider's API)") && t.contains("missing (llm-claude)"), "{t}");
        let s = render_show(&c);
        assert!(s.contains("internal default") && s.contains("missing (llm-claude)"), "{s}");
        let ok = from_value(json!({"ok": true, "latency_ms": 12, "model": "m", "failure": null})).unwrap();
        assert_eq!(render_test("claude", &ok), "claude: ok in 12 ms (model m)");
        assert_eq!(
            status_line(std::slice::from_ref(&c)),
            "Internal LLM connection: claude (anthropic, m); its key is missing"
        );
        assert!(status_line(&[]).starts_with("Internal LLM connection: none (coffer__ask needs one"));
        let bad = from_value(json!({"ok": false, "latency_ms": 3, "model": "m", "failure": {"kind": "rate_limited",
            "message": "anthropic at http://x answered 429", "http_status": 429, "retry_after_ms": 1500}}))
        .unwrap();
        assert_eq!(
            render_test("claude", &bad),
            "claude: anthropic at http://x answered 429 (after 3 ms); retry after 2 s"
        );
    }
}
