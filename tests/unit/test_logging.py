"""The in-memory log tails behind GET /v2/logs: the last lines, and the lines after N."""

from __future__ import annotations

import logging

from inferd.observability.logging import TailHandler


def _record(text: str) -> logging.LogRecord:
    return logging.LogRecord("inferd", logging.INFO, __file__, 1, text, None, None)


def test_since_answers_only_newer_lines_and_the_next_number() -> None:
    tail = TailHandler(capacity=3)
    tail.setFormatter(logging.Formatter("%(message)s"))
    assert tail.since(0, 10) == ([], 0)
    for text in ("a", "b"):
        tail.emit(_record(text))
    assert tail.since(0, 10) == (["a", "b"], 2)
    assert tail.since(1, 10) == (["b"], 2)
    assert tail.since(2, 10) == ([], 2)
    for text in ("c", "d", "e"):
        tail.emit(_record(text))
    # Only the last three are kept: older ones are gone, not repeated.
    assert tail.since(1, 10) == (["c", "d", "e"], 5)
    assert tail.since(3, 1) == (["e"], 5)
    assert tail.since(9, 10) == ([], 5)  # a number from an earlier run of the server
    assert tail.tail(2) == ["d", "e"]
