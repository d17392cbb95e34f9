"""routing.json: parsed with the routing API's own checks, laid over the config's routing."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferd.core.errors import ConfigError, InvalidInput
from inferd.plane.routing import RoutingPolicy, ShadowPolicy
from inferd.repository import routing_file

CONFIG_POLICY = RoutingPolicy({"stable": 1, "canary": 2}, (("stable", 90.0), ("canary", 10.0)))


def test_only_the_keys_in_the_file_replace_the_config_ones(tmp_path: Path) -> None:
    assert routing_file.read_policy(tmp_path, CONFIG_POLICY) == CONFIG_POLICY  # no file
    (tmp_path / "routing.json").write_text('{"traffic_split": {"canary": 100}}')
    policy = routing_file.read_policy(tmp_path, CONFIG_POLICY)
    assert policy.labels == {"stable": 1, "canary": 2}
    assert policy.split == (("canary", 100.0),)
    (tmp_path / "routing.json").write_text('{"shadow": {"version": 2, "fraction": 0.5}}')
    assert routing_file.read_policy(tmp_path, CONFIG_POLICY).shadow == ShadowPolicy("2", 0.5)


def test_documents_round_trip() -> None:
    policy = RoutingPolicy({"a": 1}, (("1", 3.0),), ShadowPolicy("a", 0.25, 0.1))
    doc = routing_file.document(policy, {"labels", "shadow"})
    assert set(doc) == {"labels", "shadow"}
    again = routing_file.parse(routing_file.encode(doc), "routing.json")
    assert routing_file.overlay(RoutingPolicy(), again, "x") == RoutingPolicy(
        {"a": 1}, (), ShadowPolicy("a", 0.25, 0.1)
    )
    cleared = routing_file.parse(b'{"shadow": null, "traffic_split": {}}', "r")
    assert routing_file.overlay(policy, cleared, "r") == RoutingPolicy({"a": 1})


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("{not json", "is not valid JSON"),
        ("[1]", "must be a JSON object"),
        ('{"weights": {}}', "unknown routing key(s) ['weights']"),
        ('{"labels": {"1st": 1}}', "must start with a letter"),
        ('{"traffic_split": 5}', "'traffic_split' must be an object or null"),
    ],
)
def test_a_bad_file_is_an_error_naming_it(text: str, fragment: str, tmp_path: Path) -> None:
    with pytest.raises(InvalidInput) as info:
        routing_file.parse(text.encode(), "routing.json")
    assert fragment in info.value.message
    (tmp_path / "routing.json").write_text(text)
    with pytest.raises(ConfigError, match=r"routing\.json"):
        routing_file.read_policy(tmp_path, RoutingPolicy())
