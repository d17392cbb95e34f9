"""The data plane over echo models: the read-only views it hands out (and their JSON, which is
Triton's), one routing per request, shadow copies it runs for routing, version swaps."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import orjson
import pytest

from inferd.backends.work import Work
from inferd.core.errors import InvalidInput, NotFound, Unavailable, Unimplemented
from inferd.core.stats import ModelStatistics, StatDuration
from inferd.core.types import InferRequest, InferResponse, Tensors, Timings
from inferd.core.views import (
    ModelMetadata,
    ModelStatus,
    ServerMetadata,
    TensorMetadata,
    VersionState,
)
from inferd.plane.dataplane import DataPlane
from inferd.plane.model import ModelState, ModelVersion
from inferd.plane.registry import Registry
from inferd.plane.routing import RoutingPolicy, ShadowCounts, ShadowPolicy
from inferd.scheduling import instances
from inferd.version import __version__
from tests.echo_support import echo_version, registry_with, request, rows

UNBATCHED = """backend: "echo"
max_batch_size: 0
input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [-1] }]
"""


@pytest.fixture
def versions(tmp_path: Path) -> Iterator[list[ModelVersion]]:
    """Model ``m``, versions 1 and 2 (echo: both answer their input)."""
    loaded = [echo_version(tmp_path, name="m", version=v) for v in (1, 2)]
    yield loaded
    asyncio.run(_close(loaded))


async def _close(models: list[ModelVersion]) -> None:
    for model in models:
        await model.close()


def test_views_are_frozen_snapshots_with_triton_json(versions: list[ModelVersion]) -> None:
    plane = DataPlane(registry_with(*versions))
    assert plane.server_metadata() == ServerMetadata(
        "inferd",
        __version__,
        (
            "classification",
            "sequence",
            "schedule_policy",
            "model_configuration",
            "system_shared_memory",
            "binary_tensor_data",
            "parameters",
            "statistics",
            "trace",
            "logging",
        ),
    )
    meta = asyncio.run(plane.model_metadata("m"))
    tensor = TensorMetadata("INPUT0", "FP32", (-1, 2))
    assert meta == ModelMetadata(
        "m", ("1", "2"), "echo", (tensor,), (TensorMetadata("OUTPUT0", "FP32", (-1, 2)),)
    )
    assert orjson.loads(orjson.dumps(meta)) == {
        "name": "m",
        "versions": ["1", "2"],
        "platform": "echo",  # no platform in the config: its backend, as Triton reports it
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 2]}],
        "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 2]}],
    }
    with pytest.raises(AttributeError):
        meta.name = "other"  # type: ignore[misc]
    config = asyncio.run(plane.model_config("m", "1"))
    config.max_batch_size = 1  # a copy: the served config is untouched
    assert asyncio.run(plane.model_config("m", "1")).max_batch_size == 8
    assert plane.model_status("m") == ModelStatus(
        "m", (VersionState(2, "READY", ""), VersionState(1, "READY", ""))
    )


def test_statistics_after_requests(versions: list[ModelVersion]) -> None:
    plane = DataPlane(registry_with(*versions))

    async def run() -> None:
        await plane.infer(InferRequest("m", rows(1.0, 2.0), model_version="1"))
        await plane.infer(InferRequest("m", rows(3.0), model_version="1"))
        with pytest.raises(InvalidInput):
            await plane.infer(InferRequest("m", {"nope": np.zeros((1, 2), np.float32)}))

    asyncio.run(run())
    first, second = plane.statistics("m")
    assert isinstance(first, ModelStatistics)
    assert (first.version, first.inference_count, first.execution_count) == ("1", 3, 2)
    assert first.inference_stats.success.count == 2
    assert second.inference_stats.fail.count == 1  # the default version: 2
    assert [b.batch_size for b in first.batch_stats] == [1, 2]
    assert first.batch_stats[0].compute_infer.count == 1
    doc = orjson.loads(orjson.dumps({"model_stats": plane.statistics("m", "1")}))
    (stats,) = doc["model_stats"]
    assert list(stats) == [
        "name",
        "version",
        "last_inference",
        "inference_count",
        "execution_count",
        "inference_stats",
        "batch_stats",
    ]
    assert list(stats["inference_stats"]) == [
        "success",
        "fail",
        "queue",
        "compute_input",
        "compute_infer",
        "compute_output",
        "cache_hit",
        "cache_miss",
    ]
    assert stats["inference_stats"]["cache_hit"] == {"count": 0, "ns": 0}
    assert list(stats["batch_stats"][0]) == [
        "batch_size",
        "compute_input",
        "compute_infer",
        "compute_output",
    ]
    assert StatDuration(0, 0) == first.inference_stats.cache_miss


def test_unknown_and_malformed_names(versions: list[ModelVersion]) -> None:
    plane = DataPlane(registry_with(*versions))
    with pytest.raises(NotFound, match=r"^Request for unknown model: 'nope' is not found$"):
        asyncio.run(plane.model_metadata("nope"))
    with pytest.raises(NotFound, match=r"^Request for unknown model: 'm' version 7 is not found$"):
        asyncio.run(plane.model_metadata("m", "7"))
    with pytest.raises(InvalidInput, match=r"^failed to get model version from specified"):
        plane.model_ready("m", "x1")
    assert plane.model_ready("m", "2") and not plane.model_ready("m", "7")
    with pytest.raises(Unimplemented):
        asyncio.run(plane.load_model("m"))


def test_one_route_per_request_and_labels(versions: list[ModelVersion]) -> None:
    plane = DataPlane(registry_with(*versions))
    asyncio.run(plane.set_labels("m", {"stable": 1}))
    view = asyncio.run(plane.set_routing("m", {"traffic_split": {"stable": 1}}))
    assert view.labels == {"stable": 1} and view.traffic_split == (("stable", 1.0),)

    async def run() -> list[str]:
        answers = [await plane.infer(request(versions[0], float(i), id=str(i))) for i in range(5)]
        labelled = await plane.infer(
            InferRequest("m", rows(1.0), parameters={"version_label": "stable"})
        )
        return [a.model_version for a in answers] + [labelled.model_version]

    assert asyncio.run(run()) == ["1"] * 6
    assert plane.version_of("m", label="stable") == "1"
    with pytest.raises(InvalidInput, match="not ready"):
        asyncio.run(plane.set_labels("m", {"beta": 9}))


def test_shadow_copies_run_in_the_data_plane(versions: list[ModelVersion]) -> None:
    plane = DataPlane(registry_with(*versions))
    routing = plane.registry.routing("m")
    routing.set(RoutingPolicy(split=(("1", 1),), shadow=ShadowPolicy("2", 1.0)))

    async def run() -> None:
        for i in range(3):
            answer = await plane.infer(request(versions[0], float(i)))
            assert answer.model_version == "1"  # the shadow never answers
        while routing.shadows_in_flight:
            await asyncio.sleep(0.001)

    asyncio.run(run())
    assert plane.routing("m").shadow_stats == ShadowCounts(3, 3, 0, 0, 0, 0.0)
    assert versions[1].stats.success.count == 3


def test_answer_runs_an_inline_model_at_once_with_the_same_checks_and_statistics(
    versions: list[ModelVersion], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Echo is always fast enough, by either measure: its CPU time on the thread (the first
    # request's, which a loaded host can take past the default 100 µs) and an inline call's.
    monkeypatch.setattr(instances, "INLINE_BELOW_S", 1.0)
    monkeypatch.setattr(instances, "INLINE_BELOW_NS", 10**9)
    plane = DataPlane(registry_with(*versions))
    model = versions[1]

    async def run() -> None:
        first = plane.answer(request(model, 1.0))
        assert not isinstance(first, InferResponse)  # nothing measured yet: a thread runs it
        assert (await first).outputs["OUTPUT0"].tolist() == [[1.0, 1.0]]
        answered = plane.answer(request(model, 2.0, 3.0, id="r2"))  # measured fast: inline
        assert isinstance(answered, InferResponse)
        assert (answered.model_name, answered.model_version, answered.id) == ("m", "2", "r2")
        assert answered.outputs["OUTPUT0"].tolist() == [[2.0, 2.0], [3.0, 3.0]]
        timings = answered.timings
        assert timings is not None and 0 < timings.compute_start_ns <= timings.compute_end_ns
        with pytest.raises(InvalidInput, match="priority"):
            plane.answer(request(model, 4.0, priority="high"))
        with pytest.raises(InvalidInput, match="nope"):
            plane.answer(InferRequest("m", {"nope": np.zeros((1, 2), np.float32)}))
        again = plane.answer(request(model, 5.0))  # the failures gave the instance back
        assert isinstance(again, InferResponse)
        assert again.outputs["OUTPUT0"].tolist() == [[5.0, 5.0]]
        routing = plane.registry.routing("m")
        routing.set(RoutingPolicy(shadow=ShadowPolicy("1", 1.0)))
        mirrored = plane.answer(request(model, 6.0))  # a shadow copy: through ``run``
        assert not isinstance(mirrored, InferResponse)
        assert (await mirrored).model_version == "2"
        while routing.shadows_in_flight:
            await asyncio.sleep(0.001)

    asyncio.run(run())
    stats = plane.statistics("m", "2")[0]
    assert (stats.inference_count, stats.execution_count) == (5, 4)
    assert (stats.inference_stats.success.count, stats.inference_stats.fail.count) == (4, 2)
    assert [(b.batch_size, b.compute_infer.count) for b in stats.batch_stats] == [(1, 3), (2, 1)]


def test_a_retired_version_is_routed_again(tmp_path: Path) -> None:
    old = echo_version(tmp_path, UNBATCHED, name="swap", version=1)
    new = echo_version(tmp_path, UNBATCHED, name="swap", version=2)
    registry = registry_with(old)
    plane = DataPlane(registry)

    async def run() -> str:
        routed = registry.route("swap")
        await old.close()  # retired after routing, before running
        registry.put(registry_with(new).record("swap"))
        answer = await plane.run(routed, InferRequest("swap", {"INPUT0": np.ones(2, np.float32)}))
        await new.close()
        return answer.model_version

    assert asyncio.run(run()) == "2"
    assert old.state is ModelState.UNAVAILABLE
    with pytest.raises(Unavailable, match="no ready version"):
        asyncio.run(DataPlane(registry_with(old)).model_metadata("swap"))


class _RetiredOnTheHost:
    """The scheduler of a frontend's stand-in whose version the model host retired, with its
    folder, since the frontend routed a request to it: the host's table that says so is applied
    (``swap_in``: the stand-in retired, the next version put in), then the host's NotFound."""

    def __init__(self, swap_in: list[ModelVersion], registry: Registry) -> None:
        self.swap_in = swap_in
        self.registry = registry
        self.stand_in: ModelVersion | None = None

    async def run(self, work: Work, timings: Timings) -> Tensors:
        assert self.stand_in is not None
        self.stand_in.state = ModelState.UNAVAILABLE
        self.registry.put(registry_with(self.swap_in.pop(0)).record("swap"))
        raise NotFound(f"Request for unknown model: 'swap' version {self.stand_in.version} ...")

    async def close(self) -> None:
        return None


def test_versions_retired_one_after_another_are_routed_again(tmp_path: Path) -> None:
    """A request that names no version follows quick swaps, the host's NotFound included, as
    long as each version it reaches was retired; one that names a retired version fails."""
    echo = echo_version(tmp_path, UNBATCHED, name="swap", version=9)
    registry = Registry()
    last = echo_version(tmp_path, UNBATCHED, name="swap", version=3)
    versions = [last]
    for number in (2, 1):
        scheduler = _RetiredOnTheHost(versions[:1], registry)
        stand_in = replace(echo, version=number, scheduler=scheduler)
        scheduler.stand_in = stand_in
        versions.insert(0, stand_in)
    registry.put(registry_with(versions[0]).record("swap"))
    plane = DataPlane(registry)
    body = {"INPUT0": np.ones(2, np.float32)}

    async def run(version: str = "") -> str:
        answer = await plane.infer(InferRequest("swap", body, model_version=version))
        return answer.model_version

    assert asyncio.run(run()) == "3"  # 1 retired on the host, then 2, then 3 answers
    with pytest.raises(NotFound, match="'swap' version 1 is not found"):
        asyncio.run(run("1"))
    asyncio.run(_close([echo, last]))
