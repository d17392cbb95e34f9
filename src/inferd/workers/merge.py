"""Totals across workers: Prometheus expositions, statistics, shadow counts and dashboard
traffic, merged.

Counters, histograms and most gauges add up (requests, rows, CPU seconds, memory, requests in
flight); a few gauges describe a state rather than an amount, and take the lowest or highest
worker's value instead (``_COMBINE``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from inferd.core.stats import BatchStatistics, InferStatistics, ModelStatistics, StatDuration
from inferd.plane.routing import ShadowCounts

_COMBINE: dict[str, Callable[[Iterable[float]], float]] = {
    "inferd_model_ready": min,  # READY only when every worker has the version READY
    "inferd_model_load_duration_seconds": max,
    "inferd_repository_last_sync_timestamp_seconds": min,  # the stalest worker's listing
    "inferd_repository_store_up": min,
    "inferd_repository_held_models": max,
    "inferd_repository_store_faults": max,  # every worker judges the same listings
    "process_start_time_seconds": min,
    "process_max_fds": min,
}


class _Families:
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


def merge_metrics(texts: Sequence[bytes]) -> bytes:
    """One exposition whose every sample is the workers' total (or ``_COMBINE``'s pick)."""
    order: dict[str, Metric] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], list[float]]] = {}
    for text in texts:
        for family in text_string_to_metric_families(text.decode()):
            if family.name not in order:
                order[family.name] = Metric(family.name, family.documentation, family.type)
                values[family.name] = {}
            samples = values[family.name]
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                samples.setdefault(key, []).append(sample.value)
    merged: list[Metric] = []
    for name, metric in order.items():
        pick = _COMBINE.get(name, sum)
        for (sample_name, labels), found in values[name].items():
            combine = min if sample_name.endswith("_created") else pick
            metric.add_sample(sample_name, dict(labels), float(combine(found)))
        merged.append(metric)
    workers = Metric(
        "inferd_workers", "Worker processes whose figures these totals add up", "gauge"
    )
    workers.add_sample("inferd_workers", {}, float(len(texts)))
    merged.append(workers)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(merged))
    return generate_latest(registry)


# --------------------------------------------------------------------------- statistics


def statistics_document(stats: Iterable[ModelStatistics]) -> list[dict[str, Any]]:
    """Snapshots as plain JSON values (what a worker sends its peers)."""
    return [asdict(s) for s in stats]


def _duration(doc: dict[str, Any]) -> StatDuration:
    return StatDuration(int(doc["count"]), int(doc["ns"]))


def statistics_from_document(docs: Iterable[dict[str, Any]]) -> list[ModelStatistics]:
    out: list[ModelStatistics] = []
    for doc in docs:
        infer = doc["inference_stats"]
        out.append(
            ModelStatistics(
                name=doc["name"],
                version=doc["version"],
                last_inference=int(doc["last_inference"]),
                inference_count=int(doc["inference_count"]),
                execution_count=int(doc["execution_count"]),
                inference_stats=InferStatistics(**{k: _duration(v) for k, v in infer.items()}),
                batch_stats=tuple(
                    BatchStatistics(
                        batch_size=int(b["batch_size"]),
                        compute_input=_duration(b["compute_input"]),
                        compute_infer=_duration(b["compute_infer"]),
                        compute_output=_duration(b["compute_output"]),
                    )
                    for b in doc["batch_stats"]
                ),
            )
        )
    return out


def _add(a: StatDuration, b: StatDuration) -> StatDuration:
    return StatDuration(a.count + b.count, a.ns + b.ns)


def _add_batch(a: BatchStatistics, b: BatchStatistics) -> BatchStatistics:
    return BatchStatistics(
        a.batch_size,
        _add(a.compute_input, b.compute_input),
        _add(a.compute_infer, b.compute_infer),
        _add(a.compute_output, b.compute_output),
    )


def _add_stats(a: ModelStatistics, b: ModelStatistics) -> ModelStatistics:
    ai, bi = a.inference_stats, b.inference_stats
    infer = InferStatistics(
        **{name: _add(getattr(ai, name), getattr(bi, name)) for name in ai.__slots__}
    )
    batches = {s.batch_size: s for s in a.batch_stats}
    for s in b.batch_stats:
        same = batches.get(s.batch_size)
        batches[s.batch_size] = s if same is None else _add_batch(same, s)
    return ModelStatistics(
        a.name,
        a.version,
        max(a.last_inference, b.last_inference),
        a.inference_count + b.inference_count,
        a.execution_count + b.execution_count,
        infer,
        tuple(batches[size] for size in sorted(batches)),
    )


def merge_statistics(
    own: Sequence[ModelStatistics], others: Iterable[Sequence[ModelStatistics]]
) -> tuple[ModelStatistics, ...]:
    """Per (model, version) totals, sorted as the data plane sorts them; a version only
    another worker serves (a load still under way here) is included."""
    totals: dict[tuple[str, str], ModelStatistics] = {(s.name, s.version): s for s in own}
    for stats in others:
        for s in stats:
            key = (s.name, s.version)
            totals[key] = _add_stats(totals[key], s) if key in totals else s
    return tuple(sorted(totals.values(), key=lambda s: (s.name, int(s.version or 0))))


# --------------------------------------------------------------------------- shadow counts


def shadow_document(counts: dict[str, ShadowCounts]) -> dict[str, dict[str, Any]]:
    """Shadow counts by model name as plain JSON values (what a worker sends its peers)."""
    return {name: asdict(c) for name, c in counts.items()}


def merge_shadow_counts(
    own: dict[str, ShadowCounts], others: Iterable[dict[str, dict[str, Any]]]
) -> dict[str, ShadowCounts]:
    """Each model's counts added up over the workers; the largest difference is the largest
    any worker saw (None where none could compare an answer)."""
    totals = dict(own)
    for doc in others:
        for name, found in doc.items():
            theirs = ShadowCounts(**found)
            mine = totals.get(name)
            if mine is None:
                totals[name] = theirs
                continue
            diffs = [d for d in (mine.max_abs_diff, theirs.max_abs_diff) if d is not None]
            totals[name] = ShadowCounts(
                mine.sent + theirs.sent,
                mine.agreed + theirs.agreed,
                mine.disagreed + theirs.disagreed,
                mine.failed + theirs.failed,
                mine.skipped + theirs.skipped,
                max(diffs) if diffs else None,
            )
    return totals


# --------------------------------------------------------------------------- dashboard traffic

_SUMMED = (
    "requests_per_s",
    "failures_per_s",
    "executions_per_s",
    "cache_hits_per_s",
    "cache_misses_per_s",
    "pending",
)
_HIGHEST = ("p50_ms", "p99_ms")  # the slowest worker's: percentiles do not add
_WEIGHTED = {"queue_ms": "requests_per_s", "compute_ms": "requests_per_s"}
_WEIGHTED_BY_EXECUTIONS = ("batch_size",)

Row = list[float]


def _mean_rows(end: int, rows: list[Row], at: dict[str, int]) -> Row:
    """One worker's two samples in one second as one: the mean of its rates, and its means
    weighted as across workers (a sample with no executions leaves batch_size alone)."""
    combined = _combine_rows(end, rows, at)
    for name in _SUMMED:
        combined[at[name]] = round(combined[at[name]] / len(rows), 3)
    return combined


def _combine_rows(end: int, rows: list[Row], at: dict[str, int]) -> Row:
    """One row for a second from each worker's row for it."""
    out = [0.0] * len(at)
    out[at["t"]] = float(end)
    for name in _SUMMED:
        out[at[name]] = round(sum(r[at[name]] for r in rows), 3)
    for name in _HIGHEST:
        out[at[name]] = max(r[at[name]] for r in rows)
    weights = dict(_WEIGHTED)
    weights.update({name: "executions_per_s" for name in _WEIGHTED_BY_EXECUTIONS})
    for name, by in weights.items():
        total = sum(r[at[by]] for r in rows)
        if total > 0:
            out[at[name]] = round(sum(r[at[name]] * r[at[by]] for r in rows) / total, 4)
    return out


