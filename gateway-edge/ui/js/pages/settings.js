// The settings page (/ui/settings): the settings table (GET /v1/settings/table, values from
// GET /v1/settings, saved with PATCH /v1/settings; the daemon's refusal is shown next to the
// field and nothing changes), shown in the table's sections (Chat and agents, MCP gateway,
// Knowledge, Channels, Sync, Advanced) with each setting's human label, its help line (code
// spans as code, never raw backticks) and its key small for power users; on/off settings,
// permission modes and the LLM connection an agent runs on are pickers, not typed text.
// Then credentials (names only; set and delete — a value is typed into a
// password input, sent once and never shown), the connected MCP clients with their profiles, the
// services and upstreams (GET /v1/status; restart a service), a backup of the home (POST /v1/backup), the LLM connections (js/vault/llm.js) and the channels
// (js/vault/channels.js), the profiles (js/vault/profiles.js), and sync across machines (GET /v1/sync/status, POST /v1/sync).
import { h, replace, toast } from '../dom.js';
import {
  vget, vpatch, vpost, vput, vdel, seg, errorBox, emptyState, pageHead, table, stateBadge, timeEl, tabs, setQuery,
  field, formDialog, confirmDialog, messageOf, duration, bytes, showFieldError, cli,
} from '../vault/common.js';
import { llm } from '../vault/llm.js';
import { channels } from '../vault/channels.js';
import { profiles } from '../vault/profiles.js';
import { MODES } from '../chat/approvals.js';

const TABS = [
  { id: 'settings', label: 'Settings' },
  { id: 'credentials', label: 'Credentials' },
  { id: 'llm', label: 'LLM connections' },
  { id: 'channels', label: 'Channels' },
  { id: 'profiles', label: 'Profiles' },
  { id: 'status', label: 'Status' },
  { id: 'sync', label: 'Sync' },
  { id: 'backup', label: 'Backup' },
];
/** Where each section points for what is set up outside the table: [tab, link text]. */
const ELSEWHERE = {
  chat: ['llm', 'LLM connections'],
  channels: ['channels', 'Channels'],
  sync: ['sync', 'Sync status'],
};

export function mount(root, { params }) {
  let tab = TABS.some((t) => t.id === params.get('tab')) ? params.get('tab') : 'settings';
  const panel = h('div', { role: 'tabpanel' });
  const show = (id) => {
    tab = id;
    for (const b of bar.querySelectorAll('button')) { b.setAttribute('aria-selected', String(b.dataset.tab === id)); b.tabIndex = b.dataset.tab === id ? 0 : -1; }
    panel.setAttribute('aria-labelledby', `tab-${id}`);
    replace(panel);
    ({ settings: (p) => settings(p, go), credentials, llm, channels, profiles, status, sync, backup })[id](panel);
  };
  const go = (id) => { setQuery({ tab: id === 'settings' ? '' : id }); show(id); };
  const bar = tabs(TABS, tab, go);
  root.append(pageHead('Settings', 'How the daemon behaves, its secrets, its services and backups.'), bar, panel);
  show(tab);
  return () => {};
}

// ---------------------------------------------------------------------------------------------
// The settings table.

/**
 * `text` with its `code` spans (in backticks) as code elements: no raw backtick is shown.
 * `sentence`: its first letter upper-case (the table's lines start lower-case).
 */
export function withCode(text, { sentence = false } = {}) {
  let t = String(text || '');
  if (sentence && /^[a-z]/.test(t)) t = t[0].toUpperCase() + t.slice(1);
  return t.split('`').map((part, i) => (i % 2 ? h('code', null, part) : part)).filter((x) => x !== '');
}

