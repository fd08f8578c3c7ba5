//! `coffer profile create|list|show|edit|remove|override`: profiles (`/v1/mcp/profiles…`) —
//! named views of the vault for a kind of client: which servers, tools and built-in tools its MCP
//! sessions see (include/exclude globs), the tool mode (`full` or `lazy`), and tool overrides
//! (rename, description, hidden parameters, annotations). `default` is what a session naming no
//! profile gets; it can be edited, not removed.
//!
//! Reads print the server's JSON with `--json`, tables otherwise. Writes are whole-spec `PUT`s
//! made at the version read (`If-Match`), so a concurrent change is a conflict (exit 4), never
//! lost. The daemon checks every spec (globs, names, sizes) and names the field it refuses.
use std::io::Read;

use clap::{Args, Subcommand};
use coffer_api::Page;
use coffer_api::profiles::{Annotations, NewProfile, Profile, ProfileSpec, Selection, ToolMode, ToolOverride};
use serde_json::json;

use crate::api::path_segment;
use crate::context::Ctx;
use crate::error::CliError;
use crate::output::{self, render_fields, render_table_fitted, text_cell};

const CREATE_EXAMPLES: &str = "\
Examples:
  coffer profile create work --server git --server 'time*' --exclude-tool 'git__git_push'
  coffer profile create lean --mode lazy --description 'Search the tools instead of listing them'
  coffer profile create ro --exclude-tool '*__write_*' --exclude-tool '*__delete_*'

Globs: * any run of characters, ? one character, matched against the whole name (servers by their
registered name, tools by their exposed name <server>__<tool>, built-ins as coffer__<tool>). No
--server/--tool/--builtin: every one. --exclude-* wins over an include.";

const EDIT_EXAMPLES: &str = "\
Examples:
  coffer profile edit work --mode lazy
  coffer profile edit work --exclude-tool 'git__git_push' --exclude-tool 'git__git_reset'
  coffer profile edit work --server ''                 # every server again
  coffer profile show work --json > work.json && coffer profile edit work --from-file work.json
  coffer profile edit default --exclude-builtin 'coffer__ask'

Each list option given replaces that list ('' empties it); options not given stay. --from-file
takes the whole spec as JSON (as `coffer profile show NAME --json` prints it; name, version and
updated_at are ignored), '-' for standard input.";

const OVERRIDE_EXAMPLES: &str = "\
Examples:
  coffer profile override work time__get_current_time --rename now --append 'Use it for any clock question.'
  coffer profile override work git__git_log --hide-param max_count --read-only true
  coffer profile override default fs__write_file --destructive true
  coffer profile override work time__get_current_time --clear

The tool is named as tools/list shows it without overrides (<server>__<tool>). A new name matches
^[a-zA-Z0-9_-]{1,64}$. '' clears --rename, --description, --append and --hide-param.";

#[derive(Debug, Subcommand)]
pub enum ProfileCommand {
    /// Create a profile: which servers, tools and built-ins its sessions see, and the tool mode.
    #[command(after_help = CREATE_EXAMPLES)]
    Create(CreateArgs),
    /// List the profiles (default included).
    #[command(after_help = "Examples:\n  coffer profile list\n  coffer profile list --json | jq -r '.items[].name'")]
    List(NoArgs),
    /// Show one profile: its selections, mode and overrides.
    #[command(after_help = "Examples:\n  coffer profile show work\n  coffer profile show default --json")]
    Show(NameArg),
    /// Change a profile; options not given stay as they are.
    #[command(after_help = EDIT_EXAMPLES)]
    Edit(EditArgs),
    /// Remove a profile (default cannot be removed).
    #[command(after_help = "Example:\n  coffer profile remove work")]
    Remove(NameArg),
    /// Set or clear one tool's override in a profile (rename, description, hidden params, annotations).
    #[command(after_help = OVERRIDE_EXAMPLES)]
    Override(OverrideArgs),
}

#[derive(Debug, Args)]
pub struct NoArgs {}

#[derive(Debug, Args)]
pub struct NameArg {
    /// The profile's name.
    pub name: String,
}

