//! The vault sandbox: confines a spawned upstream MCP server or agent CLI with Linux Landlock so
//! that it cannot read `COFFER_HOME` (`secret.key`, `coffer.db`, other servers' logs) while the
//! rest of the filesystem stays as the user has it.
//!
//! Landlock only *allows*: once a process restricts itself, every filesystem access the ruleset
//! handles is refused (EACCES) unless a rule on the accessed inode or one of its ancestors grants
//! it, and a right granted on a folder applies to everything beneath it. So hiding one folder
//! while allowing the rest means, for each folder on the path from `/` down to `COFFER_HOME`
//! (the *ancestors*), granting full access on every entry that is *not* the next step of that
//! path (the *siblings*), plus the few things inside `COFFER_HOME` the process needs
//! ([`Sandbox::allow`], [`Sandbox::allow_read`]). The walk is done at spawn:
//!
//! - An entry created later directly in an ancestor (say `~/.npm` when `COFFER_HOME` is
//!   `~/.coffer`) is covered by no rule until the process is started again; it then has only
//!   the rights of the ancestors themselves, [`ANCESTOR_ACCESS`].
//! - The ancestors themselves get [`ANCESTOR_ACCESS`] = list a folder (`ReadDir`) only. Every
//!   right granted on an ancestor also applies inside `COFFER_HOME`, so: no read of files (the
//!   point), no write or truncate (a sandboxed process could append to a knowledge note or
//!   overwrite `coffer.db`: integrity is an escape route, e.g. a registration without the
//!   sandbox), no remove (it could delete `secret.key`), no create, link or rename (with `Refer`
//!   it could move a file it wrote elsewhere into `knowledge/` or into Codex's `CODEX_HOME`, a
//!   persistent prompt injection; a symlink planted in a knowledge base would make Coffer's own
//!   indexer read a vault file for it). Listing is granted because `ls /` and `ls ~` must work;
//!   the residual cost is that names (never contents) under `COFFER_HOME` can be listed, which
//!   `stat(2)` — never checked by Landlock — largely reveals anyway.
//! - A sibling that is a symlink is granted at its target, unless the target is `COFFER_HOME`,
//!   inside it, or one of its ancestors (a link `~/vault -> ~/.coffer` is skipped).
//! - Network rights and Landlock scopes are not handled (out of scope): sockets, signals and
//!   abstract Unix sockets are as before. Pathname Unix sockets (`ResolveUnix`, ABI 9) are
//!   handled like other file rights, so a process reaches sockets outside `COFFER_HOME` as
//!   before and only the ones it is granted inside.
//!
//! Rights are those of the newest ABI this crate knows, in best-effort mode: an older kernel
//! handles what it supports. Where the kernel has no Landlock at all, [`Sandbox::prepare`]
//! returns a [`Prepared`] that restricts nothing ([`Prepared::is_active`] is false) and the
//! child runs as it would without the sandbox (`coffer doctor` and `coffer status` say so).
//!
//! The ruleset is built in the parent ([`Sandbox::prepare`]: it opens path descriptors and
//! allocates); between fork and exec the child only calls `prctl(PR_SET_NO_NEW_PRIVS)` and
//! `landlock_restrict_self(2)` on the prepared descriptor (both async-signal-safe raw syscalls,
//! see [`crate::spawn`]). Residual risks are listed in `docs/SECURITY.md` ("The vault
//! sandbox").
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

/// The rights one rule grants on a path and everything beneath it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Every filesystem right Landlock knows (a sibling of an ancestor, an allowed path).
    Full,
    /// Open for reading, list, execute ([`Sandbox::allow_read`]).
    Read,
    /// [`ANCESTOR_ACCESS`]: list the folder (and, inherited, the folders beneath it) only.
    Ancestor,
}

/// Rights on each ancestor of `COFFER_HOME` itself (they apply inside it too): list only
/// (`LANDLOCK_ACCESS_FS_READ_DIR`).
pub const ANCESTOR_ACCESS: Access = Access::Ancestor;

