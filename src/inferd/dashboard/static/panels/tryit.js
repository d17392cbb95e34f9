// Try it: a form built from a model's metadata (datatypes and shapes), filled with random
// values, zeros or the model's sample.json, that sends a real v2 infer request and shows the
// answer and its latency. BYTES inputs take a file (an image, for instance), sent as binary.

import {ApiError, getJSON, request, seg} from '../api.js';
import {h, fmt, replace, field, select, setOptions, message} from '../ui.js';
import {adminWhyNot, model as modelInfo, onOverview} from '../store.js';

const SHOW_VALUES = 64;

export function product(shape) {
  return shape.reduce((n, d) => n * d, 1);
}

export function flatten(value) {
  return Array.isArray(value) ? value.flat(Infinity) : [value];
}

function shapeOf(value) {
  const shape = [];
  let node = value;
  while (Array.isArray(node)) {
    shape.push(node.length);
    node = node[0];
  }
  return shape;
}

export function fill(datatype, count, how) {
  const values = new Array(count);
  for (let i = 0; i < count; i += 1) {
    if (how === 'zeros') values[i] = datatype === 'BOOL' ? false : datatype === 'BYTES' ? '' : 0;
    else if (datatype.startsWith('FP') || datatype === 'BF16') values[i] = Math.round(Math.random() * 1e4) / 1e4;
    else if (datatype === 'BOOL') values[i] = Math.random() < 0.5;
    else if (datatype === 'BYTES') values[i] = `text ${i}`;
    else values[i] = Math.floor(Math.random() * 10);
  }
  return values;
}

// sample.json in any of the shapes people keep: a v2 request, perf_analyzer's {"data": [...]},
// {"inputs": [[row], ...]} (rows of the first input), or {"NAME": value}.
export function sampleInputs(doc, inputs) {
  const found = {};
  const put = (name, value) => {
    if (value && !Array.isArray(value) && typeof value === 'object' && 'content' in value) {
      found[name] = {shape: value.shape || shapeOf(value.content), data: flatten(value.content)};
    } else found[name] = {shape: shapeOf(value), data: flatten(value)};
  };
  if (Array.isArray(doc.inputs) && doc.inputs.length && typeof doc.inputs[0] === 'object' && !Array.isArray(doc.inputs[0])) {
    for (const item of doc.inputs) found[item.name] = {shape: item.shape, data: flatten(item.data)};
  } else if (Array.isArray(doc.inputs) && inputs.length) {
    put(inputs[0].name, doc.inputs);
  } else if (Array.isArray(doc.data) && doc.data.length) {
    for (const [name, value] of Object.entries(doc.data[0])) put(name, value);
  } else {
    for (const input of inputs) if (input.name in doc) put(input.name, doc[input.name]);
  }
  return found;
}

function show(values) {
  const flat = flatten(values);
  const text = flat.slice(0, SHOW_VALUES).map((v) => (typeof v === 'number' ? String(v) : JSON.stringify(v))).join(', ');
  return flat.length > SHOW_VALUES ? `[${text}, … ${flat.length - SHOW_VALUES} more]` : `[${text}]`;
}

export class TryPanel {
  constructor(root, app) {
    this.root = root;
    this.app = app;
    this.overviewEveryMs = 10000;
    this.model = select([], '', {id: 'try-model'});
    this.msg = h('div');
    this.form = h('form', {class: 'try-form', novalidate: true});
    this.result = h('div', {class: 'result', 'aria-live': 'polite'});
    replace(root,
      h('div', {class: 'panel-head'}, h('h1', null, 'Try it'), h('div', {class: 'filters'}, field('Model', this.model))),
      this.msg, this.form, this.result);
    this.model.addEventListener('change', () => this.load());
    this.form.addEventListener('submit', (event) => {
      event.preventDefault();
      this.send();
    });
    onOverview((doc) => {
      const ready = doc.models.filter((m) => m.state === 'READY').map((m) => m.name);
      setOptions(this.model, ready, this.wanted || this.model.value);
      if (!ready.length) {
        message(this.msg, 'No model is READY.');
        replace(this.form);
        this.shown = null;
      } else if (this.model.value !== this.shown || (this.sampleBlocked && !adminWhyNot(''))) this.load();
    });
  }

  show(options = {}) {
    if (options.model) {
      this.wanted = options.model;
      if ([...this.model.options].some((o) => o.value === options.model)) {
        this.model.value = options.model;
        this.load();
      }
    }
  }

