"""Where a model's files came from: the record of the files the server received from the network.

When the server writes files it received (an upload, a load call's ``file:`` parameters), it
writes beside them, in the model folder, ``.inferd-provenance.json``: each file's path, size,
modification time and SHA-256. The record travels with the folder (a rename into a local
repository, an object in an S3 bucket, the local cache of that bucket) and outlives the
server, so every later load, of any version, with any config, on any replica, after any
restart, knows which files came from the network (``network_files``). A file the operator
changes on disk (other contents) no longer matches its entry and is the operator's again;
deleting the record makes the whole folder the operator's.

The record only ever takes trust away: a file it does not list is judged as before (present at
start, or arrived in the repository later). An upload cannot bring a record of its own: the
server writes its own over it. Everything here blocks (hashing): callers run it on threads.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from inferd.core.errors import ConfigError, InvalidInput
from inferd.repository.storage import PROVENANCE_FILE, check_relative

FORMAT = 1
_CHUNK_BYTES = 1 << 20


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def _regular_files(folder: Path) -> list[tuple[str, Path]]:
    """Every regular file under ``folder`` (hidden ones too; links not followed), but the
    record itself, by relative path."""
    found: list[tuple[str, Path]] = []
    for top, dirs, names in os.walk(folder):
        dirs.sort()
        for name in sorted(names):
            path = Path(top) / name
            rel = path.relative_to(folder).as_posix()
            if rel != PROVENANCE_FILE and path.is_file() and not path.is_symlink():
                found.append((rel, path))
    return found


def record(folder: Path, source: str) -> int:
    """Record every file now in ``folder`` as received from the network by ``source`` (``an
    upload``, ``a load call``), replacing any record the folder holds; returns the files."""
    files: dict[str, dict[str, Any]] = {}
    for rel, path in _regular_files(folder):
        st = path.stat()
        files[rel] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha256(path)}
    doc = {"format": FORMAT, "source": source, "recorded_unix_s": int(time.time()), "files": files}
    target = folder / PROVENANCE_FILE
    aside = folder / f".{PROVENANCE_FILE}.{uuid.uuid4().hex[:8]}"
    aside.write_text(json.dumps(doc, indent=1, sort_keys=True))
    os.replace(aside, target)
    return len(files)


def added(existing: bytes | None, files: Mapping[str, bytes], source: str) -> bytes:
    """A record (``existing``, None: none yet) with ``files`` ({path in the model folder:
    contents}) added, for files the server writes one by one into a store (a TorchServe
    archive downloaded from a URL): their time is unknown, so their contents decide."""
    entries = _parse(existing) if existing is not None else {}
    for rel, data in files.items():
        digest = hashlib.sha256(data).hexdigest()
        entries[rel] = {"size": len(data), "mtime_ns": -1, "sha256": digest}
    doc = {"format": FORMAT, "source": source, "recorded_unix_s": int(time.time())}
    return json.dumps({**doc, "files": entries}, indent=1, sort_keys=True).encode()


def _entries(folder: Path) -> dict[str, dict[str, Any]]:
    path = folder / PROVENANCE_FILE
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise ConfigError(f"cannot read {PROVENANCE_FILE}: {exc}") from None
    return _parse(data)


def _parse(data: bytes) -> dict[str, dict[str, Any]]:
    try:
        doc = json.loads(data)
        files = doc["files"]
        if not isinstance(files, dict):
            raise TypeError("'files' is not an object")
        return files
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"{PROVENANCE_FILE} (the record of the model's files that arrived through the "
            f"network) cannot be read ({exc}): the files are not loaded; delete it to make them "
            "the operator's"
        ) from None


def network_files(folder: Path) -> frozenset[str]:
    """The files of ``folder`` (relative paths) that are as they arrived from the network:
    listed in the record with the same size, and the same modification time or contents."""
    found: set[str] = set()
    for rel, entry in _entries(folder).items():
        try:
            rel = check_relative(rel, PROVENANCE_FILE)
            size, mtime_ns, digest = int(entry["size"]), int(entry["mtime_ns"]), entry["sha256"]
        except (InvalidInput, KeyError, TypeError, ValueError):
            raise ConfigError(
                f"{PROVENANCE_FILE} has an entry that is not a file record ('{rel[:80]}'): the "
                "files are not loaded; delete it to make them the operator's"
            ) from None
        path = folder / rel
        try:
            st = path.stat()
            if not path.is_file() or st.st_size != size:
                continue  # gone, or changed on disk: the operator's now
            if st.st_mtime_ns == mtime_ns or sha256(path) == digest:
                found.add(rel)
        except OSError:
            continue
    return frozenset(found)
