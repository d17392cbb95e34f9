"""Schedulers: direct (one request, one execution) and the dynamic batcher.

The dynamic batcher owns the queue (per priority level), timeouts, the concatenation of
compatible requests along axis 0, the check of each output's batch size, and the split of the
outputs back to each caller. Backends only ever see whole batches.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from inferd.errors import DeadlineExceeded, InternalError, Unavailable
from inferd.scheduling.instances import InstancePool
from inferd.scheduling.policy import BatchingOptions, check_request_parameters, timeout_parameter_us
from inferd.stats import ModelStats
from inferd.types import Parameters, Tensors, Timings

Names = tuple[str, ...]
log = logging.getLogger("inferd.scheduling")


class Scheduler(Protocol):
    queued: bool  # requests may wait in a queue (worth watching for client disconnects)

    async def run(
        self, inputs: Tensors, rows: int, names: Names, params: Parameters, timings: Timings
    ) -> Tensors:
        """Execute one validated request (``rows``: its batch size, 0 if unbatched)."""
        ...

    async def close(self) -> None: ...


class DirectScheduler:
    """Each request is one execution, queued only behind busy instances."""

    queued = False

    def __init__(self, pool: InstancePool, stats: ModelStats) -> None:
        self.pool = pool
        self.stats = stats

    async def run(
        self, inputs: Tensors, rows: int, names: Names, params: Parameters, timings: Timings
    ) -> Tensors:
        check_request_parameters(params)
        started = timings.queue_start_ns = time.perf_counter_ns()
        outputs, infer_ns = await self.pool.execute(inputs, names)
        ended = timings.compute_end_ns = time.perf_counter_ns()
        timings.compute_start_ns = ended - infer_ns
        self.stats.queue.add(ended - started - infer_ns)
        self.stats.record_execution(rows or 1, 1, 0, infer_ns, 0)
        return outputs

    async def close(self) -> None:
        await asyncio.to_thread(self.pool.close)


@dataclass(eq=False, slots=True)
class _Pending:
    inputs: Tensors
    rows: int
    names: Names
    key: tuple[Any, ...]  # requests with equal keys can share a batch
    future: asyncio.Future[Tensors]
    enqueued_ns: int
    level: int
    timings: Timings
    timer: asyncio.TimerHandle | None = field(default=None)


def _compat_key(inputs: Tensors, names: Names) -> tuple[Any, ...]:
    return (names, *((n, a.dtype, a.shape[1:]) for n, a in inputs.items()))


class DynamicBatcher:
    """Triton's dynamic batcher for one model version."""

    queued = True

    def __init__(
        self, name: str, pool: InstancePool, options: BatchingOptions, stats: ModelStats
    ) -> None:
        self.name = name
        self.pool = pool
        self.options = options
        self.stats = stats
        self._queues: list[deque[_Pending]] = [deque() for _ in options.policies]
        self._delayed: deque[_Pending] = deque()  # timed out with timeout_action DELAY
        self._free = pool.count  # instances not executing a batch
        self._wake = asyncio.Event()
        self._last_delivery: asyncio.Future[None] | None = None
        self._closed = False
        # Started by the first request: the batcher may be built on a loading thread.
        self._task: asyncio.Task[None] | None = None

    async def run(
        self, inputs: Tensors, rows: int, names: Names, params: Parameters, timings: Timings
    ) -> Tensors:
        if self._closed:
            raise Unavailable(f"model '{self.name}' is unloading")
        level = self.options.level_of(params, self.name)
        policy = self.options.policies[level - 1]
        timeout_ns = policy.timeout_ns(timeout_parameter_us(params))
        queue = self._queues[level - 1]
        if policy.max_queue_size and len(queue) >= policy.max_queue_size:
            _purge(queue)
            if len(queue) >= policy.max_queue_size:
                raise Unavailable(
                    f"the queue of model '{self.name}' is full (max_queue_size "
                    f"{policy.max_queue_size}, priority level {level}); retry later"
                )
        loop = asyncio.get_running_loop()
        now = timings.queue_start_ns = time.perf_counter_ns()
        entry = _Pending(
            inputs,
            rows,
            names,
            _compat_key(inputs, names),
            loop.create_future(),
            now,
            level,
            timings,
        )
        if timeout_ns:
            entry.timer = loop.call_later(timeout_ns * 1e-9, self._expire, entry, timeout_ns)
        queue.append(entry)
        if self._task is None:
            self._task = loop.create_task(self._loop(), name=f"batcher-{self.name}")
        self._wake.set()
        return await entry.future

    def _expire(self, entry: _Pending, timeout_ns: int) -> None:
        if entry.future.done():
            return
        queue = self._queues[entry.level - 1]
        if entry not in queue:
            return  # already dispatched or delayed
        queue.remove(entry)
        if self.options.policies[entry.level - 1].delay_on_timeout:
            self._delayed.append(entry)
            return
        entry.future.set_exception(
            DeadlineExceeded(
                f"request timed out after {timeout_ns // 1000} us in the queue of model "
                f"'{self.name}'"
            )
        )

    def _live(self) -> Iterator[_Pending]:
        for queue in (*self._queues, self._delayed):
            for entry in queue:
                if not entry.future.done():
                    yield entry

    def _select(self) -> tuple[list[_Pending], bool]:
        """The next batch (highest priority first) and whether more could join it."""
        chosen: list[_Pending] = []
        rows = 0
        more = False
        for entry in self._live():
            if not chosen:
                chosen.append(entry)
                rows = entry.rows
                continue
            if entry.key != chosen[0].key:
                continue
            if rows + entry.rows > self.options.max_batch_size:
                more = True
                break
            chosen.append(entry)
            rows += entry.rows
        return chosen, more

    async def _loop(self) -> None:
        while not self._closed:
            try:
                await self._step()
            except Exception as exc:  # never leave callers hanging on a dead loop
                log.exception("the batcher of model '%s' failed", self.name)
                for entry in list(self._live()):
                    entry.future.set_exception(InternalError(f"batcher failed: {exc}"))

    async def _step(self) -> None:
        options = self.options
        if self._free == 0:
            await self._wait(None)
            return
        batch, full = self._select()
        if not batch:
            await self._wait(None)
            return
        rows = sum(e.rows for e in batch)
        if not full and rows < options.target_rows and rows not in options.preferred:
            waited = time.perf_counter_ns() - batch[0].enqueued_ns
            if waited < options.max_queue_delay_ns:
                await self._wait((options.max_queue_delay_ns - waited) * 1e-9)
                return
        self._take(batch)
        self._free -= 1
        previous, self._last_delivery = self._last_delivery, None
        if options.preserve_ordering:
            self._last_delivery = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().create_task(
            self._dispatch(batch, rows, previous, self._last_delivery)
        )

    async def _wait(self, timeout_s: float | None) -> None:
        self._wake.clear()
        if timeout_s is None:
            await self._wake.wait()
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout_s)

    def _take(self, batch: list[_Pending]) -> None:
        taken = {id(e) for e in batch}
        for i, queue in enumerate(self._queues):
            self._queues[i] = deque(e for e in queue if id(e) not in taken and not e.future.done())
        self._delayed = deque(
            e for e in self._delayed if id(e) not in taken and not e.future.done()
        )
        for entry in batch:
            if entry.timer is not None:
                entry.timer.cancel()

    async def _dispatch(
        self,
        batch: list[_Pending],
        rows: int,
        previous: asyncio.Future[None] | None,
        delivered: asyncio.Future[None] | None,
    ) -> None:
        started = time.perf_counter_ns()
        for entry in batch:
            self.stats.queue.add(started - entry.enqueued_ns)
            entry.timings.compute_start_ns = started
        try:
            if len(batch) == 1:
                inputs = batch[0].inputs
            else:
                inputs = {
                    n: np.concatenate([e.inputs[n] for e in batch], axis=0) for n in batch[0].inputs
                }
            assembled = time.perf_counter_ns()
            outputs, infer_ns = await self.pool.execute(inputs, batch[0].names)
            split_started = time.perf_counter_ns()
            for entry in batch:
                entry.timings.compute_end_ns = split_started
            parts = self._split(outputs, batch, rows)
            if previous is not None:
                await asyncio.shield(previous)
            for entry, part in zip(batch, parts, strict=True):
                if not entry.future.done():
                    entry.future.set_result(part)
            self.stats.record_execution(
                rows,
                len(batch),
                assembled - started,
                infer_ns,
                time.perf_counter_ns() - split_started,
            )
        except Exception as exc:
            for entry in batch:
                if not entry.future.done():
                    entry.future.set_exception(exc)
        finally:
            if delivered is not None and not delivered.done():
                delivered.set_result(None)
            self._free += 1
            self._wake.set()

    def _split(self, outputs: Tensors, batch: list[_Pending], rows: int) -> list[Tensors]:
        for name, array in outputs.items():
            if array.ndim == 0 or array.shape[0] != rows:
                got = array.shape[0] if array.ndim else "a scalar"
                raise InternalError(
                    f"model '{self.name}' returned output '{name}' with batch size {got} "
                    f"for a batch of {rows} rows"
                )
        if len(batch) == 1:
            return [outputs]
        parts = []
        offset = 0
        for entry in batch:
            end = offset + entry.rows
            parts.append({n: a[offset:end] for n, a in outputs.items()})
            offset = end
        return parts

    async def close(self) -> None:
        """Serve what is queued, then stop the loop and the instances."""
        while any(True for _ in self._live()) or self._free < self.pool.count:
            self._wake.set()
            await asyncio.sleep(0.005)
        self._closed = True
        self._wake.set()
        if self._task is not None:
            await self._task
        await asyncio.to_thread(self.pool.close)


def _purge(queue: deque[_Pending]) -> None:
    for entry in [e for e in queue if e.future.done()]:
        queue.remove(entry)
