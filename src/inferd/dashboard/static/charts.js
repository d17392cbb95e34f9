// Hand-written SVG charts: a line chart over a time window and a bar chart. Each update
// rewrites a few path attributes, nothing more, so a chart costs little to keep live.

import {h, s, fmt, replace} from './ui.js';

const H = 170;
const DEFAULT_W = 600;

// Charts draw in pixels of their own width, so text stays crisp on a phone and a laptop.
const resized = new ResizeObserver((entries) => {
  for (const entry of entries) entry.target.chart?.resize(entry.contentRect.width);
});
const PAD = {left: 46, right: 10, top: 10, bottom: 22};

// A "nice" upper bound for an axis: 1, 2 or 5 times a power of ten.
export function niceMax(value) {
  if (!(value > 0)) return 1;
  const power = 10 ** Math.floor(Math.log10(value));
  for (const step of [1, 2, 5, 10]) {
    if (value <= step * power) return step * power;
  }
  return 10 * power;
}

export class LineChart {
  // series: [{key, label, cls}]; format: value -> text
  constructor({title, series, format = (v) => fmt.num(v), windowS = 900}) {
    this.series = series;
    this.format = format;
    this.windowS = windowS;
    this.legend = h('div', {class: 'legend'});
    this.svg = s('svg', {viewBox: `0 0 ${DEFAULT_W} ${H}`, class: 'chart-svg', role: 'img',
      'aria-label': title});
    this.w = DEFAULT_W;
    this.grid = s('g', {class: 'grid'});
    this.lines = series.map((item) => s('path', {class: `line ${item.cls}`, d: ''}));
    this.cursor = s('line', {class: 'cursor', x1: 0, x2: 0, y1: PAD.top, y2: H - PAD.bottom,
      visibility: 'hidden'});
    this.svg.append(this.grid, ...this.lines, this.cursor);
    this.el = h('figure', {class: 'chart'},
      h('figcaption', null, h('span', {class: 'chart-title'}, title), this.legend),
      h('div', {class: 'chart-box'}, this.svg));
    this.data = {times: [], values: series.map(() => [])};
    this.start = Date.now() / 1000 - windowS;
    this.max = 1;
    this.hover = null;
    const box = this.el.querySelector('.chart-box');
    box.chart = this;
    resized.observe(box);
    this.svg.addEventListener('pointermove', (event) => this.onHover(event));
    this.svg.addEventListener('pointerleave', () => {
      this.hover = null;
      this.cursor.setAttribute('visibility', 'hidden');
      this.drawLegend();
    });
  }

  resize(width) {
    const w = Math.max(200, Math.round(width));
    if (w === this.w) return;
    this.w = w;
    this.svg.setAttribute('viewBox', `0 0 ${w} ${H}`);
    this.gridKey = null;
    if (this.data.times.length) this.update(this.data.times, this.data.values, this.now);
    else this.drawGrid();
  }

  x(t) {
    return PAD.left + ((t - this.start) / this.windowS) * (this.w - PAD.left - PAD.right);
  }

  y(value) {
    return H - PAD.bottom - (value / this.max) * (H - PAD.top - PAD.bottom);
  }

  // times: seconds since the epoch, ascending; values: one array per series.
  update(times, values, now) {
    this.data = {times, values};
    this.now = now || (times.length ? times[times.length - 1] : Date.now() / 1000);
    this.start = this.now - this.windowS;
    let top = 0;
    for (const column of values) {
      for (let i = 0; i < column.length; i += 1) if (column[i] > top) top = column[i];
    }
    this.max = niceMax(top);
    this.drawGrid();
    this.lines.forEach((path, index) => {
      const column = values[index];
      let d = '';
      for (let i = 0; i < times.length; i += 1) {
        if (times[i] < this.start) continue;
        d += `${d ? 'L' : 'M'}${this.x(times[i]).toFixed(1)} ${this.y(column[i] || 0).toFixed(1)}`;
      }
      path.setAttribute('d', d);
    });
    const latest = this.series.map((item, index) => `${item.label} ${this.format(values[index].at(-1) ?? 0)}`);
    this.svg.setAttribute('aria-label', `${this.el.querySelector('.chart-title').textContent}: ${latest.join(', ')}`);
    this.drawLegend();
  }

