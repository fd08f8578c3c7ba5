//! `POST /v1/mcp/import`: registers the MCP servers of another MCP client's config file —
//! Claude Desktop (`claude_desktop_config.json`), Claude Code (`.mcp.json`, `~/.claude.json`),
//! Cursor (`mcp.json`) and VS Code (`.vscode/mcp.json`) — moving secret-looking `env` and
//! `headers` values into the credential store and registering references to them instead.
//!
//! The work is split in two: [`plan`] is pure (the config, the names already taken and a
//! command lookup in; what to register, what is a duplicate and what is invalid, each with its
//! reason, out) and is what the unit tests cover; [`import`] then writes the plan through the
//! normal store RPCs (`SetCredential`, `CreateServer`, which audit each credential and server)
//! and appends one `mcp.import` audit row with counts, never values. A valid entry is imported
//! even when others in the same file fail; a name that is already registered is reported as a
//! duplicate and left as it is; an entry whose name only normalises to a registered one
//! (`Git_Server` → `git-server`) is the same server ("already registered") or is imported
//! under a new name (`git-server-2`), and the report says which.
//!
//! The formats, as their clients document them:
//! - `mcpServers: {NAME: {command, args, env}}` (Claude Desktop); Claude Code's `.mcp.json` and
//!   Cursor add `type` (`stdio`, `http`, `sse`; absent means stdio for a command, HTTP for a
//!   url), `url` and `headers`;
//! - `~/.claude.json`: the user's `mcpServers` at the top and each project's under
//!   `projects.<path>.mcpServers`;
//! - VS Code: `servers: {NAME: {type, command, args, env, url, headers}}` (also `mcp.servers`
//!   in a `settings.json`) next to `inputs`.
//!
//! Values the client expands when it starts a server (`${VAR}`, `${workspaceFolder}`) cannot be
//! imported as they are: Coffer expands nothing, so such an entry is reported invalid, naming
//! every reference (never the rest of the value), unless the caller sent `variables` (`coffer
//! mcp import --from-env` reads them from its environment): then `${VAR}`, `${env:VAR}` and
//! `${VAR:-default}` are expanded, and each `env` or header value expanded so is stored as a
//! credential the server references. An `env` or header value that is exactly VS Code's
//! `${input:id}` (a value VS Code asks the user for) maps to the credential `<server>-<VAR>`
//! when it exists; when it does not, the entry is reported invalid with the command that stores
//! it, so that importing again brings it in. An entry that runs `coffer-mcp-shim` is Coffer
//! itself: it is skipped (listed with the duplicates), never an error.
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use axum::{Json, Router};
use coffer_api::servers::{ImportReport, ImportedServer, McpImport};
use coffer_proto::store::{
    AppendAuditRequest, AuditEntry, AuditOutcome, CreateServerRequest, DeleteCredentialRequest, ListCredentialsRequest,
    ListServersRequest, McpServer, SetCredentialRequest, Transport,
};
use secrecy::{ExposeSecret, SecretString};
use serde_json::{Value, json};

use crate::credentials::{REF_PREFIX, encode_ref};
use crate::error::{ApiError, Code, JsonBody};
use crate::rest::servers::{actor, resolve_command, settle, transport_view};
use crate::state::AppState;

/// Most server entries one import may hold.
pub const MAX_ENTRIES: usize = 500;
/// Longest Coffer server name ([`coffer_types::check_server_name`]).
pub const MAX_NAME: usize = coffer_types::MAX_SERVER_NAME_LEN;
pub use coffer_types::secrets::MAX_CREDENTIAL_NAME;
/// Server names the registry refuses.
const RESERVED: &[&str] = &[coffer_types::BUILTIN_SERVER];
/// The shim's file name: an entry running it is Coffer itself.
const SHIM: &str = "coffer-mcp-shim";
/// The import route.
pub fn routes() -> Router<Arc<AppState>> {
    Router::new().route("/v1/mcp/import", post(import))
}

// ---------------------------------------------------------------------------------------------
// Finding the entries of a config file.

/// One server definition found in a config file.
#[derive(Debug, Clone, PartialEq)]
pub struct Found<'a> {
    /// Its key in the file.
    pub original_name: String,
    /// Where in the file: `mcpServers`, `servers`, `mcp.servers`, `projects["/p"].mcpServers`.
    pub origin: String,
    pub def: &'a Value,
}

/// The server entries of `config` in file order — the top-level `mcpServers`, VS Code's
/// `servers` and `mcp.servers`, then each `projects.<path>.mcpServers` of `~/.claude.json` —
/// and a label of the format (`mcpServers`, `claude.json`, `vscode`).
///
/// # Errors
/// A message when `config` is not an object, one of those keys is not an object, or none of
/// them is there.
pub fn find_entries(config: &Value) -> Result<(&'static str, Vec<Found<'_>>), String> {
    let Some(root) = config.as_object() else {
        return Err("config must be a JSON object: the whole content of the config file".into());
    };
    let mut format = "mcpServers";
    let mut sections: Vec<(String, &Value)> = Vec::new();
    if let Some(v) = root.get("mcpServers") {
        sections.push(("mcpServers".into(), v));
    }
    if let Some(v) = root.get("servers") {
        format = "vscode";
        sections.push(("servers".into(), v));
    }
    if let Some(v) = root.get("mcp").and_then(|m| m.get("servers")) {
        format = "vscode";
        sections.push(("mcp.servers".into(), v));
    }
    if let Some(projects) = root.get("projects").and_then(Value::as_object) {
        for (path, p) in projects {
            if let Some(v) = p.get("mcpServers") {
                format = "claude.json";
                sections.push((format!("projects[{}].mcpServers", json!(path)), v));
            }
        }
    }
    if sections.is_empty() {
        return Err("found no MCP servers: expected \"mcpServers\" (Claude Desktop, Claude Code, Cursor), \
                    \"servers\" (VS Code) or \"projects\".*.\"mcpServers\" (~/.claude.json)"
            .into());
    }
    let mut found = Vec::new();
    for (origin, v) in sections {
        let Some(map) = v.as_object() else {
            return Err(format!("{origin} must be an object that maps server names to servers"));
        };
        found.extend(map.iter().map(|(name, def)| Found { original_name: name.clone(), origin: origin.clone(), def }));
    }
    Ok((format, found))
}

// ---------------------------------------------------------------------------------------------
// Reading one definition.

/// One entry's definition, read but not yet resolved (the command is as the file gives it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Definition {
    /// `stdio` or `http`.
    pub transport: &'static str,
    pub command: String,
    pub args: Vec<String>,
    /// In file order; a `null` value (VS Code: unset the variable) is left out.
    pub env: Vec<(String, String)>,
    /// Empty: Coffer's default.
    pub cwd: String,
    pub url: String,
    pub headers: Vec<(String, String)>,
    pub enabled: bool,
    /// The `env` and `headers` keys (`env:KEY`, `headers:KEY`) whose values were expanded from
    /// the caller's variables: they go to the credential store whatever they look like.
    pub expanded: BTreeSet<String>,
}

