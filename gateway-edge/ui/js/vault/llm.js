// Settings → LLM connections (/ui/settings?tab=llm): the person's LLM connections
// (GET/POST /v1/llm/connections, PATCH/DELETE /v1/llm/connections/{name}) with their wire, base
// URL, model, whether each is the internal default and whether its key is set; an add/edit
// dialog (the key is a password input, sent once and never shown back: it becomes a credential),
// a Test button per connection (POST …/{name}/test: the latency or the provider's failure), a
// "List models" button filling the model field's suggestions (GET …/{name}/models, or POST
// /v1/llm/connections/models for an unsaved one), make/unset default, and remove with a
// confirmation.
import { h, replace, toast } from '../dom.js';
import { vget, vpost, vpatch, vdel, seg, errorBox, emptyState, table, field, formDialog, confirmDialog, messageOf } from './common.js';

/** The wires, in the order the select offers them, with what each one is. */
const WIRES = [
  ['anthropic', 'Anthropic (Messages API)'],
  ['openai-responses', 'OpenAI (Responses API)'],
  ['openai-chat', 'OpenAI-compatible (Chat Completions)'],
  ['ollama', 'Ollama'],
];

const path = (name) => `/v1/llm/connections/${seg(name)}`;

/** The Key cell: set (credential name), missing, or none. */
function keyBadge(c) {
  if (!c.credential_ref) return h('span', { class: 'badge', dataset: { key: 'none' } }, 'no key');
  return c.credential_set
    ? h('span', { class: 'badge ok', dataset: { key: 'set' }, title: `credential ${c.credential_ref}` }, 'key set')
    : h('span', { class: 'badge err', dataset: { key: 'missing' }, title: `credential ${c.credential_ref} has no value` }, 'key missing');
}

/** A test report as a line with a badge: the latency, or the provider's failure. */
function testLine(r) {
  if (r.ok) return h('span', { class: 'llm-test ok', dataset: { ok: 'true' } }, h('span', { class: 'badge ok' }, 'ok'), ` ${r.latency_ms} ms · ${r.model}`);
  const f = r.failure || {};
  return h('span', { class: 'llm-test err', dataset: { ok: 'false', kind: f.kind || '' } },
    h('span', { class: 'badge err' }, f.kind ? f.kind.replace('_', ' ') : 'failed'), ` ${f.message || 'the provider did not answer'}`);
}

