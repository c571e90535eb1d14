// The REST API client of the dashboard: bearer token from sessionStorage (or none:
// the browser's client certificate authenticates at TLS), JSON in and out, and
// watchList(): list once, then stream `?watch=true&resourceVersion=` with fetch and a
// ReadableStream, re-listing only when the server answers 410 Gone. No polling.

const KEY = 'bootplane.token';

export const G = {
  servers: '/apis/metal.ironcore.dev/v1alpha1/servers',
  claims: '/apis/metal.ironcore.dev/v1alpha1/serverclaims',
  claimsIn: (ns) => `/apis/metal.ironcore.dev/v1alpha1/namespaces/${enc(ns)}/serverclaims`,
  sbcs: '/apis/metal.ironcore.dev/v1alpha1/serverbootconfigurations',
  sbcsIn: (ns) => `/apis/metal.ironcore.dev/v1alpha1/namespaces/${enc(ns)}/serverbootconfigurations`,
  leases: '/apis/dhcp.bootplane.dev/v1alpha1/leases',
  exports: '/apis/provisioning.bootplane.dev/v1alpha1/exportpolicies',
  rules: '/apis/provisioning.bootplane.dev/v1alpha1/exportpolicyrules',
  actions: '/apis/provisioning.bootplane.dev/v1alpha1/serveractions',
  actionsIn: (ns) => `/apis/provisioning.bootplane.dev/v1alpha1/namespaces/${enc(ns)}/serveractions`,
  jobs: '/apis/bootplane.dev/v1alpha1/jobs',
  events: '/api/v1/namespaces/default/events',
  whoami: '/api/whoami',
};

export function enc(s) { return encodeURIComponent(s); }

export function token() { return sessionStorage.getItem(KEY) || ''; }
export function setToken(t) {
  if (t) sessionStorage.setItem(KEY, t); else sessionStorage.removeItem(KEY);
}

export class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

function headers(extra) {
  const h = Object.assign({ Accept: 'application/json' }, extra || {});
  const t = token();
  if (t) h.Authorization = 'Bearer ' + t;
  return h;
}

async function fail(r) {
  let msg = r.status + ' ' + r.statusText;
  try { const s = await r.json(); if (s && s.message) msg = s.message; } catch (_) { /* not JSON */ }
  return new ApiError(r.status, msg);
}

export async function call(method, path, body, contentType) {
  const init = { method, headers: headers(), credentials: 'same-origin', cache: 'no-store' };
  if (body !== undefined) {
    init.headers['Content-Type'] = contentType || 'application/json';
    init.body = JSON.stringify(body);
  }
  const r = await fetch(path, init);
  if (!r.ok) throw await fail(r);
  if (r.status === 204) return null;
  return r.json();
}

export const get = (p) => call('GET', p);
export const patch = (p, b) => call('PATCH', p, b, 'application/merge-patch+json');
export const del = (p) => call('DELETE', p);
export const post = (p, b) => call('POST', p, b);

const sleep = (ms) => new Promise((res) => setTimeout(res, ms));

// Keep `path` (a list URL, maybe with a query) in view: onList(items) after each
// (re-)list, onEvent(type, object) for each watch event. Returns stop().
export function watchList(path, { onList, onEvent, onError, onLive }) {
  let stopped = false;
  let ctrl = null;
  const sep = path.includes('?') ? '&' : '?';
  (async () => {
    let backoff = 500;
    while (!stopped) {
      try {
        const list = await get(path);
        if (stopped) return;
        onList(list.items || []);
        let rv = (list.metadata && list.metadata.resourceVersion) || '';
        let relist = false;
        while (!stopped && !relist) {
          ctrl = new AbortController();
          const r = await fetch(`${path}${sep}watch=true&resourceVersion=${enc(rv)}`,
            { headers: headers(), credentials: 'same-origin', cache: 'no-store', signal: ctrl.signal });
          if (r.status === 410) { relist = true; break; }
          if (!r.ok) throw await fail(r);
          if (onLive) onLive(true);
          backoff = 500;
          const reader = r.body.getReader();
          const dec = new TextDecoder();
          let buf = '';
          for (;;) {
            const { value, done } = await reader.read();
            if (done) break;
            buf += dec.decode(value, { stream: true });
            let nl;
            while ((nl = buf.indexOf('\n')) >= 0) {
              const line = buf.slice(0, nl);
              buf = buf.slice(nl + 1);
              if (!line.trim()) continue;
              const ev = JSON.parse(line);
              if (ev.type === 'ERROR') {
                if (ev.object && ev.object.code === 410) { relist = true; break; }
                throw new ApiError(ev.object && ev.object.code || 500, ev.object && ev.object.message || 'watch error');
              }
              const m = ev.object && ev.object.metadata;
              if (m && m.resourceVersion) rv = m.resourceVersion;
              if (ev.type !== 'BOOKMARK') onEvent(ev.type, ev.object);
            }
            if (relist) { try { await reader.cancel(); } catch (_) { /* closed */ } break; }
          }
          // The stream ended (server restart, shutdown): watch again from rv, after a
          // pause so a server that keeps closing at once is not hammered.
          if (!relist && !stopped) await sleep(250);
        }
      } catch (e) {
        if (stopped || (e && e.name === 'AbortError')) return;
        if (onLive) onLive(false);
        if (onError) onError(e);
        // Retrying cannot help: not signed in, not allowed, no such resource, a bad query.
        if (e instanceof ApiError && [400, 401, 403, 404, 422].includes(e.status)) return;
        await sleep(backoff);
        backoff = Math.min(backoff * 2, 10000);
      }
    }
  })();
  return () => { stopped = true; if (ctrl) ctrl.abort(); };
}
