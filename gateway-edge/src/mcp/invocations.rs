//! The invocation log's writer (`mcp_invocations`: who called what, how long, the outcome;
//! never arguments or results).
//!
//! The request path only queues a [`Record`] (no formatting, no store round trip). A thread of
//! its own, at the background priority of `coffer_runtime::sched::background_priority` and
//! with its own one-thread runtime and store connection, turns records into the store's rows
//! and writes them in batches (up to [`INVOCATION_BATCH`] per request, gathered for [`GATHER`]),
//! so building and encoding a batch of thousands never holds up the gateway's thread, which
//! relays every call.
//!
//! Once a batch is written, the writer thread publishes each row, with the id the store gave it,
//! on a broadcast channel ([`Recorder::subscribe`]; `GET /v1/invocations/events`). It does so
//! only while someone subscribes, and the request path takes no part in it: a call costs
//! nothing more whether anybody watches or not.
use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use coffer_proto::store::invocations_client::InvocationsClient;
use coffer_proto::store::{AppendInvocationsRequest, Invocation, InvocationMethod, InvocationOutcome};
use coffer_runtime::grpc::AuthChannel;
use secrecy::SecretString;
use tokio::sync::{Notify, broadcast, mpsc, oneshot};

use crate::mcp::Outcome;
use crate::mcp::client::ClientIdentity;

/// The actor recorded for calls from an MCP client session.
pub const MCP_ACTOR: &str = "mcp";

/// Longest `target` kept in an invocation record, in bytes.
pub const MAX_RECORDED_TARGET: usize = 1024;
/// Longest `server` kept in an invocation record, in bytes (registered names have at most 24).
pub const MAX_RECORDED_SERVER: usize = 128;

/// Records per store request: with every field bounded (target and server as above, the rest
/// by their formats) a batch stays under 8 MiB, half the store's request limit;
/// large batches keep the store's cost per call low (one commit per batch).
pub const INVOCATION_BATCH: usize = 4000;

/// One invocation as the request path hands it over.
#[derive(Debug)]
pub struct Record {
    /// When the request arrived or was answered (the caller's clock reading).
    pub at: SystemTime,
    /// `tools/call`, `resources/read` or `prompts/get`.
    pub method: &'static str,
    /// Exposed name or URI as the client sent it, [`recorded`] to [`MAX_RECORDED_TARGET`].
    pub target: String,
    /// Server part, [`recorded`] to [`MAX_RECORDED_SERVER`].
    pub server: String,
    pub session_id: String,
    pub duration: Duration,
    pub outcome: Outcome,
    pub trace_id: String,
    /// Who called: [`MCP_ACTOR`] for an MCP client session (borrowed: no allocation per call).
    pub actor: Cow<'static, str>,
    /// What an internal-agent run used (`coffer__ask`); `None` for every other call (boxed: a
    /// record of an ordinary call stays as small as before).
    pub usage: Option<Box<Usage>>,
    /// The MCP client's `clientInfo` name and version (shared with its session: no allocation
    /// per call); `None` for a broker session, whose actor names the caller.
    pub client: Option<Arc<ClientIdentity>>,
    /// The conversation whose agent made the call ([`crate::mcp::Session::conversation`]); `None`
    /// for every other caller.
    pub conversation: Option<Arc<str>>,
    /// The profile of the MCP session that made the call ([`crate::mcp::Session::profile_name`]);
    /// `None` for a broker session.
    pub profile: Option<Arc<str>>,
}

/// An internal-agent run's usage, as the invocation of the tool that ran it records it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Usage {
    /// The LLM connection's name.
    pub connection: String,
    /// The model id.
    pub model: String,
    /// Input tokens summed over the run's model requests.
    pub input_tokens: u64,
    /// Output tokens summed.
    pub output_tokens: u64,
    /// Model requests made.
    pub iterations: u32,
}

