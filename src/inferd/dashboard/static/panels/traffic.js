// Live traffic for the server or one model over the last 15 minutes: requests and failures
// per second, p50/p99 latency, queue vs compute time, batch sizes and cache hits, from
// /v2/dashboard/series (sampled once a second by the server), plus the process's CPU and memory
// from /metrics.

import {request} from '../api.js';
import {h, fmt, replace, field, select, setOptions} from '../ui.js';
import {LineChart, BarChart} from '../charts.js';
import {columns, latest, onOverview, refreshSeries, series} from '../store.js';

const METRICS_EVERY_MS = 5000;

export function parseMetrics(text) {
  const values = {};
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const space = line.lastIndexOf(' ');
    values[line.slice(0, space)] = Number(line.slice(space + 1));
  }
  return values;
}

export class TrafficPanel {
  constructor(root, app) {
    this.root = root;
    this.app = app;
    this.overviewEveryMs = 5000;
    this.target = select([['', 'the whole server']], '', {id: 'traffic-target'});
    this.tiles = h('div', {class: 'tiles', 'aria-live': 'off'});
    this.process = h('p', {class: 'muted'});
    const ms = (v) => fmt.ms(v);
    this.charts = {
      rate: new LineChart({title: 'Requests per second', series: [
        {key: 'requests_per_s', label: 'requests/s', cls: 's1'},
        {key: 'failures_per_s', label: 'failures/s', cls: 's3'}]}),
      latency: new LineChart({title: 'Latency (successful requests)', format: ms, series: [
        {key: 'p50_ms', label: 'p50', cls: 's1'}, {key: 'p99_ms', label: 'p99', cls: 's2'}]}),
      time: new LineChart({title: 'Queue vs compute, per request', format: ms, series: [
        {key: 'queue_ms', label: 'queue', cls: 's2'}, {key: 'compute_ms', label: 'compute', cls: 's1'}]}),
      batch: new LineChart({title: 'Executed batch size (mean rows)', series: [
        {key: 'batch_size', label: 'rows/execution', cls: 's1'},
        {key: 'executions_per_s', label: 'executions/s', cls: 's4'}]}),
      cache: new LineChart({title: 'Response cache per second', series: [
        {key: 'cache_hits_per_s', label: 'hits', cls: 's4'}, {key: 'cache_misses_per_s', label: 'misses', cls: 's2'}]}),
      sizes: new BarChart({title: 'Executed batch sizes, last 15 min'}),
    };
    replace(root,
      h('div', {class: 'panel-head'}, h('h1', null, 'Traffic'),
        h('div', {class: 'filters'}, field('Show', this.target))),
      this.tiles,
      h('div', {class: 'charts'}, Object.values(this.charts).map((chart) => chart.el)),
      h('p', {class: 'muted'}, 'Sampled once a second from the statistics the server keeps anyway; ',
        'latency percentiles are estimated from the latency histogram, as Prometheus does. Idle models store nothing.'),
      this.process);
    this.target.addEventListener('change', () => this.draw());
    onOverview((doc) => {
      const names = doc.models.filter((m) => m.versions.length).map((m) => [m.name, `model ${m.name}`]);
      setOptions(this.target, [['', 'the whole server'], ...names]);
    });
    this.metricsMs = 0;
  }

  show(options = {}) {
    if (options.model && [...this.target.options].some((o) => o.value === options.model)) {
      this.target.value = options.model;
    }
  }

  async tick() {
    await refreshSeries();
    this.draw();
    if (Date.now() - this.metricsMs >= METRICS_EVERY_MS) {
      this.metricsMs = Date.now();
      await this.refreshProcess().catch(() => { this.process.textContent = ''; });
    }
  }

  draw() {
    const name = this.target.value;
    for (const chart of Object.values(this.charts)) {
      if (chart instanceof LineChart) {
        const {times, values} = columns(name, chart.series.map((item) => item.key));
        chart.update(times, values, series.now);
      }
    }
    this.charts.sizes.update(name ? (series.batches.models[name] || {}) : series.batches.server);
    const now = latest(name) || {};
    const tile = (label, value, cls = '') => h('div', {class: `tile ${cls}`}, h('span', {class: 'muted'}, label), h('b', null, value));
    const failing = now.failures_per_s > 0;
    replace(this.tiles,
      tile('requests/s', fmt.num(now.requests_per_s ?? 0)),
      tile('failures/s', fmt.num(now.failures_per_s ?? 0), failing ? 'bad' : ''),
      tile('p50', fmt.ms(now.p50_ms ?? 0)),
      tile('p99', fmt.ms(now.p99_ms ?? 0)),
      tile('in flight', fmt.num(now.pending ?? 0)));
  }

  async refreshProcess() {
    const text = await (await request('GET', '/metrics')).text();
    const values = parseMetrics(text);
    const cpu = values.process_cpu_seconds_total;
    const nowS = Date.now() / 1000;
    let usage = '';
    if (this.lastCpu !== undefined && cpu !== undefined) {
      usage = `CPU ${fmt.num(((cpu - this.lastCpu) / (nowS - this.lastS)) * 100)} % · `;
    }
    this.lastCpu = cpu;
    this.lastS = nowS;
    const rss = values.process_resident_memory_bytes;
    this.process.textContent = `Server process: ${usage}memory ${fmt.bytes(rss)} · ` +
      `${values.process_open_fds ?? '–'} open files (from /metrics)`;
  }
}
