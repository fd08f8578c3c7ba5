//! Bodies of `/v1/channels…`: the IM channels the owner drives conversations from. Secrets
//! (`bot_token`, `app_id`, `app_secret`, `signing_secret`) are write-only: they exist only on the
//! request types, which have no `Debug`; a channel says `credentials_set` (which have a value)
//! and the `*_ref` names, never a value.
use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A channel's platform. Named here for the document; the bodies carry the word as a string,
/// so that an unknown one gets the edge's message listing the known ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ChannelKind {
    /// Bot API long polling.
    Telegram,
    /// SeaTalk open platform webhooks (through coffer-callback).
    Seatalk,
}

/// The agent config of a channel's new conversations (the store allows only these keys).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "ChannelAgentConfig")]
pub struct AgentConfig {
    /// Absolute working directory (at most 4096 bytes); absent: the agent's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// 1-256 bytes; absent: the agent's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The permission mode of the conversations the channel creates: `bypass`, `ask` or
    /// `read_only`; absent: the agent's default (`chat.<agent>_permission_mode`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permission_mode: Option<String>,
}

/// The owner: the one chat a channel serves, set by pairing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "ChannelOwner")]
pub struct Owner {
    /// Telegram chat id; SeaTalk employee code.
    pub id: String,
    /// null: unknown.
    pub display: Option<String>,
    #[schemars(extend("format" = "date-time"))]
    pub paired_at: String,
}

/// A channel's pending pairing code.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "ChannelPairing")]
pub struct Pairing {
    /// A code is waiting (not expired, used or void).
    pub pending: bool,
    /// null: no code.
    #[schemars(extend("format" = "date-time"))]
    pub expires_at: Option<String>,
}

/// The adapter's live state, as coffer-chat reports it. Times are Unix ms, null for never.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "ChannelAdapter")]
pub struct Adapter {
    /// `running`, `backoff` (retrying at `retry_at_ms`), `restarting`, `stopped` or `failed`.
    pub state: String,
    /// Names the cause, never a secret; null: none.
    pub last_error: Option<String>,
    pub started_ms: Option<i64>,
    /// The last message received.
    pub last_inbound_ms: Option<i64>,
    /// The last message sent or edited.
    pub last_outbound_ms: Option<i64>,
    /// In backoff: the next attempt.
    pub retry_at_ms: Option<i64>,
    /// telegram: the bot's `@username` (without `@`); null: not known yet.
    pub bot_username: Option<String>,
}

/// A channel. Never a secret. The `*_ref`s of the kind are present (null when unset), those of
/// the other kind absent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Channel {
    /// `^[a-z0-9][a-z0-9-]{0,31}$`.
    pub name: String,
    /// One of the [`ChannelKind`] words.
    #[schemars(with = "ChannelKind")]
    pub kind: String,
    pub enabled: bool,
    /// null: the platform's public API.
    pub api_base_url: Option<String>,
    /// The agent of new conversations; null: claude_code.
    pub default_agent: Option<String>,
    /// null: the agent's defaults.
    pub agent_config: Option<AgentConfig>,
    /// Whether an owner is set (else every chat is refused).
    pub paired: bool,
    /// null: not paired.
    pub owner: Option<Owner>,
    pub pairing: Pairing,
    /// Bumped by every configuration write (not by pairing); the ETag.
    pub version: i64,
    #[schemars(extend("format" = "date-time"))]
    pub created_at: String,
    #[schemars(extend("format" = "date-time"))]
    pub updated_at: String,
    /// The adapter's live state from coffer-chat; null while it does not answer.
    pub adapter: Option<Adapter>,
    /// telegram: the bot token's credential.
    #[serde(default, deserialize_with = "crate::body::present", skip_serializing_if = "Option::is_none")]
    pub bot_token_ref: Option<Option<String>>,
    /// seatalk: the app id's credential.
    #[serde(default, deserialize_with = "crate::body::present", skip_serializing_if = "Option::is_none")]
    pub app_id_ref: Option<Option<String>>,
    /// seatalk: the app secret's credential.
    #[serde(default, deserialize_with = "crate::body::present", skip_serializing_if = "Option::is_none")]
    pub app_secret_ref: Option<Option<String>>,
    /// seatalk: the signing secret's credential.
    #[serde(default, deserialize_with = "crate::body::present", skip_serializing_if = "Option::is_none")]
    pub signing_secret_ref: Option<Option<String>>,
    /// Each of the kind's secrets (`bot_token`; `app_id`, `app_secret`, `signing_secret`):
    /// whether its credential has a value.
    pub credentials_set: BTreeMap<String, bool>,
}