/// The selection and mode options `create` and `edit` share.
#[derive(Debug, Args, Default)]
pub struct SpecArgs {
    /// A one-line description shown in lists.
    #[arg(long, value_name = "TEXT")]
    pub description: Option<String>,
    /// Include servers matching GLOB (repeatable; none: every server).
    #[arg(long = "server", value_name = "GLOB")]
    pub servers: Vec<String>,
    /// Leave out servers matching GLOB (repeatable).
    #[arg(long = "exclude-server", value_name = "GLOB")]
    pub exclude_servers: Vec<String>,
    /// Include tools whose exposed name matches GLOB (repeatable; none: every tool).
    #[arg(long = "tool", value_name = "GLOB")]
    pub tools: Vec<String>,
    /// Leave out tools whose exposed name matches GLOB (repeatable).
    #[arg(long = "exclude-tool", value_name = "GLOB")]
    pub exclude_tools: Vec<String>,
    /// Include Coffer's built-in tools matching GLOB (repeatable; none: every built-in).
    #[arg(long = "builtin", value_name = "GLOB")]
    pub builtins: Vec<String>,
    /// Leave out built-in tools matching GLOB (repeatable).
    #[arg(long = "exclude-builtin", value_name = "GLOB")]
    pub exclude_builtins: Vec<String>,
    /// full: every selected tool's schema in tools/list; lazy: a few meta tools that search,
    /// describe and call them.
    #[arg(long, value_parser = ["full", "lazy"])]
    pub mode: Option<String>,
}

#[derive(Debug, Args)]
pub struct CreateArgs {
    /// The profile's name: 1-32 characters a-z, 0-9 and '-', starting with a letter or digit.
    #[arg(value_parser = parse_name)]
    pub name: String,
    #[command(flatten)]
    pub spec: SpecArgs,
}

#[derive(Debug, Args)]
pub struct EditArgs {
    /// The profile's name.
    pub name: String,
    #[command(flatten)]
    pub spec: SpecArgs,
    /// Replace the whole spec with the JSON in FILE ('-': standard input).
    #[arg(long, value_name = "FILE", conflicts_with_all = [
        "description", "servers", "exclude_servers", "tools", "exclude_tools", "builtins", "exclude_builtins", "mode"
    ])]
    pub from_file: Option<String>,
}

#[derive(Debug, Args)]
pub struct OverrideArgs {
    /// The profile's name.
    pub name: String,
    /// The tool, by its exposed name without overrides (<server>__<tool>).
    pub tool: String,
    /// Show the tool under this name ('' = its own).
    #[arg(long, value_name = "NAME")]
    pub rename: Option<String>,
    /// Replace the tool's description ('' = the upstream's).
    #[arg(long, value_name = "TEXT")]
    pub description: Option<String>,
    /// Add a paragraph after the description ('' = none).
    #[arg(long, value_name = "TEXT")]
    pub append: Option<String>,
    /// Hide an optional parameter (repeatable; replaces the list; '' = none hidden).
    #[arg(long = "hide-param", value_name = "PARAM")]
    pub hide_params: Vec<String>,
    /// Say the tool only reads (true) or may change things (false).
    #[arg(long, value_name = "BOOL", value_parser = clap::value_parser!(bool))]
    pub read_only: Option<bool>,
    /// Say the tool may destroy data (true) or not (false).
    #[arg(long, value_name = "BOOL", value_parser = clap::value_parser!(bool))]
    pub destructive: Option<bool>,
    /// Remove the tool's override from this profile.
    #[arg(long, conflicts_with_all = ["rename", "description", "append", "hide_params", "read_only", "destructive"])]
    pub clear: bool,
}

/// Runs one `coffer profile …` command.
///
/// # Errors
/// Exit 2 for bad options or a spec file that is not a spec, 3 for an unknown profile, 4 for a
/// conflict (a taken name, a concurrent change, removing `default`), 5 when the daemon cannot
/// be reached.
pub async fn run(ctx: &Ctx, cmd: ProfileCommand) -> Result<(), CliError> {
    match cmd {
        ProfileCommand::Create(a) => create(ctx, a).await,
        ProfileCommand::List(_) => list(ctx).await,
        ProfileCommand::Show(a) => show(ctx, &a.name).await,
        ProfileCommand::Edit(a) => edit(ctx, a).await,
        ProfileCommand::Remove(a) => remove(ctx, &a.name).await,
        ProfileCommand::Override(a) => override_tool(ctx, a).await,
    }
}

