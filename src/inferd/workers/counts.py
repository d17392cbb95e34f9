"""Trace counts that are the server's, not one worker's: ``trace_count`` traces in all, whichever
workers run the requests, and the count left that every worker reports the same.

Each scope (the global settings, or one model's) has a small file in the run folder, mapped in
every worker: an 8-byte count. The worker that receives a settings change sets it; a worker that
traces a request takes one under a lock on the file (held for a read and a write of memory, so
the event loop waits microseconds at most, and only while a count is limited). A worker that
dies holding the lock releases it with its file descriptors.
"""

from __future__ import annotations

import fcntl
import hashlib
import mmap
import os
import struct
import threading
from pathlib import Path

_COUNT = struct.Struct("=q")
FOLDER = "trace-counts"  # in the run folder


class _Slot:
    def __init__(self, path: Path) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_size < _COUNT.size:
                os.ftruncate(fd, _COUNT.size)  # a new slot holds 0: nothing to trace
            self.memory = mmap.mmap(fd, _COUNT.size)
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd

    def read(self) -> int:
        return int(_COUNT.unpack_from(self.memory)[0])

    def write(self, value: int) -> None:
        _COUNT.pack_into(self.memory, 0, value)

    def close(self) -> None:
        self.memory.close()
        os.close(self.fd)


class SharedCounts:
    """The limited trace counts of one server's workers, by scope ("": global; else a model)."""

    def __init__(self, run_dir: Path) -> None:
        self.folder = run_dir / FOLDER
        self.folder.mkdir(exist_ok=True)
        self._slots: dict[str, _Slot] = {}
        self._lock = threading.Lock()  # a file lock does not exclude this process's threads

    def _slot(self, scope: str) -> _Slot:
        slot = self._slots.get(scope)
        if slot is None:
            name = hashlib.sha256(scope.encode()).hexdigest()[:32]
            slot = self._slots[scope] = _Slot(self.folder / name)
        return slot

    def set(self, scope: str, count: int) -> None:
        """The count of ``scope`` from now on (a settings change received by this worker)."""
        with self._lock:
            slot = self._slot(scope)
            fcntl.lockf(slot.fd, fcntl.LOCK_EX)
            try:
                slot.write(count)
            finally:
                fcntl.lockf(slot.fd, fcntl.LOCK_UN)

    def take(self, scope: str) -> bool:
        """One trace of ``scope``'s count, if one is left."""
        with self._lock:
            slot = self._slot(scope)
            fcntl.lockf(slot.fd, fcntl.LOCK_EX)
            try:
                left = slot.read()
                if left > 0:
                    slot.write(left - 1)
                return left > 0
            finally:
                fcntl.lockf(slot.fd, fcntl.LOCK_UN)

    def left(self, scope: str) -> int:
        with self._lock:
            return self._slot(scope).read()

    def close(self) -> None:
        with self._lock:
            for slot in self._slots.values():
                slot.close()
            self._slots.clear()
