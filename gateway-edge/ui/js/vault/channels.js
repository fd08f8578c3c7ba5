// Settings → Channels (/ui/settings?tab=channels): the IM channels the owner drives
// conversations from (GET/POST /v1/channels, PATCH/DELETE /v1/channels/{name}) with their kind,
// enabled flag, owner (paired or not), adapter state and last error; an add/edit dialog whose
// secret fields are password inputs (sent once and never shown back: they become credentials);
// enable/disable (POST …/{name}/enable|disable); "Pair" (POST …/{name}/pair) showing the one-time
// code large with its countdown and what to send; unpair (DELETE …/{name}/pair); remove with a
// confirmation.
import { h, replace, toast } from '../dom.js';
import { vget, vpost, vpatch, vdel, seg, errorBox, emptyState, table, field, formDialog, confirmDialog, messageOf } from './common.js';

const path = (name) => `/v1/channels/${seg(name)}`;

/** Each kind's secrets: [body field, label, hint]. */
const SECRETS = {
  telegram: [['bot_token', 'Bot token', 'from @BotFather, e.g. 123456:ABC…']],
  seatalk: [
    ['app_id', 'App ID', 'from the SeaTalk open platform'],
    ['app_secret', 'App secret', ''],
    ['signing_secret', 'Signing secret', 'verifies the callbacks'],
  ],
};

const AGENTS = [['', 'Claude Code (default)'], ['claude_code', 'Claude Code'], ['codex', 'Codex']];

/** The Owner cell: who is paired, a waiting code, or not paired. */
function ownerCell(c) {
  if (c.owner) {
    const who = c.owner.display ? `${c.owner.display} (${c.owner.id})` : c.owner.id;
    return h('div', null, h('span', { class: 'badge ok', dataset: { paired: 'true' } }, 'paired'), ' ', h('span', { class: 'small' }, who));
  }
  return h('div', null, h('span', { class: 'badge warn', dataset: { paired: 'false' } }, 'not paired'),
    c.pairing && c.pairing.pending ? h('div', { class: 'muted small' }, 'a code is waiting') : null);
}

/** The Adapter cell: the live state and the last error, or unknown while chat does not say. */
function adapterCell(c) {
  const a = c.adapter;
  // A disabled channel's adapter is stopped (or stopping: the coordinator follows within a tick).
  if (!c.enabled) return h('span', { class: 'badge', dataset: { adapter: 'stopped' } }, 'stopped');
  if (!a) {
    return h('span', { class: 'badge', dataset: { adapter: 'unknown' }, title: 'the chat service does not answer' }, 'unknown');
  }
  const kind = { running: 'ok', backoff: 'warn', failed: 'err' }[a.state] || '';
  return h('div', null,
    h('span', { class: `badge ${kind}`, dataset: { adapter: a.state } }, a.state),
    a.bot_username ? h('span', { class: 'muted small' }, ` @${a.bot_username}`) : null,
    a.last_error ? h('div', { class: 'field-error small channel-error' }, a.last_error) : null);
}

/** The secrets cell: which of the kind's secrets have a value. */
function secretsCell(c) {
  const set = c.credentials_set || {};
  const missing = Object.keys(set).filter((k) => !set[k]);
  return missing.length
    ? h('span', { class: 'badge err', dataset: { secrets: 'missing' }, title: `missing: ${missing.join(', ')}` }, `${missing.length} missing`)
    : h('span', { class: 'badge ok', dataset: { secrets: 'set' } }, 'set');
}

