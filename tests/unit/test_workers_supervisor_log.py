"""The supervisor's engine lines in the run folder: appended with positions, read after a
cursor, kept to the last lines, and ignored in a forked worker."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from inferd.observability.logging import TAIL_LINES, cursor
from inferd.workers.supervisor_log import SUPERVISOR_LOG, RunFolderLog, read_entries


def _record(text: str) -> logging.LogRecord:
    return logging.LogRecord("inferd.workers", logging.INFO, __file__, 1, text, None, None)


def test_lines_are_kept_with_positions_and_read_after_a_cursor(tmp_path: Path) -> None:
    handler = RunFolderLog(tmp_path / SUPERVISOR_LOG, [(5, "kept before")])
    handler.setFormatter(logging.Formatter("%(message)s"))
    assert read_entries(tmp_path, 0, None, 10) == [(5, "kept before")]
    reading = cursor()
    for text in ("worker 0 started", "worker 1 started"):
        handler.emit(_record(text))
    found = read_entries(tmp_path, 0, None, 10)
    assert [line for _, line in found] == ["kept before", "worker 0 started", "worker 1 started"]
    positions = [position for position, _ in found]
    assert positions == sorted(set(positions)) and positions[1] > reading
    assert [line for _, line in read_entries(tmp_path, reading, None, 10)] == [
        "worker 0 started",
        "worker 1 started",
    ]
    assert read_entries(tmp_path, 0, reading, 10) == [(5, "kept before")]
    assert [line for _, line in read_entries(tmp_path, 0, None, 1)] == ["worker 1 started"]
    assert read_entries(tmp_path / "nothing", 0, None, 10) == []


def test_the_file_keeps_the_last_lines(tmp_path: Path) -> None:
    handler = RunFolderLog(tmp_path / SUPERVISOR_LOG)
    handler.setFormatter(logging.Formatter("%(message)s"))
    for i in range(2 * TAIL_LINES + 1):
        handler.emit(_record(str(i)))
    lines = [line for _, line in read_entries(tmp_path, 0, None, 3 * TAIL_LINES)]
    assert lines == [str(i) for i in range(TAIL_LINES + 1, 2 * TAIL_LINES + 1)]
    assert len((tmp_path / SUPERVISOR_LOG).read_bytes().splitlines()) == TAIL_LINES


def test_a_forked_worker_writes_nothing_through_it(tmp_path: Path) -> None:
    handler = RunFolderLog(tmp_path / SUPERVISOR_LOG)
    handler.setFormatter(logging.Formatter("%(message)s"))
    pid = os.fork()
    if pid == 0:  # the worker, before it sets its own logs
        handler.emit(_record("from the worker"))
        os._exit(0)
    os.waitpid(pid, 0)
    handler.emit(_record("from the supervisor"))
    assert [line for _, line in read_entries(tmp_path, 0, None, 10)] == ["from the supervisor"]
