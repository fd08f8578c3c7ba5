//! The Coffer-owned files under `COFFER_HOME/agents/` that attach Coffer's gateway to the
//! managed agents: Claude Code's MCP config (`agents/claude_code/mcp.json`, passed with
//! `--mcp-config`) and Codex's own `CODEX_HOME` (`agents/codex/`: a `config.toml` that is the
//! user's Codex config plus `[mcp_servers.coffer]`, and `auth.json` as a symlink to the user's).
//!
//! Neither file holds a secret: the MCP entries name `coffer-mcp-shim`, `COFFER_HOME` and
//! `COFFER_AGENT_SHIM=1` only (the shim finds the daemon and the agent token, good for `/mcp`
//! only, through `agent-access/agent.json`; never `daemon.json`), and Codex's credentials stay
//! in the user's own `auth.json`, which Coffer links to and never copies or reads. Files are
//! written through a temporary file and a rename (an agent never reads half of one), and only
//! when their content changed.
use std::path::{Path, PathBuf};

use coffer_runtime::codex_config::CodexConfig;
use serde_json::json;

use crate::binding::CodexProvider;

// The MCP server name Coffer's gateway takes in the agents' configs.
pub use coffer_runtime::codex_config::SERVER_NAME;

/// Why an agent's config could not be written.
#[derive(Debug, thiserror::Error)]
pub enum ConfigFileError {
    /// A file or folder could not be written.
    #[error("cannot write {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    /// The user's Codex config is not TOML Coffer can extend.
    #[error("{path} is not a Codex config Coffer can extend: {problem}")]
    UserConfig { path: PathBuf, problem: String },
}

/// Writes `agents/claude_code/mcp.json` (`{"mcpServers":{"coffer":{"type":"stdio",
/// "command":SHIM,"args":[],"env":{"COFFER_HOME":HOME,"COFFER_AGENT_SHIM":"1"}}}}`) and returns
/// its path.
///
/// # Errors
/// [`ConfigFileError::Write`] naming the file.
pub fn claude_mcp_config(agents_dir: &Path, shim: &Path, coffer_home: &Path) -> Result<PathBuf, ConfigFileError> {
    let path = agents_dir.join("claude_code").join("mcp.json");
    let body = claude_mcp_body(shim, coffer_home, None);
    let text = serde_json::to_string_pretty(&body).unwrap_or_default() + "\n";
    write_if_changed(&path, text.as_bytes())?;
    Ok(path)
}

/// The MCP config of one Claude Code turn, passed inline with `--mcp-config`: the same entry as
/// [`claude_mcp_config`]'s file plus `COFFER_CONVERSATION` = `conversation` in the shim's
/// environment, so the gateway names the conversation on the agent's calls (Activity). JSON text;
/// no secret.
pub fn claude_mcp_json(shim: &Path, coffer_home: &Path, conversation: &str) -> String {
    claude_mcp_body(shim, coffer_home, Some(conversation)).to_string()
}

/// Claude Code's `mcpServers` object with Coffer's one stdio entry (the shim, its home, the agent
/// flag, and `COFFER_CONVERSATION` when `conversation` is given).
fn claude_mcp_body(shim: &Path, coffer_home: &Path, conversation: Option<&str>) -> serde_json::Value {
    let mut env = json!({
        coffer_runtime::env::HOME: coffer_home.display().to_string(),
        coffer_runtime::env::AGENT_SHIM: "1",
    });
    if let Some(c) = conversation {
        env[coffer_runtime::env::CONVERSATION] = json!(c);
    }
    json!({"mcpServers": {SERVER_NAME: {
        "type": "stdio",
        "command": shim.display().to_string(),
        "args": [],
        "env": env,
    }}})
}

/// The Codex config override (`-c KEY=VALUE`, given before the subcommand) that puts
/// `COFFER_CONVERSATION` = `conversation` in the environment of Coffer's MCP entry for one
/// conversation's `codex app-server` (a process serves one conversation: see `kept.rs`).
pub fn codex_conversation_override(conversation: &str) -> String {
    format!(
        "mcp_servers.{SERVER_NAME}.env.{}={}",
        coffer_runtime::env::CONVERSATION,
        serde_json::Value::String(conversation.to_owned())
    )
}

