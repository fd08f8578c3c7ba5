// Chat page: the conversation list. It follows the list live first (the browser's one event
// stream, js/chat/events.js: `GET /v1/events` `list`), then lists (`GET /v1/conversations?archived=&q=`), so no
// change falls between the two; each `conversation` event updates, adds or drops an item as
// the filter says, `deleted` drops it, `reset` (or a reconnection) reloads the list.
import { get, withQuery } from '../api.js';
import { follow } from './events.js';
import { timeEl } from '../clock.js';
import { h, replace, toast } from '../dom.js';
import * as notify from './notify.js';

const PAGE = 50;

/**
 * Mounts the list into `root`. `hooks`: {onSelect(id), onNew(), onHelp(), onChange(conv), onRemoved(id)}.
 * Every conversation it loads or is told about also goes to js/chat/notify.js (the tab's badge
 * and browser notifications when a turn ends in the background; the bell turns those on).
 * Returns {close(), select(id), upsert(conv), remove(id), items()}.
 */
/** A bell (struck through when off), drawn as SVG: an emoji needs a font a system may lack. */
function bellIcon(on) {
  const ns = 'http://www.w3.org/2000/svg';
  const svg = document.createElementNS(ns, 'svg');
  for (const [k, v] of Object.entries({ viewBox: '0 0 24 24', width: '18', height: '18', fill: 'none', stroke: 'currentColor', 'stroke-width': '2', 'stroke-linecap': 'round', 'stroke-linejoin': 'round', 'aria-hidden': 'true' })) svg.setAttribute(k, v);
  const paths = ['M6 8a6 6 0 0 1 12 0c0 7 3 9 3 9H3s3-2 3-9', 'M10.3 21a1.94 1.94 0 0 0 3.4 0'];
  if (!on) paths.push('M3 3l18 18');
  for (const d of paths) {
    const p = document.createElementNS(ns, 'path');
    p.setAttribute('d', d);
    svg.appendChild(p);
  }
  return svg;
}

