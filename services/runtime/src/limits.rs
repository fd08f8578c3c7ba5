//! Listener limits: one implementation of the timeouts and the connection cap every Coffer
//! listener applies — the edge's TCP port and Unix socket, coffer-callback's public port and
//! every internal gRPC listener — so that no local user can exhaust one by opening connections
//! and never finishing a request (slowloris), by flooding it with idle connections, or by
//! sending huge request heads.
//!
//! The pieces:
//!
//! - [`Limits`]: the numbers (connection cap, owner reserve, header-read timeout, idle timeout,
//!   largest request head). [`Limits::EDGE`], [`Limits::CALLBACK`] and [`Limits::GRPC`] are the
//!   defaults; `COFFER_MAX_CONNECTIONS` overrides the edge's cap, `COFFER_HEAD_TIMEOUT_MS` every
//!   listener's request-head timeout ([`Limits::with_env_head_timeout`]).
//! - [`Connections`]: the set of open connections of one listener (or of several sharing one
//!   cap, as the edge's TCP port and socket do). [`Connections::admit`] is asked for each new
//!   connection; a reaper ([`Connections::spawn_reaper`]) closes connections whose request head
//!   is late or that stay idle too long.
//! - [`Tracked`]: the stream wrapper every connection is served through. It notices request
//!   bytes arriving between requests (the start of a head) and aborts the stream when the set
//!   closes the connection.
//! - [`ConnHandle`]: in every request's extensions, so the authenticating code marks the
//!   connection trusted ([`ConnHandle::mark_trusted`]) and the HTTP server marks it busy while a
//!   request runs ([`ConnHandle::begin`]).
//! - [`serve_http`]: the hyper server loop over a TCP or Unix listener with all of the above.
//!
//! What happens when the cap is reached: the newcomer is still accepted (so an attacker cannot
//! fill the kernel's backlog instead) and the **oldest untrusted connection** is closed to make
//! room — one that never carried an authenticated request, idle ones before busy ones. Trusted
//! connections (the token holder's; on the Unix socket every connection from the owner's uid,
//! told by `SO_PEERCRED`) are never closed to make room, so a flood from another user cannot
//! cut the owner's live streams; a connection from the owner's uid is admitted even beyond the
//! cap, up to [`Limits::owner_reserve`] more. When every slot is trusted and busy, the newcomer
//! is closed at once.
//!
//! Closing after a refused body: a request answered before its body was read (a 413 from its
//! declared length, a handler that never reads) leaves the client still sending. Closing the
//! socket with those bytes unread makes the kernel send a reset, which can destroy the answer
//! before the client reads it (the client sees "connection reset" instead of the 413). Such a
//! connection closes in stages instead (RFC 9112 §9.6, "Tear-down"): its write side is shut
//! down after the answer, and what the client still sends is read and discarded until it
//! closes its side, for at most [`LINGER`] and [`LINGER_MAX_BYTES`]. And the answer says
//! `Connection: close` (HTTP/1): hyper closes such a connection after the answer, and a client
//! that took it for kept alive would send its next request into the closing socket.
//! [`RequestBody`] notes the unread body; [`serve_http`] adds the header; [`Tracked`]'s
//! shutdown lingers.
//!
//! Timeouts: a request head must arrive within [`Limits::header_read_timeout`] of its first byte;
//! a connection with no request in flight is closed after [`Limits::idle_timeout`]. A request in
//! flight is never timed out here: `/mcp` and the console keep long SSE streams open, and an
//! upgraded connection (the MCP stream upgrade) counts as busy until it closes.
use std::collections::BTreeMap;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

/// The limits of one listener (or of a group of listeners sharing one cap).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most connections open at once (beyond it, the oldest untrusted one is closed).
    pub max_connections: usize,
    /// How many connections of the owner's uid (Unix socket) are admitted beyond the cap.
    pub owner_reserve: usize,
    /// Longest a request head may take from its first byte to its last; then the connection is
    /// closed (slowloris).
    pub header_read_timeout: Duration,
    /// Longest a connection may stay open with no request in flight (keep-alive between
    /// requests, or a connection that never sends anything).
    pub idle_timeout: Duration,
    /// Largest request head (request line and headers), bytes; a larger one is answered 431 on
    /// HTTP/1 and refused by the HTTP/2 header-list limit. At least 8192 (hyper's floor).
    pub max_header_bytes: usize,
    /// Most header fields in one HTTP/1 request head.
    pub max_headers: usize,
    /// Whether the timeouts also apply to trusted connections. The gRPC servers turn this off:
    /// their trusted peers are Coffer's own services, which keep one HTTP/2 connection for the
    /// daemon's life and are watched by HTTP/2 keep-alive pings instead.
    pub reap_trusted: bool,
}

