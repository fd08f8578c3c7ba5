//! The adapter coordinator (see [`super`]): the only thing that starts, stops or restarts a
//! channel adapter.
//!
//! A tick (a `channel` or `credential` row on the change stream, an adapter task that ended,
//! or every [`SAFETY_TICK`]) lists the channels, resolves each enabled one's credentials
//! (`ResolveCredentials`) and compares with what runs: a channel enabled and not running is
//! started; one running and now disabled or deleted is stopped (cancel, then its task awaited
//! at most [`STOP_GRACE`]); one whose record version, kind or credential values changed is
//! restarted (its record read again after the old adapter stopped, so the new one starts from
//! the offset the old one persisted). A missing credential leaves a `failed` status naming it
//! and no adapter. After each tick `coffer-callback` is kept matching the running SeaTalk
//! adapters ([`super::seatalk::CallbackManager::sync`]).
//!
//! [`AdaptersService`] serves `coffer.channel.v1.ChannelAdapters` from the same state.
use coffer_runtime::logging::{Failing, FailureLog};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use coffer_proto::channel as ch;
use coffer_proto::control::control_client::ControlClient;
use coffer_proto::store::changes_client::ChangesClient;
use coffer_proto::store::channels_client::ChannelsClient;
use coffer_proto::store::credentials_client::CredentialsClient;
use coffer_proto::store::{self as st, ChangeEntity, ChannelKind, ChannelRecord};
use coffer_runtime::grpc::AuthChannel;
use secrecy::{ExposeSecret, SecretString};
use tokio::sync::{Notify, mpsc, watch};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use super::{AdapterCtx, StatusCell, seatalk, telegram};
use crate::engine::Engine;

/// The periodic tick (a missed change, a store restart).
pub const SAFETY_TICK: Duration = Duration::from_secs(30);
/// How long a stopped adapter's task may take to end before it is aborted.
pub const STOP_GRACE: Duration = Duration::from_secs(10);

/// What the coordinator and [`AdaptersService`] share: every channel's status cell and the
/// running SeaTalk adapters' inboxes.
#[derive(Default)]
pub struct Shared {
    statuses: Mutex<BTreeMap<String, Arc<StatusCell>>>,
    inboxes: Mutex<HashMap<String, mpsc::Sender<Vec<u8>>>>,
}

