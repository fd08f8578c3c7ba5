//! The one writer of Codex's `config.toml` (the OpenAI Codex CLI's settings): Coffer's MCP
//! server entry `[mcp_servers.coffer]`, set or removed with `toml_edit` so that every other
//! line keeps its comments, order and layout. `coffer connect codex` edits the user's file
//! with it; the chat service's Codex agent writes its own `CODEX_HOME` copy with it.

use toml_edit::{Array, DocumentMut, InlineTable, Item, Table, Value, value};

/// The key of Coffer's entry under `mcp_servers`; Codex shows its tools as `coffer__<tool>`.
pub const SERVER_NAME: &str = "coffer";

/// A parsed Codex `config.toml`.
#[derive(Debug, Clone)]
pub struct CodexConfig {
    doc: DocumentMut,
}

impl CodexConfig {
    /// Parses `text` (empty text is an empty file).
    ///
    /// # Errors
    /// `not valid TOML: <the parser's first line>`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let doc = text.parse().map_err(|e: toml_edit::TomlError| {
            format!("not valid TOML: {}", e.message().lines().next().unwrap_or_default())
        })?;
        Ok(Self { doc })
    }

    /// The document, for edits of other tables (the chat service's model provider).
    pub fn document_mut(&mut self) -> &mut DocumentMut {
        &mut self.doc
    }

    /// Whether `[mcp_servers.coffer]` is exactly the entry [`CodexConfig::set_coffer_server`]
    /// writes for `shim` and `home` (`command`, empty or no `args`, `env` holding only
    /// `COFFER_HOME` = `home`, or no `env` when `home` is `None`); `None` when there is no entry.
    pub fn coffer_server_is(&self, shim: &str, home: Option<&str>) -> Option<bool> {
        self.coffer_server_is_with(shim, home, &[])
    }

    /// [`CodexConfig::coffer_server_is`] for an entry whose `args` are `args` (e.g. the shim's
    /// `--profile NAME`); empty `args` also matches no `args`.
    pub fn coffer_server_is_with(&self, shim: &str, home: Option<&str>, args: &[String]) -> Option<bool> {
        let servers = self.doc.as_table().get("mcp_servers")?.as_table_like()?;
        let t = servers.get(SERVER_NAME).and_then(Item::as_table_like)?;
        let command = t.get("command").and_then(Item::as_str) == Some(shim);
        let no_args = match t.get("args") {
            None => args.is_empty(),
            Some(a) => {
                a.as_array().is_some_and(|a| a.iter().map(|v| v.as_str()).eq(args.iter().map(|s| Some(s.as_str()))))
            }
        };
        let env = t.get("env").and_then(Item::as_table_like);
        let env_ok = match home {
            None => env.is_none_or(|e| e.is_empty()),
            Some(home) => {
                env.is_some_and(|e| e.len() == 1 && e.get(crate::env::HOME).and_then(Item::as_str) == Some(home))
            }
        };
        let others = t.iter().any(|(k, _)| !matches!(k, "command" | "args" | "env"));
        Some(command && no_args && env_ok && !others)
    }

    /// Sets `[mcp_servers.coffer]` to `command = shim`, `args = []` and, with `home`,
    /// `env = { COFFER_HOME = home }`, replacing any previous entry. A missing `mcp_servers`
    /// is added as an implicit table; an inline `mcp_servers = { … }` gets an inline entry.
    ///
    /// # Errors
    /// `mcp_servers is not a table` when it is something else.
    pub fn set_coffer_server(&mut self, shim: &str, home: Option<&str>) -> Result<(), String> {
        self.set_entry(shim, home, false, &[])
    }

    /// [`CodexConfig::set_coffer_server`] with the shim's `args` (e.g. `--profile NAME`).
    ///
    /// # Errors
    /// `mcp_servers is not a table` when it is something else.
    pub fn set_coffer_server_with(&mut self, shim: &str, home: Option<&str>, args: &[String]) -> Result<(), String> {
        self.set_entry(shim, home, false, args)
    }

    /// [`CodexConfig::set_coffer_server`] for a Codex managed by the chat service: its `env` also
    /// has `COFFER_AGENT_SHIM = "1"`, so the shim connects with the agents' `/mcp`-only token
    /// (`agent-access/agent.json`) and never starts a daemon.
    ///
    /// # Errors
    /// `mcp_servers is not a table` when it is something else.
    pub fn set_agent_coffer_server(&mut self, shim: &str, home: &str) -> Result<(), String> {
        self.set_entry(shim, Some(home), true, &[])
    }

    fn set_entry(&mut self, shim: &str, home: Option<&str>, agent: bool, args: &[String]) -> Result<(), String> {
        let root = self.doc.as_table_mut();
        if !root.contains_key("mcp_servers") {
            let mut t = Table::new();
            t.set_implicit(true);
            root.insert("mcp_servers", Item::Table(t));
        }
        let mut entry = Table::new();
        entry.insert("command", value(shim));
        entry.insert("args", value(args.iter().map(String::as_str).collect::<Array>()));
        let mut env = InlineTable::new();
        if let Some(home) = home {
            env.insert(crate::env::HOME, home.into());
        }
        if agent {
            env.insert(crate::env::AGENT_SHIM, "1".into());
        }
        if !env.is_empty() {
            entry.insert("env", value(env));
        }
        match root.get_mut("mcp_servers") {
            Some(Item::Table(t)) => {
                t.insert(SERVER_NAME, Item::Table(entry));
            }
            Some(Item::Value(Value::InlineTable(t))) => {
                t.insert(SERVER_NAME, Value::InlineTable(entry.into_inline_table()));
            }
            _ => return Err("mcp_servers is not a table".into()),
        }
        Ok(())
    }

    /// Removes `[mcp_servers.coffer]`, and `mcp_servers` with it when that leaves an implicit
    /// table empty. `false` when there was no entry.
    ///
    /// # Errors
    /// `mcp_servers is not a table` when it is something else.
    pub fn remove_coffer_server(&mut self) -> Result<bool, String> {
        let root = self.doc.as_table_mut();
        let Some(servers) = root.get_mut("mcp_servers") else {
            return Ok(false);
        };
        let servers = servers.as_table_like_mut().ok_or("mcp_servers is not a table")?;
        if servers.remove(SERVER_NAME).is_none() {
            return Ok(false);
        }
        if servers.is_empty() && root.get("mcp_servers").and_then(Item::as_table).is_some_and(Table::is_implicit) {
            root.remove("mcp_servers");
        }
        Ok(true)
    }
}

