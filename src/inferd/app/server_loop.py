"""How ``inferd.Server``'s methods reach the event loop it runs on: an ``async_`` method is
awaited on that loop, a blocking one is handed to it from another thread and waits there."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from inferd.app.loop_thread import call_in_loop
from inferd.core.errors import Unavailable

T = TypeVar("T")


class ServerLoop:
    """The loop an ``inferd.Server`` runs on (``None`` until it starts), its thread, and
    whether the server has stopped; the server sets them as it starts and stops."""

    _loop: asyncio.AbstractEventLoop | None
    _loop_thread_id: int
    _stopped: bool

    def _check_loop(self) -> None:
        """An ``async_`` method is awaited on the server's own loop."""
        if self._loop is None or self._stopped:
            raise Unavailable(_NOT_RUNNING)
        if asyncio.get_running_loop() is not self._loop:
            raise RuntimeError(
                "this inferd.Server runs on another event loop: await its async_ methods "
                "there, or call its blocking methods from a thread"
            )

    def _block(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the server's loop from another thread and wait for its result."""
        try:
            loop = self._blocking_loop()
        except BaseException:
            coro.close()
            raise
        return call_in_loop(loop, coro)

    def _blocking_loop(self) -> asyncio.AbstractEventLoop:
        """The server's loop, when a blocking method may be called from this thread."""
        loop = self._loop
        if loop is None or self._stopped or loop.is_closed():
            raise Unavailable(_NOT_RUNNING)
        if threading.get_ident() == self._loop_thread_id:
            raise RuntimeError(
                "a blocking inferd.Server method was called on the server's own event loop: "
                "await the async_ form instead (server.async_infer...)"
            )
        return loop

    def _here(self, function: Callable[..., T], *args: Any) -> T:
        """Call ``function`` on the server's loop thread: at once when this is it."""
        if threading.get_ident() == self._loop_thread_id:
            return function(*args)
        return self._block(_apply(function, *args))


_NOT_RUNNING = (
    "the server is not running: start it with `with inferd.Server(...)`, open() or "
    "`await server.start()`"
)


async def _apply(function: Callable[..., T], *args: Any) -> T:
    return function(*args)
