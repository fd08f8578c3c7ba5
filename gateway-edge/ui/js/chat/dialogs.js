// Chat page: the new-conversation dialog (agent picker with availability and the reason, the
// model picker of js/chat/model.js — the same list and default as the thread header's —, a
// working directory), rename, delete confirmation, keyboard help, and the empty state when no agent is
// available (how to install one, or where Coffer should look for it). The new-conversation
// dialog's second tab, "Continue a session", lists the user's own Claude Code and Codex
// sessions (`GET /v1/agent-sessions`) and imports the picked one (`POST /v1/conversations/import`),
// or opens the conversation already bound to it.
import { ApiError, del, get, patch, post } from '../api.js';
import { ago, h, replace } from '../dom.js';
import { MODES } from './approvals.js';
import { modelPicker } from './model.js';

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
        h('p', null, 'Install it: ', h('code', null, how.cmd), ', then make sure ', h('code', null, how.bin), ' is on the daemon\'s PATH (restart it with ', h('code', { 'data-cli': '' }, 'coffer daemon restart'), ').'),
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

/** The agents whose sessions can be continued, by key. */
const SESSION_AGENTS = { claude_code: 'Claude Code', codex: 'Codex' };

/** The last two components of a folder (`src/billing`), for a row that must stay short. */
function shortFolder(path) {
  if (!path) return 'folder unknown';
  const parts = path.split('/').filter(Boolean);
  return parts.length > 2 ? `…/${parts.slice(-2).join('/')}` : path;
}

/** The conversation id a 409 of `POST /v1/conversations/import` names ("…as conversation 01J…"). */
function boundConversation(err) {
  const m = /conversation ([0-9A-HJKMNP-TV-Z]{26})/.exec((err && err.message) || '');
  return m ? m[1] : null;
}

/**
 * The "Continue a session" panel: the user's own agent sessions (agent, folder, first prompt,
 * when, how many messages; one already in Coffer is marked), filtered by the text typed, one
 * picked at a time (click; double-click or Enter continues at once). Loaded on first `load()`.
 * Returns {el, load(), picked(), focus()}.
 */
function sessionPicker(onPick, onContinue) {
  let sessions = [];
  let chosen = null;
  let loaded = false;
  const filter = h('input', { type: 'search', id: 'session-filter', placeholder: 'Filter by folder, prompt or agent', autocomplete: 'off', 'aria-label': 'Filter sessions' });
  const listEl = h('div', { class: 'session-list', role: 'listbox', 'aria-label': 'Your agent sessions' });
  const note = h('p', { class: 'hint session-note', role: 'status' }, 'Looking for your sessions…');
  const el = h('div', { class: 'session-picker', hidden: true }, filter, listEl, note);

  const row = (s) => {
    const agent = SESSION_AGENTS[s.agent_key] || s.agent_key;
    const count = `${s.message_count}${s.partial ? '+' : ''} message${s.message_count === 1 ? '' : 's'}`;
    const b = h('button', {
      type: 'button', class: 'session-row', role: 'option', 'aria-selected': 'false',
      title: `${s.cwd || 'folder unknown'} — ${agent} session ${s.session_id}`,
      dataset: { sessionId: s.session_id, agent: s.agent_key },
      on: {
        click: () => { chosen = s; for (const x of listEl.children) x.setAttribute('aria-selected', String(x === b)); onPick(s); },
        dblclick: () => onContinue(),
      },
    },
    h('span', { class: 'session-head' },
      h('span', { class: `badge agent-${s.agent_key}` }, agent),
      h('span', { class: 'session-folder' }, shortFolder(s.cwd)),
      s.conversation_id ? h('span', { class: 'badge accent', title: 'Already a conversation here: it opens' }, 'in Coffer') : null),
    h('span', { class: 'session-prompt' }, s.first_prompt || '(no prompt read)'),
    h('span', { class: 'session-meta hint' }, `${ago(s.last_activity_ms)} · ${count}`));
    return b;
  };

  const render = () => {
    const q = filter.value.trim().toLowerCase();
    const shown = sessions.filter((s) => !q || [s.first_prompt, s.cwd, s.agent_key, SESSION_AGENTS[s.agent_key], s.session_id]
      .some((t) => (t || '').toLowerCase().includes(q)));
    replace(listEl, shown.map(row));
    if (chosen && !shown.includes(chosen)) { chosen = null; onPick(null); }
    for (const x of listEl.children) x.setAttribute('aria-selected', String(!!chosen && x.dataset.sessionId === chosen.session_id));
    if (!sessions.length) note.textContent = 'No Claude Code or Codex sessions were found for this user (~/.claude/projects, ~/.codex/sessions).';
    else if (!shown.length) note.textContent = `None of your ${sessions.length} sessions matches “${filter.value.trim()}”.`;
    else note.textContent = shown.length === sessions.length ? `${sessions.length} session${sessions.length === 1 ? '' : 's'}, newest first.` : `${shown.length} of ${sessions.length} sessions.`;
  };
  filter.addEventListener('input', render);
  filter.addEventListener('keydown', (e) => { if (e.key === 'Enter') { e.preventDefault(); if (chosen) onContinue(); } });

  return {
    el,
    picked: () => chosen,
    focus: () => filter.focus(),
    async load() {
      if (loaded) return;
      loaded = true;
      try {
        const r = await get('/v1/agent-sessions?limit=200');
        sessions = (r && r.items) || [];
        render();
        if (r && (r.skipped_files || r.truncated)) {
          note.textContent += `${r.truncated ? ' Only the newest 200 are listed.' : ''}${r.skipped_files ? ` ${r.skipped_files} unreadable transcript${r.skipped_files === 1 ? '' : 's'} skipped.` : ''}`;
        }
      } catch (e) {
        loaded = false;
        note.textContent = `Cannot list your sessions: ${e.message}`;
      }
    },
  };
}

