"""Drain: not ready at once, stop only once the models are idle and quiet, or at the timeout."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from inferd.app.drain import STOP_GRACE_S, Drain
from inferd.backends import echo
from inferd.plane.dataplane import DataPlane
from inferd.plane.model import ModelVersion
from inferd.plane.registry import ModelRecord, Registry
from tests.echo_support import echo_version, request

SLOW = """
backend: "echo"
max_batch_size: 8
input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [2] }]
parameters [
  { key: "gate" value: { string_value: "%s" } },
  { key: "request_level" value: { string_value: "true" } }
]
"""


def _setup(root: Path, gate: str) -> tuple[Registry, DataPlane, ModelVersion]:
    version = echo_version(root, SLOW % gate)
    registry = Registry()
    registry.put(ModelRecord(version.name, versions={1: version}))
    plane = DataPlane(registry)
    plane.started = True
    return registry, plane, version


def test_a_drain_waits_for_requests_in_flight_then_stops(tmp_path: Path) -> None:
    gate = echo.gate("drain-unit")
    gate.clear()
    registry, plane, version = _setup(tmp_path, "drain-unit")

    async def scenario() -> list[str]:
        events: list[str] = []
        stopped = asyncio.Event()

        def stop() -> None:
            events.append("stop")
            stopped.set()

        drain = Drain(plane, registry, timeout_s=10, stop=stop, quiet_s=0.2)
        calls = [asyncio.ensure_future(version.infer(request(version, float(i)))) for i in (1, 2)]
        while drain.pending() < 2:
            await asyncio.sleep(0.01)
        drain.begin()
        events.append(f"ready={plane.ready} pending={drain.pending()}")
        await asyncio.sleep(0.3)
        events.append(f"stopped early: {stopped.is_set()}")
        threading.Timer(0.05, gate.set).start()
        for call in calls:
            await call
            events.append("answered")
        await asyncio.wait_for(stopped.wait(), 5)
        assert drain.exit_timer is None
        await version.close()
        return events

    assert asyncio.run(scenario()) == [
        "ready=False pending=2",
        "stopped early: False",
        "answered",
        "answered",
        "stop",
    ]


def test_a_drain_timeout_stops_with_requests_in_flight(tmp_path: Path) -> None:
    gate = echo.gate("drain-unit-timeout")
    gate.clear()
    registry, plane, version = _setup(tmp_path, "drain-unit-timeout")

    async def scenario() -> tuple[int, float]:
        stopped = asyncio.Event()
        drain = Drain(plane, registry, timeout_s=0.3, stop=stopped.set, quiet_s=0.1)
        call = asyncio.ensure_future(version.infer(request(version, 1.0)))
        while drain.pending() < 1:
            await asyncio.sleep(0.01)
        drain.begin()
        await asyncio.wait_for(stopped.wait(), 5)
        pending = drain.pending()
        assert drain.exit_timer is not None  # a hard exit is due STOP_GRACE_S later
        delay = drain.exit_timer.when() - asyncio.get_running_loop().time()
        drain.exit_timer.cancel()  # not in a test process
        gate.set()
        await call
        await version.close()
        return pending, delay

    pending, delay = asyncio.run(scenario())
    assert pending == 1
    assert 0 < delay <= STOP_GRACE_S


def test_a_second_signal_stops_at_once(tmp_path: Path) -> None:
    registry, plane, _ = _setup(tmp_path, "")
    stops: list[int] = []

    async def scenario() -> None:
        drain = Drain(plane, registry, timeout_s=10, stop=lambda: stops.append(1), quiet_s=5)
        drain.begin()
        drain.begin()
        assert drain.started

    asyncio.run(scenario())
    assert stops == [1]
