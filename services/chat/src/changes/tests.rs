//! Change detection on real folders and real git repositories.
use std::path::Path;

use super::*;

/// Runs git in `dir` (test setup only; the module's own git goes through the spawn helper).
#[allow(clippy::disallowed_methods)] // a test's fixture repository, run to completion at once
fn git(dir: &Path, args: &[&str]) {
    let out = std::process::Command::new("git")
        .args(["-c", "user.email=t@example.com", "-c", "user.name=t", "-c", "init.defaultBranch=main"])
        .args(args)
        .current_dir(dir)
        .output()
        .expect("git runs");
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

fn write(dir: &Path, rel: &str, text: &str) {
    let p = dir.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

/// Snapshot, run `turn`, compare.
async fn turn(dir: &Path, f: impl FnOnce(&Path)) -> (FilesChanged, HashMap<String, String>) {
    let snap = snapshot(dir.to_path_buf()).await;
    f(dir);
    compare(snap).await
}

fn kinds(fc: &FilesChanged) -> Vec<(String, &'static str)> {
    fc.files.iter().map(|f| (f.path.clone(), f.change.as_str())).collect()
}

fn repo() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    git(d.path(), &["init", "-q"]);
    write(d.path(), "src/a.rs", "fn a() {}\nfn b() {}\nfn c() {}\n");
    write(d.path(), "keep.txt", "one\ntwo\n");
    write(d.path(), "gone.txt", "bye\n");
    write(d.path(), "old_name.txt", "moving content\nline 2\n");
    write(d.path(), ".gitignore", "build/\n");
    git(d.path(), &["add", "."]);
    git(d.path(), &["commit", "-qm", "init"]);
    d
}

#[tokio::test]
async fn a_git_turn_lists_added_modified_deleted_and_renamed_with_counts_and_diffs() {
    let d = repo();
    let (fc, diffs) = turn(d.path(), |p| {
        write(p, "src/a.rs", "fn a() {}\nfn b2() {}\nfn c() {}\nfn d() {}\n");
        write(p, "new.md", "# new\n");
        std::fs::remove_file(p.join("gone.txt")).unwrap();
        std::fs::rename(p.join("old_name.txt"), p.join("new_name.txt")).unwrap();
        write(p, "build/out.o", "ignored\n");
    })
    .await;
    assert_eq!(
        kinds(&fc),
        [
            ("gone.txt".into(), "deleted"),
            ("new.md".into(), "added"),
            ("new_name.txt".into(), "renamed"),
            ("src/a.rs".into(), "modified"),
        ]
    );
    let a = fc.files.iter().find(|f| f.path == "src/a.rs").unwrap();
    assert_eq!((a.additions, a.deletions), (2, 1));
    let r = fc.files.iter().find(|f| f.path == "new_name.txt").unwrap();
    assert_eq!(r.old_path.as_deref(), Some("old_name.txt"));
    let gone = fc.files.iter().find(|f| f.path == "gone.txt").unwrap();
    assert_eq!((gone.additions, gone.deletions), (0, 1));
    assert!(diffs["src/a.rs"].contains("--- a/src/a.rs\n+++ b/src/a.rs\n"), "{}", diffs["src/a.rs"]);
    assert!(diffs["src/a.rs"].contains("-fn b() {}\n+fn b2() {}\n"));
    assert!(diffs["new.md"].contains("+++ b/new.md") && diffs["new.md"].contains("+# new"));
    assert!(!fc.truncated && fc.note.is_none());
    assert_eq!(fc.summary(), "4 files changed: +3 \u{2212}2");
}

#[tokio::test]
async fn changes_made_before_the_turn_are_not_the_turns() {
    let d = repo();
    // The user's own uncommitted work: a modified file, an untracked one, a staged one.
    write(d.path(), "keep.txt", "one\ntwo\nmine\n");
    write(d.path(), "scratch.txt", "notes\n");
    write(d.path(), "src/a.rs", "staged\n");
    git(d.path(), &["add", "src/a.rs"]);
    let (fc, diffs) = turn(d.path(), |p| {
        // The agent edits the dirty file further and commits something: only its edit counts.
        write(p, "keep.txt", "one\ntwo\nmine\nagent\n");
        git(p, &["commit", "-qam", "agent commit"]);
    })
    .await;
    assert_eq!(kinds(&fc), [("keep.txt".into(), "modified")]);
    assert_eq!((fc.files[0].additions, fc.files[0].deletions), (1, 0));
    assert!(diffs["keep.txt"].contains(" mine\n+agent\n"), "{}", diffs["keep.txt"]);
}

#[tokio::test]
async fn a_turn_that_changes_nothing_lists_nothing_even_when_mtimes_move() {
    let d = repo();
    let (fc, _) = turn(d.path(), |p| {
        let text = std::fs::read_to_string(p.join("keep.txt")).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        std::fs::write(p.join("keep.txt"), text).unwrap();
    })
    .await;
    assert!(fc.is_empty(), "{fc:?}");
}

#[tokio::test]
async fn a_subfolder_of_a_repository_is_compared_from_its_own_root() {
    let d = repo();
    let sub = d.path().join("src");
    write(d.path(), "src/dirty.rs", "x\n");
    let (fc, _) = turn(&sub, |p| {
        write(p, "a.rs", "changed\n");
        write(d.path(), "outside.txt", "not in the folder\n");
    })
    .await;
    assert_eq!(kinds(&fc), [("a.rs".into(), "modified")]);
}

#[tokio::test]
async fn a_plain_folder_is_compared_by_its_listing() {
    let d = tempfile::tempdir().unwrap();
    write(d.path(), "a.txt", "1\n2\n3\n");
    write(d.path(), "b.txt", "b\n");
    write(d.path(), "node_modules/x/index.js", "skipped\n");
    let (fc, diffs) = turn(d.path(), |p| {
        write(p, "a.txt", "1\n3\n");
        std::fs::remove_file(p.join("b.txt")).unwrap();
        write(p, "c/new.txt", "new\n");
        write(p, "node_modules/x/index.js", "changed but skipped\n");
    })
    .await;
    assert_eq!(kinds(&fc), [("a.txt".into(), "modified"), ("b.txt".into(), "deleted"), ("c/new.txt".into(), "added")]);
    assert_eq!((fc.files[0].additions, fc.files[0].deletions), (0, 1));
    assert!(diffs["a.txt"].contains(" 1\n-2\n 3\n"), "{}", diffs["a.txt"]);
}

#[tokio::test]
async fn binary_files_say_so() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("img.bin"), [0u8, 1, 2, 3]).unwrap();
    let (fc, diffs) = turn(d.path(), |p| std::fs::write(p.join("img.bin"), [0u8, 9, 9]).unwrap()).await;
    assert_eq!(kinds(&fc), [("img.bin".into(), "modified")]);
    assert!(fc.files[0].binary);
    assert_eq!(diffs["img.bin"], "binary file changed\n");
}

