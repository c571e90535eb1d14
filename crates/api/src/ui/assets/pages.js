// The pages other than Fleet: Machine (one server's timeline, inventory, claim, boot
// configuration and power actions), Claims, DHCP leases, Exports, Jobs, Events. Lists
// stay live through watchList(); actions are confirmed in a dialog and go through the
// REST API with the caller's credentials; buttons appear only for what
// /api/whoami allows.

import { G, get, patch, del, post, watchList, enc, ApiError } from './api.js';
import { h, can, confirmAction, toast, ago, cond, table, meta, key } from './dom.js';
import { bootStage } from './fleet.js';

const RESET = 'bootplane.dev/reset-requested';

function onErr(ctx, el) {
  return (e) => {
    if (e instanceof ApiError && e.status === 401) { ctx.onUnauthorized(); return; }
    el.textContent = String(e.message || e);
  };
}

// A live keyed collection rendered by `draw(items)` at most once per frame.
function liveList(path, draw, ctx, err, filter) {
  const map = new Map();
  let frame = 0;
  const flush = () => { frame = 0; draw([...map.values()].sort((a, b) => key(a) < key(b) ? -1 : 1)); };
  const sched = () => { if (!frame) frame = requestAnimationFrame(flush); };
  const stop = watchList(path, {
    onList(items) { map.clear(); for (const o of items) if (!filter || filter(o)) map.set(key(o), o); sched(); },
    onEvent(type, o) {
      if (filter && !filter(o)) return;
      if (type === 'DELETED') map.delete(key(o)); else map.set(key(o), o);
      sched();
    },
    onError: onErr(ctx, err),
  });
  return () => { stop(); if (frame) cancelAnimationFrame(frame); };
}

async function act(what, fn) {
  if (!(await confirmAction(what + '?'))) return;
  try { await fn(); toast(what + ': requested'); } catch (e) { toast(what + ' failed: ' + (e.message || e)); }
}

function powerButtons(name) {
  if (!can('patch', 'servers')) return null;
  const path = `${G.servers}/${enc(name)}`;
  return h('div', { class: 'actions', role: 'group', 'aria-label': 'Power' },
    h('button', { type: 'button', id: 'power-on', onclick: () => act(`Power on ${name}`, () => patch(path, { spec: { power: 'On' } })) }, 'Power on'),
    h('button', { type: 'button', id: 'power-off', class: 'danger', onclick: () => act(`Power off ${name}`, () => patch(path, { spec: { power: 'Off' } })) }, 'Power off'),
    h('button', { type: 'button', id: 'power-cycle', class: 'danger',
      onclick: () => act(`Power-cycle ${name}`, () => patch(path, { metadata: { annotations: { [RESET]: new Date().toISOString() } } })) }, 'Power cycle'));
}

function kv(pairs) {
  return h('dl', { class: 'kv' }, pairs.filter(([, v]) => v !== undefined && v !== null && v !== '')
    .flatMap(([k, v]) => [h('dt', {}, k), h('dd', {}, typeof v === 'object' && !(v instanceof Node) ? JSON.stringify(v) : v)]));
}

// ---------- Machine ----------

