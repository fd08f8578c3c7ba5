//! The `git` command line, run for the sync engine through `coffer_runtime::spawn` with a clean
//! environment: no `COFFER_*` variable, no terminal prompt (`GIT_TERMINAL_PROMPT=0`, SSH in
//! batch mode), so authentication is git's own (an SSH agent, a credential helper) and Coffer
//! never asks for or stores a password. The git directory is `COFFER_HOME/sync.git`, the work
//! tree `COFFER_HOME` itself (its `info/exclude` admits only the synced folders).
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncReadExt;

use crate::error::{Error, Result};

/// Longest one git command may run (a first push of thousands of notes over a slow link).
const COMMAND_TIMEOUT: Duration = Duration::from_secs(600);
/// Most output kept from one command (bytes); the rest is dropped.
const MAX_OUTPUT: usize = 64 << 20;

/// Variables git may see from our environment: what it needs to find itself, the user's
/// configuration and keys (`HOME`, `XDG_CONFIG_HOME`), the SSH agent and proxies.
const PASSED: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "TMPDIR",
    "XDG_CONFIG_HOME",
    "SSH_AUTH_SOCK",
    "GIT_SSH_COMMAND",
    "HTTPS_PROXY",
    "HTTP_PROXY",
    "NO_PROXY",
    "https_proxy",
    "http_proxy",
    "no_proxy",
];

/// What one git command printed and how it ended.
#[derive(Debug)]
pub struct Output {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

/// The sync repository's git.
#[derive(Clone)]
pub struct Git {
    program: PathBuf,
    git_dir: PathBuf,
    work_tree: PathBuf,
    pid_dir: PathBuf,
}

/// The absolute path of `git` on `PATH`, if any.
pub fn find_git() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join("git")).find(|p| p.is_file())
}

impl Git {
    /// Git for the repository at `git_dir` whose work tree is `work_tree`.
    ///
    /// # Errors
    /// [`Error::Precondition`] when no `git` is on `PATH`.
    pub fn new(git_dir: PathBuf, work_tree: PathBuf, pid_dir: PathBuf) -> Result<Self> {
        let program = find_git().ok_or_else(|| {
            Error::Precondition("git is not installed (no `git` on PATH); coffer sync needs it".into())
        })?;
        Ok(Self { program, git_dir, work_tree, pid_dir })
    }

    /// The git directory (`COFFER_HOME/sync.git`).
    pub fn git_dir(&self) -> &Path {
        &self.git_dir
    }

    fn env(&self) -> Vec<(OsString, OsString)> {
        let mut env: Vec<(OsString, OsString)> =
            PASSED.iter().filter_map(|k| std::env::var_os(k).map(|v| (OsString::from(k), v))).collect();
        let has_ssh = env.iter().any(|(k, _)| k == "GIT_SSH_COMMAND");
        for (k, v) in [
            ("GIT_DIR", self.git_dir.as_os_str().to_owned()),
            ("GIT_WORK_TREE", self.work_tree.as_os_str().to_owned()),
            ("GIT_TERMINAL_PROMPT", "0".into()),
            ("GCM_INTERACTIVE", "never".into()),
            ("GIT_ASKPASS", "".into()),
            ("SSH_ASKPASS", "".into()),
            ("LC_ALL", "C".into()),
            ("LANG", "C".into()),
        ] {
            env.push((k.into(), v));
        }
        if !has_ssh {
            env.push(("GIT_SSH_COMMAND".into(), "ssh -o BatchMode=yes".into()));
        }
        env
    }

    /// Runs `git args…` in the work tree; a non-zero exit is not an error here.
    ///
    /// # Errors
    /// [`Error::Internal`] when git cannot start or runs past its deadline (it is killed).
    pub async fn run(&self, args: &[&str]) -> Result<Output> {
        let mut spec =
            coffer_runtime::spawn::SpawnSpec::new(&self.program, "git", args.first().copied().unwrap_or("git"));
        // Never ask for anything on a terminal and keep the user's hooks and signing out of
        // the sync repository's own commits.
        spec.args =
            ["-c", "core.hooksPath=/dev/null", "-c", "commit.gpgsign=false", "-c", "credential.interactive=never"]
                .iter()
                .chain(args.iter())
                .map(OsString::from)
                .collect();
        spec.env_clear = true;
        spec.env = self.env();
        spec.cwd = Some(self.work_tree.clone());
        spec.stdout = Stdio::piped();
        spec.stderr = Stdio::piped();
        spec.pid_dir = Some(self.pid_dir.clone());
        let mut child = coffer_runtime::spawn::spawn(spec).map_err(|e| Error::Internal(e.to_string()))?;
        let mut out = child.inner().stdout.take().expect("piped stdout");
        let mut err = child.inner().stderr.take().expect("piped stderr");
        let work = async {
            let (mut o, mut e) = (Vec::new(), Vec::new());
            let (mut out_lim, mut err_lim) = ((&mut out).take(MAX_OUTPUT as u64), (&mut err).take(MAX_OUTPUT as u64));
            let (ro, re) = tokio::join!(out_lim.read_to_end(&mut o), err_lim.read_to_end(&mut e));
            ro.and(re).map_err(|e| Error::Internal(format!("reading git's output: {e}")))?;
            let status = child.wait().await.map_err(|e| Error::Internal(format!("waiting for git: {e}")))?;
            Ok::<_, Error>(Output {
                ok: status.success(),
                stdout: String::from_utf8_lossy(&o).into_owned(),
                stderr: String::from_utf8_lossy(&e).into_owned(),
            })
        };
        match tokio::time::timeout(COMMAND_TIMEOUT, work).await {
            Ok(r) => r,
            Err(_) => Err(Error::Internal(format!(
                "git {} ran longer than {} s and was stopped",
                args.first().copied().unwrap_or_default(),
                COMMAND_TIMEOUT.as_secs()
            ))),
        }
    }

    /// Runs `git args…` and returns its standard output.
    ///
    /// # Errors
    /// As [`Git::run`], and [`Error::Internal`] with git's message when it exits non-zero.
    pub async fn ok(&self, args: &[&str]) -> Result<String> {
        let o = self.run(args).await?;
        if o.ok {
            Ok(o.stdout)
        } else {
            Err(Error::Internal(format!(
                "git {} failed: {}",
                args.first().copied().unwrap_or_default(),
                tail(&o.stderr)
            )))
        }
    }
}

/// The last lines of git's message, trimmed, for an error (never a credential: git does not
/// print them, and the remote URL's user info is cut by [`redact_url`]).
pub fn tail(stderr: &str) -> String {
    let lines: Vec<&str> = stderr.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    let start = lines.len().saturating_sub(4);
    redact_url(&lines[start..].join(" | "))
}

/// `text` with the password of any `scheme://user:password@host` cut.
pub fn redact_url(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("://") {
        let (head, tail) = rest.split_at(i + 3);
        out.push_str(head);
        let end = tail.find(|c: char| c.is_whitespace() || c == '/').unwrap_or(tail.len());
        let authority = &tail[..end];
        match authority.rfind('@') {
            Some(at) => {
                let user = authority[..at].split(':').next().unwrap_or_default();
                out.push_str(user);
                out.push('@');
                out.push_str(&authority[at + 1..]);
            }
            None => out.push_str(authority),
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_in_urls_are_cut() {
        assert_eq!(redact_url("fatal: https://me:hunter2@example.com/x.git"), "fatal: https://me@example.com/x.git");
        assert_eq!(redact_url("file:///tmp/x and ssh://git@h/r"), "file:///tmp/x and ssh://git@h/r");
    }
}
