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
import logging
import os

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
