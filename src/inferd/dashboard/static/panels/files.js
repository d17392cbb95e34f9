// Model files: a model's folder in the repository (local or S3): versions, files and sizes,
// config.pbtxt rendered, the effective config of a loaded model, and downloads.

import {getJSON, request, seg} from '../api.js';
import {h, fmt, replace, field, select, setOptions, message, downloadBlob} from '../ui.js';
import {adminWhyNot, onOverview, model as modelInfo} from '../store.js';

// config.pbtxt with its keys, strings, numbers and comments marked for colour.
export function highlightPbtxt(text) {
  const out = [];
  const pattern = /(#[^\n]*)|("(?:[^"\\]|\\.)*")|\b([A-Za-z_][A-Za-z0-9_]*)(\s*[:{[])|\b(-?\d+(?:\.\d+)?(?:e-?\d+)?)\b|\b(TYPE_[A-Z0-9]+|KIND_[A-Z]+|true|false)\b/g;
  let last = 0;
  let found;
  while ((found = pattern.exec(text)) !== null) {
    if (found.index > last) out.push(text.slice(last, found.index));
    if (found[1]) out.push(h('span', {class: 'tk-comment'}, found[1]));
    else if (found[2]) out.push(h('span', {class: 'tk-string'}, found[2]));
    else if (found[3]) out.push(h('span', {class: 'tk-key'}, found[3]), found[4]);
    else if (found[5]) out.push(h('span', {class: 'tk-number'}, found[5]));
    else out.push(h('span', {class: 'tk-const'}, found[6]));
    last = pattern.lastIndex;
  }
  out.push(text.slice(last));
  return out;
}

export class FilesPanel {
  constructor(root, app) {
    this.root = root;
    this.app = app;
    this.overviewEveryMs = 10000;
    this.model = select([], '', {id: 'files-model'});
    this.reload = h('button', {type: 'button', class: 'ghost', onclick: () => this.load()}, 'Refresh');
    this.msg = h('div');
    this.body = h('div');
    replace(root,
      h('div', {class: 'panel-head'}, h('h1', null, 'Model files'),
        h('div', {class: 'filters'}, field('Model', this.model), this.reload)),
      this.msg, this.body);
    this.model.addEventListener('change', () => this.load());
    onOverview((doc) => {
      const before = this.model.value;
      setOptions(this.model, doc.models.filter((m) => m.in_repository).map((m) => m.name), this.wanted || before);
      const unblocked = this.blocked && !adminWhyNot('');
      if (this.model.value && (this.model.value !== this.shown || unblocked)) this.load();
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
    if (!name) {
      message(this.msg, 'The repository has no models.');
      replace(this.body);
      return;
    }
    const why = adminWhyNot('Browsing model files');
    message(this.msg, why || '', 'info');
    this.blocked = Boolean(why);
    if (why) {
      replace(this.body);
      return;
    }
    let doc;
    try {
      doc = await getJSON(`/v2/repository/models/${seg(name)}/files`);
    } catch (error) {
      message(this.msg, error.describe ? error.describe() : String(error), 'error');
      replace(this.body);
      return;
    }
    if (name !== this.model.value) return;
    const loaded = modelInfo(name)?.versions.some((v) => v.state === 'READY');
    let effective = null;
    if (loaded) {
      effective = await getJSON(`/v2/models/${seg(name)}/config`).catch(() => null);
    }
    if (name !== this.model.value) return;
    this.render(doc, effective);
  }

  download(name, path) {
    return async () => {
      try {
        const response = await request('GET', `/v2/repository/models/${seg(name)}/files/${path.split('/').map(seg).join('/')}`);
        downloadBlob(await response.blob(), path.split('/').pop());
      } catch (error) {
        message(this.msg, error.describe ? error.describe() : String(error), 'error');
      }
    };
  }

  render(doc, effective) {
    const rows = doc.files.map((f) => h('tr', null,
      h('td', {class: 'mono'}, f.path),
      h('td', null, f.version ? `v${f.version}` : 'model'),
      h('td', {class: 'num'}, fmt.bytes(f.bytes)),
      h('td', null, h('button', {type: 'button', class: 'ghost small', onclick: this.download(doc.name, f.path),
        'aria-label': `Download ${f.path}`}, 'Download'))));
    const versions = doc.versions.map((v) => `v${v.version}: ${v.files} file${v.files === 1 ? '' : 's'}, ${fmt.bytes(v.bytes)}`).join(' · ');
    const configBlock = doc.config_pbtxt !== null
      ? h('div', {class: 'card'},
        h('div', {class: 'card-head'}, h('h2', null, 'config.pbtxt'),
          h('button', {type: 'button', class: 'primary small', onclick: this.download(doc.name, 'config.pbtxt')}, 'Download config')),
        h('pre', {class: 'code', tabindex: '0'}, highlightPbtxt(doc.config_pbtxt)))
      : h('div', {class: 'card'}, h('h2', null, 'config.pbtxt'), h('p', {class: 'muted'}, doc.config_note));
    const effectiveText = effective ? JSON.stringify(effective, null, 2) : '';
    const effectiveBlock = effective
      ? h('details', {class: 'card', open: doc.config_pbtxt === null},
        h('summary', null, 'Effective config of the loaded version (completed from the model file)'),
        h('div', {class: 'card-head'}, h('span'), h('button', {type: 'button', class: 'ghost small',
          onclick: () => downloadBlob(new Blob([effectiveText], {type: 'application/json'}), `${doc.name}-config.json`)},
        'Download config (JSON)')),
        h('pre', {class: 'code', tabindex: '0'}, effectiveText))
      : null;
    replace(this.body,
      h('p', null, h('b', {class: 'mono'}, doc.name), ` in ${doc.repository}${doc.local ? '' : ' (remote)'} · `,
        `${doc.files.length} files, ${fmt.bytes(doc.total_bytes)}`, versions ? ` · ${versions}` : '',
        doc.has_sample ? ' · has sample.json' : ''),
      h('div', {class: 'split'},
        h('div', {class: 'table-wrap'}, h('table', {class: 'files'},
          h('thead', null, h('tr', null, ['Path', 'Version', 'Size', ''].map((t) => h('th', {scope: 'col'}, t)))),
          h('tbody', null, rows))),
        h('div', null, configBlock, effectiveBlock)));
  }
}
