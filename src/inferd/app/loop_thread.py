"""Blocking calls into an event loop from other threads, and an event loop of its own on a
daemon thread: where ``with inferd.Server(...)`` runs the server (its batchers, instances,
frontends) while the caller's thread makes blocking calls.

``call_in_loop`` is the hand-off each blocking call pays, so it is cut to two thread wake-ups:
the loop is woken once (``call_soon_threadsafe``), steps the coroutine at once instead of
creating a Task for it (``run_eagerly``: a call to a model that runs inline finishes in that
step), and releases a lock the caller waits on. ``asyncio.run_coroutine_threadsafe`` costs a
Task, a second loop iteration for its done callbacks and a ``concurrent.futures.Future``'s
condition variable (half_plus_two from one caller: 88 µs a call through it, 60 µs here).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar, cast

from inferd.core.errors import Unavailable
from inferd.scheduling.eager import run_eagerly

T = TypeVar("T")
WAIT_POLL_S = 1.0  # a caller whose loop has closed under it notices within this long


class _Call:
    """One blocking call: its outcome, and a lock held until the outcome is in."""

    __slots__ = ("done", "error", "task", "value")

    def __init__(self) -> None:
        self.done = threading.Lock()
        self.done.acquire()
        self.value: Any = None
        self.error: BaseException | None = None
        self.task: asyncio.Task[None] | None = None

    async def run(self, coro: Coroutine[Any, Any, Any]) -> None:
        try:
            self.value = await coro
        except BaseException as exc:  # handed to the caller's thread, raised there
            self.error = exc
        finally:
            self.done.release()

    def start(self, coro: Coroutine[Any, Any, Any], loop: asyncio.AbstractEventLoop) -> None:
        self.task = run_eagerly(self.run(coro), loop=loop)

    def cancel(self) -> None:
        if self.task is not None:
            self.task.cancel()


def call_in_loop(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on ``loop`` (running on another thread) and wait for its outcome; an
    interrupt in the caller cancels it, and a loop that stops first raises Unavailable."""
    call = _Call()
    try:
        loop.call_soon_threadsafe(call.start, coro, loop)
    except RuntimeError:  # the loop is closed
        coro.close()
        raise Unavailable("the server has stopped") from None
    try:
        while not call.done.acquire(timeout=WAIT_POLL_S):
            if loop.is_closed():
                raise Unavailable("the server stopped before answering")
    except BaseException:
        if not loop.is_closed():
            loop.call_soon_threadsafe(call.cancel)
        raise
    if call.error is not None:
        if isinstance(call.error, asyncio.CancelledError):
            raise Unavailable("the call was cancelled: the server is stopping") from None
        raise call.error
    return cast(T, call.value)


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop where it is installed (as ``inferd serve`` runs), else asyncio's."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


class LoopThread:
    """Runs a new event loop on a thread until ``close``."""

    def __init__(self, name: str = "inferd-loop") -> None:
        self.loop = new_event_loop()
        started = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(started,), name=name, daemon=True)
        self._thread.start()
        started.wait()

    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(started.set)
        try:
            self.loop.run_forever()
            tasks = [t for t in asyncio.all_tasks(self.loop) if not t.done()]
            for task in tasks:
                task.cancel()
            if tasks:
                self.loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.run_until_complete(self.loop.shutdown_default_executor())
        finally:
            asyncio.set_event_loop(None)
            self.loop.close()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and wait for its result (from any other thread)."""
        return call_in_loop(self.loop, coro)

    def close(self) -> None:
        """Stop the loop (tasks left are cancelled) and wait for the thread to end."""
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