  async load() {
    const name = this.model.value;
    this.shown = name;
    this.wanted = null;
    replace(this.result);
    if (!name) return;
    message(this.msg, '');
    let meta;
    try {
      meta = await getJSON(`/v2/models/${seg(name)}`);
    } catch (error) {
      message(this.msg, error.describe ? error.describe() : String(error), 'error');
      return;
    }
    // sample.json is one of the model's files: read through the admin API, where the page may.
    const blocked = adminWhyNot('The Sample button (the model\'s sample.json)');
    const files = blocked ? null
      : await getJSON(`/v2/repository/models/${seg(name)}/files`).catch(() => null);
    if (name !== this.model.value) return;
    this.meta = meta;
    this.rows = meta.inputs.map((input) => this.inputRow(input));
    const hasSample = Boolean(files?.has_sample);
    const sampleWhyNot = blocked || (hasSample ? '' : 'This model has no sample.json for the Sample button.');
    const button = (label, how, attrs = {}) => h('button', {type: 'button', class: 'ghost', id: `try-${how}`,
      onclick: () => this.fillAll(how), ...attrs}, label);
    this.sampleBlocked = Boolean(blocked);
    replace(this.form,
      h('p', {class: 'muted'}, `${meta.name} · ${meta.platform || modelInfo(name)?.backend || 'custom backend'} · versions ${meta.versions.join(', ')} · outputs ${
        meta.outputs.map((o) => `${o.name} ${o.datatype} [${o.shape.join(', ')}]`).join('; ')}`),
      this.rows.map((row) => row.el),
      h('div', {class: 'actions'},
        button('Random', 'random'), button('Zeros', 'zeros'),
        button('Sample', 'sample', {disabled: !hasSample, title: sampleWhyNot || 'the model\'s sample.json',
          'aria-describedby': sampleWhyNot ? 'try-sample-why' : null}),
        h('button', {type: 'submit', class: 'primary', id: 'try-send'}, 'Send request')),
      sampleWhyNot ? h('p', {class: 'muted', id: 'try-sample-why'}, sampleWhyNot) : null);
    this.fillAll(hasSample ? 'sample' : 'random');
  }

  inputRow(input) {
    const shape = h('input', {type: 'text', class: 'mono', value: input.shape.map((d) => (d < 0 ? 1 : d)).join(', '),
      'aria-describedby': undefined});
    const data = h('textarea', {class: 'mono', rows: 3, spellcheck: 'false'});
    const row = {input, shape, data, file: null};
    const parts = [field(`Shape (declared [${input.shape.join(', ')}])`, shape),
      field(`Data (JSON, ${input.datatype}, row-major)`, data)];
    if (input.datatype === 'BYTES') {
      const picker = h('input', {type: 'file', accept: 'image/*,*/*'});
      const preview = h('div', {class: 'preview'});
      picker.addEventListener('change', () => {
        row.file = picker.files[0] || null;
        replace(preview, row.file ? [
          row.file.type.startsWith('image/') ? h('img', {src: URL.createObjectURL(row.file), alt: `picked ${row.file.name}`}) : null,
          h('span', {class: 'muted'}, `${row.file.name}, ${fmt.bytes(row.file.size)}: sent as one BYTES element`)] : []);
        data.disabled = Boolean(row.file);
      });
      parts.push(field('Or a file (an image for an image model)', picker), preview);
      row.picker = picker;
    }
    row.el = h('fieldset', {class: 'input-row', 'data-input': input.name},
      h('legend', null, h('b', {class: 'mono'}, input.name), ` ${input.datatype}`), parts);
    return row;
  }

  async fillAll(how) {
    let sample = {};
    if (how === 'sample') {
      try {
        const response = await request('GET', `/v2/repository/models/${seg(this.meta.name)}/files/sample.json`);
        const doc = JSON.parse(await response.text());
        sample = sampleInputs(doc, this.meta.inputs);
        message(this.msg, `Filled from sample.json${doc.labels ? `; expected labels ${show(doc.labels)}` : ''}.`);
      } catch (error) {
        message(this.msg, `sample.json: ${error.describe ? error.describe() : error.message}`, 'error');
        return;
      }
    }
    for (const row of this.rows) {
      const found = sample[row.input.name];
      if (found) {
        row.shape.value = found.shape.join(', ');
        row.data.value = JSON.stringify(found.data);
        continue;
      }
      const shape = this.parseShape(row);
      if (shape) row.data.value = JSON.stringify(fill(row.input.datatype, product(shape), how));
    }
  }

  parseShape(row) {
    const parts = row.shape.value.split(/[\s,]+/).filter(Boolean).map(Number);
    if (parts.some((d) => !Number.isInteger(d) || d < 0)) {
      message(this.msg, `input '${row.input.name}': the shape must be whole numbers, like "1, 64"`, 'error');
      return null;
    }
    return parts;
  }

