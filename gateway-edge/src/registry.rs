//! Installing MCP servers from an MCP Registry: the client of its read API (the official
//! registry's OpenAPI, `docs/reference/api/openapi.yaml` of modelcontextprotocol/registry,
//! version 2025-12-01: `GET /v0.1/servers?search=&limit=&cursor=&version=latest` and
//! `GET /v0.1/servers/{serverName}/versions/{version}`), the `server.json` fields Coffer reads
//! (`packages` with `registryType`, `identifier`, `version`, `runtimeHint`, `transport`,
//! `runtimeArguments`, `packageArguments`, `environmentVariables`; `remotes` with `type`, `url`,
//! `headers`, `variables`; every input's `isRequired`, `isSecret`, `default`, `value`,
//! `choices`), and turning one entry into a registration ([`plan`]).
//!
//! A registry is a remote service Coffer does not control, so everything it says is checked
//! before use: an answer is at most [`MAX_ANSWER`] bytes, arrives within [`TIMEOUT`], and must
//! have the documented types (a mistake is named with its path, `servers[0].server.packages[1]
//! .identifier: invalid type…`); package names, versions, images, variable and header names
//! must be the characters their ecosystems allow (no shell metacharacters, nothing that starts
//! with `-` and would be read as a flag). Nothing is ever run through a shell: the command and
//! its arguments become a stdio registration like any other, confined by the vault sandbox.
//!
//! Secrets (`isSecret` inputs) become credentials named `<server>.<input>`, referenced from the
//! server's `env` or `headers`; they never reach the registry table, a log or an error message.
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use coffer_api::registry::{InstallOption, RegistryInput, RegistryServer};
use coffer_proto::store::{McpServer, Transport};
use reqwest::Url;
use secrecy::SecretString;
use serde::Deserialize;

/// Largest registry answer read (bytes).
pub const MAX_ANSWER: usize = 4 * 1024 * 1024;
/// Longest wait for a registry answer, connection included.
pub const TIMEOUT: Duration = Duration::from_secs(20);
/// Most entries one search asks for.
pub const MAX_LIMIT: u32 = 100;
/// Most packages, remotes, inputs of one kind that an entry may list.
const MAX_ITEMS: usize = 256;

/// Why reading the registry or planning an install failed. Messages name the registry URL
/// (without user info or query) and never quote a value the user supplied.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// The registry could not be reached, timed out, or answered 5xx.
    #[error("{0}")]
    Unavailable(String),
    /// The registry answered something that is not what its API documents.
    #[error("{0}")]
    Malformed(String),
    /// No such server or version.
    #[error("{0}")]
    NotFound(String),
    /// The request cannot be installed as asked (a missing input, no runnable option, …).
    #[error("{0}")]
    Invalid(String),
}

// ---------------------------------------------------------------------------------------------
// The wire format (the parts Coffer reads; unknown fields are ignored, known ones must have
// their documented type).

#[derive(Debug, Deserialize)]
struct ServerList {
    servers: Vec<ServerResponse>,
    #[serde(default)]
    metadata: Option<ListMetadata>,
}

#[derive(Debug, Deserialize)]
struct ListMetadata {
    #[serde(default, rename = "nextCursor")]
    next_cursor: Option<String>,
}

/// One entry: the publisher's `server.json` and the registry's `_meta`.
#[derive(Debug, Deserialize)]
pub struct ServerResponse {
    server: ServerDetail,
    #[serde(default, rename = "_meta")]
    meta: Option<serde_json::Map<String, serde_json::Value>>,
}

#[derive(Debug, Deserialize)]
struct ServerDetail {
    name: String,
    #[serde(default)]
    description: String,
    #[serde(default)]
    title: Option<String>,
    version: String,
    #[serde(default, rename = "websiteUrl")]
    website_url: Option<String>,
    #[serde(default)]
    repository: Option<Repository>,
    #[serde(default)]
    packages: Vec<Package>,
    #[serde(default)]
    remotes: Vec<Remote>,
}