/// The environment variables the caller read for `${VAR}` references (`coffer mcp import
/// --from-env`), by name; `None` when it read none (then nothing is expanded, not even to a
/// `${VAR:-default}`'s default). No `Debug`: the values may be secrets.
pub type Variables = Option<HashMap<String, SecretString>>;

/// Expands the `${…}` references of one field's value with `vars`; a reference it cannot
/// expand is added to `left` as `${X} (field)` and the value is kept as it is.
fn expand_field(field: &str, value: &str, vars: &Variables, left: &mut Vec<String>) -> (String, bool) {
    let Some(vars) = vars else {
        let refs = coffer_types::variables::references(value);
        left.extend(refs.iter().map(|r| format!("{} ({field})", shorten(r.text, 60))));
        return (value.to_owned(), false);
    };
    match coffer_types::variables::expand(value, |n| vars.get(n).map(|v| v.expose_secret().to_owned())) {
        Ok(done) => done,
        Err(refs) => {
            left.extend(refs.into_iter().map(|r| format!("{} ({field})", shorten(r, 60))));
            (value.to_owned(), false)
        }
    }
}

/// Reads one server entry, expanding `${VAR}` references with `vars` (empty: Coffer expands
/// nothing).
///
/// # Errors
/// Why the entry cannot be imported, in a sentence that names the field and never quotes an
/// `env` or header value (only a `${…}` reference in one); every reference that is left is
/// named at once.
pub fn parse_definition(def: &Value, vars: &Variables) -> Result<Definition, String> {
    let Some(obj) = def.as_object() else {
        return Err("the entry is not an object".into());
    };
    let text = |key: &str| -> Result<Option<String>, String> {
        match obj.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(format!("{key} is not a string")),
        }
    };
    let kind = text("type")?.or(text("transport")?).map(|t| t.to_ascii_lowercase());
    let command = text("command")?.filter(|c| !c.trim().is_empty());
    let url = text("url")?.or(text("serverUrl")?).filter(|u| !u.trim().is_empty());
    let transport = match kind.as_deref() {
        Some("stdio") => "stdio",
        Some("http" | "streamable-http" | "streamable_http" | "streamablehttp") => "http",
        // The legacy HTTP+SSE transport of MCP 2024-11-05.
        Some("sse") => "sse",
        Some(other) => return Err(format!("type {:?} is not one of stdio, http, sse", shorten(other, 30))),
        None if command.is_some() => "stdio",
        None if url.is_some() => "http",
        None => return Err("the entry has neither a command nor a url".into()),
    };
    let disabled = obj.get("disabled").and_then(Value::as_bool) == Some(true)
        || obj.get("enabled").and_then(Value::as_bool) == Some(false);
    let mut d = Definition {
        transport,
        command: String::new(),
        args: Vec::new(),
        env: Vec::new(),
        cwd: String::new(),
        url: String::new(),
        headers: Vec::new(),
        enabled: !disabled,
        expanded: BTreeSet::new(),
    };
    // References that cannot be expanded, each as `${X} (field)`: all are named at once.
    let mut left: Vec<String> = Vec::new();
    if transport == "stdio" {
        d.command = expand_field("command", &command.ok_or("a stdio entry needs a command")?, vars, &mut left).0;
        if let Some(v) = obj.get("args").filter(|v| !v.is_null()) {
            let items = v.as_array().ok_or("args is not an array")?;
            for (i, a) in items.iter().enumerate() {
                let a = scalar(a).ok_or_else(|| format!("args[{i}] is not a string"))?;
                d.args.push(expand_field(&format!("args[{i}]"), &a, vars, &mut left).0);
            }
        }
        d.env = string_map(obj.get("env"), "env", vars, &mut left, &mut d.expanded)?;
        if let Some(f) = obj.get("envFile").filter(|v| !v.is_null()) {
            let shown = f.as_str().map_or_else(String::new, |s| format!(" ({})", shorten(s, 80)));
            return Err(format!("envFile{shown} is not supported: put the variables in env"));
        }
        if let Some(cwd) = text("cwd")?.filter(|c| !c.is_empty()) {
            let (cwd, _) = expand_field("cwd", &cwd, vars, &mut left);
            if left.is_empty() && !cwd.starts_with('/') {
                return Err(format!("cwd {} is a relative path; give an absolute path", shorten(&cwd, 80)));
            }
            d.cwd = cwd;
        }
    } else {
        d.url = expand_field("url", &url.ok_or("an http entry needs a url")?, vars, &mut left).0;
        let lower = d.url.to_ascii_lowercase();
        if left.is_empty() && !(lower.starts_with("http://") || lower.starts_with("https://")) {
            return Err("url must start with http:// or https://".into());
        }
        d.headers = string_map(obj.get("headers"), "headers", vars, &mut left, &mut d.expanded)?;
    }
    if !left.is_empty() {
        return Err(unexpanded(&left, vars.is_some()));
    }
    Ok(d)
}

/// Why an entry with references left (each `${X} (field)`) is not imported, and what to do.
fn unexpanded(left: &[String], had_variables: bool) -> String {
    let how = if had_variables {
        "set them in the environment of `coffer mcp import --from-env` (only environment variables can be read; ${workspaceFolder} and the like cannot), write the values in the file, or add the server with `coffer mcp add`"
    } else {
        "import with --from-env to read environment variables from your shell into the credential store, write the values in the file, or add the server with `coffer mcp add`"
    };
    format!(
        "it references {}, which the client expands when it starts the server; Coffer expands no variables: {how}",
        left.join(", ")
    )
}

/// A string, number or boolean as a string; anything else `None`.
fn scalar(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// An `env` or `headers` object as pairs in file order; `null` values are left out. Values
/// with `${VAR}` references are expanded with `vars` (their keys go to `expanded` as
/// `field:KEY`); references that are left go to `left`.
fn string_map(
    v: Option<&Value>,
    field: &str,
    vars: &Variables,
    left: &mut Vec<String>,
    expanded: &mut BTreeSet<String>,
) -> Result<Vec<(String, String)>, String> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(Vec::new());
    };
    let map = v.as_object().ok_or_else(|| format!("{field} is not an object"))?;
    let mut out = Vec::with_capacity(map.len());
    for (k, v) in map {
        if v.is_null() {
            continue;
        }
        let mut s = scalar(v).ok_or_else(|| format!("{field} value of {k:?} is not a string"))?;
        if input_id(&s).is_none() {
            let (value, changed) = expand_field(&format!("{field} value of {k:?}"), &s, vars, left);
            if changed {
                expanded.insert(format!("{field}:{k}"));
            }
            s = value;
        }
        if s.starts_with(REF_PREFIX) {
            return Err(format!("{field} value of {k:?} starts with Coffer's reserved prefix {REF_PREFIX:?}"));
        }
        out.push((k.clone(), s));
    }
    Ok(out)
}

/// The id of a value that is exactly VS Code's `${input:id}`, else `None`.
fn input_id(value: &str) -> Option<&str> {
    let id = value.strip_prefix("${input:")?.strip_suffix('}')?;
    (!id.is_empty() && !id.contains(['{', '}', '$'])).then_some(id)
}

