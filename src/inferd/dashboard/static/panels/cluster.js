// Cluster: the nodes behind Envoy with their health and traffic, from Envoy's admin API
// (/clusters), fetched by the server when it runs with --envoy-admin URL.

import {getJSON} from '../api.js';
import {h, fmt, replace, message} from '../ui.js';

export class ClusterPanel {
  constructor(root, app) {
    this.root = root;
    this.app = app;
    this.overviewEveryMs = 10000;
    this.msg = h('div');
    this.body = h('div');
    this.previous = new Map(); // address -> [t, rq_total]
    replace(root, h('div', {class: 'panel-head'}, h('h1', null, 'Cluster')), this.msg, this.body);
  }

  async tick() {
    let doc;
    try {
      doc = await getJSON('/v2/dashboard/cluster');
    } catch (error) {
      message(this.msg, error.describe ? error.describe() : String(error), 'error');
      return;
    }
    if (!doc.enabled) {
      message(this.msg, doc.hint, 'info');
      replace(this.body);
      return;
    }
    message(this.msg, '');
    const now = Date.now() / 1000;
    replace(this.body, h('p', {class: 'muted'}, `From Envoy's admin API at ${doc.admin}.`),
      doc.clusters.map((cluster) => this.cluster(cluster, now)));
  }

  rate(host, now) {
    const key = host.address;
    const before = this.previous.get(key);
    this.previous.set(key, [now, host.rq_total]);
    if (!before || now <= before[0]) return '–';
    return fmt.num(Math.max(0, host.rq_total - before[1]) / (now - before[0]));
  }

  cluster(cluster, now) {
    const healthy = cluster.hosts.filter((host) => host.healthy).length;
    return h('div', {class: 'card'},
      h('h2', null, h('span', {class: 'mono'}, cluster.name), h('span', {class: 'muted'}, ` · ${healthy}/${cluster.hosts.length} healthy`)),
      h('div', {class: 'table-wrap'}, h('table', {class: 'hosts'},
        h('thead', null, h('tr', null, ['Node', 'Health', 'Weight', 'req/s', 'Active requests', 'Connections',
          'Requests', 'Errors', 'Timeouts'].map((t) => h('th', {scope: 'col'}, t)))),
        h('tbody', null, cluster.hosts.map((host) => h('tr', {'data-host': host.address},
          h('th', {scope: 'row', class: 'mono'}, host.address, host.hostname ? h('div', {class: 'muted'}, host.hostname) : null),
          h('td', null, h('span', {class: `badge ${host.healthy ? 'ready' : 'unavailable'}`}, host.healthy ? 'healthy' : 'unhealthy'),
            host.health.length ? h('div', {class: 'reason'}, host.health.join(', ')) : null),
          h('td', {class: 'num'}, host.weight),
          h('td', {class: 'num'}, this.rate(host, now)),
          h('td', {class: 'num'}, host.rq_active),
          h('td', {class: 'num'}, host.cx_active),
          h('td', {class: 'num'}, host.rq_total.toLocaleString('en')),
          h('td', {class: 'num'}, host.rq_error.toLocaleString('en')),
          h('td', {class: 'num'}, host.rq_timeout.toLocaleString('en'))))))));
  }
}
