//! Agent processes kept between turns: a turn that ends normally may park its process for the
//! conversation's next turn, which then skips the CLI's start-up. A parked process is reused only
//! for what it was started for ([`Fit`]: program, session, model, `cwd`) and while it is alive and
//! quiet; at most [`MAX_KEPT`] are parked (the least recently parked is ended first), each for
//! at most [`KEEP_IDLE`]. Dropping a parked process ends its process group (SIGKILL: it is idle
//! and its session is on disk), which is also what happens to all of them when the provider goes.
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::agent_process::AgentProcess;

/// How many idle processes a provider keeps.
pub const MAX_KEPT: usize = 4;
/// How long an idle process is kept.
pub const KEEP_IDLE: Duration = Duration::from_secs(15 * 60);

/// What a process was started for; a turn reuses it only for the same.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fit {
    /// The CLI.
    pub program: PathBuf,
    /// The agent's session (thread) the process holds.
    pub session_id: String,
    /// The model it was started with (empty = the agent's default).
    pub model: String,
    /// Its working directory.
    pub cwd: String,
    /// The LLM connection binding it runs with ([`crate::binding::fingerprint`]; 0 = unbound):
    /// its environment was fixed at start, so another binding needs another process.
    pub binding: u64,
    /// Whether it runs in the vault sandbox (fixed at start, like the binding).
    pub sandbox: bool,
    /// The permission mode it was started in (its flags or thread policy were fixed then).
    pub mode: crate::adapter::PermissionMode,
}

struct Parked<T> {
    process: AgentProcess,
    fit: Fit,
    extra: T,
    generation: u64,
}

/// A provider's parked processes by conversation, with what the adapter needs to reuse each
/// (`T`).
pub struct Kept<T> {
    parked: HashMap<String, Parked<T>>,
    generation: u64,
}

impl<T> Default for Kept<T> {
    fn default() -> Self {
        Self { parked: HashMap::new(), generation: 0 }
    }
}

/// The shared form a provider holds.
pub type Shared<T> = Arc<Mutex<Kept<T>>>;

impl<T: Send + 'static> Kept<T> {
    /// Parks `process` for `conversation` (ending one parked before for it, and the least
    /// recently parked beyond [`MAX_KEPT`]); after [`KEEP_IDLE`] it is ended unless reused.
    /// Must be called inside a tokio runtime.
    pub fn park(shared: &Shared<T>, conversation: &str, process: AgentProcess, fit: Fit, extra: T) {
        let generation = {
            let mut kept = shared.lock().unwrap_or_else(|e| e.into_inner());
            kept.generation += 1;
            let generation = kept.generation;
            kept.parked.insert(conversation.to_owned(), Parked { process, fit, extra, generation });
            while kept.parked.len() > MAX_KEPT {
                let oldest = kept.parked.iter().min_by_key(|(_, p)| p.generation).map(|(k, _)| k.clone());
                match oldest {
                    Some(k) => drop(kept.parked.remove(&k)),
                    None => break,
                }
            }
            generation
        };
        let (weak, conversation) = (Arc::downgrade(shared), conversation.to_owned());
        tokio::spawn(async move {
            // The idle limit of a parked process: a timer, not a wait for readiness.
            tokio::time::sleep(KEEP_IDLE).await;
            if let Some(shared) = weak.upgrade() {
                let mut kept = shared.lock().unwrap_or_else(|e| e.into_inner());
                if kept.parked.get(&conversation).is_some_and(|p| p.generation == generation) {
                    kept.parked.remove(&conversation);
                }
            }
        });
    }

    /// The conversation's parked process when it fits and is alive and quiet; a parked process
    /// of the conversation that does not is ended.
    pub fn take(&mut self, conversation: &str, fit: &Fit) -> Option<(AgentProcess, T)> {
        let mut parked = self.parked.remove(conversation)?;
        (parked.fit == *fit && parked.process.idle_and_alive()).then_some((parked.process, parked.extra))
    }

    /// Ends the conversation's parked process, if any.
    pub fn forget(&mut self, conversation: &str) {
        drop(self.parked.remove(conversation));
    }

    /// The pid of the conversation's parked process.
    pub fn pid(&self, conversation: &str) -> Option<i32> {
        self.parked.get(conversation).map(|p| p.process.pid())
    }

    /// How many processes are parked.
    pub fn len(&self) -> usize {
        self.parked.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.parked.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapter::AgentEnv;

    fn cat(env: &AgentEnv) -> AgentProcess {
        AgentProcess::spawn(
            "test",
            env,
            std::path::Path::new("/bin/cat"),
            Vec::new(),
            Vec::new(),
            &env.coffer_home,
            None,
        )
        .unwrap()
    }

    fn fit(session: &str) -> Fit {
        Fit {
            program: "/bin/cat".into(),
            session_id: session.into(),
            model: String::new(),
            cwd: "/".into(),
            binding: 0,
            sandbox: false,
            mode: Default::default(),
        }
    }

    #[tokio::test]
    async fn parks_at_most_max_kept_and_reuses_only_what_fits() {
        let dir = tempfile::tempdir().unwrap();
        let env = AgentEnv {
            binding: None,
            coffer_home: dir.path().into(),
            agents_dir: dir.path().join("agents"),
            shim: dir.path().join("shim"),
            command_override: None,
            sandbox: false,
        };
        let shared: Shared<u32> = Arc::default();
        let mut pids = Vec::new();
        for i in 0..=MAX_KEPT {
            let p = cat(&env);
            pids.push(p.pid());
            Kept::park(&shared, &format!("c{i}"), p, fit("s"), i as u32);
        }
        let mut kept = shared.lock().unwrap();
        assert_eq!(kept.len(), MAX_KEPT);
        assert_eq!(kept.pid("c0"), None, "the least recently parked went first");
        // Another session: not reused, and ended.
        assert!(kept.take("c1", &fit("other")).is_none());
        assert_eq!(kept.pid("c1"), None);
        // The same: reused with its extra.
        let (p, extra) = kept.take("c2", &fit("s")).expect("reused");
        assert_eq!((p.pid(), extra), (pids[2], 2));
        kept.forget("c3");
        assert_eq!(kept.len(), 1);
    }
}
