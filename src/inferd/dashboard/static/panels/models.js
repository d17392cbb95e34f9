// Models: every model and version with its state (and the reason in full), backend,
// instances, batching, labels, traffic split, shadow, load time and current traffic; with lazy
// serving, each model's residency (memory, last use, eviction) and the budget's use.

import {h, fmt, badge, replace, field, select} from '../ui.js';
import {latest, onOverview, refreshSeries} from '../store.js';

const STATES = [['', 'any state'], ['READY', 'READY'], ['LOADING', 'LOADING'],
  ['UNLOADING', 'UNLOADING'], ['UNAVAILABLE', 'UNAVAILABLE']];

function instances(model) {
  const loaded = model.versions.filter((v) => v.instances !== undefined);
  const groups = model.instance_group.map((g) => `${g.count} × ${g.kind.replace('KIND_', '')}`);
  if (loaded.length) {
    return `${loaded.map((v) => v.instances).join(' / ')}${groups.length ? ` (${groups.join(', ')})` : ''}`;
  }
  return groups.join(', ') || '–';
}

function batching(model) {
  const b = model.batching || {};
  if (b.max_batch_size === undefined) return '–';
  const parts = [b.max_batch_size ? `max ${b.max_batch_size}` : 'no batching'];
  if (b.dynamic) {
    const preferred = b.dynamic.preferred_batch_size.length ? ` preferred ${b.dynamic.preferred_batch_size.join(',')}` : '';
    parts.push(`dynamic${preferred}, delay ≤ ${b.dynamic.max_queue_delay_us} µs`);
  }
  if (b.sequence) parts.push('sequence');
  if (model.cache) parts.push('cache');
  return parts.join(' · ');
}

function labels(routing) {
  const entries = Object.entries(routing?.labels || {});
  return entries.length ? entries.map(([label, v]) => `${label} → ${v}`).join(', ') : '–';
}

function split(routing) {
  const entries = Object.entries(routing?.traffic_split || {});
  if (!entries.length) return '–';
  const total = entries.reduce((sum, [, w]) => sum + w, 0) || 1;
  return entries.map(([target, w]) => `${target}: ${Math.round((w / total) * 100)}%`).join(', ');
}

function shadow(routing) {
  const policy = routing?.shadow;
  if (!policy) return '–';
  const target = policy.version ?? policy.label;
  const st = routing.shadow_stats || {};
  return `→ ${target} ${Math.round(policy.fraction * 100)}% (sent ${st.sent}, agreed ${st.agreed}, disagreed ${st.disagreed}, failed ${st.failed})`;
}

// Lazy serving: where one model stands (loaded, evicted...) and the memory it is counted for.
function residency(r) {
  if (!r) return null;
  const parts = [r.state];
  if (r.memory_bytes) parts.push(fmt.bytes(r.memory_bytes));
  if (r.pinned) parts.push('pinned');
  if (r.state === 'loaded' && r.last_used_unix_s) parts.push(`used ${fmt.clock(r.last_used_unix_s)}`);
  if (r.state === 'evicted' && r.evicted_unix_s) parts.push(`at ${fmt.clock(r.evicted_unix_s)}`);
  if (r.state === 'available') parts.push('loads on first request');
  return h('div', {class: 'muted residency'}, parts.join(' · '));
}

// Lazy serving as a whole: the budget's use and how often requests found their model loaded.
function budget(t) {
  if (!t) return '';
  const models = t.max_models ? `${t.models} of ${t.max_models}` : `${t.models}`;
  const memory = t.memory_budget_bytes ? `${fmt.bytes(t.memory_bytes)} of ${fmt.bytes(t.memory_budget_bytes)}`
    : fmt.bytes(t.memory_bytes);
  const asked = t.hits + t.misses;
  const rate = asked ? ` · hit rate ${Math.round((t.hits / asked) * 100)}%` : '';
  return ` · lazy serving: ${models} loaded, ${memory} · ${t.loads} loads, ${t.evictions} evictions${rate}`;
}

