"""Shared memory between the server and a worker process: arenas one side writes, the other
side reads in place.

Each end of a worker connection owns an ``Arenas``: memfd-backed regions it copies tensors
into, the one copy a tensor makes on its way across. The other end maps them (``Mapped``) and
reads each tensor in place, through a numpy array whose base is a ``Block``; when the last
array over a block is gone (the response was sent, the model dropped its input), the block's
release is queued and travels back with the next message, and the owner reuses the space.
Pages stay mapped between requests, so a repeated 16 MB tensor costs one copy and no page
faults; an end idle for ``TRIM_IDLE_S`` gives the pages of its free space back. An arena that
fills up is replaced by one twice its size (the old one is unmapped once its blocks come back);
a tensor larger than ``ARENA_MAX_BYTES / 2`` gets a region of its own.

memfds (not ``/dev/shm`` names) need no cleanup when a process dies and are not bounded by the
size of ``/dev/shm`` (64 MB in a default Docker container); their descriptors travel over the
worker's Unix socket.
"""

from __future__ import annotations

import bisect
import contextlib
import ctypes
import mmap
import os
import threading
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

import numpy as np

ALIGN = 64
ARENA_MIN_BYTES = 4 << 20
ARENA_MAX_BYTES = 1 << 30
# A block this large gives its pages back when it comes back (a burst of large bodies leaves
# no memory behind); smaller ones keep theirs mapped for the next tensor.
GIVE_BACK_BYTES = 32 << 20
# An end that wrote nothing for this long gives back the pages of its free space (``trim``):
# a storm of requests leaves no arena memory behind once it is over.
TRIM_IDLE_S = 5.0
_PAGE = mmap.PAGESIZE
_GIL_FREE_COPY_BYTES = 1 << 20  # copies this large go through numpy (``_copy_in``)

# Where a tensor lies in the peer's arenas: (arena id, offset, bytes).
Ref = tuple[int, int, int]


def _aligned(nbytes: int) -> int:
    return max(ALIGN, (nbytes + ALIGN - 1) & ~(ALIGN - 1))


class _Arena:
    """One memfd region and its free list (offset, size), sorted by offset."""

    __slots__ = ("fd", "free", "id", "live", "map", "retired", "size")

    def __init__(self, arena_id: int, size: int) -> None:
        fd = os.memfd_create(f"inferd-arena-{arena_id}", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, size)
            self.map = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd  # closed once the peer has it
        self.id = arena_id
        self.size = size
        self.free: list[tuple[int, int]] = [(0, size)]
        self.live = 0  # blocks handed out and not yet released
        self.retired = False

    def alloc(self, nbytes: int) -> int | None:
        need = _aligned(nbytes)
        for i, (offset, size) in enumerate(self.free):
            if size >= need:
                if size == need:
                    del self.free[i]
                else:
                    self.free[i] = (offset + need, size - need)
                self.live += 1
                return offset
        return None

    def release(self, offset: int, nbytes: int) -> None:
        size = _aligned(nbytes)
        free = self.free
        i = bisect.bisect_left(free, (offset, 0))
        if i < len(free) and offset + size == free[i][0]:  # merge with the next
            size += free[i][1]
            del free[i]
        if i > 0 and free[i - 1][0] + free[i - 1][1] == offset:  # and with the previous
            offset, size = free[i - 1][0], free[i - 1][1] + size
            del free[i - 1]
            i -= 1
        free.insert(i, (offset, size))
        self.live -= 1

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self.map.close()


def _copy_in(target: mmap.mmap, offset: int, data: bytes | bytearray | memoryview) -> None:
    """Copy ``data`` into ``target`` at ``offset``; a large copy lets go of the GIL (numpy's
    copy does, a slice assignment into the map does not: a 120 MB body held every thread of
    the process, the event loop's too, for the copy)."""
    nbytes = len(data)
    if nbytes < _GIL_FREE_COPY_BYTES:
        target[offset : offset + nbytes] = data
        return
    view = memoryview(data).cast("B")
    np.copyto(np.frombuffer(target, np.uint8, nbytes, offset), np.frombuffer(view, np.uint8))


