// The servers page (/ui/servers): the MCP server registry with each upstream's state, add, edit,
// enable/disable, test and remove; one server's detail (/ui/servers?name=NAME): its
// configuration, its capabilities with per-tool/prompt toggles, and the tail of its stderr log
// (followed live on request).
import { withQuery } from '../api.js';
import { h, replace, toast } from '../dom.js';
import {
  vget, vpatch, vpost, vput, vdel, seg, errorBox, emptyState, pageHead, table, toggle, stateBadge, timeEl,
  confirmDialog, tabs, messageOf, followText, cli,
} from '../vault/common.js';
import { openServerForm } from '../vault/serverform.js';
import { openRegistryDialog } from '../vault/registrydialog.js';

/** Lines of the log kept on screen while following. */
const LOG_KEEP = 1000;

export function mount(root, { params, navigate }) {
  const name = params.get('name');
  const closers = [];
  if (name) detail(root, name, navigate, closers);
  else list(root, navigate);
  return () => { for (const c of closers) c(); };
}

// ---------------------------------------------------------------------------------------------
// The list.

function list(root, navigate) {
  const body = h('div', { class: 'stack' }, h('p', { class: 'muted loading' }, 'Loading…'));
  const result = h('div', { class: 'probe-slot', 'aria-live': 'polite' });
  const add = h('button', { type: 'button', class: 'primary', on: { click: async () => {
    const s = await openServerForm(null);
    if (s) {
      toast(`Added ${s.name}`);
      navigate(`/ui/servers?name=${encodeURIComponent(s.name)}`);
      announceListed(s);
    }
  } } }, 'Add server');
  const install = h('button', { type: 'button', on: { click: async () => {
    const r = await openRegistryDialog();
    if (r) {
      toast(`Installed ${r.server.name}${r.credentials_created.length ? `; stored ${r.credentials_created.join(', ')}` : ''}`);
      navigate(`/ui/servers?name=${encodeURIComponent(r.server.name)}`);
      announceListed(r.server);
    }
  } } }, 'Install from registry');
  const refresh = h('button', { type: 'button', on: { click: () => load() } }, 'Refresh');
  root.append(pageHead('MCP servers', 'The upstream servers Coffer aggregates for your MCP clients.', refresh, install, add), result, body);

  async function load() {
    let servers; let status = null;
    try {
      const [s, st] = await Promise.all([vget('/v1/mcp/servers'), vget('/v1/status').catch(() => null)]);
      servers = s.items || [];
      status = st;
    } catch (e) {
      replace(body, errorBox(e, 'Could not load the servers', load));
      return;
    }
    const ups = new Map(((status && status.upstreams) || []).map((u) => [u.name, u]));
    if (!servers.length) {
      replace(body, emptyState('No MCP servers yet.',
        'Add one with “Add server”: a command Coffer starts (stdio), or the URL of a remote server.',
        h('p', null, 'Or import the servers another client already has (Claude Desktop, Claude Code, Cursor, VS Code) in a terminal:',
          cli('coffer mcp import CONFIG_FILE')),
        h('p', { class: 'small' }, 'CONFIG_FILE is that client\'s MCP configuration, e.g. ', h('code', null, '~/.claude.json'), ' or ', h('code', null, '~/.cursor/mcp.json'), '.')));
      return;
    }
    const cols = [
      { label: 'Name', cell: (s) => h('a', { href: `/ui/servers?name=${encodeURIComponent(s.name)}`, 'data-nav': true, class: 'server-name' }, s.name) },
      { label: 'Runs', cell: (s) => h('code', { class: 'clip', title: target(s) }, target(s)) },
      { label: 'State', cell: (s) => stateCell(ups.get(s.name), s) },
      { label: 'Last error', class: 'wrap', cell: (s) => errorCell(ups.get(s.name)) },
      { label: 'Enabled', cell: (s) => enabledSwitch(s, () => load()) },
      { label: 'Actions', cell: (s) => h('div', { class: 'row nowrap' },
        h('button', { type: 'button', on: { click: () => probe(s.name, result) } }, 'Test'),
        h('button', { type: 'button', on: { click: async () => { if (await openServerForm(s)) { toast(`Saved ${s.name}`); load(); } } } }, 'Edit'),
        h('button', { type: 'button', class: 'danger', on: { click: () => remove(s.name, () => load()) } }, 'Remove')) },
    ];
    replace(body, table(cols, servers, { key: (s) => s.name, caption: 'MCP servers' }));
  }
  load();
}

