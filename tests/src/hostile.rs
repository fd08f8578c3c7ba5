//! The hostile local user: another uid on the same machine, for issue 32's suite
//! (`tests/e2e/hostile/`). Each test there acts as that user against a daemon run by the owner
//! (the test's own uid) and asserts the attack finds nothing.
//!
//! Becoming another uid needs root (CI and the development machines run the suite as root);
//! [`other_user`] fails loudly otherwise rather than skipping, so the suite can never pass by
//! not running.
use std::process::Command;

/// The uid and gid the hostile user runs as: `nobody` (65534), who owns nothing of the
/// owner's `COFFER_HOME`.
pub const HOSTILE_UID: u32 = 65534;
pub const HOSTILE_GID: u32 = 65534;

/// `(uid, gid)` of the hostile user.
///
/// # Panics
/// When this process is not root (it could not drop to another uid), with a message that says
/// so.
pub fn other_user() -> (u32, u32) {
    assert!(
        nix::unistd::geteuid().is_root(),
        "the hostile-local-user suite becomes uid {HOSTILE_UID} and so must run as root \
         (CI does); run it as root or leave tests/e2e/hostile out with a nextest filter"
    );
    (HOSTILE_UID, HOSTILE_GID)
}

/// `command`, set to run as the hostile user (uid/gid 65534, no supplementary groups), in `/`
/// with a `HOME` of `/nonexistent` and none of the owner's `COFFER_*` variables.
pub fn as_other_user(command: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    let (uid, gid) = other_user();
    command.uid(uid).gid(gid).current_dir("/").env("HOME", "/nonexistent");
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("COFFER_") {
            command.env_remove(key);
        }
    }
    command
}

/// Runs `sh -c script` as the hostile user and returns `(exit code, stdout, stderr)`.
pub fn sh_as_other_user(script: &str) -> anyhow::Result<(i32, String, String)> {
    // The harness plays another local user: it is not a child of Coffer's.
    #[allow(clippy::disallowed_methods)]
    let out = as_other_user(Command::new("/bin/sh").arg("-c").arg(script)).output()?;
    Ok((
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}
