//! The MCP core's inner boundaries, read from its source (issue 33 §2): no file of the core
//! names the edge's `AppState` (the transports take the [`crate::mcp::Gateway`] as their router
//! state), an upstream connection knows nothing of sessions, clients or built-ins, a session
//! uses nothing of the downstream transports but the protocol eras, and the built-in tools are
//! reached through their registry only. Each rule names the folder it holds for; a failure
//! names the file and the path it should not name.
//!
//! What counts as naming: every `crate::…` path outside comments and test code, with `super::`
//! resolved and `use` groups expanded (`crate::mcp::{Gateway, session::Lane}` names
//! `crate::mcp::Gateway` and `crate::mcp::session::Lane`).
use std::path::{Path, PathBuf};

/// `(folder under src/mcp, "" for all of it; paths no file there may name; why)`.
const RULES: &[(&str, &[&str], &str)] = &[
    (
        "",
        &["crate::state", "crate::AppState", "crate::rest", "crate::ui", "crate::middleware"],
        "the MCP core never takes the edge's AppState: the transports get the gateway as their state",
    ),
    (
        "upstream",
        &[
            "crate::mcp::session",
            "crate::mcp::downstream",
            "crate::mcp::builtin",
            "crate::mcp::broker",
            "crate::mcp::gateway_catalog",
            "crate::mcp::Session",
            "crate::mcp::Gateway",
            "crate::mcp::Shared",
        ],
        "an upstream connection knows nothing of sessions, clients or built-ins",
    ),
    (
        "session",
        &[
            "crate::mcp::downstream::http",
            "crate::mcp::downstream::stream",
            "crate::mcp::downstream::message",
            "crate::mcp::downstream::listen",
            "crate::mcp::Gateway",
        ],
        "a session is transport-independent: of downstream/ it uses the protocol eras only",
    ),
    (
        "builtin",
        &[
            "crate::mcp::session",
            "crate::mcp::downstream",
            "crate::mcp::upstream",
            "crate::mcp::Session",
            "crate::mcp::Gateway",
            "crate::mcp::Shared",
        ],
        "a built-in tool sees its arguments and its caller, not the session or any transport",
    ),
];

/// `gateway-edge/src`.
fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `dir` but test files (`tests.rs`, a `tests/` folder).
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir).expect("read src").flatten().map(|e| e.path()).collect();
    entries.sort();
    for p in entries {
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if p.is_dir() {
            if name != "tests" {
                sources(&p, out);
            }
        } else if name.ends_with(".rs") && name != "tests.rs" {
            out.push(p);
        }
    }
}

/// The module path of `file` (`src/mcp/upstream/http/mod.rs` → `["mcp", "upstream", "http"]`).
fn module_of(file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src()).expect("under src").with_extension("");
    let mut m: Vec<String> = rel.iter().map(|c| c.to_string_lossy().into_owned()).collect();
    if m.last().is_some_and(|l| l == "mod") {
        m.pop();
    }
    m
}

/// `text` without comment lines and without its inline `mod tests { … }` (up to its closing
/// brace at the start of a line), with every `super::` chain and `self::` written as the
/// `crate::` path it names from `module`.
fn code_of(text: &str, module: &[String]) -> String {
    let mut in_tests = false;
    let mut previous = "";
    let mut code: Vec<&str> = Vec::new();
    for line in text.lines() {
        if previous == "#[cfg(test)]" && line == "mod tests {" {
            in_tests = true;
        } else if in_tests && line == "}" {
            in_tests = false;
        } else if !in_tests && !line.trim_start().starts_with("//") {
            code.push(line);
        }
        previous = line;
    }
    let mut code = code.join("\n");
    for k in (1..=module.len()).rev() {
        let from = "super::".repeat(k);
        let to: String = std::iter::once("crate")
            .chain(module[..module.len() - k].iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join("::")
            + "::";
        code = replace_word(&code, &from, &to);
    }
    let own: String =
        std::iter::once("crate").chain(module.iter().map(String::as_str)).collect::<Vec<_>>().join("::") + "::";
    replace_word(&code, "self::", &own)
}

/// `s` with each `from` that does not continue an identifier (or a longer `super::` chain)
/// replaced by `to`.
fn replace_word(s: &str, from: &str, to: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find(from) {
        let before = rest[..i].chars().next_back().or_else(|| out.chars().next_back());
        let glued = before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':');
        out.push_str(&rest[..i]);
        out.push_str(if glued { from } else { to });
        rest = &rest[i + from.len()..];
    }
    out.push_str(rest);
    out
}