export class ModelsPanel {
  constructor(root, app) {
    this.root = root;
    this.app = app;
    this.overviewEveryMs = 2000;
    this.filter = h('input', {type: 'search', placeholder: 'name contains…', id: 'models-filter'});
    this.state = select(STATES, '', {id: 'models-state'});
    this.summary = h('p', {class: 'muted', 'aria-live': 'polite'});
    this.body = h('tbody');
    const head = ['Model', 'State', 'Versions', 'Backend', 'Instances', 'Batching', 'Labels',
      'Traffic split', 'Shadow', 'req/s', 'p99'].map((title) => h('th', {scope: 'col'}, title));
    replace(root,
      h('div', {class: 'panel-head'},
        h('h1', null, 'Models'),
        h('div', {class: 'filters'}, field('Filter by name', this.filter), field('State', this.state))),
      this.summary,
      h('div', {class: 'table-wrap'}, h('table', {class: 'models'}, h('thead', null, h('tr', null, head)), this.body)));
    this.filter.addEventListener('input', () => this.render());
    this.state.addEventListener('change', () => this.render());
    onOverview((doc) => { this.doc = doc; if (!root.hidden) this.render(); });
  }

  show() {
    if (this.doc) this.render();
  }

  async tick() {
    await refreshSeries().catch(() => null);
    this.render();
  }

  render() {
    const doc = this.doc;
    if (!doc) return;
    const text = this.filter.value.trim().toLowerCase();
    const state = this.state.value;
    const shown = doc.models.filter((m) => (!text || m.name.toLowerCase().includes(text))
      && (!state || m.state === state || m.versions.some((v) => v.state === state)));
    const counts = {};
    for (const m of doc.models) counts[m.state] = (counts[m.state] || 0) + 1;
    this.summary.textContent = `${doc.models.length} model${doc.models.length === 1 ? '' : 's'}: ${
      Object.entries(counts).map(([k, n]) => `${n} ${k}`).join(', ') || 'none'}` +
      (shown.length !== doc.models.length ? ` · ${shown.length} shown` : '') +
      ` · repository ${doc.server.repositories.join(', ')}` + budget(doc.server.residency);
    if (!shown.length) {
      replace(this.body, h('tr', null, h('td', {colspan: 11, class: 'empty'},
        doc.models.length ? 'No model matches the filter.' : 'The repository has no models yet: deploy one from the Deploy tab.')));
      return;
    }
    replace(this.body, shown.map((m) => this.row(m)));
  }

  row(m) {
    const now = latest(m.name);
    const versions = m.versions.length ? m.versions.map((v) => h('div', {class: 'version'},
      h('span', {class: 'mono'}, `v${v.version}`), ' ', badge(v.state),
      v.load_s !== undefined ? h('span', {class: 'muted'}, ` loaded in ${fmt.seconds(v.load_s)}`) : null,
      v.reason ? h('div', {class: 'reason'}, v.reason) : null)) : h('span', {class: 'muted'}, 'not loaded');
    const action = (label, panel) => h('button', {type: 'button', class: 'ghost small',
      onclick: () => this.app.goto(panel, {model: m.name}), 'aria-label': `${label} ${m.name}`}, label);
    const cell = (label, content, cls = '') => h('td', {'data-label': label,
      class: `${cls}${content === '–' ? ' none' : ''}`.trim() || null}, content);
    return h('tr', {'data-model': m.name},
      h('th', {scope: 'row'}, h('div', {class: 'mono'}, m.name), h('div', {class: 'row-actions'}, action('Files', 'files'),
        m.state === 'READY' ? action('Try', 'try') : null, action('Manage', 'deploy'))),
      h('td', {'data-label': 'State'}, badge(m.state), residency(m.residency),
        m.reason ? h('div', {class: 'reason'}, m.reason) : null),
      h('td', {'data-label': 'Versions'}, versions),
      h('td', {'data-label': 'Backend'}, m.backend || '–', m.platform && m.platform !== m.backend ? h('div', {class: 'muted'}, m.platform) : null),
      cell('Instances', instances(m)),
      cell('Batching', batching(m)),
      cell('Labels', labels(m.routing)),
      cell('Traffic split', split(m.routing)),
      cell('Shadow', shadow(m.routing)),
      cell('req/s', now ? fmt.num(now.requests_per_s) : '–', 'num'),
      cell('p99', now && now.requests_per_s ? fmt.ms(now.p99_ms) : '–', 'num'));
  }
}