/// What a child may reach of the folder it is kept out of.
#[derive(Debug, Clone)]
pub struct Sandbox {
    hidden: PathBuf,
    full: Vec<PathBuf>,
    read: Vec<PathBuf>,
}

/// Error building a sandbox; the spawn is refused (fail closed), naming the path.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// The folder to hide cannot be resolved.
    #[error("cannot resolve the folder to hide, {path}: {source}")]
    Hidden { path: PathBuf, source: std::io::Error },
    /// An allowed path is the hidden folder itself (e.g. a server whose working directory is
    /// `COFFER_HOME`): granting it would grant the whole vault.
    #[error("{path} is {hidden}, which the vault sandbox hides: choose another folder, or turn the sandbox off")]
    AllowsHidden { path: PathBuf, hidden: PathBuf },
    /// The kernel refused the ruleset.
    #[error("cannot build the Landlock ruleset: {0}")]
    Landlock(String),
}

/// A ruleset ready to enforce in a child: the Landlock ruleset descriptor (close-on-exec), or
/// none where the kernel has no Landlock.
#[derive(Debug)]
pub struct Prepared {
    fd: Option<OwnedFd>,
    rules: usize,
}

impl Prepared {
    /// True when the child will be confined (the kernel has Landlock).
    pub fn is_active(&self) -> bool {
        self.fd.is_some()
    }

    /// How many rules the ruleset holds (siblings, ancestors, allowed paths).
    pub fn rules(&self) -> usize {
        self.rules
    }

    /// The ruleset descriptor for `landlock_restrict_self(2)`, or `None`.
    pub fn raw_fd(&self) -> Option<RawFd> {
        self.fd.as_ref().map(AsRawFd::as_raw_fd)
    }
}

impl Sandbox {
    /// A sandbox that hides `hidden` (`COFFER_HOME`) and allows everything else.
    pub fn hiding(hidden: impl Into<PathBuf>) -> Self {
        Self { hidden: hidden.into(), full: Vec::new(), read: Vec::new() }
    }

    /// Also grants full access to `path` (a folder or file; e.g. the process's workspace). A
    /// path outside the hidden folder needs nothing and is ignored, and so is an ancestor of it
    /// (everything else in it is granted already); a path that does not exist at spawn is
    /// skipped (create it first). The hidden folder itself is refused at [`Sandbox::rules`].
    pub fn allow(mut self, path: impl Into<PathBuf>) -> Self {
        self.full.push(path.into());
        self
    }

    /// Also grants reading (open for read, list, execute) `path`, as [`Sandbox::allow`].
    pub fn allow_read(mut self, path: impl Into<PathBuf>) -> Self {
        self.read.push(path.into());
        self
    }

    /// The folder this sandbox hides, as given.
    pub fn hidden(&self) -> &Path {
        &self.hidden
    }

