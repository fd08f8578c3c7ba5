// Chat page: the new-conversation dialog (agent picker with availability and the reason, a
// free-text model with suggestions — the bound LLM connection's models when the agent is bound
// to one, else a fixed list; empty is the agent's (or connection's) default —, a working directory),
// rename/model, delete confirmation, keyboard help, and the empty state when no agent is
// available (how to install one, or where Coffer should look for it).
import { ApiError, del, get, patch, post } from '../api.js';
import { h, replace } from '../dom.js';
import { MODES } from './approvals.js';

/** Model names offered per agent (any text is accepted; empty = the agent's own default). */
const SUGGESTIONS = {
  claude_code: ['sonnet', 'opus', 'haiku', 'claude-sonnet-4-5', 'claude-opus-4-1'],
  codex: ['gpt-5-codex', 'gpt-5', 'o4-mini'],
};

/**
 * The model ids of LLM connection `name` (`GET /v1/llm/connections/{name}/models`), [] when they
 * cannot be read (no such route yet, the provider failed, no list).
 */
async function connectionModels(name) {
  try {
    const r = await get(`/v1/llm/connections/${encodeURIComponent(name)}/models`);
    const ids = Array.isArray(r && r.models) ? r.models : [];
    return ids.map((m) => (typeof m === 'string' ? m : m && m.id)).filter((m) => typeof m === 'string' && m !== '');
  } catch {
    return [];
  }
}

/** How to get each shipped agent, and the setting naming its CLI. */
const INSTALL = {
  claude_code: { cmd: 'npm install -g @anthropic-ai/claude-code', setting: 'chat.claude_code_path', bin: 'claude' },
  codex: { cmd: 'npm install -g @openai/codex', setting: 'chat.codex_path', bin: 'codex' },
};

/** A modal that stays open until `onSubmit(form)` resolves true (errors are shown in it). */
function modal(titleText, body, { submit = 'Save', onSubmit, danger = false, cancel = true }) {
  return new Promise((resolve) => {
    const error = h('div', { class: 'error-box', role: 'alert', hidden: true });
    const ok = h('button', { type: 'submit', class: danger ? 'danger' : 'primary' }, submit);
    const form = h('form', { method: 'dialog', class: 'dialog-form' }, h('h2', null, titleText), body, error,
      h('div', { class: 'actions' },
        cancel ? h('button', { type: 'button', class: 'ghost', on: { click: () => d.close() } }, 'Cancel') : null, ok));
    const d = h('dialog', { class: 'modal' }, form);
    let result = null;
    form.addEventListener('submit', async (e) => {
      e.preventDefault();
      ok.disabled = true;
      error.hidden = true;
      try {
        const r = await onSubmit(form);
        if (r !== false) { result = r; d.close(); }
      } catch (err) {
        error.hidden = false;
        error.textContent = err instanceof ApiError ? err.message : String(err.message || err);
      } finally {
        ok.disabled = false;
      }
    });
    d.addEventListener('close', () => { d.remove(); resolve(result); });
    document.body.appendChild(d);
    d.showModal();
  });
}

/** The agents (`GET /v1/agents`). */
export async function agents() {
  return (await get('/v1/agents')).items;
}

/**
 * The empty state when no agent is available: each agent's reason, how to install it, and a
 * field to tell Coffer where its CLI is (`PATCH /v1/settings`). `onChanged()` after a save.
 */
export function noAgentState(list, onChanged) {
  const rows = list.map((a) => {
    const how = INSTALL[a.agent_key];
    const path = h('input', { type: 'text', id: `path-${a.agent_key}`, placeholder: how ? `/usr/local/bin/${how.bin}` : '/path/to/cli', autocomplete: 'off' });
    const msg = h('p', { class: 'hint', role: 'status' });
    const save = async (e) => {
      e.preventDefault();
      try {
        await patch('/v1/settings', { set: { [how.setting]: path.value.trim() } });
        msg.textContent = 'Saved; checking…';
        // The chat service picks the setting up from the store's change stream: look a few
        // times, briefly, then say what it found.
        for (let i = 0; i < 10; i += 1) {
          const now = await agents();
          const mine = now.find((x) => x.agent_key === a.agent_key);
          if (mine && mine.available) { onChanged(); return; }
          if (i === 9) { msg.textContent = `Saved, but: ${mine ? mine.reason : 'not listed'}`; return; }
          await new Promise((r) => { setTimeout(r, 300); });
        }
      } catch (err) { msg.textContent = err.message; }
    };
    return h('li', { class: 'card agent-help' },
      h('h3', null, a.display_name || a.agent_key),
      h('p', { class: 'muted' }, a.reason || 'not available'),
      how ? [
        h('p', null, 'Install it: ', h('code', null, how.cmd), ', then make sure ', h('code', null, how.bin), ' is on the daemon\'s PATH (restart it with ', h('code', null, 'coffer daemon restart'), ').'),
        h('form', { class: 'row', on: { submit: save } },
          h('label', { for: `path-${a.agent_key}` }, 'Or tell Coffer where it is ', h('span', { class: 'hint' }, `(${how.setting})`)),
          path, h('button', { type: 'submit' }, 'Save')),
        msg,
      ] : null);
  });
  return h('section', { class: 'no-agent' },
    h('h2', null, 'No coding agent is available'),
    h('p', null, 'Chat drives a coding agent’s CLI on this machine (Claude Code or Codex). None was found:'),
    h('ul', { class: 'agent-helps' }, rows),
    h('p', { class: 'hint' }, 'Settings are also on the ', h('a', { href: '/ui/settings', 'data-nav': '' }, 'Settings page'), '.'));
}

