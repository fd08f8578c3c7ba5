// Shared pieces of the vault pages (servers, tools, activity, knowledge, settings): API calls
// that name the acting party `ui` for the audit log, the error and empty states, tables that
// collapse to cards on a phone, a form dialog that stays open on a refusal and shows the
// daemon's message next to the field it names, and small formatters.
import { api, ApiError, sse } from '../api.js';
import { h, replace } from '../dom.js';

/** Every vault request says who acts (docs/REST.md "Audit"): the web console. */
const ACTOR = { 'X-Coffer-Actor': 'ui' };

/** api() with `X-Coffer-Actor: ui` (and any `headers` given). */
export function call(method, path, body, opts = {}) {
  return api(method, path, body, { ...opts, headers: { ...ACTOR, ...(opts.headers || {}) } });
}
export const vget = (p, o) => call('GET', p, undefined, o);
export const vpost = (p, b, o) => call('POST', p, b ?? {}, o);
export const vpatch = (p, b, o) => call('PATCH', p, b, o);
export const vput = (p, b, o) => call('PUT', p, b, o);
export const vdel = (p, o) => call('DELETE', p, undefined, o);

/** A path segment, percent-encoded (names may hold `/`, `?`, `#` and worse). */
export const seg = (s) => encodeURIComponent(String(s));

/** The message of an error for the page: the envelope's message, or a generic line. */
export function messageOf(e) {
  if (e instanceof ApiError) return e.message || `${e.status} ${e.code}`;
  return (e && e.message) || 'Something went wrong';
}

/**
 * An error box (role=alert) holding the API's message; `what` says what failed. With `retry`
 * (a function), a Retry button calls it (a first load that failed, e.g. while the daemon was down).
 */
export function errorBox(e, what, retry) {
  return h('div', { class: 'error-box', role: 'alert' }, what ? `${what}: ${messageOf(e)} ` : `${messageOf(e)} `,
    retry ? h('button', { type: 'button', class: 'retry', on: { click: () => retry() } }, 'Retry') : null);
}

/** An empty state: a title line and what to do about it (strings or nodes). */
export function emptyState(title, ...what) {
  return h('div', { class: 'empty vault-empty' }, h('p', { class: 'empty-title' }, title), ...what.map((w) => (typeof w === 'string' ? h('p', null, w) : w)));
}

/** A page header: title, an optional line under it, and actions on the right. */
export function pageHead(title, sub, ...actions) {
  return h('div', { class: 'vault-head' },
    h('div', null, h('h1', null, title), sub ? h('p', { class: 'muted vault-sub' }, sub) : null),
    h('div', { class: 'row vault-actions' }, ...actions));
}

/**
 * A table that turns into one card per row below 600 px (each cell labelled by its column).
 * columns: [{label, cell(row) → node|string, class?}]; rows: array; key(row) → data-key;
 * opts.list: below 600 px each row is a compact list row instead (class `list-rows`: a log's
 * many rows, e.g. Activity, where a card per row would take half a phone's screen).
 */
export function table(columns, rows, opts = {}) {
  return h('div', { class: 'table-wrap' },
    h('table', { class: opts.list ? 'vtable list-rows' : 'vtable' },
      opts.caption ? h('caption', { class: 'sr-only' }, opts.caption) : null,
      h('thead', null, h('tr', null, columns.map((c) => h('th', { scope: 'col', class: c.class }, c.label)))),
      h('tbody', null, rows.map((r) => tableRow(columns, r, opts)))));
}

/** One row of a table() (for rows added later, e.g. live ones). */
export function tableRow(columns, r, { key, rowClass } = {}) {
  return h('tr', { dataset: key ? { key: key(r) } : undefined, class: rowClass ? rowClass(r) : undefined },
    columns.map((c) => h('td', { 'data-label': c.label, class: c.class }, c.cell(r))));
}