/// clap's check of a profile name (the store's rule).
fn parse_name(s: &str) -> Result<String, String> {
    coffer_api::profiles::check_profile_name(s).map(|()| s.to_owned())
}

fn profile_path(name: &str) -> String {
    format!("/v1/mcp/profiles/{}", path_segment(name))
}

/// A list option's values without the '' that empties it.
fn globs(v: &[String]) -> Vec<String> {
    v.iter().filter(|g| !g.is_empty()).cloned().collect()
}

/// `spec` with the options of `a` applied: a list option given replaces its list.
pub fn apply_spec_args(mut spec: ProfileSpec, a: &SpecArgs) -> ProfileSpec {
    if let Some(d) = &a.description {
        spec.description = d.clone();
    }
    let lists: [(&Vec<String>, &mut Vec<String>); 6] = [
        (&a.servers, &mut spec.servers.include),
        (&a.exclude_servers, &mut spec.servers.exclude),
        (&a.tools, &mut spec.tools.include),
        (&a.exclude_tools, &mut spec.tools.exclude),
        (&a.builtins, &mut spec.builtins.include),
        (&a.exclude_builtins, &mut spec.builtins.exclude),
    ];
    for (given, list) in lists {
        if !given.is_empty() {
            *list = globs(given);
        }
    }
    match a.mode.as_deref() {
        Some("lazy") => spec.mode = ToolMode::Lazy,
        Some("full") => spec.mode = ToolMode::Full,
        _ => {}
    }
    spec
}

fn spec_args_empty(a: &SpecArgs) -> bool {
    a.description.is_none()
        && a.mode.is_none()
        && [&a.servers, &a.exclude_servers, &a.tools, &a.exclude_tools, &a.builtins, &a.exclude_builtins]
            .iter()
            .all(|v| v.is_empty())
}

/// A spec read from `text`: a [`ProfileSpec`], or a whole profile as `show --json` prints it
/// (its `name`, `version` and `updated_at` are dropped).
///
/// # Errors
/// [`CliError::Usage`] naming the field that does not fit.
pub fn parse_spec_file(text: &str) -> Result<ProfileSpec, CliError> {
    let mut v: serde_json::Value =
        serde_json::from_str(text).map_err(|e| CliError::Usage(format!("the spec is not JSON: {e}")))?;
    let Some(obj) = v.as_object_mut() else {
        return Err(CliError::Usage("the spec must be a JSON object".into()));
    };
    for k in ["name", "version", "updated_at"] {
        obj.remove(k);
    }
    serde_path_to_error::deserialize::<_, ProfileSpec>(v)
        .map_err(|e| CliError::Usage(format!("the spec does not fit (at {}): {}", e.path(), e.inner())))
}

fn read_file(path: &str) -> Result<String, CliError> {
    if path == "-" {
        let mut s = String::new();
        std::io::stdin().read_to_string(&mut s).map_err(|e| CliError::Failed(format!("cannot read stdin: {e}")))?;
        Ok(s)
    } else {
        std::fs::read_to_string(path).map_err(|e| CliError::Usage(format!("cannot read {path}: {e}")))
    }
}

async fn create(ctx: &Ctx, a: CreateArgs) -> Result<(), CliError> {
    let (_, spec) = NewProfile::default().split();
    let spec = apply_spec_args(spec, &a.spec);
    let body = NewProfile {
        name: a.name.clone(),
        description: spec.description,
        servers: spec.servers,
        tools: spec.tools,
        builtins: spec.builtins,
        mode: spec.mode,
        overrides: spec.overrides,
    };
    let api = ctx.connect().await?;
    let resp = api.send(api.request(reqwest::Method::POST, "/v1/mcp/profiles").json(&body)).await?;
    if ctx.json {
        return output::print_body(&resp.body);
    }
    let p: Profile = resp.parse()?;
    output::println(&format!("Created profile {} ({})", p.name, summary(&p.spec)))
}