/** What a server runs: its command line, or its URL. */
function target(s) {
  if (s.transport !== 'stdio') return s.url || '';
  return [s.command || '', ...(s.args || [])].join(' ');
}

function stateCell(u, s) {
  if (!u) return stateBadge(s.enabled ? 'idle' : 'disabled');
  const running = u.running ? h('span', { class: 'muted small' }, ` ${u.running} session${u.running === 1 ? '' : 's'}`) : null;
  return h('span', { class: 'state-cell' }, stateBadge(u.state, label(u.state)), running);
}

const label = (state) => ({ ok: 'healthy', idle: 'idle', unhealthy: 'unhealthy', disabled: 'disabled' }[state] || state);

function errorCell(u) {
  if (!u || !u.last_error) return h('span', { class: 'muted' }, '—');
  return h('span', { class: 'last-error' }, u.last_error, u.last_error_at ? h('span', { class: 'muted small' }, ' · ', timeEl(u.last_error_at)) : null);
}

function enabledSwitch(s, after) {
  return toggle(`${s.enabled ? 'Disable' : 'Enable'} ${s.name}`, s.enabled, async (on, input) => {
    try {
      await vpatch(`/v1/mcp/servers/${seg(s.name)}`, { enabled: on });
      toast(`${s.name} ${on ? 'enabled' : 'disabled'}`);
      after();
    } catch (e) {
      input.checked = !on;
      toast(messageOf(e), 'error');
    }
  });
}

async function remove(name, after) {
  if (!await confirmDialog(`Remove ${name}?`, `Coffer forgets the server ${name} and its tool preferences. MCP clients no longer see its tools. Its credentials stay in the credential store.`)) return;
  try {
    await vdel(`/v1/mcp/servers/${seg(name)}`);
    toast(`Removed ${name}`);
    after();
  } catch (e) {
    toast(messageOf(e), 'error');
  }
}

/** Runs POST …/test and shows its report in `slot`; then calls `after` (if any). */
async function probe(name, slot, after) {
  replace(slot, h('div', { class: 'card probe' }, h('p', { class: 'muted' }, `Testing ${name}…`)));
  let r;
  try {
    r = await vpost(`/v1/mcp/servers/${seg(name)}/test`, {});
  } catch (e) {
    replace(slot, errorBox(e, `Testing ${name} failed`));
    return;
  }
  const counts = r.counts || {};
  const info = r.server_info || {};
  const facts = [
    ['Result', r.ok ? stateBadge('ok', 'ok') : stateBadge('failed', 'failed')],
    r.protocol_version ? ['Protocol', r.protocol_version] : null,
    info.name ? ['Server', `${info.name}${info.version ? ` ${info.version}` : ''}`] : null,
    ['Tools', String(counts.tools ?? 0)], ['Prompts', String(counts.prompts ?? 0)], ['Resources', String(counts.resources ?? 0)],
    r.initialize_ms !== undefined ? ['Initialize', `${r.initialize_ms} ms`] : null,
    ['Total', `${r.elapsed_ms} ms`],
  ].filter(Boolean);
  replace(slot, h('div', { class: `card probe ${r.ok ? 'ok' : 'failed'}`, dataset: { server: name, ok: String(r.ok) } },
    h('div', { class: 'row' }, h('h2', null, `Test of ${name}`), h('span', { class: 'spacer' }),
      h('button', { type: 'button', class: 'ghost', 'aria-label': 'Close the test report', on: { click: () => replace(slot) } }, '✕')),
    r.error ? h('p', { class: 'last-error probe-error' }, r.error) : null,
    h('div', { class: 'stats' }, facts.map(([k, v]) => h('div', { class: 'stat' }, h('div', { class: 'muted small' }, k), h('div', { class: 'stat-value' }, v)))),
    (r.warnings || []).length ? h('ul', { class: 'warnings' }, r.warnings.map((w) => h('li', null, w))) : null,
    r.log ? h('details', null, h('summary', null, 'Its stderr'), h('pre', { class: 'log' }, r.log)) : null));
  if (after) after();
}

