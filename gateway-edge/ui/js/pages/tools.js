// The tools page (/ui/tools): every tool MCP clients see through Coffer (GET /v1/tools), with
// its exposed and original names, server and enabled state; a search that filters the list
// (client-side: the list is one page), a per-tool toggle (PATCH /v1/tools/{name}) and a "Try"
// dialog that calls the tool (POST /v1/tools/call) and shows its result as text.
// Tool overrides (issue 36 §3) in a chosen profile (GET /v1/mcp/profiles; `default`'s apply in
// every profile): each row shows what the profile's override makes of the tool (the name a
// client sees, a changed description, hidden parameters, annotations; `default`'s marked as
// inherited in another profile), "Only overridden" filters to them, and "Override" edits the
// chosen profile's own override of the tool in the dialog of Settings → Profiles (a whole-spec
// PUT at the version read, so a concurrent change is refused with a message, never lost).
import { h, replace, toast } from '../dom.js';
import { breakable, description } from './servers.js';
import { vget, vpatch, vpost, seg, errorBox, emptyState, pageHead, table, toggle, messageOf, setQuery, cli } from '../vault/common.js';
import { overrideDialog, writeOverrides } from '../vault/profiles.js';

const DEFAULT = 'default';

/** The badges of override `o` (null: none): a new name, description, hidden parameters, annotations. */
function overrideBadges(o) {
  if (!o) return [];
  const out = [];
  if (o.name) out.push(h('span', { class: 'badge accent' }, 'renamed'));
  if (o.description) out.push(h('span', { class: 'badge' }, 'description replaced'));
  if (o.description_append) out.push(h('span', { class: 'badge' }, 'description extended'));
  if ((o.hide_params || []).length) out.push(h('span', { class: 'badge', title: o.hide_params.join(', ') }, `${o.hide_params.length} hidden`));
  const a = o.annotations || {};
  if (a.read_only !== undefined) out.push(h('span', { class: 'badge' }, a.read_only ? 'read-only' : 'not read-only'));
  if (a.destructive !== undefined) out.push(h('span', { class: a.destructive ? 'badge warn' : 'badge' }, a.destructive ? 'destructive' : 'not destructive'));
  return out;
}

/** `default`'s override of a tool under the profile's own, field by field (the gateway's merge). */
function merged(base, own) {
  if (!base) return own || null;
  if (!own) return base;
  const m = { ...base, ...own };
  if (base.annotations || own.annotations) m.annotations = { ...(base.annotations || {}), ...(own.annotations || {}) };
  return m;
}