fn mode_word(m: ToolMode) -> &'static str {
    match m {
        ToolMode::Full => "full",
        ToolMode::Lazy => "lazy",
    }
}

/// `all`, `git, time*`, `all but git__git_push`, …
fn selection_text(s: &Selection) -> String {
    let inc = if s.include.is_empty() { "all".to_owned() } else { s.include.join(", ") };
    if s.exclude.is_empty() { inc } else { format!("{inc} but {}", s.exclude.join(", ")) }
}

fn summary(s: &ProfileSpec) -> String {
    format!(
        "{} mode; servers: {}; tools: {}; built-ins: {}",
        mode_word(s.mode),
        selection_text(&s.servers),
        selection_text(&s.tools),
        selection_text(&s.builtins)
    )
}

/// The list table: NAME MODE SERVERS TOOLS BUILT-INS OVERRIDES DESCRIPTION.
pub fn render_list(items: &[Profile]) -> String {
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|p| {
            vec![
                text_cell(&p.name, 32),
                mode_word(p.spec.mode).to_owned(),
                text_cell(&selection_text(&p.spec.servers), 40),
                text_cell(&selection_text(&p.spec.tools), 40),
                text_cell(&selection_text(&p.spec.builtins), 30),
                p.spec.overrides.len().to_string(),
                text_cell(&p.spec.description, 60),
            ]
        })
        .collect();
    render_table_fitted(
        &["NAME", "MODE", "SERVERS", "TOOLS", "BUILT-INS", "OVERRIDES", "DESCRIPTION"],
        &rows,
        output::terminal_width(),
    )
}

async fn list(ctx: &Ctx) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    let resp = api.get_raw("/v1/mcp/profiles").await?;
    if ctx.json {
        return output::print_body(&resp.body);
    }
    let items = resp.parse::<Page<Profile>>()?.items;
    output::print(&render_list(&items))
}

fn override_text(o: &ToolOverride) -> String {
    let mut parts = Vec::new();
    if let Some(n) = &o.name {
        parts.push(format!("shown as {n}"));
    }
    if let Some(d) = &o.description {
        parts.push(format!("description {:?}", output::truncate(d, 60)));
    }
    if let Some(d) = &o.description_append {
        parts.push(format!("+ {:?}", output::truncate(d, 60)));
    }
    if !o.hide_params.is_empty() {
        parts.push(format!("hides {}", o.hide_params.join(", ")));
    }
    if let Some(a) = &o.annotations {
        for (k, v) in [
            ("read-only", a.read_only),
            ("destructive", a.destructive),
            ("idempotent", a.idempotent),
            ("open-world", a.open_world),
        ] {
            if let Some(v) = v {
                parts.push(format!("{k} {v}"));
            }
        }
    }
    if parts.is_empty() { "(nothing)".into() } else { parts.join("; ") }
}

/// The fields `show` prints, then one line per override.
pub fn render_show(p: &Profile) -> String {
    let s = &p.spec;
    let fields = [
        ("name", p.name.clone()),
        ("description", if s.description.is_empty() { "-".into() } else { s.description.clone() }),
        ("mode", mode_word(s.mode).to_owned()),
        ("servers", selection_text(&s.servers)),
        ("tools", selection_text(&s.tools)),
        ("built-ins", selection_text(&s.builtins)),
        ("overrides", s.overrides.len().to_string()),
        ("version", if p.version == 0 { "0 (never written)".into() } else { p.version.to_string() }),
        ("updated", if p.updated_at.is_empty() { "-".into() } else { output::format_time(&p.updated_at) }),
    ];
    let mut out = render_fields(&fields);
    for (tool, o) in &s.overrides {
        out.push_str(&format!("  {}: {}\n", output::printable(tool), output::printable(&override_text(o))));
    }
    out
}

async fn show(ctx: &Ctx, name: &str) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    let resp = api.get_raw(&profile_path(name)).await?;
    if ctx.json {
        return output::print_body(&resp.body);
    }
    output::print(&render_show(&resp.parse::<Profile>()?))
}

