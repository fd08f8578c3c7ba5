// The console's clock: a `<time>` element for a moment (its `datetime` the exact instant, its
// title the full local date and time, its text short: "just now", "5 min ago", "14:05",
// "Yesterday 14:05", "Mon 14:05", "3 Dec, 14:05", "3 Dec 2025") and one ticker, shared by the
// whole page, that keeps every such text current. The ticker rewrites only the texts that
// changed (never a thread or list), and stops while the tab is hidden; it catches up at once when
// the tab is shown again. Used by the chat page's messages and conversation list.
import { h } from './dom.js';

/** How often the ticker runs (ms): a relative time's smallest step is a minute. */
const TICK_MS = 20_000;
let tickMs = TICK_MS;
let timer = 0;

const pad = (n) => String(n).padStart(2, '0');
const DAY = 86_400_000;

/** Local midnight before `ms`. */
function dayStart(ms) {
  const d = new Date(ms);
  d.setHours(0, 0, 0, 0);
  return d.getTime();
}

/** "14:05" (24-hour, local). */
function clock(d) { return `${pad(d.getHours())}:${pad(d.getMinutes())}`; }

/**
 * The short text of instant `ms` (unix ms) seen at `now`. `style`: `msg` (a message: relative
 * within the hour, then its clock time, with the day when not today) or `ago` (a list: relative
 * up to a day, then the date).
 */
export function shortTime(ms, now = Date.now(), style = 'msg') {
  const s = Math.round((now - ms) / 1000);
  if (s < 45) return 'just now'; // a clock a little ahead of this one counts as now
  if (s < 3600) return `${Math.max(1, Math.round(s / 60))} min ago`;
  const d = new Date(ms);
  const sameYear = d.getFullYear() === new Date(now).getFullYear();
  const date = d.toLocaleDateString(undefined, sameYear ? { day: 'numeric', month: 'short' } : { day: 'numeric', month: 'short', year: 'numeric' });
  if (style === 'ago') return s < 86400 ? `${Math.round(s / 3600)} h ago` : date;
  const today = dayStart(now);
  if (ms >= today) return clock(d);
  if (ms >= today - DAY) return `Yesterday ${clock(d)}`;
  if (ms >= today - 6 * DAY) return `${d.toLocaleDateString(undefined, { weekday: 'short' })} ${clock(d)}`;
  return sameYear ? `${date}, ${clock(d)}` : date;
}

/** The full local date and time of `ms`: "Monday, 7 December 2026 at 00:51:10". */
export function fullTime(ms) {
  return new Date(ms).toLocaleString(undefined, { dateStyle: 'full', timeStyle: 'medium' });
}

/**
 * A `<time>` for instant `ms` (unix ms), kept current by the ticker; `null` for an unknown one
 * (0, null, not a number). `style` as [`shortTime`]; `cls`: more classes.
 */
export function timeEl(ms, { style = 'msg', cls = '' } = {}) {
  const t = Number(ms);
  if (!Number.isFinite(t) || t <= 0) return null;
  const el = h('time', {
    class: `when${cls ? ` ${cls}` : ''}`,
    datetime: new Date(t).toISOString(),
    title: fullTime(t),
    dataset: { ms: String(t), style },
  }, shortTime(t, Date.now(), style));
  start();
  return el;
}

/** Brings every ticking `<time>` in the page up to date (only changed texts are written). */
export function tick() {
  const now = Date.now();
  for (const el of document.querySelectorAll('time.when[data-ms]')) {
    const text = shortTime(Number(el.dataset.ms), now, el.dataset.style);
    if (el.textContent !== text) el.textContent = text;
  }
}

/** Starts the ticker (idempotent; not while the tab is hidden). */
function start() {
  if (timer || document.hidden) return;
  timer = setInterval(tick, tickMs);
}

function stop() {
  clearInterval(timer);
  timer = 0;
}

/** Whether the ticker runs now (it does not while the tab is hidden). */
export function ticking() { return timer !== 0; }

/**
 * Sets the ticker's period (ms, at least 50) and restarts it: the tests' way of not waiting
 * minutes for a relative time to move. The page never calls it.
 */
export function setTickMs(ms) {
  tickMs = Math.max(50, Number(ms) || TICK_MS);
  stop();
  start();
}

document.addEventListener('visibilitychange', () => {
  if (document.hidden) { stop(); return; }
  tick();
  start();
});
