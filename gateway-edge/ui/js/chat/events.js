// The chat's live events for every tab of this browser over ONE connection.
//
// Why: the console speaks HTTP/1.1 to the daemon and a browser opens at most six connections
// per host, shared by all its tabs. A stream per tab (let alone two, list and thread) fills
// that pool with three to six tabs, and a message sent then waits for a free connection that
// never comes. So the browser holds one multiplexed stream (`GET /v1/events`, docs/REST.md):
//
// - One tab is the hub, elected with the Web Locks API (`coffer.events.hub`): it holds the
//   stream, subscribes what every tab follows (`POST /v1/events/{stream}`: the list, the open
//   threads; added and removed without reconnecting), and passes each frame to the tab it
//   belongs to over a BroadcastChannel (`coffer.events`). When the hub tab closes, reloads or
//   is frozen its lock goes to another tab, which opens a new stream; every tab then
//   re-announces what it follows with the last `seq` it received, so nothing is lost and
//   nothing is handed over twice (a tab also drops any conversation event at or below the
//   `seq` it has).
// - Each tab holds a lock of its own (`coffer.events.tab.<id>`) for its life; the hub waits
//   on it to learn that a tab is gone and drops that tab's subscriptions.
// - Without Web Locks or BroadcastChannel (an old browser, or a page served over plain HTTP
//   from a name other than loopback: locks need a secure context) each tab is its own hub:
//   one stream per tab, still half of what it was. Android Chrome has had both for years (Web
//   Locks since 69, BroadcastChannel since 54); SharedWorker, the other way to share one
//   connection, reached Android Chrome only in 148 (May 2026), which is why this is built on
//   locks. A page that is frozen (Android freezes background tabs) hands the stream over on
//   the Page Lifecycle `freeze` event and re-announces what it follows on `resume`.
//
// follow(spec, handlers, {onState}) mirrors api.js's sse(): handlers map event names to
// fn(data); onState gets 'open' | 'retrying' | 'failed'. `spec` is {list: true},
// {conversation: id, after: seq} or {invocations: true} (the invocation log live: Activity).
import { api, streamUrl } from '../api.js';

const CHANNEL = 'coffer.events';
const HUB_LOCK = 'coffer.events.hub';
const TAB_LOCK = 'coffer.events.tab.';
/** Reconnections of the stream before the subscriptions are told 'failed'. */
const MAX_RETRIES = 10;
/** The stream is closed this long after the last subscription went (ms). */
const IDLE_CLOSE_MS = 5000;
/** The wait before the first reconnection and the longest wait (ms): doubled from one to the other. */
let retryFirstMs = 250;
let retryMaxMs = 4000;

/**
 * Sets the reconnection backoff: the first wait and the longest (ms, each at least 10). The
 * tests' way of not waiting out ten reconnections (about 28 s) to see the page give up; the
 * number of reconnections stays MAX_RETRIES. The page never calls it.
 */
export function setRetryBackoffMs(firstMs, maxMs) {
  retryFirstMs = Math.max(10, Number(firstMs) || 250);
  retryMaxMs = Math.max(retryFirstMs, Number(maxMs) || 4000);
}

function randomId() {
  const a = new Uint8Array(8);
  crypto.getRandomValues(a);
  return Array.from(a, (b) => b.toString(16).padStart(2, '0')).join('');
}

const TAB = randomId();
let counter = 0;
/** This tab's subscriptions: key → {spec, handlers, onState, last}. */
const mine = new Map();
let started = false;
let channel = null;
let isHub = false;
let tabLock = Promise.resolve(); // resolves once this tab holds its own lock
let hub = null; // when this tab is the hub: see makeHub()

/** True when this tab holds the browser's event stream (tests read it). */
export function holdsStream() { return isHub; }

/**
 * Follows `spec` ({list: true} or {conversation: id, after}) with `handlers` (event name →
 * fn(data)); `onState('open'|'retrying'|'failed')`. Returns {close()}.
 */
export function follow(spec, handlers, { onState = () => {} } = {}) {
  start();
  const key = `${TAB}.${++counter}`;
  // After 'failed' the subscription is over, as with api.js's sse(): the caller follows anew.
  const sub = {
    spec: { ...spec }, handlers, last: spec.conversation ? Number(spec.after || 0) : 0, closed: false,
    onState: (s) => { if (s === 'failed') handle.close(); onState(s); },
  };
  mine.set(key, sub);
  announce(key, sub);
  const handle = {
    close() {
      if (sub.closed) return;
      sub.closed = true;
      mine.delete(key);
      if (isHub) hub.remove(key);
      else if (channel) channel.postMessage({ t: 'unsub', key });
    },
  };
  return handle;
}

/** The spec of `sub` to (re)subscribe with: a conversation from the last seq it received. */
function specOf(sub) {
  if (sub.spec.conversation) return { conversation: sub.spec.conversation, after: sub.last };
  return sub.spec.invocations ? { invocations: true } : { list: true };
}

