// The knowledge page (/ui/knowledge): search over the fused engines (POST /v1/knowledge/search)
// with each result's KB, path, heading, snippet and the engines that found it; the knowledge
// bases with their status, add, remove and reindex with a live progress bar; remembered facts
// (list, recall, remember, forget); skills (list and view).
import { withQuery } from '../api.js';
import { h, replace, toast } from '../dom.js';
import {
  vget, vpost, vdel, seg, errorBox, emptyState, pageHead, table, stateBadge, timeEl, tabs, setQuery, field,
  formDialog, confirmDialog, messageOf, bytes, showFieldError, cli,
} from '../vault/common.js';

const TABS = [
  { id: 'search', label: 'Search' },
  { id: 'bases', label: 'Knowledge bases' },
  { id: 'memory', label: 'Memory' },
  { id: 'skills', label: 'Skills' },
];
/**
 * How often a running index pass is polled. There is no progress stream in the API; this is the
 * one place the console polls, only while a pass runs, and it stops when the pass ends.
 */
const POLL_MS = 500;
const ACTIVE = new Set(['scanning', 'indexing']);

export function mount(root, { params }) {
  let tab = TABS.some((t) => t.id === params.get('tab')) ? params.get('tab') : 'search';
  const panel = h('div', { role: 'tabpanel' });
  let cleanup = () => {};
  const show = (id, p) => {
    tab = id;
    for (const b of bar.querySelectorAll('button')) { b.setAttribute('aria-selected', String(b.dataset.tab === id)); b.tabIndex = b.dataset.tab === id ? 0 : -1; }
    panel.setAttribute('aria-labelledby', `tab-${id}`);
    cleanup();
    replace(panel);
    cleanup = ({ search, bases, memory, skills })[id](panel, p) || (() => {});
  };
  const bar = tabs(TABS, tab, (id) => { setQuery({ tab: id === 'search' ? '' : id }); show(id, new URLSearchParams()); });
  root.append(pageHead('Knowledge', 'Your notes, remembered facts and skills: the markdown files are the truth, the indexes are derived.'), bar, panel);
  show(tab, params);
  return () => cleanup();
}

// ---------------------------------------------------------------------------------------------
// Search.

function search(panel, params) {
  const q = h('input', { type: 'search', id: 'kb-query', required: true, placeholder: 'What are you looking for?', value: params.get('q') || '', autocomplete: 'off' });
  const kb = h('select', { id: 'kb-filter' }, h('option', { value: '' }, 'All knowledge bases'));
  const out = h('div', { class: 'search-out', 'aria-live': 'polite' });
  const form = h('form', { class: 'row search-form', role: 'search' },
    h('label', { for: 'kb-query', class: 'sr-only' }, 'Search your knowledge'), q,
    h('label', { for: 'kb-filter', class: 'sr-only' }, 'Knowledge base'), kb,
    h('button', { type: 'submit', class: 'primary' }, 'Search'));
  panel.append(form, out);
  let gen = 0;
  const run = async () => {
    const query = q.value.trim();
    setQuery({ q: query, kb: kb.value });
    if (!query) { replace(out); return; }
    const mine = ++gen;
    replace(out, h('p', { class: 'muted' }, 'Searching…'));
    let r;
    try {
      r = await vpost('/v1/knowledge/search', { query, kb: kb.value ? [kb.value] : undefined, limit: 20 });
    } catch (e) {
      if (mine === gen) replace(out, errorBox(e, 'The search failed'));
      return;
    }
    if (mine !== gen) return;
    replace(out, resultsView(r, { empty: 'Nothing found. Try other words, or check that your knowledge base has been indexed.' }));
  };
  form.addEventListener('submit', (e) => { e.preventDefault(); run(); });
  (async () => {
    try {
      const list = await vget('/v1/knowledge');
      const names = (list.items || []).map((k) => k.name);
      for (const n of names) kb.appendChild(h('option', { value: n }, n));
      if (names.includes(params.get('kb'))) kb.value = params.get('kb');
      if (!(list.items || []).some((k) => k.kind !== 'memory')) {
        panel.insertBefore(emptyState('No knowledge base yet.',
          h('p', null, 'Add a folder of markdown notes under “Knowledge bases”, or in a terminal:', cli('coffer kb add NAME --path FOLDER'))), out);
      }
    } catch (e) {
      panel.insertBefore(errorBox(e, 'Could not list the knowledge bases'), out);
    }
    if (q.value.trim()) run(); else q.focus();
  })();
  return () => { gen += 1; };
}

