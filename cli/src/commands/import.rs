//! `coffer mcp import PATH [--dry-run]`: registers the MCP servers of another client's config
//! file — Claude Desktop, Claude Code (`.mcp.json`, `~/.claude.json`), Cursor, VS Code —
//! through `POST /v1/mcp/import`, which moves secret-looking values into credentials.
//!
//! The file is read and parsed here (JSON, or the JSON with comments and trailing commas that
//! VS Code writes), and only its MCP parts are sent: `~/.claude.json` also holds history and
//! account data that the daemon has no business seeing, and can outgrow the REST body limit.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use clap::Args;
use coffer_api::servers::{ImportReport, McpImport, SkippedServer};
use serde_json::{Map, Value, json};

use crate::context::Ctx;
use crate::error::CliError;
use crate::output;

pub const IMPORT_EXAMPLES: &str = "\
Examples:
  coffer mcp import ~/.config/Claude/claude_desktop_config.json
  coffer mcp import ~/.claude.json --dry-run
  coffer mcp import .vscode/mcp.json --json
  GITHUB_TOKEN=ghp_... coffer mcp import .mcp.json --from-env

Understands `mcpServers` (Claude Desktop, Claude Code's .mcp.json and ~/.claude.json with its
per-project servers, Cursor) and `servers` (VS Code). Names become valid Coffer names (the report
shows changes); commands are resolved to absolute paths on the daemon's PATH; env values and
headers that look secret (…TOKEN, …KEY, Authorization, ghp_…, sk-…) go to the credential store
as SERVER-VAR and the server references them. Servers already registered are left as they are;
one whose name only normalises to a registered one (Git_Server -> git-server) is imported under a
new name (git-server-2) unless it is the same server. Values with ${VAR}, ${env:VAR} or
${VAR:-default} are refused unless --from-env reads the variables from this shell: env and
header values expanded so go to the credential store too.
Exits 1 when some entry could not be imported, 2 when the file cannot be read or parsed.";

#[derive(Debug, Args)]
pub struct ImportArgs {
    /// The config file (claude_desktop_config.json, .mcp.json, ~/.claude.json, ~/.cursor/mcp.json,
    /// .vscode/mcp.json).
    pub path: PathBuf,
    /// Show what would be imported; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Return at once instead of waiting (up to 60 s) until the imported servers have started
    /// and their capabilities are listed for MCP clients.
    #[arg(long)]
    pub no_wait: bool,
    /// Expand ${VAR}, ${env:VAR} and ${VAR:-default} references from this shell's environment;
    /// env and header values expanded so are stored as credentials.
    #[arg(long)]
    pub from_env: bool,
    /// Import entries whose arguments look like secrets (`--api-key ghp_…`) as they are; without
    /// it such an entry is reported invalid (arguments are stored in plaintext, synced, and
    /// visible to every local user in `ps`).
    #[arg(long)]
    pub allow_secret_args: bool,
}

/// Runs `coffer mcp import`.
///
/// # Errors
/// Exit 2 when the file cannot be read, is not JSON (naming the line and column) or holds no MCP
/// servers; exit 1 (after the report) when some entry was invalid; API errors; exit 5 when the
/// daemon cannot be reached.
pub async fn run(ctx: &Ctx, a: ImportArgs) -> Result<(), CliError> {
    let path = std::path::absolute(&a.path).unwrap_or_else(|_| a.path.clone());
    let config = read_config(&path)?;
    let subset = mcp_subset(&config).ok_or_else(|| {
        CliError::Usage(format!(
            "{} holds no MCP servers: expected \"mcpServers\" (Claude Desktop, Claude Code, Cursor) or \"servers\" (VS Code)",
            path.display()
        ))
    })?;
    let mut body = McpImport {
        config: subset,
        source: Some(path.display().to_string()),
        dry_run: a.dry_run,
        allow_secret_args: a.allow_secret_args,
        variables: None,
    };
    if a.from_env {
        let (variables, unset) = read_variables(&body.config, |n| std::env::var(n).ok());
        body.variables = Some(variables);
        if !unset.is_empty() && !ctx.json {
            // The entries that use them are reported invalid, each naming its references.
            crate::eprintln_printable!("--from-env: not set in this environment: {}", unset.join(", "));
        }
    }
    let api = ctx.connect().await?;
    let resp = api.send(api.request(reqwest::Method::POST, "/v1/mcp/import").json(&body)).await?;
    let report: ImportReport = resp.parse()?;
    let imported: Vec<String> = report.imported.iter().map(|e| e.name.clone()).collect();
    // Clients started right after the import are offered the servers' tools on their first list.
    let listed = if a.dry_run || a.no_wait || imported.is_empty() {
        Vec::new()
    } else {
        crate::commands::listed::wait(&api, &imported, crate::commands::listed::WAIT).await
    };
    if ctx.json {
        if listed.is_empty() {
            output::print_body(&resp.body)?;
        } else {
            // The daemon's body with the catalog state of each imported server added.
            let mut body = resp.json()?;
            body["catalog"] = listed.iter().map(|l| l.state.clone()).collect();
            output::print_json(&body)?;
        }
    } else {
        let mut text = render_report(&report);
        for l in &listed {
            text.push_str(&crate::commands::listed::describe(l, crate::commands::listed::WAIT));
            text.push('\n');
        }
        output::print(&text)?;
    }
    match report.invalid.len() {
        0 => Ok(()),
        _ if ctx.json => Err(CliError::Quiet(crate::error::exit::ERROR)),
        n => Err(CliError::Failed(format!("{n} {} not imported (see above)", plural(n, "entry was", "entries were")))),
    }
}

