"""Execution instances: N executors of one model version behind one ``Instances`` protocol.

``ThreadInstances`` runs each executor on its own worker thread (runtimes that release the
GIL); ``inferd.scheduling.processes.ProcessInstances`` runs each in a worker process. Each
instance has its own queue, so work can be addressed to one (the sequence batcher pins a
sequence to an instance) or left to the least busy. An instance whose executor fails for good
(``InstanceFailed``, or an exception that escapes it) fails the batch it held and is rebuilt.

One exception to the threads, measured: an executor that declares itself ``inline`` and whose
executions take under ``INLINE_BELOW_S`` runs on the event loop itself when nothing else of its
version is in flight, because for such a call the hop to a thread and back (and the GIL hand-offs)
costs the loop more than the call (half_plus_two, v2 JSON: 342,000 CPU instructions per request
through the thread, 294,000 inline; ``try_inline`` runs such a request with no future at all, and
``take_inline`` / ``give_inline`` hand instance 0 to a caller on the loop that runs the runtime
itself: ``inferd.plane.model.ModelVersion.infer_inline``). The decision is measured in two steps.
Executions on the worker threads are timed by the thread's CPU time: their wall time would include
waiting for the GIL behind a busy event loop, which under load inflates a 30 µs call past the
threshold and keeps a fast model off the inline path for good. When that CPU time is under the
threshold, one execution runs inline as a probe, timed by the wall clock (a runtime whose work
happens on threads of its own shows little CPU on the calling thread, and a runtime waiting on a
GPU none at all: only the wall clock tells). On a busy host a fast call is sometimes descheduled
and looks slow, so a probe round makes up to ``PROBES`` tries and one fast try is enough; after a
slow round the next waits for a back-off that doubles up to ``PROBE_MAX_S``. The model stays inline
until ``SLOW_STREAK`` inline calls in a row take ``LEAVE_FACTOR`` times the threshold: a fast call
often shows 100-130 µs of wall time when the runtime released the GIL and another thread took it,
and a model that flapped between the loop and its thread at that margin cost 1.5x the CPU per
request of one that stays inline (half_plus_two, v2 JSON, c=16).

An executor runs one batch at a time: each instance has a lock its worker thread holds while it
executes, and so does whoever else runs the executor: the event loop (inline, above) and a
thread that claims the instance (``claim``: ``inferd.Server.infer`` runs a request on the
caller's own thread). A claim never waits: an instance busy or with work queued is not claimed,
and the request goes the usual way. Closing the pool takes each lock before it closes that
executor, so a claimed execution finishes first, as queued work does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from inferd.backends.work import (
    CANCELLED,
    BatchExecutor,
    Executed,
    Executor,
    InstanceFailed,
    Result,
    Work,
    as_error,
    run_live,
)
from inferd.core.errors import InferdError, Unavailable

log = logging.getLogger("inferd.scheduling")

INLINE_BELOW_S = 100e-6
INLINE_BELOW_NS = int(INLINE_BELOW_S * 1e9)
PROBE_FIRST_S = 1.0
PROBE_MAX_S = 60.0
SLOW_STREAK = 3
LEAVE_FACTOR = 3  # an inline call counts as slow past this many times the threshold
PROBES = 5
_EWMA_WEIGHT = 0.1
_UNKNOWN = float("inf")


class Instances(Protocol):
    """The execution instances of one model version."""

    name: str
    count: int
    restarts: int  # instances rebuilt after a failure, since load

    def submit(self, batch: list[Work], instance: int | None = None) -> asyncio.Future[Executed]:
        """Queue one batch (on ``instance``, else the least busy); the future resolves on the
        event loop with one result per Work, or fails with InstanceFailed / Unavailable."""
        ...

    def try_inline(self, work: Work) -> Executed | None:
        """Execute one request at once on the event loop when that is cheaper than a queue
        (fast executors on threads); None: ``submit`` it."""
        ...

    def run_blocking(self, instance: int, batch: list[Work]) -> Executed:
        """Execute now, in the calling thread, before the instances serve (model warmup)."""
        ...

    async def close(self) -> None:
        """Finish queued work, stop the workers and release the executors."""
        ...


@dataclass(slots=True)
class _Job:
    batch: list[Work]
    future: asyncio.Future[Executed]
    loop: asyncio.AbstractEventLoop


class ThreadInstances:
    """One worker thread per executor; ``rebuild(i)`` makes a fresh executor for instance i."""

    def __init__(
        self,
        name: str,
        executors: Sequence[Executor],
        rebuild: Callable[[int], Executor] | None = None,
    ) -> None:
        if not executors:
            raise ValueError("instances need at least one executor")
        self.name = name
        self.count = len(executors)
        self.restarts = 0
        self._executors: list[Executor | None] = list(executors)
        self._rebuild = rebuild
        self._queues: list[queue.SimpleQueue[_Job | None]] = [
            queue.SimpleQueue() for _ in executors
        ]
        self._locks = [threading.Lock() for _ in executors]  # held while an executor runs
        self._lock0 = self._locks[0]  # the one the event loop takes (``take_inline``)
        self._closed = False
        self._inline = all(e.inline for e in executors)
        # Loop-thread state: batches queued or running per instance (and in all); moving
        # averages of the workers' CPU seconds per execution and of inline wall seconds; when
        # the next inline probe may run, and the back-off after a slow one.
        self._pending = [0] * self.count
        self._busy = 0
        self._cpu_mean_s = _UNKNOWN
        self._inline_ok = False  # the last probe (or inline calls) ran under the threshold
        self._slow = 0  # inline calls in a row over the threshold
        self._tries = PROBES  # probes left in this round
        self._probe_after = 0.0
        self._probe_wait_s = PROBE_FIRST_S
        self._threads = [
            threading.Thread(target=self._worker, args=(i,), name=f"inferd-{name}-{i}", daemon=True)
            for i in range(self.count)
        ]
        for t in self._threads:
            t.start()

    @property
    def row_batches(self) -> bool:
        """Whether every instance runs a batch runtime (``BatchExecutor``): a request is its
        rows, so compatible requests may travel as one."""
        return all(isinstance(e, BatchExecutor) for e in self._executors if e is not None)

    def submit(self, batch: list[Work], instance: int | None = None) -> asyncio.Future[Executed]:
        if self._closed:
            raise Unavailable(f"model '{self.name}' is unloading")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Executed] = loop.create_future()
        if instance is None:
            if self._go_inline():
                try:
                    executed = self._run_inline(batch)
                except InferdError as exc:
                    future.set_exception(exc)
                    return future
                if executed is not None:
                    future.set_result(executed)
                    return future
            instance = self._least_busy()
        elif not 0 <= instance < self.count:
            raise ValueError(f"model '{self.name}' has no instance {instance}")
        for work in batch:
            if work.responses is not None:  # a decoupled model's: its sink is the loop's
                work.responses = _on_loop(loop, work.responses)
        self._pending[instance] += 1
        self._busy += 1
        self._queues[instance].put(_Job(batch, future, loop))
        return future

    def _least_busy(self) -> int:
        pending = self._pending
        if self.count == 1 or pending[0] == 0:
            return 0
        return min(range(self.count), key=pending.__getitem__)

    def _go_inline(self) -> bool:
        """Whether the next request runs on the event loop (the module's docstring)."""
        if self._busy or not self._inline:
            return False
        if self._inline_ok:
            return True
        if self._cpu_mean_s >= INLINE_BELOW_S:
            return False
        return time.monotonic() >= self._probe_after  # probe: fast on the threads, unknown here

    def try_inline(self, work: Work) -> Executed | None:
        """Execute one request now, on the event loop, when the pool would run it inline
        (see the module's docstring); None: submit it instead. An executor's failure raises
        the error the request gets."""
        executor = self.take_inline()
        return None if executor is None else self._execute_inline(executor, [work])

    def take_inline(self) -> Executor | None:
        """Instance 0's executor, held for one execution on the event loop now, when the pool
        would run a request inline (the module's docstring); None: submit it instead. The
        holder executes at most once, timed, then calls ``give_inline`` in any case."""
        if self._closed:
            return None
        if (self._inline_ok and not self._busy) or self._go_inline():  # (ok: only if _inline)
            executor = self._executors[0]
            if executor is not None and self._lock0.acquire(False):
                return executor
        return None  # not inline now; or instance 0 is being rebuilt, or a claim holds it

    def _run_inline(self, batch: list[Work]) -> Executed | None:
        executor = self._executors[0]
        if executor is None or not self._locks[0].acquire(blocking=False):
            return None  # being rebuilt, or a claim holds it: queue for the worker
        return self._execute_inline(executor, batch)

    def _execute_inline(self, executor: Executor, batch: list[Work]) -> Executed:
        started = time.perf_counter_ns()
        try:
            executed = executor.execute(batch)
        except Exception as exc:
            self.give_inline(-1)
            raise as_error(self.name, exc) from None
        self.give_inline(time.perf_counter_ns() - started)
        return executed

    def give_inline(self, elapsed_ns: int) -> None:
        """Release instance 0 after ``take_inline``, its execution having taken ``elapsed_ns``
        (wall clock; -1: none ran, or it failed): the model stays on the loop or goes back to
        its threads, as that time says."""
        self._lock0.release()
        if elapsed_ns < 0:
            return
        if elapsed_ns < INLINE_BELOW_NS:
            if not self._inline_ok or self._slow:  # (inline, the probe state is at rest)
                self._inline_ok = True
                self._slow = 0
                self._probe_wait_s = PROBE_FIRST_S
                self._tries = PROBES
        elif self._inline_ok:
            if elapsed_ns < INLINE_BELOW_NS * LEAVE_FACTOR:
                self._slow = 0  # within the margin: stays inline
            else:
                self._slow += 1
            if self._slow >= SLOW_STREAK:  # slow calls in a row: back to the threads
                self._inline_ok = False
                self._slow = 0
                self._tries = PROBES
        else:
            self._tries -= 1
            if self._tries <= 0:  # a slow probe round: wait before the next
                self._tries = PROBES
                self._probe_after = time.monotonic() + self._probe_wait_s
                self._probe_wait_s = min(PROBE_MAX_S, self._probe_wait_s * 2)

    def claim(self) -> int | None:
        """From any thread: hold an idle instance for the calling thread (None: none is idle,
        or the pool is closing). ``execute_claimed`` runs on it; ``release`` gives it back."""
        for instance, lock in enumerate(self._locks):
            if self._pending[instance] or not lock.acquire(blocking=False):
                continue  # work is queued there (read without the loop: a hint), or it runs
            if not self._closed and self._executors[instance] is not None:
                return instance
            lock.release()
        return None

    def execute_claimed(self, instance: int, batch: list[Work]) -> Executed:
        """Execute on an instance this thread claimed, as its worker would: an executor that
        fails is rebuilt, and the error its requests get is raised."""
        executor = self._executors[instance]
        assert executor is not None  # set while claimed: only its lock's holder clears it
        try:
            return executor.execute(batch)
        except Exception as exc:
            error = exc if isinstance(exc, InstanceFailed) else as_error(self.name, exc)
            self._restart(instance, exc)
            raise error from None

    def release(self, instance: int) -> None:
        self._locks[instance].release()

    def run_blocking(self, instance: int, batch: list[Work]) -> Executed:
        executor = self._executors[instance]
        if executor is None:
            raise InstanceFailed(f"instance {instance} of model '{self.name}' is not running")
        return executor.execute(batch)

    def _observe(self, cpu_ns: int) -> None:
        seconds = cpu_ns * 1e-9
        if self._cpu_mean_s == _UNKNOWN:
            self._cpu_mean_s = seconds
        else:
            self._cpu_mean_s += _EWMA_WEIGHT * (seconds - self._cpu_mean_s)

    def _deliver(
        self,
        instance: int,
        job: _Job,
        executed: Executed | None,
        error: InferdError | None,
        ns: int,
    ) -> None:
        self._pending[instance] -= 1
        self._busy -= 1
        if ns >= 0:
            self._observe(ns)
        future = job.future
        if future.done():  # the caller went away
            return
        if error is not None:
            future.set_exception(error)
        elif executed is None:  # every work of the batch was cancelled
            future.set_result(Executed([CANCELLED] * len(job.batch)))
        else:
            future.set_result(executed)

    def _worker(self, instance: int) -> None:
        jobs = self._queues[instance]
        while True:
            job = jobs.get()
            if job is None:
                return
            executed: Executed | None = None
            error: InferdError | None = None
            ns = -1
            if not job.future.done():  # cancelled while queued: do not execute
                with self._locks[instance]:
                    started = time.thread_time_ns()
                    try:
                        executed = run_live(self._executor(instance), job.batch)
                        ns = time.thread_time_ns() - started if executed is not None else -1
                    except Exception as exc:  # the instance broke: fail this batch, rebuild it
                        error = exc if isinstance(exc, InstanceFailed) else as_error(self.name, exc)
                        self._restart(instance, exc)
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody is waiting
                job.loop.call_soon_threadsafe(self._deliver, instance, job, executed, error, ns)

    def _executor(self, instance: int) -> Executor:
        executor = self._executors[instance]
        if executor is None:
            if self._rebuild is None:
                raise InstanceFailed(f"instance {instance} of model '{self.name}' is down")
            executor = self._executors[instance] = self._rebuild(instance)
            log.info("model '%s': instance %d is running again", self.name, instance)
        return executor

    def _restart(self, instance: int, cause: BaseException) -> None:
        """Close a broken executor; the next batch on this instance builds a fresh one."""
        log.error("model '%s': instance %d failed (%s); restarting it", self.name, instance, cause)
        executor, self._executors[instance] = self._executors[instance], None
        if executor is not None:
            try:
                executor.close()
            except Exception:
                log.exception("closing instance %d of '%s' failed", instance, self.name)
        self.restarts += 1
        if self._rebuild is not None:
            try:
                self._executor(instance)
            except Exception:
                log.exception("model '%s': rebuilding instance %d failed", self.name, instance)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await asyncio.to_thread(self._stop)

    def _stop(self) -> None:
        for jobs in self._queues:
            jobs.put(None)
        for t in self._threads:
            t.join()
        for i, lock in enumerate(self._locks):
            with lock:  # a claimed execution finishes first
                executor, self._executors[i] = self._executors[i], None
            if executor is None:
                continue
            try:
                executor.close()
            except Exception:
                log.exception("closing instance %d of '%s' failed", i, self.name)


def _on_loop(
    loop: asyncio.AbstractEventLoop, sink: Callable[[Result, bool], None]
) -> Callable[[Result, bool], None]:
    """A decoupled request's sink, called from an instance's thread, run on the event loop."""

    def send(result: Result, final: bool) -> None:
        loop.call_soon_threadsafe(sink, result, final)

    return send
