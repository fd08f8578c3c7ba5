// Chat page: told when a turn ends while the tab is in the background (issue 34 §2). A title
// badge, "(2) Coffer — …", counts the conversations whose turn ended (done or failed) while
// `document.visibilityState` was `hidden`; it clears when the tab is seen again. Opt-in, a
// browser notification (the Notification API) for each: permission is asked once, from the
// bell's click in the conversation list (a user gesture), and the choice is kept in
// localStorage. The list feeds every conversation it sees here ([`observe`]); other reasons to
// call the owner back (an approval waiting) go through [`attention`].

/** localStorage key: 'on' when the owner turned browser notifications on. */
const KEY = 'coffer.notify';
/** A title's badge prefix, as this module writes it. */
const BADGE = /^\(\d+\) /;

/** Whether each conversation's turn ran when last seen: id → bool. */
const running = new Map();
/** Conversations that called for attention while the tab was hidden. */
const unseen = new Set();
let started = false;

/** Whether browser notifications are on (the owner's choice, and the browser's permission). */
export function enabled() {
  try {
    return localStorage.getItem(KEY) === 'on' && 'Notification' in window && window.Notification.permission === 'granted';
  } catch { return false; }
}

/**
 * Turns browser notifications on or off; call it from a click (the permission prompt needs a
 * user gesture). Resolves to {on, message}: the state now and what to tell the owner.
 */
export async function toggle() {
  if (!('Notification' in window)) return { on: false, message: 'This browser cannot show notifications.' };
  if (enabled()) {
    store('off');
    return { on: false, message: 'Notifications off.' };
  }
  let p = window.Notification.permission;
  if (p === 'default') p = await window.Notification.requestPermission();
  if (p !== 'granted') {
    store('off');
    return { on: false, message: 'Notifications are blocked for this site: allow them in the browser\'s site settings.' };
  }
  store('on');
  return { on: true, message: 'Notifications on: you are told when a turn ends while this tab is in the background.' };
}

function store(v) {
  try { localStorage.setItem(KEY, v); } catch { /* storage unavailable: off */ }
}

/** How many conversations the badge counts now. */
export function count() { return unseen.size; }

/**
 * Feeds one conversation as the list sees it (loaded or changed). When its turn was running and
 * no longer is, the turn ended: counted (and notified) if the tab is hidden.
 */
export function observe(conv) {
  start();
  const was = running.get(conv.id);
  running.set(conv.id, !!conv.turn_running);
  if (was === true && !conv.turn_running) {
    const body = conv.pending_paused ? 'The turn ended; the queue is paused.' : 'The turn finished.';
    attention(conv, body);
  }
}

/**
 * Calls the owner back about `conv` (`body`: one line): while the tab is hidden, the badge
 * counts it and, when on, a browser notification says it (clicking it opens the conversation).
 */
export function attention(conv, body) {
  start();
  if (document.visibilityState !== 'hidden') return;
  unseen.add(conv.id);
  badge();
  if (!enabled()) return;
  try {
    const n = new window.Notification(conv.title || 'Coffer', { body, tag: `coffer-${conv.id}` });
    n.onclick = () => {
      window.focus();
      location.assign(`/ui/chat?c=${encodeURIComponent(conv.id)}`);
      n.close();
    };
  } catch { /* a browser that refuses page notifications (Android Chrome): the badge says it */ }
}

/** The title with the badge for the count now (a page may set the title at any time). */
function badge() {
  const base = document.title.replace(BADGE, '');
  const want = unseen.size ? `(${unseen.size}) ${base}` : base;
  if (document.title !== want) document.title = want;
}

function start() {
  if (started) return;
  started = true;
  document.addEventListener('visibilitychange', () => {
    if (document.visibilityState === 'visible') { unseen.clear(); badge(); }
  });
  // A page that sets its title while the tab is hidden keeps the badge.
  const t = document.querySelector('title');
  if (t) new MutationObserver(() => { if (unseen.size && !BADGE.test(document.title)) badge(); }).observe(t, { childList: true });
}
