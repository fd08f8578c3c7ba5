// Chat page: what a turn changed in the conversation's folder (issue 34 §4). Under an assistant
// message whose turn changed files (the message's `files_changed`, or the `files_changed` event
// that follows the turn's end) a one-line summary ("3 files changed +12 −4") opens to the list:
// a marker (A added, M modified, D deleted, R renamed), the path and the line counts. A file
// opens the diff viewer, a dialog that reads `GET …/messages/{id}/diff?path=` and draws the
// unified diff with diff2html (vendor/diff2html-ui-base.min.js: a UMD bundle, loaded once as a
// classic script on first use), unified or side by side (the choice is kept in localStorage; at
// a phone's width (≤ 600 px) it is always unified), syntax highlighted by the file's extension
// with the page's highlight.js. Long diffs are folded: the unchanged lines between hunks (not in
// the diff: the service keeps 3 lines of context) are one "⋯ N unchanged lines" row, and a diff
// longer than FOLD_LINES lines shows its start with "Show the remaining N lines". What is not a
// line diff (a binary file, content not kept, a file too large, a rename without changes) is said
// in a sentence. File names and lines are escaped by diff2html, and its HTML passes DOMPurify
// before it becomes DOM; everything else here is text nodes.
import { get, withQuery } from '../api.js';
import { h, replace } from '../dom.js';
import '../markdown.js'; // registers highlight.js's languages on the shared instance
import '../../vendor/purify.min.js';
import hljs from '../../vendor/highlight/core.min.js';
import css from '../../vendor/highlight/languages/css.min.js';
import markdown from '../../vendor/highlight/languages/markdown.min.js';

hljs.registerLanguage('css', css);
hljs.registerLanguage('markdown', markdown);
// diff2html highlights a file of an unknown type as `plaintext`, which the core build lacks.
if (!hljs.getLanguage('plaintext')) hljs.registerLanguage('plaintext', () => ({ name: 'Plain text', contains: [], disableAutodetect: true }));

const DOMPurify = globalThis.DOMPurify;

/** Diff lines drawn before "Show the remaining N lines". */
export const FOLD_LINES = 400;
/** The localStorage key of the chosen layout: `unified` | `split`. */
const LAYOUT_KEY = 'coffer.diff.layout';
/** At or below this width side by side is not offered (the page's phone layout). */
const NARROW = '(max-width: 600px)';

const MARKS = {
  added: ['A', 'added'],
  modified: ['M', 'modified'],
  deleted: ['D', 'deleted'],
  renamed: ['R', 'renamed'],
};

const num = (n) => Number(n || 0).toLocaleString('en-US');

/** "+12" and "−4" spans. */
function counts(add, del) {
  const zero = (n) => (Number(n || 0) ? '' : ' zero');
  return [h('span', { class: `count-add${zero(add)}` }, `+${num(add)}`), h('span', { class: `count-del${zero(del)}` }, `\u2212${num(del)}`)];
}

/** The marker of a change kind: a letter with the kind as its accessible name. */
function mark(change) {
  const [letter, word] = MARKS[change] || ['?', change || 'changed'];
  return h('span', { class: `change-mark ${change || ''}`, title: word, 'aria-label': word, role: 'img' }, letter);
}

/**
 * The changed-files block of assistant message `messageId` of conversation `convId`, from its
 * `files_changed` ({files: [{path, change, old_path, additions, deletions, binary}], truncated,
 * note}); null when it lists nothing and has no note.
 */
