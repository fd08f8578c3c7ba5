//! The conversation list's live feed (`WatchConversations`): the engine marks a conversation
//! dirty whenever something a list shows changes, and one flusher task turns the dirty set into
//! [`c::ConversationChange`]s (one store read per dirty conversation, bursts coalesced) on a
//! broadcast channel that every watcher reads.
//!
//! - **Nothing while nobody watches.** [`Watch::touch`] returns at once when there is no
//!   watcher; the flusher runs only while at least one does (it is started by the first
//!   [`Watch::subscribe`] and ends when the last watcher is gone).
//! - **Bounded per watcher.** The broadcast keeps [`WATCH_BUFFER`] changes; a watcher that
//!   falls further behind gets `reset{lagged}` and its stream ends (the client reloads the list).
//! - **Order.** A conversation is read after the touch that marked it, so the change sent names
//!   the state at or after the one that caused it; one flusher sends them in order.
use std::collections::HashSet;
use std::sync::{Arc, Mutex, Weak};

use coffer_proto::chat::{self as c, conversation_change::Change};
use tokio::sync::{Notify, broadcast};

use crate::bus::reason;
use crate::engine::Engine;
use crate::error::Error;

/// Changes a watcher may fall behind before it gets `reset{lagged}` and its stream ends.
pub const WATCH_BUFFER: usize = 256;

/// `Reset.reason` when the store could not be read for a change: the list must be reloaded.
pub const UNAVAILABLE: &str = "unavailable";

/// The feed's shared state (one per engine).
pub struct Watch {
    tx: broadcast::Sender<Arc<c::ConversationChange>>,
    /// Conversations changed since the flusher last looked, in the order they were touched.
    dirty: Mutex<Dirty>,
    wake: Notify,
}

#[derive(Default)]
struct Dirty {
    order: Vec<String>,
    set: HashSet<String>,
    /// Whether the flusher task runs.
    running: bool,
}

impl Default for Watch {
    fn default() -> Self {
        Self { tx: broadcast::channel(WATCH_BUFFER).0, dirty: Mutex::new(Dirty::default()), wake: Notify::new() }
    }
}

impl Watch {
    fn lock(&self) -> std::sync::MutexGuard<'_, Dirty> {
        self.dirty.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks conversation `id` changed (a no-op while nobody watches).
    pub fn touch(&self, id: &str) {
        if self.tx.receiver_count() == 0 {
            return;
        }
        let mut d = self.lock();
        if d.set.insert(id.to_owned()) {
            d.order.push(id.to_owned());
        }
        drop(d);
        self.wake.notify_one();
    }

    /// A new watcher of every conversation's changes from now on; starts the flusher over
    /// `engine` when it is not running.
    pub fn subscribe(self: &Arc<Self>, engine: &Arc<Engine>) -> Watcher {
        let rx = self.tx.subscribe();
        let mut d = self.lock();
        if !d.running {
            d.running = true;
            tokio::spawn(flush(Arc::downgrade(engine), self.clone()));
        }
        Watcher { rx: Some(rx), watch: self.clone() }
    }
}

/// The flusher: reads each dirty conversation and broadcasts it, until no watcher is left or
/// the engine is gone.
async fn flush(engine: Weak<Engine>, watch: Arc<Watch>) {
    loop {
        let ids = {
            let mut d = watch.lock();
            if watch.tx.receiver_count() == 0 {
                d.running = false;
                d.order.clear();
                d.set.clear();
                return;
            }
            d.set.clear();
            std::mem::take(&mut d.order)
        };
        if ids.is_empty() {
            watch.wake.notified().await;
            continue;
        }
        let Some(engine) = engine.upgrade() else {
            watch.lock().running = false;
            return;
        };
        for id in ids {
            let change = match engine.store().get(&id).await {
                Ok(record) => Change::Conversation(engine.view(&record)),
                Err(Error::NotFound(_)) => Change::Deleted(id),
                Err(e) => {
                    tracing::warn!(conversation = %id, error = %e, "Cannot read a changed conversation; watchers reload.");
                    Change::Reset(c::Reset { reason: UNAVAILABLE.into() })
                }
            };
            // No receiver left is the loop's next check.
            let _ = watch.tx.send(Arc::new(c::ConversationChange { change: Some(change) }));
        }
    }
}

/// One watcher's stream of changes.
pub struct Watcher {
    rx: Option<broadcast::Receiver<Arc<c::ConversationChange>>>,
    watch: Arc<Watch>,
}

impl Watcher {
    /// The next change; after a `reset` (lagged, or the store unavailable), `None`.
    pub async fn next(&mut self) -> Option<c::ConversationChange> {
        let rx = self.rx.as_mut()?;
        match rx.recv().await {
            Ok(change) => {
                if matches!(change.change, Some(Change::Reset(_))) {
                    self.end();
                }
                Some(Arc::unwrap_or_clone(change))
            }
            Err(broadcast::error::RecvError::Lagged(_)) => {
                self.end();
                Some(c::ConversationChange { change: Some(Change::Reset(c::Reset { reason: reason::LAGGED.into() })) })
            }
            Err(broadcast::error::RecvError::Closed) => {
                self.end();
                None
            }
        }
    }

    /// Drops the receiver and lets the flusher see whether it was the last one.
    fn end(&mut self) {
        if self.rx.take().is_some() {
            self.watch.wake.notify_one();
        }
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.end();
    }
}
