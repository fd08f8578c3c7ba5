//! A session's upstream pool: one slot per server, whose upstream is started lazily by the
//! first request that needs it (credentials resolved only then), kept while it is alive and
//! of the current generation (registry version and credential epoch), restarted at once after
//! a crash or a change, and retried with bounded backoff after a failed start. Two sessions
//! never share a pool: each owns its upstream children.
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use coffer_proto::store::McpServer;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::mcp::Shared;
use crate::mcp::catalog::Background;
use crate::mcp::upstream::{Upstream, UpstreamError};
use crate::snapshot::{Generation, Snapshot};

/// How long an upstream gets to exit after Coffer asks it to (stdin closed, then SIGTERM).
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);
/// First backoff after a failed start; it doubles per failure up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
/// Longest backoff between two starts of a failing upstream.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

enum SlotState {
    Idle,
    Ready {
        upstream: Arc<Upstream>,
        generation: Generation,
    },
    /// The last start failed; the next is tried after a backoff, or at once when the registry
    /// record or a credential it references changed since (`generation`: what that start was
    /// for), e.g. a missing credential set again.
    Failed {
        at: Instant,
        attempts: u32,
        error: UpstreamError,
        generation: Generation,
    },
}

struct Slot {
    state: tokio::sync::Mutex<SlotState>,
    /// Lock-free-ish fast path for the common case: the running upstream and the registry
    /// version and credential epoch it was started for. Stale entries fail the liveness and
    /// generation check.
    ready: std::sync::RwLock<Option<(Arc<Upstream>, Generation)>>,
}

impl Slot {
    fn new() -> Self {
        Self { state: tokio::sync::Mutex::new(SlotState::Idle), ready: std::sync::RwLock::new(None) }
    }

    fn ready_for(&self, generation: Generation) -> Option<Arc<Upstream>> {
        match &*self.ready.read().expect("slot") {
            Some((u, g)) if *g == generation && u.is_alive() => Some(u.clone()),
            _ => None,
        }
    }

    /// Stops the slot's upstream, if one runs.
    async fn stop(&self) {
        if let SlotState::Ready { upstream, .. } = std::mem::replace(&mut *self.state.lock().await, SlotState::Idle) {
            upstream.shutdown(SHUTDOWN_GRACE).await;
        }
    }
}

/// The upstreams of one session.
pub struct Pool {
    shared: Arc<Shared>,
    session_id: String,
    /// `{protocolVersion, capabilities, clientInfo}` mirrored to each upstream's `initialize`.
    init_params: Value,
    slots: Mutex<HashMap<String, Arc<Slot>>>,
    /// Where every upstream of the session sends what is not a response to a request.
    events: crate::mcp::upstream::Events,
    /// Level set by `logging/setLevel`, applied to upstreams started later too.
    log_level: Mutex<Option<String>>,
    /// Cancelled when the session ends: no upstream starts after that.
    closed: CancellationToken,
    /// The session's background task, told about every upstream started.
    background: mpsc::UnboundedSender<Background>,
}

impl Pool {
    /// An empty pool for session `session_id`, whose upstreams are initialized with
    /// `init_params` and report events to `events`; it starts nothing once `closed` fires, and
    /// tells `background` about every upstream it started.
    pub fn new(
        shared: Arc<Shared>,
        session_id: &str,
        init_params: Value,
        events: crate::mcp::upstream::Events,
        closed: CancellationToken,
        background: mpsc::UnboundedSender<Background>,
    ) -> Self {
        Self {
            shared,
            session_id: session_id.to_owned(),
            init_params,
            slots: Mutex::default(),
            events,
            log_level: Mutex::default(),
            closed,
            background,
        }
    }

    /// Whether the session has ended (nothing starts any more).
    pub fn is_closed(&self) -> bool {
        self.closed.is_cancelled()
    }

    /// Whether an upstream of `server` at `generation` runs in this session (never starts one,
    /// never waits).
    pub fn is_running(&self, server: &str, generation: Generation) -> bool {
        let slot = self.slots.lock().expect("slots").get(server).cloned();
        slot.is_some_and(|s| s.ready_for(generation).is_some())
    }