/** A labelled switch (a checkbox with role=switch); onChange(checked, input) may be async. */
export function toggle(label, checked, onChange, { disabled } = {}) {
  const input = h('input', { type: 'checkbox', class: 'switch', role: 'switch', 'aria-label': label, checked: !!checked, disabled: !!disabled });
  input.addEventListener('change', async () => {
    input.disabled = true;
    try { await onChange(input.checked, input); } finally { input.disabled = !!disabled; }
  });
  return input;
}

/** A badge for a state word: ok/healthy green, unhealthy/failed red, idle/disabled grey. */
export function stateBadge(state, text) {
  const kind = {
    ok: 'ok', healthy: 'ok', running: 'ok', idle: '', disabled: '', stopped: '',
    unhealthy: 'err', failed: 'err', error: 'err', upstream_error: 'err', timeout: 'err', unreachable: 'err', invalid: 'warn', cancelled: 'warn',
    starting: 'warn', restarting: 'warn', scanning: 'accent', indexing: 'accent',
  }[state] ?? '';
  return h('span', { class: `badge ${kind}`.trim(), dataset: { state: String(state) } }, text ?? String(state));
}

/** "2026-12-01 17:03:04" (local time) for an RFC 3339 string or unix ms; '' for none. */
export function when(t) {
  if (t === null || t === undefined || t === '') return '';
  const d = new Date(typeof t === 'number' ? t : Date.parse(t));
  if (Number.isNaN(d.getTime())) return String(t);
  const p = (n) => String(n).padStart(2, '0');
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} ${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`;
}

/** A <time> element showing when(t) with the raw value as its datetime. */
export function timeEl(t) {
  if (t === null || t === undefined || t === '') return h('span', { class: 'muted' }, '—');
  const iso = typeof t === 'number' ? new Date(t).toISOString() : String(t);
  return h('time', { datetime: iso, title: iso }, when(t));
}

/** 1536 → "1.5 KB". */
export function bytes(n) {
  if (!Number.isFinite(n)) return '';
  if (n < 1024) return `${n} B`;
  const u = ['KB', 'MB', 'GB', 'TB'];
  let v = n / 1024; let i = 0;
  while (v >= 1024 && i < u.length - 1) { v /= 1024; i += 1; }
  return `${v.toFixed(v < 10 ? 1 : 0)} ${u[i]}`;
}

/** 125 → "2 min 5 s" (seconds). */
export function duration(s) {
  if (!Number.isFinite(s)) return '';
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
  return `${Math.floor(s / 86400)} d ${Math.floor((s % 86400) / 3600)} h`;
}

/** A labelled input: returns {wrap, input, error} where `error` shows a refusal for it. */
export function field(label, input, { hint, name } = {}) {
  const id = `f-${Math.random().toString(36).slice(2, 10)}`;
  input.id = id;
  if (name) input.name = name;
  const error = h('div', { class: 'field-error', id: `${id}-err`, 'aria-live': 'polite' });
  input.setAttribute('aria-describedby', `${id}-err`);
  const wrap = h('div', { class: 'vfield', dataset: name ? { field: name } : undefined },
    h('label', { for: id }, label, hint ? h('span', { class: 'hint' }, ` ${hint}`) : null), input, error);
  return { wrap, input, error };
}

/**
 * A modal form that stays open until `onSubmit(form)` resolves; a thrown error is shown in the
 * dialog (the envelope's message), next to the field its details name when the dialog has one
 * (`[data-field=<details.field | details.key>]`). Resolves with onSubmit's value, or null when
 * cancelled.
 */
export function formDialog(title, content, onSubmit, { submit = 'Save', danger = false, wide = false } = {}) {
  return new Promise((resolve) => {
    const status = h('div', { class: 'dialog-error', role: 'alert' });
    const ok = h('button', { type: 'submit', class: danger ? 'danger' : 'primary' }, submit);
    const form = h('form', { class: 'dialog-form', novalidate: true },
      h('h2', null, title), content, status,
      h('div', { class: 'actions' },
        h('button', { type: 'button', class: 'ghost', on: { click: () => d.close() } }, 'Cancel'), ok));
    const d = h('dialog', { class: wide ? 'modal wide' : 'modal', 'aria-label': title }, form);
    let result = null;
    form.addEventListener('submit', async (e) => {
      e.preventDefault();
      replace(status);
      for (const el of form.querySelectorAll('.field-error')) replace(el);
      ok.disabled = true;
      try {
        result = await onSubmit(form);
        d.close();
      } catch (err) {
        showFieldError(form, err, status);
      } finally {
        ok.disabled = false;
      }
    });
    d.addEventListener('close', () => { d.remove(); resolve(result); });
    document.body.appendChild(d);
    d.showModal();
  });
}

/** Puts the message of `err` next to the field its details name inside `scope`, else in `fallback`. */
export function showFieldError(scope, err, fallback) {
  const d = (err && err.details) || {};
  const name = d.field || d.key;
  const box = name ? [...scope.querySelectorAll('[data-field]')].find((el) => el.dataset.field === name) : null;
  const target = box && box.querySelector('.field-error');
  if (target) {
    replace(target, messageOf(err));
    const input = box.querySelector('input, select, textarea');
    if (input) { input.setAttribute('aria-invalid', 'true'); input.focus(); }
  } else if (fallback) {
    replace(fallback, h('div', { class: 'error-box' }, messageOf(err)));
  }
}

/** A yes/no confirmation; resolves true when confirmed. */
export async function confirmDialog(title, text, { confirm = 'Remove' } = {}) {
  const r = await formDialog(title, h('p', null, text), async () => true, { submit: confirm, danger: true });
  return r === true;
}

/** Tabs: [{id, label}]; `current` id; onSelect(id). Arrow keys move between them. */
export function tabs(items, current, onSelect) {
  const bar = h('div', { class: 'tabs', role: 'tablist' });
  for (const t of items) {
    const b = h('button', {
      type: 'button', role: 'tab', id: `tab-${t.id}`, 'aria-selected': String(t.id === current), tabindex: t.id === current ? '0' : '-1',
      dataset: { tab: t.id }, on: { click: () => onSelect(t.id) },
    }, t.label);
    bar.appendChild(b);
  }
  bar.addEventListener('keydown', (e) => {
    if (e.key !== 'ArrowRight' && e.key !== 'ArrowLeft') return;
    const bs = [...bar.querySelectorAll('button')];
    const i = bs.indexOf(document.activeElement);
    if (i < 0) return;
    const next = bs[(i + (e.key === 'ArrowRight' ? 1 : bs.length - 1)) % bs.length];
    next.focus();
    next.click();
  });
  return bar;
}

/** Replaces the query of the current URL without a reload or a new history entry. */
export function setQuery(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null && v !== '') q.set(k, v);
  const s = q.toString();
  history.replaceState(null, '', `${location.pathname}${s ? `?${s}` : ''}`);
}

/**
 * Follows an SSE stream whose data is plain text (a log line), handing each event's data to
 * handlers[event] unparsed (a parsed JSON line would be rewritten): api.js's sse() in raw mode,
 * with its fresh ticket per connection, bounded retries and 401 handling. Returns {close()}.
 */
export function followText(url, handlers, options = {}) {
  return sse(url, handlers, { ...options, raw: true });
}

/**
 * A `coffer …` command the page tells the user to run, as a code element marked `data-cli`: a
 * test (tests/e2e/ui_cli_commands.rs) collects every one the console shows and runs it through
 * the real CLI's argument parser, so a command that would exit 2 fails it. Words in CAPITALS
 * are placeholders the user fills in (NAME, FOLDER).
 */
export function cli(command) {
  return h('code', { class: 'cli', 'data-cli': '' }, command);
}