/** A search reply: the engines (with any that failed), warnings and the fused results. */
function resultsView(r, { empty, onForget } = {}) {
  const engines = r.engines || [];
  const failed = engines.filter((e) => e.state === 'failed' || e.state === 'timeout');
  const results = r.results || [];
  return h('div', { class: 'stack' },
    h('div', { class: 'row engines', 'aria-label': 'Engines' },
      h('span', { class: 'muted small' }, `${results.length} result${results.length === 1 ? '' : 's'} in ${r.took_ms} ms`),
      engines.map((e) => h('span', { class: `badge ${e.state === 'ok' ? 'ok' : e.state === 'disabled' ? '' : 'err'}`, dataset: { engine: e.engine, state: e.state }, title: e.message || '' },
        `${e.engine}: ${e.state === 'ok' ? `${e.hits} hit${e.hits === 1 ? '' : 's'}, ${e.took_ms} ms` : e.state}`))),
    failed.map((e) => h('div', { class: 'warn-box engine-failed', role: 'status', dataset: { engine: e.engine } }, `The ${e.engine} engine ${e.state === 'timeout' ? 'timed out' : 'failed'}: ${(e.message || 'no detail').replace(/\.+$/, '')}. The other engines' results are shown.`)),
    (r.warnings || []).filter((w) => !failed.some((e) => w.includes(e.message || '\u0000'))).map((w) => h('div', { class: 'warn-box', role: 'status' }, w)),
    results.length ? h('ol', { class: 'results' }, results.map((x) => resultCard(x, onForget))) : emptyState(empty || 'Nothing found.'));
}

function resultCard(x, onForget) {
  const lines = x.line_start ? `:${x.line_start}${x.line_end && x.line_end !== x.line_start ? `-${x.line_end}` : ''}` : '';
  const heading = (x.heading_path || []).filter(Boolean);
  return h('li', { class: 'card result', dataset: { kb: x.kb, path: x.path } },
    h('div', { class: 'row result-head' },
      h('span', { class: 'badge accent result-kb' }, x.kb),
      h('strong', { class: 'result-title' }, x.fact_id ? 'Remembered fact' : (x.title || x.path)),
      h('span', { class: 'spacer' }),
      h('span', { class: 'muted small', title: 'fused score' }, Number(x.score).toFixed(4))),
    h('div', { class: 'result-path' }, h('code', { title: x.absolute_path || '' }, x.fact_id ? x.fact_id : `${x.path}${lines}`)),
    heading.length ? h('div', { class: 'result-heading muted small' }, heading.join(' › ')) : null,
    h('p', { class: 'snippet' }, highlighted(x.snippet || '')),
    h('div', { class: 'row small' },
      h('span', { class: 'muted' }, 'found by'),
      (x.ranks || []).map((k) => h('span', { class: 'badge engine', dataset: { engine: k.engine } }, `${k.engine} #${k.rank}`)),
      (x.tags || []).map((t) => h('span', { class: 'badge tag' }, `#${t}`)),
      x.fact_id && onForget ? [h('span', { class: 'spacer' }), h('button', { type: 'button', class: 'danger', on: { click: () => onForget(x.fact_id, x.snippet) } }, 'Forget')] : null));
}

/** A snippet whose matches the service marked `**like this**`, with them in <mark> (as text). */
function highlighted(snippet) {
  const parts = snippet.split('**');
  if (parts.length % 2 === 0) return snippet;
  return parts.map((p, i) => (i % 2 ? h('mark', null, p) : p));
}