/// Where the user's own Codex home is: `$CODEX_HOME` of the daemon's (agent's) environment when
/// set and not Coffer's own, else `$HOME/.codex`. `None` without either.
pub fn user_codex_home(codex_home_var: Option<PathBuf>, home_var: Option<PathBuf>, ours: &Path) -> Option<PathBuf> {
    match codex_home_var {
        Some(p) if !p.as_os_str().is_empty() && p != ours => Some(p),
        _ => home_var.filter(|h| !h.as_os_str().is_empty()).map(|h| h.join(".codex")),
    }
}

/// Prepares Coffer's `CODEX_HOME` (`agents/codex/`) and returns it: `config.toml` = the user's
/// `config.toml` (from `user_home`, kept as it is, comments included) with `[mcp_servers.coffer]`
/// set to the shim with `env = {COFFER_HOME = …, COFFER_AGENT_SHIM = "1"}`; `auth.json` a symlink to the user's when they
/// have one (so their login applies; Coffer never reads, copies or writes it), removed when
/// theirs is gone.
///
/// # Errors
/// [`ConfigFileError::UserConfig`] when the user's config is not valid TOML (naming the file and
/// the problem), [`ConfigFileError::Write`] when a file cannot be written.
pub fn codex_home(
    agents_dir: &Path,
    user_home: Option<&Path>,
    shim: &Path,
    coffer_home: &Path,
    provider: Option<&CodexProvider>,
) -> Result<PathBuf, ConfigFileError> {
    let dir = agents_dir.join("codex");
    std::fs::create_dir_all(&dir).map_err(|source| ConfigFileError::Write { path: dir.clone(), source })?;
    let user_config = user_home.map(|h| h.join("config.toml"));
    let text = match &user_config {
        Some(p) => match std::fs::read_to_string(p) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => {
                return Err(ConfigFileError::UserConfig { path: p.clone(), problem: e.to_string() });
            }
        },
        None => String::new(),
    };
    let merged = with_coffer_server(&text, shim, coffer_home)
        .and_then(|t| match provider {
            Some(p) => with_binding(&t, p),
            None => Ok(t),
        })
        .map_err(|problem| ConfigFileError::UserConfig {
            path: user_config.clone().unwrap_or_else(|| PathBuf::from("config.toml")),
            problem,
        })?;
    write_if_changed(&dir.join("config.toml"), merged.as_bytes())?;
    link_auth(&dir, user_home)?;
    Ok(dir)
}

/// `text` (a Codex `config.toml`) with `[mcp_servers.coffer]` replaced by Coffer's entry.
///
/// # Errors
/// A message when `text` is not TOML or `mcp_servers` is not a table.
pub fn with_coffer_server(text: &str, shim: &Path, coffer_home: &Path) -> Result<String, String> {
    let mut config = CodexConfig::parse(text)?;
    config.set_agent_coffer_server(&shim.display().to_string(), &coffer_home.display().to_string())?;
    Ok(config.to_string())
}

/// `text` (a Codex `config.toml`) with Coffer's model provider for a bound Codex: the entry
/// `[model_providers.<id>]` (`name`, `base_url`, `wire_api`, `env_key` when the connection has a
/// key — the variable's name, never its value) and top-level `model_provider = <id>` and, when
/// the connection names one, `model`. The user's other providers stay as they are.
///
/// # Errors
/// A message when `text` is not TOML or `model_providers` is not a table.
pub fn with_binding(text: &str, p: &CodexProvider) -> Result<String, String> {
    use toml_edit::{Item, Table, value};
    let mut config = CodexConfig::parse(text)?;
    let root = config.document_mut().as_table_mut();
    root.insert("model_provider", value(p.id.clone()));
    if !p.model.is_empty() {
        root.insert("model", value(p.model.clone()));
    }
    if !root.contains_key("model_providers") {
        let mut t = Table::new();
        t.set_implicit(true);
        root.insert("model_providers", Item::Table(t));
    }
    let mut entry = Table::new();
    entry.insert("name", value(p.name.clone()));
    entry.insert("base_url", value(p.base_url.clone()));
    entry.insert("wire_api", value(p.wire_api));
    if let Some(k) = p.env_key {
        entry.insert("env_key", value(k));
    }
    match root.get_mut("model_providers") {
        Some(Item::Table(t)) => {
            t.insert(&p.id, Item::Table(entry));
        }
        Some(Item::Value(toml_edit::Value::InlineTable(t))) => {
            t.insert(&p.id, toml_edit::Value::InlineTable(entry.into_inline_table()));
        }
        _ => return Err("model_providers is not a table".into()),
    }
    if let Some(var) = p.env_key {
        exclude_from_shells(root, var)?;
    }
    Ok(config.to_string())
}