export function machinePage(view, [name], ctx) {
  const err = h('p', { class: 'error', role: 'alert' });
  const head = h('div');
  // Built once, not on every update: a button being clicked or focused stays in place.
  const actions = h('div');
  const timeline = h('section', { id: 'timeline', 'aria-label': 'Timeline' });
  const side = h('div', { class: 'cards' });
  view.append(h('p', {}, h('a', { href: '#/fleet' }, '← Fleet')), h('h1', {}, 'Server ', h('span', { id: 'machine-name' }, name)), err, head, actions, timeline, side);
  let server = null; let sbc = null; let claim = null; let events = null; let eventsMissing = false;
  let frame = 0;
  const draw = () => { frame = 0; render(); };
  const sched = () => { if (!frame) frame = requestAnimationFrame(draw); };
  const mine = (o) => meta(o).name === name;
  const stops = [];
  const one = (path, set, filter) => watchList(path, {
    onList(items) { set(items.find(filter) || null); sched(); },
    onEvent(type, o) { if (!filter(o)) return; set(type === 'DELETED' ? null : o); sched(); },
    onError: onErr(ctx, err),
  });
  const fs = (sel) => '?fieldSelector=' + enc(sel);
  stops.push(one(G.servers + fs('metadata.name=' + name), (o) => { server = o; }, mine));
  // Claims and boot configurations: all kept (small objects), matched at render time.
  const claims = new Map(); const sbcs = new Map();
  const keep = (map) => ({
    onList(items) { map.clear(); for (const o of items) map.set(key(o), o); sched(); },
    onEvent(type, o) { if (type === 'DELETED') map.delete(key(o)); else map.set(key(o), o); sched(); },
    onError: onErr(ctx, err),
  });
  stops.push(watchList(G.claims, keep(claims)));
  stops.push(watchList(G.sbcs, keep(sbcs)));
  const refTo = (o) => o.spec && o.spec.serverRef && o.spec.serverRef.name === name;
  const evMap = new Map();
  stops.push(watchList(G.events + fs(`involvedObject.kind=Server,involvedObject.name=${name}`), {
    onList(items) { evMap.clear(); for (const e of items) if (isMine(e)) evMap.set(key(e), e); events = evMap; sched(); },
    onEvent(type, e) { if (!isMine(e)) return; if (type === 'DELETED') evMap.delete(key(e)); else evMap.set(key(e), e); events = evMap; sched(); },
    onError(e) { if (e instanceof ApiError && e.status === 404) { eventsMissing = true; sched(); } else onErr(ctx, err)(e); },
  }));
  function isMine(e) { const io = e.involvedObject || {}; return io.kind === 'Server' && io.name === name; }

  function render() {
    const r = server && server.spec && server.spec.serverClaimRef;
    claim = (r && claims.get(`${r.namespace || 'default'}/${r.name}`)) || [...claims.values()].find(refTo) || null;
    sbc = (claim && sbcs.get(key(claim))) || [...sbcs.values()].find(refTo) || null;
    if (!server) { head.replaceChildren(h('p', { class: 'muted' }, 'No such server (yet).')); return; }
    const st = server.status || {};
    head.replaceChildren(
      kv([['State', h('span', { dataset: { state: st.state || '' }, id: 'machine-state' }, st.state || 'Unknown')],
        ['Power', h('span', { id: 'machine-power' }, `${st.powerState || '?'} (wanted ${(server.spec || {}).power || '-'})`)],
        ['Boot stage', bootStage(server, sbc)], ['Age', ago(meta(server).creationTimestamp)],
        ['Labels', Object.entries(meta(server).labels || {}).map(([k, v]) => `${k}=${v}`).join(', ')],
        // The agent writes consoleURL: linked only when http(s), else shown as text.
        ['Console', !st.consoleURL ? '' : /^https?:\/\//i.test(st.consoleURL)
          ? h('a', { href: st.consoleURL, rel: 'noopener noreferrer' }, 'console log') : String(st.consoleURL)]]));
    if (!actions.hasChildNodes()) actions.append(powerButtons(name) || h('span'));
    // Timeline: conditions (server, boot configuration, claim) and events, by time.
    const items = [];
    const fromConds = (o, what) => ((o && o.status && o.status.conditions) || []).forEach((c) => items.push({
      t: c.lastTransitionTime, type: c.status === 'False' ? 'Warning' : 'Normal',
      text: `${what}: ${c.type}=${c.status}${c.reason ? ' (' + c.reason + ')' : ''}${c.message ? ': ' + c.message : ''}` }));
    fromConds(server, 'Server');
    fromConds(sbc, 'Boot');
    fromConds(claim, 'Claim');
    if (claim) items.push({ t: meta(claim).creationTimestamp, type: 'Normal', text: `Claim ${key(claim)} created` });
    items.push({ t: meta(server).creationTimestamp, type: 'Normal', text: 'Server registered' });
    for (const e of (events ? events.values() : [])) {
      items.push({ t: e.lastTimestamp || e.firstTimestamp || meta(e).creationTimestamp, type: e.type,
        text: `${e.reason}: ${e.message}${e.count > 1 ? ` (×${e.count})` : ''}` });
    }
    items.sort((a, b) => (Date.parse(a.t) || 0) - (Date.parse(b.t) || 0));
    timeline.replaceChildren(h('h2', {}, 'Timeline'),
      eventsMissing ? h('p', { class: 'muted' }, 'Events are not available from this server: conditions only.') : '',
      h('ol', { class: 'timeline' }, items.map((i) => h('li', { dataset: { type: i.type || 'Normal' } },
        h('time', { datetime: i.t || '' }, i.t ? new Date(i.t).toLocaleString() : ''), i.text))));
    const nics = st.networkInterfaces || [];
    side.replaceChildren(
      h('section', { class: 'card', 'aria-label': 'Inventory' }, h('h2', {}, 'Inventory'),
        kv([['System UUID', (server.spec || {}).systemUUID], ['Manufacturer', st.manufacturer], ['Model', st.model],
          ['Serial', st.serialNumber], ['BIOS', st.bios && st.bios.version], ['Memory', st.totalSystemMemory],
          ['Processors', st.processors && st.processors.length], ['BMC', (server.spec || {}).bmcRef && server.spec.bmcRef.name]]),
        table('Network interfaces', [{ title: 'Name', get: (n) => n.name }, { title: 'MAC', get: (n) => n.macAddress }, { title: 'IP', get: (n) => n.ip || (n.ips || []).join(', ') }], nics, 'No interfaces reported.')),
      h('section', { class: 'card', 'aria-label': 'Claim' }, h('h2', {}, 'Claim'), claim
        ? [kv([['Name', key(claim)], ['Phase', h('span', { dataset: { state: (claim.status || {}).phase || '' } }, (claim.status || {}).phase || '-')],
          ['Image', (claim.spec || {}).image], ['Power', (claim.spec || {}).power]]), claimDelete(claim)]
        : h('p', { class: 'muted' }, 'Not claimed.')),
      h('section', { class: 'card', 'aria-label': 'Boot configuration' }, h('h2', {}, 'Boot configuration'), sbc
        ? kv([['Name', key(sbc)], ['State', (sbc.status || {}).state], ['Image', (sbc.spec || {}).image],
          ['Ignition secret', (sbc.spec || {}).ignitionSecretRef && sbc.spec.ignitionSecretRef.name]])
        : h('p', { class: 'muted' }, 'None.')));
  }
  return () => { stops.forEach((s) => s()); if (frame) cancelAnimationFrame(frame); };
}