// ---------------------------------------------------------------------------------------------
// Knowledge bases.

function bases(panel) {
  const list = h('div', null, h('p', { class: 'muted loading' }, 'Loading…'));
  const engines = h('div', { class: 'row engines-config' });
  const add = h('button', { type: 'button', class: 'primary', on: { click: () => addKb() } }, 'Add knowledge base');
  const all = h('button', { type: 'button', on: { click: () => reindex('') } }, 'Reindex all');
  panel.append(h('div', { class: 'row' }, engines, h('span', { class: 'spacer' }), all, add), list);
  const polls = new Map();
  let kbs = [];
  let closed = false;

  const draw = () => {
    if (!kbs.length) { replace(list, emptyState('No knowledge base yet.', 'Add a folder of markdown notes: Coffer indexes it and keeps the index up to date as the files change.')); return; }
    replace(list, table([
      { label: 'Name', cell: (k) => h('strong', null, k.name) },
      { label: 'Folder', class: 'wrap', cell: (k) => h('code', null, k.root) },
      { label: 'Documents', cell: (k) => `${k.documents} (${k.chunks} chunks${k.embedded ? `, ${k.embedded} embedded` : ''})` },
      { label: 'Last sync', cell: (k) => timeEl(k.last_sync_ms || null) },
      { label: 'Status', class: 'wrap kb-status', cell: (k) => statusView(k) },
      { label: 'Actions', cell: (k) => h('div', { class: 'row nowrap' },
        h('button', { type: 'button', class: 'reindex', on: { click: () => reindex(k.name) } }, 'Reindex'),
        k.kind === 'memory' ? null : h('button', { type: 'button', class: 'danger', on: { click: () => remove(k.name) } }, 'Remove')) },
    ], kbs, { key: (k) => k.name, caption: 'Knowledge bases' }));
  };

  const updateRow = (k) => {
    const i = kbs.findIndex((x) => x.name === k.name);
    if (i < 0) return;
    kbs[i] = k;
    const row = [...list.querySelectorAll('tr[data-key]')].find((tr) => tr.dataset.key === k.name);
    if (!row) { draw(); return; }
    const cells = row.children;
    replace(cells[2], `${k.documents} (${k.chunks} chunks${k.embedded ? `, ${k.embedded} embedded` : ''})`);
    replace(cells[3], timeEl(k.last_sync_ms || null));
    replace(cells[4], statusView(k));
  };

  /** Polls one KB while its pass runs (see POLL_MS); `since` is the job number before the pass. */
  const watch = (name, since, wasActive) => {
    if (polls.has(name) || closed) return;
    const started = Date.now();
    const tick = async () => {
      let k;
      try {
        k = await vget(`/v1/knowledge/${seg(name)}`);
      } catch (e) {
        polls.delete(name);
        if (e.status === 404) { load(); return; }
        toast(`${name}: ${messageOf(e)}`, 'error');
        return;
      }
      if (closed) return;
      updateRow(k);
      const p = k.progress || { state: 'idle', job: since };
      const active = ACTIVE.has(p.state);
      // Done when no pass runs and ours has happened (the job number moved on, or a pass was
      // already running when we asked); a request that started no pass ends after 5 s idle.
      const over = !active && (p.job > since || wasActive || Date.now() - started > 5000);
      if (over) { polls.delete(name); return; }
      polls.set(name, setTimeout(tick, POLL_MS));
    };
    polls.set(name, setTimeout(tick, POLL_MS));
  };

  async function load() {
    let r;
    try {
      r = await vget('/v1/knowledge');
    } catch (e) {
      replace(list, errorBox(e, 'Could not list the knowledge bases', load));
      return;
    }
    kbs = r.items || [];
    replace(engines, h('span', { class: 'muted small' }, 'Engines:'), (r.engines || []).map((e) => h('span', { class: `badge ${e.enabled ? 'ok' : ''}`, title: e.detail || '', dataset: { engine: e.name } }, `${e.name}${e.enabled ? '' : ' (off)'}`)));
    draw();
    for (const k of kbs) if (k.progress && ACTIVE.has(k.progress.state)) watch(k.name, k.progress.job, true);
  }

  async function reindex(name) {
    let r;
    try {
      r = await vpost('/v1/knowledge/reindex', name ? { kb: name } : {});
    } catch (e) {
      toast(messageOf(e), 'error');
      return;
    }
    for (const k of r.items || []) {
      const p = k.progress || { state: 'idle', job: 0 };
      updateRow(k);
      watch(k.name, p.job, ACTIVE.has(p.state));
    }
  }

  async function remove(name) {
    if (!await confirmDialog(`Remove ${name}?`, `Coffer forgets the knowledge base ${name} and its indexes. No file is deleted.`)) return;
    try {
      await vdel(`/v1/knowledge/${seg(name)}`);
      toast(`Removed ${name}`);
      load();
    } catch (e) {
      toast(messageOf(e), 'error');
    }
  }

  async function addKb() {
    const name = field('Name', h('input', { type: 'text', required: true, autocomplete: 'off', spellcheck: 'false' }), { name: 'name', hint: 'lower-case letters, digits, - and _' });
    const path = field('Folder', h('input', { type: 'text', autocomplete: 'off', spellcheck: 'false', placeholder: '/home/me/notes' }), { name: 'path', hint: 'absolute; empty: a new folder in Coffer\'s home' });
    const k = await formDialog('Add a knowledge base', h('div', null, name.wrap, path.wrap), async () => {
      const body = { name: name.input.value.trim() };
      if (path.input.value.trim()) body.path = path.input.value.trim();
      return vpost('/v1/knowledge', body);
    }, { submit: 'Add' });
    if (!k) return;
    toast(`Added ${k.name}: indexing`);
    await load();
    watch(k.name, 0, true);
  }

  load();
  return () => { closed = true; for (const t of polls.values()) clearTimeout(t); polls.clear(); };
}