// ---------------------------------------------------------------------------------------------
// One server.

function detail(root, name, navigate, closers) {
  const back = h('a', { href: '/ui/servers', 'data-nav': true, class: 'back' }, '← All servers');
  const head = h('div');
  const result = h('div', { class: 'probe-slot', 'aria-live': 'polite' });
  const config = h('section', { class: 'card', 'aria-label': 'Configuration' });
  const caps = h('section', { class: 'card caps', 'aria-label': 'Capabilities' });
  const log = h('section', { class: 'card log-card', 'aria-label': 'Log' });
  root.append(back, head, result, h('div', { class: 'detail-grid' }, config, caps), log);

  async function load() {
    let s; let u = null;
    try {
      const [srv, st] = await Promise.all([vget(`/v1/mcp/servers/${seg(name)}`), vget('/v1/status').catch(() => null)]);
      s = srv;
      u = ((st && st.upstreams) || []).find((x) => x.name === name) || null;
    } catch (e) {
      replace(head, errorBox(e, `Could not load ${name}`));
      config.remove(); caps.remove(); log.remove();
      return;
    }
    replace(head, pageHead(s.name, null,
      h('span', { class: 'row' }, enabledSwitch(s, () => load()), h('span', { class: 'muted small' }, s.enabled ? 'enabled' : 'disabled')),
      // A test starts the server, which writes to its log: the tail shows it afterwards.
      h('button', { type: 'button', on: { click: () => probe(s.name, result, () => logView.refresh()) } }, 'Test'),
      h('button', { type: 'button', on: { click: async () => {
        const saved = await openServerForm(s);
        if (saved) { toast(`Saved ${s.name}`); load(); announceListed(saved); }
      } } }, 'Edit'),
      h('button', { type: 'button', class: 'danger', on: { click: () => remove(s.name, () => navigate('/ui/servers')) } }, 'Remove')));
    drawConfig(config, s, u);
    loadCaps(caps, s);
  }
  const logView = drawLog(log, name, closers);
  load();
}

/** Waits (at most a minute) until the gateway's capability catalog has listed a server just
 * added or changed — MCP clients are offered its tools from then on — and says what it offers,
 * or why it could not be started. */
async function announceListed(s) {
  if (!s || s.enabled === false) return;
  toast(`Starting ${s.name} and listing its capabilities…`);
  let c;
  try {
    c = await vget(`/v1/mcp/servers/${seg(s.name)}/catalog?wait_ms=60000`);
  } catch (e) {
    toast(`Could not check ${s.name}'s capabilities: ${messageOf(e)}`, 'error');
    return;
  }
  if (c.state === 'failed') {
    toast(`${s.name} could not be started: ${c.error || 'no reason given'} — see its log below, or Test.`, 'error');
  } else if (c.state === 'ready') {
    const n = (k, one, many) => (c[k] === null || c[k] === undefined ? null : `${c[k]} ${c[k] === 1 ? one : many}`);
    const parts = [n('tools', 'tool', 'tools'), n('prompts', 'prompt', 'prompts'), n('resources', 'resource', 'resources')].filter(Boolean);
    toast(`${s.name} offers ${parts.join(', ')}: MCP clients see them now.`);
  } else {
    toast(`${s.name} is still starting; MCP clients are told when its capabilities arrive.`);
  }
}

