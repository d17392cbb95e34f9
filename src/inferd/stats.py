"""Per model-version statistics in Triton's shape: request outcomes, time spent, batch sizes.

Durations are nanoseconds. Per-request figures (queue, compute_*) add each request's share
of its batch, as Triton does; ``batch_stats`` counts executions per batch size.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns

    def as_dict(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass(slots=True)
class BatchStat:
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


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
        self.compute_input.add(input_ns * requests, requests)
        self.compute_infer.add(infer_ns * requests, requests)
        self.compute_output.add(output_ns * requests, requests)

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
