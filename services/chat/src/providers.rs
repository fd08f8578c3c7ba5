//! The agent-provider registry: every agent the chat service can drive, one [`Entry`] each.
//! Adding an agent is one line in [`builtin`] (or, for a test-only agent, one more entry handed
//! to [`crate::main_with`]); nothing else in the engine, the REST/SSE contract, the schema or the
//! CLI changes.
use std::path::PathBuf;
use std::sync::Arc;

use coffer_types::settings::Setting;

use crate::adapter::{AgentEnv, AgentProvider, Availability};
use crate::config::Config;

/// One registered agent: its provider and the setting that may name its CLI.
#[derive(Clone)]
pub struct Entry {
    /// The provider.
    pub provider: Arc<dyn AgentProvider>,
    /// The text setting holding an explicit CLI path (`chat.claude_code_path`), if any.
    pub path_setting: Option<&'static Setting>,
}

impl Entry {
    /// An entry without a CLI-path setting.
    pub fn new(provider: Arc<dyn AgentProvider>) -> Self {
        Self { provider, path_setting: None }
    }

    /// With the setting that may name its CLI.
    pub fn with_path_setting(mut self, setting: &'static Setting) -> Self {
        self.path_setting = Some(setting);
        self
    }
}

/// The agents Coffer ships, in display order. Each adapter adds one line here, e.g.
/// `Entry::new(Arc::new(claude_code::ClaudeCode::new())).with_path_setting(&CHAT_CLAUDE_CODE_PATH)`.
pub fn builtin() -> Vec<Entry> {
    use coffer_types::settings::{CHAT_CLAUDE_CODE_PATH, CHAT_CODEX_PATH};
    vec![
        Entry::new(Arc::new(crate::claude_code::ClaudeCode::new())).with_path_setting(&CHAT_CLAUDE_CODE_PATH),
        Entry::new(Arc::new(crate::codex::Codex::new())).with_path_setting(&CHAT_CODEX_PATH),
    ]
}

/// The registry: the entries in display order, and what every provider may use.
pub struct Registry {
    entries: Vec<Entry>,
    home: PathBuf,
    shim: PathBuf,
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
        Self { entries, home, shim }
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
        }
    }

    /// Whether `entry`'s agent can be chosen now.
    pub fn availability(&self, entry: &Entry, config: &Config) -> Availability {
        entry.provider.availability(&self.env(entry, config))
    }
}
