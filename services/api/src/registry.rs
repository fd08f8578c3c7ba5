//! Bodies of `/v1/mcp/registry/…`: finding servers in an MCP Registry (the official one at
//! `https://registry.modelcontextprotocol.io` unless the `mcp.registry_url` setting names
//! another that serves the same API) and installing one of them. What a registry entry offers
//! (its `server.json`: `packages` for npm, PyPI and OCI with their runtime hints, `remotes` for
//! hosted servers, the environment variables, headers and arguments they take) is described
//! here as [`InstallOption`]s with the [`RegistryInput`]s each one asks for.
use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::servers::McpServer;

/// One registry entry (its latest version unless a version was asked for).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RegistryServer {
    /// The registry's name, reverse-DNS (`io.github.user/weather`).
    pub name: String,
    pub title: Option<String>,
    pub description: String,
    pub version: String,
    pub website_url: Option<String>,
    pub repository_url: Option<String>,
    /// The registry's lifecycle status (`active`, `deprecated`), when it says.
    pub status: Option<String>,
    /// The Coffer server name `install` registers it under unless told otherwise (the last
    /// part of `name`, lowercased, cut to 24 characters).
    pub suggested_name: String,
    /// Every way to run it: its packages, then its remotes, each with whether this machine can.
    pub options: Vec<InstallOption>,
    /// The `id` of the option `install` picks when none is named: the first runnable package,
    /// else the first remote; null when nothing is usable here.
    pub chosen: Option<String>,
}

/// One package or remote of a registry entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct InstallOption {
    /// `package:N` or `remote:N` (N counts from 0 in the entry's own order).
    pub id: String,
    /// `package` (run on this machine) or `remote` (a hosted server).
    pub kind: String,
    /// package: `npm`, `pypi`, `oci`, … as the registry says.
    pub registry_type: Option<String>,
    /// package: the package name (npm, PyPI) or image (OCI).
    pub identifier: Option<String>,
    /// package: its pinned version.
    pub version: Option<String>,
    /// package: the program that runs it here (`npx`, `uvx`, `docker`, `podman`), when found.
    pub runtime: Option<String>,
    /// `stdio`, `http` (Streamable HTTP) or `sse` (legacy HTTP+SSE).
    pub transport: String,
    /// remote: its URL (template variables still in braces).
    pub url: Option<String>,
    /// Whether Coffer can install it on this machine.
    pub runnable: bool,
    /// Why not, when it cannot (no runtime on the PATH, an unsupported package type, …).
    pub reason: Option<String>,
    /// What the user supplies (or may), in the entry's order.
    pub inputs: Vec<RegistryInput>,
}

/// A value an option takes from the user: an environment variable, an HTTP header, an argument
/// or a URL variable.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RegistryInput {
    /// The key `install`'s `inputs` use: the variable or header name, the argument's value hint
    /// or flag name.
    pub name: String,
    /// `env`, `header`, `argument` or `url_variable`.
    pub kind: String,
    pub description: Option<String>,
    pub required: bool,
    /// A secret (token, password): installed as a credential, never stored in the registry.
    pub secret: bool,
    /// Used when no value is given.
    pub default: Option<String>,
    /// When not empty, the value must be one of these.
    pub choices: Vec<String>,
}

/// `POST /v1/mcp/registry/install`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RegistryInstall {
    /// The registry's name of the server.
    pub name: String,
    /// A version of it; default the latest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// The Coffer server name; default the entry's `suggested_name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
    /// The `id` of an option; default the entry's `chosen`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub option: Option<String>,
    /// Values for the option's inputs, by input name. Secret ones become credentials named
    /// `<server>.<input>`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub inputs: BTreeMap<String, String>,
    /// Default true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
}

/// What `POST /v1/mcp/registry/install` registered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RegistryInstalled {
    pub server: McpServer,
    /// The registry entry's name and version it came from.
    pub registry_name: String,
    pub registry_version: String,
    /// The option installed.
    pub option: InstallOption,
    /// Credentials created for its secret inputs.
    pub credentials_created: Vec<String>,
}
