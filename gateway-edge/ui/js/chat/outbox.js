// Messages on their way: each send gets an Idempotency-Key (docs/REST.md, `POST
// /v1/conversations/{id}/messages`), shows in the thread as "Sending…" until the daemon has
// it, is retried with backoff when the network or the daemon fails (a request that hangs is
// given up after a deadline and retried too), and ends "Not sent" with Retry and Edit when the
// retries run out. A retry carries the same key, so however many tries reach the daemon, the
// message is queued once. The texts not yet confirmed are kept in this tab's sessionStorage:
// after a reload they are shown and sent again with their keys (the daemon answers a key it
// has seen with its first answer), never typed twice. Files are not kept across a reload.
import { h } from '../dom.js';

/** Tries of one send before it is shown as failed. */
export const TRIES = 5;
/** How long a send may hang before it is given up and tried again (ms), before its files. */
const DEADLINE_MS = 20000;
/** Longer per byte of files (ms per byte: about 100 KB/s at worst). */
const MS_PER_BYTE = 0.01;
/** A kept text older than this is not re-sent by itself after a reload (the daemon remembers
 * keys for 15 minutes): it is shown failed, for the user to retry or edit. */
export const RESEND_MS = 10 * 60 * 1000;

const storeKey = (id) => `coffer.outbox.${id}`;

/** A fresh key: 128 random bits as hex (crypto.randomUUID needs a secure context). */
export function newKey() {
  const a = new Uint8Array(16);
  crypto.getRandomValues(a);
  return Array.from(a, (b) => b.toString(16).padStart(2, '0')).join('');
}

/** The unconfirmed sends of conversation `id`: [{key, text, now, at}], oldest first. */
export function kept(id) {
  try { return JSON.parse(sessionStorage.getItem(storeKey(id)) || '[]'); } catch { return []; }
}

function write(id, list) {
  try {
    if (list.length) sessionStorage.setItem(storeKey(id), JSON.stringify(list));
    else sessionStorage.removeItem(storeKey(id));
  } catch { /* storage unavailable or full: the send still goes, it just won't survive a reload */ }
}

/** Keeps an unconfirmed send ({key, text, now, at}) until `confirm`. */
export function keep(id, entry) { write(id, [...kept(id).filter((e) => e.key !== entry.key), entry]); }

/** Forgets a send: confirmed, refused, or taken back into the composer. */
export function forget(id, key) { write(id, kept(id).filter((e) => e.key !== key)); }

/** Whether a failure may pass by trying again: no answer, a timeout, or the daemon's 5xx. */
export function transient(e) { return e && (e.status === 0 || e.status >= 500 || e.name === 'AbortError' || e.name === 'TimeoutError'); }

/** The wait before the second try (ms); each later wait doubles it, up to 16 times as long. */
let firstBackoffMs = 500;

/** The wait before try `n` (1-based) after a failure: 0.5 s, 1 s, 2 s, 4 s … (ms). */
export function backoff(n) { return Math.min(firstBackoffMs * 2 ** (n - 1), firstBackoffMs * 16); }

/**
 * Sets the wait before a send's second try (ms, at least 10; later waits double it): the
 * tests' way of not waiting 7.5 s for a send to be given up. The page never calls it.
 */
export function setBackoffMs(ms) { firstBackoffMs = Math.max(10, Number(ms) || 500); }

/** The deadline of one try of a send carrying `bytes` of files (ms). */
export function deadline(bytes) { return DEADLINE_MS + Math.round(bytes * MS_PER_BYTE); }

/**
 * The thread's element of a message on its way: `article.msg.user.outgoing[data-state]`,
 * `sending` or `failed`. Returns {el, sending(note), failed(reason, {retry, edit})}.
 */
export function bubble(text, files = 0) {
  const state = h('span', { class: 'send-state', role: 'status' });
  const foot = h('footer', { class: 'msg-foot' }, state);
  const body = h('div', { class: 'msg-body' }, h('div', { class: 'block text', dir: 'auto' }, text));
  if (files) body.appendChild(h('p', { class: 'hint' }, `${files} file${files === 1 ? '' : 's'}`));
  const el = h('article', { class: 'msg user outgoing', dataset: { state: 'sending' } }, body, foot);
  return {
    el,
    sending(note = '') {
      el.dataset.state = 'sending';
      foot.replaceChildren(state);
      state.textContent = note ? `Sending… (${note})` : 'Sending…';
    },
    failed(reason, { retry, edit }) {
      el.dataset.state = 'failed';
      state.textContent = `Not sent: ${reason}`;
      foot.replaceChildren(state,
        h('button', { type: 'button', class: 'ghost retry-send', on: { click: retry } }, 'Retry'),
        h('button', { type: 'button', class: 'ghost', title: 'Take the text back into the composer', on: { click: edit } }, 'Edit'));
    },
  };
}
