// Deploy: drop a model archive (.tar.gz, .tgz, .tar, .zip) or a model folder, name it, and
// watch it upload, load and go READY (PUT /v2/repository/models/{m}). Then load, unload,
// version labels, traffic split and shadow, each after a confirmation. The server decides:
// a refusal (control mode, auth scope, a bad config) is shown as it answers.

import {ApiError, postJSON, seg, upload} from '../api.js';
import {h, fmt, replace, field, select, setOptions, message, confirmAction, notify, badge} from '../ui.js';
import {adminWhyNot, model as modelInfo, onOverview, refreshOverview} from '../store.js';
import {packTar, walkEntry} from '../tar.js';

const ARCHIVE = /\.(tar\.gz|tgz|tar|zip|tar\.bz2|tar\.xz)$/i;
const WATCH_MS = 400;

export function modelNameFrom(filename) {
  const base = filename.replace(ARCHIVE, '').replace(/[^A-Za-z0-9_.-]+/g, '_').replace(/^[.-]+/, '');
  return base.slice(0, 255) || 'model';
}

function describe(error) {
  return error instanceof ApiError ? error.describe() : String(error.message || error);
}

export class DeployPanel {
  constructor(root, app) {
    this.root = root;
    this.app = app;
    this.overviewEveryMs = 2000;
    this.payload = null; // {kind: 'archive'|'folder', blob | files, label}
    this.adminBlocked = false;
    this.adminWhy = null;
    this.archiveInput = h('input', {type: 'file', accept: '.tar.gz,.tgz,.tar,.zip,.tar.bz2,.tar.xz', hidden: true, id: 'deploy-archive'});
    this.folderInput = h('input', {type: 'file', webkitdirectory: true, multiple: true, hidden: true, id: 'deploy-folder'});
    this.drop = h('div', {class: 'dropzone', id: 'deploy-drop', tabindex: '0', role: 'button',
      'aria-describedby': 'deploy-drop-help'},
    h('b', null, 'Drop a model here'),
    h('span', {id: 'deploy-drop-help', class: 'muted'}, 'a .tar.gz, .tgz, .tar or .zip of a model folder, or the folder itself (config.pbtxt and 1/model.onnx …). Enter or Space opens the file picker.'));
    this.picked = h('p', {class: 'muted', 'aria-live': 'polite'}, 'Nothing chosen yet.');
    this.name = h('input', {type: 'text', id: 'deploy-name', class: 'mono', pattern: '[A-Za-z0-9_][A-Za-z0-9_.\\-]*', autocomplete: 'off'});
    this.go = h('button', {type: 'submit', class: 'primary', id: 'deploy-go', disabled: true}, 'Deploy');
    this.progress = h('progress', {max: 1, value: 0, hidden: true});
    this.steps = h('ol', {class: 'steps', 'aria-live': 'polite', id: 'deploy-steps'});
    this.uploadMsg = h('div');
    this.mode = h('p', {class: 'muted'});
    const form = h('form', {class: 'card', id: 'deploy-form'},
      h('h2', null, 'Deploy a model'), this.mode, this.drop,
      h('div', {class: 'actions'},
        h('button', {type: 'button', class: 'ghost', onclick: () => this.archiveInput.click()}, 'Choose archive…'),
        h('button', {type: 'button', class: 'ghost', onclick: () => this.folderInput.click()}, 'Choose folder…')),
      this.archiveInput, this.folderInput, this.picked,
      field('Model name', this.name, 'letters, digits, _ . - ; an existing model of that name is replaced once the new one loads'),
      h('div', {class: 'actions'}, this.go), this.progress, this.steps, this.uploadMsg);
    form.addEventListener('submit', (event) => {
      event.preventDefault();
      this.deploy();
    });
    this.manage = this.buildManage();
    this.adminNote = h('div', {id: 'deploy-admin-note'});
    replace(root, h('div', {class: 'panel-head'}, h('h1', null, 'Deploy and manage')),
      this.adminNote, h('div', {class: 'split'}, form, this.manage));
    this.wireDrop();
    onOverview((doc) => this.onDoc(doc));
  }

  // ------------------------------------------------------------------ upload

