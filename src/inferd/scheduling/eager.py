"""Running a coroutine's first step at once, where a Task would wait a loop iteration for it.

Most work started from a protocol callback finishes without ever waiting: a gRPC call to a
model that runs inline, or a Python model's call to such a model (``processes``). A Task per
call would only add a loop iteration and its bookkeeping to each (measured on half_plus_two:
creating, scheduling and stepping a Task cost more than a tenth of a whole gRPC call).
Python 3.12 has this built in (``eager_start``); on 3.11 the coroutine is stepped here and, if
it waits, handed to a Task through ``_Started``, which gives the Task the future the coroutine
waits on first. The coroutine runs in its own copy of the context either way, as in a Task.
``asyncio.current_task()`` is None during that first step on 3.11.
"""

from __future__ import annotations

import asyncio
import contextvars
import sys
from collections.abc import Coroutine, Generator
from typing import Any

_EAGER_TASKS = sys.version_info >= (3, 12)


def run_eagerly(
    coro: Coroutine[Any, Any, None],
    name: str | None = None,
    loop: asyncio.AbstractEventLoop | None = None,
) -> asyncio.Task[None] | None:
    """Run ``coro`` until it finishes (None) or first waits: then a Task, on the running loop
    and in the coroutine's own context, carries it on. An exception escaping the first step
    is raised here."""
    loop = loop or asyncio.get_running_loop()
    context = contextvars.copy_context()
    if _EAGER_TASKS:
        task: asyncio.Task[None] = asyncio.Task(  # type: ignore[call-arg]
            coro, loop=loop, name=name, context=context, eager_start=True
        )
        if not task.done():
            return task
        task.result()  # the first step's error, raised here
        return None
    try:
        waiting_on = context.run(coro.send, None)
    except StopIteration:
        return None
    return loop.create_task(_Started(coro, waiting_on), name=name, context=context)


class _Started(Coroutine[Any, Any, None]):
    """A coroutine already stepped once, as a Task steps it: the first ``send`` answers with
    what the coroutine yielded then (the future it waits on, or None for a bare yield), later
    ones go to it."""

    __slots__ = ("_coro", "_first", "_fresh")

    def __init__(self, coro: Coroutine[Any, Any, None], first: Any) -> None:
        self._coro = coro
        self._first = first
        self._fresh = True

    def send(self, value: Any) -> Any:
        if self._fresh:
            self._fresh = False
            return self._first
        return self._coro.send(value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        if self._fresh:
            # Cancelled before the Task's first step: the Task never saw the future the
            # coroutine waits on, so cancel that as the Task would have.
            self._fresh = False
            if isinstance(typ, asyncio.CancelledError) and asyncio.isfuture(self._first):
                self._first.cancel()
        if val is None and tb is None:
            return self._coro.throw(typ)
        return self._coro.throw(typ, val, tb)

    def close(self) -> None:
        self._coro.close()

    def __await__(self) -> Generator[Any, None, None]:
        raise TypeError("a started coroutine is driven by its Task, not awaited")

    # What asyncio's task repr and stack printing read from a coroutine.
    @property
    def cr_code(self) -> Any:
        return getattr(self._coro, "cr_code", None)

    @property
    def cr_frame(self) -> Any:
        return getattr(self._coro, "cr_frame", None)

    @property
    def cr_running(self) -> bool:
        return bool(getattr(self._coro, "cr_running", False))

    @property
    def cr_await(self) -> Any:
        return getattr(self._coro, "cr_await", None)
