// Chat page: how one message looks. Assistant text is markdown (sanitized, js/markdown.js);
// user text is plain text; tool calls are <details> cards, collapsed, with name, status, input
// and result; attached files are cards with their name, size and type (an image this page sent
// shows as the image at once; any other saved image is fetched from
// `GET …/messages/{id}/attachments/{name}` — with the session's key, so as a data: URL — and
// shown when it arrives; another file gets a Download button). Every message shows its time (a
// `<time>` kept current by js/clock.js); each reply ends with one quiet line: its status when
// it did not complete ("stopped", "failed", said once), the agent (and the LLM connection it
// was bound to), the model and the token usage when known (never "0 in · 0 out"). A code block
// of a reply has a Copy button. A tool call whose result will not come (the turn ended, was
// stopped or failed without it) says so instead of waiting. History copied from an
// imported agent session (`imported`) is marked as such, without a footer, its tool calls
// without results. A reply whose turn changed files has the changed-files block (js/chat/changes.js)
// above its footer. Everything user- or
// agent-controlled reaches the DOM as text or through the markdown sanitizer.
import { fetchBlob } from '../api.js';
import { timeEl } from '../clock.js';
import { h } from '../dom.js';
import { renderMarkdown } from '../markdown.js';
import { setChanges } from './changes.js';

/** Text blocks longer than this (bytes, roughly) are shown as plain text, cut, with "Show all". */
export const PLAIN_ABOVE = 256 * 1024;
/** How much of a huge text block is shown before "Show all". */
const PLAIN_HEAD = 64 * 1024;

/** "1.2 MB" for a byte count. */
export function size(n) {
  if (n < 1024) return `${n} B`;
  if (n < 1024 * 1024) return `${(n / 1024).toFixed(1)} KB`;
  return `${(n / 1024 / 1024).toFixed(1)} MB`;
}

/** A preview URL this page made itself (a data: URL of an image it read). */
const DATA_IMAGE = /^data:image\/(png|jpeg|gif|webp);base64,[A-Za-z0-9+/=]*$/;
/** Sent messages' image previews: `${messageId}#${index of the attachment}` → data URL. */
const previews = new Map();

/** Keeps the preview of message `messageId`'s `index`th attachment (this page sent it). */
export function rememberPreview(messageId, index, dataUrl) {
  previews.set(`${messageId}#${index}`, dataUrl);
}

/** An `<img>` for a data URL of an image this page read (anything else: null). */
export function previewImg(dataUrl, alt) {
  if (!dataUrl || !DATA_IMAGE.test(dataUrl)) return null;
  const img = h('img', { class: 'attach-img', alt: alt || '', decoding: 'async' });
  img.src = dataUrl; // not through h(): safeUrl keeps data: out of links; this is an image the page read
  return img;
}

/** The image types fetched and shown inline (what the server serves inline). */
const IMAGE_TYPE = /^image\/(png|jpeg|gif|webp)$/;
/** Saved images being fetched or fetched: `${messageId}#${index}` → Promise of a data URL (or null). */
const loading = new Map();

/** `GET …/attachments/{name}` of message `messageId` of conversation `convId`. */
export function attachmentUrl(convId, messageId, name) {
  const e = encodeURIComponent;
  return `/v1/conversations/${e(convId)}/messages/${e(messageId)}/attachments/${e(name)}`;
}

/** A Blob as a data: URL. */
function dataUrlOf(blob) {
  return new Promise((resolve, reject) => {
    const r = new FileReader();
    r.onload = () => resolve(String(r.result));
    r.onerror = () => reject(r.error || new Error('cannot read the file'));
    r.readAsDataURL(blob);
  });
}

/** Puts image `img` into attachment card `fig` (in place of its extension badge). */
function upgrade(fig, img) {
  if (!img || fig.classList.contains('image')) return;
  fig.classList.add('image');
  fig.querySelector('.attach-ext')?.remove();
  fig.insertBefore(img, fig.firstChild);
}

/**
 * Fetches the saved image of card `fig` (message `messageId`'s `index`th attachment `a`) and
 * shows it; once per attachment per page (the data URL is kept as its preview). A file that is
 * gone says so in the card.
 */
