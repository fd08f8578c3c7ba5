//! The per-conversation event bus: sequence numbers, a bounded log of recent events, and fan-out
//! to any number of subscribers, none of which can slow the turn or the others.
//!
//! - **Sequence numbers** come from blocks reserved in the store (`ReserveEventSeq`, [`SEQ_BLOCK`]
//!   at a time) and are handed out in memory, so they never go backwards across restarts (a
//!   restart skips the rest of the old block: gaps are allowed).
//! - **The log** keeps the in-flight turn's events (from its `message_created`) and the last
//!   [`RETAIN`] events before them; at most [`MAX_LOG`] in all.
//! - **Subscribing** with `after_seq = 0` replays the in-flight turn's events, with `N` every
//!   retained event after `N`; then live. When `N` is older than what is retained, or from before
//!   this process started (the first sequence number it reserved), the first event is
//!   `reset{too_old}`: the client reloads the conversation. Replay and registration happen under
//!   the one lock that publishing takes, so nothing is lost or sent twice in between.
//! - **Each subscriber** has a bounded buffer ([`SUBSCRIBER_BUFFER`] events beyond its replay).
//!   Publishing never waits: a subscriber whose buffer is full is dropped, and its stream yields
//!   `reset{lagged}` and ends.
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use coffer_proto::chat::{Event, Reset, event::Kind};
use tokio::sync::mpsc;

use crate::error::Result;
use crate::persist::Store;

/// Sequence numbers reserved from the store at a time.
pub const SEQ_BLOCK: u32 = 1000;
/// Events kept before the in-flight turn (for `after_seq` resumption).
pub const RETAIN: usize = 300;
/// Most events kept at all (a huge turn's oldest events are dropped beyond it).
pub const MAX_LOG: usize = 20_000;
/// Events a subscriber may fall behind before it is dropped with `reset{lagged}`.
pub const SUBSCRIBER_BUFFER: usize = 1024;

/// `Reset.reason` values.
pub mod reason {
    /// The subscriber fell behind its buffer.
    pub const LAGGED: &str = "lagged";
    /// The asked `after_seq` is older than what is retained.
    pub const TOO_OLD: &str = "too_old";
    /// The conversation was deleted.
    pub const DELETED: &str = "deleted";
}

/// Where an event sits in a turn (for what `after_seq = 0` replays).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    /// The first event of a turn (its user message's `message_created`).
    Begin,
    /// Inside a turn, or outside any.
    None,
    /// The terminal event of a turn.
    End,
}

