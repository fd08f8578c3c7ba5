//! Chat's settings (`chat.*` rows of `coffer_types::settings`: the turn timeout, each agent's CLI
//! path and LLM connection binding, the attachment limits), read from the store's Settings service and kept current by
//! the shared follower ([`coffer_runtime::settings::follow`]).
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use coffer_types::settings::{self as s, Setting};
use tokio::sync::watch;

/// Every setting chat reads, with defaults applied for unset or unusable values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// A turn with no adapter event for this long ends with `turn_error{timeout}`
    /// (`chat.turn_timeout_s`).
    pub turn_timeout: Duration,
    /// An approval request not answered for this long is denied (`chat.approval_timeout_s`).
    pub approval_timeout: Duration,
    /// A turn that ran at least this long is announced with a new message in the channel that
    /// drives its conversation when it ends (`chat.notify_after_s`; zero: every turn).
    pub notify_after: Duration,
    /// What the `Llm` service's provider requests and the internal agent follow (`llm.*`).
    pub llm: LlmConfig,
    /// Whether turns record the files they changed (`chat.files_changed`).
    pub files_changed: bool,
    /// The files a message may attach (`chat.attachment_max_bytes`, `chat.attachment_max_files`).
    pub attachments: crate::attachments::Limits,
    /// The stored values of every text setting a provider may name (its CLI path).
    texts: HashMap<String, String>,
}

impl Default for Config {
    fn default() -> Self {
        Self::from_values(&HashMap::new())
    }
}

impl Config {
    /// From the store's flat settings map.
    pub fn from_values(values: &HashMap<String, String>) -> Self {
        let timeout =
            s::CHAT_TURN_TIMEOUT_S.value_or_default(values.get(s::CHAT_TURN_TIMEOUT_S.key).map(String::as_str));
        let texts =
            values.iter().filter(|(k, _)| k.starts_with("chat.")).map(|(k, v)| (k.clone(), v.clone())).collect();
        let int = |setting: &Setting| setting.value_or_default(values.get(setting.key).map(String::as_str));
        let attachments = crate::attachments::Limits {
            max_bytes: int(&s::CHAT_ATTACHMENT_MAX_BYTES),
            max_files: int(&s::CHAT_ATTACHMENT_MAX_FILES) as usize,
        };
        Self {
            turn_timeout: Duration::from_secs(timeout),
            approval_timeout: Duration::from_secs(int(&s::CHAT_APPROVAL_TIMEOUT_S)),
            notify_after: Duration::from_secs(int(&s::CHAT_NOTIFY_AFTER_S)),
            llm: LlmConfig::from_values(values),
            files_changed: int(&s::CHAT_FILES_CHANGED) != 0,
            attachments,
            texts,
        }
    }

    /// The CLI path a provider's setting names (`chat.claude_code_path`); `None` when unset,
    /// empty or not a valid value (then the provider resolves its command on `PATH`).
    pub fn command_override(&self, setting: &Setting) -> Option<PathBuf> {
        let v = setting.text_or_default(self.texts.get(setting.key).map(String::as_str));
        let v = v.trim();
        (!v.is_empty()).then(|| PathBuf::from(v))
    }

    /// The project picker's root (`chat.projects_root`); `None` when unset, empty or not an
    /// absolute path (then the user's home).
    pub fn projects_root(&self) -> Option<PathBuf> {
        let v = s::CHAT_PROJECTS_ROOT.text_or_default(self.texts.get(s::CHAT_PROJECTS_ROOT.key).map(String::as_str));
        let p = PathBuf::from(v.trim());
        p.is_absolute().then_some(p)
    }

    /// An on/off setting (`chat.claude_code_sandbox`): on unless its value is 0 (unset or
    /// unusable values take the default).
    pub fn switch(&self, setting: &Setting) -> bool {
        setting.value_or_default(self.texts.get(setting.key).map(String::as_str)) != 0
    }

    /// The permission mode a new conversation of `agent_key` gets when it names none
    /// (`chat.claude_code_permission_mode`, `chat.codex_permission_mode`; other agents:
    /// `bypass`).
    pub fn default_mode(&self, agent_key: &str) -> crate::adapter::PermissionMode {
        let setting = match agent_key {
            "claude_code" => &s::CHAT_CLAUDE_CODE_PERMISSION_MODE,
            "codex" => &s::CHAT_CODEX_PERMISSION_MODE,
            _ => return crate::adapter::PermissionMode::Bypass,
        };
        let v = setting.text_or_default(self.texts.get(setting.key).map(String::as_str));
        crate::adapter::PermissionMode::parse(&v).unwrap_or_default()
    }

    /// The LLM connection a provider's binding setting names (`chat.claude_code_connection`);
    /// `None` when unset or empty (the agent then runs on its own login and config).
    pub fn connection(&self, setting: &Setting) -> Option<String> {
        let v = setting.text_or_default(self.texts.get(setting.key).map(String::as_str));
        let v = v.trim();
        (!v.is_empty()).then(|| v.to_owned())
    }
}

/// The `llm.*` settings, defaults applied for unset or unusable values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LlmConfig {
    /// Until a provider's response headers (`llm.request_timeout_s`).
    pub request_timeout: Duration,
    /// Longest silence inside a provider's stream (`llm.stall_timeout_s`).
    pub stall_timeout: Duration,
    /// Model requests per internal-agent run (`llm.ask_max_iterations`).
    pub ask_max_iterations: u32,
    /// What one run sends the model at most, in tokens of about 4 characters
    /// (`llm.ask_context_tokens`).
    pub ask_context_tokens: u64,
}

