// Logs: the engine log and the access log, tailing live from /v2/logs?after=N, filterable by
// model, status (or level) and text. A request id filters both logs to that request, and
// links to its trace when the server was given --dashboard-trace-url.

import {getJSON} from '../api.js';
import {h, replace, field, select, setOptions, message} from '../ui.js';
import {adminWhyNot, onOverview} from '../store.js';

const KEEP_LINES = 2000;
const SHOW_LINES = 500;
const FETCH_LINES = 1000;

// One access-log line (text key=value, or JSON) as an object; null if it is neither.
export function parseAccess(line) {
  if (line.startsWith('{')) {
    try { return JSON.parse(line); } catch { return null; }
  }
  const fields = {};
  const pattern = /(\w+)=("([^"]*)"|\S*)/g;
  let found;
  while ((found = pattern.exec(line)) !== null) {
    fields[found[1]] = found[3] !== undefined ? found[3] : found[2];
  }
  return fields.status !== undefined ? fields : null;
}

function engineLevel(line) {
  if (line.startsWith('{')) {
    try { return JSON.parse(line).level || ''; } catch { return ''; }
  }
  const found = / (DEBUG|INFO|WARNING|ERROR|CRITICAL) /.exec(line);
  return found ? found[1] : '';
}

// The requests a dashboard page makes by itself (this one, or another tab's): its tail of
// these logs every second and its refreshes of the models table and the charts. Hidden unless
// asked for, so that the access log shows the traffic the server was started for.
export function isPagePolling(fields) {
  return fields?.method === 'GET'
    && (fields.path === '/v2/logs' || String(fields.path || '').startsWith('/v2/dashboard/'));
}

// Errors are red (5xx) or amber (4xx); a redirect or "304 Not Modified" is no error.
export function statusClass(code) {
  const text = String(code);
  if (text.startsWith('5')) return 'bad';
  if (text.startsWith('4')) return 'warn';
  return text.startsWith('2') ? 'ok' : 'other';
}

const STATUS = [['', 'any status'], ['2', '2xx'], ['4', '4xx'], ['5', '5xx'], ['!2', 'not 2xx']];
const LEVELS = [['', 'any level'], ['WARNING', 'warnings and errors'], ['ERROR', 'errors']];

export class LogsPanel {
  constructor(root, app) {
    this.root = root;
    this.app = app;
    this.overviewEveryMs = 10000;
    this.logs = {engine: {lines: [], next: 0}, access: {lines: [], next: 0}};
    this.kind = 'access';
    this.kindButtons = ['access', 'engine'].map((kind) => h('button', {type: 'button', class: 'seg',
      'aria-pressed': String(kind === this.kind), onclick: () => this.setKind(kind)},
      kind === 'access' ? 'Access log' : 'Engine log'));
    this.model = select([['', 'any model']], '', {id: 'logs-model'});
    this.status = select(STATUS, '', {id: 'logs-status'});
    this.text = h('input', {type: 'search', id: 'logs-text', placeholder: 'text or request id'});
    this.follow = h('input', {type: 'checkbox', id: 'logs-follow', checked: true});
    this.polling = h('input', {type: 'checkbox', id: 'logs-polling'});
    this.pollingLabel = h('label', {class: 'check', title: 'GET /v2/logs and /v2/dashboard/…'},
      this.polling, ' the dashboard\'s own requests');
    this.note = h('div');
    this.adminNote = h('div');
    this.count = h('span', {class: 'muted', 'aria-live': 'polite'});
    this.list = h('div', {class: 'log', role: 'log', 'aria-label': 'log lines', tabindex: '0'});
    replace(root,
      h('div', {class: 'panel-head'}, h('h1', null, 'Logs'),
        h('div', {class: 'segmented', role: 'group', 'aria-label': 'Which log'}, this.kindButtons)),
      h('div', {class: 'filters'}, field('Model', this.model), field('Status', this.status),
        field('Text', this.text),
        h('label', {class: 'check'}, this.follow, ' follow new lines'), this.pollingLabel, this.count),
      this.adminNote, this.note, this.list);
    for (const control of [this.model, this.status]) control.addEventListener('change', () => this.render());
    this.text.addEventListener('input', () => this.render());
    this.polling.addEventListener('change', () => this.render());
    onOverview((doc) => {
      this.server = doc.server;
      setOptions(this.model, [['', 'any model'], ...doc.models.map((m) => m.name)]);
      this.renderNote();
    });
  }

  show() {
    this.render();
  }