/// Writes `spec` over profile `name` at `version` (`If-Match`).
async fn put_at(
    ctx: &Ctx,
    api: &crate::api::ApiClient,
    name: &str,
    version: u64,
    spec: &ProfileSpec,
) -> Result<Profile, CliError> {
    let req = api
        .request(reqwest::Method::PUT, &profile_path(name))
        .header(reqwest::header::IF_MATCH, format!("\"{version}\""))
        .json(spec);
    let resp = api.send(req).await?;
    if ctx.json {
        output::print_body(&resp.body)?;
    }
    resp.parse()
}

async fn edit(ctx: &Ctx, a: EditArgs) -> Result<(), CliError> {
    let from_file = match &a.from_file {
        Some(path) => Some(parse_spec_file(&read_file(path)?)?),
        None => None,
    };
    if from_file.is_none() && spec_args_empty(&a.spec) {
        return Err(CliError::Usage(
            "nothing to change: give --description, --server, --exclude-server, --tool, --exclude-tool, --builtin, --exclude-builtin, --mode or --from-file".into(),
        ));
    }
    let api = ctx.connect().await?;
    let cur: Profile = api.get_raw(&profile_path(&a.name)).await?.parse()?;
    let spec = match from_file {
        Some(s) => s,
        None => apply_spec_args(cur.spec.clone(), &a.spec),
    };
    let p = put_at(ctx, &api, &a.name, cur.version, &spec).await?;
    if ctx.json {
        return Ok(());
    }
    output::println(&format!("Updated profile {} (version {}; {})", p.name, p.version, summary(&p.spec)))
}

/// `o` with the options of `a` applied; `None` when nothing is left (the override goes).
pub fn apply_override(o: Option<ToolOverride>, a: &OverrideArgs) -> Option<ToolOverride> {
    if a.clear {
        return None;
    }
    let mut o = o.unwrap_or_default();
    let text = |v: &Option<String>, cur: &mut Option<String>| {
        if let Some(v) = v {
            *cur = (!v.is_empty()).then(|| v.clone());
        }
    };
    text(&a.rename, &mut o.name);
    text(&a.description, &mut o.description);
    text(&a.append, &mut o.description_append);
    if !a.hide_params.is_empty() {
        o.hide_params = globs(&a.hide_params);
    }
    if a.read_only.is_some() || a.destructive.is_some() {
        let mut ann = o.annotations.take().unwrap_or_default();
        ann.read_only = a.read_only.or(ann.read_only);
        ann.destructive = a.destructive.or(ann.destructive);
        o.annotations = (ann != Annotations::default()).then_some(ann);
    }
    (o != ToolOverride::default()).then_some(o)
}

async fn override_tool(ctx: &Ctx, a: OverrideArgs) -> Result<(), CliError> {
    let nothing = !a.clear
        && a.rename.is_none()
        && a.description.is_none()
        && a.append.is_none()
        && a.hide_params.is_empty()
        && a.read_only.is_none()
        && a.destructive.is_none();
    if nothing {
        return Err(CliError::Usage(
            "nothing to change: give --rename, --description, --append, --hide-param, --read-only, --destructive or --clear".into(),
        ));
    }
    let api = ctx.connect().await?;
    let cur: Profile = api.get_raw(&profile_path(&a.name)).await?.parse()?;
    let mut spec = cur.spec.clone();
    let had = spec.overrides.remove(&a.tool);
    if had.is_none() && a.clear {
        return Err(CliError::NotFound(format!("profile {} has no override of {}", a.name, a.tool)));
    }
    if let Some(o) = apply_override(had, &a) {
        spec.overrides.insert(a.tool.clone(), o);
    }
    let p = put_at(ctx, &api, &a.name, cur.version, &spec).await?;
    if !a.clear {
        warn_if_unlisted(&api, &a.tool).await;
    }
    if ctx.json {
        return Ok(());
    }
    match p.spec.overrides.get(&a.tool) {
        Some(o) => output::println(&format!("Profile {}: {} {}", p.name, a.tool, override_text(o))),
        None => output::println(&format!("Profile {}: {} has no override now", p.name, a.tool)),
    }
}