function drawConfig(el, s, u) {
  const kv = (map) => {
    const e = Object.entries(map || {});
    if (!e.length) return h('span', { class: 'muted' }, 'none');
    return h('ul', { class: 'plain' }, e.map(([k, v]) => h('li', null, h('code', null, k), ' = ',
      v && typeof v === 'object' ? h('span', { class: 'badge accent', title: 'resolved from the credential store when the server starts' }, `credential ${v.credential_ref}`) : h('code', null, v))));
  };
  const rows = [
    ['State', stateCell(u, s)],
    u && u.last_error ? ['Last error', errorCell(u)] : null,
    s.transport !== 'stdio' ? ['Sign-in', signInCell(s, u && u.auth)] : null,
    u && u.last_start_at ? ['Last start', h('span', null, u.last_start || '', ' · ', timeEl(u.last_start_at))] : null,
    ['Transport', s.transport],
    s.transport !== 'stdio' ? ['URL', h('code', { class: 'wrap' }, s.url || '')] : ['Command', h('code', { class: 'wrap' }, s.command || '')],
    s.transport !== 'stdio' ? null : ['Arguments', (s.args || []).length ? h('ol', { class: 'plain args' }, s.args.map((a) => h('li', null, h('code', null, a)))) : h('span', { class: 'muted' }, 'none')],
    s.transport !== 'stdio' ? ['Headers', kv(s.headers)] : ['Environment', kv(s.env)],
    s.transport !== 'stdio' ? null : ['Working directory', s.cwd ? h('code', null, s.cwd) : h('span', { class: 'muted' }, 'default')],
    ['Call timeout', s.timeout_ms ? `${s.timeout_ms / 1000} s` : h('span', { class: 'muted' }, 'default')],
    ['Version', String(s.version)],
    ['Updated', timeEl(s.updated_at)],
  ].filter(Boolean);
  replace(el, h('h2', null, 'Configuration'), h('dl', { class: 'facts' }, rows.map(([k, v]) => [h('dt', null, k), h('dd', null, v)])));
}

/** An HTTP server's OAuth sign-in (`UpstreamStatus.auth`): its state and a button that starts
 * a browser sign-in (`POST /v1/mcp/servers/{name}/auth`), opens the authorization URL in a new
 * tab and waits for the daemon's loopback listener to get the redirect. The redirect goes to
 * 127.0.0.1, so the sign-in works from a browser on the daemon's machine. */
function signInCell(s, auth) {
  const state = auth ? auth.state : 'none';
  const out = h('span', { class: 'row' });
  const label = {
    none: h('span', { class: 'muted' }, 'not signed in'),
    signed_in: h('span', null, 'signed in', auth && auth.issuer ? h('span', { class: 'muted small' }, ' · ', auth.issuer) : null),
    needs_sign_in: h('span', { class: 'last-error' }, `needs sign-in${auth && auth.why ? ` (${auth.why})` : ''}`),
  }[state] || h('span', null, state);
  const start = h('button', { type: 'button', class: state === 'needs_sign_in' ? 'primary' : '', on: { click: async () => {
    start.disabled = true;
    // Opened now, in the click, so that a popup blocker lets it through; pointed at the URL
    // once the daemon has it.
    const tab = window.open('', '_blank');
    try {
      const r = await vpost(`/v1/mcp/servers/${seg(s.name)}/auth`, {});
      const url = r.flow && r.flow.authorization_url;
      if (!url) throw new Error('the daemon started no sign-in');
      if (tab) { tab.opener = null; tab.location.href = url; } else { window.open(url, '_blank', 'noopener'); }
      toast(`Sign in to ${s.name} in the new tab…`);
      for (;;) {
        const st = await vget(`/v1/mcp/servers/${seg(s.name)}/auth?wait_s=30`);
        const f = st.flow && st.flow.state;
        if (f === 'pending') continue;
        if (f === 'signed_in') toast(`Signed in to ${s.name}.`);
        else toast(`Sign-in to ${s.name} failed: ${(st.flow && st.flow.error) || 'no reason given'}`, 'error');
        break;
      }
    } catch (e) {
      if (tab) tab.close();
      toast(`Sign-in to ${s.name} failed: ${messageOf(e)}`, 'error');
    } finally {
      start.disabled = false;
    }
  } } }, state === 'signed_in' ? 'Sign in again' : 'Sign in');
  out.append(label, start);
  if (state === 'signed_in') {
    out.append(h('button', { type: 'button', on: { click: async () => {
      try { await vdel(`/v1/mcp/servers/${seg(s.name)}/auth`); toast(`Signed out of ${s.name}.`); } catch (e) { toast(messageOf(e), 'error'); }
    } } }, 'Sign out'));
  }
  if (state === 'needs_sign_in') out.append(cli(`coffer mcp auth ${s.name}`));
  return out;
}

