// The dashboard's entry point: tabs (with the URL hash), the header, the token, the theme,
// and one timer that refreshes only what the visible panel shows.

import {onRefusal, setToken, token} from './api.js';
import {h, fmt, field, replace} from './ui.js';
import {onOverview, refreshOverview} from './store.js';
import {ModelsPanel} from './panels/models.js';
import {TrafficPanel} from './panels/traffic.js';
import {LogsPanel} from './panels/logs.js';
import {FilesPanel} from './panels/files.js';
import {TryPanel} from './panels/tryit.js';
import {DeployPanel} from './panels/deploy.js';
import {ClusterPanel} from './panels/cluster.js';

const OVERVIEW_EVERY_MS = 3000;
const TICK_MS = 1000;

const app = {
  panels: {},
  active: null,
  goto(name, options = {}) {
    show(name, options);
  },
};

const PANELS = {
  models: ModelsPanel,
  traffic: TrafficPanel,
  logs: LogsPanel,
  files: FilesPanel,
  try: TryPanel,
  deploy: DeployPanel,
  cluster: ClusterPanel,
};

function tabs() {
  return [...document.querySelectorAll('[role=tab]')];
}

function show(name, options = {}) {
  if (!PANELS[name]) name = 'models';
  for (const tab of tabs()) {
    const selected = tab.dataset.panel === name;
    tab.setAttribute('aria-selected', String(selected));
    tab.tabIndex = selected ? 0 : -1;
    document.getElementById(tab.getAttribute('aria-controls')).hidden = !selected;
  }
  if (!app.panels[name]) {
    const section = document.getElementById(`panel-${name}`);
    app.panels[name] = new PANELS[name](section, app);
  }
  const previous = app.active;
  app.active = app.panels[name];
  if (previous && previous !== app.active) previous.hide?.();
  app.active.show?.(options);
  if (location.hash !== `#${name}`) history.replaceState(null, '', `#${name}`);
  tick(true);
}

let busy = false;
let again = false;
let lastOverviewMs = 0;

async function tick(force = false) {
  if (busy) {
    again = again || force;
    return;
  }
  if (document.hidden && !force) return;
  busy = true;
  try {
    const now = Date.now();
    const wantOverview = app.active?.needsOverview !== false;
    if (wantOverview && (force || now - lastOverviewMs >= (app.active?.overviewEveryMs || OVERVIEW_EVERY_MS))) {
      lastOverviewMs = now;
      await refreshOverview().then(() => connected(true), (error) => connected(false, error));
    }
    await app.active?.tick?.(force);
  } catch (error) {
    console.warn(error);
  } finally {
    busy = false;
    if (again) {
      again = false;
      tick(true);
    }
  }
}

function connected(ok, error) {
  const status = document.getElementById('server-status');
  status.classList.toggle('down', !ok);
  if (!ok) {
    status.textContent = error?.refused ? `refused: ${error.status}` : 'server not answering';
  }
}

function renderHeader(doc) {
  const server = doc.server;
  // The brand already reads "inferd": a server of that (the default) name shows no name twice.
  const name = server.name && server.name !== 'inferd' ? `${server.name} · ` : '';
  document.getElementById('server-name').textContent =
    `${name}${server.version} · node ${server.node}`;
  const ready = doc.models.filter((m) => m.state === 'READY').length;
  const status = document.getElementById('server-status');
  status.classList.toggle('down', !server.ready);
  replace(status,
    h('span', {class: `dot ${server.ready ? 'ok' : 'bad'}`, 'aria-hidden': 'true'}),
    `${server.ready ? 'ready' : 'starting'} · ${ready}/${doc.models.length} models ready · ` +
    `mode ${server.control_mode} · up ${fmt.seconds(server.uptime_s)}`);
}

