"""Per model-version statistics in Triton's shape: request outcomes, time spent, batch sizes.

``ModelStats`` is the live, mutable counter set a version updates; ``ModelStatistics`` is the
frozen snapshot the data plane hands out (its field names are Triton's statistics extension,
so an adapter encodes it field by field). Durations are nanoseconds. Per-request figures
(queue, compute_*) add each request's share of its batch, as Triton does; ``batch_stats``
counts executions per batch size.
"""

from __future__ import annotations

import threading
import time
from array import array
from bisect import bisect_left
from dataclasses import dataclass, field

import numpy as np

# Histogram bucket upper bounds for every duration, in seconds (Prometheus ``le``).
BUCKETS_S: tuple[float, ...] = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
_BOUNDS_NS = tuple(int(b * 1e9) for b in BUCKETS_S)


@dataclass(slots=True)
class Duration:
    """A count, a total and a histogram of durations (one bisect per observation)."""

    count: int = 0
    ns: int = 0
    buckets: list[int] = field(default_factory=lambda: [0] * (len(_BOUNDS_NS) + 1))

    def add(self, ns: int) -> None:
        """One observation."""
        self.count += 1
        self.ns += ns
        self.buckets[bisect_left(_BOUNDS_NS, ns)] += 1

    def add_each(self, ns: int, count: int) -> None:
        """``count`` observations of ``ns`` each (the requests of one batch)."""
        self.count += count
        self.ns += ns * count
        self.buckets[bisect_left(_BOUNDS_NS, ns)] += count

    def snapshot(self) -> StatDuration:
        return StatDuration(self.count, self.ns)


@dataclass(slots=True)
class Total:
    """A count and a total, without a histogram (per-batch-size figures)."""

    count: int = 0
    ns: int = 0

    def add(self, ns: int) -> None:
        self.count += 1
        self.ns += ns

    def snapshot(self) -> StatDuration:
        return StatDuration(self.count, self.ns)


@dataclass(slots=True)
class BatchStat:
    compute_input: Total = field(default_factory=Total)
    compute_infer: Total = field(default_factory=Total)
    compute_output: Total = field(default_factory=Total)


# Hot-path observations wait in a log and are added up together (numpy) when anything reads
# the figures, or once this many have gathered.
FLUSH_AT = 512
# A logged execution: rows, queue_ns, input_ns, infer_ns, output_ns, ended (perf_counter ns).
EXECUTION_FIELDS = 6
_BOUNDS = np.array(_BOUNDS_NS, dtype=np.int64)