async function settings(panel, go) {
  const body = h('div', null, h('p', { class: 'muted loading' }, 'Loading…'));
  panel.append(body);
  let rows; let values; let connections;
  try {
    const [t, v, c] = await Promise.all([
      vget('/v1/settings/table'), vget('/v1/settings'),
      vget('/v1/llm/connections').catch(() => ({ items: [] })),
    ]);
    rows = t.items || [];
    values = v.values || {};
    connections = (c.items || []).map((x) => x.name);
  } catch (e) {
    replace(body, errorBox(e, 'Could not load the settings', () => { body.remove(); settings(panel, go); }));
    return;
  }
  const known = new Set(rows.map((r) => r.key));
  // The table lists each section's rows together, in display order.
  const groups = new Map();
  for (const r of rows) {
    if (!groups.has(r.group)) groups.set(r.group, { title: r.group_title, help: r.group_help, rows: [] });
    groups.get(r.group).rows.push(r);
  }
  const jump = h('nav', { class: 'settings-jump', 'aria-label': 'Sections' },
    [...groups.entries()].map(([g, x]) => h('button', {
      type: 'button', class: 'ghost', dataset: { group: g },
      on: { click: () => document.getElementById(`group-${g}`)?.scrollIntoView({ block: 'start', behavior: 'smooth' }) },
    }, x.title)));
  const sections = [jump, ...[...groups.entries()].map(([g, x]) => {
    const elsewhere = ELSEWHERE[g];
    return h('section', { class: 'card settings-group', id: `group-${g}`, dataset: { group: g }, 'aria-labelledby': `group-${g}-title` },
      h('header', { class: 'settings-group-head' },
        h('h2', { id: `group-${g}-title` }, x.title),
        h('p', { class: 'muted settings-group-help' }, x.help,
          elsewhere ? h('span', null, ' ', h('button', { type: 'button', class: 'link', on: { click: () => go(elsewhere[0]) } }, `${elsewhere[1]} →`)) : null)),
      h('div', { class: 'setting-rows' }, x.rows.map((r) => settingRow(r, values, connections))));
  })];
  const others = Object.keys(values).filter((k) => !known.has(k)).sort();
  if (others.length) {
    sections.push(h('section', { class: 'card settings-group', dataset: { group: 'other' } },
      h('h2', null, 'Other keys'),
      h('p', { class: 'muted small' }, 'Stored with --force; Coffer does not read them.'),
      table([
        { label: 'Key', cell: (k) => h('code', null, k) },
        { label: 'Value', class: 'wrap', cell: (k) => h('code', null, values[k]) },
        { label: '', cell: (k) => h('button', { type: 'button', class: 'danger', on: { click: async (e) => {
          try { await vpatch('/v1/settings', { remove: [k] }); e.target.closest('tr').remove(); toast(`Removed ${k}`); } catch (err) { toast(messageOf(err), 'error'); }
        } } }, 'Remove') },
      ], others, { key: (k) => k })));
  }
  replace(body, sections);
}

/**
 * The picker of a setting whose values are a few words, or null for a typed one: on/off (an
 * integer 0-1), a permission mode, the LLM connection an agent runs on. `[value, text, hint?]`;
 * '' is the default.
 */
function choicesFor(r, connections, current) {
  if (r.type === 'integer' && r.min === 0 && r.max === 1) return [['1', 'On'], ['0', 'Off']];
  if (r.key.endsWith('_permission_mode')) return MODES.map((m) => [m.value, m.label, m.hint]);
  if (/^chat\.[a-z_]+_connection$/.test(r.key)) {
    const names = [...new Set([...connections, ...(current ? [current] : [])])];
    return [['', 'Its own login (no connection)'], ...names.map((n) => [n, connections.includes(n) ? n : `${n} (missing)`])];
  }
  return null;
}

