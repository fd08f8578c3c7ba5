//! The user documentation keeps up with the code: `docs/CLI.md` documents every `coffer`
//! command that the real binary's `--help` lists (with the exact synopsis clap prints and an
//! example), and nothing that does not exist; README links both reference pages. (`docs/REST.md`
//! is generated from the route table and checked in `gateway-edge`'s unit tests.) The settings
//! table in `docs/CLI.md` is the one `coffer_types::settings` defines. (That every path the
//! architecture documents name exists is checked without a daemon, in
//! `services/types/tests/docs_map.rs`.)
use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Context, ensure};

fn docs_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs")
}

/// `coffer <path> --help`.
fn help(path: &[String]) -> anyhow::Result<String> {
    // The test runs the CLI binary under test.
    #[allow(clippy::disallowed_methods)]
    let out = std::process::Command::new(coffer_tests::bin("coffer")?)
        .args(path)
        .arg("--help")
        .env_remove("COFFER_HOME")
        .env("COLUMNS", "100")
        .output()?;
    ensure!(out.status.success(), "coffer {} --help failed: {}", path.join(" "), String::from_utf8_lossy(&out.stderr));
    Ok(String::from_utf8(out.stdout)?)
}

/// A command as its help describes it.
struct Cmd {
    /// The synopsis: the first `Usage:` line without the prefix.
    usage: String,
    /// Names of its subcommands (without `help`).
    subcommands: Vec<String>,
}

fn parse_help(text: &str) -> anyhow::Result<Cmd> {
    let usage = text.lines().find_map(|l| l.strip_prefix("Usage: ")).context("no Usage line")?.trim().to_owned();
    let mut subcommands = Vec::new();
    let mut in_commands = false;
    for l in text.lines() {
        if l == "Commands:" {
            in_commands = true;
        } else if in_commands {
            if !l.starts_with("  ") {
                break;
            }
            // Continuation lines of a wrapped description are indented further.
            if l.starts_with("   ") {
                continue;
            }
            if let Some(name) = l.split_whitespace().next().filter(|n| *n != "help") {
                subcommands.push(name.to_owned());
            }
        }
    }
    Ok(Cmd { usage, subcommands })
}

/// Every command path of the real binary (`["mcp", "add"]`, …), groups included.
fn command_tree() -> anyhow::Result<BTreeMap<Vec<String>, Cmd>> {
    let mut out = BTreeMap::new();
    let mut todo = vec![Vec::<String>::new()];
    while let Some(path) = todo.pop() {
        let cmd = parse_help(&help(&path)?).with_context(|| format!("coffer {} --help", path.join(" ")))?;
        for s in &cmd.subcommands {
            let mut p = path.clone();
            p.push(s.clone());
            todo.push(p);
        }
        if !path.is_empty() {
            out.insert(path, cmd);
        }
    }
    Ok(out)
}

/// Sections of CLI.md headed `## coffer …` / `### coffer …`: command path → section text.
fn sections(md: &str) -> BTreeMap<Vec<String>, String> {
    let mut out = BTreeMap::new();
    let mut current: Option<(Vec<String>, String)> = None;
    for line in md.lines() {
        if line.starts_with('#') {
            if let Some((k, v)) = current.take() {
                out.insert(k, v);
            }
            let title = line.trim_start_matches('#').trim().trim_matches('`');
            if let Some(rest) = title.strip_prefix("coffer ") {
                current = Some((rest.split_whitespace().map(str::to_owned).collect(), String::new()));
            }
            continue;
        }
        if let Some((_, text)) = current.as_mut() {
            text.push_str(line);
            text.push('\n');
        }
    }
    if let Some((k, v)) = current {
        out.insert(k, v);
    }
    out
}

/// The lines of the fenced blocks of `lang` in `text`.
fn fenced<'a>(text: &'a str, lang: &str) -> Vec<&'a str> {
    let mut out = Vec::new();
    let mut inside = false;
    for l in text.lines() {
        if l.starts_with("```") {
            inside = !inside && l.trim_start_matches('`') == lang;
            continue;
        }
        if inside {
            out.push(l);
        }
    }
    out
}

#[test]
fn cli_md_documents_every_command() -> anyhow::Result<()> {
    let tree = command_tree()?;
    ensure!(tree.len() > 20, "only {} commands found", tree.len());
    let md = std::fs::read_to_string(docs_dir().join("CLI.md")).context("reading docs/CLI.md")?;
    let documented = sections(&md);
    let mut problems = Vec::new();
    for (path, cmd) in &tree {
        let name = format!("coffer {}", path.join(" "));
        let Some(text) = documented.get(path) else {
            problems
                .push(format!("{name}: no section (add `### {name}` with ```text\n{}\n``` and an example)", cmd.usage));
            continue;
        };
        if !cmd.subcommands.is_empty() {
            continue;
        }
        if !fenced(text, "text").contains(&cmd.usage.as_str()) {
            problems.push(format!("{name}: the synopsis block must read\n{}", cmd.usage));
        }
        let prefix = format!("{name} ");
        // A command line may chain or pipe: `coffer daemon stop && coffer restore …`.
        let runs =
            |l: &str| l.split(['|', '&', ';']).map(str::trim).any(|part| part == name || part.starts_with(&prefix));
        if !fenced(text, "sh").iter().any(|l| runs(l)) {
            problems.push(format!("{name}: no example (a ```sh block with a line starting `{name}`)"));
        }
    }
    for path in documented.keys() {
        if !tree.contains_key(path) {
            problems.push(format!("coffer {}: documented but not a command", path.join(" ")));
        }
    }
    ensure!(problems.is_empty(), "docs/CLI.md is out of date:\n{}", problems.join("\n"));
    Ok(())
}

#[test]
fn readme_links_the_reference_pages() -> anyhow::Result<()> {
    let readme = std::fs::read_to_string(docs_dir().join("../README.md"))?;
    for page in ["docs/CLI.md", "docs/REST.md"] {
        ensure!(readme.contains(&format!("]({page})")), "README.md does not link {page}");
        ensure!(docs_dir().join("..").join(page).is_file(), "{page} is missing");
    }
    Ok(())
}

#[test]
fn cli_md_shows_the_settings_table() -> anyhow::Result<()> {
    let md = std::fs::read_to_string(docs_dir().join("CLI.md")).context("reading docs/CLI.md")?;
    let table = coffer_types::settings::markdown_table();
    ensure!(
        md.contains(&table),
        "docs/CLI.md's settings table (under `## coffer settings`) must read, as coffer_types::settings::SETTINGS says:\n{table}"
    );
    Ok(())
}