    /// What the downstream client sent in `initialize` (as mirrored upstream).
    pub fn init_params(&self) -> &Value {
        &self.init_params
    }

    /// Names of servers with a slot (running, failed or stopped).
    pub fn servers(&self) -> Vec<String> {
        self.slots.lock().expect("slots").keys().cloned().collect()
    }

    /// Names of upstreams running now.
    pub fn running_servers(&self) -> Vec<String> {
        let slots = self.slots.lock().expect("slots");
        slots
            .iter()
            .filter(|(_, s)| {
                s.state
                    .try_lock()
                    .is_ok_and(|st| matches!(&*st, SlotState::Ready { upstream, .. } if upstream.is_alive()))
            })
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// The running upstream for `server`, if any (never starts one).
    pub async fn running(&self, server: &str) -> Option<Arc<Upstream>> {
        let slot = self.slots.lock().expect("slots").get(server).cloned()?;
        match &*slot.state.lock().await {
            SlotState::Ready { upstream, .. } if upstream.is_alive() => Some(upstream.clone()),
            _ => None,
        }
    }

    /// The running upstream for `server`, started on demand (with bounded backoff after a
    /// failed start; restarted at once after a crash, a registry change or a change to a
    /// credential it references). `generation` is the snapshot's [`Snapshot::generation`] of
    /// `server`.
    ///
    /// # Errors
    /// [`UpstreamError::Start`] when it cannot be started (or the last start failed within the
    /// backoff); [`UpstreamError::Stopped`] once the session ended.
    pub async fn upstream(&self, server: &McpServer, generation: Generation) -> Result<Arc<Upstream>, UpstreamError> {
        let slot = {
            let mut slots = self.slots.lock().expect("slots");
            match slots.get(&server.name) {
                Some(slot) => slot.clone(),
                None => slots.entry(server.name.clone()).or_insert_with(|| Arc::new(Slot::new())).clone(),
            }
        };
        match slot.ready_for(generation) {
            Some(u) => Ok(u),
            // Boxed: the start path is large, and every call's future would otherwise carry it.
            None => Box::pin(self.start(server, generation, slot)).await,
        }
    }

    /// [`Pool::upstream`] when the slot has no live upstream of the current generation: starts
    /// one (once, however many callers wait), with backoff after failures.
    async fn start(
        &self,
        server: &McpServer,
        generation: Generation,
        slot: Arc<Slot>,
    ) -> Result<Arc<Upstream>, UpstreamError> {
        let mut st = slot.state.lock().await;
        let attempts = match &*st {
            SlotState::Ready { upstream, generation: started } if upstream.is_alive() && *started == generation => {
                return Ok(upstream.clone());
            }
            SlotState::Ready { upstream, .. } => {
                upstream.shutdown(SHUTDOWN_GRACE).await;
                0
            }
            SlotState::Failed { generation: failed_for, .. } if *failed_for != generation => 0,
            SlotState::Failed { at, attempts, error, .. } => {
                // `attempts` failures in a row: waits FIRST_BACKOFF × 2^attempts (1 s after
                // the first), i.e. one doubling ahead of the shared curve.
                let backoff = coffer_runtime::Backoff::new(FIRST_BACKOFF, MAX_BACKOFF).delay_after(*attempts + 1);
                // A sign-in since the failure is what it waited for (MCP authorization).
                if at.elapsed() < backoff && !self.shared.oauth.signed_in_since(&server.name, *at) {
                    return Err(during_backoff(error, at.elapsed(), backoff));
                }
                *attempts
            }
            SlotState::Idle => 0,
        };
        if self.closed.is_cancelled() {
            return Err(UpstreamError::Stopped { server: server.name.clone(), reason: "its session ended".into() });
        }
        let started = Instant::now();
        // Credential references become values only here, only for this child; a missing
        // credential fails the start like any other start error (-32001, naming it).
        // The era this registration was found speaking (by the catalog's background start or
        // an earlier session): the upstream starts in it directly, without a probe that fails.
        let hint = self.shared.lists.era(&server.name, generation);
        let res = match self.shared.resolve_server(server).await {
            Ok((resolved, secrets)) => {
                Upstream::start(
                    &resolved,
                    &self.shared.home,
                    &self.init_params,
                    self.events.clone(),
                    self.shared.start_timeout(),
                    secrets,
                    hint,
                    (resolved.transport() != coffer_proto::store::Transport::Stdio)
                        .then(|| self.shared.oauth.server(&server.name)),
                )
                .await
            }
            Err(reason) => Err(UpstreamError::Start { server: server.name.clone(), reason }),
        };
        match res {
            Ok(u) => {
                tracing::info!(server = %server.name, session = %self.session_id, pid = u.pid, era = u.era().as_str(), elapsed_ms = started.elapsed().as_millis() as u64, "Upstream started.");
                u.watch_health(self.shared.health.started(server));
                if u.speaks_legacy_sse() {
                    self.shared.health.spoke_legacy_sse(server);
                }
                self.shared.lists.learn_era(&server.name, generation, u.era());
                let level = self.log_level.lock().expect("level").clone();
                if let Some(level) = level
                    && !u.set_log_level(&level)
                    && u.has_capability("logging")
                {
                    let p = RawValue::from_string(json!({"level": level}).to_string()).expect("json");
                    let _ = u.request("logging/setLevel", Some(&p), self.shared.list_timeout()).await;
                }
                *slot.ready.write().expect("slot") = Some((u.clone(), generation));
                *st = SlotState::Ready { upstream: u.clone(), generation };
                let _ = self.background.send(Background::Started { server: server.name.clone() });
                Ok(u)
            }
            Err(e) => {
                tracing::warn!(server = %server.name, session = %self.session_id, error = %e, "Upstream failed to start.");
                if e.is_fault() {
                    self.shared.health.start_failed(server, &e.to_string());
                }
                *st = SlotState::Failed { at: Instant::now(), attempts: attempts + 1, error: e.clone(), generation };
                Err(e)
            }
        }
    }

    /// Remembers `level` for upstreams started later and applies it to every running upstream:
    /// a modern one gets it in each request's `_meta`, a handshake-era one that offers logging
    /// gets `logging/setLevel` (each bounded by the list deadline).
    pub async fn set_level(&self, level: String) {
        let p = RawValue::from_string(json!({"level": level}).to_string()).expect("json");
        *self.log_level.lock().expect("level") = Some(level.clone());
        for name in self.servers() {
            if let Some(up) = self.running(&name).await
                && !up.set_log_level(&level)
                && up.has_capability("logging")
                && let Err(e) = up.request("logging/setLevel", Some(&p), self.shared.list_timeout()).await
            {
                tracing::debug!(server = %name, error = %e, "logging/setLevel not applied.");
            }
        }
    }

    /// Stops the upstreams of servers no longer in `snapshot` (removed, not merely disabled: a
    /// disabled server's upstream stays up, calls already running finish, new ones are refused
    /// by policy, and it is reaped with the session).
    pub async fn stop_removed(&self, snapshot: &Snapshot) {
        let gone: Vec<Arc<Slot>> = {
            let mut slots = self.slots.lock().expect("slots");
            let names: Vec<String> = slots.keys().filter(|n| !snapshot.servers.contains_key(*n)).cloned().collect();
            names.into_iter().filter_map(|n| slots.remove(&n)).collect()
        };
        for slot in gone {
            slot.stop().await;
        }
    }

    /// Stops every upstream (their children are terminated and pid records removed).
    pub async fn close(&self) {
        let slots: Vec<Arc<Slot>> = self.slots.lock().expect("slots").drain().map(|(_, s)| s).collect();
        futures_util::future::join_all(slots.iter().map(|slot| slot.stop())).await;
    }
}

/// The failure a start within its backoff answers: the last start's error, saying it is that
/// one and when the next start is tried (a server back up within the backoff is otherwise
/// reported unreachable while it answers). `since`/`backoff`: elapsed and total, ms shown.
fn during_backoff(error: &UpstreamError, since: Duration, backoff: Duration) -> UpstreamError {
    match error {
        UpstreamError::Start { server, reason } => UpstreamError::Start {
            server: server.clone(),
            reason: format!(
                "{reason} (the last try, {} ms ago; the next start is tried in {} ms)",
                since.as_millis(),
                backoff.saturating_sub(since).as_millis().max(1)
            ),
        },
        other => other.clone(),
    }
}
