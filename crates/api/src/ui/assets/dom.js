// DOM helpers shared by the pages: element builder (text only, never HTML strings),
// the signed-in caller's permissions, the confirmation dialog, time formatting.

export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'dataset') Object.assign(el.dataset, v);
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

export const session = { me: null };

// Whether the caller may `verb` `resource` (`servers`, `servers/status`, ...), as
// /api/whoami said; the API decides again on every call.
export function can(verb, resource) {
  const r = session.me && session.me.resources && session.me.resources[resource];
  return !!r && r.includes(verb);
}

export function confirmAction(text) {
  const d = document.getElementById('confirm');
  document.getElementById('confirm-text').textContent = text;
  return new Promise((resolve) => {
    d.addEventListener('close', () => resolve(d.returnValue === 'ok'), { once: true });
    d.returnValue = '';
    d.showModal();
    document.getElementById('confirm-cancel').focus();
  });
}

let toastTimer = null;
export function toast(msg) {
  const t = document.getElementById('toast');
  t.textContent = msg;
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => { t.textContent = ''; }, 6000);
}

export function ago(ts, now) {
  if (!ts) return '';
  const s = Math.max(0, Math.floor(((now || Date.now()) - Date.parse(ts)) / 1000));
  if (s < 120) return s + 's';
  if (s < 7200) return Math.floor(s / 60) + 'm';
  if (s < 172800) return Math.floor(s / 3600) + 'h';
  return Math.floor(s / 86400) + 'd';
}

export function cond(obj, type) {
  const l = (obj && obj.status && obj.status.conditions) || [];
  return l.find((c) => c.type === type);
}

export function isTrue(obj, type) {
  const c = cond(obj, type);
  return !!c && c.status === 'True';
}

// A simple table: columns [{title, get(item) -> Node|string, state?(item)}].
export function table(caption, columns, items, emptyText) {
  if (!items.length) return h('p', { class: 'muted' }, emptyText || 'None.');
  return h('div', { class: 'table-wrap' }, h('table', {},
    h('caption', { class: 'muted' }, caption),
    h('thead', {}, h('tr', {}, columns.map((c) => h('th', { scope: 'col' }, c.title)))),
    h('tbody', {}, items.map((it) => h('tr', {}, columns.map((c) => {
      const st = c.state ? c.state(it) : undefined;
      return h('td', st ? { dataset: { state: st } } : {}, c.get(it));
    }))))));
}

export function meta(o) { return (o && o.metadata) || {}; }
export function key(o) { const m = meta(o); return (m.namespace ? m.namespace + '/' : '') + m.name; }