  setKind(kind) {
    this.kind = kind;
    this.kindButtons.forEach((button) => button.setAttribute('aria-pressed',
      String(button.textContent.toLowerCase().startsWith(kind))));
    setOptions(this.status, kind === 'access' ? STATUS : LEVELS, '');
    this.status.previousElementSibling.textContent = kind === 'access' ? 'Status' : 'Level';
    this.pollingLabel.hidden = kind !== 'access';
    this.renderNote();
    this.render();
    this.tick();
  }

  renderNote() {
    if (this.kind === 'access' && this.server && !this.server.access_log) {
      message(this.note, 'The access log is off: start inferd with --access-log (or --access-log-file PATH) to see one line per request here, with the node that served it.', 'info');
    } else message(this.note, '');
  }

  async tick() {
    const why = adminWhyNot('Reading the logs');
    message(this.adminNote, why || '', 'info');
    if (why) return;
    const kind = this.kind;
    const log = this.logs[kind];
    const doc = await getJSON(`/v2/logs?kind=${kind}&lines=${FETCH_LINES}&after=${log.next}`);
    if (doc.next < log.next) log.lines = []; // the server restarted
    log.next = doc.next;
    if (!doc.lines.length) return;
    log.lines.push(...doc.lines);
    if (log.lines.length > KEEP_LINES) log.lines.splice(0, log.lines.length - KEEP_LINES);
    if (kind === this.kind) this.render();
  }

  matches(line, parsed) {
    const model = this.model.value;
    const status = this.status.value;
    const text = this.text.value.trim().toLowerCase();
    if (text && !line.toLowerCase().includes(text)) return false;
    if (this.kind === 'access') {
      if (!this.polling.checked && isPagePolling(parsed)) return false;
      if (model && parsed?.model !== model) return false;
      const code = String(parsed?.status ?? '');
      if (status === '!2' ? code.startsWith('2') : (status && !code.startsWith(status))) return false;
      return true;
    }
    if (model && !line.includes(`'${model}'`) && !line.includes(`"${model}"`) && !line.includes(` ${model} `)) return false;
    if (status === 'WARNING') return ['WARNING', 'ERROR', 'CRITICAL'].includes(engineLevel(line));
    if (status === 'ERROR') return ['ERROR', 'CRITICAL'].includes(engineLevel(line));
    return true;
  }

  render() {
    const lines = this.logs[this.kind].lines;
    const shown = [];
    for (let i = lines.length - 1; i >= 0 && shown.length < SHOW_LINES; i -= 1) {
      const parsed = this.kind === 'access' ? parseAccess(lines[i]) : null;
      if (this.matches(lines[i], parsed)) shown.push([lines[i], parsed]);
    }
    shown.reverse();
    this.count.textContent = `${shown.length} of ${lines.length} lines`;
    const atBottom = this.list.scrollTop + this.list.clientHeight >= this.list.scrollHeight - 4;
    replace(this.list, shown.length ? shown.map(([line, parsed]) => (parsed ? this.accessRow(parsed) : this.engineRow(line)))
      : h('div', {class: 'empty'}, lines.length ? 'No line matches the filters.' : 'No lines yet.'));
    if (this.follow.checked || atBottom) this.list.scrollTop = this.list.scrollHeight;
  }

  engineRow(line) {
    const level = engineLevel(line).toLowerCase();
    return h('div', {class: `line ${level}`}, line);
  }

  requestId(id) {
    if (!id || id === '-') return null;
    const filter = h('button', {type: 'button', class: 'link mono', title: 'Show only this request',
      onclick: () => { this.text.value = id; this.render(); }}, id);
    const template = this.server?.trace_url;
    if (!template) return filter;
    const href = template.replaceAll('{request_id}', encodeURIComponent(id));
    return [filter, ' ', h('a', {href, target: '_blank', rel: 'noopener noreferrer'}, 'trace')];
  }

  accessRow(f) {
    const code = String(f.status);
    const cls = statusClass(code);
    const time = String(f.time || '').replace(/^.*T/, '').replace('Z', '');
    return h('div', {class: 'line access'},
      h('span', {class: 'muted'}, time), ' ',
      h('span', {class: 'node'}, f.node), ' ',
      h('span', {class: `status ${cls}`}, code), ' ',
      h('span', null, `${f.method} ${f.path}`), ' ',
      f.model && f.model !== '-' ? h('span', {class: 'model'}, `${f.model}${f.version && f.version !== '-' ? ` v${f.version}` : ''}`) : null, ' ',
      h('span', {class: 'muted'}, `${f.latency_ms} ms · ${f.bytes_in}→${f.bytes_out} B · ${f.client}`), ' ',
      this.requestId(f.request_id));
  }
}