impl Channel {
    /// The credential named by the `*_ref` of `secret` (`bot_token`, …), if set.
    pub fn credential_of(&self, secret: &str) -> Option<&str> {
        let r = match secret {
            "bot_token" => &self.bot_token_ref,
            "app_id" => &self.app_id_ref,
            "app_secret" => &self.app_secret_ref,
            "signing_secret" => &self.signing_secret_ref,
            _ => return None,
        };
        r.as_ref().and_then(|r| r.as_deref())
    }
}

/// `POST /v1/channels`: `telegram` needs `bot_token` or `bot_token_ref`; `seatalk` `app_id`,
/// `app_secret` and `signing_secret` (or their `*_ref`).
// No `Debug`: it may hold secrets.
#[derive(Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ChannelCreate {
    /// `^[a-z0-9][a-z0-9-]{0,31}$`.
    pub name: String,
    /// One of the [`ChannelKind`] words.
    #[schemars(with = "ChannelKind")]
    pub kind: String,
    /// Default true.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// telegram: the bot token from @BotFather; 1-65536 bytes, no control characters or
    /// surrounding whitespace; stored as a credential, never shown back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("writeOnly" = true))]
    pub bot_token: Option<String>,
    /// seatalk: the app id; as `bot_token`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("writeOnly" = true))]
    pub app_id: Option<String>,
    /// seatalk: the app secret; as `bot_token`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("writeOnly" = true))]
    pub app_secret: Option<String>,
    /// seatalk: the callback signing secret; as `bot_token`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("writeOnly" = true))]
    pub signing_secret: Option<String>,
    /// An existing credential holding (or, with `bot_token`, to hold) the bot token; absent:
    /// `channel-<name>-bot-token`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bot_token_ref: Option<String>,
    /// As `bot_token_ref` for the app id (`channel-<name>-app-id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app_id_ref: Option<String>,
    /// As `bot_token_ref` for the app secret (`channel-<name>-app-secret`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app_secret_ref: Option<String>,
    /// As `bot_token_ref` for the signing secret (`channel-<name>-signing-secret`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signing_secret_ref: Option<String>,
    /// Absolute http(s) URL, no query or fragment, at most 2048 bytes; absent: the public API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_base_url: Option<String>,
    /// An agent key (claude_code, codex); absent: claude_code.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_agent: Option<String>,
    /// Checked by the store (only `cwd`, an existing folder, and `model`), so its messages name
    /// `agent_config`; null or absent: the agent's defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<AgentConfig>")]
    pub agent_config: Option<Value>,
}

fn yes() -> bool {
    true
}

/// `PATCH /v1/channels/{name}`: absent fields stay; the `*_ref`s, `api_base_url`, `default_agent`
/// and `agent_config` set to null clear them. A secret replaces its credential's value (alone it
/// leaves the record's version as it is).
// No `Debug`: it may hold secrets.
#[derive(Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ChannelPatch {
    /// Only the current name (no rename).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Only the current kind (it cannot change).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<ChannelKind>")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// As in [`ChannelCreate`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("writeOnly" = true))]
    pub bot_token: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("writeOnly" = true))]
    pub app_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("writeOnly" = true))]
    pub app_secret: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("writeOnly" = true))]
    pub signing_secret: Option<String>,
    /// An existing credential holding the bot token.
    #[serde(default, deserialize_with = "crate::body::present", skip_serializing_if = "Option::is_none")]
    pub bot_token_ref: Option<Option<String>>,
    #[serde(default, deserialize_with = "crate::body::present", skip_serializing_if = "Option::is_none")]
    pub app_id_ref: Option<Option<String>>,
    #[serde(default, deserialize_with = "crate::body::present", skip_serializing_if = "Option::is_none")]
    pub app_secret_ref: Option<Option<String>>,
    #[serde(default, deserialize_with = "crate::body::present", skip_serializing_if = "Option::is_none")]
    pub signing_secret_ref: Option<Option<String>>,
    /// null: the public API.
    #[serde(default, deserialize_with = "crate::body::present", skip_serializing_if = "Option::is_none")]
    pub api_base_url: Option<Option<String>>,
    /// null: claude_code.
    #[serde(default, deserialize_with = "crate::body::present", skip_serializing_if = "Option::is_none")]
    pub default_agent: Option<Option<String>>,
    /// Replaces the whole config; null: the agent's defaults.
    #[serde(default, deserialize_with = "crate::body::present", skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<AgentConfig>")]
    pub agent_config: Option<Option<Value>>,
}