#[tokio::test]
async fn symlinks_and_unreadable_files_do_not_fail_the_turn() {
    let d = tempfile::tempdir().unwrap();
    write(d.path(), "target.txt", "t\n");
    std::os::unix::fs::symlink("target.txt", d.path().join("link")).unwrap();
    std::os::unix::fs::symlink("/nonexistent/dangling", d.path().join("dangling")).unwrap();
    write(d.path(), "secret.txt", "s\n");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(d.path().join("secret.txt"), std::fs::Permissions::from_mode(0o000)).unwrap();
    std::fs::create_dir(d.path().join("closed")).unwrap();
    write(d.path(), "closed/x.txt", "x\n");
    std::fs::set_permissions(d.path().join("closed"), std::fs::Permissions::from_mode(0o000)).unwrap();
    let (fc, diffs) = turn(d.path(), |p| {
        std::fs::remove_file(p.join("link")).unwrap();
        std::os::unix::fs::symlink("elsewhere.txt", p.join("link")).unwrap();
        std::fs::write(p.join("secret.txt"), "s2 longer\n").unwrap_or_default();
    })
    .await;
    std::fs::set_permissions(d.path().join("closed"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let link = fc.files.iter().find(|f| f.path == "link").expect("the retargeted link is listed");
    assert_eq!(link.change, ChangeKind::Modified);
    assert!(diffs["link"].contains("-target.txt") && diffs["link"].contains("+elsewhere.txt"), "{}", diffs["link"]);
    assert!(!fc.files.iter().any(|f| f.path == "dangling"));
}

#[tokio::test]
async fn a_huge_tree_is_bounded_and_says_so() {
    let d = tempfile::tempdir().unwrap();
    for i in 0..=MAX_FILES {
        std::fs::write(d.path().join(format!("f{i}")), "").unwrap();
    }
    let t0 = Instant::now();
    let snap = snapshot(d.path().to_path_buf()).await;
    let took = t0.elapsed();
    assert!(snap.too_many);
    let (fc, _) = compare(snap).await;
    assert!(fc.truncated);
    assert_eq!(fc.note.as_deref(), Some("too many files to compare (more than 20000)"));
    assert!(took < Duration::from_secs(10), "the bounded walk took {took:?}");
}

#[tokio::test]
async fn too_many_changes_are_truncated() {
    let d = tempfile::tempdir().unwrap();
    let (fc, diffs) = turn(d.path(), |p| {
        for i in 0..MAX_LISTED + 5 {
            std::fs::write(p.join(format!("f{i:04}")), "x\n").unwrap();
        }
    })
    .await;
    assert!(fc.truncated);
    assert_eq!(fc.files.len(), MAX_LISTED);
    assert_eq!(diffs.len(), MAX_LISTED);
    assert!(fc.summary().starts_with("300+ files changed"));
}

#[test]
fn paths_outside_the_folder_are_refused() {
    for bad in ["", "/etc/passwd", "../x", "a/../../b", "a//b", "./a", "a\\b", "a\0b"] {
        assert!(check_path(bad).is_err(), "{bad:?}");
    }
    for good in ["a", "src/a.rs", ".env", "a..b/c"] {
        assert!(check_path(good).is_ok(), "{good:?}");
    }
}

#[test]
fn the_diff_store_keeps_and_answers_per_turn() {
    let d = tempfile::tempdir().unwrap();
    let store = DiffStore::new(d.path());
    let diffs = HashMap::from([("src/a.rs".to_owned(), "--- a\n+++ b\n".to_owned())]);
    store.put("c1", "m1", &diffs).unwrap();
    assert_eq!(store.get("c1", "m1", "src/a.rs").unwrap(), "--- a\n+++ b\n");
    assert!(matches!(store.get("c1", "m1", "other"), Err(DiffError::NoFile { .. })));
    assert!(matches!(store.get("c1", "m2", "src/a.rs"), Err(DiffError::NoTurn(_))));
    assert!(matches!(store.get("c1", "m1", "../x"), Err(DiffError::BadPath(_))));
    store.remove_conversation("c1");
    assert!(matches!(store.get("c1", "m1", "src/a.rs"), Err(DiffError::NoTurn(_))));
}

#[test]
fn git_outputs_parse() {
    let ls = b"100644 aaaa 0\tsrc/a.rs\x00160000 bbbb 0\tsub\x00100644 cccc 1\tconflict\0";
    assert_eq!(parse_ls_files(ls), HashMap::from([("src/a.rs".to_owned(), "aaaa".to_owned())]));
    let st = b" M b\0R  c\0a\0?? new\0";
    assert_eq!(parse_status_dirty(st), ["b", "c", "a", "new"]);
    let batch = b"aaaa blob 3\nabc\nbbbb missing\ncccc blob 0\n\n";
    let m = parse_batch(batch);
    assert_eq!(m["aaaa"], b"abc");
    assert_eq!(m["cccc"], b"");
}

#[tokio::test]
async fn a_large_tree_is_snapshotted_and_compared_within_the_start_bound() {
    // 19,000 files of 1 KiB in 190 folders (under MAX_FILES), one changed by the "turn".
    let d = tempfile::tempdir().unwrap();
    let line = "x".repeat(1023) + "\n";
    for dir in 0..190 {
        let p = d.path().join(format!("d{dir:03}"));
        std::fs::create_dir(&p).unwrap();
        for f in 0..100 {
            std::fs::write(p.join(format!("f{f:03}.txt")), &line).unwrap();
        }
    }
    let t0 = Instant::now();
    let snap = snapshot(d.path().to_path_buf()).await;
    let took = t0.elapsed();
    std::fs::write(d.path().join("d000/f000.txt"), "changed\n").unwrap();
    let t1 = Instant::now();
    let (fc, _) = compare(snap).await;
    let compared = t1.elapsed();
    eprintln!("snapshot of 19000 files (19 MiB kept): {took:?}; compare: {compared:?}");
    assert_eq!(kinds(&fc), [("d000/f000.txt".into(), "modified")]);
    assert!(took < SNAPSHOT_WAIT, "the snapshot took {took:?}");
}
