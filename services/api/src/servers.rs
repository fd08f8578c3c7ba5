//! Bodies of `/v1/mcp/servers…` and `/v1/mcp/import`: the MCP server registry, a server's live
//! capabilities, its probe report and catalog state, its stderr log tail, an import of another
//! client's config, and each upstream's health as `GET /v1/status` lists it.
use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

/// How Coffer reaches a server: a child process on stdio, MCP Streamable HTTP (a legacy
/// HTTP+SSE server behind the URL is detected), or the legacy HTTP+SSE transport (MCP
/// 2024-11-05) chosen outright.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Transport {
    Stdio,
    Http,
    Sse,
}

impl Transport {
    /// Its word on the wire.
    pub fn word(self) -> &'static str {
        match self {
            Transport::Stdio => "stdio",
            Transport::Http => "http",
            Transport::Sse => "sse",
        }
    }

    /// A server reached by URL (`http` or `sse`), not a child process.
    pub fn is_remote(self) -> bool {
        matches!(self, Transport::Http | Transport::Sse)
    }
}

/// `{"credential_ref": "<name>"}`: a reference to a credential, resolved only when the upstream
/// starts (into that child's environment or HTTP headers).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CredentialRef {
    /// A credential name (`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`).
    pub credential_ref: String,
}

/// An `env` or `headers` value: a literal string, or a reference to a credential resolved only
/// when the upstream starts.
///
/// Deserialized by hand rather than as serde's untagged enum, whose only error is "data did not
/// match any variant": anything else is refused as "must be a string or
/// {\"credential_ref\": NAME}", and an object with other keys names the first unknown one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum EnvValue {
    Literal(String),
    Ref(CredentialRef),
}

impl<'de> Deserialize<'de> for EnvValue {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        const SHAPE: &str = "a string or {\"credential_ref\": NAME}";
        match serde_json::Value::deserialize(d)? {
            serde_json::Value::String(s) => Ok(EnvValue::Literal(s)),
            serde_json::Value::Object(o) => {
                if let Some(k) = o.keys().find(|k| *k != "credential_ref") {
                    let k: String = k.chars().take(40).collect();
                    return Err(D::Error::custom(format!("unknown field `{k}`, expected `credential_ref`")));
                }
                match o.get("credential_ref") {
                    Some(serde_json::Value::String(name)) => {
                        Ok(EnvValue::Ref(CredentialRef { credential_ref: name.clone() }))
                    }
                    Some(_) => Err(D::Error::custom(format!("credential_ref must be a string ({SHAPE})"))),
                    None => Err(D::Error::custom(format!("must be {SHAPE}, not an empty object"))),
                }
            }
            other => {
                let got = match other {
                    serde_json::Value::Null => "null",
                    serde_json::Value::Bool(_) => "a boolean",
                    serde_json::Value::Number(_) => "a number",
                    _ => "an array",
                };
                Err(D::Error::custom(format!("must be {SHAPE}, not {got}")))
            }
        }
    }
}

/// A registered MCP server (`GET /v1/mcp/servers/{name}`, an item of `GET /v1/mcp/servers`,
/// the answer of `POST` and `PATCH`). Fields that do not apply or hold the default are null,
/// never absent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct McpServer {
    /// `^[a-z0-9][a-z0-9-]{0,23}$`.
    pub name: String,
    pub transport: Transport,
    /// stdio: the command as registered (an absolute path, or a bare name resolved on the
    /// daemon's `PATH` when it starts); null for http.
    pub command: Option<String>,
    pub args: Vec<String>,
    /// Sorted by name; a credential reference is `{"credential_ref": name}`, never its value.
    pub env: BTreeMap<String, EnvValue>,
    /// null: the default working directory.
    pub cwd: Option<String>,
    /// http: the MCP endpoint; null for stdio.
    pub url: Option<String>,
    /// Sorted by name; values as `env`'s.
    pub headers: BTreeMap<String, EnvValue>,
    pub enabled: bool,
    /// Per-call timeout (ms); null: the default.
    pub timeout_ms: Option<u64>,
    /// stdio: runs in the vault sandbox (Landlock: cannot read COFFER_HOME), true unless the
    /// registration opted out, also where the kernel has no Landlock (`GET /v1/status`'s
    /// `sandbox` says whether it is enforced); null for http.
    pub sandbox: Option<bool>,
    /// Bumped by every write; the ETag.
    pub version: i64,
    #[schemars(extend("format" = "date-time"))]
    pub created_at: String,
    #[schemars(extend("format" = "date-time"))]
    pub updated_at: String,
}

