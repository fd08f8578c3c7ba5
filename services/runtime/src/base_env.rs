//! The base environment a daemon started by detect-or-spawn runs with, and so what every
//! upstream MCP server and agent CLI it starts inherits (plus their registered `env` and
//! credentials).
//!
//! An entry point inherits its MCP client's environment: a shim started by Claude Code carries
//! `ANTHROPIC_API_KEY`, `CLAUDE_CODE_SESSION_ID`, `CLAUDE_PROJECT_DIR`, …. The daemon outlives
//! that client and serves every later one, so it must not keep any of it. It keeps only the
//! variables a program needs to run in the user's session ([`BASE_VARS`], plus every `LC_*`
//! and `XDG_*`), Coffer's own configuration variables, and the ones the user names in
//! [`PASS_ENV`].
use std::ffi::{OsStr, OsString};

/// Comma-separated names of extra variables that a daemon started by an entry point keeps from
/// that entry point's environment (e.g. `COFFER_PASS_ENV=HTTPS_PROXY,NODE_EXTRA_CA_CERTS`).
/// For a value one server needs, register it on that server instead (`coffer mcp add --env`).
pub const PASS_ENV: &str = "COFFER_PASS_ENV";

/// Variables kept by name: what a program needs to find its tools, its home and the user's
/// locale, time zone and temporary directory.
pub const BASE_VARS: &[&str] = &["PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR"];

/// Prefixes of variables kept: the locale categories and the XDG base directories.
pub const BASE_PREFIXES: &[&str] = &["LC_", "XDG_"];

/// Coffer's configuration variables that a started daemon reads from its own environment.
pub const COFFER_VARS: &[&str] = &[
    crate::env::HOME,
    crate::env::PORT,
    crate::env::PORT_RANGE,
    crate::env::LOG,
    crate::env::LOG_MAX_FILE_MB,
    crate::env::LOG_MAX_TOTAL_MB,
    crate::env::MAX_CONNECTIONS,
    crate::env::HEAD_TIMEOUT_MS,
    crate::env::RETRIEVAL_PING_MS,
    crate::env::SCHED_SLICE_US,
    crate::env::BACKGROUND_NICE,
    crate::env::CALLBACK_PORT,
    crate::env::CALLBACK_HOSTS,
];

/// The base environment taken from `vars` (an environment, e.g. `std::env::vars_os()`): every
/// variable in [`BASE_VARS`], [`COFFER_VARS`] or named in `vars`' own [`PASS_ENV`], and every
/// one starting with a [`BASE_PREFIXES`] prefix, in `vars`' order. Names that are not valid
/// UTF-8 are dropped.
pub fn base_environment(vars: impl IntoIterator<Item = (OsString, OsString)>) -> Vec<(OsString, OsString)> {
    let vars: Vec<(OsString, OsString)> = vars.into_iter().collect();
    let passed: Vec<String> = vars
        .iter()
        .find(|(k, _)| k == PASS_ENV)
        .and_then(|(_, v)| v.to_str())
        .map(|v| v.split(',').map(str::trim).filter(|n| !n.is_empty()).map(str::to_owned).collect())
        .unwrap_or_default();
    vars.into_iter().filter(|(k, _)| keeps(k, &passed)).collect()
}

fn keeps(name: &OsStr, passed: &[String]) -> bool {
    let Some(name) = name.to_str() else { return false };
    BASE_VARS.contains(&name)
        || COFFER_VARS.contains(&name)
        || name == PASS_ENV
        || BASE_PREFIXES.iter().any(|p| name.starts_with(p))
        || passed.iter().any(|p| p == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        pairs.iter().map(|(k, v)| (OsString::from(k), OsString::from(v))).collect()
    }

    fn names(out: &[(OsString, OsString)]) -> Vec<&str> {
        out.iter().map(|(k, _)| k.to_str().unwrap()).collect()
    }

    #[test]
    fn keeps_the_session_basics_and_drops_a_clients_variables() {
        let out = base_environment(env(&[
            ("PATH", "/usr/bin"),
            ("HOME", "/home/u"),
            ("ANTHROPIC_API_KEY", "sk-ant-secret"),
            ("CLAUDE_CODE_SESSION_ID", "abc"),
            ("CLAUDE_PROJECT_DIR", "/p"),
            ("LC_ALL", "C.UTF-8"),
            ("XDG_RUNTIME_DIR", "/run/user/1000"),
            ("COFFER_HOME", "/tmp/h"),
            ("COFFER_INTERNAL_TOKEN", "t"),
            ("TZ", "UTC"),
        ]));
        assert_eq!(names(&out), ["PATH", "HOME", "LC_ALL", "XDG_RUNTIME_DIR", "COFFER_HOME", "TZ"]);
    }

    #[test]
    fn the_callback_listeners_port_and_hosts_reach_a_started_daemon() {
        // `COFFER_CALLBACK_HOSTS=tunnel.example.com coffer daemon start` (the README's SeaTalk
        // setup): the CLI starts the daemon with this environment.
        let out = base_environment(env(&[
            ("COFFER_CALLBACK_PORT", "18999"),
            ("COFFER_CALLBACK_HOSTS", "tunnel.example.com"),
            ("COFFER_CALLBACK_SECRETS", "{}"),
        ]));
        assert_eq!(names(&out), ["COFFER_CALLBACK_PORT", "COFFER_CALLBACK_HOSTS"], "never the secrets variable");
    }

    #[test]
    fn pass_env_names_extra_variables() {
        let out = base_environment(env(&[
            ("HTTPS_PROXY", "http://proxy:3128"),
            ("OTHER", "x"),
            ("COFFER_PASS_ENV", " HTTPS_PROXY , ,NODE_EXTRA_CA_CERTS"),
            ("NODE_EXTRA_CA_CERTS", "/ca.pem"),
        ]));
        assert_eq!(names(&out), ["HTTPS_PROXY", "COFFER_PASS_ENV", "NODE_EXTRA_CA_CERTS"]);
    }

    #[test]
    fn an_empty_environment_stays_empty() {
        assert!(base_environment(Vec::new()).is_empty());
    }
}
