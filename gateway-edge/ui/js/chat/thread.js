// Chat page: one conversation's thread. It loads the conversation (`GET /v1/conversations/{id}`,
// the newest messages), follows `…/events` (SSE, never polling) and renders each event as it
// comes: streamed text goes into the DOM within one animation frame, tool calls become cards,
// the end of a turn replaces the streamed message with the persisted one, and the files the turn
// changed (`files_changed`, after the end) appear under it. The events come over the browser's
// one event stream (js/chat/events.js), shared by every tab. Older messages load
// on scroll-up (only a window of them is in the DOM). The composer never locks: during a turn a
// message becomes a pending item (removable, editable; `PUT …/pending`), or, with "Send now"
// (the button shown while a turn runs, or Ctrl/Cmd+Enter), interrupts the turn and runs next
// (`{"now": true}`). After a stop, an error or a restart a new message runs at once; only the
// items that were waiting stay paused (Resume, Discard). A dropped stream
// reconnects from the last seq received (bounded retries, js/chat/events.js), then reconciles
// from REST; when it gives up the page says so and shows the stored state: nothing spins
// forever. A sent message shows "Sending…" until the daemon has it, is retried under one
// Idempotency-Key, and ends "Not sent" with Retry when it cannot go (js/chat/outbox.js).
import { ApiError, get, patch, post, put, withQuery } from '../api.js';
import { follow as followEvents } from './events.js';
import { h, replace, toast } from '../dom.js';
import { addCopyButtons, markImportEnd, messageEl, showPreviews, textBlock, toolCard } from './render.js';
import { attachTray, messageBody } from './attach.js';
import { renderMarkdown } from '../markdown.js';
import { MODES, mountApprovals } from './approvals.js';
import { agentList, modelPicker } from './model.js';
import { setChanges } from './changes.js';
import * as outbox from './outbox.js';

/** Messages fetched with the conversation, and per older page. */
const PAGE = 50;
/** Most messages kept in the DOM before the oldest are dropped (they reload on scroll-up). */
const DOM_WINDOW = 400;
/** ListMessages page size while walking forward to the older ones. */
const SCAN_PAGE = 500;
/** A streaming text block is re-rendered as markdown this long after new text (ms)… */
const LIVE_MD_MS = 250;
/** …while it is shorter than this (characters); a longer one stays plain until it ends. */
const LIVE_MD_MAX = 32 * 1024;

/** The sessionStorage key of conversation `id`'s unsent draft. */
/** A touch screen as the primary pointer (a phone, a tablet): there Enter in the composer is a
 * new line and the Send button sends, since a phone's keyboard has no Shift+Enter. */
const TOUCH = matchMedia('(pointer: coarse)');
const draftKey = (id) => `coffer.draft.${id}`;

/**
 * The unsent draft kept for conversation `id` ('' for none): the composer's text survives a
 * reload, the signed-out screen and the conversation being deleted elsewhere. `take` removes it.
 */
export function draftOf(id, { take = false } = {}) {
  try {
    const t = sessionStorage.getItem(draftKey(id)) || '';
    if (take) sessionStorage.removeItem(draftKey(id));
    return t;
  } catch { return ''; }
}

/** Whether `el` is scrolled to (near) its bottom. */
const atBottom = (el) => el.scrollHeight - el.scrollTop - el.clientHeight < 80;

/**
 * Mounts the thread of conversation `id` into `root`.
 * `hooks`: {onConversation(conv), onDeleted(id), onEdit(conv), onArchive(conv, archived), onDelete(conv), toggleList()}.
 * Returns {close(), focus()}.
 */
