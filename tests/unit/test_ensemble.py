"""The ensemble graph (checks naming the step or tensor) and its scheduler over echo models:
independent steps run at once, and a composing model batches the steps of several ensemble
requests."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from inferd.backends import echo
from inferd.backends.ensemble_graph import build_graph
from inferd.config.model_config_pb2 import ModelConfig
from inferd.config.text import parse_config_text
from inferd.core.errors import ConfigError, InternalError
from inferd.core.types import InferRequest
from inferd.plane.dataplane import DataPlane
from inferd.plane.model import ModelVersion
from inferd.plane.registry import Registry
from inferd.repository.loader import LoadOptions, load_version, plan
from tests.e2e.ensemble_support import ensemble, step
from tests.echo_support import echo_version, registry_with


def _config(text: str) -> ModelConfig:
    return parse_config_text(text)


def test_graph_orders_steps_and_prunes_to_requested_outputs() -> None:
    graph = build_graph(
        _config(
            ensemble(
                "d",
                [
                    step("join", {"INPUT0": "a", "INPUT1": "b"}, {"OUTPUT0": "A"}),
                    step("m", {"x": "IN"}, {"y": "a"}),
                    step("m", {"x": "IN"}, {"y": "b"}),
                    step("n", {"x": "IN"}, {"y": "C"}),
                ],
                ["IN"],
                ["A", "C"],
            )
        )
    )
    assert [s.index for s in graph.steps] == [1, 2, 3, 0]
    assert graph.models() == ["m", "n", "join"]
    assert [s.index for s in graph.needed(("C",))] == [3]
    assert [s.index for s in graph.needed(("A",))] == [1, 2, 0]


@pytest.mark.parametrize(
    ("steps", "outputs", "message"),
    [
        (
            [step("m", {"x": "b"}, {"y": "a"}), step("m", {"x": "a"}, {"y": "b"})],
            ["b"],
            "steps form a cycle: step 0 (model 'm') reads ['b'], step 1 (model 'm') reads ['a']",
        ),
        (
            [step("m", {"x": "nowhere"}, {"y": "OUT"})],
            ["OUT"],
            "step 0 (model 'm'): input 'x' reads tensor 'nowhere', which is neither an "
            "ensemble input nor made by a step",
        ),
        (
            [step("m", {"x": "IN"}, {"y": "OUT"}), step("m", {"x": "IN"}, {"y": "OUT"})],
            ["OUT"],
            "step 1 (model 'm'): output 'y' maps to tensor 'OUT', which is already made by "
            "step 0 (model 'm')",
        ),
        (
            [step("m", {"x": "IN"}, {"y": "IN"})],
            ["OUT"],
            "output 'y' maps to tensor 'IN', which is already an ensemble input",
        ),
        ([step("m", {"x": "IN"}, {"y": "mid"})], ["OUT"], "ensemble output 'OUT' is not made"),
        ([step("e", {"x": "IN"}, {"y": "OUT"})], ["OUT"], "an ensemble cannot call itself"),
    ],
)
def test_bad_graphs_name_the_step_or_tensor(
    steps: list[str], outputs: list[str], message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        build_graph(_config(ensemble("e", steps, ["IN"], outputs)))
    assert message in caught.value.message


def test_an_ensemble_needs_its_platform_and_steps() -> None:
    with pytest.raises(ConfigError, match='needs platform: "ensemble"'):
        build_graph(_config('name: "e" ensemble_scheduling { step [ { model_name: "m" } ] }'))
    with pytest.raises(ConfigError, match="at least one step"):
        build_graph(_config('name: "e" platform: "ensemble"'))


ECHO = """backend: "echo"
max_batch_size: 8
input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [1] }]
parameters { key: "request_level" value: { string_value: "true" } }
"""


def _ensemble_version(root: Path, plane: DataPlane, text: str) -> ModelVersion:
    config = _config(text)
    folder = root / config.name
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(text)
    options = LoadOptions(call_model=plane.infer)
    return load_version(config.name, 1, plan(config.name, folder), options)


def _serve(registry: Registry, *models: ModelVersion) -> None:
    for record in registry_with(*models).records():
        registry.put(record)


def test_independent_steps_run_at_once(tmp_path: Path) -> None:
    held = echo_version(tmp_path, ECHO + 'parameters { key: "gate" value: { string_value: "h" } }')
    free = echo_version(tmp_path, ECHO)
    registry = Registry()
    plane = DataPlane(registry)
    text = ensemble(
        "both",
        [
            step(held.name, {"INPUT0": "IN"}, {"OUTPUT0": "A"}),
            step(free.name, {"INPUT0": "IN"}, {"OUTPUT0": "B"}),
        ],
        ["IN"],
        ["A", "B"],
    )
    both = _ensemble_version(tmp_path, plane, text)
    _serve(registry, held, free, both)
    gate = echo.gate("h")
    gate.clear()
    x = np.array([[1.0], [2.0]], np.float32)

    async def scenario() -> dict[str, np.ndarray]:
        task = asyncio.ensure_future(plane.infer(InferRequest("both", {"IN": x}, id="r1")))
        for _ in range(500):  # the free step finishes while the held one waits at its gate
            if echo.LOG.get(free.name):
                break
            await asyncio.sleep(0.01)
        assert not task.done()
        assert [e.request_ids for e in echo.LOG[free.name]] == [("r1",)]
        assert held.name not in echo.LOG
        gate.set()
        return (await task).outputs

    try:
        outputs = asyncio.run(scenario())
    finally:
        gate.set()
    np.testing.assert_array_equal(outputs["A"], x)
    np.testing.assert_array_equal(outputs["B"], x)


def test_a_composing_model_batches_steps_of_several_requests(tmp_path: Path) -> None:
    batching = "dynamic_batching { max_queue_delay_microseconds: 100000 }\n"
    gated = 'parameters { key: "gate" value: { string_value: "b" } }\n'
    inner = echo_version(tmp_path, ECHO + batching + gated)
    registry = Registry()
    plane = DataPlane(registry)
    text = ensemble(
        "wrap", [step(inner.name, {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})], ["IN"], ["OUT"]
    )
    wrap = _ensemble_version(tmp_path, plane, text)
    _serve(registry, inner, wrap)
    gate = echo.gate("b")
    gate.clear()

    async def scenario() -> list[np.ndarray]:
        def call(i: int) -> asyncio.Future[object]:
            x = np.full((1, 1), float(i), np.float32)
            return asyncio.ensure_future(plane.infer(InferRequest("wrap", {"IN": x}, id=f"r{i}")))

        first = call(0)  # holds the one instance at its gate
        await asyncio.sleep(0.2)
        rest = [call(i) for i in (1, 2, 3)]
        await asyncio.sleep(0.3)  # the three wait in the queue, behind the held instance
        await asyncio.get_running_loop().run_in_executor(None, gate.set)
        answers = await asyncio.gather(first, *rest)
        return [a.outputs["OUT"] for a in answers]  # type: ignore[attr-defined]

    try:
        outputs = asyncio.run(scenario())
    finally:
        gate.set()
    assert [float(o[0, 0]) for o in outputs] == [0.0, 1.0, 2.0, 3.0]
    assert [e.request_ids for e in echo.LOG[inner.name]] == [("r0",), ("r1", "r2", "r3")]
    stats = wrap.stats.snapshot("wrap", "1")
    assert stats.inference_count == 4


def test_ensemble_scheduling_on_another_platform_is_refused(tmp_path: Path) -> None:
    text = 'name: "e" platform: "onnxruntime_onnx"\n'
    text += 'ensemble_scheduling { step [ { model_name: "m" } ] }\n'
    (tmp_path / "e" / "1").mkdir(parents=True)
    (tmp_path / "e" / "config.pbtxt").write_text(text)
    with pytest.raises(ConfigError, match='ensemble_scheduling needs platform: "ensemble"'):
        plan("e", tmp_path / "e")


def test_an_output_of_another_datatype_names_the_step(tmp_path: Path) -> None:
    ints = echo_version(tmp_path, ECHO.replace("TYPE_FP32", "TYPE_INT32"))
    registry = Registry()
    plane = DataPlane(registry)
    text = ensemble("wrong", [step(ints.name, {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})], [], [])
    text = text.replace("input [  ]", 'input [ { name: "IN" data_type: TYPE_INT32 dims: [1] } ]')
    text = text.replace("output [  ]", 'output [ { name: "OUT" data_type: TYPE_FP32 dims: [1] } ]')
    wrong = _ensemble_version(tmp_path, plane, text)
    _serve(registry, ints, wrong)
    request = InferRequest("wrong", {"IN": np.array([[1]], np.int32)})
    with pytest.raises(InternalError) as caught:
        asyncio.run(plane.infer(request))
    assert caught.value.message == (
        f"ensemble 'wrong' step 0 (model '{ints.name}') made output 'OUT' as INT32, "
        "but the ensemble declares FP32"
    )
