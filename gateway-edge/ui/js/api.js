// The page's only way to the daemon: the same REST/SSE API the CLI uses (docs/REST.md), with
// the session cookie. Errors arrive as the REST envelope {"error": {code, message, details}}.

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
/** Called once when any request answers 401 (the session ended). */
export function setUnauthorizedHandler(fn) { onUnauthorized = fn; }

/**
 * api('GET', '/v1/conversations') → parsed JSON (null for 204).
 * Throws ApiError for a non-2xx answer, ApiError(0, 'NETWORK', …) when the daemon is unreachable.
 */
export async function api(method, path, body, { headers = {}, signal } = {}) {
  // X-Coffer-Actor: the audit log and a message's `source` name the console as the actor.
  const init = { method, credentials: 'same-origin', headers: { Accept: 'application/json', 'X-Coffer-Actor': 'ui', ...headers }, signal };
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
      onUnauthorized();
      // The envelope's message is meant for the CLI (it names the token); a page's session ended.
      throw new ApiError(401, e ? e.code : 'UNAUTHORIZED', 'Your session ended. Run `coffer ui` to sign in again.', e && e.details);
    }
    throw new ApiError(resp.status, e ? e.code : 'HTTP_' + resp.status, e ? e.message : `${resp.status} ${resp.statusText}`, e && e.details);
  }
  return data;
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
 * Follows an SSE endpoint. `handlers` maps event names to fn(data, lastEventId); `onState` gets
 * 'open' | 'retrying' | 'failed'. A dropped connection is retried by EventSource itself, which
 * resends `Last-Event-ID`; when the browser gives up (an error answer) it is reopened here with
 * `?after=<last id>`. After `maxRetries` consecutive failures it stops and calls
 * onState('failed'), so the caller reconciles from REST instead of waiting forever. When the
 * session has ended (the edge ends a revoked session's streams), the stream stops and the
 * 401 handler runs.
 * Returns {close()}.
 */
export function sse(url, handlers, { onState = () => {}, maxRetries = 5 } = {}) {
  let es = null;
  let failures = 0;
  let closed = false;
  let lastId = null;
  let timer = null;
  const open = () => {
    if (closed) return;
    const [base, query] = url.split('?');
    const params = Object.fromEntries(new URLSearchParams(query || ''));
    es = new EventSource(lastId ? withQuery(base, { ...params, after: lastId }) : url, { withCredentials: true });
    es.onopen = () => { failures = 0; onState('open'); };
    for (const [name, fn] of Object.entries(handlers)) {
      es.addEventListener(name, (ev) => {
        if (ev.lastEventId) lastId = ev.lastEventId;
        let data = ev.data;
        try { data = JSON.parse(ev.data); } catch { /* a plain-text event */ }
        fn(data, ev.lastEventId);
      });
    }
    es.onerror = () => {
      if (closed) return;
      failures += 1;
      if (failures > maxRetries) { es.close(); onState('failed'); return; }
      onState('retrying');
      if (es.readyState === EventSource.CLOSED) {
        // The browser gave up on an error answer. EventSource never says which one, and a
        // revoked session looks like this (the server ends the stream, the reconnect is a 401):
        // asking for the session lets a 401 reach the signed-out handler instead of retrying.
        const again = () => { if (!closed) timer = setTimeout(open, Math.min(250 * 2 ** (failures - 1), 4000)); };
        api('GET', '/v1/ui/session').then(again, (e) => { if (e.status === 401) closed = true; else again(); });
      }
    };
  };
  open();
  return { close() { closed = true; clearTimeout(timer); if (es) es.close(); } };
}
