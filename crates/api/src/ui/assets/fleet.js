// The Fleet page: every Server with its state, power, claim, boot stage and age, kept
// live by two watches (Servers, and ServerBootConfigurations for the boot stage).
// Events are applied in batches, once per animation frame; only the rows in view
// exist in the DOM (virtual scrolling), so 10,000 servers changing 1,000 times a
// second cost one pass over an array and ~30 row updates per frame.
//
// Performance API: `bootplane:fleet-rendered` is marked once the first full list is
// in the DOM; every frame that applied watch events records its latency (event
// arrival → rows updated) in a bounded ring, readable as window.bootplaneFleetStats.

import { G, watchList, enc } from './api.js';
import { h, ago, cond } from './dom.js';

const ROW = 32;
const RING = 4096;

export function bootStage(server, sbc) {
  const st = (server && server.status && server.status.state) || '';
  if (!sbc) return st === 'Discovery' ? 'Discovery' : '-';
  const c = (t) => { const x = cond(sbc, t); return x && x.status === 'True'; };
  if (c('IgnitionDataFetched')) return 'Ignition';
  if (c('IPXEScriptFetched')) return 'Script';
  const s = sbc.status && sbc.status.state;
  if (s === 'Error') return 'Error';
  if (s === 'Ready') return 'Configured';
  return 'Pending';
}

