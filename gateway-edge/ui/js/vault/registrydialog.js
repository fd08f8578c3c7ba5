// The servers page's "Install from registry" dialog: search the MCP Registry
// (GET /v1/mcp/registry/servers), pick a server and one of the ways to run it, fill the inputs it
// asks for (secrets in password fields: they go to the credential store), and install it
// (POST /v1/mcp/registry/install), as `coffer mcp search` and `coffer mcp install` do. Every
// string the registry sends reaches the page as text, never as markup.
import { withQuery } from '../api.js';
import { h, replace } from '../dom.js';
import { vget, vpost, field, formDialog, messageOf } from './common.js';

/** Opens the dialog; resolves with the install's body, or null when cancelled. */
export function openRegistryDialog() {
  const query = h('input', { type: 'search', placeholder: 'e.g. weather, github', autocomplete: 'off', spellcheck: 'false', 'aria-label': 'Search the registry' });
  const go = h('button', { type: 'button', on: { click: () => search() } }, 'Search');
  const results = h('div', { class: 'registry-results', 'aria-live': 'polite' });
  const setup = h('div', { class: 'registry-setup' });
  let chosen = null; // { server, option, inputs: Map(name → element), name }

  query.addEventListener('keydown', (e) => {
    if (e.key === 'Enter') { e.preventDefault(); search(); }
  });

  async function search() {
    chosen = null;
    replace(setup);
    replace(results, h('p', { class: 'muted loading' }, 'Searching…'));
    let page;
    try {
      page = await vget(withQuery('/v1/mcp/registry/servers', { search: query.value.trim(), limit: 30 }));
    } catch (e) {
      replace(results, h('div', { class: 'error-box', role: 'alert' }, `The registry could not be searched: ${messageOf(e)}`));
      return;
    }
    const items = page.items || [];
    if (!items.length) {
      replace(results, h('p', { class: 'muted' }, 'No server in the registry matches.'));
      return;
    }
    const group = `reg-${Math.random().toString(36).slice(2)}`;
    replace(results, h('ul', { class: 'plain registry-list' }, items.map((s) => {
      const id = `${group}-${items.indexOf(s)}`;
      const usable = !!s.chosen;
      const radio = h('input', { type: 'radio', name: group, id, disabled: !usable, on: { change: () => pick(s) } });
      const why = usable ? null : h('div', { class: 'small muted' }, `Cannot run here: ${reasons(s)}`);
      return h('li', { class: usable ? 'registry-item' : 'registry-item unusable' },
        radio,
        h('label', { for: id },
          h('strong', null, s.title || s.name), ' ', h('span', { class: 'muted small' }, `${s.name} ${s.version}`),
          s.description ? h('div', { class: 'small' }, s.description) : null, why));
    })));
  }

  function pick(s) {
    const options = (s.options || []).filter((o) => o.runnable);
    const select = h('select', { 'aria-label': 'How to run it' }, options.map((o) => h('option', { value: o.id }, optionText(o))));
    select.value = s.chosen;
    const name = field('Coffer name', h('input', { type: 'text', value: s.suggested_name, autocomplete: 'off', spellcheck: 'false', pattern: '[a-z0-9][a-z0-9-]{0,23}' }),
      { name: 'server', hint: 'its tools appear as NAME__TOOL' });
    const inputsBox = h('div', { class: 'registry-inputs' });
    const showInputs = () => {
      const option = options.find((o) => o.id === select.value);
      const inputs = new Map();
      const fields = (option.inputs || []).map((i) => {
        const el = i.choices && i.choices.length
          ? h('select', null, (i.required ? [] : [h('option', { value: '' }, '(default)')]).concat(i.choices.map((c) => h('option', { value: c }, c))))
          : h('input', { type: i.secret ? 'password' : 'text', autocomplete: i.secret ? 'new-password' : 'off', spellcheck: 'false', placeholder: i.default || '' });
        inputs.set(i.name, el);
        const label = `${i.name}${i.required && !i.default ? ' (required)' : ''}`;
        const hint = [i.description, i.secret ? 'secret: stored in the credential store' : null].filter(Boolean).join(' · ');
        return field(label, el, { name: i.name, hint: hint || undefined }).wrap;
      });
      replace(inputsBox, fields.length ? fields : h('p', { class: 'muted small' }, 'It asks for nothing.'));
      chosen = { server: s, option, inputs, name: name.input };
    };
    select.addEventListener('change', showInputs);
    replace(setup, h('h3', null, `Install ${s.title || s.name}`), field('Runs as', select, { name: 'option' }).wrap, name.wrap, inputsBox);
    showInputs();
  }

  const content = h('div', { class: 'registry-dialog' },
    h('div', { class: 'row' }, query, go), results, setup,
    h('p', { class: 'hint' }, 'From the MCP Registry (setting gateway.mcp_registry_url). Secrets go to the encrypted credential store; the server record holds only a reference.'));

  return formDialog('Install from the MCP Registry', content, async () => {
    if (!chosen) throw new Error('search, then pick a server to install');
    const inputs = {};
    for (const [k, el] of chosen.inputs) if (el.value !== '') inputs[k] = el.value;
    return vpost('/v1/mcp/registry/install', {
      name: chosen.server.name, server: chosen.name.value.trim() || undefined, option: chosen.option.id, inputs,
    });
  }, { submit: 'Install', wide: true });
}

/** `npm @x/y@1.2.3 via npx` or `remote (http) https://…`. */
function optionText(o) {
  if (o.kind === 'remote') return `remote (${o.transport}) ${o.url || ''}`;
  return `${o.registry_type} ${o.identifier}${o.version ? `@${o.version}` : ''} via ${o.runtime}`;
}

/** Why none of a server's options runs here. */
function reasons(s) {
  const r = (s.options || []).map((o) => o.reason).filter(Boolean);
  return r.length ? r.join('; ') : 'it offers no package and no remote';
}