function settingRow(r, values, connections) {
  const set = Object.hasOwn(values, r.key);
  let current = set ? values[r.key] : null;
  const id = `set-${r.key.replace(/[^A-Za-z0-9_-]/g, '-')}`;
  const picks = choicesFor(r, connections, current);
  const shown = () => current ?? r.default;
  const input = picks
    ? h('select', { id, 'aria-describedby': `${id}-desc ${id}-err` }, picks.map(([v, t, hint]) => h('option', { value: v, selected: v === shown(), title: hint }, t)))
    : h('input', {
      type: 'text', id, value: set ? values[r.key] : '', placeholder: r.default === '' ? '(empty)' : r.default,
      inputmode: r.type === 'integer' ? 'numeric' : undefined, autocomplete: 'off', spellcheck: 'false',
      'aria-describedby': `${id}-desc ${id}-err`,
    });
  const error = h('div', { class: 'field-error', id: `${id}-err`, 'aria-live': 'polite' });
  const badge = h('span', { class: 'setting-badge' });
  // A picker saves when it changes; a typed value with Save (or Enter).
  const save = h('button', { type: 'submit', hidden: !!picks }, 'Save');
  const reset = h('button', { type: 'button', class: 'ghost' }, 'Use default');
  const mark = () => {
    replace(badge, current === null ? h('span', { class: 'badge' }, 'default') : h('span', { class: 'badge accent' }, 'set'));
    reset.hidden = current === null;
  };
  mark();
  const bounds = r.type === 'integer' ? `${r.min}–${r.max}` : `text, up to ${r.max} bytes`;
  // A picker's default by its option's name (before any ': hint').
  const pickedDefault = picks && (picks.find(([v]) => v === r.default) || [])[1];
  const facts = picks
    ? `default: ${pickedDefault || r.default || 'none'}`
    : [r.unit, bounds, `default ${r.default === '' ? 'empty' : r.default}`].filter(Boolean).join(' · ');
  const form = h('form', { class: 'setting', dataset: { field: r.key, key: r.key } },
    h('div', { class: 'setting-label' },
      h('div', { class: 'setting-name' }, h('label', { for: id }, r.label), ' ', badge),
      h('div', { class: 'setting-help', id: `${id}-desc` }, withCode(r.description, { sentence: true })),
      h('div', { class: 'setting-facts muted small' }, h('code', { class: 'setting-key', title: 'The key, for coffer settings set' }, r.key), ' · ', withCode(facts))),
    h('div', { class: 'setting-input' }, h('div', { class: 'row nowrap' }, input, save, reset), error));
  const patch = async (body) => {
    replace(error);
    input.removeAttribute('aria-invalid');
    save.disabled = true; reset.disabled = true;
    try {
      const v = await vpatch('/v1/settings', body);
      current = Object.hasOwn(v.values || {}, r.key) ? v.values[r.key] : null;
      input.value = picks ? shown() : current ?? '';
      mark();
      toast(`${r.label}: ${current === null ? 'back to its default' : 'saved'}`);
    } catch (e) {
      // The daemon's message (it names the key, the value and the accepted range), here.
      showFieldError(form, e, error);
      if (picks) input.value = shown();
    } finally {
      save.disabled = false; reset.disabled = false;
    }
  };
  form.addEventListener('submit', (e) => {
    e.preventDefault();
    const v = input.value.trim();
    if (v === '' && (r.type === 'integer' || picks)) { patch({ remove: [r.key] }); return; }
    patch({ set: { [r.key]: input.value } });
  });
  if (picks) input.addEventListener('change', () => form.requestSubmit());
  reset.addEventListener('click', () => patch({ remove: [r.key] }));
  return form;
}

// ---------------------------------------------------------------------------------------------
// Credentials.

async function credentials(panel) {
  const add = h('button', { type: 'button', class: 'primary', on: { click: () => setDialog(null) } }, 'Add credential');
  const body = h('div', null, h('p', { class: 'muted loading' }, 'Loading…'));
  panel.append(h('div', { class: 'row' }, h('p', { class: 'muted' }, 'Secrets for MCP servers and the embeddings endpoint, encrypted with secret.key. Values are write-only: nothing shows them again.'), h('span', { class: 'spacer' }), add), body);
  async function load() {
    let items;
    try {
      items = (await vget('/v1/credentials')).items || [];
    } catch (e) {
      replace(body, errorBox(e, 'Could not list the credentials', load));
      return;
    }
    if (!items.length) {
      replace(body, emptyState('No credentials yet.', 'Add one here, or mark a server\'s variable or header as a secret when you add the server.'));
      return;
    }
    replace(body, table([
      { label: 'Name', cell: (c) => h('code', null, c.name) },
      { label: 'Version', cell: (c) => String(c.version) },
      { label: 'Updated', cell: (c) => timeEl(c.updated_at) },
      { label: 'Actions', cell: (c) => h('div', { class: 'row nowrap' },
        h('button', { type: 'button', on: { click: () => setDialog(c.name) } }, 'Replace value'),
        h('button', { type: 'button', class: 'danger', on: { click: () => remove(c.name) } }, 'Delete')) },
    ], items, { key: (c) => c.name, caption: 'Credentials' }));
  }
  async function setDialog(name) {
    const n = field('Name', h('input', { type: 'text', value: name || '', disabled: !!name, autocomplete: 'off', spellcheck: 'false' }), { name: 'name', hint: 'letters, digits, _ . -; up to 64' });
    const v = field('Value', h('input', { type: 'password', autocomplete: 'new-password' }), { name: 'value', hint: 'stored encrypted; never shown again' });
    const done = await formDialog(name ? `Replace ${name}` : 'Add a credential', h('div', null, n.wrap, v.wrap), async () => {
      const credName = name || n.input.value.trim();
      if (!credName) throw Object.assign(new Error('give the credential a name'), { details: { field: 'name' } });
      if (!v.input.value) throw Object.assign(new Error('type the value'), { details: { field: 'value' } });
      try {
        return await vput(`/v1/credentials/${seg(credName)}`, { value: v.input.value });
      } finally {
        // The value leaves the page as soon as it is sent, whatever the answer.
        v.input.value = '';
      }
    }, { submit: name ? 'Replace' : 'Add' });
    if (done) { toast(`${done.name} stored (version ${done.version})`); load(); }
  }
  async function remove(name) {
    if (!await confirmDialog(`Delete ${name}?`, `Servers that use ${name} fail to start, naming it, until it is set again.`, { confirm: 'Delete' })) return;
    try {
      await vdel(`/v1/credentials/${seg(name)}`);
      toast(`Deleted ${name}`);
      load();
    } catch (e) {
      toast(messageOf(e), 'error');
    }
  }
  load();
}