impl Shared {
    fn statuses(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Arc<StatusCell>>> {
        self.statuses.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn inboxes(&self) -> std::sync::MutexGuard<'_, HashMap<String, mpsc::Sender<Vec<u8>>>> {
        self.inboxes.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Every adapter's state, by channel name.
    pub fn list(&self) -> Vec<ch::AdapterStatus> {
        self.statuses().values().map(|c| c.get()).collect()
    }
}

/// What a running adapter was started from: a change of any of it restarts the adapter (the
/// owner is not in it: the bridge reads it for each message, so pairing restarts nothing).
#[derive(PartialEq, Eq)]
struct Fingerprint {
    version: i64,
    kind: i32,
    secrets: BTreeMap<String, String>,
}

struct Running {
    fingerprint: Fingerprint,
    kind: ChannelKind,
    cancel: CancellationToken,
    /// True once the adapter's task ended.
    done: watch::Receiver<bool>,
    abort: tokio::task::AbortHandle,
    secrets: BTreeMap<String, SecretString>,
    signing_secret_ref: String,
}

/// The coordinator's state (one per chat process).
pub struct Coordinator {
    engine: Arc<Engine>,
    store: AuthChannel,
    control: Option<ControlClient<AuthChannel>>,
    shared: Arc<Shared>,
    running: HashMap<String, Running>,
    /// Told when an adapter task ends.
    ended: Arc<Notify>,
    callback: seatalk::CallbackManager,
    /// Whether `coffer-callback` may be running (the last sync had signing secrets).
    callback_up: bool,
    /// Adapters whose task ended on its own, and when: started again after [`CRASH_DELAY`].
    crashed: HashMap<String, tokio::time::Instant>,
    /// Channels that cannot start, tick after tick: logged when that starts, when the reason
    /// changes, every 10 minutes and on recovery, not on every tick.
    failing: HashMap<String, FailureLog>,
}

/// How long an adapter whose task ended on its own waits before it is started again.
pub const CRASH_DELAY: Duration = Duration::from_secs(5);

/// Why an enabled channel cannot start.
fn missing(record: &ChannelRecord, values: &BTreeMap<String, SecretString>) -> Option<String> {
    let refs: Vec<(&str, &str)> = match record.kind() {
        ChannelKind::Telegram => vec![("bot_token_ref", &record.bot_token_ref)],
        ChannelKind::Seatalk => vec![
            ("app_id_ref", &record.app_id_ref),
            ("app_secret_ref", &record.app_secret_ref),
            ("signing_secret_ref", &record.signing_secret_ref),
        ],
        ChannelKind::Unspecified => return Some("the channel has no kind".into()),
    };
    for (field, name) in refs {
        if name.is_empty() {
            return Some(format!("{field} names no credential"));
        }
        if !values.contains_key(name) {
            return Some(format!("the credential {name:?} ({field}) is missing"));
        }
    }
    None
}

fn refs(record: &ChannelRecord) -> Vec<String> {
    [&record.bot_token_ref, &record.app_id_ref, &record.app_secret_ref, &record.signing_secret_ref]
        .into_iter()
        .filter(|r| !r.is_empty())
        .cloned()
        .collect()
}

impl Coordinator {
    /// A coordinator over the engine and the store; `control` (the supervisor) starts and
    /// stops `coffer-callback` (absent: SeaTalk channels run without it).
    pub fn new(engine: Arc<Engine>, store: AuthChannel, control: Option<ControlClient<AuthChannel>>) -> Self {
        Self {
            engine,
            store,
            control,
            shared: Arc::default(),
            running: HashMap::new(),
            ended: Arc::default(),
            callback: seatalk::CallbackManager::default(),
            callback_up: false,
            crashed: HashMap::new(),
            failing: HashMap::new(),
        }
    }

    /// The state [`AdaptersService`] serves.
    pub fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }

    /// Ticks until `shutdown`, then stops every adapter (and `coffer-callback`).
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut safety = tokio::time::interval(SAFETY_TICK);
        safety.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let changes = ChangesClient::new(self.store.clone());
        let mut stream: Option<tonic::Streaming<st::Change>> = None;
        loop {
            if stream.is_none() {
                let mut c = changes.clone();
                stream = async {
                    let head = c.head(st::HeadRequest {}).await.ok()?.into_inner().seq;
                    c.watch_changes(st::WatchChangesRequest { from_seq: head }).await.ok().map(|s| s.into_inner())
                }
                .await;
            }
            self.tick().await;
            let ended = self.ended.clone();
            loop {
                let relevant = tokio::select! {
                    () = shutdown.cancelled() => {
                        self.stop_all().await;
                        return;
                    }
                    _ = safety.tick() => true,
                    () = ended.notified() => true,
                    msg = async {
                        match stream.as_mut() {
                            Some(s) => s.message().await,
                            None => std::future::pending().await,
                        }
                    } => match msg {
                        Ok(Some(c)) => {
                            c.entity == ChangeEntity::Channel as i32 || c.entity == ChangeEntity::Credential as i32
                        }
                        // Ended or failed (the store restarted): reconnect at the next tick.
                        _ => {
                            stream = None;
                            false
                        }
                    },
                };
                if relevant || stream.is_none() {
                    break;
                }
            }
        }
    }

