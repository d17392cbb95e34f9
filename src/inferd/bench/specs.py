"""What ``inferd bench`` learns of a model and its statistics, whichever protocol told it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class TensorSpec:
    name: str
    datatype: str  # KServe v2 name
    shape: tuple[int, ...]  # -1 for a variable dim


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    version: str
    inputs: tuple[TensorSpec, ...]  # empty when the server does not describe them
    max_batch_size: int | None  # None: the server has no config API


@dataclass(frozen=True, slots=True)
class StatsSnapshot:
    """Cumulative server-side counters of one model (Triton's statistics extension)."""

    success_count: int
    queue_ns: int
    compute_ns: int  # compute_input + compute_infer + compute_output


def per_request_us(
    before: StatsSnapshot | None, after: StatsSnapshot | None
) -> tuple[float | None, float | None]:
    """Average queue and compute time per request between two snapshots, in µs."""
    if before is None or after is None:
        return None, None
    count = after.success_count - before.success_count
    if count <= 0:
        return None, None
    return (
        (after.queue_ns - before.queue_ns) / count / 1000,
        (after.compute_ns - before.compute_ns) / count / 1000,
    )


def snapshot_from_doc(doc: Any, version: str) -> StatsSnapshot | None:
    """Sum the ``model_stats`` entries of Triton's JSON (or the gRPC message as a dict)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("model_stats"), list):
        return None
    success = queue = compute = 0
    for entry in doc["model_stats"]:
        if version and str(entry.get("version", "")) not in ("", version):
            continue
        stats = entry.get("inference_stats") or {}

        def ns(key: str, field: str = "ns", stats: dict[str, Any] = stats) -> int:
            return int((stats.get(key) or {}).get(field, 0) or 0)

        success += ns("success", "count")
        queue += ns("queue")
        compute += ns("compute_input") + ns("compute_infer") + ns("compute_output")
    return StatsSnapshot(success, queue, compute)