// ---------------------------------------------------------------------------------------------
// Status.

async function status(panel) {
  const body = h('div', null, h('p', { class: 'muted loading' }, 'Loading…'));
  const refresh = h('button', { type: 'button', on: { click: () => load() } }, 'Refresh');
  panel.append(h('div', { class: 'row' }, h('span', { class: 'spacer' }), refresh), body);
  async function load() {
    let s;
    try {
      s = await vget('/v1/status');
    } catch (e) {
      replace(body, errorBox(e, 'Could not read the status', load));
      return;
    }
    const d = s.daemon || {};
    const ups = s.upstreams || [];
    replace(body, h('div', { class: 'stack' },
      h('section', { class: 'card' }, h('h2', null, 'Daemon'),
        h('dl', { class: 'facts' },
          h('dt', null, 'Version'), h('dd', null, d.version || ''),
          h('dt', null, 'Process'), h('dd', null, String(d.pid ?? '')),
          h('dt', null, 'Port'), h('dd', null, String(d.port ?? '')),
          h('dt', null, 'Started'), h('dd', null, timeEl(d.started_at)))),
      clientsCard(s.sessions || []),
      h('section', { class: 'card' }, h('h2', null, 'Services'),
        table([
          { label: 'Service', cell: (x) => h('strong', null, x.name) },
          { label: 'State', cell: (x) => stateBadge(x.state) },
          { label: 'Process', cell: (x) => (x.pid ? String(x.pid) : '—') },
          { label: 'Up', cell: (x) => (x.state === 'healthy' ? duration(x.uptime_s) : '—') },
          { label: 'Restarts', cell: (x) => String(x.restarts) },
          { label: 'Last error', class: 'wrap', cell: (x) => x.last_error ? h('span', { class: 'last-error' }, x.last_error) : h('span', { class: 'muted' }, '—') },
          { label: '', cell: (x) => restartButton(x, load) },
        ], s.services || [], { key: (x) => x.name, caption: 'Services' })),
      h('section', { class: 'card' }, h('h2', null, 'Upstream MCP servers'),
        ups.length ? table([
          { label: 'Server', cell: (u) => h('a', { href: `/ui/servers?name=${encodeURIComponent(u.name)}`, 'data-nav': true }, u.name) },
          { label: 'Transport', cell: (u) => u.transport },
          { label: 'State', cell: (u) => stateBadge(u.state, u.state === 'ok' ? 'healthy' : u.state) },
          { label: 'Sessions', cell: (u) => String(u.running) },
          { label: 'Last start', cell: (u) => u.last_start ? h('span', null, u.last_start, ' · ', timeEl(u.last_start_at)) : h('span', { class: 'muted' }, 'never') },
          { label: 'Last error', class: 'wrap', cell: (u) => u.last_error ? h('span', { class: 'last-error' }, u.last_error) : h('span', { class: 'muted' }, '—') },
        ], ups, { key: (u) => u.name, caption: 'Upstreams' }) : emptyState('No MCP server registered.', h('p', null, h('a', { href: '/ui/servers', 'data-nav': true }, 'Add one'), ' or run', cli('coffer mcp import CONFIG_FILE'))))));
  }
  load();
}