    /// One diff of the resources against the running adapters.
    pub async fn tick(&mut self) {
        let records = match ChannelsClient::new(self.store.clone()).list_channels(st::ListChannelsRequest {}).await {
            Ok(r) => r.into_inner().channels,
            Err(s) => {
                tracing::warn!(code = %s.code(), error = %s.message(), "Cannot list the channels; the adapters stay as they are.");
                return;
            }
        };
        let by_name: HashMap<String, ChannelRecord> = records.into_iter().map(|r| (r.name.clone(), r)).collect();
        // Stopped: deleted, disabled, or their task ended.
        let names: Vec<String> = self.running.keys().cloned().collect();
        for name in names {
            let ended = *self.running[&name].done.borrow();
            if ended {
                tracing::warn!(channel = %name, "A channel adapter ended on its own; it starts again shortly.");
                self.crashed.insert(name.clone(), tokio::time::Instant::now());
            }
            if ended || !by_name.get(&name).is_some_and(|r| r.enabled) {
                self.stop(&name).await;
            }
        }
        self.shared.statuses().retain(|name, _| by_name.contains_key(name));
        for record in by_name.values() {
            let cell = self.cell(record);
            if !record.enabled {
                cell.update(|s| {
                    s.state = "stopped".into();
                    s.last_error.clear();
                    s.retry_at_ms = 0;
                });
                continue;
            }
            let secrets = match self.resolve(record).await {
                Ok(s) => s,
                Err(e) => {
                    if self.should_log_failure(&record.name, &e.to_string()) {
                        tracing::warn!(channel = %record.name, error = %e, "Cannot resolve a channel's credentials.");
                    }
                    continue;
                }
            };
            if let Some(why) = missing(record, &secrets) {
                self.stop(&record.name).await;
                if self.should_log_failure(&record.name, &why) {
                    tracing::warn!(channel = %record.name, error = %why, "A channel cannot start.");
                }
                let cell = self.cell(record);
                cell.update(|s| {
                    s.state = "failed".into();
                    s.last_error = why;
                    s.retry_at_ms = 0;
                });
                continue;
            }
            let fp = Fingerprint {
                version: record.version,
                kind: record.kind,
                secrets: secrets.iter().map(|(k, v)| (k.clone(), v.expose_secret().to_owned())).collect(),
            };
            if self.running.get(&record.name).is_some_and(|r| r.fingerprint == fp) {
                continue;
            }
            if self.crashed.get(&record.name).is_some_and(|t| t.elapsed() < CRASH_DELAY) {
                continue;
            }
            self.crashed.remove(&record.name);
            let restart = self.running.contains_key(&record.name);
            let mut record = record.clone();
            if restart {
                self.stop(&record.name).await;
                // Between the stop and the start a delivery is answered UNAVAILABLE (the
                // callback retries it), not dropped as for a disabled channel.
                if let Some(cell) = self.shared.statuses().get(&record.name) {
                    cell.update(|s| s.state = RESTARTING.into());
                }
                // The old adapter may have moved the cursor since the list was read.
                match ChannelsClient::new(self.store.clone())
                    .get_channel(st::GetChannelRequest { name: record.name.clone() })
                    .await
                {
                    Ok(r) => record = r.into_inner(),
                    Err(s) => {
                        tracing::warn!(channel = %record.name, error = %s.message(), "Cannot read a channel again; retried at the next tick.");
                        continue;
                    }
                }
                tracing::info!(channel = %record.name, "A channel changed; its adapter restarts.");
            }
            self.start(record, secrets, fp);
        }
        self.sync_callback().await;
    }

    /// Records that channel `name` cannot start for `why`; true when that is worth a log line
    /// (see [`Coordinator::failing`]).
    fn should_log_failure(&mut self, name: &str, why: &str) -> bool {
        let log = self.failing.entry(name.to_owned()).or_insert_with(|| FailureLog::new(Duration::from_secs(600)));
        log.failed(why) != Failing::Quiet
    }

    /// The status cell of `record`, created `stopped`.
    fn cell(&self, record: &ChannelRecord) -> Arc<StatusCell> {
        let mut statuses = self.shared.statuses();
        let kind = record.kind().as_str();
        let cell = statuses.entry(record.name.clone()).or_insert_with(|| StatusCell::new(&record.name, kind));
        if cell.get().kind != kind {
            *cell = StatusCell::new(&record.name, kind);
        }
        cell.clone()
    }

    /// The channel's credentials by reference name (the absent ones left out).
    async fn resolve(&self, record: &ChannelRecord) -> Result<BTreeMap<String, SecretString>, Status> {
        let names = refs(record);
        if names.is_empty() {
            return Ok(BTreeMap::new());
        }
        let mut client = CredentialsClient::new(self.store.clone());
        let reply = client.resolve_credentials(st::ResolveCredentialsRequest { names: names.clone() }).await;
        let values = match reply {
            Ok(r) => r.into_inner().values,
            // The store refuses the whole batch when one is absent: each is asked alone, so the
            // ones present are known and `failed` names the one really missing (not the first
            // of the batch).
            Err(s) if s.code() == tonic::Code::NotFound => {
                let mut present = std::collections::HashMap::new();
                for name in names {
                    match client.resolve_credentials(st::ResolveCredentialsRequest { names: vec![name] }).await {
                        Ok(r) => present.extend(r.into_inner().values),
                        Err(s) if s.code() == tonic::Code::NotFound => {}
                        Err(s) => return Err(s),
                    }
                }
                present
            }
            Err(s) => return Err(s),
        };
        Ok(values.into_iter().map(|(k, v)| (k, SecretString::from(v))).collect())
    }