// ---------------------------------------------------------------------------------------------
// Names.

/// A valid Coffer server name for `original`: lowercase ASCII letters and digits, every other
/// run of characters one `-`, no `-` at either end, at most [`MAX_NAME`] characters; `server`
/// when nothing is left. `"GitHub Tools"` → `github-tools`, `"@scope/pkg_x"` → `scope-pkg-x`.
pub fn derive_name(original: &str) -> String {
    let mut out = String::new();
    for c in original.chars().map(|c| c.to_ascii_lowercase()) {
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            out.push(c);
        } else if !out.is_empty() && !out.ends_with('-') {
            out.push('-');
        }
    }
    out.truncate(MAX_NAME);
    let out = out.trim_end_matches('-');
    if out.is_empty() { "server".into() } else { out.to_owned() }
}

// ---------------------------------------------------------------------------------------------
// Secrets.

pub use coffer_types::secrets::{credential_name, is_secret, looks_like_token, unique};

// ---------------------------------------------------------------------------------------------
// Planning.

/// What an import would do.
pub struct Plan {
    /// `mcpServers`, `claude.json` or `vscode`.
    pub format: &'static str,
    pub imported: Vec<Planned>,
    pub duplicates: Vec<Skipped>,
    pub invalid: Vec<Skipped>,
}

/// One server to register. No `Debug`: it holds credential values.
pub struct Planned {
    pub original_name: String,
    pub origin: String,
    /// The server as it will be stored: the command as given (checked to resolve), secrets
    /// replaced by references.
    pub server: McpServer,
    /// Credentials to create first, `(name, value)`.
    pub credentials: Vec<(String, SecretString)>,
    /// Things the user should know (a secret-looking argument, a relative path).
    pub warnings: Vec<String>,
}

/// An entry that is not imported, and why (`name`: the Coffer name the entry maps to).
pub use coffer_api::servers::SkippedServer as Skipped;

/// The [`Skipped`] entry of `f`, under Coffer name `name`.
fn skip(name: &str, f: &Found<'_>, reason: impl Into<String>) -> Skipped {
    Skipped {
        name: name.to_owned(),
        original_name: f.original_name.clone(),
        origin: f.origin.clone(),
        reason: reason.into(),
    }
}

/// Plans the import of `config`: reads every entry, derives its Coffer name, resolves its
/// command with `lookup` (the daemon's `PATH`; an absolute path must exist and be executable),
/// and moves secret-looking `env`/`headers` values into credentials named
/// `<server>-<VAR>` (with a `-2`… suffix when `credentials` already holds that name: an
/// import never replaces a credential).
///
/// An entry whose name is in `registered` is a duplicate and is not planned; so is one whose
/// name only normalises to a registered one (`Git_Server` → `git-server`) when it is the same
/// server (transport, command, arguments and URL), else it is planned as `git-server-2`… with
/// a warning saying so. A second entry of the file with the same name and the same definition
/// is a duplicate too (`~/.claude.json` often repeats a server across projects); one with
/// another definition gets a `-2`… suffix. `${VAR}` references are expanded with `vars`, and
/// `env`/`headers` values expanded so go to the credential store.
///
/// # Errors
/// `INVALID_ARGUMENT` when the config has no MCP servers section or more than [`MAX_ENTRIES`]
/// entries. Problems of single entries are [`Plan::invalid`], not errors.
pub fn plan(
    config: &Value,
    registered: &BTreeMap<String, McpServer>,
    credentials: &BTreeSet<String>,
    lookup: impl Fn(&str) -> Option<PathBuf>,
    vars: &Variables,
) -> Result<Plan, ApiError> {
    let (format, found) =
        find_entries(config).map_err(|m| ApiError::invalid(m).with_details(json!({"field": "config"})))?;
    if found.len() > MAX_ENTRIES {
        return Err(ApiError::invalid(format!(
            "the config holds {} servers; import at most {MAX_ENTRIES} at once",
            found.len()
        ))
        .with_details(json!({"field": "config"})));
    }
    let mut p = Plan { format, imported: Vec::new(), duplicates: Vec::new(), invalid: Vec::new() };
    // Names planned so far, with the definition and origin they came from.
    let mut taken: HashMap<String, (Definition, String, String)> = HashMap::new();
    let mut used_credentials: BTreeSet<String> = credentials.clone();
    for f in &found {
        let base = derive_name(&f.original_name);
        let def = match parse_definition(f.def, vars) {
            Ok(d) => d,
            Err(reason) => {
                p.invalid.push(skip(&base, f, reason));
                continue;
            }
        };
        if def.transport == "stdio" && FsPath::new(&def.command).file_name().is_some_and(|n| n == SHIM) {
            p.duplicates.push(skip(
                &base,
                f,
                "this entry is Coffer itself (coffer-mcp-shim, as `coffer connect` writes it); skipped",
            ));
            continue;
        }
        let mut renamed = None;
        if let Some(existing) = registered.get(&base) {
            let same = same_server(existing, &def, &lookup);
            if same || f.original_name == base {
                let what = if same { "the same server" } else { "another server" };
                p.duplicates.push(skip(&base, f, format!("already registered: {base} is {what}; left as it is")));
                continue;
            }
            renamed = Some(base.clone());
        }
        let name = match taken.get(&base) {
            Some((same, orig, origin)) if *same == def => {
                p.duplicates.push(skip(
                    &base,
                    f,
                    format!("the same server as {orig:?} in {origin}, earlier in this file"),
                ));
                continue;
            }
            Some(_) => unique(&base, MAX_NAME, |n| {
                taken.contains_key(n) || registered.contains_key(n) || RESERVED.contains(&n)
            }),
            _ if renamed.is_some() => unique(&base, MAX_NAME, |n| {
                taken.contains_key(n) || registered.contains_key(n) || RESERVED.contains(&n)
            }),
            None if RESERVED.contains(&base.as_str()) => {
                unique(&base, MAX_NAME, |n| taken.contains_key(n) || registered.contains_key(n))
            }
            None => base.clone(),
        };
        match plan_one(&name, f, &def, &mut used_credentials, &lookup) {
            Ok(mut planned) => {
                if let Some(other) = renamed {
                    planned
                        .warnings
                        .insert(0, format!("imported as {name}: {other} is already registered as another server"));
                }
                taken.insert(name, (def, f.original_name.clone(), f.origin.clone()));
                p.imported.push(planned);
            }
            Err(reason) => p.invalid.push(skip(&name, f, reason)),
        }
    }
    Ok(p)
}

/// Whether registered server `existing` is the server `def` defines: same transport, command
/// (as given, or as `lookup` resolves it), arguments and URL.
fn same_server(existing: &McpServer, def: &Definition, lookup: &impl Fn(&str) -> Option<PathBuf>) -> bool {
    let command = existing.command == def.command
        || resolve_command(&def.command, lookup).is_ok_and(|c| c == existing.command)
        || resolve_command(&existing.command, lookup).is_ok_and(|c| c == def.command);
    existing.transport().as_str() == def.transport && existing.args == def.args && existing.url == def.url && command
}