    /// The rules: `(path, rights)` pairs, paths resolved (symlinks followed). Reads the
    /// ancestors' folders. Siblings that cannot be resolved (dangling links, no permission)
    /// are left out: they are unreachable anyway.
    ///
    /// # Errors
    /// [`SandboxError::Hidden`], [`SandboxError::AllowsHidden`].
    pub fn rules(&self) -> Result<Vec<(PathBuf, Access)>, SandboxError> {
        let all = Access::Full;
        let hidden = std::fs::canonicalize(&self.hidden)
            .map_err(|source| SandboxError::Hidden { path: self.hidden.clone(), source })?;
        let mut rules = Vec::new();
        // `ancestors()` walks up from `hidden`; pair each folder with the next step down.
        let path: Vec<&Path> = hidden.ancestors().collect();
        for pair in path.windows(2) {
            let (next, dir) = (pair[0], pair[1]);
            rules.push((dir.to_path_buf(), ANCESTOR_ACCESS));
            let Ok(entries) = std::fs::read_dir(dir) else { continue };
            for entry in entries.flatten() {
                let p = entry.path();
                if p == next {
                    continue;
                }
                let Ok(real) = std::fs::canonicalize(&p) else { continue };
                // A link into the vault, to the vault or to one of its ancestors would grant it.
                if real.starts_with(&hidden) || hidden.starts_with(&real) {
                    continue;
                }
                rules.push((real, all));
            }
        }
        for (paths, access) in [(&self.full, all), (&self.read, Access::Read)] {
            for p in paths {
                let Ok(real) = std::fs::canonicalize(p) else { continue };
                if real == hidden {
                    return Err(SandboxError::AllowsHidden { path: p.clone(), hidden });
                }
                // An ancestor (an agent working in `~`): its other entries are granted already,
                // and granting it would grant the vault.
                if hidden.starts_with(&real) {
                    continue;
                }
                if real.starts_with(&hidden) {
                    rules.push((real, access));
                }
            }
        }
        Ok(rules)
    }

    /// Builds the ruleset in this (parent) process: resolves [`Sandbox::rules`], opens each
    /// path (`O_PATH`) and adds it. Rights a file cannot carry (folder-only ones) are dropped
    /// for file rules; rights the kernel does not know are dropped (best effort).
    ///
    /// # Errors
    /// [`SandboxError`] naming the path or the kernel's refusal.
    #[cfg(target_os = "linux")]
    pub fn prepare(&self) -> Result<Prepared, SandboxError> {
        use landlock::{
            ABI, Access as _, AccessFs, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset, RulesetAttr,
            RulesetCreatedAttr, make_bitflags,
        };
        // The newest ABI this crate knows; best effort on older kernels.
        const ABI_HANDLED: ABI = ABI::V10;
        let rights = |a: Access| match a {
            Access::Full => AccessFs::from_all(ABI_HANDLED),
            Access::Read => make_bitflags!(AccessFs::{ ReadFile | ReadDir | Execute }),
            Access::Ancestor => make_bitflags!(AccessFs::{ ReadDir }),
        };
        let rules = self.rules()?;
        let landlock = |e: landlock::RulesetError| SandboxError::Landlock(e.to_string());
        let mut ruleset = Ruleset::default()
            .set_compatibility(CompatLevel::BestEffort)
            .handle_access(AccessFs::from_all(ABI_HANDLED))
            .map_err(landlock)?
            .create()
            .map_err(landlock)?;
        let mut added = 0;
        for (path, access) in &rules {
            // The entry may have gone since the walk; it is then unreachable anyway.
            let Ok(fd) = PathFd::new(path) else { continue };
            ruleset = ruleset.add_rule(PathBeneath::new(fd, rights(*access))).map_err(landlock)?;
            added += 1;
        }
        let fd: Option<OwnedFd> = ruleset.into();
        Ok(Prepared { fd, rules: added })
    }

    /// No Landlock off Linux: a ruleset that restricts nothing.
    ///
    /// # Errors
    /// None.
    #[cfg(not(target_os = "linux"))]
    pub fn prepare(&self) -> Result<Prepared, SandboxError> {
        Ok(Prepared { fd: None, rules: 0 })
    }
}

/// The Landlock ABI version of the running kernel, `None` where it has no Landlock (not built
/// in, or not enabled at boot). Asked once per process.
pub fn kernel_abi() -> Option<u32> {
    static ABI: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    *ABI.get_or_init(query_kernel_abi)
}

#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn query_kernel_abi() -> Option<u32> {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: the documented version query of landlock_create_ruleset(2): no attribute pointer,
    // size 0; it creates no descriptor.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    u32::try_from(v).ok().filter(|&v| v > 0)
}

/// No Landlock off Linux.
#[cfg(not(target_os = "linux"))]
fn query_kernel_abi() -> Option<u32> {
    None
}

