// The chat page (/ui/chat, /ui/chat?c=<conversation id>): the conversation list on the left
// (collapsible; a drawer on a narrow screen) and the selected conversation's thread. Keys:
// Enter sends, Shift+Enter is a new line (on a touch screen, pointer: coarse, Enter is a new line
// and the Send button sends), Ctrl/Cmd+Enter sends now (interrupts the running turn),
// Escape in the composer stops the running turn (the "?" button shows them). Modules:
// js/chat/list.js, thread.js, render.js, dialogs.js, notify.js (the background badge).
import { patch } from '../api.js';
import { h, replace, toast } from '../dom.js';
import { mountList } from '../chat/list.js';
import { draftOf, mountThread } from '../chat/thread.js';
import * as dialogs from '../chat/dialogs.js';

/** A title for the tab's name, which cannot isolate bidi text: the direction overrides and
 * isolates (U+202A–U+202E, U+2066–U+2069) removed, so a title cannot reorder what follows. */
const plainTitle = (t) => (t || '').replace(/[\u202A-\u202E\u2066-\u2069]/g, '');

export function mount(root, { params }) {
  let thread = null;
  let current = params.get('c') || null;
  let agentList = null;
  let closed = false;

  const listBox = h('div', { class: 'convs-box' });
  const main = h('div', { class: 'thread-box' });
  const page = h('div', { class: `chat ${current ? '' : 'show-list'}` }, listBox, main);
  replace(root, page);

  const toggleList = () => {
    // Wide screens collapse the list; narrow ones open it as a drawer over the thread.
    if (window.matchMedia('(max-width: 760px)').matches) page.classList.toggle('show-list');
    else page.classList.toggle('list-collapsed');
  };

  const list = mountList(listBox, {
    onSelect: (id) => select(id, true),
    onNew: () => startNew(),
    onHelp: () => dialogs.help(),
    onChange: (c) => { if (thread && c.id === current) thread.update(c); },
    onRemoved: (id) => { if (id === current) gone(id); },
  });

  function setUrl(id, push) {
    const url = id ? `/ui/chat?c=${encodeURIComponent(id)}` : '/ui/chat';
    if (location.pathname + location.search === url) return;
    if (push) history.pushState(null, '', url);
    else history.replaceState(null, '', url);
  }

  function select(id, push) {
    if (thread) { thread.close(); thread = null; }
    current = id;
    list.select(id);
    setUrl(id, push);
    page.classList.toggle('show-list', !id);
    if (!id) { empty(); return; }
    thread = mountThread(main, id, {
      onConversation: (c) => { list.upsert(c); document.title = `Coffer — ${plainTitle(c.title) || 'Chat'}`; },
      onDeleted: (gid) => gone(gid),
      onEdit: (c) => edit(c),
      onArchive: (c, archived) => archive(c, archived),
      onDelete: (c) => remove(c),
      toggleList,
    });
    thread.focus();
  }

  function gone(id) {
    list.remove(id);
    if (current === id) {
      // Closing the thread first: it must not write the draft back once it is taken.
      if (thread) { thread.close(); thread = null; }
      const draft = draftOf(id, { take: true });
      toast('That conversation was deleted.');
      select(null, false);
      if (draft) orphan = draft;
      showOrphan();
    }
  }

  // The unsent draft of a conversation deleted while it was open: kept on the empty view,
  // to copy or discard, until another conversation opens.
  let orphan = '';
  function showOrphan() {
    if (!orphan || current) return;
    const old = main.querySelector('.draft-kept');
    if (old) old.remove();
    const text = h('textarea', { class: 'draft-text', readonly: true, rows: '4', 'aria-label': 'Your unsent draft' });
    text.value = orphan;
    const box = h('section', { class: 'draft-kept', role: 'status' },
      h('p', null, 'The conversation you were writing in was deleted. Your unsent draft:'),
      text,
      h('div', { class: 'row' },
        h('button', { type: 'button', class: 'primary', on: { click: async () => {
          try { await navigator.clipboard.writeText(orphan); toast('Copied.'); } catch { text.select(); toast('Select and copy it (Ctrl+C).'); }
        } } }, 'Copy'),
        h('button', { type: 'button', class: 'ghost', on: { click: () => { orphan = ''; box.remove(); } } }, 'Discard')));
    main.prepend(box);
  }

  async function loadAgents() {
    try { agentList = await dialogs.agents(); } catch (e) { agentList = null; toast(`Cannot list the agents: ${e.message}`, 'error'); }
    return agentList;
  }

  // No conversation selected: a prompt to start one, or what to do when no agent is available.
  async function empty() {
    replace(main, h('p', { class: 'muted loading' }, 'Loading…'));
    const agents = await loadAgents();
    if (closed || current) return;
    if (agents && !agents.some((a) => a.available)) {
      replace(main, h('div', { class: 'thread-empty-state' },
        h('button', { type: 'button', class: 'ghost list-toggle', 'aria-label': 'Show or hide the conversation list', on: { click: toggleList } }, '☰'),
        dialogs.noAgentState(agents, () => { if (!current) empty(); })));
      return;
    }
    replace(main, h('div', { class: 'thread-empty-state' },
      h('button', { type: 'button', class: 'ghost list-toggle', 'aria-label': 'Show or hide the conversation list', on: { click: toggleList } }, '☰'),
      h('div', { class: 'empty' },
        h('h2', null, 'Chat with a coding agent'),
        h('p', null, 'Pick a conversation, or start a new one.'),
        h('button', { type: 'button', class: 'primary', on: { click: () => startNew() } }, 'New conversation'))));
    showOrphan();
  }

  async function startNew() {
    const agents = await loadAgents();
    if (!agents) return;
    if (!agents.some((a) => a.available)) {
      select(null, true);
      return;
    }
    const c = await dialogs.newConversation(agents);
    if (c && !closed) { list.upsert(c); select(c.id, true); }
  }

  async function edit(c) {
    const updated = await dialogs.editConversation(c);
    if (updated && updated !== c) { list.upsert(updated); if (thread) thread.update(updated); }
  }

  async function archive(c, archived) {
    try {
      const updated = await patch(`/v1/conversations/${encodeURIComponent(c.id)}`, { archived });
      list.upsert(updated);
      if (thread) thread.update(updated);
      toast(archived ? 'Archived.' : 'Restored.');
    } catch (e) { toast(`Cannot ${archived ? 'archive' : 'restore'}: ${e.message}`, 'error'); }
  }

  async function remove(c) {
    if (await dialogs.deleteConversation(c)) gone(c.id);
  }

  const onPop = () => {
    const id = new URLSearchParams(location.search).get('c') || null;
    if (location.pathname.startsWith('/ui/chat') && id !== current) select(id, false);
  };
  window.addEventListener('popstate', onPop);

  select(current, false);

  return () => {
    closed = true;
    window.removeEventListener('popstate', onPop);
    if (thread) thread.close();
    list.close();
  };
}
