// Small DOM helpers shared by the panels: element builders, number formats, the confirm
// dialog and notices. No inline styles (the page's Content-Security-Policy forbids them).

const SVG_NS = 'http://www.w3.org/2000/svg';

function apply(el, attrs) {
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === 'class') el.setAttribute('class', value);
    else if (key === 'text') el.textContent = value;
    else if (key.startsWith('on') && typeof value === 'function') {
      el.addEventListener(key.slice(2), value);
    } else if (key === 'dataset') Object.assign(el.dataset, value);
    else if (key === 'value' && 'value' in el) el.value = value;
    else if (key === 'checked' || key === 'disabled' || key === 'selected') el[key] = Boolean(value);
    else el.setAttribute(key, value === true ? '' : String(value));
  }
  return el;
}

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

export function h(tag, attrs, ...children) {
  return append(apply(document.createElement(tag), attrs), children);
}

export function s(tag, attrs, ...children) {
  return append(apply(document.createElementNS(SVG_NS, tag), attrs), children);
}

export function clear(el) {
  while (el.firstChild) el.firstChild.remove();
  return el;
}

export function replace(el, ...children) {
  clear(el);
  return append(el, children);
}

export const fmt = {
  bytes(n) {
    if (n === null || n === undefined) return '–';
    const units = ['B', 'KB', 'MB', 'GB', 'TB'];
    let value = n;
    let unit = 0;
    while (value >= 1024 && unit < units.length - 1) {
      value /= 1024;
      unit += 1;
    }
    return `${value >= 100 || unit === 0 ? value.toFixed(0) : value.toFixed(1)} ${units[unit]}`;
  },
  num(n, digits = 1) {
    if (n === null || n === undefined || Number.isNaN(n)) return '–';
    if (Math.abs(n) >= 1000) return Math.round(n).toLocaleString('en');
    if (Math.abs(n) >= 100 || Number.isInteger(n)) return String(Math.round(n * 10) / 10);
    return n.toFixed(Math.abs(n) < 1 ? digits + 1 : digits);
  },
  ms(n) {
    if (!n) return '0 ms';
    if (n < 1) return `${(n * 1000).toFixed(0)} µs`;
    if (n >= 1000) return `${(n / 1000).toFixed(2)} s`;
    return `${fmt.num(n)} ms`;
  },
  seconds(n) {
    if (n === null || n === undefined) return '–';
    if (n < 1) return `${Math.round(n * 1000)} ms`;
    if (n < 120) return `${n.toFixed(1)} s`;
    if (n < 7200) return `${Math.round(n / 60)} min`;
    if (n < 172800) return `${(n / 3600).toFixed(1)} h`;
    return `${Math.round(n / 86400)} d`;
  },
  clock(t) {
    return new Date(t * 1000).toLocaleTimeString('en-GB', {hour12: false});
  },
};

export function badge(state) {
  const known = ['READY', 'LOADING', 'UNLOADING', 'UNAVAILABLE'].includes(state);
  return h('span', {class: `badge ${known ? state.toLowerCase() : 'other'}`}, state || '–');
}

// A modal confirmation: resolves true when confirmed. Escape or Cancel resolve false.
export function confirmAction({title, body, confirm = 'Confirm', danger = false}) {
  return new Promise((resolve) => {
    const ok = h('button', {type: 'button', class: danger ? 'danger' : 'primary'}, confirm);
    const cancel = h('button', {type: 'button', class: 'ghost'}, 'Cancel');
    const dialog = h('dialog', {class: 'confirm', 'aria-labelledby': 'confirm-title'},
      h('h2', {id: 'confirm-title'}, title),
      h('div', {class: 'confirm-body'}, body),
      h('div', {class: 'actions'}, cancel, ok));
    let answered = false;
    const finish = (answer) => {
      if (answered) return;
      answered = true;
      dialog.close();
      dialog.remove();
      resolve(answer);
    };
    ok.addEventListener('click', () => finish(true));
    cancel.addEventListener('click', () => finish(false));
    dialog.addEventListener('cancel', (event) => {
      event.preventDefault();
      finish(false);
    });
    document.body.append(dialog);
    dialog.showModal();
    cancel.focus();
  });
}

// A short notice in the corner; errors stay longer and can be closed.
export function notify(message, kind = 'info') {
  const region = document.getElementById('toasts');
  const close = h('button', {type: 'button', class: 'ghost small', 'aria-label': 'Dismiss'}, '×');
  const toast = h('div', {class: `toast ${kind}`}, h('span', null, message), close);
  close.addEventListener('click', () => toast.remove());
  region.append(toast);
  setTimeout(() => toast.remove(), kind === 'error' ? 12000 : 5000);
  return toast;
}

// An inline message box in a panel (role=alert for errors so screen readers hear it).
export function message(el, text, kind = 'info') {
  replace(el, text ? h('div', {class: `msg ${kind}`, role: kind === 'error' ? 'alert' : 'status'},
    text) : '');
}

export function field(label, control, hint) {
  const id = control.id || `f-${Math.random().toString(36).slice(2, 9)}`;
  control.id = id;
  return h('div', {class: 'field'}, h('label', {for: id}, label), control,
    hint ? h('small', {class: 'muted'}, hint) : null);
}

export function select(options, value, attrs = {}) {
  const el = h('select', attrs);
  setOptions(el, options, value);
  return el;
}

// Replace a select's options ([value, label] pairs or strings) keeping the choice if it stays.
export function setOptions(el, options, value = el.value) {
  const current = [...el.options].map((o) => `${o.value}\u0000${o.textContent}`).join('\u0001');
  const wanted = options.map((o) => (Array.isArray(o) ? o : [o, o]));
  const next = wanted.map(([v, l]) => `${v}\u0000${l}`).join('\u0001');
  if (current !== next) {
    replace(el, wanted.map(([v, l]) => h('option', {value: v}, l)));
  }
  if (wanted.some(([v]) => v === value)) el.value = value;
}

export function downloadBlob(blob, filename) {
  const url = URL.createObjectURL(blob);
  const link = h('a', {href: url, download: filename});
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}