/// Every `crate::…` path in `code`, `use` groups expanded.
fn crate_paths(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        let glued = rest[..i].chars().next_back().is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':');
        let (paths, used) = parse_path(&rest[i..]);
        if !glued {
            out.extend(paths);
        }
        rest = &rest[i + used.max(1)..];
    }
    out
}

/// The path at the start of `s` (`a::b`, `a::{b, c::{d, self}}`), expanded, and the bytes read.
fn parse_path(s: &str) -> (Vec<String>, usize) {
    let b = s.as_bytes();
    let mut i = 0;
    let mut prefix = String::new();
    loop {
        let start = i;
        while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
            i += 1;
        }
        prefix.push_str(&s[start..i]);
        if !s[i..].starts_with("::") {
            return (vec![prefix], i);
        }
        i += 2;
        if !s[i..].starts_with('{') {
            prefix.push_str("::");
            continue;
        }
        i += 1;
        let mut out = Vec::new();
        loop {
            while i < b.len() && (b[i].is_ascii_whitespace() || b[i] == b',') {
                i += 1;
            }
            if i >= b.len() || b[i] == b'}' {
                return (out, (i + 1).min(b.len()));
            }
            let (inner, used) = parse_path(&s[i..]);
            i += used.max(1);
            out.extend(inner.into_iter().filter(|p| !p.is_empty()).map(|p| match p.as_str() {
                "self" => prefix.clone(),
                _ => format!("{prefix}::{p}"),
            }));
        }
    }
}

/// Whether `path` is `forbidden` or inside it.
fn names(path: &str, forbidden: &str) -> bool {
    path == forbidden || path.strip_prefix(forbidden).is_some_and(|r| r.starts_with("::"))
}

#[test]
fn the_mcp_core_s_folders_keep_their_boundaries() {
    let mut broken = Vec::new();
    for (folder, forbidden, why) in RULES {
        let dir = src().join("mcp").join(folder);
        let mut files = Vec::new();
        sources(&dir, &mut files);
        assert!(!files.is_empty(), "no sources under {} (is the rule stale?)", dir.display());
        for file in files {
            let code = code_of(&std::fs::read_to_string(&file).expect("read source"), &module_of(&file));
            for path in crate_paths(&code) {
                if let Some(f) = forbidden.iter().find(|f| names(&path, f)) {
                    let shown = file.strip_prefix(src()).unwrap_or(&file).display().to_string();
                    broken.push(format!("src/{shown} names {path} (rule: no {f}; {why})"));
                }
            }
        }
    }
    broken.dedup();
    assert!(broken.is_empty(), "the MCP core's boundaries are crossed:\n{}", broken.join("\n"));
}

#[test]
fn paths_are_read_as_the_compiler_reads_them() {
    let module: Vec<String> = ["mcp", "session", "route"].map(String::from).to_vec();
    let code = code_of(
        "// use crate::state::AppState;\nuse super::super::{Gateway, downstream::{era, http::X}};\nuse self::y::Z;\npub(super) fn f() {}\n#[cfg(test)]\nmod tests {\n    use crate::state;\n}\n",
        &module,
    );
    assert_eq!(
        crate_paths(&code),
        [
            "crate::mcp::Gateway",
            "crate::mcp::downstream::era",
            "crate::mcp::downstream::http::X",
            "crate::mcp::session::route::y::Z"
        ]
    );
    assert!(names("crate::mcp::session::Lane", "crate::mcp::session"));
    assert!(!names("crate::mcp::sessions", "crate::mcp::session"));
}