function loadSavedImage(fig, a, convId, messageId, index) {
  const key = `${messageId}#${index}`;
  let p = loading.get(key);
  if (!p) {
    p = fetchBlob(attachmentUrl(convId, messageId, a.name))
      .then(async (blob) => {
        if (!IMAGE_TYPE.test(blob.type)) return null;
        const url = await dataUrlOf(blob);
        rememberPreview(messageId, index, url);
        return url;
      })
      .catch((e) => { loading.delete(key); throw e; });
    loading.set(key, p);
  }
  p.then((url) => upgrade(fig, previewImg(url, a.name)))
    .catch((e) => {
      fig.classList.add('missing');
      fig.querySelector('figcaption')?.appendChild(h('span', { class: 'hint attach-missing' }, e && e.status === 404 ? ' · no longer in the folder' : ` · ${e.message}`));
    });
}

/** A button that downloads attachment `a` of message `messageId` (fetched with the session's key). */
function downloadButton(a, convId, messageId) {
  const b = h('button', {
    type: 'button', class: 'ghost attach-download', title: `Download ${a.name}`,
    on: {
      click: async () => {
        b.disabled = true;
        try {
          const blob = await fetchBlob(attachmentUrl(convId, messageId, a.name));
          const url = URL.createObjectURL(blob);
          const link = h('a', { download: a.name || 'file', hidden: true });
          link.href = url; // not through h(): a blob: URL this page just made
          document.body.appendChild(link);
          link.click();
          link.remove();
          setTimeout(() => URL.revokeObjectURL(url), 60000);
        } catch (e) {
          b.textContent = e.status === 404 ? 'No longer in the folder' : `Cannot download: ${e.message}`;
          return;
        } finally { b.disabled = false; }
      },
    },
  }, 'Download');
  return b;
}

/**
 * An attachment block: the image when this page has its preview, else a card with the file's
 * name, size and type (the file is in the conversation's working directory at `a.path`). With
 * `convId` (a stored message), a saved image without a preview is fetched and shown, and any
 * other file gets a Download button.
 */
export function attachmentEl(a, messageId, index, convId) {
  const img = previewImg(previews.get(`${messageId}#${index}`), a.name);
  const image = IMAGE_TYPE.test(a.mime || '');
  const fig = h('figure', { class: `block attachment${img ? ' image' : ''}`, dataset: { attachKey: `${messageId}#${index}` }, title: a.path || '' },
    img,
    h('figcaption', null, img ? null : h('span', { class: 'attach-ext', 'aria-hidden': 'true' }, extOf(a.name)),
      h('span', { class: 'attach-name' }, a.name || 'file'),
      h('span', { class: 'hint' }, ` ${size(Number(a.size || 0))} · ${a.mime || ''}`),
      convId && a.name && !image ? downloadButton(a, convId, messageId) : null));
  if (!img && image && convId && a.name) loadSavedImage(fig, a, convId, messageId, index);
  return fig;
}

/** A file name's extension for its badge (`PDF`), `FILE` without one. */
function extOf(name) {
  const m = /\.([A-Za-z0-9]{1,5})$/.exec(name || '');
  return m ? m[1].toUpperCase() : 'FILE';
}

/** Upgrades the attachment cards of message `messageId` under `root` to the images this page now has. */
export function showPreviews(root, messageId) {
  for (const fig of root.querySelectorAll('figure.attachment:not(.image)')) {
    const key = fig.dataset.attachKey || '';
    if (!key.startsWith(`${messageId}#`)) continue;
    const img = previewImg(previews.get(key), fig.querySelector('.attach-name')?.textContent || '');
    if (img) {
      fig.classList.add('image');
      fig.querySelector('.attach-ext')?.remove();
      fig.insertBefore(img, fig.firstChild);
    }
  }
}

