"""Schedulers: direct (one request, one execution) and the dynamic batcher.

The dynamic batcher owns the queue (per priority level), timeouts, and the choice of which
compatible requests (same requested outputs, input datatypes and shapes past the batch
dimension) form one batch. It hands the batch to an instance as a list of Work, each request
with its id and parameters; the instance assembles and splits it (``backends.work``), off
the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from inferd.backends.work import CANCELLED, Executed, Work, batch_key
from inferd.core.errors import DeadlineExceeded, InferdError, InternalError, Unavailable
from inferd.core.stats import ModelStats
from inferd.core.types import Tensors, Timings
from inferd.scheduling.instances import Instances
from inferd.scheduling.policy import BatchingOptions, check_request_parameters, timeout_parameter_us

log = logging.getLogger("inferd.scheduling")


class DirectScheduler:
    """Each request is one execution, queued only behind busy instances."""

    def __init__(self, pool: Instances, stats: ModelStats) -> None:
        self.pool = pool
        self.stats = stats

    async def run(self, work: Work, timings: Timings) -> Tensors:
        if work.parameters:  # mostly none at all
            check_request_parameters(work.parameters)
        started = timings.queue_start_ns = time.perf_counter_ns()
        executed = self.pool.try_inline(work)
        if executed is None:
            executed = await self.pool.submit([work])
        return self._answer(work, timings, started, executed)

    def run_now(
        self, work: Work, timings: Timings, execute: Callable[[list[Work]], Executed]
    ) -> Tensors:
        """``run`` with ``execute`` in place of the instances' queue (an instance the calling
        thread claimed): the same checks and statistics, on the calling thread, no waiting."""
        check_request_parameters(work.parameters)
        started = timings.queue_start_ns = time.perf_counter_ns()
        return self._answer(work, timings, started, execute([work]))

    def _answer(self, work: Work, timings: Timings, started: int, executed: Executed) -> Tensors:
        ended = timings.compute_end_ns = time.perf_counter_ns()
        result = executed.results[0]
        if isinstance(result, InferdError):
            raise result
        input_ns, infer_ns, output_ns = executed.input_ns, executed.infer_ns, executed.output_ns
        compute_ns = input_ns + infer_ns + output_ns
        timings.compute_start_ns = ended - compute_ns
        self.stats.log_execution(
            work.rows, ended - started - compute_ns, input_ns, infer_ns, output_ns, ended
        )
        return result

    async def close(self) -> None:
        await self.pool.close()


@dataclass(eq=False, slots=True)
class _Pending:
    work: Work
    rows: int
    key: tuple[Any, ...]  # requests with equal keys can share a batch
    future: asyncio.Future[Tensors]
    enqueued_ns: int
    level: int
    timings: Timings
    timer: asyncio.TimerHandle | None = field(default=None)


@dataclass(eq=False, slots=True)
class _Batch:
    entries: list[_Pending]
    rows: int
    started_ns: int
    ended_ns: int = 0
    executed: Executed | None = None
    error: BaseException | None = None


class DynamicBatcher:
    """Triton's dynamic batcher for one model version.

    Scheduling is synchronous: a request's arrival, a batch's completion and the end of the
    queue delay each decide at once what goes out, so the next batch reaches an instance before
    the answers of the last one are handed back (no bubble while the loop encodes them). A
    batch that cannot grow any more may wait in an instance's queue behind the one executing
    (pipeline depth 2), so the instance starts it without waiting for the event loop.
    """

    PIPELINE_DEPTH = 2  # batches per instance, executing or queued

    def __init__(
        self, name: str, pool: Instances, options: BatchingOptions, stats: ModelStats
    ) -> None:
        self.name = name
        self.pool = pool
        self.options = options
        self.stats = stats
        self._queues: list[deque[_Pending]] = [deque() for _ in options.policies]
        self._delayed: deque[_Pending] = deque()  # timed out with timeout_action DELAY
        self._queued_rows = 0  # an upper bound: rows of entries still in the queues
        self._in_flight: deque[_Batch] = deque()  # submitted, not yet delivered, in order
        self._timer: asyncio.TimerHandle | None = None  # the oldest request's queue delay
        self._closed = False
        # Read on every arrival: a request with neither a priority nor a timeout parameter
        # (the usual one) takes the default level's policy without parsing parameters.
        self._default_level = max(options.default_level, 1)
        self._default_policy = options.policies[self._default_level - 1]
        self._default_timeout_ns = self._default_policy.timeout_ns(None)
        self._target_rows = options.target_rows
        self._first_ship_rows = options.first_ship_rows
        # Told when the default level's queue turns full (True) and when it stops being full
        # (the model host shows it to the frontends: ``workers.queues``).
        self.on_queue: Callable[[bool], None] | None = None
        self._told_full = False

    @property
    def queue_limited(self) -> bool:
        """Whether ``queue_full`` can ever answer: the default level's queue has a limit."""
        return self.options.policies[max(self.options.default_level, 1) - 1].max_queue_size > 0

    def queue_full(self) -> Unavailable | None:
        """The error a request at the default priority would get now, if its queue is full:
        frontends ask before they read and decode a request body."""
        level = max(self.options.default_level, 1)
        policy = self.options.policies[level - 1]
        queue = self._queues[level - 1]
        if not policy.max_queue_size or len(queue) < policy.max_queue_size:
            return None
        _purge(queue)
        if len(queue) < policy.max_queue_size:
            return None
        return self.full_error()

    def full_error(self) -> Unavailable:
        """What a request at the default priority gets while its queue is full."""
        level = max(self.options.default_level, 1)
        return Unavailable(
            f"the queue of model '{self.name}' is full (max_queue_size "
            f"{self.options.policies[level - 1].max_queue_size}, priority level {level}); "
            "retry later"
        )

    async def run(self, work: Work, timings: Timings) -> Tensors:
        if self._closed:
            raise Unavailable(f"model '{self.name}' is unloading")
        parameters = work.parameters
        if "priority" in parameters or "timeout" in parameters:
            level = self.options.level_of(parameters, self.name)
            policy = self.options.policies[level - 1]
            timeout_ns = policy.timeout_ns(timeout_parameter_us(parameters))
        else:
            level = self._default_level
            policy = self._default_policy
            timeout_ns = self._default_timeout_ns
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
            work,
            work.rows,
            batch_key(work),
            loop.create_future(),
            now,
            level,
            timings,
        )
        if timeout_ns:
            entry.timer = loop.call_later(timeout_ns * 1e-9, self._expire, entry, timeout_ns)
        queue.append(entry)
        rows = self._queued_rows = self._queued_rows + entry.rows
        if self.on_queue is not None:
            self._tell_queue()
        # Most arrivals cannot send a batch out: with every instance busy, only a batch that
        # cannot grow goes (to an instance's queue); with one idle and the queue delay's timer
        # set, only a batch of a preferred size or more. Skipping ``_schedule`` then spares a
        # walk over the whole queue per arrival (``_queued_rows`` is an upper bound).
        if len(self._in_flight) >= self.pool.count:
            if rows >= self._target_rows:
                self._schedule()
        elif self._timer is None or rows >= self._first_ship_rows:
            self._schedule()
        try:
            return await entry.future
        except asyncio.CancelledError:  # the caller left (a client gone, a deadline)
            work.cancelled = True  # if an instance already holds it, it is not executed
            if self.on_queue is not None:
                self._tell_queue()
            raise

    def _tell_queue(self) -> None:
        """Call ``on_queue`` if the default level's queue turned full or stopped being so."""
        full = self.queue_full() is not None
        if full != self._told_full and self.on_queue is not None:
            self._told_full = full
            self.on_queue(full)

    def _expire(self, entry: _Pending, timeout_ns: int) -> None:
        if entry.future.done():
            return
        queue = self._queues[entry.level - 1]
        if entry not in queue:
            return  # already dispatched or delayed
        queue.remove(entry)
        if self.on_queue is not None:
            self._tell_queue()
        if self.options.policies[entry.level - 1].delay_on_timeout:
            self._delayed.append(entry)
            return
        self._queued_rows -= entry.rows
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
        key: tuple[Any, ...] = ()
        most = self.options.max_batch_size
        for queue in (*self._queues, self._delayed) if self._delayed else self._queues:
            for entry in queue:
                if entry.future.done():
                    continue
                if not chosen:
                    chosen.append(entry)
                    rows = entry.rows
                    key = entry.key
                    continue
                if entry.key != key:
                    continue
                if rows + entry.rows > most:
                    return chosen, True
                chosen.append(entry)
                rows += entry.rows
        return chosen, False

    def _schedule(self) -> None:
        """Send out every batch that should go now; arm the queue-delay timer for the rest."""
        try:
            self._dispatch_ready()
        except Exception as exc:  # never leave callers hanging on a broken batcher
            log.exception("the batcher of model '%s' failed", self.name)
            for entry in list(self._live()):
                entry.future.set_exception(InternalError(f"batcher failed: {exc}"))

    def _dispatch_ready(self) -> None:
        options = self.options
        count = self.pool.count
        while len(self._in_flight) < count * self.PIPELINE_DEPTH:
            batch, full = self._select()
            if not batch:
                self._queued_rows = 0
                return
            rows = sum(e.rows for e in batch)
            complete = full or rows >= options.target_rows
            if len(self._in_flight) >= count:
                # Every instance is busy: only a batch that cannot grow waits in an instance's
                # queue, and only when nothing could overtake or expire it there (priority
                # levels, queue timeouts): those decisions belong to the batcher's queue.
                if not complete or options.priority_levels > 1:
                    return
                if any(e.timer is not None for e in batch):
                    return
            elif not complete and rows not in options.preferred:
                waited = time.perf_counter_ns() - batch[0].enqueued_ns
                if waited < options.max_queue_delay_ns:
                    self._arm((options.max_queue_delay_ns - waited) * 1e-9)
                    return
            self._submit(batch, rows)

    def _arm(self, delay_s: float) -> None:
        if self._timer is not None:
            return
        # Whole milliseconds, rounded up: uvloop's timers count milliseconds and round a
        # shorter delay down to none, so a batch waiting out its last half millisecond would
        # re-arm a timer that fires at once, every loop iteration, burning the CPU that the
        # instances (and other serving processes) need. asyncio's own loop rounds up too.
        delay_s = math.ceil(delay_s * 1000.0) / 1000.0
        self._timer = asyncio.get_running_loop().call_later(delay_s, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._schedule()

    def _submit(self, entries: list[_Pending], rows: int) -> None:
        self._take(entries)
        batch = _Batch(entries, rows, time.perf_counter_ns())
        self._in_flight.append(batch)
        try:
            future = self.pool.submit([e.work for e in entries])
        except Exception as exc:
            batch.error = exc
            self._in_flight.remove(batch)
            self._answer(batch)
            return
        future.add_done_callback(lambda f: self._executed(batch, f))

    def _executed(self, batch: _Batch, future: asyncio.Future[Executed]) -> None:
        if future.cancelled():
            batch.error = Unavailable(f"model '{self.name}' is unloading")
        elif future.exception() is not None:
            batch.error = future.exception()
        else:
            batch.executed = future.result()
        batch.ended_ns = time.perf_counter_ns()
        if not self.options.preserve_ordering:
            self._in_flight.remove(batch)
            self._schedule()  # the next batch goes out before these answers are handed back
            self._answer(batch)
            return
        self._schedule()
        self._deliver()

    def _deliver(self) -> None:
        """Answer finished batches in the order they went out (preserve_ordering)."""
        while self._in_flight and (
            self._in_flight[0].executed is not None or self._in_flight[0].error is not None
        ):
            self._answer(self._in_flight.popleft())

    def _answer(self, batch: _Batch) -> None:
        """Hand each request its result; a request's queue time is its time in the server
        less its batch's execution (which includes any wait behind the instance's last one)."""
        executed = batch.executed
        ended = batch.ended_ns or time.perf_counter_ns()
        compute_ns = executed.input_ns + executed.infer_ns + executed.output_ns if executed else 0
        started = ended - compute_ns
        for entry in batch.entries:
            timings = entry.timings
            timings.compute_start_ns = started
            timings.compute_end_ns = ended
        entries = batch.entries
        requests = sum(entry.work.requests for entry in entries)
        if requests == len(entries):
            self.stats.log_queue([started - entry.enqueued_ns for entry in entries])
        else:  # works that stand for several requests: each request counts
            self.stats.log_queue(
                [started - e.enqueued_ns for e in entries for _ in range(e.work.requests)]
            )
        if executed is None:
            error = batch.error or InternalError("the batch produced no result")
            for entry in batch.entries:
                if not entry.future.done():
                    entry.future.set_exception(error)
            return
        rows = 0
        for entry, result in zip(batch.entries, executed.results, strict=True):
            if result is CANCELLED:
                continue
            rows += entry.rows
            if entry.future.done():
                continue
            if isinstance(result, InferdError):
                entry.future.set_exception(result)
            else:
                entry.future.set_result(result)
        if not rows:
            return  # nothing of the batch ran
        self.stats.record_execution(
            rows,
            requests,
            executed.input_ns,
            executed.infer_ns,
            executed.output_ns,
        )

    def _take(self, batch: list[_Pending]) -> None:
        queues = self._queues
        if len(queues) == 1 and not self._delayed:  # one level: the batch is mostly its head
            queue = queues[0]
            for entry in batch:
                if queue and queue[0] is entry:
                    queue.popleft()
                else:
                    queue.remove(entry)
                if entry.timer is not None:
                    entry.timer.cancel()
            rows = 0
            stale = False  # requests whose callers left while queued
            for entry in queue:
                if entry.future.done():
                    stale = True
                else:
                    rows += entry.rows
            if stale:
                queues[0] = deque(e for e in queue if not e.future.done())
            self._queued_rows = rows
            if self.on_queue is not None:
                self._tell_queue()
            return
        taken = {id(e) for e in batch}
        for i, queue in enumerate(queues):
            queues[i] = deque(e for e in queue if id(e) not in taken and not e.future.done())
        self._delayed = deque(
            e for e in self._delayed if id(e) not in taken and not e.future.done()
        )
        self._queued_rows = sum(e.rows for q in (*queues, self._delayed) for e in q)
        for entry in batch:
            if entry.timer is not None:
                entry.timer.cancel()
        if self.on_queue is not None:
            self._tell_queue()

    async def close(self) -> None:
        """Serve what is queued, then stop the instances."""
        while any(True for _ in self._live()) or self._in_flight:
            self._schedule()
            await asyncio.sleep(0.005)
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        await self.pool.close()


def _purge(queue: deque[_Pending]) -> None:
    for entry in [e for e in queue if e.future.done()]:
        queue.remove(entry)
