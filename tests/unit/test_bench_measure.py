"""inferd bench measurements: merging windows, the stability rule, row statistics, server stats."""

from __future__ import annotations

import numpy as np
import pytest

from inferd.bench.measure import (
    COLUMNS,
    Window,
    WindowReport,
    columns,
    is_stable,
    merge,
    summarize,
    within,
)
from inferd.bench.specs import StatsSnapshot, per_request_us, snapshot_from_doc


def window(latencies_ms: list[float], *, errors: int = 0, duration_s: float = 1.0) -> Window:
    return Window(
        latencies_ns=(np.asarray(latencies_ms, dtype=np.float64) * 1e6).astype(np.int64),
        errors=errors,
        sent=len(latencies_ms) + errors,
        duration_s=duration_s,
        cpu_s=(0.2,),
        wall_s=(duration_s,),
        first_error="HTTP 400: no" if errors else None,
    )


def test_merge_concatenates_workers_and_averages_walls() -> None:
    reports = [
        WindowReport(w, 0, 0, np.array([1, 2], dtype=np.int64), w, 2 + w, 0.1, 1.0 + w, None)
        for w in range(2)
    ]
    merged = merge(reports)
    assert merged.latencies_ns.tolist() == [1, 2, 1, 2]
    assert (merged.errors, merged.sent, merged.duration_s) == (1, 5, 1.5)
    assert merged.cpu_s == (0.1, 0.1) and merged.wall_s == (1.0, 2.0)
    assert merged.throughput_rps == pytest.approx(4 / 1.5)


def test_within_percent_of_the_mean() -> None:
    assert within([100, 105, 95], 10)
    assert not within([100, 100, 125], 10)
    assert within([0, 0, 0], 10)


def test_stable_needs_three_windows_agreeing_on_throughput_and_latency() -> None:
    steady = [window([1.0] * 100) for _ in range(3)]
    assert not is_stable(steady[:2], 10, None)
    assert is_stable(steady, 10, None)
    slower = [*steady[:2], window([2.0] * 100)]
    assert not is_stable(slower, 10, None)
    fewer = [*steady[:2], window([1.0] * 50)]
    assert not is_stable(fewer, 10, None)
    tail = [window([1.0] * 99 + [x]) for x in (1.0, 1.0, 50.0)]
    assert is_stable(tail, 10, None) is False  # the average moves too
    assert is_stable(tail, 10, 50)  # the median does not
    assert is_stable([*slower, *steady], 10, None)  # only the last three count


def test_all_failing_windows_are_steady() -> None:
    failing = [window([], errors=10) for _ in range(3)]
    assert is_stable(failing, 10, None)
    row = summarize(failing, stable=True, batch_size=1, percentile=None, concurrency=1)
    assert row["errors"] == 30 and row["requests"] == 30
    assert row["throughput_infer_per_s"] == 0.0 and row["latency_p50_ms"] is None
    assert row["first_error"] == "HTTP 400: no"


def test_summary_of_the_last_three_windows() -> None:
    ignored = window([100.0] * 10)
    used = [window([float(i) for i in range(1, 101)], duration_s=2.0) for _ in range(3)]
    row = summarize(
        [ignored, *used],
        stable=True,
        batch_size=4,
        percentile=None,
        concurrency=8,
        server_us=(12.34, 56.78),
        labels={"server": "s", "model": "m", "protocol": "grpc"},
    )
    assert tuple(row) == columns(None)
    assert tuple(row)[: len(COLUMNS)] == COLUMNS
    assert row["concurrency"] == 8 and row["request_rate"] is None
    assert row["requests"] == 300 and row["errors"] == 0
    assert row["throughput_infer_per_s"] == pytest.approx(300 * 4 / 6.0)
    assert row["latency_avg_ms"] == pytest.approx(50.5)
    assert row["latency_p50_ms"] == pytest.approx(50.5)
    assert row["latency_p99_ms"] == pytest.approx(99.01)
    assert (row["server_queue_us"], row["server_compute_us"]) == (12.3, 56.8)
    assert row["windows"] == 4 and row["stable"] is True
    assert row["client_cpu_pct"] == pytest.approx(10.0) and not row["client_cpu_saturated"]
    assert (row["server"], row["model"], row["protocol"]) == ("s", "m", "grpc")


def test_request_rate_row_reports_achieved_rate_and_deviation() -> None:
    windows = [window([1.0] * 90) for _ in range(3)]  # 90 sent per 1 s window
    row = summarize(windows, stable=False, batch_size=1, percentile=None, request_rate=100.0)
    assert row["concurrency"] is None and row["request_rate"] == 100.0
    assert row["achieved_request_rate"] == pytest.approx(90.0)
    assert row["request_rate_deviation_pct"] == pytest.approx(-10.0)


def test_other_percentile_gets_its_own_column() -> None:
    names = columns(97)
    assert names.index("latency_p97_ms") == names.index("latency_p99_ms") + 1
    assert columns(99) == columns(None)
    row = summarize(
        [window([float(i) for i in range(1, 101)])], stable=False, batch_size=1, percentile=97
    )
    assert row["latency_p97_ms"] == pytest.approx(97.03)


def test_saturated_client_cpu_is_flagged() -> None:
    busy = Window(np.ones(10, dtype=np.int64), 0, 10, 1.0, (0.2, 0.95), (1.0, 1.0), None)
    row = summarize([busy], stable=False, batch_size=1, percentile=None, concurrency=2)
    assert row["client_cpu_pct"] == pytest.approx(95.0) and row["client_cpu_saturated"] is True


TRITON_STATS = {
    "model_stats": [
        {
            "name": "m",
            "version": "1",
            "inference_count": 10,
            "inference_stats": {
                "success": {"count": 10, "ns": 9000},
                "queue": {"count": 10, "ns": 2000},
                "compute_input": {"count": 10, "ns": 100},
                "compute_infer": {"count": 10, "ns": 5000},
                "compute_output": {"count": 10, "ns": 400},
            },
        },
        {
            "name": "m",
            "version": "2",
            "inference_stats": {
                "success": {"count": "5", "ns": "100"},  # gRPC JSON writes uint64 as strings
                "queue": {"count": "5", "ns": "50"},
            },
        },
    ]
}


def test_triton_statistics_are_summed_over_versions() -> None:
    assert snapshot_from_doc(TRITON_STATS, "") == StatsSnapshot(15, 2050, 5500)
    assert snapshot_from_doc(TRITON_STATS, "2") == StatsSnapshot(5, 50, 0)
    assert snapshot_from_doc({"error": "no"}, "") is None


def test_per_request_split_is_the_delta_over_the_level() -> None:
    before = StatsSnapshot(100, 1_000_000, 5_000_000)
    after = StatsSnapshot(300, 3_000_000, 25_000_000)
    assert per_request_us(before, after) == (10.0, 100.0)
    assert per_request_us(None, after) == (None, None)
    assert per_request_us(after, after) == (None, None)