/** A KB's state: a progress bar while a pass runs, else up to date / failed, and file errors. */
function statusView(k) {
  const p = k.progress || { state: 'idle' };
  const parts = [];
  if (ACTIVE.has(p.state)) {
    const total = p.total || 0;
    parts.push(h('div', { class: 'kb-progress', dataset: { state: p.state } },
      h('progress', { max: String(Math.max(total, 1)), value: String(p.state === 'scanning' ? 0 : p.done), 'aria-label': `Indexing ${k.name}` }),
      h('span', { class: 'small' }, p.state === 'scanning' ? 'Scanning the folder…'
        : `Indexing ${p.done} of ${total} files${p.bytes_total ? ` (${bytes(p.bytes_done)} of ${bytes(p.bytes_total)})` : ''}`)));
  } else if (p.state === 'failed') {
    parts.push(h('div', null, stateBadge('failed'), ' ', h('span', { class: 'small' }, p.message || '')));
  } else {
    parts.push(h('div', { class: 'kb-progress', dataset: { state: 'idle' } }, stateBadge('ok', k.pending ? `${k.pending} pending` : 'up to date'),
      p.job && p.total ? h('span', { class: 'muted small' }, ` last pass: ${p.done} of ${p.total} files`) : null,
      k.watching ? h('span', { class: 'muted small' }, ' · watching') : null));
  }
  if ((k.errors || []).length) {
    parts.push(h('details', { class: 'kb-errors' }, h('summary', null, `${k.errors.length} file${k.errors.length === 1 ? '' : 's'} not indexed`),
      h('ul', null, k.errors.map((e) => h('li', null, h('code', null, e.path), `: ${e.error}`)))));
  }
  return parts;
}

// ---------------------------------------------------------------------------------------------
// Memory.

