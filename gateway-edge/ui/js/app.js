// The web console's shell: client-side routing between pages (/ui/<page>), the login check and
// the signed-out screen. Each page is a module in ./pages/ exporting
//   mount(root: HTMLElement, ctx: {params: URLSearchParams, navigate(path)}) → cleanup function
// The cleanup closes the page's event streams and timers.
import { get, setUnauthorizedHandler } from './api.js';
import { h, replace } from './dom.js';

const PAGES = ['chat', 'servers', 'tools', 'activity', 'knowledge', 'settings'];
const root = document.getElementById('page');
let cleanup = null;
let signedOut = false;

function pageOf(pathname) {
  const name = pathname.replace(/^\/ui\/?/, '').split('/')[0] || 'chat';
  return PAGES.includes(name) ? name : 'chat';
}

/** True when this tab keeps an unsent chat draft (js/chat/thread.js keeps them in sessionStorage). */
function hasDraft() {
  try {
    for (let i = 0; i < sessionStorage.length; i += 1) if ((sessionStorage.key(i) || '').startsWith('coffer.draft.')) return true;
  } catch { /* storage unavailable */ }
  return false;
}

/**
 * The signed-out screen. `reason` 'session_key_missing': the browser has a session cookie but
 * not the key that goes with it (its storage was cleared, or the session predates keys): the
 * cookie alone never signs in, so this browser needs a new login link too.
 */
function showSignedOut(reason) {
  if (signedOut) return;
  signedOut = true;
  if (cleanup) { try { cleanup(); } catch { /* page already gone */ } cleanup = null; }
  document.body.classList.add('signed-out');
  delete root.dataset.page;
  replace(root, h('section', { class: 'notice' },
    h('h1', null, 'Sign in to Coffer'),
    h('p', null, reason === 'session_key_missing'
      ? 'This browser is not signed in: it lacks this console\'s session key (a login link hands it over). In a terminal, run'
      : 'This browser has no Coffer session: it ended when the daemon stopped or restarted (a console sign-in lasts one run of the daemon), or it was revoked. In a terminal, run'),
    h('pre', null, h('code', { 'data-cli': '' }, 'coffer ui')),
    h('p', null, 'and open the link it prints. A link works once, and only for a short while (60 seconds unless the setting ui.login_code_ttl_s says otherwise).'),
    hasDraft() ? h('p', { class: 'draft-note' }, 'Your unsent message is kept in this tab: it is back in the composer once you sign in here again.') : null));
}

// ---- Coffer not answering ----
// A module whose fetch failed stays failed in this document (the module map keeps the
// failure), so recovering means reloading the page once the daemon answers again.
const RETRY_EVERY_MS = 3000;
const RETRY_FOR_MS = 5 * 60 * 1000;
let unreachable = null; // {timer, until, note} while the notice shows

/** True when the daemon answers `GET /v1/health`. */
async function answering() {
  try { return (await fetch('/v1/health', { cache: 'no-store' })).ok; } catch { return false; }
}

async function retryNow() {
  if (!unreachable) return;
  if (await answering()) { location.reload(); return; }
  if (!unreachable) return;
  if (Date.now() > unreachable.until) {
    clearInterval(unreachable.timer);
    unreachable.note.textContent = 'Still not answering; no more automatic retries. Start the daemon, then press Retry.';
  } else {
    unreachable.note.textContent = `Still not answering (last try ${new Date().toLocaleTimeString()}); trying again every few seconds.`;
  }
}

function showUnreachable() {
  if (cleanup) { try { cleanup(); } catch { /* page already gone */ } cleanup = null; }
  delete root.dataset.page;
  const note = h('p', { class: 'muted', role: 'status' }, 'This page tries again by itself every few seconds, and when you come back to the tab.');
  replace(root, h('section', { class: 'notice unreachable' },
    h('h1', null, 'Coffer is not answering'),
    h('p', null, 'Is the daemon running? In a terminal, run'),
    h('pre', null, h('code', { 'data-cli': '' }, 'coffer daemon start')),
    note,
    h('button', { type: 'button', class: 'primary', on: { click: () => { if (unreachable) unreachable.until = Date.now() + RETRY_FOR_MS; retryNow(); } } }, 'Retry')));
  if (unreachable) clearInterval(unreachable.timer);
  unreachable = { timer: setInterval(retryNow, RETRY_EVERY_MS), until: Date.now() + RETRY_FOR_MS, note };
}
window.addEventListener('focus', () => { if (unreachable) retryNow(); });
document.addEventListener('visibilitychange', () => { if (unreachable && !document.hidden) retryNow(); });

async function route() {
  if (signedOut) return;
  const name = pageOf(location.pathname);
  for (const a of document.querySelectorAll('#nav a')) {
    if (a.dataset.page === name) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
  if (cleanup) { try { cleanup(); } catch (e) { console.warn('page cleanup failed', e); } cleanup = null; }
  replace(root, h('p', { class: 'muted loading' }, 'Loading…'));
  document.title = `Coffer — ${name[0].toUpperCase()}${name.slice(1)}`;
  let mod;
  try {
    mod = await import(`./pages/${name}.js`);
  } catch {
    // The daemon is down (or went away after the shell loaded): say so instead of "Loading…".
    if (!signedOut) showUnreachable();
    return;
  }
  if (signedOut) return;
  if (unreachable) { clearInterval(unreachable.timer); unreachable = null; }
  replace(root);
  root.dataset.page = name;
  cleanup = mod.mount(root, { params: new URLSearchParams(location.search), navigate }) || null;
}

/** Goes to `path` (under /ui) without reloading the page. */
export function navigate(path) {
  history.pushState(null, '', path);
  route();
}

document.addEventListener('click', (e) => {
  const a = e.target.closest('a[data-nav]');
  if (!a || e.defaultPrevented || e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey || e.altKey) return;
  e.preventDefault();
  navigate(a.getAttribute('href'));
});
window.addEventListener('popstate', route);
setUnauthorizedHandler(showSignedOut);

(async () => {
  try {
    await get('/v1/ui/session');
  } catch (e) {
    if (e.status === 401) { showSignedOut(e.details && e.details.reason); return; }
    if (e.status === 0) { showUnreachable(); return; }
  }
  route();
})();
