//! LLM connections' field rules and words, defined once for the store (which enforces them on
//! every write), the edge (which checks an unsaved draft before probing it) and the CLI (which
//! spells the wires in its help): the name pattern, the base-URL rule, the model-id rule, the
//! wire words and the name of the credential an `api_key` is stored under.
//! The record itself is `coffer.store.v1.LlmConnection` (`proto/store_llm.proto`).

/// The wire words, as REST bodies, the database and the CLI spell them (`coffer_proto::store::
/// LlmWire::{as_str, parse}` holds the same list; a test there keeps them equal).
pub const WIRES: &[&str] = &["anthropic", "openai-responses", "openai-chat", "ollama"];

/// Short spellings the CLI accepts for a wire: `openai` is the Responses API.
pub const WIRE_ALIASES: &[(&str, &str)] = &[("openai", "openai-responses")];

/// Longest connection name (bytes).
pub const MAX_NAME_LEN: usize = 32;
/// Longest base URL (bytes).
pub const MAX_BASE_URL_LEN: usize = 2048;
/// Longest model id (bytes).
pub const MAX_MODEL_LEN: usize = 256;
/// Longest API key a body may carry (bytes): the credential store's value limit.
pub const MAX_API_KEY_LEN: usize = 65_536;

/// The wire word `word` names (an alias resolved), or `None`.
pub fn wire_word(word: &str) -> Option<&'static str> {
    WIRES
        .iter()
        .copied()
        .find(|w| *w == word)
        .or_else(|| WIRE_ALIASES.iter().find(|(a, _)| *a == word).map(|(_, w)| *w))
}

/// The credential an `api_key` given for connection `name` is stored under when the connection
/// names none: `llm-<name>` (a valid credential name for every valid connection name).
pub fn generated_credential(name: &str) -> String {
    format!("llm-{name}")
}

/// Names no connection may take: they are REST paths for unsaved drafts
/// (`POST /v1/llm/connections/test`, `POST /v1/llm/connections/models`).
pub const RESERVED_NAMES: &[&str] = &["test", "models"];

/// Checks a connection name: `^[a-z0-9][a-z0-9-]{0,31}$`, not one of [`RESERVED_NAMES`].
///
/// # Errors
/// A message naming the field and the rule.
pub fn check_name(name: &str) -> Result<(), String> {
    if RESERVED_NAMES.contains(&name) {
        return Err(format!(
            "name {name:?} is reserved (POST /v1/llm/connections/{name} probes an unsaved connection); choose another"
        ));
    }
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

/// Checks a base URL (callers treat empty as "the wire's public API" before calling this): an
/// absolute `http`/`https` URL with a host, no user name or password (a key belongs in a
/// credential), no query or fragment, no spaces or control characters, at most
/// [`MAX_BASE_URL_LEN`] bytes.
///
/// # Errors
/// A message naming `base_url` and the rule that failed.
pub fn check_base_url(base_url: &str) -> Result<(), String> {
    check_url("base_url", base_url)
}

/// [`check_base_url`]'s rule for any field that holds an API base URL (`base_url`,
/// a channel's `api_base_url`); the messages name `field`.
///
/// # Errors
/// A message naming `field` and the rule that failed.
pub fn check_url(field: &str, base_url: &str) -> Result<(), String> {
    let bad = |why: &str| format!("{field} {:?} {why}", shown(base_url, 80));
    if base_url.len() > MAX_BASE_URL_LEN {
        return Err(format!("{field} is {} bytes; at most {MAX_BASE_URL_LEN} are allowed", base_url.len()));
    }
    // The URL parser silently drops tabs and newlines and trims spaces: refuse them first, so
    // the stored text is exactly what was checked.
    if base_url.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(bad("contains a space or a control character"));
    }
    let u = url::Url::parse(base_url).map_err(|e| bad(&format!("is not an absolute URL ({e})")))?;
    if !matches!(u.scheme(), "http" | "https") {
        return Err(bad("must start with http:// or https://"));
    }
    if u.host_str().is_none_or(str::is_empty) {
        return Err(bad("has no host"));
    }
    if !u.username().is_empty() || u.password().is_some() {
        return Err(format!(
            "{field} must not carry a user name or password: put the key in the {}'s credential",
            if field == "base_url" { "connection" } else { "channel" }
        ));
    }
    if u.query().is_some() {
        return Err(bad("must not have a query (?…)"));
    }
    if u.fragment().is_some() {
        return Err(bad("must not have a fragment (#…)"));
    }
    Ok(())
}