/** Tells the hub (this tab's or another's) about subscription `key` of this tab. */
function announce(key, sub) {
  const spec = specOf(sub);
  const names = Object.keys(sub.handlers);
  if (isHub) { hub.add(key, TAB, spec, names); return; }
  if (!channel) return;
  tabLock.then(() => { if (mine.has(key) && !isHub) channel.postMessage({ t: 'sub', tab: TAB, key, spec, names }); });
}

/** Hands frame `name`/`data` of `key` to this tab's handlers (dropping a replayed event). */
function deliver(key, name, data) {
  const sub = mine.get(key);
  if (!sub || sub.closed) return;
  if (data && typeof data === 'object') delete data.sub;
  if (name === 'ended') {
    // An unknown conversation (deleted meanwhile) reads as its deletion; a final reset was
    // delivered before this and its handler has acted.
    if (data.reason === 'not_found' && sub.handlers.reset) sub.handlers.reset({ seq: 0, reset: { reason: 'deleted' } });
    return;
  }
  if (sub.spec.conversation && name !== 'reset' && data && typeof data.seq === 'number') {
    if (data.seq <= sub.last) return;
    sub.last = data.seq;
  }
  const fn = sub.handlers[name];
  if (fn) fn(data);
}

function setState(keys, state) {
  for (const k of keys) {
    const sub = mine.get(k);
    if (sub && !sub.closed) sub.onState(state);
  }
}

function start() {
  if (started) return;
  started = true;
  const shared = typeof BroadcastChannel === 'function' && navigator.locks && typeof navigator.locks.request === 'function';
  if (!shared) { becomeHub(); return; }
  channel = new BroadcastChannel(CHANNEL);
  channel.onmessage = (ev) => onMessage(ev.data || {});
  // This tab's own lock, held for its life: the hub learns of its end by waiting on it.
  tabLock = new Promise((granted) => {
    navigator.locks.request(TAB_LOCK + TAB, () => { granted(); return new Promise(() => {}); });
  });
  elect();
  // A frozen or hidden-for-good page hands the stream over; it comes back as a follower.
  document.addEventListener('freeze', stepDown);
  document.addEventListener('resume', () => { elect(); for (const [k, s] of mine) announce(k, s); });
  window.addEventListener('pagehide', stepDown);
}

let release = null; // resolves the held hub lock
let candidate = 0; // the number of this tab's request for the hub lock, queued or held; 0: none
let requests = 0;
function elect() {
  if (candidate) return;
  const mine = ++requests;
  candidate = mine;
  navigator.locks.request(HUB_LOCK, () => new Promise((resolve) => {
    release = resolve;
    becomeHub();
  })).finally(() => { if (candidate === mine) candidate = 0; });
}

function becomeHub() {
  isHub = true;
  hub = makeHub();
  for (const [k, s] of mine) hub.add(k, TAB, specOf(s), Object.keys(s.handlers));
  // Every other tab re-announces what it follows, from the last seq it has.
  if (channel) channel.postMessage({ t: 'hub' });
}

function stepDown() {
  if (!isHub || !channel) return;
  isHub = false;
  hub.close();
  hub = null;
  if (release) { release(); release = null; }
  candidate = 0; // the lock is being given back: a later election queues anew
}

function onMessage(m) {
  switch (m.t) {
    case 'hub': // a new hub: tell it what this tab follows
      if (!isHub) for (const [k, s] of mine) announce(k, s);
      break;
    case 'sub':
      if (isHub) hub.add(m.key, m.tab, m.spec, m.names || []);
      break;
    case 'unsub':
      if (isHub) hub.remove(m.key);
      break;
    case 'ev':
      if (mine.has(m.key)) deliver(m.key, m.name, m.data);
      break;
    case 'state':
      setState((m.keys || []).filter((k) => mine.has(k)), m.state);
      break;
    default:
  }
}

/**
 * The hub: one EventSource on `/v1/events` with every tab's subscriptions. Subscriptions are
 * added and removed on the open stream; when it breaks it is reopened (a new ticket each
 * time, with every subscription and its last seq) with backoff, and after MAX_RETRIES
 * failures in a row the subscriptions are told 'failed' (a new subscription tries again).
 */