#[derive(Debug, Deserialize)]
struct Repository {
    #[serde(default)]
    url: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Package {
    #[serde(rename = "registryType")]
    registry_type: String,
    identifier: String,
    #[serde(default)]
    version: Option<String>,
    #[serde(default, rename = "runtimeHint")]
    runtime_hint: Option<String>,
    transport: WireTransport,
    #[serde(default, rename = "runtimeArguments")]
    runtime_arguments: Vec<Argument>,
    #[serde(default, rename = "packageArguments")]
    package_arguments: Vec<Argument>,
    #[serde(default, rename = "environmentVariables")]
    environment_variables: Vec<KeyValueInput>,
}

#[derive(Debug, Deserialize)]
struct WireTransport {
    #[serde(rename = "type")]
    kind: String,
}

#[derive(Debug, Deserialize)]
struct Remote {
    #[serde(rename = "type")]
    kind: String,
    url: String,
    #[serde(default)]
    headers: Vec<KeyValueInput>,
    #[serde(default)]
    variables: BTreeMap<String, Input>,
}

#[derive(Debug, Default, Clone, Deserialize)]
struct Input {
    #[serde(default)]
    description: Option<String>,
    #[serde(default, rename = "isRequired")]
    is_required: bool,
    #[serde(default)]
    value: Option<String>,
    #[serde(default, rename = "isSecret")]
    is_secret: bool,
    #[serde(default)]
    default: Option<String>,
    #[serde(default)]
    choices: Vec<String>,
    /// What `{name}` in `value` stands for (the registry's `InputWithVariables`).
    #[serde(default)]
    variables: BTreeMap<String, Input>,
}

impl Input {
    /// It or a variable of its value is a secret.
    fn any_secret(&self) -> bool {
        self.is_secret || self.variables.values().any(|v| v.is_secret)
    }
}

#[derive(Debug, Deserialize)]
struct KeyValueInput {
    name: String,
    #[serde(flatten)]
    input: Input,
}

#[derive(Debug, Deserialize)]
struct Argument {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    name: Option<String>,
    #[serde(default, rename = "valueHint")]
    value_hint: Option<String>,
    #[serde(flatten)]
    input: Input,
}

// ---------------------------------------------------------------------------------------------
// The client.

/// A client of one registry (its base URL, e.g. `https://registry.modelcontextprotocol.io`).
pub struct RegistryClient {
    base: Url,
    /// `base` without user info, query or fragment: the only form shown.
    shown: String,
    http: reqwest::Client,
}

/// One page of a search.
pub struct SearchPage {
    pub items: Vec<ServerResponse>,
    pub next_cursor: Option<String>,
}

impl RegistryClient {
    /// A client for the registry at `base` (an `http://` or `https://` URL).
    ///
    /// # Errors
    /// [`RegistryError::Invalid`] for a URL that is not one.
    pub fn new(base: &str) -> Result<Self, RegistryError> {
        let mut base = Url::parse(base.trim())
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https") && u.host_str().is_some_and(|h| !h.is_empty()))
            .ok_or_else(|| {
                RegistryError::Invalid("the registry URL (setting mcp.registry_url) is not an http(s) URL".into())
            })?;
        if !base.path().ends_with('/') {
            let path = format!("{}/", base.path());
            base.set_path(&path);
        }
        let mut shown = base.clone();
        let _ = shown.set_username("");
        let _ = shown.set_password(None);
        shown.set_query(None);
        shown.set_fragment(None);
        coffer_runtime::tls::ensure_provider();
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(TIMEOUT)
            .redirect(reqwest::redirect::Policy::limited(3))
            .build()
            .map_err(|e| RegistryError::Unavailable(format!("HTTP client: {e}")))?;
        Ok(Self { base, shown: shown.to_string().trim_end_matches('/').to_owned(), http })
    }

    /// `GET /v0.1/servers?search=QUERY&version=latest&limit=N[&cursor=C]`: the latest version of
    /// each server whose name contains `query`.
    ///
    /// # Errors
    /// [`RegistryError::Unavailable`], [`RegistryError::Malformed`].
    pub async fn search(&self, query: &str, limit: u32, cursor: Option<&str>) -> Result<SearchPage, RegistryError> {
        let mut url = self.url(&["v0.1", "servers"]);
        {
            let mut q = url.query_pairs_mut();
            if !query.is_empty() {
                q.append_pair("search", query);
            }
            q.append_pair("version", "latest");
            q.append_pair("limit", &limit.clamp(1, MAX_LIMIT).to_string());
            if let Some(c) = cursor {
                q.append_pair("cursor", c);
            }
        }
        let list: ServerList = self.get(url, "a server list").await.map_err(|e| match e {
            // The list is the registry's root resource: a 404 there, or an answer that is not
            // JSON at all (a web page), is no registry.
            RegistryError::NotFound(_) => self.not_a_registry("its server list (GET /v0.1/servers) answered 404"),
            other => other,
        })?;
        if list.servers.len() > MAX_LIMIT as usize * 2 {
            return Err(RegistryError::Malformed(format!(
                "the registry at {} answered {} servers to a search for at most {MAX_LIMIT}",
                self.shown,
                list.servers.len()
            )));
        }
        for s in &list.servers {
            self.check(&s.server)?;
        }
        let next_cursor = list.metadata.and_then(|m| m.next_cursor).filter(|c| !c.is_empty() && c.len() <= 1024);
        Ok(SearchPage { items: list.servers, next_cursor })
    }

