// Settings → Profiles (/ui/settings?tab=profiles): named views of the vault for a kind of client
// (GET/POST /v1/mcp/profiles, GET/PUT/DELETE /v1/mcp/profiles/{name}): which servers, tools and
// built-in tools its MCP sessions see (include/exclude globs, one per line), the tool mode (full
// or lazy) and a description; and each profile's tool overrides (a new name, a replaced or
// extended description, hidden parameters, read-only/destructive annotations), edited in their
// own card. Every write is a whole-spec PUT at the version shown (If-Match), so a concurrent
// change is refused with a message, never lost; the daemon's refusal is shown next to the field
// it names. `default` (a session naming no profile gets it) can be edited, not removed.
import { h, replace, toast } from '../dom.js';
import { ApiError } from '../api.js';
import { vget, vpost, vput, vdel, seg, errorBox, table, field, formDialog, confirmDialog, messageOf, cli } from './common.js';

const path = (name) => `/v1/mcp/profiles/${seg(name)}`;

/**
 * Writes `overrides` (tool → override) as profile `p`'s whole overrides, at the version `p`
 * was read at (If-Match). On a 409 (changed elsewhere since) `p` is re-read in place, so that
 * saving again writes over the profile as it is now (keeping the other tools' overrides),
 * and the error says so; nothing was written. Resolves with the profile after the write.
 */
export async function writeOverrides(p, overrides) {
  try {
    const next = await vput(path(p.name), { ...specOf(p), overrides }, { headers: { 'If-Match': `"${p.version}"` } });
    Object.assign(p, next);
    return next;
  } catch (e) {
    if (!(e instanceof ApiError) || e.status !== 409) throw e;
    let now = null;
    try { now = await vget(path(p.name)); } catch { /* keep p; the message still holds */ }
    if (now) Object.assign(p, now);
    throw new ApiError(409, e.code,
      `Not saved: ${p.name} was changed elsewhere while you edited${now ? ` (it is now at version ${now.version})` : ''}. `
      + 'Save again to write your override over the current profile, or Cancel to see what changed.', { conflict: true });
  }
}

/** The spec part of a profile (what PUT takes). */
function specOf(p) {
  const { name, version, updated_at: _u, ...spec } = p;
  return spec;
}

/** `all`, or the include globs, with ` but <excludes>`. */
function selectionText(s) {
  const sel = s || {};
  const inc = (sel.include || []).length ? sel.include.join(', ') : 'all';
  return (sel.exclude || []).length ? `${inc} but ${sel.exclude.join(', ')}` : inc;
}

/**
 * Maps a refusal's `details.field` onto this page's fields: `servers.include[2]` →
 * `servers.include`, `overrides["x"].hide_params[0]` → `hide_params`; then rethrows.
 */
function onField(err, forOverride) {
  const d = err && err.details;
  if (d && typeof d.field === 'string') {
    let f = d.field.replace(/\[\d+\]$/, '');
    if (forOverride) f = f.replace(/^overrides\[".*"\]\.?/, '') || 'tool';
    d.field = f;
  }
  throw err;
}

