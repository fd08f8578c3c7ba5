//! Telling secrets from ordinary configuration values: which `env` variables and HTTP headers of
//! an MCP server registration should live in the encrypted credential store rather than in the
//! registry in plaintext. Shared by `coffer mcp import` (the gateway moves such values into
//! credentials) and `coffer mcp add` (the CLI does the same before it registers the server).
//!
//! The rules are heuristics, tuned to err on the side of a credential: a value that is moved
//! needlessly still works (the server gets it from the store), a secret left in the registry is
//! readable by `coffer mcp show` and sits in the database's WAL.
use std::collections::HashMap;

/// Prefix of a stored credential reference in an MCP server's `env` or `headers` value:
/// `coffer-credential-ref:<name>` (the value itself stays in the credential store).
pub const REF_PREFIX: &str = "coffer-credential-ref:";

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

/// A command-line argument of an upstream that looks like a secret ([`secret_args`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretArg {
    /// Its index in `args` (0 = the first argument after the command).
    pub index: usize,
    /// The option it is the value of (`--api-key`), when it is one.
    pub flag: Option<String>,
}

/// Endings of an option name that make its value something other than the secret itself: a
/// file or folder holding it, the name of a variable holding it, a kind or a URL.
const NOT_THE_SECRET: &[&str] =
    &["file", "path", "dir", "env", "var", "name", "type", "mode", "url", "uri", "header", "id", "method", "scheme"];

/// The arguments of an upstream's command line that look like secrets: they would be stored in
/// the registry in plaintext, synced, and readable by every local user in `ps`.
///
/// An argument is one when it looks like a token itself ([`looks_like_token`]; also as the
/// value of `KEY=VALUE` or `Header: Bearer …`), when it is a URL with a password
/// (`postgres://user:pw@host/db`), or when it is the value of an option whose name holds one of
/// [`SECRET_WORDS`] (`--api-key VALUE`, `--token=VALUE`; see `secret_option`), unless
/// that value is a path, a URL, a `${VAR}` reference, an environment variable's name
/// (`GITHUB_TOKEN`), shorter than 6 characters, or the option names something else that
/// holds it ([`NOT_THE_SECRET`]: `--token-file`, `--api-key-env`).
pub fn secret_args(args: &[String]) -> Vec<SecretArg> {
    let mut found = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let arg = args[i].as_str();
        // `--name=value` / `--name value`.
        if let Some(opt) = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-')).filter(|o| !o.is_empty()) {
            let (name, inline) = match opt.split_once('=') {
                Some((n, v)) => (n, Some(v)),
                None => (opt, None),
            };
            if secret_option(name) {
                let flag = format!("{}{name}", if arg.starts_with("--") { "--" } else { "-" });
                match inline {
                    Some(v) if secret_value(v) => found.push(SecretArg { index: i, flag: Some(flag) }),
                    Some(_) => {}
                    None => {
                        if let Some(v) = args.get(i + 1).filter(|v| !v.starts_with('-')) {
                            if secret_value(v) {
                                found.push(SecretArg { index: i + 1, flag: Some(flag) });
                            }
                            i += 2;
                            continue;
                        }
                    }
                }
                i += 1;
                continue;
            }
        }
        if looks_secret_anywhere(arg) {
            found.push(SecretArg { index: i, flag: None });
        }
        i += 1;
    }
    found
}

/// Whether option `name` (without its dashes) names a secret: one of its words is or ends with
/// one of [`SECRET_WORDS`] (`api-key`, `apikey`, `authtoken`; `auth…` and `password…` also as a
/// start), and its last word is not one of [`NOT_THE_SECRET`]. `--keyboard`, `--max-tokens`
/// and `--tokenizer` are not secrets.
fn secret_option(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    let words: Vec<&str> = n.split(['-', '_', '.']).filter(|w| !w.is_empty()).collect();
    let last = words.last().copied().unwrap_or("");
    let secret_word = |word: &str| {
        SECRET_WORDS.iter().any(|w| word.ends_with(w))
            || ["auth", "password", "passwd", "credential", "secret"].iter().any(|w| word.starts_with(w))
    };
    words.iter().any(|w| secret_word(w)) && !NOT_THE_SECRET.contains(&last) && !last.ends_with("file")
}