/// Reads a config file as a JSON object. JSON with comments and trailing commas (VS Code's
/// `mcp.json` and `settings.json`) is accepted.
///
/// # Errors
/// [`CliError::Usage`] (exit 2) naming the path when the file cannot be read, and the line and
/// column when it is not JSON or not an object.
pub fn read_config(path: &Path) -> Result<Value, CliError> {
    let shown = path.display();
    let text = std::fs::read_to_string(path).map_err(|e| CliError::Usage(format!("cannot read {shown}: {e}")))?;
    let parsed = serde_json::from_str::<Value>(&text).or_else(|_| serde_json::from_str::<Value>(&strip_jsonc(&text)));
    match parsed {
        Ok(v @ Value::Object(_)) => Ok(v),
        Ok(other) => Err(CliError::Usage(format!(
            "{shown}: the file holds a JSON {}, not an object with MCP servers",
            kind_of(&other)
        ))),
        Err(e) => {
            let msg = e.to_string();
            let msg = msg.split(" at line ").next().unwrap_or(&msg);
            Err(CliError::Usage(format!("{shown}:{}:{}: not valid JSON: {msg}", e.line(), e.column())))
        }
    }
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// `text` with `//` and `/* */` comments and trailing commas (before `}` or `]`) replaced by
/// spaces, outside strings: JSON with comments as VS Code writes it, turned into JSON with every
/// other character at its place, so error positions still match the file.
pub fn strip_jsonc(text: &str) -> String {
    let mut out: Vec<char> = text.chars().collect();
    let n = out.len();
    let mut i = 0;
    let mut in_string = false;
    // Index of a comma that may be trailing, until something other than blanks or comments follows.
    let mut comma: Option<usize> = None;
    while i < n {
        let c = out[i];
        if in_string {
            match c {
                '\\' => i += 1,
                '"' => in_string = false,
                _ => {}
            }
            i += 1;
            continue;
        }
        match (c, out.get(i + 1).copied()) {
            ('/', Some('/')) => {
                while i < n && out[i] != '\n' {
                    out[i] = ' ';
                    i += 1;
                }
                continue;
            }
            ('/', Some('*')) => {
                // Blank everything up to and including the closing `*/` (or to the end), keeping
                // line breaks so that later positions stay on their lines.
                let end =
                    (i + 2..n.saturating_sub(1)).find(|&j| out[j] == '*' && out[j + 1] == '/').map_or(n, |j| j + 2);
                for c in &mut out[i..end] {
                    if *c != '\n' {
                        *c = ' ';
                    }
                }
                i = end;
                continue;
            }
            ('"', _) => {
                in_string = true;
                comma = None;
            }
            (',', _) => comma = Some(i),
            ('}' | ']', _) => {
                if let Some(k) = comma.take() {
                    out[k] = ' ';
                }
            }
            (c, _) if c.is_whitespace() => {}
            _ => comma = None,
        }
        i += 1;
    }
    out.into_iter().collect()
}

/// The environment variables the `${…}` references in `config`'s strings name: a JSON object of
/// those `lookup` has, and the names of those it has not that have no default (in order).
pub fn read_variables(
    config: &Value,
    lookup: impl Fn(&str) -> Option<String>,
) -> (BTreeMap<String, String>, Vec<String>) {
    fn strings<'a>(v: &'a Value, out: &mut Vec<&'a str>) {
        match v {
            Value::String(s) => out.push(s),
            Value::Array(a) => a.iter().for_each(|v| strings(v, out)),
            Value::Object(m) => m.values().for_each(|v| strings(v, out)),
            _ => {}
        }
    }
    let mut all = Vec::new();
    strings(config, &mut all);
    let mut found = BTreeMap::new();
    let mut missing: Vec<String> = Vec::new();
    for r in all.iter().flat_map(|s| coffer_types::variables::references(s)) {
        let Some(name) = r.variable else { continue };
        match lookup(name) {
            Some(v) => {
                found.insert(name.to_owned(), v);
            }
            None if r.default.is_none() && !missing.iter().any(|m| m == name) => missing.push(name.to_owned()),
            None => {}
        }
    }
    (found, missing)
}