/** Mounts the Profiles tab in `panel`. */
export async function profiles(panel) {
  const add = h('button', { type: 'button', class: 'primary', on: { click: () => edit(null) } }, 'New profile');
  const body = h('div', null, h('p', { class: 'muted loading' }, 'Loading…'));
  const detail = h('div', { class: 'profile-detail' });
  panel.append(h('div', { class: 'row' },
    h('p', { class: 'muted' }, 'Which servers and tools each kind of client sees. A client picks a profile by name; one that names none gets ', h('code', null, 'default'),
      '. A profile only narrows: a tool switched off stays hidden everywhere.'),
    h('span', { class: 'spacer' }), add), body, detail);
  let open = null;

  async function load() {
    let items;
    try {
      items = (await vget('/v1/mcp/profiles')).items || [];
    } catch (e) {
      replace(body, errorBox(e, 'Could not list the profiles', load));
      return;
    }
    replace(body, table([
      { label: 'Name', cell: (p) => h('div', null, h('strong', null, p.name), p.name === 'default' ? h('span', null, ' ', h('span', { class: 'badge accent' }, 'default')) : null,
        p.description ? h('div', { class: 'muted small' }, p.description) : null) },
      { label: 'Mode', cell: (p) => h('span', { class: p.mode === 'lazy' ? 'badge accent' : 'badge', dataset: { mode: p.mode } }, p.mode) },
      { label: 'Servers', class: 'wrap', cell: (p) => h('code', { dataset: { sel: 'servers' } }, selectionText(p.servers)) },
      { label: 'Tools', class: 'wrap', cell: (p) => h('code', { dataset: { sel: 'tools' } }, selectionText(p.tools)) },
      { label: 'Built-ins', class: 'wrap', cell: (p) => h('code', null, selectionText(p.builtins)) },
      { label: 'Overrides', cell: (p) => String(Object.keys(p.overrides || {}).length) },
      { label: 'Actions', cell: (p) => h('div', { class: 'row nowrap' },
        h('button', { type: 'button', on: { click: () => edit(p) } }, 'Edit'),
        h('button', { type: 'button', on: { click: () => { open = p.name; showOverrides(p); } } }, 'Overrides'),
        p.name === 'default' ? null : h('button', { type: 'button', class: 'danger', on: { click: () => remove(p) } }, 'Remove')) },
    ], items, { key: (p) => p.name, caption: 'Profiles' }));
    const still = open && items.find((p) => p.name === open);
    if (still) showOverrides(still); else replace(detail);
  }

  async function remove(p) {
    if (!await confirmDialog(`Remove ${p.name}?`, 'Clients that name it are refused until it exists again.', { confirm: 'Remove' })) return;
    try {
      await vdel(path(p.name), { headers: { 'If-Match': `"${p.version}"` } });
      toast(`Removed ${p.name}`);
      if (open === p.name) open = null;
    } catch (e) {
      toast(messageOf(e), 'error');
    }
    load();
  }

  async function edit(p) {
    const done = await profileDialog(p);
    if (done) { toast(`${done.name} ${p ? 'saved' : 'created'}`); load(); }
  }

  /** The overrides card of profile `p`: one row per tool, add/edit/remove. */
  function showOverrides(p) {
    const entries = Object.entries(p.overrides || {});
    const annotations = (o) => {
      const a = o.annotations || {};
      return [['read_only', 'read-only'], ['destructive', 'destructive']].filter(([k]) => a[k] !== undefined)
        .map(([k, label]) => h('span', { class: 'badge' }, `${label}: ${a[k] ? 'yes' : 'no'}`));
    };
    const list = entries.length
      ? table([
        { label: 'Tool', class: 'wrap', cell: ([t]) => h('code', null, t) },
        { label: 'Shown as', class: 'wrap', cell: ([, o]) => (o.name ? h('code', null, o.name) : h('span', { class: 'muted' }, 'its own name')) },
        { label: 'Description', class: 'wrap', cell: ([, o]) => h('div', null,
          o.description ? h('div', null, o.description) : h('span', { class: 'muted' }, "upstream's"),
          o.description_append ? h('div', { class: 'muted small' }, '+ ', o.description_append) : null) },
        { label: 'Hidden', class: 'wrap', cell: ([, o]) => ((o.hide_params || []).length ? h('code', null, o.hide_params.join(', ')) : h('span', { class: 'muted' }, 'none')) },
        { label: 'Annotations', cell: ([, o]) => h('div', { class: 'row' }, annotations(o)) },
        { label: 'Actions', cell: ([t, o]) => h('div', { class: 'row nowrap' },
          h('button', { type: 'button', on: { click: () => overrideEdit(p, t, o) } }, 'Edit'),
          h('button', { type: 'button', class: 'danger', on: { click: () => overrideRemove(p, t) } }, 'Remove')) },
      ], entries, { key: ([t]) => t, caption: `Overrides of ${p.name}` })
      : h('p', { class: 'muted' }, 'No override: every tool keeps its upstream name, description and parameters.');
    replace(detail, h('section', { class: 'card profile-overrides', dataset: { profile: p.name }, 'aria-labelledby': 'profile-ov-title' },
      h('div', { class: 'row' },
        h('h2', { id: 'profile-ov-title' }, `Tool overrides of ${p.name}`),
        h('span', { class: 'spacer' }),
        h('button', { type: 'button', class: 'primary', on: { click: () => overrideEdit(p, null, null) } }, 'Add override'),
        h('button', { type: 'button', class: 'ghost', on: { click: () => { open = null; replace(detail); } } }, 'Close')),
      h('p', { class: 'muted small' }, p.name === 'default'
        ? 'These apply in every profile (a profile\u2019s own override of a tool wins, field by field).'
        : 'Applied on the way out to clients and reversed on the way in; the upstream never sees them.'),
      list,
      h('p', { class: 'muted small' }, 'From a terminal: ', cli(`coffer profile override ${p.name} TOOL --rename NAME`))));
  }

  async function overrideRemove(p, tool) {
    if (!await confirmDialog(`Remove the override of ${tool}?`, `In ${p.name}, ${tool} is then shown as the upstream describes it.`, { confirm: 'Remove' })) return;
    const next = { ...(p.overrides || {}) };
    delete next[tool];
    try {
      await writeOverrides(p, next);
      toast(`${tool}: override removed`);
    } catch (e) {
      toast(messageOf(e), 'error');
    }
    load();
  }

  async function overrideEdit(p, tool, o) {
    const done = await overrideDialog(p, tool, o, writeOverrides);
    if (done) { toast(`${done.tool}: override saved`); load(); }
  }

  load();
}

