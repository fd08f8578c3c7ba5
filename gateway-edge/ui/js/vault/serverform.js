// The add/edit form of an MCP server (stdio: command, args, env, cwd; http: URL, headers).
// Secrets never go into the server record: an env variable or header marked secret is stored in
// the credential store first (PUT /v1/credentials/<server>-<KEY>, the name `coffer mcp add`
// uses) and the server gets {"credential_ref": name}; if registering then fails, the credentials
// made for it are removed again.
import { h, replace, toast } from '../dom.js';
import { vget, vpost, vpatch, vput, vdel, seg, field, formDialog } from './common.js';

/** Words that make a variable's value a secret (coffer_types::secrets::SECRET_WORDS). */
const SECRET_WORDS = ['token', 'key', 'secret', 'password', 'passwd', 'auth', 'credential'];
const looksSecret = (k) => SECRET_WORDS.some((w) => k.toLowerCase().includes(w));

/** `<server>-<var>` with characters the credential store refuses replaced (coffer_types::secrets::credential_name). */
function credentialName(server, v) {
  return `${server}-${v.replace(/[^A-Za-z0-9_.-]/g, '_')}`.slice(0, 64);
}

/** `base`, or `base-2`, `base-3`… when taken. */
function unique(base, taken) {
  if (!taken.has(base)) return base;
  for (let n = 2; ; n += 1) {
    const suffix = `-${n}`;
    const c = `${base.slice(0, 64 - suffix.length).replace(/[-_.]+$/, '')}${suffix}`;
    if (!taken.has(c)) return c;
  }
}

/**
 * Rows of name → value for `env` or `headers`. Each row: the name, what the value is (a plain
 * value, a new secret, or an existing credential) and the value (a password input for a secret,
 * a list of credential names for a reference).
 */
function kvEditor(kind, initial, credNames) {
  const label = kind === 'env' ? 'Environment variables' : 'HTTP headers';
  const keyLabel = kind === 'env' ? 'Variable' : 'Header';
  const rows = h('div', { class: 'kv-rows' });
  const addRow = (key = '', value = '') => {
    const ref = value && typeof value === 'object' ? value.credential_ref : null;
    const keyIn = h('input', { type: 'text', class: 'kv-key', 'aria-label': `${keyLabel} name`, placeholder: kind === 'env' ? 'NAME' : 'Header-Name', value: key, autocomplete: 'off', spellcheck: 'false' });
    const mode = h('select', { class: 'kv-mode', 'aria-label': `What the ${keyLabel.toLowerCase()}'s value is` },
      h('option', { value: 'text' }, 'Value'),
      h('option', { value: 'secret' }, 'Secret (new credential)'),
      h('option', { value: 'ref' }, 'Stored credential'));
    const slot = h('span', { class: 'kv-value' });
    let valueEl = null;
    const draw = () => {
      const m = mode.value;
      if (m === 'ref') {
        valueEl = h('select', { class: 'kv-ref', 'aria-label': `Credential for ${keyIn.value || keyLabel.toLowerCase()}` },
          credNames.length ? null : h('option', { value: '' }, '(no credentials yet)'),
          credNames.map((n) => h('option', { value: n, selected: n === ref }, n)));
        if (ref && !credNames.includes(ref)) valueEl.appendChild(h('option', { value: ref, selected: true }, `${ref} (missing)`));
      } else if (m === 'secret') {
        valueEl = h('input', { type: 'password', class: 'kv-secret', 'aria-label': `Secret value of ${keyIn.value || keyLabel.toLowerCase()}`, autocomplete: 'new-password', placeholder: 'stored encrypted, never shown' });
      } else {
        valueEl = h('input', { type: 'text', class: 'kv-text', 'aria-label': `Value of ${keyIn.value || keyLabel.toLowerCase()}`, placeholder: 'value', value: typeof value === 'string' ? value : '', autocomplete: 'off', spellcheck: 'false' });
      }
      replace(slot, valueEl);
    };
    mode.value = ref ? 'ref' : 'text';
    mode.addEventListener('change', draw);
    keyIn.addEventListener('input', () => {
      // A name that says "token", "key", … suggests a secret, as `coffer mcp add` would treat it.
      if (mode.value === 'text' && looksSecret(keyIn.value) && !(valueEl && valueEl.value)) { mode.value = 'secret'; draw(); }
    });
    draw();
    const row = h('div', { class: 'kv-row' }, keyIn, mode, slot,
      h('button', { type: 'button', class: 'ghost kv-remove', 'aria-label': `Remove this ${keyLabel.toLowerCase()}`, on: { click: () => row.remove() } }, '✕'));
    row.read = () => ({ key: keyIn.value.trim(), mode: mode.value, value: valueEl ? valueEl.value : '' });
    rows.appendChild(row);
  };
  for (const [k, v] of Object.entries(initial || {})) addRow(k, v);
  const el = h('fieldset', { class: 'kv', dataset: { field: kind } },
    h('legend', null, label),
    // Column heads over the rows (each control also has its own aria-label); hidden without rows.
    h('div', { class: 'kv-head', 'aria-hidden': 'true' }, h('span', null, kind === 'env' ? 'Name' : 'Header'), h('span', null, 'Kind'), h('span', null, 'Value'), h('span')),
    rows,
    h('button', { type: 'button', class: 'kv-add', on: { click: () => addRow() } }, kind === 'env' ? 'Add variable' : 'Add header'),
    h('div', { class: 'field-error' }));
  return { el, read: () => [...rows.children].map((r) => r.read()).filter((r) => r.key || r.value) };
}

