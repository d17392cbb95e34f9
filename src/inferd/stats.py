"""Per model-version statistics in Triton's shape: request outcomes, time spent, batch sizes.

``ModelStats`` is the live, mutable counter set a version updates; ``ModelStatistics`` is the
frozen snapshot the data plane hands out (its field names are Triton's statistics extension,
so an adapter encodes it field by field). Durations are nanoseconds. Per-request figures
(queue, compute_*) add each request's share of its batch, as Triton does; ``batch_stats``
counts executions per batch size.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from dataclasses import dataclass, field

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


@dataclass(slots=True)
class ModelStats:
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    cache_hit: Duration = field(default_factory=Duration)
    cache_miss: Duration = field(default_factory=Duration)
    pending: int = 0  # requests inside the model version right now
    inference_count: int = 0  # rows inferred (a batch of 8 rows counts 8)
    execution_count: int = 0  # model executions (one per batch)
    last_inference_ms: int = 0
    batches: dict[int, BatchStat] = field(default_factory=dict)

    def record_execution(
        self, batch_size: int, requests: int, input_ns: int, infer_ns: int, output_ns: int
    ) -> None:
        """One execution of ``batch_size`` rows on behalf of ``requests`` requests."""
        self.execution_count += 1
        self.inference_count += batch_size
        self.last_inference_ms = time.time_ns() // 1_000_000
        stat = self.batches.get(batch_size)
        if stat is None:
            stat = self.batches[batch_size] = BatchStat()
        stat.compute_input.add(input_ns)
        stat.compute_infer.add(infer_ns)
        stat.compute_output.add(output_ns)
        self.compute_input.add_each(input_ns, requests)
        self.compute_infer.add_each(infer_ns, requests)
        self.compute_output.add_each(output_ns, requests)

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
