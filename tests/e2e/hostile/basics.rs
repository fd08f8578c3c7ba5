//! What the hostile user can already not do: read anything under the owner's `COFFER_HOME`.
use coffer_tests::TestHome;
use coffer_tests::hostile::sh_as_other_user;

/// Every file the daemon writes under `COFFER_HOME` (the secret key, the database, the daemon
/// file with its token, logs) is out of another uid's reach, and so is listing the folder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_uid_reads_nothing_under_coffer_home() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let _api = home.start_daemon().await?;
    // The temporary folder around COFFER_HOME stands for the owner's home folder, which is
    // often world-readable: only COFFER_HOME's own modes may protect it.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(home.temp(), std::fs::Permissions::from_mode(0o755))?;
    let root = home.root();
    let mut readable = Vec::new();
    for entry in walk(root) {
        let script =
            format!("cat -- '{}' >/dev/null 2>&1 || ls -- '{}' >/dev/null 2>&1", entry.display(), entry.display());
        let (code, _, _) = sh_as_other_user(&script)?;
        if code == 0 {
            readable.push(entry);
        }
    }
    assert!(readable.is_empty(), "another uid could read: {readable:?}");
    let (code, _, err) = sh_as_other_user(&format!("ls -- '{}'", root.display()))?;
    assert_ne!(code, 0, "another uid listed COFFER_HOME");
    assert!(err.contains("Permission denied"), "refused for another reason: {err}");
    Ok(())
}

fn walk(root: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path.clone());
            }
            out.push(path);
        }
    }
    out
}