/**
 * Turns the editor's rows into the wire map, storing new secrets as credentials first.
 * Returns {map, created} (`created`: credential names made here, to remove if the save fails).
 */
async function toWire(kind, rows, server, taken) {
  const map = {};
  const created = [];
  const fail = (message) => Object.assign(new Error(message), { details: { field: kind } });
  try {
    for (const r of rows) {
      if (!r.key) throw fail(`every ${kind === 'env' ? 'variable' : 'header'} needs a name`);
      if (Object.hasOwn(map, r.key)) throw fail(`${r.key} is given twice`);
      if (r.mode === 'ref') {
        if (!r.value) throw fail(`choose the credential for ${r.key}`);
        map[r.key] = { credential_ref: r.value };
      } else if (r.mode === 'secret') {
        if (!r.value) throw fail(`type the secret value of ${r.key}`);
        const name = unique(credentialName(server, r.key), taken);
        await vput(`/v1/credentials/${seg(name)}`, { value: r.value });
        taken.add(name);
        created.push(name);
        map[r.key] = { credential_ref: name };
      } else {
        map[r.key] = r.value;
      }
    }
  } catch (e) {
    await removeCredentials(created);
    throw e;
  }
  return { map, created };
}

async function removeCredentials(names) {
  for (const n of names) {
    try { await vdel(`/v1/credentials/${seg(n)}`); } catch { /* already gone */ }
  }
}

/**
 * Opens the add (no `server`) or edit form. Resolves with the saved server, or null when
 * cancelled.
 */