    fn start(&mut self, record: ChannelRecord, secrets: BTreeMap<String, SecretString>, fingerprint: Fingerprint) {
        if let Some(failures) = self.failing.remove(&record.name).and_then(|mut f| f.succeeded()) {
            tracing::info!(channel = %record.name, failures, "A channel that could not start can start now.");
        }
        let status = self.cell(&record);
        // A fresh state for the new run (the counters of the last one are not this one's).
        status.update(|s| {
            let (channel, kind) = (std::mem::take(&mut s.channel), std::mem::take(&mut s.kind));
            *s = ch::AdapterStatus { channel, kind, state: "running".into(), ..Default::default() };
        });
        let cancel = CancellationToken::new();
        let kind = record.kind();
        let name = record.name.clone();
        let signing_secret_ref = record.signing_secret_ref.clone();
        let ctx = AdapterCtx {
            record,
            secrets: secrets.clone(),
            engine: self.engine.clone(),
            store: self.store.clone(),
            status,
            cancel: cancel.clone(),
        };
        let handle = match kind {
            ChannelKind::Telegram => telegram::spawn(ctx),
            ChannelKind::Seatalk => seatalk::spawn(ctx),
            ChannelKind::Unspecified => return,
        };
        if let Some(inbox) = handle.inbox {
            self.shared.inboxes().insert(name.clone(), inbox);
        }
        let (done_tx, done) = watch::channel(false);
        let abort = handle.task.abort_handle();
        let ended = self.ended.clone();
        let task = handle.task;
        let watched = name.clone();
        tokio::spawn(async move {
            if let Err(e) = task.await
                && e.is_panic()
            {
                tracing::error!(channel = %watched, "A channel adapter panicked.");
            }
            let _ = done_tx.send(true);
            ended.notify_one();
        });
        tracing::info!(channel = %name, kind = kind.as_str(), "A channel adapter started.");
        self.running.insert(name, Running { fingerprint, kind, cancel, done, abort, secrets, signing_secret_ref });
    }

    /// Stops `name`'s adapter (if it runs): cancel, then its task awaited for [`STOP_GRACE`]
    /// before it is aborted.
    async fn stop(&mut self, name: &str) {
        let Some(mut r) = self.running.remove(name) else { return };
        self.shared.inboxes().remove(name);
        r.cancel.cancel();
        if tokio::time::timeout(STOP_GRACE, r.done.wait_for(|d| *d)).await.is_err() {
            tracing::warn!(channel = %name, "A channel adapter did not stop in time; aborted.");
            r.abort.abort();
        }
        // Stopped means stopped: no backoff countdown, no stale error (a failure found later,
        // e.g. a missing credential, is written after this).
        if let Some(cell) = self.shared.statuses().get(name) {
            cell.update(|s| {
                s.state = "stopped".into();
                s.last_error.clear();
                s.retry_at_ms = 0;
            });
        }
        tracing::info!(channel = %name, "A channel adapter stopped.");
    }

    async fn stop_all(&mut self) {
        let names: Vec<String> = self.running.keys().cloned().collect();
        for name in names {
            self.stop(&name).await;
        }
        self.sync_callback().await;
    }

    /// Keeps `coffer-callback` matching the running SeaTalk adapters (nothing to do while no
    /// SeaTalk channel runs or ran).
    async fn sync_callback(&mut self) {
        let signing: BTreeMap<String, SecretString> = self
            .running
            .iter()
            .filter(|(_, r)| r.kind == ChannelKind::Seatalk)
            .filter_map(|(name, r)| r.secrets.get(&r.signing_secret_ref).map(|s| (name.clone(), s.clone())))
            .collect();
        if signing.is_empty() && !self.callback_up {
            return;
        }
        let Some(control) = self.control.as_mut() else { return };
        match self.callback.sync(control, &signing).await {
            Ok(()) => self.callback_up = !signing.is_empty(),
            Err(e) => tracing::warn!(error = %e, "Cannot bring coffer-callback in line with the SeaTalk channels."),
        }
    }
}

/// The state an adapter shows between the stop and the start of a restart (a changed record or
/// credential).
pub const RESTARTING: &str = "restarting";

/// Largest SeaTalk event body accepted from coffer-callback, bytes (it refuses larger ones).
pub const MAX_EVENT_BYTES: usize = 1 << 20;

/// `coffer.channel.v1.ChannelAdapters`, served from the coordinator's state.
pub struct AdaptersService {
    /// The coordinator's state.
    pub shared: Arc<Shared>,
}

