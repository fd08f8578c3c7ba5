// The page's only way to the daemon: the same REST/SSE API the CLI uses (docs/REST.md), with
// the session cookie and the session's key. Errors arrive as the REST envelope
// {"error": {code, message, details}}.
//
// The cookie alone signs nothing in (every port of 127.0.0.1 receives it): every call also
// sends X-Coffer-Session-Key, the key the login handed this page in its address's fragment
// (/ui/chat#key=…). It is kept in localStorage, which only this origin (scheme, host and port)
// can read, and which every tab of the console shares; an event stream, which cannot send a
// header, opens with a single-use ticket instead (streamUrl). The session (and so the key) lasts
// one run of the daemon: while the daemon is down another program could take its port and read
// this origin's storage, so the next daemon knows no earlier key (gateway-edge web_sessions.rs).

const KEY_ITEM = 'coffer.sessionKey';
let memoryKey = ''; // when localStorage is unavailable: this tab only

/** Moves a key the login put in the fragment into storage, and drops it from the address. */
function adoptLoginKey() {
  const m = /^#key=([0-9a-f]{64})$/.exec(location.hash);
  if (!m) return;
  memoryKey = m[1];
  try { localStorage.setItem(KEY_ITEM, m[1]); } catch { /* storage unavailable: memoryKey */ }
  history.replaceState(history.state, '', location.pathname + location.search);
}
adoptLoginKey();

/** The session's key ('' when this browser has none). */
function sessionKey() {
  try { return localStorage.getItem(KEY_ITEM) || memoryKey; } catch { return memoryKey; }
}

/** An error answer of the API: HTTP status, envelope code, message, details. */
export class ApiError extends Error {
  constructor(status, code, message, details) {
    super(message);
    this.status = status;
    this.code = code;
    this.details = details || {};
  }
}

let onUnauthorized = () => {};
/**
 * Called when any request answers 401, with the refusal's reason: 'session_key_missing' (a
 * cookie but no key: this browser was never handed one) or anything else (the session ended).
 */
export function setUnauthorizedHandler(fn) { onUnauthorized = fn; }

/**
 * api('GET', '/v1/conversations') → parsed JSON (null for 204).
 * Throws ApiError for a non-2xx answer, ApiError(0, 'NETWORK', …) when the daemon is unreachable.
 */
export async function api(method, path, body, { headers = {}, signal } = {}) {
  // X-Coffer-Actor: the audit log and a message's `source` name the console as the actor.
  const init = { method, credentials: 'same-origin', headers: { Accept: 'application/json', 'X-Coffer-Actor': 'ui', ...headers }, signal };
  const key = sessionKey();
  if (key) init.headers['X-Coffer-Session-Key'] = key;
  if (body !== undefined) {
    init.headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  let resp;
  try {
    resp = await fetch(path, init);
  } catch (e) {
    if (e.name === 'AbortError') throw e;
    throw new ApiError(0, 'NETWORK', 'Coffer is not answering (is the daemon running?)', {});
  }
  if (resp.status === 204) return null;
  const text = await resp.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = null; }
  if (!resp.ok) {
    const e = data && data.error;
    if (resp.status === 401) {
      const reason = e && e.details && e.details.reason;
      onUnauthorized(reason);
      // The envelope's message is meant for the CLI (it names the token); a page's session ended.
      const text = reason === 'session_key_missing'
        ? 'This browser is not signed in. Run `coffer ui` and open the link it prints.'
        : 'Your session ended. Run `coffer ui` to sign in again.';
      throw new ApiError(401, e ? e.code : 'UNAUTHORIZED', text, e && e.details);
    }
    throw new ApiError(resp.status, e ? e.code : 'HTTP_' + resp.status, e ? e.message : `${resp.status} ${resp.statusText}`, e && e.details);
  }
  return data;
}

/**
 * GET `path` as a Blob with the session's key: a file the API serves as bytes (a message's
 * attachment). Throws ApiError like api() (401 calls the unauthorized handler).
 */
