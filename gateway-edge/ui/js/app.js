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

function showSignedOut() {
  if (signedOut) return;
  signedOut = true;
  if (cleanup) { try { cleanup(); } catch { /* page already gone */ } cleanup = null; }
  document.body.classList.add('signed-out');
  delete root.dataset.page;
  replace(root, h('section', { class: 'notice' },
    h('h1', null, 'Sign in to Coffer'),
    h('p', null, 'This browser has no Coffer session (it ended, or was revoked). In a terminal, run'),
    h('pre', null, h('code', null, 'coffer ui')),
    h('p', null, 'and open the link it prints. A link works once, and only for a short while (60 seconds unless the setting ui.login_code_ttl_s says otherwise).')));
}

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
  const mod = await import(`./pages/${name}.js`);
  if (signedOut) return;
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
    if (e.status === 401) { showSignedOut(); return; }
  }
  route();
})();