impl Record {
    /// The store's row: timestamp in RFC 3339 (UTC, milliseconds).
    fn into_row(self) -> Invocation {
        let ms = self.at.duration_since(UNIX_EPOCH).unwrap_or_default().as_millis() as i64;
        Invocation {
            id: 0,
            at: coffer_runtime::rfc3339_from_unix_ms(ms),
            target: self.target,
            method: InvocationMethod::parse(self.method).unwrap_or_default().into(),
            server: self.server,
            session_id: self.session_id,
            duration_ms: self.duration.as_millis() as u64,
            outcome: outcome(self.outcome).into(),
            trace_id: self.trace_id,
            actor: self.actor.into_owned(),
            usage: self.usage.map(|u| coffer_proto::store::InvocationUsage {
                connection: u.connection,
                model: u.model,
                input_tokens: u.input_tokens,
                output_tokens: u.output_tokens,
                iterations: u.iterations,
            }),
            client_name: self.client.as_ref().map(|c| c.name.clone()).unwrap_or_default(),
            client_version: self.client.as_ref().map(|c| c.version.clone()).unwrap_or_default(),
            conversation_id: self.conversation.as_deref().unwrap_or_default().to_owned(),
            conversation_title: String::new(),
            profile: self.profile.as_deref().unwrap_or_default().to_owned(),
        }
    }
}

/// The store's name for an outcome.
fn outcome(o: Outcome) -> InvocationOutcome {
    match o {
        Outcome::Ok => InvocationOutcome::Ok,
        Outcome::UpstreamError => InvocationOutcome::UpstreamError,
        Outcome::Disabled => InvocationOutcome::Disabled,
        Outcome::Timeout => InvocationOutcome::Timeout,
        Outcome::Unreachable => InvocationOutcome::Unreachable,
        Outcome::Invalid => InvocationOutcome::Invalid,
        Outcome::Cancelled => InvocationOutcome::Cancelled,
    }
}

/// What the writer's queue carries: records, and now and then a request to write everything
/// queued before it at once ([`Recorder::flush`]).
// Records are nearly every item and a flush is rare: boxing the record would cost every call an
// allocation to save the rare flush some bytes.
#[allow(clippy::large_enum_variant)]
enum Queued {
    Record(Record),
    Flush(oneshot::Sender<()>),
}

/// Where the request path queues records; cheap to clone. Queuing never blocks or fails (once
/// the writer is gone, records are dropped).
#[derive(Clone)]
pub struct Recorder {
    sink: Sink,
    /// Rows as written (with their ids), for live watchers.
    written: broadcast::Sender<Arc<Invocation>>,
}

/// Rows a live watcher may fall behind by before it misses some (it is told how many).
pub const LIVE_BUFFER: usize = 1024;

#[derive(Clone)]
enum Sink {
    /// The writer thread's queue, and its wake-up for a flush (records never touch it).
    Writer {
        queue: mpsc::UnboundedSender<Queued>,
        flush: Arc<Notify>,
    },
    Memory(mpsc::UnboundedSender<Record>),
}

/// Longest a [`Recorder::flush`] waits for the writer (a store that is restarting).
pub const FLUSH_WAIT: Duration = Duration::from_secs(3);

impl Recorder {
    /// Queues `record` for the writer.
    pub fn record(&self, record: Record) {
        match &self.sink {
            Sink::Writer { queue, .. } => {
                let _ = queue.send(Queued::Record(record));
            }
            Sink::Memory(tx) => {
                let _ = tx.send(record);
            }
        }
    }

    /// Has every record queued before this call written to the store, then returns: a reader
    /// of the log (`GET /v1/invocations`) sees every call answered before it asked, instead of
    /// racing the next batch. Waits at most [`FLUSH_WAIT`]; the request path never calls it.
    pub async fn flush(&self) {
        let Sink::Writer { queue, flush } = &self.sink else { return };
        let (tx, rx) = oneshot::channel();
        if queue.send(Queued::Flush(tx)).is_err() {
            return;
        }
        // Cuts the writer's gathering pause short; the queue keeps the order.
        flush.notify_one();
        if tokio::time::timeout(FLUSH_WAIT, rx).await.is_err() {
            tracing::debug!("Invocation flush timed out; the log may miss the newest calls.");
        }
    }