/// The MCP parts of a config file: `mcpServers`, `servers`, `mcp.servers`, and each
/// `projects.<path>.mcpServers` of `~/.claude.json`; `None` when it has none of them.
pub fn mcp_subset(config: &Value) -> Option<Value> {
    let root = config.as_object()?;
    let mut out = Map::new();
    for key in ["mcpServers", "servers"] {
        if let Some(v) = root.get(key) {
            out.insert(key.to_owned(), v.clone());
        }
    }
    if let Some(v) = root.get("mcp").and_then(|m| m.get("servers")) {
        out.insert("mcp".to_owned(), json!({"servers": v}));
    }
    if let Some(projects) = root.get("projects").and_then(Value::as_object) {
        let with_servers: Map<String, Value> = projects
            .iter()
            .filter_map(|(path, p)| p.get("mcpServers").map(|s| (path.clone(), json!({"mcpServers": s}))))
            .collect();
        if !with_servers.is_empty() {
            out.insert("projects".to_owned(), Value::Object(with_servers));
        }
    }
    (!out.is_empty()).then_some(Value::Object(out))
}

fn plural<'a>(n: usize, one: &'a str, many: &'a str) -> &'a str {
    if n == 1 { one } else { many }
}

/// The human report of an import.
pub fn render_report(r: &ImportReport) -> String {
    let (imported, duplicates, invalid) = (&r.imported, &r.duplicates, &r.invalid);
    let total = imported.len() + duplicates.len() + invalid.len();
    let source = r.source.as_deref().unwrap_or("the config");
    let names = imported.iter().map(|e| &e.name).chain(duplicates.iter().chain(invalid).map(|e| &e.name));
    let width = names.map(|n| n.chars().count()).max().unwrap_or(0);
    // `name ("Original Name")` when the name was changed.
    let label = |e: &SkippedServer| {
        if e.original_name.is_empty() || e.original_name == e.name {
            e.name.clone()
        } else {
            format!("{} (was {:?})", e.name, e.original_name)
        }
    };
    let mut out = format!(
        "{} {} of {total} MCP {} from {source}:\n",
        if r.dry_run { "Would import" } else { "Imported" },
        imported.len(),
        plural(total, "server", "servers")
    );
    for e in imported {
        let mut line = format!("  {:<width$}  {}", e.name, e.transport.word());
        if e.original_name != e.name {
            line.push_str(&format!("  was {:?}", e.original_name));
        }
        if !e.credentials_created.is_empty() {
            line.push_str(&format!("  secrets moved to credentials: {}", e.credentials_created.join(", ")));
        }
        out.push_str(line.trim_end());
        out.push('\n');
        for w in &e.warnings {
            out.push_str(&format!("  {:<width$}  warning: {w}\n", ""));
        }
    }
    if !duplicates.is_empty() {
        out.push_str(&format!("Skipped {} already registered:\n", duplicates.len()));
        for e in duplicates {
            out.push_str(&format!("  {}: {}\n", label(e), e.reason));
        }
    }
    if !invalid.is_empty() {
        out.push_str(&format!("Not imported, {} invalid:\n", invalid.len()));
        for e in invalid {
            out.push_str(&format!("  {}: {}\n", label(e), e.reason));
        }
    }
    if r.dry_run {
        out.push_str("Dry run: nothing was changed; run again without --dry-run to import.\n");
    } else if !imported.is_empty() {
        out.push_str("See their tools: coffer tools list\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jsonc_comments_and_trailing_commas() {
        let text = "{\n  // servers\n  \"servers\": {\n    \"a\": {\"command\": \"x\", /* why */ \"args\": [\"//not a comment\", \"/*nor*/\",],},\n  },\n}\n";
        let stripped = strip_jsonc(text);
        assert_eq!(stripped.chars().count(), text.chars().count(), "positions are kept");
        let v: Value = serde_json::from_str(&stripped).unwrap();
        assert_eq!(v["servers"]["a"]["args"], json!(["//not a comment", "/*nor*/"]));
        assert_eq!(strip_jsonc(r#"{"a": "x\"//y", "b": [1, 2]}"#), r#"{"a": "x\"//y", "b": [1, 2]}"#);
        assert_eq!(strip_jsonc("[1, /* c */ ]"), "[1          ]");
    }

    #[test]
    fn bad_files_name_the_path_and_position() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("cfg.json");
        std::fs::write(&p, "{\n  \"mcpServers\": {\n    \"a\": {\"command\": \"x\"\n  }\n").unwrap();
        let e = read_config(&p).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        let msg = e.to_string();
        assert!(msg.starts_with(&format!("{}:5:", p.display())), "{msg}");
        assert!(msg.contains("not valid JSON"), "{msg}");
        std::fs::write(&p, "[1]").unwrap();
        assert!(read_config(&p).unwrap_err().to_string().contains("JSON array"));
        let missing = read_config(&dir.path().join("nope.json")).unwrap_err();
        assert_eq!(missing.exit_code(), 2);
        assert!(missing.to_string().contains("nope.json"), "{missing}");
    }

    #[test]
    fn only_the_mcp_parts_are_sent() {
        let claude_json = json!({
            "numStartups": 3, "oauthAccount": {"emailAddress": "me@example.com"},
            "mcpServers": {"a": {"command": "x"}},
            "projects": {"/p": {"history": ["secret prompt"], "mcpServers": {"b": {"command": "y"}}}, "/q": {"history": []}},
        });
        assert_eq!(
            mcp_subset(&claude_json).unwrap(),
            json!({"mcpServers": {"a": {"command": "x"}}, "projects": {"/p": {"mcpServers": {"b": {"command": "y"}}}}})
        );
        let settings = json!({"editor.fontSize": 12, "mcp": {"servers": {"f": {"command": "uvx"}}, "inputs": []}});
        assert_eq!(mcp_subset(&settings).unwrap(), json!({"mcp": {"servers": {"f": {"command": "uvx"}}}}));
        assert_eq!(mcp_subset(&json!({"theme": "dark"})), None);
    }

    #[test]
    fn report() {
        let r: ImportReport = serde_json::from_value(json!({
            "format": "mcpServers", "source": "/h/cfg.json", "dry_run": false,
            "imported": [
                {"name": "fs", "original_name": "fs", "origin": "mcpServers", "transport": "stdio", "credentials_created": [], "warnings": []},
                {"name": "github", "original_name": "GitHub", "origin": "mcpServers", "transport": "stdio",
                 "credentials_created": ["github-GITHUB_TOKEN"], "warnings": ["args[0] is odd"]},
            ],
            "duplicates": [{"name": "web", "original_name": "web", "origin": "mcpServers", "reason": "a server named web is already registered; left as it is"}],
            "invalid": [{"name": "local", "original_name": "Local", "origin": "mcpServers", "reason": "command ./x is relative"}],
        }))
        .unwrap();
        assert_eq!(
            render_report(&r),
            "Imported 2 of 4 MCP servers from /h/cfg.json:\n\
             \x20 fs      stdio\n\
             \x20 github  stdio  was \"GitHub\"  secrets moved to credentials: github-GITHUB_TOKEN\n\
             \x20         warning: args[0] is odd\n\
             Skipped 1 already registered:\n\
             \x20 web: a server named web is already registered; left as it is\n\
             Not imported, 1 invalid:\n\
             \x20 local (was \"Local\"): command ./x is relative\n\
             See their tools: coffer tools list\n"
        );
        let dry: ImportReport = serde_json::from_value(
            json!({"format": "mcpServers", "source": "/x", "dry_run": true, "imported": [], "duplicates": [], "invalid": []}),
        )
        .unwrap();
        assert!(render_report(&dry).starts_with("Would import 0 of 0 MCP servers from /x:\nDry run"));
    }

    #[test]
    fn from_env_reads_every_referenced_variable_and_names_the_unset_ones() {
        let config = json!({"mcpServers": {"a": {"command": "x", "args": ["${ROOT}", "${env:MODE}", "${OPT:-d}"],
            "env": {"T": "Bearer ${TOKEN}", "W": "${workspaceFolder}"}}}});
        let env = |n: &str| ["ROOT", "TOKEN"].contains(&n).then(|| format!("{n}-value"));
        let (vars, unset) = read_variables(&config, env);
        assert_eq!(serde_json::to_value(vars).unwrap(), json!({"ROOT": "ROOT-value", "TOKEN": "TOKEN-value"}));
        assert_eq!(unset, ["MODE", "workspaceFolder"], "OPT has a default");
    }
}