impl ChannelPatch {
    /// Whether it changes nothing.
    pub fn is_empty(&self) -> bool {
        self.name.is_none()
            && self.kind.is_none()
            && self.enabled.is_none()
            && self.bot_token.is_none()
            && self.app_id.is_none()
            && self.app_secret.is_none()
            && self.signing_secret.is_none()
            && self.bot_token_ref.is_none()
            && self.app_id_ref.is_none()
            && self.app_secret_ref.is_none()
            && self.signing_secret_ref.is_none()
            && self.api_base_url.is_none()
            && self.default_agent.is_none()
            && self.agent_config.is_none()
    }
}

/// `POST /v1/channels/{name}/pair` (the body is optional).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PairingRequest {
    /// How long the code is valid (seconds), 60-3600; default 600.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 60, max = 3600))]
    pub ttl_s: Option<u32>,
}

/// The answer of `POST /v1/channels/{name}/pair`: a fresh one-time code.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PairingCode {
    pub channel: String,
    /// 8 characters of Crockford base-32; shown once.
    pub code: String,
    #[schemars(extend("format" = "date-time"))]
    pub expires_at: String,
    /// How long the code is valid (seconds).
    pub ttl_s: u32,
    /// What to send, where, and until when.
    pub instruction: String,
    /// Why the code cannot arrive yet (the channel is disabled, its adapter not running); null
    /// when none.
    pub warning: Option<String>,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::schema::{Components, request, response};

    #[test]
    fn refs_of_the_other_kind_are_absent_and_unset_ones_null() {
        let v = json!({
            "name": "home", "kind": "telegram", "enabled": true, "api_base_url": null, "default_agent": null,
            "agent_config": {"cwd": "/w"}, "paired": false, "owner": null,
            "pairing": {"pending": false, "expires_at": null}, "version": 1, "created_at": "t", "updated_at": "t",
            "adapter": null, "bot_token_ref": null, "credentials_set": {"bot_token": false},
        });
        let c: Channel = serde_json::from_value(v.clone()).unwrap();
        assert_eq!((&c.bot_token_ref, &c.app_id_ref), (&Some(None), &None));
        assert_eq!(serde_json::to_string(&c).unwrap(), v.to_string(), "the same bytes, in the same order");
    }

    #[test]
    fn a_patch_tells_absent_from_null() {
        let p: ChannelPatch =
            crate::body::from_value(json!({"api_base_url": null, "agent_config": null, "enabled": false})).unwrap();
        assert_eq!((&p.api_base_url, &p.agent_config, &p.default_agent), (&Some(None), &Some(None), &None));
        assert_eq!(
            serde_json::to_value(&p).unwrap(),
            json!({"enabled": false, "api_base_url": null, "agent_config": null})
        );
        assert!(ChannelPatch::default().is_empty() && !p.is_empty());
    }

    #[test]
    fn secrets_are_write_only_and_never_in_an_answer() {
        let mut c = Components::new();
        response::<Channel>(&mut c);
        response::<PairingCode>(&mut c);
        request::<ChannelCreate>(&mut c);
        request::<ChannelPatch>(&mut c);
        let defs = c.finish();
        for secret in ["bot_token", "app_id", "app_secret", "signing_secret"] {
            for answer in ["Channel", "PairingCode", "ChannelAdapter", "ChannelOwner"] {
                assert!(defs[answer]["properties"].get(secret).is_none(), "{answer}.{secret}");
            }
            for body in ["ChannelCreate", "ChannelPatch"] {
                assert_eq!(defs[body]["properties"][secret]["writeOnly"], true, "{body}.{secret}");
            }
        }
    }
}
