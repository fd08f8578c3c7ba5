//! Provider switching for managed agents (ADR-032): a managed agent bound to an LLM connection
//! (`chat.claude_code_connection`, `chat.codex_connection`) runs its turns against that
//! connection's provider. This module turns a resolved connection ([`crate::connections`]) into a
//! [`Binding`] and a binding into what each CLI reads:
//!
//! - **Claude Code** ([`claude_env`]): `ANTHROPIC_BASE_URL` (the base without `/v1`, which the
//!   CLI appends), the key as `ANTHROPIC_API_KEY` (Claude Code sends it as `x-api-key`, the
//!   Anthropic Messages wire's own header; `ANTHROPIC_AUTH_TOKEN` would send it as a bearer
//!   token, which is a gateway's dialect, not this wire's), `ANTHROPIC_MODEL` = the connection's
//!   model and `ANTHROPIC_DEFAULT_HAIKU_MODEL` plus its older name `ANTHROPIC_SMALL_FAST_MODEL` =
//!   the fast model, when set. Only an `anthropic` connection can drive Claude Code. Variables
//!   the daemon inherited that would fight the binding ([`fights_claude_binding`]: every
//!   `ANTHROPIC_*`, the Bedrock/Vertex/Foundry switches, an OAuth token) are dropped from the
//!   CLI's environment, not duplicated.
//! - **Codex** ([`codex_provider`]): a `[model_providers.coffer-<name>]` entry in Coffer's
//!   `CODEX_HOME/config.toml` (written by [`crate::agents_config::with_binding`]) with `base_url`
//!   = the base plus `/v1`, `wire_api = "responses"` and `env_key` = [`CODEX_KEY_VAR`], a variable
//!   Coffer sets only in the CLI's environment; top-level `model_provider`/`model` select it.
//!   Codex 0.171 speaks only the Responses API (`wire_api = "chat"` "is no longer supported"),
//!   so it takes `openai-responses` and `ollama` (Ollama serves `/v1/responses`) connections and
//!   refuses `openai-chat` and `anthropic` ones with a message saying so.
//!
//! The key reaches a CLI only through its environment: never a file (the Codex entry names the
//! variable, not the value) and never a log ([`Binding`]'s `Debug` shows no secret).
use std::ffi::OsString;
use std::hash::{Hash, Hasher};

/// The wire of a connection (re-exported for callers that build a [`Binding`] by hand).
pub use coffer_llm::Wire;
use secrecy::{ExposeSecret, SecretString};

use crate::connections::Resolved;

/// The environment variable Coffer puts a bound Codex's key in (the `env_key` of its model
/// provider entry). Not `OPENAI_API_KEY`, so a user's own key never meets the binding's.
pub const CODEX_KEY_VAR: &str = "CODEX_COFFER_CONNECTION_KEY";

/// Placeholder `ANTHROPIC_API_KEY` for a bound Claude Code whose connection has no credential (a
/// local gateway that wants none): without a key the CLI would fall back to the user's own
/// claude.ai login and send its OAuth token to the connection's host.
pub const NO_KEY: &str = "coffer-connection-without-key";

/// A managed agent's binding to one LLM connection, resolved for one turn.
#[derive(Debug, Clone)]
pub struct Binding {
    /// The connection's name.
    pub connection: String,
    /// Its wire.
    pub wire: Wire,
    /// Its base URL without the API path (a trailing `/v1` removed).
    pub base: String,
    /// The credential's value, when the connection names one.
    pub secret: Option<SecretString>,
    /// The connection's model (empty = the agent's own default).
    pub model: String,
    /// The connection's fast model (empty = none).
    pub fast_model: String,
    /// Changes whenever anything the agent process was started with changes (connection, URL,
    /// models, key): a kept process is reused only for the same fingerprint.
    pub fingerprint: u64,
}

impl Binding {
    /// The binding of a resolved connection.
    pub fn of(resolved: &Resolved) -> Self {
        let r = &resolved.record;
        Self::new(
            &r.name,
            resolved.endpoint.wire,
            resolved.endpoint.base_url.as_str(),
            resolved.endpoint.secret.clone(),
            &r.model,
            &r.fast_model,
        )
    }