  async build() {
    const header = {inputs: []};
    const chunks = [];
    for (const row of this.rows) {
      const shape = this.parseShape(row);
      if (!shape) return null;
      const entry = {name: row.input.name, datatype: row.input.datatype, shape};
      if (row.file) {
        if (product(shape) !== 1) {
          message(this.msg, `input '${row.input.name}': a picked file is one element, so the shape must hold 1 (like "1")`, 'error');
          return null;
        }
        const bytes = new Uint8Array(await row.file.arrayBuffer());
        const length = new Uint8Array(4);
        new DataView(length.buffer).setUint32(0, bytes.length, true);
        chunks.push(length, bytes);
        entry.parameters = {binary_data_size: bytes.length + 4};
      } else {
        let data;
        try {
          data = flatten(JSON.parse(row.data.value || '[]'));
        } catch (error) {
          message(this.msg, `input '${row.input.name}': the data is not JSON (${error.message})`, 'error');
          return null;
        }
        if (data.length !== product(shape)) {
          message(this.msg, `input '${row.input.name}': shape [${shape.join(', ')}] needs ${product(shape)} values, the data has ${data.length}`, 'error');
          return null;
        }
        entry.data = data;
      }
      header.inputs.push(entry);
    }
    // BYTES answers may not be text (an echoed image): ask for them as binary data.
    const bytesOutputs = this.meta.outputs.filter((o) => o.datatype === 'BYTES');
    if (bytesOutputs.length) {
      header.outputs = this.meta.outputs.map((o) => (o.datatype === 'BYTES'
        ? {name: o.name, parameters: {binary_data: true}} : {name: o.name}));
    }
    if (!chunks.length) return {body: header, headers: {}};
    const json = new TextEncoder().encode(JSON.stringify(header));
    return {body: new Blob([json, ...chunks]),
      headers: {'Inference-Header-Content-Length': String(json.length), 'Content-Type': 'application/octet-stream'}};
  }

  // The answer: JSON, or a JSON header followed by binary outputs (BYTES elements are
  // 4-byte little-endian lengths and their bytes).
  async decode(response) {
    const headerLength = response.headers.get('inference-header-content-length');
    if (headerLength === null) return response.json();
    const buffer = new Uint8Array(await response.arrayBuffer());
    const size = Number(headerLength);
    const doc = JSON.parse(new TextDecoder().decode(buffer.subarray(0, size)));
    let offset = size;
    for (const output of doc.outputs) {
      const length = output.parameters?.binary_data_size;
      if (length === undefined) continue;
      const raw = buffer.subarray(offset, offset + length);
      offset += length;
      if (output.datatype !== 'BYTES') continue;
      const view = new DataView(raw.buffer, raw.byteOffset, raw.byteLength);
      const items = [];
      for (let at = 0; at + 4 <= raw.length;) {
        const n = view.getUint32(at, true);
        const element = raw.subarray(at + 4, at + 4 + n);
        at += 4 + n;
        try {
          items.push(new TextDecoder('utf-8', {fatal: true}).decode(element));
        } catch {
          items.push(`<${n} bytes>`);
        }
      }
      output.data = items;
    }
    return doc;
  }

  async send() {
    message(this.msg, '');
    replace(this.result); // an error below must not sit above the previous request's answer
    const built = await this.build();
    if (!built) return;
    const name = this.meta.name;
    const started = performance.now();
    let response;
    try {
      response = await request('POST', `/v2/models/${seg(name)}/infer`, built);
    } catch (error) {
      const took = performance.now() - started;
      replace(this.result, h('div', {class: 'msg error', role: 'alert'},
        `${error instanceof ApiError ? error.describe() : error.message} (after ${fmt.ms(took)})`));
      return;
    }
    const doc = await this.decode(response);
    const took = performance.now() - started;
    replace(this.result,
      h('div', {class: 'card'},
        h('div', {class: 'card-head'}, h('h2', null, 'Answer'),
          h('span', {class: 'latency'}, `${fmt.ms(took)} round trip · HTTP ${response.status} · version ${doc.model_version} · request id `,
            h('span', {class: 'mono'}, response.headers.get('x-request-id') || '–'))),
        h('table', {class: 'outputs'},
          h('thead', null, h('tr', null, ['Output', 'Type', 'Shape', 'Values'].map((t) => h('th', {scope: 'col'}, t)))),
          h('tbody', null, doc.outputs.map((o) => h('tr', {'data-output': o.name},
            h('th', {scope: 'row', class: 'mono'}, o.name), h('td', null, o.datatype),
            h('td', {class: 'mono'}, `[${o.shape.join(', ')}]`),
            h('td', {class: 'mono values'}, o.data !== undefined ? show(o.data) : `${o.parameters?.binary_data_size ?? '?'} bytes (binary)`)))))));
  }
}