export async function openServerForm(server) {
  let credNames = [];
  try {
    credNames = ((await vget('/v1/credentials')).items || []).map((c) => c.name);
  } catch { /* the form still works with plain values and new secrets */ }
  const editing = !!server;
  const s = server || { transport: 'stdio', args: [], env: {}, headers: {}, enabled: true };
  const name = field('Name', h('input', { type: 'text', required: true, value: s.name || '', disabled: editing, autocomplete: 'off', spellcheck: 'false', pattern: '[a-z0-9][a-z0-9-]{0,23}' }),
    { name: 'name', hint: 'lower-case letters, digits, -; up to 24' });
  const transport = field('Transport', h('select', { disabled: editing },
    h('option', { value: 'stdio' }, 'stdio: a command Coffer starts'),
    h('option', { value: 'http' }, 'HTTP: a URL (Streamable HTTP; a legacy SSE server is detected)'),
    h('option', { value: 'sse' }, 'Legacy HTTP+SSE: a URL (MCP 2024-11-05)')), { name: 'transport' });
  transport.input.value = s.transport || 'stdio';
  const command = field('Command', h('input', { type: 'text', value: s.command || '', autocomplete: 'off', spellcheck: 'false', placeholder: '/usr/bin/node or npx' }),
    { name: 'command', hint: 'an absolute path, or a name on the daemon\'s PATH' });
  const args = field('Arguments', h('textarea', { rows: 3, spellcheck: 'false', placeholder: 'one per line' }), { name: 'args', hint: 'one per line' });
  args.input.value = (s.args || []).join('\n');
  const cwd = field('Working directory', h('input', { type: 'text', value: s.cwd || '', autocomplete: 'off', spellcheck: 'false', placeholder: 'default' }), { name: 'cwd', hint: 'optional, absolute' });
  const url = field('URL', h('input', { type: 'url', value: s.url || '', autocomplete: 'off', spellcheck: 'false', placeholder: 'https://example.com/mcp' }), { name: 'url' });
  const timeout = field('Call timeout (seconds)', h('input', { type: 'number', min: '0.001', step: 'any', value: s.timeout_ms ? String(s.timeout_ms / 1000) : '', placeholder: 'default' }),
    { name: 'timeout', hint: 'optional' });
  const env = kvEditor('env', s.env, credNames);
  const headers = kvEditor('headers', s.headers, credNames);
  const enabled = h('input', { type: 'checkbox', checked: s.enabled !== false, id: `en-${Math.random().toString(36).slice(2)}` });
  const stdioPart = h('div', { class: 'stdio-part' }, command.wrap, args.wrap, env.el, cwd.wrap);
  const httpPart = h('div', { class: 'http-part' }, url.wrap, headers.el);
  const show = () => {
    const http = transport.input.value !== 'stdio';
    stdioPart.hidden = http;
    httpPart.hidden = !http;
  };
  transport.input.addEventListener('change', show);
  show();
  const content = h('div', { class: 'server-form' },
    name.wrap, transport.wrap, stdioPart, httpPart, timeout.wrap,
    editing ? null : h('div', { class: 'row check' }, enabled, h('label', { for: enabled.id }, 'Enabled')),
    h('p', { class: 'hint' }, 'Secrets go to the encrypted credential store; the server record holds only a reference to them.'));

  return formDialog(editing ? `Edit ${s.name}` : 'Add an MCP server', content, async () => {
    const serverName = editing ? s.name : name.input.value.trim();
    if (!serverName) throw Object.assign(new Error('give the server a name'), { details: { field: 'name' } });
    const http = transport.input.value !== 'stdio';
    const t = timeout.input.value.trim();
    const timeoutS = t === '' ? null : Number(t);
    if (t !== '' && !(timeoutS > 0)) throw Object.assign(new Error('the timeout must be a positive number of seconds'), { details: { field: 'timeout' } });
    const taken = new Set(credNames);
    const body = {};
    let created = [];
    if (http) {
      const w = await toWire('headers', headers.read(), serverName, taken);
      created = w.created;
      Object.assign(body, { url: url.input.value.trim(), headers: w.map });
    } else {
      const w = await toWire('env', env.read(), serverName, taken);
      created = w.created;
      const argv = args.input.value.split('\n').map((a) => a.replace(/\r$/, '')).filter((a) => a !== '');
      Object.assign(body, { command: command.input.value.trim(), args: argv, env: w.map, cwd: cwd.input.value.trim() || null });
    }
    try {
      let saved;
      if (editing) {
        body.timeout_s = timeoutS;
        saved = await vpatch(`/v1/mcp/servers/${seg(s.name)}`, body, { headers: { 'If-Match': `"${s.version}"` } });
      } else {
        Object.assign(body, { name: serverName, transport: transport.input.value, enabled: enabled.checked });
        if (timeoutS !== null) body.timeout_s = timeoutS;
        saved = await vpost('/v1/mcp/servers', body);
      }
      if (created.length) toast(`Stored as credential${created.length > 1 ? 's' : ''}: ${created.join(', ')}`);
      return saved;
    } catch (e) {
      await removeCredentials(created);
      throw e;
    }
  }, { submit: editing ? 'Save' : 'Add server', wide: true });
}