impl Limits {
    /// The edge (TCP port and Unix socket together): 1024 connections, 64 more for the owner's
    /// uid on the socket, 10 s for a request head, 75 s idle (longer than the 30 s idle pool of
    /// Coffer's own clients, so a client never reuses a connection the edge is closing), 64 KiB
    /// heads.
    pub const EDGE: Limits = Limits {
        max_connections: 1024,
        owner_reserve: 64,
        header_read_timeout: Duration::from_secs(10),
        idle_timeout: Duration::from_secs(75),
        max_header_bytes: 64 * 1024,
        max_headers: 100,
        reap_trusted: true,
    };
    /// coffer-callback's public port: 256 connections, 10 s heads, 30 s idle, 16 KiB heads.
    pub const CALLBACK: Limits = Limits {
        max_connections: 256,
        owner_reserve: 0,
        header_read_timeout: Duration::from_secs(10),
        idle_timeout: Duration::from_secs(30),
        max_header_bytes: 16 * 1024,
        max_headers: 64,
        reap_trusted: true,
    };
    /// Internal gRPC listeners: 256 connections; a connection must carry a request with a valid
    /// internal token within 10 s of its first byte (30 s if it sends nothing), else it is closed;
    /// trusted ones are left to HTTP/2 keep-alive.
    pub const GRPC: Limits = Limits {
        max_connections: 256,
        owner_reserve: 0,
        header_read_timeout: Duration::from_secs(10),
        idle_timeout: Duration::from_secs(30),
        max_header_bytes: 64 * 1024,
        max_headers: 100,
        reap_trusted: false,
    };

    /// These limits with the cap from `COFFER_MAX_CONNECTIONS` when it is set to a number in
    /// 16..=65536 (otherwise unchanged; a bad value is logged once).
    pub fn with_env_cap(mut self) -> Self {
        if let Ok(v) = std::env::var(crate::env::MAX_CONNECTIONS) {
            match v.trim().parse::<usize>() {
                Ok(n) if (16..=65_536).contains(&n) => self.max_connections = n,
                _ => tracing::warn!(
                    value = %crate::logging::clip(&v),
                    default = self.max_connections,
                    "{} is not a number in 16-65536; using the default.",
                    crate::env::MAX_CONNECTIONS
                ),
            }
        }
        self
    }

    /// These limits with the request-head timeout from `COFFER_HEAD_TIMEOUT_MS` when it is set
    /// to a whole number of milliseconds in [`HEAD_TIMEOUT_MS_RANGE`] (otherwise unchanged; a
    /// bad value is logged once). Every listener reads it at start: the edge, coffer-callback's
    /// port and each internal gRPC listener. The defaults (10 s) are what a user runs with; the
    /// end-to-end tests set it short to prove the slowloris defence without waiting 10 s.
    pub fn with_env_head_timeout(self) -> Self {
        self.with_head_timeout_from(std::env::var(crate::env::HEAD_TIMEOUT_MS).ok().as_deref())
    }

    /// [`Limits::with_env_head_timeout`] over the variable's value (`None`: unset).
    fn with_head_timeout_from(mut self, value: Option<&str>) -> Self {
        let Some(v) = value else { return self };
        match v.trim().parse::<u64>() {
            Ok(ms) if HEAD_TIMEOUT_MS_RANGE.contains(&ms) => self.header_read_timeout = Duration::from_millis(ms),
            _ => tracing::warn!(
                value = %crate::logging::clip(v),
                default_ms = self.header_read_timeout.as_millis() as u64,
                "{} is not a number of milliseconds in 100-600000; using the default.",
                crate::env::HEAD_TIMEOUT_MS
            ),
        }
        self
    }
}

/// The values `COFFER_HEAD_TIMEOUT_MS` accepts, milliseconds (0.1 s to 10 minutes).
pub const HEAD_TIMEOUT_MS_RANGE: std::ops::RangeInclusive<u64> = 100..=600_000;

/// Who is connecting, as far as the listener can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    /// A Unix-socket peer with the daemon's own uid (`SO_PEERCRED`): never displaced by another
    /// uid's connection, and admitted beyond the cap up to [`Limits::owner_reserve`].
    Owner,
    /// Anyone else (every TCP peer: loopback TCP does not say which user connected).
    Other,
}

/// One connection's shared state (atomics: the stream wrapper touches it on every read).
struct Entry {
    /// Milliseconds since [`Connections::base`] when the connection opened.
    opened_ms: u64,
    owner: bool,
    trusted: AtomicBool,
    /// Requests in flight (responses not yet fully sent).
    busy: AtomicU32,
    /// Upgraded to another protocol: busy until it closes.
    upgraded: AtomicBool,
    /// At least one request on it has been answered.
    served: AtomicBool,
    /// When the last request finished (or the connection opened), ms since base.
    idle_since_ms: AtomicU64,
    /// When the first byte of a not-yet-dispatched request head arrived, ms since base + 1
    /// (0: none pending).
    head_started_ms: AtomicU64,
    /// Closed by the set (evicted or timed out): the stream fails on its next poll.
    close: CancellationToken,
    /// Counted out of the open connections (closing, its task not yet ended).
    closing: AtomicBool,
    /// A request on it was answered with part of its body unread ([`RequestBody`]): the
    /// connection closes by lingering ([`Tracked`]'s shutdown).
    body_unread: AtomicBool,
}

impl Entry {
    fn is_busy(&self) -> bool {
        self.busy.load(Ordering::Acquire) > 0 || self.upgraded.load(Ordering::Acquire)
    }
}

/// Why the set closed a connection (counted, and logged in summary by the reaper).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    /// Closed to make room for a newcomer at the cap.
    Evicted,
    /// Its request head took longer than [`Limits::header_read_timeout`].
    SlowHead,
    /// No request for [`Limits::idle_timeout`].
    Idle,
}

