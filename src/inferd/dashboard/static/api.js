// Every request the page makes goes through here: the operator's token (kept in
// sessionStorage, sent as "Authorization: Bearer ...") and one error type for refusals.

const TOKEN_KEY = 'inferd.token';
const refusalListeners = new Set();

export function token() {
  return sessionStorage.getItem(TOKEN_KEY) || '';
}

export function setToken(value) {
  if (value) sessionStorage.setItem(TOKEN_KEY, value);
  else sessionStorage.removeItem(TOKEN_KEY);
}

export class ApiError extends Error {
  constructor(status, message, method, path) {
    super(message);
    this.status = status;
    this.method = method;
    this.path = path;
  }
  get refused() {
    return this.status === 401 || this.status === 403;
  }
  describe() {
    if (this.status === 0) return `${this.method} ${this.path}: ${this.message}`;
    return `${this.status} ${statusText(this.status)}: ${this.message}`;
  }
}

function statusText(status) {
  return {400: 'Bad Request', 401: 'Unauthorized', 403: 'Forbidden', 404: 'Not Found',
    405: 'Method Not Allowed', 409: 'Conflict', 413: 'Payload Too Large', 500: 'Internal Error',
    501: 'Not Implemented', 503: 'Unavailable', 504: 'Timeout'}[status] || '';
}

export function onRefusal(listener) {
  refusalListeners.add(listener);
}

function authHeaders(headers) {
  const result = new Headers(headers || {});
  const value = token();
  if (value) result.set('Authorization', `Bearer ${value}`);
  return result;
}

async function errorFrom(response, method, path) {
  let message = response.statusText || 'error';
  try {
    const text = await response.text();
    try {
      const doc = JSON.parse(text);
      message = doc.error || text;
    } catch {
      if (text) message = text.slice(0, 500);
    }
  } catch { /* the body is gone: keep the status text */ }
  const error = new ApiError(response.status, message, method, path);
  if (error.refused) refusalListeners.forEach((listener) => listener(error));
  return error;
}

// fetch with the token; throws ApiError for an answer that is not 2xx, or none at all.
export async function request(method, path, {body, headers, signal} = {}) {
  const sent = authHeaders(headers);
  let payload = body;
  if (body !== undefined && body !== null && typeof body === 'object'
      && !(body instanceof Blob) && !(body instanceof ArrayBuffer) && !ArrayBuffer.isView(body)) {
    payload = JSON.stringify(body);
    sent.set('Content-Type', 'application/json');
  }
  let response;
  try {
    response = await fetch(path, {method, headers: sent, body: payload, signal, cache: 'no-store'});
  } catch (error) {
    if (error.name === 'AbortError') throw error;
    throw new ApiError(0, `no answer from the server (${error.message})`, method, path);
  }
  if (!response.ok) throw await errorFrom(response, method, path);
  return response;
}

export async function getJSON(path, options) {
  return (await request('GET', path, options)).json();
}

export async function postJSON(path, body, options) {
  const response = await request('POST', path, {...options, body: body ?? {}});
  const text = await response.text();
  return text ? JSON.parse(text) : null;
}

// PUT a file with upload progress (fetch has none): resolves to the parsed JSON answer.
export function upload(path, blob, onProgress) {
  return new Promise((resolve, reject) => {
    const xhr = new XMLHttpRequest();
    xhr.open('PUT', path);
    const value = token();
    if (value) xhr.setRequestHeader('Authorization', `Bearer ${value}`);
    xhr.setRequestHeader('Content-Type', 'application/octet-stream');
    xhr.upload.onprogress = (event) => {
      if (event.lengthComputable) onProgress(event.loaded / event.total);
    };
    xhr.onload = () => {
      let doc = null;
      try { doc = JSON.parse(xhr.responseText); } catch { /* not JSON */ }
      if (xhr.status >= 200 && xhr.status < 300) {
        resolve(doc);
        return;
      }
      const message = (doc && doc.error) || xhr.responseText || xhr.statusText;
      const error = new ApiError(xhr.status, message, 'PUT', path);
      if (error.refused) refusalListeners.forEach((listener) => listener(error));
      reject(error);
    };
    xhr.onerror = () => reject(new ApiError(0, 'the upload did not reach the server', 'PUT', path));
    xhr.send(blob);
  });
}

// A model-relative path segment.
export function seg(name) {
  return encodeURIComponent(name);
}