/** Mounts the LLM connections tab in `panel`. */
export async function llm(panel) {
  const add = h('button', { type: 'button', class: 'primary', on: { click: () => edit(null) } }, 'Add connection');
  const body = h('div', null, h('p', { class: 'muted loading' }, 'Loading…'));
  panel.append(h('div', { class: 'row' },
    h('p', { class: 'muted' }, 'Model providers Coffer can use. The default one answers the ask tool (', h('code', null, 'coffer__ask'), '); Claude Code and Codex can each run on one instead of their own login. Keys are stored as credentials and never shown again.'),
    h('span', { class: 'spacer' }), add), body);

  async function load() {
    let items; let agents;
    try {
      const [c, a] = await Promise.all([vget('/v1/llm/connections'), bindings()]);
      items = c.items || [];
      agents = a;
    } catch (e) {
      replace(body, errorBox(e, 'Could not list the LLM connections', load));
      return;
    }
    if (!items.length) {
      replace(body, emptyState('No LLM connection yet.', 'Add one to let the ask tool answer from your notes, or to run Claude Code or Codex on another provider.'));
      return;
    }
    const usedBy = (c) => agents.filter((a) => a.bound === c.name);
    const results = new Map(items.map((c) => [c.name, h('div', { class: 'llm-result', 'aria-live': 'polite', dataset: { result: c.name } })]));
    replace(body, table([
      { label: 'Name', cell: (c) => h('div', null, h('strong', null, c.name), c.internal_default ? h('span', null, ' ', h('span', { class: 'badge accent', dataset: { default: 'true' } }, 'default')) : null) },
      { label: 'Wire', cell: (c) => h('code', null, c.wire) },
      { label: 'Base URL', class: 'wrap', cell: (c) => (c.base_url ? h('code', null, c.base_url) : h('span', { class: 'muted' }, "provider's API")) },
      { label: 'Model', class: 'wrap', cell: (c) => h('div', null, h('code', null, c.model), c.fast_model ? h('div', { class: 'muted small' }, 'fast: ', h('code', null, c.fast_model)) : null) },
      { label: 'Key', cell: keyBadge },
      { label: 'Used by', cell: (c) => (usedBy(c).length
        ? h('div', { class: 'llm-used-by' }, usedBy(c).map((a) => h('span', { class: 'badge accent', dataset: { boundAgent: a.agent_key } }, a.display_name)))
        : h('span', { class: 'muted', dataset: { boundAgent: '' } }, 'no agent')) },
      { label: 'Actions', class: 'wrap', cell: (c) => h('div', null,
        h('div', { class: 'row nowrap' },
          h('button', { type: 'button', on: { click: (e) => test(c, e.target, results.get(c.name)) } }, 'Test'),
          h('button', { type: 'button', on: { click: () => edit(c) } }, 'Edit'),
          c.internal_default
            ? h('button', { type: 'button', class: 'ghost', on: { click: () => setDefault(c, false) } }, 'Unset default')
            : h('button', { type: 'button', on: { click: () => setDefault(c, true) } }, 'Make default'),
          h('button', { type: 'button', class: 'danger', on: { click: () => remove(c) } }, 'Remove')),
        results.get(c.name)) },
    ], items, { key: (c) => c.name, caption: 'LLM connections' }));
    body.prepend(agentPicks(agents, items));
  }

  /** What each agent runs on, as pickers: its own login, or one of the connections. */
  function agentPicks(agents, items) {
    if (!agents.length) return h('div');
    const names = items.map((c) => c.name);
    const row = (a) => {
      const id = `bind-${a.agent_key}`;
      const options = [['', 'Its own login'], ...names.map((n) => [n, n])];
      if (a.bound && !names.includes(a.bound)) options.push([a.bound, `${a.bound} (missing)`]);
      const sel = h('select', { id, dataset: { agent: a.agent_key } }, options.map(([v, t]) => h('option', { value: v, selected: v === a.bound }, t)));
      const note = h('div', { class: 'muted small llm-bind-note', 'aria-live': 'polite' }, a.bound
        ? `Its turns go to ${a.bound}${a.problem ? ` — ${a.problem}` : ''}.`
        : 'Its turns use the login of its own CLI.');
      sel.addEventListener('change', async () => {
        sel.disabled = true;
        try {
          await vpatch('/v1/settings', sel.value ? { set: { [a.setting]: sel.value } } : { remove: [a.setting] });
          toast(sel.value ? `${a.display_name} runs on ${sel.value} from its next turn` : `${a.display_name} uses its own login from its next turn`);
          load();
        } catch (e) {
          sel.value = a.bound;
          replace(note, h('span', { class: 'field-error' }, messageOf(e)));
        } finally {
          sel.disabled = false;
        }
      });
      return h('div', { class: 'llm-bind', dataset: { agent: a.agent_key } },
        h('label', { for: id }, h('strong', null, a.display_name), a.available ? null : h('span', { class: 'muted small' }, ' (not installed)')),
        sel, note);
    };
    return h('section', { class: 'card llm-agents', 'aria-labelledby': 'llm-agents-title' },
      h('h2', { id: 'llm-agents-title' }, 'What each agent runs on'),
      h('div', { class: 'llm-binds' }, agents.map(row)));
  }

  async function test(c, button, out) {
    button.disabled = true;
    replace(out, h('span', { class: 'muted' }, `Testing ${c.name}…`));
    try {
      replace(out, testLine(await vpost(`${path(c.name)}/test`, {})));
    } catch (e) {
      replace(out, h('span', { class: 'llm-test err', dataset: { ok: 'false' } }, messageOf(e)));
    } finally {
      button.disabled = false;
    }
  }

  async function setDefault(c, on) {
    try {
      if (on) await vpost(`${path(c.name)}/default`, {});
      else await vdel(`${path(c.name)}/default`);
      toast(on ? `${c.name} is the internal default` : `${c.name} is no longer the default`);
    } catch (e) {
      toast(messageOf(e), 'error');
    }
    load();
  }

  async function remove(c) {
    const what = c.credential_ref === `llm-${c.name}` ? ` Its key (credential ${c.credential_ref}) goes too unless something else uses it.` : '';
    if (!await confirmDialog(`Remove ${c.name}?`, `${c.internal_default ? 'coffer__ask then has no connection to run on.' : 'Agents bound to it go back to their own login.'}${what}`, { confirm: 'Remove' })) return;
    try {
      await vdel(path(c.name));
      toast(`Removed ${c.name}`);
    } catch (e) {
      toast(messageOf(e), 'error');
    }
    load();
  }

  async function edit(c) {
    const done = await connectionDialog(c);
    if (done) { toast(`${done.name} ${c ? 'saved' : 'added'}`); load(); }
  }

  load();
}

/**
 * The agents that can run on a connection, with the one each is bound to: `[{agent_key,
 * display_name, available, setting, bound ('' = own login), problem}]`. The binding is the
 * setting's value (GET /v1/settings: current at once); its problem comes from GET /v1/agents.
 */
async function bindings() {
  const [agents, table, values] = await Promise.all([
    vget('/v1/agents').then((r) => r.items || []).catch(() => []),
    vget('/v1/settings/table').then((r) => r.items || []),
    vget('/v1/settings').then((r) => r.values || {}),
  ]);
  const keys = new Set(table.map((r) => r.key));
  return agents.filter((a) => keys.has(`chat.${a.agent_key}_connection`)).map((a) => {
    const setting = `chat.${a.agent_key}_connection`;
    const bound = (values[setting] || '').trim();
    const problem = a.binding && a.binding.connection === bound ? a.binding.problem : null;
    return { agent_key: a.agent_key, display_name: a.display_name, available: a.available, setting, bound, problem };
  });
}