function claimDelete(c) {
  if (!can('delete', 'serverclaims')) return '';
  const m = meta(c);
  return h('button', { type: 'button', class: 'danger', dataset: { claim: key(c) },
    onclick: () => act(`Delete claim ${key(c)}`, () => del(`${G.claimsIn(m.namespace || 'default')}/${enc(m.name)}`)) }, 'Delete claim');
}

// ---------- Claims ----------

export function claimsPage(view, _a, ctx) {
  const err = h('p', { class: 'error', role: 'alert' });
  const body = h('div', { id: 'claims' });
  view.append(h('h1', {}, 'Claims'), err, body);
  return liveList(G.claims, (items) => body.replaceChildren(table('Server claims', [
    { title: 'Claim', get: (c) => key(c) },
    { title: 'Phase', get: (c) => (c.status || {}).phase || 'Pending', state: (c) => (c.status || {}).phase || 'Pending' },
    { title: 'Server', get: (c) => { const r = (c.spec || {}).serverRef; return r ? h('a', { href: '#/machine/' + enc(r.name) }, r.name) : '-'; } },
    { title: 'Image', get: (c) => (c.spec || {}).image || '' },
    { title: 'Why', get: (c) => { const b = cond(c, 'Bound'); return b && b.status === 'False' ? b.message || b.reason : ''; } },
    { title: 'Age', get: (c) => ago(meta(c).creationTimestamp) },
    { title: '', get: (c) => claimDelete(c) },
  ], items, 'No claims.')), ctx, err);
}

