"""Lazy serving in process: a real model manager over a local repository of echo models, the
residency deciding what is loaded, and the data plane asking it. Loads are counted by the
residency; models are held busy with the echo backend's gates."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import numpy as np
import pytest

from inferd.backends import echo
from inferd.core.errors import Unavailable
from inferd.core.types import InferRequest
from inferd.plane.dataplane import DataPlane
from inferd.plane.registry import Registry
from inferd.repository import residency as residency_module
from inferd.repository.manager import ControlMode, ModelManager
from inferd.repository.residency import Budget, Residency
from tests.e2e.lifecycle_support import write_version

ECHO = """
backend: "echo"
max_batch_size: 8
input [{{ name: "INPUT0" data_type: TYPE_FP32 dims: [2] }}]
output [{{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [2] }}]
parameters [{parameters}]
"""


def write_model(root: Path, name: str, **parameters: str) -> None:
    folder = root / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    (folder / "1" / "README").write_text("the echo backend needs no file")
    listed = ", ".join(
        f'{{ key: "{k}" value: {{ string_value: "{v}" }} }}' for k, v in parameters.items()
    )
    (folder / "config.pbtxt").write_text(f'name: "{name}"\n' + ECHO.format(parameters=listed))


def request(name: str, value: float = 1.0) -> InferRequest:
    return InferRequest(name, {"INPUT0": np.full((1, 2), value, np.float32)})


def lazy(
    root: Path, budget: Budget, test: Callable[[Residency, DataPlane], Awaitable[None]]
) -> None:
    """Run ``test`` against a lazily serving manager of the repository at ``root``."""

    async def run() -> None:
        registry = Registry()
        manager = ModelManager([root], registry, lazy=True, files_dir=root.parent / "files")
        residency = Residency(manager, budget, measure=lambda: 0)
        plane = DataPlane(registry, repository=None)
        plane.on_demand = residency
        await manager.start()
        await residency.start([])
        try:
            await test(residency, plane)
        finally:
            await manager.close()

    asyncio.run(run())


def loaded(residency: Residency) -> set[str]:
    return set(residency.resident())


def busy_pending(residency: Residency) -> int:
    return residency.registry.get("busy").stats.pending


def test_nothing_loads_at_start_and_a_request_loads_its_model(tmp_path: Path) -> None:
    root = tmp_path / "models"
    for name in ("a", "b"):
        write_model(root, name)

    async def test(residency: Residency, plane: DataPlane) -> None:
        assert loaded(residency) == set()
        views = residency.views()
        assert {name: v.state for name, v in views.items()} == {"a": "available", "b": "available"}
        assert plane.model_ready("a")  # a request would load it
        response = await plane.infer(request("a", 3.0))
        assert response.outputs["OUTPUT0"].tolist() == [[3.0, 3.0]]
        assert loaded(residency) == {"a"}
        assert residency.counters.loads == 1 and residency.counters.misses == 1
        await plane.infer(request("a"))
        assert residency.hits == 1 and residency.counters.loads == 1
        assert residency.views()["a"].state == "loaded"

    lazy(root, Budget(max_models=2), test)


def test_fifty_concurrent_first_requests_cause_one_load(tmp_path: Path) -> None:
    root = tmp_path / "models"
    write_model(root, "m")

    async def test(residency: Residency, plane: DataPlane) -> None:
        responses = await asyncio.gather(*(plane.infer(request("m", i)) for i in range(50)))
        assert [r.outputs["OUTPUT0"][0, 0] for r in responses] == list(range(50))
        assert residency.counters.loads == 1
        assert residency.counters.misses == 50

    lazy(root, Budget(max_models=1), test)


def test_the_least_recently_used_idle_model_is_evicted(tmp_path: Path) -> None:
    root = tmp_path / "models"
    for name in ("a", "b", "c"):
        write_model(root, name)

    async def test(residency: Residency, plane: DataPlane) -> None:
        await plane.infer(request("a"))
        await plane.infer(request("b"))
        await asyncio.sleep(0.01)  # last-use times are kept in milliseconds
        await plane.infer(request("a"))  # b is now the least recently used
        await plane.infer(request("c"))
        assert loaded(residency) == {"a", "c"}
        assert residency.counters.evictions == 1
        view = residency.views()["b"]
        assert view.state == "evicted" and view.evicted_unix_s is not None

    lazy(root, Budget(max_models=2), test)


def test_eviction_never_touches_a_busy_or_pinned_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "models"
    write_model(root, "pinned")
    write_model(root, "busy", gate="residency-busy")
    write_model(root, "other")
    write_model(root, "third")
    gate = echo.gate("residency-busy")
    gate.clear()
    monkeypatch.setattr(residency_module, "ROOM_WAIT_S", 0.2)

    async def test(residency: Residency, plane: DataPlane) -> None:
        assert loaded(residency) == {"pinned"}  # a pinned model loads at start
        held = asyncio.ensure_future(plane.infer(request("busy", 7.0)))
        while loaded(residency) != {"pinned", "busy"} or not busy_pending(residency):
            await asyncio.sleep(0.005)
        # Room for 'other' would need 'pinned' or 'busy' to go: the load gives up, 503.
        with pytest.raises(Unavailable, match=r"1 model\(s\) with requests in flight"):
            await plane.infer(request("other"))
        assert loaded(residency) == {"pinned", "busy"}
        # Once 'busy' is idle it is the one evicted; the pinned model stays.
        waiting = asyncio.ensure_future(plane.infer(request("other", 2.0)))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        gate.set()
        assert (await held).outputs["OUTPUT0"].tolist() == [[7.0, 7.0]]
        assert (await waiting).outputs["OUTPUT0"].tolist() == [[2.0, 2.0]]
        assert loaded(residency) == {"pinned", "other"}
        await plane.infer(request("third"))
        assert loaded(residency) == {"pinned", "third"}
        assert residency.views()["pinned"].pinned

    try:
        lazy(root, Budget(max_models=2, pinned=frozenset({"pinned"})), test)
    finally:
        gate.set()


def test_a_model_pinned_by_its_config_stays(tmp_path: Path) -> None:
    root = tmp_path / "models"
    write_model(root, "keep", pinned="true")
    write_model(root, "a")
    write_model(root, "b")

    async def test(residency: Residency, plane: DataPlane) -> None:
        for name in ("keep", "a", "b", "a"):
            await plane.infer(request(name))
        assert loaded(residency) == {"keep", "a"}

    lazy(root, Budget(max_models=2), test)


def test_a_request_whose_model_is_being_evicted_is_served(tmp_path: Path) -> None:
    root = tmp_path / "models"
    write_model(root, "a")
    write_model(root, "b")

    async def test(residency: Residency, plane: DataPlane) -> None:
        await plane.infer(request("a"))
        routed = plane.registry.route("a")  # a request routed to 'a', not yet running...
        await plane.infer(request("b"))  # ...when 'a' is evicted to make room for 'b'
        assert loaded(residency) == {"b"} and routed.state.value == "UNAVAILABLE"
        response = await plane.run(routed, request("a", 5.0))  # it reloads 'a'
        assert response.outputs["OUTPUT0"].tolist() == [[5.0, 5.0]]
        assert loaded(residency) == {"a"}
        assert residency.counters.loads == 3

    lazy(root, Budget(max_models=1), test)


def test_a_model_that_fails_to_load_answers_its_reason_and_holds_no_budget(
    tmp_path: Path,
) -> None:
    root = tmp_path / "models"
    write_model(root, "broken", die_by="nonsense")
    write_model(root, "good")

    async def test(residency: Residency, plane: DataPlane) -> None:
        with pytest.raises(Unavailable, match=r"could not be loaded on demand: .*die_by"):
            await plane.infer(request("broken"))
        assert residency.counters.load_failures == 1
        assert not plane.model_ready("broken")
        view = residency.views()["broken"]
        assert view.state == "failed" and "die_by" in view.reason
        # The same answer at once, without another load, for a while.
        with pytest.raises(Unavailable, match="die_by"):
            await plane.infer(request("broken"))
        assert residency.counters.load_failures == 1
        # The budget (one model) is whole: the good model loads.
        response = await plane.infer(request("good", 4.0))
        assert response.outputs["OUTPUT0"].tolist() == [[4.0, 4.0]]
        assert loaded(residency) == {"good"} and residency.counters.evictions == 0

    lazy(root, Budget(max_models=1), test)


def test_the_memory_budget_counts_each_models_memory(tmp_path: Path) -> None:
    root = tmp_path / "models"
    for name in ("a", "b", "c"):
        write_model(root, name, memory_bytes="1000")

    async def test(residency: Residency, plane: DataPlane) -> None:
        for name in ("a", "b", "c"):
            await plane.infer(request(name))
        # c's files (a few hundred bytes) seemed to fit; measured (declared), it did not.
        assert residency.resident() == {"b": 1000, "c": 1000}
        assert residency.views()["a"].memory_bytes == 1000
        await plane.infer(request("a"))  # now known to take 1000: room is made first
        assert residency.resident() == {"c": 1000, "a": 1000}

    lazy(root, Budget(memory_bytes=2500), test)


def test_metadata_and_config_answer_from_the_config_without_loading(tmp_path: Path) -> None:
    root = tmp_path / "models"
    write_model(root, "described")
    write_version(root / "bare", 1)  # a model.onnx and no config

    async def test(residency: Residency, plane: DataPlane) -> None:
        meta = await plane.model_metadata("described")
        assert meta.versions == ("1",) and meta.inputs[0].shape == (-1, 2)
        config = await plane.model_config("described")
        assert config.max_batch_size == 8 and config.backend == "echo"
        assert residency.counters.loads == 0
        with pytest.raises(Exception, match="version 3"):
            await plane.model_metadata("described", "3")
        # No config that lists the tensors: the model is loaded to answer.
        bare_meta = await plane.model_metadata("bare")
        assert bare_meta.name == "bare" and residency.counters.loads == 1

    lazy(root, Budget(max_models=2), test)


def test_a_poll_follows_only_the_loaded_models(tmp_path: Path) -> None:
    root = tmp_path / "models"
    for name in ("a", "b"):
        write_model(root, name)

    async def run() -> None:
        registry = Registry()
        manager = ModelManager(
            [root], registry, lazy=True, mode=ControlMode.POLL, files_dir=tmp_path / "files"
        )
        residency = Residency(manager, Budget(max_models=2), measure=lambda: 0)
        plane = DataPlane(registry)
        plane.on_demand = residency
        await manager.start()
        try:
            await plane.infer(request("a"))
            first = registry.get("a")
            write_model(root, "a", delay_ms="0")  # both change in the store
            write_model(root, "b", delay_ms="0")
            write_model(root, "c")  # and one arrives
            listing, failed = await manager.scan()
            await manager.apply(listing, set(failed))
            assert registry.get("a") is not first  # the loaded one follows its files
            assert not registry.is_ready("b") and not registry.is_ready("c")  # not loaded
            assert residency.serves("c") and residency.views()["c"].state == "available"
            assert (await plane.infer(request("c", 2.0))).outputs["OUTPUT0"][0, 0] == 2.0
        finally:
            await manager.close()

    asyncio.run(run())


def test_requests_held_for_another_process_keep_their_model_and_count_as_use(
    tmp_path: Path,
) -> None:
    root = tmp_path / "models"
    for name in ("a", "b", "c"):
        write_model(root, name)

    async def elsewhere() -> tuple[int, int]:
        return 5, 7  # another serving process's hits and misses

    async def test(residency: Residency, plane: DataPlane) -> None:
        await plane.infer(request("a"))
        await asyncio.sleep(0.01)  # last-use times are kept in milliseconds
        await plane.infer(request("b"))
        residency.hold("a", 2)  # two forwarded requests run on 'a', the least recently used
        assert residency.views()["a"].in_flight == 2
        await plane.infer(request("c"))
        assert loaded(residency) == {"a", "c"}  # 'b' went: 'a' is busy
        residency.release("a", 1)
        assert residency.views()["a"].in_flight == 1
        await asyncio.sleep(0.01)
        residency.release("a", 1)  # answered: 'a' was used after 'c' loaded
        assert residency.views()["a"].in_flight == 0
        await plane.infer(request("b"))
        assert loaded(residency) == {"a", "b"}  # 'c' went
        # The totals add up the other process's hits and misses.
        residency.elsewhere = elsewhere
        totals = await residency.summary()
        assert (totals.hits, totals.misses) == (residency.hits + 5, residency.counters.misses + 7)

    lazy(root, Budget(max_models=2), test)