function memory(panel) {
  const text = h('textarea', { rows: 2, placeholder: 'e.g. The staging database is on port 5433' });
  const tagsIn = h('input', { type: 'text', placeholder: 'work, db', autocomplete: 'off' });
  const t = field('Remember a fact', text, { name: 'text' });
  const g = field('Tags', tagsIn, { name: 'tags', hint: 'optional, comma-separated' });
  const status = h('div', { 'aria-live': 'polite' });
  const rememberForm = h('form', { class: 'card remember' }, t.wrap, g.wrap, h('div', { class: 'row' }, h('button', { type: 'submit', class: 'primary' }, 'Remember'), status));
  const recallIn = h('input', { type: 'search', id: 'recall-query', placeholder: 'Recall…', autocomplete: 'off' });
  const recallOut = h('div', { 'aria-live': 'polite' });
  const recallForm = h('form', { class: 'row search-form', role: 'search' },
    h('label', { for: 'recall-query', class: 'sr-only' }, 'Recall facts'), recallIn, h('button', { type: 'submit' }, 'Recall'));
  const facts = h('div', null, h('p', { class: 'muted loading' }, 'Loading…'));
  const more = h('div', { class: 'more' });
  panel.append(rememberForm, h('h2', null, 'Recall'), recallForm, recallOut, h('h2', null, 'Remembered facts'), facts, more);
  let tbody = null;

  const forget = async (id, shown) => {
    if (!await confirmDialog('Forget this fact?', String(shown || id).slice(0, 300), { confirm: 'Forget' })) return;
    try {
      await vdel(`/v1/memory/${seg(id)}`);
      toast('Forgotten');
      loadFacts();
      if (recallIn.value.trim()) recall();
    } catch (e) {
      toast(messageOf(e), 'error');
    }
  };
  const cols = [
    { label: 'Fact', class: 'wrap', cell: (f) => h('span', { class: 'fact-text' }, f.text) },
    { label: 'Tags', cell: (f) => (f.tags || []).map((x) => h('span', { class: 'badge tag' }, `#${x}`)) },
    { label: 'From', cell: (f) => h('span', { class: 'muted' }, f.source || '') },
    { label: 'When', cell: (f) => timeEl(f.created_ms || null) },
    { label: '', cell: (f) => h('button', { type: 'button', class: 'danger', 'aria-label': 'Forget this fact', on: { click: () => forget(f.id, f.text) } }, 'Forget') },
  ];
  async function loadFacts(cursor) {
    let page;
    try {
      page = await vget(withQuery('/v1/memory', { limit: 50, cursor }));
    } catch (e) {
      replace(facts, errorBox(e, 'Could not list the facts', () => loadFacts(cursor)));
      return;
    }
    const items = page.items || [];
    if (!cursor) {
      if (!items.length) { replace(facts, emptyState('Nothing remembered yet.', 'Facts you (or your agents, with the coffer__remember tool) remember appear here.')); tbody = null; } else {
        const tb = table(cols, items, { key: (f) => f.id, caption: 'Remembered facts' });
        tbody = tb.querySelector('tbody');
        replace(facts, tb);
      }
    } else if (tbody) {
      const tb = table(cols, items, { key: (f) => f.id });
      for (const tr of [...tb.querySelectorAll('tbody tr')]) tbody.appendChild(tr);
    }
    replace(more, page.next_cursor ? h('button', { type: 'button', on: { click: () => loadFacts(page.next_cursor) } }, 'Load older') : null);
  }
  async function recall() {
    const query = recallIn.value.trim();
    if (!query) { replace(recallOut); return; }
    replace(recallOut, h('p', { class: 'muted' }, 'Recalling…'));
    try {
      const r = await vpost('/v1/memory/recall', { query, limit: 20 });
      replace(recallOut, resultsView(r, { empty: 'No remembered fact matches.', onForget: forget }));
    } catch (e) {
      replace(recallOut, errorBox(e, 'Recall failed'));
    }
  }
  rememberForm.addEventListener('submit', async (e) => {
    e.preventDefault();
    replace(status);
    replace(t.error); replace(g.error);
    const tags = tagsIn.value.split(',').map((x) => x.trim()).filter(Boolean);
    try {
      const r = await vpost('/v1/memory', { text: text.value, tags: tags.length ? tags : undefined });
      if (r.created) {
        toast('Remembered');
        text.value = ''; tagsIn.value = '';
      } else {
        replace(status, h('span', { class: 'muted small' }, `Already remembered${r.similarity ? ` (similarity ${Number(r.similarity).toFixed(2)})` : ''}: `, r.fact ? r.fact.text : ''));
      }
      if (r.fact && r.fact.warning) toast(r.fact.warning);
      loadFacts();
    } catch (err) {
      showFieldError(rememberForm, err, status);
    }
  });
  recallForm.addEventListener('submit', (e) => { e.preventDefault(); recall(); });
  loadFacts();
  return () => {};
}