  wireDrop() {
    const drop = this.drop;
    drop.addEventListener('keydown', (event) => {
      if (event.key === 'Enter' || event.key === ' ') {
        event.preventDefault();
        this.archiveInput.click();
      }
    });
    drop.addEventListener('click', () => this.archiveInput.click());
    for (const type of ['dragenter', 'dragover']) {
      drop.addEventListener(type, (event) => {
        event.preventDefault();
        drop.classList.add('over');
      });
    }
    drop.addEventListener('dragleave', () => drop.classList.remove('over'));
    drop.addEventListener('drop', (event) => {
      event.preventDefault();
      drop.classList.remove('over');
      this.onDrop(event.dataTransfer);
    });
    this.archiveInput.addEventListener('change', () => {
      if (this.archiveInput.files[0]) this.useArchive(this.archiveInput.files[0]);
      this.archiveInput.value = '';
    });
    this.folderInput.addEventListener('change', () => {
      const files = [...this.folderInput.files].filter((f) => !f.webkitRelativePath.split('/').some((p) => p.startsWith('.')))
        .map((file) => ({path: file.webkitRelativePath || file.name, file}));
      if (files.length) this.useFolder(files[0].path.split('/')[0], files);
      this.folderInput.value = '';
    });
  }

  async onDrop(transfer) {
    const items = [...(transfer.items || [])];
    const entry = items.length && items[0].webkitGetAsEntry ? items[0].webkitGetAsEntry() : null;
    if (entry && entry.isDirectory) {
      try {
        this.useFolder(entry.name, await walkEntry(entry));
      } catch (error) {
        message(this.uploadMsg, `could not read the folder: ${error.message}`, 'error');
      }
      return;
    }
    const file = transfer.files[0];
    if (file) this.useArchive(file);
  }

  useArchive(file) {
    if (!ARCHIVE.test(file.name)) {
      message(this.uploadMsg, `'${file.name}' is not a .tar.gz, .tgz, .tar or .zip archive (or drop the model folder itself)`, 'error');
      return;
    }
    this.payload = {kind: 'archive', blob: file};
    this.picked.textContent = `Archive ${file.name}, ${fmt.bytes(file.size)}`;
    this.name.value = modelNameFrom(file.name);
    this.ready();
  }

  useFolder(folder, files) {
    const total = files.reduce((sum, f) => sum + f.file.size, 0);
    this.payload = {kind: 'folder', files};
    this.picked.textContent = `Folder ${folder}: ${files.length} files, ${fmt.bytes(total)} (packed as a .tar.gz in the browser)`;
    this.name.value = modelNameFrom(folder);
    this.ready();
  }

  ready() {
    message(this.uploadMsg, '');
    replace(this.steps);
    this.go.disabled = this.adminBlocked;
    this.name.focus();
  }

  step(text, state = 'doing') {
    const item = h('li', {class: state}, text);
    this.steps.append(item);
    return item;
  }

  async deploy() {
    const name = this.name.value.trim();
    if (!this.payload) return;
    if (!/^[A-Za-z0-9_][A-Za-z0-9_.-]*$/.test(name)) {
      message(this.uploadMsg, 'The name must start with a letter, digit or _ and hold only letters, digits, _ . -', 'error');
      return;
    }
    const replacing = modelInfo(name);
    if (replacing && !await confirmAction({title: `Replace model ${name}?`,
      body: `A model named ${name} exists (${replacing.state}). The upload replaces its folder in the repository once the new one loads; if it fails to load, the old one stays.`,
      confirm: 'Replace'})) return;
    this.go.disabled = true;
    message(this.uploadMsg, '');
    replace(this.steps);
    const started = performance.now();
    let blob = this.payload.blob;
    if (this.payload.kind === 'folder') {
      const packing = this.step('Packing the folder…');
      try {
        blob = await packTar(this.payload.files);
      } catch (error) {
        packing.className = 'failed';
        message(this.uploadMsg, `could not pack the folder: ${error.message}`, 'error');
        this.go.disabled = false;
        return;
      }
      packing.className = 'done';
      packing.textContent = `Packed ${fmt.bytes(blob.size)}`;
    }
    const sending = this.step(`Uploading ${fmt.bytes(blob.size)}…`);
    this.progress.hidden = false;
    this.progress.value = 0;
    let loading = null;
    const watch = setInterval(async () => {
      const doc = await refreshOverview().catch(() => null);
      const found = doc?.models.find((m) => m.name === name);
      if (loading && found) loading.textContent = `Loading: ${found.versions.map((v) => `v${v.version} ${v.state}`).join(', ') || found.state}`;
    }, WATCH_MS);
    try {
      const answer = await upload(`/v2/repository/models/${seg(name)}`, blob, (fraction) => {
        this.progress.value = fraction;
        if (fraction >= 1 && !loading) {
          sending.className = 'done';
          sending.textContent = `Uploaded ${fmt.bytes(blob.size)}`;
          loading = this.step('Loading…');
        }
      });
      sending.className = 'done';
      if (!loading) loading = this.step('Loading…');
      loading.className = 'done';
      const states = (answer || []).map((e) => `v${e.version} ${e.state}`).join(', ');
      loading.textContent = `Loaded: ${states}`;
      const ok = (answer || []).some((e) => e.state === 'READY');
      const final = this.step(ok ? `${name} is READY (${fmt.ms(performance.now() - started)} in all)` : `${name} did not become READY`, ok ? 'done ready' : 'failed');
      final.id = 'deploy-result';
      if (ok) notify(`${name} is READY`);
    } catch (error) {
      (loading || sending).className = 'failed';
      message(this.uploadMsg, `The server refused the upload — ${describe(error)}`, 'error');
    } finally {
      clearInterval(watch);
      this.progress.hidden = true;
      this.go.disabled = this.adminBlocked;
      await refreshOverview().catch(() => null);
    }
  }

