//! Sync across machines on git (`coffer sync`): the engine, its gRPC service
//! (`coffer.sync.v1.Sync`, [`service`]) and the opt-in worker ([`Engine::worker`]).
//!
//! The work tree is `COFFER_HOME` itself and the git directory `COFFER_HOME/sync.git`, whose
//! `info/exclude` admits only `knowledge/`, `memory/`, `skills/` and `vault/`: the markdown
//! folders are synced where they live (no copy that could drift from them), and the database,
//! `secret.key`, `daemon.json`, logs and everything else of the home never enter the
//! repository. `vault/` holds the vault state as text, written from the store's
//! `VaultState.ExportVault` before each commit and applied back with `ApplyVault` after each
//! merge. One sync: recover from an interrupted one (stale lock files, a merge in progress, a
//! merge not yet applied), export, commit, fetch, merge (conflicts kept, never lost), apply,
//! re-index what changed, push.
//!
//! Why here: coffer-retrieval owns the markdown folders, their watcher and re-indexing, so a pull
//! re-indexes what changed in-process (`Indexer::on_paths` for each changed path; a
//! `knowledge/<name>/` no KB names yet becomes a KB); no new process. The `Sync` service is served
//! beside `Retrieval` on the same listener, callable by the gateway only (`crate::authz::POLICY`).
//! Why the home itself is the work tree (`GIT_DIR`/`GIT_WORK_TREE` on every call) rather than a
//! separate `COFFER_HOME/sync/` copy: the files are the truth and stay where retrieval watches
//! them, so there is no two-way copy that a crash could leave half done, and git's own atomicity
//! (objects, then the ref) is the whole story. No `.git` appears in the home, so no tool walking a
//! KB folder mistakes it for a repository. `info/exclude` also refuses `secret.key`,
//! `daemon.json`, `*.db*`, logs and temp files even inside the admitted folders; `info/attributes`
//! marks `vault/**` `merge=binary`, so an entry changed on both sides is one conflict, never a line
//! mix. A nested repository inside a KB folder is added by git as a gitlink (its files are not
//! synced).
//!
//! One sync ([`Engine`], one at a time) in detail: recover (remove stale `*.lock` files — only our
//! git uses the repository, and a killed one leaves them; abort a merge in progress; apply a
//! merged commit whose vault was not applied, `coffer-sync.json`'s `applied`), export and commit,
//! fetch, merge (`--no-ff --allow-unrelated-histories`, so a second machine adopts the first's
//! history), resolve conflicts (a file: ours in place, theirs as
//! `name.conflict-<machine>-<date>.ext` — `machine` is the other commit's author,
//! `sync.machine_name` or the host name; a vault entry: the newer `updated_at` kept, ties broken by
//! text so both machines agree, the other to the audit log), apply (refused → `git reset --hard` to
//! the pre-merge commit: local commits stay, nothing half applied), re-index, push (retried after a
//! merge when the remote moved). Git runs through `coffer_runtime::spawn` with a cleared
//! environment (`PATH`, `HOME`, `SSH_AUTH_SOCK`, proxies; `GIT_TERMINAL_PROMPT=0`, SSH
//! `BatchMode=yes`, no askpass), so authentication is git's own and Coffer never asks for or stores
//! a password; remote URLs are shown without a password; `ext::`, `fd::` and option-looking
//! remotes are refused.
//!
//! The worker (`sync.auto`, off by default): a local change (the store's change head or any KB's
//! last index update moved) starts a `sync.debounce_s` wait (30 s); it also syncs every
//! `sync.pull_interval_s` (300 s); failures back off exponentially (to an hour). Its state is in
//! `Status` (`off|idle|waiting|syncing|backing_off`), `/v1/status` and `coffer status`. Skills
//! changes are not seen as local changes (they are not indexed): they go with the next sync.
//!
//! Tests: `sync::tests::*`, `sync::git::tests::*`, `authz::tests::only_the_gateway_may_sync`, and in
//! the store `domain::vault::tests::*`; e2e `sync::*` (two daemons, a `file://` bare remote: a fact
//! and a server follow, the credential flagged missing; both notes kept; the newer server kept and
//! the other audited; an unreachable remote and the worker's backoff; a malformed vault file
//! refused by name; 1,000 notes; kill -9 of coffer-retrieval mid-sync; every object scanned for the
//! credential value and `secret.key`).
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use coffer_proto::store::vault_state_client::VaultStateClient;
use coffer_proto::store::{ApplyVaultRequest, ExportVaultRequest, SyncConflictNote, VaultEntry};
use coffer_proto::sync::{Conflict, ConflictKind, Counts, Direction, SyncReport, SyncStatus, WorkerState};
use coffer_runtime::grpc::AuthChannel;
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::config::ConfigRx;
use crate::error::{Error, Result};
use crate::indexer::{Indexer, now_ms};
use crate::sources::{MEMORY, Sources};

pub mod git;
pub mod service;

use git::Git;

/// The branch every machine pushes to when the remote names no default branch of its own
/// (see [`Engine::init`]).
pub const BRANCH: &str = "main";
/// The git directory inside `COFFER_HOME`.
pub const GIT_DIR: &str = "sync.git";
/// The synced folders of `COFFER_HOME`.
pub const FOLDERS: &[&str] = &["knowledge", "memory", "skills", "vault"];
/// Git's empty tree (SHA-1 repositories): the "before" of a first push.
const EMPTY_TREE: &str = "4b825dc642cb6eb9a060e54bf8d69288fbee4904";
/// Paths listed in a report, at most.
const MAX_PATHS: usize = 200;
/// Attempts at fetch-merge-push when another machine pushed in between.
const PUSH_ATTEMPTS: usize = 3;
/// Longest wait of the worker after failures.
const MAX_BACKOFF: Duration = Duration::from_secs(3600);
/// The worker's wait after `failures` (≥ 1) failed syncs in a row: twice the pull interval
/// (at most a minute of it) after the first, doubling per further failure for at most 12
/// failures, never more than [`MAX_BACKOFF`].
fn failure_wait(pull_interval: Duration, failures: u32) -> Duration {
    let first = pull_interval.min(Duration::from_secs(60)) * 2;
    coffer_runtime::Backoff::new(first, MAX_BACKOFF).delay_after(failures.min(12))
}
/// How often the worker looks for local changes (KB index updates, store changes).
const CHANGE_POLL: Duration = Duration::from_secs(2);

