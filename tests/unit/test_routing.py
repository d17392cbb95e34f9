"""Routing: label, split and shadow policies from config; split proportions; shadow counts.

Versions are real ModelVersions over a tiny runtime (y = x * factor), the backend seam.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Sequence

import numpy as np
import pytest

from inferd.backends.work import BatchExecutor, Runtime
from inferd.config.spec import build_spec
from inferd.config.text import parse_config_text
from inferd.core.errors import ConfigError, InvalidInput, NotFound
from inferd.core.stats import ModelStats
from inferd.core.types import InferRequest, Tensors
from inferd.plane.dataplane import DataPlane
from inferd.plane.model import ModelVersion
from inferd.plane.registry import ModelRecord, Registry, VersionStatus
from inferd.plane.routing import (
    ModelRouting,
    RoutingPolicy,
    ShadowCounts,
    ShadowPolicy,
    compare,
    policy_from_config,
    request_unit,
    shadow_from_mapping,
    split_from_mapping,
)
from inferd.scheduling.batcher import DirectScheduler
from inferd.scheduling.instances import ThreadInstances

CONFIG = """
name: "m"
max_batch_size: 8
input [{ name: "x" data_type: TYPE_FP32 dims: [1] }]
output [{ name: "y" data_type: TYPE_FP32 dims: [1] }]
"""


class Scale(Runtime):
    inline = False

    def __init__(self, factor: float) -> None:
        self.factor = factor

    def execute(self, inputs: Tensors, output_names: Sequence[str]) -> Tensors:
        return {"y": inputs["x"] * np.float32(self.factor)}

    def close(self) -> None:
        pass


def _version(number: int, factor: float) -> ModelVersion:
    config = parse_config_text(CONFIG)
    stats = ModelStats()
    pool = ThreadInstances(f"m/{number}", [BatchExecutor(f"m/{number}", Scale(factor))])
    return ModelVersion(
        "m", number, config, build_spec(config), DirectScheduler(pool, stats), stats
    )


def _registry(factors: dict[int, float]) -> Registry:
    versions = {v: _version(v, f) for v, f in factors.items()}
    registry = Registry()
    status = {v: VersionStatus(v, versions[v].state) for v in versions}
    registry.put(ModelRecord("m", versions=versions, status=status, state=versions[1].state))
    return registry


def _config_policy(params: dict[str, str]) -> RoutingPolicy:
    text = CONFIG + "".join(
        f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n' for k, v in params.items()
    )
    return policy_from_config(parse_config_text(text))


def test_policies_from_config() -> None:
    policy = _config_policy(
        {
            "version_labels": "stable=1, canary=2",
            "traffic_split": "stable=90,2=10",
            "shadow": "version=2,fraction=0.1,tolerance=1e-5",
        }
    )
    assert policy.labels == {"stable": 1, "canary": 2}
    assert policy.split == (("stable", 90.0), ("2", 10.0))
    assert policy.shadow == ShadowPolicy("2", 0.1, 1e-5)
    assert _config_policy({}) == RoutingPolicy()


@pytest.mark.parametrize(
    ("params", "fragment"),
    [
        ({"version_labels": "stable"}, "'stable' is not KEY=VALUE"),
        ({"version_labels": "stable=zero"}, "must be a positive integer"),
        ({"version_labels": "9lives=1"}, "must start with a letter"),
        ({"traffic_split": "1=0,2=0"}, "add up to 0"),
        ({"traffic_split": "1=-5"}, "must be a number >= 0"),
        ({"shadow": "fraction=0.5"}, "exactly one of 'version' or 'label'"),
        ({"shadow": "version=2,fraction=2"}, "between 0 and 1"),
        ({"shadow": "version=2,colour=red"}, "unknown key"),
    ],
)
def test_bad_policies_name_the_parameter(params: dict[str, str], fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        _config_policy(params)
    assert info.value.message.startswith("parameters: ")
    assert fragment in info.value.message


def test_api_shapes_are_checked() -> None:
    assert split_from_mapping({"1": 90, "canary": 10.5}, "s") == (("1", 90.0), ("canary", 10.5))
    with pytest.raises(InvalidInput):
        split_from_mapping({"1": "lots"}, "s")
    assert shadow_from_mapping({"label": "canary"}, "s") == ShadowPolicy("canary", 1.0, 0.0)


def test_labels_route_and_unknown_labels_are_404() -> None:
    registry = _registry({1: 1.0, 2: 2.0})
    registry.routing("m").set(RoutingPolicy(labels={"stable": 1, "canary": 2}))
    assert registry.route("m", label="stable").version == 1
    assert registry.route("m", label="canary").version == 2
    assert registry.route("m").version == 2  # no split: the highest ready version
    with pytest.raises(NotFound):
        registry.route("m", label="beta")
    with pytest.raises(InvalidInput):
        registry.route("m", version="1", label="stable")


def test_split_proportions_and_request_id_stickiness() -> None:
    registry = _registry({1: 1.0, 2: 2.0})
    registry.routing("m").set(
        RoutingPolicy(labels={"stable": 1}, split=(("stable", 90), ("2", 10)))
    )
    counts = Counter(
        registry.route("m", request_id=uuid.uuid4().hex).version for _ in range(10_000)
    )
    assert 8_700 < counts[1] < 9_300 and counts[1] + counts[2] == 10_000
    assert {registry.route("m", request_id="user-42").version for _ in range(50)} == {
        1 if request_unit("user-42") < 0.9 else 2
    }
    assert registry.route("m", version="1").version == 1  # a named version skips the split


def test_split_skips_versions_that_are_not_ready() -> None:
    registry = _registry({1: 1.0})
    registry.routing("m").set(RoutingPolicy(split=(("1", 50), ("7", 50))))
    assert {registry.route("m", request_id=str(i)).version for i in range(100)} == {1}


def test_compare_exact_and_within_tolerance() -> None:
    a = {"y": np.array([1.0, 2.0], dtype=np.float32)}
    assert compare(a, {"y": a["y"].copy()}, 0.0) == (True, 0.0)
    agreed, diff = compare(a, {"y": a["y"] + np.float32(1e-3)}, 1e-2)
    assert agreed and diff == pytest.approx(1e-3, rel=1e-3)
    assert not compare(a, {"y": a["y"] + np.float32(1e-3)}, 0.0)[0]
    assert compare(a, {"y": a["y"][:1]}, 1.0) == (False, float("inf"))
    assert compare(a, {"z": a["y"]}, 1.0) == (False, float("inf"))
    text = {"s": np.array([b"a"], dtype=object)}
    assert compare(text, {"s": np.array([b"a"], dtype=object)}, 0.0)[0]


def test_shadow_copies_are_counted_and_never_answer() -> None:
    """Routing decides and counts; the data plane runs the copies."""

    async def run() -> tuple[list[str], ShadowCounts]:
        registry = _registry({1: 1.0, 2: 1.0, 3: 3.0})
        plane = DataPlane(registry)
        routing = registry.routing("m")
        versions = []
        for target in ("2", "3"):
            routing.set(RoutingPolicy(split=(("1", 1),), shadow=ShadowPolicy(target, 1.0)))
            for i in range(5):
                x = np.array([[float(i)]], dtype=np.float32)
                response = await plane.infer(InferRequest("m", {"x": x}, id=str(i)))
                versions.append(response.model_version)
            while routing.shadows_in_flight:
                await asyncio.sleep(0.001)
        return versions, plane.routing("m").shadow_stats

    versions, stats = asyncio.run(run())
    assert set(versions) == {"1"}
    # Against version 3 (x * 3), only x = 0 agrees with the primary (x * 1).
    assert stats == ShadowCounts(
        sent=5, agreed=1, disagreed=4, failed=0, skipped=0, max_abs_diff=8.0
    )


def test_routing_decides_with_version_numbers() -> None:
    """No model or registry behind it: routing answers version numbers and shadow decisions."""
    routing = ModelRouting("m")
    routing.set(RoutingPolicy(labels={"canary": 2}, split=(("canary", 1),), shadow=None))
    assert routing.split_choice("any", lambda v: True) == 2
    assert routing.split_choice("any", lambda v: False) is None
    routing.set(RoutingPolicy(shadow=ShadowPolicy("2", 1.0)))
    assert routing.shadow(2, lambda v: True) is None  # never mirrored to itself
    decision = routing.shadow(1, lambda v: True)
    assert decision is not None and decision.version == 2
    assert routing.shadows_in_flight == 1
    routing.shadowed(decision, {"y": np.zeros(1)}, InvalidInput("bad"))
    assert routing.shadows_in_flight == 0
    assert routing.view().shadow_stats == ShadowCounts(1, 0, 0, 1, 0, 0.0)
