"""Prometheus metrics of lazy serving: the budget, what is loaded, loads, evictions, hits.

Rendered at scrape time from the residency's own counters (``inferd.repository.residency``);
nothing here runs on the request path. The per-model gauge is labelled only by loaded models.
With several serving processes the model host exports them all, and each frontend only the
hits and misses of the requests it received (``RequestCounts``): the merged scrape adds those
up, and shows the budget and what is loaded once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from inferd.observability.metrics import add_histogram
from inferd.repository.residency import Residency


class ResidencyCollector(Collector):
    def __init__(self, residency: Residency) -> None:
        self.residency = residency

    def collect(self) -> Iterable[Metric]:
        residency = self.residency
        counters = residency.counters
        resident = residency.resident()
        budget = residency.budget
        gauges = (
            ("budget_bytes", "The memory budget of loaded models (0: none)", budget.memory_bytes),
            ("max_models", "The most models loaded at once (0: no bound)", budget.max_models),
            ("models", "Models loaded", len(resident)),
            ("bytes", "Memory the loaded models were measured to take", sum(resident.values())),
            (
                "runtime_bytes",
                "Memory the backends' runtimes took coming in (counted in the budget)",
                residency.costs.runtime_bytes(),
            ),
        )
        for suffix, text, value in gauges:
            gauge = GaugeMetricFamily(f"inferd_residency_{suffix}", text)
            gauge.add_metric([], value)
            yield gauge
        per_model = GaugeMetricFamily(
            "inferd_residency_model_bytes",
            "Memory a loaded model was measured to take at its load (what the budget counts)",
            labels=["model"],
        )
        for name, size in sorted(resident.items()):
            per_model.add_metric([name], size)
        yield per_model
        counts = (
            ("loads", "Models loaded on demand", counters.loads),
            ("load_failures", "Loads on demand that failed", counters.load_failures),
            ("evictions", "Models unloaded to make room", counters.evictions),
        )
        yield from _counters(counts + _requests(residency.hits, counters.misses))
        latency = HistogramMetricFamily(
            "inferd_residency_load_duration_seconds", "Cold loads on demand, from start to ready"
        )
        add_histogram(latency, [], counters.load_duration)
        yield latency


class RequestCounts(Collector):
    """A frontend worker's hits and misses (``counts``: both, now)."""

    def __init__(self, counts: Callable[[], tuple[int, int]]) -> None:
        self.counts = counts

    def collect(self) -> Iterable[Metric]:
        yield from _counters(_requests(*self.counts()))


def _requests(hits: int, misses: int) -> tuple[tuple[str, str, int], ...]:
    return (
        ("hits", "Requests that found their model loaded", hits),
        ("misses", "Requests that found their model not loaded", misses),
    )


def _counters(counts: Iterable[tuple[str, str, int]]) -> Iterable[Metric]:
    for suffix, text, value in counts:
        counter = CounterMetricFamily(f"inferd_residency_{suffix}", text)
        counter.add_metric([], value)
        yield counter