    /// `GET /v0.1/servers/{name}/versions/{version or latest}`.
    ///
    /// # Errors
    /// [`RegistryError::NotFound`] (404), [`RegistryError::Unavailable`],
    /// [`RegistryError::Malformed`].
    pub async fn server(&self, name: &str, version: Option<&str>) -> Result<ServerResponse, RegistryError> {
        let url = self.url(&["v0.1", "servers", name, "versions", version.unwrap_or("latest")]);
        let found: ServerResponse = match self.get(url, "a server").await {
            Ok(found) => found,
            Err(RegistryError::NotFound(_)) => {
                // Any web server answers 404 here: "no server NAME" only from a registry, which
                // answers its server list.
                self.search("", 1, None).await?;
                return Err(RegistryError::NotFound(match version {
                    Some(v) => format!("the registry at {} has no server {name:?} at version {v:?}", self.shown),
                    None => format!("the registry at {} has no server {name:?}", self.shown),
                }));
            }
            Err(other) => return Err(other),
        };
        self.check(&found.server)?;
        Ok(found)
    }

    /// The configured URL does not serve the registry API (`why`: what it answered where).
    fn not_a_registry(&self, why: &str) -> RegistryError {
        RegistryError::Unavailable(format!(
            "{} is not an MCP registry: {why}; check the setting gateway.mcp_registry_url",
            self.shown
        ))
    }

    /// The base URL with `segments` appended (each percent-encoded: a server name's `/` stays in
    /// its segment).
    fn url(&self, segments: &[&str]) -> Url {
        let mut url = self.base.clone();
        if let Ok(mut p) = url.path_segments_mut() {
            p.pop_if_empty().extend(segments);
        }
        url
    }

    /// GETs `url` and parses the JSON answer as `T` (`what` names it in errors).
    async fn get<T: serde::de::DeserializeOwned>(&self, url: Url, what: &str) -> Result<T, RegistryError> {
        let shown = &self.shown;
        let path = url.path().to_owned();
        let mut resp =
            self.http.get(url).header(reqwest::header::ACCEPT, "application/json").send().await.map_err(|e| {
                RegistryError::Unavailable(format!("the registry at {shown} could not be reached: {}", describe(e)))
            })?;
        let status = resp.status();
        if status == reqwest::StatusCode::NOT_FOUND {
            return Err(RegistryError::NotFound(format!("the registry at {shown} answered 404")));
        }
        if !status.is_success() {
            return Err(RegistryError::Unavailable(format!("the registry at {shown} answered HTTP {status}")));
        }
        let mut body = Vec::new();
        loop {
            match resp.chunk().await {
                Ok(Some(chunk)) => {
                    if body.len() + chunk.len() > MAX_ANSWER {
                        return Err(RegistryError::Malformed(format!(
                            "the registry at {shown} sent an answer larger than {} MiB",
                            MAX_ANSWER / (1024 * 1024)
                        )));
                    }
                    body.extend_from_slice(&chunk);
                }
                Ok(None) => break,
                Err(e) => {
                    return Err(RegistryError::Unavailable(format!(
                        "the registry at {shown} stopped answering: {}",
                        describe(e)
                    )));
                }
            }
        }
        // Not JSON at all (a web page): whatever serves this URL is no registry.
        if serde_json::from_slice::<serde::de::IgnoredAny>(&body).is_err() {
            let noun = what.trim_start_matches("a ");
            return Err(self.not_a_registry(&format!("its {noun} (GET {path}) answered something that is not JSON")));
        }
        let de = &mut serde_json::Deserializer::from_slice(&body);
        serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            let inner: String = e.into_inner().to_string().chars().take(200).collect();
            let at = if path == "." { String::new() } else { format!("{path}: ") };
            RegistryError::Malformed(format!("the registry at {shown} did not answer {what}: {at}{inner}"))
        })
    }

    /// Refuses an entry whose lists are absurdly long.
    fn check(&self, s: &ServerDetail) -> Result<(), RegistryError> {
        let too_many = s.packages.len() > MAX_ITEMS
            || s.remotes.len() > MAX_ITEMS
            || s.packages.iter().any(|p| {
                p.environment_variables.len() > MAX_ITEMS
                    || p.package_arguments.len() > MAX_ITEMS
                    || p.runtime_arguments.len() > MAX_ITEMS
            })
            || s.remotes.iter().any(|r| r.headers.len() > MAX_ITEMS || r.variables.len() > MAX_ITEMS);
        if too_many {
            return Err(RegistryError::Malformed(format!(
                "the registry at {} lists more than {MAX_ITEMS} packages, remotes or inputs for {:?}",
                self.shown,
                cut(&s.name, 80)
            )));
        }
        Ok(())
    }
}