/// Adds `var` to `[shell_environment_policy] exclude` (keeping the user's own patterns): the
/// commands Codex runs for the model, and the shell snapshots it writes under `CODEX_HOME`, never
/// see the bound key.
fn exclude_from_shells(root: &mut toml_edit::Table, var: &str) -> Result<(), String> {
    use toml_edit::{Array, Item, Table, Value};
    if !root.contains_key("shell_environment_policy") {
        root.insert("shell_environment_policy", Item::Table(Table::new()));
    }
    let policy = root
        .get_mut("shell_environment_policy")
        .and_then(Item::as_table_like_mut)
        .ok_or("shell_environment_policy is not a table")?;
    if policy.get("exclude").is_none() {
        policy.insert("exclude", Item::Value(Value::Array(Array::new())));
    }
    let exclude = policy
        .get_mut("exclude")
        .and_then(Item::as_array_mut)
        .ok_or("shell_environment_policy.exclude is not an array")?;
    if !exclude.iter().any(|v| v.as_str() == Some(var)) {
        exclude.push(var);
    }
    Ok(())
}

fn link_auth(dir: &Path, user_home: Option<&Path>) -> Result<(), ConfigFileError> {
    let ours = dir.join("auth.json");
    let theirs = user_home.map(|h| h.join("auth.json")).filter(|p| p.is_file());
    let current = std::fs::symlink_metadata(&ours).ok();
    let write_err = |source| ConfigFileError::Write { path: ours.clone(), source };
    match (theirs, current) {
        // A real file there was written by Codex itself (e.g. a login run with this home): keep it.
        (_, Some(m)) if !m.file_type().is_symlink() => Ok(()),
        (Some(target), Some(_)) if std::fs::read_link(&ours).ok().as_deref() == Some(target.as_path()) => Ok(()),
        (Some(target), current) => {
            if current.is_some() {
                std::fs::remove_file(&ours).map_err(write_err)?;
            }
            std::os::unix::fs::symlink(&target, &ours).map_err(write_err)
        }
        (None, Some(_)) => std::fs::remove_file(&ours).map_err(write_err),
        (None, None) => Ok(()),
    }
}

/// Writes `body` to `path` through a temporary file and a rename, unless it already holds it.
fn write_if_changed(path: &Path, body: &[u8]) -> Result<(), ConfigFileError> {
    if std::fs::read(path).is_ok_and(|old| old == body) {
        return Ok(());
    }
    let err = |source| ConfigFileError::Write { path: path.to_path_buf(), source };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    let tmp = path.with_extension(format!("tmp-{}-{}", std::process::id(), fastrand_suffix()));
    std::fs::write(&tmp, body).map_err(err)?;
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        err(e)
    })
}

