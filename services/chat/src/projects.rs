//! The project picker's working directories (issue 34 §5): folders recently used by
//! conversations and agent sessions, and git repositories found under a root (the setting
//! `chat.projects_root`, default the user's home). The walk is bounded: at most [`MAX_DEPTH`]
//! levels below the root, [`MAX_SCAN_ENTRIES`] directory entries and [`MAX_REPOS`]
//! repositories; hidden directories, `node_modules` and symlinks are not entered, and a
//! repository's own subfolders are not searched.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Projects one listing returns at most.
pub const MAX_LIMIT: usize = 200;
/// Projects listed when the request says 0.
pub const DEFAULT_LIMIT: usize = 50;
/// Levels below the root searched for repositories.
pub const MAX_DEPTH: usize = 4;
/// Directory entries looked at before the walk stops.
pub const MAX_SCAN_ENTRIES: usize = 20_000;
/// Repositories collected at most.
pub const MAX_REPOS: usize = 200;

/// How a folder was used.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Use {
    /// Newest use, Unix ms.
    pub last_used_ms: i64,
    /// Who used it: `conversation`, `claude_code`, `codex` (and `git` once merged).
    pub sources: Vec<String>,
}

/// One project of the listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Project {
    /// Absolute directory.
    pub path: String,
    /// It holds a `.git`.
    pub git: bool,
    /// Newest use, Unix ms (0: found under the root, never used).
    pub last_used_ms: i64,
    /// See [`Use::sources`].
    pub sources: Vec<String>,
}

/// Records that `cwd` was used at `at_ms` by `source` (an empty or relative `cwd` is ignored).
pub fn note(used: &mut BTreeMap<String, Use>, cwd: &str, at_ms: i64, source: &str) {
    if cwd.is_empty() || !Path::new(cwd).is_absolute() {
        return;
    }
    let u = used.entry(cwd.trim_end_matches('/').to_owned()).or_default();
    u.last_used_ms = u.last_used_ms.max(at_ms);
    if !u.sources.iter().any(|s| s == source) {
        u.sources.push(source.to_owned());
    }
}

/// The git repositories under `root` (see the module docs for the bounds), sorted.
pub fn git_repos(root: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut budget = MAX_SCAN_ENTRIES;
    let mut level = vec![root.to_owned()];
    for _ in 0..=MAX_DEPTH {
        let mut next = Vec::new();
        for dir in level {
            if found.len() >= MAX_REPOS || budget == 0 {
                break;
            }
            if dir.join(".git").exists() {
                found.push(dir);
                continue;
            }
            let Ok(rd) = std::fs::read_dir(&dir) else { continue };
            for e in rd {
                if budget == 0 {
                    break;
                }
                budget -= 1;
                let Ok(e) = e else { continue };
                let name = e.file_name();
                let name = name.to_string_lossy();
                if name.starts_with('.') || name == "node_modules" {
                    continue;
                }
                // file_type does not follow symlinks: a link is never entered.
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    next.push(e.path());
                }
            }
        }
        level = next;
    }
    found.sort();
    found
}

/// The listing: used folders that still exist, newest use first, then the repositories found,
/// by path; Coffer's own default workspace is left out (it is what an empty choice means).
pub fn merge(used: BTreeMap<String, Use>, repos: Vec<PathBuf>, workspace: &Path, limit: usize) -> Vec<Project> {
    let limit = if limit == 0 { DEFAULT_LIMIT } else { limit.min(MAX_LIMIT) };
    let workspace = workspace.display().to_string();
    let mut out: Vec<Project> = used
        .into_iter()
        .filter(|(p, _)| *p != workspace && Path::new(p).is_dir())
        .map(|(path, u)| Project {
            git: Path::new(&path).join(".git").exists(),
            path,
            last_used_ms: u.last_used_ms,
            sources: u.sources,
        })
        .collect();
    out.sort_by(|a, b| b.last_used_ms.cmp(&a.last_used_ms).then_with(|| a.path.cmp(&b.path)));
    for repo in repos {
        let path = repo.display().to_string();
        if let Some(p) = out.iter_mut().find(|p| p.path == path) {
            if !p.sources.iter().any(|s| s == "git") {
                p.sources.push("git".into());
            }
            continue;
        }
        out.push(Project { path, git: true, last_used_ms: 0, sources: vec!["git".into()] });
    }
    out.truncate(limit);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repositories_are_found_within_bounds_and_merged_with_recent_folders() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for p in ["a/.git", "b/c/.git", "b/c/inner/.git", ".hidden/r/.git", "node_modules/x/.git", "1/2/3/4/5/6/.git"] {
            std::fs::create_dir_all(root.join(p)).unwrap();
        }
        std::os::unix::fs::symlink(root, root.join("loop")).unwrap();
        let repos = git_repos(root);
        assert_eq!(repos, [root.join("a"), root.join("b/c")], "{repos:?}");

        let mut used = BTreeMap::new();
        note(&mut used, &root.join("b/c").display().to_string(), 5, "conversation");
        note(&mut used, &root.join("b").display().to_string(), 9, "claude_code");
        note(&mut used, "/no/such/dir", 10, "codex");
        note(&mut used, "relative", 10, "codex");
        let ws = root.join("ws");
        std::fs::create_dir_all(&ws).unwrap();
        note(&mut used, &ws.display().to_string(), 20, "conversation");
        let out = merge(used, repos, &ws, 0);
        let paths: Vec<_> = out.iter().map(|p| p.path.clone()).collect();
        let s = |p: &str| root.join(p).display().to_string();
        assert_eq!(paths, [s("b"), s("b/c"), s("a")]);
        assert_eq!(out[1].sources, ["conversation", "git"]);
        assert!(out[1].git && !out[0].git);
        assert_eq!(merge(BTreeMap::new(), vec![root.join("a"), root.join("b")], &ws, 1).len(), 1);
    }
}