/// A reqwest error without its URL, with its root cause.
fn describe(err: reqwest::Error) -> String {
    let timeout = err.is_timeout();
    let err = err.without_url();
    let mut out = err.to_string();
    let mut source = std::error::Error::source(&err);
    while let Some(s) = source {
        let s_text = s.to_string();
        if !out.contains(&s_text) {
            out = format!("{out}: {s_text}");
        }
        source = s.source();
    }
    if timeout {
        out = format!("no answer within {} s", TIMEOUT.as_secs());
    }
    out
}

/// At most `n` characters of `s`, control characters dropped.
fn cut(s: &str, n: usize) -> String {
    s.chars().filter(|c| !c.is_control()).take(n).collect()
}

// ---------------------------------------------------------------------------------------------
// What an entry offers.

/// The REST view of an entry: every option, whether it runs here, what it asks for.
/// `lookup` finds a program on the PATH.
pub fn describe_entry(entry: &ServerResponse, lookup: &dyn Fn(&str) -> Option<PathBuf>) -> RegistryServer {
    let s = &entry.server;
    let options: Vec<InstallOption> = s
        .packages
        .iter()
        .enumerate()
        .map(|(i, p)| package_option(i, p, lookup).0)
        .chain(s.remotes.iter().enumerate().map(|(i, r)| remote_option(i, r)))
        .collect();
    let chosen = options
        .iter()
        .find(|o| o.runnable && o.kind == "package")
        .or_else(|| options.iter().find(|o| o.runnable))
        .map(|o| o.id.clone());
    let status = entry
        .meta
        .as_ref()
        .and_then(|m| m.get("io.modelcontextprotocol.registry/official"))
        .and_then(|o| o.get("status"))
        .and_then(|v| v.as_str())
        .map(|v| cut(v, 40));
    RegistryServer {
        name: cut(&s.name, 200),
        title: s.title.as_deref().map(|t| cut(t, 100)),
        description: cut(&s.description, 500),
        version: cut(&s.version, 255),
        website_url: s.website_url.as_deref().map(|u| cut(u, 500)),
        repository_url: s.repository.as_ref().and_then(|r| r.url.as_deref()).map(|u| cut(u, 500)),
        status,
        suggested_name: suggested_name(&s.name),
        options,
        chosen,
    }
}

/// The Coffer name for registry name `name`: its part after the last `/`, lowercased, every
/// other character than a-z, 0-9 and `-` made a `-`, a leading `mcp-server-`/`server-` and a
/// trailing `-mcp`/`-server` dropped, cut to 24 characters; `server` when nothing is left.
pub fn suggested_name(name: &str) -> String {
    let last = name.rsplit('/').next().unwrap_or(name).to_ascii_lowercase();
    let mut s: String =
        last.chars().map(|c| if c.is_ascii_lowercase() || c.is_ascii_digit() { c } else { '-' }).collect();
    for prefix in ["mcp-server-", "server-"] {
        if s.len() > prefix.len() && s.starts_with(prefix) {
            s = s[prefix.len()..].to_owned();
        }
    }
    for suffix in ["-mcp-server", "-mcp", "-server"] {
        if s.len() > suffix.len() && s.ends_with(suffix) {
            s.truncate(s.len() - suffix.len());
        }
    }
    let s: String = s.split('-').filter(|p| !p.is_empty()).collect::<Vec<_>>().join("-");
    let mut s: String = s.chars().take(24).collect();
    while s.ends_with('-') {
        s.pop();
    }
    if s.is_empty() || s == "coffer" { "server".into() } else { s }
}