fn fastrand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_codex_config_keeps_the_user_s_and_adds_coffer() {
        let user = "# mine\nmodel = \"o3\"\nmodel_provider = \"mock\"\n\n[model_providers.mock]\nbase_url = \"http://x/v1\"\n\n[mcp_servers.fs]\ncommand = \"npx\"\n\n[mcp_servers.coffer]\ncommand = \"old\"\n";
        let out = with_coffer_server(user, Path::new("/bin/shim"), Path::new("/h")).unwrap();
        assert!(out.starts_with("# mine\nmodel = \"o3\""), "{out}");
        let doc: toml_edit::DocumentMut = out.parse().unwrap();
        assert_eq!(doc["model_providers"]["mock"]["base_url"].as_str(), Some("http://x/v1"));
        assert_eq!(doc["mcp_servers"]["fs"]["command"].as_str(), Some("npx"));
        assert_eq!(doc["mcp_servers"]["coffer"]["command"].as_str(), Some("/bin/shim"));
        assert_eq!(doc["mcp_servers"]["coffer"]["env"]["COFFER_HOME"].as_str(), Some("/h"));
        assert_eq!(doc["mcp_servers"]["coffer"]["env"]["COFFER_AGENT_SHIM"].as_str(), Some("1"), "the agent's shim");
        let bad = with_coffer_server("model = ", Path::new("/s"), Path::new("/h")).unwrap_err();
        assert!(bad.contains("not valid TOML"), "{bad}");
        let not_table = with_coffer_server("mcp_servers = 3\n", Path::new("/s"), Path::new("/h")).unwrap_err();
        assert!(not_table.contains("not a table"), "{not_table}");
    }

    #[test]
    fn codex_home_links_auth_and_never_copies_it() {
        let dir = tempfile::tempdir().unwrap();
        let user = dir.path().join("user-codex");
        std::fs::create_dir_all(&user).unwrap();
        std::fs::write(user.join("config.toml"), "model = \"m\"\n").unwrap();
        std::fs::write(user.join("auth.json"), "{\"OPENAI_API_KEY\":\"sk-secret\"}").unwrap();
        let agents = dir.path().join("agents");
        let home = codex_home(&agents, Some(&user), Path::new("/s"), Path::new("/h"), None).unwrap();
        let link = std::fs::symlink_metadata(home.join("auth.json")).unwrap();
        assert!(link.file_type().is_symlink());
        assert_eq!(std::fs::read_link(home.join("auth.json")).unwrap(), user.join("auth.json"));
        // No file Coffer wrote holds the secret.
        for e in std::fs::read_dir(&home).unwrap().flatten() {
            if !e.file_type().unwrap().is_symlink() {
                let text = std::fs::read_to_string(e.path()).unwrap_or_default();
                assert!(!text.contains("sk-secret"), "{}", e.path().display());
            }
        }
        // Idempotent, and the link goes when the user's file does.
        codex_home(&agents, Some(&user), Path::new("/s"), Path::new("/h"), None).unwrap();
        std::fs::remove_file(user.join("auth.json")).unwrap();
        codex_home(&agents, Some(&user), Path::new("/s"), Path::new("/h"), None).unwrap();
        assert!(std::fs::symlink_metadata(home.join("auth.json")).is_err());
        // A broken user config is named.
        std::fs::write(user.join("config.toml"), "= nope").unwrap();
        let e = codex_home(&agents, Some(&user), Path::new("/s"), Path::new("/h"), None).unwrap_err().to_string();
        assert!(e.contains("config.toml") && e.contains("not valid TOML"), "{e}");
    }

    fn provider(key: bool) -> CodexProvider {
        CodexProvider {
            id: "coffer-work".into(),
            name: "Coffer connection work".into(),
            base_url: "http://127.0.0.1:7/v1".into(),
            wire_api: "responses",
            env_key: key.then_some(crate::binding::CODEX_KEY_VAR),
            model: "gpt-bound".into(),
        }
    }

    #[test]
    fn a_binding_adds_a_provider_entry_and_selects_it_and_unbinding_removes_it() {
        let dir = tempfile::tempdir().unwrap();
        let user = dir.path().join("user-codex");
        std::fs::create_dir_all(&user).unwrap();
        let theirs =
            "# mine\nmodel = \"o3\"\nmodel_provider = \"mock\"\n\n[model_providers.mock]\nbase_url = \"http://x/v1\"\n";
        std::fs::write(user.join("config.toml"), theirs).unwrap();
        let agents = dir.path().join("agents");
        let home = codex_home(&agents, Some(&user), Path::new("/s"), Path::new("/h"), Some(&provider(true))).unwrap();
        let text = std::fs::read_to_string(home.join("config.toml")).unwrap();
        let doc: toml_edit::DocumentMut = text.parse().unwrap();
        assert_eq!(doc["model_provider"].as_str(), Some("coffer-work"), "{text}");
        assert_eq!(doc["model"].as_str(), Some("gpt-bound"));
        let entry = &doc["model_providers"]["coffer-work"];
        assert_eq!(entry["base_url"].as_str(), Some("http://127.0.0.1:7/v1"));
        assert_eq!(entry["wire_api"].as_str(), Some("responses"));
        assert_eq!(entry["env_key"].as_str(), Some(crate::binding::CODEX_KEY_VAR));
        assert_eq!(doc["model_providers"]["mock"]["base_url"].as_str(), Some("http://x/v1"), "theirs stays");
        assert_eq!(doc["mcp_servers"]["coffer"]["command"].as_str(), Some("/s"));
        // The selection is at the top level, not inside a table that happens to come last.
        assert!(
            text.find("model_provider = \"coffer-work\"").unwrap() < text.find("[model_providers").unwrap(),
            "{text}"
        );

        // Unbound: the user's own selection again, no Coffer entry.
        codex_home(&agents, Some(&user), Path::new("/s"), Path::new("/h"), None).unwrap();
        let doc: toml_edit::DocumentMut = std::fs::read_to_string(home.join("config.toml")).unwrap().parse().unwrap();
        assert_eq!(doc["model_provider"].as_str(), Some("mock"));
        assert_eq!(doc["model"].as_str(), Some("o3"));
        assert!(doc["model_providers"].get("coffer-work").is_none());

        // No key: no env_key (Codex then sends no Authorization); no user config at all is fine.
        let out = with_binding("", &provider(false)).unwrap();
        let doc: toml_edit::DocumentMut = out.parse().unwrap();
        assert!(doc["model_providers"]["coffer-work"].get("env_key").is_none(), "{out}");
        assert!(with_binding("model_providers = 1\n", &provider(true)).unwrap_err().contains("not a table"));
        // The key's variable is kept from the commands Codex runs, the user's patterns kept.
        let theirs = "[shell_environment_policy]\nexclude = [\"AWS_*\"]\n";
        let doc: toml_edit::DocumentMut = with_binding(theirs, &provider(true)).unwrap().parse().unwrap();
        let exclude: Vec<_> =
            doc["shell_environment_policy"]["exclude"].as_array().unwrap().iter().filter_map(|v| v.as_str()).collect();
        assert_eq!(exclude, ["AWS_*", crate::binding::CODEX_KEY_VAR]);
    }

    #[test]
    fn the_claude_config_names_the_shim_and_home_only() {
        let dir = tempfile::tempdir().unwrap();
        let inline: serde_json::Value =
            serde_json::from_str(&claude_mcp_json(Path::new("/bin/coffer-mcp-shim"), Path::new("/h"), "c-1")).unwrap();
        assert_eq!(inline["mcpServers"]["coffer"]["env"]["COFFER_CONVERSATION"], "c-1", "{inline}");
        assert_eq!(codex_conversation_override("c-1"), "mcp_servers.coffer.env.COFFER_CONVERSATION=\"c-1\"");
        let p = claude_mcp_config(dir.path(), Path::new("/bin/coffer-mcp-shim"), Path::new("/h")).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
        assert_eq!(
            v,
            json!({"mcpServers": {"coffer": {"type": "stdio", "command": "/bin/coffer-mcp-shim", "args": [],
                "env": {"COFFER_HOME": "/h", "COFFER_AGENT_SHIM": "1"}}}})
        );
    }

    #[test]
    fn the_user_codex_home_is_codex_home_then_dot_codex() {
        let ours = Path::new("/c/agents/codex");
        assert_eq!(user_codex_home(Some("/u/ch".into()), Some("/u".into()), ours), Some("/u/ch".into()));
        assert_eq!(user_codex_home(Some(ours.into()), Some("/u".into()), ours), Some("/u/.codex".into()));
        assert_eq!(user_codex_home(None, Some("/u".into()), ours), Some("/u/.codex".into()));
        assert_eq!(user_codex_home(None, None, ours), None);
    }
}