export function fleetPage(view, _args, ctx) {
  const servers = new Map();
  const sbcs = new Map(); // server name -> boot configuration
  let names = [];          // sorted names of `servers`
  let shown = [];          // names after the state filter
  let namesDirty = true;
  let filterDirty = true;
  let pending = [];        // arrival times of events not yet rendered
  let frame = 0;
  let stateFilter = '';
  let listedOnce = false;
  let focusIndex = -1;
  const stats = { updates: [], next: 0, rendered: null };
  window.bootplaneFleetStats = stats;

  const selector = h('input', { id: 'fleet-selector', type: 'search', placeholder: 'label selector, e.g. rack=r1,!spare',
    'aria-label': 'Label selector', size: 28 });
  const counts = h('div', { class: 'counts', role: 'group', 'aria-label': 'Servers per state' });
  const live = h('span', { class: 'live', id: 'fleet-live', 'aria-live': 'polite' }, 'connecting');
  const total = h('span', { id: 'fleet-total', class: 'muted' });
  const spacer = h('div', { class: 'spacer' });
  const scroller = h('div', { class: 'vscroll', id: 'fleet-rows', role: 'grid', tabindex: '0', 'aria-label': 'Servers' }, spacer);
  const err = h('p', { class: 'error', role: 'alert' });
  view.append(
    h('h1', {}, 'Fleet'),
    h('div', { class: 'toolbar' }, selector, total, live),
    counts, err,
    h('div', { class: 'grid' },
      h('div', { class: 'ghead', role: 'row' }, ['Name', 'State', 'Power', 'Claim', 'Boot stage', 'Age'].map((t) => h('span', { role: 'columnheader' }, t))),
      scroller));

  const pool = [];
  function rowEl() {
    const cells = [0, 1, 2, 3, 4, 5].map(() => h('span', { role: 'gridcell' }));
    const a = h('a', { class: 'row', role: 'row', tabindex: '-1' }, cells);
    a.cells = cells;
    scroller.append(a);
    return a;
  }

  function rebuild() {
    if (namesDirty) { names = [...servers.keys()].sort(); namesDirty = false; }
    const per = new Map();
    shown = [];
    for (const n of names) {
      const s = servers.get(n);
      const st = (s.status && s.status.state) || 'Unknown';
      per.set(st, (per.get(st) || 0) + 1);
      if (!stateFilter || st === stateFilter) shown.push(n);
    }
    filterDirty = false;
    total.textContent = `${names.length} servers`;
    const btns = [h('button', { type: 'button', 'aria-pressed': String(!stateFilter), onclick: () => setFilter('') }, `All ${names.length}`)];
    for (const [st, n] of [...per.entries()].sort()) {
      btns.push(h('button', { type: 'button', dataset: { state: st, count: n }, 'aria-pressed': String(stateFilter === st),
        onclick: () => setFilter(st === stateFilter ? '' : st) }, `${st} ${n}`));
    }
    counts.replaceChildren(...btns);
    spacer.style.height = `${shown.length * ROW}px`;
  }

  function setFilter(st) { stateFilter = st; filterDirty = true; focusIndex = -1; schedule(); }

  function renderRows() {
    const now = Date.now();
    const first = Math.max(0, Math.floor(scroller.scrollTop / ROW) - 5);
    const count = Math.ceil((scroller.clientHeight || 600) / ROW) + 10;
    while (pool.length < count) pool.push(rowEl());
    for (let i = 0; i < pool.length; i++) {
      const a = pool[i];
      const idx = first + i;
      if (i >= count || idx >= shown.length) { a.hidden = true; continue; }
      const name = shown[idx];
      const s = servers.get(name);
      const st = s.status || {};
      const spec = s.spec || {};
      const claim = spec.serverClaimRef ? `${spec.serverClaimRef.namespace || 'default'}/${spec.serverClaimRef.name}` : '';
      a.hidden = false;
      a.style.transform = `translateY(${idx * ROW}px)`;
      a.dataset.name = name;
      a.dataset.index = idx;
      a.setAttribute('aria-rowindex', idx + 1);
      a.href = '#/machine/' + enc(name);
      const vals = [name, st.state || 'Unknown', st.powerState || '', claim, bootStage(s, sbcs.get(name)), ago(s.metadata.creationTimestamp, now)];
      for (let c = 0; c < 6; c++) if (a.cells[c].textContent !== vals[c]) a.cells[c].textContent = vals[c];
      a.cells[1].dataset.state = vals[1];
      a.tabIndex = idx === focusIndex || (focusIndex < 0 && idx === first) ? 0 : -1;
    }
  }

  function paint() {
    frame = 0;
    if (filterDirty || namesDirty) rebuild();
    renderRows();
    const t = performance.now();
    if (listedOnce && !stats.rendered) {
      stats.rendered = performance.mark('bootplane:fleet-rendered', { detail: { rows: names.length } }).startTime;
    }
    if (pending.length) {
      const first = pending[0];
      stats.updates[stats.next % RING] = { events: pending.length, first: t - first, last: t - pending[pending.length - 1], at: performance.timeOrigin + t };
      stats.next++;
      pending = [];
    }
  }
  function schedule() { if (!frame) frame = requestAnimationFrame(paint); }

  function apply(map, keyOf) {
    return {
      onList(items) {
        map.clear();
        for (const o of items) map.set(keyOf(o), o);
        namesDirty = true; filterDirty = true;
        if (map === servers) listedOnce = true;
        schedule();
      },
      onEvent(type, o) {
        const k = keyOf(o);
        if (!k) return;
        if (type === 'DELETED') { map.delete(k); if (map === servers) namesDirty = true; }
        else { if (map === servers && !map.has(k)) namesDirty = true; map.set(k, o); }
        filterDirty = true;
        pending.push(performance.now());
        schedule();
      },
      onLive(on) { live.textContent = on ? 'live' : 'reconnecting'; live.dataset.live = String(on); },
      onError(e) {
        if (e.status === 401) { ctx.onUnauthorized(); return; }
        err.textContent = String(e.message || e);
      },
    };
  }

  let stops = [];
  function subscribe() {
    stops.forEach((s) => s());
    const sel = selector.value.trim();
    const q = sel ? `?labelSelector=${enc(sel)}` : '';
    err.textContent = '';
    stops = [
      watchList(G.servers + q, apply(servers, (o) => o.metadata && o.metadata.name)),
      watchList(G.sbcs, apply(sbcs, (o) => o.spec && o.spec.serverRef && o.spec.serverRef.name)),
    ];
  }

  let selTimer = 0;
  selector.addEventListener('input', () => { clearTimeout(selTimer); selTimer = setTimeout(subscribe, 300); });
  scroller.addEventListener('scroll', schedule, { passive: true });
  window.addEventListener('resize', schedule);
  scroller.addEventListener('keydown', (ev) => {
    const moves = { ArrowDown: 1, ArrowUp: -1, PageDown: 10, PageUp: -10 };
    let next = null;
    if (ev.key in moves) next = Math.max(0, Math.min(shown.length - 1, (focusIndex < 0 ? -1 : focusIndex) + moves[ev.key]));
    else if (ev.key === 'Home') next = 0;
    else if (ev.key === 'End') next = shown.length - 1;
    if (next === null || next < 0) return;
    ev.preventDefault();
    focusIndex = next;
    const top = next * ROW;
    if (top < scroller.scrollTop) scroller.scrollTop = top;
    else if (top + ROW > scroller.scrollTop + scroller.clientHeight) scroller.scrollTop = top + ROW - scroller.clientHeight;
    renderRows();
    const el = pool.find((a) => !a.hidden && Number(a.dataset.index) === next);
    if (el) el.focus();
  });
  // Ages move on without new data: redraw the rows in view twice a minute (no request).
  const ages = setInterval(renderRows, 30000);
  subscribe();
  return () => { stops.forEach((s) => s()); clearInterval(ages); window.removeEventListener('resize', schedule); if (frame) cancelAnimationFrame(frame); };
}
