//! The `VaultState` service: the vault state as deterministic text for `coffer sync`
//! (`proto/store_vault.proto`). Export turns the MCP server registry, the capability
//! preferences, settings (but `sync.*`), LLM connections, channel configurations and profiles into one
//! canonical JSON file each (sorted keys; never a secret: credentials stay names); apply makes
//! the state equal to a set of such files in one transaction, with audit and change rows, so the
//! gateway's snapshot follows and MCP sessions get `list_changed`.
//!
//! The export, in detail: one canonical JSON file (sorted keys, final newline) per server
//! (`vault/servers/<name>.json`, env/header credential references as
//! `coffer-credential-ref:<name>`), per server's preferences, per LLM connection, per channel
//! (`profiles/<name>.json`: per written profile, its spec as `spec`), per channel
//! (configuration, not its owner, pairing, cursor or whether it runs: a channel pulled onto a
//! machine arrives disabled and an existing one keeps its own `enabled`, so two machines never poll
//! one bot token at once) and `settings.json` (all but `sync.*`, `chat.claude_code_path`,
//! `chat.codex_path`, `chat.projects_root` and the remote-console settings `ui.allowed_hosts`,
//! `ui.bind`, `ui.remote_api`: those describe the machine, `machine_local`); never a credential value.
//! `ApplyVault` validates every file with the domain's own rules first (a bad one is
//! `INVALID_ARGUMENT` naming `vault/<path>`, nothing written), then in one transaction creates,
//! replaces and removes, keeping each file's `created_at` and `updated_at` (so an applied entry
//! exports to the same bytes and machines do not ping-pong), with audit rows (`sync.apply`,
//! `sync.conflict`) and change rows. An entity changed after the export the merge started from
//! (`since_seq`, from the change stream) is left alone: the next sync carries it. Only
//! coffer-retrieval may call it (`crate::authz`). It needs no table (nor migration) of its own:
//! the state is read from and written to the existing tables.
use std::collections::{BTreeMap, BTreeSet};

use coffer_proto::store::vault_state_server::VaultState;
use coffer_proto::store::*;
use rusqlite::{Connection, OptionalExtension, Transaction, params};
use serde::Deserialize;
use serde_json::{Value, json};
use tonic::{Request, Response, Status};

use super::{audit, trace, truncate};
use crate::db::{Changes, Db, StoreError};

// How a server's env or header value names a credential (the value stays in the vault).
pub use coffer_types::secrets::REF_PREFIX;

/// Settings that describe this machine, not the vault: never exported, never applied. `sync.*`
/// (the worker and this machine's name), and the agent CLIs' paths (where Claude Code or Codex
/// is installed differs between machines; a pulled path would break chat on the other one), and
/// the project picker's root folder (a path on this machine), and what this machine exposes
/// beyond loopback (`ui.allowed_hosts`, `ui.bind`, `ui.remote_api`: its own names and addresses,
/// and opening one machine to its network must never open another).
const LOCAL_SETTINGS_PREFIX: &str = "sync.";
const LOCAL_SETTINGS: [&str; 6] =
    ["chat.claude_code_path", "chat.codex_path", "chat.projects_root", "ui.allowed_hosts", "ui.bind", "ui.remote_api"];

/// Whether setting `key` is this machine's own (see [`LOCAL_SETTINGS`]).
fn machine_local(key: &str) -> bool {
    key.starts_with(LOCAL_SETTINGS_PREFIX) || LOCAL_SETTINGS.contains(&key)
}

/// Most entries one apply takes (a registry of thousands of servers is not a vault).
const MAX_ENTRIES: usize = 10_000;
/// Largest file one entry may be (bytes).
const MAX_ENTRY_BYTES: usize = 1 << 20;

/// `v` with every object's keys sorted, recursively (the workspace's serde_json keeps insertion
/// order, so this is explicit).
fn sorted(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            Value::Object(keys.into_iter().map(|k| (k.clone(), sorted(&m[k]))).collect())
        }
        Value::Array(a) => Value::Array(a.iter().map(sorted).collect()),
        other => other.clone(),
    }
}

/// The canonical text of a vault file: sorted keys, two-space indent, a final newline.
pub fn canonical(v: &Value) -> String {
    let mut s = serde_json::to_string_pretty(&sorted(v)).expect("a JSON value serializes");
    s.push('\n');
    s
}

/// What a vault path holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Server,
    Preferences,
    Settings,
    Llm,
    Channel,
    Profile,
}

/// The kind and entity name of `path`, or why it is not a vault file.
fn kind_of(path: &str) -> Result<(Kind, String), String> {
    if path == "settings.json" {
        return Ok((Kind::Settings, String::new()));
    }
    let (dir, file) = path.split_once('/').ok_or_else(|| "not a vault file".to_owned())?;
    let name = file.strip_suffix(".json").ok_or_else(|| "a vault file ends in .json".to_owned())?;
    if name.is_empty() || name.contains('/') {
        return Err("not a vault file".into());
    }
    let kind = match dir {
        "servers" => Kind::Server,
        "preferences" => Kind::Preferences,
        "llm" => Kind::Llm,
        "channels" => Kind::Channel,
        "profiles" => Kind::Profile,
        _ => return Err(format!("unknown vault folder {:?}", truncate(dir, 40))),
    };
    Ok((kind, name.to_owned()))
}

fn parse_json_col(s: &str) -> Value {
    serde_json::from_str(s).unwrap_or(Value::Null)
}

