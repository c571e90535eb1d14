// The dashboard's entry module: sign-in (a bearer token kept in sessionStorage, or
// none when the browser presents a client certificate), /api/whoami for what the
// caller may do, and the hash router that mounts one page at a time. Each page returns
// a stop function that closes its watches.

import { get, G, setToken, token, ApiError } from './api.js';
import { session } from './dom.js';
import { fleetPage } from './fleet.js';
import { machinePage, claimsPage, leasesPage, exportsPage, jobsPage, eventsPage } from './pages.js';

const routes = {
  fleet: fleetPage,
  machine: machinePage,
  claims: claimsPage,
  leases: leasesPage,
  exports: exportsPage,
  jobs: jobsPage,
  events: eventsPage,
};

let stopPage = null;
const $ = (id) => document.getElementById(id);

function showSignIn(message) {
  if (stopPage) { stopPage(); stopPage = null; }
  session.me = null;
  $('view').replaceChildren();
  $('nav').hidden = true;
  $('signout').hidden = true;
  $('who').textContent = '';
  $('signin').hidden = false;
  $('signin-error').textContent = message || '';
  $('token').focus();
}

async function signIn() {
  try {
    session.me = await get(G.whoami);
  } catch (e) {
    const msg = e instanceof ApiError && e.status === 401
      ? (token() ? 'The token was refused.' : '') : String(e.message || e);
    setToken('');
    showSignIn(msg);
    return false;
  }
  $('signin').hidden = true;
  $('nav').hidden = false;
  $('signout').hidden = false;
  $('who').textContent = `${session.me.user} (${(session.me.groups || []).join(', ')})`;
  return true;
}

function route() {
  if (!session.me) return;
  const [name, ...rest] = (location.hash.replace(/^#\/?/, '') || 'fleet').split('/');
  const page = routes[name] || fleetPage;
  for (const a of $('nav').querySelectorAll('a')) {
    if (a.getAttribute('href') === '#/' + name) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
  if (stopPage) stopPage();
  const view = $('view');
  view.replaceChildren();
  stopPage = page(view, rest.map(decodeURIComponent), { onUnauthorized: () => showSignIn('Signed out: the token is no longer valid.') });
  document.title = `bootplane: ${name}`;
}

async function start() {
  $('signin').addEventListener('submit', async (ev) => {
    ev.preventDefault();
    setToken($('token').value.trim());
    $('token').value = '';
    if (await signIn()) route();
  });
  $('signout').addEventListener('click', () => { setToken(''); showSignIn(''); });
  window.addEventListener('hashchange', route);
  if (await signIn()) route();
}

start();
