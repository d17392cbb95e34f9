"""Per model-version statistics in Triton's shape: request outcomes, time spent, batch sizes.

Durations are nanoseconds. Per-request figures (queue, compute_*) add each request's share
of its batch, as Triton does; ``batch_stats`` counts executions per batch size.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any

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

    def as_dict(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass(slots=True)
class Total:
    """A count and a total, without a histogram (per-batch-size figures)."""

    count: int = 0
    ns: int = 0

    def add(self, ns: int) -> None:
        self.count += 1
        self.ns += ns

    def as_dict(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


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

    def as_dict(self, name: str, version: str) -> dict[str, Any]:
        return {
            "name": name,
            "version": version,
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {
                "success": self.success.as_dict(),
                "fail": self.fail.as_dict(),
                "queue": self.queue.as_dict(),
                "compute_input": self.compute_input.as_dict(),
                "compute_infer": self.compute_infer.as_dict(),
                "compute_output": self.compute_output.as_dict(),
                "cache_hit": self.cache_hit.as_dict(),
                "cache_miss": self.cache_miss.as_dict(),
            },
            "batch_stats": [
                {
                    "batch_size": size,
                    "compute_input": stat.compute_input.as_dict(),
                    "compute_infer": stat.compute_infer.as_dict(),
                    "compute_output": stat.compute_output.as_dict(),
                }
                for size, stat in sorted(self.batches.items())
            ],
        }
