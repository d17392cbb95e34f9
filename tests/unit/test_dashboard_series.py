"""The traffic sampler: rows per second from real model versions' statistics (echo backend)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from inferd.core.stats import BUCKETS_S
from inferd.dashboard.series import FIELDS, TrafficSeries, quantile_ms
from inferd.plane.model import ModelState
from inferd.plane.registry import ModelRecord, Registry, VersionStatus
from tests.echo_support import echo_version, request

COL = {name: i for i, name in enumerate(FIELDS)}


def test_quantile_interpolates_inside_a_bucket() -> None:
    buckets = [0] * (len(BUCKETS_S) + 1)
    assert quantile_ms(buckets, 0.5) == 0.0
    buckets[3] = 10  # ten requests between 0.5 and 1 ms
    assert quantile_ms(buckets, 0.5) == pytest.approx(0.75)
    assert quantile_ms(buckets, 0.99) == pytest.approx(0.995)
    buckets[-1] = 1000  # nearly all beyond the largest bound: that bound answers
    assert quantile_ms(buckets, 0.99) == BUCKETS_S[-1] * 1000


def _registry(*versions: object) -> Registry:
    registry = Registry()
    for version in versions:
        record = ModelRecord(
            version.name,  # type: ignore[attr-defined]
            versions={1: version},  # type: ignore[dict-item]
            status={1: VersionStatus(1, ModelState.READY)},
            state=ModelState.READY,
        )
        registry.put(record)
    return registry


def test_rows_follow_requests_and_idle_models_store_nothing(tmp_path: Path) -> None:
    busy = echo_version(tmp_path)
    idle = echo_version(tmp_path)
    series = TrafficSeries(_registry(busy, idle))

    async def traffic() -> None:
        for i in range(6):
            await busy.infer(request(busy, float(i), float(i)))

    series.sample(now_t=1000.0, now_mono=10.0)
    asyncio.run(traffic())
    series.sample(now_t=1002.0, now_mono=12.0)  # 6 requests in 2 s
    doc = series.as_json()
    assert set(doc["models"]) == {busy.name}
    (row,) = doc["models"][busy.name]["rows"]
    assert row[COL["t"]] == 1002.0
    assert row[COL["requests_per_s"]] == 3.0
    assert row[COL["failures_per_s"]] == 0.0
    assert row[COL["batch_size"]] == 2.0  # each request held two rows
    assert row[COL["executions_per_s"]] == 3.0
    assert row[COL["p99_ms"]] >= row[COL["p50_ms"]] > 0
    assert doc["models"][busy.name]["batch_sizes"] == {"2": 6}
    server_rows = doc["server"]["rows"]
    assert [r[COL["t"]] for r in server_rows] == [1000.0, 1002.0]
    assert server_rows[-1][COL["requests_per_s"]] == 3.0
    # An idle second adds a server row and no model row; ?after= answers only newer rows.
    series.sample(now_t=1003.0, now_mono=13.0)
    later = series.as_json(after=1002.0)
    assert [r[COL["t"]] for r in later["server"]["rows"]] == [1003.0]
    assert later["models"][busy.name]["rows"] == []


def test_rows_leave_the_window(tmp_path: Path) -> None:
    model = echo_version(tmp_path)
    series = TrafficSeries(_registry(model), window_s=10.0)
    series.sample(now_t=100.0, now_mono=1.0)
    asyncio.run(model.infer(request(model, 1.0)))
    series.sample(now_t=101.0, now_mono=2.0)
    assert series.as_json()["models"][model.name]["batch_sizes"] == {"1": 1}
    series.sample(now_t=120.0, now_mono=21.0)
    doc = series.as_json()
    assert doc["models"] == {}
    assert [r[0] for r in doc["server"]["rows"]] == [120.0]
    assert doc["server"]["batch_sizes"] == {}


def test_a_reloaded_version_starts_from_zero(tmp_path: Path) -> None:
    first = echo_version(tmp_path, name="swapped")
    registry = _registry(first)
    series = TrafficSeries(registry)
    series.sample(now_t=0.0, now_mono=0.0)
    asyncio.run(first.infer(request(first, 1.0)))
    series.sample(now_t=1.0, now_mono=1.0)
    second = echo_version(tmp_path, name="swapped")  # a new version object, counters at zero
    registry.put(
        ModelRecord(
            "swapped",
            versions={1: second},
            status={1: VersionStatus(1, ModelState.READY)},
            state=ModelState.READY,
        )
    )
    asyncio.run(second.infer(request(second, 1.0)))
    series.sample(now_t=2.0, now_mono=2.0)
    rows = series.as_json()["models"]["swapped"]["rows"]
    assert [r[COL["requests_per_s"]] for r in rows] == [1.0, 1.0]


def test_the_sampler_runs_and_stops(tmp_path: Path) -> None:
    model = echo_version(tmp_path)
    series = TrafficSeries(_registry(model), interval_s=0.01)

    async def run() -> int:
        series.start()
        await model.infer(request(model, 1.0))
        await asyncio.sleep(0.1)
        await series.stop()
        return len(series.as_json()["server"]["rows"])

    assert asyncio.run(run()) >= 2


def test_every_worker_samples_the_middle_of_the_same_wall_clock_seconds(tmp_path: Path) -> None:
    series = TrafficSeries(_registry(echo_version(tmp_path)))
    assert series.until_next(now_t=100.0) == 0.5
    assert series.until_next(now_t=100.2) == pytest.approx(0.3)
    assert series.until_next(now_t=100.49) == pytest.approx(1.01)  # woke early: not twice
    assert series.until_next(now_t=100.5) == 1.0
    assert series.until_next(now_t=100.9) == pytest.approx(0.6)