/**
 * Who is connected: the MCP client sessions open now (GET /v1/status `sessions`), each with
 * its client's name and version, the profile it uses (a link to its tools' overrides) and how
 * long it has been idle.
 */
function clientsCard(sessions) {
  return h('section', { class: 'card clients-card', 'aria-labelledby': 'clients-title' },
    h('h2', { id: 'clients-title' }, 'Connected MCP clients'),
    sessions.length ? table([
      { label: 'Client', cell: (x) => h('div', null, h('strong', null, x.client_name || 'unnamed client'),
        x.client_version ? h('span', { class: 'muted small' }, ` ${x.client_version}`) : null) },
      { label: 'Profile', cell: (x) => h('a', { href: `/ui/tools?profile=${encodeURIComponent(x.profile)}`, 'data-nav': true, class: 'badge accent', dataset: { profile: x.profile } }, x.profile) },
      { label: 'Session', cell: (x) => h('code', { title: 'The first characters of its id, as the invocation log shows it' }, x.id) },
      { label: 'Protocol', cell: (x) => x.protocol_version || '—' },
      { label: 'Idle', cell: (x) => duration(x.idle_s) },
    ], sessions, { key: (x) => x.id, caption: 'Connected MCP clients' })
      : h('p', { class: 'muted' }, 'No MCP client is connected now. A client connects through ', h('code', null, 'coffer-mcp-shim'), ' or ', h('code', null, '/mcp'), '; ', cli('coffer connect claude-code'), ' registers Coffer in Claude Code (codex, cursor, vscode and claude-desktop likewise).'));
}

function restartButton(x, after) {
  // The gateway serves this page: restarting it is `coffer daemon restart`'s job, not a button's.
  if (x.name === 'gateway') return h('span', { class: 'muted small' }, 'serves this page');
  if (x.state === 'stopped') return h('span', { class: 'muted small' }, 'on demand');
  const b = h('button', { type: 'button', on: { click: async () => {
    if (!await confirmDialog(`Restart ${x.name}?`, `The ${x.name} service stops and starts again; its requests wait meanwhile.`, { confirm: 'Restart' })) return;
    b.disabled = true;
    replace(b, 'Restarting…');
    try {
      const r = await vpost(`/v1/daemon/services/${seg(x.name)}/restart`, {});
      toast(`${r.name} is ${r.state}`);
    } catch (e) {
      toast(messageOf(e), 'error');
    }
    after();
  } } }, 'Restart');
  return b;
}

// ---------------------------------------------------------------------------------------------
// Backup.

function backup(panel) {
  const p = field('Backup folder', h('input', { type: 'text', required: true, autocomplete: 'off', spellcheck: 'false', placeholder: '/home/me/coffer-backup-2026-12-01' }), { name: 'path', hint: 'absolute; a new or empty folder' });
  const go = h('button', { type: 'submit', class: 'primary' }, 'Back up now');
  const out = h('div', { 'aria-live': 'polite' });
  const form = h('form', { class: 'card backup-form' },
    h('p', null, 'Writes a consistent copy of the database, your knowledge, memory and skills folders and secret.key into the folder. ',
      h('strong', null, 'Whoever holds a backup with secret.key can decrypt its credentials.')),
    p.wrap, h('div', { class: 'row' }, go), h('div', { class: 'form-error' }));
  panel.append(form, out);
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    replace(p.error);
    replace(out);
    replace(form.querySelector('.form-error'));
    go.disabled = true;
    replace(go, 'Backing up…');
    try {
      const r = await vpost('/v1/backup', { path: p.input.value.trim() });
      const files = (r.manifest && r.manifest.files) || [];
      const total = files.reduce((n, f) => n + (f.bytes || 0), 0);
      replace(out, h('section', { class: 'card backup-result', role: 'status' },
        h('h2', null, 'Backup written'),
        h('dl', { class: 'facts' },
          h('dt', null, 'Folder'), h('dd', null, h('code', null, r.path)),
          h('dt', null, 'Files'), h('dd', null, `${files.length} (${bytes(total)})`),
          h('dt', null, 'Created'), h('dd', null, timeEl(r.manifest && r.manifest.created_at)),
          h('dt', null, 'secret.key'), h('dd', null, r.secret_key_included ? h('span', { class: 'badge warn' }, 'included: keep this backup private') : 'not included')),
        (r.skipped || []).length ? h('details', null, h('summary', null, `${r.skipped.length} skipped`), h('ul', null, r.skipped.map((s) => h('li', null, h('code', null, s))))) : null,
        h('p', { class: 'muted small' }, 'Restore it with ', cli(`coffer restore ${r.path}`), ' while the daemon is stopped.')));
      toast('Backup written');
    } catch (err) {
      showFieldError(form, Object.assign(err, { details: { field: 'path', ...(err.details || {}) } }), form.querySelector('.form-error'));
    } finally {
      go.disabled = false;
      replace(go, 'Back up now');
    }
  });
}

