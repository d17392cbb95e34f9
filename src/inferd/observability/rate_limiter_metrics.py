"""The rate limiter's metrics on ``/metrics`` (``--rate-limit execution_count`` only).

Triton reports no metric of its own for the rate limiter: the time a request waits for its
instance's resources is part of its queue time (``inferd_queue_duration_seconds`` here, Triton's
``nv_inference_queue_duration_us`` and the statistics' ``queue``). This adds that wait alone,
per model version, and each resource's count and the copies held now, read at scrape time.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from inferd.observability.metrics import add_histogram
from inferd.scheduling.rate_limiter import GLOBAL, RateLimiter


class RateLimiterCollector(Collector):
    def __init__(self, limiter: RateLimiter) -> None:
        self.limiter = limiter

    def collect(self) -> Iterable[Metric]:
        wait = HistogramMetricFamily(
            "inferd_rate_limiter_wait_duration_seconds",
            "Time batches waited for a free limited instance and its rate limiter resources",
            labels=["model", "version"],
        )
        for label, duration in sorted(self.limiter.wait_snapshot().items()):
            name, _, version = label.rpartition("/")
            add_histogram(wait, [name, version], duration)
        yield wait
        rl = ["resource", "device"]
        count = GaugeMetricFamily(
            "inferd_rate_limiter_resource_count", "Copies of a rate limiter resource", labels=rl
        )
        held = GaugeMetricFamily(
            "inferd_rate_limiter_resource_in_use", "Copies held by executing instances", labels=rl
        )
        limits, allocated = dict(self.limiter.limits), dict(self.limiter.allocated)
        for (device, name), total in sorted(limits.items()):
            labels = [name, "global" if device == GLOBAL else str(device)]
            count.add_metric(labels, total)
            held.add_metric(labels, allocated.get((device, name), 0))
        yield count
        yield held