  // ------------------------------------------------------------------ manage

  buildManage() {
    this.target = select([], '', {id: 'manage-model'});
    this.targetState = h('div', {class: 'muted', 'aria-live': 'polite'});
    this.load = h('button', {type: 'button', class: 'ghost', id: 'manage-load', onclick: () => this.loadModel()}, 'Load');
    this.unload = h('button', {type: 'button', class: 'danger', id: 'manage-unload', onclick: () => this.unloadModel()}, 'Unload');
    this.applyButton = h('button', {type: 'button', class: 'primary', id: 'manage-routing',
      onclick: () => this.applyRouting()}, 'Apply routing…');
    this.manageMsg = h('div');
    this.labelsBox = h('div', {class: 'pairs'});
    this.splitBox = h('div', {class: 'pairs'});
    this.shadowOn = h('input', {type: 'checkbox', id: 'shadow-on'});
    this.shadowTarget = h('input', {type: 'text', id: 'shadow-target', class: 'mono', placeholder: 'version or label'});
    this.shadowFraction = h('input', {type: 'number', id: 'shadow-fraction', min: 0, max: 1, step: 0.05, value: 1});
    this.shadowTolerance = h('input', {type: 'number', id: 'shadow-tolerance', min: 0, step: 'any', value: 0});
    this.target.addEventListener('change', () => this.fillRouting());
    return h('div', {class: 'card', id: 'manage'},
      h('h2', null, 'Manage a model'),
      h('div', {class: 'filters'}, field('Model', this.target)), this.targetState,
      h('div', {class: 'actions'}, this.load, this.unload),
      h('h3', null, 'Version labels'), this.labelsBox,
      h('button', {type: 'button', class: 'ghost small', onclick: () => this.addPair(this.labelsBox, 'label', 'version')}, 'Add a label'),
      h('h3', null, 'Traffic split (requests that name no version)'), this.splitBox,
      h('button', {type: 'button', class: 'ghost small', onclick: () => this.addPair(this.splitBox, 'version or label', 'weight')}, 'Add a target'),
      h('h3', null, 'Shadow copies'),
      h('label', {class: 'check'}, this.shadowOn, ' mirror requests to a shadow version'),
      h('div', {class: 'row3'}, field('Target', this.shadowTarget), field('Fraction', this.shadowFraction),
        field('Tolerance', this.shadowTolerance)),
      h('div', {class: 'actions'}, this.applyButton),
      this.manageMsg);
  }

  addPair(box, keyHint, valueHint, key = '', value = '') {
    const remove = h('button', {type: 'button', class: 'ghost small', 'aria-label': `Remove ${keyHint}`}, '×');
    const row = h('div', {class: 'pair'},
      h('input', {type: 'text', class: 'mono', placeholder: keyHint, 'aria-label': keyHint, value: key}),
      h('input', {type: 'text', class: 'mono', placeholder: valueHint, 'aria-label': valueHint, value: String(value)}),
      remove);
    remove.addEventListener('click', () => row.remove());
    box.append(row);
  }

