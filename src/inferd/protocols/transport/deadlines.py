"""Deadlines on request bodies: one sweep for every read in progress, not a timer per request.

A loop timer armed and cancelled around each body read cost the JSON infer path about 11,000
instructions per request (uvloop's ``call_later``, a closure, and stepping the read by hand),
almost 4 % of a small request, measured with callgrind. Here a read only records its deadline
in a dict; one sweep, run every ``timeout_s / 4`` (at most every second) while reads are in
progress, cancels the tasks whose deadline passed, and each answers ``RequestTimeout``. A
stalled body is therefore cut between ``timeout_s`` and ``1.25 * timeout_s`` after its read
began.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import Any, TypeVar

from inferd.core.errors import RequestTimeout

T = TypeVar("T")

SWEEP_MAX_S = 1.0
SWEEP_MIN_S = 0.01


class BodyDeadlines:
    """Reads that must finish within ``timeout_s`` (``--http-body-timeout-s``)."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._sweep_s = min(SWEEP_MAX_S, max(SWEEP_MIN_S, timeout_s / 4))
        self._due: dict[asyncio.Task[Any], float] = {}  # reading task -> monotonic deadline
        self._expired: set[asyncio.Task[Any]] = set()  # cancelled by the sweep
        self._sweeping: asyncio.TimerHandle | None = None

    async def read(
        self,
        work: Awaitable[T],
        task: asyncio.Task[Any] | None = None,
        until: float | None = None,
        why: str = "",
    ) -> T:
        """Await ``work`` (a body read, in ``task``: the current one when not given);
        RequestTimeout when it takes too long: ``timeout_s``, or past ``until`` (monotonic),
        whichever comes first (``why`` then says why)."""
        if task is None:
            task = asyncio.current_task()
        if task is None:  # not in a task: nothing to cancel
            return await work
        due = time.monotonic() + self.timeout_s
        if until is not None and until < due:
            return await self.read_by(work, task, until, why)
        return await self.read_by(work, task, due)

    async def read_by(
        self, work: Awaitable[T], task: asyncio.Task[Any], due: float, why: str = ""
    ) -> T:
        """``read`` with its deadline worked out (monotonic); ``why`` says why a read past it
        failed ("": the body timeout)."""
        self._due[task] = due
        if self._sweeping is None:
            self._sweeping = asyncio.get_running_loop().call_later(self._sweep_s, self._sweep)
        try:
            return await work
        except asyncio.CancelledError:
            if task not in self._expired:
                raise
            task.uncancel()
            if why:
                raise RequestTimeout(why) from None
            raise RequestTimeout(
                f"the request body did not arrive within {self.timeout_s:g} s "
                "(--http-body-timeout-s)"
            ) from None
        finally:
            self._due.pop(task, None)
            if self._expired:  # also a read that finished as the sweep cancelled it
                self._expired.discard(task)

    def _sweep(self) -> None:
        now = time.monotonic()
        late = [task for task, due in self._due.items() if due <= now]
        for task in late:
            del self._due[task]
            self._expired.add(task)
            task.cancel()
        self._sweeping = (
            asyncio.get_running_loop().call_later(self._sweep_s, self._sweep) if self._due else None
        )
