// A model folder picked or dropped in the browser, packed as a tar (gzip-compressed where the
// browser has CompressionStream) for PUT /v2/repository/models/{m}. POSIX ustar headers.

const BLOCK = 512;
const encoder = new TextEncoder();

function writeString(view, offset, length, text) {
  const bytes = encoder.encode(text);
  if (bytes.length > length) throw new Error(`path too long for a tar header: ${text}`);
  view.set(bytes, offset);
}

function writeOctal(view, offset, length, value) {
  writeString(view, offset, length, `${value.toString(8).padStart(length - 1, '0')}\0`);
}

function splitPath(path) {
  if (encoder.encode(path).length <= 100) return ['', path];
  const cut = path.lastIndexOf('/', 155);
  if (cut <= 0 || encoder.encode(path.slice(cut + 1)).length > 100) {
    throw new Error(`path too long for a tar header: ${path}`);
  }
  return [path.slice(0, cut), path.slice(cut + 1)];
}

function header(path, size, mtimeS) {
  const block = new Uint8Array(BLOCK);
  const [prefix, name] = splitPath(path);
  writeString(block, 0, 100, name);
  writeOctal(block, 100, 8, 0o644);
  writeOctal(block, 108, 8, 0);
  writeOctal(block, 116, 8, 0);
  writeOctal(block, 124, 12, size);
  writeOctal(block, 136, 12, Math.floor(mtimeS));
  block.fill(0x20, 148, 156); // checksum field counts as spaces
  block[156] = 0x30; // '0': a regular file
  writeString(block, 257, 6, 'ustar\0');
  writeString(block, 263, 2, '00');
  writeString(block, 345, 155, prefix);
  let sum = 0;
  for (const byte of block) sum += byte;
  writeString(block, 148, 8, `${sum.toString(8).padStart(6, '0')}\0 `);
  return block;
}

// files: [{path, file}] with paths relative to the model folder's parent or the folder.
export async function packTar(files) {
  const parts = [];
  const now = Date.now() / 1000;
  for (const {path, file} of files) {
    parts.push(header(path, file.size, file.lastModified ? file.lastModified / 1000 : now));
    parts.push(file);
    const pad = (BLOCK - (file.size % BLOCK)) % BLOCK;
    if (pad) parts.push(new Uint8Array(pad));
  }
  parts.push(new Uint8Array(BLOCK * 2));
  const tar = new Blob(parts, {type: 'application/x-tar'});
  if (typeof CompressionStream === 'undefined') return tar;
  const gzipped = tar.stream().pipeThrough(new CompressionStream('gzip'));
  return new Response(gzipped).blob();
}

// Every file under a dropped directory entry (webkitGetAsEntry), with its relative path.
export async function walkEntry(entry, prefix = '') {
  if (entry.isFile) {
    const file = await new Promise((resolve, reject) => entry.file(resolve, reject));
    return [{path: `${prefix}${entry.name}`, file}];
  }
  const reader = entry.createReader();
  const children = [];
  for (;;) {
    const batch = await new Promise((resolve, reject) => reader.readEntries(resolve, reject));
    if (!batch.length) break;
    children.push(...batch);
  }
  const found = [];
  for (const child of children) {
    if (child.name.startsWith('.')) continue;
    found.push(...await walkEntry(child, `${prefix}${entry.name}/`));
  }
  return found;
}