function makeHub() {
  const subs = new Map(); // key → {tab, spec, names}
  const watchedTabs = new Set();
  const listening = new Set();
  let es = null;
  let stream = null; // the open stream's id (after its hello)
  let connecting = false;
  let failures = 0;
  let timer = 0;
  let idleTimer = 0;
  let closed = false;
  let toAdd = new Map();
  let toRemove = new Set();
  let flushing = false;

  const route = (key, name, data) => {
    const s = subs.get(key);
    if (!s) return;
    if (s.spec.conversation && name !== 'reset' && data && typeof data.seq === 'number' && data.seq > (s.spec.after || 0)) s.spec.after = data.seq;
    if (s.tab === TAB) deliver(key, name, data);
    else if (channel) channel.postMessage({ t: 'ev', key, name, data });
  };
  const tell = (keys, state) => {
    const local = keys.filter((k) => (subs.get(k) || {}).tab === TAB);
    setState(local, state);
    const remote = keys.filter((k) => subs.has(k) && subs.get(k).tab !== TAB);
    if (remote.length && channel) channel.postMessage({ t: 'state', keys: remote, state });
  };

  function listen(name) {
    if (!es || listening.has(name)) return;
    listening.add(name);
    es.addEventListener(name, (ev) => {
      let data;
      try { data = JSON.parse(ev.data); } catch { return; }
      if (name === 'hello') { onHello(data); return; }
      const key = data && typeof data.sub === 'string' ? data.sub : null;
      if (key === null) return;
      route(key, name, data);
      if (name === 'ended') subs.delete(key);
    });
  }

  function onHello(h) {
    stream = h.stream;
    failures = 0;
    const opened = new Set(h.subscriptions || []);
    tell([...opened], 'open');
    // Whatever was asked for while connecting (not in the query) is added now.
    for (const [k, s] of subs) if (!opened.has(k)) toAdd.set(k, s);
    flush();
  }

  async function open() {
    if (closed || connecting || es) return;
    clearTimeout(idleTimer);
    if (!subs.size) return;
    connecting = true;
    const q = new URLSearchParams();
    const sent = [...subs];
    for (const [k, s] of sent) {
      if (s.spec.conversation) q.append('conversation', `${k}:${s.spec.conversation}:${s.spec.after || 0}`);
      else if (s.spec.invocations) q.append('invocations', k);
      else q.append('list', k);
    }
    toAdd.clear();
    toRemove.clear();
    let url;
    try {
      url = await streamUrl(`/v1/events?${q}`);
    } catch (e) {
      connecting = false;
      if (e.status !== 401) retry();
      return;
    }
    connecting = false;
    if (closed) return;
    es = new EventSource(url);
    listening.clear();
    for (const n of ['hello', 'ended']) listen(n);
    for (const s of subs.values()) for (const n of s.names) listen(n);
    es.onerror = () => {
      if (closed) return;
      es.close();
      es = null;
      stream = null;
      retry();
    };
  }

  function retry() {
    failures += 1;
    const keys = [...subs.keys()];
    if (failures > MAX_RETRIES) { tell(keys, 'failed'); failures = 0; return; }
    tell(keys, 'retrying');
    clearTimeout(timer);
    timer = setTimeout(open, Math.min(retryFirstMs * 2 ** (failures - 1), retryMaxMs));
  }

  // Batches the subscription changes of one moment into one request.
  async function flush() {
    if (flushing || !stream || (!toAdd.size && !toRemove.size)) return;
    flushing = true;
    await Promise.resolve();
    const add = [...toAdd].map(([k, s]) => (s.spec.conversation ? { sub: k, conversation: s.spec.conversation, after: s.spec.after || 0 }
      : s.spec.invocations ? { sub: k, invocations: true } : { sub: k, list: true }));
    const remove = [...toRemove];
    toAdd = new Map();
    toRemove = new Set();
    const at = stream;
    try {
      const r = await api('POST', `/v1/events/${encodeURIComponent(at)}`, { add, remove });
      if (at === stream) {
        const refused = new Set((r.refused || []).map((x) => x.sub));
        for (const x of r.refused || []) { route(x.sub, 'ended', { sub: x.sub, reason: 'not_found', message: x.message }); subs.delete(x.sub); }
        tell(add.map((a) => a.sub).filter((k) => !refused.has(k) && subs.has(k)), 'open');
      }
    } catch {
      // The stream ended meanwhile (its reopening carries every subscription) or the daemon
      // is away (the stream's own error reconnects): nothing else to do.
      if (at === stream && es) { es.close(); es = null; stream = null; retry(); }
    } finally {
      flushing = false;
      if (toAdd.size || toRemove.size) flush();
    }
  }

  function watchTab(tab) {
    if (tab === TAB || watchedTabs.has(tab) || !navigator.locks) return;
    watchedTabs.add(tab);
    // Granted only once that tab has gone (closed, reloaded, discarded).
    navigator.locks.request(TAB_LOCK + tab, () => {
      watchedTabs.delete(tab);
      if (closed) return;
      for (const [k, s] of [...subs]) if (s.tab === tab) remove(k);
    });
  }

  function add(key, tab, spec, names) {
    subs.set(key, { tab, spec: { ...spec }, names });
    watchTab(tab);
    for (const n of names) listen(n);
    toRemove.delete(key);
    if (stream) { toAdd.set(key, subs.get(key)); flush(); } else if (!es) { failures = 0; open(); }
  }

  function remove(key) {
    if (!subs.delete(key)) return;
    toAdd.delete(key);
    if (stream) { toRemove.add(key); flush(); }
    if (!subs.size) {
      clearTimeout(idleTimer);
      idleTimer = setTimeout(() => { if (!subs.size && es) { es.close(); es = null; stream = null; } }, IDLE_CLOSE_MS);
    }
  }

  // Back online: reconnect now rather than at the end of a backoff.
  const online = () => { if (!closed && !es && !connecting && subs.size) { failures = 0; clearTimeout(timer); open(); } };
  window.addEventListener('online', online);

  return {
    add,
    remove,
    close() { window.removeEventListener('online', online); closed = true; clearTimeout(timer); clearTimeout(idleTimer); if (es) es.close(); es = null; stream = null; },
  };
}