  onDoc(doc) {
    const server = doc.server;
    // Uploads, loads and routing are admin calls: where the page cannot make them it says why,
    // once, and its buttons wait (the rest of the panel stays as it is).
    const why = adminWhyNot('Deploying and managing models');
    if (this.adminBlocked !== Boolean(why) || why !== this.adminWhy) {
      this.adminBlocked = Boolean(why);
      this.adminWhy = why;
      message(this.adminNote, why || '', 'info');
      for (const button of [this.load, this.unload, this.applyButton]) button.disabled = this.adminBlocked;
      if (this.payload) this.go.disabled = this.adminBlocked;
    }
    this.mode.textContent = server.control_mode === 'none'
      ? 'This server runs with --model-control-mode none: it refuses uploads and loads (start it with poll or explicit).'
      : `Control mode ${server.control_mode}. Uploads are written into ${server.repositories[0] || 'the repository'}${server.writable ? '' : ' (no repository takes uploads)'}.`;
    setOptions(this.target, doc.models.map((m) => m.name), this.wanted || this.target.value);
    if (this.target.value !== this.routingFor) this.fillRouting();
    this.showState();
  }

  show(options = {}) {
    if (options.model) {
      this.wanted = options.model;
      if ([...this.target.options].some((o) => o.value === options.model)) {
        this.target.value = options.model;
        this.fillRouting();
      }
    }
  }

  showState() {
    const m = modelInfo(this.target.value);
    replace(this.targetState, m ? [badge(m.state), ' ', m.versions.map((v) => `v${v.version} ${v.state}`).join(', '),
      m.reason ? ` — ${m.reason}` : ''] : '');
  }

  fillRouting() {
    const m = modelInfo(this.target.value);
    this.routingFor = this.target.value;
    this.wanted = null;
    replace(this.labelsBox);
    replace(this.splitBox);
    const routing = m?.routing;
    for (const [label, version] of Object.entries(routing?.labels || {})) this.addPair(this.labelsBox, 'label', 'version', label, version);
    for (const [target, weight] of Object.entries(routing?.traffic_split || {})) this.addPair(this.splitBox, 'version or label', 'weight', target, weight);
    const shadow = routing?.shadow;
    this.shadowOn.checked = Boolean(shadow);
    this.shadowTarget.value = shadow ? String(shadow.version ?? shadow.label) : '';
    this.shadowFraction.value = shadow ? shadow.fraction : 1;
    this.shadowTolerance.value = shadow ? shadow.tolerance : 0;
    this.showState();
  }

  pairs(box) {
    return [...box.querySelectorAll('.pair')].map((row) => [...row.querySelectorAll('input')].map((i) => i.value.trim()))
      .filter(([key]) => key);
  }

  async act(title, body, confirm, danger, run) {
    if (!await confirmAction({title, body, confirm, danger})) return;
    message(this.manageMsg, `${title.replace(/\?$/, '')}…`);
    try {
      await run();
      message(this.manageMsg, `Done: ${title.replace(/\?$/, '').toLowerCase()}.`, 'ok');
    } catch (error) {
      message(this.manageMsg, `Refused — ${describe(error)}`, 'error');
    }
    await refreshOverview().catch(() => null);
    this.fillRouting();
  }

  loadModel() {
    const name = this.target.value;
    if (!name) return;
    this.act(`Load ${name}?`, `(Re)load ${name} from the repository. Versions that did not change keep serving.`, 'Load', false,
      () => postJSON(`/v2/repository/models/${seg(name)}/load`, {}));
  }

  unloadModel() {
    const name = this.target.value;
    if (!name) return;
    this.act(`Unload ${name}?`, `${name} stops taking requests; requests in flight finish first. Its folder stays in the repository.`, 'Unload', true,
      () => postJSON(`/v2/repository/models/${seg(name)}/unload`, {}));
  }

  applyRouting() {
    const name = this.target.value;
    if (!name) return;
    const labels = Object.fromEntries(this.pairs(this.labelsBox).map(([k, v]) => [k, /^\d+$/.test(v) ? Number(v) : v]));
    const split = Object.fromEntries(this.pairs(this.splitBox).map(([k, v]) => [k, Number(v)]));
    const shadow = this.shadowOn.checked ? {
      [/^\d+$/.test(this.shadowTarget.value.trim()) ? 'version' : 'label']:
        /^\d+$/.test(this.shadowTarget.value.trim()) ? Number(this.shadowTarget.value.trim()) : this.shadowTarget.value.trim(),
      fraction: Number(this.shadowFraction.value), tolerance: Number(this.shadowTolerance.value)} : null;
    const body = {labels, traffic_split: split, shadow};
    this.act(`Change the routing of ${name}?`, h('pre', {class: 'code'}, JSON.stringify(body, null, 2)), 'Apply', false,
      () => postJSON(`/v2/repository/models/${seg(name)}/routing`, body));
  }
}