    /// A binding from its parts (`base` with or without a trailing `/v1`; models trimmed, empty =
    /// none).
    pub fn new(
        connection: &str,
        wire: Wire,
        base: &str,
        secret: Option<SecretString>,
        model: &str,
        fast_model: &str,
    ) -> Self {
        let base = base_without_v1(base.trim());
        let (model, fast_model) = (model.trim().to_owned(), fast_model.trim().to_owned());
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (connection, wire.as_str(), &base, &model, &fast_model).hash(&mut h);
        secret.as_ref().map(|s| s.expose_secret().to_owned()).hash(&mut h);
        Self {
            connection: connection.to_owned(),
            wire,
            base,
            secret,
            model,
            fast_model,
            fingerprint: h.finish().max(1),
        }
    }
}

/// The fingerprint of an optional binding (0 = unbound), for [`crate::kept::Fit`].
pub fn fingerprint(binding: Option<&Binding>) -> u64 {
    binding.map_or(0, |b| b.fingerprint)
}

/// `url` without a trailing slash and a trailing `/v1`.
fn base_without_v1(url: &str) -> String {
    let t = url.trim_end_matches('/');
    t.strip_suffix("/v1").unwrap_or(t).to_owned()
}

/// A binding an agent cannot use (the turn fails with this message, kind `provider`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{agent} is bound to the LLM connection {connection:?} ({wire}), but {agent} {needs}; bind it to another connection or clear {setting}"
)]
pub struct WrongWire {
    /// The agent (`Claude Code`).
    pub agent: &'static str,
    /// The connection.
    pub connection: String,
    /// The connection's wire word.
    pub wire: &'static str,
    /// What the agent needs.
    pub needs: &'static str,
    /// The setting that binds it.
    pub setting: &'static str,
}

/// Whether an inherited variable would fight a Claude Code binding (and is dropped when bound).
pub fn fights_claude_binding(key: &str) -> bool {
    key.starts_with("ANTHROPIC_")
        || matches!(
            key,
            "CLAUDE_CODE_USE_BEDROCK"
                | "CLAUDE_CODE_USE_VERTEX"
                | "CLAUDE_CODE_USE_FOUNDRY"
                | "CLAUDE_CODE_OAUTH_TOKEN"
                | "CLAUDE_CODE_SKIP_BEDROCK_AUTH"
                | "CLAUDE_CODE_SKIP_VERTEX_AUTH"
        )
}

/// The variables a bound Claude Code gets (see the module docs).
///
/// # Errors
/// [`WrongWire`] for a connection that is not `anthropic`.
pub fn claude_env(b: &Binding) -> Result<Vec<(&'static str, OsString)>, WrongWire> {
    if b.wire != Wire::Anthropic {
        return Err(WrongWire {
            agent: "Claude Code",
            connection: b.connection.clone(),
            wire: b.wire.as_str(),
            needs: "speaks only the Anthropic Messages API (an `anthropic` connection)",
            setting: "chat.claude_code_connection",
        });
    }
    let key = b.secret.as_ref().map_or_else(|| OsString::from(NO_KEY), |s| OsString::from(s.expose_secret()));
    let mut env = vec![("ANTHROPIC_BASE_URL", OsString::from(&b.base)), ("ANTHROPIC_API_KEY", key)];
    if !b.model.is_empty() {
        env.push(("ANTHROPIC_MODEL", OsString::from(&b.model)));
    }
    if !b.fast_model.is_empty() {
        env.push(("ANTHROPIC_DEFAULT_HAIKU_MODEL", OsString::from(&b.fast_model)));
        env.push(("ANTHROPIC_SMALL_FAST_MODEL", OsString::from(&b.fast_model)));
    }
    Ok(env)
}

/// The model provider entry a bound Codex runs with (no secret: `env_key` names the variable).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodexProvider {
    /// The entry's id under `model_providers` (`coffer-<connection>`).
    pub id: String,
    /// Its display name.
    pub name: String,
    /// `base_url`, with `/v1`.
    pub base_url: String,
    /// `wire_api` (`responses`).
    pub wire_api: &'static str,
    /// `env_key`, when the connection has a key.
    pub env_key: Option<&'static str>,
    /// The top-level `model` (empty = leave the user's).
    pub model: String,
}