/// Counters of one [`Connections`] set, for tests and logs.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    pub open: usize,
    pub admitted: u64,
    pub refused: u64,
    pub evicted: u64,
    pub slow_heads: u64,
    pub idle_closed: u64,
}

/// The open connections of a listener (or of listeners sharing one cap). See the module docs.
pub struct Connections {
    limits: Limits,
    name: &'static str,
    base: Instant,
    state: Mutex<State>,
    /// A reaper runs (one per set, however many listeners share it).
    reaping: AtomicBool,
}

#[derive(Default)]
struct State {
    next_id: u64,
    /// By id, i.e. oldest first.
    entries: BTreeMap<u64, Arc<Entry>>,
    /// Entries not closing, and of those the owner's.
    open: usize,
    owner_open: usize,
    stats: Stats,
}

impl Connections {
    /// A set applying `limits`; `name` appears in its log lines ("edge", "callback", "grpc").
    pub fn new(name: &'static str, limits: Limits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            name,
            base: Instant::now(),
            state: Mutex::new(State::default()),
            reaping: AtomicBool::new(false),
        })
    }

    /// The limits this set applies.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    fn now_ms(&self) -> u64 {
        self.base.elapsed().as_millis() as u64
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Counters so far.
    pub fn stats(&self) -> Stats {
        let st = self.lock();
        Stats { open: st.open, ..st.stats }
    }

    /// Admits a new connection from `peer`, closing the oldest untrusted connection when the
    /// cap is reached (see the module docs). `None`: every slot is trusted and busy, or the
    /// owner's reserve is used up too; close the newcomer.
    pub fn admit(self: &Arc<Self>, peer: Peer) -> Option<ConnGuard> {
        let owner = peer == Peer::Owner;
        let mut st = self.lock();
        let over_cap = st.open >= self.limits.max_connections;
        if over_cap && !(owner && st.owner_open < self.limits.owner_reserve) {
            // Oldest unauthenticated connection that never completed a request first (a
            // flood's), then one idle between requests (a client's keep-alive connection it may
            // be about to reuse), then a busy one; a newcomer from another uid never displaces
            // one of the owner's.
            let victim = {
                let candidate = |e: &&Arc<Entry>| {
                    (owner || !e.owner) && !e.trusted.load(Ordering::Acquire) && !e.closing.load(Ordering::Acquire)
                };
                let candidates = || st.entries.values().filter(candidate);
                let fresh = candidates().find(|e| !e.is_busy() && !e.served.load(Ordering::Acquire)).cloned();
                fresh.or_else(|| candidates().find(|e| !e.is_busy()).cloned()).or_else(|| candidates().next().cloned())
            };
            match victim {
                Some(v) => {
                    Self::close_locked(&mut st, &v, CloseReason::Evicted);
                }
                None => {
                    st.stats.refused += 1;
                    return None;
                }
            }
        }
        let now = self.now_ms();
        let id = st.next_id;
        st.next_id += 1;
        let entry = Arc::new(Entry {
            opened_ms: now,
            owner,
            trusted: AtomicBool::new(false),
            busy: AtomicU32::new(0),
            upgraded: AtomicBool::new(false),
            served: AtomicBool::new(false),
            idle_since_ms: AtomicU64::new(now),
            head_started_ms: AtomicU64::new(0),
            close: CancellationToken::new(),
            closing: AtomicBool::new(false),
            body_unread: AtomicBool::new(false),
        });
        st.entries.insert(id, entry.clone());
        st.open += 1;
        if owner {
            st.owner_open += 1;
        }
        st.stats.admitted += 1;
        Some(ConnGuard { handle: ConnHandle { id, entry, set: self.clone() } })
    }

    fn close_locked(st: &mut State, e: &Entry, why: CloseReason) {
        if e.closing.swap(true, Ordering::AcqRel) {
            return;
        }
        st.open -= 1;
        if e.owner {
            st.owner_open -= 1;
        }
        match why {
            CloseReason::Evicted => st.stats.evicted += 1,
            CloseReason::SlowHead => st.stats.slow_heads += 1,
            CloseReason::Idle => st.stats.idle_closed += 1,
        }
        e.close.cancel();
    }

    fn remove(&self, id: u64) {
        let mut st = self.lock();
        if let Some(e) = st.entries.remove(&id)
            && !e.closing.swap(true, Ordering::AcqRel)
        {
            st.open -= 1;
            if e.owner {
                st.owner_open -= 1;
            }
        }
    }

    /// Closes every connection whose request head is late or that has been idle too long, as
    /// of now; returns how many it closed.
    pub fn sweep(&self) -> usize {
        let now = self.now_ms();
        let head = self.limits.header_read_timeout.as_millis() as u64;
        let idle = self.limits.idle_timeout.as_millis() as u64;
        let mut st = self.lock();
        let mut doomed = Vec::new();
        for e in st.entries.values() {
            if e.closing.load(Ordering::Acquire) || e.is_busy() {
                continue;
            }
            if !self.limits.reap_trusted && e.trusted.load(Ordering::Acquire) {
                continue;
            }
            let started = e.head_started_ms.load(Ordering::Acquire);
            if started > 0 && now.saturating_sub(started - 1) > head {
                doomed.push((e.clone(), CloseReason::SlowHead));
            } else if now.saturating_sub(e.idle_since_ms.load(Ordering::Acquire).max(e.opened_ms)) > idle {
                doomed.push((e.clone(), CloseReason::Idle));
            }
        }
        for (e, why) in &doomed {
            Self::close_locked(&mut st, e, *why);
        }
        doomed.len()
    }

    /// Runs [`Connections::sweep`] every second until `stop`, logging at most one summary line
    /// a minute of what it closed and evicted. A set has one reaper: when one runs already, the
    /// returned task does nothing.
    pub fn spawn_reaper(self: &Arc<Self>, stop: CancellationToken) -> tokio::task::JoinHandle<()> {
        let set = self.clone();
        if set.reaping.swap(true, Ordering::AcqRel) {
            return tokio::spawn(async {});
        }
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut reported = set.stats();
            let mut last_report = Instant::now();
            loop {
                tokio::select! {
                    () = stop.cancelled() => break,
                    _ = tick.tick() => {}
                }
                set.sweep();
                if last_report.elapsed() >= Duration::from_secs(60) {
                    let now = set.stats();
                    if (Stats { open: now.open, admitted: now.admitted, ..reported }) != now {
                        tracing::warn!(
                            listener = set.name,
                            open = now.open,
                            evicted = now.evicted - reported.evicted,
                            refused = now.refused - reported.refused,
                            slow_heads = now.slow_heads - reported.slow_heads,
                            "Closed connections to keep the listener available (last minute)."
                        );
                    }
                    reported = now;
                    last_report = Instant::now();
                }
            }
        })
    }
}