/// A typo in an override's tool name is not an error (a server may offer the tool later), but
/// an override nobody sees should not pass silently: a warning on stderr when no enabled
/// server lists `tool` now (`GET /v1/tools`; skipped when that fails).
async fn warn_if_unlisted(api: &crate::api::ApiClient, tool: &str) {
    let Ok(r) = api.get_raw("/v1/tools").await else { return };
    let Ok(tools) = r.json() else { return };
    let listed = tools["items"].as_array().is_some_and(|items| items.iter().any(|t| t["name"] == tool));
    if !listed {
        output::eprint_line(&format!(
            "warning: no enabled server lists a tool {tool} now (coffer tools list shows them); the override applies once one does"
        ));
    }
}

async fn remove(ctx: &Ctx, name: &str) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    api.delete(&profile_path(name)).await?;
    if ctx.json {
        return output::print_json(&json!({"removed": name}));
    }
    output::println(&format!("Removed profile {name}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(subcommand)]
        c: ProfileCommand,
    }

    fn parse(args: &[&str]) -> Result<ProfileCommand, clap::Error> {
        T::try_parse_from(std::iter::once("profile").chain(args.iter().copied())).map(|t| t.c)
    }

    #[test]
    fn edit_options_replace_only_the_lists_they_name() {
        let ProfileCommand::Edit(a) =
            parse(&["edit", "w", "--exclude-tool", "git__git_push", "--server", "", "--mode", "lazy"]).unwrap()
        else {
            panic!()
        };
        let mut cur = ProfileSpec::default();
        cur.servers.include = vec!["git".into()];
        cur.builtins.exclude = vec!["coffer__ask".into()];
        let next = apply_spec_args(cur, &a.spec);
        assert!(next.servers.include.is_empty(), "'' empties the list");
        assert_eq!(next.tools.exclude, ["git__git_push"]);
        assert_eq!(next.builtins.exclude, ["coffer__ask"], "untouched");
        assert_eq!(next.mode, ToolMode::Lazy);
    }

    #[test]
    fn bad_command_lines_are_usage_errors() {
        assert!(parse(&["create", "Bad_Name"]).is_err());
        assert!(parse(&["create", "w", "--mode", "sometimes"]).is_err());
        assert!(parse(&["edit", "w", "--from-file", "x", "--mode", "lazy"]).is_err());
        assert!(parse(&["override", "w", "t__x", "--clear", "--rename", "n"]).is_err());
        assert!(parse(&["override", "w", "t__x", "--read-only", "maybe"]).is_err());
    }

    #[test]
    fn overrides_are_set_and_cleared_field_by_field() {
        let ProfileCommand::Override(a) =
            parse(&["override", "w", "t__x", "--rename", "now", "--hide-param", "tz", "--read-only", "true"]).unwrap()
        else {
            panic!()
        };
        let o = apply_override(None, &a).unwrap();
        assert_eq!(o.name.as_deref(), Some("now"));
        assert_eq!(o.hide_params, ["tz"]);
        assert_eq!(o.annotations.as_ref().and_then(|a| a.read_only), Some(true));
        let ProfileCommand::Override(b) =
            parse(&["override", "w", "t__x", "--rename", "", "--hide-param", ""]).unwrap()
        else {
            panic!()
        };
        let o = apply_override(Some(o), &b).unwrap();
        assert_eq!((o.name, o.hide_params.len()), (None, 0));
        let ProfileCommand::Override(c) = parse(&["override", "w", "t__x", "--clear"]).unwrap() else { panic!() };
        assert_eq!(apply_override(Some(ToolOverride::default()), &c), None);
    }

    #[test]
    fn a_spec_file_is_a_spec_or_a_shown_profile() {
        let s = parse_spec_file(r#"{"name":"w","version":3,"updated_at":"x","mode":"lazy"}"#).unwrap();
        assert_eq!(s.mode, ToolMode::Lazy);
        let e = parse_spec_file(r#"{"tools":{"include":"git"}}"#).unwrap_err().to_string();
        assert!(e.contains("tools.include"), "{e}");
        let e = parse_spec_file(r#"{"colour":1}"#).unwrap_err().to_string();
        assert!(e.contains("colour"), "{e}");
        assert!(parse_spec_file("[1]").is_err());
        assert!(parse_spec_file("{").is_err());
    }
}
