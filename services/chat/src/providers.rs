//! The agent-provider registry: every agent the chat service can drive, one [`Entry`] each.
//! Adding an agent is one line in [`builtin`] (or, for a test-only agent, one more entry handed
//! to [`crate::main_with`]); nothing else in the engine, the REST/SSE contract, the schema or the
//! CLI changes.
use std::path::PathBuf;
use std::sync::Arc;

use coffer_types::settings::Setting;

use coffer_proto::store as st;

use crate::adapter::{AgentEnv, AgentProvider, Availability, FailureKind, StartError};
use crate::binding::Binding;
use crate::config::Config;
use crate::connections::{Connections, ResolveError, Timeouts};

/// One registered agent: its provider, the setting that may name its CLI and the one that may
/// bind it to an LLM connection.
#[derive(Clone)]
pub struct Entry {
    /// The provider.
    pub provider: Arc<dyn AgentProvider>,
    /// The text setting holding an explicit CLI path (`chat.claude_code_path`), if any.
    pub path_setting: Option<&'static Setting>,
    /// The text setting naming the LLM connection the agent is bound to
    /// (`chat.claude_code_connection`), if the agent can be bound.
    pub connection_setting: Option<&'static Setting>,
    /// The setting that turns its vault sandbox off (`chat.claude_code_sandbox`); `None`:
    /// always sandboxed.
    pub sandbox_setting: Option<&'static Setting>,
}

impl Entry {
    /// An entry without a CLI-path, connection or sandbox setting.
    pub fn new(provider: Arc<dyn AgentProvider>) -> Self {
        Self { provider, path_setting: None, connection_setting: None, sandbox_setting: None }
    }

    /// With the setting that may turn its vault sandbox off.
    pub fn with_sandbox_setting(mut self, setting: &'static Setting) -> Self {
        self.sandbox_setting = Some(setting);
        self
    }

    /// With the setting that may name its CLI.
    pub fn with_path_setting(mut self, setting: &'static Setting) -> Self {
        self.path_setting = Some(setting);
        self
    }

    /// With the setting that may bind it to an LLM connection.
    pub fn with_connection_setting(mut self, setting: &'static Setting) -> Self {
        self.connection_setting = Some(setting);
        self
    }
}

/// An agent's binding as `ListAgents` shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BindingView {
    /// The connection's name (empty = the agent's own login).
    pub connection: String,
    /// The connection's model (empty when unbound or unknown).
    pub model: String,
    /// The connection's fast model.
    pub fast_model: String,
    /// The connection's wire word.
    pub wire: String,
    /// Why the binding cannot be used (the connection is missing, its wire does not fit), empty
    /// when it can (or when unbound).
    pub problem: String,
}

/// The agents Coffer ships, in display order. Each adapter adds one line here, e.g.
/// `Entry::new(Arc::new(claude_code::ClaudeCode::new())).with_path_setting(&CHAT_CLAUDE_CODE_PATH)`.
pub fn builtin() -> Vec<Entry> {
    use coffer_types::settings::{
        CHAT_CLAUDE_CODE_CONNECTION, CHAT_CLAUDE_CODE_PATH, CHAT_CLAUDE_CODE_SANDBOX, CHAT_CODEX_CONNECTION,
        CHAT_CODEX_PATH, CHAT_CODEX_SANDBOX,
    };
    vec![
        Entry::new(Arc::new(crate::claude_code::ClaudeCode::new()))
            .with_path_setting(&CHAT_CLAUDE_CODE_PATH)
            .with_connection_setting(&CHAT_CLAUDE_CODE_CONNECTION)
            .with_sandbox_setting(&CHAT_CLAUDE_CODE_SANDBOX),
        Entry::new(Arc::new(crate::codex::Codex::new()))
            .with_path_setting(&CHAT_CODEX_PATH)
            .with_connection_setting(&CHAT_CODEX_CONNECTION)
            .with_sandbox_setting(&CHAT_CODEX_SANDBOX),
    ]
}

/// The registry: the entries in display order, and what every provider may use.
pub struct Registry {
    entries: Vec<Entry>,
    home: PathBuf,
    shim: PathBuf,
    connections: Option<Connections>,
}

