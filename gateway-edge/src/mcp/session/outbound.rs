//! A session's server→client messages that answer no request of the client's (notifications,
//! relayed upstream requests without an originating call): queued for its GET stream (or the
//! `/mcp` stream), with event ids and a replay buffer for `Last-Event-ID` resumption (MCP
//! 2025-11-25 basic/transports §resumability). Both are bounded: [`REPLAY_BUFFER`] messages
//! and [`REPLAY_BYTES`] kept, [`BROADCAST`] messages a reader may fall behind.
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::broadcast;

/// Messages kept per session for `Last-Event-ID` resumption of the GET stream, at most…
const REPLAY_BUFFER: usize = 512;
/// … and bytes at most (the newest message is always kept).
const REPLAY_BYTES: usize = 4 * 1024 * 1024;
/// Messages a GET stream (or the `/mcp` stream's forwarder, a subscription) may fall behind
/// before it misses some (a lagging reader skips ahead; the GET stream counts what it missed).
const BROADCAST: usize = 256;

/// One message for the GET stream: its event id and the JSON-RPC text.
pub type OutboundEvent = (u64, Arc<str>);

/// Server→client messages for the session's GET stream, with ids for resumption.
pub struct Outbound {
    next: AtomicU64,
    ring: Mutex<VecDeque<(u64, Arc<str>)>>,
    /// Bytes of the messages in `ring`.
    ring_bytes: std::sync::atomic::AtomicUsize,
    tx: broadcast::Sender<(u64, Arc<str>)>,
}

impl Default for Outbound {
    fn default() -> Self {
        Self {
            next: AtomicU64::new(1),
            ring: Mutex::new(VecDeque::new()),
            ring_bytes: std::sync::atomic::AtomicUsize::new(0),
            tx: broadcast::channel(BROADCAST).0,
        }
    }
}

impl Outbound {
    /// Queues a message (a complete JSON-RPC object) for the client.
    pub fn push(&self, msg: String) {
        let mut ring = self.ring.lock().expect("outbound");
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let msg: Arc<str> = msg.into();
        let mut bytes = self.ring_bytes.load(Ordering::Relaxed) + msg.len();
        ring.push_back((id, msg.clone()));
        while ring.len() > REPLAY_BUFFER || (bytes > REPLAY_BYTES && ring.len() > 1) {
            let (_, old) = ring.pop_front().expect("not empty");
            bytes -= old.len();
        }
        self.ring_bytes.store(bytes, Ordering::Relaxed);
        let _ = self.tx.send((id, msg));
    }

    /// Messages after `last_event_id` still in the buffer, and a receiver for later ones.
    pub fn subscribe(&self, last_event_id: Option<u64>) -> (Vec<OutboundEvent>, broadcast::Receiver<OutboundEvent>) {
        let ring = self.ring.lock().expect("outbound");
        let rx = self.tx.subscribe();
        let backlog = match last_event_id {
            Some(last) => ring.iter().filter(|(id, _)| *id > last).cloned().collect(),
            None => Vec::new(),
        };
        (backlog, rx)
    }

    /// True while at least one GET stream is open.
    pub fn has_listener(&self) -> bool {
        self.tx.receiver_count() > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resumed_stream_gets_what_it_missed_and_no_more() {
        let out = Outbound::default();
        assert!(!out.has_listener());
        for i in 0..3 {
            out.push(format!("{{\"n\":{i}}}"));
        }
        let (backlog, mut rx) = out.subscribe(Some(1));
        assert_eq!(backlog.iter().map(|(id, _)| *id).collect::<Vec<_>>(), [2, 3]);
        assert!(out.has_listener());
        out.push("{\"n\":3}".into());
        assert_eq!(rx.try_recv().unwrap().0, 4);
        let (fresh, _) = out.subscribe(None);
        assert!(fresh.is_empty(), "a new stream starts with what comes next");
        for i in 0..REPLAY_BUFFER + 10 {
            out.push(format!("{{\"m\":{i}}}"));
        }
        assert_eq!(out.subscribe(Some(0)).0.len(), REPLAY_BUFFER, "the buffer is bounded");
        let big = "x".repeat(REPLAY_BYTES / 3);
        for _ in 0..5 {
            out.push(big.clone());
        }
        assert_eq!(out.subscribe(Some(0)).0.len(), 3, "and bounded in bytes");
        out.push("y".repeat(REPLAY_BYTES * 2));
        assert_eq!(out.subscribe(Some(0)).0.len(), 1, "the newest is always kept");
    }
}