/// How a package type is run here: the programs that may run it, in order of preference.
fn runtimes_for(registry_type: &str) -> Option<&'static [&'static str]> {
    match registry_type {
        "npm" => Some(&["npx"]),
        "pypi" => Some(&["uvx"]),
        "oci" => Some(&["docker", "podman"]),
        _ => None,
    }
}

/// An option for package `i`, and the runtime program found for it.
fn package_option(
    i: usize,
    p: &Package,
    lookup: &dyn Fn(&str) -> Option<PathBuf>,
) -> (InstallOption, Option<&'static str>) {
    let mut inputs = Vec::new();
    for e in &p.environment_variables {
        inputs_of(&mut inputs, &e.name, "env", &e.input);
    }
    for a in p.runtime_arguments.iter().chain(&p.package_arguments) {
        inputs_of(&mut inputs, &argument_key(a), "argument", &a.input);
    }
    let transport = match p.transport.kind.as_str() {
        "stdio" => "stdio",
        "streamable-http" => "http",
        "sse" => "sse",
        _ => "unknown",
    };
    let mut runtime = None;
    let reason = match runtimes_for(&p.registry_type) {
        None => Some(format!("package type {:?} is not supported (npm, pypi and oci are)", cut(&p.registry_type, 20))),
        Some(_) if transport != "stdio" => Some(format!(
            "the package runs as a local {} server; Coffer installs packages that speak stdio",
            cut(&p.transport.kind, 20)
        )),
        Some(programs) => match check_package(p) {
            Err(why) => Some(why),
            Ok(()) => {
                // The publisher's hint first, when it is a runtime Coffer knows for the type.
                let hinted = programs.iter().copied().filter(|prog| p.runtime_hint.as_deref() == Some(*prog));
                runtime = hinted.chain(programs.iter().copied()).find(|prog| lookup(prog).is_some());
                match runtime {
                    Some(_) => None,
                    None => Some(format!("{} is not on the PATH", programs.join(" or "))),
                }
            }
        },
    };
    let option = InstallOption {
        id: format!("package:{i}"),
        kind: "package".into(),
        registry_type: Some(cut(&p.registry_type, 20)),
        identifier: Some(cut(&p.identifier, 255)),
        version: p.version.as_deref().map(|v| cut(v, 100)),
        runtime: runtime.map(str::to_owned),
        transport: transport.into(),
        url: None,
        runnable: reason.is_none(),
        reason,
        inputs,
    };
    (option, runtime)
}

fn remote_option(i: usize, r: &Remote) -> InstallOption {
    let mut inputs: Vec<RegistryInput> =
        r.variables.iter().map(|(k, v)| input_of(k, "url_variable", v, false)).collect();
    for h in &r.headers {
        inputs_of(&mut inputs, &h.name, "header", &h.input);
    }
    let transport = match r.kind.as_str() {
        "streamable-http" => "http",
        "sse" => "sse",
        _ => "unknown",
    };
    let reason = if transport == "unknown" {
        Some(format!("remote type {:?} is not supported (streamable-http and sse are)", cut(&r.kind, 20)))
    } else {
        check_remote(r).err()
    };
    InstallOption {
        id: format!("remote:{i}"),
        kind: "remote".into(),
        registry_type: None,
        identifier: None,
        version: None,
        runtime: None,
        transport: transport.into(),
        url: Some(cut(&r.url, 2048)),
        runnable: reason.is_none(),
        reason,
        inputs,
    }
}

/// The inputs of one env variable, header or argument: itself when it has no fixed value, else
/// the variables its value names (a variable of a secret value is secret).
fn inputs_of(out: &mut Vec<RegistryInput>, name: &str, kind: &str, i: &Input) {
    match &i.value {
        None => out.push(input_of(name, kind, i, false)),
        Some(_) => {
            for (var, vi) in &i.variables {
                if !out.iter().any(|o| o.name == *var) {
                    out.push(input_of(var, kind, vi, i.is_secret));
                }
            }
        }
    }
}

