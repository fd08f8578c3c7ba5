//! The test layers stay true (`.config/nextest.toml`): every test of `tests/e2e` that drives a
//! browser, a real agent CLI or an npm/PyPI peer is in one of the heavy test groups (so it runs
//! in the `heavy` profile, one browser and one agent CLI at a time), and every test the config
//! names exists. A test is heavy when its body, or a function of its module it calls, names
//! one of [`MARKERS`]; that is a reading of the source, not a proof, so the markers are the
//! helpers every such test goes through.
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::Context;

/// What a heavy test calls: the browser harness, the agent CLIs and the peers' entry points
/// (`coffer_tests::browser`, `coffer_tests::peers`, `coffer_tests::mcp::register_everything`,
/// `coffer_tests::peer`).
const MARKERS: &[&str] = &[
    "Browser",
    "browser::",
    "PyClient",
    "InspectorCli",
    "ClaudeCode",
    "claude_code()",
    "claude_code_2_1_197()",
    "codex()",
    "run_codex",
    "peer_path",
    "venv_bin",
    "node22",
    "run_to_end",
    "TokenProxy",
    "git_repo_with_one_commit",
    "register_everything",
    "peer(",
];

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Whether `text` holds `word` not inside a longer identifier.
fn has_word(text: &str, word: &str) -> bool {
    text.match_indices(word).any(|(i, _)| {
        let before = text[..i].chars().next_back().is_none_or(|c| !is_ident(c));
        let after = !word.ends_with(is_ident) || text[i + word.len()..].chars().next().is_none_or(|c| !is_ident(c));
        before && after
    })
}

/// A module's top-level functions: name → (body, is a test).
fn functions(src: &str) -> BTreeMap<String, (String, bool)> {
    let lines: Vec<&str> = src.lines().collect();
    let starts: Vec<usize> = (0..lines.len())
        .filter(|&i| {
            let l = lines[i];
            ["fn ", "async fn ", "pub fn ", "pub async fn ", "pub(crate) fn ", "pub(crate) async fn "]
                .iter()
                .any(|p| l.starts_with(p))
        })
        .collect();
    let mut out = BTreeMap::new();
    for (k, &s) in starts.iter().enumerate() {
        let end = starts.get(k + 1).copied().unwrap_or(lines.len());
        let head = lines[s];
        let name: String = head[head.find("fn ").map_or(0, |p| p + 3)..].chars().take_while(|&c| is_ident(c)).collect();
        let test =
            lines[s.saturating_sub(3)..s].iter().any(|l| l.starts_with("#[tokio::test") || l.starts_with("#[test]"));
        out.insert(name, (lines[s + 1..end].join("\n"), test));
    }
    out
}

fn heavy(name: &str, fns: &BTreeMap<String, (String, bool)>, seen: &mut BTreeSet<String>) -> bool {
    if !seen.insert(name.to_owned()) {
        return false;
    }
    let Some((body, _)) = fns.get(name) else { return false };
    MARKERS.iter().any(|m| has_word(body, m))
        || fns.keys().any(|f| f != name && has_word(body, &format!("{f}(")) && heavy(f, fns, seen))
}

fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        if p.is_dir() {
            rs_files(&p, out)?;
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
    Ok(())
}

#[test]
fn every_heavy_e2e_test_is_in_a_heavy_test_group_and_every_named_test_exists() -> anyhow::Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = std::fs::read_to_string(root.join("../.config/nextest.toml")).context(".config/nextest.toml")?;
    // The filters of the overrides that set a test group (the heavy sets).
    let groups: String =
        config.split("[[profile.").filter(|block| block.contains("test-group =")).collect::<Vec<_>>().join("\n");
    let mut exact = BTreeSet::new();
    let mut prefixes = BTreeSet::new();
    for (i, _) in groups.match_indices("test(") {
        let arg: String = groups[i + 5..].chars().take_while(|&c| c != ')').collect();
        if let Some(name) = arg.strip_prefix('=') {
            exact.insert(name.to_owned());
        } else if let Some(prefix) = arg.strip_prefix("/^").and_then(|a| a.strip_suffix('/')) {
            prefixes.insert(prefix.to_owned());
        }
    }
    let e2e = root.join("e2e");
    let mut files = Vec::new();
    rs_files(&e2e, &mut files)?;
    let (mut missing, mut all) = (Vec::new(), BTreeSet::new());
    for file in files {
        let rel = file.strip_prefix(&e2e)?.with_extension("");
        let module = rel.to_string_lossy().replace('/', "::");
        let module = module.strip_suffix("::mod").unwrap_or(&module).to_owned();
        if module == "main" {
            continue;
        }
        let fns = functions(&std::fs::read_to_string(&file)?);
        for (name, (_, test)) in &fns {
            if !test {
                continue;
            }
            let full = format!("{module}::{name}");
            all.insert(full.clone());
            let covered = exact.contains(&full) || prefixes.iter().any(|p| full.starts_with(p.as_str()));
            if heavy(name, &fns, &mut BTreeSet::new()) && !covered {
                missing.push(full);
            }
        }
    }
    assert!(all.len() > 300, "only {} e2e tests found: is the parser still right?", all.len());
    assert!(
        missing.is_empty(),
        "heavy e2e tests (a browser, an agent CLI or an npm/PyPI peer) in no heavy test group of \
         .config/nextest.toml; add them to the group's filter:\n{}",
        missing.join("\n")
    );
    let stale: Vec<&String> = exact.iter().filter(|t| !all.contains(*t)).collect();
    assert!(stale.is_empty(), ".config/nextest.toml names tests that do not exist: {stale:?}");
    Ok(())
}