/** A text block's element: markdown, or (for a huge one) a cut plain-text view. */
export function textBlock(text) {
  if (text.length > PLAIN_ABOVE) {
    const pre = h('div', { class: 'plain' }, text.slice(0, PLAIN_HEAD));
    const more = h('button', {
      type: 'button', class: 'ghost show-all',
      on: { click: () => { pre.textContent = text; more.remove(); } },
    }, `Show all (${size(text.length)})`);
    return h('div', { class: 'block text huge' },
      h('p', { class: 'hint' }, `A long message (${size(text.length)}): shown as plain text.`), pre, more);
  }
  const el = h('div', { class: 'block text md' });
  el.appendChild(renderMarkdown(text));
  addCopyButtons(el);
  return el;
}

/**
 * Puts `text` on the clipboard: the Clipboard API where the page is a secure context (https,
 * or the loopback address the console is served on), else a selected, hidden textarea and
 * `execCommand('copy')`. Resolves to whether it was copied.
 */
export async function copyText(text) {
  if (navigator.clipboard && window.isSecureContext) {
    try { await navigator.clipboard.writeText(text); return true; } catch { /* denied: the fallback may still work */ }
  }
  const back = document.activeElement;
  const ta = h('textarea', { class: 'copy-buffer', readonly: true, tabindex: '-1', 'aria-hidden': 'true' });
  ta.value = text;
  document.body.appendChild(ta);
  ta.select();
  let ok = false;
  try { ok = document.execCommand('copy'); } catch { ok = false; }
  ta.remove();
  if (back && back.focus) back.focus();
  return ok;
}

/** How long "Copied" stays on a copy button (ms). */
const COPIED_MS = 1600;

/** A Copy button for the code of `pre` (its text as written, without the highlighting). */
function copyButton(pre) {
  const label = h('span', { class: 'code-copy-label' }, 'Copy');
  let timer = 0;
  const b = h('button', {
    type: 'button', class: 'code-copy', title: 'Copy the code', 'aria-label': 'Copy the code',
    on: {
      click: async () => {
        const ok = await copyText((pre.querySelector('code') || pre).textContent);
        clearTimeout(timer);
        b.classList.toggle('copied', ok);
        b.classList.toggle('failed', !ok);
        label.textContent = ok ? 'Copied' : 'Cannot copy';
        b.setAttribute('aria-label', ok ? 'Copied' : 'Cannot copy: select the code and copy it');
        timer = setTimeout(() => {
          b.classList.remove('copied', 'failed');
          label.textContent = 'Copy';
          b.setAttribute('aria-label', 'Copy the code');
        }, COPIED_MS);
      },
    },
  }, label);
  return b;
}

/** Gives every code block (`pre`) under `root` a Copy button (once). */
export function addCopyButtons(root) {
  for (const pre of root.querySelectorAll('pre')) {
    if (pre.parentElement && pre.parentElement.classList.contains('code-wrap')) continue;
    const wrap = h('div', { class: 'code-wrap' });
    pre.replaceWith(wrap);
    wrap.append(pre, copyButton(pre));
  }
}

/** Pretty JSON of a tool input (an object, or the raw string the agent sent). */
function inputText(input) {
  if (typeof input === 'string') return input;
  try { return JSON.stringify(input, null, 2); } catch { return String(input); }
}

/** A tool call's card: `<details>` collapsed by default; `result` may come later (setResult). */
export function toolCard(use) {
  const status = h('span', { class: 'badge tool-status' }, 'running');
  const result = h('pre', { class: 'tool-result muted' }, 'waiting for the result…');
  const card = h('details', { class: 'block tool', dataset: { toolUseId: use.id || '' } },
    h('summary', null, h('span', { class: 'tool-icon', 'aria-hidden': 'true' }, '⚙'),
      h('span', { class: 'tool-name' }, use.name || '(unnamed tool)'), status),
    h('div', { class: 'tool-body' },
      h('div', { class: 'hint' }, 'Input'), h('pre', { class: 'tool-input' }, inputText(use.input ?? {})),
      h('div', { class: 'hint' }, 'Result'), result));
  card.setResult = (r) => {
    status.textContent = r.is_error ? 'error' : 'done';
    status.classList.add(r.is_error ? 'err' : 'ok');
    result.classList.remove('muted');
    result.textContent = r.output ?? '';
  };
  card.setImported = () => {
    status.textContent = 'imported';
    result.textContent = 'not kept: the transcript has it';
  };
  // The turn is over and no result came: it never will. `why` ends "No result: …".
  card.setStopped = (why) => {
    if (status.textContent !== 'running') return;
    status.textContent = 'no result';
    status.classList.add('warn');
    card.classList.add('orphan');
    result.textContent = `No result: ${why || 'the turn ended without it'}.`;
  };
  return card;
}