/// Every vault file of the state in `c`, by path.
fn export(c: &Connection) -> Result<BTreeMap<String, Value>, StoreError> {
    let mut out = BTreeMap::new();
    let mut st = c.prepare(
        "SELECT name, transport, command, args_json, env_json, cwd, url, headers_json, enabled, timeout_ms, created_at, updated_at, no_sandbox FROM mcp_servers",
    )?;
    let rows = st.query_map([], |r| {
        let mut v = json!({
            "name": r.get::<_, String>(0)?,
            "transport": r.get::<_, String>(1)?,
            "command": r.get::<_, String>(2)?,
            "args": parse_json_col(&r.get::<_, String>(3)?),
            "env": parse_json_col(&r.get::<_, String>(4)?),
            "cwd": r.get::<_, String>(5)?,
            "url": r.get::<_, String>(6)?,
            "headers": parse_json_col(&r.get::<_, String>(7)?),
            "enabled": r.get::<_, i64>(8)? != 0,
            "timeout_ms": r.get::<_, i64>(9)?,
            "created_at": r.get::<_, String>(10)?,
            "updated_at": r.get::<_, String>(11)?,
        });
        // Only an opt-out is written, so files of sandboxed servers are as before.
        if r.get::<_, i64>(12)? != 0 {
            v["no_sandbox"] = Value::Bool(true);
        }
        Ok(v)
    })?;
    for v in rows {
        let v = v?;
        out.insert(format!("servers/{}.json", v["name"].as_str().unwrap_or_default()), v);
    }

    let mut prefs: BTreeMap<String, (Vec<Value>, String)> = BTreeMap::new();
    let mut st =
        c.prepare("SELECT server, kind, name, enabled, updated_at FROM capability_prefs ORDER BY server, kind, name")?;
    let rows = st.query_map([], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, String>(2)?,
            r.get::<_, i64>(3)?,
            r.get::<_, String>(4)?,
        ))
    })?;
    for row in rows {
        let (server, kind, name, enabled, at) = row?;
        let e = prefs.entry(server).or_default();
        e.0.push(json!({"kind": kind, "name": name, "enabled": enabled != 0, "updated_at": at}));
        if at > e.1 {
            e.1 = at;
        }
    }
    for (server, (caps, at)) in prefs {
        out.insert(
            format!("preferences/{server}.json"),
            json!({"server": server, "capabilities": caps, "updated_at": at}),
        );
    }

    let mut st = c.prepare("SELECT key, value, updated_at FROM settings ORDER BY key")?;
    let rows = st.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get::<_, String>(2)?)))?;
    let (mut values, mut latest) = (serde_json::Map::new(), String::new());
    for row in rows {
        let (k, v, at) = row?;
        if machine_local(&k) {
            continue;
        }
        values.insert(k, Value::String(v));
        if at > latest {
            latest = at;
        }
    }
    if !values.is_empty() {
        out.insert("settings.json".into(), json!({"values": values, "updated_at": latest}));
    }

    let mut st = c.prepare(
        "SELECT name, wire, base_url, credential_ref, model, fast_model, internal_default, created_at, updated_at FROM llm_connections",
    )?;
    let rows = st.query_map([], |r| {
        Ok(json!({
            "name": r.get::<_, String>(0)?,
            "wire": r.get::<_, String>(1)?,
            "base_url": r.get::<_, String>(2)?,
            "credential_ref": r.get::<_, String>(3)?,
            "model": r.get::<_, String>(4)?,
            "fast_model": r.get::<_, String>(5)?,
            "internal_default": r.get::<_, i64>(6)? != 0,
            "created_at": r.get::<_, String>(7)?,
            "updated_at": r.get::<_, String>(8)?,
        }))
    })?;
    for v in rows {
        let v = v?;
        out.insert(format!("llm/{}.json", v["name"].as_str().unwrap_or_default()), v);
    }

    let mut st = c.prepare(
        "SELECT name, kind, bot_token_ref, app_id_ref, app_secret_ref, signing_secret_ref, api_base_url, default_agent, agent_config_json, created_at, updated_at FROM channels",
    )?;
    let rows = st.query_map([], |r| {
        let config: String = r.get(8)?;
        Ok(json!({
            "name": r.get::<_, String>(0)?,
            "kind": r.get::<_, String>(1)?,
            "bot_token_ref": r.get::<_, String>(2)?,
            "app_id_ref": r.get::<_, String>(3)?,
            "app_secret_ref": r.get::<_, String>(4)?,
            "signing_secret_ref": r.get::<_, String>(5)?,
            "api_base_url": r.get::<_, String>(6)?,
            "default_agent": r.get::<_, String>(7)?,
            "agent_config": if config.is_empty() { Value::Null } else { parse_json_col(&config) },
            "created_at": r.get::<_, String>(9)?,
            "updated_at": r.get::<_, String>(10)?,
        }))
    })?;
    for v in rows {
        let v = v?;
        out.insert(format!("channels/{}.json", v["name"].as_str().unwrap_or_default()), v);
    }

    // Profiles as written (a never-written `default` is not a file: it is everyone's default).
    let mut st = c.prepare("SELECT name, spec_json, created_at, updated_at FROM profiles")?;
    let rows = st.query_map([], |r| {
        Ok(json!({
            "name": r.get::<_, String>(0)?,
            "spec": parse_json_col(&r.get::<_, String>(1)?),
            "created_at": r.get::<_, String>(2)?,
            "updated_at": r.get::<_, String>(3)?,
        }))
    })?;
    for v in rows {
        let v = v?;
        out.insert(format!("profiles/{}.json", v["name"].as_str().unwrap_or_default()), v);
    }
    Ok(out)
}