export function changesEl(fc, convId, messageId) {
  const files = (fc && fc.files) || [];
  if (!files.length && !(fc && fc.note)) return null;
  let add = 0;
  let del = 0;
  for (const f of files) { add += Number(f.additions || 0); del += Number(f.deletions || 0); }
  const n = files.length;
  // No list but a note: the folder could not be compared (too many files…); the note says why.
  const label = n ? `${n}${fc.truncated ? '+' : ''} ${n === 1 && !fc.truncated ? 'file' : 'files'} changed` : 'Changed files not listed';
  const list = h('ul', { class: 'changes-list' }, files.map((f, i) => h('li', null,
    h('button', {
      type: 'button',
      class: 'change-file',
      dataset: { path: f.path, change: f.change || '' },
      title: f.old_path ? `${f.old_path} → ${f.path}` : f.path,
      on: { click: (e) => openDiff(convId, messageId, files, i, e.currentTarget) },
    },
    mark(f.change),
    h('span', { class: 'change-path', dir: 'ltr' }, f.old_path ? h('span', { class: 'old-path' }, `${f.old_path} → `) : null, f.path),
    f.binary ? h('span', { class: 'change-counts muted' }, 'binary') : h('span', { class: 'change-counts' }, counts(f.additions, f.deletions))))));
  return h('details', { class: 'block changes', dataset: { messageId } },
    h('summary', null,
      h('span', { class: 'changes-icon', 'aria-hidden': 'true' }, '±'),
      h('span', { class: 'changes-label' }, label),
      n ? h('span', { class: 'change-counts' }, counts(add, del)) : null),
    fc.note ? h('p', { class: 'hint changes-note' }, fc.note) : null,
    list,
    fc.truncated && n ? h('p', { class: 'hint changes-note' }, 'More files changed than are listed.') : null);
}

/** Puts (or replaces) the changed-files block of message element `article`. */
export function setChanges(article, fc, convId) {
  const el = changesEl(fc, convId, article.dataset.id);
  const old = article.querySelector(':scope > .changes');
  const open = old && old.open;
  if (old) old.remove();
  if (!el) return;
  el.open = Boolean(open);
  article.insertBefore(el, article.querySelector(':scope > .msg-foot'));
}

// ---- the diff viewer ----

let loading = null;

/** diff2html's UI class, loading its bundle and stylesheet on first use. */
function diff2html() {
  if (globalThis.Diff2HtmlUI) return Promise.resolve(globalThis.Diff2HtmlUI);
  if (!loading) {
    // Both the stylesheet and the script, so the first diff is never drawn unstyled.
    const fetched = (el, parent, before = null) => new Promise((resolve, reject) => {
      el.addEventListener('load', resolve);
      el.addEventListener('error', () => { el.remove(); reject(new Error('the diff viewer could not be loaded')); });
      parent.insertBefore(el, before);
    });
    // Before app.css: the page's own rules for the diff (same specificity) win.
    const link = h('link', { rel: 'stylesheet', href: '/ui/assets/vendor/diff2html.min.css' });
    const script = document.createElement('script');
    script.src = '/ui/assets/vendor/diff2html-ui-base.min.js';
    loading = Promise.all([
      fetched(link, document.head, document.querySelector('link[rel="stylesheet"][href$="app.css"]')),
      fetched(script, document.head),
    ]).then(() => globalThis.Diff2HtmlUI, (e) => { loading = null; throw e; });
  }
  return loading;
}

/** The chosen layout: `unified` or `split`. */
function layout() {
  try { return localStorage.getItem(LAYOUT_KEY) === 'split' ? 'split' : 'unified'; } catch { return 'unified'; }
}

function setLayout(v) {
  try { localStorage.setItem(LAYOUT_KEY, v); } catch { /* private mode: not kept */ }
}

/** `@@ -a,b +c,d @@` → {oldStart, oldCount}. */
const HUNK = /^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@/;

/**
 * What the diff text holds: `lines` (the diff's lines), `hunks` (each hunk's old start and
 * length), `cut` (the service's "… diff cut at" line, taken off), `sentence` (the text when it is
 * no line diff).
 */
export function parseDiff(text) {
  const lines = text.replace(/\n$/, '').split('\n');
  let cut = null;
  if (lines.length && /^… diff cut at /.test(lines[lines.length - 1])) cut = lines.pop();
  const hunks = [];
  for (const l of lines) {
    const m = HUNK.exec(l);
    if (m) hunks.push({ oldStart: Number(m[1]), oldCount: m[2] === undefined ? 1 : Number(m[2]) });
  }
  const isDiff = hunks.length > 0 || lines[0]?.startsWith('--- ');
  return { lines, hunks, cut, sentence: isDiff ? null : text.trim() };
}