#[tonic::async_trait]
impl ch::channel_adapters_server::ChannelAdapters for AdaptersService {
    async fn deliver_seatalk_event(
        &self,
        req: Request<ch::SeatalkEvent>,
    ) -> Result<Response<ch::DeliverReply>, Status> {
        let ev = req.into_inner();
        if ev.body.len() > MAX_EVENT_BYTES {
            return Err(Status::invalid_argument(format!("body: over the limit of {MAX_EVENT_BYTES} bytes")));
        }
        if !serde_json::from_slice::<serde_json::Value>(&ev.body).is_ok_and(|v| v.is_object()) {
            return Err(Status::invalid_argument("body: not a JSON object (a SeaTalk event)"));
        }
        let Some(status) = self.shared.statuses().get(&ev.channel).map(|c| c.get()) else {
            return Err(Status::not_found(format!("no channel {:?}", ev.channel)));
        };
        if status.kind != ChannelKind::Seatalk.as_str() {
            return Err(Status::not_found(format!("channel {:?} is not a SeaTalk channel", ev.channel)));
        }
        let inbox = self.shared.inboxes().get(&ev.channel).cloned();
        let Some(inbox) = inbox else {
            if status.state == RESTARTING {
                return Err(Status::unavailable(format!("channel {:?} is restarting; redeliver", ev.channel)));
            }
            return Err(Status::failed_precondition(format!(
                "channel {:?} is {} (the event is dropped)",
                ev.channel, status.state
            )));
        };
        match inbox.try_send(ev.body) {
            Ok(()) => Ok(Response::new(ch::DeliverReply { duplicate: false })),
            Err(mpsc::error::TrySendError::Full(_)) => {
                Err(Status::unavailable(format!("channel {:?} is busy; redeliver later", ev.channel)))
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                Err(Status::unavailable(format!("channel {:?} is stopping", ev.channel)))
            }
        }
    }

    async fn list_adapters(
        &self,
        _req: Request<ch::ListAdaptersRequest>,
    ) -> Result<Response<ch::ListAdaptersReply>, Status> {
        Ok(Response::new(ch::ListAdaptersReply { adapters: self.shared.list() }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_credential_is_named() {
        let mut r = ChannelRecord {
            name: "tg".into(),
            kind: ChannelKind::Telegram as i32,
            bot_token_ref: "tg-token".into(),
            ..Default::default()
        };
        let none = BTreeMap::new();
        assert_eq!(missing(&r, &none).unwrap(), "the credential \"tg-token\" (bot_token_ref) is missing");
        let some = BTreeMap::from([("tg-token".to_owned(), SecretString::from("x"))]);
        assert_eq!(missing(&r, &some), None);
        r.kind = ChannelKind::Seatalk as i32;
        assert!(missing(&r, &some).unwrap().contains("app_id_ref"));
        assert_eq!(refs(&r), ["tg-token"]);
    }

    #[tokio::test]
    async fn deliveries_are_refused_as_the_proto_says() {
        use ch::channel_adapters_server::ChannelAdapters;
        let shared = Arc::new(Shared::default());
        let svc = AdaptersService { shared: shared.clone() };
        let ev = |channel: &str, body: &[u8]| {
            Request::new(ch::SeatalkEvent { channel: channel.into(), body: body.to_vec(), received_ms: 0 })
        };
        let code =
            |r: Result<Response<ch::DeliverReply>, Status>| r.map(|_| tonic::Code::Ok).unwrap_or_else(|s| s.code());
        assert_eq!(code(svc.deliver_seatalk_event(ev("st", b"not json")).await), tonic::Code::InvalidArgument);
        assert_eq!(code(svc.deliver_seatalk_event(ev("st", b"{}")).await), tonic::Code::NotFound);
        shared.statuses().insert("tg".into(), StatusCell::new("tg", "telegram"));
        assert_eq!(code(svc.deliver_seatalk_event(ev("tg", b"{}")).await), tonic::Code::NotFound, "not SeaTalk");
        shared.statuses().insert("st".into(), StatusCell::new("st", "seatalk"));
        assert_eq!(code(svc.deliver_seatalk_event(ev("st", b"{}")).await), tonic::Code::FailedPrecondition);
        shared.statuses()["st"].update(|s| s.state = RESTARTING.into());
        assert_eq!(code(svc.deliver_seatalk_event(ev("st", b"{}")).await), tonic::Code::Unavailable, "restarting");
        let (tx, mut rx) = mpsc::channel(1);
        shared.inboxes().insert("st".into(), tx);
        assert_eq!(code(svc.deliver_seatalk_event(ev("st", b"{\"a\":1}")).await), tonic::Code::Ok);
        assert_eq!(code(svc.deliver_seatalk_event(ev("st", b"{}")).await), tonic::Code::Unavailable, "full");
        assert_eq!(rx.recv().await.unwrap(), b"{\"a\":1}");
        let list = svc.list_adapters(Request::new(ch::ListAdaptersRequest {})).await.unwrap().into_inner();
        let names: Vec<&str> = list.adapters.iter().map(|a| a.channel.as_str()).collect();
        assert_eq!(names, ["st", "tg"]);
    }
}