/** A textarea of globs, one per line. */
function globsField(label, name, values, placeholder, hint) {
  const ta = h('textarea', { rows: 2, spellcheck: 'false', autocomplete: 'off', placeholder });
  ta.value = (values || []).join('\n');
  return field(label, ta, { name, hint });
}
const lines = (ta) => ta.value.split('\n').map((s) => s.trim()).filter(Boolean);

/** The create (p null) or edit dialog; resolves with the saved profile, or null. */
function profileDialog(p) {
  const name = field('Name', h('input', { type: 'text', value: p ? p.name : '', disabled: !!p, autocomplete: 'off', spellcheck: 'false' }), { name: 'name', hint: 'a-z, 0-9, -; up to 32' });
  const desc = field('Description', h('input', { type: 'text', value: p ? p.description || '' : '', autocomplete: 'off' }), { name: 'description', hint: 'one line' });
  const mode = field('Tool mode', h('select', null,
    h('option', { value: 'full', selected: !p || p.mode !== 'lazy' }, 'Full: every selected tool with its schema'),
    h('option', { value: 'lazy', selected: !!p && p.mode === 'lazy' }, 'Lazy: a few meta tools that search, describe and call them')), { name: 'mode' });
  const sel = (k) => (p && p[k]) || {};
  const lists = [
    ['servers', 'Servers', 'by name'],
    ['tools', 'Tools', 'server__tool'],
    ['builtins', 'Built-in tools', 'coffer__…'],
  ].map(([k, label, what]) => ({
    k,
    inc: globsField(`${label}: include`, `${k}.include`, sel(k).include, 'empty: all', what),
    exc: globsField(`${label}: exclude`, `${k}.exclude`, sel(k).exclude, 'none'),
  }));
  const content = h('div', { class: 'profile-form' },
    name.wrap, desc.wrap, mode.wrap,
    h('p', { class: 'muted small' }, 'One glob per line: ', h('code', null, '*'), ' any run of characters, ', h('code', null, '?'), ' one character, matched against the whole name. An exclude wins over an include.'),
    h('div', { class: 'profile-globs' }, lists.map((l) => h('fieldset', { dataset: { sel: l.k } }, l.inc.wrap, l.exc.wrap))));
  return formDialog(p ? `Edit ${p.name}` : 'New profile', content, async () => {
    const spec = p ? specOf(p) : {};
    spec.description = desc.input.value.trim();
    spec.mode = mode.input.value;
    for (const l of lists) spec[l.k] = { include: lines(l.inc.input), exclude: lines(l.exc.input) };
    try {
      if (p) return await vput(path(p.name), spec, { headers: { 'If-Match': `"${p.version}"` } });
      return await vpost('/v1/mcp/profiles', { name: name.input.value.trim(), ...spec });
    } catch (e) {
      return onField(e, false);
    }
  }, { submit: p ? 'Save' : 'Create', wide: true });
}