    /// A recorder that keeps records in memory: they arrive, in order, on the receiver (tests
    /// of the gateway core read them there; nothing is written to a store).
    pub fn in_memory() -> (Self, mpsc::UnboundedReceiver<Record>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Self { sink: Sink::Memory(tx), written: broadcast::channel(1).0 }, rx)
    }

    /// Every row written from now on, with its id, as the store keeps it (a recorder that
    /// keeps records in memory publishes none). A receiver more than [`LIVE_BUFFER`] rows
    /// behind gets `RecvError::Lagged`.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Invocation>> {
        self.written.subscribe()
    }

    /// Starts the writer thread, which connects to the store at `store_addr` with the internal
    /// `token`. It ends when every [`Recorder`] is dropped, after writing what was queued.
    ///
    /// # Errors
    /// When the thread cannot be started.
    pub fn spawn(store_addr: String, token: SecretString) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::unbounded_channel();
        let flush = Arc::new(Notify::new());
        let woken = flush.clone();
        let written = broadcast::channel(LIVE_BUFFER).0;
        let publish = written.clone();
        std::thread::Builder::new().name("invocation-log".into()).spawn(move || {
            let (priority, warning) = coffer_runtime::sched::background_priority();
            if let Some(warning) = warning {
                tracing::warn!("{warning}.");
            }
            tracing::debug!(?priority, "Invocation writer priority.");
            let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(r) => r,
                Err(e) => return tracing::error!(error = %e, "No runtime for the invocation writer; invocations are not recorded."),
            };
            runtime.block_on(async move {
                match coffer_runtime::grpc::channel(&store_addr, &token) {
                    Ok(channel) => write_batches(InvocationsClient::new(channel), rx, woken, publish).await,
                    Err(e) => tracing::error!(error = %e, "Cannot reach the store; invocations are not recorded."),
                }
            });
        })?;
        Ok(Self { sink: Sink::Writer { queue: tx, flush }, written })
    }
}