impl Default for LlmConfig {
    fn default() -> Self {
        Self::from_values(&HashMap::new())
    }
}

impl LlmConfig {
    /// From the store's flat settings map.
    pub fn from_values(values: &HashMap<String, String>) -> Self {
        let read = |setting: &Setting| setting.value_or_default(values.get(setting.key).map(String::as_str));
        Self {
            request_timeout: Duration::from_secs(read(&s::LLM_REQUEST_TIMEOUT_S)),
            stall_timeout: Duration::from_secs(read(&s::LLM_STALL_TIMEOUT_S)),
            ask_max_iterations: u32::try_from(read(&s::LLM_ASK_MAX_ITERATIONS)).unwrap_or(u32::MAX),
            ask_context_tokens: read(&s::LLM_ASK_CONTEXT_TOKENS),
        }
    }

    /// The timeouts a resolved endpoint gets.
    pub fn timeouts(&self) -> crate::connections::Timeouts {
        crate::connections::Timeouts { request: self.request_timeout, stall: self.stall_timeout }
    }
}

/// A shared, current [`Config`].
pub type ConfigRx = watch::Receiver<Arc<Config>>;

pub use coffer_runtime::settings::follow;

impl coffer_runtime::settings::FromSettings for Config {
    fn from_settings(values: &HashMap<String, String>) -> Self {
        Self::from_values(values)
    }

    fn log_in_force(&self) {
        tracing::info!(
            turn_timeout_s = self.turn_timeout.as_secs(),
            notify_after_s = self.notify_after.as_secs(),
            "Chat settings in force."
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_values() {
        let c = Config::default();
        assert_eq!(c.turn_timeout, Duration::from_secs(600));
        assert_eq!(c.notify_after, Duration::from_secs(30));
        assert_eq!(
            Config::from_values(&HashMap::from([("chat.notify_after_s".to_owned(), "0".to_owned())])).notify_after,
            Duration::ZERO
        );
        assert_eq!(c.command_override(&s::CHAT_CLAUDE_CODE_PATH), None);
        let values = HashMap::from([
            ("chat.turn_timeout_s".to_owned(), "3".to_owned()),
            ("chat.codex_path".to_owned(), " /opt/codex ".to_owned()),
            ("chat.claude_code_path".to_owned(), String::new()),
        ]);
        let c = Config::from_values(&values);
        assert_eq!(c.turn_timeout, Duration::from_secs(3));
        assert_eq!(c.command_override(&s::CHAT_CODEX_PATH), Some(PathBuf::from("/opt/codex")));
        assert_eq!(c.command_override(&s::CHAT_CLAUDE_CODE_PATH), None);
        let bad = HashMap::from([("chat.turn_timeout_s".to_owned(), "0".to_owned())]);
        assert_eq!(Config::from_values(&bad).turn_timeout, Duration::from_secs(600), "out of bounds: default");
        assert_eq!(c.approval_timeout, Duration::from_secs(600));
        use crate::adapter::PermissionMode as M;
        assert_eq!((c.default_mode("claude_code"), c.default_mode("scripted")), (M::Bypass, M::Bypass));
        let modes = HashMap::from([
            ("chat.claude_code_permission_mode".to_owned(), "ask".to_owned()),
            ("chat.codex_permission_mode".to_owned(), "sometimes".to_owned()),
            ("chat.approval_timeout_s".to_owned(), "2".to_owned()),
        ]);
        let c = Config::from_values(&modes);
        assert_eq!((c.default_mode("claude_code"), c.default_mode("codex")), (M::Ask, M::Bypass));
        assert_eq!(c.approval_timeout, Duration::from_secs(2));
    }

    #[test]
    fn connections_are_followed_by_setting() {
        assert_eq!(Config::default().connection(&s::CHAT_CLAUDE_CODE_CONNECTION), None);
        let values = HashMap::from([
            ("chat.claude_code_connection".to_owned(), " work ".to_owned()),
            ("chat.codex_connection".to_owned(), "  ".to_owned()),
        ]);
        let c = Config::from_values(&values);
        assert_eq!(c.connection(&s::CHAT_CLAUDE_CODE_CONNECTION).as_deref(), Some("work"));
        assert_eq!(c.connection(&s::CHAT_CODEX_CONNECTION), None, "blank = the CLI's own login");
        let other =
            Config::from_values(&HashMap::from([("chat.claude_code_connection".to_owned(), "home".to_owned())]));
        assert_ne!(c, other, "a change of binding is a change of config");
    }

    #[test]
    fn llm_settings_and_their_defaults() {
        let d = LlmConfig::default();
        assert_eq!(d.request_timeout, Duration::from_secs(60));
        assert_eq!(d.stall_timeout, Duration::from_secs(30));
        assert_eq!(d.ask_max_iterations, 8);
        assert_eq!(d.ask_context_tokens, 32_000);
        let values = HashMap::from([
            ("llm.request_timeout_s".to_owned(), "5".to_owned()),
            ("llm.stall_timeout_s".to_owned(), "2".to_owned()),
            ("llm.ask_max_iterations".to_owned(), "3".to_owned()),
            ("llm.ask_context_tokens".to_owned(), "not a number".to_owned()),
        ]);
        let c = Config::from_values(&values).llm;
        assert_eq!(c.timeouts().request, Duration::from_secs(5));
        assert_eq!(c.timeouts().stall, Duration::from_secs(2));
        assert_eq!(c.ask_max_iterations, 3);
        assert_eq!(c.ask_context_tokens, 32_000, "unusable: default");
    }
}
