// Chat page: approval cards. An agent in permission mode `ask` waits for the owner before an
// action that is not read-only; each `approval_requested` event becomes a card in the thread
// (tool, summary, the command or path, the diff — folded when long) with Allow / Deny (an
// optional message for the agent) / Allow always. `POST /v1/conversations/{id}/approvals/{n}`
// answers; `approval_resolved` (from any surface: this page, the CLI, a channel, the timeout)
// disables the card and says the decision and who made it. Keys: `a` allows, `d` denies the
// focused card, else the newest waiting one (never while typing in a field).
import { ApiError, post } from '../api.js';
import { h, replace, toast } from '../dom.js';

/** Diffs longer than this (lines) start folded. */
const FOLD_LINES = 24;

/** The permission modes, as the API spells them, with what each means. */
export const MODES = [
  { value: 'bypass', label: 'Bypass', hint: 'the agent acts without asking' },
  { value: 'ask', label: 'Ask', hint: 'actions that are not read-only wait for your answer' },
  { value: 'read_only', label: 'Read-only', hint: 'actions that are not read-only are refused' },
];

/** The command or path the owner judges, from a request's input ('' when none). */
export function detailOf(approval) {
  const input = approval.input && typeof approval.input === 'object' ? approval.input : {};
  for (const k of ['command', 'cmd', 'file_path', 'path', 'notebook_path', 'url', 'pattern']) {
    const v = input[k];
    if (typeof v === 'string' && v.trim()) return v.trim();
    if (Array.isArray(v) && v.length) return v.map(String).join(' ');
  }
  return '';
}

/** "Allowed", "Allowed always", "Denied". */
export function outcomeWord(decision) {
  if (decision === 'allow') return 'Allowed';
  if (decision === 'allow_always') return 'Allowed always';
  return 'Denied';
}

/** Who decided, for people: "the web console", "user 1001 in tg", "the timeout". */
export function byWhom(r) {
  const actor = r.actor ? ` (${r.actor})` : '';
  switch (r.decided_by) {
    case 'web': return `the web console${actor}`;
    case 'cli': return `the CLI${actor}`;
    case 'api': return `the API${actor}`;
    case 'timeout': return 'the timeout (no answer in time)';
    case 'interrupt': return 'the stop (the turn was interrupted)';
    case 'turn_ended': return 'the turn’s end';
    default: {
      const s = r.decided_by || '';
      if (s.startsWith('channel:')) return r.actor ? `user ${r.actor} in ${s.slice(8)}` : `the channel ${s.slice(8)}`;
      return `${s || 'someone'}${actor}`;
    }
  }
}

/**
 * The cards of one thread. `root`: where cards go (the thread's message list); `convId`.
 * Returns {request(approval), resolve(resolved), reset(openApprovals), waiting(), close()}.
 */
