// DOM helpers. Everything user-controlled reaches the page as text nodes or as attribute values
// set through these helpers: never through innerHTML (the one exception, rendered markdown, goes
// through the sanitizer in markdown.js).

const URL_OK = /^(https?:|mailto:|\/|#|\.\/)/i;

/** A URL safe to put in href/src: http(s), mailto, or same-origin relative; else "#". */
export function safeUrl(u) {
  const s = String(u ?? '').trim();
  return URL_OK.test(s) ? s : '#';
}

/**
 * h('button', {class: 'primary', on: {click: fn}, title: 'x'}, 'text', childNode, [more])
 * Attributes: `class`, `style` is refused (CSP), `on` maps events to functions, booleans set
 * or remove the attribute, `href`/`src` pass through safeUrl; children: strings become text.
 */
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  if (attrs) {
    for (const [k, v] of Object.entries(attrs)) {
      if (v === undefined || v === null || v === false) continue;
      if (k === 'on') {
        for (const [ev, fn] of Object.entries(v)) el.addEventListener(ev, fn);
      } else if (k === 'dataset') {
        Object.assign(el.dataset, v);
      } else if (k.startsWith('on')) {
        throw new Error(`h(): use {on: {...}} for event handlers, not ${k}`);
      } else if (k === 'href' || k === 'src') {
        el.setAttribute(k, safeUrl(v));
      } else if (k === 'value') {
        el.value = v;
      } else if (v === true) {
        el.setAttribute(k, '');
      } else {
        el.setAttribute(k, String(v));
      }
    }
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === undefined || c === null || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else if (c instanceof Node) el.appendChild(c);
    else el.appendChild(document.createTextNode(String(c)));
  }
}

/** Replaces every child of `el` with `children`. */
export function replace(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

/** A transient message at the bottom of the screen; kind: 'info' | 'error'. */
export function toast(message, kind = 'info') {
  const box = document.getElementById('toasts');
  const t = h('div', { class: `toast ${kind}`, role: kind === 'error' ? 'alert' : 'status' }, message);
  box.appendChild(t);
  setTimeout(() => t.remove(), kind === 'error' ? 8000 : 4000);
}

/** "3 min ago" for a unix-ms timestamp (or RFC 3339 string). */
export function ago(t) {
  const ms = typeof t === 'number' ? t : Date.parse(t);
  if (!ms) return '';
  const s = Math.round((Date.now() - ms) / 1000);
  if (s < 45) return 'just now';
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${Math.round(s / 3600)} h ago`;
  return new Date(ms).toLocaleDateString();
}

/** A modal <dialog> with `content`; resolves with the form's data on submit, null on cancel. */
export function dialog(title, content, { submit = 'Save' } = {}) {
  return new Promise((resolve) => {
    const form = h('form', { method: 'dialog', class: 'dialog-form' },
      h('h2', null, title), content,
      h('div', { class: 'actions' },
        h('button', { type: 'button', class: 'ghost', value: 'cancel', on: { click: () => { d.close(); } } }, 'Cancel'),
        h('button', { type: 'submit', class: 'primary', value: 'ok' }, submit)));
    const d = h('dialog', { class: 'modal' }, form);
    let result = null;
    form.addEventListener('submit', (e) => { e.preventDefault(); result = new FormData(form); d.close(); });
    d.addEventListener('close', () => { d.remove(); resolve(result); });
    document.body.appendChild(d);
    d.showModal();
  });
}
