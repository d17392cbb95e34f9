"""EndpointStats: observations are logged per (protocol, endpoint, status) and added up when
read, from any thread, and rendered as Prometheus counters and histograms."""

from __future__ import annotations

import threading

from inferd.core.stats import FLUSH_AT
from inferd.observability.metrics import EndpointStats, build_registry, render
from inferd.plane.registry import Registry


def test_observations_add_up_when_read() -> None:
    stats = EndpointStats()
    stats.observe("http", "V2Http.infer", "200", 2_000_000)
    stats.observe("http", "V2Http.infer", "200", 4_000_000)
    stats.observe("http", "V2Http.infer", "400", 1_000)
    stats.observe("grpc", "ModelInfer", "OK", 3_000)
    assert stats.counts == {
        ("http", "V2Http.infer", "200"): 2,
        ("http", "V2Http.infer", "400"): 1,
        ("grpc", "ModelInfer", "OK"): 1,
    }
    http = stats.durations["http", "V2Http.infer"]
    assert (http.count, http.ns) == (3, 6_001_000)
    assert stats.durations["grpc", "ModelInfer"].count == 1
    stats.observe("http", "V2Http.infer", "200", 1_000)
    assert stats.counts["http", "V2Http.infer", "200"] == 3  # read again: the new one added


def test_a_full_log_is_added_up_and_reads_from_another_thread_lose_nothing() -> None:
    stats = EndpointStats()
    seen: list[int] = []

    def read() -> None:
        for _ in range(200):
            seen.append(sum(stats.counts.values()))

    reader = threading.Thread(target=read)
    reader.start()
    for i in range(3 * FLUSH_AT + 7):
        stats.observe("http", "V2Http.infer", "200", i)
    reader.join()
    assert stats.counts == {("http", "V2Http.infer", "200"): 3 * FLUSH_AT + 7}
    assert stats.durations["http", "V2Http.infer"].ns == sum(range(3 * FLUSH_AT + 7))
    assert seen == sorted(seen)


def test_rendered_as_prometheus_counters_and_histograms() -> None:
    stats = EndpointStats()
    stats.observe("http", "V2Http.infer", "200", 2_000_000)
    text = render(build_registry(Registry(), stats)).decode()
    assert (
        'inferd_endpoint_requests_total{endpoint="V2Http.infer",protocol="http",status="200"} 1.0'
        in text
    )
    assert (
        'inferd_endpoint_duration_seconds_count{endpoint="V2Http.infer",protocol="http"} 1.0'
        in text
    )
