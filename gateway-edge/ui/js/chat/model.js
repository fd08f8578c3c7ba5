// Chat page: the model picker, one component for the thread header and the new-conversation
// dialog, so that both offer the same models and show the same default. It is a combobox (ARIA
// 1.2: an input with a popup listbox; any name the agent accepts may be typed, the list only
// suggests). Its models are those of the LLM connection the agent is bound to
// (`GET /v1/agents` → `binding`; `GET /v1/llm/connections/{name}/models` → `items[].id`), the
// connection's own model and fast model first; an unbound agent (its own login), or a
// connection whose list cannot be read, offers the agent's known model names. The first option
// is always the default (empty: the connection's model, else the agent's own default).
import { get } from '../api.js';
import { h, replace } from '../dom.js';

/** Model names offered per agent that runs on its own login (any text is accepted). */
export const SUGGESTIONS = {
  claude_code: ['sonnet', 'opus', 'haiku', 'claude-sonnet-4-5', 'claude-opus-4-1'],
  codex: ['gpt-5-codex', 'gpt-5', 'o4-mini'],
};

/** Longest model name the picker sends (the daemon checks it too). */
const MAX_MODEL = 256;

let agentsFetch = null; // {at, promise}

/** The agents (`GET /v1/agents`), fetched at most every 10 s by the pickers of one tab. */
export function agentList() {
  if (!agentsFetch || Date.now() - agentsFetch.at > 10_000) {
    const promise = get('/v1/agents').then((r) => r.items || []);
    agentsFetch = { at: Date.now(), promise };
    promise.catch(() => { agentsFetch = null; });
  }
  return agentsFetch.promise;
}

const listed = new Map(); // connection name → {at, promise of ids}

/**
 * The model ids LLM connection `name` lists, [] when they cannot be read (the provider failed,
 * it has no list); remembered for a minute.
 */
export function connectionModels(name) {
  const hit = listed.get(name);
  if (hit && Date.now() - hit.at < 60_000) return hit.promise;
  const promise = get(`/v1/llm/connections/${encodeURIComponent(name)}/models`)
    .then((r) => (Array.isArray(r && r.items) ? r.items : []).map((m) => m && m.id).filter((m) => typeof m === 'string' && m !== ''))
    .catch(() => []);
  listed.set(name, { at: Date.now(), promise });
  return promise;
}

/**
 * What `agent` (an item of `GET /v1/agents`, or null) runs when a conversation names no model:
 * `{text, title}` for the picker's default option and placeholder.
 */
export function defaultOf(agent) {
  const b = agent && agent.binding;
  if (b && b.model) return { text: `Default: ${b.model}`, title: `The model of the LLM connection ${b.connection}` };
  if (b) return { text: 'Default', title: `The LLM connection ${b.connection} names no model: the agent picks` };
  return { text: 'Default', title: 'The agent’s own default model (its own login)' };
}

/** The model names offered for `agent` (deduplicated, in order). */
export async function choicesOf(agent) {
  const b = agent && agent.binding;
  const own = (agent && SUGGESTIONS[agent.agent_key]) || [];
  if (!b) return own;
  const ids = await connectionModels(b.connection);
  return [...new Set([b.model, b.fast_model, ...(ids.length ? ids : own)].filter(Boolean))];
}

let seq = 0;

/**
 * A model combobox. `opts`: {id, label (accessible name), onCommit(model) (optional: called when
 * the person picks or types a new value and leaves it; '' = the default)}. Returns
 * {el, input, value(), set(model, agent)}: `set` shows a conversation's model (or '' for the
 * default) and loads `agent`'s choices.
 */