export function mount(root, { params }) {
  const q = h('input', { type: 'search', id: 'tool-search', placeholder: 'Search by name, server or description', value: params.get('q') || '', autocomplete: 'off', spellcheck: 'false' });
  const server = h('select', { id: 'tool-server' }, h('option', { value: '' }, 'All servers'));
  const profile = h('select', { id: 'tool-profile' }, h('option', { value: DEFAULT }, 'default (every profile)'));
  const onlyOv = h('input', { type: 'checkbox', id: 'tool-overridden', checked: params.get('overridden') === '1' });
  const count = h('p', { class: 'muted small', 'aria-live': 'polite' });
  const body = h('div', null, h('p', { class: 'muted loading' }, 'Loading…'));
  const refresh = h('button', { type: 'button', on: { click: () => load() } }, 'Refresh');
  root.append(
    pageHead('Tools', 'What MCP clients see: each tool as <server>__<tool>. A disabled tool is hidden from clients and refused when called.', refresh),
    h('div', { class: 'row filters' },
      h('label', { for: 'tool-search', class: 'sr-only' }, 'Search tools'), q,
      h('label', { for: 'tool-server', class: 'sr-only' }, 'Server'), server,
      h('label', { for: 'tool-profile' }, 'Overrides in'), profile,
      h('label', { for: 'tool-overridden', class: 'check' }, onlyOv, ' Only overridden')),
    count, body);
  let items = [];
  let profiles = new Map(); // name → profile (GET /v1/mcp/profiles)

  /** The chosen profile (a stand-in `default` before the list arrives or when it failed). */
  const chosen = () => profiles.get(profile.value) || profiles.get(DEFAULT) || { name: DEFAULT, version: 0, overrides: {} };
  /** The override of tool `t` in the chosen profile: {own, inherited, effective}. */
  const overrideOf = (t) => {
    const p = chosen();
    const own = (p.overrides || {})[t.name] || null;
    const inherited = p.name === DEFAULT ? null : ((profiles.get(DEFAULT) || {}).overrides || {})[t.name] || null;
    return { own, inherited, effective: merged(inherited, own) };
  };

  const draw = () => {
    const needle = q.value.trim().toLowerCase();
    const srv = server.value;
    const only = onlyOv.checked;
    const shown = items.filter((t) => (!srv || t.server === srv)
      && (!only || overrideOf(t).effective)
      && (!needle || [t.name, t.original_name, t.server, t.title, t.description, (overrideOf(t).effective || {}).name].some((f) => f && String(f).toLowerCase().includes(needle))));
    const p = chosen();
    setQuery({ q: q.value.trim(), server: srv, profile: p.name === DEFAULT ? '' : p.name, overridden: only ? '1' : '' });
    const nOv = items.filter((t) => overrideOf(t).effective).length;
    replace(count, items.length ? `${shown.length} of ${items.length} tools · ${nOv} overridden in ${p.name}` : '');
    if (!items.length) {
      replace(body, emptyState('No tools yet.',
        h('p', null, 'Tools come from your MCP servers. ', h('a', { href: '/ui/servers', 'data-nav': true }, 'Add a server'), ' or import another client\'s in a terminal:', cli('coffer mcp import CONFIG_FILE'))));
      return;
    }
    if (!shown.length) {
      replace(body, only
        ? emptyState(`No tool is overridden in ${p.name}${needle || srv ? ' among these' : ''}.`, 'Untick "Only overridden" to see every tool, and "Override" on a tool\u2019s row to add one.')
        : emptyState('No tool matches the search.', 'Try fewer words, or another server.'));
      return;
    }
    replace(body, table([
      { label: 'Tool', class: 'wrap', cell: (t) => toolCell(t, overrideOf(t)) },
      { label: 'Original name', class: 'wrap', cell: (t) => h('code', null, breakable(t.original_name)) },
      { label: 'Server', cell: (t) => t.server },
      { label: 'Description', class: 'wrap', cell: (t) => description(t.description) },
      { label: 'Enabled', cell: (t) => toggle(`${t.name}`, t.enabled, async (on, input) => {
        try {
          await vpatch(`/v1/tools/${seg(t.name)}`, { enabled: on });
          t.enabled = on;
          toast(`${t.name} ${on ? 'enabled' : 'disabled'}`);
        } catch (e) {
          input.checked = !on;
          toast(messageOf(e), 'error');
        }
      }) },
      { label: 'Actions', cell: (t) => h('div', { class: 'row nowrap' },
        h('button', { type: 'button', disabled: !t.enabled, title: t.enabled ? 'Call this tool' : 'Enable it to call it', on: { click: () => tryTool(t) } }, 'Try'),
        h('button', { type: 'button', class: 'override-edit', title: `Edit how ${p.name} shows this tool`, on: { click: () => editOverride(t) } }, overrideOf(t).own ? 'Edit override' : 'Override')) },
    ], shown, { key: (t) => t.name, caption: 'Tools', rowClass: (t) => (overrideOf(t).effective ? 'overridden' : undefined) }));
  };
  q.addEventListener('input', draw);
  server.addEventListener('change', draw);
  profile.addEventListener('change', draw);
  onlyOv.addEventListener('change', draw);

  /** The name, title and override summary of tool `t` (`ov` from overrideOf). */
  function toolCell(t, ov) {
    const e = ov.effective;
    return h('div', { class: 'tool-name' },
      h('code', null, breakable(t.name)),
      t.title ? h('div', { class: 'muted small' }, t.title) : null,
      e ? h('div', { class: 'tool-override', dataset: { override: ov.own ? 'own' : 'inherited' } },
        e.name ? h('div', { class: 'small' }, 'shown as ', h('code', { class: 'shown-as' }, breakable(e.name))) : null,
        h('div', { class: 'row tool-override-badges' }, overrideBadges(e),
          ov.own ? null : h('span', { class: 'badge muted', title: 'Set in default, which applies in every profile' }, 'from default'))) : null);
  }

  /** Opens the override dialog of `t` in the chosen profile; redraws after a save. */
  async function editOverride(t) {
    const p = chosen();
    const { own } = overrideOf(t);
    const done = await overrideDialog(p, t.name, own, writeOverrides, { title: `${t.name} in ${p.name}` });
    if (done) {
      toast(`${t.name}: override in ${p.name} saved`);
      await loadProfiles();
      draw();
    }
  }

  /** Reads the profiles (for the picker and their overrides); keeps the last list on failure. */
  async function loadProfiles() {
    let list;
    try {
      list = (await vget('/v1/mcp/profiles')).items || [];
    } catch (e) {
      toast(`Could not read the profiles: ${messageOf(e)}`, 'error');
      return;
    }
    profiles = new Map(list.map((p) => [p.name, p]));
    const want = profile.value !== DEFAULT ? profile.value : (params.get('profile') || DEFAULT);
    replace(profile, list.map((p) => h('option', { value: p.name }, p.name === DEFAULT ? 'default (every profile)' : p.name)));
    profile.value = profiles.has(want) ? want : DEFAULT;
  }

  async function load() {
    try {
      [items] = await Promise.all([vget('/v1/tools').then((r) => r.items || []), loadProfiles()]);
    } catch (e) {
      replace(body, errorBox(e, 'Could not list the tools', load));
      return;
    }
    const servers = [...new Set(items.map((t) => t.server))].sort();
    const want = server.value || params.get('server') || '';
    replace(server, h('option', { value: '' }, 'All servers'), servers.map((s) => h('option', { value: s }, s)));
    server.value = servers.includes(want) ? want : '';
    draw();
  }
  load();
  return () => {};
}