class Arenas:
    """The regions one end writes; thread-safe (releases come in with messages)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._arenas: dict[int, _Arena] = {}
        self._current: _Arena | None = None
        self._next_id = 0
        self._new: list[_Arena] = []  # created, not yet announced to the peer
        self._retired: list[int] = []  # retired, not yet announced
        self._written = time.monotonic()  # when a block was last handed out
        self._trimmed = True  # nothing written since the last ``trim``

    def put(self, array: np.ndarray) -> Ref:
        """Copy a numeric array into an arena (its one copy) and say where it lies."""
        nbytes = array.nbytes
        arena, offset = self._alloc(nbytes)
        target: np.ndarray = np.ndarray(array.shape, array.dtype, arena.map, offset)
        np.copyto(target, array, casting="no")
        return (arena.id, offset, nbytes)

    def put_bytes(self, data: bytes | bytearray | memoryview) -> Ref:
        nbytes = len(data)
        arena, offset = self._alloc(nbytes)
        _copy_in(arena.map, offset, data)
        return (arena.id, offset, nbytes)

    def put_parts(self, parts: list[bytes | bytearray], nbytes: int) -> Ref:
        """Copy ``parts`` (``nbytes`` in all) one after the other into one block."""
        arena, offset = self._alloc(nbytes)
        at = offset
        for part in parts:
            _copy_in(arena.map, at, part)
            at += len(part)
        return (arena.id, offset, nbytes)

    def _alloc(self, nbytes: int) -> tuple[_Arena, int]:
        with self._lock:
            self._written = time.monotonic()
            self._trimmed = False
            current = self._current
            if current is not None:
                offset = current.alloc(nbytes)
                if offset is not None:
                    return current, offset
            if _aligned(nbytes) > ARENA_MAX_BYTES // 2:  # a region of its own
                arena = self._create(_aligned(nbytes))
                arena.retired = True  # unmapped when its one block comes back
            else:
                size = ARENA_MIN_BYTES if current is None else current.size * 2
                while size < 2 * _aligned(nbytes):
                    size *= 2
                arena = self._create(min(size, ARENA_MAX_BYTES))
                if current is not None:
                    self._retire(current)
                self._current = arena
            offset = arena.alloc(nbytes)
            assert offset is not None
            return arena, offset

    def _create(self, size: int) -> _Arena:
        arena = _Arena(self._next_id, size)
        self._next_id += 1
        self._arenas[arena.id] = arena
        self._new.append(arena)
        return arena

    def _retire(self, arena: _Arena) -> None:
        arena.retired = True
        if arena.live == 0:
            self._drop(arena)

    def _drop(self, arena: _Arena) -> None:
        """Unmap a retired arena none of whose blocks the peer holds any more, and tell the peer
        (only then: a message the peer has not decoded yet may still point into it)."""
        del self._arenas[arena.id]
        arena.close()
        self._retired.append(arena.id)

    def announcements(self) -> tuple[list[tuple[int, int]], list[int], list[int]]:
        """New arenas (id, size) with their descriptors, and the ids of arenas unmapped here,
        to send with the next message; call ``sent`` once that message is out."""
        with self._lock:
            if not self._new and not self._retired:
                return [], [], []
            new, self._new = self._new, []
            retired, self._retired = self._retired, []
            return [(a.id, a.size) for a in new], [a.fd for a in new], retired

    def sent(self, fds: list[int]) -> None:
        """The peer has these descriptors now (the regions stay mapped here)."""
        with self._lock:
            for arena in self._arenas.values():
                if arena.fd in fds:
                    os.close(arena.fd)
                    arena.fd = -1

    def release(self, refs: list[Ref]) -> None:
        """The peer is done with these blocks."""
        if not refs:
            return
        with self._lock:
            for arena_id, offset, nbytes in refs:
                arena = self._arenas.get(arena_id)
                if arena is None:
                    continue
                arena.release(offset, nbytes)
                if arena.retired and arena.live == 0:
                    self._drop(arena)
                elif nbytes >= GIVE_BACK_BYTES:
                    _give_back(arena, offset, nbytes)

    def trim(self, idle_s: float = TRIM_IDLE_S) -> bool:
        """Give back the pages of every arena's free space once nothing was written for
        ``idle_s`` (once per idle spell; call it now and then); True when it did."""
        with self._lock:
            if self._trimmed or time.monotonic() - self._written < idle_s:
                return False
            self._trimmed = True
            for arena in self._arenas.values():
                for offset, size in arena.free:
                    _give_back(arena, offset, size)
            return True

    def in_use(self) -> int:
        """Blocks handed out and not yet released (for tests and leak checks)."""
        with self._lock:
            return sum(a.live for a in self._arenas.values())

    def close(self) -> None:
        with self._lock:
            for arena in self._arenas.values():
                with contextlib.suppress(BufferError):  # a view is alive: unmapped when it goes
                    arena.close()
            self._arenas.clear()
            self._current = None


def _give_back(arena: _Arena, offset: int, nbytes: int) -> None:
    """Free the memory of a block's whole pages (the peer's mapping too); they read as zeros
    when the space is used again."""
    start = -(-offset // _PAGE) * _PAGE
    end = (offset + nbytes) // _PAGE * _PAGE
    if end > start:
        with contextlib.suppress(OSError, ValueError):
            arena.map.madvise(mmap.MADV_REMOVE, start, end - start)


class _PeerArena:
    """The peer's arena as mapped here; blocks keep it mapped while they live."""

    __slots__ = ("__weakref__", "address", "map", "pin")

    def __init__(self, fd: int, size: int) -> None:
        self.map = mmap.mmap(fd, size)
        self.pin = ctypes.c_char.from_buffer(self.map)  # its address, held for the mapping
        self.address = ctypes.addressof(self.pin)


