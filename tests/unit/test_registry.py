"""The registry: which loaded version serves a name, a version string or a label, in Triton's
words when there is none; records swap whole; routing state outlives reloads."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from inferd.core.errors import InvalidInput, NotFound, Unavailable
from inferd.plane.model import ModelState, ModelVersion
from inferd.plane.registry import ModelRecord, Registry, VersionStatus, parse_version, unknown_model
from inferd.plane.routing import RoutingPolicy, ShadowPolicy
from tests.echo_support import echo_version, registry_with


@pytest.fixture
def versions(tmp_path: Path) -> Iterator[list[ModelVersion]]:
    loaded = [echo_version(tmp_path, name="m", version=v) for v in (1, 2, 3)]
    yield loaded

    async def close() -> None:
        for model in loaded:
            await model.close()

    asyncio.run(close())


def test_default_is_the_highest_ready_version(versions: list[ModelVersion]) -> None:
    registry = registry_with(*versions)
    assert registry.get("m").version == 3
    assert registry.get("m", "1").version == 1
    versions[2].state = ModelState.UNLOADING
    assert registry.get("m").version == 2
    assert registry.ready_version("m", 3) is None
    assert registry.ready_version("m", 2) is versions[1]
    assert registry.ready_version("nope", 1) is None


def test_lookups_fail_in_triton_words(versions: list[ModelVersion]) -> None:
    registry = registry_with(*versions)
    with pytest.raises(NotFound) as info:
        registry.get("nope")
    assert info.value.message == "Request for unknown model: 'nope' is not found"
    with pytest.raises(NotFound) as info:
        registry.route("m", "9")
    assert info.value.message == "Request for unknown model: 'm' version 9 is not found"
    with pytest.raises(InvalidInput) as bad:
        registry.get("m", "v1")
    assert bad.value.message == (
        "failed to get model version from specified version string 'v1' (details: not an "
        "integer), version should be an integral value > 0"
    )
    with pytest.raises(InvalidInput, match=r"^invalid model version specified '-1' , version"):
        parse_version("-1")
    assert parse_version("0012") == 12
    assert unknown_model("m", 0) == "Request for unknown model: 'm' version 0 is not found"


def test_a_known_version_that_is_not_ready_says_why(versions: list[ModelVersion]) -> None:
    registry = Registry()
    status = {
        1: VersionStatus(1, ModelState.READY),
        4: VersionStatus(4, ModelState.UNAVAILABLE, "bad weights"),
    }
    registry.put(ModelRecord("m", versions={1: versions[0]}, status=status))
    with pytest.raises(Unavailable, match=r"^version 4 of model 'm' is UNAVAILABLE: bad weights$"):
        registry.get("m", "4")
    registry.put(ModelRecord("m", reason="config.pbtxt: no inputs"))
    with pytest.raises(Unavailable, match=r"has no ready version: config\.pbtxt: no inputs"):
        registry.get("m")


def test_labels_split_and_routing_that_outlives_a_reload(versions: list[ModelVersion]) -> None:
    registry = registry_with(*versions)
    registry.routing("m").set(RoutingPolicy(labels={"stable": 1}, split=(("stable", 1),)))
    assert registry.route("m").version == 1  # the split
    assert registry.route("m", "2").version == 2  # a version skips it
    assert registry.route("m", label="stable").version == 1
    with pytest.raises(NotFound, match="no version label 'beta'"):
        registry.route("m", label="beta")
    with pytest.raises(InvalidInput, match="a version or a version label, not both"):
        registry.route("m", "1", "stable")
    assert registry.shadowing("m") is None
    registry.routing("m").set(RoutingPolicy(shadow=ShadowPolicy("2", 1.0)))
    routing = registry.shadowing("m")
    registry.put(registry_with(*versions).record("m"))  # a reload swaps the record...
    assert registry.shadowing("m") is routing  # ... and keeps the routing
    registry.forget("m")
    assert registry.names() == [] and registry.shadowing("m") is None


def test_an_unknown_name_gets_the_closest_known_one(versions: list[ModelVersion]) -> None:
    registry = registry_with(*versions)  # serves "m"
    registry.put(ModelRecord("half_plus_two", {}))
    with pytest.raises(NotFound) as info:
        registry.route("half_plus_tow")
    assert info.value.message == (
        "Request for unknown model: 'half_plus_tow' is not found; did you mean 'half_plus_two'?"
    )
    with pytest.raises(NotFound) as info:
        registry.record("resnet")
    assert info.value.message == "Request for unknown model: 'resnet' is not found"
    many = [f"model_{i}" for i in range(6000)]  # past the bound: no guess at all
    assert unknown_model("model_1x", known=many) == (
        "Request for unknown model: 'model_1x' is not found"
    )
    assert unknown_model("half_plus_tow", 2, known=["half_plus_two"]).endswith("is not found")
