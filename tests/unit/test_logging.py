"""The in-memory log tails behind GET /v2/logs: the last lines, the lines after a position, and
several processes' lines merged in order."""

from __future__ import annotations

import logging
import time

from inferd.observability.logging import TailHandler, cursor, log_clock_us, merge_entries


def _record(text: str) -> logging.LogRecord:
    return logging.LogRecord("inferd", logging.INFO, __file__, 1, text, None, None)


def _tail(capacity: int) -> TailHandler:
    tail = TailHandler(capacity=capacity)
    tail.setFormatter(logging.Formatter("%(message)s"))
    return tail


def _passed() -> None:
    """Lines kept within one microsecond take the next positions up, ahead of the clock, and
    ``since`` answers them once the clock has passed them (the next call, for a reader that
    polls): wait that long, so the lines just kept are in the answer."""
    time.sleep(0.001)


def test_since_answers_only_newer_lines_and_the_next_position() -> None:
    tail = _tail(3)
    start = cursor()
    lines, first = tail.since(0, 10)
    assert lines == [] and first >= start
    for text in ("a", "b"):
        tail.emit(_record(text))
    _passed()
    lines, second = tail.since(first, 10)
    assert lines == ["a", "b"] and second > first
    assert tail.since(second, 10)[0] == []  # nothing new
    positions = [position for position, _ in tail.entries(0, None, 10)]
    assert tail.since(positions[0], 10)[0] == ["b"]
    for text in ("c", "d", "e"):
        tail.emit(_record(text))
    _passed()
    # Only the last three are kept: older ones are gone, not repeated.
    assert tail.since(0, 10)[0] == ["c", "d", "e"]
    assert tail.since(second, 10)[0] == ["c", "d", "e"]
    assert tail.since(second, 1)[0] == ["e"]
    assert tail.since(log_clock_us() + 10**9, 10)[0] == []  # a position not reached yet
    assert tail.tail(2) == ["d", "e"]
    assert tail.tail(0) == []


def test_positions_increase_and_a_line_kept_later_is_above_a_cursor() -> None:
    tail = _tail(100)
    for i in range(50):  # many lines within one microsecond still get distinct positions
        tail.emit(_record(str(i)))
    positions = [position for position, _ in tail.entries(0, None, 100)]
    assert positions == sorted(set(positions)) and len(positions) == 50
    _passed()
    reading = cursor()
    tail.emit(_record("later"))
    assert tail.entries(reading, None, 10) == [(tail.entries(0, None, 1)[0][0], "later")]
    assert [line for _, line in tail.entries(0, reading, 100)] == [str(i) for i in range(50)]


def test_merge_interleaves_processes_in_order_and_keeps_the_last() -> None:
    one = [(1, "a"), (4, "d"), (6, "f")]
    two = [(2, "b"), (3, "c"), (5, "e")]
    assert merge_entries([one, two], 10) == ["a", "b", "c", "d", "e", "f"]
    assert merge_entries([one, two], 2) == ["e", "f"]
    assert merge_entries([one, [], two], 0) == []
    assert merge_entries([[(7, "first")], [(7, "second")]], 5) == ["first", "second"]