// ---------------------------------------------------------------------------------------------
// Sync across machines: status, last sync, Sync now, conflicts, credentials to set here.

async function sync(panel) {
  const body = h('div', null, h('p', { class: 'muted loading' }, 'Loading…'));
  panel.append(body);
  let s;
  try {
    s = await vget('/v1/sync/status');
  } catch (e) {
    replace(body, errorBox(e, 'Could not load the sync status', () => { body.remove(); sync(panel); }));
    return;
  }
  if (!s.initialized) {
    replace(body, emptyState('Sync is not set up on this machine',
      'Run ', cli('coffer sync init REMOTE_URL'), ' with a git remote you own (the same one on every machine).'));
    return;
  }
  const go = h('button', { type: 'button', class: 'primary', id: 'sync-now' }, 'Sync now');
  const out = h('div', { 'aria-live': 'polite', id: 'sync-result' });
  const list = (title, items, render) => (items && items.length
    ? h('section', { class: 'card' }, h('h2', null, title), h('ul', null, items.map((x) => h('li', null, render(x)))))
    : null);
  replace(body, h('section', { class: 'card', id: 'sync-status' },
    h('dl', { class: 'facts' },
      h('dt', null, 'Remote'), h('dd', null, h('code', null, s.remote)),
      h('dt', null, 'Machine'), h('dd', null, s.machine),
      h('dt', null, 'Last sync'), h('dd', { id: 'sync-last' }, timeEl(s.last_sync_ms)),
      h('dt', null, 'Ahead / behind'), h('dd', null, `${s.ahead} / ${s.behind}`),
      h('dt', null, 'Worker'), h('dd', null, stateBadge(s.worker === 'backing_off' ? 'error' : s.worker, s.worker)),
      s.last_error ? h('dt', null, 'Last error') : null,
      s.last_error ? h('dd', { class: 'form-error' }, s.last_error) : null),
    h('div', { class: 'row' }, go)),
  list('Conflicts: both versions kept', s.conflicts, (c) => h('span', null, h('code', null, c.sibling || c.path), ' — ', c.detail)),
  list('Set these credentials here', s.missing_credentials, (n) => h('span', { class: 'missing-credential' },
    h('code', null, n), ' — referenced by a synced entry, no value on this machine: set this credential here (Credentials tab)')),
  out);
  go.addEventListener('click', async () => {
    go.disabled = true;
    replace(go, 'Syncing…');
    replace(out);
    try {
      const r = await vpost('/v1/sync', {});
      const c = (d) => `files +${d.files.added} ~${d.files.changed} -${d.files.removed}, vault +${d.vault.added} ~${d.vault.changed} -${d.vault.removed}`;
      toast('Synced');
      body.remove();
      out.remove();
      await sync(panel);
      panel.append(h('p', { class: 'muted small', id: 'sync-summary', role: 'status' },
        `Pulled: ${c(r.pulled)}. Pushed: ${c(r.pushed)}.`, r.conflicts.length ? ` ${r.conflicts.length} conflict(s).` : ''));
    } catch (err) {
      replace(out, errorBox(err, 'Sync failed'));
      go.disabled = false;
      replace(go, 'Sync now');
    }
  });
}