/// The Codex model provider entry for `b`.
///
/// # Errors
/// [`WrongWire`] for an `anthropic` or `openai-chat` connection.
pub fn codex_provider(b: &Binding) -> Result<CodexProvider, WrongWire> {
    let needs = match b.wire {
        Wire::OpenAiResponses | Wire::Ollama => None,
        Wire::OpenAiChat => Some(
            "speaks only the OpenAI Responses API (this Codex refuses wire_api = \"chat\"): use an `openai-responses` or `ollama` connection",
        ),
        Wire::Anthropic => Some("speaks only the OpenAI Responses API (an `openai-responses` or `ollama` connection)"),
    };
    if let Some(needs) = needs {
        return Err(WrongWire {
            agent: "Codex",
            connection: b.connection.clone(),
            wire: b.wire.as_str(),
            needs,
            setting: "chat.codex_connection",
        });
    }
    Ok(CodexProvider {
        id: format!("coffer-{}", b.connection),
        name: format!("Coffer connection {}", b.connection),
        base_url: format!("{}/v1", b.base),
        wire_api: "responses",
        env_key: b.secret.is_some().then_some(CODEX_KEY_VAR),
        model: b.model.clone(),
    })
}

/// Why `agent_key`'s agent cannot use a connection of `wire` (the message a bound turn would fail
/// with), `None` when it can or when the agent is not one Coffer binds.
pub fn wire_problem(agent_key: &str, connection: &str, wire: coffer_proto::store::LlmWire) -> Option<String> {
    use coffer_proto::store::LlmWire as W;
    let wire = match wire {
        W::Anthropic => Wire::Anthropic,
        W::OpenaiResponses => Wire::OpenAiResponses,
        W::OpenaiChat => Wire::OpenAiChat,
        W::Ollama => Wire::Ollama,
        W::Unspecified => return Some(format!("the LLM connection {connection:?} has no wire")),
    };
    let b = Binding {
        connection: connection.to_owned(),
        wire,
        base: String::new(),
        secret: None,
        model: String::new(),
        fast_model: String::new(),
        fingerprint: 1,
    };
    match agent_key {
        "claude_code" => claude_env(&b).err().map(|e| e.to_string()),
        "codex" => codex_provider(&b).err().map(|e| e.to_string()),
        _ => None,
    }
}