/// Owns one admitted connection's slot; dropping it (the connection ended) frees the slot.
pub struct ConnGuard {
    handle: ConnHandle,
}

impl ConnGuard {
    /// The handle to put in requests' extensions.
    pub fn handle(&self) -> ConnHandle {
        self.handle.clone()
    }

    /// Wraps `io` so it notices request bytes and fails once the set closes the connection.
    pub fn track<IO>(self, io: IO) -> Tracked<IO> {
        let closed = Box::pin(self.handle.entry.close.clone().cancelled_owned());
        Tracked { io, guard: self, closed, linger: None }
    }
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        self.handle.set.remove(self.handle.id);
    }
}

/// A connection as seen by the code serving its requests (in each request's extensions).
#[derive(Clone)]
pub struct ConnHandle {
    id: u64,
    entry: Arc<Entry>,
    set: Arc<Connections>,
}

impl std::fmt::Debug for ConnHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnHandle").field("id", &self.id).field("owner", &self.entry.owner).finish()
    }
}

impl ConnHandle {
    /// The connection carried an authenticated request: never closed to make room, and (with
    /// [`Limits::reap_trusted`] off) never timed out.
    pub fn mark_trusted(&self) {
        self.entry.trusted.store(true, Ordering::Release);
    }

    /// Whether it is trusted.
    pub fn is_trusted(&self) -> bool {
        self.entry.trusted.load(Ordering::Acquire)
    }

    /// A request was dispatched: the connection is busy (no timeout applies) until the
    /// returned guard is dropped (when the response has been sent).
    pub fn begin(&self) -> Busy {
        self.entry.busy.fetch_add(1, Ordering::AcqRel);
        self.entry.head_started_ms.store(0, Ordering::Release);
        Busy { handle: self.clone() }
    }

    /// The connection switched protocols (HTTP upgrade): busy until it closes.
    pub fn mark_upgraded(&self) {
        self.entry.upgraded.store(true, Ordering::Release);
    }

    fn saw_bytes(&self) {
        let e = &self.entry;
        if !e.is_busy() && e.head_started_ms.load(Ordering::Acquire) == 0 {
            e.head_started_ms.store(self.set.now_ms() + 1, Ordering::Release);
        }
    }
}

/// A request in flight on a connection (see [`ConnHandle::begin`]).
pub struct Busy {
    handle: ConnHandle,
}