/** The labels of the hunk rows: "⋯ N unchanged lines" before a hunk, '' where none are hidden. */
function gapLabels(hunks) {
  let next = 1;
  return hunks.map((hk) => {
    // A hunk of zero old lines (an insertion) starts after line `oldStart`.
    const start = hk.oldCount === 0 ? hk.oldStart + 1 : hk.oldStart;
    const gap = Math.max(0, start - next);
    next = start + hk.oldCount;
    return gap ? `\u22ef ${num(gap)} unchanged ${gap === 1 ? 'line' : 'lines'}` : '';
  });
}

/**
 * Opens the diff viewer on `files[index]` of message `messageId`; `from`: the element focus goes
 * back to when it closes.
 */
export function openDiff(convId, messageId, files, index, from) {
  let i = index;
  let showAll = false;
  let current = null; // {file, parsed}
  const narrow = matchMedia(NARROW);
  const title = h('h2', { class: 'diff-path', id: 'diff-path', dir: 'ltr' });
  const headCounts = h('span', { class: 'change-counts' });
  let headMark = h('span');
  const unifiedBtn = h('button', { type: 'button', class: 'seg-btn', dataset: { layout: 'unified' }, on: { click: () => choose('unified') } }, 'Unified');
  const splitBtn = h('button', { type: 'button', class: 'seg-btn', dataset: { layout: 'split' }, on: { click: () => choose('split') } }, 'Side by side');
  const prev = h('button', { type: 'button', class: 'ghost diff-prev', 'aria-label': 'Previous file', title: 'Previous file ([)', on: { click: () => go(-1) } }, '‹');
  const next = h('button', { type: 'button', class: 'ghost diff-next', 'aria-label': 'Next file', title: 'Next file (])', on: { click: () => go(1) } }, '›');
  const position = h('span', { class: 'hint diff-position' });
  const close = h('button', { type: 'button', class: 'ghost diff-close', 'aria-label': 'Close the diff', title: 'Close (Esc)', on: { click: () => d.close() } }, '✕');
  const note = h('div', { class: 'diff-note', hidden: true });
  const body = h('div', { class: 'diff-body', tabindex: '0', 'aria-label': 'The diff' });
  const d = h('dialog', { class: 'modal diffview', 'aria-labelledby': 'diff-path' },
    h('header', { class: 'diff-head' },
      h('div', { class: 'diff-title' }, headMark, title, headCounts),
      h('div', { class: 'diff-tools' },
        h('div', { class: 'seg', role: 'group', 'aria-label': 'Layout' }, unifiedBtn, splitBtn),
        files.length > 1 ? h('span', { class: 'diff-nav' }, prev, position, next) : null,
        close)),
    note, body);

  function syncTools() {
    const split = layout() === 'split' && !narrow.matches;
    unifiedBtn.setAttribute('aria-pressed', String(!split));
    splitBtn.setAttribute('aria-pressed', String(split));
    splitBtn.disabled = narrow.matches;
    splitBtn.title = narrow.matches ? 'Side by side needs a wider screen' : '';
    prev.disabled = i === 0;
    next.disabled = i === files.length - 1;
    position.textContent = `${i + 1} of ${files.length}`;
  }

  function choose(v) {
    setLayout(v);
    syncTools();
    draw();
  }

  function go(step) {
    const j = i + step;
    if (j < 0 || j >= files.length) return;
    i = j;
    load();
  }

  async function load() {
    const f = files[i];
    showAll = false;
    current = null;
    replace(title, f.old_path ? h('span', { class: 'old-path' }, `${f.old_path} → `) : null, f.path);
    replace(headCounts, ...(f.binary ? [h('span', { class: 'muted' }, 'binary')] : counts(f.additions, f.deletions)));
    headMark.replaceWith(headMark = mark(f.change));
    syncTools();
    say(null);
    replace(body, h('p', { class: 'muted diff-loading' }, 'Loading the diff…'));
    try {
      const [ui, r] = await Promise.all([diff2html(), get(withQuery(
        `/v1/conversations/${encodeURIComponent(convId)}/messages/${encodeURIComponent(messageId)}/diff`, { path: f.path }))]);
      if (files[i] !== f || !d.open) return;
      current = { file: f, parsed: parseDiff(r.diff || ''), ui };
      draw();
    } catch (e) {
      if (files[i] !== f) return;
      replace(body, h('p', { class: 'error-box' }, `Cannot show this diff: ${e.message}`));
    }
  }

  function say(text) {
    note.hidden = !text;
    replace(note, text || '');
  }

  function draw() {
    if (!current) return;
    const { file: f, parsed, ui } = current;
    if (parsed.sentence !== null) {
      // Not a line diff: say what the service said, plainly.
      say(null);
      const s = parsed.sentence || 'No line changes.';
      replace(body, h('p', { class: 'diff-sentence' }, s.charAt(0).toUpperCase() + s.slice(1)));
      return;
    }
    const notes = [];
    if (f.change === 'deleted') notes.push('This file was deleted: its last content is shown as removed lines.');
    if (f.change === 'added') notes.push('A new file.');
    if (parsed.cut) notes.push(`The diff is longer than the service keeps (${parsed.cut.replace(/^… /, '')}).`);
    say(notes.join(' '));
    if (!parsed.hunks.length) {
      replace(body, h('p', { class: 'diff-sentence' }, f.change === 'deleted' ? 'The file was empty.' : 'The file is empty.'));
      return;
    }
    const folded = !showAll && parsed.lines.length > FOLD_LINES;
    const lines = folded ? parsed.lines.slice(0, FOLD_LINES) : parsed.lines;
    const split = layout() === 'split' && !narrow.matches;
    const target = h('div', { class: 'diff-render' });
    const view = new ui(target, `${lines.join('\n')}\n`, {
      outputFormat: split ? 'side-by-side' : 'line-by-line',
      drawFileList: false,
      matching: 'lines',
      diffStyle: 'word',
      colorScheme: 'auto',
      highlight: true,
      synchronisedScroll: true,
      fileListToggle: false,
      fileContentToggle: false,
      stickyFileHeaders: false,
      maxLineLengthHighlight: 2000,
    }, hljs);
    // diff2html escapes what it draws; the HTML is cleaned all the same before it becomes DOM.
    view.diffHtml = DOMPurify.sanitize(view.diffHtml);
    view.draw();
    labelGaps(target, gapLabels(parsed.hunks));
    const parts = [target];
    if (folded) {
      const rest = parsed.lines.length - FOLD_LINES;
      parts.push(h('div', { class: 'diff-fold' },
        h('span', { class: 'hint' }, `Showing the first ${num(FOLD_LINES)} of ${num(parsed.lines.length)} lines.`),
        h('button', { type: 'button', class: 'diff-show-rest', on: { click: () => { showAll = true; draw(); body.focus(); } } },
          `Show the remaining ${num(rest)} ${rest === 1 ? 'line' : 'lines'}`)));
    }
    replace(body, ...parts);
  }

  const onNarrow = () => { syncTools(); draw(); };
  narrow.addEventListener('change', onNarrow);
  d.addEventListener('close', () => {
    narrow.removeEventListener('change', onNarrow);
    d.remove();
    if (from && from.isConnected) from.focus();
  });
  d.addEventListener('keydown', (e) => {
    if (e.target instanceof HTMLInputElement || e.altKey || e.ctrlKey || e.metaKey) return;
    if (e.key === '[' || e.key === ']') { e.preventDefault(); go(e.key === '[' ? -1 : 1); }
  });
  document.body.appendChild(d);
  d.showModal();
  close.focus();
  load();
  return d;
}

/**
 * Replaces the text of each table's hunk rows (`@@ … @@`) under `root` with `labels[i]` ("⋯ N
 * unchanged lines", the header kept as its title); a hunk row with nothing hidden before it
 * goes. Side by side has two tables with the same rows: both get the same treatment.
 */
function labelGaps(root, labels) {
  for (const table of root.querySelectorAll('table.d2h-diff-table')) {
    const rows = [...table.querySelectorAll('tr')].filter((tr) => tr.querySelector('td.d2h-info:not(.d2h-code-linenumber):not(.d2h-code-side-linenumber)'));
    rows.forEach((tr, k) => {
      const label = labels[k] ?? '';
      const cell = tr.querySelector('.d2h-code-line, .d2h-code-side-line') || tr.lastElementChild;
      const header = cell.textContent.trim();
      if (!label) { tr.classList.add('diff-gap-none'); return; }
      tr.classList.add('diff-gap');
      if (header) tr.title = header;
      cell.textContent = label;
    });
  }
}
