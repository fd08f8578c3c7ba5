//! The architecture documents stay a true map: every repository path written in backquotes in
//! `docs/ARCHITECTURE.md` (and in the documents it sends readers to: `docs/SECURITY.md`,
//! `docs/notes/*.md`) exists, every workspace crate and every `proto/*.proto` file is named in
//! the map, and every relative Markdown link between them points at a file that exists.
//!
//! It only reads files, so it lives in the smallest crate of the workspace and runs in seconds:
//! `cargo test -p coffer-types --test docs_map`. When a file moves, the failure names each path
//! that no longer exists; fix the document (or the path).
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The repository's root (this crate is `services/types`).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(rel: &str) -> String {
    let path = root().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// The documents checked: the map, then what it points to.
fn documents() -> Vec<String> {
    let mut docs = vec!["docs/ARCHITECTURE.md".to_owned(), "docs/SECURITY.md".to_owned()];
    let notes = root().join("docs/notes");
    let mut more: Vec<String> = std::fs::read_dir(&notes)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".md"))
                .map(|n| format!("docs/notes/{n}"))
                .collect()
        })
        .unwrap_or_default();
    more.sort();
    docs.extend(more);
    docs
}

/// The text of a Markdown document outside its fenced code blocks (diagrams and examples are
/// not claims about the tree).
fn prose(md: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in md.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// The inline code spans of `text` (`` `…` ``), in order.
fn code_spans(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

/// Whether a code span is a path in this repository: it has a `/`, no placeholder, glob,
/// space or other syntax (`services/<name>/`, `tests/e2e/ui_*.rs`, `a::b`, `GET /v1/x` are not
/// paths), and its first component is an entry of the repository's root. That last rule leaves
/// out `COFFER_HOME` paths (`logs/…`, `knowledge/`) and MCP method names (`tools/call`).
fn repository_path(span: &str, top: &BTreeSet<String>) -> Option<String> {
    let span = span.trim();
    if !span.contains('/')
        || span.starts_with('/')
        || span.contains(|c: char| c.is_whitespace() || "<>{}*:()[],|=$?#\"'\\…".contains(c))
    {
        return None;
    }
    let first = span.split('/').next()?;
    top.contains(first).then(|| span.to_owned())
}

/// The entries of the repository's root (files and folders), build output excluded.
fn top_level() -> BTreeSet<String> {
    std::fs::read_dir(root())
        .expect("reading the repository root")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "target" && n != ".git")
        .collect()
}

#[test]
fn every_path_the_architecture_documents_name_exists() {
    let top = top_level();
    let mut checked = 0;
    let mut missing = Vec::new();
    for doc in documents() {
        let text = prose(&read(&doc));
        for span in code_spans(&text) {
            let Some(path) = repository_path(span, &top) else { continue };
            checked += 1;
            if !root().join(&path).exists() {
                missing.push(format!("{doc}: `{path}`"));
            }
        }
    }
    assert!(checked >= 100, "only {checked} repository paths found; are the documents still there?");
    assert!(
        missing.is_empty(),
        "these paths do not exist (fix the document, or the path if the file moved):\n{}",
        missing.join("\n")
    );
}

#[test]
fn the_code_map_names_every_crate_and_every_proto_file() {
    let map = read("docs/ARCHITECTURE.md");
    let spans: BTreeSet<&str> = code_spans(&map).into_iter().collect();
    let manifest = read("Cargo.toml");
    let members = manifest
        .split("members = [")
        .nth(1)
        .and_then(|rest| rest.split(']').next())
        .expect("Cargo.toml has a [workspace] members list");
    let mut absent = Vec::new();
    for member in members.split(',').map(|m| m.trim().trim_matches('"')).filter(|m| !m.is_empty()) {
        let folder = format!("{member}/");
        if !spans.contains(folder.as_str()) {
            absent.push(format!("the crate folder `{folder}`"));
        }
    }
    let protos = std::fs::read_dir(root().join("proto")).expect("reading proto/");
    let mut names: Vec<String> = protos
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".proto"))
        .collect();
    names.sort();
    assert!(!names.is_empty(), "no proto/*.proto file found");
    for name in names {
        let path = format!("proto/{name}");
        if !spans.contains(path.as_str()) {
            absent.push(format!("`{path}`"));
        }
    }
    assert!(
        absent.is_empty(),
        "docs/ARCHITECTURE.md's code map does not name (add a line saying what each is):\n{}",
        absent.join("\n")
    );
}

#[test]
fn relative_links_between_the_documents_resolve() {
    let mut broken = Vec::new();
    for doc in documents().into_iter().chain(["README.md".to_owned()]) {
        let dir = Path::new(&doc).parent().unwrap_or(Path::new("")).to_path_buf();
        let text = prose(&read(&doc));
        for target in text.split("](").skip(1).filter_map(|rest| rest.split(')').next()) {
            let file = target.split('#').next().unwrap_or("");
            if file.is_empty() || file.contains("://") || file.starts_with("mailto:") {
                continue;
            }
            if !root().join(&dir).join(file).exists() {
                broken.push(format!("{doc}: ({target})"));
            }
        }
    }
    assert!(broken.is_empty(), "links to files that do not exist:\n{}", broken.join("\n"));
}

#[test]
fn paths_are_told_from_routes_methods_and_placeholders() {
    let top: BTreeSet<String> = ["proto", "services", "gateway-edge", ".ci"].into_iter().map(str::to_owned).collect();
    let found: Vec<String> = [
        "proto/chat.proto",
        "services/chat/",
        ".ci/run",
        "tools/call",
        "/v1/status",
        "COFFER_HOME/gateway.sock",
        "services/<name>/",
        "tests/e2e/ui_*.rs",
        "mcp::http",
        "GET /mcp",
    ]
    .iter()
    .filter_map(|s| repository_path(s, &top))
    .collect();
    assert_eq!(found, ["proto/chat.proto", "services/chat/", ".ci/run"]);
}