// ---------- DHCP leases ----------

function ipNum(ip) { return ip.split('.').reduce((a, o) => a * 256 + Number(o), 0); }

export function leasesPage(view, _a, ctx) {
  const err = h('p', { class: 'error', role: 'alert' });
  const body = h('div', { id: 'leases' });
  const refresh = h('button', { type: 'button', onclick: load }, 'Refresh');
  view.append(h('h1', {}, 'DHCP leases'), h('div', { class: 'toolbar' }, refresh,
    h('span', { class: 'muted' }, 'Leases are not a watchable resource: refreshed on demand.')), err, body);
  async function load() {
    try {
      const v = await get(G.leases);
      const items = (v.items || []).slice().sort((a, b) => ipNum(a.ip) - ipNum(b.ip));
      const now = Date.now() / 1000;
      const active = (l) => l.state !== 'Released' && l.expires > now;
      // Pool usage per configured subnet, as the server counts it (`pools`); leases known
      // per subnet counted here.
      const inNet = (ip, cidr) => {
        const [net, len] = cidr.split('/');
        const bits = Number(len);
        const mask = bits === 0 ? 0 : (~0 << (32 - bits)) >>> 0;
        return ((ipNum(ip) & mask) >>> 0) === ((ipNum(net) & mask) >>> 0);
      };
      const pools = new Map();
      for (const p of (v.pools || [])) pools.set(p.subnet, { subnet: p.subnet, size: p.size, used: p.used, total: 0 });
      for (const l of items) {
        for (const p of pools.values()) if (inNet(l.ip, p.subnet)) { p.total++; break; }
      }
      body.replaceChildren(
        h('h2', {}, 'Pool usage'),
        table('Per subnet', [
          { title: 'Subnet', get: (p) => p.subnet },
          { title: 'Active', get: (p) => `${p.used} / ${p.size}` },
          { title: 'Usage', get: (p) => h('progress', { max: p.size, value: p.used, 'aria-label': `usage of ${p.subnet}` }) },
          { title: 'Leases known', get: (p) => p.total || 0 },
        ], [...pools.values()], 'No DHCP subnets configured.'),
        h('h2', {}, 'Leases'),
        table('Leases', [
          { title: 'IP', get: (l) => l.ip }, { title: 'MAC', get: (l) => l.mac }, { title: 'Hostname', get: (l) => l.hostname || '' },
          { title: 'State', get: (l) => l.state, state: (l) => (active(l) ? 'Bound' : 'Released') },
          { title: 'Expires', get: (l) => new Date(l.expires * 1000).toLocaleString() },
        ], items, 'No leases.'));
      err.textContent = '';
    } catch (e) { onErr(ctx, err)(e); }
  }
  load();
  return () => {};
}

// ---------- Exports ----------

export function exportsPage(view, _a, ctx) {
  const err = h('p', { class: 'error', role: 'alert' });
  const pol = h('div'); const rules = h('div');
  view.append(h('h1', {}, 'Exports and rules'), err, h('h2', {}, 'Export policies'), pol, h('h2', {}, 'Rules'), rules);
  const s1 = liveList(G.exports, (items) => pol.replaceChildren(table('Export policies', [
    { title: 'Name', get: key },
    { title: 'Spec', get: (o) => JSON.stringify(o.spec || {}) },
    { title: 'Exported', get: (o) => { const c = cond(o, 'Exported'); return c ? `${c.status} ${c.reason || ''}` : ''; } },
    { title: 'Age', get: (o) => ago(meta(o).creationTimestamp) },
  ], items, 'No export policies.')), ctx, err);
  const s2 = liveList(G.rules, (items) => rules.replaceChildren(table('Export policy rules', [
    { title: 'Name', get: key },
    { title: 'Spec', get: (o) => JSON.stringify(o.spec || {}) },
    { title: 'Applied', get: (o) => { const c = cond(o, 'Applied'); return c ? `${c.status} ${c.reason || ''}` : ''; } },
  ], items, 'No rules.')), ctx, err);
  return () => { s1(); s2(); };
}