/**
 * Continues session `s`: imports it (`POST /v1/conversations/import`) → the new conversation;
 * one already bound (listed, or a 409 naming it) → that conversation. Other errors throw (the
 * dialog shows them).
 */
async function continueSession(s) {
  const open = async (id) => (await get(`/v1/conversations/${encodeURIComponent(id)}?messages=1`)).conversation;
  if (s.conversation_id) return open(s.conversation_id);
  try {
    return await post('/v1/conversations/import', { agent_key: s.agent_key, session_id: s.session_id });
  } catch (e) {
    const id = e instanceof ApiError && e.status === 409 ? boundConversation(e) : null;
    if (id) return open(id);
    throw e;
  }
}

/** The new-conversation dialog → the created conversation, or null. */
export async function newConversation(list) {
  const available = list.filter((a) => a.available);
  const agentSel = h('select', { id: 'new-agent', name: 'agent_key', required: true },
    list.map((a) => h('option', { value: a.agent_key, disabled: !a.available, selected: a === available[0] },
      a.available ? `${a.display_name}${a.version ? ` (${a.version})` : ''}` : `${a.display_name} — unavailable`)));
  const reason = h('p', { class: 'hint agent-reason' });
  const model = modelPicker({ id: 'new-model', label: 'Model' });
  const cwd = h('input', { id: 'new-cwd', name: 'cwd', autocomplete: 'off', list: 'project-paths', placeholder: 'default: the Coffer workspace' });
  const picks = projectPicker(cwd);
  const mode = h('select', { id: 'new-mode', name: 'permission_mode' },
    h('option', { value: '' }, 'The agent’s default'),
    MODES.map((m) => h('option', { value: m.value }, `${m.label} — ${m.hint}`)));
  const titleIn = h('input', { id: 'new-title', name: 'title', autocomplete: 'off', placeholder: 'from the first message', maxlength: '200' });
  const why = list.filter((a) => !a.available).map((a) => h('li', null, h('strong', null, a.display_name), ': ', a.reason));
  // The model picker offers the agent's models: its bound connection's, or its own names.
  const refresh = () => {
    const key = agentSel.value;
    const a = list.find((x) => x.agent_key === key);
    const b = a && a.binding;
    const runs = a && a.command ? `Runs ${a.command}` : '';
    const bound = b ? `on the LLM connection ${b.connection}${b.model ? ` (model ${b.model})` : ''}` : '';
    reason.textContent = [runs, bound].filter(Boolean).join(', ') + (b && b.problem ? ` — ${b.problem}` : '');
    model.set(model.value(), a || null);
  };
  agentSel.addEventListener('change', refresh);
  refresh();
  // Two tabs: a new conversation, or one of the user's own sessions continued.
  let tab = 'new';
  const submitBtn = () => body.closest('form')?.querySelector('button[type="submit"]');
  const sessions = sessionPicker(
    () => { const b = submitBtn(); if (b) b.textContent = sessions.picked()?.conversation_id ? 'Open' : 'Continue'; },
    () => body.closest('form')?.requestSubmit());
  const tabBtn = (key, label) => h('button', {
    type: 'button', role: 'tab', class: 'ghost', id: `tab-${key}`, 'aria-selected': String(key === 'new'),
    on: { click: () => show(key) },
  }, label);
  const tabs = h('div', { class: 'dialog-tabs', role: 'tablist' }, tabBtn('new', 'New'), tabBtn('sessions', 'Continue a session'));
  const fresh = h('div', { class: 'new-fields' },
    h('label', { for: 'new-agent' }, 'Agent'), agentSel, reason,
    why.length ? h('details', { class: 'unavailable' }, h('summary', null, `${why.length} unavailable`), h('ul', null, why)) : null,
    h('label', { for: 'new-model' }, 'Model ', h('span', { class: 'hint' }, '(pick one, or type any name the agent accepts)')), model.el,
    h('label', { for: 'new-cwd' }, 'Project ', h('span', { class: 'hint' }, '(pick one, or type an absolute path)')), picks, cwd,
    h('label', { for: 'new-mode' }, 'Permission mode ', h('span', { class: 'hint' }, '(what the agent may do without asking)')), mode,
    h('label', { for: 'new-title' }, 'Title ', h('span', { class: 'hint' }, '(optional)')), titleIn);
  const body = h('div', null, tabs, fresh, sessions.el);
  function show(key) {
    tab = key;
    for (const b of tabs.children) b.setAttribute('aria-selected', String(b.id === `tab-${key}`));
    fresh.hidden = key !== 'new';
    sessions.el.hidden = key !== 'sessions';
    const b = submitBtn();
    if (b) b.textContent = key === 'new' ? 'Start' : (sessions.picked()?.conversation_id ? 'Open' : 'Continue');
    if (key === 'sessions') { sessions.load(); sessions.focus(); }
  }
  return modal('New conversation', body, {
    submit: 'Start',
    onSubmit: async () => {
      if (tab === 'sessions') {
        const s = sessions.picked();
        if (!s) throw new Error('Pick one of your sessions first.');
        return continueSession(s);
      }
      const req = { agent_key: agentSel.value, agent_config: {} };
      if (model.value()) req.agent_config.model = model.value();
      if (cwd.value.trim()) req.agent_config.cwd = cwd.value.trim();
      if (mode.value) req.agent_config.permission_mode = mode.value;
      if (titleIn.value.trim()) req.title = titleIn.value.trim();
      return post('/v1/conversations', req);
    },
  });
}

/** Rename → the updated conversation, or null (the model is changed in the thread header). */
export function editConversation(conv) {
  const t = h('input', { id: 'edit-title', name: 'title', value: conv.title || '', maxlength: '200', required: true, autocomplete: 'off' });
  const body = h('div', null, h('label', { for: 'edit-title' }, 'Title'), t);
  return modal('Rename conversation', body, {
    submit: 'Rename',
    onSubmit: async () => {
      if (t.value.trim() === conv.title) return conv;
      return patch(`/v1/conversations/${encodeURIComponent(conv.id)}`, { title: t.value.trim() }, { headers: { 'If-Match': `"${conv.version}"` } });
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
