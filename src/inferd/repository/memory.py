"""What a model holds in memory: the serving process tree's resident set, read from /proc.

Lazy serving measures each model as the growth of the resident set (this process and its
children: a model's worker processes count) across its load. For that growth to mean what it
says, memory a model frees must go back to the system: glibc's malloc otherwise raises its
mmap threshold as large blocks are freed (up to 32 MiB) and keeps later large blocks on its
heap, where freeing them returns nothing and the next load reuses them unseen. ``return_freed``
fixes the threshold, so large blocks (weights) are mapped and unmapped with their tensors.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import os
import time
from typing import Any

log = logging.getLogger("inferd.repository")

MMAP_THRESHOLD_BYTES = 256 << 10  # blocks this large or larger are mapped on their own
TRIM_THRESHOLD_BYTES = 1 << 20  # free heap top beyond this goes back to the system
_M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
_M_MMAP_THRESHOLD = -3
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def return_freed() -> bool:
    """Fix glibc's mmap and trim thresholds (nothing elsewhere); True when set."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False  # not glibc (musl has no mallopt)
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    done = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
    done = bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)) and done
    if done:
        log.debug(
            "malloc: mmap threshold %d, trim threshold %d",
            MMAP_THRESHOLD_BYTES,
            TRIM_THRESHOLD_BYTES,
        )
    return done


def _libc_trim() -> Any:
    name = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(name or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None  # not glibc
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


_malloc_trim = _libc_trim()


def trim_heap() -> None:
    """Hand glibc's free heap memory back to the system, every arena's (a thread's arena keeps
    what a burst of requests freed: the trim threshold only looks at the main heap's top)."""
    if _malloc_trim is not None:
        _malloc_trim(0)


class AfterBursts:
    """Collects garbage and trims the heap (``trim_heap``) once a burst of work is over: when
    this process's resident set grew ``grown_bytes`` or more since the last time, then it used
    less than ``idle_share`` of a core for ``idle_s``. Call it as often as convenient (it
    looks at most once per ``idle_s``). Idle means idle: a full collection holds the event
    loop for tens of milliseconds, which a process answering a storm (refusals cost it little
    CPU) must not pay while the storm lasts."""

    def __init__(
        self, grown_bytes: int = 16 << 20, idle_s: float = 5.0, idle_share: float = 0.01
    ) -> None:
        self.grown_bytes, self.idle_s, self.idle_share = grown_bytes, idle_s, idle_share
        self._cpu = time.process_time()
        self._at = time.monotonic()
        self._rss = _rss("self")  # after the last trim

    def __call__(self) -> bool:
        """Whether it trimmed now."""
        now = time.monotonic()
        if now - self._at < self.idle_s:
            return False
        cpu = time.process_time()
        idle = cpu - self._cpu < self.idle_share * (now - self._at)
        self._cpu, self._at = cpu, now
        if not idle or _rss("self") - self._rss < self.grown_bytes:
            return False
        gc.collect()  # the cycles a burst left (a refused request's traceback and frames)
        trim_heap()
        self._rss = _rss("self")
        log.debug("a burst of work is over: free memory handed back")
        return True


def _read(path: str) -> bytes:
    """A small /proc file ("" when it is gone); os calls, not pathlib: a process tree with
    hundreds of threads reads hundreds of these per measurement."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return b""
    try:
        return os.read(fd, 65536)
    except OSError:
        return b""
    finally:
        os.close(fd)


def _rss(pid: int | str) -> int:
    """One process's resident bytes (0 when it is gone)."""
    fields = _read(f"/proc/{pid}/statm").split()
    return int(fields[1]) * _PAGE if len(fields) > 1 else 0


def _children(pid: int | str) -> list[bytes]:
    """The child processes of every thread of ``pid``."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    found: list[bytes] = []
    for task in tasks:
        found.extend(_read(f"/proc/{pid}/task/{task}/children").split())
    return found


def tree_rss_bytes(pid: int | None = None) -> int:
    """Resident bytes of a process and all its descendants (0 where /proc is absent)."""
    total = 0
    pending: list[int | str] = [os.getpid() if pid is None else pid]
    seen: set[str] = set()
    while pending:
        current = str(pending.pop())
        if current in seen:
            continue
        seen.add(current)
        total += _rss(current)
        pending.extend(child.decode() for child in _children(current))
    return total


class LoadCosts:
    """What lazy serving's budget counts beside each model's measured growth.

    The runtime each backend brought into memory: a library stays while the process lives,
    and with small models it is a large share of what the models cost. And the least a model
    is counted: its files plus what a loaded model takes beyond its files, everything counted
    (its runtime session, arenas, threads, the buffers of its requests), observed after each
    load as the tree's growth since before the first runtime came in, less the runtimes and
    the loaded models' files, per loaded model (the median of the last observations). The
    growth across one load cannot tell it: with requests running beside it, the memory they
    and the model evicted just before free is taken up again by the load.
    """

    SAMPLES = 32

    def __init__(self) -> None:
        self.runtimes: dict[str, int] = {}  # backend: bytes its runtime took coming in
        self.baseline: int | None = None  # the tree's bytes before the first runtime came in
        self._beyond: list[int] = []  # bytes per loaded model beyond its files, observed

    def runtime_bytes(self) -> int:
        return sum(self.runtimes.values())

    def runtime_in(self, backend: str, grown: int, budget_bytes: int) -> None:
        """A backend's runtime came into memory, taking ``grown`` bytes: the budget counts it."""
        self.runtimes[backend] = max(0, grown)
        held = self.runtime_bytes()
        log.info("backend '%s' in memory: %.1f MiB, counted in the budget", backend, grown / 2**20)
        if budget_bytes and held >= budget_bytes:
            log.warning(
                "the backends' runtimes take %d MiB of the memory budget of %d MiB: models "
                "load one at a time, over it",
                held >> 20,
                budget_bytes >> 20,
            )

    def beyond_files(self) -> int:
        """What a loaded model takes beyond its files (the median of the observations)."""
        beyond = sorted(self._beyond)
        return max(0, beyond[len(beyond) // 2]) if beyond else 0

    def least(self, files: int) -> int:
        return files + self.beyond_files()

    def observe(self, tree_bytes: int, files: list[int], declared: int = 0) -> None:
        """After a load: the tree holds ``tree_bytes``, the loaded models have these files
        (and ``declared`` bytes of those that state their memory, not counted in ``files``)."""
        if self.baseline is None or not files:
            return
        grown = tree_bytes - self.baseline - self.runtime_bytes() - declared - sum(files)
        self._beyond = [*self._beyond[-(self.SAMPLES - 1) :], grown // len(files)]