// ---------------------------------------------------------------------------------------------
// Skills.

function skills(panel, params) {
  const listEl = h('div', { class: 'skills-list' }, h('p', { class: 'muted loading' }, 'Loading…'));
  const view = h('div', { class: 'skill-view' });
  panel.append(h('div', { class: 'skills' }, listEl, view));
  let gen = 0;
  const open = async (name) => {
    setQuery({ tab: 'skills', skill: name });
    for (const b of listEl.querySelectorAll('button.skill')) b.setAttribute('aria-current', String(b.dataset.name === name));
    const mine = ++gen;
    replace(view, h('p', { class: 'muted' }, 'Loading…'));
    let s;
    try {
      s = await vget(`/v1/skills/${seg(name)}`);
    } catch (e) {
      if (mine === gen) replace(view, errorBox(e, `Could not load ${name}`));
      return;
    }
    // The markdown renderer (with its vendored parser and sanitizer) loads only when a skill is opened.
    const { renderMarkdown } = await import('../markdown.js');
    if (mine !== gen) return;
    const meta = Object.entries(s.metadata || {});
    replace(view, h('article', { class: 'card skill', dataset: { name: s.name } },
      h('h2', null, s.name),
      s.description ? h('p', { class: 'muted' }, s.description) : null,
      h('p', { class: 'small' }, h('code', null, s.path)),
      meta.length ? h('dl', { class: 'facts' }, meta.map(([k, v]) => [h('dt', null, k), h('dd', null, v)])) : null,
      h('div', { class: 'md skill-body' }, renderMarkdown(s.body || '')),
      h('details', { class: 'skill-source' }, h('summary', null, 'Source'), h('pre', null, s.body || '')),
      (s.files || []).length ? h('details', null, h('summary', null, `${s.files.length} more file${s.files.length === 1 ? '' : 's'}`),
        h('ul', null, s.files.map((f) => h('li', null, h('code', null, f))))) : null));
  };
  (async () => {
    let r;
    try {
      r = await vget('/v1/skills');
    } catch (e) {
      replace(listEl, errorBox(e, 'Could not list the skills'));
      return;
    }
    const items = r.items || [];
    const invalid = r.invalid || [];
    replace(listEl,
      items.length ? h('ul', { class: 'plain skill-items' }, items.map((s) => h('li', null,
        h('button', { type: 'button', class: 'skill', dataset: { name: s.name }, on: { click: () => open(s.name) } },
          h('strong', null, s.name), h('span', { class: 'muted small' }, s.description || ''))))) : emptyState('No skills yet.',
        h('p', null, 'A skill is a folder with a ', h('code', null, 'SKILL.md'), ' (front matter: name, description) under ', h('code', null, 'skills/'), ' in Coffer\'s home.')),
      invalid.length ? h('div', { class: 'warn-box' }, h('p', null, 'Not listed (their front matter is malformed):'),
        h('ul', null, invalid.map((i) => h('li', null, h('code', null, i.name), `: ${i.error}`)))) : null);
    const want = params.get('skill');
    if (want && items.some((s) => s.name === want)) open(want);
  })();
  return () => { gen += 1; };
}
