"""System shared-memory regions that clients register (Triton's shared-memory extension): named
windows of POSIX shared-memory objects that inputs are read from and outputs written to in place.

A region is mapped once when registered. Every use checks the window against the region and the
object itself: if the client removed the object (``shm_unlink``) or shrank it, the request gets
a clear error instead of stale data or a SIGBUS.
"""

from __future__ import annotations

import mmap
import os
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from inferd.core.errors import InvalidInput, NotFound, Unavailable

SHM_DIR = "/dev/shm"  # where Linux keeps POSIX shared-memory objects


@dataclass(frozen=True, slots=True)
class RegionStatus:
    name: str
    key: str
    offset: int
    byte_size: int


class _Region:
    def __init__(self, status: RegionStatus) -> None:
        self.status = status
        self.path = _path_of(status.key)
        try:
            self.fd = os.open(self.path, os.O_RDWR)
        except OSError as exc:
            raise InvalidInput(
                f"shared memory region '{status.name}': cannot open key '{status.key}': "
                f"{exc.strerror}"
            ) from None
        try:
            stat = os.fstat(self.fd)
            self.inode = stat.st_ino
            if status.offset + status.byte_size > stat.st_size:
                raise InvalidInput(
                    f"shared memory region '{status.name}': offset {status.offset} + byte_size "
                    f"{status.byte_size} exceeds the {stat.st_size} bytes of key '{status.key}'"
                )
            start = status.offset - status.offset % mmap.ALLOCATIONGRANULARITY
            self.base = status.offset - start  # where the region starts in the mapping
            self.map = mmap.mmap(self.fd, self.base + status.byte_size, offset=start)
        except BaseException:
            os.close(self.fd)
            raise
        self.view = memoryview(self.map)[self.base :]

    def check(self) -> None:
        """The shared-memory object is still the registered one, and still large enough."""
        status = self.status
        try:
            same = os.stat(self.path).st_ino == self.inode
        except OSError:
            same = False
        if not same:
            raise Unavailable(
                f"shared memory region '{status.name}': key '{status.key}' no longer exists; "
                "unregister the region"
            )
        if os.fstat(self.fd).st_size < status.offset + status.byte_size:
            raise Unavailable(
                f"shared memory region '{status.name}': key '{status.key}' shrank below the "
                "registered window; unregister the region"
            )

    def close(self) -> None:
        try:
            self.view.release()
            self.map.close()
        except BufferError:  # arrays of requests in flight still view it: freed with them
            pass
        os.close(self.fd)


def _path_of(key: str) -> str:
    name = key[1:] if key.startswith("/") else key
    if not name or "/" in name or name in (".", ".."):
        raise InvalidInput(f"shared memory key '{key}' is not a POSIX shared memory name ('/name')")
    return os.path.join(SHM_DIR, name)


class SystemSharedMemory:
    """The registered regions by name; safe to use from the event loop and worker threads."""

    def __init__(self) -> None:
        self._regions: dict[str, _Region] = {}
        self._lock = threading.Lock()
        # With --http-workers: makes a register or unregister on every other worker too.
        self.share: Callable[[dict[str, Any]], Awaitable[None]] | None = None

    async def register_everywhere(self, name: str, key: str, offset: int, byte_size: int) -> None:
        """Register here, then on this server's other workers (a client's next request may
        reach any of them)."""
        self.register(name, key, offset, byte_size)
        if self.share is not None:
            change = {"name": name, "key": key, "offset": offset, "byte_size": byte_size}
            await self.share({"op": "shm_register", **change})

    async def unregister_everywhere(self, name: str = "") -> None:
        self.unregister(name)
        if self.share is not None:
            await self.share({"op": "shm_unregister", "name": name})

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        if not name:
            raise InvalidInput("a shared memory region needs a name")
        for what, value in (("offset", offset), ("byte_size", byte_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidInput(f"shared memory region '{name}': '{what}' must be >= 0")
        with self._lock:
            if name in self._regions:
                raise InvalidInput(
                    f"shared memory region '{name}' is already registered; unregister it first"
                )
            self._regions[name] = _Region(RegionStatus(name, key, offset, byte_size))

    def unregister(self, name: str = "") -> None:
        """Forget one region ("": every region); an unknown name is no error, as in Triton."""
        with self._lock:
            names = [name] if name else list(self._regions)
            regions = [self._regions.pop(n) for n in names if n in self._regions]
        for region in regions:
            region.close()

    def status(self, name: str = "") -> list[RegionStatus]:
        with self._lock:
            if not name:
                return [r.status for r in self._regions.values()]
            if name not in self._regions:
                raise NotFound(f"Unable to find system shared memory region: '{name}'")
            return [self._regions[name].status]

    def window(self, name: str, offset: int, byte_size: int, tensor: str) -> memoryview:
        """``byte_size`` bytes at ``offset`` in region ``name``, in place (for ``tensor``)."""
        with self._lock:
            region = self._regions.get(name)
        if region is None:
            raise InvalidInput(
                f"tensor '{tensor}': shared memory region '{name}' is not registered"
            )
        size = region.status.byte_size
        if offset < 0 or byte_size < 0 or offset + byte_size > size:
            raise InvalidInput(
                f"tensor '{tensor}': offset {offset} + byte_size {byte_size} is outside shared "
                f"memory region '{name}' of {size} bytes"
            )
        region.check()
        return region.view[offset : offset + byte_size]

    def close(self) -> None:
        self.unregister()