/// Plans one valid definition under `name`; `used` holds the credential names already taken.
fn plan_one(
    name: &str,
    f: &Found<'_>,
    def: &Definition,
    used: &mut BTreeSet<String>,
    lookup: &impl Fn(&str) -> Option<PathBuf>,
) -> Result<Planned, String> {
    let mut warnings = Vec::new();
    let command = if def.transport == "stdio" {
        if def.command.contains('/') && !def.command.starts_with('/') {
            return Err(format!(
                "command {} is relative to a folder the client chose, which Coffer does not know; give an absolute path",
                shorten(&def.command, 80)
            ));
        }
        resolve_command(&def.command, lookup).map_err(|e| e.message)?
    } else {
        String::new()
    };
    let secret: BTreeSet<usize> = coffer_types::secrets::secret_args(&def.args).into_iter().map(|a| a.index).collect();
    for (i, a) in def.args.iter().enumerate() {
        if secret.contains(&i) {
            warnings.push(format!(
                "args[{i}] looks like a secret and is stored as given (allow_secret_args); it is synced and visible \
                 in `ps`: prefer a server option that reads it from an environment variable"
            ));
        } else if a.starts_with("./") || a.starts_with("../") {
            warnings.push(format!(
                "args[{i}] {} is a relative path; the server runs in {}",
                shorten(a, 80),
                if def.cwd.is_empty() { "Coffer's workspace folder" } else { &def.cwd }
            ));
        }
    }
    // VS Code's `${input:id}` values: the credential `<server>-<VAR>` stands for each, and must
    // exist already (the user stores it, then imports again).
    for (field, pairs) in [("env", &def.env), ("headers", &def.headers)] {
        for (k, v) in pairs.iter().filter(|(_, v)| input_id(v).is_some()) {
            let cred = credential_name(name, k);
            if !used.contains(&cred) {
                return Err(format!(
                    "{field} value of {k:?} is {}, a value VS Code asks you for when it starts the server; store it as \
                     a credential, then import again: printf %s \"$VALUE\" | coffer credentials set {cred}",
                    shorten(v, 60)
                ));
            }
            warnings.push(format!("{field} value of {k:?} ({}) is the credential {cred}", shorten(v, 60)));
        }
    }
    let mut credentials = Vec::new();
    let expanded = &def.expanded;
    let mut secure = |field: &str, pairs: &[(String, String)]| -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| {
                if input_id(v).is_some() {
                    return (k.clone(), encode_ref(&credential_name(name, k)));
                }
                if !is_secret(k, v) && !expanded.contains(&format!("{field}:{k}")) {
                    return (k.clone(), v.clone());
                }
                let mut cred = credential_name(name, k);
                if used.contains(&cred) {
                    cred = unique(&cred, MAX_CREDENTIAL_NAME, |n| used.contains(n));
                }
                used.insert(cred.clone());
                credentials.push((cred.clone(), SecretString::from(v.clone())));
                (k.clone(), encode_ref(&cred))
            })
            .collect()
    };
    let env = secure("env", &def.env);
    let headers = secure("headers", &def.headers);
    if let Some((c, _)) =
        credentials.iter().find(|(_, v)| v.expose_secret().len() > crate::rest::credentials::MAX_VALUE_BYTES)
    {
        return Err(format!(
            "the value for credential {c} is longer than {} bytes",
            crate::rest::credentials::MAX_VALUE_BYTES
        ));
    }
    let server = McpServer {
        name: name.to_owned(),
        // `Definition::transport` is one of the three words.
        transport: Transport::parse(def.transport).unwrap_or_default().into(),
        command,
        args: def.args.clone(),
        env,
        cwd: def.cwd.clone(),
        url: def.url.clone(),
        headers,
        enabled: def.enabled,
        ..Default::default()
    };
    Ok(Planned { original_name: f.original_name.clone(), origin: f.origin.clone(), server, credentials, warnings })
}

fn shorten(s: &str, n: usize) -> String {
    if s.chars().count() <= n { s.to_owned() } else { format!("{}…", s.chars().take(n).collect::<String>()) }
}

// ---------------------------------------------------------------------------------------------
/// Moves every planned server with a secret-looking argument
/// ([`coffer_types::secrets::secret_args`]) to `invalid`, with a reason naming the argument
/// (never its value) and what to do: an argument is stored in plaintext, synced and visible in
/// `ps`. The import's `allow_secret_args` skips this.
pub fn refuse_secret_args(p: &mut Plan) {
    let (keep, refused): (Vec<Planned>, Vec<Planned>) = std::mem::take(&mut p.imported)
        .into_iter()
        .partition(|i| coffer_types::secrets::secret_args(&i.server.args).is_empty());
    p.imported = keep;
    for i in refused {
        let first = coffer_types::secrets::secret_args(&i.server.args)
            .into_iter()
            .next()
            .unwrap_or(coffer_types::secrets::SecretArg { index: 0, flag: None });
        let what = match &first.flag {
            Some(flag) => format!("args[{}] (the value of {flag})", first.index),
            None => format!("args[{}]", first.index),
        };
        p.invalid.push(Skipped {
            name: i.server.name.clone(),
            original_name: i.original_name,
            origin: i.origin,
            reason: format!(
                "{what} looks like a secret: arguments are stored in plaintext, synced and visible in `ps`; pass it \
                 in an environment variable if the server reads one (add it with `coffer mcp add … --env-credential \
                 VAR=NAME`), or import with allow_secret_args (CLI: --allow-secret-args) to keep it as an argument"
            ),
        });
    }
}

// The route.

/// Most variables one import may carry.
pub const MAX_VARIABLES: usize = 500;