class ModelStats:
    """A version's live figures. Readers use the attributes as they are; the request path
    logs its observations with ``log_execution`` / ``log_success`` / ``log_queue`` (an array
    append, where updating seven counters and histograms cost more than a small model's call)
    and every read of a logged figure first adds up what the log holds. Writers never read
    through those properties (``record_execution`` neither): a read would add up the log on
    the request path. The log is appended to on the event
    loop and may be read from another thread (the metrics port): appending to the log, copying
    its start and deleting that start are each one C call under the GIL, so nothing is lost;
    adding up holds a lock."""

    __slots__ = (
        "_batches",
        "_compute_infer",
        "_compute_input",
        "_compute_output",
        "_execution_count",
        "_executions",
        "_inference_count",
        "_last_inference_ms",
        "_lock",
        "_queue",
        "_queued",
        "_success",
        "_successes",
        "cache_hit",
        "cache_miss",
        "fail",
        "pending",
    )

    def __init__(self) -> None:
        self._success = Duration()
        self.fail = Duration()  # not logged: failures and cache look-ups update at once
        self._queue = Duration()
        self._compute_input = Duration()
        self._compute_infer = Duration()
        self._compute_output = Duration()
        self.cache_hit = Duration()
        self.cache_miss = Duration()
        self.pending = 0  # requests inside the model version right now
        self._inference_count = 0  # rows inferred (a batch of 8 rows counts 8)
        self._execution_count = 0  # model executions (one per batch)
        self._last_inference_ms = 0
        self._batches: dict[int, BatchStat] = {}
        # EXECUTION_FIELDS per execution of one request; the ns of each successful request.
        self._executions = array("q")
        self._successes = array("q")
        self._queued = array("q")  # the queue ns of requests a batcher answered
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ the request path

    def log_execution(
        self, rows: int, queue_ns: int, input_ns: int, infer_ns: int, output_ns: int, ended_ns: int
    ) -> None:
        """One request executed alone (``rows`` rows; 0 counts as 1), ended at ``ended_ns``
        (``time.perf_counter_ns``): as ``queue.add`` and ``record_execution`` together."""
        self._executions.extend((rows or 1, queue_ns, input_ns, infer_ns, output_ns, ended_ns))
        if len(self._executions) >= FLUSH_AT * EXECUTION_FIELDS:
            self.flush()

    def log_answer(self, rows: int, infer_ns: int, ended_ns: int, success_ns: int) -> None:
        """One request executed alone on the event loop (nothing queued, assembled or split)
        and answered in ``success_ns``: as ``log_execution`` and ``log_success`` together."""
        self._executions.extend((rows or 1, 0, 0, infer_ns, 0, ended_ns))
        successes = self._successes
        successes.append(success_ns)
        if len(successes) >= FLUSH_AT:  # (the executions' log grows no faster: flushed too)
            self.flush()

    def log_queue(self, ns: list[int]) -> None:
        """Requests' times in a batcher's queue (a batch's, or one): as ``queue.add`` for
        each."""
        self._queued.extend(ns)
        if len(self._queued) >= FLUSH_AT:
            self.flush()

    def log_success(self, ns: int) -> None:
        """One request answered in ``ns``: as ``success.add``."""
        self._successes.append(ns)
        if len(self._successes) >= FLUSH_AT:
            self.flush()

    def flush(self) -> None:
        """Add up the logged observations."""
        if not (self._executions or self._successes or self._queued):
            return
        with self._lock:
            successes = drain_log(self._successes)
            if len(successes):
                merge_log(self._success, successes)
            queued = drain_log(self._queued)
            if len(queued):
                merge_log(self._queue, queued)
            executions = drain_log(self._executions)
            if len(executions):
                self._add_executions(executions.reshape(-1, EXECUTION_FIELDS))

    def _add_executions(self, table: np.ndarray) -> None:
        sizes, queue_ns, parts, ended_ns = table[:, 0], table[:, 1], table[:, 2:5], table[:, 5]
        merge_log(self._queue, queue_ns)
        for column, each in enumerate(
            (self._compute_input, self._compute_infer, self._compute_output)
        ):
            merge_log(each, parts[:, column])
        self._execution_count += len(table)
        self._inference_count += int(sizes.sum())
        ago_ns = time.perf_counter_ns() - int(ended_ns.max())
        last_ms = (time.time_ns() - ago_ns) // 1_000_000
        self._last_inference_ms = max(self._last_inference_ms, last_ms)
        # Not np.unique: its first call imports numpy.ma (16 ms, here on the event loop).
        for size in sorted(set(sizes.tolist())):
            chosen = parts[sizes == size]
            stat = self._batches.get(size)
            if stat is None:
                stat = self._batches[size] = BatchStat()
            for column, total in enumerate(
                (stat.compute_input, stat.compute_infer, stat.compute_output)
            ):
                total.count += len(chosen)
                total.ns += int(chosen[:, column].sum())

    # ------------------------------------------------------------------ the figures

    @property
    def success(self) -> Duration:
        self.flush()
        return self._success

    @property
    def queue(self) -> Duration:
        self.flush()
        return self._queue

    @property
    def compute_input(self) -> Duration:
        self.flush()
        return self._compute_input

    @property
    def compute_infer(self) -> Duration:
        self.flush()
        return self._compute_infer

    @property
    def compute_output(self) -> Duration:
        self.flush()
        return self._compute_output

    @property
    def inference_count(self) -> int:
        self.flush()
        return self._inference_count

    @property
    def execution_count(self) -> int:
        self.flush()
        return self._execution_count

    @property
    def last_inference_ms(self) -> int:
        self.flush()
        return self._last_inference_ms

    @property
    def batches(self) -> dict[int, BatchStat]:
        self.flush()
        return self._batches

    def record_execution(
        self, batch_size: int, requests: int, input_ns: int, infer_ns: int, output_ns: int
    ) -> None:
        """One execution of ``batch_size`` rows on behalf of ``requests`` requests (sums, so
        the log need not be added up first)."""
        self._execution_count += 1
        self._inference_count += batch_size
        self._last_inference_ms = time.time_ns() // 1_000_000
        stat = self._batches.get(batch_size)
        if stat is None:
            stat = self._batches[batch_size] = BatchStat()
        stat.compute_input.add(input_ns)
        stat.compute_infer.add(infer_ns)
        stat.compute_output.add(output_ns)
        self._compute_input.add_each(input_ns, requests)
        self._compute_infer.add_each(infer_ns, requests)
        self._compute_output.add_each(output_ns, requests)

    def snapshot(self, name: str, version: str) -> ModelStatistics:
        """A frozen copy of the figures, as Triton's statistics extension reports them."""
        return ModelStatistics(
            name=name,
            version=version,
            last_inference=self.last_inference_ms,
            inference_count=self.inference_count,
            execution_count=self.execution_count,
            inference_stats=InferStatistics(
                success=self.success.snapshot(),
                fail=self.fail.snapshot(),
                queue=self.queue.snapshot(),
                compute_input=self.compute_input.snapshot(),
                compute_infer=self.compute_infer.snapshot(),
                compute_output=self.compute_output.snapshot(),
                cache_hit=self.cache_hit.snapshot(),
                cache_miss=self.cache_miss.snapshot(),
            ),
            batch_stats=tuple(
                BatchStatistics(
                    batch_size=size,
                    compute_input=stat.compute_input.snapshot(),
                    compute_infer=stat.compute_infer.snapshot(),
                    compute_output=stat.compute_output.snapshot(),
                )
                for size, stat in sorted(self.batches.items())
            ),
        )