/// `text` as recorded: whole when it has at most `max` bytes, else cut at a character boundary
/// and ended with `…` (`max` bytes at most in all). Copies only what is kept: a multi-MB
/// target costs the request path no more than a short one.
pub fn recorded(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max - '…'.len_utf8();
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// How long records gather before they are written: the first record after a quiet period
/// wakes the writer, which then sleeps this long and takes everything queued meanwhile.
pub const GATHER: Duration = Duration::from_millis(200);

/// Writes records in batches (up to [`INVOCATION_BATCH`] per store request) until the queue
/// ends. While the writer sleeps through [`GATHER`] it waits on nothing but `flush`, so
/// queuing a record wakes no thread (an unpark per record, across threads, cost the relaying
/// thread more than the record itself). A flush request in the queue writes what came before
/// it at once and is then answered; `flush` ends the pause early so it does not wait for
/// [`GATHER`]. A batch the store cannot take because it is restarting is tried again (5 times
/// in all, backing off from 100 ms); one it refuses is dropped, with a warning.
async fn write_batches(
    mut store: InvocationsClient<AuthChannel>,
    mut rx: mpsc::UnboundedReceiver<Queued>,
    flush: Arc<Notify>,
    publish: broadcast::Sender<Arc<Invocation>>,
) {
    let mut batch = Vec::with_capacity(INVOCATION_BATCH);
    let mut answered: Vec<oneshot::Sender<()>> = Vec::new();
    while let Some(first) = rx.recv().await {
        match first {
            Queued::Record(r) => {
                batch.push(r);
                tokio::select! {
                    _ = tokio::time::sleep(GATHER) => {}
                    _ = flush.notified() => {}
                }
            }
            Queued::Flush(done) => answered.push(done),
        }
        loop {
            let mut flushing = !answered.is_empty();
            while batch.len() < INVOCATION_BATCH && !flushing {
                match rx.try_recv() {
                    Ok(Queued::Record(record)) => batch.push(record),
                    Ok(Queued::Flush(done)) => {
                        answered.push(done);
                        flushing = true;
                    }
                    Err(_) => break,
                }
            }
            let full = batch.len() == INVOCATION_BATCH;
            if !batch.is_empty() {
                write_batch(&mut store, batch.drain(..).map(Record::into_row).collect(), &publish).await;
            }
            for done in answered.drain(..) {
                let _ = done.send(());
            }
            if !full && !flushing {
                break;
            }
        }
    }
}

/// One store request for `rows`, retried across a store restart; once written, each row goes
/// to `publish` with its id, if anyone listens.
async fn write_batch(
    store: &mut InvocationsClient<AuthChannel>,
    rows: Vec<Invocation>,
    publish: &broadcast::Sender<Arc<Invocation>>,
) {
    let n = rows.len();
    let request = AppendInvocationsRequest { invocations: rows };
    for attempt in 0..5u32 {
        match store.append_invocations(request.clone()).await {
            Ok(reply) => {
                let ids = reply.into_inner().ids;
                if publish.receiver_count() > 0 && ids.len() == n {
                    for (mut row, id) in request.invocations.into_iter().zip(ids) {
                        row.id = id;
                        let _ = publish.send(Arc::new(row));
                    }
                }
                break;
            }
            // Only an unreachable or restarting store is worth another try.
            Err(e) if !matches!(e.code(), tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled) => {
                tracing::warn!(error = %e, count = n, "Dropped invocation records: the store refused the batch.");
                break;
            }
            Err(e) if attempt < 4 => {
                tracing::debug!(error = %e, attempt, "Invocation batch write failed; retrying.");
                let backoff = coffer_runtime::Backoff::new(Duration::from_millis(100), Duration::from_millis(800));
                tokio::time::sleep(backoff.delay_after(attempt + 1)).await;
            }
            Err(e) => tracing::warn!(error = %e, count = n, "Dropped invocation records: store unavailable."),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorded_fields_are_cut_at_a_char_boundary() {
        assert_eq!(recorded("everything__echo", MAX_RECORDED_TARGET), "everything__echo");
        let exact = "a".repeat(MAX_RECORDED_TARGET);
        assert_eq!(recorded(&exact, MAX_RECORDED_TARGET), exact);
        assert_eq!(recorded(&"d".repeat(1 << 20), MAX_RECORDED_SERVER).len(), MAX_RECORDED_SERVER);
        // Multi-byte characters straddling the limit are not split.
        let long = format!("file:///{}", "é".repeat(MAX_RECORDED_TARGET));
        let short = recorded(&long, MAX_RECORDED_TARGET);
        assert!(short.len() <= MAX_RECORDED_TARGET, "{}", short.len());
        assert!(short.ends_with('…') && long.starts_with(short.trim_end_matches('…')));
    }

    #[test]
    fn a_record_becomes_the_store_s_row() {
        let at = UNIX_EPOCH + Duration::from_millis(1_764_460_800_123); // 2025-11-30T00:00:00.123Z
        let row = Record {
            at,
            method: "tools/call",
            target: recorded(&format!("x__{}", "y".repeat(5000)), MAX_RECORDED_TARGET),
            server: "x".into(),
            session_id: "s1".into(),
            duration: Duration::from_micros(2_900),
            outcome: Outcome::UpstreamError,
            trace_id: "t1".into(),
            actor: Cow::Borrowed(MCP_ACTOR),
            usage: None,
            client: Some(Arc::new(ClientIdentity { name: "claude-code".into(), version: "2.1.0".into() })),
            conversation: Some(Arc::from("c-1")),
            profile: Some(Arc::from("work")),
        }
        .into_row();
        assert_eq!((row.conversation_id.as_str(), row.profile.as_str()), ("c-1", "work"));
        assert_eq!(row.at, "2025-11-30T00:00:00.123Z");
        assert_eq!(row.target.len(), MAX_RECORDED_TARGET);
        assert_eq!((row.method().as_str(), row.server.as_str(), row.session_id.as_str()), ("tools/call", "x", "s1"));
        assert_eq!((row.duration_ms, row.outcome().as_str(), row.trace_id.as_str()), (2, "upstream_error", "t1"));
        assert_eq!(
            (row.actor.as_str(), row.client_name.as_str(), row.client_version.as_str()),
            ("mcp", "claude-code", "2.1.0")
        );
        for &o in Outcome::ALL {
            assert_eq!(outcome(o).as_str(), o.as_str());
        }
    }
}