/** Why the tool calls of message `m` that have no result will not get one. */
export function noResultWhy(m) {
  if (m.status === 'interrupted') return 'the turn was stopped';
  if (m.status === 'failed') return 'the turn failed';
  return 'the turn ended without it';
}

const num = (x) => Number(x || 0).toLocaleString('en-US');

/**
 * The token usage of a reply, "1,234 in · 56 out" (cache reads and writes added when there
 * were some); '' when not known: a turn stopped or failed before the agent reported it stores
 * zeros, which are never shown as "0 in · 0 out".
 */
export function usageLine(m) {
  const u = m.usage;
  if (!u || !(u.input_tokens || u.output_tokens || u.cache_read_tokens || u.cache_write_tokens)) return '';
  const parts = [`${num(u.input_tokens)} in`, `${num(u.output_tokens)} out`];
  if (u.cache_read_tokens) parts.push(`${num(u.cache_read_tokens)} cached`);
  if (u.cache_write_tokens) parts.push(`${num(u.cache_write_tokens)} cache write`);
  return parts.join(' · ');
}

/** The usage's full wording, for its title. */
function usageTitle(u) {
  const parts = [`${num(u.input_tokens)} input tokens`, `${num(u.output_tokens)} output tokens`];
  if (u.cache_read_tokens) parts.push(`${num(u.cache_read_tokens)} read from the cache`);
  if (u.cache_write_tokens) parts.push(`${num(u.cache_write_tokens)} written to the cache`);
  return parts.join(', ');
}

/** The agents' names, for a reply's meta line and the imported-history marker. */
const AGENT_NAMES = { claude_code: 'Claude Code', codex: 'Codex' };

/** "Claude Code", "Codex", else the agent's key as it is. */
export function agentName(key) {
  return AGENT_NAMES[key] || key || '';
}

/** The one word of a reply that did not complete (said once, as a badge); null otherwise. */
function statusBadge(m) {
  if (m.status === 'interrupted') return h('span', { class: 'badge warn msg-status' }, 'stopped');
  if (m.status === 'failed') return h('span', { class: 'badge err msg-status' }, 'failed');
  return null;
}

/** " · "-separated spans of a meta line, empty parts left out. */
function dotted(...parts) {
  const out = [];
  for (const p of parts) {
    if (!p) continue;
    if (out.length) out.push(h('span', { class: 'sep', 'aria-hidden': 'true' }, ' · '));
    out.push(p);
  }
  return out;
}

/** A message's `<time>`: when it was sent (a reply: when its turn began, with how long it took). */
function whenEl(m) {
  const t = timeEl(m.created_ms);
  if (!t) return null;
  const took = m.role === 'assistant' && m.status !== 'streaming' && m.updated_ms && m.created_ms ? Math.round((m.updated_ms - m.created_ms) / 1000) : -1;
  if (took >= 1) t.title += ` · answered in ${took < 60 ? `${took} s` : `${Math.floor(took / 60)} min ${took % 60} s`}`;
  return t;
}

/**
 * The footer of an assistant message: its status when it did not complete, then one quiet line
 * (agent, model, usage, time; each only when known), then the error text (unless the body
 * already says it).
 */
export function footer(m) {
  const line = usageLine(m);
  const said = (m.blocks || []).some((b) => b.type === 'text' && b.text.trim() === (m.error || '').trim());
  const agent = agentName(m.agent_key);
  const who = agent ? h('span', { class: 'msg-agent', title: m.connection ? `${agent}, through the LLM connection ${m.connection}` : agent },
    agent, m.connection ? h('span', { class: 'msg-conn' }, ` via ${m.connection}`) : null) : null;
  return h('footer', { class: 'msg-foot' },
    statusBadge(m),
    h('span', { class: 'msg-about' }, ...dotted(
      who,
      m.model ? h('span', { class: 'msg-model', title: 'Model' }, m.model) : null,
      line ? h('span', { class: 'usage', title: usageTitle(m.usage) }, line) : null,
      whenEl(m))),
    m.error && !said ? h('span', { class: 'msg-error' }, m.error) : null);
}