/** A yes/no/upstream's picker for one annotation. */
function triState(label, name, value) {
  return field(label, h('select', null,
    h('option', { value: '', selected: value === undefined }, "the upstream's"),
    h('option', { value: 'true', selected: value === true }, 'yes'),
    h('option', { value: 'false', selected: value === false }, 'no')), { name });
}

/**
 * The add (tool null) or edit dialog of one override of profile `p`, written with
 * `write(p, overrides)` ([`writeOverrides`]); an override left with no field set is removed.
 * Resolves with {tool}, or null when cancelled. `opts.title` replaces the dialog's title.
 */
export async function overrideDialog(p, tool, o, write, opts = {}) {
  const cur = o || {};
  const listId = `profile-tools-${Math.random().toString(36).slice(2, 8)}`;
  const known = h('datalist', { id: listId });
  if (!tool) {
    vget('/v1/tools').then((r) => replace(known, (r.items || []).map((t) => h('option', { value: t.name })))).catch(() => {});
  }
  const toolF = field('Tool', h('input', { type: 'text', value: tool || '', disabled: !!tool, list: listId, autocomplete: 'off', spellcheck: 'false', placeholder: 'server__tool' }), { name: 'tool', hint: 'as tools/list shows it without overrides' });
  const rename = field('Shown as', h('input', { type: 'text', value: cur.name || '', autocomplete: 'off', spellcheck: 'false', placeholder: 'its own name' }), { name: 'name', hint: 'letters, digits, _ and -; up to 64' });
  const descTa = h('textarea', { rows: 3, placeholder: "empty: the upstream's" });
  descTa.value = cur.description || '';
  const desc = field('Description (replaces)', descTa, { name: 'description' });
  const appTa = h('textarea', { rows: 2, placeholder: 'added as a new paragraph' });
  appTa.value = cur.description_append || '';
  const append = field('Description (appended)', appTa, { name: 'description_append' });
  const hidden = field('Hidden parameters', h('input', { type: 'text', value: (cur.hide_params || []).join(', '), autocomplete: 'off', spellcheck: 'false', placeholder: 'none' }), { name: 'hide_params', hint: 'optional ones only, comma-separated' });
  const ann = cur.annotations || {};
  const ro = triState('Read-only', 'read_only', ann.read_only);
  const destructive = triState('Destructive', 'destructive', ann.destructive);
  const content = h('div', { class: 'profile-form' }, toolF.wrap, known, rename.wrap, desc.wrap, append.wrap, hidden.wrap,
    h('div', { class: 'profile-ann' }, ro.wrap, destructive.wrap));
  return formDialog(opts.title || (tool ? `Override of ${tool} in ${p.name}` : `Add an override to ${p.name}`), content, async () => {
    const key = tool || toolF.input.value.trim();
    const next = { ...cur };
    const text = (k, v) => { if (v.trim()) next[k] = v.trim(); else delete next[k]; };
    text('name', rename.input.value);
    text('description', descTa.value);
    text('description_append', appTa.value);
    const params = hidden.input.value.split(',').map((s) => s.trim()).filter(Boolean);
    if (params.length) next.hide_params = params; else delete next.hide_params;
    const a = { ...(cur.annotations || {}) };
    for (const [k, f] of [['read_only', ro], ['destructive', destructive]]) {
      if (f.input.value === '') delete a[k]; else a[k] = f.input.value === 'true';
    }
    if (Object.keys(a).length) next.annotations = a; else delete next.annotations;
    if (!key) {
      replace(toolF.error, 'Name the tool (server__tool).');
      throw Object.assign(new Error('Name the tool (server__tool).'), { details: { field: 'tool' } });
    }
    const all = { ...(p.overrides || {}) };
    if (Object.keys(next).length) all[key] = next; else delete all[key];
    try {
      await write(p, all);
    } catch (e) {
      onField(e, true);
    }
    return { tool: key };
  }, { submit: 'Save', wide: true });
}