  drawGrid() {
    const key = `${this.max}`;
    if (this.gridKey === key) return;
    this.gridKey = key;
    const parts = [];
    for (const fraction of [0, 0.5, 1]) {
      const y = this.y(this.max * fraction);
      parts.push(s('line', {x1: PAD.left, x2: this.w - PAD.right, y1: y, y2: y}));
      parts.push(s('text', {x: PAD.left - 5, y: y + 4, 'text-anchor': 'end'},
        this.format(this.max * fraction)));
    }
    const minutes = this.windowS / 60;
    for (const ago of [minutes, (minutes * 2) / 3, minutes / 3, 0]) {
      const x = PAD.left + (1 - ago / minutes) * (this.w - PAD.left - PAD.right);
      parts.push(s('text', {x, y: H - 6, 'text-anchor': ago === 0 ? 'end' : (ago === minutes ? 'start' : 'middle')},
        ago === 0 ? 'now' : `-${Math.round(ago)} min`));
    }
    replace(this.grid, parts);
  }

  onHover(event) {
    const {times} = this.data;
    if (!times.length) return;
    const box = this.svg.getBoundingClientRect();
    const x = ((event.clientX - box.left) / box.width) * this.w;
    const t = this.start + ((x - PAD.left) / (this.w - PAD.left - PAD.right)) * this.windowS;
    let best = 0;
    for (let i = 0; i < times.length; i += 1) {
      if (Math.abs(times[i] - t) < Math.abs(times[best] - t)) best = i;
    }
    this.hover = best;
    const cx = this.x(times[best]);
    this.cursor.setAttribute('x1', cx);
    this.cursor.setAttribute('x2', cx);
    this.cursor.setAttribute('visibility', 'visible');
    this.drawLegend();
  }

  drawLegend() {
    const {times, values} = this.data;
    const index = this.hover ?? times.length - 1;
    const items = this.series.map((item, i) => h('span', {class: `key ${item.cls}`},
      h('i', {'aria-hidden': 'true'}), `${item.label} `,
      h('b', {'data-series': item.key}, this.format(index >= 0 ? (values[i][index] ?? 0) : 0))));
    if (this.hover !== null && times[index]) items.push(h('span', {class: 'muted'}, fmt.clock(times[index])));
    replace(this.legend, items);
  }
}

export class BarChart {
  constructor({title, empty = 'no executions yet'}) {
    this.empty = empty;
    this.svg = s('svg', {viewBox: `0 0 ${DEFAULT_W} ${H}`, class: 'chart-svg', role: 'img', 'aria-label': title});
    this.w = DEFAULT_W;
    this.note = h('span', {class: 'muted'});
    this.el = h('figure', {class: 'chart'},
      h('figcaption', null, h('span', {class: 'chart-title'}, title), this.note),
      h('div', {class: 'chart-box'}, this.svg));
    const box = this.el.querySelector('.chart-box');
    box.chart = this;
    resized.observe(box);
  }

  resize(width) {
    const w = Math.max(200, Math.round(width));
    if (w === this.w) return;
    this.w = w;
    this.svg.setAttribute('viewBox', `0 0 ${w} ${H}`);
    this.key = null;
    this.update(this.counts || {});
  }

  // counts: {label: count}
  update(counts) {
    this.counts = counts;
    const entries = Object.entries(counts).sort((a, b) => Number(a[0]) - Number(b[0]));
    const total = entries.reduce((sum, [, count]) => sum + count, 0);
    this.note.textContent = total ? `${total.toLocaleString('en')} executions` : this.empty;
    const key = JSON.stringify(entries);
    if (key === this.key) return;
    this.key = key;
    const max = niceMax(Math.max(1, ...entries.map(([, count]) => count)));
    const width = (this.w - PAD.left - PAD.right) / Math.max(entries.length, 1);
    const parts = [];
    for (const fraction of [0, 0.5, 1]) {
      const y = H - PAD.bottom - fraction * (H - PAD.top - PAD.bottom);
      parts.push(s('line', {class: 'gridline', x1: PAD.left, x2: this.w - PAD.right, y1: y, y2: y}));
      parts.push(s('text', {x: PAD.left - 5, y: y + 4, 'text-anchor': 'end'}, fmt.num(max * fraction)));
    }
    entries.forEach(([label, count], index) => {
      const height = (count / max) * (H - PAD.top - PAD.bottom);
      const x = PAD.left + index * width + width * 0.15;
      parts.push(s('rect', {class: 'bar', x, width: width * 0.7, y: H - PAD.bottom - height, height},
        s('title', null, `batch size ${label}: ${count} executions`)));
      parts.push(s('text', {x: x + width * 0.35, y: H - 6, 'text-anchor': 'middle'}, label));
    });
    replace(this.svg, s('g', {class: 'grid'}, parts));
    this.svg.setAttribute('aria-label', `${this.el.querySelector('.chart-title').textContent}: ${
      entries.map(([label, count]) => `${label}: ${count}`).join(', ') || this.empty}`);
  }
}