fn input_of(name: &str, kind: &str, i: &Input, secret: bool) -> RegistryInput {
    let secret = secret || i.is_secret;
    RegistryInput {
        name: cut(name, 128),
        kind: kind.into(),
        description: i.description.as_deref().map(|d| cut(d, 500)),
        required: i.is_required,
        secret,
        default: if secret { None } else { i.default.as_deref().map(|d| cut(d, 500)) },
        choices: i.choices.iter().take(MAX_ITEMS).map(|c| cut(c, 200)).collect(),
    }
}

/// The input key of an argument: its value hint, else its flag name without leading dashes.
fn argument_key(a: &Argument) -> String {
    a.value_hint
        .clone()
        .filter(|h| !h.is_empty())
        .or_else(|| a.name.as_deref().map(|n| n.trim_start_matches('-').to_owned()))
        .unwrap_or_else(|| "argument".into())
}

// ---------------------------------------------------------------------------------------------
// Checks of what a registry says (hostile input).

/// Whether every character of `s` is ASCII alphanumeric or in `extra`, and the first is
/// alphanumeric (so it cannot be read as a flag).
fn plain(s: &str, extra: &str, max: usize) -> bool {
    !s.is_empty()
        && s.len() <= max
        && s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.chars().all(|c| c.is_ascii_alphanumeric() || extra.contains(c))
}

/// npm package names (`@scope/name`, lowercase), PyPI project names, OCI image references;
/// versions of them.
fn check_package(p: &Package) -> Result<(), String> {
    let id = &p.identifier;
    let ok = match p.registry_type.as_str() {
        "npm" => {
            let (scope, name) = match id.strip_prefix('@') {
                Some(rest) => match rest.split_once('/') {
                    Some((s, n)) => (Some(s), n),
                    None => (None, ""),
                },
                None => (None, id.as_str()),
            };
            id.len() <= 214
                && scope.is_none_or(|s| plain(s, "-._~", 214) && s == s.to_ascii_lowercase())
                && plain(name, "-._~", 214)
                && name == name.to_ascii_lowercase()
        }
        "pypi" => plain(id, "-._", 200),
        "oci" => plain(id, "-._/:@", 255) && id == &id.to_ascii_lowercase(),
        _ => true,
    };
    if !ok {
        return Err(format!(
            "package name {:?} is not a valid {} name (it has characters the {} registry does not allow)",
            cut(id, 80),
            p.registry_type,
            p.registry_type
        ));
    }
    match p.version.as_deref() {
        None if p.registry_type == "oci" => Ok(()),
        None => Err(format!("package {:?} names no version", cut(id, 80))),
        Some(v) if plain(v, "-._+", 100) => Ok(()),
        Some(v) => Err(format!("package version {:?} is not a version", cut(v, 40))),
    }?;
    for e in &p.environment_variables {
        if !env_name_ok(&e.name) {
            return Err(format!("environment variable name {:?} is not valid", cut(&e.name, 40)));
        }
    }
    Ok(())
}

fn check_remote(r: &Remote) -> Result<(), String> {
    for h in &r.headers {
        if h.name.is_empty()
            || h.name.len() > 128
            || reqwest::header::HeaderName::from_bytes(h.name.as_bytes()).is_err()
        {
            return Err(format!("header name {:?} is not valid", cut(&h.name, 40)));
        }
    }
    if !(r.url.starts_with("http://") || r.url.starts_with("https://") || r.url.starts_with('{')) {
        return Err(format!("remote URL {:?} is not an http(s) URL", cut(&r.url, 80)));
    }
    Ok(())
}

