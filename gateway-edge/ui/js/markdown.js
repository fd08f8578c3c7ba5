// Markdown for the console: `marked` parses (raw HTML in the source is shown as text, never
// parsed), highlight.js colours fenced code with classes only (the CSP forbids inline styles;
// colours are in app.css), and DOMPurify cleans the HTML against an allow-list before it
// becomes DOM. Links keep only http(s) and mailto URLs and open in a new tab without an opener;
// images become links (an image would be a request to another origin).
// Used by the chat page, and by the vault pages for skills and snippets.
import { Marked } from '../vendor/marked.esm.js';
import '../vendor/purify.min.js';
import hljs from '../vendor/highlight/core.min.js';
import bash from '../vendor/highlight/languages/bash.min.js';
import shell from '../vendor/highlight/languages/shell.min.js';
import javascript from '../vendor/highlight/languages/javascript.min.js';
import typescript from '../vendor/highlight/languages/typescript.min.js';
import python from '../vendor/highlight/languages/python.min.js';
import rust from '../vendor/highlight/languages/rust.min.js';
import json from '../vendor/highlight/languages/json.min.js';
import xml from '../vendor/highlight/languages/xml.min.js';
import go from '../vendor/highlight/languages/go.min.js';
import yaml from '../vendor/highlight/languages/yaml.min.js';
import diff from '../vendor/highlight/languages/diff.min.js';
import sql from '../vendor/highlight/languages/sql.min.js';
import ini from '../vendor/highlight/languages/ini.min.js';

// The UMD build of DOMPurify sets this global when loaded as a module.
const DOMPurify = globalThis.DOMPurify;

for (const [name, lang] of Object.entries({ bash, shell, javascript, typescript, python, rust, json, xml, go, yaml, diff, sql, ini })) {
  hljs.registerLanguage(name, lang);
}
hljs.registerAliases(['sh', 'zsh', 'console'], { languageName: 'bash' });
hljs.registerAliases(['toml'], { languageName: 'ini' });
hljs.registerAliases(['html', 'svg'], { languageName: 'xml' });
hljs.configure({ ignoreUnescapedHTML: true });

/** Code longer than this is not auto-detected (detection tries every language). */
const AUTO_DETECT_MAX = 4000;
/** Code longer than this is not highlighted at all (keeps a huge block cheap). */
const HIGHLIGHT_MAX = 200_000;

const ESC = { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' };
const escape = (s) => String(s).replace(/[&<>"']/g, (c) => ESC[c]);
const SAFE_LINK = /^(https?:|mailto:)/i;

function highlighted(text, lang) {
  const name = (lang || '').trim().split(/\s+/)[0].toLowerCase();
  if (text.length <= HIGHLIGHT_MAX) {
    try {
      if (name && hljs.getLanguage(name)) {
        return { html: hljs.highlight(text, { language: name, ignoreIllegals: true }).value, lang: name };
      }
      if (!name && text.length <= AUTO_DETECT_MAX) {
        const r = hljs.highlightAuto(text);
        if (r.language && r.relevance >= 5) return { html: r.value, lang: r.language };
      }
    } catch { /* fall through to plain text */ }
  }
  return { html: escape(text), lang: name.replace(/[^a-z0-9_+-]/g, '') };
}

const marked = new Marked({
  gfm: true,
  breaks: false,
  renderer: {
    // Raw HTML in the source is shown as the text it is.
    html({ text }) { return escape(text); },
    code({ text, lang }) {
      const { html, lang: l } = highlighted(text, lang);
      const cls = l ? `hljs language-${l}` : 'hljs';
      return `<pre><code class="${cls}">${html}</code></pre>\n`;
    },
    image({ href, text }) {
      const label = escape(text || href || 'image');
      return SAFE_LINK.test(href || '') ? `<a href="${escape(href)}">${label}</a>` : label;
    },
  },
});

const ALLOWED_TAGS = [
  'a', 'p', 'br', 'hr', 'em', 'strong', 'del', 's', 'code', 'pre', 'span', 'blockquote',
  'ul', 'ol', 'li', 'h1', 'h2', 'h3', 'h4', 'h5', 'h6', 'table', 'thead', 'tbody', 'tr', 'th', 'td',
  'input', 'sup', 'sub', 'kbd',
];
const ALLOWED_ATTR = ['href', 'title', 'class', 'start', 'type', 'checked', 'disabled', 'align'];

DOMPurify.addHook('uponSanitizeAttribute', (node, data) => {
  // Only task-list checkboxes may be inputs, and only disabled ones.
  if (node.nodeName === 'INPUT' && data.attrName === 'type' && data.attrValue !== 'checkbox') data.keepAttr = false;
  if (data.attrName === 'class' && !/^[\w\s-]*$/.test(data.attrValue)) data.keepAttr = false;
});
DOMPurify.addHook('afterSanitizeAttributes', (node) => {
  if (node.nodeName === 'A') {
    const href = node.getAttribute('href');
    if (href !== null && !SAFE_LINK.test(href.trim())) node.removeAttribute('href');
    if (node.hasAttribute('href')) {
      node.setAttribute('target', '_blank');
      node.setAttribute('rel', 'noopener noreferrer');
    }
  }
  if (node.nodeName === 'INPUT') {
    if (node.getAttribute('type') !== 'checkbox') node.remove();
    else node.setAttribute('disabled', '');
  }
});

const PURIFY = {
  ALLOWED_TAGS,
  ALLOWED_ATTR,
  ALLOWED_URI_REGEXP: /^(?:https?:|mailto:)/i,
  ALLOW_DATA_ATTR: false,
  ALLOW_ARIA_ATTR: false,
  RETURN_DOM_FRAGMENT: true,
};

/**
 * renderMarkdown(text) → DocumentFragment: GitHub-flavoured markdown, sanitized (tags and
 * attributes from a small allow-list; no raw HTML, styles, event handlers, `javascript:` or
 * `data:` URLs), code blocks highlighted by class. Links open in a new tab with
 * `rel="noopener noreferrer"`.
 */
export function renderMarkdown(text) {
  let html;
  try {
    html = marked.parse(String(text ?? ''), { async: false });
  } catch {
    const f = document.createDocumentFragment();
    f.appendChild(document.createTextNode(String(text ?? '')));
    return f;
  }
  return DOMPurify.sanitize(html, PURIFY);
}

/** Highlights `code` as `lang` (a name or alias; '' = guess for short code) → sanitized fragment. */
export function renderCode(code, lang = '') {
  const { html, lang: l } = highlighted(String(code ?? ''), lang);
  return DOMPurify.sanitize(`<pre><code class="hljs${l ? ` language-${l}` : ''}">${html}</code></pre>`, PURIFY);
}