// ---------- Jobs ----------

export function jobsPage(view, _a, ctx) {
  const err = h('p', { class: 'error', role: 'alert' });
  const body = h('div', { id: 'jobs' });
  view.append(h('h1', {}, 'Provisioning jobs'), err, body);
  const mayRetry = can('delete', 'serveractions') && can('create', 'serveractions');
  return liveList(G.actions, (items) => body.replaceChildren(table('Server actions', [
    { title: 'Action', get: key },
    { title: 'Server', get: (a) => { const r = (a.spec || {}).serverRef; return r ? h('a', { href: '#/machine/' + enc(r.name) }, r.name) : ''; } },
    { title: 'State', get: (a) => (a.status || {}).state || 'Pending', state: (a) => (a.status || {}).state || 'Pending' },
    { title: 'Progress', get: (a) => {
      const p = (a.status || {}).progress || {};
      const pct = p.percent !== undefined ? p.percent : (p.total ? Math.floor(100 * (p.bytes || 0) / p.total) : undefined);
      return h('span', {}, h('progress', { max: 100, value: pct !== undefined ? pct : false, 'aria-label': `progress of ${key(a)}` }),
        ` ${pct !== undefined ? pct + '%' : ''} ${p.stage || ''}${p.rate ? ` ${(p.rate / 1048576).toFixed(1)} MiB/s` : ''}`);
    } },
    { title: 'Reason', get: (a) => (a.status || {}).reason || '' },
    { title: '', get: (a) => (mayRetry && (a.status || {}).state === 'Failed') ? h('button', { type: 'button', onclick: () => act(`Retry ${key(a)}`, () => retry(a)) }, 'Retry') : '' },
  ], items, 'No provisioning jobs.')), ctx, err);
}

// Retry a failed action: the same spec again under the same name (a new UID: a new job).
async function retry(a) {
  const m = meta(a);
  const path = `${G.actionsIn(m.namespace || 'default')}/${enc(m.name)}`;
  await del(path);
  const body = { apiVersion: a.apiVersion, kind: a.kind, metadata: { name: m.name, namespace: m.namespace, labels: m.labels, annotations: m.annotations }, spec: a.spec };
  for (let i = 0; i < 20; i++) {
    try { await post(G.actionsIn(m.namespace || 'default'), body); return; } catch (e) {
      if (!(e instanceof ApiError && e.status === 409)) throw e; // still finalizing
      await new Promise((r) => setTimeout(r, 250));
    }
  }
  throw new Error('the old action is still being deleted');
}

// ---------- Events ----------

export function eventsPage(view, _a, ctx) {
  const err = h('p', { class: 'error', role: 'alert' });
  const body = h('div', { id: 'events' });
  view.append(h('h1', {}, 'Events'), err, body);
  return liveList(G.events, (items) => {
    items.sort((a, b) => (Date.parse(b.lastTimestamp) || 0) - (Date.parse(a.lastTimestamp) || 0));
    body.replaceChildren(table('Events, newest first', [
      { title: 'Last seen', get: (e) => ago(e.lastTimestamp) },
      { title: 'Type', get: (e) => e.type, state: (e) => e.type },
      { title: 'Reason', get: (e) => e.reason },
      { title: 'Object', get: (e) => { const o = e.involvedObject || {}; return o.kind === 'Server' ? h('a', { href: '#/machine/' + enc(o.name) }, `Server/${o.name}`) : `${o.kind}/${o.name}`; } },
      { title: 'Message', get: (e) => e.message },
      { title: 'Count', get: (e) => e.count || 1 },
    ], items.slice(0, 500), 'No events (or the server does not record them yet).'));
  }, ctx, err);
}