class Block:
    """The base object of every array read from a peer's arena: while it lives the memory
    stays mapped and the peer does not reuse it; when it goes, its release is queued."""

    __slots__ = ("__array_interface__", "_peer", "_queue", "_ref")

    def __init__(
        self, peer: _PeerArena, ref: Ref, shape: tuple[int, ...], typestr: str, queue: deque[Ref]
    ) -> None:
        self.__array_interface__: dict[str, Any] = {
            "version": 3,
            "shape": shape,
            "typestr": typestr,
            "data": (peer.address + ref[1], False),
        }
        self._peer = peer
        self._ref = ref
        self._queue = queue

    def __del__(self) -> None:
        self._queue.append(self._ref)


class Mapped:
    """The peer's arenas as mapped by this end."""

    def __init__(self) -> None:
        self._arenas: dict[int, _PeerArena] = {}
        self.released: deque[Ref] = deque()  # appended from any thread, by Block.__del__
        self.outstanding = 0  # blocks read and not yet handed back by ``releases``

    def add(self, arenas: list[tuple[int, int]], fds: list[int]) -> None:
        for (arena_id, size), fd in zip(arenas, fds, strict=True):
            try:
                self._arenas[arena_id] = _PeerArena(fd, size)
            finally:
                os.close(fd)

    def retire(self, arena_ids: list[int]) -> None:
        for arena_id in arena_ids:  # unmapped when its last block goes
            self._arenas.pop(arena_id, None)

    def array(self, ref: Ref, dtype: np.dtype[Any], shape: tuple[int, ...]) -> np.ndarray:
        """The tensor at ``ref``, in place (no copy)."""
        block = Block(self._arenas[ref[0]], ref, shape, dtype.str, self.released)
        self.outstanding += 1
        array = np.asarray(block)
        return array if array.dtype == dtype else array.view(dtype)

    @contextlib.contextmanager
    def view(self, ref: Ref) -> Iterator[memoryview]:
        """The bytes at ``ref``, in place, for the ``with`` block; then the block is
        released."""
        arena = self._arenas[ref[0]]
        whole = memoryview(arena.map)
        try:
            with whole[ref[1] : ref[1] + ref[2]] as view:
                yield view
        finally:
            whole.release()
            self.outstanding += 1
            self.released.append(ref)

    def drop_pages(self, ref: Ref, start: int, end: int) -> None:
        """Let go of this process's mapping of the whole pages within bytes [start, end) of the
        block at ``ref``, read already: the memory stays the owner's (and the block's contents
        with it), only no longer counted in this process's RSS."""
        arena = self._arenas.get(ref[0])
        if arena is None:
            return
        first = -(-(ref[1] + start) // _PAGE) * _PAGE
        last = (ref[1] + end) // _PAGE * _PAGE
        if last > first:
            with contextlib.suppress(OSError, ValueError):
                arena.map.madvise(mmap.MADV_DONTNEED, first, last - first)

    def read(self, ref: Ref) -> bytes:
        """A copy of the bytes at ``ref``; the block is released at once."""
        arena = self._arenas[ref[0]]
        data = arena.map[ref[1] : ref[1] + ref[2]]
        self.outstanding += 1
        self.released.append(ref)
        return data

    def releases(self) -> list[Ref]:
        """The blocks released since the last call (to send to the owner)."""
        out: list[Ref] = []
        queue = self.released
        while queue:
            try:
                out.append(queue.popleft())
            except IndexError:  # another thread took the last one
                break
        self.outstanding -= len(out)
        return out

    def close(self) -> None:
        self._arenas.clear()