async function loadCaps(el, s) {
  replace(el, h('h2', null, 'Capabilities'), h('p', { class: 'muted loading' }, s.enabled ? 'Asking the server…' : ''));
  if (!s.enabled) {
    replace(el, h('h2', null, 'Capabilities'), emptyState('The server is disabled.', 'Enable it to see and toggle its tools and prompts.'));
    return;
  }
  let c;
  try {
    c = await vget(`/v1/mcp/servers/${seg(s.name)}/capabilities`);
  } catch (e) {
    replace(el, h('h2', null, 'Capabilities'), errorBox(e, 'Could not list its capabilities'));
    return;
  }
  const kinds = [
    { id: 'tool', key: 'tools', label: `Tools (${(c.tools || []).length})` },
    { id: 'prompt', key: 'prompts', label: `Prompts (${(c.prompts || []).length})` },
  ];
  let current = 'tool';
  const panel = h('div', { role: 'tabpanel' });
  const draw = () => {
    const k = kinds.find((x) => x.id === current);
    const items = c[k.key] || [];
    panel.setAttribute('aria-labelledby', `tab-${k.id}`);
    if (!items.length) { replace(panel, emptyState(`No ${k.key}.`)); return; }
    replace(panel, capTable(k, items, s));
  };
  const bar = tabs(kinds, current, (id) => { current = id; for (const b of bar.querySelectorAll('button')) { b.setAttribute('aria-selected', String(b.dataset.tab === id)); b.tabIndex = b.dataset.tab === id ? 0 : -1; } draw(); });
  replace(el, h('h2', null, 'Capabilities'), bar, panel);
  draw();
}

/**
 * One server's tools or prompts as a table that fits its card: a fixed layout whose Tool column
 * holds the name with the exposed name under it, a Description column that wraps (clamped to
 * three lines, "More" opens it) and a narrow Enabled column, so the toggles always show. Below
 * 600 px each row is a list row: name and toggle on one line, the description under them.
 */
function capTable(k, items, s) {
  const row = (i) => h('tr', { dataset: { key: i.name } },
    h('td', { class: 'cap-tool', 'data-label': 'Tool' },
      h('code', { class: 'cap-name' }, breakable(i.name)),
      i.exposed_name !== i.name ? h('div', { class: 'cap-exposed muted small' }, 'as ', h('code', null, breakable(i.exposed_name))) : null),
    h('td', { class: 'cap-desc', 'data-label': 'Description' }, description(i.description)),
    h('td', { class: 'cap-on', 'data-label': 'Enabled' }, toggle(`${k.id} ${i.name}`, i.enabled, async (on, input) => {
      try {
        await vput(withQuery(`/v1/mcp/servers/${seg(s.name)}/capabilities/${k.id}`, { name: i.name }), { enabled: on });
        i.enabled = on;
        toast(`${i.name} ${on ? 'enabled' : 'disabled'}`);
      } catch (e) {
        input.checked = !on;
        toast(messageOf(e), 'error');
      }
    })));
  return h('div', { class: 'table-wrap' },
    h('table', { class: 'vtable cap-table' },
      h('caption', { class: 'sr-only' }, k.label),
      h('colgroup', null, h('col', { class: 'cap-tool-col' }), h('col'), h('col', { class: 'cap-on-col' })),
      h('thead', null, h('tr', null, h('th', { scope: 'col' }, k.id === 'tool' ? 'Tool' : 'Prompt'), h('th', { scope: 'col' }, 'Description'), h('th', { scope: 'col', class: 'cap-on' }, 'Enabled'))),
      h('tbody', null, items.map(row))));
}

