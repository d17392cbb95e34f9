"""Watching clients of long requests: one that hangs up while its work waits is cancelled.

A request whose work (a model's queue, a batch) is still running ``WATCH_AFTER_S`` after it
began asks granian whether its client is still there; when the client hangs up, the request's
task is cancelled and answers ``ClientGone`` (499, written to nobody), so work still queued is
dropped, not executed. Most answers are ready before: the watch costs the event loop two calls
into granian (about 20 µs together), noise beside a wait this long but a tenth of a batched
request's loop time. A client that hung up earlier is noticed when its watch starts.

A request only records when it began, in a dict; one sweep, every ``WATCH_AFTER_S / 2`` while
work is in progress, starts the watches that are due. A loop timer armed and cancelled per
request, and stepping the work by hand to spare it for work that never waits, cost the
batched binary path about 200 interpreter opcodes per request (``cancel_on_disconnect`` before
this module).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from inferd.core.errors import ClientGone

T = TypeVar("T")

# A request still running after this long starts watching its client (wide MLP at c=64 in
# 64-row batches: 1,116 -> 1,074 server CPU-µs per row when no request watched).
WATCH_AFTER_S = 0.1

Disconnected = Callable[[], Awaitable[None]]


class Watched(Protocol):
    """What a watch needs of a request (``protocols.transport.http_routes.HttpRequest``)."""

    method: str
    path: str
    disconnected: Disconnected | None  # None: nothing to watch
    task: asyncio.Task[Any] | None  # the task serving it


class ClientWatch:
    """The running work of one event loop's requests, and the watches on their clients."""

    def __init__(self, after_s: float = WATCH_AFTER_S) -> None:
        self.after_s = after_s
        # task -> (monotonic start, its client's disconnect awaitable), in the order they
        # began: the sweep stops at the first that is not due.
        self._running: dict[asyncio.Task[Any], tuple[float, Disconnected]] = {}
        # task -> its disconnect future and the callback that cancels the task
        self._watched: dict[asyncio.Task[Any], tuple[Any, Callable[[Any], None]]] = {}
        self._gone: set[asyncio.Task[Any]] = set()  # cancelled because the client left
        self._sweeping: asyncio.TimerHandle | None = None

    def guard(self, request: Watched, work: Awaitable[T]) -> Awaitable[T]:
        """``work``, cancelled with ClientGone when ``request``'s client hangs up first (itself
        when there is no client to watch)."""
        task, disconnected = request.task, request.disconnected
        if task is None or disconnected is None:
            return work
        return self._run(task, disconnected, request, work)

    async def _run(
        self,
        task: asyncio.Task[Any],
        disconnected: Disconnected,
        request: Watched,
        work: Awaitable[T],
    ) -> T:
        self._running[task] = (time.monotonic(), disconnected)
        if self._sweeping is None:
            self._sweeping = asyncio.get_running_loop().call_later(self.after_s / 2, self._sweep)
        try:
            return await work
        except asyncio.CancelledError:
            if task not in self._gone:
                raise
            self._gone.discard(task)
            task.uncancel()
            raise ClientGone(
                f"client disconnected during {request.method} {request.path}"
            ) from None
        finally:
            if self._running.pop(task, None) is None:  # its watch had started
                self._unwatch(task)

    def _sweep(self) -> None:
        due = time.monotonic() - self.after_s
        started = []
        for task, (since, disconnected) in self._running.items():
            if since > due:
                break
            started.append((task, disconnected))
        for task, disconnected in started:
            del self._running[task]
            self._watch(task, disconnected)
        self._sweeping = (
            asyncio.get_running_loop().call_later(self.after_s / 2, self._sweep)
            if self._running
            else None
        )

    def _watch(self, task: asyncio.Task[Any], disconnected: Disconnected) -> None:
        gone: Any = disconnected()
        if not isinstance(gone, asyncio.Future) and not hasattr(gone, "add_done_callback"):
            gone = asyncio.ensure_future(gone)  # a plain coroutine (not granian's future)
        loop = asyncio.get_running_loop()

        def on_gone(_: Any) -> None:  # granian may resolve its future on its own thread
            loop.call_soon_threadsafe(self._cancel, task)

        self._watched[task] = (gone, on_gone)
        gone.add_done_callback(on_gone)

    def _cancel(self, task: asyncio.Task[Any]) -> None:
        if task in self._watched and not task.done():  # still working: the answer is moot
            self._gone.add(task)
            task.cancel()

    def _unwatch(self, task: asyncio.Task[Any]) -> None:
        watched = self._watched.pop(task, None)
        if watched is not None:  # the answer is ready: a hang-up from now on cancels nothing
            gone, on_gone = watched
            gone.remove_done_callback(on_gone)
            gone.cancel()
        self._gone.discard(task)