impl Drop for Busy {
    fn drop(&mut self) {
        // The idle clock restarts before the count drops, so the reaper never sees a stale one.
        let e = &self.handle.entry;
        e.idle_since_ms.store(self.handle.set.now_ms(), Ordering::Release);
        e.served.store(true, Ordering::Release);
        e.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

/// How long a connection closing with a request body left unread goes on reading (and
/// discarding) what its client still sends before it closes (see the module's "Closing after
/// a refused body"): time for a slow client to finish sending and read the answer.
pub const LINGER: Duration = Duration::from_secs(5);
/// The most a lingering connection reads and discards, bytes: more than the largest body limit
/// of any route (56 MiB), so a client that sent an over-limit body in full still reads its
/// answer; a client that sends on past it is cut off.
pub const LINGER_MAX_BYTES: u64 = 64 * 1024 * 1024;

/// A request's body as [`serve_http`] hands it to the service: hyper's body, noting when it is
/// dropped before its end (the service answered without reading it all): the answer then says
/// `Connection: close` and the connection lingers when it closes (see the module's "Closing
/// after a refused body").
pub struct RequestBody {
    inner: hyper::body::Incoming,
    /// Set when dropped before its end (read by [`serve_http`] once the answer is ready).
    unread: Arc<AtomicBool>,
    handle: ConnHandle,
    ended: bool,
}

impl http_body::Body for RequestBody {
    type Data = bytes::Bytes;
    type Error = hyper::Error;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let r = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(r, Poll::Ready(None)) {
            self.ended = true;
        }
        r
    }
    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for RequestBody {
    fn drop(&mut self) {
        use http_body::Body as _;
        if !self.ended && !self.inner.is_end_stream() {
            self.unread.store(true, Ordering::Release);
            self.handle.entry.body_unread.store(true, Ordering::Release);
        }
    }
}

/// A stream served under a [`Connections`] set (see [`ConnGuard::track`]).
pub struct Tracked<IO> {
    io: IO,
    guard: ConnGuard,
    closed: Pin<Box<WaitForCancellationFutureOwned>>,
    /// Set once its write side is shut down while a request body was left unread: reading and
    /// discarding until the client closes, [`LINGER`] passes or [`LINGER_MAX_BYTES`] were read.
    linger: Option<Linger>,
}

struct Linger {
    deadline: Pin<Box<tokio::time::Sleep>>,
    left: u64,
}

impl<IO> Tracked<IO> {
    /// The connection's handle.
    pub fn handle(&self) -> ConnHandle {
        self.guard.handle()
    }

    /// The wrapped stream.
    pub fn get_ref(&self) -> &IO {
        &self.io
    }

    fn check_closed(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        if self.closed.as_mut().poll(cx).is_ready() {
            return Err(io::Error::new(io::ErrorKind::ConnectionAborted, "closed by the listener's limits"));
        }
        Ok(())
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Tracked<IO> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        self.check_closed(cx)?;
        let before = buf.filled().len();
        let this = &mut *self;
        let r = Pin::new(&mut this.io).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.guard.handle.saw_bytes();
        }
        r
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Tracked<IO> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.check_closed(cx)?;
        Pin::new(&mut self.io).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }
    /// Shuts the write side down (the answer is complete); when a request body was left unread,
    /// then reads and discards until the client closes (see the module's "Closing after a
    /// refused body"). Ready once the stream may be dropped.
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.linger.is_none() {
            std::task::ready!(Pin::new(&mut this.io).poll_shutdown(cx))?;
            // An upgraded stream speaks another protocol: nothing of HTTP is left to drain.
            let entry = &this.guard.handle.entry;
            if !entry.body_unread.load(Ordering::Acquire) || entry.upgraded.load(Ordering::Acquire) {
                return Poll::Ready(Ok(()));
            }
            this.linger = Some(Linger { deadline: Box::pin(tokio::time::sleep(LINGER)), left: LINGER_MAX_BYTES });
        }
        let Some(linger) = this.linger.as_mut() else { return Poll::Ready(Ok(())) };
        let mut scratch = [0u8; 8192];
        loop {
            if linger.left == 0
                || linger.deadline.as_mut().poll(cx).is_ready()
                || this.closed.as_mut().poll(cx).is_ready()
            {
                return Poll::Ready(Ok(()));
            }
            let mut buf = ReadBuf::new(&mut scratch);
            match Pin::new(&mut this.io).poll_read(cx, &mut buf) {
                Poll::Ready(Ok(())) if !buf.filled().is_empty() => {
                    linger.left = linger.left.saturating_sub(buf.filled().len() as u64);
                }
                // The client closed its side (or the stream failed): nothing is left to protect.
                Poll::Ready(_) => return Poll::Ready(Ok(())),
                // The runtime's budget (tokio's cooperative scheduling) also ends up here.
                Poll::Pending => return Poll::Pending,
            }
        }
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.check_closed(cx)?;
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

impl<IO: Send + Sync + 'static> tonic::transport::server::Connected for Tracked<IO> {
    type ConnectInfo = ConnHandle;
    /// The connection's handle, which tonic puts into every request's extensions: the internal
    /// auth layer marks the connection trusted from it.
    fn connect_info(&self) -> ConnHandle {
        self.handle()
    }
}

/// A listener [`serve_http`] serves: the edge's TCP port or Unix socket, or coffer-callback's
/// port.
pub enum Listener {
    Tcp(tokio::net::TcpListener),
    Unix(tokio::net::UnixListener),
}

/// Whether an accept error is the process or the system running out of descriptors (or
/// memory): the listener then pauses briefly instead of spinning.
fn is_resource_exhaustion(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM))
}

