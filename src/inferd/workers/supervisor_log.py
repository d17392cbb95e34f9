"""The supervisor's engine log lines (workers started, exited, restarted; signals), kept in the
run folder so that every worker's ``/v2/logs`` answers them with its own and its peers' lines.

The supervisor appends each line with its position (``log_clock_us``, as every process's kept
lines have) under an exclusive lock on the file; a reader takes a shared lock, so a line at or
below a reader's cursor is in the file when it reads. The file keeps at most ``2 * TAIL_LINES``
lines: past that, the supervisor rewrites it in place with the last ``TAIL_LINES``.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

import orjson

from inferd.observability.logging import TAIL_LINES, Entry, log_clock_us

SUPERVISOR_LOG = "supervisor-log.jsonl"  # in the run folder


class RunFolderLog(logging.Handler):
    """The supervisor's engine lines, appended to the run folder's file (module doc)."""

    def __init__(self, path: Path, kept: Iterable[Entry] = ()) -> None:
        """``kept``: the lines the supervisor logged before (its in-memory tail)."""
        super().__init__()
        self.path = path
        self.pid = os.getpid()  # a forked worker inherits this handler until it sets its own
        self._lock = threading.Lock()
        self._entries: list[Entry] = list(kept)[-TAIL_LINES:]
        self._last = self._entries[-1][0] if self._entries else 0
        with self._locked() as fd:
            self._rewrite(fd)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[int]:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield fd
        finally:
            os.close(fd)  # and its lock

    def _rewrite(self, fd: int) -> None:
        """The file holds ``_entries`` (in place: a reader waiting on the lock reads them)."""
        os.ftruncate(fd, 0)
        os.pwrite(fd, b"".join(orjson.dumps(e) + b"\n" for e in self._entries), 0)

    def emit(self, record: logging.LogRecord) -> None:
        if os.getpid() != self.pid:
            return
        try:
            line = self.format(record)
            with self._lock, self._locked() as fd:
                self._last = max(self._last + 1, log_clock_us())
                entry = (self._last, line)
                self._entries.append(entry)
                if len(self._entries) > 2 * TAIL_LINES:
                    del self._entries[:-TAIL_LINES]
                    self._rewrite(fd)
                else:
                    os.pwrite(fd, orjson.dumps(entry) + b"\n", os.fstat(fd).st_size)
        except Exception:
            self.handleError(record)


def read_entries(run_dir: Path, after: int, upto: int | None, count: int) -> list[Entry]:
    """The supervisor's last ``count`` lines above ``after`` and at most ``upto`` (blocking:
    call it on a thread)."""
    path = run_dir / SUPERVISOR_LOG
    try:
        with open(path, "rb") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_SH)
            data = f.read()
    except FileNotFoundError:
        return []
    found: list[Entry] = []
    for text in data.splitlines():
        with contextlib.suppress(ValueError):
            position, line = orjson.loads(text)
            if position > after and (upto is None or position <= upto):
                found.append((int(position), str(line)))
    return found[-count:] if count > 0 else []
