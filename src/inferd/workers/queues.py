"""The model host's full queues, as every frontend sees them before it reads a request's body.

The host runs every model's dynamic batcher, so only it knows when a queue is full; a frontend
that read, decoded and forwarded a body only to have the host refuse it spent the memory and
CPU that the admitted requests needed. So the host keeps one byte per queue-limited model
version in a small shared file of the run folder, set while that version's queue (at its
default priority) is full, and the version's record tells the frontends which byte is its. A
frontend reads the byte before it reads a body (``DataPlane.admit``) and refuses at once with
the host's own answer (503, as Triton answers a full queue).

The byte follows the queue: the batcher calls back when its queue turns full and when it stops
being full (``DynamicBatcher.on_queue``). A request a frontend admits just before the queue
fills is refused by the host as before; the byte only spares the bodies that cannot be queued.
"""

from __future__ import annotations

import functools
import mmap
import os
import weakref
from pathlib import Path
from typing import Any

from inferd.plane.model import ModelVersion

QUEUES_FILE = "queues"
SLOTS = 1 << 16  # queue-limited versions loaded at once, at most (more go unflagged)


def _mapped(path: Path) -> mmap.mmap:
    """The file at ``path``, at least ``SLOTS`` bytes long (never shortened: a frontend may
    have it mapped), mapped shared."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        if os.fstat(fd).st_size < SLOTS:
            os.ftruncate(fd, SLOTS)
        return mmap.mmap(fd, SLOTS)
    finally:
        os.close(fd)


class QueueBoard:
    """The host's side: a byte per queue-limited version, kept by its batcher."""

    def __init__(self, run_dir: Path) -> None:
        self._map = _mapped(run_dir / QUEUES_FILE)
        self._map[:] = bytes(SLOTS)  # a host that replaces another starts with empty queues
        self._slots: weakref.WeakKeyDictionary[ModelVersion, int] = weakref.WeakKeyDictionary()
        self._free: list[int] = []
        self._next = 0

    def slot(self, version: ModelVersion) -> int | None:
        """The byte of ``version``'s queue (assigned on first call, freed with the version);
        None when its queue has no limit."""
        found = self._slots.get(version)
        if found is not None:
            return found
        scheduler: Any = version.scheduler
        if not getattr(scheduler, "queue_limited", False):
            return None
        if self._free:
            found = self._free.pop()
        elif self._next < SLOTS:
            found = self._next
            self._next += 1
        else:
            return None
        self._slots[version] = found
        weakref.finalize(version, self._release, found)
        self._map[found] = 1 if scheduler.queue_full() is not None else 0
        scheduler.on_queue = functools.partial(self._set, found)
        return found

    def _set(self, slot: int, full: bool) -> None:
        self._map[slot] = 1 if full else 0

    def _release(self, slot: int) -> None:
        self._map[slot] = 0
        self._free.append(slot)


class QueueView:
    """A frontend's side: reads the host's bytes (the file is mapped on first use: the host
    creates it before any frontend gets a record that names a byte)."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / QUEUES_FILE
        self._map: mmap.mmap | None = None

    def full(self, slot: int) -> bool:
        mapped = self._map
        if mapped is None:
            try:
                mapped = self._map = _mapped(self.path)
            except OSError:
                return False  # no host yet: it answers for itself
        return mapped[slot] != 0