/// Pause after an accept error for lack of descriptors: connections closing (the reaper, an
/// eviction) free some; retrying at once would spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Accepts connections on `listener` for `conns` until `stop`, handing each admitted stream
/// to `serve` (wrapped in [`Tracked`]). Peers on a Unix socket are told apart by uid.
async fn accept_loop<F>(listener: Listener, conns: Arc<Connections>, stop: CancellationToken, mut serve: F)
where
    F: FnMut(TrackedStream),
{
    let me = nix::unistd::geteuid().as_raw();
    let refusal_log = crate::logging::LogBudget::per_second(1);
    loop {
        let accepted = tokio::select! {
            () = stop.cancelled() => return,
            a = async {
                match &listener {
                    Listener::Tcp(l) => l.accept().await.map(|(s, _)| {
                        let _ = s.set_nodelay(true);
                        (Stream::Tcp(s), Peer::Other)
                    }),
                    Listener::Unix(l) => l.accept().await.map(|(s, _)| {
                        let owner = s.peer_cred().is_ok_and(|c| c.uid() == me);
                        (Stream::Unix(s), if owner { Peer::Owner } else { Peer::Other })
                    }),
                }
            } => a,
        };
        match accepted {
            Ok((stream, peer)) => match conns.admit(peer) {
                Some(guard) => serve(guard.track(stream)),
                None => {
                    if let Some(suppressed) = refusal_log.allow() {
                        tracing::warn!(
                            listener = conns.name,
                            suppressed,
                            "Connection refused: every slot is held by trusted, busy connections."
                        );
                    }
                }
            },
            Err(e) if is_resource_exhaustion(&e) => {
                if let Some(suppressed) = refusal_log.allow() {
                    tracing::warn!(listener = conns.name, error = %e, suppressed, "Cannot accept a connection; pausing briefly.");
                }
                tokio::time::sleep(ACCEPT_BACKOFF).await;
            }
            Err(e) => tracing::debug!(listener = conns.name, error = %e, "Accept failed."),
        }
    }
}

/// A TCP or Unix stream.
pub enum Stream {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
}

/// A [`Stream`] served under a [`Connections`] set.
pub type TrackedStream = Tracked<Stream>;

impl AsyncRead for Stream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Unix(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Unix(s) => Pin::new(s).poll_write(cx, buf),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_flush(cx),
            Stream::Unix(s) => Pin::new(s).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Unix(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Unix(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }
    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Tcp(s) => s.is_write_vectored(),
            Stream::Unix(s) => s.is_write_vectored(),
        }
    }
}

/// A response body that keeps its connection marked busy until it has been sent (or dropped):
/// a streaming answer (SSE) is never timed out as idle.
pub struct BusyBody<B> {
    inner: B,
    busy: Option<Busy>,
}

impl<B: http_body::Body + Unpin> http_body::Body for BusyBody<B> {
    type Data = B::Data;
    type Error = B::Error;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let r = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(r, Poll::Ready(None)) {
            self.busy = None;
        }
        r
    }
    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Serves HTTP/1.1 and HTTP/2 (cleartext) with `service` on `listener` under `conns`' limits
/// until `stop`: then it stops accepting, asks every connection to finish its request, and
/// returns once they have, or after `grace` (remaining connections are dropped).
///
/// Every request carries its connection's [`ConnHandle`] in its extensions; the connection is
/// busy from the request's dispatch until its response body has been sent. HTTP upgrades are
/// served (the upgraded stream stays under the limits, busy until it closes). The body comes as
/// a [`RequestBody`]: a connection that answered a request without reading its whole body
/// lingers when it closes ([`LINGER`]).
///
/// Limits applied: [`Limits::max_header_bytes`] (hyper's read buffer on HTTP/1, the header-list
/// size on HTTP/2), [`Limits::max_headers`], the header-read and idle timeouts through the
/// set's reaper (which this function runs), HTTP/2 keep-alive pings every 30 s (10 s to
/// answer), 256 concurrent HTTP/2 streams per connection.
pub async fn serve_http<S, B>(
    listener: Listener,
    conns: Arc<Connections>,
    service: S,
    stop: CancellationToken,
    grace: Duration,
) where
    S: tower::Service<http::Request<RequestBody>, Response = http::Response<B>, Error = std::convert::Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: http_body::Body<Data = bytes::Bytes> + Send + Unpin + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    use tower::ServiceExt as _;
    let limits = *conns.limits();
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        // The reaper times heads out after `header_read_timeout`; hyper's own timer (which also
        // runs between keep-alive requests) is the idle backstop.
        .header_read_timeout(limits.idle_timeout)
        .max_buf_size(limits.max_header_bytes.max(8192))
        .max_headers(limits.max_headers);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(limits.max_header_bytes as u32)
        .max_concurrent_streams(256)
        .keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(10));
    let builder = Arc::new(builder);
    let reaper_stop = stop.child_token();
    conns.spawn_reaper(reaper_stop.clone());
    let tasks = Arc::new(Mutex::new(tokio::task::JoinSet::new()));
    let spawn_into = tasks.clone();
    // Set by a connection still open `grace` after `stop` (then dropped).
    let overstayed = Arc::new(AtomicBool::new(false));
    let overstayed_conn = overstayed.clone();
    let conn_stop = stop.clone();
    accept_loop(listener, conns.clone(), stop.clone(), move |io: TrackedStream| {
        let handle = io.handle();
        let svc = service.clone();
        let hyper_svc = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
            let busy = handle.begin();
            let http1 = req.version() < http::Version::HTTP_2;
            let unread = Arc::new(AtomicBool::new(false));
            let mut req =
                req.map(|inner| RequestBody { inner, unread: unread.clone(), handle: handle.clone(), ended: false });
            req.extensions_mut().insert(handle.clone());
            let handle = handle.clone();
            let fut = svc.clone().oneshot(req);
            async move {
                let mut resp = fut.await?;
                if http1 && unread.load(Ordering::Acquire) && resp.status() != http::StatusCode::SWITCHING_PROTOCOLS {
                    // Answered with the body unread (a refusal): hyper closes the connection
                    // after this answer rather than read the rest, so the answer says so — a
                    // client that pooled the connection as kept alive would send its next
                    // request into a closing socket.
                    resp.headers_mut().insert(http::header::CONNECTION, http::HeaderValue::from_static("close"));
                }
                if resp.status() == http::StatusCode::SWITCHING_PROTOCOLS {
                    handle.mark_upgraded();
                }
                Ok::<_, std::convert::Infallible>(resp.map(|inner| BusyBody { inner, busy: Some(busy) }))
            }
        });
        let builder = builder.clone();
        let stop = conn_stop.clone();
        let overstayed = overstayed_conn.clone();
        let mut tasks = spawn_into.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        while tasks.try_join_next().is_some() {}
        tasks.spawn(async move {
            let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), hyper_svc);
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                () = stop.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    if tokio::time::timeout(grace, conn).await.is_err() {
                        overstayed.store(true, Ordering::Release);
                    }
                }
            }
        });
    })
    .await;
    let mut tasks = std::mem::take(&mut *tasks.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
    // Each connection has `grace` from `stop`; this bound only guards against one that ignores it.
    let _ = tokio::time::timeout(grace + Duration::from_secs(1), async { while tasks.join_next().await.is_some() {} })
        .await;
    if overstayed.load(Ordering::Acquire) {
        tracing::info!(
            listener = conns.name,
            grace_ms = grace.as_millis() as u64,
            "Connections still open after the drain grace; closing them."
        );
    }
    reaper_stop.cancel();
}

