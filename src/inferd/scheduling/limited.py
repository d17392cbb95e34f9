"""A model version's instances behind the rate limiter (``inferd.scheduling.rate_limiter``).

``LimitedInstances`` is an ``Instances`` around the version's own (threads or worker
processes): work waits here, per instance when addressed to one (the sequence batcher) and in
one queue otherwise, and an instance free of work is *staged* with the next of it; the limiter
grants it its resources, the work is submitted to that very instance, and the resources are
released when the execution's answer arrives. An instance holds one execution at a time.
Among this model's free instances, the one of lowest ``executions x priority`` takes the next
work (Triton's order). Only versions whose instance groups declare a ``rate_limiter`` are
wrapped, and only with ``--rate-limit execution_count``: otherwise nothing here is on the path.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass

from inferd.backends.work import Executed, Work
from inferd.core.errors import Unavailable
from inferd.scheduling.instances import Instances
from inferd.scheduling.rate_limiter import Ask, RateLimiter, Slot


@dataclass(eq=False, slots=True)
class _Job:
    batch: list[Work]
    future: asyncio.Future[Executed]
    enqueued_ns: int


class LimitedInstances:
    """``pool``'s instances, each executing only when the limiter grants its ``asks[i]``."""

    def __init__(self, limiter: RateLimiter, pool: Instances, asks: list[Ask]) -> None:
        if len(asks) != pool.count:
            raise ValueError("one ask per instance")
        self.name = pool.name
        self.count = pool.count
        self.inner = pool
        self._limiter = limiter
        self._slots = limiter.register(pool.name, asks, self._granted)
        self._index = {id(slot): i for i, slot in enumerate(self._slots)}
        self._shared: deque[_Job] = deque()
        self._own: list[deque[_Job]] = [deque() for _ in asks]
        self._jobs: list[_Job | None] = [None] * self.count  # staged or running, per instance
        self._closed = False
        self._idle: asyncio.Future[None] | None = None

    @property
    def restarts(self) -> int:
        return self.inner.restarts

    @restarts.setter
    def restarts(self, value: int) -> None:
        self.inner.restarts = value

    def try_inline(self, work: Work) -> Executed | None:
        return None  # every execution waits for its resources

    def run_blocking(self, instance: int, batch: list[Work]) -> Executed:
        return self.inner.run_blocking(instance, batch)

    def submit(self, batch: list[Work], instance: int | None = None) -> asyncio.Future[Executed]:
        if self._closed:
            raise Unavailable(f"model '{self.name}' is unloading")
        if instance is not None and not 0 <= instance < self.count:
            raise ValueError(f"model '{self.name}' has no instance {instance}")
        job = _Job(batch, asyncio.get_running_loop().create_future(), time.perf_counter_ns())
        (self._shared if instance is None else self._own[instance]).append(job)
        self._stage_free()
        return job.future

    def _stage_free(self) -> None:
        for slot in self._take_work():
            self._limiter.stage(slot)

    def _take_work(self) -> list[Slot]:
        """Hand waiting work to free instances, lowest ``executions x priority`` first; the
        instances that took some, to stage with the limiter."""
        free = [i for i in range(self.count) if self._jobs[i] is None]
        if len(free) > 1:
            free.sort(key=lambda i: self._slots[i].scaled_priority)
        took: list[Slot] = []
        for i in free:
            queue = self._own[i] or self._shared
            if queue:
                self._jobs[i] = queue.popleft()
                took.append(self._slots[i])
        return took

    def _granted(self, slot: Slot) -> None:
        """The limiter granted ``slot`` its resources: run its job on its instance."""
        i = self._index[id(slot)]
        job = self._jobs[i]
        assert job is not None
        if job.future.done():  # the caller left while it waited: nothing to run
            self._finish(i, slot, executed=False)
            return
        self._limiter.record_wait(self.name, time.perf_counter_ns() - job.enqueued_ns)
        try:
            inner = self.inner.submit(job.batch, i)
        except Exception as exc:
            job.future.set_exception(exc)
            self._finish(i, slot, executed=False)
            return
        job.future.add_done_callback(lambda f: inner.cancel() if f.cancelled() else None)
        inner.add_done_callback(lambda f: self._executed(i, slot, job, f))

    def _executed(self, i: int, slot: Slot, job: _Job, inner: asyncio.Future[Executed]) -> None:
        future = job.future
        if not future.done():
            if inner.cancelled():
                future.cancel()
            elif (error := inner.exception()) is not None:
                future.set_exception(error)
            else:
                future.set_result(inner.result())
        self._finish(i, slot, executed=True)

    def _finish(self, i: int, slot: Slot, executed: bool) -> None:
        self._jobs[i] = None
        if executed:
            slot.executions += 1  # counted before this model's free instances take work
        self._limiter.release(slot, False, self._take_work())
        if self._idle is not None and not self._idle.done() and not self._busy():
            self._idle.set_result(None)

    def _busy(self) -> bool:
        return bool(self._shared) or any(self._own) or any(j is not None for j in self._jobs)

    async def close(self) -> None:
        """Let waiting and running work finish, leave the limiter, close the instances."""
        if self._closed:
            return
        self._closed = True
        if self._busy():
            self._idle = asyncio.get_running_loop().create_future()
            await self._idle
        self._limiter.unregister(self._slots)
        await self.inner.close()
