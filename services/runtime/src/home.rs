//! The `COFFER_HOME` layout (default `~/.coffer`), created with owner-only permissions.
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Error preparing `COFFER_HOME`; the message always names the path.
#[derive(Debug, thiserror::Error)]
pub enum HomeError {
    #[error("cannot find a home directory: set COFFER_HOME")]
    NoHome,
    #[error("cannot create {path}: {source}")]
    Create { path: PathBuf, source: std::io::Error },
    #[error("{path} exists but is not a directory; set COFFER_HOME to a folder")]
    NotADirectory { path: PathBuf },
    #[error("{path} is not writable by this user: {source}")]
    NotWritable { path: PathBuf, source: std::io::Error },
}

/// How the names of [`CofferHome::login_redirect`] files begin (then 16 hex digits, `.html`).
pub const LOGIN_REDIRECT_PREFIX: &str = "ui-login-";

/// Paths inside one `COFFER_HOME`.
#[derive(Debug, Clone)]
pub struct CofferHome {
    root: PathBuf,
}

impl CofferHome {
    /// `COFFER_HOME` if set and non-empty, else `$HOME/.coffer`.
    pub fn from_env() -> Result<Self, HomeError> {
        if let Some(v) = std::env::var_os(crate::env::HOME).filter(|v| !v.is_empty()) {
            return Ok(Self::at(PathBuf::from(v)));
        }
        let home = std::env::var_os("HOME").filter(|v| !v.is_empty()).ok_or(HomeError::NoHome)?;
        Ok(Self::at(PathBuf::from(home).join(".coffer")))
    }

    /// A home rooted at `root` (made absolute against the current directory).
    pub fn at(root: PathBuf) -> Self {
        let root =
            if root.is_absolute() { root } else { std::env::current_dir().map(|d| d.join(&root)).unwrap_or(root) };
        Self { root }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }
    pub fn daemon_json(&self) -> PathBuf {
        self.root.join("daemon.json")
    }
    /// The edge's Unix-domain socket: the same HTTP edge as the TCP port (token, Host and
    /// Origin checks included), reachable only through this 0700 home; the shim's `/mcp`
    /// stream uses it (no TCP/IP stack per message).
    pub fn gateway_socket(&self) -> PathBuf {
        self.root.join("gateway.sock")
    }
    /// The folder that holds [`CofferHome::agent_json`] (0700): the only daemon file a
    /// sandboxed agent may read. The agent sandbox grants this *folder*, not the file, so a file
    /// written again by a later daemon (a new inode) is still readable to it.
    pub fn agent_access(&self) -> PathBuf {
        self.root.join("agent-access")
    }
    /// `agent-access/agent.json`: `daemon.json`'s shape ([`crate::daemon_file::DaemonInfo`]) with
    /// the daemon's **agent token** instead of the owner's: the edge accepts it on `/mcp` only.
    /// The `coffer-mcp-shim` that attaches Coffer's gateway to a managed agent reads it
    /// (`COFFER_AGENT_SHIM`), never `daemon.json`. Written (0600) and removed by the supervisor
    /// with `daemon.json`.
    pub fn agent_json(&self) -> PathBuf {
        self.agent_access().join("agent.json")
    }
    pub fn daemon_lock(&self) -> PathBuf {
        self.root.join("daemon.lock")
    }
    pub fn db(&self) -> PathBuf {
        self.root.join("coffer.db")
    }
    pub fn secret_key(&self) -> PathBuf {
        self.root.join("secret.key")
    }
    pub fn logs(&self) -> PathBuf {
        self.root.join("logs")
    }
    pub fn upstream_logs(&self) -> PathBuf {
        self.root.join("logs").join("upstreams")
    }
    /// The 0600 page `coffer ui` opens the browser on for the one-time login `code`: a redirect
    /// to the login link, so the link never sits on a command line (`/proc/PID/cmdline` is
    /// readable by every user). Named by a digest of the code (16 hex digits), so the edge that
    /// redeems the code removes it. See [`LOGIN_REDIRECT_PREFIX`].
    pub fn login_redirect(&self, code: &str) -> PathBuf {
        use sha2::Digest as _;
        let d = hex::encode(sha2::Sha256::digest(code.as_bytes()));
        self.root.join(format!("{LOGIN_REDIRECT_PREFIX}{}.html", &d[..16]))
    }
    pub fn pids(&self) -> PathBuf {
        self.root.join("upstream-pids")
    }
    /// Raw stdout/stderr of a detached daemon (not the rotated log).
    pub fn daemon_stdio(&self) -> PathBuf {
        self.root.join("logs").join("daemon.stdio")
    }

    /// Creates the root and its subfolders (mode 0700) and proves the root is writable.
    ///
    /// # Errors
    /// [`HomeError::Create`] or [`HomeError::NotWritable`], naming the offending path.
    pub fn ensure(&self) -> Result<(), HomeError> {
        let dirs = [
            self.root.clone(),
            self.logs(),
            self.upstream_logs(),
            self.pids(),
            self.root.join("knowledge"),
            self.root.join("memory"),
            self.root.join("skills"),
            self.root.join("workspace"),
            self.agent_access(),
        ];
        for d in dirs {
            if d.exists() && !d.is_dir() {
                return Err(HomeError::NotADirectory { path: d });
            }
            if !d.is_dir() {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(&d)
                    .map_err(|source| HomeError::Create { path: d.clone(), source })?;
            }
        }
        // Tighten a root created by someone else with a looser mode, and the folder of the agents'
        // token file (whoever loosened it); ignore failure (not owner).
        for d in [&self.root, &self.agent_access()] {
            let _ = std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700));
        }
        let probe = self.root.join(format!(".write-probe-{}", std::process::id()));
        std::fs::write(&probe, b"").map_err(|source| HomeError::NotWritable { path: self.root.clone(), source })?;
        let _ = std::fs::remove_file(&probe);
        Ok(())
    }
}