/** The add (c null) or edit dialog; resolves with the saved connection, or null. */
function connectionDialog(c) {
  const listId = `llm-models-${Math.random().toString(36).slice(2, 8)}`;
  const models = h('datalist', { id: listId });
  const name = field('Name', h('input', { type: 'text', value: c ? c.name : '', disabled: !!c, autocomplete: 'off', spellcheck: 'false' }), { name: 'name', hint: 'a-z, 0-9, -; up to 32' });
  const wire = field('Wire', h('select', null, WIRES.map(([w, label]) => h('option', { value: w, selected: c ? c.wire === w : w === 'anthropic' }, label))), { name: 'wire' });
  const base = field('Base URL', h('input', { type: 'url', value: c ? c.base_url || '' : '', autocomplete: 'off', spellcheck: 'false', placeholder: "empty: the provider's API" }), { name: 'base_url', hint: 'required for Ollama, e.g. http://127.0.0.1:11434' });
  const cred = field('Credential', h('input', { type: 'text', value: c ? c.credential_ref || '' : '', autocomplete: 'off', spellcheck: 'false' }), { name: 'credential_ref', hint: 'the stored key’s name; empty with a key below: llm-<name>' });
  const key = field('API key', h('input', { type: 'password', autocomplete: 'new-password' }), { name: 'api_key', hint: c ? 'leave empty to keep the current key' : 'sent once; never shown again' });
  const model = field('Model', h('input', { type: 'text', value: c ? c.model : '', list: listId, autocomplete: 'off', spellcheck: 'false' }), { name: 'model' });
  const fast = field('Fast model', h('input', { type: 'text', value: c ? c.fast_model || '' : '', list: listId, autocomplete: 'off', spellcheck: 'false', placeholder: 'optional' }), { name: 'fast_model' });
  const isDefault = h('input', { type: 'checkbox', checked: c ? c.internal_default : false });
  const hint = h('div', { class: 'muted small llm-models-hint', 'aria-live': 'polite' });
  const list = h('button', { type: 'button', class: 'llm-list-models', on: { click: () => listModels() } }, 'List models');
  const wireKind = () => wire.input.value;
  const sync = () => {
    const ollama = wireKind() === 'ollama';
    base.input.required = ollama;
    base.input.placeholder = ollama ? 'http://127.0.0.1:11434' : "empty: the provider's API";
  };
  wire.input.addEventListener('change', sync);
  sync();

  async function listModels() {
    list.disabled = true;
    replace(hint, 'Asking the provider…');
    try {
      // A saved connection is listed with its stored key; an unsaved one (or a new key) as a
      // draft with the key typed here: a draft never uses a stored credential.
      const r = c && !key.input.value
        ? await vget(`${path(c.name)}/models`)
        : await vpost('/v1/llm/connections/models', draft());
      const ids = (r.items || []).map((m) => m.id);
      replace(models, ids.map((id) => h('option', { value: id })));
      if (r.failure) replace(hint, h('span', { class: 'field-error' }, r.failure.message));
      else replace(hint, ids.length ? `${ids.length} models: pick one in the Model field or type an id.` : r.hint || 'The provider listed no models; type an id.');
    } catch (e) {
      replace(hint, h('span', { class: 'field-error' }, messageOf(e)));
    } finally {
      list.disabled = false;
    }
  }

  function draft() {
    const d = { wire: wireKind() };
    if (name.input.value.trim()) d.name = name.input.value.trim();
    if (base.input.value.trim()) d.base_url = base.input.value.trim();
    if (key.input.value) d.api_key = key.input.value;
    if (model.input.value.trim()) d.model = model.input.value.trim();
    return d;
  }

  const content = h('div', { class: 'llm-form' },
    name.wrap, wire.wrap, base.wrap, cred.wrap, key.wrap,
    model.wrap, h('div', { class: 'row' }, list, hint), models, fast.wrap,
    h('label', { class: 'row llm-default' }, isDefault, ' Internal default (what coffer__ask runs on)'));
  return formDialog(c ? `Edit ${c.name}` : 'Add an LLM connection', content, async () => {
    const opt = (v) => (v.trim() === '' ? null : v.trim());
    const apiKey = key.input.value;
    try {
      if (c) {
        const body = { wire: wireKind(), base_url: opt(base.input.value), credential_ref: opt(cred.input.value), model: model.input.value.trim(), fast_model: opt(fast.input.value), internal_default: isDefault.checked };
        if (apiKey) body.api_key = apiKey;
        return await vpatch(path(c.name), body, { headers: { 'If-Match': `"${c.version}"` } });
      }
      const body = { name: name.input.value.trim(), wire: wireKind(), model: model.input.value.trim(), internal_default: isDefault.checked };
      for (const [k, v] of [['base_url', base.input.value], ['credential_ref', cred.input.value], ['fast_model', fast.input.value]]) if (opt(v)) body[k] = opt(v);
      if (apiKey) body.api_key = apiKey;
      return await vpost('/v1/llm/connections', body);
    } finally {
      // The key leaves the page as soon as it is sent, whatever the answer.
      key.input.value = '';
    }
  }, { submit: c ? 'Save' : 'Add', wide: true });
}