/** A dialog that calls `t` with JSON arguments and shows the result; stays open for more calls. */
function tryTool(t) {
  const args = h('textarea', { id: 'try-args', rows: 5, spellcheck: 'false' });
  args.value = '{}';
  const out = h('div', { class: 'try-result', 'aria-live': 'polite' });
  const run = h('button', { type: 'submit', class: 'primary' }, 'Call');
  const form = h('form', { class: 'dialog-form' },
    h('h2', null, `Call ${t.name}`),
    t.description ? h('p', { class: 'muted' }, t.description) : null,
    h('label', { for: 'try-args' }, 'Arguments ', h('span', { class: 'hint' }, '(a JSON object)')), args,
    out,
    h('div', { class: 'actions' }, h('button', { type: 'button', class: 'ghost', on: { click: () => d.close() } }, 'Close'), run));
  const d = h('dialog', { class: 'modal wide', 'aria-label': `Call ${t.name}` }, form);
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    let a;
    try {
      a = JSON.parse(args.value || '{}');
      if (!a || typeof a !== 'object' || Array.isArray(a)) throw new Error('not an object');
    } catch {
      replace(out, h('div', { class: 'error-box', role: 'alert' }, 'The arguments must be a JSON object, like {"message": "hi"}.'));
      return;
    }
    run.disabled = true;
    replace(out, h('p', { class: 'muted' }, 'Calling…'));
    const started = performance.now();
    try {
      const r = await vpost('/v1/tools/call', { name: t.name, arguments: a });
      replace(out, resultView(r, Math.round(performance.now() - started)));
    } catch (err) {
      replace(out, errorBox(err, 'The call failed'));
    } finally {
      run.disabled = false;
    }
  });
  d.addEventListener('close', () => d.remove());
  document.body.appendChild(d);
  d.showModal();
}

/** A CallToolResult as text: each content block (text as is, others as JSON), isError marked. */
function resultView(r, ms) {
  const blocks = Array.isArray(r && r.content) ? r.content : [];
  return h('div', { class: 'stack' },
    h('p', { class: 'row' }, r && r.isError ? h('span', { class: 'badge err' }, 'tool error') : h('span', { class: 'badge ok' }, 'result'), h('span', { class: 'muted small' }, `${ms} ms`)),
    blocks.length ? blocks.map((b) => h('pre', { class: 'result-block' }, b && b.type === 'text' ? String(b.text ?? '') : JSON.stringify(b, null, 2))) : null,
    r && r.structuredContent !== undefined ? h('details', null, h('summary', null, 'Structured content'), h('pre', null, JSON.stringify(r.structuredContent, null, 2))) : null,
    !blocks.length && (r === null || r.structuredContent === undefined) ? h('pre', null, JSON.stringify(r, null, 2)) : null);
}