/// Credential names the state references (server env/header values, connections, channels)
/// that have no value in `c`, sorted.
fn missing_credentials(c: &Connection, state: &BTreeMap<String, Value>) -> Result<Vec<String>, StoreError> {
    let mut refs = BTreeSet::new();
    for (path, v) in state {
        let Ok((kind, _)) = kind_of(path) else { continue };
        match kind {
            Kind::Server => {
                for field in ["env", "headers"] {
                    if let Some(m) = v[field].as_object() {
                        for val in m.values() {
                            if let Some(name) = val.as_str().and_then(|s| s.strip_prefix(REF_PREFIX)) {
                                refs.insert(name.to_owned());
                            }
                        }
                    }
                }
            }
            Kind::Llm => {
                refs.extend(v["credential_ref"].as_str().filter(|s| !s.is_empty()).map(str::to_owned));
            }
            Kind::Channel => {
                for f in ["bot_token_ref", "app_id_ref", "app_secret_ref", "signing_secret_ref"] {
                    refs.extend(v[f].as_str().filter(|s| !s.is_empty()).map(str::to_owned));
                }
            }
            Kind::Preferences | Kind::Settings | Kind::Profile => {}
        }
    }
    let mut st = c.prepare_cached("SELECT 1 FROM credentials WHERE name = ?1")?;
    let mut missing = Vec::new();
    for name in refs {
        if !st.exists([&name])? {
            missing.push(name);
        }
    }
    Ok(missing)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ServerFile {
    name: String,
    transport: String,
    #[serde(default)]
    command: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    cwd: String,
    #[serde(default)]
    url: String,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(default)]
    enabled: bool,
    #[serde(default)]
    timeout_ms: u64,
    /// Runs without the vault sandbox; absent = sandboxed.
    #[serde(default)]
    no_sandbox: bool,
    created_at: String,
    updated_at: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PrefFile {
    server: String,
    capabilities: Vec<PrefCap>,
    #[serde(default)]
    #[allow(dead_code)] // read for the newer-wins rule by the sync engine, not written
    updated_at: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PrefCap {
    kind: String,
    name: String,
    enabled: bool,
    updated_at: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SettingsFile {
    values: BTreeMap<String, String>,
    #[serde(default)]
    updated_at: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProfileFile {
    name: String,
    /// A `coffer_api::profiles::ProfileSpec` (checked by [`super::profiles::validate`]).
    spec: Value,
    created_at: String,
    updated_at: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LlmFile {
    name: String,
    wire: String,
    #[serde(default)]
    base_url: String,
    #[serde(default)]
    credential_ref: String,
    model: String,
    #[serde(default)]
    fast_model: String,
    #[serde(default)]
    internal_default: bool,
    created_at: String,
    updated_at: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ChannelFile {
    name: String,
    kind: String,
    #[serde(default)]
    enabled: bool,
    #[serde(default)]
    bot_token_ref: String,
    #[serde(default)]
    app_id_ref: String,
    #[serde(default)]
    app_secret_ref: String,
    #[serde(default)]
    signing_secret_ref: String,
    #[serde(default)]
    api_base_url: String,
    #[serde(default)]
    default_agent: String,
    #[serde(default)]
    agent_config: Value,
    created_at: String,
    updated_at: String,
}

/// One validated incoming file.
enum Parsed {
    Server(McpServer),
    Preferences(String, Vec<PrefCap>),
    Settings(BTreeMap<String, String>, String),
    Llm(LlmConnection),
    Channel(ChannelRecord),
    Profile(StoredProfile),
}

fn check_time(field: &str, at: &str) -> Result<(), String> {
    // RFC 3339 UTC as the store writes it; compared as text for "newer".
    let ok = at.len() >= 20 && at.len() <= 40 && at.as_bytes()[4] == b'-' && at.ends_with('Z');
    if ok { Ok(()) } else { Err(format!("{field} {:?} is not an RFC 3339 UTC time", truncate(at, 40))) }
}

/// Parses and validates the file at `path` with the same rules the domain's own writes use.
fn parse_entry(path: &str, text: &str) -> Result<(Kind, String, Parsed, Value), String> {
    let (kind, name) = kind_of(path)?;
    if text.len() > MAX_ENTRY_BYTES {
        return Err(format!("{} bytes; at most {MAX_ENTRY_BYTES}", text.len()));
    }
    let value: Value = serde_json::from_str(text).map_err(|e| format!("not valid JSON: {e}"))?;
    let same_name = |field: &str, n: &str| {
        if n == name { Ok(()) } else { Err(format!("{field} {:?} differs from the file name", truncate(n, 40))) }
    };
    let invalid = |e: StoreError| match e {
        StoreError::Invalid(m) => m,
        other => other.to_string(),
    };
    let parsed = match kind {
        Kind::Server => {
            let f: ServerFile = serde_json::from_value(value.clone()).map_err(|e| e.to_string())?;
            same_name("name", &f.name)?;
            check_time("created_at", &f.created_at)?;
            check_time("updated_at", &f.updated_at)?;
            let transport = Transport::parse(&f.transport)
                .ok_or_else(|| format!("transport {:?} must be stdio, http or sse", truncate(&f.transport, 20)))?;
            // A credential reference must name a credential this machine could hold: otherwise
            // doctor would ask the user to set a name `coffer credentials set` refuses.
            for (field, map) in [("env", &f.env), ("headers", &f.headers)] {
                for (k, v) in map {
                    if let Some(cred) = v.strip_prefix(REF_PREFIX) {
                        crate::credential_crypto::validate_name(cred)
                            .map_err(|e| format!("{field}.{}: credential reference: {e}", truncate(k, 40)))?;
                    }
                }
            }
            let s = McpServer {
                name: f.name,
                transport: transport.into(),
                command: f.command,
                args: f.args,
                env: f.env.into_iter().collect(),
                cwd: f.cwd,
                url: f.url,
                headers: f.headers.into_iter().collect(),
                enabled: f.enabled,
                timeout_ms: f.timeout_ms,
                version: 0,
                created_at: f.created_at,
                updated_at: f.updated_at,
                no_sandbox: f.no_sandbox,
            };
            super::registry::validate_server(&s).map_err(invalid)?;
            Parsed::Server(s)
        }
        Kind::Preferences => {
            let f: PrefFile = serde_json::from_value(value.clone()).map_err(|e| e.to_string())?;
            same_name("server", &f.server)?;
            if f.server != "coffer" {
                super::registry::validate_server_name(&f.server).map_err(invalid)?;
            }
            for c in &f.capabilities {
                CapabilityKind::parse(&c.kind)
                    .ok_or_else(|| format!("kind {:?} must be tool, prompt or resource", truncate(&c.kind, 20)))?;
                if c.name.is_empty() || c.name.len() > 1024 {
                    return Err("a capability name must be 1-1024 bytes".into());
                }
                check_time("updated_at", &c.updated_at)?;
            }
            Parsed::Preferences(f.server, f.capabilities)
        }
        Kind::Settings => {
            let f: SettingsFile = serde_json::from_value(value.clone()).map_err(|e| e.to_string())?;
            for (k, v) in &f.values {
                if k.is_empty() || k.len() > 128 {
                    return Err("setting keys must be 1-128 bytes".into());
                }
                if machine_local(k) {
                    return Err(format!("{k} is this machine's own setting and is not synced"));
                }
                if coffer_types::settings::find(k).is_some() {
                    coffer_types::settings::check(k, v).map_err(|e| e.to_string())?;
                }
            }
            Parsed::Settings(f.values, f.updated_at)
        }
        Kind::Llm => {
            let f: LlmFile = serde_json::from_value(value.clone()).map_err(|e| e.to_string())?;
            same_name("name", &f.name)?;
            check_time("created_at", &f.created_at)?;
            check_time("updated_at", &f.updated_at)?;
            let wire = LlmWire::parse(&f.wire).ok_or_else(|| format!("wire {:?} is unknown", truncate(&f.wire, 30)))?;
            let c = LlmConnection {
                name: f.name,
                wire: wire.into(),
                base_url: f.base_url,
                credential_ref: f.credential_ref,
                model: f.model,
                fast_model: f.fast_model,
                internal_default: f.internal_default,
                version: 0,
                created_at: f.created_at,
                updated_at: f.updated_at,
            };
            super::llm::validate(&c).map_err(invalid)?;
            Parsed::Llm(c)
        }
        Kind::Channel => {
            let f: ChannelFile = serde_json::from_value(value.clone()).map_err(|e| e.to_string())?;
            same_name("name", &f.name)?;
            check_time("created_at", &f.created_at)?;
            check_time("updated_at", &f.updated_at)?;
            let kind =
                ChannelKind::parse(&f.kind).ok_or_else(|| format!("kind {:?} is unknown", truncate(&f.kind, 30)))?;
            let config = match &f.agent_config {
                Value::Null => String::new(),
                v @ Value::Object(_) => v.to_string(),
                _ => return Err("agent_config must be an object or null".into()),
            };
            let mut r = ChannelRecord {
                name: f.name,
                kind: kind.into(),
                enabled: f.enabled,
                bot_token_ref: f.bot_token_ref,
                app_id_ref: f.app_id_ref,
                app_secret_ref: f.app_secret_ref,
                signing_secret_ref: f.signing_secret_ref,
                api_base_url: f.api_base_url,
                default_agent: f.default_agent,
                agent_config_json: config,
                created_at: f.created_at,
                updated_at: f.updated_at,
                ..Default::default()
            };
            r.agent_config_json = super::channels::validate(&r).map_err(invalid)?;
            Parsed::Channel(r)
        }
        Kind::Profile => {
            let f: ProfileFile = serde_json::from_value(value.clone()).map_err(|e| e.to_string())?;
            same_name("name", &f.name)?;
            check_time("created_at", &f.created_at)?;
            check_time("updated_at", &f.updated_at)?;
            let spec_json = f.spec.to_string();
            super::profiles::validate(&f.name, &spec_json).map_err(invalid)?;
            Parsed::Profile(StoredProfile {
                name: f.name,
                spec_json,
                version: 0,
                created_at: f.created_at,
                updated_at: f.updated_at,
            })
        }
    };
    Ok((kind, name, parsed, value))
}

/// The vault paths of the entities changed after `since` (from the change stream).
fn changed_since(t: &Connection, since: u64) -> Result<BTreeSet<String>, StoreError> {
    let mut st = t.prepare("SELECT entity, key FROM changes WHERE seq > ?1")?;
    let rows = st.query_map([since as i64], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))?;
    let mut out = BTreeSet::new();
    for row in rows {
        let (entity, key) = row?;
        match entity.as_str() {
            "server" => {
                out.insert(format!("servers/{key}.json"));
            }
            "preference" => {
                out.insert(format!("preferences/{}.json", key.split('/').next().unwrap_or_default()));
            }
            "settings" if !machine_local(&key) => {
                out.insert("settings.json".into());
            }
            "llm_connection" => {
                out.insert(format!("llm/{key}.json"));
            }
            "channel" => {
                out.insert(format!("channels/{key}.json"));
            }
            "profile" => {
                out.insert(format!("profiles/{key}.json"));
            }
            _ => {}
        }
    }
    Ok(out)
}

fn write_server(t: &Transaction, ch: &mut Changes, s: &McpServer, exists: bool) -> Result<(), StoreError> {
    t.execute(
        "INSERT INTO mcp_servers (name, transport, command, args_json, env_json, cwd, url, headers_json, enabled, timeout_ms, version, created_at, updated_at, no_sandbox)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, 1, ?11, ?12, ?13)
         ON CONFLICT (name) DO UPDATE SET transport = excluded.transport, command = excluded.command,
           args_json = excluded.args_json, env_json = excluded.env_json, cwd = excluded.cwd, url = excluded.url,
           headers_json = excluded.headers_json, enabled = excluded.enabled, timeout_ms = excluded.timeout_ms,
           version = mcp_servers.version + 1, created_at = excluded.created_at, updated_at = excluded.updated_at,
           no_sandbox = excluded.no_sandbox",
        params![
            s.name,
            s.transport().as_str(),
            s.command,
            serde_json::to_string(&s.args).expect("json"),
            serde_json::to_string(&s.env.iter().collect::<BTreeMap<_, _>>()).expect("json"),
            s.cwd,
            s.url,
            serde_json::to_string(&s.headers.iter().collect::<BTreeMap<_, _>>()).expect("json"),
            s.enabled as i64,
            s.timeout_ms as i64,
            s.created_at,
            s.updated_at,
            s.no_sandbox as i64
        ],
    )?;
    ch.push(ChangeEntity::Server, s.name.clone(), if exists { ChangeOp::Update } else { ChangeOp::Create });
    Ok(())
}

fn write_prefs(t: &Transaction, ch: &mut Changes, server: &str, caps: &[PrefCap]) -> Result<(), StoreError> {
    let mut st = t.prepare("SELECT kind, name FROM capability_prefs WHERE server = ?1")?;
    let old: Vec<(String, String)> =
        st.query_map([server], |r| Ok((r.get(0)?, r.get(1)?)))?.collect::<Result<_, _>>()?;
    drop(st);
    t.execute("DELETE FROM capability_prefs WHERE server = ?1", [server])?;
    for (kind, name) in old {
        ch.push(ChangeEntity::Preference, format!("{server}/{kind}/{name}"), ChangeOp::Delete);
    }
    for c in caps {
        t.execute(
            "INSERT INTO capability_prefs (server, kind, name, enabled, updated_at) VALUES (?1, ?2, ?3, ?4, ?5)
             ON CONFLICT (server, kind, name) DO UPDATE SET enabled = excluded.enabled, updated_at = excluded.updated_at",
            params![server, c.kind, c.name, c.enabled as i64, c.updated_at],
        )?;
        ch.push(ChangeEntity::Preference, format!("{server}/{}/{}", c.kind, c.name), ChangeOp::Set);
    }
    Ok(())
}

fn write_settings(
    t: &Transaction,
    ch: &mut Changes,
    values: &BTreeMap<String, String>,
    at: &str,
) -> Result<(), StoreError> {
    let current = super::settings::values(t, "")?;
    for (k, v) in values {
        if current.get(k) != Some(v) {
            t.execute(
                "INSERT INTO settings (key, value, updated_at) VALUES (?1, ?2, ?3)
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at",
                params![k, v, at],
            )?;
            ch.push(ChangeEntity::Setting, k.clone(), ChangeOp::Set);
        }
    }
    for k in current.keys() {
        if !machine_local(k) && !values.contains_key(k) {
            t.execute("DELETE FROM settings WHERE key = ?1", [k])?;
            ch.push(ChangeEntity::Setting, k.clone(), ChangeOp::Delete);
        }
    }
    Ok(())
}

fn write_llm(t: &Transaction, ch: &mut Changes, c: &LlmConnection, exists: bool) -> Result<(), StoreError> {
    if c.internal_default {
        t.execute(
            "UPDATE llm_connections SET internal_default = 0 WHERE name != ?1 AND internal_default = 1",
            [&c.name],
        )?;
    }
    // The row as the domain itself writes it, with the version one past the row it replaces.
    let version = super::llm::get_tx(t, &c.name)?.map_or(1, |old| old.version + 1);
    super::llm::write_row(t, &LlmConnection { version, ..c.clone() })?;
    ch.push(ChangeEntity::LlmConnection, c.name.clone(), if exists { ChangeOp::Update } else { ChangeOp::Create });
    Ok(())
}

/// A profile from another machine, written as the domain writes it (version one past the row it
/// replaces, the file's times kept).
fn write_profile(t: &Transaction, ch: &mut Changes, p: &StoredProfile, exists: bool) -> Result<(), StoreError> {
    let old: Option<i64> =
        t.query_row("SELECT version FROM profiles WHERE name = ?1", [&p.name], |r| r.get(0)).optional()?;
    super::profiles::write_row(t, &StoredProfile { version: old.map_or(1, |v| v + 1), ..p.clone() })?;
    ch.push(ChangeEntity::Profile, p.name.clone(), if exists { ChangeOp::Update } else { ChangeOp::Create });
    Ok(())
}

/// A channel's configuration from another machine. Whether it runs is this machine's own choice:
/// a channel new here arrives disabled and an existing one keeps its `enabled` flag, so two
/// machines never poll one bot token at once (Telegram answers the second poller 409) until
/// the person enables it where they want it.
fn write_channel(t: &Transaction, ch: &mut Changes, c: &ChannelRecord, exists: bool) -> Result<(), StoreError> {
    t.execute(
        "INSERT INTO channels (name, kind, enabled, bot_token_ref, app_id_ref, app_secret_ref, signing_secret_ref, api_base_url, default_agent, agent_config_json, version, created_at, updated_at)
         VALUES (?1, ?2, 0, ?3, ?4, ?5, ?6, ?7, ?8, ?9, 1, ?10, ?11)
         ON CONFLICT (name) DO UPDATE SET bot_token_ref = excluded.bot_token_ref,
           app_id_ref = excluded.app_id_ref, app_secret_ref = excluded.app_secret_ref,
           signing_secret_ref = excluded.signing_secret_ref, api_base_url = excluded.api_base_url,
           default_agent = excluded.default_agent, agent_config_json = excluded.agent_config_json,
           version = channels.version + 1, created_at = excluded.created_at, updated_at = excluded.updated_at",
        params![
            c.name,
            c.kind().as_str(),
            c.bot_token_ref,
            c.app_id_ref,
            c.app_secret_ref,
            c.signing_secret_ref,
            c.api_base_url,
            c.default_agent,
            c.agent_config_json,
            c.created_at,
            c.updated_at
        ],
    )?;
    ch.push(ChangeEntity::Channel, c.name.clone(), if exists { ChangeOp::Update } else { ChangeOp::Create });
    Ok(())
}

fn remove(t: &Transaction, ch: &mut Changes, kind: Kind, name: &str) -> Result<(), StoreError> {
    match kind {
        Kind::Server => {
            t.execute("DELETE FROM mcp_servers WHERE name = ?1", [name])?;
            ch.push(ChangeEntity::Server, name.to_owned(), ChangeOp::Delete);
        }
        Kind::Preferences => write_prefs(t, ch, name, &[])?,
        Kind::Settings => write_settings(t, ch, &BTreeMap::new(), "")?,
        Kind::Llm => {
            t.execute("DELETE FROM llm_connections WHERE name = ?1", [name])?;
            ch.push(ChangeEntity::LlmConnection, name.to_owned(), ChangeOp::Delete);
        }
        Kind::Channel => {
            t.execute("DELETE FROM channel_events WHERE channel = ?1", [name])?;
            t.execute("DELETE FROM channels WHERE name = ?1", [name])?;
            ch.push(ChangeEntity::Channel, name.to_owned(), ChangeOp::Delete);
        }
        Kind::Profile => {
            // `default` removed reads as everything again (its never-written form).
            t.execute("DELETE FROM profiles WHERE name = ?1", [name])?;
            ch.push(ChangeEntity::Profile, name.to_owned(), ChangeOp::Delete);
        }
    }
    Ok(())
}

/// The `VaultState` gRPC service.
pub struct VaultStateService {
    db: Db,
}

impl VaultStateService {
    /// The service over `db`.
    pub fn new(db: Db) -> Self {
        Self { db }
    }
}

#[tonic::async_trait]
impl VaultState for VaultStateService {
    async fn export_vault(&self, _: Request<ExportVaultRequest>) -> Result<Response<VaultDocument>, Status> {
        let head = self.db.head();
        let (entries, missing) = self
            .db
            .read(|c| {
                let state = export(c)?;
                let missing = missing_credentials(c, &state)?;
                let entries =
                    state.iter().map(|(path, v)| VaultEntry { path: path.clone(), json: canonical(v) }).collect();
                Ok((entries, missing))
            })
            .await?;
        Ok(Response::new(VaultDocument { entries, missing_credentials: missing, seq: head }))
    }

    async fn apply_vault(&self, req: Request<ApplyVaultRequest>) -> Result<Response<ApplyVaultReply>, Status> {
        let trace = trace();
        let r = req.into_inner();
        if r.entries.len() > MAX_ENTRIES {
            return Err(Status::invalid_argument(format!("{} vault entries; at most {MAX_ENTRIES}", r.entries.len())));
        }
        // Everything is parsed and validated before the transaction: a bad file names itself
        // and nothing is written.
        let mut incoming: BTreeMap<String, (Kind, String, Parsed, Value)> = BTreeMap::new();
        let mut defaults = Vec::new();
        for e in &r.entries {
            let parsed = parse_entry(&e.path, &e.json)
                .map_err(|m| Status::invalid_argument(format!("vault/{}: {m}", truncate(&e.path, 80))))?;
            if let Parsed::Llm(c) = &parsed.2
                && c.internal_default
            {
                defaults.push(e.path.clone());
            }
            if incoming.insert(e.path.clone(), parsed).is_some() {
                return Err(Status::invalid_argument(format!("vault/{}: given twice", truncate(&e.path, 80))));
            }
        }
        if defaults.len() > 1 {
            return Err(Status::invalid_argument(format!(
                "vault/{}: a second internal_default connection (vault/{} is one); at most one",
                defaults[1], defaults[0]
            )));
        }
        let conflicts = r.conflicts.clone();
        let (reply, seq) = self
            .db
            .write(move |t, ch| {
                let current = export(t)?;
                let skip = changed_since(t, r.since_seq)?;
                let mut reply = ApplyVaultReply::default();
                let paths: BTreeSet<String> = incoming.keys().chain(current.keys()).cloned().collect();
                for path in paths {
                    let cur = current.get(&path);
                    let new = incoming.get(&path);
                    let differs = match (cur, new) {
                        (Some(c), Some((_, _, _, v))) => canonical(c) != canonical(v),
                        (None, None) => false,
                        _ => true,
                    };
                    if !differs {
                        continue;
                    }
                    if skip.contains(&path) {
                        reply.skipped.push(path);
                        continue;
                    }
                    let op = match (cur, new) {
                        (None, _) => "create",
                        (_, None) => "remove",
                        _ => "update",
                    };
                    if !r.dry_run {
                        match new {
                            Some((_, _, Parsed::Server(s), _)) => write_server(t, ch, s, cur.is_some())?,
                            Some((_, _, Parsed::Preferences(server, caps), _)) => write_prefs(t, ch, server, caps)?,
                            Some((_, _, Parsed::Settings(values, at), _)) => write_settings(t, ch, values, at)?,
                            Some((_, _, Parsed::Llm(c), _)) => write_llm(t, ch, c, cur.is_some())?,
                            Some((_, _, Parsed::Channel(c), _)) => write_channel(t, ch, c, cur.is_some())?,
                            Some((_, _, Parsed::Profile(p), _)) => write_profile(t, ch, p, cur.is_some())?,
                            None => {
                                let (kind, name) = kind_of(&path).map_err(StoreError::Invalid)?;
                                remove(t, ch, kind, &name)?;
                            }
                        }
                        let detail = json!({"op": op}).to_string();
                        audit::record_with(t, &trace, &r.actor, "sync.apply", &format!("vault/{path}"), &detail)?;
                    }
                    match op {
                        "create" => reply.added += 1,
                        "remove" => reply.removed += 1,
                        _ => reply.changed += 1,
                    }
                    reply.paths.push(path);
                }
                if !r.dry_run {
                    for c in &conflicts {
                        let discarded: Value = serde_json::from_str(&c.discarded_json).unwrap_or(Value::Null);
                        let detail = json!({"kept": c.kept, "discarded": discarded}).to_string();
                        audit::record_with(
                            t,
                            &trace,
                            &r.actor,
                            "sync.conflict",
                            &format!("vault/{}", c.path),
                            &detail,
                        )?;
                    }
                }
                let after = export(t)?;
                reply.missing_credentials = missing_credentials(t, &after)?;
                Ok(reply)
            })
            .await?;
        Ok(Response::new(ApplyVaultReply { seq, ..reply }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service() -> (tempfile::TempDir, VaultStateService) {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("coffer.db")).unwrap();
        (dir, VaultStateService::new(db))
    }

    fn server_json(name: &str, command: &str, at: &str) -> String {
        canonical(&json!({
            "name": name, "transport": "stdio", "command": command, "args": [], "cwd": "", "url": "",
            "env": {"TOKEN": "coffer-credential-ref:gh-token"}, "headers": {}, "enabled": true,
            "timeout_ms": 0, "created_at": "2026-01-01T00:00:00Z", "updated_at": at,
        }))
    }

    async fn apply(svc: &VaultStateService, entries: Vec<VaultEntry>) -> Result<ApplyVaultReply, Status> {
        let since = svc.db.head();
        let req = ApplyVaultRequest { entries, since_seq: since, actor: "sync".into(), ..Default::default() };
        svc.apply_vault(Request::new(req)).await.map(Response::into_inner)
    }

    #[tokio::test]
    async fn applied_entries_export_to_the_same_bytes_and_removals_follow() {
        let (_d, svc) = service();
        let e =
            VaultEntry { path: "servers/gh.json".into(), json: server_json("gh", "/bin/true", "2026-01-02T00:00:00Z") };
        let r = apply(&svc, vec![e.clone()]).await.unwrap();
        assert_eq!((r.added, r.changed, r.removed), (1, 0, 0));
        assert_eq!(r.missing_credentials, vec!["gh-token".to_owned()]);
        let doc = svc.export_vault(Request::new(ExportVaultRequest {})).await.unwrap().into_inner();
        assert_eq!(doc.entries, vec![e.clone()], "an applied file exports to the same bytes");
        let again = apply(&svc, vec![e]).await.unwrap();
        assert_eq!((again.added, again.changed, again.removed), (0, 0, 0), "idempotent");
        let gone = apply(&svc, vec![]).await.unwrap();
        assert_eq!((gone.added, gone.changed, gone.removed), (0, 0, 1));
        assert!(svc.export_vault(Request::new(ExportVaultRequest {})).await.unwrap().into_inner().entries.is_empty());
    }

    #[tokio::test]
    async fn a_malformed_file_is_named_and_nothing_is_applied() {
        let (_d, svc) = service();
        let good =
            VaultEntry { path: "servers/a.json".into(), json: server_json("a", "/bin/true", "2026-01-02T00:00:00Z") };
        for (path, json, needle) in [
            ("servers/b.json", "{not json".to_owned(), "not valid JSON"),
            (
                "servers/b.json",
                server_json("b", "bin/relative", "2026-01-02T00:00:00Z"),
                "absolute path or a bare name",
            ),
            ("servers/b.json", server_json("c", "/bin/true", "2026-01-02T00:00:00Z"), "differs from the file name"),
            ("servers/b.json", r#"{"name":"b","transport":"stdio","evil":1}"#.to_owned(), "unknown field"),
            ("other/b.json", "{}".to_owned(), "unknown vault folder"),
            ("settings.json", r#"{"values":{"gateway.call_timeout_ms":"-5"}}"#.to_owned(), "gateway.call_timeout_ms"),
            (
                "servers/b.json",
                server_json("b", "/bin/true", "2026-01-02T00:00:00Z").replace("gh-token", "../../secret"),
                "credential reference",
            ),
        ] {
            let bad = VaultEntry { path: path.into(), json };
            let e = apply(&svc, vec![good.clone(), bad]).await.unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument);
            assert!(e.message().starts_with(&format!("vault/{path}: ")), "{}", e.message());
            assert!(e.message().contains(needle), "{needle}: {}", e.message());
            let doc = svc.export_vault(Request::new(ExportVaultRequest {})).await.unwrap().into_inner();
            assert!(doc.entries.is_empty(), "nothing applied half-way");
        }
    }

    #[tokio::test]
    async fn an_entity_changed_after_the_export_is_left_alone() {
        let (_d, svc) = service();
        let since = svc.db.head();
        let e =
            VaultEntry { path: "servers/gh.json".into(), json: server_json("gh", "/bin/true", "2026-01-02T00:00:00Z") };
        apply(&svc, vec![e.clone()]).await.unwrap();
        // An apply computed from a state before that write must not remove it.
        let req = ApplyVaultRequest { entries: vec![], since_seq: since, actor: "sync".into(), ..Default::default() };
        let r = svc.apply_vault(Request::new(req)).await.unwrap().into_inner();
        assert_eq!(r.skipped, vec!["servers/gh.json".to_owned()]);
        assert_eq!(r.removed, 0);
    }

    #[tokio::test]
    async fn profiles_travel_with_the_vault_and_a_bad_one_is_named() {
        let (_d, svc) = service();
        // Written on this machine through the domain: exported as profiles/<name>.json.
        let profiles = super::super::profiles::ProfilesService::new(svc.db.clone());
        use coffer_proto::store::profiles_server::Profiles as _;
        let put = PutProfileRequest {
            name: "work".into(),
            spec_json: r#"{"mode":"lazy","tools":{"exclude":["git__git_push"]}}"#.into(),
            create_only: true,
            ..Default::default()
        };
        profiles.put_profile(Request::new(put)).await.unwrap();
        let doc = svc.export_vault(Request::new(ExportVaultRequest {})).await.unwrap().into_inner();
        assert_eq!(
            doc.entries.iter().map(|e| e.path.as_str()).collect::<Vec<_>>(),
            ["profiles/work.json"],
            "a never-written default is no file"
        );
        let exported: Value = serde_json::from_str(&doc.entries[0].json).unwrap();
        assert_eq!(exported["spec"], json!({"mode": "lazy", "tools": {"exclude": ["git__git_push"]}}));
        // Applied on another machine: the same bytes come back, the change stream says so.
        let (_d2, other) = service();
        let r = apply(&other, doc.entries.clone()).await.unwrap();
        assert_eq!((r.added, r.changed, r.removed), (1, 0, 0));
        let back = other.export_vault(Request::new(ExportVaultRequest {})).await.unwrap().into_inner();
        assert_eq!(back.entries, doc.entries, "an applied profile exports to the same bytes");
        let entity: String = other
            .db
            .read(|c| Ok(c.query_row("SELECT entity FROM changes ORDER BY seq DESC LIMIT 1", [], |r| r.get(0))?))
            .await
            .unwrap();
        assert_eq!(entity, "profile");
        // A bad profile file is named, nothing applied.
        for (json, needle) in [
            (
                r#"{"name":"work","spec":{"mode":"sometimes"},"created_at":"2026-01-01T00:00:00Z","updated_at":"2026-01-01T00:00:00Z"}"#,
                "sometimes",
            ),
            (
                r#"{"name":"Work","spec":{},"created_at":"2026-01-01T00:00:00Z","updated_at":"2026-01-01T00:00:00Z"}"#,
                "differs from the file name",
            ),
            (
                r#"{"name":"work","spec":[],"created_at":"2026-01-01T00:00:00Z","updated_at":"2026-01-01T00:00:00Z"}"#,
                "not a profile spec",
            ),
            (
                r#"{"name":"work","spec":{},"colour":1,"created_at":"2026-01-01T00:00:00Z","updated_at":"2026-01-01T00:00:00Z"}"#,
                "unknown field",
            ),
        ] {
            let e = apply(&other, vec![VaultEntry { path: "profiles/work.json".into(), json: json.into() }])
                .await
                .unwrap_err();
            assert!(
                e.message().starts_with("vault/profiles/work.json: ") && e.message().contains(needle),
                "{needle}: {}",
                e.message()
            );
        }
        // Removed on the other side: removed here.
        let gone = apply(&other, vec![]).await.unwrap();
        assert_eq!(gone.removed, 1);
    }

    #[tokio::test]
    async fn a_pulled_channel_arrives_disabled_and_a_local_enabled_flag_is_kept() {
        let (_d, svc) = service();
        let channel = |at: &str| {
            canonical(&json!({
                "name": "home", "kind": "telegram", "bot_token_ref": "channel-home-bot-token", "app_id_ref": "",
                "app_secret_ref": "", "signing_secret_ref": "", "api_base_url": "", "default_agent": "claude_code",
                "agent_config": null, "created_at": "2026-01-01T00:00:00Z", "updated_at": at,
            }))
        };
        async fn enabled(svc: &VaultStateService) -> i64 {
            let q = |c: &rusqlite::Connection| {
                Ok(c.query_row("SELECT enabled FROM channels WHERE name = 'home'", [], |r| r.get(0))?)
            };
            svc.db.read(q).await.unwrap()
        }
        let e = VaultEntry { path: "channels/home.json".into(), json: channel("2026-01-02T00:00:00Z") };
        let r = apply(&svc, vec![e.clone()]).await.unwrap();
        assert_eq!(r.added, 1);
        assert_eq!(
            enabled(&svc).await,
            0,
            "a channel from another machine never starts polling its bot here by itself"
        );
        let doc = svc.export_vault(Request::new(ExportVaultRequest {})).await.unwrap().into_inner();
        assert_eq!(doc.entries, vec![e], "whether it runs is not part of the synced file");
        svc.db.write(|t, _| Ok(t.execute("UPDATE channels SET enabled = 1 WHERE name = 'home'", [])?)).await.unwrap();
        let newer = VaultEntry { path: "channels/home.json".into(), json: channel("2026-01-03T00:00:00Z") };
        apply(&svc, vec![newer]).await.unwrap();
        assert_eq!(enabled(&svc).await, 1, "this machine's choice to run it survives a pulled change");
    }

    #[test]
    fn what_a_machine_exposes_is_its_own() {
        for k in ["ui.allowed_hosts", "ui.bind", "ui.remote_api", "sync.auto", "chat.codex_path"] {
            assert!(machine_local(k), "{k}");
        }
        assert!(!machine_local("ui.login_code_ttl_s"));
    }

    #[tokio::test]
    async fn machine_local_settings_are_neither_exported_nor_applied_nor_removed() {
        let (_d, svc) = service();
        let set = |k: &'static str, v: &'static str| {
            svc.db.write(move |t, _| {
                Ok(t.execute(
                    "INSERT INTO settings (key, value, updated_at) VALUES (?1, ?2, '2026-01-01T00:00:00Z')",
                    [k, v],
                )?)
            })
        };
        set("chat.claude_code_path", "/opt/only-here/claude").await.unwrap();
        set("sync.machine_name", "here").await.unwrap();
        set("gateway.call_timeout_ms", "5000").await.unwrap();
        let doc = svc.export_vault(Request::new(ExportVaultRequest {})).await.unwrap().into_inner();
        let settings = doc.entries.iter().find(|e| e.path == "settings.json").expect("settings.json");
        assert!(settings.json.contains("gateway.call_timeout_ms"), "{}", settings.json);
        assert!(
            !settings.json.contains("claude_code_path") && !settings.json.contains("machine_name"),
            "{}",
            settings.json
        );
        let pulled = r#"{"values":{"chat.codex_path":"/opt/elsewhere/codex"}}"#.to_owned();
        let e = apply(&svc, vec![VaultEntry { path: "settings.json".into(), json: pulled }]).await.unwrap_err();
        assert!(e.message().contains("chat.codex_path"), "{}", e.message());
        let empty = r#"{"values":{},"updated_at":"2026-01-02T00:00:00Z"}"#.to_owned();
        apply(&svc, vec![VaultEntry { path: "settings.json".into(), json: empty }]).await.unwrap();
        let kept: i64 = svc
            .db
            .read(|c| {
                Ok(c.query_row(
                    "SELECT count(*) FROM settings WHERE key IN ('chat.claude_code_path', 'sync.machine_name')",
                    [],
                    |r| r.get(0),
                )?)
            })
            .await
            .unwrap();
        assert_eq!(kept, 2, "a pulled settings file never removes this machine's own settings");
    }
}