/// Raises this process's soft limit of open files to its hard limit (inherited by the
/// services the supervisor starts), so the listeners' connection caps, not the descriptor
/// limit, decide when connections are refused. Returns the (soft, hard) limits now in force.
///
/// # Errors
/// When the limits cannot be read or set.
pub fn raise_fd_limit() -> nix::Result<(u64, u64)> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard)?;
    }
    getrlimit(Resource::RLIMIT_NOFILE)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max: usize) -> Limits {
        Limits {
            max_connections: max,
            owner_reserve: 2,
            header_read_timeout: Duration::from_millis(50),
            idle_timeout: Duration::from_millis(200),
            max_header_bytes: 8192,
            max_headers: 10,
            reap_trusted: true,
        }
    }

    #[test]
    fn the_head_timeout_variable_sets_milliseconds_in_range_and_ignores_anything_else() {
        let edge = Limits::EDGE;
        assert_eq!(edge.with_head_timeout_from(None), edge, "unset: today's 10 s");
        assert_eq!(edge.header_read_timeout, Duration::from_secs(10));
        let short = edge.with_head_timeout_from(Some(" 1500 "));
        assert_eq!(short.header_read_timeout, Duration::from_millis(1500));
        assert_eq!(Limits { header_read_timeout: edge.header_read_timeout, ..short }, edge, "only the timeout");
        assert_eq!(Limits::GRPC.with_head_timeout_from(Some("100")).header_read_timeout, Duration::from_millis(100));
        assert_eq!(edge.with_head_timeout_from(Some("600000")).header_read_timeout, Duration::from_secs(600));
        for bad in ["", "0", "99", "600001", "1.5", "-1", "10s", "x"] {
            assert_eq!(edge.with_head_timeout_from(Some(bad)), edge, "{bad:?} keeps the default");
        }
    }

    #[test]
    fn at_the_cap_the_oldest_untrusted_connection_makes_room() {
        let set = Connections::new("t", limits(3));
        let a = set.admit(Peer::Other).unwrap();
        let b = set.admit(Peer::Other).unwrap();
        let c = set.admit(Peer::Other).unwrap();
        a.handle().mark_trusted();
        let _busy = b.handle().begin();
        // a is trusted, b busy, c idle: c goes first; then the newer idle d before busy b; a never.
        let d = set.admit(Peer::Other).unwrap();
        assert!(c.handle.entry.close.is_cancelled());
        let e = set.admit(Peer::Other).unwrap();
        assert!(d.handle.entry.close.is_cancelled(), "idle before busy");
        assert!(!b.handle.entry.close.is_cancelled());
        let _busy_e = e.handle().begin();
        let _f = set.admit(Peer::Other).unwrap();
        assert!(b.handle.entry.close.is_cancelled(), "then the oldest busy one");
        assert!(!a.handle.entry.close.is_cancelled());
        assert_eq!(set.stats().open, 3);
        assert_eq!(set.stats().evicted, 3);
    }

    #[test]
    fn trusted_and_owner_connections_are_never_evicted_and_the_owner_has_a_reserve() {
        let set = Connections::new("t", limits(2));
        let a = set.admit(Peer::Other).unwrap();
        let b = set.admit(Peer::Other).unwrap();
        a.handle().mark_trusted();
        b.handle().mark_trusted();
        assert!(set.admit(Peer::Other).is_none(), "every slot is trusted");
        let o1 = set.admit(Peer::Owner).unwrap();
        let o2 = set.admit(Peer::Owner).unwrap();
        assert_eq!(set.stats().open, 4);
        assert!(set.admit(Peer::Other).is_none(), "another uid never displaces the owner's");
        // Beyond the reserve, the owner's own oldest unauthenticated connection makes room.
        o2.handle().mark_trusted();
        let o3 = set.admit(Peer::Owner).unwrap();
        assert!(o1.handle.entry.close.is_cancelled());
        o3.handle().mark_trusted();
        assert!(set.admit(Peer::Owner).is_none(), "nothing left to displace");
        drop(o2);
        drop(o3);
        assert_eq!(set.stats().open, 2);
        drop(o1);
        assert!(set.admit(Peer::Other).is_none(), "a and b (trusted) still fill the cap");
        drop(a);
        assert_eq!(set.stats().open, 1);
        assert!(set.admit(Peer::Other).is_some());
        drop(b);
    }

    #[test]
    fn a_connection_that_was_served_goes_after_one_that_never_was() {
        let set = Connections::new("t", limits(2));
        let kept_alive = set.admit(Peer::Other).unwrap();
        drop(kept_alive.handle().begin());
        let fresh = set.admit(Peer::Other).unwrap();
        let _newcomer = set.admit(Peer::Other).unwrap();
        assert!(fresh.handle.entry.close.is_cancelled());
        assert!(!kept_alive.handle.entry.close.is_cancelled());
    }

    #[tokio::test]
    async fn slow_heads_and_idle_connections_are_reaped_busy_ones_are_not() {
        let set = Connections::new("t", limits(10));
        let slow = set.admit(Peer::Other).unwrap();
        let idle = set.admit(Peer::Other).unwrap();
        let busy = set.admit(Peer::Other).unwrap();
        slow.handle().saw_bytes();
        let _b = busy.handle().begin();
        tokio::time::sleep(Duration::from_millis(80)).await;
        assert_eq!(set.sweep(), 1);
        assert!(slow.handle.entry.close.is_cancelled());
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert_eq!(set.sweep(), 1);
        assert!(idle.handle.entry.close.is_cancelled());
        assert!(!busy.handle.entry.close.is_cancelled());
        assert_eq!(set.stats().slow_heads, 1);
        assert_eq!(set.stats().idle_closed, 1);
    }

    #[tokio::test]
    async fn an_answer_sent_before_the_body_is_read_reaches_a_client_that_is_still_sending() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        // Answers 413 without reading the body (as the edge's body limit does from a declared
        // length), and 200 with the body read to its end.
        let svc = tower::service_fn(|req: http::Request<RequestBody>| async move {
            use http_body::Body as _;
            let mut body = req.into_body();
            if body.size_hint().lower() > 1024 {
                return Ok::<_, std::convert::Infallible>(
                    http::Response::builder().status(413).body(String::new()).unwrap(),
                );
            }
            while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
                frame.unwrap();
            }
            Ok(http::Response::new("read".to_owned()))
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let conns = Connections::new("t", Limits::EDGE);
        let server =
            tokio::spawn(serve_http(Listener::Tcp(listener), conns, svc, stop.clone(), Duration::from_secs(1)));
        async fn head(c: &mut tokio::net::TcpStream) -> String {
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                assert_eq!(c.read(&mut byte).await.unwrap(), 1, "the answer's head: {head:?}");
                head.push(byte[0]);
            }
            String::from_utf8(head).unwrap()
        }

        // The answer comes before the body is sent; the client sends all of it anyway. Without
        // the lingering close the server's socket closed with bytes unread, the kernel answered
        // with a reset, and these writes failed.
        const BODY: usize = 8 * 1024 * 1024;
        let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
        c.write_all(format!("POST /x HTTP/1.1\r\nhost: t\r\ncontent-length: {BODY}\r\n\r\n").as_bytes()).await.unwrap();
        let answer = head(&mut c).await;
        assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
        assert!(answer.contains("connection: close\r\n"), "not to be reused: {answer}");
        let chunk = vec![b'x'; 64 * 1024];
        for i in 0..BODY / chunk.len() {
            c.write_all(&chunk).await.unwrap_or_else(|e| panic!("write {i} of the body after the answer: {e}"));
        }
        c.shutdown().await.unwrap();
        let mut rest = Vec::new();
        c.read_to_end(&mut rest).await.expect("the server closes cleanly once the client has");
        assert!(rest.is_empty(), "{rest:?}");

        // A body read to its end: the connection closes at once (no lingering for a client that
        // keeps its side open).
        let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
        c.write_all(b"POST /x HTTP/1.1\r\nhost: t\r\nconnection: close\r\ncontent-length: 5\r\n\r\nhello")
            .await
            .unwrap();
        let answer = head(&mut c).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        let mut rest = Vec::new();
        tokio::time::timeout(LINGER / 2, c.read_to_end(&mut rest)).await.expect("closed without lingering").unwrap();
        assert_eq!(rest, b"read");
        stop.cancel();
        server.await.unwrap();
    }

    #[tokio::test]
    async fn a_closed_connection_fails_its_next_read() {
        use tokio::io::AsyncReadExt;
        let set = Connections::new("t", limits(1));
        let (client, server) = tokio::io::duplex(64);
        let mut tracked = set.admit(Peer::Other).unwrap().track(server);
        let reader = tokio::spawn(async move {
            let mut buf = [0u8; 8];
            tracked.read(&mut buf).await
        });
        let _newcomer = set.admit(Peer::Other).unwrap();
        let err = reader.await.unwrap().unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionAborted);
        drop(client);
    }
}