fn secret_value(v: &str) -> bool {
    let v = v.trim();
    let pathish = v.starts_with(['/', '.', '~']) || v.contains("://");
    let env_name = v.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
    let reference = v.starts_with("${") || v.starts_with('$');
    looks_like_token(v) || (v.chars().count() >= 6 && !pathish && !env_name && !reference)
}

/// A token on its own, as `KEY=VALUE`'s value, after `Bearer`, or as a URL's password.
fn looks_secret_anywhere(arg: &str) -> bool {
    if looks_like_token(arg) {
        return true;
    }
    if let Some((k, v)) = arg.split_once('=')
        && !k.contains("://")
        && is_secret(k, v)
        && secret_value(v)
    {
        return true;
    }
    let lower = arg.to_ascii_lowercase();
    for scheme in AUTH_SCHEMES {
        if let Some(i) = lower.find(scheme)
            && (i == 0 || !lower.as_bytes()[i - 1].is_ascii_alphanumeric())
        {
            let value = arg[i + scheme.len()..].trim();
            // `Bearer ${TOKEN}` is a reference the client expands, not a secret.
            if value.len() >= 8 && !value.starts_with('$') {
                return true;
            }
        }
    }
    url_password(arg)
}

/// Whether `arg` is a URL whose authority carries a password (`scheme://user:pw@host`).
fn url_password(arg: &str) -> bool {
    let Some((_, rest)) = arg.split_once("://") else { return false };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    match authority.rsplit_once('@') {
        Some((userinfo, _)) => userinfo.split_once(':').is_some_and(|(_, pw)| !pw.is_empty()),
        None => false,
    }
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

    #[test]
    fn secret_arguments_are_found_by_option_shape_and_url() {
        let args = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let at = |a: &[&str]| secret_args(&args(a)).into_iter().map(|s| (s.index, s.flag)).collect::<Vec<_>>();
        assert_eq!(
            at(&["serve", "--api-key", "ghp_16C7e42F292c6912E7710c838347Ae178B4a"]),
            [(2, Some("--api-key".into()))]
        );
        assert_eq!(at(&["--token=hunter2-Xy9"]), [(0, Some("--token".into()))]);
        assert_eq!(at(&["--password", "correcthorse"]), [(1, Some("--password".into()))]);
        assert_eq!(at(&["-y", "pkg", "sk-proj-0123456789abcdef"]), [(2, None)]);
        assert_eq!(at(&["postgresql://app:s3cret@localhost/db"]), [(0, None)]);
        assert_eq!(at(&["--header", "Authorization: Bearer abcdef123456"]), [(1, None)]);
        assert_eq!(at(&["API_KEY=abc123xyz"]), [(0, None)]);
        assert_eq!(at(&["--client-secret", "Zx8f0Qm3", "--verbose"]), [(1, Some("--client-secret".into()))]);
        for fine in [
            &["-y", "@modelcontextprotocol/server-filesystem", "/home/me/notes"][..],
            &["--token-file", "/run/secrets/gh"],
            &["--api-key-env", "OPENAI_API_KEY"],
            &["--token", "GITHUB_TOKEN"],
            &["--token", "${GITHUB_TOKEN}"],
            &["--auth-type", "oauth2-device"],
            &["--key-file=~/.ssh/id_ed25519"],
            &["--auth-url", "https://login.example.com/oauth"],
            &["--token", "abc"],
            &["postgresql://app@localhost/db", "https://example.com/a:b@c"],
            &["--keyboard", "us-intl-layout", "--log-level", "debug", "--port", "8080"],
            &["--max-tokens", "409600", "--tokenizer", "cl100k_base", "--api-key-header", "X-Api-Key-Name"],
            &["--token"],
            &["--header", "Authorization: Bearer ${AUTH_TOKEN}", "--header", "X-Key:${KEY}"],
        ] {
            assert_eq!(at(fine), [], "{fine:?}");
        }
    }
}