export function mountThread(root, id, hooks) {
  let closed = false;
  let conv = null;
  let queue = { items: [], paused: false };
  let stream = null;
  let reconnecting = false;
  let editing = null; // the text of a pending item taken back into the composer
  const shown = []; // message ids in the DOM, oldest first
  let older = null; // messages before the oldest shown (loaded on demand), oldest first
  let moreBefore = false;
  let loadingOlder = false;
  let live = null; // the streamed assistant message: {id, el, body, text, textEl, cards, buf}
  let freshReload = false; // nothing but resets received since the last reload
  let resumed = false; // the outbox kept across a reload was taken up

  // ---- layout ----
  const title = h('h1', { class: 'thread-title', dir: 'auto' }, '…');
  const meta = h('div', { class: 'thread-meta' });
  const actions = h('div', { class: 'thread-actions' });
  const header = h('header', { class: 'thread-head' },
    h('button', { type: 'button', class: 'ghost list-toggle', 'aria-label': 'Show or hide the conversation list', title: 'Conversations', on: { click: () => hooks.toggleList() } }, '☰'),
    h('div', { class: 'thread-heading' }, title, meta), actions);
  const olderBtn = h('button', { type: 'button', class: 'ghost older', hidden: true, on: { click: () => loadOlder() } }, 'Load older messages');
  const msgs = h('div', { class: 'msgs', role: 'log', 'aria-live': 'polite', 'aria-relevant': 'additions', tabindex: '0' });
  const scroller = h('div', { class: 'scroller' }, olderBtn, msgs);
  // Approval cards live in the message list, after the message of the turn that asked.
  const approvals = mountApprovals(msgs, id);
  const modeSel = h('select', { class: 'mode-select', 'aria-label': 'Permission mode (from the next turn)', on: { change: () => setMode(modeSel.value) } },
    MODES.map((m) => h('option', { value: m.value, title: m.hint }, m.label)));
  // The model, shown and changed here (js/chat/model.js): from the next turn.
  const model = modelPicker({ id: 'thread-model', label: 'Model (from the next turn)', onCommit: (m) => setModel(m) });
  // The pickers stay in place across renders (a re-render must not take the focus from them);
  // only the buttons after them are redrawn.
  const buttons = h('span', { class: 'thread-buttons' });
  actions.append(
    h('div', { class: 'model-field' }, h('label', { class: 'hint', for: 'thread-model' }, 'Model'), model.el),
    h('label', { class: 'mode-pick' }, h('span', { class: 'hint' }, 'Mode'), modeSel),
    buttons);
  const banner = h('div', { class: 'stream-banner', hidden: true, role: 'status' });
  const pendingBox = h('section', { class: 'pending', 'aria-label': 'Pending messages', hidden: true });
  const input = h('textarea', {
    id: 'composer', class: 'composer-input', rows: '1', placeholder: 'Message… (Enter sends, Shift+Enter for a new line)',
    'aria-label': 'Message', autocomplete: 'off', spellcheck: 'true',
  });
  const sendBtn = h('button', { type: 'submit', class: 'primary send' }, 'Send');
  const stopBtn = h('button', { type: 'button', class: 'danger stop', hidden: true, on: { click: () => stop() } }, 'Stop');
  // Send now: interrupt the running turn and run this message next (shown while a turn runs).
  const nowBtn = h('button', {
    type: 'button', class: 'send-now', hidden: true,
    title: 'Interrupt the running turn and run this message next (Ctrl+Enter)',
    on: { click: () => send(true) },
  }, 'Send now');
  const editNote = h('div', { class: 'edit-note hint', hidden: true });
  // Files for the next message (js/chat/attach.js): pasted, dropped or picked.
  const tray = attachTray({ onChange: () => {} });
  const composer = h('form', { class: 'composer', on: { submit: (e) => { e.preventDefault(); send(); } } },
    editNote, tray.el,
    h('div', { class: 'composer-row' }, tray.button, input, h('div', { class: 'composer-buttons' }, stopBtn, nowBtn, sendBtn)));
  const el = h('section', { class: 'thread', 'aria-label': 'Conversation' }, header, banner, scroller, pendingBox, composer);
  replace(root, el);

  input.addEventListener('input', grow);
  // Pasted images and dropped files join the tray; pasted text stays text.
  input.addEventListener('paste', (e) => {
    const files = e.clipboardData ? Array.from(e.clipboardData.files || []) : [];
    if (files.length) { e.preventDefault(); tray.addFiles(files); }
  });
  composer.addEventListener('dragover', (e) => {
    if (e.dataTransfer && Array.from(e.dataTransfer.types || []).includes('Files')) {
      e.preventDefault();
      composer.classList.add('dragging');
    }
  });
  composer.addEventListener('dragleave', () => composer.classList.remove('dragging'));
  composer.addEventListener('drop', (e) => {
    composer.classList.remove('dragging');
    if (e.dataTransfer && e.dataTransfer.files && e.dataTransfer.files.length) {
      e.preventDefault();
      tray.addFiles(e.dataTransfer.files);
    }
  });
  input.addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && (e.ctrlKey || e.metaKey) && !e.isComposing) { e.preventDefault(); send(!!(conv && conv.turn_running)); }
    // On a touch screen (no Shift on a phone's keyboard) Enter is a new line: the button sends.
    else if (e.key === 'Enter' && !e.shiftKey && !e.isComposing && !TOUCH.matches) { e.preventDefault(); send(); }
    else if (e.key === 'Escape' && conv && conv.turn_running) { e.preventDefault(); stop(); }
  });
  scroller.addEventListener('scroll', () => {
    if (scroller.scrollTop < 120 && (moreBefore || (older && older.length))) loadOlder();
  }, { passive: true });

  // The composer grows with its text up to a cap (CSS max-height), then scrolls. `field-sizing`
  // does it in CSS where supported; the rows count is the fallback.
  // Every change of the composer's text passes here, so the draft is kept here too.
  function grow() {
    const lines = input.value.split('\n').length;
    input.rows = Math.min(Math.max(lines, 1), 12);
    if (closed) return;
    try {
      if (input.value) sessionStorage.setItem(draftKey(id), input.value);
      else sessionStorage.removeItem(draftKey(id));
    } catch { /* storage unavailable: the draft lives as long as the page */ }
  }
  input.value = draftOf(id);
  grow();

  // ---- header ----
  function renderHeader() {
    title.textContent = conv.title || 'Untitled conversation';
    const cfg = conv.agent_config || {};
    replace(meta,
      h('span', { class: 'badge' }, conv.agent_key),
      conv.channel_name ? h('span', { class: 'badge accent channel', title: `Driven by the IM channel ${conv.channel_name}` }, `⇄ ${conv.channel_name}`) : null,
      conv.archived ? h('span', { class: 'badge warn' }, 'archived') : null,
      cfg.cwd ? h('span', { class: 'cwd hint', title: 'Working directory' }, cfg.cwd) : null);
    modeSel.value = cfg.permission_mode || 'bypass';
    modeSel.title = `Permission mode: ${(MODES.find((m) => m.value === modeSel.value) || MODES[0]).hint} (from the next turn)`;
    showModel();
    replace(buttons,
      h('button', { type: 'button', class: 'ghost', on: { click: () => hooks.onEdit(conv) } }, 'Rename'),
      h('button', { type: 'button', class: 'ghost', on: { click: () => hooks.onArchive(conv, !conv.archived) } }, conv.archived ? 'Restore' : 'Archive'),
      h('button', { type: 'button', class: 'ghost danger', on: { click: () => hooks.onDelete(conv) } }, 'Delete'));
    stopBtn.hidden = !conv.turn_running;
    nowBtn.hidden = !conv.turn_running || !!conv.archived;
    sendBtn.textContent = conv.turn_running ? 'Queue' : 'Send';
    sendBtn.title = conv.turn_running ? 'Run this message after the running turn (Enter)' : 'Send (Enter)';
    input.placeholder = conv.archived
      ? 'This conversation is archived: restore it to send messages.'
      : conv.turn_running ? 'Message… (Enter queues it; Ctrl+Enter sends now, interrupting the turn)' : 'Message… (Enter sends, Shift+Enter for a new line)';
    if (TOUCH.matches && !conv.archived) input.placeholder = conv.turn_running ? 'Message… (Queue runs it after the turn)' : 'Message…';
  }

  // The picker shows the conversation's model and offers its agent's models (the bound
  // connection's, or the agent's own names).
  function showModel() {
    const want = conv;
    const cfg = conv.agent_config || {};
    model.set(cfg.model || '', model.agent || null);
    agentList().then((list) => {
      if (closed || conv !== want) return;
      model.agent = list.find((a) => a.agent_key === conv.agent_key) || null;
      model.set(cfg.model || '', model.agent);
    }, () => {});
  }

  async function setModel(m) {
    if (!conv || m === ((conv.agent_config || {}).model || '')) return;
    try {
      const c = await patch(`/v1/conversations/${encodeURIComponent(id)}`, { model: m });
      if (!closed) setConv(c);
      toast(m ? `Model: ${m}, from the next turn.` : 'Model: the default, from the next turn.');
    } catch (e) {
      toast(`Cannot change the model: ${e.message}`, 'error');
      if (!closed && conv) showModel();
    }
  }

  async function setMode(mode) {
    if (!conv || mode === ((conv.agent_config || {}).permission_mode || 'bypass')) return;
    try {
      const c = await patch(`/v1/conversations/${encodeURIComponent(id)}`, { permission_mode: mode });
      if (!closed) setConv(c);
      toast(`Mode: ${(MODES.find((m) => m.value === mode) || {}).label || mode}, from the next turn.`);
    } catch (e) {
      toast(`Cannot change the mode: ${e.message}`, 'error');
      if (!closed && conv) renderHeader();
    }
  }

  function setConv(c) {
    conv = c;
    renderHeader();
    hooks.onConversation(c);
  }

  // ---- messages ----
  function scrollToEnd() { scroller.scrollTop = scroller.scrollHeight; }

  function append(m) {
    const stick = atBottom(scroller);
    const existing = msgs.querySelector(`article.msg[data-id="${CSS.escape(m.id)}"]`);
    const node = messageEl(m);
    if (existing) existing.replaceWith(node);
    else { msgs.appendChild(node); shown.push(m.id); trim(); }
    if (msgs.querySelector('article.msg.imported')) markImportEnd(msgs);
    if (stick) scrollToEnd();
    return node;
  }

  // Keeps the DOM to a window of messages: the oldest go (and come back on scroll-up).
  function trim() {
    while (shown.length > DOM_WINDOW) {
      const gone = shown.shift();
      const n = msgs.querySelector(`article.msg[data-id="${CSS.escape(gone)}"]`);
      if (n) n.remove();
      older = null; // rebuilt from REST on the next scroll-up
      moreBefore = true;
    }
    olderBtn.hidden = !moreBefore && !(older && older.length);
  }

  function renderAll(view) {
    live = null;
    shown.length = 0;
    older = null;
    replace(msgs);
    for (const m of view.messages) { msgs.appendChild(messageEl(m)); shown.push(m.id); }
    moreBefore = view.more_before;
    olderBtn.hidden = !moreBefore;
    if (!view.messages.length) msgs.appendChild(h('p', { class: 'empty thread-empty' }, 'No messages yet. Say something below.'));
    approvals.reset(view.approvals);
    markImportEnd(msgs);
    // Messages still on their way stay last.
    if (outgoing.size) {
      const empty = msgs.querySelector('.thread-empty');
      if (empty) empty.remove();
      for (const o of outgoing.values()) msgs.appendChild(o.b.el);
    }
    scrollToEnd();
  }

  // Walks the stored messages forward (the API pages oldest first) to find the ones before the
  // oldest shown, then puts them back a page at a time, keeping the scroll position.
  async function loadOlder() {
    if (loadingOlder || closed || !shown.length) return;
    loadingOlder = true;
    olderBtn.disabled = true;
    try {
      if (!older) {
        const first = shown[0];
        const found = [];
        let after = '';
        for (;;) {
          const page = await get(withQuery(`/v1/conversations/${encodeURIComponent(id)}/messages`, { after, limit: SCAN_PAGE }));
          const i = page.items.findIndex((m) => m.id === first);
          if (i >= 0) { found.push(...page.items.slice(0, i)); break; }
          found.push(...page.items);
          if (!page.next_cursor) break;
          after = page.next_cursor;
        }
        older = found;
        moreBefore = false;
      }
      const batch = older.splice(Math.max(0, older.length - PAGE));
      const before = scroller.scrollHeight;
      const frag = document.createDocumentFragment();
      for (const m of batch) frag.appendChild(messageEl(m));
      msgs.insertBefore(frag, msgs.firstChild);
      shown.unshift(...batch.map((m) => m.id));
      markImportEnd(msgs);
      scroller.scrollTop += scroller.scrollHeight - before;
    } catch (e) {
      if (!closed) toast(`Cannot load older messages: ${e.message}`, 'error');
    } finally {
      loadingOlder = false;
      olderBtn.disabled = false;
      olderBtn.hidden = !moreBefore && !(older && older.length);
    }
  }

  // ---- the streamed assistant message ----
  function startLive(assistantId) {
    const empty = msgs.querySelector('.thread-empty');
    if (empty) empty.remove();
    let node = msgs.querySelector(`article.msg[data-id="${CSS.escape(assistantId)}"]`);
    const body = h('div', { class: 'msg-body' });
    const thinking = h('div', { class: 'thinking', 'aria-label': 'The agent is working' }, h('span'), h('span'), h('span'));
    const fresh = h('article', { class: 'msg assistant', dataset: { id: assistantId, status: 'streaming' } }, body, thinking);
    if (node) node.replaceWith(fresh);
    else { msgs.appendChild(fresh); shown.push(assistantId); trim(); }
    node = fresh;
    live = { id: assistantId, el: node, body, thinking, textEl: null, text: '', cards: new Map(), buf: '', frame: 0, timer: 0, md: 0 };
    if (atBottom(scroller)) scrollToEnd();
  }

  // Deltas are batched for at most one animation frame (a hidden tab has no frames: a short
  // timer is the fallback).
  function queueText(t) {
    if (!live) return;
    live.buf += t;
    if (!live.frame) {
      const run = () => { if (live) { cancelAnimationFrame(live.frame); clearTimeout(live.timer); live.frame = 0; flushText(); } };
      live.frame = requestAnimationFrame(run);
      live.timer = setTimeout(run, 100);
    }
  }

  function flushText() {
    if (!live || !live.buf) return;
    const stick = atBottom(scroller);
    if (live.thinking) { live.thinking.remove(); live.thinking = null; }
    if (!live.textEl) {
      live.textEl = h('div', { class: 'block text streaming-text' });
      live.body.appendChild(live.textEl);
    }
    live.textEl.appendChild(document.createTextNode(live.buf));
    live.text += live.buf;
    live.buf = '';
    if (!live.md && live.text.length < LIVE_MD_MAX) live.md = setTimeout(liveMarkdown, LIVE_MD_MS);
    if (stick) scrollToEnd();
  }

  // The text streamed so far as markdown (new text lands as plain text until the next pass).
  function liveMarkdown() {
    if (!live) return;
    live.md = 0;
    if (!live.textEl || live.text.length >= LIVE_MD_MAX) return;
    const stick = atBottom(scroller);
    live.textEl.classList.add('md');
    live.textEl.replaceChildren(renderMarkdown(live.text));
    addCopyButtons(live.textEl);
    if (stick) scrollToEnd();
  }

  // A text block ends (a tool call follows): it is rendered as markdown.
  function closeText() {
    flushText();
    if (live) { clearTimeout(live.md); live.md = 0; }
    if (live && live.textEl) {
      live.textEl.replaceWith(textBlock(live.text));
      live.textEl = null;
      live.text = '';
    }
  }

  // The turn ended: the stored message replaces the streamed one. Without it (a turn that failed
  // before its answer was stored) the streamed one stays, and its tool calls say no result comes.
  function finishLive(message) {
    if (live) { cancelAnimationFrame(live.frame); clearTimeout(live.timer); clearTimeout(live.md); }
    const id = message ? message.id : live && live.id;
    const cards = live ? [...live.cards.values()] : [];
    live = null;
    if (message) append(message);
    else if (id) {
      const n = msgs.querySelector(`article.msg[data-id="${CSS.escape(id)}"] .thinking`);
      if (n) n.remove();
      for (const c of cards) c.setStopped('the turn failed');
    }
  }

  // ---- events ----
  const handlers = {
    message_created(e) {
      const m = e.message_created.message;
      if (m && !shown.includes(m.id)) {
        const empty = msgs.querySelector('.thread-empty');
        if (empty) empty.remove();
        append(m);
        scrollToEnd();
      }
    },
    turn_started(e) {
      startLive(e.turn_started.assistant_message_id);
      if (conv) setConv({ ...conv, turn_running: true });
    },
    text_delta(e) { queueText(e.text_delta.text); },
    tool_call(e) {
      if (!live) return;
      closeText();
      if (live.thinking) { live.thinking.remove(); live.thinking = null; }
      const t = e.tool_call;
      const card = toolCard({ id: t.tool_use_id, name: t.name, input: t.input });
      live.cards.set(t.tool_use_id, card);
      live.body.appendChild(card);
    },
    tool_result(e) {
      const r = e.tool_result;
      const card = live && live.cards.get(r.tool_use_id);
      if (card) card.setResult(r);
    },
    turn_done(e) {
      finishLive(e.turn_done.message);
      if (conv) setConv({ ...conv, turn_running: false });
    },
    turn_error(e) {
      const t = e.turn_error;
      finishLive(t.message_record);
      if (!t.message_record) toast(`The turn failed: ${t.message}`, 'error');
      if (conv) setConv({ ...conv, turn_running: false });
    },
    approval_requested(e) {
      const stick = atBottom(scroller);
      approvals.request((e.approval_requested || e).approval);
      if (stick) scrollToEnd();
    },
    approval_resolved(e) { approvals.resolve(e.approval_resolved || e); },
    // What the turn changed: it follows the turn's end, under the reply it belongs to.
    files_changed(e) {
      const fc = e.files_changed;
      const el = fc && fc.message_id && msgs.querySelector(`article.msg[data-id="${CSS.escape(fc.message_id)}"]`);
      if (!el) return;
      const stick = atBottom(scroller);
      setChanges(el, fc, id);
      if (stick) scrollToEnd();
    },
    queue_changed(e) {
      queue = e.queue_changed.queue;
      renderPending();
      if (conv) setConv({ ...conv, pending_count: queue.items.length, pending_paused: queue.paused });
    },
    reset(e) {
      const why = e.reset.reason;
      if (why === 'deleted') { closeStream(); hooks.onDeleted(id); return; }
      // too_old or lagged: what we hold is no longer complete; reload from REST. A reset right
      // after a reload (a turn longer than the service keeps: its start is gone) is lived
      // with instead: the rest streams in, and the turn's end brings the whole stored reply.
      if (why === 'too_old' && freshReload) return;
      reload();
    },
  };
  // Every event but a reset means the stream since the last reload delivered something.
  for (const [name, fn] of Object.entries(handlers)) {
    if (name !== 'reset') handlers[name] = (e) => { freshReload = false; fn(e); };
  }

  function closeStream() { if (stream) { stream.close(); stream = null; } }

  function follow(after) {
    closeStream();
    // The browser's one event stream (js/chat/events.js), shared with every tab.
    stream = followEvents({ conversation: id, after }, handlers, {
      onState: (s) => {
        if (closed) return;
        if (s === 'retrying') {
          reconnecting = true;
          banner.hidden = false;
          banner.className = 'stream-banner warn';
          banner.textContent = 'Connection lost; reconnecting…';
        } else if (s === 'open') {
          banner.hidden = true;
          if (reconnecting) { reconnecting = false; reconcile(); }
        } else if (s === 'failed') {
          stream = null;
          stopLive();
          reconcile();
          banner.hidden = false;
          banner.className = 'stream-banner err';
          replace(banner, 'Live updates stopped: Coffer is not answering. Showing what is stored. ',
            h('button', { type: 'button', on: { click: () => reload() } }, 'Reconnect'));
        }
      },
    });
  }

  // After a reconnection (or when live updates stopped): the stored state wins for every
  // finished message; a turn still running keeps streaming from the resumed stream.
  async function reconcile() {
    try {
      const view = await get(withQuery(`/v1/conversations/${encodeURIComponent(id)}`, { messages: PAGE }));
      if (closed) return;
      queue = view.pending;
      renderPending();
      setConv(view.conversation);
      for (const m of view.messages) {
        // The store has no partial text of a reply in progress: keep what streamed here.
        if (m.status === 'streaming' && shown.includes(m.id)) continue;
        append(m);
      }
      for (const a of view.approvals || []) approvals.request(a);
      if (live && !view.conversation.turn_running) finishLive(view.messages.find((m) => m.id === live.id) || null);
      if (!stream) stopLive();
    } catch { /* the banner already says Coffer is not answering */ }
  }

  // No stream any more: nothing may look as if it were still coming. What streamed so far
  // stays, marked as no longer live.
  function stopLive() {
    if (live) {
      cancelAnimationFrame(live.frame); clearTimeout(live.timer); clearTimeout(live.md);
      flushText();
    }
    live = null;
    for (const n of msgs.querySelectorAll('.thinking')) n.remove();
    for (const m of msgs.querySelectorAll('article.msg.assistant[data-status="streaming"]')) {
      let f = m.querySelector('.msg-foot');
      if (!f) { f = h('footer', { class: 'msg-foot' }); m.appendChild(f); }
      replace(f, h('span', { class: 'badge warn' }, 'live updates stopped'));
    }
  }

  async function reload() {
    closeStream();
    banner.hidden = true;
    try {
      const view = await get(withQuery(`/v1/conversations/${encodeURIComponent(id)}`, { messages: PAGE }));
      if (closed) return;
      setConv(view.conversation);
      queue = view.pending;
      renderPending();
      renderAll(view);
      // A running turn replays from its start (after=0); otherwise follow from here.
      freshReload = true;
      follow(view.conversation.turn_running ? 0 : view.last_seq);
      if (!resumed) { resumed = true; resumeOutbox(); }
    } catch (e) {
      if (closed) return;
      if (e instanceof ApiError && e.status === 404) { hooks.onDeleted(id); return; }
      replace(msgs, h('div', { class: 'error-box' }, `Cannot load this conversation: ${e.message} `,
        h('button', { type: 'button', on: { click: () => reload() } }, 'Retry')));
    }
  }

  // ---- the pending queue ----
  function renderPending() {
    const items = queue.items || [];
    pendingBox.hidden = !items.length && !queue.paused;
    if (pendingBox.hidden) { replace(pendingBox); return; }
    const list = h('ol', { class: 'pending-list' }, items.map((it) => h('li', { class: 'pending-item', dataset: { id: it.id } },
      h('span', { class: 'pending-text', title: it.text }, it.text),
      h('button', { type: 'button', class: 'ghost', 'aria-label': 'Edit this pending message', on: { click: () => editPending(it) } }, 'Edit'),
      h('button', { type: 'button', class: 'ghost', 'aria-label': 'Remove this pending message', on: { click: () => removePending(it) } }, 'Remove'))));
    const head = queue.paused
      ? h('div', { class: 'pending-head paused' },
        h('span', null, `Queue paused${items.length ? `: ${items.length} waiting` : ''} (after a stop, an error or a restart). A new message runs at once.`),
        h('span', { class: 'spacer' }),
        h('button', { type: 'button', class: 'primary', on: { click: () => setQueue(items, false) } }, 'Resume'),
        h('button', { type: 'button', on: { click: () => setQueue([], false) } }, 'Discard'))
      : h('div', { class: 'pending-head' }, `${items.length} waiting — each runs as its own turn, in order.`);
    replace(pendingBox, head, items.length ? list : null);
  }

  // A REST answer's queue may be older than the stream's `queue_changed` events (they can
  // arrive first): while the stream is open it is the one truth, and the answer is only used
  // without it.
  function answeredQueue(q) {
    if (q && !stream) { queue = q; renderPending(); }
  }

  async function setQueue(items, paused) {
    try {
      answeredQueue(await put(`/v1/conversations/${encodeURIComponent(id)}/pending`,
        { items: items.map((it) => (it.id ? { id: it.id, text: it.text } : { text: it.text })), paused }));
      return true;
    } catch (e) {
      toast(`Cannot change the queue: ${e.message}`, 'error');
      return false;
    }
  }

  function removePending(it) {
    setQueue(queue.items.filter((x) => x.id !== it.id), queue.paused);
  }

  async function editPending(it) {
    if (input.value.trim() && !confirm('Replace what is in the composer with this pending message?')) return;
    if (!(await setQueue(queue.items.filter((x) => x.id !== it.id), queue.paused))) return;
    editing = it.text;
    input.value = it.text;
    grow();
    editNote.hidden = false;
    replace(editNote, 'Editing a pending message: sending puts it back at the end of the queue. ',
      h('button', { type: 'button', class: 'ghost', on: { click: () => { editing = null; editNote.hidden = true; } } }, 'Send as a new message instead'));
    input.focus();
  }

  // ---- sending and stopping ----
  // Sends go out one after another (a promise chain): two POSTs in flight at once may reach the
  // daemon in either order, and the queue must keep the order the messages were typed in. The
  // composer never waits for the chain.
  let sending = Promise.resolve();

  /** Sends the composer's text; `now`: interrupt the running turn and run it next. */
  function send(now = false) {
    const text = input.value;
    if ((!text.trim() && !tray.count()) || !conv) return;
    const files = tray.take();
    const wasEditing = editing !== null && !files.length;
    // The composer is cleared at once and stays usable: the next message can be typed while
    // this one is on its way.
    input.value = '';
    grow();
    editing = null;
    editNote.hidden = true;
    // Each message has its key from the start: however often it is tried (or re-sent after a
    // reload), the daemon queues it once (js/chat/outbox.js).
    const entry = { key: outbox.newKey(), text, now, at: Date.now() };
    sending = sending.then(() => deliver(entry, wasEditing, files));
  }

  /** Delivers one typed message; never throws (a refusal puts the text back in the composer). */
  async function deliver(entry, wasEditing, files = []) {
    if (!entry.now && wasEditing && (conv.turn_running || queue.items.length || queue.paused)) {
      // Back to the end of the queue it came from (an item that waited stays a waiting one).
      if (!(await setQueue([...queue.items, { text: entry.text }], queue.paused))) keepDraft(entry.text);
      return;
    }
    if (!files.length) outbox.keep(id, entry);
    await transmit(showOutgoing(entry, files));
  }

  // ---- messages on their way (js/chat/outbox.js) ----
  const outgoing = new Map(); // key → {entry, files, b: the bubble}

  function showOutgoing(entry, files = []) {
    const b = outbox.bubble(entry.text, files.length);
    const o = { entry, files, b };
    outgoing.set(entry.key, o);
    const empty = msgs.querySelector('.thread-empty');
    if (empty) empty.remove();
    msgs.appendChild(b.el);
    b.sending();
    scrollToEnd();
    return o;
  }

  function dropOutgoing(key) {
    const o = outgoing.get(key);
    if (o) { o.b.el.remove(); outgoing.delete(key); }
    outbox.forget(id, key);
  }

  /** After a reload: the sends this tab had not seen confirmed go again, with their keys. */
  function resumeOutbox() {
    for (const entry of outbox.kept(id)) {
      if (outgoing.has(entry.key)) continue;
      const o = showOutgoing(entry);
      if (Date.now() - entry.at > outbox.RESEND_MS) failOutgoing(o, 'not confirmed before the page was reloaded');
      else sending = sending.then(() => transmit(o));
    }
  }

  function failOutgoing(o, reason) {
    o.b.failed(reason, {
      retry: () => { o.b.sending(); sending = sending.then(() => transmit(o)); },
      edit: () => {
        dropOutgoing(o.entry.key);
        keepDraft(o.entry.text);
        if (o.files.length) tray.restore(o.files);
      },
    });
  }

  /**
   * Posts a message on its way until the daemon has it: a try that gets no answer, hangs past
   * its deadline or meets a 5xx is repeated with backoff (same Idempotency-Key), up to
   * outbox.TRIES; then the message shows "Not sent" with Retry. A refusal (4xx) puts the text
   * back in the composer (files back in the tray) and says why.
   */
  async function transmit(o) {
    const { entry, files } = o;
    const bytes = files.reduce((n, f) => n + (f.size || 0), 0);
    for (let n = 1; !closed; n += 1) {
      const ctl = new AbortController();
      const timer = setTimeout(() => ctl.abort(), outbox.deadline(bytes));
      try {
        const body = entry.now ? { ...messageBody(entry.text, files), now: true } : messageBody(entry.text, files);
        const r = await post(`/v1/conversations/${encodeURIComponent(id)}/messages`, body, { headers: { 'Idempotency-Key': entry.key }, signal: ctl.signal });
        clearTimeout(timer);
        dropOutgoing(entry.key);
        if (closed) return;
        // The sent message shows the images it carried (before or after its event arrived).
        const sentId = (r.message && r.message.id) || (r.pending && r.pending.id);
        if (sentId && files.length) tray.remember(sentId, files);
        answeredQueue(r.queue);
        if (r.message && !shown.includes(r.message.id)) handlers.message_created({ message_created: { message: r.message } });
        if (sentId && files.length) showPreviews(msgs, sentId);
        return;
      } catch (e) {
        clearTimeout(timer);
        if (closed) return;
        const reason = e.name === 'AbortError' ? 'Coffer did not answer in time' : e.message;
        if (outbox.transient(e)) {
          if (n < outbox.TRIES) {
            o.b.sending(`trying again, ${n + 1} of ${outbox.TRIES}`);
            await new Promise((res) => setTimeout(res, outbox.backoff(n)));
            continue;
          }
          failOutgoing(o, reason);
          toast(`Not sent: ${reason}`, 'error');
          return;
        }
        dropOutgoing(entry.key);
        if (entry.text) keepDraft(entry.text);
        if (files.length) {
          // The refusal (a file over the limit, too many files) is shown by the files, inline.
          tray.restore(files);
          tray.fail(`Not sent: ${e.message}`);
        } else toast(`Not sent: ${e.message}`, 'error');
        return;
      }
    }
  }

  /** Puts an unsent text back into the composer, after what is there already (nothing is lost). */
  function keepDraft(text) {
    input.value = input.value ? `${input.value}\n${text}` : text;
    grow();
  }

  async function stop() {
    try {
      await post(`/v1/conversations/${encodeURIComponent(id)}/interrupt`);
    } catch (e) {
      toast(`Cannot stop: ${e.message}`, 'error');
    }
  }

  reload();

  return {
    close() { closed = true; closeStream(); approvals.close(); if (live) { cancelAnimationFrame(live.frame); clearTimeout(live.timer); clearTimeout(live.md); } },
    focus() { input.focus(); },
    /** The conversation changed elsewhere (the list's stream): refresh the header. */
    // Only what the list owns: the turn and queue state come from this thread's own stream.
    update(c) {
      if (c.id !== id || !conv) return;
      const { title, archived, agent_config: cfg, channel_name: ch, version } = c;
      conv = { ...conv, title, archived, agent_config: cfg, channel_name: ch, version };
      renderHeader();
    },
  };
}
