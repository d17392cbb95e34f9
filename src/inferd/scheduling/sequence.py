"""The sequence batcher (Triton's ``sequence_batching``) for stateful models.

Requests carry a sequence id and start/end flags. A sequence starts with ``sequence_start``
and takes a batch slot until it ends or stays idle past ``max_sequence_idle_microseconds``;
while all slots are taken, new sequences wait. One request of a sequence runs at a time, in
arrival order. Ready requests of different sequences form batches: under ``direct`` each
sequence is pinned to one instance and batches hold that instance's sequences (sent when
``minimum_slot_utilization`` of its sequences are ready, or after the queue delay); under
``oldest`` the oldest sequences' requests batch on any instance (sent at the preferred batch
size, or after the queue delay). The batcher feeds the control inputs and keeps each
sequence's implicit state between its requests.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

from inferd.backends.work import SEQUENCE_END, SEQUENCE_START, Executed, Work
from inferd.core.errors import InferdError, InvalidInput, Unavailable
from inferd.core.stats import ModelStats
from inferd.core.types import Tensors, Timings
from inferd.scheduling.instances import Instances
from inferd.scheduling.policy import check_request_parameters
from inferd.scheduling.sequence_options import SequenceId, SequenceOptions, sequence_parameters

_RELEASED_KEPT = 4096  # ids of sequences released as idle, remembered for a clear error


@dataclass(eq=False)
class _Sequence:
    corr_id: SequenceId
    order: int  # start order: the oldest strategy batches the oldest first
    instance: int | None  # direct: the instance it is pinned to
    state: Tensors = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    waiting: int = 0  # requests holding or waiting for the lock
    idle: asyncio.TimerHandle | None = None
    released: bool = False


@dataclass(eq=False, slots=True)
class _Ready:
    sequence: _Sequence
    work: Work
    future: asyncio.Future[tuple[Executed, int]]
    key: tuple[Any, ...]


class SequenceBatcher:
    def __init__(
        self, name: str, pool: Instances, options: SequenceOptions, stats: ModelStats
    ) -> None:
        self.name = name
        self.pool = pool
        self.options = options
        self.stats = stats
        slots_per_instance = max(options.max_batch_size, 1)
        slots = pool.count * slots_per_instance
        if options.oldest and options.max_candidate_sequences:
            slots = options.max_candidate_sequences
        self._slots = asyncio.Semaphore(slots)
        self._sequences: dict[SequenceId, _Sequence] = {}
        self._released: collections.OrderedDict[SequenceId, None] = collections.OrderedDict()
        self._pinned = [0] * pool.count  # direct: live sequences per instance
        self._ready: list[_Ready] = []
        self._flush: asyncio.TimerHandle | asyncio.Handle | None = None
        self._order = itertools.count()
        self._closed = False

    async def run(self, work: Work, timings: Timings) -> Tensors:
        check_request_parameters(work.parameters)
        corr_id, start, end = sequence_parameters(work.parameters)
        if work.rows > 1:
            raise InvalidInput(
                f"inference request to model '{self.name}' must specify batch-size 1 due to "
                f"requirements of sequence batcher (got {work.rows})"
            )
        work.correlation_id = corr_id
        work.flags = (SEQUENCE_START if start else 0) | (SEQUENCE_END if end else 0)
        while True:
            sequence = self._sequences.get(corr_id)
            if sequence is None or sequence.released:
                if not start:
                    raise InvalidInput(self._unknown(corr_id))
                sequence = await self._begin(corr_id)
            outputs = await self._in_turn(sequence, work, start, end, timings)
            if outputs is not None:
                return outputs
            # The sequence ended or expired while this request waited, and this one starts it.

    async def _in_turn(
        self, sequence: _Sequence, work: Work, start: bool, end: bool, timings: Timings
    ) -> Tensors | None:
        """Run ``work`` when the sequence's earlier requests are done; None when the sequence
        was released meanwhile and ``work`` starts a new one."""
        sequence.waiting += 1
        if sequence.idle is not None:
            sequence.idle.cancel()
            sequence.idle = None
        try:
            async with sequence.lock:
                if sequence.released:
                    if start:
                        return None
                    raise InvalidInput(self._unknown(sequence.corr_id))
                if start:  # a new start restarts the sequence's state
                    sequence.state = self.options.initial_state(work.rows)
                return await self._execute(sequence, work, start, end, timings)
        finally:
            sequence.waiting -= 1
            if end and not sequence.released:
                self._release(sequence)
            elif not sequence.released and sequence.waiting == 0:
                loop = asyncio.get_running_loop()
                sequence.idle = loop.call_later(
                    self.options.max_sequence_idle_us / 1e6, self._expire, sequence
                )

    def _unknown(self, corr_id: SequenceId) -> str:
        if corr_id in self._released:
            idle_us = self.options.max_sequence_idle_us
            return (
                f"sequence {corr_id!r} of model '{self.name}' was released after more than "
                f"{idle_us} µs idle (max_sequence_idle_microseconds); start it again"
            )
        return (
            f"inference request for sequence {corr_id!r} to model '{self.name}' must specify "
            "the START flag on the first request of the sequence"
        )

    async def _begin(self, corr_id: SequenceId) -> _Sequence:
        if self._closed:
            raise Unavailable(f"model '{self.name}' is unloading")
        await self._slots.acquire()
        existing = self._sequences.get(corr_id)
        if existing is not None and not existing.released:  # started meanwhile
            self._slots.release()
            return existing
        instance = None
        if not self.options.oldest:
            instance = min(range(self.pool.count), key=self._pinned.__getitem__)
            self._pinned[instance] += 1
        sequence = _Sequence(corr_id, next(self._order), instance)
        self._sequences[corr_id] = sequence
        self._released.pop(corr_id, None)
        return sequence

    def _release(self, sequence: _Sequence) -> None:
        sequence.released = True
        sequence.state = {}
        if sequence.idle is not None:
            sequence.idle.cancel()
        if self._sequences.get(sequence.corr_id) is sequence:
            del self._sequences[sequence.corr_id]
        if sequence.instance is not None:
            self._pinned[sequence.instance] -= 1
        self._slots.release()

    def _expire(self, sequence: _Sequence) -> None:
        sequence.idle = None
        if sequence.released or sequence.waiting:
            return
        self._release(sequence)
        self._released[sequence.corr_id] = None
        while len(self._released) > _RELEASED_KEPT:
            self._released.popitem(last=False)

    async def _execute(
        self, sequence: _Sequence, work: Work, start: bool, end: bool, timings: Timings
    ) -> Tensors:
        options = self.options
        work.inputs = {
            **work.inputs,
            **options.feed(work.rows, sequence.corr_id, start, end, sequence.state),
        }
        state_outputs = tuple(s.output_name for s in options.states)
        asked = work.outputs
        work.outputs = asked + tuple(n for n in state_outputs if n not in asked)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[tuple[Executed, int]] = loop.create_future()
        key = (work.outputs, *((n, a.dtype, a.shape[1:]) for n, a in work.inputs.items()))
        started = timings.queue_start_ns = time.perf_counter_ns()
        self._ready.append(_Ready(sequence, work, future, key))
        self._schedule()
        executed, index = await future
        ended = timings.compute_end_ns = time.perf_counter_ns()
        result = executed.results[index]
        if isinstance(result, InferdError):
            raise result
        compute_ns = executed.input_ns + executed.infer_ns + executed.output_ns
        timings.compute_start_ns = ended - compute_ns
        self.stats.log_queue([max(ended - started - compute_ns, 0)])
        for spec in options.states:
            sequence.state[spec.input_name] = result[spec.output_name]
        return {n: result[n] for n in asked}

    # ------------------------------------------------------------------ batch formation

    def _schedule(self) -> None:
        """Send the groups that are full now; the rest after the queue delay (or at once)."""
        delay_us = self.options.max_queue_delay_us
        loop = asyncio.get_running_loop()
        if delay_us == 0:
            if self._flush is None:  # what arrives in this loop turn batches together
                self._flush = loop.call_soon(self._send_all)
            return
        for group in self._groups():
            if self._full(group):
                self._send(group)
        if self._ready and self._flush is None:
            self._flush = loop.call_later(delay_us / 1e6, self._send_all)

    def _groups(self) -> list[list[_Ready]]:
        """Ready requests that may share one execution, oldest sequence first."""
        ordered = sorted(self._ready, key=lambda r: r.sequence.order)
        groups: dict[tuple[Any, ...], list[_Ready]] = {}
        for ready in ordered:
            groups.setdefault((ready.sequence.instance, ready.key), []).append(ready)
        return list(groups.values())

    def _full(self, group: list[_Ready]) -> bool:
        options = self.options
        limit = max(options.max_batch_size, 1)
        if options.oldest:
            return len(group) >= (options.preferred_batch_size or limit)
        instance = group[0].sequence.instance
        live = self._pinned[instance] if instance is not None else len(group)
        return len(group) >= limit or len(group) >= options.minimum_slot_utilization * live > 0

    def _send_all(self) -> None:
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        for group in self._groups():
            self._send(group)

    def _send(self, group: list[_Ready]) -> None:
        limit = max(self.options.max_batch_size, 1)
        for first in range(0, len(group), limit):
            chunk = group[first : first + limit]
            taken = {id(r) for r in chunk}
            self._ready = [r for r in self._ready if id(r) not in taken]
            self._submit(chunk)
        if not self._ready and self._flush is not None:
            self._flush.cancel()
            self._flush = None

    def _submit(self, chunk: list[_Ready]) -> None:
        batch = [r.work for r in chunk]
        try:
            future = self.pool.submit(batch, instance=chunk[0].sequence.instance)
        except InferdError as exc:
            for ready in chunk:
                if not ready.future.done():
                    ready.future.set_exception(exc)
            return

        def deliver(done: asyncio.Future[Executed]) -> None:
            if done.cancelled():
                error: BaseException = Unavailable(f"model '{self.name}' stopped the batch")
            elif done.exception() is not None:
                error = done.exception()  # type: ignore[assignment]
            else:
                executed = done.result()
                rows = sum(w.rows or 1 for w in batch)
                self.stats.record_execution(
                    rows, len(batch), executed.input_ns, executed.infer_ns, executed.output_ns
                )
                for index, ready in enumerate(chunk):
                    if not ready.future.done():
                        ready.future.set_result((executed, index))
                return
            for ready in chunk:
                if not ready.future.done():
                    ready.future.set_exception(error)

        future.add_done_callback(deliver)

    async def close(self) -> None:
        self._closed = True
        self._send_all()
        for sequence in list(self._sequences.values()):
            if sequence.idle is not None:
                sequence.idle.cancel()
        await self.pool.close()
