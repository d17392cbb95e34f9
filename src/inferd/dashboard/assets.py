"""The dashboard's static files, read once from the installed package and kept in memory.

Each file is served with an ETag (its content hash), so a reload costs a 304, and gzipped when
the browser accepts it (compressed once, here); nothing is loaded from anywhere else, and the
page's Content-Security-Policy says so to the browser.
"""

from __future__ import annotations

import gzip
import hashlib
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable

_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".txt": "text/plain; charset=utf-8",
    ".json": "application/json",
}
# Only this server's own files, scripts and connections; images may also be data: or blob:
# (the try-it panel previews a picked image).
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; "
    "form-action 'self'"
)


@dataclass(frozen=True, slots=True)
class Asset:
    body: bytes
    content_type: str
    etag: str
    gzipped: bytes  # compressed once at start; served to clients that accept gzip


def load_assets(package: str = "inferd.dashboard", folder: str = "static") -> dict[str, Asset]:
    """Every file under the package's static folder, by its path relative to that folder."""
    found: dict[str, Asset] = {}
    root = resources.files(package).joinpath(folder)

    def walk(node: Traversable, prefix: str) -> None:
        for entry in sorted(node.iterdir(), key=lambda e: e.name):
            if entry.name.startswith("."):
                continue
            rel = f"{prefix}{entry.name}"
            if entry.is_dir():
                walk(entry, rel + "/")
                continue
            suffix = "." + entry.name.rsplit(".", 1)[-1] if "." in entry.name else ""
            content_type = _TYPES.get(suffix)
            if content_type is None:
                continue
            body = entry.read_bytes()
            etag = '"' + hashlib.sha256(body).hexdigest()[:20] + '"'
            found[rel] = Asset(body, content_type, etag, gzip.compress(body, 9, mtime=0))

    walk(root, "")
    return found
