//! Flow control between a session's upstreams and its client: whatever an upstream sends and
//! however slowly a client reads, the gateway's memory stays bounded.
//!
//! - [`Lane`]: a bounded queue of server→client messages for one transport stream (the shim's
//!   `/mcp` stream, a POST's SSE answer, a modern request's SSE answer, a modern call's input
//!   requests). A notification that finds it full is dropped and counted ([`Drops`]: logged once
//!   per burst with the count); a request that finds it full is refused to its upstream.
//! - [`Flow`]: what a session decides per message: `notifications/*/list_changed` to the client
//!   coalesced per kind (at most one per [`LIST_CHANGED_GAP`], trailing edge kept), an
//!   upstream's `list_changed` turned into at most one re-list in flight per server and kind
//!   ([`Flow::relist`]), and `notifications/message` forwarded only at or above the level the
//!   client asked for with `logging/setLevel`, at most [`LOG_RATE`] per second per upstream.
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio::sync::mpsc::{self, error::TrySendError};

use crate::mcp::catalog::ListKind;

/// Messages a [`Lane`] holds that its client has not read yet…
pub const LANE_MESSAGES: usize = 256;
/// … and bytes: whichever limit is reached first (a single larger message still passes when the
/// lane is empty). The shim's stream or one POST's answer never holds more than this.
pub const LANE_BYTES: usize = 4 * 1024 * 1024;
/// Shortest time between two `notifications/*/list_changed` of one kind to one client.
pub const LIST_CHANGED_GAP: Duration = Duration::from_millis(250);
/// Shortest time between two re-lists of one server's list of one kind after its upstream said
/// the list changed.
pub const RELIST_GAP: Duration = Duration::from_millis(250);
/// Upstream log messages (`notifications/message`) forwarded per second per upstream, on
/// average (token bucket refilled at this rate)…
pub const LOG_RATE: f64 = 20.0;
/// … and at most this many at once after a quiet spell (the bucket's size).
pub const LOG_BURST: f64 = 50.0;

/// Counts messages dropped on one path and logs them once per burst: when delivery resumes, or
/// when the path ends, one warning with how many were dropped since the last one.
pub struct Drops {
    /// What was dropped, for the log line ("notifications to a /mcp stream").
    what: &'static str,
    total: AtomicU64,
    burst: AtomicU64,
}

impl Drops {
    /// A counter for messages of `what`.
    pub const fn new(what: &'static str) -> Self {
        Self { what, total: AtomicU64::new(0), burst: AtomicU64::new(0) }
    }

    /// Counts `n` dropped messages.
    pub fn add(&self, n: u64) {
        self.total.fetch_add(n, Ordering::Relaxed);
        if self.burst.fetch_add(n, Ordering::Relaxed) == 0 {
            tracing::debug!(what = self.what, "Dropping messages: the client or the session cannot keep up.");
        }
    }

    /// Delivery goes on: ends a burst of drops, logging its count.
    pub fn resumed(&self) {
        // A load first: the common case (no burst) writes nothing.
        if self.burst.load(Ordering::Relaxed) > 0 {
            self.flush();
        }
    }

    /// Logs the current burst's count, if any.
    fn flush(&self) {
        let n = self.burst.swap(0, Ordering::Relaxed);
        if n > 0 {
            tracing::warn!(
                dropped = n,
                total = self.total(),
                what = self.what,
                "Dropped messages the client could not take in time."
            );
        }
    }

    /// Messages dropped so far.
    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }
}

impl Drop for Drops {
    fn drop(&mut self) {
        self.flush();
    }
}

/// A bounded queue of server→client messages (complete JSON-RPC objects) for one transport
/// stream. Cloned senders share the queue and its drop counter.
#[derive(Clone)]
pub struct Lane {
    tx: mpsc::Sender<String>,
    /// Bytes queued and not yet taken by the [`LaneRx`].
    bytes: Arc<AtomicUsize>,
    drops: Arc<Drops>,
}

/// The stream writer's end of a [`Lane`].
pub struct LaneRx {
    rx: mpsc::Receiver<String>,
    bytes: Arc<AtomicUsize>,
}

impl LaneRx {
    /// The next message; `None` once every [`Lane`] is gone and the queue is empty.
    pub async fn recv(&mut self) -> Option<String> {
        let msg = self.rx.recv().await?;
        self.bytes.fetch_sub(msg.len(), Ordering::Relaxed);
        Some(msg)
    }

