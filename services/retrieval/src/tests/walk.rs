//! Unit tests of the knowledge base walk on real temporary folders.
use std::fs;
use std::os::unix::fs::symlink;

use super::*;

fn write(root: &Path, rel: &str, text: &str) {
    let p = root.join(rel);
    fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
    fs::write(p, text).expect("write");
}

fn spec(root: &Path) -> WalkSpec {
    WalkSpec { root: root.to_owned(), include: vec![], exclude: vec![], skip: vec![] }
}

fn rels(spec: &WalkSpec) -> (Vec<String>, Vec<WalkIssue>) {
    let (files, issues) = walk(spec).expect("walk");
    (files.into_iter().map(|f| f.rel_path).collect(), issues)
}

#[test]
fn default_globs_gitignore_and_hidden_outside_a_repo() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    write(root, "a.md", "# A");
    write(root, "b.markdown", "b");
    write(root, "UPPER.MD", "u");
    write(root, "notes/c.md", "c");
    write(root, "notes/deep/d.md", "d");
    write(root, "notes/skip.txt", "not markdown");
    write(root, ".hidden/e.md", "hidden dir");
    write(root, ".f.md", "hidden file");
    write(root, "build/g.md", "ignored");
    write(root, "notes/secret.md", "ignored by nested gitignore");
    write(root, ".gitignore", "build/\n");
    write(root, "notes/.gitignore", "secret.md\n");
    let (files, issues) = rels(&spec(root));
    assert_eq!(files, vec!["UPPER.MD", "a.md", "b.markdown", "notes/c.md", "notes/deep/d.md"]);
    assert!(issues.is_empty(), "{issues:?}");
    let (files, _) = walk(&spec(root)).expect("walk");
    let a = files.iter().find(|f| f.rel_path == "a.md").expect("a.md");
    assert_eq!(a.size, 3);
    assert!(a.mtime_ms > 1_600_000_000_000, "{}", a.mtime_ms);
    assert!(a.abs_path.is_absolute() && a.abs_path.ends_with("a.md"));
    // The hidden folders skipped are named (not `.git`: never notes), nested ones by their path.
    write(root, "notes/.obsidian/x.md", "hidden too");
    write(root, ".git/HEAD", "ref");
    let w = walk_full(&spec(root)).expect("walk");
    assert_eq!(w.hidden, [".hidden", "notes/.obsidian"]);
    assert_eq!(w.files.len(), 5);
}

#[test]
fn include_and_exclude_globs_are_relative_to_the_root() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    write(root, "docs/a.md", "a");
    write(root, "docs/drafts/b.md", "b");
    write(root, "docs/c.txt", "c");
    write(root, "other/d.md", "d");
    let s = WalkSpec {
        root: root.to_owned(),
        include: vec!["docs/**/*.md".into(), "docs/*.txt".into()],
        exclude: vec!["docs/drafts".into()],
        skip: vec![],
    };
    assert_eq!(rels(&s).0, vec!["docs/a.md", "docs/c.txt"]);
    let f = matcher(&s).expect("matcher");
    assert!(f.accepts("docs/a.md"));
    assert!(f.accepts("docs/new/x.md"));
    assert!(!f.accepts("docs/drafts/b.md"));
    assert!(!f.accepts("other/d.md"));
    assert!(!f.accepts("docs/../other/d.md"));
    assert!(!f.accepts("/docs/a.md"));
    assert!(!f.accepts("docs/.hidden.md"));
    assert!(!f.accepts(""));
}

#[test]
fn matcher_honours_root_ignore_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    write(root, ".gitignore", "private/\n*.tmp.md\n");
    let f = matcher(&spec(root)).expect("matcher");
    assert!(f.accepts("a.md"));
    assert!(f.accepts("sub/a.MD"));
    assert!(!f.accepts("private/a.md"));
    assert!(!f.accepts("x.tmp.md"));
    assert!(!f.accepts("a.txt"));
}

#[test]
fn bad_root_and_bad_globs_are_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("nope");
    assert!(matches!(walk(&spec(&missing)), Err(WalkError::RootMissing(p)) if p == missing));
    write(dir.path(), "file.md", "x");
    assert!(matches!(walk(&spec(&dir.path().join("file.md"))), Err(WalkError::NotADirectory(_))));
    for bad in ["[unclosed", "/abs/*.md", "../*.md", "a/../../b", " "] {
        let s = WalkSpec { root: dir.path().to_owned(), include: vec![bad.into()], exclude: vec![], skip: vec![] };
        match walk(&s) {
            Err(WalkError::BadGlob { glob, message }) => {
                assert_eq!(glob, bad);
                assert!(!message.is_empty());
            }
            other => panic!("{bad:?}: {other:?}"),
        }
        let s = WalkSpec { root: dir.path().to_owned(), include: vec![], exclude: vec![bad.into()], skip: vec![] };
        assert!(matches!(matcher(&s), Err(WalkError::BadGlob { .. })), "{bad:?}");
    }
}

#[test]
fn symlink_loops_are_reported_not_followed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    write(root, "a/x.md", "x");
    symlink(root.join("a"), root.join("a/loop")).expect("symlink");
    symlink(root, root.join("a/up")).expect("symlink");
    let (files, issues) = rels(&spec(root));
    assert_eq!(files, vec!["a/x.md"]);
    let errors: Vec<String> = issues.iter().map(|i| format!("{}: {}", i.rel_path, i.error)).collect();
    assert!(errors.iter().any(|e| e.starts_with("a/loop") && e.contains("symlink loop back to a")), "{errors:?}");
    assert!(errors.iter().any(|e| e.starts_with("a/up") && e.contains("loop")), "{errors:?}");
}