/// `POST /v1/mcp/servers`: register a server.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct McpServerCreate {
    /// `^[a-z0-9][a-z0-9-]{0,23}$`.
    pub name: String,
    /// `stdio` or `http`. Default: stdio with a command, http with only a url.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ["stdio", "http"]))]
    pub transport: Option<String>,
    /// stdio: an absolute path, or a bare name found on the daemon's `PATH` (stored bare).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// At most 1,024, none with a NUL character.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// At most 1,024 entries; names without `=` or NUL, values without NUL.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, EnvValue>,
    /// stdio: the working directory (absolute); absent or null: the default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// http: the MCP endpoint (`http://` or `https://`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// http: at most 256; names are HTTP tokens, values have no control character but tab.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, EnvValue>,
    /// Default true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Per-call timeout, 0.001-86400 s; or `timeout_ms`, not both.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_s: Option<f64>,
    /// Per-call timeout, 1-86400000 ms; or `timeout_s`, not both.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Keep secret-looking `args` (`--api-key ghp_…`, `--token=…`, a token, a URL with a
    /// password) as given. Without it they are refused with INVALID_ARGUMENT, details `{field:
    /// "args", index, flag, reason: "secret_in_args"}`: arguments are stored in plaintext,
    /// synced and visible in `ps`; pass secrets in `env` as credential references instead.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_secret_args: bool,
    /// stdio: false runs the server without the vault sandbox (it can then read COFFER_HOME).
    /// Default true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<bool>,
}

/// Deserializes a present field (even `null`) as `Some(..)`, so that `Option<Option<T>>` tells
/// "absent" (`None`) from "null" (`Some(None)`).
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

/// `PATCH /v1/mcp/servers/{name}`: every field optional; absent = unchanged. `cwd`,
/// `timeout_s` and `timeout_ms` set to null restore the default; `args`, `env` and `headers`
/// replace the whole list or map.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct McpServerPatch {
    /// Accepted only when equal to the current name (a rename is remove + add).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Accepted only when equal to the current transport.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ["stdio", "http"]))]
    pub transport: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// stdio only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// stdio only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Vec<String>>,
    /// stdio only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<BTreeMap<String, EnvValue>>,
    /// stdio only; null: the default working directory.
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub cwd: Option<Option<String>>,
    /// http only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// http only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers: Option<BTreeMap<String, EnvValue>>,
    /// Per-call timeout, 0.001-86400 s; null: the default.
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub timeout_s: Option<Option<f64>>,
    /// Per-call timeout, 1-86400000 ms; null: the default.
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<Option<u64>>,
    /// Keep secret-looking `args` as given (see `McpServerCreate`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_secret_args: bool,
    /// stdio: false runs the server without the vault sandbox, true in it again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<bool>,
}

/// A tool or prompt of a server, as `GET /v1/mcp/servers/{name}/capabilities` lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Capability {
    /// The upstream's (original) name.
    pub name: String,
    /// The name clients see (`<server>__<name>`).
    pub exposed_name: String,
    pub description: Option<String>,
    pub enabled: bool,
}

/// `GET /v1/mcp/servers/{name}/capabilities`: a server's live tools and prompts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Capabilities {
    pub server: String,
    pub tools: Vec<Capability>,
    pub prompts: Vec<Capability>,
    /// Always empty (resources are not listed here).
    pub resources: Vec<Map<String, Value>>,
}

/// How many items a probe listed, per kind; a kind is absent when the probe failed before it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ProbeCounts {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompts: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<u64>,
}

/// `POST /v1/mcp/servers/{name}/test`: a server started once in a fresh session, without any
/// cache. A server that fails is still this answer, with `ok: false` and the error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ProbeReport {
    pub server: String,
    /// Milliseconds to start it and list its tools; absent when that failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialize_ms: Option<u64>,
    /// Its `initialize` result's `protocolVersion`; absent when it did not start.
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub protocol_version: Option<Option<String>>,
    /// Its `initialize` result's `serverInfo` (`{name, version, …}`); absent when it did not
    /// start.
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    #[schemars(extend("type" = ["object", "null"]))]
    pub server_info: Option<Option<Value>>,
    /// Its `initialize` result's `capabilities`; absent when it did not start.
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    #[schemars(extend("type" = ["object", "null"]))]
    pub capabilities: Option<Option<Value>>,
    pub transport: Transport,
    /// Problems that did not stop it, e.g. lines on stdout that are not JSON-RPC.
    pub warnings: Vec<String>,
    /// Its stderr log (`coffer mcp logs`), when one exists; HTTP upstreams have none.
    pub log: Option<String>,
    /// Milliseconds the whole probe took.
    pub elapsed_ms: u64,
    pub counts: ProbeCounts,
    pub ok: bool,
    /// Why it failed; null when `ok`.
    pub error: Option<String>,
}