export function modelPicker({ id, label = 'Model', onCommit = null }) {
  const n = ++seq;
  const listId = `model-list-${n}`;
  let committed = '';
  let agent = null;
  let choices = [];
  let active = -1;
  let filtering = false;
  const input = h('input', {
    id: id || `model-input-${n}`, class: 'model-input', type: 'text', role: 'combobox', 'aria-label': label,
    'aria-autocomplete': 'list', 'aria-expanded': 'false', 'aria-controls': listId, autocomplete: 'off',
    spellcheck: 'false', maxlength: String(MAX_MODEL), placeholder: 'Default',
  });
  const toggle = h('button', { type: 'button', class: 'model-toggle ghost', tabindex: '-1', 'aria-label': `Show the ${label.toLowerCase()} list`, title: 'Models' }, '▾');
  const list = h('ul', { id: listId, class: 'model-list', role: 'listbox', 'aria-label': label, hidden: true });
  const el = h('span', { class: 'model-pick' }, input, toggle, list);

  const options = () => {
    const typed = input.value.trim().toLowerCase();
    const names = filtering && typed ? choices.filter((c) => c.toLowerCase().includes(typed)) : choices;
    const def = defaultOf(agent);
    return [{ value: '', text: def.text, title: def.title }, ...names.map((c) => ({ value: c, text: c, title: c }))];
  };

  function render() {
    const opts = options();
    replace(list, opts.map((o, i) => h('li', {
      id: `${listId}-${i}`, role: 'option', class: o.value === '' ? 'model-default' : null,
      'aria-selected': String(o.value === committed), title: o.title, dataset: { value: o.value, active: String(i === active) },
      on: { mousedown: (e) => e.preventDefault(), click: () => choose(o.value) },
    }, o.text)));
    if (active >= 0 && opts[active]) input.setAttribute('aria-activedescendant', `${listId}-${active}`);
    else input.removeAttribute('aria-activedescendant');
    return opts;
  }

  // The list is fixed-positioned under (or above) the input, so that a scrolling row of header
  // actions (the phone's) cannot clip it.
  function place() {
    const r = input.getBoundingClientRect();
    const width = Math.min(Math.max(r.width + 28, 240), window.innerWidth - 16);
    const left = Math.max(8, Math.min(r.left, window.innerWidth - width - 8));
    const below = window.innerHeight - r.bottom - 8;
    const above = r.top - 8;
    const up = below < 160 && above > below;
    list.style.setProperty('--model-list-left', `${left}px`);
    list.style.setProperty('--model-list-width', `${width}px`);
    list.style.setProperty('--model-list-top', up ? 'auto' : `${r.bottom + 4}px`);
    list.style.setProperty('--model-list-bottom', up ? `${window.innerHeight - r.top + 4}px` : 'auto');
    list.style.setProperty('--model-list-max', `${Math.max(120, Math.min(320, up ? above : below))}px`);
  }

  function open() {
    if (!list.hidden) return;
    active = -1;
    render();
    list.hidden = false;
    input.setAttribute('aria-expanded', 'true');
    place();
    window.addEventListener('resize', close);
    document.addEventListener('scroll', onScroll, true);
  }
  function close() {
    if (list.hidden) return;
    list.hidden = true;
    filtering = false;
    active = -1;
    input.setAttribute('aria-expanded', 'false');
    input.removeAttribute('aria-activedescendant');
    window.removeEventListener('resize', close);
    document.removeEventListener('scroll', onScroll, true);
  }
  function onScroll(e) { if (e.target !== list) close(); }

  function choose(value) {
    input.value = value;
    close();
    commit();
  }
  function commit() {
    const v = input.value.trim();
    if (v === committed) { input.value = committed; return; }
    if (!onCommit) { committed = v; return; }
    onCommit(v);
  }

  input.addEventListener('focus', () => input.select());
  input.addEventListener('click', () => open());
  input.addEventListener('input', () => { filtering = true; active = -1; if (list.hidden) open(); else render(); });
  input.addEventListener('blur', () => { close(); if (onCommit) commit(); });
  toggle.addEventListener('mousedown', (e) => e.preventDefault());
  toggle.addEventListener('click', () => { if (list.hidden) { input.focus(); open(); } else close(); });
  input.addEventListener('keydown', (e) => {
    if (e.isComposing) return;
    const count = list.hidden ? 0 : options().length;
    if (e.key === 'ArrowDown' || e.key === 'ArrowUp') {
      e.preventDefault();
      if (list.hidden) { open(); return; }
      active = e.key === 'ArrowDown' ? (active + 1) % count : (active <= 0 ? count - 1 : active - 1);
      render();
      const a = list.querySelector('[data-active="true"]');
      if (a) a.scrollIntoView({ block: 'nearest' });
    } else if (e.key === 'Enter') {
      // Enter picks the highlighted option, else keeps what was typed; in a form it does not
      // submit it while the list is open.
      if (!list.hidden && active >= 0) { e.preventDefault(); choose(options()[active].value); return; }
      if (!list.hidden) { e.preventDefault(); close(); }
      if (onCommit) { e.preventDefault(); commit(); }
    } else if (e.key === 'Escape') {
      if (!list.hidden) { e.preventDefault(); e.stopPropagation(); close(); }
      else if (onCommit && input.value !== committed) { e.preventDefault(); input.value = committed; }
    }
  });

  return {
    el,
    input,
    /** The picked model: '' for the default. */
    value: () => input.value.trim(),
    /** Shows `model` ('' = the default) and loads the choices of `a` (an agent, or null). */
    async set(model, a) {
      committed = model || '';
      if (document.activeElement !== input) input.value = committed;
      const changed = a !== agent;
      agent = a;
      const def = defaultOf(agent);
      input.placeholder = def.text;
      input.title = committed ? `Model: ${committed}` : def.title;
      if (!changed) return;
      const want = agent;
      const got = await choicesOf(agent);
      if (agent !== want) return;
      choices = got;
      el.dataset.loaded = 'true';
      if (!list.hidden) render();
    },
  };
}