/** Mounts the Channels tab in `panel`. */
export async function channels(panel) {
  const add = h('button', { type: 'button', class: 'primary', on: { click: () => edit(null) } }, 'Add channel');
  const body = h('div', null, h('p', { class: 'muted loading' }, 'Loading…'));
  panel.append(h('div', { class: 'row' },
    h('p', { class: 'muted' }, 'Drive your conversations from Telegram or SeaTalk. Only the paired chat is served: pair a channel, then send the code to its bot. Secrets are stored as credentials and never shown again.'),
    h('span', { class: 'spacer' }), add), body);

  async function load() {
    let items;
    try {
      items = (await vget('/v1/channels')).items || [];
    } catch (e) {
      replace(body, errorBox(e, 'Could not list the channels', load));
      return;
    }
    if (!items.length) {
      replace(body, emptyState('No channel yet.', 'Add a Telegram bot or a SeaTalk app to talk to your agents from your phone.'));
      return;
    }
    replace(body, table([
      { label: 'Name', cell: (c) => h('div', null, h('strong', null, c.name), c.default_agent ? h('div', { class: 'muted small' }, c.default_agent) : null) },
      { label: 'Kind', cell: (c) => h('code', null, c.kind) },
      { label: 'Enabled', cell: (c) => h('span', { class: c.enabled ? 'badge ok' : 'badge', dataset: { enabled: String(c.enabled) } }, c.enabled ? 'on' : 'off') },
      { label: 'Owner', class: 'wrap', cell: ownerCell },
      { label: 'Adapter', class: 'wrap', cell: adapterCell },
      { label: 'Secrets', cell: secretsCell },
      { label: 'Actions', class: 'wrap', cell: (c) => h('div', { class: 'row nowrap' },
        h('button', { type: 'button', class: 'primary', on: { click: () => pair(c) } }, c.owner ? 'Re-pair' : 'Pair'),
        h('button', { type: 'button', on: { click: () => setEnabled(c, !c.enabled) } }, c.enabled ? 'Disable' : 'Enable'),
        h('button', { type: 'button', on: { click: () => edit(c) } }, 'Edit'),
        c.owner ? h('button', { type: 'button', class: 'ghost', on: { click: () => unpair(c) } }, 'Unpair') : null,
        h('button', { type: 'button', class: 'danger', on: { click: () => remove(c) } }, 'Remove')) },
    ], items, { key: (c) => c.name, caption: 'Channels' }));
  }

  async function setEnabled(c, on) {
    try {
      await vpost(`${path(c.name)}/${on ? 'enable' : 'disable'}`, {});
      toast(on ? `${c.name} enabled` : `${c.name} disabled`);
    } catch (e) {
      toast(messageOf(e), 'error');
    }
    load();
  }

  async function pair(c) {
    let r;
    try {
      r = await vpost(`${path(c.name)}/pair`, {});
    } catch (e) {
      toast(messageOf(e), 'error');
      return;
    }
    await pairDialog(c, r);
    load();
  }

  async function unpair(c) {
    if (!await confirmDialog(`Unpair ${c.name}?`, 'Every chat is refused until you pair it again.', { confirm: 'Unpair' })) return;
    try {
      await vdel(`${path(c.name)}/pair`);
      toast(`${c.name} unpaired`);
    } catch (e) {
      toast(messageOf(e), 'error');
    }
    load();
  }

  async function remove(c) {
    if (!await confirmDialog(`Remove ${c.name}?`, 'Its adapter stops and its owner is forgotten; conversations it started keep their history. Secrets stored for it go too unless something else uses them.', { confirm: 'Remove' })) return;
    try {
      await vdel(path(c.name));
      toast(`Removed ${c.name}`);
    } catch (e) {
      toast(messageOf(e), 'error');
    }
    load();
  }

  async function edit(c) {
    const done = await channelDialog(c);
    if (done) { toast(`${done.name} ${c ? 'saved' : 'added'}`); load(); }
  }

  load();
}

/** "m:ss" left until `expires` (ms since the epoch), or null once it passed. */
function left(expires) {
  const s = Math.round((expires - Date.now()) / 1000);
  if (s <= 0) return null;
  return `${Math.floor(s / 60)}:${String(s % 60).padStart(2, '0')}`;
}

/** The code, large, with its countdown and the instruction; resolves when closed. */
function pairDialog(c, r) {
  return new Promise((resolve) => {
    const expires = Date.parse(r.expires_at);
    const clock = h('span', { class: 'pair-countdown', 'aria-live': 'off' });
    const status = h('p', { class: 'muted' }, 'Valid for ', clock, ' more; a new code replaces it.');
    const code = h('div', { class: 'pair-code', dataset: { code: r.code }, 'aria-label': `pairing code ${r.code.split('').join(' ')}` }, r.code);
    const tick = () => {
      const l = left(expires);
      if (l) { replace(clock, l); return; }
      code.classList.add('expired');
      replace(status, h('span', { class: 'field-error' }, 'This code expired. Close and pair again for a new one.'));
      clearInterval(timer);
    };
    const timer = setInterval(tick, 1000);
    tick();
    const close = h('button', { type: 'button', class: 'primary', on: { click: () => d.close() } }, 'Done');
    const d = h('dialog', { class: 'modal pair-dialog', 'aria-label': `Pair ${c.name}` },
      h('h2', null, `Pair ${c.name}`),
      h('p', null, r.instruction.split('`').map((part, i) => (i % 2 ? h('code', null, part) : part))),
      code, status,
      r.warning ? h('div', { class: 'error-box pair-warning' }, r.warning) : null,
      h('div', { class: 'actions' }, close));
    d.addEventListener('close', () => { clearInterval(timer); d.remove(); resolve(); });
    document.body.appendChild(d);
    d.showModal();
  });
}