/// The catalog's state of a server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CatalogPhase {
    /// Its lists are current.
    Ready,
    /// A background start is listing it.
    Listing,
    /// Its last start or list failed (`error`).
    Failed,
    /// Not listed yet, or disabled.
    Unknown,
}

/// The capability catalog's state of one server: `GET /v1/status`'s `upstreams[].catalog`, and
/// the head of `GET /v1/mcp/servers/{name}/catalog`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CatalogStatus {
    pub state: CatalogPhase,
    /// Why the last start or list failed (state failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Milliseconds until a failed server is retried in the background (state failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_in_ms: Option<u64>,
    /// A retry is listing it now (state failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retrying: Option<bool>,
    /// A background start of the server is running: listing, or up a few seconds after listing
    /// to follow its list changes. Absent when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub background: bool,
}

impl CatalogStatus {
    /// A state with nothing more to say.
    pub fn of(state: CatalogPhase) -> Self {
        Self { state, error: None, retry_in_ms: None, retrying: None, background: false }
    }
}

/// `GET /v1/mcp/servers/{name}/catalog`: what the capability catalog holds of a server (the
/// lists new sessions are answered from). Counts are of the list of a client without
/// capabilities; null while that kind is not listed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CatalogState {
    #[serde(flatten)]
    pub status: CatalogStatus,
    pub server: String,
    pub tools: Option<u64>,
    pub prompts: Option<u64>,
    pub resources: Option<u64>,
    pub resource_templates: Option<u64>,
    /// The lists come from the cache file and have not been refreshed yet. Absent when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub restored: bool,
}

/// An upstream's health, as `GET /v1/status` says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum UpstreamState {
    /// Its last start succeeded and nothing failed since.
    Ok,
    /// Not started since the daemon started or its registration changed.
    Idle,
    /// An error stands (or its command cannot run now).
    Unhealthy,
    /// Its registration is disabled.
    Disabled,
}

/// How an upstream's last start ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum StartOutcome {
    Ok,
    Failed,
}

/// Whether a process runs in the vault sandbox (Landlock).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SandboxState {
    /// Confined: it cannot read COFFER_HOME.
    On,
    /// Its registration (or setting) opted out.
    Off,
    /// Asked for, but this kernel has no Landlock: it runs unconfined.
    Unavailable,
}

/// One registered upstream in `GET /v1/status`'s `upstreams` (name order).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct UpstreamStatus {
    pub name: String,
    pub enabled: bool,
    pub transport: Transport,
    pub state: UpstreamState,
    /// Sessions in which it runs now.
    pub running: u64,
    pub last_start: Option<StartOutcome>,
    #[schemars(extend("format" = "date-time"))]
    pub last_start_at: Option<String>,
    /// The standing error, with its cause (exit status and last stderr lines of a stdio
    /// server); null once a start, list or call succeeded.
    pub last_error: Option<String>,
    /// null also when the error is that its command cannot run now.
    #[schemars(extend("format" = "date-time"))]
    pub last_error_at: Option<String>,
    /// `tools/<name>` listed more than once by its last list; only the first is offered.
    pub duplicates: Vec<String>,
    /// stdio: its vault sandbox; null for http (nothing is spawned).
    pub sandbox: Option<SandboxState>,
    pub catalog: CatalogStatus,
    /// http: its OAuth sign-in, when a grant is stored or a sign-in ran (null otherwise, and
    /// for stdio).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<ServerAuth>,
}

/// Where an HTTP server's OAuth sign-in stands (MCP 2025-11-25 basic/authorization).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AuthState {
    /// No grant is stored (the server may need none).
    None,
    /// An access token is stored (and refreshed when it expires, if `refreshable`).
    SignedIn,
    /// Only a new sign-in helps (never signed in, or a refresh was refused): run `command`.
    NeedsSignIn,
}