export async function fetchBlob(path) {
  const headers = { 'X-Coffer-Actor': 'ui' };
  const key = sessionKey();
  if (key) headers['X-Coffer-Session-Key'] = key;
  let resp;
  try {
    resp = await fetch(path, { credentials: 'same-origin', headers });
  } catch {
    throw new ApiError(0, 'NETWORK', 'Coffer is not answering (is the daemon running?)', {});
  }
  if (!resp.ok) {
    let e = null;
    try { e = (await resp.json()).error; } catch { e = null; }
    if (resp.status === 401) onUnauthorized(e && e.details && e.details.reason);
    throw new ApiError(resp.status, e ? e.code : 'HTTP_' + resp.status, e ? e.message : `${resp.status} ${resp.statusText}`, e && e.details);
  }
  return resp.blob();
}

export const get = (p, o) => api('GET', p, undefined, o);
export const post = (p, b, o) => api('POST', p, b ?? {}, o);
export const patch = (p, b, o) => api('PATCH', p, b, o);
export const put = (p, b, o) => api('PUT', p, b, o);
export const del = (p, o) => api('DELETE', p, undefined, o);

/** '/v1/x?' + the set entries of `params` (undefined/''/null dropped). */
export function withQuery(path, params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params || {})) if (v !== undefined && v !== null && v !== '') q.set(k, v);
  const s = q.toString();
  return s ? `${path}?${s}` : path;
}

/**
 * `url` with a fresh single-use stream ticket (`POST /v1/ui/stream-tickets`) in its query:
 * how an EventSource, which cannot send X-Coffer-Session-Key, is signed in. The ticket works
 * once and for 30 s, so open the stream at once and get a new URL for every reconnection.
 * Throws ApiError like api() (401: signed out, the handler has run).
 */
export async function streamUrl(url) {
  const { ticket } = await api('POST', '/v1/ui/stream-tickets', {});
  return `${url}${url.includes('?') ? '&' : '?'}ticket=${encodeURIComponent(ticket)}`;
}

/**
 * Follows an SSE endpoint. `handlers` maps event names to fn(data, lastEventId); `onState` gets
 * 'open' | 'retrying' | 'failed'. Each connection is opened with a fresh stream ticket; as a
 * ticket works once, a dropped connection is not left to EventSource's own reconnection (it
 * would present the used ticket): it is closed and reopened here with a new ticket and
 * `?after=<last id>`. After `maxRetries` consecutive failures it stops and calls
 * onState('failed'), so the caller reconciles from REST instead of waiting forever. When the
 * session has ended (the edge ends a revoked session's streams), the ticket request answers
 * 401: the stream stops and the 401 handler runs. With `raw`, each event's data is handed over
 * as text, unparsed, and a reconnection does not resume with `after` (a followed log).
 * Returns {close()}.
 */
export function sse(url, handlers, { onState = () => {}, maxRetries = 5, raw = false } = {}) {
  let es = null;
  let failures = 0;
  let closed = false;
  let lastId = null;
  let timer = null;
  const retry = () => {
    failures += 1;
    if (failures > maxRetries) { onState('failed'); return; }
    onState('retrying');
    timer = setTimeout(open, Math.min(250 * 2 ** (failures - 1), 4000));
  };
  const open = async () => {
    if (closed) return;
    const [base, query] = url.split('?');
    const params = Object.fromEntries(new URLSearchParams(query || ''));
    let signed;
    try {
      signed = await streamUrl(lastId ? withQuery(base, { ...params, after: lastId }) : url);
    } catch (e) {
      if (e.status === 401) closed = true; else if (!closed) retry();
      return;
    }
    if (closed) return;
    es = new EventSource(signed);
    es.onopen = () => { failures = 0; onState('open'); };
    for (const [name, fn] of Object.entries(handlers)) {
      es.addEventListener(name, (ev) => {
        if (raw) { fn(ev.data); return; }
        if (ev.lastEventId) lastId = ev.lastEventId;
        let data = ev.data;
        try { data = JSON.parse(ev.data); } catch { /* a plain-text event */ }
        fn(data, ev.lastEventId);
      });
    }
    es.onerror = () => {
      if (closed) return;
      es.close();
      retry();
    };
  };
  open();
  return { close() { closed = true; clearTimeout(timer); if (es) es.close(); } };
}