    /// The next message if one is queued.
    ///
    /// # Errors
    /// `Empty` or `Disconnected`, as [`mpsc::Receiver::try_recv`].
    pub fn try_recv(&mut self) -> Result<String, mpsc::error::TryRecvError> {
        let msg = self.rx.try_recv()?;
        self.bytes.fetch_sub(msg.len(), Ordering::Relaxed);
        Ok(msg)
    }

    /// The messages as a stream (for an SSE body).
    pub fn into_stream(self) -> impl futures_util::Stream<Item = String> {
        futures_util::stream::unfold(self, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) })
    }
}

/// Why [`Lane::deliver`] could not queue a message.
#[derive(Debug, PartialEq, Eq)]
pub enum Undelivered {
    /// The client has [`LANE_MESSAGES`] unread messages on this stream.
    Full,
    /// The stream ended.
    Closed,
}

impl Lane {
    /// A lane of `capacity` messages whose drops are counted as `what`; the receiver goes to
    /// the stream's writer.
    pub fn new(capacity: usize, what: &'static str) -> (Self, LaneRx) {
        let (tx, rx) = mpsc::channel(capacity);
        let bytes = Arc::new(AtomicUsize::new(0));
        (Self { tx, bytes: bytes.clone(), drops: Arc::new(Drops::new(what)) }, LaneRx { rx, bytes })
    }

    /// Queues `msg` unless the lane is full in messages or in bytes ([`LANE_BYTES`]).
    fn try_send(&self, msg: String) -> Result<(), Undelivered> {
        let len = msg.len();
        let queued = self.bytes.load(Ordering::Relaxed);
        if queued > 0 && queued + len > LANE_BYTES {
            return if self.tx.is_closed() { Err(Undelivered::Closed) } else { Err(Undelivered::Full) };
        }
        match self.tx.try_send(msg) {
            Ok(()) => {
                self.bytes.fetch_add(len, Ordering::Relaxed);
                self.drops.resumed();
                Ok(())
            }
            Err(TrySendError::Full(_)) => Err(Undelivered::Full),
            Err(TrySendError::Closed(_)) => Err(Undelivered::Closed),
        }
    }

    /// Queues a notification, or drops and counts it when the lane is full. False when the
    /// stream ended (the client went away).
    pub fn notify(&self, msg: String) -> bool {
        match self.try_send(msg) {
            Ok(()) => true,
            Err(Undelivered::Full) => {
                self.drops.add(1);
                true
            }
            Err(Undelivered::Closed) => false,
        }
    }

    /// Queues a message that must arrive (a relayed request): never dropped silently, the
    /// caller answers its upstream with an error instead.
    ///
    /// # Errors
    /// [`Undelivered::Full`] when the client has not read [`LANE_MESSAGES`] messages,
    /// [`Undelivered::Closed`] when the stream ended.
    pub fn deliver(&self, msg: String) -> Result<(), Undelivered> {
        self.try_send(msg)
    }

    /// True once the stream's reader is gone.
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// Notifications dropped on this lane so far.
    pub fn dropped(&self) -> u64 {
        self.drops.total()
    }
}

/// The MCP logging levels (RFC 5424 severities as MCP 2025-11-25 server/utilities/logging names
/// them), least severe first; a level's rank is its index + 1 (0: the client asked for none).
const LEVELS: [&str; 8] = ["debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"];

/// The rank of MCP logging level `name` (1 = debug … 8 = emergency), `None` for an unknown one.
pub fn level_rank(name: &str) -> Option<u8> {
    LEVELS.iter().position(|l| *l == name).map(|i| i as u8 + 1)
}

/// The list kinds a client hears about, one bit each in [`Flow`]'s pending set.
const NOTIFIED: [ListKind; 3] = [ListKind::Tools, ListKind::Prompts, ListKind::Resources];