impl Registry {
    /// Over `entries` for the home at `home`; the shim that attaches Coffer's gateway to an
    /// agent is `coffer-mcp-shim` next to this binary (or on `PATH`).
    ///
    /// # Panics
    /// When two entries share an agent key (a programming error in the table).
    pub fn new(entries: Vec<Entry>, home: PathBuf) -> Self {
        for (i, e) in entries.iter().enumerate() {
            assert!(
                !entries[..i].iter().any(|o| o.provider.key() == e.provider.key()),
                "agent key {} registered twice",
                e.provider.key()
            );
        }
        let shim = coffer_runtime::connect::find_binary("coffer-mcp-shim", None).unwrap_or_else(|| {
            let exe = std::env::current_exe().unwrap_or_default();
            exe.parent().map_or_else(|| PathBuf::from("coffer-mcp-shim"), |d| d.join("coffer-mcp-shim"))
        });
        Self { entries, home, shim, connections: None }
    }

    /// With the store's connections, which bound agents' turns resolve (without them a bound
    /// agent's turn fails saying the connections cannot be read).
    pub fn with_connections(mut self, connections: Connections) -> Self {
        self.connections = Some(connections);
        self
    }

    /// Every entry, in display order.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The entry for `agent_key`.
    pub fn get(&self, agent_key: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| e.provider.key() == agent_key)
    }

    /// What `entry`'s provider gets under the settings in `config`.
    pub fn env(&self, entry: &Entry, config: &Config) -> AgentEnv {
        AgentEnv {
            coffer_home: self.home.clone(),
            agents_dir: self.home.join("agents"),
            shim: self.shim.clone(),
            command_override: entry.path_setting.and_then(|s| config.command_override(s)),
            binding: None,
            sandbox: entry.sandbox_setting.is_none_or(|s| config.switch(s)),
        }
    }

    /// The connection `entry`'s agent is bound to under `config`, if any.
    pub fn bound_to(&self, entry: &Entry, config: &Config) -> Option<String> {
        entry.connection_setting.and_then(|s| config.connection(s))
    }

    /// What `entry`'s provider gets for one turn: [`Registry::env`] plus its binding, resolved
    /// now (so a changed connection or key applies from the next turn on).
    ///
    /// # Errors
    /// [`StartError`] `provider` naming the connection and what to do when it does not exist, its
    /// credential is missing, it is unusable or the store cannot be read.
    pub async fn turn_env(&self, entry: &Entry, config: &Config) -> Result<AgentEnv, StartError> {
        let mut env = self.env(entry, config);
        let Some(name) = self.bound_to(entry, config) else { return Ok(env) };
        let setting = entry.connection_setting.map_or("", |s| s.key);
        let agent = entry.provider.display_name();
        let fail = |message: String| StartError { kind: FailureKind::Provider, message };
        let Some(connections) = &self.connections else {
            return Err(fail(format!(
                "{agent} is bound to the LLM connection {name:?} ({setting}), but this chat service cannot read connections"
            )));
        };
        match connections.get(&name, Timeouts::default()).await {
            Ok(resolved) => {
                env.binding = Some(Binding::of(&resolved));
                Ok(env)
            }
            Err(ResolveError::Store(status)) => {
                tracing::warn!(agent = entry.provider.key(), connection = %name, error = %status.message(), "Cannot resolve an agent's LLM connection.");
                Err(fail(format!(
                    "{agent} is bound to the LLM connection {name:?} ({setting}), which cannot be read now: the store did not answer; try again"
                )))
            }
            Err(e) => {
                Err(fail(format!("{agent} is bound ({setting}), but {e}; fix the connection or clear {setting}")))
            }
        }
    }

    /// How `entry`'s binding looks now, for `ListAgents` (no secret is read).
    pub fn binding_view(&self, entry: &Entry, config: &Config, known: &[st::LlmConnection]) -> BindingView {
        let Some(name) = self.bound_to(entry, config) else { return BindingView::default() };
        let Some(record) = known.iter().find(|c| c.name == name) else {
            return BindingView {
                connection: name.clone(),
                problem: format!("no LLM connection named {name:?} (see `coffer llm list`)"),
                ..Default::default()
            };
        };
        let wire = st::LlmWire::try_from(record.wire).unwrap_or(st::LlmWire::Unspecified);
        let problem = crate::binding::wire_problem(entry.provider.key(), &name, wire).unwrap_or_default();
        BindingView {
            connection: name,
            model: record.model.clone(),
            fast_model: record.fast_model.clone(),
            wire: wire.as_str().to_owned(),
            problem,
        }
    }

    /// Every connection record (for [`Registry::binding_view`]); empty when connections cannot be
    /// read (each bound agent then shows its connection name only).
    pub async fn connection_records(&self) -> Vec<st::LlmConnection> {
        match &self.connections {
            Some(c) => c.list().await.unwrap_or_default(),
            None => Vec::new(),
        }
    }

    /// Whether `entry`'s agent can be chosen now.
    pub fn availability(&self, entry: &Entry, config: &Config) -> Availability {
        entry.provider.availability(&self.env(entry, config))
    }
}