/**
 * The project picker above the working-directory field: recent folders and git repositories
 * (`GET /v1/projects`) as buttons that fill the field (typing a path stays possible: it clears
 * the pick), and the same paths as the field's suggestions. Filled in when the list arrives; a
 * failed list leaves only the field.
 */
function projectPicker(cwd) {
  const box = h('div', { class: 'project-picks', role: 'group', 'aria-label': 'Projects' });
  const paths = h('datalist', { id: 'project-paths' });
  const wrap = h('div', { class: 'project-picker' }, box, paths);
  const press = (btn) => { for (const b of box.children) b.setAttribute('aria-pressed', String(b === btn)); };
  cwd.addEventListener('input', () => press(null));
  const chip = (label, path, title) => {
    const b = h('button', { type: 'button', class: 'ghost', 'aria-pressed': 'false', title, dataset: { path },
      on: { click: () => { cwd.value = path; press(b); } } }, label);
    return b;
  };
  get('/v1/projects?limit=30').then((r) => {
    const items = (r && r.items) || [];
    const why = (p) => (p.sources || []).map((s) => ({ conversation: 'used in Coffer', claude_code: 'Claude Code session', codex: 'Codex session', git: 'git repository' }[s] || s)).join(', ');
    replace(box, [chip('Coffer workspace', '', 'The default: COFFER_HOME/workspace'),
      ...items.map((p) => chip(`${p.git ? '⎇ ' : ''}${p.name}`, p.path, `${p.path} — ${why(p)}`))]);
    press(box.firstChild);
    replace(paths, items.map((p) => h('option', { value: p.path }, p.name)));
  }).catch(() => {});
  return wrap;
}

/** The new-conversation dialog → the created conversation, or null. `models`: names in use. */
export async function newConversation(list, models = []) {
  const available = list.filter((a) => a.available);
  const agentSel = h('select', { id: 'new-agent', name: 'agent_key', required: true },
    list.map((a) => h('option', { value: a.agent_key, disabled: !a.available, selected: a === available[0] },
      a.available ? `${a.display_name}${a.version ? ` (${a.version})` : ''}` : `${a.display_name} — unavailable`)));
  const reason = h('p', { class: 'hint agent-reason' });
  const listEl = h('datalist', { id: 'model-suggestions' });
  const model = h('input', { id: 'new-model', name: 'model', list: 'model-suggestions', autocomplete: 'off', placeholder: 'the agent’s default' });
  const cwd = h('input', { id: 'new-cwd', name: 'cwd', autocomplete: 'off', list: 'project-paths', placeholder: 'default: the Coffer workspace' });
  const picks = projectPicker(cwd);
  const mode = h('select', { id: 'new-mode', name: 'permission_mode' },
    h('option', { value: '' }, 'The agent’s default'),
    MODES.map((m) => h('option', { value: m.value }, `${m.label} — ${m.hint}`)));
  const titleIn = h('input', { id: 'new-title', name: 'title', autocomplete: 'off', placeholder: 'from the first message', maxlength: '200' });
  const why = list.filter((a) => !a.available).map((a) => h('li', null, h('strong', null, a.display_name), ': ', a.reason));
  // A bound agent (its `binding`: the LLM connection it runs on) is offered that connection's
  // models; an unbound one, or when the connection's list cannot be read, the fixed suggestions.
  const fetched = new Map();
  const suggest = (names) => replace(listEl, [...new Set(names)].filter(Boolean).map((n) => h('option', { value: n })));
  const refresh = () => {
    const key = agentSel.value;
    const a = list.find((x) => x.agent_key === key);
    const b = a && a.binding;
    const runs = a && a.command ? `Runs ${a.command}` : '';
    const bound = b ? `on the LLM connection ${b.connection}${b.model ? ` (model ${b.model})` : ''}` : '';
    reason.textContent = [runs, bound].filter(Boolean).join(', ') + (b && b.problem ? ` — ${b.problem}` : '');
    model.placeholder = b && b.model ? `the connection’s model (${b.model})` : 'the agent’s default';
    const fixed = [...(SUGGESTIONS[key] || []), ...models];
    if (!b) { suggest(fixed); return; }
    const pinned = [b.model, b.fast_model];
    const show = (ids) => suggest(ids.length ? [...pinned, ...ids, ...models] : [...pinned, ...fixed]);
    if (fetched.has(b.connection)) { show(fetched.get(b.connection)); return; }
    show([]);
    connectionModels(b.connection).then((ids) => {
      fetched.set(b.connection, ids);
      if (agentSel.value === key) show(ids);
    });
  };
  agentSel.addEventListener('change', refresh);
  refresh();
  const body = h('div', null,
    h('label', { for: 'new-agent' }, 'Agent'), agentSel, reason,
    why.length ? h('details', { class: 'unavailable' }, h('summary', null, `${why.length} unavailable`), h('ul', null, why)) : null,
    h('label', { for: 'new-model' }, 'Model ', h('span', { class: 'hint' }, '(any name the agent accepts; empty = its default)')), model, listEl,
    h('label', { for: 'new-cwd' }, 'Project ', h('span', { class: 'hint' }, '(pick one, or type an absolute path)')), picks, cwd,
    h('label', { for: 'new-mode' }, 'Permission mode ', h('span', { class: 'hint' }, '(what the agent may do without asking)')), mode,
    h('label', { for: 'new-title' }, 'Title ', h('span', { class: 'hint' }, '(optional)')), titleIn);
  return modal('New conversation', body, {
    submit: 'Start',
    onSubmit: async () => {
      const req = { agent_key: agentSel.value, agent_config: {} };
      if (model.value.trim()) req.agent_config.model = model.value.trim();
      if (cwd.value.trim()) req.agent_config.cwd = cwd.value.trim();
      if (mode.value) req.agent_config.permission_mode = mode.value;
      if (titleIn.value.trim()) req.title = titleIn.value.trim();
      return post('/v1/conversations', req);
    },
  });
}

