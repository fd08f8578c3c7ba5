// The activity page (/ui/activity): the invocation log (GET /v1/invocations, filtered by server,
// outcome and time, paginated) kept live by an `invocations` subscription on the tab's one
// multiplexed event stream (js/chat/events.js, GET /v1/events: `event: invocation`, one list
// item each; no EventSource of its own, so it takes none of the browser's six connections per
// host), and the audit log (GET /v1/audit, filtered by actor and action, paginated). Each call
// names who made it: the conversation of an agent's turn (linked), else the MCP client, else
// the REST caller. Arguments and results are never logged, so none are shown.
import { withQuery } from '../api.js';
import { follow as followEvents } from '../chat/events.js';
import { h, replace } from '../dom.js';
import { vget, errorBox, emptyState, pageHead, table, tableRow, stateBadge, timeEl, tabs, setQuery } from '../vault/common.js';

// What an internal-agent run used (`coffer__ask`): connection/model, tokens in and out, model
// requests; a dash for every other call. Text nodes only (the names are the user's).
function usageCell(i) {
  const u = i.usage;
  if (!u) return h('span', { class: 'muted' }, '—');
  return h('span', { title: `${u.input_tokens} input and ${u.output_tokens} output tokens over ${u.iterations} model requests` },
    h('code', null, `${u.connection}/${u.model}`), ` ${u.input_tokens} in / ${u.output_tokens} out tokens · ${u.iterations} req`);
}

/** What the actor of a call without a client or conversation reads as. */
const ACTOR_LABELS = { api: 'REST API', cli: 'coffer CLI', ui: 'Web console', mcp: 'MCP client', agent: 'Internal agent', daemon: 'Coffer' };

/** Conversation titles already asked for (a live row carries only the id): id → Promise<title>. */
const titles = new Map();
function titleOf(id) {
  if (!titles.has(id)) {
    titles.set(id, vget(`/v1/conversations/${encodeURIComponent(id)}`).then((r) => (r.conversation && r.conversation.title) || '').catch(() => ''));
  }
  return titles.get(id);
}

/**
 * Who made call `i`: the conversation of an agent's turn (its title, linked to the thread), the
 * MCP client (`clientInfo` name and version), or the REST caller (CLI, console, API) or service.
 * Text nodes only: titles and client names are not Coffer's.
 */
export function callerCell(i) {
  const c = i.conversation;
  if (c && c.id) {
    const name = h('span', { class: 'caller-title' }, c.title || 'Untitled conversation');
    if (!c.title) titleOf(c.id).then((t) => { if (t) name.textContent = t; });
    const via = i.client && i.client.name ? `${i.client.name} ${i.client.version || ''}`.trim() : '';
    return h('a', { class: 'caller caller-conv', href: `/ui/chat?c=${encodeURIComponent(c.id)}`, 'data-nav': true, title: `Conversation ${c.id}${via ? ` · through ${via}` : ''}`, dataset: { conversation: c.id } },
      h('span', { class: 'caller-kind', 'aria-hidden': 'true' }, 'Chat'), name);
  }
  if (i.client && (i.client.name || i.client.version)) {
    return h('span', { class: 'caller caller-client', title: 'The MCP client, as it named itself' },
      h('span', { class: 'caller-kind', 'aria-hidden': 'true' }, 'MCP'), `${i.client.name} ${i.client.version}`.trim());
  }
  const a = String(i.actor || '');
  const label = ACTOR_LABELS[a] || (a.startsWith('channel:') ? `${a.slice(8)} channel` : a);
  return h('span', { class: 'caller caller-actor muted', title: `actor ${a}` }, label);
}

const PAGE = 50;
const OUTCOMES = ['ok', 'upstream_error', 'disabled', 'timeout', 'unreachable', 'invalid', 'cancelled'];
const SINCE = [['', 'Any time'], ['15m', 'Last 15 minutes'], ['1h', 'Last hour'], ['24h', 'Last 24 hours'], ['7d', 'Last 7 days']];
const ACTORS = ['cli', 'api', 'ui', 'mcp', 'agent', 'channel', 'daemon'];
/** Live rows kept on screen above the loaded pages. */
const LIVE_KEEP = 500;

export function mount(root, { params }) {
  let tab = params.get('tab') === 'audit' ? 'audit' : 'invocations';
  const panel = h('div', { role: 'tabpanel' });
  let cleanup = () => {};
  const show = (id) => {
    tab = id;
    for (const b of bar.querySelectorAll('button')) { b.setAttribute('aria-selected', String(b.dataset.tab === id)); b.tabIndex = b.dataset.tab === id ? 0 : -1; }
    panel.setAttribute('aria-labelledby', `tab-${id}`);
    cleanup();
    replace(panel);
    cleanup = id === 'audit' ? audit(panel, params) : invocations(panel, params);
  };
  const bar = tabs([{ id: 'invocations', label: 'Invocations' }, { id: 'audit', label: 'Audit log' }], tab, (id) => { setQuery({ tab: id === 'audit' ? 'audit' : '' }); params = new URLSearchParams(); show(id); });
  root.append(pageHead('Activity', 'Tool calls through Coffer, and who changed what.'), bar, panel);
  show(tab);
  return () => cleanup();
}