/** `name` with a line-break opportunity after each `_`, `.`, `/` and `-` (long tool names wrap
 * between their words rather than mid-word). */
export function breakable(name) {
  const out = [];
  for (const part of String(name).split(/(?<=[_./-])/)) { if (out.length) out.push(h('wbr')); out.push(part); }
  return out;
}

/**
 * A description that wraps and is clamped to three lines; when it is longer a "More" button
 * opens it (and "Less" closes it). The button is added once the text has been laid out and
 * overflows. Text nodes only: the upstream chose the words.
 */
export function description(text) {
  if (!text) return h('span', { class: 'muted' }, '—');
  const body = h('span', { class: 'desc clamp' }, text);
  const more = h('button', { type: 'button', class: 'link more-toggle', hidden: true, 'aria-expanded': 'false' }, 'More');
  more.addEventListener('click', () => {
    const open = body.classList.toggle('open');
    more.textContent = open ? 'Less' : 'More';
    more.setAttribute('aria-expanded', String(open));
  });
  const wrap = h('div', { class: 'desc-wrap' }, body, more);
  // Measured after layout (and again when the width changes): only a clamped text gets the button.
  const check = () => { if (!body.classList.contains('open')) more.hidden = body.scrollHeight <= body.clientHeight + 1; };
  if (typeof ResizeObserver === 'function') new ResizeObserver(check).observe(body);
  else requestAnimationFrame(check);
  return wrap;
}

function drawLog(el, name, closers) {
  const pre = h('pre', { class: 'log', tabindex: '0', 'aria-label': `stderr of ${name}` });
  const file = h('span', { class: 'muted small' });
  const state = h('span', { class: 'muted small', 'aria-live': 'polite' });
  let stream = null;
  const stop = () => { if (stream) { stream.close(); stream = null; } };
  closers.push(stop);
  const follow = h('input', { type: 'checkbox', id: 'log-follow' });
  const append = (line) => {
    const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    pre.appendChild(document.createTextNode(`${line}\n`));
    while (pre.childNodes.length > LOG_KEEP) pre.firstChild.remove();
    if (atEnd) pre.scrollTop = pre.scrollHeight;
  };
  const tail = async () => {
    try {
      const r = await vget(withQuery(`/v1/mcp/servers/${seg(name)}/log`, { n: 200 }));
      replace(file, r.file || '');
      replace(pre);
      for (const l of r.lines || []) append(l);
      if (!(r.lines || []).length) replace(state, 'Nothing logged yet: the server writes here when it starts.');
      else replace(state);
      pre.scrollTop = pre.scrollHeight;
    } catch (e) {
      replace(state, errorBox(e, 'The log is not available'));
    }
  };
  follow.addEventListener('change', () => {
    stop();
    if (!follow.checked) { replace(state); return; }
    replace(pre);
    stream = followText(withQuery(`/v1/mcp/servers/${seg(name)}/log`, { n: 200, follow: 'true' }), {
      line: (l) => append(l),
      file: (f) => replace(file, f),
    }, { onState: (s) => {
      // Every (re)connection starts with the tail again: start the view afresh.
      if (s === 'open') replace(pre);
      replace(state, s === 'open' ? 'following' : s === 'retrying' ? 'reconnecting…' : 'stopped following (the connection failed)');
    } });
  });
  replace(el,
    h('div', { class: 'row' }, h('h2', null, 'Log'), file, h('span', { class: 'spacer' }),
      h('span', { class: 'row check' }, follow, h('label', { for: 'log-follow' }, 'Follow')),
      h('button', { type: 'button', on: { click: () => { follow.checked = false; stop(); tail(); } } }, 'Reload')),
    state, pre);
  tail();
  // Reloads the tail unless the log is followed (then new lines arrive by themselves).
  return { refresh: () => { if (!follow.checked) tail(); } };
}