function showBanner(error) {
  const banner = document.getElementById('banner');
  const what = error.status === 401
    ? 'The server wants a token: paste one with the Token button.'
    : 'The token does not allow this (write actions need the admin scope): paste another with the Token button.';
  const close = h('button', {type: 'button', class: 'ghost small', 'aria-label': 'Dismiss'}, '×');
  close.addEventListener('click', () => { banner.hidden = true; });
  replace(banner, h('span', null, h('b', null, `Refused — ${error.status} ${error.status === 401 ? 'Unauthorized' : 'Forbidden'}`),
    ` on ${error.method} ${error.path}: ${error.message}. ${what}`), close);
  banner.hidden = false;
}

function tokenDialog() {
  const input = h('input', {type: 'password', autocomplete: 'off', spellcheck: 'false', value: token()});
  const save = h('button', {type: 'submit', class: 'primary'}, 'Use token');
  const forget = h('button', {type: 'button', class: 'ghost'}, 'Forget token');
  const cancel = h('button', {type: 'button', class: 'ghost'}, 'Cancel');
  const form = h('form', {method: 'dialog'},
    h('h2', null, 'Access token'),
    h('p', {class: 'muted'}, 'Sent as "Authorization: Bearer …" with every request of this page. It is kept in this tab only (sessionStorage) and forgotten when the tab closes.'),
    field('Token', input),
    h('div', {class: 'actions'}, forget, cancel, save));
  const dialog = h('dialog', {class: 'confirm'}, form);
  const done = () => { dialog.close(); dialog.remove(); updateTokenButton(); };
  form.addEventListener('submit', (event) => {
    event.preventDefault();
    setToken(input.value.trim());
    document.getElementById('banner').hidden = true;
    done();
    tick(true);
  });
  forget.addEventListener('click', () => { setToken(''); done(); });
  cancel.addEventListener('click', done);
  dialog.addEventListener('close', () => dialog.remove());
  document.body.append(dialog);
  dialog.showModal();
  input.focus();
}

function updateTokenButton() {
  document.getElementById('token-button').textContent = token() ? 'Token ✓' : 'Token';
}

const THEMES = ['auto', 'light', 'dark'];

function applyTheme(theme) {
  if (theme === 'auto') document.documentElement.removeAttribute('data-theme');
  else document.documentElement.dataset.theme = theme;
  const button = document.getElementById('theme-button');
  button.textContent = `Theme: ${theme}`;
  button.setAttribute('aria-label', `Colour theme: ${theme === 'auto' ? 'automatic' : theme}`);
}

function init() {
  applyTheme(localStorage.getItem('inferd.theme') || 'auto');
  document.getElementById('theme-button').addEventListener('click', () => {
    const current = localStorage.getItem('inferd.theme') || 'auto';
    const next = THEMES[(THEMES.indexOf(current) + 1) % THEMES.length];
    localStorage.setItem('inferd.theme', next);
    applyTheme(next);
  });
  document.getElementById('token-button').addEventListener('click', tokenDialog);
  updateTokenButton();
  onRefusal(showBanner);
  onOverview(renderHeader);
  const list = tabs();
  for (const tab of list) {
    tab.addEventListener('click', () => show(tab.dataset.panel));
    tab.addEventListener('keydown', (event) => {
      const index = list.indexOf(tab);
      let next = null;
      if (event.key === 'ArrowRight') next = list[(index + 1) % list.length];
      else if (event.key === 'ArrowLeft') next = list[(index - 1 + list.length) % list.length];
      else if (event.key === 'Home') next = list[0];
      else if (event.key === 'End') next = list[list.length - 1];
      if (next) {
        event.preventDefault();
        next.focus();
        show(next.dataset.panel);
      }
    });
  }
  window.addEventListener('hashchange', () => show(location.hash.slice(1)));
  document.addEventListener('visibilitychange', () => { if (!document.hidden) tick(true); });
  show(location.hash.slice(1) || 'models');
  setInterval(() => tick(false), TICK_MS);
}

window.inferdDashboard = app; // for the browser console
init();