/** The add (c null) or edit dialog; resolves with the saved channel, or null. */
function channelDialog(c) {
  const name = field('Name', h('input', { type: 'text', value: c ? c.name : '', disabled: !!c, autocomplete: 'off', spellcheck: 'false' }), { name: 'name', hint: 'a-z, 0-9, -; up to 32' });
  const kind = field('Kind', h('select', { disabled: !!c }, [['telegram', 'Telegram'], ['seatalk', 'SeaTalk']].map(([k, label]) => h('option', { value: k, selected: c ? c.kind === k : k === 'telegram' }, label))), { name: 'kind' });
  const secretsBox = h('div', { class: 'channel-secrets' });
  let secretFields = [];
  const cfg = (c && c.agent_config) || {};
  const agent = field('Agent', h('select', null, AGENTS.map(([a, label]) => h('option', { value: a, selected: (c ? c.default_agent || '' : '') === a }, label))), { name: 'default_agent' });
  const cwd = field('Working directory', h('input', { type: 'text', value: cfg.cwd || '', autocomplete: 'off', spellcheck: 'false', placeholder: '/home/you/src/project' }), { name: 'agent_config', hint: 'absolute; empty: the agent’s default' });
  const model = field('Model', h('input', { type: 'text', value: cfg.model || '', autocomplete: 'off', spellcheck: 'false', placeholder: "empty: the agent's default" }), { name: 'model' });
  const base = field('API base URL', h('input', { type: 'url', value: c ? c.api_base_url || '' : '', autocomplete: 'off', spellcheck: 'false', placeholder: "empty: the platform's public API" }), { name: 'api_base_url' });
  const enabled = h('input', { type: 'checkbox', checked: c ? c.enabled : true });
  const sync = () => {
    const k = kind.input.value;
    secretFields = SECRETS[k].map(([f, label, hint]) => {
      const set = c && c.credentials_set && c.credentials_set[f];
      return [f, field(label, h('input', { type: 'password', autocomplete: 'new-password' }), { name: f, hint: set ? 'stored; leave empty to keep it' : hint || 'sent once; never shown again' })];
    });
    replace(secretsBox, secretFields.map(([, fl]) => fl.wrap));
  };
  kind.input.addEventListener('change', sync);
  sync();

  const content = h('div', { class: 'channel-form' },
    name.wrap, kind.wrap, secretsBox, agent.wrap, cwd.wrap, model.wrap, base.wrap,
    c ? null : h('label', { class: 'row' }, enabled, ' Enabled (its adapter starts at once)'));
  return formDialog(c ? `Edit ${c.name}` : 'Add a channel', content, async () => {
    const opt = (v) => (v.trim() === '' ? null : v.trim());
    const config = {};
    if (opt(cwd.input.value)) config.cwd = opt(cwd.input.value);
    if (opt(model.input.value)) config.model = opt(model.input.value);
    const secrets = {};
    for (const [f, fl] of secretFields) if (fl.input.value) secrets[f] = fl.input.value;
    let saved;
    try {
      if (c) {
        const body = { default_agent: opt(agent.input.value), agent_config: Object.keys(config).length ? config : null, api_base_url: opt(base.input.value), ...secrets };
        saved = await vpatch(path(c.name), body, { headers: { 'If-Match': `"${c.version}"` } });
      } else {
        const body = { name: name.input.value.trim(), kind: kind.input.value, enabled: enabled.checked, ...secrets };
        if (opt(agent.input.value)) body.default_agent = opt(agent.input.value);
        if (Object.keys(config).length) body.agent_config = config;
        if (opt(base.input.value)) body.api_base_url = opt(base.input.value);
        saved = await vpost('/v1/channels', body);
      }
    } catch (e) {
      // "signing_secret_ref is required …": say it next to the secret's own field, in words.
      const f = e && e.details && e.details.field;
      const own = f && f.endsWith('_ref') ? secretFields.find(([n]) => `${n}_ref` === f) : null;
      if (own && /is required/.test(e.message || '')) {
        const label = SECRETS[kind.input.value].find(([n]) => n === own[0])[1];
        e.details.field = own[0];
        e.message = `${label} is required for a ${kind.input.value === 'seatalk' ? 'SeaTalk' : 'Telegram'} channel.`;
      }
      // The typed secrets stay in their (password) fields for a retry; the dialog holds them
      // only until it closes.
      throw e;
    }
    // Saved: the secrets leave the page at once.
    for (const [, fl] of secretFields) fl.input.value = '';
    return saved;
  }, { submit: c ? 'Save' : 'Add', wide: true });
}
