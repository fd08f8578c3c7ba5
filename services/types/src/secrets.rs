//! Telling secrets from ordinary configuration values: which `env` variables and HTTP headers of
//! an MCP server registration should live in the encrypted credential store rather than in the
//! registry in plaintext. Shared by `coffer mcp import` (the gateway moves such values into
//! credentials) and `coffer mcp add` (the CLI does the same before it registers the server).
//!
//! The rules are heuristics, tuned to err on the side of a credential: a value that is moved
//! needlessly still works (the server gets it from the store), a secret left in the registry is
//! readable by `coffer mcp show` and sits in the database's WAL.
use std::collections::HashMap;

/// Words in an `env` or header name that make its value a secret (matched case-insensitively
/// anywhere in the name).
pub const SECRET_WORDS: &[&str] = &["token", "key", "secret", "password", "passwd", "auth", "credential"];
/// Prefixes of well-known token formats (GitHub, GitLab, OpenAI/Anthropic/Stripe, Slack, AWS,
/// Google, npm, Hugging Face, PyPI, Shopify).
pub const TOKEN_PREFIXES: &[&str] = &[
    "ghp_",
    "gho_",
    "ghu_",
    "ghs_",
    "ghr_",
    "github_pat_",
    "glpat-",
    "sk-",
    "sk_live_",
    "sk_test_",
    "rk_live_",
    "xoxb-",
    "xoxp-",
    "xoxa-",
    "xoxs-",
    "xapp-",
    "AKIA",
    "ASIA",
    "AIza",
    "npm_",
    "hf_",
    "pypi-",
    "shpat_",
];
/// Authorization schemes whose value is a credential (matched case-insensitively).
pub const AUTH_SCHEMES: &[&str] = &["bearer ", "basic ", "token "];
/// Shortest unlabelled string that counts as a token on entropy alone.
pub const ENTROPY_MIN_LEN: usize = 32;
/// Shannon entropy (bits per character) from which such a string counts as a token.
pub const ENTROPY_MIN_BITS: f64 = 3.5;

/// True when the `env` variable or header `key` with `value` should go to the credential store:
/// its name contains one of [`SECRET_WORDS`] (case-insensitive), or the value looks like a
/// token ([`looks_like_token`]). Empty values are never secrets.
pub fn is_secret(key: &str, value: &str) -> bool {
    if value.is_empty() {
        return false;
    }
    let k = key.to_ascii_lowercase();
    SECRET_WORDS.iter().any(|w| k.contains(w)) || looks_like_token(value)
}

/// True for a value that looks like a credential whatever it is called: a well-known token
/// prefix ([`TOKEN_PREFIXES`]) followed by at least 8 more characters, an authorization scheme
/// (`Bearer …`), or a long ([`ENTROPY_MIN_LEN`]+), unbroken, high-entropy string of letters
/// and digits that is not a path or URL.
pub fn looks_like_token(value: &str) -> bool {
    let v = value.trim();
    if TOKEN_PREFIXES.iter().any(|p| v.len() >= p.len() + 8 && v.starts_with(p) && !v.contains(char::is_whitespace)) {
        return true;
    }
    let lower = v.to_ascii_lowercase();
    if AUTH_SCHEMES.iter().any(|s| lower.starts_with(s) && v.len() > s.len() + 3) {
        return true;
    }
    let charset = v.bytes().all(|b| b.is_ascii_alphanumeric() || b"+/=_-.".contains(&b));
    let pathish = v.starts_with(['/', '.', '~']) || v.contains("://");
    let mixed = v.bytes().any(|b| b.is_ascii_digit()) && v.bytes().any(|b| b.is_ascii_alphabetic());
    v.len() >= ENTROPY_MIN_LEN && charset && !pathish && mixed && entropy_bits(v) >= ENTROPY_MIN_BITS
}

/// Shannon entropy of `s` in bits per character.
pub fn entropy_bits(s: &str) -> f64 {
    let mut counts: HashMap<u8, usize> = HashMap::new();
    for b in s.bytes() {
        *counts.entry(b).or_default() += 1;
    }
    let n = s.len() as f64;
    counts.values().map(|&c| c as f64 / n).map(|p| -p * p.log2()).sum()
}

/// Longest credential name (the store's rule: `^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`).
pub const MAX_CREDENTIAL_NAME: usize = 64;

/// The credential name for variable (or header) `var` of server `server`: `<server>-<var>`,
/// characters the credential store refuses replaced by `_`, at most [`MAX_CREDENTIAL_NAME`].
pub fn credential_name(server: &str, var: &str) -> String {
    let var: String =
        var.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') { c } else { '_' }).collect();
    let mut name = format!("{server}-{var}");
    name.truncate(MAX_CREDENTIAL_NAME);
    name
}

/// `base` with the first suffix `-2`, `-3`, … that `taken` refuses, cut to fit `max` characters
/// (a credential or server name that must not replace an existing one).
pub fn unique(base: &str, max: usize, taken: impl Fn(&str) -> bool) -> String {
    (2..)
        .map(|n| {
            let suffix = format!("-{n}");
            let stem: String = base.chars().take(max.saturating_sub(suffix.len())).collect();
            format!("{}{suffix}", stem.trim_end_matches(['-', '_', '.']))
        })
        .find(|c| !taken(c))
        .expect("some suffix is free")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_by_name_and_by_shape() {
        for (k, v) in [
            ("GITHUB_TOKEN", "x1"),
            ("api_key", "abc"),
            ("Authorization", "Basic dXNlcjpwYXNz"),
            ("DB_PASSWORD", "hunter2"),
            ("CLIENT_SECRET", "s"),
            ("X-Auth-User", "u"),
            ("AWS_CREDENTIALS", "c"),
            ("ANYTHING", "ghp_0123456789abcdefghij"),
            ("ANYTHING", "sk-proj-0123456789abcdef"),
            ("ANYTHING", "Bearer abc.def.ghi"),
            ("ANYTHING", "xoxb-123456789012-abcdef"),
            ("ANYTHING", "Zx8f0Qm3Lr7Tb2Wn9Kc4Vd6Hj1Ps5Ya0"),
        ] {
            assert!(is_secret(k, v), "{k}={v}");
        }
        for (k, v) in [
            ("LOG_LEVEL", "debug"),
            ("GITHUB_TOKEN", ""),
            ("PATH_TO_DB", "/home/me/projects/some/long/path/to/the/database.sqlite"),
            ("URL", "https://example.com/a/b/c/d/e/f/g/h/i/j/k/l/m/n"),
            ("MODE", "production-environment-variable-name"),
            ("SHORT", "sk-1"),
            ("ID", "00000000000000000000000000000000000"),
        ] {
            assert!(!is_secret(k, v), "{k}={v}");
        }
    }
}
