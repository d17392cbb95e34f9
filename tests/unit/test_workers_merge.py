"""Totals over workers: Prometheus expositions and statistics snapshots."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from inferd.core.stats import ModelStats
from inferd.dashboard.series import FIELDS
from inferd.observability.metrics import EndpointStats, build_registry, render
from inferd.plane.registry import Registry
from inferd.plane.routing import ShadowCounts
from inferd.workers.merge import (
    merge_metrics,
    merge_shadow_counts,
    merge_statistics,
    merge_traffic,
    shadow_document,
    statistics_document,
    statistics_from_document,
)

READY = b"# HELP inferd_model_ready 1 when the version is READY\n# TYPE inferd_model_ready gauge\n"


def _samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text.decode())
        for s in family.samples
    }


def test_counters_histograms_and_gauges_add_up() -> None:
    texts = []
    for count in (3, 4):
        endpoints = EndpointStats()
        for _ in range(count):
            endpoints.observe("http", "infer", "200", 2_000_000)
        texts.append(render(build_registry(Registry(), endpoints)))
    merged = _samples(merge_metrics(texts))
    key = (("endpoint", "infer"), ("protocol", "http"), ("status", "200"))
    assert merged[("inferd_endpoint_requests_total", key)] == 7
    where = (("endpoint", "infer"), ("protocol", "http"))
    assert merged[("inferd_endpoint_duration_seconds_count", where)] == 7
    for le, count in (("+Inf", 7), ("0.001", 0), ("0.0025", 7)):
        bucket = tuple(sorted((*where, ("le", le))))
        assert merged[("inferd_endpoint_duration_seconds_bucket", bucket)] == count
    assert merged[("inferd_workers", ())] == 2


def test_state_gauges_take_the_lowest() -> None:
    one = READY + b'inferd_model_ready{model="m",version="1"} 1.0\n'
    other = READY + b'inferd_model_ready{model="m",version="1"} 0.0\n'
    merged = _samples(merge_metrics([one, other]))
    assert merged[("inferd_model_ready", (("model", "m"), ("version", "1")))] == 0
    assert (
        _samples(merge_metrics([one, one]))[
            ("inferd_model_ready", (("model", "m"), ("version", "1")))
        ]
        == 1
    )


def _stats(successes: int, batch: int) -> ModelStats:
    stats = ModelStats()
    for _ in range(successes):
        stats.success.add(1000)
    stats.record_execution(batch, successes, 10, 100, 10)
    return stats


def test_statistics_add_up_per_version_and_batch_size() -> None:
    own = [_stats(2, 2).snapshot("m", "1")]
    other = statistics_from_document(
        statistics_document([_stats(3, 3).snapshot("m", "1"), _stats(1, 1).snapshot("n", "2")])
    )
    merged = merge_statistics(own, [other])
    assert [(s.name, s.version) for s in merged] == [("m", "1"), ("n", "2")]
    m = merged[0]
    assert m.inference_stats.success.count == 5
    assert m.inference_stats.success.ns == 5000
    assert m.inference_count == 5
    assert m.execution_count == 2
    assert m.inference_stats.compute_infer.count == 5
    assert m.inference_stats.compute_infer.ns == 2 * 100 + 3 * 100
    assert [(b.batch_size, b.compute_infer.count) for b in m.batch_stats] == [(2, 1), (3, 1)]
    assert merged[1].inference_count == 1


def test_statistics_document_round_trips() -> None:
    snap = _stats(2, 2).snapshot("m", "1")
    assert statistics_from_document(statistics_document([snap])) == [snap]


def _traffic(rows: list[list[float]], sizes: dict[str, int]) -> dict[str, object]:
    fields = list(FIELDS)
    return {
        "interval_s": 1.0,
        "window_s": 900.0,
        "now": 0.0,
        "fields": fields,
        "server": {"rows": rows, "batch_sizes": sizes},
        "models": {"m": {"rows": rows, "batch_sizes": sizes}},
    }


def _row(t: float, requests: float, queue_ms: float, p99_ms: float) -> list[float]:
    values = dict.fromkeys(FIELDS, 0.0)
    values.update(t=t, requests_per_s=requests, queue_ms=queue_ms, p99_ms=p99_ms, pending=1.0)
    return [values[name] for name in FIELDS]


def test_traffic_rows_add_up_per_whole_second() -> None:
    at = {name: i for i, name in enumerate(FIELDS)}
    one = _traffic([_row(99.4, 10, 1.0, 5.0), _row(100.4, 10, 1.0, 5.0)], {"1": 20})
    other = _traffic([_row(99.9, 30, 3.0, 9.0), _row(100.9, 30, 3.0, 9.0)], {"1": 55, "4": 1})
    merged = merge_traffic([one, other], now_t=101.5)  # second 101 is not complete yet
    rows = merged["server"]["rows"]
    assert [r[at["t"]] for r in rows] == [100.0]
    row = rows[0]
    assert row[at["requests_per_s"]] == 40
    assert row[at["pending"]] == 2
    assert row[at["p99_ms"]] == 9.0
    assert row[at["queue_ms"]] == (10 * 1.0 + 30 * 3.0) / 40
    assert merged["server"]["batch_sizes"] == {"1": 75, "4": 1}
    assert merged["models"]["m"]["rows"] == rows
    later = merge_traffic([one, other], now_t=102.0)
    assert [r[at["t"]] for r in later["server"]["rows"]] == [100.0, 101.0]


def test_shadow_counts_add_up_and_keep_the_largest_difference() -> None:
    own = {"a": ShadowCounts(2, 2, 0, 0, 0, 0.5), "b": ShadowCounts(1, 0, 0, 1, 0, None)}
    theirs = shadow_document(
        {"a": ShadowCounts(3, 2, 1, 0, 1, 2.0), "c": ShadowCounts(1, 1, 0, 0, 0, None)}
    )
    quiet = shadow_document({"a": ShadowCounts(0, 0, 0, 0, 0, None)})
    totals = merge_shadow_counts(own, [theirs, quiet])
    assert totals == {
        "a": ShadowCounts(5, 4, 1, 0, 1, 2.0),
        "b": ShadowCounts(1, 0, 0, 1, 0, None),
        "c": ShadowCounts(1, 1, 0, 0, 0, None),
    }


def _executed(t: float, requests: float, executions: float, batch: float) -> list[float]:
    values = dict.fromkeys(FIELDS, 0.0)
    values.update(t=t, requests_per_s=requests, executions_per_s=executions, batch_size=batch)
    return [values[name] for name in FIELDS]


def test_batch_size_is_the_executing_workers_whatever_the_others_counted() -> None:
    at = {name: i for i, name in enumerate(FIELDS)}
    # A frontend counts the requests it forwarded, the model host their executions; the host
    # sampled twice in second 100, once with nothing executed (a request still pending).
    frontend = _traffic([_executed(99.5, 20, 0, 0.0)], {})
    host = _traffic([_executed(99.05, 0, 10, 2.0), _executed(99.95, 0, 0, 0.0)], {"2": 10})
    rows = merge_traffic([frontend, host], now_t=102.0)["models"]["m"]["rows"]
    assert len(rows) == 1
    assert rows[0][at["requests_per_s"]] == 20 and rows[0][at["batch_size"]] == 2.0
    assert rows[0][at["executions_per_s"]] == 5.0  # the host's two samples: their mean


def test_a_worker_s_two_samples_weigh_their_means_by_requests() -> None:
    at = {name: i for i, name in enumerate(FIELDS)}
    one = _traffic([_row(99.05, 30, 2.0, 5.0), _row(99.95, 0, 0.0, 0.0)], {})
    rows = merge_traffic([one], now_t=102.0)["server"]["rows"]
    assert rows[0][at["queue_ms"]] == 2.0 and rows[0][at["requests_per_s"]] == 15.0
    assert rows[0][at["p99_ms"]] == 5.0
