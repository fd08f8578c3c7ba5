//! A session's event queue: what its upstreams send that is not a response to a request of
//! Coffer's (notifications, server→client requests, the end of a connection), bounded so that
//! a flood from one upstream cannot grow a session's memory; what must never be lost is kept
//! aside instead of dropped.
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;

use super::UpstreamEvent;

/// Events a session's upstreams may have queued for it before it handles them. At the limit
/// ([`Events::send`]) notifications are dropped and counted, except what must never be lost:
/// each server's latest `notifications/*/list_changed` and the end of its connection, which
/// are kept aside (one entry per server and kind) and handed over once the queue drained.
pub const EVENT_QUEUE: usize = 256;

/// The upstreams' side of a session's event queue (cloned into each [`Core`]).
#[derive(Clone)]
pub struct Events {
    tx: mpsc::Sender<UpstreamEvent>,
    aside: Arc<Aside>,
}

/// The session's side of its event queue.
pub struct EventQueue {
    rx: mpsc::Receiver<UpstreamEvent>,
    aside: Arc<Aside>,
}

/// What a full queue kept aside instead of dropping.
struct Aside {
    /// Servers' list changes (server, false, `notifications/<kind>/list_changed`) and closed
    /// servers (server, true, ""), each once; a server's end sorts after its list changes.
    kept: Mutex<std::collections::BTreeSet<(String, bool, String)>>,
    dropped: crate::mcp::flow::Drops,
}

/// A bounded event queue of `capacity` events for one session.
pub fn events(capacity: usize) -> (Events, EventQueue) {
    let (tx, rx) = mpsc::channel(capacity);
    let aside = Arc::new(Aside {
        kept: Mutex::default(),
        dropped: crate::mcp::flow::Drops::new("upstream messages a busy session could not queue"),
    });
    (Events { tx, aside: aside.clone() }, EventQueue { rx, aside })
}

impl Events {
    /// Queues `ev` without waiting (the upstream's reader must never stall on the session: it
    /// also reads the responses). When the queue is full, a list change or the connection's
    /// end is kept aside, a notification is dropped and counted, and a request is dropped (its
    /// upstream's own timeout answers it).
    pub fn send(&self, ev: UpstreamEvent) {
        let ev = match self.tx.try_send(ev) {
            Ok(()) => {
                self.aside.dropped.resumed();
                return;
            }
            Err(mpsc::error::TrySendError::Closed(_)) => return,
            Err(mpsc::error::TrySendError::Full(ev)) => ev,
        };
        let kept = match ev {
            UpstreamEvent::Notification { server, method, .. } if method.ends_with("/list_changed") => {
                (server, false, method)
            }
            UpstreamEvent::Closed { server } => (server, true, String::new()),
            UpstreamEvent::Request { server, method, .. } => {
                tracing::warn!(server = %server, method = %method, "Dropped a request from an upstream: its session's event queue is full.");
                self.aside.dropped.add(1);
                return;
            }
            UpstreamEvent::Notification { .. } => {
                self.aside.dropped.add(1);
                return;
            }
        };
        self.aside.kept.lock().expect("aside").insert(kept);
    }
}

impl EventQueue {
    /// The next event: queued ones first, then what was kept aside; `None` once every
    /// [`Events`] is gone and nothing is left.
    pub async fn recv(&mut self) -> Option<UpstreamEvent> {
        match self.try_recv() {
            Ok(ev) => Some(ev),
            Err(mpsc::error::TryRecvError::Disconnected) => None,
            // Whatever is kept aside now was kept while the queue was full, so a message is
            // either queued or arrives with the next send.
            Err(mpsc::error::TryRecvError::Empty) => self.rx.recv().await,
        }
    }

    /// The next event if one is ready.
    ///
    /// # Errors
    /// `Empty` when none is, `Disconnected` when none will be.
    pub fn try_recv(&mut self) -> Result<UpstreamEvent, mpsc::error::TryRecvError> {
        match self.rx.try_recv() {
            Ok(ev) => Ok(ev),
            Err(e) => {
                let kept = self.aside.kept.lock().expect("aside").pop_first();
                match kept {
                    Some((server, false, method)) => Ok(UpstreamEvent::Notification { server, method, params: None }),
                    Some((server, true, _)) => Ok(UpstreamEvent::Closed { server }),
                    None => Err(e),
                }
            }
        }
    }

    /// Events dropped because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.aside.dropped.total()
    }
}
