//! Channel resources' field rules and words, defined once for the store (which enforces them on
//! every write), the edge (REST bodies) and the CLI: the name pattern, the kinds, which
//! credential references each kind needs, the credentials a write-once secret is stored under,
//! the agent-config keys and the pairing code's alphabet and limits.
//! The record itself is `coffer.store.v1.ChannelRecord` (`proto/store_channels.proto`).

/// The kind words, as REST bodies, the database and the CLI spell them
/// (`coffer_proto::store::ChannelKind::{as_str, parse}` holds the same list).
pub const KINDS: &[&str] = &["telegram", "seatalk"];

/// Longest channel name (bytes).
pub const MAX_NAME_LEN: usize = 32;
/// Longest `default_agent` (bytes).
pub const MAX_AGENT_LEN: usize = 32;
/// Longest `agent_config_json` (bytes).
pub const MAX_AGENT_CONFIG_LEN: usize = 8192;
/// Longest `agent_config_json.cwd` (bytes).
pub const MAX_CWD_LEN: usize = 4096;
/// Longest owner id a claim may carry (bytes): a Telegram chat id, a SeaTalk employee code.
pub const MAX_OWNER_ID_LEN: usize = 128;
/// Longest owner display name kept (characters); longer ones are cut.
pub const MAX_OWNER_DISPLAY_CHARS: usize = 128;
/// Longest event id `RecordEvent` accepts (bytes).
pub const MAX_EVENT_ID_LEN: usize = 256;
/// Seen events kept per channel (the newest).
pub const MAX_EVENTS_KEPT: usize = 10_000;

/// Pairing code length (characters of Crockford base-32: 40 random bits).
pub const PAIRING_CODE_LEN: usize = 8;
/// Crockford's base-32 alphabet (no I, L, O, U).
pub const PAIRING_ALPHABET: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";
/// Wrong tries that void a pending code (the fifth wrong one voids it).
pub const PAIRING_MAX_WRONG_TRIES: u32 = 5;
/// Pairing code lifetime when the request names none (seconds).
pub const PAIRING_TTL_DEFAULT_S: u32 = 600;
/// Shortest and longest pairing code lifetimes (seconds).
pub const PAIRING_TTL_MIN_S: u32 = 60;
pub const PAIRING_TTL_MAX_S: u32 = 3600;

/// The secret fields a REST body may carry once (`bot_token`, …) and the record's reference
/// field each one fills, per kind: `(kind, secret field, ref field, credential suffix)`.
pub const SECRET_FIELDS: &[(&str, &str, &str, &str)] = &[
    ("telegram", "bot_token", "bot_token_ref", "bot-token"),
    ("seatalk", "app_id", "app_id_ref", "app-id"),
    ("seatalk", "app_secret", "app_secret_ref", "app-secret"),
    ("seatalk", "signing_secret", "signing_secret_ref", "signing-secret"),
];

/// The credential reference fields `kind` needs (all required), or `None` for an unknown kind.
pub fn required_refs(kind: &str) -> Option<Vec<&'static str>> {
    KINDS.contains(&kind).then(|| SECRET_FIELDS.iter().filter(|f| f.0 == kind).map(|f| f.2).collect())
}

/// The credential a secret given in field `secret` (e.g. `bot_token`) for channel `name` is
/// stored under when the body names none: `channel-<name>-<suffix>` (e.g.
/// `channel-home-bot-token`; a valid credential name for every valid channel name), or `None`
/// for a field that is not a channel secret.
pub fn generated_credential(name: &str, secret: &str) -> Option<String> {
    SECRET_FIELDS.iter().find(|f| f.1 == secret).map(|f| format!("channel-{name}-{}", f.3))
}

/// Checks a channel name: `^[a-z0-9][a-z0-9-]{0,31}$`.
///
/// # Errors
/// A message naming the field and the rule.
pub fn check_name(name: &str) -> Result<(), String> {
    let ok_chars = name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    let ok_first = name.bytes().next().is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if name.is_empty() || name.len() > MAX_NAME_LEN || !ok_chars || !ok_first {
        return Err(format!(
            "name {:?} is invalid: use 1-{MAX_NAME_LEN} characters a-z, 0-9 and '-', starting with a letter or digit",
            shown(name, 40)
        ));
    }
    Ok(())
}

/// Checks a `default_agent` (empty = the default agent): `^[a-z][a-z0-9_-]{0,31}$` (an agent
/// key such as `claude_code`, `codex`; whether such an agent exists is coffer-chat's to say).
///
/// # Errors
/// A message naming `default_agent` and the rule.
pub fn check_agent(agent: &str) -> Result<(), String> {
    if agent.is_empty() {
        return Ok(());
    }
    let ok_chars = agent.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
    let ok_first = agent.bytes().next().is_some_and(|b| b.is_ascii_lowercase());
    if agent.len() > MAX_AGENT_LEN || !ok_chars || !ok_first {
        return Err(format!(
            "default_agent {:?} is invalid: use an agent key of 1-{MAX_AGENT_LEN} characters a-z, 0-9, '_' and '-' \
             (e.g. claude_code, codex)",
            shown(agent, 40)
        ));
    }
    Ok(())
}

/// A pairing code as a chat typed it, in canonical form: surrounding space trimmed, `-` and
/// inner spaces dropped, upper-cased, and Crockford's look-alikes read as digits (`O` → `0`,
/// `I`/`L` → `1`). Not validated: a code that is not 8 alphabet characters simply matches no
/// digest.
pub fn normalize_code(code: &str) -> String {
    code.trim()
        .chars()
        .filter(|c| *c != '-' && *c != ' ')
        .map(|c| match c.to_ascii_uppercase() {
            'O' => '0',
            'I' | 'L' => '1',
            c => c,
        })
        .collect()
}

fn shown(s: &str, n: usize) -> String {
    if s.chars().count() <= n { s.to_owned() } else { format!("{}…", s.chars().take(n).collect::<String>()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for ok in ["a", "home", "tg-1", "0", &"x".repeat(32)] {
            check_name(ok).unwrap();
        }
        for bad in ["", "-a", "A", "a_b", "../x", "a/b", "a b", &"x".repeat(33), "é"] {
            let e = check_name(bad).unwrap_err();
            assert!(e.starts_with("name ") && e.contains("is invalid"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn agents() {
        for ok in ["", "claude_code", "codex", "a-b"] {
            check_agent(ok).unwrap();
        }
        for bad in ["Codex", "_a", "1a", "a b", &"a".repeat(33)] {
            assert!(check_agent(bad).unwrap_err().starts_with("default_agent "), "{bad:?}");
        }
    }

    #[test]
    fn refs_and_generated_credentials() {
        assert_eq!(required_refs("telegram").unwrap(), ["bot_token_ref"]);
        assert_eq!(required_refs("seatalk").unwrap(), ["app_id_ref", "app_secret_ref", "signing_secret_ref"]);
        assert!(required_refs("slack").is_none());
        assert_eq!(generated_credential("home", "bot_token").as_deref(), Some("channel-home-bot-token"));
        assert_eq!(generated_credential("w", "signing_secret").as_deref(), Some("channel-w-signing-secret"));
        assert!(generated_credential("w", "api_key").is_none());
    }

    #[test]
    fn codes_normalize() {
        assert_eq!(normalize_code("  7kq2-m9xd \n"), "7KQ2M9XD");
        assert_eq!(normalize_code("o1il"), "0111");
        assert!(PAIRING_ALPHABET.iter().all(|c| !b"ILOU".contains(c)));
    }
}