/// The variables a bound Codex gets: its key under [`CODEX_KEY_VAR`], when it has one.
pub fn codex_env(b: &Binding) -> Vec<(&'static str, OsString)> {
    b.secret.iter().map(|s| (CODEX_KEY_VAR, OsString::from(s.expose_secret()))).collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use coffer_proto::store as st;

    /// A hand-made resolved connection (what `Connections::get` returns).
    pub(crate) fn resolved(name: &str, wire: Wire, base: &str, key: Option<&str>, model: &str, fast: &str) -> Resolved {
        Resolved {
            record: st::LlmConnection {
                name: name.into(),
                model: model.into(),
                fast_model: fast.into(),
                base_url: base.into(),
                ..Default::default()
            },
            endpoint: coffer_llm::Endpoint {
                wire,
                base_url: url::Url::parse(base).unwrap(),
                secret: key.map(SecretString::from),
                request_timeout: std::time::Duration::from_secs(60),
                stall_timeout: std::time::Duration::from_secs(30),
            },
        }
    }

    fn env_map(env: &[(&'static str, OsString)]) -> std::collections::HashMap<&'static str, String> {
        env.iter().map(|(k, v)| (*k, v.to_string_lossy().into_owned())).collect()
    }

    #[test]
    fn claude_code_gets_the_base_key_and_models() {
        let b = Binding::of(&resolved("work", Wire::Anthropic, "http://127.0.0.1:9/v1/", Some("sk-1"), "m1", "m2"));
        let env = env_map(&claude_env(&b).unwrap());
        assert_eq!(env["ANTHROPIC_BASE_URL"], "http://127.0.0.1:9", "no /v1: the CLI appends it");
        assert_eq!(env["ANTHROPIC_API_KEY"], "sk-1");
        assert_eq!(env["ANTHROPIC_MODEL"], "m1");
        assert_eq!(env["ANTHROPIC_DEFAULT_HAIKU_MODEL"], "m2");
        assert_eq!(env["ANTHROPIC_SMALL_FAST_MODEL"], "m2");
        assert!(!env.contains_key("ANTHROPIC_AUTH_TOKEN"));

        let bare = Binding::of(&resolved("local", Wire::Anthropic, "http://gw.local", None, "", ""));
        let env = env_map(&claude_env(&bare).unwrap());
        assert_eq!(env["ANTHROPIC_API_KEY"], NO_KEY, "never the user's own login towards another host");
        assert!(!env.contains_key("ANTHROPIC_MODEL") && !env.contains_key("ANTHROPIC_DEFAULT_HAIKU_MODEL"));
    }

    #[test]
    fn a_wire_the_agent_cannot_use_is_named() {
        let b = Binding::of(&resolved("oai", Wire::OpenAiResponses, "https://api.openai.com", Some("k"), "", ""));
        let e = claude_env(&b).unwrap_err().to_string();
        assert!(
            e.contains("\"oai\"") && e.contains("openai-responses") && e.contains("chat.claude_code_connection"),
            "{e}"
        );
        let chat = Binding::of(&resolved("vllm", Wire::OpenAiChat, "http://h:8000", None, "", ""));
        let e = codex_provider(&chat).unwrap_err().to_string();
        assert!(e.contains("\"vllm\"") && e.contains("openai-chat") && e.contains("chat.codex_connection"), "{e}");
        let ant = Binding::of(&resolved("a", Wire::Anthropic, "https://api.anthropic.com", Some("k"), "", ""));
        assert!(codex_provider(&ant).is_err());
    }

    #[test]
    fn codex_gets_a_provider_entry_without_the_key() {
        let b =
            Binding::of(&resolved("oai", Wire::OpenAiResponses, "http://127.0.0.1:7/v1", Some("sk-x"), "gpt-t", ""));
        let p = codex_provider(&b).unwrap();
        assert_eq!(p.id, "coffer-oai");
        assert_eq!(p.base_url, "http://127.0.0.1:7/v1");
        assert_eq!(p.wire_api, "responses");
        assert_eq!(p.env_key, Some(CODEX_KEY_VAR));
        assert_eq!(p.model, "gpt-t");
        assert!(!format!("{p:?}").contains("sk-x"));
        assert_eq!(env_map(&codex_env(&b))[CODEX_KEY_VAR], "sk-x");

        let ollama = Binding::of(&resolved("llama", Wire::Ollama, "http://127.0.0.1:11434", None, "qwen3", ""));
        let p = codex_provider(&ollama).unwrap();
        assert_eq!(p.base_url, "http://127.0.0.1:11434/v1");
        assert_eq!(p.env_key, None);
        assert!(codex_env(&ollama).is_empty());
    }

    #[test]
    fn the_fingerprint_follows_everything_the_process_was_started_with() {
        let a = Binding::of(&resolved("c", Wire::Anthropic, "http://h", Some("k1"), "m", ""));
        let same = Binding::of(&resolved("c", Wire::Anthropic, "http://h/", Some("k1"), "m", ""));
        let rotated = Binding::of(&resolved("c", Wire::Anthropic, "http://h", Some("k2"), "m", ""));
        let other_model = Binding::of(&resolved("c", Wire::Anthropic, "http://h", Some("k1"), "n", ""));
        assert_eq!(a.fingerprint, same.fingerprint);
        assert_ne!(a.fingerprint, rotated.fingerprint);
        assert_ne!(a.fingerprint, other_model.fingerprint);
        assert_ne!(a.fingerprint, 0);
        assert_eq!(fingerprint(None), 0);
        assert!(!format!("{a:?}").contains("k1"), "no secret in Debug");
    }

    #[test]
    fn wire_problems_are_per_agent() {
        use coffer_proto::store::LlmWire as W;
        assert_eq!(wire_problem("claude_code", "a", W::Anthropic), None);
        assert!(wire_problem("claude_code", "o", W::OpenaiResponses).unwrap().contains("Anthropic Messages"));
        assert_eq!(wire_problem("codex", "o", W::OpenaiResponses), None);
        assert_eq!(wire_problem("codex", "l", W::Ollama), None);
        assert!(wire_problem("codex", "c", W::OpenaiChat).unwrap().contains("Responses"));
        assert!(wire_problem("codex", "x", W::Unspecified).is_some());
        assert_eq!(wire_problem("scripted", "o", W::OpenaiChat), None);
    }

    #[test]
    fn inherited_variables_that_fight_are_known() {
        for k in ["ANTHROPIC_BASE_URL", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_USE_BEDROCK", "CLAUDE_CODE_OAUTH_TOKEN"] {
            assert!(fights_claude_binding(k), "{k}");
        }
        for k in ["PATH", "HOME", "CLAUDE_CONFIG_DIR", "CLAUDE_CODE_MAX_RETRIES"] {
            assert!(!fights_claude_binding(k), "{k}");
        }
    }
}