/** The blocks of a message into `body`: text, tool cards (results joined to their calls). */
export function fillBlocks(body, m) {
  const cards = new Map();
  let attached = 0;
  for (const b of m.blocks || []) {
    if (b.type === 'text') {
      if (!b.text) continue;
      body.appendChild(m.role === 'user' ? h('div', { class: 'block text plain' }, b.text) : textBlock(b.text));
    } else if (b.type === 'tool_use') {
      const card = toolCard(b.tool_use || {});
      cards.set((b.tool_use || {}).id, card);
      body.appendChild(card);
    } else if (b.type === 'attachment') {
      body.appendChild(attachmentEl(b.attachment || {}, m.id, attached++, m.imported ? null : m.conversation_id));
    } else if (b.type === 'tool_result') {
      const r = b.tool_result || {};
      const card = cards.get(r.tool_use_id);
      if (card) card.setResult(r);
      else {
        const orphan = toolCard({ id: r.tool_use_id, name: '(tool result)' });
        orphan.setResult(r);
        body.appendChild(orphan);
      }
    }
  }
  if (m.imported) for (const c of cards.values()) c.setImported();
  else if (m.status !== 'streaming') for (const c of cards.values()) c.setStopped(noResultWhy(m));
  return cards;
}


/** The marker of a message copied from an imported agent session (read-only history). */
function importedBadge(m) {
  const agent = (m.source || '').replace(/^import:/, '');
  const name = AGENT_NAMES[agent] || agent || 'the agent';
  return h('span', { class: 'badge imported', title: `History from your ${name} session, read-only` }, `imported from ${name}`);
}

function sourceBadge(m) {
  const s = m.source || '';
  if (!s || s === 'ui' || s === 'web') return null;
  return h('span', { class: 'badge', title: `Sent from ${s}` }, s.startsWith('channel:') ? s.slice(8) : s);
}

/** One message's element (`article.msg.user` / `.assistant`, `data-id`). */
export function messageEl(m) {
  const body = h('div', { class: 'msg-body' });
  const el = h('article', { class: `msg ${m.role}${m.imported ? ' imported' : ''}`, dataset: { id: m.id, status: m.status } }, body);
  if (m.imported) {
    el.insertBefore(h('div', { class: 'msg-meta' }, importedBadge(m), whenEl(m)), body);
  } else if (m.role === 'user') {
    const badge = sourceBadge(m);
    if (badge) el.insertBefore(h('div', { class: 'msg-meta' }, badge), body);
  }
  if (m.role === 'user' && !m.imported) {
    const t = whenEl(m);
    if (t) el.appendChild(h('footer', { class: 'msg-foot user-foot' }, t));
  }
  fillBlocks(body, m);
  if (m.role === 'assistant') {
    if (m.status === 'streaming') {
      el.appendChild(h('footer', { class: 'msg-foot' }, h('span', { class: 'badge accent' }, 'in progress')));
    } else if (!m.imported) {
      if (!body.firstChild && !m.error) body.appendChild(h('p', { class: 'muted' }, '(no text)'));
      el.appendChild(footer(m));
    }
    if (m.files_changed) setChanges(el, m.files_changed, m.conversation_id);
  }
  return el;
}

/**
 * Puts one "Continued in Coffer" divider where imported history ends and the conversation's
 * own turns begin (before the first message that is not imported after one that is); none when
 * the thread shows no such boundary. Call after messages are added.
 */
export function markImportEnd(msgs) {
  for (const d of msgs.querySelectorAll('.import-divider')) d.remove();
  for (const el of msgs.querySelectorAll('article.msg.imported')) {
    let next = el.nextElementSibling;
    while (next && !next.matches('article.msg')) next = next.nextElementSibling;
    if (next && !next.classList.contains('imported')) {
      msgs.insertBefore(h('div', { class: 'import-divider', role: 'separator' }, 'Continued in Coffer'), next);
      return;
    }
  }
}
