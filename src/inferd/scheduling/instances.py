"""Execution instances: N runtimes of one model version, each on its own worker thread.

Work arrives as whole batches through one queue shared by the instances; results return to
the loop with ``call_soon_threadsafe``. One exception, measured: a version whose executions
average under ``INLINE_BELOW_S`` runs on the event loop itself when nothing else of it is in
flight, because for such a call the hop to a thread and back (and the GIL hand-offs) costs the
loop more time than the call (half_plus_two: 4,000 req/s through the thread, 4,600 inline).
A model is measured on the worker threads first, so a slow model never runs inline.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from inferd.backends.base import Runtime
from inferd.errors import InferdError, InternalError, Unavailable
from inferd.types import Tensors

log = logging.getLogger("inferd.scheduling")

INLINE_BELOW_S = 100e-6
# An execution's outputs and how long the model itself ran, in nanoseconds.
Executed = tuple[Tensors, int]
_EWMA_WEIGHT = 0.1


@dataclass(slots=True)
class _Work:
    inputs: Tensors
    output_names: Sequence[str]
    future: asyncio.Future[Executed]
    loop: asyncio.AbstractEventLoop


class InstancePool:
    """Runs whole batches on ``len(runtimes)`` instances at once."""

    def __init__(self, name: str, runtimes: Sequence[Runtime]) -> None:
        if not runtimes:
            raise ValueError("an instance pool needs at least one runtime")
        self.name = name
        self._runtimes = list(runtimes)
        self._queue: queue.SimpleQueue[_Work | None] = queue.SimpleQueue()
        self._closed = False
        # Both only change on the event loop thread: executions queued or running, and the
        # moving average of execution seconds (unknown until a worker has measured one).
        self._pending = 0
        self._mean_s = float("inf")
        self._threads = [
            threading.Thread(
                target=self._worker, args=(rt,), name=f"inferd-{name}-{i}", daemon=True
            )
            for i, rt in enumerate(self._runtimes)
        ]
        for t in self._threads:
            t.start()

    @property
    def count(self) -> int:
        return len(self._runtimes)

    def execute(self, inputs: Tensors, output_names: Sequence[str]) -> asyncio.Future[Executed]:
        """Queue one batch; the future resolves on the event loop with outputs and run time."""
        if self._closed:
            raise Unavailable(f"model '{self.name}' is unloading")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Executed] = loop.create_future()
        if self._pending == 0 and self._mean_s < INLINE_BELOW_S:
            started = time.perf_counter_ns()
            try:
                outputs = self._runtimes[0].execute(inputs, output_names)
            except Exception as exc:
                future.set_exception(_as_inferd_error(self.name, exc))
                return future
            elapsed = time.perf_counter_ns() - started
            future.set_result((outputs, elapsed))
            self._observe(elapsed)
            return future
        self._pending += 1
        self._queue.put(_Work(inputs, output_names, future, loop))
        return future

    def _observe(self, ns: int) -> None:
        seconds = ns * 1e-9
        if self._mean_s == float("inf"):
            self._mean_s = seconds
        else:
            self._mean_s += _EWMA_WEIGHT * (seconds - self._mean_s)

    def _deliver(
        self,
        future: asyncio.Future[Executed],
        result: Tensors | None,
        error: Exception | None,
        ns: int,
    ) -> None:
        self._pending -= 1
        if ns >= 0:
            self._observe(ns)
        if future.done():  # the caller went away
            return
        if error is not None:
            future.set_exception(error)
        else:
            assert result is not None
            future.set_result((result, ns))

    def _worker(self, runtime: Runtime) -> None:
        while True:
            work = self._queue.get()
            if work is None:
                return
            result: Tensors | None = None
            error: Exception | None = None
            started = time.perf_counter_ns()
            if not work.future.done():  # cancelled while queued: do not execute
                try:
                    result = runtime.execute(work.inputs, work.output_names)
                except Exception as exc:  # a backend bug must not kill the worker
                    error = _as_inferd_error(self.name, exc)
            # A skipped (cancelled) item says nothing about the model's speed.
            ns = time.perf_counter_ns() - started if result is not None else -1
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody is waiting
                work.loop.call_soon_threadsafe(self._deliver, work.future, result, error, ns)

    def close(self) -> None:
        """Finish queued work, stop the workers and release the runtimes (blocking)."""
        if self._closed:
            return
        self._closed = True
        for _ in self._threads:
            self._queue.put(None)
        for t in self._threads:
            t.join()
        for rt in self._runtimes:
            try:
                rt.close()
            except Exception:
                log.exception("closing an instance of '%s' failed", self.name)


def _as_inferd_error(name: str, exc: Exception) -> InferdError:
    if isinstance(exc, InferdError):
        return exc
    log.error("model '%s' failed while executing", name, exc_info=exc)
    return InternalError(f"model '{name}' failed: {exc}")
