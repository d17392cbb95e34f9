"""The dependency graph: load order, users to unload first, orphans, cycles refused."""

from __future__ import annotations

import pytest

from inferd.core.errors import ConfigError
from inferd.repository.dependencies import Dependencies


def _graph() -> Dependencies:
    # ens -> (pre, model); model -> weights; other -> weights
    graph = Dependencies()
    graph.declare("ens", ["pre", "model"])
    graph.declare("model", ["weights"])
    graph.declare("other", ["weights"])
    return graph


def test_load_order_puts_every_need_before_its_user() -> None:
    graph = _graph()
    assert graph.load_order("ens") == ["pre", "weights", "model"]
    assert graph.load_order("weights") == []
    assert graph.needs("ens") == ("pre", "model")


def test_users_come_before_what_they_need() -> None:
    graph = _graph()
    assert graph.users("weights") == ["ens", "model", "other"]
    assert graph.users("pre") == ["ens"]
    assert graph.users("ens") == []


def test_orphans_are_what_no_remaining_model_needs() -> None:
    graph = _graph()
    everything = {"ens", "pre", "model", "weights", "other"}
    assert graph.orphans("ens", everything) == ["model", "pre"]  # 'other' still needs weights
    assert graph.orphans("ens", everything - {"other"}) == ["model", "weights", "pre"]


def test_a_cycle_is_refused_and_changes_nothing() -> None:
    graph = _graph()
    with pytest.raises(ConfigError, match="cycle: weights -> ens -> model -> weights"):
        graph.declare("weights", ["ens"])
    with pytest.raises(ConfigError, match="cycle: x -> x"):
        graph.declare("x", ["x"])
    assert graph.needs("weights") == ()


def test_declaring_nothing_or_forgetting_removes_the_edges() -> None:
    graph = _graph()
    graph.declare("ens", [])
    assert graph.users("pre") == []
    graph.forget("model")
    assert graph.load_order("model") == [] and graph.users("weights") == ["other"]