#[test]
fn symlinks_that_escape_are_refused_and_inside_ones_listed_once() {
    let outside = tempfile::tempdir().expect("outside");
    write(outside.path(), "leak.md", "secret");
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    write(root, "real/n.md", "n");
    symlink(outside.path(), root.join("out")).expect("symlink dir");
    symlink(outside.path().join("leak.md"), root.join("leak.md")).expect("symlink file");
    symlink(root.join("real"), root.join("alias")).expect("inside dir link");
    symlink(root.join("real/n.md"), root.join("zlink.md")).expect("inside file link");
    symlink(root.join("gone.md"), root.join("dangling.md")).expect("dangling");
    let (files, issues) = rels(&spec(root));
    assert_eq!(files, vec!["real/n.md"]);
    let escaped: Vec<&str> =
        issues.iter().filter(|i| i.error.contains("outside")).map(|i| i.rel_path.as_str()).collect();
    assert_eq!(escaped, vec!["leak.md", "out"]);
    assert!(issues.iter().any(|i| i.rel_path == "dangling.md" && i.error.contains("does not exist")), "{issues:?}");
    // A link to an outside file that is no document is no issue either.
    symlink(outside.path().join("leak.md"), root.join("notes.txt")).expect("symlink txt");
    symlink(root.join("nowhere"), root.join("dangling.txt")).expect("dangling txt");
    let (_, issues2) = rels(&spec(root));
    assert_eq!(issues2, issues);
}

#[test]
fn safe_relative_refuses_escapes() {
    let outside = tempfile::tempdir().expect("outside");
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    write(root, "a/b.md", "b");
    symlink(outside.path(), root.join("out")).expect("symlink");
    assert_eq!(safe_relative(root, Path::new("a/b.md")).as_deref(), Some("a/b.md"));
    assert_eq!(safe_relative(root, &root.join("a/b.md")).as_deref(), Some("a/b.md"));
    assert_eq!(safe_relative(root, Path::new("a/./b.md")).as_deref(), Some("a/b.md"));
    // Not there (yet, or any more): resolved through its existing parent.
    assert_eq!(safe_relative(root, Path::new("a/new.md")).as_deref(), Some("a/new.md"));
    assert_eq!(safe_relative(root, Path::new("a/c/d/new.md")).as_deref(), Some("a/c/d/new.md"));
    assert_eq!(safe_relative(root, Path::new("a/../a/b.md")).as_deref(), Some("a/b.md"));
    assert_eq!(safe_relative(root, Path::new("../x.md")), None);
    assert_eq!(safe_relative(root, Path::new("a/../../x.md")), None);
    assert_eq!(safe_relative(root, Path::new("a/missing/../../../x.md")), None);
    assert_eq!(safe_relative(root, Path::new("out/x.md")), None);
    assert_eq!(safe_relative(root, &outside.path().join("x.md")), None);
    assert_eq!(safe_relative(root, Path::new("/etc/passwd")), None);
    assert_eq!(safe_relative(root, Path::new("")), None);
    assert_eq!(safe_relative(root, root), None);
}

#[test]
fn fifo_is_not_a_document() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    write(root, "ok.md", "ok");
    nix::unistd::mkfifo(&root.join("pipe.md"), nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
    let (files, issues) = rels(&spec(root));
    assert_eq!(files, vec!["ok.md"]);
    assert_eq!(issues, vec![WalkIssue { rel_path: "pipe.md".into(), error: "not a regular file".into() }]);
}

#[test]
fn many_files_walk_is_sorted_and_complete() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    for i in 0..300 {
        write(root, &format!("d{}/n{i:03}.md", i % 7), "x");
    }
    let (files, issues) = rels(&spec(root));
    assert_eq!(files.len(), 300);
    assert!(files.windows(2).all(|w| w[0] < w[1]));
    assert!(issues.is_empty());
}

#[test]
fn coffer_home_inside_the_folder_is_never_walked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().canonicalize().expect("canonical");
    write(&root, "notes/a.md", "a");
    let home = root.join(".config-less-home");
    write(&home, "memory/01ARZ3NDEKTSV4RRFFQ69G5FAV.md", "fact");
    let visible_home = root.join("coffer");
    write(&visible_home, "memory/01ARZ3NDEKTSV4RRFFQ69G5FAV.md", "fact");
    write(&visible_home, "skills/pdf/SKILL.md", "skill");
    // A link to the home from elsewhere in the folder is pruned too.
    std::os::unix::fs::symlink(&visible_home, root.join("notes").join("home-link")).expect("symlink");
    let skip = skip_for(&root, &visible_home);
    assert_eq!(skip, std::slice::from_ref(&visible_home));
    let s = WalkSpec { skip, ..spec(&root) };
    assert_eq!(rels(&s).0, vec!["notes/a.md"]);
    let f = matcher(&s).expect("matcher");
    assert!(f.accepts("notes/b.md"));
    assert!(!f.accepts("coffer/memory/01ARZ3NDEKTSV4RRFFQ69G5FAV.md"), "the watcher's filter skips it too");
    // Without the skip list, Coffer's own files would be documents.
    assert!(rels(&spec(&root)).0.iter().any(|p| p.starts_with("coffer/")));
    // A root inside the home, or unrelated to it, skips nothing.
    assert!(skip_for(&visible_home.join("memory"), &visible_home).is_empty());
    assert!(skip_for(&visible_home, &visible_home).is_empty());
    assert!(skip_for(&root.join("notes"), &visible_home).is_empty());
}