# --------------------------------------------------------------------------- snapshots


@dataclass(frozen=True, slots=True)
class StatDuration:
    count: int
    ns: int


@dataclass(frozen=True, slots=True)
class InferStatistics:
    success: StatDuration
    fail: StatDuration
    queue: StatDuration
    compute_input: StatDuration
    compute_infer: StatDuration
    compute_output: StatDuration
    cache_hit: StatDuration
    cache_miss: StatDuration


@dataclass(frozen=True, slots=True)
class BatchStatistics:
    batch_size: int
    compute_input: StatDuration
    compute_infer: StatDuration
    compute_output: StatDuration


@dataclass(frozen=True, slots=True)
class ModelStatistics:
    """One version's statistics (Triton's ``ModelStatistics``; ``last_inference`` in ms)."""

    name: str
    version: str
    last_inference: int
    inference_count: int
    execution_count: int
    inference_stats: InferStatistics
    batch_stats: tuple[BatchStatistics, ...]


def drain_log(log: array[int]) -> np.ndarray:
    """What the log holds now, taken out (appends from another thread land after)."""
    taken = log[: len(log)]  # one C call each: a copy of the start, then its removal
    del log[: len(taken)]
    return np.frombuffer(taken, dtype=np.int64)


def merge_log(into: Duration, values: np.ndarray) -> None:
    """Add observations at once: the count, the total and the histogram (``bisect_left``)."""
    into.count += len(values)
    into.ns += int(values.sum())
    counts = np.bincount(np.searchsorted(_BOUNDS, values, side="left"), minlength=len(_BOUNDS) + 1)
    buckets = into.buckets
    for index in np.flatnonzero(counts).tolist():
        buckets[index] += int(counts[index])
