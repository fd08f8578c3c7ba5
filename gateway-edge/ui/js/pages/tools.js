// The tools page (/ui/tools): every tool MCP clients see through Coffer (GET /v1/tools), with
// its exposed and original names, server and enabled state; a search that filters the list
// (client-side: the list is one page), a per-tool toggle (PATCH /v1/tools/{name}) and a "Try"
// dialog that calls the tool (POST /v1/tools/call) and shows its result as text.
import { h, replace, toast } from '../dom.js';
import { breakable, description } from './servers.js';
import { vget, vpatch, vpost, seg, errorBox, emptyState, pageHead, table, toggle, messageOf, setQuery, cli } from '../vault/common.js';

export function mount(root, { params }) {
  const q = h('input', { type: 'search', id: 'tool-search', placeholder: 'Search by name, server or description', value: params.get('q') || '', autocomplete: 'off', spellcheck: 'false' });
  const server = h('select', { id: 'tool-server' }, h('option', { value: '' }, 'All servers'));
  const count = h('p', { class: 'muted small', 'aria-live': 'polite' });
  const body = h('div', null, h('p', { class: 'muted loading' }, 'Loading…'));
  const refresh = h('button', { type: 'button', on: { click: () => load() } }, 'Refresh');
  root.append(
    pageHead('Tools', 'What MCP clients see: each tool as <server>__<tool>. A disabled tool is hidden from clients and refused when called.', refresh),
    h('div', { class: 'row filters' },
      h('label', { for: 'tool-search', class: 'sr-only' }, 'Search tools'), q,
      h('label', { for: 'tool-server', class: 'sr-only' }, 'Server'), server),
    count, body);
  let items = [];

  const draw = () => {
    const needle = q.value.trim().toLowerCase();
    const srv = server.value;
    const shown = items.filter((t) => (!srv || t.server === srv)
      && (!needle || [t.name, t.original_name, t.server, t.title, t.description].some((f) => f && String(f).toLowerCase().includes(needle))));
    setQuery({ q: q.value.trim(), server: srv });
    replace(count, items.length ? `${shown.length} of ${items.length} tools` : '');
    if (!items.length) {
      replace(body, emptyState('No tools yet.',
        h('p', null, 'Tools come from your MCP servers. ', h('a', { href: '/ui/servers', 'data-nav': true }, 'Add a server'), ' or import another client\'s in a terminal:', cli('coffer mcp import CONFIG_FILE'))));
      return;
    }
    if (!shown.length) { replace(body, emptyState('No tool matches the search.', 'Try fewer words, or another server.')); return; }
    replace(body, table([
      { label: 'Tool', class: 'wrap', cell: (t) => h('div', { class: 'tool-name' }, h('code', null, breakable(t.name)), t.title ? h('div', { class: 'muted small' }, t.title) : null) },
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
      { label: '', cell: (t) => h('button', { type: 'button', disabled: !t.enabled, title: t.enabled ? 'Call this tool' : 'Enable it to call it', on: { click: () => tryTool(t) } }, 'Try') },
    ], shown, { key: (t) => t.name, caption: 'Tools' }));
  };
  q.addEventListener('input', draw);
  server.addEventListener('change', draw);

  async function load() {
    try {
      items = (await vget('/v1/tools')).items || [];
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