/// `info/exclude` of the sync repository: only the synced folders, and never a secret, the
/// database, a temp file or a log even inside them.
const EXCLUDE: &str = "# Written by `coffer sync init`: only these folders of COFFER_HOME are synced.
/*
!/knowledge/
!/memory/
!/skills/
!/vault/
secret.key
daemon.json
daemon.lock
*.db
*.db-wal
*.db-shm
*.log
.*.tmp-*
.merge_file_*
";

/// `info/attributes`: a vault file changed on both sides is one conflict (resolved as a whole:
/// the newer kept), never a line-by-line mix of two versions.
const ATTRIBUTES: &str = "/vault/** merge=binary\n";

/// What survives a restart, in `sync.git/coffer-sync.json`.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
struct Persisted {
    /// The commit whose `vault/` was last applied to the store.
    #[serde(default)]
    applied: String,
    /// The store's change head at the last export: an entity changed after it is newer than the
    /// merged state and is left alone by the apply.
    #[serde(default)]
    export_seq: u64,
    #[serde(default)]
    last_sync_ms: i64,
    #[serde(default)]
    last_error: String,
    /// The branch this sync uses: the remote's default branch as `init` found it (empty:
    /// [`BRANCH`], as every set-up from before this field).
    #[serde(default)]
    branch: String,
    /// This machine's name as `init` chose it (`--machine-name`, else the host name with a
    /// random suffix); the `sync.machine_name` setting overrides it.
    #[serde(default)]
    machine: String,
}

/// The worker's live state.
#[derive(Debug, Default)]
struct Live {
    running: bool,
    worker: i32,
    next_attempt_ms: i64,
    failures: u32,
}

/// The sync engine: one sync at a time.
pub struct Engine {
    home: PathBuf,
    git: std::result::Result<Git, String>,
    vault: VaultStateClient<AuthChannel>,
    sources: Arc<Sources>,
    indexer: Arc<Indexer>,
    config: ConfigRx,
    lock: tokio::sync::Mutex<()>,
    live: Mutex<Live>,
    /// Woken by a sync asked for by hand, so the worker's plan is redrawn.
    kick: Notify,
}

impl Engine {
    /// The engine for `COFFER_HOME` at `home`.
    pub fn new(
        home: PathBuf,
        vault: VaultStateClient<AuthChannel>,
        sources: Arc<Sources>,
        indexer: Arc<Indexer>,
        config: ConfigRx,
    ) -> Arc<Self> {
        let git = Git::new(home.join(GIT_DIR), home.clone(), home.join("upstream-pids")).map_err(|e| e.to_string());
        Arc::new(Self {
            home,
            git,
            vault,
            sources,
            indexer,
            config,
            lock: tokio::sync::Mutex::new(()),
            live: Mutex::new(Live { worker: WorkerState::Off as i32, ..Default::default() }),
            kick: Notify::new(),
        })
    }

    fn git(&self) -> Result<&Git> {
        self.git.as_ref().map_err(|e| Error::Precondition(e.clone()))
    }

    fn git_dir(&self) -> PathBuf {
        self.home.join(GIT_DIR)
    }

    /// Whether `coffer sync init` has run here.
    pub fn initialized(&self) -> bool {
        self.git_dir().join("HEAD").is_file()
    }

    fn state_path(&self) -> PathBuf {
        self.git_dir().join("coffer-sync.json")
    }

    fn load_state(&self) -> Persisted {
        std::fs::read(self.state_path()).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_default()
    }

    fn save_state(&self, p: &Persisted) -> Result<()> {
        let body = serde_json::to_vec_pretty(p).expect("json");
        crate::memory::write_atomic(&self.git_dir(), "coffer-sync.json", &body).map(drop)
    }

    /// This machine's name: `sync.machine_name`, else the one `init` chose, else the host
    /// name; `[a-z0-9-]`, 1-32.
    pub fn machine(&self) -> String {
        let set = self.config.borrow().sync.machine.clone();
        let raw = if !set.trim().is_empty() {
            set
        } else {
            let chosen = self.load_state().machine;
            if chosen.is_empty() { host_name() } else { chosen }
        };
        let name = sanitize(&raw);
        if name.is_empty() { "machine".into() } else { name }
    }

    /// The branch this sync fetches, merges and pushes (see [`Persisted::branch`]).
    fn branch(&self) -> String {
        let b = self.load_state().branch;
        if b.is_empty() { BRANCH.to_owned() } else { b }
    }

    /// `coffer sync init REMOTE [--machine-name NAME]`: creates (or adopts) the repository
    /// with `remote` as origin, then syncs (a second machine merges the remote's history with
    /// what it has). A new repository uses the remote's default branch (what its `HEAD` names,
    /// also in an empty bare repository whose `HEAD` is `master`), else [`BRANCH`]. This
    /// machine's name is `machine_name` when given, else (the first time, with no
    /// `sync.machine_name` setting) the host name with a random suffix, so that two machines
    /// with the same host name tell each other apart in conflicts.
    ///
    /// # Errors
    /// [`Error::Invalid`] for a bad remote or a machine name without letters or digits; as
    /// [`Engine::sync`].
    pub async fn init(&self, remote: &str, machine_name: &str) -> Result<SyncReport> {
        check_remote(remote)?;
        let machine = sanitize(machine_name);
        if !machine_name.trim().is_empty() && machine.is_empty() {
            return Err(Error::Invalid(format!(
                "machine name {:?} has no letters or digits",
                machine_name.chars().take(40).collect::<String>()
            )));
        }
        let _one = self.lock.lock().await;
        let git = self.git()?;
        let dir = self.git_dir();
        if !self.initialized() {
            std::fs::create_dir_all(&dir).map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
            git.ok(&["init", "-q"]).await?;
            let branch = remote_default_branch(git, remote).await.unwrap_or_else(|| BRANCH.to_owned());
            git.ok(&["symbolic-ref", "HEAD", &format!("refs/heads/{branch}")]).await?;
            let mut state = self.load_state();
            state.branch = branch;
            self.save_state(&state)?;
        }
        let mut state = self.load_state();
        if !machine.is_empty() {
            state.machine = machine;
            self.save_state(&state)?;
        } else if state.machine.is_empty() && self.config.borrow().sync.machine.trim().is_empty() {
            state.machine = default_machine_name(&host_name());
            self.save_state(&state)?;
        }
        let info = dir.join("info");
        std::fs::create_dir_all(&info).map_err(|e| Error::io(format!("creating {}", info.display()), e))?;
        crate::memory::write_atomic(&info, "exclude", EXCLUDE.as_bytes())?;
        crate::memory::write_atomic(&info, "attributes", ATTRIBUTES.as_bytes())?;
        for f in FOLDERS {
            let d = self.home.join(f);
            std::fs::create_dir_all(&d).map_err(|e| Error::io(format!("creating {}", d.display()), e))?;
        }
        let current = git.run(&["remote", "get-url", "origin"]).await?;
        let has_origin = current.ok;
        if has_origin && current.stdout.trim() != remote {
            // Moving an existing sync to another remote: only once the new one answers, so a
            // mistyped URL leaves the working set-up as it was.
            let o = git.run(&["ls-remote", "--heads", "--", remote]).await?;
            if !o.ok {
                return Err(Error::Unavailable(format!(
                    "cannot reach the sync remote {}: {}. Nothing changed: the sync still uses its previous remote",
                    git::redact_url(remote),
                    git::tail(&o.stderr)
                )));
            }
        }
        let verb = if has_origin { "set-url" } else { "add" };
        git.ok(&["remote", verb, "origin", remote]).await?;
        tracing::info!(remote = %git::redact_url(remote), "Sync repository ready.");
        self.sync_locked().await
    }

    /// `coffer sync`: one sync (waits for one already running).
    ///
    /// # Errors
    /// [`Error::Precondition`] before `init`; [`Error::Unavailable`] when the remote cannot be
    /// reached (local changes stay committed); [`Error::Invalid`] naming a malformed vault file
    /// pulled (nothing applied, the merge undone); [`Error::Internal`] for other git failures.
    pub async fn sync(&self) -> Result<SyncReport> {
        let _one = self.lock.lock().await;
        if !self.initialized() {
            return Err(Error::Precondition("sync is not set up here: run `coffer sync init REMOTE_URL` first".into()));
        }
        self.sync_locked().await
    }

    async fn sync_locked(&self) -> Result<SyncReport> {
        self.live.lock().expect("live").running = true;
        let result = self.sync_steps().await;
        let mut state = self.load_state();
        match &result {
            Ok(r) => {
                state.last_sync_ms = r.finished_ms;
                state.last_error.clear();
            }
            Err(e) => state.last_error = e.to_string(),
        }
        let _ = self.save_state(&state);
        self.live.lock().expect("live").running = false;
        self.kick.notify_one();
        result
    }

    async fn sync_steps(&self) -> Result<SyncReport> {
        let git = self.git()?;
        let machine = self.machine();
        let branch = self.branch();
        let user = [
            "-c".to_owned(),
            format!("user.name={machine}"),
            "-c".to_owned(),
            format!("user.email={machine}@coffer.invalid"),
        ];
        let with_user = |args: &[&str]| -> Vec<String> {
            user.iter().cloned().chain(args.iter().map(|s| (*s).to_owned())).collect()
        };
        let run_user = |args: Vec<String>| async move {
            let refs: Vec<&str> = args.iter().map(String::as_str).collect();
            git.run(&refs).await
        };

        self.recover(git).await?;

        // 1. This machine's state, committed.
        let export = self.vault.clone().export_vault(ExportVaultRequest {}).await?.into_inner();
        self.write_vault(&export.entries)?;
        git.ok(&["add", "-A", "--", "knowledge", "memory", "skills", "vault"]).await?;
        let has_head = git.run(&["rev-parse", "-q", "--verify", "HEAD"]).await?.ok;
        let staged = !git.run(&["diff", "--cached", "--quiet"]).await?.ok;
        if staged || !has_head {
            let msg = format!("coffer sync from {machine}");
            let o = run_user(with_user(&["commit", "-q", "--allow-empty", "-m", &msg])).await?;
            if !o.ok {
                return Err(Error::Internal(format!("git commit failed: {}", git::tail(&o.stderr))));
            }
        }
        let head = rev(git, "HEAD").await?.unwrap_or_default();
        let mut state = self.load_state();
        state.export_seq = export.seq;
        // The store's state is what this commit's vault/ holds: it was just exported.
        state.applied = head.clone();
        self.save_state(&state)?;
        let base = head;

        let mut conflicts = Vec::new();
        let mut missing = export.missing_credentials;
        let mut remote_before: Option<String> = None;
        for attempt in 1..=PUSH_ATTEMPTS {
            // 2. The remote's changes.
            let o = git.run(&["fetch", "-q", "origin"]).await?;
            if !o.ok {
                return Err(Error::Unavailable(format!(
                    "cannot reach the sync remote: {}. Local changes are committed in {}/ and go out with the next sync",
                    git::tail(&o.stderr),
                    GIT_DIR
                )));
            }
            let remote = rev(git, &format!("refs/remotes/origin/{branch}")).await?;
            remote_before = remote.clone();
            let before = rev(git, "HEAD").await?.unwrap_or_default();
            if let Some(r) = &remote {
                let merged = git.run(&["merge-base", "--is-ancestor", r, "HEAD"]).await?.ok;
                if !merged {
                    let target = format!("refs/remotes/origin/{branch}");
                    let o = run_user(with_user(&[
                        "merge",
                        "-q",
                        "--no-edit",
                        "--no-ff",
                        "--allow-unrelated-histories",
                        &target,
                    ]))
                    .await?;
                    if !o.ok {
                        let unmerged = lines_z(&git.ok(&["diff", "--name-only", "-z", "--diff-filter=U"]).await?);
                        if unmerged.is_empty() {
                            let _ = git.run(&["merge", "--abort"]).await;
                            return Err(Error::Internal(format!("git merge failed: {}", git::tail(&o.stderr))));
                        }
                        let (found, notes) = self.resolve(git, &unmerged).await?;
                        conflicts.extend(found);
                        let o = run_user(with_user(&["commit", "-q", "--no-edit"])).await?;
                        if !o.ok {
                            return Err(Error::Internal(format!("git commit failed: {}", git::tail(&o.stderr))));
                        }
                        let mut notes = notes;
                        if let Some((c, n)) = self.keep_default_profile(git, &before, &user).await? {
                            conflicts.push(c);
                            notes.push(n);
                        }
                        self.apply(git, &before, notes, &mut missing).await?;
                    } else {
                        let mut notes = Vec::new();
                        if let Some((c, n)) = self.keep_default_profile(git, &before, &user).await? {
                            conflicts.push(c);
                            notes.push(n);
                        }
                        self.apply(git, &before, notes, &mut missing).await?;
                    }
                }
            }
            // 3. Out.
            let o = git.run(&["push", "-q", "origin", &format!("HEAD:refs/heads/{branch}")]).await?;
            if o.ok {
                break;
            }
            let rejected = o.stderr.contains("rejected") || o.stderr.contains("fetch first");
            if !rejected || attempt == PUSH_ATTEMPTS {
                return Err(Error::Unavailable(format!(
                    "cannot push to the sync remote: {}. Local changes are committed in {}/ and go out with the next sync",
                    git::tail(&o.stderr),
                    GIT_DIR
                )));
            }
            tracing::info!(attempt, "The remote moved during the sync; merging again.");
        }
        let _ = git.run(&["fetch", "-q", "origin"]).await;
        let head = rev(git, "HEAD").await?.unwrap_or_default();
        let pushed = diff(git, remote_before.as_deref().unwrap_or(EMPTY_TREE), &head).await?;
        let pulled = diff(git, &base, &head).await?;
        let finished_ms = now_ms();
        tracing::info!(
            commit = %head,
            pulled = pulled.paths.len(),
            pushed = pushed.paths.len(),
            conflicts = conflicts.len(),
            "Synced."
        );
        Ok(SyncReport {
            pushed: Some(pushed),
            pulled: Some(pulled),
            conflicts,
            commit: head,
            finished_ms,
            missing_credentials: missing,
            remote: self.remote(git).await,
        })
    }

    /// After a merge from `before`: apply `vault/` to the store, re-index what changed. A vault
    /// the store refuses undoes the merge (local commits stay) and names the file.
    async fn apply(
        &self,
        git: &Git,
        before: &str,
        notes: Vec<SyncConflictNote>,
        missing: &mut Vec<String>,
    ) -> Result<()> {
        let state = self.load_state();
        match self.apply_vault(notes, state.export_seq).await {
            Ok(m) => *missing = m,
            Err(e) => {
                let _ = git.run(&["reset", "-q", "--hard", before]).await;
                return Err(e);
            }
        }
        let head = rev(git, "HEAD").await?.unwrap_or_default();
        let mut state = self.load_state();
        state.applied = head.clone();
        self.save_state(&state)?;
        self.reindex(git, before, &head).await;
        Ok(())
    }

    async fn apply_vault(&self, conflicts: Vec<SyncConflictNote>, since_seq: u64) -> Result<Vec<String>> {
        let entries = self.read_vault()?;
        let req = ApplyVaultRequest { entries, since_seq, actor: "sync".into(), conflicts, dry_run: false };
        let reply = self.vault.clone().apply_vault(req).await.map_err(|s| match s.code() {
            tonic::Code::InvalidArgument => Error::Invalid(format!(
                "a pulled vault file is malformed, nothing was applied and the merge was undone: {}",
                s.message()
            )),
            _ => Error::Store(s),
        })?;
        let r = reply.into_inner();
        if r.added + r.changed + r.removed > 0 {
            tracing::info!(added = r.added, changed = r.changed, removed = r.removed, "Vault state applied.");
        }
        Ok(r.missing_credentials)
    }

    /// Undoes what an interrupted sync left: stale lock files (only our own git uses this
    /// repository, one at a time, and a killed one leaves its locks), a merge in progress, and a
    /// merged commit whose vault was not applied yet.
    async fn recover(&self, git: &Git) -> Result<()> {
        let dir = self.git_dir();
        let mut stale = Vec::new();
        collect_locks(&dir, &mut stale, 0);
        for lock in stale {
            tracing::warn!(path = %lock.display(), "Removing a lock file an interrupted sync left.");
            let _ = std::fs::remove_file(&lock);
        }
        if dir.join("MERGE_HEAD").exists() {
            tracing::warn!("Aborting a merge an interrupted sync left.");
            if !git.run(&["merge", "--abort"]).await?.ok {
                git.ok(&["reset", "-q", "--merge"]).await?;
            }
        }
        let state = self.load_state();
        if let Some(head) = rev(git, "HEAD").await?
            && !state.applied.is_empty()
            && state.applied != head
        {
            tracing::warn!(applied = %state.applied, head = %head, "Applying a merge an interrupted sync left.");
            let mut missing = Vec::new();
            let before = state.applied.clone();
            // Reset on a refused vault would lose nothing: `before` is this machine's last state.
            self.apply(git, &before, Vec::new(), &mut missing).await?;
        }
        Ok(())
    }

    /// Makes `COFFER_HOME/vault/` hold exactly `entries` (files rewritten only when they differ).
    fn write_vault(&self, entries: &[VaultEntry]) -> Result<()> {
        let root = self.home.join("vault");
        let mut keep = std::collections::BTreeSet::new();
        for e in entries {
            let path = root.join(&e.path);
            keep.insert(path.clone());
            if std::fs::read(&path).is_ok_and(|b| b == e.json.as_bytes()) {
                continue;
            }
            let dir = path.parent().expect("a vault path has a folder");
            std::fs::create_dir_all(dir).map_err(|err| Error::io(format!("creating {}", dir.display()), err))?;
            let name = path.file_name().and_then(|n| n.to_str()).expect("a vault file name");
            crate::memory::write_atomic(dir, name, e.json.as_bytes())?;
        }
        for path in vault_files(&root) {
            if !keep.contains(&path) && path.extension().is_some_and(|x| x == "json") {
                std::fs::remove_file(&path).map_err(|err| Error::io(format!("removing {}", path.display()), err))?;
            }
        }
        Ok(())
    }

    /// Every file of `COFFER_HOME/vault/`, as entries (path relative to `vault/`).
    fn read_vault(&self) -> Result<Vec<VaultEntry>> {
        let root = self.home.join("vault");
        let mut out = Vec::new();
        for path in vault_files(&root) {
            let rel = path.strip_prefix(&root).expect("under root").to_string_lossy().into_owned();
            let bytes = std::fs::read(&path).map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
            let json = String::from_utf8(bytes)
                .map_err(|_| Error::Invalid(format!("vault/{rel}: not UTF-8 text; nothing was applied")))?;
            out.push(VaultEntry { path: rel, json });
        }
        Ok(out)
    }

    /// After a merge from `before` (this machine's commit): a merge that removed
    /// `vault/profiles/default.json` is refused, because `default` is every unnamed client's
    /// profile and cannot be removed anywhere else (`DELETE /v1/mcp/profiles/default` is a 409);
    /// applying the removal would silently reset this machine's default profile to "everything,
    /// no overrides". This machine's file is restored in a commit of its own (`user`: the `-c`
    /// identity arguments), so the push puts it back on the remote too, and the refusal is
    /// reported as a conflict ([`ConflictKind::LocalKept`]) and noted for the audit log
    /// (`sync.conflict`, `kept: local`). `None` when the merge kept the file (or this machine
    /// never wrote it).
    async fn keep_default_profile(
        &self,
        git: &Git,
        before: &str,
        user: &[String],
    ) -> Result<Option<(Conflict, SyncConflictNote)>> {
        let had = git.run(&["cat-file", "-e", &format!("{before}:{DEFAULT_PROFILE_FILE}")]).await?.ok;
        let has = git.run(&["cat-file", "-e", &format!("HEAD:{DEFAULT_PROFILE_FILE}")]).await?.ok;
        if !had || has {
            return Ok(None);
        }
        let by = sanitize(&git.ok(&["log", "-1", "--format=%an", "HEAD^2"]).await.unwrap_or_default());
        let by = if by.is_empty() { "another machine".to_owned() } else { by };
        git.ok(&["checkout", before, "--", DEFAULT_PROFILE_FILE]).await?;
        let msg = format!("coffer sync: keep the default profile ({by} removed it; it cannot be removed)");
        let args: Vec<String> =
            user.iter().cloned().chain(["commit", "-q", "-m", &msg].into_iter().map(str::to_owned)).collect();
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = git.run(&refs).await?;
        if !o.ok {
            return Err(Error::Internal(format!("git commit failed: {}", git::tail(&o.stderr))));
        }
        tracing::warn!(by = %by, "A pulled removal of the default profile was refused; this machine's is kept.");
        let rel = DEFAULT_PROFILE_FILE.trim_start_matches("vault/").to_owned();
        let conflict = Conflict {
            kind: ConflictKind::LocalKept as i32,
            path: DEFAULT_PROFILE_FILE.to_owned(),
            sibling: String::new(),
            detail: format!(
                "removed on {by}: the default profile cannot be removed, so this machine's was kept (and goes back to the remote); to start it afresh, edit it (coffer profile edit default)"
            ),
        };
        Ok(Some((conflict, SyncConflictNote { path: rel, discarded_json: "null".into(), kept: "local".into() })))
    }

    /// Keeps both sides of every conflicted path: a file's other version becomes a sibling
    /// (`name.conflict-<machine>-<date>.ext`); a vault entry keeps the newer (`updated_at`) and
    /// the other goes to the audit log with the apply.
    async fn resolve(&self, git: &Git, paths: &[String]) -> Result<(Vec<Conflict>, Vec<SyncConflictNote>)> {
        let theirs_machine = sanitize(&git.ok(&["log", "-1", "--format=%an", "MERGE_HEAD"]).await.unwrap_or_default());
        let theirs_machine = if theirs_machine.is_empty() { "remote".to_owned() } else { theirs_machine };
        let stamp: String =
            coffer_runtime::now_rfc3339().chars().filter(char::is_ascii_digit).take(14).collect::<String>();
        let stamp = format!("{}-{}", &stamp[..8.min(stamp.len())], &stamp[8.min(stamp.len())..]);
        let (mut found, mut notes) = (Vec::new(), Vec::new());
        for path in paths {
            let ours = git.run(&["show", &format!(":2:{path}")]).await?;
            let theirs = git.run(&["show", &format!(":3:{path}")]).await?;
            if path.starts_with("vault/") {
                let rel = path.trim_start_matches("vault/").to_owned();
                match (ours.ok, theirs.ok) {
                    (true, true) => {
                        let at = |t: &str| {
                            serde_json::from_str::<serde_json::Value>(t)
                                .ok()
                                .and_then(|v| v["updated_at"].as_str().map(str::to_owned))
                                .unwrap_or_default()
                        };
                        let (a, b) = (at(&ours.stdout), at(&theirs.stdout));
                        // Newer wins; a tie is broken by the text, so both machines agree.
                        let theirs_wins = (b.as_str(), theirs.stdout.as_str()) > (a.as_str(), ours.stdout.as_str());
                        let side = if theirs_wins { "--theirs" } else { "--ours" };
                        git.ok(&["checkout", side, "--", path]).await?;
                        let (kept, discarded) =
                            if theirs_wins { ("remote", ours.stdout) } else { ("local", theirs.stdout) };
                        notes.push(SyncConflictNote { path: rel, discarded_json: discarded, kept: kept.into() });
                        found.push(Conflict {
                            kind: ConflictKind::NewerKept as i32,
                            path: path.clone(),
                            sibling: String::new(),
                            detail: format!(
                                "changed on this machine and on {theirs_machine}: kept the {} version (newer), the other is in the audit log",
                                if theirs_wins { "remote" } else { "local" }
                            ),
                        });
                    }
                    (o, _) => {
                        // Changed on one side, removed on the other: keep the changed one.
                        git.ok(&["checkout", if o { "--ours" } else { "--theirs" }, "--", path]).await?;
                    }
                }
                git.ok(&["add", "--", path]).await?;
                continue;
            }
            match (ours.ok, theirs.ok) {
                (true, true) => {
                    let sibling = sibling_name(path, &theirs_machine, &stamp);
                    let out = git.ok(&["checkout-index", "--stage=3", "--temp", "--", path]).await?;
                    let temp = out.split('\t').next().unwrap_or_default().trim().to_owned();
                    let from = self.home.join(&temp);
                    let to = self.home.join(&sibling);
                    std::fs::rename(&from, &to).map_err(|e| Error::io(format!("writing {}", to.display()), e))?;
                    git.ok(&["checkout", "--ours", "--", path]).await?;
                    git.ok(&["add", "--", path, &sibling]).await?;
                    found.push(Conflict {
                        kind: ConflictKind::BothKept as i32,
                        path: path.clone(),
                        sibling: sibling.clone(),
                        detail: format!(
                            "edited on this machine and on {theirs_machine}: this machine's version is {path}, the other {sibling}"
                        ),
                    });
                }
                (o, _) => {
                    git.ok(&["checkout", if o { "--ours" } else { "--theirs" }, "--", path]).await?;
                    git.ok(&["add", "--", path]).await?;
                }
            }
        }
        Ok((found, notes))
    }

    /// Re-indexes the files that changed between two commits (memory and folder KBs; a
    /// `knowledge/<name>/` folder no KB names yet becomes a KB).
    async fn reindex(&self, git: &Git, from: &str, to: &str) {
        let Ok(out) = git.ok(&["diff", "--name-only", "--no-renames", "-z", from, to]).await else { return };
        let mut by_kb: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for p in lines_z(&out) {
            let mut parts = p.splitn(3, '/');
            match (parts.next(), parts.next(), parts.next()) {
                (Some("memory"), Some(rest), None) => by_kb.entry(MEMORY.into()).or_default().push(rest.to_owned()),
                (Some("memory"), Some(a), Some(b)) => by_kb.entry(MEMORY.into()).or_default().push(format!("{a}/{b}")),
                (Some("knowledge"), Some(kb), Some(rest)) => {
                    by_kb.entry(kb.to_owned()).or_default().push(rest.to_owned())
                }
                _ => {}
            }
        }
        for (kb, files) in by_kb {
            let def = match self.sources.get(&kb) {
                Some(d) => d,
                None => {
                    if !self.home.join("knowledge").join(&kb).is_dir() {
                        continue;
                    }
                    match self.sources.add(&kb, "", vec![], vec![]).await {
                        Ok(d) => {
                            tracing::info!(kb = %kb, "A synced knowledge base was defined here.");
                            self.indexer.start_kb(&d.name);
                            continue;
                        }
                        Err(e) => {
                            tracing::warn!(kb = %kb, error = %e, "Cannot define a synced knowledge base.");
                            continue;
                        }
                    }
                }
            };
            let Some(rt) = self.indexer.runtime(&def.name) else {
                self.indexer.start_kb(&def.name);
                continue;
            };
            let root = PathBuf::from(&def.root);
            self.indexer.on_paths(&rt, files.iter().map(|f| root.join(f)).collect()).await;
        }
    }

    async fn remote(&self, git: &Git) -> String {
        match git.run(&["remote", "get-url", "origin"]).await {
            Ok(o) if o.ok => git::redact_url(o.stdout.trim()),
            _ => String::new(),
        }
    }

    /// `coffer sync status`.
    ///
    /// # Errors
    /// The store's errors (missing credentials).
    pub async fn status(&self) -> Result<SyncStatus> {
        let mut st = SyncStatus { machine: self.machine(), ..Default::default() };
        {
            let live = self.live.lock().expect("live");
            st.worker = live.worker;
            st.next_attempt_ms = live.next_attempt_ms;
            st.running = live.running;
            st.failures = live.failures;
        }
        st.initialized = self.initialized();
        if !st.initialized {
            return Ok(st);
        }
        let state = self.load_state();
        st.last_sync_ms = state.last_sync_ms;
        st.last_error = state.last_error;
        if let Ok(git) = self.git() {
            st.remote = self.remote(git).await;
            let range = format!("HEAD...refs/remotes/origin/{}", self.branch());
            if let Ok(o) = git.run(&["rev-list", "--left-right", "--count", &range]).await
                && o.ok
            {
                let mut n = o.stdout.split_whitespace().map(|x| x.parse::<u32>().unwrap_or(0));
                st.ahead = n.next().unwrap_or(0);
                st.behind = n.next().unwrap_or(0);
            }
            if let Ok(files) = git.ok(&["ls-files", "-z", "--", "knowledge", "memory", "skills"]).await {
                for sibling in lines_z(&files).into_iter().filter(|p| p.contains(".conflict-")) {
                    let path = original_of(&sibling);
                    st.conflicts.push(Conflict {
                        kind: ConflictKind::BothKept as i32,
                        detail: format!(
                            "both versions kept: compare {sibling} with {path}, then remove the one you do not want"
                        ),
                        path,
                        sibling,
                    });
                }
            }
        }
        st.missing_credentials =
            self.vault.clone().export_vault(ExportVaultRequest {}).await?.into_inner().missing_credentials;
        Ok(st)
    }

    fn set_worker(&self, state: WorkerState, next_attempt_ms: i64) {
        let mut live = self.live.lock().expect("live");
        live.worker = state as i32;
        live.next_attempt_ms = next_attempt_ms;
    }

    /// The opt-in worker (`sync.auto`): after a local change (a KB or memory file indexed, a
    /// vault write in the store) it waits `sync.debounce_s` of quiet, then syncs; it syncs at
    /// least every `sync.pull_interval_s`; after a failure it waits twice as long each time (up
    /// to an hour). Runs until `shutdown`. A restore never overlaps it: `coffer restore` runs
    /// only while no daemon does.
    pub async fn worker(self: Arc<Self>, mut changes: tokio::sync::watch::Receiver<u64>, shutdown: CancellationToken) {
        let mut config = self.config.clone();
        let mut last_seen = self.fingerprint(*changes.borrow());
        let mut next_pull = tokio::time::Instant::now();
        let mut dirty_since: Option<tokio::time::Instant> = None;
        loop {
            let cfg = config.borrow().sync.clone();
            if !cfg.auto || !self.initialized() {
                self.set_worker(WorkerState::Off, 0);
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = config.changed() => {}
                    _ = self.kick.notified() => {}
                    _ = tokio::time::sleep(Duration::from_secs(30)) => {}
                }
                next_pull = tokio::time::Instant::now();
                continue;
            }
            let failures = self.live.lock().expect("live").failures;
            let due = match dirty_since {
                Some(at) if failures == 0 => (at + cfg.debounce).min(next_pull),
                _ => next_pull,
            };
            let state = if dirty_since.is_some() && failures == 0 {
                WorkerState::Waiting
            } else if failures > 0 {
                WorkerState::BackingOff
            } else {
                WorkerState::Idle
            };
            let wait = due.saturating_duration_since(tokio::time::Instant::now());
            self.set_worker(state, now_ms() + wait.as_millis() as i64);
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = config.changed() => continue,
                _ = changes.changed() => {}
                _ = tokio::time::sleep(CHANGE_POLL.min(wait)) => {}
            }
            let fp = self.fingerprint(*changes.borrow());
            if fp != last_seen {
                last_seen = fp;
                dirty_since = Some(tokio::time::Instant::now());
                continue;
            }
            if tokio::time::Instant::now() < due {
                continue;
            }
            self.set_worker(WorkerState::Syncing, 0);
            let result = self.sync().await;
            let mut live = self.live.lock().expect("live");
            match result {
                Ok(_) => {
                    live.failures = 0;
                    dirty_since = None;
                    next_pull = tokio::time::Instant::now() + cfg.pull_interval;
                }
                Err(e) => {
                    live.failures = live.failures.saturating_add(1);
                    tracing::warn!(error = %e, failures = live.failures, "Sync failed; backing off.");
                    let f = live.failures;
                    drop(live);
                    next_pull = tokio::time::Instant::now() + failure_wait(cfg.pull_interval, f);
                }
            }
            // Our own sync's writes are not local changes.
            last_seen = self.fingerprint(*changes.borrow());
        }
    }

    /// What changes when something local does: the store's change head and the newest index
    /// update of any KB.
    fn fingerprint(&self, head: u64) -> (u64, i64) {
        let newest = self
            .sources
            .all()
            .iter()
            .filter_map(|k| self.indexer.runtime(&k.name))
            .map(|rt| rt.last_sync_ms())
            .max()
            .unwrap_or(0);
        (head, newest)
    }
}

/// Follows the store's change head into `tx` (for the worker), until `shutdown`.
pub async fn follow_head(
    mut changes: coffer_proto::store::changes_client::ChangesClient<AuthChannel>,
    tx: tokio::sync::watch::Sender<u64>,
    shutdown: CancellationToken,
) {
    use coffer_proto::store::HeadRequest;
    let mut tick = tokio::time::interval(Duration::from_secs(5));
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        if let Ok(h) = changes.head(HeadRequest {}).await {
            tx.send_if_modified(|cur| {
                let seq = h.get_ref().seq;
                let changed = *cur != seq;
                *cur = seq;
                changed
            });
        }
    }
}

/// A remote git accepts: a URL or scp-like address, 1-2048 bytes, no control character, not
/// an option.
fn check_remote(remote: &str) -> Result<()> {
    if remote.trim().is_empty() {
        return Err(Error::Invalid(
            "remote is required: a git URL (https://…, ssh://…, git@host:path, file:///…)".into(),
        ));
    }
    if remote.len() > 2048 {
        return Err(Error::Invalid(format!("remote is {} bytes; at most 2048", remote.len())));
    }
    if remote.starts_with('-') || remote.chars().any(char::is_control) {
        return Err(Error::Invalid("remote must be a git URL, not an option or text with control characters".into()));
    }
    if remote.starts_with("ext::") || remote.starts_with("fd::") {
        return Err(Error::Invalid("remote transports ext:: and fd:: run commands; use a URL".into()));
    }
    Ok(())
}

/// `raw` as a name: lower case, `[a-z0-9-]`, at most 32.
fn sanitize(raw: &str) -> String {
    let s: String =
        raw.trim().to_lowercase().chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).take(32).collect();
    s.trim_matches('-').to_owned()
}

/// The host name (`/proc/sys/kernel/hostname`), empty when unreadable.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default()
}

/// The default machine name `init` chooses: the host name (sanitized; `machine` when nothing is
/// left) and 4 random hex digits, e.g. `vm-3fa2`, at most 32 characters.
fn default_machine_name(host: &str) -> String {
    let mut bytes = [0u8; 2];
    // Without randomness the suffix is the process id's: still unlikely to repeat.
    if getrandom::fill(&mut bytes).is_err() {
        bytes = (std::process::id() as u16).to_le_bytes();
    }
    let host = sanitize(host);
    let host = if host.is_empty() { "machine".to_owned() } else { host };
    let host: String = host.chars().take(27).collect();
    format!("{}-{}", host.trim_end_matches('-'), hex::encode(bytes))
}

/// The branch the remote's `HEAD` names, if it answers one: `git ls-remote --symref REMOTE
/// HEAD` (`ref: refs/heads/<branch>\tHEAD`) for a repository with commits; an empty one
/// advertises its unborn `HEAD` only to `clone` (git 2.31 and later), so it is cloned (there
/// is nothing to transfer) into a scratch directory of the sync repository, whose `HEAD` then
/// names the branch.
async fn remote_default_branch(git: &Git, remote: &str) -> Option<String> {
    let o = git.run(&["ls-remote", "--symref", "--", remote, "HEAD"]).await.ok()?;
    if !o.ok {
        return None;
    }
    if let Some(b) = parse_symref_head(&o.stdout) {
        return Some(b);
    }
    if !o.stdout.trim().is_empty() {
        return None;
    }
    let probe = git.git_dir().join("head-probe.git");
    let _ = std::fs::remove_dir_all(&probe);
    let path = probe.to_string_lossy().into_owned();
    let cloned = git.run(&["clone", "-q", "--bare", "--", remote, &path]).await.is_ok_and(|o| o.ok);
    let head = if cloned { std::fs::read_to_string(probe.join("HEAD")).ok() } else { None };
    let _ = std::fs::remove_dir_all(&probe);
    head.and_then(|h| branch_of(h.trim().strip_prefix("ref:")?.trim()))
}

/// `refs/heads/<branch>` → `<branch>`, for a branch name git would take here.
fn branch_of(target: &str) -> Option<String> {
    let branch = target.strip_prefix("refs/heads/")?;
    (!branch.is_empty() && !branch.starts_with('-')).then(|| branch.to_owned())
}

/// The branch of the `ref: refs/heads/<branch>\tHEAD` line of `ls-remote --symref` output.
fn parse_symref_head(out: &str) -> Option<String> {
    out.lines().find_map(|l| {
        let (target, name) = l.strip_prefix("ref:")?.trim().split_once('\t')?;
        if name.trim() != "HEAD" {
            return None;
        }
        branch_of(target.trim())
    })
}

/// `dir/note.md` → `dir/note.conflict-<machine>-<stamp>.md` (no extension: appended).
fn sibling_name(path: &str, machine: &str, stamp: &str) -> String {
    let (dir, file) = path.rsplit_once('/').map_or(("", path), |(d, f)| (d, f));
    let named = match file.rsplit_once('.') {
        Some((stem, ext)) if !stem.is_empty() => format!("{stem}.conflict-{machine}-{stamp}.{ext}"),
        _ => format!("{file}.conflict-{machine}-{stamp}"),
    };
    if dir.is_empty() { named } else { format!("{dir}/{named}") }
}

/// The path a conflict sibling stands beside.
fn original_of(sibling: &str) -> String {
    let (dir, file) = sibling.rsplit_once('/').map_or(("", sibling), |(d, f)| (d, f));
    let name = match file.find(".conflict-") {
        Some(i) => {
            let ext = file[i..].rsplit_once('.').map(|(_, e)| e).filter(|e| !e.starts_with("conflict-"));
            match ext {
                Some(ext) => format!("{}.{ext}", &file[..i]),
                None => file[..i].to_owned(),
            }
        }
        None => file.to_owned(),
    };
    if dir.is_empty() { name } else { format!("{dir}/{name}") }
}

/// The vault file of the `default` profile (a removal of it is refused: [`Engine::keep_default_profile`]).
const DEFAULT_PROFILE_FILE: &str = "vault/profiles/default.json";

async fn rev(git: &Git, name: &str) -> Result<Option<String>> {
    let o = git.run(&["rev-parse", "-q", "--verify", &format!("{name}^{{commit}}")]).await?;
    Ok(o.ok.then(|| o.stdout.trim().to_owned()))
}

fn lines_z(out: &str) -> Vec<String> {
    out.split('\0').filter(|s| !s.is_empty()).map(str::to_owned).collect()
}

/// Files and vault entries added, changed and removed between two commits (or trees).
async fn diff(git: &Git, from: &str, to: &str) -> Result<Direction> {
    let out = git.ok(&["diff", "--name-status", "--no-renames", "-z", from, to]).await?;
    let mut d = Direction { files: Some(Counts::default()), vault: Some(Counts::default()), paths: vec![] };
    let mut it = out.split('\0').filter(|s| !s.is_empty());
    while let (Some(status), Some(path)) = (it.next(), it.next()) {
        let c = if path.starts_with("vault/") { d.vault.as_mut() } else { d.files.as_mut() }.expect("set");
        match status.chars().next() {
            Some('A') => c.added += 1,
            Some('D') => c.removed += 1,
            _ => c.changed += 1,
        }
        if d.paths.len() < MAX_PATHS {
            d.paths.push(path.to_owned());
        }
    }
    Ok(d)
}

fn collect_locks(dir: &Path, out: &mut Vec<PathBuf>, depth: usize) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name();
        let name = name.to_string_lossy();
        if p.is_dir() {
            // Objects are written to temp files and renamed: no locks there worth a walk.
            if depth < 6 && name != "objects" {
                collect_locks(&p, out, depth + 1);
            }
        } else if name.ends_with(".lock") {
            out.push(p);
        }
    }
}

fn vault_files(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(root) else { return out };
    for e in entries.flatten() {
        let p = e.path();
        let hidden = e.file_name().to_string_lossy().starts_with('.');
        if hidden {
            continue;
        }
        if p.is_dir() {
            if let Ok(inner) = std::fs::read_dir(&p) {
                for f in inner.flatten() {
                    if f.path().is_file() && !f.file_name().to_string_lossy().starts_with('.') {
                        out.push(f.path());
                    }
                }
            }
        } else if p.is_file() {
            out.push(p);
        }
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failure_waits_double_from_twice_the_interval() {
        let s = Duration::from_secs;
        assert_eq!(failure_wait(s(300), 1), s(120), "at most a minute of the interval, doubled");
        assert_eq!(failure_wait(s(10), 1), s(20));
        assert_eq!(failure_wait(s(10), 3), s(80));
        assert_eq!(failure_wait(s(60), 20), MAX_BACKOFF);
        let tiny = Duration::from_millis(100);
        assert_eq!(failure_wait(tiny, 40), failure_wait(tiny, 12), "the doubling stops after 12 failures");
    }

    #[test]
    fn sibling_names_say_whose_and_when() {
        assert_eq!(sibling_name("memory/01AB.md", "b", "20261203-120000"), "memory/01AB.conflict-b-20261203-120000.md");
        assert_eq!(sibling_name("knowledge/kb/README", "b", "1-2"), "knowledge/kb/README.conflict-b-1-2");
        assert_eq!(original_of("memory/01AB.conflict-b-20261203-120000.md"), "memory/01AB.md");
        assert_eq!(original_of("knowledge/kb/README.conflict-b-1-2"), "knowledge/kb/README");
    }

    #[test]
    fn remotes_that_are_options_or_commands_are_refused() {
        for bad in ["", "-uhack", "ext::sh -c id", "a\nb", &"x".repeat(3000)] {
            assert!(check_remote(bad).is_err(), "{bad}");
        }
        for ok in ["file:///tmp/r.git", "git@github.com:me/vault.git", "https://h/r.git"] {
            check_remote(ok).unwrap();
        }
    }

    #[test]
    fn machine_names_are_sanitized() {
        assert_eq!(sanitize(" My Laptop.local\n"), "my-laptop-local");
        assert_eq!(sanitize("../.."), "");
    }

    /// Two machines both called `vm` get distinct default names.
    #[test]
    fn default_machine_names_add_a_random_suffix() {
        let (a, b) = (default_machine_name("vm\n"), default_machine_name("vm\n"));
        assert!(a.starts_with("vm-") && a.len() == "vm-".len() + 4, "{a}");
        assert_ne!(a, b, "random suffixes (a 1-in-65536 clash would fail this)");
        assert_eq!(sanitize(&a), a);
        let long = default_machine_name(&"h".repeat(100));
        assert!(long.len() <= 32, "{long}");
        assert!(default_machine_name("").starts_with("machine-"));
    }

    #[test]
    fn the_remote_head_names_the_branch() {
        assert_eq!(parse_symref_head("ref: refs/heads/master\tHEAD\n"), Some("master".into()));
        assert_eq!(
            parse_symref_head("ref: refs/heads/trunk\tHEAD\n0123456789abcdef0123456789abcdef01234567\tHEAD\n"),
            Some("trunk".into())
        );
        assert_eq!(parse_symref_head(""), None);
        assert_eq!(parse_symref_head("0123\tHEAD\n"), None);
    }
}