export function mountApprovals(root, convId) {
  const cards = new Map(); // number → card element (with .decide / .settle)

  function card(a) {
    const detail = detailOf(a);
    const tool = a.tool || 'An action';
    const message = h('input', {
      type: 'text', class: 'approval-message', maxlength: '4000', autocomplete: 'off',
      placeholder: 'Message to the agent (optional, with Deny)', 'aria-label': 'Message to the agent with Deny',
    });
    const allow = h('button', { type: 'button', class: 'primary approval-allow', title: 'Allow (a)' }, 'Allow', h('kbd', null, 'a'));
    const deny = h('button', { type: 'button', class: 'danger approval-deny', title: 'Deny (d)' }, 'Deny', h('kbd', null, 'd'));
    const always = h('button', { type: 'button', class: 'approval-always', title: `Allow, and allow ${tool} for the rest of this conversation` }, 'Allow always');
    const outcome = h('p', { class: 'approval-outcome', role: 'status', hidden: true });
    const diffLines = a.diff ? a.diff.split('\n').length : 0;
    const diff = a.diff
      ? h('details', { class: 'approval-diff', open: diffLines <= FOLD_LINES },
        h('summary', null, `Diff (${diffLines} line${diffLines === 1 ? '' : 's'})`),
        h('pre', { class: 'diff' }, a.diff.split('\n').map((line) => h('span', {
          class: line.startsWith('+') && !line.startsWith('+++') ? 'add'
            : line.startsWith('-') && !line.startsWith('---') ? 'del'
              : line.startsWith('@@') ? 'hunk' : null,
        }, `${line}\n`))))
      : null;
    const summary = a.summary && a.summary !== `${tool}: ${detail}` ? h('p', { class: 'approval-summary hint' }, a.summary) : null;
    const el = h('section', {
      class: 'approval-card waiting', tabindex: '0', dataset: { number: String(a.number) },
      'aria-label': `Approval request #${a.number}: ${a.summary || tool}`,
    },
    h('header', { class: 'approval-head' },
      h('span', { class: 'approval-icon', 'aria-hidden': 'true' }),
      h('strong', null, 'Waiting for your approval'),
      h('span', { class: 'spacer' }),
      h('span', { class: 'hint' }, `#${a.number}`)),
    h('div', { class: 'approval-what' }, h('span', { class: 'badge accent approval-tool' }, tool),
      detail ? h('code', { class: 'approval-detail' }, detail) : null),
    summary,
    a.cwd ? h('p', { class: 'approval-cwd hint' }, `in ${a.cwd}`) : null,
    diff,
    h('div', { class: 'approval-actions' }, allow, deny, always, message),
    outcome);

    let busy = false;
    async function decide(decision) {
      if (busy || !el.classList.contains('waiting')) return;
      busy = true;
      for (const b of [allow, deny, always]) b.disabled = true;
      const body = { decision };
      if (decision === 'deny' && message.value.trim()) body.message = message.value.trim();
      try {
        const r = await post(`/v1/conversations/${encodeURIComponent(convId)}/approvals/${encodeURIComponent(a.number)}`, body);
        settle(r);
      } catch (e) {
        if (e instanceof ApiError && e.status === 409 && e.details && e.details.decision) {
          settle({ number: a.number, ...e.details });
        } else if (e instanceof ApiError && e.status === 404) {
          settle({ number: a.number, decision: 'deny', decided_by: 'turn_ended', gone: true });
        } else {
          toast(`Cannot answer: ${e.message}`, 'error');
          for (const b of [allow, deny, always]) b.disabled = false;
        }
      } finally {
        busy = false;
      }
    }
    function settle(r) {
      if (!el.classList.contains('waiting')) return;
      el.classList.remove('waiting');
      el.classList.add('decided', r.decision === 'deny' ? 'denied' : 'allowed');
      for (const b of [allow, deny, always]) b.disabled = true;
      message.disabled = true;
      el.querySelector('.approval-head strong').textContent = r.gone ? 'No longer waiting' : outcomeWord(r.decision);
      outcome.hidden = false;
      replace(outcome, r.gone ? 'This request is gone (its turn ended).' : `${outcomeWord(r.decision)} by ${byWhom(r)}.`,
        r.decision === 'deny' && r.message ? h('span', { class: 'hint' }, ` The agent was told: ${r.message}`) : null);
      if (document.activeElement === el || el.contains(document.activeElement)) el.blur();
    }
    allow.addEventListener('click', () => decide('allow'));
    deny.addEventListener('click', () => decide('deny'));
    always.addEventListener('click', () => decide('allow_always'));
    message.addEventListener('keydown', (e) => {
      if (e.key === 'Enter' && !e.isComposing) { e.preventDefault(); decide('deny'); }
    });
    el.decide = decide;
    el.settle = settle;
    return el;
  }

  function request(a) {
    if (!a || a.number === undefined) return;
    const key = String(a.number);
    if (cards.has(key)) return;
    const el = card(a);
    cards.set(key, el);
    const empty = root.querySelector('.thread-empty');
    if (empty) empty.remove();
    root.appendChild(el);
  }

  function resolve(r) {
    const el = r && cards.get(String(r.number));
    if (el) el.settle(r);
  }

  /** After a reload: the cards of the requests still open (decided ones are dropped). */
  function reset(open) {
    for (const el of cards.values()) el.remove();
    cards.clear();
    for (const a of open || []) request(a);
  }

  const waitingCards = () => [...cards.values()].filter((c) => c.classList.contains('waiting') && c.isConnected);

  function onKey(e) {
    if (e.defaultPrevented || e.ctrlKey || e.metaKey || e.altKey || e.isComposing) return;
    if (e.key !== 'a' && e.key !== 'd') return;
    const t = e.target;
    if (t && (t.closest('input, textarea, select, [contenteditable=""], [contenteditable="true"]') || t.closest('dialog'))) return;
    const focused = t && t.closest && t.closest('.approval-card.waiting');
    const list = waitingCards();
    const target = focused || list[list.length - 1];
    if (!target) return;
    e.preventDefault();
    target.decide(e.key === 'a' ? 'allow' : 'deny');
  }
  document.addEventListener('keydown', onKey);

  return {
    request,
    resolve,
    reset,
    /** How many cards wait for an answer. */
    waiting: () => waitingCards().length,
    /** Re-attaches the cards after the message list was rebuilt (they stay last). */
    reattach() { for (const el of cards.values()) root.appendChild(el); },
    close() { document.removeEventListener('keydown', onKey); },
  };
}