def _rows(per_worker: list[list[Row]], at: dict[str, int], cutoff_t: float) -> list[Row]:
    """Rows of several workers, one per whole second they end in, up to ``cutoff_t``."""
    seconds: dict[int, list[Row]] = {}
    for rows in per_worker:
        mine: dict[int, list[Row]] = {}
        for row in rows:
            end = math.ceil(row[0])
            if end <= cutoff_t:
                mine.setdefault(end, []).append(list(row))
        for end, found in mine.items():  # a worker's two samples in one second: their mean
            seconds.setdefault(end, []).append(
                found[0] if len(found) == 1 else _mean_rows(end, found, at)
            )
    return [_combine_rows(end, rows, at) for end, rows in sorted(seconds.items())]


def _batch_sizes(docs: Iterable[dict[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for doc in docs:
        for size, count in doc.items():
            total[size] = total.get(size, 0) + count
    return dict(sorted(total.items(), key=lambda item: int(item[0])))


def merge_traffic(docs: Sequence[dict[str, Any]], now_t: float) -> dict[str, Any]:
    """The dashboard's traffic document for the whole server from each worker's: rows are
    per whole second (``t`` the second's end), given once every worker has sampled it."""
    first = docs[0]
    at = {name: i for i, name in enumerate(first["fields"])}
    cutoff_t = now_t - float(first["interval_s"])
    names = sorted({name for doc in docs for name in doc["models"]})
    models = {
        name: {
            "rows": _rows(
                [d["models"][name]["rows"] for d in docs if name in d["models"]], at, cutoff_t
            ),
            "batch_sizes": _batch_sizes(
                d["models"][name]["batch_sizes"] for d in docs if name in d["models"]
            ),
        }
        for name in names
    }
    server = {
        "rows": _rows([d["server"]["rows"] for d in docs], at, cutoff_t),
        "batch_sizes": _batch_sizes(d["server"]["batch_sizes"] for d in docs),
    }
    return {**first, "now": round(now_t, 3), "server": server, "models": models}