/// A token bucket: [`LOG_RATE`] tokens a second, at most [`LOG_BURST`] kept.
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn take(&mut self, now: Instant) -> bool {
        let refill = now.saturating_duration_since(self.at).as_secs_f64() * LOG_RATE;
        self.tokens = (self.tokens + refill).min(LOG_BURST);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// A re-list in flight for one server and kind: whether another change arrived meanwhile.
struct Relisting {
    again: bool,
}

/// One session's flow decisions (see the module docs).
pub struct Flow {
    /// Kinds whose `list_changed` waits to be sent (bit i: `NOTIFIED[i]`).
    pending: AtomicU8,
    wake: Notify,
    /// The client's `logging/setLevel` rank (0 until it asks: upstream log messages are then
    /// not forwarded at all).
    log_level: AtomicU8,
    buckets: Mutex<HashMap<String, Bucket>>,
    relisting: Mutex<HashMap<(String, ListKind), Relisting>>,
    /// Upstream log messages held back (below the level, or over the rate).
    pub logs_dropped: Drops,
    /// Upstream notifications the session could not route (unknown progress token, a full lane).
    pub notifications_dropped: Drops,
}

impl Default for Flow {
    fn default() -> Self {
        Self {
            pending: AtomicU8::new(0),
            wake: Notify::new(),
            log_level: AtomicU8::new(0),
            buckets: Mutex::default(),
            relisting: Mutex::default(),
            logs_dropped: Drops::new("upstream log messages over the rate limit"),
            notifications_dropped: Drops::new("upstream notifications for a client stream that is full or gone"),
        }
    }
}

impl Flow {
    /// Asks for `notifications/<kind>/list_changed` (`method`) to be sent; returns false for a
    /// method that is not one of the three list changes a client hears about.
    pub fn list_changed(&self, method: &str) -> bool {
        let Some(i) = NOTIFIED.iter().position(|k| k.list_changed() == method) else { return false };
        self.pending.fetch_or(1 << i, Ordering::AcqRel);
        self.wake.notify_one();
        true
    }

    /// Waits until a list change is asked for, then takes every pending one (the methods to
    /// send). The caller sends them and waits [`LIST_CHANGED_GAP`] before calling again: one
    /// kind is sent at most once per gap, and a change asked for meanwhile is sent after it
    /// (the trailing edge is never lost).
    pub async fn next_list_changes(&self) -> Vec<&'static str> {
        loop {
            let bits = self.pending.swap(0, Ordering::AcqRel);
            if bits != 0 {
                return NOTIFIED
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| bits & (1 << i) != 0)
                    .map(|(_, k)| k.list_changed())
                    .collect();
            }
            self.wake.notified().await;
        }
    }

    /// Remembers the client's `logging/setLevel` level.
    ///
    /// # Errors
    /// The levels MCP names, when `level` is none of them.
    pub fn set_log_level(&self, level: &str) -> Result<(), String> {
        let rank = level_rank(level).ok_or_else(|| {
            format!(
                "unknown logging level {:?}; one of {}",
                level.chars().take(40).collect::<String>(),
                LEVELS.join(", ")
            )
        })?;
        self.log_level.store(rank, Ordering::Relaxed);
        Ok(())
    }

    /// Whether an upstream log message of `level` from `server` goes to the client: it asked
    /// for logging, the level is at or above what it asked for (a message without a known level
    /// counts as `info`), and `server` is within its rate ([`LOG_RATE`], [`LOG_BURST`]).
    /// Messages over the rate are counted in [`Flow::logs_dropped`].
    pub fn admit_log(&self, server: &str, level: Option<&str>) -> bool {
        let wanted = self.log_level.load(Ordering::Relaxed);
        let rank = level.and_then(level_rank).unwrap_or(2);
        if wanted == 0 || rank < wanted {
            return false;
        }
        let now = Instant::now();
        let mut buckets = self.buckets.lock().expect("buckets");
        let bucket = buckets.entry(server.to_owned()).or_insert(Bucket { tokens: LOG_BURST, at: now });
        if bucket.take(now) {
            self.logs_dropped.resumed();
            true
        } else {
            self.logs_dropped.add(1);
            false
        }
    }

    /// An upstream of `server` said its list of `kind` changed: true when the caller should
    /// start a re-list now (none is in flight); otherwise the one in flight is asked to run once
    /// more when it ends ([`Flow::relisted`]).
    pub fn relist(&self, server: &str, kind: ListKind) -> bool {
        let mut r = self.relisting.lock().expect("relisting");
        match r.get_mut(&(server.to_owned(), kind)) {
            Some(run) => {
                run.again = true;
                false
            }
            None => {
                r.insert((server.to_owned(), kind), Relisting { again: false });
                true
            }
        }
    }

    /// A re-list of `server`'s `kind` ended: true when another change arrived meanwhile and the
    /// caller should re-list once more (after [`RELIST_GAP`]); otherwise nothing is in flight.
    pub fn relisted(&self, server: &str, kind: ListKind) -> bool {
        let mut r = self.relisting.lock().expect("relisting");
        let key = (server.to_owned(), kind);
        match r.get_mut(&key) {
            Some(run) if run.again => {
                run.again = false;
                true
            }
            _ => {
                r.remove(&key);
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_lane_drops_notifications_and_refuses_requests() {
        let (lane, mut rx) = Lane::new(2, "test");
        assert!(lane.notify("1".into()));
        assert_eq!(lane.deliver("2".into()), Ok(()));
        assert!(lane.notify("3".into()), "dropped, not an error: the stream is still there");
        assert_eq!(lane.deliver("4".into()), Err(Undelivered::Full));
        assert_eq!(lane.dropped(), 1);
        assert_eq!(rx.try_recv().unwrap(), "1");
        assert!(lane.notify("5".into()));
        assert_eq!(rx.try_recv().unwrap(), "2");
        assert_eq!(rx.try_recv().unwrap(), "5");
        drop(rx);
        assert!(!lane.notify("6".into()), "the stream ended");
        assert_eq!(lane.deliver("7".into()), Err(Undelivered::Closed));

        let (lane, mut rx) = Lane::new(100, "test");
        let big = "x".repeat(LANE_BYTES / 2 + 1);
        assert_eq!(lane.deliver(big.repeat(3)), Ok(()), "one message over the byte limit passes an empty lane");
        assert_eq!(lane.deliver(big.clone()), Err(Undelivered::Full), "the bytes are the limit here");
        rx.try_recv().unwrap();
        assert_eq!(lane.deliver(big.clone()), Ok(()));
        assert_eq!(lane.deliver(big), Err(Undelivered::Full));
    }

    #[test]
    fn log_messages_need_a_level_and_are_rate_limited_per_upstream() {
        let flow = Flow::default();
        assert!(!flow.admit_log("a", Some("emergency")), "nothing before logging/setLevel");
        assert!(flow.set_log_level("loud").unwrap_err().contains("debug, info, notice"));
        flow.set_log_level("warning").unwrap();
        assert!(!flow.admit_log("a", Some("info")));
        assert!(!flow.admit_log("a", None), "no level counts as info");
        assert!(flow.admit_log("a", Some("error")));
        let admitted = (0..1000).filter(|_| flow.admit_log("a", Some("warning"))).count();
        assert!(admitted < LOG_BURST as usize + 5, "{admitted} admitted at once");
        assert!(flow.logs_dropped.total() > 900);
        assert!(flow.admit_log("b", Some("alert")), "each upstream has its own bucket");
        assert_eq!(level_rank("debug"), Some(1));
        assert_eq!(level_rank("emergency"), Some(8));
    }

    #[test]
    fn one_relist_runs_at_a_time_and_a_change_meanwhile_runs_it_once_more() {
        let flow = Flow::default();
        assert!(flow.relist("s", ListKind::Tools));
        assert!(!flow.relist("s", ListKind::Tools));
        assert!(!flow.relist("s", ListKind::Tools));
        assert!(flow.relist("s", ListKind::Prompts), "another kind is its own");
        assert!(flow.relisted("s", ListKind::Tools), "changes arrived meanwhile: once more");
        assert!(!flow.relisted("s", ListKind::Tools));
        assert!(flow.relist("s", ListKind::Tools), "nothing in flight any more");
    }

    #[tokio::test]
    async fn list_changes_are_coalesced_per_kind() {
        let flow = Flow::default();
        assert!(!flow.list_changed("notifications/message"));
        for _ in 0..1000 {
            flow.list_changed("notifications/tools/list_changed");
        }
        flow.list_changed("notifications/resources/list_changed");
        assert_eq!(
            flow.next_list_changes().await,
            ["notifications/tools/list_changed", "notifications/resources/list_changed"]
        );
        flow.list_changed("notifications/prompts/list_changed");
        assert_eq!(flow.next_list_changes().await, ["notifications/prompts/list_changed"], "the trailing edge");
    }
}