// ---------------------------------------------------------------------------------------------
// Invocations.

function invocations(panel, params) {
  const server = h('select', { id: 'inv-server' }, h('option', { value: '' }, 'All servers'));
  const outcome = h('select', { id: 'inv-outcome' }, h('option', { value: '' }, 'Any outcome'), OUTCOMES.map((o) => h('option', { value: o }, o.replace('_', ' '))));
  const since = h('select', { id: 'inv-since' }, SINCE.map(([v, l]) => h('option', { value: v }, l)));
  outcome.value = OUTCOMES.includes(params.get('outcome')) ? params.get('outcome') : '';
  since.value = SINCE.some(([v]) => v === params.get('since')) ? params.get('since') : '';
  const live = h('span', { class: 'live-state', 'aria-live': 'polite' });
  const body = h('div', null, h('p', { class: 'muted loading' }, 'Loading…'));
  const more = h('div', { class: 'more' });
  panel.append(
    h('div', { class: 'row filters' },
      h('span', { class: 'filter' }, h('label', { for: 'inv-server' }, 'Server'), server),
      h('span', { class: 'filter' }, h('label', { for: 'inv-outcome' }, 'Outcome'), outcome),
      h('span', { class: 'filter' }, h('label', { for: 'inv-since' }, 'Time'), since),
      h('span', { class: 'spacer' }), live),
    body, more);

  const cols = [
    { label: 'When', cell: (i) => timeEl(i.at) },
    { label: 'Tool or resource', class: 'wrap', cell: (i) => h('code', null, i.target) },
    { label: 'Server', cell: (i) => i.server },
    { label: 'Method', cell: (i) => h('span', { class: 'muted' }, i.method) },
    { label: 'Outcome', cell: (i) => stateBadge(i.outcome, i.outcome.replace('_', ' ')) },
    { label: 'Duration', cell: (i) => `${i.duration_ms} ms` },
    { label: 'Caller', class: 'wrap', cell: callerCell },
    { label: 'LLM usage', class: 'wrap', cell: usageCell },
  ];
  let tbody = null;
  let seen = new Set();
  let arrived = [];
  let stream = null;
  const filters = () => ({ server: server.value, outcome: outcome.value, since: since.value });
  const matches = (i) => (!server.value || i.server === server.value) && (!outcome.value || i.outcome === outcome.value);

  const emptyNow = () => emptyState('No tool calls yet.',
    h('p', null, 'Calls your MCP clients, the chat agents or the CLI make through Coffer appear here as they happen.'));

  async function load(cursor) {
    const f = filters();
    setQuery({ server: f.server, outcome: f.outcome, since: f.since });
    let page;
    try {
      page = await vget(withQuery('/v1/invocations', { ...f, limit: PAGE, cursor }));
    } catch (e) {
      replace(body, errorBox(e, 'Could not load the invocations', () => load(cursor)));
      replace(more);
      return;
    }
    let items;
    if (!cursor) {
      // Calls that arrived live while the page loaded may not be in it yet (the log is
      // written in batches): keep them, newest first.
      const ids = new Set((page.items || []).map((i) => i.id));
      items = [...arrived.filter((i) => !ids.has(i.id)), ...(page.items || [])].sort((a, b) => b.id - a.id);
    } else {
      items = (page.items || []).filter((i) => !seen.has(i.id));
    }
    for (const i of items) seen.add(i.id);
    if (!cursor) {
      if (!items.length) { replace(body, emptyNow()); tbody = null; } else {
        const t = table(cols, items, { key: (i) => String(i.id), caption: 'Invocations', list: true });
        tbody = t.querySelector('tbody');
        replace(body, t);
      }
    } else if (tbody) {
      for (const i of items) tbody.appendChild(tableRow(cols, i, { key: (x) => String(x.id) }));
    }
    replace(more, page.next_cursor ? h('button', { type: 'button', on: { click: () => load(page.next_cursor) } }, 'Load older') : null);
  }

  const arrive = (i) => {
    if (!i || typeof i !== 'object' || seen.has(i.id) || !matches(i)) return;
    seen.add(i.id);
    arrived.unshift(i);
    if (arrived.length > LIVE_KEEP) arrived.pop();
    if (!tbody) {
      const t = table(cols, [], { key: (x) => String(x.id), caption: 'Invocations', list: true });
      tbody = t.querySelector('tbody');
      replace(body, t);
    }
    const tr = tableRow(cols, i, { key: (x) => String(x.id), rowClass: () => 'fresh' });
    tbody.prepend(tr);
    while (tbody.children.length > LIVE_KEEP + PAGE) tbody.lastElementChild.remove();
  };

  // One subscription for the page's life: the filters apply as rows arrive (matches()). A stream
  // that fell behind (`lagged`) or came back after a break may have missed calls: load afresh.
  let broken = false;
  const follow = () => {
    if (stream) return;
    stream = followEvents({ invocations: true }, { invocation: arrive, lagged: () => reload() }, {
      onState: (s) => {
        if (s === 'open' && broken) { broken = false; reload(); } // back after a break: what happened meanwhile
        if (s === 'retrying') broken = true;
        if (s === 'failed') { stream = null; broken = true; }
        replace(live, s === 'open' ? h('span', { class: 'badge ok' }, '● live')
          : s === 'retrying' ? h('span', { class: 'badge warn' }, 'reconnecting…')
            : h('span', { class: 'badge' }, 'not live: reload to see new calls'));
      },
    });
  };

  // The stream is followed first so that no call falls between the page and the stream.
  const reload = () => { seen = new Set(); arrived = []; tbody = null; follow(); load(); };
  for (const el of [server, outcome, since]) el.addEventListener('change', reload);
  (async () => {
    try {
      const names = ((await vget('/v1/mcp/servers')).items || []).map((s) => s.name);
      const want = params.get('server') || '';
      for (const n of ['coffer', ...names]) server.appendChild(h('option', { value: n }, n));
      if (want && [...server.options].some((o) => o.value === want)) server.value = want;
    } catch { /* filters still work without the list */ }
    reload();
  })();
  return () => { if (stream) stream.close(); stream = null; };
}

