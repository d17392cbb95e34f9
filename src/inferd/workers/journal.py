"""The run folder's journal: the repository changes made since the server started, for a worker
that starts later (a replacement) to replay before it serves.

The journal is kept short, or it would grow with every shared-memory registration a client
makes and every settings change, and a replacement would replay all of them:

- a shared-memory region unregistered (or every region, with an empty name) leaves no entry;
- log settings, and global trace settings, are folded into one entry each (their keys apply
  one by one, so the last value of each key is what counts);
- a model's trace settings fold into that model's previous entry when no model changed since;
- a load, unload or upload of a model replaces that model's previous change when nothing but
  shared-memory and settings entries came between them (an ensemble loaded in between may
  have needed the earlier form, so it is kept then).

Writers hold an exclusive lock on a lock file beside the journal and replace the journal whole
(write, then rename), so a reader never sees half of it.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Any

import orjson

Entry = dict[str, Any]

_MODEL_OPS = frozenset({"load", "unload", "sync"})
_INDEPENDENT = frozenset({"shm_register", "shm_unregister", "log_settings", "trace_settings"})


class Journal:
    """The repository changes to replay, in order; appends compact it (module doc)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock_path = path.with_name(path.name + ".lock")

    def append(self, entry: Entry) -> None:
        with open(self._lock_path, "ab") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            entries = compact([*self._read(), entry])
            temporary = self.path.with_name(self.path.name + ".tmp")
            temporary.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in entries))
            os.replace(temporary, self.path)

    def entries(self) -> list[Entry]:
        with open(self._lock_path, "ab") as lock:
            fcntl.flock(lock, fcntl.LOCK_SH)
            return self._read()

    def _read(self) -> list[Entry]:
        try:
            lines = self.path.read_bytes().splitlines()
        except FileNotFoundError:
            return []
        return [orjson.loads(line) for line in lines if line.strip()]


def compact(entries: list[Entry]) -> list[Entry]:
    """The same changes in fewer entries: replaying either list leaves a fresh worker in the same
    state (the rules are in the module doc)."""
    out: list[Entry] = []
    for entry in entries:
        op = entry["op"]
        if op == "shm_unregister":
            name = entry["name"]
            out = [e for e in out if not _is_region(e, name)]
        elif op == "shm_register":
            out = [e for e in out if not _is_region(e, entry["name"])]
            out.append(entry)
        elif op == "log_settings" or (op == "trace_settings" and not entry.get("model")):
            out.append(_fold(out, entry, 0))
        elif op == "trace_settings":
            out.append(_fold(out, entry, _last_model_change(out) + 1))
        elif op in _MODEL_OPS:
            start = _last_dependent(out, entry["name"]) + 1
            out = out[:start] + [
                e for e in out[start:] if not (e["op"] in _MODEL_OPS and e["name"] == entry["name"])
            ]
            out.append(entry)
        else:
            out.append(entry)
    return out


def _is_region(entry: Entry, name: str) -> bool:
    return entry["op"] == "shm_register" and (not name or entry["name"] == name)


def _fold(out: list[Entry], entry: Entry, start: int) -> Entry:
    """``entry`` with the changes of the same settings found in ``out[start:]`` beneath its own,
    those removed from ``out``."""
    same = [
        i
        for i in range(start, len(out))
        if out[i]["op"] == entry["op"] and out[i].get("model", "") == entry.get("model", "")
    ]
    changes: dict[str, Any] = {}
    for i in same:
        changes.update(out[i]["changes"])
    changes.update(entry["changes"])
    for i in reversed(same):
        del out[i]
    return {**entry, "changes": changes}


def _last_model_change(out: list[Entry]) -> int:
    """Where the last load, unload or upload is (-1: none)."""
    for i in range(len(out) - 1, -1, -1):
        if out[i]["op"] in _MODEL_OPS:
            return i
    return -1


def _last_dependent(out: list[Entry], name: str) -> int:
    """Where the last entry is that a change of model ``name`` must not be moved across (-1:
    none): any entry but shared memory, settings that are not a model's, and changes of that
    same model."""
    for i in range(len(out) - 1, -1, -1):
        e = out[i]
        if e["op"] in _MODEL_OPS and e["name"] == name:
            continue
        if e["op"] not in _INDEPENDENT or (e["op"] == "trace_settings" and e.get("model")):
            return i
    return -1