/// One line for `coffer doctor` and `coffer status`: whether spawned upstreams and agents can
/// be confined on this machine.
pub fn support_summary() -> String {
    match kernel_abi() {
        Some(v) => format!("Landlock ABI {v}: upstreams and agents run sandboxed (COFFER_HOME hidden)"),
        None => "no Landlock in this kernel: upstreams and agents run unsandboxed and can read COFFER_HOME".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tree like a user's: `home/{.coffer/{secret.key,workspace/},notes.txt,.cache/}`.
    fn tree() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        let vault = home.join(".coffer");
        std::fs::create_dir_all(vault.join("workspace")).unwrap();
        std::fs::create_dir_all(home.join(".cache")).unwrap();
        std::fs::write(vault.join("secret.key"), "k").unwrap();
        std::fs::write(home.join("notes.txt"), "n").unwrap();
        std::os::unix::fs::symlink(&vault, home.join("vault-link")).unwrap();
        std::os::unix::fs::symlink(&home, home.join("home-link")).unwrap();
        (dir, home.canonicalize().unwrap(), vault.canonicalize().unwrap())
    }

    #[test]
    fn rules_cover_siblings_of_every_ancestor_and_nothing_of_the_vault() {
        let (_dir, home, vault) = tree();
        let rules = Sandbox::hiding(&vault).allow(vault.join("workspace")).allow("/usr").rules().unwrap();
        let all = Access::Full;
        let get = |p: &Path| rules.iter().filter(|(q, _)| q == p).map(|(_, a)| *a).collect::<Vec<_>>();
        // Every ancestor: list only.
        for a in vault.ancestors().skip(1) {
            assert_eq!(get(a), vec![ANCESTOR_ACCESS], "{}", a.display());
        }
        // Siblings on each level: everything.
        assert_eq!(get(&home.join("notes.txt")), vec![all]);
        assert_eq!(get(&home.join(".cache")), vec![all]);
        assert_eq!(get(Path::new("/usr")), vec![all]);
        // The workspace inside the vault: everything; the vault itself and its files: nothing.
        assert_eq!(get(&vault.join("workspace")), vec![all]);
        assert!(get(&vault).is_empty());
        assert!(get(&vault.join("secret.key")).is_empty());
        // Links to the vault or to an ancestor are not followed into a grant.
        assert!(rules.iter().all(|(p, a)| !p.starts_with(&vault) || p == &vault.join("workspace") && *a == all));
        assert!(rules.iter().all(|(p, a)| *a == ANCESTOR_ACCESS || !vault.starts_with(p)), "no grant on an ancestor");
    }

    #[test]
    fn allowing_the_vault_is_refused_and_an_ancestor_adds_nothing() {
        let (_dir, home, vault) = tree();
        let err = Sandbox::hiding(&vault).allow(&vault).rules().unwrap_err();
        assert!(matches!(err, SandboxError::AllowsHidden { .. }), "{err}");
        // The rules list the siblings of the vault's ancestors, and /tmp is shared: another
        // process may add or remove an entry between two listings. Compare inside a window in
        // which /tmp held still (the same listing before and after).
        for _ in 0..20 {
            let before = Sandbox::hiding(&vault).rules().unwrap();
            let wider = Sandbox::hiding(&vault).allow(&home).allow_read("/").rules().unwrap();
            if Sandbox::hiding(&vault).rules().unwrap() == before {
                assert_eq!(wider, before);
                return;
            }
        }
        panic!("/tmp never held still for three listings");
    }

    #[test]
    fn prepare_opens_every_rule() {
        let (_dir, _home, vault) = tree();
        let prepared = Sandbox::hiding(&vault).allow(vault.join("workspace")).prepare().unwrap();
        assert_eq!(prepared.is_active(), kernel_abi().is_some());
        if prepared.is_active() {
            assert!(prepared.rules() > 5);
        }
    }
}