// ---------------------------------------------------------------------------------------------
// Audit log.

function audit(panel, params) {
  const actor = h('select', { id: 'audit-actor' }, h('option', { value: '' }, 'Anyone'), ACTORS.map((a) => h('option', { value: a }, a)));
  actor.value = ACTORS.includes(params.get('actor')) ? params.get('actor') : '';
  const action = h('input', { type: 'search', id: 'audit-action', placeholder: 'e.g. server.create', value: params.get('action') || '', autocomplete: 'off', spellcheck: 'false' });
  const body = h('div', null, h('p', { class: 'muted loading' }, 'Loading…'));
  const more = h('div', { class: 'more' });
  const form = h('form', { class: 'row filters' },
    h('span', { class: 'filter' }, h('label', { for: 'audit-actor' }, 'Actor'), actor),
    h('span', { class: 'filter' }, h('label', { for: 'audit-action' }, 'Action'), action),
    h('button', { type: 'submit' }, 'Filter'));
  panel.append(form, body, more);
  const cols = [
    { label: 'When', cell: (a) => timeEl(a.at) },
    { label: 'Actor', cell: (a) => a.actor },
    // How the request was authenticated, as the daemon found it (the actor is only a label).
    { label: 'Auth', cell: (a) => a.auth ? h('code', null, a.auth) : h('span', { class: 'muted' }, '—') },
    { label: 'Action', cell: (a) => h('code', null, a.action) },
    { label: 'Target', class: 'wrap', cell: (a) => a.target ? h('code', null, a.target) : h('span', { class: 'muted' }, '—') },
    { label: 'Outcome', cell: (a) => stateBadge(a.outcome === 'ok' ? 'ok' : 'error', a.outcome) },
    { label: 'Detail', class: 'wrap', cell: (a) => detailOf(a.detail) },
  ];
  let tbody = null;
  async function load(cursor) {
    setQuery({ tab: 'audit', actor: actor.value, action: action.value.trim() });
    let page;
    try {
      page = await vget(withQuery('/v1/audit', { actor: actor.value, action: action.value.trim(), limit: PAGE, cursor }));
    } catch (e) {
      replace(body, errorBox(e, 'Could not load the audit log', () => load(cursor)));
      replace(more);
      return;
    }
    const items = page.items || [];
    if (!cursor) {
      if (!items.length) {
        replace(body, emptyState(actor.value || action.value ? 'No entry matches.' : 'Nothing recorded yet.', 'Every change to servers, preferences, settings, credentials and knowledge bases is recorded here.'));
        tbody = null;
      } else {
        const t = table(cols, items, { key: (a) => String(a.id), caption: 'Audit log', list: true });
        tbody = t.querySelector('tbody');
        replace(body, t);
      }
    } else if (tbody) {
      for (const a of items) tbody.appendChild(tableRow(cols, a, { key: (x) => String(x.id) }));
    }
    replace(more, page.next_cursor ? h('button', { type: 'button', on: { click: () => load(page.next_cursor) } }, 'Load older') : null);
  }
  form.addEventListener('submit', (e) => { e.preventDefault(); load(); });
  actor.addEventListener('change', () => load());
  load();
  return () => {};
}

function detailOf(d) {
  if (!d || typeof d !== 'object' || !Object.keys(d).length) return h('span', { class: 'muted' }, '—');
  const text = JSON.stringify(d, null, 2);
  if (text.length < 80) return h('code', { class: 'small' }, JSON.stringify(d));
  return h('details', null, h('summary', null, 'details'), h('pre', { class: 'small' }, text));
}