/** Rename / set the model → the updated conversation, or null. */
export function editConversation(conv) {
  const t = h('input', { id: 'edit-title', name: 'title', value: conv.title || '', maxlength: '200', required: true, autocomplete: 'off' });
  const m = h('input', { id: 'edit-model', name: 'model', value: (conv.agent_config || {}).model || '', list: 'edit-models', autocomplete: 'off', placeholder: 'the agent’s default' });
  const dl = h('datalist', { id: 'edit-models' }, (SUGGESTIONS[conv.agent_key] || []).map((n) => h('option', { value: n })));
  const body = h('div', null, h('label', { for: 'edit-title' }, 'Title'), t,
    h('label', { for: 'edit-model' }, 'Model ', h('span', { class: 'hint' }, '(empty = the agent’s default; applies from the next turn)')), m, dl);
  return modal('Rename conversation', body, {
    onSubmit: async () => {
      const change = {};
      if (t.value.trim() !== conv.title) change.title = t.value.trim();
      if (m.value.trim() !== ((conv.agent_config || {}).model || '')) change.model = m.value.trim();
      if (!Object.keys(change).length) return conv;
      return patch(`/v1/conversations/${encodeURIComponent(conv.id)}`, change, { headers: { 'If-Match': `"${conv.version}"` } });
    },
  });
}

/** Confirms and deletes → true when deleted. */
export function deleteConversation(conv) {
  const body = h('p', null, 'Delete “', h('strong', null, conv.title || 'Untitled conversation'), '” and all its messages? This cannot be undone.');
  return modal('Delete conversation', body, {
    submit: 'Delete', danger: true,
    onSubmit: async () => { await del(`/v1/conversations/${encodeURIComponent(conv.id)}`); return true; },
  });
}

/** The keyboard help. */
export function help() {
  const k = (key, what) => h('tr', null, h('td', null, h('kbd', null, key)), h('td', null, what));
  const body = h('div', null,
    h('table', null, h('tbody', null,
      k('Enter', 'send the message (during a turn it is queued)'),
      k('Ctrl+Enter', 'during a turn: send now — interrupt the turn and run this message next (⌘+Enter on a Mac)'),
      k('Shift+Enter', 'a new line'),
      k('Escape', 'in the composer: stop the running turn'),
      k('a / d', 'allow / deny the focused approval request, else the newest waiting one'),
      k('Tab', 'move between the list, the thread and the composer'))),
    h('p', { class: 'hint' }, 'Messages sent while a turn runs wait in the pending queue, one turn each, in order. Edit takes one back into the composer; sending it puts it at the end of the queue. After a stop, an error or a restart the waiting messages pause (Resume or Discard), and a new message runs at once. The bell in the list turns on browser notifications for turns that end while the tab is in the background; the tab\'s title counts them.'));
  // Nothing to cancel: one button closes it (as Escape does).
  return modal('Chat keys', body, { submit: 'Close', onSubmit: async () => true, cancel: false });
}
