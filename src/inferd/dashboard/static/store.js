// What several panels share: the models document (/v2/dashboard/models) and the traffic
// series (/v2/dashboard/series, fetched incrementally with ?after=).

import {getJSON, token} from './api.js';

export const overview = {doc: null, listeners: new Set(), fetchedMs: 0};

export async function refreshOverview() {
  const doc = await getJSON('/v2/dashboard/models');
  overview.doc = doc;
  overview.fetchedMs = Date.now();
  overview.listeners.forEach((listener) => listener(doc));
  return doc;
}

export function onOverview(listener) {
  overview.listeners.add(listener);
  if (overview.doc) listener(overview.doc);
}

// Why this page cannot use the admin API now, as a calm sentence (null when it can): the
// server has it off, or wants an admin token the page does not have. A panel that needs it
// shows the sentence and does not ask, so nothing is refused and nothing else is disturbed.
export function adminWhyNot(what) {
  const server = overview.doc?.server;
  if (!server) return `${what} waits for the server's first answer.`;
  if (server.admin === 'off') {
    return `${what} needs the server's admin API, which is off: ${server.admin_hint}.`;
  }
  if (server.admin === 'token' && !token()) {
    return `${what} needs a token of the admin scope: paste one with the Token button.`;
  }
  return null;
}

export function modelNames(filter = () => true) {
  return (overview.doc?.models || []).filter(filter).map((m) => m.name);
}

export function model(name) {
  return (overview.doc?.models || []).find((m) => m.name === name) || null;
}

// The traffic series: server rows every second, model rows only when a model was busy.
export const series = {
  fields: [],
  index: {},
  windowS: 900,
  last: 0,
  now: 0,
  server: [],
  models: new Map(), // name -> Map(t -> row)
  batches: {server: {}, models: {}},
};

export async function refreshSeries() {
  const doc = await getJSON(`/v2/dashboard/series?after=${series.last}`);
  if (!series.fields.length) {
    series.fields = doc.fields;
    doc.fields.forEach((name, i) => { series.index[name] = i; });
  }
  series.windowS = doc.window_s;
  series.now = doc.now;
  const oldest = doc.now - doc.window_s;
  series.server.push(...doc.server.rows);
  while (series.server.length && series.server[0][0] < oldest) series.server.shift();
  series.batches.server = doc.server.batch_sizes;
  for (const [name, entry] of Object.entries(doc.models)) {
    let rows = series.models.get(name);
    if (!rows) series.models.set(name, rows = new Map());
    for (const row of entry.rows) rows.set(row[0], row);
    series.batches.models[name] = entry.batch_sizes;
  }
  for (const [name, rows] of series.models) {
    for (const t of rows.keys()) {
      if (t >= oldest) break;
      rows.delete(t);
    }
    if (!rows.size) {
      series.models.delete(name);
      delete series.batches.models[name];
    }
  }
  if (series.server.length) series.last = series.server[series.server.length - 1][0];
  return series;
}

// Columns for a chart: times from the server rows; a model's idle seconds are zeros.
export function columns(name, keys) {
  const times = series.server.map((row) => row[0]);
  const rows = name ? series.models.get(name) : null;
  const values = keys.map((key) => {
    const i = series.index[key];
    if (!name) return series.server.map((row) => row[i]);
    return times.map((t) => (rows && rows.has(t) ? rows.get(t)[i] : 0));
  });
  return {times, values};
}

// The latest row of a model (zeros when it was idle in the last sample).
export function latest(name) {
  const last = series.server.at(-1);
  if (!last) return null;
  const row = name ? series.models.get(name)?.get(last[0]) : last;
  const result = {};
  for (const [key, i] of Object.entries(series.index)) result[key] = row ? row[i] : 0;
  return result;
}