/// A sign-in in progress or ended (since the daemon started).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SignInState {
    /// Waiting for the browser's redirect to `redirect_uri`.
    Pending,
    /// The grant is stored.
    SignedIn,
    /// Ended without a grant; `error` says why.
    Failed,
}

/// A browser sign-in, as `POST`/`GET /v1/mcp/servers/{name}/auth` show it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SignInFlow {
    pub state: SignInState,
    /// pending: the URL to open in a browser (authorization code request with PKCE S256,
    /// `state` and RFC 8707 `resource`). Holds no secret of Coffer's.
    pub authorization_url: Option<String>,
    /// pending: Coffer's one-shot loopback redirect listener for this sign-in.
    pub redirect_uri: Option<String>,
    /// pending: when the listener gives up.
    #[schemars(extend("format" = "date-time"))]
    pub expires_at: Option<String>,
    /// failed: why.
    pub error: Option<String>,
}

/// `GET /v1/mcp/servers/{name}/auth` and `UpstreamStatus.auth`: an HTTP server's OAuth state.
/// Never a token.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ServerAuth {
    pub state: AuthState,
    /// needs_sign_in: why.
    pub why: Option<String>,
    /// needs_sign_in: the command that signs in (`coffer mcp auth NAME`).
    pub command: Option<String>,
    /// signed_in: the authorization server (its issuer identifier).
    pub issuer: Option<String>,
    /// signed_in: the scopes granted (space-separated), when known.
    pub scope: Option<String>,
    /// signed_in: when the access token expires, when the server said.
    #[schemars(extend("format" = "date-time"))]
    pub expires_at: Option<String>,
    /// signed_in: a refresh token is stored.
    pub refreshable: bool,
    /// The latest sign-in since the daemon started, if any.
    pub flow: Option<SignInFlow>,
}

/// `POST /v1/mcp/servers/{name}/auth`: start a browser sign-in. Every field is optional.
// No `Debug`: it may carry a client secret.
#[derive(Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SignInRequest {
    /// A client id registered with the authorization server by hand (skips registration).
    #[serde(default)]
    pub client_id: Option<String>,
    /// Its secret, for a confidential client (sent as `client_secret_post`); stored sealed.
    #[serde(default)]
    pub client_secret: Option<String>,
    /// An `https://` URL of a Client ID Metadata Document for Coffer, used as the client id
    /// when the authorization server supports such documents.
    #[serde(default)]
    pub client_metadata_url: Option<String>,
    /// Scopes to ask for (space-separated) instead of those the server names.
    #[serde(default)]
    pub scope: Option<String>,
    /// How long the redirect listener waits, 1-1800 seconds (default 300).
    #[serde(default)]
    pub timeout_s: Option<u64>,
}

/// `POST /v1/mcp/import`: import the MCP servers of another client's config.
// No `Debug`: the config and the variables may hold secrets.
#[derive(Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct McpImport {
    /// The config file's JSON (or its MCP servers part): Claude Desktop, Claude Code, Cursor or
    /// VS Code format.
    #[schemars(extend("type" = "object"))]
    pub config: Value,
    /// A label for the report and the audit row, e.g. the file's path (trimmed, at most 300
    /// characters kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// Write nothing; the report says what would be imported.
    #[serde(default)]
    pub dry_run: bool,
    /// Import entries whose `args` look like secrets as they are (with a warning); without it
    /// such an entry is `invalid`, its reason naming the argument.
    #[serde(default)]
    pub allow_secret_args: bool,
    /// Environment variables for the config's `${VAR}` references (what `coffer mcp import
    /// --from-env` reads from its shell); names `[A-Za-z_][A-Za-z0-9_]*`, at most 500.
    /// Write-only: never echoed, logged or audited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("maxProperties" = 500, "writeOnly" = true))]
    pub variables: Option<BTreeMap<String, String>>,
}

/// A server an import registered (or would, with `dry_run`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ImportedServer {
    /// Its Coffer name.
    pub name: String,
    /// Its name in the config.
    pub original_name: String,
    /// Where in the config it was found (`mcpServers`, `projects["/p"].mcpServers`, …).
    pub origin: String,
    pub transport: Transport,
    /// Credentials made of its secret-looking `env`/`headers` values, by name.
    pub credentials_created: Vec<String>,
    /// Things to know (a secret-looking argument kept, a renamed entry, …).
    pub warnings: Vec<String>,
}