/// Checks a model id in `field` (`model`, `fast_model`): 1-[`MAX_MODEL_LEN`] bytes, no control
/// characters.
///
/// # Errors
/// A message naming the field and the rule.
pub fn check_model(field: &str, model: &str) -> Result<(), String> {
    if model.is_empty() || model.len() > MAX_MODEL_LEN {
        return Err(format!("{field} must be 1-{MAX_MODEL_LEN} bytes, not {}", model.len()));
    }
    if model.chars().any(char::is_control) {
        return Err(format!("{field} must not contain control characters"));
    }
    Ok(())
}

/// Checks an API key about to become a credential value: 1-[`MAX_API_KEY_LEN`] bytes, no NUL,
/// no line break (a pasted key with a trailing newline would fail at the provider). The message
/// never quotes the key.
///
/// # Errors
/// A message naming `api_key` and the rule.
pub fn check_api_key(key: &str) -> Result<(), String> {
    if key.is_empty() || key.len() > MAX_API_KEY_LEN {
        return Err(format!("api_key must be 1-{MAX_API_KEY_LEN} bytes, not {}", key.len()));
    }
    if key.chars().any(char::is_control) {
        return Err("api_key must not contain control characters (a trailing newline?)".into());
    }
    Ok(())
}

fn shown(s: &str, n: usize) -> String {
    if s.chars().count() <= n { s.to_owned() } else { format!("{}…", s.chars().take(n).collect::<String>()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for ok in ["a", "claude", "local-ollama-2", "0x", &"a".repeat(32)] {
            check_name(ok).unwrap();
            // The credential store's names: at most 64 bytes of [A-Za-z0-9_.-], a letter or digit first.
            let cred = generated_credential(ok);
            assert!(cred.len() <= 64 && cred.starts_with("llm-"), "{cred}");
        }
        assert!(check_name("test").unwrap_err().contains("reserved"));
        assert!(check_name("models").unwrap_err().contains("reserved"));
        check_name("test-1").unwrap();
        for bad in ["", "A", "a_b", "-a", "a b", "é", &"a".repeat(33), "a/b", "a\0"] {
            let m = check_name(bad).unwrap_err();
            assert!(m.starts_with("name ") && m.contains("a-z, 0-9 and '-'"), "{bad:?}: {m}");
        }
    }

    #[test]
    fn wires() {
        assert_eq!(wire_word("anthropic"), Some("anthropic"));
        assert_eq!(wire_word("openai"), Some("openai-responses"));
        assert_eq!(wire_word("openai-chat"), Some("openai-chat"));
        assert_eq!(wire_word("gemini"), None);
        assert_eq!(wire_word(""), None);
    }

    #[test]
    fn base_urls() {
        for ok in ["http://127.0.0.1:11434", "https://api.example.com/v1/", "http://[::1]:8080/openai", "http://h"] {
            check_base_url(ok).unwrap();
        }
        let cases: &[(&str, &str)] = &[
            ("not a url", "space or a control character"),
            ("localhost:11434", "must start with http"),
            ("ftp://host/x", "must start with http"),
            ("/v1/models", "not an absolute URL"),
            ("http://", "not an absolute URL"),
            ("https://host/v1?key=abc", "query"),
            ("https://host/v1#frag", "fragment"),
            ("https://user:pw@host/", "user name or password"),
            ("https://host/\nx", "control character"),
            ("https://host/\tx", "control character"),
            (" https://host/", "space"),
            ("file:///etc/passwd", "must start with http"),
        ];
        for (bad, want) in cases {
            let m = check_base_url(bad).unwrap_err();
            assert!(m.contains(want) && m.starts_with("base_url"), "{bad:?}: {m}");
        }
        let long = format!("https://host/{}", "a".repeat(MAX_BASE_URL_LEN));
        assert!(check_base_url(&long).unwrap_err().contains("at most 2048"));
        let exact = format!("https://h/{}", "a".repeat(MAX_BASE_URL_LEN - 10));
        assert_eq!(exact.len(), MAX_BASE_URL_LEN);
        check_base_url(&exact).unwrap();
    }

    #[test]
    fn models_and_keys() {
        check_model("model", "claude-sonnet-4-5").unwrap();
        check_model("model", &"m".repeat(256)).unwrap();
        assert_eq!(check_model("model", "").unwrap_err(), "model must be 1-256 bytes, not 0");
        assert_eq!(check_model("fast_model", &"m".repeat(257)).unwrap_err(), "fast_model must be 1-256 bytes, not 257");
        assert!(check_model("model", "a\u{7}b").unwrap_err().contains("control"));
        check_api_key("sk-ant-123").unwrap();
        let e = check_api_key("sk-secret-value\n").unwrap_err();
        assert!(e.contains("control") && !e.contains("sk-secret"), "{e}");
        assert!(check_api_key("").is_err());
        assert!(check_api_key(&"k".repeat(MAX_API_KEY_LEN + 1)).is_err());
    }
}