/// `^[A-Za-z_][A-Za-z0-9_]*$`, at most 128 bytes.
fn env_name_ok(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

// ---------------------------------------------------------------------------------------------
// Planning an install.

/// A registration ready to store, and the credentials to create first.
pub struct Planned {
    pub server: McpServer,
    pub credentials: Vec<(String, SecretString)>,
    pub option: InstallOption,
}

/// The credential name for input `input` of server `server`: `<server>.<input>` with characters
/// a credential name cannot have made `-`, at most 64 characters.
pub fn credential_name(server: &str, input: &str) -> String {
    let clean: String =
        input.chars().map(|c| if c.is_ascii_alphanumeric() || "_.-".contains(c) { c } else { '-' }).collect();
    format!("{server}.{clean}").chars().take(64).collect()
}

/// Plans installing `entry` as Coffer server `name` with option `option_id` (default the
/// entry's chosen one) and the user's `values` (by input name).
///
/// # Errors
/// [`RegistryError::Invalid`]: the option does not exist or cannot run here, a required input
/// has no value (all of them are named), a value is not one of its choices or is not usable
/// (a NUL, a newline in a header), an input nobody asked for, a secret that would have to go
/// on the command line.
pub fn plan(
    entry: &ServerResponse,
    name: &str,
    option_id: Option<&str>,
    values: &BTreeMap<String, String>,
    lookup: &dyn Fn(&str) -> Option<PathBuf>,
) -> Result<Planned, RegistryError> {
    let view = describe_entry(entry, lookup);
    let id = option_id.map(str::to_owned).or(view.chosen.clone()).ok_or_else(|| {
        let why: Vec<String> =
            view.options.iter().map(|o| format!("{}: {}", o.id, o.reason.clone().unwrap_or_default())).collect();
        RegistryError::Invalid(if why.is_empty() {
            format!("{} offers no package and no remote to install", view.name)
        } else {
            format!("nothing of {} can be installed here ({})", view.name, why.join("; "))
        })
    })?;
    let option = view
        .options
        .iter()
        .find(|o| o.id == id)
        .cloned()
        .ok_or_else(|| RegistryError::Invalid(format!("{} has no option {:?}", view.name, cut(&id, 40))))?;
    if let Some(why) = &option.reason {
        return Err(RegistryError::Invalid(format!("{} of {} cannot be installed: {why}", option.id, view.name)));
    }
    // Every value must answer an input of this option.
    if let Some(extra) = values.keys().find(|k| !option.inputs.iter().any(|i| &i.name == *k)) {
        let known: Vec<&str> = option.inputs.iter().map(|i| i.name.as_str()).collect();
        return Err(RegistryError::Invalid(format!(
            "{} takes no input {:?} (it takes: {})",
            option.id,
            cut(extra, 40),
            if known.is_empty() { "none".into() } else { known.join(", ") }
        )));
    }
    let missing: Vec<String> = option
        .inputs
        .iter()
        .filter(|i| i.required && i.default.is_none() && values.get(&i.name).is_none_or(|v| v.is_empty()))
        .map(|i| i.name.clone())
        .collect();
    if !missing.is_empty() {
        return Err(RegistryError::Invalid(format!("{} needs a value for {}", view.name, missing.join(", "))));
    }
    for i in &option.inputs {
        if let Some(v) = values.get(&i.name) {
            if !i.choices.is_empty() && !i.choices.contains(v) {
                return Err(RegistryError::Invalid(format!(
                    "input {} must be one of: {}",
                    i.name,
                    i.choices.join(", ")
                )));
            }
            if v.contains('\0') || (i.kind == "header" && v.chars().any(|c| c.is_control() && c != '\t')) {
                return Err(RegistryError::Invalid(format!("the value of input {} has a control character", i.name)));
            }
        }
    }
    // A user's value for `key`; else the fixed value with its variables filled in (the user's
    // values, else their defaults); else the default.
    let value_of = |key: &str, i: &Input| -> Option<String> {
        if let Some(v) = values.get(key).filter(|v| !v.is_empty()) {
            return Some(v.clone());
        }
        if let Some(fixed) = &i.value {
            let mut vars = BTreeMap::new();
            for (k, vi) in &i.variables {
                if let Some(v) = values.get(k).filter(|v| !v.is_empty()).cloned().or_else(|| vi.default.clone()) {
                    vars.insert(k.clone(), v);
                }
            }
            return Some(substitute(fixed, &vars));
        }
        i.default.clone()
    };
    let mut credentials = Vec::new();
    let mut secret = |key: &str, value: String| -> String {
        let cred = credential_name(name, key);
        credentials.push((cred.clone(), SecretString::from(value)));
        crate::credentials::encode_ref(&cred)
    };
    let (kind, index) = id.split_once(':').unwrap_or(("", ""));
    let index: usize = index.parse().unwrap_or(usize::MAX);
    let server = if kind == "package" {
        let p = &entry.server.packages[index];
        let (_, runtime) = package_option(index, p, lookup);
        let runtime = runtime.ok_or_else(|| RegistryError::Invalid("no runtime".into()))?;
        let mut env = BTreeMap::new();
        for e in &p.environment_variables {
            if let Some(v) = value_of(&e.name, &e.input) {
                let stored = if e.input.any_secret() { secret(&e.name, v) } else { v };
                env.insert(e.name.clone(), stored);
            }
        }
        let mut args = Vec::new();
        let push_args = |list: &[Argument], args: &mut Vec<String>| -> Result<(), RegistryError> {
            for a in list {
                let key = argument_key(a);
                let Some(v) = value_of(&key, &a.input) else { continue };
                if a.input.any_secret() {
                    return Err(RegistryError::Invalid(format!(
                        "argument {key} is a secret, and arguments are stored in plaintext and visible in `ps`; \
                         register this server by hand with `coffer mcp add` and pass the secret in its environment \
                         if it reads one"
                    )));
                }
                match a.kind.as_str() {
                    "named" => {
                        let flag = a.name.clone().unwrap_or_default();
                        if !flag.starts_with('-') || flag.chars().any(|c| c.is_whitespace() || c.is_control()) {
                            return Err(RegistryError::Invalid(format!(
                                "argument name {:?} is not a flag",
                                cut(&flag, 40)
                            )));
                        }
                        args.push(flag);
                        args.push(v);
                    }
                    _ => args.push(v),
                }
            }
            Ok(())
        };
        let id = &p.identifier;
        let version = p.version.clone().unwrap_or_default();
        match runtime {
            "npx" => {
                push_args(&p.runtime_arguments, &mut args)?;
                args.push("-y".into());
                args.push(format!("{id}@{version}"));
            }
            "uvx" => {
                push_args(&p.runtime_arguments, &mut args)?;
                args.push(format!("{id}=={version}"));
            }
            _ => {
                args.extend(["run", "-i", "--rm"].map(String::from));
                push_args(&p.runtime_arguments, &mut args)?;
                // The container gets the variables by name from the environment Coffer gives
                // the runtime: no value on the command line.
                for k in env.keys() {
                    args.push("-e".into());
                    args.push(k.clone());
                }
                args.push(if version.is_empty() || id.contains(['@', ':']) {
                    id.clone()
                } else {
                    format!("{id}:{version}")
                });
            }
        }
        push_args(&p.package_arguments, &mut args)?;
        McpServer {
            name: name.to_owned(),
            transport: Transport::Stdio.into(),
            command: runtime.to_owned(),
            args,
            env: env.into_iter().collect(),
            enabled: true,
            ..Default::default()
        }
    } else {
        let r = &entry.server.remotes[index];
        let mut url_values = values.clone();
        for (k, v) in &r.variables {
            if let Some(val) = value_of(k, v) {
                url_values.insert(k.clone(), val);
            }
        }
        let url = substitute(&r.url, &url_values);
        if url.contains(['{', '}'])
            || Url::parse(&url).is_err()
            || !(url.starts_with("http://") || url.starts_with("https://"))
        {
            return Err(RegistryError::Invalid(format!("the remote's URL is not complete: {}", cut(&r.url, 200))));
        }
        let mut headers = BTreeMap::new();
        for h in &r.headers {
            if let Some(v) = value_of(&h.name, &h.input) {
                let stored = if h.input.any_secret() { secret(&h.name, v) } else { v };
                headers.insert(h.name.clone(), stored);
            }
        }
        McpServer {
            name: name.to_owned(),
            transport: if option.transport == "sse" { Transport::Sse } else { Transport::Http }.into(),
            url,
            headers: headers.into_iter().collect(),
            enabled: true,
            ..Default::default()
        }
    };
    Ok(Planned { server, credentials, option })
}

/// `template` with every `{key}` whose key is in `values` replaced by its value (the registry's
/// variable syntax); other braces stay.
fn substitute(template: &str, values: &BTreeMap<String, String>) -> String {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(start) = rest.find('{') {
        out.push_str(&rest[..start]);
        let after = &rest[start + 1..];
        match after.find('}') {
            Some(end) if values.contains_key(&after[..end]) => {
                out.push_str(&values[&after[..end]]);
                rest = &after[end + 1..];
            }
            _ => {
                out.push('{');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
#[path = "registry_tests.rs"]
mod tests;