/// One conversation's bus.
pub struct Bus {
    id: String,
    state: Mutex<State>,
    /// Held while a block is being reserved (one reservation at a time).
    reserving: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct State {
    /// Next sequence number to hand out; `end` is one past the reserved block.
    next: u64,
    end: u64,
    /// The first sequence number this process reserved (0: none yet).
    floor: u64,
    log: VecDeque<Arc<Event>>,
    /// A replay after `N` is complete iff `N >= complete_after`.
    complete_after: u64,
    /// The in-flight turn's first event, and whether some of its events were dropped.
    turn_first: Option<u64>,
    turn_truncated: bool,
    subs: Vec<Sub>,
    closed: bool,
}

struct Sub {
    tx: mpsc::Sender<Arc<Event>>,
    lagged: Arc<AtomicBool>,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

impl Bus {
    /// An empty bus for conversation `id` (nothing reserved yet; costs a few words).
    pub fn new(id: &str) -> Self {
        Self { id: id.to_owned(), state: Mutex::new(State::default()), reserving: tokio::sync::Mutex::new(()) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes sure a sequence number is available (reserving a block from the store if not).
    ///
    /// # Errors
    /// When the store cannot reserve one.
    pub async fn ready(&self, store: &Store) -> Result<()> {
        if self.has_seq() {
            return Ok(());
        }
        let _one = self.reserving.lock().await;
        if self.has_seq() {
            return Ok(());
        }
        let first = store.reserve_seq(&self.id, SEQ_BLOCK).await?;
        self.grant(first, SEQ_BLOCK);
        Ok(())
    }

    /// Hands the bus the block `first..first + count` (what the store reserved).
    pub fn grant(&self, first: u64, count: u32) {
        let mut st = self.lock();
        if st.floor == 0 {
            st.floor = first;
            st.complete_after = first.saturating_sub(1);
        }
        st.next = first.max(st.next);
        st.end = first + u64::from(count);
    }

    /// Whether a sequence number is available without reserving.
    pub fn has_seq(&self) -> bool {
        let st = self.lock();
        st.next < st.end
    }

    /// The last sequence number handed out (or the one before this process's first): subscribe
    /// with `after_seq` = this to follow from now on. 0 before [`Bus::ready`].
    pub fn last_seq(&self) -> u64 {
        self.lock().next.saturating_sub(1)
    }

    /// Publishes an event if a sequence number is available (call [`Bus::ready`] first);
    /// returns its sequence number, `None` when the block ran out (or the bus is closed).
    pub fn try_publish(&self, turn_id: &str, kind: Kind, mark: Mark) -> Option<u64> {
        self.try_publish_with(turn_id, |_| kind, mark)
    }

    /// [`Bus::try_publish`] of the event `kind(seq)` builds from its own sequence number (an
    /// approval request's `number` is its event's seq).
    pub fn try_publish_with(&self, turn_id: &str, kind: impl FnOnce(u64) -> Kind, mark: Mark) -> Option<u64> {
        let mut st = self.lock();
        if st.closed || st.next >= st.end {
            return None;
        }
        let seq = st.next;
        st.next += 1;
        let event = Arc::new(Event {
            seq,
            conversation_id: self.id.clone(),
            at_ms: now_ms(),
            turn_id: turn_id.to_owned(),
            kind: Some(kind(seq)),
        });
        match mark {
            Mark::Begin => {
                st.turn_first = Some(seq);
                st.turn_truncated = false;
            }
            Mark::End => st.turn_first = None,
            Mark::None => {}
        }
        st.log.push_back(event.clone());
        st.evict();
        st.subs.retain(|s| match s.tx.try_send(event.clone()) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                s.lagged.store(true, Ordering::Release);
                false
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        });
        Some(seq)
    }

    /// Publishes an event, reserving sequence numbers as needed; its sequence number (`None`
    /// when the bus is closed: the conversation was deleted).
    ///
    /// # Errors
    /// When the store cannot reserve sequence numbers.
    pub async fn publish(&self, store: &Store, turn_id: &str, kind: Kind, mark: Mark) -> Result<Option<u64>> {
        loop {
            self.ready(store).await?;
            if self.lock().closed {
                return Ok(None);
            }
            if let Some(seq) = self.try_publish(turn_id, kind.clone(), mark) {
                return Ok(Some(seq));
            }
        }
    }

    /// [`Bus::publish`] of the event `kind(seq)` builds from its own sequence number.
    ///
    /// # Errors
    /// When the store cannot reserve sequence numbers.
    pub async fn publish_with(
        &self,
        store: &Store,
        turn_id: &str,
        kind: impl Fn(u64) -> Kind,
        mark: Mark,
    ) -> Result<Option<u64>> {
        loop {
            self.ready(store).await?;
            if self.lock().closed {
                return Ok(None);
            }
            if let Some(seq) = self.try_publish_with(turn_id, &kind, mark) {
                return Ok(Some(seq));
            }
        }
    }

    /// The first sequence number this process handed out for the conversation (0 before
    /// [`Bus::ready`]): a number below it is from before the chat service (re)started.
    pub fn floor(&self) -> u64 {
        self.lock().floor
    }

    /// A new subscriber (call [`Bus::ready`] first, so that `floor` is known): see the module
    /// docs for what it replays.
    pub fn subscribe(&self, after_seq: u64) -> Subscription {
        let mut st = self.lock();
        let mut first = Vec::new();
        let replay: Vec<Arc<Event>> = if after_seq == 0 {
            if st.turn_truncated {
                first.push(reason::TOO_OLD);
            }
            match st.turn_first {
                Some(t) => st.log.iter().filter(|e| e.seq >= t).cloned().collect(),
                None => Vec::new(),
            }
        } else {
            if after_seq < st.complete_after {
                first.push(reason::TOO_OLD);
            }
            st.log.iter().filter(|e| e.seq > after_seq).cloned().collect()
        };
        // A reset goes before the replay with the seq just before it, so that ids never go
        // backwards on the stream (nor repeat); with nothing to replay, the last one handed out.
        let last = st.next.saturating_sub(1);
        let reset_seq = replay.first().map_or(last, |e| e.seq.saturating_sub(1));
        let (tx, rx) = mpsc::channel(replay.len() + SUBSCRIBER_BUFFER);
        for e in replay {
            // Capacity is replay + buffer: never full here.
            let _ = tx.try_send(e);
        }
        let lagged = Arc::new(AtomicBool::new(false));
        let reset_first = first.first().map(|r| self.reset(reset_seq, r));
        if st.closed {
            let first = Some(self.reset(last, reason::DELETED));
            return Subscription { first, rx: None, lagged, id: self.id.clone(), last: after_seq };
        }
        st.subs.push(Sub { tx, lagged: lagged.clone() });
        Subscription { first: reset_first, rx: Some(rx), lagged, id: self.id.clone(), last: after_seq }
    }

    fn reset(&self, seq: u64, why: &str) -> Arc<Event> {
        Arc::new(Event {
            seq,
            conversation_id: self.id.clone(),
            at_ms: now_ms(),
            turn_id: String::new(),
            kind: Some(Kind::Reset(Reset { reason: why.to_owned() })),
        })
    }

    /// Ends every subscription with `reset{reason}` and refuses further events and subscribers
    /// (the conversation is deleted).
    pub fn close(&self, why: &str) {
        let mut st = self.lock();
        st.closed = true;
        let last = st.next.saturating_sub(1);
        let reset = self.reset(last, why);
        for s in st.subs.drain(..) {
            // A full buffer still ends: the stream sees its sender gone after what it holds.
            let _ = s.tx.try_send(reset.clone());
        }
        st.log.clear();
    }

    /// Subscribers attached now.
    pub fn subscribers(&self) -> usize {
        let mut st = self.lock();
        st.subs.retain(|s| !s.tx.is_closed());
        st.subs.len()
    }
}

impl State {
    /// Drops the oldest events: beyond [`RETAIN`] before the in-flight turn, beyond [`MAX_LOG`]
    /// in all.
    fn evict(&mut self) {
        while let Some(front) = self.log.front() {
            let before = self.turn_first.map_or(self.log.len(), |t| self.log.partition_point(|e| e.seq < t));
            if before <= RETAIN && self.log.len() <= MAX_LOG {
                return;
            }
            let seq = front.seq;
            if before == 0 {
                self.turn_truncated = true;
            }
            self.log.pop_front();
            self.complete_after = self.complete_after.max(seq);
        }
    }
}

/// One subscriber's events.
pub struct Subscription {
    first: Option<Arc<Event>>,
    rx: Option<mpsc::Receiver<Arc<Event>>>,
    lagged: Arc<AtomicBool>,
    id: String,
    /// The last sequence number delivered (the `seq` of a `reset{lagged}`).
    last: u64,
}

impl Subscription {
    /// The next event; `None` when the stream has ended (after `reset{lagged}` or
    /// `reset{deleted}`).
    pub async fn next(&mut self) -> Option<Arc<Event>> {
        if let Some(e) = self.first.take() {
            self.last = self.last.max(e.seq);
            if matches!(e.kind, Some(Kind::Reset(Reset { ref reason })) if reason == reason::DELETED) {
                self.rx = None;
            }
            return Some(e);
        }
        let rx = self.rx.as_mut()?;
        let next = if self.lagged.load(Ordering::Acquire) { None } else { rx.recv().await };
        match next {
            Some(e) => {
                if matches!(e.kind, Some(Kind::Reset(_))) {
                    self.rx = None;
                }
                self.last = self.last.max(e.seq);
                Some(e)
            }
            None => {
                self.rx = None;
                self.lagged.load(Ordering::Acquire).then(|| {
                    Arc::new(Event {
                        seq: self.last,
                        conversation_id: self.id.clone(),
                        at_ms: now_ms(),
                        turn_id: String::new(),
                        kind: Some(Kind::Reset(Reset { reason: reason::LAGGED.to_owned() })),
                    })
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use coffer_proto::chat::{QueueChanged, TextDelta};

    use super::*;

    fn delta(t: &str) -> Kind {
        Kind::TextDelta(TextDelta { text: t.into() })
    }

    fn seqs(events: &[Arc<Event>]) -> Vec<u64> {
        events.iter().map(|e| e.seq).collect()
    }

    /// Everything a subscription holds right now, without waiting.
    async fn drain(sub: &mut Subscription) -> Vec<Arc<Event>> {
        let mut out = Vec::new();
        while let Some(Some(e)) = futures_util::FutureExt::now_or_never(tokio::task::unconstrained(sub.next())) {
            out.push(e);
        }
        out
    }

    fn reason_of(e: &Event) -> Option<&str> {
        match &e.kind {
            Some(Kind::Reset(r)) => Some(r.reason.as_str()),
            _ => None,
        }
    }

    #[tokio::test]
    async fn replay_is_the_turn_so_far_or_everything_after_n_then_live() {
        let bus = Bus::new("C");
        bus.grant(1, 100);
        let q = Kind::QueueChanged(QueueChanged::default());
        assert_eq!(bus.try_publish("", q.clone(), Mark::None), Some(1));
        assert_eq!(bus.try_publish("T", delta("start"), Mark::Begin), Some(2));
        assert_eq!(bus.try_publish("T", delta("a"), Mark::None), Some(3));
        let mut mid = bus.subscribe(0);
        let mut after1 = bus.subscribe(1);
        let mut after3 = bus.subscribe(3);
        bus.try_publish("T", delta("b"), Mark::End);
        assert_eq!(seqs(&drain(&mut mid).await), [2, 3, 4], "the turn so far, then live");
        assert_eq!(seqs(&drain(&mut after1).await), [2, 3, 4]);
        assert_eq!(seqs(&drain(&mut after3).await), [4]);
        let mut idle = bus.subscribe(0);
        assert!(drain(&mut idle).await.is_empty(), "no turn in flight: nothing replayed");
        bus.try_publish("", q, Mark::None);
        assert_eq!(seqs(&drain(&mut idle).await), [5]);
        assert_eq!(bus.last_seq(), 5);
    }

    #[tokio::test]
    async fn an_old_or_pre_restart_seq_gets_too_old_first() {
        let bus = Bus::new("C");
        // As after a restart: this process's first block starts at 1001.
        bus.grant(1001, 1000);
        let mut old = bus.subscribe(7);
        let first = old.next().await.unwrap();
        assert_eq!(reason_of(&first), Some(reason::TOO_OLD));
        let mut current = bus.subscribe(1000);
        bus.try_publish("", delta("x"), Mark::None);
        assert_eq!(seqs(&drain(&mut current).await), [1001], "the seq just before the block is complete");
        assert_eq!(seqs(&drain(&mut old).await), [1001], "live after the reset");
        for i in 0..(RETAIN + 50) {
            bus.try_publish("", delta(&i.to_string()), Mark::None);
        }
        let mut evicted = bus.subscribe(1002);
        let reset = evicted.next().await.unwrap();
        assert_eq!(reason_of(&reset), Some(reason::TOO_OLD));
        let retained = drain(&mut evicted).await;
        assert_eq!(retained.len(), RETAIN, "the last RETAIN events");
        assert_eq!(reset.seq + 1, retained[0].seq, "the reset's seq is just before the replay: ids never go back");
        // After a restart with events of this process retained: the reset, then those events,
        // each seq once and in order.
        let bus = Bus::new("C");
        bus.grant(1001, 1000);
        for i in 0..3 {
            bus.try_publish("", delta(&i.to_string()), Mark::None);
        }
        let mut old = bus.subscribe(44);
        let mut got = vec![old.next().await.unwrap()];
        got.extend(drain(&mut old).await);
        assert_eq!(reason_of(&got[0]), Some(reason::TOO_OLD));
        assert_eq!(seqs(&got), [1000, 1001, 1002, 1003], "strictly increasing, no duplicate");
    }

    #[tokio::test]
    async fn a_slow_subscriber_is_dropped_with_lagged_and_never_slows_the_others() {
        let bus = Bus::new("C");
        bus.grant(1, 100_000);
        let mut slow = bus.subscribe(0);
        let mut fast = bus.subscribe(0);
        let mut got = Vec::new();
        let started = std::time::Instant::now();
        for i in 0..(SUBSCRIBER_BUFFER * 3) {
            assert!(bus.try_publish("", delta(&i.to_string()), Mark::None).is_some());
            got.push(fast.next().await.unwrap().seq);
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(2), "publishing never waits");
        assert_eq!(got.len(), SUBSCRIBER_BUFFER * 3);
        assert!(got.windows(2).all(|w| w[1] == w[0] + 1), "the fast one got every event in order");
        let e = slow.next().await.unwrap();
        assert_eq!(reason_of(&e), Some(reason::LAGGED));
        assert!(slow.next().await.is_none(), "its stream ends");
        assert_eq!(bus.subscribers(), 1);
    }

    #[tokio::test]
    async fn ten_subscribers_attaching_mid_turn_see_identical_sequences() {
        let bus = Arc::new(Bus::new("C"));
        bus.grant(1, 10_000);
        bus.try_publish("T", delta("m"), Mark::Begin);
        let publisher = {
            let bus = bus.clone();
            tokio::spawn(async move {
                for i in 0..500 {
                    bus.try_publish("T", delta(&i.to_string()), if i == 499 { Mark::End } else { Mark::None });
                    tokio::task::yield_now().await;
                }
            })
        };
        let mut subs = Vec::new();
        for _ in 0..10 {
            subs.push(bus.subscribe(0));
            tokio::task::yield_now().await;
        }
        publisher.await.unwrap();
        for mut s in subs {
            assert_eq!(seqs(&drain(&mut s).await), (1..=501).collect::<Vec<_>>());
        }
    }

    #[tokio::test]
    async fn close_ends_every_subscription_with_deleted() {
        let bus = Bus::new("C");
        bus.grant(1, 10);
        let mut s = bus.subscribe(0);
        bus.close(reason::DELETED);
        assert_eq!(reason_of(&s.next().await.unwrap()), Some(reason::DELETED));
        assert!(s.next().await.is_none());
        assert!(bus.try_publish("", delta("x"), Mark::None).is_none(), "closed");
        let mut late = bus.subscribe(0);
        assert_eq!(reason_of(&late.next().await.unwrap()), Some(reason::DELETED));
        assert!(late.next().await.is_none());
    }
}