/// An entry an import did not register, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SkippedServer {
    /// The Coffer name it maps to.
    pub name: String,
    pub original_name: String,
    pub origin: String,
    pub reason: String,
}

/// The answer of `POST /v1/mcp/import` (200 even when some or all entries are not imported).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ImportReport {
    /// `mcpServers`, `claude.json` or `vscode`.
    pub format: String,
    /// The request's `source`; null when it gave none.
    pub source: Option<String>,
    pub dry_run: bool,
    pub imported: Vec<ImportedServer>,
    /// Entries already registered (left as they are).
    pub duplicates: Vec<SkippedServer>,
    /// Entries that cannot be imported, each with its reason.
    pub invalid: Vec<SkippedServer>,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_patch_tells_null_from_absent_and_writes_it_back() {
        let p: McpServerPatch = crate::body::from_value(json!({"cwd": null, "timeout_ms": 5})).unwrap();
        assert_eq!(p.cwd, Some(None));
        assert_eq!(p.timeout_ms, Some(Some(5)));
        assert_eq!(p.timeout_s, None);
        assert_eq!(serde_json::to_value(&p).unwrap(), json!({"cwd": null, "timeout_ms": 5}));
    }

    #[test]
    fn env_values_are_literals_or_references() {
        let v: BTreeMap<String, EnvValue> =
            serde_json::from_value(json!({"A": "x", "B": {"credential_ref": "gh"}})).unwrap();
        assert_eq!(v["A"], EnvValue::Literal("x".into()));
        assert_eq!(v["B"], EnvValue::Ref(CredentialRef { credential_ref: "gh".into() }));
        assert!(serde_json::from_value::<EnvValue>(json!({"credential_ref": "gh", "x": 1})).is_err());
        // What a bad value is told, with its path (not "did not match any variant").
        let e = crate::body::from_value::<McpServerCreate>(
            json!({"name": "a", "env": {"A": {"credential_ref": "x", "bogus": 1}}}),
        )
        .unwrap_err();
        assert_eq!(
            (e.kind, e.details["field"].as_str()),
            (crate::body::BodyErrorKind::UnknownField, Some("env.A.bogus"))
        );
        assert_eq!(e.details["allowed"], json!(["credential_ref"]));
        for (v, says) in [
            (json!(5), "must be a string or {\"credential_ref\": NAME}, not a number"),
            (json!({}), "not an empty object"),
            (json!({"credential_ref": 1}), "credential_ref must be a string"),
            (json!(null), "not null"),
        ] {
            let e = crate::body::from_value::<McpServerCreate>(json!({"name": "a", "headers": {"H": v}})).unwrap_err();
            assert!(e.message.contains("\"headers.H\"") && e.message.contains(says), "{v}: {}", e.message);
            assert_eq!(e.details["field"], "headers.H");
        }
    }

    #[test]
    fn unknown_fields_are_refused_with_their_path() {
        let e = crate::body::from_value::<McpServerCreate>(json!({"name": "a", "comand": "x"})).unwrap_err();
        assert_eq!(e.kind, crate::body::BodyErrorKind::UnknownField);
        assert_eq!(e.details["field"], "comand");
        let e = crate::body::from_value::<McpServerPatch>(json!({"enable": true})).unwrap_err();
        assert_eq!(e.details["field"], "enable");
        let e = crate::body::from_value::<McpImport>(json!({"config": {}, "dryrun": true})).err().expect("refused");
        assert_eq!(e.details["field"], "dryrun");
        // Nested values are named by their path too.
        let e = crate::body::from_value::<McpImport>(json!({"config": {}, "variables": {"TOKEN": 1}}))
            .err()
            .expect("refused");
        assert_eq!(e.message, "field \"variables.TOKEN\" must be a string, not an integer");
        let e = crate::body::from_value::<McpServerPatch>(json!({"args": ["a", 2]})).unwrap_err();
        assert_eq!(e.details["field"], "args[1]");
    }

    #[test]
    fn catalog_state_flattens_its_status_in_wire_order() {
        let s = CatalogState {
            status: CatalogStatus { background: true, ..CatalogStatus::of(CatalogPhase::Listing) },
            server: "s".into(),
            tools: Some(2),
            prompts: None,
            resources: None,
            resource_templates: None,
            restored: false,
        };
        assert_eq!(
            serde_json::to_string(&s).unwrap(),
            r#"{"state":"listing","background":true,"server":"s","tools":2,"prompts":null,"resources":null,"resource_templates":null}"#
        );
    }
}
