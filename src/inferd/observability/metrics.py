"""Prometheus metrics, rendered at scrape time from the counters the server keeps anyway.

Nothing here runs on the request path except ``EndpointStats.observe`` (a dict look-up and
an array append): model figures come from each version's ``ModelStats`` when Prometheus scrapes.
Labels are bounded: only loaded model versions and registered routes ever become labels.
"""

from __future__ import annotations

import threading
from array import array
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from inferd.core.stats import BUCKETS_S, FLUSH_AT, Duration, drain_log, merge_log
from inferd.plane.registry import Registry

if TYPE_CHECKING:
    from inferd.plane.control import RepositoryStatus

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)

# name suffix, ModelStats attribute, help text
_DURATIONS = (
    ("request", "success", "Whole successful requests inside the model version"),
    ("queue", "queue", "Time requests waited in the queue"),
    ("compute_input", "compute_input", "Time assembling batch inputs, per request"),
    ("compute_infer", "compute_infer", "Model execution time, per request"),
    ("compute_output", "compute_output", "Time splitting batch outputs, per request"),
)


class EndpointStats:
    """Requests per protocol, endpoint and status, with their latency.

    ``observe`` (on the request path) appends a duration to the log of its (protocol, endpoint,
    status); reading ``counts`` or ``durations`` adds the logs up (numpy, under a lock: the
    metrics port reads from its own thread), as does a log reaching ``FLUSH_AT`` entries."""

    __slots__ = ("_counts", "_durations", "_lock", "_logs")

    def __init__(self) -> None:
        self._counts: dict[tuple[str, str, str], int] = {}
        self._durations: dict[tuple[str, str], Duration] = {}
        self._logs: dict[tuple[str, str, str], array[int]] = {}
        self._lock = threading.Lock()

    def observe(self, protocol: str, endpoint: str, status: str, ns: int) -> None:
        key = (protocol, endpoint, status)
        log = self._logs.get(key)
        if log is None:
            log = self._logs[key] = array("q")
        log.append(ns)
        if len(log) >= FLUSH_AT:
            self.flush()

    def flush(self) -> None:
        """Add up the logged observations."""
        with self._lock:
            for key, log in list(self._logs.items()):
                if not log:
                    continue
                taken = drain_log(log)
                protocol, endpoint, _ = key
                self._counts[key] = self._counts.get(key, 0) + len(taken)
                duration = self._durations.get((protocol, endpoint))
                if duration is None:
                    duration = self._durations[protocol, endpoint] = Duration()
                merge_log(duration, taken)

    @property
    def counts(self) -> dict[tuple[str, str, str], int]:
        self.flush()
        return self._counts

    @property
    def durations(self) -> dict[tuple[str, str], Duration]:
        self.flush()
        return self._durations


def add_histogram(family: HistogramMetricFamily, labels: list[str], duration: Duration) -> None:
    cumulative = 0
    buckets: list[tuple[str, float]] = []
    for bound, count in zip(BUCKETS_S, duration.buckets, strict=False):
        cumulative += count
        buckets.append((repr(bound), cumulative))
    buckets.append(("+Inf", duration.count))
    family.add_metric(labels, buckets, duration.ns / 1e9)