/// `POST /v1/mcp/import` with `{"config": {…}, "source": "label", "dry_run": false,
/// "allow_secret_args": false, "variables": {"VAR": "value"}}` →
/// `{format, source, dry_run, imported:[{name, original_name, origin, transport,
/// credentials_created:[…], warnings:[…]}], duplicates:[{name, original_name, origin, reason}],
/// invalid:[…same…]}` (200 even when some or all entries are not imported). With `dry_run`
/// nothing is written and `imported` says what would be. `variables` expand the config's
/// `${VAR}`, `${env:VAR}` and `${VAR:-default}` references (without them an entry that has one is
/// invalid, naming every reference); an `env` or header value expanded so is stored as a
/// credential, like a secret-looking one. An entry with a secret-looking argument is invalid
/// unless `allow_secret_args` ([`refuse_secret_args`]).
///
/// Writes go through the store's `SetCredential` and `CreateServer` (each audited as usual),
/// then one `mcp.import` audit row with the counts. A server the store refuses (a race on its
/// name, a store error) is reported in `duplicates`/`invalid` and the credentials made for it
/// are removed again.
///
/// Errors: `INVALID_ARGUMENT` (no MCP servers section, too many entries, body shape),
/// `UNKNOWN_FIELD`, `SERVICE_UNAVAILABLE` while the store restarts.
async fn import(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<JsonBody<McpImport>, ApiError>,
) -> Result<Json<ImportReport>, ApiError> {
    let JsonBody(mut b) = body.map_err(|e| match e.code {
        // serde's type errors may quote what was sent (a secret in the config): say what is
        // expected instead.
        Code::InvalidArgument => ApiError::invalid(
            "the body must be {\"config\": {…the config file…}, \"source\": \"label\", \"dry_run\": false}",
        ),
        _ => e,
    })?;
    let source: Option<String> = b.source.as_deref().map(|s| shorten(s.trim(), 300)).filter(|s| !s.is_empty());
    let given = b.variables.take();
    if let Some(given) = &given {
        if given.len() > MAX_VARIABLES {
            return Err(ApiError::invalid(format!("at most {MAX_VARIABLES} variables"))
                .with_details(json!({"field": "variables"})));
        }
        if let Some(bad) = given.keys().find(|k| !coffer_types::variables::is_variable_name(k)) {
            return Err(ApiError::invalid(format!("{:?} is not a variable name", shorten(bad, 60)))
                .with_details(json!({"field": "variables"})));
        }
    }
    let vars: Variables = given.map(|g| g.into_iter().map(|(k, v)| (k, SecretString::from(v))).collect());
    let dry_run = b.dry_run;
    let mut store = st.store.clone();
    let registered: BTreeMap<String, McpServer> = store
        .registry
        .list_servers(ListServersRequest {})
        .await?
        .into_inner()
        .servers
        .into_iter()
        .map(|s| (s.name.clone(), s))
        .collect();
    let existing: BTreeSet<String> = store
        .credentials
        .list_credentials(ListCredentialsRequest {})
        .await?
        .into_inner()
        .items
        .into_iter()
        .map(|c| c.name)
        .collect();
    let mut planned = plan(&b.config, &registered, &existing, coffer_runtime::connect::which_on_path, &vars)?;
    if !b.allow_secret_args {
        refuse_secret_args(&mut planned);
    }
    let Plan { format, imported: planned, mut duplicates, mut invalid } = planned;
    drop(b);
    let who = actor(&headers);
    let mut imported: Vec<ImportedServer> = Vec::new();
    let mut credentials_created = 0usize;
    let mut last_seq = 0u64;
    for p in planned {
        let report = |p: &Planned| ImportedServer {
            name: p.server.name.clone(),
            original_name: p.original_name.clone(),
            origin: p.origin.clone(),
            transport: transport_view(p.server.transport()),
            credentials_created: p.credentials.iter().map(|(n, _)| n.clone()).collect(),
            warnings: p.warnings.clone(),
        };
        if dry_run {
            imported.push(report(&p));
            continue;
        }
        let skipped = |reason: String| Skipped {
            name: p.server.name.clone(),
            original_name: p.original_name.clone(),
            origin: p.origin.clone(),
            reason,
        };
        let mut made: Vec<String> = Vec::new();
        let mut failed: Option<Skipped> = None;
        for (name, value) in &p.credentials {
            // The request's `Debug` prints no value (coffer-proto).
            let req = SetCredentialRequest {
                name: name.clone(),
                value: value.expose_secret().to_owned(),
                actor: who.clone(),
                create_only: false,
            };
            match store.credentials.set_credential(req).await {
                Ok(r) => {
                    last_seq = last_seq.max(r.into_inner().seq);
                    made.push(name.clone());
                }
                Err(e) => {
                    failed =
                        Some(skipped(format!("credential {name} could not be stored: {}", ApiError::from(e).message)));
                    break;
                }
            }
        }
        if failed.is_none() {
            let req = CreateServerRequest { server: Some(p.server.clone()), actor: who.clone() };
            match store.registry.create_server(req).await {
                Ok(r) => {
                    last_seq = last_seq.max(r.into_inner().seq);
                    credentials_created += made.len();
                    tracing::info!(server = %p.server.name, transport = p.server.transport().as_str(), "Server imported.");
                    imported.push(report(&p));
                    continue;
                }
                Err(e) if e.code() == tonic::Code::AlreadyExists => {
                    let reason = format!("a server named {} is already registered; left as it is", p.server.name);
                    duplicates.push(skipped(reason));
                }
                Err(e) => failed = Some(skipped(ApiError::from(e).message)),
            }
        }
        invalid.extend(failed);
        // Take back the credentials made for a server that was not registered.
        for name in made {
            let req = DeleteCredentialRequest { name: name.clone(), actor: who.clone() };
            match store.credentials.delete_credential(req).await {
                Ok(r) => last_seq = last_seq.max(r.into_inner().seq),
                Err(e) => {
                    tracing::warn!(credential = %name, error = %e.message(), "Could not remove a credential of a failed import.")
                }
            }
        }
    }
    if !dry_run {
        let detail = json!({
            "source": source, "format": format, "imported": imported.len(), "duplicates": duplicates.len(),
            "invalid": invalid.len(), "credentials_created": credentials_created,
        });
        let entry = AuditEntry {
            actor: who,
            action: "mcp.import".into(),
            target: source.clone().unwrap_or_else(|| "config".into()),
            outcome: if imported.is_empty() && !invalid.is_empty() { AuditOutcome::Error } else { AuditOutcome::Ok }
                .into(),
            trace_id: coffer_runtime::grpc::current_trace().unwrap_or_default(),
            detail: detail.to_string(),
            ..Default::default()
        };
        match store.audit.append_audit(AppendAuditRequest { entries: vec![entry] }).await {
            Ok(r) => last_seq = last_seq.max(r.into_inner().seq),
            Err(e) => tracing::warn!(error = %e.message(), "Could not audit an import."),
        }
        settle(&st, last_seq).await;
        tracing::info!(
            imported = imported.len(),
            duplicates = duplicates.len(),
            invalid = invalid.len(),
            credentials_created,
            "Import done."
        );
    }
    Ok(Json(ImportReport { format: format.to_owned(), source, dry_run, imported, duplicates, invalid }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Claude Desktop's `claude_desktop_config.json`: stdio servers only, other keys around.
    const CLAUDE_DESKTOP: &str = r#"{
      "globalShortcut": "Ctrl+Space",
      "mcpServers": {
        "filesystem": {
          "command": "npx",
          "args": ["-y", "@modelcontextprotocol/server-filesystem", "/Users/me/Desktop"]
        },
        "GitHub": {
          "command": "npx",
          "args": ["-y", "@modelcontextprotocol/server-github"],
          "env": {"GITHUB_PERSONAL_ACCESS_TOKEN": "ghp_0123456789abcdefghijABCDEFGHIJ012345", "LOG_LEVEL": "info"}
        },
        "local script": {"command": "./run-server.sh"},
        "broken": {"args": ["x"]}
      }
    }"#;

    /// Claude Code's project `.mcp.json`: `type` stdio/http/sse, headers.
    const CLAUDE_CODE_PROJECT: &str = r#"{
      "mcpServers": {
        "notes": {"type": "stdio", "command": "/bin/sh", "args": ["-c", "exec cat"], "env": {"NOTES_DIR": "/tmp/notes"}},
        "linear": {"type": "http", "url": "http://127.0.0.1:9/mcp", "headers": {"Authorization": "Bearer lin_api_0123456789abcdef"}},
        "old-sse": {"type": "sse", "url": "http://127.0.0.1:9/sse"},
        "expanded": {"type": "http", "url": "https://api.example.com/mcp", "headers": {"X-API-Key": "${API_KEY}"}}
      }
    }"#;

    /// Claude Code's `~/.claude.json`: user servers at the top, project servers under
    /// `projects`, and much else that is not about MCP.
    const CLAUDE_JSON: &str = r#"{
      "numStartups": 42,
      "oauthAccount": {"emailAddress": "me@example.com"},
      "mcpServers": {
        "memory": {"type": "stdio", "command": "npx", "args": ["-y", "@modelcontextprotocol/server-memory"], "env": {}}
      },
      "projects": {
        "/home/me/a": {
          "allowedTools": [],
          "mcpServers": {
            "memory": {"type": "stdio", "command": "npx", "args": ["-y", "@modelcontextprotocol/server-memory"], "env": {}},
            "db": {"command": "uvx", "args": ["mcp-server-sqlite", "--db-path", "/home/me/a/app.db"]}
          }
        },
        "/home/me/b": {
          "mcpServers": {
            "db": {"command": "uvx", "args": ["mcp-server-sqlite", "--db-path", "/home/me/b/app.db"]}
          }
        },
        "/home/me/c": {"history": []}
      }
    }"#;

    /// Cursor's `~/.cursor/mcp.json`: a url without `type`, an API key in `env`.
    const CURSOR: &str = r#"{
      "mcpServers": {
        "web-search": {"command": "npx", "args": ["-y", "brave-search-mcp"], "env": {"BRAVE_API_KEY": "BSAxyz"}},
        "remote": {"url": "http://localhost:8931/mcp", "headers": {"X-Team": "core"}},
        "Coffer": {"command": "/usr/local/bin/coffer-mcp-shim", "args": []}
      }
    }"#;

    /// VS Code's `.vscode/mcp.json`: `servers` with `type`, `inputs` beside them.
    const VSCODE: &str = r#"{
      "inputs": [{"type": "promptString", "id": "perplexity-key", "description": "Perplexity API Key", "password": true}],
      "servers": {
        "Perplexity": {"type": "stdio", "command": "npx", "args": ["-y", "server-perplexity-ask"], "env": {"PERPLEXITY_API_KEY": "${input:perplexity-key}"}},
        "fetch": {"type": "stdio", "command": "uvx", "args": ["mcp-server-fetch"]},
        "github": {"type": "http", "url": "http://127.0.0.1:7/mcp/"},
        "legacy": {"type": "sse", "url": "http://localhost:3000/sse"},
        "weird": {"type": "websocket", "url": "ws://x"}
      }
    }"#;

    fn lookup(name: &str) -> Option<PathBuf> {
        match name {
            "npx" => Some(PathBuf::from("/usr/bin/npx")),
            "uvx" => Some(PathBuf::from("/home/me/.local/bin/uvx")),
            _ => None,
        }
    }

    /// Servers registered under `names` (each a distinct stdio server).
    fn registered(names: &[&str]) -> BTreeMap<String, McpServer> {
        names
            .iter()
            .map(|n| {
                let s = McpServer {
                    name: (*n).to_owned(),
                    transport: Transport::Stdio.into(),
                    command: format!("/opt/{n}/bin/srv"),
                    ..Default::default()
                };
                ((*n).to_owned(), s)
            })
            .collect()
    }

    fn run(config: &str, names: &[&str], creds: &[&str]) -> Plan {
        let v: Value = serde_json::from_str(config).unwrap();
        let c = creds.iter().map(|s| (*s).to_owned()).collect();
        plan(&v, &registered(names), &c, lookup, &None).unwrap()
    }

    fn names(p: &Plan) -> Vec<&str> {
        p.imported.iter().map(|i| i.server.name.as_str()).collect()
    }

    fn reason<'a>(list: &'a [Skipped], name: &str) -> &'a str {
        &list
            .iter()
            .find(|s| s.name == name || s.original_name == name)
            .unwrap_or_else(|| panic!("{name} in {list:?}"))
            .reason
    }

    #[test]
    fn claude_desktop() {
        let p = run(CLAUDE_DESKTOP, &[], &[]);
        assert_eq!(p.format, "mcpServers");
        assert_eq!(names(&p), ["filesystem", "github"]);
        let fs = &p.imported[0].server;
        // A bare command is stored as given (each machine resolves it when the server starts).
        assert_eq!((fs.transport().as_str(), fs.command.as_str()), ("stdio", "npx"));
        assert_eq!(fs.args, ["-y", "@modelcontextprotocol/server-filesystem", "/Users/me/Desktop"]);
        let gh = &p.imported[1];
        assert_eq!(gh.original_name, "GitHub");
        assert_eq!(
            gh.server.env["GITHUB_PERSONAL_ACCESS_TOKEN"],
            "coffer-credential-ref:github-GITHUB_PERSONAL_ACCESS_TOKEN"
        );
        assert_eq!(gh.server.env["LOG_LEVEL"], "info");
        assert_eq!(gh.credentials.len(), 1);
        assert_eq!(gh.credentials[0].0, "github-GITHUB_PERSONAL_ACCESS_TOKEN");
        assert_eq!(gh.credentials[0].1.expose_secret(), "ghp_0123456789abcdefghijABCDEFGHIJ012345");
        assert!(reason(&p.invalid, "local script").contains("relative"), "{:?}", p.invalid);
        assert_eq!(p.invalid.iter().find(|s| s.original_name == "local script").unwrap().name, "local-script");
        assert!(reason(&p.invalid, "broken").contains("neither a command nor a url"));
        assert!(p.duplicates.is_empty());
    }

    #[test]
    fn claude_code_project() {
        let p = run(CLAUDE_CODE_PROJECT, &[], &[]);
        assert_eq!(names(&p), ["notes", "linear", "old-sse"]);
        let notes = &p.imported[0].server;
        assert_eq!(notes.command, "/bin/sh");
        assert_eq!(notes.env["NOTES_DIR"], "/tmp/notes");
        assert!(p.imported[0].credentials.is_empty());
        let linear = &p.imported[1];
        assert_eq!(
            (linear.server.transport().as_str(), linear.server.url.as_str()),
            ("http", "http://127.0.0.1:9/mcp")
        );
        assert_eq!(linear.server.headers["Authorization"], "coffer-credential-ref:linear-Authorization");
        assert_eq!(linear.credentials[0].1.expose_secret(), "Bearer lin_api_0123456789abcdef");
        // The legacy HTTP+SSE transport of MCP 2024-11-05.
        let old = &p.imported[2].server;
        assert_eq!((old.transport().as_str(), old.url.as_str()), ("sse", "http://127.0.0.1:9/sse"));
        let r = reason(&p.invalid, "expanded");
        assert!(r.contains("${API_KEY}") && r.contains("headers"), "{r}");
    }

    #[test]
    fn claude_json_with_projects() {
        let p = run(CLAUDE_JSON, &[], &[]);
        assert_eq!(p.format, "claude.json");
        // The user's memory server and project a's identical one are one server; the two `db`
        // servers differ, so the second gets a suffix.
        assert_eq!(names(&p), ["memory", "db", "db-2"]);
        assert_eq!(p.imported[1].origin, "projects[\"/home/me/a\"].mcpServers");
        assert_eq!(p.imported[1].server.command, "uvx");
        assert_eq!(p.imported[2].server.args[2], "/home/me/b/app.db");
        assert_eq!(p.duplicates.len(), 1);
        assert!(p.duplicates[0].reason.contains("earlier in this file"), "{:?}", p.duplicates);
        assert!(p.invalid.is_empty(), "{:?}", p.invalid);
    }

    #[test]
    fn cursor() {
        let p = run(CURSOR, &["remote"], &[]);
        assert_eq!(names(&p), ["web-search"]);
        // BRAVE_API_KEY is a secret by its name, however short its value.
        assert_eq!(p.imported[0].credentials[0].0, "web-search-BRAVE_API_KEY");
        assert!(reason(&p.duplicates, "remote").contains("already registered"));
        assert!(reason(&p.duplicates, "Coffer").contains("Coffer itself"));
    }

    #[test]
    fn vscode() {
        let p = run(VSCODE, &[], &[]);
        assert_eq!(p.format, "vscode");
        assert_eq!(names(&p), ["fetch", "github", "legacy"]);
        let r = reason(&p.invalid, "Perplexity");
        assert!(r.contains("${input:perplexity-key}") && !r.contains("description"), "{r}");
        assert!(r.contains("coffer credentials set perplexity-PERPLEXITY_API_KEY"), "the fix is offered: {r}");
        // Once that credential exists, importing again references it.
        let again = run(VSCODE, &[], &["perplexity-PERPLEXITY_API_KEY"]);
        assert_eq!(names(&again), ["perplexity", "fetch", "github", "legacy"]);
        let perplexity = &again.imported[0];
        assert_eq!(perplexity.server.env["PERPLEXITY_API_KEY"], "coffer-credential-ref:perplexity-PERPLEXITY_API_KEY");
        assert!(perplexity.credentials.is_empty(), "nothing new is stored");
        assert!(
            perplexity.warnings[0].contains("is the credential perplexity-PERPLEXITY_API_KEY"),
            "{:?}",
            perplexity.warnings
        );
        // A value that only contains an input reference is still refused.
        let mixed = json!({"servers": {"x": {"command": "/bin/sh", "env": {"K": "Bearer ${input:k}"}}}});
        let m = plan(&mixed, &BTreeMap::new(), &BTreeSet::from(["x-K".to_owned()]), lookup, &None).unwrap();
        assert!(reason(&m.invalid, "x").contains("Coffer expands no variables"), "{:?}", m.invalid);
        assert!(reason(&p.invalid, "weird").contains("not one of stdio, http, sse"));
        let settings = json!({"editor.fontSize": 14, "mcp": {"servers": {"fetch": {"command": "uvx", "args": ["mcp-server-fetch"]}}}});
        let p = plan(&settings, &BTreeMap::new(), &BTreeSet::new(), lookup, &None).unwrap();
        assert_eq!((p.format, names(&p)), ("vscode", vec!["fetch"]));
    }

    #[test]
    fn not_a_config() {
        let e = |v: Value| plan(&v, &BTreeMap::new(), &BTreeSet::new(), lookup, &None).err().expect("an error").message;
        assert!(e(json!([1])).contains("JSON object"));
        assert!(e(json!({"theme": "dark"})).contains("found no MCP servers"));
        assert!(e(json!({"mcpServers": []})).contains("must be an object"));
        let many: serde_json::Map<String, Value> =
            (0..=MAX_ENTRIES).map(|i| (format!("s{i}"), json!({"command": "npx"}))).collect();
        assert!(e(json!({"mcpServers": many})).contains("at most"));
        let empty = plan(&json!({"mcpServers": {}}), &BTreeMap::new(), &BTreeSet::new(), lookup, &None).unwrap();
        assert!(empty.imported.is_empty() && empty.invalid.is_empty());
    }

    #[test]
    fn names_are_derived() {
        assert_eq!(derive_name("GitHub"), "github");
        assert_eq!(derive_name("GitHub Tools"), "github-tools");
        assert_eq!(derive_name("@modelcontextprotocol/server-filesystem"), "modelcontextprotocol-ser");
        assert_eq!(derive_name("my_server__v2"), "my-server-v2");
        assert_eq!(derive_name("--x--"), "x");
        assert_eq!(derive_name("éè"), "server");
        assert_eq!(derive_name("a-very-long-name-that-ends-here-x"), "a-very-long-name-that-en");
        assert_eq!(derive_name("abcdefghijklmnopqrstuvw-z"), "abcdefghijklmnopqrstuvw");
        for n in ["github", "x", "a-very-long-name-that-en"] {
            assert_eq!(derive_name(n), n, "valid names are kept");
        }
        assert_eq!(unique("abcdefghijklmnopqrstuvwx", 24, |n| n.ends_with("-2")), "abcdefghijklmnopqrstuv-3");
        // The reserved name gets a suffix.
        let p = plan(
            &json!({"mcpServers": {"coffer": {"command": "npx"}}}),
            &BTreeMap::new(),
            &BTreeSet::new(),
            lookup,
            &None,
        )
        .unwrap();
        assert_eq!(names(&p), ["coffer-2"]);
    }

    #[test]
    fn credential_names_never_replace_existing_ones() {
        assert_eq!(credential_name("gh", "X-API-Key"), "gh-X-API-Key");
        assert_eq!(credential_name("gh", "a b/c"), "gh-a_b_c");
        assert_eq!(credential_name("s", &"K".repeat(100)).len(), MAX_CREDENTIAL_NAME);
        let p = run(CLAUDE_DESKTOP, &[], &["github-GITHUB_PERSONAL_ACCESS_TOKEN"]);
        assert_eq!(p.imported[1].credentials[0].0, "github-GITHUB_PERSONAL_ACCESS_TOKEN-2");
        for (n, _) in p.imported.iter().flat_map(|i| &i.credentials) {
            assert!(crate::credentials::valid_name(n), "{n}");
        }
    }

    #[test]
    fn definitions() {
        let d = |v: Value| parse_definition(&v, &None);
        let ok =
            d(json!({"command": "x", "args": ["a", 1, true], "env": {"A": "1", "B": 2, "C": null}, "disabled": true}))
                .unwrap();
        assert_eq!(ok.args, ["a", "1", "true"]);
        assert_eq!(ok.env, [("A".to_owned(), "1".to_owned()), ("B".to_owned(), "2".to_owned())]);
        assert!(!ok.enabled);
        assert_eq!(d(json!({"type": "streamable-http", "url": "http://a/mcp"})).unwrap().transport, "http");
        assert_eq!(d(json!({"serverUrl": "http://a/mcp"})).unwrap().url, "http://a/mcp");
        assert_eq!(d(json!({"command": "x", "cwd": "/srv"})).unwrap().cwd, "/srv");
        for (bad, want) in [
            (json!("npx"), "not an object"),
            (json!({"command": 5}), "command is not a string"),
            (json!({"command": "x", "args": "a b"}), "args is not an array"),
            (json!({"command": "x", "args": [{}]}), "args[0] is not a string"),
            (json!({"command": "x", "env": {"A": []}}), "env value of \"A\" is not a string"),
            (json!({"command": "x", "env": {"A": "coffer-credential-ref:y"}}), "reserved prefix"),
            (json!({"command": "x", "envFile": "${workspaceFolder}/.env"}), "envFile"),
            (json!({"command": "x", "cwd": "rel"}), "relative"),
            (json!({"command": "x", "args": ["${workspaceFolder}/a.js"]}), "${workspaceFolder} (args[0])"),
            (json!({"type": "stdio", "url": "http://a"}), "needs a command"),
            (json!({"type": "http", "command": "x"}), "needs a url"),
            (json!({"url": "ftp://a"}), "http:// or https://"),
        ] {
            let e = d(bad.clone()).unwrap_err();
            assert!(e.contains(want), "{bad}: {e}");
        }
        // A value is never quoted in a reason, only the variable it references.
        let e = d(json!({"command": "x", "env": {"T": "secretvalue-${X}"}})).unwrap_err();
        assert!(e.contains("${X}") && !e.contains("secretvalue"), "{e}");
    }

    #[test]
    fn commands_resolve_or_are_invalid() {
        let p = plan(
            &json!({"mcpServers": {
                "abs": {"command": "/bin/sh"},
                "missing": {"command": "/nonexistent/bin/srv"},
                "unknown": {"command": "not-on-path"},
                "rel": {"command": "node_modules/.bin/srv"},
            }}),
            &BTreeMap::new(),
            &BTreeSet::new(),
            lookup,
            &None,
        )
        .unwrap();
        assert_eq!(names(&p), ["abs"]);
        assert!(reason(&p.invalid, "missing").contains("does not exist"));
        assert!(reason(&p.invalid, "unknown").contains("not found on PATH"));
        assert!(reason(&p.invalid, "rel").contains("absolute path"));
    }

    #[test]
    fn warnings_for_arguments() {
        let p = plan(
            &json!({"mcpServers": {"s": {"command": "npx", "args": ["./dist/index.js", "--token", "ghp_0123456789abcdefghijklmn"]}}}),
            &BTreeMap::new(),
            &BTreeSet::new(),
            lookup,
            &None,
        )
        .unwrap();
        let w = &p.imported[0].warnings;
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(w[0].contains("relative path") && w[1].contains("looks like a secret"), "{w:?}");
        assert!(!w[1].contains("ghp_"), "the value itself is not repeated: {w:?}");
        // Without allow_secret_args (issue 32) the entry is refused, naming the argument only.
        let mut p = p;
        refuse_secret_args(&mut p);
        assert!(p.imported.is_empty(), "{:?}", p.imported.len());
        let r = reason(&p.invalid, "s");
        assert!(
            r.contains("args[2] (the value of --token) looks like a secret") && r.contains("allow_secret_args"),
            "{r}"
        );
        assert!(!r.contains("ghp_"), "{r}");
    }

    /// Every `${…}` of an entry is named at once; `--from-env`'s variables expand them, and an
    /// env or header value expanded so is stored as a credential whatever it looks like.
    #[test]
    fn variables_are_all_named_and_expanded_into_credentials() {
        let config = json!({"mcpServers": {"gh": {
            "command": "npx",
            "args": ["-y", "${PKG:-server-github}", "--root", "${env:ROOT}"],
            "env": {"GH_HOST": "${HOST}", "MODE": "fixed"},
        }}});
        let none = plan(&config, &BTreeMap::new(), &BTreeSet::new(), lookup, &None).unwrap();
        let r = reason(&none.invalid, "gh");
        assert!(
            r.contains("${PKG:-server-github} (args[1]), ${env:ROOT} (args[3]), ${HOST} (env value of \"GH_HOST\")")
                && r.contains("--from-env"),
            "{r}"
        );
        let mut vars: Variables = Some(HashMap::new());
        vars.as_mut().unwrap().insert("ROOT".into(), SecretString::from("/srv/data"));
        let some = plan(&config, &BTreeMap::new(), &BTreeSet::new(), lookup, &vars).unwrap();
        let r = reason(&some.invalid, "gh");
        assert!(r.contains("${HOST} (env value of \"GH_HOST\")") && !r.contains("ROOT") && !r.contains("PKG"), "{r}");
        vars.as_mut().unwrap().insert("HOST".into(), SecretString::from("github.example.com"));
        let p = plan(&config, &BTreeMap::new(), &BTreeSet::new(), lookup, &vars).unwrap();
        let gh = &p.imported[0];
        assert_eq!(gh.server.args, ["-y", "server-github", "--root", "/srv/data"]);
        assert_eq!(gh.server.env["MODE"], "fixed");
        assert_eq!(gh.server.env["GH_HOST"], encode_ref("gh-GH_HOST"));
        assert_eq!(gh.credentials.len(), 1);
        assert_eq!(
            (gh.credentials[0].0.as_str(), gh.credentials[0].1.expose_secret()),
            ("gh-GH_HOST", "github.example.com")
        );
    }

    /// A name that normalises to a registered one: the same server is "already registered",
    /// another is imported under a new name, and the report says so.
    #[test]
    fn a_normalised_name_collision_is_renamed_unless_it_is_the_same_server() {
        let mut reg = registered(&["git-server"]);
        reg.get_mut("git-server").unwrap().args = vec!["--repo".into(), "/r".into()];
        let config =
            |command: &str| json!({"mcpServers": {"Git_Server": {"command": command, "args": ["--repo", "/r"]}}});
        let other = plan(&config("npx"), &reg, &BTreeSet::new(), lookup, &None).unwrap();
        assert_eq!(names(&other), ["git-server-2"]);
        assert_eq!(
            other.imported[0].warnings[0],
            "imported as git-server-2: git-server is already registered as another server"
        );
        let same = plan(&config("/opt/git-server/bin/srv"), &reg, &BTreeSet::new(), lookup, &None).unwrap();
        assert!(names(&same).is_empty());
        assert_eq!(
            reason(&same.duplicates, "Git_Server"),
            "already registered: git-server is the same server; left as it is"
        );
        // The very same name stays a duplicate, whatever its definition.
        let exact = json!({"mcpServers": {"git-server": {"command": "npx"}}});
        let p = plan(&exact, &reg, &BTreeSet::new(), lookup, &None).unwrap();
        assert_eq!(
            reason(&p.duplicates, "git-server"),
            "already registered: git-server is another server; left as it is"
        );
    }
}
