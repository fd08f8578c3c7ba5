// Chat page: files attached to the next message. The composer takes pasted images, dropped
// files and the attach button's file picker (on a phone: the camera or the photo library);
// each file shows in a tray above the text with a thumbnail (images) or its name, and a remove
// button. A file past the limits is refused inline, naming the limit, before anything is sent.
// Files go with the message as base64 (`POST …/messages {text, attachments}`); the server
// checks the limits again (settings chat.attachment_max_bytes / chat.attachment_max_files) and
// saves them in the conversation's working directory under .coffer/attachments/.
//
// Previews are data: URLs (the page's CSP allows `img-src 'self' data:`), kept per sent message
// so the sent message shows its images (render.js `rememberPreview`).
import { h, replace } from '../dom.js';
import { previewImg, rememberPreview, size } from './render.js';

/** The default limits (the server's settings may be lower; it says so when it refuses). */
export const MAX_FILE_BYTES = 10 * 1024 * 1024;
export const MAX_FILES = 4;
/** The image types shown as images (what the agents' model APIs take). */
const IMAGE = /^image\/(png|jpeg|gif|webp)$/;

/** A file's stand-in thumbnail: its extension in a box (`PDF`, `TXT`; `FILE` without one). */
export function fileIcon(name) {
  const m = /\.([A-Za-z0-9]{1,5})$/.exec(name || '');
  return h('span', { class: 'attach-icon', 'aria-hidden': 'true' }, m ? m[1].toUpperCase() : 'FILE');
}

/** Reads a File as a data URL. */
function readDataUrl(file) {
  return new Promise((resolve, reject) => {
    const r = new FileReader();
    r.onload = () => resolve(String(r.result));
    r.onerror = () => reject(r.error || new Error('cannot read the file'));
    r.readAsDataURL(file);
  });
}

/**
 * The tray of files for the next message. `onChange()` is called when files come or go.
 * Returns {el, button, count(), take(), restore(files), remember(messageId, files), addFiles(list)}.
 */
export function attachTray({ onChange }) {
  let files = []; // {name, mime, size, dataUrl}
  const picker = h('input', { type: 'file', multiple: true, class: 'attach-picker', hidden: true, tabindex: '-1', 'aria-hidden': 'true' });
  const button = h('button', {
    type: 'button', class: 'ghost attach-btn', title: 'Attach files or photos (or paste, or drop them here)',
    'aria-label': 'Attach files', on: { click: () => picker.click() },
  }, '+');
  const list = h('div', { class: 'attach-list', role: 'list' });
  const error = h('div', { class: 'attach-error', role: 'alert', hidden: true });
  const el = h('div', { class: 'attach-tray', hidden: true }, list, error, picker);
  picker.addEventListener('change', () => { addFiles(picker.files); picker.value = ''; });

  function say(msg) {
    error.textContent = msg || '';
    error.hidden = !msg;
  }

  function render() {
    replace(list, ...files.map((f, i) => {
      const thumb = IMAGE.test(f.mime) ? previewImg(f.dataUrl, f.name) : fileIcon(f.name);
      return h('div', { class: 'attach-item', role: 'listitem', title: `${f.name} (${size(f.size)})` },
        thumb,
        h('span', { class: 'attach-name' }, f.name),
        h('span', { class: 'attach-size hint' }, size(f.size)),
        h('button', {
          type: 'button', class: 'ghost attach-remove', 'aria-label': `Remove ${f.name}`, title: 'Remove',
          on: { click: () => { files.splice(i, 1); say(''); render(); } },
        }, '✕'));
    }));
    el.hidden = files.length === 0 && error.hidden;
    onChange();
  }

  /** Adds files (a FileList or array), refusing what is past the limits inline. */
  async function addFiles(list) {
    const incoming = Array.from(list || []);
    const refused = [];
    for (const file of incoming) {
      if (files.length >= MAX_FILES) { refused.push(`${file.name || 'a file'}: at most ${MAX_FILES} files per message`); continue; }
      if (file.size > MAX_FILE_BYTES) { refused.push(`${file.name || 'a file'} is ${size(file.size)}: over the limit of ${size(MAX_FILE_BYTES)} per file`); continue; }
      if (file.size === 0) { refused.push(`${file.name || 'a file'} is empty`); continue; }
      try {
        const dataUrl = await readDataUrl(file);
        const mime = file.type || 'application/octet-stream';
        const name = file.name || (IMAGE.test(mime) ? `pasted.${mime.slice(6).replace('jpeg', 'jpg')}` : 'file');
        files.push({ name, mime, size: file.size, dataUrl });
      } catch (e) {
        refused.push(`${file.name || 'a file'}: ${e.message}`);
      }
    }
    say(refused.length ? `Not attached: ${refused.join('; ')}.` : '');
    render();
  }

  return {
    el,
    button,
    addFiles,
    count: () => files.length,
    /** The files for a message, emptying the tray. */
    take() { const t = files; files = []; say(''); render(); return t; },
    /** Puts files back (a send that failed). */
    restore(back) { files = [...back, ...files].slice(0, MAX_FILES); render(); },
    /** Shows `message`'s refusal inline. */
    fail(message) { say(message); render(); },
    /** Keeps the previews of `sent` for the message `messageId` (the sent message shows them). */
    remember(messageId, sent) {
      sent.forEach((f, i) => { if (IMAGE.test(f.mime)) rememberPreview(messageId, i, f.dataUrl); });
    },
  };
}

/** The body of `POST …/messages` for `text` and tray files. */
export function messageBody(text, sent) {
  const body = { text };
  if (sent.length) {
    body.attachments = sent.map((f) => ({
      name: f.name,
      mime: f.mime,
      data_base64: f.dataUrl.slice(f.dataUrl.indexOf(',') + 1),
    }));
  }
  return body;
}