impl std::fmt::Display for CodexConfig {
    /// The TOML text, everything not edited as it was read.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.doc.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHIM: &str = "/opt/coffer/bin/coffer-mcp-shim";

    #[test]
    fn set_keeps_the_rest_and_remove_undoes_it() {
        let text = "# mine\nmodel = \"o3\"\n\n[mcp_servers.fs]\ncommand = \"npx\" # keep\n";
        let mut c = CodexConfig::parse(text).unwrap();
        assert_eq!(c.coffer_server_is(SHIM, None), None);
        c.set_coffer_server(SHIM, Some("/h")).unwrap();
        let out = c.to_string();
        assert!(out.starts_with(text), "{out}");
        assert!(out.contains("[mcp_servers.coffer]") && out.contains("COFFER_HOME = \"/h\""), "{out}");
        let c = CodexConfig::parse(&out).unwrap();
        assert_eq!(c.coffer_server_is(SHIM, Some("/h")), Some(true));
        assert_eq!(c.coffer_server_is(SHIM, None), Some(false));
        assert_eq!(c.coffer_server_is("/other", Some("/h")), Some(false));
        let mut c = c;
        assert!(c.remove_coffer_server().unwrap());
        assert_eq!(c.to_string(), text);
        assert!(!c.remove_coffer_server().unwrap());
    }

    #[test]
    fn inline_tables_and_errors() {
        let mut c = CodexConfig::parse("mcp_servers = { fs = { command = \"npx\" } }\n").unwrap();
        c.set_coffer_server(SHIM, None).unwrap();
        let out = c.to_string();
        assert!(out.contains("coffer = { command = ") && !out.contains("[mcp_servers"), "{out}");
        assert!(CodexConfig::parse("x = [").unwrap_err().starts_with("not valid TOML"));
        let mut bad = CodexConfig::parse("mcp_servers = 3").unwrap();
        assert_eq!(bad.set_coffer_server(SHIM, None).unwrap_err(), "mcp_servers is not a table");
        assert_eq!(bad.remove_coffer_server().unwrap_err(), "mcp_servers is not a table");
        let mut fresh = CodexConfig::parse("").unwrap();
        fresh.set_coffer_server(SHIM, None).unwrap();
        assert!(fresh.remove_coffer_server().unwrap());
        assert_eq!(fresh.to_string().trim(), "", "the implicit table goes with its last entry");
    }
}