export function mountList(root, hooks) {
  let closed = false;
  let selected = null;
  let filter = 'active';
  let query = '';
  let cursor = null;
  let drawn = false;
  const convs = new Map(); // id → conversation, as the list shows them
  let searchTimer = 0;
  let loadSeq = 0;

  // Browser notifications, opt-in: the permission prompt comes from this click.
  const bell = h('button', {
    type: 'button', class: 'ghost bell', 'aria-label': 'Notify me when a turn ends while this tab is in the background',
    on: { click: async () => { const r = await notify.toggle(); drawBell(); toast(r.message); } },
  });
  function drawBell() {
    const on = notify.enabled();
    bell.setAttribute('aria-pressed', on ? 'true' : 'false');
    bell.title = on ? 'Notifications on (click to turn off)' : 'Notify me when a turn ends in the background';
    bell.replaceChildren(bellIcon(on));
  }
  drawBell();

  const search = h('input', { type: 'search', id: 'conv-search', placeholder: 'Search titles', 'aria-label': 'Search conversation titles', autocomplete: 'off' });
  const which = h('select', { id: 'conv-filter', 'aria-label': 'Which conversations' },
    h('option', { value: 'active' }, 'Active'), h('option', { value: 'archived' }, 'Archived'));
  const ul = h('ul', { class: 'conv-list', role: 'list' });
  const more = h('button', { type: 'button', class: 'ghost more', hidden: true, on: { click: () => load(true) } }, 'Load more');
  const status = h('p', { class: 'hint list-status', role: 'status' });
  const el = h('aside', { class: 'convs', 'aria-label': 'Conversations' },
    h('div', { class: 'convs-head' },
      h('h2', null, 'Conversations'), h('span', { class: 'spacer' }),
      bell,
      h('button', { type: 'button', class: 'ghost help', 'aria-label': 'Chat keys and help', title: 'Keys and help', on: { click: () => hooks.onHelp() } }, '?'),
      h('button', { type: 'button', class: 'primary new-conv', on: { click: () => hooks.onNew() } }, 'New')),
    h('div', { class: 'convs-filters' }, search, which), status, ul, more);
  replace(root, el);

  search.addEventListener('input', () => {
    clearTimeout(searchTimer);
    searchTimer = setTimeout(() => { query = search.value.trim(); load(false); }, 200);
  });
  which.addEventListener('change', () => { filter = which.value; load(false); });

  const matches = (c) => (filter === 'archived') === !!c.archived
    && (!query || (c.title || '').toLowerCase().includes(query.toLowerCase()));

  function itemEl(c) {
    const badges = [];
    if (c.approvals_waiting > 0) badges.push(h('span', { class: 'badge warn waiting-you', title: `${c.approvals_waiting} request${c.approvals_waiting === 1 ? '' : 's'} of the agent wait for your approval` }, c.approvals_waiting > 1 ? `waiting for you (${c.approvals_waiting})` : 'waiting for you'));
    if (c.turn_running) badges.push(h('span', { class: 'badge accent running', title: 'A turn is running' }, 'running'));
    if (c.pending_count) badges.push(h('span', { class: `badge ${c.pending_paused ? 'warn' : ''}`, title: c.pending_paused ? 'Pending messages, queue paused' : 'Pending messages' }, `${c.pending_count} pending${c.pending_paused ? ', paused' : ''}`));
    else if (c.pending_paused) badges.push(h('span', { class: 'badge warn' }, 'paused'));
    if (c.channel_name) badges.push(h('span', { class: 'badge channel', title: `Driven by the IM channel ${c.channel_name}` }, `⇄ ${c.channel_name}`));
    const btn = h('button', {
      type: 'button', class: 'conv-item', dataset: { id: c.id },
      'aria-current': c.id === selected ? 'true' : null,
      on: { click: () => hooks.onSelect(c.id) },
    },
    h('span', { class: 'conv-title', dir: 'auto' }, c.title || 'Untitled conversation'),
    h('span', { class: 'conv-meta' }, h('span', { class: 'hint' }, `${c.agent_key} · `, timeEl(c.last_message_ms || c.updated_ms || c.created_ms, { style: 'ago' })), ...badges));
    return h('li', { dataset: { id: c.id } }, btn);
  }

  const order = (a, b) => (b.updated_ms || 0) - (a.updated_ms || 0) || (a.id < b.id ? 1 : -1);

  function draw() {
    const items = [...convs.values()].sort(order);
    replace(ul, items.map(itemEl));
    status.textContent = items.length ? '' : query ? 'No conversation title matches.' : filter === 'archived' ? 'No archived conversations.' : 'No conversations yet.';
    if (!drawn) { drawn = true; performance.mark('coffer:conversations-drawn'); }
  }

  async function load(append) {
    const mine = ++loadSeq;
    try {
      const page = await get(withQuery('/v1/conversations', { archived: filter, q: query, limit: PAGE, cursor: append ? cursor : '' }));
      if (closed || mine !== loadSeq) return;
      if (!append) convs.clear();
      for (const c of page.items) { convs.set(c.id, c); notify.observe(c); }
      cursor = page.next_cursor;
      more.hidden = !cursor;
      draw();
    } catch (e) {
      if (closed || mine !== loadSeq) return;
      replace(status, `Cannot list conversations: ${e.message} `,
        h('button', { type: 'button', class: 'ghost retry', on: { click: () => load(append) } }, 'Retry'));
      if (!drawn) draw();
    }
  }

  function upsert(c) {
    if (matches(c)) convs.set(c.id, c);
    else convs.delete(c.id);
    draw();
  }

  function remove(id) {
    if (convs.delete(id)) draw();
  }

  // The browser's one event stream (js/chat/events.js), shared with every tab.
  const stream = follow({ list: true }, {
    conversation: (c) => { notify.observe(c); upsert(c); hooks.onChange(c); },
    deleted: (d) => { remove(d.id); hooks.onRemoved(d.id); },
    // The list is watched afresh before a reset arrives: reloading now misses nothing.
    reset: () => { if (!closed) load(false); },
  }, {
    onState: (s) => {
      if (closed) return;
      if (s === 'open') load(false);
      else if (s === 'failed') { load(false); status.textContent = 'Live list updates stopped (Coffer is not answering).'; toast('The conversation list is no longer live: reload the page.', 'error'); }
    },
  });

  return {
    close() { closed = true; stream.close(); clearTimeout(searchTimer); },
    select(id) {
      selected = id;
      for (const b of ul.querySelectorAll('button.conv-item')) {
        if (b.dataset.id === id) b.setAttribute('aria-current', 'true');
        else b.removeAttribute('aria-current');
      }
    },
    upsert,
    remove,
    get(id) { return convs.get(id); },
    models() { return [...convs.values()].map((c) => (c.agent_config || {}).model).filter(Boolean); },
  };
}