class InferdCollector(Collector):
    def __init__(self, registry: Registry, endpoints: EndpointStats) -> None:
        self.registry = registry
        self.endpoints = endpoints

    def collect(self) -> Iterable[Metric]:
        yield from self._models()
        yield from self._endpoints()

    def _models(self) -> Iterator[Metric]:
        mv = ["model", "version"]
        success = CounterMetricFamily("inferd_request_success", "Successful requests", labels=mv)
        failure = CounterMetricFamily("inferd_request_failure", "Failed requests", labels=mv)
        inferences = CounterMetricFamily(
            "inferd_inference", "Rows inferred (a batch of 8 rows counts 8)", labels=mv
        )
        executions = CounterMetricFamily(
            "inferd_execution", "Model executions (one per batch)", labels=mv
        )
        hits = CounterMetricFamily("inferd_cache_hit", "Response cache hits", labels=mv)
        misses = CounterMetricFamily("inferd_cache_miss", "Response cache misses", labels=mv)
        pending = GaugeMetricFamily("inferd_pending_requests", "Requests in flight", labels=mv)
        ready = GaugeMetricFamily("inferd_model_ready", "1 when the version is READY", labels=mv)
        load = GaugeMetricFamily(
            "inferd_model_load_duration_seconds", "Seconds the version took to load", labels=mv
        )
        durations = {
            attr: HistogramMetricFamily(f"inferd_{suffix}_duration_seconds", text, labels=mv)
            for suffix, attr, text in _DURATIONS
        }
        batch = HistogramMetricFamily("inferd_batch_size", "Rows per model execution", labels=mv)
        for record in self.registry.records():
            for version in record.versions.values():
                labels = [version.name, str(version.version)]
                stats = version.stats
                success.add_metric(labels, stats.success.count)
                failure.add_metric(labels, stats.fail.count)
                inferences.add_metric(labels, stats.inference_count)
                executions.add_metric(labels, stats.execution_count)
                hits.add_metric(labels, stats.cache_hit.count)
                misses.add_metric(labels, stats.cache_miss.count)
                pending.add_metric(labels, stats.pending)
                ready.add_metric(labels, 1 if version.state.value == "READY" else 0)
                load.add_metric(labels, version.load_seconds)
                for attr, family in durations.items():
                    add_histogram(family, labels, getattr(stats, attr))
                sizes = {size: b.compute_infer.count for size, b in stats.batches.items()}
                cumulative = 0
                buckets: list[tuple[str, float]] = []
                for bound in _BATCH_BUCKETS:
                    cumulative = sum(c for s, c in sizes.items() if s <= bound)
                    buckets.append((str(bound), cumulative))
                buckets.append(("+Inf", sum(sizes.values())))
                batch.add_metric(labels, buckets, sum(s * c for s, c in sizes.items()))
        yield from (success, failure, inferences, executions, hits, misses, pending, ready, load)
        yield from durations.values()
        yield batch

    def _endpoints(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "inferd_endpoint_requests",
            "Requests per protocol, endpoint and status",
            labels=["protocol", "endpoint", "status"],
        )
        for (protocol, endpoint, status), count in sorted(self.endpoints.counts.items()):
            requests.add_metric([protocol, endpoint, status], count)
        latency = HistogramMetricFamily(
            "inferd_endpoint_duration_seconds",
            "Request latency per protocol and endpoint, decoding to encoding",
            labels=["protocol", "endpoint"],
        )
        for (protocol, endpoint), duration in sorted(self.endpoints.durations.items()):
            add_histogram(latency, [protocol, endpoint], duration)
        yield requests
        yield latency


class RepositoryCollector(Collector):
    """The model stores: when they were last listed, which answered, suspected store faults."""

    def __init__(self, status: Callable[[], RepositoryStatus]) -> None:
        self.status = status

    def collect(self) -> Iterable[Metric]:
        status = self.status()
        synced = GaugeMetricFamily(
            "inferd_repository_last_sync_timestamp_seconds",
            "Unix time of the last listing every model store answered (0: never)",
        )
        synced.add_metric([], status.synced_unix_s or 0.0)
        up = GaugeMetricFamily(
            "inferd_repository_store_up",
            "1 when the model store answered its last listing",
            labels=["store"],
        )
        for store in status.stores:
            up.add_metric([store.uri], 1 if store.ok else 0)
        held = GaugeMetricFamily(
            "inferd_repository_held_models",
            "Models serving on although their store stopped listing them (a store fault)",
        )
        held.add_metric([], len(status.held))
        faults = CounterMetricFamily(
            "inferd_repository_store_faults",
            "Listings that lost most of a store's models, judged a store fault",
        )
        faults.add_metric([], status.faults)
        yield from (synced, up, held, faults)


def build_registry(
    registry: Registry,
    endpoints: EndpointStats,
    repository: Callable[[], RepositoryStatus] | None = None,
) -> CollectorRegistry:
    """A Prometheus registry with inferd's metrics and the process's CPU, memory and fds."""
    metrics = CollectorRegistry(auto_describe=False)
    metrics.register(InferdCollector(registry, endpoints))
    if repository is not None:
        metrics.register(RepositoryCollector(repository))
    ProcessCollector(registry=metrics)
    return metrics


def render(metrics: CollectorRegistry) -> bytes:
    return generate_latest(metrics)
